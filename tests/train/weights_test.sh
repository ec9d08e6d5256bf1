#!/bin/sh
# llm.c's weights end to end: version 5 (bf16) checkpoints written by --save
# and `loom ckpt consolidate` and read back, the model's shape taken from a
# checkpoint's header, and train.decay = "matrices" (weight decay on the
# matrices only, llm.c's GPU trainer) on every data strategy. The weights
# are checked by python3 reading the files on its own.
#   usage: weights_test.sh LOOM SOURCE_DIR CASE [OLD_ABI_DIR]
set -eu
LOOM=$1
SRC=$2
CASE=$3
OLD_ABI_DIR=${4:-}
CFG=$SRC/tests/zero/tiny.cfg
DATA=$SRC/examples/data/corpus.bin
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cd "$TMP"

TEST=weights_test
. "$SRC/tests/common/train_runs.sh"
fail() { echo "$TEST: $*"; exit 1; }

# checkpoints.py: llm.c's checkpoint read here, independently of loom.
cat > checkpoints.py <<'PY'
import array, struct, sys

NAMES = ["wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
         "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"]
MATRICES = {"wte", "wpe", "qkvw", "attprojw", "fcw", "fcprojw"}

def read(path):
    """(version, {name: list of floats}) of an llm.c GPT-2 checkpoint."""
    data = open(path, "rb").read()
    header = struct.unpack("<256i", data[:1024])
    magic, version, maxT, V, L, NH, C, Vp = header[:8]
    assert magic == 20240326, path
    sizes = [Vp * C, maxT * C, L * C, L * C, L * 3 * C * C, L * 3 * C, L * C * C, L * C,
             L * C, L * C, L * 4 * C * C, L * 4 * C, L * C * 4 * C, L * C, C, C]
    if version == 3:
        values = array.array("f", data[1024:])
    elif version == 5:
        halves = array.array("H", data[1024:])
        values = array.array("f", struct.pack("<%dI" % len(halves), *[h << 16 for h in halves]))
    else:
        raise SystemExit("%s: version %d" % (path, version))
    assert len(values) == sum(sizes), "%s: %d values, want %d" % (path, len(values), sum(sizes))
    tensors, at = {}, 0
    for name, n in zip(NAMES, sizes):
        tensors[name] = values[at:at + n]
        at += n
    return version, tensors

def bf16_round(x):
    """fp32 -> the nearest bf16 (ties to even), as an fp32 value."""
    (u,) = struct.unpack("<I", struct.pack("<f", x))
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return struct.unpack("<f", struct.pack("<I", u))[0]
PY

# bf16_of FP32 BF16: BF16 is version 5 and holds the bf16 rounding of every
# value of FP32 (version 3)
bf16_of() {
    python3 - "$1" "$2" <<'PY' || fail "$2 is not the bf16 of $1"
import sys
sys.path.insert(0, ".")
from checkpoints import read, bf16_round, NAMES
v32, a = read(sys.argv[1])
v16, b = read(sys.argv[2])
assert (v32, v16) == (3, 5), (v32, v16)
for name in NAMES:
    bad = [i for i, (x, y) in enumerate(zip(a[name], b[name])) if bf16_round(x) != y]
    assert not bad, "%s[%d]: %r -> %r, want %r" % (name, bad[0], a[name][bad[0]], b[name][bad[0]],
                                                   bf16_round(a[name][bad[0]]))
print("%s holds the bf16 rounding of each of %d values of %s" %
      (sys.argv[2], sum(len(a[n]) for n in NAMES), sys.argv[1]))
PY
}

case "$CASE" in
bf16)
    run fp32 1 --set train.steps=3 --save fp32.bin
    run bf16 1 --set train.steps=3 --save bf16.bin --save-dtype bf16
    [ "$(stat -c %s bf16.bin)" = "$(( ($(stat -c %s fp32.bin) - 1024) / 2 + 1024 ))" ] ||
        fail "bf16.bin is not half the size of fp32.bin's parameters"
    bf16_of fp32.bin bf16.bin
    # read back exactly: a step with lr 0 leaves the weights as loaded, and
    # --save writes them as fp32; the shape comes from the header alone
    cat > noshape.cfg <<EOF
