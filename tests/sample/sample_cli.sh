#!/bin/sh
# `loom sample` and train.sample_every end to end.
#   usage: sample_cli.sh LOOM SOURCE_DIR CASE
#   cli     the same text from llm.c's file, a loom checkpoint directory and a
#           consolidated file of the same weights; seeds; --top-k 1 is greedy;
#           a known answer; the tokenizer's decoding and end-of-text start
#   errors  every bad argument and file refused, one line, non-zero exit
#   train   sample lines at the right steps, the same text `loom sample`
#           gives from the weights of that step; the settings' checks
#   ranks   the same samples on 2 ranks (zero3, tp, pp) as on one
set -eu
LOOM=$1
SRC=$2
CASE=$3
CFG=$SRC/tests/sample/sample.cfg
DATA=$SRC/examples/data/corpus.bin
FILES="python3 $SRC/tests/sample/files.py"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cd "$TMP"

fail() { echo "sample_cli: $*"; exit 1; }

# train NAME [ARGS...]: one rank, output in NAME.log
train() {
    train_name=$1; shift
    "$LOOM" train "$CFG" --set data.train="$DATA" "$@" > "$train_name.log" 2>&1 ||
        { cat "$train_name.log"; fail "training $train_name failed"; }
}

# same A B: two files of output identical
same() { cmp -s "$1" "$2" || { echo "--- $1"; cat "$1"; echo "--- $2"; cat "$2"; fail "$1 and $2 differ"; }; }

# refused WANT CMD...: CMD exits non-zero with one line of stderr containing WANT
refused() {
    want=$1; shift
    if "$@" > out.txt 2> err.txt; then fail "accepted: $*"; fi
    [ "$(wc -l < err.txt)" = 1 ] || { cat err.txt; fail "not one line: $*"; }
    grep -qF -- "$want" err.txt || { cat err.txt; fail "'$want' not in the message of: $*"; }
}

# samples LOG: the sample lines of a training log, rank prefixes dropped
samples() { sed -n 's/^\(\[0\] \)\{0,1\}sample: //p' "$1"; }

case "$CASE" in
cli)
    train a --set train.steps=20 --save a.bin
    train b --set train.checkpoint_every=20 --set train.checkpoint_dir=ck
    "$LOOM" ckpt consolidate ck/step-20 --state state.loom > /dev/null
    for ck in a.bin ck/step-20 state.loom; do
        name=$(echo "$ck" | tr '/.' '__')
        "$LOOM" sample "$ck" --prompt "The " --tokens 48 --temperature 0 > "greedy_$name.txt"
        "$LOOM" sample "$ck" --prompt "The " --tokens 48 --seed 5 > "seed5_$name.txt"
    done
    for name in ck_step-20 state_loom; do
        same greedy_a_bin.txt "greedy_$name.txt"
        same seed5_a_bin.txt "seed5_$name.txt"
    done
    head -c 4 greedy_a_bin.txt | grep -q '^The ' || fail "the prompt is not printed first"
    [ "$(wc -c < greedy_a_bin.txt)" -ge 53 ] || fail "fewer than 48 tokens after the prompt"
    # a fixed seed gives fixed text; another seed other text
    "$LOOM" sample a.bin --prompt "The " --tokens 48 --seed 5 > again.txt
    same seed5_a_bin.txt again.txt
    "$LOOM" sample a.bin --prompt "The " --tokens 48 --seed 6 > seed6.txt
    ! cmp -s seed5_a_bin.txt seed6.txt || fail "seeds 5 and 6 gave the same text"
    ! cmp -s seed5_a_bin.txt greedy_a_bin.txt || fail "sampling gave the greedy text"
    # top-k 1 is greedy
    "$LOOM" sample a.bin --prompt "The " --tokens 48 --top-k 1 > top1.txt
    same greedy_a_bin.txt top1.txt
    # a known answer: a model whose next token is always the last, past max_seq (8)
    $FILES repeat-model repeat.bin 128 8
    "$LOOM" sample repeat.bin --prompt hello --tokens 20 --temperature 0 > repeat.txt
    printf 'hell%s\n' ooooooooooooooooooooo > want.txt
    same want.txt repeat.txt
    # the output ends with a newline, and holds nothing else without tokens
    "$LOOM" sample a.bin --prompt ab --tokens 0 > none.txt
    printf 'ab\n' > want.txt
    same want.txt none.txt
    # a tokenizer decodes: token i is byte i with letters' case swapped, so
    # its text is the bytes' with case swapped, prompt and all
    $FILES tokenizer swap.bin 2 256 32
    "$LOOM" sample a.bin --tokenizer swap.bin --prompt "tHE " --tokens 48 --seed 5 > swapped.txt
    tr 'a-zA-Z' 'A-Za-z' < seed5_a_bin.txt > want.txt
    same want.txt swapped.txt
    # an empty prompt starts from the end-of-text token (here 32, a space),
    # which is not printed
    "$LOOM" sample a.bin --tokenizer swap.bin --tokens 30 --seed 9 > eot.txt
    "$LOOM" sample a.bin --prompt " " --tokens 30 --seed 9 | cut -c2- | tr 'a-zA-Z' 'A-Za-z' > want.txt
    same want.txt eot.txt
    echo "sample: the same text from the llm.c file, the checkpoint directory and the consolidated file; seeds, top-k 1, a known answer and a tokenizer as they should" ;;
