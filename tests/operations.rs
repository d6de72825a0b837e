//! Operating pgward: reloads under load that lose no transaction, a broken reload that changes
//! nothing, reloads that rotate a server password or change a database's forced user (the old
//! pool keeps its user and closes its servers), runtime limits that evict, signals, rolling
//! restarts over so_reuseport (no transaction fails; the new process keeps its socket and
//! pidfile), and the Prometheus endpoint.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::thread::{self, sleep};
use std::time::{Duration, Instant};

use common::raw::{new_client_value, Raw};
use common::{
    client_command, eventually, free_port, pgbench_at, read_lossy, server_count, stderr_of,
    stdout_of, Pgward, Postgres, HOST, SECOND,
};
use tokio_postgres::NoTls;

const SETTINGS: &str = "auth_type = trust\nadmin_users = admin\npool_mode = transaction\n";

/// A pgbench script file in `dir` running `sql` once per transaction.
fn script(dir: &Path, name: &str, sql: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, format!("{sql}\n")).expect("script");
    path.display().to_string()
}

/// Asserts that pgbench ran transactions and none failed.
fn assert_clean_run(out: &Output, what: &str) {
    let text = stdout_of(out);
    assert!(out.status.success(), "{what}: {text}\n{}", stderr_of(out));
    let processed = text
        .lines()
        .find_map(|l| l.strip_prefix("number of transactions actually processed: "))
        .and_then(|v| v.split('/').next())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(0);
    assert!(processed > 0, "{what}: no transaction ran\n{text}");
    if let Some(failed) = text
        .lines()
        .find_map(|l| l.strip_prefix("number of failed transactions: "))
    {
        assert!(failed.starts_with("0 "), "{what}: {failed}\n{text}");
    }
}

/// Runs a console command with psql (as `admin` over TCP).
fn console(port: u16, sql: &str) -> Output {
    common::psql_at(port, "admin", None, "pgward", sql)
}

#[test]
fn reload_changing_pool_size_under_load_loses_nothing() {
    let pg = Postgres::start();
    let bench_db = format!("bench = {} pool_size=2", pg.db_connstr("app"));
    let pw = Pgward::start(&Pgward::ini(&pg, SETTINGS, &bench_db));
    let dir = tempfile::tempdir().expect("dir");
    let file = script(dir.path(), "q.sql", "SELECT pg_sleep(0.002);");
    let port = pw.port;
    let bench = thread::spawn(move || {
        pgbench_at(
            port,
            None,
            &[
                "-n", "-M", "simple", "-c", "6", "-T", "3", "-f", &file, "bench",
            ],
        )
    });
    sleep(Duration::from_millis(1000));
    let ini = std::fs::read_to_string(&pw.ini_path).expect("ini");
    std::fs::write(&pw.ini_path, ini.replace("pool_size=2", "pool_size=5")).expect("ini");
    pw.reload();
    sleep(Duration::from_millis(800));
    let pools = stdout_of(&console(port, "SHOW POOLS"));
    assert!(
        pools
            .lines()
            .any(|l| l.starts_with("bench|postgres|") && l.ends_with("|5|0")),
        "{pools}"
    );
    assert_clean_run(&bench.join().expect("pgbench"), "pgbench across the reload");
}

#[test]
fn a_broken_reload_keeps_the_running_configuration() {
    let pg = Postgres::start();
    let pw = Pgward::start(&Pgward::ini(&pg, SETTINGS, ""));
    let good = std::fs::read_to_string(&pw.ini_path).expect("ini");
    std::fs::write(&pw.ini_path, format!("{good}\ndefault_pool_size = many\n")).expect("ini");
    pw.reload();
    sleep(Duration::from_millis(500));
    let log = pw.log();
    assert!(
        log.contains("reload failed") && log.contains("pgward.ini:"),
        "{log}"
    );
    let out = pw.psql("postgres", None, "app", "SELECT 1");
    assert!(out.status.success(), "{}", stderr_of(&out));
    let config = stdout_of(&console(pw.port, "SHOW CONFIG"));
    assert!(config.contains("default_pool_size|20|20|yes"), "{config}");
    let reload = console(pw.port, "RELOAD");
    assert!(!reload.status.success());
    assert!(
        stderr_of(&reload).contains("RELOAD failed"),
        "{}",
        stderr_of(&reload)
    );
}

