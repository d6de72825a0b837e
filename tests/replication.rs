//! Replication connections through pgward: each gets a server of its own for its whole life,
//! counted against its pool, opened with the client's own parameters and options, and closed
//! when the client leaves. pg_basebackup and pg_receivewal are the real clients.

mod common;

use std::process::Stdio;
use std::thread;

use common::{client_command, eventually, stderr_of, stdout_of, Pgward, Postgres, SECOND};

/// How many walsenders `pg` runs for `user`.
fn walsenders(pg: &Postgres, user: &str) -> u32 {
    pg.sql_in(
        "postgres",
        &format!(
            "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'walsender' \
             AND usename = {}",
            common::sql_literal(user)
        ),
    )
    .parse()
    .expect("a count")
}

/// psql on a replication connection to pgward: `conninfo` is added to the database name.
fn replication_psql(pw: &Pgward, user: &str, conninfo: &str, sql: &str) -> std::process::Output {
    pw.psql(user, None, &format!("dbname=app {conninfo}"), sql)
}

#[test]
fn a_logical_replication_client_gets_its_own_server_with_its_options() {
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(&pg, "");
    let conninfo = "replication=database application_name=abc options='-c enable_seqscan=off'";
    let out = replication_psql(&pw, "postgres", conninfo, "IDENTIFY_SYSTEM");
    assert!(out.status.success(), "{}\n{}", stderr_of(&out), pw.log());
    let system_id = pg.sql("SELECT system_identifier FROM pg_control_system()");
    assert!(
        stdout_of(&out).starts_with(&system_id),
        "{}",
        stdout_of(&out)
    );
    // A setting PgBouncer could not follow on a pooled server reaches this one, as do the
    // tracked parameters, because the server is the client's alone.
    let out = replication_psql(&pw, "postgres", conninfo, "SHOW enable_seqscan");
    assert_eq!(stdout_of(&out), "off", "{}", stderr_of(&out));
    let out = replication_psql(&pw, "postgres", conninfo, "SHOW application_name");
    assert_eq!(stdout_of(&out), "abc", "{}", stderr_of(&out));
    // A normal client of the same pool is not disturbed, and gets a pooled server.
    let out = pw.psql("postgres", None, "app", "SHOW enable_seqscan");
    assert_eq!(stdout_of(&out), "on", "{}", stderr_of(&out));
    assert!(
        eventually(5 * SECOND, || walsenders(&pg, "postgres") == 0),
        "a replication client's server closes with it"
    );
}

#[test]
fn a_physical_replication_client_takes_walsender_commands_only() {
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(&pg, "");
    let out = replication_psql(&pw, "postgres", "replication=true", "IDENTIFY_SYSTEM");
    assert!(out.status.success(), "{}\n{}", stderr_of(&out), pw.log());
    let out = replication_psql(&pw, "postgres", "replication=yes", "SELECT 1");
    assert!(!out.status.success());
    assert!(
        stderr_of(&out)
            .contains("cannot execute SQL commands in WAL sender for physical replication"),
        "{}",
        stderr_of(&out)
    );
}

#[test]
fn a_refused_replication_login_is_the_clients_alone() {
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(&pg, "");
    // trustuser may log in but has no REPLICATION attribute.
    let out = replication_psql(&pw, "trustuser", "replication=database", "IDENTIFY_SYSTEM");
    assert!(!out.status.success());
    let err = stderr_of(&out);
    assert!(err.contains("login failed"), "{err}");
    assert!(
        err.contains("must be superuser or replication role to start walsender"),
        "{err}"
    );
    assert!(
        pw.log().contains("closing because: login failed (age="),
        "{}",
        pw.log()
    );
    // The pool still serves normal clients of the same role.
    let out = pw.psql("trustuser", None, "app", "SELECT 1");
    assert_eq!(stdout_of(&out), "1", "{}", stderr_of(&out));
}

