# A private Slurm cluster under one folder, for the tests (sourced).
#   . tests/slurm/cluster.sh
#   slurm_up DIR [2] munged, slurmctld and slurmd, all of their state, logs,
#                    sockets and pid files under DIR; ports free at the time;
#                    exports SLURM_CONF so srun, sbatch, salloc, sinfo,
#                    squeue and scontrol talk to this cluster. Non-zero, with
#                    the reason on stderr, when it cannot start.
#                    With 2: two nodes, two network namespaces joined by a
#                    veth pair (10.214.K.1 and 10.214.K.2, the node names),
#                    each slurmd in an IPC namespace of its own; slurmctld
#                    runs on the first, and the clients must too: run them
#                    as $SLURM_ON_FIRST srun ... (empty for one node).
#   slurm_batch [SBATCH OPTIONS] SCRIPT
#                    sbatch SCRIPT and wait for the job to end.
#   slurm_down DIR   cancels every job and stops what slurm_up started; safe
#                    to call after a failed or partial slurm_up, and twice.
# The system's /etc/slurm and /etc/munge are never read or touched. The
# daemons need root (slurmd starts each task as the job's user).

# slurm_free_port: a TCP port nobody listens on now
slurm_free_port() {
    if command -v python3 > /dev/null 2>&1; then
        python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])'
    else
        # no python: a port from a pid-dependent range, tried until unused
        slurm_port=$((30000 + ($$ * 7 + ${1:-0} * 13) % 20000))
        while ss -Htln "sport = :$slurm_port" 2>/dev/null | grep -q .; do
            slurm_port=$((slurm_port + 1))
        done
        echo "$slurm_port"
    fi
}

# slurm_logs DIR: the end of each daemon's log, to explain a failed start
slurm_logs() {
    for slurm_log in "$1/munged.log" "$1/slurmctld.log" "$1"/slurmd-*.log; do
        [ -f "$slurm_log" ] || continue
        echo "--- $slurm_log (last lines)" >&2
        tail -n 15 "$slurm_log" >&2
    done
}

slurm_fail() {
    echo "slurm_up: $*" >&2
    slurm_logs "$SLURM_DIR"
    return 1
}

# slurm_on NODE_NS COMMAND...: COMMAND in the network namespace NODE_NS
# (as is, when NODE_NS is empty). nsenter, not ip netns exec, which would
# remount /sys without the cgroups slurmd looks for.
slurm_on() {
    slurm_ns=$1
    shift
    if [ -n "$slurm_ns" ]; then
        nsenter --net="/var/run/netns/$slurm_ns" "$@"
    else
        "$@"
    fi
}

# slurm_node_start NODE_NS CGROUP_DIR COMMAND...: COMMAND (slurmd) as a
# node of its own: in the network namespace NODE_NS and in IPC and mount
# namespaces of its own, as on another machine, with a /sys that lists the
# node's network interfaces (UCX finds its devices there) and still has the
# machine's cgroups (slurmd will not start without them), moved there
# through CGROUP_DIR; a /dev/shm of its own (Open MPI names its
# shared-memory files by host name, and both nodes are this host); and a
# PMIx client folder of its own (CGROUP_DIR.pmix mounted on DIR/pmix).
# Just COMMAND when NODE_NS is empty.
slurm_node_start() {
    slurm_ns=$1
    slurm_cg=$2
    shift 2
    [ -n "$slurm_ns" ] || { "$@"; return; }
    # shellcheck disable=SC2016
    slurm_on "$slurm_ns" unshare --ipc --mount sh -c 'mount --make-rprivate / &&
        mkdir -p "$0" "$0.pmix" && mount --bind "$0.pmix" "$1" &&
        mount --rbind /sys/fs/cgroup "$0" && mount -t sysfs sysfs /sys &&
        mount --move "$0" /sys/fs/cgroup && mount -t tmpfs -o mode=1777 tmpfs /dev/shm &&
        shift && exec "$@"' "$slurm_cg" "$SLURM_DIR/pmix" "$@"
}

