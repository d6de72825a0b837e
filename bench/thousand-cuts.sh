#!/usr/bin/env bash
# The thousand-cuts benchmark: many tenants each run moderately heavy aggregates as fast as they
# can, together far more work than the server can do, while one latency-sensitive tenant looks
# rows up at a fixed rate, through direct PostgreSQL, PgBouncer, and pgward with an adaptive fast
# lane and with a fixed one (see bench/README.md).
#
# usage: bench/thousand-cuts.sh
# environment:
#   TARGETS               targets to run, default "direct pgbouncer pgward pgward-fixed"
#   ROUNDS                rounds (each target once per round, in rotating order), default 3
#   PGWARD_BENCH_SECONDS  length of one run, default 20
#   TENANTS               heavy tenants (t1, t2, ...), 2 connections each, default 8
#   STMT_MS               how long one heavy statement should take on its own, default 40
#   MID_ROWS              rows of the table (default: sized to STMT_MS by measuring)
#   LOOKUP_RATE           lookups per second of each of the 2 lookup connections, default 50
#   POOL_SIZE             default_pool_size of both poolers, default 8
#   AUTH_TYPE             auth_type of both poolers: md5 (default) or trust
#   PGWARD_GATE           the lines of the [gate] table of pgward's policy, default
#                         "adaptive = true", "max_active = 8", "min_active = 2" (one a line)
#   PGWARD_FIXED_GATE     the [gate] lines of target pgward-fixed, default "max_active = 8"
#   PGWARD_BIN            the pgward to run (default: built with cargo build --release)
set -euo pipefail

cd "$(dirname "$0")/.."
# shellcheck source=bench/throwaway-pg.sh
. bench/throwaway-pg.sh

read -r -a targets <<<"${TARGETS:-direct pgbouncer pgward pgward-fixed}"
rounds=${ROUNDS:-3}
seconds=${PGWARD_BENCH_SECONDS:-20}
tenant_count=${TENANTS:-8}
stmt_ms=${STMT_MS:-40}
lookup_rate=${LOOKUP_RATE:-50}
pool_size=${POOL_SIZE:-8}
auth_type=${AUTH_TYPE:-md5}
gate=${PGWARD_GATE:-$'adaptive = true\nmax_active = 8\nmin_active = 2'}
fixed_gate=${PGWARD_FIXED_GATE:-max_active = 8}
password=benchpass
clients=2

check_choices target "direct pgbouncer pgward pgward-fixed" "${targets[@]}"
[[ $tenant_count =~ ^[1-9][0-9]*$ ]] || die "TENANTS must be a positive number"
[[ $seconds =~ ^[1-9][0-9]*$ ]] || die "PGWARD_BENCH_SECONDS must be a positive number"
heavies=()
for i in $(seq 1 "$tenant_count"); do heavies+=("t$i"); done

has_target() {
    [[ " ${targets[*]} " == *" $1 "* ]]
}

ensure_postgres
if has_target pgbouncer; then ensure_pgbouncer; fi
if has_target pgward || has_target pgward-fixed; then pgward_bin=$(pgward_binary); fi

# The poolers that pooler_start runs (stopped when the script exits).
# shellcheck disable=SC2034 # pooler_pid is for pooler_start and pooler_stop
declare -A pooler_pid=() pooler_port=()

# --- PostgreSQL and the data ------------------------------------------------------------------
throwaway_start pgward-thousand-cuts "host all all 127.0.0.1/32 trust" bench "$password"
work=$THROWAWAY_DIR
pg_port=$THROWAWAY_PORT
mkdir -p "$work/scripts"

# sql QUERY: runs QUERY in the bench database as the postgres superuser; prints the rows.
sql() {
    psql -X -q -w -At -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$pg_port" -U postgres -d bench -c "$1"
}

pg_sql "$pg_port" postgres "CREATE ROLE app LOGIN PASSWORD '$password'"

# make_mid ROWS: (re)creates the table, ROWS rows of about 80 bytes each in id order.
make_mid() {
    sql "SET client_min_messages = warning;
         DROP TABLE IF EXISTS mid;
         CREATE TABLE mid (id int PRIMARY KEY, val int NOT NULL, pad text NOT NULL)
             WITH (autovacuum_enabled = off);
         INSERT INTO mid SELECT g, g % 997, md5(g::text) || md5((-g)::text)
             FROM generate_series(1, $1) g;
         GRANT SELECT ON mid TO app" >/dev/null
    sql "VACUUM (FREEZE, ANALYZE) mid" >/dev/null
}

