#!/bin/sh
# GPT-2 124M training on one NVIDIA GPU: loom (model.device = "cuda") and
# llm.c's CUDA trainer (train_gpt2cu) side by side, and loom's ranks sharing
# the GPU. Regenerates docs/benchmarks-gpu.md (not with --quick).
#
#   usage: sh scripts/bench-gpu.sh [--quick]
#     --quick  loom at B = 16 only, 8 steps, a shorter peak measurement; no
#              llm.c, no ranks, no doc: a check that the GPU path trains
#              and how fast (scripts/gpu-check.sh runs it)
#   env:   BUILD=build-gpu   loom's build (bin/loom, bin/cuda_gemm_peak, lib/loom)
#          LLMC_DIR=.gpu/llm.c   llm.c's sources (built in a scratch copy)
#          STEPS=20          steps of each run (the first 3 are warm-up)
#          DOC=docs/benchmarks-gpu.md
#          KEEP=DIR          keep every run's raw output in DIR
#
# Every run: bf16, T = 1024, random initialisation, random tokens (a shard
# in llm.c's format written here); rows give the median step time of the
# steps after the first 3, tokens/s from it, and MFU against the bf16
# product rate cuda_gemm_peak measures on this GPU (FLOPs per token as
# loom counts them: 6 per parameter, position embeddings excluded, plus
# causal attention's 6·L·T·C). Device memory: loom's own peak (its
# progress line's "peak device") or llm.c's report, and nvidia-smi's
# highest "memory.used" sampled during the run.
set -eu
cd "$(dirname "$0")/.."
QUICK=0
[ "${1:-}" = --quick ] && QUICK=1
BUILD=${BUILD:-build-gpu}
LLMC_DIR=${LLMC_DIR:-.gpu/llm.c}
DOC=${DOC:-docs/benchmarks-gpu.md}
STEPS=${STEPS:-20}
[ $QUICK = 1 ] && STEPS=${QUICK_STEPS:-8}
ROOT=$(pwd)
LOOM=$ROOT/$BUILD/bin/loom
PEAK=$ROOT/$BUILD/bin/cuda_gemm_peak
[ -x "$LOOM" ] || { echo "bench-gpu.sh: $LOOM not built (bash .gpu/build.sh, or set BUILD)" >&2; exit 1; }
[ -f "$BUILD/lib/loom/libloom-compute-cuda.so" ] ||
    { echo "bench-gpu.sh: $BUILD/lib/loom/libloom-compute-cuda.so not built" >&2; exit 1; }
command -v nvidia-smi > /dev/null || { echo "bench-gpu.sh: no nvidia-smi: this needs a GPU machine" >&2; exit 1; }
TMP=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] && mkdir -p "$KEEP" && cp -r "$TMP"/. "$KEEP"/; rm -rf "$TMP"' EXIT
export LOOM_PLUGIN_PATH="$ROOT/$BUILD/lib/loom"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
export PATH="/usr/local/cuda/bin:$PATH"
GPU=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)
echo "bench-gpu.sh: $GPU; $STEPS steps a run" >&2

# ---- the product peak MFU is measured against
if [ $QUICK = 1 ]; then
    set -- --reps 10 8192x8192x8192 16384x3072x768
else
    set --
fi
echo "+ $PEAK $*" >&2
if timeout 120 "$PEAK" "$@" > "$TMP/peak.txt" 2>&1; then
    cat "$TMP/peak.txt" >&2
    PEAK_TFLOPS=$(sed -n 's/^peak: \([0-9.]*\) TFLOP\/s.*/\1/p' "$TMP/peak.txt")
else
    cat "$TMP/peak.txt" >&2
    echo "bench-gpu.sh: cuda_gemm_peak failed: MFU will be n/a" >&2
    PEAK_TFLOPS=""
fi

# ---- random tokens in llm.c's shard format (256 int32 header: magic
# 20240520, version 1, the count; then uint16 tokens below GPT-2's vocab)
python3 - "$TMP" <<'PY'
import os, sys
from array import array
for name, count in (("train.bin", 1 << 22), ("val.bin", 1 << 20)):
    tokens = array("H", os.urandom(2 * count))
    tokens = array("H", (t % 50257 for t in tokens))
    header = array("i", [20240520, 1, count] + [0] * 253)
    with open(os.path.join(sys.argv[1], name), "wb") as f:
        header.tofile(f)
        tokens.tofile(f)
PY

