#!/bin/sh
# `loom schedule` from the command line: the per-rank lists, --verbose, the
# SVG (well-formed XML with one rect per compute action), an out-of-tree
# schedule by file, the same schedule built as a strategy before ABI 1.8
# (adapted: the same lists, bubble and plan), and bad configs refused with
# one line naming file:line.
#   schedule_cli_test.sh LOOM CASE FILLDRAIN_SO OLD_FILLDRAIN_SO
set -u
LOOM=$1
CASE=$2
FILLDRAIN=$3
OLD_FILLDRAIN=$4
TMP=$(mktemp -d /tmp/loom-schedule-cli.XXXXXX)
trap 'rm -rf "$TMP"' EXIT

fail() { echo "schedule_cli_test $CASE: $*"; exit 1; }

# One setting a line, so that a refusal's line number is known.
write_cfg() { # size schedule microbatches virtual_stages
    cat > "$TMP/pp.cfg" <<CFG
# pipeline schedule test
parallel = {
  pp = {
    size = $1;
    schedule = "$2";
    microbatches = $3;
    virtual_stages = $4;
  };
};
CFG
}

expect_line() { # file line: the exact line must be in the file
    grep -Fx -- "$2" "$1" > /dev/null || { echo "--- output:"; cat "$1"; fail "no line '$2'"; }
}

case $CASE in
lists)
    write_cfg 4 1f1b 8 1
    "$LOOM" schedule "$TMP/pp.cfg" > "$TMP/out" 2>&1 || { cat "$TMP/out"; fail "exit $?"; }
    # Megatron's non-interleaved 1F1B: p-r-1 warm-up forwards, then 1F1B.
    expect_line "$TMP/out" "rank 0: F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7"
    expect_line "$TMP/out" "rank 1: F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7"
    expect_line "$TMP/out" "rank 2: F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7"
    expect_line "$TMP/out" "rank 3: F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7"
    # (p-1)/(m+p-1) = 3/11; makespan 3(m+p-1) = 33
    expect_line "$TMP/out" "  makespan 33, bubble 0.2727 (theory (p-1)/(m+p-1) = 0.2727)"
    expect_line "$TMP/out" "  peak stash (micro-batches alive at once): rank 0: 4, rank 1: 3, rank 2: 2, rank 3: 1"
    write_cfg 2 gpipe 3 1
    "$LOOM" schedule "$TMP/pp.cfg" > "$TMP/out" 2>&1 || { cat "$TMP/out"; fail "exit $?"; }
    expect_line "$TMP/out" "rank 1: F0 F1 F2 B0 B1 B2"
    write_cfg 2 zb-h1 2 1
    "$LOOM" schedule "$TMP/pp.cfg" > "$TMP/out" 2>&1 || { cat "$TMP/out"; fail "exit $?"; }
    expect_line "$TMP/out" "rank 0: F0 F1 I0 W0 I1 W1"
    expect_line "$TMP/out" "rank 1: F0 I0 F1 I1 W0 W1"
    write_cfg 2 interleaved 2 2
    "$LOOM" schedule "$TMP/pp.cfg" > "$TMP/out" 2>&1 || { cat "$TMP/out"; fail "exit $?"; }
    expect_line "$TMP/out" "rank 0: F0v0 F1v0 F0v1 F1v1 B0v1 B1v1 B0v0 B1v0"
    ;;
verbose)
    write_cfg 2 1f1b 2 1
    "$LOOM" schedule "$TMP/pp.cfg" --verbose > "$TMP/out" 2>&1 || { cat "$TMP/out"; fail "exit $?"; }
    expect_line "$TMP/out" "rank 0: F0 sa0 F1 sa1 rg0 B0 rg1 B1"
    expect_line "$TMP/out" "rank 1: ra0 F0 B0 sg0 ra1 F1 B1 sg1"
    ;;
svg)
    write_cfg 4 1f1b 8 1
    "$LOOM" schedule "$TMP/pp.cfg" --svg "$TMP/s.svg" > "$TMP/out" 2>&1 || { cat "$TMP/out"; fail "exit $?"; }
    expect_line "$TMP/out" "  drawn to $TMP/s.svg"
    "$LOOM" schedule "$TMP/pp.cfg" --set parallel.pp.schedule=zb-h1 --svg "$TMP/z.svg" > "$TMP/out" 2>&1 ||
        { cat "$TMP/out"; fail "exit $?"; }
    python3 - "$TMP/s.svg" "$TMP/z.svg" <<'PY' || fail "SVG check"
