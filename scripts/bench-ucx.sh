#!/bin/sh
# Regenerate docs/benchmarks-ucx.md: comm-ucx (loom's own collectives over
# UCX) with `loom bench` at 2 and 4 local ranks, under `loom launch` and
# under mpirun, next to Open MPI (comm-mpi), UCC's ucc_perftest when given,
# and the machine's single-thread memcpy bandwidth, with the ratios issue
# 18's goals ask for and every row that misses one.
#
#   usage: bash scripts/bench-ucx.sh [CONFIG]   (default examples/bench-compare.cfg)
#   env:   REPS=3      runs per configuration; each row is their median, and
#                      every run alternates the backends and launchers
#          BUILD=build the build directory to use
#          QUIET=1     before each run, wait (up to 10 min) until the machine
#                      is otherwise idle: for shared machines
#          UCC_PERFTEST=/path/ucc_perftest        UCC's perftest, built by
#          UCC_PERFTEST_YIELD=/path/ucc_perftest  hand (this script never
#                      builds UCC; docs/benchmarks-ucx.md says how it was
#                      built): the second with yielding waits, used where
#                      ranks outnumber cores; without them no UCC column
#          UCC_LIB=/path/lib  LD_LIBRARY_PATH for UCC's ranks
#          KEEP=DIR    keep every run's raw output (--json rows, logs) in DIR
#          FROM=DIR    measure nothing: write the tables from the runs KEEP
#                      kept in DIR
#
# Writes docs/benchmarks-ucx.md (docs/benchmarks.md belongs to
# scripts/bench.sh). Needs python3 for the tables. Figures on a shared
# machine are noisy: run it when the machine is otherwise idle.
set -eu
cd "$(dirname "$0")/.."
CONFIG=${1:-examples/bench-compare.cfg}
REPS=${REPS:-3}
BUILD=${BUILD:-build}
LOOM=$BUILD/bin/loom
OUT=docs/benchmarks-ucx.md
UCC_PERFTEST=${UCC_PERFTEST:-}
UCC_PERFTEST_YIELD=${UCC_PERFTEST_YIELD:-$UCC_PERFTEST}
UCC_LIB=${UCC_LIB:-}
[ -x "$LOOM" ] || { echo "bench-ucx.sh: $LOOM not built; run: bash scripts/setup.sh" >&2; exit 1; }
[ -f "$BUILD/lib/loom/libloom-comm-ucx.so" ] ||
    { echo "bench-ucx.sh: comm-ucx not built (Debian: apt-get install libucx-dev, then rebuild)" >&2; exit 1; }
command -v python3 >/dev/null || { echo "bench-ucx.sh: python3 is needed for the tables" >&2; exit 1; }
command -v mpirun >/dev/null || { echo "bench-ucx.sh: mpirun is needed (launch against mpirun is the point)" >&2; exit 1; }
CC=${CC:-cc}
mkdir -p docs
TMP=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] && mkdir -p "$KEEP" && cp -r "$TMP"/. "$KEEP"/; rm -rf "$TMP"' EXIT
if [ -n "${FROM:-}" ]; then
    [ -f "$FROM/memcpy.txt" ] || { echo "bench-ucx.sh: $FROM holds no runs kept by KEEP" >&2; exit 1; }
    cp -r "$FROM"/. "$TMP"/
    REPS=$(ls "$TMP"/mpirun-ucx-2-*-allreduce.json | wc -l)
