//! The admission gate's incident tools in the admin console, end to end: SHOW TENANTS,
//! SET TENANT, KILL TENANT / STATEMENT ... FOR, UNKILL, SHOW KILLS and SHOW PLANS, with who may
//! use them, against a real PostgreSQL through tokio-postgres (prepared statements included).

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::driver::{code, columns, message, must_connect, must_value, outcome, show, Conn};
use common::gate::{gated, FULL_READ, REJECT_POLICY};
use common::policy::Policed;
use pgward::sql::{Analyzer, Depth, ParseContext};
use tokio_postgres::Client;

/// A tenant without a budget.
const TENANT_POLICY: &str = r#"
[tenants.acme]
roles = ["trustuser"]
priority = "normal"
"#;

/// pgward with a policy, console users `admin` (admin) and `watcher` (stats only).
struct Fixture(Policed);

impl Fixture {
    fn start(policy: &str) -> Fixture {
        Fixture(gated(
            policy,
            "default_pool_size = 4\nadmin_users = admin\nstats_users = watcher\n",
        ))
    }

    /// A connection to database `app` as `user`.
    async fn app(&self, user: &str) -> Conn {
        must_connect(&self.0.pw.connstr(user, None, "app")).await
    }

    /// A console connection as `user`.
    async fn console(&self, user: &str) -> Conn {
        must_connect(&self.0.pw.connstr(user, None, "pgward")).await
    }
}

/// `tenant`'s row of SHOW TENANTS, NULLs as empty strings.
async fn tenant_row(c: &Client, tenant: &str) -> HashMap<String, String> {
    let rows = show(c, "SHOW TENANTS").await;
    let row = rows
        .into_iter()
        .find(|r| r.get("tenant").cloned().flatten().as_deref() == Some(tenant))
        .unwrap_or_else(|| panic!("no row for tenant {tenant}"));
    row.into_iter()
        .map(|(k, v)| (k, v.unwrap_or_default()))
        .collect()
}

fn number(row: &HashMap<String, String>, col: &str) -> f64 {
    row[col]
        .parse()
        .unwrap_or_else(|e| panic!("{col} = {:?}: {e}", row[col]))
}

