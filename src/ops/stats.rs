//! Traffic counters per pool, as PgBouncer's SHOW STATS reports them: plain atomics bumped by
//! the sessions, a set per pool and worker thread (a thread's sessions bump only its own, so
//! no cache line goes back and forth between cores), summed when read; and the per-second
//! averages of the last `stats_period`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::pool::PoolKey;
use crate::sync::lock;
use crate::workers::WorkerId;

/// The counters of one pool on one worker thread. Times are in microseconds. Each set has
/// cache lines of its own.
#[derive(Debug, Default)]
#[repr(align(128))]
pub struct PoolCounters {
    pub server_assignments: AtomicU64,
    pub xacts: AtomicU64,
    pub queries: AtomicU64,
    pub received: AtomicU64,
    pub sent: AtomicU64,
    pub xact_time: AtomicU64,
    pub query_time: AtomicU64,
    pub wait_time: AtomicU64,
    pub client_logins: AtomicU64,
    /// Named Parse messages of clients whose statements pgward maps (transaction pooling
    /// with max_prepared_statements), Parse messages pgward sent to servers for them, and
    /// Bind messages of such statements.
    pub client_parses: AtomicU64,
    pub server_parses: AtomicU64,
    pub binds: AtomicU64,
}

/// A reading of [`PoolCounters`] (or a sum, a difference or an average of readings), in the
/// order PgBouncer prints them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatValues {
    pub server_assignments: u64,
    pub xacts: u64,
    pub queries: u64,
    pub received: u64,
    pub sent: u64,
    pub xact_time: u64,
    pub query_time: u64,
    pub wait_time: u64,
    pub client_parses: u64,
    pub server_parses: u64,
    pub binds: u64,
    pub client_logins: u64,
}

fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

impl PoolCounters {
    pub fn add_received(&self, n: usize) {
        add(&self.received, n as u64);
    }

    pub fn add_sent(&self, n: usize) {
        add(&self.sent, n as u64);
    }

    pub fn add_login(&self) {
        add(&self.client_logins, 1);
    }

    /// A server was handed to a client after `waited`.
    pub fn add_assignment(&self, waited: Duration) {
        add(&self.server_assignments, 1);
        add(&self.wait_time, micros(waited));
    }

    /// A request was answered (one ReadyForQuery) after `query`; `xact` is the length of the
    /// transaction it ended, if it ended one.
    pub fn add_query(&self, query: Duration, xact: Option<Duration>) {
        self.count_query(xact.is_some());
        self.add_query_time(query, xact);
    }

    /// Counts a query (and a transaction) before it runs, as the console's own commands
    /// are: SHOW TOTALS includes itself, as in PgBouncer.
    pub fn count_query(&self, xact: bool) {
        add(&self.queries, 1);
        if xact {
            add(&self.xacts, 1);
        }
    }

    /// Adds the time of a query [`Self::count_query`] counted.
    pub fn add_query_time(&self, query: Duration, xact: Option<Duration>) {
        add(&self.query_time, micros(query));
        if let Some(x) = xact {
            add(&self.xact_time, micros(x));
        }
    }

    pub fn add_client_parse(&self) {
        add(&self.client_parses, 1);
    }

    pub fn add_server_parse(&self) {
        add(&self.server_parses, 1);
    }

    pub fn add_bind(&self) {
        add(&self.binds, 1);
    }

