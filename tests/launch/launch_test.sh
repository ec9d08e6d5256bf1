#!/bin/sh
# Drives `loom launch` through one case and checks its exit status, its
# messages and its output. Usage: launch_test.sh LOOM CASE [SOURCE_DIR]
LOOM=$1
CASE=$2
SRC=${3:-}
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
skip() { echo "launch_test $CASE: skipped ($*)"; exit 77; }
# The cpus this test may run on, one a line.
allowed_cpus() {
    sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status | tr ',' '\n' |
        awk -F- '{ last = NF > 1 ? $2 : $1; for (c = $1; c <= last; c++) print c }'
}
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
nodes_version)
    # A launcher of another loom (version 1 of the nodes' rendezvous, which
    # had no machine in its hello) is refused, and told why.
    command -v python3 >/dev/null 2>&1 || skip "python3 plays the other launcher"
    PORT=$((12000 + $$ % 8000))
    "$LOOM" launch --timeout 60 --nnodes 2 --node-rank 0 --master "127.0.0.1:$PORT" -n 1 \
        -- sh -c 'touch ran.$LOOM_RANK' >out0 2>err0 & zero=$!
    python3 - "$PORT" >out1 <<'PY' || fail "the version 1 launcher heard no verdict"
import socket, struct, sys, time
cmd = b"sh\0-c\0touch ran.$LOOM_RANK\0"
for _ in range(200):
    try:
        s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
        break
    except OSError:
        time.sleep(0.05)
s.sendall(b"LOOMNODE" + struct.pack(">5I", 1, 1, 2, 1, len(cmd)) + cmd)
data = b""
while True:
    chunk = s.recv(4096)
    if not chunk:
        break
    data += chunk
verdict, length = struct.unpack(">2I", data[:8])
print(verdict, data[8:8 + length].decode())
PY
    wait $zero
    rc=$?
    expect_rc 78
    want="loom launch: the nodes' launchers disagree, so no rank starts: node 1 runs another loom (its launcher's rendezvous is version 1, node 0's 2); run the same loom on every node"
    expect_line err0 "$want"
    expect_line out1 "1 ${want#loom launch: }"
    ls ran.* >/dev/null 2>&1 && fail "ranks started"
    ;;
