#!/bin/sh
# `loom launch --max-restarts`: kill -9 a random rank at random moments
# (checkpoints included) ROUNDS times; every restart resumes from the latest
# complete checkpoint of its own run (never from another run's later one in
# the same directory, train.checkpoint_overwrite), and the job ends with the
# uninterrupted run's final weights and last loss, bit for bit, no process
# left behind and nothing left in TMPDIR.
#   usage: restart_test.sh LOOM SOURCE_DIR [ROUNDS]
set -eu
LOOM=$1
SRC=$2
ROUNDS=${3:-20}
CFG=$SRC/tests/zero/tiny.cfg
DATA=$SRC/examples/data/corpus.bin
TMP=$(mktemp -d)
JOB=""
cleanup() {
    [ -z "$JOB" ] || kill -9 "$JOB" 2>/dev/null || true
    rm -rf "$TMP"
}
trap cleanup EXIT
cd "$TMP"
mkdir tmp
export TMPDIR="$TMP/tmp"
TEST="restart_test"
fail() { echo "$TEST: $*"; exit 1; }

# 2 ranks of zero3, a checkpoint every 10 of 300 steps (a few ms each)
SETS="--set data.train=$DATA --set parallel.dp.size=2 --set parallel.dp.strategy=zero3 \
      --set train.steps=300 --set train.checkpoint_every=10 --set train.peak_gflops=100"
# shellcheck disable=SC2086
"$LOOM" launch -n 2 -- "$LOOM" train "$CFG" $SETS --set train.checkpoint_dir=whole \
    --save whole.bin --metrics whole.jsonl > whole.log 2>&1 || { cat whole.log; fail "the uninterrupted run failed"; }

# another run's step-300 (another learning rate) where the job writes: a
# restart that took it would end at once with other weights
# shellcheck disable=SC2086
"$LOOM" launch -n 2 -- "$LOOM" train "$CFG" $SETS --set train.lr=3e-3 --set train.checkpoint_dir=killed \
    > other.log 2>&1 || { cat other.log; fail "the other run failed"; }
# shellcheck disable=SC2086
"$LOOM" launch -n 2 --max-restarts "$ROUNDS" -- "$LOOM" train "$CFG" $SETS \
    --set train.checkpoint_dir=killed --set train.checkpoint_overwrite=true --save killed.bin \
    --metrics killed.jsonl > killed.log 2>&1 &
JOB=$!
kills=0
saves() { grep -c "saved killed/step-" killed.log || true; }
while [ "$kills" -lt "$ROUNDS" ] && kill -0 "$JOB" 2>/dev/null; do
    # after the next checkpoint (so the job moves on), a random moment
    # of the next 0 to 90 ms: within a checkpoint now and then
    seen=$(saves)
    while [ "$(saves)" = "$seen" ] && kill -0 "$JOB" 2>/dev/null; do sleep 0.02; done
    sleep "0.0$(( $(od -An -N2 -tu2 /dev/urandom) % 10 ))"
    ranks=$(pgrep -P "$JOB" || true)
    [ -n "$ranks" ] || continue
    victim=$(echo "$ranks" | shuf -n 1)
    kill -9 "$victim" 2>/dev/null && kills=$((kills + 1))
    # wait for the restart to have both ranks up again
    for i in $(seq 1 100); do
        [ "$(pgrep -P "$JOB" | wc -l)" -ge 2 ] || ! kill -0 "$JOB" 2>/dev/null && break
        sleep 0.05
    done
done
wait "$JOB" || { tail -n 30 killed.log; fail "the job with restarts failed"; }
JOB=""
restarts=$(grep -c "loom launch: restart" killed.log || true)
echo "$kills kills, $restarts restarts"
[ "$restarts" -ge 1 ] || { cat killed.log; fail "no restart happened"; }
grep -q "resuming from killed/step-" killed.log || { cat killed.log; fail "no restart resumed from a checkpoint"; }
grep -q "train.checkpoint_overwrite = true: 'killed' holds step-300 of another run" killed.log ||
    { cat killed.log; fail "the other run's step-300 was not noticed"; }
cmp -s whole.bin killed.bin || fail "the final weights differ from the uninterrupted run's"
last() { grep '"step": 300,' "$1" | tail -n 1 | sed 's/.*"loss": \([^,]*\),.*/\1/'; }
[ "$(last whole.jsonl)" = "$(last killed.jsonl)" ] || fail "the last loss differs: $(last whole.jsonl) vs $(last killed.jsonl)"
echo "final weights and the last loss equal the uninterrupted run's"
# a restart that finds the last step checkpointed (a rank killed after it)
# has nothing left to train: it ends well, with the same weights
# shellcheck disable=SC2086
LOOM_RESTART=1 "$LOOM" train "$CFG" $SETS --set parallel.dp.size=1 --set train.checkpoint_dir=killed \
    --save again.bin > again.log 2>&1 || { cat again.log; fail "a restart after the last step failed"; }
grep -q "restart 1: resuming from killed/step-300" again.log || { cat again.log; fail "no resume from step 300"; }
cmp -s whole.bin again.bin || fail "a restart after the last step saves other weights"
# nothing left behind
sleep 0.5
if pgrep -f "$TMP" > /dev/null; then
    pgrep -af "$TMP"
    fail "processes of the job are still running"
fi
[ -z "$(ls -A "$TMPDIR")" ] || { ls -la "$TMPDIR"; fail "files left in TMPDIR"; }
echo "$TEST: ok"
