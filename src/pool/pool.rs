//! One pool: idle servers, the gate's wait queue, and the servers being opened.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use tokio::sync::oneshot;

use super::{lock, PoolError, PoolKey, PoolSettings, ServerGuard};
use crate::gate::{Growth, Ticket, Usage, WaitQueue};
use crate::server::{self, Credential, ServerConn, ServerError};

type Waiter = oneshot::Sender<Result<ServerGuard, PoolError>>;

/// The ParameterStatus list of a server login.
pub type Welcome = Arc<Vec<(String, String)>>;

/// How long a pool waits before opening again after the server could not be reached.
const TRANSIENT_RETRY: Duration = Duration::from_millis(500);

#[derive(Debug, Default)]
struct Inner {
    /// Idle servers, most recently used last.
    idle: Vec<ServerConn>,
    active: usize,
    connecting: usize,
    waiters: WaitQueue<Waiter>,
    /// The last login failure the server itself reported, and when.
    failure: Option<(Instant, Arc<ServerError>)>,
}

impl Inner {
    fn total(&self) -> usize {
        self.idle.len() + self.active + self.connecting
    }
}

/// Counts for SHOW POOLS and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    pub idle: usize,
    pub active: usize,
    pub connecting: usize,
    pub waiting: usize,
}

#[derive(Debug)]
pub struct Pool {
    pub key: PoolKey,
    settings: ArcSwap<PoolSettings>,
    credential: Mutex<Credential>,
    inner: Mutex<Inner>,
    welcome: Mutex<Option<Welcome>>,
    db_count: Arc<AtomicUsize>,
    user_count: Arc<AtomicUsize>,
    ids: Arc<AtomicU64>,
    /// Every pool, to make room under limits shared between pools.
    siblings: Weak<Mutex<PoolMap>>,
    /// Servers to close at check-in (RECONNECT, eviction).
    pub ops: crate::ops::PoolOps,
}

/// Pools by key.
pub type PoolMap = HashMap<PoolKey, Arc<Pool>>;

impl Pool {
    pub(super) fn new(
        key: PoolKey,
        settings: PoolSettings,
        credential: Credential,
        db_count: Arc<AtomicUsize>,
        user_count: Arc<AtomicUsize>,
        ids: Arc<AtomicU64>,
        siblings: Weak<Mutex<PoolMap>>,
    ) -> Self {
        Pool {
            key,
            settings: ArcSwap::from_pointee(settings),
            credential: Mutex::new(credential),
            inner: Mutex::new(Inner::default()),
            welcome: Mutex::new(None),
            db_count,
            user_count,
            ids,
            siblings,
            ops: Default::default(),
        }
    }

    pub fn settings(&self) -> Arc<PoolSettings> {
        self.settings.load_full()
    }

    /// The settings without taking a reference count, for a short look on the hot path.
    pub fn settings_now(&self) -> arc_swap::Guard<Arc<PoolSettings>> {
        self.settings.load()
    }

    /// Replaces the settings and the credential (a reload); servers opened under the old
    /// ones stay until they are closed, and a remembered login failure is forgotten so the
    /// new settings are tried at once.
    pub fn reconfigure(&self, settings: PoolSettings, credential: Credential) {
        self.settings.store(Arc::new(settings));
        *lock(&self.credential) = credential;
        lock(&self.inner).failure = None;
    }

    /// The credential pgward logs in to the server with.
    pub fn credential(&self) -> Credential {
        lock(&self.credential).clone()
    }

    /// Offers a better credential (SCRAM keys a client just proved); a configured password
    /// is never replaced.
    pub fn offer_credential(&self, credential: Credential) {
        let mut current = lock(&self.credential);
        if !matches!(*current, Credential::Password(_)) {
            *current = credential;
        }
    }

    /// The ParameterStatus list of the first server login, for client welcomes.
    pub fn welcome(&self) -> Option<Welcome> {
        lock(&self.welcome).clone()
    }

    pub fn stats(&self) -> PoolStats {
        let inner = lock(&self.inner);
        PoolStats {
            idle: inner.idle.len(),
            active: inner.active,
            connecting: inner.connecting,
            waiting: inner.waiters.len(),
        }
    }

