//! Statement statistics: one row per (fingerprint, tenant, role, database), with calls, rows,
//! the latency as the client sees it (from the request's arrival to its answer, waits in
//! pgward's queues included) in a relative-error [`Sketch`], the time waited in the gate's
//! queues apart, PostgreSQL's errors by SQLSTATE and pgward's own refusals by reason, apart.
//! Bounded: at `max_rows`, the least-called twentieth of the rows is evicted (and counted), as
//! pg_stat_statements does. Each fingerprint's normalized text (constants replaced by `$n`,
//! never the constants) is kept once per table. Pure: the caller says when.
//!
//! [`StatementTables`] keeps a table per worker thread, which that thread's sessions record in
//! (no lock shared between cores per statement), and merges them when they are read.

use std::collections::{BTreeMap, HashSet};
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex};

use foldhash::HashMap;

use super::anomalies::{Tally, SLOW_FLOOR};
use super::sketch::{Latency, Sketch};
use crate::sync::lock;

/// The longest text kept for a statement, in bytes (a longer one is cut, and says so).
pub const MAX_TEXT: usize = 4096;

/// Rows kept at most when the configuration does not say.
pub const DEFAULT_MAX_ROWS: usize = crate::config::DEFAULT_MAX_STATEMENT_STATS;

/// Whose statement, which one, where.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StatementKey {
    pub fingerprint: u64,
    pub tenant: Arc<str>,
    pub role: Arc<str>,
    pub database: Arc<str>,
}

/// A [`StatementKey`] borrowed: a run of a statement that has its row copies nothing.
#[derive(Clone, Copy, Debug)]
pub struct KeyRef<'a> {
    pub fingerprint: u64,
    pub tenant: &'a Arc<str>,
    pub role: &'a Arc<str>,
    pub database: &'a Arc<str>,
}

impl StatementKey {
    #[cfg(test)]
    fn borrowed(&self) -> KeyRef<'_> {
        KeyRef {
            fingerprint: self.fingerprint,
            tenant: &self.tenant,
            role: &self.role,
            database: &self.database,
        }
    }
}

impl KeyRef<'_> {
    fn matches(&self, key: &StatementKey) -> bool {
        use crate::name::same;
        key.fingerprint == self.fingerprint
            && same(&key.tenant, self.tenant)
            && same(&key.role, self.role)
            && same(&key.database, self.database)
    }

    pub fn owned(&self) -> StatementKey {
        StatementKey {
            fingerprint: self.fingerprint,
            tenant: Arc::clone(self.tenant),
            role: Arc::clone(self.role),
            database: Arc::clone(self.database),
        }
    }
}

/// One row.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StatementRow {
    /// Runs answered (errors included).
    pub calls: u64,
    /// Rows returned or changed (CommandComplete's count).
    pub rows: u64,
    /// Latency as the client sees it, in seconds.
    pub latency: Sketch,
    /// Seconds waited in the gate's queues (part of the latency).
    pub waited: f64,
    /// PostgreSQL's errors, by SQLSTATE.
    pub errors: BTreeMap<String, u64>,
    /// pgward's refusals, by reason (not in `calls`: they never ran).
    pub refusals: BTreeMap<String, u64>,
}

impl StatementRow {
    /// Adds `other`'s counts (the same statement's row in another thread's table).
    pub fn merge(&mut self, other: &StatementRow) {
        self.calls += other.calls;
        self.rows += other.rows;
        self.latency.merge(&other.latency);
        self.waited += other.waited;
        for (code, n) in &other.errors {
            *self.errors.entry(code.clone()).or_default() += n;
        }
        for (reason, n) in &other.refusals {
            *self.refusals.entry(reason.clone()).or_default() += n;
        }
    }
}

/// What pg_stat_statements counts of a statement (or what changed of it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServerCounters {
    pub calls: u64,
    pub shared_blks_hit: u64,
    pub shared_blks_read: u64,
    pub temp_blks_read: u64,
    pub temp_blks_written: u64,
    pub wal_bytes: u64,
}

impl ServerCounters {
    /// What changed from `before`: every counter's growth, or all of them as they are when
    /// the calls went down (the statement was reset or evicted, and came back).
    pub fn since(&self, before: &ServerCounters) -> ServerCounters {
        if self.calls < before.calls {
            return *self;
        }
        ServerCounters {
            calls: self.calls - before.calls,
            shared_blks_hit: self.shared_blks_hit.saturating_sub(before.shared_blks_hit),
            shared_blks_read: self
                .shared_blks_read
                .saturating_sub(before.shared_blks_read),
            temp_blks_read: self.temp_blks_read.saturating_sub(before.temp_blks_read),
            temp_blks_written: self
                .temp_blks_written
                .saturating_sub(before.temp_blks_written),
            wal_bytes: self.wal_bytes.saturating_sub(before.wal_bytes),
        }
    }

