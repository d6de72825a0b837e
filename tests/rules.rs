//! The policy's SQL rules at the session, end to end: each rule refuses what it should and lets
//! the rest through, with psql (simple protocol), pgbench (simple, extended and prepared) and
//! tokio-postgres (extended protocol), alone, in pipelines and in transactions; statements
//! another client prepared on a shared server, which stay out of reach; tags, the parser
//! settings (also for a statement pipelined behind COMMIT), unchecked statements, policy
//! reloads, the learned allowlist and `pgward check`.

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::thread;
use std::time::Duration;

use common::driver::{code, must_connect, must_value};
use common::policy::Policed;
use common::raw::{
    bind_message, command_tag, describe, error_code, execute_message, extended_query, first_error,
    flush_message, function_call_message, parse_message, query_bytes, query_message, run_prepared,
    startup_packet, sync_message, tags, Fields, Message, Raw, PROTOCOL_3_0,
};
use common::{
    client_command, eventually, read_lossy, stderr_of, stdout_of, Pgward, Postgres, HOST, SECOND,
};
use pgward::sql::{Analyzer, Depth, ParseContext};

/// The policy of most tests: each rule narrowed to one application_name, so a case names the
/// rule it exercises; a tenant rule for the tag tests.
const POLICY: &str = r#"
unchecked = "reject"
trusted_roles = ["postgres"]

[tenants.acme]
roles = ["trustuser"]

[[rules]]
rule = "deny_ddl"
when = { application_names = ["ddl"] }

[[rules]]
rule = "require_where"
when = { application_names = ["where"] }

[[rules]]
rule = "index_concurrently"
when = { application_names = ["index"] }

[[rules]]
rule = "schema_allowlist"
schemas = ["public"]
when = { application_names = ["schema"] }

[[rules]]
rule = "deny_functions"
when = { application_names = ["functions"] }

[[rules]]
rule = "read_only"
when = { application_names = ["readonly"] }

[[rules]]
rule = "deny_ddl"
name = "acme_ddl"
when = { tenants = ["acme"] }
"#;

/// Objects the cases use, and the grants the roles need.
const SCHEMA: &str = "CREATE TABLE t (a int); INSERT INTO t SELECT generate_series(1, 10); \
     CREATE SCHEMA secret; CREATE TABLE secret.s (a int); CREATE SEQUENCE seq; \
     CREATE PROCEDURE p() LANGUAGE sql AS 'SELECT 1'; \
     GRANT ALL ON ALL TABLES IN SCHEMA public TO PUBLIC; GRANT ALL ON SEQUENCE seq TO PUBLIC; \
     GRANT USAGE ON SCHEMA secret TO PUBLIC; GRANT ALL ON secret.s TO PUBLIC";

/// require_where for the clients that say `application_name=where`; everyone else is free.
const WHERE_POLICY: &str = r#"
unchecked = "reject"

[[rules]]
rule = "require_where"
when = { application_names = ["where"] }
"#;

/// require_where for the clients over TCP from 127.0.0.1; those on the Unix socket are free.
const WHERE_TCP_POLICY: &str = r#"
unchecked = "reject"

[[rules]]
rule = "require_where"
when = { clients = ["127.0.0.1/32"] }
"#;

/// The table the refused statements would empty, with its ten rows.
const TEN_ROWS: &str = "CREATE TABLE t (a int); INSERT INTO t SELECT generate_series(1, 10); \
     GRANT ALL ON t TO PUBLIC";

/// A server with the objects of `schema`, pgward in transaction mode with a policy, and the
/// policy file (rewritten by reload tests).
struct Fixture(Policed);

impl std::ops::Deref for Fixture {
    type Target = Policed;
    fn deref(&self) -> &Policed {
        &self.0
    }
}

impl Fixture {
    /// The objects of [`SCHEMA`] and a pool of 2.
    fn start(policy: &str) -> Fixture {
        Fixture(Policed::start(
            SCHEMA,
            policy,
            "default_pool_size = 2\nmax_client_conn = 50\ntrack_extra_parameters = search_path\n",
        ))
    }

    /// Table `t` of [`TEN_ROWS`] and one server, with `settings`.
    fn one_server(policy: &str, settings: &str) -> Fixture {
        Fixture(Policed::start(
            TEN_ROWS,
            policy,
            &format!("default_pool_size = 1\n{settings}"),
        ))
    }

    /// A libpq connection string as `user` with `application_name`.
    fn conn(&self, user: &str, app: &str) -> String {
        format!(
            "{} application_name={app}",
            self.pw.connstr(user, None, "app")
        )
    }

    /// psql with verbose errors (SQLSTATE shown), each of `sqls` sent as one Query.
    fn psql(&self, user: &str, app: &str, sqls: &[&str]) -> Output {
        let mut cmd = client_command("psql", None);
        cmd.args(["-X", "-w", "-At", "-v", "ON_ERROR_STOP=1", "-d"])
            .arg(self.conn(user, app))
            .args(["-c", "\\set VERBOSITY verbose"]);
        for sql in sqls {
            cmd.args(["-c", sql]);
        }
        run(&mut cmd)
    }

    /// pgbench running `script` once per client, `-M mode`.
    fn pgbench(&self, app: &str, mode: &str, script: &Path, clients: u32, tx: u32) -> Output {
        let mut cmd = client_command("pgbench", None);
        cmd.env("PGAPPNAME", app)
            .args(["-n", "-h", HOST, "-p", &self.pw.port.to_string(), "-U"])
            .args(["postgres", "-M", mode, "-f"])
            .arg(script)
            .args(["-c", &clients.to_string(), "-t", &tx.to_string(), "app"]);
        run(&mut cmd)
    }

    /// A raw connection logged in as `user` with `application_name`.
    fn raw(&self, user: &str, app: &str) -> Raw {
        self.pw.client_with(&[
            ("user", user),
            ("database", "app"),
            ("application_name", app),
        ])
    }