#[test]
fn reload_rotates_the_server_password() {
    let pg = Postgres::start();
    let dbs = format!(
        "rotated = {} user=scramuser password=scrampass\n",
        pg.db_connstr("app")
    );
    let pw = Pgward::trusting(&pg, "pool_mode = transaction\n", &dbs);
    // A holds its server, so the next client needs a new login.
    let mut holder = pw.client_as("trustuser", "rotated");
    assert_eq!(holder.value("SELECT current_user"), "scramuser");
    holder.value("BEGIN");

    pg.sql("ALTER ROLE scramuser PASSWORD 'newsecret'");
    let ini = read_lossy(&pw.ini_path);
    let rotated = ini.replace("password=scrampass", "password=newsecret");
    assert_ne!(ini, rotated);
    std::fs::write(&pw.ini_path, rotated).expect("rewrite the ini");
    let reloads = || pw.log().matches("configuration reloaded").count();
    let before = reloads();
    pw.reload();
    assert!(
        eventually(3 * SECOND, || reloads() > before),
        "{}",
        pw.log()
    );

    assert_eq!(
        new_client_value(
            &pw,
            ("trustuser", "rotated"),
            "SELECT current_user",
            5 * SECOND
        ),
        Ok("scramuser".to_string()),
        "new login after the password changed"
    );
    assert_eq!(holder.value("COMMIT"), "");
}

/// Starts pgward with database `d` forcing `trustuser`, and a client that ran a query on it;
/// then forces `postgres` instead and reloads.
fn forced_user_changed(pg: &Postgres) -> (Pgward, Raw) {
    let db = |user: &str| format!("d = {} user={user}", pg.db_connstr("app"));
    let pw = Pgward::trusting(pg, "pool_mode = transaction\n", &db("trustuser"));
    let mut before = pw.client_as("trustuser", "d");
    assert_eq!(before.value("SELECT current_user"), "trustuser");
    assert_eq!(
        server_count(pg, "trustuser", "app"),
        1,
        "servers as trustuser"
    );
    let ini = read_lossy(&pw.ini_path).replace(&db("trustuser"), &db("postgres"));
    std::fs::write(&pw.ini_path, ini).unwrap_or_else(|e| panic!("ini: {e}"));
    pw.reload_and_wait();
    let mut after = pw.client_as("trustuser", "d");
    assert_eq!(
        after.value("SELECT current_user"),
        "postgres",
        "a new client after the reload"
    );
    (pw, before)
}

/// Whether `pg` ends up with only `count` backends on `app`; the backends otherwise.
fn backends_left(pg: &Postgres, count: u32) -> Result<(), String> {
    let total = || server_count(pg, "trustuser", "app") + server_count(pg, "postgres", "app");
    if eventually(5 * SECOND, || total() == count) {
        return Ok(());
    }
    Err(pg.sql_in(
        "postgres",
        "SELECT string_agg(usename || ' ' || state || ': ' || query, '; ') \
         FROM pg_stat_activity WHERE datname = 'app' AND pid <> pg_backend_pid()",
    ))
}

#[test]
fn old_pool_keeps_its_forced_user_after_a_reload() {
    let pg = Postgres::start();
    let (pw, mut before) = forced_user_changed(&pg);
    // The client still on the old pool (d, trustuser) is not served as the new user.
    assert_eq!(
        before.value("SELECT current_user"),
        "trustuser",
        "the old pool logged in as the new forced user\n{}",
        pw.log()
    );
}

#[test]
fn old_pool_servers_close_as_released_after_a_reload() {
    let pg = Postgres::start();
    let (pw, mut before) = forced_user_changed(&pg);
    assert_eq!(before.value("SELECT 'served'"), "served");
    // The old pool keeps nothing once its client is done: only the new pool's server is left.
    if let Err(left) = backends_left(&pg, 1) {
        panic!("the old pool kept a server: {left}\n{}", pw.log());
    }
}

