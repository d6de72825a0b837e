//! Real drivers through pgward in transaction pooling, with fewer servers (2) than clients
//! (4 to 6), so that prepared statements, pipelines and COPY move from server to server.
//!
//! Each driver runs as a subprocess (the scripts are in `tests/drivers/`) and checks its own
//! results; the test fails if it exits non-zero, runs past its time limit, or never saw a
//! statement run on a second server. `contrib/test.sh` installs the drivers: psycopg 3 and
//! asyncpg in the virtual environment `target/drivers-venv`, node-postgres in
//! `tests/drivers/node_modules`, pgJDBC and a JDK from Debian. None of these tests is skipped
//! when a driver is missing: they fail and say what to install.
//!
//! `PGWARD_DRIVERS_DIRECT=1` points every driver at PostgreSQL itself instead of pgward, to
//! tell a driver script's mistake from pgward's.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use common::raw::{self, Batch, Raw};
use common::{stderr_of, stdout_of, Pgward, Postgres};

const USER: &str = "md5user";
const PASSWORD: &str = "md5pass";

/// How long one driver run may take before it counts as hung.
const DRIVER_TIMEOUT: Duration = Duration::from_secs(120);

const SCHEMA: &str = "CREATE TABLE items (id int PRIMARY KEY, name text, price numeric(12, 2), \
     created timestamptz, data bytea, flag bool, score float8, tags text[], doc jsonb); \
     GRANT ALL ON items TO PUBLIC";

/// PostgreSQL with the `items` table, and pgward in transaction pooling with two servers,
/// authenticating `md5user` with the MD5 secret from its auth file.
struct Rig {
    pg: Postgres,
    pgward: Pgward,
    _auth_dir: tempfile::TempDir,
}

impl Rig {
    fn start(extra: &str) -> Rig {
        Rig::start_in("transaction", extra)
    }

    fn start_in(mode: &str, extra: &str) -> Rig {
        let pg = Postgres::start();
        pg.sql(SCHEMA);
        let auth_dir = common::shared_tempdir("pgward-auth-");
        let secret = pg.role_secret(USER);
        let userlist = common::write_userlist(auth_dir.path(), &[(USER, &secret)]);
        let settings = format!(
            "pool_mode = {mode}\ndefault_pool_size = 2\nauth_type = md5\n\
             auth_file = {}\n{extra}",
            userlist.display()
        );
        let pgward = Pgward::start(&Pgward::ini(&pg, &settings, ""));
        Rig {
            pg,
            pgward,
            _auth_dir: auth_dir,
        }
    }

    fn direct() -> bool {
        std::env::var_os("PGWARD_DRIVERS_DIRECT").is_some_and(|v| v != "0")
    }

    /// The port the drivers connect to.
    fn port(&self) -> u16 {
        if Rig::direct() {
            self.pg.port
        } else {
            self.pgward.port
        }
    }

    /// Sets the connection environment the driver scripts read.
    fn env(&self, cmd: &mut Command, clients: u32) {
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("PG") {
                cmd.env_remove(name);
            }
        }
        cmd.env("PGWARD_HOST", common::HOST)
            .env("PGWARD_PORT", self.port().to_string())
            .env("PGWARD_USER", USER)
            .env("PGWARD_PASSWORD", PASSWORD)
            .env("PGWARD_DB", "app")
            .env("PGWARD_CLIENTS", clients.to_string())
            .env("PGWARD_HANG_AFTER", "20")
            .env("PGPASSFILE", "/dev/null")
            .env("PGPASSWORD", PASSWORD);
    }

    /// Runs a driver to completion and returns its standard output; panics with its output
    /// and pgward's log if it fails or hangs.
    fn run(&self, what: &str, mut cmd: Command) -> String {
        let out = run_with_timeout(&mut cmd, DRIVER_TIMEOUT)
            .unwrap_or_else(|why| panic!("{what}: {why}\n{}", self.pgward.log()));
        assert!(
            out.status.success(),
            "{what} failed ({}):\n--- stdout ---\n{}\n--- stderr ---\n{}\n{}",
            out.status,
            stdout_of(&out),
            stderr_of(&out),
            self.pgward.log()
        );
        stdout_of(&out)
    }

    /// Asserts that some client's statements ran on more than one server (unless the
    /// drivers go straight to PostgreSQL).
    fn assert_moved(&self, what: &str, stdout: &str) {
        if Rig::direct() {
            return;
        }
        let most = stdout
            .rsplit_once("most servers seen by one client: ")
            .and_then(|(_, n)| n.trim().parse::<u32>().ok())
            .unwrap_or_else(|| panic!("{what}: no server count in {stdout:?}"));
        assert!(
            most >= 2,
            "{what}: no client's statements moved to another server"
        );
    }
}

