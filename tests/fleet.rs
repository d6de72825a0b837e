//! Three pgward instances sharing one tenant's budget through a state database on a real
//! PostgreSQL: together they hold the tenant to its one rate; with the store's connection cut,
//! no phase (the lease, the fallback, after it) lets in more than the rate, and admission stops
//! when the fallback ends; a crash of the store's server loses no grant nor the sequence.
//! (A cancel sent to another instance is forwarded to the one that owns the key:
//! tests/cancel_faults.rs.)

mod common;

use std::io::Write;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::driver::{code, must_connect, show};
use common::{shared_tempdir, Pgward, Postgres, HOST};
use tempfile::TempDir;

/// What each client runs: about 50 ms of server time.
const SLEEP: &str = "SELECT pg_sleep(0.05)";

/// The tenant's rate: server-seconds per second, for the whole fleet.
const RATE: f64 = 0.3;

fn policy(lease: &str, fallback: &str) -> String {
    format!(
        "[tenants.acme]\nroles = [\"trustuser\"]\nrate = {RATE}\nburst = {RATE}\n\
         when_over = \"reject\"\n\n[fleet]\nstore = \"state\"\nlease = \"{lease}\"\n\
         fallback = \"{fallback}\"\n"
    )
}

struct Fleet {
    pg: Postgres,
    members: Vec<Pgward>,
    _dir: TempDir,
}

/// Instances numbered `ids` with `policy`, whose state database is reached at `store_port`.
fn start_fleet(pg: Postgres, store_port: u16, policy: &str, ids: &[u32]) -> Fleet {
    start_fleet_as(pg, store_port, "postgres", policy, ids)
}

/// [`start_fleet`], the store reached as `store_user`.
fn start_fleet_as(
    pg: Postgres,
    store_port: u16,
    store_user: &str,
    policy: &str,
    ids: &[u32],
) -> Fleet {
    let dir = shared_tempdir("pgward-fleet-");
    let path = dir.path().join("policy.toml");
    std::fs::write(&path, policy).expect("write the policy");
    let members = ids
        .iter()
        .map(|id| {
            let settings = format!(
                "auth_type = trust\npool_mode = transaction\nadmin_users = admin\n\
                 peer_id = {id}\npolicy_file = {}\n",
                path.display()
            );
            let dbs = format!(
                "state = host={HOST} port={store_port} dbname=postgres user={store_user}\n"
            );
            Pgward::start(&Pgward::ini(&pg, &settings, &dbs))
        })
        .collect();
    Fleet {
        pg,
        members,
        _dir: dir,
    }
}

/// SHOW FLEET on `pw`.
async fn fleet_rows(pw: &Pgward) -> Vec<std::collections::HashMap<String, Option<String>>> {
    let admin = must_connect(&pw.connstr("admin", None, "pgward")).await;
    show(&admin.client, "SHOW FLEET").await
}

