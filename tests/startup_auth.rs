//! The startup phase (encryption requests, startup parameters, protocol errors) and
//! authentication on both sides of pgward: clients against the auth file (a password message
//! too long to wait for included), pgward against PostgreSQL (and against a server that never
//! proves its SCRAM signature).

mod common;

use std::time::{Duration, Instant};

use common::driver::{self, code, connect, must_connect, must_value};
use common::raw::{self, new_client_value, Raw, PROTOCOL_3_0};
use common::script::{Script, ScriptedAuth, ScriptedServer};
use common::{
    psql_at, shared_tempdir, stderr_of, stdout_of, write_userlist, Pgward, Postgres, HOST, SECOND,
};

/// Each encryption is asked for at most once, as PostgreSQL allows: a second request is a
/// protocol violation, not a loop the client may keep going.
#[test]
fn a_second_encryption_request_is_refused() {
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(&pg, "");
    for second in [raw::ssl_request(), raw::gssenc_request()] {
        let mut client = Raw::connect(pw.port);
        client.send(&raw::ssl_request());
        assert_eq!(client.read_byte(), Ok(b'N'), "SSLRequest answer");
        client.send(&raw::gssenc_request());
        assert_eq!(client.read_byte(), Ok(b'N'), "GSSENCRequest answer");
        client.send(&second);
        let err = client.expect_error_within(5 * SECOND);
        assert_eq!(err.code(), "08P01", "{err:?}");
        assert!(client.closes_within(5 * SECOND));
    }
}

#[test]
fn ssl_and_gssenc_requests_are_refused_then_startup_proceeds() {
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(&pg, "");
    let mut client = Raw::connect(pw.port);
    client.send(&raw::ssl_request());
    assert_eq!(client.read_byte(), Ok(b'N'), "SSLRequest answer");
    client.send(&raw::gssenc_request());
    assert_eq!(client.read_byte(), Ok(b'N'), "GSSENCRequest answer");
    let login = client
        .startup(&[
            ("user", "trustuser"),
            ("database", "app"),
            ("options", "-c TimeZone=Asia/Tokyo -c DateStyle=German"),
            ("application_name", "rawclient"),
        ])
        .unwrap_or_else(|err| panic!("login refused: {err:?}"));
    assert_eq!(login.param("TimeZone"), Some("Asia/Tokyo"));
    assert_eq!(login.param("application_name"), Some("rawclient"));
    assert!(login.param("server_version").is_some(), "{login:?}");
    assert!(login.key.is_some(), "no BackendKeyData");
    assert_eq!(client.value("SHOW TimeZone"), "Asia/Tokyo");
    assert!(client.value("SHOW DateStyle").starts_with("German"));
    assert_eq!(client.value("SELECT current_user"), "trustuser");
    client.terminate();

    // libpq: sslmode=prefer falls back to plain text, require gives up.
    let prefer = psql_at(
        pw.port,
        "trustuser",
        None,
        "dbname=app sslmode=prefer",
        "SELECT 1",
    );
    assert!(prefer.status.success(), "{}", stderr_of(&prefer));
    let require = psql_at(
        pw.port,
        "trustuser",
        None,
        "dbname=app sslmode=require",
        "SELECT 1",
    );
    assert!(!require.status.success());
    assert!(
        stderr_of(&require).contains("does not support SSL"),
        "{}",
        stderr_of(&require)
    );
    // libpq's gssencmode=prefer sends GSSENCRequest only when built with GSSAPI; either way
    // the login must work.
    let gss = psql_at(
        pw.port,
        "trustuser",
        None,
        "dbname=app gssencmode=prefer",
        "SELECT 2",
    );
    assert!(gss.status.success(), "{}", stderr_of(&gss));
}

#[test]
fn options_from_libpq_reach_the_server() {
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(&pg, "");
    let out = psql_at(
        pw.port,
        "trustuser",
        None,
        "dbname=app options='-c TimeZone=America/Denver -c IntervalStyle=iso_8601'",
        "SHOW TimeZone; SHOW IntervalStyle",
    );
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert_eq!(stdout_of(&out), "America/Denver\niso_8601");
}

