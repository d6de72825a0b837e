//! Tests of whole configuration files.

use std::path::Path;
use std::time::Duration;

use super::*;

fn parse(text: &str) -> Result<Config, ConfigError> {
    parse_str(text, "pgbouncer.ini", Path::new("."))
}

fn at(err: ConfigError) -> (String, usize, String) {
    match err {
        ConfigError::At { file, line, msg } => (file, line, msg),
        other => panic!("expected a located error, got {other}"),
    }
}

/// A configuration in the shape commonly deployed in production.
const PRODUCTION: &str = r#";; PgBouncer configuration file
;; managed by configuration management - local changes will be lost

[databases]
; primary, transaction pooled
app = host=pg-primary.internal port=5432 dbname=app_production pool_size=40 reserve_pool=10
app_ro = host=pg-replica-1.internal,pg-replica-2.internal port=5432 dbname=app_production pool_mode=transaction
reporting = host=10.20.0.15 port=6543 dbname=reporting user=report_ro password='s3cr3t''pw' pool_size=5 connect_query='SET statement_timeout = ''30s'''
legacy = host=/var/run/postgresql dbname=legacy pool_mode=session application_name=legacy_app
* = host=pg-primary.internal port=5432

[users]
batch_worker = pool_mode=session max_user_connections=20
etl = pool_size=4

[pgbouncer]
logfile = /var/log/pgbouncer/pgbouncer.log
pidfile = /var/run/pgbouncer/pgbouncer.pid

listen_addr = *
listen_port = 6432
unix_socket_dir = /var/run/postgresql

auth_type = scram-sha-256
auth_file = /etc/pgbouncer/userlist.txt
auth_user = pgbouncer_auth
auth_query = SELECT usename, passwd FROM pgbouncer.get_auth($1)

admin_users = postgres, pgbouncer_admin
stats_users = datadog, prometheus

pool_mode = transaction
server_reset_query = DISCARD ALL
server_check_query = select 1
server_check_delay = 30
max_prepared_statements = 100
ignore_startup_parameters = extra_float_digits, options

max_client_conn = 5000
default_pool_size = 25
min_pool_size = 5
reserve_pool_size = 5
reserve_pool_timeout = 3
max_db_connections = 100

server_lifetime = 3600
server_idle_timeout = 600
server_connect_timeout = 5
server_login_retry = 5
query_wait_timeout = 60
client_idle_timeout = 0
client_login_timeout = 60
idle_transaction_timeout = 300

log_connections = 0
log_disconnections = 0
log_pooler_errors = 1
stats_period = 60
verbose = 0

client_tls_sslmode = prefer
client_tls_key_file = /etc/pgbouncer/tls/server.key
client_tls_cert_file = /etc/pgbouncer/tls/server.crt
client_tls_ca_file = /etc/ssl/certs/ca-certificates.crt
client_tls_protocols = secure
server_tls_sslmode = require
server_tls_protocols = secure

tcp_keepalive = 1
tcp_keepidle = 60
tcp_keepintvl = 10
tcp_keepcnt = 6
so_reuseport = 1
pkt_buf = 8192
max_packet_size = 2147483647
dns_max_ttl = 15
"#;