# memory_watch FILE / memory_stop: nvidia-smi's used memory (MiB) every
# 200 ms into FILE while a run goes
memory_watch() {
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > "$1" 2>/dev/null &
    WATCH=$!
}
memory_stop() { kill "$WATCH" 2>/dev/null || true; wait "$WATCH" 2>/dev/null || true; }

# loom_run NAME RANKS [--set ...]: GPT-2 124M unless the settings change it
loom_run() {
    name=$1; ranks=$2; shift 2
    cat > "$TMP/$name.cfg" <<EOF
model = { layers = 12; heads = 12; channels = 768; vocab = 50257; padded_vocab = 50304;
          max_seq = 1024; };
data = { train = "$TMP/train.bin"; };
train = { batch = 16; seq = 1024; steps = $STEPS; lr = 6e-4; precision = "bf16"; };
parallel = { dp = { size = $ranks; strategy = "ddp"; }; };
comm = { default = "ucx"; };
EOF
    [ -n "$PEAK_TFLOPS" ] &&
        set -- "$@" --set train.peak_gflops="$(awk -v t="$PEAK_TFLOPS" 'BEGIN { print t * 1000 }')"
    set -- "$LOOM" train "$TMP/$name.cfg" --set model.device='"cuda"' --metrics "$TMP/$name.jsonl" "$@"
    [ "$ranks" -gt 1 ] && set -- "$LOOM" launch -n "$ranks" -- "$@"
    echo "+ $*" | sed "s|$TMP/||g; s|$ROOT/||g" >> "$TMP/commands.txt"
    echo "+ $*" >&2
    memory_watch "$TMP/$name.smi"
    status=0
    timeout 600 "$@" > "$TMP/$name.log" 2>&1 || status=$?
    memory_stop
    [ $status = 0 ] || { tail -20 "$TMP/$name.log" >&2; echo "bench-gpu.sh: $name failed ($status)" >&2; }
    grep -E '^(\[0\] )?(compute:|step +[0-9]+/)' "$TMP/$name.log" | tail -2 >&2 || true
}

# llmc_run NAME B: llm.c's trainer, built once
# first_file PATH...: the first that exists
first_file() {
    for f in "$@"; do
        [ -f "$f" ] && { echo "$f"; return 0; }
    done
    return 1
}
llmc_build() {
    [ -d "$LLMC_DIR" ] ||
        { echo "bench-gpu.sh: no llm.c at $LLMC_DIR (set LLMC_DIR): its rows skipped" >&2; return 1; }
    cp -r "$LLMC_DIR" "$TMP/llmc"
    rm -f "$TMP/llmc/train_gpt2cu"
    set -- make train_gpt2cu NO_MULTI_GPU=1 NO_USE_MPI=1 GPU_COMPUTE_CAPABILITY=90
    echo "+ $* (in a copy of $LLMC_DIR)" | tee -a "$TMP/commands.txt" >&2
    # up to two fixes, each applied once where its error shows
    for attempt in 1 2 3; do
        (cd "$TMP/llmc" && timeout 600 "$@") > "$TMP/llmc-build.log" 2>&1 && return 0
        [ $attempt = 3 ] && break
        if grep -q 'cudaMemLocation' "$TMP/llmc-build.log" &&
            grep -q cudaCpuDeviceId "$TMP/llmc/llmc/cuda_utils.cuh"; then
            # CUDA 13: cudaMemAdvise takes a cudaMemLocation, not a device id
            fix="llmc/cuda_utils.cuh: cudaCpuDeviceId -> cudaMemLocation{cudaMemLocationTypeHost, 0}"
            sed -i 's/cudaCpuDeviceId/cudaMemLocation{cudaMemLocationTypeHost, 0}/' \
                "$TMP/llmc/llmc/cuda_utils.cuh"
        elif grep -q 'cannot find -lnvidia-ml' "$TMP/llmc-build.log" &&
            nvml=$(first_file /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 \
                /usr/lib64/libnvidia-ml.so.1); then
            # the driver has libnvidia-ml.so.1 but no unversioned name to link
            mkdir -p "$TMP/nvml"
            ln -sf "$nvml" "$TMP/nvml/libnvidia-ml.so"
            fix="NVCC_LDFLAGS=\"-lcublas -lcublasLt -L<dir with libnvidia-ml.so -> $nvml> -lnvidia-ml\""
            set -- "$@" NVCC_LDFLAGS="-lcublas -lcublasLt -L$TMP/nvml -lnvidia-ml"
        else
            break
        fi
        echo "bench-gpu.sh: llm.c did not build; again with $fix" >&2
        echo "  (then: $fix)" >> "$TMP/commands.txt"
    done
    grep -E 'error|cannot' "$TMP/llmc-build.log" | head -10 >&2
    echo "bench-gpu.sh: llm.c did not build ($TMP/llmc-build.log): its rows skipped" >&2
    return 1
}
llmc_run() {
    name=$1; batch=$2
    set -- ./train_gpt2cu -e d12 -i "$TMP/train.bin" -j "$TMP/val.bin" -b "$batch" -t 1024 \
        -x "$STEPS" -v 10000 -s 10000 -h 0
    echo "+ $*" | sed "s|$TMP/||g; s|$ROOT/||g" >> "$TMP/commands.txt"
    echo "+ $*" >&2
    memory_watch "$TMP/$name.smi"
    status=0
    (cd "$TMP/llmc" && timeout 600 "$@") > "$TMP/$name.log" 2>&1 || status=$?
    memory_stop
    [ $status = 0 ] || { tail -20 "$TMP/$name.log" >&2; echo "bench-gpu.sh: $name failed ($status)" >&2; }
}

