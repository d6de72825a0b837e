//! The gate's refusals, each with the SQLSTATE PostgreSQL itself uses for it.

use std::time::Duration;

/// SQLSTATE insufficient_resources: budget, slot wait, kill.
pub const SQLSTATE_RESOURCES: &str = "53000";
/// SQLSTATE query_canceled: deadlines.
pub const SQLSTATE_CANCELED: &str = "57014";

/// Why a request was refused (SHOW TENANTS counts refusals by reason).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RefusalReason {
    /// The tenant owes time and `when_over = reject`.
    Budget,
    /// A kill of the tenant or the statement.
    Killed,
    /// No slot within the queue timeout.
    QueueTimeout,
    /// The deadline passed (before the start, or while waiting).
    Deadline,
    /// The statement's expected run time does not fit before its deadline.
    TooSlow,
    /// A cost rule (`max_cost`, `max_scan_rows`), refused by the caller.
    Cost,
    /// A policy rule, refused by the caller.
    Rule,
    /// Not a refusal: a cost rule in warn mode would have refused the statement, which ran.
    CostWarned,
    /// The server is overloaded (adaptive limit): best-effort work shed while the limit
    /// falls, or a wait too long in a queue that has stood.
    Overload,
}

impl RefusalReason {
    /// The name shown in SHOW TENANTS.
    pub fn as_str(self) -> &'static str {
        match self {
            RefusalReason::Budget => "budget",
            RefusalReason::Killed => "killed",
            RefusalReason::QueueTimeout => "queue_timeout",
            RefusalReason::Deadline => "deadline",
            RefusalReason::TooSlow => "too_slow",
            RefusalReason::Cost => "cost",
            RefusalReason::Rule => "rule",
            RefusalReason::CostWarned => "cost_warned",
            RefusalReason::Overload => "overload",
        }
    }
}

/// A refusal to send to the client as an ErrorResponse: boxed, so that the admission's
/// results that may carry one stay small to move on the path that admits.
#[derive(Clone, Debug, PartialEq)]
pub struct Refusal(Box<RefusalFields>);

/// What a [`Refusal`] says.
#[derive(Clone, Debug, PartialEq)]
pub struct RefusalFields {
    /// Why.
    pub reason: RefusalReason,
    /// The SQLSTATE.
    pub sqlstate: &'static str,
    /// The message: fixed text (the tenant's name at most).
    pub message: String,
    /// Numbers only.
    pub detail: Option<String>,
    /// What to do about it.
    pub hint: Option<String>,
    /// The numbers behind it, by name, for the decision log (seconds and counts; a budget
    /// refusal's `retry_after_s`, jitter included, is [`retry_after`](Self::retry_after)).
    pub figures: Vec<(&'static str, f64)>,
}

impl std::ops::Deref for Refusal {
    type Target = RefusalFields;

    fn deref(&self) -> &RefusalFields {
        &self.0
    }
}

impl std::ops::DerefMut for Refusal {
    fn deref_mut(&mut self) -> &mut RefusalFields {
        &mut self.0
    }
}

impl From<RefusalFields> for Refusal {
    fn from(fields: RefusalFields) -> Refusal {
        Refusal(Box::new(fields))
    }
}

impl RefusalFields {
    fn new(reason: RefusalReason, sqlstate: &'static str, message: String) -> RefusalFields {
        RefusalFields {
            reason,
            sqlstate,
            message,
            detail: None,
            hint: None,
            figures: Vec::new(),
        }
    }
}

impl Refusal {
    pub(super) fn new(reason: RefusalReason, sqlstate: &'static str, message: String) -> Refusal {
        RefusalFields::new(reason, sqlstate, message).into()
    }

    pub(super) fn budget(tenant: &str, owed: f64, retry_after: Duration) -> Refusal {
        RefusalFields {
            detail: Some(format!("{:.3} s of server time owed", owed.max(0.0))),
            hint: Some(format!(
                "retry in {:.3} s, when the budget is paid back",
                retry_after.as_secs_f64()
            )),
            figures: vec![
                ("owed_s", owed.max(0.0)),
                ("retry_after_s", retry_after.as_secs_f64()),
            ],
            ..RefusalFields::new(
                RefusalReason::Budget,
                SQLSTATE_RESOURCES,
                format!("pgward: tenant \"{tenant}\" is over its budget"),
            )
        }
        .into()
    }

    /// When to come back (budget refusals).
    pub fn retry_after(&self) -> Option<Duration> {
        let (_, s) = self.figures.iter().find(|(n, _)| *n == "retry_after_s")?;
        Duration::try_from_secs_f64(*s).ok()
    }

    pub fn killed(what: &str) -> Refusal {
        Refusal::new(
            RefusalReason::Killed,
            SQLSTATE_RESOURCES,
            format!("pgward: {what} is killed"),
        )
    }

    pub fn queue_timeout(waited: Duration) -> Refusal {
        RefusalFields {
            detail: Some(format!("waited {} ms", waited.as_millis())),
            figures: vec![("waited_s", waited.as_secs_f64())],
            ..RefusalFields::new(
                RefusalReason::QueueTimeout,
                SQLSTATE_RESOURCES,
                "pgward: no server slot within the queue timeout".to_string(),
            )
        }
        .into()
    }

    /// Best-effort work shed while an overloaded server's limit falls.
    pub(super) fn shed() -> Refusal {
        RefusalFields {
            hint: Some(
                "best-effort work is turned away while the server is overloaded; retry later"
                    .into(),
            ),
            ..RefusalFields::new(
                RefusalReason::Overload,
                SQLSTATE_RESOURCES,
                "pgward: the server is overloaded".to_string(),
            )
        }
        .into()
    }

    /// A wait past `standing_wait` in a queue that has not emptied for a while.
    pub(super) fn stood(waited: Duration) -> Refusal {
        RefusalFields {
            detail: Some(format!(
                "waited {} ms in a queue that has not emptied",
                waited.as_millis()
            )),
            figures: vec![("waited_s", waited.as_secs_f64())],
            ..RefusalFields::new(
                RefusalReason::Overload,
                SQLSTATE_RESOURCES,
                "pgward: the server is overloaded".to_string(),
            )
        }
        .into()
    }

    pub(super) fn deadline() -> Refusal {
        Refusal::new(
            RefusalReason::Deadline,
            SQLSTATE_CANCELED,
            "canceling statement due to pgward's deadline".to_string(),
        )
    }

    pub(super) fn too_slow(expected: Duration, left: Duration) -> Refusal {
        RefusalFields {
            detail: Some(format!(
                "expected run time {} ms, {} ms left before the deadline",
                expected.as_millis(),
                left.as_millis()
            )),
            figures: vec![
                ("expected_s", expected.as_secs_f64()),
                ("left_s", left.as_secs_f64()),
            ],
            ..RefusalFields::new(
                RefusalReason::TooSlow,
                SQLSTATE_CANCELED,
                "canceling statement: pgward expects it cannot finish before its deadline"
                    .to_string(),
            )
        }
        .into()
    }
}
