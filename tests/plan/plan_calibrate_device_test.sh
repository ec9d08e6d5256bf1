#!/bin/sh
# `loom plan --calibrate FILE --device NAME` against a run on that backend.
#   usage: plan_calibrate_device_test.sh LOOM SOURCE_DIR sim|cuda
#   sim:  calibrate on the sim backend with tests/zero/tiny.cfg as the
#         reference; the file must read as a cluster with device = true, a
#         device_memory and peaks, and the plan's step for tiny.cfg on sim
#         must be finite and positive next to a measured sim run (the ratio
#         is printed, bounded only loosely: a shared machine's wall clock),
#         and bad input must fail with one line.
#   cuda: calibrate on the GPU with a GPT-2 124M bf16 reference (B = $REF_BATCH,
#         default 16, T = 1024), then plan GPT-2 124M bf16 B = 16 T = 1024 and
#         train it 10 steps: FAIL when the plan's step is off the measured
#         median (steps 4 to 10) by more than 15%. With REF_BATCH = 16 the
#         reference is the job itself (the check is the calibration's
#         consistency and the step's stability); REF_BATCH = 8 makes the
#         plan extrapolate.
set -eu
LOOM=$1
SRC=$2
MODE=$3
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cd "$TMP"

fail() {
    echo "plan_calibrate_device_test: $*"
    exit 1
}

# show FILE MESSAGE: FILE's text, then fail with MESSAGE
show() {
    cat "$1"
    fail "$2"
}

# median_step FILE: the median step_ms of steps 4 on, in seconds
median_step() {
    sed -n 's/^{"step": \([0-9]*\),.*"step_ms": \([0-9.e+-]*\),.*/\1 \2/p' "$1" |
        awk '$1 > 3 { print $2 }' | sort -g |
        awk '{ v[NR] = $1 } END { if (NR == 0) exit 1;
              m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; print m / 1000 }'
}

# plan_step FILE: the plan's step_s in a loom plan --json file
plan_step() {
    sed -n 's/.*"step_s": \([0-9.e+-]*\), "tokens_per_s".*/\1/p' "$1"
}

# compare PLANNED MEASURED TOLERANCE: prints both and their ratio; fails
# when the ratio is not finite and positive or is off 1 by more than
# TOLERANCE (above 1 + TOLERANCE, or below 1 - TOLERANCE; below
# 1 / (1 + TOLERANCE) for a tolerance of 1 or more)
compare() {
    awk -v p="$1" -v m="$2" -v tol="$3" 'BEGIN {
        if (!(p > 0) || !(m > 0)) {
            printf "planned %s s, measured %s s: not both finite and positive\n", p, m; exit 1 }
        r = p / m
        low = tol < 1 ? 1 - tol : 1 / (1 + tol)
        printf "planned %.3f ms a step, measured %.3f ms: ratio %.3f (allowed %.3f to %.3f)\n",
            p * 1e3, m * 1e3, r, low, 1 + tol
        if (r > 1 + tol || r < low) exit 1 }'
}