# slurm_netns DIR: two network namespaces, their names in DIR/netns (for
# slurm_down) and in slurm_ns1 and slurm_ns2, their addresses
# $slurm_net.1 and $slurm_net.2
slurm_netns() {
    if ! command -v ip > /dev/null 2>&1 || ! command -v nsenter > /dev/null 2>&1; then
        echo "slurm_up: two nodes need ip (iproute2) and nsenter" >&2
        return 1
    fi
    slurm_ns1=lsa$$ slurm_ns2=lsb$$
    slurm_net=10.214.$(($$ % 200 + 20))
    ip netns add "$slurm_ns1" 2> /dev/null ||
        { echo "slurm_up: cannot make a network namespace (ip netns add)" >&2; return 1; }
    echo "$slurm_ns1" > "$1/netns"
    ip netns add "$slurm_ns2" || return 1
    echo "$slurm_ns2" >> "$1/netns"
    ip link add "v$slurm_ns1" type veth peer name "v$slurm_ns2" || return 1
    ip link set "v$slurm_ns1" netns "$slurm_ns1"
    ip link set "v$slurm_ns2" netns "$slurm_ns2"
    ip -n "$slurm_ns1" addr add "$slurm_net.1/24" dev "v$slurm_ns1"
    ip -n "$slurm_ns2" addr add "$slurm_net.2/24" dev "v$slurm_ns2"
    for slurm_ns in "$slurm_ns1" "$slurm_ns2"; do
        ip -n "$slurm_ns" link set lo up
        ip -n "$slurm_ns" link set "v$slurm_ns" up || return 1
    done
}

