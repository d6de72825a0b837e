//! What the gate derives from one reading of a statement, kept per session.
//!
//! The analyzer hands every text of a shape whose analysis does not depend on its constants
//! the same [`Analysis`] (and a text read before, its own): the texts it is shared by differ
//! only inside constants that are plain values in the tree. Everything derived here is read
//! from that analysis and from the text outside its constants (keywords, `;` between
//! statements as the scanner and parser split them, comments), so it holds for every text the
//! analysis stands for, and is worked out once per analysis and session instead of once per
//! statement. It holds while the policy and the session's parameters stay the same (the
//! tenant, the rules and the plan key read its role, application_name, search_path and
//! standard_conforming_strings); either changing empties it. Each entry holds its analysis,
//! so no other analysis can take its address while the entry lives.

use std::sync::Arc;
use std::time::Duration;

use crate::cost::{CostLimits, PlanKey};
use crate::gate::RequestKind;
use crate::policy::Governance;
use crate::sql::{Analysis, Priority, ShapeMemo};

/// Readings remembered per session; past this the memory starts over (a session rarely runs
/// this many shapes between two changes of its settings).
const MAX_READINGS: usize = 128;
/// Only readings of texts this long at most are remembered: each entry holds its analysis
/// alive (one the analyzer has dropped too), and a long text's is about as long as it, while
/// texts that long seldom come again.
const MAX_REMEMBERED_TEXT: usize = 4 << 10;

/// Whether the reading of `text` (`None`: not UTF-8, read anew each time) is remembered.
pub(super) fn worth_remembering(text: Option<&str>) -> bool {
    text.is_some_and(|t| t.len() <= MAX_REMEMBERED_TEXT)
}

/// What the gate derives from a reading (or from a request with none).
#[derive(Debug, Clone)]
pub(super) struct Facts {
    pub kind: RequestKind,
    /// The tenant it runs for, its priority and deadline (the policy's `identify`).
    pub tenant: Arc<str>,
    pub priority: Priority,
    pub deadline: Option<Duration>,
    /// The key of its plan in the plan cache, when it has a fingerprint.
    pub plan_key: Option<PlanKey>,
    /// A simple Query of it holds several statements.
    pub several: bool,
    /// Running it may change other statements' plans (DDL, ANALYZE, VACUUM...).
    pub changes_plans: bool,
    /// It declares a cursor.
    pub declares_cursor: bool,
    /// The tenant's cost limits (the policy's, looked up by name once per reading).
    pub cost_limits: CostLimits,
}

/// What the gate derived from one reading for this session.
#[derive(Debug)]
pub(super) struct Derived {
    /// The reading it was derived from (held: see the module's note).
    analysis: Arc<Analysis>,
    /// Shared with each request that takes them (one count, not a copy of every name).
    pub facts: Arc<Facts>,
    /// The rules allowed it without a warning (`None`: not judged yet).
    pub allowed: Option<bool>,
}

impl Derived {
    pub fn new(analysis: Arc<Analysis>, facts: Facts) -> Derived {
        Derived {
            analysis,
            facts: Arc::new(facts),
            allowed: None,
        }
    }
}

/// The session's derived readings, and what they hold under.
#[derive(Default)]
pub(super) struct Readings {
    /// The policy and the parameters' change count they were derived under.
    under: Option<(Arc<Governance>, u64)>,
    by_analysis: foldhash::HashMap<usize, Derived>,
    /// The session's readings by shape, of that policy's analyzer.
    memo: ShapeMemo,
}

impl Readings {
    /// What was derived from `analysis` under `governance` and parameters at `params`
    /// changes, if it was.
    pub fn get_mut(
        &mut self,
        governance: &Arc<Governance>,
        params: u64,
        analysis: &Arc<Analysis>,
    ) -> Option<&mut Derived> {
        if !self.holds_under(governance, params) {
            return None;
        }
        let found = self.by_analysis.get_mut(&address(analysis))?;
        // (Always true: the entry holds its analysis, so the address is its own.)
        Arc::ptr_eq(&found.analysis, analysis).then_some(found)
    }

    /// Remembers `derived` under `governance` and `params`, and returns it.
    pub fn put(
        &mut self,
        governance: &Arc<Governance>,
        params: u64,
        derived: Derived,
    ) -> &mut Derived {
        self.hold_under(governance, params);
        if self.by_analysis.len() >= MAX_READINGS {
            self.by_analysis.clear();
        }
        let key = address(&derived.analysis);
        self.by_analysis.entry(key).insert_entry(derived).into_mut()
    }

