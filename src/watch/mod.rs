//! The gate watches the server: under a policy, each PostgreSQL server pgward pools onto is
//! read once a second on a connection of pgward's own (who runs, who waits on whose lock,
//! the oldest snapshot, the standbys' lag), mapped to pgward's sessions and tenants by the
//! backend's process id; the lock-queue guard acts on it. A reading that fails three times
//! in a row leaves pgward acting as if nothing happened (said in the log and the console),
//! never blocking traffic.

pub mod blame;
pub mod guard;
pub mod horizon;
pub mod reading;
pub mod server_stats;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::cancel::{CancelRegistry, OwnCancel, Seen};
use crate::gate::{DecisionLog, Event, Record};
use crate::policy::WatchPolicy;
use crate::pool::Pool;
use crate::server::{OwnStatement, ServerAddr, ServerConn, ServerError};
use crate::sync::lock;
use horizon::Horizon;
use reading::Reading;

/// How often each server is read.
pub const PERIOD: Duration = Duration::from_secs(1);

/// Failed readings in a row after which pgward says it reads nothing.
const BLIND_AFTER: u32 = 3;

/// How long a cancel of the guard may take to be delivered.
const CANCEL_LIMIT: Duration = Duration::from_secs(5);

/// The application_name of the reading's connection, as the server lists it.
const APPLICATION_NAME: &str = "pgward server reading";

/// What the console shows of each server's readings, by upstream.
#[derive(Debug, Default)]
pub struct Board {
    servers: Mutex<BTreeMap<String, ServerView>>,
}

/// The last reading of one server, as the console shows it.
#[derive(Debug, Clone, Default)]
pub struct ServerView {
    /// When the last reading arrived.
    pub read_at: Option<Instant>,
    /// Readings that failed since the last one that did not.
    pub failures: u32,
    /// Why the last one failed.
    pub error: Option<String>,
    pub backends: usize,
    /// Backends running for pgward's clients.
    pub ours: usize,
    pub lock_waiters: usize,
    /// The oldest snapshot: its xmin's age in transactions, its backend, that backend's
    /// transaction age and, when it is pgward's, its tenant.
    pub oldest_xmin: Option<(u64, u32, Option<Duration>, Option<String>)>,
    pub replication_lag: Option<Duration>,
    /// Statements the lock-queue guard cancelled.
    pub guard_cancels: u64,
    /// The dead rows of the database's tables.
    pub dead_rows: u64,
    /// Tenants the vacuum horizon holds to one statement at a time.
    pub capped: Vec<String>,
    /// Who runs what for how long: the backends that are not idle (at most
    /// [`MAX_ACTIVITY`]).
    pub activity: Vec<Activity>,
}

/// Backends listed per server in SHOW ACTIVITY, at most.
pub const MAX_ACTIVITY: usize = 1000;

/// One backend that is not idle, mapped to pgward's client when it is one's.
#[derive(Debug, Clone, Default)]
pub struct Activity {
    pub pid: u32,
    /// pgward's client using it, its tenant and the fingerprint of its statement.
    pub client: Option<(u64, String, Option<u64>)>,
    pub state: Option<String>,
    pub running: Option<Duration>,
    pub in_transaction: Option<Duration>,
    /// How long it has waited for a lock, if it does.
    pub lock_wait: Option<Duration>,
    pub blocked_by: Vec<u32>,
}

impl ServerView {
    /// Whether the readings have failed often enough that pgward acts on none.
    pub fn blind(&self) -> bool {
        self.failures >= BLIND_AFTER
    }
}