/// Waits until every instance holds a lease of the tenant's budget.
async fn leased(f: &Fleet) {
    let deadline = Instant::now() + Duration::from_secs(20);
    for pw in &f.members {
        loop {
            let rows = fleet_rows(pw).await;
            let mine = rows.iter().find(|r| {
                r["this"].as_deref() == Some("yes")
                    && r["resource"].as_deref() == Some("tenant:acme")
            });
            if mine.is_some_and(|r| r["state"].as_deref() == Some("leased")) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "no lease: {rows:?}\n{}",
                pw.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Statements that ran: when each started (seconds from `start`) and how long it took.
type Runs = Arc<Mutex<Vec<(f64, f64)>>>;

/// Six clients of the tenant, two on each instance, running [`SLEEP`] back to back until
/// `stop` (a refusal is 53000: the client waits 50 ms and tries again).
fn drive(
    f: &Fleet,
    start: Instant,
    stop: Arc<AtomicBool>,
) -> (Runs, Vec<tokio::task::JoinHandle<()>>) {
    let runs: Runs = Arc::default();
    let mut tasks = Vec::new();
    for k in 0..6 {
        let connstr = f.members[k % 3].connstr("trustuser", None, "app");
        let (runs, stop) = (runs.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let conn = must_connect(&connstr).await;
            while !stop.load(Ordering::Relaxed) {
                let at = Instant::now();
                match conn.client.simple_query(SLEEP).await {
                    Ok(_) => {
                        let began = at.duration_since(start).as_secs_f64();
                        runs.lock()
                            .unwrap()
                            .push((began, at.elapsed().as_secs_f64()));
                    }
                    Err(e) => {
                        assert_eq!(code(&e), "53000", "{e:?}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        }));
    }
    (runs, tasks)
}

/// Server-seconds the statements that started in `[from, to)` ran.
fn ran(runs: &Runs, from: f64, to: f64) -> f64 {
    runs.lock()
        .unwrap()
        .iter()
        .filter(|(at, _)| (from..to).contains(at))
        .map(|(_, took)| took)
        .sum()
}

async fn until(start: Instant, second: f64) {
    let at = start + Duration::from_secs_f64(second);
    tokio::time::sleep_until(at.into()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_hold_one_tenant_to_one_rate() {
    let pg = Postgres::start();
    let port = pg.port;
    // Two of them started with one number, as in a rolling restart: counted apart.
    let f = start_fleet(pg, port, &policy("10s", "20s"), &[1, 2, 2]);
    leased(&f).await;
    let start = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let (runs, tasks) = drive(&f, start, stop.clone());
    until(start, 25.0).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.expect("client");
    }
    // After the first seconds (the bursts, the leases settling), the fleet admits the rate.
    let per_second = ran(&runs, 5.0, 25.0) / 20.0;
    assert!(
        (per_second - RATE).abs() <= 0.1 * RATE,
        "the fleet ran {per_second} server-seconds a second for a rate of {RATE}"
    );
    // Each instance sees the other two in the store.
    let rows = fleet_rows(&f.members[0]).await;
    let others = rows
        .iter()
        .filter(|r| r["this"].as_deref() == Some("no"))
        .filter(|r| r["resource"].as_deref() == Some("tenant:acme"))
        .count();
    assert_eq!(others, 2, "{rows:?}");
    assert!(rows
        .iter()
        .filter(|r| r["this"].as_deref() == Some("no"))
        .all(|r| r["state"].as_deref() == Some("reporting")));
}

/// A TCP relay to PostgreSQL that can be cut: its connections shut down and new ones closed
/// at once, until mended.
struct Cuttable {
    port: u16,
    cut: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<TcpStream>>>,
}

impl Cuttable {
    fn new(target: u16) -> Cuttable {
        let listener = TcpListener::bind((HOST, 0)).expect("bind the relay");
        let port = listener.local_addr().expect("address").port();
        let cut = Arc::new(AtomicBool::new(false));
        let open: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (c, o) = (cut.clone(), open.clone());
        thread::spawn(move || {
            for inbound in listener.incoming() {
                let Ok(inbound) = inbound else { return };
                if c.load(Ordering::SeqCst) {
                    continue;
                }
                let Ok(outbound) = TcpStream::connect((HOST, target)) else {
                    continue;
                };
                let mut held = o.lock().unwrap();
                for s in [&inbound, &outbound] {
                    held.push(s.try_clone().expect("clone"));
                }
                pipe(&inbound, &outbound);
                pipe(&outbound, &inbound);
            }
        });
        Cuttable { port, cut, open }
    }

    fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        for s in self.open.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    fn mend(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

fn pipe(from: &TcpStream, to: &TcpStream) {
    let (mut from, mut to) = (
        from.try_clone().expect("clone"),
        to.try_clone().expect("clone"),
    );
    thread::spawn(move || {
        let _ = std::io::copy(&mut from, &mut to);
        let _ = to.flush();
        let _ = to.shutdown(Shutdown::Both);
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_store_cut_off_no_phase_lets_in_more_than_the_rate() {
    let pg = Postgres::start();
    let relay = Cuttable::new(pg.port);
    // A lease of 2 s, then a fallback of 3 s.
    let f = start_fleet(pg, relay.port, &policy("2s", "3s"), &[1, 2, 3]);
    leased(&f).await;
    let start = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let (runs, tasks) = drive(&f, start, stop.clone());
    until(start, 6.0).await;
    relay.cut();
    // Each lease was renewed at most once more before the cut: it ends by 8 s, its fallback
    // by 11 s.
    until(start, 14.0).await;
    relay.mend();
    until(start, 20.0).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.expect("client");
    }
    // One statement per instance may start as a share shrinks (the budget's debt model).
    let slack = 3.0 * 0.06;
    for (what, from, to) in [
        ("leased", 2.0, 6.0),
        ("cut, on the lease", 6.0, 8.0),
        ("cut, on the fallback", 8.0, 11.5),
    ] {
        let took = ran(&runs, from, to);
        assert!(
            took <= RATE * (to - from) * 1.1 + slack,
            "{what}: {took} server-seconds in {} s for a rate of {RATE}",
            to - from
        );
    }
    assert!(ran(&runs, 2.0, 6.0) > 0.0, "nothing ran before the cut");
    assert_eq!(
        ran(&runs, 11.5, 14.0),
        0.0,
        "admitted after the fallback ended"
    );
    assert!(
        ran(&runs, 16.0, 20.0) > 0.0,
        "nothing ran once the store was back"
    );
    let rows = fleet_rows(&f.members[0]).await;
    assert!(
        rows.iter().any(|r| r["state"].as_deref() == Some("leased")),
        "{rows:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_of_the_store_loses_no_grant_nor_the_sequence() {
    let pg = Postgres::start();
    let port = pg.port;
    let f = start_fleet(pg, port, &policy("10s", "20s"), &[1, 2, 3]);
    leased(&f).await;
    let state = |sql: &str| f.pg.sql_in("postgres", sql);
    let highest = state("SELECT max(seq) FROM pgward_fleet_grants");
    let highest: i64 = highest.parse().expect("a grant");
    f.pg.crash();
    f.pg.start_server();
    // Every grant an instance may hold is still counted, and the sequence goes on from it.
    let after: i64 = state("SELECT max(seq) FROM pgward_fleet_grants")
        .parse()
        .expect("grants after the crash");
    assert!(
        after >= highest,
        "grants up to {highest} before, {after} after"
    );
    let instances = state("SELECT count(DISTINCT instance) FROM pgward_fleet_grants");
    assert_eq!(instances, "3");
    let next: i64 = state("SELECT next_seq FROM pgward_fleet_sequence")
        .parse()
        .expect("sequence");
    assert!(next > after);
    // The instances come back to the store and renew.
    tokio::time::sleep(Duration::from_secs(3)).await;
    leased(&f).await;
    let renewed: i64 = state("SELECT max(seq) FROM pgward_fleet_grants")
        .parse()
        .expect("grants");
    assert!(renewed > after, "no renewal after the crash");
}

/// A store role that may use the tables but not create any (PostgreSQL 15 gives no one CREATE
/// on `public`) leases once they exist: they are made only where missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_role_that_may_not_create_tables_leases_once_they_exist() {
    let pg = Postgres::start();
    let port = pg.port;
    let first = start_fleet(pg, port, &policy("10s", "20s"), &[1]);
    leased(&first).await;
    let Fleet { pg, members, _dir } = first;
    drop(members);
    pg.sql_in(
        "postgres",
        "GRANT SELECT, INSERT, UPDATE, DELETE ON pgward_fleet_members, pgward_fleet_grants, \
         pgward_fleet_sequence TO trustuser",
    );
    let f = start_fleet_as(pg, port, "trustuser", &policy("10s", "20s"), &[2]);
    leased(&f).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_adds_a_fleet_admits_nothing_shared_before_a_lease() {
    let pg = Postgres::start();
    let dir = shared_tempdir("pgward-fleet-");
    let path = dir.path().join("policy.toml");
    let alone = "[tenants.acme]\nroles = [\"trustuser\"]\nrate = 10\nburst = 10\n\
                 when_over = \"reject\"\n";
    std::fs::write(&path, alone).expect("write the policy");
    // The store is a port nothing listens on: no lease ever comes.
    let nowhere = TcpListener::bind((HOST, 0)).expect("a free port");
    let store_port = nowhere.local_addr().expect("address").port();
    drop(nowhere);
    let settings = format!(
        "auth_type = trust\npool_mode = transaction\nadmin_users = admin\npeer_id = 1\n\
         policy_file = {}\n",
        path.display()
    );
    let dbs = format!("state = host={HOST} port={store_port} dbname=postgres user=postgres\n");
    let pw = Pgward::start(&Pgward::ini(&pg, &settings, &dbs));
    let app = must_connect(&pw.connstr("trustuser", None, "app")).await;
    app.client.simple_query("SELECT 1").await.expect("alone");
    let admin = must_connect(&pw.connstr("admin", None, "pgward")).await;
    for round in 0..5 {
        std::fs::write(&path, format!("{alone}\n[fleet]\nstore = \"state\"\n")).expect("write");
        admin.client.simple_query("RELOAD").await.expect("reload");
        // At once, not from the fleet's next turn on: the budget is shared and has no lease.
        let e = app
            .client
            .simple_query("SELECT 1")
            .await
            .expect_err("admitted before any lease");
        assert_eq!(code(&e), "53000", "round {round}: {e:?}");
        std::fs::write(&path, alone).expect("write");
        admin.client.simple_query("RELOAD").await.expect("reload");
        app.client
            .simple_query("SELECT 1")
            .await
            .expect("alone again");
    }
}
