#!/bin/sh
# `loom train` on several shards, shuffled as llm.c: resuming mid-epoch
# continues with exactly the batches of the uninterrupted run (across the
# epoch's end), on the same mesh bit for bit and on other meshes within the
# numerics contract; a resume whose data settings differ, and bad data, are
# refused with one line naming the setting or the file.
#   usage: train_test.sh LOOM SOURCE_DIR DATA_TEST CASE
set -eu
LOOM=$1
SRC=$2
CASE=$4
CFG=$SRC/tests/train/tiny.cfg
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cd "$TMP"

TEST=data_train_test
. "$SRC/tests/common/train_runs.sh"

# Three shards of the shipped corpus, of 2000, 1500 and 3000 tokens: with
# tiny.cfg's batch of 12 x 32 tokens, 5 + 3 + 7 = 15 steps an epoch.
mkdir shards
python3 - "$SRC/examples/data/corpus.bin" shards <<'PY'
import struct, sys
data = open(sys.argv[1], 'rb').read()
tokens = struct.unpack('<%dH' % ((len(data) - 1024) // 2), data[1024:])
start = 0
for name, n in (('a', 2000), ('b', 1500), ('c', 3000)):
    header = [20240520, 1, n] + [0] * 253
    with open('%s/part_%s.bin' % (sys.argv[2], name), 'wb') as f:
        f.write(struct.pack('<256i', *header) + struct.pack('<%dH' % n, *tokens[start:start + n]))
    start += n
PY
DATA="$TMP/shards/part_*.bin"

# fails NAME TEXT CMD...: CMD fails, and its output has TEXT
fails() {
    fails_name=$1; fails_text=$2; shift 2
    if "$@" > "$fails_name.log" 2>&1; then
        cat "$fails_name.log"; echo "$TEST: $fails_name: the run succeeded"; exit 1
    fi
    grep -qF -- "$fails_text" "$fails_name.log" ||
        { cat "$fails_name.log"; echo "$TEST: $fails_name: no '$fails_text' in the message"; exit 1; }
    echo "$fails_name: refused: $(grep -F -- "$fails_text" "$fails_name.log" | head -1)"
}

case "$CASE" in
resume)
    # 20 steps cross the first epoch's end (15 steps); checkpoints after 8 and 16
    run whole 1 --set train.steps=20 --set train.checkpoint_every=8 --set train.checkpoint_dir="$TMP/ckpt"
    ck=$TMP/ckpt/step-8
    "$LOOM" ckpt info "$ck" > info.txt || { cat info.txt; exit 1; }
    cat info.txt
    grep -q "data      shuffled as llm.c, 1 reader × 12 sequences of 32 tokens per read, train.batch 12; 3 files, 6500 tokens" info.txt &&
        grep -q "reader 0  epoch 0, shard [123] of 3 (.*/part_[abc].bin), sample [0-9] of [357] read" info.txt ||
        { echo "$TEST: ckpt info does not show the data position"; exit 1; }
    # the same mesh: bit for bit, from the directory and from one file
    run same 1 --set train.steps=20 --resume "$ck"
    same_tail whole same 12
    "$LOOM" ckpt consolidate "$ck" --state "$TMP/step8.loom" > cons.log 2>&1 || { cat cons.log; exit 1; }
    run one_file 1 --set train.steps=20 --resume "$TMP/step8.loom"
    same_tail whole one_file 12
    # other meshes: dp 2, dp 2 x grad_accum 2, and from the second epoch
    tail -n 12 whole.jsonl > tail.jsonl
    run dp2 2 --set train.steps=20 --resume "$ck"
    compare tail dp2 1e-5
    run dp2k2 2 --set train.steps=20 --set train.grad_accum=2 --resume "$ck"
    compare tail dp2k2 1e-5
    run epoch2 2 --set train.steps=20 --resume "$TMP/ckpt/step-16"
    tail -n 4 whole.jsonl > tail4.jsonl
    compare tail4 epoch2 1e-5
    # a different order would show: the unshuffled run's losses differ
    run unshuffled 1 --set train.steps=20 --set data.shuffle=false
    if compare whole unshuffled 1e-3 > /dev/null; then
        echo "$TEST: the shuffled and the unshuffled runs have the same losses"; exit 1
    fi
    # dp 2 writes, 1 rank with 3 readers of 4 sequences goes on
    run r3 2 --set train.steps=20 --set data.readers=3 --set data.read_batch=4 \
        --set train.checkpoint_every=8 --set train.checkpoint_dir="$TMP/ck3"
    run r3_one 1 --set train.steps=20 --set data.readers=3 --set data.read_batch=4 \
        --set train.grad_accum=3 --resume "$TMP/ck3/step-8"
    tail -n 12 r3.jsonl > r3tail.jsonl
    compare r3tail r3_one 1e-5 ;;
refused)
    run whole 1 --set train.steps=9 --set train.checkpoint_every=8 --set train.checkpoint_dir="$TMP/ckpt"
    ck=$TMP/ckpt/step-8
    train() { "$LOOM" train "$CFG" --set train.steps=9 "$@"; }
    fails shuffle "--resume $ck: data.shuffle is true in the checkpoint, false in the config" \
        train --set data.train="$DATA" --set data.shuffle=false --resume "$ck"
    fails readers "--resume $ck: data.readers is 1 in the checkpoint, 2 in the config" \
        train --set data.train="$DATA" --set data.readers=2 --resume "$ck"
    fails batch "--resume $ck: train.batch is 12 in the checkpoint, 24 in the config" \
        train --set data.train="$DATA" --set train.batch=24 --resume "$ck"
    fails files "--resume $ck: data.train: the checkpoint read 3 files, the config names 2" \
        train --set data.train='["'"$TMP"'/shards/part_a.bin","'"$TMP"'/shards/part_b.bin"]' --resume "$ck"
    # the same files as a list: the same run
    run listed 1 --set train.steps=9 --set data.train='["'"$TMP"'/shards/part_a.bin","'"$TMP"'/shards/part_b.bin","'"$TMP"'/shards/part_c.bin"]'
    losses whole > a.txt; losses listed > b.txt
    cmp -s a.txt b.txt || { echo "$TEST: the list of the files trains differently from their glob"; exit 1; }
    # bad data: named
    fails empty_glob "--set data.train=$TMP/shards/none_*.bin: data.train: no file matches \"$TMP/shards/none_*.bin\"" \
        train --set data.train="$TMP/shards/none_*.bin"
    cp shards/part_a.bin shards/part_b.bin shards/part_c.bin .
    printf 'junk' | dd of=part_b.bin conv=notrunc 2> /dev/null
    fails magic "$TMP/part_b.bin: not an llm.c token shard (magic" train --set data.train="$TMP/part_*.bin"
    fails vocab "is >= the vocabulary size 100 (model.vocab)" \
        train --set data.train="$DATA" --set model.vocab=100 --set model.padded_vocab=128
    grep -q "part_[abc].bin: token [0-9]* at position [0-9]*" vocab.log ||
        { cat vocab.log; echo "$TEST: the bad token's file and position are not named"; exit 1; }
    fails multiple "train.batch 12 is not a multiple of data.readers 5 × data.read_batch 2 = 10" \
        train --set data.train="$DATA" --set data.readers=5 --set data.read_batch=2
    fails small "part_b.bin holds 1500 tokens, fewer than one sample of 1537 (data.readers 1 × data.read_batch 24 × train.seq 64 + 1)" \
        train --set data.train="$DATA" --set train.batch=24 --set train.seq=64
    # A checkpoint of format 1 (loom before data positions): its token offset
    # resumes an unshuffled run of one shard, and nothing else.
    DATA=$SRC/examples/data/corpus.bin
    run seq 1 --set train.steps=12 --set data.shuffle=false --set train.checkpoint_every=8 \
        --set train.checkpoint_dir="$TMP/seqck"
    "$LOOM" ckpt consolidate "$TMP/seqck/step-8" --state v2.loom > cons.log 2>&1 || { cat cons.log; exit 1; }
    python3 - v2.loom v1.loom <<'PY'
