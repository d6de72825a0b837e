//! The traffic log: one JSON line per statement the gate decided on, for `pgward simulate` to
//! try another policy on. A line says who sent which statement (by fingerprint) when, where
//! it was to run, what the gate predicted it would take and what it took on the server, and
//! whether the gate let it run or refused it; never its text nor a constant of it. Written
//! through a buffer, flushed once a second and opened again at every reload (logrotate).

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::gate::{Request, RequestKind, TxControl};
use crate::sql::{Fingerprint, Priority};
use crate::sync::lock;

/// The outcome of a request whose client left while it waited.
pub const CLIENT_LEFT: &str = "client_left";

/// One line.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// When the client sent it: seconds since the Unix epoch.
    pub at: f64,
    /// The client session.
    pub client: u64,
    pub tenant: String,
    pub role: String,
    /// The pgward database.
    pub database: String,
    /// The PostgreSQL server it was to run on, its pool, the servers that pool may open and
    /// the database's `max_db_connections` (0: none).
    pub upstream: String,
    pub pool: String,
    pub pool_size: usize,
    #[serde(default)]
    pub database_cap: usize,
    /// `critical`, `normal` or `best_effort`.
    pub priority: String,
    /// `statement`, or transaction control, which never waits: `begin`, `savepoint`
    /// (SAVEPOINT, RELEASE) or `end` (COMMIT, ROLLBACK).
    pub kind: String,
    /// The statement's fingerprint (hex), when it was read.
    #[serde(default)]
    pub fingerprint: Option<String>,
    /// The client's statement timeout and deadline tag, in seconds.
    #[serde(default)]
    pub timeout: Option<f64>,
    #[serde(default)]
    pub deadline: Option<f64>,
    /// Seconds of server time the gate predicted (when it priced it), and whether that
    /// prediction rested on the statement's own runs.
    #[serde(default)]
    pub predicted: Option<f64>,
    #[serde(default)]
    pub learned: bool,
    /// Seconds it took on the server (its share of its run), when it ran.
    #[serde(default)]
    pub took: Option<f64>,
    /// Seconds it waited in pgward's queues (refused, or its client left: from its arrival to
    /// then).
    #[serde(default)]
    pub waited: f64,
    /// `ran`, [`CLIENT_LEFT`], or the reason the gate refused it (as SHOW TENANTS counts
    /// them).
    pub outcome: String,
}

/// What the gate knew of a request when it came: the part of an [`Entry`] fixed at its
/// arrival.
#[derive(Clone, Debug)]
pub struct Arrival {
    at: f64,
    /// When the client sent it, on the monotonic clock (how long a refused request waited).
    sent_at: Instant,
    client: u64,
    upstream: String,
    pool: String,
    pool_size: usize,
    database_cap: usize,
    priority: Priority,
    kind: RequestKind,
    fingerprint: Option<Fingerprint>,
    timeout: Option<Duration>,
    deadline: Option<Duration>,
}

impl Arrival {
    /// `req`, whose `sent_at` is dated on the wall clock through `now` and `wall`.
    pub fn of(req: &Request<'_>, now: Instant, wall: SystemTime) -> Arrival {
        let ago = now.saturating_duration_since(req.sent_at);
        let sent = wall.checked_sub(ago).unwrap_or(wall);
        Arrival {
            at: sent
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs_f64(),
            sent_at: req.sent_at,
            client: req.client_id,
            upstream: req.upstream.to_string(),
            pool: req.pool.to_string(),
            pool_size: req.pool_size,
            database_cap: req.database_cap,
            priority: req.priority,
            kind: req.kind,
            fingerprint: req.fingerprint,
            timeout: req.statement_timeout,
            deadline: req.deadline,
        }
    }

    /// How long ago the client sent it.
    pub fn age(&self) -> Duration {
        self.sent_at.elapsed()
    }

    /// The line for this request of `tenant` (through `role`, in `database`).
    pub fn entry(&self, who: (&str, &str, &str), outcome: Outcome) -> Entry {
        let (tenant, role, database) = who;
        Entry {
            at: self.at,
            client: self.client,
            tenant: tenant.to_string(),
            role: role.to_string(),
            database: database.to_string(),
            upstream: self.upstream.clone(),
            pool: self.pool.clone(),
            pool_size: self.pool_size,
            database_cap: self.database_cap,
            priority: priority_name(self.priority).to_string(),
            kind: kind_name(self.kind).to_string(),
            fingerprint: self.fingerprint.map(|f| f.hex()),
            timeout: self.timeout.map(|d| d.as_secs_f64()),
            deadline: self.deadline.map(|d| d.as_secs_f64()),
            predicted: outcome.predicted,
            learned: outcome.learned,
            took: outcome.took,
            waited: outcome.waited,
            outcome: outcome.outcome.to_string(),
        }
    }
}

/// How a request ended.
#[derive(Clone, Copy, Debug)]
pub struct Outcome<'a> {
    pub predicted: Option<f64>,
    pub learned: bool,
    pub took: Option<f64>,
    pub waited: f64,
    /// `ran`, or the refusal's reason.
    pub outcome: &'a str,
}

pub fn priority_name(p: Priority) -> &'static str {
    match p {
        Priority::Critical => "critical",
        Priority::Normal => "normal",
        Priority::BestEffort => "best_effort",
    }
}

