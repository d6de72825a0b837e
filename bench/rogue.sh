#!/usr/bin/env bash
# The rogue benchmark: three innocent tenants run indexed lookups while a rogue tenant runs full
# reads of a large table, through direct PostgreSQL, PgBouncer and pgward (see bench/README.md).
#
# usage: bench/rogue.sh [IDENTITY...]   how tenants are told apart: roles (one role per tenant)
#                                       and tags (one shared role, tenant tags); default both
# environment:
#   TARGETS               targets to run, default "direct pgbouncer pgward"
#   ROUNDS                rounds (each target once per round, in rotating order), default 3
#   PGWARD_BENCH_SECONDS  length of one run, default 15
#   PROTOCOL              pgbench -M: simple (default) or extended
#   INNOCENT_RATE         lookups per second of each innocent tenant (pgbench -R), default: as
#                         many as they can
#   READ_MS               how long one rogue read should take on its own, default 333
#   BIG_ROWS              rows of the large table (default: sized to READ_MS by measuring)
#   SMALL_ROWS            rows of the lookup table, default 100000
#   POOL_SIZE             default_pool_size of both poolers, default 12
#   AUTH_TYPE             auth_type of both poolers: md5 (default) or trust
#   PLOT_ROUND            the round whose runs are plotted, default 1
#   PGWARD_BIN            the pgward to run (default: built with cargo build --release)
#   WHEN_OVER             the rogue's when_over: wait (default), reject or slow
#   TRAFFIC               1: pgward writes a traffic log, and `pgward simulate` replays it
#                         under the same policy; the report puts the rogue's recorded and
#                         replayed outcomes side by side (the log costs pgward some speed)
set -euo pipefail

cd "$(dirname "$0")/.."
# shellcheck source=bench/throwaway-pg.sh
. bench/throwaway-pg.sh

read -r -a targets <<<"${TARGETS:-direct pgbouncer pgward}"
identities=("$@")
[ "${#identities[@]}" -gt 0 ] || identities=(roles tags)
rounds=${ROUNDS:-3}
seconds=${PGWARD_BENCH_SECONDS:-15}
protocol=${PROTOCOL:-simple}
read_ms=${READ_MS:-333}
innocent_rate=${INNOCENT_RATE:-}
small_rows=${SMALL_ROWS:-100000}
pool_size=${POOL_SIZE:-12}
auth_type=${AUTH_TYPE:-md5}
plot_round=${PLOT_ROUND:-1}
traffic=${TRAFFIC:-}
when_over=${WHEN_OVER:-wait}
password=benchpass
innocents=(innocent1 innocent2 innocent3)
innocent_clients=2
rogue_clients=6
rogue_sql="select count(*), sum(length(pad)) from big"

check_choices target "direct pgbouncer pgward" "${targets[@]}"
for identity in "${identities[@]}"; do
    case $identity in roles | tags) ;; *) die "unknown identity mode: $identity (roles or tags)" ;; esac
done
case $protocol in simple | extended) ;; *) die "PROTOCOL must be simple or extended" ;; esac
case $when_over in wait | reject | slow) ;; *) die "WHEN_OVER must be wait, reject or slow" ;; esac

has_target() {
    [[ " ${targets[*]} " == *" $1 "* ]]
}

ensure_postgres
if has_target pgbouncer; then ensure_pgbouncer; fi
if has_target pgward; then pgward_bin=$(pgward_binary); fi
plotter=gnuplot
if ! command -v gnuplot >/dev/null; then
    if is_root; then apt_install gnuplot-nox; else plotter=""; fi
fi

# The poolers that pooler_start runs (stopped when the script exits).
# shellcheck disable=SC2034 # pooler_pid is for pooler_start and pooler_stop
declare -A pooler_pid=() pooler_port=()

# --- PostgreSQL and the data ------------------------------------------------------------------
throwaway_start pgward-rogue "host all all 127.0.0.1/32 trust" bench "$password"
work=$THROWAWAY_DIR
pg_port=$THROWAWAY_PORT

# sql QUERY: runs QUERY in the bench database as the postgres superuser; prints the rows.
sql() {
    psql -X -q -w -At -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$pg_port" -U postgres -d bench -c "$1"
}

