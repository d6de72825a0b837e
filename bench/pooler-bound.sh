#!/usr/bin/env bash
# The pooler-bound harness: a pooler alone, between a fake PostgreSQL backend and lean
# closed-loop clients (bench/harness: one event loop plays both ends, answering at once from
# canned messages), pinned to another core than the pooler's, so that the pooler is the
# bottleneck. For each target: transactions per second, the pooler's CPU time per transaction,
# and (INSTRUCTIONS=1) its instructions per transaction counted by callgrind. See
# bench/README.md.
#
# usage: bench/pooler-bound.sh [MODE...]   MODE: simple (default), extended, prepared
# environment:
#   TARGETS        default "pgbouncer pgward": pgbouncer (Debian's), pgbouncer-new (the binary
#                  in PGBOUNCER_NEW_BIN, e.g. 1.25.2 from ../shared/tools/build-pgbouncer.sh),
#                  pgward, pgward2 (pgward with worker_threads = 2 and 2 cores),
#                  pgward-base and pgward-base2 (the same with PGWARD_BASE_BIN, another build
#                  to compare with in paired rounds); the relay
#                  prototypes of bench/harness/src/bin/relay-proto.rs: proto-mio (a loop over
#                  state machines), proto-tokio (a task per client on a current-thread
#                  runtime), proto-unordered (the clients as futures in one task), and
#                  proto-mio2, proto-tokio2 and proto-unordered2 (2 threads on 2 cores)
#   ROUNDS         rounds, each running every target once in a rotated order; default 3
#   RUN_SECONDS    length of one run, default 8
#   CLIENTS        client connections, default 32; POOL_SIZE default_pool_size, default 8
#   POOLER_CPU     the core the pooler runs on, default 0; HARNESS_CPU the harness's, default 1;
#                  POOLER2_CPUS the cores of the 2-thread targets, default both
#   INSTRUCTIONS   1: count instructions per transaction too (callgrind; TRANSACTIONS per
#                  client, default 2000), once per target and mode
#   PGWARD_BIN     the pgward to run (default: built with cargo build --release)
#   PGWARD_BASE_BIN  the pgward of the pgward-base targets
set -euo pipefail

cd "$(dirname "$0")/.."
repo=$(pwd)
# shellcheck source=bench/throwaway-pg.sh
. bench/throwaway-pg.sh

read -r -a targets <<<"${TARGETS:-pgbouncer pgward}"
modes=("$@")
[ "${#modes[@]}" -gt 0 ] || modes=(simple)
rounds=${ROUNDS:-3}
run_seconds=${RUN_SECONDS:-8}
clients=${CLIENTS:-32}
pool_size=${POOL_SIZE:-8}
pooler_cpu=${POOLER_CPU:-0}
harness_cpu=${HARNESS_CPU:-1}
count_instructions=${INSTRUCTIONS:-0}
per_client=${TRANSACTIONS:-2000}

check_choices "protocol" "simple extended prepared" "${modes[@]}"
check_choices "target" "pgbouncer pgbouncer-new pgward pgward2 pgward-base pgward-base2 proto-mio proto-tokio proto-unordered proto-mio2 proto-tokio2 proto-unordered2" \
    "${targets[@]}"
[ "$(nproc)" -ge 2 ] || die "the harness needs two cores: one for the pooler, one for itself"
command -v taskset >/dev/null || apt_install util-linux
if [ "$count_instructions" = 1 ]; then command -v valgrind >/dev/null || apt_install valgrind; fi
pgward_bin=""
for target in "${targets[@]}"; do
    case $target in
    pgbouncer) ensure_pgbouncer ;;
    pgbouncer-new) [ -x "${PGBOUNCER_NEW_BIN:-}" ] || die "pgbouncer-new needs PGBOUNCER_NEW_BIN" ;;
    pgward | pgward2) [ -n "$pgward_bin" ] || pgward_bin=$(pgward_binary) ;;
    pgward-base | pgward-base2) [ -x "${PGWARD_BASE_BIN:-}" ] || die "$target needs PGWARD_BASE_BIN" ;;
    esac
