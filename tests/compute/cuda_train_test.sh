#!/bin/sh
# Training on the GPU (model.device = "cuda") against the cpu backend's
# single-rank fp32 run of the same model, STEPS steps (default 20):
#   - fp32 meshes: every step's loss and grad_norm within 1e-5 relative (the
#     numerics contract; two CPU GEMM libraries, or 3 ranks against 1, agree
#     to about 1e-7 over 20 steps here, the GPU sums in yet another order);
#   - bf16: every step's loss within 2%, and over the run the loss falls as
#     the reference's does (its drop within 20% of the reference's);
#   - the header says "compute: cuda:" and the device tier holds the
#     parameters and gradients, the host none of the model's state (the
#     progress line's peaks).
# Meshes of 2 to 4 ranks share the one GPU (a rank's device is its local
# rank modulo the GPUs visible) and their collectives are staged through
# host memory by a host communicator (BACKEND: ucx, the default, or mpi).
# Every command is printed; a comparison prints both runs side by side and
# the first step that differs.
#   usage: cuda_train_test.sh LOOM SOURCE_DIR CASE [BACKEND]
#   env:   STEPS=20; LOOM_TEST_DEVICE=cuda (sim checks this script on a
#          machine without a GPU: LOOM_TEST_DEVICE=sim sh cuda_train_test.sh ...)
set -eu
LOOM=$1
SRC=$2
CASE=$3
BACKEND=${4:-ucx}
STEPS=${STEPS:-20}
DEVICE=${LOOM_TEST_DEVICE:-cuda}
CFG=$SRC/tests/zero/tiny.cfg
DATA=$SRC/examples/data/corpus.bin
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cd "$TMP"

fail() { echo "cuda_train_test $CASE: FAILED: $*"; exit 1; }

gpus() { nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true; }

# run NAME RANKS DEVICE [--set ...]: metrics in NAME.jsonl, output in NAME.log
run() {
    run_name=$1; run_ranks=$2; run_device=$3; shift 3
    set -- --set data.train="$DATA" --set model.device="\"$run_device\"" \
        --set train.steps="$STEPS" --set comm.default="$BACKEND" --metrics "$run_name.jsonl" "$@"
    if [ "$run_ranks" = 1 ]; then
        set -- "$LOOM" train "$CFG" "$@"
    else
        set -- "$LOOM" launch -n "$run_ranks" -- "$LOOM" train "$CFG" "$@"
    fi
    echo "+ $*"
    if ! "$@" > "$run_name.log" 2>&1; then
        cat "$run_name.log"
        if [ "$run_ranks" -gt 1 ] && [ "$run_device" = cuda ]; then
            echo "note: $run_ranks ranks on $(gpus) visible GPU(s), shared round-robin by" \
                "the cuda plugin (device = local rank % GPUs; the compute: line says which)"
        fi
        fail "run $run_name failed"
    fi
    [ -s "$run_name.jsonl" ] || { cat "$run_name.log"; fail "run $run_name wrote no steps"; }
}

# steps NAME: "step loss grad_norm val_loss" for each training step of
# NAME.jsonl ("-" where a value is absent, "null" where it was not finite)
steps() {
    awk 'function get(key) {
             if (!match($0, "\"" key "\": [^,}]*")) return "-"
             return substr($0, RSTART + length(key) + 4, RLENGTH - length(key) - 4)
         }
         /"loss": / { print get("step"), get("loss"), get("grad_norm"), get("val_loss") }
        ' "$1.jsonl"
}

