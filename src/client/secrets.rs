//! `auth_query`: secrets of users who are not in the auth file, fetched from PostgreSQL
//! through a pool of `auth_user` at each login, as PgBouncer does. Nothing is cached: a
//! password changed with ALTER ROLE takes effect at the next login, and an old one never
//! gets in. The work this costs the server is bounded by the auth_user pool's size and,
//! for failing logins, by the throttle, which refuses before any lookup.

use std::sync::Arc;
use std::time::Instant;

use crate::config::{Config, Secret};
use crate::pool::PoolError;
use crate::runtime::Runtime;
use crate::server::ServerError;

#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    #[error("authentication database \"{0}\" is not configured")]
    NoDatabase(String),
    #[error("cannot use the reserved \"{0}\" database as an auth_dbname")]
    Reserved(String),
    #[error("authentication database \"{0}\" is disabled")]
    Disabled(String),
    #[error("auth_query: no server for auth_user: {0}")]
    Pool(#[from] PoolError),
    #[error("auth_query failed: {0}")]
    Server(#[from] ServerError),
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

/// Where a user's secret came from, and so whether pgward knows the user at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    AuthFile,
    /// auth_query answered a row for the user, just now (its secret may be NULL).
    AuthQuery,
    /// auth_query ran and answered no row: no such user.
    NoRow,
    /// Neither in the auth file nor looked up: no auth_query applies to the database.
    Nowhere,
}

/// The secret of `user` logging in to client database `database`: the auth file's, else
/// what auth_query answers now.
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
    Ok(match fetch(rt, &source, user).await? {
        Some(secret) => (secret, Origin::AuthQuery),
        None => (None, Origin::NoRow),
    })
}

/// Runs auth_query for `user` on a server of the auth_user pool: no row, or a row whose name
/// is NULL (what a lookup function returning a record answers for an unknown name), is
/// `None`; a row with a NULL or empty secret `Some(None)`.
async fn fetch(
    rt: &Arc<Runtime>,
    source: &AuthSource,
    user: &str,
) -> Result<Option<Option<Secret>>, LookupError> {
    let name = &source.auth_database;
    if name == crate::config::databases::ADMIN_DB {
        return Err(LookupError::Reserved(name.clone()));
    }
    let db = rt
        .config
        .load()
        .database(name)
        .ok_or_else(|| LookupError::NoDatabase(name.clone()))?;
    if rt.ops.control.get().is_disabled(name) {
        return Err(LookupError::Disabled(name.clone()));
    }
    let pool = rt.pool_as(&db, &source.auth_user);
    let wait = pool.settings().query_wait;
    let ticket = crate::gate::Ticket::new(0, Instant::now());
    let mut server = pool.checkout(ticket, wait).await?;
    let tracked = rt.tracked.load_full();
    let row = server.query_row(&source.query, &[user], &tracked).await?;
    // The query answers (name, secret); a NULL secret admits no password login.
    let Some(mut row) = row.filter(|r| r.first().is_some_and(Option::is_some)) else {
        return Ok(None);
    };
    let secret = row.get_mut(1).and_then(Option::take);
    Ok(Some(secret.filter(|s| !s.is_empty()).map(Secret::classify)))
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
}
