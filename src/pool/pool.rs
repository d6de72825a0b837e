//! One pool: idle servers, the gate's wait queue, and the servers being opened.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use tokio::sync::oneshot;

use super::{Growth, PoolError, PoolKey, PoolSettings, ServerGuard, Usage};
use crate::gate::{Ticket, WaitQueue};
use crate::server::{self, Credential, ServerConn, ServerError};
use crate::sync::lock;

/// What a waiting client is handed through its channel.
type ServerAnswer = Result<Handout, PoolError>;

/// The ParameterStatus list of a server login.
pub type Welcome = Arc<Vec<(String, String)>>;

/// Slack in comparing a pool's idle time with pool_idle_timeout (see `Pool::idle_for`).
const IDLE_SLACK: Duration = Duration::from_millis(50);

/// How long a pool waits before opening again after the server could not be reached.
const TRANSIENT_RETRY: Duration = Duration::from_millis(500);

/// The queue's watchdog looks at the waiters at most this often. Each look walks the whole
/// queue, so with many waiters whose limits run out at different moments this bounds the
/// work to a few walks a second; a limit is then kept to within this much.
const WATCH_STEP: Duration = Duration::from_millis(100);

#[derive(Debug)]
struct Inner {
    /// The pool's settings, as `Pool::settings` has them: kept here too so that the hot
    /// paths, which hold this lock anyway, read them without another atomic load.
    settings: Arc<PoolSettings>,
    /// Idle servers, most recently used last. Boxed: a server moves between this list and
    /// the guards that lend it out as one pointer.
    #[allow(clippy::vec_box)]
    idle: Vec<Box<ServerConn>>,
    active: usize,
    /// Servers lent out that run server_check_query or server_reset_query now (counted in
    /// `active` too): SHOW POOLS' sv_tested, SHOW SERVERS' `tested`.
    tested: Vec<IdleServer>,
    /// When each server being opened began its connect (how many are being opened).
    connecting: Vec<Instant>,
    /// Servers opened for one replication client each: counted in the pool's size, never
    /// idle, never lent to anyone else.
    dedicated: usize,
    /// Replication clients waiting for room in the pool.
    room_waiters: usize,
    waiters: WaitQueue<ServerWaiter>,
    /// The last login failure the server itself reported, and when.
    failure: Option<(Instant, Arc<ServerError>)>,
    /// When a server was last closed for its server_lifetime: the next one waits
    /// server_lifetime / pool_size after it, as in PgBouncer, so servers opened together do
    /// not all close together.
    lifetime_closed: Option<Instant>,
    /// When the queue's watchdog looks at the waiters next, and which watchdog that is.
    alarm: Option<(Instant, u64)>,
    /// Watchdogs started so far (their ids).
    watchdogs: u64,
    /// Set once the pool refuses every wait (a shutdown): logins waiting for new
    /// parameters get it too.
    refusing: Option<PoolError>,
    /// Server logins refused for good (not for now) so far: a login waiting for new
    /// parameters gets the refusal that comes while it waits, whatever server_login_retry.
    refused_logins: u64,
    /// Whether min_pool_size is kept filled: the maintenance pass says so each time (a
    /// pool with a client, or of a database with a forced user). A new pool has a client
    /// or a forced user.
    min_wanted: bool,
}

impl Inner {
    fn new(settings: Arc<PoolSettings>) -> Self {
        Inner {
            settings,
            idle: Vec::new(),
            active: 0,
            tested: Vec::new(),
            connecting: Vec::new(),
            dedicated: 0,
            room_waiters: 0,
            waiters: WaitQueue::default(),
            failure: None,
            lifetime_closed: None,
            alarm: None,
            watchdogs: 0,
            refusing: None,
            refused_logins: 0,
            min_wanted: true,
        }
    }

    fn total(&self) -> usize {
        self.idle.len() + self.active + self.connecting.len() + self.dedicated
    }
}

/// Counts for SHOW POOLS and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    pub idle: usize,
    /// Servers lent out, `tested` among them.
    pub active: usize,
    pub tested: usize,
    pub connecting: usize,
    pub waiting: usize,
}

#[derive(Debug)]
pub struct Pool {
    pub key: PoolKey,
    /// The key's database and user, shared by the pool's sessions (the gate's keys that
    /// name them then compare by address).
    pub names: PoolNames,
    settings: ArcSwap<PoolSettings>,
    /// `server_reset_query_always`, read at every release without loading the settings.
    reset_always: AtomicBool,
    credential: Mutex<Credential>,
    inner: Mutex<Inner>,
    welcome: Mutex<WelcomeState>,
    db_count: Arc<AtomicUsize>,
    user_count: Arc<AtomicUsize>,
    ids: Arc<AtomicU64>,
    /// The worker threads (which one opened a server).
    workers: Arc<crate::workers::Workers>,
    /// Every pool, to make room under limits shared between pools.
    siblings: Weak<Mutex<PoolMap>>,
    /// Servers to close at check-in (RECONNECT, eviction).
    pub closing: super::Closing,
    /// Wakes replication clients waiting for room (see `room_waiters`).
    room: tokio::sync::Notify,
    /// Wakes logins waiting for the parameters of a server logged in after a RECONNECT: a
    /// login ended, done or failed.
    welcomed: tokio::sync::Notify,
    /// Wakes the servers being opened at a RECONNECT or a change of the connection string:
    /// those begun before it are dropped in their login.
    reconnected: tokio::sync::Notify,
    /// Since when the maintenance pass has seen the pool without clients or servers.
    empty_since: Mutex<Option<Instant>>,
}

/// Where a login waiting for new parameters stands (see [`Pool::renewed_welcome`]).
enum WelcomeOpening {
    /// A server whose connect began after the RECONNECT is being opened.
    Underway,
    /// None can be opened now: max_db_connections or max_user_connections is reached.
    NoRoom(Growth),
    /// The last login failed, within server_login_retry.
    Failed(Arc<ServerError>),
    /// The pool refuses every wait (a shutdown).
    Refused(PoolError),
    /// The database is paused: nothing is opened.
    Held,
}

/// The parameters new clients are welcomed with, and whether a RECONNECT made them old.
#[derive(Debug, Default)]
struct WelcomeState {
    params: Option<Welcome>,
    stale: bool,
}