#[test]
fn application_name_add_host_names_where_the_client_connects_from() {
    let pg = Postgres::start();
    // A rule for one application reaches it still: the policy reads the name the client gave.
    let dir = shared_tempdir("pgward-policy-");
    let policy = dir.path().join("policy.toml");
    let rule = "[[rules]]\nrule = \"deny_ddl\"\nwhen = { application_names = [\"myapp\"] }\n\
                [[rules]]\nrule = \"read_only\"\nwhen = { application_names = [\"app\"] }\n";
    std::fs::write(&policy, rule).expect("the policy");
    let settings = format!(
        "application_name_add_host = 1\npolicy_file = {}\n",
        policy.display()
    );
    let pw = Pgward::transaction_pool(&pg, &settings);
    let ddl = psql_at(
        pw.port,
        "trustuser",
        None,
        "dbname=app application_name=myapp",
        "CREATE TABLE by_myapp (a int)",
    );
    assert!(!ddl.status.success(), "the rule let it through");
    assert!(stderr_of(&ddl).contains("deny_ddl"), "{}", stderr_of(&ddl));
    let out = psql_at(
        pw.port,
        "trustuser",
        None,
        "dbname=app application_name=myapp",
        "SHOW application_name; \
         SELECT application_name FROM pg_stat_activity WHERE pid = pg_backend_pid()",
    );
    assert!(out.status.success(), "{}", stderr_of(&out));
    let stdout = stdout_of(&out);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    assert!(lines[0].starts_with("myapp - 127.0.0.1:"), "{stdout}");
    assert_eq!(lines[0], lines[1], "the server has the same name");
    // Without one of its own, over the Unix socket.
    let socket = pw.socket_dir.join(format!(".s.PGSQL.{}", pw.port));
    let mut client = Raw::connect_unix(&socket).logged_in("trustuser", None, "app");
    let name = client.value("SHOW application_name");
    // It gave no name: a rule for the name pgward filled in does not reach it.
    client
        .query("CREATE TABLE by_nameless (a int)")
        .expect("no rule for a client without a name");
    let expected = format!("app - unix({}@", std::process::id());
    assert!(name.starts_with(&expected), "{name}");
    assert!(name.ends_with(&format!("):{}", pw.port)), "{name}");
}

/// Sends `bytes` as the opening of a connection and returns the FATAL pgward answers with.
fn refusal(port: u16, bytes: &[u8]) -> raw::Fields {
    let mut client = Raw::connect(port);
    client.send(bytes);
    let fields = client.expect_error();
    assert!(
        client.closes_within(Duration::from_secs(5)),
        "connection left open after {fields:?}"
    );
    fields
}

fn assert_protocol_violation(what: &str, fields: &raw::Fields) {
    assert_eq!(fields.code(), "08P01", "{what}: {fields:?}");
    assert_eq!(fields.severity(), "FATAL", "{what}: {fields:?}");
    assert!(!fields.message().is_empty(), "{what}: empty message");
}

#[test]
fn bad_protocol_versions_and_malformed_packets_get_08p01() {
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(&pg, "");
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("length below 8", vec![0, 0, 0, 4, 0, 0, 0, 0]),
        (
            "no terminator",
            raw::untagged(&[&PROTOCOL_3_0.to_be_bytes()[..], b"user\0trustuser"].concat()),
        ),
        (
            "SSLRequest with trailing bytes",
            raw::untagged(&[&80_877_103u32.to_be_bytes()[..], &[1, 2, 3, 4]].concat()),
        ),
        (
            "oversized length",
            [0x7f, 0xff, 0xff, 0xff, 0, 3, 0, 0].to_vec(),
        ),
    ];
    for (what, bytes) in cases {
        assert_protocol_violation(what, &refusal(pw.port, &bytes));
    }
    // A startup parameter pgward cannot carry across servers.
    let unsupported = refusal(
        pw.port,
        &raw::startup_packet(PROTOCOL_3_0, &[("user", "trustuser"), ("work_mem", "1MB")]),
    );
    assert_protocol_violation("unsupported parameter", &unsupported);
    let in_options = refusal(
        pw.port,
        &raw::startup_packet(
            PROTOCOL_3_0,
            &[("user", "trustuser"), ("options", "-c work_mem=1MB")],
        ),
    );
    assert_protocol_violation("unsupported -c in options", &in_options);
    // pgward still serves after all that.
    let ok = pw.psql("trustuser", None, "app", "SELECT 1");
    assert!(ok.status.success(), "{}", stderr_of(&ok));
}

