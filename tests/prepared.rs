//! Prepared statements in transaction pooling, where pgward prepares a client's statements on
//! whichever server it gets and closes them to make room: which statements the server still
//! has after an eviction its Close never reached, after a DISCARD ALL or a failed Parse sent
//! with Terminate, after server_reset_query_always, and in a failed transaction (compared with
//! PostgreSQL's own answers).

mod common;

use common::raw::{
    bind_message, describe, error_code, execute_message, first_error, parse_message, query_message,
    run_prepared, sync_message, tags, terminate_message, Batch, Message, Raw,
};
use common::{Pgward, Postgres, SECOND};

/// One server, with room for two prepared statements.
const TWO_STATEMENTS: &str = "default_pool_size = 1\nmax_prepared_statements = 2\n";

/// Parse, Bind, Execute and Sync of `sql` as the statement `name`.
fn run_named(name: &str, sql: &str) -> Vec<u8> {
    [
        parse_message(name, sql),
        bind_message(name),
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
// An eviction Close that the server skipped.

/// A client of a server with room for two statements, both taken (`a` is `SELECT 1`).
fn server_full_of_a_and_a2(pw: &Pgward) -> Raw {
    let mut client = pw.client();
    let first = client.exchange_within(&run_named("a", "SELECT 1"), 3 * SECOND, "a");
    assert_row(&first, "1", "a");
    let second = client.exchange_within(&run_named("a2", "SELECT 2"), 3 * SECOND, "a2");
    assert_row(&second, "2", "a2");
    client
}

/// A batch whose third statement evicts the first, but whose error before it makes PostgreSQL
/// skip the eviction's Close along with the Parse.
fn eviction_skipped_after_an_error() -> Vec<u8> {
    [
        parse_message("", "selec bad"),
        parse_message("b", "SELECT 3"),
        sync_message(),
    ]
    .concat()
}

/// `SELECT 1` prepared by another client runs on the server.
fn another_client_runs_select_1(pw: &Pgward) {
    let mut other = pw.client();
    let fresh = other.exchange_within(
        &run_named("c", "SELECT 1"),
        3 * SECOND,
        "the same text, another client",
    );
    assert_row(&fresh, "1", "the same text, another client");
}

#[test]
fn skipped_eviction_close_leaves_the_statement_usable() {
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(&pg, TWO_STATEMENTS);
    let mut client = server_full_of_a_and_a2(&pw);
    let bad = eviction_skipped_after_an_error();
    let refused = client.exchange_within(&bad, 3 * SECOND, "the failed batch");
    assert_eq!(error_code(&refused), "42601", "{}", describe(&refused));

    let again = client.exchange_within(
        &run_prepared("a"),
        3 * SECOND,
        "a after the skipped eviction",
    );
    assert_row(&again, "1", "a after the skipped eviction");
    another_client_runs_select_1(&pw);
}

/// The same, with the statement's next run sent before the failed batch is answered: pgward
/// prepares it again, not knowing yet that the server skipped its Close; the server has it,
/// and the run works as on PostgreSQL itself (and keeps working).
#[test]
fn a_run_pipelined_behind_a_skipped_eviction_close_works() {
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(&pg, TWO_STATEMENTS);
    let mut client = server_full_of_a_and_a2(&pw);
    let pipelined = [eviction_skipped_after_an_error(), run_prepared("a")].concat();
    client.send(&pipelined);
    let refused = client
        .until_ready_within(3 * SECOND)
        .expect("the failed batch");
    assert_eq!(error_code(&refused), "42601", "{}", describe(&refused));
    let behind = client.until_ready_within(3 * SECOND).expect("a behind it");
    assert_row(&behind, "1", "a behind the failed batch");
    assert_eq!(tags(&behind), "2DCZ", "{}", describe(&behind));
    for n in 0..2 {
        let again = client.exchange_within(&run_prepared("a"), 3 * SECOND, "a again");
        assert_row(&again, "1", &format!("a again ({n})"));
    }
    another_client_runs_select_1(&pw);
}

// ---------------------------------------------------------------------------------------------
// What the drain after Terminate learns.

#[test]
fn discard_all_sent_with_terminate_forgets_the_statements() {
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(&pg, TWO_STATEMENTS);
    let mut leaver = pw.client();
    let answer = leaver.exchange_within(&run_named("a", "SELECT 42"), 3 * SECOND, "a");
    assert_row(&answer, "42", "a");
    leaver.send(&[query_message("DISCARD ALL"), terminate_message()].concat());
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
fn parse_failed_before_terminate_is_not_taken_as_prepared() {
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
// server_reset_query_always wipes the server's statements.

#[test]
fn reset_query_always_forgets_the_prepared_statements() {
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
// A failed transaction refuses Parse and DEALLOCATE.

/// Prepares `a` as `SELECT 1`, then opens a transaction and makes it fail.
fn prepare_then_fail(client: &mut Raw) {
    let first = client.exchange_within(&run_named("a", "SELECT 1"), 3 * SECOND, "a");
    assert_row(&first, "1", "a");
    client.value("BEGIN");
    let failed = client.exchange_within(&query_message("SELECT 1/0"), 3 * SECOND, "SELECT 1/0");
    assert_eq!(error_code(&failed), "22012", "{}", describe(&failed));
}

/// What `client` answers to `bytes` sent in a failed transaction, then to ROLLBACK and a use
/// of `a`: the tags and error of each step.
fn in_failed_transaction(client: &mut Raw, bytes: &[u8]) -> Vec<(String, String)> {
    prepare_then_fail(client);
    let refused = client.exchange_within(bytes, 3 * SECOND, "in the failed transaction");
    let rollback = client.exchange_within(&query_message("ROLLBACK"), 3 * SECOND, "ROLLBACK");
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
fn parse_of_a_cached_statement_in_a_failed_transaction_is_refused() {
    let pg = Postgres::start();
    assert_like_postgres(
        &pg,
        &[parse_message("b", "SELECT 1"), sync_message()].concat(),
    );
}

#[test]
fn deallocate_in_a_failed_transaction_is_refused() {
    let pg = Postgres::start();
    assert_like_postgres(&pg, &query_message("DEALLOCATE a"));
}

/// A Parse of a statement the server has, sent behind a ROLLBACK of a failed transaction in
/// the same pipeline (the last status pgward saw says failed), works as on PostgreSQL.
#[test]
fn a_parse_behind_a_rollback_of_a_failed_transaction_works() {
    let (pg, pw) = shared_server();
    let pipeline = [query_message("ROLLBACK"), run_named("b", "SELECT 1")].concat();
    let mut answers = Vec::new();
    for client in [&mut pg.client(), &mut pw.client()] {
        prepare_then_fail(client);
        answers.push(pipeline_then_run(client, &pipeline, 2, "b"));
    }
    assert_eq!(answers[1], answers[0], "pgward, then PostgreSQL");
}

#[test]
fn deallocate_all_in_a_failed_transaction_is_refused() {
    let pg = Postgres::start();
    assert_like_postgres(&pg, &query_message("DEALLOCATE ALL"));
}

/// DISCARD ALL inside a transaction block is refused by PostgreSQL (25001), and the client
/// keeps its statements: after a ROLLBACK they run, as on PostgreSQL.
#[test]
fn discard_all_in_a_transaction_block_keeps_the_statements() {
    let (pg, pw) = shared_server();
    let mut answers = Vec::new();
    for client in [&mut pg.client(), &mut pw.client()] {
        let first = client.exchange_within(&run_named("a", "SELECT 1"), 3 * SECOND, "a");
        assert_row(&first, "1", "a");
        client.value("BEGIN");
        let refused =
            client.exchange_within(&query_message("DISCARD ALL"), 3 * SECOND, "DISCARD ALL");
        let rollback = client.exchange_within(&query_message("ROLLBACK"), 3 * SECOND, "ROLLBACK");
        let after = client.exchange_within(&run_prepared("a"), 3 * SECOND, "a after ROLLBACK");
        answers.push([refused, rollback, after].map(|a| describe(&a)));
    }
    assert!(
        answers[0][0].contains("25001"),
        "PostgreSQL's answer: {:?}",
        answers[0]
    );
    assert_eq!(answers[1], answers[0], "pgward, then PostgreSQL");
}

/// A statement a client prepares by SQL (PREPARE) lives on the server it ran on: that server
/// is closed when given back, so no other client of the pool can run it (by EXECUTE or by a
/// Bind of its name), as no other client could on PostgreSQL; inside the transaction it runs.
#[test]
fn a_statement_prepared_by_sql_is_no_other_clients() {
    let (_pg, pw) = shared_server();
    let mut owner = pw.client();
    let own = owner.exchange_within(
        &query_message("BEGIN; PREPARE s9 AS SELECT 42; EXECUTE s9; COMMIT"),
        3 * SECOND,
        "PREPARE and EXECUTE in one transaction",
    );
    assert!(describe(&own).contains("D"), "{}", describe(&own));
    let prepared = owner.exchange_within(
        &query_message("PREPARE s8 AS SELECT 43"),
        3 * SECOND,
        "PREPARE",
    );
    assert_eq!(error_code(&prepared), "", "{}", describe(&prepared));
    let mut other = pw.client();
    for (what, bytes) in [
        ("EXECUTE", query_message("EXECUTE s8")),
        ("Bind", run_prepared("s8")),
        ("EXECUTE of the first", query_message("EXECUTE s9")),
    ] {
        let answer = other.exchange_within(&bytes, 3 * SECOND, what);
        assert_eq!(
            error_code(&answer),
            "26000",
            "{what}: {}\n{}",
            describe(&answer),
            pw.log()
        );
    }
}

/// A PREPARE whose answer pgward reads only after the client's Terminate (sent with it) closes
/// the server all the same: the next client cannot run the statement.
#[test]
fn a_statement_prepared_by_sql_before_a_terminate_is_no_other_clients() {
    let (_pg, pw) = shared_server();
    let mut owner = pw.client();
    owner.send(
        &[
            query_message("PREPARE s7 AS SELECT 44"),
            terminate_message(),
        ]
        .concat(),
    );
    assert!(owner.closes_within(3 * SECOND), "{}", pw.log());
    let mut other = pw.client();
    let answer = other.exchange_within(&query_message("EXECUTE s7"), 3 * SECOND, "EXECUTE");
    assert_eq!(
        error_code(&answer),
        "26000",
        "{}\n{}",
        describe(&answer),
        pw.log()
    );
}

/// What `client` answers to `pipeline` (`readies` ReadyForQuery in all), then to a run of the
/// statement `name`.
fn pipeline_then_run(client: &mut Raw, pipeline: &[u8], readies: usize, name: &str) -> Vec<String> {
    let answer = client.exchange(pipeline, readies);
    let run = client.exchange_within(&run_prepared(name), 3 * SECOND, name);
    vec![describe(&answer), describe(&run)]
}

/// A statement prepared behind a DEALLOCATE ALL in the same pipeline (sent before the reset
/// is answered) stays the client's, as on PostgreSQL.
#[test]
fn a_name_prepared_behind_a_reset_in_the_same_pipeline_stays() {
    let (pg, pw) = shared_server();
    let simple = [query_message("DEALLOCATE ALL"), run_named("s1", "SELECT 1")].concat();
    let extended = [
        parse_message("", "DEALLOCATE ALL"),
        bind_message(""),
        execute_message(),
        run_named("s2", "SELECT 2"),
    ]
    .concat();
    for (pipeline, readies, name) in [(simple, 2, "s1"), (extended, 1, "s2")] {
        let expected = pipeline_then_run(&mut pg.client(), &pipeline, readies, name);
        let got = pipeline_then_run(&mut pw.client(), &pipeline, readies, name);
        assert_eq!(got, expected, "pgward, then PostgreSQL");
    }
}

/// A Close or DEALLOCATE of a statement that the server skips (an error before it in its
/// batch) drops nothing: the name still runs afterwards, as on PostgreSQL. A Close and a new
/// Parse of the name in one batch still work.
#[test]
fn a_skipped_close_or_deallocate_keeps_the_statement() {
    let (pg, pw) = shared_server();
    let failing = failing_batch_start();
    let close = Batch::new().close(b'S', "s1").bytes;
    let cases = [
        [failing.clone(), close.clone(), sync_message()].concat(),
        [failing, query_message("DEALLOCATE s1"), sync_message()].concat(),
        [close, run_named("s1", "SELECT 2")].concat(),
    ];
    for case in cases {
        let mut answers = Vec::new();
        for client in [&mut pg.client(), &mut pw.client()] {
            let prepared = client.exchange_within(&run_named("s1", "SELECT 1"), 3 * SECOND, "s1");
            assert_row(&prepared, "1", "s1");
            answers.push(pipeline_then_run(client, &case, 1, "s1"));
        }
        assert_eq!(answers[1], answers[0], "pgward, then PostgreSQL");
    }
}

/// A batch that fails before its end (the server skips the rest, up to its Sync).
fn failing_batch_start() -> Vec<u8> {
    [
        parse_message("", "SELECT 1/0"),
        bind_message(""),
        execute_message(),
    ]
    .concat()
}

/// A text prepared in a batch the server skips, then under another name in a later batch
/// sent before the answers: the later batch works as on PostgreSQL (pgward does not answer its
/// Parse itself on the strength of the skipped one).
#[test]
fn a_later_parse_does_not_rely_on_a_parse_the_server_skipped() {
    let (pg, pw) = shared_server();
    let text = "SELECT 4242";
    let pipeline = [
        failing_batch_start(),
        parse_message("a", text),
        sync_message(),
        run_named("b", text),
    ]
    .concat();
    let expected = describe(&pg.client().exchange(&pipeline, 2));
    let got = describe(&pw.client().exchange(&pipeline, 2));
    assert_eq!(got, expected, "pgward, then PostgreSQL");
}

/// A statement closed on the server to make room, prepared again by pgward in a batch the
/// server skips: a run of it in a later batch sent before the answers works as on PostgreSQL.
#[test]
fn a_later_run_does_not_rely_on_a_parse_the_server_skipped() {
    let (pg, pw) = shared_server();
    let pipeline = [
        failing_batch_start(),
        bind_message("c"),
        execute_message(),
        sync_message(),
        run_prepared("c"),
    ]
    .concat();
    let mut answers = Vec::new();
    for client in [&mut pg.client(), &mut pw.client()] {
        // With room for two statements, `c` is closed on the server to make room for `e`.
        for (name, sql) in [
            ("c", "SELECT 'c'"),
            ("d", "SELECT 'd'"),
            ("e", "SELECT 'e'"),
        ] {
            let ran = client.exchange_within(&run_named(name, sql), 3 * SECOND, name);
            assert_row(&ran, &sql[8..9], name);
        }
        answers.push(describe(&client.exchange(&pipeline, 2)));
    }
    assert_eq!(answers[1], answers[0], "pgward, then PostgreSQL");
}

// ---------------------------------------------------------------------------------------------
// pgward's own statement names.

/// PostgreSQL and pgward in transaction pooling on one server.
fn shared_server() -> (Postgres, Pgward) {
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(&pg, TWO_STATEMENTS);
    (pg, pw)
}

/// A client that prepared and ran `a` (`SELECT 1`) on the shared server.
fn owner_of_a(pw: &Pgward) -> Raw {
    let mut owner = pw.client();
    let first = owner.exchange_within(&run_named("a", "SELECT 1"), 3 * SECOND, "a");
    assert_row(&first, "1", "a");
    owner
}

/// Bind, Execute and Sync of `a`.
fn bind_a() -> Vec<u8> {
    [bind_message("a"), execute_message(), sync_message()].concat()
}

/// The owner of `a` after another client freed every statement on the shared server by
/// dynamic SQL (a DO block), which pgward does not read.
fn owner_after_unseen_deallocate(pw: &Pgward) -> Raw {
    let (owner, mut other) = (owner_of_a(pw), pw.client());
    let sql = "DO $$ BEGIN EXECUTE 'DEALLOCATE ALL'; END $$";
    let answer = other.exchange_within(&query_message(sql), 3 * SECOND, sql);
    assert_eq!(error_code(&answer), "", "{}", describe(&answer));
    owner
}

/// Dynamic SQL (a DO block) that frees pgward's statements on a shared server is not seen:
/// the next Bind of one finds it gone (26000), once. The server, whose statements pgward lost
/// track of, is closed rather than reused, and the statement is prepared again on the next.
#[test]
fn statements_freed_unseen_on_a_server_are_prepared_again() {
    let (_pg, pw) = shared_server();
    let mut owner = owner_after_unseen_deallocate(&pw);
    let again = bind_a();
    let answer = owner.exchange_within(&again, 3 * SECOND, "a after");
    assert_eq!(error_code(&answer), "26000", "{}", describe(&answer));
    for round in 0..3 {
        let answer = owner.exchange_within(&again, 3 * SECOND, "a again");
        assert_row(&answer, "1", &format!("a again, {round}"));
    }
}

/// The name pgward's one statement has on the shared server, read by `client`.
fn pgwards_name(client: &mut Raw) -> String {
    let rows = client
        .query("SELECT name FROM pg_prepared_statements WHERE name LIKE 'pgw%'")
        .expect("the server's statements");
    rows.first()
        .and_then(|row| row.first().cloned().flatten())
        .expect("pgward's statement on the shared server")
}

/// The same, where the client says Terminate right after the Bind that finds the statement
/// gone: the server, answered while pgward lets it finish, is not reused either.
#[test]
fn statements_freed_unseen_and_found_missing_at_terminate_retire_the_server() {
    let (_pg, pw) = shared_server();
    let mut owner = owner_after_unseen_deallocate(&pw);
    owner.send(&[bind_a(), terminate_message()].concat());
    assert!(
        owner.closes_within(3 * SECOND),
        "the owner's connection stays open"
    );
    let mut next = pw.client();
    let answer = next.exchange_within(&run_named("a", "SELECT 1"), 3 * SECOND, "a, next");
    assert_row(&answer, "1", "a, next");
}

/// pgward's name of the owner's statement `a`, and a savepoint in a transaction opened after.
fn name_of_a_in_a_transaction(owner: &mut Raw) -> String {
    let name = pgwards_name(owner);
    owner.query("BEGIN").expect("BEGIN");
    owner.query("SAVEPOINT sp").expect("SAVEPOINT");
    name
}

/// After `error` (26000 naming pgward's statement, which the server still has), rolled back to
/// the savepoint, the statement still runs in the same transaction.
fn still_runs_after(owner: &mut Raw, error: &[u8]) {
    let answer = owner.exchange_within(error, 3 * SECOND, "the error");
    assert_eq!(error_code(&answer), "26000", "{}", describe(&answer));
    owner.query("ROLLBACK TO sp").expect("ROLLBACK TO");
    let answer = owner.exchange_within(&bind_a(), 3 * SECOND, "a in the same transaction");
    assert_row(&answer, "1", "a in the same transaction");
}

/// A Bind of pgward's own name by a client fails (26000, under another name that holds
/// pgward's): pgward's statement is still there, and still pgward's.
#[test]
fn a_bind_of_pgwards_own_name_leaves_the_statement_in_place() {
    let (_pg, pw) = shared_server();
    let mut owner = owner_of_a(&pw);
    let name = name_of_a_in_a_transaction(&mut owner);
    let foreign = [bind_message(&name), execute_message(), sync_message()].concat();
    still_runs_after(&mut owner, &foreign);
}

/// An error a client raises itself, with the SQLSTATE and words of a missing statement of
/// pgward's, teaches pgward nothing of its statements.
#[test]
fn a_client_raised_26000_naming_pgwards_statement_leaves_it_in_place() {
    let (_pg, pw) = shared_server();
    let mut owner = owner_of_a(&pw);
    let name = name_of_a_in_a_transaction(&mut owner);
    let raise = format!(
        "DO $$ BEGIN RAISE EXCEPTION USING ERRCODE = '26000', \
         MESSAGE = 'prepared statement \"pgw' || '_{}\" does not exist'; END $$",
        &name[4..]
    );
    still_runs_after(&mut owner, &query_message(&raise));
}

/// The same error raised outside a transaction: the server is not retired for it (its
/// backend serves the next transaction), since it answered no Bind or Describe of pgward's.
#[test]
fn a_client_raised_26000_naming_pgwards_statement_keeps_the_server() {
    let (_pg, pw) = shared_server();
    let mut owner = owner_of_a(&pw);
    let pid = |c: &mut Raw| c.query("SELECT pg_backend_pid()").expect("pid");
    let before = pid(&mut owner);
    let name = pgwards_name(&mut owner);
    let raise = format!(
        "DO $$ BEGIN RAISE EXCEPTION USING ERRCODE = '26000', \
         MESSAGE = 'prepared statement \"pgw' || '_{}\" does not exist'; END $$",
        &name[4..]
    );
    let answer = owner.exchange_within(&query_message(&raise), 3 * SECOND, "the error");
    assert_eq!(error_code(&answer), "26000", "{}", describe(&answer));
    assert_eq!(pid(&mut owner), before, "the server was retired");
}

/// Statements pgward prepares on a server its clients share cannot be freed or redefined by
/// another client's SQL: its next Bind would run what that client put there.
#[test]
fn pgwards_statement_names_are_reserved() {
    let (_pg, pw) = shared_server();
    let (mut owner, mut other) = (owner_of_a(&pw), pw.client());
    let name = pgwards_name(&mut other);
    for sql in [
        format!("DEALLOCATE {name}"),
        format!("DEALLOCATE PREPARE \"{name}\""),
        format!(
            "SELECT 1; DEALLOCATE {}; PREPARE {name} AS SELECT 2",
            name.to_uppercase()
        ),
    ] {
        let answer = other.exchange_within(&query_message(&sql), 3 * SECOND, &sql);
        assert_eq!(error_code(&answer), "42939", "{sql}: {}", describe(&answer));
    }
    let extended = run_named("", &format!("DEALLOCATE {name}"));
    let answer = other.exchange_within(&extended, 3 * SECOND, "extended");
    assert_eq!(error_code(&answer), "42939", "{}", describe(&answer));
    let again = bind_a();
    let answer = owner.exchange_within(&again, 3 * SECOND, "a again");
    assert_row(&answer, "1", "a again");
}

// ---------------------------------------------------------------------------------------------
// The unnamed statement of a Parse the server skipped.

/// A client's Parse of the unnamed statement that the server skips (an error earlier in its
/// batch) leaves the server's unnamed statement as it was, which may be another client's. A
/// Bind of it in a later batch, pipelined before the answers, gets 26000 as on PostgreSQL, and
/// never runs the other client's statement.
#[test]
fn a_later_batch_never_runs_another_clients_unnamed_statement() {
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(&pg, TWO_STATEMENTS);
    let mut x = pw.client();
    let secret = run_named("", "SELECT 'secret of x'");
    let answer = x.exchange_within(&secret, 3 * SECOND, "x's unnamed statement");
    assert_row(&answer, "secret of x", "x's unnamed statement");
    let mut y = pw.client();
    let skipped = [
        parse_message("q", "SELECT 1/0"),
        bind_message("q"),
        execute_message(),
        parse_message("", "SELECT 'mine'"),
        sync_message(),
    ];
    let later = [bind_message(""), execute_message(), sync_message()];
    let bytes = [skipped.concat(), later.concat()].concat();
    let mut answers = Vec::new();
    for client in [&mut y, &mut pg.client()] {
        client.send(&bytes);
        let failed = client
            .until_ready_within(3 * SECOND)
            .expect("the failed batch");
        assert_eq!(error_code(&failed), "22012", "{}", describe(&failed));
        let behind = client
            .until_ready_within(3 * SECOND)
            .expect("the later batch");
        answers.push(describe(&behind));
        assert_eq!(error_code(&behind), "26000", "{}", describe(&behind));
    }
    assert!(!answers[0].contains("secret"), "{}", answers[0]);
}

/// What PostgreSQL and pgward answer to `pipeline` (`readies` ReadyForQuery), each on a new
/// connection that first ran `setup` (one ReadyForQuery): pgward's answers, then PostgreSQL's.
fn both_answer(
    pg: &Postgres,
    pw: &Pgward,
    setup: &[u8],
    pipeline: &[u8],
    readies: usize,
) -> [String; 2] {
    [pw.client(), pg.client()].map(|mut client| {
        if !setup.is_empty() {
            client.exchange(setup, 1);
        }
        describe(&client.exchange(pipeline, readies))
    })
}

/// Batches pipelined behind failed or skipped Parses of the unnamed statement, then a Bind of
/// it in a later batch: it binds what PostgreSQL's answers say the unnamed statement is.
#[test]
fn a_later_bind_of_the_unnamed_statement_follows_the_answers() {
    let (pg, pw) = shared_server();
    let bind_run = [bind_message(""), execute_message(), sync_message()].concat();
    let failed_then_parsed = [
        parse_message("", "SELEC 1"),
        sync_message(),
        run_named("", "SELECT 2"),
        bind_run.clone(),
    ]
    .concat();
    let parsed_then_skipped = [
        parse_message("", "SELECT 'a'"),
        sync_message(),
        parse_message("q", "SELECT 1/0"),
        bind_message("q"),
        execute_message(),
        parse_message("", "SELECT 'b'"),
        sync_message(),
        bind_run,
    ]
    .concat();
    for pipeline in [failed_then_parsed, parsed_then_skipped] {
        let [got, expected] = both_answer(&pg, &pw, &[], &pipeline, 3);
        assert_eq!(got, expected, "pgward, then PostgreSQL");
    }
}

/// A Bind of a name in a later batch than a message that drops or creates it, sent before
/// the answers: a Close the server skipped leaves the statement to run; a Parse it skipped
/// leaves no statement (26000), as on PostgreSQL.
#[test]
fn a_later_bind_of_a_name_waits_for_what_the_server_did_with_it() {
    let (pg, pw) = shared_server();
    let failing = failing_batch_start();
    let skipped_close = [
        failing.clone(),
        Batch::new().close(b'S', "s1").bytes,
        sync_message(),
        run_prepared("s1"),
    ]
    .concat();
    let skipped_parse = [
        failing,
        parse_message("a", "SELECT 'a'"),
        sync_message(),
        run_prepared("a"),
    ]
    .concat();
    let setup = run_named("s1", "SELECT 's1'");
    for pipeline in [skipped_close, skipped_parse] {
        let [got, expected] = both_answer(&pg, &pw, &setup, &pipeline, 2);
        assert_eq!(got, expected, "pgward, then PostgreSQL");
    }
}

/// A second Parse of a name the client has is refused as PostgreSQL refuses it, in the
/// client's words: the error names the client's statement, not pgward's name for it.
#[test]
fn a_second_parse_of_a_name_is_refused_in_the_clients_words() {
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(&pg, TWO_STATEMENTS);
    let twice = |client: &mut Raw| {
        let first = [parse_message("s1", "SELECT 1"), sync_message()].concat();
        let answer = client.exchange_within(&first, 3 * SECOND, "the first Parse");
        assert!(first_error(&answer).is_none(), "{}", describe(&answer));
        let second = [parse_message("s1", "SELECT 2"), sync_message()].concat();
        let answer = client.exchange_within(&second, 3 * SECOND, "the second Parse");
        let error = first_error(&answer).expect("an error");
        (error.code().to_string(), error.message().to_string())
    };
    let expected = twice(&mut pg.client());
    assert_eq!(expected.0, "42P05", "PostgreSQL's answer: {expected:?}");
    assert_eq!(twice(&mut pw.client()), expected, "pgward, then PostgreSQL");
}
