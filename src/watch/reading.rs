//! One reading of a PostgreSQL server: who runs, who waits on whose lock, the oldest
//! snapshot, the standbys' lag. The query and the rows it gives, read into plain values.

use std::time::Duration;

use crate::server::TextRow;

/// The reading's query. `pg_locks.waitstart` (when a lock wait began) exists from
/// PostgreSQL 14 on; before, a wait counts from its statement's start.
pub fn query(server_major: u32) -> String {
    let wait_start = match server_major >= 14 {
        true => WAIT_START_14,
        false => "a.query_start",
    };
    QUERY.replace("{wait_start}", wait_start)
}

/// When a lock wait began, from PostgreSQL 14 on. A wait whose start is not recorded yet
/// (waitstart is set a moment after the wait begins) counts as just begun.
const WAIT_START_14: &str = "COALESCE((SELECT min(l.waitstart) FROM pg_catalog.pg_locks l \
     WHERE l.pid = a.pid AND NOT l.granted), clock_timestamp())";

// Columns: pid, waits on a lock, seconds waited, blocking pids, statement text (of lock
// waiters only), the age in transactions of what the backend holds the horizon back with
// (the older of its own xid and its snapshot's xmin), seconds since the transaction began,
// state, the standbys' longest replay lag in seconds, that xid, the dead rows of the
// database's tables (pg_stat_user_tables.n_dead_tup, summed), the kind of lock waited for
// (`relation`, `object`, `transactionid`, `tuple`, `virtualxid`, `advisory`...), whether the
// xid is the backend's own (a writer's transaction, which every later snapshot's xmin names
// too), whether the backend counts for this database's horizon (its own, or none: a
// walsender), and for how long its statement has run (active backends only).
const QUERY: &str = "SELECT a.pid, a.wait_event_type = 'Lock', \
     CASE WHEN a.wait_event_type = 'Lock' \
       THEN extract(epoch FROM clock_timestamp() - {wait_start})::float8 END, \
     CASE WHEN a.wait_event_type = 'Lock' \
       THEN array_to_string(pg_catalog.pg_blocking_pids(a.pid), ',') END, \
     CASE WHEN a.wait_event_type = 'Lock' THEN a.query END, \
     GREATEST(pg_catalog.age(a.backend_xid), pg_catalog.age(a.backend_xmin)), \
     extract(epoch FROM clock_timestamp() - a.xact_start)::float8, a.state, \
     (SELECT extract(epoch FROM max(r.replay_lag))::float8 FROM pg_catalog.pg_stat_replication r), \
     (CASE WHEN pg_catalog.age(a.backend_xid) >= COALESCE(pg_catalog.age(a.backend_xmin), 0) \
       THEN a.backend_xid ELSE a.backend_xmin END)::text, \
     (SELECT sum(s.n_dead_tup) FROM pg_catalog.pg_stat_user_tables s), \
     a.wait_event, \
     COALESCE(pg_catalog.age(a.backend_xid) >= COALESCE(pg_catalog.age(a.backend_xmin), 0), \
       false), \
     a.datname IS NULL OR a.datname = pg_catalog.current_database(), \
     CASE WHEN a.state = 'active' \
       THEN extract(epoch FROM clock_timestamp() - a.query_start)::float8 END \
     FROM pg_catalog.pg_stat_activity a WHERE a.pid <> pg_catalog.pg_backend_pid()";

/// One backend as the reading saw it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Backend {
    pub pid: u32,
    /// It waits for a heavyweight lock.
    pub waits_on_lock: bool,
    /// How long it has waited for that lock.
    pub waited: Option<Duration>,
    /// The sessions it waits for: holders, and waiters ahead of it in the lock's queue.
    pub blocked_by: Vec<u32>,
    /// What it runs (lock waiters only).
    pub query: Option<String>,
    /// Transactions since the oldest xid it holds the horizon back with (its own
    /// `backend_xid` or its snapshot's `backend_xmin`).
    pub xmin_age: Option<u64>,
    /// How long its transaction has been open.
    pub in_transaction: Option<Duration>,
    /// `pg_stat_activity.state`.
    pub state: Option<String>,
    /// That xid.
    pub xmin: Option<String>,
    /// The xid is its own transaction's (the writer), not a snapshot's.
    pub owns_xid: bool,
    /// It counts for the horizon of the reader's database (connected to it, or to none).
    pub this_database: bool,
    /// How long its statement has run (active backends).
    pub running: Option<Duration>,
    /// What kind of lock it waits for (`wait_event`: `relation`, `tuple`...).
    pub lock: Option<String>,
}

/// A whole reading.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reading {
    pub backends: Vec<Backend>,
    /// The longest replay lag of the standbys (none without standbys).
    pub replication_lag: Option<Duration>,
    /// The dead rows of the database's tables.
    pub dead_rows: u64,
}

impl Reading {
    /// The reading in the query's rows; a row that does not read is an error (the reading
    /// failed), never a guess.
    pub fn of_rows(rows: &[TextRow]) -> Result<Reading, String> {
        let mut reading = Reading::default();
        for row in rows {
            let (backend, lag, dead) = backend_of(row)?;
            reading.replication_lag = lag.or(reading.replication_lag);
            reading.dead_rows = dead.unwrap_or(reading.dead_rows);
            reading.backends.push(backend);
        }
        Ok(reading)
    }

    /// The sessions waiting behind `pid` (those it blocks, as holder or ahead in a queue).
    pub fn queued_behind(&self, pid: u32) -> usize {
        self.backends
            .iter()
            .filter(|b| b.pid != pid && b.blocked_by.contains(&pid))
            .count()
    }

