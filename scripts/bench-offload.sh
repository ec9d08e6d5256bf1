#!/bin/sh
# Regenerate docs/benchmarks-offload.md: a GPT-2 of over 100M parameters
# trained with zero3 at 1 and 2 ranks with no offload, ZeRO-Offload
# (optimizer state on nvme) and ZeRO-Infinity (parameters and gradients
# too), prefetch 0, 1 and 2: step time, tokens/s, bytes moved per step, the
# tier bandwidth achieved (bytes over the time the memory lane of the trace
# was busy) against the disk's plain O_DIRECT bandwidth measured by `loom
# bench` in the same run, and host bytes per rank; then the largest model
# that trains within a 1 GiB host budget with and without offload. Figures
# on a shared 2-core machine are noisy: compare rows of one run side by side.
#   usage: sh scripts/bench-offload.sh [LOOM]     (default build/bin/loom)
#   TIERDIR: the nvme tier's directory, on the disk to measure (default
#   /var/tmp/loom-bench-offload); STEPS (default 4, the first warms up)
set -eu
cd "$(dirname "$0")/.."
LOOM=${1:-build/bin/loom}
OUT=docs/benchmarks-offload.md
PY=/usr/bin/python3
[ -x "$LOOM" ] || { echo "bench-offload.sh: $LOOM not built; run: bash scripts/setup.sh" >&2; exit 1; }
PLUGINS=$(cd "$(dirname "$LOOM")/../lib/loom" && pwd)
[ -f "$PLUGINS/libloom-memtier-nvme.so" ] || { echo "bench-offload.sh: no nvme tier in $PLUGINS (liburing-dev missing?)" >&2; exit 1; }
TIERDIR=${TIERDIR:-/var/tmp/loom-bench-offload}
mkdir -p "$TIERDIR"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
export OMPI_MCA_rmaps_base_oversubscribe=1
mkdir -p docs

STEPS=${STEPS:-4}
# 16 blocks of C = 768: 113.6M parameters (GPT-2 small's blocks, byte vocabulary)
MODEL="--set model.layers=16 --set model.channels=768 --set model.heads=12 --set model.max_seq=64 --set train.seq=64"
OPTIMIZER="--set memory.offload.optimizer=nvme --set memory.offload.path=$TIERDIR"
INFINITY="$OPTIMIZER --set memory.offload.params=nvme"

# train NAME RANKS [--set ...]: metrics in NAME.jsonl, trace in NAME.json
train() {
    tr_name=$1; tr_ranks=$2; shift 2
    # shellcheck disable=SC2086
    "$LOOM" launch -n "$tr_ranks" -- "$LOOM" train examples/train.cfg --set data.val="" \
        --set plugins.path="[\"$PLUGINS\"]" --set parallel.dp.size="$tr_ranks" \
        --set parallel.dp.strategy=zero3 --set train.batch="$tr_ranks" \
        --set train.steps="$STEPS" --set train.peak_gflops=100 $MODEL "$@" \
        --metrics "$TMP/$tr_name.jsonl" --trace "$TMP/$tr_name.json" > "$TMP/$tr_name.log" 2>&1 ||
        { cat "$TMP/$tr_name.log" >&2; exit 1; }
}

# row NAME LABEL PREFETCH RAW_READ RAW_WRITE: one table row
row() {
    $PY - "$TMP/$1" "$2" "$3" "$4" "$5" <<'PY'
import json, statistics, sys
base, label, prefetch, raw_r, raw_w = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), float(sys.argv[5])
steps = [json.loads(l) for l in open(base + ".jsonl")]
later = steps[1:] or steps                 # the first step warms up
ms = statistics.median(s["step_ms"] for s in later)
tps = statistics.median(s["tokens_per_s"] for s in later)
mib = lambda b: b / 2**20
read = statistics.median(sum(s["tier_bytes"]["read"].values()) for s in later)
written = statistics.median(sum(s["tier_bytes"]["written"].values()) for s in later)
wait = statistics.median(s["tier_wait_ms"] for s in later)
host = steps[-1]["peak_bytes"]["host"]
ev = [e for e in json.load(open(base + ".json"))["traceEvents"] if e.get("ph") == "X" and e["pid"] == 0]
starts = sorted(e["ts"] for e in ev if e["tid"] == 0 and e["name"] == "forward embedding")
t0 = starts[1] if len(starts) > 1 else 0
# the tier's efficiency: rank 0's transfers as the tier timed them ("nvme
# read", "nvme write" on the memory lane) from step 2 on; the time the disk
# would need for those bytes at the limits measured idle (reads at the read
# limit, writes at the write limit) over the time any of them was in flight
spans = sorted((e["ts"], e["ts"] + e["dur"], e.get("args", {}).get("bytes", 0), e["name"])
               for e in ev if e["tid"] == 2 and e["name"] in ("nvme read", "nvme write") and e["ts"] >= t0)
