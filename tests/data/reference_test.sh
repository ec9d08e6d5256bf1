#!/bin/sh
# loom's global batches against llm.c's loader written again in Python
# (llmc_loader.py): five shards of different sizes, shuffled and not, one
# reader and three, read over three epochs, on every dp x grad_accum layout.
#   usage: reference_test.sh DATA_TEST LLMC_LOADER_PY
set -eu
DATA_TEST=$1
REF=$2
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cd "$TMP"

python3 "$REF" shards "$TMP" 7 300 161 97 450 120
set -- "$TMP"/shard_*.bin
[ $# = 5 ] || { echo "reference_test: $# shards written, want 5"; exit 1; }

B=12; T=8; STEPS=30
# shuffle readers read_batch: a step is 12 sequences of 8 tokens, i.e.
# R = 12 / (readers x read_batch) reads of every reader
for order in "1 1 0" "1 1 4" "1 3 2" "1 3 4" "0 3 2" "0 1 0"; do
    set -- $order
    shuffle=$1; readers=$2; read_batch=$3
    python3 "$REF" dump $B $T $shuffle $readers $read_batch $STEPS "$TMP"/shard_*.bin > ref.txt
    for layout in "1 1" "2 1" "3 1" "1 2" "2 2" "3 2"; do
        set -- $layout
        "$DATA_TEST" dump $B $T $shuffle $readers $read_batch $1 $2 $STEPS "$TMP"/shard_*.bin > loom.txt ||
            { echo "reference_test: data_test dump failed"; exit 1; }
        cmp -s ref.txt loom.txt || {
            diff ref.txt loom.txt | head -5
            echo "reference_test: shuffle $shuffle, readers $readers, read_batch $read_batch on dp $1 x K $2 differs from llm.c's order"
            exit 1; }
    done
    echo "shuffle $shuffle, readers $readers, read_batch $read_batch: llm.c's $STEPS batches on 6 layouts"
done
# the shuffle does something: the shuffled and unshuffled orders differ
python3 "$REF" dump $B $T 1 3 2 3 "$TMP"/shard_*.bin > a.txt
python3 "$REF" dump $B $T 0 3 2 3 "$TMP"/shard_*.bin > b.txt
! cmp -s a.txt b.txt || { echo "reference_test: the shuffled order is the file order"; exit 1; }
