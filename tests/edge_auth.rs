//! Authentication at pgward's edge: auth_query secrets (md5 and SCRAM end to end), the hba
//! file, client caps counted after authentication, and the failed-login throttle.

mod common;

use std::time::Duration;

use common::raw::{self, Raw, PROTOCOL_3_0};
use common::{psql_at, stderr_of, stdout_of, write_userlist, Pgward, Postgres};

fn login(pw: &Pgward, user: &str, password: Option<&str>, db: &str) -> Result<String, String> {
    let out = psql_at(pw.port, user, password, db, "SELECT current_user");
    if out.status.success() {
        Ok(stdout_of(&out))
    } else {
        Err(stderr_of(&out))
    }
}

#[test]
fn auth_query_md5_and_scram_end_to_end() {
    let pg = Postgres::start();
    // No auth file: every secret comes from auth_query, run as the trusted superuser.
    let pw = Pgward::start(&Pgward::ini(
        &pg,
        "auth_type = md5\nauth_user = postgres\nauth_dbname = postgres\npool_mode = transaction\n",
        "",
    ));
    assert_eq!(
        login(&pw, "md5user", Some("md5pass"), "app"),
        Ok("md5user".into())
    );
    assert_eq!(
        login(&pw, "scramuser", Some("scrampass"), "app"),
        Ok("scramuser".into())
    );
    // A SCRAM secret means a SCRAM exchange even under md5; its failure in PgBouncer's words.
    let wrong = login(&pw, "scramuser", Some("nope"), "app").unwrap_err();
    assert!(wrong.contains("SASL authentication failed"), "{wrong}");
    let wrong = login(&pw, "md5user", Some("nope"), "app").unwrap_err();
    assert!(wrong.contains("password authentication failed"), "{wrong}");
    // auth_query finds no one: refused before any exchange, in PgBouncer's words.
    let unknown = login(&pw, "nosuchuser", Some("x"), "app").unwrap_err();
    assert!(unknown.contains("no such user"), "{unknown}");
    assert!(
        pw.log().contains("closing because: no such user (age="),
        "{}",
        pw.log()
    );

    // A changed password counts at the next login: the old one is refused at once, the new
    // one gets in at once (auth_query runs at each login, as in PgBouncer), also right after
    // the old one was used.
    for (user, password) in [("scramuser", "scrampass"), ("md5user", "md5pass")] {
        assert_eq!(login(&pw, user, Some(password), "app"), Ok(user.into()));
    }
    pg.sql_in(
        "postgres",
        "SET password_encryption = 'scram-sha-256'; ALTER ROLE scramuser PASSWORD 'newpass'",
    );
    let old = login(&pw, "scramuser", Some("scrampass"), "app").unwrap_err();
    assert!(old.contains("SASL authentication failed"), "{old}");
    assert_eq!(
        login(&pw, "scramuser", Some("newpass"), "app"),
        Ok("scramuser".into()),
        "{}",
        pw.log()
    );
    pg.sql_in(
        "postgres",
        "SET password_encryption = 'md5'; ALTER ROLE md5user PASSWORD 'changed'",
    );
    let old = login(&pw, "md5user", Some("md5pass"), "app").unwrap_err();
    assert!(old.contains("password authentication failed"), "{old}");
    assert_eq!(
        login(&pw, "md5user", Some("changed"), "app"),
        Ok("md5user".into())
    );
    // Neither passwords nor secrets reach the log.
    let log = pw.log();
    for secret in [
        "md5pass",
        "scrampass",
        "newpass",
        "changed",
        "SCRAM-SHA-256$",
    ] {
        assert!(!log.contains(secret), "{secret} in the log:\n{log}");
    }
}

const HBA: &str = "\
# pgward test rules
host app trustuser 127.0.0.1/32 trust
host app md5user 127.0.0.1/32 md5
host app scramuser 127.0.0.1/32 scram-sha-256
host app passworduser 127.0.0.1/32 reject
local all all trust
";

