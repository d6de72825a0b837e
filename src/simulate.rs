//! `pgward simulate --policy FILE --traffic FILE`: a policy tried on recorded traffic. Each
//! statement of the traffic log arrives at its recorded time (simulated time, not waited
//! for) and goes through the admission gate's own pure core with the policy's tenants and
//! `[gate]` settings: refused, delayed (it waited for a slot or a pay-back) or let through,
//! and once through it holds its slot for the server time it took when it was recorded. The
//! report puts what the policy would have done beside what happened, per tenant, and says
//! what the replay cannot know.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};
use std::fmt;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::gate::{
    Cost, Decision, Gate, GateSettings, Granted, Pass, Request, RequestKind, Slot, Spent, TicketId,
    TxControl,
};
use crate::ops::traffic::{kind_of, Entry, CLIENT_LEFT};
use crate::policy::{Policy, PolicyError};
use crate::sql::{Fingerprint, Priority};

/// The gate's clock looks again at least this much later.
const TICK: Duration = Duration::from_millis(1);

/// How long after the last arrival the replay goes on while only the gate's clock ticks.
const MAX_TAIL: Duration = Duration::from_secs(3600);

/// A wait at least this long counts as a delay.
const DELAYED: Duration = Duration::from_millis(1);

/// Why a simulation could not run.
#[derive(Debug, thiserror::Error)]
pub enum SimulateError {
    #[error(transparent)]
    Policy(#[from] PolicyError),
    #[error("{}: {source}", file.display())]
    Io {
        file: PathBuf,
        source: std::io::Error,
    },
    #[error("{}:{line}: {message}", file.display())]
    Traffic {
        file: PathBuf,
        line: usize,
        message: String,
    },
}

/// What happened to a tenant's statements, or what would have.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcomes {
    pub ran: u64,
    /// Refusals by reason.
    pub refused: BTreeMap<String, u64>,
    /// Statements that waited at least a millisecond, and their waits in all (seconds).
    pub delayed: u64,
    pub waited: f64,
    /// Statements still waiting when their client left (recorded) or when the replay ended.
    pub unfinished: u64,
}

impl Outcomes {
    pub fn refusals(&self) -> u64 {
        self.refused.values().sum()
    }

    fn refuse(&mut self, reason: &str) {
        *self.refused.entry(reason.to_string()).or_default() += 1;
    }

    fn ran_after(&mut self, waited: Duration) {
        self.ran += 1;
        if waited >= DELAYED {
            self.delayed += 1;
            self.waited += waited.as_secs_f64();
        }
    }
}

/// One tenant's line of the report.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TenantReport {
    pub statements: u64,
    pub recorded: Outcomes,
    pub simulated: Outcomes,
}

/// The whole report.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Report {
    pub tenants: BTreeMap<String, TenantReport>,
    /// Seconds of traffic replayed.
    pub span: f64,
}

/// What a replay cannot know, said with every report.
pub const CAVEATS: &[&str] = &[
    "statements arrive at their recorded times: a client refused or delayed differently would have sent its next statement at another time, which the log cannot say",
    "each statement holds its slot for the server time it took under the recorded load: under another load it would take another time, and locks, plan changes and the server readings (lock waits, the vacuum horizon) are not replayed",
    "SQL rules and cost rules read statement text and plans, which the log does not keep: their refusals are not in it, and the new policy's rules are not tried",
    "a statement never priced or never run is priced and timed as its statement's other runs were (or its tenant's)",
    "waits for a server from the pool are not replayed; the lanes are capped by the recorded pool sizes",
];

/// Reads the traffic log at `traffic` and replays it under the policy at `policy`.
pub fn run_simulation(policy: &Path, traffic: &Path) -> Result<Report, SimulateError> {
    let policy = Policy::load(policy)?;
    let entries = read_traffic(traffic)?;
    Ok(replay(&policy, entries))
}