/// A database taken out by a reload and put back by the next one pools again: its servers
/// are kept between transactions (they were closed after each, for good).
#[test]
fn a_database_removed_and_put_back_pools_again() {
    let pg = Postgres::start();
    let db = format!("d = {}", pg.db_connstr("app"));
    let pw = Pgward::trusting(&pg, "pool_mode = transaction\n", &db);
    // Connected through both reloads, so the pool stays.
    let mut client = pw.client_as("trustuser", "d");
    assert_eq!(client.value("SELECT 1"), "1");
    let with = read_lossy(&pw.ini_path);
    std::fs::write(&pw.ini_path, with.replace(&db, "")).unwrap_or_else(|e| panic!("ini: {e}"));
    pw.reload_and_wait();
    std::fs::write(&pw.ini_path, &with).unwrap_or_else(|e| panic!("ini: {e}"));
    pw.reload_and_wait();
    let first = client.value("SELECT pg_backend_pid()");
    let second = client.value("SELECT pg_backend_pid()");
    assert_eq!(
        first,
        second,
        "each transaction had a new server\n{}",
        pw.log()
    );
}

/// logrotate moves the log file away and sends SIGHUP: pgward writes to a new file at the
/// configured path from then on, as PgBouncer does.
#[test]
fn a_reload_opens_a_moved_logfile_again() {
    let pg = Postgres::start();
    let pw = Pgward::start(&Pgward::ini(&pg, SETTINGS, ""));
    let rotated = pw.log_path.with_extension("log.1");
    std::fs::rename(&pw.log_path, &rotated).unwrap_or_else(|e| panic!("rotate: {e}"));
    pw.reload();
    let reopened = eventually(10 * SECOND, || {
        read_lossy(&pw.log_path).contains("configuration reloaded")
    });
    assert!(
        reopened,
        "nothing logged at the path\n{}",
        read_lossy(&rotated)
    );
    assert!(read_lossy(&rotated).contains("started"));
    // A reload that names another logfile moves the log there.
    let elsewhere = pw.log_path.with_extension("elsewhere");
    let ini = read_lossy(&pw.ini_path).replace(
        &pw.log_path.display().to_string(),
        &elsewhere.display().to_string(),
    );
    std::fs::write(&pw.ini_path, ini).unwrap_or_else(|e| panic!("ini: {e}"));
    pw.reload();
    let moved = eventually(10 * SECOND, || {
        read_lossy(&elsewhere).contains("configuration reloaded")
    });
    assert!(moved, "nothing logged at the new path\n{}", pw.log());
}

#[test]
fn set_user_below_current_use_evicts_within_a_second() {
    let pg = Postgres::start();
    let settings = format!("{SETTINGS}default_pool_size = 8\n");
    let pw = Pgward::start(&Pgward::ini(&pg, &settings, ""));
    let dir = tempfile::tempdir().expect("dir");
    let slow = script(dir.path(), "slow.sql", "SELECT pg_sleep(0.02);");
    let fast = script(dir.path(), "fast.sql", "SELECT 1;");
    let port = pw.port;
    let tenant = thread::spawn(move || {
        pgbench_at(
            port,
            None,
            &[
                "-n",
                "-U",
                "trustuser",
                "-c",
                "8",
                "-j",
                "2",
                "-T",
                "4",
                "-f",
                &slow,
                "app",
            ],
        )
    });
    let other = thread::spawn(move || {
        pgbench_at(
            port,
            None,
            &["-n", "-c", "2", "-T", "4", "-f", &fast, "app"],
        )
    });
    sleep(Duration::from_millis(1500));
    assert!(
        pg.backend_count("trustuser") > 2,
        "the tenant grew its pool"
    );
    let set = console(port, "SET USER trustuser = 'max_user_connections=2'");
    assert!(set.status.success(), "{}", stderr_of(&set));
    let since = Instant::now();
    while pg.backend_count("trustuser") > 2 {
        assert!(
            since.elapsed() < Duration::from_secs(1),
            "still above the limit after a second"
        );
        sleep(Duration::from_millis(20));
    }
    let users = stdout_of(&console(port, "SHOW USERS"));
    assert!(
        users
            .lines()
            .any(|l| l.starts_with("trustuser|") && l.contains("||2|")),
        "{users}"
    );
    assert_clean_run(&tenant.join().expect("pgbench"), "the evicted tenant");
    assert_clean_run(&other.join().expect("pgbench"), "another user");
    assert!(pg.backend_count("trustuser") <= 2);
}

