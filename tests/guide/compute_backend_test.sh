#!/bin/sh
# The compute backend listed in docs/plugin-guide.md ("A complete compute
# backend"): cut out, compiled against the ABI headers alone, passed by
# `loom plugins --check`, and trained as model.device to the cpu backend's
# losses and norms bit for bit (it runs the same kernels), saying at its
# destroy that it ran residual_forward its own way.
#   usage: compute_backend_test.sh LOOM SOURCE_DIR CC
set -eu
LOOM=$1
SRC=$2
CC=$3
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
chmod 755 "$TMP" # a plugin's folder must not be writable by others
cd "$TMP"

# the first ```c block after the heading
awk '/^### A complete compute backend/ { found = 1 }
     found && /^```c$/ && !done { inside = 1; next }
     inside && /^```$/ { inside = 0; done = 1 }
     inside' "$SRC/docs/plugin-guide.md" > tally.c
[ -s tally.c ] || { echo "compute_backend_test: no listing under 'A complete compute backend'"; exit 1; }
"$CC" -std=c11 -Wall -Wextra -Werror -shared -fPIC -fvisibility=hidden -I"$SRC/core/include" \
    tally.c -o libloom-compute-tally.so
"$LOOM" plugins --check ./libloom-compute-tally.so > check.log 2>&1 ||
    { cat check.log; echo "compute_backend_test: the listing fails loom plugins --check"; exit 1; }
grep -q '^all checks passed' check.log ||
    { cat check.log; echo "compute_backend_test: loom plugins --check did not pass it"; exit 1; }

export LOOM_PLUGIN_PATH="$TMP${LOOM_PLUGIN_PATH:+:$LOOM_PLUGIN_PATH}"
CFG="$SRC/tests/zero/tiny.cfg"
set -- --set data.train="$SRC/examples/data/corpus.bin" --set train.clip=1.0
"$LOOM" train "$CFG" "$@" --metrics cpu.jsonl > cpu.log 2>&1 || { cat cpu.log; exit 1; }
"$LOOM" train "$CFG" "$@" --set model.device='"tally"' --metrics tally.jsonl > tally.log 2>&1 ||
    { cat tally.log; exit 1; }
grep -q 'compute: tally: the cpu kernels, counted (model.device = "tally")' tally.log ||
    { cat tally.log; echo "compute_backend_test: the header does not name the tally backend"; exit 1; }
grep -Eq 'tally: [1-9][0-9]* kernels run, [1-9][0-9]* of them residual_forward' tally.log ||
    { cat tally.log; echo "compute_backend_test: tally ran no residual_forward of its own"; exit 1; }

# step, loss and norm of every step, as printed: the same text is the same bits
steps() { sed 's/.*"step": \([^,]*\),.*"loss": \([^,]*\),.*"grad_norm": \([^,]*\),.*/\1 \2 \3/' "$1"; }
steps cpu.jsonl > cpu.txt
steps tally.jsonl > tally.txt
[ "$(wc -l < cpu.txt)" -eq 10 ] || { cat cpu.txt; echo "compute_backend_test: not 10 steps"; exit 1; }
diff cpu.txt tally.txt ||
    { echo "compute_backend_test: model.device = tally differs from cpu (left: cpu)"; exit 1; }
echo "compute_backend_test: ok"