    /// Waits in the gate's queue for a server. `wait` bounds the wait (query_wait_timeout).
    /// Dropping the future at any point loses nothing: a server travels as a guard.
    pub async fn checkout(
        self: &Arc<Self>,
        ticket: Ticket,
        wait: Option<Duration>,
    ) -> Result<ServerGuard, PoolError> {
        loop {
            let (taken, blocked) = self.take_idle_or_enqueue(ticket.clone())?;
            if let Some(growth) = blocked {
                self.relieve(growth);
            }
            let rx = match taken {
                Taken::Idle(guard) => match self.checked(guard).await {
                    Some(guard) => return Ok(guard),
                    None => continue,
                },
                Taken::Wait(rx) => rx,
            };
            let result = match wait {
                Some(limit) => match tokio::time::timeout(limit, rx).await {
                    Ok(r) => r,
                    Err(_) => return Err(PoolError::WaitTimeout),
                },
                None => rx.await,
            };
            return result.unwrap_or(Err(PoolError::Closed));
        }
    }

    /// Under one lock: take an idle server that is still alive, or join the queue. Doing
    /// both under the same lock means a server checked in meanwhile cannot be missed. Also
    /// says when the pool could not grow because a limit shared with other pools is reached.
    fn take_idle_or_enqueue(
        self: &Arc<Self>,
        ticket: Ticket,
    ) -> Result<(Taken, Option<Growth>), PoolError> {
        let settings = self.settings.load();
        let now = Instant::now();
        let mut dead = Vec::new();
        let mut inner = lock(&self.inner);
        while let Some(conn) = inner.idle.pop() {
            if conn.is_alive() && !expired(&conn, settings.lifetime, now) {
                inner.active += 1;
                drop(inner);
                self.release_slots(dead.len());
                return Ok((Taken::Idle(ServerGuard::new(self.clone(), conn)), None));
            }
            dead.push(conn);
        }
        self.release_slots(dead.len());
        if let Some(err) = recent_failure(&inner, settings.login_retry, now) {
            return Err(PoolError::Login(err));
        }
        let (tx, rx) = oneshot::channel();
        inner.waiters.push(ticket, tx);
        let growth = self.grow(&mut inner);
        Ok((Taken::Wait(rx), shared_limit(growth)))
    }

    /// Runs `server_check_query` on a server that has been idle long enough to need it,
    /// within server_connect_timeout; returns the server if it passed. A server that failed
    /// goes back through its guard, which closes it.
    async fn checked(self: &Arc<Self>, mut guard: ServerGuard) -> Option<ServerGuard> {
        let settings = self.settings.load_full();
        let (Some(delay), Some(query)) = (settings.check_delay, &settings.check_query) else {
            return Some(guard);
        };
        if guard.last_used.elapsed() < delay {
            return Some(guard);
        }
        let check = guard.simple_query(query, &settings.tracked);
        match tokio::time::timeout(settings.connect_timeout, check).await {
            Ok(Ok(())) if guard.is_clean() => Some(guard),
            _ => {
                guard.poison();
                None
            }
        }
    }

    /// A limit shared with other pools (max_db_connections, max_user_connections) keeps
    /// this pool from growing: close an idle server of another pool under the same limit,
    /// as PgBouncer does, and try again.
    fn relieve(self: &Arc<Self>, blocked: Growth) {
        let Some(siblings) = self.siblings.upgrade() else {
            return;
        };
        let others: Vec<Arc<Pool>> = lock(&siblings).values().cloned().collect();
        let server_user = &self.settings.load().target.user;
        let freed = others.iter().any(|other| {
            let shares = match blocked {
                Growth::DbFull => other.key.db == self.key.db,
                _ => &other.settings.load().target.user == server_user,
            };
            !Arc::ptr_eq(other, self) && shares && other.close_one_idle()
        });
        if freed {
            let mut inner = lock(&self.inner);
            self.grow(&mut inner);
        }
    }

    /// Closes the least recently used idle server, if there is one.
    fn close_one_idle(&self) -> bool {
        let conn = {
            let mut inner = lock(&self.inner);
            if inner.idle.is_empty() {
                return false;
            }
            inner.idle.remove(0)
        };
        self.release_slots(1);
        close_in_background(conn);
        true
    }

    /// Takes a server back: to the first live waiter, to the idle list, or closed if it is
    /// not clean or too old.
    pub(super) fn checkin(self: &Arc<Self>, conn: ServerConn) {
        self.place(conn, false);
    }

