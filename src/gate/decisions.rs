//! The decision log: each [`Record`] as one JSON line, with the time, appended to the file
//! `[decisions]` names in the policy. Not pure: it owns the file. The file is opened again at
//! every reload (SIGHUP or RELOAD), so logrotate may move it away and signal; one that cannot
//! be opened keeps the old one. At most `max_per_second` lines a second are written; what the
//! bound leaves out is counted in a `suppressed` line once lines may be written again.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::events::{Event, Record};
use crate::sync::lock;

/// Lines a second written at most when the policy does not say.
pub const DEFAULT_MAX_PER_SECOND: u32 = 100;

/// The decision log (inside the gate's keeper, kept across reloads).
#[derive(Debug, Default)]
pub struct DecisionLog {
    /// A file is open (one atomic load decides whether a decision is worth building).
    on: AtomicBool,
    state: Mutex<LogState>,
}

#[derive(Debug, Default)]
struct LogState {
    sink: Option<Sink>,
    bound: RateBound,
    /// A write failed, and the failure was logged: the next is logged only after a success.
    failing: bool,
}

#[derive(Debug)]
struct Sink {
    path: PathBuf,
    file: File,
}

/// One line as written: the time, then the decision's fields.
#[derive(Serialize)]
struct Line<'a> {
    ts: String,
    #[serde(flatten)]
    decision: &'a Record,
}

impl DecisionLog {
    /// Opens `file` for appending (again, if it is the one open: a rotated file is left to
    /// logrotate), or closes the log when `file` is `None`. A file that cannot be opened
    /// leaves the log as it was, and the error says which file.
    pub fn open(&self, file: Option<&Path>, max_per_second: u32) -> Result<(), String> {
        let sink = match file {
            Some(path) => Some(Sink {
                path: path.to_path_buf(),
                file: OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .map_err(|e| format!("decision log {}: {e}", path.display()))?,
            }),
            None => None,
        };
        let mut state = lock(&self.state);
        self.on.store(sink.is_some(), Ordering::Release);
        state.sink = sink;
        state.bound.per_second = max_per_second.max(1);
        state.failing = false;
        Ok(())
    }

    /// Opens the file being written again, if any (logrotate moved it away and signalled).
    pub fn reopen(&self) -> Result<(), String> {
        let Some(path) = self.path() else {
            return Ok(());
        };
        let per_second = lock(&self.state).bound.per_second;
        self.open(Some(&path), per_second)
    }

    /// Whether a file is open: without one, decisions need not be built.
    pub fn is_on(&self) -> bool {
        self.on.load(Ordering::Acquire)
    }

    /// The file being written, if any.
    pub fn path(&self) -> Option<PathBuf> {
        lock(&self.state).sink.as_ref().map(|s| s.path.clone())
    }

    /// Writes `decision`, within the rate bound.
    pub fn record(&self, decision: &Record) {
        if !self.is_on() {
            return;
        }
        let mut state = lock(&self.state);
        let suppressed = match state.bound.admit(Instant::now()) {
            Admit::Write { suppressed } => suppressed,
            Admit::Drop => return,
        };
        let mut bytes = Vec::with_capacity(256);
        if suppressed > 0 {
            let note = Record::new(Event::Suppressed, "rate")
                .figure("lines", suppressed as f64)
                .figure("max_per_second", f64::from(state.bound.per_second));
            push_line(&mut bytes, &note);
        }
        push_line(&mut bytes, decision);
        state.write(&bytes);
    }

    /// Writes each of `decisions`, in order.
    pub fn record_all(&self, decisions: impl IntoIterator<Item = Record>) {
        for d in decisions {
            self.record(&d);
        }
    }
}

impl LogState {
    fn write(&mut self, bytes: &[u8]) {
        let Some(sink) = self.sink.as_mut() else {
            return;
        };
        // After a failed write a partial line may be in the file: it is ended first, so the
        // next line is whole JSON.
        let ended = !self.failing || sink.file.write_all(b"\n").is_ok();
        match sink.file.write_all(bytes) {
            Ok(()) if ended => self.failing = false,
            Ok(()) => {}
            Err(e) if !self.failing => {
                self.failing = true;
                tracing::warn!(file = %sink.path.display(), "decision log: cannot write: {e}");
            }
            Err(_) => {}
        }
    }
}

