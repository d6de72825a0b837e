# shellcheck shell=bash
# Functions for scripts that need a throwaway PostgreSQL server on 127.0.0.1 (bench/*.sh,
# contrib/demo.sh). Source this file; it defines functions and the AS_POSTGRES array, and
# changes nothing by itself.
#
# When run as root, PostgreSQL's programs (and PgBouncer) run as the `postgres` OS user,
# because they refuse to run as root.

# Prints a message on stderr and exits.
die() {
    echo "error: $*" >&2
    exit 1
}

is_root() {
    [ "$(id -u)" = 0 ]
}

# The words that run a command as the postgres OS user when we are root (empty otherwise).
# setpriv executes the program in place, with no process in between, so after
# `"${AS_POSTGRES[@]}" prog &` the pid in "$!" is the program's own.
AS_POSTGRES=()
if is_root; then AS_POSTGRES=(setpriv --reuid=postgres --regid=postgres --init-groups --); fi

# Runs a command as the postgres OS user when we are root, as ourselves otherwise.
as_postgres() {
    "${AS_POSTGRES[@]}" "$@"
}

# Installs the Debian packages named in the arguments, without letting their maintainer scripts
# start services (a policy-rc.d that denies starts is put in place if there is none).
apt_install() {
    is_root || die "missing packages ($*): install them, or run this script as root"
    local guard=/usr/sbin/policy-rc.d placed=""
    if [ ! -e "$guard" ]; then
        printf '#!/bin/sh\nexit 101\n' >"$guard" && chmod 755 "$guard" && placed=1
    fi
    local rc=0
    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
        --no-install-recommends "$@" || rc=$?
    if [ -n "$placed" ]; then rm -f "$guard"; fi
    return "$rc"
}

# The directory of the newest installed PostgreSQL server programs ($PG_BINDIR wins).
pg_bindir() {
    if [ -n "${PG_BINDIR:-}" ]; then
        echo "$PG_BINDIR"
        return
    fi
    local dir
    dir=$(find /usr/lib/postgresql -mindepth 3 -maxdepth 3 -path '*/bin/initdb' 2>/dev/null |
        sort -V | tail -n 1)
    [ -n "$dir" ] || return 1
    dirname "$dir"
}

# Installs a PostgreSQL server and client (psql, pgbench) unless both are already there.
ensure_postgres() {
    local missing=()
    pg_bindir >/dev/null || missing+=(postgresql)
    { command -v psql && command -v pgbench; } >/dev/null || missing+=(postgresql-client)
    if [ "${#missing[@]}" -gt 0 ]; then apt_install "${missing[@]}"; fi
    pg_bindir >/dev/null || die "no PostgreSQL server programs under /usr/lib/postgresql"
}

# Installs PgBouncer from Debian if missing, and keeps the package's own service stopped.
ensure_pgbouncer() {
    command -v pgbouncer >/dev/null && return 0
    apt_install pgbouncer
    if command -v systemctl >/dev/null; then
        systemctl stop pgbouncer >/dev/null 2>&1 || true
        systemctl disable pgbouncer >/dev/null 2>&1 || true
    fi
    if [ -f /var/run/postgresql/pgbouncer.pid ]; then
        kill "$(cat /var/run/postgresql/pgbouncer.pid)" 2>/dev/null || true
    fi
}

# pgward_binary: prints the pgward to run: $PGWARD_BIN if set, else one built with
# `cargo build --release` in the current directory (a checkout of pgward).
pgward_binary() {
    if [ -n "${PGWARD_BIN:-}" ]; then
        echo "$PGWARD_BIN"
        return
    fi
    echo "building pgward (cargo build --release)" >&2
    cargo build --release --quiet >&2
    echo "$(pwd)/target/release/pgward"
}

# pooler_ini DIR PG_PORT PORT POOL_SIZE AUTH_TYPE [AUTH_FILE]: the pgbouncer.ini the benchmarks
# give PgBouncer and pgward alike: the database `bench` of the server on PG_PORT, transaction
# pooling, listening on PORT, with its socket, log and pid file in DIR.
pooler_ini() {
    cat <<EOF
[databases]
bench = host=127.0.0.1 port=$2 dbname=bench

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $3
unix_socket_dir = $1
logfile = $1/pooler.log
pidfile = $1/pooler.pid
auth_type = $5
pool_mode = transaction
default_pool_size = $4
max_client_conn = 200
EOF
    if [ -n "${6:-}" ]; then echo "auth_file = $6"; fi
}