for role in "${innocents[@]}" rogue app; do
    pg_sql "$pg_port" postgres "CREATE ROLE $role LOGIN PASSWORD '$password'"
done
echo "loading the lookup table: $small_rows rows"
sql "CREATE TABLE small (id int PRIMARY KEY, pad text NOT NULL);
     INSERT INTO small SELECT g, md5(g::text) FROM generate_series(1, $small_rows) g;
     GRANT SELECT ON small TO innocent1, innocent2, innocent3, app" >/dev/null
sql "VACUUM (FREEZE, ANALYZE) small" >/dev/null

# make_big ROWS: (re)creates the large table with ROWS rows of about 100 bytes each.
make_big() {
    sql "DROP TABLE IF EXISTS big;
         CREATE TABLE big (id bigint NOT NULL, pad text NOT NULL) WITH (autovacuum_enabled = off);
         INSERT INTO big SELECT g, md5(g::text) || md5((-g)::text) FROM generate_series(1, $1) g;
         GRANT SELECT ON big TO rogue, app" >/dev/null
    sql "VACUUM (FREEZE, ANALYZE) big" >/dev/null
}

# measure_read: milliseconds of one rogue read on its own (the median of 5, after one to warm
# up; the median, since other work on the machine can slow any one read down).
measure_read() {
    local file="$work/one-read.sql" out
    echo "$rogue_sql;" >"$file"
    rm -f "$work"/one-read.log*
    out=$(pgbench -n -f "$file" -t 1 -h 127.0.0.1 -p "$pg_port" -U rogue bench 2>&1 &&
        pgbench -n -f "$file" -t 5 -l --log-prefix="$work/one-read.log" -h 127.0.0.1 \
            -p "$pg_port" -U rogue bench 2>&1) || die "the rogue's read failed: $out"
    cat "$work"/one-read.log* | awk '{print $3}' | sort -n | awk '{v[NR] = $1}
        END {printf "%.1f\n", v[int((NR + 1) / 2)] / 1000}'
}

# Sizes the large table so that one read takes about READ_MS: measure, scale, measure again.
big_rows=${BIG_ROWS:-2000000}
echo "loading the large table: $big_rows rows"
make_big "$big_rows"
one_read_ms=$(measure_read)
if [ -z "${BIG_ROWS:-}" ]; then
    for _ in 1 2 3; do
        next=$(awk -v r="$big_rows" -v got="$one_read_ms" -v want="$read_ms" 'BEGIN {
            f = want / got; if (f > 0.85 && f < 1.15) { print ""; exit }
            if (f > 8) f = 8; if (f < 0.125) f = 0.125
            n = int(r * f / 100000 + 0.5) * 100000; print (n < 100000 ? 100000 : n) }')
        if [ -z "$next" ] || [ "$next" = "$big_rows" ]; then break; fi
        echo "one read of $big_rows rows took $one_read_ms ms; resizing to $next rows"
        big_rows=$next
        make_big "$big_rows"
        one_read_ms=$(measure_read)
    done
fi
big_mb=$(sql "SELECT round(pg_table_size('big') / 1048576.0)")
read_cost=$(sql "EXPLAIN (FORMAT JSON) $rogue_sql" | grep -o '"Total Cost": [0-9.]*' | head -n 1 |
    awk '{print $3}')
[ -n "$read_cost" ] || die "no cost in EXPLAIN's answer for the rogue's read"
# The rogue's budget in seconds of server time: one read (as long as it takes alone) saved up,
# and one more paid back over a run.
read_s=$(awk -v ms="$one_read_ms" 'BEGIN {printf "%.4f", ms / 1000}')
burst=$read_s
rate=$(awk -v b="$read_s" -v s="$seconds" 'BEGIN {printf "%.6f", b / s}')
pays_for=$(awk -v b="$burst" -v r="$rate" -v s="$seconds" -v t="$read_s" \
    'BEGIN {printf "%.2f", (b + r * s) / t}')
echo "large table: $big_rows rows, $big_mb MB; one read alone: $one_read_ms ms; cost $read_cost"
echo "rogue budget in pgward: burst $burst s, rate $rate s per s: pays for $pays_for reads in ${seconds}s"

# --- pgbench scripts --------------------------------------------------------------------------
# role_of IDENTITY TENANT: the role a tenant logs in as.
role_of() {
    if [ "$1" = roles ]; then echo "$2"; else echo app; fi
}

