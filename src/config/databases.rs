//! The `[databases]` and `[peers]` sections.

use std::time::Duration;

use super::connstr;
use super::settings::PoolMode;
use super::values::{cstr_count, cstr_int, cstr_seconds};

/// Name reserved for the admin console; it cannot appear in `[databases]`.
pub const ADMIN_DB: &str = "pgbouncer";

/// The names the console answers to.
pub const CONSOLE_NAMES: [&str; 2] = ["pgward", ADMIN_DB];

/// Whether `database` names the console.
pub fn is_console(database: &str) -> bool {
    CONSOLE_NAMES.contains(&database)
}

/// How a host list is walked for new connections (`load_balance_hosts`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LoadBalanceHosts {
    /// Each new connection takes the next host.
    #[default]
    RoundRobin,
    /// Stay on one host until a connection fails.
    Disable,
}

/// One entry of `[databases]`: how a client-side database name maps to a server. Its Debug
/// form never shows the password.
#[derive(Clone, PartialEq, Default)]
pub struct DatabaseDef {
    /// Client-side name (the key), case kept.
    pub name: String,
    /// First host; `None` means a Unix socket in `unix_socket_dir`. A value starting with
    /// `/` is a socket directory, with `@` an abstract socket.
    pub host: Option<String>,
    /// Every host of a comma-separated `host` list, in order (empty when `host` is `None`).
    pub hosts: Vec<String>,
    /// Server port.
    pub port: u16,
    /// Server database name; `None` means the client-side name.
    pub dbname: Option<String>,
    /// Forced server user: one pool for the database.
    pub user: Option<String>,
    /// Password of the forced user; otherwise taken from the auth file.
    pub password: Option<String>,
    pub auth_user: Option<String>,
    pub auth_query: Option<String>,
    pub auth_dbname: Option<String>,
    pub pool_size: Option<u32>,
    pub min_pool_size: Option<u32>,
    /// `reserve_pool_size` (or its older name `reserve_pool`).
    pub reserve_pool: Option<u32>,
    pub pool_mode: Option<PoolMode>,
    pub max_db_connections: Option<u32>,
    pub max_db_client_connections: Option<u32>,
    pub server_lifetime: Option<Duration>,
    /// `Some(ZERO)` disables the wait limit for this database.
    pub query_wait_timeout: Option<Duration>,
    pub load_balance_hosts: LoadBalanceHosts,
    pub connect_query: Option<String>,
    pub client_encoding: Option<String>,
    pub datestyle: Option<String>,
    pub timezone: Option<String>,
    pub application_name: Option<String>,
}

impl std::fmt::Debug for DatabaseDef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatabaseDef")
            .field("name", &self.name)
            .field("hosts", &self.hosts)
            .field("port", &self.port)
            .field("dbname", &self.dbname)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "(hidden)"))
            .field("auth_user", &self.auth_user)
            .field("auth_dbname", &self.auth_dbname)
            .field("pool_size", &self.pool_size)
            .field("pool_mode", &self.pool_mode)
            .finish_non_exhaustive()
    }
}

impl DatabaseDef {
    /// The database name to ask the server for.
    pub fn target_dbname(&self) -> &str {
        self.dbname.as_deref().unwrap_or(&self.name)
    }

    /// The entry's server_lifetime, else `global`: 0 in an entry means the global value, as
    /// in PgBouncer.
    pub fn server_lifetime_or(&self, global: Duration) -> Duration {
        self.server_lifetime
            .filter(|l| !l.is_zero())
            .unwrap_or(global)
    }

    /// Whether the entry forces one server user (one pool per database).
    pub fn has_forced_user(&self) -> bool {
        self.user.is_some()
    }

    /// Parses the connection string `value` of entry `name`.
    pub fn parse(name: &str, value: &str) -> Result<DatabaseDef, String> {
        if name == ADMIN_DB {
            return Err(format!("database name \"{name}\" is reserved"));
        }
        let mut db = DatabaseDef {
            name: name.to_string(),
            port: 5432,
            ..DatabaseDef::default()
        };
        for (key, val) in connstr::parse(value)? {
            db.set(&key, val)?;
        }
        Ok(db)
    }

