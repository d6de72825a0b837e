//! Fixtures for integration tests: a throwaway PostgreSQL server and a running `pgward`.
//!
//! Everything here is synchronous (`std::process`), so the same fixtures serve `#[test]` and
//! `#[tokio::test]` functions. Each fixture owns a temporary directory, stops its process and
//! removes that directory when dropped. A fixture that cannot start panics with the log of the
//! process that failed, which is what a failing test should show.
//!
//! When the tests run as root, PostgreSQL's programs run as the `postgres` OS user (through
//! `runuser`), because `initdb` and `postgres` refuse to run as root.
//!
//! Environment: `PGWARD_TEST_PG_BINDIR` picks the PostgreSQL server programs (default: the
//! newest `/usr/lib/postgresql/N/bin`); `PGWARD_TEST_BINARY` runs the pooler tests against
//! another program that reads the same ini, such as `/usr/sbin/pgbouncer`, to check that a test
//! encodes PgBouncer's behaviour (files it must read belong in a [`shared_tempdir`]).
#![allow(dead_code)]

pub mod certs;
pub mod driver;
pub mod gate;
pub mod policy;
pub mod raw;
pub mod relay;
pub mod script;

use std::fs;
use std::io::ErrorKind;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant, SystemTime};

use tempfile::TempDir;

/// The address every fixture listens on.
pub const HOST: &str = "127.0.0.1";

/// One second.
pub const SECOND: Duration = Duration::from_secs(1);

/// How long `Pgward::start` waits for the listening port.
const PGWARD_START_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a port handed out by [`free_port`] stays reserved against other test processes.
const PORT_RESERVATION: Duration = Duration::from_secs(300);

/// How many times a fixture tries again when its port was taken before it could bind it.
const BIND_ATTEMPTS: usize = 3;

/// A login role that every test server has, with the authentication method its `pg_hba.conf`
/// line asks for over TCP.
pub struct Role {
    pub name: &'static str,
    pub password: Option<&'static str>,
    /// `password_encryption` in force when the password was set; empty when there is none.
    pub encryption: &'static str,
    /// The `pg_hba.conf` method for this role over TCP.
    pub hba_method: &'static str,
}

/// The roles `Postgres::start` creates (besides the `postgres` superuser, trusted over TCP).
pub const ROLES: [Role; 4] = [
    Role {
        name: "trustuser",
        password: None,
        encryption: "",
        hba_method: "trust",
    },
    Role {
        name: "md5user",
        password: Some("md5pass"),
        encryption: "md5",
        hba_method: "md5",
    },
    Role {
        name: "scramuser",
        password: Some("scrampass"),
        encryption: "scram-sha-256",
        hba_method: "scram-sha-256",
    },
    Role {
        name: "passworduser",
        password: Some("plainpass"),
        encryption: "scram-sha-256",
        hba_method: "password",
    },
];

/// The password of one of [`ROLES`], or `None` for the trusted roles and unknown names.
pub fn password_of(user: &str) -> Option<&'static str> {
    ROLES
        .iter()
        .find(|role| role.name == user)
        .and_then(|role| role.password)
}

/// A TCP port on 127.0.0.1 that nothing listens on and that no other test has been handed
/// recently, in this process or in another one (reservations are files in a shared temporary
/// directory, so parallel test binaries under nextest do not collide).
pub fn free_port() -> u16 {
    let dir = std::env::temp_dir().join("pgward-test-ports");
    // An unusable reservation directory leaves the kernel's choice as the only guard.
    let reservations = fs::create_dir_all(&dir).is_ok();
    for _ in 0..100 {
        let port = kernel_free_port();
        if !reservations || reserve_port(&dir, port) {
            return port;
        }
    }
    panic!("no free TCP port after 100 tries");
}

/// A port nothing listens on, below the kernel's ephemeral range (32768 and up by default),
/// where outgoing connections take their local ports: a port handed out there may be taken by
/// one before the server binds it, and a client connecting to it may then reach itself. The
/// kernel's own choice when no such port is free.
fn kernel_free_port() -> u16 {
    use rand::Rng;
    let mut rng = rand::thread_rng();
    for _ in 0..1000 {
        let port = rng.gen_range(15_000..32_000);
        if TcpListener::bind((HOST, port)).is_ok() {
            return port;
        }
    }
    TcpListener::bind((HOST, 0))
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .unwrap_or_else(|err| panic!("cannot bind {HOST}:0: {err}"))
}

/// Claims `port` by creating a file named after it; an expired claim is removed first.
fn reserve_port(dir: &Path, port: u16) -> bool {
    let path = dir.join(port.to_string());
    if is_expired(&path) {
        let _ = fs::remove_file(&path);
    }
    match fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
    {
        Ok(_) => true,
        Err(err) => err.kind() != ErrorKind::AlreadyExists,
    }
}