# tag_of IDENTITY TENANT: the sqlcommenter comment a tenant's statements carry (tags mode only).
tag_of() {
    if [ "$1" = tags ]; then echo " /*tenant='$2'*/"; fi
}

mkdir -p "$work/scripts"
for identity in "${identities[@]}"; do
    for tenant in "${innocents[@]}"; do
        printf '\\set id random(1, %s)\nselect pad from small where id = :id%s;\n' \
            "$small_rows" "$(tag_of "$identity" "$tenant")" >"$work/scripts/$identity-$tenant.sql"
    done
    # Each completed read appends its time to the file named by -D reads=..., as it happens.
    printf '%s%s;\n\\shell date +%%s.%%N >> :reads\n' "$rogue_sql" "$(tag_of "$identity" rogue)" \
        >"$work/scripts/$identity-rogue.sql"
done

# --- poolers ----------------------------------------------------------------------------------
for role in bench "${innocents[@]}" rogue app; do
    printf '"%s" "%s"\n' "$role" "$password"
done >"$work/userlist.txt"

# policy IDENTITY: pgward's policy. The rogue pays for its reads and waits when over budget;
# the innocents have no budget. With roles, each tenant is its role; with tags, the shared
# role `app` is trusted and each statement's tag names the tenant.
policy() {
    local tenant queue_timeout=$((seconds + 10 > 60 ? seconds + 10 : 60))
    printf 'trusted_roles = ["app"]\n\n[gate]\nqueue_timeout = "%ss"\n' "$queue_timeout"
    for tenant in rogue "${innocents[@]}"; do
        printf '\n[tenants.%s]\n' "$tenant"
        if [ "$1" = roles ]; then printf 'roles = ["%s"]\n' "$tenant"; fi
        if [ "$tenant" = rogue ]; then
            printf 'priority = "best_effort"\nrate = %s\nburst = %s\nwhen_over = "%s"\n' \
                "$rate" "$burst" "$when_over"
        else
            printf 'priority = "normal"\n'
        fi
    done
    if [ -n "$traffic" ]; then printf '\n[traffic]\nfile = "traffic-%s.jsonl"\n' "$1"; fi
}