/// A pool's database and user names, one allocation each for all of its sessions.
#[derive(Debug)]
pub struct PoolNames {
    pub database: Arc<str>,
    pub user: Arc<str>,
    /// The `search_path` of a session that set none (empty: the server's default).
    pub default_search_path: Arc<str>,
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
        (ids, workers): (Arc<AtomicU64>, Arc<crate::workers::Workers>),
        siblings: Weak<Mutex<PoolMap>>,
    ) -> Self {
        let settings = Arc::new(settings);
        Pool {
            names: PoolNames {
                database: Arc::from(key.db.as_str()),
                user: Arc::from(key.user.as_str()),
                default_search_path: Arc::from(""),
            },
            key,
            reset_always: AtomicBool::new(settings.reset_always),
            settings: ArcSwap::new(settings.clone()),
            credential: Mutex::new(credential),
            inner: Mutex::new(Inner::new(settings)),
            welcome: Mutex::new(WelcomeState::default()),
            db_count,
            user_count,
            ids,
            workers,
            siblings,
            closing: Default::default(),
            room: tokio::sync::Notify::new(),
            welcomed: tokio::sync::Notify::new(),
            reconnected: tokio::sync::Notify::new(),
            empty_since: Mutex::new(None),
        }
    }

    pub fn settings(&self) -> Arc<PoolSettings> {
        self.settings.load_full()
    }

    /// The settings without taking a reference count, for a short look on the hot path.
    pub fn settings_now(&self) -> arc_swap::Guard<Arc<PoolSettings>> {
        self.settings.load()
    }

    /// Whether `server_reset_query` runs after every transaction too
    /// (`server_reset_query_always`).
    pub fn resets_always(&self) -> bool {
        self.reset_always.load(Ordering::Acquire)
    }

    /// Replaces the settings and the credential (a reload); servers opened under the old
    /// ones stay until they are closed, and a remembered login failure is forgotten so the
    /// new settings are tried at once.
    pub fn reconfigure(&self, settings: PoolSettings, credential: Credential) {
        let settings = Arc::new(settings);
        self.reset_always
            .store(settings.reset_always, Ordering::Release);
        self.settings.store(settings.clone());
        *lock(&self.credential) = credential;
        let mut inner = lock(&self.inner);
        inner.settings = settings;
        inner.failure = None;
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

    /// The ParameterStatus list new clients are welcomed with: the first server login's,
    /// replaced by the first login begun after a RECONNECT once it is done.
    pub fn welcome(&self) -> Option<Welcome> {
        lock(&self.welcome).params.clone()
    }

    /// The welcome, unless a RECONNECT made it old since.
    pub fn current_welcome(&self) -> Option<Welcome> {
        let welcome = lock(&self.welcome);
        welcome.params.clone().filter(|_| !welcome.stale)
    }

    /// After a RECONNECT, waits up to `wait` for the parameters of a server whose login began
    /// after it, opening one unless one is being opened: above pool_size if the pool is full,
    /// as PgBouncer opens one for a login waiting for them; under max_db_connections and
    /// max_user_connections, after closing an idle server of another pool under the same
    /// limit, or once a server closes; and none while `held` says the database is paused.
    pub async fn renewed_welcome(
        self: &Arc<Self>,
        wait: Option<Duration>,
        held: impl Fn() -> bool,
    ) -> Result<Welcome, PoolError> {
        let deadline = wait.map(|w| Instant::now() + w);
        let refused_before = lock(&self.inner).refused_logins;
        loop {
            let notified = self.welcomed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(w) = self.current_welcome() {
                return Ok(w);
            }
            let opening = match held() {
                // Paused: nothing is opened; it looks again.
                true => WelcomeOpening::Held,
                false => self.open_for_welcome(refused_before),
            };
            let looks_again = match opening {
                WelcomeOpening::Underway => false,
                WelcomeOpening::Held => true,
                WelcomeOpening::NoRoom(blocked) => {
                    if self.make_room_elsewhere(blocked) {
                        // Room made: taken at once, before another pool takes it.
                        continue;
                    }
                    // A server closing elsewhere does not wake this wait: it looks again.
                    true
                }
                WelcomeOpening::Failed(err) => return Err(PoolError::Login(err)),
                WelcomeOpening::Refused(err) => return Err(err),
            };
            wait_turn(notified, deadline, looks_again).await?;
        }
    }

    /// Makes sure a server whose connect began after the last RECONNECT is being opened;
    /// `refused_before`: the logins refused for good when the wait began.
    fn open_for_welcome(self: &Arc<Self>, refused_before: u64) -> WelcomeOpening {
        let mut inner = lock(&self.inner);
        if let Some(err) = &inner.refusing {
            return WelcomeOpening::Refused(err.clone());
        }
        let settings = inner.settings.clone();
        // A login refused within server_login_retry is the answer, even while servers begun
        // before the RECONNECT are still logging in: no new one is tried before then.
        if let Some((_, err)) = &inner.failure {
            let refused_since = inner.refused_logins != refused_before;
            if refused_since || refused_lately(&inner, settings.login_retry) {
                return WelcomeOpening::Failed(err.clone());
            }
        }
        if inner
            .connecting
            .iter()
            .any(|at| !self.closing.opened_before(*at))
        {
            return WelcomeOpening::Underway;
        }
        if let Err(blocked) = self.count_server(&settings.limits) {
            return WelcomeOpening::NoRoom(blocked);
        }
        self.start_open(&mut inner);
        WelcomeOpening::Underway
    }

    /// Opens a server (already counted against the shared limits), counted as begun now.
    fn start_open(self: &Arc<Self>, inner: &mut Inner) {
        let begun = Instant::now();
        inner.connecting.push(begun);
        let pool = self.clone();
        tokio::spawn(async move { pool.open_one(begun).await });
    }

    pub fn stats(&self) -> PoolStats {
        let mut inner = lock(&self.inner);
        inner.waiters.prune(ServerWaiter::live);
        PoolStats {
            idle: inner.idle.len(),
            active: inner.active + inner.dedicated,
            tested: inner.tested.len(),
            connecting: inner.connecting.len(),
            waiting: inner.waiters.len(),
        }
    }

    /// Waits in the pool's queue for a server. `wait` bounds the wait (query_wait_timeout).
    /// Dropping the future at any point loses nothing: a server travels as a guard.
    pub async fn checkout(
        self: &Arc<Self>,
        ticket: Ticket,
        wait: Option<Duration>,
    ) -> Result<ServerGuard, PoolError> {
        let limits = WaitLimits {
            timeout: WaitTimeout::Given(wait),
            notify: None,
            home: None,
        };
        let mut handout = self.wait_for_server(ticket, limits).await?;
        loop {
            match handout {
                Handout::Server(guard) => return Ok(guard),
                Handout::StillQueued(queued) => handout = queued.await?,
            }
        }
    }

    /// Takes an idle server, or waits in the pool's queue for one, within `limits`. A client
    /// still queued after `limits.notify` is handed [`Handout::StillQueued`] once, and keeps
    /// its place. No timer is set per wait: the queue's watchdog sets one for the earliest
    /// moment any waiter needs.
    pub async fn wait_for_server(
        self: &Arc<Self>,
        ticket: Ticket,
        limits: WaitLimits,
    ) -> Result<Handout, PoolError> {
        loop {
            match self.take_or_queue(&ticket, limits, Instant::now())? {
                Taken::Idle(guard) => {
                    if let Some(guard) = self.checked(guard).await {
                        return Ok(Handout::Server(guard));
                    }
                }
                Taken::Wait(queued) => return queued.await,
            }
        }
    }

    /// The first step of [`wait_for_server`](Self::wait_for_server), with no future: an idle
    /// server taken (not checked yet, see [`checked`](Self::checked)), or the queue joined
    /// (what to await). Idle servers found dead or too old on the way are closed; a pool that
    /// a limit shared with other pools keeps from growing makes room. `now`: the clock's
    /// reading, taken by the caller.
    pub fn take_or_queue(
        self: &Arc<Self>,
        ticket: &Ticket,
        limits: WaitLimits,
        now: Instant,
    ) -> Result<Taken, PoolError> {
        let mut dead = Vec::new();
        let taken = self.take_idle_or_enqueue(ticket, (limits, now), &mut dead);
        if !dead.is_empty() {
            for (conn, reason) in dead {
                self.close(conn, reason);
            }
        }
        let (taken, blocked) = taken?;
        if let Some(growth) = blocked {
            self.relieve(growth);
        }
        Ok(taken)
    }

    /// Under one lock: take an idle server that is still alive, or join the queue. Doing
    /// both under the same lock means a server checked in meanwhile cannot be missed. Also
    /// says when the pool could not grow because a limit shared with other pools is reached.
    /// Idle servers found dead or too old are left in `dead`, uncounted, for the caller to
    /// close outside the lock (boxed, as they lie in the idle list).
    #[allow(clippy::vec_box)]
    fn take_idle_or_enqueue(
        self: &Arc<Self>,
        ticket: &Ticket,
        (limits, now): (WaitLimits, Instant),
        dead: &mut Vec<(Box<ServerConn>, &'static str)>,
    ) -> Result<(Taken, Option<Growth>), PoolError> {
        let mut inner = lock(&self.inner);
        let settings = inner.settings.clone();
        while let Some(conn) = next_idle(&mut inner, settings.round_robin, limits.home) {
            let reason = if !conn.is_alive() {
                "server conn crashed?"
            } else if idle_expired(&conn, &settings, now, &mut inner.lifetime_closed) {
                "server lifetime over"
            } else {
                inner.active += 1;
                drop(inner);
                self.uncount_servers(dead.len());
                return Ok((Taken::Idle(ServerGuard::new(self.clone(), conn)), None));
            };
            dead.push((conn, reason));
        }
        self.uncount_servers(dead.len());
        if let Some(err) = self.recent_failure(&inner, settings.login_retry) {
            return Err(PoolError::Login(err));
        }
        let timeout = match limits.timeout {
            WaitTimeout::Pool => settings.query_wait,
            WaitTimeout::Given(t) => t,
        };
        // As PgBouncer does, the global query_timeout also bounds a wait for a server (one
        // whose connects keep failing, say), when it comes before query_wait_timeout.
        let by_query = settings
            .query_timeout
            .filter(|q| timeout.is_none_or(|w| *q <= w));
        let (mut waiter, queued) =
            ServerWaiter::new(ticket, (by_query.or(timeout), limits.notify), now);
        if by_query.is_some() {
            waiter.expiry = PoolError::QueryTimeout;
        }
        waiter.home = limits.home;
        if let Some(at) = waiter.alarm() {
            self.arm(&mut inner, at);
        }
        inner.waiters.push_on(waiter.home, ticket.clone(), waiter);
        let growth = self.grow(&settings, &mut inner);
        Ok((Taken::Wait(queued), shared_limit(growth)))
    }

    /// Makes sure the queue's watchdog looks at the waiters by `at`.
    fn arm(self: &Arc<Self>, inner: &mut Inner, at: Instant) {
        if inner.alarm.is_some_and(|(armed, _)| armed <= at) {
            return;
        }
        inner.watchdogs += 1;
        let id = inner.watchdogs;
        inner.alarm = Some((at, id));
        tokio::spawn(watch_queue(Arc::downgrade(self), at, id));
    }

    /// The watchdog's look at the queue: waiters past query_wait_timeout are refused, those
    /// past query_wait_notify are told once, and those that left are dropped. Returns when
    /// to look next; None when watchdog `id` has nothing left to watch (or was replaced).
    fn expire_waiters(&self, id: u64, now: Instant) -> Option<Instant> {
        let mut inner = lock(&self.inner);
        if inner.alarm.map(|(_, armed)| armed) != Some(id) {
            return None;
        }
        let mut next: Option<Instant> = None;
        inner.waiters.retain_map(|waiter| {
            let waiter = waiter.expire(now)?;
            next = earliest(next, waiter.alarm());
            Some(waiter)
        });
        let next = next.map(|at| at.max(now + WATCH_STEP));
        inner.alarm = next.map(|at| (at, id));
        next
    }

    /// Runs `server_check_query` on a server that has been idle long enough to need it,
    /// within server_connect_timeout; returns the server if it passed. A server that failed
    /// goes back through its guard, which closes it.
    pub async fn checked(self: &Arc<Self>, mut guard: ServerGuard) -> Option<ServerGuard> {
        let settings = self.settings.load_full();
        let Some(query) = check_query_due(&settings, &guard, Instant::now()) else {
            return Some(guard);
        };
        let _tested = self.testing(&guard);
        let check = guard.simple_query(query, &settings.tracked);
        match tokio::time::timeout(settings.connect_timeout, check).await {
            Ok(Ok(())) if guard.is_clean() => Some(guard),
            _ => {
                guard.poison();
                None
            }
        }
    }

    /// Whether [`checked`](Self::checked) runs `server_check_query` on `guard`: it has been
    /// idle at least server_check_delay by `now`.
    pub fn check_due(&self, guard: &ServerGuard, now: Instant) -> bool {
        check_query_due(&self.settings.load(), guard, now).is_some()
    }

    /// A limit shared with other pools (max_db_connections, max_user_connections) keeps
    /// this pool from growing: close an idle server of another pool under the same limit,
    /// as PgBouncer does, and try again.
    fn relieve(self: &Arc<Self>, blocked: Growth) -> bool {
        let Some(siblings) = self.siblings.upgrade() else {
            return false;
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
            let settings = self.settings.load();
            let mut inner = lock(&self.inner);
            self.grow(&settings, &mut inner);
        }
        freed
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
        self.uncount_servers(1);
        self.close(conn, "evicted");
        true
    }

    /// Takes a server back: to the first live waiter, to the idle list, or closed if it is
    /// not clean or too old.
    pub(super) fn checkin(self: &Arc<Self>, conn: Box<ServerConn>) {
        self.place(conn, false);
    }

    /// Takes back a server that is to close now, not to be kept.
    pub(super) fn discard(self: &Arc<Self>, conn: Box<ServerConn>, reason: &str) {
        {
            let mut inner = lock(&self.inner);
            inner.active = inner.active.saturating_sub(1);
            self.uncount_servers(1);
            let settings = inner.settings.clone();
            self.grow(&settings, &mut inner);
        }
        self.close(conn, reason);
    }

    /// Checks in a server, or (`fresh`) places one just opened for the pool's waiters: a
    /// fresh server serves a waiter even in a pool that closes its servers as they come back
    /// (or whose server_lifetime is 0, where each server serves once, as in PgBouncer), and
    /// closes at once if no one waits there.
    pub(super) fn place(self: &Arc<Self>, mut conn: Box<ServerConn>, fresh: bool) {
        let now = Instant::now();
        let mut inner = lock(&self.inner);
        // In this order: `must_close` forgets an eviction as it answers.
        let close = if !conn.is_clean() {
            Some("server not clean at check-in")
        } else if fresh && self.closing.outdated(&conn) {
            // Begun before a RECONNECT or a changed connection string: another is opened
            // for the waiters.
            Some("obsolete connection")
        } else if fresh {
            None
        } else if lifetime_over(&mut inner, &conn, now) {
            Some("server lifetime over")
        } else if self.closing.must_close(&conn) {
            Some("obsolete connection")
        } else {
            None
        };
        if let Some(reason) = close {
            drop(inner);
            self.discard(conn, reason);
            return;
        }
        inner.active = inner.active.saturating_sub(1);
        conn.last_used = now;
        // A waiter on the thread whose reactor serves the server first, within bounds.
        let next = match conn.home {
            None => inner.waiters.pop_next(ServerWaiter::live),
            Some(home) => inner.waiters.pop_preferring(home, ServerWaiter::live),
        };
        match next {
            Some((_, waiter)) => {
                inner.active += 1;
                drop(inner);
                // A waiter that left just now drops the guard, which checks the server in again.
                waiter.hand(Handout::Server(ServerGuard::new(self.clone(), conn)));
            }
            None if fresh && self.closing.must_close(&conn) => {
                self.uncount_servers(1);
                drop(inner);
                self.close(conn, "obsolete connection");
            }
            None => {
                inner.idle.push(conn);
                // An idle server can be evicted to make room for a replication client.
                if inner.room_waiters > 0 {
                    self.room.notify_waiters();
                }
            }
        }
    }

    /// Opens servers while the gate says the pool should grow; returns the gate's last word.
    fn grow(self: &Arc<Self>, settings: &PoolSettings, inner: &mut Inner) -> Growth {
        if refused_lately(inner, settings.login_retry) {
            // As PgBouncer: no login is tried again within server_login_retry of one the
            // server refused (its waiters wait for the servers the pool has), and no room is
            // made for one under a shared limit.
            return Growth::NotNeeded;
        }
        let mut pruned = false;
        loop {
            let growth = self.growth(settings, inner);
            if matches!(growth, Growth::NotNeeded | Growth::PoolFull) {
                // Waiters that left only count towards growing: dropping them first could
                // not change either answer.
                return growth;
            }
            if !pruned {
                inner.waiters.prune(ServerWaiter::live);
                pruned = true;
                continue;
            }
            if !matches!(growth, Growth::Open | Growth::Reserve) {
                return growth;
            }
            if !inner.connecting.is_empty() && settings.target.hosts.probing() {
                // One attempt at a time until the current host of the list answers.
                return Growth::NotNeeded;
            }
            if let Err(full) = self.count_server(&settings.limits) {
                return full;
            }
            if growth == Growth::Reserve {
                // PgBouncer's words (a warning there too), which operators grep for.
                tracing::warn!(pool = %self.key.db, user = %self.key.user, "taking connection from reserve_pool");
            }
            self.start_open(inner);
        }
    }

    /// The gate's answer for the pool as it is. The oldest ticket's wait (a walk through the
    /// queue) matters only for the reserve, so it is measured only when the reserve may open.
    fn growth(&self, settings: &PoolSettings, inner: &Inner) -> Growth {
        let limits = &settings.limits;
        let usage = Usage {
            pool_total: inner.total(),
            connecting: inner.connecting.len(),
            waiting: inner.waiters.len(),
            db_total: self.db_count.load(Ordering::Acquire),
            user_total: self.user_count.load(Ordering::Acquire),
            min_wanted: inner.min_wanted,
        };
        let growth = limits.growth(&usage, None);
        let reserve_may_open = growth == Growth::PoolFull
            && limits.reserve_pool_size > 0
            && usage.waiting > usage.connecting;
        if !reserve_may_open {
            return growth;
        }
        limits.growth(&usage, inner.waiters.oldest_wait(Instant::now()))
    }

    /// Counts one more server against max_db_connections and max_user_connections, unless
    /// either is reached.
    fn count_server(&self, limits: &super::Limits) -> Result<(), Growth> {
        if !try_increment(&self.db_count, limits.max_db_connections) {
            return Err(Growth::DbFull);
        }
        if !try_increment(&self.user_count, limits.max_user_connections) {
            self.db_count.fetch_sub(1, Ordering::AcqRel);
            return Err(Growth::UserFull);
        }
        Ok(())
    }

    /// Gives back what [`Self::count_server`] counted, for `n` servers.
    fn uncount_servers(&self, n: usize) {
        if n > 0 {
            self.db_count.fetch_sub(n, Ordering::AcqRel);
            self.user_count.fetch_sub(n, Ordering::AcqRel);
            // Not the hot path (a server closes): replication clients may be waiting for room.
            self.room.notify_waiters();
        }
    }

    /// Closes a server that is no longer counted, with PgBouncer's log line for it.
    pub(super) fn close(&self, conn: Box<ServerConn>, reason: &str) {
        if self.settings_now().target.log.disconnections {
            let age = conn.created.elapsed().as_secs();
            tracing::info!(server = conn.id, pool = %self.key.db, user = %self.key.user, "closing because: {reason} (age={age}s)");
        }
        if tokio::runtime::Handle::try_current().is_ok() {
            tokio::spawn(conn.terminate());
        }
    }

    /// Opens one server, whose connect was counted as begun at `begun`.
    async fn open_one(self: Arc<Self>, begun: Instant) {
        let settings = self.settings.load_full();
        let id = self.next_server_id();
        let connect = self.connect(&settings.target, &settings, id);
        tokio::pin!(connect);
        let result = loop {
            let reconnected = self.reconnected.notified();
            tokio::pin!(reconnected);
            reconnected.as_mut().enable();
            if let Some(why) = self.closing.dropped(begun) {
                // A RECONNECT or a new connection string since it began: dropped in its
                // login, as PgBouncer drops such servers, rather than waited for.
                return self.open_dropped(begun, why);
            }
            tokio::select! {
                result = &mut connect => break result,
                () = &mut reconnected => {}
            }
        };
        match result {
            Ok(mut conn) => {
                // Opened when its connect was counted, before it read the settings: a
                // RECONNECT or reload after that replaces it whichever settings it read.
                conn.created = begun;
                // Its socket is served by this thread's reactor (the task runs on one thread).
                conn.home = self.workers.current();
                self.opened(Box::new(conn), begun)
            }
            Err(err) => self.open_failed(err, &settings, begun).await,
        }
    }

    /// A server being opened, counted as begun at `begun`, was dropped in its login.
    fn open_dropped(self: &Arc<Self>, begun: Instant, why: super::Renewal) {
        if self.settings_now().target.log.disconnections {
            let age = begun.elapsed().as_secs();
            let reason = why.login_reason();
            tracing::info!(pool = %self.key.db, user = %self.key.user, "closing because: {reason} (age={age}s)");
        }
        {
            let mut inner = lock(&self.inner);
            forget_connect(&mut inner, begun);
            self.uncount_servers(1);
            // Waiters it was opened for get one opened under the new settings.
            let settings = inner.settings.clone();
            self.grow(&settings, &mut inner);
        }
        self.welcomed.notify_waiters();
    }

    /// Whether a server still being opened began its connect before the last RECONNECT or
    /// change of the connection string: it is being dropped (WAIT_CLOSE waits until it is).
    pub fn opening_outdated(&self) -> bool {
        let begun = lock(&self.inner).connecting.clone();
        begun.into_iter().any(|at| self.closing.opened_before(at))
    }

    fn opened(self: &Arc<Self>, conn: Box<ServerConn>, begun: Instant) {
        tracing::debug!(pool = %self.key.db, user = %self.key.user, server = conn.id, "server connection opened");
        {
            // The first login's parameters welcome new clients; after a RECONNECT, those of
            // the first login begun after it (looked at under the welcome's lock, which a
            // RECONNECT takes after marking what it closes).
            let mut welcome = lock(&self.welcome);
            let wanted = welcome.params.is_none() || welcome.stale;
            if wanted && !self.closing.close_needed(conn.id, conn.created) {
                welcome.params = Some(Arc::new(conn.welcome.clone()));
                welcome.stale = false;
            }
        }
        self.welcomed.notify_waiters();
        {
            let mut inner = lock(&self.inner);
            forget_connect(&mut inner, begun);
            inner.active += 1;
            inner.failure = None;
        }
        self.place(conn, true);
        // Opening may have waited for this one (a host list being probed).
        let mut inner = lock(&self.inner);
        let settings = inner.settings.clone();
        if settings.target.hosts.is_list() {
            self.grow(&settings, &mut inner);
        }
    }

    async fn open_failed(
        self: &Arc<Self>,
        err: ServerError,
        settings: &PoolSettings,
        begun: Instant,
    ) {
        tracing::warn!(pool = %self.key.db, user = %self.key.user, server = %settings.target.hosts.first(), "server login failed: {err}");
        if settings.target.log.disconnections {
            tracing::info!(pool = %self.key.db, user = %self.key.user, "closing because: {} (age=0s)", err.closing_reason());
        }
        let err = Arc::new(err);
        if err.is_transient() {
            tokio::time::sleep(TRANSIENT_RETRY.min(settings.login_retry)).await;
        }
        let waiters: Vec<ServerWaiter> = {
            let mut inner = lock(&self.inner);
            forget_connect(&mut inner, begun);
            self.uncount_servers(1);
            if err.is_transient() {
                // Tried again for the queue's waiters, and for logins waiting for new
                // parameters (woken below).
                let settings = inner.settings.clone();
                self.grow(&settings, &mut inner);
                Vec::new()
            } else {
                inner.failure = Some((Instant::now(), err.clone()));
                inner.refused_logins += 1;
                // As PgBouncer: the queue is refused only when the pool has no server that
                // can serve it; otherwise it waits for the servers the pool has.
                match self.serves_queue(&inner) {
                    true => Vec::new(),
                    false => inner.waiters.drain().map(|(_, w)| w).collect(),
                }
            }
        };
        self.welcomed.notify_waiters();
        for w in waiters {
            w.refuse(PoolError::Login(err.clone()));
        }
    }

    /// The periodic pass: closes idle servers that outlived server_lifetime or
    /// server_idle_timeout, or that the server closed; opens up to min_pool_size and the
    /// reserve for tickets that waited too long. `min_wanted`: whether the pool has a client
    /// or a forced user, without which PgBouncer does not fill min_pool_size.
    pub fn maintain(self: &Arc<Self>, now: Instant, min_wanted: bool) {
        let settings = self.settings.load();
        let mut closing = Vec::new();
        let blocked;
        {
            let mut inner = lock(&self.inner);
            inner.min_wanted = min_wanted;
            let min = settings.limits.min_pool_size;
            let mut i = 0;
            while i < inner.idle.len() {
                let total = inner.total();
                let inner = &mut *inner;
                let conn = &inner.idle[i];
                let idle_too_long = settings
                    .idle_timeout
                    .is_some_and(|t| now.saturating_duration_since(conn.last_used) >= t)
                    && total > min;
                let reason = if !conn.is_alive() {
                    Some("server conn crashed?")
                } else if idle_expired(conn, &settings, now, &mut inner.lifetime_closed) {
                    Some("server lifetime over")
                } else if idle_too_long {
                    Some("server idle timeout")
                } else {
                    None
                };
                match reason {
                    Some(reason) => closing.push((inner.idle.remove(i), reason)),
                    None => i += 1,
                }
            }
            self.uncount_servers(closing.len());
            inner.waiters.prune(ServerWaiter::live);
            let failing = self.recent_failure(&inner, settings.login_retry).is_some();
            let growth = (!failing).then(|| self.grow(&settings, &mut inner));
            // As PgBouncer, min_pool_size is filled without closing another pool's servers
            // under a shared limit: only waiters make room.
            let uncovered = inner.waiters.len() > inner.connecting.len();
            blocked = growth.and_then(shared_limit).filter(|_| uncovered);
        }
        for (conn, reason) in closing {
            self.close(conn, reason);
        }
        if let Some(growth) = blocked {
            self.relieve(growth);
        }
    }

    /// Refuses every client queued for a server now, and every login waiting for new
    /// parameters from now on (the pooler shuts down).
    pub fn refuse_waiters(&self, err: PoolError) {
        let waiters: Vec<ServerWaiter> = {
            let mut inner = lock(&self.inner);
            inner.refusing = Some(err.clone());
            inner.waiters.drain().map(|(_, w)| w).collect()
        };
        self.welcomed.notify_waiters();
        for w in waiters {
            w.refuse(err.clone());
        }
    }

    /// Closes at most `n` idle servers whose last tenant `belongs` says is the one to evict,
    /// the least recently used first; how many it closed.
    pub fn close_idle_of(
        &self,
        n: usize,
        belongs: impl Fn(Option<&str>) -> bool,
        reason: &str,
    ) -> usize {
        let picked: Vec<Box<ServerConn>> = {
            let mut inner = lock(&self.inner);
            let mut picked = Vec::new();
            let mut i = 0;
            // The idle list is kept most recently used last.
            while i < inner.idle.len() && picked.len() < n {
                if belongs(inner.idle[i].last_tenant.as_deref()) {
                    picked.push(inner.idle.remove(i));
                } else {
                    i += 1;
                }
            }
            picked
        };
        self.uncount_servers(picked.len());
        let closed = picked.len();
        for conn in picked {
            self.close(conn, reason);
        }
        closed
    }

    /// Closes every idle server (a restart of the server was seen, the configuration
    /// changed, or the pool is going away); `reason` is logged for each.
    pub fn close_idle(&self, reason: &str) {
        let idle: Vec<Box<ServerConn>> = std::mem::take(&mut lock(&self.inner).idle);
        self.uncount_servers(idle.len());
        for conn in idle {
            self.close(conn, reason);
        }
    }
}

/// What [`Pool::reserve_dedicated`] found.
pub(super) enum Room {
    /// One more server is counted for the caller.
    Reserved,
    /// An idle server was evicted to make room: ask again.
    Evicted,
    /// No room: the pool or a limit it shares is full.
    Full(Growth),
}

/// Servers of their own for replication clients: counted in the pool's size and in the
/// limits it shares, never idle, never lent to anyone else.
impl Pool {
    /// Counts one dedicated server if there is room. Without room, the pool's least recently
    /// used idle server is evicted first, as PgBouncer does.
    pub(super) fn reserve_dedicated(self: &Arc<Self>) -> Room {
        let mut inner = lock(&self.inner);
        let limits = &inner.settings.limits;
        let full = if limits.pool_size > 0 && inner.total() >= limits.pool_size {
            Some(Growth::PoolFull)
        } else {
            self.count_server(limits).err()
        };
        let Some(full) = full else {
            inner.dedicated += 1;
            return Room::Reserved;
        };
        if inner.idle.is_empty() {
            return Room::Full(full);
        }
        let conn = inner.idle.remove(0);
        drop(inner);
        self.uncount_servers(1);
        self.close(conn, "evicted");
        Room::Evicted
    }

    /// Resolves when the room may have changed (a server closed or went idle). Taken before
    /// [`Self::reserve_dedicated`] looks, so no change after that look is missed.
    pub(super) fn room_changed(&self) -> tokio::sync::futures::Notified<'_> {
        self.room.notified()
    }

    /// Counts a replication client that waits for room (`true`) or no longer does: a
    /// server going idle wakes them only while there are some.
    pub(super) fn count_room_waiter(&self, waits: bool) {
        let mut inner = lock(&self.inner);
        inner.room_waiters = match waits {
            true => inner.room_waiters + 1,
            false => inner.room_waiters.saturating_sub(1),
        };
    }

    /// Gives back a dedicated server's place; its connection is closed by the caller.
    pub(super) fn release_dedicated(self: &Arc<Self>) {
        let mut inner = lock(&self.inner);
        inner.dedicated = inner.dedicated.saturating_sub(1);
        self.uncount_servers(1);
        let settings = inner.settings.clone();
        self.grow(&settings, &mut inner);
    }

    /// Frees a limit shared with other pools by evicting one of their idle servers; whether
    /// one was.
    pub(super) fn make_room_elsewhere(self: &Arc<Self>, blocked: Growth) -> bool {
        matches!(blocked, Growth::DbFull | Growth::UserFull) && self.relieve(blocked)
    }

    /// Opens and logs in one server for this pool, to `target`.
    pub(super) async fn connect(
        &self,
        target: &crate::server::ServerTarget,
        settings: &PoolSettings,
        id: u64,
    ) -> Result<ServerConn, ServerError> {
        let credential = self.credential();
        server::connect(
            target,
            &credential,
            &settings.tracked,
            settings.connect_timeout,
            id,
            settings.max_message,
        )
        .await
    }

    /// Servers opened (their connect begun) before `now` close when they come back, idle ones
    /// at once with `reason`, those still logging in at once too (`connect string changed`,
    /// as in PgBouncer), and none of them serves again; new clients are welcomed with
    /// the parameters of a login begun after it (a server upgraded, a database's default
    /// changed), waiting for one (see [`Self::renewed_welcome`]).
    pub fn reconnect(&self, now: Instant, why: super::Renewal) {
        self.closing.reconnect(now, why);
        lock(&self.welcome).stale = true;
        self.reconnected.notify_waiters();
        self.close_idle(why.idle_reason());
    }

    /// A new server id, from the ids all pools share.
    pub(super) fn next_server_id(&self) -> u64 {
        self.ids.fetch_add(1, Ordering::Relaxed) + 1
    }
}

