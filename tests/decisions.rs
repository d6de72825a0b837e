//! The decision log against a real PostgreSQL: a refused, a delayed and a killed statement
//! each write one JSON line that names the tenant and the fingerprint and holds no constant
//! of the client's text; SIGHUP opens the file again after logrotate moved it.

mod common;

use std::path::Path;
use std::time::Duration;

use common::driver::{code, must_connect, outcome, show, Conn};
use common::gate::{gated, SCHEMA};
use common::policy::Policed;
use pgward::sql::{Analyzer, Depth, ParseContext};
use serde_json::Value;

/// acme's budget pays for one full read and then owes for minutes; one slot in the fast
/// lane; waits of 200 ms and more are logged.
const POLICY: &str = r#"
[gate]
max_active = 1

[tenants.acme]
roles = ["trustuser"]
rate = 0.00001
burst = 0.001
when_over = "reject"

[[rules]]
rule = "deny_ddl"
when = { roles = ["trustuser"] }

[decisions]
file = "decisions.jsonl"
wait_over = "200ms"
"#;

/// Constants of the client's text that must never reach the log.
const SECRETS: [&str; 3] = ["secret-7351", "secret-4242", "secret-9137"];

fn fingerprint(sql: &str) -> String {
    Analyzer::new(Depth::Shape, 4)
        .analyze(sql.as_bytes(), &ParseContext::server_defaults())
        .fingerprint_hex()
}

fn lines(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    for secret in SECRETS {
        assert!(!text.contains(secret), "a constant in the log: {text}");
    }
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect()
}

async fn app(f: &Policed, user: &str) -> Conn {
    must_connect(&f.pw.connstr(user, None, "app")).await
}

