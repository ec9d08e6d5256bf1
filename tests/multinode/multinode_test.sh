#!/bin/sh
# Two "nodes" on this machine: two network namespaces joined by a veth
# pair, each with its own IPC namespace, each running `loom launch
# --nnodes 2 --node-rank K --master 10.213.0.1:PORT -n 2`. The 4-rank job
# reproduces the same job on one node, loss for loss.
#   usage: multinode_test.sh LOOM SOURCE_DIR COMM      COMM: mpi | ucx
set -eu
LOOM=$1
SRC=$2
COMM=$3
CFG=$SRC/tests/zero/tiny.cfg
DATA=$SRC/examples/data/corpus.bin
TMP=$(mktemp -d)
A=loomA$$ B=loomB$$
cleanup() {
    ip netns del "$A" 2>/dev/null || true
    ip netns del "$B" 2>/dev/null || true
    rm -rf "$TMP"
}
trap cleanup EXIT
cd "$TMP"
TEST="multinode_test $COMM"
. "$SRC/tests/common/train_runs.sh"
fail() { echo "$TEST: $*"; exit 1; }

if [ "$(id -u)" != 0 ] || ! ip netns add "$A" 2>/dev/null; then
    echo "$TEST: skipped (network namespaces need root and iproute2)"
    exit 77
fi
ip netns add "$B"
ip link add "v$A" type veth peer name "v$B"
ip link set "v$A" netns "$A"
ip link set "v$B" netns "$B"
ip -n "$A" link set "v$A" name node
ip -n "$B" link set "v$B" name node
ip -n "$A" addr add 10.213.0.1/24 dev node
ip -n "$B" addr add 10.213.0.2/24 dev node
for ns in "$A" "$B"; do
    ip -n "$ns" link set lo up
    ip -n "$ns" link set node up
done

# UCX would otherwise find the other "node" through shared memory
export UCX_TLS=tcp,self
SETS="--set data.train=$DATA --set parallel.dp.size=4 --set parallel.dp.strategy=zero2 \
      --set train.steps=6 --set comm.default=$COMM --set train.peak_gflops=100 --set comm.timeout_s=60"
PORT=$((20000 + $$ % 20000))

# node NAME NS K: node K's two ranks, in its own network and IPC namespaces;
# every node runs the same command (the launchers check), each rank writing
# its own metrics (rank 0's: m0.jsonl)
node() {
    # shellcheck disable=SC2086
    ip netns exec "$2" unshare --ipc "$LOOM" launch --timeout 120 --nnodes 2 --node-rank "$3" \
        --master "10.213.0.1:$PORT" -n 2 -- "$LOOM" train "$CFG" $SETS --metrics "m{rank}.jsonl" \
        > "$1.log" 2>&1
}
node node0 "$A" 0 &
first=$!
node node1 "$B" 1 || { cat node1.log; fail "node 1 failed"; }
wait "$first" || { cat node0.log; fail "node 0 failed"; }
# rank 0 reports, and it runs on node 0; node 1 holds ranks 2 and 3
grep -q "^\[0\] step    6/6" node0.log || { cat node0.log; fail "node 0 did not report the steps"; }
! grep -q "^\[[01]\] " node1.log || { cat node1.log; fail "node 1 ran ranks 0 or 1"; }

# shellcheck disable=SC2086
"$LOOM" launch -n 4 -- "$LOOM" train "$CFG" $SETS --metrics one.jsonl > one.log 2>&1 ||
    { cat one.log; fail "the one-node run failed"; }
compare one m0 1e-6
echo "$TEST: ok"
