#!/bin/sh
# Verified, atomic checkpoints end to end.
#   usage: ckpt_test.sh LOOM SOURCE_DIR CASE
#   CASE: checksum | mutated_fields | truncated_tokens | remesh | disk_full | lock |
#         final_and_keep | refusals | kill9
set -eu
LOOM=$1
SRC=$2
CASE=$3
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

# refused NAME WANT... -- COMMAND...: COMMAND fails with status 1 (an error,
# not a signal), and its output holds every WANT
refused() {
    name=$1; shift
    wants=""
    while [ "$1" != "--" ]; do wants="$wants
$1"; shift; done
    shift
    status=0
    "$@" > "$name.log" 2>&1 || status=$?
    [ "$status" = 1 ] || { cat "$name.log"; fail "$name: exit status $status, want 1 (an error, not a crash)"; }
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
            [ "$status" -le 1 ] || { cat random.log; fail "--resume: exit status $status on random bytes (seed $seed, $file)"; }
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
        case "$d" in *.tmp|*.old) continue ;; esac
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
    ls -d k9/*.tmp k9/*.old 2>/dev/null && fail "the next job left what the killed one had not finished"
    echo "kill -9 after step $latest: resumed bit-exactly" ;;
*)
    echo "$TEST: unknown case $CASE"; exit 2 ;;
esac