import sys
from xml.dom import minidom
def count(path):
    doc = minidom.parse(path)   # raises on malformed XML
    rects = doc.getElementsByTagName("rect")
    by = {}
    for r in rects:
        by[r.getAttribute("class")] = by.get(r.getAttribute("class"), 0) + 1
    title = doc.getElementsByTagName("text")[0].firstChild.data
    return by, title
by, title = count(sys.argv[1])
# p = 4, m = 8: 32 forwards, 32 backwards; each rank idles (ranks 1-3
# before their first forward, every rank before its first backward ...)
assert by.get("forward") == 32 and by.get("backward") == 32, by
assert by.get("backward-input", 0) == 0 and by.get("backward-weight", 0) == 0, by
assert by.get("idle", 0) >= 4, by
assert title == "1f1b: p = 4, v = 1, m = 8, bubble 27.3%", title
by, title = count(sys.argv[2])
assert by.get("forward") == 32 and by.get("backward-input") == 32 and by.get("backward-weight") == 32, by
assert by.get("backward", 0) == 0, by
assert title == "zb-h1: p = 4, v = 1, m = 8, bubble 11.1%", title
PY
    ;;
filldrain)
    # an out-of-tree schedule, by file
    write_cfg 3 "$FILLDRAIN" 2 1
    "$LOOM" schedule "$TMP/pp.cfg" > "$TMP/out" 2>&1 || { cat "$TMP/out"; fail "exit $?"; }
    expect_line "$TMP/out" "rank 2: F0 F1 B1 B0"
    grep -F "bubble 0.5000" "$TMP/out" > /dev/null || { cat "$TMP/out"; fail "bubble"; }
    ;;
adapted)
    # the schedule-kind filldrain and the strategy-kind one, adapted: every
    # line but the first (which says which) the same, at several shapes
    for shape in "2 4" "3 2" "4 8"; do
        set -- $shape
        write_cfg "$1" "$FILLDRAIN" "$2" 1
        "$LOOM" schedule "$TMP/pp.cfg" --verbose > "$TMP/new" 2>&1 || { cat "$TMP/new"; fail "exit $?"; }
        write_cfg "$1" "$OLD_FILLDRAIN" "$2" 1
        "$LOOM" schedule "$TMP/pp.cfg" --verbose > "$TMP/old" 2>&1 || { cat "$TMP/old"; fail "exit $?"; }
        expect_line "$TMP/new" "schedule \"filldrain\": filldrain schedule over $1 stages; p = $1, v = 1, m = $2 (valid)"
        expect_line "$TMP/old" "schedule \"filldrain\": filldrain schedule over $1 stages (a strategy-kind schedule, adapted); p = $1, v = 1, m = $2 (valid)"
        tail -n +2 "$TMP/new" > "$TMP/new.rest"
        tail -n +2 "$TMP/old" > "$TMP/old.rest"
        cmp -s "$TMP/new.rest" "$TMP/old.rest" || { diff "$TMP/new.rest" "$TMP/old.rest"; fail "p = $1, m = $2: the adapted schedule differs"; }
    done
    # and loom plan makes the same plan of them (but the line naming the file)
    SRC=$(cd "$(dirname "$0")/../.." && pwd)
    for so in "$FILLDRAIN" "$OLD_FILLDRAIN"; do
        "$LOOM" plan "$SRC/tests/pipeline/pp.cfg" --set parallel.pp.size=3 --set parallel.pp.microbatches=3 \
            --set parallel.pp.stage_layers=1,1,2 --set train.batch=12 --set parallel.pp.schedule="$so" > "$TMP/plan" 2>&1 ||
            { cat "$TMP/plan"; fail "loom plan with $so: exit $?"; }
        grep -v "^  mesh " "$TMP/plan" > "$TMP/plan.$(basename "$so")"
    done
    cmp -s "$TMP/plan.$(basename "$FILLDRAIN")" "$TMP/plan.$(basename "$OLD_FILLDRAIN")" ||
        { diff "$TMP/plan.$(basename "$FILLDRAIN")" "$TMP/plan.$(basename "$OLD_FILLDRAIN")"; fail "loom plan differs"; }
    grep -q "pp.send" "$TMP/plan.$(basename "$FILLDRAIN")" || { cat "$TMP/plan.$(basename "$FILLDRAIN")"; fail "no plan"; }
    # its refusal comes through the adapter as its own line
    write_cfg 2 "$OLD_FILLDRAIN" 2 2
    "$LOOM" schedule "$TMP/pp.cfg" > "$TMP/out" 2> "$TMP/err" && fail "filldrain with v = 2 accepted"
    expect_line "$TMP/err" "loom schedule: $TMP/pp.cfg:5: filldrain: one virtual stage per rank only (got 2)"
    ;;
