#!/bin/sh
# `loom plugins --check FILE --train CONFIG` end to end.
#   usage: harness_test.sh LOOM SOURCE_DIR CASE PLUGIN
#     pass PLUGIN      every run matches the single-rank run
#     summing PLUGIN   a ddp that sums: dp=1 matches, dp=2 and dp=4 diverge at
#                      step 1, each run on its own line, exit 1
#     frozen PLUGIN    a ddp that leaves each unit's last element untrained:
#                      every run diverges, and the weights name the element
#     settings PLUGIN  zero3 with a setting of its own (HSDP): the reference,
#                      run with ddp, goes without it
#     refusals PLUGIN  bad options, one line each, before any run; a rank
#                      count the config cannot split; a config that fails
set -eu
LOOM=$1
SRC=$2
CASE=$3
PLUGIN=$4
CFG=$SRC/examples/harness.cfg
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cd "$SRC" # harness.cfg's data.train is relative to the repository

fail() { cat "$TMP/out"; echo "harness_test: $*"; exit 1; }
has() { grep -qxF "$1" "$TMP/out" || fail "no line '$1'"; }

# check [ARGS...]: the harness's output in $TMP/out, its status in $status
check() {
    status=0
    "$LOOM" plugins --check "$PLUGIN" --train "$CFG" "$@" > "$TMP/out" 2>&1 || status=$?
}

case "$CASE" in
pass)
    check
    [ "$status" = 0 ] || fail "exit status $status"
    for n in 1 2 4; do
        grep -Eq "^[a-z]{2}=$n: 10 steps, losses match \(worst [^)]*\), grad norms match \(worst [^)]*\), weights match \(worst [^)]* in [a-z0-9.]*\)$" "$TMP/out" ||
            fail "no matching line for $n ranks"
    done
    has "numerics hold at every rank count"
    cat "$TMP/out" ;;
summing)
    # the figures below are of the unshuffled order
    check --set data.shuffle=false
    [ "$status" = 1 ] || fail "exit status $status, want 1"
    grep -q "^dp=1: 10 steps, losses match" "$TMP/out" || fail "one rank should match"
    # Summing over 2 and 4 ranks multiplies the first step's norm by 2 and 4.
    has "dp=2: step 1 grad_norm 5.84827 vs 2.924135 single-rank (relative 1.0e+00 > 0.0001)"
    has "dp=4: step 1 grad_norm 11.69654 vs 2.924135 single-rank (relative 3.0e+00 > 0.0001)"
    has "2 of 3 runs diverge from the single-rank run or fail"
    cat "$TMP/out" ;;
settings)
    check --ranks 4 --set parallel.dp.shard_size=2
    [ "$status" = 0 ] || fail "exit status $status"
    grep -q "^dp=4: 10 steps, losses match" "$TMP/out" || fail "HSDP does not match"
    cat "$TMP/out" ;;
frozen)
    # the figures below are of the unshuffled order
    check --set data.shuffle=false
    [ "$status" = 1 ] || fail "exit status $status, want 1"
    for n in 1 2 4; do
        has "dp=$n: step 2 loss 5.345695 vs 5.345586 single-rank (relative 2.0e-05 > 1e-05)"
    done
    # the worst tensor is the one the bug is about: the block's last
    # element (fcprojb's last) never moved from its initial 0
    # (the last digit of the value depends on the library the products ran on)
    [ "$(grep -c "^  final weights: h\.2\.fcprojb differs, max |diff| 3\.7e-03 at element 63 (0 vs 0\.00369535[0-9] single-rank; 5\.2e-01 of the tensor's scale > 0\.01)" "$TMP/out")" = 3 ] ||
        fail "the weights line does not name h.2.fcprojb element 63 for each run"
    has "3 of 3 runs diverge from the single-rank run or fail"
    cat "$TMP/out" ;;
refusals)
    check --set train.precision=bf16
    [ "$status" = 2 ] || fail "bf16: exit status $status, want 2"
    grep -q "train.precision = bf16; the harness holds runs to fp32's contract" "$TMP/out" ||
        fail "bf16 not refused"
    check --ranks 1,x
    [ "$status" = 2 ] || fail "--ranks 1,x: exit status $status, want 2"
    has "loom plugins: --ranks '1,x': want up to 16 rank counts >= 1 separated by commas, e.g. 1,2,4"
    status=0
    "$LOOM" plugins --check "$PLUGIN" --ranks 2 > "$TMP/out" 2>&1 || status=$?
    [ "$status" = 2 ] || fail "--ranks without --train: exit status $status, want 2"
    has "loom plugins: --ranks, --keep and --timeout go with --train CONFIG"
    # A rank count the config cannot split fails that run, loudly: batch 12
    # over 5 ranks.
    check --ranks 5 --keep "$TMP/runs"
    [ "$status" = 1 ] || fail "dp=5: exit status $status, want 1"
    has "dp=5: the run failed; the end of $TMP/runs/dp5.log:"
    grep -q "train.batch" "$TMP/out" || fail "the failing run's own message is not shown"
    [ -f "$TMP/runs/single.jsonl" ] || fail "--keep kept nothing"
    # A config that cannot train is the config's fault: no run is checked.
    check --set data.train="$TMP/none.bin"
    [ "$status" = 1 ] || fail "no data: exit status $status, want 1"
    has "single-rank reference: the run failed; the end of its output (--keep DIR keeps it all):"
    has "no run checked: the reference itself fails (the config, not the plugin)"
    grep -q "none.bin" "$TMP/out" || fail "the reference's own message is not shown"
    cat "$TMP/out" ;;
*)
    echo "harness_test: unknown case $CASE"; exit 2 ;;
esac
