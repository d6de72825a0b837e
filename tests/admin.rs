//! The admin console, driven with psql and tokio-postgres: every SHOW with PgBouncer's column
//! names, access rules, and the process-control commands.

mod common;

use std::time::Duration;

use common::driver::must_value;
use common::{stderr_of, stdout_of, Pgward, Postgres};
use tokio_postgres::{Client, NoTls, SimpleQueryMessage};

/// SHOW CLIENTS and SHOW SERVERS.
const CONNECTION_COLUMNS: &[&str] = &[
    "type",
    "user",
    "database",
    "replication",
    "state",
    "addr",
    "port",
    "local_addr",
    "local_port",
    "connect_time",
    "request_time",
    "wait",
    "wait_us",
    "close_needed",
    "ptr",
    "link",
    "remote_pid",
    "tls",
    "application_name",
    "prepared_statements",
    "id",
];

/// PgBouncer's documented columns, in order (doc/usage.md).
const COLUMNS: &[(&str, &[&str])] = &[
    ("version", &["version"]),
    ("state", &["key", "value"]),
    ("config", &["key", "value", "default", "changeable"]),
    ("lists", &["list", "items"]),
    ("mem", &["name", "size", "used", "free", "memtotal"]),
    ("peers", &["peer_id", "host", "port", "pool_size"]),
    (
        "peer_pools",
        &[
            "peer_id",
            "cl_active_cancel_req",
            "cl_waiting_cancel_req",
            "sv_active_cancel",
            "sv_login",
        ],
    ),
    ("dns_hosts", &["hostname", "ttl", "addrs"]),
    ("dns_zones", &["zonename", "serial", "count"]),
    (
        "databases",
        &[
            "name",
            "host",
            "port",
            "database",
            "force_user",
            "pool_size",
            "min_pool_size",
            "reserve_pool_size",
            "server_lifetime",
            "pool_mode",
            "load_balance_hosts",
            "max_connections",
            "current_connections",
            "max_client_connections",
            "current_client_connections",
            "paused",
            "disabled",
        ],
    ),
    (
        "pools",
        &[
            "database",
            "user",
            "cl_active",
            "cl_waiting",
            "cl_active_cancel_req",
            "cl_waiting_cancel_req",
            "sv_active",
            "sv_active_cancel",
            "sv_being_canceled",
            "sv_idle",
            "sv_used",
            "sv_tested",
            "sv_login",
            "maxwait",
            "maxwait_us",
            "pool_mode",
            "load_balance_hosts",
        ],
    ),
    (
        "users",
        &[
            "name",
            "pool_size",
            "reserve_pool_size",
            "pool_mode",
            "max_user_connections",
            "current_connections",
            "max_user_client_connections",
            "current_client_connections",
        ],
    ),
    ("clients", CONNECTION_COLUMNS),
    ("servers", CONNECTION_COLUMNS),
    (
        "stats",
        &[
            "database",
            "total_server_assignment_count",
            "total_xact_count",
            "total_query_count",
            "total_received",
            "total_sent",
            "total_xact_time",
            "total_query_time",
            "total_wait_time",
            "total_client_parse_count",
            "total_server_parse_count",
            "total_bind_count",
            "total_client_login_count",
            "avg_server_assignment_count",
            "avg_xact_count",
            "avg_query_count",
            "avg_recv",
            "avg_sent",
            "avg_xact_time",
            "avg_query_time",
            "avg_wait_time",
            "avg_client_parse_count",
            "avg_server_parse_count",
            "avg_bind_count",
            "avg_client_login_count",
        ],
    ),
    (
        "stats_totals",
        &[
            "database",
            "server_assignment_count",
            "xact_count",
            "query_count",
            "bytes_received",
            "bytes_sent",
            "xact_time",
            "query_time",
            "wait_time",
            "client_parse_count",
            "server_parse_count",
            "bind_count",
            "client_login_count",
        ],
    ),
    (
        "stats_averages",
        &[
            "database",
            "server_assignment_count",
            "xact_count",
            "query_count",
            "bytes_received",
            "bytes_sent",
            "xact_time",
            "query_time",
            "wait_time",
            "avg_client_parse_count",
            "avg_server_parse_count",
            "avg_bind_count",
            "avg_client_login_count",
        ],
    ),
    ("totals", &["name", "value"]),
];

/// A new client of `app` runs a statement.
async fn app_serves(pw: &Pgward) {
    connect(pw, "postgres", "app")
        .await
        .simple_query("SELECT 1")
        .await
        .unwrap();
}

fn start(extra: &str) -> (Postgres, Pgward) {
    let pg = Postgres::start();
    let settings = format!(
        "auth_type = trust\nadmin_users = admin\nstats_users = watcher\npool_mode = transaction\n{extra}"
    );
    let pw = Pgward::start(&Pgward::ini(&pg, &settings, ""));
    (pg, pw)
}

async fn connect(pw: &Pgward, user: &str, db: &str) -> Client {
    let (client, conn) = tokio_postgres::connect(&pw.connstr(user, None, db), NoTls)
        .await
        .unwrap_or_else(|e| panic!("{user}@{db}: {e}\n{}", pw.log()));
    tokio::spawn(conn);
    client
}

