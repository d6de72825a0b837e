//! Notices and wording PgBouncer users rely on: login_notify_message, query_wait_notify, the
//! errors for startup options, and max_prepared_statements changed from the console.

mod common;

use std::thread;
use std::time::Duration;

use common::{psql_at, stderr_of, stdout_of, Pgward, Postgres};
use tokio_postgres::NoTls;

/// What psql printed to stderr, without its warning about the password file the harness
/// points it at.
fn notices(out: &std::process::Output) -> String {
    stderr_of(out)
        .lines()
        .filter(|l| !l.contains("password file"))
        .map(|l| format!("{l}\n"))
        .collect()
}

fn start(extra: &str) -> (Postgres, Pgward) {
    let pg = Postgres::start();
    let settings =
        format!("auth_type = trust\nadmin_users = admin\npool_mode = transaction\n{extra}");
    let pw = Pgward::start(&Pgward::ini(&pg, &settings, ""));
    (pg, pw)
}

#[test]
fn login_notify_message_greets_every_client() {
    let (_pg, pw) = start("login_notify_message = You are now connected to pgward");
    let out = psql_at(pw.port, "postgres", None, "app", "select 1");
    assert_eq!(stdout_of(&out).trim(), "1", "{}", stderr_of(&out));
    assert_eq!(notices(&out), "NOTICE:  You are now connected to pgward\n");
}

#[test]
fn no_greeting_without_login_notify_message() {
    let (_pg, pw) = start("");
    let out = psql_at(pw.port, "postgres", None, "app", "select 1");
    assert_eq!(notices(&out), "");
}

#[test]
fn a_queued_client_is_told_after_query_wait_notify() {
    let (_pg, pw) = start("default_pool_size = 1\nquery_wait_notify = 1");
    let port = pw.port;
    let holder =
        thread::spawn(move || psql_at(port, "postgres", None, "app", "select pg_sleep(2.5)"));
    thread::sleep(Duration::from_millis(500));
    let out = psql_at(pw.port, "postgres", None, "app", "select 1");
    holder.join().expect("the holding client");
    assert_eq!(stdout_of(&out).trim(), "1", "{}", stderr_of(&out));
    assert!(
        stderr_of(&out).contains(
            // PgBouncer's words, whatever the database.
            "NOTICE:  No server connection available in postgres backend, client being queued"
        ),
        "stderr: {}",
        stderr_of(&out)
    );
    // A client that gets a server at once hears nothing.
    let quick = psql_at(pw.port, "postgres", None, "app", "select 1");
    assert_eq!(notices(&quick), "");
}

/// Under a policy a client waits for its slot in the admission gate, or for a RESUME, before
/// it takes a server: it is told it is queued there as well.
#[test]
fn a_client_queued_by_the_gate_or_a_pause_is_told_after_query_wait_notify() {
    let f = common::gate::gated(
        "[tenants.acme]\nroles = [\"postgres\"]\n",
        "default_pool_size = 1\nquery_wait_notify = 1\nadmin_users = admin\n",
    );
    let port = f.pw.port;
    let queued = "NOTICE:  No server connection available in postgres backend, client being queued";
    let holder =
        thread::spawn(move || psql_at(port, "postgres", None, "app", "select pg_sleep(2.5)"));
    thread::sleep(Duration::from_millis(500));
    let out = psql_at(port, "postgres", None, "app", "select 1");
    holder.join().expect("the holding client");
    assert_eq!(stdout_of(&out).trim(), "1", "{}", stderr_of(&out));
    assert!(stderr_of(&out).contains(queued), "{}", stderr_of(&out));

    let pause = psql_at(port, "admin", None, "pgward", "PAUSE app");
    assert!(pause.status.success(), "{}", stderr_of(&pause));
    let resume = thread::spawn(move || {
        thread::sleep(Duration::from_millis(1800));
        psql_at(port, "admin", None, "pgward", "RESUME app")
    });
    let out = psql_at(port, "postgres", None, "app", "select 2");
    assert!(resume.join().expect("resumed").status.success());
    assert_eq!(stdout_of(&out).trim(), "2", "{}", stderr_of(&out));
    assert!(stderr_of(&out).contains(queued), "{}", stderr_of(&out));
    let quick = psql_at(port, "postgres", None, "app", "select 3");
    assert_eq!(notices(&quick), "");
}

#[test]
fn startup_options_are_refused_in_pgbouncers_words() {
    let (_pg, pw) = start("");
    for options in ["-d", "-c timezone"] {
        let out = psql_at(
            pw.port,
            "postgres",
            None,
            &format!("dbname=app options='{options}'"),
            "select 1",
        );
        assert!(
            stderr_of(&out).contains(
                "unsupported options startup parameter: only '-c config=val' and '--config=val' are allowed"
            ),
            "{options}: {}",
            stderr_of(&out)
        );
    }
    let out = psql_at(
        pw.port,
        "postgres",
        None,
        "dbname=app options='-c enable_seqscan=off'",
        "select 1",
    );
    assert!(
        stderr_of(&out).contains("unsupported startup parameter in options: enable_seqscan"),
        "{}",
        stderr_of(&out)
    );
    let ok = psql_at(
        pw.port,
        "postgres",
        None,
        r"dbname=app options='-c datestyle=German,\\ YMD'",
        "show datestyle",
    );
    assert_eq!(stdout_of(&ok).trim(), "German, YMD", "{}", stderr_of(&ok));
}

#[tokio::test(flavor = "multi_thread")]
async fn max_prepared_statements_changed_from_the_console() {
    let (_pg, pw) = start("default_pool_size = 1");
    let (admin, conn) = tokio_postgres::connect(&pw.connstr("admin", None, "pgbouncer"), NoTls)
        .await
        .expect("console");
    tokio::spawn(conn);
    let (client, conn) = tokio_postgres::connect(&pw.connstr("postgres", None, "app"), NoTls)
        .await
        .expect("client");
    tokio::spawn(conn);
    let count = |n: i64, note: &'static str| {
        let client = &client;
        async move {
            let row = client
                .query_one("select count(*) from pg_prepared_statements", &[])
                .await
                .expect("count");
            assert_eq!(row.get::<_, i64>(0), n, "{note}");
        }
    };
    let run = |i: i32| {
        let client = &client;
        async move {
            let stmt = client
                .prepare(&format!("select {i}::int"))
                .await
                .expect("prepare");
            let row = client.query_one(&stmt, &[]).await.expect("run");
            assert_eq!(row.get::<_, i32>(0), i);
        }
    };
    admin
        .simple_query("set max_prepared_statements = 1")
        .await
        .expect("set 1");
    for i in 0..5 {
        run(i).await;
    }
    count(1, "one statement kept at a capacity of 1").await;
    admin
        .simple_query("set max_prepared_statements = 5")
        .await
        .expect("set 5");
    for i in 5..10 {
        run(i).await;
    }
    count(5, "five kept at a capacity of 5").await;
    admin
        .simple_query("set max_prepared_statements = 2")
        .await
        .expect("set 2");
    count(5, "lowering the capacity closes nothing by itself").await;
    run(10).await;
    count(2, "the next new statement makes room down to the capacity").await;
}
