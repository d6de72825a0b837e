//! Calibration: how many seconds of server time one planner cost unit takes, learned per
//! statement and plan shape from what really ran.
//!
//! The planner's cost ranks statements well on one server but is not time: a plan that runs
//! from memory takes less per unit than one that reads the disk, a lookup's fixed round trip
//! dwarfs its plan. So each (database, fingerprint, plan shape) keeps `ln k`, where
//! `k = measured seconds / planner cost`, as an exponential moving average of its runs (on a
//! log scale, so one run a hundred times slower moves it only a little). A prediction is
//! `cost x k`. A plan never seen, or a new shape of a known statement, starts from the median
//! `k` of the database's known plans (of every database when it has none, and a fixed
//! [`DEFAULT_K`] before anything ran), never from nothing. Statements with no plan (several
//! statements in one text, `DO`, `CALL`, utility commands) keep their usual time instead.
//!
//! Only runs that completed normally and alone are learned (the session decides: a run
//! cancelled, failed, or sharing its time with other statements teaches nothing).
//!
//! Pure: the caller hands in every run and the time; [`Calibration::to_json`] and
//! [`Calibration::from_json`] keep the factors across restarts.

use foldhash::HashMap;

use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Seconds per cost unit before anything has been learned (about one cached 8 KB page read in
/// order, in the units `seq_page_cost = 1` sets).
pub const DEFAULT_K: f64 = 1e-5;
/// Weight of the newest run in a moving average (the factor follows a changed plan within a
/// few runs).
pub const ALPHA: f64 = 0.4;
/// The most one run counts for, as a ratio to the average: a run three times slower than usual
/// counts as three times, one a hundred times slower counts as three times too.
pub const MAX_STEP: f64 = 3.0;
/// `MAX_STEP.ln()`, which is not const.
const LN_MAX_STEP: f64 = 1.098_612_288_668_109_8;
/// Factors kept at most; the least recently used go first.
pub const MAX_FACTORS: usize = 10_000;
/// Runs a plan needs before its factor counts in the database's median.
const MEDIAN_MIN_RUNS: u32 = 1;
/// A plan counts in the median once a run of it took this long: the time of a lookup is
/// nearly all round trip and fixed work, and thousands of them would make every plan never
/// seen look dear per unit (a `SELECT 1` planned at 0.01 units takes a tenth of a
/// millisecond: 10 ms per unit).
const MEDIAN_MIN_SECONDS: f64 = 0.005;
/// Learns between two recomputations of the medians, once more than twice as many factors
/// are known.
const MEDIAN_EVERY: u32 = 32;
/// `k` is kept within these bounds (a plan priced at 10 billion units because a disabled
/// node type was forced cannot set a factor of nothing; a `pg_sleep` planned at 0.01 units
/// may well take a second per hundredth of a unit).
const K_MIN: f64 = 1e-12;
const K_MAX: f64 = 1e6;
/// A format version in the saved file: another one is ignored with a warning.
const FORMAT: u32 = 1;

/// What a factor is learned for.
#[derive(Clone, Debug, Eq, Serialize, Deserialize)]
pub struct PlanFactorKey {
    /// The pgward database.
    pub database: Arc<str>,
    /// The statement's fingerprint.
    pub fingerprint: u64,
    /// The plan's shape ([`PlanShape::fingerprint`](super::PlanShape::fingerprint)); `None`
    /// for a statement that has no plan (its usual time is kept, not a factor).
    pub shape: Option<u64>,
}

/// By the numbers first, then the database by address or bytes (hashed by its bytes).
impl PartialEq for PlanFactorKey {
    fn eq(&self, other: &PlanFactorKey) -> bool {
        self.fingerprint == other.fingerprint
            && self.shape == other.shape
            && crate::name::same(&self.database, &other.database)
    }
}

impl std::hash::Hash for PlanFactorKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.database.hash(state);
        self.fingerprint.hash(state);
        self.shape.hash(state);
    }
}