slurm_up() {
    SLURM_DIR=$1
    slurm_nodes=${2:-1}
    [ "$(id -u)" = 0 ] || { echo "slurm_up: the Slurm and munge daemons need root" >&2; return 1; }
    for slurm_bin in munged slurmctld slurmd srun sbatch salloc sinfo scontrol scancel; do
        command -v "$slurm_bin" > /dev/null 2>&1 || PATH=$PATH:/usr/sbin
        if ! command -v "$slurm_bin" > /dev/null 2>&1; then
            echo "slurm_up: $slurm_bin is not installed" \
                "(scripts/setup.sh installs slurm-wlm and munge)" >&2
            return 1
        fi
    done
    mkdir -p "$SLURM_DIR/state" || return 1
    # munged refuses a key or socket folder others can write to
    chmod 700 "$SLURM_DIR" "$SLURM_DIR/state"

    slurm_host=$(hostname -s)
    slurm_cpus=$(nproc)
    SLURM_ON_FIRST=""
    if [ "$slurm_nodes" = 2 ]; then
        slurm_netns "$SLURM_DIR" || return 1
        SLURM_ON_FIRST="nsenter --net=/var/run/netns/$slurm_ns1"
        slurm_ctld_addr=$slurm_net.1
        slurm_node_lines="NodeName=$slurm_net.[1-2] CPUs=$slurm_cpus State=UNKNOWN"
        slurm_names="$slurm_net.1 $slurm_net.2"
    else
        slurm_ctld_addr=127.0.0.1
        slurm_node_lines="NodeName=$slurm_host NodeAddr=127.0.0.1 CPUs=$slurm_cpus State=UNKNOWN"
        slurm_names=$slurm_host
    fi
    for slurm_node in $slurm_names; do
        mkdir -p "$SLURM_DIR/spool-$slurm_node" && chmod 700 "$SLURM_DIR/spool-$slurm_node" ||
            return 1
    done

    dd if=/dev/urandom of="$SLURM_DIR/munge.key" bs=1024 count=1 2> /dev/null || return 1
    chmod 400 "$SLURM_DIR/munge.key"
    # a socket file: every node's slurmd reaches it whatever its network
    munged --force --socket="$SLURM_DIR/munge.socket" --key-file="$SLURM_DIR/munge.key" \
        --pid-file="$SLURM_DIR/munged.pid" --log-file="$SLURM_DIR/munged.log" \
        --seed-file="$SLURM_DIR/munged.seed" > "$SLURM_DIR/munged.out" 2>&1 ||
        { cat "$SLURM_DIR/munged.out" >&2; slurm_fail "munged did not start"; return 1; }

    # a name of its own per cluster, so two at once never share state
    slurm_name=loom$$$(date +%s | tail -c 5)
    slurm_ctld_port=$(slurm_free_port 1)
    slurm_d_port=$(slurm_free_port 2)
    while [ "$slurm_d_port" = "$slurm_ctld_port" ]; do slurm_d_port=$(slurm_free_port 3); done
    : > "$SLURM_DIR/plugstack.conf"
    # Slurm's PMIx plugin makes each step's client folder under /tmp by
    # default, named by job and step only: every private cluster counts
    # jobs from 1, so two would collide there. Under DIR, each node's own
    # (slurm_node_start mounts one there).
    mkdir -p "$SLURM_DIR/pmix"
    echo "PMIxCliTmpDirBase=$SLURM_DIR/pmix" > "$SLURM_DIR/mpi.conf"
    cat > "$SLURM_DIR/slurm.conf" << EOF
ClusterName=$slurm_name
SlurmctldHost=$slurm_host($slurm_ctld_addr)
SlurmctldPort=$slurm_ctld_port
SlurmdPort=$slurm_d_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$SLURM_DIR/munge.socket
CredType=cred/munge
StateSaveLocation=$SLURM_DIR/state
SlurmdSpoolDir=$SLURM_DIR/spool-%n
SlurmctldPidFile=$SLURM_DIR/slurmctld.pid
SlurmdPidFile=$SLURM_DIR/slurmd-%n.pid
SlurmctldLogFile=$SLURM_DIR/slurmctld.log
SlurmdLogFile=$SLURM_DIR/slurmd-%n.log
PlugStackConfig=$SLURM_DIR/plugstack.conf
SlurmctldDebug=info
SlurmdDebug=info
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ProctrackType=proctrack/pgid
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
JobCompType=jobcomp/none
SchedulerParameters=batch_sched_delay=0
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MessageTimeout=10
SlurmdTimeout=60
InactiveLimit=0
KillWait=5
MinJobAge=30
$slurm_node_lines
PartitionName=debug Nodes=ALL Default=YES OverSubscribe=FORCE:4 MaxTime=INFINITE State=UP
EOF
    # an outer job's variables (a test suite run under Slurm) would send
    # srun to that job's allocation on another cluster
    for slurm_var in $(env | sed -n 's/^\(SLURM_[A-Z0-9_]*\)=.*/\1/p'); do
        unset "$slurm_var"
    done
    export SLURM_CONF="$SLURM_DIR/slurm.conf"

    slurm_ns=""
    [ "$slurm_nodes" = 2 ] && slurm_ns=$slurm_ns1
    slurm_on "$slurm_ns" slurmctld -f "$SLURM_CONF" -i > "$SLURM_DIR/slurmctld.out" 2>&1 ||
        { cat "$SLURM_DIR/slurmctld.out" >&2; slurm_fail "slurmctld did not start"; return 1; }
    slurm_k=0
    for slurm_node in $slurm_names; do
        slurm_k=$((slurm_k + 1))
        slurm_ns=""
        [ "$slurm_nodes" = 2 ] && slurm_ns=$(sed -n "${slurm_k}p" "$SLURM_DIR/netns")
        if ! slurm_node_start "$slurm_ns" "$SLURM_DIR/cgroup-$slurm_node" slurmd \
            -f "$SLURM_CONF" -N "$slurm_node" > "$SLURM_DIR/slurmd-$slurm_node.out" 2>&1; then
            cat "$SLURM_DIR/slurmd-$slurm_node.out" >&2
            slurm_fail "slurmd on $slurm_node did not start"
            return 1
        fi
    done

    # bounded: the nodes are idle within a few seconds, or something is wrong
    slurm_waited=0 # tenths of a second
    while :; do
        slurm_state=$($SLURM_ON_FIRST sinfo -h -N -o %t 2> /dev/null | sort | uniq -c | tr -s ' ')
        [ "$slurm_state" = " $slurm_nodes idle" ] && return 0
        if [ "$slurm_waited" -ge 300 ]; then
            slurm_fail "the nodes are not idle after 30 s (sinfo says '${slurm_state:-nothing}')"
            return 1
        fi
        # a daemon writes its pid file once it runs: give it 2 s to
        for slurm_daemon in slurmctld $(for n in $slurm_names; do echo "slurmd-$n"; done); do
            slurm_pid=$(cat "$SLURM_DIR/$slurm_daemon.pid" 2> /dev/null)
            if [ "$slurm_waited" -ge 20 ] &&
                { [ -z "$slurm_pid" ] || ! kill -0 "$slurm_pid" 2> /dev/null; }; then
                slurm_fail "$slurm_daemon died"
                return 1
            fi
        done
        sleep 0.2
        slurm_waited=$((slurm_waited + 2))
    done
}