#[test]
fn sigterm_waits_for_clients_and_a_second_one_exits() {
    let pg = Postgres::start();
    let mut pw = Pgward::start(&Pgward::ini(&pg, SETTINGS, ""));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    let client = rt.block_on(async {
        let (c, conn) = tokio_postgres::connect(&pw.connstr("postgres", None, "app"), NoTls)
            .await
            .expect("connect");
        tokio::spawn(conn);
        c
    });
    pw.signal(libc::SIGTERM);
    sleep(Duration::from_millis(300));
    rt.block_on(client.simple_query("SELECT 1"))
        .expect("the client goes on");
    assert!(
        TcpStream::connect((HOST, pw.port)).is_err(),
        "no new connections"
    );
    assert!(
        pw.wait_exit(Duration::from_millis(300)).is_none(),
        "waits for the client"
    );
    drop(client);
    rt.block_on(async { tokio::time::sleep(Duration::from_millis(50)).await });
    assert!(
        pw.wait_exit(Duration::from_secs(3)).is_some(),
        "exits once the client left\n{}",
        pw.log()
    );

    let mut pw = Pgward::start(&Pgward::ini(&pg, SETTINGS, ""));
    let out = pw.psql("postgres", None, "app", "SELECT 1");
    assert!(out.status.success());
    let holder = rt.block_on(async {
        let (c, conn) = tokio_postgres::connect(&pw.connstr("postgres", None, "app"), NoTls)
            .await
            .expect("connect");
        tokio::spawn(conn);
        c
    });
    pw.signal(libc::SIGINT);
    sleep(Duration::from_millis(200));
    pw.signal(libc::SIGINT);
    assert!(
        pw.wait_exit(Duration::from_secs(3)).is_some(),
        "a second SIGINT exits at once"
    );
    drop(holder);
}

#[test]
fn sigusr1_pauses_and_sigusr2_resumes() {
    let pg = Postgres::start();
    let pw = Pgward::start(&Pgward::ini(&pg, SETTINGS, ""));
    pw.signal(libc::SIGUSR1);
    let paused = common::eventually(Duration::from_secs(5), || {
        stdout_of(&console(pw.port, "SHOW STATE")).contains("paused|yes")
    });
    assert!(paused, "{}", stdout_of(&console(pw.port, "SHOW STATE")));
    let port = pw.port;
    let held = thread::spawn(move || common::psql_at(port, "postgres", None, "app", "SELECT 1"));
    sleep(Duration::from_millis(500));
    assert!(!held.is_finished(), "paused");
    pw.signal(libc::SIGUSR2);
    assert!(held.join().expect("psql").status.success());
}

/// A reload asked for the moment pgward listens (a service manager's reload right after the
/// start) reloads it and never ends the process: the signals are pgward's before any socket is.
/// Here pgward reads a large state file between binding and serving.
#[test]
fn a_sighup_the_moment_pgward_listens_reloads_it() {
    let pg = Postgres::start();
    let dir = common::shared_tempdir("pgward-state-");
    let state = dir.path().join("state.json");
    let pad = "x".repeat(48 << 20);
    std::fs::write(
        &state,
        format!("{{\"pad\":\"{pad}\",\"format\":1,\"factors\":[]}}"),
    )
    .expect("write the state file");
    let settings = format!("{SETTINGS}state_file = {}\n", state.display());
    let mut pw = Pgward::start(&Pgward::ini(&pg, &settings, ""));
    pw.reload();
    assert!(
        pw.wait_exit(Duration::from_millis(500)).is_none(),
        "a SIGHUP ended pgward\n{}",
        pw.log()
    );
    let reloaded = eventually(10 * SECOND, || pw.log().contains("configuration reloaded"));
    assert!(reloaded, "no reload\n{}", pw.log());
    assert!(pw.wait_exit(Duration::ZERO).is_none(), "{}", pw.log());
}