/// A moving average on a log scale.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
struct LogAverage {
    /// The average of `ln x`.
    ln: f64,
    /// Runs learned.
    runs: u32,
    /// When it was last learned or used, in the caller's ticks (for eviction).
    used: u64,
    /// A run of it took at least [`MEDIAN_MIN_SECONDS`]: its factor says something of the
    /// plan, not only of a round trip, and counts in the database's median.
    #[serde(default)]
    significant: bool,
}

impl LogAverage {
    fn new(x: f64, seconds: f64, tick: u64) -> LogAverage {
        LogAverage {
            ln: x.ln(),
            runs: 1,
            used: tick,
            significant: seconds >= MEDIAN_MIN_SECONDS,
        }
    }

    fn learn(&mut self, x: f64, seconds: f64, tick: u64) {
        // One run moves the average by at most a factor of MAX_STEP^ALPHA: a run slowed ten
        // times by a busy machine does not spoil the next few predictions.
        let step = (x.ln() - self.ln).clamp(-LN_MAX_STEP, LN_MAX_STEP);
        self.ln += ALPHA * step;
        self.runs = self.runs.saturating_add(1);
        self.used = tick;
        self.significant |= seconds >= MEDIAN_MIN_SECONDS;
    }

    fn value(&self) -> f64 {
        self.ln.exp()
    }

    /// Whether the medians count this factor (of a plan: the caller checks the key).
    fn counted(&self) -> bool {
        self.runs >= MEDIAN_MIN_RUNS && self.significant
    }
}

/// Where a prediction came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Basis {
    /// This plan's own factor.
    Learned,
    /// The median factor of the database (or of every database): a plan seen for the first
    /// time, or a new shape.
    Median,
    /// [`DEFAULT_K`]: nothing has run yet.
    Default,
    /// The statement's usual time (no plan).
    UsualTime,
}

/// A predicted run time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Prediction {
    /// Seconds.
    pub seconds: f64,
    /// Where it came from.
    pub basis: Basis,
    /// The factor used (seconds per unit), for a planned statement.
    pub k: Option<f64>,
}

impl Prediction {
    /// Whether it rests on this statement's own runs (not on a median or a default).
    pub fn learned(&self) -> bool {
        matches!(self.basis, Basis::Learned | Basis::UsualTime)
    }
}

/// The learned factors and usual times.
#[derive(Debug, Default)]
pub struct Calibration {
    factors: HashMap<PlanFactorKey, LogAverage>,
    /// Median `k` per database, and over all: while at most `2 * MEDIAN_EVERY` factors are
    /// known, those of every learn so far when read; with more, recomputed at least every
    /// [`MEDIAN_EVERY`] learns (at most that many learns behind).
    medians: HashMap<String, f64>,
    median_all: Option<f64>,
    since_median: u32,
    tick: u64,
    /// Learned since the last save.
    dirty: bool,
    /// While few plans are known, a learn that moves a median marks them stale instead of
    /// recomputing them: they are read only to predict a plan not seen before, far more
    /// rarely than one learns (at every statement's end), and recomputed then.
    medians_stale: bool,
}

/// A statement whose plan changed under it, for the console (SHOW FLIPS).
#[derive(Clone, Debug, PartialEq)]
pub struct Flip {
    /// When it was seen.
    pub at: std::time::SystemTime,
    /// The pgward database.
    pub database: String,
    /// The statement.
    pub fingerprint: u64,
    /// What was seen.
    pub reason: FlipReason,
    /// Until when it runs in the slow lane, if the policy quarantines flips.
    pub quarantined_until: Option<std::time::SystemTime>,
}

/// How a plan flip showed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum FlipReason {
    /// EXPLAIN gave a shape the statement never ran with, where it has a usual one.
    Shape {
        /// The usual shape.
        usual: u64,
        /// The new one.
        new: u64,
    },
    /// A run took over ten times its prediction (and over 100 ms): a plan no EXPLAIN shows,
    /// such as a generic plan PostgreSQL switched to.
    Slow {
        /// Seconds predicted.
        predicted: f64,
        /// Seconds it took.
        took: f64,
    },
}

