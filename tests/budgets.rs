//! Budgets in seconds of server time, end to end against a real PostgreSQL: a tenant whose
//! budget pays for about two full reads gets no more than that plus one batch, however the
//! reads are dressed (behind a cheap statement in one text, three in one pipeline, a plan
//! primed by a cheap constant, a DO block, a function, eight connections at once), because
//! whatever runs is charged what it took; and what pgward learned of run times survives a
//! restart.

mod common;

use std::time::Duration;

use common::driver::{code, must_connect, outcome, show};
use common::gate::{gated, FULL_READ};
use common::policy::Policed;
use common::raw::{named_extended_query, sync_message};
use common::Pgward;

/// A budget that pays for about two full reads (`read` seconds each) and pays back almost
/// nothing while a test runs; over it, refused.
fn two_reads(read: f64) -> String {
    format!(
        "[tenants.acme]\nroles = [\"trustuser\"]\nrate = {}\nburst = {}\nwhen_over = \"reject\"\n",
        read / 100.0,
        2.0 * read
    )
}

/// PostgreSQL with the gate's tables (and `setup` run on them), and pgward with a budget for
/// `trustuser` that pays for two runs of `sql` as pgward measures them (run by another tenant
/// first; what a client sees straight on the server is a little more).
async fn start_for(setup: &str, sql: &str) -> Budgeted {
    let f = gated("", "default_pool_size = 10\nadmin_users = admin\n");
    if !setup.is_empty() {
        f.pg.sql(setup);
    }
    let seconds = measured(&f, sql).await;
    f.reload_with(&two_reads(seconds));
    tokio::time::sleep(Duration::from_millis(300)).await;
    Budgeted {
        f,
        seconds,
        since: std::time::Instant::now(),
    }
}

/// pgward with a budget for `trustuser`'s tenant `acme` of two runs of `seconds` each.
struct Budgeted {
    f: Policed,
    seconds: f64,
    since: std::time::Instant,
}

impl std::ops::Deref for Budgeted {
    type Target = Policed;
    fn deref(&self) -> &Policed {
        &self.f
    }
}

impl Budgeted {
    /// After `n` runs of what the budget was measured with ran: each was charged about what
    /// it took (at least a third of what the same work took for another tenant: the machine
    /// may be busier or quieter now), and they started only while the tenant owed nothing:
    /// at most what the budget pays for, at what the runs took, plus one batch.
    async fn paid_for(&self, n: usize, what: &str) {
        assert!(n >= 1, "the first {what} owes nothing");
        let charged = charged(&self.f, "acme").await;
        assert!(
            charged >= 0.3 * self.seconds * n as f64,
            "{n} {what} ran and {charged} s were charged; one took {} s before",
            self.seconds
        );
        let elapsed = self.since.elapsed().as_secs_f64();
        let budget = 2.0 * self.seconds + self.seconds / 100.0 * elapsed;
        // Admission goes by predictions (about what a run takes alone); runs side by side
        // may each take longer than that.
        let each = (charged / n as f64).min(self.seconds);
        let most = (budget / each).ceil() as usize + 1;
        assert!(
            n <= most,
            "{n} {what} ran, {each} s each, for a budget of {budget} s"
        );
    }
}

/// Seconds one run of `sql` takes as pgward charges it: three runs by the role `postgres` (a
/// tenant of its own, with no budget) after one to warm up, from SHOW TENANTS.
async fn measured(f: &Policed, sql: &str) -> f64 {
    let conn = must_connect(&f.pw.connstr("postgres", None, "app")).await;
    // The first run of a session also loads catalogs: warm up first.
    conn.client.simple_query(sql).await.expect("warm-up");
    let before = charged(f, "postgres").await;
    for _ in 0..3 {
        conn.client.simple_query(sql).await.expect("run");
    }
    (charged(f, "postgres").await - before) / 3.0
}

/// Runs `sql` as `trustuser` `tries` times, one after another; how many ran.
async fn ran(f: &Policed, sql: &str, tries: usize) -> usize {
    let conn = must_connect(&f.pw.connstr("trustuser", None, "app")).await;
    let mut ran = 0;
    for _ in 0..tries {
        match conn.client.simple_query(sql).await {
            Ok(_) => ran += 1,
            Err(e) => assert_eq!(code(&e), "53000", "{sql}: {e:?}"),
        }
    }
    ran
}

