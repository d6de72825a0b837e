//! Statement statistics against a real PostgreSQL: SHOW STATEMENTS' percentiles of a known
//! latency mix as the client saw it, rows, errors and refusals apart, the normalized text
//! without constants, and the bound on rows under many distinct statements.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::driver::{must_connect, outcome, show};
use common::gate::{gated, FULL_READ, REJECT_POLICY, SCHEMA};

/// The row of SHOW STATEMENTS whose query is `text` (and tenant `tenant`).
fn row<'a>(
    rows: &'a [HashMap<String, Option<String>>],
    text: &str,
    tenant: &str,
) -> &'a HashMap<String, Option<String>> {
    rows.iter()
        .find(|r| r["query"].as_deref() == Some(text) && r["tenant"].as_deref() == Some(tenant))
        .unwrap_or_else(|| panic!("no row for {text} of {tenant} in {rows:?}"))
}

fn number(r: &HashMap<String, Option<String>>, col: &str) -> f64 {
    r[col]
        .as_deref()
        .unwrap_or_default()
        .parse()
        .unwrap_or_else(|e| panic!("{col}: {e} in {r:?}"))
}

/// The exact `q` quantile of `values` (rank `ceil(q·n)`).
fn quantile(values: &mut [f64], q: f64) -> f64 {
    values.sort_by(f64::total_cmp);
    let rank = ((q * values.len() as f64).ceil() as usize).max(1);
    values[rank - 1]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_statements_gives_a_known_mix_its_percentiles_and_keeps_errors_and_refusals_apart() {
    let f = gated(
        REJECT_POLICY,
        "default_pool_size = 4\nadmin_users = admin\n",
    );
    let app = must_connect(&f.pw.connstr("postgres", None, "app")).await;
    // 20 runs of 100 ms, 5 of 200 ms, 1 of 800 ms, each timed by the client.
    let mut slept = Vec::new();
    let mut seen = Vec::new();
    for (n, ms) in [(20, 100), (5, 200), (1, 800)] {
        for _ in 0..n {
            let sql = format!("SELECT pg_sleep({})", f64::from(ms) / 1000.0);
            let t = Instant::now();
            app.client.simple_query(&sql).await.expect("sleep");
            seen.push(t.elapsed().as_secs_f64() * 1000.0);
            slept.push(f64::from(ms));
        }
    }
    // A comment and a statement whose constants pg_query's normalization keeps: never shown.
    assert_eq!(outcome(&app.client, "SELECT 3 /* secret-c */").await, "");
    let ctas = "CREATE TEMP TABLE tt AS SELECT 'secret-ctas' AS c";
    assert_eq!(outcome(&app.client, ctas).await, "");
    // An error, twice, and acme's refusal.
    for _ in 0..2 {
        assert_eq!(outcome(&app.client, "SELECT 1 / (2 - 2)").await, "22012");
    }
    let acme = must_connect(&f.pw.connstr("trustuser", None, "app")).await;
    assert_eq!(outcome(&acme.client, FULL_READ).await, "");
    assert_eq!(outcome(&acme.client, FULL_READ).await, "53000");

    let admin = must_connect(&f.pw.connstr("admin", None, "pgward")).await;
    let rows = show(&admin.client, "SHOW STATEMENTS").await;
    let sleep = row(&rows, "SELECT pg_sleep($1)", "postgres");
    assert_eq!(number(sleep, "calls"), 26.0);
    assert_eq!(number(sleep, "rows"), 26.0);
    assert_eq!(sleep["role"].as_deref(), Some("postgres"));
    assert_eq!(sleep["database"].as_deref(), Some("app"));
    for (col, q) in [("p50_ms", 0.5), ("p95_ms", 0.95), ("p99_ms", 0.99)] {
        let (low, high) = (quantile(&mut slept, q), quantile(&mut seen, q));
        let got = number(sleep, col);
        // pgward's clock starts when the request arrives and stops at its answer: no shorter
        // than the server slept and no longer than the client measured around it, each within
        // the sketch's 2% (a busy machine widens the gap between the two, not the error).
        assert!(
            got >= 0.98 * low && got <= 1.02 * high,
            "{col}: {got} ms, the server slept {low} ms and the client saw {high} ms"
        );
    }
    assert!(number(sleep, "total_ms") >= 3800.0);
    let division = row(&rows, "SELECT $1 / ($2 - $3)", "postgres");
    assert_eq!(sleep["errors"].as_deref(), Some(""));
    // Without pg_stat_statements, what only it knows is NULL.
    assert_eq!(sleep["shared_blks_hit"], None);
    assert_eq!(sleep["temp_blks_written"], None);
    assert_eq!(division["errors"].as_deref(), Some("22012:2"));
    assert_eq!(number(division, "calls"), 2.0);
    let read = row(&rows, FULL_READ, "acme");
    assert_eq!(number(read, "calls"), 1.0);
    assert_eq!(read["refused"].as_deref(), Some("budget:1"));
    // Most total time first; per tenant; no constant anywhere.
    assert_eq!(rows[0]["query"].as_deref(), Some("SELECT pg_sleep($1)"));
    let only_acme = show(&admin.client, "SHOW STATEMENTS 10 FOR acme").await;
    assert!(only_acme
        .iter()
        .all(|r| r["tenant"].as_deref() == Some("acme")));
    assert_eq!(only_acme.len(), 1);
    for r in &rows {
        let text = r["query"].as_deref().unwrap_or_default();
        assert!(!text.contains("0.1") && !text.contains("0.8"), "{text}");
        assert!(!text.contains("secret"), "{text}");
    }
    assert_eq!(number(row(&rows, "SELECT $1", "postgres"), "calls"), 1.0);
    let fingerprint = |sql: &str| {
        pgward::sql::Analyzer::new(pgward::sql::Depth::Shape, 4)
            .analyze(
                sql.as_bytes(),
                &pgward::sql::ParseContext::server_defaults(),
            )
            .fingerprint_hex()
    };
    let unshown = rows
        .iter()
        .find(|r| r["fingerprint"].as_deref() == Some(fingerprint(ctas).as_str()))
        .expect("the CREATE TABLE AS is counted");
    assert_eq!(unshown["query"], None, "{unshown:?}");
    assert_eq!(show(&admin.client, "SHOW STATEMENTS 1").await.len(), 1);
}

/// With several worker threads each keeps its own table: SHOW STATEMENTS sums a statement's
/// rows of every thread into one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_worker_threads_a_statements_rows_of_every_thread_are_summed() {
    let f = gated(
        REJECT_POLICY,
        "worker_threads = 3\ndefault_pool_size = 2\nadmin_users = admin\n",
    );
    // Six clients, two on each thread.
    let mut clients = Vec::new();
    for _ in 0..6 {
        clients.push(must_connect(&f.pw.connstr("postgres", None, "app")).await);
    }
    for round in 0..5 {
        for (i, c) in clients.iter().enumerate() {
            let sql = format!("SELECT {round} + {i}");
            assert_eq!(outcome(&c.client, &sql).await, "");
        }
    }
    for c in &clients[..3] {
        assert_eq!(outcome(&c.client, "SELECT 1 / (2 - 2)").await, "22012");
    }
    let admin = must_connect(&f.pw.connstr("admin", None, "pgward")).await;
    // A session on another thread counts its run just after the client has its answer: the
    // last ones may take a moment to show.
    let counted = |rows: &[HashMap<String, Option<String>>], text: &str| {
        rows.iter()
            .filter(|r| r["query"].as_deref() == Some(text))
            .map(|r| number(r, "calls"))
            .sum::<f64>()
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    let rows = loop {
        let rows = show(&admin.client, "SHOW STATEMENTS").await;
        let all = counted(&rows, "SELECT $1 + $2") == 30.0
            && counted(&rows, "SELECT $1 / ($2 - $3)") == 3.0;
        if all || Instant::now() > deadline {
            break rows;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let sum = row(&rows, "SELECT $1 + $2", "postgres");
    assert_eq!(number(sum, "calls"), 30.0);
    assert_eq!(number(sum, "rows"), 30.0);
    let same = |text: &str| {
        rows.iter()
            .filter(|r| r["query"].as_deref() == Some(text))
            .count()
    };
    assert_eq!(same("SELECT $1 + $2"), 1, "{rows:?}");
    let division = row(&rows, "SELECT $1 / ($2 - $3)", "postgres");
    assert_eq!(number(division, "calls"), 3.0);
    assert_eq!(division["errors"].as_deref(), Some("22012:3"));
    assert_eq!(same("SELECT $1 / ($2 - $3)"), 1, "{rows:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_table_stays_within_max_statement_stats_under_many_distinct_statements() {
    // Ten thousand distinct statements through pgward against a bound of 50 (a hundred
    // thousand against the table alone: src/ops/statements.rs).
    let f = gated("", "admin_users = admin\nmax_statement_stats = 50\n");
    common::psql_script(
        f.pw.port,
        (0..10_000).map(|i| format!("WITH x{i} AS (SELECT 1) SELECT * FROM x{i};")),
    );
    let admin = must_connect(&f.pw.connstr("admin", None, "pgward")).await;
    let rows = show(&admin.client, "SHOW STATEMENTS 10000").await;
    assert!(!rows.is_empty() && rows.len() <= 50, "{} rows", rows.len());
    assert!(rows.iter().all(|r| r["query"]
        .as_deref()
        .is_some_and(|q| q.starts_with("WITH x"))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_stat_statements_adds_buffers_temp_files_and_wal_to_the_rows() {
    // Database `forced` logs in to the server as trustuser whoever the client is.
    let f = common::policy::Policed::start_with_databases(
        &format!("{SCHEMA}; GRANT pg_read_all_stats TO trustuser"),
        "",
        "default_pool_size = 4\nadmin_users = admin\n",
        "forced = {pg} dbname=app user=trustuser",
    );
    let conf = f.pg.data_dir.join("pgward_test.conf");
    let mut settings = std::fs::read_to_string(&conf).expect("read the settings");
    settings.push_str("shared_preload_libraries = 'pg_stat_statements'\nwork_mem = '1MB'\n");
    std::fs::write(&conf, settings).expect("write the settings");
    f.pg.restart();
    f.pg.sql("CREATE EXTENSION pg_stat_statements");
    let app = must_connect(&f.pw.connstr("postgres", None, "app")).await;
    let forced = must_connect(&f.pw.connstr("postgres", None, "forced")).await;
    let admin = must_connect(&f.pw.connstr("admin", None, "pgward")).await;
    // A sort bigger than work_mem spills to temporary files (run through `forced`: the server
    // counts it for trustuser, SHOW STATEMENTS for the client's role); an update writes WAL.
    let sort = "SELECT id FROM big ORDER BY pad DESC, id OFFSET 99999";
    let update = "UPDATE small SET v = v WHERE id < 500";
    let started = Instant::now();
    let (sorted, updated) = loop {
        assert_eq!(outcome(&forced.client, sort).await, "");
        assert_eq!(outcome(&app.client, update).await, "");
        let rows = show(&admin.client, "SHOW STATEMENTS").await;
        let counted = |text: &str, col: &str| {
            rows.iter()
                .find(|r| r["query"].as_deref() == Some(text))
                .filter(|r| r["role"].as_deref() == Some("postgres"))
                .and_then(|r| r[col].as_deref()?.parse::<u64>().ok())
                .filter(|n| *n > 0)
        };
        let sorted = counted(
            "SELECT id FROM big ORDER BY pad DESC, id OFFSET $1",
            "temp_blks_written",
        );
        let updated = counted("UPDATE small SET v = v WHERE id < $1", "wal_bytes");
        if let (Some(s), Some(u)) = (sorted, updated) {
            break (s, u);
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "pg_stat_statements never reached SHOW STATEMENTS: {rows:?}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    assert!(sorted > 0 && updated > 0);
    let rows = show(&admin.client, "SHOW STATEMENTS").await;
    let read = row(
        &rows,
        "SELECT id FROM big ORDER BY pad DESC, id OFFSET $1",
        "postgres",
    );
    let blocks = number(read, "shared_blks_hit") + number(read, "shared_blks_read");
    assert!(blocks > 0.0, "{read:?}");
}