    pub fn read(&self) -> StatValues {
        let r = |c: &AtomicU64| c.load(Ordering::Relaxed);
        StatValues {
            server_assignments: r(&self.server_assignments),
            xacts: r(&self.xacts),
            queries: r(&self.queries),
            received: r(&self.received),
            sent: r(&self.sent),
            xact_time: r(&self.xact_time),
            query_time: r(&self.query_time),
            wait_time: r(&self.wait_time),
            client_logins: r(&self.client_logins),
            client_parses: r(&self.client_parses),
            server_parses: r(&self.server_parses),
            binds: r(&self.binds),
        }
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl StatValues {
    fn fields(&self) -> [u64; 12] {
        [
            self.server_assignments,
            self.xacts,
            self.queries,
            self.received,
            self.sent,
            self.xact_time,
            self.query_time,
            self.wait_time,
            self.client_parses,
            self.server_parses,
            self.binds,
            self.client_logins,
        ]
    }

    fn from_fields(f: [u64; 12]) -> Self {
        let [server_assignments, xacts, queries, received, sent, xact_time, query_time, wait_time, client_parses, server_parses, binds, client_logins] =
            f;
        StatValues {
            server_assignments,
            xacts,
            queries,
            received,
            sent,
            xact_time,
            query_time,
            wait_time,
            client_parses,
            server_parses,
            binds,
            client_logins,
        }
    }

    /// The values in PgBouncer's column order.
    pub fn as_row(&self) -> [u64; 12] {
        self.fields()
    }

    pub fn plus(&self, other: &StatValues) -> StatValues {
        let (a, b) = (self.fields(), other.fields());
        StatValues::from_fields(std::array::from_fn(|i| a[i].saturating_add(b[i])))
    }

    fn minus(&self, other: &StatValues) -> StatValues {
        let (a, b) = (self.fields(), other.fields());
        StatValues::from_fields(std::array::from_fn(|i| a[i].saturating_sub(b[i])))
    }

    /// Averages over `period` of the growth from `older` to `self`: counts and bytes per
    /// second; times per transaction, per query and per assignment.
    pub fn average_since(&self, older: &StatValues, period: Duration) -> StatValues {
        let d = self.minus(older);
        // Over the period's exact length, as PgBouncer's calc_average (whole seconds would
        // count a period of 1.99 s as 1 s).
        let micros = period.as_micros().max(1);
        let per = |total: u64, n: u64| total.checked_div(n).unwrap_or(0);
        let per_sec =
            |n: u64| u64::try_from(u128::from(n) * 1_000_000 / micros).unwrap_or(u64::MAX);
        StatValues {
            server_assignments: per_sec(d.server_assignments),
            xacts: per_sec(d.xacts),
            queries: per_sec(d.queries),
            received: per_sec(d.received),
            sent: per_sec(d.sent),
            xact_time: per(d.xact_time, d.xacts),
            query_time: per(d.query_time, d.queries),
            wait_time: per(d.wait_time, d.server_assignments),
            client_parses: per_sec(d.client_parses),
            server_parses: per_sec(d.server_parses),
            binds: per_sec(d.binds),
            client_logins: per_sec(d.client_logins),
        }
    }
}

#[derive(Debug, Default)]
struct Period {
    /// Readings at the start of the current period.
    start: BTreeMap<PoolKey, StatValues>,
    /// Averages of the last complete period.
    averages: BTreeMap<PoolKey, StatValues>,
    started: Option<Instant>,
}

/// The counters of every pool that ever served a client (the admin console included), a set
/// per worker thread that served it, and the averages of the last period.
#[derive(Debug, Default)]
pub struct StatsRegistry {
    pools: Mutex<BTreeMap<(PoolKey, WorkerId), Arc<PoolCounters>>>,
    period: Mutex<Period>,
}

impl StatsRegistry {
    /// The counters of pool `key` bumped by sessions of worker thread `worker`, created at
    /// first use.
    pub fn for_pool(&self, key: &PoolKey, worker: WorkerId) -> Arc<PoolCounters> {
        lock(&self.pools)
            .entry((key.clone(), worker))
            .or_default()
            .clone()
    }

    /// Every pool's totals (its threads' counters summed), in key order.
    pub fn totals(&self) -> Vec<(PoolKey, StatValues)> {
        let pools = lock(&self.pools);
        let mut rows: Vec<(PoolKey, StatValues)> = Vec::new();
        for ((key, _), counters) in pools.iter() {
            let values = counters.read();
            match rows.last_mut() {
                Some((last, sum)) if last == key => *sum = sum.plus(&values),
                _ => rows.push((key.clone(), values)),
            }
        }
        rows
    }

    /// Every pool's averages over the last complete period.
    pub fn averages(&self) -> BTreeMap<PoolKey, StatValues> {
        lock(&self.period).averages.clone()
    }

    /// Closes the current period if `period` has passed since it began; then the averages
    /// over every pool of the period just closed.
    pub fn tick(&self, now: Instant, period: Duration) -> Option<StatValues> {
        let mut p = lock(&self.period);
        let started = *p.started.get_or_insert(now);
        let elapsed = now.saturating_duration_since(started);
        if elapsed < period {
            return None;
        }
        let totals = self.totals();
        let (mut all, mut all_old) = (StatValues::default(), StatValues::default());
        let averages = totals
            .iter()
            .map(|(k, v)| {
                let old = p.start.get(k).copied().unwrap_or_default();
                all = all.plus(v);
                all_old = all_old.plus(&old);
                (k.clone(), v.average_since(&old, elapsed))
            })
            .collect();
        p.averages = averages;
        p.start = totals.into_iter().collect();
        p.started = Some(now);
        Some(all.average_since(&all_old, elapsed))
    }
}

/// Sums per-pool values per database, keeping database order.
pub fn by_database(rows: &[(PoolKey, StatValues)]) -> Vec<(String, StatValues)> {
    let mut out: BTreeMap<String, StatValues> = BTreeMap::new();
    for (key, v) in rows {
        let sum = out.entry(key.db.clone()).or_default();
        *sum = sum.plus(v);
    }
    out.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn averages_are_per_second_and_per_event() {
        let old = StatValues::default();
        let new = StatValues {
            xacts: 20,
            queries: 40,
            xact_time: 2000,
            query_time: 800,
            server_assignments: 10,
            wait_time: 50,
            ..StatValues::default()
        };
        let avg = new.average_since(&old, Duration::from_secs(10));
        assert_eq!((avg.xacts, avg.queries), (2, 4));
        // A period a little short of two seconds is not one of one second.
        let avg = new.average_since(&old, Duration::from_millis(1990));
        assert_eq!((avg.xacts, avg.queries), (10, 20));
        assert_eq!((avg.xact_time, avg.query_time, avg.wait_time), (100, 20, 5));
    }

    #[test]
    fn counters_feed_the_period() {
        let reg = StatsRegistry::default();
        let key = PoolKey {
            db: "d".into(),
            user: "u".into(),
        };
        let c = reg.for_pool(&key, 0);
        let t0 = Instant::now();
        reg.tick(t0, Duration::from_secs(1));
        c.add_query(Duration::from_micros(10), Some(Duration::from_micros(30)));
        c.add_query(Duration::from_micros(30), None);
        let all = reg.tick(t0 + Duration::from_secs(1), Duration::from_secs(1));
        let avg = reg.averages()[&key];
        assert_eq!(all, Some(avg), "one pool: its averages are the whole's");
        let other = reg.for_pool(
            &PoolKey {
                db: "e".into(),
                user: "u".into(),
            },
            0,
        );
        other.add_query(Duration::from_micros(40), None);
        c.add_query(Duration::from_micros(20), None);
        let all = reg.tick(t0 + Duration::from_secs(3), Duration::from_secs(1));
        let all = all.expect("a period closed");
        // Two queries in two seconds, of 30 us on average over both pools.
        assert_eq!((all.queries, all.query_time), (1, 30));
        assert_eq!(
            reg.tick(t0 + Duration::from_secs(3), Duration::from_secs(1)),
            None
        );
        assert_eq!((avg.queries, avg.query_time, avg.xact_time), (2, 20, 30));
        let by_db = by_database(&reg.totals());
        assert_eq!(by_db[0].1.queries, 3);
    }

    #[test]
    fn a_pools_threads_are_summed_into_one_row() {
        let reg = StatsRegistry::default();
        let key = |db: &str| PoolKey {
            db: db.into(),
            user: "u".into(),
        };
        reg.for_pool(&key("a"), 2).add_received(5);
        reg.for_pool(&key("b"), 0).add_received(7);
        reg.for_pool(&key("a"), 0).add_received(10);
        reg.for_pool(&key("a"), 2).add_received(1);
        let rows = reg.totals();
        let got: Vec<(&str, u64)> = rows
            .iter()
            .map(|(k, v)| (k.db.as_str(), v.received))
            .collect();
        assert_eq!(got, [("a", 16), ("b", 7)]);
        let (t0, second) = (Instant::now(), Duration::from_secs(1));
        reg.tick(t0, second);
        reg.tick(t0 + second, second);
        reg.for_pool(&key("a"), 1).add_received(4);
        reg.tick(t0 + 2 * second, second);
        assert_eq!(reg.averages()[&key("a")].received, 4);
    }
}
