#!/bin/sh
# ZeRO end to end: `loom train` with --metrics under zero1/zero2/zero3
# against the single-rank run (the numerics contract: the README's Tests), accumulation,
# recomputation, bf16, the model-state bytes per rank, checkpoints across
# strategies and rank counts, and the trace.
#   usage: zero_test.sh LOOM SOURCE_DIR CASE [ARGS...]
#     contract STRATEGY RANKS BACKEND | accum S | recompute S | bf16 S | clip S |
#     prefetch P | formulas S PRECISION [SHARD] | checkpoint | trace |
#     hsdp BACKEND | hsdp_checkpoint
set -eu
LOOM=$1
SRC=$2
CASE=$3
shift 3
CFG=$SRC/tests/zero/tiny.cfg
DATA=$SRC/examples/data/corpus.bin
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cd "$TMP"

TEST=zero_test
. "$SRC/tests/common/train_runs.sh"

# comm NAME OP: the dp group's payload bytes of OP in the last step
comm() { tail -n 1 "$1.jsonl" | sed -n "s/.*\"comm_bytes\": {[^}]*\"dp.$2\": \([0-9]*\).*/\1/p"; }

case "$CASE" in
contract)
    strategy=$1; ranks=$2; backend=$3
    run single 1
    run "$strategy" "$ranks" --set parallel.dp.strategy="$strategy" --set comm.default="$backend"
    grep -q "$strategy over $ranks ranks" "$strategy.log" || { cat "$strategy.log"; echo "zero_test: header does not name $strategy"; exit 1; }
    grep -q "dp over $backend" "$strategy.log" || { cat "$strategy.log"; echo "zero_test: not over $backend"; exit 1; }
    compare single "$strategy" 1e-5 ;;
hsdp)
    # zero3 in shard groups of 2, two replicas, at 4 ranks
    backend=$1
    run single 1
    run hsdp 4 --set parallel.dp.strategy=zero3 --set parallel.dp.shard_size=2 --set comm.default="$backend" \
        --trace "$TMP/trace.json"
    # each unit's gradient shard crosses the replicas: a span per unit
    for want in '"name":"zero3 allreduce block 0"' '"name":"zero3 allreduce embedding"' '"name":"zero3 reducescatter head"'; do
        grep -q "$want" "$TMP/trace.json" || { echo "zero_test: trace lacks $want"; exit 1; }
    done
    grep -q "zero3 over 4 ranks, shard groups of 2 (HSDP: 2 replicas)" hsdp.log || { cat hsdp.log; echo "zero_test: header does not name HSDP"; exit 1; }
    grep -q "dp over $backend" hsdp.log || { cat hsdp.log; echo "zero_test: not over $backend"; exit 1; }
    compare single hsdp 1e-5
    # a shard size that does not divide the dp size: one line naming it
    if "$LOOM" launch -n 4 -- "$LOOM" train "$CFG" --set data.train="$DATA" --set parallel.dp.size=4 \
        --set parallel.dp.strategy=zero3 --set parallel.dp.shard_size=3 --set comm.default="$backend" > bad.log 2>&1; then
        echo "zero_test: shard_size 3 of dp 4 was accepted"; exit 1
    fi
    grep -q "parallel.dp.shard_size = 3 does not divide parallel.dp.size = 4" bad.log || { cat bad.log; echo "zero_test: no clear refusal"; exit 1; }
    echo "refused: $(grep -m1 "does not divide" bad.log)" ;;
accum)
    strategy=$1
    run k1 1
    run k3 2 --set parallel.dp.strategy="$strategy" --set train.grad_accum=3
    run k2 3 --set parallel.dp.strategy="$strategy" --set train.grad_accum=2 --set train.batch=12
    compare k1 k3 1e-5
    compare k1 k2 1e-5 ;;
recompute)
    strategy=$1
    run plain 1 --set model.layers=3
    run recompute 2 --set model.layers=3 --set parallel.dp.strategy="$strategy" --set train.recompute=block
    compare plain recompute 1e-5 ;;