fn kind_name(kind: RequestKind) -> &'static str {
    match kind {
        RequestKind::Statement | RequestKind::Carrier => "statement",
        RequestKind::Transaction(TxControl::Begin) => "begin",
        RequestKind::Transaction(TxControl::Savepoint | TxControl::Release) => "savepoint",
        RequestKind::Transaction(_) => "end",
    }
}

/// [`kind_name`] read back (`None`: a word it never writes).
pub fn kind_of(name: &str) -> Option<RequestKind> {
    match name {
        "statement" => Some(RequestKind::Statement),
        "begin" => Some(RequestKind::Transaction(TxControl::Begin)),
        "savepoint" => Some(RequestKind::Transaction(TxControl::Savepoint)),
        "end" => Some(RequestKind::Transaction(TxControl::Commit)),
        _ => None,
    }
}

/// The file (in the operations state, kept across reloads).
#[derive(Debug, Default)]
pub struct TrafficLog {
    on: AtomicBool,
    sink: Mutex<Option<Sink>>,
}

/// A traffic log file opened and not yet written to (or none).
#[derive(Debug)]
pub struct Prepared(Option<Sink>);

#[derive(Debug)]
struct Sink {
    path: PathBuf,
    out: BufWriter<File>,
    failing: bool,
}

impl TrafficLog {
    /// Opens `file` for appending (again, if it is the one open), or closes the log when
    /// `None`. A file that cannot be opened leaves the log as it was, and the error says which.
    pub fn open(&self, file: Option<&Path>) -> Result<(), String> {
        let next = TrafficLog::prepare(file)?;
        self.install(next);
        Ok(())
    }

    /// Opens `file` without writing to it yet (a reload opens every file before it changes
    /// anything): [`install`](Self::install) makes it the log.
    pub fn prepare(file: Option<&Path>) -> Result<Prepared, String> {
        let Some(path) = file else {
            return Ok(Prepared(None));
        };
        let f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| format!("traffic log {}: {e}", path.display()))?;
        Ok(Prepared(Some(Sink {
            path: path.to_path_buf(),
            out: BufWriter::with_capacity(64 * 1024, f),
            failing: false,
        })))
    }

    /// Makes a prepared file the log (what the old one held is written out first).
    pub fn install(&self, next: Prepared) {
        let mut current = lock(&self.sink);
        if let Some(old) = current.as_mut() {
            old.flush();
        }
        self.on.store(next.0.is_some(), Ordering::Release);
        *current = next.0;
    }

    /// Opens the file being written again, if any.
    pub fn reopen(&self) -> Result<(), String> {
        let path = lock(&self.sink).as_ref().map(|s| s.path.clone());
        match path {
            Some(p) => self.open(Some(&p)),
            None => Ok(()),
        }
    }

    /// Whether a file is open: without one, nothing need be gathered.
    pub fn is_on(&self) -> bool {
        self.on.load(Ordering::Acquire)
    }

    /// Appends `entry`.
    pub fn write(&self, entry: &Entry) {
        if !self.is_on() {
            return;
        }
        let Ok(mut line) = serde_json::to_vec(entry) else {
            return;
        };
        line.push(b'\n');
        if let Some(sink) = lock(&self.sink).as_mut() {
            let result = sink.out.write_all(&line);
            sink.note(result);
        }
    }

    /// Writes out what the buffer holds.
    pub fn flush(&self) {
        if let Some(sink) = lock(&self.sink).as_mut() {
            sink.flush();
        }
    }
}

impl Sink {
    fn flush(&mut self) {
        let result = self.out.flush();
        self.note(result);
    }

    fn note(&mut self, result: std::io::Result<()>) {
        match result {
            Ok(()) => self.failing = false,
            Err(e) if !self.failing => {
                self.failing = true;
                tracing::warn!(file = %self.path.display(), "traffic log: cannot write: {e}");
            }
            Err(_) => {}
        }
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        let _ = self.out.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_reads_back_as_it_was_written() {
        let req = Request {
            client_id: 7,
            tenant: "acme",
            priority: Priority::BestEffort,
            kind: RequestKind::Statement,
            fingerprint: Some(Fingerprint(0xabc)),
            upstream: "127.0.0.1:5432",
            pool: "app/app",
            pool_size: 4,
            database_cap: 0,
            database: "app",
            sent_at: Instant::now(),
            statement_timeout: Some(Duration::from_secs(2)),
            deadline: None,
            hint: None,
        };
        let arrival = Arrival::of(&req, Instant::now(), SystemTime::now());
        let outcome = Outcome {
            predicted: Some(0.25),
            learned: true,
            took: Some(0.3),
            waited: 0.01,
            outcome: "ran",
        };
        let entry = arrival.entry(("acme", "app", "app"), outcome);
        let line = serde_json::to_string(&entry).unwrap();
        assert!(!line.contains("SELECT"));
        let back: Entry = serde_json::from_str(&line).unwrap();
        // (JSON's decimal of a float reads back within its last digit.)
        assert!((back.at - entry.at).abs() < 1e-5);
        assert_eq!(
            Entry {
                at: entry.at,
                ..back.clone()
            },
            entry
        );
        assert_eq!(back.fingerprint.as_deref(), Some("0000000000000abc"));
        assert_eq!(kind_of(&back.kind), Some(RequestKind::Statement));
        assert_eq!(back.priority, "best_effort");
    }
}
