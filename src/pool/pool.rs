//! One pool: idle servers, the gate's wait queue, and the servers being opened.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
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
}

impl Pool {
    pub(super) fn new(
        key: PoolKey,
        settings: PoolSettings,
        credential: Credential,
        db_count: Arc<AtomicUsize>,
        user_count: Arc<AtomicUsize>,
        ids: Arc<AtomicU64>,
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
        }
    }

    pub fn settings(&self) -> Arc<PoolSettings> {
        self.settings.load_full()
    }

    /// Replaces the settings; servers opened under the old ones stay until they are closed.
    pub fn set_settings(&self, settings: PoolSettings) {
        self.settings.store(Arc::new(settings));
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
    pub async fn checkout(
        self: &Arc<Self>,
        ticket: Ticket,
        wait: Option<Duration>,
    ) -> Result<ServerGuard, PoolError> {
        loop {
            let rx = match self.take_idle_or_enqueue(ticket.clone())? {
                Ok(conn) => match self.checked(conn).await {
                    Some(conn) => return Ok(ServerGuard::new(self.clone(), conn)),
                    None => continue,
                },
                Err(rx) => rx,
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
    /// both under the same lock means a server checked in meanwhile cannot be missed.
    #[allow(clippy::type_complexity)]
    fn take_idle_or_enqueue(
        self: &Arc<Self>,
        ticket: Ticket,
    ) -> Result<Result<ServerConn, oneshot::Receiver<Result<ServerGuard, PoolError>>>, PoolError>
    {
        let settings = self.settings.load();
        let now = Instant::now();
        let mut dead = Vec::new();
        let mut inner = lock(&self.inner);
        while let Some(conn) = inner.idle.pop() {
            if conn.is_alive() && !expired(&conn, settings.lifetime, now) {
                inner.active += 1;
                drop(inner);
                self.release_slots(dead.len());
                return Ok(Ok(conn));
            }
            dead.push(conn);
        }
        self.release_slots(dead.len());
        if let Some((at, err)) = &inner.failure {
            if inner.connecting == 0 && now.duration_since(*at) < settings.login_retry {
                return Err(PoolError::Login(err.clone()));
            }
        }
        let (tx, rx) = oneshot::channel();
        inner.waiters.push(ticket, tx);
        self.grow(&mut inner);
        Ok(Err(rx))
    }

    /// Runs `server_check_query` on a server that has been idle long enough to need it;
    /// returns the server if it passed.
    async fn checked(self: &Arc<Self>, mut conn: ServerConn) -> Option<ServerConn> {
        let settings = self.settings.load_full();
        let (Some(delay), Some(query)) = (settings.check_delay, &settings.check_query) else {
            return Some(conn);
        };
        if conn.last_used.elapsed() < delay {
            return Some(conn);
        }
        match conn.simple_query(query, &settings.tracked).await {
            Ok(()) if conn.is_clean() => Some(conn),
            _ => {
                conn.poison();
                self.checkin(conn);
                None
            }
        }
    }

    /// Takes a server back: to the first live waiter, to the idle list, or closed if it is
    /// not clean or too old.
    pub(super) fn checkin(self: &Arc<Self>, mut conn: ServerConn) {
        let settings = self.settings.load();
        let now = Instant::now();
        let keep = conn.is_clean() && !expired(&conn, settings.lifetime, now);
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
            None => inner.idle.push(conn),
        }
    }

    /// Opens servers while the gate says the pool should grow.
    fn grow(self: &Arc<Self>, inner: &mut Inner) {
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
            match settings.limits.growth(&usage, oldest) {
                Growth::Open | Growth::Reserve => {}
                _ => return,
            }
            if !self.acquire_slot(&settings.limits) {
                return;
            }
            inner.connecting += 1;
            let pool = self.clone();
            tokio::spawn(async move { pool.open_one().await });
        }
    }

    /// Counts one more server against max_db_connections and max_user_connections, unless
    /// either is reached.
    fn acquire_slot(&self, limits: &crate::gate::Limits) -> bool {
        if !try_increment(&self.db_count, limits.max_db_connections) {
            return false;
        }
        if !try_increment(&self.user_count, limits.max_user_connections) {
            self.db_count.fetch_sub(1, Ordering::AcqRel);
            return false;
        }
        true
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
        self.checkin(conn);
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
            self.grow(&mut inner);
        }
        for conn in closing {
            close_in_background(conn);
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