bind_nodes)
    # Two launchers on this machine as two nodes of one job, -n 1 each:
    # their ranks take the cpus in turn, node 0's first, wherever their
    # affinity masks overlap, and their local ranks count both.
    set -- $(allowed_cpus)
    [ $# -ge 2 ] || skip "two launchers on different cpus need two cpus, and this test has $#"
    a=$1 b=$2
    PORT=$((12000 + $$ % 8000))
    report='echo "local $LOOM_LOCAL_RANK/$LOOM_LOCAL_SIZE cpus $(sed -n "s/^Cpus_allowed_list:[[:space:]]*//p" /proc/self/status) | $LOOM_BIND"'
    # two_nodes "PREFIX0" "PREFIX1" [ARG]: node K's launcher started under PREFIXK
    two_nodes() {
        # shellcheck disable=SC2086
        $2 "$LOOM" launch --timeout 60 --nnodes 2 --node-rank 1 --master "127.0.0.1:$PORT" -n 1 \
            $3 -- sh -c "$report" >out1 2>err1 & one=$!
        # shellcheck disable=SC2086
        $1 "$LOOM" launch --timeout 60 --nnodes 2 --node-rank 0 --master "127.0.0.1:$PORT" -n 1 \
            $3 -- sh -c "$report" >out0 2>err0
        rc=$?
        expect_rc 0
        wait $one
        rc=$?
        expect_rc 0
    }
    # the launchers may use every cpu: one each, different ones
    two_nodes env env
    expect_line out0 "[0] local 0/2 cpus $a | bound rank 0 to cpu $a"
    expect_line out1 "[1] local 1/2 cpus $b | bound rank 1 to cpu $b"
    # both held to one cpu: two ranks do not fit it, counted across both
    two_nodes "taskset -c $a" "taskset -c $a"
    expect_line out0 "[0] local 0/2 cpus $a | not bound: 2 ranks on 1 cpu, 1 of them started by other launchers on this machine (--bind core would pin them, sharing cpus)"
    expect_line out1 "[1] local 1/2 cpus $a | not bound: 2 ranks on 1 cpu, 1 of them started by other launchers on this machine (--bind core would pin them, sharing cpus)"
    two_nodes "taskset -c $a" "taskset -c $a" "--bind core"
    expect_line out1 "[1] local 1/2 cpus $a | bound rank 1 to cpu $a (2 ranks, 1 of them other launchers' on this machine, share 1 cpu)"
    # a cpu each (as Slurm gives each task its own): each fits in its own
    two_nodes "taskset -c $a" "taskset -c $b"
    expect_line out0 "[0] local 0/2 cpus $a | bound rank 0 to cpu $a"
    expect_line out1 "[1] local 1/2 cpus $b | bound rank 1 to cpu $b"
    ;;
bind_taskset)
    # A launcher held to one cpu (taskset, a cgroup, Slurm) pins within it.
    set -- $(allowed_cpus)
    [ $# -ge 2 ] || skip "a launcher held to its second cpu needs two cpus, and this test has $#"
    report='echo "cpus $(sed -n "s/^Cpus_allowed_list:[[:space:]]*//p" /proc/self/status) | $LOOM_BIND"'
    taskset -c "$2" "$LOOM" launch -n 1 -- sh -c "$report" >out 2>err
    rc=$?
    expect_rc 0
    expect_line out "[0] cpus $2 | bound rank 0 to cpu $2"
    taskset -c "$2" "$LOOM" launch -n 2 --bind core -- sh -c "$report" >out 2>err
    rc=$?
    expect_rc 0
    expect_line out "[1] cpus $2 | bound rank 0 to cpu $2, rank 1 to cpu $2 (2 ranks share 1 cpu)"
    ;;
clean_env)
    # A rank sees loom launch's launcher variables only: not those an
    # outer srun, mpirun or torchrun left, but still the job's and the
    # user's settings.
    gone="SLURM_PROCID SLURM_NTASKS SLURM_NPROCS SLURM_STEP_ID SLURM_STEPID SLURM_LOCALID SLURM_NODEID SLURM_STEP_NUM_TASKS SLURM_STEP_NODELIST SLURM_CPU_BIND_TYPE SLURM_GTIDS PMIX_RANK PMIX_NAMESPACE PMIX_SERVER_URI41 PMI_RANK PMI_SIZE PMI_FD OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE OMPI_MCA_ess OMPI_MCA_ess_base_vpid OMPI_MCA_orte_hnp_uri OMPI_MCA_pmix RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK ROLE_RANK TORCHELASTIC_RUN_ID"
    kept="SLURM_JOB_ID=42 SLURM_JOB_NODELIST=node1 SLURM_CPUS_ON_NODE=2 PMIX_MCA_gds=hash OMPI_MCA_mpi_yield_when_idle=1 RANKING=kept"
    dirty=$kept
    for v in $gone; do dirty="$dirty $v=5"; done
    # shellcheck disable=SC2086
    env $dirty "$LOOM" launch -n 2 -- sh -c 'env; echo "as loom launch: $LOOM_RANK of $LOOM_WORLD_SIZE"' >out 2>err
    rc=$?
    expect_rc 0
    for r in 0 1; do
        for v in $gone; do
            grep -q "^\[$r\] $v=" out && fail "rank $r sees $v"
        done
        for v in $kept; do
            expect_line out "[$r] $v"
        done
        expect_line out "[$r] as loom launch: $r of 2"
    done
    [ -s err ] && fail "unexpected stderr"
    ;;