# pooler_start NAME DIR PORT PROGRAM: runs `PROGRAM DIR/pooler.ini` in the background as the
# postgres OS user (who gets DIR), its output in DIR/stdout.log, and records its pid and port
# under NAME in the caller's associative arrays pooler_pid and pooler_port. Fails, after
# printing the last lines of its logs, when nothing listens on PORT within 10 s.
# shellcheck disable=SC2004,SC2034 # the arrays are the caller's, associative
pooler_start() {
    local name=$1 dir=$2 port=$3
    if is_root; then chown -R postgres: "$dir"; fi
    "${AS_POSTGRES[@]}" "$4" "$dir/pooler.ini" >"$dir/stdout.log" 2>&1 &
    pooler_pid[$name]=$!
    pooler_port[$name]=$port
    if ! wait_for_port "$port" 10; then
        tail -n 20 "$dir/stdout.log" "$dir/pooler.log" 2>/dev/null >&2 || true
        return 1
    fi
    echo "$name listening on port $port (pid ${pooler_pid[$name]})"
}

# check_choices WHAT "ALLOWED..." VALUE...: dies naming the first VALUE that is not one of the
# space-separated ALLOWED words ("unknown WHAT: VALUE").
check_choices() {
    local what=$1 allowed=" $2 " value
    shift 2
    for value in "$@"; do
        [[ $allowed == *" $value "* ]] || die "unknown $what: $value"
    done
}

# cpu_ticks PID: the user and the system CPU time a process has used so far, in clock ticks,
# as "USER SYSTEM".
cpu_ticks() {
    local stat
    stat=$(cat "/proc/$1/stat") || die "process $1 is gone"
    # Fields after the command name, which is in parentheses and may contain spaces.
    read -r -a rest <<<"${stat##*) }"
    echo "${rest[11]} ${rest[12]}"
}

# us_per_tx TICKS TRANSACTIONS: clock ticks as microseconds per transaction.
us_per_tx() {
    awk -v d="$1" -v hz="$(getconf CLK_TCK)" -v n="$2" \
        'BEGIN {printf "%.2f", (n > 0 ? d * 1e6 / hz / n : 0)}'
}

# pgbench_select MODE PORT PID WHAT: one select-only pgbench run (-M MODE, the caller's
# $clients, $jobs and $seconds) through the pooler on PORT whose process is PID; prints
# "TPS LATENCY_MS TRANSACTIONS CPU_US_PER_TX" (the pooler's CPU time). Fails naming WHAT when
# pgbench fails: callers take its output into a variable first (`run=$(...)`), so that the
# failure of the command substitution stops them (set -e).
pgbench_select() {
    local out tps lat tx before after
    read -r -a before <<<"$(cpu_ticks "$3")"
    out=$(pgbench -n -S -M "$1" -c "$clients" -j "$jobs" -T "$seconds" \
        -h 127.0.0.1 -p "$2" -U bench bench 2>&1) ||
        die "$4: pgbench failed: $(echo "$out" | tail -n 5)"
    read -r -a after <<<"$(cpu_ticks "$3")"
    tps=$(echo "$out" | awk '/^tps = / && /(without initial connection|excluding connections)/ {print $3; exit}')
    [ -n "$tps" ] || tps=$(echo "$out" | awk '/^tps = / {v=$3} END {print v}')
    lat=$(echo "$out" | awk '/^latency average/ {print $4; exit}')
    tx=$(echo "$out" | awk -F': ' '/number of transactions actually processed/ {split($2, a, "/"); print a[1]; exit}')
    [ -n "$tps" ] && [ -n "$lat" ] && [ -n "$tx" ] ||
        die "$4: pgbench said no tps, latency or transactions: $(echo "$out" | tail -n 5)"
    echo "$tps $lat $tx $(us_per_tx $((after[0] + after[1] - before[0] - before[1])) "$tx")"
}

# pooler_stop NAME: stops the pooler pooler_start recorded under NAME, if it runs.
pooler_stop() {
    local pid=${pooler_pid[$1]:-}
    [ -n "$pid" ] || return 0
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    unset "pooler_pid[$1]"
}

# rules_policy: the policy of bench/rules.sh: every rule, applying to the bench role; the
# learned allowlist records what the role runs.
rules_policy() {
    cat <<'EOF'
unchecked = "reject"
trusted_roles = []

[[rules]]
rule = "deny_ddl"

[[rules]]
rule = "require_where"

[[rules]]
rule = "index_concurrently"

[[rules]]
rule = "schema_allowlist"
schemas = ["public"]

[[rules]]
rule = "deny_functions"

[[rules]]
rule = "read_only"

[allowlist]
file = "allowlist.json"
roles = { bench = "learn" }
EOF
}

# callgrind_wrapper DIR PROGRAM: writes DIR/under-callgrind, which runs PROGRAM (with its
# arguments) under callgrind, its counts dumped to DIR/callgrind.<pid>.*; prints its path.
callgrind_wrapper() {
    printf '#!/bin/sh\nexec valgrind --tool=callgrind --callgrind-out-file=%s/callgrind.%%p %s "$@"\n' \
        "$1" "$2" >"$1/under-callgrind"
    chmod 755 "$1/under-callgrind"
    echo "$1/under-callgrind"
}