#[test]
fn production_config_loads() {
    let c = parse(PRODUCTION).unwrap();
    let s = &c.settings;
    assert_eq!(s.listen_addrs(), vec!["*"]);
    assert_eq!(s.listen_port, 6432);
    assert_eq!(s.auth_type, AuthType::ScramSha256);
    assert_eq!(s.pool_mode, PoolMode::Transaction);
    assert_eq!(s.max_client_conn, 5000);
    assert_eq!(s.admin_users, vec!["postgres", "pgbouncer_admin"]);
    assert_eq!(
        s.ignore_startup_parameters,
        vec!["extra_float_digits", "options"]
    );
    assert_eq!(s.reserve_pool_timeout, Some(Duration::from_secs(3)));
    assert_eq!(s.client_idle_timeout, None);
    assert_eq!(s.idle_transaction_timeout, Some(Duration::from_secs(300)));
    assert_eq!(s.client_tls_sslmode, SslMode::Prefer);
    assert_eq!(s.server_tls_sslmode, SslMode::Require);
    assert!(!s.log_connections && s.log_pooler_errors);
    assert_eq!(s.pkt_buf, 8192);
    assert_eq!(s.server_check(), ServerCheck::Query("select 1"));

    let names: Vec<_> = c.databases.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, vec!["app", "app_ro", "reporting", "legacy"]);
    let reporting = c.database("reporting").unwrap();
    assert_eq!(reporting.password.as_deref(), Some("s3cr3t'pw"));
    assert_eq!(
        reporting.connect_query.as_deref(),
        Some("SET statement_timeout = '30s'")
    );
    assert_eq!(reporting.port, 6543);
    assert_eq!(c.database("app").unwrap().reserve_pool, Some(10));

    // A host list is served (load_balance_hosts): nothing to warn about.
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
}

#[test]
fn defaults_when_section_is_empty() {
    let c = parse("[pgbouncer]\n").unwrap();
    assert_eq!(c.settings, Settings::default());
    assert!(c.databases.is_empty() && c.warnings.is_empty());
    assert_eq!(c.path, Path::new("pgbouncer.ini"));
}

#[test]
fn pgward_section_name_and_own_keys() {
    let c = parse(
        "[pgward]\npolicy_file = /etc/pgward/policy.toml\nprometheus_listen = 127.0.0.1:9127\n\
         worker_threads = 4\n",
    )
    .unwrap();
    assert_eq!(
        c.settings.policy_file.as_deref(),
        Some(Path::new("/etc/pgward/policy.toml"))
    );
    assert_eq!(
        c.settings.prometheus_listen.as_deref(),
        Some("127.0.0.1:9127")
    );
    assert_eq!(c.settings.worker_threads, 4);
}

#[test]
fn keys_are_case_insensitive_in_main_section_only() {
    let c = parse("[pgbouncer]\nListen_Port = 7432\n[databases]\nMyDB = host=x\n").unwrap();
    assert_eq!(c.settings.listen_port, 7432);
    assert!(c.settings.raw.contains_key("listen_port"));
    assert!(c.database("MyDB").is_some());
    assert!(c.database("mydb").is_none());
}

#[test]
fn bad_values_name_file_and_line() {
    for (text, line) in [
        ("[pgbouncer]\nlisten_port = 6432\n\nlisten_port = x\n", 4),
        ("[pgbouncer]\npool_mode = turbo\n", 2),
        ("[pgbouncer]\nquery_timeout = 10s\n", 2),
        ("[pgbouncer]\n[databases]\nfoo = host=x bogus=1\n", 3),
        ("[pgbouncer]\n[databases]\npgbouncer = host=x\n", 3),
        ("[pgbouncer]\n[users]\nbob = pool_mode=x\n", 3),
        ("[pgbouncer]\n[peers]\n0 = host=x\n", 3),
        ("[pgbouncer]\n[pools]\nnodot = pool_size=1\n", 3),
        ("[pgbouncer]\n[nosuch]\n", 2),
        ("listen_port = 1\n[pgbouncer]\n", 1),
        ("[pgbouncer]\nlisten_port = 6432 ; trailing comment\n", 2),
        // Values Linux refuses on a socket: every connection would fail.
        ("[pgbouncer]\ntcp_keepidle = 40000\n", 2),
        ("[pgbouncer]\ntcp_keepintvl = 32768\n", 2),
        ("[pgbouncer]\ntcp_keepcnt = 128\n", 2),
        ("[pgbouncer]\n\ntcp_user_timeout = 3000000000\n", 3),
    ] {
        let (file, l, msg) = at(parse(text).unwrap_err());
        assert_eq!(
            (file.as_str(), l),
            ("pgbouncer.ini", line),
            "{text:?}: {msg}"
        );
    }
}

