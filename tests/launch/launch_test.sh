#!/bin/sh
# Drives `loom launch` through one case and checks its exit status, its
# messages and its output. Usage: launch_test.sh LOOM CASE
LOOM=$1
CASE=$2
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
cd "$DIR" || exit 1

fail() {
    echo "launch_test $CASE: FAILED: $*" >&2
    echo "--- stdout" >&2
    cat out >&2 2>/dev/null
    echo "--- stderr" >&2
    cat err >&2 2>/dev/null
    exit 1
}
expect_rc() { [ "$rc" = "$1" ] || fail "exit status $rc, want $1"; }
expect_line() { grep -qxF -- "$2" "$1" || fail "no line '$2' in $1"; }
# Seconds since the case began; "must finish fast" proves ranks were stopped.
START=$(date +%s)
expect_fast() {
    took=$(( $(date +%s) - START ))
    [ "$took" -le "$1" ] || fail "took $took s, want at most $1 s"
}

case "$CASE" in
prefix)
    "$LOOM" launch -n 3 -- sh -c 'echo "hello $LOOM_RANK of $LOOM_WORLD_SIZE local $LOOM_LOCAL_RANK/$LOOM_LOCAL_SIZE at $MASTER_ADDR:$MASTER_PORT"; echo "to stderr $LOOM_RANK" >&2; printf "partial $LOOM_RANK"' >out 2>err
    rc=$?
    expect_rc 0
    for r in 0 1 2; do
        grep -qx "\[$r\] hello $r of 3 local $r/3 at 127\.0\.0\.1:[0-9][0-9]*" out || fail "no hello line of rank $r"
        expect_line out "[$r] partial $r"
        expect_line err "[$r] to stderr $r"
    done
    [ "$(wc -l <out)" = 6 ] || fail "want 6 lines of stdout"
    [ "$(wc -l <err)" = 3 ] || fail "want 3 lines of stderr"
    ports=$(sed -n 's/.*:\([0-9]*\)$/\1/p' out | sort -u | wc -l)
    [ "$ports" = 1 ] || fail "ranks saw different MASTER_PORTs"
    ;;
interleave)
    # Two ranks pour out long lines at once: no line may mix the two.
    "$LOOM" launch -n 2 -- awk 'BEGIN { s = ""; for (i = 0; i < 700; i++) s = s "x"; for (i = 0; i < 3000; i++) print s }' >out 2>err
    rc=$?
    expect_rc 0
    good=$(grep -cE '^\[[01]\] x{700}$' out)
    [ "$good" = 6000 ] || fail "$good well-formed lines of 6000"
    [ "$(wc -l <out)" = 6000 ] || fail "stray lines"
    ;;
ok)
    "$LOOM" launch -n 3 sh -c 'exit 0' >out 2>err
    rc=$?
    expect_rc 0
    [ -s err ] && fail "unexpected stderr"
    ;;
silent_rank)
    # Rank 1 prints nothing at all, rank 0 nothing on stderr: streams that
    # end empty pass on nothing (and, under scripts/sanitize.sh, touch no
    # NULL line buffer).
    "$LOOM" launch -n 2 -- sh -c '[ "$LOOM_RANK" = 0 ] && echo "only rank 0"; exit 0' >out 2>err
    rc=$?
    expect_rc 0
    [ "$(cat out)" = "[0] only rank 0" ] || fail "want exactly rank 0's line on stdout"
    [ -s err ] && fail "unexpected stderr"
    ;;
exit3)
    "$LOOM" launch -n 4 -- sh -c 'if [ "$LOOM_RANK" = 2 ]; then echo "rank 2 fails"; exit 3; fi; sleep 30' >out 2>err
    rc=$?
    expect_rc 3
    expect_line err "loom launch: rank 2 exited with status 3; stopping ranks 0, 1, 3"
    expect_line out "[2] rank 2 fails"
    expect_fast 10
    ;;
sigkill)
    "$LOOM" launch -n 3 -- sh -c 'if [ "$LOOM_RANK" = 1 ]; then kill -9 $$; fi; sleep 30' >out 2>err
    rc=$?
    expect_rc 137
    expect_line err "loom launch: rank 1 killed by signal 9 (Killed); stopping ranks 0, 2"
    expect_fast 10
    ;;
