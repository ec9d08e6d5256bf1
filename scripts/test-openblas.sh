#!/bin/sh
# The build without oneDNN, where every matrix product runs on OpenBLAS:
# configure a second tree with -DLOOM_WITH_ONEDNN=OFF, build it with
# warnings as errors, and run the tests whose outcome depends on the
# products' library (the kernels and products, the model, the optimizer,
# training, the checkpoint formats, plan --calibrate, and every bf16 and
# fp16 run):
#
#   scripts/test-openblas.sh [CTEST ARGS...]
#
# The tree is LOOM_OPENBLAS_BUILD (default build-openblas); LOOM_CMAKE_ARGS
# goes to its configure as to setup.sh's. CTEST ARGS go to ctest after the
# selection, e.g. -V. CI runs this after the whole suite on build/. Exits
# with ctest's status, 2 when the tree does not configure or build.
set -u
cd "$(dirname "$0")/.."
BUILD=${LOOM_OPENBLAS_BUILD:-build-openblas}
TESTS='^(kernels|gemm|model|optimizer|train|formats|plan\.calibrate)\.|bf16|f16'

# shellcheck disable=SC2086 # LOOM_CMAKE_ARGS is a list of arguments
cmake -S . -B "$BUILD" -DLOOM_WITH_ONEDNN=OFF -DLOOM_WERROR=ON \
    ${LOOM_CMAKE_ARGS:-} || { echo "test-openblas.sh: configuring $BUILD failed" >&2; exit 2; }
cmake --build "$BUILD" -j "$(nproc)" || { echo "test-openblas.sh: building $BUILD failed" >&2; exit 2; }
ctest --test-dir "$BUILD" -R "$TESTS" --output-on-failure -j2 "$@"