busy, end, rb, wb = 0.0, -1.0, 0, 0
for s0, f, b, name in spans:
    if name == "nvme read":
        rb += b
    else:
        wb += b
    if f > end:
        busy += f - max(s0, end)
        end = f
need = (rb / raw_r + wb / raw_w) / 1e3 if raw_r > 0 and raw_w > 0 else 0  # µs
nsteps = max(1, len(starts) - 1)
eff = f"{busy / 1e3 / nsteps:.0f} ({100 * need / busy:.0f}%)" if busy > 0 else "-"
print(f"| {label} | {prefetch} | {ms:.0f} | {tps:.0f} | {mib(read):.0f} / {mib(written):.0f} | "
      f"{wait:.0f} | {eff} | {mib(host['params']):.0f} | "
      f"{mib(host['grads']):.0f} | {mib(host['optimizer']):.0f} | {mib(host['activations']):.0f} | "
      f"{mib(host['total']):.0f} |")
PY
}

# The disk's limit, measured now: plain O_DIRECT at the tier's block size
# and queue depth (1 MiB, 8), beside the tier itself.
"$LOOM" bench examples/bench-tiers.cfg --set plugins.path="[\"$PLUGINS\"]" \
    --set memory.offload.path="$TIERDIR" \
    --set 'bench.tier_block_bytes=[1048576]' --set 'bench.tier_queue_depths=[1, 8]' \
    --set bench.tier_bytes=1073741824 --json "$TMP/tiers.json" > "$TMP/tiers.log" 2>&1 ||
    { cat "$TMP/tiers.log" >&2; exit 1; }
set -- $($PY - "$TMP/tiers.json" <<'PY'
import json, sys
rows = [r for r in json.load(open(sys.argv[1])) if r["tier"] == "nvme" and r["queue_depth"] == 8]
print(rows[0]["raw_read_gbs"], rows[0]["raw_write_gbs"])
PY
)
RAW_READ=$1 RAW_WRITE=$2

{
    echo "# Offload benchmarks"
    echo
    echo "Generated by \`sh scripts/bench-offload.sh\` on $(date -u +%Y-%m-%d) ($(nproc) cores,"
    echo "$(uname -m)); the nvme tier in \`$TIERDIR\` ($(df -T "$TIERDIR" | awk 'NR == 2 { print $2 }') on $(df "$TIERDIR" | awk 'NR == 2 { print $1 }'))."
    echo "Timings on a shared 2-core machine are noisy: compare rows of one run side"
    echo "by side; medians over steps 2 to $STEPS."
    echo
    echo "## The tier against the disk"
    echo
    echo "\`loom bench\` with \`bench.tiers = [\"host\", \"nvme\"]\`: 1 GiB written then read back"
    echo "through the tier (1 MiB blocks), beside the same bytes moved by plain"
    echo "O_DIRECT \`pwrite\`/\`pread\` from as many threads as the queue is deep — the"
    echo "limit the tier is held to, from the same memory. The tier adds a CRC32C per"
    echo "block, computed while the I/O is in flight; it moves the caller's memory"
    echo "in place, registered with io_uring."
    echo
    echo '```'
    grep -v -e "^$" -e "^memtier-nvme:" "$TMP/tiers.log"
    echo '```'
    echo
    echo "## Training a 113.6M-parameter GPT-2 with zero3"
    echo
    echo "16 blocks of 768 channels, 12 heads, sequences of 64 tokens, one per rank,"
    echo "fp32. *none*: everything in host memory; *optimizer*: ZeRO-Offload (Adam's"
    echo "moments on nvme; fp32 parameters are their own master weights); *infinity*:"
    echo "ZeRO-Infinity (also the parameter and gradient shards). Moved: tier bytes"
    echo "read / written per step; wait: time hooks sat waiting for the tier per step;"
    echo "disk busy: time per step some tier transfer was in flight (the tier's own"
    echo "spans on the memory lane of the trace), and in brackets the share of it the"
    echo "plain O_DIRECT limits measured above ($RAW_READ GB/s read, $RAW_WRITE GB/s write"
    echo "at queue depth 8) would need for the same bytes: the tier's efficiency while"
    echo "training, reads and writes together. Host: peak MiB per rank by purpose."
    echo
    for ranks in 1 2; do
        echo "### $ranks rank$( [ "$ranks" = 1 ] || echo s)"
        echo
        echo "| offload | prefetch | step (ms) | tokens/s | moved (MiB r/w) | wait (ms) | disk busy (ms, of limit) | params | grads | optimizer | activations | host total |"
        echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
        for mode in none optimizer infinity; do
            for prefetch in 0 1 2; do
                case $mode in none) extra="" ;; optimizer) extra=$OPTIMIZER ;; infinity) extra=$INFINITY ;; esac
                # shellcheck disable=SC2086
                train "$mode$ranks$prefetch" "$ranks" --set parallel.dp.prefetch=$prefetch $extra
                row "$mode$ranks$prefetch" "$mode" "$prefetch" "$RAW_READ" "$RAW_WRITE"
            done
        done
        echo
    done
} > "$TMP/tables.md"

