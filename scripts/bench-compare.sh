#!/bin/sh
# Two loom builds side by side on one rank and one thread, on the GPT-2 124M
# shape of scripts/bench-train.sh (batch 4 x seq 256 of
# examples/data/corpus.bin): for each precision, REPS rounds of old then
# new, and the median step time of each run after its first step; prints
# the medians over the runs and new/old. For a change's cost on the cpu
# backend, say.
#   usage: sh scripts/bench-compare.sh OLD_BUILD NEW_BUILD
#   env:   REPS=4  PRECISIONS="fp32 bf16"  STEPS=5
set -eu
cd "$(dirname "$0")/.."
OLD=$1 NEW=$2
REPS=${REPS:-4} PRECISIONS=${PRECISIONS:-"fp32 bf16"} STEPS=${STEPS:-5}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
SHAPE="--set model.layers=12 --set model.channels=768 --set model.heads=12 --set model.vocab=50257
--set model.padded_vocab=50304 --set model.max_seq=1024 --set train.batch=4 --set train.seq=256
--set parallel.dp.size=1 --set data.val=\"\" --set train.eval_every=0 --set train.steps=$STEPS"
for rep in $(seq "$REPS"); do
    for prec in $PRECISIONS; do
        for which in old new; do
            build=$OLD
            [ $which = new ] && build=$NEW
            # shellcheck disable=SC2086
            LOOM_PLUGIN_PATH=$build/lib/loom "$build/bin/loom" train examples/train.cfg $SHAPE \
                --set train.precision="$prec" --metrics "$TMP/$which.$prec.$rep.jsonl" \
                > "$TMP/$which.$prec.$rep.log" 2>&1 ||
                { cat "$TMP/$which.$prec.$rep.log"; exit 1; }
        done
    done
done
python3 - "$TMP" "$PRECISIONS" <<'PY'
import glob, json, statistics, sys
tmp, precisions = sys.argv[1], sys.argv[2].split()
for prec in precisions:
    medians = {}
    for which in ("old", "new"):
        runs = []
        for path in sorted(glob.glob("%s/%s.%s.*.jsonl" % (tmp, which, prec))):
            steps = [json.loads(l) for l in open(path) if '"step_ms"' in l]
            runs.append(statistics.median(s["step_ms"] for s in steps[1:]))
        medians[which] = statistics.median(runs)
    print("%s: old %.0f ms, new %.0f ms a step (median of %d runs each); new/old %.3f"
          % (prec, medians["old"], medians["new"], len(runs), medians["new"] / medians["old"]))
PY