/// A pgward process started by hand on `port` with so_reuseport and `settings` (the fixture
/// picks its own port): its ini, log and Unix socket in `dir`, and its pidfile there too, shared
/// with any other instance started in the same `dir`.
struct Instance {
    child: Child,
    log: PathBuf,
}

impl Instance {
    /// Starts instance number `n` and waits until it has written its pid and logged its start.
    fn start(pg: &Postgres, port: u16, settings: &str, dir: &Path, n: u32) -> Instance {
        let log = dir.join(format!("pgward{n}.log"));
        let ini = format!(
            "[databases]\napp = {}\n[pgbouncer]\n{settings}listen_addr = {HOST}\n\
             listen_port = {port}\nso_reuseport = 1\nunix_socket_dir = {}\nlogfile = {}\n\
             pidfile = {}\n",
            pg.db_connstr("app"),
            dir.display(),
            log.display(),
            dir.join("pgward.pid").display()
        );
        let path = dir.join(format!("pgward{n}.ini"));
        let ini = common::with_test_auth_file(&ini, dir);
        std::fs::write(&path, ini).unwrap_or_else(|e| panic!("ini: {e}"));
        let program = std::env::var_os("PGWARD_TEST_BINARY").map_or_else(
            || PathBuf::from(env!("CARGO_BIN_EXE_pgward")),
            PathBuf::from,
        );
        let child = Command::new(program)
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start pgward: {e}"));
        let instance = Instance { child, log };
        let pidfile = dir.join("pgward.pid");
        let pid = instance.child.id().to_string();
        assert!(
            eventually(10 * SECOND, || read_lossy(&pidfile).trim() == pid
                && read_lossy(&instance.log).contains("started")),
            "pgward #{n} did not start:\n{}",
            read_lossy(&instance.log)
        );
        instance
    }