impl FlipReason {
    /// The word for it.
    pub fn as_str(&self) -> &'static str {
        match self {
            FlipReason::Shape { .. } => "shape",
            FlipReason::Slow { .. } => "slow_run",
        }
    }
}

/// One learned factor or usual time, for the console (SHOW CALIBRATION).
#[derive(Clone, Debug, PartialEq)]
pub struct FactorRow {
    /// What it was learned for.
    pub key: PlanFactorKey,
    /// Seconds per cost unit (a plan), or seconds (a statement without a plan).
    pub value: f64,
    /// Runs learned.
    pub runs: u32,
}

/// The saved form.
#[derive(Serialize, Deserialize)]
struct Saved {
    format: u32,
    factors: Vec<(PlanFactorKey, LogAverage)>,
}

/// Why a saved file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CalibrationError {
    /// Not JSON of the right form.
    #[error("not a pgward state file: {0}")]
    Json(#[from] serde_json::Error),
    /// Another format version.
    #[error("state file format {0} is not {FORMAT}")]
    Format(u32),
}

impl Calibration {
    /// Nothing learned.
    pub fn new() -> Calibration {
        Calibration::default()
    }

    /// The predicted time of a planned statement of `cost` units with the plan `key`.
    pub fn predict_plan(&mut self, key: &PlanFactorKey, cost: f64) -> Prediction {
        let cost = if cost.is_finite() { cost.max(0.0) } else { 0.0 };
        self.tick += 1;
        let (k, basis) = match self.factors.get_mut(key) {
            Some(f) => {
                f.used = self.tick;
                (f.value(), Basis::Learned)
            }
            None => self.median_of(&key.database),
        };
        Prediction {
            seconds: cost * k,
            basis,
            k: Some(k),
        }
    }

    /// The usual time of a statement that has no plan, once it has run.
    pub fn predict_unplanned(&mut self, database: &str, fingerprint: u64) -> Option<Prediction> {
        let key = PlanFactorKey {
            database: database.into(),
            fingerprint,
            shape: None,
        };
        self.tick += 1;
        let f = self.factors.get_mut(&key)?;
        f.used = self.tick;
        Some(Prediction {
            seconds: f.value(),
            basis: Basis::UsualTime,
            k: None,
        })
    }

    /// Runs a plan shape needs before a different shape of the same statement counts as a
    /// flip.
    pub const USUAL_RUNS: u32 = 5;

    /// The usual plan shape of statement `fingerprint` in `database`: of its shapes that ran
    /// at least [`USUAL_RUNS`](Self::USUAL_RUNS) times, the one used most recently. A new
    /// shape (never run) of a statement that has a usual one is a plan flip. Looks at every
    /// factor: call it only for a shape that has none of its own.
    pub fn usual_shape(&self, database: &str, fingerprint: u64) -> Option<u64> {
        self.factors
            .iter()
            .filter(|(k, f)| {
                k.fingerprint == fingerprint
                    && &*k.database == database
                    && f.runs >= Self::USUAL_RUNS
            })
            .max_by_key(|(_, f)| f.used)
            .and_then(|(k, _)| k.shape)
    }

    /// The factor of a plan that has run, if it has.
    pub fn factor(&self, key: &PlanFactorKey) -> Option<f64> {
        self.factors
            .get(key)
            .filter(|_| key.shape.is_some())
            .map(LogAverage::value)
    }

