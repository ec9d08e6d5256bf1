#!/bin/sh
# cmake --install gives a usable loom: the ABI headers, the loom program, the
# plugins, loom.pc (compile flags only) and the CMake package (loom::abi and
# loom_add_plugin), and no loom library (plugins link none); the out-of-tree
# example plugins build against it alone with loom_add_plugin, export the
# plugin struct and nothing else, and pass `loom plugins --check`, the
# numerics harness too (the installed loom launching itself; comm-trace over
# each installed host backend, its JSON read back). The prefix
# and the plugins' build stay in INSTALLED for the paramserver tests
# (paramserver_test.sh).
#   usage: install_test.sh BUILD_DIR SOURCE_DIR INSTALLED
set -eu
BUILD=$1
SRC=$2
INSTALLED=$3
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
rm -rf "$INSTALLED"
PREFIX=$INSTALLED/prefix
PLUGINS=$INSTALLED/plugins

cmake --install "$BUILD" --prefix "$PREFIX" > "$TMP/install.log"
for f in include/loom/plugin.h include/loom/comm.h include/loom/strategy.h \
         include/loom/memtier.h include/loom/tensor.h include/loom/status.h \
         bin/loom lib/loom/libloom-strategy-ddp.so lib/pkgconfig/loom.pc lib/cmake/loom/loomConfig.cmake \
         lib/cmake/loom/loomAddPlugin.cmake; do
    [ -e "$PREFIX/$f" ] || { echo "install_test: missing $f"; exit 1; }
done
[ -s "$PREFIX/share/doc/loom/plugin-guide.md" ] || { echo "install_test: missing share/doc/loom/plugin-guide.md (the plugin guide)"; exit 1; }

ls "$PREFIX"/lib/libloom* 2>/dev/null && { echo "install_test: a loom library was installed; plugins must not need one"; exit 1; }
# The installed program finds the plugins beside it (this prefix is not the
# configured one).
"$PREFIX/bin/loom" plugins | grep -E "$PREFIX/lib/loom/libloom-strategy-ddp.so +ok" > /dev/null ||
    { echo "install_test: the installed loom does not list the plugins of its own prefix"; "$PREFIX/bin/loom" plugins; exit 1; }

# pkg-config: compile a program against the installed headers alone.
cat > "$TMP/consumer.c" <<'C'
#include <loom/comm.h>
#include <stdio.h>
int main(void) { printf("%s %s\n", loom_status_string(LOOM_ERR_TIMEOUT), loom_comm_op_name(LOOM_OP_ALLREDUCE)); return 0; }
C
# Plugins link no loom library, so loom.pc gives no -l at all.
libs=$(PKG_CONFIG_PATH="$PREFIX/lib/pkgconfig" pkg-config --libs loom)
[ -z "$libs" ] || { echo "install_test: loom.pc gives link flags '$libs'; a plugin links no loom library"; exit 1; }
flags=$(PKG_CONFIG_PATH="$PREFIX/lib/pkgconfig" pkg-config --cflags loom)
cc -std=c11 -Wall -Wextra -Werror "$TMP/consumer.c" $flags -o "$TMP/consumer"
[ "$("$TMP/consumer")" = "timed out allreduce" ] || { echo "install_test: consumer printed the wrong thing"; exit 1; }

# The CMake package: build the out-of-tree plugins with nothing from this tree.
cp -r "$SRC/examples/out-of-tree-plugin" "$TMP/plugin-src"
cmake -S "$TMP/plugin-src" -B "$PLUGINS" -DCMAKE_PREFIX_PATH="$PREFIX" > "$TMP/plugin.log" ||
    { cat "$TMP/plugin.log"; exit 1; }
cmake --build "$PLUGINS" >> "$TMP/plugin.log" || { cat "$TMP/plugin.log"; exit 1; }
cd "$TMP" # comm-trace's --check writes comm-trace.0.json where it runs
for plugin in schedule-filldrain strategy-paramserver comm-trace; do
    kind=${plugin%%-*}
    name=${plugin#*-}
    file=$PLUGINS/libloom-$plugin.so
    # loom_add_plugin hides every symbol but the plugin struct (the linker's
    # own markers aside).
    extra=$(nm -D --defined-only "$file" | awk '{ print $3 }' |
            grep -v -x -e "loom_${kind}_plugin_v1" -e _init -e _fini -e __bss_start -e _edata -e _end || true)
    [ -z "$extra" ] || { echo "install_test: $name exports more than its plugin struct:" $extra; exit 1; }
    "$PREFIX/bin/loom" plugins --check "$file"
    LOOM_PLUGIN_PATH="$PLUGINS" "$PREFIX/bin/loom" plugins | grep -E "$name.*ok" > /dev/null ||
        { echo "install_test: loom plugins does not list $name as ok"; exit 1; }
done
# The harness: the installed loom trains with the plugin at 2 pipeline
# stages, its own plugins from its prefix (harness.cfg's data is relative to
# the source tree).
(cd "$SRC" && "$PREFIX/bin/loom" plugins --check "$PLUGINS/libloom-schedule-filldrain.so" \
    --train examples/harness.cfg --ranks 2) > "$TMP/harness.log" 2>&1 ||
    { cat "$TMP/harness.log"; echo "install_test: the harness fails with the installed loom"; exit 1; }
grep -q "^pp=2: 10 steps, losses match" "$TMP/harness.log" ||
    { cat "$TMP/harness.log"; echo "install_test: no pp=2 line"; exit 1; }
# comm-trace over each installed host backend: it opens the backend from
# the installed loom's prefix, and each rank writes its trace
for inner in mpi ucx; do
    [ -e "$PREFIX/lib/loom/libloom-comm-$inner.so" ] || continue
    (cd "$SRC" && "$PREFIX/bin/loom" plugins --check "$PLUGINS/libloom-comm-trace.so" \
        --train examples/harness.cfg --ranks 2 --set comm.trace.inner=$inner \
        --set comm.trace.output="$TMP/trace-$inner") > "$TMP/harness.log" 2>&1 ||
        { cat "$TMP/harness.log"; echo "install_test: comm-trace over $inner fails"; exit 1; }
    for rank in 0 1; do
        python3 -c 'import json, sys; t = json.load(open(sys.argv[1])); assert t["groups"][0]["ops"]["allreduce"]["calls"] > 0' \
            "$TMP/trace-$inner.$rank.json" ||
            { echo "install_test: comm-trace over $inner: no allreduce in rank $rank's trace"; exit 1; }
    done
done
echo "install_test: ok"