    /// Sends SIGTERM; whether the process exits within `limit`.
    fn terminated_within(&mut self, limit: Duration) -> bool {
        let pid = libc::pid_t::try_from(self.child.id()).unwrap_or_else(|e| panic!("pid: {e}"));
        // SAFETY: kill(2) on our own child, which has not been waited for.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
        let since = Instant::now();
        while since.elapsed() < limit {
            if let Ok(Some(_)) = self.child.try_wait() {
                return true;
            }
            sleep(Duration::from_millis(20));
        }
        false
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn rolling_restart_over_so_reuseport_fails_no_transaction() {
    // Connections still queued on the old process's socket when it closes move to the new
    // one only with tcp_migrate_req, as the documentation of so_reuseport says; without
    // it the kernel resets them. Set it when we may (the tests run as root in CI).
    let _ = std::fs::write("/proc/sys/net/ipv4/tcp_migrate_req", "1");
    let pg = Postgres::start();
    let port = free_port();
    let (old_dir, new_dir) = (
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    );
    let mut old = Instance::start(&pg, port, SETTINGS, old_dir.path(), 1);
    let dir = tempfile::tempdir().expect("dir");
    let file = script(dir.path(), "q.sql", "SELECT 1;");
    let bench = thread::spawn(move || {
        pgbench_at(
            port,
            None,
            &["-n", "-C", "-c", "4", "-T", "4", "-f", &file, "app"],
        )
    });
    sleep(Duration::from_millis(1000));
    let new = Instance::start(&pg, port, SETTINGS, new_dir.path(), 2);
    assert!(
        old.terminated_within(Duration::from_secs(5)),
        "{}",
        std::fs::read_to_string(&old.log).unwrap_or_default()
    );
    assert_clean_run(
        &bench.join().expect("pgbench"),
        "pgbench across the restart",
    );
    let out = common::psql_at(port, "postgres", None, "app", "SELECT 1");
    assert!(
        out.status.success(),
        "the new process serves\n{}",
        std::fs::read_to_string(&new.log).unwrap_or_default()
    );
}

#[test]
fn rolling_restart_leaves_the_new_socket_and_pidfile() {
    let pg = Postgres::start();
    let port = free_port();
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("dir: {e}"));
    let settings = "auth_type = trust\npool_mode = transaction\n";
    let mut old = Instance::start(&pg, port, settings, dir.path(), 1);
    let new = Instance::start(&pg, port, settings, dir.path(), 2);
    assert!(
        old.terminated_within(10 * SECOND),
        "no exit after SIGTERM:\n{}",
        read_lossy(&old.log)
    );

    let pidfile = read_lossy(&dir.path().join("pgward.pid"));
    assert_eq!(pidfile.trim(), new.child.id().to_string(), "the pidfile");
    let mut psql = client_command("psql", None);
    psql.args(["-X", "-w", "-At", "-h"])
        .arg(dir.path())
        .args(["-p", &port.to_string(), "-U", "postgres", "-d", "app"])
        .args(["-c", "SELECT 1"]);
    let out = psql
        .output()
        .unwrap_or_else(|e| panic!("cannot run psql: {e}"));
    assert!(
        out.status.success(),
        "the new process over its Unix socket: {}\n{}",
        stderr_of(&out),
        read_lossy(&new.log)
    );
}

/// GET `path` over HTTP/1.0; the body of the answer.
fn http_get(port: u16, path: &str) -> String {
    let mut s = TcpStream::connect((HOST, port)).expect("metrics port");
    write!(s, "GET {path} HTTP/1.0\r\nHost: {HOST}\r\n\r\n").expect("request");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("response");
    assert!(
        text.starts_with("HTTP/1.0 200") || text.starts_with("HTTP/1.1 200"),
        "{text}"
    );
    text.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default()
}

/// Samples of the exposition text: (name, labels, value).
fn samples(text: &str) -> Vec<(String, String, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').expect("a sample line");
            let (name, labels) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            let value: f64 = value.parse().unwrap_or_else(|e| panic!("{l}: {e}"));
            (name.to_string(), labels.to_string(), value)
        })
        .collect()
}

#[test]
fn metrics_connections_that_send_no_whole_request_are_closed() {
    let pg = Postgres::start();
    let metrics_port = free_port();
    let settings = format!("{SETTINGS}prometheus_listen = {HOST}:{metrics_port}\n");
    let _pw = Pgward::start(&Pgward::ini(&pg, &settings, ""));
    // One connection sends half a request header, another nothing at all.
    let mut partial = TcpStream::connect((HOST, metrics_port)).expect("connect");
    partial
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    let mut silent = TcpStream::connect((HOST, metrics_port)).expect("connect");
    for stream in [&mut partial, &mut silent] {
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let started = Instant::now();
        let mut buf = [0u8; 256];
        // The server closes the connection (end of stream or reset) instead of holding it.
        let closed = match stream.read(&mut buf) {
            Ok(n) => n == 0,
            Err(e) => !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
        };
        assert!(closed, "connection still open");
        assert!(
            started.elapsed() < Duration::from_secs(25),
            "closed only after {:?}",
            started.elapsed()
        );
    }
    // The endpoint still answers.
    assert!(http_get(metrics_port, "/metrics").contains("# EOF"));
}