    fn add(&mut self, other: &ServerCounters) {
        self.calls += other.calls;
        self.shared_blks_hit += other.shared_blks_hit;
        self.shared_blks_read += other.shared_blks_read;
        self.temp_blks_read += other.temp_blks_read;
        self.temp_blks_written += other.temp_blks_written;
        self.wal_bytes += other.wal_bytes;
    }
}

/// One run that ended: how long the client waited for its answer, how much of that in the
/// gate's queues, the rows it returned or changed, and PostgreSQL's error if it failed.
#[derive(Clone, Debug, PartialEq)]
pub struct Ran<'a> {
    pub seconds: f64,
    pub waited: f64,
    pub rows: u64,
    pub error: Option<&'a str>,
}

/// The table.
#[derive(Debug)]
pub struct Statements {
    /// By fingerprint and a hash of (tenant, role, database); rows that share both are told
    /// apart by their whole keys (a hash alone never merges two).
    rows: HashMap<(u64, u64), Vec<(StatementKey, StatementRow)>>,
    count: usize,
    hasher: foldhash::fast::RandomState,
    texts: HashMap<u64, String>,
    max_rows: usize,
    evicted: u64,
    /// The current minute, for the judge of unusual minutes.
    minute: Tally,
    /// What pg_stat_statements counted since pgward began reading it, by fingerprint, role
    /// and database (PostgreSQL knows no tenant: a role's tenants share it).
    server: HashMap<(u64, String, String), ServerCounters>,
    /// The text and server counters of statements the last evictions took the last row of,
    /// kept for another thread's table that still has the statement (`None`: the only
    /// table, they go).
    leaving: Option<Vec<Leaving>>,
}

/// A statement that left a table: its text and what pg_stat_statements counted of it, by
/// server role and database.
#[derive(Debug)]
pub struct Leaving {
    fingerprint: u64,
    text: Option<String>,
    server: Vec<((String, String), ServerCounters)>,
}

impl Default for Statements {
    fn default() -> Self {
        Statements::new(DEFAULT_MAX_ROWS)
    }
}

impl Statements {
    /// A table of at most `max_rows` rows (0: none is kept; the minutes are still tallied).
    pub fn new(max_rows: usize) -> Statements {
        Statements {
            rows: HashMap::default(),
            count: 0,
            hasher: foldhash::fast::RandomState::default(),
            texts: HashMap::default(),
            max_rows,
            evicted: 0,
            minute: Tally::default(),
            server: HashMap::default(),
            leaving: None,
        }
    }

    /// A table that keeps what its evictions take for another table (one of several).
    fn handing_off(max_rows: usize) -> Statements {
        Statements {
            leaving: Some(Vec::new()),
            ..Statements::new(max_rows)
        }
    }

