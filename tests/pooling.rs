//! Pools per (database, user): pool modes, sizes and limits, reset and check queries,
//! server lifetimes, connection-string settings, and tracked parameters that follow a client
//! from server to server. What happens message by message when a client gives its server back
//! is in transaction_pooling.rs.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::driver::{code, message, must_connect, must_value, value};
use common::raw::{describe, first_error, new_client_value, query_message, Raw};
use common::{
    eventually, log_statements_of, logged_statements, server_count, stderr_of, stdout_of, Pgward,
    Postgres, SECOND,
};

/// Samples the servers of pools of `user` on `db` (not the connection of pgward's server
/// reading, which no pool counts) every 100 ms until `stop` is set; returns the maximum.
fn watch_servers(pg: &Postgres, user: &'static str, db: &'static str, stop: &AtomicBool) -> u32 {
    let mut max = 0;
    let sql = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE usename = '{user}' AND datname = '{db}' \
         AND backend_type = 'client backend' AND pid <> pg_backend_pid() \
         AND application_name <> 'pgward server reading'"
    );
    while !stop.load(Ordering::Acquire) {
        let count = pg.sql_in("postgres", &sql);
        max = max.max(count.parse().expect("a count"));
        thread::sleep(Duration::from_millis(100));
    }
    max
}

