//! COPY FROM STDIN in transaction pooling: through the simple and the extended protocol, a
//! COPY that fails while the client is still sending data, and the server each gives back
//! (or keeps until the client's Sync) when it is over. What the answers say is compared with
//! PostgreSQL's in differential.rs.

mod common;

use std::time::{Duration, Instant};

use common::raw::{
    bind_message, copy_data_message, copy_done_message, describe, describe_portal_message,
    error_code, execute_message, first_error, flush_message, new_client_value, parse_message,
    query_message, sync_message, tags, Message, Raw,
};
use common::relay::{slow_relay, Slowness};
use common::{Pgward, Postgres, HOST, SECOND};

#[test]
fn extended_copy_from_stdin_gives_the_server_back() {
    let pg = Postgres::start();
    pg.sql("CREATE TABLE copied (n int); GRANT ALL ON copied TO PUBLIC");
    let pw = Pgward::transaction_pool(&pg, "default_pool_size = 1\n");
    let mut copier = pw.client();
    // As libpq sends it: Parse, Bind, Describe, Execute, Sync; the data; CopyDone and Sync.
    let batch = [
        parse_message("", "COPY copied FROM STDIN"),
        bind_message(""),
        describe_portal_message(),
        execute_message(),
        sync_message(),
    ]
    .concat();
    copier.send(&batch);
    let started = copier
        .until_tag_within(b'G', 3 * SECOND)
        .unwrap_or_else(|err| panic!("no CopyInResponse: {err}"));
    assert_eq!(tags(&started), "12nG", "{}", describe(&started));
    copier.send(
        &[
            copy_data_message(b"1\n"),
            copy_data_message(b"2\n"),
            copy_done_message(),
            sync_message(),
        ]
        .concat(),
    );
    let done = copier
        .until_ready_within(3 * SECOND)
        .unwrap_or_else(|err| panic!("{err}"));
    assert_eq!(tags(&done), "CZ", "{}", describe(&done));

    // The copier is idle: another client gets the only server.
    assert_eq!(
        new_client_value(
            &pw,
            ("trustuser", "app"),
            "SELECT count(*) FROM copied",
            3 * SECOND
        ),
        Ok("2".to_string()),
        "the server stayed with the idle copier"
    );
    assert_eq!(copier.value("SELECT 'copier again'"), "copier again");
}

/// A client that sends its COPY data, CopyDone and a second Sync without waiting for the
/// CopyInResponse: PostgreSQL ignores the Sync sent with the batch and answers the one after
/// CopyDone, as pgward must let it.
#[test]
fn extended_copy_sent_whole_with_a_sync_after_its_end_is_answered() {
    let pg = Postgres::start();
    let pw = copy_table(&pg);
    let mut copier = pw.client();
    let select = [
        parse_message("", "SELECT 1"),
        bind_message(""),
        execute_message(),
    ]
    .concat();
    // Alone in its batch, and behind a statement answered before the COPY begins.
    for (before, tags_before) in [(Vec::new(), ""), (select, "12DC")] {
        let whole = [
            before,
            parse_message("", "COPY ct FROM STDIN"),
            bind_message(""),
            execute_message(),
            sync_message(),
            copy_data_message(b"1\n2\n"),
            copy_done_message(),
            sync_message(),
        ]
        .concat();
        let answer = copier.exchange_within(&whole, 3 * SECOND, "the whole COPY");
        let want = format!("{tags_before}12GCZ");
        assert_eq!(tags(&answer), want, "{}", describe(&answer));
    }
    assert_eq!(pg.sql("SELECT count(*) FROM ct"), "4", "the copied rows");
    assert_eq!(copier.value("SELECT 'copier again'"), "copier again");
}

#[test]
fn failed_copy_with_data_still_streaming_gives_the_server_back() {
    let pg = Postgres::start();
    pg.sql("CREATE TABLE strict_ints (n int); GRANT ALL ON strict_ints TO PUBLIC");
    // The network to the server is slower than the client, so data waits in pgward.
    let slowness = Slowness {
        cancel_hold: Duration::ZERO,
        cancel_delay: Duration::ZERO,
        first_packet_delay: Duration::ZERO,
        pace: Some((64 * 1024, Duration::from_millis(8))),
    };
    let relay = slow_relay(pg.port, slowness);
    let dbs = format!("app = host={HOST} port={relay} dbname=app\n");
    let pw = Pgward::trusting(
        &pg,
        "pool_mode = transaction\ndefault_pool_size = 1\n",
        &dbs,
    );
    let mut copier = pw.client();
    copier.send(&query_message("COPY strict_ints FROM STDIN"));
    copier
        .until_tag_within(b'G', 3 * SECOND)
        .unwrap_or_else(|err| panic!("{err}"));
    // Valid rows fill the way to the server, then one bad row, then more data until the
    // error comes back: the server reports the error and its ReadyForQuery while pgward
    // still has data queued for it.
    let rows = copy_data_message(&b"1\n".repeat(32 * 1024));
    copier.send(&rows.repeat(64));
    copier.send(&copy_data_message(b"not a number\n"));
    let since = Instant::now();
    while since.elapsed() < 5 * SECOND && !copier.has_input() {
        copier.send(&rows);
    }
    copier.send(&rows.repeat(16));
    copier.send(&copy_done_message());
    let answer = copier
        .until_ready_within(5 * SECOND)
        .unwrap_or_else(|err| panic!("{err}"));
    let fields = first_error(&answer).unwrap_or_else(|| panic!("{}", describe(&answer)));
    assert_eq!(fields.code(), "22P02", "{fields:?}");

    // The copier is now idle: another client gets the only server.
    assert_eq!(
        new_client_value(
            &pw,
            ("trustuser", "app"),
            "SELECT count(*) FROM strict_ints",
            3 * SECOND
        ),
        Ok("0".to_string()),
        "the idle copier kept the server"
    );
}

