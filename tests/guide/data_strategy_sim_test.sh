#!/bin/sh
# The data strategy listed in docs/plugin-guide.md ("A complete data
# strategy") on the sim backend, whose memory the host cannot touch outside
# the backend's calls: at 3 ranks (the gradients staged through host memory
# for the communicator), with clipping and a bf16 run, its losses and norms
# equal the same strategy's on cpu bit for bit, its parameters, gradients
# and optimizer state held in the device tier. A listing that reads or
# writes a model buffer on the host dies of SIGSEGV here.
#   usage: data_strategy_sim_test.sh LOOM SOURCE_DIR CC
set -eu
LOOM=$1
SRC=$2
CC=$3
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cd "$TMP"

awk '/^### A complete data strategy/ { found = 1 }
     found && /^```c$/ && !done { inside = 1; next }
     inside && /^```$/ { inside = 0; done = 1 }
     inside' "$SRC/docs/plugin-guide.md" > allavg.c
[ -s allavg.c ] || { echo "data_strategy_sim_test: no listing under 'A complete data strategy'"; exit 1; }
"$CC" -std=c11 -Wall -Wextra -Werror -shared -fPIC -fvisibility=hidden -I"$SRC/core/include" \
    allavg.c -o libloom-strategy-allavg.so

CFG="$SRC/tests/zero/tiny.cfg"
# run DEVICE PRECISION: 3 ranks of allavg
run() {
    "$LOOM" launch -n 3 -- "$LOOM" train "$CFG" --set data.train="$SRC/examples/data/corpus.bin" \
        --set train.clip=1.0 --set train.precision="\"$2\"" --set parallel.dp.size=3 \
        --set parallel.dp.strategy="$TMP/libloom-strategy-allavg.so" \
        --set model.device="\"$1\"" --metrics "$1-$2.jsonl" > "$1-$2.log" 2>&1 ||
        { cat "$1-$2.log"; echo "data_strategy_sim_test: the listing failed on $1 ($2)"; exit 1; }
}
steps() { sed 's/.*"step": \([^,]*\),.*"loss": \([^,]*\),.*"grad_norm": \([^,]*\),.*/\1 \2 \3/' "$1"; }
for precision in fp32 bf16; do
    run cpu $precision
    run sim $precision
    grep -q 'compute: sim' sim-$precision.log ||
        { cat sim-$precision.log; echo "data_strategy_sim_test: the run was not on sim"; exit 1; }
    # the model's buffers in the backend's tier (sim's kernels would run on
    # host memory too, which a GPU's could not)
    grep -Eq '"held_bytes": \{"device": \{"params": [1-9][0-9]*, "grads": [1-9][0-9]*, "optimizer": [1-9]' \
        sim-$precision.jsonl ||
        { head -1 sim-$precision.jsonl
          echo "data_strategy_sim_test: the listing's buffers are not in host->compute->tier"; exit 1; }
    steps cpu-$precision.jsonl > cpu.txt
    steps sim-$precision.jsonl > sim.txt
    [ "$(wc -l < cpu.txt)" -eq 10 ] || { cat cpu.txt; echo "data_strategy_sim_test: not 10 steps"; exit 1; }
    diff cpu.txt sim.txt ||
        { echo "data_strategy_sim_test: $precision on sim differs from cpu (left: cpu)"; exit 1; }
done
echo "data_strategy_sim_test: ok"