    /// Learns one normal run of `seconds`: of a plan of `cost` units (a factor), or of a
    /// statement without a plan (`key.shape` is `None`: its usual time).
    pub fn learn(&mut self, key: PlanFactorKey, cost: Option<f64>, seconds: f64) {
        if !(seconds.is_finite() && seconds > 0.0) {
            return;
        }
        let x = match (key.shape, cost) {
            (Some(_), Some(cost)) if cost.is_finite() && cost > 0.0 => {
                (seconds / cost).clamp(K_MIN, K_MAX)
            }
            (Some(_), _) => return,
            (None, _) => seconds,
        };
        self.tick += 1;
        let tick = self.tick;
        let key_planned = key.shape.is_some();
        self.dirty = true;
        self.since_median = self.since_median.saturating_add(1);
        // While few plans are known every learn counts (the medians are marked stale and
        // recomputed when read); later, every few dozen learns.
        let first_significant =
            key_planned && seconds >= MEDIAN_MIN_SECONDS && self.median_all.is_none();
        let few = self.factors.len() <= 2 * MEDIAN_EVERY as usize;
        let now = (self.since_median >= MEDIAN_EVERY && !few) || first_significant;
        match self.factors.get_mut(&key) {
            Some(f) => {
                let counted = f.counted();
                f.learn(x, seconds, tick);
                // The medians read only counted plan factors: one that is not counted before
                // or after this run moves none of them.
                let moves = key_planned && (counted || f.counted());
                if now {
                    self.recompute_medians();
                } else if few && moves {
                    self.medians_stale = true;
                }
            }
            None => {
                self.make_room();
                self.factors.insert(key, LogAverage::new(x, seconds, tick));
                if now {
                    self.recompute_medians();
                } else if few {
                    self.medians_stale = true;
                }
            }
        }
    }

    fn make_room(&mut self) {
        if self.factors.len() < MAX_FACTORS {
            return;
        }
        // Drop the least recently used tenth at once, so eviction is rare.
        let mut used: Vec<u64> = self.factors.values().map(|f| f.used).collect();
        let cut = used.len() / 10;
        let (_, nth, _) = used.select_nth_unstable(cut);
        let limit = *nth;
        self.factors.retain(|_, f| f.used > limit);
    }

    fn median_of(&mut self, database: &str) -> (f64, Basis) {
        match self.median_k(database) {
            Some(k) => (k, Basis::Median),
            None => (DEFAULT_K, Basis::Default),
        }
    }

    /// Recomputes the median factor of each database and of all plans.
    fn recompute_medians(&mut self) {
        self.since_median = 0;
        self.medians_stale = false;
        let mut per: HashMap<&str, Vec<f64>> = HashMap::default();
        let mut all = Vec::new();
        for (key, f) in &self.factors {
            if key.shape.is_none() || !f.counted() {
                continue;
            }
            per.entry(&key.database).or_default().push(f.ln);
            all.push(f.ln);
        }
        self.medians = per
            .into_iter()
            .filter_map(|(db, mut v)| Some((db.to_string(), median(&mut v)?.exp())))
            .collect();
        self.median_all = median(&mut all).map(f64::exp);
    }

    /// Every factor and usual time, the most recently used first.
    pub fn rows(&self) -> Vec<FactorRow> {
        let mut rows: Vec<(u64, FactorRow)> = self
            .factors
            .iter()
            .map(|(key, f)| {
                let row = FactorRow {
                    key: key.clone(),
                    value: f.value(),
                    runs: f.runs,
                };
                (f.used, row)
            })
            .collect();
        rows.sort_by_key(|r| std::cmp::Reverse(r.0));
        rows.into_iter().map(|(_, r)| r).collect()
    }

    /// How many factors and usual times are kept.
    pub fn len(&self) -> usize {
        self.factors.len()
    }

    /// Whether nothing is kept.
    pub fn is_empty(&self) -> bool {
        self.factors.is_empty()
    }

    /// The median factor of `database` (or of every database), if anything has run.
    pub fn median_k(&mut self, database: &str) -> Option<f64> {
        if self.medians_stale {
            self.recompute_medians();
        }
        self.medians.get(database).copied().or(self.median_all)
    }

    /// Whether something was learned since the last [`to_json`](Self::to_json).
    pub fn dirty(&self) -> bool {
        self.dirty
    }

    /// Something learned was not saved after all (the write failed): save it next time.
    pub fn mark_dirty(&mut self) {
        self.dirty = true;
    }

    /// The factors as JSON, for the state file; clears [`dirty`](Self::dirty).
    pub fn to_json(&mut self) -> String {
        self.dirty = false;
        let saved = Saved {
            format: FORMAT,
            factors: self.factors.iter().map(|(k, f)| (k.clone(), *f)).collect(),
        };
        serde_json::to_string(&saved).unwrap_or_default()
    }

