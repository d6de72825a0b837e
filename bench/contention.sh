#!/usr/bin/env bash
# The gate's lock under several worker threads: pgbench select-only through pgward with the
# policy of bench/rules.sh (every statement passes the admission gate) with worker_threads = 1
# and with worker_threads = 2, taking turns, in one run. For each: transactions per second,
# pgward's CPU time per transaction, and how often the gate's lock was found held by another
# worker thread (pgward_gate_lock_contended_total over pgward_gate_lock_acquisitions_total,
# read from the metrics endpoint before and after each run). See bench/README.md.
#
# usage: bench/contention.sh [MODE...]  MODE is a pgbench protocol: simple (default), extended,
#                                       prepared
# environment:
#   ROUNDS                rounds (each target once per round, in rotating order), default 3
#   PGWARD_BENCH_SECONDS  length of one pgbench run, default 8
#   CLIENTS, JOBS         pgbench -c and -j, default 32 and 2
#   POOL_SIZE             default_pool_size, default 8
#   SCALE                 pgbench -i scale, default 10
#   PGWARD_BIN            the pgward to run (default: built with cargo build --release)
set -euo pipefail

cd "$(dirname "$0")/.."
# shellcheck source=bench/throwaway-pg.sh
. bench/throwaway-pg.sh

modes=("$@")
[ "${#modes[@]}" -gt 0 ] || modes=(simple)
targets=(threads1 threads2)
rounds=${ROUNDS:-3}
seconds=${PGWARD_BENCH_SECONDS:-8}
clients=${CLIENTS:-32}
jobs=${JOBS:-2}
pool_size=${POOL_SIZE:-8}
scale=${SCALE:-10}

check_choices "pgbench protocol" "simple extended prepared" "${modes[@]}"

ensure_postgres
binary=$(pgward_binary)

# The poolers that pooler_start runs (stopped when the script exits).
declare -A pooler_pid=() pooler_port=() metrics_port=()

throwaway_start pgward-contention-bench "host all all 127.0.0.1/32 trust" bench benchpass
work=$THROWAWAY_DIR
pg_port=$THROWAWAY_PORT
echo "initializing pgbench tables (scale $scale) on PostgreSQL port $pg_port"
pgbench -i -q -s "$scale" -h 127.0.0.1 -p "$pg_port" -U bench bench \
    >"$work/pgbench-init.log" 2>&1 || die "pgbench -i failed: $(tail "$work/pgbench-init.log")"

# start_pooler NAME THREADS: a pgward with the rules policy, its metrics on a port of its own.
start_pooler() {
    local name=$1 threads=$2 port dir="$work/$1"
    port=$(free_port)
    metrics_port[$name]=$(free_port)
    while [ "${metrics_port[$name]}" = "$port" ]; do metrics_port[$name]=$(free_port); done
    mkdir -p "$dir"
    printf '"bench" ""\n' >"$dir/userlist.txt"
    pooler_ini "$dir" "$pg_port" "$port" "$pool_size" trust "$dir/userlist.txt" >"$dir/pooler.ini"
    {
        echo "policy_file = $dir/policy.toml"
        echo "worker_threads = $threads"
        echo "prometheus_listen = 127.0.0.1:${metrics_port[$name]}"
    } >>"$dir/pooler.ini"
    rules_policy >"$dir/policy.toml"
    pooler_start "$name" "$dir" "$port" "$work/pgward-bin" ||
        die "$name did not start listening on port $port"
}

install -m 755 "$binary" "$work/pgward-bin"
start_pooler threads1 1
start_pooler threads2 2

# lock_counts NAME: "TAKEN CONTENDED", the gate lock's counters of pgward NAME now (callers
# take it into a variable first, so that its failure stops them).
lock_counts() {
    local body
    body=$(curl -fsS "http://127.0.0.1:${metrics_port[$1]}/metrics") ||
        die "$1: no metrics on port ${metrics_port[$1]}"
    echo "$body" | awk '
        $1 == "pgward_gate_lock_acquisitions_total" {t = $2}
        $1 == "pgward_gate_lock_contended_total" {c = $2}
        END {if (t == "" || c == "") exit 1; printf "%d %d\n", t, c}' ||
        die "$1: no gate lock counters in its metrics"
}

mkdir -p bench/results
stamp=$(date -u +%Y%m%dT%H%M%SZ)
tsv="bench/results/contention-$stamp.tsv"
report="bench/results/contention-$stamp.md"
printf 'mode\ttarget\tround\ttps\tcpu_us_per_tx\ttransactions\tlocks_per_tx\tcontended_share\n' >"$tsv"

# run_one MODE TARGET ROUND: one pgbench run; appends a line to the TSV file.
run_one() {
    local mode=$1 target=$2 round=$3 counts run before after tps lat tx cpu per share
    counts=$(lock_counts "$target")
    read -r -a before <<<"$counts"
    run=$(pgbench_select "$mode" "${pooler_port[$target]}" "${pooler_pid[$target]}" \
        "round $round $mode $target")
    read -r tps lat tx cpu <<<"$run"
    counts=$(lock_counts "$target")
    read -r -a after <<<"$counts"
    per=$(awk -v n=$((after[0] - before[0])) -v tx="$tx" 'BEGIN {printf "%.2f", (tx > 0 ? n / tx : 0)}')
    share=$(awk -v c=$((after[1] - before[1])) -v n=$((after[0] - before[0])) \
        'BEGIN {printf "%.5f", (n > 0 ? c / n : 0)}')
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$mode" "$target" "$round" "$tps" "$cpu" "$tx" \
        "$per" "$share" >>"$tsv"
    printf 'round %s  %-8s  %-8s  tps %10.1f  latency %7.3f ms  pgward cpu/tx %s us  locks/tx %s  contended %s\n' \
        "$round" "$mode" "$target" "$tps" "$lat" "$cpu" "$per" "$share"
}

echo "pgbench -S -c $clients -j $jobs -T $seconds; pool size $pool_size; rounds $rounds;" \
    "modes: ${modes[*]}"
for round in $(seq 1 "$rounds"); do
    for mode in "${modes[@]}"; do
        for i in 0 1; do
            run_one "$mode" "${targets[$(((i + round - 1) % 2))]}" "$round"
        done
    done
done

summarize() {
    echo "# pgward gate lock contention, $stamp"
    echo
    echo "pgbench select-only (-S), $clients clients, $jobs threads, ${seconds}s per run," \
        "$rounds rounds; pgward in transaction mode with $pool_size server connections and the" \
        "policy of bench/rules.sh, with worker_threads = 1 (threads1) and 2 (threads2); PostgreSQL" \
        "$(psql -X -At -h 127.0.0.1 -p "$pg_port" -U postgres -d postgres -c 'SHOW server_version')," \
        "$(nproc) cores shared by PostgreSQL, pgbench and pgward."
    echo
    echo "| protocol | target | tps (median) | pgward CPU us/tx (median) | gate locks per tx (median) | share of them contended (median) |"
    echo "| --- | --- | ---: | ---: | ---: | ---: |"
    for mode in "${modes[@]}"; do
        for target in "${targets[@]}"; do
            printf '| %s | %s |' "$mode" "$target"
            for col in 4 5 7 8; do
                printf ' %s |' "$(awk -F'\t' -v m="$mode" -v t="$target" -v c="$col" \
                    'NR > 1 && $1 == m && $2 == t {print $c}' "$tsv" | sort -g |
                    awk '{v[NR] = $1} END {m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "%.6g", m}')"
            done
            echo
        done
    done
}
summarize | tee "$report"
echo
echo "results: $tsv, $report"
