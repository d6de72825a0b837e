//! The `[pgbouncer]` (or `[pgward]`) section: typed settings with PgBouncer's defaults.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use super::values;

/// How clients are authenticated (`auth_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthType {
    /// No password; the user must exist in the auth file.
    Trust,
    /// No password and the user name is ignored.
    Any,
    /// Clear-text password.
    Plain,
    /// MD5 password (SCRAM is used when the stored secret is SCRAM).
    Md5,
    /// SCRAM-SHA-256.
    ScramSha256,
    /// Per-connection method from `auth_hba_file`.
    Hba,
    /// TLS client certificate.
    Cert,
}

impl AuthType {
    /// Parses a value of `auth_type` (case-insensitive).
    pub fn parse(s: &str) -> Option<Self> {
        let found = match s.to_ascii_lowercase().as_str() {
            "trust" => AuthType::Trust,
            "any" => AuthType::Any,
            "plain" => AuthType::Plain,
            "md5" => AuthType::Md5,
            "scram-sha-256" => AuthType::ScramSha256,
            "hba" => AuthType::Hba,
            "cert" => AuthType::Cert,
            // pam and ldap are unknown, as to a PgBouncer built without them: a setting that
            // would refuse every login is refused itself.
            _ => return None,
        };
        Some(found)
    }
}

/// When a server connection goes back to the pool (`pool_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolMode {
    /// When the client disconnects.
    Session,
    /// When a transaction ends.
    Transaction,
    /// After each statement; multi-statement transactions are refused.
    Statement,
}

impl PoolMode {
    /// Parses a value of `pool_mode` (case-insensitive).
    pub fn parse(s: &str) -> Option<Self> {
        match s.to_ascii_lowercase().as_str() {
            "session" => Some(PoolMode::Session),
            "transaction" => Some(PoolMode::Transaction),
            "statement" => Some(PoolMode::Statement),
            _ => None,
        }
    }

    /// The name used in the configuration file.
    pub fn as_str(self) -> &'static str {
        match self {
            PoolMode::Session => "session",
            PoolMode::Transaction => "transaction",
            PoolMode::Statement => "statement",
        }
    }
}

/// TLS mode of `client_tls_sslmode` / `server_tls_sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    /// No TLS.
    Disable,
    /// TLS if the peer asks (clients) / not requested (servers).
    Allow,
    /// TLS when available.
    Prefer,
    /// TLS required, certificate not checked.
    Require,
    /// TLS required, certificate checked against the CA.
    VerifyCa,
    /// TLS required, certificate and host name checked.
    VerifyFull,
}

impl SslMode {
    /// Parses an sslmode value (case-insensitive).
    pub fn parse(s: &str) -> Option<Self> {
        let found = match s.to_ascii_lowercase().as_str() {
            "disable" => SslMode::Disable,
            "allow" => SslMode::Allow,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            _ => return None,
        };
        Some(found)
    }
}

/// What `server_check_query` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerCheck<'a> {
    /// Empty value: no check.
    Disabled,
    /// `<empty>`: send an empty query.
    EmptyQuery,
    /// Send this query.
    Query(&'a str),
}

/// What [`Settings::set`] did with a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetOutcome {
    /// The value was stored in a typed field.
    Applied,
    /// PgBouncer knows the key but pgward does not use it; the value was checked and kept raw.
    NotImplemented,
    /// Neither PgBouncer nor pgward knows the key; the value was kept raw.
    Unknown,
}

/// PgBouncer's default `auth_query`.
pub const DEFAULT_AUTH_QUERY: &str = "SELECT rolname, CASE WHEN rolvaliduntil < now() THEN NULL ELSE rolpassword END FROM pg_authid WHERE rolname=$1 AND rolcanlogin";