/// Column names and rows of a console command.
async fn show(c: &Client, sql: &str) -> (Vec<String>, Vec<Vec<Option<String>>>) {
    let mut cols = Vec::new();
    let mut rows = Vec::new();
    for m in c
        .simple_query(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
    {
        match m {
            SimpleQueryMessage::RowDescription(d) => {
                cols = d.iter().map(|c| c.name().to_string()).collect()
            }
            SimpleQueryMessage::Row(r) => {
                rows.push((0..r.len()).map(|i| r.get(i).map(str::to_string)).collect())
            }
            _ => {}
        }
    }
    (cols, rows)
}

/// The value of column `col` in the rows where column `key` is `value`.
fn cell(
    cols: &[String],
    rows: &[Vec<Option<String>>],
    key: (&str, &str),
    col: &str,
) -> Vec<String> {
    let k = cols.iter().position(|c| c == key.0).expect("key column");
    let v = cols.iter().position(|c| c == col).expect("value column");
    rows.iter()
        .filter(|r| r[k].as_deref() == Some(key.1))
        .filter_map(|r| r[v].clone())
        .collect()
}

/// The server's message of an error.
fn msg(e: &tokio_postgres::Error) -> String {
    e.as_db_error()
        .map_or_else(|| e.to_string(), |d| d.message().to_string())
}

fn sqlstate(e: &tokio_postgres::Error) -> String {
    e.code().map(|c| c.code().to_string()).unwrap_or_default()
}

#[tokio::test]
async fn every_show_has_pgbouncers_columns() {
    let (_pg, pw) = start("");
    let app = connect(&pw, "postgres", "app").await;
    app.simple_query("SELECT 1").await.unwrap();
    for name in ["pgward", "pgbouncer"] {
        let admin = connect(&pw, "admin", name).await;
        for (what, expected) in COLUMNS {
            let (cols, _) = show(&admin, &format!("show {what};")).await;
            let ours: Vec<&str> = cols
                .iter()
                .map(String::as_str)
                .take(expected.len())
                .collect();
            assert_eq!(&ours, expected, "SHOW {what}");
        }
        for extra in ["sockets", "active_sockets"] {
            show(&admin, &format!("SHOW {extra}")).await;
        }
        let help = admin.simple_query("SHOW HELP").await;
        assert!(help.is_ok());
        let (_, rows) = show(&admin, "SHOW VERSION").await;
        assert_eq!(
            rows[0][0].as_deref(),
            Some(concat!("pgward ", env!("CARGO_PKG_VERSION")))
        );
    }
}

#[tokio::test]
async fn show_reports_clients_servers_and_traffic() {
    let (_pg, pw) = start("");
    let app = connect(&pw, "postgres", "app").await;
    for _ in 0..5 {
        app.simple_query("SELECT 1").await.unwrap();
    }
    app.simple_query("BEGIN; SELECT 1; COMMIT").await.unwrap();
    let admin = connect(&pw, "admin", "pgward").await;
    let (cols, rows) = show(&admin, "SHOW CLIENTS").await;
    assert_eq!(
        cell(&cols, &rows, ("database", "app"), "state"),
        vec!["idle"]
    );
    assert_eq!(
        cell(&cols, &rows, ("database", "pgward"), "user"),
        vec!["admin"]
    );
    let (cols, rows) = show(&admin, "SHOW SERVERS").await;
    assert_eq!(
        cell(&cols, &rows, ("database", "app"), "state"),
        vec!["idle"]
    );
    let (cols, rows) = show(&admin, "SHOW POOLS").await;
    assert_eq!(
        cell(&cols, &rows, ("database", "app"), "sv_idle"),
        vec!["1"]
    );
    assert_eq!(
        cell(&cols, &rows, ("database", "app"), "pool_mode"),
        vec!["transaction"]
    );
    let (cols, rows) = show(&admin, "SHOW STATS_TOTALS").await;
    let queries: u64 = cell(&cols, &rows, ("database", "app"), "query_count")[0]
        .parse()
        .unwrap();
    let xacts: u64 = cell(&cols, &rows, ("database", "app"), "xact_count")[0]
        .parse()
        .unwrap();
    assert!(queries >= 6, "{queries}");
    assert!(xacts >= 6, "{xacts}");
    let (_, rows) = show(&admin, "SHOW TOTALS").await;
    assert!(rows
        .iter()
        .any(|r| r[0].as_deref() == Some("total_query_count")));
    let (cols, rows) = show(&admin, "SHOW STATE").await;
    assert_eq!(cell(&cols, &rows, ("key", "active"), "value"), vec!["yes"]);
}

#[tokio::test]
async fn console_access_rules() {
    let (_pg, pw) = start("");
    let watcher = connect(&pw, "watcher", "pgbouncer").await;
    show(&watcher, "SHOW POOLS").await;
    let err = watcher.simple_query("PAUSE").await.unwrap_err();
    assert_eq!(sqlstate(&err), "08P01");
    let refused = tokio_postgres::connect(&pw.connstr("postgres", None, "pgward"), NoTls).await;
    let err = refused.err().expect("postgres is no console user");
    assert_eq!(sqlstate(&err), "28000", "{err}");
    // The OS user running pgward, over the Unix socket, without a password.
    let socket = pw.socket_dir.display().to_string();
    let out = std::process::Command::new("psql")
        .args(["-X", "-w", "-At", "-h", &socket, "-p", &pw.port.to_string()])
        .args(["-U", "pgbouncer", "-d", "pgbouncer", "-c", "SHOW VERSION"])
        .output()
        .expect("psql");
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert!(stdout_of(&out).starts_with("pgward "));
    let admin = connect(&pw, "admin", "pgward").await;
    assert!(
        admin.query("SHOW VERSION", &[]).await.is_err(),
        "extended protocol"
    );
    assert!(
        admin.simple_query("SHOW VERSION").await.is_ok(),
        "session still usable"
    );
    let err = admin.simple_query("FROBNICATE").await.unwrap_err();
    assert_eq!(sqlstate(&err), "08P01");
}

#[tokio::test]
async fn pause_resume_disable_enable() {
    let (_pg, pw) = start("");
    let admin = connect(&pw, "admin", "pgward").await;
    let app = connect(&pw, "postgres", "app").await;
    app.simple_query("SELECT 1").await.unwrap();
    admin.simple_query("PAUSE app").await.unwrap();
    let held = tokio::spawn(async move { app.simple_query("SELECT 2").await.map(|_| ()) });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !held.is_finished(),
        "a paused database holds new transactions"
    );
    let (cols, rows) = show(&admin, "SHOW CLIENTS").await;
    assert_eq!(
        cell(&cols, &rows, ("database", "app"), "state"),
        vec!["waiting"]
    );
    let (cols, rows) = show(&admin, "SHOW DATABASES").await;
    assert_eq!(cell(&cols, &rows, ("name", "app"), "paused"), vec!["1"]);
    // A RESUME of the whole pooler leaves a database paused by name as it is.
    let err = admin.simple_query("RESUME").await.unwrap_err();
    assert!(msg(&err).contains("not paused"), "{err}");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!held.is_finished(), "RESUME lifted the pause of app");
    admin.simple_query("RESUME app").await.unwrap();
    held.await.unwrap().unwrap();
    let err = admin.simple_query("RESUME app").await.unwrap_err();
    assert!(msg(&err).contains("not paused"), "{err}");
    admin.simple_query("DISABLE app").await.unwrap();
    let refused = tokio_postgres::connect(&pw.connstr("postgres", None, "app"), NoTls).await;
    let err = refused.err().expect("disabled");
    assert!(msg(&err).contains("database \"app\" is disabled"), "{err}");
    admin.simple_query("ENABLE app").await.unwrap();
    app_serves(&pw).await;
    let err = admin.simple_query("PAUSE nosuchdb").await.unwrap_err();
    assert_eq!(sqlstate(&err), "08P01");
    assert!(msg(&err).contains("no such database: nosuchdb"), "{err}");
    admin.simple_query("SUSPEND").await.unwrap();
    let (cols, rows) = show(&admin, "SHOW STATE").await;
    assert_eq!(
        cell(&cols, &rows, ("key", "suspended"), "value"),
        vec!["yes"]
    );
    admin.simple_query("RESUME").await.unwrap();
}