model = { init = "checkpoint"; checkpoint = "bf16.bin"; };
train = { batch = 12; seq = 32; steps = 1; lr = 0.0; };
EOF
    zero_cfg=$CFG CFG=noshape.cfg
    run loaded 1 --save back.bin
    CFG=$zero_cfg
    python3 - <<'PY' || fail "the bf16 checkpoint did not load exactly"
import sys
sys.path.insert(0, ".")
from checkpoints import read, NAMES
_, a = read("bf16.bin")
v, b = read("back.bin")
assert v == 3
for name in NAMES:
    assert list(a[name]) == list(b[name]), name
print("bf16.bin loads exactly: back.bin (fp32) holds the same values")
PY
    grep -q "GPT-2 L=2 C=64 NH=4 V=256 (Vp 256)" loaded.log || { cat loaded.log; fail "not the header's shape"; }
    # consolidation writes either version from a checkpoint directory
    run sharded 2 --set parallel.dp.strategy=zero2 --set train.steps=2 \
        --set train.checkpoint_every=1 --set train.checkpoint_dir="$TMP/ckpt"
    "$LOOM" ckpt consolidate ckpt/step-1 --llmc c32.bin > c32.log 2>&1 || { cat c32.log; fail "consolidate"; }
    "$LOOM" ckpt consolidate ckpt/step-1 --llmc c16.bin --save-dtype bf16 > c16.log 2>&1 ||
        { cat c16.log; fail "consolidate --save-dtype bf16"; }
    grep -q "wrote c16.bin (llm.c weights, bf16" c16.log || { cat c16.log; fail "c16.log"; }
    bf16_of c32.bin c16.bin ;;
shape)
    run saved 1 --set train.steps=1 --save model.bin
    printf 'model = { init = "checkpoint"; checkpoint = "model.bin";\n  channels = 128; };\n' > bad.cfg
    expect() { # expect WANT CMD...: CMD fails with exactly the line WANT
        want=$1; shift
        if "$@" > out.txt 2>&1; then cat out.txt; fail "$* did not fail"; fi
        [ "$(cat out.txt)" = "$want" ] || { cat out.txt; echo "want: $want"; fail "wrong message"; }
    }
    expect "loom train: bad.cfg:2: model.channels = 128, but model.bin holds C = 64; remove model.channels to take the checkpoint's, or name a checkpoint of this shape" \
        "$LOOM" train bad.cfg --set data.train="$DATA"
    expect "loom settings: bad.cfg:2: model.channels = 128, but model.bin holds C = 64; remove model.channels to take the checkpoint's, or name a checkpoint of this shape" \
        "$LOOM" settings bad.cfg
    printf 'model = { init = "checkpoint"; checkpoint = "model.bin"; };\n' > noshape.cfg
    expect "loom train: --set train.seq=128: train.seq: expected an integer <= model.max_seq (64, from model.bin's header), found 128" \
        "$LOOM" train noshape.cfg --set data.train="$DATA" --set train.seq=128
    expect "loom train: --set model.checkpoint=model.bin: model.checkpoint: \"model.bin\" is not read: model.init is \"random\" (the default); set model.init = \"checkpoint\" to start from the file, or remove model.checkpoint" \
        "$LOOM" train "$CFG" --set data.train="$DATA" --set model.checkpoint=model.bin
    # the shape settings the config leaves unset show the file's values
    printf 'model = { init = "checkpoint"; checkpoint = "model.bin";\n  heads = 4; };\n' > some.cfg
    "$LOOM" settings some.cfg > settings.txt 2>&1 || { cat settings.txt; fail "loom settings"; }
    for want in "model.layers 2 model.bin's header" "model.heads 4 some.cfg:2" \
                "model.channels 64 model.bin's header" "model.max_seq 64 model.bin's header" \
                "model.init \"checkpoint\" some.cfg:1" "train.decay \"all\" default"; do
        tr -s ' ' < settings.txt | grep -qx "$want" || { cat settings.txt; fail "loom settings lacks '$want'"; }
    done
    echo "shape: the header's, refusals name the setting and the file" ;;
