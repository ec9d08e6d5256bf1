#!/bin/sh
# Pipelines end to end: `loom train` on a pp × (dp, tp, sp) mesh against the
# single-rank run (the numerics contract: the README's Tests), the activation stash of
# each schedule from the memory accounting, the measured bubble, the tied
# embedding across the first and last stage, checkpoints, and bad configs.
#   usage: pipeline_test.sh LOOM SOURCE_DIR CASE [ARGS...]
#     contract SCHEDULE P M [V] [BACKEND] [--set ...] | mesh DP TP PP [DP_STRATEGY] | sequence SP_STRATEGY | stash |
#     precision PRECISION | recompute | checkpoint | example | trace | bad NAME |
#     adapted SCHEDULE_SO STRATEGY_KIND_SO
set -eu
LOOM=$1
SRC=$2
CASE=$3
shift 3
CFG=$SRC/tests/pipeline/pp.cfg
DATA=$SRC/examples/data/corpus.bin
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cd "$TMP"

# run NAME RANKS [--set ...]: metrics in NAME.jsonl, output in NAME.log
run() {
    run_name=$1; run_ranks=$2; shift 2
    if [ "$run_ranks" = 1 ]; then
        set -- "$LOOM" train "$CFG" --set data.train="$DATA" --metrics "$run_name.jsonl" "$@"
    else
        set -- "$LOOM" launch -n "$run_ranks" -- "$LOOM" train "$CFG" --set data.train="$DATA" \
            --metrics "$run_name.jsonl" "$@"
    fi
    "$@" > "$run_name.log" 2>&1 || { cat "$run_name.log"; echo "pipeline_test: run $run_name failed"; exit 1; }
}

losses() { sed 's/.*"loss": \([^,]*\),.*/\1/' "$1.jsonl"; }

# compare A B TOL: per-step relative difference <= TOL
compare() {
    losses "$1" > a.txt
    losses "$2" > b.txt
    [ "$(wc -l < a.txt)" -gt 0 ] || { echo "pipeline_test: $1 has no steps"; exit 1; }
    [ "$(wc -l < a.txt)" = "$(wc -l < b.txt)" ] || { echo "pipeline_test: $1 and $2 ran different step counts"; exit 1; }
    paste a.txt b.txt | awk -v tol="$3" -v a="$1" -v b="$2" '
        { d = $1 - $2; if (d < 0) d = -d; r = d / ($1 < 0 ? -$1 : $1); if (r > worst) worst = r;
          if (r > tol) { printf "step %d: %s %s, %s %s (relative %.3g > %g)\n", NR, a, $1, b, $2, r, tol; bad = 1 } }
        END { printf "%s vs %s: worst relative difference %.3g over %d steps\n", a, b, worst, NR; exit bad }'
}

# field NAME KEY: the last step's value of a numeric metric
field() { tail -n 1 "$1.jsonl" | sed -n "s/.*\"$2\": \([0-9.e+-]*\).*/\1/p"; }
activations() { tail -n 1 "$1.jsonl" | sed -n 's/.*"host": {[^}]*"activations": \([0-9]*\).*/\1/p'; }

pp() { echo "--set parallel.pp.size=$1 --set parallel.pp.microbatches=$2 --set parallel.pp.schedule=$3"; }

# bad NAME RANKS EXPECTED [--set ...]: the run fails with one line containing EXPECTED
bad() {
    bad_name=$1; bad_ranks=$2; bad_want=$3; shift 3
    if [ "$bad_ranks" = 1 ]; then
        set -- "$LOOM" train "$CFG" --set data.train="$DATA" "$@"
    else
        set -- "$LOOM" launch -n "$bad_ranks" -- "$LOOM" train "$CFG" --set data.train="$DATA" "$@"
    fi
    if "$@" > "$bad_name.log" 2>&1; then
        cat "$bad_name.log"; echo "pipeline_test: $bad_name was accepted"; exit 1
    fi
    grep -F -q -- "$bad_want" "$bad_name.log" || { cat "$bad_name.log"; echo "pipeline_test: $bad_name: no line saying: $bad_want"; exit 1; }
    echo "$bad_name refused: $(grep -F -m1 -- "$bad_want" "$bad_name.log")"
}

