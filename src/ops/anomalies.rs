//! Unusual minutes. Each minute with enough statements is judged on three signals: its p99
//! latency, the share of statements that failed, and the share that ran over ten times their
//! own statement's median and for at least 100 ms. Each signal has a baseline, the mean and
//! mean deviation of the last normal minutes (about 30); a minute is unusual on a signal when
//! its value is over three mean deviations above the mean, over twice the mean, and over the
//! signal's floor. Two unusual minutes in a row start an incident, two normal ones end it; one
//! incident holds every signal that rose while it lasted, and the statements, tenants and lock
//! waits behind it. Unusual minutes never join the baseline, so a long incident does not
//! become the new normal; a minute with too few statements neither starts nor ends anything.
//! Pure: the caller says when a minute ends.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Instant, SystemTime};

use super::sketch::{ceil_index, Latency};
use foldhash::HashMap;

pub use crate::policy::AnomalySettings;

/// A run at least this long (seconds) and over ten times its statement's median is slow.
pub const SLOW_FLOOR: f64 = 0.1;

/// How many times its own median a run must take to be slow.
pub const SLOW_FACTOR: f64 = 10.0;

/// Statements (and tenants) a minute keeps apart at most, to say who was behind it.
const MAX_BEHIND: usize = 1_000;

/// Incidents kept once ended.
const MAX_ENDED: usize = 50;

/// Statements an incident names.
pub const NAMED: usize = 5;

/// What a minute is judged on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Signal {
    /// The 99th percentile of latency, in seconds.
    P99,
    /// The share of statements PostgreSQL answered with an error.
    Failures,
    /// The share of statements over ten times their own median (and 100 ms).
    Slow,
}

impl Signal {
    pub const ALL: [Signal; 3] = [Signal::P99, Signal::Failures, Signal::Slow];

    pub fn as_str(self) -> &'static str {
        match self {
            Signal::P99 => "p99",
            Signal::Failures => "failures",
            Signal::Slow => "slow",
        }
    }

    /// A value at or under this is never unusual (a quiet server's tiny baseline does not
    /// raise an alarm over 3 ms).
    fn floor(self) -> f64 {
        match self {
            Signal::P99 => 0.05,
            Signal::Failures => 0.02,
            Signal::Slow => 0.05,
        }
    }

    fn index(self) -> usize {
        self as usize
    }

    /// `value` as it reads: seconds for p99, a percentage for shares.
    pub fn show(self, value: f64) -> String {
        match self {
            Signal::P99 => format!("{value:.3}s"),
            _ => format!("{:.1}%", value * 100.0),
        }
    }
}

/// One statement's part in a minute (or an incident).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Behind {
    /// Runs PostgreSQL failed.
    pub failed: u64,
    /// Runs over ten times their median (and 100 ms).
    pub slow: u64,
    /// Runs of 100 ms or more.
    pub long: u64,
}

impl Behind {
    fn weight(&self) -> u64 {
        self.failed + self.slow + self.long
    }

    fn add(&mut self, other: &Behind) {
        self.failed += other.failed;
        self.slow += other.slow;
        self.long += other.long;
    }
}

/// A minute's latencies in 256 buckets 10% wide, from a microsecond to about 7 hours (the
/// p99 a minute is judged on needs no finer grain, and counting a run costs a logarithm).
#[derive(Clone, Debug)]
struct Coarse {
    counts: Box<[u32; COARSE_BUCKETS]>,
    n: u64,
}

const COARSE_BUCKETS: usize = 256;
const COARSE_GAMMA: f64 = 1.1;
const COARSE_FLOOR: f64 = 1e-6;

impl Default for Coarse {
    fn default() -> Self {
        Coarse {
            counts: Box::new([0; COARSE_BUCKETS]),
            n: 0,
        }
    }
}

impl Coarse {
    #[cfg(test)]
    fn add(&mut self, seconds: f64) {
        self.add_latency(Latency::of(seconds));
    }

    fn add_latency(&mut self, latency: Latency) {
        let i = match latency.seconds() > COARSE_FLOOR {
            true => {
                let above = latency.ln() - COARSE_FLOOR.ln();
                usize::try_from(ceil_index(above / COARSE_GAMMA.ln())).unwrap_or(0)
            }
            false => 0,
        };
        self.counts[i.min(COARSE_BUCKETS - 1)] += 1;
        self.n += 1;
    }

