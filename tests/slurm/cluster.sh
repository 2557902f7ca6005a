#!/usr/bin/env bash
# A throw-away two-node Slurm cluster on ONE machine, for tests. No systemd, no root-owned
# system state: everything (configs, munge key and socket, spool, logs, fake GPU devices) lives
# in one state directory, and every daemon is started by this script and ended by PID.
#
#   cluster.sh serve [STATE_DIR]          bring the cluster up, touch STATE_DIR/ready, then block
#                                         until stdin reaches EOF or SIGTERM/SIGINT/SIGHUP;
#                                         always tears down (what tests/test_slurm.py uses: when
#                                         pytest dies, its end of the stdin pipe closes too)
#   cluster.sh run [STATE_DIR] -- CMD...  bring it up, run CMD with SLURM_CONF etc. exported,
#                                         tear down, exit with CMD's status
#   cluster.sh down STATE_DIR             end what a crashed serve/run left behind (by the PIDs
#                                         it recorded in STATE_DIR/pids)
#
# Without STATE_DIR a fresh `mktemp -d` directory is used (and removed on teardown unless
# KEEP_STATE=1). STATE_DIR/env holds KEY=VALUE lines (SLURM_CONF, ...) for clients.
#
# Layout (measured on Debian 12, slurm-wlm 22.05, see shared/FACTS.md "Slurm"):
#   munged      one private daemon on a private socket (AuthInfo=socket=...).
#   netns       slurmctld starts in a NEW network namespace (loopback plus a veth pair whose
#               both ends stay inside, 198.51.100.1/24); both slurmds join it, and clients
#               (sbatch, squeue, ...) must too: `nsenter --net=$NETNS`, with NETNS from
#               STATE_DIR/env (`cluster.sh run` does it for you). So every byte of Slurm and
#               MPI traffic stays inside this namespace, MPI finds no real interface to
#               wander onto, and Slurm's default ports cannot clash with the host's.
#   slurmctld   SlurmctldHost=<real hostname>(127.0.0.1).
#   slurmd n1   `slurmd -N n1` and `-N n2` on distinct ports, each in its own UTS + mount
#   slurmd n2   namespace (unshare) with hostname n1/n2 and a bind-mounted /etc/hosts, so MPI
#               sees two hosts (without that, shared-memory segment names of the two "nodes"
#               clash and MPI_Comm_split_type(SHARED) sees one node).
#   TmpFS=<state>/tmp/%n  one per node, else the PMIx plugins of both slurmds clash.
#   CPUs=$CPUS_PER_NODE (default 4, more than the real cores) per node, accepted through
#               SlurmdParameters=config_overrides.
#   Gres=gpu:$GPUS_PER_NODE (default 2) per node, backed by fake char devices (mknod c 1 3, i.e. /dev/null's numbers)
#               listed in gres.conf: enough for --gpus* to set CUDA_VISIBLE_DEVICES.
#   EnforcePartLimits=ALL so a job asking for more than the cluster has fails at submit
#               instead of pending forever.
# Requires root (unshare, nsenter, mount, mknod) and tests/slurm/install_deps.sh.
set -euo pipefail

NODES=(n1 n2)   # the node ports below (6818, 6819) assume two nodes
NET_ADDR=198.51.100.1   # TEST-NET-2 (documentation range), only inside our namespace
CPUS_PER_NODE=${CPUS_PER_NODE:-4}
GPUS_PER_NODE=${GPUS_PER_NODE:-2}
MEM_PER_NODE_MB=${MEM_PER_NODE_MB:-4000}
UP_TIMEOUT_S=${UP_TIMEOUT_S:-60}

log() { echo "cluster.sh: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

SBIN_PATH=/usr/sbin:/usr/bin:/sbin:/bin
export PATH="$PATH:$SBIN_PATH"

# ---------------------------------------------------------------------------------------------
# Teardown: only PIDs we recorded, plus processes living in the namespaces we created
# (job steps: slurmstepd double-forks away from slurmd, so they are not its children, but
# they inherit its namespaces, which are ours alone).
# ---------------------------------------------------------------------------------------------
STATE=""
PIDS=()        # "name:pid", in start order
NS_IDS=()      # "uts:[inode]" of each slurmd, "net:[inode]" of the cluster's network
OWN_STATE=0    # 1 when we created STATE ourselves (then we remove it)
TORN_DOWN=0

alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null; }

NETNS=""       # /proc/<slurmctld pid>/ns/net once slurmctld runs

