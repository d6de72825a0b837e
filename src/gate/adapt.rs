//! The adaptive limit of an upstream's fast lane (`adaptive = true`): `max_active` becomes a
//! ceiling and the limit in force moves once a second, additive increase and multiplicative
//! decrease (AIMD), from what the server shows of its load:
//!
//! - **overload**: the statements that finished in the last second ran, as a geometric mean,
//!   more than twice their usual time (each statement's quiet time, per unit of its plan's
//!   cost: see [`Baselines`]), or more than a quarter of the limit waits on locks
//!   (the server reading's count of pgward's sessions waiting for a lock): the limit is
//!   multiplied by 0.9 and lowered by at least one, down to the floor (`min_active`);
//! - **calm and full**: every slot was taken at some point, statements finished, and there
//!   was no overload: one more;
//! - otherwise it stays.
//!
//! Pure: the time is an argument, so the whole policy runs under simulated time in tests.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How often the limit moves.
pub const PERIOD: Duration = Duration::from_secs(1);

/// A run this many times its usual time, as a geometric mean over a second, is overload.
pub const SLOWDOWN: f64 = 2.0;

/// The limit is multiplied by this on overload (and lowered by at least one).
const DECREASE: f64 = 0.9;

/// A count of lock waiters older than this is not used (the reading stopped).
const LOCK_WAITS_FRESH: Duration = Duration::from_secs(3);

/// A window this long has not been ticked for a while (the lane sat idle): what it saw is
/// too old to act on, and a new window starts.
const STALE_WINDOW: Duration = Duration::from_secs(3);

/// How fast a statement's usual time follows its runs (the time constant of an average on a
/// log scale): an overload that comes after calm counts for about this long before it
/// becomes the usual.
const BASELINE_FOLLOW: Duration = Duration::from_secs(120);

/// Statements whose usual time is kept, at most.
const MAX_BASELINES: usize = 10_000;

/// Runs of a statement that make its first usual time, before any counts as a slowdown.
const BASELINE_RUNS: u32 = 8;

/// How long a probe holds the limit at the floor, at most.
const PROBE_LENGTH: Duration = Duration::from_secs(2);

/// A full lane with a standing queue probes again once no quiet run and no probe has been
/// seen for this long; the interval doubles after each probe, up to [`PROBE_EVERY_MAX`], until
/// slowdowns are found again.
const PROBE_EVERY: Duration = Duration::from_secs(30);

/// See [`PROBE_EVERY`].
const PROBE_EVERY_MAX: Duration = Duration::from_secs(600);

/// A usual time not refreshed for this long is forgotten when the map is full.
const BASELINE_STALE: Duration = Duration::from_secs(600);

/// Each statement's usual time, by statement and plan: its time per unit of plan cost (its
/// time, for a statement without a plan) in quiet runs (see [`AdaptiveLimit::note_run`]), the
/// plain average of its first runs on a log scale, then an average that follows them with a
/// time constant of two minutes. Centred on the typical quiet run, so a calm statement's
/// spread is no overload. The calibration's own prediction learns every run, so under load it
/// soon predicts the loaded time; this learns only from quiet runs.
#[derive(Clone, Debug, Default)]
pub struct Baselines {
    /// ln(seconds per cost unit), when it last moved, and the runs seen.
    by_statement: HashMap<u64, (f64, Instant, u32)>,
}

impl Baselines {
    /// A run of `seconds` for a plan of cost `cost` (not finite or not positive: no plan,
    /// taken as 1), as the log of its time per unit of cost.
    fn measure(seconds: f64, cost: f64) -> Option<f64> {
        let cost = match cost.is_finite() && cost > 0.0 {
            true => cost,
            false => 1.0,
        };
        Some((seconds / cost).ln()).filter(|x| x.is_finite())
    }

    /// How many times its usual time statement `statement` took (none before its usual time
    /// is known).
    pub fn slowdown(&self, statement: u64, seconds: f64, cost: f64) -> Option<f64> {
        let x = Self::measure(seconds, cost)?;
        let (usual, _, runs) = self.by_statement.get(&statement)?;
        (*runs >= BASELINE_RUNS).then(|| (x - usual).exp())
    }

