//! Regression tests for the faults of the second review: extended COPY FROM STDIN and the
//! batch it keeps open, prepared statements the server has or no longer has (skipped
//! evictions, DISCARD ALL read while draining, reset queries, failed transactions), LISTEN in
//! transaction pooling, errors before any Sync, and client_idle_timeout. Each test plays the
//! scenario against PostgreSQL through pgward, and where PostgreSQL's own answer is the
//! reference, plays it against PostgreSQL directly too. The numbered sections follow the
//! list of faults.

mod common;

use std::thread;
use std::time::Duration;

use common::raw::{
    self, bind_message, describe, error_code, execute_message, first_error, flush_message,
    parse_message, run_prepared, sync_message, tags, terminate_message, Message, Raw,
};
use common::{eventually, server_count, Pgward, Postgres, SECOND};

/// The reviewer's setting for prepared statements: one server, room for two statements.
const TWO_STATEMENTS: &str = "default_pool_size = 1\nmax_prepared_statements = 2\n";

/// Parse, Bind, Execute and Sync of `sql` as the statement `name`.
fn run_named(name: &str, sql: &str) -> Vec<u8> {
    [
        raw::parse_message(name, sql),
        raw::bind_message(name),
        execute_message(),
        sync_message(),
    ]
    .concat()
}

/// Asserts that an extended-protocol answer has no error and that its first row says
/// `expected`.
fn assert_row(answer: &[Message], expected: &str, what: &str) {
    assert!(
        first_error(answer).is_none(),
        "{what}: {}",
        describe(answer)
    );
    let row = answer.iter().find(|m| m.tag == b'D');
    assert_eq!(
        row.and_then(|m| m.first_column()).as_deref(),
        Some(expected),
        "{what}: {}",
        describe(answer)
    );
}

// ---------------------------------------------------------------------------------------------
// 2. an eviction Close that the server skipped.

#[test]
fn r2_skipped_eviction_close_leaves_the_statement_usable() {
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(&pg, TWO_STATEMENTS);
    let mut client = pw.client();
    let first = client.exchange_within(&run_named("a", "SELECT 1"), 3 * SECOND, "a");
    assert_row(&first, "1", "a");
    let second = client.exchange_within(&run_named("a2", "SELECT 2"), 3 * SECOND, "a2");
    assert_row(&second, "2", "a2");
    // The third statement evicts the first, but the error before it makes PostgreSQL skip the
    // eviction's Close along with the Parse.
    let bad = [
        parse_message("", "selec bad"),
        raw::parse_message("b", "SELECT 3"),
        sync_message(),
    ]
    .concat();
    let refused = client.exchange_within(&bad, 3 * SECOND, "the failed batch");
    assert_eq!(error_code(&refused), "42601", "{}", describe(&refused));

    let again = client.exchange_within(
        &run_prepared("a"),
        3 * SECOND,
        "a after the skipped eviction",
    );
    assert_row(&again, "1", "a after the skipped eviction");
    let mut other = pw.client();
    let fresh = other.exchange_within(
        &run_named("c", "SELECT 1"),
        3 * SECOND,
        "the same text, another client",
    );
    assert_row(&fresh, "1", "the same text, another client");
}

// ---------------------------------------------------------------------------------------------
// 3. what the drain after Terminate learns.

#[test]
fn r3a_discard_all_sent_with_terminate_forgets_the_statements() {
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(&pg, TWO_STATEMENTS);
    let mut leaver = pw.client();
    let answer = leaver.exchange_within(&run_named("a", "SELECT 42"), 3 * SECOND, "a");
    assert_row(&answer, "42", "a");
    leaver.send(&[raw::query_message("DISCARD ALL"), terminate_message()].concat());
    assert!(
        leaver.closes_within(3 * SECOND),
        "not closed after Terminate"
    );

    let mut next = pw.client();
    let fresh = next.exchange_within(
        &run_named("z", "SELECT 42"),
        3 * SECOND,
        "after DISCARD ALL",
    );
    assert_row(&fresh, "42", "the same text after DISCARD ALL");
}

#[test]
fn r3b_parse_failed_before_terminate_is_not_taken_as_prepared() {
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(&pg, TWO_STATEMENTS);
    let sql = "SELECT * FROM later_table";
    let mut leaver = pw.client();
    leaver.send(&[run_named("q", sql), terminate_message()].concat());
    assert!(
        leaver.closes_within(3 * SECOND),
        "not closed after Terminate"
    );

    pg.sql("CREATE TABLE later_table (n int); GRANT ALL ON later_table TO PUBLIC");
    pg.sql("INSERT INTO later_table VALUES (3)");
    let mut next = pw.client();
    let answer = next.exchange_within(&run_named("r", sql), 3 * SECOND, "the table now exists");
    assert_eq!(tags(&answer), "12DCZ", "{}", describe(&answer));
    assert_row(&answer, "3", "the table now exists");
}

// ---------------------------------------------------------------------------------------------
// 4. server_reset_query_always wipes the server's statements.