# Wait up to $2 seconds for PID $1 to disappear. It may not be our child (unshare exec'd),
# so poll instead of `wait`.
wait_gone() {
  local pid=$1 deadline=$(( SECONDS + $2 ))
  while alive "$pid"; do
    [ $SECONDS -ge $deadline ] && return 1
    sleep 0.1
  done
  return 0
}

stop_pid() {  # name pid
  local name=$1 pid=$2
  alive "$pid" || return 0
  kill -TERM "$pid" 2>/dev/null || true
  if ! wait_gone "$pid" 10; then
    log "$name (pid $pid) ignored SIGTERM, sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    wait_gone "$pid" 5 || log "$name (pid $pid) still alive after SIGKILL"
  fi
  # Reap it if it is our child, so it does not linger as a zombie.
  wait "$pid" 2>/dev/null || true
}

# Kill every process living in one of our namespaces (job steps, the MPI daemons they spawned).
sweep_namespaces() {
  [ ${#NS_IDS[@]} -gt 0 ] || return 0
  local pass p uts net id found
  for pass in TERM KILL; do
    found=0
    for p in /proc/[0-9]*; do
      [ "${p#/proc/}" = $$ ] && continue
      uts=$(readlink "$p/ns/uts" 2>/dev/null) || continue
      net=$(readlink "$p/ns/net" 2>/dev/null) || continue
      for id in "${NS_IDS[@]}"; do
        if [ "$uts" = "$id" ] || [ "$net" = "$id" ]; then
          found=1
          kill -"$pass" "${p#/proc/}" 2>/dev/null || true
        fi
      done
    done
    [ $found -eq 0 ] && return 0
    sleep 1
  done
}

teardown() {
  local rc=$?
  [ $TORN_DOWN -eq 1 ] && return 0
  TORN_DOWN=1
  set +e
  trap '' INT TERM HUP
  local t0=$SECONDS
  log "tearing down (state $STATE)"
  [ -n "${CAT_PID:-}" ] && kill "$CAT_PID" 2>/dev/null
  # 1. Cancel every job of this cluster while slurmctld is still there, so job steps end
  #    through Slurm (bounded wait: the sweep below catches what does not end in time).
  if [ -n "$STATE" ] && [ -f "$STATE/etc/slurm.conf" ] && alive "$(pid_of slurmctld)"; then
    NETNS=/proc/$(pid_of slurmctld)/ns/net
    SLURM_CONF="$STATE/etc/slurm.conf" timeout 10 nsenter --net="$NETNS" -- \
      scancel --quiet --user="$(id -un)" 2>/dev/null
    local deadline=$(( SECONDS + 15 ))
    while [ $SECONDS -lt $deadline ]; do
      [ -z "$(SLURM_CONF="$STATE/etc/slurm.conf" timeout 5 nsenter --net="$NETNS" -- \
              squeue -h -o %i 2>/dev/null)" ] && break
      sleep 0.5
    done
  fi
  # 2. Daemons in reverse start order (slurmds, slurmctld, munged).
  local i entry
  for (( i=${#PIDS[@]}-1; i>=0; i-- )); do
    entry=${PIDS[$i]}
    stop_pid "${entry%%:*}" "${entry#*:}"
  done
  # 3. Anything still alive inside our node namespaces.
  sweep_namespaces
  if [ $OWN_STATE -eq 1 ] && [ "${KEEP_STATE:-0}" != 1 ] && [ $rc -eq 0 ]; then
    rm -rf "$STATE"
  elif [ -n "$STATE" ]; then
    log "state and logs kept in $STATE"
  fi
  log "down in $(( SECONDS - t0 ))s"
  return 0
}

pid_of() {  # name -> pid (from PIDS)
  local entry
  for entry in "${PIDS[@]}"; do
    [ "${entry%%:*}" = "$1" ] && { echo "${entry#*:}"; return 0; }
  done
  echo ""
}

record_pid() {  # name pid
  PIDS+=("$1:$2")
  echo "$1 $2" >> "$STATE/pids"
}

# ---------------------------------------------------------------------------------------------
# Bring-up
# ---------------------------------------------------------------------------------------------
write_config() {
  local ctld_port=$1; shift
  local node_ports=("$@")
  local host; host=$(hostname)
  mkdir -p "$STATE"/{etc,munge,ctld,log,run,dev} "$STATE/spool" "$STATE/tmp"
  chmod 700 "$STATE/munge"

  # Every node name and the controller's host resolve to loopback inside the node namespaces;
  # the veth address gets a name too, so reverse lookups of it (torch's TCPStore logs one)
  # answer at once.
  {
    echo "127.0.0.1 localhost $host ${NODES[*]}"
    echo "$NET_ADDR hpccomm-test-net"
    echo "::1 localhost ip6-localhost ip6-loopback"
  } > "$STATE/etc/hosts"

  : > "$STATE/etc/plugstack.conf"   # keep /etc/slurm/plugstack.conf.d/* out of our cluster

  local gres_conf="$STATE/etc/gres.conf"
  : > "$gres_conf"
  local n i gpu_files
  for n in "${NODES[@]}"; do
    mkdir -p "$STATE/spool/$n" "$STATE/tmp/$n" "$STATE/dev/$n"
    for (( i=0; i<GPUS_PER_NODE; i++ )); do
      # Same major/minor as /dev/null: harmless if anything opens it.
      mknod "$STATE/dev/$n/gpu$i" c 1 3
    done
    if [ "$GPUS_PER_NODE" -gt 0 ]; then
      gpu_files="$STATE/dev/$n/gpu[0-$((GPUS_PER_NODE-1))]"
      echo "NodeName=$n Name=gpu File=$gpu_files" >> "$gres_conf"
    fi
  done

  local conf="$STATE/etc/slurm.conf"
  cat > "$conf" <<EOF
# Generated by tests/slurm/cluster.sh -- a two-node test cluster on one machine.
ClusterName=hpccomm-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmUser=$(id -un)
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$STATE/munge/munge.socket.2
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool/%n
SlurmctldPidFile=$STATE/run/slurmctld.pid
SlurmdPidFile=$STATE/run/slurmd-%n.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig=$STATE/etc/plugstack.conf
# One PMIx server directory per node, else the two slurmds on this machine clash.
TmpFS=$STATE/tmp/%n
# No cgroups: linuxproc tracking, no task affinity/containment (this runs in containers too).
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
# Declared CPUs exceed the real cores; slurmd would otherwise drain the node.
SlurmdParameters=config_overrides
# Fail an oversized request at submit time instead of letting it pend forever.
EnforcePartLimits=ALL
ReturnToService=2
# Keep finished jobs visible to scontrol/squeue long enough for tests to read their state
# (there is no accounting database, so sacct is not available).
MinJobAge=600
KillWait=5
InactiveLimit=0
SlurmdTimeout=60
MessageTimeout=20
GresTypes=gpu
EOF
  for i in "${!NODES[@]}"; do
    n=${NODES[$i]}
    local gres=""
    [ "$GPUS_PER_NODE" -gt 0 ] && gres="Gres=gpu:$GPUS_PER_NODE"
    echo "NodeName=$n NodeHostname=$n NodeAddr=127.0.0.1 Port=${node_ports[$i]} CPUs=$CPUS_PER_NODE RealMemory=$MEM_PER_NODE_MB $gres State=UNKNOWN" >> "$conf"
  done
  echo "PartitionName=test Nodes=$(IFS=,; echo "${NODES[*]}") Default=YES MaxTime=30 State=UP" >> "$conf"

  # What clients need. Plain KEY=VALUE lines: sourceable by sh and trivial to parse.
  cat > "$STATE/env" <<EOF
SLURM_CONF=$conf
HPCCOMM_TEST_CLUSTER_NODES=${#NODES[@]}
HPCCOMM_TEST_CLUSTER_CPUS_PER_NODE=$CPUS_PER_NODE
HPCCOMM_TEST_CLUSTER_GPUS_PER_NODE=$GPUS_PER_NODE
EOF
}

start_munge() {
  local m="$STATE/munge"
  # A fresh key for this cluster only; munged insists on 0400/0600 and our ownership.
  dd if=/dev/urandom of="$m/munge.key" bs=1024 count=1 status=none
  chmod 400 "$m/munge.key"
  # --force: munged refuses some directory layouts (e.g. under /tmp, group-writable parents)
  # that are fine for a private test daemon.
  munged -F --force --socket="$m/munge.socket.2" --key-file="$m/munge.key" \
    --pid-file="$m/munged.pid" --log-file="$STATE/log/munged.log" --seed-file="$m/munged.seed" \
    >>"$STATE/log/munged.out" 2>&1 &
  record_pid munged $!
  local deadline=$(( SECONDS + 15 ))
  until munge -n -S "$m/munge.socket.2" 2>/dev/null | unmunge -S "$m/munge.socket.2" >/dev/null 2>&1; do
    alive "$(pid_of munged)" || { cat "$STATE/log/munged."* >&2 || true; die "munged exited"; }
    [ $SECONDS -ge $deadline ] && die "munged not answering after 15 s"
    sleep 0.1
  done
}

start_slurmctld() {
  # A new network namespace; slurmctld's PID names it for everyone else. Besides loopback it
  # gets one veth pair whose ends both stay inside it, hpcc0 with a documentation address
  # (TEST-NET-2, reachable from nowhere), because with loopback alone
  #   - Slurm resolves nothing (AI_ADDRCONFIG wants a non-loopback address: "Unable to
  #     resolve 127.0.0.1"),
  #   - Open MPI's mpirun hands its daemons on the other "node" a 127.0.0.1 address that they
  #     refuse as node-local (prted exits 213), and its TCP transport skips loopback.
  unshare --net -- /bin/sh -c '
      ip link set lo up &&
      ip link add hpcc0 type veth peer name hpcc1 &&
      ip addr add "$2/24" dev hpcc0 &&
      ip link set hpcc0 up && ip link set hpcc1 up &&
      exec slurmctld -D -i -f "$1"' \
    sh "$STATE/etc/slurm.conf" "$NET_ADDR" >>"$STATE/log/slurmctld.out" 2>&1 &
  local pid=$!
  record_pid slurmctld "$pid"
  local own; own=$(readlink /proc/$$/ns/net)
  local deadline=$(( SECONDS + 10 )) ns=""
  while :; do
    ns=$(readlink "/proc/$pid/ns/net" 2>/dev/null || true)
    [ -n "$ns" ] && [ "$ns" != "$own" ] && break
    alive "$pid" || { cat "$STATE/log/slurmctld.out" >&2 || true; die "slurmctld exited at start"; }
    [ $SECONDS -ge $deadline ] && die "slurmctld did not enter its network namespace"
    sleep 0.05
  done
  NETNS=/proc/$pid/ns/net
  NS_IDS+=("$ns")
  echo "NETNS=$NETNS" >> "$STATE/env"
}

start_slurmd() {  # node
  local n=$1
  # New UTS + mount namespace: own hostname and own /etc/hosts (bind mount, private
  # propagation so the host's /etc/hosts is untouched), inside the cluster's network
  # namespace. nsenter, unshare and sh all exec, so $! is slurmd's PID.
  nsenter --net="$NETNS" -- unshare --uts --mount --propagation private -- /bin/sh -c '
      hostname "$1" && mount --bind "$2" /etc/hosts && exec slurmd -D -N "$1" -f "$3"' \
    sh "$n" "$STATE/etc/hosts" "$STATE/etc/slurm.conf" >>"$STATE/log/slurmd-$n.out" 2>&1 &
  local pid=$!
  record_pid "slurmd-$n" "$pid"
  # Remember the namespace, to sweep job processes left in it at teardown. Wait until the
  # process is inside its new namespace (its UTS inode differs from ours).
  local own; own=$(readlink /proc/$$/ns/uts)
  local deadline=$(( SECONDS + 10 )) ns=""
  while :; do
    ns=$(readlink "/proc/$pid/ns/uts" 2>/dev/null || true)
    [ -n "$ns" ] && [ "$ns" != "$own" ] && break
    alive "$pid" || { cat "$STATE/log/slurmd-$n.out" >&2 || true; die "slurmd $n exited at start"; }
    [ $SECONDS -ge $deadline ] && die "slurmd $n did not enter its namespace"
    sleep 0.05
  done
  NS_IDS+=("$ns")
}

wait_ready() {
  export SLURM_CONF="$STATE/etc/slurm.conf"
  local deadline=$(( SECONDS + UP_TIMEOUT_S )) states
  while :; do
    local d
    for d in "${PIDS[@]}"; do
      alive "${d#*:}" || { tail -n 30 "$STATE"/log/* >&2 || true; die "${d%%:*} exited during bring-up"; }
    done
    # Every node idle (a node that registered wrong would be drain/down/inval).
    states=$(timeout 5 nsenter --net="$NETNS" -- sinfo -h -N -o '%N %t' 2>/dev/null | sort -u || true)
    if [ -n "$states" ] && ! grep -qv ' idle$' <<<"$states" \
       && [ "$(wc -l <<<"$states")" -eq ${#NODES[@]} ]; then
      break
    fi
    if [ $SECONDS -ge $deadline ]; then
      log "nodes not idle after ${UP_TIMEOUT_S}s: ${states:-<no answer>}"
      tail -n 30 "$STATE"/log/* >&2 || true
      die "bring-up timed out"
    fi
    sleep 0.2
  done
}

up() {
  [ "$(id -u)" -eq 0 ] || die "must run as root (unshare, mount, mknod)"
  local t
  for t in munged slurmctld slurmd sinfo sbatch unshare nsenter ip; do
    command -v "$t" >/dev/null || die "$t not found: run tests/slurm/install_deps.sh"
  done
  [ -e /usr/lib/x86_64-linux-gnu/libpmix.so ] || ls /usr/lib/*/libpmix.so >/dev/null 2>&1 \
    || log "warning: libpmix.so not found (install libpmix-dev): srun --mpi=pmix will fail"
  case "$STATE" in *[[:space:]]*) die "state dir must not contain whitespace: $STATE";; esac
  : > "$STATE/pids"
  # Slurm's default ports: the cluster has a network namespace of its own, so nothing on the
  # host can collide with them (and two clusters can run side by side).
  write_config 6817 6818 6819
  local t0=$SECONDS
  start_munge
  start_slurmctld
  local n
  for n in "${NODES[@]}"; do start_slurmd "$n"; done
  wait_ready
  log "up in $(( SECONDS - t0 ))s: ${NODES[*]} (state $STATE, SLURM_CONF=$SLURM_CONF)"
}

# Stop what a previous serve/run recorded (used when that shell was SIGKILLed).
down_from_pidfile() {
  STATE=$1
  [ -f "$STATE/pids" ] || die "no $STATE/pids"
  local name pid comm
  while read -r name pid; do
    alive "$pid" || continue
    comm=$(cat "/proc/$pid/comm" 2>/dev/null || true)
    # Guard against PID reuse: only kill a process with the name we started.
    case "$name" in
      munged) [ "$comm" = munged ] ;;
      slurmctld) [ "$comm" = slurmctld ] ;;
      slurmd-*) [ "$comm" = slurmd ] ;;
      *) false ;;
    esac || { log "pid $pid is now '$comm', not $name: left alone"; continue; }
    PIDS+=("$name:$pid")
    [[ "$name" == slurmd-* ]] && NS_IDS+=("$(readlink "/proc/$pid/ns/uts")")
    [ "$name" = slurmctld ] && NS_IDS+=("$(readlink "/proc/$pid/ns/net")")
  done < "$STATE/pids"
  teardown
}

init_state() {  # [dir]
  if [ -n "${1:-}" ]; then
    STATE=$(realpath -m "$1")
    mkdir -p "$STATE"
    [ -z "$(ls -A "$STATE")" ] || die "state dir $STATE is not empty"
  else
    STATE=$(mktemp -d /tmp/hpccomm-slurm.XXXXXX)
    OWN_STATE=1
  fi
  chmod 755 "$STATE"
  trap teardown EXIT
  # A signal ends the script through `exit`, which runs the EXIT trap exactly once.
  trap 'exit 130' INT
  trap 'exit 143' TERM
  trap 'exit 129' HUP
}

cmd=${1:-}
shift || true
case "$cmd" in
  serve)
    init_state "${1:-}"
    up
    touch "$STATE/ready"
    echo "READY $STATE"
    # Block until our stdin closes (the caller went away) or a signal arrives. A background
    # job's stdin is /dev/null in a non-interactive shell, hence the fd 3 copy; `wait` (unlike
    # a foreground read) returns at once when a trapped signal arrives.
    exec 3<&0
    cat <&3 >/dev/null &
    CAT_PID=$!
    wait "$CAT_PID" || true
    kill "$CAT_PID" 2>/dev/null || true
    exit 0
    ;;
  run)
    dir=""
    if [ "${1:-}" != "--" ]; then dir=${1:-}; shift || true; fi
    [ "${1:-}" = "--" ] && shift
    [ $# -gt 0 ] || die "usage: cluster.sh run [STATE_DIR] -- CMD..."
    init_state "$dir"
    up
    set +e
    ( set -a; . "$STATE/env"; exec nsenter --net="$NETNS" -- "$@" )
    rc=$?
    exit $rc
    ;;
  down)
    [ -n "${1:-}" ] || die "usage: cluster.sh down STATE_DIR"
    down_from_pidfile "$1"
    ;;
  *)
    sed -n '2,20p' "$0" >&2
    exit 2
    ;;
esac
