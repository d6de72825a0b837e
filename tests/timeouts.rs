//! Every timeout: the client ones close the client with a FATAL carrying their SQLSTATE at the
//! right time, counting from the right moment (a transaction's BEGIN, the last answer) and
//! leaving the server clean for the next client; the server ones bound logins and their
//! retries, min_pool_size's included.

mod common;

use std::thread;
use std::time::{Duration, Instant};

use common::raw::{self, new_client_value, Fields, Raw};
use common::script::{Script, ScriptedServer};
use common::{eventually, server_count, stderr_of, Pgward, Postgres, SECOND};

/// Asserts a FATAL with `code` and `message` that came between one second (every timeout here
/// is one second) and `max` after `since`, and that the connection is then closed.
fn assert_fatal(
    client: &mut Raw,
    fields: &Fields,
    (code, message): (&str, &str),
    since: Instant,
    max: Duration,
) {
    let min = Duration::from_millis(900);
    let took = since.elapsed();
    assert_eq!(fields.code(), code, "{fields:?}");
    assert_eq!(fields.severity(), "FATAL", "{fields:?}");
    assert_eq!(fields.message(), message, "{fields:?}");
    assert!(
        took >= min && took <= max,
        "{message} after {took:?}, expected {min:?}..{max:?}"
    );
    assert!(
        client.closes_within(Duration::from_secs(3)),
        "still open after {message}"
    );
}

/// Runs `SELECT 1` `times` times, `gap` apart (activity that must not trip the timeout), then
/// waits for the FATAL `expected` within two seconds of the last answer.
fn active_then_idle(client: &mut Raw, gap: Duration, times: usize, expected: (&str, &str)) {
    for _ in 0..times {
        thread::sleep(gap);
        client.value("SELECT 1");
    }
    let since = Instant::now();
    let fields = client.expect_error_within(3 * SECOND);
    assert_fatal(client, &fields, expected, since, 2 * SECOND);
}

#[test]
fn query_timeout_cancels_a_long_query_with_57014() {
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(&pg, "query_timeout = 1\n");
    let mut client = pw.client();
    assert_eq!(client.value("SELECT pg_sleep(0.3)"), "");
    let since = Instant::now();
    client.send(&raw::query_message("SELECT pg_sleep(5)"));
    let fields = client.expect_error_within(4 * SECOND);
    assert_fatal(
        &mut client,
        &fields,
        ("57014", "query timeout"),
        since,
        Duration::from_millis(2500),
    );
    // Other clients are served meanwhile.
    let mut next = pw.client();
    assert_eq!(next.value("SELECT 1"), "1");
}

#[test]
fn query_timeout_cancels_the_query_before_closing_the_server() {
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(&pg, "query_timeout = 1\n");
    let mut client = pw.client();
    client.send(&raw::query_message(
        "SELECT pg_sleep(8) AS query_timeout_sleeper",
    ));
    let fields = client.expect_error_within(3 * SECOND);
    assert_eq!(fields.code(), "57014", "{fields:?}");
    let running = || {
        pg.sql_in(
            "postgres",
            "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' \
             AND query LIKE '%query_timeout_sleeper%' AND pid <> pg_backend_pid()",
        )
    };
    assert!(
        eventually(2 * SECOND, || running() == "0"),
        "the timed-out query still runs on PostgreSQL"
    );
}

#[test]
fn query_wait_timeout_refuses_a_client_that_waited_too_long() {
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(&pg, "default_pool_size = 1\nquery_wait_timeout = 1\n");
    let mut busy = pw.client();
    let mut waiting = pw.client();
    // The server is opened first: on a loaded machine its login alone could outlast the
    // one-second wait this test gives the other client.
    assert_eq!(busy.value("SELECT 1"), "1");
    busy.send(&raw::query_message("SELECT pg_sleep(3)"));
    thread::sleep(Duration::from_millis(200));
    let since = Instant::now();
    waiting.send(&raw::query_message("SELECT 1"));
    let fields = waiting.expect_error_within(4 * SECOND);
    assert_fatal(
        &mut waiting,
        &fields,
        ("57014", "query_wait_timeout"),
        since,
        Duration::from_millis(2500),
    );
    assert!(
        busy.read_result(5 * SECOND).is_ok(),
        "the busy client failed"
    );
}