    fn merge(&mut self, other: &Coarse) {
        for (mine, theirs) in self.counts.iter_mut().zip(other.counts.iter()) {
            *mine += theirs;
        }
        self.n += other.n;
    }

    /// The `q` quantile: the upper bound of the bucket of rank `ceil(q·n)` (within 10%).
    fn quantile(&self, q: f64) -> Option<f64> {
        if self.n == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.n as f64).ceil() as u64).max(1);
        let mut seen = 0u64;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += u64::from(c);
            if seen >= rank {
                return Some(COARSE_FLOOR * COARSE_GAMMA.powi(i as i32));
            }
        }
        None
    }
}

/// What one minute saw.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    statements: u64,
    failures: u64,
    slow: u64,
    latency: Coarse,
    lock_waits: usize,
    behind: HashMap<(u64, String), Behind>,
}

impl Tally {
    /// One run of statement `fingerprint` by `tenant` that took `seconds` (failed or not),
    /// whose statement's median was `median` before it (if it had run).
    pub fn add(
        &mut self,
        fingerprint: u64,
        tenant: &str,
        latency: Latency,
        failed: bool,
        median: Option<f64>,
    ) {
        let seconds = latency.seconds();
        self.statements += 1;
        self.latency.add_latency(latency);
        let long = seconds >= SLOW_FLOOR;
        let slow = long && median.is_some_and(|m| seconds > SLOW_FACTOR * m);
        self.failures += u64::from(failed);
        self.slow += u64::from(slow);
        if !(failed || long) {
            return;
        }
        let key = (fingerprint, tenant.to_string());
        if self.behind.len() >= MAX_BEHIND && !self.behind.contains_key(&key) {
            return;
        }
        let b = self.behind.entry(key).or_default();
        b.failed += u64::from(failed);
        b.slow += u64::from(slow);
        b.long += u64::from(long);
    }

    /// Adds the tally of the same minute kept elsewhere (another worker thread's).
    pub fn merge(&mut self, other: Tally) {
        self.statements += other.statements;
        self.failures += other.failures;
        self.slow += other.slow;
        self.latency.merge(&other.latency);
        self.lock_waits = self.lock_waits.max(other.lock_waits);
        for (key, b) in other.behind {
            if self.behind.len() >= MAX_BEHIND && !self.behind.contains_key(&key) {
                continue;
            }
            let mine = self.behind.entry(key).or_default();
            mine.failed += b.failed;
            mine.slow += b.slow;
            mine.long += b.long;
        }
    }

    /// The server reading counted `n` of pgward's sessions waiting for a lock.
    pub fn note_lock_waits(&mut self, n: usize) {
        self.lock_waits = self.lock_waits.max(n);
    }

    /// Statements counted.
    pub fn statements(&self) -> u64 {
        self.statements
    }

    fn value(&self, signal: Signal) -> f64 {
        let n = self.statements.max(1) as f64;
        match signal {
            Signal::P99 => self.latency.quantile(0.99).unwrap_or(0.0),
            Signal::Failures => self.failures as f64 / n,
            Signal::Slow => self.slow as f64 / n,
        }
    }
}

/// A signal that rose: its highest value and the baseline's mean it rose over.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rise {
    pub peak: f64,
    pub baseline: f64,
}

/// A stretch of unusual minutes.
#[derive(Clone, Debug, PartialEq)]
pub struct Incident {
    pub id: u64,
    /// When its first unusual minute began.
    pub started: SystemTime,
    /// When its last minute ended (`None`: still open).
    pub ended: Option<SystemTime>,
    /// Unusual minutes in it.
    pub minutes: u32,
    /// Every signal that rose in it.
    pub signals: BTreeMap<Signal, Rise>,
    /// The statements behind it, by fingerprint and tenant.
    pub behind: HashMap<(u64, String), Behind>,
    /// The most of pgward's sessions seen waiting for a lock at once.
    pub lock_waits: usize,
}

impl Incident {
    fn fold(&mut self, rose: &[(Signal, f64, f64)], tally: Tally) {
        self.minutes += 1;
        for &(signal, value, mean) in rose {
            let rise = self.signals.entry(signal).or_insert(Rise {
                peak: value,
                baseline: mean,
            });
            rise.peak = rise.peak.max(value);
        }
        for (key, b) in tally.behind {
            if self.behind.len() < MAX_BEHIND || self.behind.contains_key(&key) {
                self.behind.entry(key).or_default().add(&b);
            }
        }
        self.lock_waits = self.lock_waits.max(tally.lock_waits);
    }

