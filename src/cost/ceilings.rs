//! The cost rules: `max_cost`, `max_scan_rows` and `max_time`.

use super::plan::{PlanSummary, Relation};

/// SQLSTATE of a refusal by a cost rule: program_limit_exceeded.
pub const SQLSTATE_COST: &str = "54000";

/// The cost limits that apply to one statement (from the policy's rules).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CostLimits {
    /// Largest planned total cost of the root node.
    pub max_cost: Option<f64>,
    /// Largest sum of the sizes (rows) of the tables the plan reads in full.
    pub max_scan_rows: Option<f64>,
    /// Longest predicted run time, in seconds (the plan's cost times its learned factor).
    pub max_time: Option<f64>,
}

/// Which rule a plan broke.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CostRule {
    /// `max_cost`.
    MaxCost,
    /// `max_scan_rows`.
    MaxScanRows,
    /// `max_time`.
    MaxTime,
}

impl CostRule {
    /// The rule's name in the policy file.
    pub fn as_str(self) -> &'static str {
        match self {
            CostRule::MaxCost => "max_cost",
            CostRule::MaxScanRows => "max_scan_rows",
            CostRule::MaxTime => "max_time",
        }
    }
}

/// A plan over a limit. The client sees [`message`](Self::message) and
/// [`detail`](Self::detail) (numbers only); [`tables`](Self::tables) is for the log.
#[derive(Clone, Debug, PartialEq)]
pub struct CostViolation {
    /// The rule.
    pub rule: CostRule,
    /// The planned cost, the rows read in full, or the predicted seconds.
    pub value: f64,
    /// The limit.
    pub limit: f64,
    /// The tables read in full (never sent to the client).
    pub tables: Vec<Relation>,
}

impl CostViolation {
    /// Always [`SQLSTATE_COST`].
    pub fn sqlstate(&self) -> &'static str {
        SQLSTATE_COST
    }

    /// The error message: fixed text naming the rule.
    pub fn message(&self) -> String {
        format!("pgward: statement refused by rule {}", self.rule.as_str())
    }

    /// The error detail: the numbers only.
    pub fn detail(&self) -> String {
        let what = match self.rule {
            CostRule::MaxCost => "planned cost",
            CostRule::MaxScanRows => "rows read in full",
            CostRule::MaxTime => {
                return format!(
                    "predicted time {:.3} s is over the limit {} s",
                    self.value, self.limit
                )
            }
        };
        format!(
            "{what} {:.0} is over the limit {:.0}",
            self.value.ceil(),
            self.limit
        )
    }
}

impl CostLimits {
    /// Whether any limit is set.
    pub fn any(&self) -> bool {
        self.max_cost.is_some() || self.max_scan_rows.is_some() || self.max_time.is_some()
    }

    /// The first limit `plan` is over, if any. `size` gives a table's row count, as for
    /// [`PlanSummary::scan_rows`]; `seconds` is the plan's predicted run time, when one
    /// learned from the statement's own runs is known (`max_time` judges nothing else).
    pub fn check(
        &self,
        plan: &PlanSummary,
        seconds: Option<f64>,
        size: impl Fn(&Relation) -> Option<f64>,
    ) -> Option<CostViolation> {
        let tables = || plan.full_scans.iter().map(|s| s.relation.clone()).collect();
        if let Some(limit) = self.max_cost.filter(|l| plan.total_cost > *l) {
            return Some(CostViolation {
                rule: CostRule::MaxCost,
                value: plan.total_cost,
                limit,
                tables: tables(),
            });
        }
        if let (Some(limit), Some(seconds)) = (self.max_time, seconds.filter(|s| *s > 0.0)) {
            if seconds > limit {
                return Some(CostViolation {
                    rule: CostRule::MaxTime,
                    value: seconds,
                    limit,
                    tables: tables(),
                });
            }
        }
        let limit = self.max_scan_rows?;
        let rows = plan.scan_rows(size);
        (rows > limit).then(|| CostViolation {
            rule: CostRule::MaxScanRows,
            value: rows,
            limit,
            tables: tables(),
        })
    }
}