fn is_expired(path: &Path) -> bool {
    fs::metadata(path)
        .and_then(|meta| meta.modified())
        .ok()
        .and_then(|modified| SystemTime::now().duration_since(modified).ok())
        .is_some_and(|age| age > PORT_RESERVATION)
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// A temporary directory that the PostgreSQL server programs (and a reference pooler run as
/// `postgres`) may read and write: a place for auth files when running as root.
pub fn shared_tempdir(prefix: &str) -> TempDir {
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .unwrap_or_else(|err| panic!("cannot create a temporary directory: {err}"));
    if is_root() {
        let mut chown = Command::new("chown");
        chown.arg("postgres:").arg(dir.path());
        run_checked(&mut chown, "chown the server directory to postgres");
    }
    dir
}

/// The directory of the newest installed PostgreSQL server programs: `$PGWARD_TEST_PG_BINDIR`,
/// else the newest `/usr/lib/postgresql/N/bin` with an `initdb`, else `pg_config --bindir`.
pub fn server_bindir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PGWARD_TEST_PG_BINDIR") {
        return PathBuf::from(dir);
    }
    newest_debian_bindir()
        .or_else(pg_config_bindir)
        .unwrap_or_else(|| panic!("no PostgreSQL server programs found (install postgresql)"))
}

fn newest_debian_bindir() -> Option<PathBuf> {
    let entries = fs::read_dir("/usr/lib/postgresql").ok()?;
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let version: u32 = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").is_file().then_some((version, bin))
        })
        .max_by_key(|(version, _)| *version)
        .map(|(_, bin)| bin)
}

fn pg_config_bindir() -> Option<PathBuf> {
    let out = Command::new("pg_config").arg("--bindir").output().ok()?;
    let dir = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
    (out.status.success() && dir.join("initdb").is_file()).then_some(dir)
}

/// The Python of the virtual environment contrib/test.sh fills (`target/drivers-venv`: the
/// drivers, and the Prometheus client's parser), or `PGWARD_TEST_PYTHON`.
pub fn venv_python() -> PathBuf {
    if let Some(path) = std::env::var_os("PGWARD_TEST_PYTHON") {
        return PathBuf::from(path);
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/drivers-venv/bin/python");
    assert!(
        venv.is_file(),
        "{} is missing: run contrib/test.sh (or python3 -m venv target/drivers-venv && \
         target/drivers-venv/bin/pip install 'psycopg[binary]' asyncpg prometheus-client)",
        venv.display()
    );
    venv
}

/// A client program (`psql`, `pgbench`) from the server's directory when it is there, else
/// from `PATH`.
pub fn client_program(name: &str) -> PathBuf {
    let beside_server = newest_debian_bindir().map(|dir| dir.join(name));
    match beside_server {
        Some(path) if path.is_file() => path,
        _ => PathBuf::from(name),
    }
}

/// A command for a PostgreSQL server program, run as the `postgres` OS user when we are root.
fn server_command(program: &Path, cwd: &Path) -> Command {
    let mut cmd = if is_root() {
        let mut runuser = Command::new("runuser");
        runuser.args(["-u", "postgres", "--"]).arg(program);
        runuser
    } else {
        Command::new(program)
    };
    cmd.current_dir(cwd).stdin(Stdio::null());
    cmd
}

/// A command for a client program (`psql`, `pgbench`) whose libpq environment is cleared, so
/// that only what a test passes reaches the client.
pub fn client_command(program: &str, password: Option<&str>) -> Command {
    let mut cmd = Command::new(client_program(program));
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("PG") {
            cmd.env_remove(name);
        }
    }
    cmd.env("PGPASSFILE", "/dev/null")
        .env("PGCONNECT_TIMEOUT", "10")
        .stdin(Stdio::null());
    if let Some(password) = password {
        cmd.env("PGPASSWORD", password);
    }
    cmd
}

fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|err| panic!("cannot run {cmd:?}: {err}"))
}

/// Runs `cmd` and panics with its output unless it succeeds.
fn run_checked(cmd: &mut Command, what: &str) -> Output {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A file's text, or a note saying why there is none (for panic messages).
pub fn read_lossy(path: &Path) -> String {
    fs::read(path)
        .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
        .unwrap_or_else(|err| format!("<cannot read {}: {err}>", path.display()))
}

/// Standard output of a finished command, without the final newline.
pub fn stdout_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout)
        .trim_end_matches('\n')
        .to_string()
}