# callgrind_per_tx DIR PID N: the instructions in the last dump of process PID in DIR, per
# transaction of N.
callgrind_per_tx() {
    local dump total
    dump=$(find "$1" -name "callgrind.$2.*" | sort | tail -n 1)
    [ -n "$dump" ] || die "no callgrind dump of process $2 in $1"
    total=$(awk '/^(summary|totals):/ {print $2; exit}' "$dump")
    awk -v t="$total" -v n="$3" 'BEGIN {printf "%.0f", t / n}'
}

# pooler_stop_all: stops every pooler pooler_start recorded (done when the script exits).
pooler_stop_all() {
    local name
    for name in "${!pooler_pid[@]}"; do pooler_stop "$name"; done
}

# Succeeds when something accepts TCP connections on 127.0.0.1:$1.
port_in_use() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# Prints a TCP port on 127.0.0.1 that nothing listens on (outside the kernel's ephemeral range).
free_port() {
    local port tries
    for tries in $(seq 1 200); do
        port=$((20000 + RANDOM % 12000))
        if ! port_in_use "$port"; then
            echo "$port"
            return 0
        fi
    done
    die "no free TCP port after $tries tries"
}

# Waits up to $2 seconds (default 10) until 127.0.0.1:$1 accepts connections.
wait_for_port() {
    local deadline=$((SECONDS + ${2:-10}))
    until port_in_use "$1"; do
        [ "$SECONDS" -lt "$deadline" ] || return 1
        sleep 0.1
    done
}

# Makes a temporary directory that the postgres OS user owns (when we are root); prints it.
make_workdir() {
    local dir
    dir=$(mktemp -d "${TMPDIR:-/tmp}/$1.XXXXXX") || die "mktemp failed"
    chmod 755 "$dir"
    if is_root; then chown postgres: "$dir"; fi
    echo "$dir"
}

# pg_create DIR PORT MAX_CONNECTIONS HBA_LINE
# Creates a cluster in DIR/data that trusts local sockets and the postgres superuser on
# 127.0.0.1, authenticates other TCP logins by HBA_LINE, and starts it; its log is
# DIR/postgres.log.
pg_create() {
    local dir=$1 port=$2 max_conn=$3 hba_line=$4 bindir
    bindir=$(pg_bindir) || die "no PostgreSQL server programs found"
    as_postgres "$bindir/initdb" -D "$dir/data" -A trust --username=postgres -E UTF8 \
        --locale=C --no-sync >"$dir/initdb.log" 2>&1 ||
        die "initdb failed: $(cat "$dir/initdb.log")"
    cat >>"$dir/data/postgresql.conf" <<EOF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$dir'
max_connections = $max_conn
fsync = off
synchronous_commit = off
full_page_writes = off
shared_buffers = 128MB
password_encryption = 'scram-sha-256'
EOF
    printf 'local all all trust\nhost all postgres 127.0.0.1/32 trust\n%s\n' \
        "$hba_line" >"$dir/data/pg_hba.conf"
    as_postgres "$bindir/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w -t 60 start \
        >/dev/null || die "PostgreSQL did not start: $(tail -n 20 "$dir/postgres.log")"
}

# pg_destroy DIR: stops the cluster in DIR/data if it runs.
pg_destroy() {
    local bindir
    bindir=$(pg_bindir) || return 0
    if [ -f "$1/data/postmaster.pid" ]; then
        as_postgres "$bindir/pg_ctl" -D "$1/data" -m fast -w stop >/dev/null 2>&1 || true
    fi
}

# pg_sql PORT DB SQL: runs SQL as the postgres superuser over TCP.
pg_sql() {
    psql -X -q -w -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$1" -U postgres -d "$2" -c "$3" >/dev/null
}

# throwaway_start NAME HBA_LINE ROLE PASSWORD
# Makes a work directory (THROWAWAY_DIR), starts PostgreSQL there on THROWAWAY_PORT with
# max_connections 100, and creates ROLE with PASSWORD and a database of the same name that ROLE
# owns. Everything is stopped and removed when the script exits, after the caller's function
# on_cleanup runs, if it has one, and the poolers pooler_start started are stopped.
throwaway_start() {
    THROWAWAY_DIR=$(make_workdir "$1")
    trap throwaway_cleanup EXIT
    trap 'exit 130' INT TERM
    THROWAWAY_PORT=$(free_port)
    pg_create "$THROWAWAY_DIR" "$THROWAWAY_PORT" 100 "$2"
    pg_sql "$THROWAWAY_PORT" postgres "CREATE ROLE $3 LOGIN PASSWORD '${4//\'/\'\'}'"
    pg_sql "$THROWAWAY_PORT" postgres "CREATE DATABASE $3 OWNER $3"
}

# shellcheck disable=SC2317 # called by the EXIT trap
throwaway_cleanup() {
    trap - EXIT INT TERM
    set +e
    if declare -F on_cleanup >/dev/null; then on_cleanup; fi
    if declare -p pooler_pid >/dev/null 2>&1; then pooler_stop_all; fi
    pg_destroy "$THROWAWAY_DIR"
    rm -rf "$THROWAWAY_DIR"
}