decay)
    # one step: a tensor's update depends only on its own decay, so with
    # decay on the matrices the 1-D tensors are those of no decay at all
    for run_case in "none all 0.0" "matrices matrices 0.5" "all all 0.5"; do
        set -- $run_case
        run "$1" 1 --set train.steps=1 --set train.decay="$2" --set train.weight_decay="$3" --save "$1.bin"
    done
    python3 - <<'PY' || fail "weight decay went to the wrong tensors"
import sys
sys.path.insert(0, ".")
from checkpoints import read, NAMES, MATRICES
_, none = read("none.bin")
_, mat = read("matrices.bin")
_, all_ = read("all.bin")
for name in NAMES:
    same = list(none[name]) == list(mat[name])
    if name in MATRICES:
        assert not same, "%s: decay = matrices left it as without decay" % name
        assert list(mat[name]) == list(all_[name]), "%s: decay = matrices and all differ" % name
    else:
        assert same, "%s: decay = matrices decayed it" % name
for name in ("ln1w", "ln2w", "lnfw"):  # 1 at the start: decay = all moves them
    assert list(all_[name]) != list(none[name]), "%s: decay = all did not decay it" % name
print("decay = matrices: wte wpe qkvw attprojw fcw fcprojw decayed, biases and LayerNorms not")
PY
    ;;
decay_strategies)
    # every data strategy and the tensor axis step the same tensors: the
    # single rank's losses, at a decay strong enough to show a wrong range
    wd="--set train.decay=matrices --set train.weight_decay=100"
    run single 1 $wd
    run all 1 --set train.weight_decay=100
    if compare single all 1e-3 > /dev/null; then fail "decay = all and matrices train alike"; fi
    for s in ddp zero1 zero2 zero3; do
        for n in 2 3; do
            [ $s = ddp ] && [ $n = 3 ] && continue
            run "${s}_$n" $n $wd --set parallel.dp.strategy=$s
            compare single "${s}_$n" 1e-5
        done
    done
    run tp2 2 $wd --set parallel.dp.size=1 --set parallel.tp.size=2
    compare single tp2 1e-5 ;;
decay_old-abi)
    # a data strategy built for ABI 1.5 steps through update alone: refused
    # at set-up for decay = matrices ...
    run_old() { "$LOOM" train "$CFG" --set data.train="$DATA" --set plugins.path="[\"$OLD_ABI_DIR\"]" \
                    --set train.steps=1 "$@"; }
    run_old --set train.decay=matrices --set train.weight_decay=0.5 > old.log 2>&1 && { cat old.log; fail "an ABI 1.5 strategy ran decay = matrices"; }
    grep -qxF "loom train: --set train.decay=matrices: train.decay = \"matrices\" needs a data strategy built for loom plugin ABI 1.6 or later (it steps ranges through update_range), but ddp was built for 1.5 ($OLD_ABI_DIR/libloom-strategy-ddp.so); rebuild it against this loom or set train.decay = \"all\"" old.log ||
        { cat old.log; fail "wrong refusal"; }
    # ... and trains with decay = all as before
    run_old --set train.weight_decay=0.5 > all.log 2>&1 || { cat all.log; fail "decay = all"; }
    echo "an ABI 1.5 strategy: refused for decay = matrices, trains with decay = all" ;;
decay_update-only)
    # a strategy that claims ABI 1.6 yet steps through update: its first step
    # is refused, never trained with the wrong decay
    "$LOOM" train "$CFG" --set data.train="$DATA" --set plugins.path="[\"$OLD_ABI_DIR\"]" \
        --set train.steps=1 --set train.decay=matrices --set train.weight_decay=0.5 > careless.log 2>&1 && { cat careless.log; fail "update ran decay = matrices"; }
    grep -qxF "loom train: --set train.decay=matrices: train.decay = \"matrices\", but strategy ddp stepped through loom_optimizer_step.update, which cannot tell a unit's tensors apart; it must call update_range (ABI 1.6), or set train.decay = \"all\"" careless.log ||
        { cat careless.log; fail "wrong refusal"; }
    echo "a 1.6 strategy stepping through update: refused at its first step" ;;
*)
    echo "$TEST: unknown case $CASE"; exit 2 ;;
esac
