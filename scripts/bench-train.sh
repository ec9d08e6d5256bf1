#!/bin/sh
# Training throughput, printed as a markdown section: loom vs PyTorch
# (Debian's python3-torch) on the same GPT-2 shapes and thread counts, MFU
# against the sgemm peak loom measures, where loom's step goes by kernel
# (--metrics' kernel_ms), and DDP with and without overlap.
#   usage: bash scripts/bench-train.sh > fragment.md   (scripts/bench.sh calls it)
# Installs python3-torch with apt-get if it is missing (a few hundred MB).
set -eu
cd "$(dirname "$0")/.."
LOOM=build/bin/loom
PY=/usr/bin/python3
if ! $PY -c "import torch" 2>/dev/null; then
    echo "bench-train: installing python3-torch" >&2
    apt-get install -y -q --no-install-recommends python3-torch >&2
fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1

median_ms() { # metrics file -> median step_ms after the first step
    $PY -c "import json,statistics,sys; r=[json.loads(l) for l in open(sys.argv[1])][1:]; print('%.1f' % statistics.median(x['step_ms'] for x in r))" "$1"
}
median_mfu() {
    $PY -c "import json,statistics,sys; r=[json.loads(l) for l in open(sys.argv[1])][1:]; print('%.1f' % (100*statistics.median(x['mfu'] for x in r)))" "$1"
}

# the per-kernel breakdown of the runs kept by run_shape: per kind the
# median ms/step after the first step and its share of the compute
KERNEL_RUNS=""
kernel_table() {
    $PY - $KERNEL_RUNS <<'PY'
import json, statistics, sys
runs = [(sys.argv[i], sys.argv[i + 1]) for i in range(1, len(sys.argv), 2)]
cols = []
for label, path in runs:
    lines = [json.loads(l) for l in open(path)][1:]
    steps = [s["kernel_ms"] for s in lines]
    kinds = list(steps[0])
    ms = {k: statistics.median(s[k] for s in steps) for k in kinds}
    cols.append((label, ms, sum(ms.values()), statistics.median(s["step_ms"] for s in lines)))
print("| kernel | " + " | ".join(c[0] for c in cols) + " |")
print("|---|" + "---|" * len(cols))
for k in kinds:
    print("| %s | " % k + " | ".join("%.1f ms (%.1f%%)" % (ms[k], 100 * ms[k] / total)
                                     for _, ms, total, _ in cols) + " |")
print("| all kernels | " + " | ".join("%.1f ms" % c[2] for c in cols) + " |")
print("| step | " + " | ".join("%.1f ms" % c[3] for c in cols) + " |")
PY
}

# shape name, loom --set args, torch args, a short label (no spaces)
run_shape() {
    name=$1; sets=$2; targs=$3; label=$4
    for threads in 1 2; do
        # shellcheck disable=SC2086
        "$LOOM" train scripts/bench/gpt2-small.cfg $sets --set train.threads=$threads \
            --metrics "$TMP/m.jsonl" > "$TMP/log" 2>&1 || { cat "$TMP/log" >&2; exit 1; }
        cp "$TMP/m.jsonl" "$TMP/kernels-$label-$threads.jsonl"
        KERNEL_RUNS="$KERNEL_RUNS $label,${threads}t $TMP/kernels-$label-$threads.jsonl"
        peak=$(sed -n 's/.*MFU against \([0-9.]*\) GFLOP.*/\1/p' "$TMP/log")
        lms=$(median_ms "$TMP/m.jsonl"); lmfu=$(median_mfu "$TMP/m.jsonl")
        # shellcheck disable=SC2086
        tms=$($PY scripts/bench/torch_gpt2.py $targs --threads $threads | sed 's/.*step \([0-9.]*\) ms.*/\1/')
        tver=$($PY -c "import torch; print(torch.__version__)")
        $PY -c "
l, t, mfu, peak = float('$lms'), float('$tms'), float('$lmfu'), float('$peak')
print('| %s | %d | %.1f | %.1f | %.2f | %.1f%% | %.1f%% | %.0f |' % ('$name', $threads, l, t, t / l, mfu, mfu * l / t, peak))"
    done
}

