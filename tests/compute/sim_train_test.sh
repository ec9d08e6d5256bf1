#!/bin/sh
# Device-resident training proven on the CPU: each case trains one mesh with
# model.device = "sim" (the cpu kernels on memory the host cannot read
# outside the backend's calls, so any other code that touches a model
# buffer kills the run) and checks that
#   - it gives the same losses and gradient norms, bit for bit, as the
#     same mesh on the cpu backend (the same kernels on the same values);
#   - fp32 meshes reproduce the single-rank cpu run (the numerics
#     contract: 1e-5 relative per step);
#   - the device tier holds the model's buffers (the progress line's
#     "peak device") and the host none of them.
#   usage: sim_train_test.sh LOOM SOURCE_DIR CASE [BACKEND]
set -eu
LOOM=$1
SRC=$2
CASE=$3
BACKEND=${4:-mpi}
CFG=$SRC/tests/zero/tiny.cfg
DATA=$SRC/examples/data/corpus.bin
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cd "$TMP"

fail() { echo "sim_train_test $CASE: $*"; exit 1; }

# run NAME RANKS DEVICE [--set ...]: metrics in NAME.jsonl, output in NAME.log
run() {
    run_name=$1; run_ranks=$2; run_device=$3; shift 3
    set -- --set data.train="$DATA" --set model.device="\"$run_device\"" \
        --set train.steps=4 --metrics "$run_name.jsonl" "$@"
    if [ "$run_ranks" = 1 ]; then
        "$LOOM" train "$CFG" "$@" > "$run_name.log" 2>&1 ||
            { cat "$run_name.log"; fail "run $run_name failed"; }
    else
        "$LOOM" launch -n "$run_ranks" -- "$LOOM" train "$CFG" --set comm.default="$BACKEND" \
            "$@" > "$run_name.log" 2>&1 || { cat "$run_name.log"; fail "run $run_name failed"; }
    fi
    [ -s "$run_name.jsonl" ] || { cat "$run_name.log"; fail "run $run_name wrote no steps"; }
}

# field NAME KEY: the key's value in each line of NAME.jsonl
field() { sed "s/.*\"$2\": \([^,}]*\).*/\1/" "$1.jsonl"; }

same() {
    for key in loss grad_norm; do
        field "$1" $key > a.txt
        field "$2" $key > b.txt
        cmp -s a.txt b.txt ||
            { paste a.txt b.txt; fail "$key of $1 and $2 differ: the sim run must give the cpu run's bits"; }
    done
    echo "$1 = $2 bit for bit over $(wc -l < a.txt) steps"
}

near() {
    for key in loss grad_norm; do
        field "$1" $key > a.txt
        field "$2" $key > b.txt
        paste a.txt b.txt | awk -v tol="$3" -v a="$1" -v b="$2" -v key=$key '
            { d = $1 - $2; if (d < 0) d = -d; r = d / ($1 < 0 ? -$1 : $1); if (r > worst) worst = r;
              if (r > tol) { printf "step %d %s: %s %s, %s %s (relative %.3g > %g)\n", NR, key, a, $1, b, $2, r, tol; bad = 1 } }
            END { printf "%s vs %s: %s worst relative difference %.3g\n", a, b, key, worst; exit bad }' ||
            fail "$1 does not reproduce $2"
    done
}

# The model's buffers live in the device tier: the last step's progress
# line shows a peak there and none of params, grads or optimizer in host
# memory.
resident() {
    line=$(grep -E "^(\[0\] )?step" "$1.log" | tail -1)
    echo "$line" | grep -q 'peak device: .*params' || fail "$1: no params in the device tier: $line"
    host=$(echo "$line" | sed 's/.*peak host: \([^|]*\).*/\1/')
    case "$host" in
    *params* | *grads* | *optimizer*) fail "$1: model state in host memory ($host)" ;;
    esac
}

# mesh RANKS [--set ...]: the mesh on sim against the same mesh on cpu, and
# (fp32) against the single-rank cpu run
mesh() {
    ranks=$1; shift
    run cpu "$ranks" cpu "$@"
    run sim "$ranks" sim "$@"
    same sim cpu
    resident sim
}