#[test]
fn idle_transaction_timeout_closes_with_25p03_and_the_server() {
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(&pg, "idle_transaction_timeout = 1\n");
    let mut client = pw.client();
    client.value("BEGIN");
    // Activity inside the transaction restarts the idle clock.
    let expected = ("25P03", "idle transaction timeout");
    active_then_idle(&mut client, Duration::from_millis(500), 3, expected);
    let gone = eventually(3 * SECOND, || {
        pg.sql_in(
            "postgres",
            "SELECT count(*) FROM pg_stat_activity WHERE usename = 'trustuser' \
             AND state LIKE 'idle in transaction%'",
        ) == "0"
    });
    assert!(gone, "the server stayed idle in transaction");
}

/// Runs `sql` in a batch ended by a Flush (no Sync) and reads its answers, which must hold no
/// error.
fn run_flushed(client: &mut Raw, sql: &str) {
    let batch = raw::Batch::new()
        .parse("", sql, &[])
        .bind("", "", &[])
        .execute("", 0)
        .flush();
    client.send(&batch.bytes);
    let answered = client
        .until_tag_within(b'C', 5 * SECOND)
        .unwrap_or_else(|e| panic!("the statement's answers: {e}"));
    assert!(
        raw::first_error(&answered).is_none(),
        "{}",
        raw::describe(&answered)
    );
}

/// Inside a transaction, a statement answered without a Sync (its batch ended by a Flush)
/// ran all along: the idle time counts from its last answer, not from the ReadyForQuery
/// before it.
#[test]
fn idle_transaction_timeout_counts_from_the_last_answer_of_a_flushed_batch() {
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(&pg, "idle_transaction_timeout = 1\n");
    let mut client = pw.client();
    client.value("BEGIN");
    run_flushed(&mut client, "SELECT pg_sleep(1.5)");
    thread::sleep(Duration::from_millis(300));
    let ended = client.exchange_within(&raw::Batch::new().sync().bytes, 5 * SECOND, "Sync");
    assert!(
        raw::first_error(&ended).is_none(),
        "{}",
        raw::describe(&ended)
    );
    assert_eq!(client.value("SELECT 'still in'"), "still in");
    client.value("COMMIT");
}

/// A batch answered but left open (a Flush, no Sync) holds the server and its implicit
/// transaction: the client idling in it is closed as in an idle transaction block.
#[test]
fn idle_transaction_timeout_closes_a_batch_left_open() {
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(&pg, "idle_transaction_timeout = 1\n");
    let mut client = pw.client();
    run_flushed(&mut client, "SELECT 1");
    let err = client.expect_error_within(5 * SECOND);
    assert_eq!(
        (err.code(), err.message()),
        ("25P03", "idle transaction timeout")
    );
    assert!(client.closes_within(2 * SECOND));
}

#[test]
fn transaction_timeout_closes_a_busy_transaction_with_25p04() {
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(&pg, "transaction_timeout = 1\n");
    let mut client = pw.client();
    // Outside a transaction, time does not count.
    for _ in 0..3 {
        client.value("SELECT pg_sleep(0.4)");
    }
    let since = Instant::now();
    client.value("BEGIN");
    let mut fields = None;
    for _ in 0..10 {
        match client.query("SELECT pg_sleep(0.3)") {
            Ok(_) => {}
            Err(err) if err.severity() == "FATAL" => {
                fields = Some(err);
                break;
            }
            Err(err) => panic!("unexpected error {err:?}"),
        }
    }
    let fields = fields.unwrap_or_else(|| panic!("no transaction_timeout after 3 s"));
    assert_fatal(
        &mut client,
        &fields,
        ("25P04", "transaction timeout"),
        since,
        Duration::from_millis(2000),
    );
}

/// A batch kept open (each statement answered through a Flush, no Sync) is one transaction on
/// the server from its first message: transaction_timeout ends it as it ends a transaction
/// block, though no ReadyForQuery ever said a transaction began.
#[test]
fn transaction_timeout_closes_a_batch_kept_open() {
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(&pg, "transaction_timeout = 1\n");
    let mut client = pw.client();
    let since = Instant::now();
    for _ in 0..10 {
        let batch = raw::Batch::new()
            .unnamed("SELECT pg_sleep(0.3)", &[])
            .flush();
        client.send(&batch.bytes);
        loop {
            let message = client.read_message_within(5 * SECOND).expect("an answer");
            match message.tag {
                b'C' => break,
                b'E' => {
                    let err = message.fields();
                    let timeout = ("25P04", "transaction timeout");
                    assert_fatal(&mut client, &err, timeout, since, 2 * SECOND);
                    return;
                }
                _ => {}
            }
        }
    }
    panic!("the batch kept open ran for 3 s\n{}", pw.log());
}