impl Pool {
    /// Whether the pool has had no client and no server for `after` (pool_idle_timeout),
    /// as the maintenance passes saw it. `self` is the pool map's own reference, looked at
    /// under the map's lock, so a session's reference is another count and no client can
    /// pick the pool meanwhile. A pool that keeps min_pool_size filled (a forced user's) is never
    /// idle.
    pub(super) fn idle_for(self: &Arc<Self>, after: Duration, now: Instant) -> bool {
        let empty = {
            let inner = lock(&self.inner);
            Arc::strong_count(self) == 1
                && inner.total() == 0
                && inner.waiters.is_empty()
                && (inner.settings.limits.min_filled() == 0 || !inner.min_wanted)
        };
        let mut since = lock(&self.empty_since);
        if !empty {
            *since = None;
            return false;
        }
        let since = *since.get_or_insert(now);
        // The passes come about a second apart, not exactly: a little slack keeps a timeout
        // of N seconds from taking N + 1 passes.
        now.saturating_duration_since(since) + IDLE_SLACK >= after
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
            .map(|c| IdleServer::of(c))
            .collect()
    }

    /// The servers that run server_check_query or server_reset_query now (see
    /// [`testing`](Self::testing)).
    pub fn tested_servers(&self) -> Vec<IdleServer> {
        lock(&self.inner).tested.clone()
    }

