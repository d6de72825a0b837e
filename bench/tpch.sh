#!/usr/bin/env bash
# The accuracy benchmark: how close pgward's predicted run times come to what TPC-H queries
# really take, through pgward, on TPC-H data generated here (see bench/README.md).
#
# usage: bench/tpch.sh
# environment:
#   SCALE        TPC-H scale factor, default 0.3 (0.3 to 1 fits a 2-core machine)
#   RUNS         runs of each query through pgward, default 20 (each with fresh parameters)
#   REPEATS      runs of each query afterwards with the same parameters (the last run's),
#                default 5: how much the times of one statement move by themselves here
#   SEED         seed of the parameters' random numbers, default 1
#   QUERIES      the queries to run, default all: "q01 q02 ... q22 switch" (switch is the
#                statement whose plan follows its parameters)
#   MAX_QUERY_S  a query that takes longer than this alone (directly on PostgreSQL, before the
#                runs) is left out, default 20
#   POOL_SIZE    default_pool_size of pgward, default 4
#   PGWARD_BIN   the pgward to run (default: built with cargo build --release)
set -euo pipefail

cd "$(dirname "$0")/.."
# shellcheck source=bench/throwaway-pg.sh
. bench/throwaway-pg.sh

scale=${SCALE:-0.3}
runs=${RUNS:-20}
repeats=${REPEATS:-5}
seed=${SEED:-1}
max_query_s=${MAX_QUERY_S:-20}
pool_size=${POOL_SIZE:-4}
all_queries="q01 q02 q03 q04 q05 q06 q07 q08 q09 q10 q11 q12 q13 q14 q15 q16 q17 q18 q19 q20 q21 q22 switch"
read -r -a queries <<<"${QUERIES:-$all_queries}"
check_choices query "$all_queries" "${queries[@]}"
[[ $runs =~ ^[1-9][0-9]*$ ]] || die "RUNS must be a positive whole number"
[[ $repeats =~ ^[0-9]+$ ]] || die "REPEATS must be a whole number"
[[ $seed =~ ^[0-9]+$ ]] || die "SEED must be a whole number"
awk -v s="$scale" 'BEGIN {exit !(s + 0 > 0)}' || die "SCALE must be a number above 0"
# The late runs, whose errors make the headline figure: runs 11 to 20 of 20 (the second half).
late_from=$((runs / 2 + 1))
started=$SECONDS

# --- what is needed ---------------------------------------------------------------------------
ensure_postgres
PATH=$PATH:${CARGO_HOME:-$HOME/.cargo}/bin
if ! command -v tpchgen-cli >/dev/null; then
    is_root || die "tpchgen-cli is missing: cargo install tpchgen-cli --version 4.0.0 --locked"
    echo "installing tpchgen-cli (cargo install)"
    cargo install tpchgen-cli --version 4.0.0 --locked --quiet
fi
pgward_bin=$(pgward_binary)

# The pooler that pooler_start runs (stopped when the script exits).
# shellcheck disable=SC2034 # pooler_pid is for pooler_start and pooler_stop
declare -A pooler_pid=() pooler_port=()

# --- PostgreSQL and the data ------------------------------------------------------------------
throwaway_start pgward-tpch "host all all 127.0.0.1/32 trust" bench benchpass
work=$THROWAWAY_DIR
pg_port=$THROWAWAY_PORT

# sql QUERY: runs QUERY in the bench database as bench (who owns the tables); prints the rows.
sql() {
    psql -X -q -w -At -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$pg_port" -U bench -d bench -c "$1"
}

echo "generating TPC-H data, scale $scale (tpchgen-cli)"
t0=$SECONDS
mkdir -p "$work/data"
tpchgen-cli csv --scale-factor "$scale" --output-dir "$work/data" --quiet \
    >"$work/tpchgen.log" 2>&1 || die "tpchgen-cli failed: $(tail -n 5 "$work/tpchgen.log")"

# The tables of the TPC-H specification, with its column types; keys come after the load.
sql "
CREATE TABLE region (r_regionkey int NOT NULL, r_name char(25) NOT NULL,
    r_comment varchar(152));
CREATE TABLE nation (n_nationkey int NOT NULL, n_name char(25) NOT NULL,
    n_regionkey int NOT NULL, n_comment varchar(152));
