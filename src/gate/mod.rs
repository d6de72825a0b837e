//! The admission gate: the policy that decides whether a tenant's work may run, when, in
//! which lane and at what price, and who gets a server next. Its core is pure: it takes the
//! time as an argument and never touches a socket, so it is tested under simulated time.
//! Two files are not pure and say so: [`keeper`], the core at run time (a sync mutex, the
//! sessions' mailboxes for the ends of their waits, the clock task), and [`decisions`], the
//! decision log's file. Sessions reach the gate through `session::admit` alone.
//!
//! # How the session and the pool use it
//!
//! The [`Gate`] lives in one sync mutex shared by the pools; no lock is held across `.await`.
//!
//! 1. [`Gate::admit`] with the [`Request`] (tenant and priority from the policy's
//!    `Identity`, kind from [`RequestKind::of_sql`] or the session's own reading): a
//!    [`Decision`]. `Bypass` (transaction control) runs at once without a slot; `Refuse` is
//!    answered with its SQLSTATE; `Admit` gives a [`Pass`].
//! 2. [`Gate::try_acquire`], or [`Gate::enqueue`] with the sender of the session's mailbox
//!    and wait on the mailbox until the pass's deadline or the queue timeout (hearing a notice
//!    after query_wait_notify on the way). A client that gives up calls [`Gate::withdraw`]
//!    (refunded). The clock, at [`Gate::next_wake`], runs [`Gate::clock_turn`]:
//!    [`Gate::expire`] (answer each with its refusal), [`Gate::dispatch`] (send each grant),
//!    then [`Gate::notices_due`] (tell those still waiting that they are queued).
//! 3. With the slot and the server: the price (the plan cache, or EXPLAIN through
//!    [`crate::cost`]), the cost rules, then [`Gate::spend`], cached plan or not.
//!    `MovedToSlow` / `WaitForBudget`: release the slot and queue again.
//! 4. The slot is held while PostgreSQL owes the client answers (a pipeline holds one); then
//!    [`Gate::release`] and offer it with [`Gate::next_waiter`] (or `dispatch`).
//!
//! PgBouncer's first-come order ([`WaitQueue`]) stays for the pool's server wait; whether a
//! pool may open a server is the pool's own business (`pool::Limits`).

pub mod adapt;
mod bucket;
mod decide;
pub mod decisions;
mod ends;
mod evict;
mod events;
mod fair;
pub mod keeper;
mod kills;
mod mailbox;
mod kind;
mod names;
mod pass;
mod queue;
mod refusal;
mod registry;
mod tenant;

pub use adapt::{AdaptiveSettings, LimitChange, Moved};
pub use bucket::{charge_of, Budget, DecayingUse, TokenBucket, USE_HALF_LIFE};
pub use decide::{
    FleetWant, FleetWants, FoldedTenants, Gate, GateSettings, GateTotals, LaneLimits, LaneRow,
    TenantMetric, TenantMetrics, TenantStats,
};
pub use decisions::DecisionLog;
pub use events::{Event, Record, Subject};
pub use evict::{runaway, runaways, Runaway, TenantLoad};
pub use fair::{FairQueue, Rank};
pub use kills::{KillRow, KillTarget, Kills};
pub use kind::{first_keyword, RequestKind, TxControl};
pub use pass::{
    Cost, Decision, Expired, Granted, Grants, Hint, Lane, Near, Pass, PassFields, Payment, Request,
    Slot, Spent, TicketId,
};
pub use queue::{Ticket, WaitQueue};
pub use refusal::{Refusal, RefusalReason, SQLSTATE_CANCELED, SQLSTATE_RESOURCES};
pub use tenant::{
    parse_duration, TenantConfig, TenantConfigError, TenantTimeouts, WhenOver, DEFAULT_MIN_CHARGE,
};

#[cfg(test)]
mod tests;
