#!/bin/sh
# Regenerate docs/benchmarks-ucx.md: comm-ucx (loom's own collectives over
# UCX) against comm-mpi (Open MPI) with `loom bench` at 2 and 4 local ranks,
# under `loom launch` and under mpirun, next to the machine's single-thread
# memcpy bandwidth, with the ratios issue 4's goals ask for.
#
#   usage: bash scripts/bench-ucx.sh [CONFIG]   (default examples/bench-compare.cfg)
#   env:   REPS=3      runs per configuration; each row is their median, and
#                      the runs alternate which backend goes first
#          LAUNCHERS="launch mpirun"   drop mpirun to skip it
#          BUILD=build the build directory to use
#          QUIET=1     before each run, wait (up to 10 min) until the machine
#                      is otherwise idle: for shared machines
#
# Writes docs/benchmarks-ucx.md (docs/benchmarks.md belongs to
# scripts/bench.sh). Needs python3 for the tables. Figures on a shared
# machine are noisy: run it when the machine is otherwise idle.
set -eu
cd "$(dirname "$0")/.."
CONFIG=${1:-examples/bench-compare.cfg}
REPS=${REPS:-3}
LAUNCHERS=${LAUNCHERS:-"launch mpirun"}
BUILD=${BUILD:-build}
LOOM=$BUILD/bin/loom
OUT=docs/benchmarks-ucx.md
[ -x "$LOOM" ] || { echo "bench-ucx.sh: $LOOM not built; run: bash scripts/setup.sh" >&2; exit 1; }
[ -f "$BUILD/lib/loom/libloom-comm-ucx.so" ] ||
    { echo "bench-ucx.sh: comm-ucx not built (Debian: apt-get install libucx-dev, then rebuild)" >&2; exit 1; }
command -v python3 >/dev/null || { echo "bench-ucx.sh: python3 is needed for the tables" >&2; exit 1; }
CC=${CC:-cc}
mkdir -p docs
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

"$CC" -O2 -o "$TMP/memcpy_bw" scripts/memcpy_bw.c
memcpy_runs() { for i in 1 2 3; do "$TMP/memcpy_bw"; done; }

# Wait until the CPUs were >= 90% idle over 2 s (QUIET=1 only).
wait_quiet() {
    [ "${QUIET:-0}" = 1 ] || return 0
    waited=0
    while [ "$waited" -lt 600 ]; do
        a=$(head -1 /proc/stat); sleep 2; b=$(head -1 /proc/stat)
        idle=$(echo "$a $b" | awk '{t1=0; for (i=2;i<=9;i++) t1+=$i; t2=0; for (i=13;i<=20;i++) t2+=$i;
                                    d=t2-t1; print (d > 0 ? int(100*($16-$5)/d) : 100)}')
        [ "$idle" -ge 90 ] && return 0
        waited=$((waited + 2))
    done
    echo "bench-ucx.sh: the machine stayed busy; measuring anyway" >&2
}
wait_quiet
memcpy_runs > "$TMP/memcpy.txt"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1
# One bench per op, so that a backend crashing on one op (Open MPI 4.1's
# libnbc overflows its stack in a 64 MiB MPI_Ireduce between ranks joined
# under loom launch) loses only that op's rows.
OPS="allreduce broadcast reduce allgather reducescatter alltoall sendrecv"
for launcher in $LAUNCHERS; do
    if [ "$launcher" = mpirun ] && ! command -v mpirun >/dev/null; then
        echo "bench-ucx.sh: mpirun not found, skipping it" >&2
        continue
    fi
    for n in 2 4; do
        rep=1
        while [ "$rep" -le "$REPS" ]; do
            order='["mpi","ucx"]'
            [ $((rep % 2)) -eq 0 ] && order='["ucx","mpi"]'
            wait_quiet
            echo "bench-ucx.sh: $launcher, $n ranks, run $rep of $REPS" >&2
            for op in $OPS; do
                base="$TMP/$launcher-$n-$rep-$op"
                set -- bench "$CONFIG" --set "bench.comms=$order" --set "bench.ops=$op" \
                    --set "plugins.path=$BUILD/lib/loom" --json "$base.json"
                if [ "$launcher" = mpirun ]; then
                    mpirun -np "$n" "$LOOM" "$@" > "$base.txt" 2>&1 || true
                else
                    "$LOOM" launch -n "$n" -- "$LOOM" "$@" > "$base.all" 2>&1 || true
                    sed -n 's/^\[0\] //p' "$base.all" > "$base.txt"
                    grep '^loom launch:' "$base.all" >> "$base.txt" || true
                fi
            done
            rep=$((rep + 1))
        done
    done
done
wait_quiet
memcpy_runs >> "$TMP/memcpy.txt"

cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
mem=$(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)
os=$(. /etc/os-release && echo "$PRETTY_NAME")
ompi=$(ompi_info --version 2>/dev/null | head -1 || echo "Open MPI not installed")
ucx=$(ucx_info -v 2>/dev/null | sed -n 's/^# *Version /UCX /p' | head -1)
[ -n "$ucx" ] || ucx="UCX $(pkg-config --modversion ucx 2>/dev/null || echo '?')"

python3 - "$TMP" "$CONFIG" "$REPS" "$cpu, $(nproc) cores, $mem, $os; $ompi; $ucx" "$(date -u +%Y-%m-%d)" \
    > "$OUT.tmp" <<'PY'
import glob, json, os, statistics, sys

tmp, config, reps, machine, date = sys.argv[1:6]
ops = ["allreduce", "broadcast", "reduce", "allgather", "reducescatter", "alltoall", "sendrecv"]
shown = [4, 64, 1024, 4096, 65536, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
memcpy = [float(x) for x in open(os.path.join(tmp, "memcpy.txt")).read().split()]
mc = statistics.median(memcpy)

def size_text(b):
    for unit, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= k and b % k == 0:
            return "%d %s" % (b // k, unit)
    return "%d B" % b

runs = {}  # (launcher, n) -> {(backend, op, size): [rows]}
failed = []  # runs without results, with the last lines they printed
for path in sorted(glob.glob(os.path.join(tmp, "*.txt"))):
    if os.path.basename(path) == "memcpy.txt":
        continue
    launcher, n, rep, op = os.path.basename(path)[:-4].split("-")
    rows = []  # one object a line, so a run that crashed keeps the rows it wrote
    try:
        for line in open(path[:-4] + ".json"):
            line = line.strip().rstrip(",")
            if line.startswith("{"):
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    pass
    except OSError:
        pass
    text = open(path, errors="replace").read()
    if not rows or ("# ok:" not in text and "# FAILED:" not in text):
        tail = [l.strip() for l in text.splitlines() if l.strip()][-3:]
        failed.append((launcher, n, rep, op, " / ".join(tail) or "no output"))
    d = runs.setdefault((launcher, int(n)), {})
    for r in rows:
        d.setdefault((r["backend"], r["op"], r["size"]), []).append(r)

def med(rows, key):
    return statistics.median(r[key] for r in rows)

out = []
w = out.append
w("# comm-ucx vs Open MPI")
w("")
w("Generated by `bash scripts/bench-ucx.sh %s` on %s (%s runs per configuration, each "
  "row the median; the runs alternate which backend goes first)." % (config, date, reps))
w("")
w("Machine: %s." % machine)
w("")
w("Single-thread memcpy of 64 MiB (`scripts/memcpy_bw.c`, median of %d runs before and after): "
  "**%.2f GB/s** (runs: %s)." % (len(memcpy), mc, ", ".join("%.2f" % x for x in memcpy)))
w("")
w("- **ucx**: comm-ucx, loom's own collectives over UCX tag matching (shared memory and cma on "
  "one host), algorithms chosen by size (its settings, with the thresholds, are listed in "
  "`plugins/comm-ucx/ucx_plugin.c`).")
w("- **mpi**: comm-mpi, Open MPI's non-blocking collectives. Under `loom launch` its ranks "
  "are joined singletons that talk TCP over loopback; under `mpirun` it uses shared memory "
  "(vader, with cma single copy), the stronger baseline.")
w("- time: the slowest rank's mean per op; busbw: nccl-tests' bus bandwidth (allreduce "
  "2(n-1)/n, allgather/reducescatter/alltoall (n-1)/n, the rest 1) in GB/s; ucx/mpi: busbw "
  "ratio, above 1 when ucx is faster. The 2-core machine runs 4 ranks oversubscribed.")
w("")
if failed:
    w("Runs that did not finish (left out of the medians):")
    w("")
    for launcher, n, rep, op, tail in failed:
        w("- %s, %s ranks, run %s, %s: `%s`" % (launcher, n, rep, op, tail.replace("`", "'")))
    w("")

summary = []
for (launcher, n) in sorted(runs, key=lambda k: (k[0] != "launch", k[1])):
    d = runs[(launcher, n)]
    wrong = sum(r["wrong"] for rows in d.values() for r in rows)
    w("## %d ranks, %s" % (n, "loom launch" if launcher == "launch" else "mpirun"))
    w("")
    w("| op | size | mpi time (us) | mpi busbw | ucx time (us) | ucx busbw | ucx/mpi |")
    w("|---|---:|---:|---:|---:|---:|---:|")
    big, small = {}, {}
    for op in ops:
        sizes = sorted({k[2] for k in d if k[1] == op})
        for s in sizes:
            m, u = d.get(("mpi", op, s)), d.get(("ucx", op, s))
            if m and u:
                mb, ub, mt, ut = med(m, "busbw_gbs"), med(u, "busbw_gbs"), med(m, "time_us"), med(u, "time_us")
                if s >= 1 << 20 and mb > 0:
                    big.setdefault(op, []).append(ub / mb)
                if s <= 4096:
                    small.setdefault(op, []).append(ut / mt)
            if s not in shown:
                continue
            cells = []
            for rows in (m, u):
                cells += ["%.1f" % med(rows, "time_us"), "%.3f" % med(rows, "busbw_gbs")] if rows else ["-", "-"]
            ratio = "%.2f" % (med(u, "busbw_gbs") / med(m, "busbw_gbs")) if m and u and med(m, "busbw_gbs") > 0 else "-"
            w("| %s | %s | %s | %s |" % (op, size_text(s), " | ".join(cells), ratio))
    w("")
    w("%d wrong results over all runs." % wrong)
    w("")
    ar = d.get(("ucx", "allreduce", 64 << 20))
    summary.append((launcher, n, big, small, med(ar, "busbw_gbs") if ar else None, wrong))

w("## Goals")
w("")
w("Issue 4 asks for ucx busbw >= mpi busbw for every collective at >= 1 MiB, small-message "
  "(<= 4 KiB) latency within 1.5x of mpi, and allreduce busbw at 64 MiB >= 50% of single-core "
  "memcpy. Ratios over every size of the range (medians of the runs):")
w("")
w("| ranks | launcher | op | ucx/mpi busbw >= 1 MiB (min, median) | ucx/mpi time <= 4 KiB (max, median) |")
w("|---:|---|---|---:|---:|")
for launcher, n, big, small, ar, wrong in summary:
    for op in ops:
        b, s = big.get(op), small.get(op)
        bt = "%.2f, %.2f" % (min(b), statistics.median(b)) if b else "-"
        st = "%.2f, %.2f" % (max(s), statistics.median(s)) if s else "-"
        w("| %d | %s | %s | %s | %s |" % (n, launcher, op, bt, st))
w("")
w("| ranks | launcher | allreduce 64 MiB busbw | / memcpy %.2f GB/s |" % mc)
w("|---:|---|---:|---:|")
for launcher, n, big, small, ar, wrong in summary:
    if ar is not None:
        w("| %d | %s | %.2f GB/s | %.0f%% |" % (n, launcher, ar, 100 * ar / mc))
w("")
w("## What bounds these numbers")
w("")
w("- **One copy per byte.** On one host both backends move a message with a single kernel "
  "copy (UCX's cma rendezvous; Open MPI's vader with cma single-copy under mpirun). For "
  "broadcast, allgather, alltoall and sendrecv that copy is all the work, so under mpirun "
  "the two can at best tie, and their ratios at >= 1 MiB scatter around 1: nothing moves a "
  "byte with less than one copy. (Timing one size of one op with the two backends "
  "interleaved, which cancels the machine's drift — `tests/ucx/ucx_ab.c` — gives 0.9 to 1.1 "
  "for these at most sizes.)")
w("- **Reductions** (allreduce, reduce, reducescatter) are where the algorithms matter: ucx "
  "receives a chunk into a small buffer that stays in cache and reduces it from there while "
  "the next chunk moves, and reduces each block once, where it ends.")
w("- **Oversubscription.** 4 ranks share 2 cores, and with cma the receiving rank's core does "
  "the copy. A 64 MiB ring allreduce at n ranks has each rank copy 2(n-1)/n and reduce "
  "(n-1)/n of the vector. At 2 ranks on 2 cores that is 1.5 vectors copied or reduced per "
  "core, so busbw (vector / time) is at most 2/3 of memcpy, less since a reduction moves "
  "more bytes than a copy; at 4 ranks on 2 cores it is 4.5 vectors per core for a busbw "
  "numerator of 1.5 vectors: at most 1/3 of memcpy, whatever the algorithm. The "
  "50%-of-memcpy goal can be met at 2 ranks only; at 4 ranks the table shows how close to "
  "the 1/3 bound ucx gets.")
w("- **comm-mpi under loom launch** joins singleton MPI processes through ompi-server, so "
  "Open MPI cannot use shared memory between them and falls back to TCP on loopback: "
  "mpirun is the fair comparison, loom launch the one a loom job gets.")
w("- **Missing rows.** Under loom launch, Open MPI 4.1's libnbc overflows its stack (endless "
  "NBC_Progress recursion) in comm-mpi's 64 MiB MPI_Ireduce at 2 ranks; each op runs as its "
  "own bench so only that op's later rows are lost (listed at the top).")
w("- **Noise.** The machine is shared; memcpy itself varies by 2x between runs. Small sizes "
  "take a few microseconds, so one descheduling in 20 iterations moves a row: the max "
  "columns above are noisier than the medians.")
w("")
print("\n".join(out))
PY
mv "$OUT.tmp" "$OUT"
echo "bench-ucx.sh: wrote $OUT"