/// Standard error of a finished command.
pub fn stderr_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The report of a pgbench run (`what`, for the messages) that succeeded with no failed
/// transaction; `log` is pgward's log, shown when it did not.
pub fn pgbench_clean(out: &Output, what: &str, log: &str) -> String {
    let report = stdout_of(out);
    assert!(
        out.status.success(),
        "pgbench {what}: {}\n{report}\n{log}",
        stderr_of(out),
    );
    assert!(
        report.contains("number of failed transactions: 0 "),
        "pgbench {what} saw failures:\n{report}"
    );
    report
}

/// Runs `psql -X -w -v ON_ERROR_STOP=1 -At` against 127.0.0.1:`port`. `db` may also be a
/// libpq connection string (`"dbname=app application_name=x"`).
pub fn psql_at(port: u16, user: &str, password: Option<&str>, db: &str, sql: &str) -> Output {
    let port = port.to_string();
    let mut cmd = client_command("psql", password);
    cmd.args(["-X", "-w", "-v", "ON_ERROR_STOP=1", "-At", "-h", HOST])
        .args(["-p", &port, "-U", user, "-d", db, "-c", sql]);
    run(&mut cmd)
}

/// Writes `lines` (one statement each) to a file and runs it with `psql -f` as `postgres` in
/// database `app` through `port`, one statement at a time; fails the test on any error.
pub fn psql_script(port: u16, lines: impl Iterator<Item = String>) {
    let dir = shared_tempdir("pgward-script-");
    let script = dir.path().join("script.sql");
    let text: String = lines.map(|l| l + "\n").collect();
    write_file(&script, &text);
    let out = client_command("psql", None)
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", HOST])
        .args(["-p", &port.to_string(), "-U", "postgres", "-d", "app"])
        .arg("-f")
        .arg(&script)
        .stdout(Stdio::null())
        .output()
        .expect("psql");
    assert!(out.status.success(), "{}", stderr_of(&out));
}

/// Runs `pgbench -h 127.0.0.1 -p port ARGS`; the user defaults to `postgres` and the database
/// to `app` (an `-U` or a database name in `args` wins).
pub fn pgbench_at(port: u16, password: Option<&str>, args: &[&str]) -> Output {
    let port = port.to_string();
    let mut cmd = client_command("pgbench", password);
    cmd.env("PGUSER", "postgres")
        .env("PGDATABASE", "app")
        .args(["-h", HOST, "-p", &port])
        .args(args);
    run(&mut cmd)
}

/// Quotes `text` as an SQL string literal.
pub fn sql_literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// A throwaway PostgreSQL server listening on 127.0.0.1 and on a socket in its own directory.
pub struct Postgres {
    pub port: u16,
    /// Always `"127.0.0.1"`.
    pub host: String,
    pub socket_dir: PathBuf,
    pub data_dir: PathBuf,
    pub log_path: PathBuf,
    bindir: PathBuf,
    dir: TempDir,
}

impl Postgres {
    /// Creates, starts and populates a new server: the roles of [`ROLES`] and a database `app`.
    pub fn start() -> Postgres {
        let dir = shared_tempdir("pgward-pg-");
        let bindir = server_bindir();
        let data_dir = dir.path().join("data");
        let log_path = dir.path().join("postgres.log");
        initdb(&bindir, &data_dir, dir.path());
        write_hba(&data_dir);
        append_line(
            &data_dir.join("postgresql.conf"),
            "include 'pgward_test.conf'",
        );
        let mut pg = Postgres {
            port: 0,
            host: HOST.to_string(),
            socket_dir: dir.path().to_path_buf(),
            data_dir,
            log_path,
            bindir,
            dir,
        };
        pg.port = pg.launch();
        pg.create_roles_and_database();
        pg
    }

    /// Starts the server on a free port, trying another port when the chosen one was taken.
    fn launch(&self) -> u16 {
        for _ in 0..BIND_ATTEMPTS {
            let port = free_port();
            self.write_settings(port);
            let out = run(&mut self.pg_ctl(&["-w", "-t", "60", "start"]));
            if out.status.success() {
                return port;
            }
            let log = read_lossy(&self.log_path);
            if !log.contains("could not bind") && !log.contains("already in use") {
                panic!("PostgreSQL did not start:\n{}\n{log}", stderr_of(&out));
            }
        }
        panic!(
            "PostgreSQL found no free port:\n{}",
            read_lossy(&self.log_path)
        );
    }

    fn write_settings(&self, port: u16) {
        let settings = format!(
            "listen_addresses = '{HOST}'\n\
             port = {port}\n\
             unix_socket_directories = '{}'\n\
             max_connections = 200\n\
             fsync = off\n\
             synchronous_commit = off\n\
             full_page_writes = off\n\
             shared_buffers = 128MB\n\
             password_encryption = 'scram-sha-256'\n\
             log_line_prefix = '%m [%p] %q%u@%d '\n\
             lc_messages = 'C'\n",
            self.socket_dir.display()
        );
        write_file(&self.data_dir.join("pgward_test.conf"), &settings);
    }

