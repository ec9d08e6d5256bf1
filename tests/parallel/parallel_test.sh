#!/bin/sh
# The tensor and sequence axes end to end: each case runs `loom train` with
# --metrics and checks per-step losses against a single rank (the numerics
# contract: the README's Tests), per-layer communication from the groups' counters
# and per-layer activation bytes against the formulas of
# docs/parallelism.md, and one-line errors for bad layouts.
#   usage: parallel_test.sh LOOM SOURCE_DIR CASE [BACKEND]
set -eu
LOOM=$1
SRC=$2
CASE=$3
BACKEND=${4:-mpi}
CFG=$SRC/tests/parallel/tiny.cfg
DATA=$SRC/examples/data/corpus.bin
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cd "$TMP"

# The model of tiny.cfg, for the formulas: micro-batch b sequences of s
# tokens, h channels, a heads.
b=8 s=48 h=64 a=4

fail() { echo "parallel_test: $*"; exit 1; }

# run NAME RANKS [--set ...]: metrics in NAME.jsonl
run() {
    run_name=$1; run_ranks=$2; shift 2
    if [ "$run_ranks" = 1 ]; then
        "$LOOM" train "$CFG" --set data.train="$DATA" --metrics "$run_name.jsonl" "$@" \
            > "$run_name.log" 2>&1 || { cat "$run_name.log"; fail "run $run_name failed"; }
    else
        "$LOOM" launch -n "$run_ranks" -- "$LOOM" train "$CFG" --set data.train="$DATA" \
            --set comm.default="$BACKEND" --metrics "$run_name.jsonl" "$@" > "$run_name.log" 2>&1 ||
            { cat "$run_name.log"; fail "run $run_name failed"; }
    fi
}

# field NAME KEY: the key's value in each line of NAME.jsonl
field() { sed "s/.*\"$2\": \([^,}]*\).*/\1/" "$1.jsonl"; }

# compare A B TOL: per-step relative difference of loss and grad norm <= TOL
compare() {
    [ -s "$1.jsonl" ] && [ -s "$2.jsonl" ] || fail "$1 or $2 has no steps"
    for key in loss grad_norm; do
        field "$1" $key > a.txt
        field "$2" $key > b.txt
        paste a.txt b.txt | awk -v tol="$3" -v a="$1" -v b="$2" -v key=$key '
            { d = $1 - $2; if (d < 0) d = -d; r = d / ($1 < 0 ? -$1 : $1);
              if (r > worst) worst = r;
              if (r > tol) { printf "step %d %s: %s %s, %s %s (relative %.3g > %g)\n", NR, key, a, $1, b, $2, r, tol; bad = 1 } }
            END { printf "%s vs %s: %s worst relative difference %.3g over %d steps\n", a, b, key, worst, NR; exit bad }' ||
            exit 1
    done
}

# numerics RANKS [--set ...]: the run reproduces the single rank to 1e-5
numerics() {
    ranks=$1; shift
    run single 1
    run parallel "$ranks" "$@"
    [ "$(wc -l < parallel.jsonl)" = 10 ] || fail "parallel run did $(wc -l < parallel.jsonl) steps, want 10"
    compare single parallel 1e-5
}

# counter NAME KEY: "tp.allreduce" of the last step's comm_bytes (or
# comm_calls with KIND=calls), 0 when absent
counter() {
    tail -n 1 "$1.jsonl" | grep -o "\"comm_${KIND:-bytes}\": {[^}]*}" |
        grep -o "\"$2\": [0-9]*" | sed 's/.*: //' | grep . || echo 0
}

activations() { tail -n 1 "$1.jsonl" | sed 's/.*"activations": \([0-9]*\).*/\1/'; }

# per_layer RANKS [--set ...]: runs of 1 and 2 layers; their difference is
# what one layer costs
per_layer() {
    ranks=$1; shift
    run one "$ranks" --set train.steps=2 --set model.layers=1 "$@"
    run two "$ranks" --set train.steps=2 --set model.layers=2 "$@"
}