p2p_cost)
    # --p2p-cost 0 is the default, to the byte
    write_cfg 2 1f1b 2 1
    "$LOOM" schedule "$TMP/pp.cfg" > "$TMP/free" 2>&1 || { cat "$TMP/free"; fail "exit $?"; }
    "$LOOM" schedule "$TMP/pp.cfg" --p2p-cost 0 > "$TMP/zero" 2>&1 || { cat "$TMP/zero"; fail "exit $?"; }
    cmp -s "$TMP/free" "$TMP/zero" || { diff "$TMP/free" "$TMP/zero"; fail "--p2p-cost 0 changed the output"; }
    # p = 2, m = 2, transfers X. Rank 0: F0 sa0 F1 sa1 rg0 B0 rg1 B1, rank 1:
    # ra0 F0 B0 sg0 ra1 F1 B1 sg1. Rank 1's F0 starts at 1 + X, B0 ends at
    # 4 + X (F1's activation, sent at 2, arrived long before), B1 ends at
    # 7 + X; rank 0's B0 waits for the gradient until 4 + 2X, its B1 until
    # 7 + 2X and ends at 9 + 2X: two transfers on the critical path.
    "$LOOM" schedule "$TMP/pp.cfg" --p2p-cost 1 --svg "$TMP/t.svg" > "$TMP/out" 2>&1 ||
        { cat "$TMP/out"; fail "exit $?"; }
    expect_line "$TMP/out" "simulated with forward 1, backward-input 1, backward-weight 1, backward 2, transfers 1:"
    # busy 12 of 2 x 11
    expect_line "$TMP/out" "  makespan 11, bubble 0.4545 (theory, free transfers: (p-1)/(m+p-1) = 0.3333)"
    "$LOOM" schedule "$TMP/pp.cfg" --p2p-cost 0.5 > "$TMP/out" 2>&1 || { cat "$TMP/out"; fail "exit $?"; }
    expect_line "$TMP/out" "  makespan 10, bubble 0.4000 (theory, free transfers: (p-1)/(m+p-1) = 0.3333)"
    "$LOOM" schedule "$TMP/pp.cfg" --svg "$TMP/free.svg" > "$TMP/out" 2>&1 || { cat "$TMP/out"; fail "exit $?"; }
    python3 - "$TMP/t.svg" "$TMP/free.svg" <<'PY' || fail "SVG check"
import sys
from xml.dom import minidom
doc = minidom.parse(sys.argv[1])
lines = [l for l in doc.getElementsByTagName("line") if l.getAttribute("class") == "transfer"]
# two activations and two gradients, each drawn 1 unit long
assert len(lines) == 4, len(lines)
spans = sorted(round(float(l.getAttribute("x2")) - float(l.getAttribute("x1")), 2) for l in lines)
assert len(set(spans)) == 1 and spans[0] > 0, spans
title = doc.getElementsByTagName("text")[0].firstChild.data
assert title == "1f1b: p = 2, v = 1, m = 2, bubble 45.5%, transfers 1", title
free = minidom.parse(sys.argv[2])
assert not [l for l in free.getElementsByTagName("line") if l.getAttribute("class") == "transfer"]
PY
    # 1F1B's steady state waits on each transfer it asks for; GPipe's
    # forwards run ahead of theirs, so at p = 4, m = 8 it hides more of them
    write_cfg 4 1f1b 8 1
    "$LOOM" schedule "$TMP/pp.cfg" --p2p-cost 1 > "$TMP/out" 2>&1 || { cat "$TMP/out"; fail "exit $?"; }
    expect_line "$TMP/out" "  makespan 49, bubble 0.5102 (theory, free transfers: (p-1)/(m+p-1) = 0.2727)"
    "$LOOM" schedule "$TMP/pp.cfg" --set parallel.pp.schedule=gpipe --p2p-cost 1 > "$TMP/out" 2>&1 ||
        { cat "$TMP/out"; fail "exit $?"; }
    expect_line "$TMP/out" "  makespan 39, bubble 0.3846 (theory, free transfers: (p-1)/(m+p-1) = 0.2727)"
    for bad in -1 abc 1x inf; do
        "$LOOM" schedule "$TMP/pp.cfg" --p2p-cost "$bad" > "$TMP/out" 2> "$TMP/err" && fail "--p2p-cost $bad accepted"
        [ "$(wc -l < "$TMP/err")" -eq 1 ] || { cat "$TMP/err"; fail "not one line"; }
        expect_line "$TMP/err" "loom schedule: --p2p-cost '$bad': not a time; give a number 0 or more, in units of a forward (e.g. --p2p-cost 0.5)"
    done
    ;;