/// The entries of a traffic log, in the order of their arrival.
pub fn read_traffic(path: &Path) -> Result<Vec<Entry>, SimulateError> {
    let io = |source| SimulateError::Io {
        file: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let mut entries = Vec::new();
    for (n, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.map_err(io)?;
        if line.trim().is_empty() {
            continue;
        }
        let bad = |message: String| SimulateError::Traffic {
            file: path.to_path_buf(),
            line: n + 1,
            message,
        };
        let entry: Entry = serde_json::from_str(&line).map_err(|e| bad(e.to_string()))?;
        if kind_of(&entry.kind).is_none() {
            return Err(bad(format!("not a traffic log line: {line:.80}")));
        }
        sane(&entry).map_err(bad)?;
        entries.push(entry);
    }
    entries.sort_by(|a, b| a.at.total_cmp(&b.at));
    if let (Some(a), Some(b)) = (entries.first(), entries.last()) {
        if b.at - a.at > MAX_SECONDS {
            let message = format!("the log spans {:.0} s: more than a replay can", b.at - a.at);
            return Err(SimulateError::Traffic {
                file: path.to_path_buf(),
                line: 0,
                message,
            });
        }
    }
    Ok(entries)
}

/// The longest time a line may give (a year), and the longest log replayed.
const MAX_SECONDS: f64 = 366.0 * 86_400.0;

/// Whether `e`'s numbers are times a replay can use: `at` a time since the epoch, the others
/// durations of at most a year, none negative or not a number.
fn sane(e: &Entry) -> Result<(), String> {
    let duration = |name: &str, v: Option<f64>| match v {
        Some(x) if !(0.0..=MAX_SECONDS).contains(&x) => {
            Err(format!("{name} {x} is not a duration of at most a year"))
        }
        _ => Ok(()),
    };
    if !(0.0..=1e11).contains(&e.at) {
        return Err(format!("at {} is not a time", e.at));
    }
    duration("predicted", e.predicted)?;
    duration("took", e.took)?;
    duration("waited", Some(e.waited))?;
    duration("timeout", e.timeout)?;
    duration("deadline", e.deadline)
}

/// Replays `entries` (in arrival order) under `policy`.
pub fn replay(policy: &Policy, entries: Vec<Entry>) -> Report {
    let mut sim = Simulation::new(policy, &entries);
    sim.run(&entries);
    let mut report = Report {
        span: match (entries.first(), entries.last()) {
            (Some(a), Some(b)) => b.at - a.at,
            _ => 0.0,
        },
        ..Report::default()
    };
    for (i, e) in entries.iter().enumerate() {
        let t = report.tenants.entry(e.tenant.clone()).or_default();
        t.statements += 1;
        match e.outcome.as_str() {
            "ran" => t
                .recorded
                .ran_after(Duration::from_secs_f64(e.waited.max(0.0))),
            CLIENT_LEFT => t.recorded.unfinished += 1,
            reason => t.recorded.refuse(reason),
        }
        match &sim.fate[i] {
            Fate::Ran(waited) => t.simulated.ran_after(*waited),
            Fate::Refused(reason) => t.simulated.refuse(reason),
            Fate::Pending | Fate::Left => t.simulated.unfinished += 1,
        }
    }
    report
}

/// What became of one statement in the replay.
#[derive(Clone, Debug)]
enum Fate {
    Pending,
    /// Its client left while it waited, as the log says it did.
    Left,
    Ran(Duration),
    Refused(String),
}

/// A statement running in the replay until `until`.
struct Running {
    /// None inside a transaction, which runs on the server its client holds.
    slot: Option<Slot>,
    tenant: String,
    charged: f64,
    took: f64,
}

struct Simulation {
    gate: Gate<usize>,
    start: Instant,
    t0: f64,
    /// Its predicted and measured seconds, for each statement (fallbacks filled in), and
    /// whether the prediction rested on the statement's own runs.
    prices: Vec<(f64, f64)>,
    learned: Vec<bool>,
    fate: Vec<Fate>,
    running: BinaryHeap<Reverse<(Instant, u64)>>,
    slots: HashMap<u64, Running>,
    next: u64,
    /// Clients inside a transaction block (between their `begin` and `end`).
    in_transaction: std::collections::HashSet<u64>,
    /// When the clients that left while waiting left, by statement; the tickets waiting.
    leaves: BinaryHeap<Reverse<(Instant, usize)>>,
    tickets: HashMap<usize, TicketId>,
    /// The last arrival.
    last: Instant,
}

impl Simulation {
    fn new(policy: &Policy, entries: &[Entry]) -> Simulation {
        let start = Instant::now();
        let settings = GateSettings {
            log: false,
            ..policy.gate().settings
        };
        let mut gate = Gate::new(settings, 1);
        gate.set_all_lanes(settings.lanes);
        for (tenant, config) in policy.tenant_configs() {
            gate.configure_tenant(tenant, config.clone(), start);
        }
        let t0 = entries.first().map_or(0.0, |e| e.at);
        let span = entries.last().map_or(0.0, |e| e.at - t0);
        Simulation {
            gate,
            start,
            t0,
            prices: prices(entries),
            learned: entries
                .iter()
                .map(|e| e.learned && e.predicted.is_some())
                .collect(),
            fate: vec![Fate::Pending; entries.len()],
            running: BinaryHeap::new(),
            slots: HashMap::new(),
            next: 0,
            in_transaction: std::collections::HashSet::new(),
            leaves: BinaryHeap::new(),
            tickets: HashMap::new(),
            last: start + Duration::from_secs_f64(span.max(0.0)),
        }
    }

    fn instant(&self, at: f64) -> Instant {
        self.start + Duration::from_secs_f64((at - self.t0).max(0.0))
    }

    fn run(&mut self, entries: &[Entry]) {
        let mut i = 0;
        let mut now = self.start;
        loop {
            let arrival = entries.get(i).map(|e| self.instant(e.at));
            let done = self.running.peek().map(|Reverse((t, _))| *t);
            let leave = self.leaves.peek().map(|Reverse((t, _))| *t);
            // The gate's own clock: deadlines, queue timeouts, pay-backs (never spinning).
            let wake = match self.gate.has_waiters() {
                true => self.gate.next_wake(now).map(|w| w.max(now + TICK)),
                false => None,
            };
            let Some(t) = [arrival, done, leave, wake].into_iter().flatten().min() else {
                return;
            };
            if arrival.is_none() && done.is_none() && leave.is_none() && t > self.last + MAX_TAIL {
                // Only the gate's clock is left and nothing it can hand a slot to comes: what
                // still waits stays waiting.
                return;
            }
            now = t.max(now);
            if done.is_some_and(|d| d <= now) {
                self.finish(now, entries);
            } else if leave.is_some_and(|l| l <= now) {
                self.leave(now);
            } else if arrival.is_some_and(|a| a <= now) {
                self.arrive(i, &entries[i], now, entries);
                i += 1;
            }
            for e in self.gate.expire(now) {
                self.tickets.remove(&e.waiter);
                self.fate[e.waiter] = Fate::Refused(e.refusal.reason.as_str().to_string());
            }
            let granted = self.gate.dispatch(now, |_| true).into_iter().collect();
            self.grant(granted, now, entries);
        }
    }

    /// Queues `pass` of statement `i`; if its client left while it waited, it leaves the
    /// queue as long after its arrival, if it still waits then.
    fn enqueue(&mut self, i: usize, pass: Pass, now: Instant, entries: &[Entry]) {
        self.tickets.insert(i, pass.id);
        self.gate.enqueue(pass, i, now);
        let e = &entries[i];
        if e.outcome == CLIENT_LEFT {
            let gone = self.instant(e.at) + Duration::from_secs_f64(e.waited);
            self.leaves.push(Reverse((gone.max(now), i)));
        }
    }

    fn leave(&mut self, now: Instant) {
        while let Some(Reverse((at, i))) = self.leaves.peek().copied() {
            if at > now {
                break;
            }
            self.leaves.pop();
            if let Some(id) = self.tickets.remove(&i) {
                if self.gate.withdraw(id, now).is_some() {
                    self.fate[i] = Fate::Left;
                }
            }
        }
    }

    fn arrive(&mut self, i: usize, e: &Entry, now: Instant, entries: &[Entry]) {
        let fingerprint = e
            .fingerprint
            .as_deref()
            .and_then(|h| u64::from_str_radix(h, 16).ok())
            .map(Fingerprint);
        let req = Request {
            client_id: e.client,
            tenant: &e.tenant,
            priority: Priority::parse(&e.priority).unwrap_or(Priority::Normal),
            kind: kind_of(&e.kind).unwrap_or(RequestKind::Statement),
            fingerprint,
            upstream: &e.upstream,
            pool: &e.pool,
            pool_size: e.pool_size,
            database_cap: e.database_cap,
            database: &e.database,
            sent_at: now,
            statement_timeout: e.timeout.and_then(|s| Duration::try_from_secs_f64(s).ok()),
            deadline: e.deadline.and_then(|s| Duration::try_from_secs_f64(s).ok()),
            hint: None,
        };
        let kind = req.kind;
        match self.gate.admit(&req, now) {
            Decision::Refuse(r) => self.fate[i] = Fate::Refused(r.reason.as_str().to_string()),
            Decision::Bypass(_) => {
                self.fate[i] = Fate::Ran(Duration::ZERO);
                match kind {
                    RequestKind::Transaction(TxControl::Begin) => {
                        self.in_transaction.insert(e.client);
                    }
                    RequestKind::Transaction(TxControl::Commit | TxControl::Rollback) => {
                        self.in_transaction.remove(&e.client);
                    }
                    _ => {}
                }
            }
            Decision::Admit(mut pass) if self.in_transaction.contains(&e.client) => {
                // Inside a transaction a statement never waits for a slot (it may hold locks
                // that those ahead of it wait for): it runs now, into debt if need be.
                match self.gate.spend(&mut pass, self.cost(i), now) {
                    Err(r) => self.fate[i] = Fate::Refused(r.reason.as_str().to_string()),
                    Ok(Spent::Run { .. }) => self.start(i, pass, None, now, entries),
                    Ok(Spent::MovedToSlow | Spent::WaitForBudget { .. }) => {
                        self.gate.force_spend(&mut pass, self.prices[i].0, now);
                        self.start(i, pass, None, now, entries);
                    }
                }
            }
            Decision::Admit(mut pass) => {
                // Its price is known (the log has it): charged before any wait, as a
                // statement whose plan is cached is.
                match self.gate.spend(&mut pass, self.cost(i), now) {
                    Err(r) => self.fate[i] = Fate::Refused(r.reason.as_str().to_string()),
                    Ok(Spent::Run { .. }) => match self.gate.try_acquire(&pass, now) {
                        Some(slot) => self.start(i, pass, Some(slot), now, entries),
                        None => self.enqueue(i, pass, now, entries),
                    },
                    Ok(Spent::MovedToSlow | Spent::WaitForBudget { .. }) => {
                        self.enqueue(i, pass, now, entries);
                    }
                }
            }
        }
    }

    fn cost(&self, i: usize) -> Cost {
        Cost {
            seconds: self.prices[i].0,
            known: true,
            learned: self.learned[i],
        }
    }

    /// Each ticket that got a slot: charged if it was not yet, and started; one that must
    /// wait again gives its slot back (which may start others).
    fn grant(&mut self, granted: Vec<Granted<usize>>, now: Instant, entries: &[Entry]) {
        let mut work: VecDeque<Granted<usize>> = granted.into();
        while let Some(Granted {
            mut pass,
            slot,
            waiter,
        }) = work.pop_front()
        {
            self.tickets.remove(&waiter);
            match self.gate.spend(&mut pass, self.cost(waiter), now) {
                Ok(Spent::Run { .. }) => self.start(waiter, pass, Some(slot), now, entries),
                Ok(Spent::MovedToSlow | Spent::WaitForBudget { .. }) => {
                    self.gate.release(&slot, now);
                    self.tickets.insert(waiter, pass.id);
                    self.gate.enqueue(pass, waiter, now);
                    work.extend(self.gate.dispatch(now, |_| true));
                }
                Err(r) => {
                    self.fate[waiter] = Fate::Refused(r.reason.as_str().to_string());
                    self.gate.release(&slot, now);
                    work.extend(self.gate.dispatch(now, |_| true));
                }
            }
        }
    }

    fn start(&mut self, i: usize, pass: Pass, slot: Option<Slot>, now: Instant, entries: &[Entry]) {
        let arrived = self.instant(entries[i].at);
        self.fate[i] = Fate::Ran(now.saturating_duration_since(arrived));
        let took = self.prices[i].1;
        let until = now + Duration::try_from_secs_f64(took).unwrap_or_default();
        self.next += 1;
        self.running.push(Reverse((until, self.next)));
        self.slots.insert(
            self.next,
            Running {
                slot,
                tenant: pass.tenant.to_string(),
                charged: pass.charged(),
                took,
            },
        );
        drop(pass);
    }

    /// The statements whose time is up end: settled, their slots given back and handed on.
    fn finish(&mut self, now: Instant, entries: &[Entry]) {
        while let Some(Reverse((until, id))) = self.running.peek().copied() {
            if until > now {
                break;
            }
            self.running.pop();
            let Some(r) = self.slots.remove(&id) else {
                continue;
            };
            self.gate.settle(&r.tenant, r.charged, r.took, now);
            if let Some(slot) = &r.slot {
                self.gate.release(slot, now);
            }
            let granted = self.gate.dispatch(now, |_| true).into_iter().collect();
            self.grant(granted, now, entries);
        }
    }
}

/// Each statement's predicted and measured seconds: its own where the log has them, else
/// the mean of its statement's (by fingerprint and tenant, then fingerprint), else its
/// tenant's, else a millisecond.
fn prices(entries: &[Entry]) -> Vec<(f64, f64)> {
    #[derive(Default, Clone, Copy)]
    struct Mean {
        predicted: (f64, u32),
        took: (f64, u32),
    }
    let mut by_statement: HashMap<(Option<&str>, &str), Mean> = HashMap::new();
    let mut by_fingerprint: HashMap<Option<&str>, Mean> = HashMap::new();
    let mut by_tenant: HashMap<&str, Mean> = HashMap::new();
    for e in entries {
        let fp = e.fingerprint.as_deref();
        for m in [
            by_statement.entry((fp, e.tenant.as_str())).or_default(),
            by_fingerprint.entry(fp).or_default(),
            by_tenant.entry(e.tenant.as_str()).or_default(),
        ] {
            if let Some(p) = e.predicted.filter(|p| p.is_finite()) {
                m.predicted.0 += p;
                m.predicted.1 += 1;
            }
            if let Some(t) = e.took.filter(|t| t.is_finite()) {
                m.took.0 += t;
                m.took.1 += 1;
            }
        }
    }
    let mean = |(sum, n): (f64, u32)| (n > 0).then(|| sum / f64::from(n));
    entries
        .iter()
        .map(|e| {
            let fp = e.fingerprint.as_deref();
            let means = [
                by_statement.get(&(fp, e.tenant.as_str())),
                by_fingerprint.get(&fp).filter(|_| fp.is_some()),
                by_tenant.get(e.tenant.as_str()),
            ];
            let fallback =
                |pick: fn(&Mean) -> (f64, u32)| means.iter().flatten().find_map(|m| mean(pick(m)));
            let predicted = e
                .predicted
                .filter(|p| p.is_finite())
                .or_else(|| fallback(|m| m.predicted))
                .unwrap_or(0.001);
            let took = e
                .took
                .filter(|t| t.is_finite())
                .or_else(|| fallback(|m| m.took))
                .unwrap_or(predicted);
            (predicted.max(0.0), took.max(0.0))
        })
        .collect()
}

/// Cells ten wide, right-aligned.
fn row<T: fmt::Display>(cells: &[T]) -> String {
    let cells: Vec<String> = cells.iter().map(|c| format!("{c:>10}")).collect();
    cells.join(" ")
}

impl Outcomes {
    /// The report's columns: ran, refused, delayed, still waiting.
    fn columns(&self) -> [u64; 4] {
        [self.ran, self.refusals(), self.delayed, self.unfinished]
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let columns = ["ran", "refused", "delayed", "waiting"];
        writeln!(
            f,
            "{:<20} {:>10} | {} | {}",
            "tenant",
            "statements",
            row(&columns),
            row(&columns)
        )?;
        writeln!(
            f,
            "{:<20} {:>10} | {:^43} | {:^43}",
            "", "", "recorded", "with the new policy"
        )?;
        for (name, t) in &self.tenants {
            writeln!(
                f,
                "{:<20} {:>10} | {} | {}",
                name,
                t.statements,
                row(&t.recorded.columns()),
                row(&t.simulated.columns()),
            )?;
        }
        writeln!(
            f,
            "(waiting: recorded, its client left while it waited; replayed, it still waited when the log ended)"
        )?;
        writeln!(f)?;
        for (name, t) in &self.tenants {
            let reasons = |o: &Outcomes| {
                let words: Vec<String> =
                    o.refused.iter().map(|(r, n)| format!("{r}:{n}")).collect();
                match words.is_empty() {
                    true => "-".to_string(),
                    false => words.join(" "),
                }
            };
            writeln!(
                f,
                "{name}: refused {} recorded, {} with the new policy; waited {:.3}s recorded, {:.3}s with the new policy",
                reasons(&t.recorded),
                reasons(&t.simulated),
                t.recorded.waited,
                t.simulated.waited,
            )?;
        }
        writeln!(f)?;
        writeln!(
            f,
            "{:.1} seconds of traffic replayed. What the replay cannot know:",
            self.span
        )?;
        for c in CAVEATS {
            writeln!(f, "- {c}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(at: f64, tenant: &str, took: f64, outcome: &str) -> Entry {
        Entry {
            at,
            client: 1,
            learned: true,
            tenant: tenant.to_string(),
            role: "app".to_string(),
            database: "app".to_string(),
            upstream: "pg:5432".to_string(),
            pool: "app/app".to_string(),
            pool_size: 10,
            database_cap: 0,
            priority: "normal".to_string(),
            kind: "statement".to_string(),
            fingerprint: Some("00000000000000aa".to_string()),
            timeout: None,
            deadline: None,
            predicted: Some(took),
            took: (outcome == "ran").then_some(took),
            waited: 0.0,
            outcome: outcome.to_string(),
        }
    }

    fn policy(text: &str) -> Policy {
        Policy::parse(text, Path::new("p.toml"), Path::new(".")).unwrap()
    }

    #[test]
    fn one_slot_delays_the_second_of_two_statements_by_the_firsts_time() {
        let log = vec![entry(100.0, "a", 1.0, "ran"), entry(100.0, "a", 1.0, "ran")];
        let report = replay(&policy("[gate]\nmax_active = 1\n"), log.clone());
        let a = &report.tenants["a"];
        assert_eq!((a.simulated.ran, a.simulated.delayed), (2, 1));
        assert!((a.simulated.waited - 1.0).abs() < 0.01, "{a:?}");
        let open = replay(&policy(""), log);
        assert_eq!(open.tenants["a"].simulated.delayed, 0);
    }

    #[test]
    fn a_statement_inside_a_transaction_never_waits_for_a_slot() {
        let on = |client, e: Entry| Entry { client, ..e };
        let kind = |kind: &str, e: Entry| Entry {
            kind: kind.to_string(),
            ..e
        };
        // Client 2 holds the only slot for five seconds; client 1's transaction runs beside it.
        let log = vec![
            on(2, entry(0.0, "b", 5.0, "ran")),
            on(1, kind("begin", entry(0.1, "a", 0.0, "ran"))),
            on(1, entry(0.2, "a", 1.0, "ran")),
            on(1, kind("savepoint", entry(1.3, "a", 0.0, "ran"))),
            on(1, entry(1.4, "a", 1.0, "ran")),
            on(1, kind("end", entry(2.5, "a", 0.0, "ran"))),
            on(1, entry(2.6, "a", 1.0, "ran")),
        ];
        let report = replay(&policy("[gate]\nmax_active = 1\n"), log);
        let a = &report.tenants["a"];
        assert_eq!((a.simulated.ran, a.simulated.delayed), (6, 1), "{a:?}");
        // Only the statement after the COMMIT waited, for the slot: until 5 s.
        assert!((a.simulated.waited - 2.4).abs() < 0.01, "{a:?}");
    }

    #[test]
    fn a_client_that_left_while_waiting_leaves_the_replay_too() {
        let left = Entry {
            client: 2,
            waited: 2.0,
            predicted: None,
            ..entry(0.5, "a", 1.0, CLIENT_LEFT)
        };
        let log = vec![entry(0.0, "a", 10.0, "ran"), left];
        let report = replay(&policy("[gate]\nmax_active = 1\n"), log);
        let a = &report.tenants["a"];
        assert_eq!((a.recorded.ran, a.recorded.unfinished), (1, 1));
        // It left at 2.5 s, before the slot came free at 10 s: it never ran.
        assert_eq!((a.simulated.ran, a.simulated.unfinished), (1, 1), "{a:?}");
    }

    #[test]
    fn a_pool_without_a_size_of_its_own_replays() {
        // pool_size 0: no cap of the pool's own (only the gate's lanes bound it).
        let mut log = vec![entry(100.0, "a", 1.0, "ran"), entry(100.0, "a", 1.0, "ran")];
        for e in &mut log {
            e.pool_size = 0;
            assert_eq!(sane(e), Ok(()));
        }
        let report = replay(&policy(""), log);
        assert_eq!(report.tenants["a"].simulated.delayed, 0);
    }

    #[test]
    fn numbers_a_replay_cannot_use_are_refused_not_panicked_on() {
        let dir = tempfile::tempdir().unwrap();
        for bad in [
            r#"{"at":1e20,"client":1,"tenant":"a","role":"r","database":"d","upstream":"u","pool":"p","pool_size":1,"priority":"normal","kind":"statement","outcome":"ran"}"#,
            r#"{"at":1.0,"client":1,"tenant":"a","role":"r","database":"d","upstream":"u","pool":"p","pool_size":1,"priority":"normal","kind":"statement","outcome":"ran","took":1e300}"#,
            r#"{"at":1.0,"client":1,"tenant":"a","role":"r","database":"d","upstream":"u","pool":"p","pool_size":1,"priority":"normal","kind":"statement","outcome":"ran","waited":-1}"#,
        ] {
            let path = dir.path().join("t.jsonl");
            std::fs::write(&path, bad).unwrap();
            let e = read_traffic(&path).unwrap_err().to_string();
            assert!(e.contains("t.jsonl:1:"), "{e}");
        }
        let path = dir.path().join("t.jsonl");
        let line = |at: f64| {
            format!(
                r#"{{"at":{at},"client":1,"tenant":"a","role":"r","database":"d","upstream":"u","pool":"p","pool_size":1,"priority":"normal","kind":"statement","outcome":"ran"}}"#
            )
        };
        std::fs::write(&path, format!("{}\n{}\n", line(1.0), line(9e10))).unwrap();
        assert!(read_traffic(&path)
            .unwrap_err()
            .to_string()
            .contains("spans"));
    }

    #[test]
    fn a_budget_refuses_what_it_cannot_pay_for_and_a_refusal_is_priced_as_its_statement() {
        // Ten reads of a second each, one a second, against a budget of a tenth of that; the
        // ones refused live were never priced.
        let log: Vec<Entry> = (0..10)
            .map(|i| match i % 2 {
                0 => entry(f64::from(i), "a", 1.0, "ran"),
                _ => Entry {
                    predicted: None,
                    ..entry(f64::from(i), "a", 1.0, "budget")
                },
            })
            .collect();
        let tight = "[tenants.a]\nrate = 0.1\nburst = 1\nwhen_over = \"reject\"\n";
        let report = replay(&policy(tight), log.clone());
        let a = &report.tenants["a"];
        assert_eq!((a.recorded.ran, a.recorded.refused["budget"]), (5, 5));
        // The first empties the burst; a second later the tenant owes nothing and the next
        // runs into debt (as the gate charges), which takes the rest of the replay to pay.
        assert_eq!(a.simulated.ran, 2, "{a:?}");
        assert_eq!(a.simulated.refused["budget"], 8);
        let none = replay(&policy(""), log);
        assert_eq!(none.tenants["a"].simulated.ran, 10);
        assert!(report.to_string().contains("cannot know"));
    }
}
