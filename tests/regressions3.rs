//! Regression tests for the faults of the third review: statements pipelined behind COMMIT,
//! statements one client prepared and another ran under transaction pooling, a rolling restart
//! over so_reuseport, a changed forced user on reload, the skip to Sync across a reload, and a
//! refusal raised in a batch. Each test plays the scenario against PostgreSQL through pgward and
//! checks, where a statement should have been stopped, that the table still has its rows. The
//! numbered sections follow the list of faults.

mod common;

use common::raw::{
    self, bind_message, describe, error_code, execute_message, first_error, flush_message,
    parse_message, run_prepared, startup_packet, sync_message, Message, Raw, PROTOCOL_3_0,
};
use common::{read_lossy, shared_tempdir, Pgward, Postgres, SECOND};
use tempfile::TempDir;

/// require_where for the clients that say `application_name=where`; everyone else is free.
const POLICY: &str = r#"
unchecked = "reject"

[[rules]]
rule = "require_where"
when = { application_names = ["where"] }
"#;

/// require_where for the clients over TCP from 127.0.0.1; those on the Unix socket are free.
const POLICY_TCP: &str = r#"
unchecked = "reject"

[[rules]]
rule = "require_where"
when = { clients = ["127.0.0.1/32"] }
"#;

/// The table the refused statements would empty, with its ten rows.
const SCHEMA: &str = "CREATE TABLE t (a int); INSERT INTO t SELECT generate_series(1, 10); \
     GRANT ALL ON t TO PUBLIC";

/// A server with table `t`, and pgward in transaction mode with one server, the policy and
/// `settings`. The directory holds the policy file.
struct Fixture {
    pg: Postgres,
    pw: Pgward,
    _dir: TempDir,
}

impl Fixture {
    fn start(settings: &str) -> Fixture {
        Fixture::with_policy(POLICY, settings)
    }

    fn with_policy(policy: &str, settings: &str) -> Fixture {
        let pg = Postgres::start();
        pg.sql(SCHEMA);
        let dir = shared_tempdir("pgward-policy-");
        let path = dir.path().join("policy.toml");
        std::fs::write(&path, policy).unwrap_or_else(|e| panic!("policy file: {e}"));
        let settings = format!(
            "auth_type = trust\npool_mode = transaction\ndefault_pool_size = 1\n\
             policy_file = {}\n{settings}",
            path.display()
        );
        let pw = Pgward::start(&Pgward::ini(&pg, &settings, ""));
        Fixture { pg, pw, _dir: dir }
    }

    /// A client logged in as `trustuser` with `application_name`.
    fn client(&self, app: &str) -> Raw {
        let params = [
            ("user", "trustuser"),
            ("database", "app"),
            ("application_name", app),
        ];
        Raw::login_within(self.pw.port, &params, 5 * SECOND)
            .unwrap_or_else(|err| panic!("login as {app}: {err}\n{}", self.pw.log()))
    }