: > "$TMP/commands.txt"
if [ $QUICK = 1 ]; then
    loom_run loom-b16 1 --set train.batch=16
else
    for b in 16 32; do
        loom_run "loom-b$b" 1 --set train.batch=$b
    done
    if llmc_build; then
        for b in 16 32; do
            llmc_run "llmc-b$b" $b
        done
    fi
    # ranks sharing the GPU (a smaller model: each rank keeps its own
    # copy of the model and Adam state in the one GPU's memory), 4
    # sequences per rank, collectives staged through host memory
    for strategy in ddp zero3; do
        for ranks in 1 2 4; do
            loom_run "ranks-$strategy-$ranks" "$ranks" --set model.layers=6 --set model.channels=512 \
                --set model.heads=8 --set train.batch=$((4 * ranks)) \
                --set parallel.dp.strategy=$strategy
        done
    done
fi

python3 - "$TMP" "$QUICK" "${PEAK_TFLOPS:-}" "$GPU" "$STEPS" > "$TMP/table.md" <<'PY'
import glob, json, os, re, statistics, sys
tmp, quick, peak, gpu, steps = sys.argv[1], sys.argv[2] == "1", sys.argv[3], sys.argv[4], int(sys.argv[5])
peak = float(peak) * 1e12 if peak else None
WARMUP = 3

def flops_per_token(L, C, Vp, maxT, T):
    # loom_model_flops_per_token: 6 per parameter (position embeddings do no
    # multiply-adds) plus 6·L·T·C for causal attention
    params = Vp * C + maxT * C + L * (12 * C * C + 13 * C) + 2 * C
    return 6.0 * (params - maxT * C) + 6.0 * L * T * C

def smi_peak(name):
    try:
        values = [int(x) for x in open(f"{tmp}/{name}.smi").read().split() if x.isdigit()]
        return max(values) if values else None
    except OSError:
        return None

def mib(x):
    return f"{x:,.0f} MiB" if x is not None else "n/a"

# ranks: the GPUs the tokens/s is shared by (1: every rank on the one GPU)
def loom_row(name, L, C, B, ranks):
    try:
        rows = [json.loads(l) for l in open(f"{tmp}/{name}.jsonl") if '"loss"' in l]
    except OSError:
        rows = []
    if len(rows) <= WARMUP:
        log = open(f"{tmp}/{name}.log").read().strip().splitlines() if os.path.exists(f"{tmp}/{name}.log") else []
        return None, (log[-1] if log else "no output")
    ms = statistics.median(r["step_ms"] for r in rows[WARMUP:])
    tokens = B * 1024 / ms * 1e3
    device = rows[-1].get("peak_bytes", {}).get("device", {}).get("total")
    return {"ms": ms, "tps": tokens, "loss": rows[-1]["loss"],
            "mfu": flops_per_token(L, C, 50304, 1024, 1024) * tokens / ranks / peak if peak else None,
            "device": device / 2**20 if device else None, "smi": smi_peak(name)}, None

def llmc_row(name, B):
    try:
        log = open(f"{tmp}/{name}.log").read()
    except OSError:
        return None, "not run"
    found = list(re.finditer(r"^step +\d+/\d+ \| loss ([0-9.naif]+) .*\| ([0-9.]+) ms \|", log, re.M))
    steps_ms = [float(m.group(2)) for m in found]
    if len(steps_ms) <= WARMUP:
        lines = log.strip().splitlines()
        return None, lines[-1] if lines else "no output"
    ms = statistics.median(steps_ms[WARMUP:])
    tokens = B * 1024 / ms * 1e3
    mem = re.search(r"device memory usage: (\d+) MiB", log)
    return {"ms": ms, "tps": tokens, "loss": found[-1].group(1),
            "mfu": flops_per_token(12, 768, 50304, 1024, 1024) * tokens / peak if peak else None,
            "device": float(mem.group(1)) if mem else None, "smi": smi_peak(name)}, None

