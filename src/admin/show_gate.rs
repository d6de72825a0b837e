//! SHOW TENANTS, SHOW KILLS, SHOW PLANS (alias PLAN_CACHE), SHOW CALIBRATION, SHOW FLIPS and
//! SHOW READINGS: the admission gate, its plan cache, what it learned of run times, the plans
//! that flipped and the last reading of each server; and the plan cache's line in the log
//! once a minute.

use std::time::{Duration, Instant, SystemTime};

use super::result::format_time;
use super::result::{Cell, Table, Ty};
use crate::cost::{CacheStats, FlipReason};
use crate::gate::{KillRow, KillTarget, RefusalReason, TenantStats};
use crate::runtime::Runtime;

const N: Ty = Ty::Numeric;

/// Columns before the refusal counts.
const FIRST_REFUSAL: usize = 8;

const TENANTS: &[(&str, Ty)] = &[
    ("tenant", Ty::Text),
    ("settings", Ty::Text),
    ("balance", N),
    ("debt", N),
    ("recent_use", N),
    ("charged", N),
    ("waiting", Ty::Int4),
    ("running", Ty::Int4),
    ("refused_budget", Ty::Int8),
    ("refused_killed", Ty::Int8),
    ("refused_queue_timeout", Ty::Int8),
    ("refused_deadline", Ty::Int8),
    ("refused_too_slow", Ty::Int8),
    ("refused_cost", Ty::Int8),
    ("refused_rule", Ty::Int8),
    ("warned_cost", Ty::Int8),
    ("refused_overload", Ty::Int8),
];

/// The column counting refusals for `reason` (every reason has one).
fn refusal_column(reason: RefusalReason) -> usize {
    FIRST_REFUSAL
        + match reason {
            RefusalReason::Budget => 0,
            RefusalReason::Killed => 1,
            RefusalReason::QueueTimeout => 2,
            RefusalReason::Deadline => 3,
            RefusalReason::TooSlow => 4,
            RefusalReason::Cost => 5,
            RefusalReason::Rule => 6,
            RefusalReason::CostWarned => 7,
            RefusalReason::Overload => 8,
        }
}

/// One row per tenant the gate knows: budget, use (seconds of server time), slots and
/// refusals by reason.
pub fn tenants(rt: &Runtime) -> Table {
    let stats = rt.gatekeeper.lock().tenant_stats(Instant::now());
    let mut t = Table::new(TENANTS);
    for s in stats {
        t.push(tenant_row(s));
    }
    t
}

fn tenant_row(s: TenantStats) -> Vec<Cell> {
    let mut row = vec![
        s.tenant.into(),
        s.settings.into(),
        // Seconds of server time, to a tenth of a millisecond.
        s.balance.map_or(Cell::Null, |b| Cell::decimal(b, 4)),
        Cell::decimal(s.debt, 4),
        Cell::decimal(s.recent_use, 4),
        Cell::decimal(s.charged, 4),
        s.waiting.into(),
        s.running.into(),
    ];
    row.resize(TENANTS.len(), Cell::Int(0));
    for (reason, n) in s.refusals {
        if let Some(cell) = row.get_mut(refusal_column(reason)) {
            *cell = n.into();
        }
    }
    row
}

const LANES: &[(&str, Ty)] = &[
    ("upstream", Ty::Text),
    ("lane", Ty::Text),
    ("limit", Ty::Int4),
    ("running", Ty::Int4),
    ("waiting", Ty::Int4),
    ("ceiling", Ty::Int4),
    ("last_change", Ty::Text),
    ("changed_ago", N),
    ("change_reason", Ty::Text),
];

