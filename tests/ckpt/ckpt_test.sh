#!/bin/sh
# Verified, atomic checkpoints end to end.
#   usage: ckpt_test.sh LOOM SOURCE_DIR CASE [SHIM]
#   CASE: checksum | mutated_fields | truncated_tokens | remesh | disk_full | lock |
#         final_and_keep | refusals | kill9 | async_bitwise | async_zero3 | async_kill9 |
#         async_write_fails | async_disk_full | async_refused | lineage | data_changed |
#         fallback (SHIM: rename_shim.c built as a shared library)
set -eu
LOOM=$1
SRC=$2
CASE=$3
SHIM=${4:-}
CFG=$SRC/tests/ckpt/tiny.cfg
DATA=$SRC/examples/data/corpus.bin
EDIT="python3 $SRC/tests/ckpt/ckpt_edit.py"
TMP=$(mktemp -d)
MNT=""
trap '[ -z "$MNT" ] || umount "$MNT" 2>/dev/null; rm -rf "$TMP"' EXIT
cd "$TMP"

TEST=ckpt_test
. "$SRC/tests/common/train_runs.sh"

fail() { echo "$TEST: $*"; exit 1; }

# refused NAME WANT... -- COMMAND...: COMMAND fails with status 1, or 78 for
# loom train, which refuses a job before it trains with it (an error,
# not a signal), and its output holds every WANT
refused() {
    name=$1; shift
    wants=""
    while [ "$1" != "--" ]; do wants="$wants
$1"; shift; done
    shift
    status=0 want=1
    [ "$2" = train ] && want=78
    "$@" > "$name.log" 2>&1 || status=$?
    [ "$status" = $want ] || { cat "$name.log"; fail "$name: exit status $status, want $want (an error, not a crash)"; }
    echo "$wants" | while IFS= read -r want; do
        [ -z "$want" ] && continue
        grep -qF -- "$want" "$name.log" || { cat "$name.log"; fail "$name: the refusal does not say '$want'"; }
    done
    echo "$name: refused: $(grep -v '^step ' "$name.log" | tail -n 1)"
}

# resume_cmd CKPT [--set ...]: one rank resuming CKPT
resume_cmd() {
    ck=$1; shift
    echo "$LOOM" train "$CFG" --set data.train="$DATA" --resume "$ck" "$@"
}

# same_checkpoint A B: two checkpoint directories hold the same state, bit
# for bit: consolidated, the files differ only in the stamp's run id and
# checksum (of the 104-byte header and stamp: run id at 72, checksum at 96);
# llm.c's weights are identical
same_checkpoint() {
    for sc in "$1" "$2"; do
        rm -f "$sc.state" "$sc.bin"
        "$LOOM" ckpt consolidate "$sc" --state "$sc.state" --llmc "$sc.bin" > consolidate.log 2>&1 ||
            { cat consolidate.log; fail "cannot consolidate $sc"; }
    done
    cmp -s "$1.bin" "$2.bin" || fail "$1 and $2 hold different weights"
    python3 - "$1.state" "$2.state" <<'PY' || fail "$1 and $2 hold different states"
import sys
a, b = (open(f, "rb").read() for f in sys.argv[1:3])
strip = lambda d: d[:72] + d[80:96] + d[100:]
sys.exit(0 if len(a) > 104 and strip(a) == strip(b) else 1)
PY
}

# async_against_sync RANKS [--set ...]: the same run with synchronous and
# asynchronous checkpoints (every 3 of 10 steps, and the last): the same
# losses, the same checkpoints bit for bit, and each resumed from step 6
# gives the uninterrupted run's last 4 losses bit for bit
async_against_sync() {
    ranks=$1; shift
    for mode in false true; do
        run "ck_$mode" "$ranks" --set train.checkpoint_every=3 --set train.checkpoint_async=$mode \
            --set train.checkpoint_dir="$TMP/ck_$mode" "$@"
    done
    [ "$(ls ck_true | grep step | tr '\n' ' ')" = "step-10 step-3 step-6 step-9 " ] ||
        { ls ck_true; fail "async: not steps 3, 6, 9 and 10"; }
    grep -q "train.checkpoint_async: the snapshot takes .* of host memory" ck_true.log ||
        { cat ck_true.log; fail "async: the snapshot's size is not printed"; }
    grep -q "snapshot takes" ck_false.log && fail "sync: a snapshot's size is printed"
    losses ck_false > a.txt
    losses ck_true > b.txt
    cmp -s a.txt b.txt || fail "async checkpoints changed the losses"
    for n in 3 6 9 10; do
        same_checkpoint "ck_false/step-$n" "ck_true/step-$n"
    done
    echo "async = sync: steps 3, 6, 9, 10 hold the same state"
    for mode in false true; do
        run "resumed_$mode" "$ranks" --resume "$TMP/ck_$mode/step-6" "$@"
        same_tail "ck_$mode" "resumed_$mode" 4
    done
}