single() {
    run single 1 cpu "$@"
    near sim single 1e-5
}

pp() { echo "--set parallel.pp.size=$1 --set parallel.pp.microbatches=$2 --set parallel.pp.schedule=$3"; }

case "$CASE" in
one)      mesh 1 --set train.grad_accum=2 --set data.val="$DATA" --set train.eval_every=2 \
              --set train.eval_batches=1 ;;
bf16)     mesh 1 --set train.precision=bf16 ;;
fp16)     mesh 1 --set train.precision=fp16 --set train.loss_scale=1024 ;;
recompute) mesh 1 --set train.recompute=block --set train.clip=0.5 --set train.decay=matrices \
              --set train.weight_decay=0.1 ;;
ddp3)     mesh 3 --set parallel.dp.size=3; single ;;
zero1)    mesh 2 --set parallel.dp.size=2 --set parallel.dp.strategy=zero1; single ;;
zero2)    mesh 3 --set parallel.dp.size=3 --set parallel.dp.strategy=zero2 --set train.precision=bf16 ;;
zero3)    mesh 3 --set parallel.dp.size=3 --set parallel.dp.strategy=zero3; single ;;
hsdp)     mesh 4 --set parallel.dp.size=4 --set parallel.dp.strategy=zero3 \
              --set parallel.dp.shard_size=2; single ;;
tp2)      mesh 2 --set parallel.tp.size=2; single ;;
seqpar)   mesh 2 --set parallel.tp.size=2 --set parallel.tp.sequence_parallel=true; single ;;
ulysses)  mesh 2 --set parallel.sp.size=2 --set parallel.sp.strategy=ulysses; single ;;
ring)     mesh 2 --set parallel.sp.size=2 --set parallel.sp.strategy=ring; single ;;
ring4)    mesh 4 --set parallel.sp.size=4 --set parallel.sp.strategy=ring \
              --set parallel.sp.balance=zigzag; single ;;
1f1b)     mesh 2 $(pp 2 2 1f1b); single ;;
gpipe)    mesh 2 $(pp 2 3 gpipe) --set train.batch=12; single ;;
zb)       mesh 2 $(pp 2 2 zb-h1); single ;;
interleaved) mesh 2 $(pp 2 4 interleaved) --set parallel.pp.virtual_stages=2 \
              --set model.layers=4; single --set model.layers=4 ;;
3d)       mesh 4 --set parallel.dp.size=2 --set parallel.tp.size=2 --set parallel.dp.strategy=zero1
          single ;;
pp_tp)    mesh 4 $(pp 2 2 1f1b) --set parallel.tp.size=2; single ;;
example)  # the README's demo, as shipped: 4 ranks of ddp, validation
    CFG=$SRC/examples/train.cfg
    mesh 4 --set data.val="$SRC/examples/data/val.bin" ;;
checkpoint)
    # sim's checkpoint holds the cpu run's state bit for bit, and each
    # resumes on the other backend to the uninterrupted run's losses
    run whole 1 cpu
    run first_sim 1 sim --set train.checkpoint_every=2 --set train.checkpoint_dir=sim_ck
    run first_cpu 1 cpu --set train.checkpoint_every=2 --set train.checkpoint_dir=cpu_ck
    for ck in sim_ck cpu_ck; do
        "$LOOM" ckpt consolidate $ck/step-2 --llmc $ck.bin > $ck.log 2>&1 ||
            { cat $ck.log; fail "cannot consolidate $ck/step-2"; }
    done
    cmp -s sim_ck.bin cpu_ck.bin || fail "the sim run's checkpoint differs from the cpu run's"
    run rest_cpu 1 cpu --resume sim_ck/step-2
    run rest_sim 1 sim --resume cpu_ck/step-2
    tail -2 whole.jsonl > whole.tail
    for rest in rest_cpu rest_sim; do
        tail -2 $rest.jsonl > $rest.tail
        [ "$(sed 's/.*"loss": \([^,]*\).*/\1/' whole.tail)" = \
          "$(sed 's/.*"loss": \([^,]*\).*/\1/' $rest.tail)" ] ||
            fail "$rest: resuming on the other backend changed the losses"
    done
    echo "checkpoints: sim's = cpu's bit for bit, and each resumes on the other backend" ;;