/// Typed settings of the main section. Field names are the configuration keys.
///
/// Timeouts that PgBouncer disables with 0 are `Option<Duration>`, `None` meaning disabled.
/// Strings whose empty value means "not set" are `Option`.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub struct Settings {
    // Listening.
    /// Comma-separated addresses; `*` is all; empty means Unix socket only.
    pub listen_addr: String,
    pub listen_port: u16,
    pub listen_backlog: u32,
    /// Empty disables the Unix socket; a leading `@` is the abstract namespace.
    pub unix_socket_dir: String,
    pub unix_socket_mode: u32,
    pub unix_socket_group: Option<String>,
    pub so_reuseport: bool,
    // Pooling.
    pub pool_mode: PoolMode,
    pub max_client_conn: u32,
    pub default_pool_size: u32,
    pub min_pool_size: u32,
    pub reserve_pool_size: u32,
    pub reserve_pool_timeout: Option<Duration>,
    /// 0 is unlimited.
    pub max_db_connections: u32,
    /// 0 is unlimited.
    pub max_db_client_connections: u32,
    /// 0 is unlimited.
    pub max_user_connections: u32,
    /// 0 is unlimited.
    pub max_user_client_connections: u32,
    pub server_round_robin: bool,
    pub track_extra_parameters: Vec<String>,
    pub ignore_startup_parameters: Vec<String>,
    /// 0 disables peering.
    pub peer_id: u32,
    pub disable_pqexec: bool,
    pub application_name_add_host: bool,
    pub stats_period: Duration,
    /// 0 disables prepared statement tracking.
    pub max_prepared_statements: u32,
    pub scram_iterations: u32,
    pub autodb_idle_timeout: Option<Duration>,
    /// A pool with no client and no server for this long is freed (off by default).
    pub pool_idle_timeout: Option<Duration>,
    // Authentication.
    pub auth_type: AuthType,
    /// Kept as written; a relative path is relative to the working directory, as in PgBouncer.
    pub auth_file: Option<PathBuf>,
    pub auth_hba_file: Option<PathBuf>,
    /// Ident maps for `map=` in `auth_hba_file`.
    pub auth_ident_file: Option<PathBuf>,
    pub auth_user: Option<String>,
    pub auth_query: String,
    pub auth_dbname: Option<String>,
    // Logging.
    pub logfile: Option<PathBuf>,
    pub pidfile: Option<PathBuf>,
    pub verbose: i32,
    pub syslog: bool,
    pub syslog_ident: String,
    pub syslog_facility: String,
    pub log_connections: bool,
    pub log_disconnections: bool,
    pub log_pooler_errors: bool,
    pub log_stats: bool,
    // Console access.
    pub admin_users: Vec<String>,
    pub stats_users: Vec<String>,
    // Server connections.
    pub server_reset_query: String,
    pub server_reset_query_always: bool,
    /// Zero: check every time.
    pub server_check_delay: Duration,
    /// See [`Settings::server_check`].
    pub server_check_query: String,
    pub server_fast_close: bool,
    /// Zero: use each connection once.
    pub server_lifetime: Duration,
    pub server_idle_timeout: Option<Duration>,
    pub server_connect_timeout: Option<Duration>,
    pub server_login_retry: Duration,
    pub client_login_timeout: Option<Duration>,
    pub dns_max_ttl: Duration,
    pub dns_nxdomain_ttl: Duration,
    pub dns_zone_check_period: Option<Duration>,
    // TLS.
    pub client_tls_sslmode: SslMode,
    pub client_tls_key_file: String,
    pub client_tls_cert_file: String,
    pub client_tls_ca_file: String,
    pub client_tls_protocols: String,
    pub client_tls_ciphers: String,
    pub client_tls13_ciphers: String,
    pub client_tls_ecdhcurve: String,
    pub client_tls_dheparams: String,
    pub server_tls_sslmode: SslMode,
    pub server_tls_ca_file: String,
    pub server_tls_key_file: String,
    pub server_tls_cert_file: String,
    pub server_tls_protocols: String,
    pub server_tls_ciphers: String,
    pub server_tls13_ciphers: String,
    // Dangerous timeouts.
    pub query_timeout: Option<Duration>,
    pub query_wait_timeout: Option<Duration>,
    pub cancel_wait_timeout: Option<Duration>,
    pub client_idle_timeout: Option<Duration>,
    pub idle_transaction_timeout: Option<Duration>,
    pub transaction_timeout: Option<Duration>,
    pub suspend_timeout: Option<Duration>,
    /// A notice sent to a client queued longer than this for a server.
    pub query_wait_notify: Option<Duration>,
    /// A notice sent to every client after a successful login.
    pub login_notify_message: Option<String>,
    // Low-level network.
    pub pkt_buf: u32,
    pub max_packet_size: u32,
    /// 0 is no limit.
    pub sbuf_loopcnt: u32,
    pub tcp_defer_accept: bool,
    /// 0 is the OS default.
    pub tcp_socket_buffer: u32,
    pub tcp_keepalive: bool,
    pub tcp_keepcnt: u32,
    pub tcp_keepidle: u32,
    pub tcp_keepintvl: u32,
    /// Milliseconds; 0 is the OS default.
    pub tcp_user_timeout: u32,
    // pgward.
    pub policy_file: Option<PathBuf>,
    /// Where the gate keeps what it learned across restarts (written now and then, and at
    /// shutdown; read at start).
    pub state_file: Option<PathBuf>,
    pub prometheus_listen: Option<String>,
    /// Tenants that get series of their own in the metrics; the rest are summed.
    pub prometheus_max_tenants: usize,
    /// Rows of statement statistics kept (SHOW STATEMENTS); 0: none are kept.
    pub max_statement_stats: usize,
    /// Statements that get series in the metrics (those with the most total time).
    pub prometheus_max_statements: usize,
    pub worker_threads: usize,
    /// Every key set in the section, lowercased, with its last raw value.
    pub raw: BTreeMap<String, String>,
}