# compare REF GOT MODE: GOT's steps against the same steps of REF, side by
# side. MODE fp32: loss, grad_norm (and val_loss where both have one) within
# 1e-5 relative; bf16: loss within 2%, and GOT's drop over its steps within
# 20% of REF's over the same steps. Every step of GOT must be in REF.
compare() {
    steps "$1" > ref.txt
    steps "$2" > got.txt
    [ -s got.txt ] || fail "$2 has no training steps in $2.jsonl"
    awk -v ref="$1" -v got="$2" -v mode="$3" '
        function rel(a, b) {
            d = a - b; if (d < 0) d = -d; m = b < 0 ? -b : b; return m > 0 ? d / m : d
        }
        function bad(v) { return v == "null" || v == "-" || v == "nan" || v == "inf" }
        NR == FNR { rl[$1] = $2; rn[$1] = $3; rv[$1] = $4; next }
        {
            s = $1; n++
            if (!(s in rl)) { printf "step %s of %s is not in %s\n", s, got, ref; broken = 1; next }
            if (n == 1) { first_step = s; gfirst = $2; rfirst = rl[s] }
            last_step = s; glast = $2; rlast = rl[s]
            if (n == 1)
                printf "%5s  %-14s %-14s %9s   %-14s %-14s %9s\n", "step", "loss " ref, "loss " got,
                       "relative", "norm " ref, "norm " got, "relative"
            el = bad($2) || bad(rl[s]) ? 1 : rel($2, rl[s])
            en = bad($3) || bad(rn[s]) ? 1 : rel($3, rn[s])
            flag = ""
            if (mode == "fp32" && (el > 1e-5 || en > 1e-5)) flag = "  <- over 1e-5"
            if (mode == "bf16" && el > 0.02) flag = "  <- loss over 2%"
            if (mode == "fp32" && $4 != "-" && rv[s] != "-") {
                ev = bad($4) || bad(rv[s]) ? 1 : rel($4, rv[s])
                if (ev > 1e-5) flag = flag "  <- val_loss " $4 " vs " rv[s]
            }
            val = $4 != "-" || rv[s] != "-" ? "  val " rv[s] " " $4 : ""
            printf "%5s  %-14s %-14s %9.2e   %-14s %-14s %9.2e%s%s\n", s, rl[s], $2, el, rn[s], $3,
                   en, val, flag
            if (flag != "" && !first_bad) first_bad = s
            if (el > worst_l) worst_l = el
            if (en > worst_n) worst_n = en
        }
        END {
            if (broken) exit 1
            printf "%s vs %s over %d steps: worst relative difference loss %.3g, grad_norm %.3g\n",
                   got, ref, n, worst_l, worst_n
            if (first_bad) { printf "first diverging step: %s\n", first_bad; exit 1 }
            if (mode == "bf16" && n > 1) {
                gd = gfirst - glast; rd = rfirst - rlast
                printf "loss from step %s to %s: %s fell %.4f, %s fell %.4f\n", first_step,
                       last_step, ref, rd, got, gd
                if (!(rd > 0 && gd > 0.8 * rd && gd < 1.25 * rd)) {
                    print "the loss does not fall as the reference does"
                    exit 1
                }
            }
        }' ref.txt got.txt || fail "$2 does not reproduce $1 (table above)"
}

# The backend is the one asked for, and the model's buffers live in its
# device tier: the last progress line shows params and grads there and
# none of the model's state in host memory.
resident() {
    grep -Eq "^(\[[0-9]+\] )?compute: $DEVICE: " "$1.log" ||
        { grep -E 'compute:' "$1.log"; fail "$1: the header does not say compute: $DEVICE:"; }
    line=$(grep -E "^(\[0\] )?step" "$1.log" | tail -1)
    device=$(echo "$line" | sed -n 's/.*peak device: \([^|]*\).*/\1/p')
    case "$device" in
    *params*grads* | *grads*params*) ;;
    *) fail "$1: params and grads are not in the device tier: $line" ;;
    esac
    host=$(echo "$line" | sed 's/.*peak host: \([^|]*\).*/\1/')
    case "$host" in
    *params* | *grads* | *optimizer*) fail "$1: model state in host memory ($host)" ;;
    esac
    grep -E "^(\[0\] )?compute: " "$1.log" | head -1
    echo "$1: $line"
}

# mesh MODE RANKS [--set ...]: the mesh on the device against the cpu's
# single-rank run of the same model (fp32, whatever the mesh's precision)
mesh() {
    mode=$1; ranks=$2; shift 2
    [ "$mode" = bf16 ] && set -- --set train.precision=bf16 "$@"
    run "$DEVICE" "$ranks" "$DEVICE" "$@"
    resident "$DEVICE"
    reference "$@"
    compare cpu1 "$DEVICE" "$mode"
}

# reference [--set ...]: the cpu's single-rank fp32 run, without the mesh's
# parallel settings and precision (the other settings kept)
reference() {
    keep=""
    while [ $# -gt 0 ]; do
        case "$2" in
        parallel.* | train.precision=*) ;;
        *) keep="$keep $1 $2" ;;
        esac
        shift 2
    done
    # shellcheck disable=SC2086
    run cpu1 1 cpu $keep
}

pp() {
    echo "--set parallel.pp.size=$1 --set parallel.pp.microbatches=$2 --set parallel.pp.schedule=$3"
}

case "$CASE" in
one)      mesh fp32 1 --set train.grad_accum=2 --set data.val="$DATA" --set train.eval_every=5 \
              --set train.eval_batches=1 ;;
