#!/bin/sh
# Each command's --help names the options the docs give it (README's command
# list, docs/pipeline.md, docs/plugin-guide.md): a documented option missing
# from the usage, or the other way round, is a mismatch a user trips on.
#   cli_help_test.sh LOOM SOURCE_DIR
set -u
LOOM=$1
SRC=$2
fail() { echo "cli_help_test: $*"; exit 1; }

# usage goes to stdout or stderr, with exit 0 or 2: read both
help_of() { "$LOOM" "$@" --help 2>&1; }

for option in "--timeout S" "--tolerance REL" "--reference NAME" "--keep DIR" "--ranks" "--train CONFIG"; do
    help_of plugins | grep -F -- "$option" > /dev/null || fail "loom plugins --help lacks $option"
done
help_of plugins | grep -F -- "--timeout S  each training run" > /dev/null ||
    fail "loom plugins --help does not say what --timeout S is"
help_of settings | grep -F -- "loom settings [CONFIG] [--set path=value ...]" > /dev/null ||
    fail "loom settings --help lacks --set"
help_of schedule | grep -F -- "[--p2p-cost X]" > /dev/null || fail "loom schedule --help lacks --p2p-cost X"
# -v after the command is the global one (loom train CONFIG -v); a -v after
# "--" belongs to the command that follows
tiny() {
    "$LOOM" train "$SRC/tests/zero/tiny.cfg" --set data.train="$SRC/examples/data/corpus.bin" \
        --set train.steps=1 "$@" 2>&1
}
tiny -v | grep -q "launch environment: none" || fail "loom train CONFIG -v is not verbose"
tiny --verbose | grep -q "launch environment: none" || fail "loom train CONFIG --verbose is not verbose"
tiny | grep -q "launch environment" && fail "loom train is verbose without -v"
"$LOOM" settings -- -v > /dev/null 2>&1 && fail "loom settings -- -v took -v as its own"
exit 0