    /// What the evictions since the last call took the last row of.
    fn take_leaving(&mut self) -> Vec<Leaving> {
        self.leaving
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// The statements this table has rows of.
    fn fingerprints(&self) -> HashSet<u64> {
        self.rows.keys().map(|k| k.0).collect()
    }

    /// Takes over what another table's eviction took of a statement this one has rows of:
    /// its text, if this table has none, and its server counters (within the bound). What it
    /// has no room for comes back, for another table.
    fn adopt(&mut self, leaving: Leaving) -> Option<Leaving> {
        let fingerprint = leaving.fingerprint;
        let mut rest = Leaving::of(fingerprint);
        let text = leaving.text;
        let kept = match (self.has_text(fingerprint), &text) {
            (false, Some(t)) => self.keep_text(fingerprint, t.clone()),
            _ => false,
        };
        for ((role, database), c) in leaving.server {
            if !self.add_server(fingerprint, &role, &database, &c) {
                rest.server.push(((role, database), c));
            }
        }
        // The text goes on where this table did not keep it, or with the counters that go on
        // (a table takes counters only of a statement whose text it has).
        if !kept || !rest.server.is_empty() {
            rest.text = text;
        }
        (rest.text.is_some() || !rest.server.is_empty()).then_some(rest)
    }

    /// A new bound (a reload); rows over it go at the next insertion.
    pub fn set_max_rows(&mut self, max_rows: usize) {
        self.max_rows = max_rows;
        if max_rows == 0 {
            self.rows.clear();
            self.texts.clear();
            self.server.clear();
            self.count = 0;
        }
    }

    /// Whether the normalized text of `fingerprint` is kept.
    pub fn has_text(&self, fingerprint: u64) -> bool {
        self.texts.contains_key(&fingerprint)
    }

    /// Keeps the normalized text of `fingerprint` (bounded with the rows, each at most
    /// [`MAX_TEXT`] bytes).
    pub fn set_text(&mut self, fingerprint: u64, mut text: String) {
        if text.len() > MAX_TEXT {
            let mut end = MAX_TEXT;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            text.truncate(end);
            text.push_str(" ...");
        }
        self.keep_text(fingerprint, text);
    }

    /// Keeps a text already cut to [`MAX_TEXT`], within the bound; whether it is kept.
    fn keep_text(&mut self, fingerprint: u64, text: String) -> bool {
        let room = self.texts.len() < self.max_rows;
        if room {
            self.texts.insert(fingerprint, text);
        }
        room
    }

    /// Counts a run of `key` (in its row and in the current minute).
    pub fn record(&mut self, key: KeyRef<'_>, ran: &Ran<'_>) {
        let failed = ran.error.is_some();
        let (fingerprint, tenant) = (key.fingerprint, key.tenant);
        // One logarithm for both sketches the run goes in.
        let latency = Latency::of(ran.seconds);
        if self.max_rows == 0 {
            self.minute.add(fingerprint, tenant, latency, failed, None);
            return;
        }
        let row = self.row(key);
        // Only a long run can be slow for its statement: the median is read for those alone.
        let median = match ran.seconds >= SLOW_FLOOR {
            true => row.latency.quantile(0.5),
            false => None,
        };
        row.calls += 1;
        row.rows += ran.rows;
        row.latency.add_latency(latency);
        row.waited += ran.waited;
        if let Some(code) = ran.error {
            *row.errors.entry(code.to_string()).or_default() += 1;
        }
        self.minute
            .add(fingerprint, tenant, latency, failed, median);
    }

    /// Adds what pg_stat_statements counted for statement `fingerprint` of server role
    /// `role` in server database `database`: only for statements pgward has rows of, bounded
    /// with the rows (and evicted with them). Whether they were added.
    pub fn add_server(
        &mut self,
        fingerprint: u64,
        role: &str,
        database: &str,
        c: &ServerCounters,
    ) -> bool {
        if !self.texts.contains_key(&fingerprint) {
            return false;
        }
        let key = (fingerprint, role.to_string(), database.to_string());
        if self.server.len() >= self.max_rows && !self.server.contains_key(&key) {
            return false;
        }
        self.server.entry(key).or_default().add(c);
        true
    }

    /// What pg_stat_statements counted for statement `fingerprint` of server role `role`
    /// in server database `database`.
    pub fn server_counters(
        &self,
        fingerprint: u64,
        role: &str,
        database: &str,
    ) -> Option<ServerCounters> {
        let k = (fingerprint, role.to_string(), database.to_string());
        self.server.get(&k).copied()
    }

    /// The current minute's tally, handed over; a new minute begins.
    pub fn take_minute(&mut self) -> Tally {
        std::mem::take(&mut self.minute)
    }

    /// The server reading counted `n` of pgward's sessions waiting for a lock.
    pub fn note_lock_waits(&mut self, n: usize) {
        self.minute.note_lock_waits(n);
    }

    /// The normalized text of `fingerprint`, if it is kept and can be shown.
    pub fn text(&self, fingerprint: u64) -> Option<&str> {
        let text = self.texts.get(&fingerprint)?;
        (!text.is_empty()).then_some(text.as_str())
    }

    /// Counts a refusal of `key` by pgward.
    pub fn refused(&mut self, key: KeyRef<'_>, reason: &str) {
        if self.max_rows == 0 {
            return;
        }
        *self
            .row(key)
            .refusals
            .entry(reason.to_string())
            .or_default() += 1;
    }

    fn slot_of(&self, key: KeyRef<'_>) -> (u64, u64) {
        let who = self.hasher.hash_one((key.tenant, key.role, key.database));
        (key.fingerprint, who)
    }

    fn row(&mut self, key: KeyRef<'_>) -> &mut StatementRow {
        let slot = self.slot_of(key);
        // With room for a new row (the common case) the slot is looked up once.
        let at = match self.count >= self.max_rows {
            true => self
                .rows
                .get(&slot)
                .and_then(|rows| rows.iter().position(|(k, _)| key.matches(k))),
            false => None,
        };
        if at.is_none() && self.count >= self.max_rows {
            self.evict();
        }
        let rows = self.rows.entry(slot).or_default();
        let at = at.or_else(|| rows.iter().position(|(k, _)| key.matches(k)));
        let at = at.unwrap_or_else(|| {
            rows.push((key.owned(), StatementRow::default()));
            self.count += 1;
            rows.len() - 1
        });
        &mut rows[at].1
    }

    /// Makes room: the least-called twentieth of the bound goes (at least one row), and the
    /// texts no row uses any more.
    fn evict(&mut self) {
        let over = (self.count + 1).saturating_sub(self.max_rows);
        let n = (self.max_rows / 20).max(1).max(over).min(self.count);
        if n == 0 {
            return;
        }
        let mut weights: Vec<u64> = self.all().map(|(_, r)| weight(r)).collect();
        // The n-th least used: rows used less go, and as many as needed of those used exactly
        // that much.
        let (_, &mut cut, _) = weights.select_nth_unstable(n - 1);
        let mut at_cut = n - weights.iter().filter(|&&w| w < cut).count();
        let mut gone = 0;
        for rows in self.rows.values_mut() {
            rows.retain(|(_, r)| {
                let w = weight(r);
                let go = w < cut || (w == cut && at_cut > 0);
                if go && w == cut {
                    at_cut -= 1;
                }
                gone += usize::from(go);
                !go
            });
        }
        self.rows.retain(|_, rows| !rows.is_empty());
        self.count -= gone;
        self.evicted += gone as u64;
        let used = self.fingerprints();
        let mut left: HashMap<u64, Leaving> = HashMap::default();
        let keep = self.leaving.is_some();
        self.texts.retain(|&f, text| {
            if !used.contains(&f) && keep {
                let l = left.entry(f).or_insert_with(|| Leaving::of(f));
                l.text = Some(std::mem::take(text));
            }
            used.contains(&f)
        });
        self.server.retain(|(f, role, database), c| {
            if !used.contains(f) && keep {
                let l = left.entry(*f).or_insert_with(|| Leaving::of(*f));
                let (role, database) = (role.clone(), database.clone());
                l.server.push(((role, database), *c));
            }
            used.contains(f)
        });
        if let Some(leaving) = self.leaving.as_mut() {
            leaving.extend(left.into_values());
        }
    }

    fn all(&self) -> impl Iterator<Item = (&StatementKey, &StatementRow)> {
        self.rows.values().flatten().map(|(k, r)| (k, r))
    }

    /// Rows evicted since the start.
    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    /// Rows kept.
    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The `n` rows with the most total time (of `tenant` only, if given), most first, with
    /// their texts.
    pub fn top(
        &self,
        n: usize,
        tenant: Option<&str>,
    ) -> Vec<(StatementKey, StatementRow, Option<String>)> {
        let mut rows: Vec<(&StatementKey, &StatementRow)> = self
            .all()
            .filter(|(k, _)| tenant.is_none_or(|t| *k.tenant == *t))
            .collect();
        rows.sort_by(|a, b| {
            b.1.latency
                .sum()
                .total_cmp(&a.1.latency.sum())
                .then(a.0.cmp(b.0))
        });
        rows.into_iter()
            .take(n)
            .map(|(k, r)| (k.clone(), r.clone(), self.shown_text(k.fingerprint)))
            .collect()
    }

    /// The normalized text of `fingerprint` as SHOW shows it: an empty text is one that could
    /// not be shown without its constants.
    fn shown_text(&self, fingerprint: u64) -> Option<String> {
        let text = self.texts.get(&fingerprint)?;
        (!text.is_empty()).then(|| text.clone())
    }
}

impl Leaving {
    fn of(fingerprint: u64) -> Leaving {
        Leaving {
            fingerprint,
            text: None,
            server: Vec::new(),
        }
    }
}

/// The statement statistics of every worker thread: one [`Statements`] per thread, each
/// bounded by `max_statement_stats`, locked by that thread's sessions as they record and by
/// the readers, which sum a statement's rows of every table. A reader that needs several
/// tables locks them in their order, and no one holds one table's lock while taking another
/// out of that order.
#[derive(Debug)]
pub struct StatementTables {
    tables: Vec<Mutex<Statements>>,
}

impl Default for StatementTables {
    fn default() -> Self {
        StatementTables::new(1, DEFAULT_MAX_ROWS)
    }
}

impl StatementTables {
    /// Tables for `threads` worker threads, of at most `max_rows` rows each.
    pub fn new(threads: usize, max_rows: usize) -> StatementTables {
        let table = |_| match threads > 1 {
            true => Mutex::new(Statements::handing_off(max_rows)),
            false => Mutex::new(Statements::new(max_rows)),
        };
        StatementTables {
            tables: (0..threads.max(1)).map(table).collect(),
        }
    }

