#!/usr/bin/env bash
# Start, stop or list the real servers distlock's tests run against, on 127.0.0.1 only.
#
#   scripts/servers.sh start    install what is missing, start fresh servers, write the env file
#   scripts/servers.sh stop     stop every server this script started (by PID, never by name)
#   scripts/servers.sh status   show which recorded servers are alive, and the env file
#
# Started: one redis-server; five more for Redlock; a Redis Cluster of six nodes (three
# masters, three replicas); a Redis master with one replica, watched by three Sentinels as
# "distlock-master"; PostgreSQL 15; MariaDB; a single etcd member; a three-member etcd
# cluster; a single ZooKeeper server; a three-server ZooKeeper ensemble. Data lives under target/test-servers/ and is wiped at every start. Ports are
# picked free at start time. The URLs are written to target/test-servers.env as
# `export VAR=value` lines for `source`.
#
# DISTLOCK_TEST_SERVERS_DIR overrides the state directory (the env file is then written
# beside it as "<dir>.env"), so two checkouts sharing a machine, or a CI run next to a
# developer's servers, do not stop each other's servers.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STATE_DIR="${DISTLOCK_TEST_SERVERS_DIR:-$ROOT/target/test-servers}"
ENV_FILE="${STATE_DIR%/}.env"
PIDS_FILE="$STATE_DIR/pids"
PG_BIN_DIR="/usr/lib/postgresql/15/bin"
LIBFAKETIME="/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
READY_TIMEOUT_S=30
STOP_TIMEOUT_S=10
SENTINEL_MASTER_NAME=distlock-master
# How long apt-get waits for the package manager's lock held by another process.
APT_LOCK_TIMEOUT_S=600
# Debian's zookeeperd: the jar's manifest names every library it needs.
ZK_JAR=/usr/share/java/zookeeper.jar

