//! The lock-queue guard, as a pure function of a reading: which of pgward's sessions run a
//! DDL statement that waits for a lock while others queue behind it, or that has waited
//! longer than `lock_wait`. Such a statement holds its place at the head of the lock's
//! queue: every read of the table waits behind it, for as long as the transaction it
//! waits for lives. Cancelled with 55P03, what `lock_timeout` raises, migration tools retry it.

use std::time::Duration;

use super::reading::Reading;

/// A statement the guard cancels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Victim {
    pub pid: u32,
    pub waited: Duration,
    /// Sessions waiting behind it.
    pub queued: usize,
}

/// The statements to cancel: waits of pgward's sessions (`ours`) running DDL for the lock of
/// a relation or another object, with sessions queued behind them, or waiting `lock_wait` or
/// longer (`Duration::ZERO`: only the first). A row lock, a transaction id or an advisory
/// lock is no DDL's wait. A statement that builds or drops something CONCURRENTLY waits for
/// older transactions by design, and a LOCK may let reads through: those are cancelled only
/// when sessions queue behind them.
pub fn victims(reading: &Reading, ours: impl Fn(u32) -> bool, lock_wait: Duration) -> Vec<Victim> {
    reading
        .backends
        .iter()
        .filter(|b| b.waits_on_lock && ours(b.pid))
        .filter(|b| matches!(b.lock.as_deref(), Some("relation" | "object")))
        .filter_map(|b| {
            let query = b.query.as_deref()?;
            let ddl = ddl(query)?;
            let waited = b.waited.unwrap_or_default();
            let queued = reading.queued_behind(b.pid);
            let too_long = !lock_wait.is_zero() && waited >= lock_wait && ddl == Ddl::Blocking;
            (queued > 0 || too_long).then_some(Victim {
                pid: b.pid,
                waited,
                queued,
            })
        })
        .collect()
}

/// What kind of DDL a text runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ddl {
    /// Takes a lock that reads of its object queue behind.
    Blocking,
    /// Blocks reads only in some modes, or not at all: `CONCURRENTLY` waits for older
    /// transactions by design, `LOCK` may take a mode that lets reads through. Cancelled
    /// only when sessions queue behind it.
    QueueOnly,
}

/// Statements whose first word makes them DDL for the guard (a utility statement that takes
/// a strong lock on an object): not VACUUM or ANALYZE, which wait for their locks politely.
const DDL_WORDS: [&str; 12] = [
    "alter", "create", "drop", "truncate", "reindex", "cluster", "lock", "refresh", "comment",
    "grant", "revoke", "security",
];

/// Whether `query` (what pg_stat_activity shows, perhaps cut at track_activity_query_size)
/// is DDL, read with PostgreSQL's scanner; a text the scanner cannot split counts by its
/// first statement's first word. In a text of several statements only what ends with DDL
/// counts (a COMMIT or END may follow): a cancel landing after it would fail a statement
/// that waits for nothing.
fn ddl(query: &str) -> Option<Ddl> {
    let parts = pg_query::split_with_scanner(query).unwrap_or_else(|_| vec![query]);
    let word = |part: &str| crate::gate::first_keyword(part).to_ascii_lowercase();
    let is_ddl = |part: &str| DDL_WORDS.contains(&word(part).as_str());
    let last = parts.iter().rposition(|p| is_ddl(p))?;
    let ends = ["commit", "end"];
    if !parts[last + 1..]
        .iter()
        .all(|p| ends.contains(&word(p).as_str()))
    {
        return None;
    }
    let ddl: Vec<&str> = parts.into_iter().filter(|p| is_ddl(p)).collect();
    let queue_only = |part: &&str| word(part) == "lock" || concurrently(part);
    Some(match ddl.iter().all(queue_only) {
        true => Ddl::QueueOnly,
        false => Ddl::Blocking,
    })
}

