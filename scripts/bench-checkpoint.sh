#!/bin/sh
# Regenerate docs/benchmarks-checkpoint.md: what checkpoints cost a
# training run. A GPT-2 of 124M parameters (GPT-2 small's shape, its
# vocabulary, sequences of 64) trains STEPS steps on one rank, fp32, three
# ways: no checkpoints; a checkpoint every EVERY steps written on the
# training thread (synchronous); the same with train.checkpoint_async (the
# state copied to host memory, a thread writes it while training goes on).
# Each way runs REPEATS times; the figures are medians. Figures on a shared
# 2-core machine are noisy: compare the rows of one run side by side.
#   usage: sh scripts/bench-checkpoint.sh [LOOM]     (default build/bin/loom)
#   CKPTDIR: where the checkpoints go, on the disk to measure (default
#   /var/tmp/loom-bench-checkpoint; not a tmpfs); STEPS (default 12),
#   EVERY (default 4), REPEATS (default 3)
set -eu
cd "$(dirname "$0")/.."
LOOM=${1:-build/bin/loom}
OUT=docs/benchmarks-checkpoint.md
PY=/usr/bin/python3
[ -x "$LOOM" ] || { echo "bench-checkpoint.sh: $LOOM not built; run: bash scripts/setup.sh" >&2; exit 1; }
PLUGINS=$(cd "$(dirname "$LOOM")/../lib/loom" && pwd)
CKPTDIR=${CKPTDIR:-/var/tmp/loom-bench-checkpoint}
STEPS=${STEPS:-12}
EVERY=${EVERY:-4}
REPEATS=${REPEATS:-3}
mkdir -p "$CKPTDIR"
[ "$(df -T "$CKPTDIR" | awk 'NR == 2 { print $2 }')" != tmpfs ] ||
    { echo "bench-checkpoint.sh: $CKPTDIR is a tmpfs; set CKPTDIR to a directory on a disk" >&2; exit 1; }
LOAD=$(cut -d' ' -f1-3 /proc/loadavg)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP" "$CKPTDIR/run"' EXIT
mkdir -p docs

# GPT-2 small: 12 blocks of 768 channels, 12 heads, vocabulary 50257 padded
# to 50304; sequences of 64 tokens (wpe of 64 rows), one per step
MODEL="--set model.layers=12 --set model.channels=768 --set model.heads=12 --set model.vocab=50257
 --set model.padded_vocab=50304 --set model.max_seq=64 --set train.seq=64 --set train.batch=1"

# train NAME [--set ...]: metrics in NAME.jsonl; the checkpoint directory
# is emptied first (the page cache starts each run the same way)
train() {
    tr_name=$1; shift
    rm -rf "$CKPTDIR/run"
    sync
    # shellcheck disable=SC2086
    "$LOOM" train examples/train.cfg --set data.val="" --set plugins.path="[\"$PLUGINS\"]" \
        --set parallel.dp.size=1 --set train.steps="$STEPS" --set train.peak_gflops=100 \
        $MODEL "$@" --metrics "$TMP/$tr_name.jsonl" > "$TMP/$tr_name.log" 2>&1 ||
        { cat "$TMP/$tr_name.log" >&2; exit 1; }
}

CKPT="--set train.checkpoint_every=$EVERY --set train.keep_checkpoints=1 --set train.checkpoint_dir=$CKPTDIR/run"
for r in $(seq 1 "$REPEATS"); do
    for mode in none sync async; do
        case $mode in
        none) train "$mode$r" ;;
        # shellcheck disable=SC2086
        sync) train "$mode$r" $CKPT ;;
        # shellcheck disable=SC2086
        async) train "$mode$r" $CKPT --set train.checkpoint_async=true
            du -sb "$CKPTDIR/run/step-$STEPS" | cut -f1 > "$TMP/bytes" ;;
        esac
        echo "bench-checkpoint.sh: $mode, repeat $r of $REPEATS done" >&2
    done
done
params=$(sed -n 's/.*), \([0-9.]*M\) parameters.*/\1/p' "$TMP/none1.log")
snapshot=$(sed -n 's/^train.checkpoint_async: the snapshot takes \(.*\) of host memory.*/\1/p' "$TMP/async1.log")

$PY - "$TMP" "$STEPS" "$EVERY" "$REPEATS" "$(cat "$TMP/bytes")" > "$TMP/tables.md" <<'PY'
import json, statistics, sys
tmp, steps, every, repeats, nbytes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
med = statistics.median
# A checkpoint taken at the boundary after step k is in step k + 1's time
# (what the training thread spent on it then: all of it when synchronous;
# the copy to host memory, and the wait for the previous save if still
# written, when async); the boundaries inside the run are EVERY, 2 EVERY, ...
# below STEPS; the last step's checkpoint ends the run, outside any step.
after = {k + 1 for k in range(every, steps, every)}
def run(mode, r):
    return {s["step"]: s["step_ms"] for s in map(json.loads, open(f"{tmp}/{mode}{r}.jsonl"))}
