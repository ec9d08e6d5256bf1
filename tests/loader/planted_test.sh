#!/bin/sh
# Plugins that cannot be planted. A plugin whose constructor leaves a marker
# file stands for code someone put where loom looks:
#  - no library loom or a plugin needs is looked for in the current
#    directory (an empty RUNPATH entry means it);
#  - a relative plugins.path is the config file's folder, not the current
#    directory, so a plugin planted under the current directory is not even
#    looked at (it used to be searched first, and loaded by any listing);
#  - `loom plugins` and `loom settings` read plugin files without loading
#    them: the plugin is listed with its settings, and the marker stays away;
#  - a job loads only the plugins it names;
#  - a plugin file or folder others can write is refused, unless
#    LOOM_ALLOW_INSECURE_PLUGINS=1;
#  - a corrupt plugin is reported by name: under --check the load runs in a
#    child, a job it crashes names it before dying of the signal, and a
#    relocation that writes outside the library is refused before dlopen,
#    by the listing and by a job.
#   usage: planted_test.sh LOOM PLUGIN_DIR PLUGIN_CORRUPT SOURCE_DIR
set -u
LOOM=$1
PLUGINS=$2
CORRUPT=$3
SRC=$4
TMP=$(mktemp -d)
trap 'chmod -R u+rwx "$TMP"; rm -rf "$TMP"' EXIT
fail() { cat "$TMP/out"; echo "planted_test: $*"; exit 1; }
MARKER=$TMP/marker
export LOOM_TEST_PLANTED_MARKER="$MARKER"
unset LOOM_PLUGIN_PATH LOOM_ALLOW_INSECURE_PLUGINS
planted() { [ -e "$MARKER" ]; }