/// Runs `cmd` with its output in temporary files; kills it after `timeout`.
fn run_with_timeout(cmd: &mut Command, timeout: Duration) -> Result<Output, String> {
    let dir = tempfile::tempdir().map_err(|err| format!("temporary directory: {err}"))?;
    let file = |name: &str| {
        fs::File::create(dir.path().join(name)).map_err(|err| format!("{name}: {err}"))
    };
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(file("stdout")?)
        .stderr(file("stderr")?)
        .spawn()
        .map_err(|err| format!("cannot run {cmd:?}: {err}"))?;
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|err| err.to_string())? {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "{cmd:?} still running after {timeout:?}:\n{}\n{}",
                common::read_lossy(&dir.path().join("stdout")),
                common::read_lossy(&dir.path().join("stderr"))
            ));
        }
        thread::sleep(Duration::from_millis(50));
    };
    let read = |name: &str| fs::read(dir.path().join(name)).unwrap_or_default();
    Ok(Output {
        status,
        stdout: read("stdout"),
        stderr: read("stderr"),
    })
}

fn drivers_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/drivers")
}

/// The Python with psycopg and asyncpg: `$PGWARD_TEST_PYTHON`, else the virtual environment
/// `contrib/test.sh` makes.
fn python() -> PathBuf {
    common::venv_python()
}

fn python_script(rig: &Rig, script: &str, args: &[&str], clients: u32) -> Command {
    let mut cmd = Command::new(python());
    cmd.arg(drivers_dir().join(script))
        .args(args)
        .current_dir(drivers_dir());
    rig.env(&mut cmd, clients);
    cmd
}

// ---------------------------------------------------------------------------------------
// psql and pgbench

/// The psql script of one client: committed and rolled-back transactions, one statement
/// per Query message, and the lines `psql -qAt` prints for it.
fn psql_script(client: u32) -> (String, String) {
    let mut script = String::from("\\set ON_ERROR_STOP 1\n");
    let mut expected = String::new();
    for round in 0..6 {
        let id = client * 10_000 + round * 10;
        script.push_str(&format!(
            "BEGIN;\nINSERT INTO items (id, name, price, flag, tags) \
             VALUES ({id}, 'psql {client} {round}', {round}.50, {}, ARRAY['a', 'b']);\n\
             SELECT name, price, flag, tags FROM items WHERE id = {id};\nCOMMIT;\n\
             BEGIN;\nINSERT INTO items (id) VALUES ({});\nROLLBACK;\n\
             SELECT count(*) FROM items WHERE id BETWEEN {id} AND {};\n",
            round % 2 == 0,
            id + 1,
            id + 9
        ));
        expected.push_str(&format!(
            "psql {client} {round}|{round}.50|{}|{{a,b}}\n1\n",
            if round % 2 == 0 { "t" } else { "f" }
        ));
    }
    (script, expected)
}

#[test]
fn psql_clients_through_two_servers() {
    let rig = Rig::start("");
    let dir = tempfile::tempdir().expect("temporary directory");
    let runs: Vec<_> = (1..=5)
        .map(|client| {
            let (script, expected) = psql_script(client);
            let path = dir.path().join(format!("client{client}.sql"));
            fs::write(&path, script).expect("write the psql script");
            let mut cmd = Command::new("psql");
            rig.env(&mut cmd, 1);
            cmd.args([
                "-X",
                "-w",
                "-qAt",
                "-h",
                common::HOST,
                "-U",
                USER,
                "-d",
                "app",
            ])
            .arg("-p")
            .arg(rig.port().to_string())
            .arg("-f")
            .arg(&path);
            (cmd, expected)
        })
        .collect();
    thread::scope(|scope| {
        let handles: Vec<_> = runs
            .into_iter()
            .map(|(cmd, expected)| {
                let rig = &rig;
                scope.spawn(move || (rig.run("psql", cmd), expected))
            })
            .collect();
        for handle in handles {
            let (got, expected) = handle.join().expect("a psql client panicked");
            assert_eq!(format!("{got}\n"), expected);
        }
    });
}