    fn create_roles_and_database(&self) {
        for role in &ROLES {
            self.sql_in("postgres", &create_role_sql(role));
        }
        self.sql_in("postgres", "CREATE DATABASE app OWNER postgres");
        self.sql_in("postgres", "GRANT CONNECT ON DATABASE app TO PUBLIC");
        self.sql("GRANT USAGE, CREATE ON SCHEMA public TO PUBLIC");
    }

    fn pg_ctl(&self, args: &[&str]) -> Command {
        let mut cmd = server_command(&self.bindir.join("pg_ctl"), self.dir.path());
        cmd.arg("-D")
            .arg(&self.data_dir)
            .arg("-l")
            .arg(&self.log_path)
            .args(args);
        cmd
    }

    fn pg_ctl_checked(&self, args: &[&str], what: &str) {
        let out = run(&mut self.pg_ctl(args));
        assert!(
            out.status.success(),
            "{what} failed:\n{}\n{}",
            stderr_of(&out),
            read_lossy(&self.log_path)
        );
    }

    /// Runs `sql` through psql as `user` (with that role's password from [`ROLES`]).
    pub fn psql(&self, user: &str, db: &str, sql: &str) -> Output {
        psql_at(self.port, user, password_of(user), db, sql)
    }

    /// Runs `sql` through psql as `user` with the given password (or none).
    pub fn psql_as(&self, user: &str, password: Option<&str>, db: &str, sql: &str) -> Output {
        psql_at(self.port, user, password, db, sql)
    }

    /// Runs `sql` as the `postgres` superuser in database `app`; returns the unaligned output
    /// without the final newline, and panics with psql's error output on failure.
    pub fn sql(&self, sql: &str) -> String {
        self.sql_in("app", sql)
    }

    /// Like [`Postgres::sql`], in database `db`.
    pub fn sql_in(&self, db: &str, sql: &str) -> String {
        let out = psql_at(self.port, "postgres", None, db, sql);
        assert!(
            out.status.success(),
            "SQL failed: {sql}\n{}",
            stderr_of(&out)
        );
        stdout_of(&out)
    }

    /// Restarts the server (`pg_ctl restart -m fast`), on the same port.
    pub fn restart(&self) {
        self.pg_ctl_checked(&["-w", "-t", "60", "-m", "fast", "restart"], "restart");
    }

    /// Stops the server as a crash would (`pg_ctl stop -m immediate`: no checkpoint, recovery
    /// from the WAL at the next start); [`Postgres::start_server`] starts it again.
    pub fn crash(&self) {
        self.pg_ctl_checked(&["-w", "-t", "60", "-m", "immediate", "stop"], "crash");
    }

    /// Stops the server (`pg_ctl stop -m fast`); [`Postgres::start_server`] starts it again.
    pub fn stop(&self) {
        self.pg_ctl_checked(&["-w", "-t", "60", "-m", "fast", "stop"], "stop");
    }

    /// Starts a server that [`Postgres::stop`] stopped.
    pub fn start_server(&self) {
        self.pg_ctl_checked(&["-w", "-t", "60", "start"], "start");
    }

    /// Terminates every other backend whose application_name or user name is `who`; returns
    /// how many were signalled.
    pub fn terminate_backends(&self, who: &str) -> u32 {
        let who = sql_literal(who);
        let count = self.sql_in(
            "postgres",
            &format!(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                 WHERE (application_name = {who} OR usename = {who}) \
                 AND pid <> pg_backend_pid()"
            ),
        );
        count
            .parse()
            .unwrap_or_else(|err| panic!("unexpected count {count:?}: {err}"))
    }

    /// How many client backends `user` has open (in any database).
    pub fn backend_count(&self, user: &str) -> u32 {
        let count = self.sql_in(
            "postgres",
            &format!(
                "SELECT count(*) FROM pg_stat_activity WHERE usename = {} \
                 AND backend_type = 'client backend'",
                sql_literal(user)
            ),
        );
        count
            .parse()
            .unwrap_or_else(|err| panic!("unexpected count {count:?}: {err}"))
    }

    /// A libpq / tokio-postgres connection string for `user` on database `app`, with that
    /// role's password when it has one.
    pub fn connstr(&self, user: &str) -> String {
        connstr(self.port, user, password_of(user), "app")
    }

    /// The `[databases]` value that points at database `db` of this server, over TCP.
    pub fn db_connstr(&self, db: &str) -> String {
        format!("host={HOST} port={} dbname={db}", self.port)
    }

