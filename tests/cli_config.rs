//! The executable: command line, listening sockets, logfile and pidfile, configuration errors.

mod common;

use std::fs;
use std::process::Command;
use std::time::Duration;

use common::{stderr_of, stdout_of, Pgward, Postgres};

fn pgward(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_pgward"))
        .args(args)
        .output()
        .expect("run pgward")
}

#[test]
fn version_and_help() {
    let version = pgward(&["--version"]);
    assert!(version.status.success());
    assert_eq!(
        stdout_of(&version),
        format!("pgward {}", env!("CARGO_PKG_VERSION"))
    );
    let help = pgward(&["--help"]);
    assert!(help.status.success());
    assert!(
        stdout_of(&help).contains("Usage: pgward"),
        "{}",
        stdout_of(&help)
    );
    let bad = pgward(&["--no-such-option"]);
    assert!(!bad.status.success());
    let none = pgward(&[]);
    assert!(!none.status.success());
}

#[test]
fn tcp_and_unix_socket_logfile_and_pidfile() {
    let pg = Postgres::start();
    let mut pw = Pgward::start(&Pgward::ini(&pg, "auth_type = trust\n", ""));
    let tcp = pw.psql("trustuser", None, "app", "SELECT 'tcp'");
    assert_eq!(stdout_of(&tcp), "tcp", "{}", stderr_of(&tcp));
    let socket_dir = pw.socket_dir.display().to_string();
    let unix = Command::new("psql")
        .env("PGPASSFILE", "/dev/null")
        .args([
            "-X",
            "-w",
            "-At",
            "-h",
            &socket_dir,
            "-p",
            &pw.port.to_string(),
        ])
        .args(["-U", "trustuser", "-d", "app", "-c", "SELECT 'unix'"])
        .output()
        .expect("psql");
    assert_eq!(stdout_of(&unix), "unix", "{}", stderr_of(&unix));
    let socket = pw.socket_dir.join(format!(".s.PGSQL.{}", pw.port));
    assert!(socket.exists());

    let pidfile = pw.socket_dir.join("pgward.pid");
    let pid = fs::read_to_string(&pidfile).expect("pidfile");
    assert_eq!(pid.trim(), pw.pid().to_string());
    let log = fs::read_to_string(&pw.log_path).expect("logfile");
    assert!(log.contains("started"), "{log}");

    pw.signal(libc::SIGTERM);
    let status = pw
        .wait_exit(Duration::from_secs(5))
        .expect("pgward did not stop");
    assert!(status.success(), "{status:?}");
    assert!(!pidfile.exists(), "pidfile left behind");
    assert!(!socket.exists(), "socket left behind");
}

#[test]
fn broken_ini_exits_non_zero_naming_file_and_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cases = [
        (
            "syntax",
            "[databases]\napp = host=x\nthis line has no equals sign\n",
        ),
        (
            "bad value",
            "[pgbouncer]\nlisten_port = 6432\npool_mode = sometimes\n",
        ),
        ("bad number", "[pgbouncer]\n\ndefault_pool_size = many\n"),
    ];
    for (what, text) in cases {
        let path = dir.path().join(format!("{}.ini", what.replace(' ', "_")));
        fs::write(&path, text).expect("write ini");
        let out = pgward(&[path.to_str().expect("utf-8 path")]);
        assert!(!out.status.success(), "{what}: pgward accepted it");
        let expected = format!("{}:3", path.display());
        assert!(
            stderr_of(&out).contains(&expected),
            "{what}: no {expected} in {}",
            stderr_of(&out)
        );
    }
    let missing = pgward(&["/nonexistent/pgward.ini"]);
    assert!(!missing.status.success());
    assert!(stderr_of(&missing).contains("/nonexistent/pgward.ini"));
}

#[test]
fn unix_socket_group_owns_the_socket() {
    use std::os::unix::fs::MetadataExt;
    let pg = Postgres::start();
    let pw = Pgward::start(&Pgward::ini(
        &pg,
        "auth_type = trust\nunix_socket_group = nogroup\nunix_socket_mode = 0770\n",
        "",
    ));
    let socket = pw.socket_dir.join(format!(".s.PGSQL.{}", pw.port));
    let meta = fs::metadata(&socket).expect("the socket");
    assert_eq!(meta.gid(), 65534, "nogroup's");
    assert_eq!(meta.mode() & 0o777, 0o770);

    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("pgward.ini");
    let ini = format!(
        "[pgbouncer]\nlisten_addr =\nlisten_port = {}\nunix_socket_dir = {}\n\
         unix_socket_group = no-such-group-here\n",
        common::free_port(),
        dir.path().display()
    );
    fs::write(&path, ini).expect("write ini");
    let out = pgward(&[path.to_str().expect("utf-8 path")]);
    assert!(!out.status.success(), "pgward started");
    assert!(
        stderr_of(&out).contains("could not find group 'no-such-group-here'"),
        "{}",
        stderr_of(&out)
    );
}

/// `unix_socket_dir = @name` listens in Linux's abstract namespace, as PgBouncer does (no file
/// stands for the socket), and a database's `host=@name` connects to such a socket: psql reaches
/// pgward there, and a second pgward pools onto the first through it.
#[test]
fn an_abstract_unix_socket_is_listened_on_and_connected_to() {
    let pg = Postgres::start();
    let name = format!(
        "@pgward-test-{}-{}",
        std::process::id(),
        common::free_port()
    );
    let settings = format!("auth_type = trust\nunix_socket_dir = {name}\n");
    let first = Pgward::start(&Pgward::ini(&pg, &settings, ""));
    let file = first.socket_dir.join(format!(".s.PGSQL.{}", first.port));
    assert!(!file.exists(), "a socket file for an abstract name");
    assert!(
        !std::path::Path::new(&name).exists(),
        "a directory named {name}"
    );
    let port = first.port.to_string();
    let out = common::client_command("psql", None)
        .args([
            "-X",
            "-At",
            "-h",
            &name,
            "-p",
            &port,
            "-U",
            "trustuser",
            "app",
        ])
        .args(["-c", "SELECT 1"])
        .output()
        .expect("run psql");
    assert_eq!(stdout_of(&out), "1", "{}\n{}", stderr_of(&out), first.log());
    let through = format!("through = host={name} port={port} dbname=app\n");
    let second = Pgward::trusting(&pg, "", &through);
    let out = second.psql("trustuser", None, "through", "SELECT 2");
    assert_eq!(
        stdout_of(&out),
        "2",
        "{}\n{}",
        stderr_of(&out),
        second.log()
    );
}

#[test]
fn unknown_keys_are_accepted_with_a_warning_naming_them() {
    let pg = Postgres::start();
    let pw = Pgward::start(&Pgward::ini(
        &pg,
        "auth_type = trust\nfrobnicate_level = 3\n",
        "",
    ));
    let ok = pw.psql("trustuser", None, "app", "SELECT 1");
    assert!(ok.status.success(), "{}", stderr_of(&ok));
    let log = pw.log();
    let warning = log
        .lines()
        .find(|line| line.contains("frobnicate_level"))
        .unwrap_or_else(|| panic!("no warning names the key:\n{log}"));
    assert!(warning.contains("WARN"), "{warning}");
}