fn pgbench(rig: &Rig, args: &[&str]) -> String {
    let mut cmd = Command::new("pgbench");
    rig.env(&mut cmd, 1);
    cmd.args(["-h", common::HOST, "-U", USER])
        .arg("-p")
        .arg(rig.port().to_string())
        .args(args)
        .arg("app");
    rig.run(&format!("pgbench {args:?}"), cmd)
}

/// Initialises pgbench's tables through pgward (COPY FROM STDIN included), then runs it.
fn pgbench_mode(runs: &[&[&str]]) {
    let rig = Rig::start("");
    pgbench(&rig, &["-i", "-s", "1", "-q"]);
    for args in runs {
        let out = pgbench(&rig, args);
        let clients: u32 = arg_after(args, "-c");
        let per_client: u32 = arg_after(args, "-t");
        let processed = format!(
            "number of transactions actually processed: {}",
            clients * per_client
        );
        assert!(out.contains(&processed), "pgbench {args:?}:\n{out}");
    }
}

fn arg_after(args: &[&str], flag: &str) -> u32 {
    args.iter()
        .position(|a| *a == flag)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{flag} missing from {args:?}"))
}

#[test]
fn pgbench_simple() {
    pgbench_mode(&[&["-M", "simple", "-c", "5", "-j", "1", "-t", "40"]]);
}

#[test]
fn pgbench_extended() {
    pgbench_mode(&[&["-M", "extended", "-c", "5", "-j", "1", "-t", "40"]]);
}

/// pgbench prepares a client's statements synchronously the first time the client runs the
/// script: with TPC-B's transactions, a thread blocked on one client's Parse (waiting for a
/// server) cannot finish the transaction another of its clients holds a server with, and
/// with fewer servers than clients every thread can end up so blocked (PgBouncer hangs the
/// same way). So TPC-B runs one client per thread, and the select-only script, which holds
/// no server between statements, five clients on one thread.
#[test]
fn pgbench_prepared() {
    pgbench_mode(&[
        &["-M", "prepared", "-S", "-c", "5", "-j", "1", "-t", "100"],
        &["-M", "prepared", "-c", "4", "-j", "4", "-t", "30"],
    ]);
}

// ---------------------------------------------------------------------------------------
// Python drivers

/// Runs one mode of `psycopg_driver.py` with `clients` clients on a rig with `extra`
/// settings, and checks that statements moved between servers.
fn psycopg(mode: &str, clients: u32, extra: &str) {
    let rig = Rig::start(extra);
    let what = format!("psycopg {mode}");
    let out = rig.run(
        &what,
        python_script(&rig, "psycopg_driver.py", &[mode], clients),
    );
    rig.assert_moved(&what, &out);
}

#[test]
fn psycopg_prepare_threshold_0() {
    psycopg("prepared", 5, "");
}

#[test]
fn psycopg_pipeline_mode_with_errors() {
    psycopg("pipeline", 5, "");
}

#[test]
fn psycopg_deallocate_all_and_discard_all() {
    psycopg("reset", 4, "");
}

#[test]
fn psycopg_more_statements_than_max_prepared_statements() {
    psycopg("many", 4, "max_prepared_statements = 2\n");
}

#[test]
fn asyncpg_statement_cache() {
    let rig = Rig::start("");
    let out = rig.run("asyncpg", python_script(&rig, "asyncpg_driver.py", &[], 5));
    rig.assert_moved("asyncpg", &out);
}

// ---------------------------------------------------------------------------------------
// node-postgres and pgJDBC