echo "## Training throughput: loom vs PyTorch"
echo
echo "One rank, fp32, AdamW, the same model (llm.c's GPT-2) in both; median step"
echo "time over the steps after the first. MFU counts 6 FLOPs per parameter per"
echo "token plus causal attention, against the sgemm rate loom measures at start"
echo "(the peak column, per thread count). PyTorch $($PY -c 'import torch; print(torch.__version__)') from Debian's python3-torch."
echo
echo "| model | threads | loom ms/step | PyTorch ms/step | PyTorch / loom | loom MFU | PyTorch MFU | sgemm peak GFLOP/s |"
echo "|---|---|---|---|---|---|---|---|"
run_shape "GPT-2 small (L12 C768, V 50257), B4 T256" \
    "--set train.batch=4 --set train.steps=4" \
    "--layers 12 --channels 768 --heads 12 --vocab 50257 --padded-vocab 50304 --batch 4 --seq 256 --steps 4" \
    "GPT-2-small"
run_shape "demo (L4 C128, V 256), B8 T64" \
    "--set model.layers=4 --set model.channels=128 --set model.heads=4 --set model.vocab=256 --set model.padded_vocab=256 --set model.max_seq=256 --set train.batch=8 --set train.seq=64 --set train.steps=30" \
    "--layers 4 --channels 128 --heads 4 --vocab 256 --padded-vocab 256 --batch 8 --seq 64 --steps 30" \
    "demo"

echo
echo "## Where loom's step goes, by kernel"
echo
echo "The runs above (model, threads), \`--metrics\`' \`kernel_ms\`: per kernel kind the"
echo "median ms per step after the first, and its share of the time inside the"
echo "model and AdamW (all kernels; the rest of the step is the data loader,"
echo "the loss and norm reductions and the step's bookkeeping). \`matmul_*\` are"
echo "the blocks' GEMMs (forward, input gradient, weight gradient), \`lm_head\`"
echo "the tied head's three; \`other\` is what the model does outside any kernel"
echo "(zeroing gradients, copies)."
echo
kernel_table

echo
echo "## DDP: overlap of the gradient all-reduce with backward"
echo
echo "2 ranks (\`loom launch\`, comm-mpi), GPT-2 L6 C384 V256, batch 8 × seq 128,"
echo "\`bucket_mb = 1\`; median step time over 10 steps. The exposed communication"
echo "is the time of the bucket all-reduces when they all run after backward"
echo "(overlap off, from the trace); the hidden share is how much of it overlap"
echo "removes from the step."
echo
DDP="--set model.layers=6 --set model.channels=384 --set model.heads=6 --set model.vocab=256 --set model.padded_vocab=256 --set model.max_seq=256 --set train.batch=8 --set train.seq=128 --set train.steps=11 --set parallel.dp.size=2 --set parallel.dp.bucket_mb=1"
for overlap in true false; do
    # shellcheck disable=SC2086
    "$LOOM" launch -n 2 -- "$LOOM" train scripts/bench/gpt2-small.cfg $DDP \
        --set parallel.dp.overlap=$overlap --metrics "$TMP/ddp-$overlap.jsonl" \
        --trace "$TMP/ddp-$overlap.json" > "$TMP/log" 2>&1 || { cat "$TMP/log" >&2; exit 1; }
done
$PY - "$TMP" <<'PY'
import json, statistics, sys
tmp = sys.argv[1]
def step_ms(o):
    return statistics.median(json.loads(l)["step_ms"] for l in list(open(f"{tmp}/ddp-{o}.jsonl"))[1:])
on, off = step_ms("true"), step_ms("false")
ev = json.load(open(f"{tmp}/ddp-false.json"))["traceEvents"]
# rank 0's bucket spans, per step: the union of their intervals
spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in ev
               if e.get("ph") == "X" and e["pid"] == 0 and e["name"].startswith("ddp bucket"))
total, end = 0.0, -1.0
for s, e in spans:
    if e > end:
        total += e - max(s, end)
        end = e
comm = total / 1e3 / 11
print("| overlap | ms/step |")
print("|---|---|")
print(f"| on | {on:.1f} |")
print(f"| off | {off:.1f} |")
print()
print(f"All-reduce time with overlap off (rank 0's bucket spans, after backward): "
      f"{comm:.1f} ms/step, {100 * comm / off:.0f}% of the step. Overlap changes the step "
      f"by {on - off:+.1f} ms, i.e. it hides {100 * (off - on) / comm:.0f}% of that time "
      f"(negative: overlap costs more than it hides). On this machine 2 ranks fill both "
      f"cores with compute, and moving the bytes (shared-memory copies or loopback TCP) "
      f"needs a core too, so there is little idle time for communication to hide in; "
      f"and Open MPI progresses a non-blocking collective only inside MPI calls, which "
      f"DDP makes once per unit.")
PY
