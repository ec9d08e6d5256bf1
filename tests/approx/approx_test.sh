#!/bin/sh
# A data strategy whose replicas differ on purpose (LOOM_STRATEGY_APPROXIMATE)
# and each rank's own state in checkpoints (data_replica_state).
#   usage: approx_test.sh LOOM SOURCE_DIR CASE LOCALSGD UNDECLARED APPROXIMATE_TP
#   CASE: accepted | resume.np2 | resume.np3 | remesh | records
set -eu
LOOM=$1
SRC=$2
CASE=$3
LOCALSGD=$4
UNDECLARED=$5
APPROXIMATE_TP=$6
DATA=$SRC/examples/data/corpus.bin
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cd "$TMP"
sed "s|strategy = \"ddp\"; bucket_mb = 0.1;|strategy = \"$LOCALSGD\";|" \
    "$SRC/tests/ckpt/tiny.cfg" > localsgd.cfg
CFG=$TMP/localsgd.cfg

TEST=approx_test
. "$SRC/tests/common/train_runs.sh"

fail() { echo "$TEST: $*"; exit 1; }

# resumes RANKS [--set ...]: 6 steps with a checkpoint every 2 (written
# as the settings say), then a resume from step 2's to step 6: steps 3-6 as
# the uninterrupted run's, bit for bit
resumes() {
    ranks=$1; shift
    run whole "$ranks" --set train.steps=6 --set train.checkpoint_every=2 \
        --set train.checkpoint_dir="$TMP/ck" --set train.keep_checkpoints=0 "$@"
    set -- "$ranks"
    grep -q "localsgd over $1 ranks, never synchronised (approximate)" whole.log ||
        { cat whole.log; fail "the header does not say the run is approximate"; }
    [ -d ck/step-2 ] || { ls ck; fail "no checkpoint of step 2"; }
    "$LOOM" ckpt info ck/step-2 > info.log 2>&1 || { cat info.log; fail "loom ckpt info ck/step-2"; }
    [ "$(grep -c "replica records of dp rank" info.log)" = "$1" ] ||
        { cat info.log; fail "ckpt info does not count $1 ranks' replica records"; }
    run resumed "$1" --set train.steps=6 --resume "$TMP/ck/step-2"
    if grep -q "starts from the shared state" resumed.log; then
        cat resumed.log; fail "a resume at the same mesh dropped the replicas' own state"
    fi
    step_fields whole | tail -n 4 > w.txt
    step_fields resumed > r.txt
    [ "$(wc -l < r.txt)" = 4 ] || { cat resumed.log; fail "the resume ran $(wc -l < r.txt) steps, want 4"; }
    cmp -s w.txt r.txt || { paste -d '\n' w.txt r.txt; fail "the resume differs from steps 3-6 of the uninterrupted run"; }
    # without the replicas' own state the resume is not the same run: the test can fail
    run shared "$1" --set train.steps=6 --resume "$TMP/ck/step-2" --set parallel.dp.strategy=ddp
    step_fields shared > s.txt
    ! cmp -s w.txt s.txt || fail "ddp from the same checkpoint matched localsgd: the test proves nothing"
    echo "$TEST: resume at $1 ranks: steps 3-6 identical to the uninterrupted run"
}

case "$CASE" in
accepted)
    # accepted at dp 2 without a gradient average; its norm is each rank's
    # own, different across the ranks, and no check stops it
    run local 2 --set train.steps=4 --metrics "local.rank{rank}.jsonl"
    [ -f local.rank0.jsonl ] && [ -f local.rank1.jsonl ] || fail "no per-rank metrics"
    for r in 0 1; do
        step_fields "local.rank$r" > "norm$r.txt"
    done
    cmp -s norm0.txt norm1.txt || { paste -d '\n' norm0.txt norm1.txt; fail "ranks 0 and 1 report different steps (both must report dp rank 0's norm)"; }
    # the replicas did differ: the loss (the mean over ranks) is not ddp's
    run ddp 2 --set train.steps=4 --set parallel.dp.strategy=ddp
    step_fields ddp > d.txt
    ! cmp -s norm0.txt d.txt || fail "localsgd trained exactly like ddp: the replicas never differed"
    [ "$(losses ddp | head -n 1)" = "$(losses local.rank0 | head -n 1)" ] ||
        fail "step 1 differs from ddp's (both start from the same weights and batches)"
    # the same hooks without the capability are refused as before
    status=0
    "$LOOM" launch -n 2 -- "$LOOM" train "$CFG" --set data.train="$DATA" --set parallel.dp.size=2 \
        --set parallel.dp.strategy="$UNDECLARED" > undeclared.log 2>&1 || status=$?
    [ "$status" != 0 ] || { cat undeclared.log; fail "a strategy without data_grads_ready ran at dp 2"; }
    grep -q "nothing would average the gradients over the dp group" undeclared.log ||
        { cat undeclared.log; fail "the refusal does not say why"; }
    # the capability belongs to the data axis alone
    status=0
    "$LOOM" plugins --check "$APPROXIMATE_TP" > tp.log 2>&1 || status=$?
    [ "$status" != 0 ] || { cat tp.log; fail "a tp strategy declaring LOOM_STRATEGY_APPROXIMATE passed --check"; }
    grep -q "capabilities has LOOM_STRATEGY_APPROXIMATE on a strategy of axis tp" tp.log ||
        { cat tp.log; fail "the refusal of the tp strategy does not say why"; }
    echo "$TEST: localsgd accepted at dp 2, its undeclared twin and an approximate tp refused" ;;