case "$CASE" in
contract)
    # SCHEDULE P M [V] [BACKEND]
    sched=$1; p=$2; m=$3; v=${4:-1}; backend=${5:-mpi}
    shift $(($# < 5 ? $# : 5)) # the rest: --set flags of the pipelined run
    # three stages: the four blocks split unevenly, 12 sequences a batch
    uneven=""; batch=""
    [ "$p" = 3 ] && uneven="--set parallel.pp.stage_layers=1,1,2" && batch="--set train.batch=12"
    run single 1 $batch
    run piped "$p" $(pp "$p" "$m" "$sched") --set parallel.pp.virtual_stages="$v" --set comm.default="$backend" $uneven $batch "$@"
    grep -q "bubble" piped.log || { cat piped.log; echo "pipeline_test: no bubble on the progress line"; exit 1; }
    compare single piped 1e-5 ;;
mesh)
    # DP TP PP [DP_STRATEGY]: 1f1b with 2·PP micro-batches
    dp=$1; tp=$2; p=$3; strategy=${4:-ddp}
    batch="--set train.batch=$((dp * 2 * p))"
    run single 1 $batch
    run meshed $((dp * tp * p)) $(pp "$p" $((2 * p)) 1f1b) --set parallel.dp.size="$dp" \
        --set parallel.dp.strategy="$strategy" --set parallel.tp.size="$tp" $batch
    compare single meshed 1e-5 ;;
sequence)
    # SP_STRATEGY: sp=2 x pp=2, each stage's attention split over the sequence
    run single 1
    run seq 4 $(pp 2 4 1f1b) --set parallel.sp.size=2 --set parallel.sp.strategy="$1"
    compare single seq 1e-5 ;;
stash)
    # The activation stash on stage 0 (rank 0) from the accounting: 1F1B
    # keeps at most p micro-batches alive, GPipe all m. Micro-batches of
    # one sequence throughout (batch = m), so every run's slots and shared
    # buffers are alike: GPipe's growth from m = 4 to 8 is four slots.
    for s in gpipe 1f1b; do
        for m in 4 8; do
            run "$s$m" 2 $(pp 2 "$m" "$s") --set train.batch="$m" --set train.steps=2
        done
    done
    g4=$(activations gpipe4); g8=$(activations gpipe8); f4=$(activations 1f1b4); f8=$(activations 1f1b8)
    echo "stage 0 activation peaks (bytes): gpipe m=4 $g4, m=8 $g8; 1f1b m=4 $f4, m=8 $f8"
    awk -v g4="$g4" -v g8="$g8" -v f4="$f4" -v f8="$f8" 'BEGIN {
        slot = (g8 - g4) / 4
        if (slot <= 0 || slot != int(slot)) { print "pipeline_test: gpipe does not grow by whole slots"; exit 1 }
        printf "one micro-batch slot: %d bytes\n", slot
        if (f4 != f8) { print "pipeline_test: 1f1b keeps more with more micro-batches"; exit 1 }
        if (g8 - f8 != 6 * slot) { printf "pipeline_test: 1f1b keeps %g slots at m=8, want 2 (p)\n", 8 - (g8 - f8) / slot; exit 1 }
        print "stage 0 keeps p = 2 micro-batches under 1f1b, m = 8 under gpipe"
    }' || exit 1
    [ "$(field 1f1b8 live_microbatches)" = 2 ] || { echo "pipeline_test: 1f1b reports $(field 1f1b8 live_microbatches) live micro-batches, want 2"; exit 1; }
    [ "$(field gpipe8 live_microbatches)" = 8 ] || { echo "pipeline_test: gpipe reports $(field gpipe8 live_microbatches) live micro-batches, want 8"; exit 1; }
    # interleaved: each virtual stage keeps its own micro-batches; what every
    # stage keeps alive equals the simulator's stash for the same lists
    run inter 2 $(pp 2 8 interleaved) --set parallel.pp.virtual_stages=2 --set train.batch=8 --set train.steps=2
    got=$(tail -n 1 inter.jsonl | sed -n 's/.*"stage_live_microbatches": \[\([0-9, ]*\)\].*/\1/p' | tr -d ' ')
    "$LOOM" schedule "$CFG" $(pp 2 8 interleaved) --set parallel.pp.virtual_stages=2 > sim.txt
    want=$(sed -n 's/.*peak stash.*: rank 0: \([0-9]*\), rank 1: \([0-9]*\)$/\1,\2/p' sim.txt)
    [ -n "$want" ] && [ "$got" = "$want" ] || { cat sim.txt; echo "pipeline_test: interleaved keeps $got alive per stage, the simulator $want"; exit 1; }
    echo "interleaved p=2 v=2 m=8: stages keep $got (virtual stage, micro-batch) pairs, as simulated" ;;
precision)
    run single 1 --set train.precision="$1"
    run piped 2 $(pp 2 4 1f1b) --set train.precision="$1"
    compare single piped 2e-2 ;;
recompute)
    run single 1
    run piped 2 $(pp 2 4 zb-h1) --set train.recompute=block
    compare single piped 1e-5 ;;
