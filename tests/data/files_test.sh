#!/bin/sh
# Files a job reads that cannot be used, refused at once with one line:
#   fifo     a FIFO as the config or a file it @includes, a token shard (data.train), llm.c weights
#            (model.checkpoint), a file of a loom checkpoint (`loom ckpt
#            info`, --resume): opening one to read would wait for a writer
#   nonfinite  llm.c weights holding a NaN (model.init = "checkpoint"):
#            training from them would save NaN weights and exit 0
#   usage: files_test.sh LOOM SOURCE_DIR CASE
set -eu
LOOM=$1
SRC=$2
CASE=$3
CFG=$SRC/tests/train/tiny.cfg
DATA=$SRC/examples/data/corpus.bin
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cd "$TMP"

fail() { echo "files_test: $*"; exit 1; }

# refused WANT CMD...: CMD exits non-zero within 20 seconds (a hang is a
# failure, not a wait) and its last line of stderr holds WANT
refused() {
    want=$1; shift
    rc=0
    timeout 20 "$@" > out.txt 2> err.txt || rc=$?
    [ "$rc" != 0 ] || { cat err.txt; fail "accepted: $*"; }
    [ "$rc" != 124 ] || fail "still waiting after 20 s: $*"
    tail -n 1 err.txt | grep -qF -- "$want" || { cat err.txt; fail "'$want' not the message of: $*"; }
    echo "refused: $(tail -n 1 err.txt)"
}

train() {
    "$LOOM" train "$CFG" --set data.train="$DATA" "$@" > train.log 2>&1 ||
        { cat train.log; fail "training failed: $*"; }
}

case "$CASE" in
fifo)
    mkfifo fifo
    refused "loom train: cannot read config 'fifo': it is a FIFO, not a regular file" \
        "$LOOM" train fifo
    # a FIFO named by an @include, one file down (libconfig opens those itself)
    printf '@include "fifo"\n' > inner.cfg
    printf 'train = { steps = 1; };\n  @include "inner.cfg"\n' > outer.cfg
    refused "loom train: inner.cfg:1: @include \"fifo\": cannot read 'fifo': it is a FIFO, not a regular file" \
        "$LOOM" train outer.cfg
    refused "fifo: cannot open: it is a FIFO, not a regular file" \
        "$LOOM" train "$CFG" --set data.train=fifo
    refused "fifo: cannot open: it is a FIFO, not a regular file" \
        "$LOOM" train "$CFG" --set data.train="$DATA" --set data.val=fifo
    refused "fifo: cannot open: it is a FIFO, not a regular file" \
        "$LOOM" train "$CFG" --set data.train="$DATA" --set model.init=checkpoint \
        --set model.checkpoint=fifo
    refused "checkpoint 'fifo': it is a FIFO, not a regular file" "$LOOM" ckpt info fifo
    # a shard file of a checkpoint directory
    train --set train.steps=2 --set train.checkpoint_every=2 --set train.checkpoint_dir=ck
    rm ck/step-2/shard-0.loom
    mkfifo ck/step-2/shard-0.loom
    refused "checkpoint 'ck/step-2': ck/step-2/shard-0.loom: it is a FIFO, not a regular file" \
        "$LOOM" ckpt info ck/step-2
    refused "checkpoint 'ck/step-2': ck/step-2/shard-0.loom: it is a FIFO, not a regular file" \
        "$LOOM" train "$CFG" --set data.train="$DATA" --set train.steps=4 --resume ck/step-2
    echo "files: a FIFO as the config, a shard, llm.c weights and a checkpoint's file refused at once" ;;
nonfinite)
    train --set train.steps=2 --save good.bin
    # parameter 100 (in wte) NaN, parameter 20000 (in wpe) +inf
    python3 - good.bin bad.bin <<'PY'
import struct, sys
data = bytearray(open(sys.argv[1], 'rb').read())
struct.pack_into('<f', data, 1024 + 4 * 100, float('nan'))
struct.pack_into('<f', data, 1024 + 4 * 20000, float('inf'))
open(sys.argv[2], 'wb').write(data)
PY
    refused "bad.bin: wte, element 100 is NaN, and 2 of the" \
        "$LOOM" train "$CFG" --set data.train="$DATA" --set model.init=checkpoint \
        --set model.checkpoint=bad.bin --save out.bin
    [ ! -e out.bin ] || fail "weights saved from NaN weights"
    # the good file trains
    train --set train.steps=1 --set model.init=checkpoint --set model.checkpoint=good.bin
    echo "files: llm.c weights holding a NaN refused before training" ;;
*)
    fail "unknown case $CASE" ;;
esac
