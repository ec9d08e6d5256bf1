#!/bin/sh
# Regenerate docs/benchmarks-train.md: training throughput of one rank,
# loom against PyTorch (Debian's python3-torch: the same GPT-2, the same
# first batch of examples/data/corpus.bin) on two shapes, 1 and 2 threads;
# loom in fp32 and bf16 with its products on oneDNN and on OpenBLAS, and on
# oneDNN again under LOOM_MAX_ISA=avx2 (an AVX2-only CPU's paths: no bf16
# instructions, so bf16 runs multiply in f32); MFU against the rate of the
# library each run used, measured by the run at start; the per-kernel
# breakdown; DDP's overlap at 2 ranks.
#
#   usage: sh scripts/bench-train.sh
#   env:   REPS=3   runs of each configuration; rows are medians, and the
#                   runs alternate which configuration goes first
#          BUILD=build
#          OUT=docs/benchmarks-train.md
#          KEEP=DIR  keep every run's raw output (logs, --metrics) in DIR
# Installs python3-torch with apt-get if it is missing (a few hundred MB).
# Takes about 30 minutes here; run it on an otherwise idle machine.
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
LOOM=$BUILD/bin/loom
REPS=${REPS:-3}
OUT=${OUT:-docs/benchmarks-train.md}
PY=/usr/bin/python3
[ -x "$LOOM" ] || { echo "bench-train.sh: $LOOM not built; run: bash scripts/setup.sh" >&2; exit 1; }
if ! $PY -c "import torch" 2>/dev/null; then
    echo "bench-train.sh: installing python3-torch" >&2
    apt-get install -y -q --no-install-recommends python3-torch >&2
fi
TMP=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] && mkdir -p "$KEEP" && cp -r "$TMP"/. "$KEEP"/; rm -rf "$TMP"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
DATA=examples/data/corpus.bin

# name | loom settings | torch arguments | steps
SHAPES="gpt2-124m|--set model.layers=12 --set model.channels=768 --set model.heads=12 --set model.vocab=50257 --set model.padded_vocab=50304 --set model.max_seq=1024 --set train.batch=4 --set train.seq=256|--layers 12 --channels 768 --heads 12 --vocab 50257 --padded-vocab 50304 --batch 4 --seq 256|4
small|--set model.layers=6 --set model.channels=384 --set model.heads=6 --set model.vocab=8192 --set model.padded_vocab=8192 --set model.max_seq=256 --set train.batch=4 --set train.seq=128|--layers 6 --channels 384 --heads 6 --vocab 8192 --padded-vocab 8192 --batch 4 --seq 128|12"
# <library>-<precision>[@<LOOM_MAX_ISA>]
CONFIGS="onednn-fp32 onednn-bf16 onednn-fp32@avx2 onednn-bf16@avx2 openblas-fp32 openblas-bf16 torch"