CREATE TABLE part (p_partkey int NOT NULL, p_name varchar(55) NOT NULL,
    p_mfgr char(25) NOT NULL, p_brand char(10) NOT NULL, p_type varchar(25) NOT NULL,
    p_size int NOT NULL, p_container char(10) NOT NULL, p_retailprice decimal(15,2) NOT NULL,
    p_comment varchar(23) NOT NULL);
CREATE TABLE supplier (s_suppkey int NOT NULL, s_name char(25) NOT NULL,
    s_address varchar(40) NOT NULL, s_nationkey int NOT NULL, s_phone char(15) NOT NULL,
    s_acctbal decimal(15,2) NOT NULL, s_comment varchar(101) NOT NULL);
CREATE TABLE partsupp (ps_partkey int NOT NULL, ps_suppkey int NOT NULL,
    ps_availqty int NOT NULL, ps_supplycost decimal(15,2) NOT NULL,
    ps_comment varchar(199) NOT NULL);
CREATE TABLE customer (c_custkey int NOT NULL, c_name varchar(25) NOT NULL,
    c_address varchar(40) NOT NULL, c_nationkey int NOT NULL, c_phone char(15) NOT NULL,
    c_acctbal decimal(15,2) NOT NULL, c_mktsegment char(10) NOT NULL,
    c_comment varchar(117) NOT NULL);
CREATE TABLE orders (o_orderkey bigint NOT NULL, o_custkey int NOT NULL,
    o_orderstatus char(1) NOT NULL, o_totalprice decimal(15,2) NOT NULL,
    o_orderdate date NOT NULL, o_orderpriority char(15) NOT NULL, o_clerk char(15) NOT NULL,
    o_shippriority int NOT NULL, o_comment varchar(79) NOT NULL);
CREATE TABLE lineitem (l_orderkey bigint NOT NULL, l_partkey int NOT NULL,
    l_suppkey int NOT NULL, l_linenumber int NOT NULL, l_quantity decimal(15,2) NOT NULL,
    l_extendedprice decimal(15,2) NOT NULL, l_discount decimal(15,2) NOT NULL,
    l_tax decimal(15,2) NOT NULL, l_returnflag char(1) NOT NULL, l_linestatus char(1) NOT NULL,
    l_shipdate date NOT NULL, l_commitdate date NOT NULL, l_receiptdate date NOT NULL,
    l_shipinstruct char(25) NOT NULL, l_shipmode char(10) NOT NULL,
    l_comment varchar(44) NOT NULL);" >/dev/null

tables=(region nation part supplier partsupp customer orders lineitem)
for table in "${tables[@]}"; do
    [ -f "$work/data/$table.csv" ] || die "tpchgen-cli wrote no $table.csv in $work/data"
    sql "\\copy $table from '$work/data/$table.csv' with (format csv, header true)" >/dev/null
done
echo "loaded in $((SECONDS - t0)) s; adding keys and indexes"
# Primary keys, foreign keys and an index on each foreign key that a query joins by, as a
# TPC-H database usually has them, so the plans are the ones such a database gets.
sql "
ALTER TABLE region ADD PRIMARY KEY (r_regionkey);
ALTER TABLE nation ADD PRIMARY KEY (n_nationkey);
ALTER TABLE part ADD PRIMARY KEY (p_partkey);
ALTER TABLE supplier ADD PRIMARY KEY (s_suppkey);
ALTER TABLE partsupp ADD PRIMARY KEY (ps_partkey, ps_suppkey);
ALTER TABLE customer ADD PRIMARY KEY (c_custkey);
ALTER TABLE orders ADD PRIMARY KEY (o_orderkey);
ALTER TABLE lineitem ADD PRIMARY KEY (l_orderkey, l_linenumber);
ALTER TABLE nation ADD FOREIGN KEY (n_regionkey) REFERENCES region;
ALTER TABLE supplier ADD FOREIGN KEY (s_nationkey) REFERENCES nation;
ALTER TABLE customer ADD FOREIGN KEY (c_nationkey) REFERENCES nation;
ALTER TABLE partsupp ADD FOREIGN KEY (ps_partkey) REFERENCES part;
ALTER TABLE partsupp ADD FOREIGN KEY (ps_suppkey) REFERENCES supplier;
ALTER TABLE orders ADD FOREIGN KEY (o_custkey) REFERENCES customer;
ALTER TABLE lineitem ADD FOREIGN KEY (l_orderkey) REFERENCES orders;
ALTER TABLE lineitem ADD FOREIGN KEY (l_partkey, l_suppkey) REFERENCES partsupp;
CREATE INDEX ON nation (n_regionkey);
CREATE INDEX ON supplier (s_nationkey);
CREATE INDEX ON customer (c_nationkey);
CREATE INDEX ON partsupp (ps_suppkey);
CREATE INDEX ON orders (o_custkey);
CREATE INDEX ON lineitem (l_partkey, l_suppkey);
CREATE INDEX ON lineitem (l_suppkey);" >/dev/null
sql "VACUUM (FREEZE, ANALYZE) $(IFS=,; echo "${tables[*]}")" >/dev/null
rows=$(sql "SELECT count(*) FROM lineitem")
db_mb=$(sql "SELECT round(pg_database_size('bench') / 1048576.0)")
echo "data ready in $((SECONDS - t0)) s: lineitem $rows rows, database $db_mb MB"