    /// The stored secret of `user` (`md5…` or `SCRAM-SHA-256$…`), as an auth_file would hold it.
    pub fn role_secret(&self, user: &str) -> String {
        self.sql_in(
            "postgres",
            &format!(
                "SELECT rolpassword FROM pg_authid WHERE rolname = {}",
                sql_literal(user)
            ),
        )
    }

    /// Runs pgbench against this server as `postgres` on database `app` unless `args` say
    /// otherwise.
    pub fn pgbench(&self, args: &[&str]) -> Output {
        pgbench_at(self.port, None, args)
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        read_lossy(&self.log_path)
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        // The server may already be stopped; the directory goes away either way.
        let _ = self.pg_ctl(&["-w", "-m", "immediate", "stop"]).output();
    }
}

fn initdb(bindir: &Path, data_dir: &Path, cwd: &Path) {
    let mut cmd = server_command(&bindir.join("initdb"), cwd);
    cmd.arg("-D")
        .arg(data_dir)
        .args(["-A", "trust", "--username=postgres", "-E", "UTF8"])
        .args(["--locale=C", "--no-sync"]);
    run_checked(&mut cmd, "initdb");
}

/// One line per authentication method the tests use; the last line catches everyone else.
fn write_hba(data_dir: &Path) {
    let mut hba = String::from(
        "local all all trust\nhost all postgres 127.0.0.1/32 trust\n\
         host replication postgres 127.0.0.1/32 trust\n",
    );
    for role in &ROLES {
        hba.push_str(&format!(
            "host all {} 127.0.0.1/32 {}\n",
            role.name, role.hba_method
        ));
    }
    hba.push_str("host all all 127.0.0.1/32 scram-sha-256\n");
    write_file(&data_dir.join("pg_hba.conf"), &hba);
}

fn create_role_sql(role: &Role) -> String {
    match role.password {
        Some(password) => format!(
            "SET password_encryption = {}; CREATE ROLE {} LOGIN PASSWORD {}",
            sql_literal(role.encryption),
            role.name,
            sql_literal(password)
        ),
        None => format!("CREATE ROLE {} LOGIN", role.name),
    }
}

fn write_file(path: &Path, text: &str) {
    fs::write(path, text).unwrap_or_else(|err| panic!("cannot write {}: {err}", path.display()));
}

fn append_line(path: &Path, line: &str) {
    let mut text = read_lossy(path);
    text.push('\n');
    text.push_str(line);
    text.push('\n');
    write_file(path, &text);
}

/// A libpq connection string for 127.0.0.1:`port`.
pub fn connstr(port: u16, user: &str, password: Option<&str>, db: &str) -> String {
    let mut text = format!("host={HOST} port={port} user={user} dbname={db}");
    if let Some(password) = password {
        text.push_str(&format!(" password={password}"));
    }
    text
}

/// Writes an auth_file (`"user" "secret"` per line) named `userlist.txt` into `dir`.
pub fn write_userlist(dir: &Path, entries: &[(&str, &str)]) -> PathBuf {
    let quote = |text: &str| format!("\"{}\"", text.replace('"', "\"\""));
    let text: String = entries
        .iter()
        .map(|(user, secret)| format!("{} {}\n", quote(user), quote(secret)))
        .collect();
    let path = dir.join("userlist.txt");
    write_file(&path, &text);
    path
}

/// PostgreSQL's MD5 secret for `user`: `"md5"` and the hex MD5 of password then user name.
pub fn md5_secret(user: &str, password: &str) -> String {
    use md5::{Digest, Md5};
    let digest = Md5::digest(format!("{password}{user}").as_bytes());
    let hex: String = digest.iter().map(|byte| format!("{byte:02x}")).collect();
    format!("md5{hex}")
}

/// Inserts `lines` at the end of the `[section]` of an INI text (a new section at the end when
/// there is none), so that they are read as part of that section whatever follows it.
pub fn insert_into_section(body: &str, section: &str, lines: &str) -> String {
    let mut out = String::with_capacity(body.len() + lines.len() + section.len() + 4);
    let mut in_section = false;
    let mut inserted = false;
    for line in body.lines() {
        if let Some(name) = section_header(line) {
            if in_section && !inserted {
                out.push_str(lines);
                inserted = true;
            }
            in_section = name.eq_ignore_ascii_case(section);
        }
        out.push_str(line);
        out.push('\n');
    }
    if !inserted {
        if !in_section {
            out.push_str(&format!("[{section}]\n"));
        }
        out.push_str(lines);
    }
    out
}

fn section_header(line: &str) -> Option<&str> {
    let line = line.trim();
    line.strip_prefix('[')?.strip_suffix(']').map(str::trim)
}

