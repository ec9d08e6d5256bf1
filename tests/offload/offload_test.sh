#!/bin/sh
# Offload end to end: `loom train` with memory.offload against the same run
# without it (bitwise: moving bytes between tiers changes no number), the
# bytes per tier and purpose against their formulas, memory.host_limit, and
# the nvme tier's faults as a job meets them.
#   usage: offload_test.sh LOOM SOURCE_DIR CASE [ARGS...]
#     contract STRATEGY | formulas STRATEGY PRECISION | infinity PRECISION |
#     budget | corrupt | disk | refusals | bench
set -eu
LOOM=$1
SRC=$2
CASE=$3
shift 3
CFG=$SRC/tests/zero/tiny.cfg
DATA=$SRC/examples/data/corpus.bin
TMP=$(mktemp -d)
TIER=$TMP/tier
MNT=""
cleanup() {
    [ -z "$MNT" ] || umount "$MNT" 2>/dev/null || true
    rm -rf "$TMP"
}
trap cleanup EXIT
mkdir "$TIER"
cd "$TMP"

TEST="offload_test $CASE"
. "$SRC/tests/common/train_runs.sh"

fail() { echo "$TEST: $*"; exit 1; }

# no_files: the tier directory holds nothing (the job's files are gone)
no_files() {
    [ -z "$(ls -A "$TIER")" ] || { ls -la "$TIER"; fail "files left in the tier directory $1"; }
}

# bytes NAME KIND TIER PURPOSE: peak_bytes or held_bytes of a tier's purpose, last step
bytes() {
    tail -n 1 "$1.jsonl" | sed 's/.*"'"$2"'": {//; s/}}.*//' |
        sed -n "s/.*\"$3\": {[^}]*\"$4\": \([0-9]*\).*/\1/p"
}

nvme="--set memory.offload.optimizer=nvme --set memory.offload.path=$TIER"

# stopped NAME: a job with its optimizer state on nvme, started in the
# background and stopped (SIGSTOP) after step 1; its pid in $pid
stopped() {
    LOOM_STOP_AFTER_STEP=1 "$LOOM" train "$CFG" --set data.train="$DATA" --set train.steps=3 $nvme \
        > "$1.log" 2>&1 &
    pid=$!
    for i in $(seq 1 300); do
        state=$(sed 's/.*) \(.\).*/\1/' /proc/$pid/stat 2>/dev/null || echo gone)
        [ "$state" = T ] && return
        [ "$state" = gone ] && { cat "$1.log"; fail "the job ended before it stopped"; }
        sleep 0.1
    done
    fail "the job never stopped after step 1"
}

case "$CASE" in
contract)
    # every rank count and both precisions: optimizer state (and zero3's
    # shards) on nvme, bitwise the run without
    strategy=$1
    extra=""
    [ "$strategy" = zero3 ] && extra="--set memory.offload.params=nvme"
    for np in 1 2 4; do
        for precision in fp32 bf16; do
            common="--set train.steps=4 --set parallel.dp.strategy=$strategy --set train.precision=$precision"
            run "ref$np$precision" "$np" $common --save "ref$np$precision.bin"
            run "off$np$precision" "$np" $common $nvme $extra --save "off$np$precision.bin"
            bitwise "ref$np$precision" "off$np$precision"
            r=$(tier_bytes "off$np$precision" read optimizer)
            w=$(tier_bytes "off$np$precision" written optimizer)
            [ "${r:-0}" -gt 0 ] && [ "$r" = "$w" ] || fail "off$np$precision moved read ${r:-?} written ${w:-?} bytes of optimizer state, want equal and > 0"
            grep -q "peak nvme: .*optimizer" "off$np$precision.log" || fail "the progress line shows no nvme bytes"
            no_files "after off$np$precision"
        done
    done ;;
formulas)
    # ZeRO-Offload at 1, 2 and 4 ranks: the optimizer state's bytes in the
    # tier, and on the host only the three units the step streams at once
    # (the next read ahead, this one stepped, the last written behind)
    strategy=$1; precision=$2
    for n in 1 2 4; do
        run "f$n" "$n" --set train.steps=2 --set model.layers=4 --set parallel.dp.strategy="$strategy" \
            --set train.precision="$precision" $nvme
        on_nvme=$(bytes "f$n" peak_bytes nvme optimizer); staged=$(bytes "f$n" peak_bytes host optimizer)
        held=$(bytes "f$n" held_bytes host optimizer)
        # units: the embedding (Vp*C + maxT*C), 4 blocks (12C^2 + 13C), the head (2C)
        awk -v s="$strategy" -v p="$precision" -v N="$n" -v nv="$on_nvme" -v st="$staged" -v held="$held" '
        function pad(x) { q = 32 * N; return int((x + q - 1) / q) * q }
        BEGIN {
            k = split("20480 49984 49984 49984 49984 128", numel, " ")
            arrays = (p == "fp32") ? 2 : 3          # m, v (and the fp32 master)
            total = 0; peak = 0
            for (i = 1; i <= k; i++) { seg[i] = (s == "ddp") ? numel[i] : pad(numel[i]) / N; total += seg[i] }
            for (i = 1; i <= k; i++) {
                w = seg[i] + (i < k ? seg[i + 1] : 0) + (i > 1 ? seg[i - 1] : 0)
                if (w > peak) peak = w
            }
            want_nv = 4 * arrays * total; want_st = 4 * arrays * peak
            printf "%s %s N=%d: nvme optimizer %d (formula %d), host optimizer peak %d (formula %d), held %d\n", s, p, N, nv, want_nv, st, want_st, held
            if (nv != want_nv || st != want_st || held != 0) exit 1
        }' || fail "bytes differ from the formulas"
    done ;;