    /// A quiet run of statement `statement`: its usual time moves toward it.
    pub fn learn(&mut self, statement: u64, seconds: f64, cost: f64, now: Instant) {
        let Some(x) = Self::measure(seconds, cost) else {
            return;
        };
        let Some((usual, at, runs)) = self.by_statement.get_mut(&statement) else {
            if self.by_statement.len() >= MAX_BASELINES {
                self.by_statement
                    .retain(|_, (_, at, _)| now.saturating_duration_since(*at) < BASELINE_STALE);
            }
            if self.by_statement.len() < MAX_BASELINES {
                self.by_statement.insert(statement, (x, now, 1));
            }
            return;
        };
        *runs = runs.saturating_add(1);
        // The first runs make a plain average; then the time constant rules.
        let dt = now.saturating_duration_since(*at).as_secs_f64();
        let weight = match *runs <= BASELINE_RUNS {
            true => 1.0 / f64::from(*runs),
            false => 1.0 - (-dt / BASELINE_FOLLOW.as_secs_f64()).exp(),
        };
        *usual += (x - *usual) * weight;
        *at = now;
    }

    /// As [`slowdown`](Self::slowdown), then [`learn`](Self::learn).
    pub fn observe(
        &mut self,
        statement: u64,
        seconds: f64,
        cost: f64,
        now: Instant,
    ) -> Option<f64> {
        let slowdown = self.slowdown(statement, seconds, cost);
        self.learn(statement, seconds, cost, now);
        slowdown
    }
}

/// The settings of the adaptive limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdaptiveSettings {
    /// `min_active`: the limit never falls below it.
    pub floor: usize,
    /// `standing_wait`: once the fast lane's queue has stood for a second, work that has
    /// waited this long is turned away (53000).
    pub standing_wait: Duration,
}

impl Default for AdaptiveSettings {
    fn default() -> Self {
        AdaptiveSettings {
            floor: 1,
            standing_wait: Duration::from_secs(1),
        }
    }
}

/// Why the limit last moved.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LimitChange {
    /// Statements ran this many times their usual time (geometric mean).
    Slow(f64),
    /// This many of pgward's sessions waited for a lock.
    LockWaits(usize),
    /// Every slot was taken, statements finished, none slowed down.
    CalmAndFull,
    /// A full lane whose queue stood, with no quiet run seen lately: held at the floor for a
    /// moment to learn how long statements take when the server is not crowded.
    Probe,
    /// The probe is over: back to the limit.
    ProbeOver,
}

impl LimitChange {
    /// As the console and the metrics say it.
    pub fn reason(&self) -> &'static str {
        match self {
            LimitChange::Slow(_) => "slow",
            LimitChange::LockWaits(_) => "lock_waits",
            LimitChange::CalmAndFull => "calm_and_full",
            LimitChange::Probe => "probe",
            LimitChange::ProbeOver => "probe_over",
        }
    }

    /// The reason with its figure, for the console.
    pub fn describe(&self) -> String {
        match self {
            LimitChange::Slow(x) => format!("statements ran {x:.1}x their usual time"),
            LimitChange::LockWaits(n) => format!("{n} sessions waited for locks"),
            LimitChange::CalmAndFull => "every slot taken, no slowdown".to_string(),
            LimitChange::Probe => "probing the statements' quiet time at the floor".to_string(),
            LimitChange::ProbeOver => "probe over".to_string(),
        }
    }
}

/// A move of the limit.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Moved {
    pub at: Instant,
    pub from: usize,
    pub to: usize,
    pub why: LimitChange,
}

/// The adaptive limit of one fast lane, and what it saw since its last move.
#[derive(Clone, Debug)]
pub struct AdaptiveLimit {
    limit: usize,
    window_from: Instant,
    /// Every slot was taken at some point of the window.
    full: bool,
    /// Statements that finished in the window.
    finished: u64,
    /// Of those with a usual time: how many, and the sum of the logs of their slowdowns.
    timed: u64,
    log_slowdowns: f64,
    /// pgward's sessions waiting for a lock, as last read, and when.
    lock_waits: Option<(usize, Instant)>,
    /// The last tick found overload: best-effort work is shed until one does not.
    overloaded: bool,
    last_move: Option<Moved>,
    /// Moves up and down since the start.
    moves: (u64, u64),
    /// The ceiling at the last tick: a limit there follows the ceiling when it rises (more
    /// pools onto the server).
    ceiling: usize,
    baselines: Baselines,
    /// The floor at the last tick.
    floor: usize,
    /// When the last quiet run ended.
    last_quiet: Option<Instant>,
    /// A probe under way: until when at most, and the quiet runs it has seen.
    probe: Option<(Instant, u32)>,
    /// When the last probe ended.
    probed_at: Option<Instant>,
    /// How long after a quiet run or a probe the next probe may come.
    probe_every: Duration,
}