device_fault)
    # rank 1's device fails mid-run (compute.sim.fault_rank): it exits with
    # the backend's one line, and the launcher names it and the op the
    # others wait in, instead of a hang (train.peak_gflops: no products
    # measured at start, so the 500 calls end at the same step each run)
    status=0
    "$LOOM" launch -n 3 -- "$LOOM" train "$CFG" --set data.train="$DATA" --set model.device=sim \
        --set parallel.dp.size=3 --set comm.default="$BACKEND" --set comm.timeout_s=30 \
        --set train.steps=20 --set train.peak_gflops=100 \
        --set compute.sim.fault_rank=1 --set compute.sim.fault_after=500 \
        > fault.log 2>&1 || status=$?
    [ "$status" != 0 ] || { cat fault.log; fail "the job exited 0"; }
    grep -q '^\[1\] loom train: sim: device fault on rank 1 after 500 calls' fault.log ||
        { cat fault.log; fail "rank 1 does not say its device failed"; }
    grep -Eq '^loom launch: rank 1 \(exited with status 1\) is after dp allreduce #[0-9]+ \(step [0-9]+, loss\); ranks 0, 2 wait in dp allreduce #[0-9]+' fault.log ||
        { cat fault.log; fail "the launcher does not name rank 1 and where the others wait"; }
    grep '^loom launch: rank 1 (exited' fault.log ;;
refusals)
    # OLD: a folder holding a ddp built for ABI 1.5 (tests/train's old-abi);
    # HOSTMEM: one holding a ddp of this ABI that keeps the model in host
    # memory (host_memory_ddp.c)
    OLD=${BACKEND%%:*} HOSTMEM=${BACKEND#*:}
    refused() {
        want=$1; shift
        status=0
        "$LOOM" train "$CFG" --set data.train="$DATA" "$@" > refused.log 2>&1 || status=$?
        [ "$status" = "${STATUS:-78}" ] ||
            { cat refused.log; fail "exit status $status, want ${STATUS:-78}"; }
        [ "$(wc -l < refused.log)" = 1 ] || { cat refused.log; fail "more than one line"; }
        grep -qF -- "$want" refused.log || { cat refused.log; fail "the refusal does not say: $want"; }
        echo "refused: $(tail -1 refused.log)"
    }
    refused "strategy ddp was built for 1.5 ($OLD/libloom-strategy-ddp.so), before the model's buffers could live on a device" \
        --set model.device=sim --set plugins.path="[\"$OLD\"]"
    refused "strategy ddp keeps the parameters of unit 0 (embedding) in host memory, but model.device = \"sim\" computes in device memory" \
        --set model.device=sim --set plugins.path="[\"$HOSTMEM\"]"
    refused "memory.offload.params=host: moving parameters and gradients out of the sim backend's device memory is not supported yet" \
        --set model.device=sim --set memory.offload.params=host --set parallel.dp.strategy=zero3
    refused "model.device=nosuch: plugin compute 'nosuch' not found" --set model.device=nosuch
    # out of device memory (8 layers of GPT-2 124M's width in a 1 GiB
    # arena): the tier, the backend, the bytes and the purpose, then the
    # backend's own reason
    STATUS=1 refused "memory: the device tier (the sim backend) cannot give 366.7 MiB more for optimizer (0 bytes of it held for optimizer, 965.9 MiB in all): sim: cannot allocate 384497664 bytes" \
        --set model.device=sim --set compute.sim.size_gib=1 --set model.layers=8 \
        --set model.channels=768 --set model.heads=12 --set model.vocab=50257 \
        --set model.padded_vocab=50304 --set model.max_seq=1024 --set train.steps=1
    # auto: the cpu where no cuda backend can run (no plugin, or no GPU),
    # and the header says why; cuda where one can
    run auto 1 auto
    grep -qE '^compute: (cpu: .*\(model.device = "auto": cpu \(|cuda: )' auto.log ||
        { cat auto.log; fail "model.device = auto does not say what it chose and why"; }
    grep '^compute:' auto.log ;;
offload_host | offload_host_bf16 | offload_nvme)
    # ZeRO-Offload: the optimizer state in host memory (or nvme through host
    # staging), parameters and gradients on the device; the step is the
    # CPU's AdamW, so the cpu run offloaded the same way gives the same bits
    case "$CASE" in
    offload_host) mesh_args="2 --set parallel.dp.strategy=zero2 --set memory.offload.optimizer=host" ;;
    offload_host_bf16) mesh_args="2 --set parallel.dp.strategy=zero3 --set train.precision=bf16
        --set memory.offload.optimizer=host" ;;
    offload_nvme) mkdir tier
        mesh_args="2 --set parallel.dp.strategy=ddp --set memory.offload.optimizer=nvme
        --set memory.offload.path=$TMP/tier" ;;
    esac
    # shellcheck disable=SC2086
    set -- $mesh_args --set parallel.dp.size=2
    ranks=$1; shift
    run cpu "$ranks" cpu "$@"
    run sim "$ranks" sim "$@"
    same sim cpu
    want=host
    [ "$CASE" = offload_nvme ] && want=nvme
    line=$(grep -E "^(\[0\] )?step" sim.log | tail -1)
    device=$(echo "$line" | sed 's/.*peak device: \([^|]*\).*/\1/')
    case "$device" in
    *params*grads*) ;;
    *) fail "sim: params and grads not in the device tier: $line" ;;
    esac
    case "$device" in *optimizer*) fail "sim: optimizer state in the device tier: $line" ;; esac
    echo "$line" | grep -q "peak $want: [^|]*optimizer" ||
        fail "sim: no optimizer state in the $want tier: $line"
    host=$(echo "$line" | sed 's/.*peak host: \([^|]*\).*/\1/')
    case "$host" in
    *params* | *grads*) fail "sim: parameters or gradients in host memory ($host)" ;;
    esac
    echo "sim: $line"
    # loom plan shows the offloaded state in a host row under the device's
    "$LOOM" plan "$CFG" --set data.train="$DATA" --set model.device=sim "$@" > plan.txt 2>&1 ||
        { cat plan.txt; fail "loom plan failed"; }
    row=$(grep -E '^ +host ' plan.txt) || { cat plan.txt; fail "loom plan shows no host row"; }
    echo "$row" | awk '{ if ($6 == "0") exit 1 }' ||
        { cat plan.txt; fail "loom plan's host row has no optimizer bytes"; }
    echo "plan: $row" ;;
