#!/bin/sh
# `loom plan` against the accounting of real runs: for one mesh, the plan's
# peak bytes per purpose and its traffic per axis and collective (bytes
# and calls) must equal, on every rank, what `loom train --metrics` reports
# on the last of its steps — exactly, padding included.
#   usage: plan_accounting_test.sh LOOM SOURCE_DIR CONFIG RANKS [--set path=value ...]
#   (CONFIG relative to tests/; RANKS = the product of the mesh's sizes)
set -eu
LOOM=$1
SRC=$2
CFG=$SRC/tests/$3
RANKS=$4
shift 4
DATA=$SRC/examples/data/corpus.bin
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cd "$TMP"

"$LOOM" plan "$CFG" --set data.train="$DATA" "$@" --json plan.json > plan.txt 2>&1 ||
    { cat plan.txt; echo "plan_accounting_test: loom plan failed"; exit 1; }
if [ "$RANKS" = 1 ]; then
    "$LOOM" train "$CFG" --set data.train="$DATA" --set train.steps=2 "$@" --metrics "run.{rank}.jsonl" > run.log 2>&1 ||
        { cat run.log; echo "plan_accounting_test: loom train failed"; exit 1; }
else
    "$LOOM" launch -n "$RANKS" -- "$LOOM" train "$CFG" --set data.train="$DATA" --set train.steps=2 "$@" \
        --metrics "run.{rank}.jsonl" > run.log 2>&1 ||
        { cat run.log; echo "plan_accounting_test: loom train failed"; exit 1; }
fi
python3 - "$RANKS" <<'PY'
import json, sys
ranks = int(sys.argv[1])
plan = json.load(open("plan.json"))
tp, sp, pp = plan["mesh"]["tp"], plan["mesh"]["sp"], plan["mesh"]["pp"]
bad = 0
for rank in range(ranks):
    run = json.loads(open("run.%d.jsonl" % rank).read().strip().split("\n")[-1])
    stage = (rank // (tp * sp)) % pp   # the mesh's order: tp, sp, pp, dp, innermost first
    want = plan["ranks"][stage]
    diffs = []
    device = "device" in run["peak_bytes"]
    for tier, purposes in run["peak_bytes"].items():
        for purpose, got in purposes.items():
            if purpose == "total":
                continue
            if device and tier == "host" and purpose == "comm":
                continue  # staged copies of device buffers: not predicted
            planned = want["peak_bytes"].get(tier, {}).get(purpose, 0)
            if planned != got:
                diffs.append("%s %s: planned %d, ran %d" % (tier, purpose, planned, got))
    for key in ("comm_bytes", "comm_calls"):
        for op in sorted(set(run[key]) | set(want[key])):
            if run[key].get(op, 0) != want[key].get(op, 0):
                diffs.append("%s %s: planned %d, ran %d" % (key, op, want[key].get(op, 0), run[key].get(op, 0)))
    host = run["peak_bytes"]["device" if device else "host"]
    print("rank %d (pp %d): %s" % (rank, stage, "; ".join(diffs) if diffs else
          "equal: %d bytes at peak over %d purposes, %d collectives" %
          (sum(v for k, v in host.items() if k != "total"), len(host) - 1, len(run["comm_calls"]))))
    bad |= bool(diffs)
sys.exit(1 if bad else 0)
PY