# heavy_script ROWS TENANT: a heavy tenant's pgbench script: an aggregate over a quarter of the
# table, at a random place.
heavy_script() {
    local span=$(($1 / 4))
    printf '\\set lo random(1, %s)\n' $(($1 - span + 1))
    printf "select count(*), sum(length(pad)), avg(val) from mid where id between :lo and :lo + %s /*tenant='%s'*/;\n" \
        $((span - 1)) "$2"
}

# measure_stmt: milliseconds of one heavy statement on its own (the median of 5, after one to
# warm up; the median, since other work on the machine can slow any one statement down).
measure_stmt() {
    local file="$work/scripts/one.sql" out
    heavy_script "$mid_rows" t1 >"$file"
    rm -f "$work"/one.log*
    out=$(PGPASSWORD=$password pgbench -n -f "$file" -t 1 -h 127.0.0.1 -p "$pg_port" -U app bench 2>&1 &&
        PGPASSWORD=$password pgbench -n -f "$file" -t 5 -l --log-prefix="$work/one.log" \
            -h 127.0.0.1 -p "$pg_port" -U app bench 2>&1) || die "the heavy statement failed: $out"
    cat "$work"/one.log* | awk '{print $3}' | sort -n | awk '{v[NR] = $1}
        END {printf "%.1f\n", v[int((NR + 1) / 2)] / 1000}'
}

# Sizes the table so that one heavy statement takes about STMT_MS: measure, scale, measure again.
mid_rows=${MID_ROWS:-1000000}
echo "loading the table: $mid_rows rows"
make_mid "$mid_rows"
one_ms=$(measure_stmt)
if [ -z "${MID_ROWS:-}" ]; then
    for _ in 1 2 3; do
        next=$(awk -v r="$mid_rows" -v got="$one_ms" -v want="$stmt_ms" 'BEGIN {
            f = want / got; if (f > 0.85 && f < 1.15) { print ""; exit }
            if (f > 8) f = 8; if (f < 0.125) f = 0.125
            n = int(r * f / 50000 + 0.5) * 50000; print (n < 50000 ? 50000 : n) }')
        if [ -z "$next" ] || [ "$next" = "$mid_rows" ]; then break; fi
        echo "one statement over $mid_rows rows took $one_ms ms; resizing to $next rows"
        mid_rows=$next
        make_mid "$mid_rows"
        one_ms=$(measure_stmt)
    done
fi
mid_mb=$(sql "SELECT round(pg_table_size('mid') / 1048576.0)")
echo "table: $mid_rows rows, $mid_mb MB; one heavy statement alone: $one_ms ms"

# --- pgbench scripts --------------------------------------------------------------------------
for tenant in "${heavies[@]}"; do heavy_script "$mid_rows" "$tenant" >"$work/scripts/$tenant.sql"; done
lookup_sql="select pad from mid where id = :id /*tenant='lookups'*/"
printf '\\set id random(1, %s)\n%s;\n' "$mid_rows" "$lookup_sql" >"$work/scripts/lookups.sql"

# --- poolers ----------------------------------------------------------------------------------
printf '"%s" "%s"\n' bench "$password" app "$password" >"$work/userlist.txt"

# policy GATE: pgward's policy with the [gate] lines GATE. Every tenant logs in as the trusted
# role `app`, and each statement's tag names its tenant; the lookups are critical, the heavy
# tenants normal, none has a budget.
policy() {
    local tenant
    printf 'trusted_roles = ["app"]\n\n[gate]\n%s\n' "$1"
    printf '\n[tenants.lookups]\npriority = "critical"\n'
    for tenant in "${heavies[@]}"; do printf '\n[tenants.%s]\npriority = "normal"\n' "$tenant"; done
}

# start_pooler NAME PROGRAM [POLICY]: the same settings for both poolers; only the paths, port
# and pgward's policy file differ.
start_pooler() {
    local dir="$work/$1" port
    port=$(free_port)
    mkdir -p "$dir"
    pooler_ini "$dir" "$pg_port" "$port" "$pool_size" "$auth_type" "$work/userlist.txt" \
        >"$dir/pooler.ini"
    if [ -n "${3:-}" ]; then echo "policy_file = $3" >>"$dir/pooler.ini"; fi
    : >"$dir/pooler.log"
    pooler_start "$1" "$dir" "$port" "$2" || { pooler_stop "$1"; return 1; }
}

if has_target pgbouncer; then
    start_pooler pgbouncer "$(command -v pgbouncer)" || die "pgbouncer did not start"