# --- libraries planted under the current directory ---------------------------
# The build tree's RUNPATHs must have no empty entry, which the dynamic
# loader takes as the current directory: loom's own libraries and a
# plugin's would be looked for there, and a planted one run.
# One at a time: a planted copy of a library whose symbols are versioned
# stops the loader before any constructor runs, whichever else is there.
mkdir "$TMP/libs"
cd "$TMP/libs" || exit 1
for lib in libconfig.so.9 libopenblas.so.0 libdnnl.so.2; do
    rm -f ./*.so*
    cp "$PLUGINS/libloom-comm-planted.so" "$lib"
    "$LOOM" help > "$TMP/out" 2>&1
    planted && fail "loom ran a $lib planted in the current directory"
done
for lib in libmpi.so.40 libucp.so.0 libnccl.so.2; do
    rm -f ./*.so*
    cp "$PLUGINS/libloom-comm-planted.so" "$lib"
    for plugin in "$(dirname "$LOOM")"/../lib/loom/libloom-*.so; do
        [ -e "$plugin" ] || continue
        "$LOOM" plugins --check "$plugin" > "$TMP/out" 2>&1
        planted && fail "$plugin loaded a $lib planted in the current directory"
    done
done
cd "$TMP" || exit 1

# --- a plugin planted under the current directory -------------------------
mkdir -p "$TMP/cwd/build/lib/loom" "$TMP/conf"
cp "$PLUGINS/libloom-comm-planted.so" "$TMP/cwd/build/lib/loom/"
printf 'plugins = { path = [ "build/lib/loom" ]; };\n' > "$TMP/conf/job.cfg"
cd "$TMP/cwd" || exit 1
"$LOOM" settings "$TMP/conf/job.cfg" > "$TMP/out" 2>&1 || fail "loom settings failed"
planted && fail "loom settings ran a plugin planted under the current directory"
grep -q "comm planted" "$TMP/out" && fail "loom settings lists the planted plugin"
"$LOOM" plugins "$TMP/conf/job.cfg" > "$TMP/out" 2>&1 || fail "loom plugins failed"
planted && fail "loom plugins ran a plugin planted under the current directory"
grep -q "^  $TMP/conf/build/lib/loom  (no such directory)" "$TMP/out" ||
    fail "the relative plugins.path is not taken from the config file's folder"
grep -q "libloom-comm-planted" "$TMP/out" && fail "loom plugins lists the planted plugin"
# in an @included file, the included file's folder
mkdir -p "$TMP/conf/sub"
printf '@include "sub/plugins.cfg"\n' > "$TMP/conf/main.cfg"
printf 'plugins = { path = [ "build/lib/loom" ]; };\n' > "$TMP/conf/sub/plugins.cfg"
"$LOOM" plugins "$TMP/conf/main.cfg" > "$TMP/out" 2>&1 || fail "loom plugins failed"
grep -q "^  $TMP/conf/sub/build/lib/loom  (no such directory)" "$TMP/out" ||
    fail "a relative plugins.path in an included file is not taken from its folder"
# the shipped example, from a folder with a plugin planted where it used to look
"$LOOM" settings "$SRC/examples/train.cfg" > "$TMP/out" 2>&1 ||
    fail "loom settings examples/train.cfg failed"
planted && fail "loom settings examples/train.cfg ran the planted plugin"
# a job that names a plugin not found says where the relative entry was taken from
printf 'plugins = { path = [ "build/lib/loom" ]; };\nbench = { comms = [ "planted" ]; max_bytes = 64; };\n' \
    > "$TMP/conf/bench.cfg"
"$LOOM" bench "$TMP/conf/bench.cfg" > "$TMP/out" 2>&1 && fail "loom bench found the planted plugin"
planted && fail "loom bench ran the planted plugin"
grep -q "plugin comm 'planted' not found: no libloom-comm-planted.so in $TMP/conf/build/lib/loom, .*plugins.path entry \"build/lib/loom\" ($TMP/conf/bench.cfg:1) is taken from the folder of that config file, $TMP/conf" "$TMP/out" ||
    fail "the not-found line does not say where the relative entry was taken from"
cd "$TMP" || exit 1

# --- listing reads plugins, never loads them -------------------------------
mkdir -p "$TMP/conf/build/lib/loom"
cp "$PLUGINS/libloom-comm-planted.so" "$PLUGINS/libloom-comm-good.so" "$TMP/conf/build/lib/loom/"
"$LOOM" plugins "$TMP/conf/job.cfg" > "$TMP/out" 2>&1 || fail "loom plugins failed"
grep -q "^comm  *planted  *1\.[0-9]*  *$TMP/conf/build/lib/loom/libloom-comm-planted\.so  *ok$" \
    "$TMP/out" || fail "loom plugins does not list the plugin as ok"
planted && fail "loom plugins loaded a plugin to list it"
"$LOOM" settings "$TMP/conf/job.cfg" > "$TMP/out" 2>&1 || fail "loom settings failed"
grep -q "^comm planted (.*): settings in comm.planted = " "$TMP/out" &&
    grep -q "comm.planted.mode  *string  *fast" "$TMP/out" ||
    fail "loom settings does not show the plugin's settings"
planted && fail "loom settings loaded a plugin to list its settings"
# a job loads what it names: good, not planted
printf 'plugins = { path = [ "build/lib/loom" ]; };\nbench = { comms = [ "good" ]; max_bytes = 64; };\n' \
    > "$TMP/conf/bench.cfg"
"$LOOM" bench "$TMP/conf/bench.cfg" > "$TMP/out" 2>&1 || fail "loom bench over comm good failed"
planted && fail "loom bench loaded a plugin it does not name"
# the marker does tell a load: --check loads it
"$LOOM" plugins --check "$TMP/conf/build/lib/loom/libloom-comm-planted.so" > "$TMP/out" 2>&1 ||
    fail "loom plugins --check of the planted plugin failed"
planted || fail "the planted plugin's constructor leaves no marker even when loaded"
rm -f "$MARKER"

# --- plugins others can write ----------------------------------------------
mkdir "$TMP/open"
cp "$PLUGINS/libloom-comm-good.so" "$TMP/open/"
chmod 777 "$TMP/open"
"$LOOM" plugins --check "$TMP/open/libloom-comm-good.so" > "$TMP/out" 2>&1
[ $? = 1 ] || fail "--check of a plugin in a world-writable folder did not fail"
grep -q "^FAIL permissions: insecure: the folder $TMP/open (mode 0777, owner [^)]*) is writable by everyone, who could replace the plugin; run chmod go-w $TMP/open, or set LOOM_ALLOW_INSECURE_PLUGINS=1 to load it anyway$" \
    "$TMP/out" || fail "no FAIL permissions line naming the folder, its mode and owner"
LOOM_PLUGIN_PATH=$TMP/open "$LOOM" plugins > "$TMP/out" 2>&1 || fail "loom plugins failed"
grep -q "^comm  *good  *[-0-9.]*  *$TMP/open/libloom-comm-good\.so  *refused: insecure: the folder $TMP/open (mode 0777" \
    "$TMP/out" || fail "loom plugins does not show the plugin refused as insecure"
printf 'plugins = { path = [ "%s" ]; };\nbench = { comms = [ "good" ]; max_bytes = 64; };\n' \
    "$TMP/open" > "$TMP/open.cfg"
"$LOOM" bench "$TMP/open.cfg" > "$TMP/out" 2>&1
rc=$?
[ $rc != 0 ] && [ $rc -lt 128 ] || fail "loom bench exited $rc, want a refusal"
grep -q "plugin comm 'good' refused: $TMP/open/libloom-comm-good.so: insecure: the folder $TMP/open (mode 0777" \
    "$TMP/out" || fail "loom bench does not refuse the plugin in a world-writable folder"
LOOM_ALLOW_INSECURE_PLUGINS=1 "$LOOM" plugins --check "$TMP/open/libloom-comm-good.so" \
    > "$TMP/out" 2>&1 || fail "LOOM_ALLOW_INSECURE_PLUGINS=1 does not let the plugin load"
grep -q "warning: loading plugin $TMP/open/libloom-comm-good.so although LOOM_ALLOW_INSECURE_PLUGINS=1 is set: insecure: the folder $TMP/open" \
    "$TMP/out" && grep -q "all checks passed" "$TMP/out" ||
    fail "the plugin allowed with LOOM_ALLOW_INSECURE_PLUGINS=1 loads without a warning"
# the file itself writable by its group, in a folder that is fine: refused
# unless the group is the owner's alone (no other member, no other user's
# primary group), as ssh has it
chmod 755 "$TMP/open"
chmod 664 "$TMP/open/libloom-comm-good.so"
members=$(getent group "$(id -g)" | cut -d: -f4)
others=$(getent passwd | awk -F: -v g="$(id -g)" -v u="$(id -u)" '$4 == g && $3 != u' | wc -l)
"$LOOM" plugins --check "$TMP/open/libloom-comm-good.so" > "$TMP/out" 2>&1
rc=$?
if [ "$others" -gt 0 ] || { [ -n "$members" ] && [ "$members" != "$(id -un)" ]; }; then
    [ $rc = 1 ] && grep -q "^FAIL permissions: insecure: the file $TMP/open/libloom-comm-good.so (mode 0664, owner [^)]*) is writable by its group" \
        "$TMP/out" || fail "a plugin file writable by a shared group is not refused"
else
    [ $rc = 0 ] || fail "a plugin file writable by its owner's own group is refused"
fi
chmod 666 "$TMP/open/libloom-comm-good.so"
"$LOOM" plugins --check "$TMP/open/libloom-comm-good.so" > "$TMP/out" 2>&1
[ $? = 1 ] && grep -q "^FAIL permissions: insecure: the file $TMP/open/libloom-comm-good.so (mode 0666, owner [^)]*) is writable by everyone" \
    "$TMP/out" || fail "a world-writable plugin file is not refused"
chmod 644 "$TMP/open/libloom-comm-good.so"
"$LOOM" plugins --check "$TMP/open/libloom-comm-good.so" > "$TMP/out" 2>&1 ||
    fail "the plugin is refused once only its owner can write it"

# --- corrupt plugins ---------------------------------------------------------
mkdir "$TMP/bad"
BAD=$TMP/bad/libloom-comm-good.so
# a constructor pointed at bytes that are not code: only running it can tell
"$CORRUPT" "$PLUGINS/libloom-comm-good.so" "$BAD" init || fail "cannot corrupt the plugin"
[ "$(wc -c < "$BAD")" = "$(wc -c < "$PLUGINS/libloom-comm-good.so")" ] ||
    fail "the corrupt copy is not the size of the original"
"$LOOM" plugins --check "$BAD" > "$TMP/out" 2>&1
rc=$?
[ $rc = 1 ] || fail "loom plugins --check of a corrupt plugin exited $rc, want 1"
grep -q "^loom plugins: plugin $BAD crashed while loading: signal [0-9]* (.*)$" "$TMP/out" ||
    fail "loom plugins --check does not name the plugin that crashed"
[ "$(grep -c "crashed" "$TMP/out")" = 1 ] || fail "loom plugins --check says it more than once"
# a job that loads it dies of the signal, but says which plugin it was
printf 'plugins = { path = [ "%s" ]; };\nbench = { comms = [ "good" ]; max_bytes = 64; };\n' \
    "$TMP/bad" > "$TMP/bad.cfg"
"$LOOM" bench "$TMP/bad.cfg" > "$TMP/out" 2>&1
rc=$?
[ $rc -ge 128 ] || fail "loom bench exited $rc, want the crash's signal"
grep -q "^loom: error: plugin $BAD crashed while loading (its file is corrupt, or its constructor crashed); check it with loom plugins --check $BAD$" \
    "$TMP/out" || fail "loom bench does not name the plugin that crashed it"
LOOM_PLUGIN_PATH=$TMP/bad "$LOOM" plugins > "$TMP/out" 2>&1 ||
    fail "loom plugins crashed on a corrupt plugin it only had to list"
# a relocation that writes outside the library: refused before dlopen
"$CORRUPT" "$PLUGINS/libloom-comm-good.so" "$BAD" reloc || fail "cannot corrupt the plugin"
"$LOOM" plugins --check "$BAD" > "$TMP/out" 2>&1
[ $? = 1 ] && grep -q "^FAIL read: its relocation 0 writes at address 0x[0-9a-f]*, outside its segments; the file is corrupt: copy or rebuild the plugin again$" \
    "$TMP/out" || fail "--check does not refuse the relocation outside the library"
LOOM_PLUGIN_PATH=$TMP/bad "$LOOM" plugins > "$TMP/out" 2>&1 || fail "loom plugins failed"
grep -q "^comm  *good  *-  *$BAD  *refused: its relocation 0 writes at address" "$TMP/out" ||
    fail "loom plugins does not show the corrupt plugin refused"
"$LOOM" bench "$TMP/bad.cfg" > "$TMP/out" 2>&1
rc=$?
[ $rc != 0 ] && [ $rc -lt 128 ] || fail "loom bench exited $rc, want a refusal without a signal"
grep -q "plugin comm 'good' refused: $BAD: its relocation 0 writes at address" "$TMP/out" ||
    fail "loom bench does not name the corrupt plugin"
echo "planted_test: planted, writable and corrupt plugins are never run unasked"
