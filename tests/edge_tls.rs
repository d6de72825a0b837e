//! TLS at pgward's edge: clients with sslmode=require and verify-full against a CA the test
//! makes, plain-text clients refused when TLS is required, direct TLS (PostgreSQL 17's
//! sslnegotiation=direct) with a rustls client, certificate authentication, certificates
//! re-read on reload (a bad one keeps the old), and TLS from pgward to PostgreSQL.

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::certs::{Ca, Issued};
use common::raw::{self, PROTOCOL_3_0};
use common::{psql_at, stderr_of, stdout_of, Pgward, Postgres};

fn tls_settings(server: &Issued, ca: &Path, mode: &str) -> String {
    format!(
        "auth_type = trust\npool_mode = transaction\nclient_tls_sslmode = {mode}\n\
         client_tls_cert_file = {}\nclient_tls_key_file = {}\nclient_tls_ca_file = {}\n",
        server.cert.display(),
        server.key.display(),
        ca.display()
    )
}

fn psql_ok(port: u16, user: &str, conn: &str) -> String {
    let out = psql_at(port, user, None, conn, "SELECT 1");
    assert!(out.status.success(), "{conn}: {}", stderr_of(&out));
    stdout_of(&out)
}

#[test]
fn psql_require_and_verify_full_and_plain_text_refused() {
    let pg = Postgres::start();
    let dir = common::shared_tempdir("pgward-tls-");
    let ca = Ca::new("pgward test CA");
    let ca_path = ca.write(&dir.path().join("ca.crt"));
    let server = ca.issue(
        dir.path(),
        "server",
        "localhost",
        &["127.0.0.1", "localhost"],
    );
    let pw = Pgward::start(&Pgward::ini(
        &pg,
        &tls_settings(&server, &ca_path, "require"),
        "",
    ));
    assert_eq!(
        psql_ok(pw.port, "trustuser", "dbname=app sslmode=require"),
        "1"
    );
    // log_connections names the TLS version and cipher suite of the login.
    let attempt = "login attempt: db=app user=trustuser tls=TLSv1.3/TLS13_";
    assert!(pw.log().contains(attempt), "{}", pw.log());
    let verify = format!(
        "dbname=app sslmode=verify-full sslrootcert={}",
        ca_path.display()
    );
    assert_eq!(psql_ok(pw.port, "trustuser", &verify), "1");

    // The relay under load over TLS: pgbench through pgward with sslmode=require.
    let init = pg.pgbench(&["-i", "-s", "1", "-q"]);
    assert!(init.status.success(), "{}", stderr_of(&init));
    let bench = common::pgbench_at(
        pw.port,
        None,
        &[
            "-c",
            "4",
            "-j",
            "2",
            "-T",
            "5",
            "-n",
            "dbname=app sslmode=require",
        ],
    );
    common::pgbench_clean(&bench, "over TLS", &pw.log());

    // Plain text is refused after the startup packet, as PgBouncer does.
    let plain = psql_at(
        pw.port,
        "trustuser",
        None,
        "dbname=app sslmode=disable",
        "SELECT 1",
    );
    assert!(!plain.status.success());
    assert!(
        stderr_of(&plain).contains("SSL required"),
        "{}",
        stderr_of(&plain)
    );
    let mut client = raw::Raw::connect(pw.port);
    let refused = client
        .startup(&[("user", "trustuser"), ("database", "app")])
        .unwrap_err();
    assert_eq!(refused.code(), "28000");

    // Another CA's root does not verify pgward's certificate.
    let other = Ca::new("another CA");
    let other_path = other.write(&dir.path().join("other.crt"));
    let wrong = psql_at(
        pw.port,
        "trustuser",
        None,
        &format!(
            "dbname=app sslmode=verify-full sslrootcert={}",
            other_path.display()
        ),
        "SELECT 1",
    );
    assert!(!wrong.status.success(), "verified against the wrong CA");
}

