//! The gate watches the server: the reading of each PostgreSQL server once a second, shown
//! by SHOW READINGS, the lock-queue guard that cancels a DDL statement stuck behind a long
//! transaction with reads queued behind it (55P03), and a reading that cannot connect,
//! which changes nothing for clients.

mod common;

use std::thread;
use std::time::Instant;

use common::policy::Policed;
use common::raw::{describe, error_code, query_message, Raw};
use common::{client_command, eventually, stderr_of, stdout_of, SECOND};

/// Table `t`, owned by trustuser, whose login the reading borrows: it reads every role's
/// sessions (pg_read_all_stats).
const TABLE: &str = "CREATE TABLE t (a int); INSERT INTO t SELECT generate_series(1, 10); \
     ALTER TABLE t OWNER TO trustuser; GRANT pg_read_all_stats TO trustuser";

const SETTINGS: &str = "default_pool_size = 6\nadmin_users = admin\n";

/// pgward with `policy`, table `t`, and the console.
fn start(policy: &str) -> Policed {
    Policed::start(TABLE, policy, SETTINGS)
}

/// A client of pgward's database `app` as trustuser.
fn client(f: &Policed) -> Raw {
    f.pw.client_with(&[("user", "trustuser"), ("database", "app")])
}

/// The rows of `SHOW {what}`, each by column name.
fn show(f: &Policed, what: &str) -> Vec<std::collections::BTreeMap<String, String>> {
    let mut cmd = client_command("psql", None);
    cmd.args(["-X", "-w", "-A", "-F", "|", "-d"])
        .arg(f.pw.connstr("admin", None, "pgward"))
        .args(["-c", &format!("SHOW {what}")]);
    let out = cmd.output().expect("run psql");
    assert!(out.status.success(), "SHOW {what}: {}", stderr_of(&out));
    let text = stdout_of(&out);
    let mut lines = text.lines();
    let columns: Vec<String> = lines
        .next()
        .unwrap_or("")
        .split('|')
        .map(str::to_string)
        .collect();
    lines
        .filter(|l| !l.starts_with('(')) // the "(n rows)" footer
        .map(|l| {
            columns
                .iter()
                .cloned()
                .zip(l.split('|').map(str::to_string))
                .collect()
        })
        .collect()
}

/// The column `name` of SHOW READINGS' only row.
fn reading(f: &Policed, name: &str) -> String {
    show(f, "READINGS")
        .first()
        .and_then(|row| row.get(name).cloned())
        .unwrap_or_default()
}

/// Whether a backend of PostgreSQL runs `like` and waits for a lock.
fn waits_for_lock(f: &Policed, like: &str) -> bool {
    f.pg.sql(&format!(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '{like}'"
    )) != "0"
}

/// A transaction that read `t` and stays open: its lock on `t` holds every ALTER back.
fn open_transaction(f: &Policed) -> Raw {
    let mut holder = f.pg.client();
    let answer = holder.exchange_within(
        &query_message("BEGIN; SELECT count(*) FROM t"),
        3 * SECOND,
        "the long transaction",
    );
    assert_eq!(error_code(&answer), "", "{}", describe(&answer));
    holder
}

