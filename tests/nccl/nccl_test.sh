#!/bin/sh
# comm-nccl end to end through the loom command.
#   usage: nccl_test.sh LOOM SOURCE_DIR PLUGIN_DIR CASE [RANKS]
set -eu
LOOM=$1
SRC=$2
PLUGINS=$3
CASE=$4
RANKS=${5:-2}
CFG=$SRC/examples/bench.cfg
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cd "$SRC"

case "$CASE" in
plugins)
    # listed as ok; every load check of --check passes. The functional
    # checks move host buffers, which comm-nccl does not take: --check
    # says it skips them, and passes.
    "$LOOM" plugins > "$TMP/list" 2>&1 || { cat "$TMP/list"; exit 1; }
    grep -Eq "^comm +nccl +1\.[0-9]+ +.*libloom-comm-nccl\.so +ok$" "$TMP/list" ||
        { cat "$TMP/list"; echo "nccl_test: comm-nccl not listed as ok"; exit 1; }
    "$LOOM" plugins --check "$PLUGINS/libloom-comm-nccl.so" > "$TMP/check" 2>&1 ||
        { cat "$TMP/check"; echo "nccl_test: --check failed"; exit 1; }
    cat "$TMP/check"
    for check in file dlopen symbol "abi version" "struct size" kind name "required ops" settings description; do
        grep -qx "ok   $check" "$TMP/check" || { echo "nccl_test: load check '$check' did not pass"; exit 1; }
    done
    grep -q "^note: functional checks skipped: they move host buffers, and nccl takes device memory only" "$TMP/check" ||
        { echo "nccl_test: --check does not say why it skips the functional checks"; exit 1; }
    echo "nccl_test: listed ok, load checks pass, functional checks skipped (device memory only)" ;;
bench_unavailable | bench_host_memory)
    # nccl next to mpi with host buffers: nccl is reported unavailable and
    # mpi is benched and right. Without a GPU (2 ranks) nccl cannot start
    # and says CUDA's reason; with one (1 rank: a GPU per rank) it starts,
    # and bench refuses it by the memory kinds it declares.
    if [ "$CASE" = bench_unavailable ]; then
        np=2
        why='comm-nccl: no CUDA device visible \(cudaGetDeviceCount: .+\)'
    else
        np=1
        why='comm nccl does not take host memory \(bench.memory = "host"; set "device" for it\)'
    fi
    "$LOOM" launch -n $np -- "$LOOM" bench "$CFG" --set 'bench.comms=["mpi","nccl"]' \
        --set bench.max_bytes=256 --set bench.iters=2 --set bench.warmup=1 > "$TMP/out" 2>&1 ||
        { cat "$TMP/out"; echo "nccl_test: loom bench exited non-zero"; exit 1; }
    cat "$TMP/out"
    grep -Eq "# loom bench: backend nccl unavailable: $why\$" "$TMP/out" ||
        { echo "nccl_test: nccl not reported unavailable with: $why"; exit 1; }
    grep -q "# loom bench: backend mpi, $np ranks, host memory" "$TMP/out" ||
        { echo "nccl_test: mpi not benched"; exit 1; }
    for op in allreduce broadcast reduce allgather reducescatter alltoall sendrecv; do
        grep -q "^\[0\]   $op " "$TMP/out" || { echo "nccl_test: no mpi $op rows"; exit 1; }
    done
    grep -q "# ok: 0 wrong" "$TMP/out" || { echo "nccl_test: mpi rows are wrong"; exit 1; }
    echo "nccl_test: nccl unavailable, mpi benched right" ;;
bench_device)
    # (GPU machines, a GPU per rank) device buffers, every op, checked
    # against closed forms
    "$LOOM" launch -n "$RANKS" -- "$LOOM" bench "$CFG" --set 'bench.comms=["nccl"]' --set bench.memory=device \
        --set bench.max_bytes=1048576 --set bench.iters=5 --set bench.warmup=2 > "$TMP/out" 2>&1 ||
        { cat "$TMP/out"; exit 1; }
    cat "$TMP/out"
    grep -q "# loom bench: backend nccl, $RANKS ranks, device memory" "$TMP/out" &&
        grep -q "# ok: 0 wrong" "$TMP/out" || { echo "nccl_test: device bench not right"; exit 1; }
    for op in allreduce broadcast reduce allgather reducescatter alltoall sendrecv; do
        grep -q "^\[0\]   $op " "$TMP/out" || { echo "nccl_test: no $op rows"; exit 1; }
    done
    echo "nccl_test: device bench right" ;;
*)
    echo "nccl_test: unknown case $CASE"; exit 2 ;;
esac