impl Default for Settings {
    fn default() -> Self {
        let secs = Duration::from_secs;
        Settings {
            listen_addr: String::new(),
            listen_port: 6432,
            listen_backlog: 128,
            unix_socket_dir: "/tmp".into(),
            unix_socket_mode: 0o777,
            unix_socket_group: None,
            so_reuseport: false,
            pool_mode: PoolMode::Session,
            max_client_conn: 100,
            default_pool_size: 20,
            min_pool_size: 0,
            reserve_pool_size: 0,
            reserve_pool_timeout: Some(secs(5)),
            max_db_connections: 0,
            max_db_client_connections: 0,
            max_user_connections: 0,
            max_user_client_connections: 0,
            server_round_robin: false,
            track_extra_parameters: vec!["IntervalStyle".into()],
            ignore_startup_parameters: Vec::new(),
            peer_id: 0,
            disable_pqexec: false,
            application_name_add_host: false,
            stats_period: secs(60),
            max_prepared_statements: 200,
            scram_iterations: 4096,
            autodb_idle_timeout: Some(secs(3600)),
            pool_idle_timeout: None,
            auth_type: AuthType::Md5,
            auth_file: None,
            auth_hba_file: None,
            auth_ident_file: None,
            auth_user: None,
            auth_query: DEFAULT_AUTH_QUERY.into(),
            auth_dbname: None,
            logfile: None,
            pidfile: None,
            verbose: 0,
            syslog: false,
            syslog_ident: "pgbouncer".into(),
            syslog_facility: "daemon".into(),
            log_connections: true,
            log_disconnections: true,
            log_pooler_errors: true,
            log_stats: true,
            admin_users: Vec::new(),
            stats_users: Vec::new(),
            server_reset_query: "DISCARD ALL".into(),
            server_reset_query_always: false,
            server_check_delay: secs(30),
            server_check_query: "<empty>".into(),
            server_fast_close: false,
            server_lifetime: secs(3600),
            server_idle_timeout: Some(secs(600)),
            server_connect_timeout: Some(secs(15)),
            server_login_retry: secs(15),
            client_login_timeout: Some(secs(60)),
            dns_max_ttl: secs(15),
            dns_nxdomain_ttl: secs(15),
            dns_zone_check_period: None,
            client_tls_sslmode: SslMode::Disable,
            client_tls_key_file: String::new(),
            client_tls_cert_file: String::new(),
            client_tls_ca_file: String::new(),
            client_tls_protocols: "secure".into(),
            client_tls_ciphers: "default".into(),
            client_tls13_ciphers: String::new(),
            client_tls_ecdhcurve: "auto".into(),
            client_tls_dheparams: "auto".into(),
            server_tls_sslmode: SslMode::Prefer,
            server_tls_ca_file: String::new(),
            server_tls_key_file: String::new(),
            server_tls_cert_file: String::new(),
            server_tls_protocols: "secure".into(),
            server_tls_ciphers: "default".into(),
            server_tls13_ciphers: String::new(),
            query_timeout: None,
            query_wait_timeout: Some(secs(120)),
            cancel_wait_timeout: Some(secs(10)),
            client_idle_timeout: None,
            idle_transaction_timeout: None,
            transaction_timeout: None,
            suspend_timeout: Some(secs(10)),
            query_wait_notify: Some(secs(5)),
            login_notify_message: None,
            pkt_buf: 4096,
            max_packet_size: 2_147_483_647,
            sbuf_loopcnt: 5,
            tcp_defer_accept: cfg!(target_os = "linux"),
            tcp_socket_buffer: 0,
            tcp_keepalive: true,
            tcp_keepcnt: 0,
            tcp_keepidle: 0,
            tcp_keepintvl: 0,
            tcp_user_timeout: 0,
            policy_file: None,
            state_file: None,
            prometheus_listen: None,
            prometheus_max_tenants: 100,
            max_statement_stats: DEFAULT_MAX_STATEMENT_STATS,
            prometheus_max_statements: 20,
            worker_threads: 1,
            raw: BTreeMap::new(),
        }
    }
}

