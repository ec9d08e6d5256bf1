#!/bin/sh
# loom under a real Slurm: a private cluster (cluster.sh: one node, or two
# on network namespaces) under this test's scratch folder, and one way of
# starting the ranks per MODE, each held to the losses of the same job
# under loom launch.
#   usage: slurm_test.sh LOOM SOURCE_DIR MODE
#   srun        srun -n 2 loom train over comm-ucx and auto; the header names Slurm
#   overcommit  srun -n 4 --overcommit: 4 ranks on 2 cpus
#   sbatch      sbatch of docs/slurm.md's job script
#   pmix        srun --mpi=pmix -n 2 over comm-mpi
#   mpi_plain   srun -n 2 over comm-mpi without --mpi=pmix: trains, or one
#               line saying --mpi=pmix; never an Open MPI abort
#   launch      srun -N1 -n1 loom launch -n 2, over comm-ucx and comm-mpi
#   kill        a task killed with SIGKILL: the other names it and srun ends
#               within comm.timeout_s + 10 s
#   refuse      loom train in a salloc shell or an sbatch script without
#               srun fails at once, pointing at srun
#   conflict    torchrun's RANK=1 WORLD_SIZE=2 inside a one-task step: a
#               warning naming both launchers' variables
#   mpirun      mpirun -np 2 inside an sbatch script, over comm-mpi and
#               comm-ucx: Open MPI's ranks, and the batch step's Slurm
#               variables are no conflict (no warning)
#   twonode     a two-node cluster (two network namespaces): srun -N2 -n4
#               loom train, and srun -N2 --ntasks-per-node=1 loom launch -n 2
#               taking --nnodes, --node-rank and --master from Slurm, over
#               comm-ucx and comm-mpi, srun --mpi=pmix -N2 -n4 over comm-mpi;
#               the two launchers bind their ranks to different cpus
set -eu
LOOM=$1
SRC=$2
MODE=$3
CFG=$SRC/tests/zero/tiny.cfg
DATA=$SRC/examples/data/corpus.bin
TEST="slurm.$MODE"
TMP=$(mktemp -d)
. "$SRC/tests/slurm/cluster.sh"
cleanup() {
    slurm_down "$TMP/cluster"
    rm -rf "$TMP"
}
trap cleanup EXIT
cd "$TMP"
. "$SRC/tests/common/train_runs.sh"
fail() { echo "$TEST: $*"; exit 1; }
skip() { echo "$TEST: skipped ($*)"; exit 77; }
show() { echo "--- $1"; cat "$1"; }

[ "$(id -u)" = 0 ] || skip "a private Slurm cluster needs root for munged, slurmctld and slurmd"
for program in munged slurmctld slurmd srun sbatch salloc; do
    command -v "$program" > /dev/null 2>&1 || [ -x "/usr/sbin/$program" ] ||
        skip "$program is not installed (scripts/setup.sh installs slurm-wlm and munge)"
done
NODES=1
[ "$MODE" = twonode ] && NODES=2
slurm_up "$TMP/cluster" "$NODES" ||
    skip "the Slurm cluster did not start; the reason and the end of its logs are above"

# every rank single-threaded: 2 cores for up to 4 ranks
export OMP_NUM_THREADS=1
SETS="--set train.steps=6 --set comm.timeout_s=30"

# has FILE PATTERN WHAT: FILE has a line matching PATTERN, or the test
# fails saying WHAT is missing; lacks FILE PATTERN WHAT: the opposite
has() { grep -q -- "$2" "$1" || { show "$1"; fail "$3"; }; }
lacks() { ! grep -q -- "$2" "$1" || { show "$1"; fail "$3"; }; }

# srun_train NAME RANKS "SRUN OPTIONS" [--set ...]: srun -n RANKS loom train
# as a dp group of RANKS; rank 0's metrics in NAME.jsonl, everything said in
# NAME.log. LOOM_OPTS: loom's own options (-v).
srun_train() {
    st_name=$1; st_ranks=$2; st_opts=$3; shift 3
    # shellcheck disable=SC2086
    timeout 120 srun $st_opts -n "$st_ranks" "$LOOM" ${LOOM_OPTS:-} train "$CFG" \
        --set data.train="$DATA" --set parallel.dp.size="$st_ranks" \
        --metrics "$st_name.jsonl" "$@" > "$st_name.log" 2>&1 ||
        { show "$st_name.log"; fail "srun $st_opts -n $st_ranks failed"; }
}

# elapsed_since T0: whole seconds since T0 (date +%s)
elapsed_since() { echo $(($(date +%s) - $1)); }

