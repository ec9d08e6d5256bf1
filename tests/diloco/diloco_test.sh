#!/bin/sh
# DiLoCo (parallel.dp.strategy = "diloco") against the single-rank run and
# itself.
#   usage: diloco_test.sh LOOM SOURCE_DIR CASE
#   CASE: one_rank | ranks.np2 | ranks.np3 | ranks.np4 | resume.np2 | resume.np4 | bytes | plan | harness
#   one_rank    outer lr 1 and momentum 0 on one rank: the single-rank run
#               (ddp), within 1e-6 per step, at H = 1, 3 and 4, f32 and bf16
#   ranks.npN   N workers, H = 4: the loss falls, within 5% of the
#               single-rank run's at every step (replicas that differ on
#               purpose stay near it), and the run is deterministic
#   resume.npN  H = 4, a checkpoint every 2 steps: a resume from step 2 (between
#               two syncs) is bitwise the uninterrupted run's steps 3-8
#   bytes       the dp traffic: one all-reduce of the fp32 weights per sync,
#               H times fewer bytes than ddp's gradient all-reduces (fp32)
#   plan        loom plan gives diloco's dp bytes a step as 1/H of ddp's
#   harness     loom plugins --check diloco --train: refused without --tolerance
#               (it declares LOOM_STRATEGY_APPROXIMATE), passes with 0.05 at
#               2 and 3 ranks (H = 4, the plain average: the paper's outer
#               momentum runs ahead of the single-rank run by 6% here)
set -eu
LOOM=$1
SRC=$2
CASE=$3
DATA=$SRC/examples/data/corpus.bin
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cd "$TMP"
sed 's|strategy = "ddp"; bucket_mb = 0.1;|strategy = "diloco";|' \
    "$SRC/tests/ckpt/tiny.cfg" > diloco.cfg
CFG=$TMP/diloco.cfg
TEST=diloco_test
. "$SRC/tests/common/train_runs.sh"

fail() { echo "$TEST: $*"; exit 1; }

# near A B TOL: loss and grad norm of every step within TOL (relative)
near() {
    step_fields "$1" > a.txt
    step_fields "$2" > b.txt
    [ "$(wc -l < a.txt)" = "$(wc -l < b.txt)" ] || fail "$1 and $2 ran different step counts"
    paste -d ' ' a.txt b.txt | tr -d '",' | awk -v tol="$3" -v a="$1" -v b="$2" '
        { for (k = 0; k < 2; k++) { x = $(4 + 2 * k); y = $(14 + 2 * k);
              r = (x - y) / x; if (r < 0) r = -r; if (r > worst) worst = r;
              if (r > tol) { printf "step %d: %s %s vs %s (relative %.3g > %g)\n", NR, (k ? "grad_norm" : "loss"), x, y, r, tol; bad = 1 } } }
        END { printf "%s vs %s: worst relative difference %.3g over %d steps\n", a, b, worst, NR; exit bad }'
}

outer_plain="--set parallel.dp.outer_lr=1 --set parallel.dp.outer_momentum=0"
H4="--set parallel.dp.sync_every=4"

case "$CASE" in
one_rank)
    for precision in fp32 bf16; do
        run "ref.$precision" 1 --set parallel.dp.strategy=ddp --set train.precision=$precision
        for H in 1 3 4; do
            run "h$H.$precision" 1 --set parallel.dp.sync_every=$H $outer_plain \
                --set train.precision=$precision
            grep -q "diloco over 1 rank, sync every $H step" "h$H.$precision.log" ||
                { cat "h$H.$precision.log"; fail "the header does not describe diloco"; }
            near "ref.$precision" "h$H.$precision" 1e-6
        done
    done
    # the outer optimizer is really applied: the paper's defaults differ
    run paper 1 $H4
    ! near ref.fp32 paper 1e-6 > /dev/null || fail "outer lr 0.7 and momentum 0.9 changed nothing"
    ;;
