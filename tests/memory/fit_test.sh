#!/bin/sh
# loom train checks the plan's peak against the machine before allocating:
#   usage: fit_test.sh LOOM ROOM_TEST SOURCE_DIR
# 1. a model no machine holds is refused at once with the figures, on one
#    rank and on two (both stopping in rank 0's words);
# 2. one whose activations overflow this machine is refused, naming
#    train.recompute = "block" as a setting that would fit (the batch is
#    sized from this machine's room, so the verdict is the same anywhere);
# 3. in a memory cgroup of 2 GiB (where this machine lets the test make one),
#    a 6 GiB model is refused naming the cgroup, where it used to be
#    OOM-killed with no word.
set -eu
LOOM=$1
ROOM_TEST=$2
SRC=$3
CFG=$SRC/tests/train/tiny.cfg
DATA=$SRC/examples/data/corpus.bin
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"; [ -z "${CG:-}" ] || rmdir "$CG" 2>/dev/null || true' EXIT
fail() { echo "fit_test: FAILED: $*"; cat "$TMP/out" 2>/dev/null; exit 1; }

train() {
    rc=0
    timeout 120 "$LOOM" train "$CFG" --set data.train="$DATA" --set train.steps=1 "$@" > "$TMP/out" 2>&1 || rc=$?
    [ $rc -ne 0 ] || fail "the run was not refused"
    # 78: a configuration error, which loom launch does not restart
    [ $rc -eq 78 ] || fail "the run ended with status $rc, not 78 (killed, or a failure a restart could cure)"
}

train --set model.layers=100000
grep -Eq "^loom train: memory: this job needs [0-9.]+ GiB of host memory at its peak on this machine \(1 rank here; the largest holds params .*, activations .*, as \`loom plan\` predicts\), but only .* is free \(.*\); no single setting makes it fit" "$TMP/out" ||
    fail "no refusal with the figures"
echo "fit_test: $(cat "$TMP/out")"

# the ranks of a machine count together, and every rank stops at once in
# rank 0's words (none waits in a collective); the launcher exits 78
rc=0
timeout 120 "$LOOM" launch -n 2 -- "$LOOM" train "$CFG" --set data.train="$DATA" --set train.steps=1 \
    --set parallel.dp.size=2 --set comm.timeout_s=3600 --set model.layers=100000 > "$TMP/out" 2>&1 || rc=$?
[ $rc -eq 78 ] || fail "2 ranks: the launcher exited $rc, not 78"
for r in 0 1; do
    grep -q "^\[$r\] loom train: rank 0 cannot start: memory: this job needs .* (2 ranks here; " "$TMP/out" ||
        fail "rank $r does not stop with rank 0's words"
done

# 2. each sequence of this shape holds 2.02 GiB of activations, 0.125 GiB
#    with recomputation (loom plan); the batch overflows the room twice over
room=$("$ROOM_TEST" | sed -n 's/^note this machine: \([0-9]*\) bytes.*/\1/p')
[ -n "$room" ] || fail "room_test did not say this machine's room"
gib=$((room / 1073741824))
batch=$((gib / 2 + 2))
if [ $((batch / 8)) -lt $((gib * 8 / 10)) ]; then
    train --set model.layers=2000 --set model.heads=4 --set model.channels=16 --set train.seq=1024 \
        --set model.max_seq=1024 --set train.batch=$batch
    grep -q 'it would fit with train.recompute = "block" (' "$TMP/out" || fail "recomputation not offered"
    echo "fit_test: batch $batch: $(cat "$TMP/out")"
else
    echo "fit_test: note: this machine's room ($gib GiB) is too small for the recomputation case"
fi

# 3. a 2 GiB memory cgroup, v1 or v2, below this process's own
CG=""
v1=$(sed -n 's/^[0-9]*:[^:]*memory[^:]*:\(.*\)/\1/p' /proc/self/cgroup)
mnt=$(awk '$9 == "cgroup" && $NF ~ /memory/ { print $5; exit }' /proc/self/mountinfo 2>/dev/null || true)
if [ -n "$v1" ] && [ -n "$mnt" ] && mkdir "$mnt${v1%/}/loom-fit-$$" 2>/dev/null; then
    CG="$mnt${v1%/}/loom-fit-$$"
    echo 2147483648 > "$CG/memory.limit_in_bytes" || CG=""
fi
if [ -n "$CG" ]; then
    rc=0
    sh -c "echo \$\$ > '$CG/cgroup.procs' && exec timeout 120 '$LOOM' train '$CFG' --set data.train='$DATA' \
        --set train.steps=1 --set model.channels=4096 --set model.heads=32" > "$TMP/out" 2>&1 || rc=$?
    [ $rc -eq 78 ] || fail "in a 2 GiB cgroup the run ended with status $rc, not 78"
    grep -q "but only .* is free (the memory cgroup .*/loom-fit-$$ (v1): memory.limit_in_bytes 2.00 GiB" "$TMP/out" ||
        fail "the cgroup was not named"
    echo "fit_test: $(cat "$TMP/out")"
else
    echo "fit_test: note: no memory cgroup could be made here (needs root and cgroup v1's memory hierarchy); part 3 not run"
fi
echo "fit_test: passed"
