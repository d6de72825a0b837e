#!/usr/bin/env bash
# What the SQL rules cost: pgbench select-only through pgward with every rule enabled against
# pgward with no policy, in one run (see bench/README.md).
#
# usage: bench/rules.sh [MODE...]       MODE is a pgbench protocol: simple, prepared (default:
#                                       both; extended also works)
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
[ "${#modes[@]}" -gt 0 ] || modes=(simple prepared)
targets=(rules none)
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
declare -A pooler_pid=() pooler_port=()

# --- PostgreSQL -------------------------------------------------------------------------------
throwaway_start pgward-rules-bench "host all all 127.0.0.1/32 trust" bench benchpass
work=$THROWAWAY_DIR
pg_port=$THROWAWAY_PORT
echo "initializing pgbench tables (scale $scale) on PostgreSQL port $pg_port"
pgbench -i -q -s "$scale" -h 127.0.0.1 -p "$pg_port" -U bench bench \
    >"$work/pgbench-init.log" 2>&1 || die "pgbench -i failed: $(tail "$work/pgbench-init.log")"

# --- the two pgwards --------------------------------------------------------------------------

# start_pooler NAME: starts a pgward, with the policy for `rules`; the same settings otherwise.
start_pooler() {
    local name=$1 port dir="$work/$1"
    port=$(free_port)
    mkdir -p "$dir"
    # trust admits only users the auth file names, as in PgBouncer.
    printf '"bench" ""\n' >"$dir/userlist.txt"
    pooler_ini "$dir" "$pg_port" "$port" "$pool_size" trust "$dir/userlist.txt" >"$dir/pooler.ini"
    if [ "$name" = rules ]; then echo "policy_file = $dir/policy.toml" >>"$dir/pooler.ini"; fi
    rules_policy >"$dir/policy.toml"
    pooler_start "$name" "$dir" "$port" "$work/pgward-bin" ||
        die "$name did not start listening on port $port"
}

# A copy, since the postgres OS user may not reach the source tree (under /root, say).
install -m 755 "$binary" "$work/pgward-bin"
for target in "${targets[@]}"; do start_pooler "$target"; done

# --- runs -------------------------------------------------------------------------------------
mkdir -p bench/results
stamp=$(date -u +%Y%m%dT%H%M%SZ)
tsv="bench/results/rules-$stamp.tsv"
report="bench/results/rules-$stamp.md"
printf 'mode\ttarget\tround\ttps\tlatency_ms\tcpu_us_per_tx\ttransactions\n' >"$tsv"

# run_one MODE TARGET ROUND: one pgbench run; appends a line to the TSV file.
run_one() {
    local mode=$1 target=$2 round=$3 run tps lat tx cpu
    run=$(pgbench_select "$mode" "${pooler_port[$target]}" "${pooler_pid[$target]}" \
        "round $round $mode $target")
    read -r tps lat tx cpu <<<"$run"
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$mode" "$target" "$round" "$tps" "$lat" "$cpu" "$tx" >>"$tsv"
    printf 'round %s  %-8s  %-6s  tps %10.1f  latency %7.3f ms  pgward cpu/tx %s us\n' \
        "$round" "$mode" "$target" "$tps" "$lat" "$cpu"
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

# Every statement was refused or let through by the rules: none may have been refused.
if grep -q "statement refused" "$work/rules/pooler.log" "$work/rules/stdout.log" 2>/dev/null; then
    die "the rules refused statements of the benchmark: see $work/rules/pooler.log"
fi

# --- summary ----------------------------------------------------------------------------------
summarize() {
    echo "# pgward rules benchmark, $stamp"
    echo
    echo "pgbench select-only (-S), $clients clients, $jobs threads, ${seconds}s per run," \
        "$rounds rounds; pgward in transaction mode with $pool_size server connections," \
        "with every rule enabled (rules) and with no policy (none); PostgreSQL" \
        "$(psql -X -At -h 127.0.0.1 -p "$pg_port" -U postgres -d postgres -c 'SHOW server_version')," \
        "$(nproc) cores."
    echo
    echo "Targets for the tps ratio of rules to none: 0.95 simple, 0.97 prepared."
    echo
    echo "| protocol | target | tps (median) | latency ms (median) | pgward CPU us/tx (median) | tps vs none | latency vs none |"
    echo "| --- | --- | ---: | ---: | ---: | ---: | ---: |"
    awk -F'\t' -v base=none -f bench/median.awk -f bench/summary.awk "$tsv"
}
summarize | tee "$report"
echo
echo "results: $tsv, $report"