#[test]
fn metrics_endpoint_is_scraped_and_parsed() {
    let pg = Postgres::start();
    let metrics_port = free_port();
    let settings = format!("{SETTINGS}prometheus_listen = {HOST}:{metrics_port}\n");
    let pw = Pgward::start(&Pgward::ini(&pg, &settings, ""));
    for _ in 0..3 {
        assert!(pw
            .psql("postgres", None, "app", "SELECT 1")
            .status
            .success());
    }
    let body = http_get(metrics_port, "/metrics");
    assert!(body.trim_end().ends_with("# EOF"), "{body}");
    let all = samples(&body);
    let get = |name: &str, labels: &str| {
        all.iter()
            .find(|(n, l, _)| n == name && l.contains(labels))
            .map(|(_, _, v)| *v)
            .unwrap_or_else(|| panic!("no {name}{{{labels}}} in\n{body}"))
    };
    assert!(get("pgward_database_queries_total", "database=\"app\"") >= 3.0);
    assert!(get("pgward_database_client_logins_total", "database=\"app\"") >= 3.0);
    assert_eq!(get("pgward_pool_servers", "state=\"idle\""), 1.0);
    assert!(get("pgward_pool_size", "database=\"app\"") >= 1.0);
    assert!(get("pgward_uptime_seconds", "") >= 0.0);
    for name in [
        "pgward_pool_clients",
        "pgward_database_paused",
        "pgward_client_connections",
    ] {
        assert!(all.iter().any(|(n, _, _)| n == name), "{name} missing");
    }
}

#[test]
fn shutdown_wait_for_servers_refuses_a_client_already_queued() {
    let pg = Postgres::start();
    let settings = format!("{SETTINGS}default_pool_size = 1\n");
    let pw = Pgward::start(&Pgward::ini(&pg, &settings, ""));
    let port = pw.port;
    // One client holds the only server in a transaction; a second waits in the queue.
    let mut holder = Raw::login(port, "postgres", None, "app");
    holder.query("BEGIN").expect("begin");
    let waiter = thread::spawn(move || common::psql_at(port, "postgres", None, "app", "SELECT 1"));
    assert!(
        eventually(5 * SECOND, || {
            stdout_of(&console(port, "SHOW POOLS"))
                .lines()
                .any(|l| l.starts_with("app|postgres|") && l.split('|').nth(3) == Some("1"))
        }),
        "{}",
        stdout_of(&console(port, "SHOW POOLS"))
    );
    let out = console(port, "SHUTDOWN WAIT_FOR_SERVERS");
    assert!(out.status.success(), "{}", stderr_of(&out));
    let out = waiter.join().expect("waiter");
    assert!(!out.status.success());
    assert!(
        stderr_of(&out).contains("server shutting down"),
        "{}",
        stderr_of(&out)
    );
    // The transaction in progress still finishes.
    holder.query("COMMIT").expect("the transaction goes on");
    assert!(
        pw.log().contains("closing because: server shutting down"),
        "{}",
        pw.log()
    );
}

#[test]
fn server_fast_close_ends_a_session_whose_server_was_marked() {
    let pg = Postgres::start();
    let settings =
        "auth_type = trust\nadmin_users = admin\npool_mode = session\nserver_fast_close = 1\n";
    let pw = Pgward::start(&Pgward::ini(&pg, settings, ""));
    let mut client = Raw::login(pw.port, "postgres", None, "app");
    client.query("SELECT 1").expect("first query");
    let out = console(pw.port, "RECONNECT app");
    assert!(out.status.success(), "{}", stderr_of(&out));
    let err = client.query("SELECT 1").expect_err("the session ends");
    assert_eq!(err.message(), "database configuration changed");
    assert!(
        pw.log()
            .contains("closing because: database configuration changed"),
        "{}",
        pw.log()
    );
    assert!(eventually(5 * SECOND, || server_count(
        &pg, "postgres", "app"
    ) == 0));
}

/// One client that says Terminate, one that just goes, and one refused by pgward, through
/// `pw`: what PgBouncer's routine log lines tell of them.
fn routine_traffic(pw: &Pgward) {
    let mut polite = Raw::login(pw.port, "postgres", None, "app");
    polite.query("SELECT 1").expect("a query");
    polite.terminate();
    let mut abrupt = Raw::login(pw.port, "postgres", None, "app");
    abrupt.query("SELECT 1").expect("a query");
    drop(abrupt);
    let refused = Raw::connect(pw.port).startup(&[("user", "postgres"), ("database", "nope")]);
    assert!(refused.is_err(), "an unknown database is refused");
    // A name cannot write a line of its own into the log.
    let forged =
        Raw::connect(pw.port).startup(&[("user", "postgres"), ("database", "x\nstats: 0")]);
    assert!(forged.is_err(), "an unknown database is refused");
}

