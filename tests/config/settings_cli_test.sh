#!/bin/sh
# `loom settings` from the command line: --set values listed with "--set" as
# their source (with a CONFIG and without), a bad --set refused in one line,
# and string defaults listed alike (bare words) whether a plugin wrote them
# bare or quoted.
#   settings_cli_test.sh LOOM CASE SRC_DIR [QUOTED_PLUGIN_DIR]
set -u
LOOM=$1
CASE=$2
SRC=$3
TMP=$(mktemp -d /tmp/loom-settings-cli.XXXXXX)
trap 'rm -rf "$TMP"' EXIT

fail() { echo "settings_cli_test $CASE: $*"; exit 1; }

# the setting's line of the values table: value and source, spaces squeezed
value_line() { # file path
    grep "^$2 " "$1" | head -n 1 | tr -s ' '
}

case $CASE in
set)
    "$LOOM" settings "$SRC/examples/train.cfg" --set train.steps=7 --set comm.ucx.tls=tcp \
        > "$TMP/out" 2> "$TMP/err" || { cat "$TMP/err"; fail "exit $?"; }
    grep -Fx "values of $SRC/examples/train.cfg with --set:" "$TMP/out" > /dev/null ||
        { head -3 "$TMP/out"; fail "no values header"; }
    [ "$(value_line "$TMP/out" train.steps)" = "train.steps 7 --set train.steps=7" ] ||
        { value_line "$TMP/out" train.steps; fail "train.steps not from --set"; }
    [ "$(value_line "$TMP/out" comm.ucx.tls)" = "comm.ucx.tls \"tcp\" --set comm.ucx.tls=tcp" ] ||
        { value_line "$TMP/out" comm.ucx.tls; fail "comm.ucx.tls not from --set"; }
    # a value the file gives and no --set overrides keeps the file's line
    value_line "$TMP/out" model.channels | grep -q " $SRC/examples/train.cfg:[0-9]*$" ||
        { value_line "$TMP/out" model.channels; fail "model.channels not from the file"; }
    # --set alone: the defaults and the --set
    "$LOOM" settings --set train.steps=9 > "$TMP/out" 2> "$TMP/err" || { cat "$TMP/err"; fail "exit $?"; }
    grep -Fx "values with --set:" "$TMP/out" > /dev/null || fail "no values header without CONFIG"
    [ "$(value_line "$TMP/out" train.steps)" = "train.steps 9 --set train.steps=9" ] ||
        { value_line "$TMP/out" train.steps; fail "train.steps not from --set"; }
    # a misspelt one: one line, exit 2
    "$LOOM" settings "$SRC/examples/train.cfg" --set train.stepz=7 > "$TMP/out" 2> "$TMP/err" &&
        fail "--set train.stepz accepted"
    [ "$(wc -l < "$TMP/err")" -eq 1 ] || { cat "$TMP/err"; fail "not one line"; }
    grep -Fx "loom settings: --set train.stepz=7: train.stepz: unknown setting; did you mean 'train.steps'?" \
        "$TMP/err" > /dev/null || { cat "$TMP/err"; fail "wrong refusal"; }
    "$LOOM" settings --set > "$TMP/out" 2>&1 && fail "--set without a value accepted"
    "$LOOM" settings --help | grep -F "[--set path=value ...]" > /dev/null || fail "--help"
    ;;
string_defaults)
    # the default column of a plugin's settings listing, spaces squeezed
    LOOM_PLUGIN_PATH="$4:${LOOM_PLUGIN_PATH:-}" "$LOOM" settings > "$TMP/out" 2> "$TMP/err" ||
        { cat "$TMP/err"; fail "exit $?"; }
    default_of() { grep "^  $1 " "$TMP/out" | tr -s ' ' | cut -d' ' -f4; }
    [ "$(default_of parallel.sp.balance)" = contiguous ] || fail "ring's balance: $(default_of parallel.sp.balance)"
    if grep -q "^comm ucx " "$TMP/out"; then
        [ "$(default_of comm.ucx.allreduce)" = auto ] || fail "comm.ucx.allreduce: $(default_of comm.ucx.allreduce)"
        [ "$(default_of comm.ucx.barrier)" = dissemination ] || fail "comm.ucx.barrier: $(default_of comm.ucx.barrier)"
        [ "$(default_of comm.ucx.tls)" = '""' ] || fail "comm.ucx.tls: $(default_of comm.ucx.tls)"
    fi
    if grep -q "^comm mpi " "$TMP/out"; then
        [ "$(default_of comm.mpi.ompi_server)" = ompi-server ] || fail "comm.mpi.ompi_server: $(default_of comm.mpi.ompi_server)"
    fi
    # written "\"forward\"" by the test schedule: listed bare
    [ "$(default_of parallel.pp.order)" = forward ] || { grep "pp.order" "$TMP/out"; fail "a quoted default listed as $(default_of parallel.pp.order)"; }
    ;;
*)
    fail "unknown case"
    ;;
esac
exit 0