/// Keys PgBouncer accepts that have no typed field here (their values are text: nothing to
/// check).
const NOT_IMPLEMENTED: &[&str] = &[
    "auth_ldap_options",
    "conffile",
    "job_name",
    "resolv_conf",
    "service_name",
    "user",
];

/// `max_statement_stats` when not set: rows of statement statistics kept.
pub const DEFAULT_MAX_STATEMENT_STATS: usize = 5_000;

/// Keys whose change only takes effect on restart (PgBouncer ignores them on reload).
const RESTART_ONLY: &[&str] = &[
    "disable_pqexec",
    "job_name",
    "listen_addr",
    "listen_backlog",
    "listen_port",
    // Every client's cancel key carries it: a change would misroute their cancels.
    "peer_id",
    "pidfile",
    "pkt_buf",
    "resolv_conf",
    "so_reuseport",
    "track_extra_parameters",
    "unix_socket_dir",
    "unix_socket_group",
    "unix_socket_mode",
    "user",
    "worker_threads",
    "prometheus_listen",
];

/// Keys [`Settings::reset_to_defaults`] leaves alone.
const KEPT_ON_RESET: &[&str] = &[
    "auth_file",
    "auth_user",
    "auth_dbname",
    "verbose",
    "client_tls13_ciphers",
    "server_tls13_ciphers",
    "policy_file",
    "state_file",
    "prometheus_listen",
    "prometheus_max_tenants",
    "max_statement_stats",
    "prometheus_max_statements",
    "worker_threads",
    "auth_ident_file",
    "auth_ldap_options",
    "conffile",
    "user",
];

/// Result of one group setter: `Ok(false)` when the key is not in the group.
type Handled = Result<bool, String>;

/// Which of PgBouncer's routine log lines are written (`log_connections`,
/// `log_disconnections`, `log_pooler_errors`, `log_stats`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogLines {
    /// `login attempt`, `new connection to server`.
    pub connections: bool,
    /// `closing because`, of clients and of servers.
    pub disconnections: bool,
    /// `pooler error`: an error of pgward's own sent to a client.
    pub pooler_errors: bool,
    /// The `stats:` line every `stats_period`.
    pub stats: bool,
}

impl Default for LogLines {
    fn default() -> Self {
        LogLines {
            connections: true,
            disconnections: true,
            pooler_errors: true,
            stats: true,
        }
    }
}

impl Settings {
    /// The routine log lines these settings ask for.
    pub fn log_lines(&self) -> LogLines {
        LogLines {
            connections: self.log_connections,
            disconnections: self.log_disconnections,
            pooler_errors: self.log_pooler_errors,
            stats: self.log_stats,
        }
    }

    /// Sets `key` (case-insensitive) from its textual value, as a configuration line or an
    /// admin `SET` would. Bad values are refused with a message; unknown keys are accepted
    /// and reported through the outcome. The raw value is remembered in [`Settings::raw`].
    pub fn set(&mut self, key: &str, value: &str) -> Result<SetOutcome, String> {
        let key = key.to_ascii_lowercase();
        let outcome = self
            .set_typed(&key, value)
            .map_err(|why| format!("invalid value \"{value}\" for parameter {key}: {why}"))?;
        self.raw.insert(key, value.to_string());
        Ok(outcome)
    }