/// A running `pgward` (the binary built from this crate), listening on 127.0.0.1 and on a
/// socket in its own directory.
pub struct Pgward {
    pub port: u16,
    pub socket_dir: PathBuf,
    pub ini_path: PathBuf,
    /// The `logfile` the harness sets.
    pub log_path: PathBuf,
    /// Where the process's stdout and stderr go.
    pub output_path: PathBuf,
    child: Child,
    dir: TempDir,
}

/// Why a pgward process did not come up.
enum StartFailure {
    PortTaken,
    Failed(String),
}

impl Pgward {
    /// A complete ini whose `[databases]` has `app` and `postgres` pointing at `pg`, followed by
    /// the caller's `databases` lines (a later entry of the same name wins), and whose
    /// `[pgbouncer]` section holds `extra_pgbouncer_settings`.
    pub fn ini(pg: &Postgres, extra_pgbouncer_settings: &str, databases: &str) -> String {
        format!(
            "[databases]\napp = {}\npostgres = {}\n{databases}\n\n[pgbouncer]\n{extra_pgbouncer_settings}\n",
            pg.db_connstr("app"),
            pg.db_connstr("postgres"),
        )
    }

    /// Starts pgward in front of `pg` with `auth_type = trust`, the `[pgbouncer]` `settings`
    /// and the extra `[databases]` lines `dbs`.
    pub fn trusting(pg: &Postgres, settings: &str, dbs: &str) -> Pgward {
        let settings = format!("auth_type = trust\n{settings}");
        Pgward::start(&Pgward::ini(pg, &settings, dbs))
    }

    /// Starts pgward in front of `pg` with `auth_type = trust`, `pool_mode = transaction` and
    /// `settings`.
    pub fn transaction_pool(pg: &Postgres, settings: &str) -> Pgward {
        Pgward::trusting(pg, &format!("pool_mode = transaction\n{settings}"), "")
    }

    /// Writes `ini_body` (with `listen_addr`, `listen_port`, `unix_socket_dir`, `logfile` and
    /// `pidfile` added to its `[pgbouncer]` section) into a new directory, starts pgward on it,
    /// and waits until its TCP port accepts connections. Panics with pgward's log when it exits
    /// or is not listening within 10 seconds.
    pub fn start(ini_body: &str) -> Pgward {
        Pgward::start_listening_on(ini_body, HOST)
    }

    /// [`Pgward::start`] with `listen_addr` (which must include 127.0.0.1, where the start is
    /// awaited).
    pub fn start_listening_on(ini_body: &str, listen_addr: &str) -> Pgward {
        let dir = shared_tempdir("pgward-");
        let paths = PgwardPaths::new(dir.path());
        for _ in 0..BIND_ATTEMPTS {
            let port = free_port();
            let ini = paths.ini_with_listener(ini_body, listen_addr, port);
            write_file(&paths.ini, &ini);
            let mut child = paths.spawn();
            match wait_listening(&mut child, port, &paths) {
                Ok(()) => return paths.into_pgward(port, child, dir),
                Err(StartFailure::PortTaken) => continue,
                Err(StartFailure::Failed(why)) => panic!("{why}\n{}", paths.logs()),
            }
        }
        panic!("pgward found no free port:\n{}", paths.logs());
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `sig` (a `libc::SIG*` number) to the process.
    pub fn signal(&self, sig: i32) {
        let pid = libc::pid_t::try_from(self.child.id())
            .unwrap_or_else(|err| panic!("pid out of range: {err}"));
        // SAFETY: kill has no memory-safety preconditions; the pid is our own child, which we
        // have not waited for, so it cannot have been reused.
        let rc = unsafe { libc::kill(pid, sig) };
        assert_eq!(
            rc,
            0,
            "kill({pid}, {sig}) failed: {}",
            std::io::Error::last_os_error()
        );
    }

    /// Asks pgward to re-read its configuration (SIGHUP).
    pub fn reload(&self) {
        self.signal(libc::SIGHUP);
    }

    /// Sends SIGHUP and waits until the log says the configuration was reloaded once more.
    pub fn reload_and_wait(&self) {
        let reloads = || self.log().matches("configuration reloaded").count();
        let before = reloads();
        self.reload();
        assert!(
            eventually(10 * SECOND, || reloads() > before),
            "no reload\n{}",
            self.log()
        );
    }

    /// Waits up to `timeout` for the process to exit; `None` if it is still running.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            sleep(Duration::from_millis(20));
        }
    }

    /// pgward's logfile and its stdout/stderr so far.
    pub fn log(&self) -> String {
        format!(
            "--- {} ---\n{}\n--- {} ---\n{}",
            self.log_path.display(),
            read_lossy(&self.log_path),
            self.output_path.display(),
            read_lossy(&self.output_path)
        )
    }

    /// Runs `sql` through psql against pgward.
    pub fn psql(&self, user: &str, password: Option<&str>, db: &str, sql: &str) -> Output {
        psql_at(self.port, user, password, db, sql)
    }

    /// Runs pgbench against pgward (user `postgres`, database `app` unless `args` say otherwise).
    pub fn pgbench(&self, args: &[&str]) -> Output {
        pgbench_at(self.port, None, args)
    }

    /// Like [`Pgward::pgbench`], sending `password` when asked for one.
    pub fn pgbench_as(&self, password: &str, args: &[&str]) -> Output {
        pgbench_at(self.port, Some(password), args)
    }

    /// A libpq / tokio-postgres connection string to pgward.
    pub fn connstr(&self, user: &str, password: Option<&str>, db: &str) -> String {
        connstr(self.port, user, password, db)
    }
}