    /// Nothing was deleted from the table of [`TEN_ROWS`].
    fn assert_rows_kept(&self) {
        assert_eq!(
            self.pg.sql("SELECT count(*) FROM t"),
            "10",
            "rows of t were deleted"
        );
    }
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
}

fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

/// The fingerprint pgward names in the hint for `sql` (read with the server's defaults).
fn fingerprint(sql: &str) -> String {
    Analyzer::new(Depth::Tree, 4)
        .analyze(sql.as_bytes(), &ParseContext::server_defaults())
        .fingerprint_hex()
}

/// What a case expects: `None` to run, or the rule that refuses it.
type Want = Option<&'static str>;

/// (application_name, statement, expectation): every rule's refusals and passes.
const CASES: &[(&str, &str, Want)] = &[
    ("ddl", "CREATE TABLE t_new (a int)", Some("deny_ddl")),
    ("ddl", "DO $$BEGIN END$$", Some("deny_ddl")),
    ("ddl", "CALL p()", Some("deny_ddl")),
    ("ddl", "SELECT a INTO t_copy FROM t", Some("deny_ddl")),
    (
        "ddl",
        "EXPLAIN ANALYZE CREATE TABLE t_new AS SELECT 1",
        Some("deny_ddl"),
    ),
    (
        "ddl",
        "WITH x AS (SELECT a FROM t) SELECT count(*) FROM x",
        None,
    ),
    ("ddl", "EXPLAIN SELECT * FROM t", None),
    ("ddl", "SELEC 1", Some("unchecked")),
    ("where", "DELETE FROM t", Some("require_where")),
    ("where", "UPDATE t SET a = a", Some("require_where")),
    ("where", "TRUNCATE t", Some("require_where")),
    (
        "where",
        "WITH d AS (DELETE FROM t RETURNING a) SELECT count(*) FROM d",
        Some("require_where"),
    ),
    ("where", "UPDATE t SET a = a WHERE true", None),
    ("where", "DELETE FROM t WHERE a < 0", None),
    ("index", "CREATE INDEX ON t (a)", Some("index_concurrently")),
    ("index", "REINDEX TABLE t", Some("index_concurrently")),
    (
        "index",
        "REINDEX (CONCURRENTLY false) TABLE t",
        Some("index_concurrently"),
    ),
    (
        "index",
        "REINDEX (CONCURRENTLY off) TABLE t",
        Some("index_concurrently"),
    ),
    (
        "index",
        "DROP INDEX IF EXISTS t_none",
        Some("index_concurrently"),
    ),
    (
        "index",
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS t_a ON t (a)",
        None,
    ),
    ("index", "DROP INDEX CONCURRENTLY IF EXISTS t_none", None),
    ("index", "REINDEX TABLE CONCURRENTLY t", None),
    ("schema", "SELECT * FROM secret.s", Some("schema_allowlist")),
    (
        "schema",
        "SET search_path = secret",
        Some("schema_allowlist"),
    ),
    (
        "schema",
        "SET search_path = public, secret",
        Some("schema_allowlist"),
    ),
    (
        "schema",
        "SELECT set_config('search_path', 'secret', false)",
        Some("schema_allowlist"),
    ),
    ("schema", "SELECT count(*) FROM public.t", None),
    ("schema", "SELECT count(*) FROM pg_catalog.pg_class", None),
    ("schema", "SET search_path = public", None),
    (
        "schema",
        "SELECT set_config('search_path', 'public', false)",
        None,
    ),
    (
        "functions",
        "SELECT pg_terminate_backend(0)",
        Some("deny_functions"),
    ),
    (
        "functions",
        "SELECT pg_catalog.pg_advisory_lock(1)",
        Some("deny_functions"),
    ),
    (
        "functions",
        "SELECT 1 WHERE EXISTS (SELECT pg_cancel_backend(0))",
        Some("deny_functions"),
    ),
    ("functions", "SELECT lower('X'), now()", None),
    ("functions", "SELECT pg_advisory_xact_lock(1)", None),
    ("readonly", "INSERT INTO t VALUES (1)", Some("read_only")),
    ("readonly", "SELECT nextval('seq')", Some("read_only")),
    ("readonly", "SELECT * FROM t FOR UPDATE", Some("read_only")),
    ("readonly", "BEGIN READ WRITE", Some("read_only")),
    (
        "readonly",
        "SET default_transaction_read_only = off",
        Some("read_only"),
    ),
    ("readonly", "SELECT count(*) FROM t", None),
    ("readonly", "SHOW search_path", None),
];

/// Checks psql's verbose error output for a refusal by `rule` of `sql`.
fn assert_psql_refused(out: &Output, rule: &str, sql: &str) {
    let err = stderr_of(out);
    assert!(!out.status.success(), "{sql}: psql succeeded");
    assert!(
        err.contains(&format!(
            "ERROR:  42501: pgward: statement refused by rule {rule}"
        )),
        "{sql}: {err}"
    );
    let fp = if rule == "unchecked" {
        "none".to_string()
    } else {
        fingerprint(sql)
    };
    assert!(
        err.contains(&format!("HINT:  rule {rule}: "))
            && err.contains(&format!("fingerprint {fp}")),
        "{sql}: hint should name {rule} and {fp}: {err}"
    );
}

/// Checks a driver error for a refusal by `rule` of `sql`.
fn assert_driver_refused(err: &tokio_postgres::Error, rule: &str, sql: &str) {
    assert_eq!(code(err), "42501", "{sql}: {err:?}");
    let db = err.as_db_error().expect("a server error");
    assert_eq!(
        db.message(),
        format!("pgward: statement refused by rule {rule}"),
        "{sql}"
    );
    let hint = db.hint().unwrap_or("");
    let fp = if rule == "unchecked" {
        "none".to_string()
    } else {
        fingerprint(sql)
    };
    assert!(
        hint.starts_with(&format!("rule {rule}: ")) && hint.ends_with(&format!("fingerprint {fp}")),
        "{sql}: {hint}"
    );
}

