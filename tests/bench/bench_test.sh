#!/bin/sh
# loom bench end to end.
#   usage: bench_test.sh LOOM SOURCE_DIR CASE
set -eu
LOOM=$1
SRC=$2
CASE=$3
CFG=$SRC/examples/bench.cfg
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cd "$SRC"

case "$CASE" in
table)
    # every op, every size up to 64 KiB, 3 ranks, checked; JSON rows agree
    "$LOOM" launch -n 3 -- "$LOOM" bench "$CFG" --set bench.max_bytes=65536 \
        --set bench.iters=3 --set bench.warmup=1 --json "$TMP/rows.json" > "$TMP/out" 2>&1 ||
        { cat "$TMP/out"; exit 1; }
    grep -q "# ok: 0 wrong" "$TMP/out" || { cat "$TMP/out"; echo "bench_test: no ok line"; exit 1; }
    for op in allreduce broadcast reduce allgather reducescatter alltoall sendrecv; do
        grep -q "^\[0\]   $op " "$TMP/out" || { echo "bench_test: no $op rows"; exit 1; }
        grep -q "\"op\": \"$op\"" "$TMP/rows.json" || { echo "bench_test: no $op in --json"; exit 1; }
    done
    rows=$(grep -c '"backend"' "$TMP/rows.json")
    table=$(grep -c '^\[0\]   [a-z]' "$TMP/out")
    [ "$rows" = "$table" ] || { echo "bench_test: $rows JSON rows, $table table rows"; exit 1; }
    echo "bench_test: $rows rows, 0 wrong" ;;
unavailable)
    # a backend that cannot start is reported, and the others still run
    "$LOOM" launch -n 2 -- "$LOOM" bench "$CFG" --set 'bench.comms=["nosuch","mpi"]' \
        --set bench.max_bytes=64 --set bench.iters=2 > "$TMP/out" 2>&1 || { cat "$TMP/out"; exit 1; }
    grep -q "backend nosuch unavailable: plugin comm 'nosuch' not found" "$TMP/out" &&
        grep -q "backend mpi, 2 ranks" "$TMP/out" || { cat "$TMP/out"; exit 1; }
    echo "bench_test: nosuch reported, mpi benched" ;;
no_backend_ran)
    # an empty table is a failure, not "ok: 0 wrong": with no backend that
    # starts, loom bench exits non-zero and says why
    rc=0
    "$LOOM" bench "$CFG" --set 'bench.comms=["nosuch"]' --set bench.max_bytes=64 \
        > "$TMP/out" 2>&1 || rc=$?
    cat "$TMP/out"
    [ $rc = 1 ] || { echo "bench_test: exit $rc with no backend, want 1"; exit 1; }
    grep -q "^loom bench: --set bench.comms=\[\"nosuch\"\]: bench.comms: no backend ran (plugin comm 'nosuch' not found" "$TMP/out" ||
        { echo "bench_test: no error naming bench.comms"; exit 1; }
    ! grep -q "# ok:" "$TMP/out" || { echo "bench_test: ok line without a backend"; exit 1; }
    rc=0
    "$LOOM" launch -n 2 -- "$LOOM" bench "$CFG" --set 'bench.comms=["nosuch","alsonot"]' \
        --set bench.max_bytes=64 > "$TMP/out" 2>&1 || rc=$?
    [ $rc = 1 ] && grep -q "no backend ran (none was available; the last: plugin comm 'alsonot'" "$TMP/out" ||
        { cat "$TMP/out"; echo "bench_test: exit $rc at 2 ranks with no backend, want 1"; exit 1; }
    echo "bench_test: no backend ran: exit 1" ;;
