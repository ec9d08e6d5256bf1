#!/bin/sh
# Two "nodes" on this machine: two network namespaces joined by a veth
# pair, each with its own IPC namespace, each running `loom launch
# --nnodes 2 --node-rank K --master 10.213.0.1:PORT -n 2`. The 4-rank job
# reproduces the same job on one node, loss for loss.
#   usage: multinode_test.sh LOOM SOURCE_DIR COMM [MODE]      COMM: mpi | ucx
# MODE launch (the default): the flags above. slurm-launch: each node's
# launcher sees what `srun -N 2 --ntasks-per-node=1` gives its task and no
# flags, so --nnodes, --node-rank and --master come from Slurm's
# variables. slurm-tasks: four `loom train`, each with what `srun -n 4
# -N 2` gives a task, finding the store on the step's first node.
set -eu
LOOM=$1
SRC=$2
COMM=$3
MODE=${4:-launch}
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
TEST="multinode_test $COMM $MODE"
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
# What srun gives every task of the step (the node list in Slurm's own
# bracket form); slurm_env K: node K's own.
STEP="SLURM_JOB_ID=$$ SLURM_JOBID=$$ SLURM_STEP_ID=0 SLURM_STEPID=0 SLURM_STEP_NUM_NODES=2 SLURM_NNODES=2
      SLURM_STEP_NODELIST=10.213.0.[1-2] SLURM_NODELIST=10.213.0.[1-2]"
slurm_env() { echo "$STEP SLURM_NODEID=$1 SLURMD_NODENAME=10.213.0.$(($1 + 1))"; }

# slurm_launcher NAME NS K: node K's launcher as srun's task K, no flags
slurm_launcher() {
    # shellcheck disable=SC2046,SC2086
    ip netns exec "$2" unshare --ipc env $(slurm_env "$3") SLURM_PROCID="$3" SLURM_LOCALID=0 \
        SLURM_NTASKS=2 SLURM_STEP_NUM_TASKS=2 SLURM_STEP_TASKS_PER_NODE="1(x2)" \
        "$LOOM" launch -v --timeout 120 -n 2 -- "$LOOM" train "$CFG" $SETS \
        --metrics "m{rank}.jsonl" > "$1.log" 2>&1
}

# slurm_tasks NAME NS K: node K's two tasks of a four-task step, each a
# loom train of its own (as srun starts them)
slurm_tasks() {
    pids=""
    for local in 0 1; do
        # shellcheck disable=SC2046,SC2086
        ip netns exec "$2" env $(slurm_env "$3") SLURM_PROCID=$(($3 * 2 + local)) \
            SLURM_LOCALID=$local SLURM_NTASKS=4 SLURM_STEP_NUM_TASKS=4 \
            SLURM_STEP_TASKS_PER_NODE="2(x2)" "$LOOM" train "$CFG" $SETS \
            --metrics "m$(($3 * 2 + local)).jsonl" > "$1.$local.log" 2>&1 &
        pids="$pids $!"
    done
    tasks_status=0
    for pid in $pids; do
        wait "$pid" || tasks_status=1
    done
    cat "$1.0.log" "$1.1.log" > "$1.log"
    return $tasks_status
}

case $MODE in
launch) starter=node ;;
slurm-launch) starter=slurm_launcher ;;
slurm-tasks) starter=slurm_tasks ;;
*) fail "unknown mode $MODE" ;;
esac
$starter node0 "$A" 0 &
first=$!
$starter node1 "$B" 1 || { cat node1.log; fail "node 1 failed"; }
wait "$first" || { cat node0.log; fail "node 0 failed"; }
if [ "$MODE" = slurm-tasks ]; then
    # no launcher prefixes the tasks' lines: rank 0 (node 0's first task)
    # reports, saying where its rank came from
    grep -q "^ranks: 4 from Slurm (SLURM_PROCID)" node0.0.log ||
        { cat node0.log; fail "rank 0 did not say its ranks came from Slurm"; }
    grep -q "^step    6/6" node0.0.log || { cat node0.log; fail "rank 0 did not report the steps"; }
else
    if [ "$MODE" = slurm-launch ]; then
        for k in 0 1; do
            grep -q "from Slurm: --nnodes 2 --node-rank $k --master 10.213.0.1:" "node$k.log" ||
                { cat "node$k.log"; fail "node $k's launcher did not take its flags from Slurm"; }
        done
    fi
    # rank 0 reports, and it runs on node 0; node 1 holds ranks 2 and 3
    grep -q "^\[0\] step    6/6" node0.log || { cat node0.log; fail "node 0 did not report the steps"; }
    ! grep -q "^\[[01]\] " node1.log || { cat node1.log; fail "node 1 ran ranks 0 or 1"; }
fi

# shellcheck disable=SC2086
"$LOOM" launch -n 4 -- "$LOOM" train "$CFG" $SETS --metrics one.jsonl > one.log 2>&1 ||
    { cat one.log; fail "the one-node run failed"; }
compare one m0 1e-6
echo "$TEST: ok"