/// `decision` as a JSON line, with the time now, onto `out`.
fn push_line(out: &mut Vec<u8>, decision: &Record) {
    let line = Line {
        ts: timestamp(),
        decision,
    };
    if serde_json::to_writer(&mut *out, &line).is_ok() {
        out.push(b'\n');
    }
}

/// The wall-clock time in RFC 3339, UTC, to the millisecond.
fn timestamp() -> String {
    let now = time::OffsetDateTime::now_utc();
    let now = now.replace_millisecond(now.millisecond()).unwrap_or(now);
    now.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// At most `per_second` lines in each second (a window that starts at the first line after
/// the last window ended). Pure: the time is an argument.
#[derive(Debug)]
pub struct RateBound {
    per_second: u32,
    window: Option<Instant>,
    written: u32,
    suppressed: u64,
}

impl Default for RateBound {
    fn default() -> Self {
        RateBound {
            per_second: DEFAULT_MAX_PER_SECOND,
            window: None,
            written: 0,
            suppressed: 0,
        }
    }
}

/// Whether a line may be written now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    /// Yes, after a line saying how many were left out since the last one written.
    Write { suppressed: u64 },
    /// No: it is counted.
    Drop,
}

impl RateBound {
    pub fn new(per_second: u32) -> RateBound {
        RateBound {
            per_second: per_second.max(1),
            ..RateBound::default()
        }
    }

    pub fn admit(&mut self, now: Instant) -> Admit {
        let fresh = self
            .window
            .is_none_or(|w| now.saturating_duration_since(w) >= Duration::from_secs(1));
        if fresh {
            self.window = Some(now);
            self.written = 0;
        }
        if self.written >= self.per_second {
            self.suppressed += 1;
            return Admit::Drop;
        }
        self.written += 1;
        Admit::Write {
            suppressed: std::mem::take(&mut self.suppressed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_writes_so_many_a_second_and_counts_the_rest_once_it_may_write_again() {
        let t0 = Instant::now();
        let mut bound = RateBound::new(3);
        let at = |ms| t0 + Duration::from_millis(ms);
        let seen: Vec<Admit> = [0, 10, 20, 30, 999].map(|ms| bound.admit(at(ms))).into();
        let write = Admit::Write { suppressed: 0 };
        assert_eq!(seen, [write, write, write, Admit::Drop, Admit::Drop]);
        assert_eq!(bound.admit(at(1000)), Admit::Write { suppressed: 2 });
        assert_eq!(bound.admit(at(1001)), write);
    }

    #[test]
    fn lines_are_appended_as_json_with_their_time_and_a_reopen_starts_a_new_file() {
        let dir = std::env::temp_dir().join(format!("pgward-decisions-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("decisions.jsonl");
        let _ = std::fs::remove_file(&path);
        let log = DecisionLog::default();
        let d = Record::new(Event::Refused, "budget").tenant("acme");
        log.record(&d);
        assert!(!path.exists(), "nothing is written before a file is named");
        log.open(Some(&path), 10).unwrap();
        log.record(&d);
        // logrotate moves the file away and signals: the next lines go to a new one.
        let rotated = dir.join("decisions.jsonl.1");
        std::fs::rename(&path, &rotated).unwrap();
        log.open(Some(&path), 10).unwrap();
        log.record(&Record::new(Event::Killed, "tenant").tenant("acme"));
        let old = std::fs::read_to_string(&rotated).unwrap();
        let new = std::fs::read_to_string(&path).unwrap();
        let line: serde_json::Value = serde_json::from_str(old.trim_end()).unwrap();
        assert_eq!(line["event"], "refused");
        assert_eq!(line["tenant"], "acme");
        assert!(line["ts"].as_str().unwrap().ends_with('Z'), "{line}");
        assert_eq!(new.lines().count(), 1);
        assert!(new.contains("\"event\":\"killed\""), "{new}");
        // A file that cannot be opened keeps the one open.
        let err = log.open(Some(&dir.join("no/such/dir/x")), 10).unwrap_err();
        assert!(err.contains("no/such/dir"), "{err}");
        assert_eq!(log.path(), Some(path.clone()));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
