#!/bin/sh
# The comm-trace example (a communicator that wraps another) end to end.
#   usage: comm_trace_test.sh LOOM SOURCE_DIR TRACE_PLUGIN CASE [BACKEND]
#     check            `loom plugins --check` passes it (its memory kinds
#                      are those of the backend it opens); an inner of
#                      "self" or of itself is refused in one line
#     inner_settings   a bad setting of the inner backend (comm.mpi.*) and
#                      an inner backend that does not exist stop a run
#                      before training, in one line naming them
#     harness BACKEND  the numerics harness over BACKEND at 2 ranks; each
#                      rank's JSON parses, its allreduce calls and bytes are
#                      non-zero and the same on both ranks
set -eu
LOOM=$1
SRC=$2
TRACE=$3
CASE=$4
BACKEND=${5:-}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cd "$SRC" # examples/harness.cfg's data.train is relative to the repository

fail() { cat "$TMP/out"; echo "comm_trace_test: $*"; exit 1; }

# run_status CMD...: the output in $TMP/out, the status in $status
run_status() {
    status=0
    "$@" > "$TMP/out" 2>&1 || status=$?
}

# refused WHAT PATTERN CMD...: CMD fails with exactly one error line matching PATTERN
refused() {
    what=$1; pattern=$2; shift 2
    run_status "$@"
    [ "$status" != 0 ] || fail "$what: exit status 0"
    grep -q -- "$pattern" "$TMP/out" || fail "$what: no line matching '$pattern'"
    [ "$(grep -c -- "$pattern" "$TMP/out")" -le 2 ] || fail "$what: said more than once per rank"
}

case "$CASE" in
check)
    run_status "$LOOM" plugins --check "$TRACE" --set comm.trace.output="$TMP/check"
    [ "$status" = 0 ] || fail "plugins --check failed"
    grep -q "mem_kinds" "$TMP/out" || fail "no mem_kinds check (the kinds of the backend it opened)"
    grep -q "allreduce f32 sum" "$TMP/out" || fail "the functional checks did not run"
    refused "inner self" 'comm-trace: comm_open("self"): name a comm backend to forward to' \
        "$LOOM" plugins --check "$TRACE" --set comm.trace.inner=self
    refused "inner itself" 'comm_open("trace"): that is comm-trace itself' \
        "$LOOM" plugins --check "$TRACE" --set comm.trace.inner=trace ;;
inner_settings)
    CFG=$SRC/tests/zero/tiny.cfg
    refused "bad inner setting" "comm.mpi.late_grace_s" \
        "$LOOM" launch -n 2 -- "$LOOM" train "$CFG" --set comm.default=trace \
        --set comm.trace.inner=mpi --set comm.mpi.late_grace_s=nonsense --set parallel.dp.size=2
    grep -q -- "--set" "$TMP/out" || fail "the bad inner setting's line does not say it came from --set"
    refused "missing inner" 'comm-trace: comm_open("nosuch")' \
        "$LOOM" launch -n 2 -- "$LOOM" train "$CFG" --set comm.default=trace \
        --set comm.trace.inner=nosuch --set parallel.dp.size=2 ;;
harness)
    run_status "$LOOM" plugins --check "$TRACE" --train examples/harness.cfg --ranks 2 \
        --set comm.trace.inner="$BACKEND" --set comm.trace.output="$TMP/trace"
    [ "$status" = 0 ] || fail "the harness over $BACKEND failed"
    grep -q "^dp=2: 10 steps, losses match" "$TMP/out" || fail "no matching line for dp=2"
    python3 - "$TMP/trace" "$BACKEND" > "$TMP/json.out" 2>&1 <<'PY' || { cat "$TMP/json.out"; fail "the traces over $BACKEND"; }
import json, sys
prefix, backend = sys.argv[1], sys.argv[2]
traces = [json.load(open("%s.%d.json" % (prefix, r))) for r in (0, 1)]
for rank, t in enumerate(traces):
    assert t["rank"] == rank and t["inner"] == backend, t
    world = t["groups"][0]
    assert world["group"] == "world" and world["world_ranks"] == [0, 1], world
# every communicator (the world, then the dp group) the same on both ranks
assert len(traces[0]["groups"]) == len(traces[1]["groups"]), traces
for g0, g1 in zip(traces[0]["groups"], traces[1]["groups"]):
    for name in ("calls", "bytes"):
        assert g0["ops"]["allreduce"][name] == g1["ops"]["allreduce"][name], (g0, g1)
calls = sum(g["ops"]["allreduce"]["calls"] for g in traces[0]["groups"])
nbytes = sum(g["ops"]["allreduce"]["bytes"] for g in traces[0]["groups"])
assert calls > 0 and nbytes > 0, traces[0]
print("allreduce", calls, "calls,", nbytes, "bytes on each rank")
PY
    cat "$TMP/json.out" ;;
*)
    echo "comm_trace_test: unknown case $CASE"; exit 2 ;;
esac
echo "comm_trace_test: $CASE ok"