impl AdaptiveLimit {
    /// A limit starting at the ceiling.
    pub fn new(ceiling: usize, now: Instant) -> AdaptiveLimit {
        AdaptiveLimit {
            limit: ceiling.max(1),
            window_from: now,
            full: false,
            finished: 0,
            timed: 0,
            log_slowdowns: 0.0,
            lock_waits: None,
            overloaded: false,
            last_move: None,
            moves: (0, 0),
            ceiling: ceiling.max(1),
            baselines: Baselines::default(),
            floor: 1,
            last_quiet: None,
            probe: None,
            probed_at: None,
            probe_every: PROBE_EVERY,
        }
    }

    /// The limit in force (the floor while a probe is under way).
    pub fn limit(&self) -> usize {
        match self.probe {
            Some(_) => self.limit.min(self.floor),
            None => self.limit,
        }
    }

    /// Whether a probe holds the limit at the floor now.
    pub fn probing(&self) -> bool {
        self.probe.is_some()
    }

    /// The floor: at most this many running together make a quiet run.
    pub fn floor(&self) -> usize {
        self.floor
    }

    /// Whether the last tick found overload (best-effort work is shed meanwhile).
    pub fn overloaded(&self) -> bool {
        self.overloaded
    }

    /// When the last probe ended (a wait through it counts from there).
    pub fn probed_at(&self) -> Option<Instant> {
        self.probed_at
    }

    /// The last move, if any.
    pub fn last_move(&self) -> Option<Moved> {
        self.last_move
    }

    /// Moves up and down since the start.
    pub fn moves(&self) -> (u64, u64) {
        self.moves
    }

    /// When the next tick is due.
    pub fn due_at(&self) -> Instant {
        self.window_from + PERIOD
    }

    /// Every slot of the lane is taken now.
    pub fn note_full(&mut self) {
        self.full = true;
    }

    /// A slot of the lane came back: a statement (or a pipeline) finished.
    pub fn note_finished(&mut self) {
        self.finished += 1;
    }

    /// Statement `statement` (a fingerprint) ran `seconds` for a plan of cost `cost` (none:
    /// it has no plan): its slowdown against its usual time counts. A `quiet` run (no more
    /// than the floor ran beside it when it started and when it ended) teaches the usual
    /// time.
    pub fn note_run(
        &mut self,
        statement: u64,
        seconds: f64,
        cost: Option<f64>,
        quiet: bool,
        now: Instant,
    ) {
        let cost = cost.unwrap_or(1.0);
        if let Some(x) = self.baselines.slowdown(statement, seconds, cost) {
            self.note_slowdown(x);
        }
        if quiet {
            self.baselines.learn(statement, seconds, cost, now);
            self.last_quiet = Some(now);
            if let Some((_, seen)) = self.probe.as_mut() {
                *seen += 1;
            }
        }
    }

    /// A statement with a usual time ran `slowdown` times that time.
    pub fn note_slowdown(&mut self, slowdown: f64) {
        if slowdown.is_finite() && slowdown > 0.0 {
            self.timed += 1;
            self.log_slowdowns += slowdown.ln();
        }
    }

    /// The server reading counted `n` of pgward's sessions waiting for a lock.
    pub fn note_lock_waits(&mut self, n: usize, now: Instant) {
        self.lock_waits = Some((n, now));
    }

    /// The slowdown of the window: the geometric mean of its timed statements.
    fn slowdown(&self) -> Option<f64> {
        (self.timed > 0).then(|| (self.log_slowdowns / self.timed as f64).exp())
    }

    fn lock_waiters(&self, now: Instant) -> usize {
        match self.lock_waits {
            Some((n, at)) if now.saturating_duration_since(at) < LOCK_WAITS_FRESH => n,
            _ => 0,
        }
    }