impl Drop for Pgward {
    /// Stops pgward; when the test failed, prints its log (tail) so a failure in CI shows
    /// what pgward saw.
    fn drop(&mut self) {
        // Whether pgward was still running (a crash or a kill of its own shows here).
        let exited = self.child.try_wait().ok().flatten();
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            if let Some(status) = exited {
                eprintln!("pgward had exited before the test's end: {status}");
            }
            let log = self.log();
            let tail = log.len().saturating_sub(20_000);
            let start = (tail..log.len())
                .find(|&i| log.is_char_boundary(i))
                .unwrap_or(0);
            eprintln!("pgward's log at the failure:\n{}", &log[start..]);
        }
    }
}

/// The files of one pgward fixture.
struct PgwardPaths {
    dir: PathBuf,
    ini: PathBuf,
    log: PathBuf,
    output: PathBuf,
}

impl PgwardPaths {
    fn new(dir: &Path) -> PgwardPaths {
        PgwardPaths {
            dir: dir.to_path_buf(),
            ini: dir.join("pgward.ini"),
            log: dir.join("pgward.log"),
            output: dir.join("pgward.out"),
        }
    }

    /// `body` with the test's listener, log and pidfile; a `unix_socket_dir` of the body's own
    /// stays.
    fn ini_with_listener(&self, body: &str, listen_addr: &str, port: u16) -> String {
        let own_dir = body
            .lines()
            .any(|l| l.trim_start().starts_with("unix_socket_dir"));
        let socket_dir = match own_dir {
            true => String::new(),
            false => format!("unix_socket_dir = {}\n", self.dir.display()),
        };
        let lines = format!(
            "listen_addr = {listen_addr}\nlisten_port = {port}\n{socket_dir}\
             logfile = {}\npidfile = {}\n",
            self.log.display(),
            self.dir.join("pgward.pid").display()
        );
        insert_into_section(&with_test_auth_file(body, &self.dir), "pgbouncer", &lines)
    }

    fn spawn(&self) -> Child {
        let out = fs::File::create(&self.output)
            .unwrap_or_else(|err| panic!("cannot create {}: {err}", self.output.display()));
        let err = out
            .try_clone()
            .unwrap_or_else(|err| panic!("cannot duplicate a file handle: {err}"));
        pooler_command()
            .arg(&self.ini)
            .current_dir(&self.dir)
            .env("RUST_BACKTRACE", "1")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|err| panic!("cannot start pgward: {err}"))
    }

    fn logs(&self) -> String {
        format!(
            "--- {} ---\n{}\n--- {} ---\n{}\n--- {} ---\n{}",
            self.ini.display(),
            read_lossy(&self.ini),
            self.log.display(),
            read_lossy(&self.log),
            self.output.display(),
            read_lossy(&self.output)
        )
    }

    fn into_pgward(self, port: u16, child: Child, dir: TempDir) -> Pgward {
        Pgward {
            port,
            socket_dir: self.dir,
            ini_path: self.ini,
            log_path: self.log,
            output_path: self.output,
            child,
            dir,
        }
    }
}

/// The value of `key` in an ini text (the last one wins), as written.
fn ini_value<'a>(body: &'a str, key: &str) -> Option<&'a str> {
    body.lines()
        .filter_map(|line| line.split_once('='))
        .filter(|(k, _)| k.trim().eq_ignore_ascii_case(key))
        .map(|(_, v)| v.trim())
        .next_back()
}

/// `body` with an auth file in `dir` that lists the test server's roles, when the ini admits
/// clients without a password but names no auth file (see [`trusts_without_auth_file`]).
pub fn with_test_auth_file(body: &str, dir: &Path) -> String {
    if !trusts_without_auth_file(body) {
        return body.to_string();
    }
    let users = test_server_users(body);
    let entries: Vec<(&str, &str)> = users
        .iter()
        .map(|(u, p)| (u.as_str(), p.as_str()))
        .collect();
    let userlist = write_userlist(dir, &entries);
    insert_into_section(
        body,
        "pgbouncer",
        &format!("auth_file = {}\n", userlist.display()),
    )
}