# --- substitution parameters ------------------------------------------------------------------
# One line per query and run: "query TAB run TAB name=value TAB ...", drawn from the ranges of
# the TPC-H specification (section 2.4) with awk's seeded random numbers. Run 0 is the probe
# that times each query alone before the runs through pgward.
params() {
    awk -v seed="$seed" -v runs="$runs" -v scale="$scale" '
    function pick(n) { return int(rand() * n) + 1 }
    function uni(lo, hi) { return lo + int(rand() * (hi - lo + 1)) }
    # The first day of a month drawn from first_y-first_m to last_y-last_m.
    function month(first_y, first_m, last_y, last_m,    k) {
        k = first_m - 1 + uni(0, (last_y - first_y) * 12 + last_m - first_m)
        return sprintf("%04d-%02d-01", first_y + int(k / 12), k % 12 + 1)
    }
    function year_start() { return uni(1993, 1997) "-01-01" }
    function brand() { return "Brand#" uni(1, 5) uni(1, 5) }
    function type3() { return syl1[pick(6)] " " syl2[pick(5)] " " syl3[pick(5)] }
    function kv(name, value) { return "\t" name "=" value }
    function out(q, fields) { printf "%s\t%d%s\n", q, r, fields }
    BEGIN {
        srand(seed)
        n_nations = split("ALGERIA,ARGENTINA,BRAZIL,CANADA,EGYPT,ETHIOPIA,FRANCE,GERMANY," \
            "INDIA,INDONESIA,IRAN,IRAQ,JAPAN,JORDAN,KENYA,MOROCCO,MOZAMBIQUE,PERU,CHINA," \
            "ROMANIA,SAUDI ARABIA,VIETNAM,RUSSIA,UNITED KINGDOM,UNITED STATES", nation, ",")
        split("0 1 1 1 4 0 3 3 2 2 4 4 2 4 0 0 0 1 2 3 4 2 3 3 1", nation_region, " ")
        split("AFRICA,AMERICA,ASIA,EUROPE,MIDDLE EAST", region, ",")
        split("AUTOMOBILE BUILDING FURNITURE MACHINERY HOUSEHOLD", segment, " ")
        split("STANDARD SMALL MEDIUM LARGE ECONOMY PROMO", syl1, " ")
        split("ANODIZED BURNISHED PLATED POLISHED BRUSHED", syl2, " ")
        split("TIN NICKEL BRASS STEEL COPPER", syl3, " ")
        split("SM LG MED JUMBO WRAP", cont1, " ")
        split("CASE BOX BAG JAR PKG PACK CAN DRUM", cont2, " ")
        split("REG AIR,AIR,RAIL,SHIP,TRUCK,MAIL,FOB", shipmode, ",")
        split("special pending unusual express", word1, " ")
        split("packages requests accounts deposits", word2, " ")
        n_colors = split("almond antique aquamarine azure beige bisque black blanched blue " \
            "blush brown burlywood burnished chartreuse chiffon chocolate coral cornflower " \
            "cornsilk cream cyan dark deep dim dodger drab firebrick floral forest frosted " \
            "gainsboro ghost goldenrod green grey honeydew hot indian ivory khaki lace lavender " \
            "lawn lemon light lime linen magenta maroon medium metallic midnight mint misty " \
            "moccasin navajo navy olive orange orchid pale papaya peach peru pink plum powder " \
            "puff purple red rose rosy royal saddle salmon sandy seashell sienna sky slate " \
            "smoke snow spring steel tan thistle tomato turquoise violet wheat white yellow",
            color, " ")
        parts = int(200000 * scale)
        for (r = 0; r <= runs; r++) {
            out("q01", kv("delta", uni(60, 120)))
            out("q02", kv("size", uni(1, 50)) kv("type", "%" syl3[pick(5)]) \
                kv("region", region[pick(5)]))
            out("q03", kv("segment", segment[pick(5)]) kv("date", sprintf("1995-03-%02d", uni(1, 31))))
            out("q04", kv("date", month(1993, 1, 1997, 10)))
            out("q05", kv("region", region[pick(5)]) kv("date", year_start()))
            out("q06", kv("date", year_start()) kv("discount", sprintf("0.%02d", uni(2, 9))) \
                kv("quantity", uni(24, 25)))
            a = pick(n_nations); do b = pick(n_nations); while (b == a)
            out("q07", kv("nation1", nation[a]) kv("nation2", nation[b]))
            a = pick(n_nations)
            out("q08", kv("nation", nation[a]) kv("region", region[nation_region[a] + 1]) \
                kv("type", type3()))
            out("q09", kv("color", "%" color[pick(n_colors)] "%"))
            out("q10", kv("date", month(1993, 2, 1995, 1)))
            out("q11", kv("nation", nation[pick(n_nations)]) \
                kv("fraction", sprintf("%.10f", 0.0001 / scale)))
            a = pick(7); do b = pick(7); while (b == a)
            out("q12", kv("shipmode1", shipmode[a]) kv("shipmode2", shipmode[b]) \
                kv("date", year_start()))
            out("q13", kv("pattern", "%" word1[pick(4)] "%" word2[pick(4)] "%"))
            out("q14", kv("date", month(1993, 1, 1997, 12)))
            out("q15", kv("date", month(1993, 1, 1997, 10)))
            fields = kv("brand", brand()) kv("type", syl1[pick(6)] " " syl2[pick(5)] "%")
            delete used
            for (i = 1; i <= 8; i++) {
                do s = uni(1, 50); while (s in used)
                used[s] = 1
                fields = fields kv("size" i, s)
            }
            out("q16", fields)
            out("q17", kv("brand", brand()) kv("container", cont1[pick(5)] " " cont2[pick(8)]))
            out("q18", kv("quantity", uni(312, 315)))
            out("q19", kv("brand1", brand()) kv("brand2", brand()) kv("brand3", brand()) \
                kv("quantity1", uni(1, 10)) kv("quantity2", uni(10, 20)) kv("quantity3", uni(20, 30)))
            out("q20", kv("color", color[pick(n_colors)] "%") kv("date", year_start()) \
                kv("nation", nation[pick(n_nations)]))
            out("q21", kv("nation", nation[pick(n_nations)]))
            split("13 31 23 29 30 18 17", code, " ")
            for (i = 7; i > 1; i--) { j = pick(i); s = code[i]; code[i] = code[j]; code[j] = s }
            fields = ""
            for (i = 1; i <= 7; i++) fields = fields kv("code" i, code[i])
            out("q22", fields)
            # A range of part keys as wide as 1 to half the keys, log-uniformly: narrow ones
            # are read through the index, wide ones by a sequential scan.
            width = int(exp(rand() * log(parts / 2))); if (width < 1) width = 1
            lo = uni(1, parts - width + 1)
            out("switch", kv("lo", lo) kv("hi", lo + width - 1))
        }
    }'
}
params >"$work/params.tsv"

