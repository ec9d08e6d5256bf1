#!/bin/sh
# Fuzz loom's readers of outside input with libFuzzer (clang):
#
#   scripts/fuzz.sh [--build-only | --no-build] [--keep-going] [--runs N]
#                   [--markdown FILE] [SECONDS] [HARNESS...]
#
# Builds the harnesses of tests/fuzz into their own build directory
# (LOOM_FUZZ_BUILD, default build-fuzz: clang, LOOM_FUZZ=ON, everything
# under ASan and UBSan), then runs each harness for SECONDS (default 60;
# 0 runs the seed corpus only), or for N executions (--runs), on its seed
# corpus, tests/fuzz/corpus/<harness>, and the inputs that once crashed it,
# tests/fuzz/regressions/<harness>. The harnesses write each input into
# files under LOOM_FUZZ_TMPDIR (default /dev/shm when it is writable, else
# TMPDIR): on tmpfs the file-reading harnesses run up to 5 times faster.
# New inputs the fuzzer finds go to LOOM_FUZZ_BUILD/fuzz-corpus/<harness>,
# never into the source tree. Harnesses: config schedule llmc_checkpoint
# token_shard data_position ckpt (default: all).
#
# Prints each harness's executions, exec/s, crashes and corpus size, then
# a table of them; --markdown FILE also writes that table, the command and
# the machine as a page (docs/benchmarks-fuzz.md). A crash stops that
# harness (--keep-going: it fuzzes on and counts them) and the script exits
# 1 naming each reproducer, which the harness reruns alone:
# LOOM_FUZZ_BUILD/bin/fuzz_<harness> REPRODUCER.
set -u
cd "$(dirname "$0")/.."
SRC=$(pwd)
ALL="config schedule llmc_checkpoint token_shard data_position ckpt"
BUILD=${LOOM_FUZZ_BUILD:-build-fuzz}
JOBS=${LOOM_FUZZ_JOBS:-2}

COMMAND="scripts/fuzz.sh $*"
build=1 run=1 keep_going=0 runs="" markdown=""
while [ $# -gt 0 ]; do
    case "$1" in
    --build-only) run=0 ;;
    --no-build) build=0 ;;
    --keep-going) keep_going=1 ;;
    --runs)
        case "${2:-}" in
        '' | *[!0-9]*) echo "fuzz.sh: --runs needs a number of executions, e.g. --runs 1000000" >&2; exit 2 ;;
        esac
        runs=$2
        shift ;;
    --markdown)
        [ -n "${2:-}" ] || { echo "fuzz.sh: --markdown needs a file, e.g. --markdown docs/benchmarks-fuzz.md" >&2; exit 2; }
        markdown=$2
        shift ;;
    -h | --help) sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "fuzz.sh: unknown option '$1'; see scripts/fuzz.sh --help" >&2; exit 2 ;;
    *) break ;;
    esac
    shift
done
SECONDS_EACH=60
case "${1:-}" in
'' | *[!0-9]*) ;;
*) SECONDS_EACH=$1; shift ;;
esac
HARNESSES=${*:-$ALL}
for h in $HARNESSES; do
    case " $ALL " in
    *" $h "*) ;;
    *) echo "fuzz.sh: no harness '$h'; the harnesses are: $ALL" >&2; exit 2 ;;
    esac
done

CLANG=$(command -v clang || command -v clang-14 || true)
if [ $build = 1 ]; then
    CLANG=$(command -v clang || command -v clang-14 || true)
    if [ -z "$CLANG" ]; then
        echo "fuzz.sh: clang not found; libFuzzer needs it (Debian: apt-get install clang libclang-rt-14-dev)" >&2
        exit 2
    fi
    targets=""
    for h in $HARNESSES; do targets="$targets fuzz_$h"; done
    echo "fuzz.sh: building$targets in $BUILD"
    if ! CC=$CLANG cmake -S "$SRC" -B "$BUILD" -DLOOM_FUZZ=ON -DLOOM_WERROR=ON \
            -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$BUILD.configure.log" 2>&1; then
        cat "$BUILD.configure.log" >&2
        echo "fuzz.sh: configuring $BUILD failed (log above)" >&2
        exit 2
    fi
    rm -f "$BUILD.configure.log"
    # shellcheck disable=SC2086
    cmake --build "$BUILD" -j "$JOBS" --target $targets || {
        echo "fuzz.sh: building the harnesses failed" >&2
        exit 2
    }
fi
[ $run = 1 ] || exit 0

# Slow inputs and big allocations are findings too: 10 s per input, 2 GiB.
# UBSan stops at the first finding and libFuzzer saves the input. A small
# quarantine: libFuzzer checks for leaks after every input that allocated
# more than it freed (libconfig's own leak, suppressed, does that often),
# and the check scans the quarantine too; at the default 256 MiB it halves
# the config harness's rate.
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=0:detect_leaks=1:quarantine_size_mb=16}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
# leaks of the libraries loom uses, each explained there
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$SRC/tests/sanitize/lsan.supp:print_suppressions=0}
if [ -z "${LOOM_FUZZ_TMPDIR:-}" ] && [ -d /dev/shm ] && [ -w /dev/shm ]; then
    LOOM_FUZZ_TMPDIR=/dev/shm