offload_checkpoint)
    # offloaded state checkpoints as the cpu run's, bit for bit, and the sim
    # run resumes from the cpu run's checkpoint to its losses
    set -- --set parallel.dp.size=2 --set parallel.dp.strategy=zero3 --set train.precision=bf16 \
        --set memory.offload.optimizer=host
    run cpu 2 cpu "$@" --set train.checkpoint_every=2 --set train.checkpoint_dir=cpu_ck
    run sim 2 sim "$@" --set train.checkpoint_every=2 --set train.checkpoint_dir=sim_ck
    same sim cpu
    for ck in sim_ck cpu_ck; do
        "$LOOM" ckpt consolidate $ck/step-2 --llmc $ck.bin > $ck.log 2>&1 ||
            { cat $ck.log; fail "cannot consolidate $ck/step-2"; }
    done
    cmp -s sim_ck.bin cpu_ck.bin || fail "the sim run's checkpoint differs from the cpu run's"
    run rest 2 sim "$@" --resume cpu_ck/step-2
    [ "$(wc -l < rest.jsonl)" = 2 ] || fail "the resumed run did not start at step 3"
    [ "$(tail -2 rest.jsonl | sed 's/.*"loss": \([^,]*\).*/\1/')" = \
      "$(tail -2 cpu.jsonl | sed 's/.*"loss": \([^,]*\).*/\1/')" ] ||
        fail "resuming the cpu run's checkpoint on sim changed the losses"
    echo "offloaded state: sim's checkpoint = cpu's bit for bit, and sim resumes cpu's" ;;
*) fail "unknown case" ;;
esac