#[test]
fn hba_rules_pick_the_method() {
    let pg = Postgres::start();
    let dir = common::shared_tempdir("pgward-hba-");
    let hba = dir.path().join("hba.conf");
    std::fs::write(&hba, HBA).unwrap();
    let userlist = write_userlist(
        dir.path(),
        &[
            ("trustuser", ""),
            ("md5user", &pg.role_secret("md5user")),
            ("scramuser", &pg.role_secret("scramuser")),
            ("passworduser", "plainpass"),
        ],
    );
    let settings = format!(
        "auth_type = hba\nauth_hba_file = {}\nauth_file = {}\n",
        hba.display(),
        userlist.display()
    );
    let pw = Pgward::start(&Pgward::ini(&pg, &settings, ""));
    assert_eq!(login(&pw, "trustuser", None, "app"), Ok("trustuser".into()));
    assert_eq!(
        login(&pw, "md5user", Some("md5pass"), "app"),
        Ok("md5user".into())
    );
    assert!(login(&pw, "md5user", Some("bad"), "app")
        .unwrap_err()
        .contains("password authentication failed"));
    assert_eq!(
        login(&pw, "scramuser", Some("scrampass"), "app"),
        Ok("scramuser".into())
    );
    let rejected = login(&pw, "passworduser", Some("plainpass"), "app").unwrap_err();
    assert!(
        rejected.contains("pg_hba.conf rejects connection for host \"127.0.0.1\""),
        "{rejected}"
    );
    let no_entry = login(&pw, "trustuser", None, "postgres").unwrap_err();
    assert!(no_entry.contains("no pg_hba.conf entry"), "{no_entry}");
    assert!(no_entry.contains("no encryption"), "{no_entry}");
    let mut raw = Raw::connect(pw.port);
    let err = raw
        .startup(&[("user", "trustuser"), ("database", "postgres")])
        .unwrap_err();
    assert_eq!(err.code(), "28000");

    // A broken file on reload keeps the running rules and says where it is broken.
    std::fs::write(
        &hba,
        "host app all 127.0.0.1/32 trust\nhots all all all trust\n",
    )
    .unwrap();
    pw.reload();
    assert!(
        common::eventually(Duration::from_secs(5), || pw.log().contains("hba.conf:2:")),
        "{}",
        pw.log()
    );
    assert!(login(&pw, "passworduser", Some("plainpass"), "app").is_err());
}

/// The console answers to either of its names, and an hba line naming either matches a login
/// by both (a file written for PgBouncer names only `pgbouncer`); a refusal names the one the
/// client asked for.
#[test]
fn hba_lines_naming_the_console_match_either_of_its_names() {
    let pg = Postgres::start();
    let dir = common::shared_tempdir("pgward-hba-");
    let hba = dir.path().join("hba.conf");
    let rules = "host pgbouncer all 127.0.0.1/32 reject\nhost all all 127.0.0.1/32 md5\n";
    std::fs::write(&hba, rules).unwrap();
    let secret = common::md5_secret("md5user", "md5pass");
    let userlist = write_userlist(dir.path(), &[("md5user", &secret)]);
    let settings = format!(
        "auth_type = hba\nauth_hba_file = {}\nauth_file = {}\nadmin_users = md5user\n",
        hba.display(),
        userlist.display()
    );
    let pw = Pgward::start(&Pgward::ini(&pg, &settings, ""));
    for db in ["pgward", "pgbouncer"] {
        let refused = psql_at(pw.port, "md5user", Some("md5pass"), db, "SHOW VERSION");
        assert!(!refused.status.success(), "{db}: {}", stdout_of(&refused));
        let err = stderr_of(&refused);
        let named = format!("database \"{db}\"");
        assert!(
            err.contains("pg_hba.conf rejects connection") && err.contains(&named),
            "{err}"
        );
    }
    assert_eq!(
        login(&pw, "md5user", Some("md5pass"), "app"),
        Ok("md5user".into())
    );
}

/// An empty password in the cleartext exchange is refused before any compare, as PostgreSQL
/// does, even where the stored secret is of the empty password.
#[test]
fn an_empty_cleartext_password_is_refused() {
    let pg = Postgres::start();
    let dir = common::shared_tempdir("pgward-empty-");
    let userlist = write_userlist(
        dir.path(),
        &[("md5user", &common::md5_secret("md5user", ""))],
    );
    let settings = format!("auth_type = plain\nauth_file = {}\n", userlist.display());
    let pw = Pgward::start(&Pgward::ini(&pg, &settings, ""));
    let mut raw = Raw::connect(pw.port);
    let params = [("user", "md5user"), ("database", "app")];
    let err = raw.startup_with_password(&params, Some("")).unwrap_err();
    assert_eq!(err.code(), "28P01", "{err:?}");
    assert_eq!(err.message(), "empty password returned by client");
}