import struct, sys
data = bytearray(open(sys.argv[1], 'rb').read())
# the header: magic, version, dtype, shape[6], step, good_steps, data, loss_scale, nunits;
# format 3 then stamps it (run id, step, length, checksum: 32 bytes), and
# format 4 adds the lineage (32 bytes, the settings' text of the length at 24);
# format 5 changes shard files only
assert data[:8] == b'LOOMSTAT' and struct.unpack_from('<I', data, 8)[0] in (4, 5)
size = struct.unpack_from('<Q', data, 56)[0]
lineage = 32 + struct.unpack_from('<I', data, 72 + 32 + 24)[0]
struct.pack_into('<I', data, 8, 1)
struct.pack_into('<Q', data, 56, 8 * 12 * 32)  # after 8 steps of 12 x 32 tokens
open(sys.argv[2], 'wb').write(data[:72] + data[72 + 32 + lineage + size:])
PY
    "$LOOM" ckpt info v1.loom | grep -q "data      token 3072 of one unshuffled shard (checkpoint format 1)" ||
        { "$LOOM" ckpt info v1.loom; echo "$TEST: ckpt info of a format 1 checkpoint"; exit 1; }
    run seq_v1 1 --set train.steps=12 --set data.shuffle=false --resume "$TMP/v1.loom"
    same_tail seq seq_v1 4
    fails v1_shuffled "--resume $TMP/v1.loom: a checkpoint of loom's format 1 holds only a token offset into one unshuffled shard" \
        train --set data.train="$DATA" --resume "$TMP/v1.loom" ;;
*)
    echo "$TEST: unknown case $CASE"; exit 2 ;;
esac