bubble_with_settings)
    # FILLDRAIN is the flushes test schedule here: GPipe over
    # parallel.pp.flushes groups, bubble k(p-1)/(m+k(p-1)) from its setting
    write_cfg 2 "$FILLDRAIN" 4 1
    "$LOOM" schedule "$TMP/pp.cfg" > "$TMP/out" 2>&1 || { cat "$TMP/out"; fail "exit $?"; }
    expect_line "$TMP/out" "rank 0: F0 F1 F2 F3 B0 B1 B2 B3"
    expect_line "$TMP/out" "  makespan 15, bubble 0.2000 (theory (p-1)/(m+p-1) with flushes = 1 = 0.2000)"
    "$LOOM" schedule "$TMP/pp.cfg" --set parallel.pp.flushes=2 > "$TMP/out" 2>&1 || { cat "$TMP/out"; fail "exit $?"; }
    expect_line "$TMP/out" "rank 0: F0 F1 B0 B1 F2 F3 B2 B3"
    # 2 x 3(2+1) = 18; 2/(4+2)
    expect_line "$TMP/out" "  makespan 18, bubble 0.3333 (theory k(p-1)/(m+k(p-1)) with k = flushes = 0.3333)"
    "$LOOM" schedule "$TMP/pp.cfg" --set parallel.pp.flushes=4 > "$TMP/out" 2>&1 || { cat "$TMP/out"; fail "exit $?"; }
    expect_line "$TMP/out" "  makespan 24, bubble 0.5000 (theory k(p-1)/(m+k(p-1)) with k = flushes = 0.5000)"
    "$LOOM" schedule "$TMP/pp.cfg" --set parallel.pp.flushes=3 > "$TMP/out" 2> "$TMP/err" && fail "flushes = 3 of 4 accepted"
    grep -F "flushes: parallel.pp.flushes = 3 does not divide parallel.pp.microbatches = 4" "$TMP/err" > /dev/null ||
        { cat "$TMP/err"; fail "flushes = 3 not refused"; }
    ;;
bad_size)
    write_cfg 1 1f1b 4 1
    "$LOOM" schedule "$TMP/pp.cfg" > "$TMP/out" 2> "$TMP/err" && fail "pp.size = 1 accepted"
    [ "$(wc -l < "$TMP/err")" -eq 1 ] || { cat "$TMP/err"; fail "not one line"; }
    expect_line "$TMP/err" "loom schedule: $TMP/pp.cfg:4: parallel.pp.size = 1: no pipeline to schedule; set it to 2 or more stages"
    ;;
bad_interleaved)
    write_cfg 4 interleaved 6 2
    "$LOOM" schedule "$TMP/pp.cfg" > "$TMP/out" 2> "$TMP/err" && fail "m = 6, p = 4 accepted"
    [ "$(wc -l < "$TMP/err")" -eq 1 ] || { cat "$TMP/err"; fail "not one line"; }
    expect_line "$TMP/err" "loom schedule: $TMP/pp.cfg:5: interleaved: parallel.pp.microbatches = 6 is not a multiple of parallel.pp.size = 4 (micro-batches go through the virtual stages in groups of 4); use 4 or 8"
    ;;
bad_schedule)
    write_cfg 2 ddp 4 1
    "$LOOM" schedule "$TMP/pp.cfg" > "$TMP/out" 2> "$TMP/err" && fail "ddp accepted as a schedule"
    grep -F "loom schedule: $TMP/pp.cfg:5: plugin schedule 'ddp' refused: " "$TMP/err" > /dev/null &&
        grep -F "libloom-strategy-ddp.so: wrong kind: it is a strategy of the dp axis (exports loom_strategy_plugin_v1), not a pipeline schedule; name a schedule in parallel.pp.schedule" "$TMP/err" > /dev/null &&
        [ "$(wc -l < "$TMP/err")" -eq 1 ] || { cat "$TMP/err"; fail "ddp not refused in one line"; }
    write_cfg 2 1f1b 4 2
    "$LOOM" schedule "$TMP/pp.cfg" > "$TMP/out" 2> "$TMP/err" && fail "1f1b with v = 2 accepted"
    expect_line "$TMP/err" "loom schedule: $TMP/pp.cfg:5: 1f1b: one virtual stage per rank only (parallel.pp.virtual_stages = 2); the interleaved schedule takes more"
    "$LOOM" schedule > "$TMP/out" 2>&1 && fail "no CONFIG accepted"
    ;;
*)
    fail "unknown case"
    ;;
esac
exit 0