/// The salt a SCRAM exchange as `user` shows (the `s=` of its AuthenticationSASLContinue).
fn scram_salt(port: u16, user: &str) -> String {
    let mut client = Raw::connect(port);
    client.send(&raw::startup_packet(
        PROTOCOL_3_0,
        &[("user", user), ("database", "app")],
    ));
    let start = client.recv();
    assert_eq!(
        (start.tag, &start.body[..4]),
        (b'R', &10i32.to_be_bytes()[..])
    );
    let first = b"n,,n=,r=abcdefghijklmnopqrstuvwx";
    let mut body = b"SCRAM-SHA-256\0".to_vec();
    body.extend_from_slice(&(first.len() as i32).to_be_bytes());
    body.extend_from_slice(first);
    client.send(&raw::message(b'p', &body));
    let next = client.recv();
    assert_eq!(
        (next.tag, &next.body[..4]),
        (b'R', &11i32.to_be_bytes()[..])
    );
    let text = String::from_utf8_lossy(&next.body[4..]).into_owned();
    let salt = text.split(',').find_map(|f| f.strip_prefix("s="));
    salt.unwrap_or_else(|| panic!("no salt in {text}"))
        .to_string()
}

/// A role whose password the auth file holds as plain text shows the same salt at every try,
/// as one with a stored SCRAM secret and one that does not exist do: a try tells nothing of
/// how the password is kept.
#[test]
fn a_plain_password_shows_one_salt_in_every_scram_exchange() {
    let pg = Postgres::start();
    let dir = common::shared_tempdir("pgward-salt-");
    let userlist = write_userlist(dir.path(), &[("passworduser", "plainpass")]);
    let settings = format!(
        "auth_type = scram-sha-256\nauth_file = {}\n",
        userlist.display()
    );
    let pw = Pgward::start(&Pgward::ini(&pg, &settings, ""));
    for user in ["passworduser", "nosuchuser"] {
        assert_eq!(
            scram_salt(pw.port, user),
            scram_salt(pw.port, user),
            "{user}"
        );
    }
    assert_eq!(
        login(&pw, "passworduser", Some("plainpass"), "app"),
        Ok("passworduser".into())
    );
}

/// A stored secret's iteration count is the role's to set: checking a password against a
/// costly one keeps no other client waiting.
#[test]
fn a_costly_password_check_holds_up_no_other_client() {
    let pg = Postgres::start();
    let dir = common::shared_tempdir("pgward-costly-");
    let costly = "SCRAM-SHA-256$300000:c2FsdHNhbHQ=$\
         AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";
    let userlist = write_userlist(dir.path(), &[("md5user", costly), ("trustuser", "")]);
    let hba = dir.path().join("hba.conf");
    let rules = "host app md5user 127.0.0.1/32 password\nhost all all 127.0.0.1/32 trust\n";
    std::fs::write(&hba, rules).unwrap();
    let settings = format!(
        "auth_type = hba\nauth_hba_file = {}\nauth_file = {}\n",
        hba.display(),
        userlist.display()
    );
    let pw = Pgward::start(&Pgward::ini(&pg, &settings, ""));
    let port = pw.port;
    let checked = std::thread::spawn(move || {
        let mut raw = Raw::connect(port);
        let params = [("user", "md5user"), ("database", "app")];
        let refused = raw.startup_with_password(&params, Some("wrong"));
        (refused.map(|_| ()), std::time::Instant::now())
    });
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(login(&pw, "trustuser", None, "app"), Ok("trustuser".into()));
    let answered = std::time::Instant::now();
    let (refused, checked_at) = checked.join().unwrap();
    assert_eq!(refused.unwrap_err().code(), "28P01");
    assert!(
        answered < checked_at,
        "the other client waited for the check"
    );
}

/// Under `auth_type = any` the name a client gives is ignored: it counts against
/// max_user_client_connections as the database's forced user, as in PgBouncer, whatever name
/// it gives.
#[test]
fn any_counts_every_client_as_the_forced_user() {
    let pg = Postgres::start();
    let forced = format!("forced = {} user=trustuser\n", pg.db_connstr("app"));
    let settings = "auth_type = any\nmax_user_client_connections = 2\n";
    let pw = Pgward::start(&Pgward::ini(&pg, settings, &forced));
    let mut held = Vec::new();
    for name in ["a", "b"] {
        let mut raw = Raw::connect(pw.port);
        let login = raw.startup(&[("user", name), ("database", "forced")]);
        assert!(login.is_ok(), "{name}: {login:?}");
        held.push(raw);
    }
    let mut third = Raw::connect(pw.port);
    let err = third
        .startup(&[("user", "c"), ("database", "forced")])
        .unwrap_err();
    assert_eq!(err.code(), "53300", "{err:?}");
}