clean_env_mpi)
    # Under srun's variables (a step, a PMIx rank), Open MPI's MPI_Init in
    # a rank of loom launch aborted or saw a world of one; with the
    # environment cleaned the job trains as in a clean shell.
    CFG=$SRC/tests/zero/tiny.cfg
    DATA=$SRC/examples/data/corpus.bin
    TEST="launch_test $CASE"
    . "$SRC/tests/common/train_runs.sh"
    sets="--set comm.default=mpi --set train.steps=3 --set comm.timeout_s=60"
    # shellcheck disable=SC2086
    run clean 2 $sets
    # shellcheck disable=SC2086
    SLURM_JOB_ID=1 SLURM_NODELIST=localhost SLURM_STEP_ID=0 SLURM_STEPID=0 SLURM_PROCID=0 \
        SLURM_NTASKS=1 PMIX_RANK=0 PMIX_NAMESPACE=slurm.pmix.1.0 RANK=0 WORLD_SIZE=1 run dirty 2 $sets
    grep -i 'warn' dirty.log && fail "warnings under the outer launcher's variables"
    compare clean dirty 0 || fail "the losses differ"
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
no_restart)
    # A failure that would repeat is not restarted: a configuration error
    # (78), a command line the command cannot use (2), a command that
    # cannot run (126/127). Each run of rank 0 leaves a line in runs.
    for status in 78 2 126 127; do
        : >runs
        "$LOOM" launch -n 2 --max-restarts 3 -- sh -c "echo \$LOOM_RANK >>runs; [ \$LOOM_RANK = 0 ] && exit $status; sleep 30" >out 2>err
        rc=$?
        expect_rc $status
        [ "$(grep -cx 0 runs)" = 1 ] || fail "status $status: rank 0 ran $(grep -cx 0 runs) times, want once"
        grep -q 'restart 1 of' err && fail "status $status was restarted"
        grep -qx "loom launch: not restarting: rank 0 exited with status $status (.*, which a restart would repeat)" err ||
            fail "status $status: no reason not to restart"
    done
    expect_line err "loom launch: not restarting: rank 0 exited with status 127 (a command that was not found, which a restart would repeat)"
    # a command not found by the launcher itself
    "$LOOM" launch -n 1 --max-restarts 2 -- /nonexistent/program >out 2>err
    rc=$?
    expect_rc 127
    expect_line err "loom launch: not restarting: rank 0 exited with status 127 (a command that was not found, which a restart would repeat)"
    [ "$(grep -c "cannot run '/nonexistent/program'" err)" = 1 ] || fail "the launcher tried the missing command more than once"
    # any other failure is restarted
    : >runs
    "$LOOM" launch -n 1 --max-restarts 2 -- sh -c 'echo x >>runs; exit 3' >out 2>err
    rc=$?
    expect_rc 3
    [ "$(wc -l <runs)" = 3 ] || fail "status 3: ran $(wc -l <runs) times, want 3 (two restarts)"
    grep -q 'not restarting' err && fail "status 3 was not restarted"
    ;;