/// A PAUSE still waiting for busy servers when a RESUME comes stops closing servers: after the
/// RESUME a server given back is kept for the next transaction.
#[tokio::test]
async fn resume_ends_a_pause_still_waiting_for_busy_servers() {
    let (_pg, pw) = start("");
    let pauser = connect(&pw, "admin", "pgward").await;
    let admin = connect(&pw, "admin", "pgward").await;
    let busy = connect(&pw, "postgres", "app").await;
    busy.simple_query("BEGIN").await.unwrap();
    let pause = tokio::spawn(async move { pauser.simple_query("PAUSE").await.map(|_| ()) });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!pause.is_finished(), "PAUSE waits for the busy server");
    admin.simple_query("RESUME").await.unwrap();
    let app = connect(&pw, "postgres", "app").await;
    let first = must_value(&app, "SELECT pg_backend_pid()").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = must_value(&app, "SELECT pg_backend_pid()").await;
    assert_eq!(first, second, "the idle server was closed after the RESUME");
    busy.simple_query("COMMIT").await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), pause)
        .await
        .expect("the PAUSE command ends")
        .unwrap()
        .unwrap();
}

/// A SET whose hba file cannot be read changes nothing: the running auth_type stays, and so
/// do logins.
#[tokio::test]
async fn a_set_refused_for_its_hba_file_changes_nothing() {
    let (_pg, pw) = start("auth_hba_file = /nonexistent/pg_hba.conf\n");
    let admin = connect(&pw, "admin", "pgward").await;
    let err = admin
        .simple_query("SET auth_type = 'hba'")
        .await
        .expect_err("an hba file that cannot be read");
    assert!(msg(&err).contains("auth_hba_file"), "{err}");
    let (cols, rows) = show(&admin, "SHOW CONFIG").await;
    assert_eq!(
        cell(&cols, &rows, ("key", "auth_type"), "value"),
        vec!["trust"]
    );
    app_serves(&pw).await;
}