done
echo "building the harness (bench/harness, cargo build --release)"
cargo build --release --quiet --manifest-path bench/harness/Cargo.toml
harness="$repo/bench/harness/target/release/pgward-harness"
relay_proto="$repo/bench/harness/target/release/relay-proto"

# shellcheck disable=SC2034 # pooler_pid and pooler_port are for pooler_start and pooler_stop
declare -A pooler_pid=() pooler_port=()
work=$(make_workdir pgward-bound)
trap 'pooler_stop_all; rm -rf "$work"' EXIT
printf '"bench" ""\n' >"$work/userlist.txt"

# program_of TARGET: the pooler's executable, where the postgres user can run it.
program_of() {
    case $1 in
    pgbouncer) command -v pgbouncer ;;
    pgbouncer-new) echo "$PGBOUNCER_NEW_BIN" ;;
    proto-*)
        install -m 755 "$relay_proto" "$work/relay-proto"
        echo "$work/relay-proto"
        ;;
    pgward-base*)
        install -m 755 "$PGWARD_BASE_BIN" "$work/pgward-base-bin"
        echo "$work/pgward-base-bin"
        ;;
    *)
        install -m 755 "$pgward_bin" "$work/pgward-bin"
        echo "$work/pgward-bin"
        ;;
    esac
}

# start TARGET SERVER_PORT [WRAPPER]: starts the pooler in front of the fake backend's port,
# pinned to its core(s); its port goes to started_port.
started_port=""
start() {
    local target=$1 server_port=$2 program dir port design cpus=$pooler_cpu
    dir="$work/$target"
    rm -rf "$dir"
    mkdir -p "$dir"
    port=$(free_port)
    pooler_ini "$dir" "$server_port" "$port" "$pool_size" trust "$work/userlist.txt" >"$dir/pooler.ini"
    case $target in
    proto-*)
        design=${target#proto-}
        echo "relay_design = ${design%2}" >>"$dir/pooler.ini"
        ;;
    esac
    case $target in
    *2)
        echo "worker_threads = 2" >>"$dir/pooler.ini"
        cpus="${POOLER2_CPUS:-$pooler_cpu,$harness_cpu}"
        ;;
    esac
    program=${3:-$(program_of "$target")}
    pooler_start "$target" "$dir" "$port" "$program" >/dev/null || die "$target did not start"
    taskset -apc "$cpus" "${pooler_pid[$target]}" >/dev/null
    started_port=$port
}

# harness SERVER_PORT POOLER_PORT MODE LIMIT: one harness run on its own core; prints its last
# line ("transactions N seconds S tps T").
harness_run() {
    local out
    out=$(taskset -c "$harness_cpu" "$harness" "$1" "$2" "$clients" "$3" "$4" 2>&1) ||
        die "the harness failed: $out"
    echo "$out" | tail -n 1
}

# measure TARGET MODE: one timed run; "tps cpu_us_per_tx" goes to measured.
measured=""
measure() {
    local target=$1 mode=$2 server_port before after line tx tps u0 s0 u1 s1
    server_port=$(free_port)
    start "$target" "$server_port"
    before=$(cpu_ticks "${pooler_pid[$target]}")
    line=$(harness_run "$server_port" "$started_port" "$mode" "${run_seconds}s")
    after=$(cpu_ticks "${pooler_pid[$target]}")
    pooler_stop "$target"
    read -r _ tx _ _ _ tps <<<"$line"
    read -r u0 s0 <<<"$before"
    read -r u1 s1 <<<"$after"
    measured="$tps $(us_per_tx $((u1 + s1 - u0 - s0)) "$tx")"
}

# instructions TARGET MODE: the pooler under callgrind; a warm-up run, then a counted one;
# prints instructions per transaction of the counted run.
instructions() {
    local target=$1 mode=$2 server_port wrapper pid dir="$work/callgrind-$1-$2"
    mkdir -p "$dir"
    wrapper=$(callgrind_wrapper "$dir" "$(program_of "$target")")
    if is_root; then chown -R postgres: "$dir"; fi
    server_port=$(free_port)
    start "$target" "$server_port" "$wrapper"
    pid=${pooler_pid[$target]}
    harness_run "$server_port" "$started_port" "$mode" 50 >/dev/null
    as_postgres callgrind_control -z "$pid" >/dev/null 2>&1 || die "callgrind_control -z failed"
    harness_run "$server_port" "$started_port" "$mode" "$per_client" >/dev/null
    as_postgres callgrind_control -d "$pid" >/dev/null 2>&1 || die "callgrind_control -d failed"
    pooler_stop "$target"
    callgrind_per_tx "$dir" "$pid" $((per_client * clients))
}