/// The number after `label` in pgbench's output.
fn pgbench_number(out: &str, label: &str) -> Option<u64> {
    let line = out.lines().find(|l| l.contains(label))?;
    line.split(':')
        .nth(1)?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[test]
fn pgbench_simple_and_extended_with_more_clients_than_servers() {
    let pg = Postgres::start();
    let init = pg.pgbench(&["-i", "-s", "1", "-q"]);
    assert!(init.status.success(), "{}", stderr_of(&init));
    let pw = Pgward::trusting(&pg, "pool_mode = transaction\ndefault_pool_size = 2\n", "");
    for mode in ["simple", "extended"] {
        let stop = AtomicBool::new(false);
        let (out, max) = thread::scope(|scope| {
            let watcher = scope.spawn(|| watch_servers(&pg, "postgres", "app", &stop));
            let out = pw.pgbench(&["-c", "8", "-j", "2", "-T", "3", "-M", mode]);
            stop.store(true, Ordering::Release);
            (out, watcher.join().expect("watcher"))
        });
        let text = common::pgbench_clean(&out, &format!("-M {mode}"), &pw.log());
        let done = pgbench_number(&text, "number of transactions actually processed");
        assert!(done.is_some_and(|n| n > 0), "-M {mode}: {text}");
        assert!(max <= 2, "-M {mode}: {max} servers for a pool of 2");
        assert!(max >= 1, "-M {mode}: no server seen");
    }
    let out = pw.psql(
        "postgres",
        None,
        "app",
        "SELECT count(*) FROM pgbench_branches",
    );
    assert_eq!(stdout_of(&out), "1", "{}", stderr_of(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pool_mode_global_per_database_and_per_user() {
    let pg = Postgres::start();
    let dbs = format!(
        "txdb = {} pool_mode=transaction\nstdb = {} pool_mode=statement\n",
        pg.db_connstr("app"),
        pg.db_connstr("app")
    );
    let pw = Pgward::trusting(
        &pg,
        "pool_mode = session\ndefault_pool_size = 1\nquery_wait_timeout = 1\n\
         [users]\ntrustuser = pool_mode=statement\n",
        &dbs,
    );

    // Session mode (global): an idle client keeps its server, so a second client waits.
    let a = must_connect(&pw.connstr("postgres", None, "app")).await;
    must_value(&a.client, "SELECT 1").await;
    let b = must_connect(&pw.connstr("postgres", None, "app")).await;
    let err = value(&b.client, "SELECT 1")
        .await
        .expect_err("session mode shared a server");
    assert_eq!(code(&err), "57014", "{err:?}");
    assert_eq!(message(&err), "query_wait_timeout");
    drop((a, b));

    // Transaction mode (database): idle clients share the single server...
    let a = must_connect(&pw.connstr("postgres", None, "txdb")).await;
    let b = must_connect(&pw.connstr("postgres", None, "txdb")).await;
    let pid_a = must_value(&a.client, "SELECT pg_backend_pid()").await;
    let pid_b = must_value(&b.client, "SELECT pg_backend_pid()").await;
    assert_eq!(pid_a, pid_b, "one server for both clients");
    // ...but an open transaction holds it.
    a.client.batch_execute("BEGIN").await.expect("BEGIN");
    let err = value(&b.client, "SELECT 1")
        .await
        .expect_err("transaction not held");
    assert_eq!(code(&err), "57014", "{err:?}");
    a.client.batch_execute("COMMIT").await.expect("COMMIT");
    drop((a, b));

    // Statement mode, from the database and from the user (which wins over txdb's mode).
    for (user, db) in [
        ("postgres", "stdb"),
        ("trustuser", "txdb"),
        ("trustuser", "app"),
    ] {
        let c = must_connect(&pw.connstr(user, None, db)).await;
        assert_eq!(must_value(&c.client, "SELECT 7").await, "7");
        // The BEGIN itself fails (PgBouncer does not forward the ReadyForQuery that opened
        // the transaction); a later FATAL would leave the client thinking it had one.
        let err = c
            .client
            .batch_execute("BEGIN")
            .await
            .expect_err("statement mode: BEGIN succeeded");
        assert_eq!(code(&err), "08P01", "{user}@{db}: {err:?}");
    }
}

#[test]
fn statement_pooling_refuses_begin_before_the_client_sees_a_block() {
    let pg = Postgres::start();
    let pw = Pgward::trusting(&pg, "pool_mode = statement\n", "");
    let mut client = pw.client();
    client.send(&query_message("BEGIN"));
    let mut seen = Vec::new();
    let deadline = Instant::now() + 3 * SECOND;
    let closed = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match client.read_message_within(left) {
            Ok(msg) => seen.push(msg),
            Err(err) => break err.is_gone(),
        }
    };
    assert!(closed, "still open: [{}]", describe(&seen));
    assert!(
        !seen.iter().any(|m| m.tag == b'Z' && m.body == b"T"),
        "the client saw a transaction block open: [{}]",
        describe(&seen)
    );
    let fields = first_error(&seen).unwrap_or_else(|| panic!("[{}]", describe(&seen)));
    assert_eq!(
        (fields.severity(), fields.code()),
        ("FATAL", "08P01"),
        "{fields:?}"
    );
    let after = pw.psql("trustuser", None, "app", "SELECT 1");
    assert!(after.status.success(), "{}", stderr_of(&after));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn max_client_conn_refuses_with_53300() {
    let pg = Postgres::start();
    let pw = Pgward::trusting(&pg, "pool_mode = transaction\nmax_client_conn = 3\n", "");
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(must_connect(&pw.connstr("trustuser", None, "app")).await);
    }
    let err = common::driver::connect(&pw.connstr("trustuser", None, "app"))
        .await
        .err()
        .expect("a fourth client was accepted");
    assert_eq!(code(&err), "53300", "{err:?}");
    drop(held.pop());
    let ok = eventually(Duration::from_secs(3), || {
        pw.psql("trustuser", None, "app", "SELECT 1")
            .status
            .success()
    });
    assert!(ok, "a slot freed by a leaving client was not reused");
}

/// Runs `clients` psql processes at once, each `SELECT pg_sleep(secs)` as `user` on `db`;
/// returns the most servers seen for (`watch_user`, `watch_db`) and whether all succeeded.
fn sleepers(
    pg: &Postgres,
    pw: &Pgward,
    runs: &[(&'static str, &'static str)],
    secs: f64,
    watch: (&'static str, &'static str),
) -> (u32, Vec<String>) {
    let stop = AtomicBool::new(false);
    thread::scope(|scope| {
        let watcher = scope.spawn(|| watch_servers(pg, watch.0, watch.1, &stop));
        let jobs: Vec<_> = runs
            .iter()
            .map(|&(user, db)| {
                scope.spawn(move || pw.psql(user, None, db, &format!("SELECT pg_sleep({secs})")))
            })
            .collect();
        let failures: Vec<String> = jobs
            .into_iter()
            .map(|j| j.join().expect("psql thread"))
            .filter(|out| !out.status.success())
            .map(|out| stderr_of(&out))
            .collect();
        stop.store(true, Ordering::Release);
        (watcher.join().expect("watcher"), failures)
    })
}

#[test]
fn reserve_pool_opens_after_reserve_pool_timeout_and_no_further() {
    let pg = Postgres::start();
    let pw = Pgward::trusting(
        &pg,
        "pool_mode = transaction\ndefault_pool_size = 1\nreserve_pool_size = 1\n\
         reserve_pool_timeout = 0.5\n",
        "",
    );
    let runs = [("trustuser", "app"); 3];
    let started = Instant::now();
    let (max, failures) = sleepers(&pg, &pw, &runs, 1.5, ("trustuser", "app"));
    assert!(failures.is_empty(), "{failures:?}");
    assert_eq!(max, 2, "pool_size 1 + reserve 1");
    // Two run at once, the third after one of them: about 3 s, not 4.5.
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn a_pool_size_of_zero_is_bounded_by_the_shared_limits_alone() {
    let pg = Postgres::start();
    let dir = common::shared_tempdir("pgward-policy-");
    let policy = dir.path().join("policy.toml");
    std::fs::write(&policy, "[tenants.acme]\nroles = [\"trustuser\"]\n").expect("the policy");
    let governed = format!("policy_file = {}\n", policy.display());
    for extra in ["", governed.as_str()] {
        let settings = format!(
            "pool_mode = transaction\ndefault_pool_size = 0\nmax_db_connections = 3\n\
             query_wait_timeout = 6\n{extra}"
        );
        let pw = Pgward::trusting(&pg, &settings, "");
        let runs = [("trustuser", "app"); 5];
        let started = Instant::now();
        let (max, failures) = sleepers(&pg, &pw, &runs, 1.0, ("trustuser", "app"));
        assert!(failures.is_empty(), "{extra}: {failures:?}");
        assert_eq!(max, 3, "{extra}: max_db_connections alone bounds the pool");
        // Three at once, then two: about 2 s.
        let took = started.elapsed();
        assert!(took < Duration::from_millis(3500), "{extra}: {took:?}");
        drop(pw);
        assert!(eventually(5 * SECOND, || server_count(
            &pg,
            "trustuser",
            "app"
        ) == 0));
    }
    // A reload keeps such a pool's idle servers: it has no size to bring them within.
    let settings = "pool_mode = transaction\ndefault_pool_size = 0\nmax_db_connections = 3\n";
    let pw = Pgward::trusting(&pg, settings, "");
    let _clients = two_idle_servers(&pw);
    assert_eq!(server_count(&pg, "trustuser", "app"), 2);
    pw.reload_and_wait();
    thread::sleep(Duration::from_millis(300));
    assert_eq!(server_count(&pg, "trustuser", "app"), 2, "{}", pw.log());
}

/// Two clients of `app` in transaction pooling, each of which held a server at the same
/// time: the pool has two idle servers.
fn two_idle_servers(pw: &Pgward) -> (Raw, Raw) {
    let mut a = Raw::login(pw.port, "trustuser", None, "app");
    let mut b = Raw::login(pw.port, "trustuser", None, "app");
    a.query("BEGIN").expect("begin");
    b.query("BEGIN").expect("begin");
    a.query("COMMIT").expect("commit");
    b.query("COMMIT").expect("commit");
    (a, b)
}

#[test]
fn a_reload_keeps_the_servers_of_the_reserve() {
    let pg = Postgres::start();
    let pw = Pgward::trusting(
        &pg,
        "pool_mode = transaction\ndefault_pool_size = 1\nreserve_pool_size = 1\n\
         reserve_pool_timeout = 0.3\nserver_idle_timeout = 0\n",
        "",
    );
    let servers = || server_count(&pg, "trustuser", "app");
    let mut holder = pw.client_as("trustuser", "app");
    holder.query("BEGIN").expect("BEGIN");
    holder.query("SELECT 1").expect("SELECT 1");
    // The second client waits past reserve_pool_timeout: a server from the reserve.
    let out = pw.psql("trustuser", None, "app", "SELECT 1");
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert_eq!(servers(), 2);
    // Within pool_size + reserve_pool_size, as PgBouncer counts: a reload closes nothing.
    pw.reload_and_wait();
    thread::sleep(Duration::from_millis(500));
    assert_eq!(servers(), 2, "a reload closed a server of the reserve");
    holder.query("COMMIT").expect("COMMIT");
}

#[test]
fn min_pool_size_is_kept_open_while_the_pool_has_a_client() {
    let pg = Postgres::start();
    let pw = Pgward::trusting(
        &pg,
        "pool_mode = transaction\ndefault_pool_size = 5\nmin_pool_size = 3\n",
        "",
    );
    let servers = || server_count(&pg, "trustuser", "app");
    let mut client = pw.client_as("trustuser", "app");
    client.query("SELECT 1").expect("SELECT 1");
    let reached = eventually(Duration::from_secs(4), || servers() == 3);
    assert!(reached, "min_pool_size 3: {} servers", servers());
    // Killed servers are replaced up to the minimum while a client is connected.
    pg.terminate_backends("trustuser");
    let refilled = eventually(Duration::from_secs(4), || servers() == 3);
    assert!(refilled, "{} servers", servers());
    // With no client, the pool is not filled again (PgBouncer fills only a pool with a
    // client, or of a database with a forced user).
    drop(client);
    thread::sleep(Duration::from_millis(300));
    pg.terminate_backends("trustuser");
    assert!(eventually(Duration::from_secs(2), || servers() == 0));
    thread::sleep(Duration::from_millis(2500));
    assert_eq!(
        servers(),
        0,
        "a clientless pool was filled to min_pool_size"
    );
}

/// A database removed by a reload is not filled to min_pool_size for the clients it still
/// has: its servers would be closed as soon as opened (PgBouncer drops such a database).
#[test]
fn a_removed_database_is_not_refilled_for_its_clients() {
    let pg = Postgres::start();
    let line = format!("gone = {} min_pool_size=2", pg.db_connstr("app"));
    let pw = Pgward::trusting(&pg, "pool_mode = transaction\n", &format!("{line}\n"));
    let mut client = pw.client_as("trustuser", "gone");
    client.query("SELECT 1").expect("SELECT 1");
    let servers = || server_count(&pg, "trustuser", "app");
    assert!(
        eventually(Duration::from_secs(4), || servers() == 2),
        "{}",
        pw.log()
    );
    let ini = std::fs::read_to_string(&pw.ini_path).expect("ini");
    std::fs::write(&pw.ini_path, ini.replace(&line, "")).expect("ini");
    pw.reload_and_wait();
    let opened_before = pw.log().matches("new connection to server").count();
    thread::sleep(Duration::from_millis(2500));
    let opened = pw.log().matches("new connection to server").count() - opened_before;
    assert_eq!(opened, 0, "{}", pw.log());
}

/// A database entry without a host reaches PostgreSQL's Unix socket in `unix_socket_dir`, as
/// in PgBouncer.
#[test]
fn an_entry_without_a_host_uses_unix_socket_dir() {
    let pg = Postgres::start();
    let local = format!("local = dbname=app port={}\n", pg.port);
    let pw = Pgward::trusting(&pg, "pool_mode = transaction\n", &local);
    // pgward's unix_socket_dir is its own directory: PostgreSQL's socket is linked there.
    let socket = format!(".s.PGSQL.{}", pg.port);
    std::os::unix::fs::symlink(pg.socket_dir.join(&socket), pw.socket_dir.join(&socket))
        .expect("symlink");
    let mut client = pw.client_as("trustuser", "local");
    let got = client.value_within("SELECT 'by socket'", Duration::from_secs(5));
    assert_eq!(got.as_deref(), Ok("by socket"), "{}", pw.log());
}

/// Two databases with a forced user, whose min_pool_size together exceed
/// max_user_connections, settle: min_pool_size is filled without closing the other's servers
/// (PgBouncer fills it without evicting), where they closed each other's every second.
#[test]
fn min_pool_size_makes_no_room_under_a_shared_limit() {
    let pg = Postgres::start();
    let dbs = format!(
        "one = {c} user=trustuser min_pool_size=3\ntwo = {c} user=trustuser min_pool_size=3\n",
        c = pg.db_connstr("app")
    );
    let settings = "pool_mode = transaction\nmax_user_connections = 4\n";
    let pw = Pgward::trusting(&pg, settings, &dbs);
    let servers = || server_count(&pg, "trustuser", "app");
    assert!(
        eventually(Duration::from_secs(4), || servers() == 4),
        "{}",
        pw.log()
    );
    thread::sleep(Duration::from_millis(3000));
    assert!(!pw.log().contains("evicted"), "{}", pw.log());
    assert_eq!(servers(), 4, "{}", pw.log());
}

/// Servers opened together do not all close together at server_lifetime: as in PgBouncer,
/// one closes for its lifetime at most every server_lifetime / pool_size.
#[test]
fn server_lifetime_closes_are_spaced_out() {
    let pg = Postgres::start();
    let dbs = format!(
        "both = {} user=trustuser min_pool_size=2\n",
        pg.db_connstr("app")
    );
    let settings = "pool_mode = transaction\ndefault_pool_size = 2\nserver_lifetime = 1\n";
    let pw = Pgward::trusting(&pg, settings, &dbs);
    let closes = || {
        pw.log()
            .lines()
            .filter(|l| l.contains("server lifetime over"))
            .filter_map(|l| l.split_whitespace().next().map(str::to_string))
            .collect::<Vec<String>>()
    };
    assert!(
        eventually(Duration::from_secs(8), || closes().len() >= 4),
        "{}",
        pw.log()
    );
    let at = |stamp: &str| -> f64 {
        // HH:MM:SS.ffffff of an RFC 3339 stamp, in seconds.
        let time = stamp
            .split('T')
            .nth(1)
            .unwrap_or_default()
            .trim_end_matches('Z');
        time.split(':').fold(0.0, |acc, part| {
            acc * 60.0 + part.parse::<f64>().unwrap_or(0.0)
        })
    };
    let stamps = closes();
    for pair in stamps.windows(2) {
        // (Across midnight, a day later.)
        let gap = (at(&pair[1]) - at(&pair[0])).rem_euclid(86_400.0);
        assert!(
            gap >= 0.4,
            "closed {gap:.3} s apart: {stamps:?}\n{}",
            pw.log()
        );
    }
}

#[test]
fn max_db_connections_caps_servers_of_a_database() {
    let pg = Postgres::start();
    let dbs = format!(
        "capped = {} max_db_connections=2\nother = {}\n",
        pg.db_connstr("app"),
        pg.db_connstr("app")
    );
    let pw = Pgward::trusting(
        &pg,
        "pool_mode = transaction\ndefault_pool_size = 5\n",
        &dbs,
    );
    // Three clients of one pool on a database capped at two servers (all entries point at
    // the real database `app`).
    let runs = [("postgres", "capped"); 3];
    let (max, failures) = sleepers(&pg, &pw, &runs, 1.0, ("postgres", "app"));
    assert!(failures.is_empty(), "{failures:?}\n{}", pw.log());
    assert_eq!(max, 2, "max_db_connections=2");
}

#[test]
fn max_db_connections_takes_an_idle_server_from_another_pool() {
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(&pg, "max_db_connections = 1\nquery_wait_timeout = 4\n");
    let mut first = pw.client();
    first.value("SELECT 1");
    first.terminate();
    let since = Instant::now();
    assert_eq!(
        new_client_value(&pw, ("postgres", "app"), "SELECT current_user", 3 * SECOND),
        Ok("postgres".to_string()),
        "another user under max_db_connections = 1"
    );
    assert!(since.elapsed() < 3 * SECOND, "{:?}", since.elapsed());
}

/// Three pools of one user (three databases) share max_user_connections=1: an idle server of
/// one pool must make way for a client waiting in another (PgBouncer closes it).
#[test]
fn max_user_connections_caps_servers_of_a_user_across_databases() {
    let pg = Postgres::start();
    let dbs = format!(
        "capped = {}\nother = {}\n",
        pg.db_connstr("app"),
        pg.db_connstr("app")
    );
    let pw = Pgward::trusting(
        &pg,
        "pool_mode = transaction\ndefault_pool_size = 5\nquery_wait_timeout = 5\n\
         [users]\ntrustuser = max_user_connections=1\n",
        &dbs,
    );
    let runs = [
        ("trustuser", "app"),
        ("trustuser", "other"),
        ("trustuser", "capped"),
    ];
    let (max, failures) = sleepers(&pg, &pw, &runs, 0.7, ("trustuser", "app"));
    assert!(failures.is_empty(), "{failures:?}\n{}", pw.log());
    assert_eq!(max, 1, "max_user_connections=1");
}

#[test]
fn server_reset_query_runs_in_session_mode_only() {
    let pg = Postgres::start();
    log_statements_of(&pg, "trustuser");
    let dbs = format!("txdb = {} pool_mode=transaction\n", pg.db_connstr("app"));
    let pw = Pgward::trusting(&pg, "pool_mode = session\ndefault_pool_size = 1\n", &dbs);
    let mut a = pw.client();
    let pid = a.value("SELECT pg_backend_pid()");
    a.value("CREATE TEMP TABLE scratch (id int)");
    a.value("SET work_mem = '7MB'");
    a.terminate();

    let mut b = pw.client();
    assert_eq!(
        b.value("SELECT pg_backend_pid()"),
        pid,
        "the server was not reused"
    );
    assert_eq!(b.value("SHOW work_mem"), "4MB", "SET survived the reset");
    assert_eq!(
        b.value("SELECT to_regclass('pg_temp.scratch') IS NULL"),
        "t",
        "temp table survived"
    );
    b.terminate();
    assert!(
        eventually(Duration::from_secs(3), || logged_statements(
            &pg,
            "DISCARD ALL"
        ) == 2),
        "DISCARD ALL ran {} times, expected once per session client",
        logged_statements(&pg, "DISCARD ALL")
    );

    // Transaction mode: no reset between clients (server_reset_query_always is off).
    let mut c = pw.client_as("trustuser", "txdb");
    c.value("SELECT 'tx client'");
    c.terminate();
    thread::sleep(Duration::from_millis(300));
    assert_eq!(logged_statements(&pg, "DISCARD ALL"), 2);
}

/// server_reset_query_always runs the reset at every release in statement pooling too, as
/// in PgBouncer.
#[test]
fn server_reset_query_always_resets_in_statement_pooling() {
    let pg = Postgres::start();
    log_statements_of(&pg, "trustuser");
    let pw = Pgward::trusting(
        &pg,
        "pool_mode = statement\ndefault_pool_size = 1\nserver_reset_query_always = 1\n",
        "",
    );
    let mut a = pw.client();
    a.value("SELECT 1");
    a.value("SELECT 2");
    assert!(
        eventually(Duration::from_secs(3), || logged_statements(
            &pg,
            "DISCARD ALL"
        ) == 2),
        "DISCARD ALL ran {} times, expected once per statement",
        logged_statements(&pg, "DISCARD ALL")
    );
}

#[test]
fn server_check_query_runs_after_server_check_delay() {
    let pg = Postgres::start();
    log_statements_of(&pg, "trustuser");
    let pw = Pgward::trusting(
        &pg,
        "pool_mode = transaction\ndefault_pool_size = 1\nserver_check_delay = 0.5\n\
         server_check_query = SELECT 'pgward check'\n",
        "",
    );
    let mut a = pw.client();
    a.value("SELECT 1");
    a.value("SELECT 2");
    let before = logged_statements(&pg, "SELECT 'pgward check'");
    thread::sleep(Duration::from_millis(900));
    a.value("SELECT 3");
    a.value("SELECT 4");
    thread::sleep(Duration::from_millis(100));
    let after = logged_statements(&pg, "SELECT 'pgward check'");
    assert_eq!(
        after - before,
        1,
        "one check after the delay, none right after use"
    );
    a.terminate();
}

#[test]
fn client_leaving_during_the_server_check_frees_its_slot() {
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(
        &pg,
        "default_pool_size = 1\nserver_check_delay = 0\n\
         server_check_query = select pg_sleep(1.5)\nquery_wait_timeout = 3\n",
    );
    let mut leaver = pw.client();
    // The idle server is checked first; the client leaves in the middle of the check.
    leaver.send(&query_message("SELECT 'never answered'"));
    thread::sleep(Duration::from_millis(500));
    drop(leaver);

    let since = Instant::now();
    assert_eq!(
        new_client_value(&pw, ("trustuser", "app"), "SELECT 'served'", 5 * SECOND),
        Ok("served".to_string()),
        "after a client left during the check"
    );
    assert!(since.elapsed() < 6 * SECOND, "{:?}", since.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_idle_timeout_closes_idle_servers() {
    let pg = Postgres::start();
    let pw = Pgward::trusting(
        &pg,
        "pool_mode = transaction\nserver_idle_timeout = 1\n",
        "",
    );
    let client = must_connect(&pw.connstr("trustuser", None, "app")).await;
    must_value(&client.client, "SELECT 1").await;
    assert_eq!(server_count(&pg, "trustuser", "app"), 1);
    let closed = eventually(Duration::from_secs(4), || {
        server_count(&pg, "trustuser", "app") == 0
    });
    assert!(closed, "the idle server was not closed");
    // The client is still there and gets a new server.
    assert_eq!(must_value(&client.client, "SELECT 5").await, "5");
}

/// server_lifetime = 0 uses each server once, as PgBouncer does: every transaction gets a
/// new server, and the pooler does not open servers in a loop while a client waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_lifetime_zero_uses_each_server_once() {
    let pg = Postgres::start();
    let pw = Pgward::trusting(
        &pg,
        "pool_mode = transaction\ndefault_pool_size = 2\nserver_lifetime = 0\n\
         query_wait_timeout = 5\n",
        "",
    );
    let client = must_connect(&pw.connstr("trustuser", None, "app")).await;
    let mut pids = Vec::new();
    for _ in 0..3 {
        pids.push(must_value(&client.client, "SELECT pg_backend_pid()").await);
    }
    pids.dedup();
    assert_eq!(pids.len(), 3, "each transaction a new server: {pids:?}");
    assert!(
        eventually(Duration::from_secs(3), || server_count(
            &pg,
            "trustuser",
            "app"
        ) == 0),
        "used servers stay open"
    );
}

/// Under server_lifetime = 0 a server min_pool_size opened waits for its one use instead of
/// being closed and opened again at every maintenance pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_lifetime_zero_keeps_an_unused_min_pool_server() {
    let pg = Postgres::start();
    let pw = Pgward::trusting(
        &pg,
        "pool_mode = transaction\nserver_lifetime = 0\n",
        &format!(
            "kept = {} user=trustuser min_pool_size=1\n",
            pg.db_connstr("app")
        ),
    );
    let pids = || {
        pg.sql_in(
            "postgres",
            "SELECT string_agg(pid::text, ',') FROM pg_stat_activity \
             WHERE usename = 'trustuser' AND datname = 'app'",
        )
    };
    assert!(
        eventually(Duration::from_secs(5), || !pids().is_empty()),
        "min_pool_size opened nothing\n{}",
        pw.log()
    );
    let first = pids();
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(pids(), first, "the unused server was replaced");
    let client = must_connect(&pw.connstr("trustuser", None, "kept")).await;
    let used = must_value(&client.client, "SELECT pg_backend_pid()").await;
    assert_eq!(used, first, "the client did not get the waiting server");
    assert!(
        eventually(Duration::from_secs(5), || {
            let now = pids();
            !now.is_empty() && !now.split(',').any(|p| p == used)
        }),
        "the used server was kept"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_lifetime_replaces_old_servers() {
    let pg = Postgres::start();
    let pw = Pgward::trusting(&pg, "pool_mode = transaction\ndefault_pool_size = 1\nserver_lifetime = 1\nserver_idle_timeout = 0\n", "");
    let client = must_connect(&pw.connstr("trustuser", None, "app")).await;
    let first = must_value(&client.client, "SELECT pg_backend_pid()").await;
    let started = Instant::now();
    let mut pids = vec![first.clone()];
    while started.elapsed() < Duration::from_millis(2500) {
        tokio::time::sleep(Duration::from_millis(200)).await;
        pids.push(must_value(&client.client, "SELECT pg_backend_pid()").await);
    }
    pids.dedup();
    assert!(
        pids.len() >= 2,
        "one server for 2.5 s with server_lifetime=1: {pids:?}"
    );
    let alive = pg.sql_in(
        "postgres",
        &format!("SELECT count(*) FROM pg_stat_activity WHERE pid = {first}"),
    );
    assert_eq!(alive, "0", "the expired server is still open");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn connection_string_settings_reach_the_server() {
    let pg = Postgres::start();
    pg.sql("CREATE TABLE connect_marks (at timestamptz DEFAULT now())");
    pg.sql("GRANT ALL ON connect_marks TO PUBLIC");
    let dbs = format!(
        "tuned = host=127.0.0.1 port={} dbname=app user=trustuser pool_size=1 \
         connect_query='INSERT INTO connect_marks DEFAULT VALUES' client_encoding=LATIN1 \
         datestyle='SQL, DMY' timezone=Pacific/Auckland\n\
         * = host=127.0.0.1 port={} pool_size=1\n",
        pg.port, pg.port
    );
    let pw = Pgward::trusting(&pg, "pool_mode = transaction\n", &dbs);
    let raw = {
        let mut c = Raw::connect(pw.port);
        let login = c
            .startup(&[("user", "postgres"), ("database", "tuned")])
            .unwrap_or_else(|e| panic!("{e:?}"));
        (c, login)
    };
    let (mut c, login) = raw;
    assert_eq!(
        login.param("TimeZone"),
        Some("Pacific/Auckland"),
        "{login:?}"
    );
    assert_eq!(c.value("SELECT current_user"), "trustuser");
    assert_eq!(c.value("SHOW TimeZone"), "Pacific/Auckland");
    assert_eq!(c.value("SHOW DateStyle"), "SQL, DMY");
    assert_eq!(c.value("SHOW client_encoding"), "LATIN1");
    assert_eq!(c.value("SELECT count(*) FROM connect_marks"), "1");
    c.terminate();
    assert_eq!(server_count(&pg, "trustuser", "app"), 1, "pool_size=1");

    // The `*` entry serves any database name, here `postgres`... and one not listed.
    pg.sql_in("postgres", "CREATE DATABASE extra");
    let client = must_connect(&pw.connstr("trustuser", None, "extra")).await;
    assert_eq!(
        must_value(&client.client, "SELECT current_database()").await,
        "extra"
    );
}

/// Client A sets parameters at startup and with SET; client B keeps the defaults; with one
/// server they share it and must each see their own values.
#[test]
fn tracked_parameters_follow_each_client_on_a_shared_server() {
    let pg = Postgres::start();
    let pw = Pgward::trusting(
        &pg,
        "pool_mode = transaction\ndefault_pool_size = 1\n\
         track_extra_parameters = IntervalStyle, default_transaction_read_only\n",
        "",
    );
    let default_tz = pg.sql("SHOW TimeZone");
    let mut a = pw.client_with(&[
        ("user", "trustuser"),
        ("database", "app"),
        ("application_name", "alpha"),
        (
            "options",
            "-c TimeZone=Asia/Tokyo -c default_transaction_read_only=on -c IntervalStyle=postgres_verbose",
        ),
    ]);
    let mut b = pw.client_with(&[
        ("user", "trustuser"),
        ("database", "app"),
        ("application_name", "beta"),
    ]);
    let show = "SELECT current_setting('TimeZone') || '|' || current_setting('application_name') \
                || '|' || current_setting('default_transaction_read_only') || '|' || current_setting('IntervalStyle') \
                || '|' || current_setting('DateStyle') || '|' || current_setting('standard_conforming_strings') \
                || '|' || current_setting('client_encoding')";
    let a_start = "Asia/Tokyo|alpha|on|postgres_verbose|ISO, MDY|on|UTF8";
    let b_default = format!("{default_tz}|beta|off|postgres|ISO, MDY|on|UTF8");
    assert_eq!(
        a.value("SELECT pg_backend_pid()"),
        b.value("SELECT pg_backend_pid()")
    );
    assert_eq!(a.value(show), a_start);
    assert_eq!(b.value(show), b_default);
    a.value("SET TimeZone = 'America/New_York'");
    a.value("SET DateStyle = 'German'");
    a.value("SET standard_conforming_strings = off");
    a.value("SET client_encoding = 'LATIN1'");
    a.value("SET application_name = 'alpha2'");
    assert_eq!(b.value(show), b_default, "B sees A's SETs");
    assert_eq!(
        a.value(show),
        "America/New_York|alpha2|on|postgres_verbose|German, DMY|off|LATIN1"
    );
    assert_eq!(b.value(show), b_default);
    // A transaction that sets and rolls back leaves A's value as it was.
    a.value("BEGIN");
    a.value("SET TimeZone = 'UTC'");
    a.value("ROLLBACK");
    assert_eq!(b.value(show), b_default);
    assert!(a.value(show).starts_with("America/New_York|"));
    a.terminate();
    b.terminate();
}

#[test]
fn search_path_tracked_but_unreported_stays_with_its_client() {
    let pg = Postgres::start();
    let default_path = pg.sql("SHOW search_path");
    let pw = Pgward::transaction_pool(
        &pg,
        "default_pool_size = 1\ntrack_extra_parameters = search_path\n",
    );
    let with_path = |path: &str| {
        let options = format!("-c search_path={path}");
        let params = [
            ("user", "trustuser"),
            ("database", "app"),
            ("options", options.as_str()),
        ];
        pw.client_with(&params)
    };
    let mut a = with_path("schema_a");
    let mut b = with_path("schema_b");
    let show = "SHOW search_path";
    assert_eq!(a.value(show), "schema_a");
    assert_eq!(b.value(show), "schema_b");
    assert_eq!(a.value(show), "schema_a", "A got B's search_path");
    assert_eq!(b.value(show), "schema_b");
    let mut plain = pw.client();
    assert_eq!(
        plain.value(show),
        default_path,
        "a client without search_path inherited another's"
    );
    assert_eq!(a.value(show), "schema_a");
}

#[test]
fn many_clients_through_psql_share_two_servers() {
    let pg = Postgres::start();
    let pw = Pgward::trusting(&pg, "pool_mode = transaction\ndefault_pool_size = 2\n", "");
    let count = Arc::new(AtomicU32::new(0));
    thread::scope(|scope| {
        for i in 0..6 {
            let count = count.clone();
            let pw = &pw;
            scope.spawn(move || {
                let out = pw.psql(
                    "trustuser",
                    None,
                    "app",
                    &format!("SELECT {i}; SELECT pg_sleep(0.2); SELECT {i} * 2"),
                );
                assert!(out.status.success(), "{}", stderr_of(&out));
                assert!(stdout_of(&out).ends_with(&format!("{}", i * 2)));
                count.fetch_add(1, Ordering::AcqRel);
            });
        }
    });
    assert_eq!(count.load(Ordering::Acquire), 6);
    assert!(server_count(&pg, "trustuser", "app") <= 2);
}

#[test]
fn a_host_list_falls_through_an_unresolvable_first_host() {
    let pg = Postgres::start();
    let dbs = format!(
        "listed = host=unresolvable.invalid,127.0.0.1 port={} dbname=app load_balance_hosts=disable\n\
         rotated = host=127.0.0.1,localhost port={} dbname=app",
        pg.port, pg.port
    );
    let pw = Pgward::trusting(
        &pg,
        "server_login_retry = 1\nquery_wait_timeout = 10\n",
        &dbs,
    );
    // The first connection tries the first host, fails to resolve it, and the retry goes to
    // the next; later connections stay there.
    let out = pw.psql("postgres", None, "listed", "SELECT 1");
    assert_eq!(stdout_of(&out), "1", "{}\n{}", stderr_of(&out), pw.log());
    let log = pw.log();
    assert!(
        log.contains("closing because: server DNS lookup failed"),
        "{log}"
    );
    assert!(log.contains("127.0.0.1:"), "{log}");
    assert!(log.contains("new connection to server"), "{log}");
    // Round-robin: two servers opened at once take the two entries in turn.
    thread::scope(|scope| {
        let sleepers: Vec<_> = (0..2)
            .map(|_| scope.spawn(|| pw.psql("postgres", None, "rotated", "SELECT pg_sleep(0.5)")))
            .collect();
        for s in sleepers {
            let out = s.join().expect("sleeper");
            assert!(out.status.success(), "{}", stderr_of(&out));
        }
    });
    let log = pw.log();
    assert!(log.contains("app@localhost:"), "{log}");
    assert!(log.contains("app@127.0.0.1:"), "{log}");
}

#[test]
fn pool_idle_timeout_frees_a_pool_with_no_client_and_no_server() {
    let pg = Postgres::start();
    let pw = Pgward::trusting(
        &pg,
        "admin_users = admin\npool_idle_timeout = 1\nserver_idle_timeout = 1\n",
        "",
    );
    let out = pw.psql("postgres", None, "app", "SELECT 1");
    assert_eq!(stdout_of(&out), "1", "{}", stderr_of(&out));
    let pools = || stdout_of(&pw.psql("admin", None, "pgbouncer", "SHOW POOLS"));
    assert!(pools().contains("app|postgres|"), "{}", pools());
    assert!(
        eventually(10 * SECOND, || !pools().contains("app|postgres|")),
        "{}\n{}",
        pools(),
        pw.log()
    );
    assert!(
        pw.log().contains("app/postgres: cleaning up idle pool"),
        "{}",
        pw.log()
    );
    // A new client makes the pool again.
    let out = pw.psql("postgres", None, "app", "SELECT 1");
    assert_eq!(stdout_of(&out), "1", "{}", stderr_of(&out));
}

#[test]
fn server_round_robin_takes_the_idle_servers_in_turn() {
    let pg = Postgres::start();
    for (round_robin, distinct) in [(0, 1), (1, 2)] {
        let settings = format!(
            "pool_mode = transaction\ndefault_pool_size = 2\nserver_round_robin = {round_robin}\n"
        );
        let pw = Pgward::trusting(&pg, &settings, "");
        let (mut a, _b) = two_idle_servers(&pw);
        let pids: std::collections::BTreeSet<String> =
            (0..4).map(|_| a.value("SELECT pg_backend_pid()")).collect();
        assert_eq!(
            pids.len(),
            distinct,
            "server_round_robin = {round_robin}: {pids:?}"
        );
    }
}

#[test]
fn autodb_idle_timeout_frees_an_auto_database_left_unused() {
    let pg = Postgres::start();
    pg.sql_in("postgres", "CREATE DATABASE auto1");
    let star = format!("* = host={} port={}\n", common::HOST, pg.port);
    let settings = "admin_users = admin\nautodb_idle_timeout = 1\nserver_idle_timeout = 1\n";
    let pw = Pgward::trusting(&pg, settings, &star);
    for db in ["auto1", "app"] {
        let out = pw.psql("postgres", None, db, "SELECT 1");
        assert_eq!(stdout_of(&out), "1", "{}", stderr_of(&out));
    }
    let pools = || stdout_of(&pw.psql("admin", None, "pgbouncer", "SHOW POOLS"));
    assert!(pools().contains("auto1|postgres|"), "{}", pools());
    assert!(
        eventually(10 * SECOND, || !pools().contains("auto1|postgres|")),
        "{}\n{}",
        pools(),
        pw.log()
    );
    assert!(
        pw.log().contains("auto1/postgres: cleaning up idle pool"),
        "{}",
        pw.log()
    );
    // A database of its own entry stays (pool_idle_timeout is not set).
    assert!(pools().contains("app|postgres|"), "{}", pools());
    let out = pw.psql("postgres", None, "auto1", "SELECT 1");
    assert_eq!(stdout_of(&out), "1", "{}", stderr_of(&out));
}

#[test]
fn a_reload_that_changes_the_host_list_replaces_the_servers() {
    let pg = Postgres::start();
    let db = |hosts: &str| {
        format!(
            "listed = host={hosts} port={} dbname=app load_balance_hosts=disable",
            pg.port
        )
    };
    // The first host stays; another entry of the list changes.
    let (old, new) = (db("127.0.0.1,localhost"), db("127.0.0.1,127.0.0.2"));
    let pw = Pgward::trusting(&pg, "", &old);
    let out = pw.psql("postgres", None, "listed", "SELECT 1");
    assert_eq!(stdout_of(&out), "1", "{}", stderr_of(&out));
    let ini = std::fs::read_to_string(&pw.ini_path).expect("ini");
    assert!(ini.contains(&old), "{ini}");
    std::fs::write(&pw.ini_path, ini.replace(&old, &new)).expect("ini");
    pw.reload_and_wait();
    // Its server closes: at once if it was idle, else when it comes back.
    let replaced = || {
        let log = pw.log();
        log.contains("listed/postgres: database configuration changed")
            && log
                .lines()
                .any(|l| l.contains("closing because:") && l.contains("pool=listed"))
    };
    assert!(eventually(5 * SECOND, replaced), "{}", pw.log());
    let out = pw.psql("postgres", None, "listed", "SELECT 1");
    assert_eq!(stdout_of(&out), "1", "{}", stderr_of(&out));
}

#[test]
fn a_host_list_without_round_robin_probes_its_host_with_one_attempt() {
    let pg = Postgres::start();
    let dbs = format!(
        "probed = host=unresolvable.invalid,127.0.0.1 port={} dbname=app load_balance_hosts=disable",
        pg.port
    );
    let pw = Pgward::trusting(&pg, "server_login_retry = 1\nadmin_users = admin\n", &dbs);
    let console = |sql| pw.psql("admin", None, "pgbouncer", sql);
    // Two clients at once need two servers: the bad first host costs one attempt, not two.
    // Both wait behind a PAUSE first, so their requests reach the pool together.
    assert!(console("PAUSE probed").status.success());
    thread::scope(|scope| {
        let sleepers: Vec<_> = (0..2)
            .map(|_| scope.spawn(|| pw.psql("postgres", None, "probed", "SELECT pg_sleep(0.5)")))
            .collect();
        // Both logins wait in the pause hold (they cannot be seen there by name).
        thread::sleep(Duration::from_millis(1000));
        assert!(console("RESUME probed").status.success());
        for s in sleepers {
            let out = s.join().expect("sleeper");
            assert!(out.status.success(), "{}\n{}", stderr_of(&out), pw.log());
        }
    });
    let log = pw.log();
    let failures = log
        .lines()
        .filter(|l| l.contains("closing because: server DNS lookup failed"))
        .count();
    assert_eq!(failures, 1, "{log}");
    assert_eq!(log.matches("new connection to server").count(), 2, "{log}");
}

/// PostgreSQL, and pgward (transaction pooling, admin user postgres) in front of it as database
/// `slow` through a relay that holds each connection's first packet for 1.5 s: a server's
/// login takes that long.
fn slow_logins() -> (Postgres, Pgward) {
    logins_taking(Duration::from_millis(1500))
}

/// [`slow_logins`] with logins that take `delay`.
fn logins_taking(delay: Duration) -> (Postgres, Pgward) {
    logins_taking_with(delay, "")
}

/// [`logins_taking`] with more `settings`.
fn logins_taking_with(delay: Duration, settings: &str) -> (Postgres, Pgward) {
    let pg = Postgres::start();
    let relay = relay_holding_logins(&pg, delay);
    let dbs = format!("slow = host={} port={relay} dbname=app\n", common::HOST);
    let settings = format!("pool_mode = transaction\nadmin_users = postgres\n{settings}");
    let pw = Pgward::trusting(&pg, &settings, &dbs);
    (pg, pw)
}

/// Runs `cmd` on the console of the pgward at `port` as its admin user `postgres`, which must
/// succeed.
/// In a thread: a client of trustuser logs in to `database` within `wait`.
fn log_in_in_thread(
    port: u16,
    database: &'static str,
    wait: Duration,
) -> thread::JoinHandle<Result<(), String>> {
    thread::spawn(move || {
        let params = [("user", "trustuser"), ("database", database)];
        Raw::login_within(port, &params, wait).map(|_| ())
    })
}

/// In a thread: a client of trustuser logs in to `database` (within 10 s) and answers the
/// value of `sql` (within `wait`).
fn ask_in_thread(
    port: u16,
    database: &'static str,
    sql: &'static str,
    wait: Duration,
) -> thread::JoinHandle<Result<String, String>> {
    thread::spawn(move || {
        let params = [("user", "trustuser"), ("database", database)];
        let mut client = Raw::login_within(port, &params, Duration::from_secs(10))?;
        client.value_within(sql, wait)
    })
}

fn console_at(port: u16, cmd: &str) {
    let out = common::psql_at(port, "postgres", None, "pgbouncer", cmd);
    assert!(out.status.success(), "{cmd}: {}", stderr_of(&out));
}

/// A relay to `pg` that holds each connection's first packet for `delay`; its port.
fn relay_holding_logins(pg: &Postgres, delay: Duration) -> u16 {
    let slowness = common::relay::Slowness {
        cancel_hold: Duration::ZERO,
        cancel_delay: Duration::ZERO,
        first_packet_delay: delay,
        pace: None,
    };
    common::relay::slow_relay(pg.port, slowness)
}

/// A server whose connect began before a RECONNECT serves no one, as one opened before it
/// (PgBouncer drops servers in their login phase too): the client waiting for it is served by
/// a new one, which stays.
#[test]
fn a_server_still_logging_in_at_a_reconnect_serves_no_one() {
    let (pg, pw) = slow_logins();
    let port = pw.port;
    let reconnect = move || console_at(port, "RECONNECT slow");
    // A first client's login opens a server: the pool has its welcome, and an idle server
    // that a first RECONNECT closes.
    let mut client = pw.client_as("trustuser", "slow");
    reconnect();
    assert!(common::eventually(Duration::from_secs(2), || {
        server_count(&pg, "trustuser", "app") == 0
    }));
    // The client's statement waits for a new server; a RECONNECT comes during its connect.
    let later = thread::spawn(move || {
        thread::sleep(Duration::from_millis(500));
        reconnect();
    });
    let pid = client.value("SELECT pg_backend_pid()");
    later.join().expect("reconnect");
    assert!(
        pw.log().contains("closing because: obsolete connection"),
        "{}",
        pw.log()
    );
    thread::sleep(Duration::from_millis(300));
    let alive = pg.sql_in(
        "postgres",
        &format!("SELECT count(*) FROM pg_stat_activity WHERE pid = {pid}"),
    );
    assert_eq!(
        alive,
        "1",
        "served by the server begun before the RECONNECT\n{}",
        pw.log()
    );
}

/// WAIT_CLOSE waits for a server whose connect began before the RECONNECT, as for one in use:
/// it returns once that server has come back and been closed.
#[test]
fn wait_close_waits_for_a_server_still_logging_in() {
    let (pg, pw) = slow_logins();
    let port = pw.port;
    let console = move |cmd: &str| console_at(port, cmd);
    let mut client = pw.client_as("trustuser", "slow");
    console("RECONNECT slow");
    assert!(common::eventually(Duration::from_secs(2), || {
        server_count(&pg, "trustuser", "app") == 0
    }));
    // The client's statement waits for a new server; a RECONNECT comes during its connect,
    // then WAIT_CLOSE.
    let closed = |pw: &Pgward| {
        pw.log()
            .matches("closing because: connect string changed")
            .count()
    };
    let before = closed(&pw);
    let waiter = thread::spawn(move || {
        thread::sleep(Duration::from_millis(500));
        console("RECONNECT slow");
        console("WAIT_CLOSE slow");
    });
    let statement = thread::spawn(move || client.value("SELECT 1"));
    waiter.join().expect("WAIT_CLOSE");
    assert_eq!(
        closed(&pw),
        before + 1,
        "WAIT_CLOSE returned before the server begun before the RECONNECT was closed\n{}",
        pw.log()
    );
    assert_eq!(statement.join().expect("the statement"), "1");
}

/// min_pool_size fills the pool of a database's forced user with no client, as PgBouncer does;
/// once a reload forces another user, the pool of the old one is left empty and the new one's
/// is filled.
#[test]
fn min_pool_size_follows_the_forced_user_across_a_reload() {
    let pg = Postgres::start();
    let forced = |user: &str| format!("forced = {} user={user}\n", pg.db_connstr("app"));
    let pw = Pgward::trusting(
        &pg,
        "pool_mode = transaction\ndefault_pool_size = 5\nmin_pool_size = 2\n",
        &forced("trustuser"),
    );
    let servers = |user: &str| server_count(&pg, user, "app");
    let visit = || {
        let mut client = pw.client_as("postgres", "forced");
        client.query("SELECT 1").expect("SELECT 1");
    };
    visit();
    let filled = eventually(Duration::from_secs(4), || servers("trustuser") == 2);
    assert!(
        filled,
        "{} servers of the forced user",
        servers("trustuser")
    );
    let ini = std::fs::read_to_string(&pw.ini_path).expect("ini");
    let ini = ini.replace(&forced("trustuser"), &forced("postgres"));
    std::fs::write(&pw.ini_path, ini).expect("ini");
    pw.reload_and_wait();
    visit();
    let moved = eventually(Duration::from_secs(4), || {
        servers("postgres") == 2 && servers("trustuser") == 0
    });
    assert!(moved, "{} / {}", servers("postgres"), servers("trustuser"));
    thread::sleep(Duration::from_millis(2500));
    assert_eq!(
        servers("trustuser"),
        0,
        "the old forced user's pool was filled"
    );
    assert_eq!(servers("postgres"), 2, "{}", pw.log());
}

/// A login waiting for new parameters after a reload whose new connection string the server
/// refuses (no such database) gets that refusal, after one attempt within
/// server_login_retry, even while a server begun before the reload is still logging in.
#[test]
fn a_login_after_a_refused_reload_tries_once() {
    refused_reload_tries_once("");
}

/// The same with `server_login_retry = 0`: the refusal that comes while the login waits is
/// its answer all the same, as PgBouncer ends the logins waiting for a server's parameters at
/// a login error.
#[test]
fn a_login_after_a_refused_reload_tries_once_without_a_retry_delay() {
    refused_reload_tries_once("server_login_retry = 0\n");
}

fn refused_reload_tries_once(settings: &str) {
    let (pg, pw) = logins_taking_with(Duration::from_millis(1500), settings);
    let mut first = pw.client_as("trustuser", "slow");
    assert_eq!(first.value("SELECT 1"), "1");
    // A second client's statement opens a server through the slow relay (held 1.5 s)...
    let mut second = pw.client_as("trustuser", "slow");
    first.query("BEGIN").expect("BEGIN");
    first.query("SELECT 1").expect("hold the server");
    let held = thread::spawn(move || second.query("SELECT 1").map(|_| ()));
    thread::sleep(Duration::from_millis(300));
    // ...while a reload points the database at one that does not exist.
    let ini = std::fs::read_to_string(&pw.ini_path).expect("ini");
    let slow = ini
        .lines()
        .find(|l| l.starts_with("slow ="))
        .expect("the slow entry")
        .to_string();
    let gone = format!(
        "slow = host={} port={} dbname=nosuchdb",
        common::HOST,
        pg.port
    );
    std::fs::write(&pw.ini_path, ini.replace(&slow, &gone)).expect("ini");
    pw.reload_and_wait();
    let login = Raw::login_within(
        pw.port,
        &[("user", "trustuser"), ("database", "slow")],
        Duration::from_secs(10),
    );
    assert!(
        login.is_err(),
        "a login to a database that is gone succeeded"
    );
    let failures = pw.log().matches("server login failed").count();
    assert!(
        failures <= 2,
        "{failures} server logins tried\n{}",
        pw.log()
    );
    let _ = held.join();
}

/// A reload that changes a database's connection string drops its servers still logging in
/// at once, as PgBouncer does (`connect string changed`): a login waiting for its first
/// server gets one from the new address, not after the old one's login ends.
#[test]
fn a_reload_drops_servers_still_logging_in() {
    let pg = Postgres::start();
    let relay = relay_holding_logins(&pg, Duration::from_secs(30));
    let held = format!("slow = host={} port={relay} dbname=app", common::HOST);
    let pw = Pgward::trusting(&pg, "pool_mode = transaction\n", &format!("{held}\n"));
    let port = pw.port;
    let login = ask_in_thread(port, "slow", "SELECT 'served'", Duration::from_secs(5));
    thread::sleep(Duration::from_millis(500));
    let ini = std::fs::read_to_string(&pw.ini_path).expect("ini");
    let direct = format!("slow = host={} port={} dbname=app", common::HOST, pg.port);
    std::fs::write(&pw.ini_path, ini.replace(&held, &direct)).expect("ini");
    pw.reload_and_wait();
    let served = login.join().expect("the login");
    assert_eq!(served.as_deref(), Ok("served"), "{}", pw.log());
    assert!(
        pw.log().contains("closing because: connect string changed"),
        "{}",
        pw.log()
    );
}

/// A server login refused for good (here the role may no longer log in) while the pool
/// has a working server refuses nobody: the clients waiting, and those that come within
/// server_login_retry, wait for the server it has, as PgBouncer keeps them (it refuses the
/// queue only when the pool has no server left).
#[test]
fn a_failed_login_refuses_no_one_while_the_pool_has_a_server() {
    let pg = Postgres::start();
    let pw = Pgward::trusting(&pg, "pool_mode = transaction\ndefault_pool_size = 4\n", "");
    let mut holder = pw.client_as("trustuser", "app");
    holder.value("BEGIN");
    assert_eq!(holder.value("SELECT 1"), "1");
    pg.sql("ALTER ROLE trustuser NOLOGIN");
    let port = pw.port;
    let first = ask_in_thread(port, "app", "SELECT 'first'", Duration::from_secs(20));
    // Its connect fails; then another client comes within server_login_retry.
    thread::sleep(Duration::from_millis(800));
    let second = ask_in_thread(port, "app", "SELECT 'second'", Duration::from_secs(20));
    thread::sleep(Duration::from_millis(800));
    holder.value("COMMIT");
    let answers = [first, second].map(|t| t.join().expect("a client"));
    assert_eq!(
        answers,
        [Ok("first".to_string()), Ok("second".to_string())],
        "{}",
        pw.log()
    );
    // Within server_login_retry no other login was tried.
    let tried = pw.log().matches("server login failed").count();
    assert_eq!(tried, 1, "{}", pw.log());
    pg.sql("ALTER ROLE trustuser LOGIN");
}

/// After a server login refused for good, a pool under a full max_db_connections makes no
/// room for logins it will not try within server_login_retry: the idle server of another
/// pool of the database stays (PgBouncer tries nothing, and evicts nothing, meanwhile).
#[test]
fn a_refused_login_makes_no_room_under_a_shared_limit() {
    let pg = Postgres::start();
    let dbs = format!("capped = {} max_db_connections=2\n", pg.db_connstr("app"));
    let pw = Pgward::trusting(&pg, "pool_mode = transaction\n", &dbs);
    let mut holder = pw.client_as("trustuser", "capped");
    holder.value("BEGIN");
    assert_eq!(holder.value("SELECT 1"), "1");
    pg.sql("ALTER ROLE trustuser NOLOGIN");
    let port = pw.port;
    let waiter = ask_in_thread(port, "capped", "SELECT 'waited'", Duration::from_secs(20));
    thread::sleep(Duration::from_millis(800));
    // Another pool of the database has an idle server now, the limit reached again.
    let mut other = pw.client_as("postgres", "capped");
    assert_eq!(other.value("SELECT 2"), "2");
    let evicted = || pw.log().matches("evicted").count();
    let before = evicted();
    thread::sleep(Duration::from_millis(2500));
    assert_eq!(evicted(), before, "{}", pw.log());
    holder.value("COMMIT");
    assert_eq!(waiter.join().expect("the waiter").as_deref(), Ok("waited"));
    pg.sql("ALTER ROLE trustuser LOGIN");
}

/// A pool a reload retired (its database removed) has only servers that close as they come
/// back: a server login refused for good then turns its queue away at once, as in a pool
/// with no server, rather than after server_login_retry.
#[test]
fn a_refused_login_turns_away_the_queue_of_a_retired_pool() {
    let pg = Postgres::start();
    let line = format!("gone = {}", pg.db_connstr("app"));
    let pw = Pgward::trusting(&pg, "pool_mode = transaction\n", &format!("{line}\n"));
    let mut holder = pw.client_as("trustuser", "gone");
    holder.value("BEGIN");
    assert_eq!(holder.value("SELECT 1"), "1");
    let mut second = pw.client_as("trustuser", "gone");
    let mut third = pw.client_as("trustuser", "gone");
    let ini = std::fs::read_to_string(&pw.ini_path).expect("ini");
    std::fs::write(&pw.ini_path, ini.replace(&line, "")).expect("ini");
    pw.reload_and_wait();
    pg.sql("ALTER ROLE trustuser NOLOGIN");
    // The second's login is refused; the third asks within server_login_retry, while the
    // holder's server (bound to close) is still busy.
    let started = Instant::now();
    let answers = [
        second.value_within("SELECT 2", Duration::from_secs(12)),
        third.value_within("SELECT 3", Duration::from_secs(12)),
    ];
    pg.sql("ALTER ROLE trustuser LOGIN");
    for answer in answers {
        let err = answer.expect_err("served by a retired pool");
        assert!(err.contains("not permitted to log in"), "{err}");
    }
    assert!(started.elapsed() < Duration::from_secs(5), "{}", pw.log());
}

/// A KILL of a database drops its servers still logging in, logged as PgBouncer logs them
/// (`database removed`), and ends the client waiting for one.
#[test]
fn a_kill_drops_servers_still_logging_in_as_database_removed() {
    let pg = Postgres::start();
    let relay = relay_holding_logins(&pg, Duration::from_secs(30));
    let held = format!("slow = host={} port={relay} dbname=app", common::HOST);
    let pw = Pgward::trusting(
        &pg,
        "pool_mode = transaction\nadmin_users = postgres\n",
        &format!("{held}\n"),
    );
    let port = pw.port;
    let login = log_in_in_thread(port, "slow", Duration::from_secs(10));
    thread::sleep(Duration::from_millis(500));
    console_at(port, "KILL slow");
    let ended = login.join().expect("the login");
    assert!(ended.is_err(), "{}", pw.log());
    let deadline = Instant::now() + Duration::from_secs(5);
    while !pw.log().contains("closing because: database removed") && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(50));
    }
    let log = pw.log();
    assert!(log.contains("closing because: database removed"), "{log}");
    assert!(!log.contains("connect string changed"), "{log}");
}

/// A login waiting for new parameters after a RECONNECT is refused when pgward shuts down
/// (SIGINT), as the clients waiting for a server are, rather than let in.
#[test]
fn a_shutdown_refuses_a_login_waiting_for_new_parameters() {
    let (_pg, pw) = logins_taking(Duration::from_secs(3));
    let _first = pw.client_as("trustuser", "slow");
    console_at(pw.port, "RECONNECT slow");
    let port = pw.port;
    let login = log_in_in_thread(port, "slow", Duration::from_secs(10));
    thread::sleep(Duration::from_millis(500));
    pw.signal(libc::SIGINT);
    let refused = login.join().expect("the login");
    let err = refused.expect_err("a login let in during a shutdown");
    assert!(err.contains("shutting down"), "{err}\n{}", pw.log());
}

/// A PAUSE completes while a login waits for new parameters after a RECONNECT with the server
/// down: paused, the login opens no more servers (PgBouncer opens for such logins only when
/// not paused), so nothing keeps the pause from taking hold.
#[test]
fn a_pause_takes_hold_while_a_login_waits_for_new_parameters() {
    let pg = Postgres::start();
    let pw = Pgward::trusting(&pg, "pool_mode = transaction\nadmin_users = postgres\n", "");
    let port = pw.port;
    let console = move |cmd: &str| console_at(port, cmd);
    let mut first = pw.client_as("trustuser", "app");
    assert_eq!(first.value("SELECT 1"), "1");
    pg.stop();
    console("RECONNECT app");
    let _login = log_in_in_thread(port, "app", Duration::from_secs(20));
    thread::sleep(Duration::from_millis(700));
    let (done, paused) = std::sync::mpsc::channel();
    thread::spawn(move || {
        console("PAUSE app");
        let _ = done.send(());
    });
    assert!(
        paused.recv_timeout(Duration::from_secs(5)).is_ok(),
        "PAUSE did not take hold\n{}",
        pw.log()
    );
}

/// A client the console ends is told why before its connection closes, as PgBouncer tells it
/// (FATAL, in its words), with PostgreSQL's SQLSTATE for a connection its administrator ended
/// (57P01): KILL_CLIENT's `admin forced disconnect`, KILL's `database removed`. A client that
/// reads nothing of a long answer is cut off all the same, and its server let go.
#[test]
fn a_killed_client_is_told_why() {
    let pg = Postgres::start();
    let pw = Pgward::trusting(&pg, "pool_mode = transaction\nadmin_users = postgres\n", "");
    let port = pw.port;
    let told = |raw: &mut common::raw::Raw, words: &str| {
        let err = raw.expect_error_within(Duration::from_secs(5));
        assert_eq!(
            (err.severity(), err.code(), err.message()),
            ("FATAL", "57P01", words),
            "{}",
            pw.log()
        );
        assert!(raw.closes_within(Duration::from_secs(5)), "{}", pw.log());
    };
    let mut killed = pw.client_as("trustuser", "app");
    assert_eq!(killed.value("SELECT 1"), "1");
    let clients = common::psql_at(port, "postgres", None, "pgbouncer", "SHOW CLIENTS");
    let id = stdout_of(&clients)
        .lines()
        .find(|row| row.split('|').nth(1) == Some("trustuser"))
        .and_then(|row| row.rsplit('|').next().map(str::to_string))
        .expect("the client in SHOW CLIENTS");
    console_at(port, &format!("KILL_CLIENT {id}"));
    told(&mut killed, "admin forced disconnect");

    let mut removed = pw.client_as("trustuser", "app");
    assert_eq!(removed.value("SELECT 1"), "1");
    console_at(port, "KILL app");
    told(&mut removed, "database removed");
    console_at(port, "RESUME app");

    // Forty megabytes it never reads: its session waits to write.
    let mut deaf = pw.client_as("trustuser", "app");
    deaf.send(&common::raw::query_message(
        "SELECT repeat('x', 1000000) FROM generate_series(1, 40)",
    ));
    let busy = || {
        pg.sql("SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'SELECT repeat%' AND state = 'active'")
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while busy() != "1" && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(50));
    }
    console_at(port, "KILL app");
    let deadline = Instant::now() + Duration::from_secs(10);
    while busy() != "0" && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(busy(), "0", "the server still sends\n{}", pw.log());
}

/// The statement that brings a server's parameters in line with a client's is read by the
/// server in the client_encoding the last client left it in: in SJIS a byte of a character may
/// be a backslash. A value whose bytes would end the literal there runs no SQL of its own
/// (where `backslash_quote` lets such a backslash through), nor fails the client's session
/// (where it does not, by default).
#[test]
fn a_parameter_value_runs_no_sql_under_a_multibyte_client_encoding() {
    let pg = Postgres::start();
    pg.sql("ALTER DATABASE app SET backslash_quote = on");
    let pw = Pgward::trusting(&pg, "pool_mode = transaction\ndefault_pool_size = 1\n", "");
    let sjis = [
        ("user", "trustuser"),
        ("database", "app"),
        ("client_encoding", "SJIS"),
    ];
    let mut first = pw.client_with(&sjis);
    assert_eq!(first.value("SELECT 1"), "1");
    // U+0441 is D1 81 in UTF-8; in SJIS, D1 is one character and 81 5C another.
    let name = "\u{441}\\'; CREATE TABLE pwned (); --";
    let mut params = sjis.to_vec();
    params.push(("application_name", name));
    let mut second = pw.client_with(&params);
    assert_eq!(second.value("SELECT 1"), "1", "{}", pw.log());
    let made = pg.sql("SELECT count(*) FROM pg_class WHERE relname = 'pwned'");
    assert_eq!(made, "0", "{}", pw.log());
}

/// A value outside ASCII reaches a SQL_ASCII database's server byte for byte, as the client
/// gave it (no conversion to that encoding exists from any other).
#[test]
fn a_parameter_value_outside_ascii_reaches_a_sql_ascii_database() {
    let pg = Postgres::start();
    pg.sql(
        "CREATE DATABASE plain TEMPLATE template0 ENCODING 'SQL_ASCII' \
         LC_COLLATE 'C' LC_CTYPE 'C'",
    );
    let plain = format!("plain = {}\n", pg.db_connstr("plain"));
    let pw = Pgward::trusting(
        &pg,
        "pool_mode = transaction\ndefault_pool_size = 1\n",
        &plain,
    );
    let first = [("user", "trustuser"), ("database", "plain")];
    let mut client = pw.client_with(&first);
    assert_eq!(client.value("SELECT 1"), "1");
    let named = [
        ("user", "trustuser"),
        ("database", "plain"),
        ("application_name", "café"),
    ];
    let mut second = pw.client_with(&named);
    assert_eq!(second.value("SELECT 2"), "2", "{}", pw.log());
}