#[test]
fn reload_rereads_certificates_and_keeps_the_old_ones_when_bad() {
    let pg = Postgres::start();
    let dir = common::shared_tempdir("pgward-tls-");
    let ca = Ca::new("first CA");
    let ca_path = ca.write(&dir.path().join("ca.crt"));
    let server = ca.issue(dir.path(), "server", "localhost", &["127.0.0.1"]);
    let pw = Pgward::start(&Pgward::ini(
        &pg,
        &tls_settings(&server, &ca_path, "prefer"),
        "",
    ));
    let verify_with = |ca: &Path| {
        format!(
            "dbname=app sslmode=verify-full sslrootcert={}",
            ca.display()
        )
    };
    psql_ok(pw.port, "trustuser", &verify_with(&ca_path));

    std::fs::write(&server.cert, "not a certificate\n").unwrap();
    pw.reload();
    assert!(
        common::eventually(Duration::from_secs(5), || pw
            .log()
            .contains("keeping the running certificates")),
        "{}",
        pw.log()
    );
    psql_ok(pw.port, "trustuser", &verify_with(&ca_path));

    let second = Ca::new("second CA");
    let second_path = second.write(&dir.path().join("second.crt"));
    second.issue(dir.path(), "server", "localhost", &["127.0.0.1"]);
    pw.reload();
    assert!(
        common::eventually(Duration::from_secs(5), || {
            psql_at(
                pw.port,
                "trustuser",
                None,
                &verify_with(&second_path),
                "SELECT 1",
            )
            .status
            .success()
        }),
        "the new certificate was not taken: {}",
        pw.log()
    );
}

/// A rustls client configuration trusting `ca`, offering `alpn`.
fn rustls_client(ca: &Path, alpn: &[&[u8]]) -> Arc<rustls::ClientConfig> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|a| a.to_vec()).collect();
    Arc::new(config)
}

/// Logs in as `trustuser` over direct TLS offering `alpn`: the tags of the messages up to
/// ReadyForQuery or ErrorResponse, with `!` where the connection failed or went quiet.
fn direct_tls_login(port: u16, ca: &Path, alpn: &[&[u8]]) -> Vec<u8> {
    let config = rustls_client(ca, alpn);
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let conn = rustls::ClientConnection::new(config, name).unwrap();
    let sock = TcpStream::connect(("127.0.0.1", port)).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut tls = rustls::StreamOwned::new(conn, sock);
    let startup = raw::startup_packet(PROTOCOL_3_0, &[("user", "trustuser"), ("database", "app")]);
    if tls.write_all(&startup).is_err() {
        return vec![b'!'];
    }
    let mut client = raw::Raw::over_tls(tls);
    let mut tags = Vec::new();
    loop {
        let Ok(msg) = client.read_message() else {
            tags.push(b'!');
            return tags;
        };
        tags.push(msg.tag);
        if msg.tag == b'Z' || msg.tag == b'E' {
            return tags;
        }
    }
}

#[test]
fn direct_tls_needs_alpn_postgresql() {
    let pg = Postgres::start();
    let dir = common::shared_tempdir("pgward-tls-");
    let ca = Ca::new("pgward test CA");
    let ca_path = ca.write(&dir.path().join("ca.crt"));
    let server = ca.issue(dir.path(), "server", "localhost", &["localhost"]);
    let pw = Pgward::start(&Pgward::ini(
        &pg,
        &tls_settings(&server, &ca_path, "require"),
        "",
    ));
    let tags = direct_tls_login(pw.port, &ca_path, &[b"postgresql"]);
    assert_eq!(tags.first(), Some(&b'R'), "{tags:?}");
    assert_eq!(tags.last(), Some(&b'Z'), "{tags:?}");
    let tags = direct_tls_login(pw.port, &ca_path, &[]);
    assert!(!tags.contains(&b'Z'), "logged in without ALPN: {tags:?}");
    let tags = direct_tls_login(pw.port, &ca_path, &[b"http/1.1"]);
    assert!(
        !tags.contains(&b'Z'),
        "logged in with the wrong ALPN: {tags:?}"
    );
}