#[test]
fn ignored_startup_parameters_and_protocol_negotiation() {
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(&pg, "ignore_startup_parameters = extra_float_digits");
    let mut client = Raw::connect(pw.port);
    client.send(&raw::startup_packet(
        PROTOCOL_3_0 | 2,
        &[
            ("user", "trustuser"),
            ("database", "app"),
            ("extra_float_digits", "3"),
            ("_pq_.some_extension", "on"),
        ],
    ));
    let login = client
        .finish_login()
        .unwrap_or_else(|err| panic!("login refused: {err:?}"));
    assert!(login.negotiated, "no NegotiateProtocolVersion for 3.2");
    assert_eq!(client.value("SELECT 40 + 2"), "42");
}

/// SHOW extra_float_digits for a client that logs in to `port` with `value` in its startup
/// packet, as pgJDBC does; the client then leaves.
fn float_digits_seen(port: u16, value: &str) -> String {
    let mut client = login_with_digits(port, value);
    let seen = client.value("SHOW extra_float_digits");
    client.terminate();
    seen
}

/// A client logged in with `extra_float_digits = value` in its startup packet, as pgJDBC
/// does.
fn login_with_digits(port: u16, value: &str) -> Raw {
    let mut client = Raw::connect(port);
    client.send(&raw::startup_packet(
        PROTOCOL_3_0,
        &[
            ("user", "trustuser"),
            ("database", "app"),
            ("extra_float_digits", value),
        ],
    ));
    client
        .finish_login()
        .unwrap_or_else(|err| panic!("login refused: {err:?}"));
    client
}

/// Sends `bytes` (ending with a Sync or a FunctionCall) and reads to ReadyForQuery, which no
/// error may come before.
fn ran_cleanly(client: &mut Raw, bytes: &[u8]) {
    let answer = client.exchange(bytes, 1);
    assert!(
        raw::first_error(&answer).is_none(),
        "{}",
        raw::describe(&answer)
    );
}

/// Prepares `S1`, set_config of extra_float_digits to its parameter, then runs it with
/// `value` in a batch of its own.
fn set_digits_by_statement(client: &mut Raw, value: &str) {
    let set = "SELECT set_config('extra_float_digits', $1, false)";
    ran_cleanly(
        client,
        &raw::Batch::new().parse("S1", set, &[25]).sync().bytes,
    );
    let run = raw::Batch::new()
        .bind("", "S1", &[Some(value)])
        .execute("", 0)
        .sync();
    ran_cleanly(client, &run.bytes);
}

/// pgJDBC logs in with extra_float_digits = 2, then runs SET extra_float_digits = 3.
/// PostgreSQL never reports the setting, yet what the client set follows it to the next
/// server it is given (here the one server, after another client set its own value there);
/// a SET that is rolled back or LOCAL does not.
#[test]
fn extra_float_digits_set_by_the_client_follows_it() {
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(&pg, "default_pool_size = 1\n");
    let mut jdbc = login_with_digits(pw.port, "2");
    let mut other = login_with_digits(pw.port, "0");
    let show = "SHOW extra_float_digits";
    let steps: [(&str, &str); 5] = [
        ("SET extra_float_digits = 3", "3"),
        ("BEGIN; SET extra_float_digits = 1; ROLLBACK", "3"),
        ("BEGIN; SET LOCAL extra_float_digits = 1; COMMIT", "3"),
        ("SELECT set_config('extra_float_digits', '-1', false)", "-1"),
        ("RESET extra_float_digits", "1"),
    ];
    for (sql, expected) in steps {
        jdbc.query(sql)
            .unwrap_or_else(|e| panic!("{sql}: {}", e.message()));
        assert_eq!(other.value(show), "0", "after {sql}");
        assert_eq!(jdbc.value(show), expected, "after {sql}");
    }
    // The same through the extended protocol.
    let mut batch = raw::extended_query("SET extra_float_digits = 2");
    batch.extend(raw::sync_message());
    ran_cleanly(&mut jdbc, &batch);
    assert_eq!(other.value(show), "0");
    assert_eq!(jdbc.value(show), "2");
}

/// A client that sets extra_float_digits and says Terminate in the same write leaves its
/// server with a value pgward did not read: the next client gets its own value set there.
#[test]
fn extra_float_digits_left_by_a_client_that_terminates_is_not_taken_for_known() {
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(&pg, "default_pool_size = 1\n");
    let mut leaving = login_with_digits(pw.port, "3");
    let batch = raw::Batch::new()
        .query("SET extra_float_digits = 0")
        .terminate();
    leaving.send(&batch.bytes);
    assert!(leaving.closes_within(Duration::from_secs(10)));
    assert_eq!(float_digits_seen(pw.port, "3"), "3");
}