# expect WHAT KEY WANT: the per-layer difference of a counter
expect() {
    got=$(( $(KIND=$1 counter two "$2") - $(KIND=$1 counter one "$2") ))
    [ "$got" = "$3" ] || fail "$2 $1 per layer: $got, want $3"
    echo "$2 $1 per layer: $got"
}

expect_activations() {
    got=$(( $(activations two) - $(activations one) ))
    [ "$got" = "$1" ] || fail "activation bytes per layer: $got, want $1 ($2)"
    echo "activation bytes per layer: $got = $2"
}

# bad RANKS TEXT [--set ...]: the run fails with one line naming TEXT
bad() {
    ranks=$1; text=$2; shift 2
    if "$LOOM" launch -n "$ranks" -- "$LOOM" train "$CFG" --set data.train="$DATA" \
        --set comm.default="$BACKEND" "$@" > bad.log 2>&1; then
        cat bad.log; fail "the run did not fail"
    fi
    # the launcher stops the others once one rank fails: the first one says why
    line=$(grep '^\[[0-9]*\] loom train: ' bad.log | head -n 1)
    [ -n "$line" ] || { cat bad.log; fail "no rank printed an error"; }
    echo "$line"
    case "$line" in *"$text"*) ;; *) fail "the error does not say '$text'" ;; esac
    # one line: a rank prints its error and nothing else
    for r in $(sed -n 's/^\[\([0-9]*\)\].*/\1/p' bad.log | sort -u); do
        [ "$(grep -c "^\[$r\]" bad.log)" = 1 ] || { cat bad.log; fail "rank $r printed more than one line"; }
    done
}

tp=parallel.tp.size sp=parallel.sp.size dp=parallel.dp.size
seqpar="--set parallel.tp.sequence_parallel=true"
ring="--set parallel.sp.strategy=ring"
zigzag="--set parallel.sp.balance=zigzag"

case "$CASE" in
tp2) numerics 2 --set $tp=2 ;;
tp4) numerics 4 --set $tp=4 ;;
tp2_seqpar) numerics 2 --set $tp=2 $seqpar ;;
ulysses2) numerics 2 --set $sp=2 ;;
ulysses4) numerics 4 --set $sp=4 ;;
ring2) numerics 2 --set $sp=2 $ring ;;
ring3) numerics 3 --set $sp=3 $ring ;;
ring2_zigzag) numerics 2 --set $sp=2 $ring $zigzag ;;
ring3_zigzag) numerics 3 --set $sp=3 $ring $zigzag ;;
dp2_tp2_*) numerics 4 --set $dp=2 --set $tp=2 --set parallel.dp.strategy="${CASE#dp2_tp2_}" ;;
dp2_ring2) numerics 4 --set $dp=2 --set $sp=2 $ring ;;
tp2_sp2)
    numerics 4 --set $tp=2 --set $sp=2
    run parallel 4 --set $tp=2 $seqpar --set $sp=2 $ring $zigzag
    compare single parallel 1e-5 ;;
volume_tp)
    # two all-reduces of b·s·h in forward (attention and MLP outputs), two
    # in backward (their inputs' gradients); activations: the LayerNorm and
    # residual part whole, the rest split t ways
    per_layer 2 --set $tp=2
    expect bytes tp.allreduce $((4 * b * s * h * 4))
    expect calls tp.allreduce 4
    expect_activations $((4 * (b*s*h * (4 + 12/2) + 4*b*s + a*b*s/2))) "4(bsh(4 + 12/t) + 4bs + abs/t)" ;;
volume_tp_seqpar)
    # the all-reduces become all-gather + reduce-scatter of the same bytes;
    # backward gathers the two LayerNorm outputs again (Megatron keeps only
    # this rank's rows), and sums the LayerNorm and row-parallel bias
    # gradients (6h) over the tp group; every activation split t ways
    per_layer 2 --set $tp=2 $seqpar
    expect bytes tp.allgather $((6 * b * s * h * 4))
    expect bytes tp.reducescatter $((4 * b * s * h * 4))
    expect calls tp.allgather 6
    expect calls tp.reducescatter 4
    expect bytes tp.allreduce $((6 * h * 4))
    expect_activations $((4 * (16 * b*s*h + 4*b*s + a*b*s) / 2)) "4(16bsh + 4bs + abs)/t" ;;