/// The tests time reads against each other: they run one at a time.
static MACHINE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_hidden_behind_a_cheap_statement_in_one_text_pays_what_it_took() {
    let _alone = MACHINE.lock().await;
    let hidden = format!("SELECT 1; {FULL_READ}");
    let f = start_for("", &hidden).await;
    let n = ran(&f, &hidden, 8).await;
    f.paid_for(n, "multi-statement reads").await;
}

/// A DO block that reads the table.
const DO_READ: &str = "DO $$ BEGIN PERFORM count(*) FROM big; END $$";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_do_block_pays_what_it_took() {
    let _alone = MACHINE.lock().await;
    let f = start_for("", DO_READ).await;
    let n = ran(&f, DO_READ, 8).await;
    f.paid_for(n, "DO blocks").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_function_that_reads_pays_what_it_took() {
    let _alone = MACHINE.lock().await;
    let function = "CREATE FUNCTION big_count() RETURNS bigint LANGUAGE sql AS \
                    'SELECT count(*) FROM big'; GRANT EXECUTE ON FUNCTION big_count() TO PUBLIC";
    let f = start_for(function, "SELECT big_count()").await;
    let n = ran(&f, "SELECT big_count()", 8).await;
    f.paid_for(n, "function calls").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_primed_by_a_cheap_constant_does_not_price_a_full_read() {
    let _alone = MACHINE.lock().await;
    let big = "SELECT count(*) FROM big WHERE id < 2000000";
    // With an index, a small constant reads a few rows through it and a large one all of
    // them.
    let f = start_for("CREATE INDEX big_id ON big (id); ANALYZE big", big).await;
    // The tenant primes the plan of the same statement with cheap constants first.
    let primes = ran(&f, "SELECT count(*) FROM big WHERE id < 2", 1).await;
    assert_eq!(primes, 1);
    ran(&f, "SELECT count(*) FROM big WHERE id < 3", 1).await;
    let n = ran(&f, big, 8).await;
    f.paid_for(n, "reads primed cheap").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_reads_in_one_pipeline_pay_for_three() {
    let _alone = MACHINE.lock().await;
    let f = start_for("", FULL_READ).await;
    let mut ran = 0;
    for _ in 0..4 {
        let mut r = f.pw.client_as("trustuser", "app");
        let mut m = Vec::new();
        for _ in 0..3 {
            m.extend(named_extended_query("", FULL_READ));
        }
        m.extend(sync_message());
        r.send(&m);
        let messages = r
            .until_ready_within(Duration::from_secs(20))
            .expect("ready");
        ran += messages.iter().filter(|m| m.tag == b'D').count();
        let refused = messages.iter().any(|m| m.tag == b'E');
        if refused {
            break;
        }
    }
    f.paid_for(ran, "reads in pipelines").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_connections_starting_the_read_at_once_get_what_the_budget_pays_for() {
    let _alone = MACHINE.lock().await;
    let f = start_for("", FULL_READ).await;
    // The statement has run before (another tenant's): its time is known.
    let postgres = must_connect(&f.pw.connstr("postgres", None, "app")).await;
    postgres.client.simple_query(FULL_READ).await.expect("read");
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let connstr = f.pw.connstr("trustuser", None, "app");
        tasks.push(tokio::spawn(async move {
            let conn = must_connect(&connstr).await;
            match conn.client.simple_query(FULL_READ).await {
                Ok(_) => 1,
                Err(e) => {
                    assert_eq!(code(&e), "53000", "{e:?}");
                    0
                }
            }
        }));
    }
    let mut n = 0;
    for t in tasks {
        n += t.await.expect("task");
    }
    f.paid_for(n, "of eight reads at once").await;
}

/// What pgward learned per plan, from SHOW CALIBRATION: fingerprint and shape -> (microseconds
/// per unit, runs).
async fn factors(pw: &Pgward) -> Vec<(String, f64, i64)> {
    let admin = must_connect(&pw.connstr("admin", None, "pgward")).await;
    show(&admin.client, "SHOW CALIBRATION")
        .await
        .into_iter()
        .filter_map(|row| {
            let get = |c: &str| row.get(c).cloned().flatten();
            let key = format!("{}/{}", get("fingerprint")?, get("shape")?);
            let k: f64 = get("us_per_unit")?.parse().ok()?;
            let runs: i64 = get("runs")?.parse().ok()?;
            Some((key, k, runs))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_was_learned_survives_a_restart() {
    let _alone = MACHINE.lock().await;
    let f = gated("", "admin_users = admin\n");
    let state = f.policy.with_file_name("state.json");
    let ini = Pgward::ini(
        &f.pg,
        &format!(
            "auth_type = trust\npool_mode = transaction\nadmin_users = admin\n\
             policy_file = {}\nstate_file = {}\n",
            f.policy.display(),
            state.display()
        ),
        "",
    );
    let mut pw = Pgward::start(&ini);
    let conn = must_connect(&pw.connstr("trustuser", None, "app")).await;
    for _ in 0..3 {
        conn.client.simple_query(FULL_READ).await.expect("read");
    }
    drop(conn);
    let before = factors(&pw).await;
    assert!(
        before.iter().any(|(_, _, runs)| *runs >= 3),
        "the read was learned: {before:?}"
    );
    pw.signal(libc::SIGTERM);
    pw.wait_exit(Duration::from_secs(10)).expect("pgward stops");
    assert!(state.exists(), "no state file written at shutdown");

    let pw = Pgward::start(&ini);
    let after = factors(&pw).await;
    assert_eq!(after, before, "what was learned came back as it was");
    // A state file that is not ours is a warning, never a failed start.
    drop(pw);
    std::fs::write(&state, "not json").expect("write");
    let pw = Pgward::start(&ini);
    assert!(factors(&pw).await.is_empty());
    assert!(pw.log().contains("state file"), "{}", pw.log());
}

/// pgward with a policy that names `trustuser`'s tenant (a large budget) and a console.
fn learning() -> Policed {
    gated(
        "[tenants.acme]\nroles = [\"trustuser\"]\nrate = 1000\nburst = 1000\n",
        "default_pool_size = 4\nadmin_users = admin\n",
    )
}

/// pgward with a policy whose tenant for `trustuser` has `max_cost = 500`, and a console.
fn cost_ruled() -> Policed {
    gated(
        "[tenants.acme]\nroles = [\"trustuser\"]\nmax_cost = 500\n",
        "admin_users = admin\n",
    )
}

/// SHOW CALIBRATION's rows for statements whose plan shape is known.
async fn learned(f: &Policed) -> Vec<(String, f64, i64)> {
    factors(&f.pw).await
}

/// `tenant`'s `charged` column of SHOW TENANTS.
async fn charged(f: &Policed, tenant: &str) -> f64 {
    let admin = must_connect(&f.pw.connstr("admin", None, "pgward")).await;
    show(&admin.client, "SHOW TENANTS")
        .await
        .into_iter()
        .find(|r| r.get("tenant").cloned().flatten().as_deref() == Some(tenant))
        .and_then(|r| r.get("charged").cloned().flatten())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no charged for {tenant}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_portal_read_a_few_rows_at_a_time_teaches_nothing_and_pays_for_every_part() {
    let _alone = MACHINE.lock().await;
    use common::raw::Batch;
    let f = learning();
    let mut r = f.pw.client_as("trustuser", "app");
    r.send(&Batch::new().query("BEGIN"));
    r.until_ready_within(Duration::from_secs(10))
        .expect("BEGIN");
    let first = Batch::new()
        .parse("", "SELECT * FROM big", &[])
        .bind("", "", &[])
        .execute("", 10)
        .sync();
    r.send(&first);
    let got = r.until_ready_within(Duration::from_secs(10)).expect("rows");
    assert!(
        got.iter().any(|m| m.tag == b's'),
        "the portal stopped with rows left"
    );
    assert!(
        learned(&f).await.is_empty(),
        "ten rows of a full read taught a factor"
    );
    let before = charged(&f, "acme").await;
    // The rest of the portal: no request passes the gate, yet the server works for acme.
    r.send(&Batch::new().execute("", 0).sync());
    let got = r
        .until_ready_within(Duration::from_secs(10))
        .expect("the rest");
    assert!(got.iter().any(|m| m.tag == b'C'), "the portal completed");
    assert!(
        charged(&f, "acme").await > before,
        "the rest of the portal was never charged"
    );
    r.send(&Batch::new().query("COMMIT"));
    r.until_ready_within(Duration::from_secs(10))
        .expect("COMMIT");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_cut_short_by_a_leaving_client_teaches_nothing() {
    let _alone = MACHINE.lock().await;
    let f = learning();
    let mut r = f.pw.client_as("trustuser", "app");
    r.send(&common::raw::query_message("SELECT pg_sleep(1)"));
    std::thread::sleep(Duration::from_millis(300));
    drop(r);
    // The cancel lands and the session ends (within the close grace) before we look.
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        learned(&f).await.is_empty(),
        "a third of a pg_sleep was learned"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_plan_far_from_what_its_run_took_is_dropped_and_teaches_nothing() {
    let _alone = MACHINE.lock().await;
    let f = learning();
    let conn = must_connect(&f.pw.connstr("trustuser", None, "app")).await;
    // Three different constants, one plan: the plan is proved to price any constants.
    for sql in [
        "SELECT pg_sleep(0.001)",
        "SELECT pg_sleep(0.0011)",
        "SELECT pg_sleep(0.0012)",
    ] {
        conn.client.simple_query(sql).await.expect("short");
    }
    let before = learned(&f).await;
    assert_eq!(before.len(), 1, "{before:?}");
    let explained = explains(&f.pw).await;
    // Same fingerprint, the proved plan, five hundred times longer.
    conn.client
        .simple_query("SELECT pg_sleep(0.5)")
        .await
        .expect("long");
    assert_eq!(
        explains(&f.pw).await,
        explained,
        "priced by the cached plan"
    );
    let after = learned(&f).await;
    assert_eq!(after[0].1, before[0].1, "the long run moved the factor");
    assert_eq!(after[0].2, before[0].2, "the long run was learned");
    let flips = console_rows(&f.pw, "SHOW FLIPS").await;
    assert_eq!(flips.len(), 1, "{flips:?}");
    assert_eq!(flips[0]["reason"], "slow_run", "{flips:?}");
    assert!(
        flips[0]["slow_lane_until"].is_empty(),
        "no quarantine without the setting"
    );
    // Its plan is read again next time, and that run is learned.
    conn.client
        .simple_query("SELECT pg_sleep(0.002)")
        .await
        .expect("short again");
    assert_eq!(explains(&f.pw).await, explained + 1);
    assert_eq!(learned(&f).await[0].2, before[0].2 + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declaring_a_cursor_teaches_nothing() {
    let _alone = MACHINE.lock().await;
    let f = learning();
    let conn = must_connect(&f.pw.connstr("trustuser", None, "app")).await;
    conn.client.batch_execute("BEGIN").await.expect("BEGIN");
    conn.client
        .simple_query("DECLARE c CURSOR FOR SELECT * FROM big")
        .await
        .expect("DECLARE");
    conn.client.batch_execute("COMMIT").await.expect("COMMIT");
    assert!(learned(&f).await.is_empty(), "a DECLARE taught a factor");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_work_in_an_idle_transaction_does_not_hold_its_tenant_back() {
    let _alone = MACHINE.lock().await;
    let f = learning();
    let holder = must_connect(&f.pw.connstr("trustuser", None, "app")).await;
    holder.client.batch_execute("BEGIN").await.expect("BEGIN");
    holder
        .client
        .batch_execute("DO $$ BEGIN PERFORM 1; END $$")
        .await
        .expect("DO");
    // The DO block has run; the transaction stays open, idle.
    let other = must_connect(&f.pw.connstr("trustuser", None, "app")).await;
    let read = tokio::time::timeout(Duration::from_secs(3), other.client.simple_query(FULL_READ));
    read.await
        .expect("the tenant's other work waited for an idle transaction")
        .expect("read");
    holder.client.batch_execute("COMMIT").await.expect("COMMIT");
}

/// The rows of a console SHOW, column -> value (NULL as an empty string).
async fn console_rows(pw: &Pgward, sql: &str) -> Vec<std::collections::HashMap<String, String>> {
    let admin = must_connect(&pw.connstr("admin", None, "pgward")).await;
    show(&admin.client, sql)
        .await
        .into_iter()
        .map(|row| {
            row.into_iter()
                .map(|(k, v)| (k, v.unwrap_or_default()))
                .collect()
        })
        .collect()
}

/// EXPLAINs run so far (SHOW PLANS).
async fn explains(pw: &Pgward) -> u64 {
    console_rows(pw, "SHOW PLANS").await[0]["explains"]
        .parse()
        .expect("a count")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ddl_drops_cached_plans_and_a_new_shape_is_a_flip_sent_to_the_slow_lane() {
    let _alone = MACHINE.lock().await;
    let f = gated(
        "[gate]\nflip_quarantine = \"1m\"\n[tenants.acme]\nroles = [\"trustuser\"]\n",
        "default_pool_size = 4\nadmin_users = admin\n",
    );
    let conn = must_connect(&f.pw.connstr("trustuser", None, "app")).await;
    for id in 1..=6 {
        let sql = format!("SELECT v FROM small WHERE id = {id}");
        conn.client.simple_query(&sql).await.expect("lookup");
    }
    let before = explains(&f.pw).await;
    assert!(console_rows(&f.pw, "SHOW FLIPS").await.is_empty());
    // The index goes, through pgward: the cached plan of the lookup is dropped.
    let owner = must_connect(&f.pw.connstr("postgres", None, "app")).await;
    owner
        .client
        .batch_execute("ALTER TABLE small DROP CONSTRAINT small_pkey")
        .await
        .expect("drop the index");
    conn.client
        .simple_query("SELECT v FROM small WHERE id = 7")
        .await
        .expect("lookup without its index");
    assert_eq!(
        explains(&f.pw).await,
        before + 1,
        "the lookup was priced from the plan cached before the DDL"
    );
    let flips = console_rows(&f.pw, "SHOW FLIPS").await;
    assert_eq!(flips.len(), 1, "{flips:?}");
    assert_eq!(flips[0]["reason"], "shape", "{flips:?}");
    assert_ne!(flips[0]["usual_shape"], flips[0]["new_shape"]);
    assert!(!flips[0]["slow_lane_until"].is_empty(), "{flips:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cost_rules_judge_each_statement_of_a_text_before_it_runs() {
    let _alone = MACHINE.lock().await;
    let f = cost_ruled();
    let conn = must_connect(&f.pw.connstr("trustuser", None, "app")).await;
    // The full read hides behind a cheap statement: refused before anything runs.
    assert_eq!(
        outcome(
            &conn.client,
            "INSERT INTO small VALUES (5000, 'x'); SELECT count(*) FROM big"
        )
        .await,
        "54000"
    );
    assert_eq!(
        f.pg.sql("SELECT count(*) FROM small WHERE id = 5000"),
        "0",
        "the cheap statement before the refused one ran"
    );
    assert_eq!(
        outcome(&conn.client, "SELECT 1; SELECT v FROM small WHERE id = 1").await,
        ""
    );
    // What follows a statement that may change its plan cannot be priced before it runs.
    assert_eq!(
        outcome(
            &conn.client,
            "SET enable_indexscan = off; SELECT v FROM small WHERE id = 1"
        )
        .await,
        "54000"
    );
    assert_eq!(
        outcome(&conn.client, "BEGIN; SET LOCAL work_mem = '8MB'; COMMIT").await,
        ""
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_prices_other_constants_only_once_three_gave_it() {
    let _alone = MACHINE.lock().await;
    let f = learning();
    let conn = must_connect(&f.pw.connstr("trustuser", None, "app")).await;
    let lookup = |id: u32| format!("SELECT v FROM small WHERE id = {id}");
    let start = explains(&f.pw).await;
    for id in 1..=3 {
        conn.client.simple_query(&lookup(id)).await.expect("lookup");
    }
    assert_eq!(explains(&f.pw).await, start + 3, "each constant explained");
    conn.client.simple_query(&lookup(1)).await.expect("again");
    for id in 4..=9 {
        conn.client.simple_query(&lookup(id)).await.expect("lookup");
    }
    assert_eq!(
        explains(&f.pw).await,
        start + 3,
        "the proved plan priced the rest"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_of_a_text_that_cannot_be_planned_before_it_runs_is_refused() {
    let _alone = MACHINE.lock().await;
    let f = cost_ruled();
    let conn = must_connect(&f.pw.connstr("trustuser", None, "app")).await;
    // The second statement reads a table the first creates: no EXPLAIN can plan it first.
    assert_eq!(
        outcome(
            &conn.client,
            "SELECT * INTO TEMP copied FROM small; SELECT count(*) FROM copied a, big b"
        )
        .await,
        "54000"
    );
    // In a failed transaction nothing can be planned; after its ROLLBACK the read would run.
    conn.client.batch_execute("BEGIN").await.expect("BEGIN");
    assert_eq!(outcome(&conn.client, "SELECT 1/0").await, "22012");
    // Refused in the failed transaction (PostgreSQL raises the refusal there: 25P02), so
    // neither the ROLLBACK nor the read ran.
    assert_eq!(
        outcome(&conn.client, "ROLLBACK; SELECT count(*) FROM big").await,
        "25P02"
    );
    assert_eq!(outcome(&conn.client, "ROLLBACK").await, "");
    // One statement whose body holds semicolons is one statement.
    assert_eq!(
        outcome(
            &conn.client,
            "CREATE FUNCTION one() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT 1; END"
        )
        .await,
        ""
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn comments_are_no_constants_for_the_plan_cache() {
    let _alone = MACHINE.lock().await;
    let f = learning();
    let conn = must_connect(&f.pw.connstr("trustuser", None, "app")).await;
    let start = explains(&f.pw).await;
    for trace in 1..=3 {
        let sql = format!("SELECT v FROM small WHERE id = 1 /*traceparent='{trace}'*/");
        conn.client.simple_query(&sql).await.expect("lookup");
    }
    // One constant, three comments: one EXPLAIN, and the plan is not proved for others.
    assert_eq!(explains(&f.pw).await, start + 1);
    conn.client
        .simple_query("SELECT v FROM small WHERE id = 2")
        .await
        .expect("lookup");
    assert_eq!(explains(&f.pw).await, start + 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_time_refuses_on_a_learned_prediction_never_on_a_guess() {
    let _alone = MACHINE.lock().await;
    let f = gated(
        "[tenants.acme]\nroles = [\"trustuser\"]\nmax_time = 0.001\n",
        "admin_users = admin\n",
    );
    let conn = must_connect(&f.pw.connstr("trustuser", None, "app")).await;
    // Never run: its prediction is a guess, and a guess refuses nothing.
    conn.client
        .simple_query(FULL_READ)
        .await
        .expect("first read");
    // It took more than a millisecond: now it is predicted to, and refused before it runs.
    let err = conn
        .client
        .simple_query(FULL_READ)
        .await
        .expect_err("over max_time");
    assert_eq!(code(&err), "54000", "{err:?}");
    assert!(format!("{err:?}").contains("max_time"), "{err:?}");
}

/// A run is settled before its server's release waits on anything: while a reset query runs
/// after the transaction, the tenant already owes what its statement took.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_is_settled_before_its_server_is_reset() {
    let _machine = MACHINE.lock().await;
    let f = gated(
        "[tenants.acme]\nroles = [\"trustuser\"]\nrate = 1000\nburst = 1000\n",
        "default_pool_size = 4\nadmin_users = admin\nserver_reset_query = SELECT pg_sleep(2)\n\
         server_reset_query_always = 1\n",
    );
    let conn = must_connect(&f.pw.connstr("trustuser", None, "app")).await;
    let before = charged(&f, "acme").await;
    let run = tokio::spawn(async move {
        conn.client
            .simple_query("SELECT pg_sleep(0.5)")
            .await
            .expect("runs");
    });
    // Past the statement's half second, well inside the two seconds of the reset.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let during = charged(&f, "acme").await;
    assert!(
        during - before >= 0.4,
        "charged {during} s during the reset, {before} s before"
    );
    run.await.expect("the client");
}