case "$CASE" in
checksum)
    # flipped bytes, 0xff bytes (the NaN of the issue) and zeroed bytes, in a
    # shard and in meta.loom: refused by --resume, `ckpt info` and `ckpt
    # consolidate` (which writes nothing), naming the file
    run whole 1 --set train.checkpoint_every=5 --set train.checkpoint_dir="$TMP/ckpt"
    ck=$TMP/ckpt/step-5
    "$LOOM" ckpt info "$ck" > info.txt || { cat info.txt; fail "ckpt info refused a good checkpoint"; }
    grep -q "CRC32C of every file verified" info.txt || { cat info.txt; fail "ckpt info does not say it verified"; }
    for damage in "shard-0.loom 5000 ffffffffffffffffffffffffffffffff" "shard-0.loom -7 01" \
                  "meta.loom 300 0000000000000000" "meta.loom 20 05"; do
        set -- $damage
        rm -rf bad; cp -r "$ck" bad
        $EDIT poke "bad/$1" "$2" "$3"
        refused "resume-$1$2" "bad/$1" "damaged" -- $(resume_cmd "$TMP/bad")
        refused "info-$1$2" "bad/$1" "damaged" -- "$LOOM" ckpt info "$TMP/bad"
        refused "consolidate-$1$2" "bad/$1" -- "$LOOM" ckpt consolidate "$TMP/bad" --state "$TMP/out.loom"
        [ ! -e out.loom ] && [ ! -e out.loom.tmp ] || fail "consolidate wrote a file from a damaged checkpoint"
    done
    grep -q "CRC32C" "resume-shard-0.loom5000.log" || fail "a flipped shard does not name its checksum"
    # the consolidated file is verified too
    "$LOOM" ckpt consolidate "$ck" --state "$TMP/state.loom" > cons.log 2>&1 || { cat cons.log; fail "consolidate failed"; }
    run from_state 1 --resume "$TMP/state.loom"
    same_tail whole from_state 5
    $EDIT poke state.loom 4000 ff
    refused resume-state "state.loom" "CRC32C" -- $(resume_cmd "$TMP/state.loom")
    refused info-state "state.loom" "CRC32C" -- "$LOOM" ckpt info "$TMP/state.loom" ;;
mutated_fields)
    # fields no writer produces, stamped with a valid checksum so that the
    # range checks must catch them: each refused with the file, the field
    # and the value, by `ckpt info` and --resume; then random bytes
    run whole 1 --set train.checkpoint_every=5 --set train.checkpoint_dir="$TMP/ckpt"
    ck=$TMP/ckpt/step-5
    mutate() {
        mutation=$1 mfile=$2 mwant=$3; shift 3
        rm -rf m; cp -r "$ck" m
        $EDIT "$@" --reseal
        refused "info-$mutation" "m/$mfile" "$mwant" -- "$LOOM" ckpt info "$TMP/m"
        refused "resume-$mutation" "m/$mfile" "$mwant" -- $(resume_cmd "$TMP/m")
    }
    mutate heads0 meta.loom "model.heads is 0" set m/meta.loom heads 0
    mutate heads3 meta.loom "model.channels 32 does not divide by model.heads 3" set m/meta.loom heads 3
    mutate channels meta.loom "2^63 bytes" set m/meta.loom channels 2147483644
    mutate layers meta.loom "shard files hold" set m/meta.loom layers 100000
    mutate vocab meta.loom "model.padded_vocab 256 is below model.vocab 300" set m/meta.loom vocab 300
    mutate nunits meta.loom "nunits is 4294967295" set m/meta.loom nunits 4294967295
    mutate nunits3 meta.loom "follow its shard table" set m/meta.loom nunits 3
    mutate tp0 meta.loom "its tp is 0" set m/meta.loom tp 0
    mutate files meta.loom "files is 1000000000" set m/meta.loom files 1000000000
    mutate data meta.loom "its data position is 99999999 bytes" set m/meta.loom data 99999999
    mutate step meta.loom "its step is -1" set m/meta.loom step -1
    mutate loss_scale meta.loom "its loss_scale is nan" set m/meta.loom loss_scale nan
    mutate dtype meta.loom "precision (dtype) is 9" set m/meta.loom dtype 9
    mutate strategy meta.loom "strategy name is not terminated" set m/meta.loom strategy xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx
    mutate table meta.loom "outside its" table m/meta.loom 1 0x10000000000
    mutate table_shifted meta.loom "outside its" table m/meta.loom 0 1
    mutate table_gap meta.loom "cover 1 of its 256 rows" table m/meta.loom 0 0 1
    mutate version meta.loom "format 7" set m/meta.loom version 7
    mutate records shard-0.loom "records, more than" set m/shard-0.loom records 100000000
    mutate count shard-0.loom "cut short" record m/shard-0.loom count 0x10000000000
    mutate unit shard-0.loom "unit 99" record m/shard-0.loom unit 99
    # cut short (no reseal: the stamp's length says so), and a shard of another step
    rm -rf m; cp -r "$ck" m
    head -c 50000 "$ck/shard-0.loom" > m/shard-0.loom
    refused info-cut "m/shard-0.loom" "cut short" -- "$LOOM" ckpt info "$TMP/m"
    rm -rf m; cp -r "$ck" m
    cp "$TMP/ckpt/step-10/shard-0.loom" m/shard-0.loom
    refused info-mixed "m/shard-0.loom" "mixes two checkpoints" -- "$LOOM" ckpt info "$TMP/m"
    # random bytes, sealed: an error or a (harmless) success, never a signal
    errors=0
    for seed in $(seq 1 60); do
        rm -rf m; cp -r "$ck" m
        file=meta.loom; [ $((seed % 4)) = 0 ] && file=shard-0.loom
        $EDIT random "m/$file" "$seed" --reseal
        status=0
        "$LOOM" ckpt info "$TMP/m" > random.log 2>&1 || status=$?
        [ "$status" -le 1 ] || { cat random.log; fail "ckpt info: exit status $status on random bytes (seed $seed, $file)"; }
        [ "$status" = 0 ] || errors=$((errors + 1))
        if [ $((seed % 10)) = 0 ]; then
            status=0
            $(resume_cmd "$TMP/m") > random.log 2>&1 || status=$?
            [ "$status" -le 1 ] || [ "$status" = 78 ] ||
                { cat random.log; fail "--resume: exit status $status on random bytes (seed $seed, $file)"; }
        fi
    done
    echo "random bytes: $errors of 60 damaged checkpoints refused, none crashed" ;;