    /// `conn`, lent out, runs server_check_query or server_reset_query until the result is
    /// dropped: SHOW POOLS counts it in sv_tested rather than sv_active, and SHOW SERVERS
    /// lists it as `tested`, as PgBouncer does.
    pub fn testing(&self, conn: &ServerConn) -> Testing<'_> {
        lock(&self.inner).tested.push(IdleServer::of(conn));
        Testing {
            pool: self,
            id: conn.id,
        }
    }
}

/// `server_check_query` of `settings`, if `guard` has been idle at least server_check_delay
/// by `now`.
fn check_query_due<'s>(
    settings: &'s PoolSettings,
    guard: &ServerGuard,
    now: Instant,
) -> Option<&'s str> {
    let (query, delay) = (settings.check_query.as_deref()?, settings.check_delay?);
    (now.saturating_duration_since(guard.last_used) >= delay).then_some(query)
}

/// A server's test under way (see [`Pool::testing`]).
#[derive(Debug)]
pub struct Testing<'a> {
    pool: &'a Pool,
    id: u64,
}

impl Drop for Testing<'_> {
    fn drop(&mut self) {
        lock(&self.pool.inner).tested.retain(|s| s.id != self.id);
    }
}

/// A server not lent to a client (idle, or being tested) as SHOW SERVERS lists it.
#[derive(Debug, Clone)]
pub struct IdleServer {
    pub id: u64,
    pub pid: u32,
    pub addr: Arc<crate::server::ServerAddr>,
    pub created: Instant,
    pub last_used: Instant,
}

