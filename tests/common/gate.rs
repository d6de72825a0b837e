//! PostgreSQL with a table worth pricing, and pgward with a policy: what the admission gate's
//! tests start from.

use super::policy::Policed;

/// A table whose full read costs a few thousand planner units, and a small indexed one.
pub const SCHEMA: &str = "CREATE TABLE big AS SELECT g AS id, repeat('x', 50) AS pad \
     FROM generate_series(1, 100000) g; ANALYZE big; \
     CREATE TABLE small (id int PRIMARY KEY, v text); \
     INSERT INTO small SELECT g, 'v' || g FROM generate_series(1, 1000) g; ANALYZE small; \
     GRANT SELECT ON big, small TO PUBLIC";

/// The full read the gate's tests price.
pub const FULL_READ: &str = "SELECT count(*) FROM big";

/// A budget that pays for one full read and then owes for a long time.
pub const REJECT_POLICY: &str = r#"
[tenants.acme]
roles = ["trustuser"]
rate = 1
burst = 100
when_over = "reject"
"#;

/// PostgreSQL with [`SCHEMA`], and pgward with `policy` and `settings` (see [`Policed::start`]).
pub fn gated(policy: &str, settings: &str) -> Policed {
    Policed::start(SCHEMA, policy, settings)
}