    fn set(&mut self, key: &str, val: String) -> Result<(), String> {
        match key {
            "host" => self.set_host(val),
            "port" => self.port = port(&val)?,
            "dbname" => self.dbname = Some(val),
            "user" => self.user = Some(val),
            "password" => self.password = Some(val),
            "auth_user" => self.auth_user = Some(val),
            "auth_query" => self.auth_query = Some(val),
            "auth_dbname" => self.auth_dbname = Some(val),
            "pool_size" => self.pool_size = cstr_count(&val)?,
            "min_pool_size" => self.min_pool_size = cstr_count(&val)?,
            "reserve_pool" | "reserve_pool_size" => self.reserve_pool = cstr_count(&val)?,
            "pool_mode" => self.pool_mode = Some(pool_mode(&val)?),
            "max_db_connections" => self.max_db_connections = cstr_count(&val)?,
            "max_db_client_connections" => self.max_db_client_connections = cstr_count(&val)?,
            "server_lifetime" => self.server_lifetime = cstr_seconds(&val)?,
            "query_wait_timeout" => self.query_wait_timeout = cstr_seconds(&val)?,
            "load_balance_hosts" => self.load_balance_hosts = load_balance(&val)?,
            "connect_query" => self.connect_query = Some(val),
            "client_encoding" => self.client_encoding = Some(val),
            "datestyle" => self.datestyle = Some(val),
            "timezone" => self.timezone = Some(val),
            "application_name" => self.application_name = Some(val),
            _ => return Err(format!("unrecognized connection parameter: {key}")),
        }
        Ok(())
    }

    fn set_host(&mut self, val: String) {
        self.hosts = val.split(',').map(str::trim).map(str::to_string).collect();
        self.host = self.hosts.first().cloned();
    }
}

/// Parses a `pool_mode` value of a connection string.
pub fn pool_mode(val: &str) -> Result<PoolMode, String> {
    PoolMode::parse(val).ok_or_else(|| format!("invalid pool mode: {val}"))
}

fn port(val: &str) -> Result<u16, String> {
    cstr_int(val)
        .ok()
        .and_then(|p| u16::try_from(p).ok())
        .filter(|p| *p != 0)
        .ok_or_else(|| format!("invalid port: {val}"))
}

fn load_balance(val: &str) -> Result<LoadBalanceHosts, String> {
    match val.to_ascii_lowercase().as_str() {
        "round-robin" => Ok(LoadBalanceHosts::RoundRobin),
        "disable" => Ok(LoadBalanceHosts::Disable),
        _ => Err(format!("invalid load_balance_hosts: {val}")),
    }
}

/// One entry of `[peers]`: another pooler process that cancel requests can be forwarded to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerDef {
    /// The peer's `peer_id` (1..=65535).
    pub id: u16,
    /// Host, or socket directory when it starts with `/`.
    pub host: String,
    /// Port (default 6432).
    pub port: u16,
    /// Most cancel requests in flight to this peer; `None` means `default_pool_size`.
    pub pool_size: Option<u32>,
}

impl PeerDef {
    /// Parses entry `name` (the peer id) with connection string `value`.
    pub fn parse(name: &str, value: &str) -> Result<PeerDef, String> {
        let id = name
            .parse::<u16>()
            .ok()
            .filter(|id| *id != 0)
            .ok_or("ids of peers must be a number between 1 and 65535")?;
        let (mut host, mut peer_port, mut pool_size) = (None, 6432, None);
        for (key, val) in connstr::parse(value)? {
            match key.as_str() {
                "host" => host = Some(val),
                "port" => peer_port = port(&val)?,
                "pool_size" => pool_size = cstr_count(&val)?,
                _ => return Err(format!("unrecognized connection parameter: {key}")),
            }
        }
        let host = host.ok_or_else(|| format!("host was not provided for peer {id}"))?;
        Ok(PeerDef {
            id,
            host,
            port: peer_port,
            pool_size,
        })
    }
}