impl IdleServer {
    fn of(c: &ServerConn) -> Self {
        IdleServer {
            id: c.id,
            pid: c.key.pid,
            addr: c.addr.clone(),
            created: c.created,
            last_used: c.last_used,
        }
    }
}

/// What checkout found: an idle server, or a place in the queue.
#[derive(Debug)]
pub enum Taken {
    Idle(ServerGuard),
    Wait(Queued),
}

/// How long a ticket may wait for a server once queued (query_wait_timeout), and after how
/// long from its `enqueued_at` its client is told it is queued (query_wait_notify).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitLimits {
    pub timeout: WaitTimeout,
    pub notify: Option<Duration>,
    /// The asking session's worker thread (when there are several): an idle server whose
    /// socket that thread serves is taken first.
    pub home: Option<crate::workers::WorkerId>,
}

/// Where a wait's query_wait_timeout comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitTimeout {
    /// The pool's `query_wait` as it is set when the ticket joins the queue.
    Pool,
    Given(Option<Duration>),
}

/// What a pool hands a client waiting for a server.
#[derive(Debug)]
pub enum Handout {
    Server(ServerGuard),
    /// The client has waited `WaitLimits::notify` and is still queued, in the same place;
    /// wait on by awaiting the [`Queued`].
    StillQueued(Queued),
}