/// auth_query runs as auth_user, on a pool of its own, also for a database whose entry
/// forces another user (who may not read the secrets), as in PgBouncer.
#[test]
fn auth_query_runs_as_auth_user_where_the_database_forces_another() {
    let pg = Postgres::start();
    let forced = format!("forced = {} user=trustuser\n", pg.db_connstr("app"));
    let settings = "auth_type = md5\nauth_user = postgres\n";
    let pw = Pgward::start(&Pgward::ini(&pg, settings, &forced));
    for _reloaded in [false, true] {
        assert_eq!(
            login(&pw, "md5user", Some("md5pass"), "forced"),
            Ok("trustuser".into())
        );
        pw.reload();
    }
    assert!(!pw.log().contains("database removed"), "{}", pw.log());
}

/// Under `auth_type = any` the console is no database that must force a user, by either of
/// its names, also beside a `*` entry that forces none.
#[test]
fn any_lets_the_console_in_by_either_name() {
    let pg = Postgres::start();
    let auto = format!("* = host={} port={}\n", common::HOST, pg.port);
    let settings = "auth_type = any\nadmin_users = admin\n";
    let pw = Pgward::start(&Pgward::ini(&pg, settings, &auto));
    for db in ["pgward", "pgbouncer"] {
        let out = psql_at(pw.port, "admin", None, db, "SHOW VERSION");
        assert!(out.status.success(), "{db}: {}", stderr_of(&out));
    }
}

#[test]
fn a_broken_hba_file_stops_the_start() {
    let dir = common::shared_tempdir("pgward-hba-");
    let hba = dir.path().join("bad_hba.conf");
    std::fs::write(&hba, "local all all trust\nhost all all 10.0.0.0/99 md5\n").unwrap();
    let ini = dir.path().join("pgward.ini");
    std::fs::write(
        &ini,
        format!(
            "[databases]\napp = host=127.0.0.1\n[pgbouncer]\nlisten_port = {}\nauth_type = hba\nauth_hba_file = {}\n",
            common::free_port(),
            hba.display()
        ),
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pgward"))
        .arg(&ini)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("bad_hba.conf:2:"), "{text}");
}

/// Sends a startup message and reads to the first authentication request.
fn stop_at_password_prompt(port: u16, user: &str) -> Raw {
    let mut client = Raw::connect(port);
    client.send(&raw::startup_packet(
        PROTOCOL_3_0,
        &[("user", user), ("database", "app")],
    ));
    let msg = client.read_message().unwrap();
    assert_eq!(msg.tag, b'R');
    assert_ne!(msg.body, [0, 0, 0, 0], "no password asked");
    client
}

#[test]
fn caps_are_counted_after_authentication() {
    let pg = Postgres::start();
    let dir = common::shared_tempdir("pgward-caps-");
    let userlist = write_userlist(
        dir.path(),
        &[("md5user", &common::md5_secret("md5user", "md5pass"))],
    );
    let settings = format!(
        "auth_type = md5\nauth_file = {}\nmax_user_client_connections = 2\nmax_db_client_connections = 3\n",
        userlist.display()
    );
    let pw = Pgward::start(&Pgward::ini(&pg, &settings, ""));
    // Twenty clients idling at the password prompt hold none of md5user's slots.
    let idle: Vec<Raw> = (0..20)
        .map(|_| stop_at_password_prompt(pw.port, "md5user"))
        .collect();
    let connstr = pw.connstr("md5user", Some("md5pass"), "app");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let a = common::driver::must_connect(&connstr).await;
        let b = common::driver::must_connect(&connstr).await;
        let err = common::driver::connect(&connstr)
            .await
            .err()
            .expect("over the cap");
        assert_eq!(common::driver::code(&err), "53300");
        assert_eq!(
            common::driver::message(&err),
            "client connections exceeded (max_user_client_connections)"
        );
        drop(a);
        // The slot is freed when pgward sees the client go.
        let mut c = None;
        for _ in 0..100 {
            if let Ok(conn) = common::driver::connect(&connstr).await {
                c = Some(conn);
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(c.is_some(), "a freed slot was not reused");
        drop((b, c));
    });
    drop(idle);

    // The order on the wire: AuthenticationOk, then FATAL 53300 (as PostgreSQL).
    let trust = Pgward::start(&Pgward::ini(
        &pg,
        "auth_type = trust\nmax_db_client_connections = 1\n",
        "",
    ));
    let mut first = Raw::connect(trust.port);
    first
        .startup(&[("user", "trustuser"), ("database", "app")])
        .unwrap();
    let mut second = Raw::connect(trust.port);
    second.send(&raw::startup_packet(
        PROTOCOL_3_0,
        &[("user", "md5user"), ("database", "app")],
    ));
    let ok = second.read_message().unwrap();
    assert_eq!((ok.tag, ok.body.as_slice()), (b'R', &[0u8, 0, 0, 0][..]));
    let fatal = second.expect_error();
    assert_eq!(fatal.code(), "53300");
    assert_eq!(
        fatal.message(),
        "client connections exceeded (max_db_client_connections)"
    );
    // Another database is not affected.
    let mut other = Raw::connect(trust.port);
    other
        .startup(&[("user", "trustuser"), ("database", "postgres")])
        .unwrap();
}