bf16)
    # the tolerance the model issue set for 16-bit runs against fp32: 2%
    strategy=$1
    run fp32 1 --set train.steps=20
    run bf16 1 --set train.steps=20 --set train.precision=bf16
    run "$strategy" 2 --set train.steps=20 --set train.precision=bf16 --set parallel.dp.strategy="$strategy"
    compare fp32 "$strategy" 0.02
    compare bf16 "$strategy" 0.02
    falls "$strategy" ;;
clip)
    # clipping by the global norm: the shards' sums add up over the dp group
    strategy=$1
    run single 1 --set train.clip=0.5
    run "$strategy" 3 --set parallel.dp.strategy="$strategy" --set train.clip=0.5
    compare single "$strategy" 1e-5
    sed 's/.*"grad_norm": \([^,]*\),.*/\1/' single.jsonl > n1.txt
    sed 's/.*"grad_norm": \([^,]*\),.*/\1/' "$strategy.jsonl" > n2.txt
    paste n1.txt n2.txt | awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-5 * $1) { print "step " NR ": norm " $1 " vs " $2; bad = 1 } }
        END { if (!bad) print "global norms agree over " NR " steps (all above the clip of 0.5)"; exit bad }'
    awk '{ if ($1 <= 0.5) { print "norm " $1 " at step " NR " is not clipped"; exit 1 } }' n1.txt ;;
prefetch)
    # zero3 with no prefetch and with two units ahead, three ranks
    run single 1
    run "prefetch$1" 3 --set parallel.dp.strategy=zero3 --set parallel.dp.prefetch="$1"
    grep -q "prefetch $1" "prefetch$1.log" || { cat "prefetch$1.log"; exit 1; }
    compare single "prefetch$1" 1e-5 ;;