train_config)
    # loom train exits 78 for what it was given, before it trains, and the
    # launcher does not restart it
    CFG=$SRC/tests/train/tiny.cfg
    DATA=$SRC/examples/data/corpus.bin
    "$LOOM" train "$CFG" --set model.foo=1 >out 2>err
    rc=$?
    expect_rc 78
    grep -q '^loom train: --set model.foo=1: model.foo: unknown setting' err || fail "no unknown setting"
    "$LOOM" train "$DIR/missing.cfg" >out 2>err
    rc=$?
    expect_rc 78
    "$LOOM" train "$CFG" --set data.train="$DATA" --set comm.default=nosuch >out 2>err
    rc=$?
    expect_rc 78
    grep -q "comm.default: plugin comm 'nosuch' not found" err || fail "no plugin not found"
    "$LOOM" train "$CFG" --set data.train="$DIR/missing.bin" >out 2>err
    rc=$?
    expect_rc 78
    "$LOOM" train "$CFG" --set data.train="$DATA" --set train.steps=2 --set train.checkpoint_every=1 \
        --set train.checkpoint_dir=/proc/loom-refused >out 2>err
    rc=$?
    expect_rc 78
    grep -q 'train.checkpoint_dir' err || fail "no refused checkpoint directory"
    # a usage error stays 2
    "$LOOM" train >out 2>err
    rc=$?
    expect_rc 2
    "$LOOM" launch -n 1 --max-restarts 3 -- "$LOOM" train "$CFG" --set model.foo=1 >out 2>err
    rc=$?
    expect_rc 78
    expect_line err "loom launch: not restarting: rank 0 exited with status 78 (a configuration error, which a restart would repeat)"
    [ "$(grep -c 'unknown setting' err)" = 1 ] || fail "loom train ran more than once"
    ;;
limits)
    # -n is weighed against the open files and processes allowed before
    # any rank starts: no rank may run (each would leave ran.RANK)
    (ulimit -n 64 && exec "$LOOM" launch -n 40 -- sh -c 'touch ran.$LOOM_RANK') >out 2>err
    rc=$?
    expect_rc 78
    [ "$(wc -l <err)" = 1 ] || fail "-n 40 under ulimit -n 64 wants one line"
    grep -qx 'loom launch: -n 40 needs [0-9]* open files in the launcher (two pipes per rank) and its limit is 64; raise it (ulimit -n [0-9]*) or start fewer ranks' err ||
        fail "no open files refusal"
    (ulimit -n 1024 && exec "$LOOM" launch -n 100000 -- sh -c 'touch ran.$LOOM_RANK') >out 2>err
    rc=$?
    expect_rc 78
    grep -q '^loom launch: -n 100000 needs 2000[0-9][0-9] open files' err || fail "no refusal of -n 100000"
    ls ran.* >/dev/null 2>&1 && fail "ranks started"
    # what fits runs
    (ulimit -n 64 && exec "$LOOM" launch -n 8 -- sh -c 'touch ran.$LOOM_RANK') >out 2>err
    rc=$?
    expect_rc 0
    [ "$(ls ran.* | wc -l)" = 8 ] || fail "-n 8 under ulimit -n 64 did not run 8 ranks"
    rm -f ran.*
    # processes: RLIMIT_NPROC binds a user other than root, so as one
    # (sh's ulimit may not know -u: prlimit sets it)
    as_user=""
    [ "$(id -u)" = 0 ] && as_user="setpriv --reuid=65534 --regid=65534 --clear-groups"
    if ! command -v prlimit >/dev/null || { [ -n "$as_user" ] && ! command -v setpriv >/dev/null; }; then
        echo "launch_test $CASE: ok (without prlimit or setpriv: processes not checked)"
        exit 0
    fi
    # (one thread for OpenBLAS, which would start its own at load)
    # shellcheck disable=SC2086
    (cd / && OPENBLAS_NUM_THREADS=1 exec prlimit --nproc=2 $as_user "$LOOM" launch -n 4 -- true) >out 2>err
    rc=$?
    expect_rc 78
    grep -qx 'loom launch: -n 4 needs 4 more processes, and this user may run 2 and runs [0-9]* already; raise the limit (ulimit -u [0-9]*) or start fewer ranks' err ||
        fail "no processes refusal"
    ;;
