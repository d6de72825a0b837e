//! Pools of server connections keyed by (database, user): checkout through the pool's wait
//! queue, check-in through a guard's Drop, sizes, growth, lifetimes and the maintenance pass.

mod closing;
mod dedicated;
mod growth;
mod guard;
#[allow(clippy::module_inception)]
mod pool;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use closing::{Closing, Renewal};
pub use dedicated::Dedicated;
pub use growth::{Growth, Limits, Usage};
pub use guard::ServerGuard;
pub use pool::{
    Handout, IdleServer, Pool, PoolMap, PoolStats, Queued, Taken, WaitLimits, WaitTimeout, Welcome,
};

use crate::config::PoolMode;
use crate::params::Tracked;
use crate::server::{Credential, ServerError, ServerTarget};
use crate::sync::lock;

/// A pool's identity: the database name clients ask for, and the user they log in as.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PoolKey {
    pub db: String,
    pub user: String,
}

/// How one pool behaves; replaced whole on reload.
#[derive(Debug, Clone)]
pub struct PoolSettings {
    pub target: ServerTarget,
    pub limits: Limits,
    pub mode: PoolMode,
    pub connect_timeout: Duration,
    /// query_wait_timeout: how long a ticket may wait for a server.
    pub query_wait: Option<Duration>,
    /// The global query_timeout, which bounds a wait for a server too (as in PgBouncer).
    pub query_timeout: Option<Duration>,
    pub login_retry: Duration,
    pub lifetime: Option<Duration>,
    pub idle_timeout: Option<Duration>,
    /// Run `check_query` on a server idle for longer than this; None never checks.
    pub check_delay: Option<Duration>,
    pub check_query: Option<String>,
    pub reset_query: Option<String>,
    pub reset_always: bool,
    /// `server_round_robin`: idle servers are taken in the order they came back (each used
    /// in turn) rather than the most recently used first.
    pub round_robin: bool,
    pub tracked: Arc<Tracked>,
    pub max_message: usize,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum PoolError {
    #[error("query_wait_timeout")]
    WaitTimeout,
    #[error("{0}")]
    Login(Arc<ServerError>),
    #[error("the pool is closed")]
    Closed,
    #[error("server shutting down")]
    ShuttingDown,
    #[error("query_timeout")]
    QueryTimeout,
}

/// Every pool, plus the counters shared by the pools of one database or one user.
#[derive(Debug, Default)]
pub struct Pools {
    map: Arc<Mutex<PoolMap>>,
    db_counts: Mutex<HashMap<String, Arc<AtomicUsize>>>,
    user_counts: Mutex<HashMap<String, Arc<AtomicUsize>>>,
    ids: Arc<AtomicU64>,
    /// The worker threads: a server opened on one is first offered to its sessions.
    workers: Arc<crate::workers::Workers>,
}

impl Pools {
    /// No pool yet, for a process with these worker threads.
    pub fn new(workers: Arc<crate::workers::Workers>) -> Self {
        Pools {
            workers,
            ..Pools::default()
        }
    }

    /// The pool for `key`, created with `settings()` if it does not exist yet.
    pub fn get_or_create(
        &self,
        key: &PoolKey,
        settings: impl FnOnce() -> PoolSettings,
        credential: Credential,
    ) -> Arc<Pool> {
        let mut map = lock(&self.map);
        if let Some(pool) = map.get(key) {
            return pool.clone();
        }
        let settings = settings();
        let db_count = counter(&self.db_counts, &key.db);
        let user_count = counter(&self.user_counts, &settings.target.user);
        let pool = Arc::new(Pool::new(
            key.clone(),
            settings,
            credential,
            db_count,
            user_count,
            (self.ids.clone(), self.workers.clone()),
            Arc::downgrade(&self.map),
        ));
        map.insert(key.clone(), pool.clone());
        pool
    }

    /// Frees the pools that have had no client and no server for `after` (pool_idle_timeout).
    pub fn free_idle(&self, after: Duration, now: std::time::Instant) {
        lock(&self.map).retain(|key, pool| {
            let idle = pool.idle_for(after, now);
            if idle {
                tracing::info!("{}/{}: cleaning up idle pool", key.db, key.user);
            }
            !idle
        });
    }

    /// Frees every pool of each auto-database (`is_auto`: served by the `*` entry) whose
    /// pools have all had no client and no server for `after` (autodb_idle_timeout), as
    /// PgBouncer frees the whole database; a paused one (`paused`) is kept.
    pub fn free_idle_auto(
        &self,
        after: Duration,
        now: std::time::Instant,
        is_auto: impl Fn(&str) -> bool,
        paused: impl Fn(&str) -> bool,
    ) {
        let mut map = lock(&self.map);
        let mut idle: HashMap<String, bool> = HashMap::new();
        for (key, pool) in map.iter() {
            if is_auto(&key.db) && !paused(&key.db) {
                let all = idle.entry(key.db.clone()).or_insert(true);
                *all = pool.idle_for(after, now) && *all;
            }
        }
        map.retain(|key, _| {
            let free = idle.get(&key.db).copied().unwrap_or(false);
            if free {
                tracing::info!("{}/{}: cleaning up idle pool", key.db, key.user);
            }
            !free
        });
    }

    /// A new socket id (clients and servers share the counter), from 1.
    pub fn next_socket_id(&self) -> u64 {
        self.ids.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1
    }

    pub fn get(&self, key: &PoolKey) -> Option<Arc<Pool>> {
        lock(&self.map).get(key).cloned()
    }

    pub fn all(&self) -> Vec<Arc<Pool>> {
        let mut pools: Vec<_> = lock(&self.map).values().cloned().collect();
        pools.sort_by(|a, b| a.key.cmp(&b.key));
        pools
    }
}

fn counter(map: &Mutex<HashMap<String, Arc<AtomicUsize>>>, name: &str) -> Arc<AtomicUsize> {
    lock(map).entry(name.to_string()).or_default().clone()
}