# psql_vars QUERY RUN: the psql -v options for that query and run, one per line.
psql_vars() {
    awk -F'\t' -v q="$1" -v r="$2" '$1 == q && $2 == r {for (i = 3; i <= NF; i++) print "-v\n" $i}' \
        "$work/params.tsv"
}

# run_query PORT QUERY RUN: runs the query with that run's parameters on PORT; prints the
# seconds it took as psql saw them (with its connection), or fails with psql's error.
run_query() {
    local port=$1 q=$2 r=$3 vars=() begin end out
    mapfile -t vars < <(psql_vars "$q" "$r")
    begin=$(date +%s.%N)
    out=$(psql -X -q -w -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U bench -d bench \
        "${vars[@]}" -f "bench/tpch/queries/$q.sql" 2>&1 >/dev/null) || {
        echo "$out" | head -n 5
        return 1
    }
    end=$(date +%s.%N)
    awk -v a="$begin" -v b="$end" 'BEGIN {printf "%.4f\n", b - a}'
}

# explain_direct QUERY RUN: the query's plan for that run's parameters, from EXPLAIN directly on
# PostgreSQL (not through pgward, which learns nothing from it), as "COST SHAPE": the root's
# total cost and a hash of the node types and relations in order. For the report's simulated
# model that prices every run by its own plan.
explain_direct() {
    local vars=() out
    mapfile -t vars < <(psql_vars "$1" "$2")
    { echo "EXPLAIN (FORMAT JSON)"; cat "bench/tpch/queries/$1.sql"; } >"$work/explain.sql"
    out=$(psql -X -q -w -At -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$pg_port" -U bench -d bench \
        "${vars[@]}" -f "$work/explain.sql" 2>/dev/null) || { echo "- -"; return 0; }
    echo "$out" | awk '
        /"Total Cost"/ && cost == "" { v = $0; sub(/.*"Total Cost": */, "", v); sub(/[,} ].*/, "", v); cost = v }
        /"(Node Type|Relation Name|Parallel Aware)"/ { v = $0; gsub(/^ +| +$/, "", v); shape = shape v }
        END { print (cost == "" ? "-" : cost), shape }' |
        { read -r cost shape; echo "$cost $(printf '%s' "$shape" | md5sum | cut -c 1-16)"; }
}

