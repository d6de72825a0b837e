//! Cancel requests with pgward's own keys (also one cut short by client_login_timeout), and
//! faults: a client that dies mid-transaction, a server backend terminated under a query, a
//! PostgreSQL restart, a server whose message breaks the protocol.

mod common;

use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use common::driver::{cancel_a_sleep, code, must_connect, must_value, value};
use common::raw::{self, describe, first_error, Raw};
use common::relay::{slow_relay, Slowness};
use common::script::{Script, ScriptedAuth, ScriptedServer};
use common::{eventually, server_count, stderr_of, Pgward, Postgres, HOST, SECOND};

fn login(pw: &Pgward) -> (Raw, (u32, Vec<u8>)) {
    login_to(pw, "app")
}

/// A client of `db` as trustuser, and its cancel key.
fn login_to(pw: &Pgward, db: &str) -> (Raw, (u32, Vec<u8>)) {
    let mut client = Raw::connect(pw.port);
    let login = client
        .startup(&[("user", "trustuser"), ("database", db)])
        .unwrap_or_else(|err| panic!("login refused: {err:?}"));
    let key = login.key.unwrap_or_else(|| panic!("no BackendKeyData"));
    (client, key)
}

#[test]
fn clients_get_pgward_keys_and_a_cancel_hits_only_the_running_statement() {
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(&pg, "default_pool_size = 2\n");
    let (mut a, key_a) = login(&pw);
    let (mut b, key_b) = login(&pw);
    assert_ne!(key_a, key_b);
    let pid_a: u32 = a.value("SELECT pg_backend_pid()").parse().expect("pid");
    assert_ne!(key_a.0, pid_a, "the client got the server's key");
    let backends = pg.sql_in(
        "postgres",
        "SELECT string_agg(pid::text, ',') FROM pg_stat_activity",
    );
    assert!(
        !backends.split(',').any(|p| p == key_a.0.to_string()),
        "the key is a PostgreSQL pid"
    );

    // Unknown keys and wrong secrets are ignored.
    a.send(&raw::query_message("SELECT pg_sleep(1)"));
    thread::sleep(Duration::from_millis(200));
    raw::send_cancel(pw.port, key_a.0 ^ 1, &key_a.1);
    let mut wrong = key_a.1.clone();
    wrong[0] ^= 0xff;
    raw::send_cancel(pw.port, key_a.0, &wrong);
    raw::send_cancel(pw.port, pid_a, &key_a.1);
    assert!(
        a.read_result(Duration::from_secs(5)).is_ok(),
        "a bad key cancelled"
    );

    // A's cancel reaches A's statement and not B's, which runs at the same time.
    a.send(&raw::query_message("SELECT pg_sleep(10)"));
    b.send(&raw::query_message("SELECT pg_sleep(1.5)"));
    thread::sleep(Duration::from_millis(300));
    let since = Instant::now();
    raw::send_cancel(pw.port, key_a.0, &key_a.1);
    let err = a
        .read_result(Duration::from_secs(5))
        .expect_err("the statement was not cancelled");
    assert_eq!(err.code(), "57014", "{err:?}");
    assert!(since.elapsed() < Duration::from_secs(2));
    assert!(
        b.read_result(Duration::from_secs(5)).is_ok(),
        "B was cancelled"
    );

    // A cancel sent while A is idle does not reach A's next statement.
    raw::send_cancel(pw.port, key_a.0, &key_a.1);
    assert_eq!(a.value("SELECT pg_sleep(0.5)::text || 'done'"), "done");
    // Nor B's statement on the server A just used.
    assert_eq!(b.value("SELECT 'b ok'"), "b ok");
    a.terminate();
    b.terminate();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn driver_cancel_token_cancels_pg_sleep() {
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(&pg, "default_pool_size = 1\n");
    let conn = must_connect(&pw.connstr("trustuser", None, "app")).await;
    let client = cancel_a_sleep(conn).await;
    assert_eq!(must_value(&client, "SELECT 'after'").await, "after");
}

#[test]
fn cancel_cut_short_by_client_login_timeout_still_ends() {
    let pg = Postgres::start();
    let slowness = Slowness {
        cancel_hold: 2 * SECOND,
        cancel_delay: Duration::ZERO,
        first_packet_delay: Duration::ZERO,
        pace: None,
    };
    let relay = slow_relay(pg.port, slowness);
    let dbs = format!("slow = host={HOST} port={relay} dbname=app\n");
    let pw = Pgward::trusting(
        &pg,
        "pool_mode = transaction\nclient_login_timeout = 1\n",
        &dbs,
    );
    let mut client = Raw::connect(pw.port);
    let key = client
        .startup(&[("user", "trustuser"), ("database", "slow")])
        .unwrap_or_else(|err| panic!("login: {err:?}"))
        .key
        .unwrap_or_else(|| panic!("no BackendKeyData"));
    client.send(&raw::query_message("SELECT pg_sleep(5)"));
    thread::sleep(Duration::from_millis(300));
    // The cancel connection outlives client_login_timeout: pgward drops it at one second
    // while the relay still holds the server side open.
    let since = Instant::now();
    let mut canceller = Raw::connect(pw.port);
    canceller.send(&raw::cancel_request(key.0, &key.1));
    let answer = client
        .until_ready_within(5 * SECOND)
        .unwrap_or_else(|err| panic!("the cancelled client never got its answer: {err}"));
    let fields = first_error(&answer).unwrap_or_else(|| panic!("{}", describe(&answer)));
    assert_eq!(fields.code(), "57014", "{fields:?}");
    assert!(since.elapsed() < 4 * SECOND, "{:?}", since.elapsed());
    assert!(canceller.closes_within(2 * SECOND));
    assert_eq!(
        client.value_within("SELECT 'after'", 3 * SECOND),
        Ok("after".to_string())
    );
}

/// A cancel passed to the server's postmaster but not known to have landed when
/// cancel_wait_timeout ends may still land later: the server it was meant for is closed
/// rather than given to another client, whose statement it would cancel.
#[test]
fn a_cancel_not_known_to_have_landed_keeps_its_server_from_other_clients() {
    let pg = Postgres::start();
    let slowness = Slowness {
        cancel_hold: Duration::ZERO,
        cancel_delay: 3 * SECOND,
        first_packet_delay: Duration::ZERO,
        pace: None,
    };
    let relay = slow_relay(pg.port, slowness);
    let dbs = format!("slow = host={HOST} port={relay} dbname=app pool_size=1\n");
    let pw = Pgward::trusting(
        &pg,
        "pool_mode = transaction\ncancel_wait_timeout = 1\n",
        &dbs,
    );
    let slow = [("user", "trustuser"), ("database", "slow")];
    let mut first = Raw::connect(pw.port);
    let key = first
        .startup(&slow)
        .unwrap_or_else(|err| panic!("login: {err:?}"))
        .key
        .unwrap_or_else(|| panic!("no BackendKeyData"));
    first.send(&raw::query_message("SELECT pg_sleep(1)"));
    thread::sleep(Duration::from_millis(200));
    raw::send_cancel(pw.port, key.0, &key.1);
    // The sleep ends before the cancel reaches PostgreSQL.
    assert!(first.read_result(5 * SECOND).is_ok());
    let mut second = Raw::connect(pw.port);
    second
        .startup(&slow)
        .unwrap_or_else(|err| panic!("login: {err:?}"));
    // Runs while the first client's cancel is passed on (3 s after it was sent).
    assert_eq!(
        second.value_within("SELECT pg_sleep(4)::text || 'done'", 10 * SECOND),
        Ok("done".to_string())
    );
}

#[test]
fn client_dying_mid_transaction_leaves_no_dirty_server() {
    let pg = Postgres::start();
    pg.sql("CREATE TABLE locked (id int); GRANT ALL ON locked TO PUBLIC");
    let pw = Pgward::transaction_pool(&pg, "default_pool_size = 1\nquery_wait_timeout = 5\n");

    // Idle in a transaction holding a lock and temp state, then the socket just closes.
    let (mut a, _) = login(&pw);
    let pid_a = a.value("SELECT pg_backend_pid()");
    a.value("BEGIN");
    a.value("LOCK TABLE locked IN ACCESS EXCLUSIVE MODE");
    a.value("CREATE TEMP TABLE scratch (id int)");
    a.value("SET LOCAL work_mem = '9MB'");
    drop(a);

    let (mut b, _) = login(&pw);
    let since = Instant::now();
    assert_eq!(
        b.value("SELECT now() = statement_timestamp()"),
        "t",
        "B inherited A's transaction"
    );
    assert!(
        since.elapsed() < Duration::from_secs(2),
        "B waited {:?}",
        since.elapsed()
    );
    assert_ne!(
        b.value("SELECT pg_backend_pid()"),
        pid_a,
        "A's server was reused"
    );
    assert_eq!(b.value("SHOW work_mem"), "4MB");
    assert_eq!(
        b.value("SELECT to_regclass('pg_temp.scratch') IS NULL"),
        "t"
    );
    // A's backend releases its lock when it has seen its connection close, which takes a
    // moment on a loaded machine: wait for it a little, never for a transaction left open.
    b.value("SET lock_timeout = '3s'");
    b.value("BEGIN");
    b.value("LOCK TABLE locked IN ACCESS EXCLUSIVE MODE");
    b.value("ROLLBACK");
    let gone = eventually(Duration::from_secs(3), || {
        pg.sql_in(
            "postgres",
            &format!("SELECT count(*) FROM pg_stat_activity WHERE pid = {pid_a}"),
        ) == "0"
    });
    assert!(gone, "A's server is still open");

    // A psql killed while its transaction runs a long statement.
    let port = pw.port.to_string();
    let mut psql = Command::new("psql")
        .env("PGCONNECT_TIMEOUT", "5")
        .args([
            "-X",
            "-w",
            "-h",
            common::HOST,
            "-p",
            &port,
            "-U",
            "trustuser",
            "-d",
            "app",
        ])
        .args(["-c", "BEGIN; LOCK TABLE locked; SELECT pg_sleep(30);"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("psql");
    let running = eventually(Duration::from_secs(5), || {
        pg.sql_in(
            "postgres",
            "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%pg_sleep(30)%' \
             AND pid <> pg_backend_pid()",
        ) == "1"
    });
    let _ = psql.kill();
    let _ = psql.wait();
    assert!(running, "psql never ran its statement");
    let since = Instant::now();
    assert_eq!(b.value("SELECT 'next'"), "next");
    assert!(
        since.elapsed() < Duration::from_secs(3),
        "the next client waited {:?} for the dead client's server",
        since.elapsed()
    );
    assert_eq!(b.value("SELECT now() = statement_timestamp()"), "t");
    b.terminate();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn terminated_backend_gives_an_error_and_is_replaced() {
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(&pg, "default_pool_size = 1\n");
    let connstr = pw.connstr("trustuser", None, "app");
    let conn = must_connect(&connstr).await;
    let pid = must_value(&conn.client, "SELECT pg_backend_pid()").await;
    let client = conn.client;
    let victim = tokio::spawn(async move { client.simple_query("SELECT pg_sleep(10)").await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    pg.sql_in("postgres", &format!("SELECT pg_terminate_backend({pid})"));
    let result = tokio::time::timeout(Duration::from_secs(3), victim)
        .await
        .expect("the client got no answer")
        .expect("task");
    let err = result.expect_err("the query survived its backend");
    let state = code(&err);
    assert!(
        ["57P01", "08006", "08003"].contains(&state.as_str()),
        "unexpected SQLSTATE {state}: {err:?}"
    );
    // The pool replaces the server: new clients work at once.
    let next = must_connect(&connstr).await;
    let new_pid = must_value(&next.client, "SELECT pg_backend_pid()").await;
    assert_ne!(new_pid, pid);

    // An idle server terminated between transactions is noticed before it is handed out.
    pg.sql_in(
        "postgres",
        &format!("SELECT pg_terminate_backend({new_pid})"),
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    let after = value(&next.client, "SELECT pg_backend_pid()").await;
    let after = after.unwrap_or_else(|err| panic!("a dead idle server was handed out: {err:?}"));
    assert_ne!(after, new_pid);
    assert_eq!(server_count(&pg, "trustuser", "app"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgresql_restart_is_survived() {
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(&pg, "default_pool_size = 2\nquery_wait_timeout = 5\n");
    let connstr = pw.connstr("trustuser", None, "app");
    let old = must_connect(&connstr).await;
    must_value(&old.client, "SELECT 1").await;
    pg.restart();

    // A client connected before the restart, and new clients, work again within seconds.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut errors = Vec::new();
    loop {
        match value(&old.client, "SELECT 'old client'").await {
            Ok(v) => {
                assert_eq!(v, "old client");
                break;
            }
            Err(err) => errors.push(code(&err)),
        }
        assert!(Instant::now() < deadline, "old client: {errors:?}");
        if old.client.is_closed() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut worked = false;
    while Instant::now() < deadline && !worked {
        let out = pw.psql("trustuser", None, "app", "SELECT 1");
        worked = out.status.success();
        if !worked {
            errors.push(stderr_of(&out));
            thread::sleep(Duration::from_millis(200));
        }
    }
    assert!(
        worked,
        "no query worked 5 s after the restart: {errors:?}\n{}",
        pw.log()
    );
    let fresh = must_connect(&connstr).await;
    assert_eq!(must_value(&fresh.client, "SELECT 2").await, "2");
}

#[test]
fn postgresql_down_gives_an_error_then_service_resumes() {
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(&pg, "query_wait_timeout = 2\n");
    let ok = pw.psql("trustuser", None, "app", "SELECT 1");
    assert!(ok.status.success(), "{}", stderr_of(&ok));
    pg.stop();
    let since = Instant::now();
    let down = pw.psql("trustuser", None, "app", "SELECT 1");
    assert!(!down.status.success());
    assert!(
        since.elapsed() < Duration::from_secs(5),
        "{:?}",
        since.elapsed()
    );
    pg.start_server();
    let back = eventually(Duration::from_secs(5), || {
        pw.psql("trustuser", None, "app", "SELECT 1")
            .status
            .success()
    });
    assert!(back, "{}", pw.log());
}

/// A message whose length field (2) is shorter than the length field itself.
const SHORT_LENGTH_ANSWER: &[u8] = &[b'D', 0, 0, 0, 2, 0, 0, 0, 0];

#[test]
fn server_message_length_below_four_is_a_protocol_violation() {
    let server = ScriptedServer::start(Script::Answer {
        auth: ScriptedAuth::Trust,
        answer: SHORT_LENGTH_ANSWER,
    });
    let ini = format!(
        "[databases]\nscripted = host={HOST} port={} dbname=app\n\n\
         [pgbouncer]\nauth_type = trust\npool_mode = transaction\n",
        server.port
    );
    let pw = Pgward::start(&ini);
    let mut client = pw.client_as("trustuser", "scripted");
    client.send(&raw::query_message("SELECT 'short length'"));
    let answer = client
        .until_tag_within(b'E', 3 * SECOND)
        .unwrap_or_else(|err| panic!("a message of length 2 from the server: {err}"));
    let fields = first_error(&answer).unwrap_or_default();
    assert_eq!(fields.code(), "08P01", "{fields:?}");
    assert!(client.closes_within(2 * SECOND));
}

#[test]
fn a_cancel_sent_to_a_peer_is_forwarded_to_the_instance_that_owns_the_key() {
    let pg = Postgres::start();
    let start =
        |id: u16| Pgward::transaction_pool(&pg, &format!("peer_id = {id}\nadmin_users = admin\n"));
    let (a, b) = (start(1), start(2));
    // Each lists the other in [peers] (ports are known only once both listen).
    for (me, other, other_id) in [(&a, &b, 2), (&b, &a, 1)] {
        let ini = std::fs::read_to_string(&me.ini_path).expect("ini");
        let peers = format!("\n[peers]\n{other_id} = host={HOST} port={}\n", other.port);
        std::fs::write(&me.ini_path, format!("{ini}{peers}")).expect("ini");
        me.reload_and_wait();
    }
    let (mut client, (pid, secret)) = login(&a);
    let [_, low, high, _] = pid.to_be_bytes();
    assert_eq!(
        u16::from_le_bytes([low, high]),
        1,
        "the key names its instance"
    );
    client.send(&raw::query_message("SELECT pg_sleep(10)"));
    thread::sleep(Duration::from_millis(300));
    // Sent to B, which does not know the key: B forwards it to A.
    raw::send_cancel(b.port, pid, &secret);
    let err = client
        .read_result(Duration::from_secs(5))
        .expect_err("the statement was not cancelled");
    assert_eq!(err.code(), "57014", "{err:?}\n{}", b.log());
    // A key whose forwarding budget is spent is dropped, not bounced between peers.
    client.send(&raw::query_message("SELECT pg_sleep(1)"));
    thread::sleep(Duration::from_millis(200));
    let mut spent = secret.clone();
    spent[3] &= !0x03;
    raw::send_cancel(b.port, pid, &spent);
    assert!(
        client.read_result(Duration::from_secs(5)).is_ok(),
        "a spent key cancelled"
    );
    client.terminate();
}

/// pgward in transaction pooling under [`common::gate::ROOMY_POLICY`], its database `slow`
/// reached through a relay at port `relay`; the policy's folder lives as long as it is kept.
fn roomy_pgward(pg: &Postgres, relay: u16) -> (Pgward, tempfile::TempDir) {
    let dir = common::shared_tempdir("pgward-policy-");
    let policy = dir.path().join("policy.toml");
    std::fs::write(&policy, common::gate::ROOMY_POLICY).expect("write the policy");
    let settings = format!(
        "pool_mode = transaction\npolicy_file = {}\n",
        policy.display()
    );
    let dbs = format!("slow = host={HOST} port={relay} dbname=app\n");
    (Pgward::trusting(pg, &settings, &dbs), dir)
}

/// What one of pgward's own statements is made into: no row, like SAVEPOINT and RELEASE, and
/// long enough for a cancel to land on it.
const SLOW_OWN: &str = "DO $$BEGIN PERFORM pg_sleep(30); END$$";

/// Whether one session of `pg` runs `sql` (what the relay made of one of pgward's own
/// statements) now.
fn runs(pg: &Postgres, sql: &str) -> bool {
    let query = format!(
        "SELECT count(*) FROM pg_stat_activity \
         WHERE starts_with(query, '{sql}') AND state = 'active'"
    );
    pg.sql_in("postgres", &query) == "1"
}

/// A client in a transaction block sends a statement the gate prices; the first of pgward's
/// own statements named `prefix...` is made slow by a relay, and the client's cancel lands on
/// it. The answer is the statement's 57014 with the transaction failed, as PostgreSQL gives a
/// cancelled statement, and the session goes on.
fn cancel_landing_on_own_statement(prefix: &'static str) {
    let pg = Postgres::start();
    pg.sql(common::gate::SCHEMA);
    let relay = common::relay::rewriting_relay(pg.port, prefix, SLOW_OWN);
    let (pw, _dir) = roomy_pgward(&pg, relay);
    let (mut client, key) = login_to(&pw, "slow");
    client.query("BEGIN").expect("BEGIN");
    client.send(&raw::query_message(common::gate::FULL_READ));
    let running = eventually(5 * SECOND, || runs(&pg, SLOW_OWN));
    assert!(running, "pgward's {prefix} never ran\n{}", pw.log());
    raw::send_cancel(pw.port, key.0, &key.1);
    answered_with_the_cancel(&mut client, &pw, 5 * SECOND);
}

/// The statement the client sent is answered within `wait` with the cancel (57014), its
/// transaction left failed (25P02 next), and the session goes on after a ROLLBACK.
fn answered_with_the_cancel(client: &mut Raw, pw: &Pgward, wait: Duration) {
    let answer = client
        .until_ready_within(wait)
        .unwrap_or_else(|e| panic!("no answer: {e}\n{}", pw.log()));
    let fields = first_error(&answer).unwrap_or_else(|| panic!("ran: {}", describe(&answer)));
    assert_eq!(fields.code(), "57014", "{fields:?}");
    let ready = answer
        .iter()
        .rev()
        .find(|m| m.tag == b'Z')
        .expect("ReadyForQuery");
    assert_eq!(ready.body, b"E", "{}", describe(&answer));
    let err = client
        .query("SELECT 1")
        .expect_err("the transaction is not failed");
    assert_eq!(err.code(), "25P02", "{err:?}");
    client.query("ROLLBACK").expect("ROLLBACK");
    assert_eq!(client.value("SELECT 'after'"), "after");
}

#[test]
fn a_cancel_landing_on_pgwards_savepoint_cancels_the_statement() {
    cancel_landing_on_own_statement("pgward_savepoint_");
}

#[test]
fn a_cancel_landing_on_pgwards_release_cancels_the_statement() {
    cancel_landing_on_own_statement("pgward_release_");
}

/// A cancel asked for while pgward's EXPLAIN of the statement waits, that reaches PostgreSQL
/// only after the EXPLAIN ended (a postmaster slow to take it): the statement is answered with
/// 57014, as PostgreSQL answers a statement cancelled while it runs, instead of running to its
/// end once the cancel has landed on the idle server.
#[test]
fn a_cancel_asked_for_while_the_statement_is_priced_is_its_answer() {
    let pg = Postgres::start();
    pg.sql(common::gate::SCHEMA);
    pg.sql("GRANT ALL ON big TO PUBLIC");
    let slowness = Slowness {
        cancel_hold: Duration::ZERO,
        cancel_delay: SECOND,
        first_packet_delay: Duration::ZERO,
        pace: None,
    };
    let relay = slow_relay(pg.port, slowness);
    let (pw, _dir) = roomy_pgward(&pg, relay);
    let mut locker = pg.client();
    locker.value("BEGIN");
    locker
        .query("LOCK TABLE big IN ACCESS EXCLUSIVE MODE")
        .expect("lock");
    let (mut client, key) = login_to(&pw, "slow");
    client.send(&raw::query_message("SELECT pg_sleep(3) FROM big LIMIT 1"));
    let waiting = eventually(5 * SECOND, || {
        pg.sql_in(
            "postgres",
            "SELECT count(*) FROM pg_stat_activity \
             WHERE wait_event_type = 'Lock' AND query ILIKE 'EXPLAIN%'",
        ) == "1"
    });
    assert!(
        waiting,
        "pgward's EXPLAIN never waited for the lock\n{}",
        pw.log()
    );
    let port = pw.port;
    let canceller = thread::spawn(move || raw::send_cancel(port, key.0, &key.1));
    thread::sleep(Duration::from_millis(200));
    // The EXPLAIN goes on and ends before the cancel reaches PostgreSQL.
    locker.query("ROLLBACK").expect("unlock");
    let answer = client
        .until_ready_within(10 * SECOND)
        .unwrap_or_else(|e| panic!("no answer: {e}\n{}", pw.log()));
    canceller.join().expect("cancel");
    let fields = first_error(&answer).unwrap_or_else(|| panic!("{}", describe(&answer)));
    assert_eq!(fields.code(), "57014", "{fields:?}");
    assert_eq!(client.value("SELECT 'after'"), "after");
}

/// What pgward's EXPLAIN is made into for a late cancel to find: no row, a while long.
const LONG_OWN: &str = "DO $$BEGIN PERFORM pg_sleep(4); END$$";

/// A client in a transaction block whose batch ran a statement with no known price unpriced:
/// it has its answers, and pgward now prices that statement after the fact, under its
/// SAVEPOINT, with an EXPLAIN a relay made slow (4 s). Returns once that EXPLAIN runs.
fn pricing_after_the_batch() -> (Postgres, Pgward, tempfile::TempDir, Raw, (u32, Vec<u8>)) {
    // The second EXPLAIN: the first prices the batch's first statement before it runs.
    pricing_after_the_batch_slowed(("pgward_explain_", 1..2))
}

/// [`pricing_after_the_batch`], the relay slowing pgward's own statements `slowed` (a prefix
/// of their name, and which of those Parses, from 0) instead.
fn pricing_after_the_batch_slowed(
    slowed: (&'static str, std::ops::Range<usize>),
) -> (Postgres, Pgward, tempfile::TempDir, Raw, (u32, Vec<u8>)) {
    let pg = Postgres::start();
    pg.sql(common::gate::SCHEMA);
    let name = slowed.0;
    let relay = common::relay::rewriting_relay_over(pg.port, slowed, LONG_OWN);
    let (pw, dir) = roomy_pgward(&pg, relay);
    let (mut client, key) = login_to(&pw, "slow");
    client.query("BEGIN").expect("BEGIN");
    // All unpriced: the first is priced before it runs, the others run behind it in the
    // batch and are priced after, in their order.
    let batch = [
        raw::parse_message("", "SELECT count(*) FROM small"),
        raw::bind_message(""),
        raw::execute_message(),
        raw::parse_message("", common::gate::FULL_READ),
        raw::bind_message(""),
        raw::execute_message(),
        raw::parse_message("", "SELECT count(*) FROM small WHERE id > 0"),
        raw::bind_message(""),
        raw::execute_message(),
        raw::sync_message(),
    ]
    .concat();
    let answer = client.exchange_within(&batch, 10 * SECOND, "the batch");
    assert!(first_error(&answer).is_none(), "{}", describe(&answer));
    let explaining = eventually(5 * SECOND, || runs(&pg, LONG_OWN));
    assert!(
        explaining,
        "pgward's {name} never ran after the batch was answered\n{}",
        pw.log()
    );
    (pg, pw, dir, client, key)
}

/// A cancel the client sends while pgward prices its batch after the fact, having sent
/// nothing since its answers (a late cancel), is nobody's answer: the transaction goes on, as
/// with PostgreSQL, where such a cancel finds the backend idle.
#[test]
fn a_late_cancel_while_pgward_prices_a_batch_after_it_ran_fails_nothing() {
    let (_pg, pw, _dir, mut client, key) = pricing_after_the_batch();
    raw::send_cancel(pw.port, key.0, &key.1);
    thread::sleep(Duration::from_millis(500));
    let after = client.value_within("SELECT 'still open'", 10 * SECOND);
    assert_eq!(after.as_deref(), Ok("still open"), "{}", pw.log());
    client.query("COMMIT").expect("COMMIT");
    assert_eq!(client.value("SELECT 'after'"), "after");
}

/// The client's next statement, sent while pgward prices its batch after the fact, and then
/// cancelled: its answer is the cancel (57014, the transaction failed), as PostgreSQL gives
/// a statement cancelled while it runs, not a full run.
#[test]
fn a_statement_cancelled_while_pgward_prices_the_batch_before_it_gets_the_cancel() {
    let (_pg, pw, _dir, mut client, key) = pricing_after_the_batch();
    client.send(&raw::query_message("SELECT pg_sleep(8)"));
    thread::sleep(Duration::from_millis(300));
    raw::send_cancel(pw.port, key.0, &key.1);
    answered_with_the_cancel(&mut client, &pw, 20 * SECOND);
}

/// A late cancel during pricing after the fact, with only a Sync sent before it (no request):
/// the Sync's ReadyForQuery ends the matter, and a statement sent later runs.
#[test]
fn a_late_cancel_behind_a_lone_sync_cancels_nothing_later() {
    let (_pg, pw, _dir, mut client, key) = pricing_after_the_batch();
    client.send(&raw::sync_message());
    thread::sleep(Duration::from_millis(300));
    raw::send_cancel(pw.port, key.0, &key.1);
    let ready = client
        .until_ready_within(10 * SECOND)
        .unwrap_or_else(|e| panic!("no answer to the Sync: {e}\n{}", pw.log()));
    assert!(first_error(&ready).is_none(), "{}", describe(&ready));
    thread::sleep(Duration::from_millis(500));
    let later = client.value_within("SELECT 'later'", 10 * SECOND);
    assert_eq!(later.as_deref(), Ok("later"), "{}", pw.log());
}

/// A late cancel that takes pgward's SAVEPOINT while it prices after the fact fails the
/// transaction; the client's ROLLBACK still ends it (only a statement gets the cancel).
#[test]
fn a_rollback_after_a_cancel_that_took_pgwards_savepoint_ends_the_transaction() {
    let (_pg, pw, _dir, mut client, key) =
        pricing_after_the_batch_slowed(("pgward_savepoint_", 1..2));
    raw::send_cancel(pw.port, key.0, &key.1);
    thread::sleep(Duration::from_millis(500));
    client
        .query("ROLLBACK")
        .unwrap_or_else(|e| panic!("ROLLBACK: {e:?}\n{}", pw.log()));
    assert_eq!(client.value("SELECT 'after'"), "after");
}

/// A statement cancelled while pgward prices, after the fact, several statements of a batch
/// gets its cancel once the pricing the cancel stopped has ended: pgward prices no more of
/// them (each would make it wait again, each as slow here as the first).
#[test]
fn a_cancel_during_pricing_after_the_fact_stops_the_rest_of_it() {
    let (_pg, pw, _dir, mut client, key) =
        pricing_after_the_batch_slowed(("pgward_explain_", 1..3));
    client.send(&raw::query_message("SELECT 'x'"));
    thread::sleep(Duration::from_millis(300));
    raw::send_cancel(pw.port, key.0, &key.1);
    answered_with_the_cancel(&mut client, &pw, 3 * SECOND);
}