#[test]
fn an_alter_behind_a_long_transaction_is_cancelled_once_reads_queue_behind_it() {
    let f = start("[gate]\nlock_wait = \"30s\"\n");
    let _holder = open_transaction(&f);
    let alter = thread::scope(|scope| {
        let migration = scope.spawn(|| {
            let mut c = client(&f);
            let started = Instant::now();
            let answer = c.exchange_within(
                &query_message("ALTER TABLE t ADD COLUMN c int"),
                20 * SECOND,
                "the ALTER",
            );
            (answer, started.elapsed())
        });
        assert!(
            eventually(5 * SECOND, || waits_for_lock(&f, "ALTER TABLE%")),
            "the ALTER does not wait"
        );
        // SHOW ACTIVITY names the client, its tenant and its lock wait.
        assert!(
            eventually(5 * SECOND, || show(&f, "ACTIVITY").iter().any(|r| {
                r["tenant"] == "trustuser"
                    && !r["lock_wait"].is_empty()
                    && !r["blocked_by"].is_empty()
            })),
            "{:?}",
            show(&f, "ACTIVITY")
        );
        // Reads of t now queue behind the ALTER: they run once it is cancelled.
        let queued_at = Instant::now();
        let readers: Vec<_> = (0..3)
            .map(|_| {
                scope.spawn(|| {
                    let mut c = client(&f);
                    let answer = c.exchange_within(
                        &query_message("SELECT count(*) FROM t"),
                        10 * SECOND,
                        "a read queued behind the ALTER",
                    );
                    assert_eq!(error_code(&answer), "", "{}", describe(&answer));
                })
            })
            .collect();
        for r in readers {
            r.join().expect("reader");
        }
        let reads_took = queued_at.elapsed();
        assert!(reads_took < 5 * SECOND, "the reads took {reads_took:?}");
        migration.join().expect("migration")
    });
    let (answer, took) = alter;
    assert_eq!(error_code(&answer), "55P03", "{}", describe(&answer));
    assert!(
        describe(&answer).contains("lock-queue guard"),
        "{}",
        describe(&answer)
    );
    // Well before lock_wait: it was cancelled because the reads queued behind it.
    assert!(took < 15 * SECOND, "the ALTER was cancelled after {took:?}");
    assert_eq!(reading(&f, "guard_cancels"), "1");
    assert_eq!(reading(&f, "state"), "reading");
    // The transaction holding the lock was left alone.
    assert_eq!(
        f.pg.sql("SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction'"),
        "1"
    );
}

#[test]
fn an_alter_waiting_alone_is_cancelled_after_lock_wait() {
    let f = start("[gate]\nlock_wait = \"1s\"\n");
    let _holder = open_transaction(&f);
    let mut c = client(&f);
    let started = Instant::now();
    let answer = c.exchange_within(
        &query_message("ALTER TABLE t ADD COLUMN c int"),
        15 * SECOND,
        "the ALTER",
    );
    let took = started.elapsed();
    assert_eq!(error_code(&answer), "55P03", "{}", describe(&answer));
    // Read once a second: cancelled between one and about three seconds.
    assert!(
        took >= SECOND && took < 5 * SECOND,
        "cancelled after {took:?}"
    );
    // The client's session goes on: the next statement runs.
    let next = c.exchange_within(&query_message("SELECT 1"), 3 * SECOND, "the next statement");
    assert_eq!(error_code(&next), "", "{}", describe(&next));
}

#[test]
fn with_the_guard_off_an_alter_waits_as_it_would_on_postgresql() {
    let f = start("[gate]\nlock_wait = \"off\"\n");
    let mut holder = open_transaction(&f);
    thread::scope(|scope| {
        let migration = scope.spawn(|| {
            let mut c = client(&f);
            c.exchange_within(
                &query_message("ALTER TABLE t ADD COLUMN c int"),
                20 * SECOND,
                "the ALTER",
            )
        });
        assert!(
            eventually(5 * SECOND, || waits_for_lock(&f, "ALTER TABLE%")),
            "the ALTER does not wait"
        );
        thread::sleep(3 * SECOND);
        assert!(
            waits_for_lock(&f, "ALTER TABLE%"),
            "the ALTER stopped waiting"
        );
        let done = holder.exchange_within(&query_message("COMMIT"), 3 * SECOND, "COMMIT");
        assert_eq!(error_code(&done), "", "{}", describe(&done));
        let answer = migration.join().expect("migration");
        assert_eq!(error_code(&answer), "", "{}", describe(&answer));
    });
}

