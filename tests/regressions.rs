//! Regression tests for faults pgward once had: each test plays the scenario that showed a
//! fault against PostgreSQL (or, where a misbehaving server is needed, a scripted one) and
//! checks what a correct pooler does, with deadlines instead of open-ended waits. The
//! numbered sections follow the list of faults they guard against.

mod common;

use std::thread;
use std::time::{Duration, Instant};

use common::raw::{self, describe, first_error, new_client_value, Raw};
use common::relay::{slow_relay, Slowness};
use common::script::{Script, ScriptedAuth, ScriptedServer};
use common::{eventually, shared_tempdir, write_userlist, Pgward, Postgres, HOST, SECOND};

// ---------------------------------------------------------------------------------------------
// 5. a cancel request cut short by client_login_timeout.

#[test]
fn f05_cancel_cut_short_by_client_login_timeout_still_ends() {
    let pg = Postgres::start();
    let slowness = Slowness {
        cancel_hold: 2 * SECOND,
        pace: None,
    };
    let relay = slow_relay(pg.port, slowness);
    let dbs = format!("slow = host={HOST} port={relay} dbname=app\n");
    let pw = Pgward::trusting(
        &pg,
        "pool_mode = transaction\nclient_login_timeout = 1\n",
        &dbs,
    );
    let mut client = Raw::connect(pw.port);
    let key = client
        .startup(&[("user", "trustuser"), ("database", "slow")])
        .unwrap_or_else(|err| panic!("login: {err:?}"))
        .key
        .unwrap_or_else(|| panic!("no BackendKeyData"));
    client.send(&raw::query_message("SELECT pg_sleep(5)"));
    thread::sleep(Duration::from_millis(300));
    // The cancel connection outlives client_login_timeout: pgward drops it at one second
    // while the relay still holds the server side open.
    let since = Instant::now();
    let mut canceller = Raw::connect(pw.port);
    canceller.send(&raw::cancel_request(key.0, &key.1));
    let answer = client
        .until_ready_within(5 * SECOND)
        .unwrap_or_else(|err| panic!("the cancelled client never got its answer: {err}"));
    let fields = first_error(&answer).unwrap_or_else(|| panic!("{}", describe(&answer)));
    assert_eq!(fields.code(), "57014", "{fields:?}");
    assert!(since.elapsed() < 4 * SECOND, "{:?}", since.elapsed());
    assert!(canceller.closes_within(2 * SECOND));
    assert_eq!(
        client.value_within("SELECT 'after'", 3 * SECOND),
        Ok("after".to_string())
    );
}

// ---------------------------------------------------------------------------------------------
// 10. a reload that changes the server password.

#[test]
fn f10_reload_rotates_the_server_password() {
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
    let ini = common::read_lossy(&pw.ini_path);
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

// ---------------------------------------------------------------------------------------------
// 11. lengths checked before anything is allocated.

#[test]
fn f11_oversized_password_message_is_refused_at_once() {
    let pg = Postgres::start();
    let dir = shared_tempdir("pgward-users-");
    let secret = pg.role_secret("md5user");
    let userlist = write_userlist(dir.path(), &[("md5user", secret.as_str())]);
    let settings = format!("auth_type = md5\nauth_file = {}\n", userlist.display());
    let pw = Pgward::start(&Pgward::ini(&pg, &settings, ""));
    let mut client = Raw::connect(pw.port);
    client.send(&raw::startup_packet(
        raw::PROTOCOL_3_0,
        &[("user", "md5user"), ("database", "app")],
    ));
    let asked = client
        .read_message_within(3 * SECOND)
        .unwrap_or_else(|err| panic!("no authentication request: {err:?}"));
    assert_eq!(asked.tag, b'R');
    // A password message announcing one GiB.
    let mut huge = vec![b'p'];
    huge.extend_from_slice(&(1u32 << 30).to_be_bytes());
    huge.extend_from_slice(b"md5");
    client.send(&huge);
    let since = Instant::now();
    assert!(
        client.closes_within(2 * SECOND),
        "pgward waits for a 1 GiB password"
    );
    assert!(since.elapsed() < 2 * SECOND);
    let ok = pw.psql("md5user", Some("md5pass"), "app", "SELECT 1");
    assert!(ok.status.success(), "{}", common::stderr_of(&ok));
}

/// A message whose length field (2) is shorter than the length field itself.
const SHORT_LENGTH_ANSWER: &[u8] = &[b'D', 0, 0, 0, 2, 0, 0, 0, 0];

#[test]
fn f11_server_message_length_below_four_is_a_protocol_violation() {
    let server = ScriptedServer::start(Script::Answer {
        auth: ScriptedAuth::Trust,
        answer: SHORT_LENGTH_ANSWER,
    });
    let ini = format!(
        "[databases]\nscripted = host={HOST} port={} dbname=app\n\n\
         [pgbouncer]\nauth_type = trust\npool_mode = transaction\n",
        server.port
    );
    let pw = Pgward::start(&ini);
    let mut client = pw.client_as("trustuser", "scripted");
    client.send(&raw::query_message("SELECT 'short length'"));
    let answer = client
        .until_tag_within(b'E', 3 * SECOND)
        .unwrap_or_else(|err| panic!("a message of length 2 from the server: {err}"));
    let fields = first_error(&answer).unwrap_or_default();
    assert_eq!(fields.code(), "08P01", "{fields:?}");
    assert!(client.closes_within(2 * SECOND));
}

// ---------------------------------------------------------------------------------------------
// 12. Sync then Flush, login retries of min_pool_size, cancels before closing, and
// the server's SCRAM signature.

#[test]
fn f12_scram_login_without_the_server_signature_is_refused() {
    const ROWS: &[u8] = &[
        b'C', 0, 0, 0, 13, b'S', b'E', b'L', b'E', b'C', b'T', b' ', b'0', 0, b'Z', 0, 0, 0, 5,
        b'I',
    ];
    let server = ScriptedServer::start(Script::Answer {
        auth: ScriptedAuth::ScramWithoutSignature,
        answer: ROWS,
    });
    let ini = format!(
        "[databases]\nscripted = host={HOST} port={} dbname=app user=scramuser \
         password=scrampass\n\n[pgbouncer]\nauth_type = trust\npool_mode = transaction\n\
         query_wait_timeout = 3\n",
        server.port
    );
    let pw = Pgward::start(&ini);
    match new_client_value(&pw, ("trustuser", "scripted"), "SELECT 1", 5 * SECOND) {
        Ok(value) => panic!("{value:?} from a server that never proved its SCRAM signature"),
        Err(err) => assert!(err.contains("FATAL"), "{err}"),
    }
}