    /// The table of worker thread `worker`'s sessions.
    fn of(&self, worker: usize) -> &Mutex<Statements> {
        &self.tables[worker % self.tables.len()]
    }

    /// Runs `record` on the table of worker thread `worker` (a session of that thread counts
    /// its runs), then hands what an eviction took of a statement to another table that still
    /// has rows of it: its text and server counters go only with the statement's last row.
    pub fn record<T>(&self, worker: usize, record: impl FnOnce(&mut Statements) -> T) -> T {
        let (out, leaving) = {
            let mut table = lock(self.of(worker));
            let out = record(&mut table);
            (out, table.take_leaving())
        };
        if !leaving.is_empty() {
            self.hand_off(worker, leaving);
        }
        out
    }

    /// Gives each statement of `leaving` (which left table `from`) to the other tables that
    /// have rows of it, in order, each taking what it has room for, one table locked at a
    /// time; what none takes goes.
    fn hand_off(&self, from: usize, leaving: Vec<Leaving>) {
        let mut leaving: Vec<Option<Leaving>> = leaving.into_iter().map(Some).collect();
        for (i, table) in self.tables.iter().enumerate() {
            if i == from % self.tables.len() || leaving.iter().all(Option::is_none) {
                continue;
            }
            let mut table = lock(table);
            let has = table.fingerprints();
            for slot in leaving.iter_mut() {
                if slot.as_ref().is_some_and(|l| has.contains(&l.fingerprint)) {
                    if let Some(l) = slot.take() {
                        *slot = table.adopt(l);
                    }
                }
            }
        }
    }

    /// Every table, locked in order.
    fn all(&self) -> Vec<std::sync::MutexGuard<'_, Statements>> {
        self.tables.iter().map(lock).collect()
    }

