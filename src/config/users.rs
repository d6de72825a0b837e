//! The `[users]` section and pgward's `[pools]` section.

use std::time::Duration;

use super::connstr;
use super::databases::pool_mode;
use super::settings::PoolMode;
use super::values::{cstr_count, cstr_seconds};

/// Per-user settings from `[users]`.
///
/// The per-user timeouts follow PgBouncer: a positive value overrides the global one and 0
/// (stored as `None`) leaves the global one in force, except `query_wait_timeout`, where an
/// explicit 0 (`Some(ZERO)`) disables the limit for the user.
#[derive(Debug, Clone, PartialEq, Default)]
#[allow(missing_docs)]
pub struct UserDef {
    /// User name (the key), case kept.
    pub name: String,
    pub pool_mode: Option<PoolMode>,
    pub max_user_connections: Option<u32>,
    pub max_user_client_connections: Option<u32>,
    /// Pool size for every pool of this user; wins over the database's.
    pub pool_size: Option<u32>,
    pub reserve_pool_size: Option<u32>,
    pub query_timeout: Option<Duration>,
    pub query_wait_timeout: Option<Duration>,
    pub idle_transaction_timeout: Option<Duration>,
    pub transaction_timeout: Option<Duration>,
    pub client_idle_timeout: Option<Duration>,
}

impl UserDef {
    /// Parses the settings `value` of user `name`.
    pub fn parse(name: &str, value: &str) -> Result<UserDef, String> {
        let mut user = UserDef {
            name: name.to_string(),
            ..UserDef::default()
        };
        for (key, val) in connstr::parse(value)? {
            user.set(&key, &val)?;
        }
        Ok(user)
    }

    fn set(&mut self, key: &str, val: &str) -> Result<(), String> {
        let positive = |v: &str| cstr_seconds(v).map(|d| d.filter(|d| !d.is_zero()));
        match key {
            "pool_mode" => self.pool_mode = Some(pool_mode(val)?),
            "pool_size" => self.pool_size = cstr_count(val)?,
            "reserve_pool_size" => self.reserve_pool_size = cstr_count(val)?,
            "max_user_connections" => self.max_user_connections = cstr_count(val)?,
            "max_user_client_connections" => self.max_user_client_connections = cstr_count(val)?,
            "query_timeout" => self.query_timeout = positive(val)?,
            "query_wait_timeout" => self.query_wait_timeout = cstr_seconds(val)?,
            "idle_transaction_timeout" => self.idle_transaction_timeout = positive(val)?,
            "transaction_timeout" => self.transaction_timeout = positive(val)?,
            "client_idle_timeout" => self.client_idle_timeout = positive(val)?,
            _ => return Err(format!("unrecognized user parameter: {key}")),
        }
        Ok(())
    }
}

/// A pool size for one (user, database) pair, from pgward's `[pools]` section:
/// `user.db = pool_size=N`. The key is split at its first `.`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolOverride {
    /// Server-side pool user.
    pub user: String,
    /// Client-side database name.
    pub db: String,
    /// Pool size; wins over the user's, the database's and the default.
    pub pool_size: Option<u32>,
}

impl PoolOverride {
    /// Parses entry `key` (`user.db`) with settings `value`.
    pub fn parse(key: &str, value: &str) -> Result<PoolOverride, String> {
        let (user, db) = key
            .split_once('.')
            .filter(|(u, d)| !u.is_empty() && !d.is_empty())
            .ok_or_else(|| format!("pool key \"{key}\" is not of the form user.database"))?;
        let mut pool_size = None;
        for (k, v) in connstr::parse(value)? {
            match k.as_str() {
                "pool_size" => pool_size = cstr_count(&v)?,
                _ => return Err(format!("unrecognized pool parameter: {k}")),
            }
        }
        Ok(PoolOverride {
            user: user.to_string(),
            db: db.to_string(),
            pool_size,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_settings() {
        let u = UserDef::parse(
            "Alice",
            "pool_mode=statement pool_size=3 max_user_connections=7 query_timeout=0 \
             transaction_timeout=30 query_wait_timeout=0",
        )
        .unwrap();
        assert_eq!(u.name, "Alice");
        assert_eq!(u.pool_mode, Some(PoolMode::Statement));
        assert_eq!(u.pool_size, Some(3));
        assert_eq!(u.max_user_connections, Some(7));
        assert_eq!(u.query_timeout, None);
        assert_eq!(u.transaction_timeout, Some(Duration::from_secs(30)));
        assert_eq!(u.query_wait_timeout, Some(Duration::ZERO));
        assert!(UserDef::parse("a", "host=x").is_err());
        assert!(UserDef::parse("a", "pool_mode=x").is_err());
    }

    #[test]
    fn pool_overrides() {
        let p = PoolOverride::parse("alice.app", "pool_size=4").unwrap();
        assert_eq!(
            (p.user.as_str(), p.db.as_str(), p.pool_size),
            ("alice", "app", Some(4))
        );
        let p = PoolOverride::parse("bob.app.v2", "pool_size=1").unwrap();
        assert_eq!(p.db, "app.v2");
        assert!(PoolOverride::parse("alice", "pool_size=4").is_err());
        assert!(PoolOverride::parse(".app", "pool_size=4").is_err());
        assert!(PoolOverride::parse("a.b", "size=4").is_err());
    }
}