# --- each query alone -------------------------------------------------------------------------
# Each query runs once directly on PostgreSQL first: it warms the cache (so no run through
# pgward reads the disk where the others read memory) and leaves out a query that takes longer
# than MAX_QUERY_S.
echo "each query once alone, directly on PostgreSQL (limit ${max_query_s}s)"
kept=()
skipped=()
declare -A alone_s=()
for q in "${queries[@]}"; do
    if ! s=$(run_query "$pg_port" "$q" 0); then
        die "$q failed directly on PostgreSQL: $s"
    fi
    alone_s[$q]=$s
    if awk -v s="$s" -v m="$max_query_s" 'BEGIN {exit !(s > m)}'; then
        skipped+=("$q")
        printf '  %-6s %8.3f s: over %s s, left out\n' "$q" "$s" "$max_query_s"
    else
        kept+=("$q")
        printf '  %-6s %8.3f s\n' "$q" "$s"
    fi
done
[ "${#kept[@]}" -gt 0 ] || die "every query was left out (MAX_QUERY_S=$max_query_s)"

# --- pgward -----------------------------------------------------------------------------------
dir="$work/pgward"
mkdir -p "$dir"
install -m 755 "$pgward_bin" "$work/pgward-bin"
port=$(free_port)
# A tenant for the bench role and nothing else: no budget, no rule, no cost limit.
printf '[tenants.bench]\nroles = ["bench"]\n' >"$dir/policy.toml"
# trust, for a user pgward knows: the auth file names it.
printf '"bench" "benchpass"\n' >"$work/userlist.txt"
pooler_ini "$dir" "$pg_port" "$port" "$pool_size" trust "$work/userlist.txt" >"$dir/pooler.ini"
printf 'policy_file = %s\nverbose = 1\n' "$dir/policy.toml" >>"$dir/pooler.ini"
: >"$dir/pooler.log"
pooler_start pgward "$dir" "$port" "$work/pgward-bin" || die "pgward did not start"
log="$dir/pooler.log"

# --- runs through pgward ----------------------------------------------------------------------
mkdir -p bench/results
stamp=$(date -u +%Y%m%dT%H%M%SZ)
tsv="bench/results/tpch-$stamp.tsv"
report="bench/results/tpch-$stamp.md"
printf 'query\trun\tfingerprint\tshape\tpredicted_s\ttook_s\terror\tpsql_s\tfresh_cost\tfresh_shape\tparameters\n' >"$tsv"
failures=0
declare -A fingerprint_of=()

# measured_lines FROM: the "run measured" lines of pgward's log from byte FROM on, as
# "fingerprint shape predicted_s took_s".
measured_lines() {
    tail -c +"$(($1 + 1))" "$log" | awk '/run measured/ {
        f = s = p = t = ""
        for (i = 1; i <= NF; i++) {
            split($i, kv, "=")
            if (kv[1] == "fingerprint") f = kv[2]
            else if (kv[1] == "shape") s = kv[2]
            else if (kv[1] == "predicted_s") p = kv[2]
            else if (kv[1] == "took_s") t = kv[2]
        }
        if (f != "" && p != "" && t != "") print f, s, p, t
    }'
}

