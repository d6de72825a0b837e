#!/usr/bin/env bash
# Runs every test of pgward: unit tests, integration tests (which start throwaway PostgreSQL
# servers and pgward processes on 127.0.0.1) and doc tests. Installs PostgreSQL from Debian's
# packages first when it is missing (root only), and the database drivers the driver tests
# run. Exits non-zero when anything fails.
#
# The tests use a debug build on purpose: integration tests spend their time waiting on
# PostgreSQL and on sockets, not in pgward's code, while a release build (fat LTO) costs
# minutes more to compile on a 2-core machine and shares nothing with `cargo clippy` or a
# developer's `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."

# ensure_postgres and its helpers are shared with the benchmark and demo scripts.
# shellcheck source=bench/throwaway-pg.sh
. bench/throwaway-pg.sh
# The drivers tests/drivers.rs runs, each installed only when missing: a JDK and pgJDBC from
# Debian, node-postgres from npm into tests/drivers/node_modules, psycopg 3 and asyncpg from
# PyPI into the virtual environment target/drivers-venv (with the Prometheus client, whose
# OpenMetrics parser reads pgward's metrics in tests/metrics.rs).
ensure_drivers() {
    local missing=()
    command -v javac >/dev/null || missing+=(default-jdk-headless)
    [ -f /usr/share/java/postgresql.jar ] || missing+=(libpostgresql-jdbc-java)
    command -v node >/dev/null || missing+=(nodejs)
    command -v npm >/dev/null || missing+=(npm)
    command -v python3 >/dev/null || missing+=(python3 python3-venv)
    # ip and ss, for tests/keepalive.rs (a network namespace whose link goes down).
    { command -v ip && command -v ss; } >/dev/null || missing+=(iproute2)
    if [ "${#missing[@]}" -gt 0 ]; then apt_install "${missing[@]}"; fi
    local venv=target/drivers-venv
    if ! "$venv/bin/python" -c 'import psycopg, asyncpg, prometheus_client' 2>/dev/null; then
        python3 -m venv "$venv" || { apt_install python3-venv && python3 -m venv "$venv"; }
        "$venv/bin/python" -m pip install -q --disable-pip-version-check \
            'psycopg[binary]>=3.1' 'asyncpg>=0.29' 'prometheus-client>=0.16'
    fi
    if [ ! -f tests/drivers/node_modules/pg/package.json ]; then
        (cd tests/drivers && npm install --no-audit --no-fund --no-package-lock --silent)
    fi
}

# PostgreSQL's own regression SQL (src/test/regress/sql), the real corpus the fast shape
# reader is checked against (src/sql/fast_shape.rs), into target/sql-corpus/regress. The
# files come from the source distribution of pglast 8.8 on PyPI (a binding of libpg_query,
# which carries PostgreSQL's regression SQL for its own tests): a 4 MB download, checked
# against its SHA-256, once.
ensure_sql_corpus() {
    local dir=target/sql-corpus
    [ -f "$dir/regress/select.sql" ] && return 0
    mkdir -p "$dir"
    python3 - "$dir" <<'PY'
import hashlib, io, os, sys, tarfile, urllib.request
URL = ("https://files.pythonhosted.org/packages/62/b2/"
       "fa8b837b58f352e5941ea7a8160121d32bad978a55538232d7890b8aaad5/pglast-8.8.tar.gz")
SHA256 = "ff9998ec6bac4f30f84db6b6edb28a0fb03b1eda5c8ad211ab8362f5a08b833b"
PREFIX = "pglast-8.8/libpg_query/test/sql/postgres_regress/"
data = urllib.request.urlopen(URL, timeout=120).read()
if hashlib.sha256(data).hexdigest() != SHA256:
    sys.exit("the SQL corpus download does not match its SHA-256")
out = os.path.join(sys.argv[1], "regress")
os.makedirs(out, exist_ok=True)
with tarfile.open(fileobj=io.BytesIO(data)) as tar:
    for member in tar.getmembers():
        name = member.name
        if member.isfile() and name.startswith(PREFIX) and name.endswith(".sql"):
            with open(os.path.join(out, os.path.basename(name)), "wb") as f:
                f.write(tar.extractfile(member).read())
PY
}

ensure_postgres
echo "PostgreSQL server programs: $(pg_bindir)"
ensure_drivers
ensure_sql_corpus

# pg_query (PostgreSQL's parser) generates its Rust bindings with bindgen, which needs libclang.
ensure_libclang() {
    command -v dpkg >/dev/null || return 0
    dpkg -s libclang-dev >/dev/null 2>&1 && return 0
    if is_root; then
        apt_install libclang-dev
    else
        echo "warning: libclang-dev is missing and we are not root; building pg_query may fail" >&2
    fi
}
ensure_libclang

log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
cargo test --no-fail-fast --doc 2>&1 | tee "$log" || status=$?
cargo test --no-fail-fast --all-targets 2>&1 | tee -a "$log" || status=$?

# One closing line over all test binaries: "total: N passed, N failed, N skipped".
awk '/^test result:/ {
        for (i = 1; i <= NF; i++) {
            if ($(i + 1) ~ /^passed/) passed += $i
            if ($(i + 1) ~ /^failed/) failed += $i
            if ($(i + 1) ~ /^ignored/) ignored += $i
        }
    }
    END { printf "total: %d passed, %d failed, %d skipped\n", passed, failed, ignored }' "$log"
exit "$status"