#[test]
fn a_reading_that_cannot_connect_changes_nothing_for_clients() {
    // The reading logs in as the pools do, under its own application_name; this database's
    // connect_query fails for that name alone.
    // (21 is the length of that name.)
    let databases = "watched = {pg} dbname=app connect_query='SELECT 1 / \
         (length(current_setting($$application_name$$)) - 21)'";
    let f =
        Policed::start_with_databases(TABLE, "[gate]\nlock_wait = \"1s\"\n", SETTINGS, databases);
    let _holder = open_transaction(&f);
    let mut c =
        f.pw.client_with(&[("user", "trustuser"), ("database", "watched")]);
    let ok = c.exchange_within(
        &query_message("SELECT count(*) FROM t"),
        3 * SECOND,
        "a read",
    );
    assert_eq!(error_code(&ok), "", "{}", describe(&ok));
    assert!(
        eventually(10 * SECOND, || reading(&f, "state") == "blind"),
        "the reading is not blind: {:?}",
        show(&f, "READINGS")
    );
    assert!(reading(&f, "error").contains("division by zero"));
    // Acting as if nothing happened: no guard, so the ALTER waits for the transaction.
    let answer = c.exchange_within(
        &query_message("SET lock_timeout = '3s'; ALTER TABLE t ADD c int"),
        10 * SECOND,
        "the ALTER",
    );
    assert_eq!(error_code(&answer), "55P03", "{}", describe(&answer));
    assert!(
        !describe(&answer).contains("pgward"),
        "{}",
        describe(&answer)
    );
    let ok = c.exchange_within(
        &query_message("SELECT count(*) FROM t"),
        3 * SECOND,
        "a read",
    );
    assert_eq!(error_code(&ok), "", "{}", describe(&ok));
    assert!(f
        .pw
        .log()
        .contains("server reading failed 3 times in a row"));
}

/// The `settings` of `tenant` in SHOW TENANTS (empty without a row).
fn tenant_settings(f: &Policed, tenant: &str) -> String {
    show(f, "TENANTS")
        .into_iter()
        .find(|r| r["tenant"] == tenant)
        .map(|r| r["settings"].clone())
        .unwrap_or_default()
}

#[test]
fn a_tenant_holding_back_the_vacuum_horizon_runs_one_statement_at_a_time() {
    let policy = "[gate]\nhorizon_max_age = \"2s\"\nhorizon_dead_rows = 500\n";
    let table = "CREATE TABLE t (a int); INSERT INTO t SELECT generate_series(1, 2000); \
         ALTER TABLE t OWNER TO trustuser";
    let f = Policed::start(table, policy, SETTINGS);
    let mut holder = client(&f);
    let answer = holder.exchange_within(
        &query_message("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM t"),
        3 * SECOND,
        "the snapshot",
    );
    assert_eq!(error_code(&answer), "", "{}", describe(&answer));
    assert!(
        eventually(5 * SECOND, || reading(&f, "oldest_xmin_tenant")
            == "trustuser"),
        "{:?}",
        show(&f, "READINGS")
    );
    assert_eq!(tenant_settings(&f, "trustuser"), "");
    // Rows die behind the snapshot (another role, straight to PostgreSQL).
    f.pg.sql("UPDATE t SET a = a + 1");
    assert!(
        eventually(10 * SECOND, || tenant_settings(&f, "trustuser") == "cap=1"),
        "not capped: {:?}",
        show(&f, "READINGS")
    );
    assert_eq!(reading(&f, "horizon_capped"), "trustuser");
    // The tenant's one slot is the holder's: its other statements wait for it.
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    thread::scope(|scope| {
        scope.spawn(|| {
            let mut c = client(&f);
            let answer = c.exchange_within(
                &query_message("SELECT 1"),
                20 * SECOND,
                "a second statement",
            );
            done_tx.send(error_code(&answer)).expect("send");
        });
        assert!(
            done_rx.recv_timeout(2 * SECOND).is_err(),
            "a second statement ran beside the snapshot's holder"
        );
        let answer = holder.exchange_within(&query_message("COMMIT"), 3 * SECOND, "COMMIT");
        assert_eq!(error_code(&answer), "", "{}", describe(&answer));
        let code = done_rx
            .recv_timeout(5 * SECOND)
            .expect("the second statement ran");
        assert_eq!(code, "");
    });
    // Clear for twice horizon_max_age: the cap is lifted.
    assert!(
        eventually(10 * SECOND, || tenant_settings(&f, "trustuser").is_empty()),
        "still capped: {}",
        tenant_settings(&f, "trustuser")
    );
}