    /// Checks in a server, or (`fresh`) places one just opened for the pool's waiters: a
    /// fresh server serves a waiter even in a pool that closes its servers as they come back,
    /// and closes at once if no one waits there.
    fn place(self: &Arc<Self>, mut conn: ServerConn, fresh: bool) {
        let settings = self.settings.load();
        let now = Instant::now();
        let keep = conn.is_clean()
            && !expired(&conn, settings.lifetime, now)
            && (fresh || !self.ops.must_close(&conn));
        let mut inner = lock(&self.inner);
        inner.active = inner.active.saturating_sub(1);
        if !keep {
            self.release_slots(1);
            self.grow(&mut inner);
            drop(inner);
            close_in_background(conn);
            return;
        }
        conn.last_used = now;
        match inner.waiters.pop_next(|tx| !tx.is_closed()) {
            Some((_, tx)) => {
                inner.active += 1;
                drop(inner);
                // A waiter that left just now drops the guard, which checks the server in again.
                let _ = tx.send(Ok(ServerGuard::new(self.clone(), conn)));
            }
            None if fresh && self.ops.must_close(&conn) => {
                self.release_slots(1);
                drop(inner);
                close_in_background(conn);
            }
            None => inner.idle.push(conn),
        }
    }

    /// Opens servers while the gate says the pool should grow; returns the gate's last word.
    fn grow(self: &Arc<Self>, inner: &mut Inner) -> Growth {
        let settings = self.settings.load();
        inner.waiters.prune(|tx| !tx.is_closed());
        loop {
            let usage = Usage {
                pool_total: inner.total(),
                connecting: inner.connecting,
                waiting: inner.waiters.len(),
                db_total: self.db_count.load(Ordering::Acquire),
                user_total: self.user_count.load(Ordering::Acquire),
            };
            let oldest = inner.waiters.oldest_wait(Instant::now());
            let growth = settings.limits.growth(&usage, oldest);
            if !matches!(growth, Growth::Open | Growth::Reserve) {
                return growth;
            }
            if let Err(full) = self.acquire_slot(&settings.limits) {
                return full;
            }
            inner.connecting += 1;
            let pool = self.clone();
            tokio::spawn(async move { pool.open_one().await });
        }
    }

    /// Counts one more server against max_db_connections and max_user_connections, unless
    /// either is reached.
    fn acquire_slot(&self, limits: &crate::gate::Limits) -> Result<(), Growth> {
        if !try_increment(&self.db_count, limits.max_db_connections) {
            return Err(Growth::DbFull);
        }
        if !try_increment(&self.user_count, limits.max_user_connections) {
            self.db_count.fetch_sub(1, Ordering::AcqRel);
            return Err(Growth::UserFull);
        }
        Ok(())
    }

    fn release_slots(&self, n: usize) {
        if n > 0 {
            self.db_count.fetch_sub(n, Ordering::AcqRel);
            self.user_count.fetch_sub(n, Ordering::AcqRel);
        }
    }

    async fn open_one(self: Arc<Self>) {
        let settings = self.settings.load_full();
        let credential = lock(&self.credential).clone();
        let id = self.ids.fetch_add(1, Ordering::Relaxed) + 1;
        let result = server::connect(
            &settings.target,
            &credential,
            &settings.tracked,
            settings.connect_timeout,
            id,
            settings.max_message,
        )
        .await;
        match result {
            Ok(conn) => self.opened(conn),
            Err(err) => self.open_failed(err, &settings).await,
        }
    }

    fn opened(self: &Arc<Self>, conn: ServerConn) {
        tracing::debug!(pool = %self.key.db, user = %self.key.user, server = conn.id, "server connection opened");
        lock(&self.welcome).get_or_insert_with(|| Arc::new(conn.welcome.clone()));
        {
            let mut inner = lock(&self.inner);
            inner.connecting -= 1;
            inner.active += 1;
            inner.failure = None;
        }
        self.place(conn, true);
    }

    async fn open_failed(self: &Arc<Self>, err: ServerError, settings: &PoolSettings) {
        tracing::warn!(pool = %self.key.db, user = %self.key.user, server = %settings.target.addr, "server login failed: {err}");
        let err = Arc::new(err);
        if err.is_transient() {
            tokio::time::sleep(TRANSIENT_RETRY.min(settings.login_retry)).await;
        }
        let waiters: Vec<Waiter> = {
            let mut inner = lock(&self.inner);
            inner.connecting -= 1;
            self.release_slots(1);
            if err.is_transient() {
                self.grow(&mut inner);
                return;
            }
            inner.failure = Some((Instant::now(), err.clone()));
            inner.waiters.drain().map(|(_, w)| w).collect()
        };
        for w in waiters {
            let _ = w.send(Err(PoolError::Login(err.clone())));
        }
    }