    /// The backend that holds this database's horizon back: the oldest xid of a backend of
    /// this database (or of none), and of those holding the same, the one whose own
    /// transaction it is (a writer idle in its transaction, whose xid every later snapshot
    /// names as its xmin).
    pub fn oldest_snapshot(&self) -> Option<&Backend> {
        self.backends
            .iter()
            .filter(|b| b.xmin_age.is_some() && b.this_database)
            .max_by_key(|b| (b.xmin_age, b.owns_xid))
    }
}

fn backend_of(row: &TextRow) -> Result<(Backend, Option<Duration>, Option<u64>), String> {
    let cell = |i: usize| row.get(i).and_then(|c| c.as_deref());
    let pid = cell(0)
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| format!("a pid that does not read: {:?}", cell(0)))?;
    let seconds = |i: usize| -> Result<Option<Duration>, String> {
        cell(i)
            .map(|s| {
                s.parse::<f64>()
                    .ok()
                    .filter(|v| v.is_finite())
                    .map(|v| Duration::from_secs_f64(v.max(0.0)))
                    .ok_or_else(|| format!("a number of seconds that does not read: {s:?}"))
            })
            .transpose()
    };
    let blocked_by = match cell(3) {
        None | Some("") => Vec::new(),
        Some(list) => list
            .split(',')
            .map(|p| {
                p.parse()
                    .map_err(|_| format!("a blocking pid list: {list:?}"))
            })
            .collect::<Result<_, _>>()?,
    };
    let xmin_age = cell(5)
        .map(|a| a.parse().map_err(|_| format!("an xmin age: {a:?}")))
        .transpose()?;
    let backend = Backend {
        pid,
        waits_on_lock: cell(1) == Some("t"),
        waited: seconds(2)?,
        blocked_by,
        query: cell(4).map(str::to_string),
        xmin_age,
        in_transaction: seconds(6)?,
        state: cell(7).map(str::to_string),
        xmin: cell(9).map(str::to_string),
        lock: cell(11).map(str::to_string),
        owns_xid: cell(12) == Some("t"),
        this_database: cell(13) == Some("t"),
        running: seconds(14)?,
    };
    let dead = cell(10)
        .map(|d| d.parse().map_err(|_| format!("dead rows: {d:?}")))
        .transpose()?;
    Ok((backend, seconds(8)?, dead))
}

/// The major version in a `server_version` such as `15.4 (Debian 15.4-1)` or `18beta1`.
pub fn major_of(server_version: &str) -> Option<u32> {
    let digits: String = server_version
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(cells: &[Option<&str>]) -> TextRow {
        cells.iter().map(|c| c.map(str::to_string)).collect()
    }

    #[test]
    fn rows_read_into_backends() {
        let rows = [
            row(&[
                Some("10"),
                Some("t"),
                Some("2.5"),
                Some("11,12"),
                Some("ALTER TABLE t ADD c int"),
                None,
                Some("3"),
                Some("active"),
                None,
                None,
                Some("1234"),
                Some("relation"),
                Some("f"),
                Some("t"),
            ]),
            row(&[
                Some("11"),
                Some("f"),
                None,
                None,
                None,
                Some("42"),
                Some("60"),
                Some("idle in transaction"),
                Some("0.5"),
                Some("731"),
                Some("1234"),
                None,
                Some("f"),
                Some("t"),
            ]),
        ];
        let reading = Reading::of_rows(&rows).unwrap();
        assert_eq!(reading.backends[0].blocked_by, vec![11, 12]);
        assert_eq!(
            reading.backends[0].waited,
            Some(Duration::from_millis(2500))
        );
        assert!(reading.backends[0].waits_on_lock);
        assert_eq!(reading.oldest_snapshot().map(|b| b.pid), Some(11));
        assert_eq!(reading.replication_lag, Some(Duration::from_millis(500)));
        assert_eq!(reading.dead_rows, 1234);
        assert_eq!(reading.backends[1].xmin.as_deref(), Some("731"));
        assert_eq!(reading.queued_behind(11), 1);
        assert_eq!(reading.queued_behind(10), 0);
    }

    #[test]
    fn the_horizon_is_held_by_the_writer_whose_xid_the_snapshots_name() {
        let backend = |pid, age, owns, this_database| Backend {
            pid,
            xmin_age: Some(age),
            owns_xid: owns,
            this_database,
            ..Backend::default()
        };
        let reading = Reading {
            // A writer idle in its transaction (xid 500), two snapshots taken since (their
            // xmin is 500 too), and an older snapshot in another database.
            backends: vec![
                backend(1, 80, false, true),
                backend(2, 80, true, true),
                backend(3, 80, false, true),
                backend(4, 900, false, false),
            ],
            ..Reading::default()
        };
        assert_eq!(reading.oldest_snapshot().map(|b| b.pid), Some(2));
    }

    #[test]
    fn a_row_that_does_not_read_fails_the_reading() {
        let bad = [row(&[Some("x"), Some("f")])];
        assert!(Reading::of_rows(&bad).is_err());
        let bad = [row(&[Some("1"), Some("t"), Some("NaN")])];
        assert!(Reading::of_rows(&bad).is_err());
        let bad = [row(&[Some("1"), Some("t"), None, Some("1,x")])];
        assert!(Reading::of_rows(&bad).is_err());
    }

    #[test]
    fn versions_read() {
        assert_eq!(major_of("15.4 (Debian 15.4-1.pgdg120+1)"), Some(15));
        assert_eq!(major_of("18beta1"), Some(18));
        assert_eq!(major_of("x"), None);
        assert!(query(13).contains("clock_timestamp() - a.query_start"));
        assert!(query(14).contains("waitstart"));
        assert!(!query(14).contains("{wait_start}"));
    }
}
