#!/bin/sh
# Remake the fuzz harnesses' seed corpora, tests/fuzz/corpus/<harness>/,
# with loom itself: configs from examples/, schedules from `loom schedule`,
# checkpoints and data positions from tiny training runs, llm.c weights
# from `loom ckpt consolidate`, token shards from loom-text2shard. Rerun it
# when a file format changes. Needs a normal build (default build/) with
# the mpi plugin for the 2-rank checkpoints.
#
#   tests/fuzz/make_corpus.sh [BUILD_DIR]
set -eu
cd "$(dirname "$0")/../.."
SRC=$(pwd)
BUILD=$(cd "${1:-build}" && pwd)
LOOM=$BUILD/bin/loom
OUT=$SRC/tests/fuzz/corpus
WORK=$(mktemp -d "${TMPDIR:-/tmp}/loom-corpus-XXXXXX")
trap 'rm -rf "$WORK"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1

rm -rf "$OUT"
for h in config schedule llmc_checkpoint token_shard data_position ckpt; do
    mkdir -p "$OUT/$h"
done

# ---- config: the example configs; one with --set overrides after NUL bytes
for f in "$SRC"/examples/*.cfg; do
    cp "$f" "$OUT/config/$(basename "$f" .cfg)"
done
printf 'model = { layers = 2; heads = 2; channels = 16; };\ntrain = { batch = 4; seq = 8; };\n\0train.lr=3e-4\0parallel.dp.size=2\0comm.ucx.progress_thread=false' \
    >"$OUT/config/overrides"

# ---- schedule: every shipped schedule, as `loom schedule --verbose` lists it
# (3 bytes of shape, then rank, kind, virtual stage, micro-batch per action)
sched() { # name p v m
    (cd "$SRC" && "$LOOM" schedule examples/pipeline.cfg --set parallel.pp.schedule="$1" \
        --set parallel.pp.size="$2" --set parallel.pp.virtual_stages="$3" \
        --set parallel.pp.microbatches="$4" --set parallel.dp.size=1 --verbose) |
        python3 -c '
import re, sys
p, v, m, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
kinds = {"F": 0, "B": 1, "I": 2, "W": 3, "sa": 4, "ra": 5, "sg": 6, "rg": 7}
data = bytearray([p - 1, v - 1, m - 1])
for line in sys.stdin:
    got = re.match(r"rank (\d+):(.*)", line)
    if not got:
        continue
    for act in got.group(2).split():
        k, mb, vs = re.fullmatch(r"([A-Za-z]+?)(\d+)(?:v(\d+))?", act).groups()
        data += bytes([int(got.group(1)), kinds[k], int(vs or 0), int(mb)])
open(out, "wb").write(data)' "$2" "$3" "$4" "$OUT/schedule/$1-p$2-v$3-m$4"
}
sched gpipe 2 1 4
sched 1f1b 4 1 8
sched interleaved 2 2 4
sched zb-h1 3 1 6

# ---- the fuzzers' dataset (fuzz_data_position.c makes the same files)
python3 - "$WORK" <<'EOF'
import struct, sys
def shard(path, count, mul, add):
    header = [20240520, 1, count] + [0] * 253
    tokens = [(mul * i + add) % 8 for i in range(count)]
    open(path, "wb").write(struct.pack("<256i", *header) + struct.pack("<%dH" % count, *tokens))
shard(sys.argv[1] + "/fuzz-a.bin", 601, 5, 1)
shard(sys.argv[1] + "/fuzz-b.bin", 457, 3, 2)
EOF

# ---- token_shard: 4 bytes of settings, then a shard
head -c 300 "$SRC/examples/data/val.txt" >"$WORK/text.txt"
"$BUILD/bin/loom-text2shard" "$WORK/text.txt" "$WORK/text.bin" >/dev/null
{ printf '\300\007\000\002'; cat "$WORK/text.bin"; } >"$OUT/token_shard/text-vocab256-seq8"
{ printf '\000\003\001\007'; cat "$WORK/fuzz-b.bin"; } >"$OUT/token_shard/fuzz-b-vocab64-2readers-shuffled"

# ---- training runs: checkpoints, their data positions, llm.c weights
cat >"$WORK/tiny.cfg" <<EOF
plugins = { path = [ "$BUILD/lib/loom" ]; };
model = { layers = 1; heads = 1; channels = 4; vocab = 8; padded_vocab = 8; max_seq = 4; };
data = { train = [ "$WORK/fuzz-a.bin", "$WORK/fuzz-b.bin" ]; };
train = { batch = 4; seq = 4; steps = 4; checkpoint_every = 3; peak_gflops = 1.0; };
EOF
train() { # name ranks settings...
    name=$1 ranks=$2
    shift 2
    if [ "$ranks" = 1 ]; then
        "$LOOM" train "$WORK/tiny.cfg" --set train.checkpoint_dir="$WORK/$name" "$@" >"$WORK/$name.log" 2>&1
    else
        "$LOOM" launch -n "$ranks" -- "$LOOM" train "$WORK/tiny.cfg" \
            --set train.checkpoint_dir="$WORK/$name" "$@" >"$WORK/$name.log" 2>&1
    fi || { cat "$WORK/$name.log" >&2; exit 1; }
}
# A sharded directory into one input: 'S', then length-prefixed meta.loom
# and shard files (fuzz_ckpt.c); a consolidated file: 'C' and the file.
# The lower-case letters ask the harness to reseal every file after the
# fuzzer's mutations: each checkpoint goes in both ways.
pack_sharded() { # dir out
    python3 - "$1" "$2" <<'EOF'
import os, struct, sys
d, out = sys.argv[1], sys.argv[2]
files = ["meta.loom"] + sorted((f for f in os.listdir(d) if f.startswith("shard-")),
                               key=lambda f: int(f[6:-5]))
data = b""
for f in files:
    body = open(os.path.join(d, f), "rb").read()
    data += struct.pack("<I", len(body)) + body
open(out, "wb").write(b"S" + data)
open(out + "-resealed", "wb").write(b"s" + data)
EOF
}
# The data position inside meta.loom: its length at byte 56, itself after
# the 112 bytes of header and, from format 3 (the version at byte 8), the
# 32 bytes of stamp and, from format 4, the lineage (32 bytes, then the
# settings' text of the length at its byte 24).
data_position() { # dir settings-byte out
    python3 - "$1/meta.loom" "$2" "$3" <<'EOF'
import struct, sys
meta = open(sys.argv[1], "rb").read()
version = struct.unpack_from("<I", meta, 8)[0]
n = struct.unpack_from("<Q", meta, 56)[0]
at = 112 + (32 if version >= 3 else 0)
if version >= 4:
    at += 32 + struct.unpack_from("<I", meta, at + 24)[0]
assert meta[at:at + 8] == b"LOOMDATA", "meta.loom's layout changed: update make_corpus.sh"
open(sys.argv[3], "wb").write(bytes([int(sys.argv[2])]) + meta[at:at + n])
EOF
}

train ordered 1 --set data.shuffle=false
train shuffled 1
train ordered2 1 --set data.shuffle=false --set data.readers=2
train shuffled2 1 --set data.readers=2
data_position "$WORK/ordered/step-3" 0 "$OUT/data_position/ordered"
data_position "$WORK/shuffled/step-3" 1 "$OUT/data_position/shuffled"
data_position "$WORK/ordered2/step-3" 2 "$OUT/data_position/ordered-2readers"
data_position "$WORK/shuffled2/step-3" 3 "$OUT/data_position/shuffled-2readers"

train fp16 1 --set train.precision=fp16
train zero3 2 --set parallel.dp.size=2 --set parallel.dp.strategy=zero3
train tp2 2 --set parallel.tp.size=2 --set model.heads=2
pack_sharded "$WORK/shuffled/step-3" "$OUT/ckpt/sharded-1rank"
pack_sharded "$WORK/fp16/step-3" "$OUT/ckpt/sharded-fp16"
pack_sharded "$WORK/zero3/step-3" "$OUT/ckpt/sharded-zero3-2ranks"
pack_sharded "$WORK/tp2/step-3" "$OUT/ckpt/sharded-tp2"
"$LOOM" ckpt consolidate "$WORK/zero3/step-3" --state "$WORK/state.loom" \
    --llmc "$WORK/gpt2.bin" >/dev/null
"$LOOM" ckpt consolidate "$WORK/tp2/step-3" --llmc "$WORK/gpt2-bf16.bin" --save-dtype bf16 >/dev/null
{ printf 'C'; cat "$WORK/state.loom"; } >"$OUT/ckpt/consolidated"
{ printf 'c'; cat "$WORK/state.loom"; } >"$OUT/ckpt/consolidated-resealed"
cp "$WORK/gpt2.bin" "$OUT/llmc_checkpoint/fp32"
cp "$WORK/gpt2-bf16.bin" "$OUT/llmc_checkpoint/bf16"

for h in "$OUT"/*; do
    echo "$(basename "$h"): $(ls "$h" | wc -l) seeds, $(du -sk "$h" | cut -f1) KiB"
done
