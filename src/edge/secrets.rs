//! `auth_query`: secrets of users who are not in the auth file, fetched from PostgreSQL
//! through a pool of `auth_user` and cached. A login that fails with a cached secret drops
//! it, so the next login fetches it again (a password changed in PostgreSQL takes effect
//! after one failure).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::config::{Config, Secret};
use crate::pool::{lock, PoolError};
use crate::runtime::Runtime;
use crate::server::ServerError;

/// Most secrets kept; when full the cache starts over.
const MAX_CACHED: usize = 10_000;

#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    #[error("auth_query: auth_dbname {0:?} is not in [databases]")]
    NoDatabase(String),
    #[error("auth_query: no server for auth_user: {0}")]
    Pool(#[from] PoolError),
    #[error("auth_query failed: {0}")]
    Server(#[from] ServerError),
}

/// Where a user's secret is looked up: the `[databases]` entry whose `auth_*` settings
/// apply, and the user.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SecretKey {
    pub database: String,
    pub user: String,
}

/// How to run `auth_query` for one client database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthSource {
    pub auth_user: String,
    pub query: String,
    /// The `[databases]` entry the query runs in.
    pub auth_database: String,
}

/// The `auth_query` settings for client database `database`, if `auth_user` is set for it
/// (in its `[databases]` entry or globally).
pub fn auth_source(config: &Config, database: &str) -> Option<AuthSource> {
    let db = config.database(database)?;
    let s = &config.settings;
    let auth_user = db.auth_user.clone().or_else(|| s.auth_user.clone())?;
    Some(AuthSource {
        auth_user,
        query: db
            .auth_query
            .clone()
            .unwrap_or_else(|| s.auth_query.clone()),
        auth_database: db
            .auth_dbname
            .clone()
            .or_else(|| s.auth_dbname.clone())
            .unwrap_or_else(|| database.to_string()),
    })
}

/// Fetched secrets.
#[derive(Debug, Default)]
pub struct SecretCache {
    entries: Mutex<HashMap<SecretKey, Secret>>,
}

impl SecretCache {
    pub fn get(&self, key: &SecretKey) -> Option<Secret> {
        lock(&self.entries).get(key).cloned()
    }

    pub fn put(&self, key: SecretKey, secret: Secret) {
        let mut entries = lock(&self.entries);
        if entries.len() >= MAX_CACHED && !entries.contains_key(&key) {
            entries.clear();
        }
        entries.insert(key, secret);
    }

    /// Drops a secret that failed a login.
    pub fn forget(&self, key: &SecretKey) {
        lock(&self.entries).remove(key);
    }

    /// Drops every secret (a reload).
    pub fn clear(&self) {
        lock(&self.entries).clear();
    }

    pub fn len(&self) -> usize {
        lock(&self.entries).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Where a secret came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    AuthFile,
    /// From auth_query (cached or fresh), under this key.
    AuthQuery(SecretKey),
    Nowhere,
}

/// The secret of `user` logging in to client database `database`: the auth file's, else
/// the cached or freshly fetched auth_query result.
pub async fn find_secret(
    rt: &Arc<Runtime>,
    database: &str,
    user: &str,
) -> Result<(Option<Secret>, Origin), LookupError> {
    if let Some(s) = rt.userlist.load().get(user) {
        return Ok((Some(s.clone()), Origin::AuthFile));
    }
    let Some(source) = auth_source(&rt.config.load(), database) else {
        return Ok((None, Origin::Nowhere));
    };
    let key = SecretKey {
        database: source.auth_database.clone(),
        user: user.to_string(),
    };
    if let Some(s) = rt.edge.secrets.get(&key) {
        return Ok((Some(s), Origin::AuthQuery(key)));
    }
    let fetched = fetch(rt, &source, user).await?;
    if let Some(s) = &fetched {
        rt.edge.secrets.put(key.clone(), s.clone());
    }
    Ok((fetched, Origin::AuthQuery(key)))
}

/// Runs auth_query for `user` on a server of the auth_user pool.
async fn fetch(
    rt: &Arc<Runtime>,
    source: &AuthSource,
    user: &str,
) -> Result<Option<Secret>, LookupError> {
    let db = rt
        .config
        .load()
        .database(&source.auth_database)
        .ok_or_else(|| LookupError::NoDatabase(source.auth_database.clone()))?;
    let pool = rt.pool_for(&db, &source.auth_user);
    let wait = pool.settings().query_wait;
    let ticket = crate::gate::Ticket::new(0, Instant::now());
    let mut server = pool.checkout(ticket, wait).await?;
    let tracked = rt.tracked.load_full();
    let row = server.query_row(&source.query, &[user], &tracked).await?;
    // The query answers (name, secret); a NULL secret or no row means no login.
    let secret = row
        .and_then(|r| r.into_iter().nth(1).flatten())
        .filter(|s| !s.is_empty());
    Ok(secret.map(Secret::classify))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn config(text: &str) -> Config {
        crate::config::parse_str(text, "t.ini", Path::new(".")).unwrap()
    }

    #[test]
    fn sources_follow_database_then_global_settings() {
        let c = config(
            "[databases]\n\
             app = host=h auth_user=dbauth auth_query='SELECT 1' auth_dbname=authdb\n\
             other = host=h\n\
             [pgbouncer]\nauth_user = global\n",
        );
        let app = auth_source(&c, "app").unwrap();
        assert_eq!(app.auth_user, "dbauth");
        assert_eq!(app.query, "SELECT 1");
        assert_eq!(app.auth_database, "authdb");
        let other = auth_source(&c, "other").unwrap();
        assert_eq!(other.auth_user, "global");
        assert_eq!(other.auth_database, "other");
        assert!(other.query.contains("pg_authid"));
        assert!(auth_source(&c, "missing").is_none());
        let none = config("[databases]\napp = host=h\n[pgbouncer]\n");
        assert!(auth_source(&none, "app").is_none());
    }

    #[test]
    fn cache_forgets_and_stays_bounded() {
        let cache = SecretCache::default();
        let key = |u: &str| SecretKey {
            database: "d".into(),
            user: u.into(),
        };
        cache.put(key("a"), Secret::classify("pw".into()));
        assert!(cache.get(&key("a")).is_some());
        cache.forget(&key("a"));
        assert!(cache.get(&key("a")).is_none());
        for i in 0..(MAX_CACHED + 10) {
            cache.put(key(&i.to_string()), Secret::classify("x".into()));
        }
        assert!(cache.len() <= MAX_CACHED);
    }
}