# fits LAYERS EXTRA...: one step of zero3 at C = 768 within a 1 GiB host budget
fits() {
    fl=$1; shift
    # shellcheck disable=SC2086
    "$LOOM" train examples/train.cfg --set data.val="" --set plugins.path="[\"$PLUGINS\"]" \
        --set parallel.dp.size=1 --set parallel.dp.strategy=zero3 --set train.batch=1 \
        --set train.steps=1 $MODEL --set model.layers="$fl" \
        --set memory.host_limit=1073741824 "$@" > "$TMP/fits.log" 2>&1
}

# largest EXTRA...: the most blocks (up to 96) that fit, by bisection
largest() {
    lo=1; hi=96
    fits "$hi" "$@" && { echo "$hi+"; return; }
    while [ $((hi - lo)) -gt 1 ]; do
        mid=$(((lo + hi) / 2))
        if fits "$mid" "$@"; then lo=$mid; else hi=$mid; fi
    done
    echo "$lo"
}

params() { $PY -c "L=int('$1'.rstrip('+')); C=768; print(f'{(L*(12*C*C+13*C)+256*C+64*C+2*C)/1e6:.1f}M')"; }
none_max=$(largest)
# shellcheck disable=SC2086
offload_max=$(largest $INFINITY)
fits "${none_max%+}"
none_line=$(grep "^step" "$TMP/fits.log" | tail -n 1 | sed 's/.*peak host: //')
fits $((${none_max%+} + 1)) || true
refusal=$(grep "memory.host_limit" "$TMP/fits.log" | sed 's/^loom train: //')

{
    cat "$TMP/tables.md"
    echo "## The largest model within a 1 GiB host budget"
    echo
    echo "\`memory.host_limit = 1073741824\`, zero3 on one rank, C = 768, one sequence of"
    echo "64 tokens, blocks added until the accounting refuses (bisection up to 96"
    echo "blocks):"
    echo
    echo "| offload | blocks | parameters |"
    echo "|---|---|---|"
    echo "| none | $none_max | $(params "$none_max") |"
    echo "| infinity (optimizer, parameters and gradients on nvme) | $offload_max | $(params "$offload_max") |"
    echo
    echo "(96+: the search stops at 96 blocks; the disk, not the host budget, bounds it.)"
    echo
    echo "Without offload at $none_max blocks the host peaks at: $none_line. One block more is"
    echo "refused, with the offload that would fit:"
    echo
    echo '```'
    echo "$refusal"
    echo '```'
    echo
    echo "## Reading the tables"
    echo
    echo "- Offload costs what the disk cannot hide: ZeRO-Offload moves the Adam"
    echo "  moments in and out once per step; the optimizer step reads unit i+1"
    echo "  and writes unit i-1 while it steps unit i, and the *wait* column is what"
    echo "  that did not hide. ZeRO-Infinity also reads each parameter shard twice"
    echo "  (forward and backward gathers) and every gradient shard for the norm,"
    echo "  the step and each accumulation."
    echo "- While training, reads and writes share the disk (the next unit read"
    echo "  while the last is written), which this virtual disk serves more slowly"
    echo "  than either alone; the I/O thread's checksums and the disk's DMA also"
    echo "  share the memory bus (and at 2 ranks the 2 cores) with AdamW and the"
    echo "  GEMMs. Reusing staging memory instead of allocating it afresh was tried"
    echo "  and gained under 10%."
    echo
    echo "The budget covers everything loom accounts (model state, activations,"
    echo "communication and tier staging). The initial weights are built once"
    echo "before the first step outside it (4 bytes per parameter), and the"
    echo "nvme tier's disk holds 16 bytes per parameter."
} > "$OUT"
echo "wrote $OUT"
