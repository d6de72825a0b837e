//! The fleet's store: three ordinary tables in a PostgreSQL database (logged, so a crash or a
//! failover keeps every grant counted and the sequence going on), changed by one instance at a
//! time under a transaction-level advisory lock. One exchange: lock, read the whole ledger and
//! the store's clock, let [`Ledger::answer`] decide, write the ledger back, commit; the grant
//! counts from that commit on, whether or not its answer reaches the instance.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::lease::{Amounts, Grant, Issued, Ledger, Member, Report, Share, Terms};
use crate::params::Tracked;
use crate::server::{ServerConn, ServerError};

/// The advisory lock every exchange takes ("pgward" in ASCII).
const LOCK_KEY: i64 = 0x7067_7761_7264;

/// The tables, made by the first instance that finds them missing.
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS pgward_fleet_members (
    instance integer NOT NULL,
    incarnation bigint NOT NULL,
    number bigint NOT NULL,
    acked bigint NOT NULL,
    reported timestamptz NOT NULL,
    demands jsonb NOT NULL,
    PRIMARY KEY (instance, incarnation)
);
CREATE TABLE IF NOT EXISTS pgward_fleet_grants (
    instance integer NOT NULL,
    incarnation bigint NOT NULL,
    seq bigint PRIMARY KEY,
    shares jsonb NOT NULL,
    ends timestamptz NOT NULL,
    fallback_ends timestamptz NOT NULL
);
CREATE TABLE IF NOT EXISTS pgward_fleet_sequence (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    next_seq bigint NOT NULL
);
INSERT INTO pgward_fleet_sequence VALUES (true, 1) ON CONFLICT DO NOTHING;
";

/// The whole ledger and the store's clock, as one row of JSON texts.
const READ: &str = "
SELECT extract(epoch FROM clock_timestamp())::float8::text,
       (SELECT next_seq FROM pgward_fleet_sequence)::text,
       (SELECT coalesce(json_agg(json_build_object(
            'instance', instance, 'incarnation', incarnation, 'number', number,
            'acked', acked, 'reported', extract(epoch FROM reported)::float8,
            'demands', demands)), '[]') FROM pgward_fleet_members)::text,
       (SELECT coalesce(json_agg(json_build_object(
            'instance', instance, 'incarnation', incarnation, 'seq', seq, 'shares', shares,
            'ends', extract(epoch FROM ends)::float8,
            'fallback_ends', extract(epoch FROM fallback_ends)::float8)), '[]')
        FROM pgward_fleet_grants)::text";

const WRITE_GRANTS: &str = "
INSERT INTO pgward_fleet_grants (instance, incarnation, seq, shares, ends, fallback_ends)
SELECT instance, incarnation, seq, shares, to_timestamp(ends), to_timestamp(fallback_ends)
FROM json_to_recordset($1::json)
    AS g(instance integer, incarnation bigint, seq bigint, shares jsonb, ends float8,
         fallback_ends float8)";

const WRITE_MEMBERS: &str = "
INSERT INTO pgward_fleet_members (instance, incarnation, number, acked, reported, demands)
SELECT instance, incarnation, number, acked, to_timestamp(reported), demands
FROM json_to_recordset($1::json)
    AS m(instance integer, incarnation bigint, number bigint, acked bigint, reported float8,
         demands jsonb)";

/// An exchange's transaction. A grant counts once committed: durable before its answer leaves,
/// whatever the database's own synchronous_commit. Nothing holds the lock long: a wait for it,
/// a statement, or a client gone silent in the middle ends after the limit and the server
/// lets the lock go.
const BEGIN: &str = "BEGIN ISOLATION LEVEL READ COMMITTED;
SET LOCAL synchronous_commit = on;
SET LOCAL lock_timeout = '5s';
SET LOCAL statement_timeout = '5s';
SET LOCAL idle_in_transaction_session_timeout = '5s'";

/// Why an exchange failed; the connection is then closed and opened anew.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{0}")]
    Server(#[from] ServerError),
    #[error("the store answered what pgward cannot read: {0}")]
    Unreadable(String),
}

/// What a member holds is kept in its row's `demands`, each resource under this prefix: the
/// tables of an earlier pgward serve unchanged (an earlier instance reads the keys as demands
/// for resources it does not know, and writes them back as it read them).
const USING_PREFIX: &str = "using:";

#[derive(Serialize, Deserialize)]
struct MemberRow {
    instance: u32,
    incarnation: i64,
    number: i64,
    acked: i64,
    reported: f64,
    demands: Amounts,
}

#[derive(Serialize, Deserialize)]
struct GrantRow {
    instance: u32,
    incarnation: i64,
    seq: i64,
    /// Each resource's (amount, fallback).
    shares: BTreeMap<String, (f64, f64)>,
    ends: f64,
    fallback_ends: f64,
}