/// A database's or user's own connection cap (max_db_connections, max_user_connections and
/// the client caps), as the caps read it: 0 (or none) leaves the global one in force, as
/// PgBouncer reads these. (Kept as given, so that `SET USER` can set 0.)
pub fn own_cap(n: Option<u32>) -> Option<u32> {
    n.filter(|n| *n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cap_of_zero_is_the_global_one() {
        let db = DatabaseDef::parse(
            "app",
            "host=h max_db_connections=0 max_db_client_connections=3",
        )
        .unwrap();
        assert_eq!(
            (
                own_cap(db.max_db_connections),
                own_cap(db.max_db_client_connections)
            ),
            (None, Some(3))
        );
    }

    #[test]
    fn full_entry() {
        let db = DatabaseDef::parse(
            "App",
            "host=10.0.0.5 port=5433 dbname=app_prod user=app password='p''w d' \
             pool_size=30 min_pool_size=2 reserve_pool=5 pool_mode=transaction \
             max_db_connections=50 connect_query='SET x=1' client_encoding=UTF8 \
             datestyle=ISO timezone=UTC application_name=svc server_lifetime=60 \
             query_wait_timeout=0 auth_user=auth load_balance_hosts=disable",
        )
        .unwrap();
        assert_eq!(db.name, "App");
        assert_eq!(db.host.as_deref(), Some("10.0.0.5"));
        assert_eq!(db.port, 5433);
        assert_eq!(db.target_dbname(), "app_prod");
        assert_eq!(db.password.as_deref(), Some("p'w d"));
        assert_eq!(db.pool_size, Some(30));
        assert_eq!(db.min_pool_size, Some(2));
        assert_eq!(db.reserve_pool, Some(5));
        assert_eq!(db.pool_mode, Some(PoolMode::Transaction));
        assert_eq!(db.max_db_connections, Some(50));
        assert_eq!(db.connect_query.as_deref(), Some("SET x=1"));
        assert_eq!(db.server_lifetime, Some(Duration::from_secs(60)));
        assert_eq!(db.query_wait_timeout, Some(Duration::ZERO));
        assert_eq!(db.load_balance_hosts, LoadBalanceHosts::Disable);
        assert!(db.has_forced_user());
    }

    #[test]
    fn empty_entry_is_unix_socket_same_name() {
        let db = DatabaseDef::parse("foodb", "").unwrap();
        assert_eq!(db.host, None);
        assert_eq!(db.port, 5432);
        assert_eq!(db.target_dbname(), "foodb");
    }

    #[test]
    fn host_list_and_socket_dir() {
        let db = DatabaseDef::parse("d", "host=a,b,c").unwrap();
        assert_eq!(db.host.as_deref(), Some("a"));
        assert_eq!(db.hosts, vec!["a", "b", "c"]);
        let db = DatabaseDef::parse("d", "host=/var/run/postgresql").unwrap();
        assert_eq!(db.host.as_deref(), Some("/var/run/postgresql"));
    }

    #[test]
    fn errors() {
        for (name, value) in [
            ("pgbouncer", "host=x"),
            ("d", "hostname=x"),
            ("d", "port=0"),
            ("d", "port=abc"),
            ("d", "pool_mode=fast"),
            ("d", "pool_size=ten"),
            ("d", "host"),
        ] {
            assert!(DatabaseDef::parse(name, value).is_err(), "{value}");
        }
    }

    #[test]
    fn peers() {
        let p = PeerDef::parse("2", "host=/tmp/pgbouncer2 port=5555 pool_size=4").unwrap();
        assert_eq!(
            (p.id, p.host.as_str(), p.port, p.pool_size),
            (2, "/tmp/pgbouncer2", 5555, Some(4))
        );
        assert_eq!(PeerDef::parse("1", "host=h").unwrap().port, 6432);
        assert!(PeerDef::parse("0", "host=h").is_err());
        assert!(PeerDef::parse("x", "host=h").is_err());
        assert!(PeerDef::parse("1", "port=1").is_err());
        assert!(PeerDef::parse("1", "host=h dbname=x").is_err());
    }
}
