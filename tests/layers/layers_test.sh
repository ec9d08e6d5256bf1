#!/bin/sh
# The core's layers are linked one way only:
#   runtime <- model <- train <- plan <- cli.
# A source includes headers as "<layer>/<name>.h" (or the ABI's "loom/..."),
# from its own layer or a lower one, never a higher one's; and only the
# loader names a versioned plugin struct (loom_<kind>_plugin_v<N>_t); and the
# runtime names no setting of a layer above it (model.*, data.*, train.*,
# bench.*: each layer adds its own to the config's schema); and only the
# loader reads a plugin's own struct (->exported) or the ABI minor it was
# built for (the loader records what it provides). Plugins include the ABI
# headers and plugins/common only, never a core header, and compile no core
# source. Every
# folder of the core (but the installed headers, include/) is a layer here.
# The check runs first on a made-up core whose violations it must report, so
# a check that reports nothing fails too.
#   usage: layers_test.sh SOURCE_DIR
set -eu
LAYERS="runtime model train plan cli"

# violations CORE_DIR: one line per violation in the core at CORE_DIR
violations() {
    (
        cd "$1"
        for d in */; do
            d=${d%/}
            [ "$d" = include ] && continue
            case " $LAYERS " in
            *" $d "*) ;;
            *) echo "core/$d: a folder that is no layer (add it to LAYERS in tests/layers/layers_test.sh)" ;;
            esac
        done
        files=""
        for layer in $LAYERS; do
            for f in "$layer"/*.[ch]; do
                [ -e "$f" ] && files="$files $f"
            done
        done
        # shellcheck disable=SC2086 # the file names have no spaces
        awk -v layers="$LAYERS" '
            BEGIN { n = split(layers, l, " "); for (i = 1; i <= n; i++) rank[l[i]] = i }
            FNR == 1 { split(FILENAME, p, "/"); mine = p[1] }
            /^#include "/ {
                inc = $0; sub(/^#include "/, "", inc); sub(/".*/, "", inc)
                n = split(inc, q, "/")
                if (q[1] == "loom") next
                if (n < 2 || !(q[1] in rank))
                    printf "%s:%d: includes \"%s\" without its layer folder (write \"<layer>/%s\")\n", FILENAME, FNR, inc, inc
                else if (rank[q[1]] > rank[mine])
                    printf "%s:%d: the %s layer includes \"%s\" of the higher %s layer\n", FILENAME, FNR, mine, inc, q[1]
            }
            /loom_[a-z]+_plugin_v[0-9]+_t/ && FILENAME != "runtime/loader.c" && FILENAME != "runtime/loader.h" {
                printf "%s:%d: names a versioned plugin struct; only the loader may (use the ops table)\n", FILENAME, FNR
            }
            (/->exported/ || /LOOM_ABI_VERSION_MINOR/) && FILENAME != "runtime/loader.c" && FILENAME != "runtime/loader.h" {
                printf "%s:%d: reads a plugin'"'"'s own struct or ABI minor; ask the loader (loom_plugin_provides, loom_plugin_has_feature)\n", FILENAME, FNR
            }
            mine == "runtime" && /"(model|data|train|bench)\./ {
                printf "%s:%d: the runtime names a setting of a higher layer (the layer that reads it adds it: loom_config_add_settings)\n", FILENAME, FNR
            }
        ' $files
    )
}

# plugin_violations PLUGINS_DIR: a core header included, a core source compiled
plugin_violations() {
    (
        cd "$1"
        for f in */*.[ch] */*/*.[ch]; do
            [ -e "$f" ] || continue
            grep -n -E '^#include "(runtime|model|train|plan|cli)/' "$f" | sed "s|^|plugins/$f:|; s|\$| (a plugin includes the ABI headers and plugins/common only)|"
        done
        for f in CMakeLists.txt */CMakeLists.txt; do
            [ -e "$f" ] || continue
            awk -v f="plugins/$f" '!/^[ \t]*#/ && /core\/(runtime|model|train|plan|cli)/ {
                printf "%s:%d:%s (a plugin compiles no core source: the core serves it through loom_host)\n", f, FNR, $0 }' "$f"
        done
    )
}