/// Row `a = 1` of `t` updated by another role (tenant `postgres`): what it answers.
fn update_hot_row_as_postgres(f: &Policed) -> Vec<common::raw::Message> {
    let mut c =
        f.pw.client_with(&[("user", "postgres"), ("database", "app")]);
    c.exchange_within(
        &query_message("UPDATE t SET a = a + 0 WHERE a = 1"),
        20 * SECOND,
        "the other session's update",
    )
}

/// The `charged` seconds of `tenant` in SHOW TENANTS.
fn charged(f: &Policed, tenant: &str) -> f64 {
    show(f, "TENANTS")
        .iter()
        .find(|r| r["tenant"] == tenant)
        .and_then(|r| r["charged"].parse().ok())
        .unwrap_or(0.0)
}

#[test]
fn the_session_others_wait_for_pays_for_their_wait() {
    // Tenants are roles here: trustuser holds a row lock, postgres waits for it.
    let f = start("[gate]\n");
    let mut holder = client(&f);
    let answer = holder.exchange_within(
        &query_message("BEGIN; UPDATE t SET a = a WHERE a = 1"),
        3 * SECOND,
        "the row lock",
    );
    assert_eq!(error_code(&answer), "", "{}", describe(&answer));
    thread::scope(|scope| {
        let waiter = scope.spawn(|| update_hot_row_as_postgres(&f));
        // The reading sees the wait (and who it waits for) before the 3 s are counted.
        assert!(
            eventually(5 * SECOND, || show(&f, "ACTIVITY")
                .iter()
                .any(|r| r["tenant"] == "postgres" && !r["blocked_by"].is_empty())),
            "the reading does not see the waiter: {:?}",
            show(&f, "ACTIVITY")
        );
        thread::sleep(3 * SECOND);
        let done = holder.exchange_within(&query_message("COMMIT"), 3 * SECOND, "COMMIT");
        assert_eq!(error_code(&done), "", "{}", describe(&done));
        let answer = waiter.join().expect("waiter");
        assert_eq!(error_code(&answer), "", "{}", describe(&answer));
    });
    // About three seconds of the waiter's run moved to the holder's tenant.
    let (holder_paid, waiter_paid) = (charged(&f, "trustuser"), charged(&f, "postgres"));
    assert!(
        holder_paid > 1.5,
        "trustuser {holder_paid}, postgres {waiter_paid}"
    );
    assert!(
        waiter_paid < 1.5,
        "trustuser {holder_paid}, postgres {waiter_paid}"
    );
}

#[test]
fn a_lane_of_one_slot_and_two_sessions_on_one_hot_row_do_not_knot() {
    // The holder of the row lock keeps the lane's only slot to the end of its transaction;
    // the other session waits for the slot in the gate (holding no server, no row lock), so
    // nothing ever waits for a session that waits for it.
    let f = start("[gate]\nmax_active = 1\nqueue_timeout = \"30s\"\n");
    let mut holder = client(&f);
    for sql in ["BEGIN", "UPDATE t SET a = a WHERE a = 1"] {
        let answer = holder.exchange_within(&query_message(sql), 3 * SECOND, sql);
        assert_eq!(error_code(&answer), "", "{sql}: {}", describe(&answer));
    }
    thread::scope(|scope| {
        let waiter = scope.spawn(|| update_hot_row_as_postgres(&f));
        assert!(
            eventually(5 * SECOND, || show(&f, "LANES")
                .iter()
                .any(|r| r["lane"] == "fast" && r["waiting"] == "1")),
            "the other session does not wait for the slot: {:?}",
            show(&f, "LANES")
        );
        // The holder's next statements run at once.
        let started = Instant::now();
        for sql in ["SELECT count(*) FROM t", "COMMIT"] {
            let answer = holder.exchange_within(&query_message(sql), 3 * SECOND, sql);
            assert_eq!(error_code(&answer), "", "{sql}: {}", describe(&answer));
        }
        assert!(started.elapsed() < 2 * SECOND, "{:?}", started.elapsed());
        let answer = waiter.join().expect("waiter");
        assert_eq!(error_code(&answer), "", "{}", describe(&answer));
    });
}