errors)
    $FILES repeat-model small.bin 128 8
    $FILES random-model big.bin 300
    $FILES tokenizer swap.bin 2 256 32
    $FILES tokenizer v1.bin 1 128 0
    head -c 3000 small.bin > truncated.bin
    printf 'not a checkpoint at all' > junk.bin
    refused "unknown option '--frobnicate'" "$LOOM" sample small.bin --frobnicate 1
    refused "--tokens -1: expected an integer from 0 to 1000000" "$LOOM" sample small.bin --tokens -1
    refused "--tokens 1x: expected an integer" "$LOOM" sample small.bin --tokens 1x
    refused "--temperature -0.5: expected a number >= 0" "$LOOM" sample small.bin --temperature -0.5
    refused "--temperature nan: expected a number >= 0" "$LOOM" sample small.bin --temperature nan
    refused "--top-k -1: expected an integer >= 0" "$LOOM" sample small.bin --top-k -1
    refused "--top-k 129: the model has only 128 tokens; give at most 128" "$LOOM" sample small.bin --top-k 129
    refused "--seed -3: expected an integer >= 0" "$LOOM" sample small.bin --seed -3
    refused "--seed does nothing when sampling is greedy" "$LOOM" sample small.bin --temperature 0 --seed 3
    refused "--seed does nothing when sampling is greedy" "$LOOM" sample small.bin --top-k 1 --seed 3
    refused "--top-k does nothing with --temperature 0" "$LOOM" sample small.bin --temperature 0 --top-k 5
    refused "--tokens needs a value" "$LOOM" sample small.bin --tokens
    refused "--prompt given twice" "$LOOM" sample small.bin --prompt a --prompt b
    refused "one checkpoint only" "$LOOM" sample small.bin big.bin
    refused "--prompt: byte 1 is 0xc3, outside the model's vocabulary of 128 tokens" "$LOOM" sample small.bin --prompt "hé"
    refused "--tokenizer swap.bin has 256 tokens, the model in small.bin has 128" "$LOOM" sample small.bin --tokenizer swap.bin
    refused "names no end-of-text token to start an empty prompt from; give --prompt TEXT" "$LOOM" sample small.bin --tokenizer v1.bin
    refused "the model has 300 tokens, more than bytes; give its tokenizer with --tokenizer FILE" "$LOOM" sample big.bin
    refused "checkpoint absent.bin: No such file or directory" "$LOOM" sample absent.bin
    refused "truncated.bin: truncated" "$LOOM" sample truncated.bin
    refused "junk.bin': not a loom checkpoint" "$LOOM" sample junk.bin
    refused "nor is it an llm.c checkpoint (magic 20240326)" "$LOOM" sample junk.bin
    refused "tokenizer absent.bin: cannot open" "$LOOM" sample small.bin --tokenizer absent.bin
    refused "tokenizer junk.bin: not a tokenizer file" "$LOOM" sample small.bin --tokenizer junk.bin
    mkdir empty
    refused "no meta.loom in it" "$LOOM" sample empty
    # weights that are not finite: refused at load, naming the first
    $FILES nan-model nan.bin 128
    refused "nan.bin: wte, element 3 is NaN, and 2 of the 1976 parameters are not finite" \
        "$LOOM" sample nan.bin --tokens 20
    [ ! -s out.txt ] || { od -c out.txt | head; fail "text printed from NaN weights"; }
    # finite weights whose logits overflow: refused before the first token,
    # never a NUL byte (token 0) printed for it
    $FILES huge-model huge.bin 128
    refused "huge.bin: the model's logits for token 1 are not finite (128 of 128 are NaN or" \
        "$LOOM" sample huge.bin --prompt hi --tokens 20
    printf 'hi\n' > want.txt
    same want.txt out.txt
    # a FIFO is refused at once, not opened to wait for a writer
    mkfifo fifo
    refused "checkpoint fifo: it is a FIFO, not a regular file" timeout 20 "$LOOM" sample fifo
    refused "tokenizer fifo: cannot open: it is a FIFO, not a regular file" \
        timeout 20 "$LOOM" sample small.bin --tokenizer fifo
    # the usage without a checkpoint
    if "$LOOM" sample > out.txt 2> err.txt; then fail "accepted no checkpoint"; fi
    grep -q "usage: loom sample CHECKPOINT" err.txt || { cat err.txt; fail "no usage"; }
    echo "sample: every bad argument and file refused with one line" ;;