/// A database paused and then taken out of the configuration can still be resumed (its name
/// stayed paused, and kept SUSPEND refused).
#[tokio::test]
async fn a_paused_database_taken_out_can_be_resumed() {
    let (pg, pw) = start("");
    let extra = format!("extra = {}\n", pg.db_connstr("app"));
    let with = std::fs::read_to_string(&pw.ini_path).expect("ini");
    let with_extra = with.replace("[databases]\n", &format!("[databases]\n{extra}"));
    std::fs::write(&pw.ini_path, &with_extra).expect("ini");
    pw.reload_and_wait();
    let admin = connect(&pw, "admin", "pgward").await;
    admin.simple_query("PAUSE extra").await.unwrap();
    std::fs::write(&pw.ini_path, &with).expect("ini");
    admin.simple_query("RELOAD").await.unwrap();
    admin.simple_query("RESUME extra").await.unwrap();
    admin.simple_query("SUSPEND").await.unwrap();
    admin.simple_query("RESUME").await.unwrap();
}

/// SHOW CLIENTS' request_time follows each request, one served at once by an idle server
/// (no policy, nothing waits) as one that waited for a server.
#[tokio::test]
async fn request_time_follows_requests_served_at_once() {
    let (_pg, pw) = start("");
    let admin = connect(&pw, "admin", "pgward").await;
    let app = connect(&pw, "postgres", "app").await;
    let request_time = || async {
        let (cols, rows) = show(&admin, "SHOW CLIENTS").await;
        cell(&cols, &rows, ("database", "app"), "request_time")
    };
    // The first request waits for the server opened for it; the next finds it idle.
    must_value(&app, "SELECT 1").await;
    let first = request_time().await;
    tokio::time::sleep(Duration::from_millis(2100)).await;
    must_value(&app, "SELECT 2").await;
    let second = request_time().await;
    assert_eq!(first.len(), 1);
    assert!(second > first, "request_time stayed {first:?}: {second:?}");
}