# The check itself: a made-up core with one violation of each kind.
fake=$(mktemp -d "${TMPDIR:-/tmp}/layers_test.XXXXXX")
fake_plugins=$(mktemp -d "${TMPDIR:-/tmp}/layers_test_plugins.XXXXXX")
trap 'rm -rf "$fake" "$fake_plugins"' EXIT
for layer in $LAYERS stray; do mkdir "$fake/$layer"; done
printf '#include "plan/plan.h"\n' > "$fake/train/fit.c"
printf '#include "cli/args.h"\n#include "train/train.h"\n' > "$fake/plan/plan.c"
printf '#include "plan/plan.h"\n#include "loom/status.h"\n' > "$fake/cli/cmd_plan.c"
printf '#include "config.h"\n' > "$fake/runtime/log.c"
printf 'loom_comm_plugin_v1_t *p;\nconst char *seq = "train.seq";\n' > "$fake/model/model.c"
printf 'const char *batch = "train.batch";\n' > "$fake/runtime/config.c"
printf 'ok = p->exported->struct_size;\n' > "$fake/train/eval.c"
printf 'int minor = LOOM_ABI_VERSION_MINOR(v);\n' > "$fake/cli/cmd_plugins.c"
mkdir "$fake_plugins/nvme"
printf '#include "loom/memtier.h"\n#include "common/call.h"\n#include "runtime/crc32c.h"\n' > "$fake_plugins/nvme/tier.c"
printf 'loom_add_plugin(memtier nvme SOURCES tier.c ${PROJECT_SOURCE_DIR}/core/runtime/crc32c.c)\n' > "$fake_plugins/nvme/CMakeLists.txt"
got=$(violations "$fake")
for want in \
    'train/fit.c:1: the train layer includes "plan/plan.h" of the higher plan layer' \
    'plan/plan.c:1: the plan layer includes "cli/args.h" of the higher cli layer' \
    'runtime/log.c:1: includes "config.h" without its layer folder' \
    'model/model.c:1: names a versioned plugin struct' \
    'runtime/config.c:1: the runtime names a setting of a higher layer' \
    "train/eval.c:1: reads a plugin's own struct or ABI minor" \
    "cli/cmd_plugins.c:1: reads a plugin's own struct or ABI minor" \
    'core/stray: a folder that is no layer'; do
    case "$got" in
    *"$want"*) ;;
    *) printf 'layers_test: the check misses "%s"; it reported:\n%s\n' "$want" "$got"; exit 1 ;;
    esac
done
if [ "$(printf '%s\n' "$got" | wc -l)" -ne 8 ]; then
    printf 'layers_test: the check reports allowed things (train/train.h from plan, '
    printf 'plan/plan.h from cli, loom/status.h, a train setting in the model):\n%s\n' "$got"
    exit 1
fi

got=$(plugin_violations "$fake_plugins")
for want in 'plugins/nvme/tier.c:3:#include "runtime/crc32c.h"' 'plugins/nvme/CMakeLists.txt:1:'; do
    case "$got" in
    *"$want"*) ;;
    *) printf 'layers_test: the plugin check misses "%s"; it reported:\n%s\n' "$want" "$got"; exit 1 ;;
    esac
done
if [ "$(printf '%s\n' "$got" | wc -l)" -ne 2 ]; then
    printf 'layers_test: the plugin check reports allowed includes (loom/, common/):\n%s\n' "$got"
    exit 1
fi

out=$(violations "$1/core"; plugin_violations "$1/plugins")
if [ -n "$out" ]; then
    echo "$out"
    echo "layers_test: $(echo "$out" | wc -l) violation(s)"
    exit 1
fi
echo "layers_test: ok"