    /// A new bound for each table (a reload).
    pub fn set_max_rows(&self, max_rows: usize) {
        for table in &self.tables {
            lock(table).set_max_rows(max_rows);
        }
    }

    /// The current minute's tally of every table, handed over; a new minute begins.
    pub fn take_minute(&self) -> Tally {
        let mut minute = Tally::default();
        for table in &self.tables {
            minute.merge(lock(table).take_minute());
        }
        minute
    }

    /// The server reading counted `n` of pgward's sessions waiting for a lock.
    pub fn note_lock_waits(&self, n: usize) {
        lock(&self.tables[0]).note_lock_waits(n);
    }

    /// The normalized text of `fingerprint`, if a table keeps it and it can be shown.
    pub fn text(&self, fingerprint: u64) -> Option<String> {
        self.tables
            .iter()
            .find_map(|t| lock(t).text(fingerprint).map(str::to_string))
    }

    /// Adds what pg_stat_statements counted for each statement of `changes` (fingerprint,
    /// server role, server database, counters) to the first table that has its text and room
    /// for them (they go with the statement's last row of any table); a statement no table
    /// has is left out.
    pub fn add_server(&self, changes: &[(u64, &str, &str, &ServerCounters)]) {
        let mut placed = vec![false; changes.len()];
        for table in &self.tables {
            let mut table = lock(table);
            for (change, done) in changes.iter().zip(placed.iter_mut()) {
                let (fingerprint, role, database, c) = *change;
                if !*done {
                    *done = table.add_server(fingerprint, role, database, c);
                }
            }
        }
    }

    /// What pg_stat_statements counted for each statement of `wanted` (fingerprint, server
    /// role, server database), summed over the tables, read at one moment.
    #[cfg(test)]
    pub fn server_counters(&self, wanted: &[(u64, &str, &str)]) -> Vec<Option<ServerCounters>> {
        let tables = self.all();
        let sum = |&(fingerprint, role, database): &(u64, &str, &str)| {
            server_counters_of(&tables, fingerprint, role, database)
        };
        wanted.iter().map(sum).collect()
    }

    /// The `n` rows with the most total time (of `tenant` only, if given), most first, with
    /// their texts (each statement's rows of every table summed), each row with what
    /// pg_stat_statements counted of its statement for the server role and database
    /// `server_of` names, rows and counters read under one
    /// locking of every table (a statement's text and counters on their way from a table
    /// that evicted its last row there to another, see [`record`](Self::record), are in
    /// none). `server_of` runs under those locks: it must not touch the tables.
    pub fn top_with_server(
        &self,
        n: usize,
        tenant: Option<&str>,
        server_of: impl Fn(&StatementKey) -> (String, String),
    ) -> Vec<(StatementRowOf, Option<ServerCounters>)> {
        let tables = self.all();
        top_of(&tables, n, tenant)
            .into_iter()
            .map(|row| {
                let (role, database) = server_of(&row.0);
                let server = server_counters_of(&tables, row.0.fingerprint, &role, &database);
                (row, server)
            })
            .collect()
    }

    /// Rows kept (a statement with rows in several tables counts once) and rows the tables
    /// evicted since the start (a statement evicted from two tables counts twice), read at
    /// one moment.
    #[cfg(test)]
    pub fn counts(&self) -> (usize, u64) {
        counts_of(&self.all())
    }

    /// The `n` rows with the most total time (of `tenant` only, if given), most first, with
    /// their texts: each statement's rows of every table summed, read at one moment.
    #[cfg(test)]
    pub fn top(&self, n: usize, tenant: Option<&str>) -> Vec<StatementRowOf> {
        top_of(&self.all(), n, tenant)
    }

    /// Rows kept (a statement with rows in several tables counts once) and rows the tables
    /// evicted since the start (a statement evicted from two tables counts twice), with the
    /// `n` rows with the most total time, most first, and their texts: all read under one
    /// locking of the tables (the metrics' families of one moment).
    pub fn counts_and_top(&self, n: usize) -> ((usize, u64), Vec<StatementRowOf>) {
        let tables = self.all();
        (counts_of(&tables), top_of(&tables, n, None))
    }
}