/// A client that leaves while server_check_query runs on the idle server it was given is gone
/// at once, not once the check ends.
#[tokio::test]
async fn a_client_leaving_during_the_server_check_is_gone_at_once() {
    let (_pg, pw) = start("server_check_delay = 0\nserver_check_query = SELECT pg_sleep(4)\n");
    let admin = connect(&pw, "admin", "pgward").await;
    // The first request gets a server just opened (no check); the next finds it idle.
    let mut leaving = common::raw::Raw::login(pw.port, "postgres", None, "app");
    leaving.send(&common::raw::query_message("SELECT 1"));
    tokio::time::sleep(Duration::from_millis(500)).await;
    leaving.send(&common::raw::query_message("SELECT 2"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(leaving);
    let started = std::time::Instant::now();
    loop {
        let (cols, rows) = show(&admin, "SHOW CLIENTS").await;
        if cell(&cols, &rows, ("database", "app"), "id").is_empty() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_millis(2000),
            "the client stayed while the check ran"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_client_whose_server_is_being_checked_is_waiting() {
    let (_pg, pw) = start("server_check_delay = 0\nserver_check_query = SELECT pg_sleep(2)\n");
    let admin = connect(&pw, "admin", "pgward").await;
    // The first request gets a server just opened (no check); the next finds it idle.
    let mut client = common::raw::Raw::login(pw.port, "postgres", None, "app");
    client.query("SELECT 1").expect("a server just opened");
    client.send(&common::raw::query_message("SELECT 2"));
    tokio::time::sleep(Duration::from_millis(700)).await;
    let (cols, rows) = show(&admin, "SHOW CLIENTS").await;
    assert_eq!(
        cell(&cols, &rows, ("database", "app"), "state"),
        vec!["waiting"],
        "during server_check_query"
    );
    let (cols, rows) = show(&admin, "SHOW POOLS").await;
    assert_eq!(
        cell(&cols, &rows, ("database", "app"), "cl_waiting"),
        vec!["1"]
    );
    // The server under test is neither active nor idle (PgBouncer's sv_tested).
    assert_eq!(
        cell(&cols, &rows, ("database", "app"), "sv_tested"),
        vec!["1"]
    );
    assert_eq!(
        cell(&cols, &rows, ("database", "app"), "sv_active"),
        vec!["0"]
    );
    let of = |col: &str| -> u64 {
        cell(&cols, &rows, ("database", "app"), col)[0]
            .parse()
            .expect(col)
    };
    let waited = of("maxwait") * 1_000_000 + of("maxwait_us");
    assert!(waited >= 500_000, "maxwait {waited} µs");
    let (cols, rows) = show(&admin, "SHOW SERVERS").await;
    assert_eq!(
        cell(&cols, &rows, ("database", "app"), "state"),
        vec!["tested"]
    );
    let rows = client
        .read_result(Duration::from_secs(10))
        .expect("answered after the check");
    assert_eq!(rows, vec![vec![Some("2".to_string())]]);
    let (cols, rows) = show(&admin, "SHOW CLIENTS").await;
    assert_eq!(
        cell(&cols, &rows, ("database", "app"), "state"),
        vec!["idle"]
    );
    let (cols, rows) = show(&admin, "SHOW POOLS").await;
    assert_eq!(
        cell(&cols, &rows, ("database", "app"), "sv_tested"),
        vec!["0"]
    );
    // (Idle, and due for a check at its next use: server_check_delay is 0.)
    assert_eq!(
        cell(&cols, &rows, ("database", "app"), "sv_used"),
        vec!["1"]
    );
}

#[tokio::test]
async fn a_server_running_server_reset_query_is_tested() {
    let extra = "server_reset_query = SELECT pg_sleep(2)\nserver_reset_query_always = 1\n";
    let (_pg, pw) = start(extra);
    let admin = connect(&pw, "admin", "pgward").await;
    let app = connect(&pw, "postgres", "app").await;
    assert_eq!(must_value(&app, "SELECT 7").await, "7");
    // The answer came; the reset runs on the server after it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (cols, rows) = show(&admin, "SHOW POOLS").await;
    let pool = |col: &str| cell(&cols, &rows, ("database", "app"), col);
    assert_eq!(
        (pool("sv_tested"), pool("sv_active"), pool("sv_idle")),
        (
            vec!["1".to_string()],
            vec!["0".to_string()],
            vec!["0".to_string()]
        )
    );
    let (cols, rows) = show(&admin, "SHOW SERVERS").await;
    assert_eq!(
        cell(&cols, &rows, ("database", "app"), "state"),
        vec!["tested"]
    );
    let (cols, rows) = show(&admin, "SHOW CLIENTS").await;
    assert_eq!(
        cell(&cols, &rows, ("database", "app"), "state"),
        vec!["idle"]
    );
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let (cols, rows) = show(&admin, "SHOW POOLS").await;
    let pool = |col: &str| cell(&cols, &rows, ("database", "app"), col);
    assert_eq!(
        (pool("sv_tested"), pool("sv_idle")),
        (vec!["0".to_string()], vec!["1".to_string()])
    );
}

#[tokio::test]
async fn kill_kill_client_reconnect_wait_close() {
    let (_pg, pw) = start("");
    let admin = connect(&pw, "admin", "pgward").await;
    let a = connect(&pw, "postgres", "app").await;
    let b = connect(&pw, "postgres", "app").await;
    let pid1 = must_value(&a, "SELECT pg_backend_pid()").await;
    admin.simple_query("RECONNECT app").await.unwrap();
    admin.simple_query("WAIT_CLOSE app").await.unwrap();
    let pid2 = must_value(&a, "SELECT pg_backend_pid()").await;
    assert_ne!(pid1, pid2, "RECONNECT closes servers");
    let (cols, rows) = show(&admin, "SHOW CLIENTS").await;
    let ids = cell(&cols, &rows, ("database", "app"), "id");
    assert_eq!(ids.len(), 2);
    admin
        .simple_query(&format!("KILL_CLIENT {}", ids[0]))
        .await
        .unwrap();
    let err = admin.simple_query("KILL_CLIENT 999999").await.unwrap_err();
    assert!(msg(&err).contains("client not found"), "{err}");
    let err = admin.simple_query("KILL_CLIENT abc").await.unwrap_err();
    assert!(
        msg(&err).contains("invalid client pointer supplied"),
        "{err}"
    );
    let (_, rows) = show(&admin, "SHOW CLIENTS").await;
    assert_eq!(rows.len(), 2, "one app client and the console");
    admin.simple_query("KILL app").await.unwrap();
    let (_, rows) = show(&admin, "SHOW CLIENTS").await;
    assert_eq!(rows.len(), 1, "only the console");
    assert!(a.simple_query("SELECT 1").await.is_err() && b.simple_query("SELECT 1").await.is_err());
    admin.simple_query("RESUME app").await.unwrap();
    app_serves(&pw).await;
}

#[tokio::test]
async fn set_and_reload() {
    let (_pg, pw) = start("");
    let admin = connect(&pw, "admin", "pgward").await;
    admin
        .simple_query("SET default_pool_size = 7")
        .await
        .unwrap();
    admin
        .simple_query("set server_login_retry='2';")
        .await
        .unwrap();
    let (cols, rows) = show(&admin, "SHOW CONFIG").await;
    assert_eq!(
        cell(&cols, &rows, ("key", "default_pool_size"), "value"),
        vec!["7"]
    );
    let err = admin
        .simple_query("SET default_pool_size = lots")
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&err), "08P01");
    admin
        .simple_query("SET USER postgres = 'pool_size=3 max_user_connections=4'")
        .await
        .unwrap();
    admin
        .simple_query("SET POOL postgres.app = 'pool_size=2'")
        .await
        .unwrap();
    let (cols, rows) = show(&admin, "SHOW USERS").await;
    assert_eq!(
        cell(&cols, &rows, ("name", "postgres"), "max_user_connections"),
        vec!["4"]
    );
    assert_eq!(
        cell(&cols, &rows, ("name", "postgres"), "pool_size")[0].trim(),
        "3"
    );
    app_serves(&pw).await;
    let (cols, rows) = show(&admin, "SHOW POOLS").await;
    assert_eq!(
        cell(&cols, &rows, ("database", "app"), "pool_size"),
        vec!["2"]
    );
    admin.simple_query("RELOAD").await.unwrap();
    let (cols, rows) = show(&admin, "SHOW POOLS").await;
    assert_eq!(
        cell(&cols, &rows, ("database", "app"), "pool_size"),
        vec!["2"],
        "kept across reload"
    );
    let good = std::fs::read_to_string(&pw.ini_path).unwrap();
    std::fs::write(&pw.ini_path, format!("{good}\nserver_lifetime = soon\n")).unwrap();
    let err = admin.simple_query("RELOAD").await.unwrap_err();
    assert_eq!(sqlstate(&err), "F0000");
    assert!(msg(&err).contains("pgward.ini:"), "names the file: {err}");
    app_serves(&pw).await;
}

#[tokio::test]
async fn shutdown_exits() {
    let (_pg, mut pw) = start("");
    let admin = connect(&pw, "admin", "pgward").await;
    let _ = admin.simple_query("SHUTDOWN").await;
    assert!(
        pw.wait_exit(Duration::from_secs(5)).is_some(),
        "{}",
        pw.log()
    );
}

#[tokio::test]
async fn stats_users_count_against_the_client_caps_and_admins_do_not() {
    let (_pg, pw) = start("max_db_client_connections = 1\nmax_user_client_connections = 5\n");
    let first = connect(&pw, "watcher", "pgbouncer").await;
    let refused = tokio_postgres::connect(&pw.connstr("watcher", None, "pgbouncer"), NoTls).await;
    let err = refused.err().expect("the console's database cap is 1");
    assert_eq!(sqlstate(&err), "53300", "{err}");
    assert_eq!(
        msg(&err),
        "client connections exceeded (max_db_client_connections)"
    );
    // Admins are never refused by the caps, as in PgBouncer.
    let a = connect(&pw, "admin", "pgbouncer").await;
    let b = connect(&pw, "admin", "pgbouncer").await;
    show(&a, "SHOW VERSION").await;
    show(&b, "SHOW VERSION").await;
    drop(first);
    // The slot is given back when the session ends (pgward sees the close a moment later).
    let deadline = std::time::Instant::now() + 5 * common::SECOND;
    let watcher = loop {
        match tokio_postgres::connect(&pw.connstr("watcher", None, "pgbouncer"), NoTls).await {
            Ok((client, conn)) => {
                tokio::spawn(conn);
                break client;
            }
            Err(e) if std::time::Instant::now() < deadline => {
                assert_eq!(sqlstate(&e), "53300", "{e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("the slot was not given back: {e}"),
        }
    };
    show(&watcher, "SHOW POOLS").await;
}

#[tokio::test]
async fn show_stats_counts_parses_and_binds_of_mapped_statements() {
    let (_pg, pw) = start("max_prepared_statements = 10\n");
    let client = connect(&pw, "postgres", "app").await;
    let statement = client.prepare("SELECT $1::int").await.expect("prepare");
    for i in 0..3 {
        let row = client.query_one(&statement, &[&i]).await.expect("query");
        assert_eq!(row.get::<_, i32>(0), i);
    }
    let admin = connect(&pw, "admin", "pgbouncer").await;
    let (cols, rows) = show(&admin, "SHOW STATS").await;
    let stat = |col| cell(&cols, &rows, ("database", "app"), col);
    assert_eq!(stat("total_client_parse_count"), ["1"]);
    assert_eq!(stat("total_server_parse_count"), ["1"]);
    assert_eq!(stat("total_bind_count"), ["3"]);
}

/// SET verbose changes the log's level at once (a login is logged at DEBUG), as in PgBouncer.
#[tokio::test]
async fn set_verbose_changes_the_log_level_at_once() {
    let (_pg, pw) = start("");
    let logins = || pw.log().matches("client logged in").count();
    connect(&pw, "postgres", "app").await;
    assert_eq!(logins(), 0, "a login logged at the default level");
    let admin = connect(&pw, "admin", "pgward").await;
    admin.simple_query("SET verbose = 1").await.unwrap();
    connect(&pw, "postgres", "app").await;
    let logged = common::eventually(common::SECOND, || logins() > 0);
    assert!(logged, "no DEBUG line after SET verbose = 1\n{}", pw.log());
    admin.simple_query("SET verbose = 0").await.unwrap();
    let before = logins();
    connect(&pw, "postgres", "app").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(logins(), before, "a DEBUG line after SET verbose = 0");
}

/// After a RECONNECT new clients are welcomed with the parameters of the first server logged
/// in after it (here a database's changed TimeZone), once it has.
#[tokio::test]
async fn a_reconnect_welcomes_new_clients_with_the_new_servers_parameters() {
    let (pg, pw) = start("");
    let before = must_value(&connect(&pw, "postgres", "app").await, "SHOW TimeZone").await;
    assert_ne!(before, "Asia/Tokyo");
    pg.sql("ALTER DATABASE app SET TimeZone = 'Asia/Tokyo'");
    let admin = connect(&pw, "admin", "pgward").await;
    admin.simple_query("RECONNECT app").await.unwrap();
    // A server logs in after the RECONNECT (for this client's statement)...
    must_value(&connect(&pw, "postgres", "app").await, "SELECT 1").await;
    // ...and clients that come after it are welcomed with its parameters.
    let after = must_value(&connect(&pw, "postgres", "app").await, "SHOW TimeZone").await;
    assert_eq!(after, "Asia/Tokyo");
}

/// A login after a RECONNECT waits for the parameters of a server logged in after it, and
/// with the pool full gets one opened above pool_size for them, as in PgBouncer: otherwise
/// it would keep the old parameters (here a database's TimeZone) for its whole session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_after_a_reconnect_is_welcomed_with_a_new_servers_parameters() {
    let (pg, pw) = start("default_pool_size = 1\nquery_wait_timeout = 5\n");
    let busy = connect(&pw, "postgres", "app").await;
    busy.simple_query("BEGIN").await.unwrap();
    pg.sql("ALTER DATABASE app SET TimeZone = 'Asia/Tokyo'");
    let admin = connect(&pw, "admin", "pgward").await;
    admin.simple_query("RECONNECT app").await.unwrap();
    let after = must_value(&connect(&pw, "postgres", "app").await, "SHOW TimeZone").await;
    assert_eq!(after, "Asia/Tokyo", "{}", pw.log());
    busy.simple_query("COMMIT").await.unwrap();
}

/// A login waiting for the parameters of a new server after a RECONNECT is one of its
/// pool's waiting clients (SHOW POOLS' cl_waiting, SHOW CLIENTS' state), as in PgBouncer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_waiting_for_new_parameters_is_counted_as_waiting() {
    let (pg, pw) = start("query_wait_timeout = 20\n");
    let first = connect(&pw, "postgres", "app").await;
    first.simple_query("SELECT 1").await.unwrap();
    // The server is down: the login waits for a server that cannot log in.
    pg.stop();
    let admin = connect(&pw, "admin", "pgward").await;
    admin.simple_query("RECONNECT app").await.unwrap();
    let connstr = pw.connstr("postgres", None, "app");
    let login = tokio::spawn(async move { tokio_postgres::connect(&connstr, NoTls).await });
    tokio::time::sleep(Duration::from_millis(700)).await;
    let (cols, rows) = show(&admin, "SHOW POOLS").await;
    let waiting = cell(&cols, &rows, ("database", "app"), "cl_waiting");
    let (cols, rows) = show(&admin, "SHOW CLIENTS").await;
    let mut states = cell(&cols, &rows, ("database", "app"), "state");
    states.sort();
    assert_eq!(
        (waiting, states),
        (
            vec!["1".to_string()],
            vec!["idle".to_string(), "waiting".to_string()]
        ),
        "{}",
        pw.log()
    );
    login.abort();
}

/// A database's TimeZone changed and a RECONNECT while `user`'s one server sits in a
/// transaction; a new login of `user` is made meanwhile, the transaction ends after 1.5 s,
/// and the login must then have the new TimeZone.
async fn new_zone_after_the_transaction(pg: &Postgres, pw: &Pgward, user: &str) {
    let busy = connect(pw, user, "app").await;
    busy.simple_query("BEGIN").await.unwrap();
    pg.sql("ALTER DATABASE app SET TimeZone = 'Asia/Tokyo'");
    let admin = connect(pw, "admin", "pgward").await;
    admin.simple_query("RECONNECT app").await.unwrap();
    let login = {
        let connstr = pw.connstr(user, None, "app");
        tokio::spawn(async move {
            let (client, conn) = tokio_postgres::connect(&connstr, NoTls).await?;
            tokio::spawn(conn);
            client
                .query_one("SHOW TimeZone", &[])
                .await?
                .try_get::<_, String>(0)
        })
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    busy.simple_query("COMMIT").await.unwrap();
    let zone = tokio::time::timeout(Duration::from_secs(8), login)
        .await
        .unwrap_or_else(|_| panic!("the login still waits\n{}", pw.log()))
        .expect("the login's task");
    assert_eq!(
        zone.as_deref().ok(),
        Some("Asia/Tokyo"),
        "{zone:?}\n{}",
        pw.log()
    );
}

/// A login waiting for new parameters after a RECONNECT is not left waiting when the server
/// opened for them is turned away for now (too many connections for its role): another is
/// opened, and logs in once there is room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_waiting_for_new_parameters_outlasts_a_refused_server() {
    let (pg, pw) = start("default_pool_size = 1\nquery_wait_timeout = 10\n");
    pg.sql("ALTER ROLE trustuser CONNECTION LIMIT 1");
    new_zone_after_the_transaction(&pg, &pw, "trustuser").await;
}

/// With max_db_connections reached (by the server of the transaction), a login after a
/// RECONNECT waits for room to open a server for new parameters, as PgBouncer's does, rather
/// than keep the old ones for its session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_after_a_reconnect_waits_for_room_for_new_parameters() {
    let (pg, pw) =
        start("default_pool_size = 1\nmax_db_connections = 1\nquery_wait_timeout = 10\n");
    new_zone_after_the_transaction(&pg, &pw, "postgres").await;
}

/// A KILL with no database pauses each database with a pool, not the pooler, as PgBouncer
/// does: each is resumed by its RESUME db (a bare RESUME finds nothing paused), and a KILL is
/// refused while the pooler is paused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_pauses_each_database_not_the_pooler() {
    let (_pg, pw) = start("");
    let app = connect(&pw, "postgres", "app").await;
    app.simple_query("SELECT 1").await.unwrap();
    let admin = connect(&pw, "admin", "pgward").await;
    admin.simple_query("KILL").await.unwrap();
    let bare = admin
        .simple_query("RESUME")
        .await
        .expect_err("a bare RESUME");
    assert_eq!(msg(&bare), "pooler is not paused/suspended");
    admin.simple_query("RESUME app").await.unwrap();
    let again = connect(&pw, "postgres", "app").await;
    let value = must_value(&again, "SELECT 'served'").await;
    assert_eq!(value, "served");
    admin.simple_query("PAUSE").await.unwrap();
    let refused = admin
        .simple_query("KILL app")
        .await
        .expect_err("KILL while paused");
    assert_eq!(msg(&refused), "already suspended/paused");
    admin.simple_query("RESUME").await.unwrap();
}

