#!/bin/sh
# A plugin file cut short (a copy that ran out of disk, say) is refused with
# a message naming it, never mapped: dlopen of a truncated shared object
# used to kill every command with SIGBUS and no word.
#   usage: truncated_test.sh LOOM PLUGIN_DIR
set -u
LOOM=$1
PLUGINS=$2
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
mkdir "$TMP/plugins"
BAD=$TMP/plugins/libloom-comm-mpi.so
head -c 20000 "$PLUGINS/libloom-comm-mpi.so" > "$BAD"
fail() { cat "$TMP/out"; echo "truncated_test: $*"; exit 1; }

# the listing goes on: the file is shown refused, and why
LOOM_PLUGIN_PATH=$TMP/plugins "$LOOM" plugins > "$TMP/out" 2>&1
rc=$?
[ $rc = 0 ] || fail "loom plugins exited $rc"
grep -q "comm  *mpi  *-  *$BAD  *refused: truncated: the file is 20000 bytes, but its ELF segment [0-9]* ends at byte [0-9]*; copy or rebuild the plugin again" "$TMP/out" ||
    fail "loom plugins does not show the file refused as truncated"

# the conformance check fails at the ELF check, before dlopen
"$LOOM" plugins --check "$BAD" > "$TMP/out" 2>&1
rc=$?
[ $rc = 1 ] || fail "loom plugins --check exited $rc, want 1"
grep -q "^FAIL elf: truncated: the file is 20000 bytes" "$TMP/out" || fail "no FAIL elf line"

# a job that needs it stops with one line naming the file
printf 'plugins = { path = [ "%s" ]; };\nbench = { comms = [ "mpi" ]; max_bytes = 64; };\n' \
    "$TMP/plugins" > "$TMP/bench.cfg"
"$LOOM" bench "$TMP/bench.cfg" > "$TMP/out" 2>&1
rc=$?
[ $rc != 0 ] && [ $rc -lt 128 ] || fail "loom bench exited $rc, want a failure without a signal"
grep -q "plugin comm 'mpi' refused: $BAD: truncated: the file is 20000 bytes" "$TMP/out" ||
    fail "loom bench does not name the truncated file"

printf 'plugins = { path = [ "%s" ]; };\ncomm = { default = "mpi"; };\n' "$TMP/plugins" \
    > "$TMP/train.cfg"
"$LOOM" train "$TMP/train.cfg" > "$TMP/out" 2>&1
rc=$?
[ $rc != 0 ] && [ $rc -lt 128 ] || fail "loom train exited $rc, want a failure without a signal"
grep -q "comm.default: plugin comm 'mpi' refused: $BAD: truncated: the file is 20000 bytes" "$TMP/out" ||
    fail "loom train does not name the truncated file"

# so is a file cut inside its headers, or empty
for size in 100 10 0; do
    head -c $size "$PLUGINS/libloom-comm-mpi.so" > "$BAD"
    "$LOOM" plugins --check "$BAD" > "$TMP/out" 2>&1
    [ $? = 1 ] && grep -q "^FAIL elf: truncated: the file is $size bytes" "$TMP/out" ||
        fail "a file of $size bytes is not refused as truncated"
done
echo "truncated_test: a truncated plugin is refused by name"