bf16)     mesh bf16 1 ;;
ddp2)     mesh fp32 2 --set parallel.dp.size=2 ;;
ddp3)     mesh fp32 3 --set parallel.dp.size=3 ;;
zero1)    mesh fp32 2 --set parallel.dp.size=2 --set parallel.dp.strategy=zero1 ;;
zero1_4)  mesh fp32 4 --set parallel.dp.size=4 --set parallel.dp.strategy=zero1 ;;
zero2)    mesh fp32 2 --set parallel.dp.size=2 --set parallel.dp.strategy=zero2 ;;
zero2_4)  mesh fp32 4 --set parallel.dp.size=4 --set parallel.dp.strategy=zero2 ;;
zero3)    mesh fp32 2 --set parallel.dp.size=2 --set parallel.dp.strategy=zero3 ;;
zero3_4)  mesh fp32 4 --set parallel.dp.size=4 --set parallel.dp.strategy=zero3 ;;
bf16_zero3) mesh bf16 4 --set parallel.dp.size=4 --set parallel.dp.strategy=zero3 ;;
hsdp)     mesh fp32 4 --set parallel.dp.size=4 --set parallel.dp.strategy=zero3 \
              --set parallel.dp.shard_size=2 ;;
tp2)      mesh fp32 2 --set parallel.tp.size=2 ;;
seqpar)   mesh fp32 2 --set parallel.tp.size=2 --set parallel.tp.sequence_parallel=true ;;
ulysses)  mesh fp32 2 --set parallel.sp.size=2 --set parallel.sp.strategy=ulysses ;;
ring)     mesh fp32 2 --set parallel.sp.size=2 --set parallel.sp.strategy=ring ;;
1f1b)     # shellcheck disable=SC2046
          mesh fp32 2 $(pp 2 2 1f1b) ;;
zb)       # shellcheck disable=SC2046
          mesh fp32 2 $(pp 2 2 zb-h1) ;;
3d)       mesh fp32 4 --set parallel.dp.size=2 --set parallel.tp.size=2 \
              --set parallel.dp.strategy=zero1 ;;
checkpoint)
    # a checkpoint written on the device resumes on the cpu and the
    # reverse, each continuing as the uninterrupted cpu run (within 1e-5:
    # the same bits are not asked of two backends)
    half=$((STEPS / 2))
    run whole 1 cpu
    run first_dev 1 "$DEVICE" --set train.checkpoint_every="$half" --set train.checkpoint_dir=dev_ck
    run first_cpu 1 cpu --set train.checkpoint_every="$half" --set train.checkpoint_dir=cpu_ck
    resident first_dev
    compare whole first_dev fp32
    for ck in dev_ck cpu_ck; do
        echo "+ $LOOM ckpt consolidate $ck/step-$half --llmc $ck.bin"
        "$LOOM" ckpt consolidate "$ck/step-$half" --llmc "$ck.bin" > "$ck.log" 2>&1 ||
            { cat "$ck.log"; fail "cannot consolidate $ck/step-$half"; }
    done
    [ "$(wc -c < dev_ck.bin)" = "$(wc -c < cpu_ck.bin)" ] ||
        fail "the device's checkpoint ($(wc -c < dev_ck.bin) bytes as llm.c's file) and" \
            "the cpu's ($(wc -c < cpu_ck.bin)) differ in size"
    run rest_cpu 1 cpu --resume "dev_ck/step-$half"
    run rest_dev 1 "$DEVICE" --resume "cpu_ck/step-$half"
    [ "$(steps rest_cpu | head -1 | cut -d' ' -f1)" = $((half + 1)) ] ||
        fail "the resumed run did not start at step $((half + 1))"
    compare whole rest_cpu fp32
    compare whole rest_dev fp32
    echo "checkpoints: the device's resumes on the cpu and the cpu's on the device," \
        "both as the uninterrupted run" ;;
plugin_check)
    # loom plugins --check with the GPU there: the probe passes and the
    # functional checks run against the cpu backend
    plugin=${LOOM_PLUGIN_PATH%%:*}/libloom-compute-$DEVICE.so
    echo "+ $LOOM plugins --check $plugin"
    "$LOOM" plugins --check "$plugin" > check.log 2>&1 || { cat check.log; fail "--check failed"; }
    cat check.log
    if grep -q '^note: probe: .* cannot run here' check.log; then
        fail "the probe declined on a machine with a GPU"
    fi
    grep -q '^ok   create' check.log || fail "--check did not create the backend" ;;
*) fail "unknown case" ;;
esac
echo "cuda_train_test $CASE: passed"