#[test]
fn the_routine_log_lines_follow_their_settings() {
    let pg = Postgres::start();
    let pw = Pgward::trusting(&pg, "stats_period = 1\nadmin_users = admin\n", "");
    routine_traffic(&pw);
    for line in [
        "login attempt: db=app user=postgres tls=no replication=no",
        "new connection to server",
        "closing because: client close request (age=",
        "closing because: client unexpected eof (age=",
        "pooler error: no such database: nope",
        "closing because: no such database: nope",
        "pooler error: no such database: x\\nstats: 0",
    ] {
        assert!(
            eventually(5 * SECOND, || pw.log().contains(line)),
            "{line}: {}",
            pw.log()
        );
    }
    // A console client that says Terminate, one that just goes, and a client that goes
    // before its startup packet: each one more line of its kind.
    let eofs = || {
        pw.log()
            .matches("closing because: client unexpected eof")
            .count()
    };
    let requests = || {
        pw.log()
            .matches("closing because: client close request")
            .count()
    };
    let (eof, request) = (eofs(), requests());
    Raw::login(pw.port, "admin", None, "pgbouncer").terminate();
    assert!(
        eventually(5 * SECOND, || requests() == request + 1),
        "{}",
        pw.log()
    );
    drop(Raw::login(pw.port, "admin", None, "pgbouncer"));
    assert!(eventually(5 * SECOND, || eofs() == eof + 1), "{}", pw.log());
    drop(Raw::connect(pw.port));
    assert!(eventually(5 * SECOND, || eofs() == eof + 2), "{}", pw.log());
    // A client the console ends.
    let mut killed = Raw::login(pw.port, "postgres", None, "app");
    killed.query("SELECT 1").expect("a query");
    let out = console(pw.port, "KILL app");
    assert!(out.status.success(), "{}", stderr_of(&out));
    // PgBouncer's words for a client its database's KILL ended.
    for line in [
        "pooler error: database removed",
        "closing because: database removed (age=",
    ] {
        assert!(
            eventually(5 * SECOND, || pw.log().contains(line)),
            "{line}: {}",
            pw.log()
        );
    }
    assert_eq!(eofs(), eof + 2, "{}", pw.log());
    // A console command that fails is a pooler error too.
    assert!(!console(pw.port, "PAUSE nosuchdb").status.success());
    let refused = "pooler error: no such database: nosuchdb";
    assert!(
        eventually(5 * SECOND, || pw.log().contains(refused)),
        "{}",
        pw.log()
    );
    // Once: the reason of a failed command (a RELOAD's) is not repeated.
    let times = pw.log().matches("no such database: nosuchdb").count();
    assert_eq!(times, 1, "{}", pw.log());
    assert!(
        eventually(5 * SECOND, || pw.log().contains(" xacts/s, ")),
        "{}",
        pw.log()
    );
    let log = pw.log();
    assert!(!log.lines().any(|l| l.starts_with("stats: ")), "{log}");
    let stats = log
        .lines()
        .find(|l| l.contains(" stats: "))
        .expect("a stats line");
    assert!(
        stats.contains(" queries/s, ") && stats.contains(" client logins/s, in "),
        "{stats}"
    );

    let quiet =
        "stats_period = 1\nadmin_users = admin\nlog_connections = 0\nlog_disconnections = 0\n\
                 log_pooler_errors = 0\nlog_stats = 0\n";
    let pw = Pgward::trusting(&pg, quiet, "");
    routine_traffic(&pw);
    // Two stats periods go by.
    sleep(Duration::from_millis(2500));
    assert!(!console(pw.port, "PAUSE nosuchdb").status.success());
    // A failed console command is logged whatever log_pooler_errors says.
    let failed = "admin console: no such database: nosuchdb";
    assert!(
        eventually(5 * SECOND, || pw.log().contains(failed)),
        "{}",
        pw.log()
    );
    let log = pw.log();
    for line in [
        "login attempt",
        "new connection to server",
        "closing because",
        "pooler error",
        "xacts/s",
    ] {
        assert!(!log.contains(line), "{line}: {log}");
    }
}
