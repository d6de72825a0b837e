//! What only PostgreSQL knows of a statement, from `pg_stat_statements` where the extension
//! is installed (in the database the reading logs into): its buffer hits and reads, its
//! temporary blocks and the WAL it wrote. Read every few readings; each statement's counters
//! are turned into what changed since the last read, keyed by pg_query's fingerprint of the
//! normalized text (the statement statistics' own key), the role and the database. Pure but
//! for the caller's fingerprinting.

use std::collections::HashMap;

use crate::ops::statements::ServerCounters;
use crate::server::TextRow;

/// Readings between two reads of `pg_stat_statements`.
pub const EVERY: u32 = 5;

/// Statements tracked at most (pg_stat_statements keeps 5000 by default); past this, the
/// tracking starts over.
const MAX_TRACKED: usize = 50_000;

/// The schema the extension is installed in, if it is.
pub const FIND: &str = "SELECT n.nspname FROM pg_catalog.pg_extension e \
     JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace \
     WHERE e.extname = 'pg_stat_statements'";

/// The query over the view in `schema`. From PostgreSQL 14 on, statements run inside a
/// function (`toplevel` false, with `pg_stat_statements.track = all`) have rows of their own:
/// they are left out, since the statement that called them counts their blocks already.
pub fn query(schema: &str, server_major: u32) -> String {
    let (toplevel, only_top) = match server_major >= 14 {
        true => ("s.toplevel", " AND s.toplevel"),
        false => ("true", ""),
    };
    format!(
        "SELECT r.rolname, d.datname, s.queryid, {toplevel}, s.query, s.calls, \
         s.shared_blks_hit, s.shared_blks_read, s.temp_blks_read, s.temp_blks_written, \
         s.wal_bytes \
         FROM {}.pg_stat_statements s \
         JOIN pg_catalog.pg_roles r ON r.oid = s.userid \
         JOIN pg_catalog.pg_database d ON d.oid = s.dbid \
         WHERE s.queryid IS NOT NULL AND s.query <> '<insufficient privilege>'{only_top}",
        quote_ident(schema)
    )
}

fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// One row of the view.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub role: String,
    pub database: String,
    pub queryid: i64,
    pub toplevel: bool,
    pub text: String,
    pub counters: ServerCounters,
}

/// The view's rows that read, and why the first that did not read did not (such a row is
/// left out, never guessed at).
pub fn rows_of(rows: &[TextRow]) -> (Vec<Row>, Option<String>) {
    let mut out = Vec::with_capacity(rows.len());
    let mut error = None;
    for row in rows {
        match row_of(row) {
            Ok(r) => out.push(r),
            Err(e) => {
                error.get_or_insert(e);
            }
        }
    }
    (out, error)
}

fn row_of(row: &TextRow) -> Result<Row, String> {
    let cell = |i: usize| row.get(i).and_then(|c| c.as_deref());
    let text = |i: usize| {
        cell(i)
            .map(str::to_string)
            .ok_or_else(|| format!("pg_stat_statements: column {i} is missing"))
    };
    let number = |i: usize| -> Result<u64, String> {
        let c = cell(i).unwrap_or("0");
        // wal_bytes is numeric: whole, but perhaps written with a fraction.
        let whole = c.split('.').next().unwrap_or(c);
        whole
            .parse()
            .map_err(|_| format!("pg_stat_statements: column {i} is not a count: {c:.40}"))
    };
    Ok(Row {
        role: text(0)?,
        database: text(1)?,
        queryid: cell(2)
            .and_then(|c| c.parse().ok())
            .ok_or("pg_stat_statements: queryid is not a number")?,
        toplevel: cell(3) != Some("f"),
        text: text(4)?,
        counters: ServerCounters {
            calls: number(5)?,
            shared_blks_hit: number(6)?,
            shared_blks_read: number(7)?,
            temp_blks_read: number(8)?,
            temp_blks_written: number(9)?,
            wal_bytes: number(10)?,
        },
    })
}

/// What changed for one statement since the last read: its fingerprint, server role and
/// database.
#[derive(Clone, Debug, PartialEq)]
pub struct Delta {
    pub fingerprint: u64,
    pub role: String,
    pub database: String,
    pub counters: ServerCounters,
}