/// A prepared statement whose text names extra_float_digits changes it at each run, long
/// after its Parse: each run is followed, for the client and for the next one on its server.
#[test]
fn extra_float_digits_set_by_a_prepared_statement_follows_each_run() {
    let pg = Postgres::start();
    let (pw, mut jdbc) = one_server_and_a_client(&pg, "");
    set_digits_by_statement(&mut jdbc, "0");
    assert_eq!(float_digits_seen(pw.port, "3"), "3");
    assert_eq!(jdbc.value("SHOW extra_float_digits"), "0");
}

/// A DISCARD ALL answered after a later SET went out (both in one write) does not make the
/// server's extra_float_digits known again: a client on its default gets it set back.
#[test]
fn extra_float_digits_set_after_a_discard_in_the_same_write_stays_unknown() {
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(&pg, "default_pool_size = 1\n");
    let mut leaving = login_with_digits(pw.port, "3");
    let batch = raw::Batch::new()
        .query("DISCARD ALL")
        .query("SET extra_float_digits = 0")
        .terminate();
    leaving.send(&batch.bytes);
    assert!(leaving.closes_within(Duration::from_secs(10)));
    let mut plain = Raw::login(pw.port, "trustuser", None, "app");
    assert_eq!(plain.value("SHOW extra_float_digits"), "1");
}

/// pgward on one server with `settings`, and a client on it logged in with
/// extra_float_digits = 3.
fn one_server_and_a_client(pg: &Postgres, settings: &str) -> (Pgward, Raw) {
    let pw = Pgward::transaction_pool(pg, &format!("default_pool_size = 1\n{settings}"));
    let client = login_with_digits(pw.port, "3");
    (pw, client)
}

/// A client's own RESET ALL puts extra_float_digits back at the server's default without a
/// text that names it: the next client gets its own value, and the client the default.
#[test]
fn extra_float_digits_after_a_clients_reset_all_is_not_taken_for_known() {
    let pg = Postgres::start();
    let (pw, mut a) = one_server_and_a_client(&pg, "");
    a.query("RESET ALL")
        .unwrap_or_else(|e| panic!("{}", e.message()));
    assert_eq!(float_digits_seen(pw.port, "3"), "3");
    assert_eq!(a.value("SHOW extra_float_digits"), "1");
}

/// set_config through a FunctionCall (OID 2078) is followed like a text naming the setting.
#[test]
fn extra_float_digits_set_by_a_function_call_is_followed() {
    let pg = Postgres::start();
    let (pw, mut a) = one_server_and_a_client(&pg, "");
    let call = raw::function_call_message(2078, &["extra_float_digits", "0", "false"]);
    ran_cleanly(&mut a, &call);
    assert_eq!(float_digits_seen(pw.port, "3"), "3");
    assert_eq!(a.value("SHOW extra_float_digits"), "0");
}

/// A run of a named statement pgward does not map (max_prepared_statements = 0) may change
/// the setting long after its Parse: the server's value is then unknown, and the next client
/// gets its own.
#[test]
fn extra_float_digits_after_an_unmapped_statement_runs_is_not_taken_for_known() {
    let pg = Postgres::start();
    let (pw, mut a) = one_server_and_a_client(&pg, "max_prepared_statements = 0\n");
    set_digits_by_statement(&mut a, "2");
    assert_eq!(float_digits_seen(pw.port, "3"), "3");
}

/// In session pooling the server's reset (DISCARD ALL) puts extra_float_digits back at its
/// default, though PostgreSQL does not say so: the next client's value is set again.
#[test]
fn extra_float_digits_is_set_again_after_a_reset() {
    let pg = Postgres::start();
    let settings = "auth_type = trust\npool_mode = session\ndefault_pool_size = 1\n";
    let pw = Pgward::start(&Pgward::ini(&pg, settings, ""));
    assert_eq!(float_digits_seen(pw.port, "0"), "0");
    assert_eq!(float_digits_seen(pw.port, "0"), "0");
    assert_eq!(float_digits_seen(pw.port, "3"), "3");
}

