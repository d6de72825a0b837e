//! PostgreSQL with a schema, and pgward in transaction pooling with a policy file: what the
//! tests of the policy's rules and of the admission gate start from.

use std::path::PathBuf;

use tempfile::TempDir;

use super::{shared_tempdir, Pgward, Postgres};

pub struct Policed {
    pub pg: Postgres,
    pub pw: Pgward,
    /// The policy file (tests rewrite it before a reload).
    pub policy: PathBuf,
    _dir: TempDir,
}

impl Policed {
    /// Waits until one statement containing `needle` runs on PostgreSQL (5 s at most).
    pub async fn wait_until_running(&self, needle: &str) {
        let sql = format!(
            "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query LIKE '%{needle}%' AND pid <> pg_backend_pid()"
        );
        for _ in 0..50 {
            if self.pg.sql(&sql).trim() == "1" {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        panic!("{needle} never ran");
    }

    /// PostgreSQL with `schema`, and pgward in transaction mode (trust) with `policy` as its
    /// policy file and `settings` (one `key = value` per line) added to its ini.
    pub fn start(schema: &str, policy: &str, settings: &str) -> Policed {
        Policed::start_with_databases(schema, policy, settings, "")
    }

    /// Like [`Policed::start`], with the extra `[databases]` lines `databases` (see
    /// [`Pgward::ini`]); `{pg}` in them stands for the new server's `host=... port=...`.
    pub fn start_with_databases(
        schema: &str,
        policy: &str,
        settings: &str,
        databases: &str,
    ) -> Policed {
        let pg = Postgres::start();
        pg.sql(schema);
        let dir = shared_tempdir("pgward-policy-");
        let path = dir.path().join("policy.toml");
        std::fs::write(&path, policy).expect("write the policy");
        let settings = format!(
            "auth_type = trust\npool_mode = transaction\n{settings}policy_file = {}\n",
            path.display()
        );
        let databases = databases.replace("{pg}", &format!("host={} port={}", pg.host, pg.port));
        let pw = Pgward::start(&Pgward::ini(&pg, &settings, &databases));
        Policed {
            pg,
            pw,
            policy: path,
            _dir: dir,
        }
    }

    /// Rewrites the policy file and sends SIGHUP.
    pub fn reload_with(&self, policy: &str) {
        std::fs::write(&self.policy, policy).expect("rewrite the policy");
        self.pw.reload();
    }
}
