#!/bin/sh
# Validation (data.val, train.eval_every, train.eval_batches) end to end:
# every strategy and mesh evaluates the same tokens, so its validation
# losses equal the single rank's (to the rounding of reductions), and a run
# that validates trains exactly as one that does not (bitwise).
#   usage: eval_test.sh LOOM SOURCE_DIR CASE     CASE: meshes | undisturbed | refusals
set -eu
LOOM=$1
SRC=$2
CASE=$3
CFG=$SRC/tests/zero/tiny.cfg
DATA=$SRC/examples/data/corpus.bin
VAL=$SRC/examples/data/val.bin
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cd "$TMP"
TEST="eval_test $CASE"
. "$SRC/tests/common/train_runs.sh"
fail() { echo "$TEST: $*"; exit 1; }

EVAL="--set data.val=$VAL --set train.eval_every=3 --set train.eval_batches=3 --set train.steps=6"
tp=parallel.tp.size sp=parallel.sp.size pp=parallel.pp.size dp=parallel.dp.size

# on NAME RANKS [--set ...]: a run of RANKS ranks whose mesh the settings give
on() {
    on_name=$1; on_ranks=$2; shift 2
    "$LOOM" launch -n "$on_ranks" -- "$LOOM" train "$CFG" --set data.train="$DATA" \
        --metrics "$on_name.jsonl" --save "$on_name.bin" "$@" > "$on_name.log" 2>&1 ||
        { cat "$on_name.log"; fail "run $on_name failed"; }
}

# val_losses NAME: the validation losses, one per line (before training, then every 3 steps)
val_losses() { sed -n 's/.*"val_loss": \([^,}]*\).*/\1/p' "$1.jsonl"; }

# same_val A B: the same number of validation losses, each within 1e-5 relative
same_val() {
    val_losses "$1" > a.txt
    val_losses "$2" > b.txt
    [ "$(wc -l < a.txt)" = 3 ] || { cat "$1.log"; fail "$1: $(wc -l < a.txt) validation losses, want 3 (before training, after steps 3 and 6)"; }
    [ "$(wc -l < b.txt)" = 3 ] || { cat "$2.log"; fail "$2: $(wc -l < b.txt) validation losses, want 3"; }
    paste a.txt b.txt | awk -v a="$1" -v b="$2" '
        { d = $1 - $2; if (d < 0) d = -d; r = d / $1; if (r > worst) worst = r;
          if (r > 1e-5) { printf "validation %d: %s %s, %s %s (relative %.3g)\n", NR, a, $1, b, $2, r; bad = 1 } }
        END { printf "%s vs %s: validation losses agree, worst relative difference %.3g\n", a, b, worst; exit bad }'
}

case "$CASE" in
meshes)
    on one 1 $EVAL
    grep -q "validation loss .* (3 batches of data.val, 1152 tokens)" one.log ||
        { cat one.log; fail "no final validation line"; }
    # before training the weights are random: near ln(256) = 5.545; then it falls
    val_losses one | awk 'NR == 1 { first = $1 } { last = $1 }
        END { if (!(first > 5.4 && first < 5.7 && last < first - 0.3)) { print "validation losses " first " -> " last; exit 1 } }' ||
        fail "validation losses out of place"
    on zero3 2 $EVAL --set $dp=2 --set parallel.dp.strategy=zero3
    same_val one zero3
    on zero1 3 $EVAL --set $dp=3 --set parallel.dp.strategy=zero1
    same_val one zero1
    on zero2_accum 2 $EVAL --set $dp=2 --set parallel.dp.strategy=zero2 --set train.grad_accum=2
    same_val one zero2_accum
    on tp 2 $EVAL --set $tp=2
    same_val one tp
    on ulysses 2 $EVAL --set $sp=2
    same_val one ulysses
    on ring 2 $EVAL --set $sp=2 --set parallel.sp.strategy=ring
    same_val one ring
    on pipeline 2 $EVAL --set $pp=2 --set parallel.pp.microbatches=3
    same_val one pipeline
    on interleaved 2 $EVAL --set $pp=2 --set parallel.pp.schedule=interleaved --set model.layers=4 \
        --set parallel.pp.virtual_stages=2 --set parallel.pp.microbatches=2
    on one4 1 $EVAL --set model.layers=4
    same_val one4 interleaved
    ;;
undisturbed)
    # the same run with and without validation: identical losses and weights
    for mesh in "1 ddp" "2 zero3 --set $dp=2 --set parallel.dp.strategy=zero3 --set parallel.dp.prefetch=1" \
                "2 tp --set $tp=2" "2 ring --set $sp=2 --set parallel.sp.strategy=ring" \
                "2 pp --set $pp=2 --set parallel.pp.microbatches=2"; do
        set -- $mesh
        ranks=$1 name=$2
        shift 2
        on "$name" "$ranks" --set train.steps=6 "$@"
        on "$name.val" "$ranks" $EVAL "$@"
        sed '/"loss"/!d' "$name.val.jsonl" > "$name.steps.jsonl"
        cp "$name.val.bin" "$name.steps.bin"
        bitwise "$name" "$name.steps"
    done
    ;;
refusals)
    for setting in train.eval_every=2 train.eval_batches=4; do
        if "$LOOM" train "$CFG" --set data.train="$DATA" --set "$setting" > out.log 2>&1; then
            fail "--set $setting without data.val was accepted"
        fi
        grep -q "${setting%%=*}.*data.val" out.log || { cat out.log; fail "the refusal of $setting does not name data.val"; }
        echo "refused: $(cat out.log)"
    done
    # val.bin holds 24 batches of 12 x 32 tokens: a 25th would repeat the first
    "$LOOM" train "$CFG" --set data.train="$DATA" --set data.val="$VAL" --set train.steps=1 \
        --set train.eval_batches=24 > ok.log 2>&1 || { cat ok.log; fail "24 validation batches refused"; }
    if "$LOOM" train "$CFG" --set data.train="$DATA" --set data.val="$VAL" --set train.eval_batches=25 > out.log 2>&1; then
        fail "25 validation batches of 24 accepted"
    fi
    grep -q "train.eval_batches = 25, but data.val holds 24 batches" out.log || { cat out.log; fail "wrong refusal of 25 batches"; }
    ;;
*) fail "unknown case $CASE" ;;
esac
echo "$TEST: ok"