/// A reset query that is not RESET ALL (here RESET ROLE, whose answer has the same tag) leaves
/// extra_float_digits as the last client set it: the next client on its default gets it set
/// back, as after a connect_query that names it.
#[test]
fn extra_float_digits_after_another_reset_query_is_not_taken_for_the_default() {
    let pg = Postgres::start();
    let settings = "auth_type = trust\npool_mode = session\ndefault_pool_size = 1\n\
                    server_reset_query = RESET ROLE\n";
    let pw = Pgward::start(&Pgward::ini(&pg, settings, ""));
    assert_eq!(float_digits_seen(pw.port, "3"), "3");
    let mut plain = Raw::login(pw.port, "trustuser", None, "app");
    assert_eq!(plain.value("SHOW extra_float_digits"), "1");
}

/// Once the console's SET ignore_startup_parameters names extra_float_digits, a client's
/// value is ignored, and a server another client left at its own value is set back.
#[test]
fn extra_float_digits_ignored_at_runtime_is_the_default() {
    let pg = Postgres::start();
    let settings = "default_pool_size = 1\nadmin_users = admin\n";
    let pw = Pgward::transaction_pool(&pg, settings);
    assert_eq!(float_digits_seen(pw.port, "3"), "3");
    let set = psql_at(
        pw.port,
        "admin",
        None,
        "pgward",
        "SET ignore_startup_parameters = extra_float_digits",
    );
    assert!(set.status.success(), "{}", stderr_of(&set));
    assert_eq!(float_digits_seen(pw.port, "2"), "1");
}

#[test]
fn unknown_database_is_refused_with_3d000() {
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(&pg, "");
    let fields = refusal(
        pw.port,
        &raw::startup_packet(PROTOCOL_3_0, &[("user", "trustuser"), ("database", "nope")]),
    );
    assert_eq!(fields.code(), "3D000", "{fields:?}");
    assert_eq!(fields.message(), "no such database: nope");
}

/// An empty password in the auth file (the usual entry for a user who logs in by trust or
/// certificate under hba) proves nothing: a password login as that user is refused, whatever
/// the client sends, as in PgBouncer.
#[test]
fn an_empty_password_in_the_auth_file_admits_no_password_login() {
    let pg = Postgres::start();
    let dir = shared_tempdir("pgward-users-");
    let userlist = write_userlist(dir.path(), &[("trustuser", "")]);
    for method in ["plain", "md5"] {
        let settings = format!("auth_type = {method}\nauth_file = {}\n", userlist.display());
        let pw = Pgward::start(&Pgward::ini(&pg, &settings, ""));
        let mut client = Raw::connect(pw.port);
        let refused = client
            .startup_with_password(&[("user", "trustuser"), ("database", "app")], Some(""))
            .expect_err("an empty password let the client in");
        assert_eq!(refused.code(), "28P01", "{method}: {refused:?}");
    }
}

/// `auth_type = any` ignores the name the client gives: a database without a forced user is
/// refused with PgBouncer's "bouncer config error" (any name, a superuser's too, would log
/// in), one with a forced user logs in as that user.
#[test]
fn auth_type_any_needs_a_forced_user() {
    let pg = Postgres::start();
    let forced = format!("forced = {} user=trustuser\n", pg.db_connstr("app"));
    let pw = Pgward::start(&Pgward::ini(&pg, "auth_type = any\n", &forced));
    let mut client = Raw::connect(pw.port);
    let refused = client
        .startup(&[("user", "postgres"), ("database", "app")])
        .expect_err("a name of the client's choosing logged in");
    assert_eq!(
        (refused.code(), refused.message()),
        ("F0000", "bouncer config error")
    );
    let mut client = Raw::connect(pw.port);
    client
        .startup(&[("user", "postgres"), ("database", "forced")])
        .unwrap_or_else(|e| panic!("the forced user's database: {e:?}"));
    assert_eq!(client.value("SELECT current_user"), "trustuser");
}

/// A startup packet with no user name, and one asking for protocol 2.0, are refused with the
/// SQLSTATEs PostgreSQL uses (28000, 0A000).
#[test]
fn startup_refusals_carry_postgresqls_sqlstates() {
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(&pg, "");
    let fields = refusal(
        pw.port,
        &raw::startup_packet(PROTOCOL_3_0, &[("database", "app")]),
    );
    assert_eq!(fields.code(), "28000", "{fields:?}");
    assert_eq!(
        fields.message(),
        "no PostgreSQL user name specified in startup packet"
    );
    for version in [2 << 16, 4 << 16] {
        let fields = refusal(
            pw.port,
            &raw::startup_packet(version, &[("user", "trustuser"), ("database", "app")]),
        );
        assert_eq!(fields.code(), "0A000", "{fields:?}");
    }
}