/// A place in a pool's queue: a future of what the pool hands it next. Dropping it gives
/// the place up.
#[derive(Debug)]
pub struct Queued {
    rx: oneshot::Receiver<ServerAnswer>,
}

impl Future for Queued {
    type Output = Result<Handout, PoolError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.rx)
            .poll(cx)
            .map(|answer| answer.unwrap_or(Err(PoolError::Closed)))
    }
}

/// A ticket's waiter in the queue: where its answer goes, and when the watchdog must look at
/// it.
#[derive(Debug)]
struct ServerWaiter {
    tx: oneshot::Sender<ServerAnswer>,
    /// query_wait_timeout (or the global query_timeout) runs out.
    deadline: Option<Instant>,
    /// What the client is told at the deadline.
    expiry: PoolError,
    /// query_wait_notify is due (once).
    notify_at: Option<Instant>,
    /// The worker thread of the waiting session (when there are several): a server coming
    /// back on that thread goes to it before waiters of other threads that came a little
    /// earlier (see [`WaitQueue::pop_preferring`]).
    home: Option<crate::workers::WorkerId>,
}

impl ServerWaiter {
    /// A waiter for `ticket`, joining the queue at `now` with a (timeout, notify) pair.
    fn new(
        ticket: &Ticket,
        (timeout, notify): (Option<Duration>, Option<Duration>),
        now: Instant,
    ) -> (ServerWaiter, Queued) {
        let (tx, rx) = oneshot::channel();
        let waiter = ServerWaiter {
            tx,
            deadline: timeout.and_then(|t| now.checked_add(t)),
            expiry: PoolError::WaitTimeout,
            notify_at: notify.and_then(|t| ticket.enqueued_at.checked_add(t)),
            home: None,
        };
        (waiter, Queued { rx })
    }