/// The console answers the session parameters client libraries set or read as PgBouncer
/// does (psql's \encoding, a GUI's SHOW timezone): a SET of one is ignored with a notice, for
/// any user; a SHOW gives a fixed value. A SET of a setting is tagged with what it set.
#[test]
fn the_console_fakes_session_parameters_and_tags_its_sets() {
    let (_pg, pw) = start("");
    let run = |user: &str, sql: &str| {
        let out = common::psql_at(pw.port, user, None, "pgward", sql);
        assert!(out.status.success(), "{sql}: {}", stderr_of(&out));
        (stdout_of(&out), stderr_of(&out))
    };
    let (tag, notice) = run("watcher", "SET client_encoding = 'UTF8'");
    assert_eq!(tag.trim(), "SET");
    assert!(notice.contains("NOTICE:  SET ignored"), "{notice}");
    assert_eq!(run("watcher", "SHOW client_encoding").0.trim(), "UTF-8");
    assert_eq!(run("watcher", "SHOW TimeZone").0.trim(), "GMT");
    let (tag, _) = run("admin", "SET server_login_retry = 3");
    assert_eq!(tag.trim(), "SET server_login_retry=3");
    // SELECT is SHOW's other name.
    let (lists, _) = run("watcher", "SELECT LISTS");
    assert!(
        lists.lines().any(|l| l.starts_with("databases|")),
        "{lists}"
    );
    assert_eq!(run("watcher", "SELECT TimeZone").0.trim(), "GMT");
}