/// Whether an ini may admit clients without a password (`trust`, `cert`, or `hba` with such
/// lines)
/// but names no auth file and no auth_user. Such logins admit only the users a pooler knows,
/// as PgBouncer does, so the fixture lists the test server's roles for it.
fn trusts_without_auth_file(body: &str) -> bool {
    let trusting = ini_value(body, "auth_type").is_some_and(|t| {
        ["trust", "hba", "cert"]
            .iter()
            .any(|m| t.eq_ignore_ascii_case(m))
    });
    trusting && ini_value(body, "auth_file").is_none() && ini_value(body, "auth_user").is_none()
}

/// Auth file entries for every role a test server has (the superuser and [`ROLES`], with
/// their plain passwords, an empty secret for the roles that have none) and for the console
/// users the ini names.
fn test_server_users(body: &str) -> Vec<(String, String)> {
    let console = ["admin_users", "stats_users"]
        .into_iter()
        .filter_map(|key| ini_value(body, key))
        .flat_map(|names| names.split(',').map(str::trim).filter(|n| !n.is_empty()))
        .map(|name| (name.to_string(), String::new()));
    std::iter::once(("postgres".to_string(), String::new()))
        .chain(ROLES.iter().map(|role| {
            (
                role.name.to_string(),
                role.password.unwrap_or("").to_string(),
            )
        }))
        .chain(console)
        .collect()
}

/// The pooler under test: this crate's `pgward`, or the program named by `$PGWARD_TEST_BINARY`
/// (a reference pooler such as `pgbouncer`, run as the `postgres` OS user when we are root, since
/// PgBouncer refuses to run as root).
fn pooler_command() -> Command {
    let Some(program) = std::env::var_os("PGWARD_TEST_BINARY") else {
        return Command::new(env!("CARGO_BIN_EXE_pgward"));
    };
    let mut cmd = Command::new(program);
    if is_root() {
        use std::os::unix::process::CommandExt;
        cmd.uid(postgres_id("-u")).gid(postgres_id("-g"));
    }
    cmd
}

/// The `postgres` OS user's uid (`flag` "-u") or gid ("-g").
fn postgres_id(flag: &str) -> u32 {
    let out = run_checked(Command::new("id").args([flag, "postgres"]), "id postgres");
    let text = stdout_of(&out);
    text.parse()
        .unwrap_or_else(|err| panic!("unexpected id {text:?}: {err}"))
}

/// Polls until `port` accepts a TCP connection, the child exits, or the start timeout passes.
fn wait_listening(child: &mut Child, port: u16, paths: &PgwardPaths) -> Result<(), StartFailure> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let deadline = Instant::now() + PGWARD_START_TIMEOUT;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            let logs = paths.logs().to_lowercase();
            if logs.contains("address already in use") || logs.contains("addrinuse") {
                return Err(StartFailure::PortTaken);
            }
            return Err(StartFailure::Failed(format!(
                "pgward exited early ({status})"
            )));
        }
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(StartFailure::Failed(format!(
                "pgward was not listening on {addr} after {PGWARD_START_TIMEOUT:?}"
            )));
        }
        sleep(Duration::from_millis(50));
    }
}

/// How many client backends `user` has open on database `db`, pgward's servers among them.
pub fn server_count(pg: &Postgres, user: &str, db: &str) -> u32 {
    let count = pg.sql_in(
        "postgres",
        &format!(
            "SELECT count(*) FROM pg_stat_activity WHERE usename = {} AND datname = {} \
             AND backend_type = 'client backend' AND pid <> pg_backend_pid()",
            sql_literal(user),
            sql_literal(db)
        ),
    );
    count
        .parse()
        .unwrap_or_else(|err| panic!("unexpected count {count:?}: {err}"))
}

/// Polls `check` every 50 ms until it holds or `limit` passes; returns whether it held.
pub fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if check() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        sleep(Duration::from_millis(50));
    }
}

/// Logs every statement `role` runs into the server log (for checks of pgward's own queries).
pub fn log_statements_of(pg: &Postgres, role: &str) {
    pg.sql_in(
        "postgres",
        &format!("ALTER ROLE {role} SET log_statement = 'all'"),
    );
}

/// How many times the server log shows `statement: {sql}`.
pub fn logged_statements(pg: &Postgres, sql: &str) -> usize {
    pg.log().matches(&format!("statement: {sql}")).count()
}
