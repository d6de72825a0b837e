//! A policy tried on recorded traffic, against a real PostgreSQL: a rogue tenant's full reads
//! next to an innocent tenant's lookups are recorded in the traffic log (no text, no
//! constant); `pgward simulate` with the same policy predicts the rogue's refusals within 10%
//! of what happened, and with a larger budget predicts that it would have been let through.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::driver::{code, must_connect};
use common::gate::{gated, FULL_READ};
use common::{read_lossy, stderr_of, stdout_of};

/// The rogue (trustuser) may run about one full read a second; the innocent (postgres) has
/// no budget.
const POLICY: &str = r#"
[tenants.rogue]
roles = ["trustuser"]
rate = 0.005
burst = 0.01
when_over = "reject"

[traffic]
file = "traffic.jsonl"
"#;

/// The same with room for every read.
const GENEROUS: &str = r#"
[tenants.rogue]
roles = ["trustuser"]
rate = 10
burst = 10
when_over = "reject"
"#;

/// Runs `pgward simulate` and returns its report.
fn simulate(policy: &std::path::Path, traffic: &std::path::Path) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pgward"))
        .arg("simulate")
        .arg("--policy")
        .arg(policy)
        .arg("--traffic")
        .arg(traffic)
        .output()
        .expect("run pgward simulate");
    assert!(out.status.success(), "{}", stderr_of(&out));
    stdout_of(&out)
}

/// The (recorded, simulated) refusals of `tenant` in a report's table.
fn refusals(report: &str, tenant: &str) -> (u64, u64) {
    let line = report
        .lines()
        .find(|l| l.split_whitespace().next() == Some(tenant))
        .unwrap_or_else(|| panic!("no {tenant} in\n{report}"));
    let n: Vec<u64> = line
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    // statements | ran refused delayed waiting | ran refused delayed waiting
    assert_eq!(n.len(), 9, "{line}");
    (n[2], n[6])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulate_predicts_the_rogues_refusals_from_its_recorded_traffic() {
    let f = gated(POLICY, "default_pool_size = 4\n");
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for (user, sql) in [
        ("trustuser", FULL_READ.to_string()),
        ("trustuser", FULL_READ.to_string()),
        ("trustuser", FULL_READ.to_string()),
        (
            "postgres",
            "SELECT id FROM small WHERE v = 'v-secret'".to_string(),
        ),
        (
            "postgres",
            "SELECT id FROM small WHERE v = 'v-secret'".to_string(),
        ),
    ] {
        let conn = must_connect(&f.pw.connstr(user, None, "app")).await;
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            let mut refused = 0u64;
            while !stop.load(Ordering::Relaxed) {
                if let Err(e) = conn.client.simple_query(&sql).await {
                    assert_eq!(code(&e), "53000", "{e}");
                    refused += 1;
                }
                tokio::time::sleep(Duration::from_millis(30)).await;
            }
            refused
        }));
    }
    tokio::time::sleep(Duration::from_secs(8)).await;
    stop.store(true, Ordering::Relaxed);
    let mut live = Vec::new();
    for t in tasks {
        live.push(t.await.expect("client"));
    }
    let rogue_live: u64 = live[..3].iter().sum();
    assert_eq!(live[3..].iter().sum::<u64>(), 0, "the innocent was refused");
    assert!(
        rogue_live >= 50,
        "only {rogue_live} refusals: the test proves little"
    );
    // The log is written out once a second.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let traffic = f.policy.with_file_name("traffic.jsonl");
    let log = read_lossy(&traffic);
    assert!(
        !log.contains("secret") && !log.contains("SELECT"),
        "text in the log"
    );

    let same = simulate(&f.policy, &traffic);
    let (recorded, predicted) = refusals(&same, "rogue");
    assert_eq!(recorded, rogue_live, "{same}");
    let off = predicted.abs_diff(recorded) as f64 / recorded as f64;
    assert!(
        off <= 0.10,
        "predicted {predicted}, live {recorded}:\n{same}"
    );
    assert_eq!(refusals(&same, "postgres"), (0, 0), "{same}");
    assert!(same.contains("cannot know"), "{same}");

    let generous = f.policy.with_file_name("generous.toml");
    std::fs::write(&generous, GENEROUS).expect("write");
    let more = simulate(&generous, &traffic);
    assert_eq!(refusals(&more, "rogue"), (recorded, 0), "{more}");
}

#[test]
fn simulate_says_which_line_of_a_traffic_log_is_broken() {
    let dir = tempfile::tempdir().expect("tempdir");
    let policy = dir.path().join("p.toml");
    std::fs::write(&policy, "").expect("write");
    let traffic = dir.path().join("t.jsonl");
    std::fs::write(&traffic, "\n{\"not\": \"traffic\"}\n").expect("write");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pgward"))
        .args(["simulate", "--policy"])
        .arg(&policy)
        .arg("--traffic")
        .arg(&traffic)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr_of(&out).contains("t.jsonl:2:"),
        "{}",
        stderr_of(&out)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_traffic_log_needs_no_statement_rows_and_a_reload_that_cannot_open_it_changes_nothing()
{
    let policy = "[decisions]\nfile = \"d1.jsonl\"\n\n[traffic]\nfile = \"t1.jsonl\"\n";
    let f = gated(policy, "max_statement_stats = 0\nadmin_users = admin\n");
    let app = must_connect(&f.pw.connstr("postgres", None, "app")).await;
    let lines = |name: &str| read_lossy(&f.policy.with_file_name(name)).lines().count();
    for _ in 0..3 {
        app.client.simple_query("SELECT 1").await.expect("select");
    }
    assert!(
        common::eventually(Duration::from_secs(5), || lines("t1.jsonl") == 3),
        "{} lines",
        lines("t1.jsonl")
    );
    // A reload whose traffic log cannot be opened: refused before anything changed, the
    // decision log included.
    let broken = "[decisions]\nfile = \"d2.jsonl\"\n\n[traffic]\nfile = \"no/such/dir/t2.jsonl\"\n";
    std::fs::write(&f.policy, broken).expect("rewrite the policy");
    let admin = must_connect(&f.pw.connstr("admin", None, "pgward")).await;
    let e = admin.client.simple_query("RELOAD").await.unwrap_err();
    assert!(format!("{e:?}").contains("traffic log"), "{e:?}");
    assert!(!f.policy.with_file_name("d2.jsonl").exists());
    app.client.simple_query("SELECT 1").await.expect("select");
    assert!(common::eventually(Duration::from_secs(5), || lines(
        "t1.jsonl"
    ) == 4));
}
