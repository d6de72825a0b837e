//! The test fixtures on their own: a throwaway PostgreSQL server with one role per
//! authentication method, and the pure parts of the pgward fixture.

mod common;

use std::collections::HashSet;
use std::thread;
use std::time::{Duration, Instant};

use common::{stderr_of, stdout_of, Postgres, ROLES};

#[test]
fn each_role_logs_in_over_tcp_with_its_password() {
    let pg = Postgres::start();
    for role in ROLES.iter() {
        let out = pg.psql_as(role.name, role.password, "app", "SELECT current_user");
        assert!(
            out.status.success(),
            "{} ({}): {}",
            role.name,
            role.hba_method,
            stderr_of(&out)
        );
        assert_eq!(stdout_of(&out), role.name);
    }
    assert_eq!(pg.sql("SELECT current_user"), "postgres");
    assert_eq!(pg.sql("SELECT current_database()"), "app");
}

#[test]
fn wrong_or_missing_passwords_are_refused() {
    let pg = Postgres::start();
    for user in ["md5user", "scramuser", "passworduser"] {
        let wrong = pg.psql_as(user, Some("not-the-password"), "app", "SELECT 1");
        assert!(
            !wrong.status.success(),
            "{user} logged in with a wrong password"
        );
        assert!(
            stderr_of(&wrong).contains("password authentication failed"),
            "{user}: {}",
            stderr_of(&wrong)
        );
        let missing = pg.psql_as(user, None, "app", "SELECT 1");
        assert!(
            !missing.status.success(),
            "{user} logged in with no password"
        );
    }
    let unknown = pg.psql_as("nobody", Some("x"), "app", "SELECT 1");
    assert!(!unknown.status.success());
}

#[test]
fn passwords_are_stored_with_the_requested_encryption() {
    let pg = Postgres::start();
    assert_eq!(
        pg.role_secret("md5user"),
        common::md5_secret("md5user", "md5pass")
    );
    assert!(pg.role_secret("scramuser").starts_with("SCRAM-SHA-256$"));
    assert!(pg.role_secret("passworduser").starts_with("SCRAM-SHA-256$"));
    assert_eq!(pg.role_secret("trustuser"), "");
    let out = pg.psql("md5user", "app", "CREATE TABLE t (id int); SELECT 1");
    assert!(out.status.success(), "{}", stderr_of(&out));
}

#[test]
fn restart_and_stop_keep_the_port_and_the_data() {
    let pg = Postgres::start();
    pg.sql("CREATE TABLE kept (id int); INSERT INTO kept VALUES (7)");
    let before = pg.sql("SELECT pg_postmaster_start_time()");
    pg.restart();
    assert_ne!(pg.sql("SELECT pg_postmaster_start_time()"), before);
    assert_eq!(pg.sql("SELECT id FROM kept"), "7");
    pg.stop();
    assert!(!pg.psql("postgres", "app", "SELECT 1").status.success());
    pg.start_server();
    assert_eq!(pg.sql("SELECT id FROM kept"), "7");
    assert!(pg.log().contains("database system is ready"));
}

#[test]
fn terminate_backends_ends_matching_sessions() {
    let pg = Postgres::start();
    let port = pg.port;
    let victim = thread::spawn(move || {
        common::psql_at(
            port,
            "scramuser",
            Some("scrampass"),
            "dbname=app application_name=victim",
            "SELECT pg_sleep(60)",
        )
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    while pg.backend_count("scramuser") == 0 {
        assert!(Instant::now() < deadline, "the session never appeared");
        thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(pg.terminate_backends("victim"), 1);
    let out = victim.join().expect("the psql thread panicked");
    assert!(!out.status.success());
    assert!(stderr_of(&out).contains("terminat"), "{}", stderr_of(&out));
}

#[test]
fn pgbench_runs_against_the_server() {
    let pg = Postgres::start();
    let init = pg.pgbench(&["-i", "-s", "1", "-q"]);
    assert!(init.status.success(), "{}", stderr_of(&init));
    let run = pg.pgbench(&["-S", "-c", "2", "-t", "20"]);
    assert!(run.status.success(), "{}", stderr_of(&run));
    assert!(stdout_of(&run).contains("number of transactions actually processed: 40"));
}

#[test]
fn two_servers_run_side_by_side() {
    let (a, b) = thread::scope(|scope| {
        let a = scope.spawn(Postgres::start);
        let b = scope.spawn(Postgres::start);
        (a.join(), b.join())
    });
    let (a, b) = (a.expect("first server"), b.expect("second server"));
    assert_ne!(a.port, b.port);
    a.sql("CREATE TABLE only_in_a ()");
    assert!(!b
        .psql("postgres", "app", "SELECT * FROM only_in_a")
        .status
        .success());
}

#[test]
fn free_ports_are_not_handed_out_twice() {
    let ports: HashSet<u16> = (0..50).map(|_| common::free_port()).collect();
    assert_eq!(ports.len(), 50);
}

#[test]
fn listener_settings_go_into_the_pgbouncer_section() {
    let body =
        "[databases]\na = host=x\n[pgbouncer]\npool_mode = transaction\n[users]\nu = pool_size=1\n";
    let ini = common::insert_into_section(body, "pgbouncer", "listen_port = 1\n");
    assert_eq!(
        ini,
        "[databases]\na = host=x\n[pgbouncer]\npool_mode = transaction\nlisten_port = 1\n[users]\nu = pool_size=1\n"
    );
    let appended = common::insert_into_section("[databases]\n", "pgbouncer", "x = 1\n");
    assert_eq!(appended, "[databases]\n[pgbouncer]\nx = 1\n");
    let at_end = common::insert_into_section("[PgBouncer]\nx = 1", "pgbouncer", "y = 2\n");
    assert_eq!(at_end, "[PgBouncer]\nx = 1\ny = 2\n");
}

#[test]
fn generated_ini_points_at_the_server() {
    let pg = Postgres::start();
    let ini = common::Pgward::ini(&pg, "pool_mode = session", "other = dbname=app pool_size=2");
    assert!(ini.contains(&format!(
        "app = host=127.0.0.1 port={} dbname=app\n",
        pg.port
    )));
    assert!(ini.contains("\nother = dbname=app pool_size=2\n"));
    assert!(ini.contains("[pgbouncer]\npool_mode = session\n"));
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = common::write_userlist(dir.path(), &[("md5user", "md5x"), ("q\"uote", "p")]);
    let text = std::fs::read_to_string(path).expect("userlist");
    assert_eq!(text, "\"md5user\" \"md5x\"\n\"q\"\"uote\" \"p\"\n");
}
