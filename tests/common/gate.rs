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

/// A budget in seconds of server time that pays for one full read (a few ms, predicted
/// at more than the 1 ms burst before it has run, and taking longer) and then owes for minutes.
pub const REJECT_POLICY: &str = r#"
[tenants.acme]
roles = ["trustuser"]
rate = 0.00001
burst = 0.001
when_over = "reject"
"#;

/// A budget that pays for the few statements of a test, however slow the machine: under it
/// every statement not yet priced is explained before it runs.
pub const ROOMY_POLICY: &str = r#"
[tenants.acme]
roles = ["trustuser"]
rate = 0.00001
burst = 60
when_over = "reject"
"#;

/// How long one [`FULL_READ`] takes straight on `pg`, as a client sees it (psql's
/// `\timing`: from sending the query to its last answer; the median of five), in seconds.
pub fn full_read_seconds(pg: &super::Postgres) -> f64 {
    let port = pg.port.to_string();
    let mut cmd = super::client_command("psql", None);
    cmd.args(["-X", "-w", "-At", "-h", "127.0.0.1", "-p", &port])
        .args(["-U", "postgres", "-d", "app", "-c", "\\timing on"]);
    for _ in 0..5 {
        cmd.args(["-c", FULL_READ]);
    }
    let out = cmd.output().expect("psql");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut times: Vec<f64> = text
        .lines()
        .filter_map(|l| l.strip_prefix("Time: "))
        .filter_map(|t| t.split_whitespace().next()?.parse::<f64>().ok())
        .map(|ms| ms / 1000.0)
        .collect();
    assert_eq!(times.len(), 5, "psql's timings: {text}");
    times.sort_by(f64::total_cmp);
    times[2]
}

/// PostgreSQL with [`SCHEMA`], and pgward with `policy` and `settings` (see [`Policed::start`]).
pub fn gated(policy: &str, settings: &str) -> Policed {
    Policed::start(SCHEMA, policy, settings)
}