    /// The session's readings by shape under `governance` (for its analyzer).
    pub fn memo(&mut self, governance: &Arc<Governance>, params: u64) -> &mut ShapeMemo {
        self.hold_under(governance, params);
        &mut self.memo
    }

    fn holds_under(&self, governance: &Arc<Governance>, params: u64) -> bool {
        self.under
            .as_ref()
            .is_some_and(|(g, p)| Arc::ptr_eq(g, governance) && *p == params)
    }

    /// Forgets everything derived under another policy or other parameters.
    fn hold_under(&mut self, governance: &Arc<Governance>, params: u64) {
        if !self.holds_under(governance, params) {
            self.by_analysis.clear();
            self.memo.clear();
            self.under = Some((Arc::clone(governance), params));
        }
    }
}

fn address(analysis: &Arc<Analysis>) -> usize {
    Arc::as_ptr(analysis) as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Policy;
    use crate::sql::{Analyzer, Depth, ParseContext};
    use std::path::Path;

    fn governance() -> Arc<Governance> {
        let policy = Policy::parse("", Path::new("policy.toml"), Path::new(".")).unwrap();
        Arc::new(Governance {
            policy,
            analyzer: Analyzer::new(Depth::Tree, 16),
        })
    }

    fn facts() -> Facts {
        Facts {
            kind: RequestKind::Statement,
            tenant: Arc::from("acme"),
            priority: Priority::Normal,
            deadline: None,
            plan_key: None,
            several: false,
            changes_plans: false,
            declares_cursor: false,
            cost_limits: CostLimits::default(),
        }
    }

    #[test]
    fn a_reading_holds_only_under_the_same_policy_and_parameters() {
        let (g, other) = (governance(), governance());
        let context = ParseContext::server_defaults();
        let a = g.analyzer.analyze(b"SELECT 1", &context);
        let b = g.analyzer.analyze(b"SELECT 2", &context);
        assert!(Arc::ptr_eq(&a, &b), "one shape, one reading");
        let mut readings = Readings::default();
        assert!(readings.get_mut(&g, 1, &a).is_none());
        readings
            .put(&g, 1, Derived::new(Arc::clone(&a), facts()))
            .allowed = Some(true);
        let found = readings
            .get_mut(&g, 1, &b)
            .expect("derived once for the shape");
        assert_eq!(found.allowed, Some(true));
        assert_eq!(&*found.facts.tenant, "acme");
        // Another policy, or parameters changed since: derived again.
        assert!(readings.get_mut(&other, 1, &a).is_none());
        assert!(readings.get_mut(&g, 2, &a).is_none());
        // Derived again under new parameters, the old derivations are gone.
        readings.put(&g, 2, Derived::new(Arc::clone(&a), facts()));
        assert!(readings.get_mut(&g, 1, &a).is_none());
        assert_eq!(readings.get_mut(&g, 2, &a).map(|d| d.allowed), Some(None));
        // Another reading is not this one's.
        let c = g.analyzer.analyze(b"SELECT a FROM t", &context);
        assert!(readings.get_mut(&g, 2, &c).is_none());
    }

    #[test]
    fn long_texts_and_texts_not_utf8_are_not_remembered() {
        assert!(worth_remembering(Some("SELECT 1")));
        assert!(!worth_remembering(None));
        let long = format!("SELECT 1 WHERE a IN ({})", vec!["1"; 2_000].join(", "));
        assert!(!worth_remembering(Some(&long)));
    }

    #[test]
    fn the_readings_stay_bounded() {
        let g = governance();
        let context = ParseContext::server_defaults();
        let mut readings = Readings::default();
        let mut held = Vec::new();
        for i in 0..(3 * MAX_READINGS) {
            let a = g
                .analyzer
                .analyze(format!("SELECT c{i}").as_bytes(), &context);
            readings.put(&g, 1, Derived::new(Arc::clone(&a), facts()));
            assert!(readings.by_analysis.len() <= MAX_READINGS);
            held.push(a);
        }
        let last = held.last().expect("read");
        assert!(readings.get_mut(&g, 1, last).is_some());
    }
}
