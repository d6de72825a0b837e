//! The admission gate end to end: budgets priced by EXPLAIN, the cost rules, slots and
//! lanes, and transaction control that never waits, through psql, a driver (prepared
//! statements included) and raw protocol clients, against a real PostgreSQL.

mod common;

use std::process::Output;
use std::time::{Duration, Instant};

use common::driver::{code, must_connect};
use common::gate::{full_read_seconds, gated, FULL_READ, REJECT_POLICY, ROOMY_POLICY};
use common::policy::Policed;
use common::{client_command, stderr_of, stdout_of};

/// pgward with a policy (and 4 servers), and what the tests ask of it.
struct Fixture(Policed);

impl std::ops::Deref for Fixture {
    type Target = Policed;
    fn deref(&self) -> &Policed {
        &self.0
    }
}

impl Fixture {
    fn start(policy: &str) -> Fixture {
        Fixture(gated(
            policy,
            "default_pool_size = 4\nmax_client_conn = 50\n",
        ))
    }

    /// psql as `user` with verbose errors, each of `sqls` sent as one Query.
    fn psql(&self, user: &str, sqls: &[&str]) -> Output {
        let mut cmd = client_command("psql", None);
        cmd.args(["-X", "-w", "-At", "-d"])
            .arg(self.pw.connstr(user, None, "app"))
            .args(["-c", "\\set VERBOSITY verbose"]);
        for sql in sqls {
            cmd.args(["-c", sql]);
        }
        cmd.output().expect("run psql")
    }

    fn conn(&self, user: &str) -> String {
        self.pw.connstr(user, None, "app")
    }
}

/// psql running `sql` on a thread of its own.
fn psql_in_background(connstr: String, sql: &'static str) -> std::thread::JoinHandle<Output> {
    std::thread::spawn(move || {
        let mut cmd = client_command("psql", None);
        cmd.args(["-X", "-w", "-At", "-d"])
            .arg(connstr)
            .args(["-c", sql]);
        cmd.output().expect("psql")
    })
}

#[test]
fn an_over_budget_tenant_is_refused_with_53000_and_a_retry_hint() {
    let f = Fixture::start(REJECT_POLICY);
    let first = f.psql("trustuser", &[FULL_READ]);
    assert!(first.status.success(), "{}", stderr_of(&first));
    assert_eq!(stdout_of(&first).trim(), "100000");
    let second = f.psql("trustuser", &[FULL_READ]);
    let err = stderr_of(&second);
    assert!(!second.status.success(), "a second read ran: {err}");
    assert!(err.contains("53000"), "{err}");
    assert!(err.to_lowercase().contains("hint"), "{err}");
    // Another role is another tenant, with no budget.
    let other = f.psql("postgres", &[FULL_READ]);
    assert!(other.status.success(), "{}", stderr_of(&other));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepared_statement_is_charged_at_every_execution() {
    let f = Fixture::start(REJECT_POLICY);
    let conn = must_connect(&f.conn("trustuser")).await;
    let stmt = conn
        .client
        .prepare("SELECT count(*) FROM big WHERE id > $1")
        .await
        .expect("prepare");
    let rows = conn.client.query(&stmt, &[&0i32]).await.expect("first run");
    let n: i64 = rows[0].get(0);
    assert_eq!(n, 100000);
    let err = conn
        .client
        .query(&stmt, &[&0i32])
        .await
        .expect_err("the second run must be refused");
    assert_eq!(code(&err), "53000", "{err:?}");
    // While the tenant owes, transaction control still goes through.
    conn.client.batch_execute("BEGIN").await.expect("BEGIN");
    conn.client.batch_execute("COMMIT").await.expect("COMMIT");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn six_connections_at_once_cannot_all_spend_one_budget() {
    let f = Fixture::start(REJECT_POLICY);
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let connstr = f.conn("trustuser");
        tasks.push(tokio::spawn(async move {
            let conn = must_connect(&connstr).await;
            conn.client
                .simple_query(FULL_READ)
                .await
                .map(|_| ())
                .map_err(|e| code(&e))
        }));
    }
    let mut ran = 0;
    for t in tasks {
        match t.await.expect("task") {
            Ok(()) => ran += 1,
            Err(c) => assert_eq!(c, "53000"),
        }
    }
    assert_eq!(ran, 1, "one read is all the budget pays for");
}

#[test]
fn max_cost_refuses_with_54000_and_numbers_only() {
    let f = Fixture::start(
        r#"
[gate]
max_cost = 500
"#,
    );
    let out = f.psql("trustuser", &[FULL_READ]);
    let err = stderr_of(&out);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("54000"), "{err}");
    assert!(err.contains("max_cost"), "{err}");
    assert!(
        !err.contains("big"),
        "a table name reached the client: {err}"
    );
    let cheap = f.psql("trustuser", &["SELECT v FROM small WHERE id = 7"]);
    assert_eq!(stdout_of(&cheap).trim(), "v7", "{}", stderr_of(&cheap));
}

