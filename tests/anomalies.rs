//! Unusual minutes against a real PostgreSQL: a lock pile-up (a table locked while clients
//! read it, each read giving up at its lock_timeout) raises one anomaly, with every signal
//! that rose, the statement and tenant behind it and the lock waits the server reading saw,
//! and ends it once the lock is gone; never one anomaly per signal.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::driver::{must_connect, show};
use common::policy::Policed;
use common::read_lossy;

/// Table `t`, read by trustuser, whose reads give up after a second behind a lock (a p99 far
/// above what a busy machine's stalls give the baseline's minutes); trustuser may read every
/// session for the server reading.
const TABLE: &str = "CREATE TABLE t (a int); INSERT INTO t SELECT generate_series(1, 10); \
     GRANT SELECT ON t TO trustuser; GRANT pg_read_all_stats TO trustuser; \
     ALTER ROLE trustuser SET lock_timeout = '1s'";

/// Minutes of one second, judged from five statements on, against at least five normal ones.
const POLICY: &str = "[anomalies]\nminute = \"1s\"\nmin_statements = 5\nbaseline_minutes = 10\n";

const READ: &str = "SELECT count(*) FROM t";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_pile_up_raises_one_anomaly_that_ends_when_the_lock_is_gone() {
    let f = Policed::start(
        TABLE,
        POLICY,
        "default_pool_size = 8\nadmin_users = admin\n",
    );
    let stop = Arc::new(AtomicBool::new(false));
    let mut readers = Vec::new();
    for _ in 0..8 {
        let conn = must_connect(&f.pw.connstr("trustuser", None, "app")).await;
        let stop = stop.clone();
        readers.push(tokio::spawn(async move {
            let (mut ok, mut failed) = (0u64, 0u64);
            while !stop.load(Ordering::Relaxed) {
                match conn.client.simple_query(READ).await {
                    Ok(_) => ok += 1,
                    Err(_) => failed += 1,
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            (ok, failed)
        }));
    }
    // Normal minutes make the baseline.
    tokio::time::sleep(Duration::from_secs(9)).await;
    let admin = must_connect(&f.pw.connstr("admin", None, "pgward")).await;
    assert!(show(&admin.client, "SHOW ANOMALIES").await.is_empty());

    // The pile-up: a session straight on PostgreSQL holds the table for six seconds.
    let owner = must_connect(&f.pg.connstr("postgres")).await;
    owner
        .client
        .batch_execute("BEGIN; LOCK TABLE t")
        .await
        .expect("lock");
    tokio::time::sleep(Duration::from_secs(6)).await;
    owner.client.batch_execute("COMMIT").await.expect("commit");
    tokio::time::sleep(Duration::from_secs(6)).await;
    stop.store(true, Ordering::Relaxed);
    let mut failed = 0;
    for r in readers {
        failed += r.await.expect("reader").1;
    }
    assert!(failed >= 20, "only {failed} reads gave up behind the lock");

    let rows = show(&admin.client, "SHOW ANOMALIES").await;
    assert_eq!(rows.len(), 1, "one incident, one anomaly: {rows:?}");
    let a = &rows[0];
    let col = |c: &str| a[c].clone().unwrap_or_default();
    assert_eq!(col("state"), "ended", "{a:?}");
    let signals = col("signals");
    for s in ["p99", "failures", "slow"] {
        assert!(signals.contains(s), "{s} did not rise: {signals}");
    }
    assert!(col("statements").contains(&format!("[{READ}]")), "{a:?}");
    assert_eq!(col("tenants"), "trustuser");
    assert!(col("lock_waits").parse::<u64>().unwrap() >= 1, "{a:?}");
    assert!(col("minutes").parse::<u64>().unwrap() >= 2, "{a:?}");
    // The log says it once each way.
    let log = read_lossy(&f.pw.log_path);
    assert_eq!(log.matches("anomaly 1 started").count(), 1, "{log}");
    assert_eq!(log.matches("anomaly 1 ended").count(), 1, "{log}");
    assert!(!log.contains("anomaly 2"), "{log}");
}
