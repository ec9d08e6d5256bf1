#!/bin/sh
# A data strategy's contract with the core, through `loom train`:
#   clip_default   the minimal strategy (REQUIRED hooks only) at dp=1 gets the
#                  core's norm over its units: clipped runs match ddp's
#   dp_refused     the same at dp=2 is refused, naming the missing hooks
#   one_microbatch LOOM_STRATEGY_ONE_MICROBATCH refused with grad_accum = 2
#   in_order       LOOM_STRATEGY_GRADS_IN_ORDER refused with a pipeline
#   unknown_bit    a capability bit the core does not know is refused at load
#   group          with the hooks a dp group needs, it trains at dp=3 as one rank
#   norm_differs   a norm of the rank's own share is stopped at the first step
#   eval_refused   a forward hook of its own but no data_eval: validation is
#                  refused; the core's no-op forward hook (minimal) is not one
#   usage: contract_test.sh LOOM SOURCE_DIR PLUGIN_DIR CASE
set -eu
LOOM=$1
SRC=$2
PLUGINS=$3
CASE=$4
CFG=$SRC/tests/zero/tiny.cfg
DATA=$SRC/examples/data/corpus.bin
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cd "$TMP"

TEST=contract_test
. "$SRC/tests/common/train_runs.sh"
train() { "$LOOM" train "$CFG" --set data.train="$DATA" --set train.steps=6 "$@"; }
# expect_refusal TEXT CMD...: CMD fails and prints TEXT
expect_refusal() {
    want=$1; shift
    if "$@" > out.log 2>&1; then cat out.log; echo "contract_test: accepted, want a refusal"; exit 1; fi
    grep -F -- "$want" out.log > /dev/null || { cat out.log; echo "contract_test: want: $want"; exit 1; }
    echo "refused as it should be: $want"
}

case "$CASE" in
eval_refused)
    VAL="--set data.val=$SRC/examples/data/val.bin --set train.eval_every=3 --set train.eval_batches=2"
    # shellcheck disable=SC2086 # VAL is several words
    expect_refusal "strategy fwdhook gathers parameters in its forward hooks but cannot run forward only (it has no data_eval, ABI 1.5); remove data.val or choose another parallel.dp.strategy" \
        train --set parallel.dp.strategy="$PLUGINS/libloom-strategy-fwdhook.so" $VAL
    # shellcheck disable=SC2086
    train --set parallel.dp.strategy="$PLUGINS/libloom-strategy-minimal.so" $VAL > ok.log 2>&1 ||
        { cat ok.log; echo "contract_test: validation refused for a strategy with no forward hook"; exit 1; }
    echo "no forward hook of its own: validated" ;;
clip_default)
    # A clip far below the gradients' norm changes every step, so a norm of
    # 0 (clipping off) or a wrong one shows.
    run ddp 1 --set train.steps=6 --set train.clip=0.05
    run minimal 1 --set train.steps=6 --set train.clip=0.05 \
        --set parallel.dp.strategy="$PLUGINS/libloom-strategy-minimal.so"
    run unclipped 1 --set train.steps=6
    losses ddp > a.txt; losses unclipped > c.txt
    cmp -s a.txt c.txt && { echo "contract_test: clipping changed nothing; the test cannot tell"; exit 1; }
    compare ddp minimal 1e-6 || { echo "contract_test: the core's default norm differs from ddp's"; exit 1; }
    grep -o '"grad_norm": [^,]*' minimal.jsonl | head -1 ;;
dp_refused)
    expect_refusal "parallel.dp.size=2: strategy 'minimal' cannot serve a dp group of 2 ranks: data_grads_ready and data_finish_backward are NULL, so nothing would average the gradients over the dp group; implement data_grads_ready or data_finish_backward (the core's defaults are right for a dp group of one only)" \
        "$LOOM" launch -n 2 -- "$LOOM" train "$CFG" --set data.train="$DATA" --set parallel.dp.size=2 \
        --set parallel.dp.strategy="$PLUGINS/libloom-strategy-minimal.so" ;;
one_microbatch)
    expect_refusal "train.grad_accum=2: strategy $PLUGINS/libloom-strategy-onemicro.so requires one micro-batch per step (it declares LOOM_STRATEGY_ONE_MICROBATCH), but this job accumulates several micro-batches per step; change the setting or the strategy" \
        train --set parallel.dp.strategy="$PLUGINS/libloom-strategy-onemicro.so" --set train.grad_accum=2
    train --set parallel.dp.strategy="$PLUGINS/libloom-strategy-onemicro.so" > ok.log 2>&1 || { cat ok.log; exit 1; }
    echo "one micro-batch per step: accepted" ;;
in_order)
    expect_refusal "parallel.pp.size=2: strategy $PLUGINS/libloom-strategy-inorder.so requires gradients reported unit by unit in reverse order, one micro-batch at a time (it declares LOOM_STRATEGY_GRADS_IN_ORDER), but a pipeline interleaves micro-batches and splits the backward" \
        "$LOOM" launch -n 2 -- "$LOOM" train "$CFG" --set data.train="$DATA" --set parallel.pp.size=2 \
        --set parallel.pp.microbatches=2 --set parallel.dp.strategy="$PLUGINS/libloom-strategy-inorder.so" ;;
unknown_bit)
    expect_refusal "FAIL capabilities: capabilities has bits 0x10000000000 this loom does not know" \
        "$LOOM" plugins --check "$PLUGINS/libloom-strategy-future.so" ;;
group)
    run one 1 --set train.steps=6 --set train.clip=0.05
    run three 3 --set train.steps=6 --set train.clip=0.05 \
        --set parallel.dp.strategy="$PLUGINS/libloom-strategy-group.so"
    compare one three 1e-5 || { echo "contract_test: dp=3 left the single-rank trajectory"; exit 1; } ;;
norm_differs)
    expect_refusal "strategy sharenorm: data_grad_norm_sq differs across the dp group at step 1" \
        "$LOOM" launch -n 2 -- "$LOOM" train "$CFG" --set data.train="$DATA" --set parallel.dp.size=2 \
        --set parallel.dp.strategy="$PLUGINS/libloom-strategy-sharenorm.so" ;;
*) echo "contract_test: unknown case $CASE"; exit 2 ;;
esac