case "$MODE" in
sim)
    DATA=$SRC/examples/data/corpus.bin
    REF=$SRC/tests/zero/tiny.cfg
    # bad input: one line each, a non-zero exit
    BAD="--device_nosuch --device_cpu_--reference_/nonexistent.cfg"
    # a backend that cannot run here: cuda without a GPU
    nvidia-smi -L > /dev/null 2>&1 || BAD="$BAD --device_cuda"
    for bad in $BAD; do
        bad=$(echo "$bad" | tr _ ' ')
        # shellcheck disable=SC2086
        if "$LOOM" plan --calibrate bad.cfg $bad --ranks 2 --data "$DATA" > bad.txt 2>&1; then
            cat bad.txt
            fail "--calibrate $bad succeeded"
        fi
        [ "$(grep -c . bad.txt)" = 1 ] || show bad.txt "--calibrate $bad: not one line"
        echo "refused as it should be: $(cat bad.txt)"
    done
    if "$LOOM" plan "$REF" --device sim > bad.txt 2>&1; then
        fail "loom plan CONFIG --device sim (no --calibrate) succeeded"
    fi
    grep -q -- "--calibrate" bad.txt || show bad.txt "--device without --calibrate: no hint"
    echo "refused as it should be: $(cat bad.txt)"

    "$LOOM" plan --calibrate out.cfg --device sim --reference "$REF" --data "$DATA" --ranks 2 \
        > calibrate.txt 2>&1 || show calibrate.txt "loom plan --calibrate --device sim failed"
    grep '^calibrate: \(compute\|device\|the \)' calibrate.txt || true
    grep -q '^  device = true;' out.cfg || show out.cfg "out.cfg does not say device = true"
    grep -q '^  device_memory = "16 GiB";' out.cfg ||
        show out.cfg "out.cfg's device_memory is not the sim arena's 16 GiB"
    grep -q '^  peak = { fp32 = "[0-9.]* [GMT]FLOP/s"; bf16 = ' out.cfg ||
        show out.cfg "out.cfg has no fp32 and bf16 peaks"
    grep -q "Effective" out.cfg || show out.cfg "out.cfg's memory_bandwidth was not fitted"

    "$LOOM" plan "$REF" --cluster out.cfg --set model.device=sim --set data.train="$DATA" \
        --json plan.json > plan.txt 2>&1 || show plan.txt "loom plan --cluster out.cfg failed"
    grep '^step:' plan.txt
    PLANNED=$(plan_step plan.json)
    "$LOOM" train "$REF" --set model.device=sim --set data.train="$DATA" --set train.steps=10 \
        --metrics run.jsonl > run.log 2>&1 || { tail -5 run.log; fail "loom train on sim failed"; }
    MEASURED=$(median_step run.jsonl) || fail "the sim run wrote no step times"
    # a loose factor: the calibration and the run may meet other jobs' load
    compare "$PLANNED" "$MEASURED" 2 || fail "the plan is off the sim run by more than 3x"
    ;;
cuda)
    REF_BATCH=${REF_BATCH:-16}
    # random GPT-2 tokens in llm.c's shard format (scripts/bench-gpu.sh's)
    python3 - <<'PY' || fail "cannot write the token shard"
import os
from array import array
count = 1 << 21
tokens = array("H", (t % 50257 for t in array("H", os.urandom(2 * count))))
with open("train.bin", "wb") as f:
    array("i", [20240520, 1, count] + [0] * 253).tofile(f)
    tokens.tofile(f)
PY
    for b in "$REF_BATCH" 16; do
        cat > "gpt2-124m-b$b.cfg" <<EOF
model = { layers = 12; heads = 12; channels = 768; vocab = 50257; padded_vocab = 50304;
          max_seq = 1024; };
data = { train = "$TMP/train.bin"; };
train = { batch = $b; seq = 1024; steps = 10; lr = 6e-4; precision = "bf16"; };
EOF
    done
    "$LOOM" plan --calibrate out.cfg --device cuda --reference "gpt2-124m-b$REF_BATCH.cfg" \
        --ranks 2 \
        > calibrate.txt 2>&1 || show calibrate.txt "loom plan --calibrate --device cuda failed"
    cat calibrate.txt
    grep -q '^  device = true;' out.cfg || show out.cfg "out.cfg does not say device = true"
    "$LOOM" plan gpt2-124m-b16.cfg --cluster out.cfg --set model.device=cuda --json plan.json \
        > plan.txt 2>&1 || show plan.txt "loom plan --cluster out.cfg failed"
    grep '^step:' plan.txt
    PLANNED=$(plan_step plan.json)
    "$LOOM" train gpt2-124m-b16.cfg --set model.device=cuda --set train.steps=10 \
        --metrics run.jsonl > run.log 2>&1 ||
        { tail -20 run.log; fail "loom train on cuda failed"; }
    MEASURED=$(median_step run.jsonl) || fail "the cuda run wrote no step times"
    echo "reference: GPT-2 124M bf16 B = $REF_BATCH, T = 1024; planned and measured: B = 16"
    compare "$PLANNED" "$MEASURED" 0.15 || fail "the plan is off the GPU run by more than 15%"
    ;;
*)
    fail "mode '$MODE': expected sim or cuda"
    ;;
esac
echo "plan_calibrate_device_test $MODE: ok"