/// Checks a raw client's error for a refusal by `rule`.
fn assert_raw_refused(fields: &Fields, rule: &str) {
    assert_eq!(fields.code(), "42501", "{fields:?}");
    assert_eq!(
        fields.message(),
        format!("pgward: statement refused by rule {rule}")
    );
    assert!(
        fields.hint().starts_with(&format!("rule {rule}: ")),
        "{fields:?}"
    );
}

/// Nothing a refused case would have done happened.
fn assert_untouched(pg: &Postgres) {
    assert_eq!(pg.sql("SELECT count(*) FROM t"), "10");
    assert_eq!(
        pg.sql("SELECT count(*) FROM pg_class WHERE relname IN ('t_new', 't_copy')"),
        "0"
    );
    assert_eq!(pg.sql("SELECT last_value FROM seq"), "1");
}

#[test]
fn every_rule_through_psql() {
    let f = Fixture::start(POLICY);
    for (app, sql, want) in CASES {
        let out = f.psql("postgres", app, &[sql]);
        match want {
            None => assert!(out.status.success(), "{app}: {sql}: {}", stderr_of(&out)),
            Some(rule) => assert_psql_refused(&out, rule, sql),
        }
    }
    assert_untouched(&f.pg);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rule_through_a_driver_with_prepared_statements() {
    let f = Fixture::start(POLICY);
    // More clients than servers: each application's connection stays open across its cases.
    let mut conns = std::collections::BTreeMap::new();
    for (app, _, _) in CASES {
        if !conns.contains_key(app) {
            conns.insert(*app, must_connect(&f.conn("postgres", app)).await);
        }
    }
    for (app, sql, want) in CASES {
        let client = &conns[app].client;
        let prepared = client.prepare(sql).await;
        match (want, prepared) {
            (None, Ok(statement)) => {
                if let Err(e) = client.execute(&statement, &[]).await {
                    panic!("{app}: {sql}: {e:?}");
                }
            }
            (None, Err(e)) => panic!("{app}: {sql}: {e:?}"),
            (Some(rule), Err(e)) => assert_driver_refused(&e, rule, sql),
            (Some(_), Ok(_)) => panic!("{app}: {sql}: prepared"),
        }
        // The connection is usable after each refusal.
        assert_eq!(must_value(client, "SELECT 1").await, "1");
    }
    assert_untouched(&f.pg);
}

#[test]
fn every_rule_through_pgbench_simple_extended_and_prepared() {
    let f = Fixture::start(POLICY);
    let dir = tempfile::tempdir().expect("tempdir");
    for (i, (app, sql, want)) in CASES.iter().enumerate() {
        let script = dir.path().join(format!("case{i}.sql"));
        write(&script, &format!("{sql};\n"));
        for mode in ["simple", "extended", "prepared"] {
            let out = f.pgbench(app, mode, &script, 1, 1);
            let err = stderr_of(&out);
            match want {
                None => assert!(out.status.success(), "{mode} {app}: {sql}: {err}"),
                Some(rule) => {
                    assert!(!out.status.success(), "{mode} {app}: {sql}: ran");
                    assert!(
                        err.contains(&format!("pgward: statement refused by rule {rule}")),
                        "{mode} {app}: {sql}: {err}"
                    );
                }
            }
        }
    }
    assert_untouched(&f.pg);
}

#[test]
fn pgbench_clients_outnumber_servers_under_the_rules() {
    let f = Fixture::start(POLICY);
    let dir = tempfile::tempdir().expect("tempdir");
    let allowed = dir.path().join("allowed.sql");
    write(
        &allowed,
        "SELECT count(*) FROM t;\nSELECT a FROM t WHERE a = 3;\nSHOW search_path;\n",
    );
    let refused = dir.path().join("refused.sql");
    write(&refused, "SELECT 1;\nINSERT INTO t VALUES (1);\n");
    for mode in ["simple", "extended", "prepared"] {
        let out = f.pgbench("readonly", mode, &allowed, 6, 20);
        assert!(out.status.success(), "{mode}: {}", stderr_of(&out));
        assert!(
            stdout_of(&out).contains("number of transactions actually processed: 120/120"),
            "{mode}: {}",
            stdout_of(&out)
        );
        let out = f.pgbench("readonly", mode, &refused, 4, 5);
        assert!(!out.status.success(), "{mode}: refused script ran");
        assert!(
            stderr_of(&out).contains("pgward: statement refused by rule read_only"),
            "{mode}: {}",
            stderr_of(&out)
        );
    }
    assert_untouched(&f.pg);
}

#[test]
fn a_refusal_inside_a_transaction_aborts_it() {
    let f = Fixture::start(POLICY);
    let mut raw = f.raw("postgres", "ddl");
    raw.query("BEGIN").expect("BEGIN");
    raw.query("INSERT INTO t VALUES (100)").expect("INSERT");
    let err = raw
        .query("CREATE TABLE t_new (a int)")
        .expect_err("refused");
    assert_raw_refused(&err, "deny_ddl");
    let err = raw.query("SELECT 1").expect_err("aborted");
    assert_eq!(err.code(), "25P02", "{err:?}");
    raw.send(&query_message("COMMIT"));
    let answer = raw.read_to_ready();
    assert_eq!(tags(&answer), "CZ");
    assert_eq!(command_tag(&answer[0]), "ROLLBACK");
    assert_eq!(answer[1].body, b"I");
    // The same outside a transaction: refused, and the session goes on.
    let err = raw
        .query("CREATE TABLE t_new (a int)")
        .expect_err("refused");
    assert_raw_refused(&err, "deny_ddl");
    assert_eq!(raw.value("SELECT 2"), "2");
    assert_untouched(&f.pg);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_prepare_inside_a_transaction_aborts_it() {
    let f = Fixture::start(POLICY);
    let conn = must_connect(&f.conn("postgres", "where")).await;
    let client = &conn.client;
    client.batch_execute("BEGIN").await.expect("BEGIN");
    client
        .execute("INSERT INTO t VALUES (100)", &[])
        .await
        .expect("INSERT");
    let err = client.prepare("DELETE FROM t").await.expect_err("refused");
    assert_driver_refused(&err, "require_where", "DELETE FROM t");
    let err = client.execute("SELECT 1", &[]).await.expect_err("aborted");
    assert_eq!(code(&err), "25P02");
    client.batch_execute("COMMIT").await.expect("COMMIT");
    assert_untouched(&f.pg);
    assert_eq!(must_value(client, "SELECT count(*) FROM t").await, "10");
}

#[test]
fn a_refusal_in_a_pipeline_fails_the_batch() {
    let f = Fixture::start(POLICY);
    let mut raw = f.raw("postgres", "ddl");
    // Allowed insert, refused DDL, another insert, one Sync.
    let mut batch = extended_query("INSERT INTO t VALUES (100)");
    batch.extend_from_slice(&extended_query("CREATE TABLE t_new (a int)"));
    batch.extend_from_slice(&extended_query("INSERT INTO t VALUES (101)"));
    batch.extend_from_slice(&sync_message());
    raw.send(&batch);
    let answer = raw.read_to_ready();
    // ParseComplete, BindComplete, CommandComplete for the insert; the error in place of the
    // refused Parse's answer; nothing for the rest; ReadyForQuery idle.
    assert_eq!(tags(&answer), "12CEZ", "{answer:?}");
    assert_eq!(command_tag(&answer[2]), "INSERT 0 1");
    assert_raw_refused(&Fields::parse(&answer[3].body), "deny_ddl");
    assert_eq!(answer[4].body, b"I");
    assert_eq!(raw.value("SELECT count(*) FROM t"), "10");
    assert_untouched(&f.pg);
}

#[test]
fn a_refused_parse_alone_skips_to_sync() {
    let f = Fixture::start(POLICY);
    let mut raw = f.raw("postgres", "ddl");
    let mut batch = parse_message("s1", "CREATE TABLE t_new (a int)");
    batch.extend_from_slice(&bind_message("s1"));
    batch.extend_from_slice(&execute_message());
    batch.extend_from_slice(&extended_query("INSERT INTO t VALUES (101)"));
    batch.extend_from_slice(&sync_message());
    raw.send(&batch);
    let answer = raw.read_to_ready();
    assert_eq!(tags(&answer), "EZ", "{answer:?}");
    assert_raw_refused(&Fields::parse(&answer[0].body), "deny_ddl");
    assert_eq!(answer[1].body, b"I");
    // The next batch runs normally.
    let mut batch = extended_query("SELECT count(*) FROM t");
    batch.extend_from_slice(&sync_message());
    raw.send(&batch);
    assert_eq!(tags(&raw.read_to_ready()), "12DCZ");
    assert_untouched(&f.pg);
}

#[test]
fn skip_to_sync_holds_when_a_reload_removes_the_policy() {
    let f = Fixture::one_server(WHERE_POLICY, "");
    let mut client = f.raw("trustuser", "where");
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
        tags(&rest),
        "Z",
        "the rest of the batch is skipped: {}",
        describe(&rest)
    );
    f.assert_rows_kept();
}

#[test]
fn bind_after_a_refusal_raised_in_a_transaction_finds_no_statement() {
    let f = Fixture::one_server(WHERE_POLICY, "");
    let mut client = f.raw("trustuser", "where");
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tags_count_only_from_trusted_roles() {
    let f = Fixture::start(POLICY);
    // trustuser is tenant acme: its own tag cannot move it to another tenant.
    let untrusted = f.psql(
        "trustuser",
        "tags",
        &["CREATE TABLE tag_a (a int) /*tenant='free'*/"],
    );
    assert_psql_refused(
        &untrusted,
        "acme_ddl",
        "CREATE TABLE tag_a (a int) /*tenant='free'*/",
    );
    let out = f.psql("trustuser", "tags", &["SELECT 1 /*tenant='free'*/"]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    // postgres is trusted: its tag names the tenant.
    let sql = "CREATE TABLE tag_b (a int) /*tenant='acme'*/";
    let out = f.psql("postgres", "tags", &[sql]);
    assert_psql_refused(&out, "acme_ddl", sql);
    let out = f.psql(
        "postgres",
        "tags",
        &["CREATE TABLE tag_c (a int) /*tenant='free'*/"],
    );
    assert!(out.status.success(), "{}", stderr_of(&out));
    // A tag inside a string literal is no tag.
    let conn = must_connect(&f.conn("postgres", "tags")).await;
    let sql = "CREATE TABLE tag_d (a text DEFAULT '/*tenant=''acme''*/')";
    conn.client.execute(sql, &[]).await.expect("not a tag");
    let err = conn
        .client
        .execute("CREATE TABLE tag_e (a int) /*tenant='acme'*/", &[])
        .await
        .expect_err("refused");
    assert_driver_refused(
        &err,
        "acme_ddl",
        "CREATE TABLE tag_e (a int) /*tenant='acme'*/",
    );
    assert!(
        eventually(Duration::from_secs(5), || f.pw.log().contains(
            "tags from a role that is not in trusted_roles are ignored"
        )),
        "{}",
        f.pw.log()
    );
    assert_eq!(
        f.pg.sql("SELECT string_agg(relname, ',' ORDER BY relname) FROM pg_class WHERE relname LIKE 'tag_%'"),
        "tag_c,tag_d"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_path_at_startup_is_judged() {
    let f = Fixture::start(POLICY);
    let mut raw = Raw::connect(f.pw.port);
    let refused = raw
        .startup(&[
            ("user", "postgres"),
            ("database", "app"),
            ("application_name", "schema"),
            ("options", "-c search_path=secret"),
        ])
        .expect_err("refused");
    assert_eq!(refused.code(), "42501", "{refused:?}");
    assert!(
        refused.hint().starts_with("rule schema_allowlist: "),
        "{refused:?}"
    );
    let mut raw = Raw::connect(f.pw.port);
    raw.startup(&[
        ("user", "postgres"),
        ("database", "app"),
        ("application_name", "schema"),
        ("options", "-c search_path=public"),
    ])
    .expect("allowed");
    assert_eq!(raw.value("SHOW search_path"), "public");
    // Through a driver, and for another application the rule does not apply.
    let conn = must_connect(&format!(
        "{} options='-c search_path=secret'",
        f.conn("postgres", "ddl")
    ))
    .await;
    assert_eq!(must_value(&conn.client, "SHOW search_path").await, "secret");
    let denied = common::driver::connect(&format!(
        "{} options='-c search_path=secret,public'",
        f.conn("postgres", "schema")
    ))
    .await;
    match denied {
        Ok(_) => panic!("a startup search_path outside the allowlist was accepted"),
        Err(e) => assert_eq!(code(&e), "42501", "{e:?}"),
    }
}

#[test]
fn standard_conforming_strings_off_is_read_as_the_server_reads_it() {
    let f = Fixture::start(POLICY);
    let mut raw = f.raw("postgres", "ddl");
    // standard_conforming_strings on: 'a\' ends the string and DROP TABLE follows.
    let hidden_drop = r"select 'a\'; drop table t; --'";
    let err = raw.query(hidden_drop).expect_err("refused");
    assert_raw_refused(&err, "deny_ddl");
    raw.query("SET standard_conforming_strings = off")
        .expect("SET");
    // Off: \' is a quote inside the string, so the text is one SELECT.
    assert_eq!(raw.value(hidden_drop), "a'; drop table t; --");
    // Off: here the dollar quote is inside the string, and DROP TABLE follows it.
    let err = raw
        .query(r"select 'a\', $$'; drop table t; --$$")
        .expect_err("refused");
    assert_raw_refused(&err, "deny_ddl");
    raw.query("RESET standard_conforming_strings")
        .expect("RESET");
    assert_eq!(raw.value(r"select 'a\', $$'; drop table t; --$$").len(), 2);
    assert_untouched(&f.pg);
}

#[test]
fn backslashes_are_unchecked_while_the_setting_may_change() {
    let f = Fixture::start(POLICY);
    let mut raw = f.raw("postgres", "ddl");
    let mut both = query_message("SET standard_conforming_strings = off");
    both.extend_from_slice(&query_message(r"select 'a\'"));
    raw.send(&both);
    raw.read_result(Duration::from_secs(10)).expect("SET");
    let err = raw
        .read_result(Duration::from_secs(10))
        .expect_err("refused");
    assert_raw_refused(&err, "unchecked");
    // Once nothing is in flight, the setting is known again.
    assert_eq!(raw.value(r"select 'a\'b'"), "a'b");
}

/// A batch left open (answered through Flush, no Sync) may have changed how the server reads
/// the next text: PostgreSQL reports a changed setting only before its ReadyForQuery, so a text
/// whose reading depends on it is unchecked there, not judged under the setting of before.
#[test]
fn backslashes_are_unchecked_in_a_batch_left_open() {
    let f = Fixture::start(POLICY);
    let mut raw = f.raw("postgres", "schema");
    let set = [
        parse_message("", "SET standard_conforming_strings = off"),
        bind_message(""),
        execute_message(),
        flush_message(),
    ];
    raw.send(&set.concat());
    raw.until_tag_within(b'C', 10 * SECOND)
        .unwrap_or_else(|err| panic!("SET: {err}"));
    // On: one SELECT of two strings and a comment. Off: a string, then secret.s's rows.
    let hidden = r"SELECT '\', ' , (SELECT count(*) FROM secret.s) , '--'";
    raw.send(&[parse_message("s", hidden), flush_message()].concat());
    let err = raw.expect_error_within(10 * SECOND);
    assert_raw_refused(&err, "unchecked");
    raw.send(&sync_message());
    raw.until_ready_within(10 * SECOND)
        .unwrap_or_else(|err| panic!("Sync: {err}"));
}

#[test]
fn statement_pipelined_behind_commit_is_read_as_the_server_reads_it() {
    let f = Fixture::one_server(WHERE_POLICY, "");
    let mut client = f.raw("trustuser", "where");
    client.value("BEGIN");
    client.value("SET LOCAL standard_conforming_strings = off");
    // After COMMIT the setting is on again: 'x\' ends the string and DELETE follows.
    let hidden = r"SELECT 'x\'; DELETE FROM t; --'";
    client.send(&[query_message("COMMIT"), query_message(hidden)].concat());
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

#[test]
fn a_first_query_is_judged_with_the_application_name_the_server_made_of_it() {
    // PostgreSQL keeps only printable ASCII in application_name: up to 15 each other byte
    // becomes '?', from 16 on an escape. The rule names what the server makes of `café`.
    let policy = r#"
unchecked = "reject"

[[rules]]
rule = "require_where"
when = { application_names = ["caf??", "caf\\xc3\\xa9"] }
"#;
    let f = Fixture::one_server(policy, "");
    // The first Query of the session is admitted with the name the client sent, and runs
    // once the server has been told it (and said what it made of it).
    let out = f.psql("trustuser", "café", &["DELETE FROM t"]);
    assert_psql_refused(&out, "require_where", "DELETE FROM t");
    f.assert_rows_kept();
}

/// Client A (no rule) prepares `DELETE FROM t` as `name`; client B (require_where) then binds
/// `bound` on the same server: B's answer.
fn run_what_another_prepared(f: &Fixture, name: &str, bound: &dyn Fn(&mut Raw) -> String) {
    let mut a = f.raw("trustuser", "free");
    let parsed = a.exchange_within(
        &[parse_message(name, "DELETE FROM t"), sync_message()].concat(),
        3 * SECOND,
        "A's Parse",
    );
    assert_eq!(error_code(&parsed), "", "A's Parse: {}", describe(&parsed));
    let mut b = f.raw("trustuser", "where");
    let refused = b.exchange_within(&query_message("DELETE FROM t"), 3 * SECOND, "B's DELETE");
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
fn unnamed_statement_of_another_client_is_out_of_reach() {
    let f = Fixture::one_server(WHERE_TCP_POLICY, "");
    let parsed = over_unix_socket(
        &f.pw,
        &[parse_message("", "DELETE FROM t"), sync_message()].concat(),
    );
    assert_eq!(error_code(&parsed), "", "A's Parse: {}", describe(&parsed));
    let mut b = f.raw("trustuser", "where");
    let refused = b.exchange_within(&query_message("DELETE FROM t"), 3 * SECOND, "B's DELETE");
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
fn named_statement_of_another_client_is_out_of_reach_without_mapping() {
    let f = Fixture::one_server(WHERE_POLICY, "max_prepared_statements = 0\n");
    run_what_another_prepared(&f, "stmt_of_a", &|_| "stmt_of_a".to_string());
}

#[test]
fn pgwards_own_statement_names_are_out_of_reach() {
    let f = Fixture::one_server(WHERE_POLICY, "max_prepared_statements = 10\n");
    // B reads the server-side name of A's statement on the server they share.
    run_what_another_prepared(&f, "a", &|b| {
        let name =
            b.value("SELECT name FROM pg_prepared_statements WHERE statement = 'DELETE FROM t'");
        assert!(name.starts_with("pgw_"), "server-side name {name:?}");
        name
    });
}

#[test]
fn sql_execute_of_another_clients_prepare_is_refused() {
    let f = Fixture::one_server(WHERE_POLICY, "");
    let mut a = f.raw("trustuser", "free");
    a.value("PREPARE p AS DELETE FROM t");
    let mut b = f.raw("trustuser", "where");
    let answer = b.exchange_within(&query_message("EXECUTE p"), 3 * SECOND, "EXECUTE p");
    let fields =
        first_error(&answer).unwrap_or_else(|| panic!("EXECUTE p ran: {}", describe(&answer)));
    assert_eq!(fields.code(), "42501", "{fields:?}");
    assert!(fields.message().contains("unverifiable"), "{fields:?}");
    f.assert_rows_kept();
}

/// The oid of `abs(integer)`, for fast-path calls.
fn abs_oid(pg: &Postgres) -> u32 {
    pg.sql("SELECT 'abs(integer)'::regprocedure::oid")
        .parse()
        .expect("oid")
}

const RELOAD_BAD: &str = "unchecked = \"reject\"\n[[rules]]\nrule = \"no_such_rule\"\n";

const RELOAD_NEW: &str = r#"
unchecked = "allow"

[[rules]]
rule = "require_where"
"#;

#[test]
fn unchecked_statements_and_policy_reloads() {
    let f = Fixture::start(POLICY);
    let oid = abs_oid(&f.pg);
    // unchecked = "reject": parse errors and fast-path calls are refused.
    let mut raw = f.raw("postgres", "ddl");
    let err = raw.query("SELEC 1").expect_err("refused");
    assert_raw_refused(&err, "unchecked");
    raw.send(&function_call_message(oid, &["-5"]));
    let answer = raw.read_to_ready();
    assert_eq!(tags(&answer), "EZ", "{answer:?}");
    assert_raw_refused(&Fields::parse(&answer[0].body), "unchecked");
    // An invalid file changes nothing and says where.
    f.reload_with(RELOAD_BAD);
    let where_ = format!("{}:3", f.policy.display());
    assert!(
        eventually(Duration::from_secs(10), || f.pw.log().contains(&where_)),
        "no {where_} in the log:\n{}",
        f.pw.log()
    );
    let out = f.psql("postgres", "ddl", &["CREATE TABLE t_new (a int)"]);
    assert_psql_refused(&out, "deny_ddl", "CREATE TABLE t_new (a int)");
    // A valid one applies to the next statements, on sessions already open too.
    f.reload_with(RELOAD_NEW);
    assert!(
        eventually(Duration::from_secs(10), || f
            .psql(
                "postgres",
                "ddl",
                &["CREATE TABLE IF NOT EXISTS t_made (a int)"]
            )
            .status
            .success()),
        "{}",
        f.pw.log()
    );
    let err = raw.query("DELETE FROM t").expect_err("refused");
    assert_raw_refused(&err, "require_where");
    // unchecked = "allow": PostgreSQL answers them.
    let err = raw.query("SELEC 1").expect_err("syntax error");
    assert_eq!(err.code(), "42601", "{err:?}");
    raw.send(&function_call_message(oid, &["-5"]));
    let answer = raw.read_to_ready();
    assert_eq!(tags(&answer), "VZ", "{answer:?}");
    assert!(answer[0].body.ends_with(b"5"), "{answer:?}");
    assert_untouched(&f.pg);
}

const LEARN: &str = r#"
[allowlist]
file = "allow.json"
roles = { trustuser = "learn" }
"#;

const ENFORCE: &str = r#"
[allowlist]
file = "allow.json"
roles = { trustuser = "enforce" }
"#;

#[test]
fn the_learned_allowlist_learns_then_enforces() {
    let f = Fixture::start(LEARN);
    let file = f.policy.with_file_name("allow.json");
    for sql in ["SELECT a FROM t WHERE a = 1", "SELECT count(*) FROM t"] {
        let out = f.psql("trustuser", "agent", &[sql]);
        assert!(out.status.success(), "{sql}: {}", stderr_of(&out));
    }
    // A reload writes what was learned before reading the policy again.
    f.reload_with(ENFORCE);
    let learned = fingerprint("SELECT a FROM t WHERE a = 1");
    assert!(
        eventually(Duration::from_secs(10), || std::fs::read_to_string(&file)
            .is_ok_and(|t| t.contains(&learned))),
        "{}",
        f.pw.log()
    );
    let text = std::fs::read_to_string(&file).expect("allowlist");
    let list: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(
        list["trustuser"].as_object().map(|o| o.len()),
        Some(2),
        "{text}"
    );
    assert!(
        text.contains(&fingerprint("SELECT count(*) FROM t")),
        "{text}"
    );
    let refused = "SELECT a FROM t";
    assert!(
        eventually(Duration::from_secs(10), || !f
            .psql("trustuser", "agent", &[refused])
            .status
            .success()),
        "{}",
        f.pw.log()
    );
    assert_psql_refused(
        &f.psql("trustuser", "agent", &[refused]),
        "allowlist",
        refused,
    );
    // The same shape with other constants is allowed; other roles are not concerned.
    let out = f.psql("trustuser", "agent", &["SELECT a FROM t WHERE a = 42"]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let out = f.psql("postgres", "agent", &[refused]);
    assert!(out.status.success(), "{}", stderr_of(&out));
}

fn check_command(policy: &Path, corpus: &Path) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pgward"));
    cmd.current_dir(env!("CARGO_MANIFEST_DIR"))
        .arg("check")
        .arg("--policy")
        .arg(policy)
        .arg(corpus);
    run(&mut cmd)
}

#[test]
fn check_runs_the_shipped_corpus() {
    let out = check_command(
        Path::new("etc/presets/ai-agent.toml"),
        Path::new("tests/check_corpus/ai-agent.sql"),
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout_of(&out),
        stderr_of(&out)
    );
}

#[test]
fn check_reports_a_wrong_expectation() {
    let dir = tempfile::tempdir().expect("tempdir");
    let corpus = dir.path().join("wrong.sql");
    write(
        &corpus,
        "-- as role=agent\n-- allow\nSELECT 1;\n-- reject\nSELECT count(*) FROM orders;\n",
    );
    let out = check_command(Path::new("etc/presets/ai-agent.toml"), &corpus);
    assert_eq!(out.status.code(), Some(1), "{}", stderr_of(&out));
    let text = format!("{}{}", stdout_of(&out), stderr_of(&out));
    assert!(
        text.contains(&format!("{}:4: want reject, got allow", corpus.display())),
        "{text}"
    );
    assert!(!text.contains(":2:"), "{text}");
}

#[test]
fn clients_share_servers_while_refused() {
    let f = Fixture::start(POLICY);
    thread::scope(|scope| {
        let workers: Vec<_> = (0..6)
            .map(|i| {
                let f = &f;
                scope.spawn(move || {
                    let mut raw = f.raw("postgres", "where");
                    for n in 0..20 {
                        let err = raw.query("DELETE FROM t").expect_err("refused");
                        assert_raw_refused(&err, "require_where");
                        assert_eq!(raw.value(&format!("SELECT {i} + {n}")), (i + n).to_string());
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().expect("worker");
        }
    });
    assert_untouched(&f.pg);
}

#[test]
fn the_gate_names_no_tenant_from_bytes_the_server_never_reads() {
    // 0xe9 alone is no UTF-8: the gate cannot read the text, so it names no tenant from its
    // tag (nor prices it). A copy with U+FFFD in its place would read tenant `a`, which is
    // killed: the statement would be refused for a tenant it never named.
    let policy = r#"
unchecked = "allow"
trusted_roles = ["trustuser"]
[tenants.a]
priority = "normal"
"#;
    let f = Fixture::one_server(policy, "admin_users = admin\n");
    let mut console = client_command("psql", None);
    console
        .args(["-X", "-w", "-At", "-d"])
        .arg(f.pw.connstr("admin", None, "pgward"))
        .args(["-c", "KILL TENANT a FOR '1m'"]);
    let out = run(&mut console);
    assert!(out.status.success(), "KILL TENANT: {}", stderr_of(&out));
    let mut raw = f.raw("trustuser", "bytes");
    let text = b"SELECT 'caf\xe9' /*tenant='a'*/";
    let query = query_bytes(text);
    let answer = raw.exchange_within(&query, 3 * SECOND, "a Query not in UTF-8");
    // PostgreSQL's own answer to the bytes: invalid byte sequence for encoding "UTF8".
    assert_eq!(error_code(&answer), "22021", "{}", describe(&answer));
}

/// The C functions of PostgreSQL 13 to 18 that hand an argument to SPI: SQL text given to
/// them (`query_to_xml*`, `ts_stat`, `ts_rewrite(tsquery, text)`), or a query built from a
/// table, schema or database (`table_to_xml*`, `schema_to_xml*`, `database_to_xml*`).
const RUNS_SQL_OF_ITS_ARGUMENTS: &[&str] = &[
    "query_to_xml",
    "query_to_xmlschema",
    "query_to_xml_and_xmlschema",
    "table_to_xml",
    "table_to_xml_and_xmlschema",
    "schema_to_xml",
    "schema_to_xml_and_xmlschema",
    "database_to_xml",
    "database_to_xml_and_xmlschema",
    "ts_stat1",
    "ts_stat2",
    "tsquery_rewrite_query",
];

#[test]
fn the_agent_preset_refuses_every_built_in_that_runs_sql_of_its_arguments() {
    // The preset with its agent role named trustuser (a login the test harness has).
    let preset = std::fs::read_to_string("etc/presets/ai-agent.toml")
        .expect("read the preset")
        .replace("[\"agent\"]", "[\"trustuser\"]")
        .replace("agent = \"learn\"", "trustuser = \"learn\"");
    let f = Fixture(Policed::start(SCHEMA, &preset, "default_pool_size = 2\n"));
    // Every catalog entry of the running server that calls one of them, as a call with
    // NULLs of its argument types.
    let symbols = RUNS_SQL_OF_ITS_ARGUMENTS
        .iter()
        .map(|s| format!("'{s}'"))
        .collect::<Vec<_>>()
        .join(", ");
    let calls = f.pg.sql(&format!(
        "SELECT string_agg(call, E'\\n' ORDER BY call) FROM ( \
           SELECT format('SELECT %I(%s)', p.proname, ( \
             SELECT string_agg(format('NULL::%s', format_type(a.t, NULL)), ', ' ORDER BY a.n) \
             FROM unnest(p.proargtypes::oid[]) WITH ORDINALITY AS a(t, n))) AS call \
           FROM pg_proc p WHERE p.prolang = 12 AND p.prosrc IN ({symbols})) c"
    ));
    let calls: Vec<&str> = calls.lines().collect();
    assert_eq!(calls.len(), RUNS_SQL_OF_ITS_ARGUMENTS.len(), "{calls:?}");
    let mut agent = f.raw("trustuser", "agent");
    for call in &calls {
        let answer = agent.exchange_within(&query_message(call), 3 * SECOND, call);
        let error = first_error(&answer).unwrap_or_else(|| panic!("{call}: {}", describe(&answer)));
        assert_eq!(error.code(), "42501", "{call}: {}", describe(&answer));
        assert!(
            error.hint().contains("deny_functions"),
            "{call}: {}",
            error.hint()
        );
    }
    // They do run the SQL given to them: a role the rules leave alone runs ts_stat's query.
    let out = f.psql(
        "postgres",
        "free",
        &["SELECT count(*) FROM ts_stat('SELECT to_tsvector(''simple'', ''a b'')')"],
    );
    assert_eq!(stdout_of(&out).trim(), "2", "{}", stderr_of(&out));
}

#[test]
fn under_cost_rules_a_text_that_is_not_utf8_cannot_be_priced_and_is_refused() {
    // LATIN1 bytes: pgward can neither parse nor EXPLAIN them as the server reads them, so
    // even with unchecked = "allow" a cost rule cannot judge them: refused (54000), never run
    // unpriced.
    let policy = "unchecked = \"allow\"\n[gate]\nmax_cost = 1e9\n";
    let f = Fixture::one_server(policy, "");
    let mut raw = f.pw.client_with(&[
        ("user", "trustuser"),
        ("database", "app"),
        ("client_encoding", "LATIN1"),
    ]);
    let text = b"SELECT count(*) FROM t WHERE a::text <> 'caf\xe9'";
    let query = query_bytes(text);
    let answer = raw.exchange_within(&query, 3 * SECOND, "a LATIN1 Query");
    assert_eq!(error_code(&answer), "54000", "{}", describe(&answer));
    // The same in UTF-8 runs.
    let ok = raw.exchange_within(
        &query_message("SELECT count(*) FROM t"),
        3 * SECOND,
        "ASCII",
    );
    assert_eq!(error_code(&ok), "", "{}", describe(&ok));
}

/// On: a SELECT of two strings and a comment. Off: a string, then secret.s's rows counted.
const READ_BY_SCS: &str = r"SELECT '\', ' , (SELECT count(*) FROM secret.s) , '--'";

/// Turns standard_conforming_strings off for the client's session (through a statement of
/// its own name, which leaves the unnamed one alone).
fn conforming_strings_off(raw: &mut Raw) {
    let set = [
        parse_message("off", "SET standard_conforming_strings = off"),
        bind_message("off"),
        execute_message(),
        sync_message(),
    ];
    let answer = raw.exchange_within(&set.concat(), 10 * SECOND, "SET");
    assert_eq!(error_code(&answer), "", "SET: {}", describe(&answer));
}

/// Prepares `name` as [`READ_BY_SCS`] with the setting on: allowed, read as two strings.
fn prepare_read_by_scs(raw: &mut Raw, name: &str) {
    let parse = [parse_message(name, READ_BY_SCS), sync_message()].concat();
    let answer = raw.exchange_within(&parse, 10 * SECOND, "Parse");
    assert_eq!(error_code(&answer), "", "Parse: {}", describe(&answer));
}

fn run_statement(raw: &mut Raw, name: &str) -> Vec<Message> {
    let run = [bind_message(name), execute_message(), sync_message()].concat();
    raw.exchange_within(&run, 10 * SECOND, "Bind")
}

/// The unnamed statement of an earlier transaction is prepared again by pgward on the server
/// of the next: the server reads it under the settings it has then, which the rules judge.
#[test]
fn an_unnamed_statement_prepared_again_is_judged_as_the_server_then_reads_it() {
    let f = Fixture::start(POLICY);
    let mut raw = f.raw("postgres", "schema");
    prepare_read_by_scs(&mut raw, "");
    conforming_strings_off(&mut raw);
    let answer = run_statement(&mut raw, "");
    assert_eq!(error_code(&answer), "42501", "{}", describe(&answer));
}

/// A named statement prepared again on a server that lacks it: read there under the settings
/// the server has then, which the rules judge.
#[test]
fn a_named_statement_prepared_again_elsewhere_is_judged_as_that_server_reads_it() {
    let f = Fixture::start(POLICY);
    let mut raw = f.raw("postgres", "schema");
    prepare_read_by_scs(&mut raw, "s");
    conforming_strings_off(&mut raw);
    // Another client holds the only server that has the statement: the run takes the other.
    let mut other = f.raw("postgres", "free");
    other.value("BEGIN");
    let answer = run_statement(&mut raw, "s");
    assert_eq!(error_code(&answer), "42501", "{}", describe(&answer));
    other.value("ROLLBACK");
}

/// Two clients prepare the same text under different settings: each runs its own reading, as
/// on a server of its own (here the one with the setting off has no rule to obey, the other
/// must not run its reading).
#[test]
fn a_text_prepared_under_other_settings_is_not_another_client_s_statement() {
    let f = Fixture::start(POLICY);
    let mut free = f.raw("postgres", "free");
    conforming_strings_off(&mut free);
    prepare_read_by_scs(&mut free, "a");
    let counted = run_statement(&mut free, "a");
    assert_eq!(error_code(&counted), "", "{}", describe(&counted));
    drop(free);
    let mut governed = f.raw("postgres", "schema");
    prepare_read_by_scs(&mut governed, "b");
    let answer = run_statement(&mut governed, "b");
    assert_eq!(error_code(&answer), "", "{}", describe(&answer));
    let row = answer.iter().find(|m| m.tag == b'D').expect("a row");
    assert_eq!(
        row.columns(),
        vec![
            Some("\\".to_string()),
            Some(" , (SELECT count(*) FROM secret.s) , ".to_string())
        ],
        "{}",
        describe(&answer)
    );
}