#[test]
fn cert_auth_takes_the_user_from_the_client_certificate() {
    let pg = Postgres::start();
    let dir = common::shared_tempdir("pgward-tls-");
    let ca = Ca::new("pgward test CA");
    let ca_path = ca.write(&dir.path().join("ca.crt"));
    let server = ca.issue(dir.path(), "server", "localhost", &["127.0.0.1"]);
    let client = ca.issue(dir.path(), "client", "trustuser", &[]);
    let settings = tls_settings(&server, &ca_path, "verify-full")
        .replace("auth_type = trust", "auth_type = cert");
    let pw = Pgward::start(&Pgward::ini(&pg, &settings, ""));
    let with_cert = format!(
        "dbname=app sslmode=verify-full sslrootcert={} sslcert={} sslkey={}",
        ca_path.display(),
        client.cert.display(),
        client.key.display()
    );
    let out = psql_at(
        pw.port,
        "trustuser",
        None,
        &with_cert,
        "SELECT current_user",
    );
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert_eq!(stdout_of(&out), "trustuser");
    let other = psql_at(pw.port, "md5user", None, &with_cert, "SELECT 1");
    assert!(!other.status.success());
    assert!(
        stderr_of(&other).contains("certificate authentication failed"),
        "{}",
        stderr_of(&other)
    );
    // A certificate naming a user pgward does not know gets no session either.
    let stranger = ca.issue(dir.path(), "stranger", "stranger", &[]);
    let stranger_cert = format!(
        "dbname=app sslmode=verify-full sslrootcert={} sslcert={} sslkey={}",
        ca_path.display(),
        stranger.cert.display(),
        stranger.key.display()
    );
    let out = psql_at(pw.port, "stranger", None, &stranger_cert, "SELECT 1");
    assert!(!out.status.success(), "a stranger logged in by certificate");
    assert!(
        stderr_of(&out).contains("certificate authentication failed"),
        "{}",
        stderr_of(&out)
    );
    // verify-full asks every client for a certificate.
    let without = psql_at(
        pw.port,
        "trustuser",
        None,
        &format!(
            "dbname=app sslmode=require sslrootcert={}",
            ca_path.display()
        ),
        "SELECT 1",
    );
    assert!(!without.status.success(), "logged in without a certificate");
}

/// Turns on TLS in the test server with a certificate from `ca`.
fn enable_server_tls(pg: &Postgres, ca: &Ca) {
    let issued = ca.issue(&pg.data_dir, "server", "localhost", &["127.0.0.1"]);
    if unsafe { libc::geteuid() } == 0 {
        for path in [&issued.cert, &issued.key] {
            let status = std::process::Command::new("chown")
                .arg("postgres:")
                .arg(path)
                .status()
                .unwrap();
            assert!(status.success());
        }
    }
    pg.sql_in(
        "postgres",
        &format!(
            "ALTER SYSTEM SET ssl_cert_file = '{}'",
            issued.cert.display()
        ),
    );
    pg.sql_in(
        "postgres",
        &format!("ALTER SYSTEM SET ssl_key_file = '{}'", issued.key.display()),
    );
    pg.sql_in("postgres", "ALTER SYSTEM SET ssl = on");
    pg.sql_in("postgres", "SELECT pg_reload_conf()");
    assert!(common::eventually(Duration::from_secs(5), || pg
        .sql_in("postgres", "SHOW ssl")
        == "on"));
}