/// Each PostgreSQL server's two lanes: the slots each may hand out now (its own limit,
/// within the servers the pools pooled onto it may open), held, and waited for; under
/// `adaptive = true` the fast lane's ceiling and the limit's last move (from and to, seconds
/// ago, and why).
pub fn lanes(rt: &Runtime) -> Table {
    let rows = rt.gatekeeper.lock().lanes();
    let now = Instant::now();
    let mut t = Table::new(LANES);
    for r in rows {
        let lane = r.lane.as_str();
        // No limit of its own and no pool counted yet: shown as NULL, not a huge number.
        let count = |n: usize| match i32::try_from(n) {
            Ok(n) => Cell::from(n as usize),
            Err(_) => Cell::Null,
        };
        let moved = r.last_move;
        t.push(vec![
            r.upstream.into(),
            lane.into(),
            count(r.limit),
            r.running.into(),
            r.waiting.into(),
            r.ceiling.map_or(Cell::Null, count),
            moved.map_or(Cell::Null, |m| format!("{} -> {}", m.from, m.to).into()),
            moved.map_or(Cell::Null, |m| {
                Cell::decimal(now.saturating_duration_since(m.at).as_secs_f64(), 1)
            }),
            moved.map_or(Cell::Null, |m| m.why.describe().into()),
        ]);
    }
    t
}

const KILLS: &[(&str, Ty)] = &[
    ("type", Ty::Text),
    ("target", Ty::Text),
    ("expires_in", Ty::Int8),
    ("expires_at", Ty::Text),
];

/// The kills in force, soonest to expire first.
pub fn kills(rt: &Runtime) -> Table {
    let rows = rt.gatekeeper.lock().kills(Instant::now());
    let wall = SystemTime::now();
    let mut t = Table::new(KILLS);
    for row in rows {
        t.push(kill_row(&row, wall));
    }
    t
}

/// Type, target, whole seconds left (rounded up, so a kill in force never shows 0) and the
/// wall-clock time it ends.
fn kill_row(row: &KillRow, wall: SystemTime) -> Vec<Cell> {
    let (kind, target) = match &row.target {
        KillTarget::Tenant(name) => ("tenant", name.clone()),
        KillTarget::Statement(f) => ("statement", f.hex()),
    };
    let left = row.remaining;
    let seconds = left.as_secs() + u64::from(left.subsec_nanos() > 0);
    let ends = wall.checked_add(left).map_or(Cell::Null, format_time);
    vec![kind.into(), target.into(), seconds.into(), ends]
}

const PLANS: &[(&str, Ty)] = &[
    ("entries", Ty::Int8),
    ("hits", Ty::Int8),
    ("misses", Ty::Int8),
    ("hit_rate", N),
    ("explains", Ty::Int8),
    ("explain_errors", Ty::Int8),
    ("explain_avg_ms", N),
    ("explain_max_ms", N),
];

/// The plan cache since the start: plans stored, lookups, and the EXPLAINs run.
pub fn plans(rt: &Runtime) -> Table {
    let (entries, s) = {
        let plans = rt.gatekeeper.plans();
        (plans.len(), plans.stats())
    };
    let mut t = Table::new(PLANS);
    t.push(vec![
        entries.into(),
        s.hits.into(),
        s.misses.into(),
        Cell::decimal(s.hit_rate(), 4),
        s.explains.into(),
        s.explain_errors.into(),
        Cell::decimal(millis(s.explain_mean()), 3),
        Cell::decimal(millis(s.explain_max), 3),
    ]);
    t
}

const CALIBRATION: &[(&str, Ty)] = &[
    ("database", Ty::Text),
    ("fingerprint", Ty::Text),
    ("shape", Ty::Text),
    ("us_per_unit", N),
    ("usual_ms", N),
    ("runs", Ty::Int8),
];

/// What the gate learned, the most recently used first: per plan shape of a statement, the
/// microseconds one cost unit takes; per statement without a plan, its usual time.
pub fn calibration(rt: &Runtime) -> Table {
    let rows = rt.gatekeeper.calibration().rows();
    let mut t = Table::new(CALIBRATION);
    for r in rows {
        let (per_unit, usual) = match r.key.shape {
            Some(_) => (Cell::decimal(r.value * 1e6, 6), Cell::Null),
            None => (Cell::Null, Cell::decimal(r.value * 1000.0, 3)),
        };
        t.push(vec![
            (&*r.key.database).into(),
            format!("{:016x}", r.key.fingerprint).into(),
            r.key
                .shape
                .map_or(Cell::Null, |s| format!("{s:016x}").into()),
            per_unit,
            usual,
            i64::from(r.runs).into(),
        ]);
    }
    t
}

