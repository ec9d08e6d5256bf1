#!/bin/sh
# `loom plan` as a user runs it: the Llama 3 405B search on the DGX H100
# cluster (Meta's published layout among the first, tp beyond a node
# losing), the warnings, and the refusals.
#   usage: plan_cli_test.sh LOOM SOURCE_DIR CASE
set -eu
LOOM=$1
SRC=$2
CASE=$3
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cd "$TMP"
DGX=$SRC/examples/clusters/dgx-h100.cfg
LLAMA=$SRC/examples/plan/llama3-405b.cfg
TINY=$SRC/tests/zero/tiny.cfg

# refused CMD... : exits 1 with one line naming what to fix (the rest of the args: grep patterns)
refused() {
    pattern=$1; shift
    if "$@" > out.txt 2>&1; then cat out.txt; echo "plan_cli_test: accepted: $*"; exit 1; fi
    [ "$(wc -l < out.txt)" = 1 ] || { cat out.txt; echo "plan_cli_test: more than one line"; exit 1; }
    grep -q -- "$pattern" out.txt || { cat out.txt; echo "plan_cli_test: no '$pattern'"; exit 1; }
    cat out.txt
}

case "$CASE" in
llama405b_search)
    "$LOOM" plan "$LLAMA" --cluster "$DGX" --search --top 5 > search.txt
    cat search.txt
    grep -q "^search: 16384 ranks" search.txt || { echo "plan_cli_test: not 16,384 ranks"; exit 1; }
    # Meta's layout (TP 8, PP 16, DP 128) among the first five
    sed -n '/^  [1-5] /p' search.txt | grep -q "tp 8 x pp 16 x dp 128" ||
        { echo "plan_cli_test: TP 8 x PP 16 x DP 128 is not among the first five"; exit 1; }
    # tp beyond a node (8 GPUs) loses: its best mesh is slower than tp 8's and says why
    awk '/^  tp 8 /  { for (i = 1; i <= NF; i++) if ($i == "ms:") t8 = $(i - 1) }
         /^  tp 16 / { for (i = 1; i <= NF; i++) if ($i == "ms:") t16 = $(i - 1); cross = /cross nodes/ }
         END { if (!t8 || !t16 || t16 <= t8 || !cross) { print "plan_cli_test: tp 16 (" t16 " ms) does not lose to tp 8 (" t8 " ms) across nodes"; exit 1 }
               printf "tp 16 %.0f ms vs tp 8 %.0f ms: %.1fx slower, its all-reduces crossing nodes\n", t16, t8, t16 / t8 }' search.txt ;;
llama405b_plan)
    "$LOOM" plan "$LLAMA" --cluster "$DGX" --json plan.json > plan.txt
    cat plan.txt
    grep -q "^fits: yes" plan.txt || { echo "plan_cli_test: Meta's layout does not fit"; exit 1; }
    # Ψ of Llama 3 405B as Meta counts it
    grep -q '"params": 405853388800' plan.json || { echo "plan_cli_test: Ψ is not 405,853,388,800"; exit 1; }
    grep -q "1f1b x 16 micro-batches" plan.txt
    # without recomputation the first stages' stash does not fit 80 GB
    "$LOOM" plan "$LLAMA" --cluster "$DGX" --set train.recompute=none > none.txt
    grep -q "^fits: no" none.txt && grep -q "^warning: activations are" none.txt ||
        { cat none.txt; echo "plan_cli_test: the stash without recomputation fits"; exit 1; } ;;
warnings)
    "$LOOM" plan "$LLAMA" --cluster "$DGX" --set parallel.tp.size=16 --set parallel.dp.size=64 > tp16.txt
    grep "^warning: tp = 16 spans 2 nodes" tp16.txt || { cat tp16.txt; echo "plan_cli_test: no tp warning"; exit 1; }
    "$LOOM" plan "$LLAMA" --cluster "$DGX" --set parallel.pp.microbatches=8 --set train.batch=1024 > pp.txt
    grep "^warning: pp = 16 stages with 8 micro-batches" pp.txt || { cat pp.txt; echo "plan_cli_test: no bubble warning"; exit 1; }
    "$LOOM" plan "$TINY" --cluster "$DGX" --set train.grad_accum=4 > accum.txt
    grep "^warning: the global batch of 12 needs 4 micro-batches" accum.txt || { cat accum.txt; exit 1; }
    "$LOOM" plan "$TINY" --cluster "$DGX" --set parallel.dp.size=64 --set train.batch=64 > dp.txt
    grep "^warning: the dp group moves more per step than the step computes" dp.txt || { cat dp.txt; exit 1; }
    "$LOOM" plan "$LLAMA" --cluster "$DGX" --set parallel.pp.size=2 --set parallel.dp.size=1024 \
        --set 'parallel.pp.stage_layers=[63,63]' --set parallel.pp.microbatches=2 > big.txt
    grep "^fits: no" big.txt && grep "^warning: the largest rank needs" big.txt || { cat big.txt; exit 1; } ;;
refusals)
    refused 'loom plan knows ddp, zero1, zero2' "$LOOM" plan "$TINY" --set parallel.dp.strategy=mine
    refused 'context parallelism is planned for GPT-2 only' "$LOOM" plan "$LLAMA" --set parallel.sp.size=2 --set parallel.dp.size=64
    refused 'loom plans this shape (loom plan) but trains GPT-2 only' "$LOOM" train "$LLAMA"
    refused 'model.kv_heads: shapes model.kind = "llama" only' "$LOOM" plan "$TINY" --set model.kv_heads=2
    refused 'expected a divisor of model.heads' "$LOOM" plan "$LLAMA" --set model.kv_heads=7
    refused '\-\-search ranks meshes by step time: name the cluster' "$LOOM" plan "$TINY" --search
    refused 'no-such.cfg' "$LOOM" plan "$TINY" --cluster no-such.cfg ;;
*) echo "plan_cli_test: unknown case $CASE"; exit 2 ;;
esac
