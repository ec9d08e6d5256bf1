#!/bin/sh
# `loom launch`'s flight-recorder diagnosis of real training jobs.
#   usage: flight_test.sh LOOM SOURCE_DIR CASE
# stopped_mpi, stopped_ucx: rank 2 of 3 stops itself (SIGSTOP) after step 3;
#   the launcher names it, the op it is past and the op the others wait in,
#   numbered one after the other.
# stopped_rank0: the same with rank 0, the one that serves the bootstrap
#   store: named, by the launcher and by the ranks.
# sigusr1: SIGUSR1 to the launcher and to a rank of a healthy job shows
#   the last operations and changes nothing: the same losses, exit 0.
set -eu
LOOM=$1
SRC=$2
CASE=$3
CFG=$SRC/tests/train/tiny.cfg
DATA=$SRC/examples/data/corpus.bin
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cd "$TMP"
# the launcher's tables go here, so the test sees that it removes them
mkdir tmpdir
export TMPDIR="$TMP/tmpdir"

fail() {
    echo "flight_test $CASE: FAILED: $*"
    echo "--- output"
    cat out 2>/dev/null || true
    exit 1
}

# train RUN_NAME [--set ...]: 3 ranks of ddp in the background, launcher
# output in out; $launcher is its pid. STOP_RANK stops itself after step 3.
train() {
    name=$1; shift
    "$LOOM" launch -n 3 -- sh -c 'if [ "$LOOM_RANK" = "$STOP_RANK" ]; then export LOOM_STOP_AFTER_STEP=3; fi; exec "$@"' \
        sh "$LOOM" train "$CFG" --set data.train="$DATA" --set parallel.dp.size=3 \
        --metrics "$name.jsonl" "$@" > out 2>&1 &
    launcher=$!
}

# (Open MPI's own session folder is not the launcher's to remove)
left_nothing() {
    if ls "$TMPDIR" | grep -q '^loom-launch-'; then fail "left in TMPDIR: $(ls "$TMPDIR")"; fi
}

stopped() {
    victim=$1 backend=$2
    export STOP_RANK=$victim
    start=$(date +%s)
    train stopped --set train.steps=1000 --set comm.timeout_s=3 --set comm.default="$backend"
    rc=0
    wait "$launcher" || rc=$?
    took=$(( $(date +%s) - start ))
    [ $rc -ne 0 ] || fail "the launcher exited 0"
    [ $took -le 60 ] || fail "took $took s"
    others=$(echo "0 1 2" | tr ' ' '\n' | grep -vx "$victim" | paste -sd, - | sed 's/,/, /')
    line=$(grep "^loom launch: rank $victim (stopped)" out) || fail "no diagnosis naming rank $victim"
    # "rank 2 (stopped) is after dp allreduce #13 (step 3, loss); ranks 0, 1 wait in dp allreduce #14 for 3.012 s"
    echo "$line" | grep -Eq "^loom launch: rank $victim \(stopped\) is after dp allreduce #[0-9]+ \(step 3, loss\); ranks $others wait in dp allreduce #[0-9]+ for [0-9.]+ m?s$" ||
        fail "diagnosis not as expected: $line"
    after=$(echo "$line" | sed 's/.*is after dp allreduce #\([0-9]*\).*/\1/')
    waits=$(echo "$line" | sed 's/.*wait in dp allreduce #\([0-9]*\).*/\1/')
    [ "$waits" = $((after + 1)) ] || fail "rank $victim is after #$after, the others wait in #$waits"
    grep -q "^loom launch: -v or --flight FILE shows each rank's last operations$" out ||
        fail "no hint at the details"
    left_nothing
    echo "flight_test $CASE: $line (exit $rc after $took s)"
}

case "$CASE" in
stopped_mpi)
    stopped 2 mpi ;;
stopped_ucx)
    stopped 2 ucx ;;
stopped_rank0)
    stopped 0 mpi
    # the ranks that timed out name rank 0 too
    grep -q "rank 0 does not answer (the ranks report to it while they wait): it is stopped, hung or gone" out ||
        fail "no rank named rank 0"
    if grep -q "unreachable" out; then fail "rank 0 reported as unreachable"; fi ;;
