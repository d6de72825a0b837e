//! Transaction pooling message by message: what a client sends while it waits for a server
//! (extended messages one per write, a second query, its own departure), and when it gives
//! its server back: at the Sync, at a Sync followed by Flush, after LISTEN, after an error
//! before any Sync (as PostgreSQL skips to that Sync), and with what it sends just before
//! Terminate.

mod common;

use std::thread;
use std::time::Duration;

use common::raw::{
    bind_message, describe, error_code, execute_message, first_error, flush_message,
    new_client_value, parse_message, query_message, sync_message, tags, terminate_message, values,
    Batch, Message, Raw,
};
use common::{eventually, Pgward, Postgres, SECOND};

// ---------------------------------------------------------------------------------------------
// Messages read while waiting for a server.

#[test]
fn extended_messages_sent_while_waiting_for_a_server_are_forwarded() {
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(&pg, "default_pool_size = 1\n");
    let mut holder = pw.client();
    let mut waiter = pw.client();

    // One message per write, while the only server is busy.
    holder.value("BEGIN");
    waiter.send(&parse_message("", "SELECT 41 + 1"));
    thread::sleep(Duration::from_millis(300));
    for message in [bind_message(""), execute_message(), sync_message()] {
        waiter.send(&message);
        thread::sleep(Duration::from_millis(50));
    }
    thread::sleep(Duration::from_millis(200));
    holder.value("COMMIT");
    let answer = waiter
        .until_ready_within(3 * SECOND)
        .unwrap_or_else(|err| panic!("extended batch sent while waiting: {err}"));
    assert_eq!(tags(&answer), "12DCZ", "{}", describe(&answer));
    assert_eq!(answer[2].first_column().as_deref(), Some("42"));
}

#[test]
fn simple_query_sent_while_another_waits_is_forwarded() {
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(&pg, "default_pool_size = 1\n");
    let mut holder = pw.client();
    let mut waiter = pw.client();
    holder.value("BEGIN");
    waiter.send(&query_message("SELECT 'q1'"));
    thread::sleep(Duration::from_millis(300));
    waiter.send(&query_message("SELECT 'q2'"));
    thread::sleep(Duration::from_millis(200));
    holder.value("COMMIT");
    assert_eq!(waiter.read_value(3 * SECOND), Ok("q1".to_string()));
    assert_eq!(waiter.read_value(3 * SECOND), Ok("q2".to_string()));
}

#[test]
fn a_client_that_leaves_while_waiting_for_a_server_runs_nothing() {
    let pg = Postgres::start();
    pg.sql("CREATE TABLE left_behind (n int); GRANT ALL ON left_behind TO PUBLIC");
    let pw = Pgward::transaction_pool(&pg, "default_pool_size = 1\n");
    let mut holder = pw.client();
    let mut waiter = pw.client();
    holder.value("BEGIN");
    waiter.send(&query_message("INSERT INTO left_behind VALUES (1)"));
    thread::sleep(Duration::from_millis(300));
    // The client closes its connection while it waits in the queue.
    drop(waiter);
    thread::sleep(Duration::from_millis(300));
    holder.value("COMMIT");
    // The server just freed must not run the statement of a client that is gone.
    thread::sleep(Duration::from_millis(500));
    assert_eq!(pg.sql("SELECT count(*) FROM left_behind"), "0");
    assert_eq!(holder.value("SELECT 'still served'"), "still served");
}

// ---------------------------------------------------------------------------------------------
// When the server goes back to the pool.

#[test]
fn sync_then_flush_gives_the_server_back() {
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(&pg, "default_pool_size = 1\n");
    let mut first = pw.client();
    first.send(
        &[
            parse_message("", "SELECT 12"),
            bind_message(""),
            execute_message(),
            sync_message(),
            flush_message(),
        ]
        .concat(),
    );
    let answer = first
        .until_ready_within(3 * SECOND)
        .unwrap_or_else(|err| panic!("{err}"));
    assert_eq!(tags(&answer), "12DCZ", "{}", describe(&answer));
    assert_eq!(
        new_client_value(&pw, ("trustuser", "app"), "SELECT 'other'", 3 * SECOND),
        Ok("other".to_string()),
        "the server stayed with the client that sent Flush after Sync"
    );
}