    /// Nothing was deleted.
    fn assert_rows_kept(&self) {
        assert_eq!(
            self.pg.sql("SELECT count(*) FROM t"),
            "10",
            "rows of t were deleted"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// 1. a statement pipelined behind COMMIT.

#[test]
fn r1_statement_pipelined_behind_commit_is_read_as_the_server_reads_it() {
    let f = Fixture::start("");
    let mut client = f.client("where");
    client.value("BEGIN");
    client.value("SET LOCAL standard_conforming_strings = off");
    // After COMMIT the setting is on again: 'x\' ends the string and DELETE follows.
    let hidden = r"SELECT 'x\'; DELETE FROM t; --'";
    client.send(&[raw::query_message("COMMIT"), raw::query_message(hidden)].concat());
    let commit = client
        .until_ready_within(3 * SECOND)
        .unwrap_or_else(|err| panic!("{err}"));
    assert_eq!(error_code(&commit), "", "COMMIT: {}", describe(&commit));
    let answer = client
        .until_ready_within(3 * SECOND)
        .unwrap_or_else(|err| panic!("{err}"));
    assert_eq!(
        error_code(&answer),
        "42501",
        "the statement behind COMMIT: {}",
        describe(&answer)
    );
    f.assert_rows_kept();
}

// ---------------------------------------------------------------------------------------------
// 2. a statement another client prepared, run without being judged.

/// Client A (no rule) prepares `DELETE FROM t` as `name`; client B (require_where) then binds
/// `bound` on the same server: B's answer.
fn run_what_another_prepared(f: &Fixture, name: &str, bound: &dyn Fn(&mut Raw) -> String) {
    let mut a = f.client("free");
    let parsed = a.exchange_within(
        &[raw::parse_message(name, "DELETE FROM t"), sync_message()].concat(),
        3 * SECOND,
        "A's Parse",
    );
    assert_eq!(error_code(&parsed), "", "A's Parse: {}", describe(&parsed));
    let mut b = f.client("where");
    let refused = b.exchange_within(
        &raw::query_message("DELETE FROM t"),
        3 * SECOND,
        "B's DELETE",
    );
    assert_eq!(error_code(&refused), "42501", "{}", describe(&refused));
    let name = bound(&mut b);
    let answer = b.exchange_within(&run_prepared(&name), 3 * SECOND, "B's Bind");
    assert_eq!(
        error_code(&answer),
        "26000",
        "B's Bind of {name:?}: {}",
        describe(&answer)
    );
    f.assert_rows_kept();
}

/// Logs in over pgward's Unix socket as `trustuser` with `application_name=where`, sends
/// `bytes` and reads to the second ReadyForQuery: the messages after the login.
fn over_unix_socket(pw: &Pgward, bytes: &[u8]) -> Vec<Message> {
    let path = pw.socket_dir.join(format!(".s.PGSQL.{}", pw.port));
    let mut client = Raw::connect_unix(&path);
    let params = [
        ("user", "trustuser"),
        ("database", "app"),
        ("application_name", "where"),
    ];
    let login = startup_packet(PROTOCOL_3_0, &params);
    client.exchange_within(&login, 3 * SECOND, "login over the Unix socket");
    client.exchange_within(bytes, 3 * SECOND, "over the Unix socket")
}

#[test]
fn r2a_unnamed_statement_of_another_client_is_out_of_reach() {
    let f = Fixture::with_policy(POLICY_TCP, "");
    let parsed = over_unix_socket(
        &f.pw,
        &[parse_message("", "DELETE FROM t"), sync_message()].concat(),
    );
    assert_eq!(error_code(&parsed), "", "A's Parse: {}", describe(&parsed));
    let mut b = f.client("where");
    let refused = b.exchange_within(
        &raw::query_message("DELETE FROM t"),
        3 * SECOND,
        "B's DELETE",
    );
    assert_eq!(error_code(&refused), "42501", "{}", describe(&refused));
    let answer = b.exchange_within(&run_prepared(""), 3 * SECOND, "B's Bind");
    assert_eq!(
        error_code(&answer),
        "26000",
        "B's Bind: {}",
        describe(&answer)
    );
    f.assert_rows_kept();
}

#[test]
fn r2b_named_statement_of_another_client_is_out_of_reach_without_mapping() {
    let f = Fixture::start("max_prepared_statements = 0\n");
    run_what_another_prepared(&f, "stmt_of_a", &|_| "stmt_of_a".to_string());
}

#[test]
fn r2c_pgwards_own_statement_names_are_out_of_reach() {
    let f = Fixture::start("max_prepared_statements = 10\n");
    // B reads the server-side name of A's statement on the server they share.
    run_what_another_prepared(&f, "a", &|b| {
        let name =
            b.value("SELECT name FROM pg_prepared_statements WHERE statement = 'DELETE FROM t'");
        assert!(name.starts_with("pgw_"), "server-side name {name:?}");
        name
    });
}

#[test]
fn r2d_sql_execute_of_another_clients_prepare_is_refused() {
    let f = Fixture::start("");
    let mut a = f.client("free");
    a.value("PREPARE p AS DELETE FROM t");
    let mut b = f.client("where");
    let answer = b.exchange_within(&raw::query_message("EXECUTE p"), 3 * SECOND, "EXECUTE p");
    let fields =
        first_error(&answer).unwrap_or_else(|| panic!("EXECUTE p ran: {}", describe(&answer)));
    assert_eq!(fields.code(), "42501", "{fields:?}");
    assert!(fields.message().contains("unverifiable"), "{fields:?}");
    f.assert_rows_kept();
}

// ---------------------------------------------------------------------------------------------
// 6. the skip to Sync after a refused Parse, across a reload that removes the policy.

#[test]
fn r6_skip_to_sync_holds_when_a_reload_removes_the_policy() {
    let f = Fixture::start("");
    let mut client = f.client("where");
    client.send(&[parse_message("", "DELETE FROM t"), flush_message()].concat());
    let refused = client
        .until_tag_within(b'E', 3 * SECOND)
        .unwrap_or_else(|err| panic!("{err}"));
    assert_eq!(error_code(&refused), "42501", "{}", describe(&refused));
    // The policy goes away before the rest of the batch arrives.
    let ini = read_lossy(&f.pw.ini_path);
    let without: String = ini
        .lines()
        .filter(|line| !line.starts_with("policy_file"))
        .map(|line| format!("{line}\n"))
        .collect();
    std::fs::write(&f.pw.ini_path, without).unwrap_or_else(|e| panic!("ini: {e}"));
    f.pw.reload_and_wait();
    let rest = client.exchange_within(
        &[bind_message(""), execute_message(), sync_message()].concat(),
        3 * SECOND,
        "rest",
    );
    assert_eq!(
        raw::tags(&rest),
        "Z",
        "the rest of the batch is skipped: {}",
        describe(&rest)
    );
    f.assert_rows_kept();
}

// ---------------------------------------------------------------------------------------------
// 7. a refusal raised in a batch is not the client's unnamed statement.

#[test]
fn r7_bind_after_a_refusal_raised_in_a_transaction_finds_no_statement() {
    let f = Fixture::start("");
    let mut client = f.client("where");
    client.value("BEGIN");
    let refused = client.exchange_within(
        &[
            parse_message("", "DELETE FROM t"),
            bind_message(""),
            execute_message(),
            sync_message(),
        ]
        .concat(),
        3 * SECOND,
        "the refused DELETE",
    );
    assert_eq!(error_code(&refused), "42501", "{}", describe(&refused));
    // PostgreSQL would have no unnamed statement after a failed Parse.
    let again = client.exchange_within(
        &run_prepared(""),
        3 * SECOND,
        "Bind of the unnamed statement",
    );
    assert_eq!(error_code(&again), "26000", "{}", describe(&again));
    client.value("ROLLBACK");
    f.assert_rows_kept();
}