    /// Starts a new window at `now`.
    fn restart(&mut self, now: Instant) {
        self.window_from = now;
        self.full = false;
        self.finished = 0;
        self.timed = 0;
        self.log_slowdowns = 0.0;
    }

    /// Moves the limit if a period has passed since the last tick: `ceiling` and `floor` as
    /// configured now, `full_now` whether every slot is taken at this moment, `stood` whether
    /// the lane's queue has stood. Returns the move, if the limit moved.
    pub fn tick(
        &mut self,
        ceiling: usize,
        floor: usize,
        full_now: bool,
        stood: bool,
        now: Instant,
    ) -> Option<Moved> {
        if now < self.due_at() {
            return None;
        }
        let ceiling = ceiling.max(1);
        let floor = floor.clamp(1, ceiling);
        self.floor = floor;
        if let Some((until, seen)) = self.probe {
            // A probe judges nothing; it ends once enough quiet runs were seen, or at its end.
            self.restart(now);
            if now < until && seen < BASELINE_RUNS {
                return None;
            }
            self.probe = None;
            self.probed_at = Some(now);
            return Some(self.record(now, floor, self.limit, LimitChange::ProbeOver));
        }
        if now.saturating_duration_since(self.window_from) >= STALE_WINDOW {
            // The lane sat idle: a new window, nothing judged.
            self.limit = self.limit.clamp(floor, ceiling);
            self.ceiling = ceiling;
            self.overloaded = false;
            self.restart(now);
            return None;
        }
        // A limit at its ceiling follows it up; one above a lowered ceiling or below the
        // floor starts from within them.
        let at_ceiling = self.limit >= self.ceiling;
        self.ceiling = ceiling;
        let from = match at_ceiling {
            true => ceiling,
            false => self.limit.clamp(floor, ceiling),
        };
        let bounded = from;
        if self.probe_due(self.full || full_now, stood, now) && bounded > floor {
            self.limit = bounded;
            self.overloaded = false;
            self.probe = Some((now + PROBE_LENGTH, 0));
            self.restart(now);
            return Some(self.record(now, bounded, floor, LimitChange::Probe));
        }
        let waits = self.lock_waiters(now);
        let overload = match self.slowdown() {
            Some(x) if x > SLOWDOWN => Some(LimitChange::Slow(x)),
            _ if waits * 4 > bounded => Some(LimitChange::LockWaits(waits)),
            _ => None,
        };
        let calm_and_full = (self.full || full_now) && self.finished > 0;
        let (to, why) = match overload {
            Some(why) => {
                let cut = ((bounded as f64) * DECREASE).floor() as usize;
                (cut.min(bounded - 1).max(floor), Some(why))
            }
            None if calm_and_full => ((bounded + 1).min(ceiling), Some(LimitChange::CalmAndFull)),
            None => (bounded, None),
        };
        self.overloaded = overload.is_some();
        if matches!(overload, Some(LimitChange::Slow(_))) {
            // Slowdowns are back: the next probe may come soon again.
            self.probe_every = PROBE_EVERY;
        }
        self.limit = to;
        self.restart(now);
        let why = why.filter(|_| to != from)?;
        Some(self.record(now, from, to, why))
    }

    /// Whether a probe starts now: the lane was full, its queue stood, no quiet run was seen
    /// and no probe ran within the probe interval (which doubles after each probe, up to ten
    /// minutes, until slowdowns are found again).
    fn probe_due(&mut self, full: bool, stood: bool, now: Instant) -> bool {
        let within = |t: Option<Instant>| {
            t.is_some_and(|t| now.saturating_duration_since(t) < self.probe_every)
        };
        if !full || !stood || within(self.last_quiet) || within(self.probed_at) {
            return false;
        }
        if self.probed_at.is_some() {
            self.probe_every = (self.probe_every * 2).min(PROBE_EVERY_MAX);
        }
        true
    }

