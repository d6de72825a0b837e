//! Plans by (database, role, fingerprint): an EXPLAIN is a round trip, and most applications
//! run the same few hundred statements with different values.
//!
//! Pure: the caller passes the time and how long each EXPLAIN took. Failed EXPLAINs are never
//! cached: only a [`PlanSummary`] can be put in.

use super::PlanSummary;
use std::collections::VecDeque;

use foldhash::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a plan is used.
pub const PLAN_TTL: Duration = Duration::from_secs(60);
/// How many plans are kept.
pub const PLAN_CAPACITY: usize = 10_000;

/// What a plan is cached under. The role counts because of row-level security, the
/// `search_path` because it chooses the tables, the tenant so that tenants sharing a role
/// never price each other's statements; a generic plan (a prepared statement explained
/// without its values) is kept apart from custom ones.
#[derive(Clone, Debug, Eq)]
pub struct PlanKey {
    /// The database.
    pub database: Arc<str>,
    /// The role the statement runs as.
    pub role: Arc<str>,
    /// The tenant it is charged to.
    pub tenant: Arc<str>,
    /// The session's `search_path` as pgward knows it (empty: the server's default).
    pub search_path: Arc<str>,
    /// pg_query's fingerprint of the statement.
    pub fingerprint: u64,
    /// Whether the plan is generic.
    pub generic: bool,
}

/// By the fingerprint first, then the names by address or bytes (hashed by their bytes).
impl PartialEq for PlanKey {
    fn eq(&self, other: &PlanKey) -> bool {
        use crate::name::same;
        self.fingerprint == other.fingerprint
            && self.generic == other.generic
            && same(&self.database, &other.database)
            && same(&self.role, &other.role)
            && same(&self.tenant, &other.tenant)
            && same(&self.search_path, &other.search_path)
    }
}

impl std::hash::Hash for PlanKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.database.hash(state);
        self.role.hash(state);
        self.tenant.hash(state);
        self.search_path.hash(state);
        self.fingerprint.hash(state);
        self.generic.hash(state);
    }
}

/// Counters for the minute's log line and the admin console.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Lookups that found a plan.
    pub hits: u64,
    /// Lookups that found none (or an expired one).
    pub misses: u64,
    /// EXPLAINs run (successful or not).
    pub explains: u64,
    /// EXPLAINs that failed.
    pub explain_errors: u64,
    /// Time spent in EXPLAINs.
    pub explain_time: Duration,
    /// The slowest EXPLAIN.
    pub explain_max: Duration,
}

impl CacheStats {
    /// Hits over lookups, 0 when there were none.
    pub fn hit_rate(&self) -> f64 {
        let lookups = self.hits + self.misses;
        if lookups == 0 {
            0.0
        } else {
            self.hits as f64 / lookups as f64
        }
    }

    /// The mean EXPLAIN time.
    pub fn explain_mean(&self) -> Duration {
        u32::try_from(self.explains)
            .ok()
            .filter(|n| *n > 0)
            .map_or(Duration::ZERO, |n| self.explain_time / n)
    }

    fn add_explain(&mut self, took: Duration, ok: bool) {
        self.explains += 1;
        self.explain_errors += u64::from(!ok);
        self.explain_time += took;
        self.explain_max = self.explain_max.max(took);
    }
}

#[derive(Debug)]
struct Entry {
    plan: Arc<PlanSummary>,
    stored: Instant,
    seq: u64,
    /// The constants (a hash of a text, or of a Bind's values) EXPLAIN gave this plan for,
    /// each different: once there are [`PROOF_RUNS`], the plan serves any constants.
    proof: Vec<u64>,
}

/// Different constants that must give a statement the same plan shape, at costs within
/// [`PROOF_TOLERANCE`] of each other, before its plan prices other constants: until then its
/// constants may choose its plan (a range that reads a few rows through an index, or all of
/// them), and each is explained.
pub const PROOF_RUNS: usize = 3;
/// See [`PROOF_RUNS`].
pub const PROOF_TOLERANCE: f64 = 0.1;

/// The plan cache.
#[derive(Debug)]
pub struct PlanCache {
    entries: HashMap<PlanKey, Entry>,
    /// Insertion order, for evicting the oldest; stale rows are skipped by `seq`.
    order: VecDeque<(u64, PlanKey)>,
    next_seq: u64,
    ttl: Duration,
    capacity: usize,
    total: CacheStats,
    window: CacheStats,
}

impl Default for PlanCache {
    fn default() -> Self {
        PlanCache::new(PLAN_TTL, PLAN_CAPACITY)
    }
}

impl PlanCache {
    /// A cache keeping `capacity` plans for `ttl` each.
    pub fn new(ttl: Duration, capacity: usize) -> PlanCache {
        PlanCache {
            entries: HashMap::default(),
            order: VecDeque::new(),
            next_seq: 0,
            ttl,
            capacity: capacity.max(1),
            total: CacheStats::default(),
            window: CacheStats::default(),
        }
    }