# run_pgward QUERY RUN: one run through pgward; appends its line to the TSV file. The run is
# the query's measured line that pgward logged after it (the first run sets the query's
# fingerprint; a later line with another one is not this query's).
run_pgward() {
    local q=$1 r=$2 from s lines line=()
    from=$(stat -c %s "$log")
    if ! s=$(run_query "$port" "$q" "$r"); then
        echo "run $r $q failed: $s" >&2
        failures=$((failures + 1))
        return 0
    fi
    # pgward writes the line when the server owes the client nothing, so it is there by now;
    # wait a little all the same.
    for _ in $(seq 1 20); do
        lines=$(measured_lines "$from")
        [ -z "$lines" ] || break
        sleep 0.05
    done
    if [ -z "$lines" ]; then
        echo "run $r $q: pgward logged no measured run" >&2
        failures=$((failures + 1))
        return 0
    fi
    if [ -z "${fingerprint_of[$q]:-}" ]; then
        read -r -a line <<<"$(echo "$lines" | tail -n 1)"
        fingerprint_of[$q]=${line[0]}
    else
        read -r -a line <<<"$(echo "$lines" | awk -v f="${fingerprint_of[$q]}" '$1 == f' | tail -n 1)"
        if [ "${#line[@]}" = 0 ]; then
            echo "run $r $q: no measured run with the query's fingerprint ${fingerprint_of[$q]}" \
                "(got: $(echo "$lines" | awk '{print $1}' | tr '\n' ' '))" >&2
            failures=$((failures + 1))
            return 0
        fi
    fi
    local err fresh=()
    read -r -a fresh <<<"$(explain_direct "$q" "$r")"
    err=$(awk -v p="${line[2]}" -v t="${line[3]}" 'BEGIN {e = p - t; if (e < 0) e = -e
        printf "%.4f", (t > 0 ? e / t : 0)}')
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$q" "$r" "${line[0]}" "${line[1]}" \
        "${line[2]}" "${line[3]}" "$err" "$s" "${fresh[0]}" "${fresh[1]}" \
        "$(awk -F'\t' -v q="$q" -v r="$r" '$1 == q && $2 == r {
            for (i = 3; i <= NF; i++) printf "%s%s", (i > 3 ? " " : ""), $i }' "$work/params.tsv")" \
        >>"$tsv"
    printf 'run %2s  %-6s  predicted %9.4f s  took %9.4f s  error %6.1f %%\n' "$r" "$q" \
        "${line[2]}" "${line[3]}" "$(awk -v e="$err" 'BEGIN {print e * 100}')"
}

echo "${#kept[@]} queries x $runs runs through pgward on port $port, interleaved (run 1 of" \
    "each query, then run 2 of each, ...); seed $seed"
for r in $(seq 1 "$runs"); do
    for q in "${kept[@]}"; do run_pgward "$q" "$r"; done
done
# The same parameters again (the last run's), into a file of their own: what is left of the
# error when nothing changes but the machine.
same_tsv="bench/results/tpch-$stamp-same.tsv"
runs_tsv=$tsv
tsv=$same_tsv
head -n 1 "$runs_tsv" >"$tsv"
if [ "$repeats" -gt 0 ]; then
    echo "each query $repeats times more with the parameters of run $runs"
fi
for _ in $(seq 1 "$repeats"); do
    for q in "${kept[@]}"; do run_pgward "$q" "$runs"; done
done
tsv=$runs_tsv
pooler_stop pgward
elapsed=$((SECONDS - started))