#[test]
fn pgward_speaks_tls_to_the_server() {
    let pg = Postgres::start();
    let dir = common::shared_tempdir("pgward-tls-");
    let ca = Ca::new("server CA");
    let ca_path = ca.write(&dir.path().join("ca.crt"));
    let ssl_of_session = "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()";

    // Without TLS at the server, prefer falls back to plain text and require refuses.
    let pw = Pgward::start(&Pgward::ini(&pg, "auth_type = trust\n", ""));
    let out = psql_at(pw.port, "trustuser", None, "app", ssl_of_session);
    assert_eq!(stdout_of(&out), "f", "{}", stderr_of(&out));
    drop(pw);
    let pw = Pgward::start(&Pgward::ini(
        &pg,
        "auth_type = trust\nserver_tls_sslmode = require\n",
        "",
    ));
    let out = psql_at(pw.port, "trustuser", None, "app", "SELECT 1");
    assert!(!out.status.success(), "logged in over plain text");
    drop(pw);

    enable_server_tls(&pg, &ca);
    let settings = format!(
        "auth_type = trust\nserver_tls_sslmode = verify-full\nserver_tls_ca_file = {}\n",
        ca_path.display()
    );
    let pw = Pgward::start(&Pgward::ini(&pg, &settings, ""));
    let out = psql_at(pw.port, "trustuser", None, "app", ssl_of_session);
    assert!(out.status.success(), "{}\n{}", stderr_of(&out), pw.log());
    assert_eq!(stdout_of(&out), "t");
    // SCRAM over TLS, pgward logging in with the keys the client proved.
    let userlist =
        common::write_userlist(dir.path(), &[("scramuser", &pg.role_secret("scramuser"))]);
    let settings = format!(
        "auth_type = scram-sha-256\nauth_file = {}\nserver_tls_sslmode = verify-ca\nserver_tls_ca_file = {}\n",
        userlist.display(),
        ca_path.display()
    );
    drop(pw);
    let pw = Pgward::start(&Pgward::ini(&pg, &settings, ""));
    let out = psql_at(
        pw.port,
        "scramuser",
        Some("scrampass"),
        "app",
        ssl_of_session,
    );
    assert!(out.status.success(), "{}\n{}", stderr_of(&out), pw.log());
    assert_eq!(stdout_of(&out), "t");
    // A CA that did not sign the server's certificate is refused.
    let other = Ca::new("other CA");
    let other_path = other.write(&dir.path().join("other.crt"));
    drop(pw);
    let pw = Pgward::start(&Pgward::ini(
        &pg,
        &format!(
            "auth_type = trust\nserver_tls_sslmode = verify-ca\nserver_tls_ca_file = {}\n",
            other_path.display()
        ),
        "",
    ));
    let out = psql_at(pw.port, "trustuser", None, "app", "SELECT 1");
    assert!(!out.status.success(), "verified against the wrong CA");
}

/// Runs `sql` on pgward's console over its Unix socket, as the OS user running it.
fn console(pw: &Pgward, sql: &str) -> std::process::Output {
    let socket = pw.socket_dir.display().to_string();
    std::process::Command::new("psql")
        .args(["-X", "-w", "-At", "-h", &socket, "-p", &pw.port.to_string()])
        .args(["-U", "pgbouncer", "-d", "pgbouncer", "-c", sql])
        .output()
        .expect("psql")
}

/// Whether a client verifying pgward against `ca` logs in.
fn verifies_with(pw: &Pgward, ca: &Path) -> bool {
    let conn = format!(
        "dbname=app sslmode=verify-full sslrootcert={}",
        ca.display()
    );
    psql_at(pw.port, "trustuser", None, &conn, "SELECT 1")
        .status
        .success()
}

/// Whether a plain-text client logs in.
fn plain_text_logs_in(pw: &Pgward) -> bool {
    psql_at(
        pw.port,
        "trustuser",
        None,
        "dbname=app sslmode=disable",
        "SELECT 1",
    )
    .status
    .success()
}

/// A new CA written as `{name}.crt` in `dir`, and a certificate for localhost it signed.
fn ca_and_certificate(dir: &Path, name: &str) -> (std::path::PathBuf, Issued) {
    let ca = Ca::new(&format!("{name} CA"));
    let path = ca.write(&dir.join(format!("{name}.crt")));
    let server = ca.issue(dir, &format!("{name}-server"), "localhost", &["127.0.0.1"]);
    (path, server)
}