    /// Whether the client still waits (it drops its end when it gives up).
    fn live(&self) -> bool {
        !self.tx.is_closed()
    }

    /// The next moment this waiter needs the watchdog.
    fn alarm(&self) -> Option<Instant> {
        earliest(self.deadline, self.notify_at)
    }

    /// A server for the client. One that left just now drops it, which checks it in again.
    fn hand(self, handout: Handout) {
        let _ = self.tx.send(Ok(handout));
    }

    fn refuse(self, err: PoolError) {
        let _ = self.tx.send(Err(err));
    }

    /// What the watchdog does with this waiter at `now`: refuses it past its deadline, tells
    /// it once that it is queued, and keeps it (returned) unless it is done or gone.
    fn expire(self, now: Instant) -> Option<ServerWaiter> {
        if !self.live() {
            return None;
        }
        if self.deadline.is_some_and(|d| d <= now) {
            let err = self.expiry.clone();
            self.refuse(err);
            return None;
        }
        if self.notify_at.is_none_or(|n| n > now) {
            return Some(self);
        }
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Ok(Handout::StillQueued(Queued { rx })))
            .ok()
            .map(|()| ServerWaiter {
                tx,
                deadline: self.deadline,
                expiry: self.expiry,
                notify_at: None,
                home: self.home,
            })
    }
}

/// The earlier of two optional moments.
fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// A pool's queue watchdog: sleeps until the earliest moment a waiter needs it, looks, and
/// goes on while any waiter has a limit left. Ends with the pool, or when replaced by one
/// armed for an earlier moment.
async fn watch_queue(pool: Weak<Pool>, mut at: Instant, id: u64) {
    loop {
        tokio::time::sleep_until(at.into()).await;
        let Some(pool) = pool.upgrade() else {
            return;
        };
        match pool.expire_waiters(id, Instant::now()) {
            Some(next) => at = next,
            None => return,
        }
    }
}

/// Whether the server refused a login of the pool for good within `retry`.
fn refused_lately(inner: &Inner, retry: Duration) -> bool {
    inner
        .failure
        .as_ref()
        .is_some_and(|(at, _)| at.elapsed() < retry)
}

/// Whether the pool has servers logged in for its clients (idle or in use; a replication
/// client's own server is no one else's).
fn has_servers(inner: &Inner) -> bool {
    !inner.idle.is_empty() || inner.active > 0
}

/// One turn of a wait that ends at `deadline` (query_wait_timeout): until `woken`, or, when
/// it `looks_again` (a limit shared with other pools, which do not wake it), at most
/// [`SHARED_LIMIT_RECHECK`](super::dedicated::SHARED_LIMIT_RECHECK).
pub(super) async fn wait_turn(
    woken: Pin<&mut tokio::sync::futures::Notified<'_>>,
    deadline: Option<Instant>,
    looks_again: bool,
) -> Result<(), PoolError> {
    let recheck = super::dedicated::SHARED_LIMIT_RECHECK;
    let mut step = deadline.map(|d| d.saturating_duration_since(Instant::now()));
    if looks_again {
        step = Some(step.map_or(recheck, |s| s.min(recheck)));
    }
    match step {
        Some(step) => {
            let _ = tokio::time::timeout(step, woken).await;
        }
        None => woken.await,
    }
    match deadline.is_some_and(|d| Instant::now() >= d) {
        true => Err(PoolError::WaitTimeout),
        false => Ok(()),
    }
}