/// The rows kept and evicted of `tables` (see [`StatementTables::counts_and_top`]).
fn counts_of(tables: &[std::sync::MutexGuard<'_, Statements>]) -> (usize, u64) {
    if let [table] = tables {
        return (table.len(), table.evicted());
    }
    let keys: HashSet<&StatementKey> = tables
        .iter()
        .flat_map(|t| t.all().map(|(k, _)| k))
        .collect();
    (keys.len(), tables.iter().map(|t| t.evicted()).sum())
}

/// A statement's row as SHOW STATEMENTS lists it: its key, its counts, its text.
pub type StatementRowOf = (StatementKey, StatementRow, Option<String>);

/// What pg_stat_statements counted of a statement for a server role and database, summed
/// over `tables`.
fn server_counters_of(
    tables: &[std::sync::MutexGuard<'_, Statements>],
    fingerprint: u64,
    role: &str,
    database: &str,
) -> Option<ServerCounters> {
    let parts = tables
        .iter()
        .filter_map(|t| t.server_counters(fingerprint, role, database));
    parts.reduce(|mut sum, c| {
        sum.add(&c);
        sum
    })
}

/// The `n` rows of `tables` (locked) with the most total time (of `tenant` only, if given),
/// most first, each statement's rows summed, with its text.
fn top_of(
    tables: &[std::sync::MutexGuard<'_, Statements>],
    n: usize,
    tenant: Option<&str>,
) -> Vec<StatementRowOf> {
    if let [table] = tables {
        return table.top(n, tenant);
    }
    let mut rows: std::collections::HashMap<&StatementKey, Vec<&StatementRow>> =
        std::collections::HashMap::new();
    for table in tables {
        let mine = table
            .all()
            .filter(|(k, _)| tenant.is_none_or(|t| *k.tenant == *t));
        for (key, row) in mine {
            rows.entry(key).or_default().push(row);
        }
    }
    let mut totals: Vec<(&StatementKey, f64)> = rows
        .iter()
        .map(|(k, parts)| (*k, parts.iter().map(|r| r.latency.sum()).sum()))
        .collect();
    totals.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(b.0)));
    totals
        .into_iter()
        .take(n)
        .map(|(key, _)| {
            let mut sum = StatementRow::default();
            for part in &rows[key] {
                sum.merge(part);
            }
            // Any table's text of the statement (a refused run sets none in its own).
            let text = tables.iter().find_map(|t| t.shown_text(key.fingerprint));
            (key.clone(), sum, text)
        })
        .collect()
}

/// How much a row was used: its runs and refusals.
fn weight(r: &StatementRow) -> u64 {
    r.calls + r.refusals.values().sum::<u64>()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(fingerprint: u64, tenant: &str) -> StatementKey {
        StatementKey {
            fingerprint,
            tenant: Arc::from(tenant),
            role: Arc::from("app"),
            database: Arc::from("db"),
        }
    }

    /// What pg_stat_statements counts of one call that wrote 10 bytes of WAL.
    fn one_call() -> ServerCounters {
        ServerCounters {
            calls: 1,
            wal_bytes: 10,
            ..ServerCounters::default()
        }
    }

    fn ran(seconds: f64) -> Ran<'static> {
        Ran {
            seconds,
            waited: 0.0,
            rows: 1,
            error: None,
        }
    }

    #[test]
    fn rows_count_runs_errors_and_refusals_apart_and_top_orders_by_total_time() {
        let mut s = Statements::new(10);
        for _ in 0..3 {
            s.record(key(1, "a").borrowed(), &ran(0.01));
        }
        s.record(
            key(1, "a").borrowed(),
            &Ran {
                seconds: 0.5,
                waited: 0.2,
                rows: 0,
                error: Some("57014"),
            },
        );
        s.refused(key(1, "a").borrowed(), "budget");
        s.record(key(2, "b").borrowed(), &ran(1.0));
        s.set_text(1, "SELECT $1".into());
        let top = s.top(10, None);
        assert_eq!(top.len(), 2);
        assert_eq!(top[0].0, key(2, "b"));
        let (_, row, text) = &top[1];
        assert_eq!((row.calls, row.rows), (4, 3));
        assert_eq!(row.errors["57014"], 1);
        assert_eq!(row.refusals["budget"], 1);
        assert!((row.waited - 0.2).abs() < 1e-12);
        assert_eq!(text.as_deref(), Some("SELECT $1"));
        assert_eq!(s.top(10, Some("a")).len(), 1);
        assert_eq!(s.top(1, None).len(), 1);
    }

    #[test]
    fn server_counters_are_kept_only_for_statements_with_rows_and_go_with_them() {
        let mut s = Statements::new(2);
        let c = one_call();
        // A statement pgward never ran (the reading's own, another application's): left out.
        s.add_server(9, "app", "db", &c);
        assert_eq!(s.server_counters(9, "app", "db"), None);
        s.record(key(1, "a").borrowed(), &ran(0.01));
        s.set_text(1, "SELECT $1".into());
        s.add_server(1, "app", "db", &c);
        s.add_server(1, "app", "db", &c);
        assert_eq!(
            s.server_counters(1, "app", "db").map(|c| c.wal_bytes),
            Some(20)
        );
        // Evicted with its row.
        for i in 2..5 {
            s.record(key(i, "a").borrowed(), &ran(0.01));
            s.record(key(i, "a").borrowed(), &ran(0.01));
        }
        assert!(s.top(10, None).iter().all(|(k, _, _)| k.fingerprint != 1));
        assert_eq!(s.server_counters(1, "app", "db"), None);
    }

    #[test]
    fn a_statements_text_and_server_counters_go_only_with_its_last_row_of_any_thread() {
        let tables = StatementTables::new(2, 2);
        let c = one_call();
        tables.add_server(&[(1, "app", "db", &c)]);
        assert_eq!(tables.server_counters(&[(1, "app", "db")])[0], None);
        // Statement 1 runs once on the first thread and often on the second; statement 3 ran
        // on the first thread and was only refused on the second.
        tables.record(0, |s| {
            s.record(key(1, "a").borrowed(), &ran(0.01));
            s.set_text(1, "SELECT $1".into());
            s.record(key(3, "a").borrowed(), &ran(0.01));
            s.set_text(3, "SELECT $1, $2".into());
        });
        tables.record(1, |s| {
            for _ in 0..5 {
                s.record(key(1, "b").borrowed(), &ran(0.01));
            }
            s.set_text(1, "SELECT $1".into());
            s.refused(key(3, "b").borrowed(), "rule");
        });
        // The reading's counts go to the first table that has the statement.
        tables.add_server(&[(1, "app", "db", &c), (1, "app", "db", &c)]);
        assert_eq!(
            lock(tables.of(0))
                .server_counters(1, "app", "db")
                .map(|c| c.wal_bytes),
            Some(20)
        );
        // The first thread evicts both: what it had of them goes to the second's table.
        tables.record(0, |s| {
            for i in 4..6 {
                s.record(key(i, "a").borrowed(), &ran(0.01));
                s.record(key(i, "a").borrowed(), &ran(0.01));
            }
        });
        assert!(lock(tables.of(0))
            .fingerprints()
            .is_disjoint(&HashSet::from([1, 3])));
        assert_eq!(
            tables.server_counters(&[(1, "app", "db")])[0].map(|c| c.wal_bytes),
            Some(20)
        );
        let refused = tables.top(10, None);
        let three = refused.iter().find(|(k, _, _)| k.fingerprint == 3);
        assert_eq!(three.and_then(|r| r.2.as_deref()), Some("SELECT $1, $2"));
        tables.add_server(&[(1, "app", "db", &c)]);
        assert_eq!(
            tables.server_counters(&[(1, "app", "db")])[0].map(|c| c.wal_bytes),
            Some(30)
        );
        // Gone from every table: gone.
        tables.record(1, |s| {
            for i in 6..8 {
                for _ in 0..6 {
                    s.record(key(i, "b").borrowed(), &ran(0.01));
                }
            }
        });
        assert_eq!(tables.server_counters(&[(1, "app", "db")])[0], None);
        assert_eq!((tables.text(1), tables.text(3)), (None, None));
    }

    #[test]
    fn counters_a_table_has_no_room_for_go_on_to_the_next_that_has_the_statement() {
        let tables = StatementTables::new(3, 2);
        let c = one_call();
        let run = |worker, fingerprint| {
            tables.record(worker, |s| {
                s.record(key(fingerprint, "a").borrowed(), &ran(0.01));
                s.set_text(fingerprint, format!("SELECT {fingerprint}"));
            });
        };
        run(0, 1);
        run(1, 1);
        run(1, 2);
        // Only refused on the third thread: no text there.
        tables.record(2, |s| s.refused(key(1, "a").borrowed(), "rule"));
        tables.add_server(&[(1, "app", "db", &c)]);
        // The second table's counters are full (its bound is 2).
        tables.add_server(&[(2, "app", "db", &c), (2, "app", "other", &c)]);
        // The first table evicts statement 1: the second has no room, the third takes them
        // with the text.
        tables.record(0, |s| {
            for _ in 0..3 {
                s.record(key(5, "a").borrowed(), &ran(0.01));
            }
            s.record(key(4, "a").borrowed(), &ran(0.01));
        });
        assert!(!lock(tables.of(0)).fingerprints().contains(&1));
        let now = tables.server_counters(&[(1, "app", "db"), (2, "app", "other")]);
        assert_eq!(now[0].map(|c| c.wal_bytes), Some(10));
        assert_eq!(now[1].map(|c| c.wal_bytes), Some(10));
        let third = lock(tables.of(2));
        assert!(third.server_counters(1, "app", "db").is_some());
        assert_eq!(third.text(1), Some("SELECT 1"));
    }

    #[test]
    fn a_long_text_handed_on_is_not_cut_again() {
        let tables = StatementTables::new(2, 1);
        let long = format!("SELECT 'x{}'", "é".repeat(3000));
        tables.record(0, |s| {
            s.record(key(1, "a").borrowed(), &ran(0.01));
            s.set_text(1, long);
        });
        let cut = tables.text(1).expect("kept");
        assert!(cut.ends_with("' ...") || cut.ends_with("é ..."), "{cut}");
        tables.record(1, |s| s.refused(key(1, "b").borrowed(), "rule"));
        tables.record(0, |s| s.record(key(2, "a").borrowed(), &ran(0.01)));
        assert_eq!(lock(tables.of(1)).text(1), Some(cut.as_str()));
    }

    #[test]
    fn each_threads_rows_are_summed_when_read() {
        let tables = StatementTables::new(3, 10);
        let failed = Ran {
            seconds: 0.5,
            waited: 0.25,
            rows: 0,
            error: Some("57014"),
        };
        lock(tables.of(0)).record(key(1, "a").borrowed(), &ran(0.01));
        lock(tables.of(2)).record(key(1, "a").borrowed(), &ran(0.02));
        lock(tables.of(2)).record(key(1, "a").borrowed(), &failed);
        lock(tables.of(1)).refused(key(1, "a").borrowed(), "budget");
        lock(tables.of(1)).record(key(2, "b").borrowed(), &ran(0.001));
        lock(tables.of(2)).set_text(1, "SELECT $1".into());
        let top = tables.top(10, None);
        assert_eq!(top.len(), 2);
        let (k, row, text) = &top[0];
        assert_eq!(k, &key(1, "a"));
        assert_eq!((row.calls, row.rows, row.latency.count()), (3, 2, 3));
        assert!((row.latency.sum() - 0.53).abs() < 1e-9);
        assert!((row.waited - 0.25).abs() < 1e-12);
        assert_eq!((row.errors["57014"], row.refusals["budget"]), (1, 1));
        assert_eq!(text.as_deref(), Some("SELECT $1"));
        assert_eq!(tables.top(1, None).len(), 1);
        assert_eq!(tables.top(10, Some("b")).len(), 1);
        assert_eq!(tables.counts(), (2, 0));
        let (counts, top) = tables.counts_and_top(1);
        assert_eq!((counts, top.len(), &top[0].0), ((2, 0), 1, &key(1, "a")));
        assert_eq!(tables.text(1).as_deref(), Some("SELECT $1"));
        assert_eq!(tables.take_minute().statements(), 4);
        assert_eq!(tables.take_minute().statements(), 0);
        // Refused only on its thread: the text comes from another table.
        lock(tables.of(1)).refused(key(3, "c").borrowed(), "rule");
        lock(tables.of(0)).set_text(3, "SELECT $1, $2".into());
        let refused = tables.top(10, Some("c"));
        assert_eq!(refused[0].2.as_deref(), Some("SELECT $1, $2"));
        // Each table is bounded by the whole bound.
        tables.set_max_rows(3);
        assert_eq!(lock(tables.of(2)).max_rows, 3);
    }

    /// SHOW STATEMENTS' rows, each with pg_stat_statements' counters of its statement for the
    /// server role and database it runs as, summed over the threads' tables.
    #[test]
    fn the_top_rows_come_with_their_statements_server_counters() {
        for threads in [1, 2] {
            let tables = StatementTables::new(threads, 10);
            tables.record(0, |s| {
                s.record(key(1, "a").borrowed(), &ran(0.02));
                s.set_text(1, "SELECT $1".into());
            });
            tables.record(threads - 1, |s| {
                s.record(key(1, "a").borrowed(), &ran(0.01));
                s.record(key(2, "b").borrowed(), &ran(0.001));
                s.set_text(2, "SELECT 2".into());
            });
            let c = one_call();
            tables.add_server(&[(1, "owner", "real", &c), (2, "app", "db", &c)]);
            tables.add_server(&[(1, "owner", "real", &c)]);
            // Statement 1's runs as the server role "owner" in "real"; 2's as pgward names them.
            let server_of = |k: &StatementKey| match k.fingerprint {
                1 => ("owner".to_string(), "real".to_string()),
                _ => (k.role.to_string(), k.database.to_string()),
            };
            let rows = tables.top_with_server(10, None, server_of);
            let seen: Vec<_> = rows
                .iter()
                .map(|((k, row, _), c)| (k.fingerprint, row.calls, c.map(|c| c.wal_bytes)))
                .collect();
            assert_eq!(seen, vec![(1, 2, Some(20)), (2, 1, Some(10))], "{threads}");
            let one = tables.top_with_server(1, Some("b"), |_| ("x".into(), "y".into()));
            assert_eq!(one.len(), 1);
            assert_eq!((one[0].0 .0.fingerprint, one[0].1), (2, None));
        }
    }

    #[test]
    fn no_row_is_kept_at_a_bound_of_zero_but_the_minute_is_tallied() {
        let mut s = Statements::new(0);
        s.record(key(1, "a").borrowed(), &ran(0.01));
        s.refused(key(1, "a").borrowed(), "budget");
        s.set_text(1, "SELECT 1".into());
        assert!(s.is_empty() && s.top(10, None).is_empty());
        assert_eq!(s.take_minute().statements(), 1);
    }

    #[test]
    fn a_hundred_thousand_distinct_statements_stay_within_the_bound() {
        let mut s = Statements::new(1_000);
        // One busy statement, then a flood of one-offs.
        for _ in 0..50 {
            s.record(key(0, "busy").borrowed(), &ran(0.001));
        }
        for i in 1..=100_000u64 {
            s.record(key(i, "t").borrowed(), &ran(0.001));
            s.set_text(i, format!("SELECT {i}"));
            assert!(s.len() <= 1_000);
        }
        assert!(s.texts.len() <= 1_000);
        assert_eq!(s.evicted() + s.len() as u64, 100_001);
        // The busy one was never the least called.
        assert!(s.top(1_000, Some("busy")).len() == 1);
    }
}