#[test]
fn missing_main_section_is_an_error() {
    let err = parse("[databases]\nfoo = host=x\n").unwrap_err();
    assert!(matches!(err, ConfigError::File { .. }), "{err}");
}

#[test]
fn duplicate_keys_last_wins() {
    let c = parse(
        "[pgbouncer]\ndefault_pool_size = 5\ndefault_pool_size = 7\n\
         [databases]\na = host=one\nb = host=b\na = host=two\n\
         [users]\nu = pool_size=1\nu = pool_size=2\n",
    )
    .unwrap();
    assert_eq!(c.settings.default_pool_size, 7);
    assert_eq!(c.settings.raw["default_pool_size"], "7");
    let names: Vec<_> = c.databases.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, vec!["a", "b"]);
    assert_eq!(c.database("a").unwrap().host.as_deref(), Some("two"));
    assert_eq!(c.user("u").unwrap().pool_size, Some(2));
}

#[test]
fn repeated_main_section_resets_defaults_like_pgbouncer() {
    let c = parse(
        "[pgbouncer]\nlisten_port = 7000\nauth_file = /a\n[databases]\n[pgbouncer]\nmax_client_conn = 9\n",
    )
    .unwrap();
    assert_eq!(c.settings.listen_port, 6432);
    assert_eq!(c.settings.max_client_conn, 9);
    assert_eq!(c.settings.auth_file.as_deref(), Some(Path::new("/a")));
    assert!(!c.settings.raw.contains_key("listen_port"));
    assert!(
        c.warnings[0].starts_with("pgbouncer.ini:5:"),
        "{:?}",
        c.warnings
    );
}

#[test]
fn unknown_keys_warn_once_each() {
    let c = parse("[pgbouncer]\nfoo_bar = 1\nauth_ldap_options = x\n").unwrap();
    assert_eq!(c.warnings.len(), 2);
    assert!(c.warnings[0].starts_with("pgbouncer.ini:2: parameter foo_bar"));
    assert!(c.warnings[1].starts_with("pgbouncer.ini:3: parameter auth_ldap_options"));
    assert_eq!(c.settings.raw["foo_bar"], "1");
}

#[test]
fn auth_types_this_build_cannot_check_are_refused_with_their_line() {
    for method in ["pam", "ldap", "gss"] {
        let err = parse(&format!(
            "[pgbouncer]\nlisten_port = 7000\nauth_type = {method}\n"
        ))
        .expect_err(method)
        .to_string();
        assert!(err.contains("pgbouncer.ini:3"), "{method}: {err}");
        assert!(err.contains("auth_type"), "{method}: {err}");
    }
}

#[test]
fn autodb_fallback() {
    let c =
        parse("[pgbouncer]\n[databases]\nexact = host=e\n* = host=fallback port=5433\n").unwrap();
    assert!(c.databases.iter().all(|d| d.name != "*"));
    let db = c.database("other").unwrap();
    assert_eq!(db.name, "other");
    assert_eq!(db.host.as_deref(), Some("fallback"));
    assert_eq!(db.port, 5433);
    assert_eq!(db.target_dbname(), "other");
    assert_eq!(c.database("exact").unwrap().host.as_deref(), Some("e"));

    let c = parse("[pgbouncer]\n[databases]\n* = host=f dbname=shared\n").unwrap();
    assert_eq!(c.database("x").unwrap().target_dbname(), "shared");

    let c = parse("[pgbouncer]\n[databases]\nonly = host=o\n").unwrap();
    assert!(c.database("x").is_none());
}