large_reduce)
    # 64 MiB reductions at 2 ranks: Open MPI 4.1's segmented ireduce
    # overflowed the stack here (comm-mpi picks binomial)
    "$LOOM" launch -n 2 -- "$LOOM" bench "$CFG" --set 'bench.ops=["reduce","allreduce"]' \
        --set 'bench.comms=["mpi"]' --set bench.min_bytes=67108864 --set bench.max_bytes=67108864 --set bench.iters=12 \
        --set bench.warmup=2 > "$TMP/out" 2>&1 || { cat "$TMP/out"; exit 1; }
    grep -q "# ok: 0 wrong" "$TMP/out" || { cat "$TMP/out"; echo "bench_test: no ok line"; exit 1; }
    grep "67108864" "$TMP/out" ;;
barrier)
    # bench.barrier times each iteration alone after a barrier, and checks it
    "$LOOM" launch -n 2 -- "$LOOM" bench "$CFG" --set bench.barrier=true \
        --set 'bench.ops=["allreduce","broadcast"]' --set bench.max_bytes=4096 --set bench.iters=3 \
        > "$TMP/out" 2>&1 || { cat "$TMP/out"; exit 1; }
    grep -q "^\[0\] # loom bench: backend .*, 2 ranks, host memory, 5 warm-up + 3 timed iterations, each after a barrier" "$TMP/out" &&
        grep -q "# ok: 0 wrong" "$TMP/out" || { cat "$TMP/out"; echo "bench_test: bench.barrier"; exit 1; }
    echo "bench_test: bench.barrier ok" ;;
auto)
    # "auto" benches the backend a training run gets, and says which and why
    "$LOOM" launch -n 2 -- "$LOOM" bench "$CFG" --set 'bench.comms=["auto"]' \
        --set 'bench.ops=["allreduce"]' --set bench.max_bytes=64 --set bench.iters=2 \
        > "$TMP/out" 2>&1 || { cat "$TMP/out"; exit 1; }
    grep -q "^\[0\] # loom bench: backend ucx (auto: host memory, comm-ucx loads), 2 ranks" "$TMP/out" &&
        grep -q "^\[0\] # launch: " "$TMP/out" || { cat "$TMP/out"; echo "bench_test: auto not said"; exit 1; }
    echo "bench_test: auto is ucx here" ;;
stopped_rank)
    # a rank that stops answering mid-bench: the others fail within the
    # timeout, naming it, and the launcher exits non-zero
    # (comm-mpi's message; comm-ucx's names the rank in its own words)
    "$LOOM" launch -n 3 -- "$LOOM" bench "$CFG" --set comm.timeout_s=3 --set bench.iters=100000 \
        --set bench.ops=allreduce --set 'bench.comms=["mpi"]' > "$TMP/out" 2>&1 &
    launcher=$!
    # a failing check must not leave the job running (the launcher stops its ranks)
    trap 'kill "$launcher" 2>/dev/null || true; rm -rf "$TMP"' EXIT
    i=0
    # the table's header: the ranks are up and benching (the first row
    # comes only after 100000 iterations, a minute under the sanitizers)
    until grep -q "# op" "$TMP/out" 2>/dev/null; do
        sleep 0.2; i=$((i + 1)); [ $i -lt 300 ] || { echo "bench_test: bench never started"; exit 1; }
    done
    victim=""
    # the launcher's children: other tests may bench the same config at the same time
    for p in $(pgrep -P "$launcher"); do
        tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx LOOM_RANK=2 && victim=$p
    done
    [ -n "$victim" ] || { echo "bench_test: rank 2 not found"; exit 1; }
    kill -STOP "$victim"
    start=$(date +%s)
    rc=0
    wait $launcher || rc=$?
    took=$(( $(date +%s) - start ))
    cat "$TMP/out" | grep -v "^\[0\]   allreduce" || true
    [ $rc -ne 0 ] || { echo "bench_test: the launcher exited 0"; exit 1; }
    grep -q "timed out after 3.0 s: rank 2 did not arrive" "$TMP/out" ||
        { echo "bench_test: no rank named the stopped rank 2"; exit 1; }
    [ $took -le 20 ] || { echo "bench_test: took $took s"; exit 1; }
    echo "bench_test: stopped rank named, exit $rc after $took s" ;;
*)
    echo "bench_test: unknown case $CASE"; exit 2 ;;
esac