    /// Factors read back from [`to_json`](Self::to_json)'s text; entries that are not finite
    /// numbers are left out, and at most [`MAX_FACTORS`] are kept.
    pub fn from_json(text: &str) -> Result<Calibration, CalibrationError> {
        let saved: Saved = serde_json::from_str(text)?;
        if saved.format != FORMAT {
            return Err(CalibrationError::Format(saved.format));
        }
        // A factor outside what learning can reach, or a time of no length or of more than a
        // day, was not written by pgward: left out.
        let valid = |(key, f): &(PlanFactorKey, LogAverage)| {
            let (low, high) = match key.shape {
                Some(_) => (K_MIN.ln(), K_MAX.ln()),
                None => (f64::MIN_POSITIVE.ln(), 86_400f64.ln()),
            };
            f.runs > 0 && f.ln.is_finite() && (low..=high).contains(&f.ln)
        };
        let mut factors: Vec<(PlanFactorKey, LogAverage)> =
            saved.factors.into_iter().filter(valid).collect();
        factors.sort_by_key(|f| std::cmp::Reverse(f.1.used));
        factors.truncate(MAX_FACTORS);
        // Numbered anew, oldest first, so the ticks go on from a small number.
        let n = factors.len() as u64;
        for (i, (_, f)) in factors.iter_mut().enumerate() {
            f.used = n - i as u64;
        }
        let tick = n;
        let mut c = Calibration {
            factors: factors.into_iter().collect(),
            tick,
            ..Calibration::default()
        };
        c.recompute_medians();
        Ok(c)
    }
}