#[test]
fn node_postgres_named_statements() {
    let rig = Rig::start("");
    let modules = drivers_dir().join("node_modules/pg");
    assert!(
        modules.is_dir(),
        "{} is missing: run contrib/test.sh (or npm install pg in tests/drivers)",
        modules.display()
    );
    let mut cmd = Command::new("node");
    cmd.arg(drivers_dir().join("node_driver.js"))
        .current_dir(drivers_dir());
    rig.env(&mut cmd, 5);
    let out = rig.run("node-postgres", cmd);
    rig.assert_moved("node-postgres", &out);
}

const JDBC_JAR: &str = "/usr/share/java/postgresql.jar";

#[test]
fn pgjdbc_prepare_threshold_1() {
    let rig = Rig::start("");
    assert!(
        Path::new(JDBC_JAR).is_file(),
        "{JDBC_JAR} is missing: run contrib/test.sh (Debian: libpostgresql-jdbc-java)"
    );
    let classes = tempfile::tempdir().expect("temporary directory");
    let mut javac = Command::new("javac");
    javac
        .args(["-encoding", "UTF-8", "-cp", JDBC_JAR, "-d"])
        .arg(classes.path())
        .arg(drivers_dir().join("JdbcDriver.java"));
    rig.run("javac", javac);
    let mut java = Command::new("java");
    java.arg("-cp")
        .arg(format!("{}:{JDBC_JAR}", classes.path().display()))
        .arg("-Dfile.encoding=UTF-8")
        .arg("JdbcDriver");
    rig.env(&mut java, 5);
    let out = rig.run("pgJDBC", java);
    rig.assert_moved("pgJDBC", &out);
}

// ---------------------------------------------------------------------------------------
// tokio-postgres

async fn tokio_client(connstr: String, client: i32) -> std::collections::HashSet<i32> {
    let (conn, driver) = tokio_postgres::connect(&connstr, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|err| panic!("client {client}: connect: {err}"));
    tokio::spawn(driver);
    let conn = std::sync::Arc::new(conn);
    let sum = conn
        .prepare("SELECT $1::int4 + $2::int4, $3::text || '!', $4::float8 * 2, pg_backend_pid()")
        .await
        .unwrap_or_else(|err| panic!("prepare: {err}"));
    let mut servers = std::collections::HashSet::new();
    let mut tasks = Vec::new();
    for task in 0..4 {
        let (conn, sum) = (conn.clone(), sum.clone());
        tasks.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            for i in 0..10i32 {
                let text = format!("c{client}t{task}i{i}");
                let row = conn
                    .query_one(&sum, &[&i, &client, &text, &f64::from(i)])
                    .await
                    .unwrap_or_else(|err| panic!("query: {err}"));
                assert_eq!(row.get::<_, i32>(0), i + client);
                assert_eq!(row.get::<_, String>(1), format!("{text}!"));
                assert_eq!(row.get::<_, f64>(2), f64::from(i) * 2.0);
                seen.push(row.get::<_, i32>(3));
            }
            seen
        }));
    }
    for task in tasks {
        servers.extend(task.await.expect("a query task panicked"));
    }
    match std::sync::Arc::try_unwrap(conn) {
        Ok(mut conn) => tokio_transactions(&mut conn, client).await,
        Err(_) => panic!("the client is still shared"),
    }
    servers
}

async fn tokio_transactions(conn: &mut tokio_postgres::Client, client: i32) {
    let insert = conn
        .prepare("INSERT INTO items (id, name, data, flag, score) VALUES ($1, $2, $3, $4, $5)")
        .await
        .unwrap_or_else(|err| panic!("prepare: {err}"));
    for round in 0..5 {
        let id = client * 10_000 + round * 10;
        let tx = conn.transaction().await.expect("begin");
        let data: Vec<u8> = vec![1, 0, 255];
        tx.execute(
            &insert,
            &[&id, &format!("tokio {id}"), &data, &true, &0.5f64],
        )
        .await
        .unwrap_or_else(|err| panic!("insert: {err}"));
        let row = tx
            .query_one("SELECT name, data FROM items WHERE id = $1", &[&id])
            .await
            .expect("select");
        assert_eq!(row.get::<_, String>(0), format!("tokio {id}"));
        assert_eq!(row.get::<_, Vec<u8>>(1), data);
        tx.commit().await.expect("commit");
        let tx = conn.transaction().await.expect("begin");
        tx.execute(&insert, &[&(id + 1), &"doomed", &data, &false, &1.0f64])
            .await
            .expect("insert");
        tx.rollback().await.expect("rollback");
        let count: i64 = conn
            .query_one("SELECT count(*) FROM items WHERE id = $1", &[&(id + 1)])
            .await
            .expect("count")
            .get(0);
        assert_eq!(count, 0, "a rolled-back row is visible");
    }
}