infinity)
    # ZeRO-Infinity at 4 ranks: zero3's parameter and gradient shards and
    # the optimizer state on nvme; between steps the host holds none of
    # them, only activations and the reduce-scatter buffer
    precision=$1; e=4; [ "$precision" = fp32 ] || e=2
    run inf 4 --set train.steps=2 --set model.layers=4 --set parallel.dp.strategy=zero3 \
        --set train.precision="$precision" $nvme --set memory.offload.params=nvme
    p=$(bytes inf peak_bytes nvme params); g=$(bytes inf peak_bytes nvme grads); o=$(bytes inf peak_bytes nvme optimizer)
    hp=$(bytes inf held_bytes host params); hg=$(bytes inf held_bytes host grads); ho=$(bytes inf held_bytes host optimizer)
    awk -v e="$e" -v p="$p" -v g="$g" -v o="$o" -v hp="$hp" -v hg="$hg" -v ho="$ho" '
    function pad(x) { q = 32 * 4; return int((x + q - 1) / q) * q }
    BEGIN {
        k = split("20480 49984 49984 49984 49984 128", numel, " ")
        S = 0; for (i = 1; i <= k; i++) S += pad(numel[i]) / 4
        w = (e == 4) ? 0 : 4
        printf "nvme params %d (formula %d), grads %d (%d), optimizer %d (%d); held on host: params %d, grads %d, optimizer %d\n", p, e * S, g, e * S, o, (w + 8) * S, hp, hg, ho
        if (p != e * S || g != e * S || o != (w + 8) * S || hp != 0 || hg != 0 || ho != 0) exit 1
    }' || fail "bytes differ from the formulas" ;;
budget)
    # model state that does not fit memory.host_limit: refused with the
    # offload that fits, which then trains to the unlimited run's losses
    shape="--set model.layers=8 --set model.channels=192 --set model.heads=4 --set train.batch=2 --set train.seq=16 --set train.steps=3"
    limit=$((56 * 1024 * 1024))
    run free 1 $shape --save free.bin
    if "$LOOM" train "$CFG" --set data.train="$DATA" $shape --set memory.host_limit=$limit > tight.log 2>&1; then
        cat tight.log; fail "a run over memory.host_limit was not refused"
    fi
    cat tight.log
    grep -q "memory.host_limit = 56.0 MiB: activations and model state take" tight.log || fail "the refusal does not weigh the state"
    grep -q 'memory.offload.optimizer = "nvme" would hold about' tight.log || fail "the refusal does not suggest the offload that fits"
    run fits 1 $shape --set memory.host_limit=$limit $nvme --save fits.bin
    bitwise free fits
    peak=$(tail -n 1 fits.jsonl | sed -n 's/.*"peak_bytes": {"host": {[^}]*"total": \([0-9]*\)}.*/\1/p')
    [ "$peak" -le "$limit" ] || fail "host peak $peak over the limit $limit"
    echo "fits: host peak $peak <= $limit" ;;