flight_early)
    # --flight FILE is checked before any rank starts
    "$LOOM" launch -n 2 --flight "$DIR/missing/flight.txt" -- sh -c 'touch ran.$LOOM_RANK' >out 2>err
    rc=$?
    expect_rc 78
    expect_line err "loom launch: --flight $DIR/missing/flight.txt: cannot write it: No such file or directory (name a file in a folder that exists and that you may write to)"
    [ "$(wc -l <err)" = 1 ] || fail "want one line"
    ls ran.* >/dev/null 2>&1 && fail "ranks started"
    "$LOOM" launch -n 1 --flight "$DIR" -- true >out 2>err
    rc=$?
    expect_rc 78
    grep -q "^loom launch: --flight $DIR: cannot write it: Is a directory" err || fail "a folder as --flight"
    # a good one is not left behind when nothing was reported
    "$LOOM" launch -n 1 --flight flight.txt -- true >out 2>err
    rc=$?
    expect_rc 0
    [ -e flight.txt ] && fail "the check left flight.txt"
    ;;
stale_tmpdir)
    # The next launcher removes the TMPDIR of a launcher killed with
    # SIGKILL, and nothing of a launcher that runs, of another user or of
    # another pid namespace.
    mkdir tmp
    export TMPDIR="$DIR/tmp"
    wait_for() { # wait_for COUNT: until tmp holds COUNT folders
        n=0
        while [ "$(ls tmp | wc -l)" != "$1" ]; do
            n=$((n + 1))
            [ $n -le 200 ] || fail "tmp does not hold $1 folders: $(ls tmp)"
            sleep 0.05
        done
    }
    "$LOOM" launch -n 1 -- sleep 30 >out 2>err &
    live=$!
    wait_for 1
    live_dir=$(ls tmp)
    "$LOOM" launch -n 2 -- sleep 30 >out 2>err &
    killed=$!
    wait_for 2
    killed_dir=$(ls tmp | grep -v "^$live_dir\$")
    kill -9 $killed
    wait $killed 2>/dev/null
    ns=$(stat -Lc %i /proc/self/ns/pid)
    gone=$(sh -c 'echo $$')
    # this shell runs, but started at another time: its pid was reused
    mkdir "tmp/loom-launch-$ns-$$-1-reused" "tmp/loom-launch-$ns-$gone-1-gone"
    mkdir "tmp/loom-launch-$((ns + 1))-$gone-1-elsewhere" "tmp/loom-launch-unsigned"
    if [ "$(id -u)" = 0 ]; then
        mkdir "tmp/loom-launch-$ns-$gone-1-theirs"
        chown 65534 "tmp/loom-launch-$ns-$gone-1-theirs"
    fi
    "$LOOM" launch -n 1 -- true >out 2>err
    rc=$?
    expect_rc 0
    [ -e "tmp/$killed_dir" ] && fail "the killed launcher's $killed_dir is still there"
    [ -e "tmp/$live_dir" ] || fail "the running launcher's $live_dir was removed"
    [ -e "tmp/loom-launch-$ns-$$-1-reused" ] && fail "a folder of a reused pid is still there"
    [ -e "tmp/loom-launch-$ns-$gone-1-gone" ] && fail "a folder of a gone launcher is still there"
    [ -e "tmp/loom-launch-$((ns + 1))-$gone-1-elsewhere" ] || fail "another pid namespace's folder was removed"
    [ -e "tmp/loom-launch-unsigned" ] || fail "an unsigned folder was removed"
    if [ "$(id -u)" = 0 ]; then
        [ -e "tmp/loom-launch-$ns-$gone-1-theirs" ] || fail "another user's folder was removed"
    fi
    kill $live
    wait $live
    [ -e "tmp/$live_dir" ] && fail "the launcher did not remove its own $live_dir"
    ;;