sigterm | sigint)
    sig=TERM want=143
    [ "$CASE" = sigint ] && sig=INT want=130
    "$LOOM" launch -n 3 -- sh -c 'echo $$ >"pid.$LOOM_RANK.tmp" && mv "pid.$LOOM_RANK.tmp" "pid.$LOOM_RANK"; exec sleep 30' >out 2>err &
    launcher=$!
    n=0
    while [ ! -f pid.0 ] || [ ! -f pid.1 ] || [ ! -f pid.2 ]; do
        n=$((n + 1))
        [ $n -le 100 ] || fail "ranks did not start"
        sleep 0.1
    done
    kill -$sig $launcher
    wait $launcher
    rc=$?
    expect_rc $want
    expect_line err "loom launch: got SIG$sig; passing it on to ranks 0, 1, 2"
    for r in 0 1 2; do
        kill -0 "$(cat pid.$r)" 2>/dev/null && fail "rank $r still runs"
    done
    expect_fast 10
    ;;
timeout)
    "$LOOM" launch -n 2 --timeout 1 -- sleep 30 >out 2>err
    rc=$?
    expect_rc 124
    expect_line err "loom launch: timed out after 1 s with ranks 0, 1 still running; stopping them"
    expect_fast 10
    ;;
notfound)
    "$LOOM" launch -n 2 -- /nonexistent/program >out 2>err
    rc=$?
    expect_rc 127
    expect_line err "loom launch: cannot run '/nonexistent/program': No such file or directory"
    ;;
path)
    # A bare command name is looked up in PATH, `loom` included.
    PATH="$(dirname "$LOOM"):$PATH" "$LOOM" launch -n 2 -- loom help >out 2>err
    rc=$?
    expect_rc 0
    grep -q '^\[1\] usage: loom <command>' out || fail "loom from PATH did not run"
    ;;
bind)
    # Each rank reports the cpus it may run on (its sched_getaffinity, as
    # /proc shows it) and what the launcher told it (LOOM_BIND).
    report='echo "cpus $(sed -n "s/^Cpus_allowed_list:[[:space:]]*//p" /proc/self/status) | $LOOM_BIND"'
    all=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status)
    ncpus=$(nproc)
    # --bind core: one cpu each, different cpus while there are enough
    "$LOOM" launch -n 2 --bind core -- sh -c "$report" >out 2>err
    rc=$?
    expect_rc 0
    for r in 0 1; do
        grep -qE "^\[$r\] cpus [0-9]+ \| bound rank 0 to cpu [0-9]+, rank 1 to cpu [0-9]+" out ||
            fail "rank $r is not on one cpu, or was not told"
    done
    if [ "$ncpus" -ge 2 ]; then
        [ "$(sed -n 's/^\[[01]\] cpus \([0-9]*\) .*/\1/p' out | sort -u | wc -l)" = 2 ] ||
            fail "the two ranks share a cpu on a machine of $ncpus"
    fi
    [ -s err ] && fail "unexpected stderr"
    # the default binds the same way when the ranks fit
    "$LOOM" launch -n 1 -- sh -c "$report" >out 2>err
    rc=$?
    expect_rc 0
    grep -qE '^\[0\] cpus [0-9]+ \| bound rank 0 to cpu [0-9]+$' out || fail "-n 1 is not bound by default"
    # --bind none: the launcher's whole set
    "$LOOM" launch -n 2 --bind none -- sh -c "$report" >out 2>err
    rc=$?
    expect_rc 0
    for r in 0 1; do
        expect_line out "[$r] cpus $all | not bound (--bind none)"
    done
    # more ranks than cpus: left free by default, and said so
    n=$((ncpus + 1))
    "$LOOM" launch -n $n -- sh -c "$report" >out 2>err
    rc=$?
    expect_rc 0
    s=s; [ "$ncpus" = 1 ] && s=
    expect_line out "[0] cpus $all | not bound: $n ranks on $ncpus cpu$s (--bind core would pin them, sharing cpus)"
    # a bad value: one line
    "$LOOM" launch -n 2 --bind socket -- true >out 2>err
    rc=$?
    expect_rc 2
    [ "$(wc -l <err)" = 1 ] || fail "--bind socket wants one line"
    grep -q '^loom launch: --bind needs core (one core per rank) or none; usage: ' err || fail "--bind socket: no reason"
    ;;
usage)
    for args in "" "-n" "-n 0 true" "-n x true" "-n 2" "-n 2 --" "-x 2 true" "--timeout -1 -n 2 true" "-n 2 --timeout" "-n 2 --bind" "-n 2 --bind all true"; do
        # shellcheck disable=SC2086
        "$LOOM" launch $args >out 2>err
        rc=$?
        [ "$rc" = 2 ] || fail "'loom launch $args' exited $rc, want 2"
        [ "$(wc -l <err)" = 1 ] || fail "'loom launch $args' wants one line of usage"
        grep -q '^loom launch: .*usage: loom launch -n N' err || fail "'loom launch $args': no usage"
    done
    ;;
*)
    fail "unknown case"
    ;;
esac
echo "launch_test $CASE: ok"
