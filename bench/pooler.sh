#!/usr/bin/env bash
# Side-by-side pgbench of direct PostgreSQL, PgBouncer and pgward (see bench/README.md).
#
# usage: bench/pooler.sh [MODE...]      MODE is a pgbench protocol: simple (default), extended,
#                                       prepared
# environment:
#   TARGETS               targets to run, default "direct pgbouncer pgward"
#   ROUNDS                rounds (each target once per round, in rotating order), default 3
#   PGWARD_BENCH_SECONDS  length of one pgbench run, default 8
#   CLIENTS, JOBS         pgbench -c and -j, default 32 and 2
#   POOL_SIZE             default_pool_size of both poolers, default 8
#   SCALE                 pgbench -i scale, default 10
#   AUTH_TYPE             auth_type of both poolers: md5 (default) or trust
#   PGWARD_BIN            the pgward to run (default: built with cargo build --release)
set -euo pipefail

cd "$(dirname "$0")/.."
# shellcheck source=bench/throwaway-pg.sh
. bench/throwaway-pg.sh

read -r -a targets <<<"${TARGETS:-direct pgbouncer pgward}"
modes=("$@")
[ "${#modes[@]}" -gt 0 ] || modes=(simple)
rounds=${ROUNDS:-3}
seconds=${PGWARD_BENCH_SECONDS:-8}
clients=${CLIENTS:-32}
jobs=${JOBS:-2}
pool_size=${POOL_SIZE:-8}
scale=${SCALE:-10}
auth_type=${AUTH_TYPE:-md5}
bench_password=benchpass

check_choices target "direct pgbouncer pgward" "${targets[@]}"
check_choices "pgbench protocol" "simple extended prepared" "${modes[@]}"

has_target() {
    [[ " ${targets[*]} " == *" $1 "* ]]
}

ensure_postgres
if has_target pgbouncer; then ensure_pgbouncer; fi
if has_target pgward; then pgward_bin=$(pgward_binary); fi

# The poolers that pooler_start runs (stopped when the script exits).
declare -A pooler_pid=() pooler_port=()

# --- PostgreSQL -------------------------------------------------------------------------------
throwaway_start pgward-bench "host all all 127.0.0.1/32 trust" bench "$bench_password"
work=$THROWAWAY_DIR
pg_port=$THROWAWAY_PORT
echo "initializing pgbench tables (scale $scale) on PostgreSQL port $pg_port"
PGPASSWORD=$bench_password pgbench -i -q -s "$scale" -h 127.0.0.1 -p "$pg_port" -U bench bench \
    >"$work/pgbench-init.log" 2>&1 || die "pgbench -i failed: $(tail "$work/pgbench-init.log")"

# --- poolers ----------------------------------------------------------------------------------
printf '"bench" "%s"\n' "$bench_password" >"$work/userlist.txt"

# start_pooler NAME PROGRAM: the same settings for both poolers; only the paths and port differ.
start_pooler() {
    local dir="$work/$1" port
    port=$(free_port)
    mkdir -p "$dir"
    pooler_ini "$dir" "$pg_port" "$port" "$pool_size" "$auth_type" "$work/userlist.txt" \
        >"$dir/pooler.ini"
    pooler_start "$1" "$dir" "$port" "$2" || die "$1 did not start listening on port $port"
}

if has_target pgbouncer; then start_pooler pgbouncer "$(command -v pgbouncer)"; fi
if has_target pgward; then
    # A copy, since the postgres OS user may not reach the source tree (under /root, say).
    install -m 755 "$pgward_bin" "$work/pgward-bin"
    start_pooler pgward "$work/pgward-bin"
fi

# --- runs -------------------------------------------------------------------------------------
target_port() {
    if [ "$1" = direct ]; then echo "$pg_port"; else echo "${pooler_port[$1]}"; fi
}

mkdir -p bench/results
stamp=$(date -u +%Y%m%dT%H%M%SZ)
tsv="bench/results/pooler-$stamp.tsv"
report="bench/results/pooler-$stamp.md"
printf 'mode\ttarget\tround\ttps\tlatency_ms\tcpu_us_per_tx\ttransactions\tuser_us_per_tx\tsys_us_per_tx\n' \
    >"$tsv"
failures=0