formulas)
    # Model-state bytes per rank (host tier, peaks over the step) and bytes
    # on the dp group per step (the comm layer's counters) against the ZeRO
    # formulas, at 1, 2 and 4 ranks, ddp as the baseline; 4 blocks. With
    # SHARD (zero3): at 4 ranks in shard groups of SHARD (HSDP), where the
    # formulas take the shard size for N and add the replica all-reduce.
    strategy=$1; precision=$2; shard=${3:-}
    e=4; [ "$precision" = fp32 ] || e=2
    sizes="1 2 4"; hybrid=""
    [ -z "$shard" ] || { sizes=4; hybrid="--set parallel.dp.shard_size=$shard"; }
    for n in $sizes; do
        run "m$n" "$n" --set train.steps=2 --set model.layers=4 --set parallel.dp.strategy="$strategy" \
            --set train.precision="$precision" $hybrid
        p=$(peak "m$n" params); g=$(peak "m$n" grads); o=$(peak "m$n" optimizer)
        ar=$(comm "m$n" allreduce); ag=$(comm "m$n" allgather); rs=$(comm "m$n" reducescatter)
        # The model's units: the embedding (Vp*C + maxT*C), 4 blocks
        # (12C^2 + 13C), the head (2C); zero pads each to a multiple of 32 x N.
        awk -v s="$strategy" -v e="$e" -v N="$n" -v Sh="${shard:-$n}" -v p="$p" -v g="$g" -v o="$o" \
            -v ar="${ar:-0}" -v ag="${ag:-0}" -v rs="${rs:-0}" '
        function pad(x) { q = 32 * Sh; return int((x + q - 1) / q) * q }
        function max(a, b) { return a > b ? a : b }
        BEGIN {
            n = split("20480 49984 49984 49984 49984 128", numel, " ")
            P = 0; raw = 0
            for (i = 1; i <= n; i++) { u[i] = pad(numel[i]); P += u[i]; raw += numel[i] }
            S = P / Sh; R = N / Sh; w = (e == 4) ? 0 : 4
            # full gradients in flight (zero2/3): the embedding stays open from
            # the head on; beside it the unit in backward and the one being
            # reduce-scattered (backward order: head, blocks, embedding)
            inflight = u[n] + u[1]
            for (i = n; i > 2; i--) inflight = max(inflight, u[1] + u[i] + u[i - 1])
            # gathered parameters (zero3, prefetch 1): in forward a unit and
            # the next (the head brings the tied embedding), in backward the
            # held embedding, the unit and the next
            gathered = 0
            for (i = 1; i < n - 1; i++) gathered = max(gathered, u[i] + u[i + 1])
            gathered = max(gathered, u[n - 1] + u[n] + u[1])   # last block, prefetching head + embedding
            gathered = max(gathered, u[n] + u[1] + u[n - 1])   # head (+ embedding) in backward, next block
            for (i = n - 1; i > 2; i--) gathered = max(gathered, u[1] + u[i] + u[i - 1])
            # at rest: the formula; in flight: what a step adds on top
            rest_p = e * (s == "zero3" ? S : P); rest_g = e * (s == "zero1" ? P : S); fly_p = 0; fly_g = 0
            if (s == "ddp")   { rest_p = e * raw; rest_g = e * raw; wo = (w + 8) * raw; f = "16Ψ" }
            if (s == "zero1") { wo = (w + 8) * S; f = (e == 4 ? "8Ψ + 8Ψ/N" : "4Ψ + 12Ψ/N") }
            if (s == "zero2") { wo = (w + 8) * S; fly_g = e * inflight; f = (e == 4 ? "4Ψ + 12Ψ/N" : "2Ψ + 14Ψ/N") }
            if (s == "zero3") { wo = (w + 8) * S; fly_p = e * gathered; fly_g = e * inflight; f = "16Ψ/N" }
            rest = rest_p + rest_g + wo
            if (R > 1) f = f " (N = shard size " Sh ")"
            printf "%s %s N=%d, Ψ %d padded to %d: params %d grads %d optimizer %d bytes = %s = %d at rest + %d params and %d grads in flight\n",
                   s, (e == 4 ? "fp32" : "bf16"), N, raw, P, p, g, o, f, rest, fly_p, fly_g
            if (p != rest_p + fly_p || g != rest_g + fly_g || o != wo) {
                printf "zero_test: want params %d grads %d optimizer %d\n", rest_p + fly_p, rest_g + fly_g, wo; exit 1 }
            # Communication: payload bytes per op as counted (the loss is one
            # f32 all-reduce; zero adds the norm, one f64), then as a ring moves
            # them: all-reduce 2(N-1)/N, all-gather and reduce-scatter (N-1)/N.
            # HSDP: gathers and reduce-scatters in the shard group (N = Sh),
            # and each shard all-reduced over the R replicas, all counted under dp.
            if (N == 1) exit 0   # a group of one moves nothing
            if (s == "ddp")   { w_ar = e * raw + 4; w_ag = 0; w_rs = 0; k = 2; psi = raw }
            if (s == "zero1" || s == "zero2") { w_ar = 12; w_ag = e * P; w_rs = e * P; k = 2; psi = P }
            if (s == "zero3") { w_ar = 12 + (R > 1 ? e * S : 0); w_ag = 2 * e * P; w_rs = e * P; k = 3; psi = P }
            if (s == "ddp") moved = 2 * (ar - 4) * (N - 1) / N
            else moved = (ag + rs) * (Sh - 1) / Sh + 2 * (ar - 12) * (R - 1) / R
            want = k * psi * e * (Sh - 1) / Sh + (R > 1 ? 2 * e * S * (R - 1) / R : 0)
            printf "  dp traffic: allreduce %d allgather %d reducescatter %d payload bytes; moved %d = %dΨ(N-1)/N%s x %d bytes\n",
                   ar, ag, rs, moved, k, (R > 1 ? " + 2(Ψ/N)(R-1)/R" : ""), e
            if (ar != w_ar || ag != w_ag || rs != w_rs || moved != want) {
                printf "zero_test: want allreduce %d allgather %d reducescatter %d, moved %d\n", w_ar, w_ag, w_rs, want; exit 1 }
        }' || exit 1
    done ;;