/// The median of `v` (the lower middle for an even count), if any.
fn median(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mid = (v.len() - 1) / 2;
    let (_, m, _) = v.select_nth_unstable_by(mid, f64::total_cmp);
    Some(*m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(db: &str, fp: u64, shape: Option<u64>) -> PlanFactorKey {
        PlanFactorKey {
            database: db.into(),
            fingerprint: fp,
            shape,
        }
    }

    /// The median factor over `c`'s counted plans of `database` (all databases: `None`),
    /// worked out from the factors themselves.
    fn median_from_factors(c: &Calibration, database: Option<&str>) -> Option<f64> {
        let mut lns: Vec<f64> = c
            .factors
            .iter()
            .filter(|(k, f)| k.shape.is_some() && f.counted())
            .filter(|(k, _)| database.is_none_or(|d| &*k.database == d))
            .map(|(_, f)| f.ln)
            .collect();
        median(&mut lns).map(f64::exp)
    }

    /// With many plans known, an unseen plan's median is never more than [`MEDIAN_EVERY`]
    /// learns behind the factors, however reads and learns interleave.
    #[test]
    fn with_many_plans_the_medians_are_at_most_a_few_dozen_learns_behind() {
        let mut c = Calibration::new();
        let mut history: std::collections::VecDeque<f64> = std::collections::VecDeque::new();
        for i in 0..1_000u64 {
            // 150 plans, each run long enough to count, slower and slower.
            let seconds = 0.005 + (i % 13) as f64 * 0.003 + i as f64 * 1e-4;
            c.learn(key("a", i % 150, Some(1)), Some(1000.0), seconds);
            history.push_back(median_from_factors(&c, Some("a")).expect("counted plans"));
            if history.len() > MEDIAN_EVERY as usize + 1 {
                history.pop_front();
            }
            if i % (3 + i % 11) != 0 {
                continue;
            }
            let k = c.predict_plan(&key("a", 999, Some(7)), 1.0).k.unwrap();
            let near = |m: &f64| (k - m).abs() <= m * 1e-12;
            assert!(
                history.iter().any(near),
                "after learn {i}: {k} not in {history:?}"
            );
            if c.factors.len() <= 2 * MEDIAN_EVERY as usize {
                assert!(near(history.back().unwrap()), "after learn {i}");
            }
        }
    }

    /// A plan not seen before is predicted with the median of every run learned before it,
    /// its database's or, failing that, all databases'.
    #[test]
    fn an_unseen_plan_is_predicted_with_the_medians_of_every_learn_before_it() {
        let mut c = Calibration::new();
        for i in 0..200u64 {
            let db = ["a", "b", "c", "d"][(i % 4) as usize];
            let seconds = 0.001 + (i % 7) as f64 * 0.004;
            // Few plans (at most 30), database d only short runs (never counted).
            let plan = key(db, i % 5, Some(i % 2));
            let seconds = if db == "d" { 0.001 } else { seconds };
            c.learn(plan, Some(100.0 + (i % 5) as f64 * 50.0), seconds);
            for db in ["a", "d"] {
                let want = median_from_factors(&c, Some(db)).or(median_from_factors(&c, None));
                let p = c.predict_plan(&key(db, 999, Some(7)), 1.0);
                match want {
                    Some(k) => {
                        assert_eq!(p.basis, Basis::Median, "after learn {i}");
                        assert!((p.k.unwrap() - k).abs() <= k * 1e-12, "after learn {i}");
                    }
                    None => assert_eq!(p.basis, Basis::Default, "after learn {i}"),
                }
            }
        }
    }

    #[test]
    fn nothing_learned_predicts_with_the_default_factor() {
        let mut c = Calibration::new();
        let p = c.predict_plan(&key("app", 1, Some(9)), 1000.0);
        assert_eq!(p.basis, Basis::Default);
        assert!((p.seconds - 1000.0 * DEFAULT_K).abs() < 1e-12);
        assert!(c.predict_unplanned("app", 1).is_none());
    }

    #[test]
    fn a_plan_learns_its_own_factor_and_converges() {
        let mut c = Calibration::new();
        let k = key("app", 1, Some(9));
        for _ in 0..30 {
            c.learn(k.clone(), Some(1000.0), 0.5);
        }
        let p = c.predict_plan(&k, 2000.0);
        assert_eq!(p.basis, Basis::Learned);
        assert!((p.seconds - 1.0).abs() < 1e-9, "{p:?}");
    }

    #[test]
    fn the_steps_bound_is_the_log_of_max_step() {
        assert!((LN_MAX_STEP - MAX_STEP.ln()).abs() < 1e-15);
    }

    #[test]
    fn one_outlier_moves_the_log_average_only_partly() {
        let mut c = Calibration::new();
        let k = key("app", 1, Some(9));
        for _ in 0..20 {
            c.learn(k.clone(), Some(100.0), 0.1);
        }
        c.learn(k.clone(), Some(100.0), 10.0);
        let after = c.predict_plan(&k, 100.0).seconds;
        // A hundred times slower once: the factor moves by at most 3^0.4, not by 100.
        assert!(after <= 0.1 * MAX_STEP.powf(ALPHA) * 1.000_001, "{after}");
        assert!(after > 0.1);
    }

    #[test]
    fn a_new_shape_starts_from_the_median_of_its_database() {
        let mut c = Calibration::new();
        for (fp, k) in [(1, 1e-6), (2, 2e-6), (3, 4e-6)] {
            c.learn(key("app", fp, Some(fp)), Some(10_000.0), 10_000.0 * k);
        }
        c.learn(key("other", 7, Some(7)), Some(1.0), 1.0);
        let p = c.predict_plan(&key("app", 1, Some(99)), 1000.0);
        assert_eq!(p.basis, Basis::Median);
        assert!((p.seconds - 2e-3).abs() < 1e-9, "{p:?}");
        // A database with nothing of its own uses the median of all.
        let p = c.predict_plan(&key("third", 1, Some(1)), 1000.0);
        assert_eq!(p.basis, Basis::Median);
    }

    #[test]
    fn quick_runs_do_not_set_the_median() {
        let mut c = Calibration::new();
        // A thousand lookups of a tenth of a millisecond at 0.01 units each.
        for fp in 0..1000 {
            c.learn(key("app", fp, Some(1)), Some(0.01), 0.0001);
        }
        assert_eq!(c.median_k("app"), None);
        let p = c.predict_plan(&key("app", 5000, Some(2)), 50_000.0);
        assert_eq!(p.basis, Basis::Default);
        // One plan that ran long enough to say something sets it.
        c.learn(key("app", 9999, Some(3)), Some(50_000.0), 0.5);
        let median = c.median_k("app").expect("a median");
        assert!((median - 1e-5).abs() < 1e-12, "{median}");
    }

    #[test]
    fn usual_times_are_kept_apart_from_factors() {
        let mut c = Calibration::new();
        c.learn(key("app", 5, None), None, 0.3);
        let p = c.predict_unplanned("app", 5).expect("learned");
        assert_eq!(p.basis, Basis::UsualTime);
        assert!((p.seconds - 0.3).abs() < 1e-12);
        // Not a factor: the median stays unknown.
        assert_eq!(c.median_k("app"), None);
    }

    #[test]
    fn nonsense_is_not_learned() {
        let mut c = Calibration::new();
        let k = key("app", 1, Some(1));
        c.learn(k.clone(), Some(0.0), 1.0);
        c.learn(k.clone(), Some(f64::NAN), 1.0);
        c.learn(k.clone(), Some(10.0), f64::INFINITY);
        c.learn(k.clone(), Some(10.0), -1.0);
        c.learn(k.clone(), None, 1.0);
        assert!(c.is_empty());
    }

    #[test]
    fn factors_survive_a_save_and_a_load() {
        let mut c = Calibration::new();
        let k = key("app", 1, Some(9));
        for _ in 0..5 {
            c.learn(k.clone(), Some(1000.0), 0.25);
        }
        c.learn(key("app", 2, None), None, 0.5);
        assert!(c.dirty());
        let text = c.to_json();
        assert!(!c.dirty());
        let mut back = Calibration::from_json(&text).expect("reads back");
        assert_eq!(
            back.predict_plan(&k, 1000.0).seconds,
            c.predict_plan(&k, 1000.0).seconds
        );
        assert_eq!(back.median_k("app"), c.median_k("app"));
        assert!(back.predict_unplanned("app", 2).is_some());
    }

    #[test]
    fn a_broken_or_foreign_file_is_an_error_not_a_panic() {
        assert!(Calibration::from_json("").is_err());
        assert!(Calibration::from_json("{\"format\": 99, \"factors\": []}").is_err());
        assert!(Calibration::from_json("[1,2,3]").is_err());
        let odd = "{\"format\":1,\"factors\":[[{\"database\":\"a\",\"fingerprint\":1,\"shape\":2},\
                   {\"ln\":1e999,\"runs\":1,\"used\":1}]]}";
        // Not a finite number: left out (serde reads 1e999 as infinity or refuses it).
        if let Ok(c) = Calibration::from_json(odd) {
            assert!(c.is_empty());
        }
        // A factor learning cannot reach, and a tick at the end of the numbers.
        let far = "{\"format\":1,\"factors\":[[{\"database\":\"a\",\"fingerprint\":1,\"shape\":2},\
                   {\"ln\":800,\"runs\":1,\"used\":1}],\
                   [{\"database\":\"a\",\"fingerprint\":2,\"shape\":2},\
                   {\"ln\":-5,\"runs\":1,\"used\":18446744073709551615}]]}";
        let mut c = Calibration::from_json(far).expect("reads");
        assert_eq!(c.len(), 1);
        let k = key("a", 3, Some(3));
        c.learn(k.clone(), Some(1.0), 1.0);
        assert!(c.predict_plan(&k, 1.0).seconds.is_finite());
    }

    #[test]
    fn the_least_recently_used_go_first_when_full() {
        let mut c = Calibration::new();
        for fp in 0..(MAX_FACTORS as u64 + 5) {
            c.learn(key("app", fp, Some(1)), Some(1.0), 1.0);
        }
        assert!(c.len() <= MAX_FACTORS);
        // The newest are kept.
        assert!(c
            .factor(&key("app", MAX_FACTORS as u64 + 4, Some(1)))
            .is_some());
        assert!(c.factor(&key("app", 0, Some(1))).is_none());
    }
}
