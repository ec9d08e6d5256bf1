#!/bin/bash
# The checks of a session on a GPU machine, in one go: run from the
# project's root after the build, as
#
#   bash .gpu/build.sh && . .gpu/env.sh && bash scripts/gpu-check.sh
#
# Parts, each under its own time limit (at most 7.5 minutes in all), each run
# whatever the one before gave:
#   1. nvidia-smi;
#   2. the cuda backend's conformance (every op against the CPU kernels),
#      verbose, into $OUT/conformance.log;
#   3. ctest on everything about the GPU, the cuda backend, NCCL and the
#      compute backends, into $OUT/ctest.log (failures' output included);
#   4. scripts/bench-gpu.sh --quick: a few steps of GPT-2 124M in bf16,
#      with the GPU's measured product peak, into $OUT/bench-quick.*;
# and a summary table of what passed, failed or was skipped.
#   env: OUT (the device tool's folder; default gpu-check-out), BUILD=build-gpu,
#        CTEST_JOBS=8, CTEST_REGEX='cuda|nccl|gpu|compute', and each part's
#        limit in seconds: CONFORMANCE_S=60, CTEST_S=240, BENCH_S=110
set -u
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-gpu-check-out}
BUILD=${BUILD:-build-gpu}
mkdir -p "$OUT"
CONFORMANCE_S=${CONFORMANCE_S:-60}
CTEST_S=${CTEST_S:-240}
BENCH_S=${BENCH_S:-110}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export LOOM_PLUGIN_PATH="$PWD/$BUILD/lib/loom"
START=$SECONDS
SUMMARY=()

# note PART STATUS SECONDS DETAIL: a row of the summary
note() { SUMMARY+=("$(printf '%-13s %-9s %7s  %s' "$1" "$2" "$3" "$4")"); }

# outcome STATUS: ok, FAILED (status) or TIMED OUT
outcome() {
    case "$1" in
    0) echo ok ;;
    124 | 137) echo "TIMED-OUT" ;;
    *) echo "FAILED($1)" ;;
    esac
}

echo "== gpu-check: $(date -u '+%F %T') UTC, loom $(git rev-parse --short HEAD 2>/dev/null || echo '?')"

# ---- 1. the GPU
t=$SECONDS
timeout -k 5 20 nvidia-smi 2>&1 | tee "$OUT/nvidia-smi.txt"
status=${PIPESTATUS[0]}
gpu=$(timeout 10 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)
note nvidia-smi "$(outcome "$status")" $((SECONDS - t)) "${gpu:-no GPU seen}"

# ---- 2. conformance of every op
t=$SECONDS
echo "== conformance (limit ${CONFORMANCE_S}s): $OUT/conformance.log"
plugin=$BUILD/lib/loom/libloom-compute-cuda.so
if [ ! -f "$plugin" ] || [ ! -x "$BUILD/bin/compute_conformance" ]; then
    echo "not built: $plugin or $BUILD/bin/compute_conformance" | tee "$OUT/conformance.log"
    status=1
else
    timeout -k 5 "$CONFORMANCE_S" sh tests/compute/cuda_conformance_test.sh \
        "$BUILD/bin/compute_conformance" "$plugin" > "$OUT/conformance.log" 2>&1
    status=$?
fi
grep -E '^(FAIL|backend:|cuda_conformance_test:)' "$OUT/conformance.log" | head -30
detail=$(grep -E '^cuda_conformance_test:' "$OUT/conformance.log" | tail -1)
[ "$status" = 0 ] || detail="$(grep -c '^FAIL' "$OUT/conformance.log") FAIL lines; first: $(grep -m1 '^FAIL' "$OUT/conformance.log")"
note conformance "$(outcome "$status")" $((SECONDS - t)) "${detail#cuda_conformance_test: }"

# ---- 3. the tests
t=$SECONDS
REGEX=${CTEST_REGEX:-cuda|nccl|gpu|compute}
echo "== ctest -R '$REGEX' (limit ${CTEST_S}s): $OUT/ctest.log"
# --stop-time shortens each test's own timeout so that the run ends in
# time; timeout is the backstop. A test that PROCESSORS 2 marks counts twice
# against -j, so -j8 runs four of them at once on the 16 cores.
stop=$(date -d "+$((CTEST_S - 15)) seconds" +%H:%M:%S)
timeout -k 10 "$CTEST_S" ctest --test-dir "$BUILD" -R "$REGEX" --output-on-failure \
    -j "${CTEST_JOBS:-8}" --timeout 240 --stop-time "$stop" > "$OUT/ctest.log" 2>&1
status=$?
grep -E 'Test +#[0-9]+: .*(Failed|Timeout|Exception|Not Run|\*\*\*)' "$OUT/ctest.log" | grep -v Skipped
grep -E 'tests passed|tests failed' "$OUT/ctest.log"
total=$(grep -cE 'Test +#[0-9]+: ' "$OUT/ctest.log")
passed=$(grep -cE 'Test +#[0-9]+: .* Passed' "$OUT/ctest.log")
skipped=$(grep -cE 'Test +#[0-9]+: .*Skipped' "$OUT/ctest.log")
failed_names=$(grep -E 'Test +#[0-9]+: ' "$OUT/ctest.log" | grep -vE ' Passed|Skipped' |
    sed 's/.*Test \+#[0-9]\+: \([^ ]*\) .*/\1/' | tr '\n' ' ')
failed=$((total - passed - skipped))
note ctest "$(outcome "$status")" $((SECONDS - t)) \
    "$total run: $passed passed, $failed failed, $skipped skipped${failed_names:+: $failed_names}"

# ---- 4. a short benchmark
t=$SECONDS
echo "== bench-gpu.sh --quick (limit ${BENCH_S}s): $OUT/bench-quick.log"
timeout -k 10 "$BENCH_S" env KEEP="$OUT/bench-quick" BUILD="$BUILD" sh scripts/bench-gpu.sh --quick \
    > "$OUT/bench-quick.md" 2> "$OUT/bench-quick.log"
status=$?
cat "$OUT/bench-quick.md"
[ "$status" = 0 ] || tail -15 "$OUT/bench-quick.log"
row=$(grep '^| loom ' "$OUT/bench-quick.md" | head -1 | cut -d'|' -f4-8,10 | tr -s ' ')
note "bench --quick" "$(outcome "$status")" $((SECONDS - t)) "${row:-no loom row: see bench-quick.log}"

# ---- summary
echo
echo "== gpu-check summary ($((SECONDS - START)) s; logs in $OUT)"
printf '%-13s %-9s %7s  %s\n' part result seconds detail
for row in "${SUMMARY[@]}"; do
    echo "$row"
done