/// A batch sent without Flush or Sync holds its transaction (and its locks) on the server,
/// though nothing of it is answered: transaction_timeout ends it all the same.
#[test]
fn transaction_timeout_closes_a_batch_sent_without_flush_or_sync() {
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(&pg, "transaction_timeout = 1\n");
    let mut client = pw.client();
    let since = Instant::now();
    let batch = raw::Batch::new().unnamed("SELECT 1", &[]);
    client.send(&batch.bytes);
    let err = client.expect_error_within(5 * SECOND);
    assert_fatal(
        &mut client,
        &err,
        ("25P04", "transaction timeout"),
        since,
        2 * SECOND,
    );
}

/// One statement through the extended protocol is no transaction block: its batch arriving
/// in two writes (its Sync later) does not make transaction_timeout count its run.
#[test]
fn transaction_timeout_leaves_a_batch_sent_in_two_writes_alone() {
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(&pg, "transaction_timeout = 1\n");
    let mut client = pw.client();
    let batch = raw::Batch::new().unnamed("SELECT pg_sleep(1.5)", &[]);
    client.send(&batch.bytes);
    thread::sleep(Duration::from_millis(200));
    let answered = client.exchange_within(&raw::Batch::new().sync().bytes, 5 * SECOND, "Sync");
    assert!(
        raw::first_error(&answered).is_none(),
        "{}\n{}",
        raw::describe(&answered),
        pw.log()
    );
}

#[test]
fn transaction_timeout_counts_from_begin_not_from_attach() {
    let pg = Postgres::start();
    let pw = Pgward::trusting(&pg, "pool_mode = session\ntransaction_timeout = 1\n", "");
    let mut client = pw.client();
    client.value("SELECT 1");
    thread::sleep(Duration::from_millis(1300));
    let since = Instant::now();
    assert_eq!(client.value_within("BEGIN", 3 * SECOND), Ok(String::new()));
    assert_eq!(
        client.value_within("SELECT 'inside'", 3 * SECOND),
        Ok("inside".to_string()),
        "closed right after BEGIN"
    );
    let fields = client.expect_error_within(3 * SECOND);
    let took = since.elapsed();
    assert_eq!(fields.code(), "25P04", "{fields:?}");
    assert!(
        took >= Duration::from_millis(900) && took <= Duration::from_millis(2000),
        "transaction_timeout after {took:?}"
    );
}

#[test]
fn client_idle_timeout_closes_idle_clients_with_57p05() {
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(&pg, "client_idle_timeout = 1\n");
    let mut client = pw.client();
    let expected = ("57P05", "client_idle_timeout");
    active_then_idle(&mut client, Duration::from_millis(400), 4, expected);
}

#[test]
fn client_idle_time_counts_from_the_last_answer() {
    let pg = Postgres::start();
    // A timeout long enough that a loaded machine does not idle the client out between its
    // login and its first query (the error would then be lost to the query's write).
    let pw = Pgward::transaction_pool(&pg, "client_idle_timeout = 4\n");
    let mut client = pw.client();
    // The query runs longer than client_idle_timeout; the client then pauses for half of it.
    assert_eq!(
        client.value_within("SELECT pg_sleep(5)", 8 * SECOND),
        Ok(String::new()),
        "{}",
        pw.log()
    );
    thread::sleep(2 * SECOND);
    assert_eq!(
        client.value_within("SELECT 'awake'", 3 * SECOND),
        Ok("awake".to_string()),
        "closed right after a long query's answer\n{}",
        pw.log()
    );
    // The timeout still applies once the client is idle.
    let fields = client.expect_error_within(7 * SECOND);
    assert_eq!(fields.code(), "57P05", "{fields:?}");
}

/// The state and last query of the PostgreSQL backend `pid` (empty when it is gone).
fn backend_state(pg: &Postgres, pid: &str) -> String {
    pg.sql_in(
        "postgres",
        &format!("SELECT state || ': ' || query FROM pg_stat_activity WHERE pid = {pid}"),
    )
}

#[test]
fn client_idle_timeout_in_session_mode_gives_the_server_back() {
    let pg = Postgres::start();
    let settings = "pool_mode = session
client_idle_timeout = 1
server_reset_query = DISCARD ALL
";
    let pw = Pgward::trusting(&pg, settings, "");
    let mut idle = pw.client();
    let pid = idle.value("SELECT pg_backend_pid()");
    assert!(
        idle.closes_within(3 * SECOND),
        "the idle client was not closed"
    );
    // Its server is reset and kept for the next client.
    let reset = "idle: DISCARD ALL";
    assert!(
        eventually(2 * SECOND, || backend_state(&pg, &pid) == reset),
        "the idle client's server: {:?} (empty: closed)",
        backend_state(&pg, &pid)
    );
    let mut next = pw.client();
    assert_eq!(
        next.value("SELECT pg_backend_pid()"),
        pid,
        "a new backend instead of the idle client's"
    );
    assert_eq!(server_count(&pg, "trustuser", "app"), 1, "backends");
}