truncated_tokens)
    # the token file is shorter than the checkpoint's data position: cut
    # (its header says more) or rewritten shorter (a valid file): refused,
    # naming the file
    cp "$SRC/examples/data/corpus.bin" data.bin
    DATA=$TMP/data.bin
    run whole 1 --set train.checkpoint_every=5 --set train.checkpoint_dir="$TMP/ckpt"
    run flat 1 --set train.checkpoint_every=5 --set train.checkpoint_dir="$TMP/flat" --set data.shuffle=false
    head -c 60000 "$SRC/examples/data/corpus.bin" > data.bin
    refused cut "data.bin" -- $(resume_cmd "$TMP/ckpt/step-5")
    refused cut_unshuffled "data.bin" -- $(resume_cmd "$TMP/flat/step-5" --set data.shuffle=false)
    python3 - "$SRC/examples/data/corpus.bin" data.bin <<'PY'
import struct, sys
data = open(sys.argv[1], "rb").read()
header = list(struct.unpack_from("<256i", data))
header[2] //= 3
open(sys.argv[2], "wb").write(struct.pack("<256i", *header) + data[1024:1024 + 2 * header[2]])
PY
    refused shorter "data.bin" "tokens" -- $(resume_cmd "$TMP/ckpt/step-5")
    refused shorter_unshuffled "data.bin" "tokens" -- $(resume_cmd "$TMP/flat/step-5" --set data.shuffle=false) ;;