/// Runs a prepared statement, then again while another client's transaction holds the server
/// it ran on; returns how many servers it ran on.
async fn tokio_moved_statement(connstr: &str) -> usize {
    let connect = || tokio_postgres::connect(connstr, tokio_postgres::NoTls);
    let (conn, driver) = connect().await.expect("connect");
    tokio::spawn(driver);
    let (mut holder, driver) = connect().await.expect("connect");
    tokio::spawn(driver);
    let pinned = conn
        .prepare("SELECT $1::int4 * 2, pg_backend_pid()")
        .await
        .expect("prepare");
    let run = |v: i32| {
        let (conn, pinned) = (&conn, &pinned);
        async move {
            let row = conn.query_one(pinned, &[&v]).await.expect("pinned query");
            assert_eq!(row.get::<_, i32>(0), v * 2);
            row.get::<_, i32>(1)
        }
    };
    for attempt in 0..30 {
        let first = run(attempt).await;
        let tx = holder.transaction().await.expect("begin");
        let held: i32 = tx
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .expect("pid")
            .get(0);
        if held == first {
            let second = run(attempt + 1).await;
            tx.rollback().await.expect("rollback");
            assert_ne!(second, first, "ran on the server another client holds");
            return 2;
        }
        tx.rollback().await.expect("rollback");
    }
    1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokio_postgres_prepared_from_several_tasks_and_transactions() {
    let rig = Rig::start("");
    let connstr = common::connstr(rig.port(), USER, Some(PASSWORD), "app");
    let clients: Vec<_> = (1..=4)
        .map(|client| tokio::spawn(tokio_client(connstr.clone(), client)))
        .collect();
    let mut most = tokio_moved_statement(&connstr).await;
    for client in clients {
        let servers = tokio::time::timeout(DRIVER_TIMEOUT, client)
            .await
            .unwrap_or_else(|_| panic!("tokio-postgres hung\n{}", rig.pgward.log()))
            .unwrap_or_else(|err| panic!("{err}\n{}", rig.pgward.log()));
        most = most.max(servers.len());
    }
    if !Rig::direct() {
        assert!(most >= 2, "no client's statements moved to another server");
    }
}

// ---------------------------------------------------------------------------------------
// Prepared statements at the protocol level, across servers

/// A statement prepared on the first server, then described, closed, prepared again under
/// the same name with other text, and forgotten by DEALLOCATE ALL and DISCARD ALL, while
/// another client holds the first server.
#[test]
fn statement_lifecycle_across_servers() {
    let rig = Rig::start("");
    let port = rig.pgward.port;
    let mut a = Raw::login(port, USER, Some(PASSWORD), "app");
    let answers = a.exchange(
        &Batch::new()
            .parse("s", "SELECT $1::int + 1 AS n", &[23])
            .sync(),
        1,
    );
    assert_eq!(raw::tags(&answers), "1Z");
    // The only server is idle: the holder's transaction takes it.
    let mut holder = Raw::login(port, USER, Some(PASSWORD), "app");
    holder.value("BEGIN");
    let described = a.exchange(&Batch::new().describe(b'S', "s").sync(), 1);
    assert_eq!(raw::tags(&described), "tTZ", "{described:?}");
    let reparsed = a.exchange(
        &Batch::new()
            .close(b'S', "s")
            .parse("s", "SELECT $1::text || '!' AS t", &[])
            .bind("", "s", &[Some("x")])
            .execute("", 0)
            .sync(),
        1,
    );
    assert_eq!(raw::tags(&reparsed), "312DCZ", "{reparsed:?}");
    assert_eq!(raw::values(&reparsed), vec![Some("x!".to_string())]);
    assert_eq!(
        rig.pg.backend_count(USER),
        2,
        "the statement did not move to a second server"
    );
    holder.value("COMMIT");
    for reset in ["DEALLOCATE ALL", "DISCARD ALL"] {
        let done = a.exchange(&Batch::new().query(reset), 1);
        assert_eq!(raw::tags(&done), "CZ", "{reset}: {done:?}");
        let gone = a.exchange(
            &Batch::new()
                .bind("", "s", &[Some("y")])
                .execute("", 0)
                .sync(),
            1,
        );
        assert_eq!(raw::errors(&gone), vec!["26000"], "{reset}: {gone:?}");
        let again = a.exchange(
            &Batch::new()
                .parse("s", "SELECT $1::int * 10", &[])
                .bind("", "s", &[Some("4")])
                .execute("", 0)
                .sync(),
            1,
        );
        assert_eq!(raw::values(&again), vec![Some("40".to_string())], "{reset}");
    }
    // A bad statement's Parse in the middle of a pipeline fails alone; the name stays free.
    let piped = a.exchange(
        &Batch::new()
            .extended("SELECT 1", &[])
            .parse("bad", "SELEC 1", &[])
            .bind("", "bad", &[])
            .execute("", 0)
            .sync()
            .extended("SELECT 3", &[]),
        3,
    );
    assert_eq!(raw::tags(&piped), "12DCZEZ12DCZ", "{piped:?}");
    assert_eq!(raw::errors(&piped), vec!["42601"]);
    a.terminate();
    holder.terminate();
}

// ---------------------------------------------------------------------------------------
// Bounded memory, LISTEN/NOTIFY

/// pgward's resident memory in kB.
fn rss_kb(pid: u32) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmRSS for pid {pid}"))
}