#[test]
fn client_login_timeout_closes_silent_connections() {
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(&pg, "client_login_timeout = 1\n");
    let since = Instant::now();
    let mut silent = Raw::connect(pw.port);
    let mut half = Raw::connect(pw.port);
    half.send(&raw::ssl_request());
    assert_eq!(half.read_byte(), Ok(b'N'));
    for client in [&mut silent, &mut half] {
        assert!(
            client.closes_within(3 * SECOND),
            "open after client_login_timeout"
        );
    }
    let took = since.elapsed();
    assert!(took >= Duration::from_millis(900), "closed after {took:?}");
    let ok = pw.psql("trustuser", None, "app", "SELECT 1");
    assert!(ok.status.success(), "{}", stderr_of(&ok));
}

/// A server that accepts TCP connections and never answers: each login attempt must give up
/// after server_connect_timeout, and the waiting client must get an error, not hang.
#[test]
fn server_connect_timeout_bounds_each_login_attempt() {
    let pg = Postgres::start();
    let mute = ScriptedServer::start(Script::Mute);
    let dbs = format!("mute = host=127.0.0.1 port={} dbname=app\n", mute.port);
    let settings = "auth_type = trust\npool_mode = transaction\nserver_connect_timeout = 1\n\
                    query_wait_timeout = 4\n";
    let pw = Pgward::start(&Pgward::ini(&pg, settings, &dbs));
    let since = Instant::now();
    let mut client = Raw::connect(pw.port);
    let refused = client
        .startup(&[("user", "trustuser"), ("database", "mute")])
        .expect_err("logged in through a mute server");
    assert!(!refused.code().is_empty(), "{refused:?}");
    assert!(since.elapsed() < 6 * SECOND, "{:?}", since.elapsed());
    let lifetimes = mute.lifetimes(2);
    assert_eq!(lifetimes.len(), 2, "pgward tried once only");
    for life in lifetimes {
        assert!(
            life >= Duration::from_millis(900) && life <= Duration::from_millis(2000),
            "a login attempt lasted {life:?} with server_connect_timeout = 1"
        );
    }
}

/// A login the server refuses is not tried again before server_login_retry: clients get the
/// same error at once, and the server sees no new attempt.
#[test]
fn server_login_retry_spaces_out_refused_logins() {
    let pg = Postgres::start();
    let dbs = format!(
        "badpw = {} user=md5user password=wrong\n",
        pg.db_connstr("app")
    );
    let settings = "auth_type = trust\npool_mode = transaction\nserver_login_retry = 2\n";
    let pw = Pgward::start(&Pgward::ini(&pg, settings, &dbs));
    let attempts = || pg.log().matches("password authentication failed").count();
    let try_login = || {
        let mut client = Raw::connect(pw.port);
        client
            .startup(&[("user", "trustuser"), ("database", "badpw")])
            .expect_err("logged in with a wrong server password")
    };
    let first = try_login();
    assert_eq!(first.code(), "28P01", "{first:?}");
    assert!(eventually(SECOND, || attempts() == 1), "{}", attempts());
    let since = Instant::now();
    let second = try_login();
    assert!(since.elapsed() < Duration::from_millis(500));
    assert_eq!(second.code(), "28P01", "{second:?}");
    thread::sleep(Duration::from_millis(200));
    assert_eq!(attempts(), 1, "a new login inside server_login_retry");
    thread::sleep(Duration::from_millis(2000));
    let third = try_login();
    assert_eq!(third.code(), "28P01", "{third:?}");
    assert!(eventually(SECOND, || attempts() == 2), "{}", attempts());
}

#[test]
fn min_pool_size_waits_for_server_login_retry() {
    let pg = Postgres::start();
    let dbs = format!(
        "badpw = {} user=md5user password=wrong\n",
        pg.db_connstr("app")
    );
    let pw = Pgward::trusting(
        &pg,
        "pool_mode = transaction\nmin_pool_size = 1\nserver_login_retry = 10\n",
        &dbs,
    );
    let attempts = || pg.log().matches("password authentication failed").count();
    let refused = new_client_value(&pw, ("trustuser", "badpw"), "SELECT 1", 3 * SECOND)
        .expect_err("logged in with a wrong server password");
    assert!(refused.contains("28P01"), "{refused}");
    assert!(eventually(SECOND, || attempts() >= 1));
    // Two maintenance passes later, still no second attempt.
    thread::sleep(Duration::from_millis(2200));
    assert_eq!(
        attempts(),
        1,
        "min_pool_size retried inside server_login_retry"
    );
}