    /// Puts back the defaults of every key that has one, as PgBouncer does each time its
    /// main section header is read. Keys without a default in PgBouncer (`auth_file`,
    /// `auth_user`, `auth_dbname`, `verbose`, the TLS 1.3 cipher lists) and pgward's own keys
    /// keep their values.
    pub fn reset_to_defaults(&mut self) {
        let mut fresh = Settings {
            auth_file: self.auth_file.take(),
            auth_user: self.auth_user.take(),
            auth_dbname: self.auth_dbname.take(),
            verbose: self.verbose,
            client_tls13_ciphers: std::mem::take(&mut self.client_tls13_ciphers),
            server_tls13_ciphers: std::mem::take(&mut self.server_tls13_ciphers),
            policy_file: self.policy_file.take(),
            state_file: self.state_file.take(),
            prometheus_listen: self.prometheus_listen.take(),
            prometheus_max_tenants: self.prometheus_max_tenants,
            max_statement_stats: self.max_statement_stats,
            prometheus_max_statements: self.prometheus_max_statements,
            worker_threads: self.worker_threads,
            ..Settings::default()
        };
        fresh.raw = std::mem::take(&mut self.raw);
        fresh.raw.retain(|k, _| KEPT_ON_RESET.contains(&k.as_str()));
        *self = fresh;
    }

    /// Whether a changed `key` needs a restart rather than a reload.
    pub fn requires_restart(key: &str) -> bool {
        RESTART_ONLY.contains(&key.to_ascii_lowercase().as_str())
    }

    /// The `listen_addr` entries (`*` means all addresses); empty means no TCP listener.
    pub fn listen_addrs(&self) -> Vec<String> {
        values::list(&self.listen_addr)
    }