fi

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
# Open MPI's singletons (comm-mpi under loom launch) leave their orted
# daemons running for a second or two after the job, on the cores the next
# run measures with: its first sizes ran up to 1.5x slower. Each run starts
# when they are gone (at most 10 s).
settle() {
    i=0
    while pgrep -x orted >/dev/null && [ "$i" -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
}
# The machine's load while measuring, for the document.
load_sample() { cut -d' ' -f1 /proc/loadavg >> "$TMP/load.txt"; }
# Every run, into $TMP.
measure() {
    wait_quiet
    memcpy_runs > "$TMP/memcpy.txt"

    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1
    # One bench per op and backend, so that a backend crashing on one op (Open
    # MPI 4.1's libnbc overflows its stack in a 64 MiB MPI_Ireduce between ranks
    # joined under loom launch) loses only that op's rows, and no backend shares
    # a process with another.
    OPS="allreduce broadcast reduce allgather reducescatter alltoall sendrecv"
    ucc_name() {
        case $1 in broadcast) echo bcast ;; reducescatter) echo reduce_scatter ;;
            sendrecv) echo "" ;; *) echo "$1" ;; esac
    }
    # loom's size of allgather, reducescatter and alltoall is the whole buffer;
    # ucc_perftest counts elements per rank
    per_rank() { case $1 in allgather | reducescatter | alltoall) echo "$2" ;; *) echo 1 ;; esac; }
    max_bytes=$(sed -n 's/^ *max_bytes *= *\([0-9]*\).*/\1/p' "$CONFIG" | head -1)
    min_bytes=$(sed -n 's/^ *min_bytes *= *\([0-9]*\).*/\1/p' "$CONFIG" | head -1)
    iters=$(sed -n 's/^ *iters *= *\([0-9]*\).*/\1/p' "$CONFIG" | head -1)
    warmup=$(sed -n 's/^ *warmup *= *\([0-9]*\).*/\1/p' "$CONFIG" | head -1)
    rep=1
    while [ "$rep" -le "$REPS" ]; do
        for n in 2 4; do
            wait_quiet
            load_sample
            echo "bench-ucx.sh: $n ranks, run $rep of $REPS" >&2
            for op in $OPS; do
                # alternate which goes first, run to run
                # ucx as UCC times (each op alone after a barrier) for the
                # comparison with it, and back to back (as nccl-tests) elsewhere
                runs="launch:ucx mpirun:ucx mpirun:ucxbarrier ucc mpirun:mpi launch:mpi"
                [ $((rep % 2)) -eq 0 ] &&
                    runs="ucc mpirun:ucxbarrier mpirun:ucx launch:ucx launch:mpi mpirun:mpi"
                for run in $runs; do
                    settle
                    if [ "$run" = ucc ]; then
                        uop=$(ucc_name "$op")
                        ucc=$UCC_PERFTEST
                        [ "$n" -gt "$(nproc)" ] && ucc=$UCC_PERFTEST_YIELD
                        [ -n "$ucc" ] && [ -n "$uop" ] || continue
                        per=$(per_rank "$op" "$n")
                        b=$((min_bytes / 4 / per)); [ "$b" -ge 1 ] || b=1
                        mpirun -np "$n" -x LD_LIBRARY_PATH="$UCC_LIB" "$ucc" -c "$uop" -b "$b" \
                            -e $((max_bytes / 4 / per)) -d float32 -n "$iters" -w "$warmup" \
                            > "$TMP/ucc-$n-$rep-$op.txt" 2>&1 || true
                        continue
                    fi
                    launcher=${run%%:*} backend=${run#*:} barrier=false
                    base="$TMP/$launcher-$backend-$n-$rep-$op"
                    [ "$backend" = ucxbarrier ] && backend=ucx barrier=true
                    set -- bench "$CONFIG" --set "bench.comms=[\"$backend\"]" --set "bench.ops=[\"$op\"]" \
                        --set "plugins.path=[\"$BUILD/lib/loom\"]" --set "bench.barrier=$barrier" \
                        --json "$base.json"
                    if [ "$launcher" = mpirun ]; then
                        mpirun -np "$n" "$LOOM" "$@" > "$base.txt" 2>&1 || true
                    else
                        "$LOOM" launch -n "$n" -- "$LOOM" "$@" > "$base.all" 2>&1 || true
                        sed -n 's/^\[0\] //p' "$base.all" > "$base.txt"
                        grep '^loom launch:' "$base.all" >> "$base.txt" || true
                    fi
                done
            done
        done
        rep=$((rep + 1))
    done
    wait_quiet
    memcpy_runs >> "$TMP/memcpy.txt"
}
[ -n "${FROM:-}" ] || measure

cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
mem=$(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)
os=$(. /etc/os-release && echo "$PRETTY_NAME")
ompi=$(ompi_info --version 2>/dev/null | head -1 || echo "Open MPI not installed")
ucx=$(ucx_info -v 2>/dev/null | sed -n 's/^# *Version /UCX /p' | head -1)
[ -n "$ucx" ] || ucx="UCX $(pkg-config --modversion ucx 2>/dev/null || echo '?')"
ucc_version=""
[ -n "$UCC_PERFTEST" ] && ucc_version=$(LD_LIBRARY_PATH="$UCC_LIB" "$(dirname "$UCC_PERFTEST")/ucc_info" -v 2>/dev/null | head -1 || true)