    /// The periodic pass: closes idle servers that outlived server_lifetime or
    /// server_idle_timeout, or that the server closed; opens up to min_pool_size and the
    /// reserve for tickets that waited too long.
    pub fn maintain(self: &Arc<Self>, now: Instant) {
        let settings = self.settings.load();
        let mut closing = Vec::new();
        let blocked;
        {
            let mut inner = lock(&self.inner);
            let min = settings.limits.min_pool_size;
            let mut i = 0;
            while i < inner.idle.len() {
                let conn = &inner.idle[i];
                let idle_too_long = settings
                    .idle_timeout
                    .is_some_and(|t| now.saturating_duration_since(conn.last_used) >= t)
                    && inner.total() > min;
                if !conn.is_alive() || expired(conn, settings.lifetime, now) || idle_too_long {
                    closing.push(inner.idle.remove(i));
                } else {
                    i += 1;
                }
            }
            self.release_slots(closing.len());
            inner.waiters.prune(|tx| !tx.is_closed());
            let failing = recent_failure(&inner, settings.login_retry, now).is_some();
            blocked = if failing {
                None
            } else {
                shared_limit(self.grow(&mut inner))
            };
        }
        for conn in closing {
            close_in_background(conn);
        }
        if let Some(growth) = blocked {
            self.relieve(growth);
        }
    }

    /// Closes every idle server (a restart of the server was seen, or the pool is going away).
    pub fn close_idle(&self) {
        let idle: Vec<ServerConn> = std::mem::take(&mut lock(&self.inner).idle);
        self.release_slots(idle.len());
        for conn in idle {
            close_in_background(conn);
        }
    }
}

/// What the console and eviction need to see and do.
impl Pool {
    /// Closes the least recently used idle server; false if none is idle.
    pub fn evict_idle(&self) -> bool {
        self.close_one_idle()
    }

    /// The idle servers: (id, backend pid, address, opened at, last used).
    pub fn idle_servers(&self) -> Vec<IdleServer> {
        lock(&self.inner)
            .idle
            .iter()
            .map(|c| IdleServer {
                id: c.id,
                pid: c.key.pid,
                addr: c.addr.clone(),
                created: c.created,
                last_used: c.last_used,
            })
            .collect()
    }
}

/// An idle server as SHOW SERVERS lists it.
#[derive(Debug, Clone)]
pub struct IdleServer {
    pub id: u64,
    pub pid: u32,
    pub addr: Arc<crate::server::ServerAddr>,
    pub created: Instant,
    pub last_used: Instant,
}

/// What checkout found: an idle server, or a place in the queue.
#[allow(clippy::large_enum_variant)]
enum Taken {
    Idle(ServerGuard),
    Wait(oneshot::Receiver<Result<ServerGuard, PoolError>>),
}

/// The login failure the server reported within server_login_retry, while nothing is being
/// opened: new clients get it at once instead of waiting for a login that will fail again.
fn recent_failure(inner: &Inner, retry: Duration, now: Instant) -> Option<Arc<ServerError>> {
    let (at, err) = inner.failure.as_ref()?;
    (inner.connecting == 0 && now.duration_since(*at) < retry).then(|| err.clone())
}

/// The gate's answer when another pool's servers could make room.
fn shared_limit(growth: Growth) -> Option<Growth> {
    matches!(growth, Growth::DbFull | Growth::UserFull).then_some(growth)
}

fn expired(conn: &ServerConn, lifetime: Option<Duration>, now: Instant) -> bool {
    lifetime.is_some_and(|l| now.saturating_duration_since(conn.created) >= l)
}

fn try_increment(counter: &AtomicUsize, max: usize) -> bool {
    counter
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (max == 0 || n < max).then_some(n + 1)
        })
        .is_ok()
}

fn close_in_background(conn: ServerConn) {
    if tokio::runtime::Handle::try_current().is_ok() {
        tokio::spawn(conn.terminate());
    }
}