/// SHOW DATABASES shows a host list whole, as PgBouncer does.
#[tokio::test]
async fn show_databases_shows_a_host_list_whole() {
    let pg = Postgres::start();
    let settings = "auth_type = trust\nadmin_users = admin\npool_mode = transaction\n";
    let multi = format!(
        "multi = host=127.0.0.1,localhost port={} dbname=app\n",
        pg.port
    );
    let pw = Pgward::start(&Pgward::ini(&pg, settings, &multi));
    let admin = connect(&pw, "admin", "pgward").await;
    let (cols, rows) = show(&admin, "SHOW DATABASES").await;
    assert_eq!(
        cell(&cols, &rows, ("name", "multi"), "host"),
        vec!["127.0.0.1,localhost"]
    );
}

/// `SET USER name = 'max_user_connections=0'` puts the global cap back in force (0 is the
/// global value, as in PgBouncer), over an earlier SET USER.
#[tokio::test]
async fn set_user_of_a_zero_cap_puts_the_global_one_back() {
    let (_pg, pw) = start("max_user_connections = 7\n");
    let admin = connect(&pw, "admin", "pgward").await;
    admin
        .simple_query("SET USER trustuser = 'max_user_connections=1'")
        .await
        .unwrap();
    let cap = |rows: &(Vec<String>, Vec<Vec<Option<String>>>)| {
        cell(
            &rows.0,
            &rows.1,
            ("name", "trustuser"),
            "max_user_connections",
        )
    };
    assert_eq!(cap(&show(&admin, "SHOW USERS").await), vec!["1"]);
    admin
        .simple_query("SET USER trustuser = 'max_user_connections=0'")
        .await
        .unwrap();
    assert_eq!(cap(&show(&admin, "SHOW USERS").await), vec!["7"]);
}

