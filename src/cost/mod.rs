//! Prices from the planner: `EXPLAIN (FORMAT JSON, VERBOSE)` plans, the cost rules
//! (`max_cost`, `max_scan_rows`, `max_time`), which statement of a text to judge, the plan
//! cache, and the calibration that turns a plan's cost into seconds ([`calibrate`]).
//!
//! Pure: it reads text the server returned and is handed the time; the session runs the
//! EXPLAIN on the server the statement will run on (same role, settings and search_path; see
//! [`target`] for the simple and the extended protocol).

mod cache;
pub mod calibrate;
mod ceilings;
mod plan;
pub mod target;

pub use cache::{CacheStats, PlanCache, PlanKey, PLAN_CAPACITY, PLAN_TTL};
pub use calibrate::{Basis, Calibration, FactorRow, Flip, FlipReason, PlanFactorKey, Prediction};
pub use ceilings::{CostLimits, CostRule, CostViolation, SQLSTATE_COST};
pub use plan::{FullScan, PlanShape, PlanSummary, Relation, ShapeNode, MAX_PLAN_BYTES};
pub use target::{explain_sql, judged_statement, relation_sizes_sql, Judged};

/// Why an EXPLAIN answer could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CostError {
    /// The answer is longer than [`MAX_PLAN_BYTES`].
    #[error("EXPLAIN output of {0} bytes is too large")]
    TooLarge(usize),
    /// The answer is not JSON.
    #[error("EXPLAIN output is not JSON: {0}")]
    Json(String),
    /// The JSON is not a list holding a `Plan`.
    #[error("EXPLAIN output holds no plan")]
    NoPlan,
    /// A node lacks a field every node has.
    #[error("plan node without {0:?}")]
    Missing(&'static str),
}

#[cfg(test)]
mod tests;