    /// Records a move of the limit.
    fn record(&mut self, at: Instant, from: usize, to: usize, why: LimitChange) -> Moved {
        match to > from {
            true => self.moves.0 += 1,
            false => self.moves.1 += 1,
        }
        let moved = Moved { at, from, to, why };
        self.last_move = Some(moved);
        moved
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn second(t0: Instant, n: u64) -> Instant {
        t0 + Duration::from_secs(n)
    }

    #[test]
    fn a_statement_s_usual_time_is_its_typical_time_per_unit_of_cost() {
        let t0 = Instant::now();
        let mut b = Baselines::default();
        for _ in 0..BASELINE_RUNS {
            assert_eq!(b.observe(7, 0.010, 100.0, t0), None, "its first runs");
        }
        // Twice the cost, twice the time: as usual.
        let x = b.observe(7, 0.020, 200.0, second(t0, 1)).expect("known");
        assert!((x - 1.0).abs() < 1e-9, "{x}");
        // A minute of runs four times slower moves the usual time less than half the way (on
        // a log scale): they still count as overload.
        let mut last = 0.0;
        for s in 2..=61 {
            last = b.observe(7, 0.040, 100.0, second(t0, s)).expect("known");
        }
        assert!((2.0..4.0).contains(&last), "{last}");
        // Without a plan the cost is 1: its time alone.
        for _ in 0..BASELINE_RUNS {
            b.observe(8, 0.5, f64::NAN, t0);
        }
        let x = b.observe(8, 1.0, f64::NAN, second(t0, 1)).expect("known");
        assert!((x - 2.0).abs() < 1e-9, "{x}");
    }

    #[test]
    fn a_calm_statement_s_spread_is_not_overload() {
        // Runs spread by a factor of 3 either way, alternating, many a second: as usual.
        let t0 = Instant::now();
        let mut a = AdaptiveLimit::new(8, t0);
        for s in 0..120u64 {
            for i in 0..50u64 {
                let at = t0 + Duration::from_millis(s * 1000 + i * 20);
                let seconds = [0.01, 0.03, 0.09][(i % 3) as usize];
                a.note_run(1, seconds, Some(10.0), true, at);
            }
            a.note_full();
            a.note_finished();
            a.tick(8, 2, true, false, second(t0, s + 1));
            assert!(!a.overloaded(), "second {s}");
        }
        assert_eq!(a.limit(), 8);
    }

    #[test]
    fn a_full_map_forgets_what_has_not_run_for_a_while() {
        let t0 = Instant::now();
        let mut b = Baselines::default();
        for n in 0..MAX_BASELINES as u64 {
            b.observe(n, 0.01, 1.0, t0);
        }
        let later = t0 + BASELINE_STALE;
        assert_eq!(b.observe(u64::MAX, 0.01, 1.0, later), None);
        assert_eq!(b.by_statement.len(), 1, "the stale ones went");
        assert!(b.by_statement.contains_key(&u64::MAX));
    }

    #[test]
    fn sustained_slow_runs_keep_the_limit_at_the_floor() {
        let t0 = Instant::now();
        let mut a = AdaptiveLimit::new(8, t0);
        for _ in 0..=BASELINE_RUNS {
            a.note_run(1, 0.01, Some(10.0), true, t0);
        }
        for s in 1..=60 {
            for _ in 0..5 {
                a.note_finished();
                a.note_run(
                    1,
                    0.05,
                    Some(10.0),
                    false,
                    second(t0, s) - Duration::from_millis(10),
                );
            }
            a.tick(8, 2, true, false, second(t0, s));
        }
        assert_eq!(a.limit(), 2);
        assert!(a.overloaded());
    }

    #[test]
    fn an_overload_from_the_first_run_is_found_by_a_probe_at_the_floor() {
        let t0 = Instant::now();
        let mut a = AdaptiveLimit::new(8, t0);
        // Eight statements at once from the start, each 40 ms where it takes 10 ms alone:
        // nothing quiet to compare with, so a full lane whose queue stands probes.
        a.note_finished();
        a.note_run(1, 0.04, None, false, t0);
        let m = a.tick(8, 2, true, true, second(t0, 1)).expect("a probe");
        assert_eq!((m.from, m.to, m.why), (8, 2, LimitChange::Probe));
        assert_eq!(a.limit(), 2);
        // Two at a time, they run alone: quiet runs teach the usual time.
        for i in 0..8 {
            a.note_run(
                1,
                0.01,
                None,
                true,
                second(t0, 1) + Duration::from_millis(50 * i),
            );
        }
        let over = a
            .tick(8, 2, true, true, second(t0, 2))
            .expect("the probe ends");
        assert_eq!(
            (over.from, over.to, over.why),
            (2, 8, LimitChange::ProbeOver)
        );
        assert!(!a.probing());
        assert_eq!(a.limit(), 8);
        // Eight at once again: four times the usual time, overload.
        a.note_finished();
        a.note_run(
            1,
            0.04,
            None,
            false,
            second(t0, 2) + Duration::from_millis(500),
        );
        let m = a.tick(8, 2, true, true, second(t0, 3)).expect("a move");
        assert_eq!((m.from, m.to), (8, 7));
        assert!(matches!(m.why, LimitChange::Slow(x) if (x - 4.0).abs() < 1e-6));
        // No new probe while quiet runs were seen lately.
        a.note_run(
            1,
            0.04,
            None,
            false,
            second(t0, 3) + Duration::from_millis(500),
        );
        assert!(!a
            .tick(8, 2, true, true, second(t0, 4))
            .is_some_and(|m| m.why == LimitChange::Probe));
    }

    #[test]
    fn no_probe_without_a_standing_queue_or_with_quiet_runs_lately() {
        let t0 = Instant::now();
        let mut a = AdaptiveLimit::new(8, t0);
        a.note_finished();
        assert_eq!(
            a.tick(8, 2, true, false, second(t0, 1)),
            None,
            "full but its queue empties: no probe"
        );
        assert!(!a.probing());
        a.note_run(1, 0.01, None, true, second(t0, 1));
        a.note_finished();
        assert_eq!(
            a.tick(8, 2, true, true, second(t0, 2)),
            None,
            "a quiet run lately"
        );
        assert!(!a.probing());
        // A probe gives up after its length even without enough quiet runs, and the next
        // comes no sooner than the interval, which doubles after each.
        let mut b = AdaptiveLimit::new(8, t0);
        b.tick(8, 2, true, true, second(t0, 1)).expect("a probe");
        assert_eq!(b.tick(8, 2, true, true, second(t0, 2)), None);
        assert!(b.probing());
        b.tick(8, 2, true, true, second(t0, 3));
        assert!(!b.probing());
        let mut probes = vec![];
        for s in 4..200 {
            b.note_finished();
            let m = b.tick(8, 2, true, true, second(t0, s));
            if m.is_some_and(|m| m.why == LimitChange::Probe) {
                probes.push(s);
            }
        }
        assert_eq!(
            probes,
            [33, 95],
            "30 s after the first ends, then 60 s after the second"
        );
        assert!(!b.overloaded(), "a probe leaves nothing shed");
    }

    #[test]
    fn slow_statements_lower_the_limit_by_a_tenth_and_at_least_one() {
        let t0 = Instant::now();
        let mut a = AdaptiveLimit::new(20, t0);
        a.note_finished();
        a.note_slowdown(3.0);
        a.note_finished();
        a.note_slowdown(2.0);
        let m = a.tick(20, 2, false, false, second(t0, 1)).expect("a move");
        assert_eq!((m.from, m.to), (20, 18));
        assert!(matches!(m.why, LimitChange::Slow(x) if (x - 6f64.sqrt()).abs() < 1e-9));
        assert!(a.overloaded());
        let mut b = AdaptiveLimit::new(5, t0);
        b.note_finished();
        b.note_slowdown(4.0);
        assert_eq!(
            b.tick(5, 1, false, false, second(t0, 1)).map(|m| m.to),
            Some(4)
        );
    }

    #[test]
    fn the_geometric_mean_is_what_counts() {
        // One statement ten times slower, four as usual: a mean of 2.8x, a geometric one of 1.6x.
        let t0 = Instant::now();
        let mut a = AdaptiveLimit::new(8, t0);
        a.note_finished();
        a.note_slowdown(10.0);
        for _ in 0..4 {
            a.note_finished();
            a.note_slowdown(1.0);
        }
        assert_eq!(a.tick(8, 1, false, false, second(t0, 1)), None);
        assert_eq!(a.limit(), 8);
        assert!(!a.overloaded());
    }

    #[test]
    fn a_quarter_of_the_limit_waiting_on_locks_is_overload() {
        let t0 = Instant::now();
        let mut a = AdaptiveLimit::new(8, t0);
        a.note_lock_waits(2, t0);
        assert_eq!(
            a.tick(8, 1, true, false, second(t0, 1)),
            None,
            "2 of 8 is not more"
        );
        a.note_lock_waits(3, second(t0, 1));
        let m = a.tick(8, 1, true, false, second(t0, 2)).expect("a move");
        assert_eq!((m.to, m.why), (7, LimitChange::LockWaits(3)));
        // A count the reading no longer refreshes is not used.
        assert_eq!(a.tick(8, 1, false, false, second(t0, 5)), None);
    }

    #[test]
    fn sustained_overload_reaches_the_floor_and_holds_it_then_calm_climbs_back() {
        let t0 = Instant::now();
        let mut a = AdaptiveLimit::new(10, t0);
        let mut seen = vec![];
        for s in 1..=12 {
            a.note_finished();
            a.note_slowdown(3.0);
            a.tick(10, 3, true, false, second(t0, s));
            seen.push(a.limit());
        }
        assert_eq!(seen, [9, 8, 7, 6, 5, 4, 3, 3, 3, 3, 3, 3]);
        let mut up = vec![];
        for s in 13..=22 {
            a.note_full();
            a.note_finished();
            a.note_slowdown(1.0);
            a.tick(10, 3, false, false, second(t0, s));
            up.push(a.limit());
        }
        assert_eq!(up, [4, 5, 6, 7, 8, 9, 10, 10, 10, 10]);
        assert_eq!(a.moves(), (7, 7));
    }

    #[test]
    fn calm_but_not_full_or_with_nothing_finished_stays() {
        let t0 = Instant::now();
        let mut a = AdaptiveLimit::new(10, t0);
        a.note_finished();
        a.note_slowdown(3.0);
        a.tick(10, 1, false, false, second(t0, 1));
        assert_eq!(a.limit(), 9);
        a.note_finished();
        a.note_slowdown(1.0);
        assert_eq!(a.tick(10, 1, false, false, second(t0, 2)), None, "not full");
        a.note_full();
        assert_eq!(
            a.tick(10, 1, false, false, second(t0, 3)),
            None,
            "nothing finished"
        );
        a.note_finished();
        let m = a
            .tick(10, 1, true, false, second(t0, 4))
            .expect("full now, one finished");
        assert_eq!(m.to, 10);
    }

    #[test]
    fn it_moves_at_most_once_a_period_and_within_a_changed_ceiling() {
        let t0 = Instant::now();
        let mut a = AdaptiveLimit::new(10, t0);
        a.note_finished();
        a.note_slowdown(5.0);
        assert_eq!(
            a.tick(10, 1, false, false, t0 + Duration::from_millis(999)),
            None
        );
        assert_eq!(a.limit(), 10);
        // A reload lowered the ceiling to 4: the limit moves from there.
        a.note_finished();
        a.note_slowdown(5.0);
        let m = a.tick(4, 1, false, false, second(t0, 1)).expect("a move");
        assert_eq!((m.from, m.to), (4, 3));
        assert_eq!(a.moves(), (0, 1));
    }

    #[test]
    fn a_limit_at_its_ceiling_follows_it_up_and_one_below_stays() {
        let t0 = Instant::now();
        // Started with the first pool's servers (4); a second pool brings the ceiling to 12.
        let mut a = AdaptiveLimit::new(4, t0);
        a.note_finished();
        assert_eq!(a.tick(12, 1, false, false, second(t0, 1)), None);
        assert_eq!(a.limit(), 12);
        a.note_finished();
        a.note_slowdown(3.0);
        a.tick(12, 1, false, false, second(t0, 2));
        assert_eq!(a.limit(), 10);
        a.note_finished();
        a.tick(20, 1, false, false, second(t0, 3));
        assert_eq!(
            a.limit(),
            10,
            "below its ceiling: it climbs a step at a time"
        );
    }

    #[test]
    fn a_window_left_idle_is_not_judged() {
        let t0 = Instant::now();
        let mut a = AdaptiveLimit::new(8, t0);
        a.note_finished();
        a.note_slowdown(9.0);
        // Nothing ticked for ten minutes: the old slowdown is forgotten.
        assert_eq!(a.tick(8, 1, false, false, second(t0, 600)), None);
        assert!(!a.overloaded());
        assert_eq!(a.limit(), 8);
        a.note_finished();
        a.note_slowdown(1.0);
        assert_eq!(a.tick(8, 1, false, false, second(t0, 601)), None);
        assert!(!a.overloaded());
    }
}