python3 - "$TMP" "$CONFIG" "$REPS" "$cpu, $(nproc) cores, $mem, $os; $ompi; $ucx" "$(date -u +%Y-%m-%d)" \
    "$(nproc)" "${ucc_version:-}" > "$OUT.tmp" <<'PY'
import glob, json, os, statistics, sys

tmp, config, reps, machine, date, ncpu, ucc_version = sys.argv[1:8]
ncpu = int(ncpu)
ops = ["allreduce", "broadcast", "reduce", "allgather", "reducescatter", "alltoall", "sendrecv"]
memcpy = [float(x) for x in open(os.path.join(tmp, "memcpy.txt")).read().split()]
mc = statistics.median(memcpy)
loads = [float(x) for x in open(os.path.join(tmp, "load.txt")).read().split()]

def size_text(b):
    for unit, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= k and b % k == 0:
            return "%d %s" % (b // k, unit)
    return "%d B" % b

# t[(source, n, op, size)] = {run: time_us}; source: "ucx/launch",
# "ucx/mpirun", "mpi/launch", "mpi/mpirun", "ucc"
t, wrong, failed = {}, 0, []
for path in sorted(glob.glob(os.path.join(tmp, "*.json"))):
    launcher, backend, n, rep, op = os.path.basename(path)[:-5].split("-")
    rows = []  # one object a line, so a run that crashed keeps the rows it wrote
    for line in open(path):
        line = line.strip().rstrip(",")
        if line.startswith("{"):
            try:
                rows.append(json.loads(line))
            except ValueError:
                pass
    text = open(path[:-5] + ".txt", errors="replace").read()
    if not rows or ("# ok:" not in text and "# FAILED:" not in text):
        tail = [l.strip() for l in text.splitlines() if l.strip()][-3:]
        failed.append((backend, launcher, n, rep, op, " / ".join(tail) or "no output"))
    for r in rows:
        wrong += r["wrong"]
        t.setdefault(("%s/%s" % (backend, launcher), int(n), op, r["size"]), {})[rep] = r["time_us"]
        # "ucxbarrier/mpirun": ucx with each op timed alone, as UCC's
ucc_names = {"bcast": "broadcast", "reduce_scatter": "reducescatter"}
for path in glob.glob(os.path.join(tmp, "ucc-*.txt")):
    _, n, rep, op = os.path.basename(path)[:-4].split("-")
    n = int(n)
    per = n if op in ("allgather", "reducescatter", "alltoall") else 1
    got = 0
    for line in open(path, errors="replace"):
        f = line.split()
        # count, size (per rank), time avg, min, max: the slowest rank's, as loom's
        if len(f) >= 5 and f[0].isdigit() and f[1].isdigit():
            t.setdefault(("ucc", n, op, int(f[1]) * per), {})[rep] = float(f[4])
            got += 1
    if not got:
        failed.append(("ucc", "mpirun", n, rep, op, "no rows"))

def med(src, n, op, s):
    v = t.get((src, n, op, s))
    return statistics.median(v.values()) if v else None

# The ratio of two sources' bus bandwidths (b's time over a's): the median of
# each run's ratio. Within a run the two ran one after the other, so a spell
# of a slower machine (here it comes and goes, minutes long, and halves the
# rate of everything) slows both alike; the medians of each alone could come
# from different spells.
def ratio(a, n, op, s, b):
    va, vb = t.get((a, n, op, s), {}), t.get((b, n, op, s), {})
    runs = sorted(set(va) & set(vb))
    return statistics.median(vb[r] / va[r] for r in runs) if runs else None

have_ucc = any(k[0] == "ucc" for k in t)
out = []
w = out.append
w("# comm-ucx: against UCC and Open MPI, under loom launch and mpirun")
w("")
w("Generated by `bash scripts/bench-ucx.sh %s` on %s (%s runs per configuration, each "
  "row the median; every run alternates the backends and launchers)." % (config, date, reps))
w("")
w("Machine: %s." % machine)
w("Load average while measuring (one sample per configuration and run): median %.1f, "
  "max %.1f on %d cores%s." % (statistics.median(loads), max(loads), ncpu,
  "; other jobs shared the machine, so single rows are noisy" if max(loads) > 1.5 else ""))
w("")
w("Single-thread memcpy of 64 MiB (`scripts/memcpy_bw.c`, median of %d runs before and after): "
  "**%.2f GB/s** (runs: %s)." % (len(memcpy), mc, ", ".join("%.2f" % x for x in memcpy)))
w("")
w("- **ucx**: comm-ucx, loom's own collectives over UCX tag matching (shared memory and cma on "
  "one host), algorithms chosen by size (its settings, with the thresholds, are listed in "
  "`plugins/comm-ucx/ucx_plugin.c`). Under `loom launch` each rank is pinned to a core when "
  "the ranks fit (2 ranks here), as mpirun does; 4 ranks on 2 cores run unpinned under both.")
w("- **UCC**: UCC 1.3's `ucc_perftest` (tl/ucp over the same UCX), under mpirun; " +
  ("version: %s. " % ucc_version if ucc_version else "") +
  "Where ranks outnumber cores its busy-polling waits are replaced by yielding ones (see "
  "*By hand* below). Its time is the slowest rank's mean per op, each op timed alone after a "
  "barrier, as the **ucx per op** column's.")
w("- **mpi**: comm-mpi, Open MPI's non-blocking collectives: under `loom launch` joined "
  "singletons that talk TCP over loopback, under mpirun shared memory (vader).")
w("- time: the slowest rank's mean per op (us); **ucx mpirun**, **ucx launch** and the mpi "
  "columns time the iterations back to back (as nccl-tests), **ucx per op** each alone after "
  "a barrier (`bench.barrier = true`), as ucc_perftest times. Ratios are of bus bandwidth at "
  "the same size (the inverse ratio of times), above 1 when the first is faster, each the "
  "median of the runs' own ratios (the two ran one after the other): **l/m** ucx "
  "under loom launch over ucx under mpirun; **ucx/UCC** ucx per op over UCC; **ucx/mpi** "
  "back to back, under mpirun.")
w("- `loom bench` writes every input before its warm-up and checks the result of the timed "
  "iterations: %d wrong results over all runs." % wrong)
w("")
if failed:
    w("Runs that did not finish (left out of the medians):")
    w("")
    for backend, launcher, n, rep, op, tail in failed:
        w("- %s under %s, %s ranks, run %s, %s: `%s`" % (backend, launcher, n, rep, op,
                                                        tail.replace("`", "'")))
    w("")

# ---- goals
misses = {"ucc_bw": [], "ucc_lat": [], "launch": [], "collapse": []}
lat_rows, launch_rows = [], {2: [], 4: []}
for n in (2, 4):
    for op in ops:
        for s in sorted({k[3] for k in t if k[1] == n and k[2] == op}):
            lm = ratio("ucx/launch", n, op, s, "ucx/mpirun")
            vs_ucc = ratio("ucxbarrier/mpirun", n, op, s, "ucc")
            if lm and 8 <= s <= 64 << 20:
                launch_rows[n].append(lm)
                if lm < 0.9:
                    misses["launch"].append((n, op, size_text(s), lm))
            if vs_ucc and s >= 64 << 10 and vs_ucc < 1:
                misses["ucc_bw"].append((n, op, size_text(s), vs_ucc))
            if vs_ucc and n == 2 and s <= 4096:
                lat_rows.append(1 / vs_ucc)
                if vs_ucc < 1 / 1.5:
                    misses["ucc_lat"].append((n, op, size_text(s), 1 / vs_ucc))
            for src in ("ucx/mpirun", "ucx/launch", "ucxbarrier/mpirun"):
                v = med(src, n, op, s)
                # a wait that burns the core its peer needs: ms for what moves in us
                if v and s <= 64 << 10 and v > 1000:
                    misses["collapse"].append((n, op, size_text(s), v))

def listing(rows, fmt):
    return "; ".join(fmt % r for r in rows) if rows else "none"

w("## Goals (issue 18)")
w("")
w("| goal | result | rows that miss it |")
w("|---|---|---|")
if have_ucc:
    w("| ucx busbw >= UCC's from 64 KiB up, 2 and 4 ranks (mpirun) | %s | %s |" % (
        "met" if not misses["ucc_bw"] else "%d rows miss" % len(misses["ucc_bw"]),
        listing(misses["ucc_bw"], "%d ranks %s %s: %.2fx")))
    w("| small-op latency (<= 4 KiB) <= 1.5x UCC's at 2 ranks (mpirun) | %s | %s |" % (
        "met" if not misses["ucc_lat"] else "%d rows miss" % len(misses["ucc_lat"]),
        listing(misses["ucc_lat"], "%d ranks %s %s: %.2fx UCC's time")))
else:
    w("| ucx against UCC | not measured (no UCC_PERFTEST) | - |")
w("| no busy-poll collapse (no op of <= 64 KiB over 1 ms) | %s | %s |" % (
    "met" if not misses["collapse"] else "%d rows" % len(misses["collapse"]),
    listing(misses["collapse"], "%d ranks %s %s: %.0f us")))
w("| ucx under loom launch within 10%% of mpirun, 8 B - 64 MiB, 2 and 4 ranks | %s | %s |" % (
    "met" if not misses["launch"] else "%d rows miss" % len(misses["launch"]),
    listing(misses["launch"], "%d ranks %s %s: %.2fx")))
w("")
if lat_rows:
    w("Small-op latency at 2 ranks, ucx time / UCC time over every op and size <= 4 KiB: median "
      "%.2f, max %.2f." % (statistics.median(lat_rows), max(lat_rows)))
    w("")
for n, v in launch_rows.items():
    if v:
        v = sorted(v)
        w("ucx under loom launch over mpirun (bus bandwidth), %d ranks, over its %d rows: median "
          "%.2f, the middle 80%% of rows %.2f-%.2f; %d%% of rows within 10%%." % (
              n, len(v), statistics.median(v), v[len(v) // 10], v[9 * len(v) // 10],
              round(100 * sum(x >= 0.9 for x in v) / len(v))))
w("")

# ---- tables: every size 8 B - 64 MiB by fours, and the goal's boundaries
def shown(s):
    return s in (4, 64 << 10, 1 << 20, 64 << 20) or (s >= 8 and (s.bit_length() - 4) % 2 == 0)

for n in (2, 4):
    w("## %d ranks" % n)
    w("")
    w("| op | size | ucx mpirun | ucx launch | l/m | ucx per op | UCC | ucx/UCC | mpi mpirun | ucx/mpi | mpi launch |")
    w("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for op in ops:
        for s in sorted({k[3] for k in t if k[1] == n and k[2] == op}):
            if not shown(s):
                continue
            um, ul = med("ucx/mpirun", n, op, s), med("ucx/launch", n, op, s)
            ub = med("ucxbarrier/mpirun", n, op, s)
            cc, mm, ml = med("ucc", n, op, s), med("mpi/mpirun", n, op, s), med("mpi/launch", n, op, s)
            f = lambda v: ("%.2f" if v < 10 else "%.1f") % v if v else "-"
            r = lambda a, b: "%.2f" % ratio(a, n, op, s, b) if ratio(a, n, op, s, b) else "-"
            w("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                op, size_text(s), f(um), f(ul), r("ucx/launch", "ucx/mpirun"), f(ub), f(cc),
                r("ucxbarrier/mpirun", "ucc"), f(mm), r("ucx/mpirun", "mpi/mpirun"), f(ml)))
    w("")
    ar = med("ucx/mpirun", n, "allreduce", 64 << 20)
    if ar:
        w("Allreduce at 64 MiB under mpirun: busbw %.2f GB/s, %.0f%% of memcpy." % (
            (64 << 20) / ar / 1e3 * 2 * (n - 1) / n, 100 * (64 << 20) / ar / 1e3 * 2 * (n - 1) / n / mc))
        w("")
print("\n".join(out))
PY
# What was written by hand (how UCC was built and run, what the rows that
# miss a goal come from) stays: from its heading to the end of the old file.
if [ -f "$OUT" ] && grep -q '^## By hand' "$OUT"; then
    { echo; sed -n '/^## By hand/,$p' "$OUT"; } >> "$OUT.tmp"
fi
mv "$OUT.tmp" "$OUT"
echo "bench-ucx.sh: wrote $OUT"
