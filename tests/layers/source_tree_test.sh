#!/bin/sh
# docs/architecture.md's source tree names every source file of the core:
# each core/**/*.[ch] appears there as NAME.c, NAME.h or NAME.[ch] (the
# installed headers as NAME.h). A file added without a line fails here.
#   usage: source_tree_test.sh SOURCE_DIR
set -eu
SRC=$1
tree=$(awk '/^## The source tree/ { inside = 1 } /^## Further reading/ { inside = 0 } inside' \
    "$SRC/docs/architecture.md")
[ -n "$tree" ] || { echo "source_tree_test: no '## The source tree' section in docs/architecture.md"; exit 1; }
missing=""
for f in $(cd "$SRC/core" && find . -name '*.[ch]' | sed 's|^\./||' | sort); do
    stem=$(basename "$f" | sed 's/\.[ch]$//')
    printf '%s\n' "$tree" | grep -Eq "(^|[ (/,])$stem\.(c|h|\[ch\])" || missing="$missing core/$f"
done
if [ -n "$missing" ]; then
    echo "source_tree_test: docs/architecture.md's source tree does not name:$missing"
    exit 1
fi
echo "source_tree_test: every core source file is in docs/architecture.md's tree"