remesh)
    # 4 ranks save steps 10, 20 and 25; resumed at step 10 on 2 ranks, the
    # job saves step 20 again (2 shard files in place of 4), clearing a
    # step-20.tmp a larger job left; a later resume of it continues the run
    run whole 4 --set train.steps=25 --set train.checkpoint_every=10 --set train.checkpoint_dir="$TMP/ckpt"
    [ "$(ls ckpt/step-20 | grep -c shard)" = 4 ] || fail "the 4-rank step-20 has not 4 shards"
    cp -r ckpt/step-10 ckpt/step-20.tmp
    run two 2 --set train.steps=20 --set train.checkpoint_every=10 --set train.checkpoint_dir="$TMP/ckpt" \
        --resume "$TMP/ckpt/step-10"
    grep -q "removing $TMP/ckpt/step-20.tmp, left unfinished by run" two.log ||
        { cat two.log; fail "the stale step-20.tmp was not removed with a line"; }
    [ "$(ls ckpt/step-20 | grep -c shard)" = 2 ] || { ls -R ckpt; fail "step-20 was not saved again by 2 ranks"; }
    ls -d ckpt/*.tmp ckpt/*.old 2>/dev/null && fail "a .tmp or .old directory was left behind"
    "$LOOM" ckpt info ckpt/step-20 | grep -q "2 shard files" || fail "ckpt info: step-20 is not the 2-rank one"
    run one 1 --set train.steps=25 --resume "$TMP/ckpt/step-20"
    tail -n 5 whole.jsonl > tail.jsonl
    compare tail one 1e-5 ;;
disk_full)
    # checkpoint_dir on a tmpfs with room for one checkpoint: the second
    # fails on rank 0 alone (ddp: rank 0 writes the state); both ranks stop
    # at once naming rank 0 and its reason, the launcher blames rank 0, no
    # step-10.tmp is left, and step-5 is whole
    mkdir full
    if ! mount -t tmpfs -o size=700k tmpfs full 2>/dev/null; then
        echo "$TEST: cannot mount a tmpfs here (not root?): skipped"; exit 77
    fi
    MNT=$TMP/full
    start=$(date +%s)
    status=0
    "$LOOM" launch -n 2 -- "$LOOM" train "$CFG" --set data.train="$DATA" --set parallel.dp.size=2 \
        --set train.checkpoint_every=5 --set train.checkpoint_dir="$TMP/full/ckpt" > full.log 2>&1 || status=$?
    took=$(( $(date +%s) - start ))
    cat full.log | grep -v '^\[0\] step '
    [ "$status" != 0 ] || fail "the full disk was not noticed"
    [ "$took" -lt 30 ] || fail "the ranks took $took s to stop (comm.timeout_s is 60)"
    for r in 0 1; do
        grep "^\[$r\]" full.log | grep -q "rank 0 failed the checkpoint $TMP/full/ckpt/step-10: .*No space left on device" ||
            fail "rank $r does not name rank 0 and its reason"
    done
    grep -q "loom launch: rank 0 exited" full.log || fail "the launcher does not blame rank 0"
    [ ! -e full/ckpt/step-10.tmp ] || fail "the failed checkpoint left step-10.tmp"
    "$LOOM" ckpt info full/ckpt/step-5 > info.txt 2>&1 || { cat info.txt; fail "step-5 is damaged"; } ;;
lock)
    # a second job on the same checkpoint_dir is refused at its start,
    # naming the first; once the first ends the directory is free
    LOOM_STOP_AFTER_STEP=2 "$LOOM" train "$CFG" --set data.train="$DATA" --set train.checkpoint_every=5 \
        --set train.checkpoint_dir="$TMP/ckpt" > first.log 2>&1 &
    first=$!
    for i in $(seq 1 300); do
        case "$(ps -o stat= -p "$first" 2>/dev/null)" in T*) break ;; esac
        sleep 0.1
    done
    case "$(ps -o stat= -p "$first")" in T*) ;; *) kill -9 "$first"; fail "the first job did not stop after step 2" ;; esac
    refused second "train.checkpoint_dir '$TMP/ckpt' is in use by another job (pid $first on" -- \
        "$LOOM" train "$CFG" --set data.train="$DATA" --set train.checkpoint_every=5 --set train.checkpoint_dir="$TMP/ckpt"
    kill -CONT "$first"
    wait "$first" || { cat first.log; fail "the first job failed"; }
    run third 1 --set train.checkpoint_every=5 --set train.checkpoint_dir="$TMP/ckpt"
    grep -q "saved $TMP/ckpt/step-10" third.log || fail "the third job did not checkpoint" ;;
final_and_keep)
    # the last step is saved whatever checkpoint_every; keep_checkpoints K
    # keeps the last K
    run all 1 --set train.steps=10 --set train.checkpoint_every=4 --set train.checkpoint_dir="$TMP/all"
    [ "$(ls all | grep step | tr '\n' ' ')" = "step-10 step-4 step-8 " ] || { ls all; fail "not steps 4, 8 and 10"; }
    run kept 1 --set train.steps=10 --set train.checkpoint_every=4 --set train.keep_checkpoints=2 \
        --set train.checkpoint_dir="$TMP/kept"
    [ "$(ls kept | grep step | tr '\n' ' ')" = "step-10 step-8 " ] || { ls kept; fail "keep_checkpoints = 2 did not keep steps 8 and 10"; }
    # the last step's checkpoint continues the run exactly
    run longer 1 --set train.steps=13
    run more 1 --set train.steps=13 --resume "$TMP/all/step-10"
    same_tail longer more 3
    # resumed from step 4 with keep 1: step 8 and 10 are saved again, the
    # older ones go
    run again 1 --set train.steps=10 --set train.checkpoint_every=4 --set train.keep_checkpoints=1 \
        --set train.checkpoint_dir="$TMP/all" --resume "$TMP/all/step-4"
    [ "$(ls all | grep step | tr '\n' ' ')" = "step-10 " ] || { ls all; fail "keep_checkpoints = 1 did not keep step 10 alone"; } ;;
refusals)
    run whole 1 --set train.checkpoint_every=5 --set train.checkpoint_dir="$TMP/ckpt"
    refused past "the checkpoint is after step 10, and train.steps is 10" "raise train.steps" -- \
        $(resume_cmd "$TMP/ckpt/step-10")
    refused before "the checkpoint is after step 10, and train.steps is 5" -- \
        $(resume_cmd "$TMP/ckpt/step-10" --set train.steps=5)
    refused heads "model.heads is 4 in the checkpoint, 2 in the config" -- \
        $(resume_cmd "$TMP/ckpt/step-5" --set model.heads=2)
    refused layers "model.layers is 2 in the checkpoint, 3 in the config" -- \
        $(resume_cmd "$TMP/ckpt/step-5" --set model.layers=3)
    refused keep "train.keep_checkpoints" "train.checkpoint_every" -- \
        "$LOOM" train "$CFG" --set data.train="$DATA" --set train.keep_checkpoints=2 ;;
kill9)
    # kill -9 while checkpoints are written (one every step): every
    # complete step-N verifies, the latest resumes bit-exactly, and the next
    # job removes what the killed one left unfinished
    run whole 1 --set train.steps=400
    "$LOOM" train "$CFG" --set data.train="$DATA" --set train.steps=400 --set train.checkpoint_every=1 \
        --set train.keep_checkpoints=3 --set train.checkpoint_dir="$TMP/k9" > killed.log 2>&1 &
    pid=$!
    # past step 20 (keep_checkpoints leaves only the last few to see)
    for i in $(seq 1 300); do
        n=$(ls k9 2>/dev/null | sed -n 's/^step-\([0-9]*\)$/\1/p' | sort -n | tail -n 1)
        [ "${n:-0}" -ge 20 ] && break
        sleep 0.05
    done
    # a random moment a little later
    sleep "0.$(awk 'BEGIN { srand(); printf "%03d", int(rand() * 400) }')"
    kill -9 "$pid"
    wait "$pid" 2>/dev/null || true
    echo "killed after: $(ls k9 | tr '\n' ' ')"
    latest=0
    for d in k9/step-*; do
        case "$d" in *.tmp|*.old|*.del) continue ;; esac
        "$LOOM" ckpt info "$d" > info.txt 2>&1 || { cat info.txt; fail "$d is a checkpoint that does not verify"; }
        n=${d#k9/step-}
        [ "$n" -gt "$latest" ] && latest=$n
    done
    [ "$latest" -gt 0 ] || fail "no complete checkpoint"
    [ "$latest" -lt 397 ] || fail "the run ended before the kill"
    run resumed 1 --set train.steps=$((latest + 3)) --set train.checkpoint_every=100 \
        --set train.checkpoint_dir="$TMP/k9" --resume "$TMP/k9/step-$latest"
    sed -n "$((latest + 1)),$((latest + 3))p" whole.jsonl > part.jsonl
    same_tail part resumed 3
    ls -d k9/*.tmp k9/*.old k9/*.del 2>/dev/null && fail "the next job left what the killed one had not finished"
    echo "kill -9 after step $latest: resumed bit-exactly" ;;
async_bitwise)
    async_against_sync 1 ;;
async_zero3)
    # zero3 shards the state: every rank writes a third of it
    sed 's/strategy = "ddp"; bucket_mb = 0.1;/strategy = "zero3";/' "$CFG" > zero3.cfg
    CFG=$TMP/zero3.cfg
    async_against_sync 3
    [ "$(ls ck_true/step-3 | grep -c shard)" = 3 ] || { ls ck_true/step-3; fail "zero3: not 3 shard files"; } ;;
async_kill9)
    # kill -9 while an async checkpoint is written (one every step: the
    # writer is busy most of the time): only complete step-N count (a
    # step-N.tmp is never resumed as it is), the latest resumes bit-exactly,
    # a restart picks the same one, and the next job removes the step-N.tmp
    # the killed one left, or, when every file of it is there and verifies
    # (killed after its meta.loom), restores it as step-N and resumes that
    run whole 1 --set train.steps=400
    for round in 1 2 3 4 5; do
        rm -rf k9
        "$LOOM" train "$CFG" --set data.train="$DATA" --set train.steps=400 --set train.checkpoint_every=1 \
            --set train.checkpoint_async=true --set train.keep_checkpoints=3 \
            --set train.checkpoint_dir="$TMP/k9" > killed.log 2>&1 &
        pid=$!
        for i in $(seq 1 300); do
            n=$(ls k9 2>/dev/null | sed -n 's/^step-\([0-9]*\)$/\1/p' | sort -n | tail -n 1)
            [ "${n:-0}" -ge 20 ] && break
            sleep 0.05
        done
        sleep "0.$(awk -v r="$round" 'BEGIN { srand(); printf "%03d", int(rand() * 400) }')"
        kill -9 "$pid"
        wait "$pid" 2>/dev/null || true
        ls k9 | grep -q '^step-[0-9]*\.tmp$' && break
    done
    pending=$(ls k9 | sed -n 's/^step-\([0-9]*\)\.tmp$/\1/p')
    [ -n "$pending" ] || { ls k9; fail "five kills found no checkpoint being written"; }
    echo "killed while writing step-$pending: $(ls k9 | tr '\n' ' ')"
    latest=0
    for d in k9/step-*; do
        case "$d" in *.tmp|*.old|*.del) continue ;; esac
        "$LOOM" ckpt info "$d" > info.txt 2>&1 || { cat info.txt; fail "$d is a checkpoint that does not verify"; }
        n=${d#k9/step-}
        [ "$n" -gt "$latest" ] && latest=$n
    done
    [ "$latest" -gt 0 ] || fail "no complete checkpoint"
    [ "$latest" -lt "$pending" ] || fail "step-$latest is complete, after the pending step-$pending"
    expect=$latest
    "$LOOM" ckpt info "k9/step-$pending.tmp" > /dev/null 2>&1 && expect=$pending
    # a restart (loom launch --max-restarts sets LOOM_RESTART) finds the same one
    LOOM_RESTART=1 "$LOOM" train "$CFG" --set data.train="$DATA" --set train.steps=$((expect + 3)) \
        --set train.checkpoint_every=100 --set train.checkpoint_dir="$TMP/k9" \
        --metrics restarted.jsonl > restarted.log 2>&1 || { cat restarted.log; fail "the restart failed"; }
    grep -q "restart 1: resuming from $TMP/k9/step-$expect\$" restarted.log ||
        { cat restarted.log; fail "the restart did not pick step-$expect"; }
    [ "$expect" = "$latest" ] || grep -q "restored $TMP/k9/step-$pending from $TMP/k9/step-$pending.tmp" restarted.log ||
        { cat restarted.log; fail "the complete step-$pending.tmp was not restored with a line"; }
    ls -d k9/*.tmp 2>/dev/null && fail "the next job left the step-$pending.tmp of the killed one"
    run resumed 1 --set train.steps=$((latest + 3)) --resume "$TMP/k9/step-$latest"
    sed -n "$((latest + 1)),$((latest + 3))p" whole.jsonl > part.jsonl
    same_tail part resumed 3
    sed -n "$((expect + 1)),$((expect + 3))p" whole.jsonl > part.jsonl
    same_tail part restarted 3
    echo "kill -9 while writing step-$pending: step-$latest resumed bit-exactly" ;;
async_write_fails)
    # the writer thread's file is refused (ulimit -f: writes past 200 KiB
    # fail with EFBIG, SIGXFSZ ignored): the run stops at a boundary while
    # it is written (or at step 6's checkpoint at the latest) with the
    # writer's words, and no step-3.tmp is left
    status=0
    (trap '' XFSZ; ulimit -f 400; exec "$LOOM" train "$CFG" --set data.train="$DATA" \
        --set train.checkpoint_every=3 --set train.checkpoint_async=true \
        --set train.checkpoint_dir="$TMP/fails") > fails.log 2>&1 || status=$?
    grep -v 'step ' fails.log
    [ "$status" = 1 ] || fail "exit status $status, want 1"
    grep -qF "cannot write '$TMP/fails/step-3.tmp/shard-0.loom': File too large" fails.log ||
        fail "the writer's failure is not said"
    grep -q "step    7/10" fails.log && fail "the run went on past step 6"
    ls fails | grep -q step && { ls fails; fail "a step directory was left"; }
    echo "stopped with the writer's failure, nothing left" ;;
async_disk_full)
    # 2 ranks, checkpoint_dir on a tmpfs with room for one checkpoint: the
    # second (step 6) fails in rank 0's writer thread alone (ddp: rank 0
    # writes the state); both ranks stop at a boundary while it is written
    # (step 9's checkpoint at the latest) naming rank 0 and its reason, the
    # launcher blames rank 0, no step-6.tmp is left, and step-3 is whole
    mkdir full
    if ! mount -t tmpfs -o size=700k tmpfs full 2>/dev/null; then
        echo "$TEST: cannot mount a tmpfs here (not root?): skipped"; exit 77
    fi
    MNT=$TMP/full
    status=0
    "$LOOM" launch -n 2 -- "$LOOM" train "$CFG" --set data.train="$DATA" --set parallel.dp.size=2 \
        --set train.checkpoint_every=3 --set train.checkpoint_async=true \
        --set train.checkpoint_dir="$TMP/full/ckpt" > full.log 2>&1 || status=$?
    grep -v '^\[0\] step ' full.log
    [ "$status" != 0 ] || fail "the full disk was not noticed"
    for r in 0 1; do
        grep "^\[$r\]" full.log | grep -q "rank 0 failed the checkpoint $TMP/full/ckpt/step-6: .*step-6.tmp/shard-0.loom': No space left on device" ||
            fail "rank $r does not name rank 0 and its reason"
    done
    grep -q "loom launch: rank 0 exited" full.log || fail "the launcher does not blame rank 0"
    grep -q "step   10/10" full.log && fail "the run went on past step 9"
    [ ! -e full/ckpt/step-6.tmp ] || fail "the failed checkpoint left step-6.tmp"
    "$LOOM" ckpt info full/ckpt/step-3 > info.txt 2>&1 || { cat info.txt; fail "step-3 is damaged"; } ;;
async_refused)
    refused async_alone "train.checkpoint_async: does nothing without checkpoints" \
        "set train.checkpoint_every = N" -- \
        "$LOOM" train "$CFG" --set data.train="$DATA" --set train.checkpoint_async=true
    sed 's/lr = 1e-3;/lr = 1e-3; checkpoint_async = true;/' "$CFG" > async.cfg
    refused async_in_file "async.cfg:4: train.checkpoint_async: does nothing" -- \
        "$LOOM" train async.cfg --set data.train="$DATA" ;;
lineage)
    # a run refuses a checkpoint_dir holding another lineage's checkpoints
    # (other settings or other data), naming the step, the lineage, the
    # first difference and the way out; the same settings again, or a
    # resume of it, continue the lineage
    run first 1 --set train.checkpoint_every=5 --set train.checkpoint_dir="$TMP/ck"
    cp ck/step-10/meta.loom before.meta
    refused other_lr "train.checkpoint_dir '$TMP/ck' holds step-10 of another run (lineage " \
        "train.lr = 0.001 there, 0.003 in this run" "use a new directory, --resume $TMP/ck/step-10 to continue it" \
        "or set train.checkpoint_overwrite = true to replace it" -- \
        "$LOOM" train "$CFG" --set data.train="$DATA" --set train.checkpoint_every=5 \
        --set train.checkpoint_dir="$TMP/ck" --set train.lr=3e-3
    sed 's|lr = 1e-3;|lr = 1e-3; checkpoint_every = 5; checkpoint_dir = "ck";|' "$CFG" > seed.cfg
    refused other_seed "seed.cfg:4: train.checkpoint_dir 'ck' holds step-10 of another run" \
        "model.seed = 1337 there, 7 in this run" -- \
        "$LOOM" train seed.cfg --set data.train="$DATA" --set model.seed=7
    cp "$DATA" other.bin
    refused other_data "holds step-10 of another run" "its data.train files differ by name or length" -- \
        "$LOOM" train "$CFG" --set data.train="$TMP/other.bin" --set train.checkpoint_every=5 \
        --set train.checkpoint_dir="$TMP/ck"
    cmp -s ck/step-10/meta.loom before.meta || fail "a refused run changed step-10"
    "$LOOM" ckpt info ck/step-10 > info.txt || { cat info.txt; fail "ckpt info failed"; }
    lineage=$(sed -n 's/^  lineage   \([0-9a-f]\{16\}\) (settings [0-9a-f]\{16\}, data [0-9a-f]\{16\})$/\1/p' info.txt)
    [ -n "$lineage" ] || { cat info.txt; fail "ckpt info does not show the lineage"; }
    grep -q "^  settings  .*train.lr=0.001, " info.txt || { cat info.txt; fail "ckpt info does not show the settings"; }
    # the mesh, the checkpoint settings and the logs are no part of it
    run again 2 --set train.checkpoint_every=2 --set train.checkpoint_dir="$TMP/ck"
    # a resume with another learning rate continues the lineage
    run resumed 1 --set train.checkpoint_every=5 --set train.checkpoint_dir="$TMP/ck" --set train.lr=3e-3 \
        --resume "$TMP/ck/step-5"
    "$LOOM" ckpt info ck/step-10 | grep -q "^  lineage   $lineage " || fail "the resumed run's step-10 is of another lineage"
    # and so does a resume of the consolidated file, which keeps it too
    "$LOOM" ckpt consolidate ck/step-5 --state state.loom > cons.log 2>&1 || { cat cons.log; fail "consolidate failed"; }
    "$LOOM" ckpt info state.loom | grep -q "^  lineage   $lineage " || fail "the consolidated file lost the lineage"
    run from_state 1 --set train.checkpoint_every=5 --set train.checkpoint_dir="$TMP/from_state" \
        --set train.lr=3e-3 --resume "$TMP/state.loom"
    "$LOOM" ckpt info from_state/step-10 | grep -q "^  lineage   $lineage " || fail "a resume of the consolidated file started another lineage"
    # checkpoint_overwrite: allowed, and said; a restart resumes this run's
    # own step-5, not the other run's later step-10, and ends as a run that
    # was never stopped
    run alone 1 --set train.lr=3e-3 --save alone.bin
    run over 1 --set train.checkpoint_every=5 --set train.checkpoint_dir="$TMP/ck" --set train.lr=3e-3 \
        --set train.checkpoint_overwrite=true --set train.steps=5
    grep -q "train.checkpoint_overwrite = true: '$TMP/ck' holds step-10 of another run (lineage $lineage" over.log ||
        { cat over.log; fail "checkpoint_overwrite does not say what it overwrites"; }
    LOOM_RESTART=1 "$LOOM" train "$CFG" --set data.train="$DATA" --set train.checkpoint_every=5 \
        --set train.checkpoint_dir="$TMP/ck" --set train.lr=3e-3 --set train.checkpoint_overwrite=true \
        --save over.bin > restart.log 2>&1 || { cat restart.log; fail "the restart failed"; }
    grep -q "restart 1: resuming from $TMP/ck/step-5 (step-10 there is another run's, lineage $lineage: left alone)" restart.log ||
        { cat restart.log; fail "the restart did not resume its own step-5"; }
    cmp -s alone.bin over.bin || fail "the restarted run's weights differ from an uninterrupted run's"
    # a checkpoint of format 3 records no lineage: a fresh run is refused,
    # a resume (of that run, likely) is not
    mkdir old
    cp -r ck/step-5 old/step-5
    $EDIT downgrade old/step-5/meta.loom
    $EDIT downgrade old/step-5/shard-0.loom
    "$LOOM" ckpt info old/step-5 | grep -q "^  lineage   none recorded (format 3; format 4 records it)" ||
        { "$LOOM" ckpt info old/step-5; fail "ckpt info of a format 3 checkpoint"; }
    refused unrecorded "train.checkpoint_dir '$TMP/old' holds step-5 of another run (written by an older loom in checkpoint format 3, which records no lineage)" -- \
        "$LOOM" train "$CFG" --set data.train="$DATA" --set train.checkpoint_every=5 --set train.checkpoint_dir="$TMP/old"
    run old_resumed 1 --set train.checkpoint_every=5 --set train.checkpoint_dir="$TMP/old" --resume "$TMP/old/step-5"
    refused overwrite_alone "train.checkpoint_overwrite: does nothing without checkpoints" -- \
        "$LOOM" train "$CFG" --set data.train="$DATA" --set train.checkpoint_overwrite=true ;;
data_changed)
    # a data file of the same name and size with other contents is refused
    # at resume, naming it and both CRC32Cs; a new mtime alone is not
    cp "$SRC/examples/data/corpus.bin" data.bin
    DATA=$TMP/data.bin
    run whole 1 --set train.checkpoint_every=5 --set train.checkpoint_dir="$TMP/ck"
    "$LOOM" ckpt info ck/step-5 | grep -q "^  file 1    $TMP/data.bin, 83917 tokens, CRC32C 0x" ||
        { "$LOOM" ckpt info ck/step-5; fail "ckpt info does not show the file's CRC32C"; }
    touch data.bin
    run resumed 1 --resume "$TMP/ck/step-5"
    same_tail whole resumed 5
    python3 - data.bin <<'PY'
import sys
data = bytearray(open(sys.argv[1], "rb").read())
data[5000] ^= 1  # a token (after the 1024-byte header), still below the vocabulary
open(sys.argv[1], "wb").write(data)
PY
    refused changed "--resume $TMP/ck/step-5: data.train: file 1, $TMP/data.bin, has CRC32C 0x" \
        "when the checkpoint was saved: the same name and size, other contents" -- $(resume_cmd "$TMP/ck/step-5") ;;
fallback)
    # a file system without RENAME_EXCHANGE (the shim): step-10 replaced
    # through step-10.old, killed at each point of it; the next job keeps
    # the complete copy (restoring step-10 when it is gone), resumes from
    # step-10 and ends with the uninterrupted run's weights
    [ -n "$SHIM" ] || { echo "$TEST: no shim library: skipped"; exit 77; }
    run whole 1 --set train.steps=15 --save whole.bin
    run base 1 --set train.checkpoint_every=5 --set train.checkpoint_dir="$TMP/base"
    for point in none rename:1 rename:1-tmp-damaged rename:2 unlink-old:1; do
        rm -rf ck r.bin k.bin
        cp -r base ck
        status=0
        LD_PRELOAD=$SHIM LOOM_SHIM_KILL=${point%-tmp-damaged} "$LOOM" train "$CFG" --set data.train="$DATA" \
            --set train.steps=15 --set train.checkpoint_every=5 --set train.checkpoint_dir="$TMP/ck" \
            --resume "$TMP/ck/step-5" --save k.bin > killed.log 2>&1 || status=$?
        if [ "$point" = none ]; then
            [ "$status" = 0 ] || { cat killed.log; fail "the fallback replacement failed"; }
            cmp -s whole.bin k.bin || fail "the fallback replacement: other weights"
            ls -d ck/*.tmp ck/*.old 2>/dev/null && fail "the fallback replacement left a directory"
            continue
        fi
        [ "$status" = 137 ] || { cat killed.log; fail "$point: not killed (status $status)"; }
        restored=""
        case $point in
        rename:1)
            [ ! -e ck/step-10 ] && [ -f ck/step-10.old/meta.loom ] && [ -f ck/step-10.tmp/meta.loom ] ||
                { ls -R ck; fail "$point: not killed between the renames"; }
            restored=step-10.tmp ;;
        rename:1-tmp-damaged)
            # the new copy is damaged: the old one is the only complete copy
            printf 'x' >> ck/step-10.tmp/shard-0.loom
            restored=step-10.old ;;
        rename:2|unlink-old:1)
            [ -f ck/step-10/meta.loom ] && [ -d ck/step-10.old ] ||
                { ls -R ck; fail "$point: not killed before step-10.old was removed"; } ;;
        esac
        LOOM_RESTART=1 "$LOOM" train "$CFG" --set data.train="$DATA" --set train.steps=15 \
            --set train.checkpoint_every=5 --set train.checkpoint_dir="$TMP/ck" \
            --resume "$TMP/ck/step-5" --save r.bin > restart.log 2>&1 ||
            { cat restart.log; fail "$point: the next job failed"; }
        [ -z "$restored" ] || grep -q "restored $TMP/ck/step-10 from $TMP/ck/$restored (complete and verified)" restart.log ||
            { cat restart.log; fail "$point: step-10 was not restored from $restored"; }
        grep -q "restart 1: resuming from $TMP/ck/step-10" restart.log ||
            { cat restart.log; fail "$point: the next job did not resume from step-10"; }
        cmp -s whole.bin r.bin || fail "$point: the final weights differ from the uninterrupted run's"
        ls -d ck/*.tmp ck/*.old 2>/dev/null && fail "$point: a leftover stayed"
        echo "killed at $point: recovered, resumed from step-10, the same final weights"
    done
    # the second rename fails: the job fails naming it, and the old step-10
    # is back in its place
    rm -rf ck
    cp -r base ck
    status=0
    LD_PRELOAD=$SHIM LOOM_SHIM_FAIL=rename:2 "$LOOM" train "$CFG" --set data.train="$DATA" \
        --set train.steps=15 --set train.checkpoint_every=5 --set train.checkpoint_dir="$TMP/ck" \
        --resume "$TMP/ck/step-5" > failed.log 2>&1 || status=$?
    [ "$status" != 0 ] || { cat failed.log; fail "a failed rename was not noticed"; }
    grep -q "checkpoint: cannot replace '$TMP/ck/step-10' by '$TMP/ck/step-10.tmp': Input/output error" failed.log ||
        { cat failed.log; fail "the failed rename is not named"; }
    cmp -s base/step-10/meta.loom ck/step-10/meta.loom || { ls -R ck; fail "the old step-10 is not back in place"; }
    ls -d ck/*.tmp ck/*.old 2>/dev/null && fail "a failed replacement left a directory"
    echo "a failed rename: the old step-10 back in place" ;;
*)
    echo "$TEST: unknown case $CASE"; exit 2 ;;
esac
