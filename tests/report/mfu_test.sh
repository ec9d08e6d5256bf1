#!/bin/sh
# A step that runs faster than the peak MFU is measured against: no MFU above
# 100% is printed or written, and a line says why.
#   given  train.peak_gflops far below the machine's: MFU is n/a from step 1,
#          in the progress lines and as null in --metrics
#   busy   a peak measured at start on a busy machine (LOOM_PEAK_SCALE, the
#          testing aid, scales the measurement down): measured again, and MFU
#          against the new peak, or n/a if the step beats that too
#   usage: mfu_test.sh LOOM SOURCE_DIR CASE
set -eu
LOOM=$1
SRC=$2
CASE=$3
CFG=$SRC/tests/train/tiny.cfg
DATA=$SRC/examples/data/corpus.bin
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cd "$TMP"

fail() { echo "mfu_test: $*"; exit 1; }

train() {
    "$LOOM" train "$CFG" --set data.train="$DATA" --set train.steps=4 --metrics m.json "$@" \
        > train.log 2>&1 || { cat train.log; fail "training failed: $*"; }
    cat train.log
}

# Every MFU printed is at most 100%, every one written at most 1 (or null).
at_most_100() {
    [ "$(grep -c '^step ' train.log)" = 4 ] || fail "not 4 step lines"
    grep -o 'MFU *[0-9.]*%' train.log | tr -d 'MFU %' | awk '$1 > 100 { bad = 1 } END { exit bad }' ||
        fail "an MFU above 100% printed"
    grep -o '"mfu": [^,]*' m.json | sed 's/"mfu": //' |
        awk '$1 != "null" && $1 > 1 { bad = 1 } END { exit bad }' || fail "an MFU above 1 written"
    [ "$(grep -c '"mfu": ' m.json)" = 4 ] || fail "not 4 metrics lines with mfu"
}

case "$CASE" in
given)
    train --set train.peak_gflops=0.001
    at_most_100
    grep -q '^MFU n/a from step 1: it ran at [0-9.e+]* GFLOP/s per rank, above the peak of 0.001 (train.peak_gflops); set train.peak_gflops to this machine' train.log ||
        fail "no line saying why MFU is n/a"
    [ "$(grep -c '| MFU    n/a |' train.log)" = 4 ] || fail "not every step's MFU is n/a"
    [ "$(grep -c '"mfu": null' m.json)" = 4 ] || fail "not every metrics mfu is null"
    echo "mfu: a given peak below the steps' rate gives MFU n/a, and says why" ;;
busy)
    LOOM_PEAK_SCALE=0.000001 train
    at_most_100
    grep -q 'MFU against [0-9.]* GFLOP/s per rank (.*measured at start on' train.log ||
        fail "the header does not name the measured peak"
    # measured again: MFU against the new peak; the step beating that too (a
    # machine busy again) gives n/a: either way the line says so
    if grep -q '^MFU: step 1 ran at .* above the peak measured at start (.*, while the machine was busy); measured again: .* GFLOP/s per rank from this step on$' train.log; then
        ! grep -q 'MFU    n/a' train.log || fail "n/a after a good second measurement"
    else
        grep -q '^MFU n/a from step 1: .*measured at start on .*, and measured again); ' train.log ||
            fail "neither measured again nor n/a"
    fi
    echo "mfu: a peak measured on a busy machine is measured again" ;;
*)
    fail "unknown case $CASE" ;;
esac