/// A client with a small receive buffer asks for about 2 GB, stops reading for a while,
/// then reads slowly: pgward must hold back the server rather than buffer the result.
#[test]
fn a_slow_reader_of_a_large_result_keeps_pgward_small() {
    const LIMIT_KB: u64 = 64 * 1024;
    const READ: usize = 300 << 20;
    let rig = Rig::start("");
    let pid = rig.pgward.pid();
    let socket =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    socket.set_recv_buffer_size(8192).expect("SO_RCVBUF");
    let addr: std::net::SocketAddr = ([127, 0, 0, 1], rig.pgward.port).into();
    socket.connect(&addr.into()).expect("connect");
    let mut conn = Raw::from_stream(socket.into()).logged_in(USER, Some(PASSWORD), "app");
    conn.send(&Batch::new().query("SELECT repeat('x', 1000) FROM generate_series(1, 2000000)"));
    let mut peak = rss_kb(pid);
    for _ in 0..20 {
        thread::sleep(Duration::from_millis(100));
        peak = peak.max(rss_kb(pid));
    }
    let mut read = 0usize;
    let mut next_pause = 0usize;
    while read < READ {
        let msg = conn.recv();
        assert!(matches!(msg.tag, b'T' | b'D'), "{msg:?}");
        read += msg.body.len() + 5;
        if read >= next_pause {
            next_pause += 4 << 20;
            thread::sleep(Duration::from_millis(10));
            peak = peak.max(rss_kb(pid));
        }
    }
    assert!(
        peak < LIMIT_KB,
        "pgward's RSS reached {peak} kB while a client read a large result slowly"
    );
}

#[test]
fn listen_notify_in_session_mode() {
    let rig = Rig::start_in("session", "");
    let port = rig.pgward.port;
    let mut listener = Raw::login(port, USER, Some(PASSWORD), "app");
    listener.value("LISTEN news");
    let mut sender = Raw::login(port, USER, Some(PASSWORD), "app");
    sender.value("NOTIFY news, 'through pgward'");
    rig.pg
        .sql("SELECT pg_notify('news', 'straight to PostgreSQL')");
    let mut payloads = Vec::new();
    while payloads.len() < 2 {
        let msg = listener.recv();
        assert_eq!(msg.tag, b'A', "{msg:?}");
        let text = String::from_utf8_lossy(&msg.body[4..]).into_owned();
        payloads.push(text.split('\0').skip(1).take(1).collect::<String>());
    }
    assert_eq!(payloads, ["through pgward", "straight to PostgreSQL"]);
    assert_eq!(listener.value("SELECT 'still there'"), "still there");
    listener.terminate();
    sender.terminate();
}
