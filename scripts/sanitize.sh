#!/bin/sh
# Build the whole tree with AddressSanitizer and UndefinedBehaviorSanitizer
# and run the test suite on it:
#
#   scripts/sanitize.sh [--build-only | --no-build] [CTEST ARGS...]
#
# The build goes to its own directory (LOOM_SANITIZE_BUILD, default
# build-sanitize) with the compiler in CC (default cc: gcc on Debian; clang
# works too). Any undefined behaviour stops the process that meets it
# (UBSAN_OPTIONS=halt_on_error=1), a leak fails it; leaks inside the
# libraries loom uses (Open MPI, libconfig, ...) are suppressed by
# tests/sanitize/lsan.supp, each with its reason. CTEST ARGS go to ctest,
# e.g. -R 'config|formats' to rerun some tests; by default every test runs,
# two at a time (LOOM_SANITIZE_JOBS). Exits with ctest's status.
set -u
cd "$(dirname "$0")/.."
SRC=$(pwd)
BUILD=${LOOM_SANITIZE_BUILD:-build-sanitize}
JOBS=${LOOM_SANITIZE_JOBS:-2}

build=1 run=1
case "${1:-}" in
--build-only) run=0; shift ;;
--no-build) build=0; shift ;;
-h | --help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
esac

FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
if [ $build = 1 ]; then
    echo "sanitize.sh: building the tree with ASan and UBSan in $BUILD"
    if ! CC=${CC:-cc} cmake -S "$SRC" -B "$BUILD" -DLOOM_WERROR=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
            -DCMAKE_C_FLAGS="$FLAGS" -DCMAKE_EXE_LINKER_FLAGS="$FLAGS" \
            -DCMAKE_SHARED_LINKER_FLAGS="$FLAGS" >"$BUILD.configure.log" 2>&1; then
        cat "$BUILD.configure.log" >&2
        echo "sanitize.sh: configuring $BUILD failed (log above)" >&2
        exit 2
    fi
    rm -f "$BUILD.configure.log"
    cmake --build "$BUILD" -j "$JOBS" || {
        echo "sanitize.sh: the sanitized build failed" >&2
        exit 2
    }
fi
[ $run = 1 ] || exit 0

# detect_leaks: LSan at every process's exit. The MPI ranks and their
# children inherit all of this through loom launch and mpirun.
# fast_unwind_on_malloc=0: Open MPI's libraries have no frame pointers, and
# its components are unloaded before the report, so a fast unwind stops
# at an "<unknown module>" frame and no suppression of lsan.supp can match;
# the slow unwind reaches libmpi.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:print_summary=1:fast_unwind_on_malloc=0}
# use_tls=0: Debian 12's libsanitizer (gcc 12) reads a bogus dynamic TLS
# range of UCX's progress thread on glibc 2.36 and its leak check crashes
# ("Tracer caught signal 11"); loom keeps no heap pointer in thread-local
# storage, so nothing of loom's is missed.
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$SRC/tests/sanitize/lsan.supp:print_suppressions=0:use_tls=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
ctest --test-dir "$BUILD" -j "$JOBS" --output-on-failure "$@"
