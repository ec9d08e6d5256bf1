#!/bin/sh
# The data strategy listed in docs/plugin-guide.md ("A complete data
# strategy"): cut out, compiled against the ABI headers alone, passed
# through the conformance checks and the numerics harness (3 ranks, with
# accumulation and clipping), and its checkpoint resumed by zero2 at 2 ranks
# against the single-rank run's later steps (loss and norm, 1e-5 relative).
#   usage: guide_test.sh LOOM SOURCE_DIR CC
set -eu
LOOM=$1
SRC=$2
CC=$3
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cd "$TMP"

# the first ```c block after the heading
awk '/^### A complete data strategy/ { found = 1 }
     found && /^```c$/ && !done { inside = 1; next }
     inside && /^```$/ { inside = 0; done = 1 }
     inside' "$SRC/docs/plugin-guide.md" > allavg.c
[ -s allavg.c ] || { echo "guide_test: no listing under 'A complete data strategy'"; exit 1; }
"$CC" -std=c11 -Wall -Wextra -Werror -shared -fPIC -fvisibility=hidden -I"$SRC/core/include" \
    allavg.c -o libloom-strategy-allavg.so
CFG="$SRC/tests/zero/tiny.cfg"
set -- --set data.train="$SRC/examples/data/corpus.bin" --set train.clip=1.0
"$LOOM" plugins --check ./libloom-strategy-allavg.so --train "$CFG" --ranks 3 "$@" \
    --set train.grad_accum=2 > check.log 2>&1 ||
    { cat check.log; echo "guide_test: the listing fails loom plugins --check --train"; exit 1; }

"$LOOM" train "$CFG" "$@" --metrics single.jsonl > single.log 2>&1 ||
    { cat single.log; exit 1; }
"$LOOM" launch -n 3 -- "$LOOM" train "$CFG" "$@" --set parallel.dp.size=3 \
    --set parallel.dp.strategy="$TMP/libloom-strategy-allavg.so" \
    --set train.checkpoint_every=5 --set train.checkpoint_dir="\"$TMP/ckpt\"" \
    > allavg.log 2>&1 || { cat allavg.log; exit 1; }
"$LOOM" launch -n 2 -- "$LOOM" train "$CFG" "$@" --set parallel.dp.size=2 \
    --set parallel.dp.strategy=zero2 --resume "$TMP/ckpt/step-5" --metrics resumed.jsonl \
    > resumed.log 2>&1 || { cat resumed.log; exit 1; }

# field NAME FILE: one value per step
field() { sed "s/.*\"$1\": \([^,]*\),.*/\1/" "$2"; }
# compare FIELD A B FIRST: B's values against A's from step FIRST on, 1e-5
# relative (the norm too: Adam would hide gradients summed instead of
# averaged from the losses)
compare() {
    field "$1" "$2" | tail -n +"$4" > a.txt
    field "$1" "$3" > b.txt
    [ "$(wc -l < a.txt)" = "$(wc -l < b.txt)" ] && [ -s a.txt ] ||
        { echo "guide_test: $2 and $3 ran different step counts"; exit 1; }
    paste a.txt b.txt | awk -v f="$1" -v a="$2" -v b="$3" '
        { d = $1 - $2; if (d < 0) d = -d; r = d / ($1 < 0 ? -$1 : $1); if (r > worst) worst = r;
          if (r > 1e-5) { printf "step %d: %s %s %s, %s %s\n", NR, f, a, $1, b, $2; bad = 1 } }
        END { printf "%s: %s vs %s: worst relative difference %.3g\n", f, a, b, worst; exit bad }'
}
for f in loss grad_norm; do
    compare $f single.jsonl resumed.jsonl 6
done
echo "guide_test: ok"