fi
# start_pgward NAME GATE: pgward as target NAME with the [gate] lines GATE.
start_pgward() {
    # A copy, since the postgres OS user may not reach the source tree (under /root, say).
    install -m 755 "$pgward_bin" "$work/pgward-bin"
    mkdir -p "$work/$1"
    policy "$2" >"$work/$1/policy.toml"
    start_pooler "$1" "$work/pgward-bin" "$work/$1/policy.toml" ||
        die "$1 did not start with the policy (a pgward without these [gate] keys may take" \
            "PGWARD_GATE='max_active = 8'): $(sed -n 's/.*\.toml:[0-9]*: //p' \
            "$work/$1/stdout.log" "$work/$1/pooler.log" 2>/dev/null | head -n 1 | cut -c 1-200)"
}

if has_target pgward; then start_pgward pgward "$gate"; fi
if has_target pgward-fixed; then start_pgward pgward-fixed "$fixed_gate"; fi

target_port() {
    if [ "$1" = direct ]; then echo "$pg_port"; else echo "${pooler_port[$1]}"; fi
}

# --- runs -------------------------------------------------------------------------------------
# connection TENANT N PORT DIR START [pgbench options...]: one connection of a tenant, a pgbench
# of one client in the background until START + the run's length. pgbench ends a client at its
# first error (such as pgward's 53000 when it refuses a statement), so the connection starts a
# new pgbench for the time left, after a pause of 0.1 s, and counts the error in DIR/errors.
# Each pgbench logs every statement it completed (-l) to DIR/log/TENANT-N.<pid>, its output
# appended to DIR/TENANT-N.out.
connection() {
    local tenant=$1 n=$2 port=$3 dir=$4 start=$5 left
    shift 5
    (
        left=$seconds
        while [ "$left" -ge 1 ]; do
            PGPASSWORD=$password pgbench -n -f "$work/scripts/$tenant.sql" -c 1 -j 1 -T "$left" \
                -l --log-prefix="$dir/log/$tenant-$n" -h 127.0.0.1 -p "$port" -U app "$@" bench \
                >>"$dir/$tenant-$n.out" 2>&1 && break
            echo "$tenant-$n" >>"$dir/errors"
            sleep 0.1
            left=$(awk -v s="$start" -v t="$(date +%s.%N)" -v n="$seconds" 'BEGIN {print int(s + n - t)}')
        done
    ) &
}