    /// The `n` statements with the most failed, slow and long runs in it, most first.
    pub fn named(&self, n: usize) -> Vec<(u64, &str, Behind)> {
        let mut all: Vec<(u64, &str, Behind)> = self
            .behind
            .iter()
            .map(|((f, t), b)| (*f, t.as_str(), *b))
            .collect();
        all.sort_by(|a, b| {
            b.2.weight()
                .cmp(&a.2.weight())
                .then(a.0.cmp(&b.0))
                .then(a.1.cmp(b.1))
        });
        all.truncate(n);
        all
    }

    /// The tenants behind it, the most runs first.
    pub fn tenants(&self) -> Vec<&str> {
        let mut by: BTreeMap<&str, u64> = BTreeMap::new();
        for ((_, t), b) in &self.behind {
            *by.entry(t.as_str()).or_default() += b.weight();
        }
        let mut all: Vec<(&str, u64)> = by.into_iter().collect();
        all.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        all.into_iter().map(|(t, _)| t).collect()
    }
}

/// What closing a minute changed.
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    Started(Incident),
    Ended(Incident),
}

/// The judge of minutes.
#[derive(Debug)]
pub struct Detector {
    settings: AnomalySettings,
    baseline: [VecDeque<f64>; 3],
    /// The current minute's start.
    began: Option<Instant>,
    /// An unusual minute that may start an incident.
    candidate: Option<Incident>,
    open: Option<Incident>,
    /// Normal minutes in a row while an incident is open.
    calm: u32,
    ended: VecDeque<Incident>,
    next_id: u64,
}

impl Default for Detector {
    fn default() -> Self {
        Detector::new(AnomalySettings::default())
    }
}

impl Detector {
    pub fn new(settings: AnomalySettings) -> Detector {
        Detector {
            settings,
            baseline: Default::default(),
            began: None,
            candidate: None,
            open: None,
            calm: 0,
            ended: VecDeque::new(),
            next_id: 1,
        }
    }

    pub fn settings(&self) -> AnomalySettings {
        self.settings
    }

    /// New settings (a reload); the baseline stays.
    pub fn set_settings(&mut self, settings: AnomalySettings) {
        self.settings = settings;
        for b in &mut self.baseline {
            while b.len() > settings.baseline_minutes.max(1) {
                b.pop_front();
            }
        }
    }

    /// Whether the minute that began earlier is over at `now` (the first call starts one).
    pub fn due(&mut self, now: Instant) -> bool {
        let began = *self.began.get_or_insert(now);
        if now.saturating_duration_since(began) < self.settings.minute {
            return false;
        }
        self.began = Some(now);
        true
    }

    /// Judges the minute that ended at `at` with `tally`.
    pub fn close(&mut self, tally: Tally, at: SystemTime) -> Option<Change> {
        if tally.statements < self.settings.min_statements {
            return None;
        }
        let rose = self.rose(&tally);
        if rose.is_empty() {
            return self.normal(&tally, at);
        }
        self.calm = 0;
        if let Some(open) = &mut self.open {
            open.fold(&rose, tally);
            return None;
        }
        match self.candidate.take() {
            Some(mut incident) => {
                incident.fold(&rose, tally);
                incident.id = self.next_id;
                self.next_id += 1;
                self.open = Some(incident.clone());
                Some(Change::Started(incident))
            }
            None => {
                let mut incident = Incident {
                    id: 0,
                    started: at.checked_sub(self.settings.minute).unwrap_or(at),
                    ended: None,
                    minutes: 0,
                    signals: BTreeMap::new(),
                    behind: HashMap::default(),
                    lock_waits: 0,
                };
                incident.fold(&rose, tally);
                self.candidate = Some(incident);
                None
            }
        }
    }

    /// The signals of `tally` that rose over their baselines: (signal, value, mean).
    fn rose(&self, tally: &Tally) -> Vec<(Signal, f64, f64)> {
        let mut rose = Vec::new();
        for signal in Signal::ALL {
            let base = &self.baseline[signal.index()];
            if base.len() < self.settings.min_baseline.max(1) {
                continue;
            }
            let n = base.len() as f64;
            let mean = base.iter().sum::<f64>() / n;
            let deviation = base.iter().map(|v| (v - mean).abs()).sum::<f64>() / n;
            let value = tally.value(signal);
            if value > mean + 3.0 * deviation && value > 2.0 * mean && value > signal.floor() {
                rose.push((signal, value, mean));
            }
        }
        rose
    }