impl Board {
    /// Every server's view, by upstream.
    pub fn views(&self) -> Vec<(String, ServerView)> {
        lock(&self.servers)
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// Changes the view of a server being read (none once the supervisor forgot it: a
    /// reader aborted in the middle of a reading leaves no row behind).
    fn update(&self, upstream: &str, f: impl FnOnce(&mut ServerView)) {
        if let Some(view) = lock(&self.servers).get_mut(upstream) {
            f(view);
        }
    }

    fn start(&self, upstream: &str) {
        lock(&self.servers).insert(upstream.to_string(), ServerView::default());
    }

    /// Forgets a server; returns the tenants its reader had capped.
    fn forget(&self, upstream: &str) -> Vec<String> {
        lock(&self.servers)
            .remove(upstream)
            .map(|v| v.capped)
            .unwrap_or_default()
    }
}

/// What the readers need of the running process.
pub trait Watched: Send + Sync + 'static {
    /// The policy's `server_reading` and `lock_wait`, `None` without a policy.
    fn watch_policy(&self) -> Option<WatchPolicy>;
    /// Every pool.
    fn pools(&self) -> Vec<Arc<Pool>>;
    /// The clients' cancel handles.
    fn cancels(&self) -> &CancelRegistry;
    /// Where the readings are shown.
    fn board(&self) -> &Board;
    /// Holds `tenant` to one slot at a time (`on`), or lifts this reader's hold.
    fn cap_tenant(&self, tenant: &str, on: bool);
    /// Moves `seconds` of server time already charged from one tenant to another.
    fn move_charge(&self, from: &str, to: &str, seconds: f64);
    /// `n` of pgward's sessions on `upstream` wait for a lock (the adaptive limit's count).
    fn note_lock_waits(&self, upstream: &str, n: usize);
    /// Where the lock-queue guard's cancels are logged.
    fn decisions(&self) -> &DecisionLog;
    /// What pg_stat_statements counted since the last read, by server role and database,
    /// for the statement statistics.
    fn add_server_statements(&self, changes: Vec<server_stats::Delta>);
}

/// Keeps one reader running per PostgreSQL server pgward pools onto while the policy asks
/// for readings; stops readers of servers no pool uses any more.
pub async fn supervise<R: Watched>(rt: Arc<R>) {
    let mut readers: HashMap<String, tokio::task::JoinHandle<()>> = HashMap::new();
    let mut tick = tokio::time::interval(PERIOD);
    loop {
        tick.tick().await;
        let wanted = servers_to_read(rt.as_ref());
        readers.retain(|upstream, task| {
            let keep = wanted.contains_key(upstream) && !task.is_finished();
            if !keep {
                task.abort();
                // What the reader capped is lifted with it.
                for tenant in rt.board().forget(upstream) {
                    rt.cap_tenant(&tenant, false);
                }
            }
            keep
        });
        for (upstream, (addr, pool)) in wanted {
            readers.entry(upstream.clone()).or_insert_with(|| {
                rt.board().start(&upstream);
                tokio::spawn(read_server(rt.clone(), upstream, addr, pool))
            });
        }
    }
}

/// The servers to read now, by upstream, with a pool whose login the reader borrows: none
/// without a policy that asks for readings. A pool with several hosts is not read (its
/// servers' process ids would mix).
fn servers_to_read(rt: &impl Watched) -> HashMap<String, (Arc<ServerAddr>, Arc<Pool>)> {
    let reading = rt.watch_policy().is_some_and(|w| w.reading);
    let mut wanted = HashMap::new();
    if !reading {
        return wanted;
    }
    for pool in rt.pools() {
        let settings = pool.settings();
        let hosts = &settings.target.hosts;
        if hosts.is_list() {
            continue;
        }
        let upstream = hosts.label().to_string();
        let addr = Arc::clone(hosts.first());
        wanted.entry(upstream).or_insert((addr, pool));
    }
    wanted
}