#[test]
fn failed_logins_block_the_address_for_that_role() {
    let pg = Postgres::start();
    let dir = common::shared_tempdir("pgward-throttle-");
    let userlist = write_userlist(
        dir.path(),
        &[
            ("md5user", &common::md5_secret("md5user", "md5pass")),
            ("scramuser", &pg.role_secret("scramuser")),
        ],
    );
    let settings = format!("auth_type = md5\nauth_file = {}\n", userlist.display());
    let pw = Pgward::start(&Pgward::ini(&pg, &settings, ""));
    for i in 0..10 {
        let err = login(&pw, "md5user", Some("wrong"), "app").unwrap_err();
        assert!(err.contains("password authentication failed"), "{i}: {err}");
    }
    let blocked = login(&pw, "md5user", Some("md5pass"), "app").unwrap_err();
    assert!(
        blocked.contains("too many failed login attempts"),
        "{blocked}"
    );
    let mut raw = Raw::connect(pw.port);
    let err = raw
        .startup(&[("user", "md5user"), ("database", "app")])
        .unwrap_err();
    assert_eq!(err.code(), "28000");
    // Another role from the same address is not blocked.
    assert_eq!(
        login(&pw, "scramuser", Some("scrampass"), "app"),
        Ok("scramuser".into())
    );
}

#[test]
fn guesses_sent_in_parallel_count_against_the_limit() {
    let pg = Postgres::start();
    let dir = common::shared_tempdir("pgward-throttle-parallel-");
    let userlist = write_userlist(
        dir.path(),
        &[("md5user", &common::md5_secret("md5user", "md5pass"))],
    );
    let settings = format!("auth_type = md5\nauth_file = {}\n", userlist.display());
    let pw = Pgward::start(&Pgward::ini(&pg, &settings, ""));
    // One wrong guess, then twenty logins wait at the password prompt at once and all guess.
    let err = login(&pw, "md5user", Some("wrong"), "app").unwrap_err();
    assert!(err.contains("password authentication failed"), "{err}");
    let mut prompted = Vec::new();
    for _ in 0..20 {
        let mut client = Raw::connect(pw.port);
        client.send(&raw::startup_packet(
            PROTOCOL_3_0,
            &[("user", "md5user"), ("database", "app")],
        ));
        let msg = client.read_message().expect("an answer");
        if msg.tag == b'R' {
            prompted.push(client);
        } else {
            assert_eq!(raw::Fields::parse(&msg.body).code(), "28000");
        }
    }
    assert!(
        prompted.len() <= 10,
        "{} logins reached the password prompt",
        prompted.len()
    );
    let mut checked = 0;
    for mut client in prompted {
        client.send(&raw::message(b'p', b"md5wrongwrongwrongwrongwrongwrong\0"));
        let fields = client.expect_error();
        assert_eq!(fields.code(), "28P01");
        checked += 1;
    }
    assert!(checked <= 9, "{checked} more guesses were checked");
    let blocked = login(&pw, "md5user", Some("md5pass"), "app").unwrap_err();
    assert!(
        blocked.contains("too many failed login attempts"),
        "{blocked}"
    );
}