resume.np2)
    resumes 2 ;;
resume.np3)
    # and the replicas' state written by train.checkpoint_async's thread
    resumes 3 --set train.checkpoint_async=true ;;
remesh)
    # the replicas' own state is for 2 dp ranks: a resume at 3 (and at 1)
    # starts every replica from the shared state, says so, and trains
    run whole 2 --set train.steps=4 --set train.checkpoint_every=2 --set train.checkpoint_dir="$TMP/ck"
    for n in 3 1; do
        run "at$n" "$n" --set train.steps=4 --resume "$TMP/ck/step-2"
        grep -q "the checkpoint holds the replicas' own state for 2 dp ranks; this run has $n: every replica starts from the shared state" "at$n.log" ||
            { cat "at$n.log"; fail "a resume at $n ranks does not say the replicas start from the shared state"; }
        [ "$(wc -l < "at$n.jsonl")" = 2 ] || { cat "at$n.log"; fail "the resume at $n ranks did not train 2 steps"; }
    done
    # a consolidated checkpoint holds no replica state
    "$LOOM" ckpt consolidate ck/step-2 --state whole.state > consolidate.log 2>&1 ||
        { cat consolidate.log; fail "loom ckpt consolidate"; }
    run consolidated 2 --set train.steps=4 --resume "$TMP/whole.state"
    grep -q "holds no replica's own state (consolidated): every replica starts from the shared state" consolidated.log ||
        { cat consolidated.log; fail "a resume from a consolidated file does not say the replicas start from the shared state"; }
    echo "$TEST: resumes at another mesh start from the shared state" ;;
records)
    # the replica records are under the checksum: a byte of the last one
    # changed is caught by `loom ckpt info` and by --resume
    run whole 2 --set train.steps=2 --set train.checkpoint_every=2 --set train.checkpoint_dir="$TMP/ck"
    "$LOOM" ckpt info ck/step-2 > good.log 2>&1 || { cat good.log; fail "ckpt info of a sound checkpoint"; }
    f=ck/step-2/shard-1.loom
    size=$(wc -c < "$f")
    byte=$(od -An -tu1 -j $((size - 5)) -N1 "$f" | tr -d ' ')
    printf "$(printf '\\%03o' $(((byte + 1) % 256)))" |
        dd of="$f" bs=1 seek=$((size - 5)) conv=notrunc 2> /dev/null
    status=0
    "$LOOM" ckpt info ck/step-2 > bad.log 2>&1 || status=$?
    [ "$status" = 1 ] || { cat bad.log; fail "ckpt info of a damaged replica record: status $status, want 1"; }
    grep -q "shard-1.loom" bad.log && grep -q "CRC32C" bad.log ||
        { cat bad.log; fail "the damage is not named (file and checksum)"; }
    status=0
    "$LOOM" launch -n 2 -- "$LOOM" train "$CFG" --set data.train="$DATA" --set parallel.dp.size=2 \
        --set train.steps=4 --resume "$TMP/ck/step-2" > resume.log 2>&1 || status=$?
    [ "$status" != 0 ] && grep -q "CRC32C" resume.log ||
        { cat resume.log; fail "--resume of a damaged replica record was not refused by its checksum"; }
    echo "$TEST: a damaged replica record is caught by the checksum"
    # records that do not fit the strategy's buffers: one line naming the
    # unit, the label and the sizes
    run whole 2 --set train.steps=2 --set train.checkpoint_every=2 --set train.checkpoint_dir="$TMP/ck2"
    for what in RENAME SHORTEN; do
        status=0
        env "LOCALSGD_$what=1" "$LOOM" launch -n 2 -- "$LOOM" train "$CFG" --set data.train="$DATA" \
            --set parallel.dp.size=2 --set train.steps=4 --resume "$TMP/ck2/step-2" > "$what.log" 2>&1 ||
            status=$?
        [ "$status" != 0 ] || { cat "$what.log"; fail "$what: a resume with records that do not fit ran"; }
    done
    grep -q "unit 0 (.*): no replica record 'adam m (renamed)' for rank 0" RENAME.log ||
        { cat RENAME.log; fail "a label missing from the checkpoint is not named"; }
    grep -q "unit 0 (.*): replica record 'adam v' holds [0-9]* bytes, and the strategy's buffer is [0-9]*" SHORTEN.log ||
        { cat SHORTEN.log; fail "a size mismatch is not named"; }
    echo "$TEST: records that do not fit the strategy's buffers are refused, naming unit, label and sizes" ;;
*)
    fail "unknown case $CASE" ;;
esac