/// With standard_conforming_strings off, a backslash moves where a string ends: the scanner
/// that finds the statement to price reads strings as with it on, and would take this one
/// full read for two statements and price neither. Under cost rules it is refused, not run
/// unpriced.
#[test]
fn max_cost_refuses_a_text_it_cannot_read_as_the_server_does() {
    let f = Fixture::start("[gate]\nmax_cost = 500\n");
    let hidden = r"SELECT count(*) FROM big WHERE pad <> '\'; x; --'";
    let out = f.psql(
        "trustuser",
        &["SET standard_conforming_strings = off", hidden],
    );
    let err = stderr_of(&out);
    assert!(!out.status.success(), "ran: {}", stdout_of(&out));
    assert!(err.contains("54000"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_cost_judges_a_prepared_statement_with_its_bound_values() {
    let f = Fixture::start(
        r#"
[gate]
max_cost = 500
"#,
    );
    let conn = must_connect(&f.conn("trustuser")).await;
    let stmt = conn
        .client
        .prepare("SELECT count(*) FROM big WHERE id < $1 OR $1 < 0")
        .await
        .expect("prepare");
    let err = conn
        .client
        .query(&stmt, &[&10i32])
        .await
        .expect_err("a full read must be refused");
    assert_eq!(code(&err), "54000", "{err:?}");
    let lookup = conn
        .client
        .prepare("SELECT v FROM small WHERE id = $1")
        .await
        .expect("prepare");
    let rows = conn.client.query(&lookup, &[&3i32]).await.expect("lookup");
    let v: String = rows[0].get(0);
    assert_eq!(v, "v3");
}

/// A session keeps what it read of a statement while the policy stays; a reload that
/// changes its tenant's cost limits applies to the next run of that same statement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_changes_a_tenants_cost_limits_for_a_statement_the_session_has_run() {
    let tenant = |max_cost: &str| {
        format!("[tenants.acme]\nroles = [\"trustuser\"]\nmax_cost = {max_cost}\n")
    };
    let f = Fixture::start(&tenant("1e12"));
    let conn = must_connect(&f.conn("trustuser")).await;
    for _ in 0..2 {
        let rows = conn.client.simple_query(FULL_READ).await;
        assert!(rows.is_ok(), "refused under the roomy limit: {rows:?}");
    }
    std::fs::write(&f.policy, tenant("500")).expect("rewrite the policy");
    f.pw.reload_and_wait();
    let err = conn
        .client
        .simple_query(FULL_READ)
        .await
        .expect_err("the new limit refuses it");
    assert_eq!(code(&err), "54000", "{err:?}");
    f.reload_with(&tenant("1e12"));
    let ran = common::eventually(Duration::from_secs(10), || {
        let out = f.psql("trustuser", &[FULL_READ]);
        out.status.success()
    });
    assert!(ran, "the roomy limit did not come back");
    let rows = conn.client.simple_query(FULL_READ).await;
    assert!(rows.is_ok(), "still refused in the session: {rows:?}");
}

#[test]
fn explain_inside_a_transaction_leaves_it_intact() {
    // (A budget of 1 ms could be spent by the first text on a busy machine, and the full
    // read after it refused: what is tested here is the EXPLAIN inside a transaction.)
    let f = Fixture::start(ROOMY_POLICY);
    // Inside a transaction the EXPLAIN runs under a savepoint: a statement that fails to
    // plan fails by itself, with PostgreSQL's error and no trace of pgward's EXPLAIN.
    let out = f.psql(
        "trustuser",
        &["BEGIN; SELECT 1; COMMIT", "SELECT count(*) FROM big"],
    );
    assert!(out.status.success(), "{}", stderr_of(&out));
    let out = f.psql(
        "postgres",
        &["BEGIN", "SELECT * FROM no_such_table", "ROLLBACK"],
    );
    let err = stderr_of(&out);
    assert!(err.contains("42P01"), "{err}");
    assert!(!err.contains("pgward_explain"), "{err}");
    let out = f.psql(
        "postgres",
        &["CREATE TEMP TABLE x (a int)", "SELECT 'in step'"],
    );
    assert!(stdout_of(&out).contains("in step"), "{}", stderr_of(&out));
}

/// psql running each of `steps` in turn (`\!` steps run a shell command), in
/// the background.
fn psql_steps(connstr: String, steps: &[&str]) -> std::thread::JoinHandle<Output> {
    let steps: Vec<String> = steps.iter().map(|s| s.to_string()).collect();
    std::thread::spawn(move || {
        let mut cmd = client_command("psql", None);
        cmd.args(["-X", "-w", "-At", "-v", "ON_ERROR_STOP=1", "-d"])
            .arg(connstr);
        for step in &steps {
            cmd.args(["-c", step]);
        }
        cmd.output().expect("psql")
    })
}

#[test]
fn one_fast_slot_runs_statements_one_at_a_time_and_a_transaction_keeps_it() {
    let f = Fixture::start(
        r#"
[gate]
max_active = 1
queue_timeout = "30s"
"#,
    );
    let started = Instant::now();
    let sleepers: Vec<_> = (0..2)
        .map(|_| psql_in_background(f.conn("trustuser"), "SELECT pg_sleep(1)"))
        .collect();
    for s in sleepers {
        let out = s.join().expect("thread");
        assert!(out.status.success(), "{}", stderr_of(&out));
    }
    assert!(
        started.elapsed() >= Duration::from_millis(1900),
        "two sleeps shared one slot in {:?}",
        started.elapsed()
    );
    // A transaction holds the slot from BEGIN to COMMIT, and its statements never wait:
    // another client's statement runs only after the COMMIT.
    let tx_started = Instant::now();
    let tx = psql_steps(
        f.conn("trustuser"),
        &["BEGIN", "SELECT 1", "\\! sleep 1", "SELECT 2", "COMMIT"],
    );
    std::thread::sleep(Duration::from_millis(300));
    let other = f.psql("postgres", &["SELECT 'after the commit'"]);
    assert!(other.status.success(), "{}", stderr_of(&other));
    assert!(
        tx_started.elapsed() >= Duration::from_millis(1000),
        "a statement ran while a transaction held the only slot ({:?})",
        tx_started.elapsed()
    );
    let out = tx.join().expect("thread");
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert!(
        tx_started.elapsed() < Duration::from_millis(1900),
        "the transaction waited {:?}",
        tx_started.elapsed()
    );
}

/// In session pooling a request admitted as the client's server is closed by
/// `server_fast_close` never runs: what the gate holds for it (here an unpriced DO block,
/// which holds its tenant's other unpriced work until it has run) is let go.
#[test]
fn a_request_cut_short_by_server_fast_close_holds_nothing_in_the_gate() {
    let f = Fixture(gated(
        r#"
[gate]
queue_timeout = "2s"
[tenants.acme]
roles = ["trustuser"]
when_over = "wait"
burst = 10
rate = 1
"#,
        "pool_mode = session\nserver_fast_close = 1\nadmin_users = admin\n",
    ));
    const BLOCK: &str = "DO $$ BEGIN PERFORM 1; END $$";
    let mut client = common::raw::Raw::login(f.pw.port, "trustuser", None, "app");
    client.query("SELECT 1").expect("first query");
    let out = common::psql_at(f.pw.port, "admin", None, "pgward", "RECONNECT app");
    assert!(out.status.success(), "{}", stderr_of(&out));
    let err = client.query(BLOCK).expect_err("the session ends");
    assert_eq!(err.message(), "database configuration changed");
    drop(client);
    // Another client of the tenant: its unpriced block does not wait for the one that never ran.
    let out = f.psql("trustuser", &[BLOCK]);
    assert!(out.status.success(), "{}", stderr_of(&out));
}

#[test]
fn a_wait_for_a_slot_ends_with_53000_at_the_queue_timeout() {
    let f = Fixture::start(
        r#"
[gate]
max_active = 1
queue_timeout = "300ms"
"#,
    );
    let sleeper = psql_in_background(f.conn("trustuser"), "SELECT pg_sleep(2)");
    std::thread::sleep(Duration::from_millis(300));
    let out = f.psql("postgres", &["SELECT 1"]);
    let err = stderr_of(&out);
    assert!(err.contains("53000"), "{err}");
    assert!(sleeper.join().expect("thread").status.success());
}

#[test]
fn an_over_budget_tenant_that_waits_runs_once_the_debt_is_paid_back() {
    let f = Fixture::start(
        r#"
[gate]
queue_timeout = "30s"
[tenants.acme]
roles = ["trustuser"]
when_over = "wait"
burst = 0.001
rate = 1
"#,
    );
    // Pay back about one read every two seconds (in seconds of server time a second; the
    // time a client sees straight on the server is a little more than what pgward charges).
    let rate = full_read_seconds(&f.pg) / 2.0;
    let policy = format!(
        "[gate]\nqueue_timeout = \"30s\"\n[tenants.acme]\nroles = [\"trustuser\"]\n\
         when_over = \"wait\"\nburst = 0.001\nrate = {rate}\n"
    );
    std::fs::write(&f.policy, policy).expect("write");
    f.pw.reload();
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    let out = f.psql("trustuser", &[FULL_READ, FULL_READ, FULL_READ]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(1500),
        "three reads about two seconds apart took {took:?}"
    );
}

#[test]
fn a_tenant_statement_timeout_cancels_and_says_whose_it_was() {
    let f = Fixture::start(
        r#"
[tenants.acme]
roles = ["trustuser"]
statement_timeout = "500ms"
"#,
    );
    let started = Instant::now();
    // The client switching its own timeout off changes nothing.
    let out = f.psql(
        "trustuser",
        &[
            "SET statement_timeout = 0",
            "SELECT pg_sleep(5)",
            "SELECT 'still here'",
        ],
    );
    let err = stderr_of(&out);
    assert!(err.contains("57014"), "{err}");
    assert!(err.contains("pgward statement timeout"), "{err}");
    assert!(
        stdout_of(&out).contains("still here"),
        "the session ends after the timeout: {err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    // Other tenants have no such limit.
    let out = f.psql("postgres", &["SELECT pg_sleep(1)"]);
    assert!(out.status.success(), "{}", stderr_of(&out));
}

/// Two statements sent at once: the tenant's statement timeout bounds each, the second too
/// once the first was cancelled.
#[test]
fn a_tenant_statement_timeout_bounds_every_statement_of_a_pipeline() {
    use common::raw::{query_message, Raw};
    let f = Fixture::start(
        r#"
[tenants.acme]
roles = ["trustuser"]
statement_timeout = "700ms"
"#,
    );
    let mut r = Raw::login(f.pw.port, "trustuser", None, "app");
    // Its plan cached, the second statement is let through while the first runs.
    r.query("SELECT pg_sleep(0)").expect("first run");
    let sleep = query_message("SELECT pg_sleep(4)");
    let started = Instant::now();
    r.send(&[sleep.clone(), sleep].concat());
    for n in 1..=2 {
        let got = pipelines::read_to_ready_within(&mut r, Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("statement {n}: {e}"));
        assert!(got.contains("E[57014]"), "statement {n}: {got}");
    }
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_idle_in_transaction_timeout_ends_the_session() {
    let f = Fixture::start(
        r#"
[tenants.acme]
roles = ["trustuser"]
idle_in_transaction_timeout = "400ms"
"#,
    );
    let conn = must_connect(&f.conn("trustuser")).await;
    conn.client
        .batch_execute("BEGIN; SELECT 1")
        .await
        .expect("begin");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let err = conn
        .client
        .batch_execute("SELECT 1")
        .await
        .expect_err("the session must be over");
    let ended = common::driver::end_of(conn, Duration::from_secs(2)).await;
    assert_eq!(ended.as_deref(), Some("25P03"), "{err:?}");
}

#[test]
fn a_deadline_tag_ends_the_wait_for_a_slot_with_57014() {
    let f = Fixture::start(
        r#"
trusted_roles = ["postgres"]
[gate]
max_active = 1
queue_timeout = "30s"
"#,
    );
    let sleeper = psql_in_background(f.conn("trustuser"), "SELECT pg_sleep(2)");
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    let out = f.psql("postgres", &["SELECT 1 /*deadline='200ms'*/"]);
    let err = stderr_of(&out);
    assert!(err.contains("57014"), "{err}");
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "{:?}",
        started.elapsed()
    );
    assert!(sleeper.join().expect("thread").status.success());
}

#[test]
fn max_scan_rows_counts_the_whole_table_a_filtered_full_read_scans() {
    let f = Fixture::start(
        r#"
[tenants.acme]
roles = ["trustuser"]
max_scan_rows = 50000
"#,
    );
    // The filter leaves about no row, but the whole table is read.
    let out = f.psql(
        "trustuser",
        &["SELECT count(*) FROM big WHERE pad = 'none'"],
    );
    let err = stderr_of(&out);
    assert!(
        err.contains("54000") && err.contains("max_scan_rows"),
        "{err}"
    );
    let out = f.psql("trustuser", &["SELECT count(*) FROM small WHERE v = 'v9'"]);
    assert_eq!(stdout_of(&out).trim(), "1", "{}", stderr_of(&out));
    // Inside a transaction too, and the transaction is still usable after a refusal's
    // rollback.
    let out = f.psql(
        "trustuser",
        &[
            "BEGIN",
            "SELECT count(*) FROM big WHERE pad = 'none'",
            "ROLLBACK",
            "SELECT 'ok'",
        ],
    );
    let err = stderr_of(&out);
    assert!(err.contains("54000"), "{err}");
    assert!(stdout_of(&out).contains("ok"), "{err}");
}

#[test]
fn a_statement_that_cannot_finish_before_its_deadline_is_refused_without_running() {
    let f = Fixture::start(
        r#"
trusted_roles = ["postgres"]
"#,
    );
    // Learn its usual time.
    let out = f.psql("postgres", &["SELECT pg_sleep(1)"]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let started = Instant::now();
    let out = f.psql("postgres", &["SELECT pg_sleep(1) /*deadline='300ms'*/"]);
    let err = stderr_of(&out);
    assert!(err.contains("57014"), "{err}");
    assert!(
        started.elapsed() < Duration::from_millis(800),
        "it ran: {:?}",
        started.elapsed()
    );
    // Without a deadline it runs.
    let out = f.psql("postgres", &["SELECT pg_sleep(0.1)"]);
    assert!(out.status.success(), "{}", stderr_of(&out));
}

/// Pipelines, batches split across reads, and the pricing EXPLAIN's own traces.
mod pipelines {
    use super::*;
    use common::raw::{
        bind_message, execute_message, extended_query, flush_message, message,
        named_extended_query, parse_message, query_message, sync_message, Batch, Raw,
    };

    pub(super) fn raw(f: &Fixture, user: &str) -> Raw {
        f.pw.client_as(user, "app")
    }

    /// Every message up to ReadyForQuery within `wait`, as tags (an error's SQLSTATE and a
    /// row's columns in brackets), or what came before a timeout.
    pub(super) fn read_to_ready_within(raw: &mut Raw, wait: Duration) -> Result<String, String> {
        let messages = raw.until_ready_within(wait)?;
        let mut tags = String::new();
        for m in &messages {
            tags.push(m.tag as char);
            if m.tag == b'E' {
                tags.push_str(&format!("[{}]", m.fields().code()));
            }
            if m.tag == b'D' {
                tags.push_str(&format!("[{}]", String::from_utf8_lossy(&m.body[6..])));
            }
        }
        Ok(tags)
    }

    /// An extended-protocol batch sent over two writes (no Sync in the first) is answered:
    /// a Bind whose price is unknown inside an open batch runs, and is priced after it.
    #[test]
    fn a_batch_split_across_reads_does_not_hang() {
        let f = Fixture::start("[gate]\nmax_cost = 1000000\n");
        let mut r = raw(&f, "trustuser");
        r.send(&extended_query("SELECT 1"));
        std::thread::sleep(Duration::from_millis(300));
        let mut second = extended_query("SELECT v FROM small WHERE id = 3");
        second.extend(sync_message());
        r.send(&second);
        let got = read_to_ready_within(&mut r, Duration::from_secs(5));
        assert!(got.is_ok(), "the pipeline hangs: {got:?}");
    }

    /// A client inside a transaction holds its server and waits for a slot; no slot is held
    /// by a client waiting for a server, so the two cannot wait on each other.
    #[test]
    fn a_transaction_holding_a_server_is_not_starved_of_slots() {
        let gated = gated(
            "[gate]\nmax_active = 1\nqueue_timeout = \"30s\"\n",
            "default_pool_size = 1\nmax_client_conn = 50\n",
        );
        let pw = &gated.pw;
        let mut a = pw.client();
        a.query("BEGIN").expect("begin");
        a.query("SELECT 1").expect("select in the transaction");
        let port = pw.port;
        let b = std::thread::spawn(move || {
            let mut b = Raw::connect(port);
            b.startup(&[("user", "trustuser"), ("database", "app")])
                .unwrap();
            b.send(&query_message("SELECT 2"));
            read_to_ready_within(&mut b, Duration::from_secs(20))
        });
        std::thread::sleep(Duration::from_millis(500));
        a.send(&query_message("SELECT 3"));
        let got = read_to_ready_within(&mut a, Duration::from_secs(5));
        assert!(
            got.is_ok(),
            "A's next statement is stuck behind B's slot: {got:?}"
        );
        a.query("COMMIT").unwrap();
        let _ = b.join();
    }

    /// A second Parse of a name the client already has fails on the server (42P05); the
    /// name's Binds are still priced as the first one's text.
    #[test]
    fn a_failed_reparse_does_not_change_what_a_bind_is_priced_as() {
        let f = Fixture::start("[gate]\nmax_cost = 500\n");
        let mut r = raw(&f, "trustuser");
        let mut p = parse_message("s1", FULL_READ);
        p.extend(sync_message());
        r.send(&p);
        read_to_ready_within(&mut r, Duration::from_secs(5)).expect("an answer");
        let mut p = parse_message("s1", "SELECT 1");
        p.extend(sync_message());
        r.send(&p);
        read_to_ready_within(&mut r, Duration::from_secs(5)).expect("an answer");
        let mut run = bind_message("s1");
        run.extend(execute_message());
        run.extend(sync_message());
        r.send(&run);
        let got = read_to_ready_within(&mut r, Duration::from_secs(5)).unwrap();
        assert!(got.contains("54000"), "the full read ran: {got}");
    }

    /// Statements in one read are priced in their place: the second is priced after the
    /// first has created what it reads.
    #[test]
    fn a_pipelined_statement_is_priced_in_its_place() {
        let f = Fixture::start("[gate]\nmax_cost = 500\n");
        let mut r = raw(&f, "trustuser");
        let mut both = query_message("CREATE TEMP VIEW v AS SELECT * FROM big");
        both.extend(query_message("SELECT count(*) FROM v"));
        r.send(&both);
        let first = read_to_ready_within(&mut r, Duration::from_secs(5)).unwrap();
        let second = read_to_ready_within(&mut r, Duration::from_secs(5)).unwrap();
        assert!(second.contains("54000"), "{first} / {second}");
    }

    /// A pricing EXPLAIN that fails after its Parse (here at Bind, a bad value) leaves no
    /// statement of pgward's behind: later Binds on that server are still priced.
    #[test]
    fn a_failed_bound_explain_does_not_poison_the_server() {
        let gated = gated(
            "[gate]\nmax_cost = 500\n",
            "default_pool_size = 1\nmax_client_conn = 50\n",
        );
        let pw = &gated.pw;
        let mut r = pw.client();
        let mut m = parse_message("s1", "SELECT count(*) FROM small WHERE id > $1::int");
        let mut bind = vec![0u8];
        bind.extend_from_slice(b"s1\0");
        bind.extend_from_slice(&0i16.to_be_bytes());
        bind.extend_from_slice(&1i16.to_be_bytes());
        bind.extend_from_slice(&1i32.to_be_bytes());
        bind.push(b'x');
        bind.extend_from_slice(&0i16.to_be_bytes());
        m.extend(message(b'B', &bind));
        m.extend(execute_message());
        m.extend(sync_message());
        r.send(&m);
        let bad = read_to_ready_within(&mut r, Duration::from_secs(5)).unwrap();
        assert!(bad.contains("22P02"), "{bad}");
        // Another client, same (only) server.
        let mut o = pw.client();
        let mut m = named_extended_query("s2", FULL_READ);
        m.extend(sync_message());
        o.send(&m);
        let got = read_to_ready_within(&mut o, Duration::from_secs(5)).unwrap();
        assert!(got.contains("54000"), "the full read ran unpriced: {got}");
    }

    /// A pipeline of an INSERT, `middle` and another INSERT, under `max_cost = 500`: what
    /// the client read up to ReadyForQuery (within ten seconds), after checking that neither
    /// INSERT stayed (the batch failed in the middle) and that the session goes on.
    fn failing_pipeline(middle: Vec<u8>) -> String {
        let f = Fixture::start("[gate]\nmax_cost = 500\n");
        let table = "CREATE TABLE marks (n int); GRANT ALL ON marks TO PUBLIC";
        f.pg.sql_in("app", table);
        let mut r = raw(&f, "trustuser");
        let mut m = extended_query("INSERT INTO marks VALUES (1)");
        m.extend(middle);
        m.extend(extended_query("INSERT INTO marks VALUES (2)"));
        m.extend(sync_message());
        r.send(&m);
        let got = read_to_ready_within(&mut r, Duration::from_secs(10));
        let got = got.expect("no answer in time");
        let marks = f.pg.sql_in("app", "SELECT count(*) FROM marks");
        assert_eq!(marks.trim(), "0", "the batch was not rolled back: {got}");
        r.send(&query_message("SELECT 7"));
        let next = read_to_ready_within(&mut r, Duration::from_secs(5)).unwrap();
        assert!(next.contains("D[7]"), "{next}");
        got
    }

    /// Cost rules judge a statement inside a pipeline before it runs: a read that would take
    /// hours, behind a cheap statement in one batch, is refused in its place (54000), the
    /// batch fails there and what ran before it is rolled back with its implicit transaction.
    #[test]
    fn a_pipelined_read_over_max_cost_is_refused_before_it_runs() {
        let got = failing_pipeline(extended_query("SELECT count(*) FROM big a, big b"));
        assert!(got.starts_with("12C1E[54000]"), "{got}");
    }

    /// A pipelined statement whose plan fails when it is bound (a bad parameter value) fails
    /// in its place with PostgreSQL's own error, as it would without pgward: the batch
    /// stops there, and what ran before it is rolled back.
    #[test]
    fn a_pipelined_statement_that_fails_when_bound_fails_in_its_place() {
        let got = failing_pipeline(
            Batch::new()
                .parse("", "SELECT count(*) FROM small WHERE id > $1::int", &[])
                .bind("", "", &[Some("x")])
                .execute("", 0)
                .bytes,
        );
        assert_eq!(got, "12C1E[22P02]Z", "{got}");
    }

    /// max_scan_rows judges a pipelined statement before it runs too (the table sizes are
    /// read inside the batch), and a simple Query behind an open batch cannot be read before
    /// it runs: refused.
    #[test]
    fn max_scan_rows_judges_a_pipelined_read_before_it_runs() {
        let f = Fixture::start("[gate]\nmax_scan_rows = 50000\n");
        let mut r = raw(&f, "trustuser");
        let mut m = extended_query("SELECT 1");
        m.extend(extended_query("SELECT count(*) FROM big a, big b"));
        m.extend(sync_message());
        r.send(&m);
        let got = read_to_ready_within(&mut r, Duration::from_secs(10));
        let got = got.expect("the read ran: no answer in time");
        assert!(got.starts_with("12D[1]C1E[54000]"), "{got}");
        let mut m = extended_query("SELECT 1");
        m.extend(query_message("SELECT count(*) FROM big a, big b"));
        m.extend(sync_message());
        r.send(&m);
        let got = read_to_ready_within(&mut r, Duration::from_secs(10));
        let got = got.expect("the read ran: no answer in time");
        assert!(got.contains("E[54000]"), "{got}");
    }

    /// A Sync that ends a failed batch, sent with the next batch, ends the server's skipping:
    /// the next batch's statements are judged, not passed as skipped.
    #[test]
    fn a_sync_after_a_failed_batch_does_not_let_the_next_read_pass_unjudged() {
        let f = Fixture::start("[gate]\nmax_cost = 500\n");
        let mut r = raw(&f, "trustuser");
        let mut m = extended_query("SELECT 1/0");
        m.extend(flush_message());
        r.send(&m);
        r.until_tag_within(b'E', Duration::from_secs(5))
            .expect("the error");
        let mut m = sync_message();
        m.extend(extended_query("SELECT 1"));
        m.extend(extended_query("SELECT count(*) FROM big a, big b"));
        m.extend(sync_message());
        r.send(&m);
        read_to_ready_within(&mut r, Duration::from_secs(5)).expect("the first Sync's answer");
        let got = read_to_ready_within(&mut r, Duration::from_secs(10));
        let got = got.expect("the read ran: no answer in time");
        assert!(got.contains("E[54000]"), "{got}");
    }

    /// An EXPLAIN that fails inside a batch (its Close skipped by the server) leaves no
    /// statement of pgward's behind: the next statement on that server is still priced.
    #[test]
    fn a_failed_explain_in_a_batch_leaves_nothing_behind() {
        let policed = gated("[gate]\nmax_cost = 500\n", "default_pool_size = 1\n");
        let mut r = policed.pw.client_as("trustuser", "app");
        let mut m = extended_query("SELECT 1");
        m.extend(
            Batch::new()
                .parse("", "SELECT count(*) FROM small WHERE id > $1::int", &[])
                .bind("", "", &[Some("x")])
                .execute("", 0)
                .sync()
                .bytes,
        );
        r.send(&m);
        let got = read_to_ready_within(&mut r, Duration::from_secs(10)).unwrap();
        assert!(got.contains("E[22P02]"), "{got}");
        r.send(&query_message("SELECT count(*) FROM big a, big b"));
        let got = read_to_ready_within(&mut r, Duration::from_secs(10));
        let got = got.expect("the read ran: no answer in time");
        assert!(got.contains("E[54000]"), "{got}");
    }

    /// A request that waited for its Flush and then found its plan cached (another session
    /// priced it meanwhile) spends that Flush: the next request of the batch asks for its own.
    #[test]
    fn a_request_priced_meanwhile_does_not_keep_the_next_from_its_flush() {
        let f = Fixture::start("[gate]\nmax_cost = 500\n");
        let mut r = raw(&f, "trustuser");
        let mut m = extended_query("SELECT pg_sleep(1)");
        m.extend(extended_query("SELECT count(*) FROM small"));
        m.extend(extended_query("SELECT count(*) FROM small WHERE v IS NULL"));
        m.extend(sync_message());
        r.send(&m);
        std::thread::sleep(Duration::from_millis(300));
        // The same statement, bound alike, from another session: priced and cached.
        let mut other = raw(&f, "trustuser");
        let mut m = extended_query("SELECT count(*) FROM small");
        m.extend(sync_message());
        other.send(&m);
        let theirs = read_to_ready_within(&mut other, Duration::from_secs(5)).unwrap();
        assert!(theirs.contains("D[1000]"), "{theirs}");
        let got = read_to_ready_within(&mut r, Duration::from_secs(10));
        let got = got.expect("the pipeline hangs");
        assert!(got.ends_with("D[0]CZ"), "{got}");
    }

    /// In warn mode a statement that cannot be priced before it runs (a simple Query behind
    /// an open batch) runs, as every cost rule in warn mode lets it.
    #[test]
    fn warn_mode_lets_an_unpriceable_statement_run() {
        let f = Fixture::start("[gate]\nmax_cost = 500\ncost_mode = \"warn\"\n");
        let mut r = raw(&f, "trustuser");
        let mut m = extended_query("SELECT 1");
        m.extend(query_message("SELECT 2"));
        m.extend(sync_message());
        r.send(&m);
        let got = read_to_ready_within(&mut r, Duration::from_secs(10)).unwrap();
        assert!(got.contains("D[2]"), "{got}");
    }

    /// In session pooling a DEALLOCATE frees the name: the next Parse of it is priced as its
    /// own text, not as the first one's.
    #[test]
    fn session_pooling_prices_a_name_reparsed_after_deallocate() {
        let policed = gated("[gate]\nmax_cost = 500\n", "pool_mode = session\n");
        let mut r = policed.pw.client_as("trustuser", "app");
        let mut p = parse_message("a", "SELECT 1");
        p.extend(sync_message());
        r.send(&p);
        read_to_ready_within(&mut r, Duration::from_secs(5)).unwrap();
        r.send(&query_message("DEALLOCATE a"));
        read_to_ready_within(&mut r, Duration::from_secs(5)).unwrap();
        let mut p = parse_message("a", "SELECT count(*) FROM big a, big b");
        p.extend(sync_message());
        r.send(&p);
        read_to_ready_within(&mut r, Duration::from_secs(5)).unwrap();
        let mut run = bind_message("a");
        run.extend(execute_message());
        run.extend(sync_message());
        r.send(&run);
        let got = read_to_ready_within(&mut r, Duration::from_secs(10));
        let got = got.expect("the read ran: no answer in time");
        assert!(got.contains("E[54000]"), "{got}");
    }

    /// A pipelined statement after one that failed is skipped by the server, and answered
    /// nothing, as without pgward.
    #[test]
    fn a_pipelined_statement_after_a_failure_is_skipped() {
        let f = Fixture::start("[gate]\nmax_cost = 500\n");
        let mut r = raw(&f, "trustuser");
        let mut m = extended_query("SELECT 1/0");
        m.extend(extended_query("SELECT count(*) FROM small"));
        m.extend(sync_message());
        r.send(&m);
        let got = read_to_ready_within(&mut r, Duration::from_secs(10)).unwrap();
        assert_eq!(got, "1E[22012]Z", "{got}");
    }

    /// A request the gate refuses inside a batch fails it: the server skips every request
    /// up to the Sync, and the gate neither admits nor counts them (SHOW STATEMENTS counts no
    /// run of a statement that never ran).
    #[test]
    fn requests_behind_a_refused_one_in_its_batch_are_not_counted_as_run() {
        behind_a_refusal(false);
    }

    /// The same where the rest of the batch comes in a later write, once pgward has answered
    /// the refusal itself and drops what follows it.
    #[test]
    fn requests_behind_a_refused_one_in_a_later_write_are_not_counted_as_run() {
        behind_a_refusal(true);
    }

    fn behind_a_refusal(split: bool) {
        let policy = "[[rules]]\nrule = \"deny_ddl\"\n";
        let f = gated(policy, "admin_users = admin\n");
        let mut r = f.pw.client_as("trustuser", "app");
        r.send(&extended_query("DROP TABLE small"));
        if split {
            std::thread::sleep(Duration::from_millis(300));
        }
        let mut m = extended_query("SELECT v FROM small WHERE id = 7");
        m.extend(sync_message());
        r.send(&m);
        let got = read_to_ready_within(&mut r, Duration::from_secs(10)).unwrap();
        assert!(got.starts_with("E[") && got.ends_with('Z'), "{got}");
        assert!(
            !got.contains("D["),
            "the statement after the refusal ran: {got}"
        );
        let out = common::psql_at(f.pw.port, "admin", None, "pgward", "SHOW STATEMENTS");
        let text = common::stdout_of(&out);
        assert!(
            !text.contains("FROM small WHERE"),
            "a skipped statement was counted as run: {text}"
        );
    }

    /// A refusal of an unnamed Parse raised on the server in a batch that already failed is
    /// skipped with the rest of it: the client's unnamed statement is still there, as on
    /// PostgreSQL, which never reads a skipped Parse (session pooling).
    #[test]
    fn a_skipped_refusal_of_an_unnamed_parse_leaves_the_client_its_statement() {
        let policy = "[[rules]]\nrule = \"deny_ddl\"\n";
        let f = gated(policy, "pool_mode = session\n");
        let mut r = f.pw.client_as("trustuser", "app");
        let mut m = parse_message("", "SELECT 41 + 1");
        m.extend(sync_message());
        r.send(&m);
        let got = read_to_ready_within(&mut r, Duration::from_secs(5)).unwrap();
        assert_eq!(got, "1Z");
        let failing = Batch::new()
            .describe(b'S', "nope")
            .parse("", "DROP TABLE small", &[])
            .sync();
        r.send(&failing.bytes);
        let got = read_to_ready_within(&mut r, Duration::from_secs(5)).unwrap();
        assert_eq!(got, "E[26000]Z");
        let mut run = bind_message("");
        run.extend(execute_message());
        run.extend(sync_message());
        r.send(&run);
        let got = read_to_ready_within(&mut r, Duration::from_secs(5)).unwrap();
        assert_eq!(got, "2D[42]CZ");
    }

    /// A Parse of the unnamed statement that the server skips (an error before it in its
    /// batch) leaves the client's statement, and the gate still knows it: under cost rules a
    /// later Bind of it is priced and runs, as PostgreSQL runs it, in either pooling mode.
    #[test]
    fn a_skipped_parse_of_the_unnamed_statement_leaves_it_known_to_the_gate() {
        for mode in ["session", "transaction"] {
            let f = gated(
                "[gate]\nmax_cost = 1000000\n",
                &format!("pool_mode = {mode}\n"),
            );
            let mut r = f.pw.client_as("trustuser", "app");
            let mut m = parse_message("", "SELECT 41 + 1");
            m.extend(sync_message());
            r.send(&m);
            let got = read_to_ready_within(&mut r, Duration::from_secs(5)).unwrap();
            assert_eq!(got, "1Z", "{mode}");
            let failing = Batch::new()
                .describe(b'S', "nope")
                .parse("", "SELECT 7", &[])
                .sync();
            r.send(&failing.bytes);
            let got = read_to_ready_within(&mut r, Duration::from_secs(5)).unwrap();
            assert_eq!(got, "E[26000]Z", "{mode}");
            let mut run = bind_message("");
            run.extend(execute_message());
            run.extend(sync_message());
            r.send(&run);
            let got = read_to_ready_within(&mut r, Duration::from_secs(5)).unwrap();
            assert_eq!(got, "2D[42]CZ", "{mode}");
            // The same with the Parse sent once the server is skipping (the error asked for
            // by a Flush before it).
            let mut failing = Batch::new().describe(b'S', "nope").bytes;
            failing.extend(flush_message());
            r.send(&failing);
            let error = r.read_message_within(Duration::from_secs(5)).unwrap();
            assert_eq!(error.tag, b'E', "{mode}");
            let mut rest = parse_message("", "SELECT 7");
            rest.extend(sync_message());
            r.send(&rest);
            let got = read_to_ready_within(&mut r, Duration::from_secs(5)).unwrap();
            assert_eq!(got, "Z", "{mode}");
            r.send(&run);
            let got = read_to_ready_within(&mut r, Duration::from_secs(5)).unwrap();
            assert_eq!(got, "2D[42]CZ", "{mode}: once the server skipped it");
        }
    }

    /// Pricing a Query leaves the client's unnamed statement alone: a Bind of it (prepared
    /// in an earlier read) ahead of the Query in the same read still finds it.
    #[test]
    fn pricing_a_query_leaves_the_unnamed_statement_to_the_bind_before_it() {
        let f = Fixture::start("[gate]\nmax_cost = 1000000\n");
        let mut r = raw(&f, "trustuser");
        r.query("BEGIN").unwrap();
        let mut p = parse_message("", "SELECT 42");
        p.extend(sync_message());
        r.send(&p);
        read_to_ready_within(&mut r, Duration::from_secs(5)).expect("an answer");
        let mut m = bind_message("");
        m.extend(execute_message());
        m.extend(sync_message());
        m.extend(query_message("SELECT v FROM small WHERE id = 1"));
        r.send(&m);
        let got = read_to_ready_within(&mut r, Duration::from_secs(5)).unwrap();
        assert!(got.contains("D[42]"), "{got}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_gets_each_refusal_at_the_bind_of_a_prepared_statement() {
    let f = Fixture::start(
        r#"
trusted_roles = ["postgres"]
[tenants.acme]
roles = ["trustuser"]
max_scan_rows = 50000
"#,
    );
    let conn = must_connect(&f.conn("trustuser")).await;
    let scan = conn
        .client
        .prepare("SELECT count(*) FROM big WHERE pad = $1")
        .await
        .expect("prepare");
    let err = conn
        .client
        .query(&scan, &[&"none"])
        .await
        .expect_err("a scan of the whole table must be refused");
    assert_eq!(code(&err), "54000", "{err:?}");
    // A deadline tag of a trusted role: the statement's usual time does not fit.
    let admin = must_connect(&f.conn("postgres")).await;
    let sleep = admin
        .client
        .prepare("SELECT pg_sleep($1) /*deadline='300ms'*/")
        .await
        .expect("prepare");
    admin
        .client
        .query(&sleep, &[&0.8f64])
        .await
        .expect("the first run teaches its usual time");
    let started = Instant::now();
    let err = admin
        .client
        .query(&sleep, &[&0.8f64])
        .await
        .expect_err("a run that cannot finish in time is refused");
    assert_eq!(code(&err), "57014", "{err:?}");
    assert!(
        started.elapsed() < Duration::from_millis(250),
        "{:?}",
        started.elapsed()
    );
}

/// Pricing that must not be dodged: statement names, failed transactions, shadowed
/// functions, pgward's own names, deep expressions, and a client that keeps sending.
mod dodges {
    use super::pipelines::{raw, read_to_ready_within};
    use super::*;
    use common::raw::{named_extended_query, parse_message, query_message, sync_message, Raw};

    fn run(r: &mut Raw, bytes: Vec<u8>) -> String {
        r.send(&bytes);
        read_to_ready_within(r, Duration::from_secs(10)).unwrap()
    }

    /// A first Parse of a name that fails leaves the name free; a later Parse of that name
    /// is priced as its own text.
    #[test]
    fn a_failed_first_parse_does_not_price_the_name_later() {
        let f = Fixture::start("[gate]\nmax_cost = 500\n");
        let mut r = raw(&f, "trustuser");
        let mut p = parse_message("s1", "SELECT count(*) FROM no_such_table");
        p.extend(sync_message());
        let first = run(&mut r, p);
        assert!(first.contains("42P01"), "{first}");
        let mut m = named_extended_query("s1", FULL_READ);
        m.extend(sync_message());
        let got = run(&mut r, m);
        assert!(got.contains("54000"), "the full read ran unpriced: {got}");
    }

    /// The same through DEALLOCATE: the name is priced as what it names now.
    #[test]
    fn deallocate_then_reparse_is_priced_as_the_new_text() {
        let f = Fixture::start("[gate]\nmax_cost = 500\n");
        let mut r = raw(&f, "trustuser");
        let mut p = parse_message("s1", "SELECT 1");
        p.extend(sync_message());
        run(&mut r, p);
        run(&mut r, query_message("DEALLOCATE s1"));
        let mut m = named_extended_query("s1", FULL_READ);
        m.extend(sync_message());
        let got = run(&mut r, m);
        assert!(
            got.contains("54000"),
            "the full read ran priced as SELECT 1: {got}"
        );
    }

    /// A full read run unpriced in a pipeline is charged once the pipeline is answered, so
    /// the next read is refused.
    #[test]
    fn a_deferred_read_is_charged() {
        let f = Fixture::start(REJECT_POLICY);
        let mut r = raw(&f, "trustuser");
        let mut m = named_extended_query("", "SELECT 1");
        m.extend(named_extended_query("", FULL_READ));
        m.extend(sync_message());
        run(&mut r, m);
        let got = run(&mut r, query_message(FULL_READ));
        assert!(got.contains("53000"), "{got}");
    }

    /// A deferred read inside a transaction block that fails later in the pipeline cannot be
    /// priced afterwards: it pays what it took.
    #[test]
    fn a_deferred_read_in_a_failed_transaction_is_still_charged() {
        let f = Fixture::start(REJECT_POLICY);
        let mut r = raw(&f, "trustuser");
        // The BEGIN in the batch, as the rest: one run before anything is charged (alone,
        // on a loaded machine, it could spend the 1 ms burst before the batch).
        let mut m = named_extended_query("", "BEGIN");
        m.extend(named_extended_query("", "SELECT 1"));
        m.extend(named_extended_query("", FULL_READ));
        m.extend(named_extended_query("", "SELECT 1/0"));
        m.extend(sync_message());
        let got = run(&mut r, m);
        assert!(got.contains("D[100000]"), "{got}");
        run(&mut r, query_message("ROLLBACK"));
        let got = run(&mut r, query_message(FULL_READ));
        assert!(
            got.contains("53000"),
            "the pipelined read was never charged: {got}"
        );
    }

    /// A deferred read of an object the same batch drops cannot be priced afterwards: it
    /// pays what it took.
    #[test]
    fn a_deferred_read_of_a_dropped_view_is_still_charged() {
        let f = Fixture::start(REJECT_POLICY);
        let mut r = raw(&f, "trustuser");
        let mut m = named_extended_query("", "CREATE TEMP VIEW v AS SELECT * FROM big");
        m.extend(named_extended_query("", "SELECT count(*) FROM v"));
        m.extend(named_extended_query("", "DROP VIEW v"));
        m.extend(sync_message());
        let got = run(&mut r, m);
        assert!(got.contains("D[100000]"), "{got}");
        let got = run(&mut r, query_message(FULL_READ));
        assert!(
            got.contains("53000"),
            "the pipelined read was never charged: {got}"
        );
    }

    /// A client cursor named like pgward's EXPLAIN portal takes nothing of pgward's: its
    /// own names carry a part chosen at random.
    #[test]
    fn a_cursor_named_pgward_explain_does_not_bypass_max_cost() {
        let f = Fixture::start("[gate]\nmax_cost = 500\n");
        let mut r = raw(&f, "trustuser");
        run(&mut r, query_message("BEGIN"));
        run(
            &mut r,
            query_message("DECLARE pgward_explain CURSOR FOR SELECT 1"),
        );
        let got = run(&mut r, query_message(FULL_READ));
        run(&mut r, query_message("ROLLBACK"));
        assert!(got.contains("54000"), "the full read ran unpriced: {got}");
    }

    /// pgward's table-size query names pg_catalog's functions, whatever the client's
    /// search_path; inside a transaction block any failure of pgward's own is rolled back
    /// to its savepoint, and the session goes on.
    #[test]
    fn a_shadowed_function_in_a_block_does_not_end_the_session() {
        let f = Fixture::start("[gate]\nmax_scan_rows = 1000000000\n");
        f.pg.sql_in(
            "app",
            "CREATE FUNCTION public.decode(text, text) RETURNS bytea LANGUAGE plpgsql AS \
             $$BEGIN RAISE EXCEPTION 'shadowed'; END$$",
        );
        let mut r = raw(&f, "postgres");
        run(&mut r, query_message("BEGIN"));
        run(
            &mut r,
            query_message("SET LOCAL search_path = public, pg_catalog"),
        );
        r.send(&query_message(FULL_READ));
        let got = read_to_ready_within(&mut r, Duration::from_secs(10));
        assert!(
            got.as_deref().is_ok_and(|g| g.contains("D[100000]")),
            "the read inside the block: {got:?}"
        );
    }

    /// The same shadowing outside a block: the sizes are still read, and max_scan_rows
    /// applies.
    #[test]
    fn a_shadowed_decode_does_not_bypass_max_scan_rows() {
        let f = Fixture::start("[gate]\nmax_scan_rows = 50000\n");
        f.pg.sql_in(
            "app",
            "CREATE FUNCTION public.decode(text, text) RETURNS bytea LANGUAGE sql AS \
             $$SELECT '\\x00'::bytea$$",
        );
        let mut r = raw(&f, "trustuser");
        run(
            &mut r,
            query_message("SET search_path = public, pg_catalog"),
        );
        let got = run(
            &mut r,
            query_message("SELECT count(*) FROM big WHERE pad = 'none'"),
        );
        assert!(got.contains("54000"), "read in full unrefused: {got}");
    }

    /// Without rules the analyzer reads at Depth::Shape: a deep expression (60 terms) whose
    /// tree the decoder refuses is still read, not refused as unchecked.
    #[test]
    fn a_deep_expression_is_not_refused_as_unchecked() {
        let f = Fixture::start("[gate]\nmax_cost = 1000000\n");
        let expr = vec!["id"; 60].join(" + ");
        let sql = format!("SELECT {expr} FROM small WHERE id = 1");
        let mut r = raw(&f, "trustuser");
        r.send(&query_message(&sql));
        let m = r.read_message().unwrap();
        let f2 = common::raw::Fields::parse(&m.body);
        assert_eq!(m.tag, b'T', "refused: {} {}", f2.code(), f2.message());
    }

    /// While a request is held (its price unknown, the server busy with the one before),
    /// the session stops reading the client once its buffer is full.
    #[test]
    fn a_held_request_does_not_stop_reading_the_client() {
        let f = Fixture::start("[gate]\nmax_cost = 100000000\n");
        let mut r = raw(&f, "trustuser");
        let mut m = query_message("SELECT pg_sleep(5)");
        m.extend(query_message("SELECT 2"));
        r.send(&m);
        std::thread::sleep(Duration::from_millis(300));
        let rss = |pid: u32| -> u64 {
            let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
            let line = s
                .lines()
                .find(|l| l.starts_with("VmRSS:"))
                .unwrap()
                .to_string();
            line.split_whitespace().nth(1).unwrap().parse().unwrap()
        };
        let before = rss(f.pw.pid());
        let one = query_message("SELECT 3");
        let chunk: Vec<u8> = one
            .iter()
            .copied()
            .cycle()
            .take(one.len() * 100_000)
            .collect();
        let written = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = written.clone();
        std::thread::spawn(move || {
            for _ in 0..40 {
                r.send(&chunk);
                count.fetch_add(chunk.len(), std::sync::atomic::Ordering::SeqCst);
            }
        });
        std::thread::sleep(Duration::from_secs(3));
        let sent = written.load(std::sync::atomic::Ordering::SeqCst);
        let after = rss(f.pw.pid());
        println!("client wrote {sent} bytes; pgward RSS {before} kB -> {after} kB");
        assert!(
            sent < 16 << 20,
            "pgward read {sent} bytes from a held client: RSS {before} kB -> {after} kB"
        );
    }
}

/// What a statement name holds is what the server made of the Parses and Closes of it, not
/// what the client sent: a Parse the server refuses or skips, a Close it skips, a DEALLOCATE
/// or a PREPARE in SQL must not let a Bind be priced as another text.
mod statement_names {
    use super::pipelines::read_to_ready_within;
    use super::*;
    use common::raw::{query_message, Batch, Raw};

    const POLICY: &str = "[gate]\nmax_cost = 500\n";

    fn client(mode: &str) -> (Policed, Raw) {
        client_with(&format!("pool_mode = {mode}\n"))
    }

    fn client_with(settings: &str) -> (Policed, Raw) {
        let policed = gated(POLICY, settings);
        let raw = policed.pw.client_as("trustuser", "app");
        (policed, raw)
    }

    /// Sends `batch` and reads `readies` answers up to ReadyForQuery, joined by `|`.
    fn answers(r: &mut Raw, batch: Batch, readies: usize) -> String {
        r.send(&batch.bytes);
        read_answers(r, readies)
    }

    /// `readies` answers up to ReadyForQuery, joined by `|`.
    pub(super) fn read_answers(r: &mut Raw, readies: usize) -> String {
        let got: Vec<String> = (0..readies)
            .map(|_| {
                read_to_ready_within(r, Duration::from_secs(20))
                    .unwrap_or_else(|e| format!("no answer: {e}"))
            })
            .collect();
        got.join("|")
    }

    fn run(statement: &str) -> Batch {
        Batch::new().bind("", statement, &[]).execute("", 0).sync()
    }

    /// The full read is refused, never run.
    fn refused(got: &str) {
        assert!(got.contains("E[54000]"), "{got}");
        assert!(!got.contains("D["), "the full read ran: {got}");
    }

    /// A second Parse of a name in the write that binds it fails on the server (42P05):
    /// the Bind runs the first text.
    fn reparse_in_the_same_write(mode: &str) {
        let (_p, mut r) = client(mode);
        answers(&mut r, Batch::new().parse("s1", FULL_READ, &[]).sync(), 1);
        let mut again = Batch::new().parse("s1", "SELECT 1", &[]).sync();
        again.bytes.extend(run("s1").bytes);
        let got = answers(&mut r, again, 2);
        assert!(got.contains("E[42P05]"), "{got}");
        refused(&got);
    }

    #[test]
    fn a_refused_second_parse_does_not_price_the_bind_after_it() {
        reparse_in_the_same_write("transaction");
        reparse_in_the_same_write("session");
    }

    /// An unnamed Parse the server skips (an error earlier in its batch) leaves the unnamed
    /// statement as it was.
    fn skipped_unnamed_parse(mode: &str) {
        let (_p, mut r) = client(mode);
        let mut all = Batch::new()
            .parse("", FULL_READ, &[])
            .sync()
            .describe(b'S', "nope")
            .parse("", "SELECT 1", &[])
            .sync();
        all.bytes.extend(run("").bytes);
        refused(&answers(&mut r, all, 3));
    }

    #[test]
    fn a_skipped_unnamed_parse_does_not_price_the_bind_after_it() {
        skipped_unnamed_parse("transaction");
        skipped_unnamed_parse("session");
    }

    /// In session pooling a DEALLOCATE sent through the extended protocol frees the name;
    /// the next Parse of it is priced as its own text.
    #[test]
    fn a_name_freed_by_an_extended_deallocate_is_priced_as_its_new_text() {
        let (_p, mut r) = client("session");
        answers(&mut r, Batch::new().parse("s1", "SELECT 1", &[]).sync(), 1);
        let free = Batch::new().unnamed("DEALLOCATE s1", &[]).sync();
        let got = answers(&mut r, free, 1);
        assert!(got.contains('C') && !got.contains('E'), "{got}");
        answers(&mut r, Batch::new().parse("s1", FULL_READ, &[]).sync(), 1);
        refused(&answers(&mut r, run("s1"), 1));
    }

    /// A Close the server skips leaves the statement in place.
    #[test]
    fn a_skipped_close_does_not_free_the_name() {
        let (_p, mut r) = client("session");
        answers(&mut r, Batch::new().parse("s1", FULL_READ, &[]).sync(), 1);
        let close = Batch::new().describe(b'S', "nope").close(b'S', "s1").sync();
        answers(&mut r, close, 1);
        refused(&answers(&mut r, run("s1"), 1));
    }

    /// A statement prepared in SQL is bound through the protocol: its text never passed
    /// the gate, so cost rules cannot price it.
    fn sql_prepare_then_bind(mode: &str) {
        let (_p, mut r) = client(mode);
        if mode == "transaction" {
            r.query("BEGIN").unwrap();
        }
        r.send(&query_message(&format!("PREPARE p AS {FULL_READ}")));
        let prepared = read_to_ready_within(&mut r, Duration::from_secs(10)).unwrap();
        assert!(!prepared.contains('E'), "{prepared}");
        refused(&answers(&mut r, run("p"), 1));
    }

    #[test]
    fn a_statement_prepared_in_sql_is_not_bound_unpriced() {
        sql_prepare_then_bind("transaction");
        sql_prepare_then_bind("session");
    }

    /// Freed in SQL and prepared again in SQL, in one text, after a Parse of the name: the
    /// Parse's text no longer says what the name holds.
    #[test]
    fn a_name_redefined_in_sql_is_not_priced_as_its_parse() {
        let (_p, mut r) = client("session");
        let mut all = Batch::new().parse("s1", "SELECT 1", &[]).sync();
        all.bytes.extend(query_message(&format!(
            "DEALLOCATE s1; PREPARE s1 AS {FULL_READ}"
        )));
        all.bytes.extend(run("s1").bytes);
        refused(&answers(&mut r, all, 3));
    }

    /// A PREPARE of a name the gate cannot read, in the same text as a DEALLOCATE and a
    /// PREPARE of another: every name is touched.
    #[test]
    fn a_name_hard_to_read_does_not_hide_the_rest_of_the_text() {
        let (_p, mut r) = client("session");
        answers(&mut r, Batch::new().parse("s1", "SELECT 1", &[]).sync(), 1);
        r.send(&query_message(&format!(
            "PREPARE \"a\"\"b\" AS SELECT 1; DEALLOCATE s1; PREPARE s1 AS {FULL_READ}"
        )));
        let got = read_to_ready_within(&mut r, Duration::from_secs(10)).unwrap();
        assert!(!got.contains('E'), "{got}");
        refused(&answers(&mut r, run("s1"), 1));
    }

    /// SQL EXECUTE of statements parsed in the same write, not answered yet when it is read.
    #[test]
    fn sql_execute_of_a_statement_not_answered_yet_touches_the_names() {
        let (_p, mut r) = client("session");
        answers(&mut r, Batch::new().parse("s1", "SELECT 1", &[]).sync(), 1);
        let mut all = Batch::new()
            .parse("y", "DEALLOCATE s1", &[])
            .parse("z", &format!("PREPARE s1 AS {FULL_READ}"), &[])
            .sync();
        all.bytes.extend(query_message("EXECUTE y"));
        all.bytes.extend(query_message("EXECUTE z"));
        let got = answers(&mut r, all, 3);
        assert!(!got.contains('E'), "{got}");
        refused(&answers(&mut r, run("s1"), 1));
    }

    /// A client that pipelines a Parse and, after its Sync, the Bind of it (libpq's
    /// pipeline mode) gets its rows: the Bind waits for the Parse's answer.
    #[test]
    fn a_bind_pipelined_after_its_parse_runs() {
        for mode in ["transaction", "session"] {
            let (_p, mut r) = client(mode);
            let mut all = Batch::new()
                .parse("s1", "SELECT 41", &[])
                .sync()
                .parse("", "SELECT 42", &[])
                .sync();
            all.bytes.extend(run("s1").bytes);
            all.bytes.extend(run("").bytes);
            let got = answers(&mut r, all, 4);
            assert!(got.contains("D[41]"), "{mode}: {got}");
            if mode == "session" {
                // The unnamed statement of a transaction that ended lives on in session
                // pooling only.
                assert!(got.contains("D[42]"), "{mode}: {got}");
                assert!(!got.contains('E'), "{mode}: {got}");
            }
        }
    }

    /// A request refused and answered by pgward itself leaves nothing owed by the server:
    /// no statement timer runs while the client then sits idle with its server.
    #[test]
    fn a_refusal_answered_by_pgward_starts_no_query_timeout() {
        let (_p, mut r) = client_with("pool_mode = session\nquery_timeout = 1\n");
        r.send(&query_message(FULL_READ));
        refused(&read_answers(&mut r, 1));
        std::thread::sleep(Duration::from_millis(2500));
        r.send(&query_message("SELECT 1"));
        let got = read_answers(&mut r, 1);
        assert!(got.contains("D["), "{got}");
        assert!(!got.contains('E'), "{got}");
    }

    /// PostgreSQL keys prepared statements by their first 63 bytes (NAMEDATALEN - 1): two
    /// protocol names that share them are one statement on the server, two in the gate.
    #[test]
    fn long_names_that_share_63_bytes_are_one_statement_on_the_server() {
        let (_p, mut r) = client_with("pool_mode = session\n");
        let stem = "a".repeat(63);
        let (n1, n2) = (format!("{stem}1"), format!("{stem}2"));
        let got = answers(&mut r, Batch::new().parse(&n1, "SELECT 1", &[]).sync(), 1);
        assert!(!got.contains('E'), "{got}");
        // Closes the server's statement `stem`, which n1 is.
        let got = answers(&mut r, Batch::new().close(b'S', &n2).sync(), 1);
        assert!(!got.contains('E'), "{got}");
        let got = answers(&mut r, Batch::new().parse(&n2, FULL_READ, &[]).sync(), 1);
        assert!(!got.contains('E'), "{got}");
        refused(&answers(&mut r, run(&n1), 1));
    }

    /// The same through SQL: PostgreSQL truncates a long identifier in DEALLOCATE and
    /// PREPARE to 63 bytes; the gate marks the untruncated name.
    #[test]
    fn a_long_name_in_sql_is_truncated_by_the_server_not_the_gate() {
        let (_p, mut r) = client_with("pool_mode = session\n");
        let stem = "a".repeat(63);
        let got = answers(&mut r, Batch::new().parse(&stem, "SELECT 1", &[]).sync(), 1);
        assert!(!got.contains('E'), "{got}");
        let sql = format!("DEALLOCATE {stem}x; PREPARE {stem}x AS {FULL_READ}");
        r.send(&query_message(&sql));
        let got = read_to_ready_within(&mut r, Duration::from_secs(20)).unwrap();
        assert!(!got.contains('E'), "{got}");
        refused(&answers(&mut r, run(&stem), 1));
    }

    /// A DEALLOCATE and a PREPARE run by a DO block (dynamic SQL): the gate reads no PREPARE
    /// or DEALLOCATE at the start of a statement, and keeps the Parse's text.
    #[test]
    fn a_protocol_deallocate_run_by_sql_execute_redefines_the_name_unseen() {
        let (_p, mut r) = client_with("pool_mode = session\n");
        let setup = Batch::new()
            .parse("s1", "SELECT 1", &[])
            .parse("x", "DEALLOCATE s1", &[])
            .parse("y", &format!("PREPARE s1 AS {FULL_READ}"), &[])
            .sync();
        let got = answers(&mut r, setup, 1);
        assert!(!got.contains('E'), "{got}");
        r.send(&query_message("EXECUTE x"));
        let got = read_to_ready_within(&mut r, Duration::from_secs(20)).unwrap();
        assert!(!got.contains('E'), "EXECUTE x: {got}");
        r.send(&query_message("EXECUTE y"));
        let got = read_to_ready_within(&mut r, Duration::from_secs(20)).unwrap();
        assert!(!got.contains('E'), "EXECUTE y: {got}");
        refused(&answers(&mut r, run("s1"), 1));
    }

    /// A bound DEALLOCATE or PREPARE marks its name at the Bind, but runs at the Execute of
    /// its portal, which may come after a later Parse of the name.
    #[test]
    fn a_portal_executed_after_a_parse_redefines_the_name_unseen() {
        let (_p, mut r) = client_with("pool_mode = session\n");
        let batch = Batch::new()
            .parse("d", "DEALLOCATE s1", &[])
            .parse("a", &format!("PREPARE s1 AS {FULL_READ}"), &[])
            .bind("q", "d", &[])
            .bind("p", "a", &[])
            .parse("s1", "SELECT 1", &[])
            .execute("q", 0)
            .execute("p", 0)
            .sync();
        let got = answers(&mut r, batch, 1);
        assert!(!got.contains('E'), "{got}");
        refused(&answers(&mut r, run("s1"), 1));
    }

    /// The same across batches inside a transaction: the portals outlive the Sync.
    #[test]
    fn a_portal_executed_in_a_later_batch_redefines_the_name_unseen() {
        let (_p, mut r) = client_with("pool_mode = session\n");
        r.query("BEGIN").unwrap();
        let bind = Batch::new()
            .parse("d", "DEALLOCATE s1", &[])
            .parse("a", &format!("PREPARE s1 AS {FULL_READ}"), &[])
            .bind("q", "d", &[])
            .bind("p", "a", &[])
            .sync();
        let got = answers(&mut r, bind, 1);
        assert!(!got.contains('E'), "{got}");
        let got = answers(&mut r, Batch::new().parse("s1", "SELECT 1", &[]).sync(), 1);
        assert!(!got.contains('E'), "{got}");
        let exec = Batch::new().execute("q", 0).execute("p", 0).sync();
        let got = answers(&mut r, exec, 1);
        assert!(!got.contains('E'), "{got}");
        refused(&answers(&mut r, run("s1"), 1));
    }

    /// A long-lived session-pooled client whose driver closes statements it evicts from its
    /// cache (pgjdbc, asyncpg, psycopg): after 10,000 closed names every statement it still
    /// holds is forgotten, and its Binds are refused.
    #[test]
    fn many_closed_names_make_live_statements_unknown() {
        let (_p, mut r) = client_with("pool_mode = session\n");
        let got = answers(
            &mut r,
            Batch::new().parse("live", "SELECT 1", &[]).sync(),
            1,
        );
        assert!(!got.contains('E'), "{got}");
        let got = answers(&mut r, run("live"), 1);
        assert!(got.contains("D[1]"), "before: {got}");
        for chunk in 0..11 {
            let mut churn = Batch::new();
            for i in 0..1000 {
                let name = format!("S_{chunk}_{i}");
                churn = churn.parse(&name, "SELECT 2", &[]).close(b'S', &name);
            }
            let got = answers(&mut r, churn.sync(), 1);
            assert!(!got.contains('E'), "{got}");
        }
        let got = answers(&mut r, run("live"), 1);
        assert!(got.contains("D[1]") && !got.contains('E'), "after: {got}");
    }

    /// A mistyped query that merely mentions one of the words (an unterminated literal):
    /// every statement the client prepared is forgotten.
    #[test]
    fn an_unreadable_text_mentioning_prepare_forgets_every_statement() {
        let (_p, mut r) = client_with("pool_mode = session\n");
        let got = answers(
            &mut r,
            Batch::new().parse("live", "SELECT 1", &[]).sync(),
            1,
        );
        assert!(!got.contains('E'), "{got}");
        r.send(&query_message("SELECT 'not prepared"));
        let got = read_to_ready_within(&mut r, Duration::from_secs(20)).unwrap();
        // (pgward's rules refuse it unread, 42501: it never reaches the server.)
        assert!(got.contains('E'), "{got}");
        let got = answers(&mut r, run("live"), 1);
        assert!(got.contains("D[1]") && !got.contains('E'), "after: {got}");
    }

    /// Transaction pooling: after a skipped unnamed Parse the server's unnamed statement is
    /// not the client's (here another client's full read). The skipped Parse dropped nothing
    /// (PostgreSQL never reads it), so the client's statement is still the one it prepared
    /// before: with a savepoint the transaction goes on, and a Bind of the unnamed statement
    /// runs that one (prepared again, and priced), never the other client's.
    #[test]
    fn a_skipped_unnamed_parse_lets_another_clients_unnamed_statement_run() {
        let policed = gated(
            POLICY,
            "pool_mode = transaction\ndefault_pool_size = 1\nmax_client_conn = 50\n",
        );
        let mut x = policed.pw.client_as("trustuser", "app");
        // The gate learns "SELECT 1" as x's unnamed statement.
        let got = answers(&mut x, Batch::new().unnamed("SELECT 1", &[]).sync(), 1);
        assert!(got.contains("D[1]"), "{got}");
        // Another client leaves a full read as the server's unnamed statement.
        let mut y = policed.pw.client_as("trustuser", "app");
        let got = answers(&mut y, Batch::new().parse("", FULL_READ, &[]).sync(), 1);
        assert!(!got.contains('E'), "{got}");
        drop(y);
        // (A simple Query would drop the server's unnamed statement: BEGIN and SAVEPOINT go
        // through named statements.)
        let begin = Batch::new()
            .parse("b", "BEGIN", &[])
            .bind("", "b", &[])
            .execute("", 0)
            .parse("sp", "SAVEPOINT sp", &[])
            .bind("", "sp", &[])
            .execute("", 0)
            .sync();
        let got = answers(&mut x, begin, 1);
        assert!(!got.contains('E') && got.ends_with('Z'), "{got}");
        let skipped = Batch::new()
            .describe(b'S', "nope")
            .parse("", "SELECT 2", &[])
            .sync();
        let got = answers(&mut x, skipped, 1);
        assert!(got.contains("E[26000]"), "{got}");
        let back = Batch::new()
            .parse("r", "ROLLBACK TO SAVEPOINT sp", &[])
            .bind("", "r", &[])
            .execute("", 0)
            .sync();
        let got = answers(&mut x, back, 1);
        assert!(!got.contains('E'), "{got}");
        let got = answers(&mut x, run(""), 1);
        assert_eq!(got, "2D[1]CZ");
    }

    /// A pipeline whose Bind of the unnamed statement follows the Sync of its Parse: the
    /// Bind waits for the Parse's answer, and the batches after it go to the same server, as
    /// they would have gone with no policy (the unnamed statement lives on that server only).
    #[test]
    fn a_pipelined_unnamed_statement_runs_on_the_server_that_parsed_it() {
        for mode in ["transaction", "statement"] {
            let (_p, mut r) = client_with(&format!(
                "pool_mode = {mode}\ndefault_pool_size = 2\nmax_client_conn = 50\n"
            ));
            let mut all = Batch::new().parse("", "SELECT 41", &[]).sync();
            all.bytes.extend(run("").bytes);
            let got = answers(&mut r, all, 2);
            assert!(got.contains("D[41]") && !got.contains('E'), "{mode}: {got}");
            // Still priced as its own text.
            let mut all = Batch::new().parse("", FULL_READ, &[]).sync();
            all.bytes.extend(run("").bytes);
            refused(&answers(&mut r, all, 2));
        }
    }

    /// A Bind of a name parsed in the batch before, inside a batch opened by other messages.
    #[test]
    fn a_bind_waiting_inside_an_open_batch_resumes() {
        for mode in ["session", "transaction"] {
            let (_p, mut r) = client(mode);
            let all = Batch::new()
                .parse("s1", "SELECT 41", &[])
                .sync()
                .parse("s2", "SELECT 42", &[])
                .describe(b'S', "s2")
                .bind("", "s2", &[])
                .execute("", 0)
                .bind("", "s1", &[])
                .execute("", 0)
                .sync();
            let got = answers(&mut r, all, 2);
            assert!(
                got.contains("D[41]") && got.contains("D[42]"),
                "{mode}: {got}"
            );
        }
    }

    /// Split across writes: the second write's Bind waits for the first write's answers.
    #[test]
    fn a_bind_in_a_later_write_resumes() {
        for mode in ["session", "transaction"] {
            let (_p, mut r) = client(mode);
            r.send(
                &Batch::new()
                    .parse("s1", "SELECT 41", &[])
                    .sync()
                    .parse("", "SELECT 1", &[])
                    .flush()
                    .bytes,
            );
            std::thread::sleep(Duration::from_millis(200));
            let rest = Batch::new().bind("", "s1", &[]).execute("", 0).sync();
            let got = answers(&mut r, rest, 2);
            assert!(got.contains("D[41]"), "{mode}: {got}");
        }
    }
}

/// A console command, as `admin`, with psql.
fn console_command(f: &Policed, sql: &str) -> Output {
    common::psql_at(f.pw.port, "admin", None, "pgward", sql)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_pooling_takes_the_server_before_the_slot() {
    // One server. A client holding it (session pooling) must get a slot for its next
    // statement while a newcomer waits for the server: the newcomer must not hold the only
    // slot while it waits.
    let f = gated(
        "[gate]\nqueue_timeout = \"20s\"\n",
        "pool_mode = session\ndefault_pool_size = 1\nquery_wait_timeout = 20\n",
    );
    let owner = common::driver::must_connect(&f.pw.connstr("trustuser", None, "app")).await;
    assert_eq!(
        common::driver::must_value(&owner.client, "SELECT 1").await,
        "1"
    );
    let newcomer = {
        let connstr = f.pw.connstr("trustuser", None, "app");
        tokio::spawn(async move {
            let c = common::driver::must_connect(&connstr).await;
            common::driver::value(&c.client, "SELECT 'newcomer'").await
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = Instant::now();
    let again = tokio::time::timeout(
        Duration::from_secs(5),
        common::driver::value(&owner.client, "SELECT 2"),
    )
    .await;
    assert!(
        matches!(again, Ok(Ok(ref v)) if v == "2"),
        "the server's owner waited for a slot the newcomer held: {again:?} after {:?}",
        started.elapsed()
    );
    drop(owner);
    let got = tokio::time::timeout(Duration::from_secs(10), newcomer).await;
    assert!(
        matches!(got, Ok(Ok(Ok(ref v))) if v == "newcomer"),
        "{got:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_while_a_prepare_waits_refuses_the_statement_not_the_session() {
    let f = Fixture(gated(
        "[gate]\nmax_active = 1\nqueue_timeout = \"30s\"\n",
        "default_pool_size = 4\nadmin_users = admin\n",
    ));
    // Another tenant holds the only slot.
    let sleeper = psql_in_background(f.conn("postgres"), "SELECT pg_sleep(1.5)");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let c = common::driver::must_connect(&f.conn("trustuser")).await;
    // The kill comes while the prepare waits for the slot.
    let port = f.pw.port;
    let kill = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        common::psql_at(
            port,
            "admin",
            None,
            "pgward",
            "KILL TENANT trustuser FOR '1m'",
        )
    });
    // The Parse carries no request: it waits for the slot and is prepared.
    let statement = c
        .client
        .prepare("SELECT 41 + 1")
        .await
        .expect("a prepare is not refused by a kill");
    let out = kill.join().expect("thread");
    assert!(out.status.success(), "{}", stderr_of(&out));
    let err = c
        .client
        .query(&statement, &[])
        .await
        .expect_err("the killed tenant's statement runs");
    assert_eq!(err.code().map(|c| c.code()), Some("53000"), "{err:?}");
    let out = console_command(&f, "UNKILL TENANT trustuser");
    assert!(out.status.success(), "{}", stderr_of(&out));
    let rows = c.client.query(&statement, &[]).await.expect("runs again");
    assert_eq!(rows[0].get::<_, i32>(0), 42);
    assert!(sleeper.join().expect("thread").status.success());
}

#[test]
fn a_statement_refused_by_a_rule_with_no_server_is_logged() {
    let f = Fixture::start("[[rules]]\nrule = \"deny_ddl\"\n");
    let out = f.psql("trustuser", &["CREATE TABLE refused_here (a int)"]);
    assert!(stderr_of(&out).contains("42501"), "{}", stderr_of(&out));
    assert!(
        common::eventually(Duration::from_secs(2), || f
            .pw
            .log()
            .contains("statement refused")),
        "{}",
        f.pw.log()
    );
}

/// Messages the gate held until the server answered what went before them.
mod held_messages {
    use super::pipelines::read_to_ready_within;
    use super::statement_names::read_answers as answers;
    use super::*;
    use common::raw::Batch;
    use std::time::Instant;

    const POOLED: &str = "pool_mode = transaction\ndefault_pool_size = 4\nmax_client_conn = 50\n";

    /// One slot: a pipeline of two Queries whose prices are unknown waits for the slot again
    /// between them, behind a request of another tenant that came meanwhile.
    #[test]
    fn a_held_query_waits_for_its_slot_in_the_queue() {
        let p = gated("[gate]\nmax_active = 1\nqueue_timeout = \"30s\"\n", POOLED);
        let mut a = p.pw.client_as("trustuser", "app");
        let mut b = p.pw.client_as("postgres", "app");
        b.send(&Batch::new().query("SELECT 3").bytes);
        answers(&mut b, 1);
        let started = Instant::now();
        let pipeline = Batch::new()
            .query("SELECT pg_sleep(1)")
            .query("SELECT pg_sleep(1), 2");
        a.send(&pipeline.bytes);
        std::thread::sleep(Duration::from_millis(300));
        b.send(&Batch::new().query("SELECT 3").bytes);
        let got = answers(&mut b, 1);
        let b_took = started.elapsed();
        assert!(got.contains("D[3]"), "{got}");
        assert!(
            b_took < Duration::from_millis(1800),
            "the other tenant waited behind the whole pipeline: {b_took:?}"
        );
        let got = answers(&mut a, 2);
        assert!(!got.contains('E') && got.matches('C').count() == 2, "{got}");
    }

    /// A tenant over its budget runs in the slow lane: a held request of its waits there,
    /// however it was held, while the slow lane's one slot is busy.
    #[test]
    fn a_held_request_of_a_tenant_in_debt_waits_for_the_slow_lane() {
        let policy = "[gate]\nqueue_timeout = \"30s\"\nslow_active = 1\n[tenants.acme]\n\
             roles = [\"trustuser\"]\nwhen_over = \"slow\"\nburst = 0.001\nrate = 0.1\n";
        let p = gated(policy, POOLED);
        let mut r = p.pw.client_as("trustuser", "app");
        let mut e = p.pw.client_as("trustuser", "app");
        // About a second of debt, paid back in about ten.
        r.send(&Batch::new().query("SELECT pg_sleep(1)").bytes);
        answers(&mut r, 1);
        // The slow lane's one slot, busy for three seconds.
        e.send(&Batch::new().query("SELECT pg_sleep(3)").bytes);
        std::thread::sleep(Duration::from_millis(300));
        let started = Instant::now();
        let mut all = Batch::new().parse("", "SELECT 41", &[]).sync();
        all.bytes
            .extend(Batch::new().bind("", "", &[]).execute("", 0).sync().bytes);
        r.send(&all.bytes);
        answers(&mut r, 2);
        let took = started.elapsed();
        assert!(
            took > Duration::from_millis(2000),
            "ran beside the slow lane's one slot: {took:?}"
        );
        answers(&mut e, 1);
    }

    /// A request the gate sends to the slow lane (its tenant in debt under when_over =
    /// "slow"), pipelined behind another tenant's request whose fast-lane slot the session
    /// holds, does not run in that slot: it waits for a slot of its own lane, busy here.
    #[test]
    fn a_pipelined_request_of_another_lane_waits_for_its_own() {
        let policy = "trusted_roles = [\"trustuser\"]\n[gate]\nqueue_timeout = \"30s\"\n\
             slow_active = 1\n[tenants.acme]\nwhen_over = \"slow\"\nburst = 0.001\n\
             rate = 0.1\n[tenants.free]\n";
        let p = gated(policy, POOLED);
        let mut r = p.pw.client_as("trustuser", "app");
        let mut e = p.pw.client_as("trustuser", "app");
        let cached = "SELECT 41 /*tenant='acme'*/";
        // Its plan cached while acme owes nothing, so it is priced before admission.
        r.send(&Batch::new().query(cached).bytes);
        answers(&mut r, 1);
        // About a second of debt, paid back in about ten.
        r.send(
            &Batch::new()
                .query("SELECT pg_sleep(1) /*tenant='acme'*/")
                .bytes,
        );
        answers(&mut r, 1);
        // The slow lane's one slot, busy for three seconds.
        e.send(
            &Batch::new()
                .query("SELECT pg_sleep(3) /*tenant='acme'*/")
                .bytes,
        );
        std::thread::sleep(Duration::from_millis(300));
        let started = Instant::now();
        let pipeline = Batch::new()
            .query("SELECT pg_sleep(0.2) /*tenant='free'*/")
            .query(cached);
        r.send(&pipeline.bytes);
        let got = answers(&mut r, 2);
        let took = started.elapsed();
        assert!(!got.contains('E'), "{got}");
        assert!(
            took > Duration::from_millis(2000),
            "ran in the other tenant's fast-lane slot: {took:?}"
        );
        answers(&mut e, 1);
    }

    /// A Bind the gate holds inside a batch (to explain it once what went before is answered)
    /// does not make the batch a transaction the client holds: the client sent its Sync, and
    /// transaction_timeout leaves the batch's long statement alone.
    #[test]
    fn a_batch_the_gate_holds_is_no_transaction_of_the_client_s() {
        let settings = format!("{POOLED}transaction_timeout = 1\n");
        let p = gated("[gate]\nmax_cost = 1000000\n", &settings);
        let mut client = p.pw.client_as("trustuser", "app");
        let batch = Batch::new()
            .unnamed("SELECT 1", &[])
            .unnamed("SELECT pg_sleep(1.5)", &[])
            .sync();
        client.send(&batch.bytes);
        let got = read_to_ready_within(&mut client, Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("{e}\n{}", p.pw.log()));
        assert!(!got.contains('E'), "{got}\n{}", p.pw.log());
    }

    /// `SELECT count(*)` of the active `sql` on the server, as another tenant asks it.
    fn running(b: &mut common::raw::Raw, sql: &str) -> (String, Duration) {
        let started = Instant::now();
        let count = format!(
            "SELECT count(*) FROM pg_stat_activity WHERE query = '{sql}' AND state = 'active'"
        );
        b.send(&Batch::new().query(&count).bytes);
        let got = answers(b, 1);
        (got, started.elapsed())
    }

    /// One slot (`max_active = 1`), a client of the tenant `trustuser` and one of another
    /// (`postgres`) that has run once.
    fn one_slot() -> (Policed, common::raw::Raw, common::raw::Raw) {
        let p = gated("[gate]\nmax_active = 1\nqueue_timeout = \"30s\"\n", POOLED);
        let a = p.pw.client_as("trustuser", "app");
        let mut b = p.pw.client_as("postgres", "app");
        b.send(&Batch::new().query("SELECT 3").bytes);
        answers(&mut b, 1);
        (p, a, b)
    }

    /// `first` run as `s1`, `s1` closed, then `then` parsed as `s1` and run: that Parse waits
    /// for the answers to the first, with what follows it.
    fn held_tail(first: &str, then: &str) -> Batch {
        Batch::new()
            .parse("s1", first, &[])
            .bind("", "s1", &[])
            .execute("", 0)
            .sync()
            .close(b'S', "s1")
            .sync()
            .parse("s1", then, &[])
            .bind("", "s1", &[])
            .execute("", 0)
            .sync()
    }

    /// A pipeline held by pgward's statement map (a Parse of a name whose earlier Parse is
    /// not answered yet) after the gate admitted what follows it: the rest waits for a slot
    /// of its own, with one slot busy (`max_active = 1`).
    #[test]
    fn a_tail_held_for_a_parse_of_its_name_takes_a_slot() {
        let (_p, mut a, mut b) = one_slot();
        a.send(&held_tail("SELECT pg_sleep(0.5)", "SELECT pg_sleep(3)").bytes);
        std::thread::sleep(Duration::from_millis(1500));
        let (got, took) = running(&mut b, "SELECT pg_sleep(3)");
        assert!(
            took > Duration::from_millis(1000) && got.contains("D[0]"),
            "ran beside the held statement with max_active = 1: {got} after {took:?}"
        );
        let got = answers(&mut a, 3);
        assert!(!got.contains('E'), "{got}");
    }

    /// Requests the gate admitted that wait behind a Parse of their name run in the run they
    /// were admitted to: the held statement is counted with its own time, not with the round
    /// trip of the Parse it waited for.
    #[test]
    fn a_tail_held_for_a_parse_of_its_name_is_timed_with_its_run() {
        let p = gated(
            "[gate]\nmax_active = 4\n",
            &format!("{POOLED}admin_users = admin\n"),
        );
        let mut a = p.pw.client_as("trustuser", "app");
        a.send(&held_tail("SELECT 1", "SELECT pg_sleep(0.4)").bytes);
        let got = answers(&mut a, 3);
        assert!(!got.contains('E'), "{got}");
        let out = common::psql_at(p.pw.port, "admin", None, "pgward", "SHOW STATEMENTS");
        let text = common::stdout_of(&out);
        let row: Vec<&str> = text
            .lines()
            .find(|l| l.contains("pg_sleep"))
            .unwrap_or_else(|| panic!("no row of the held statement: {text}"))
            .split('|')
            .collect();
        // calls, then max_ms (see SHOW STATEMENTS' columns).
        assert_eq!(row[4], "1", "{text}");
        let max_ms: f64 = row[11].parse().expect("max_ms");
        assert!(max_ms >= 350.0, "timed by the Parse it waited for: {text}");
    }

    /// The same, where the held messages open a transaction: it holds a slot to its end.
    #[test]
    fn a_transaction_opened_by_a_held_tail_holds_a_slot() {
        let (_p, mut a, mut b) = one_slot();
        a.send(
            &held_tail("SELECT pg_sleep(0.3)", "SELECT 1")
                .query("BEGIN")
                .bytes,
        );
        let got = answers(&mut a, 4);
        assert!(!got.contains('E') && got.ends_with('Z'), "{got}");
        a.send(&Batch::new().query("SELECT pg_sleep(1)").bytes);
        std::thread::sleep(Duration::from_millis(300));
        let count = "SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction'";
        b.send(&Batch::new().query(count).bytes);
        answers(&mut a, 1);
        // The other tenant waits while the transaction is open, idle or not.
        let early = read_to_ready_within(&mut b, Duration::from_millis(1500));
        assert!(early.is_err(), "ran beside the open transaction: {early:?}");
        a.send(&Batch::new().query("COMMIT").bytes);
        answers(&mut a, 1);
        let got = answers(&mut b, 1);
        assert!(got.contains("D[0]"), "{got}");
    }

    /// A statement waiting in the gate's queue when a reload adds a rule that refuses it is
    /// judged by the rules in force when it goes out.
    #[test]
    fn a_reload_during_a_wait_in_the_gate_applies_to_the_waiting_statement() {
        let before = "[gate]\nmax_active = 1\nqueue_timeout = \"30s\"\n";
        let p = gated(before, POOLED);
        let mut a = p.pw.client_as("postgres", "app");
        let mut b = p.pw.client_as("trustuser", "app");
        a.send(&Batch::new().query("SELECT pg_sleep(2)").bytes);
        std::thread::sleep(Duration::from_millis(300));
        b.send(
            &Batch::new()
                .query("CREATE TABLE made_after_reload (a int)")
                .bytes,
        );
        std::thread::sleep(Duration::from_millis(300));
        p.reload_with(&format!("{before}\n[[rules]]\nrule = \"deny_ddl\"\n"));
        answers(&mut a, 1);
        let got = answers(&mut b, 1);
        assert!(got.contains("E[42501]"), "ran under the old policy: {got}");
    }

    /// The row of `app/trustuser` in SHOW POOLS, by column.
    fn pool_row(port: u16) -> Vec<String> {
        let out = common::psql_at(port, "admin", None, "pgward", "SHOW POOLS");
        let text = common::stdout_of(&out);
        text.lines()
            .find(|l| l.starts_with("app|trustuser|"))
            .unwrap_or_else(|| panic!("no pool row: {text}"))
            .split('|')
            .map(str::to_string)
            .collect()
    }

    /// `a` sends an extended query (`SELECT 7`: Parse, Bind, Execute, Sync) while `r`, of
    /// the same tenant, runs a second's sleep: `a`'s request is admitted while the tenant owes
    /// nothing and priced after `r`'s run put it in debt.
    fn priced_after_a_debt(r: &mut common::raw::Raw, a: &mut common::raw::Raw) {
        r.send(&Batch::new().query("SELECT pg_sleep(1)").bytes);
        std::thread::sleep(Duration::from_millis(300));
        a.send(&Batch::new().unnamed("SELECT 7", &[]).sync().bytes);
        answers(r, 1);
    }

    /// An extended query ([Parse, Bind, Execute, Sync]) admitted while its tenant owed
    /// nothing, and priced once it did (another client of the tenant settled meanwhile),
    /// waits for its budget holding no server, though its Parse passed the gate before it.
    #[test]
    fn a_request_waiting_for_its_budget_behind_its_parse_holds_no_server() {
        let policy = "[gate]\nmax_active = 1\nqueue_timeout = \"30s\"\n[tenants.acme]\n\
             roles = [\"trustuser\"]\nwhen_over = \"wait\"\nburst = 0.5\nrate = 0.1\n";
        let p = gated(policy, &format!("{POOLED}admin_users = admin\n"));
        let mut r = p.pw.client_as("trustuser", "app");
        let mut a = p.pw.client_as("trustuser", "app");
        let started = Instant::now();
        priced_after_a_debt(&mut r, &mut a);
        // r's run put acme about half a second in debt (paid back in about five).
        std::thread::sleep(Duration::from_millis(800));
        let row = pool_row(p.pw.port);
        let early = read_to_ready_within(&mut a, Duration::from_millis(10));
        assert!(early.is_err(), "a did not wait for its budget: {early:?}");
        // database|user|cl_active|cl_waiting|..|..|sv_active
        assert_eq!(
            row[6], "0",
            "a server is held while waiting for the budget: {row:?}"
        );
        let got = answers(&mut a, 1);
        assert!(got.contains("D[7]"), "{got} after {:?}", started.elapsed());
    }

    /// A Parse of the unnamed statement and its Sync, then `between`, then a run of the
    /// unnamed statement, in one write, while the tenant is in debt.
    fn unnamed_after_a_debt(p: &Policed, text: &str, between: Batch) -> common::raw::Raw {
        let mut r = p.pw.client_as("trustuser", "app");
        let mut a = p.pw.client_as("trustuser", "app");
        r.send(&Batch::new().query("SELECT pg_sleep(1)").bytes);
        answers(&mut r, 1);
        let mut all = Batch::new().parse("", text, &[]).sync();
        all.bytes.extend(between.bytes);
        all = all.bind("", "", &[]).execute("", 0).sync();
        a.send(&all.bytes);
        a
    }

    const IN_DEBT: &str = "[gate]\nmax_active = 4\nqueue_timeout = \"30s\"\n\
        [tenants.acme]\nroles = [\"trustuser\"]\nwhen_over = \"wait\"\nburst = 0.5\n\
        rate = 0.5\n";

    /// A run of the unnamed statement that waits for its tenant's budget after the Sync of
    /// its Parse holds no server meanwhile, and runs on the next one: the unnamed statement
    /// is prepared there first, as PostgreSQL kept it for the client.
    #[test]
    fn an_unnamed_statement_waiting_for_its_budget_runs_on_the_next_server() {
        let p = gated(IN_DEBT, &format!("{POOLED}admin_users = admin\n"));
        let started = Instant::now();
        let mut a = unnamed_after_a_debt(&p, "SELECT 7", Batch::new());
        let got = answers(&mut a, 2);
        assert!(started.elapsed() > Duration::from_millis(1500), "no wait");
        assert!(got.contains("D[7]") && !got.contains('E'), "{got}");
    }

    /// The same, with a new Parse of the unnamed statement right behind the waiting run, in
    /// the same write: the run still runs the statement parsed before it.
    #[test]
    fn a_waiting_unnamed_run_is_not_changed_by_a_parse_behind_it() {
        let p = gated(IN_DEBT, POOLED);
        let mut a = unnamed_after_a_debt(&p, "SELECT 7", Batch::new());
        let after = Batch::new().unnamed("SELECT 8", &[]).sync();
        a.send(&after.bytes);
        let got = answers(&mut a, 3);
        assert!(
            got.contains("D[7]") && got.contains("D[8]") && !got.contains('E'),
            "{got}"
        );
    }

    /// The unnamed statement prepared again in a batch the server skips (an error before
    /// it): a run of it in the next batch of the same write runs the client's own statement,
    /// not another client's left on the server.
    #[test]
    fn a_skipped_preparation_of_the_unnamed_statement_leaves_no_other_clients_to_run() {
        let one = "pool_mode = transaction\ndefault_pool_size = 1\nmax_client_conn = 50\n";
        let p = gated("[gate]\nmax_active = 4\n", one);
        let mut x = p.pw.client_as("trustuser", "app");
        x.send(&Batch::new().parse("", "SELECT 7", &[]).sync().bytes);
        assert!(!answers(&mut x, 1).contains('E'));
        let mut y = p.pw.client_as("trustuser", "app");
        y.send(&Batch::new().parse("", "SELECT 'other'", &[]).sync().bytes);
        assert!(!answers(&mut y, 1).contains('E'));
        let all = Batch::new()
            .describe(b'S', "nope")
            .bind("", "", &[])
            .execute("", 0)
            .sync()
            .bind("", "", &[])
            .execute("", 0)
            .sync();
        x.send(&all.bytes);
        let got = answers(&mut x, 2);
        assert!(!got.contains("other") && got.contains("D[7]"), "{got}");
    }

    /// What drops the unnamed statement in PostgreSQL between its Parse and a run of it
    /// that waits (a simple Query, a Close of it, a Parse of it that fails) leaves nothing to
    /// prepare on the next server: the run fails as PostgreSQL fails it.
    #[test]
    fn an_unnamed_statement_dropped_before_its_run_is_not_prepared_again() {
        let p = gated(IN_DEBT, &format!("{POOLED}admin_users = admin\n"));
        let cases = [
            ("a simple Query", Batch::new().query("SELECT 8"), 3),
            ("a Close", Batch::new().close(b'S', ""), 2),
            (
                "a Parse that fails",
                Batch::new().parse("", "SELEC 9", &[]).sync(),
                3,
            ),
        ];
        for (what, between, readies) in cases {
            let mut a = unnamed_after_a_debt(&p, "SELECT 7", between);
            let got = answers(&mut a, readies);
            assert!(
                got.contains("E[26000]") && !got.contains("D[7]"),
                "after {what}: {got}"
            );
        }
    }

    /// A Describe of the unnamed statement in a later transaction, on whichever server:
    /// PostgreSQL kept the statement for the client, and it is prepared there first.
    #[test]
    fn an_unnamed_statement_from_an_earlier_transaction_is_described() {
        let p = gated(IN_DEBT, POOLED);
        let mut a = p.pw.client_as("trustuser", "app");
        a.send(
            &Batch::new()
                .parse("", "SELECT 7 AS seven", &[])
                .sync()
                .bytes,
        );
        assert!(!answers(&mut a, 1).contains('E'));
        a.send(&Batch::new().describe(b'S', "").sync().bytes);
        let got = answers(&mut a, 1);
        assert!(got.contains('T') && !got.contains('E'), "{got}");
    }

    /// `first` run as `s1` and `s1` closed in one batch, then `SELECT 2` parsed as `s1`: that
    /// Parse and its Sync wait for the answers to the first batch, with no request among them.
    fn tail_without_request(first: &str) -> Batch {
        Batch::new()
            .parse("s1", first, &[])
            .bind("", "s1", &[])
            .execute("", 0)
            .close(b'S', "s1")
            .sync()
            .parse("s1", "SELECT 2", &[])
            .sync()
    }

    /// A held tail with no request in it ([Parse s1, Sync]) keeps no slot: a request the
    /// client sent after the hold began waits in the gate's queue behind the other tenant
    /// queued before it.
    #[test]
    fn a_request_read_after_a_held_tail_does_not_take_its_slot() {
        let (_p, mut a, mut b) = one_slot();
        let first = tail_without_request("SELECT pg_sleep(0.5)");
        a.send(&first.bytes);
        std::thread::sleep(Duration::from_millis(150));
        let started = Instant::now();
        b.send(&Batch::new().query("SELECT pg_sleep(1)").bytes);
        std::thread::sleep(Duration::from_millis(150));
        a.send(&Batch::new().query("SELECT pg_sleep(1), 5").bytes);
        let got = answers(&mut b, 1);
        let b_took = started.elapsed();
        assert!(got.contains("D["), "{got}");
        let got_a = answers(&mut a, 3);
        assert!(!got_a.contains('E'), "{got_a}");
        assert!(
            b_took < Duration::from_millis(1900),
            "b, queued first, waited behind a's later request: {b_took:?}"
        );
    }

    /// A held tail with no request in it ends the run when the server has answered: the
    /// statement that ran before it is not timed (nor its tenant charged) with the wait of a
    /// request read after the tail for its tenant's budget, and no server is held meanwhile.
    #[test]
    fn a_run_before_a_held_tail_does_not_time_a_later_wait() {
        let policy = "[gate]\nmax_active = 4\nqueue_timeout = \"30s\"\n[tenants.acme]\n\
             roles = [\"trustuser\"]\nwhen_over = \"wait\"\nburst = 0.3\nrate = 0.1\n";
        let p = gated(policy, &format!("{POOLED}admin_users = admin\n"));
        let mut r = p.pw.client_as("trustuser", "app");
        let mut a = p.pw.client_as("trustuser", "app");
        r.send(&Batch::new().query("SELECT pg_sleep(0.6)").bytes);
        std::thread::sleep(Duration::from_millis(100));
        let first = tail_without_request("SELECT pg_sleep(1)");
        a.send(&first.bytes);
        std::thread::sleep(Duration::from_millis(200));
        a.send(&Batch::new().query("SELECT 5").bytes);
        answers(&mut r, 1);
        // a's first batch is answered at about 1.1 s; acme owes until about 3.6 s.
        std::thread::sleep(Duration::from_millis(1500));
        let row = pool_row(p.pw.port);
        let got = answers(&mut a, 3);
        assert!(!got.contains('E'), "{got}");
        let out = common::psql_at(p.pw.port, "admin", None, "pgward", "SHOW STATEMENTS");
        let text = common::stdout_of(&out);
        let line = text
            .lines()
            // (Both sleeps share one row: their constants are left out of the shape.)
            .find(|l| l.ends_with("SELECT pg_sleep($1)"))
            .unwrap_or_else(|| panic!("no row: {text}"));
        let cols: Vec<&str> = line.split('|').collect();
        let max_ms: f64 = cols[11].parse().expect("max_ms");
        assert!(
            max_ms < 2000.0 && row[6] == "0",
            "pg_sleep(1) timed {max_ms} ms; pool while waiting: {row:?}\n{text}"
        );
    }

    /// With one server in the pool, a client of another tenant does not wait for acme's
    /// pay-back while an extended query of acme's waits for its budget. (Database `shared`
    /// logs every client in as trustuser; tenants are still the login roles.)
    #[test]
    fn another_tenant_does_not_wait_for_a_tenants_pay_back() {
        let policy = "[gate]\nmax_active = 4\nqueue_timeout = \"30s\"\n[tenants.acme]\n\
             roles = [\"trustuser\"]\nwhen_over = \"wait\"\nburst = 0.5\nrate = 0.1\n";
        let p = Policed::start_with_databases(
            common::gate::SCHEMA,
            policy,
            "pool_mode = transaction\ndefault_pool_size = 1\nmax_client_conn = 50\nadmin_users = admin\n",
            "shared = {pg} dbname=app user=trustuser\n",
        );
        let mut r = p.pw.client_as("trustuser", "shared");
        let mut a = p.pw.client_as("trustuser", "shared");
        let mut c = p.pw.client_as("postgres", "shared");
        priced_after_a_debt(&mut r, &mut a);
        std::thread::sleep(Duration::from_millis(300));
        let started = Instant::now();
        c.send(&Batch::new().query("SELECT 3").bytes);
        // acme is paid back within about five seconds.
        let got = read_to_ready_within(&mut c, Duration::from_secs(10));
        let c_took = started.elapsed();
        assert!(
            got.as_ref().is_ok_and(|g| g.contains("D[3]")) && c_took < Duration::from_millis(1500),
            "another tenant's query: {got:?} after {c_took:?}"
        );
        let got = answers(&mut a, 1);
        assert!(got.contains("D[7]"), "{got}");
    }
}