checkpoint)
    # zero3 on 4 ranks saves a sharded checkpoint after step 5 (each rank
    # its own quarter, no gathering) and the consolidated llm.c weights
    # after step 10; both load elsewhere.
    z3="--set parallel.dp.strategy=zero3"
    run single 1 --save "$TMP/single.bin"
    run whole 4 $z3 --set train.checkpoint_every=5 --set train.checkpoint_dir="$TMP/ckpt" --save "$TMP/zero3.bin"
    ck=$TMP/ckpt/step-5
    [ -f "$ck/meta.loom" ] || { echo "zero_test: no checkpoint written"; exit 1; }
    "$LOOM" ckpt info "$ck" > info.txt || { cat info.txt; exit 1; }
    cat info.txt
    grep -q "sharded: 4 shard files, tensor-parallel over 1, saved by zero3" info.txt ||
        { echo "zero_test: ckpt info does not describe the shards"; exit 1; }
    # every rank wrote a quarter of the model state: the shards' element
    # counts differ by at most the padding of the units (ALIGN x 4 each)
    sed -n 's/.*shard-[0-9]*   [0-9]* records, \([0-9]*\) elements.*/\1/p' info.txt | awk '
        { n[NR] = $1; sum += $1; if ($1 > hi) hi = $1; if (lo == "" || $1 < lo) lo = $1 }
        END { if (NR != 4) { print "zero_test: " NR " shard files, want 4"; exit 1 }
              if (hi - lo > 6 * 32 * 4) { print "zero_test: shards of " lo " to " hi " elements are not quarters"; exit 1 }
              printf "shards: %d elements in all, %d to %d per rank\n", sum, lo, hi }' || exit 1
    # one resumable file from the shards, and llm.c weights
    "$LOOM" ckpt consolidate "$ck" --state "$TMP/step5.loom" --llmc "$TMP/step5.bin" > cons.log 2>&1 ||
        { cat cons.log; exit 1; }
    "$LOOM" ckpt info "$TMP/step5.loom" | grep -q "consolidated" || { echo "zero_test: consolidated file not recognised"; exit 1; }
    run same 4 $z3 --resume "$ck"
    same_tail whole same 5
    run one 1 --resume "$TMP/step5.loom"
    run two 2 --set parallel.dp.strategy=zero2 --resume "$TMP/step5.loom"
    run two_shards 2 --set parallel.dp.strategy=zero2 --resume "$ck"
    tail -n 5 whole.jsonl > tail.jsonl
    compare tail one 1e-5
    compare tail two 1e-5
    same_tail two two_shards 5
    # a shard file missing: refused, naming what is missing
    rm "$ck/shard-2.loom"
    if "$LOOM" train "$CFG" --set data.train="$DATA" --resume "$ck" > missing.log 2>&1; then
        echo "zero_test: resumed from a checkpoint missing a shard"; exit 1
    fi
    grep -q "shard-2.loom" missing.log || { cat missing.log; echo "zero_test: the missing shard is not named"; exit 1; }
    # the consolidated weights: a single-rank run from them starts where
    # the single-rank run's own saved weights start
    run from_zero3 1 --set train.steps=1 --set model.init=checkpoint --set model.checkpoint="$TMP/zero3.bin"
    run from_single 1 --set train.steps=1 --set model.init=checkpoint --set model.checkpoint="$TMP/single.bin"
    compare from_single from_zero3 1e-5
    awk -v a="$(losses single | head -1)" -v b="$(losses from_zero3)" 'BEGIN { if (!(b < a - 0.3)) { print "loaded loss " b " not below the fresh " a; exit 1 } }' ;;