log() { printf 'servers.sh: %s\n' "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}

# Milliseconds since the epoch, for the timings printed at the end of start/stop.
now_ms() { date +%s%3N; }

# ---------------------------------------------------------------------------------------------
# Packages
# ---------------------------------------------------------------------------------------------

ensure_packages() {
    local missing=()
    local bin
    for bin in redis-server redis-cli mariadbd mariadb mariadb-install-db etcd etcdctl protoc psql pg_isready java openssl; do
        command -v "$bin" >/dev/null 2>&1 || missing+=("$bin")
    done
    [[ -f "$ZK_JAR" ]] || missing+=("$ZK_JAR")
    [[ -x "$PG_BIN_DIR/initdb" && -x "$PG_BIN_DIR/pg_ctl" && -x "$PG_BIN_DIR/postgres" ]] ||
        missing+=("$PG_BIN_DIR/{initdb,pg_ctl,postgres}")
    # The clock-step history test steps its own PostgreSQL's wall clock with libfaketime.
    [[ -e "$LIBFAKETIME" ]] || missing+=("$LIBFAKETIME")
    if ((${#missing[@]} == 0)); then
        return 0
    fi
    log "missing: ${missing[*]}; installing Debian packages"
    [[ "$(id -u)" == 0 ]] || die "installing packages needs root (apt-get); missing: ${missing[*]}"
    # A fresh machine's unattended upgrades hold the package manager's lock for minutes
    # after boot: wait for it (up to 10 minutes) instead of failing at once with "Could not
    # get lock /var/lib/dpkg/lock-frontend".
    log "installing (waits up to ${APT_LOCK_TIMEOUT_S}s for another apt-get or dpkg to finish)"
    apt-get -o DPkg::Lock::Timeout="$APT_LOCK_TIMEOUT_S" update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout="$APT_LOCK_TIMEOUT_S" install -y -qq \
        redis-server postgresql mariadb-server etcd-server etcd-client protobuf-compiler \
        libfaketime zookeeperd openssl >/dev/null
}

# ---------------------------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------------------------

# Fields of /proc/PID/stat after the command name (which may contain spaces): word 1 is the
# state (field 3), word 20 the start time in clock ticks since boot (field 22).
proc_stat_tail() {
    local stat
    stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
    printf '%s' "${stat##*) }"
}

# The start time is recorded with the PID so `stop` never signals an unrelated process that
# reused the PID after a crash.
proc_starttime() {
    local tail
    tail="$(proc_stat_tail "$1")" || return 1
    awk '{print $20}' <<<"$tail"
}

# Alive means: exists, is not a zombie (PID 1 reaps orphans late here) and, when a start time
# is given, is the process we recorded.
pid_alive() {
    local pid="$1" start="${2:-}" tail state started
    tail="$(proc_stat_tail "$pid")" || return 1
    read -r state started <<<"$(awk '{print $1, $20}' <<<"$tail")"
    [[ "$state" != Z && "$state" != X ]] || return 1
    [[ -z "$start" || "$started" == "$start" ]]
}

# record NAME PID STOP_SIGNAL
record_pid() {
    local start
    start="$(proc_starttime "$2")" || {
        sleep 0.1
        tail_log "$STATE_DIR/$1/log"
        die "$1 (pid $2) exited right after start"
    }
    printf '%s %s %s %s\n' "$1" "$2" "$3" "$start" >>"$PIDS_FILE"
}

# The PID recorded for NAME.
recorded_pid() { awk -v n="$1" '$1 == n { print $2 }' "$PIDS_FILE"; }

tail_log() {
    local f="$1"
    if [[ -f "$f" ]]; then
        log "---- last lines of $f ----"
        tail -n 30 "$f" >&2 || true
        log "----"
    fi
}

# wait_ready NAME PID LOGFILE CHECK...: polls CHECK until it succeeds, the process dies, or the
# bound passes; fails loudly with the log tail.
wait_ready() {
    local name="$1" pid="$2" logfile="$3"
    shift 3
    local deadline=$(($(now_ms) + READY_TIMEOUT_S * 1000))
    while true; do
        if "$@" >/dev/null 2>&1; then
            return 0
        fi
        if ! pid_alive "$pid"; then
            tail_log "$logfile"
            stop_all >/dev/null 2>&1 || true
            die "$name (pid $pid) exited before it became ready"
        fi
        if (($(now_ms) > deadline)); then
            tail_log "$logfile"
            stop_all >/dev/null 2>&1 || true
            die "$name (pid $pid) not ready after ${READY_TIMEOUT_S}s"
        fi
        sleep 0.05
    done
}

stop_all() {
    [[ -f "$PIDS_FILE" ]] || return 0
    local t0 name pid sig start
    t0="$(now_ms)"
    local live=()
    # Signal everything first, then wait for all: stopping in parallel is what keeps this fast.
    while read -r name pid sig start; do
        [[ -n "${pid:-}" ]] || continue
        if pid_alive "$pid" "$start"; then
            kill "-$sig" "$pid" 2>/dev/null || true
            live+=("$name:$pid:$start")
        fi
    done <"$PIDS_FILE"
    local deadline=$(($(now_ms) + STOP_TIMEOUT_S * 1000))
    local entry still
    while ((${#live[@]} > 0)); do
        still=()
        for entry in "${live[@]}"; do
            IFS=: read -r name pid start <<<"$entry"
            pid_alive "$pid" "$start" && still+=("$entry")
        done
        live=("${still[@]+"${still[@]}"}")
        ((${#live[@]} > 0)) || break
        if (($(now_ms) > deadline)); then
            for entry in "${live[@]}"; do
                IFS=: read -r name pid start <<<"$entry"
                log "$name (pid $pid) ignored its stop signal for ${STOP_TIMEOUT_S}s: KILL"
                kill -KILL "$pid" 2>/dev/null || true
            done
            sleep 0.2
            break
        fi
        sleep 0.05
    done
    rm -f "$PIDS_FILE"
    log "stopped in $(($(now_ms) - t0)) ms"
}

# ---------------------------------------------------------------------------------------------
# Servers
# ---------------------------------------------------------------------------------------------

# free_ports N [BUS_N]: N distinct free loopback ports, then BUS_N more whose port+10000 (a
# Redis Cluster node's bus port) is free too, all held open together while picking so none
# repeats nor lands on another's bus port.
free_ports() {
    python3 - "$1" "${2:-0}" <<'EOF'
import socket, sys
n, bus_n = int(sys.argv[1]), int(sys.argv[2])
socks = []
def bind(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", port))
    socks.append(s)
    return s.getsockname()[1]
ports = [bind(0) for _ in range(n)]
tries = 0
while len(ports) < n + bus_n:
    tries += 1
    if tries > 1000:
        sys.exit("no free port P with P+10000 free after 1000 tries")
    # A refused candidate stays bound, so it is not handed out again.
    p = bind(0)
    if p + 10000 > 65535:
        continue
    try:
        bind(p + 10000)
    except OSError:
        continue
    ports.append(p)
print(" ".join(str(p) for p in ports))
for s in socks:
    s.close()
EOF
}

# service_dir NAME USER: prints a directory USER can write, for a server that runs as USER.
# That is $STATE_DIR/NAME when USER can reach it and the path is short enough for Unix
# sockets (sun_path holds 107 bytes). Otherwise (a checkout under /root is not reachable by
# user postgres; a deep checkout makes socket paths too long) it is a fresh /tmp directory,
# linked from $STATE_DIR/NAME and removed at the next start.
service_dir() {
    local name="$1" user="$2" dir="$STATE_DIR/$1"
    mkdir -p "$dir"
    chown "$user:$user" "$dir"
    if ((${#dir} <= 70)) && runuser -u "$user" -- test -w "$dir" 2>/dev/null; then
        printf '%s' "$dir"
        return 0
    fi
    rmdir "$dir"
    dir="$(mktemp -d "/tmp/distlock-$name.XXXXXX")"
    chmod 755 "$dir"
    chown "$user:$user" "$dir"
    ln -s "$dir" "$STATE_DIR/$name"
    printf '%s\n' "$dir" >>"$STATE_DIR/tmpdirs"
    printf '%s' "$dir"
}

remove_tmpdirs() {
    [[ -f "$STATE_DIR/tmpdirs" ]] || return 0
    local d
    while read -r d; do
        # Only ever what service_dir created.
        [[ "$d" == /tmp/distlock-* ]] && rm -rf "$d"
    done <"$STATE_DIR/tmpdirs"
}

# start_redis NAME PORT [--conf FILE] [OPTION...]: runs in the foreground of a background job
# so $! is redis' own PID. FILE (a sentinel needs one: it rewrites it) is read before the
# options; the OPTIONs (e.g. --cluster-enabled yes, --replicaof H P, --sentinel) come last.
start_redis() {
    local name="$1" port="$2" dir="$STATE_DIR/$1"
    shift 2
    local conf=()
    if [[ "${1:-}" == --conf ]]; then
        conf=("$2")
        shift 2
    fi
    mkdir -p "$dir"
    setsid redis-server "${conf[@]+"${conf[@]}"}" --bind 127.0.0.1 --port "$port" --protected-mode yes \
        --save '' --appendonly no --dir "$dir" --logfile "$dir/log" "$@" \
        </dev/null >>"$dir/log" 2>&1 &
    record_pid "$name" "$!" TERM
}

redis_ping() { [[ "$(redis-cli -h 127.0.0.1 -p "$1" PING 2>/dev/null)" == PONG ]]; }

# redis_info_has PORT SECTION_OR_COMMAND... FIELD:VALUE: the reply of redis-cli at PORT to the
# command has the line FIELD:VALUE (INFO and CLUSTER INFO end their lines with CR).
redis_info_has() {
    local port="$1" want="${*: -1}"
    redis-cli -h 127.0.0.1 -p "$port" "${@:2:$#-2}" 2>/dev/null | tr -d '\r' | grep -qxF "$want"
}

# cluster_ok PORT: the Redis Cluster node at PORT sees the cluster healthy with every slot
# served, sees three masters and three replicas (a replica's new role reaches the other nodes
# by gossip, after `redis-cli --cluster create` returns) and, if a replica, is in sync with its
# master (one never in sync would refuse to fail over).
cluster_ok() {
    redis_info_has "$1" CLUSTER INFO cluster_state:ok &&
        redis_info_has "$1" CLUSTER INFO cluster_slots_assigned:16384 || return 1
    redis-cli -h 127.0.0.1 -p "$1" CLUSTER NODES 2>/dev/null | awk '
        { flags = $3; sub(/^myself,/, "", flags); n[flags]++ }
        END { exit !(n["master"] == 3 && n["slave"] == 3) }' || return 1
    redis_info_has "$1" INFO replication role:master ||
        redis_info_has "$1" INFO replication master_link_status:up
}

# start_sentinel NAME PORT MASTER_PORT REPLICA_PORT: a sentinel with its own writable config
# file. A sentinel learns of replicas from the master's INFO, which it polls every 10 s; the
# replica is named in the file (as sentinel itself records it there) so that a sentinel
# started before the replica attached need not wait for its next poll to know it.
start_sentinel() {
    local name="$1" port="$2" master_port="$3" replica_port="$4" dir="$STATE_DIR/$1"
    mkdir -p "$dir"
    cat >"$dir/sentinel.conf" <<EOF
sentinel monitor $SENTINEL_MASTER_NAME 127.0.0.1 $master_port 2
sentinel known-replica $SENTINEL_MASTER_NAME 127.0.0.1 $replica_port
sentinel down-after-milliseconds $SENTINEL_MASTER_NAME 1000
sentinel failover-timeout $SENTINEL_MASTER_NAME 5000
sentinel parallel-syncs $SENTINEL_MASTER_NAME 1
EOF
    start_redis "$name" "$port" --conf "$dir/sentinel.conf" --sentinel
}

# sentinel_ready PORT MASTER_PORT: the sentinel names MASTER_PORT as the master's address,
# knows the replica and has found the two other sentinels (through the master's hello channel,
# every 2 s): without them it could neither reach the quorum nor be elected for a failover.
sentinel_ready() {
    [[ "$(redis-cli -h 127.0.0.1 -p "$1" SENTINEL get-master-addr-by-name "$SENTINEL_MASTER_NAME" 2>/dev/null |
        tr -d '\r' | paste -sd ' ')" == "127.0.0.1 $2" ]] || return 1
    local fields
    fields="$(redis-cli -h 127.0.0.1 -p "$1" SENTINEL master "$SENTINEL_MASTER_NAME" 2>/dev/null |
        tr -d '\r' | paste -d ' ' - -)" || return 1
    grep -qx 'num-slaves 1' <<<"$fields" && grep -qx 'num-other-sentinels 2' <<<"$fields"
}

start_postgres_init() {
    local dir="$PG_DIR"
    # initdb refuses to run as root.
    runuser -u postgres -- "$PG_BIN_DIR/initdb" -D "$dir/data" -U postgres \
        --auth-local=trust --auth-host=scram-sha-256 -E UTF8 --locale=C.UTF-8 \
        >"$dir/initdb.log" 2>&1 || {
        tail_log "$dir/initdb.log"
        die "initdb failed"
    }
}

start_postgres() {
    local port="$1" dir="$PG_DIR"
    # postgres refuses to run as root; setpriv execs (no fork), so $! is the postmaster.
    # fsync=off: test data is disposable and fsync dominates lock round trips otherwise.
    setsid setpriv --reuid=postgres --regid=postgres --init-groups \
        "$PG_BIN_DIR/postgres" -D "$dir/data" \
        -c listen_addresses=127.0.0.1 -p "$port" -k "$dir" \
        -c fsync=off -c synchronous_commit=off -c full_page_writes=off \
        -c max_connections=300 \
        </dev/null >>"$dir/log" 2>&1 &
    record_pid postgres "$!" INT # INT = fast shutdown (TERM would wait for clients)
}

pg_setup() {
    local port="$1"
    psql -X -q -v ON_ERROR_STOP=1 -h "$PG_DIR" -p "$port" -U postgres -d postgres <<'EOF'
SET password_encryption = 'scram-sha-256';
CREATE ROLE distlock LOGIN PASSWORD 'distlock';
CREATE DATABASE distlock OWNER distlock;
-- A role that may use the database but not create in it (driver-sql's tests/rights.rs).
CREATE ROLE distlock_plain LOGIN PASSWORD 'distlock';
EOF
}

pg_app_ready() {
    PGPASSWORD=distlock psql -X -tA -h 127.0.0.1 -p "$1" -U distlock -d distlock -c 'SELECT 1' |
        grep -qx 1
}

start_mariadb_init() {
    local dir="$MY_DIR"
    mariadb-install-db --no-defaults --user=mysql --datadir="$dir/data" \
        --auth-root-authentication-method=socket --skip-test-db \
        >"$dir/install.log" 2>&1 || {
        tail_log "$dir/install.log"
        die "mariadb-install-db failed"
    }
}

start_mariadb() {
    local port="$1" dir="$MY_DIR"
    # Its temporary tables in a directory of its own: in the shared /tmp one vanished
    # mid-statement once ("Error on delete of '/tmp/#sql-temptable-….MAI'").
    mkdir -p "$dir/tmp"
    chown mysql:mysql "$dir/tmp"
    # Started as root with --user: mariadbd drops privileges itself, so $! is its own PID.
    setsid mariadbd --no-defaults --user=mysql --datadir="$dir/data" --tmpdir="$dir/tmp" \
        --bind-address=127.0.0.1 --port="$port" --socket="$dir/mysqld.sock" \
        --pid-file="$dir/mariadbd.pid" --log-error="$dir/log" --skip-log-bin \
        --skip-name-resolve --innodb-flush-log-at-trx-commit=0 --innodb-doublewrite=0 --max-connections=500 \
        </dev/null >>"$dir/console.log" 2>&1 &
    record_pid mariadb "$!" TERM
}

mariadb_root_ready() { mariadb --no-defaults -S "$MY_DIR/mysqld.sock" -uroot -e 'SELECT 1'; }

mariadb_setup() {
    mariadb --no-defaults -S "$MY_DIR/mysqld.sock" -uroot <<'EOF'
CREATE DATABASE distlock;
CREATE USER 'distlock'@'127.0.0.1' IDENTIFIED BY 'distlock';
CREATE USER 'distlock'@'localhost' IDENTIFIED BY 'distlock';
GRANT ALL PRIVILEGES ON distlock.* TO 'distlock'@'127.0.0.1';
GRANT ALL PRIVILEGES ON distlock.* TO 'distlock'@'localhost';
-- A user with the rights docs/sql.md lists for a table that exists, and no more
-- (driver-sql's tests/rights.rs).
CREATE USER 'distlock_plain'@'127.0.0.1' IDENTIFIED BY 'distlock';
GRANT SELECT, INSERT, UPDATE, DELETE, EXECUTE ON distlock.* TO 'distlock_plain'@'127.0.0.1';
EOF
}

mariadb_app_ready() {
    mariadb --no-defaults -h 127.0.0.1 -P "$1" -udistlock -pdistlock -D distlock -N -e 'SELECT 1' |
        grep -qx 1
}

# start_etcd NAME STOP_SIGNAL CLIENT_PORT PEER_PORT INITIAL_CLUSTER TOKEN [extra flags...]
start_etcd() {
    local name="$1" sig="$2" cport="$3" pport="$4" cluster="$5" token="$6"
    shift 6
    local dir="$STATE_DIR/$name"
    mkdir -p "$dir"
    setsid etcd --name "$name" --data-dir "$dir/data" \
        --listen-client-urls "http://127.0.0.1:$cport" --advertise-client-urls "http://127.0.0.1:$cport" \
        --listen-peer-urls "http://127.0.0.1:$pport" --initial-advertise-peer-urls "http://127.0.0.1:$pport" \
        --initial-cluster "$cluster" --initial-cluster-state new --initial-cluster-token "$token" \
        "$@" </dev/null >>"$dir/log" 2>&1 &
    record_pid "$name" "$!" "$sig"
}

etcd_healthy() { ETCDCTL_API=3 etcdctl --endpoints="$1" --command-timeout=2s endpoint health; }

# start_zk NAME STOP_SIGNAL CLIENT_PORT [MYID SERVER_LINES]: a ZooKeeper server in the
# foreground of a background job, so $! is the JVM's own PID. tickTime 100 ms lets tests
# negotiate sessions from 200 ms (2 ticks) and elects a new leader in about a second; the
# maximum session stays 60 s. forceSync=no: test data is disposable and fsync dominates
# writes otherwise. A small heap and the client JIT keep the JVM's start under a second.
start_zk() {
    local name="$1" sig="$2" port="$3" myid="${4:-}" servers="${5:-}" dir="$STATE_DIR/$1"
    mkdir -p "$dir/data"
    cat >"$dir/zoo.cfg" <<EOF
tickTime=100
initLimit=50
syncLimit=20
dataDir=$dir/data
clientPort=$port
clientPortAddress=127.0.0.1
maxSessionTimeout=60000
admin.enableServer=false
4lw.commands.whitelist=ruok,srvr,stat,mntr,cons
forceSync=no
$servers
EOF
    [[ -z "$myid" ]] || printf '%s\n' "$myid" >"$dir/data/myid"
    setsid java -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
        -cp "$ZK_JAR" org.apache.zookeeper.server.quorum.QuorumPeerMain "$dir/zoo.cfg" \
        </dev/null >>"$dir/log" 2>&1 &
    record_pid "$name" "$!" "$sig"
}

# zk_word PORT WORD: a ZooKeeper four-letter word's answer.
zk_word() {
    timeout 2 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1" && printf %s "$2" >&3 && cat <&3' _ "$1" "$2"
}

# zk_serving PORT: the server answers and is part of a quorum (a standalone server, a
# leader or a follower), so it serves sessions.
zk_serving() { zk_word "$1" srvr 2>/dev/null | grep -qE '^Mode: (standalone|leader|follower)$'; }

cmd_start() {
    local t0 t_phase t_zk t_zk_ready=0
    t0="$(now_ms)"
    # PostgreSQL and MariaDB run as their own users, which takes root to arrange.
    [[ "$(id -u)" == 0 ]] || die "start needs root (servers run as users postgres and mysql)"
    ensure_packages
    local t_pkgs=$(($(now_ms) - t0))

    # Fresh each start: stop whatever this state dir started before, then wipe it.
    stop_all 2>/dev/null || true
    remove_tmpdirs
    rm -rf "$STATE_DIR" "$ENV_FILE"
    mkdir -p "$STATE_DIR"
    chmod 755 "$STATE_DIR"
    PG_DIR="$(service_dir postgres postgres)"
    MY_DIR="$(service_dir mariadb mysql)"
    : >"$PIDS_FILE"
    # Any failure after this point stops what was already started.
    trap 'rc=$?; if ((rc != 0)); then stop_all >/dev/null 2>&1 || true; fi' EXIT

    local ports
    read -r -a ports <<<"$(free_ports 31 6)"
    local redis_port=${ports[0]}
    local redlock_ports=("${ports[@]:1:5}")
    local pg_port=${ports[6]} my_port=${ports[7]}
    local etcd_c=${ports[8]} etcd_p=${ports[9]}
    local ec_c=("${ports[10]}" "${ports[11]}" "${ports[12]}")
    local ec_p=("${ports[13]}" "${ports[14]}" "${ports[15]}")
    local smaster_port=${ports[16]} sreplica_port=${ports[17]}
    local sentinel_ports=("${ports[@]:18:3}")
    local zk_port=${ports[21]}
    local zc_c=("${ports[22]}" "${ports[23]}" "${ports[24]}")
    local zc_q=("${ports[25]}" "${ports[26]}" "${ports[27]}")
    local zc_e=("${ports[28]}" "${ports[29]}" "${ports[30]}")
    local cluster_ports=("${ports[@]:31:6}") # their port+10000 (the cluster bus) is free too

    # Slow initialisations (initdb, mariadb-install-db) run side by side, then every server
    # is started before any is waited for (but for the Redis Cluster's nodes, see below).
    t_phase="$(now_ms)"
    start_postgres_init &
    local pg_init=$!
    start_mariadb_init &
    local my_init=$!

    start_redis redis "$redis_port"
    local i name
    for i in 0 1 2 3 4; do
        start_redis "redlock$((i + 1))" "${redlock_ports[$i]}"
    done
    # No 5 s wait before a full sync to a replica that attaches (the default for diskless sync).
    local cluster_opts=(--repl-diskless-sync-delay 0 --cluster-enabled yes --cluster-node-timeout 2000)
    for i in 0 1 2 3 4 5; do
        start_redis "redis-c$((i + 1))" "${cluster_ports[$i]}" "${cluster_opts[@]}" \
            --cluster-config-file "$STATE_DIR/redis-c$((i + 1))/nodes.conf"
    done
    start_redis redis-s-master "$smaster_port" --repl-diskless-sync-delay 0
    start_redis redis-s-replica "$sreplica_port" --repl-diskless-sync-delay 0 \
        --replicaof 127.0.0.1 "$smaster_port"
    for i in 0 1 2; do
        start_sentinel "sentinel$((i + 1))" "${sentinel_ports[$i]}" "$smaster_port" "$sreplica_port"
    done
    start_etcd etcd TERM "$etcd_c" "$etcd_p" "etcd=http://127.0.0.1:$etcd_p" "distlock-single-$$"
    local cluster="etcd-c1=http://127.0.0.1:${ec_p[0]},etcd-c2=http://127.0.0.1:${ec_p[1]},etcd-c3=http://127.0.0.1:${ec_p[2]}"
    for i in 0 1 2; do
        # KILL: on TERM a cluster leader first hands leadership over, and with its peers
        # stopping at the same moment it waits ~7 s for that; the data is wiped at start anyway.
        start_etcd "etcd-c$((i + 1))" KILL "${ec_c[$i]}" "${ec_p[$i]}" "$cluster" "distlock-cluster-$$" \
            --heartbeat-interval 100 --election-timeout 1000
    done

    t_zk="$(now_ms)"
    start_zk zookeeper TERM "$zk_port"
    local zk_servers=""
    for i in 0 1 2; do
        zk_servers+="server.$((i + 1))=127.0.0.1:${zc_q[$i]}:${zc_e[$i]}"$'\n'
    done
    for i in 0 1 2; do
        # KILL, as for the etcd cluster: the data is wiped at start anyway.
        start_zk "zookeeper-c$((i + 1))" KILL "${zc_c[$i]}" "$((i + 1))" "$zk_servers"
    done

    # The Redis Cluster is created as soon as its nodes answer, while PostgreSQL and MariaDB
    # initialise: `redis-cli --cluster create` takes over two seconds (it sleeps 1 s twice).
    local create_log="$STATE_DIR/redis-c1/cluster-create.log" cluster_addrs=()
    for i in 0 1 2 3 4 5; do
        name="redis-c$((i + 1))"
        wait_ready "$name" "$(recorded_pid "$name")" "$STATE_DIR/$name/log" redis_ping "${cluster_ports[$i]}"
        cluster_addrs+=("127.0.0.1:${cluster_ports[$i]}")
    done
    redis-cli --cluster create "${cluster_addrs[@]}" --cluster-replicas 1 --cluster-yes \
        </dev/null >"$create_log" 2>&1 &
    local create_pid=$!

    wait "$pg_init" || die "PostgreSQL initialisation failed"
    start_postgres "$pg_port"
    wait "$my_init" || die "MariaDB initialisation failed"
    start_mariadb "$my_port"
    local t_launch=$(($(now_ms) - t_phase))

    t_phase="$(now_ms)"
    local pid sig start
    while read -r name pid sig start; do
        case "$name" in
        redis) wait_ready "$name" "$pid" "$STATE_DIR/$name/log" redis_ping "$redis_port" ;;
        redlock*) wait_ready "$name" "$pid" "$STATE_DIR/$name/log" redis_ping "${redlock_ports[${name#redlock} - 1]}" ;;
        redis-s-master) wait_ready "$name" "$pid" "$STATE_DIR/$name/log" redis_ping "$smaster_port" ;;
        redis-s-replica) wait_ready "$name" "$pid" "$STATE_DIR/$name/log" redis_ping "$sreplica_port" ;;
        sentinel*) wait_ready "$name" "$pid" "$STATE_DIR/$name/log" redis_ping "${sentinel_ports[${name#sentinel} - 1]}" ;;
        postgres)
            wait_ready postgres "$pid" "$STATE_DIR/postgres/log" \
                pg_isready -q -h 127.0.0.1 -p "$pg_port"
            pg_setup "$pg_port" || die "PostgreSQL role/database setup failed"
            wait_ready postgres "$pid" "$STATE_DIR/postgres/log" pg_app_ready "$pg_port"
            ;;
        mariadb)
            wait_ready mariadb "$pid" "$STATE_DIR/mariadb/log" mariadb_root_ready
            mariadb_setup || die "MariaDB user/database setup failed"
            wait_ready mariadb "$pid" "$STATE_DIR/mariadb/log" mariadb_app_ready "$my_port"
            ;;
        etcd) wait_ready etcd "$pid" "$STATE_DIR/etcd/log" etcd_healthy "http://127.0.0.1:$etcd_c" ;;
        etcd-c*)
            local n=${name#etcd-c}
            wait_ready "$name" "$pid" "$STATE_DIR/$name/log" etcd_healthy "http://127.0.0.1:${ec_c[$((n - 1))]}"
            ;;
        zookeeper) wait_ready "$name" "$pid" "$STATE_DIR/$name/log" zk_serving "$zk_port" ;;
        zookeeper-c*)
            local n=${name#zookeeper-c}
            wait_ready "$name" "$pid" "$STATE_DIR/$name/log" zk_serving "${zc_c[$((n - 1))]}"
            t_zk_ready=$(($(now_ms) - t_zk))
            ;;
        esac
    done < <(cat "$PIDS_FILE")

    wait "$create_pid" || {
        tail_log "$create_log"
        die "creating the Redis Cluster (redis-cli --cluster create) failed; see $create_log"
    }
    for i in 0 1 2 3 4 5; do
        name="redis-c$((i + 1))"
        wait_ready "$name" "$(recorded_pid "$name")" "$STATE_DIR/$name/log" cluster_ok "${cluster_ports[$i]}"
    done
    # Slower to come: the sentinels find each other through hello messages sent every 2 s.
    pid="$(recorded_pid redis-s-replica)"
    wait_ready redis-s-replica "$pid" "$STATE_DIR/redis-s-replica/log" \
        redis_info_has "$smaster_port" INFO replication connected_slaves:1
    wait_ready redis-s-replica "$pid" "$STATE_DIR/redis-s-replica/log" \
        redis_info_has "$sreplica_port" INFO replication master_link_status:up
    for i in 0 1 2; do
        name="sentinel$((i + 1))"
        wait_ready "$name" "$(recorded_pid "$name")" "$STATE_DIR/$name/log" \
            sentinel_ready "${sentinel_ports[$i]}" "$smaster_port"
    done
    local t_ready=$(($(now_ms) - t_phase))

    local redlock_urls=""
    for i in 0 1 2 3 4; do
        redlock_urls+="${redlock_urls:+ }redis://127.0.0.1:${redlock_ports[$i]}/"
    done
    local sentinel_addrs="127.0.0.1:${sentinel_ports[0]},127.0.0.1:${sentinel_ports[1]},127.0.0.1:${sentinel_ports[2]}"
    local tmp="$ENV_FILE.tmp.$$"
    cat >"$tmp" <<EOF
# Written by scripts/servers.sh start at $(date -u +%Y-%m-%dT%H:%M:%SZ); source this file.
export DISTLOCK_TEST_REDIS_URL='redis://127.0.0.1:$redis_port/'
export DISTLOCK_TEST_REDLOCK_URLS='$redlock_urls'
export DISTLOCK_TEST_REDIS_CLUSTER_URL='redis+cluster://${cluster_addrs[0]},${cluster_addrs[1]},${cluster_addrs[2]}/'
export DISTLOCK_TEST_REDIS_CLUSTER_PORTS='${cluster_ports[*]}'
export DISTLOCK_TEST_REDIS_SENTINEL_URL='redis+sentinel://$sentinel_addrs/$SENTINEL_MASTER_NAME'
export DISTLOCK_TEST_REDIS_SENTINEL_PORTS='${sentinel_ports[*]}'
export DISTLOCK_TEST_REDIS_SENTINEL_MASTER_PORT='$smaster_port'
export DISTLOCK_TEST_REDIS_SENTINEL_REPLICA_PORT='$sreplica_port'
export DISTLOCK_TEST_POSTGRES_URL='postgres://distlock:distlock@127.0.0.1:$pg_port/distlock'
export DISTLOCK_TEST_MYSQL_URL='mysql://distlock:distlock@127.0.0.1:$my_port/distlock'
export DISTLOCK_TEST_ETCD_URL='etcd://127.0.0.1:$etcd_c'
export DISTLOCK_TEST_ETCD_CLUSTER_URL='etcd://127.0.0.1:${ec_c[0]},127.0.0.1:${ec_c[1]},127.0.0.1:${ec_c[2]}'
export DISTLOCK_REDIS_SERVER_BIN='$(command -v redis-server)'
export DISTLOCK_PG_BIN_DIR='$PG_BIN_DIR'
export DISTLOCK_MARIADBD_BIN='$(command -v mariadbd)'
export DISTLOCK_TEST_ZK_URL='zk://127.0.0.1:$zk_port'
export DISTLOCK_TEST_ZK_CLUSTER_URL='zk://127.0.0.1:${zc_c[0]},127.0.0.1:${zc_c[1]},127.0.0.1:${zc_c[2]}'
export DISTLOCK_TEST_ZK_CLUSTER_PORTS='${zc_c[*]}'
export DISTLOCK_ETCD_BIN='$(command -v etcd)'
export DISTLOCK_ZK_JAR='$ZK_JAR'
EOF
    mv "$tmp" "$ENV_FILE"
    trap - EXIT
    log "started $(wc -l <"$PIDS_FILE") servers in $(($(now_ms) - t0)) ms" \
        "(packages check ${t_pkgs} ms, launch ${t_launch} ms, readiness ${t_ready} ms;" \
        "the ZooKeeper servers served ${t_zk_ready} ms after their start)"
    log "env file: $ENV_FILE"
}

cmd_status() {
    if [[ ! -f "$PIDS_FILE" ]]; then
        echo "no servers recorded in $STATE_DIR"
        return 0
    fi
    local name pid sig start all_up=0
    while read -r name pid sig start; do
        if pid_alive "$pid" "$start"; then
            printf '%-16s pid %-8s up\n' "$name" "$pid"
        else
            printf '%-16s pid %-8s DOWN\n' "$name" "$pid"
            all_up=1
        fi
    done <"$PIDS_FILE"
    [[ -f "$ENV_FILE" ]] && grep '^export DISTLOCK_TEST_' "$ENV_FILE"
    return "$all_up"
}

case "${1:-}" in
start) cmd_start ;;
stop) stop_all ;;
status) cmd_status ;;
*)
    echo "usage: $0 start|stop|status" >&2
    exit 2
    ;;
esac