/// Whether the three tables exist (PostgreSQL checks CREATE on the schema before it sees
/// that a table of `CREATE TABLE IF NOT EXISTS` exists: a role that may only use them asks
/// first).
const TABLES_EXIST: &str = "
SELECT (to_regclass('pgward_fleet_members') IS NOT NULL
    AND to_regclass('pgward_fleet_grants') IS NOT NULL
    AND to_regclass('pgward_fleet_sequence') IS NOT NULL)::text";

/// The sequence's one row, where the table is there without it.
const FIRST_SEQUENCE: &str =
    "INSERT INTO pgward_fleet_sequence VALUES (true, 1) ON CONFLICT DO NOTHING";

/// Makes the tables if they are missing (under the lock: instances starting together do not
/// race to create them).
pub async fn prepare(conn: &mut ServerConn, tracked: &Tracked) -> Result<(), StoreError> {
    conn.simple_query(BEGIN, tracked).await?;
    lock(conn, tracked).await?;
    let exist = conn.query_row(TABLES_EXIST, &[], tracked).await?;
    let exist = exist.and_then(|mut row| row.first_mut().and_then(Option::take));
    match exist.as_deref() {
        Some("true") => conn.simple_query(FIRST_SEQUENCE, tracked).await?,
        _ => conn.simple_query(SCHEMA, tracked).await?,
    };
    conn.simple_query("COMMIT", tracked).await?;
    Ok(())
}

/// Waits for the advisory lock, held until the transaction ends.
async fn lock(conn: &mut ServerConn, tracked: &Tracked) -> Result<(), StoreError> {
    let key = LOCK_KEY.to_string();
    conn.query_row(
        "SELECT 1 FROM pg_advisory_xact_lock($1::bigint)",
        &[&key],
        tracked,
    )
    .await?;
    Ok(())
}

/// One exchange: `report` answered by the store under `terms`, with the capacities of the
/// reporting instance's settings, `whole` those shared in whole units (no grant: the store
/// took the report as a late duplicate), and the ledger as it was left, with the store's time.
pub async fn exchange(
    conn: &mut ServerConn,
    report: &Report,
    (capacities, whole): (Amounts, BTreeSet<String>),
    terms: Terms,
    tracked: &Tracked,
) -> Result<(Option<Grant>, (Ledger, Duration)), StoreError> {
    conn.simple_query(BEGIN, tracked).await?;
    lock(conn, tracked).await?;
    let row = conn
        .query_row(READ, &[], tracked)
        .await?
        .ok_or_else(|| StoreError::Unreadable("no row".into()))?;
    let text = |i: usize| -> Result<&str, StoreError> {
        row.get(i)
            .and_then(|v| v.as_deref())
            .ok_or_else(|| StoreError::Unreadable(format!("column {i} is NULL")))
    };
    let now = epoch(
        text(0)?
            .parse::<f64>()
            .map_err(|e| StoreError::Unreadable(e.to_string()))?,
    );
    let next_seq: u64 = text(1)?
        .parse()
        .map_err(|_| StoreError::Unreadable("the sequence is not a number".into()))?;
    let members: Vec<MemberRow> = json(text(2)?)?;
    let grants: Vec<GrantRow> = json(text(3)?)?;
    let mut ledger = ledger_of(terms, capacities, next_seq, members, grants);
    ledger.whole = whole;
    let grant = ledger.answer(now, report);
    let (members, grants) = rows_of(&ledger);
    let grants =
        serde_json::to_string(&grants).map_err(|e| StoreError::Unreadable(e.to_string()))?;
    let members =
        serde_json::to_string(&members).map_err(|e| StoreError::Unreadable(e.to_string()))?;
    conn.simple_query(
        "DELETE FROM pgward_fleet_grants; DELETE FROM pgward_fleet_members",
        tracked,
    )
    .await?;
    conn.query_row(WRITE_GRANTS, &[&grants], tracked).await?;
    conn.query_row(WRITE_MEMBERS, &[&members], tracked).await?;
    conn.query_row(
        "UPDATE pgward_fleet_sequence SET next_seq = $1::bigint",
        &[&ledger.next_seq.to_string()],
        tracked,
    )
    .await?;
    conn.simple_query("COMMIT", tracked).await?;
    Ok((grant, (ledger, now)))
}

/// A time on the store's clock from seconds since the Unix epoch.
fn epoch(seconds: f64) -> Duration {
    Duration::try_from_secs_f64(seconds.max(0.0)).unwrap_or_default()
}

fn json<T: for<'de> Deserialize<'de>>(text: &str) -> Result<T, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::Unreadable(e.to_string()))
}