# run TARGET DIR: every tenant at once for one run; returns when every pgbench has ended.
run() {
    local target=$1 dir=$2 port tenant n start pids=() pid left
    port=$(target_port "$target")
    mkdir -p "$dir/log"
    : >"$dir/errors"
    start=$(date +%s.%N)
    echo "$start" >"$dir/start"
    for n in $(seq 1 "$clients"); do
        connection lookups "$n" "$port" "$dir" "$start" -R "$lookup_rate"
        pids+=($!)
        for tenant in "${heavies[@]}"; do
            connection "$tenant" "$n" "$port" "$dir" "$start"
            pids+=($!)
        done
    done
    for pid in "${pids[@]}"; do wait "$pid" || true; done
    # No statement may spill into the next run.
    for _ in $(seq 1 100); do
        left=$(sql "SET client_min_messages = error;
                    SELECT count(pg_cancel_backend(pid)) FROM pg_stat_activity
                    WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()
                      AND state = 'active' AND query LIKE '%from mid%'")
        [ "$left" = 0 ] && return 0
        sleep 0.1
    done
    echo "warning: statements still running after the run" >&2
}

# within DIR FILES...: the log lines of FILES for statements completed during the run.
within() {
    local dir=$1
    shift
    { cat "$@" 2>/dev/null || true; } | awk -v start="$(cat "$dir/start")" -v n="$seconds" \
        '{t = $5 + $6 / 1e6} t >= start && t <= start + n'
}

# lookup_stats DIR: "p50_ms p99_ms per_second" of the lookups completed during the run (with -R,
# pgbench counts a lookup's latency from when it was due).
lookup_stats() {
    within "$1" "$1"/log/lookups-* | awk '{print $3}' | sort -n | awk -v s="$seconds" '
        function rank(p,    i) { i = int(NR * p); if (i < NR * p) i++; return v[i] / 1000 }
        { v[NR] = $1 }
        END { if (NR == 0) print "- - 0"; else printf "%.3f %.3f %.1f\n", rank(0.5), rank(0.99), NR / s }'
}

# heavy_per_second DIR: heavy statements completed during the run, per second.
heavy_per_second() {
    local files=() tenant
    for tenant in "${heavies[@]}"; do files+=("$1"/log/"$tenant"-*); done
    within "$1" "${files[@]}" | awk -v s="$seconds" 'END {printf "%.1f\n", NR / s}'
}

mkdir -p bench/results
stamp=$(date -u +%Y%m%dT%H%M%SZ)
tsv="bench/results/thousand-cuts-$stamp.tsv"
report="bench/results/thousand-cuts-$stamp.md"
printf 'target\tround\tlookup_p50_ms\tlookup_p99_ms\tlookups_per_s\theavy_per_s\terrors\trefused\n' >"$tsv"
failures=0

# run_once TARGET ROUND: one run; appends a line to the TSV.
run_once() {
    local target=$1 round=$2 dir="$work/runs/$1-$2" lookups heavy errors refused
    run "$target" "$dir"
    read -r -a lookups <<<"$(lookup_stats "$dir")"
    heavy=$(heavy_per_second "$dir")
    errors=$(wc -l <"$dir/errors")
    refused=$(cat "$dir"/*.out | grep -cE 'aborted.*pgward:' || true)
    if [ "${lookups[2]}" = 0 ]; then
        echo "round $round $target: no lookup completed:" >&2
        tail -n 3 "$dir"/*.out >&2 || true
        failures=$((failures + 1))
        return 0
    fi
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$target" "$round" "${lookups[@]}" "$heavy" \
        "$errors" "$refused" >>"$tsv"
    printf 'round %s  %-9s  lookups p50 %7.3f  p99 %8.3f ms  %5.1f/s   heavy %6.1f/s   errors %s (refused %s)\n' \
        "$round" "$target" "${lookups[@]}" "$heavy" "$errors" "$refused"
}

echo "each run: ${seconds}s; ${#heavies[@]} heavy tenants x $clients connections, as fast as" \
    "they can; lookups $clients x $lookup_rate/s; pool size $pool_size; rounds $rounds;" \
    "targets: ${targets[*]}"
for round in $(seq 1 "$rounds"); do
    n=${#targets[@]}
    for i in $(seq 0 $((n - 1))); do
        run_once "${targets[$(((i + round - 1) % n))]}" "$round"
    done
done

# --- summary ----------------------------------------------------------------------------------
summarize() {
    echo "# pgward thousand-cuts benchmark, $stamp"
    echo
    echo "${#heavies[@]} heavy tenants (\`t1\` to \`t${#heavies[@]}\`), $clients connections each," \
        "run an aggregate over a quarter of a table at a random place, as fast as they can" \
        "(\`select count(*), sum(length(pad)), avg(val) from mid where id between ...\`: $mid_rows" \
        "rows, $mid_mb MB; one statement alone $one_ms ms), while the \`lookups\` tenant looks rows" \
        "up by primary key on $clients connections at $lookup_rate per second each (pgbench -R:" \
        "latency counts from when a lookup was due). Every tenant logs in as \`app\` and tags its" \
        "statements (\`/*tenant='t1'*/\`). ${seconds}s per run, $rounds rounds, targets in turn;" \
        "poolers in transaction mode with default_pool_size $pool_size; PostgreSQL" \
        "$(sql 'SHOW server_version'), $(nproc) cores."
    echo
    echo "Medians over rounds; heavy/s = heavy statements completed per second, all tenants;" \
        "errors = statements that failed (pgbench ends the client; its connection starts again)," \
        "summed over rounds; refused = those of them that pgward refused."
    [ "$failures" = 0 ] || { echo; echo "**$failures run(s) failed and are left out.**"; }
    echo
    echo "| target | lookups p50 ms | lookups p99 ms | lookups/s | heavy/s | errors | refused |"
    echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
    awk -F'\t' -v table=medians -f bench/median.awk -f bench/thousand-cuts.awk "$tsv"
    echo
    echo "Each round:"
    echo
    echo "| round | target | lookups p50 ms | lookups p99 ms | lookups/s | heavy/s | errors | refused |"
    echo "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"
    awk -F'\t' -v table=rounds -f bench/median.awk -f bench/thousand-cuts.awk "$tsv"
    if has_target pgward; then
        echo
        echo "pgward's policy:"
        echo
        echo '```toml'
        policy "$gate"
        echo '```'
    fi
    if has_target pgward-fixed; then
        echo
        echo "pgward-fixed's [gate] (the rest as pgward's):"
        echo
        echo '```toml'
        printf '[gate]\n%s\n' "$fixed_gate"
        echo '```'
    fi
}
summarize | tee "$report"
echo
echo "results: $tsv, $report"
[ "$failures" = 0 ]