#[test]
fn a_replication_client_counts_against_the_pool_and_evicts_an_idle_server() {
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(&pg, "default_pool_size = 1\nquery_wait_timeout = 1\n");
    let out = pw.psql("postgres", None, "app", "SELECT 1");
    assert_eq!(stdout_of(&out), "1", "{}", stderr_of(&out));
    // The pool is full with one idle server: it is evicted to make room.
    let out = replication_psql(&pw, "postgres", "replication=database", "IDENTIFY_SYSTEM");
    assert!(out.status.success(), "{}\n{}", stderr_of(&out), pw.log());
    assert!(
        pw.log().contains("closing because: evicted"),
        "{}",
        pw.log()
    );
    // While one replication client holds the pool's only place, another waits for it and
    // gives up after query_wait_timeout; so does a normal client.
    thread::scope(|scope| {
        let holder = scope.spawn(|| {
            replication_psql(
                &pw,
                "postgres",
                "replication=database",
                "SELECT pg_sleep(3)",
            )
        });
        assert!(eventually(5 * SECOND, || walsenders(&pg, "postgres") == 1));
        let out = replication_psql(&pw, "postgres", "replication=database", "IDENTIFY_SYSTEM");
        assert!(!out.status.success());
        assert!(
            stderr_of(&out).contains("query_wait_timeout"),
            "{}",
            stderr_of(&out)
        );
        let out = pw.psql("postgres", None, "app", "SELECT 1");
        assert!(
            stderr_of(&out).contains("query_wait_timeout"),
            "{}",
            stderr_of(&out)
        );
        let out = holder.join().expect("holder");
        assert!(out.status.success(), "{}", stderr_of(&out));
    });
    // Its place is given back: a normal client is served again.
    let out = pw.psql("postgres", None, "app", "SELECT 1");
    assert_eq!(stdout_of(&out), "1", "{}", stderr_of(&out));
}

#[test]
fn pg_basebackup_and_pg_receivewal_work_through_pgward() {
    let pg = Postgres::start();
    // libpq asks for the database "replication" on a physical replication connection,
    // whatever the connection string says: as with PgBouncer, it needs an entry.
    let db = format!("replication = {}", pg.db_connstr("postgres"));
    let pw = Pgward::trusting(&pg, "pool_mode = transaction", &db);
    let dir = common::shared_tempdir("pgward-basebackup-");
    let backup = dir.path().join("backup");
    let out = client_command("pg_basebackup", None)
        .args(["-d", &pw.connstr("postgres", None, "app")])
        .args(["--checkpoint=fast", "--no-sync", "-D"])
        .arg(&backup)
        .output()
        .expect("pg_basebackup");
    assert!(out.status.success(), "{}\n{}", stderr_of(&out), pw.log());
    assert!(backup.join("PG_VERSION").is_file());
    assert!(backup.join("backup_manifest").is_file() || backup.join("global").is_dir());

    pg.sql("SELECT pg_create_physical_replication_slot('through_pgward')");
    let wal = dir.path().join("wal");
    std::fs::create_dir(&wal).expect("wal dir");
    let receiver = client_command("pg_receivewal", None)
        .args(["-d", &pw.connstr("postgres", None, "app")])
        .args(["--slot=through_pgward", "--no-loop", "-D"])
        .arg(&wal)
        .stderr(Stdio::piped())
        .spawn()
        .expect("pg_receivewal");
    pg.sql("CREATE TABLE wal_maker AS SELECT g FROM generate_series(1, 1000) g");
    let received = eventually(10 * SECOND, || {
        std::fs::read_dir(&wal).is_ok_and(|mut entries| entries.next().is_some())
    });
    let pid = libc::pid_t::try_from(receiver.id()).expect("pid");
    // SAFETY: kill has no memory-safety preconditions; the pid is our own child.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0, "SIGINT");
    let out = receiver.wait_with_output().expect("pg_receivewal ends");
    assert!(received, "no WAL file: {}\n{}", stderr_of(&out), pw.log());
    assert!(out.status.success(), "{}\n{}", stderr_of(&out), pw.log());
}

