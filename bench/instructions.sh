#!/usr/bin/env bash
# Instructions per pooled transaction, counted by callgrind, for PgBouncer and pgward (see
# bench/README.md). Unlike timings, instruction counts barely move on a busy machine.
#
# usage: bench/instructions.sh [MODE...]   MODE is a pgbench protocol: simple (default),
#                                          extended, prepared
# environment:
#   TARGETS       poolers to count, default "pgbouncer pgward"; pgward-rules is pgward with
#                 the policy of bench/rules.sh (every rule applying to the bench role)
#   PGWARD_BIN    the pgward to count (default: built with cargo build --release)
#   CALLGRIND_KEEP  a directory to keep the callgrind dumps in (for callgrind_annotate)
#   TRANSACTIONS  transactions per pgbench client in the counted run, default 500
#   CLIENTS       pgbench -c, default 32 (with -j 2); POOL_SIZE default_pool_size, default 8
set -euo pipefail

cd "$(dirname "$0")/.."
# shellcheck source=bench/throwaway-pg.sh
. bench/throwaway-pg.sh

read -r -a targets <<<"${TARGETS:-pgbouncer pgward}"
modes=("$@")
[ "${#modes[@]}" -gt 0 ] || modes=(simple)
per_client=${TRANSACTIONS:-500}
clients=${CLIENTS:-32}
pool_size=${POOL_SIZE:-8}
bench_password=benchpass

check_choices "pgbench protocol" "simple extended prepared" "${modes[@]}"
ensure_postgres
command -v valgrind >/dev/null || apt_install valgrind
for target in "${targets[@]}"; do
    case $target in
    pgbouncer) ensure_pgbouncer ;;
    pgward | pgward-rules) [ -n "${pgward_bin:-}" ] || pgward_bin=$(pgward_binary) ;;
    *) die "unknown target: $target" ;;
    esac
done

# pooler_start records each pooler here (pooler_port is only written).
# shellcheck disable=SC2034
declare -A pooler_pid=() pooler_port=()
throwaway_start pgward-instructions "host all all 127.0.0.1/32 trust" bench "$bench_password"
work=$THROWAWAY_DIR
pg_port=$THROWAWAY_PORT
PGPASSWORD=$bench_password pgbench -i -q -s 10 -h 127.0.0.1 -p "$pg_port" -U bench bench \
    >"$work/pgbench-init.log" 2>&1 || die "pgbench -i failed: $(tail "$work/pgbench-init.log")"
printf '"bench" "%s"\n' "$bench_password" >"$work/userlist.txt"

# program_of TARGET: the pooler's executable (pgward copied where the postgres user reads it).
program_of() {
    if [ "$1" = pgbouncer ]; then
        command -v pgbouncer
    else
        install -m 755 "$pgward_bin" "$work/pgward-bin"
        echo "$work/pgward-bin"
    fi
}

# pgbench_run PORT MODE N: N transactions per client through PORT.
pgbench_run() {
    PGPASSWORD=$bench_password pgbench -n -S -M "$2" -c "$clients" -j 2 -t "$3" \
        -h 127.0.0.1 -p "$1" -U bench bench >"$work/pgbench.log" 2>&1 ||
        die "pgbench failed: $(tail -n 5 "$work/pgbench.log")"
}

# count TARGET MODE: starts the pooler under callgrind, warms it up, counts one run, and
# prints the instructions per transaction of that run alone.
count() {
    local target=$1 mode=$2 dir port wrapper pid
    dir="$work/$target-$mode"
    mkdir -p "$dir"
    port=$(free_port)
    pooler_ini "$dir" "$pg_port" "$port" "$pool_size" md5 "$work/userlist.txt" >"$dir/pooler.ini"
    if [ "$target" = pgward-rules ]; then
        rules_policy >"$dir/policy.toml"
        echo "policy_file = $dir/policy.toml" >>"$dir/pooler.ini"
    fi
    wrapper=$(callgrind_wrapper "$dir" "$(program_of "$target")")
    pooler_start "$target" "$dir" "$port" "$wrapper" >/dev/null ||
        die "$target did not start under valgrind"
    pid=${pooler_pid[$target]}
    pgbench_run "$port" "$mode" 50
    as_postgres callgrind_control -z "$pid" >/dev/null 2>&1 || die "callgrind_control -z failed"
    pgbench_run "$port" "$mode" "$per_client"
    as_postgres callgrind_control -d "$pid" >/dev/null 2>&1 || die "callgrind_control -d failed"
    pooler_stop "$target"
    if [ -n "${CALLGRIND_KEEP:-}" ]; then
        mkdir -p "$CALLGRIND_KEEP/$target-$mode"
        cp "$dir"/callgrind.* "$CALLGRIND_KEEP/$target-$mode/"
    fi
    callgrind_per_tx "$dir" "$pid" $((per_client * clients))
}

echo "pgbench -S -c $clients -j 2 -t $per_client; pool size $pool_size; instructions per" \
    "transaction counted by callgrind after a warm-up run"
echo
echo "| protocol | target | instructions per transaction |"
echo "| --- | --- | ---: |"
for mode in "${modes[@]}"; do
    for target in "${targets[@]}"; do
        echo "| $mode | $target | $(count "$target" "$mode") |"
    done
done