# run SHAPE_LINE THREADS CONFIG REP: one run, its figures into $TMP/<shape>-<threads>-<config>-<rep>.*
run() {
    name=$(echo "$1" | cut -d'|' -f1); sets=$(echo "$1" | cut -d'|' -f2)
    targs=$(echo "$1" | cut -d'|' -f3); steps=$(echo "$1" | cut -d'|' -f4)
    out="$TMP/$name-$2-$3-$4"
    if [ "$3" = torch ]; then
        # shellcheck disable=SC2086
        # Debian's torch multiplies on OpenBLAS's pthread build, whose threads
        # torch.set_num_threads does not bound: without this, "1 thread" ran
        # its GEMMs on both cores and 2 threads ran four
        OPENBLAS_NUM_THREADS="$2" OMP_NUM_THREADS="$2" \
            $PY scripts/bench/torch_gpt2.py $targs --threads "$2" --steps "$steps" --data "$DATA" \
            > "$out.torch"
        return
    fi
    isa=""; case $3 in *@*) isa=${3#*@} ;; esac
    run_config=${3%@*}; gemm=${run_config%-*}; precision=${run_config#*-}
    # shellcheck disable=SC2086
    LOOM_MAX_ISA="$isa" "$LOOM" train scripts/bench/gpt2-small.cfg $sets --set train.steps="$steps" \
        --set train.threads="$2" --set model.gemm="$gemm" --set train.precision="$precision" \
        --set data.train="$DATA" --metrics "$out.jsonl" > "$out.log" 2>&1 ||
        { cat "$out.log" >&2; exit 1; }
}

echo "bench-train.sh: $REPS repeats of $(echo "$CONFIGS" | wc -w) configurations x 2 shapes x 2 thread counts" >&2
for rep in $(seq 1 "$REPS"); do
    echo "$SHAPES" | while IFS= read -r shape; do
        for threads in 1 2; do
            # rotate the order each repeat so no configuration always goes first
            order=$(echo "$CONFIGS" | tr ' ' '\n' | awk -v r="$rep" '{a[NR]=$0} END {for (i = 0; i < NR; i++) print a[(i + r - 1) % NR + 1]}')
            for c in $order; do
                run "$shape" "$threads" "$c" "$rep"
            done
            echo "  repeat $rep, $(echo "$shape" | cut -d'|' -f1), $threads thread(s) done" >&2
        done
    done
done

nproc_now=$(nproc)
cpu=$(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1)
TORCH_VERSION=$($PY -c 'import torch; print(torch.__version__)')
$PY - "$TMP" "$REPS" "$TORCH_VERSION" "$nproc_now" "$cpu" "${OPENBLAS_CORETYPE:-unset}" > "$OUT.tmp" <<'PY'
import glob, json, os, re, statistics, sys
tmp, reps, torch_version, ncpu, cpu, coretype = sys.argv[1], int(sys.argv[2]), *sys.argv[3:]
shapes = [("gpt2-124m", "GPT-2 124M (L12 C768 V50304), B4 T256", 1024),
          ("small", "small (L6 C384 V8192), B4 T128", 512)]
configs = ["onednn-fp32", "onednn-bf16", "onednn-fp32@avx2", "onednn-bf16@avx2",
           "openblas-fp32", "openblas-bf16"]
med = statistics.median

def loom_run(name, threads, config, rep):
    base = f"{tmp}/{name}-{threads}-{config}-{rep}"
    rows = [json.loads(l) for l in open(base + ".jsonl")][1:]  # the first step warms up
    log = open(base + ".log").read()
    m = re.search(r"MFU against ([0-9.]+) GFLOP/s per rank \((.*?), measured at start on (\S+)\)", log)
    cpu = re.search(r"^cpu: (\S+)[^;]*; (.*)$", log, re.M)
    # null: loom train found the peak measured at start unreliable (MFU n/a)
    mfus = [r["mfu"] for r in rows if r["mfu"] is not None]
    return {"ms": med(r["step_ms"] for r in rows), "mfu": med(mfus) if mfus else float("nan"),
            "peak": float(m.group(1)), "library": m.group(2), "shape": m.group(3),
            "isa": cpu.group(1), "products": cpu.group(2),
            "kernels": {k: med(r.get("kernel_ms", {}).get(k, 0) for r in rows)
                        for k in rows[-1].get("kernel_ms", {})}}

def torch_ms(name, threads, rep):
    line = open(f"{tmp}/{name}-{threads}-torch-{rep}.torch").read()
    return float(re.search(r"step ([0-9.]+) ms", line).group(1))

print("# Training throughput: loom against PyTorch, oneDNN against OpenBLAS\n")
print("Generated by `sh scripts/bench-train.sh` (do not edit by hand). One rank;")
print(f"{cpu}, {ncpu} cores; `OPENBLAS_CORETYPE={coretype}`. Each row is the median over")
print(f"{reps} runs (the runs alternate which configuration goes first) of each run's")
print("median step time over its steps after the first. Both trainers run the same")
print("model (llm.c's GPT-2: tied LM head, tanh GELU, AdamW) on the same first batch of")
print(f"`examples/data/corpus.bin`; PyTorch {torch_version} is Debian's python3-torch, fp32.")
print("MFU counts 6 FLOPs per parameter per token plus causal attention, against the")
print("rate of the library the run multiplied on, in the run's dtype, measured by the run")
print("at start on the model's own MLP product (the peak column). bf16 runs keep")
print("parameters, gradients and saved activations in bf16 with fp32 master weights and")
print("Adam state; on oneDNN they multiply bf16 x bf16 with fp32 accumulation where the")
print("CPU has bf16 instructions, and in fp32 elsewhere and on OpenBLAS (which has no bf16")
print("product). The ISA column is loom's vector level (the kernels' versions, oneDNN's")
print("dispatch): the CPU's own, or `@avx2` runs under `LOOM_MAX_ISA=avx2`, an AVX2-only")
print("CPU's paths on this one. OpenBLAS picks its kernels itself (its core type).\n")

print("| model | threads | loom run | ISA | ms/step | tokens/s | MFU | peak GFLOP/s (library, dtype, ISA) | PyTorch ms/step | PyTorch / loom |")
print("|---|---|---|---|---|---|---|---|---|---|")
summary = {}
for name, title, tokens in shapes:
    for threads in (1, 2):
        t = med(torch_ms(name, threads, r) for r in range(1, reps + 1))
        for c in configs:
            runs = [loom_run(name, threads, c, r) for r in range(1, reps + 1)]
            ms, mfu, peak = med(x["ms"] for x in runs), med(x["mfu"] for x in runs), med(x["peak"] for x in runs)
            summary[(name, threads, c)] = (ms, mfu, runs)
            print(f"| {title} | {threads} | {c} | {runs[0]['isa']} | {ms:.1f} | {tokens / ms * 1e3:.0f} | {100 * mfu:.1f}% | "
                  f"{peak:.1f} ({runs[0]['library']}) | {t:.1f} | {t / ms:.2f} |")
        summary[(name, threads, "torch")] = t

# The ratio of two configurations' step times: the median of each repeat's
# own ratio. A repeat runs them one after the other, so a spell of a slower
# machine (here it comes and goes, minutes long) slows both alike.
def ratio(name, threads, slow, fast):
    def ms(c, r):
        return torch_ms(name, threads, r) if c == "torch" else loom_run(name, threads, c, r)["ms"]
    return med(ms(slow, r) / ms(fast, r) for r in range(1, reps + 1))

print("\n## Against the goals\n")
print("Each ratio is the median over the repeats of the repeat's own ratio (the two")
print("ran one after the other). PyTorch's MFU is its step's FLOPs against the same")
print("fp32 peak as loom's fp32 run: loom can be faster than PyTorch by at most that")
print("MFU's inverse, where loom's own products would run at the library's peak.\n")
print("| model | threads | fp32 (oneDNN) vs PyTorch | PyTorch MFU (fp32 peak) | bf16 vs fp32 (oneDNN) | MFU fp32 / bf16 (oneDNN) | oneDNN vs OpenBLAS, fp32 |")
print("|---|---|---|---|---|---|---|")
for name, title, _ in shapes:
    for threads in (1, 2):
        f32 = summary[(name, threads, "onednn-fp32")]
        b16 = summary[(name, threads, "onednn-bf16")]
        t = summary[(name, threads, "torch")]
        torch_mfu = f32[1] * f32[0] / t
        print(f"| {title} | {threads} | {ratio(name, threads, 'torch', 'onednn-fp32'):.2f}x | "
              f"{100 * torch_mfu:.1f}% | {ratio(name, threads, 'onednn-fp32', 'onednn-bf16'):.2f}x | "
              f"{100 * f32[1]:.1f}% / {100 * b16[1]:.1f}% | "
              f"{ratio(name, threads, 'openblas-fp32', 'onednn-fp32'):.2f}x |")

print("\n## The CPU's vector level against AVX2\n")
print("The same oneDNN runs at this CPU's level and under `LOOM_MAX_ISA=avx2`, fp32 and")
print("bf16; each MFU is against the peak its own run measured (library, dtype and level")
print("as it multiplied). Without bf16 instructions a bf16 run keeps its 16-bit storage")
print("and multiplies in fp32, so the goal there is to lose little against fp32 (bf16 /")
print("fp32 tokens/s at least 0.95x), and fp32 at 85% or more of its peak on 124M.\n")
print("| model | threads | ISA | fp32 ms/step | bf16 ms/step | bf16 / fp32 tokens/s | MFU fp32 / bf16 | peak GFLOP/s fp32 / bf16 | bf16 products |")
print("|---|---|---|---|---|---|---|---|---|")
for name, title, _ in shapes:
    for threads in (1, 2):
        for suffix in ("", "@avx2"):
            f32 = summary[(name, threads, "onednn-fp32" + suffix)]
            b16 = summary[(name, threads, "onednn-bf16" + suffix)]
            peaks = [med(x["peak"] for x in col[2]) for col in (f32, b16)]
            print(f"| {title} | {threads} | {f32[2][0]['isa']} | {f32[0]:.1f} | {b16[0]:.1f} | "
                  f"{ratio(name, threads, 'onednn-fp32' + suffix, 'onednn-bf16' + suffix):.2f}x | "
                  f"{100 * f32[1]:.1f}% / {100 * b16[1]:.1f}% | {peaks[0]:.1f} / {peaks[1]:.1f} | "
                  f"{b16[2][0]['products']} |")

print("\n## Where a step's time goes\n")
print("The per-kernel breakdown `loom train --metrics` writes (`kernel_ms`), medians,")
print("one table per shape and thread count, fp32 and bf16 side by side; the products")
print("(forward, to the input, to the weight, the LM head) apart from everything else.")
print("What the kinds leave of the step is the trainer's own work between units.\n")
for name, title, _ in shapes:
    for threads in (1, 2):
        cols = [summary[(name, threads, c)] for c in ("onednn-fp32", "onednn-bf16")]
        kinds = cols[0][2][0]["kernels"]
        if not kinds:
            continue
        def kind_ms(col, k):
            return med(x["kernels"].get(k, 0) for x in col[2])
        print(f"**{title}, {threads} thread{'s' if threads > 1 else ''}**\n")
        print(f"| kernel | onednn-fp32 ms/step | share | onednn-bf16 ms/step | share |")
        print("|---|---|---|---|---|")
        for k in sorted(kinds, key=lambda k: -kind_ms(cols[0], k)):
            cells = " | ".join(f"{kind_ms(col, k):.1f} | {100 * kind_ms(col, k) / col[0]:.1f}%"
                               for col in cols)
            print(f"| {k} | {cells} |")
        rest = " | ".join(f"{col[0] - sum(kind_ms(col, k) for k in kinds):.1f} | "
                          f"{100 * (1 - sum(kind_ms(col, k) for k in kinds) / col[0]):.1f}%"
                          for col in cols)
        print(f"| (outside the kernels) | {rest} |")
        print(f"| **step** | {cols[0][0]:.1f} | | {cols[1][0]:.1f} | |")
        print()
PY

# DDP's overlap, as before (2 ranks)
{
echo "## DDP: overlap of the gradient all-reduce with backward"
echo
echo "2 ranks (\`loom launch\`), GPT-2 L6 C384 V256, batch 8 × seq 128,"
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
      f"by {on - off:+.1f} ms, i.e. it hides {100 * (off - on) / comm:.0f}% of that time"
      f"{' (less than none: overlap costs more than it hides)' if on > off else ''}. "
      f"On this machine 2 ranks fill both "
      f"cores with compute, and moving the bytes needs a core too, so there is little "
      f"idle time for communication to hide in.")
PY
} >> "$OUT.tmp"
mv "$OUT.tmp" "$OUT"
echo "bench-train.sh: wrote $OUT" >&2