/// Waits until `path` has `n` lines (the log is written as the decision is made, but the
/// client may hear of it first).
async fn wait_for_lines(path: &Path, n: usize) -> Vec<Value> {
    for _ in 0..50 {
        let found = lines(path);
        if found.len() >= n {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    lines(path)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_a_delayed_and_a_killed_statement_each_write_one_line_without_constants() {
    let f = gated(POLICY, "default_pool_size = 4\nadmin_users = admin\n");
    let log = f.policy.parent().unwrap().join("decisions.jsonl");
    assert!(log.exists(), "the log is opened at start");
    assert!(lines(&log).is_empty());

    // Refused: the second full read is over acme's budget.
    let read = "SELECT count(*) FROM big WHERE pad <> 'secret-7351'";
    let acme = app(&f, "trustuser").await;
    assert_eq!(outcome(&acme.client, read).await, "");
    assert_eq!(outcome(&acme.client, read).await, "53000");
    let found = wait_for_lines(&log, 1).await;
    assert_eq!(found.len(), 1, "{found:?}");
    let refused = &found[0];
    assert_eq!(refused["event"], "refused");
    assert_eq!(refused["reason"], "budget");
    assert_eq!(refused["tenant"], "acme");
    assert_eq!(refused["database"], "app");
    assert_eq!(refused["sqlstate"], "53000");
    assert_eq!(refused["fingerprint"], fingerprint(read).as_str());
    assert!(refused["figures"]["owed_s"].as_f64().unwrap() > 0.0);
    assert!(refused["ts"].as_str().unwrap().ends_with('Z'));
    // Refused by the gate and by the rules at once (a SQL-level EXECUTE under transaction
    // pooling, while acme owes, inside a transaction so the rules read it at the message):
    // one refusal, one line.
    acme.client.batch_execute("BEGIN").await.unwrap();
    assert_ne!(outcome(&acme.client, "EXECUTE secret_7351").await, "");
    acme.client.batch_execute("ROLLBACK").await.unwrap();
    let found = wait_for_lines(&log, 2).await;
    assert_eq!(found.len(), 2, "{found:?}");
    assert_eq!(found[1]["reason"], "budget");
    assert_eq!(lines(&log).len(), 2, "one line per refusal");

    // Delayed: the lane's one slot is held by an open transaction for 600 ms.
    let holder = app(&f, "postgres").await;
    holder
        .client
        .batch_execute("BEGIN; SELECT 1")
        .await
        .unwrap();
    let waiter = app(&f, "postgres").await;
    let lookup = "SELECT v FROM small WHERE v = 'secret-4242' OR id = 1";
    let waiting = tokio::spawn(async move {
        let rows = waiter.client.simple_query(lookup).await.map(|r| r.len());
        (waiter, rows)
    });
    tokio::time::sleep(Duration::from_millis(600)).await;
    holder.client.batch_execute("COMMIT").await.unwrap();
    let (_waiter, rows) = waiting.await.unwrap();
    assert!(rows.is_ok(), "{rows:?}");
    let found = wait_for_lines(&log, 3).await;
    assert_eq!(found.len(), 3, "{found:?}");
    let waited = &found[2];
    assert_eq!(waited["event"], "waited");
    assert_eq!(waited["reason"], "slot");
    assert_eq!(waited["tenant"], "postgres");
    assert_eq!(waited["fingerprint"], fingerprint(lookup).as_str());
    let seconds = waited["figures"]["waited_s"].as_f64().unwrap();
    assert!((0.5..5.0).contains(&seconds), "{waited}");

    // Killed: KILL STATEMENT cancels a running statement; the kill is one line.
    let sleeper = app(&f, "postgres").await;
    let sleep = "SELECT pg_sleep(20) WHERE 'secret-9137' <> ''";
    let running = tokio::spawn(async move { sleeper.client.simple_query(sleep).await.err() });
    let fp = fingerprint(sleep);
    f.wait_until_running("pg_sleep").await;
    let admin = must_connect(&f.pw.connstr("admin", None, "pgward")).await;
    let kill = format!("KILL STATEMENT {fp} FOR '1m'");
    assert_eq!(outcome(&admin.client, &kill).await, "");
    let err = running.await.unwrap().expect("the kill cancels it");
    assert_eq!(code(&err), "57014", "{err:?}");
    let found = wait_for_lines(&log, 4).await;
    assert_eq!(found.len(), 4, "{found:?}");
    let killed = &found[3];
    assert_eq!(killed["event"], "killed");
    assert_eq!(killed["reason"], "statement");
    assert_eq!(killed["fingerprint"], fp.as_str());
    assert_eq!(killed["figures"]["running"], 1.0);
    assert_eq!(killed["figures"]["for_s"], 60.0);

    // logrotate moves the file and signals: the next line goes to a new file.
    let rotated = log.with_extension("jsonl.1");
    std::fs::rename(&log, &rotated).unwrap();
    f.pw.reload_and_wait();
    assert!(log.exists(), "SIGHUP opens the log again");
    assert_eq!(outcome(&acme.client, read).await, "53000");
    // A rule's refusal names the rule and the role.
    let ddl = "CREATE TABLE t (c text DEFAULT 'secret-7351')";
    assert_eq!(outcome(&acme.client, ddl).await, "42501");
    let found = wait_for_lines(&log, 2).await;
    assert_eq!(found.len(), 2, "{found:?}");
    assert_eq!(found[0]["event"], "refused");
    assert_eq!(found[1]["event"], "refused");
    assert_eq!(found[1]["reason"], "deny_ddl");
    assert_eq!(found[1]["role"], "trustuser");
    assert_eq!(found[1]["tenant"], "acme");
    assert_eq!(found[1]["sqlstate"], "42501");
    assert_eq!(found[1]["fingerprint"], fingerprint(ddl).as_str());
    // SHOW TENANTS counts the rule's refusal.
    let tenants = show(&admin.client, "SHOW TENANTS").await;
    let acme_row = tenants
        .iter()
        .find(|r| r["tenant"].as_deref() == Some("acme"))
        .expect("acme's row");
    assert_eq!(
        acme_row["refused_rule"].as_deref(),
        Some("1"),
        "{acme_row:?}"
    );
    assert_eq!(lines(&rotated).len(), 4);

    // A SIGHUP whose files are broken still opens the moved log again (and keeps the policy).
    std::fs::rename(&log, &rotated).unwrap();
    f.reload_with("this is not toml [");
    for _ in 0..50 {
        if log.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(log.exists(), "the log is opened again");
    assert_eq!(outcome(&acme.client, read).await, "53000");
    assert_eq!(wait_for_lines(&log, 1).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_log_that_cannot_be_opened_stops_the_start_before_it_binds_and_a_reload_keeps_the_old(
) {
    // At start: pgward refuses to run and says which file.
    let bad = POLICY.replace("decisions.jsonl", "no/such/dir/decisions.jsonl");
    let pg = common::Postgres::start();
    pg.sql(SCHEMA);
    let dir = common::shared_tempdir("pgward-decisions-");
    let policy = dir.path().join("policy.toml");
    std::fs::write(&policy, &bad).unwrap();
    // Another process's socket where this one would listen: it is left alone.
    let port = common::free_port();
    let socket = dir.path().join(format!(".s.PGSQL.{port}"));
    std::fs::write(&socket, "another process's").unwrap();
    let ini = common::Pgward::ini(
        &pg,
        &format!(
            "auth_type = trust\npool_mode = transaction\npolicy_file = {}\n\
             listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir = {}\n",
            policy.display(),
            dir.path().display()
        ),
        "",
    );
    let ini_path = dir.path().join("pgward.ini");
    std::fs::write(&ini_path, ini).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pgward"))
        .arg(&ini_path)
        .output()
        .expect("run pgward");
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("no/such/dir/decisions.jsonl"), "{said}");
    assert!(
        socket.exists(),
        "a failed start binds nothing and removes nothing"
    );
    drop(pg);

    // On reload: the running policy, its log and the hba rules stay.
    let hba_dir = common::shared_tempdir("pgward-hba-");
    let hba = hba_dir.path().join("hba.conf");
    std::fs::write(&hba, "host all all 127.0.0.1/32 trust\n").unwrap();
    let settings = format!("auth_type = hba\nauth_hba_file = {}\n", hba.display());
    let f = gated(POLICY, &settings);
    let log = f.policy.parent().unwrap().join("decisions.jsonl");
    std::fs::write(&hba, "host all all 127.0.0.1/32 reject\n").unwrap();
    let more = POLICY.replace("rate = 0.00001", "rate = 1000");
    f.reload_with(&more.replace("decisions.jsonl", "no/such/dir/decisions.jsonl"));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let acme = app(&f, "trustuser").await;
    let read = "SELECT count(*) FROM big";
    assert_eq!(outcome(&acme.client, read).await, "");
    assert_eq!(
        outcome(&acme.client, read).await,
        "53000",
        "the old budget holds"
    );
    assert_eq!(wait_for_lines(&log, 1).await.len(), 1);
    assert!(f.pw.log().contains("no/such/dir/decisions.jsonl"));
}