/// A database the `*` entry would serve takes the console's commands before any client has
/// used it, as PgBouncer registers it for them.
#[test]
fn console_commands_take_a_database_the_star_entry_serves() {
    let pg = Postgres::start();
    let settings = "auth_type = trust\nadmin_users = admin\npool_mode = transaction\n";
    let star = format!("* = host={} port={}\n", common::HOST, pg.port);
    let pw = Pgward::start(&Pgward::ini(&pg, settings, &star));
    let run = |sql: &str| {
        let out = common::psql_at(pw.port, "admin", None, "pgward", sql);
        assert!(out.status.success(), "{sql}: {}", stderr_of(&out));
    };
    for sql in [
        "PAUSE auto1",
        "RESUME auto1",
        "RECONNECT auto1",
        "WAIT_CLOSE auto1",
        "DISABLE auto1",
    ] {
        run(sql);
    }
    let refused = common::psql_at(pw.port, "trustuser", None, "auto1", "SELECT 1");
    assert!(
        stderr_of(&refused).contains("database \"auto1\" is disabled"),
        "{}",
        stderr_of(&refused)
    );
    run("ENABLE auto1");
    let unknown = common::psql_at(pw.port, "admin", None, "pgward", "PAUSE pgward");
    assert!(!unknown.status.success());
}