ranks.np*)
    n=${CASE#ranks.np}
    run ref 1 --set parallel.dp.strategy=ddp
    run workers "$n" $H4
    run again "$n" $H4
    step_fields workers > w.txt
    step_fields again > a.txt
    cmp -s w.txt a.txt || { paste -d '\n' w.txt a.txt; fail "two identical runs differ"; }
    grep -q "diloco over $n ranks, sync every 4 steps, outer lr 0.7, momentum 0.9 (approximate)" workers.log ||
        { cat workers.log; fail "the header does not describe diloco"; }
    falls workers
    compare ref workers 0.05
    ;;
resume.np*)
    n=${CASE#resume.np}
    run whole "$n" $H4 --set train.steps=8 --set train.checkpoint_every=2 \
        --set train.checkpoint_dir="$TMP/ck" --set train.keep_checkpoints=0
    [ -d ck/step-2 ] || { ls ck; fail "no checkpoint of step 2"; }
    run resumed "$n" $H4 --set train.steps=8 --resume "$TMP/ck/step-2"
    ! grep -q "starts from the shared state" resumed.log ||
        { cat resumed.log; fail "a resume at the same mesh dropped the workers' own state"; }
    step_fields whole | tail -n 6 > w.txt
    step_fields resumed > r.txt
    [ "$(wc -l < r.txt)" = 6 ] || { cat resumed.log; fail "the resume ran $(wc -l < r.txt) steps, want 6"; }
    cmp -s w.txt r.txt || { paste -d '\n' w.txt r.txt; fail "the resume differs from steps 3-8 of the uninterrupted run"; }
    echo "$TEST: a resume at $n ranks between two syncs: steps 3-8 identical to the uninterrupted run"
    # the workers' own state is what makes it so: from the shared state alone it differs
    run remeshed "$n" --set train.steps=8 --resume "$TMP/ck/step-2" --set parallel.dp.strategy=ddp
    step_fields remeshed > s.txt
    ! cmp -s w.txt s.txt || fail "ddp from the same checkpoint matched diloco: the test proves nothing"
    ;;
bytes)
    # 8 steps at H = 4: 2 syncs of the fp32 weights; ddp all-reduces the
    # fp32 gradients at every step
    run diloco 2 $H4 --set train.steps=8
    run ddp 2 --set train.steps=8 --set parallel.dp.strategy=ddp --set parallel.dp.bucket_mb=1000
    bytes() { sed 's/.*"comm_bytes": {"dp.allreduce": \([0-9]*\)}.*/\1/' "$1.jsonl"; }
    calls() { sed 's/.*"comm_calls": {"dp.allreduce": \([0-9]*\)}.*/\1/' "$1.jsonl" | awk '{ s += $1 } END { print s }'; }
    # the fp32 weights' bytes, as held
    weights=$(sed -n '1s/.*"held_bytes": {"host": {"params": \([0-9]*\),.*/\1/p' diloco.jsonl)
    # steps 4 and 8 sync; the others carry the core's own all-reduces alone
    own=$(bytes diloco | sed -n 2p)
    [ "$(bytes diloco | sed -n 4p)" = $(( own + weights )) ] && [ "$(bytes diloco | sed -n 8p)" = $(( own + weights )) ] ||
        { bytes diloco; fail "steps 4 and 8 did not each move the $weights bytes of the weights"; }
    [ "$(bytes diloco | sed -n '2,3p;5,7p' | grep -cx "$own")" = 5 ] || { bytes diloco; fail "diloco moved weights between syncs"; }
    [ "$(calls diloco)" = 18 ] || fail "diloco made $(calls diloco) all-reduces in 8 steps, want 2 a step (the core's) and 2 syncs"
    # ddp all-reduces the gradients, as many bytes as the weights, every step
    [ "$(bytes ddp | sed -n 2p)" -ge "$weights" ] && [ "$(bytes ddp | sed -n 2p)" -lt $(( weights + 64 )) ] ||
        fail "ddp moved $(bytes ddp | sed -n 2p) bytes at step 2, want the gradients' $weights"
    echo "$TEST: 8 steps at H = 4: diloco moved the weights ($weights bytes) twice, ddp the gradients 8 times"
    ;;
plan)
    dp_bytes() {
        "$LOOM" plan "$CFG" --set data.train="$DATA" --set parallel.dp.size=4 "$@" --json p.json > p.log 2>&1 ||
            { cat p.log; fail "loom plan $*"; }
        python3 -c 'import json; print(json.load(open("p.json"))["ranks"][0]["comm_bytes"]["dp.allreduce"])'
    }
    ddp=$(dp_bytes --set parallel.dp.strategy=ddp --set parallel.dp.bucket_mb=1000)
    for H in 1 8 16; do
        d=$(dp_bytes --set parallel.dp.sync_every=$H)
        # ddp: the gradients and the loss (4 bytes); diloco: 1/H of the
        # weights, the loss and the core's norm exchange (16 bytes)
        [ $(( d - 20 )) = $(( (ddp - 4 + H - 1) / H )) ] ||
            fail "loom plan: diloco at H = $H moves $d bytes a step on dp, ddp $ddp: want 1/$H of the weights"
        grep -q "dp diloco" p.log || { cat p.log; fail "the plan does not name diloco"; }
    done
    echo "$TEST: loom plan: ddp $ddp bytes a step on dp, diloco 1/H of the weights"
    ;;
harness)
    plugin=$(dirname "$LOOM")/../lib/loom/libloom-strategy-diloco.so
    status=0
    (cd "$SRC" && "$LOOM" plugins --check "$plugin" --train examples/harness.cfg --ranks 2) > refused.log 2>&1 || status=$?
    [ "$status" = 2 ] && grep -q "declares LOOM_STRATEGY_APPROXIMATE" refused.log ||
        { cat refused.log; fail "the harness took diloco without --tolerance (status $status)"; }
    (cd "$SRC" && "$LOOM" plugins --check "$plugin" --train examples/harness.cfg --ranks 2,3 \
        --tolerance 0.05 --set parallel.dp.sync_every=4 $outer_plain) > harness.log 2>&1 || { cat harness.log; fail "the harness failed diloco at 0.05"; }
    grep -q "^dp=3: 10 steps, losses within 0.05" harness.log || { cat harness.log; fail "no dp=3 line"; }
    echo "$TEST: the harness holds diloco to --tolerance 0.05 at 2 and 3 ranks"
    ;;
*) fail "unknown case $CASE" ;;
esac