rows = {}
for mode in ("none", "sync", "async"):
    runs = [run(mode, r) for r in range(1, repeats + 1)]
    # step 1 warms up
    with_ck = [ms for x in runs for s, ms in x.items() if s in after]
    without = [ms for x in runs for s, ms in x.items() if s > 1 and s not in after]
    total = [sum(ms for s, ms in x.items() if s > 1) for x in runs]
    rows[mode] = (with_ck, without, med(total))
base = rows["none"][2]
inside = len(after)
print("| checkpoints | step after a checkpoint (ms) | other steps (ms) | steps 2..%d (s) | cost per checkpoint (ms) |" % steps)
print("|---|---|---|---|---|")
cost = {}
for mode, label in (("none", "none"), ("sync", "synchronous"), ("async", "async")):
    with_ck, without, total = rows[mode]
    cost[mode] = (total - base) / inside if mode != "none" else 0.0
    print(f"| {label} | {med(with_ck):.0f} | {med(without):.0f} | {total / 1e3:.2f} | "
          + (f"{cost[mode]:.0f} |" if mode != "none" else "- |"))
# the synchronous save's time is the training thread's whole cost of it
sync_ms = med(rows["sync"][0]) - med(rows["none"][1])
print()
print(f"Checkpoint: {nbytes / 2**20:.0f} MiB (params, Adam m and v in fp32, and meta.loom); "
      f"written synchronously in {sync_ms:.0f} ms (the step after it less a step without): "
      f"{nbytes / 1e9 / (sync_ms / 1e3):.2f} GB/s with the CRC32C and the fsyncs.")
print()
ratio = cost["async"] / cost["sync"] if cost["sync"] > 0 else float("nan")
print(f"Cost per checkpoint, async against synchronous: {cost['async']:.0f} ms against "
      f"{cost['sync']:.0f} ms, a ratio of {ratio:.2f} (1/{1 / ratio:.1f})."
      if ratio > 0 else
      f"Cost per checkpoint, async against synchronous: {cost['async']:.0f} ms against "
      f"{cost['sync']:.0f} ms (async within the noise of no checkpoint at all).")
PY

{
    echo "# Checkpoint benchmarks"
    echo
    echo "Generated by \`sh scripts/bench-checkpoint.sh\` on $(date -u +%Y-%m-%d) ($(nproc) cores,"
    echo "$(uname -m), $(free -g | awk '/^Mem:/ { print $2 }') GiB); the checkpoints in \`$CKPTDIR\`"
    echo "($(df -T "$CKPTDIR" | awk 'NR == 2 { print $2 }') on $(df "$CKPTDIR" | awk 'NR == 2 { print $1 }'), the real disk, not a tmpfs)."
    echo "Timings on a shared 2-core machine are noisy (load average $LOAD at the"
    echo "start, other jobs running): compare the rows of one run side by side; the"
    echo "three ways take turns, repeat by repeat."
    echo
    echo "A $params-parameter GPT-2 (12 blocks of 768 channels, 12 heads, vocabulary"
    echo "50257 padded to 50304, sequences of 64 tokens, one per step), one rank, fp32,"
    echo "$STEPS steps; a checkpoint every $EVERY steps (\`train.keep_checkpoints = 1\`), three"
    echo "ways, each run $REPEATS times: no checkpoints; synchronous (the training thread"
    echo "writes); \`train.checkpoint_async = true\` (the state copied into a"
    echo "$snapshot host snapshot at the checkpoint step, a thread writes it while the"
    echo "next steps train)."
    echo
    echo "A step's time includes what the training thread spent on checkpoints at the"
    echo "boundary before it, so a checkpoint after step k shows in step k + 1. Step"
    echo "times are medians over the repeats of the steps right after a checkpoint"
    echo "(steps $($PY -c "print(', '.join(str(k + 1) for k in range($EVERY, $STEPS, $EVERY)))")) and of the others (the first, warming up, left out). Cost per"
    echo "checkpoint: the run's time over steps 2 to $STEPS less the same without"
    echo "checkpoints (medians over the repeats), over the $($PY -c "print(len(range($EVERY, $STEPS, $EVERY)))") checkpoints inside"
    echo "that span — for async this holds the copy, the writer thread's share of the"
    echo "two cores while the next steps train, and meta.loom and the rename once all"
    echo "is written. The last step's checkpoint ends the run (async waits for it) and"
    echo "is in no step."
    echo
    cat "$TMP/tables.md"
    echo
    echo "Where the async cost goes: the training thread only copies the state into"
    echo "the snapshot (the step after a checkpoint); the writer thread then moves"
    echo "the $snapshot through the page cache with its CRC32C and fsyncs it, taking"
    echo "CPU time the steps trained meanwhile would have had. On this machine every"
    echo "core is already busy (the load average above), so those steps run slower"
    echo "and most of the cost stays; with a core to spare it falls toward the copy."
} > "$OUT"
echo "wrote $OUT"