#[test]
fn query_timeout_fires_while_rows_keep_streaming() {
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(&pg, "query_timeout = 1\n");
    let mut client = pw.client_as("postgres", "app");
    // Rows without end, read as fast as they come: the relay never waits, the timer must
    // still be heard.
    client.send(&raw::query_message(
        "SELECT repeat('x', 100) FROM generate_series(1, 1000000000)",
    ));
    let started = Instant::now();
    let code = loop {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "query_timeout never fired"
        );
        match client.read_message_within(Duration::from_secs(5)) {
            Ok(m) if m.tag == b'E' => break Fields::parse(&m.body).code().to_string(),
            Ok(_) => {}
            Err(e) => panic!("stream ended without the timeout: {e:?}"),
        }
    };
    assert_eq!(code, "57014");
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "{:?}",
        started.elapsed()
    );
}

/// `[users]` timeouts apply to their user, as in PgBouncer: a positive value wins over the
/// global one (query_timeout and the transaction limits from the server's user,
/// client_idle_timeout from the client's); other users keep the global limits.
#[test]
fn users_section_timeouts_apply_to_their_user() {
    let pg = Postgres::start();
    let ini = Pgward::ini(&pg, "auth_type = trust\npool_mode = transaction\n", "")
        + "[users]\ntrustuser = query_timeout=1 client_idle_timeout=1\n\
           postgres = idle_transaction_timeout=1\n";
    let pw = Pgward::start(&ini);
    let login_as = |user: &str| {
        let mut client = Raw::connect(pw.port);
        client
            .startup(&[("user", user), ("database", "app")])
            .unwrap_or_else(|err| panic!("login refused: {err:?}"));
        client
    };
    let mut limited = login_as("trustuser");
    let since = Instant::now();
    limited.send(&raw::query_message("SELECT pg_sleep(5)"));
    let fields = limited.expect_error_within(4 * SECOND);
    let expected = ("57014", "query timeout");
    assert_fatal(
        &mut limited,
        &fields,
        expected,
        since,
        Duration::from_millis(2500),
    );
    // Another user's statement runs past the one-second limit.
    let mut free = login_as("postgres");
    assert_eq!(free.value("SELECT pg_sleep(1.5)"), "");
    // ...and its idle time too, until its own idle-in-transaction limit.
    thread::sleep(Duration::from_millis(1500));
    assert_eq!(free.value("SELECT 2"), "2");
    free.value("BEGIN");
    let since = Instant::now();
    let fields = free.expect_error_within(3 * SECOND);
    let expected = ("25P03", "idle transaction timeout");
    assert_fatal(&mut free, &fields, expected, since, 2 * SECOND);
    let mut idle = login_as("trustuser");
    active_then_idle(
        &mut idle,
        Duration::from_millis(500),
        3,
        ("57P05", "client_idle_timeout"),
    );
}

/// A `[databases]` entry `dead` whose server port nobody listens on.
fn unreachable_database() -> String {
    format!(
        "dead = host=127.0.0.1 port={} dbname=app",
        common::free_port()
    )
}

#[test]
fn query_timeout_bounds_a_wait_for_a_server_that_cannot_be_reached() {
    let pg = Postgres::start();
    let dead = unreachable_database();
    let pw = Pgward::trusting(
        &pg,
        "query_timeout = 2\nquery_wait_timeout = 60\nserver_login_retry = 1\n",
        &dead,
    );
    let out = pw.psql("postgres", None, "dead", "SELECT 1");
    assert!(!out.status.success());
    assert!(
        stderr_of(&out).contains("query_timeout"),
        "{}\n{}",
        stderr_of(&out),
        pw.log()
    );
    assert!(
        pw.log().contains("closing because: connect failed"),
        "{}",
        pw.log()
    );
}

#[test]
fn the_server_users_query_timeout_bounds_its_wait_for_a_server() {
    let pg = Postgres::start();
    let dead = unreachable_database();
    let ini = Pgward::ini(
        &pg,
        "auth_type = trust\nquery_timeout = 600\nquery_wait_timeout = 600\nserver_login_retry = 1\n",
        &dead,
    );
    let pw = Pgward::start(&format!("{ini}\n[users]\npostgres = query_timeout=2\n"));
    let out = pw.psql("postgres", None, "dead", "SELECT 1");
    assert!(!out.status.success());
    assert!(
        stderr_of(&out).contains("query_timeout"),
        "{}\n{}",
        stderr_of(&out),
        pw.log()
    );
}
