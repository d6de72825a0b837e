//! Certificates as `openssl ca` and `openssl x509 -req` make them without an extensions
//! section: X.509 version 1, the host name only in the common name. OpenSSL, and so libpq,
//! PostgreSQL and PgBouncer, accept them; so must pgward, on both sides, for its own
//! certificate, for clients' certificates (auth_type = cert) and for servers' certificates
//! (server_tls_sslmode verify-ca and verify-full), and still refuse what another CA signed
//! or what names another host.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{psql_at, stderr_of, stdout_of, Pgward, Postgres};

/// A CA made with the openssl command, in a directory of its own.
struct OpensslCa {
    dir: PathBuf,
}

/// A certificate and its key, as files.
struct Issued {
    cert: PathBuf,
    key: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        stderr_of(&out)
    );
}

impl OpensslCa {
    /// A CA named `name` under `parent`, with an EC key and a self-signed certificate.
    fn new(parent: &Path, name: &str) -> OpensslCa {
        let dir = parent.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        openssl(
            &dir,
            &[
                "ecparam",
                "-name",
                "prime256v1",
                "-genkey",
                "-out",
                "ca.key",
            ],
        );
        let subject = format!("/O=pgward/CN={name}");
        openssl(
            &dir,
            &[
                "req",
                "-new",
                "-x509",
                "-days",
                "30",
                "-key",
                "ca.key",
                "-out",
                "ca.crt",
                "-subj",
                &subject,
                "-addext",
                "basicConstraints=critical,CA:TRUE",
            ],
        );
        OpensslCa { dir }
    }

    fn cert(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// A version 1 certificate for common name `cn`, signed by this CA.
    fn issue(&self, stem: &str, cn: &str, serial: u32) -> Issued {
        let key = format!("{stem}.key");
        let csr = format!("{stem}.csr");
        let crt = format!("{stem}.crt");
        openssl(
            &self.dir,
            &["ecparam", "-name", "prime256v1", "-genkey", "-out", &key],
        );
        let subject = format!("/O=pgward/OU=db/CN={cn}");
        openssl(
            &self.dir,
            &["req", "-new", "-key", &key, "-out", &csr, "-subj", &subject],
        );
        openssl(
            &self.dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-set_serial",
                &serial.to_string(),
                "-days",
                "30",
                "-out",
                &crt,
            ],
        );
        let text = Command::new("openssl")
            .args(["x509", "-noout", "-text", "-in", &crt])
            .current_dir(&self.dir)
            .output()
            .expect("openssl x509 -text");
        assert!(
            stdout_of(&text).contains("Version: 1 (0x0)"),
            "openssl did not make a version 1 certificate:\n{}",
            stdout_of(&text)
        );
        let issued = Issued {
            cert: self.dir.join(crt),
            key: self.dir.join(key),
        };
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&issued.key, std::fs::Permissions::from_mode(0o600)).unwrap();
        issued
    }
}

fn client_tls_settings(server: &Issued, ca: &Path, mode: &str, auth: &str) -> String {
    format!(
        "auth_type = {auth}\nclient_tls_sslmode = {mode}\nclient_tls_cert_file = {}\n\
         client_tls_key_file = {}\nclient_tls_ca_file = {}\n",
        server.cert.display(),
        server.key.display(),
        ca.display()
    )
}

#[test]
fn version_1_certificates_from_clients_and_for_pgward() {
    let pg = Postgres::start();
    let dir = common::shared_tempdir("pgward-tls-v1-");
    let ca = OpensslCa::new(dir.path(), "ca1");
    let other = OpensslCa::new(dir.path(), "ca2");
    let server = ca.issue("server", "localhost", 1);
    let client = ca.issue("client", "trustuser", 2);
    let stranger = other.issue("client", "trustuser", 3);
    let settings = client_tls_settings(&server, &ca.cert(), "verify-full", "cert");
    let pw = Pgward::start(&Pgward::ini(&pg, &settings, ""));
    let with = |root: &Path, cert: &Issued| {
        format!(
            "host=localhost dbname=app sslmode=verify-full sslrootcert={} sslcert={} sslkey={}",
            root.display(),
            cert.cert.display(),
            cert.key.display()
        )
    };
    // pgward's own version 1 certificate verifies by its common name; the client's version 1
    // certificate names the user.
    let out = psql_at(
        pw.port,
        "trustuser",
        None,
        &with(&ca.cert(), &client),
        "SELECT current_user",
    );
    assert!(out.status.success(), "{}\n{}", stderr_of(&out), pw.log());
    assert_eq!(stdout_of(&out), "trustuser");
    // A certificate another CA signed is refused in the handshake.
    let out = psql_at(
        pw.port,
        "trustuser",
        None,
        &with(&ca.cert(), &stranger),
        "SELECT 1",
    );
    assert!(!out.status.success(), "a stranger's certificate got in");
    // Nor does pgward's certificate verify against the other CA.
    let out = psql_at(
        pw.port,
        "trustuser",
        None,
        &with(&other.cert(), &client),
        "SELECT 1",
    );
    assert!(!out.status.success(), "verified against the wrong CA");
}