#[test]
fn pool_mode_and_size_precedence() {
    let c = parse(
        "[pgbouncer]\npool_mode = transaction\ndefault_pool_size = 11\n\
         [databases]\nplain = host=h\nsess = host=h pool_mode=session pool_size=7\n\
         [users]\nstmt = pool_mode=statement pool_size=3\nnone = max_user_connections=1\n\
         [pools]\nnone.sess = pool_size=2\n",
    )
    .unwrap();
    let plain = c.database("plain").unwrap();
    let sess = c.database("sess").unwrap();
    assert_eq!(c.pool_mode_for(&plain, "anyone"), PoolMode::Transaction);
    assert_eq!(c.pool_mode_for(&sess, "anyone"), PoolMode::Session);
    assert_eq!(c.pool_mode_for(&sess, "stmt"), PoolMode::Statement);
    assert_eq!(c.pool_size_for(&plain, "anyone"), 11);
    assert_eq!(c.pool_size_for(&sess, "anyone"), 7);
    assert_eq!(c.pool_size_for(&sess, "stmt"), 3);
    assert_eq!(c.pool_size_for(&sess, "none"), 2);
    assert_eq!(c.pool_size_for(&plain, "none"), 11);
}

#[test]
fn peers_section() {
    let c = parse(
        "[pgbouncer]\npeer_id = 1\n[peers]\n1 = host=/tmp/pgbouncer1\n2 = host=/tmp/pgbouncer2\n",
    )
    .unwrap();
    assert_eq!(c.settings.peer_id, 1);
    assert_eq!(c.peers.len(), 2);
}

#[test]
fn hba_without_file_fails_validation() {
    let err = parse("[pgbouncer]\nauth_type = hba\n").unwrap_err();
    assert!(err.to_string().contains("auth_hba_file"), "{err}");
}

#[test]
fn load_with_include_relative_to_base_dir() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("dbs.ini"),
        "[databases]\nincluded = host=inc\n\nbroken = port=x\n",
    )
    .unwrap();
    let main = "[pgbouncer]\nlisten_port = 6500\n%include dbs.ini\n";
    let err = parse_str(main, "main.ini", dir.path()).unwrap_err();
    let (file, line, _) = at(err);
    assert_eq!(file, dir.path().join("dbs.ini").display().to_string());
    assert_eq!(line, 4);

    std::fs::write(
        dir.path().join("dbs.ini"),
        "[databases]\nincluded = host=inc\n",
    )
    .unwrap();
    let c = parse_str(main, "main.ini", dir.path()).unwrap();
    assert_eq!(c.database("included").unwrap().host.as_deref(), Some("inc"));
}

#[test]
fn load_reads_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pgbouncer.ini");
    std::fs::write(&path, PRODUCTION).unwrap();
    let c = load(&path).unwrap();
    assert_eq!(c.path, path);
    assert_eq!(c.databases.len(), 4);
    assert!(matches!(
        load(&dir.path().join("absent.ini")),
        Err(ConfigError::Io { .. })
    ));
}

#[test]
fn settings_set_shared_with_admin() {
    let mut c = parse("[pgbouncer]\n").unwrap();
    assert_eq!(
        c.settings.set("default_pool_size", "3"),
        Ok(SetOutcome::Applied)
    );
    assert!(c.settings.set("default_pool_size", "three").is_err());
    assert_eq!(c.settings.default_pool_size, 3);
}

#[test]
fn debug_output_hides_connection_string_passwords() {
    let db = DatabaseDef::parse("app", "host=h user=u password=hunter2").unwrap();
    let shown = format!("{db:?}");
    assert!(!shown.contains("hunter2"), "{shown}");
    assert!(shown.contains("(hidden)"), "{shown}");
}

#[test]
fn auth_query_runs_as_its_auth_user_on_its_auth_database() {
    let config = parse(
        "[databases]\napp = host=h user=owner\nother = host=h auth_user=lookup auth_dbname=app\n\
         [pgbouncer]\nauth_user = admin\n",
    )
    .unwrap();
    let app = config.database("app").unwrap();
    let other = config.database("other").unwrap();
    assert!(
        config.runs_auth_query_as(&app, "admin"),
        "app's own clients"
    );
    assert!(
        config.runs_auth_query_as(&app, "lookup"),
        "other's clients, on app"
    );
    assert!(!config.runs_auth_query_as(&app, "owner"));
    assert!(
        !config.runs_auth_query_as(&other, "lookup"),
        "it runs on app"
    );
}
