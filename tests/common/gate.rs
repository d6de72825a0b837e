//! PostgreSQL with a table worth pricing, and pgward with a policy: what the admission gate's
//! tests start from.

use std::path::PathBuf;

use tempfile::TempDir;

use super::{shared_tempdir, Pgward, Postgres};

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

pub struct Gated {
    pub pg: Postgres,
    pub pw: Pgward,
    /// The policy file (tests rewrite it before a reload).
    pub policy: PathBuf,
    _dir: TempDir,
}

impl Gated {
    /// PostgreSQL with [`SCHEMA`], and pgward in transaction mode (trust) with `policy` as its
    /// policy file and `settings` (one `key = value` per line) added to its ini.
    pub fn start(policy: &str, settings: &str) -> Gated {
        let pg = Postgres::start();
        pg.sql(SCHEMA);
        let dir = shared_tempdir("pgward-gate-");
        let path = dir.path().join("policy.toml");
        std::fs::write(&path, policy).expect("write the policy");
        let settings = format!(
            "auth_type = trust\npool_mode = transaction\n{settings}policy_file = {}\n",
            path.display()
        );
        let pw = Pgward::start(&Pgward::ini(&pg, &settings, ""));
        Gated {
            pg,
            pw,
            policy: path,
            _dir: dir,
        }
    }
}
