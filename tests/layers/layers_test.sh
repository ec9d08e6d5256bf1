#!/bin/sh
# The core's layers are linked one way only: runtime <- model <- train <- cli.
# A source includes headers as "<layer>/<name>.h" (or the ABI's "loom/..."),
# from its own layer or a lower one, never a higher one's; and only the
# loader names a versioned plugin struct (loom_<kind>_plugin_v<N>_t).
#   usage: layers_test.sh SOURCE_DIR
set -eu
cd "$1/core"
out=$(awk '
    BEGIN { rank["runtime"] = 0; rank["model"] = 1; rank["train"] = 2; rank["cli"] = 3 }
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
' runtime/*.[ch] model/*.[ch] train/*.[ch] cli/*.[ch])
if [ -n "$out" ]; then
    echo "$out"
    echo "layers_test: $(echo "$out" | wc -l) violation(s)"
    exit 1
fi
echo "layers_test: ok"
