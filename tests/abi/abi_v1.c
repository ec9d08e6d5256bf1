/* Pins the frozen v1 plugin ABI. Every plugin built against loom 1.x depends
 * on these sizes and offsets (x86_64, LP64), so a change here is an ABI
 * break: it needs a new major (new struct type and symbol), not an edit.
 * Growing a struct at its end is a minor change: add a PIN for the new
 * member and update PIN_SIZE, never move an existing offset. */
#include <stdio.h>

#include "loom/comm.h"
#include "loom/compute.h"
#include "loom/memtier.h"
#include "loom/plugin.h"
#include "loom/schedule.h"
#include "loom/status.h"
#include "loom/strategy.h"
#include "loom/tensor.h"

#if defined(__x86_64__) && defined(__LP64__)

#define PIN_SIZE(type, size) _Static_assert(sizeof(type) == (size), "ABI: sizeof " #type " changed")
#define PIN(type, member, off) \
    _Static_assert(offsetof(type, member) == (off), "ABI: offsetof " #type "." #member " changed")
#define PIN_VALUE(name, value) _Static_assert((name) == (value), "ABI: value of " #name " changed")

PIN_VALUE(LOOM_ABI_MAJOR, 1);
PIN_VALUE(LOOM_ABI_VERSION(1, 0), 0x10000u);
PIN_VALUE(LOOM_PLUGIN_COMM, 1);
PIN_VALUE(LOOM_PLUGIN_STRATEGY, 2);
PIN_VALUE(LOOM_PLUGIN_MEMTIER, 3);
PIN_VALUE(LOOM_PLUGIN_SCHEDULE, 4); /* since 1.8 */
PIN_VALUE(LOOM_PLUGIN_COMPUTE, 5);  /* since 1.9 */
PIN_VALUE(LOOM_SETTING_INT, 1);
PIN_VALUE(LOOM_SETTING_FLOAT, 2);
PIN_VALUE(LOOM_SETTING_BOOL, 3);
PIN_VALUE(LOOM_SETTING_STRING, 4);
PIN_VALUE(LOOM_HOST_VERSION, 8); /* 4 since 1.6: loom_optimizer_step.update_range;
                                     5 since 1.7: update_range_store; 6 since 1.8: crc32c;
                                     7 since 1.9: compute; 8 since 1.10: comm_open */
PIN_VALUE(LOOM_TIERED_READ, 0);
PIN_VALUE(LOOM_TIERED_OVERWRITE, 1);
PIN_VALUE(LOOM_OK, 0);
PIN_VALUE(LOOM_IN_PROGRESS, 1);
PIN_VALUE(LOOM_ERR_NOT_SUPPORTED, -1);
PIN_VALUE(LOOM_ERR_INVALID, -2);
PIN_VALUE(LOOM_ERR_NO_MEMORY, -3);
PIN_VALUE(LOOM_ERR_NOT_FOUND, -4);
PIN_VALUE(LOOM_ERR_TIMEOUT, -5);
PIN_VALUE(LOOM_ERR_REMOTE, -6);
PIN_VALUE(LOOM_ERR_INTERNAL, -7);
PIN_VALUE(LOOM_F32, 0);
PIN_VALUE(LOOM_BF16, 1);
PIN_VALUE(LOOM_F16, 2);
PIN_VALUE(LOOM_F64, 3);
PIN_VALUE(LOOM_I32, 4);
PIN_VALUE(LOOM_I64, 5);
PIN_VALUE(LOOM_U8, 6);
PIN_VALUE(LOOM_SUM, 0);
PIN_VALUE(LOOM_MAX, 1);
PIN_VALUE(LOOM_MIN, 2);
PIN_VALUE(LOOM_AVG, 3);
PIN_VALUE(LOOM_MEM_HOST, 0);
PIN_VALUE(LOOM_MEM_DEVICE, 1);
PIN_VALUE(LOOM_AXIS_TP, 0);
PIN_VALUE(LOOM_AXIS_SP, 1);
PIN_VALUE(LOOM_AXIS_PP, 2);
PIN_VALUE(LOOM_AXIS_DP, 3);
PIN_VALUE(LOOM_TIER_DEVICE, 0);
PIN_VALUE(LOOM_TIER_HOST, 1);
PIN_VALUE(LOOM_TIER_PINNED, 2);
PIN_VALUE(LOOM_TIER_NVME, 3);
PIN_VALUE(LOOM_PURPOSE_PARAMS, 0);
PIN_VALUE(LOOM_PURPOSE_OTHER, 5);
PIN_VALUE(LOOM_OP_ALLREDUCE, 0);
PIN_VALUE(LOOM_OP_BARRIER, 8);

PIN_SIZE(loom_plugin_header, 40);
PIN(loom_plugin_header, abi_version, 0);
PIN(loom_plugin_header, struct_size, 4);
PIN(loom_plugin_header, kind, 8);
PIN(loom_plugin_header, settings_stride, 12); /* 'reserved' (0) before 1.3 */
PIN(loom_plugin_header, name, 16);
PIN(loom_plugin_header, description, 24);
PIN(loom_plugin_header, settings, 32);

/* 32 bytes up to 1.2, the stride of older plugins' lists */
PIN_SIZE(loom_setting_spec, 64);
PIN(loom_setting_spec, name, 0);
PIN(loom_setting_spec, type, 8);
PIN(loom_setting_spec, default_value, 16);
PIN(loom_setting_spec, help, 24);
PIN(loom_setting_spec, allowed, 32);
PIN(loom_setting_spec, bounds, 40);
PIN(loom_setting_spec, min, 48);
PIN(loom_setting_spec, max, 56);
PIN_VALUE(LOOM_SETTING_MIN, 1);
PIN_VALUE(LOOM_SETTING_ABOVE_MIN, 2);
PIN_VALUE(LOOM_SETTING_MAX, 4);
PIN_VALUE(LOOM_SETTING_BELOW_MAX, 8);

PIN_SIZE(loom_comm_plugin_v1_t, 224);
PIN(loom_comm_plugin_v1_t, header, 0);
PIN(loom_comm_plugin_v1_t, mem_kinds, 40);
PIN(loom_comm_plugin_v1_t, reserved, 44);
PIN(loom_comm_plugin_v1_t, create_world, 48);
PIN(loom_comm_plugin_v1_t, create_subgroup, 56);
PIN(loom_comm_plugin_v1_t, destroy, 64);
PIN(loom_comm_plugin_v1_t, rank, 72);
PIN(loom_comm_plugin_v1_t, size, 80);
PIN(loom_comm_plugin_v1_t, allreduce, 88);
PIN(loom_comm_plugin_v1_t, broadcast, 96);
PIN(loom_comm_plugin_v1_t, reduce, 104);
PIN(loom_comm_plugin_v1_t, allgather, 112);
PIN(loom_comm_plugin_v1_t, reducescatter, 120);
PIN(loom_comm_plugin_v1_t, alltoall, 128);
PIN(loom_comm_plugin_v1_t, send, 136);
PIN(loom_comm_plugin_v1_t, recv, 144);
PIN(loom_comm_plugin_v1_t, barrier, 152);
PIN(loom_comm_plugin_v1_t, test, 160);
PIN(loom_comm_plugin_v1_t, wait, 168);
PIN(loom_comm_plugin_v1_t, group_start, 176);
PIN(loom_comm_plugin_v1_t, group_end, 184);
PIN(loom_comm_plugin_v1_t, mem_register, 192);
PIN(loom_comm_plugin_v1_t, mem_deregister, 200);
PIN(loom_comm_plugin_v1_t, abort, 208);
PIN(loom_comm_plugin_v1_t, inner, 216); /* since 1.10 */
PIN_VALUE(LOOM_MEM_KINDS_INNER, 0);  /* since 1.10 */

PIN_SIZE(loom_memtier_plugin_v1_t, 136);
PIN(loom_memtier_plugin_v1_t, header, 0);
PIN(loom_memtier_plugin_v1_t, tier, 40);
PIN(loom_memtier_plugin_v1_t, flags, 44);
PIN(loom_memtier_plugin_v1_t, create, 48);
PIN(loom_memtier_plugin_v1_t, destroy, 56);
PIN(loom_memtier_plugin_v1_t, capacity, 64);
PIN(loom_memtier_plugin_v1_t, alloc, 72);
PIN(loom_memtier_plugin_v1_t, free, 80);
PIN(loom_memtier_plugin_v1_t, write, 88);
PIN(loom_memtier_plugin_v1_t, read, 96);
PIN(loom_memtier_plugin_v1_t, test, 104);
PIN(loom_memtier_plugin_v1_t, wait, 112);
PIN(loom_memtier_plugin_v1_t, address, 120);
PIN(loom_memtier_plugin_v1_t, prefetch, 128);

PIN_SIZE(loom_strategy_plugin_v1_t, 272);
PIN(loom_strategy_plugin_v1_t, header, 0);
PIN(loom_strategy_plugin_v1_t, axis, 40);
PIN(loom_strategy_plugin_v1_t, reserved, 44);
PIN(loom_strategy_plugin_v1_t, create, 48);
PIN(loom_strategy_plugin_v1_t, destroy, 56);
PIN(loom_strategy_plugin_v1_t, describe, 64);
PIN(loom_strategy_plugin_v1_t, data_setup, 72);
PIN(loom_strategy_plugin_v1_t, data_before_forward, 80);
PIN(loom_strategy_plugin_v1_t, data_after_forward, 88);
PIN(loom_strategy_plugin_v1_t, data_before_backward, 96);
PIN(loom_strategy_plugin_v1_t, data_grads_ready, 104);
PIN(loom_strategy_plugin_v1_t, data_finish_backward, 112);
PIN(loom_strategy_plugin_v1_t, data_grad_norm_sq, 120);
PIN(loom_strategy_plugin_v1_t, data_optimizer_step, 128);
PIN(loom_strategy_plugin_v1_t, data_zero_grads, 136);
PIN(loom_strategy_plugin_v1_t, data_get_state, 144);
PIN(loom_strategy_plugin_v1_t, data_set_state, 152);
PIN(loom_strategy_plugin_v1_t, tensor_shard, 160);
PIN(loom_strategy_plugin_v1_t, tensor_enter, 168);
PIN(loom_strategy_plugin_v1_t, tensor_exit, 176);
PIN(loom_strategy_plugin_v1_t, tensor_exit_backward, 184);
PIN(loom_strategy_plugin_v1_t, tensor_enter_backward, 192);
PIN(loom_strategy_plugin_v1_t, sequence_positions, 200);
PIN(loom_strategy_plugin_v1_t, attention_forward, 208);
PIN(loom_strategy_plugin_v1_t, attention_backward, 216);
PIN(loom_strategy_plugin_v1_t, pipeline_schedule, 224);
PIN(loom_strategy_plugin_v1_t, data_get_shard, 232);
PIN(loom_strategy_plugin_v1_t, capabilities, 240);
PIN(loom_strategy_plugin_v1_t, pipeline_bubble, 248);
PIN(loom_strategy_plugin_v1_t, data_eval, 256);
PIN(loom_strategy_plugin_v1_t, data_replica_state, 264); /* since 1.10 */
PIN_SIZE(loom_replica_buffer, 24);                       /* since 1.10 */
PIN(loom_replica_buffer, data, 8);
PIN(loom_replica_buffer, bytes, 16);
PIN_VALUE(LOOM_STRATEGY_APPROXIMATE, 8);                 /* since 1.10 */
PIN_VALUE(LOOM_STRATEGY_PARAMS_SHARDED, 1);

PIN_SIZE(loom_host, 232);
PIN(loom_host, struct_size, 0);
PIN(loom_host, version, 4);
PIN(loom_host, rank, 8);
PIN(loom_host, world_size, 12);
PIN(loom_host, local_rank, 16);
PIN(loom_host, local_size, 20);
PIN(loom_host, timeout_s, 24);
PIN(loom_host, log, 32);
PIN(loom_host, error, 40);
PIN(loom_host, config_int, 48);
PIN(loom_host, config_float, 56);
PIN(loom_host, config_bool, 64);
PIN(loom_host, config_string, 72);
PIN(loom_host, kv_put, 80);
PIN(loom_host, kv_get, 88);
PIN(loom_host, kv_add, 96);
PIN(loom_host, kv_barrier, 104);
PIN(loom_host, mem_alloc, 112);
PIN(loom_host, mem_free, 120);
PIN(loom_host, now_ns, 128);
PIN(loom_host, trace, 136);
PIN(loom_host, comm, 144);
PIN(loom_host, comm_waiting, 152);
PIN(loom_host, tiered_alloc, 160);
PIN(loom_host, tiered_free, 168);
PIN(loom_host, tiered_fetch, 176);
PIN(loom_host, tiered_acquire, 184);
PIN(loom_host, tiered_release, 192);
PIN(loom_host, crc32c, 200);      /* since 1.8 */
PIN(loom_host, copy_crc32c, 208); /* since 1.8 */
PIN(loom_host, compute, 216);     /* since 1.9 */
PIN(loom_host, comm_open, 224);   /* since 1.10 */

PIN_SIZE(loom_comm_api, 144);
PIN(loom_comm_api, struct_size, 0);
PIN(loom_comm_api, rank, 8);
PIN(loom_comm_api, size, 16);
PIN(loom_comm_api, backend, 24);
PIN(loom_comm_api, allreduce, 32);
PIN(loom_comm_api, broadcast, 40);
PIN(loom_comm_api, reduce, 48);
PIN(loom_comm_api, allgather, 56);
PIN(loom_comm_api, reducescatter, 64);
PIN(loom_comm_api, alltoall, 72);
PIN(loom_comm_api, send, 80);
PIN(loom_comm_api, recv, 88);
PIN(loom_comm_api, barrier, 96);
PIN(loom_comm_api, group_start, 104);
PIN(loom_comm_api, group_end, 112);
PIN(loom_comm_api, test, 120);
PIN(loom_comm_api, wait, 128);
PIN(loom_comm_api, split, 136); /* since 1.3 */

/* The types strategy hooks receive: their sizes are ABI too. */
PIN_SIZE(loom_tensor, 88);
PIN_SIZE(loom_param_desc, 104);
PIN_SIZE(loom_unit, 72);
PIN_SIZE(loom_optimizer_step, 56);
PIN(loom_optimizer_step, update, 32);
PIN(loom_optimizer_step, update_range, 40);       /* since 1.6 */
PIN(loom_optimizer_step, update_range_store, 48); /* since 1.7 */
PIN_SIZE(loom_param_shard, 16);
PIN_SIZE(loom_attention_kernels, 24);
PIN_SIZE(loom_attention, 112);
PIN_SIZE(loom_action, 8);
PIN_SIZE(loom_pipeline_shape, 32);
PIN_SIZE(loom_schedule_plugin_v1_t, 64); /* since 1.8; 64 since 1.10 */
PIN(loom_schedule_plugin_v1_t, header, 0);
PIN(loom_schedule_plugin_v1_t, build, 40);
PIN(loom_schedule_plugin_v1_t, bubble, 48);
PIN(loom_schedule_plugin_v1_t, bubble_with_settings, 56); /* since 1.10 */
PIN_SIZE(loom_strategy_setup, 112);
/* micro_batches since 1.8: the same int as grad_accum, its older name */
PIN(loom_strategy_setup, grad_accum, 104);
PIN(loom_strategy_setup, micro_batches, 104);

/* The compute backends (since 1.9): the plugin struct, what create and the
 * kernels receive, and the host's compute service. */
PIN_SIZE(loom_compute_plugin_v1_t, 464);
PIN(loom_compute_plugin_v1_t, header, 0);
PIN(loom_compute_plugin_v1_t, tier, 40);
PIN(loom_compute_plugin_v1_t, mem_kind, 44);
PIN(loom_compute_plugin_v1_t, probe, 48);
PIN(loom_compute_plugin_v1_t, create, 56);
PIN(loom_compute_plugin_v1_t, destroy, 64);
PIN(loom_compute_plugin_v1_t, describe, 72);
PIN(loom_compute_plugin_v1_t, alloc, 80);
PIN(loom_compute_plugin_v1_t, free, 88);
PIN(loom_compute_plugin_v1_t, to_device, 96);
PIN(loom_compute_plugin_v1_t, to_host, 104);
PIN(loom_compute_plugin_v1_t, copy, 112);
PIN(loom_compute_plugin_v1_t, copy_rows, 120);
PIN(loom_compute_plugin_v1_t, zero, 128);
PIN(loom_compute_plugin_v1_t, synchronize, 136);
PIN(loom_compute_plugin_v1_t, event_record, 144);
PIN(loom_compute_plugin_v1_t, event_wait, 152);
PIN(loom_compute_plugin_v1_t, event_free, 160);
PIN(loom_compute_plugin_v1_t, status, 168);
PIN(loom_compute_plugin_v1_t, gemm, 176);
PIN(loom_compute_plugin_v1_t, multiply_dtype, 184);
PIN(loom_compute_plugin_v1_t, matmul_forward, 192);
PIN(loom_compute_plugin_v1_t, matmul_backward_input, 200);
PIN(loom_compute_plugin_v1_t, matmul_backward_weight, 208);
PIN(loom_compute_plugin_v1_t, encoder_forward, 216);
PIN(loom_compute_plugin_v1_t, encoder_backward, 224);
PIN(loom_compute_plugin_v1_t, embedding_rows_forward, 232);
PIN(loom_compute_plugin_v1_t, embedding_rows_backward, 240);
PIN(loom_compute_plugin_v1_t, position_forward, 248);
PIN(loom_compute_plugin_v1_t, position_backward, 256);
PIN(loom_compute_plugin_v1_t, layernorm_forward, 264);
PIN(loom_compute_plugin_v1_t, residual_layernorm_forward, 272);
PIN(loom_compute_plugin_v1_t, layernorm_backward_input, 280);
PIN(loom_compute_plugin_v1_t, layernorm_backward_weight, 288);
PIN(loom_compute_plugin_v1_t, residual_forward, 296);
PIN(loom_compute_plugin_v1_t, bias_forward, 304);
PIN(loom_compute_plugin_v1_t, bias_backward, 312);
PIN(loom_compute_plugin_v1_t, bias_gelu_forward, 320);
PIN(loom_compute_plugin_v1_t, gelu_backward, 328);
PIN(loom_compute_plugin_v1_t, attention_forward, 336);
PIN(loom_compute_plugin_v1_t, attention_backward, 344);
PIN(loom_compute_plugin_v1_t, crossentropy_forward, 352);
PIN(loom_compute_plugin_v1_t, crossentropy_backward, 360);
PIN(loom_compute_plugin_v1_t, crossentropy_slice_max, 368);
PIN(loom_compute_plugin_v1_t, crossentropy_slice_sums, 376);
PIN(loom_compute_plugin_v1_t, crossentropy_slice_finish, 384);
PIN(loom_compute_plugin_v1_t, crossentropy_slice_backward, 392);
PIN(loom_compute_plugin_v1_t, mean, 400);
PIN(loom_compute_plugin_v1_t, adamw, 408);
PIN(loom_compute_plugin_v1_t, sum_squares, 416);
PIN(loom_compute_plugin_v1_t, count_nonfinite, 424);
PIN(loom_compute_plugin_v1_t, scale, 432);
PIN(loom_compute_plugin_v1_t, convert, 440);
PIN(loom_compute_plugin_v1_t, accumulate, 448);
PIN(loom_compute_plugin_v1_t, native_queue, 456);
PIN_SIZE(loom_compute_setup, 32);
PIN(loom_compute_setup, struct_size, 0);
PIN(loom_compute_setup, device, 4);
PIN(loom_compute_setup, threads, 8);
PIN(loom_compute_setup, precision, 12);
PIN(loom_compute_setup, deterministic, 16);
PIN(loom_compute_setup, cpu, 24);
PIN_SIZE(loom_compute_operand, 24);
PIN(loom_compute_operand, data, 0);
PIN(loom_compute_operand, dtype, 8);
PIN(loom_compute_operand, ld, 12);
PIN(loom_compute_operand, transposed, 16);
PIN_SIZE(loom_compute_weight, 16);
PIN(loom_compute_weight, data, 0);
PIN(loom_compute_weight, dtype, 8);
PIN_SIZE(loom_compute_adamw, 32);
PIN(loom_compute_adamw, step, 0);
PIN(loom_compute_adamw, lr, 8);
PIN(loom_compute_adamw, beta1, 12);
PIN(loom_compute_adamw, beta2, 16);
PIN(loom_compute_adamw, eps, 20);
PIN(loom_compute_adamw, weight_decay, 24);
PIN(loom_compute_adamw, grad_scale, 28);
PIN_SIZE(loom_compute_api, 112);
PIN(loom_compute_api, struct_size, 0);
PIN(loom_compute_api, tier, 4);
PIN(loom_compute_api, mem_kind, 8);
PIN(loom_compute_api, reserved, 12);
PIN(loom_compute_api, backend, 16);
PIN(loom_compute_api, to_device, 24);
PIN(loom_compute_api, to_host, 32);
PIN(loom_compute_api, copy, 40);
PIN(loom_compute_api, zero, 48);
PIN(loom_compute_api, convert, 56);
PIN(loom_compute_api, sum_squares, 64);
PIN(loom_compute_api, scale, 72);
PIN(loom_compute_api, synchronize, 80);
PIN(loom_compute_api, copy_rows, 88);
PIN(loom_compute_api, accumulate, 96);
PIN(loom_compute_api, native_queue, 104); /* appended: read it where struct_size covers it */

#endif

int main(void)
{
    /* Core and backends name a subgroup by it, each computing it alone. */
    if (loom_rank_list_hash((const int[]){0, 2}, 2) != 0x0808b56e0322d8c3ull) {
        printf("abi: loom_rank_list_hash changed\n");
        return 1;
    }
#if defined(__x86_64__) && defined(__LP64__)
    printf("abi: v1 structs match their pinned sizes and offsets\n");
#else
    printf("abi: pins are for x86_64 only; nothing checked on this target\n");
#endif
    return 0;
}