#[test]
fn a_replication_client_that_leaves_while_waiting_gives_up_its_turn() {
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(&pg, "default_pool_size = 1\nquery_wait_timeout = 0\n");
    let opened = || pw.log().matches("new connection to server").count();
    thread::scope(|scope| {
        let holder = scope.spawn(|| {
            replication_psql(
                &pw,
                "postgres",
                "replication=database",
                "SELECT pg_sleep(2)",
            )
        });
        assert!(eventually(5 * SECOND, || walsenders(&pg, "postgres") == 1));
        // A second one waits for the only place, then leaves.
        let mut waiting = common::raw::Raw::connect(pw.port);
        waiting.send(&common::raw::startup_packet(
            common::raw::PROTOCOL_3_0,
            &[
                ("user", "postgres"),
                ("database", "app"),
                ("replication", "database"),
            ],
        ));
        thread::sleep(std::time::Duration::from_millis(300));
        drop(waiting);
        let out = holder.join().expect("holder");
        assert!(out.status.success(), "{}", stderr_of(&out));
    });
    let before = opened();
    thread::sleep(std::time::Duration::from_millis(1500));
    assert_eq!(
        opened(),
        before,
        "a server was opened for a client that left:\n{}",
        pw.log()
    );
    assert_eq!(walsenders(&pg, "postgres"), 0);
}

/// A replication client of `app` that streams until the console's `command` ends it: the
/// client's output once it ended.
fn stream_ended_by(pg: &Postgres, pw: &Pgward, command: &str) -> std::process::Output {
    thread::scope(|scope| {
        let streaming = scope.spawn(|| {
            replication_psql(
                pw,
                "postgres",
                "replication=database",
                "SELECT pg_sleep(30)",
            )
        });
        assert!(eventually(5 * SECOND, || walsenders(pg, "postgres") == 1));
        let out = pw.psql("admin", None, "pgbouncer", command);
        assert!(out.status.success(), "{}", stderr_of(&out));
        streaming.join().expect("streaming client")
    })
}

#[test]
fn reconnect_closes_a_replication_client_and_its_server_at_once() {
    let pg = Postgres::start();
    let pw = Pgward::trusting(&pg, "pool_mode = transaction\nadmin_users = admin\n", "");
    // The connection just ends: an error in the middle of a stream would corrupt it.
    let out = stream_ended_by(&pg, &pw, "RECONNECT app");
    assert!(!out.status.success());
    assert!(
        pw.log()
            .contains("closing because: database configuration changed"),
        "{}\n{}",
        stderr_of(&out),
        pw.log()
    );
    assert!(eventually(5 * SECOND, || walsenders(&pg, "postgres") == 0));
}

#[test]
fn a_replication_client_ended_by_kill_is_logged_so() {
    let pg = Postgres::start();
    let pw = Pgward::trusting(&pg, "pool_mode = transaction\nadmin_users = admin\n", "");
    assert!(!stream_ended_by(&pg, &pw, "KILL app").status.success());
    for line in [
        "pooler error: database removed",
        "closing because: database removed",
    ] {
        assert!(
            eventually(5 * SECOND, || pw.log().contains(line)),
            "{line}: {}",
            pw.log()
        );
    }
}

#[test]
fn removing_its_database_closes_a_replication_client() {
    let pg = Postgres::start();
    let gone = format!("gone = {}", pg.db_connstr("app"));
    let pw = Pgward::trusting(&pg, "pool_mode = transaction\n", &gone);
    thread::scope(|scope| {
        let streaming = scope.spawn(|| {
            pw.psql(
                "postgres",
                None,
                "dbname=gone replication=database",
                "SELECT pg_sleep(30)",
            )
        });
        assert!(eventually(5 * SECOND, || walsenders(&pg, "postgres") == 1));
        let ini = std::fs::read_to_string(&pw.ini_path).expect("ini");
        std::fs::write(&pw.ini_path, ini.replace(&gone, "")).expect("ini");
        pw.reload_and_wait();
        let out = streaming.join().expect("streaming client");
        assert!(!out.status.success(), "{}", pw.log());
    });
    assert!(eventually(5 * SECOND, || walsenders(&pg, "postgres") == 0));
}