mkdir -p bench/results
stamp=$(date -u +%Y%m%dT%H%M%SZ)
tsv="bench/results/pooler-bound-$stamp.tsv"
printf 'round\tmode\ttarget\ttps\tcpu_us_per_tx\n' >"$tsv"
echo "pooler on core $pooler_cpu, harness on core $harness_cpu; $clients clients, pool size" \
    "$pool_size, $run_seconds s per run, $rounds rounds; targets: ${targets[*]}"
for mode in "${modes[@]}"; do
    for round in $(seq 1 "$rounds"); do
        # Rotate the order each round: no target always runs first.
        n=${#targets[@]}
        for k in $(seq 0 $((n - 1))); do
            target=${targets[$(((k + round) % n))]}
            measure "$target" "$mode"
            read -r tps cpu <<<"$measured"
            printf '%s\t%s\t%s\t%s\t%s\n' "$round" "$mode" "$target" "$tps" "$cpu" >>"$tsv"
            printf 'round %s  %-8s  %-13s  %8s tps  %7s us CPU per transaction\n' \
                "$round" "$mode" "$target" "$tps" "$cpu"
        done
    done
done

# The table from the TSV file: medians per protocol and target, and the median over rounds of
# each target's CPU per transaction as a ratio of PgBouncer's in the same round.
# shellcheck disable=SC2016 # awk's own $ fields
table_awk='
    NR == 1 { next }
    {
        key = $2 SUBSEP $3
        if (!(key in seen)) { seen[key] = 1; order[++n] = key }
        tps[key] = tps[key] " " $4; cpu[key] = cpu[key] " " $5
        round_cpu[$1, $2, $3] = $5
        if (!(($2, $1) in round_seen)) { round_seen[$2, $1] = 1; rounds[$2] = rounds[$2] " " $1 }
    }
    END {
        for (i = 1; i <= n; i++) {
            split(order[i], kv, SUBSEP); mode = kv[1]; target = kv[2]
            ratios = ""; own = ""
            base = (target == "pgward" ? "pgward-base" : target == "pgward2" ? "pgward-base2" : "")
            split(rounds[mode], rs, " ")
            for (j in rs) {
                r = rs[j]
                if ((r, mode, "pgbouncer") in round_cpu && round_cpu[r, mode, "pgbouncer"] > 0)
                    ratios = ratios " " round_cpu[r, mode, target] / round_cpu[r, mode, "pgbouncer"]
                if (base != "" && (r, mode, base) in round_cpu && round_cpu[r, mode, base] > 0)
                    own = own " " round_cpu[r, mode, target] / round_cpu[r, mode, base]
            }
            printf "| %s | %s | %.0f | %.2f | %s | %s |\n", mode, target, median(tps[order[i]]), \
                median(cpu[order[i]]), (ratios == "" ? "-" : sprintf("%.3f", median(ratios))), \
                (own == "" ? "-" : sprintf("%.3f", median(own)))
        }
    }'

report="bench/results/pooler-bound-$stamp.md"
{
    echo "| protocol | target | TPS (median) | CPU µs per transaction (median) | CPU per transaction / PgBouncer's (median of rounds) | CPU per transaction / its pgward-base's (median of rounds) |"
    echo "| --- | --- | ---: | ---: | ---: | ---: |"
    awk -F'\t' -f bench/median.awk -f <(printf '%s\n' "$table_awk") "$tsv"
    if [ "$count_instructions" = 1 ]; then
        echo
        echo "| protocol | target | instructions per transaction (callgrind, $per_client per client) |"
        echo "| --- | --- | ---: |"
        for mode in "${modes[@]}"; do
            for target in "${targets[@]}"; do
                echo "| $mode | $target | $(instructions "$target" "$mode") |"
            done
        done
    fi
} | tee "$report"
echo
echo "results: $tsv, $report"