def pct(x):
    return f"{100 * x:.1f}%" if x is not None else "n/a"

print(f"GPU: {gpu}; bf16 product peak (cuda_gemm_peak, cuBLASLt): "
      + (f"{peak / 1e12:.1f} TFLOP/s" if peak else "not measured") + "\n")
print("| trainer | model | batch x seq | ms/step | tokens/s | MFU | device memory (own report) | nvidia-smi peak used | last loss |")
print("|---|---|---|---|---|---|---|---|---|")
batches = (16,) if quick else (16, 32)
for B in batches:
    r, why = loom_row(f"loom-b{B}", 12, 768, B, 1)
    if r:
        print(f"| loom | GPT-2 124M | {B} x 1024 | {r['ms']:.1f} | {r['tps']:,.0f} | {pct(r['mfu'])} | {mib(r['device'])} | {mib(r['smi'])} | {r['loss']} |")
    else:
        print(f"| loom | GPT-2 124M | {B} x 1024 | failed: {why} | | | | | |")
    if not quick:
        r, why = llmc_row(f"llmc-b{B}", B)
        if r:
            print(f"| llm.c train_gpt2cu | GPT-2 124M | {B} x 1024 | {r['ms']:.1f} | {r['tps']:,.0f} | {pct(r['mfu'])} | {mib(r['device'])} | {mib(r['smi'])} | {r['loss']} |")
        else:
            print(f"| llm.c train_gpt2cu | GPT-2 124M | {B} x 1024 | not run: {why} | | | | | |")
if not quick:
    print("\nRanks sharing the one GPU (loom launch -n R; comm-ucx, collectives staged through host"
          " memory), GPT-2 L6 C512 NH8 (Vp 50304), 4 x 1024 tokens per rank, bf16:\n")
    print("| strategy | ranks | ms/step | tokens/s (all ranks) | tokens/s per rank | MFU of the GPU | rank 0's device memory | nvidia-smi peak used |")
    print("|---|---|---|---|---|---|---|---|")
    for strategy in ("ddp", "zero3"):
        for ranks in (1, 2, 4):
            r, why = loom_row(f"ranks-{strategy}-{ranks}", 6, 512, 4 * ranks, 1)
            if r:
                print(f"| {strategy} | {ranks} | {r['ms']:.1f} | {r['tps']:,.0f} | {r['tps'] / ranks:,.0f} | {pct(r['mfu'])} | {mib(r['device'])} | {mib(r['smi'])} |")
            else:
                print(f"| {strategy} | {ranks} | failed: {why} | | | | | |")
PY
cat "$TMP/table.md"
if [ $QUICK = 0 ]; then
    {
        echo "# Training on one GPU: loom against llm.c"
        echo
        echo "Generated by \`sh scripts/bench-gpu.sh\` (do not edit by hand). $STEPS steps a"
        echo "run; each row is the median step time of the steps after the first 3. Both"
        echo "trainers run GPT-2 124M (12 layers, 768 channels, 12 heads, vocabulary 50257"
        echo "padded to 50304) in bf16 with fp32 master weights and AdamW, from random"
        echo "initialisation on random tokens (one shard in llm.c's format). MFU counts the"
        echo "FLOPs per token loom counts (6 per parameter, position embeddings excluded,"
        echo "plus causal attention) against the bf16 product rate cuBLASLt reaches on this"
        echo "GPU (\`cuda_gemm_peak\`, the best of its shapes), not the datasheet's."
        echo
        cat "$TMP/table.md"
        echo
        echo "## Commands"
        echo
        echo '```'
        cat "$TMP/commands.txt"
        echo '```'
        echo
        echo "The loom runs' config (\`--set\` settings above on top of it; \`train.peak_gflops\`"
        echo "is the measured peak, so loom's own MFU figure agrees):"
        echo
        echo '```'
        sed "s|$TMP/||g" "$TMP/loom-b16.cfg"
        echo '```'
        echo
        echo "The product peak, \`$BUILD/bin/cuda_gemm_peak\`:"
        echo
        echo '```'
        cat "$TMP/peak.txt"
        echo '```'
    } > "$DOC"
    echo "bench-gpu.sh: wrote $DOC" >&2
fi