#[test]
fn console_set_of_tls_settings_applies_like_a_reload() {
    let pg = Postgres::start();
    let dir = common::shared_tempdir("pgward-tls-set-");
    let (first_path, old) = ca_and_certificate(dir.path(), "first");
    let (second_path, new) = ca_and_certificate(dir.path(), "second");
    let pw = Pgward::start(&Pgward::ini(
        &pg,
        &tls_settings(&old, &first_path, "require"),
        "",
    ));
    assert!(verifies_with(&pw, &first_path));

    // One setting at a time, as PgBouncer's console takes them: a key that does not match
    // the certificate yet is accepted with a notice, and the running TLS stays whole.
    let out = console(
        &pw,
        &format!("SET client_tls_key_file = '{}'", new.key.display()),
    );
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert!(
        stderr_of(&out).contains("NOTICE") && stderr_of(&out).contains("TLS settings not applied"),
        "{}",
        stderr_of(&out)
    );
    assert!(verifies_with(&pw, &first_path), "{}", pw.log());
    for sql in [
        format!("SET client_tls_cert_file = '{}'", new.cert.display()),
        format!("SET client_tls_ca_file = '{}'", second_path.display()),
    ] {
        let out = console(&pw, &sql);
        assert!(out.status.success(), "{sql}: {}", stderr_of(&out));
        assert!(!stderr_of(&out).contains("NOTICE"), "{}", stderr_of(&out));
    }
    assert!(verifies_with(&pw, &second_path), "{}", pw.log());
    assert!(!verifies_with(&pw, &first_path));

    // The mode too: disable lets plain text in, require refuses it again.
    assert!(!plain_text_logs_in(&pw));
    assert!(console(&pw, "SET client_tls_sslmode = disable")
        .status
        .success());
    assert!(plain_text_logs_in(&pw), "{}", pw.log());
    assert!(console(&pw, "SET client_tls_sslmode = require")
        .status
        .success());
    assert!(!plain_text_logs_in(&pw));
    assert!(verifies_with(&pw, &second_path));
}

#[test]
fn a_failed_tls_reload_keeps_both_sides_with_their_modes() {
    let pg = Postgres::start();
    let dir = common::shared_tempdir("pgward-tls-reload-");
    let (first_path, old) = ca_and_certificate(dir.path(), "first");
    let (second_path, new) = ca_and_certificate(dir.path(), "second");
    let pw = Pgward::start(&Pgward::ini(
        &pg,
        &tls_settings(&old, &first_path, "prefer"),
        "",
    ));
    assert!(plain_text_logs_in(&pw));
    let running = std::fs::read_to_string(&pw.ini_path).unwrap();
    let client_side = running
        .replace(
            "client_tls_sslmode = prefer",
            "client_tls_sslmode = require",
        )
        .replace(
            &old.cert.display().to_string(),
            &new.cert.display().to_string(),
        )
        .replace(
            &old.key.display().to_string(),
            &new.key.display().to_string(),
        );

    // The client side alone would load, but the server side cannot: neither changes.
    let broken = client_side.replace(
        "[pgbouncer]\n",
        "[pgbouncer]\nserver_tls_sslmode = verify-ca\nserver_tls_ca_file = /nonexistent/ca.crt\n",
    );
    std::fs::write(&pw.ini_path, &broken).unwrap();
    let out = console(&pw, "RELOAD");
    assert!(!out.status.success(), "RELOAD reported success");
    assert!(
        stderr_of(&out).contains("RELOAD failed"),
        "{}",
        stderr_of(&out)
    );
    assert!(
        pw.log().contains("TLS settings not applied"),
        "{}",
        pw.log()
    );
    assert!(
        plain_text_logs_in(&pw),
        "the new mode went in without its side's partner"
    );
    assert!(
        verifies_with(&pw, &first_path),
        "the new certificate went in"
    );
    assert!(!verifies_with(&pw, &second_path));
    let out = psql_at(
        pw.port,
        "trustuser",
        None,
        "app",
        "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
    );
    assert_eq!(
        stdout_of(&out),
        "f",
        "server TLS changed: {}",
        stderr_of(&out)
    );

    // Fixed: the whole change applies.
    std::fs::write(&pw.ini_path, &client_side).unwrap();
    let out = console(&pw, "RELOAD");
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert!(!plain_text_logs_in(&pw));
    assert!(verifies_with(&pw, &second_path), "{}", pw.log());
}