/// A connect counted as begun at `begun` has ended.
fn forget_connect(inner: &mut Inner, begun: Instant) {
    if let Some(i) = inner.connecting.iter().position(|at| *at == begun) {
        inner.connecting.swap_remove(i);
    }
}

/// The gate's answer when another pool's servers could make room.
fn shared_limit(growth: Growth) -> Option<Growth> {
    matches!(growth, Growth::DbFull | Growth::UserFull).then_some(growth)
}

/// Whether a server coming back from a client is to close for server_lifetime (with a
/// lifetime of 0, every server is after its first use): it outlived it, and the last server
/// closed for it was closed server_lifetime / pool_size ago or more, as PgBouncer spaces
/// them (`closed` is then set to `now`: the caller closes it).
fn expired(
    conn: &ServerConn,
    settings: &PoolSettings,
    now: Instant,
    closed: &mut Option<Instant>,
) -> bool {
    let Some(lifetime) = settings.lifetime else {
        return false;
    };
    if now.saturating_duration_since(conn.created) < lifetime {
        return false;
    }
    let gap = match settings.limits.pool_size {
        0 => Duration::ZERO,
        size => lifetime / u32::try_from(size).unwrap_or(u32::MAX),
    };
    let due = closed.is_none_or(|at| now.saturating_duration_since(at) >= gap);
    if due {
        *closed = Some(now);
    }
    due
}

/// The idle server to take next: with `round_robin` the one idle longest; else the most
/// recently used (PgBouncer's default, which keeps the fewest servers busy) of those whose
/// socket thread `home` serves, if any, or of all.
fn next_idle(
    inner: &mut Inner,
    round_robin: bool,
    home: Option<crate::workers::WorkerId>,
) -> Option<Box<ServerConn>> {
    if round_robin {
        return (!inner.idle.is_empty()).then(|| inner.idle.remove(0));
    }
    let own = home.and_then(|h| inner.idle.iter().rposition(|c| c.home == Some(h)));
    match own {
        Some(i) => Some(inner.idle.remove(i)),
        None => inner.idle.pop(),
    }
}

/// [`expired`] under the pool's lock, with its settings.
fn lifetime_over(inner: &mut Inner, conn: &ServerConn, now: Instant) -> bool {
    expired(conn, &inner.settings, now, &mut inner.lifetime_closed)
}

/// Whether an idle server is to close for server_lifetime (see [`expired`]). Under a lifetime
/// of 0 an idle server has not served yet (one that has is closed at check-in): it waits for
/// its one use.
fn idle_expired(
    conn: &ServerConn,
    settings: &PoolSettings,
    now: Instant,
    closed: &mut Option<Instant>,
) -> bool {
    settings.lifetime.is_some_and(|l| !l.is_zero()) && expired(conn, settings, now, closed)
}

fn try_increment(counter: &AtomicUsize, max: usize) -> bool {
    counter
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (max == 0 || n < max).then_some(n + 1)
        })
        .is_ok()
}

impl Pool {
    /// The login failure the server reported within server_login_retry, while nothing is
    /// being opened and the pool has no server that can serve its queue: new clients get it
    /// at once instead of waiting for a login that will fail again (with servers, they wait
    /// for them, as in PgBouncer).
    fn recent_failure(&self, inner: &Inner, retry: Duration) -> Option<Arc<ServerError>> {
        let (_, err) = inner.failure.as_ref()?;
        let lately = inner.connecting.is_empty() && refused_lately(inner, retry);
        (lately && !self.serves_queue(inner)).then(|| err.clone())
    }

    /// Whether the pool has servers that can serve its queue: logged in, and not all bound to
    /// close as they come back (after a RECONNECT, until a server logs in after it; in a
    /// pool a reload retired).
    fn serves_queue(&self, inner: &Inner) -> bool {
        has_servers(inner) && !self.closing.retired() && !lock(&self.welcome).stale
    }

    /// A connection of pgward's own to `addr` (whatever host list the pool has now, and
    /// without touching its hosts' state), outside the pool's count: the pool's login under
    /// `application_name`. For the server reading and the fleet's state database.
    pub async fn open_own(
        &self,
        addr: &crate::server::ServerAddr,
        application_name: &str,
    ) -> Result<crate::server::ServerConn, ServerError> {
        let settings = self.settings();
        let mut target = settings.target.clone();
        target.hosts = Arc::new(crate::server::Hosts::new(vec![addr.clone()], false));
        target
            .startup_params
            .retain(|(k, _)| !k.eq_ignore_ascii_case("application_name"));
        target
            .startup_params
            .push(("application_name".into(), application_name.into()));
        crate::server::connect(
            &target,
            &self.credential(),
            &settings.tracked,
            settings.connect_timeout,
            0,
            settings.max_message,
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiter(at: Instant, limits: (Option<Duration>, Option<Duration>)) -> (ServerWaiter, Queued) {
        ServerWaiter::new(&Ticket::new(1, at), limits, at)
    }

    #[test]
    fn a_waiter_past_its_deadline_is_refused_and_dropped() {
        let t0 = Instant::now();
        let (w, mut q) = waiter(t0, (Some(Duration::from_secs(2)), None));
        assert_eq!(w.alarm(), Some(t0 + Duration::from_secs(2)));
        let w = w
            .expire(t0 + Duration::from_secs(1))
            .expect("still waiting");
        assert!(w.expire(t0 + Duration::from_secs(2)).is_none());
        assert!(matches!(q.rx.try_recv(), Ok(Err(PoolError::WaitTimeout))));
    }

    #[test]
    fn a_waiter_is_told_once_that_it_is_queued_and_keeps_its_deadline() {
        let t0 = Instant::now();
        let (w, mut q) = waiter(
            t0,
            (Some(Duration::from_secs(9)), Some(Duration::from_secs(1))),
        );
        assert_eq!(w.alarm(), Some(t0 + Duration::from_secs(1)));
        let w = w.expire(t0 + Duration::from_secs(1)).expect("kept");
        let Ok(Ok(Handout::StillQueued(mut next))) = q.rx.try_recv() else {
            panic!("no notice");
        };
        assert_eq!(w.alarm(), Some(t0 + Duration::from_secs(9)));
        assert!(next.rx.try_recv().is_err(), "told only once");
        w.refuse(PoolError::Closed);
        assert!(matches!(next.rx.try_recv(), Ok(Err(PoolError::Closed))));
    }

    #[test]
    fn a_waiter_that_left_is_dropped() {
        let t0 = Instant::now();
        let (w, q) = waiter(t0, (None, None));
        assert_eq!(w.alarm(), None);
        assert!(w.live());
        drop(q);
        assert!(!w.live());
        assert!(w.expire(t0).is_none());
    }

    #[test]
    fn earliest_of_two_moments() {
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(earliest(Some(t1), Some(t0)), Some(t0));
        assert_eq!(earliest(None, Some(t1)), Some(t1));
        assert_eq!(earliest(None, None), None);
    }
}