train)
    # a sample after steps 15 and 30 of 40, each right after its progress line
    train every --set train.sample_every=15 --set train.sample_tokens=20
    [ "$(grep -c '^sample: ' every.log)" = 2 ] || { cat every.log; fail "not 2 sample lines"; }
    for s in 15 30; do
        grep -A1 "^step  *$s/40 " every.log | tail -n 1 | grep -q '^sample: ' ||
            { cat every.log; fail "no sample after step $s"; }
    done
    [ "$(samples every.log | head -n 1 | wc -c)" -ge 21 ] || fail "a sample of fewer than 20 tokens"
    [ ! -e checkpoints ] || fail "the sample left train.checkpoint_dir behind"
    # the sample at step 20 is `loom sample`'s greedy text from the weights of
    # step 20, which starts from a newline too; escaped to one line
    train at20 --set train.steps=20 --set train.sample_every=20 --set train.sample_tokens=48 --save at20.bin
    samples at20.log > trained.txt
    "$LOOM" sample at20.bin --tokens 48 --temperature 0 | head -c 48 | $FILES escape > sampled.txt
    same trained.txt sampled.txt
    # a vocabulary larger than bytes: token ids, 8 of them
    train ids --set model.vocab=300 --set model.padded_vocab=320 --set model.layers=1 \
        --set train.steps=2 --set train.sample_every=2 --set train.sample_tokens=8
    samples ids.log | grep -Eq '^tokens( [0-9]+){8}$' || { cat ids.log; fail "no 8 token ids"; }
    # the settings
    printf 'train = { sample_tokens = 8; };\n' > bad.cfg
    refused "bad.cfg:1: train.sample_tokens: does nothing without samples; set train.sample_every = N" \
        "$LOOM" train bad.cfg --set data.train="$DATA"
    refused "train.sample_tokens: does nothing without samples" \
        "$LOOM" train "$CFG" --set data.train="$DATA" --set train.sample_tokens=8
    refused "train.sample_every" "$LOOM" train "$CFG" --set data.train="$DATA" --set train.sample_every=-1
    refused "train.sample_tokens" "$LOOM" train "$CFG" --set data.train="$DATA" --set train.sample_every=5 --set train.sample_tokens=0
    echo "sample: train.sample_every prints at the right steps what loom sample prints" ;;
ranks)
    every="--set train.sample_every=20 --set train.sample_tokens=48"
    train one $every
    samples one.log > one.txt
    [ "$(wc -l < one.txt)" = 2 ] || fail "not 2 samples on one rank"
    for mesh in "parallel.dp.size=2 --set parallel.dp.strategy=zero3" "parallel.tp.size=2" \
                "parallel.pp.size=2"; do
        name=$(echo "$mesh" | sed 's/parallel\.\([a-z]*\)\.size=2.*/\1/')
        # shellcheck disable=SC2086
        "$LOOM" launch -n 2 -- "$LOOM" train "$CFG" --set data.train="$DATA" $every \
            --set $mesh --set train.checkpoint_every=20 --set train.checkpoint_dir="ck_$name" \
            > "$name.log" 2>&1 || { cat "$name.log"; fail "$name run failed"; }
        samples "$name.log" > "$name.txt"
        same one.txt "$name.txt"
        "$LOOM" sample "ck_$name/step-20" --prompt "The " --tokens 48 --temperature 0 > "$name.sample"
    done
    train single --set train.steps=20 --save single.bin
    "$LOOM" sample single.bin --prompt "The " --tokens 48 --temperature 0 > single.sample
    for name in dp tp pp; do same single.sample "$name.sample"; done
    echo "sample: the same greedy samples on 1 rank, 2 zero3 ranks, 2 tp ranks and 2 pp ranks, in training and from their checkpoints" ;;
*)
    fail "unknown case $CASE" ;;
esac