#[test]
fn guessing_names_from_one_address_is_throttled_before_any_lookup() {
    let pg = Postgres::start();
    common::log_statements_of(&pg, "postgres");
    let marker = "'guess-marker' = 'guess-marker'";
    let pw = Pgward::start(&Pgward::ini(
        &pg,
        &format!(
            "auth_type = md5\nauth_user = postgres\nauth_dbname = postgres\n\
             auth_query = SELECT usename, passwd FROM pg_shadow WHERE usename = $1 AND {marker}\n"
        ),
        "",
    ));
    let lookups = || pg.log().matches(marker).count();
    // Fifty names, each failing once: far below the limit per role, but each costs a
    // lookup, so the address as a whole is limited.
    for i in 0..50 {
        let mut client = Raw::connect(pw.port);
        client.send(&raw::startup_packet(
            PROTOCOL_3_0,
            &[("user", &format!("guess{i}")), ("database", "app")],
        ));
        // auth_query finds no such name: refused before any password, as in PgBouncer.
        let err = client.expect_error();
        assert_eq!(err.code(), "28000", "guess {i}");
        assert_eq!(err.message(), "no such user", "guess {i}");
    }
    assert!(
        common::eventually(Duration::from_secs(5), || lookups() >= 50),
        "{} lookups",
        lookups()
    );
    // Now every name from this address is refused at once, a real one too, without a lookup.
    for user in ["guess50", "md5user"] {
        let mut client = Raw::connect(pw.port);
        let err = client
            .startup(&[("user", user), ("database", "app")])
            .unwrap_err();
        assert_eq!(err.code(), "28000", "{user}");
        assert!(
            err.message().contains("from this address"),
            "{}",
            err.message()
        );
    }
    let refused = login(&pw, "md5user", Some("md5pass"), "app").unwrap_err();
    assert!(
        refused.contains("too many failed login attempts"),
        "{refused}"
    );
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(lookups(), 50, "a refused login ran auth_query");
}

#[test]
fn logins_abandoned_at_the_password_prompt_count_as_failures() {
    let pg = Postgres::start();
    let dir = common::shared_tempdir("pgward-throttle-");
    let userlist = write_userlist(
        dir.path(),
        &[("md5user", &common::md5_secret("md5user", "md5pass"))],
    );
    let settings = format!("auth_type = md5\nauth_file = {}\n", userlist.display());
    let pw = Pgward::start(&Pgward::ini(&pg, &settings, ""));
    // Each try may cost a secret lookup; walking away must not make it free.
    for _ in 0..10 {
        let client = stop_at_password_prompt(pw.port, "md5user");
        drop(client);
    }
    let blocked = common::eventually(std::time::Duration::from_secs(3), || {
        login(&pw, "md5user", Some("md5pass"), "app")
            .is_err_and(|e| e.contains("too many failed login attempts"))
    });
    assert!(blocked, "abandoned logins were not counted");
}

#[test]
fn peer_lines_admit_the_socket_owner_through_an_ident_map() {
    let pg = Postgres::start();
    let dir = common::shared_tempdir("pgward-peer-");
    let (hba, ident) = (dir.path().join("hba.conf"), dir.path().join("ident.conf"));
    let os_user = std::env::var("USER")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| {
            stdout_of(
                &std::process::Command::new("id")
                    .arg("-un")
                    .output()
                    .unwrap(),
            )
        });
    std::fs::write(&hba, "local all all peer map=mine\n").unwrap();
    std::fs::write(
        &ident,
        format!("mine {os_user} postgres\nmine {os_user} trustuser\n"),
    )
    .unwrap();
    let settings = format!(
        "auth_type = hba\nauth_hba_file = {}\nauth_ident_file = {}\n",
        hba.display(),
        ident.display()
    );
    let pw = Pgward::start(&Pgward::ini(&pg, &settings, ""));
    let over_socket = |user: &str| {
        std::process::Command::new("psql")
            .args(["-X", "-w", "-At", "-h"])
            .arg(&pw.socket_dir)
            .args([
                "-p",
                &pw.port.to_string(),
                "-U",
                user,
                "-d",
                "app",
                "-c",
                "SELECT current_user",
            ])
            .env("PGPASSFILE", "/dev/null")
            .output()
            .expect("psql")
    };
    for user in ["postgres", "trustuser"] {
        let out = over_socket(user);
        assert_eq!(stdout_of(&out), user, "{}\n{}", stderr_of(&out), pw.log());
    }
    // md5user is known but not mapped to this OS user.
    let out = over_socket("md5user");
    assert!(
        stderr_of(&out).contains("peer authentication failed for user \"md5user\""),
        "{}",
        stderr_of(&out)
    );
    assert!(
        pw.log().contains("ident map mine cannot be matched"),
        "{}",
        pw.log()
    );
}