# --- summary ----------------------------------------------------------------------------------
# The tables from the TSV file: one row per query (the TPC-H queries, then the switching one
# apart), and the overall medians over the TPC-H queries alone.
# shellcheck disable=SC2016 # awk's own $ fields
tables_awk='
function median(list,    v, n, i, j, t) {
    n = split(list, v, " ")
    if (n == 0) return ""
    for (i = 2; i <= n; i++) {
        t = v[i] + 0
        for (j = i - 1; j >= 1 && v[j] + 0 > t; j--) v[j + 1] = v[j]
        v[j + 1] = t
    }
    return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
}
function pct(x) { return x == "" ? "-" : sprintf("%.1f %%", x * 100) }
function num(x, f) { return x == "" ? "-" : sprintf(f, x) }
FNR == 1 { next }
# The runs with the same parameters: their times, and pgward'"'"'s errors on them.
FILENAME == same {
    same_took[$1] = same_took[$1] " " $6
    same_err[$1] = same_err[$1] " " $7
    if ($1 != "switch") all_same_err = all_same_err " " $7
    next
}
{
    q = $1
    if (!(q in seen)) { seen[q] = 1; order[++nq] = q }
    runs_of[q]++
    alls[q] = alls[q] " " $6
    shapes[q, $4] = 1
    if (!((q, $4) in counted)) { counted[q, $4] = 1; n_shapes[q]++ }
    if ($2 == 1) { first_err[q] = $7; first_ratio[q] = ($6 > 0 ? $5 / $6 : 0) }
    if ($2 >= late) {
        late_errs[q] = late_errs[q] " " $7
        if (q in prev && $6 > 0) {
            e = (prev[q] - $6) / $6; if (e < 0) e = -e
            naive[q] = naive[q] " " e
            if (q != "switch") all_naive = all_naive " " e
        }
        if (!(q in worst) || $7 + 0 > worst[q] + 0) worst[q] = $7
        if (q != "switch") all_late = all_late " " $7
    }
    prev[q] = $6
    if (!((q, $10) in fresh_counted)) { fresh_counted[q, $10] = 1; n_fresh[q]++ }
    simulate()
}
# The same model as pgward (a moving average of ln(took / cost), alpha 0.4, per query and plan
# shape; a shape never seen starts from the median of every factor so far), but priced by each
# run'"'"'s own plan (EXPLAIN of its own parameters) instead of a cached plan.
function simulate(    key, x, list, k, p, e) {
    if ($9 == "-" || $9 + 0 <= 0 || $6 + 0 <= 0) return
    key = $1 SUBSEP $10
    x = log($6 / $9)
    p = ""
    if (key in ema) p = $9 * exp(ema[key])
    else if (n_ema > 0) {
        list = ""
        for (k in ema) list = list " " ema[k]
        p = $9 * exp(median(list))
    }
    if (p != "" && $2 >= late) {
        e = (p - $6) / $6; if (e < 0) e = -e
        sim[$1] = sim[$1] " " e
        if ($1 != "switch") all_sim = all_sim " " e
    }
    if (key in ema) ema[key] += 0.4 * (x - ema[key])
    else { ema[key] = x; n_ema++ }
}
END {
    firsts = ""; within = 0; nfirst = 0
    for (i = 1; i <= nq; i++) {
        q = order[i]
        if (q == "switch") continue
        row(q)
        if (q in first_err) {
            firsts = firsts " " first_err[q]; nfirst++
            if (first_ratio[q] >= 0.5 && first_ratio[q] <= 2) within++
        }
    }
    m_late = median(all_late); m_first = median(firsts)
    for (i = 1; i <= nq; i++) {
        q = order[i]
        spread[q] = spread_of(same_took[q])
        if (q != "switch" && spread[q] != "") all_spread = all_spread " " spread[q]
    }
    printf "| **all TPC-H queries** | | %s | %s of %d within 2x | **%s** | | %s | %s | %s | %s | | |\n", \
        pct(m_first), within, nfirst, pct(m_late), pct(median(all_naive)), pct(median(all_sim)), \
        pct(median(all_spread)), pct(median(all_same_err))
    if ("switch" in seen) row("switch")
    printf "\nSUMMARY\t%s\t%s\t%d\t%d\n", m_late, m_first, within, nfirst
}
# The median distance of the times in `list` from their median, relative to it.
function spread_of(list,    v, n, i, m, d, e) {
    n = split(list, v, " ")
    if (n < 2) return ""
    m = median(list)
    if (m <= 0) return ""
    d = ""
    for (i = 1; i <= n; i++) { e = (v[i] - m) / m; if (e < 0) e = -e; d = d " " e }
    return median(d)
}
function row(q) {
    if (!(q in spread)) spread[q] = spread_of(same_took[q])
    printf "| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %d / %d |\n", q, runs_of[q], \
        pct(first_err[q]), (q in first_ratio ? sprintf("%.2f", first_ratio[q]) : "-"), \
        pct(median(late_errs[q])), pct(worst[q]), pct(median(naive[q])), pct(median(sim[q])), \
        pct(spread[q]), pct(median(same_err[q])), num(median(alls[q]), "%.3f"), n_shapes[q], n_fresh[q]
}'