nodes_agree | nodes_differ)
    # Two nodes' launchers on this machine: they start ranks only when
    # they agree on the job, and otherwise both refuse with the same line.
    # below the stores' ports (20000-31999) and the kernel's ephemeral ones
    PORT=$((12000 + $$ % 8000))
    node() { # node K N ARG: node K's launcher of -n N, the command ending in ARG
        "$LOOM" launch --timeout 60 --nnodes 2 --node-rank "$1" --master "127.0.0.1:$PORT" -n "$2" \
            -- sh -c 'touch ran.$LOOM_RANK; echo "rank $LOOM_RANK of $LOOM_WORLD_SIZE"' "$3" >"out$1" 2>"err$1"
    }
    if [ "$CASE" = nodes_agree ]; then
        node 1 2 same & one=$!
        node 0 2 same
        rc=$?
        expect_rc 0
        wait $one
        rc=$?
        expect_rc 0
        expect_line out0 "[1] rank 1 of 4"
        expect_line out1 "[3] rank 3 of 4"
        [ "$(ls ran.* | wc -l)" = 4 ] || fail "not every rank ran"
    else
        node 1 2 theirs & one=$!
        node 0 2 mine
        rc=$?
        expect_rc 78
        wait $one
        rc=$?
        expect_rc 78
        want="loom launch: the nodes' launchers disagree, so no rank starts: node 1's command differs from node 0's at argument 4: 'theirs' on node 1, 'mine' on node 0; give every node's launcher the same -n, --nnodes and command"
        expect_line err0 "$want"
        expect_line err1 "$want"
        # -n too
        node 0 2 same & zero=$!
        node 1 3 same
        rc=$?
        expect_rc 78
        wait $zero
        rc=$?
        expect_rc 78
        expect_line err1 "loom launch: the nodes' launchers disagree, so no rank starts: node 1 starts -n 3 ranks and node 0 -n 2; give every node's launcher the same -n, --nnodes and command"
        ls ran.* >/dev/null 2>&1 && fail "ranks started"
    fi
    ;;
nodes_missing | nodes_twice)
    # Node 0's launcher refuses when a node does not join in time, or when
    # two launchers join as the same node or as one its job does not have.
    PORT=$((12000 + $$ % 8000))
    node() { # node K M: node K's launcher of --nnodes M
        "$LOOM" launch --timeout "$3" --nnodes "$2" --node-rank "$1" --master "127.0.0.1:$PORT" \
            -n 1 -- sh -c 'touch ran.$LOOM_RANK' >"out$1" 2>"err$1"
    }
    if [ "$CASE" = nodes_missing ]; then
        node 0 2 1
        rc=$?
        expect_rc 1
        expect_line err0 "loom launch: node 0 waited 1 s at 127.0.0.1:$PORT for node 1 to join, and starts no rank (start their loom launch with --master 127.0.0.1:$PORT)"
    else
        want="loom launch: the nodes' launchers disagree, so no rank starts: two launchers joined node 0 as node 1; give each node's launcher its own --node-rank; give every node's launcher the same -n, --nnodes and command"
        node 1 3 60 & one=$!
        "$LOOM" launch --timeout 60 --nnodes 3 --node-rank 1 --master "127.0.0.1:$PORT" -n 1 \
            -- sh -c 'touch ran.$LOOM_RANK' >out_twice 2>err_twice & twice=$!
        node 0 3 60
        rc=$?
        expect_rc 78
        expect_line err0 "$want"
        for pid in $one $twice; do
            wait $pid
            rc=$?
            expect_rc 78
        done
        expect_line err1 "$want"
        expect_line err_twice "$want"
        # a node that node 0's job does not have
        node 3 4 60 & three=$!
        node 0 2 60
        rc=$?
        expect_rc 78
        expect_line err0 "loom launch: the nodes' launchers disagree, so no rank starts: a launcher joined node 0 as node 3 of --nnodes 4, and node 0 runs a job of --nnodes 2; give every node's launcher the same -n, --nnodes and command"
        wait $three
        rc=$?
        expect_rc 78
        expect_line err3 "loom launch: the nodes' launchers disagree, so no rank starts: a launcher joined node 0 as node 3 of --nnodes 4, and node 0 runs a job of --nnodes 2; give every node's launcher the same -n, --nnodes and command"
    fi
    ls ran.* >/dev/null 2>&1 && fail "ranks started"
    ;;
*)
    fail "unknown case"
    ;;
esac
echo "launch_test $CASE: ok"