// ---------------------------------------------------------------------------------------------
// An extended COPY FROM STDIN keeps its server until the client's Sync.

/// Starts `COPY ct FROM STDIN` with Parse, Bind, Execute and Sync (which PostgreSQL ignores
/// during the COPY), sends `data`, CopyDone and Flush, and reads the answer up to `tag`.
fn extended_copy(copier: &mut Raw, data: &[u8], tag: u8) -> Vec<Message> {
    copier.send(
        &[
            parse_message("", "COPY ct FROM STDIN"),
            bind_message(""),
            execute_message(),
            sync_message(),
        ]
        .concat(),
    );
    let started = copier
        .until_tag_within(b'G', 3 * SECOND)
        .unwrap_or_else(|err| panic!("no CopyInResponse: {err}"));
    assert_eq!(tags(&started), "12G", "{}", describe(&started));
    copier.send(
        &[
            copy_data_message(data),
            copy_done_message(),
            flush_message(),
        ]
        .concat(),
    );
    copier
        .until_tag_within(tag, 3 * SECOND)
        .unwrap_or_else(|err| panic!("{err}"))
}

/// Whether anything arrives within `wait`.
fn answers_within(client: &mut Raw, wait: Duration) -> bool {
    client.read_message_within(wait).is_ok()
}

/// A second client sends `sql` while the copier's batch is open, then the copier sends its
/// Sync: whether the second client was answered before that Sync, and its answer.
fn query_during_copy_batch(pw: &Pgward, copier: &mut Raw, sql: &str) -> (bool, Vec<Message>) {
    let mut other = pw.client();
    other.send(&query_message(sql));
    let answered_early = answers_within(&mut other, Duration::from_millis(500));
    let end = copier.exchange_within(&sync_message(), 3 * SECOND, "the copier's Sync");
    assert_eq!(tags(&end), "Z", "{}", describe(&end));
    assert_eq!(end[0].body, b"I", "the copier's transaction status");
    let answer = other
        .until_ready_within(3 * SECOND)
        .unwrap_or_else(|err| panic!("{err}"));
    (answered_early, answer)
}

/// Table `ct` on `pg`, and pgward in transaction pooling with one server.
fn copy_table(pg: &Postgres) -> Pgward {
    pg.sql("CREATE TABLE ct (n int); GRANT ALL ON ct TO PUBLIC");
    Pgward::transaction_pool(pg, "default_pool_size = 1\n")
}

#[test]
fn extended_copy_keeps_its_transaction_until_the_clients_sync() {
    let pg = Postgres::start();
    let pw = copy_table(&pg);
    let mut copier = pw.client();
    let done = extended_copy(&mut copier, b"1\n2\n", b'C');
    assert_eq!(tags(&done), "C", "{}", describe(&done));

    // The COPY's implicit transaction is still open: another client must wait for it.
    let (answered_early, answer) = query_during_copy_batch(&pw, &mut copier, "SELECT 1/0");
    assert!(
        !answered_early,
        "another client ran inside the copier's open COPY transaction"
    );
    assert_eq!(error_code(&answer), "22012", "{}", describe(&answer));
    assert_eq!(pg.sql("SELECT count(*) FROM ct"), "2", "the copied rows");
}

#[test]
fn failed_extended_copy_keeps_its_server_until_the_clients_sync() {
    let pg = Postgres::start();
    let pw = copy_table(&pg);
    let mut copier = pw.client();
    let failed = extended_copy(&mut copier, b"not a number\n", b'E');
    assert_eq!(error_code(&failed), "22P02", "{}", describe(&failed));

    // The server skips everything until the copier's Sync: another client must wait.
    let (answered_early, answer) = query_during_copy_batch(&pw, &mut copier, "SELECT 1");
    assert!(!answered_early, "{}", describe(&answer));
    assert_eq!(
        (error_code(&answer).as_str(), tags(&answer).as_str()),
        ("", "TDCZ"),
        "the query after the failed COPY: {}",
        describe(&answer)
    );
}