case $MODE in
srun)
    # shellcheck disable=SC2086
    run ref 2 $SETS --set comm.default=ucx
    # shellcheck disable=SC2086
    LOOM_OPTS=-v srun_train ucx 2 "" $SETS --set comm.default=ucx
    compare ref ucx 1e-6
    # shellcheck disable=SC2086
    srun_train auto 2 "" $SETS --set comm.default=auto
    compare ref auto 1e-6
    has ucx.log "launch environment: SLURM" "loom -v train does not say 'launch environment: SLURM'"
    has ucx.log "^ranks: 2 from Slurm (SLURM_PROCID)" "the header does not name Slurm as the source"
    ;;
overcommit)
    # shellcheck disable=SC2086
    run ref 4 $SETS --set comm.default=ucx
    # shellcheck disable=SC2086
    srun_train over 4 --overcommit $SETS --set comm.default=ucx
    compare ref over 1e-6
    has over.log "^ranks: 4 from Slurm (SLURM_PROCID)" "not 4 ranks from Slurm"
    ;;
sbatch)
    # docs/slurm.md's job script as written, with `loom` and train.cfg
    # standing for this build's program and the tiny model
    awk '/<!-- job script -->/ { mark = 1; next }
         mark && /^```/ { if (inside) exit; inside = 1; next }
         inside { print }' "$SRC/docs/slurm.md" > job.sh
    has job.sh "^srun " "docs/slurm.md has no job script with an srun line after its marker"
    mkdir bin
    ln -s "$LOOM" bin/loom
    cp "$CFG" train.cfg
    echo "data = { train = \"$DATA\"; };" >> train.cfg
    CFG=$TMP/train.cfg
    run ref 2 --set comm.default=ucx
    PATH=$TMP/bin:$PATH slurm_batch job.sh > sbatch.log 2>&1 ||
        { show sbatch.log; cat loom-*.out; fail "sbatch job.sh failed"; }
    cat loom-*.out > job.log
    [ -f metrics.jsonl ] || { show job.log; fail "the job script wrote no metrics.jsonl"; }
    compare ref metrics 1e-6
    has job.log "^ranks: 2 from Slurm (SLURM_PROCID)" "not 2 ranks from Slurm"
    ;;
mpirun)
    for comm in mpi ucx; do
        # shellcheck disable=SC2086
        run "ref$comm" 2 $SETS --set comm.default=$comm
        cat > "mpirun$comm.sh" << EOF
#!/bin/sh
exec mpirun -np 2 "$LOOM" train "$CFG" --set data.train="$DATA" --set parallel.dp.size=2 \\
    $SETS --set comm.default=$comm --metrics "$TMP/mpirun$comm.jsonl"
EOF
        slurm_batch -n 2 -o "$TMP/mpirun$comm.log" "mpirun$comm.sh" > "sbatch$comm.log" 2>&1 ||
            { show "sbatch$comm.log"; show "mpirun$comm.log"; fail "mpirun in sbatch over $comm failed"; }
        compare "ref$comm" "mpirun$comm" 1e-6
        has "mpirun$comm.log" "^ranks: 2 from Open MPI (OMPI_COMM_WORLD_RANK)" \
            "the header does not name Open MPI as the source"
        lacks "mpirun$comm.log" "warning: bootstrap" \
            "the batch step's Slurm variables were taken for a conflict"
    done
    ;;
pmix)
    srun --mpi=list > mpi.txt 2>&1 || true
    grep -q pmix mpi.txt || { cat mpi.txt; skip "this Slurm has no PMIx plugin (srun --mpi=list)"; }
    # shellcheck disable=SC2086
    run ref 2 $SETS --set comm.default=mpi
    # shellcheck disable=SC2086
    srun_train pmix 2 --mpi=pmix $SETS --set comm.default=mpi
    compare ref pmix 1e-6
    ;;
mpi_plain)
    # shellcheck disable=SC2086
    run ref 2 $SETS --set comm.default=mpi
    # shellcheck disable=SC2086
    if timeout 120 srun -n 2 "$LOOM" train "$CFG" --set data.train="$DATA" \
        --set parallel.dp.size=2 $SETS --set comm.default=mpi --metrics plain.jsonl \
        > plain.log 2>&1; then
        compare ref plain 1e-6
    else
        has plain.log "--mpi=pmix" "plain srun over comm-mpi failed without saying --mpi=pmix"
        echo "$TEST: refused, saying: $(grep -- "--mpi=pmix" plain.log | head -n 1)"
    fi
    lacks plain.log "MPI_ERRORS_ARE_FATAL" "Open MPI aborted under plain srun"
    lacks plain.log "OMPI was not built" "Open MPI aborted under plain srun"
    ;;
launch)
    for comm in ucx mpi; do
        # shellcheck disable=SC2086
        run "ref$comm" 2 $SETS --set comm.default=$comm
        # shellcheck disable=SC2086
        timeout 120 srun -N1 -n1 "$LOOM" launch -n 2 -- "$LOOM" train "$CFG" \
            --set data.train="$DATA" --set parallel.dp.size=2 $SETS --set comm.default=$comm \
            --metrics "$comm.jsonl" > "$comm.log" 2>&1 ||
            { show "$comm.log"; fail "srun -N1 -n1 loom launch -n 2 over $comm failed"; }
        compare "ref$comm" "$comm" 1e-6
        # loom launch gives its ranks an environment of their own: the
        # step's one-task Slurm variables must not reach them
        lacks "$comm.log" "warning: bootstrap" "loom launch's ranks saw the Slurm step's variables"
    done
    # one loom launch per node: two on one node is refused before any rank starts
    t0=$(date +%s)
    ! timeout 60 srun -n 2 "$LOOM" launch -n 1 -- "$LOOM" train "$CFG" --set data.train="$DATA" \
        > twice.log 2>&1 || { show twice.log; fail "two copies of loom launch on one node ran"; }
    took=$(elapsed_since "$t0")
    has twice.log "loom launch: .*once per node" "no line saying loom launch runs once per node"
    [ "$took" -le 10 ] || fail "two copies of loom launch on one node took $took s to be refused"
    ;;
kill)
    for comm in ucx mpi; do
        log=kill$comm.log
        # each task writes its pid, then becomes loom train
        # shellcheck disable=SC2016
        timeout 120 srun -n 2 sh -c 'echo $$ > pid.$SLURM_PROCID; exec "$0" "$@"' \
            "$LOOM" train "$CFG" --set data.train="$DATA" --set parallel.dp.size=2 \
            --set train.steps=1000000 --set comm.timeout_s=10 --set comm.default="$comm" \
            > "$log" 2>&1 &
        step=$!
        n=0
        until grep -q "step  *3/" "$log" 2> /dev/null && [ -s pid.1 ]; do
            [ "$n" -lt 300 ] || { show "$log"; fail "the $comm run did not reach step 3"; }
            sleep 0.1
            n=$((n + 1))
        done
        t0=$(date +%s)
        kill -9 "$(cat pid.1)"
        rc=0
        wait "$step" || rc=$?
        took=$(elapsed_since "$t0")
        echo "$TEST: $comm: srun ended $took s after rank 1 was killed" \
            "(comm.timeout_s = 10), status $rc"
        [ "$rc" != 0 ] || { show "$log"; fail "srun succeeded although rank 1 was killed"; }
        if [ "$rc" = 124 ] || [ "$took" -gt 20 ]; then
            show "$log"
            fail "$comm: srun took $took s to end after rank 1 was killed"
        fi
        # rank 0's words, not srun's or rank 1's own
        grep -v -e "^srun:" -e "^\[rank 1\]" "$log" > rank0.log
        has rank0.log "rank 1\([^0-9]\|$\)" "$comm: rank 0 does not name rank 1"
        # UCX's complaint about the send the dead rank never took is noise
        lacks "$log" "was not returned to mpool" "$comm: UCX's request-leak warning is shown"
        # the user hears about ranks, not about loom's bootstrap store
        ! grep -qiw store rank0.log ||
            { show "$log"; fail "$comm: a killed task is reported in terms of the store"; }
        rm -f pid.0 pid.1
    done
    ;;
refuse)
    # the allocation's shell: SLURM_NTASKS=2 but no step
    t0=$(date +%s)
    ! timeout 60 salloc -n 2 "$LOOM" train "$CFG" --set data.train="$DATA" \
        --set parallel.dp.size=2 > salloc.log 2>&1 ||
        { show salloc.log; fail "loom train in a salloc shell succeeded"; }
    took=$(elapsed_since "$t0")
    has salloc.log "^loom train: .*srun" "salloc: no line from loom train saying srun"
    [ "$took" -le 10 ] || { show salloc.log; fail "salloc: refused only after $took s"; }
    # a batch script: SLURM_PROCID=0 of SLURM_NTASKS=2, no step either; it
    # times loom train itself (the job's queueing is not loom's)
    cat > nosrun.sh << EOF
#!/bin/sh
t0=\$(date +%s)
"$LOOM" train "$CFG" --set data.train="$DATA" --set parallel.dp.size=2 && exit 0
echo "took \$((\$(date +%s) - t0)) s"
exit 3
EOF
    ! slurm_batch -n 2 -o nosrun.out nosrun.sh > sbatch.log 2>&1 ||
        { show nosrun.out; fail "loom train in a batch script without srun succeeded"; }
    has nosrun.out "^loom train: .*srun" "sbatch: no line from loom train saying srun"
    took=$(sed -n 's/^took \([0-9]*\) s$/\1/p' nosrun.out)
    [ "${took:-99}" -le 10 ] || { show nosrun.out; fail "sbatch: refused only after ${took:-?} s"; }
    ;;
conflict)
    RANK=1 WORLD_SIZE=2 timeout 60 srun -n 1 "$LOOM" train "$CFG" --set data.train="$DATA" \
        --set train.steps=2 --metrics one.jsonl > conflict.log 2>&1 ||
        { show conflict.log; fail "a one-task step with RANK=1 WORLD_SIZE=2 set failed"; }
    has conflict.log "warning: .*SLURM_PROCID.*[^_A-Z]RANK=1" \
        "no warning naming both SLURM_PROCID and RANK"
    has conflict.log "^ranks: 1 from Slurm (SLURM_PROCID)" "Slurm's rank was not the one used"
    ;;
twonode)
    # srun, sinfo and the others run on the first node ($SLURM_ON_FIRST)
    for comm in ucx mpi; do
        # shellcheck disable=SC2086
        run "ref$comm" 4 $SETS --set comm.default=$comm
        # shellcheck disable=SC2086
        $SLURM_ON_FIRST timeout 120 srun -N2 --ntasks-per-node=2 "$LOOM" train "$CFG" \
            --set data.train="$DATA" --set parallel.dp.size=4 $SETS --set comm.default=$comm \
            --metrics "srun$comm.jsonl" > "srun$comm.log" 2>&1 ||
            { show "srun$comm.log"; fail "srun -N2 -n4 over $comm failed"; }
        compare "ref$comm" "srun$comm" 1e-6
        has "srun$comm.log" "^ranks: 4 from Slurm (SLURM_PROCID)" "not 4 ranks from Slurm"
        # shellcheck disable=SC2086
        $SLURM_ON_FIRST timeout 120 srun -N2 --ntasks-per-node=1 "$LOOM" launch -v -n 2 -- \
            "$LOOM" train "$CFG" --set data.train="$DATA" --set parallel.dp.size=4 $SETS \
            --set comm.default=$comm --metrics "launch$comm.jsonl" > "launch$comm.log" 2>&1 ||
            { show "launch$comm.log"; fail "srun -N2 loom launch -n 2 over $comm failed"; }
        compare "ref$comm" "launch$comm" 1e-6
        for node in 0 1; do
            derived="--nnodes 2 --node-rank $node --master [0-9.]*\.1:[0-9]*$"
            has "launch$comm.log" "^loom launch: from Slurm: $derived" \
                "node $node's loom launch did not take its flags from Slurm"
        done
    done
    # Open MPI's own world across the nodes, from Slurm's PMIx
    if $SLURM_ON_FIRST srun --mpi=list 2>&1 | grep -q pmix; then
        # shellcheck disable=SC2086
        $SLURM_ON_FIRST timeout 120 srun --mpi=pmix -N2 --ntasks-per-node=2 "$LOOM" train \
            "$CFG" --set data.train="$DATA" --set parallel.dp.size=4 $SETS \
            --set comm.default=mpi --metrics pmix.jsonl > pmix.log 2>&1 ||
            { show pmix.log; fail "srun --mpi=pmix -N2 -n4 over mpi failed"; }
        compare refmpi pmix 1e-6
    else
        echo "$TEST: srun --mpi=pmix not checked: this Slurm has no PMIx plugin"
    fi
    # one rank per launcher, two launchers on one machine: their own cpus each
    if [ "$(nproc)" -ge 2 ]; then
        $SLURM_ON_FIRST timeout 120 srun -N2 --ntasks-per-node=1 "$LOOM" launch -v -n 1 -- \
            "$LOOM" train "$CFG" --set data.train="$DATA" --set parallel.dp.size=2 \
            --set train.steps=2 --set comm.default=ucx > bind.log 2>&1 ||
            { show bind.log; fail "srun -N2 loom launch -n 1 failed"; }
        cpus=$(sed -n 's/^loom launch: bound rank [01] to cpu \([0-9]*\)$/\1/p' bind.log | sort -u)
        [ "$(echo "$cpus" | wc -w)" = 2 ] ||
            { show bind.log; fail "the two launchers did not bind their ranks to two cpus"; }
    fi
    ;;
*)
    fail "unknown mode $MODE"
    ;;
esac
echo "$TEST: ok"