/// The fingerprint the gate computes for `sql` (16 hex digits).
fn fingerprint(sql: &str) -> String {
    Analyzer::new(Depth::Shape, 4)
        .analyze(sql.as_bytes(), &ParseContext::server_defaults())
        .fingerprint_hex()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_tenants_counts_refusals_and_set_tenant_changes_the_budget() {
    let f = Fixture::start(REJECT_POLICY);
    let app = f.app("trustuser").await;
    assert_eq!(must_value(&app.client, FULL_READ).await, "100000");
    assert_eq!(outcome(&app.client, FULL_READ).await, "53000");

    let admin = f.console("admin").await;
    assert_eq!(
        columns(&admin.client, "SHOW TENANTS").await,
        [
            "tenant",
            "settings",
            "balance",
            "debt",
            "recent_use",
            "charged",
            "waiting",
            "running",
            "refused_budget",
            "refused_killed",
            "refused_queue_timeout",
            "refused_deadline",
            "refused_too_slow",
            "refused_cost",
            "refused_rule",
            "warned_cost",
            "refused_overload",
        ]
    );
    let row = tenant_row(&admin.client, "acme").await;
    assert_eq!(row["refused_budget"], "1", "{row:?}");
    assert_eq!(row["refused_killed"], "0", "{row:?}");
    assert!(
        row["settings"].contains("rate=0.00001 burst=0.001"),
        "{row:?}"
    );
    assert!(number(&row, "balance") < 0.0, "{row:?}");
    assert_eq!(number(&row, "debt"), -number(&row, "balance"), "{row:?}");
    // Seconds of server time: the read took a few milliseconds.
    assert!(number(&row, "charged") > 0.001, "{row:?}");
    assert_eq!(row["waiting"], "0");
    assert_eq!(row["running"], "0");

    // A stats user may look, but not change anything.
    let watcher = f.console("watcher").await;
    assert_eq!(
        tenant_row(&watcher.client, "acme").await["refused_budget"],
        "1"
    );
    for cmd in [
        "SET TENANT acme = 'rate=1000000'",
        "KILL TENANT acme FOR '1m'",
        "KILL STATEMENT 00000000000000ff FOR '1m'",
        "UNKILL TENANT acme",
    ] {
        assert_eq!(outcome(&watcher.client, cmd).await, "08P01", "{cmd}");
    }

    // Bad values answer 22023 with the reason and change nothing; bad syntax is 08P01.
    let err = admin
        .client
        .simple_query("SET TENANT acme = 'rate=-1'")
        .await
        .unwrap_err();
    assert_eq!(code(&err), "22023", "{err:?}");
    assert!(message(&err).contains("rate"), "{}", message(&err));
    let c = &admin.client;
    assert_eq!(outcome(c, "SET TENANT acme = 'colour=red'").await, "22023");
    // A timeout past PostgreSQL's largest (INT_MAX milliseconds) is no timeout it knows.
    let endless = "SET TENANT acme = 'statement_timeout=200000000000000d'";
    assert_eq!(outcome(c, endless).await, "22023");
    assert_eq!(outcome(c, "SET TENANT acme 'rate=5'").await, "08P01");
    assert!(tenant_row(c, "acme").await["settings"].contains("rate=0.00001 burst=0.001"));

    // A rate that pays the debt back at once lets the tenant through.
    let set = "SET TENANT acme = 'rate=100000000 burst=100000000'";
    assert_eq!(outcome(c, set).await, "");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(must_value(&app.client, FULL_READ).await, "100000");

    // And a tight one stops it again: one more read into debt, then 53000.
    assert_eq!(
        outcome(c, "SET TENANT acme = 'rate=0.00001 burst=0.001'").await,
        ""
    );
    assert_eq!(must_value(&app.client, FULL_READ).await, "100000");
    assert_eq!(outcome(&app.client, FULL_READ).await, "53000");
    let row = tenant_row(c, "acme").await;
    assert_eq!(row["refused_budget"], "2", "{row:?}");
    assert!(
        row["settings"].contains("rate=0.00001 burst=0.001"),
        "{row:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_plans_reports_the_plan_cache() {
    let f = Fixture::start(TENANT_POLICY);
    let app = f.app("trustuser").await;
    for _ in 0..3 {
        assert_eq!(must_value(&app.client, FULL_READ).await, "100000");
    }
    let admin = f.console("watcher").await;
    let plans = show(&admin.client, "SHOW PLANS").await;
    assert_eq!(plans.len(), 1);
    let row: HashMap<String, String> = plans[0]
        .iter()
        .map(|(k, v)| (k.clone(), v.clone().unwrap_or_default()))
        .collect();
    assert_eq!(
        columns(&admin.client, "SHOW PLAN_CACHE").await,
        [
            "entries",
            "hits",
            "misses",
            "hit_rate",
            "explains",
            "explain_errors",
            "explain_avg_ms",
            "explain_max_ms",
        ]
    );
    assert!(number(&row, "entries") >= 1.0, "{row:?}");
    assert!(number(&row, "explains") >= 1.0, "{row:?}");
    assert_eq!(row["explain_errors"], "0", "{row:?}");
    assert!(number(&row, "misses") >= 1.0, "{row:?}");
    // The same statement again within a minute is priced from the cache.
    assert!(number(&row, "hits") >= 2.0, "{row:?}");
    let rate = number(&row, "hit_rate");
    assert!(rate > 0.0 && rate < 1.0, "{row:?}");
    assert!(number(&row, "explain_avg_ms") > 0.0, "{row:?}");
    assert!(number(&row, "explain_max_ms") >= number(&row, "explain_avg_ms"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_tenant_refuses_its_statements_until_unkill() {
    let f = Fixture::start(TENANT_POLICY);
    let app = f.app("trustuser").await;
    let lookup = app
        .client
        .prepare("SELECT v FROM small WHERE id = $1")
        .await
        .expect("prepare");
    let rows = app.client.query(&lookup, &[&3i32]).await.expect("lookup");
    assert_eq!(rows[0].get::<_, String>(0), "v3");
    // Transactions opened before the kill.
    let committing = f.app("trustuser").await;
    committing
        .client
        .batch_execute("BEGIN")
        .await
        .expect("BEGIN");
    let failing = f.app("trustuser").await;
    failing.client.batch_execute("BEGIN").await.expect("BEGIN");
    let other = f.app("postgres").await;

    let admin = f.console("admin").await;
    let c = &admin.client;
    assert_eq!(outcome(c, "KILL TENANT acme FOR '10m'").await, "");

    let err = app.client.simple_query("SELECT 1").await.unwrap_err();
    assert_eq!(code(&err), "53000", "{err:?}");
    assert!(
        message(&err).contains("tenant \"acme\" is killed"),
        "{err:?}"
    );
    // A comment PostgreSQL ends at a carriage return does not pass a SELECT off as a COMMIT.
    let hidden = app
        .client
        .simple_query("--\rSELECT 1 AS\nCOMMIT")
        .await
        .unwrap_err();
    assert_eq!(code(&hidden), "53000", "{hidden:?}");
    // Kills are checked at every Bind: the next run of a prepared statement is refused.
    let err = app.client.query(&lookup, &[&3i32]).await.unwrap_err();
    assert_eq!(code(&err), "53000", "{err:?}");
    // Other tenants go on.
    assert_eq!(must_value(&other.client, "SELECT 1").await, "1");
    // Open transactions can end: COMMIT and ROLLBACK go through, work inside them does not.
    assert_eq!(outcome(&committing.client, "COMMIT").await, "");
    assert_eq!(outcome(&failing.client, "SELECT 2").await, "53000");
    assert_eq!(outcome(&failing.client, "ROLLBACK").await, "");
    // A new transaction is work of the tenant: BEGIN is refused too.
    assert_eq!(outcome(&failing.client, "BEGIN").await, "53000");

    let kills = show(&admin.client, "SHOW KILLS").await;
    assert_eq!(kills.len(), 1, "{kills:?}");
    let kill = &kills[0];
    assert_eq!(kill["type"].as_deref(), Some("tenant"));
    assert_eq!(kill["target"].as_deref(), Some("acme"));
    let left: u64 = kill["expires_in"].as_deref().unwrap().parse().unwrap();
    assert!((590..=600).contains(&left), "{kill:?}");
    assert!(kill["expires_at"].as_deref().unwrap().ends_with(" UTC"));
    let watcher = f.console("watcher").await;
    assert_eq!(show(&watcher.client, "SHOW KILLS").await.len(), 1);

    // Bad values: 22023.
    assert_eq!(outcome(c, "KILL TENANT acme FOR 'soon'").await, "22023");
    assert_eq!(outcome(c, "KILL TENANT acme FOR '0s'").await, "22023");

    assert_eq!(outcome(c, "UNKILL TENANT acme").await, "");
    assert!(show(&admin.client, "SHOW KILLS").await.is_empty());
    let rows = app.client.query(&lookup, &[&4i32]).await.expect("lookup");
    assert_eq!(rows[0].get::<_, String>(0), "v4");
    assert_eq!(must_value(&failing.client, "SELECT 5").await, "5");
    // No such kill any more.
    assert_eq!(outcome(c, "UNKILL TENANT acme").await, "42704");
    let row = tenant_row(c, "acme").await;
    assert_eq!(row["refused_killed"], "5", "{row:?}");

    // A kill ends by itself when its time is up.
    assert_eq!(outcome(c, "KILL TENANT acme FOR '300ms'").await, "");
    assert_eq!(outcome(&app.client, "SELECT 1").await, "53000");
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(must_value(&app.client, "SELECT 1").await, "1");
    assert!(show(&admin.client, "SHOW KILLS").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_statement_refuses_it_for_every_tenant_until_unkill() {
    let f = Fixture::start(TENANT_POLICY);
    let app = f.app("trustuser").await;
    let other = f.app("postgres").await;
    let admin = f.console("admin").await;
    let c = &admin.client;
    // Texts that differ only in constants share a fingerprint.
    let fp = fingerprint("SELECT v FROM small WHERE id = 1");
    assert_eq!(fp.len(), 16);
    assert_eq!(
        outcome(c, &format!("KILL STATEMENT {fp} FOR '1h'")).await,
        ""
    );

    for conn in [&app, &other] {
        let err = conn
            .client
            .simple_query("SELECT v FROM small WHERE id = 7")
            .await
            .unwrap_err();
        assert_eq!(code(&err), "53000", "{err:?}");
        assert!(message(&err).contains(&fp), "{err:?}");
        assert_eq!(
            must_value(&conn.client, "SELECT count(*) FROM small").await,
            "1000"
        );
    }
    let kills = show(c, "SHOW KILLS").await;
    assert_eq!(kills.len(), 1, "{kills:?}");
    assert_eq!(kills[0]["type"].as_deref(), Some("statement"));
    assert_eq!(kills[0]["target"].as_deref(), Some(fp.as_str()));

    // The fingerprint is read in either case.
    let unkill = format!("UNKILL STATEMENT {}", fp.to_uppercase());
    assert_eq!(outcome(c, &unkill).await, "");
    assert!(show(c, "SHOW KILLS").await.is_empty());
    assert_eq!(
        must_value(&app.client, "SELECT v FROM small WHERE id = 7").await,
        "v7"
    );
    assert_eq!(outcome(c, &unkill).await, "42704");

    // A prepared statement is stopped at its next Bind.
    let text = "SELECT v FROM small WHERE id = $1";
    let lookup = app.client.prepare(text).await.expect("prepare");
    assert_eq!(
        app.client.query(&lookup, &[&2i32]).await.expect("run")[0].get::<_, String>(0),
        "v2"
    );
    let fp = fingerprint(text);
    assert_eq!(
        outcome(c, &format!("KILL STATEMENT '{fp}' FOR '1h'")).await,
        ""
    );
    let err = app.client.query(&lookup, &[&2i32]).await.unwrap_err();
    assert_eq!(code(&err), "53000", "{err:?}");
    assert_eq!(outcome(c, &format!("UNKILL STATEMENT {fp}")).await, "");
    assert!(app.client.query(&lookup, &[&2i32]).await.is_ok());

    // Bad fingerprints are bad values; KILL of a database is still PgBouncer's KILL.
    assert_eq!(outcome(c, "KILL STATEMENT nothex FOR '1m'").await, "22023");
    assert_eq!(
        outcome(c, "KILL STATEMENT 00000000000000000 FOR '1m'").await,
        "22023"
    );
    let err = c.simple_query("KILL nosuchdb").await.unwrap_err();
    assert_eq!(code(&err), "08P01");
    assert!(message(&err).contains("no such database"), "{err:?}");
}

/// A price known before the wait (a cached plan) is charged at admission; when the request
/// then gets no server (session pooling, the only server held by another client, past
/// `query_wait_timeout`) it never runs, and its tenant gets the charge back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_gets_no_server_is_not_charged() {
    let f = Fixture(gated(
        "[tenants.acme]\nroles = [\"trustuser\"]\nburst = 10\nrate = 1\n",
        "pool_mode = session\ndefault_pool_size = 1\nmax_db_connections = 1\n\
         query_wait_timeout = 1\nadmin_users = admin\n",
    ));
    let admin = f.console("admin").await;
    {
        // Runs the full read once (its plan cached), then leaves: the server goes back.
        let first = f.app("trustuser").await;
        must_value(&first.client, FULL_READ).await;
    }
    let holder = f.app("postgres").await;
    let mut charged = 0.0;
    for _ in 0..50 {
        // The first client's run is settled and its server back in the pool.
        let row = tenant_row(&admin.client, "acme").await;
        charged = number(&row, "charged");
        if charged > 0.0 && must_value(&holder.client, "SELECT 1").await == "1" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(charged > 0.0, "the first read was not charged");
    // The holder keeps the only server; this client is admitted, charged, and gets none.
    let waiting = f.app("trustuser").await;
    let err = waiting.client.simple_query(FULL_READ).await.unwrap_err();
    assert_eq!(code(&err), "57014", "{err:?}");
    let row = tenant_row(&admin.client, "acme").await;
    assert_eq!(number(&row, "charged"), charged, "{row:?}");
}

/// The answers up to ReadyForQuery (read off the runtime's threads), as tags with each
/// error's SQLSTATE in brackets.
async fn answers(mut r: common::raw::Raw) -> (common::raw::Raw, String) {
    tokio::task::spawn_blocking(move || {
        let messages = r.until_ready_within(Duration::from_secs(10)).unwrap();
        let mut tags = String::new();
        for m in &messages {
            tags.push(m.tag as char);
            if m.tag == b'E' {
                tags.push_str(&format!("[{}]", m.fields().code()));
            }
        }
        (r, tags)
    })
    .await
    .unwrap()
}

/// KILL STATEMENT cancels the statement the server runs, not the one the gate let through
/// last: in a pipeline, a kill of a statement queued behind the running one cancels
/// nothing, and a kill of the running one cancels it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_statement_in_a_pipeline_cancels_the_running_statement_only() {
    use common::raw::{named_extended_query, sync_message};
    let f = Fixture::start(TENANT_POLICY);
    let admin = f.console("admin").await;
    let c = &admin.client;
    let sleep = "SELECT pg_sleep(1.5)";
    let lookup = "SELECT v FROM small WHERE id = 3";
    let mut pipeline = named_extended_query("", sleep);
    pipeline.extend(named_extended_query("", lookup));
    pipeline.extend(sync_message());
    let mut r = f.0.pw.client_as("trustuser", "app");

    r.send(&pipeline);
    f.0.wait_until_running("pg_sleep").await;
    let kill_lookup = format!("KILL STATEMENT {} FOR '1m'", fingerprint(lookup));
    assert_eq!(outcome(c, &kill_lookup).await, "");
    let (mut r, got) = answers(r).await;
    assert_eq!(
        got, "12DC12DCZ",
        "the kill of the statement behind it cancelled the sleep"
    );
    let unkill = format!("UNKILL STATEMENT {}", fingerprint(lookup));
    assert_eq!(outcome(c, &unkill).await, "");

    r.send(&pipeline);
    f.0.wait_until_running("pg_sleep").await;
    let kill_sleep = format!("KILL STATEMENT {} FOR '1m'", fingerprint(sleep));
    assert_eq!(outcome(c, &kill_sleep).await, "");
    let (_, got) = answers(r).await;
    assert_eq!(got, "12E[57014]Z", "the running sleep was not cancelled");
}

/// `r` in a transaction with portal `c1` of `sql` bound, its first two rows read.
async fn cursor_opened(mut r: common::raw::Raw, sql: &str) -> common::raw::Raw {
    use common::raw::{query_message, Batch};
    r.send(&query_message("BEGIN"));
    let got;
    (r, got) = answers(r).await;
    assert_eq!(got, "CZ");
    let bound = Batch::new().parse("", sql, &[]).bind("c1", "", &[]);
    r.send(&bound.execute("c1", 2).sync().bytes);
    let got;
    (r, got) = answers(r).await;
    assert_eq!(got, "12DDsZ", "{sql}");
    r
}

/// A portal bound before a kill goes on only if the kill is SOFT: each later Execute of it
/// (a cursor's next rows) is refused by one that is not, and what ends the transaction
/// still runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_portal_bound_before_a_kill_is_stopped_at_its_next_execute() {
    use common::raw::{query_message, Batch};
    let f = Fixture::start(TENANT_POLICY);
    let admin = f.console("admin").await;
    let c = &admin.client;
    let series = "SELECT generate_series(1, 10)";
    let fetch = |portal: &str| Batch::new().execute(portal, 2).sync().bytes;
    let mut r = f.0.pw.client_as("trustuser", "app");
    for (kill, unkill, refused) in [
        (
            "KILL TENANT acme FOR '1m' SOFT",
            "UNKILL TENANT acme",
            false,
        ),
        ("KILL TENANT acme FOR '1m'", "UNKILL TENANT acme", true),
        (
            &*format!("KILL STATEMENT {} FOR '1m'", fingerprint(series)),
            &*format!("UNKILL STATEMENT {}", fingerprint(series)),
            true,
        ),
    ] {
        r = cursor_opened(r, series).await;
        assert_eq!(outcome(c, kill).await, "", "{kill}");
        r.send(&fetch("c1"));
        let got;
        (r, got) = answers(r).await;
        match refused {
            true => assert_eq!(got, "E[53000]Z", "{kill}"),
            false => assert_eq!(got, "DDsZ", "{kill}"),
        }
        r.send(&query_message("ROLLBACK"));
        let got;
        (r, got) = answers(r).await;
        assert_eq!(got, "CZ", "{kill}: what ends the transaction runs");
        assert_eq!(outcome(c, unkill).await, "", "{kill}");
    }
}

/// An Execute refused by a kill fails its batch: the server skips what follows it up to the
/// Sync, and the gate neither admits nor counts it (SHOW STATEMENTS counts no run of it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_behind_a_refused_execute_in_its_batch_are_not_counted_as_run() {
    use common::raw::Batch;
    let f = Fixture::start(TENANT_POLICY);
    let admin = f.console("admin").await;
    let c = &admin.client;
    let series = "SELECT generate_series(1, 10)";
    let mut r = cursor_opened(f.0.pw.client_as("trustuser", "app"), series).await;
    let kill = format!("KILL STATEMENT {} FOR '1m'", fingerprint(series));
    assert_eq!(outcome(c, &kill).await, "");
    let behind = "SELECT 40 + 2 AS behind";
    let batch = Batch::new()
        .execute("c1", 2)
        .parse("", behind, &[])
        .bind("", "", &[])
        .execute("", 0)
        .sync();
    r.send(&batch.bytes);
    let (_r, got) = answers(r).await;
    assert_eq!(got, "E[53000]Z");
    let rows = show(c, "SHOW STATEMENTS").await;
    let counted: Vec<_> = rows
        .iter()
        .filter(|r| r["query"].as_deref().is_some_and(|q| q.contains("behind")))
        .collect();
    assert!(
        counted.is_empty(),
        "a skipped statement was counted as run: {counted:?}"
    );
}

/// In session pooling the client's unnamed statement outlives a Bind of it that a kill
/// refused inside a transaction (the server raised the refusal in its place): once the kill
/// is lifted, the next Bind of it runs it, as on PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_bind_leaves_the_unnamed_statement_in_session_pooling() {
    use common::raw::Batch;
    let settings = "pool_mode = session\ndefault_pool_size = 4\nadmin_users = admin\n";
    let f = Fixture(gated(TENANT_POLICY, settings));
    let admin = f.console("admin").await;
    let c = &admin.client;
    let sql = "SELECT 41 + 1 AS unnamed";
    let mut r = f.0.pw.client_as("trustuser", "app");
    // Transaction control by named statements: a simple Query, or an unnamed Parse, would
    // replace the unnamed statement on PostgreSQL itself.
    let prepared = Batch::new()
        .parse("", sql, &[])
        .parse("b", "BEGIN", &[])
        .parse("rb", "ROLLBACK", &[]);
    r.send(&prepared.sync().bytes);
    let got;
    (r, got) = answers(r).await;
    assert_eq!(got, "111Z");
    let run = |statement: &str| Batch::new().bind("", statement, &[]).execute("", 0).sync();
    let kill = format!("KILL STATEMENT {} FOR '1m'", fingerprint(sql));
    assert_eq!(outcome(c, &kill).await, "");
    for (statement, want) in [("b", "2CZ"), ("", "E[53000]Z"), ("rb", "2CZ")] {
        r.send(&run(statement).bytes);
        let got;
        (r, got) = answers(r).await;
        assert_eq!(got, want, "{statement}");
    }
    let unkill = format!("UNKILL STATEMENT {}", fingerprint(sql));
    assert_eq!(outcome(c, &unkill).await, "");
    r.send(&run("").bytes);
    let got;
    (r, got) = answers(r).await;
    assert_eq!(got, "2DCZ", "the client's unnamed statement is gone");
    // A Parse of it that fails drops it, as on PostgreSQL: nothing is prepared again.
    r.send(
        &Batch::new()
            .parse("", "SELECT * FROM no_such_table", &[])
            .sync()
            .bytes,
    );
    let got;
    (r, got) = answers(r).await;
    assert_eq!(got, "E[42P01]Z");
    r.send(&run("").bytes);
    let got;
    (r, got) = answers(r).await;
    assert_eq!(got, "E[26000]Z");
    // As does one pgward refuses itself.
    r.send(&Batch::new().parse("", sql, &[]).sync().bytes);
    let got;
    (r, got) = answers(r).await;
    assert_eq!(got, "1Z");
    r.send(&Batch::new().parse("", "SELEC 1", &[]).sync().bytes);
    let got;
    (r, got) = answers(r).await;
    assert_eq!(got, "E[42501]Z");
    r.send(&run("").bytes);
    let (_r, got) = answers(r).await;
    assert_eq!(got, "E[26000]Z");
}

/// A cursor is stopped by a kill of the tenant its Bind named, whatever the client ran since
/// for another tenant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_portal_is_stopped_by_a_kill_of_its_own_tenant() {
    use common::raw::{query_message, Batch};
    let f = Fixture::start(
        "trusted_roles = [\"trustuser\"]\n[tenants.a]\npriority = \"normal\"\n[tenants.b]\npriority = \"normal\"\n",
    );
    let admin = f.console("admin").await;
    let c = &admin.client;
    let mut r = f.0.pw.client_as("trustuser", "app");
    let exchange = |r: common::raw::Raw, bytes: Vec<u8>| {
        let mut r = r;
        r.send(&bytes);
        answers(r)
    };
    let got;
    (r, got) = exchange(r, query_message("BEGIN")).await;
    assert_eq!(got, "CZ");
    let bound = Batch::new()
        .parse("", "SELECT generate_series(1, 10) /*tenant='a'*/", &[])
        .bind("c1", "", &[]);
    let got;
    (r, got) = exchange(r, bound.execute("c1", 2).sync().bytes).await;
    assert_eq!(got, "12DDsZ");
    let got;
    (r, got) = exchange(r, query_message("SELECT 1 /*tenant='b'*/")).await;
    assert_eq!(got, "TDCZ");
    assert_eq!(outcome(c, "KILL TENANT b FOR '1m'").await, "");
    let fetch = || Batch::new().execute("c1", 2).sync().bytes;
    let got;
    (r, got) = exchange(r, fetch()).await;
    assert_eq!(got, "DDsZ", "a kill of another tenant stopped a's cursor");
    assert_eq!(outcome(c, "UNKILL TENANT b").await, "");
    assert_eq!(outcome(c, "KILL TENANT a FOR '1m'").await, "");
    let got;
    (r, got) = exchange(r, fetch()).await;
    assert_eq!(got, "E[53000]Z", "a kill of a let its cursor run on");
    let (_, got) = exchange(r, query_message("ROLLBACK")).await;
    assert_eq!(got, "CZ");
}
