//! The admission gate: the policy that decides who gets a server next and whether a pool may
//! grow. It is pure: it takes the time as an argument and never touches a socket, so it is
//! tested under simulated time.
//!
//! Today the policy is PgBouncer's: the pool limits, the reserve pool, and first-come order.
//! Tenants, budgets, priorities and lanes extend [`Ticket`] and [`WaitQueue`] without changing
//! the shape of the checkout.

mod limits;
mod queue;

pub use limits::{Growth, Limits, Usage};
pub use queue::{Ticket, WaitQueue};