volume_ulysses)
    # four all-to-alls of b·s·h/p each way (q, k, v, out; dout, dq, dk, dv);
    # the layer's gradients summed over the sp group; activations: the
    # model's share of s/p positions plus the head-sharded q, k, v, out, lse
    per_layer 2 --set $sp=2
    expect bytes sp.alltoall $((8 * b * s * h / 2 * 4))
    expect calls sp.alltoall 8
    layer=$((12 * h * h + 13 * h))
    expect bytes sp.allreduce $((layer * 4))
    expect_activations $((4 * (16*b*s*h + 4*b*s + a*b*s) / 2 + 4 * (4*b*s*h + a*b*s) / 2)) \
        "4(16bsh + 4bs + abs)/p + 4(4bsh + abs)/p" ;;
volume_ring)
    # forward: p-1 K/V block transfers; backward: p-1 K/V and p dK/dV
    # (the last brings each block's gradient home); a block is 2·b·(s/p)·h
    per_layer 3 --set $sp=3 $ring
    block=$((2 * b * s / 3 * h * 4))
    expect bytes sp.send $(((2 + 2 + 3) * block))
    expect calls sp.send 7
    expect bytes sp.recv $(((2 + 2 + 3) * block))
    expect_activations $((4 * (16*b*s*h + 4*b*s + a*b*s) / 3)) "4(16bsh + 4bs + abs)/p" ;;
checkpoint)
    # --save gathers the tp slices into llm.c's layout: a run loading either
    # file starts from the same loss
    run single 1 --set train.steps=3 --save "$TMP/single.bin"
    run tp 2 --set $tp=2 --set train.steps=3 --save "$TMP/tp.bin"
    run from_single 1 --set train.steps=1 --set model.init=checkpoint --set model.checkpoint="$TMP/single.bin"
    run from_tp 1 --set train.steps=1 --set model.init=checkpoint --set model.checkpoint="$TMP/tp.bin"
    compare from_single from_tp 1e-5
    # each tp rank saves its slices; a tp=2 run resumes on 1 and 4 ranks
    run whole 2 --set $tp=2 --set train.checkpoint_every=5 --set train.checkpoint_dir="$TMP/ckpt"
    run resumed 2 --set $tp=2 --resume "$TMP/ckpt/step-5"
    run resumed4 4 --set $tp=4 --resume "$TMP/ckpt/step-5"
    run resumed1 1 --resume "$TMP/ckpt/step-5"
    tail -n 5 whole.jsonl > last5.jsonl
    for r in resumed resumed4 resumed1; do
        [ "$(wc -l < $r.jsonl)" = 5 ] || fail "$r did $(wc -l < $r.jsonl) steps, want 5"
        compare last5 $r 1e-5
    done ;;
bad_tp_heads) bad 3 "parallel.tp.size=3: tp: parallel.tp.size = 3 does not divide model.heads = 4" --set $tp=3 ;;
bad_tp_vocab) bad 2 "does not divide model.padded_vocab = 257" --set $tp=2 --set model.padded_vocab=257 ;;
bad_ulysses_heads) bad 3 "parallel.sp.size=3: ulysses: parallel.sp.size = 3 does not divide the 4 attention heads" --set $sp=3 ;;
bad_sp_seq) bad 3 "parallel.sp.size=3: ring: train.seq = 32 does not divide into 3 blocks" --set $sp=3 $ring --set train.seq=32 ;;
bad_zigzag_seq) bad 2 "train.seq = 42 does not divide into 4 zigzag chunks" --set $sp=2 $ring $zigzag --set train.seq=42 ;;
bad_mesh) bad 2 "parallel.tp.size=4: mesh tp × sp × pp × dp = 4 × 1 × 1 × 1 = 4, but the job has 2 ranks" --set $tp=4 ;;
bad_seqpar_rows) bad 2 "sequence parallelism splits the 3 token rows" --set $tp=2 $seqpar --set train.batch=1 --set train.seq=3 ;;
*)
    echo "parallel_test: unknown case $CASE"; exit 2 ;;
esac