    /// A normal minute: it joins the baseline, and a second one in a row ends an incident.
    fn normal(&mut self, tally: &Tally, at: SystemTime) -> Option<Change> {
        for signal in Signal::ALL {
            let base = &mut self.baseline[signal.index()];
            base.push_back(tally.value(signal));
            while base.len() > self.settings.baseline_minutes.max(1) {
                base.pop_front();
            }
        }
        self.candidate = None;
        self.open.as_ref()?;
        self.calm += 1;
        if self.calm < 2 {
            return None;
        }
        self.calm = 0;
        let mut incident = self.open.take()?;
        incident.ended = Some(at);
        if self.ended.len() >= MAX_ENDED {
            self.ended.pop_front();
        }
        self.ended.push_back(incident.clone());
        Some(Change::Ended(incident))
    }

    /// Incidents started since the start, and whether one is open.
    pub fn counts(&self) -> (u64, bool) {
        (self.next_id - 1, self.open.is_some())
    }

    /// The open incident (if any) and the ended ones kept, newest first.
    pub fn incidents(&self) -> Vec<Incident> {
        let open = self.open.iter().cloned();
        open.chain(self.ended.iter().rev().cloned()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const MINUTE: Duration = Duration::from_secs(60);

    fn settings() -> AnomalySettings {
        AnomalySettings::default()
    }

    /// A minute of `n` runs of statement 1 by `a` taking `seconds` each, `failed` of them
    /// failing.
    fn minute(n: u64, seconds: f64, failed: u64) -> Tally {
        let mut t = Tally::default();
        for i in 0..n {
            t.add(1, "a", Latency::of(seconds), i < failed, Some(0.002));
        }
        t
    }

    fn at(m: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + MINUTE * m as u32
    }

    fn calm(d: &mut Detector, from: u64, minutes: u64) {
        for m in from..from + minutes {
            assert_eq!(d.close(minute(100, 0.002, 0), at(m)), None, "minute {m}");
        }
    }

    #[test]
    fn a_minute_kept_on_two_threads_merges_into_the_whole_minute() {
        let mut one = minute(60, 0.002, 0);
        one.note_lock_waits(3);
        let mut other = minute(40, 0.5, 10);
        other.note_lock_waits(2);
        one.merge(other);
        let mut whole = minute(60, 0.002, 0);
        for i in 0..40 {
            whole.add(1, "a", Latency::of(0.5), i < 10, Some(0.002));
        }
        assert_eq!(one.statements(), 100);
        assert_eq!((one.failures, one.slow, one.lock_waits), (10, 40, 3));
        for s in [Signal::P99, Signal::Failures, Signal::Slow] {
            assert_eq!(one.value(s), whole.value(s), "{s:?}");
        }
        let behind = &one.behind[&(1, "a".to_string())];
        assert_eq!((behind.failed, behind.slow, behind.long), (10, 40, 40));
    }

    #[test]
    fn two_unusual_minutes_start_one_incident_and_two_normal_ones_end_it() {
        let mut d = Detector::new(settings());
        calm(&mut d, 0, 10);
        // Latency rises first, then failures too: one incident with both signals.
        assert_eq!(d.close(minute(100, 0.4, 0), at(10)), None);
        let Some(Change::Started(i)) = d.close(minute(100, 0.5, 40), at(11)) else {
            panic!("no incident");
        };
        assert_eq!(i.id, 1);
        assert_eq!(i.started, at(9));
        assert_eq!(i.minutes, 2);
        assert!(i.signals.contains_key(&Signal::P99));
        assert!(i.signals.contains_key(&Signal::Failures));
        assert!((i.signals[&Signal::P99].peak / 0.5 - 1.0).abs() < 0.1);
        assert_eq!(d.close(minute(100, 0.5, 90), at(12)), None);
        assert_eq!(d.close(minute(100, 0.002, 0), at(13)), None);
        let Some(Change::Ended(i)) = d.close(minute(100, 0.002, 0), at(14)) else {
            panic!("not ended");
        };
        assert_eq!((i.minutes, i.ended), (3, Some(at(14))));
        assert_eq!(i.named(5)[0].0, 1);
        assert_eq!(i.tenants(), vec!["a"]);
        assert_eq!(d.incidents().len(), 1);
    }

    #[test]
    fn one_unusual_minute_is_no_incident_and_never_joins_the_baseline() {
        let mut d = Detector::new(settings());
        calm(&mut d, 0, 10);
        assert_eq!(d.close(minute(100, 5.0, 0), at(10)), None);
        calm(&mut d, 11, 1);
        assert!(d.incidents().is_empty());
        let p99 = &d.baseline[Signal::P99.index()];
        assert!(p99.iter().all(|v| *v < 0.01), "{p99:?}");
    }

    #[test]
    fn an_unusual_stretch_never_becomes_the_baseline() {
        let mut d = Detector::new(settings());
        calm(&mut d, 0, 10);
        for m in 10..100 {
            let change = d.close(minute(100, 0.4, 0), at(m));
            assert_eq!(matches!(change, Some(Change::Started(_))), m == 11);
        }
        assert_eq!(d.incidents()[0].minutes, 90);
        assert_eq!(d.incidents()[0].ended, None);
    }

    #[test]
    fn quiet_minutes_neither_start_nor_end_anything() {
        let mut d = Detector::new(settings());
        calm(&mut d, 0, 10);
        assert_eq!(d.close(minute(100, 0.4, 0), at(10)), None);
        assert_eq!(d.close(minute(5, 0.002, 0), at(11)), None);
        assert!(matches!(
            d.close(minute(100, 0.4, 0), at(12)),
            Some(Change::Started(_))
        ));
        assert_eq!(d.close(minute(100, 0.002, 0), at(13)), None);
        assert_eq!(d.close(minute(3, 0.002, 0), at(14)), None);
        assert!(matches!(
            d.close(minute(100, 0.002, 0), at(15)),
            Some(Change::Ended(_))
        ));
    }

    #[test]
    fn a_small_rise_over_a_tiny_baseline_is_under_the_floor() {
        let mut d = Detector::new(settings());
        calm(&mut d, 0, 10);
        // Ten times the baseline's p99, but 20 ms: under the 50 ms floor.
        for m in 10..20 {
            assert_eq!(d.close(minute(100, 0.02, 1), at(m)), None);
        }
        assert!(d.incidents().is_empty());
    }

    #[test]
    fn nothing_is_judged_before_the_baseline_has_minutes() {
        let mut d = Detector::new(settings());
        for m in 0..4 {
            assert_eq!(d.close(minute(100, 3.0, 50), at(m)), None);
        }
        assert!(d.incidents().is_empty());
    }

    #[test]
    fn slow_runs_are_those_over_ten_times_their_median_and_the_floor() {
        let mut t = Tally::default();
        t.add(1, "a", Latency::of(0.05), false, Some(0.001));
        t.add(2, "a", Latency::of(0.5), false, Some(0.1));
        t.add(3, "b", Latency::of(0.5), false, Some(0.01));
        t.add(4, "b", Latency::of(0.5), false, None);
        assert_eq!(t.slow, 1);
        assert_eq!(t.value(Signal::Slow), 0.25);
        assert_eq!(t.behind[&(3, "b".to_string())].slow, 1);
        assert_eq!(t.behind.len(), 3);
    }

    #[test]
    fn a_minutes_percentiles_are_within_ten_percent() {
        let mut c = Coarse::default();
        assert_eq!(c.quantile(0.99), None);
        for ms in 1..=1000 {
            c.add(f64::from(ms) / 1000.0);
        }
        for (q, want) in [(0.5, 0.5), (0.99, 0.99), (1.0, 1.0)] {
            let got = c.quantile(q).unwrap();
            assert!(got >= want && got <= want * 1.1, "{q}: {got}");
        }
        c.add(f64::NAN);
        c.add(1e9);
        assert_eq!(c.n, 1002);
    }

    #[test]
    fn minutes_end_when_their_length_has_passed() {
        let mut d = Detector::new(AnomalySettings {
            minute: Duration::from_secs(2),
            ..settings()
        });
        let t0 = Instant::now();
        assert!(!d.due(t0));
        assert!(!d.due(t0 + Duration::from_secs(1)));
        assert!(d.due(t0 + Duration::from_secs(2)));
        assert!(!d.due(t0 + Duration::from_secs(3)));
        assert!(d.due(t0 + Duration::from_secs(4)));
    }
}
