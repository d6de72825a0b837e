//! Worker threads (`worker_threads` above 1): each client is served on one thread for its
//! whole life, the least busy when it connects; servers move to the thread of the session
//! that checks them out; pgbench, prepared statements and cancels work as on one thread.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::driver::{cancel_a_sleep, must_connect, must_value, show};
use common::{stderr_of, stdout_of, Pgward, Postgres};

/// The body of GET /metrics.
fn scrape(port: u16) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("metrics port");
    write!(s, "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").expect("request");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("response");
    text
}

/// The value of the metric `name` (no labels) in `text`.
fn metric(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// CPU time (clock ticks) each of pgward's worker threads (`pgward-worker-N`) has used.
fn worker_ticks(pid: u32) -> Vec<(String, u64)> {
    let mut rows = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).expect("threads") {
        let dir = task.expect("thread").path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        let comm = comm.trim().to_string();
        if !comm.starts_with("pgward-worker") {
            continue;
        }
        let stat = std::fs::read_to_string(dir.join("stat")).unwrap_or_default();
        // After the command's closing parenthesis: state is field 3, utime 14, stime 15.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map_or("", |(_, rest)| rest)
            .split_whitespace()
            .collect();
        let ticks = |i: usize| fields.get(i - 3).and_then(|v| v.parse::<u64>().ok());
        rows.push((comm, ticks(14).unwrap_or(0) + ticks(15).unwrap_or(0)));
    }
    rows.sort();
    rows
}

/// The clients each worker thread serves, from the metrics' `pgward_worker_clients`.
fn clients_by_worker(metrics_port: u16) -> Vec<(String, u64)> {
    let text = scrape(metrics_port);
    let mut rows: Vec<(String, u64)> = text
        .lines()
        .filter_map(|l| l.strip_prefix("pgward_worker_clients{worker=\""))
        .filter_map(|l| {
            let (worker, rest) = l.split_once("\"} ")?;
            Some((worker.to_string(), rest.trim().parse().ok()?))
        })
        .collect();
    rows.sort();
    rows
}

/// SHOW STATS' total_query_count of database app.
async fn app_queries(console: &tokio_postgres::Client) -> u64 {
    let rows = show(console, "SHOW STATS").await;
    let app = rows
        .iter()
        .find(|r| r["database"].as_deref() == Some("app"))
        .expect("a row for app");
    let count = app["total_query_count"].as_deref().unwrap_or_default();
    count.parse().expect("a count")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_spread_over_the_threads_and_servers_follow_them() {
    let pg = Postgres::start();
    let init = pg.pgbench(&["-i", "-s", "1", "-q"]);
    assert!(init.status.success(), "{}", stderr_of(&init));
    let metrics_port = common::free_port();
    let pw = Pgward::transaction_pool(
        &pg,
        &format!(
            "worker_threads = 3\ndefault_pool_size = 2\nadmin_users = trustuser\n\
             prometheus_listen = 127.0.0.1:{metrics_port}\n"
        ),
    );
    // Six clients that stay: two on each thread.
    let mut held = Vec::new();
    for _ in 0..6 {
        held.push(must_connect(&pw.connstr("trustuser", None, "app")).await);
    }
    let spread = clients_by_worker(metrics_port);
    let expected: Vec<(String, u64)> = (0..3).map(|i| (i.to_string(), 2)).collect();
    assert_eq!(spread, expected, "{}", pw.log());
    // Each runs statements on the two servers, which move between the threads; SHOW STATS
    // counts those of every thread.
    let console = must_connect(&pw.connstr("trustuser", None, "pgbouncer")).await;
    let queries_before = app_queries(&console.client).await;
    for round in 0..5 {
        for (i, c) in held.iter().enumerate() {
            let v = must_value(&c.client, &format!("SELECT '{round}-{i}'")).await;
            assert_eq!(v, format!("{round}-{i}"));
        }
    }
    assert_eq!(app_queries(&console.client).await - queries_before, 30);
    // More clients than servers, from every thread, simple and prepared (pgward's statements
    // prepared on servers that change threads).
    let ticks_before = worker_ticks(pw.pid());
    for mode in ["simple", "prepared"] {
        let out = pw.pgbench(&["-c", "9", "-j", "3", "-T", "2", "-S", "-M", mode]);
        common::pgbench_clean(&out, &format!("-M {mode}"), &pw.log());
    }
    // The clients ran on the worker threads (two besides the daemon's), and the servers moved
    // to them.
    let ticks_after = worker_ticks(pw.pid());
    assert_eq!(ticks_after.len(), 2, "{ticks_after:?}");
    for ((name, before), (_, after)) in ticks_before.iter().zip(&ticks_after) {
        assert!(
            after > before,
            "{name} ran nothing: {ticks_before:?} {ticks_after:?}"
        );
    }
    let moves = metric(&scrape(metrics_port), "pgward_worker_server_moves_total");
    assert!(moves.is_some_and(|n| n > 0), "{moves:?}");
    // A cancel sent on one connection reaches a statement served on another thread.
    let client = cancel_a_sleep(held.pop().expect("a client")).await;
    assert_eq!(must_value(&client, "SELECT 'after'").await, "after");
    drop(client);
    drop(held);
    drop(console);
    // The threads' counts follow clients that leave.
    let gone = common::eventually(Duration::from_secs(5), || {
        clients_by_worker(metrics_port).iter().all(|(_, n)| *n == 0)
    });
    assert!(gone, "{:?}", clients_by_worker(metrics_port));
}

#[test]
fn one_thread_shows_no_worker_counts() {
    let pg = Postgres::start();
    let metrics_port = common::free_port();
    let pw = Pgward::transaction_pool(
        &pg,
        &format!("prometheus_listen = 127.0.0.1:{metrics_port}\n"),
    );
    let out = pw.psql("trustuser", None, "app", "SELECT 1");
    assert_eq!(stdout_of(&out), "1", "{}", stderr_of(&out));
    assert!(!scrape(metrics_port).contains("pgward_worker"));
}