corrupt)
    # a byte of the tier file flipped while the job is stopped between steps
    stopped bad
    file=""
    for fd in /proc/$pid/fd/*; do
        case "$(readlink "$fd")" in "$TIER"/*) file=$fd ;; esac
    done
    [ -n "$file" ] || { ls -l /proc/$pid/fd; fail "no tier file open under $TIER"; }
    [ -z "$(ls -A "$TIER")" ] || fail "the tier file has a name in $TIER (want an unnamed file)"
    # the first block holds step 1's optimizer state of the first unit
    byte=$(dd if="$file" bs=1 skip=100 count=1 2>/dev/null | od -An -tu1 | tr -d ' ')
    printf "\\$(printf %o $(( (byte + 1) % 256 )))" | dd of="$file" bs=1 seek=100 count=1 conv=notrunc 2>/dev/null
    kill -CONT $pid
    if wait $pid; then cat bad.log; fail "a corrupted tier block went unnoticed"; fi
    cat bad.log
    grep -q "checksum mismatch" bad.log || fail "the failure does not name the checksum"
    grep -q "expected" bad.log && grep -q "found" bad.log || fail "the failure does not give both checksums"
    no_files "after the failed run"
    # kill -9 while stopped: nothing is left that a later job could take for its own
    stopped killed
    kill -9 $pid
    wait $pid 2>/dev/null || true
    no_files "after kill -9" ;;
disk)
    # a full disk, a missing and a read-only path fail at start, clearly
    if ! mount -t tmpfs -o size=1m tmpfs "$TIER" 2>/dev/null; then
        echo "$TEST: cannot mount a tmpfs here (not root?): skipped"; exit 77
    fi
    MNT=$TIER
    if "$LOOM" train "$CFG" --set data.train="$DATA" --set train.steps=1 $nvme > full.log 2>&1; then
        cat full.log; fail "a full disk was not refused"
    fi
    cat full.log
    # the whole need (m and v of 4 units, a 1 MiB block each), not the first block's
    grep -q "^loom train: memory.offload.path = '$TIER': no space: the offloaded state needs 8.0 MiB on its file system, each unit's part in whole blocks of 1.0 MiB, and [0-9.]* [KM]iB is available; free space, name a larger disk, or set memory.offload.block_bytes smaller$" full.log ||
        fail "a full disk does not give the whole need"
    # two ranks: both end at the check (a rank left waiting would wait
    # comm.timeout_s, past this test's timeout), the second naming the first
    if "$LOOM" launch -n 2 -- "$LOOM" train "$CFG" --set data.train="$DATA" --set train.steps=1 \
        --set parallel.dp.size=2 --set comm.timeout_s=3600 $nvme > full2.log 2>&1; then
        cat full2.log; fail "a full disk was not refused on 2 ranks"
    fi
    cat full2.log
    grep -q "^\[0\] loom train: rank 0 cannot start: memory.offload.path = '$TIER': no space: the offloaded state needs 16.0 MiB on its file system (the 2 ranks of this machine; this one 8.0 MiB)" full2.log ||
        fail "rank 0 does not give the 2 ranks' need"
    grep -q "^\[1\] loom train: rank 0 cannot start: memory.offload.path = '$TIER': no space: the offloaded state needs 16.0 MiB" full2.log ||
        fail "rank 1 does not stop with rank 0's words"
    # a smaller block: the state fits in what the disk has
    run small 1 --set train.steps=1 $nvme --set memory.offload.block_bytes=4096
    umount "$TIER"
    mount -t tmpfs -o ro,size=1m tmpfs "$TIER"
    if "$LOOM" train "$CFG" --set data.train="$DATA" --set train.steps=1 $nvme > ro.log 2>&1; then
        cat ro.log; fail "a read-only path was not refused"
    fi
    cat ro.log
    grep -q "read-only" ro.log || fail "a read-only path does not say so"
    umount "$TIER"
    MNT=""
    if "$LOOM" train "$CFG" --set data.train="$DATA" --set train.steps=1 \
        --set memory.offload.optimizer=nvme --set memory.offload.path="$TMP/missing" > missing.log 2>&1; then
        cat missing.log; fail "a missing path was not refused"
    fi
    cat missing.log
    grep -q "no such directory" missing.log || fail "a missing path does not say so" ;;
refusals)
    # settings that would do nothing are refused, each in one line
    expect() {
        want=$1; shift
        if "$LOOM" train "$CFG" --set data.train="$DATA" --set train.steps=1 "$@" > r.log 2>&1; then
            cat r.log; fail "accepted: $*"
        fi
        grep -q "$want" r.log || { cat r.log; fail "the refusal of '$*' does not say '$want'"; }
        echo "refused: $* -> $(tail -n 1 r.log)"
    }
    expect 'parallel.dp.strategy = "zero3"' --set memory.offload.params=nvme --set memory.offload.path="$TIER"
    expect "nothing is offloaded to nvme" --set memory.offload.path="$TIER"
    expect "memory.offload.path" --set memory.offload.optimizer=nvme
    expect "did you mean" --set memory.offload.optimizer=nvm ;;
bench)
    # loom bench times the tiers next to their limits, and reads back what it wrote
    "$LOOM" bench "$SRC/examples/bench-tiers.cfg" --set memory.offload.path="$TIER" \
        --set bench.tier_bytes=4194304 --set 'bench.tier_block_bytes=[65536, 1048576]' \
        --set 'bench.tier_queue_depths=[1, 4]' --set bench.tier_repeats=1 --json tiers.json > bench.log 2>&1 ||
        { cat bench.log; fail "loom bench over the tiers failed"; }
    cat bench.log
    rows=$(grep -c "^  nvme " bench.log)
    [ "$rows" = 4 ] || fail "$rows nvme rows, want 4 (2 block sizes x 2 queue depths)"
    grep -q "^  host " bench.log || fail "no host row"
    grep -q '"raw_read_gbs"' tiers.json || fail "--json has no tier rows"
    grep -q "allreduce" bench.log && fail "the collectives ran without bench.comms being set"
    no_files "after loom bench"
    if "$LOOM" launch -n 2 -- "$LOOM" bench "$SRC/examples/bench-tiers.cfg" \
        --set memory.offload.path="$TIER" > two.log 2>&1; then
        cat two.log; fail "bench.tiers ran under a launcher of 2 ranks"
    fi
    grep -q "run loom bench without loom launch" two.log || { cat two.log; fail "no clear refusal under loom launch"; } ;;
*)
    fail "unknown case '$CASE'" ;;
esac