/// Whether `part` says CONCURRENTLY (as a word, read by PostgreSQL's scanner).
fn concurrently(part: &str) -> bool {
    crate::sql::scan_tokens(part).is_some_and(|tokens| {
        tokens.iter().any(|t| {
            let text = usize::try_from(t.start)
                .ok()
                .zip(usize::try_from(t.end).ok())
                .and_then(|(a, b)| part.get(a..b));
            text.is_some_and(|w| w.eq_ignore_ascii_case("concurrently"))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watch::reading::Backend;

    fn waiting(pid: u32, query: &str, waited_ms: u64, blocked_by: &[u32]) -> Backend {
        Backend {
            pid,
            waits_on_lock: true,
            waited: Some(Duration::from_millis(waited_ms)),
            blocked_by: blocked_by.to_vec(),
            query: Some(query.to_string()),
            lock: Some("relation".into()),
            ..Backend::default()
        }
    }

    fn holder(pid: u32) -> Backend {
        Backend {
            pid,
            state: Some("idle in transaction".into()),
            ..Backend::default()
        }
    }

    const TWO_S: Duration = Duration::from_secs(2);

    #[test]
    fn a_ddl_with_reads_queued_behind_it_is_cancelled_at_once() {
        let reading = Reading {
            backends: vec![
                holder(1),
                waiting(2, "ALTER TABLE t ADD COLUMN c int", 100, &[1]),
                waiting(3, "SELECT count(*) FROM t", 50, &[2]),
                waiting(4, "SELECT 1 FROM t", 10, &[2]),
            ],
            replication_lag: None,
            dead_rows: 0,
        };
        let all = victims(&reading, |_| true, TWO_S);
        assert_eq!(
            all,
            vec![Victim {
                pid: 2,
                waited: Duration::from_millis(100),
                queued: 2
            }]
        );
        // Only pgward's own sessions.
        assert!(victims(&reading, |pid| pid != 2, TWO_S).is_empty());
    }

    #[test]
    fn a_ddl_alone_is_cancelled_once_it_has_waited_lock_wait() {
        let alone = |waited| Reading {
            backends: vec![holder(1), waiting(2, "DROP TABLE t", waited, &[1])],
            replication_lag: None,
            dead_rows: 0,
        };
        assert!(victims(&alone(1_999), |_| true, TWO_S).is_empty());
        assert_eq!(victims(&alone(2_000), |_| true, TWO_S).len(), 1);
        // lock_wait 0: only when others queue behind it.
        assert!(victims(&alone(60_000), |_| true, Duration::ZERO).is_empty());
    }

    #[test]
    fn reads_writes_and_concurrent_builds_waiting_alone_are_left_alone() {
        let reading = Reading {
            backends: vec![
                holder(1),
                waiting(2, "UPDATE t SET a = 1", 9_000, &[1]),
                waiting(3, "/* ALTER */ SELECT 1 FROM t", 9_000, &[1]),
                waiting(4, "CREATE INDEX CONCURRENTLY i ON t (a)", 9_000, &[1]),
                waiting(5, "VACUUM t", 9_000, &[1]),
            ],
            replication_lag: None,
            dead_rows: 0,
        };
        assert!(victims(&reading, |_| true, TWO_S).is_empty());
        // ... but a concurrent build that others queue behind is cancelled.
        let mut queued = reading.clone();
        queued
            .backends
            .push(waiting(6, "ALTER TABLE t ADD x int", 10, &[4]));
        let found = victims(&queued, |pid| pid == 4, TWO_S);
        assert_eq!(found.iter().map(|v| v.pid).collect::<Vec<_>>(), vec![4]);
    }

    #[test]
    fn a_row_lock_wait_is_no_ddl_wait() {
        let mut row = waiting(
            2,
            "CREATE TEMP TABLE x (a int); UPDATE t SET a = 1",
            9_000,
            &[1],
        );
        row.lock = Some("transactionid".into());
        let mut queued = waiting(3, "UPDATE t SET a = 2", 10, &[2]);
        queued.lock = Some("tuple".into());
        let reading = Reading {
            backends: vec![holder(1), row, queued],
            replication_lag: None,
            dead_rows: 0,
        };
        assert!(victims(&reading, |_| true, TWO_S).is_empty());
    }

    #[test]
    fn a_text_that_goes_on_after_its_ddl_and_a_lock_waiting_alone_are_left_alone() {
        let reading = Reading {
            backends: vec![
                holder(1),
                waiting(
                    2,
                    "ALTER TABLE t ADD c int; UPDATE t SET c = 1",
                    9_000,
                    &[1],
                ),
                waiting(
                    3,
                    "CREATE TEMP TABLE x (a int); SELECT * FROM t",
                    9_000,
                    &[1],
                ),
                waiting(4, "LOCK TABLE t IN SHARE ROW EXCLUSIVE MODE", 9_000, &[1]),
            ],
            replication_lag: None,
            dead_rows: 0,
        };
        assert!(victims(&reading, |_| true, TWO_S).is_empty());
        // A LOCK that reads queue behind is cancelled.
        let mut queued = reading.clone();
        queued
            .backends
            .push(waiting(5, "SELECT 1 FROM t", 10, &[4]));
        let found = victims(&queued, |_| true, TWO_S);
        assert_eq!(found.iter().map(|v| v.pid).collect::<Vec<_>>(), vec![4]);
    }

    #[test]
    fn a_ddl_in_a_text_of_several_statements_counts() {
        let reading = Reading {
            backends: vec![
                holder(1),
                waiting(
                    2,
                    "BEGIN; SET lock_timeout = 0; ALTER TABLE t ADD c int",
                    3_000,
                    &[1],
                ),
            ],
            replication_lag: None,
            dead_rows: 0,
        };
        assert_eq!(victims(&reading, |_| true, TWO_S).len(), 1);
        // A text cut in the middle of a string still counts by its first word.
        let cut = Reading {
            backends: vec![
                holder(1),
                waiting(2, "ALTER TABLE t ADD c text DEFAULT 'abc", 3_000, &[1]),
            ],
            replication_lag: None,
            dead_rows: 0,
        };
        assert_eq!(victims(&cut, |_| true, TWO_S).len(), 1);
    }
}