const FLIPS: &[(&str, Ty)] = &[
    ("at", Ty::Text),
    ("database", Ty::Text),
    ("fingerprint", Ty::Text),
    ("reason", Ty::Text),
    ("usual_shape", Ty::Text),
    ("new_shape", Ty::Text),
    ("predicted_ms", N),
    ("took_ms", N),
    ("slow_lane_until", Ty::Text),
];

/// The latest plan flips, newest first: a new plan shape of a statement that had a usual
/// one, or a run over ten times its prediction; and until when it runs in the slow lane.
pub fn flips(rt: &Runtime) -> Table {
    let mut t = Table::new(FLIPS);
    for f in rt.gatekeeper.flips().into_iter().rev() {
        let hex = |v: u64| Cell::from(format!("{v:016x}"));
        let (usual, new, predicted, took) = match f.reason {
            FlipReason::Shape { usual, new } => (hex(usual), hex(new), Cell::Null, Cell::Null),
            FlipReason::Slow { predicted, took } => (
                Cell::Null,
                Cell::Null,
                Cell::decimal(predicted * 1000.0, 3),
                Cell::decimal(took * 1000.0, 3),
            ),
        };
        t.push(vec![
            format_time(f.at),
            f.database.into(),
            hex(f.fingerprint),
            f.reason.as_str().into(),
            usual,
            new,
            predicted,
            took,
            f.quarantined_until.map_or(Cell::Null, format_time),
        ]);
    }
    t
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Once a minute: logs the plan cache's hit rate and EXPLAIN time over the last minute (when
/// anything was looked up), drops expired plans, and forgets tenants that were never
/// configured and have been idle a while (tenants named by tags come and go).
pub fn gate_minute(rt: &Runtime, now: Instant) {
    let window = {
        let mut plans = rt.gatekeeper.plans();
        plans.purge(now);
        plans.take_window()
    };
    if let Some(line) = minute_line(&window) {
        tracing::info!("{line}");
    }
    rt.gatekeeper.lock().forget_idle(now);
}

/// The log line for a minute's counters; `None` when nothing was looked up.
fn minute_line(s: &CacheStats) -> Option<String> {
    let lookups = s.hits + s.misses;
    (lookups > 0).then(|| {
        format!(
            "plan cache, last minute: {lookups} lookups, hit rate {:.1} %, {} EXPLAINs \
             ({} failed), EXPLAIN time mean {:.3} ms, max {:.3} ms",
            s.hit_rate() * 100.0,
            s.explains,
            s.explain_errors,
            millis(s.explain_mean()),
            millis(s.explain_max),
        )
    })
}

/// Seconds with milliseconds, NULL for none.
fn seconds(d: Option<Duration>) -> Cell {
    d.map_or(Cell::Null, |d| Cell::decimal(d.as_secs_f64(), 3))
}

const READINGS: &[(&str, Ty)] = &[
    ("upstream", Ty::Text),
    ("state", Ty::Text),
    ("read_ago", N),
    ("failures", Ty::Int4),
    ("error", Ty::Text),
    ("backends", Ty::Int4),
    ("ours", Ty::Int4),
    ("lock_waiters", Ty::Int4),
    ("oldest_xmin_age", Ty::Int8),
    ("oldest_xmin_pid", Ty::Int4),
    ("oldest_xmin_xact_seconds", N),
    ("oldest_xmin_tenant", Ty::Text),
    ("replication_lag", N),
    ("guard_cancels", Ty::Int8),
    ("dead_rows", Ty::Int8),
    ("horizon_capped", Ty::Text),
];

/// The last reading of each PostgreSQL server: `reading`, `failing` (the last one failed),
/// or `blind` (three in a row failed: pgward acts as if nothing happened there).
pub fn readings(rt: &Runtime) -> Table {
    let now = Instant::now();
    let mut t = Table::new(READINGS);
    for (upstream, v) in rt.watch.views() {
        let state = match (v.blind(), v.failures) {
            (true, _) => "blind",
            (false, 0) => "reading",
            (false, _) => "failing",
        };
        let (age, pid, xact, tenant) = match v.oldest_xmin {
            Some((age, pid, xact, tenant)) => (
                Cell::Int(age as i64),
                Cell::Int(pid.into()),
                seconds(xact),
                Cell::from(tenant),
            ),
            None => (Cell::Null, Cell::Null, Cell::Null, Cell::Null),
        };
        t.push(vec![
            upstream.into(),
            state.into(),
            seconds(v.read_at.map(|at| now.saturating_duration_since(at))),
            (v.failures as usize).into(),
            Cell::from(v.error),
            v.backends.into(),
            v.ours.into(),
            v.lock_waiters.into(),
            age,
            pid,
            xact,
            tenant,
            seconds(v.replication_lag),
            Cell::Int(v.guard_cancels as i64),
            Cell::Int(v.dead_rows as i64),
            v.capped.join(",").into(),
        ]);
    }
    t
}

const ACTIVITY: &[(&str, Ty)] = &[
    ("upstream", Ty::Text),
    ("pid", Ty::Int4),
    ("client_id", Ty::Int8),
    ("tenant", Ty::Text),
    ("fingerprint", Ty::Text),
    ("state", Ty::Text),
    ("running", N),
    ("xact_seconds", N),
    ("lock_wait", N),
    ("blocked_by", Ty::Text),
];

/// Who runs what for how long on each PostgreSQL server, as its last reading saw it: every
/// backend that is not idle, with pgward's client, tenant and statement fingerprint where it
/// is one of pgward's (never statement text).
pub fn activity(rt: &Runtime) -> Table {
    let mut t = Table::new(ACTIVITY);
    for (upstream, v) in rt.watch.views() {
        for a in &v.activity {
            let (client, tenant, fingerprint) = match &a.client {
                Some((id, tenant, fp)) => (
                    Cell::from(*id),
                    Cell::from(tenant.as_str()),
                    fp.map_or(Cell::Null, |f| Cell::from(format!("{f:016x}"))),
                ),
                None => (Cell::Null, Cell::Null, Cell::Null),
            };
            let blocked_by: Vec<String> = a.blocked_by.iter().map(u32::to_string).collect();
            t.push(vec![
                upstream.as_str().into(),
                a.pid.into(),
                client,
                tenant,
                fingerprint,
                Cell::from(a.state.clone()),
                seconds(a.running),
                seconds(a.in_transaction),
                seconds(a.lock_wait),
                blocked_by.join(",").into(),
            ]);
        }
    }
    t
}

const STATEMENTS: &[(&str, Ty)] = &[
    ("fingerprint", Ty::Text),
    ("tenant", Ty::Text),
    ("role", Ty::Text),
    ("database", Ty::Text),
    ("calls", Ty::Int8),
    ("rows", Ty::Int8),
    ("total_ms", N),
    ("mean_ms", N),
    ("p50_ms", N),
    ("p95_ms", N),
    ("p99_ms", N),
    ("max_ms", N),
    ("waited_ms", N),
    ("errors", Ty::Text),
    ("refused", Ty::Text),
    ("shared_blks_hit", Ty::Int8),
    ("shared_blks_read", Ty::Int8),
    ("temp_blks_read", Ty::Int8),
    ("temp_blks_written", Ty::Int8),
    ("wal_bytes", Ty::Int8),
    ("query", Ty::Text),
];

/// SHOW STATEMENTS: the `limit` statements (of `tenant`, if named) with the most total time
/// as clients saw it, by (fingerprint, tenant, role, database): calls, rows, latency
/// percentiles from the request's arrival to its answer, the time waited in the gate's
/// queues, PostgreSQL's errors by SQLSTATE and pgward's refusals by reason, what
/// pg_stat_statements counted of the statement for its role and database since pgward began
/// reading it (NULL without the extension), and the normalized text (constants as `$n`).
pub fn statements(rt: &Runtime, limit: usize, tenant: Option<&str>) -> Table {
    let config = rt.config.load();
    let server_of = |key: &crate::ops::statements::StatementKey| {
        // pg_stat_statements knows the role and database the server logs in as.
        let def = config.database(&key.database);
        let def = def.as_ref();
        let role = def.and_then(|d| d.user.as_deref()).unwrap_or(&key.role);
        let db = def
            .and_then(|d| d.dbname.as_deref())
            .unwrap_or(&key.database);
        (role.to_string(), db.to_string())
    };
    // Rows and counters read under one locking of the threads' tables.
    let rows = rt.ops.statements.top_with_server(limit, tenant, server_of);
    let mut t = Table::new(STATEMENTS);
    let ms = |s: Option<f64>| s.map_or(Cell::Null, |s| Cell::decimal(s * 1000.0, 3));
    let counts = |m: &std::collections::BTreeMap<String, u64>| {
        let words: Vec<String> = m.iter().map(|(k, n)| format!("{k}:{n}")).collect();
        words.join(" ")
    };
    for ((key, row, text), server) in rows {
        let l = &row.latency;
        let count = |f: fn(&crate::ops::statements::ServerCounters) -> u64| {
            server.as_ref().map_or(Cell::Null, |c| f(c).into())
        };
        let mean = (l.count() > 0).then(|| l.sum() / l.count() as f64);
        t.push(vec![
            format!("{:016x}", key.fingerprint).into(),
            (&*key.tenant).into(),
            (&*key.role).into(),
            (&*key.database).into(),
            row.calls.into(),
            row.rows.into(),
            ms(Some(l.sum())),
            ms(mean),
            ms(l.quantile(0.5)),
            ms(l.quantile(0.95)),
            ms(l.quantile(0.99)),
            ms((l.count() > 0).then(|| l.max())),
            ms(Some(row.waited)),
            counts(&row.errors).into(),
            counts(&row.refusals).into(),
            count(|c| c.shared_blks_hit),
            count(|c| c.shared_blks_read),
            count(|c| c.temp_blks_read),
            count(|c| c.temp_blks_written),
            count(|c| c.wal_bytes),
            text.map_or(Cell::Null, Cell::from),
        ]);
    }
    t
}

const ANOMALIES: &[(&str, Ty)] = &[
    ("id", Ty::Int8),
    ("state", Ty::Text),
    ("started", Ty::Text),
    ("ended", Ty::Text),
    ("minutes", Ty::Int8),
    ("signals", Ty::Text),
    ("tenants", Ty::Text),
    ("lock_waits", Ty::Int8),
    ("statements", Ty::Text),
];

/// SHOW ANOMALIES: the incident under way (if any) and the last ones that ended, newest
/// first: when, how many unusual minutes, each signal that rose (its peak and its baseline),
/// the tenants and statements behind it, and the most of pgward's sessions seen waiting for a
/// lock at once.
pub fn anomalies(rt: &Runtime) -> Table {
    let incidents = crate::sync::lock(&rt.ops.anomalies).incidents();
    let mut t = Table::new(ANOMALIES);
    for i in incidents {
        t.push(vec![
            i.id.into(),
            if i.ended.is_some() { "ended" } else { "open" }.into(),
            format_time(i.started),
            i.ended.map_or(Cell::Null, format_time),
            u64::from(i.minutes).into(),
            crate::ops::signals_of(&i).into(),
            i.tenants().join(", ").into(),
            (i.lock_waits as u64).into(),
            rt.ops.statements_of(&i).into(),
        ]);
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::Fingerprint;
    use std::collections::BTreeMap;
    use std::time::UNIX_EPOCH;

    const REASONS: [RefusalReason; 9] = [
        RefusalReason::Budget,
        RefusalReason::Killed,
        RefusalReason::QueueTimeout,
        RefusalReason::Deadline,
        RefusalReason::TooSlow,
        RefusalReason::Cost,
        RefusalReason::Rule,
        RefusalReason::CostWarned,
        RefusalReason::Overload,
    ];

    #[test]
    fn each_refusal_reason_has_its_column() {
        assert_eq!(TENANTS.len(), FIRST_REFUSAL + REASONS.len());
        for r in REASONS {
            let (name, _) = TENANTS[refusal_column(r)];
            let expected = match r {
                RefusalReason::CostWarned => "warned_cost".to_string(),
                _ => format!("refused_{}", r.as_str()),
            };
            assert_eq!(name, expected);
        }
    }

    #[test]
    fn tenant_rows() {
        let row = tenant_row(TenantStats {
            tenant: "acme".into(),
            settings: "rate=10 burst=100".into(),
            balance: Some(-42.126),
            debt: 42.126,
            recent_use: 0.0,
            charged: 142.5,
            waiting: 2,
            running: 1,
            refusals: BTreeMap::from([(RefusalReason::Budget, 3), (RefusalReason::Killed, 1)]),
        });
        assert_eq!(row.len(), TENANTS.len());
        assert_eq!(row[2], Cell::Text("-42.1260".into()));
        assert_eq!(row[3], Cell::Text("42.1260".into()));
        assert_eq!(row[6], Cell::Int(2));
        assert_eq!(row[refusal_column(RefusalReason::Budget)], Cell::Int(3));
        assert_eq!(row[refusal_column(RefusalReason::Killed)], Cell::Int(1));
        assert_eq!(row[refusal_column(RefusalReason::Rule)], Cell::Int(0));
        let unbudgeted = tenant_row(TenantStats {
            tenant: "b".into(),
            settings: String::new(),
            balance: None,
            debt: 0.0,
            recent_use: 0.0,
            charged: 0.0,
            waiting: 0,
            running: 0,
            refusals: BTreeMap::new(),
        });
        assert_eq!(unbudgeted[2], Cell::Null);
    }

    #[test]
    fn kill_rows() {
        let wall = UNIX_EPOCH + Duration::from_secs(86_400);
        let row = kill_row(
            &KillRow {
                target: KillTarget::Statement(Fingerprint(0xff)),
                remaining: Duration::from_millis(59_001),
            },
            wall,
        );
        assert_eq!(row[0], Cell::Text("statement".into()));
        assert_eq!(row[1], Cell::Text("00000000000000ff".into()));
        assert_eq!(row[2], Cell::Int(60));
        assert_eq!(row[3], Cell::Text("1970-01-02 00:00:59 UTC".into()));
        let row = kill_row(
            &KillRow {
                target: KillTarget::Tenant("acme".into()),
                remaining: Duration::from_secs(600),
            },
            wall,
        );
        assert_eq!(
            row[..3],
            [
                Cell::Text("tenant".into()),
                Cell::Text("acme".into()),
                Cell::Int(600)
            ]
        );
    }

    #[test]
    fn the_minute_line() {
        assert_eq!(minute_line(&CacheStats::default()), None);
        let s = CacheStats {
            hits: 3,
            misses: 1,
            explains: 1,
            explain_errors: 0,
            explain_time: Duration::from_micros(2500),
            explain_max: Duration::from_micros(2500),
        };
        let line = minute_line(&s).unwrap();
        assert!(line.contains("4 lookups, hit rate 75.0 %"), "{line}");
        assert!(line.contains("1 EXPLAINs (0 failed)"), "{line}");
        assert!(line.contains("mean 2.500 ms, max 2.500 ms"), "{line}");
    }
}