# replay IDENTITY: `pgward simulate` over the identity's traffic log, under its policy.
replay() {
    local dir="$work/pgward"
    [ -s "$dir/traffic-$1.jsonl" ] || return 0
    "$work/pgward-bin" simulate --policy "$dir/policy-$1.toml" --traffic "$dir/traffic-$1.jsonl" \
        >"$dir/simulate-$1.txt" 2>&1 || echo "warning: pgward simulate failed" >&2
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

# start_pgward IDENTITY: pgward with the identity mode's policy. A pgward that refuses the
# policy (one from before the admission gate) runs without one, and the report says so.
gate_note=""
start_pgward() {
    local policy_file="$work/pgward/policy-$1.toml"
    mkdir -p "$work/pgward"
    policy "$1" >"$policy_file"
    start_pooler pgward "$work/pgward-bin" "$policy_file" && return 0
    gate_note="this pgward refused the gate policy ($(cat "$work/pgward/stdout.log" \
        "$work/pgward/pooler.log" 2>/dev/null | sed -n 's/.*\.toml:[0-9]*: //p' | head -n 1 | cut -c 1-200)),"
    gate_note+=" so it ran without a policy_file, as a plain pooler"
    echo "warning: $gate_note" >&2
    start_pooler pgward "$work/pgward-bin" || die "pgward did not start"
}

if has_target pgbouncer; then
    start_pooler pgbouncer "$(command -v pgbouncer)" || die "pgbouncer did not start"
fi
if has_target pgward; then
    # A copy, since the postgres OS user may not reach the source tree (under /root, say).
    install -m 755 "$pgward_bin" "$work/pgward-bin"
fi

target_port() {
    if [ "$1" = direct ]; then echo "$pg_port"; else echo "${pooler_port[$1]}"; fi
}

# --- runs -------------------------------------------------------------------------------------
# bench_client IDENTITY TENANT PORT DIR CLIENTS [pgbench options...]: one tenant's pgbench in the
# background for the length of a run; its output goes to DIR/TENANT.out.
bench_client() {
    local identity=$1 tenant=$2 port=$3 dir=$4 clients=$5
    shift 5
    PGPASSWORD=$password pgbench -n -M "$protocol" -f "$work/scripts/$identity-$tenant.sql" \
        -c "$clients" -j 1 -T "$seconds" -h 127.0.0.1 -p "$port" -U "$(role_of "$identity" "$tenant")" \
        "$@" bench >"$dir/$tenant.out" 2>&1 &
}

# stop_rogue PID: ends the rogue at the end of the innocents' run: its pgbench stops, and the
# reads it left running on the server are cancelled, so no run spills into the next.
stop_rogue() {
    local left
    kill "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
    for _ in $(seq 1 100); do
        left=$(sql "SET client_min_messages = error;
                    SELECT count(pg_cancel_backend(pid)) FROM pg_stat_activity
                    WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()
                      AND state = 'active' AND query LIKE '%from big%'")
        [ "$left" = 0 ] && return 0
        sleep 0.1
    done
    echo "warning: rogue reads still running after the run" >&2
}

# run_phase IDENTITY TARGET DIR quiet|rogue: the innocents for one run, and the rogue with them.
run_phase() {
    local identity=$1 target=$2 dir=$3 port tenant pids=() pid rogue_pid=""
    port=$(target_port "$target")
    mkdir -p "$dir"
    date +%s.%N >"$dir/start"
    for tenant in "${innocents[@]}"; do
        bench_client "$identity" "$tenant" "$port" "$dir" "$innocent_clients" \
            -l --log-prefix="$dir/$tenant" ${innocent_rate:+-R "$innocent_rate"}
        pids+=($!)
    done
    if [ "$4" = rogue ]; then
        : >"$dir/rogue.reads"
        bench_client "$identity" rogue "$port" "$dir" "$rogue_clients" -D reads="$dir/rogue.reads"
        rogue_pid=$!
    fi
    for pid in "${pids[@]}"; do wait "$pid" || true; done
    if [ -n "$rogue_pid" ]; then stop_rogue "$rogue_pid"; fi
}

# innocent_stats DIR: "p50_ms p99_ms transactions" over every innocent lookup of a run.
innocent_stats() {
    cat "$1"/innocent[0-9].[0-9]* 2>/dev/null | awk '{print $3}' | sort -n | awk '
        function rank(p,    i) { i = int(NR * p); if (i < NR * p) i++; return v[i] / 1000 }
        { v[NR] = $1 }
        END { if (NR == 0) print "- - 0"; else printf "%.3f %.3f %d\n", rank(0.5), rank(0.99), NR }'
}

# timeline DIR: "second p99_ms" per 100 ms of the run, by when the lookups completed.
timeline() {
    cat "$1"/innocent[0-9].[0-9]* 2>/dev/null |
        awk -v start="$(cat "$1/start")" '{print int(($5 + $6 / 1e6 - start) * 10), $3}' |
        sort -k1,1n -k2,2n | awk '
        function flush(    i) {
            if (n == 0) return
            i = int(n * 0.99); if (i < n * 0.99) i++
            printf "%.2f %.3f\n", (bucket + 0.5) / 10, v[i] / 1000
        }
        $1 != bucket { flush(); n = 0; bucket = $1 }
        { v[++n] = $2 }
        END { flush() }'
}

# aborted DIR: how many pgbench clients of a run were aborted by an error.
aborted() {
    cat "$1"/*.out | grep -cE 'client [0-9]+ .*aborted' || true
}

mkdir -p bench/results
stamp=$(date -u +%Y%m%dT%H%M%SZ)
tsv="bench/results/rogue-$stamp.tsv"
report="bench/results/rogue-$stamp.md"
plot="bench/results/rogue-$stamp.png"
timeline_tsv="bench/results/rogue-$stamp-timeline.tsv"
printf 'identity\ttarget\tround\tp50_ms\tp99_ms\tquiet_p50_ms\tquiet_p99_ms\ttps\tquiet_tps\trogue_reads\taborted\tpays_for\tcheck\n' >"$tsv"
printf 'identity\ttarget\tsecond\tp99_ms\n' >"$timeline_tsv"
failures=0
fails=0

# run_pair IDENTITY TARGET ROUND: the quiet run and the rogue run; appends a line to the TSV.
run_pair() {
    local identity=$1 target=$2 round=$3 base="$work/runs/$1-$2-$3" quiet loud reads abort
    local budget="-" check="-"
    run_phase "$identity" "$target" "$base-quiet" quiet
    run_phase "$identity" "$target" "$base-rogue" rogue
    read -r -a quiet <<<"$(innocent_stats "$base-quiet")"
    read -r -a loud <<<"$(innocent_stats "$base-rogue")"
    reads=$(wc -l <"$base-rogue/rogue.reads")
    abort=$(($(aborted "$base-quiet") + $(aborted "$base-rogue")))
    if [ "${quiet[2]}" = 0 ] || [ "${loud[2]}" = 0 ]; then
        echo "round $round $identity $target: no innocent lookup completed:" >&2
        tail -n 3 "$base-quiet"/*.out "$base-rogue"/*.out >&2 || true
        failures=$((failures + 1))
        return 0
    fi
    if [ "$target" = pgward ]; then
        budget=$pays_for
        check=$(awk -v p99="${loud[1]}" -v q="${quiet[1]}" -v r="$reads" -v b="$budget" \
            'BEGIN {print (p99 <= 1.5 * q + 1 && r <= b + 1) ? "PASS" : "FAIL"}')
        [ "$check" = PASS ] || fails=$((fails + 1))
    fi
    if [ "$round" = "$plot_round" ]; then
        timeline "$base-rogue" | awk -v i="$identity" -v t="$target" '{print i "\t" t "\t" $1 "\t" $2}' \
            >>"$timeline_tsv"
    fi
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$identity" "$target" "$round" \
        "${loud[0]}" "${loud[1]}" "${quiet[0]}" "${quiet[1]}" \
        "$(awk -v n="${loud[2]}" -v s="$seconds" 'BEGIN {printf "%.0f", n / s}')" \
        "$(awk -v n="${quiet[2]}" -v s="$seconds" 'BEGIN {printf "%.0f", n / s}')" \
        "$reads" "$abort" "$budget" "$check" >>"$tsv"
    printf 'round %s  %-5s  %-9s  innocent p50 %7.3f  p99 %8.3f ms (quiet p99 %7.3f)  rogue reads %3s  aborted %s  %s\n' \
        "$round" "$identity" "$target" "${loud[0]}" "${loud[1]}" "${quiet[1]}" "$reads" "$abort" "$check"
}

echo "each run: ${seconds}s; innocents ${#innocents[@]} x $innocent_clients clients" \
    "(${innocent_rate:-unthrottled}${innocent_rate:+ lookups/s each}), rogue" \
    "$rogue_clients clients; protocol $protocol; pool size $pool_size; rounds $rounds;" \
    "targets: ${targets[*]}; identities: ${identities[*]}"
for identity in "${identities[@]}"; do
    if has_target pgward; then start_pgward "$identity"; fi
    for round in $(seq 1 "$rounds"); do
        n=${#targets[@]}
        for i in $(seq 0 $((n - 1))); do
            run_pair "$identity" "${targets[$(((i + round - 1) % n))]}" "$round"
        done
    done
    if has_target pgward; then
        pooler_stop pgward
        if [ -n "$traffic" ]; then replay "$identity"; fi
    fi
done

# --- plot -------------------------------------------------------------------------------------
# draw_plot: innocent p99 per 100 ms over the rogue runs of round PLOT_ROUND, one panel per
# identity mode, one line per target.
draw_plot() {
    local dir="$work/plot" identity target lines=() term=png
    mkdir -p "$dir"
    gnuplot -e 'set terminal' 2>&1 | grep -q pngcairo && term=pngcairo
    {
        echo "set terminal $term size 1000,$((340 * ${#identities[@]})) noenhanced"
        echo "set output '$plot'"
        echo "set multiplot layout ${#identities[@]},1"
        echo "set logscale y; set grid; set key outside right top"
        echo "set xlabel 'seconds into the run'; set ylabel 'innocent p99 per 100 ms (ms)'"
        for identity in "${identities[@]}"; do
            lines=()
            for target in "${targets[@]}"; do
                awk -F'\t' -v i="$identity" -v t="$target" '$1 == i && $2 == t {print $3, $4}' \
                    "$timeline_tsv" >"$dir/$identity-$target.dat"
                [ -s "$dir/$identity-$target.dat" ] &&
                    lines+=("'$dir/$identity-$target.dat' using 1:2 with lines lw 1.5 title '$target'")
            done
            echo "set title 'round $plot_round, $(identity_label "$identity"): rogue reading $big_rows rows on $rogue_clients connections'"
            [ "${#lines[@]}" -gt 0 ] && (IFS=,; echo "plot ${lines[*]}")
        done
        echo "unset multiplot"
    } >"$dir/plot.gp"
    gnuplot "$dir/plot.gp" || { echo "warning: gnuplot failed" >&2; plot=""; }
}

identity_label() {
    if [ "$1" = roles ]; then echo "one role per tenant"; else echo "shared role app, tenant tags"; fi
}

if [ -n "$plotter" ]; then draw_plot; else plot=""; echo "gnuplot is missing: no plot" >&2; fi

# --- summary ----------------------------------------------------------------------------------
summarize() {
    echo "# pgward rogue benchmark, $stamp"
    echo
    echo "Three innocent tenants, $innocent_clients connections each, look rows up by primary key" \
        "(\`small\`, $small_rows rows; ${innocent_rate:-as many as they can}${innocent_rate:+ per second each})" \
        "while a rogue tenant reads a large table in full on" \
        "$rogue_clients connections (\`$rogue_sql\`: $big_rows rows, $big_mb MB, one read alone" \
        "$one_read_ms ms, EXPLAIN cost $read_cost). ${seconds}s per run, $rounds rounds, targets" \
        "in turn, pgbench protocol $protocol; poolers in transaction mode with" \
        "default_pool_size $pool_size; PostgreSQL $(sql 'SHOW server_version'), $(nproc) cores," \
        "max_parallel_workers_per_gather $(sql 'SHOW max_parallel_workers_per_gather')."
    echo
    echo "pgward's rogue budget in seconds of server time: burst $burst s, rate $rate s per second, \`when_over = \"$when_over\"\`:" \
        "it pays for $pays_for reads in ${seconds}s. Innocents have no budget. Identity: roles =" \
        "one role per tenant; tags = one shared role \`app\` (trusted) with \`/*tenant='...'*/\`" \
        "tags. Quiet = the innocents alone. Checks (pgward, every round): innocent p99 <= 1.5 x" \
        "quiet p99 + 1 ms, and rogue reads <= what the budget pays for + 1."
    if [ -n "$gate_note" ]; then echo; echo "**Note: $gate_note**"; fi
    [ "$failures" = 0 ] || { echo; echo "**$failures run(s) failed and are left out.**"; }
    echo
    echo "| identity | target | innocent p50 ms | innocent p99 ms | quiet p99 ms | p99 / quiet p99 | innocent tps (quiet) | rogue reads | budget pays for | aborted clients | checks |"
    echo "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
    awk -F'\t' -v table=medians -f bench/median.awk -f bench/rogue.awk "$tsv"
    echo
    echo "Each round:"
    echo
    echo "| identity | round | target | innocent p50 ms | innocent p99 ms | quiet p99 ms | rogue reads | aborted clients | check |"
    echo "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |"
    awk -F'\t' -v table=rounds -f bench/median.awk -f bench/rogue.awk "$tsv"
    if [ -n "$plot" ]; then
        echo
        echo "![innocent p99 per 100 ms over time]($(basename "$plot"))"
    fi
    for identity in "${identities[@]}"; do
        [ -s "$work/pgward/simulate-$identity.txt" ] || continue
        echo
        echo "The traffic pgward recorded with $(identity_label "$identity"), replayed by" \
            "\`pgward simulate\` under the same policy (every round, quiet and rogue runs):"
        echo
        echo '```'
        cat "$work/pgward/simulate-$identity.txt"
        echo '```'
    done
    echo
    echo "pgward's policy with roles (with tags, the same without \`roles\`):"
    echo
    echo '```toml'
    policy roles
    echo '```'
}
summarize | tee "$report"
echo
echo "results: $tsv, $report${plot:+, $plot}, $timeline_tsv"
[ "$failures" = 0 ] && [ "$fails" = 0 ]