hsdp_checkpoint)
    # zero3 in shard groups of 2 on 4 ranks: the first shard group writes
    # the shards, the replicas empty files; it resumes under HSDP (the same
    # steps), plain zero3 and ddp.
    hsdp="--set parallel.dp.strategy=zero3 --set parallel.dp.shard_size=2"
    run whole 4 $hsdp --set train.checkpoint_every=5 --set train.checkpoint_dir="$TMP/ckpt"
    ck=$TMP/ckpt/step-5
    "$LOOM" ckpt info "$ck" > info.txt || { cat info.txt; exit 1; }
    cat info.txt
    grep -q "sharded: 4 shard files, tensor-parallel over 1, saved by zero3" info.txt ||
        { echo "zero_test: ckpt info does not describe the shards"; exit 1; }
    sed -n 's/.*shard-\([0-9]*\)   [0-9]* records, \([0-9]*\) elements.*/\1 \2/p' info.txt | awk '
        { n[$1] = $2; sum += $2 }
        END { if (n[2] != 0 || n[3] != 0) { print "zero_test: the replicas wrote " n[2] " and " n[3] " elements"; exit 1 }
              if (n[0] == 0 || n[1] == 0 || n[0] - n[1] > 6 * 32 * 2 || n[1] - n[0] > 6 * 32 * 2) { print "zero_test: shards of " n[0] " and " n[1] " elements are not halves"; exit 1 }
              printf "shards: %d elements in all, %d and %d on the first shard group, none on the replicas\n", sum, n[0], n[1] }' || exit 1
    run same 4 $hsdp --resume "$ck"
    same_tail whole same 5
    tail -n 5 whole.jsonl > tail.jsonl
    run plain 4 --set parallel.dp.strategy=zero3 --resume "$ck"
    run ddp 2 --resume "$ck"
    compare tail plain 1e-5
    compare tail ddp 1e-5 ;;
trace)
    run traced 2 --set train.steps=2 --set parallel.dp.strategy=zero3 --trace "$TMP/trace.json"
    for want in '"pid":0,"tid":0' '"pid":1,"tid":1' '"name":"forward block 1"' \
                '"name":"zero3 allgather block 0"' '"name":"zero3 allgather embedding"' \
                '"name":"zero3 reducescatter head"' '"name":"zero3 reducescatter block 1"' \
                '"name":"allgather"' '"name":"reducescatter"'; do
        grep -q "$want" "$TMP/trace.json" || { echo "zero_test: trace lacks $want"; exit 1; }
    done
    # The prefetched gather of block 1 is in flight while block 0 computes.
    awk -F'[:,]' '
        /"pid":0,"tid":0/ && /"name":"forward block 0"/ && !cseen { cseen = 1; for (i = 1; i < NF; i++) { if ($i == "\"ts\"") cs = $(i + 1); if ($i == "\"dur\"") ce = cs + $(i + 1) } }
        /"pid":0,"tid":1/ && /"name":"zero3 allgather block 1"/ && !gseen { gseen = 1; for (i = 1; i < NF; i++) { if ($i == "\"ts\"") gs = $(i + 1); if ($i == "\"dur\"") ge = gs + $(i + 1) } }
        END { if (!(gs < ce && ge > cs)) { printf "allgather block 1 [%.1f, %.1f] does not overlap forward block 0 [%.1f, %.1f] (us)\n", gs, ge, cs, ce; exit 1 }
              printf "allgather block 1 [%.1f, %.1f] overlaps forward block 0 [%.1f, %.1f] (us)\n", gs, ge, cs, ce }' "$TMP/trace.json"
    grep -q "params" traced.log && grep -q "optimizer" traced.log || { echo "zero_test: the progress line lacks model-state bytes"; exit 1; }
    echo "trace: zero3 gathers and reduce-scatters on the comm lane" ;;
*)
    echo "zero_test: unknown case $CASE"; exit 2 ;;
esac