#[test]
fn listen_gives_the_server_back_and_warns_before_ready() {
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(&pg, "default_pool_size = 1\nquery_wait_timeout = 10\n");
    let mut listener = pw.client();
    let answer = listener.exchange_within(&query_message("LISTEN foo"), 3 * SECOND, "LISTEN");
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
fn error_before_sync_leaves_the_server_skipping_to_the_sync() {
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

/// The unnamed statement of an earlier transaction is not the client's on the server its next
/// transaction runs on: a Bind or a Describe of it fails as PostgreSQL fails them for an
/// unnamed statement that does not exist, in PostgreSQL's words.
#[test]
fn using_an_earlier_transactions_unnamed_statement_fails_in_postgresqls_words() {
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(&pg, "");
    let mut client = pw.client();
    let parse = [parse_message("", "SELECT 1"), sync_message()].concat();
    let parsed = client.exchange_within(&parse, 3 * SECOND, "the parse");
    assert_eq!(tags(&parsed), "1Z", "{}", describe(&parsed));
    let mut fresh = pg.client();
    let uses = [
        [bind_message(""), execute_message(), sync_message()].concat(),
        Batch::new().describe(b'S', "").sync().bytes,
    ];
    for (n, using) in uses.iter().enumerate() {
        let direct = fresh.exchange_within(using, 3 * SECOND, "direct");
        let pooled = client.exchange_within(using, 3 * SECOND, "pooled");
        assert_eq!(error_code(&pooled), "26000", "{n}: {}", describe(&pooled));
        let (Some(direct), Some(pooled)) = (first_error(&direct), first_error(&pooled)) else {
            panic!("{n}: errors from both");
        };
        assert_eq!(pooled.message(), direct.message(), "{n}");
        assert_eq!(pooled.code(), direct.code(), "{n}");
    }
    assert_eq!(client.value("SELECT 'still here'"), "still here");
}

/// Inside a transaction: the unnamed statement parsed, then a batch that fails before a Parse
/// of a named statement (skipped), rolled back to a savepoint: the unnamed statement's run.
fn unnamed_after_a_skipped_named_parse(client: &mut Raw) -> Vec<Message> {
    let run = |name: &str| [bind_message(name), execute_message()].concat();
    let steps = [
        query_message("BEGIN"),
        [
            parse_message("sp", "SAVEPOINT sp"),
            run("sp"),
            sync_message(),
        ]
        .concat(),
        [parse_message("", "SELECT 5"), sync_message()].concat(),
        Batch::new()
            .describe(b'S', "nope")
            .parse("n", "SELECT 6", &[])
            .sync()
            .bytes,
        [
            parse_message("r", "ROLLBACK TO SAVEPOINT sp"),
            run("r"),
            sync_message(),
        ]
        .concat(),
    ];
    for (n, step) in steps.iter().enumerate() {
        client.exchange_within(step, 3 * SECOND, &format!("step {n}"));
    }
    client.exchange_within(&[run(""), sync_message()].concat(), 3 * SECOND, "the run")
}

/// A skipped Parse of a named statement pgward does not map leaves the server's unnamed
/// statement the client's, as in PostgreSQL.
#[test]
fn a_skipped_named_parse_leaves_the_unnamed_statement_to_the_client() {
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(&pg, "max_prepared_statements = 0\n");
    let direct = unnamed_after_a_skipped_named_parse(&mut pg.client());
    let pooled = unnamed_after_a_skipped_named_parse(&mut pw.client());
    assert_eq!(
        values(&direct),
        vec![Some("5".to_string())],
        "{}",
        describe(&direct)
    );
    assert_eq!(values(&pooled), values(&direct), "{}", describe(&pooled));
}

// ---------------------------------------------------------------------------------------------
// Messages sent just before Terminate.

#[test]
fn query_sent_with_terminate_still_runs() {
    let pg = Postgres::start();
    pg.sql("CREATE TABLE last_words (n int); GRANT ALL ON last_words TO PUBLIC");
    let pw = Pgward::transaction_pool(&pg, "");
    let mut client = pw.client();
    let bytes = [
        query_message("INSERT INTO last_words VALUES (8)"),
        terminate_message(),
    ]
    .concat();
    client.send(&bytes);
    assert!(
        client.closes_within(3 * SECOND),
        "not closed after Terminate"
    );
    let count = || pg.sql("SELECT count(*) FROM last_words");
    assert!(
        eventually(3 * SECOND, || count() == "1"),
        "the INSERT sent with Terminate did not run: {} rows",
        count()
    );
}

// ---------------------------------------------------------------------------------------------
// A kill without a policy: a tenant is its role.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_role_can_still_commit_with_a_prepared_statement() {
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(&pg, "admin_users = admin\n");
    let c = common::driver::must_connect(&pw.connstr("trustuser", None, "app")).await;
    c.client.batch_execute("BEGIN").await.expect("begin");
    let out = common::psql_at(
        pw.port,
        "admin",
        None,
        "pgward",
        "KILL TENANT trustuser FOR '1m'",
    );
    assert!(out.status.success(), "{}", common::stderr_of(&out));
    let err = c
        .client
        .query("SELECT 1", &[])
        .await
        .expect_err("a killed role's statement runs");
    assert_eq!(err.code().map(|c| c.code()), Some("53000"), "{err:?}");
    // The refusal failed the transaction; a prepared ROLLBACK still ends it.
    let rollback = c.client.prepare("ROLLBACK").await.expect("prepare");
    c.client
        .execute(&rollback, &[])
        .await
        .expect("rollback goes through");
    c.client
        .batch_execute("BEGIN")
        .await
        .expect_err("BEGIN is refused");
}

/// With `disable_pqexec`, a simple Query ends the session with PgBouncer's error (FATAL 08P01
/// `PQexec disallowed`); the extended protocol works.
#[test]
fn disable_pqexec_refuses_simple_queries() {
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(&pg, "disable_pqexec = 1\n");
    let mut extended = pw.client();
    let batch = [
        parse_message("", "SELECT 41 + 1"),
        bind_message(""),
        execute_message(),
        sync_message(),
    ]
    .concat();
    let answer = extended.exchange_within(&batch, 3 * SECOND, "extended");
    assert_eq!(
        values(&answer),
        vec![Some("42".to_string())],
        "{}",
        describe(&answer)
    );
    let mut simple = pw.client();
    simple.send(&query_message("SELECT 1"));
    let refused = simple.expect_error_within(3 * SECOND);
    assert_eq!(
        (refused.code(), refused.message()),
        ("08P01", "PQexec disallowed")
    );
}

/// What pgward answers by itself (a CloseComplete for each Close of a statement no server has)
/// waits within the same bound as the server's answers for a client that reads nothing:
/// pgward stops reading the client rather than keep every answer in memory.
#[test]
fn answers_of_pgward_s_own_are_bounded_for_a_client_that_reads_nothing() {
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(&pg, "");
    let status = format!("/proc/{}/status", pw.pid());
    let rss_kb = || -> u64 {
        let text = std::fs::read_to_string(&status).expect("pgward's status");
        let line = text.lines().find(|l| l.starts_with("VmRSS:"));
        let kb = line.and_then(|l| l.split_whitespace().nth(1));
        kb.and_then(|n| n.parse().ok()).expect("VmRSS")
    };
    let mut client = pw.client();
    let mut chunk = Batch::new();
    for _ in 0..8192 {
        chunk = chunk.close(b'S', "x");
    }
    let chunk = chunk.bytes;
    let total = 48 << 20;
    let before = rss_kb();
    let flood = |client: &mut Raw| {
        let mut sent = 0;
        while sent < total && client.send_within(&chunk, 2 * SECOND) {
            sent += chunk.len();
        }
        assert!(sent < total, "pgward read all {sent} bytes\n{}", pw.log());
        let grown_kb = rss_kb().saturating_sub(before);
        assert!(grown_kb < 16 << 10, "pgward grew by {grown_kb} kB");
    };
    flood(&mut client);
    // Behind an answer the server has not sent yet, they wait in the queue of what is owed.
    let mut behind = pw.client();
    behind.send(&query_message("SELECT pg_sleep(3)"));
    flood(&mut behind);
}

/// A cursor declared WITH HOLD outlives its transaction on PostgreSQL: it is closed before the
/// server goes back, so the next client of the server cannot FETCH another's rows.
#[test]
fn a_cursor_held_past_its_transaction_is_no_other_clients() {
    let pg = Postgres::start();
    let pw = Pgward::trusting(&pg, "pool_mode = transaction\ndefault_pool_size = 1\n", "");
    let mut owner = pw.client();
    let declared = owner.exchange_within(
        &query_message("BEGIN; DECLARE c CURSOR WITH HOLD FOR SELECT 42; COMMIT"),
        3 * SECOND,
        "DECLARE",
    );
    assert_eq!(error_code(&declared), "", "{}", describe(&declared));
    let mut other = pw.client();
    let fetched = other.exchange_within(&query_message("FETCH ALL FROM c"), 3 * SECOND, "FETCH");
    assert_eq!(error_code(&fetched), "34000", "{}", describe(&fetched));
    // Its own cursor is the owner's to use within its transaction, as before.
    let own = owner.exchange_within(
        &query_message("BEGIN; DECLARE d CURSOR FOR SELECT 7; FETCH ALL FROM d; COMMIT"),
        3 * SECOND,
        "its own cursor",
    );
    assert_eq!(error_code(&own), "", "{}", describe(&own));
}

/// A batch whose answers pgward gives by itself pile up past its bound behind an answer the
/// server keeps unflushed (no Sync or Flush yet) still moves: pgward asks the server for its
/// answers rather than stop reading the client for ever.
#[test]
fn a_long_batch_of_pgward_s_own_answers_still_moves() {
    use std::io::Write;
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(&pg, "");
    let mut client = pw.client();
    let mut writer = client.writer();
    let mut batch = Batch::new().unnamed("SELECT 1", &[]);
    let closes = 70_000;
    for _ in 0..closes {
        batch = batch.close(b'S', "x");
    }
    let bytes = batch.sync().bytes;
    let sent = thread::spawn(move || writer.write_all(&bytes));
    let answers = client
        .until_ready_within(30 * SECOND)
        .unwrap_or_else(|err| panic!("{}\n{}", &err[..err.len().min(300)], pw.log()));
    assert!(sent.join().expect("the writer").is_ok());
    assert_eq!(error_code(&answers), "", "an error");
    assert_eq!(answers.iter().filter(|m| m.tag == b'3').count(), closes);
}

/// Without a policy a kill reads each Bind as the statement it runs: a name prepared again in
/// the same write (behind a Close of it and a Sync) is its new text, not the one pgward mapped
/// for it before; and a ROLLBACK prepared after the kill still ends the killed role's
/// transaction, in session pooling too, where pgward keeps no map of the names.
#[test]
fn without_a_policy_a_kill_reads_a_bind_as_its_latest_parse() {
    let pg = Postgres::start();
    for mode in ["transaction", "session"] {
        let pw = Pgward::trusting(
            &pg,
            &format!("pool_mode = {mode}\nadmin_users = admin\n"),
            "",
        );
        let mut r = pw.client_as("trustuser", "app");
        r.query("BEGIN").expect("BEGIN");
        let kill = "KILL TENANT trustuser FOR '1m'";
        let out = common::psql_at(pw.port, "admin", None, "pgward", kill);
        assert!(out.status.success(), "{}", common::stderr_of(&out));
        let prepared = Batch::new().parse("s", "ROLLBACK", &[]).sync();
        let answer = r.exchange_within(&prepared.bytes, 3 * SECOND, "the Parse");
        assert!(
            first_error(&answer).is_none(),
            "{mode}: {}",
            describe(&answer)
        );
        let again = Batch::new()
            .close(b'S', "s")
            .parse("s", "SELECT pg_sleep(0)", &[])
            .sync()
            .bind("", "s", &[])
            .execute("", 0)
            .sync();
        r.send(&again.bytes);
        let answer = r.until_ready_within(3 * SECOND).expect("the first batch");
        assert!(
            first_error(&answer).is_none(),
            "{mode}: {}",
            describe(&answer)
        );
        let answer = r.until_ready_within(3 * SECOND).expect("the second batch");
        assert_eq!(
            error_code(&answer),
            "53000",
            "{mode}: {}",
            describe(&answer)
        );
        let rollback = Batch::new().parse("r", "ROLLBACK", &[]).sync();
        let answer = r.exchange_within(&rollback.bytes, 3 * SECOND, "the Parse of ROLLBACK");
        assert!(
            first_error(&answer).is_none(),
            "{mode}: {}",
            describe(&answer)
        );
        let run = Batch::new().bind("", "r", &[]).execute("", 0).sync();
        let answer = r.exchange_within(&run.bytes, 3 * SECOND, "ROLLBACK");
        assert!(
            first_error(&answer).is_none(),
            "{mode}: {}",
            describe(&answer)
        );
    }
}

/// Without a policy, while a kill is in force (the gate reads the messages for kills alone),
/// then with a policy a reload brings: a Bind of the unnamed statement prepared before is not
/// taken for the text of a Parse of it that the server skipped. A kill of that text's
/// statement does not stop it (the server runs the statement it had); the gate knows no
/// statement from before the policy.
#[test]
fn a_policy_from_a_reload_does_not_take_a_skipped_parses_text() {
    use pgward::sql::{Analyzer, Depth, ParseContext};
    let pg = Postgres::start();
    let pw = Pgward::trusting(&pg, "pool_mode = session\nadmin_users = admin\n", "");
    let console = |sql: &str| {
        let out = common::psql_at(pw.port, "admin", None, "pgward", sql);
        assert!(out.status.success(), "{sql}: {}", common::stderr_of(&out));
    };
    console("KILL TENANT postgres FOR '1m'");
    let mut r = pw.client_as("trustuser", "app");
    let run = Batch::new().bind("", "", &[]).execute("", 0).sync().bytes;
    let first = Batch::new()
        .parse("", "SELECT 41 + 1", &[])
        .bind("", "", &[])
        .execute("", 0)
        .sync();
    let answer = r.exchange_within(&first.bytes, 3 * SECOND, "the first statement");
    assert!(first_error(&answer).is_none(), "{}", describe(&answer));
    let skipped = Batch::new()
        .describe(b'S', "nope")
        .parse("", "SELECT 'skipped'", &[])
        .sync();
    let answer = r.exchange_within(&skipped.bytes, 3 * SECOND, "the skipped Parse");
    assert_eq!(error_code(&answer), "26000", "{}", describe(&answer));
    let _policy = add_policy(&pw, "[tenants.acme]\nroles = [\"trustuser\"]\n");
    let skipped_statement = Analyzer::new(Depth::Shape, 4)
        .analyze(b"SELECT 'skipped'", &ParseContext::server_defaults())
        .fingerprint_hex();
    console(&format!("KILL STATEMENT {skipped_statement} FOR '1m'"));
    let answer = r.exchange_within(&run, 3 * SECOND, "the Bind under the policy");
    assert!(first_error(&answer).is_none(), "{}", describe(&answer));
    let row = answer.iter().find(|m| m.tag == b'D');
    assert_eq!(row.and_then(|m| m.first_column()).as_deref(), Some("42"));
}

/// Adds `policy` as pgward's policy file by a reload (the file lives as long as the result).
fn add_policy(pw: &Pgward, policy: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("a directory");
    let path = dir.path().join("policy.toml");
    std::fs::write(&path, policy).expect("the policy");
    let ini = std::fs::read_to_string(&pw.ini_path).expect("the ini");
    let line = format!("policy_file = {}\n", path.display());
    std::fs::write(&pw.ini_path, format!("{ini}{line}")).expect("the ini");
    pw.reload_and_wait();
    dir
}