fi
[ -z "${LOOM_FUZZ_TMPDIR:-}" ] || export TMPDIR="$LOOM_FUZZ_TMPDIR"
rows="" failed=0
for h in $HARNESSES; do
    bin=$BUILD/bin/fuzz_$h
    if [ ! -x "$bin" ]; then
        echo "fuzz.sh: $bin is missing; build it: scripts/fuzz.sh --build-only $h" >&2
        exit 2
    fi
    work=$BUILD/fuzz-corpus/$h
    artifacts=$BUILD/fuzz-artifacts/$h
    log=$BUILD/fuzz-logs/$h.log
    mkdir -p "$work" "$artifacts" "$(dirname "$log")"
    rm -f "$artifacts"/*
    seeds="$SRC/tests/fuzz/corpus/$h"
    [ -d "$SRC/tests/fuzz/regressions/$h" ] && seeds="$seeds $SRC/tests/fuzz/regressions/$h"
    if [ -n "$runs" ]; then
        limit="-runs=$runs"
    elif [ "$SECONDS_EACH" = 0 ]; then
        limit="-runs=0"
    else
        limit="-max_total_time=$SECONDS_EACH"
    fi
    mode=""
    [ $keep_going = 1 ] && mode="-fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1"
    start=$(date +%s)
    # shellcheck disable=SC2086
    "$bin" $limit $mode -print_final_stats=1 -timeout=10 -rss_limit_mb=2048 \
        -artifact_prefix="$artifacts/" "$work" $seeds >"$log" 2>&1
    rc=$?
    took=$(( $(date +%s) - start ))
    [ "$took" -gt 0 ] || took=1
    # stat:: lines (one process), else the last "#N" progress line (fork mode)
    execs=$(sed -n 's/^stat::number_of_executed_units: *\([0-9]*\).*/\1/p' "$log" | awk '{ n += $1 } END { print n + 0 }')
    if [ "$execs" = 0 ]; then
        execs=$(sed -n 's/^#\([0-9][0-9]*\).*/\1/p' "$log" | tail -n 1)
        execs=${execs:-0}
    fi
    rate=$(( execs / took ))
    crashes=$(find "$artifacts" -type f | wc -l)
    corpus=$(find "$work" -type f | wc -l)
    echo "fuzz: $h: $execs executions in $took s ($rate exec/s), $crashes crashes, corpus $corpus inputs"
    if [ "$crashes" -gt 0 ] || [ $rc != 0 ]; then
        failed=1
        if [ "$crashes" = 0 ]; then
            echo "fuzz: $h: the fuzzer failed with status $rc and left no reproducer; its log: $log" >&2
        fi
        for f in "$artifacts"/*; do
            [ -f "$f" ] || continue
            echo "fuzz: $h: reproducer $f (rerun: $bin $f; log: $log)" >&2
        done
    fi
    rows="$rows| $h | $took | $execs | $rate | $crashes | $corpus |
"
done
table="| harness | seconds | executions | exec/s | crashes | corpus (inputs) |
|---|---:|---:|---:|---:|---:|
$rows"
echo
printf "%s" "$table"
if [ -n "$markdown" ]; then
    cpu=$(sed -n 's/^model name[^:]*: *//p' /proc/cpuinfo | head -n 1)
    clang=$("${CLANG:-clang}" --version 2>/dev/null | head -n 1)
    {
        echo "# Fuzzing loom's readers"
        echo
        echo "Generated by \`$COMMAND\` on $(date +%Y-%m-%d)."
        echo
        echo "Machine: $cpu, $(nproc) cores, shared with other work while this ran;"
        echo "$clang, libFuzzer, every harness under ASan and UBSan; the inputs"
        echo "written to files in ${TMPDIR:-/tmp}. Seconds include loading the corpus."
        echo
        echo "Each harness feeds one reader of outside input what a user or a"
        echo "damaged disk could give it (tests/fuzz says which reader and how),"
        echo "starting from its seeds (tests/fuzz/corpus) and the inputs that once"
        echo "crashed a reader (tests/fuzz/regressions), which every build replays"
        echo "(fuzz.replay.<harness>). The ckpt harness reseals half of its inputs"
        echo "(each file's length and CRC32C rewritten as the writer writes them), so"
        echo "that mutated fields get past the checksum to their own checks. Corpus:"
        echo "the inputs the fuzzer kept for new coverage, this run's and earlier"
        echo "runs' in the same build directory. A crash is any sanitizer finding, a"
        echo "leak, an input slower than 10 s or an allocation above 2 GiB."
        echo
        printf "%s" "$table"
    } >"$markdown"
    echo "fuzz.sh: wrote $markdown"
fi
exit $failed
