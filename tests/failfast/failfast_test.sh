#!/bin/sh
# A rank that stops (SIGSTOP: it never closes anything) or dies (kill -9)
# in the middle of `loom train`: every other rank ends within
# comm.timeout_s + 5 s of that moment, names the rank, and says nothing of
# the bootstrap store or of UCX's request pools.
#   usage: failfast_test.sh LOOM SOURCE_DIR BACKEND RANKS HOW
#     HOW  stop   the last rank stops, under one `loom launch -n RANKS`
#          stop0  rank 0 stops, and with it what it serves the others
#          kill   the last rank is killed; each rank runs under its own
#                 launcher (--nnodes RANKS on this machine), so no launcher
#                 stops the survivors for it: they must notice by themselves
set -u
LOOM=$1
SRC=$2
BACKEND=$3
RANKS=$4
HOW=$5
TIMEOUT=6
BOUND=$((TIMEOUT + 5))
TEST="failfast_test $BACKEND -n $RANKS $HOW"
TMP=$(mktemp -d)
cd "$TMP" || exit 1

LAUNCHERS=""
VICTIM_PID=""
cleanup() {
    [ -n "$VICTIM_PID" ] && kill -CONT "$VICTIM_PID" 2>/dev/null
    for p in $VICTIM_PID $LAUNCHERS; do kill -KILL "$p" 2>/dev/null; done
    wait 2>/dev/null
    cd / && rm -rf "$TMP"
}
trap cleanup EXIT
fail() {
    for f in *.log; do echo "--- $f"; cat "$f"; done
    echo "$TEST: FAILED: $*"
    exit 1
}
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }
# gone PID: the process has ended (a zombie not yet reaped counts)
gone() { [ ! -e "/proc/$1" ] || [ "$(sed 's/.*) \(.\).*/\1/' "/proc/$1/stat" 2>/dev/null)" = Z ]; }

# Each rank writes its pid, then becomes `loom train` under that pid.
TRAIN="echo \$\$ > pid.\$LOOM_RANK.tmp && mv pid.\$LOOM_RANK.tmp pid.\$LOOM_RANK && exec \"$LOOM\" train \
\"$SRC/tests/zero/tiny.cfg\" --set data.train=\"$SRC/examples/data/corpus.bin\" \
--set parallel.dp.size=$RANKS --set comm.default=$BACKEND --set comm.timeout_s=$TIMEOUT \
--set train.steps=100000"

case "$HOW" in
stop | stop0)
    "$LOOM" launch --timeout 120 -n "$RANKS" -- sh -c "$TRAIN" > node0.log 2>&1 &
    LAUNCHERS=$!
    SIG=STOP
    VICTIM=$((RANKS - 1))
    [ "$HOW" = stop0 ] && VICTIM=0
    ;;
kill)
    port=$((20000 + $$ % 10000))
    k=0
    while [ $k -lt "$RANKS" ]; do
        "$LOOM" launch --timeout 120 --bind none --nnodes "$RANKS" --node-rank $k \
            --master "127.0.0.1:$port" -n 1 -- sh -c "$TRAIN" > node$k.log 2>&1 &
        LAUNCHERS="$LAUNCHERS $!"
        k=$((k + 1))
    done
    SIG=KILL
    VICTIM=$((RANKS - 1))
    ;;
*)
    echo "$TEST: unknown case $HOW"
    exit 2
    ;;
esac

# Training is under way once rank 0 has logged its fifth step.
n=0
until grep -q "step *5/" node0.log 2>/dev/null; do
    n=$((n + 1))
    [ $n -le 600 ] || fail "rank 0 did not reach step 5 within 60 s"
    sleep 0.1
done
r=0
while [ $r -lt "$RANKS" ]; do
    [ -s pid.$r ] || fail "rank $r did not write its pid"
    r=$((r + 1))
done
VICTIM_PID=$(cat pid.$VICTIM)
t0=$(now)
kill -$SIG "$VICTIM_PID"

# Poll the survivors and their launchers until all have ended, noting when
# each did; give up well past the bound so that a hang fails, not times out.
watch=""
r=0
while [ $r -lt "$RANKS" ]; do
    [ $r = "$VICTIM" ] || watch="$watch rank$r:$(cat pid.$r)"
    r=$((r + 1))
done
k=0
for p in $LAUNCHERS; do
    [ "$HOW" = kill ] && [ $k = "$VICTIM" ] || watch="$watch launcher$k:$p"
    k=$((k + 1))
done
ended=""
left=$watch
while [ -n "$left" ]; do
    still=""
    for w in $left; do
        if gone "${w#*:}"; then
            ended="$ended ${w%%:*}:$(since "$t0" "$(now)")"
        else
            still="$still $w"
        fi
    done
    left=$still
    if [ -n "$left" ] && [ "$(since "$t0" "$(now)" | cut -d. -f1)" -ge $((BOUND + 20)) ]; then
        fail "still running $((BOUND + 20)) s after rank $VICTIM got SIG$SIG:$left"
    fi
    sleep 0.05
done
for p in $LAUNCHERS; do wait "$p"; done
kill -CONT "$VICTIM_PID" 2>/dev/null

echo "$TEST: after rank $VICTIM got SIG$SIG, ended (s):$ended; bound $BOUND s"
for e in $ended; do
    awk -v t="${e#*:}" -v b=$BOUND 'BEGIN { exit !(t < b) }' ||
        fail "${e%%:*} ended ${e#*:} s after rank $VICTIM got SIG$SIG, not within comm.timeout_s + 5 = $BOUND s"
done

# A survivor (the first to fail; the launcher may stop the others) says
# which rank failed it, in words about ranks.
if [ "$HOW" = stop0 ]; then
    grep -q "^\[[1-9][0-9]*\] loom train: .*rank 0 does not answer" node*.log ||
        fail "no rank says that rank 0 stopped answering"
else
    grep -q "^\[[0-9]*\] loom train: .*rank $VICTIM\b.*\(did not arrive\|failed\)" node*.log ||
        fail "no rank names rank $VICTIM"
fi
if grep -i "store\|bootstrap" node*.log; then
    fail "the bootstrap store is named to the user"
fi
if grep "was not returned to mpool" node*.log; then
    fail "UCX's request-leak warning after a failed peer is shown"
fi
echo "$TEST: ok"