/// A startup packet with `placeholder`'s last byte in `params` replaced by `byte`.
fn startup_with_byte(params: &[(&str, &str)], placeholder: u8, byte: u8) -> Vec<u8> {
    let mut packet = raw::startup_packet(PROTOCOL_3_0, params);
    let at = packet
        .iter()
        .rposition(|&c| c == placeholder)
        .expect("placeholder");
    packet[at] = byte;
    packet
}

/// A Latin-1 application_name (not UTF-8) logs in and reads as PostgreSQL cleans it; a user
/// name that is not UTF-8 is refused with 22021, the SQLSTATE of an invalid byte sequence.
#[test]
fn startup_parameters_that_are_not_utf8() {
    let pg = Postgres::start();
    let pw = Pgward::transaction_pool(&pg, "");
    let latin1 = [
        ("user", "trustuser"),
        ("database", "app"),
        ("application_name", "M#ller"),
    ];
    let mut client = Raw::connect(pw.port);
    client.send(&startup_with_byte(&latin1, b'#', 0xfc));
    client
        .finish_login()
        .unwrap_or_else(|e| panic!("a Latin-1 application_name: {e:?}"));
    assert_eq!(client.value("SHOW application_name"), "M?ller");
    let fields = refusal(
        pw.port,
        &startup_with_byte(&[("user", "j#rg"), ("database", "app")], b'#', 0xf6),
    );
    assert_eq!(fields.code(), "22021", "{fields:?}");
    assert!(fields.message().contains("\"user\""), "{fields:?}");
}

