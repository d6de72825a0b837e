#!/usr/bin/env bash
# Builds pgward, starts a throwaway PostgreSQL server with a `demo` role and database, and runs
# pgward in front of it in the foreground (transaction pooling, SCRAM authentication), with a
# policy of a few tenants named by sqlcommenter tags, a decision log, and the lines to try:
# SHOW TENANTS, a refusal over budget, a rule's refusal, SHOW STATEMENTS.
# Ctrl-C stops both and removes every file the demo made.
#
# environment: PORT (pgward's port, default 6432), DEMO_PASSWORD (default "demo")
set -euo pipefail

cd "$(dirname "$0")/.."
repo=$(pwd)
# shellcheck source=bench/throwaway-pg.sh
. bench/throwaway-pg.sh

port=${PORT:-6432}
password=${DEMO_PASSWORD:-demo}
! port_in_use "$port" || die "port $port is taken: run with PORT=<another port>"

ensure_postgres
echo "building pgward (cargo build --release)"
cargo build --release --quiet
pgward="$repo/target/release/pgward"

# shellcheck disable=SC2317 # called by throwaway_cleanup
on_cleanup() {
    echo
    echo "stopping PostgreSQL and removing $work"
}
throwaway_start pgward-demo "host all all 127.0.0.1/32 scram-sha-256" demo "$password"
work=$THROWAWAY_DIR
pg_port=$THROWAWAY_PORT

# The auth_file holds the password itself, so pgward can both check clients with SCRAM and log
# in to PostgreSQL as `demo`.
printf '"demo" "%s"\n' "${password//\"/\"\"}" >"$work/userlist.txt"
chmod 600 "$work/userlist.txt"
cat >"$work/pgward.ini" <<EOF
[databases]
demo = host=127.0.0.1 port=$pg_port dbname=demo

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir = $work
auth_type = scram-sha-256
auth_file = $work/userlist.txt
pool_mode = transaction
default_pool_size = 10
max_client_conn = 100
admin_users = demo
policy_file = $work/policy.toml
EOF

# Tenants named by tags from the demo role: `reports` may use a twentieth of a server's time
# (a big read puts it in debt, and the next is refused), `web` may not run DDL.
cat >"$work/policy.toml" <<'EOF'
trusted_roles = ["demo"]

[tenants.reports]
rate = 0.05
burst = 0.2
when_over = "reject"

[tenants.web]
priority = "critical"

[[rules]]
rule = "deny_ddl"
when = { tenants = ["web"] }

[decisions]
file = "decisions.jsonl"
wait_over = "500ms"

[traffic]
file = "traffic.jsonl"
EOF

cat <<EOF

PostgreSQL $(psql -X -At -h 127.0.0.1 -p "$pg_port" -U postgres -d postgres \
    -c 'SHOW server_version') is running on 127.0.0.1:$pg_port (files in $work).
pgward starts now on 127.0.0.1:$port with $work/pgward.ini.

Connect with (password: $password):
    psql -h 127.0.0.1 -p $port -U demo demo
or try load:
    PGPASSWORD=$password pgbench -i -h 127.0.0.1 -p $port -U demo demo
    PGPASSWORD=$password pgbench -S -c 16 -T 10 -h 127.0.0.1 -p $port -U demo demo

The policy ($work/policy.toml) names two tenants by sqlcommenter tags. In another terminal:
    export PGPASSWORD=$password
    big="/*tenant='reports'*/ SELECT count(*) FROM generate_series(1, 5000000)"
    psql -h 127.0.0.1 -p $port -U demo demo -c "\$big" -c "\$big"
        (the second is refused: 53000, reports is over its budget)
    psql -h 127.0.0.1 -p $port -U demo demo -c "/*tenant='web'*/ CREATE TABLE t (i int)"
        (refused by the rule deny_ddl: 42501)
    psql -h 127.0.0.1 -p $port -U demo pgward -c 'SHOW TENANTS' -c 'SHOW STATEMENTS 5'
    cat $work/decisions.jsonl
        (one line per refusal, and per wait over half a second)
    $pgward simulate --policy $work/policy.toml --traffic $work/traffic.jsonl
        (the traffic so far replayed under the policy; edit a copy of the policy, say a
        larger rate for reports, and replay it to see what that would have let through)

Press Ctrl-C to stop.

EOF
status=0
"$pgward" "$work/pgward.ini" || status=$?
exit "$status"