/// Reads one server once a period for as long as the supervisor keeps it.
async fn read_server<R: Watched>(
    rt: Arc<R>,
    upstream: String,
    addr: Arc<ServerAddr>,
    pool: Arc<Pool>,
) {
    let mut tick = tokio::time::interval(PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut conn: Option<ServerConn> = None;
    let mut horizon = Horizon::default();
    // When the last reading was asked for, for the lock waits it moves.
    let mut last_asked: Option<Instant> = None;
    // pg_stat_statements' counters at its last read, and readings since.
    let mut statements = server_stats::Deltas::default();
    let mut round = 0u32;
    loop {
        tick.tick().await;
        if pool.settings().target.hosts.label() != upstream {
            // A reload moved the pool: the supervisor starts a reader with a pool of this
            // server, if one is left.
            close(&mut conn);
            return;
        }
        let seen = rt.cancels().seen_at(&addr);
        let asked = Instant::now();
        let result = read_once(&pool, &addr, &mut conn).await;
        let policy = rt.watch_policy().unwrap_or_default();
        match result {
            Ok(reading) => {
                let cancels = policy
                    .lock_wait
                    .map_or(0, |w| guard(&upstream, &reading, &seen, w, rt.decisions()));
                let elapsed = last_asked.map_or(PERIOD, |t| asked.saturating_duration_since(t));
                last_asked = Some(asked);
                blame(rt.as_ref(), &addr, &reading, &seen, elapsed);
                let ours_waiting = reading
                    .backends
                    .iter()
                    .filter(|b| b.waits_on_lock && seen.contains_key(&b.pid))
                    .count();
                rt.note_lock_waits(&upstream, ours_waiting);
                let changes = match policy.horizon {
                    Some(h) => horizon.observe(
                        Instant::now(),
                        oldest(&reading, &seen),
                        reading.dead_rows,
                        h,
                    ),
                    None => horizon.forget(),
                };
                apply(rt.as_ref(), &upstream, &changes);
                round = round.wrapping_add(1);
                if round % server_stats::EVERY == 1 {
                    if let Some(changes) = read_statements(&pool, &mut conn, &mut statements).await
                    {
                        rt.add_server_statements(changes);
                    }
                }
                rt.board().update(&upstream, |v| {
                    if v.blind() {
                        tracing::info!(%upstream, "server reading works again");
                    }
                    let capped = std::mem::take(&mut v.capped);
                    *v = view_of(&reading, &seen, v.guard_cancels + cancels);
                    v.capped = capped;
                });
            }
            Err(e) => {
                let mut blind = false;
                rt.board().update(&upstream, |v| {
                    v.failures += 1;
                    v.error = Some(e.clone());
                    blind = v.blind();
                    if v.failures == BLIND_AFTER {
                        tracing::warn!(%upstream, error = %e, "server reading failed {BLIND_AFTER} times in a row: acting as if nothing happened there until it works again");
                    }
                });
                if blind {
                    apply(rt.as_ref(), &upstream, &horizon.forget());
                }
            }
        }
    }
}

/// The blocker pays for one reading, `elapsed` after the last (at most five periods). Only
/// sessions that served the same client before and after the reading count, and a waiter
/// only while its client waits for an answer (a wait of pgward's own, such as its EXPLAIN,
/// is nobody's statement).
fn blame(
    rt: &impl Watched,
    addr: &ServerAddr,
    reading: &Reading,
    seen: &HashMap<u32, Seen>,
    elapsed: Duration,
) {
    let after = rt.cancels().seen_at(addr);
    let same = |pid: &u32| {
        let (before, now) = (seen.get(pid), after.get(pid));
        before
            .zip(now)
            .filter(|(b, n)| b.handle.client_id == n.handle.client_id && b.tenant == n.tenant)
            .map(|(b, n)| (b, n.owed))
    };
    let tenants: HashMap<u32, &str> = seen
        .keys()
        .filter_map(|pid| same(pid).map(|(b, _)| (*pid, b.tenant.as_str())))
        .collect();
    let busy = |pid: u32| same(&pid).is_some_and(|(b, owed)| b.owed > 0 && owed > 0);
    for m in blame::moves(reading, &tenants, busy, elapsed.min(PERIOD * 5)) {
        rt.move_charge(&m.from, &m.to, m.seconds);
    }
}

/// The oldest snapshot of `reading`, with its tenant when it is one of pgward's sessions.
fn oldest(reading: &Reading, seen: &HashMap<u32, Seen>) -> Option<horizon::Oldest> {
    let b = reading.oldest_snapshot()?;
    Some(horizon::Oldest {
        pid: b.pid,
        xmin: b.xmin.clone()?,
        tenant: seen.get(&b.pid).map(|s| s.tenant.clone()),
    })
}

/// Sets and lifts the vacuum horizon's caps, each recorded in the server's view in the same
/// step (under the board's lock): a reader the supervisor forgot meanwhile caps nothing, and
/// what it capped before is what the supervisor lifts.
fn apply(rt: &impl Watched, upstream: &str, changes: &[horizon::Change]) {
    if changes.is_empty() {
        return;
    }
    rt.board().update(upstream, |v| {
        for change in changes {
            match change {
                horizon::Change::Cap(tenant) if !v.capped.contains(tenant) => {
                    tracing::warn!(%upstream, %tenant, "vacuum horizon: a session of this tenant has held the oldest snapshot while dead rows piled up; it runs one statement at a time");
                    rt.cap_tenant(tenant, true);
                    v.capped.push(tenant.clone());
                }
                horizon::Change::Lift(tenant) => {
                    if let Some(i) = v.capped.iter().position(|t| t == tenant) {
                        tracing::info!(%upstream, %tenant, "vacuum horizon clear: the tenant's cap is lifted");
                        rt.cap_tenant(tenant, false);
                        v.capped.remove(i);
                    }
                }
                horizon::Change::Cap(_) => {}
            }
        }
    });
}

/// One reading, on the reader's connection (opened first if needed). A connection whose
/// reading failed in the middle of the exchange is closed; one the server answered with an
/// error, or whose rows did not read, stays in step and is kept.
async fn read_once(
    pool: &Pool,
    addr: &ServerAddr,
    conn: &mut Option<ServerConn>,
) -> Result<Reading, String> {
    if conn.is_none() {
        *conn = Some(
            pool.open_own(addr, APPLICATION_NAME)
                .await
                .map_err(|e| e.to_string())?,
        );
    }
    let major = server_major(conn.as_ref());
    let rows = ask(pool, conn, "pgward_reading", &reading::query(major)).await?;
    Reading::of_rows(&rows)
}

/// The major version of the server `conn` is on (13 when it does not say).
fn server_major(conn: Option<&ServerConn>) -> u32 {
    conn.and_then(|c| c.params.get("server_version"))
        .and_then(reading::major_of)
        .unwrap_or(13)
}

/// The rows of `sql` on the reader's connection. A connection whose exchange failed in the
/// middle (or took over five periods) is closed; one the server answered with an error stays
/// in step and is kept.
async fn ask(
    pool: &Pool,
    conn: &mut Option<ServerConn>,
    name: &str,
    sql: &str,
) -> Result<Vec<crate::server::TextRow>, String> {
    let Some(c) = conn.as_mut() else {
        return Err("no connection".into());
    };
    let settings = pool.settings();
    let statement = [OwnStatement::plain(name, sql)];
    let read = c.own_batch(&statement, usize::MAX, &settings.tracked);
    match tokio::time::timeout(PERIOD * 5, read).await {
        Ok(Ok(rows)) => Ok(rows),
        Ok(Err(e @ ServerError::Refused(_))) => Err(e.to_string()),
        Ok(Err(e)) => {
            close(conn);
            Err(e.to_string())
        }
        Err(_) => {
            close(conn);
            Err(format!("{name} took more than 5 s"))
        }
    }
}

/// What pg_stat_statements counted since its last read, if the extension is installed in
/// the reading's database (`None`: it is not, or the read failed, which changes nothing: the
/// statistics go on without it).
async fn read_statements(
    pool: &Pool,
    conn: &mut Option<ServerConn>,
    deltas: &mut server_stats::Deltas,
) -> Option<Vec<server_stats::Delta>> {
    let major = server_major(conn.as_ref());
    let found = ask(pool, conn, "pgward_find_statements", server_stats::FIND).await;
    let schema = found.ok()?.first()?.first()?.clone()?;
    let sql = server_stats::query(&schema, major);
    let rows = ask(pool, conn, "pgward_statements", &sql)
        .await
        .map_err(|e| tracing::debug!("pg_stat_statements: {e}"))
        .ok()?;
    let (rows, error) = server_stats::rows_of(&rows);
    if let Some(e) = error {
        tracing::debug!("{e}; the row is left out");
    }
    let analyzer = crate::sql::Analyzer::new(crate::sql::Depth::Shape, 0);
    let context = crate::sql::ParseContext::server_defaults();
    Some(deltas.observe(rows, |text| {
        analyzer
            .analyze(text.as_bytes(), &context)
            .fingerprint
            .map(|f| f.0)
    }))
}

fn close(conn: &mut Option<ServerConn>) {
    if let Some(c) = conn.take() {
        tokio::spawn(c.terminate());
    }
}

/// The lock-queue guard over one reading: cancels what it finds. Returns how many cancels
/// went.
fn guard(
    upstream: &str,
    reading: &Reading,
    seen: &HashMap<u32, Seen>,
    lock_wait: Duration,
    log: &DecisionLog,
) -> u64 {
    let mut cancelled = 0;
    for victim in guard::victims(reading, |pid| seen.contains_key(&pid), lock_wait) {
        let Some(s) = seen.get(&victim.pid) else {
            continue;
        };
        let reason = OwnCancel::LockQueue {
            waited: victim.waited,
            queued: victim.queued,
        };
        if s.handle
            .cancel_seen(victim.pid, (s.sent, s.owed), reason, CANCEL_LIMIT)
        {
            cancelled += 1;
            tracing::warn!(
                %upstream,
                client = s.handle.client_id,
                tenant = %s.tenant,
                waited_ms = victim.waited.as_millis() as u64,
                queued = victim.queued,
                "lock-queue guard: cancelling a DDL statement waiting for a lock"
            );
            let record = Record::new(Event::Cancelled, "lock_queue")
                .tenant(&s.tenant)
                .upstream(upstream)
                .client(s.handle.client_id)
                .fingerprint(s.fingerprint.map(crate::sql::Fingerprint))
                .sqlstate(crate::wire::sqlstate::LOCK_NOT_AVAILABLE)
                .seconds("waited_s", victim.waited)
                .figure("queued", victim.queued as f64);
            log.record(&record);
        }
    }
    cancelled
}

/// What the console shows of `reading`.
fn view_of(reading: &Reading, seen: &HashMap<u32, Seen>, guard_cancels: u64) -> ServerView {
    let oldest_xmin = reading.oldest_snapshot().and_then(|b| {
        let tenant = seen.get(&b.pid).map(|s| s.tenant.clone());
        Some((b.xmin_age?, b.pid, b.in_transaction, tenant))
    });
    ServerView {
        read_at: Some(Instant::now()),
        failures: 0,
        error: None,
        backends: reading.backends.len(),
        ours: reading
            .backends
            .iter()
            .filter(|b| seen.contains_key(&b.pid))
            .count(),
        lock_waiters: reading.backends.iter().filter(|b| b.waits_on_lock).count(),
        oldest_xmin,
        replication_lag: reading.replication_lag,
        guard_cancels,
        dead_rows: reading.dead_rows,
        capped: Vec::new(),
        activity: activity_of(reading, seen),
    }
}

/// The backends of `reading` that are not idle, pgward's first, the longest running first.
fn activity_of(reading: &Reading, seen: &HashMap<u32, Seen>) -> Vec<Activity> {
    let mut rows: Vec<Activity> = reading
        .backends
        .iter()
        .filter(|b| b.state.as_deref().is_some_and(|s| s != "idle"))
        .map(|b| Activity {
            pid: b.pid,
            client: seen
                .get(&b.pid)
                .map(|s| (s.handle.client_id, s.tenant.clone(), s.fingerprint)),
            state: b.state.clone(),
            running: b.running,
            in_transaction: b.in_transaction,
            lock_wait: b.waits_on_lock.then_some(b.waited.unwrap_or_default()),
            blocked_by: b.blocked_by.clone(),
        })
        .collect();
    rows.sort_by_key(|a| (a.client.is_none(), std::cmp::Reverse(a.running)));
    rows.truncate(MAX_ACTIVITY);
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forgotten_server_gets_no_row_back_from_a_late_reading() {
        let board = Board::default();
        board.start("db:5432");
        board.update("db:5432", |v| v.capped = vec!["etl".into()]);
        assert_eq!(board.forget("db:5432"), vec!["etl".to_string()]);
        // A reader aborted in the middle of its reading finishes it after the forget.
        board.update("db:5432", |v| v.failures += 1);
        assert!(board.views().is_empty());
    }
}