/// The fast lane's row of SHOW LANES.
fn fast_lane(f: &Policed) -> std::collections::BTreeMap<String, String> {
    show(f, "LANES")
        .into_iter()
        .find(|r| r["lane"] == "fast")
        .unwrap_or_default()
}

/// Whether the fast lane's limit is `n`.
fn limit_is(f: &Policed, n: &str) -> bool {
    fast_lane(f).get("limit").is_some_and(|l| l == n)
}

#[test]
fn under_sustained_overload_the_adaptive_limit_falls_to_its_floor_holds_it_and_climbs_back() {
    let f =
        start("[gate]\nadaptive = true\nmax_active = 6\nmin_active = 2\nstanding_wait = \"60s\"\n");
    // A transaction outside pgward holds row a = 1: every update of it through pgward waits.
    let mut holder = f.pg.client();
    let answer = holder.exchange_within(
        &query_message("BEGIN; UPDATE t SET a = a WHERE a = 1"),
        3 * SECOND,
        "the row lock",
    );
    assert_eq!(error_code(&answer), "", "{}", describe(&answer));
    let calm = std::sync::atomic::AtomicBool::new(false);
    thread::scope(|scope| {
        let clients: Vec<_> = (0..6)
            .map(|_| {
                scope.spawn(|| {
                    let mut c = client(&f);
                    let sql = "UPDATE t SET a = a WHERE a = 1";
                    let answer = c.exchange_within(&query_message(sql), 60 * SECOND, sql);
                    assert_eq!(error_code(&answer), "", "{}", describe(&answer));
                    let mut ran = 0;
                    while !calm.load(std::sync::atomic::Ordering::Acquire) {
                        let sql = "SELECT pg_sleep(0.05)";
                        let answer = c.exchange_within(&query_message(sql), 20 * SECOND, sql);
                        assert_eq!(error_code(&answer), "", "{}", describe(&answer));
                        ran += 1;
                    }
                    ran
                })
            })
            .collect();
        // Six sessions wait for a lock, more than a quarter of any limit: it falls a step a
        // second (6, 5, 4, 3, 2) to the floor...
        assert!(
            eventually(15 * SECOND, || limit_is(&f, "2")),
            "the limit does not fall to the floor: {:?} {:?}",
            fast_lane(&f),
            show(&f, "READINGS")
        );
        let lane = fast_lane(&f);
        assert_eq!(lane["ceiling"], "6", "{lane:?}");
        assert!(
            lane["change_reason"].contains("waited for locks"),
            "{lane:?}"
        );
        // ... and holds it while the overload lasts.
        for _ in 0..3 {
            thread::sleep(SECOND);
            assert!(limit_is(&f, "2"), "{:?}", fast_lane(&f));
        }
        let done = holder.exchange_within(&query_message("COMMIT"), 3 * SECOND, "COMMIT");
        assert_eq!(error_code(&done), "", "{}", describe(&done));
        // Calm and full (six clients, short statements, no lock waits): one more a second.
        let climbed = eventually(20 * SECOND, || limit_is(&f, "6"));
        let lane = fast_lane(&f);
        calm.store(true, std::sync::atomic::Ordering::Release);
        let ran: usize = clients.into_iter().map(|c| c.join().expect("client")).sum();
        assert!(climbed, "the limit does not climb back: {lane:?}");
        assert!(
            lane["change_reason"].contains("every slot taken"),
            "{lane:?}"
        );
        assert!(ran > 20, "{ran} statements ran");
    });
}