summarize() {
    local table summary m_late m_first within nfirst verdict_late verdict_first
    table=$(awk -F'\t' -v late="$late_from" -v same="$same_tsv" "$tables_awk" "$same_tsv" "$tsv")
    summary=$(echo "$table" | awk -F'\t' '$1 == "SUMMARY"')
    IFS=$'\t' read -r _ m_late m_first within nfirst <<<"$summary"
    verdict_late=$(awk -v m="$m_late" 'BEGIN {print (m != "" && m <= 0.02) ? "met" : "**not met**"}')
    verdict_first=$(awk -v w="$within" -v n="$nfirst" \
        'BEGIN {print (n > 0 && w == n) ? "met" : "**not met**"}')
    echo "# pgward prediction accuracy, TPC-H, $stamp"
    echo
    echo "TPC-H scale $scale (lineitem $rows rows, database $db_mb MB), generated by tpchgen-cli;" \
        "primary keys, foreign keys and an index on each joined foreign key, vacuumed and analyzed."
    echo "Each query ran $runs times through pgward (transaction pooling, default_pool_size" \
        "$pool_size, a policy with one tenant and nothing else), interleaved (run 1 of every" \
        "query, then run 2, ...), each run with fresh substitution parameters (seed $seed), by" \
        "psql from one connection at a time, after one run alone directly on PostgreSQL to warm" \
        "the cache. PostgreSQL $(sql 'SHOW server_version'), $(nproc) cores, jit" \
        "$(sql 'SHOW jit'), max_parallel_workers_per_gather" \
        "$(sql 'SHOW max_parallel_workers_per_gather'). Took $((elapsed / 60)) min $((elapsed % 60)) s."
    echo
    echo "Error = |predicted - took| / took of one run, from pgward's \"run measured\" log lines" \
        "(predicted before the run; took from when it went to the server until the server owed" \
        "the client nothing). Late runs: $late_from to $runs. Ratio = predicted / took of the" \
        "first run. Previous run as prediction = the median error, over the late runs, of a" \
        "predictor that says each run takes what the query's run before it took (how much the" \
        "times move from run to run: parameters and noise). Own plan each run (simulated) = the" \
        "median error, over the late runs, of pgward's model (ln k averaged per query and" \
        "plan shape, alpha 0.4; a new shape starts from the median) replayed on the same runs" \
        "with each run priced by its own plan (EXPLAIN of its own parameters, directly on" \
        "PostgreSQL after it ran) instead of the plan pgward priced it with (pgward caches a" \
        "plan per fingerprint, whatever its constants). Shapes = plan shapes pgward logged for" \
        "the query (of the plan that priced each run) / shapes of the runs' own plans. Same" \
        "parameters = $repeats more runs of each query with the parameters of run $runs, after" \
        "the others: spread = the median distance of their times from their median (what the" \
        "machine alone moves a time by), error = pgward's median error on them."
    if [ "${#skipped[@]}" -gt 0 ]; then
        echo
        echo "Left out, slower than ${max_query_s}s alone:$(for q in "${skipped[@]}"; do
            printf ' %s (%.1f s)' "$q" "${alone_s[$q]}"; done)."
    fi
    [ "$failures" = 0 ] || { echo; echo "**$failures run(s) failed or were not logged, and are left out.**"; }
    echo
    echo "| query | runs | first run error | first run ratio | median error, late runs | worst error, late runs | previous run as prediction, late runs | own plan each run (simulated), late runs | same parameters: spread | same parameters: error | median took s | shapes (pgward / own plans) |"
    echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    echo "$table" | grep '^|'
    echo
    echo "Goals: overall median error of the late runs at most 2 %: $(awk -v m="$m_late" \
        'BEGIN {printf "%.1f %%", m * 100}'), $verdict_late; every first run within 2x" \
        "(ratio 0.5 to 2): $within of $nfirst, $verdict_first (median first-run error" \
        "$(awk -v m="$m_first" 'BEGIN {printf "%.1f %%", m * 100}')). The switch row (a plan that" \
        "follows its parameters: an index scan for a few part keys, a sequential scan for many)" \
        "is not in the overall figures."
}
summarize | tee "$report"
echo
echo "results: $tsv, $same_tsv, $report"
[ "$failures" = 0 ]