/// A row of the view: role, database, queryid, toplevel.
type RowKey = (String, String, i64, bool);

/// The counters of each statement at the last read.
#[derive(Debug, Default)]
pub struct Deltas {
    /// By (role, database, queryid, toplevel): the fingerprint (none: not one pg_query
    /// reads) and the counters.
    last: HashMap<RowKey, (Option<u64>, ServerCounters)>,
    /// The first read only sets the starting point.
    started: bool,
}

impl Deltas {
    /// The changes since the last read of `rows`; `fingerprint` reads a normalized text
    /// (once per statement). A statement first seen after the first read is new since it:
    /// all of it counts. One whose calls went down was reset or evicted and came back: its
    /// counters now are what changed.
    pub fn observe(
        &mut self,
        rows: Vec<Row>,
        mut fingerprint: impl FnMut(&str) -> Option<u64>,
    ) -> Vec<Delta> {
        if self.last.len() > MAX_TRACKED {
            self.last.clear();
            self.started = false;
        }
        let mut out = Vec::new();
        for row in rows {
            let key = (row.role, row.database, row.queryid, row.toplevel);
            let (fp, change) = match self.last.get(&key) {
                Some((fp, before)) => (*fp, row.counters.since(before)),
                None => (fingerprint(&row.text), row.counters),
            };
            if let (Some(fp), true) = (fp, self.started && change.calls > 0) {
                out.push(Delta {
                    fingerprint: fp,
                    role: key.0.clone(),
                    database: key.1.clone(),
                    counters: change,
                });
            }
            self.last.insert(key, (fp, row.counters));
        }
        self.started = true;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(queryid: &str, calls: &str, hit: &str, wal: &str) -> TextRow {
        [
            "app",
            "db",
            queryid,
            "t",
            "SELECT $1",
            calls,
            hit,
            "2",
            "0",
            "7",
            wal,
        ]
        .iter()
        .map(|c| Some(c.to_string()))
        .collect()
    }

    #[test]
    fn changes_count_from_the_first_read_and_survive_a_reset() {
        let mut d = Deltas::default();
        let fp = |_: &str| Some(42);
        let first = rows_of(&[row("1", "10", "100", "1000")]).0;
        assert!(d.observe(first, fp).is_empty());
        let later = rows_of(&[row("1", "15", "150", "1500.0"), row("2", "3", "9", "0")]).0;
        let changes = d.observe(later, fp);
        assert_eq!(changes.len(), 2);
        assert_eq!(changes[0].counters.calls, 5);
        assert_eq!(changes[0].counters.shared_blks_hit, 50);
        assert_eq!(changes[0].counters.wal_bytes, 500);
        assert_eq!(changes[0].counters.temp_blks_written, 0);
        // New since the first read: all of it.
        assert_eq!(changes[1].counters.calls, 3);
        assert_eq!(
            (changes[1].role.as_str(), changes[1].database.as_str()),
            ("app", "db")
        );
        // Reset: what it has now is new.
        let reset = rows_of(&[row("1", "2", "20", "0")]).0;
        let changes = d.observe(reset, fp);
        assert_eq!(changes[0].counters.calls, 2);
        assert_eq!(changes[0].counters.shared_blks_hit, 20);
        // Unchanged: nothing.
        let same = rows_of(&[row("1", "2", "20", "0")]).0;
        assert!(d.observe(same, fp).is_empty());
    }

    #[test]
    fn a_row_that_does_not_read_fails_and_the_query_names_the_schema() {
        let (rows, error) = rows_of(&[row("x", "1", "1", "1"), row("2", "1", "1", "1")]);
        assert_eq!(rows.len(), 1);
        assert!(error.is_some_and(|e| e.contains("queryid")));
        let (rows, error) = rows_of(&[row("1", "-1", "1", "1")]);
        assert!(rows.is_empty() && error.is_some());
        assert!(query("my \"ext\"", 13).contains("\"my \"\"ext\"\"\".pg_stat_statements"));
        assert!(query("public", 13).contains(", true,"));
        assert!(query("public", 14).contains("AND s.toplevel"));
    }
}