# run_one MODE TARGET ROUND: one pgbench run; appends a line to the TSV file.
run_one() {
    local mode=$1 target=$2 round=$3 port out ticks before=(0 0) after tps lat tx
    local cpu="-" user="-" sys="-" cpu_text="-"
    port=$(target_port "$target")
    if [ "$target" != direct ]; then
        ticks=$(cpu_ticks "${pooler_pid[$target]}")
        read -r -a before <<<"$ticks"
    fi
    if ! out=$(PGPASSWORD=$bench_password pgbench -n -S -M "$mode" -c "$clients" -j "$jobs" \
        -T "$seconds" -h 127.0.0.1 -p "$port" -U bench bench 2>&1); then
        echo "round $round $mode $target: pgbench failed:" >&2
        echo "$out" | tail -n 5 >&2
        failures=$((failures + 1))
        return 0
    fi
    tps=$(echo "$out" | awk '/^tps = / && /(without initial connection|excluding connections)/ {print $3; exit}')
    [ -n "$tps" ] || tps=$(echo "$out" | awk '/^tps = / {v=$3} END {print v}')
    lat=$(echo "$out" | awk '/^latency average/ {print $4; exit}')
    tx=$(echo "$out" | awk -F': ' '/number of transactions actually processed/ {split($2, a, "/"); print a[1]; exit}')
    if [ "$target" != direct ]; then
        ticks=$(cpu_ticks "${pooler_pid[$target]}")
        read -r -a after <<<"$ticks"
        user=$(us_per_tx $((after[0] - before[0])) "$tx")
        sys=$(us_per_tx $((after[1] - before[1])) "$tx")
        cpu=$(us_per_tx $((after[0] + after[1] - before[0] - before[1])) "$tx")
        cpu_text="$cpu us (user $user, kernel $sys)"
    fi
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' \
        "$mode" "$target" "$round" "$tps" "$lat" "$cpu" "$tx" "$user" "$sys" >>"$tsv"
    printf 'round %s  %-8s  %-10s  tps %10.1f  latency %7.3f ms  pooler cpu/tx %s\n' \
        "$round" "$mode" "$target" "$tps" "$lat" "$cpu_text"
}

# PgBouncer keeps protocol-level prepared statements across servers only from 1.21 on; an
# older one gives wrong answers or errors in prepared mode, so it sits that mode out.
pgbouncer_prepared=yes
if has_target pgbouncer; then
    v=$(pgbouncer --version 2>/dev/null | grep -oE '[0-9]+\.[0-9]+' | head -1)
    if [ -n "$v" ] && [ "$(printf '%s\n1.21\n' "$v" | sort -V | head -1)" != 1.21 ]; then
        pgbouncer_prepared=no
        echo "PgBouncer $v does not support prepared statements in transaction mode: skipped in prepared mode"
    fi
fi

echo "pgbench -S -c $clients -j $jobs -T $seconds; pool size $pool_size; rounds $rounds;" \
    "targets: ${targets[*]}; modes: ${modes[*]}"
for mode in "${modes[@]}"; do
    for round in $(seq 1 "$rounds"); do
        n=${#targets[@]}
        for i in $(seq 0 $((n - 1))); do
            target=${targets[$(((i + round - 1) % n))]}
            if [ "$mode" = prepared ] && [ "$target" = pgbouncer ] && [ "$pgbouncer_prepared" = no ]; then
                continue
            fi
            run_one "$mode" "$target" "$round"
        done
    done
done

# --- summary ----------------------------------------------------------------------------------
summarize() {
    echo "# pgward pooler benchmark, $stamp"
    echo
    echo "pgbench select-only (-S), $clients clients, $jobs threads, ${seconds}s per run," \
        "$rounds rounds; poolers in transaction mode with $pool_size server connections," \
        "auth_type $auth_type; PostgreSQL $(psql -X -At -h 127.0.0.1 -p "$pg_port" -U postgres \
            -d postgres -c 'SHOW server_version'), $(nproc) cores."
    [ "$failures" = 0 ] || echo "**$failures run(s) failed and are left out.**"
    echo
    echo "| protocol | target | tps (median) | latency ms (median) | pooler CPU us/tx (median) | tps vs direct | latency vs direct | user / kernel us/tx (median of each) |"
    echo "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"
    awk -F'\t' -v split_cpu=1 -f bench/median.awk -f bench/summary.awk "$tsv"
    if has_target pgward && has_target pgbouncer; then
        echo
        echo "pgward as a ratio of PgBouncer in the same round, median over rounds, and the rounds" \
            "in which pgward's TPS was at least PgBouncer's and its CPU per transaction at most:"
        echo
        echo "| protocol | rounds | TPS | CPU per transaction | TPS target met | CPU target met |"
        echo "| --- | ---: | ---: | ---: | ---: | ---: |"
        awk -F'\t' -f bench/median.awk -f bench/paired.awk "$tsv"
    fi
}
summarize | tee "$report"
echo
echo "results: $tsv, $report"
[ "$failures" = 0 ]