/// Turns on TLS in the test server with `issued`.
fn enable_server_tls(pg: &Postgres, issued: &Issued) {
    let (cert, key) = (pg.data_dir.join("v1.crt"), pg.data_dir.join("v1.key"));
    std::fs::copy(&issued.cert, &cert).unwrap();
    std::fs::copy(&issued.key, &key).unwrap();
    if unsafe { libc::geteuid() } == 0 {
        for path in [&cert, &key] {
            let status = Command::new("chown")
                .arg("postgres:")
                .arg(path)
                .status()
                .unwrap();
            assert!(status.success());
        }
    }
    for (name, path) in [("ssl_cert_file", &cert), ("ssl_key_file", &key)] {
        pg.sql_in(
            "postgres",
            &format!("ALTER SYSTEM SET {name} = '{}'", path.display()),
        );
    }
    pg.sql_in("postgres", "ALTER SYSTEM SET ssl = on");
    pg.sql_in("postgres", "SELECT pg_reload_conf()");
    assert!(common::eventually(Duration::from_secs(5), || pg
        .sql_in("postgres", "SHOW ssl")
        == "on"));
}

/// Whether `db` of a pgward with these server TLS settings reaches the server over TLS.
fn server_session_is_tls(pg: &Postgres, settings: &str, db: &str) -> Result<(), String> {
    let databases = format!(
        "byname = host=localhost port={port} dbname=app\nbyaddr = host=127.0.0.1 port={port} dbname=app\n",
        port = pg.port
    );
    let pw = Pgward::start(&Pgward::ini(
        pg,
        &format!("auth_type = trust\n{settings}"),
        &databases,
    ));
    let out = psql_at(
        pw.port,
        "trustuser",
        None,
        db,
        "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
    );
    match (out.status.success(), stdout_of(&out).as_str()) {
        (true, "t") => Ok(()),
        _ => Err(format!("{}\n{}", stderr_of(&out), pw.log())),
    }
}

#[test]
fn version_1_certificates_from_servers() {
    let pg = Postgres::start();
    let dir = common::shared_tempdir("pgward-tls-v1-server-");
    let ca = OpensslCa::new(dir.path(), "ca1");
    let other = OpensslCa::new(dir.path(), "ca2");
    enable_server_tls(&pg, &ca.issue("server", "localhost", 1));
    let mode = |mode: &str, root: &OpensslCa| {
        format!(
            "server_tls_sslmode = {mode}\nserver_tls_ca_file = {}\n",
            root.cert().display()
        )
    };
    // require checks nothing but the handshake, which a version 1 key signs as well.
    server_session_is_tls(&pg, "server_tls_sslmode = require\n", "byaddr").unwrap();
    // verify-full: the host name in the common name.
    server_session_is_tls(&pg, &mode("verify-full", &ca), "byname").unwrap();
    // verify-ca: the chain only, so an address that is not the common name passes.
    server_session_is_tls(&pg, &mode("verify-ca", &ca), "byaddr").unwrap();
    // Refused: an address that is not the common name under verify-full; another CA.
    let err = server_session_is_tls(&pg, &mode("verify-full", &ca), "byaddr").unwrap_err();
    assert!(err.contains("certificate"), "{err}");
    let err = server_session_is_tls(&pg, &mode("verify-ca", &other), "byname").unwrap_err();
    assert!(err.contains("certificate"), "{err}");
}
