//! Regression tests for the faults of the second review: extended COPY FROM STDIN and the
//! batch it keeps open, prepared statements the server has or no longer has (skipped
//! evictions, DISCARD ALL read while draining, reset queries, failed transactions), LISTEN in
//! transaction pooling, errors before any Sync, and client_idle_timeout. Each test plays the
//! scenario against PostgreSQL through pgward, and where PostgreSQL's own answer is the
//! reference, plays it against PostgreSQL directly too. The numbered sections follow the
//! list of faults.

mod common;

use std::thread;

use common::{eventually, server_count, Pgward, Postgres, SECOND};

// ---------------------------------------------------------------------------------------------
// 8. and 9. client_idle_timeout.

#[test]
fn r8_client_idle_time_counts_from_the_last_answer() {
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
fn r9_client_idle_timeout_in_session_mode_gives_the_server_back() {
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