#[test]
fn r4_reset_query_always_forgets_the_prepared_statements() {
    let pg = Postgres::start();
    let settings = format!("{TWO_STATEMENTS}server_reset_query_always = 1\n");
    let pw = Pgward::transaction_pool(&pg, &settings);
    let mut client = pw.client();
    let first = client.exchange_within(&run_named("a", "SELECT 42"), 3 * SECOND, "a");
    assert_row(&first, "42", "a");
    let again = client.exchange_within(&run_prepared("a"), 3 * SECOND, "a after the reset");
    assert_row(&again, "42", "a after the reset");
    let fresh = client.exchange_within(&run_named("b", "SELECT 42"), 3 * SECOND, "b, same text");
    assert_row(&fresh, "42", "b, same text");
}

// ---------------------------------------------------------------------------------------------
// 5. LISTEN in transaction pooling.

#[test]
fn r5_listen_gives_the_server_back_and_warns_before_ready() {
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(&pg, "default_pool_size = 1\nquery_wait_timeout = 10\n");
    let mut listener = pw.client();
    let answer = listener.exchange_within(&raw::query_message("LISTEN foo"), 3 * SECOND, "LISTEN");
    assert_eq!(error_code(&answer), "", "{}", describe(&answer));

    let mut other = pw.client();
    assert_eq!(
        other.value_within("SELECT 1", 3 * SECOND),
        Ok("1".to_string()),
        "the server stayed with the listener"
    );
    // The warning is part of LISTEN's answer, not something after it.
    assert!(
        answer.iter().any(|m| m.tag == b'N'),
        "no warning before ReadyForQuery: [{}]",
        tags(&answer)
    );
    let late = listener.read_message_within(Duration::from_millis(100));
    assert!(late.is_err(), "a message after ReadyForQuery: {late:?}");
}

// ---------------------------------------------------------------------------------------------
// 6. an error before any Sync.

/// A failed Parse answered at Flush, then a Bind, Execute and Sync PostgreSQL skips: what
/// comes back for each of the two writes.
fn parse_error_then_skipped(client: &mut Raw) -> (Vec<Message>, Vec<Message>) {
    client.send(&[parse_message("", "selec bad"), flush_message()].concat());
    let error = client
        .until_tag_within(b'E', 3 * SECOND)
        .unwrap_or_else(|err| panic!("{err}"));
    let rest = client.exchange_within(
        &[bind_message(""), execute_message(), sync_message()].concat(),
        3 * SECOND,
        "after the error",
    );
    (error, rest)
}

#[test]
fn r6_error_before_sync_leaves_the_server_skipping_to_the_sync() {
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(&pg, "default_pool_size = 1\n");
    let (direct_error, direct_rest) = parse_error_then_skipped(&mut pg.client());
    let mut client = pw.client();
    let (error, rest) = parse_error_then_skipped(&mut client);
    assert_eq!(error_code(&error), error_code(&direct_error));
    assert_eq!(
        (tags(&rest), rest.last().map(|m| m.body.clone())),
        (
            tags(&direct_rest),
            direct_rest.last().map(|m| m.body.clone())
        ),
        "pgward: [{}], PostgreSQL: [{}]",
        describe(&rest),
        describe(&direct_rest)
    );
    assert_eq!(client.value("SELECT 'still here'"), "still here");
}

// ---------------------------------------------------------------------------------------------
// 7. a failed transaction refuses Parse and DEALLOCATE.

/// Prepares `a` as `SELECT 1`, then opens a transaction and makes it fail.
fn prepare_then_fail(client: &mut Raw) {
    let first = client.exchange_within(&run_named("a", "SELECT 1"), 3 * SECOND, "a");
    assert_row(&first, "1", "a");
    client.value("BEGIN");
    let failed =
        client.exchange_within(&raw::query_message("SELECT 1/0"), 3 * SECOND, "SELECT 1/0");
    assert_eq!(error_code(&failed), "22012", "{}", describe(&failed));
}

/// What `client` answers to `bytes` sent in a failed transaction, then to ROLLBACK and a use
/// of `a`: the tags and error of each step.
fn in_failed_transaction(client: &mut Raw, bytes: &[u8]) -> Vec<(String, String)> {
    prepare_then_fail(client);
    let refused = client.exchange_within(bytes, 3 * SECOND, "in the failed transaction");
    let rollback = client.exchange_within(&raw::query_message("ROLLBACK"), 3 * SECOND, "ROLLBACK");
    let after = client.exchange_within(&run_prepared("a"), 3 * SECOND, "a after ROLLBACK");
    [refused, rollback, after]
        .iter()
        .map(|answer| (describe(answer), error_code(answer)))
        .collect()
}

fn assert_like_postgres(pg: &Postgres, bytes: &[u8]) {
    let pw = Pgward::transaction_pool(pg, TWO_STATEMENTS);
    let expected = in_failed_transaction(&mut pg.client(), bytes);
    assert_eq!(expected[0].1, "25P02", "PostgreSQL's answer: {expected:?}");
    let got = in_failed_transaction(&mut pw.client(), bytes);
    assert_eq!(got, expected, "pgward, then PostgreSQL");
}

#[test]
fn r7a_parse_of_a_cached_statement_in_a_failed_transaction_is_refused() {
    let pg = Postgres::start();
    assert_like_postgres(
        &pg,
        &[raw::parse_message("b", "SELECT 1"), sync_message()].concat(),
    );
}

#[test]
fn r7b_deallocate_in_a_failed_transaction_is_refused() {
    let pg = Postgres::start();
    assert_like_postgres(&pg, &raw::query_message("DEALLOCATE a"));
}

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