#[test]
fn oversized_password_message_is_refused_at_once() {
    let pg = Postgres::start();
    let dir = shared_tempdir("pgward-users-");
    let secret = pg.role_secret("md5user");
    let userlist = write_userlist(dir.path(), &[("md5user", secret.as_str())]);
    let settings = format!("auth_type = md5\nauth_file = {}\n", userlist.display());
    let pw = Pgward::start(&Pgward::ini(&pg, &settings, ""));
    let mut client = Raw::connect(pw.port);
    client.send(&raw::startup_packet(
        PROTOCOL_3_0,
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
    assert!(ok.status.success(), "{}", stderr_of(&ok));
}

/// One login through pgward: the user, the password the client gives, and the outcome
/// (`Ok(current_user)` or `Err(sqlstate)`).
struct Case {
    user: &'static str,
    password: &'static str,
    db: &'static str,
    expect: Result<&'static str, &'static str>,
}

const fn ok(user: &'static str, password: &'static str, as_user: &'static str) -> Case {
    Case {
        user,
        password,
        db: "app",
        expect: Ok(as_user),
    }
}

const fn refused(user: &'static str, password: &'static str, sqlstate: &'static str) -> Case {
    Case {
        user,
        password,
        db: "app",
        expect: Err(sqlstate),
    }
}

async fn check_cases(pw: &Pgward, auth_type: &str, cases: &[Case]) {
    let mut failures = Vec::new();
    for case in cases {
        let password = (!case.password.is_empty()).then_some(case.password);
        let connstr = pw.connstr(case.user, password, case.db);
        let got = match connect(&connstr).await {
            Ok(conn) => match driver::value(&conn.client, "SELECT current_user").await {
                Ok(user) => Ok(user),
                Err(err) => Err(code(&err)),
            },
            Err(err) => Err(code(&err)),
        };
        let expected = case.expect.map(str::to_string).map_err(str::to_string);
        if got != expected {
            failures.push(format!(
                "auth_type={auth_type} {}@{} password {:?}: expected {expected:?}, got {got:?}",
                case.user, case.db, case.password
            ));
        }
    }
    assert!(failures.is_empty(), "{}\n{}", failures.join("\n"), pw.log());
}

/// pgward with `auth_type` and an auth file of `entries`; the directory holding the auth file
/// lives as long as the returned value.
fn auth_pgward(
    pg: &Postgres,
    auth_type: &str,
    entries: &[(&str, &str)],
    dbs: &str,
) -> (Pgward, tempfile::TempDir) {
    let dir = common::shared_tempdir("pgward-auth-");
    let userlist = write_userlist(dir.path(), entries);
    let settings = format!(
        "auth_type = {auth_type}\nauth_file = {}\npool_mode = transaction\n",
        userlist.display()
    );
    (Pgward::start(&Pgward::ini(pg, &settings, dbs)), dir)
}

/// Auth file entries: md5user and scramuser with the secrets PostgreSQL stores for them,
/// passworduser with its plain password.
fn stored_secrets(pg: &Postgres) -> Vec<(String, String)> {
    vec![
        ("md5user".into(), pg.role_secret("md5user")),
        ("scramuser".into(), pg.role_secret("scramuser")),
        ("passworduser".into(), "plainpass".into()),
    ]
}

fn as_entries(owned: &[(String, String)]) -> Vec<(&str, &str)> {
    owned
        .iter()
        .map(|(user, secret)| (user.as_str(), secret.as_str()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn md5_auth_against_plain_md5_and_scram_secrets() {
    let pg = Postgres::start();
    let mut owned = stored_secrets(&pg);
    owned.push(("trustuser".into(), "trustpw".into()));
    let entries = as_entries(&owned);
    let (pw, _dir) = auth_pgward(&pg, "md5", &entries, "");
    check_cases(
        &pw,
        "md5",
        &[
            // md5 challenge against an MD5 secret; server login md5 with that secret.
            ok("md5user", "md5pass", "md5user"),
            // SCRAM secret: the client is asked for SCRAM; the server login reuses its keys.
            ok("scramuser", "scrampass", "scramuser"),
            // plain secret: md5 challenge; the server asks for a cleartext password.
            ok("passworduser", "plainpass", "passworduser"),
            // the server trusts this role; the client still proves its password to pgward.
            ok("trustuser", "trustpw", "trustuser"),
            refused("md5user", "wrong", "28P01"),
            refused("scramuser", "wrong", "28P01"),
            refused("passworduser", "wrong", "28P01"),
            refused("trustuser", "wrong", "28P01"),
            refused("nobody", "whatever", "28P01"),
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scram_auth_against_plain_scram_and_md5_secrets() {
    let pg = Postgres::start();
    let owned = stored_secrets(&pg);
    let entries = as_entries(&owned);
    let (pw, _dir) = auth_pgward(&pg, "scram-sha-256", &entries, "");
    check_cases(
        &pw,
        "scram-sha-256",
        &[
            ok("scramuser", "scrampass", "scramuser"),
            ok("passworduser", "plainpass", "passworduser"),
            // An MD5 secret cannot verify a SCRAM exchange.
            refused("md5user", "md5pass", "28P01"),
            refused("scramuser", "wrong", "28P01"),
            refused("passworduser", "wrong", "28P01"),
            refused("nobody", "x", "28P01"),
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn plain_auth_and_passwords_from_connection_strings() {
    let pg = Postgres::start();
    let owned = stored_secrets(&pg);
    let entries = as_entries(&owned);
    // Databases whose connection string forces a server user and gives its password.
    let dbs = format!(
        "as_scram = {} user=scramuser password=scrampass\n\
         as_md5 = {} user=md5user password=md5pass\n\
         as_password = {} user=passworduser password=plainpass\n",
        pg.db_connstr("app"),
        pg.db_connstr("app"),
        pg.db_connstr("app")
    );
    let (pw, _dir) = auth_pgward(&pg, "plain", &entries, &dbs);
    let on = |db: &'static str, user: &'static str, password: &'static str, as_user| Case {
        user,
        password,
        db,
        expect: Ok(as_user),
    };
    check_cases(
        &pw,
        "plain",
        &[
            ok("md5user", "md5pass", "md5user"),
            ok("passworduser", "plainpass", "passworduser"),
            refused("md5user", "wrong", "28P01"),
            // Cleartext against a stored SCRAM secret; the server password comes from the
            // connection string.
            on("as_scram", "scramuser", "scrampass", "scramuser"),
            on("as_md5", "md5user", "md5pass", "md5user"),
            on("as_password", "passworduser", "plainpass", "passworduser"),
            Case {
                user: "scramuser",
                password: "wrong",
                db: "as_scram",
                expect: Err("28P01"),
            },
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn trust_auth_logs_in_to_every_server_method() {
    let pg = Postgres::start();
    let md5 = pg.role_secret("md5user");
    let entries = [("md5user", md5.as_str()), ("passworduser", "plainpass")];
    let dbs = format!(
        "as_scram = {} user=scramuser password=scrampass\n",
        pg.db_connstr("app")
    );
    let entries = [("trustuser", ""), entries[0], entries[1]];
    let (pw, _dir) = auth_pgward(&pg, "trust", &entries, &dbs);
    check_cases(
        &pw,
        "trust",
        &[
            ok("trustuser", "", "trustuser"),
            ok("md5user", "anything", "md5user"),
            ok("passworduser", "", "passworduser"),
            Case {
                user: "trustuser",
                password: "",
                db: "as_scram",
                expect: Ok("scramuser"),
            },
        ],
    )
    .await;
}

/// `trust` admits only users pgward knows (the auth file, else auth_query), as PgBouncer
/// does: an unknown name is refused before any server is asked, also where the database
/// forces its server user, which would otherwise lend that user's session to any name.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn trust_refuses_users_pgward_does_not_know() {
    let pg = Postgres::start();
    let dbs = format!(
        "forced = {} user=scramuser password=scrampass\n",
        pg.db_connstr("app")
    );
    let (pw, _dir) = auth_pgward(&pg, "trust", &[("trustuser", "")], &dbs);
    for db in ["app", "forced"] {
        let err = connect(&pw.connstr("nosuchuser", None, db))
            .await
            .err()
            .unwrap_or_else(|| panic!("an unknown user got a session on {db}"));
        assert_eq!(code(&err), "28000", "{err:?}");
        let text = driver::message(&err);
        assert_eq!(text, "\"trust\" authentication failed", "{err:?}");
        // A role PostgreSQL trusts but the auth file does not list is refused too.
        let err = connect(&pw.connstr("md5user", None, db)).await.err();
        assert!(err.is_some(), "md5user got a session on {db}");
    }
    let log = pw.log();
    assert!(
        log.contains("closing because: \"trust\" authentication failed"),
        "{log}"
    );
    // With auth_query, users missing from the file are found there; a name it does not
    // find is refused as PgBouncer refuses it, also by a lookup that answers a row of NULLs
    // for an unknown name (as a function returning a record does).
    let settings = "auth_type = trust\nauth_user = postgres\nauth_dbname = postgres\n\
                    pool_mode = transaction\n";
    let null_row = "auth_query = SELECT s.usename, s.passwd FROM (SELECT 1) x \
                    LEFT JOIN pg_shadow s ON s.usename = $1\n";
    for settings in [settings.to_string(), format!("{settings}{null_row}")] {
        let pw = Pgward::start(&Pgward::ini(&pg, &settings, &dbs));
        let conn = must_connect(&pw.connstr("md5user", None, "forced")).await;
        assert_eq!(
            must_value(&conn.client, "SELECT current_user").await,
            "scramuser"
        );
        let err = connect(&pw.connstr("nosuchuser", None, "forced"))
            .await
            .err()
            .unwrap_or_else(|| panic!("an unknown user got a session with {settings}"));
        assert_eq!(code(&err), "28000", "{err:?}");
        assert_eq!(driver::message(&err), "no such user", "{err:?}");
    }
}

/// The client logs in with SCRAM against the stored SCRAM secret and pgward logs in to the
/// server with the keys the client proved; no plain password exists anywhere. More servers
/// than the first one must open with those keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scram_keys_of_the_client_open_several_servers() {
    let pg = Postgres::start();
    let scram = pg.role_secret("scramuser");
    let dir = common::shared_tempdir("pgward-auth-");
    let userlist = write_userlist(dir.path(), &[("scramuser", &scram)]);
    let settings = format!(
        "auth_type = scram-sha-256\nauth_file = {}\npool_mode = session\ndefault_pool_size = 3\n",
        userlist.display()
    );
    let pw = Pgward::start(&Pgward::ini(&pg, &settings, ""));
    let connstr = pw.connstr("scramuser", Some("scrampass"), "app");
    let mut conns = Vec::new();
    let mut pids = Vec::new();
    for _ in 0..3 {
        let conn = driver::must_connect(&connstr).await;
        pids.push(must_value(&conn.client, "SELECT pg_backend_pid()").await);
        conns.push(conn);
    }
    pids.sort();
    pids.dedup();
    assert_eq!(
        pids.len(),
        3,
        "session mode gives each client its own server"
    );
    assert_eq!(common::server_count(&pg, "scramuser", "app"), 3);
    let log = pg.log();
    assert!(
        !log.contains("authentication failed"),
        "a server login failed:\n{log}"
    );
}

#[test]
fn scram_login_without_the_server_signature_is_refused() {
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