checkpoint)
    # a pp=2 run saves a sharded checkpoint (each stage its units) and the
    # llm.c weights; it resumes on pp=2 and on one rank
    run whole 2 $(pp 2 4 1f1b) --set train.checkpoint_every=5 --set train.checkpoint_dir="$TMP/ckpt" --save "$TMP/pp.bin"
    run single 1 --save "$TMP/single.bin"
    compare single whole 1e-5
    run again 2 $(pp 2 4 1f1b) --resume "$TMP/ckpt/step-5"
    run one 1 --resume "$TMP/ckpt/step-5"
    tail -n 5 whole.jsonl > last5.jsonl
    compare last5 again 1e-5
    compare last5 one 1e-5
    run from_pp 1 --set train.steps=1 --set model.init=checkpoint --set model.checkpoint="$TMP/pp.bin"
    run from_single 1 --set train.steps=1 --set model.init=checkpoint --set model.checkpoint="$TMP/single.bin"
    compare from_single from_pp 1e-5 ;;
example)
    # the shipped example as the README runs it (fewer steps): pp 2 x dp 2
    "$LOOM" launch -n 4 -- "$LOOM" train "$SRC/examples/pipeline.cfg" --set data.train="$DATA" \
        --set train.steps=8 --metrics example.jsonl > example.log 2>&1 || { cat example.log; exit 1; }
    losses example | awk 'NR == 1 { first = $1 } { last = $1 }
        END { if (!(last < first - 0.5)) { print "pipeline_test: example loss " first " -> " last; exit 1 }
              print "example: loss " first " -> " last }' || exit 1
    "$LOOM" schedule "$SRC/examples/pipeline.cfg" --svg example.svg > schedule.log 2>&1 || { cat schedule.log; exit 1; }
    grep -q "<svg" example.svg || { echo "pipeline_test: loom schedule wrote no SVG"; exit 1; }
    grep "bubble" schedule.log ;;
adapted)
    # one schedule built as a schedule and as a strategy of the pp axis
    # (before ABI 1.8, loaded through the adapter): the same losses, bit for bit
    for p in 2 3; do
        uneven=""; [ "$p" = 3 ] && uneven="--set parallel.pp.stage_layers=1,1,2"
        run "new$p" "$p" $(pp "$p" 4 "$1") --set train.batch=12 $uneven
        run "old$p" "$p" $(pp "$p" 4 "$2") --set train.batch=12 $uneven
        grep -q "; filldrain schedule over $p stages;" "new$p.log" || { cat "new$p.log"; echo "pipeline_test: no schedule in the header"; exit 1; }
        compare "new$p" "old$p" 0
    done ;;
trace)
    run traced 2 $(pp 2 4 zb-h1) --set train.steps=2 --trace "$TMP/trace.json"
    for want in '"name":"forward mb 0"' '"name":"backward-input mb 3"' '"name":"backward-weight mb 3"' '"pid":1'; do
        grep -q "$want" "$TMP/trace.json" || { echo "pipeline_test: the trace lacks $want"; exit 1; }
    done
    echo "trace: forward, backward-input and backward-weight spans on both stages" ;;
bad)
    case "$1" in
    accum) bad accum 2 "with a pipeline, parallel.pp.microbatches is the gradient accumulation" $(pp 2 4 1f1b) --set train.grad_accum=2 ;;
    zero3) bad zero3 4 "strategy zero3 requires parameters complete only between its forward and backward hooks (it declares LOOM_STRATEGY_PARAMS_SHARDED), but a pipeline keeps each stage's parameters whole at rest" $(pp 2 2 1f1b) --set parallel.dp.size=2 --set parallel.dp.strategy=zero3 ;;
    split) bad split 2 "model.layers = 4 do not split evenly over 6 stages" $(pp 2 2 interleaved) --set parallel.pp.virtual_stages=3 ;;
    stage_layers) bad stage_layers 2 "the stages hold 3 layers, the model has 4" $(pp 2 2 1f1b) --set parallel.pp.stage_layers=1,2 ;;
    batch) bad batch 2 "train.batch 8 does not divide by parallel.dp.size 1 × parallel.pp.microbatches 3" $(pp 2 3 1f1b) ;;
    interleaved) bad interleaved 2 "interleaved" $(pp 2 3 interleaved) --set train.batch=6 --set parallel.pp.virtual_stages=2 ;;
    *) echo "pipeline_test: unknown bad case $1"; exit 2 ;;
    esac ;;
*)
    echo "pipeline_test: unknown case $CASE"; exit 2 ;;
esac