#[test]
fn servers_opened_under_other_tls_settings_are_replaced() {
    let pg = Postgres::start();
    let pw = Pgward::start(&Pgward::ini(
        &pg,
        "auth_type = trust\npool_mode = transaction\n",
        "",
    ));
    let backend = || {
        let out = psql_at(pw.port, "trustuser", None, "app", "SELECT pg_backend_pid()");
        assert!(out.status.success(), "{}", stderr_of(&out));
        stdout_of(&out)
    };
    let first = backend();
    assert_eq!(backend(), first, "the idle server is reused");
    // Unchanged TLS settings keep the server; a changed sslmode replaces it.
    assert!(console(&pw, "SET server_tls_sslmode = prefer")
        .status
        .success());
    assert_eq!(backend(), first, "{}", pw.log());
    assert!(console(&pw, "SET server_tls_sslmode = disable")
        .status
        .success());
    let second = backend();
    assert_ne!(second, first, "{}", pw.log());
    // The file says prefer (by default): a reload brings it back, and a second changes
    // nothing.
    assert!(console(&pw, "RELOAD").status.success());
    let third = backend();
    assert_ne!(third, second);
    assert!(console(&pw, "RELOAD").status.success());
    assert_eq!(
        backend(),
        third,
        "a reload without TLS changes keeps the server: {}",
        pw.log()
    );
}

/// A server connection lost during its TLS handshake (a reset, the server gone) is a failed
/// connect, tried again, not a login the server refused: the client is not turned away at
/// once with the handshake's error (which PgBouncer keeps for a certificate that does not
/// verify). The server here accepts the SSLRequest and closes.
#[test]
fn a_tls_handshake_cut_short_is_tried_again() {
    let pg = Postgres::start();
    let fake = std::net::TcpListener::bind((common::HOST, 0)).expect("bind");
    let fake_port = fake.local_addr().expect("addr").port();
    let tries = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = Arc::clone(&tries);
    std::thread::spawn(move || {
        for conn in fake.incoming() {
            let Ok(mut conn) = conn else { return };
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let mut request = [0u8; 8];
            let _ = std::io::Read::read_exact(&mut conn, &mut request);
            let _ = conn.write_all(b"S");
        }
    });
    let settings = "server_tls_sslmode = require\nquery_wait_timeout = 3\n";
    let cut = format!("cut = host={} port={fake_port} dbname=app\n", common::HOST);
    let pw = Pgward::trusting(&pg, settings, &cut);
    let started = std::time::Instant::now();
    let out = psql_at(pw.port, "trustuser", None, "cut", "SELECT 1");
    let err = stderr_of(&out);
    assert!(!out.status.success(), "{err}");
    assert!(!err.contains("TLS handshake"), "{err}\n{}", pw.log());
    assert!(started.elapsed() >= Duration::from_secs(2), "{err}");
    assert!(
        tries.load(std::sync::atomic::Ordering::SeqCst) >= 2,
        "{}",
        pw.log()
    );
}

/// Inside TLS no other encryption is negotiated: a GSSENCRequest there is refused with
/// 08P01, as PostgreSQL refuses a second negotiation.
#[test]
fn a_gssenc_request_inside_tls_is_refused() {
    let pg = Postgres::start();
    let dir = common::shared_tempdir("pgward-tls-");
    let ca = Ca::new("pgward test CA");
    let ca_path = ca.write(&dir.path().join("ca.crt"));
    let server = ca.issue(dir.path(), "server", "localhost", &["localhost"]);
    let settings = tls_settings(&server, &ca_path, "require");
    let pw = Pgward::start(&Pgward::ini(&pg, &settings, ""));
    let mut sock = TcpStream::connect(("127.0.0.1", pw.port)).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    sock.write_all(&raw::ssl_request()).unwrap();
    let mut answer = [0u8; 1];
    std::io::Read::read_exact(&mut sock, &mut answer).unwrap();
    assert_eq!(&answer, b"S");
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let conn = rustls::ClientConnection::new(rustls_client(&ca_path, &[]), name).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, sock);
    tls.write_all(&raw::gssenc_request()).unwrap();
    let mut client = raw::Raw::over_tls(tls);
    let err = client.expect_error_within(common::SECOND * 10);
    assert_eq!(err.code(), "08P01", "{err:?}");
}