sigusr1)
    export STOP_RANK=none
    "$LOOM" launch -n 3 -- "$LOOM" train "$CFG" --set data.train="$DATA" --set parallel.dp.size=3 \
        --set train.steps=60 --metrics quiet.jsonl > quiet.out 2>&1 || { cat quiet.out; fail "the quiet run failed"; }
    train signalled --set train.steps=60
    # rank 1 is the launcher's child with LOOM_RANK=1 (other tests may train
    # the same config at the same time) that runs loom (Open MPI's daemons of
    # a singleton are reparented to the launcher, with the rank's environment,
    # and forward SIGUSR1 elsewhere), found before it trains: on a fast
    # machine the 60 steps take half a second, and a rank that has finished
    # them has no recorder left to dump
    loom_exe=$(readlink -f "$LOOM")
    i=0
    rank1=""
    until [ -n "$rank1" ]; do
        for p in $(pgrep -P "$launcher"); do
            [ "$(readlink /proc/$p/exe 2>/dev/null)" = "$loom_exe" ] &&
                tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx LOOM_RANK=1 && rank1=$p
        done
        sleep 0.05; i=$((i + 1)); [ $i -lt 1200 ] || fail "rank 1 not found"
    done
    until [ "$({ wc -l < signalled.jsonl; } 2>/dev/null || echo 0)" -ge 2 ]; do
        sleep 0.05; i=$((i + 1)); [ $i -lt 1200 ] || fail "training never started"
    done
    caught=$(awk '/^SigCgt:/ { print $2 }' /proc/$rank1/status)
    [ $(( (0x$caught >> 9) & 1 )) = 1 ] || fail "rank 1 does not catch SIGUSR1 (SigCgt $caught)"
    signalled="pid $rank1: $(tr '\0' ' ' < /proc/$rank1/cmdline 2>/dev/null), SigCgt $caught"
    kill -USR1 "$rank1"
    kill -USR1 "$launcher"
    wait "$launcher" || fail "the signalled job failed"
    [ "$(wc -l < signalled.jsonl)" = 60 ] || fail "the signalled job did not finish its 60 steps"
    sed 's/.*"loss": \([^,]*\),.*/\1/' quiet.jsonl > a.txt
    sed 's/.*"loss": \([^,]*\),.*/\1/' signalled.jsonl > b.txt
    cmp -s a.txt b.txt || fail "the losses changed: $(paste a.txt b.txt | head -5)"
    # the launcher's report: a line, then every rank's last operations
    grep -Eq "^loom launch: (no rank waits on another|.* waits? in dp allreduce #[0-9]+ for .*)$" out ||
        fail "no diagnosis line on SIGUSR1"
    for r in 0 1 2; do
        grep -Eq "^rank $r \(pid [0-9]+, running\):$" out || fail "no details of rank $r"
    done
    grep -Eq "^  dp \(mpi, rank 2 of 3\): [0-9]+ operations, the last 8:$" out || fail "no dp ring of rank 2"
    grep -Eq "^    allreduce #[0-9]+, [0-9]+ B: completed after [0-9.]+ m?s, posted [0-9.]+ m?s ago; step [0-9]+, " out ||
        fail "no completed op in the details"
    # rank 1's own dump, through its stderr
    grep -Eq "^\[1\] flight recorder of rank 1 \(pid $rank1\), on SIGUSR1:$" out ||
        fail "rank 1 did not dump (signalled $signalled; the launcher says $(grep -o '^rank 1 (pid [0-9]*' out))"
    grep -Eq "^\[1\]   dp \(mpi, rank 1 of 3\): [0-9]+ operations, the last 8:$" out || fail "rank 1's dump has no dp ring"
    left_nothing
    echo "flight_test $CASE: both dumps shown, 60 steps with the quiet run's losses" ;;
*)
    echo "flight_test: unknown case $CASE"; exit 2 ;;
esac