/// The ledger the rows hold.
fn ledger_of(
    terms: Terms,
    capacities: Amounts,
    next_seq: u64,
    members: Vec<MemberRow>,
    grants: Vec<GrantRow>,
) -> Ledger {
    let mut ledger = Ledger::new(terms, capacities);
    ledger.next_seq = next_seq.max(1);
    for m in members {
        let (using, demands): (Amounts, Amounts) = m
            .demands
            .into_iter()
            .partition(|(r, _)| r.starts_with(USING_PREFIX));
        let using = using
            .into_iter()
            .map(|(r, n)| (r[USING_PREFIX.len()..].to_string(), n))
            .collect();
        let reported = epoch(m.reported);
        ledger.members.insert(
            (m.instance, m.incarnation as u64),
            Member {
                number: m.number as u64,
                acked: m.acked as u64,
                reported,
                demands,
                using,
                // (Set from its grants below.)
                using_ends: reported,
                issued: Vec::new(),
            },
        );
    }
    for g in grants {
        let issued = Issued {
            seq: g.seq as u64,
            shares: g
                .shares
                .into_iter()
                .map(|(r, (amount, fallback))| (r, Share { amount, fallback }))
                .collect(),
            ends: epoch(g.ends),
            fallback_ends: epoch(g.fallback_ends),
        };
        ledger
            .members
            .entry((g.instance, g.incarnation as u64))
            .or_default()
            .issued
            .push(issued);
    }
    // What a member holds counts as long as the grant answering its last report: the
    // instance's own terms dated it (another instance's may differ).
    for m in ledger.members.values_mut() {
        let newest = m.issued.iter().map(|g| g.fallback_ends).max();
        m.using_ends = newest.unwrap_or(m.reported);
    }
    ledger
}

/// The rows of a ledger.
fn rows_of(ledger: &Ledger) -> (Vec<MemberRow>, Vec<GrantRow>) {
    let mut members = Vec::new();
    let mut grants = Vec::new();
    for (&(instance, incarnation), m) in &ledger.members {
        members.push(MemberRow {
            instance,
            incarnation: incarnation as i64,
            number: m.number as i64,
            acked: m.acked as i64,
            reported: m.reported.as_secs_f64(),
            demands: m
                .demands
                .iter()
                .map(|(r, n)| (r.clone(), *n))
                .chain(
                    m.using
                        .iter()
                        .map(|(r, n)| (format!("{USING_PREFIX}{r}"), *n)),
                )
                .collect(),
        });
        for g in &m.issued {
            grants.push(GrantRow {
                instance,
                incarnation: incarnation as i64,
                seq: g.seq as i64,
                shares: g
                    .shares
                    .iter()
                    .map(|(r, s)| (r.clone(), (s.amount, s.fallback)))
                    .collect(),
                ends: g.ends.as_secs_f64(),
                fallback_ends: g.fallback_ends.as_secs_f64(),
            });
        }
    }
    (members, grants)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ledger_reads_back_from_its_rows_as_it_was() {
        let terms = Terms::default();
        let caps: Amounts = [("tenant:acme".to_string(), 2.0)].into_iter().collect();
        let mut ledger = Ledger::new(terms, caps.clone());
        let base = Duration::from_secs(1_800_000_000);
        for (i, at) in [(1u32, 0u64), (2, 1), (1, 2)] {
            let report = Report {
                instance: i,
                incarnation: 40 + u64::from(i),
                number: at + 1,
                acked: 0,
                demands: [
                    ("tenant:acme".to_string(), 0.5),
                    ("upstream:db".to_string(), 2.0),
                ]
                .into_iter()
                .collect(),
                using: [("upstream:db".to_string(), f64::from(i))]
                    .into_iter()
                    .collect(),
            };
            ledger.answer(base + Duration::from_secs(at), &report);
        }
        let (members, grants) = rows_of(&ledger);
        let members: Vec<MemberRow> = json(&serde_json::to_string(&members).unwrap()).unwrap();
        let grants: Vec<GrantRow> = json(&serde_json::to_string(&grants).unwrap()).unwrap();
        // Read by an instance with other terms: what each grant and each member's use count
        // for was dated by the instance that reported.
        let other = Terms {
            fallback: Duration::from_secs(5),
            ..terms
        };
        let again = ledger_of(other, caps, ledger.next_seq, members, grants);
        assert_eq!(again.next_seq, ledger.next_seq);
        for (id, m) in &ledger.members {
            let n = &again.members[id];
            assert_eq!(
                (n.number, n.acked, n.demands.clone(), n.using.clone()),
                (m.number, m.acked, m.demands.clone(), m.using.clone())
            );
            assert_eq!(n.using_ends, m.using_ends);
            assert_eq!(n.issued.len(), m.issued.len());
            let now = base + Duration::from_secs(5);
            for r in ["tenant:acme", "upstream:db"] {
                assert!((n.in_use(r, now) - m.in_use(r, now)).abs() < 1e-9);
            }
        }
    }
}