    /// How server connections are checked before reuse.
    pub fn server_check(&self) -> ServerCheck<'_> {
        match self.server_check_query.as_str() {
            "" => ServerCheck::Disabled,
            "<empty>" => ServerCheck::EmptyQuery,
            q => ServerCheck::Query(q),
        }
    }

    /// Checks relations between settings once a whole file is read.
    pub fn validate(&self) -> Result<(), String> {
        if self.auth_type == AuthType::Hba && self.auth_hba_file.is_none() {
            return Err("auth_type = hba needs auth_hba_file".into());
        }
        Ok(())
    }

    fn set_typed(&mut self, key: &str, v: &str) -> Result<SetOutcome, String> {
        let groups: [fn(&mut Self, &str, &str) -> Handled; 7] = [
            Self::set_listen,
            Self::set_pooling,
            Self::set_auth,
            Self::set_logging,
            Self::set_server,
            Self::set_tls,
            Self::set_network,
        ];
        for group in groups {
            if group(self, key, v)? {
                return Ok(SetOutcome::Applied);
            }
        }
        match NOT_IMPLEMENTED.contains(&key) {
            true => Ok(SetOutcome::NotImplemented),
            false => Ok(SetOutcome::Unknown),
        }
    }

    fn set_listen(&mut self, key: &str, v: &str) -> Handled {
        match key {
            "listen_addr" => self.listen_addr = v.into(),
            "listen_port" => self.listen_port = port(v)?,
            "listen_backlog" => self.listen_backlog = values::count(v)?,
            "unix_socket_dir" => self.unix_socket_dir = v.into(),
            "unix_socket_mode" => self.unix_socket_mode = socket_mode(v)?,
            "unix_socket_group" => self.unix_socket_group = values::optional(v),
            "so_reuseport" => self.so_reuseport = values::boolean(v)?,
            "policy_file" => self.policy_file = values::optional(v).map(PathBuf::from),
            "state_file" => self.state_file = values::optional(v).map(PathBuf::from),
            "prometheus_listen" => self.prometheus_listen = values::optional(v),
            "prometheus_max_tenants" => self.prometheus_max_tenants = values::count(v)? as usize,
            "max_statement_stats" => self.max_statement_stats = values::count(v)? as usize,
            "prometheus_max_statements" => {
                self.prometheus_max_statements = values::count(v)? as usize
            }
            "worker_threads" => self.worker_threads = worker_threads(v)?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn set_pooling(&mut self, key: &str, v: &str) -> Handled {
        match key {
            "pool_mode" => self.pool_mode = PoolMode::parse(v).ok_or("unknown pool mode")?,
            "max_client_conn" => self.max_client_conn = values::count(v)?,
            "default_pool_size" => self.default_pool_size = values::count(v)?,
            "min_pool_size" => self.min_pool_size = values::count(v)?,
            "reserve_pool_size" => self.reserve_pool_size = values::count(v)?,
            "reserve_pool_timeout" => self.reserve_pool_timeout = values::timeout(v)?,
            "max_db_connections" => self.max_db_connections = values::count(v)?,
            "max_db_client_connections" => self.max_db_client_connections = values::count(v)?,
            "max_user_connections" => self.max_user_connections = values::count(v)?,
            "max_user_client_connections" => self.max_user_client_connections = values::count(v)?,
            "server_round_robin" => self.server_round_robin = values::boolean(v)?,
            "track_extra_parameters" => self.track_extra_parameters = values::list(v),
            "ignore_startup_parameters" => self.ignore_startup_parameters = values::list(v),
            "peer_id" => self.peer_id = peer_id(v)?,
            "disable_pqexec" => self.disable_pqexec = values::boolean(v)?,
            "application_name_add_host" => self.application_name_add_host = values::boolean(v)?,
            "stats_period" => self.stats_period = Duration::from_secs(values::count(v)?.into()),
            "max_prepared_statements" => self.max_prepared_statements = values::count(v)?,
            "scram_iterations" => self.scram_iterations = values::count(v)?,
            "autodb_idle_timeout" => self.autodb_idle_timeout = values::timeout(v)?,
            "pool_idle_timeout" => self.pool_idle_timeout = values::timeout(v)?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn set_auth(&mut self, key: &str, v: &str) -> Handled {
        match key {
            "auth_type" => self.auth_type = AuthType::parse(v).ok_or("unknown auth_type")?,
            "auth_file" => self.auth_file = values::optional(v).map(PathBuf::from),
            "auth_hba_file" => self.auth_hba_file = values::optional(v).map(PathBuf::from),
            "auth_ident_file" => self.auth_ident_file = values::optional(v).map(PathBuf::from),
            "auth_user" => self.auth_user = values::optional(v),
            "auth_query" => self.auth_query = v.into(),
            "auth_dbname" => self.auth_dbname = auth_dbname(v)?,
            "admin_users" => self.admin_users = values::list(v),
            "stats_users" => self.stats_users = values::list(v),
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn set_logging(&mut self, key: &str, v: &str) -> Handled {
        match key {
            "logfile" => self.logfile = values::optional(v).map(PathBuf::from),
            "pidfile" => self.pidfile = values::optional(v).map(PathBuf::from),
            "verbose" => self.verbose = values::int(v)?,
            "syslog" => self.syslog = values::boolean(v)?,
            "syslog_ident" => self.syslog_ident = v.into(),
            "syslog_facility" => self.syslog_facility = v.into(),
            "log_connections" => self.log_connections = values::boolean(v)?,
            "log_disconnections" => self.log_disconnections = values::boolean(v)?,
            "log_pooler_errors" => self.log_pooler_errors = values::boolean(v)?,
            "log_stats" => self.log_stats = values::boolean(v)?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn set_server(&mut self, key: &str, v: &str) -> Handled {
        match key {
            "server_reset_query" => self.server_reset_query = v.into(),
            "server_reset_query_always" => self.server_reset_query_always = values::boolean(v)?,
            "server_check_delay" => self.server_check_delay = values::seconds(v)?,
            "server_check_query" => self.server_check_query = v.into(),
            "server_fast_close" => self.server_fast_close = values::boolean(v)?,
            "server_lifetime" => self.server_lifetime = values::seconds(v)?,
            "server_idle_timeout" => self.server_idle_timeout = values::timeout(v)?,
            "server_connect_timeout" => self.server_connect_timeout = values::timeout(v)?,
            "server_login_retry" => self.server_login_retry = values::seconds(v)?,
            "client_login_timeout" => self.client_login_timeout = values::timeout(v)?,
            "query_timeout" => self.query_timeout = values::timeout(v)?,
            "query_wait_timeout" => self.query_wait_timeout = values::timeout(v)?,
            "cancel_wait_timeout" => self.cancel_wait_timeout = values::timeout(v)?,
            "client_idle_timeout" => self.client_idle_timeout = values::timeout(v)?,
            "idle_transaction_timeout" => self.idle_transaction_timeout = values::timeout(v)?,
            "transaction_timeout" => self.transaction_timeout = values::timeout(v)?,
            "suspend_timeout" => self.suspend_timeout = values::timeout(v)?,
            "query_wait_notify" => self.query_wait_notify = values::timeout(v)?,
            "login_notify_message" => {
                self.login_notify_message = (!v.is_empty()).then(|| v.to_string())
            }
            "dns_max_ttl" => self.dns_max_ttl = values::seconds(v)?,
            "dns_nxdomain_ttl" => self.dns_nxdomain_ttl = values::seconds(v)?,
            "dns_zone_check_period" => self.dns_zone_check_period = values::timeout(v)?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn set_tls(&mut self, key: &str, v: &str) -> Handled {
        let field = match key {
            "client_tls_sslmode" => {
                self.client_tls_sslmode = SslMode::parse(v).ok_or("unknown sslmode")?;
                return Ok(true);
            }
            "server_tls_sslmode" => {
                self.server_tls_sslmode = SslMode::parse(v).ok_or("unknown sslmode")?;
                return Ok(true);
            }
            "client_tls_key_file" => &mut self.client_tls_key_file,
            "client_tls_cert_file" => &mut self.client_tls_cert_file,
            "client_tls_ca_file" => &mut self.client_tls_ca_file,
            "client_tls_protocols" => &mut self.client_tls_protocols,
            "client_tls_ciphers" => &mut self.client_tls_ciphers,
            "client_tls13_ciphers" => &mut self.client_tls13_ciphers,
            "client_tls_ecdhcurve" => &mut self.client_tls_ecdhcurve,
            "client_tls_dheparams" => &mut self.client_tls_dheparams,
            "server_tls_ca_file" => &mut self.server_tls_ca_file,
            "server_tls_key_file" => &mut self.server_tls_key_file,
            "server_tls_cert_file" => &mut self.server_tls_cert_file,
            "server_tls_protocols" => &mut self.server_tls_protocols,
            "server_tls_ciphers" => &mut self.server_tls_ciphers,
            "server_tls13_ciphers" => &mut self.server_tls13_ciphers,
            _ => return Ok(false),
        };
        *field = v.to_string();
        Ok(true)
    }

    fn set_network(&mut self, key: &str, v: &str) -> Handled {
        match key {
            "pkt_buf" => self.pkt_buf = values::count(v)?,
            "max_packet_size" => self.max_packet_size = values::count(v)?,
            "sbuf_loopcnt" => self.sbuf_loopcnt = values::count(v)?,
            "tcp_defer_accept" => self.tcp_defer_accept = values::boolean(v)?,
            "tcp_socket_buffer" => self.tcp_socket_buffer = values::count(v)?,
            "tcp_keepalive" => self.tcp_keepalive = values::boolean(v)?,
            // The largest values Linux takes (a larger one fails every socket).
            "tcp_keepcnt" => self.tcp_keepcnt = values::count_at_most(v, 127)?,
            "tcp_keepidle" => self.tcp_keepidle = values::count_at_most(v, 32767)?,
            "tcp_keepintvl" => self.tcp_keepintvl = values::count_at_most(v, 32767)?,
            "tcp_user_timeout" => {
                self.tcp_user_timeout = values::count_at_most(v, i32::MAX as u32)?
            }
            _ => return Ok(false),
        }
        Ok(true)
    }
}

fn port(v: &str) -> Result<u16, String> {
    let n = values::int(v)?;
    u16::try_from(n)
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| "port must be between 1 and 65535".to_string())
}

fn socket_mode(v: &str) -> Result<u32, String> {
    let mode = values::count(v)?;
    if mode > 0o7777 {
        return Err("not a file mode".into());
    }
    Ok(mode)
}

fn peer_id(v: &str) -> Result<u32, String> {
    let id = values::count(v)?;
    if id > 16383 {
        return Err("peer_id must be at most 16383".into());
    }
    Ok(id)
}

fn worker_threads(v: &str) -> Result<usize, String> {
    let n = values::count(v)?;
    if n == 0 {
        return Err("must be at least 1".into());
    }
    usize::try_from(n).map_err(|_| "too large".to_string())
}

fn auth_dbname(v: &str) -> Result<Option<String>, String> {
    if v == "pgbouncer" {
        return Err(format!(
            "cannot use the reserved \"{v}\" database as an auth_dbname"
        ));
    }
    Ok(values::optional(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_pgbouncer() {
        let s = Settings::default();
        assert_eq!(s.listen_port, 6432);
        assert!(s.listen_addrs().is_empty());
        assert_eq!(s.unix_socket_dir, "/tmp");
        assert_eq!(s.unix_socket_mode, 0o777);
        assert_eq!(s.auth_type, AuthType::Md5);
        assert_eq!(s.pool_mode, PoolMode::Session);
        assert_eq!(s.default_pool_size, 20);
        assert_eq!(s.max_client_conn, 100);
        assert_eq!(s.max_prepared_statements, 200);
        assert_eq!(s.server_check(), ServerCheck::EmptyQuery);
        assert_eq!(s.server_lifetime, Duration::from_secs(3600));
        assert_eq!(s.server_idle_timeout, Some(Duration::from_secs(600)));
        assert_eq!(s.query_wait_timeout, Some(Duration::from_secs(120)));
        assert_eq!(s.query_timeout, None);
        assert_eq!(s.reserve_pool_timeout, Some(Duration::from_secs(5)));
        assert_eq!(s.track_extra_parameters, vec!["IntervalStyle"]);
        assert!(s.log_connections && s.log_disconnections && s.log_pooler_errors && s.log_stats);
        assert_eq!(s.server_tls_sslmode, SslMode::Prefer);
        assert_eq!(s.client_tls_sslmode, SslMode::Disable);
        assert_eq!(s.max_packet_size, 2_147_483_647);
        assert_eq!(s.worker_threads, 1);
        assert_eq!(s.auth_query, DEFAULT_AUTH_QUERY);
    }

    #[test]
    fn set_every_kind() {
        let mut s = Settings::default();
        let ok = |s: &mut Settings, k: &str, v: &str| {
            assert_eq!(s.set(k, v), Ok(SetOutcome::Applied), "{k}")
        };
        ok(&mut s, "LISTEN_PORT", "7000");
        ok(&mut s, "unix_socket_mode", "0700");
        ok(&mut s, "pool_mode", "Transaction");
        ok(&mut s, "auth_type", "scram-sha-256");
        ok(&mut s, "server_tls_sslmode", "verify-full");
        ok(&mut s, "query_timeout", "2.5");
        ok(&mut s, "server_idle_timeout", "0");
        ok(&mut s, "log_stats", "0");
        ok(&mut s, "admin_users", "admin, ops ,");
        ok(&mut s, "auth_file", "/etc/pgbouncer/userlist.txt");
        ok(&mut s, "logfile", "");
        ok(&mut s, "worker_threads", "4");
        ok(&mut s, "server_check_query", "select 1");
        assert_eq!(s.listen_port, 7000);
        assert_eq!(s.unix_socket_mode, 0o700);
        assert_eq!(s.pool_mode, PoolMode::Transaction);
        assert_eq!(s.auth_type, AuthType::ScramSha256);
        assert_eq!(s.server_tls_sslmode, SslMode::VerifyFull);
        assert_eq!(s.query_timeout, Some(Duration::from_millis(2500)));
        assert_eq!(s.server_idle_timeout, None);
        assert!(!s.log_stats);
        assert_eq!(s.admin_users, vec!["admin", "ops"]);
        assert_eq!(
            s.auth_file,
            Some(PathBuf::from("/etc/pgbouncer/userlist.txt"))
        );
        assert_eq!(s.logfile, None);
        assert_eq!(s.worker_threads, 4);
        assert_eq!(s.server_check(), ServerCheck::Query("select 1"));
        assert_eq!(s.raw.get("listen_port").map(String::as_str), Some("7000"));
    }

    #[test]
    fn bad_values_are_refused() {
        let mut s = Settings::default();
        for (k, v) in [
            ("listen_port", "abc"),
            ("listen_port", "0"),
            ("listen_port", "70000"),
            ("default_pool_size", "-1"),
            ("pool_mode", "sessions"),
            ("auth_type", "password"),
            ("query_timeout", "5s"),
            ("log_connections", "yes"),
            ("worker_threads", "0"),
            ("peer_id", "20000"),
            ("auth_dbname", "pgbouncer"),
            ("pool_idle_timeout", "x"),
            ("client_tls_sslmode", "on"),
        ] {
            let err = s.set(k, v).unwrap_err();
            assert!(err.contains(k), "{err}");
        }
        assert!(!s.raw.contains_key("listen_port"));
    }

    #[test]
    fn unknown_and_unimplemented_keys() {
        let mut s = Settings::default();
        assert_eq!(
            s.set("auth_ldap_options", "/x"),
            Ok(SetOutcome::NotImplemented)
        );
        assert_eq!(s.set("frobnicate", "1"), Ok(SetOutcome::Unknown));
        assert_eq!(s.raw.get("frobnicate").map(String::as_str), Some("1"));
    }

    #[test]
    fn restart_only_keys() {
        assert!(Settings::requires_restart("listen_port"));
        assert!(!Settings::requires_restart("default_pool_size"));
    }

    #[test]
    fn hba_needs_file() {
        let mut s = Settings::default();
        s.set("auth_type", "hba").unwrap();
        assert!(s.validate().is_err());
        s.set("auth_hba_file", "/etc/hba").unwrap();
        assert!(s.validate().is_ok());
    }
}