# slurm_batch [SBATCH OPTIONS] SCRIPT: sbatch SCRIPT and wait for the job
# to end (bounded: 120 s); 0 when it completed, else 1 with its state.
# sbatch --wait does the same but looks only every few seconds.
slurm_batch() {
    slurm_job=$($SLURM_ON_FIRST sbatch --parsable "$@") || return 1
    slurm_job=${slurm_job%%;*}
    slurm_n=0
    while [ "$slurm_n" -lt 600 ]; do
        slurm_state=$($SLURM_ON_FIRST scontrol show job "$slurm_job" -o 2> /dev/null |
            sed -n 's/.*JobState=\([A-Z_]*\).*ExitCode=\([0-9:]*\).*/\1 \2/p')
        case $slurm_state in
        COMPLETED*) return 0 ;;
        PENDING* | CONFIGURING* | RUNNING* | COMPLETING* | "") ;;
        *)
            echo "slurm_batch: job $slurm_job ended $slurm_state (state, exit code:signal)" >&2
            return 1
            ;;
        esac
        sleep 0.2
        slurm_n=$((slurm_n + 1))
    done
    echo "slurm_batch: job $slurm_job still ${slurm_state:-unknown} after 120 s" >&2
    $SLURM_ON_FIRST scancel "$slurm_job" 2> /dev/null
    return 1
}

# slurm_stop DIR NAME...: end the daemons whose pid files DIR/NAME.pid
# name, all at once (each takes a second or two to exit), waiting for them
# (bounded) and killing what is left
slurm_stop() {
    slurm_stop_dir=$1
    shift
    slurm_pids=""
    for slurm_daemon in "$@"; do
        slurm_pid=$(cat "$slurm_stop_dir/$slurm_daemon.pid" 2> /dev/null) || continue
        [ -n "$slurm_pid" ] && kill "$slurm_pid" 2> /dev/null && slurm_pids="$slurm_pids $slurm_pid"
    done
    slurm_n=0
    while [ "$slurm_n" -lt 50 ]; do
        slurm_alive=""
        for slurm_pid in $slurm_pids; do
            kill -0 "$slurm_pid" 2> /dev/null && slurm_alive="$slurm_alive $slurm_pid"
        done
        [ -n "$slurm_alive" ] || return 0
        sleep 0.2
        slurm_n=$((slurm_n + 1))
    done
    for slurm_pid in $slurm_alive; do
        kill -9 "$slurm_pid" 2> /dev/null
    done
    return 0
}

slurm_down() {
    [ -n "${1:-}" ] && [ -d "$1" ] || return 0
    slurm_first=""
    [ -f "$1/netns" ] && slurm_first=$(head -n 1 "$1/netns")
    if [ -f "$1/slurm.conf" ] && [ -f "$1/slurmctld.pid" ]; then
        slurm_on "$slurm_first" env SLURM_CONF="$1/slurm.conf" scancel --full --quiet \
            --user=root > /dev/null 2>&1 || true
        # slurmstepd ends a cancelled job's tasks: give it a moment
        slurm_n=0
        while [ "$slurm_n" -lt 20 ] && [ -n "$(slurm_on "$slurm_first" \
            env SLURM_CONF="$1/slurm.conf" squeue -h -o %i 2> /dev/null)" ]; do
            sleep 0.5
            slurm_n=$((slurm_n + 1))
        done
    fi
    slurm_slurmds=""
    for slurm_pidfile in "$1"/slurmd-*.pid; do
        [ -f "$slurm_pidfile" ] && slurm_slurmds="$slurm_slurmds $(basename "$slurm_pidfile" .pid)"
    done
    # shellcheck disable=SC2086
    slurm_stop "$1" slurmctld munged $slurm_slurmds
    # a job step's slurmstepd outlives slurmd; ours carry SLURM_CONF=DIR/...
    for slurm_pid in $(pgrep -x slurmstepd 2> /dev/null); do
        tr '\0' '\n' < "/proc/$slurm_pid/environ" 2> /dev/null | grep -qF "SLURM_CONF=$1/" &&
            kill -9 "$slurm_pid" 2> /dev/null
    done
    if [ -f "$1/netns" ]; then
        while read -r slurm_ns; do
            ip netns del "$slurm_ns" 2> /dev/null
        done < "$1/netns"
        rm -f "$1/netns"
    fi
    return 0
}