    /// The plan stored for `key` less than the TTL ago; counts a hit or a miss.
    pub fn get(&mut self, key: &PlanKey, now: Instant) -> Option<Arc<PlanSummary>> {
        self.get_for(key, || 0, now)
    }

    /// The plan stored for `key` less than the TTL ago that may price `constants`: one proved
    /// for any constants, or one explained for these; counts a hit or a miss. The constants
    /// are worked out only for a plan not proved yet.
    pub fn get_for(
        &mut self,
        key: &PlanKey,
        constants: impl FnOnce() -> u64,
        now: Instant,
    ) -> Option<Arc<PlanSummary>> {
        let fresh = self
            .entries
            .get(key)
            .filter(|e| now.saturating_duration_since(e.stored) < self.ttl)
            .filter(|e| e.proof.len() >= PROOF_RUNS || e.proof.contains(&constants()))
            .map(|e| Arc::clone(&e.plan));
        let hit = fresh.is_some();
        for s in [&mut self.total, &mut self.window] {
            s.hits += u64::from(hit);
            s.misses += u64::from(!hit);
        }
        fresh
    }

    /// Records a successful EXPLAIN that took `took`, and keeps its plan.
    pub fn insert(&mut self, key: PlanKey, plan: PlanSummary, took: Duration, now: Instant) {
        self.insert_for(key, plan, 0, took, now)
    }

    /// Records a successful EXPLAIN of `constants` that took `took`: a plan of the same shape
    /// and about the same cost as the one kept adds to its proof; any other replaces it.
    pub fn insert_for(
        &mut self,
        key: PlanKey,
        plan: PlanSummary,
        constants: u64,
        took: Duration,
        now: Instant,
    ) {
        self.record_explain(took, true);
        let ttl = self.ttl;
        if let Some(e) = self.entries.get_mut(&key) {
            let fresh = now.saturating_duration_since(e.stored) < ttl;
            if fresh && same_plan(&e.plan, &plan) {
                if !e.proof.contains(&constants) && e.proof.len() < PROOF_RUNS {
                    e.proof.push(constants);
                }
                return;
            }
        }
        self.entries.remove(&key);
        self.evict_for_one();
        self.next_seq += 1;
        let seq = self.next_seq;
        self.order.push_back((seq, key.clone()));
        let entry = Entry {
            plan: Arc::new(plan),
            stored: now,
            seq,
            proof: vec![constants],
        };
        self.entries.insert(key, entry);
    }

    /// Forgets every plan of `database` (DDL or ANALYZE ran there: plans may have changed).
    pub fn invalidate_database(&mut self, database: &str) {
        self.entries.retain(|k, _| &*k.database != database);
    }

    /// Forgets the plan of `key` (it priced a run far from what it took).
    pub fn remove(&mut self, key: &PlanKey) {
        self.entries.remove(key);
    }

    /// Records a failed EXPLAIN (nothing is cached) that took `took`.
    pub fn record_failure(&mut self, took: Duration) {
        self.record_explain(took, false);
    }

    fn record_explain(&mut self, took: Duration, ok: bool) {
        self.total.add_explain(took, ok);
        self.window.add_explain(took, ok);
    }

    /// Drops the oldest stored plans until one more fits.
    fn evict_for_one(&mut self) {
        while self.entries.len() >= self.capacity {
            let Some((seq, key)) = self.order.pop_front() else {
                return;
            };
            if self.entries.get(&key).is_some_and(|e| e.seq == seq) {
                self.entries.remove(&key);
            }
        }
        if self.order.len() > self.capacity.saturating_mul(2) {
            self.compact_order();
        }
    }

    /// Forgets order rows whose plan was replaced or dropped.
    fn compact_order(&mut self) {
        let entries = &self.entries;
        self.order
            .retain(|(seq, key)| entries.get(key).is_some_and(|e| e.seq == *seq));
    }

    /// Drops plans older than the TTL (for a periodic pass).
    pub fn purge(&mut self, now: Instant) {
        let ttl = self.ttl;
        self.entries
            .retain(|_, e| now.saturating_duration_since(e.stored) < ttl);
        self.compact_order();
    }

    /// How many plans are stored.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no plan is stored.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The counters since the cache was made (admin console).
    pub fn stats(&self) -> CacheStats {
        self.total
    }

    /// The counters since the last call, for the once-a-minute log line.
    pub fn take_window(&mut self) -> CacheStats {
        std::mem::take(&mut self.window)
    }
}

/// Whether two plans of one statement are the same plan: the same shape, and costs within
/// [`PROOF_TOLERANCE`] of each other.
fn same_plan(a: &PlanSummary, b: &PlanSummary) -> bool {
    let (x, y) = (a.total_cost.max(0.0), b.total_cost.max(0.0));
    a.shape == b.shape && (x - y).abs() <= PROOF_TOLERANCE * x.max(y)
}
