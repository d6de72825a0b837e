//! The gate under simulated time: every test moves a clock by hand, nothing sleeps.

use super::*;
use crate::sql::{Fingerprint, Priority};
use std::sync::Arc;
use std::time::{Duration, Instant};

const UP: &str = "db1";

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

fn gate() -> Gate<u64> {
    Gate::new(
        GateSettings {
            queue_timeout: Some(Duration::from_secs(5)),
            lanes: LaneLimits { fast: 2, slow: 1 },
            jitter: 0.2,
            per_database: None,
            flip_quarantine: None,
            adaptive: None,
            log: true,
        },
        7,
    )
}

fn budget(g: &mut Gate<u64>, tenant: &str, words: &str, now: Instant) {
    g.set_tenant(tenant, words, now).expect("valid words");
}

fn req(tenant: &str, client_id: u64, now: Instant) -> Request<'_> {
    Request {
        client_id,
        tenant,
        priority: Priority::Normal,
        kind: RequestKind::Statement,
        fingerprint: Some(Fingerprint(0xabc)),
        upstream: UP,
        pool: "db1/app",
        pool_size: 100,
        database_cap: 0,
        database: "db1",
        sent_at: now,
        statement_timeout: None,
        deadline: None,
        hint: None,
    }
}

fn admitted(d: Decision) -> Pass {
    match d {
        Decision::Admit(p) => p,
        other => panic!("expected Admit, got {other:?}"),
    }
}

fn refused(d: Decision) -> Refusal {
    match d {
        Decision::Refuse(r) => r,
        other => panic!("expected Refuse, got {other:?}"),
    }
}

fn cost(seconds: f64) -> Cost {
    Cost {
        seconds,
        known: true,
        learned: true,
    }
}

fn balance(g: &Gate<u64>, tenant: &str, now: Instant) -> f64 {
    g.tenant_stats(now)
        .into_iter()
        .find(|s| s.tenant == tenant)
        .and_then(|s| s.balance)
        .expect("a tenant with a budget")
}

fn stats(g: &Gate<u64>, tenant: &str, now: Instant) -> TenantStats {
    g.tenant_stats(now)
        .into_iter()
        .find(|s| s.tenant == tenant)
        .expect("a known tenant")
}

/// Admits, takes a slot at once, spends: what a cache hit with a free slot does.
fn run(g: &mut Gate<u64>, tenant: &str, units: f64, now: Instant) -> Result<(Pass, Slot), Refusal> {
    let mut pass = match g.admit(&req(tenant, 0, now), now) {
        Decision::Admit(p) => p,
        Decision::Refuse(r) => return Err(r),
        Decision::Bypass(_) => panic!("a statement never bypasses"),
    };
    match g.spend(&mut pass, cost(units), now)? {
        Spent::Run { .. } => {}
        other => panic!("expected Run, got {other:?}"),
    }
    let slot = g.try_acquire(&pass, now).expect("a free slot");
    Ok((pass, slot))
}

#[test]
fn six_at_once_let_exactly_one_pass() {
    let t0 = Instant::now();
    let mut g = gate();
    budget(&mut g, "rogue", "rate=1000 burst=2000", t0);
    // All six are admitted (nobody has spent yet), then all six spend at the same instant.
    let mut passes: Vec<Pass> = (0..6)
        .map(|i| admitted(g.admit(&req("rogue", i, t0), t0)))
        .collect();
    let results: Vec<_> = passes
        .iter_mut()
        .map(|p| g.spend(p, cost(5000.0), t0))
        .collect();
    let ran = results
        .iter()
        .filter(|r| matches!(r, Ok(Spent::Run { .. })))
        .count();
    assert_eq!(ran, 1);
    assert!(results
        .iter()
        .skip(1)
        .all(|r| matches!(r, Err(x) if x.sqlstate == "53000")));
    assert_eq!(balance(&g, "rogue", t0), -3000.0);
    assert_eq!(stats(&g, "rogue", t0).refusals[&RefusalReason::Budget], 5);
}

#[test]
fn six_threads_at_once_under_one_lock() {
    use std::sync::{Arc, Barrier, Mutex};
    let t0 = Instant::now();
    let shared = Arc::new(Mutex::new(gate()));
    if let Ok(mut g) = shared.lock() {
        budget(&mut g, "rogue", "rate=1000 burst=2000", t0);
    }
    let barrier = Arc::new(Barrier::new(6));
    let threads: Vec<_> = (0..6)
        .map(|i| {
            let (shared, barrier) = (shared.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                let mut g = shared.lock().expect("not poisoned");
                match g.admit(&req("rogue", i, t0), t0) {
                    Decision::Admit(mut pass) => g.spend(&mut pass, cost(5000.0), t0).is_ok(),
                    _ => false,
                }
            })
        })
        .collect();
    let passed = threads
        .into_iter()
        .map(|t| t.join())
        .filter(|r| matches!(r, Ok(true)))
        .count();
    // The first in the lock runs; the others see its debt, at admit or at spend.
    assert_eq!(passed, 1);
}

#[test]
fn debt_is_paid_back_at_rate() {
    let t0 = Instant::now();
    let mut g = gate();
    budget(&mut g, "a", "rate=100 burst=200", t0);
    let (_, slot) = run(&mut g, "a", 500.0, t0).expect("owes nothing yet");
    g.release(&slot, t0);
    assert_eq!(balance(&g, "a", t0), -300.0);
    assert_eq!(stats(&g, "a", t0).debt, 300.0);
    let early = refused(g.admit(&req("a", 1, t0 + secs(2.9)), t0 + secs(2.9)));
    assert_eq!(early.reason, RefusalReason::Budget);
    let paid = t0 + secs(3.0);
    let (_, slot) = run(&mut g, "a", 1.0, paid).expect("the debt is paid back");
    g.release(&slot, paid);
    // The bucket refills only up to the burst.
    assert_eq!(balance(&g, "a", t0 + secs(1000.0)), 200.0);
}

#[test]
fn work_in_a_pipeline_pays_in_full_whatever_is_owed() {
    let t0 = Instant::now();
    let mut g = gate();
    budget(
        &mut g,
        "a",
        "rate=100 burst=200 min_charge=2 when_over=wait",
        t0,
    );
    let (_, slot) = run(&mut g, "a", 500.0, t0).expect("owes nothing yet");
    // Owing 300, a request already inside an open batch is charged anyway...
    let mut pass = admitted_or_awaiting(g.admit(&req("a", 1, t0), t0));
    assert_eq!(g.force_spend(&mut pass, 50.0, t0), 50.0);
    assert_eq!(g.force_spend(&mut pass, 50.0, t0), 50.0, "charged once");
    // ...and a request that took more than it was charged pays the rest, with no minimum.
    assert_eq!(g.settle("a", 50.0, 50.5, t0), 0.5);
    g.release(&slot, t0);
    assert_eq!(balance(&g, "a", t0), -350.5);
}

/// The pass of an admitted request, whatever its payment state.
fn admitted_or_awaiting(d: Decision) -> Pass {
    match d {
        Decision::Admit(p) => p,
        other => panic!("not admitted: {other:?}"),
    }
}

#[test]
fn min_charge_makes_cheap_statements_count() {
    let t0 = Instant::now();
    let mut g = gate();
    budget(&mut g, "a", "rate=10 burst=10 min_charge=4", t0);
    let (pass, _) = run(&mut g, "a", 0.01, t0).expect("runs");
    assert_eq!(pass.charged(), 4.0);
    assert_eq!(balance(&g, "a", t0), 6.0);
}

#[test]
fn reject_hint_says_when_to_come_back_with_jitter() {
    let t0 = Instant::now();
    let mut g = gate();
    budget(&mut g, "a", "rate=100 burst=0", t0);
    run(&mut g, "a", 200.0, t0).expect("owes nothing yet");
    let r = refused(g.admit(&req("a", 1, t0), t0));
    assert_eq!((r.sqlstate, r.reason), ("53000", RefusalReason::Budget));
    let retry = r.retry_after().expect("a retry time");
    assert!(retry >= secs(2.0) && retry < secs(2.4), "{retry:?}");
    assert!(r
        .hint
        .as_deref()
        .is_some_and(|h| h.starts_with("retry in 2.")));
    assert_eq!(r.detail.as_deref(), Some("200.000 s of server time owed"));
    // Another refusal draws another jitter; the same seed draws the same ones.
    let again = refused(g.admit(&req("a", 2, t0), t0)).retry_after();
    assert_ne!(again, Some(retry));
    let mut twin = gate();
    budget(&mut twin, "a", "rate=100 burst=0", t0);
    run(&mut twin, "a", 200.0, t0).expect("runs");
    assert_eq!(
        refused(twin.admit(&req("a", 1, t0), t0)).retry_after(),
        Some(retry)
    );
}

#[test]
fn refused_or_timed_out_waits_are_refunded() {
    let t0 = Instant::now();
    let mut g = gate();
    budget(&mut g, "a", "rate=100 burst=1000", t0);
    budget(&mut g, "b", "rate=100 burst=1000", t0);
    let _held: Vec<_> = (0..2).map(|_| run(&mut g, "b", 1.0, t0)).collect();
    // A cached plan: spend first, then wait for a slot that never comes.
    let mut pass = admitted(g.admit(&req("a", 1, t0), t0));
    g.spend(&mut pass, cost(300.0), t0).expect("paid");
    assert_eq!(balance(&g, "a", t0), 700.0);
    assert!(g.try_acquire(&pass, t0).is_none());
    g.enqueue(pass, 1, t0);
    assert_eq!(g.next_wake(t0), Some(t0 + secs(5.0)));
    assert!(g.expire(t0 + secs(4.9)).is_empty());
    let ended = g.expire(t0 + secs(5.0));
    assert_eq!(ended.len(), 1);
    assert_eq!(ended[0].refusal.sqlstate, "53000");
    assert_eq!(ended[0].refusal.reason, RefusalReason::QueueTimeout);
    assert_eq!(ended[0].pass.charged(), 0.0);
    assert_eq!(balance(&g, "a", t0 + secs(5.0)), 1000.0);
    // A client that gives up is refunded too.
    let mut pass = admitted(g.admit(&req("a", 2, t0), t0));
    g.spend(&mut pass, cost(300.0), t0).expect("paid");
    let id = pass.id;
    g.enqueue(pass, 2, t0);
    let (pass, waiter) = g.withdraw(id, t0).expect("still queued");
    assert_eq!((pass.charged(), waiter), (0.0, 2));
    assert_eq!(balance(&g, "a", t0), 1000.0);
    assert_eq!(stats(&g, "a", t0).waiting, 0);
}

#[test]
fn the_clock_is_woken_only_for_a_ticket_it_would_sleep_past() {
    let t0 = Instant::now();
    let mut g = gate();
    budget(&mut g, "a", "rate=100 burst=1000", t0);
    budget(&mut g, "b", "rate=100 burst=1000", t0);
    let _held: Vec<_> = (0..2).map(|_| run(&mut g, "b", 1.0, t0)).collect();
    // Every lane full; each ticket's wait ends 5 s after it is queued.
    let queue = |g: &mut Gate<u64>, n: u64, at: Instant| {
        let pass = admitted(g.admit(&req("a", n, at), at));
        g.enqueue(pass, n, at)
    };
    assert!(queue(&mut g, 1, t0), "the clock has not said when it looks");
    g.clock_sleeps(Some(t0 + secs(5.0)));
    assert!(!queue(&mut g, 2, t0), "ends with the clock's next look");
    assert!(!queue(&mut g, 3, t0 + secs(1.0)), "ends after it");
    g.clock_sleeps(Some(t0 + secs(10.0)));
    assert!(
        queue(&mut g, 4, t0 + secs(1.0)),
        "ends before the clock looks"
    );
    g.clock_sleeps(None);
    assert!(
        queue(&mut g, 5, t0 + secs(1.0)),
        "the clock sleeps until woken"
    );
}

/// query_wait_notify: the queue keeps each ticket's moment to be told it is queued, the
/// clock looks then, and each waiter hears it once, unless its wait ended before.
#[test]
fn a_ticket_waiting_past_its_notice_is_told_once() {
    let t0 = Instant::now();
    let mut g = gate();
    let slots = fill(&mut g, "holder", t0);
    let waits = |g: &mut Gate<u64>, n: u64, notify: Option<f64>| {
        let mut pass = admitted(g.admit(&req("a", n, t0), t0));
        pass.notify_at = notify.map(|s| t0 + secs(s));
        let id = pass.id;
        g.enqueue(pass, n, t0);
        id
    };
    g.clock_sleeps(Some(t0 + secs(4.0)));
    waits(&mut g, 1, Some(1.0));
    let gone = waits(&mut g, 2, Some(1.0));
    waits(&mut g, 3, Some(2.0));
    waits(&mut g, 4, None);
    // The clock sleeps past the notice of a ticket queued now: it is woken.
    let mut pass = admitted(g.admit(&req("a", 5, t0), t0));
    pass.notify_at = Some(t0 + secs(3.0));
    assert!(g.enqueue(pass, 5, t0), "woken for the notice");
    assert_eq!(g.next_wake(t0), Some(t0 + secs(1.0)));
    let heard = |g: &mut Gate<u64>, at: f64| {
        let mut told = Vec::new();
        g.notices_due(t0 + secs(at), |w| told.push(*w));
        told
    };
    assert_eq!(heard(&mut g, 0.9), Vec::<u64>::new());
    // A ticket whose wait ended is told nothing.
    assert!(g.withdraw(gone, t0 + secs(0.9)).is_some());
    assert_eq!(heard(&mut g, 1.0), vec![1]);
    assert_eq!(heard(&mut g, 1.5), Vec::<u64>::new(), "once");
    assert_eq!(g.next_wake(t0 + secs(1.5)), Some(t0 + secs(2.0)));
    // A slot handed out takes its ticket's notice with it.
    let mut slots = slots.into_iter();
    g.release(&slots.next().expect("a slot"), t0 + secs(1.5));
    let granted = g.next_waiter(UP, Lane::Fast, t0 + secs(1.5), |_| true);
    assert_eq!(granted.expect("the first in line").waiter, 1);
    g.release(&slots.next().expect("a slot"), t0 + secs(1.5));
    let granted = g.next_waiter(UP, Lane::Fast, t0 + secs(1.5), |_| true);
    assert_eq!(granted.expect("the next in line").waiter, 3);
    let next = g.next_wake(t0 + secs(1.5));
    assert_eq!(
        next,
        Some(t0 + secs(3.0)),
        "the clock looks at no moment of a ticket gone"
    );
    assert_eq!(heard(&mut g, 10.0), vec![5]);
    // Nothing left to tell: the queue's ends are the clock's only moments.
    assert_eq!(g.next_wake(t0 + secs(10.0)), Some(t0 + secs(5.0)));
}

/// A ticket the clock hands a slot in the same turn as its notice comes due is told nothing:
/// it no longer waits. A ticket that waits again (the same pass) is told at its new moment
/// only.
#[test]
fn a_ticket_given_its_slot_in_the_clocks_turn_or_waiting_again_is_told_in_time() {
    let t0 = Instant::now();
    let mut g = gate();
    let slots = fill(&mut g, "holder", t0);
    let mut pass = admitted(g.admit(&req("a", 1, t0), t0));
    pass.notify_at = Some(t0 + secs(1.0));
    let id = pass.id;
    g.enqueue(pass, 1, t0);
    // Withdrawn and queued again, with a later moment.
    let (mut pass, _) = g.withdraw(id, t0 + secs(0.5)).expect("queued");
    pass.notify_at = Some(t0 + secs(1.5));
    g.enqueue(pass, 1, t0 + secs(0.5));
    let mut told = Vec::new();
    g.clock_turn(t0 + secs(1.0), |_| true, |w| told.push(*w));
    assert_eq!(told, Vec::<u64>::new(), "not at the moment it had before");
    g.clock_turn(t0 + secs(1.5), |_| true, |w| told.push(*w));
    assert_eq!(told, vec![1]);
    // A slot comes back (the clock hands it out) as the next ticket's notice comes due.
    let mut pass = admitted(g.admit(&req("a", 2, t0), t0));
    pass.notify_at = Some(t0 + secs(2.0));
    g.enqueue(pass, 2, t0 + secs(1.5));
    let mut slots = slots.into_iter();
    g.release(&slots.next().expect("a slot"), t0 + secs(1.9));
    g.release(&slots.next().expect("a slot"), t0 + secs(1.9));
    told.clear();
    let (expired, granted) = g.clock_turn(t0 + secs(2.0), |_| true, |w| told.push(*w));
    assert!(expired.is_empty());
    let granted: Vec<u64> = granted.iter().map(|g| g.waiter).collect();
    assert_eq!(granted, vec![1, 2]);
    assert_eq!(told, Vec::<u64>::new(), "given its slot: told nothing");
}

#[test]
fn a_release_says_when_an_unpaid_request_held_its_tenant_on_another_upstream() {
    let t0 = Instant::now();
    let mut g = gate();
    budget(&mut g, "a", "rate=100 burst=1000", t0);
    // A slot on UP taken before its price is known: the tenant's next unpaid request waits.
    let first = admitted(g.admit(&req("a", 1, t0), t0));
    let slot = g.try_acquire(&first, t0).expect("a free slot");
    let elsewhere = Request {
        upstream: "db2",
        ..req("a", 2, t0)
    };
    let second = admitted(g.admit(&elsewhere, t0));
    assert!(
        g.try_acquire(&second, t0).is_none(),
        "held by the unpaid first"
    );
    g.enqueue(second, 2, t0);
    assert!(g.waits_elsewhere("a", UP));
    assert!(!g.waits_elsewhere("a", "db2"));
    assert!(g.release(&slot, t0), "its ticket on db2 may go now");
    assert_eq!(g.dispatch(t0, |_| true).len(), 1);
}

#[test]
fn the_clock_is_woken_for_a_free_slot_in_the_other_lane() {
    let t0 = Instant::now();
    let mut g = gate();
    // The fast lane full (2), the slow lane's one slot free with a ticket waiting in it (the
    // slot came back, and nothing handed it over yet).
    let _fast: Vec<_> = (0..2).map(|_| run(&mut g, "b", 1.0, t0)).collect();
    let mut slow = admitted(g.admit(&req("a", 1, t0), t0));
    slow.lane = Lane::Slow;
    let slot = g.try_acquire(&slow, t0).expect("the slow slot");
    let mut waiting = admitted(g.admit(&req("a", 2, t0), t0));
    waiting.lane = Lane::Slow;
    assert!(g.try_acquire(&waiting, t0).is_none());
    g.enqueue(waiting, 2, t0);
    g.release(&slot, t0);
    g.clock_sleeps(Some(t0 + secs(1.0)));
    // A ticket for the full fast lane, whose wait ends after the clock's next look.
    let pass = admitted(g.admit(&req("a", 3, t0), t0));
    assert!(g.try_acquire(&pass, t0).is_none());
    assert!(
        g.enqueue(pass, 3, t0),
        "the slow lane's slot waits to be handed out"
    );
}

#[test]
fn wait_until_the_debt_is_paid_back() {
    let t0 = Instant::now();
    let mut g = gate();
    budget(&mut g, "a", "rate=100 burst=100 when_over=wait", t0);
    let (_, slot) = run(&mut g, "a", 300.0, t0).expect("runs into debt");
    g.release(&slot, t0);
    let pass = admitted(g.admit(&req("a", 1, t0), t0));
    assert_eq!(pass.payment(), Payment::AwaitingPayBack);
    assert!(g.try_acquire(&pass, t0).is_none(), "free slot, but in debt");
    g.clock_sleeps(Some(t0 + secs(60.0)));
    assert!(g.enqueue(pass, 1, t0), "a free slot: the clock looks");
    assert_eq!(g.next_wake(t0), Some(t0 + secs(2.0)));
    assert!(g.dispatch(t0 + secs(1.9), |_| true).is_empty());
    let mut granted = g.dispatch(t0 + secs(2.0), |_| true);
    assert_eq!(granted.len(), 1);
    let g1 = granted.remove(0);
    let mut pass = g1.pass;
    let spent = g.spend(&mut pass, cost(50.0), t0 + secs(2.0));
    assert_eq!(spent, Ok(Spent::Run { charged: 50.0 }));
}

#[test]
fn spend_in_debt_waits_again_when_over_is_wait() {
    let t0 = Instant::now();
    let mut g = gate();
    budget(&mut g, "a", "rate=100 burst=100 when_over=wait", t0);
    let mut first = admitted(g.admit(&req("a", 1, t0), t0));
    let mut second = admitted(g.admit(&req("a", 2, t0), t0));
    assert!(g.spend(&mut first, cost(300.0), t0).is_ok());
    let spent = g.spend(&mut second, cost(10.0), t0);
    assert_eq!(
        spent,
        Ok(Spent::WaitForBudget {
            until: Some(t0 + secs(2.0))
        })
    );
    assert_eq!(second.payment(), Payment::AwaitingPayBack);
}

#[test]
fn over_budget_goes_to_the_slow_lane() {
    let t0 = Instant::now();
    let mut g = gate();
    budget(&mut g, "a", "rate=100 burst=100 when_over=slow", t0);
    // The first statement owes nothing: fast lane, charged into debt.
    let mut first = admitted(g.admit(&req("a", 1, t0), t0));
    let mut late = admitted(g.admit(&req("a", 2, t0), t0));
    g.spend(&mut first, cost(500.0), t0).expect("runs");
    assert_eq!(first.lane, Lane::Fast);
    // Admitted before the debt, priced after it: moved.
    assert_eq!(g.spend(&mut late, cost(10.0), t0), Ok(Spent::MovedToSlow));
    assert_eq!(late.lane, Lane::Slow);
    // Admitted while in debt: straight to the slow lane, where it pays even into more debt.
    let mut slow = admitted(g.admit(&req("a", 3, t0), t0));
    assert_eq!(slow.lane, Lane::Slow);
    assert_eq!(
        g.spend(&mut slow, cost(10.0), t0),
        Ok(Spent::Run { charged: 10.0 })
    );
    let s1 = g
        .try_acquire(&slow, t0)
        .expect("the slow lane has one slot");
    assert_eq!(s1.lane(), Lane::Slow);
    assert!(g.try_acquire(&late, t0).is_none(), "slow lane full");
    g.enqueue(late, 2, t0);
    g.release(&s1, t0);
    let next = g
        .next_waiter(UP, Lane::Slow, t0, |_| true)
        .expect("granted");
    assert_eq!(next.waiter, 2);
}

/// Fills the fast lane with two statements of `holder`; returns their slots.
fn fill(g: &mut Gate<u64>, holder: &str, now: Instant) -> Vec<Slot> {
    (0..2)
        .map(|_| run(g, holder, 1.0, now).expect("runs").1)
        .collect()
}

fn queue(g: &mut Gate<u64>, tenant: &str, priority: Priority, client: u64, now: Instant) {
    let mut r = req(tenant, client, now);
    r.priority = priority;
    let pass = admitted(g.admit(&r, now));
    g.enqueue(pass, client, now);
}

fn order(g: &mut Gate<u64>, mut slots: Vec<Slot>, now: Instant) -> Vec<u64> {
    let mut served = Vec::new();
    while let Some(slot) = slots.pop() {
        g.release(&slot, now);
        if let Some(granted) = g.next_waiter(UP, Lane::Fast, now, |_| true) {
            served.push(granted.waiter);
            slots.push(granted.slot);
        }
    }
    served
}

#[test]
fn priority_classes_go_first() {
    let t0 = Instant::now();
    let mut g = gate();
    let slots = fill(&mut g, "holder", t0);
    queue(&mut g, "a", Priority::BestEffort, 1, t0);
    queue(&mut g, "b", Priority::Normal, 2, t0);
    queue(&mut g, "c", Priority::Critical, 3, t0);
    queue(&mut g, "d", Priority::Normal, 4, t0);
    assert_eq!(order(&mut g, slots, t0), [3, 2, 4, 1]);
}

#[test]
fn least_served_tenant_goes_first_and_fifo_within_a_tenant() {
    let t0 = Instant::now();
    let mut g = gate();
    // The heavy tenant used 10,000 units recently; the light one 10.
    run(&mut g, "heavy", 10_000.0, t0)
        .map(|(_, s)| g.release(&s, t0))
        .expect("runs");
    run(&mut g, "light", 10.0, t0)
        .map(|(_, s)| g.release(&s, t0))
        .expect("runs");
    let slots = fill(&mut g, "holder", t0);
    for client in [1, 2, 3] {
        queue(&mut g, "heavy", Priority::Normal, client, t0);
    }
    for client in [11, 12] {
        queue(&mut g, "light", Priority::Normal, client, t0);
    }
    // The light tenant's tickets, in order, before the heavy one's, in order: not arrival order.
    assert_eq!(order(&mut g, slots, t0), [11, 12, 1, 2, 3]);
}

#[test]
fn recent_use_fades_and_share_weighs() {
    let t0 = Instant::now();
    let mut g = gate();
    budget(&mut g, "big", "share=100", t0);
    run(&mut g, "big", 1000.0, t0)
        .map(|(_, s)| g.release(&s, t0))
        .expect("runs");
    run(&mut g, "small", 50.0, t0)
        .map(|(_, s)| g.release(&s, t0))
        .expect("runs");
    let slots = fill(&mut g, "holder", t0);
    queue(&mut g, "small", Priority::Normal, 1, t0);
    queue(&mut g, "big", Priority::Normal, 2, t0);
    // 1000 / 100 = 10 beats 50 / 1.
    assert_eq!(order(&mut g, slots, t0), [2, 1]);
    let stats = stats(&g, "big", t0 + USE_HALF_LIFE);
    assert!(
        (stats.recent_use - 500.0).abs() < 1e-6,
        "{}",
        stats.recent_use
    );
}

#[test]
fn begin_and_commit_never_wait_for_a_slot() {
    let t0 = Instant::now();
    let mut g = gate();
    budget(&mut g, "a", "rate=10 burst=10", t0);
    let _slots = fill(&mut g, "holder", t0);
    let statement = admitted(g.admit(&req("a", 1, t0), t0));
    assert!(g.try_acquire(&statement, t0).is_none());
    for sql in [
        "BEGIN",
        "commit;",
        "ROLLBACK TO SAVEPOINT s",
        "savepoint s",
        "RELEASE s",
        "END",
    ] {
        let mut r = req("a", 1, t0);
        r.kind = RequestKind::of_sql(sql);
        match g.admit(&r, t0) {
            Decision::Bypass(pass) => assert_eq!(pass.charged(), DEFAULT_MIN_CHARGE, "{sql}"),
            other => panic!("{sql}: {other:?}"),
        }
    }
}

#[test]
fn statement_kinds_from_the_first_keyword() {
    use TxControl::*;
    let kind = RequestKind::of_sql;
    assert_eq!(
        kind("  /* x /* y */ */ -- c\n begin isolation level serializable"),
        RequestKind::Transaction(Begin)
    );
    assert_eq!(kind("START TRANSACTION"), RequestKind::Transaction(Begin));
    assert_eq!(kind("abort"), RequestKind::Transaction(Rollback));
    assert_eq!(
        kind("PREPARE TRANSACTION 'x'"),
        RequestKind::Transaction(Commit)
    );
    assert_eq!(kind("PREPARE q AS SELECT 1"), RequestKind::Statement);
    assert_eq!(kind("BEGIN; DELETE FROM t"), RequestKind::Statement);
    assert_eq!(kind("SELECT 1"), RequestKind::Statement);
    assert_eq!(kind("/* unterminated"), RequestKind::Statement);
    // PostgreSQL's scanner ends a `--` comment at a carriage return too: this is a SELECT.
    assert_eq!(
        kind("--\rSELECT pg_sleep(600) AS\nCOMMIT"),
        RequestKind::Statement
    );
    assert_eq!(kind("-- c\r\nCOMMIT"), RequestKind::Transaction(Commit));
    assert_eq!(kind("\x0c\x0bEND"), RequestKind::Transaction(Commit));
    // Not a blank for PostgreSQL (part of an identifier).
    assert_eq!(kind("\u{a0}COMMIT"), RequestKind::Statement);
    assert!(!RequestKind::Transaction(Commit).killable());
    assert!(RequestKind::Transaction(Begin).killable());
}

#[test]
fn slots_are_held_until_released() {
    let t0 = Instant::now();
    let mut g = gate();
    let slots = fill(&mut g, "a", t0);
    assert_eq!(stats(&g, "a", t0).running, 2);
    let pass = admitted(g.admit(&req("b", 9, t0), t0));
    assert!(g.try_acquire(&pass, t0).is_none());
    g.enqueue(pass, 9, t0);
    // Nothing is handed out while both slots are held, however long it takes.
    assert!(g
        .next_waiter(UP, Lane::Fast, t0 + secs(3.0), |_| true)
        .is_none());
    let mut slots = slots.into_iter();
    g.release(&slots.next().expect("a slot"), t0 + secs(3.0));
    let granted = g
        .next_waiter(UP, Lane::Fast, t0 + secs(3.0), |_| true)
        .expect("the freed slot");
    assert_eq!((granted.waiter, granted.slot.tenant()), (9, "b"));
    assert_eq!(stats(&g, "a", t0).running, 1);
}

#[test]
fn dead_waiters_are_skipped_and_refunded() {
    let t0 = Instant::now();
    let mut g = gate();
    budget(&mut g, "a", "rate=10 burst=100", t0);
    let slots = fill(&mut g, "holder", t0);
    let mut pass = admitted(g.admit(&req("a", 1, t0), t0));
    g.spend(&mut pass, cost(40.0), t0).expect("paid");
    g.enqueue(pass, 1, t0);
    queue(&mut g, "a", Priority::Normal, 2, t0);
    let mut slots = slots.into_iter();
    g.release(&slots.next().expect("a slot"), t0);
    let granted = g
        .next_waiter(UP, Lane::Fast, t0, |w| *w != 1)
        .expect("the live one");
    assert_eq!(granted.waiter, 2);
    assert_eq!(balance(&g, "a", t0), 100.0);
}

#[test]
fn deadlines_end_waits_and_refuse_too_long_statements() {
    let t0 = Instant::now();
    let mut g = gate();
    let _slots = fill(&mut g, "holder", t0);
    let mut r = req("a", 1, t0);
    r.deadline = Some(Duration::from_millis(500));
    r.statement_timeout = Some(Duration::from_secs(2));
    let pass = admitted(g.admit(&r, t0));
    assert_eq!(pass.deadline, Some(t0 + secs(0.5)));
    g.enqueue(pass, 1, t0);
    assert_eq!(g.next_wake(t0), Some(t0 + secs(0.5)));
    let ended = g.expire(t0 + secs(0.5));
    assert_eq!(ended.len(), 1);
    assert_eq!(ended[0].refusal.sqlstate, "57014");
    assert_eq!(ended[0].refusal.reason, RefusalReason::Deadline);
    // Counted from when the statement was sent: already late when it reaches the gate.
    let mut late = req("a", 2, t0);
    late.statement_timeout = Some(Duration::from_millis(100));
    assert_eq!(refused(g.admit(&late, t0 + secs(0.2))).sqlstate, "57014");
    // A statement predicted to take 1 s; only 0.5 s are left.
    let mut r = req("a", 3, t0);
    r.deadline = Some(Duration::from_secs(1));
    let mut pass = admitted(g.admit(&r, t0 + secs(0.5)));
    let guess = Cost {
        seconds: 1.0,
        known: true,
        learned: false,
    };
    let mut guessed = admitted(g.admit(&r, t0 + secs(0.5)));
    assert!(
        g.spend(&mut guessed, guess, t0 + secs(0.5)).is_ok(),
        "a prediction not learned from the statement's own runs refuses nothing"
    );
    let slow = cost(1.0);
    let refusal = g
        .spend(&mut pass, slow, t0 + secs(0.5))
        .expect_err("too slow");
    assert_eq!(
        (refusal.sqlstate, refusal.reason),
        ("57014", RefusalReason::TooSlow)
    );
    let quick = cost(0.1);
    assert!(g.spend(&mut pass, quick, t0 + secs(0.5)).is_ok());
}

#[test]
fn tenant_statement_timeout_is_a_deadline_and_plain_data() {
    let t0 = Instant::now();
    let mut g = gate();
    budget(
        &mut g,
        "a",
        "statement_timeout=2s idle_in_transaction_timeout=1m transaction_timeout=0",
        t0,
    );
    let t = g.timeouts("a");
    assert_eq!(t.statement, Some(Duration::from_secs(2)));
    assert_eq!(t.idle_in_transaction, Some(Duration::from_secs(60)));
    assert_eq!(t.transaction, None);
    let pass = admitted(g.admit(&req("a", 1, t0), t0));
    assert_eq!(pass.deadline, Some(t0 + secs(2.0)));
    assert_eq!(g.timeouts("nobody"), TenantTimeouts::default());
}

#[test]
fn kills_refuse_until_they_expire() {
    let t0 = Instant::now();
    let mut g = gate();
    g.kill(
        KillTarget::Tenant("a".into()),
        Duration::from_secs(600),
        false,
        t0,
    );
    let fp = KillTarget::statement("'0000000000000abc'").expect("hex");
    g.kill(fp.clone(), Duration::from_secs(60), false, t0);
    let r = refused(g.admit(&req("a", 1, t0), t0));
    assert_eq!((r.sqlstate, r.reason), ("53000", RefusalReason::Killed));
    assert_eq!(r.message, "pgward: tenant \"a\" is killed");
    // The statement kill covers every tenant.
    assert!(g.is_killed("b", Some(Fingerprint(0xabc)), t0).is_some());
    assert!(g.is_killed("b", Some(Fingerprint(0xabd)), t0).is_none());
    // A killed tenant can still end its transactions.
    let mut commit = req("a", 1, t0);
    commit.kind = RequestKind::Transaction(TxControl::Commit);
    assert!(matches!(g.admit(&commit, t0), Decision::Bypass(_)));
    let rows = g.kills(t0 + secs(30.0));
    assert_eq!(rows.len(), 2);
    assert_eq!(
        (rows[0].target.clone(), rows[0].remaining),
        (fp, secs(30.0))
    );
    assert!(g
        .is_killed("b", Some(Fingerprint(0xabc)), t0 + secs(60.0))
        .is_none());
    assert_eq!(g.kills(t0 + secs(60.0)).len(), 1);
    assert!(g.unkill(&KillTarget::Tenant("a".into())));
    assert!(!g.unkill(&KillTarget::Tenant("a".into())));
    assert!(matches!(
        g.admit(&req("a", 1, t0), t0 + secs(61.0)),
        Decision::Admit(_)
    ));
    assert_eq!(KillTarget::statement("xyz"), None);
}

#[test]
fn eviction_picks_the_tenant_over_its_share_while_others_wait() {
    let load = |tenant, servers, waiting| TenantLoad {
        tenant,
        servers,
        waiting,
        share: 1.0,
    };
    // Nobody else waits: holding everything is fine.
    assert_eq!(runaway(&[load("rogue", 6, 3)], 8), None);
    let r = runaway(&[load("rogue", 6, 3), load("a", 0, 1), load("b", 2, 0)], 8).expect("rogue");
    assert_eq!((r.tenant.as_str(), r.servers), ("rogue", 6));
    assert!((r.fair - 8.0 / 3.0).abs() < 1e-9);
    // Within the share, rounded up: nobody.
    assert_eq!(runaway(&[load("x", 1, 0), load("y", 0, 1)], 1), None);
    assert_eq!(runaway(&[load("x", 3, 0), load("y", 3, 1)], 6), None);
    // The share is of the servers there are, not only of those in use.
    assert_eq!(runaway(&[load("x", 2, 0), load("y", 0, 1)], 4), None);
    assert!(runaway(&[load("x", 2, 0), load("y", 0, 1)], 2).is_some());
}

#[test]
fn a_runaway_tenant_waits_behind_the_others() {
    let t0 = Instant::now();
    let mut g = gate();
    g.set_lanes(UP, LaneLimits { fast: 4, slow: 1 });
    let slots: Vec<Slot> = (0..4)
        .map(|_| run(&mut g, "rogue", 1.0, t0).expect("runs").1)
        .collect();
    // The innocent tenants have used far more recently, but the rogue holds every slot.
    for (tenant, units, client) in [("innocent", 5000.0, 2), ("other", 6000.0, 3)] {
        let mut paid = admitted(g.admit(&req(tenant, 0, t0), t0));
        g.spend(&mut paid, cost(units), t0).expect("paid");
        queue(&mut g, tenant, Priority::Normal, client, t0);
    }
    queue(&mut g, "rogue", Priority::Normal, 1, t0);
    assert_eq!(
        g.runaways(UP).first().map(|r| r.tenant.as_str()),
        Some("rogue")
    );
    let mut slots = slots.into_iter();
    g.release(&slots.next().expect("a slot"), t0);
    let first = g.next_waiter(UP, Lane::Fast, t0, |_| true).expect("one");
    // The rogue holds 3 of 5 servers (fair: 5/3): it waits behind both.
    assert_eq!(first.waiter, 2);
}

#[test]
fn tenant_max_active_caps_its_slots() {
    let t0 = Instant::now();
    let mut g = gate();
    budget(&mut g, "a", "max_active=1", t0);
    let (_, _slot) = run(&mut g, "a", 1.0, t0).expect("first");
    let pass = admitted(g.admit(&req("a", 1, t0), t0));
    assert!(g.try_acquire(&pass, t0).is_none());
}

#[test]
fn a_cap_holds_a_tenant_below_its_settings_until_lifted() {
    let t0 = Instant::now();
    let mut g = gate();
    budget(&mut g, "a", "max_active=4", t0);
    // Two servers' readers cap it; one lifts its cap.
    g.cap_tenant("a", true, t0);
    g.cap_tenant("a", true, t0);
    assert_eq!(stats(&g, "a", t0).settings, "max_active=4 cap=1");
    let (_, _slot) = run(&mut g, "a", 1.0, t0).expect("first");
    let pass = admitted(g.admit(&req("a", 1, t0), t0));
    assert!(g.try_acquire(&pass, t0).is_none(), "capped at one");
    g.cap_tenant("a", false, t0);
    assert!(
        g.try_acquire(&pass, t0).is_none(),
        "still capped by the other"
    );
    g.cap_tenant("a", false, t0);
    assert!(g.try_acquire(&pass, t0).is_some(), "lifted");
    assert_eq!(stats(&g, "a", t0).settings, "max_active=4");
}

#[test]
fn the_blocker_pays_for_the_wait_of_the_statement_it_blocks() {
    let t0 = Instant::now();
    let mut g = gate();
    budget(&mut g, "holder", "rate=1 burst=10", t0);
    budget(&mut g, "waiter", "rate=1 burst=10", t0);
    // Two seconds of the waiter's statement went to waiting for the holder's lock.
    g.move_charge("waiter", "holder", 2.0, t0);
    let (h, w) = (stats(&g, "holder", t0), stats(&g, "waiter", t0));
    assert_eq!(h.charged, 2.0);
    assert_eq!(h.balance, Some(8.0));
    assert_eq!(
        w.balance,
        Some(10.0),
        "nothing given back before its run is settled"
    );
    // Its statement ends after 3 s: one of them is its own, for the counters and the bucket.
    g.settle("waiter", 0.0, 3.0, t0);
    let w = stats(&g, "waiter", t0);
    assert!((w.charged - 1.0).abs() < 1e-9, "{}", w.charged);
    assert_eq!(
        w.balance,
        Some(9.0),
        "3 s of server time paid once: 2 by the holder"
    );
    // An over-predicted statement uses its credit up too: none is left for the next.
    g.move_charge("waiter", "holder", 1.0, t0);
    g.settle("waiter", 2.0, 1.5, t0);
    let before = stats(&g, "waiter", t0).charged;
    g.settle("waiter", 0.0, 1.0, t0);
    assert!((stats(&g, "waiter", t0).charged - before - 1.0).abs() < 1e-9);
    // Nothing moves to itself, nor a count that is not a number of seconds.
    g.move_charge("holder", "holder", 5.0, t0);
    g.move_charge("waiter", "holder", f64::NAN, t0);
    assert_eq!(stats(&g, "holder", t0).charged, 3.0);
}

#[test]
fn set_tenant_words() {
    let t0 = Instant::now();
    let mut g = gate();
    budget(
        &mut g,
        "a",
        "rate=50000 burst=200000 max_active=4 priority=critical",
        t0,
    );
    let row = stats(&g, "a", t0);
    assert_eq!(
        row.settings,
        "rate=50000 burst=200000 max_active=4 priority=critical"
    );
    assert_eq!(row.balance, Some(200_000.0));
    // Only the keys given change; a lower burst clamps the balance.
    budget(&mut g, "a", "burst=1000", t0);
    assert_eq!(stats(&g, "a", t0).balance, Some(1000.0));
    assert!(stats(&g, "a", t0).settings.contains("rate=50000"));
    let p = admitted(g.admit(&req("a", 1, t0), t0));
    assert_eq!(p.priority, Priority::Critical);
    for bad in [
        "rate=-1",
        "rate",
        "colour=red",
        "when_over=later",
        "priority=top",
        "statement_timeout=5x",
        "statement_timeout=2147484s",
        "transaction_timeout=200000000000000d",
    ] {
        assert!(g.set_tenant("a", bad, t0).is_err(), "{bad}");
    }
    assert!(g
        .set_tenant("a", "statement_timeout=2147483647", t0)
        .is_ok());
    assert!(g.set_tenant("a", "statement_timeout=0", t0).is_ok());
    assert!(stats(&g, "a", t0).settings.contains("burst=1000"));
    assert_eq!(parse_duration("'10m'"), Some(Duration::from_secs(600)));
    assert_eq!(parse_duration("250"), Some(Duration::from_millis(250)));
    assert_eq!(parse_duration("1h"), Some(Duration::from_secs(3600)));
}

#[test]
fn idle_unconfigured_tenants_are_forgotten() {
    let t0 = Instant::now();
    let mut g = gate();
    budget(&mut g, "kept", "rate=1", t0);
    run(&mut g, "passing", 1.0, t0)
        .map(|(_, s)| g.release(&s, t0))
        .expect("runs");
    g.forget_idle(t0 + secs(600.0));
    let names: Vec<String> = g.tenant_stats(t0).into_iter().map(|s| s.tenant).collect();
    assert_eq!(names, ["kept"]);
}

#[test]
fn the_servers_of_the_pools_cap_the_slots_of_an_upstream() {
    let t0 = Instant::now();
    let mut g = gate();
    g.set_all_lanes(LaneLimits {
        fast: usize::MAX,
        slow: 1,
    });
    // Two pools onto the upstream, two servers each: four slots in all, whatever the lane.
    let mut r = req("a", 1, t0);
    r.pool_size = 2;
    let mut slots = Vec::new();
    for pool in ["db1/app", "db2/app"] {
        r.pool = pool;
        for _ in 0..2 {
            let pass = admitted(g.admit(&r, t0));
            slots.push(g.try_acquire(&pass, t0).expect("a slot"));
        }
    }
    let pass = admitted(g.admit(&r, t0));
    assert!(g.try_acquire(&pass, t0).is_none(), "a fifth slot");
    let mut slow = admitted(g.admit(&r, t0));
    slow.lane = Lane::Slow;
    assert!(g.try_acquire(&slow, t0).is_none(), "the slow lane too");
    let row = g
        .lanes()
        .into_iter()
        .find(|l| l.lane == Lane::Fast)
        .expect("a fast lane");
    assert_eq!((row.limit, row.running), (4, 4));
    g.release(&slots.pop().expect("a slot"), t0);
    assert!(g.try_acquire(&pass, t0).is_some());
}

/// A gate whose upstream has eight fast slots, every one held by the tenant `rogue`.
fn rogue_holds_eight(t0: Instant) -> (Gate<u64>, Vec<Slot>) {
    let mut g = gate();
    g.set_lanes(UP, LaneLimits { fast: 8, slow: 0 });
    let slots = (0..8)
        .map(|_| run(&mut g, "rogue", 1.0, t0).expect("runs").1)
        .collect();
    (g, slots)
}

/// Queues a statement of `tenant`; its ticket.
fn queued(g: &mut Gate<u64>, tenant: &str, client: u64, now: Instant) -> TicketId {
    let pass = admitted(g.admit(&req(tenant, client, now), now));
    let id = pass.id;
    g.enqueue(pass, client, now);
    id
}

#[test]
fn eviction_closes_the_excess_once_and_a_few_a_second() {
    let t0 = Instant::now();
    let (mut g, _rogue) = rogue_holds_eight(t0);
    let first = queued(&mut g, "innocent", 1, t0);
    // Fair part 4 of 8: an excess of 4, closed at once (a burst of 4).
    let rogue = |n| vec![("rogue".to_string(), n)];
    assert_eq!(g.evictions(UP, t0), rogue(4));
    // Told once: more waiters do not close more.
    let second = queued(&mut g, "innocent", 2, t0);
    assert_eq!(g.evictions(UP, t0), []);
    // The pressure ends; the next starts anew, within the rate: two a second.
    g.withdraw(first, t0);
    g.withdraw(second, t0);
    queued(&mut g, "innocent", 3, t0);
    assert_eq!(g.evictions(UP, t0), []);
    assert_eq!(g.evictions(UP, t0 + secs(1.0)), rogue(2));
    assert_eq!(g.evictions(UP, t0 + secs(2.0)), rogue(2));
    assert_eq!(g.evictions(UP, t0 + secs(9.0)), []);
}

#[test]
fn a_kill_refuses_what_waits_unless_soft() {
    let t0 = Instant::now();
    let mut g = gate();
    let _slots = fill(&mut g, "holder", t0);
    queue(&mut g, "a", Priority::Normal, 1, t0);
    queue(&mut g, "b", Priority::Normal, 2, t0);
    let soft = g.kill(
        KillTarget::Tenant("b".into()),
        Duration::from_secs(60),
        true,
        t0,
    );
    assert!(soft.is_empty());
    let hard = g.kill(
        KillTarget::Tenant("a".into()),
        Duration::from_secs(60),
        false,
        t0,
    );
    let refused: Vec<(u64, &str)> = hard
        .iter()
        .map(|e| (e.waiter, e.refusal.sqlstate))
        .collect();
    assert_eq!(refused, [(1, "53000")]);
    assert_eq!(stats(&g, "a", t0).waiting, 0);
    assert_eq!(stats(&g, "b", t0).waiting, 1);
    // A statement kill stops waiting tickets with that fingerprint, of any tenant.
    let hard = g.kill(
        KillTarget::Statement(Fingerprint(0xabc)),
        Duration::from_secs(60),
        false,
        t0,
    );
    assert_eq!(hard.len(), 1);
    assert!(!g.has_waiters());
}

#[test]
fn a_reload_resets_tenants_it_no_longer_names() {
    let t0 = Instant::now();
    let mut g = gate();
    budget(&mut g, "kept", "rate=5", t0);
    budget(&mut g, "gone", "rate=5 statement_timeout=1s", t0);
    g.reset_others(&["kept"].into_iter().collect());
    assert!(stats(&g, "kept", t0).settings.contains("rate=5"));
    let gone = stats(&g, "gone", t0);
    assert_eq!((gone.settings.as_str(), gone.balance), ("", None));
    assert_eq!(g.timeouts("gone"), TenantTimeouts::default());
}

#[test]
fn waits_end_in_order_of_their_deadlines() {
    let t0 = Instant::now();
    let mut g = gate();
    let _slots = fill(&mut g, "holder", t0);
    for (client, deadline) in [(1, 3.0), (2, 1.0), (3, 2.0)] {
        let mut r = req("a", client, t0);
        r.deadline = Some(secs(deadline));
        let pass = admitted(g.admit(&r, t0));
        g.enqueue(pass, client, t0);
    }
    assert_eq!(g.next_wake(t0), Some(t0 + secs(1.0)));
    let ended: Vec<u64> = g.expire(t0 + secs(2.5)).iter().map(|e| e.waiter).collect();
    assert_eq!(ended, [2, 3]);
    assert_eq!(g.next_wake(t0), Some(t0 + secs(3.0)));
}

#[test]
fn a_database_cap_holds_beside_the_lanes() {
    let t0 = Instant::now();
    let mut g: Gate<u64> = Gate::new(
        GateSettings {
            queue_timeout: None,
            lanes: LaneLimits { fast: 4, slow: 1 },
            jitter: 0.0,
            per_database: Some(1),
            flip_quarantine: None,
            adaptive: None,
            log: false,
        },
        7,
    );
    let one = admitted(g.admit(&req("a", 1, t0), t0));
    let _held = g.try_acquire(&one, t0).expect("the database's one slot");
    let two = admitted(g.admit(&req("a", 2, t0), t0));
    assert!(g.try_acquire(&two, t0).is_none(), "a second slot for db1");
    let mut r = req("a", 3, t0);
    r.database = "db2";
    r.pool = "db2/app";
    let other = admitted(g.admit(&r, t0));
    assert!(g.try_acquire(&other, t0).is_some(), "db2 has its own cap");
}

#[test]
fn a_database_cap_shared_by_its_pools_bounds_the_slots() {
    let t0 = Instant::now();
    let mut g = gate();
    g.set_all_lanes(LaneLimits {
        fast: usize::MAX,
        slow: 1,
    });
    // Two users' pools of one database, 20 servers each, within max_db_connections = 20.
    for pool in ["db1/alice", "db1/bob"] {
        let mut r = req("a", 1, t0);
        (r.pool, r.pool_size, r.database_cap) = (pool, 20, 20);
        g.admit(&r, t0);
    }
    let fast = g.lanes().into_iter().find(|l| l.lane == Lane::Fast);
    assert_eq!(fast.map(|l| l.limit), Some(20));
}

#[test]
fn a_release_says_when_the_tenant_waits_on_another_upstream() {
    let t0 = Instant::now();
    let mut g = gate();
    budget(&mut g, "a", "max_active=1", t0);
    let (_, slot) = run(&mut g, "a", 1.0, t0).expect("runs");
    let mut r = req("a", 2, t0);
    r.upstream = "other:5432";
    let pass = admitted(g.admit(&r, t0));
    assert!(g.try_acquire(&pass, t0).is_none(), "its max_active is full");
    g.enqueue(pass, 2, t0);
    assert!(g.release(&slot, t0), "the other upstream must be looked at");
    let granted = g.dispatch(t0, |_| true);
    assert_eq!(granted.iter().map(|x| x.waiter).collect::<Vec<_>>(), [2]);
}

#[test]
fn an_eviction_that_found_nothing_to_close_is_not_counted() {
    let t0 = Instant::now();
    let (mut g, _rogue) = rogue_holds_eight(t0);
    queued(&mut g, "innocent", 1, t0);
    assert_eq!(g.evictions(UP, t0), [("rogue".to_string(), 4)]);
    // Only one idle server was there to close: the other three are still owed.
    g.evicted_fewer(UP, "rogue", 4, 1);
    queued(&mut g, "innocent", 2, t0);
    assert_eq!(g.evictions(UP, t0), [("rogue".to_string(), 3)]);
}

#[test]
fn a_budgeted_tenant_has_one_unpaid_request_in_a_slot_at_a_time() {
    let t0 = Instant::now();
    let mut g = gate();
    g.set_lanes(UP, LaneLimits { fast: 8, slow: 1 });
    budget(&mut g, "rogue", "rate=1 burst=100 when_over=wait", t0);
    let mut first = admitted(g.admit(&req("rogue", 1, t0), t0));
    let slot = g.try_acquire(&first, t0).expect("a slot to be priced in");
    // Its other requests do not take slots (and servers) to learn, one by one, that it owes.
    let second = admitted(g.admit(&req("rogue", 2, t0), t0));
    assert!(g.try_acquire(&second, t0).is_none());
    g.enqueue(second, 2, t0);
    // Another tenant is not held back.
    let other = admitted(g.admit(&req("other", 3, t0), t0));
    assert!(g.try_acquire(&other, t0).is_some());
    // Priced and charged into debt: the next may take a slot, and learns it owes.
    g.spend(&mut first, cost(500.0), t0).expect("runs");
    let next = g
        .next_waiter(UP, Lane::Fast, t0, |_| true)
        .expect("the next unpaid request");
    assert_eq!(next.waiter, 2);
    g.release(&slot, t0);
}

#[test]
fn settling_charges_what_ran_and_gives_back_within_the_burst() {
    let t0 = Instant::now();
    let mut g = gate();
    budget(&mut g, "a", "rate=0.5 burst=2 min_charge=0.001", t0);
    let (mut pass, slot) = run(&mut g, "a", 0.1, t0).expect("owes nothing");
    assert_eq!(pass.charged(), 0.1);
    // Predicted 0.1 s, took 1.5 s: the rest is charged, into debt if need be.
    assert!((g.settle("a", pass.charged(), 1.5, t0) - 1.4).abs() < 1e-12);
    assert!((balance(&g, "a", t0) - 0.5).abs() < 1e-12);
    assert!((stats(&g, "a", t0).charged - 1.5).abs() < 1e-12);
    // Predicted 1 s, took 0.25 s: 0.75 s back, never above the burst.
    assert!((g.settle("a", 1.0, 0.25, t0) + 0.75).abs() < 1e-12);
    assert!((balance(&g, "a", t0) - 1.25).abs() < 1e-12);
    g.settle("a", 10.0, 0.0, t0);
    assert_eq!(balance(&g, "a", t0), 2.0);
    // A run that went far over its prediction leaves the tenant owing: the next waits.
    g.settle("a", 0.0, 5.0, t0);
    assert!(g.refund(&mut pass, t0) > 0.0);
    g.release(&slot, t0);
    assert!(matches!(
        g.admit(&req("a", 9, t0), t0),
        Decision::Refuse(r) if r.reason == RefusalReason::Budget
    ));
    // Nonsense times are read as nothing.
    assert!(g.settle("a", 0.0, f64::NAN, t0).abs() < 1e-12);
}

#[test]
fn unknown_work_holds_its_tenants_unpriced_requests_until_it_has_run() {
    let t0 = Instant::now();
    let mut g = gate();
    g.set_lanes(UP, LaneLimits { fast: 8, slow: 1 });
    budget(&mut g, "rogue", "rate=1 burst=100 when_over=wait", t0);
    let mut first = admitted(g.admit(&req("rogue", 1, t0), t0));
    let slot = g.try_acquire(&first, t0).expect("a slot");
    let unknown = Cost {
        seconds: 0.0,
        known: false,
        learned: false,
    };
    assert!(g.hold_unknown("rogue", first.id, t0));
    g.spend(&mut first, unknown, t0).expect("runs");
    // Charged almost nothing, so the tenant owes nothing; still its next unpriced request
    // waits until the first has run and taught its time.
    let second = admitted(g.admit(&req("rogue", 2, t0), t0));
    assert!(g.try_acquire(&second, t0).is_none());
    g.enqueue(second, 2, t0);
    assert!(g.next_waiter(UP, Lane::Fast, t0, |_| true).is_none());
    // A request whose price is known and paid is not held back.
    let mut paid = admitted(g.admit(&req("rogue", 3, t0), t0));
    g.spend(&mut paid, cost(0.5), t0).expect("runs");
    assert!(g.try_acquire(&paid, t0).is_some());
    // The hold lasts as long as the run, not as long as the slot (a transaction keeps it).
    g.end_unknown("rogue", first.id);
    let next = g
        .next_waiter(UP, Lane::Fast, t0, |_| true)
        .expect("the unknown work ended");
    g.release(&slot, t0);
    assert_eq!(next.waiter, 2);
}

#[test]
fn a_quarantined_statement_runs_in_the_slow_lane_for_a_while() {
    let t0 = Instant::now();
    let mut g = gate();
    let fp = Fingerprint(0xabc);
    assert_eq!(
        g.quarantine("db1", fp, t0),
        None,
        "no quarantine without the setting"
    );
    g.set_settings(GateSettings {
        flip_quarantine: Some(Duration::from_secs(60)),
        ..GateSettings::default()
    });
    assert_eq!(g.quarantine("db1", fp, t0), Some(t0 + secs(60.0)));
    assert_eq!(admitted(g.admit(&req("a", 1, t0), t0)).lane, Lane::Slow);
    let mut other = req("a", 2, t0);
    other.fingerprint = Some(Fingerprint(0xdef));
    assert_eq!(admitted(g.admit(&other, t0)).lane, Lane::Fast);
    // The same statement in another database kept its plan.
    let mut elsewhere = req("a", 4, t0);
    elsewhere.database = "db2";
    assert_eq!(admitted(g.admit(&elsewhere, t0)).lane, Lane::Fast);
    let later = t0 + secs(61.0);
    assert_eq!(
        admitted(g.admit(&req("a", 3, later), later)).lane,
        Lane::Fast
    );
}

#[test]
fn a_quarantined_statement_pays_as_any_other() {
    let t0 = Instant::now();
    let mut g = gate();
    g.set_settings(GateSettings {
        flip_quarantine: Some(Duration::from_secs(60)),
        ..GateSettings::default()
    });
    budget(&mut g, "a", "rate=0.001 burst=1 when_over=reject", t0);
    g.quarantine("db1", Fingerprint(0xabc), t0);
    let mut first = admitted(g.admit(&req("a", 1, t0), t0));
    assert_eq!(first.lane, Lane::Slow);
    let mut second = admitted(g.admit(&req("a", 2, t0), t0));
    g.spend(&mut first, cost(5.0), t0)
        .expect("owes nothing yet");
    // Its tenant now owes: the slow lane is no way around the budget.
    assert!(g.spend(&mut second, cost(5.0), t0).is_err());
}

/// A gate whose fast lane's limit adapts within 4, from a floor of 1.
fn adaptive_gate(standing_wait: f64) -> Gate<u64> {
    let mut g = gate();
    g.set_settings(GateSettings {
        lanes: LaneLimits { fast: 4, slow: 1 },
        adaptive: Some(AdaptiveSettings {
            floor: 1,
            standing_wait: secs(standing_wait),
        }),
        ..GateSettings::default()
    });
    g.set_all_lanes(LaneLimits { fast: 4, slow: 1 });
    // Eight quiet runs, alone on the lane, make statement 1's usual time.
    let t = Instant::now() - secs(10.0);
    let (_, slot) = run(&mut g, "quiet", 1.0, t).expect("runs");
    for _ in 0..8 {
        g.note_run(UP, 1, 0.01, None, slot.crowd(), t);
    }
    g.release(&slot, t);
    g
}

/// The four slots of the adaptive gate's fast lane, taken by tenant `a`.
fn take_all_four(g: &mut Gate<u64>, now: Instant) -> Vec<Slot> {
    (0..4)
        .map(|_| run(g, "a", 1.0, now).expect("runs").1)
        .collect()
}

/// A statement of the fast lane ran `slowdown` times its usual time (learned by
/// [`adaptive_gate`] from quiet runs), beside three others.
fn ran_slower(g: &mut Gate<u64>, slowdown: f64, now: Instant) {
    g.note_run(UP, 1, 0.01 * slowdown, None, 4, now);
}

fn fast_limit(g: &Gate<u64>) -> usize {
    let lanes = g.lanes();
    let fast = lanes
        .iter()
        .find(|l| l.lane == Lane::Fast)
        .expect("a fast lane");
    fast.limit
}

#[test]
fn slow_runs_lower_the_fast_lane_limit_and_calm_full_seconds_raise_it() {
    let t0 = Instant::now();
    let mut g = adaptive_gate(30.0);
    let slots = take_all_four(&mut g, t0);
    assert_eq!(fast_limit(&g), 4);
    ran_slower(&mut g, 3.0, t0);
    let t1 = t0 + secs(1.0);
    g.release(&slots[0], t1);
    assert_eq!(
        fast_limit(&g),
        3,
        "overload: 4 x 0.9, and at least one less"
    );
    let row = g
        .lanes()
        .into_iter()
        .find(|l| l.lane == Lane::Fast)
        .expect("fast");
    assert_eq!(row.ceiling, Some(4));
    assert!(matches!(
        row.last_move.map(|m| m.why),
        Some(LimitChange::Slow(_))
    ));
    // Three held, the limit is three: the lane is full; one finishes at usual speed.
    let ninth = admitted(g.admit(&req("a", 9, t1), t1));
    assert!(g.try_acquire(&ninth, t1).is_none());
    ran_slower(&mut g, 1.0, t0);
    let t2 = t0 + secs(2.0);
    g.release(&slots[1], t2);
    assert_eq!(fast_limit(&g), 4, "calm and full: one more");
    assert_eq!(row.moves, (0, 1));
}

#[test]
fn while_the_limit_falls_best_effort_work_is_shed() {
    let t0 = Instant::now();
    let mut g = adaptive_gate(30.0);
    let slots = take_all_four(&mut g, t0);
    queue(&mut g, "b", Priority::BestEffort, 5, t0);
    queue(&mut g, "c", Priority::Normal, 6, t0);
    ran_slower(&mut g, 5.0, t0);
    let t1 = t0 + secs(1.0);
    let shed = g.expire(t1);
    assert_eq!(shed.len(), 1, "{shed:?}");
    assert_eq!(
        (shed[0].waiter, shed[0].refusal.reason),
        (5, RefusalReason::Overload)
    );
    assert_eq!(shed[0].refusal.sqlstate, SQLSTATE_RESOURCES);
    // A best-effort request that comes now takes no slot, even a free one: it queues and
    // the clock turns it away at once.
    g.release(&slots[0], t1);
    g.release(&slots[1], t1);
    let mut late = req("b", 7, t1);
    late.priority = Priority::BestEffort;
    let late = admitted(g.admit(&late, t1));
    assert!(
        g.try_acquire(&late, t1).is_none(),
        "shed, though a slot is free"
    );
    g.clock_sleeps(None);
    assert!(g.enqueue(late, 7, t1), "the clock looks at once");
    // A carrier (a Parse or a Sync alone) of a best-effort tenant is never turned away:
    // its refusal would end the session.
    budget(&mut g, "b", "priority=best_effort", t1);
    let carrier = g.server_pass(&req("b", 10, t1), t1);
    g.enqueue(carrier, 10, t1);
    let shed: Vec<u64> = g.expire(t1).iter().map(|e| e.waiter).collect();
    assert_eq!(shed, [7]);
    // Normal work takes the free slot; transaction control never waits.
    let next = g.next_waiter(UP, Lane::Fast, t1, |_| true);
    assert_eq!(next.map(|w| w.waiter), Some(6));
    let mut commit = req("b", 9, t1);
    commit.priority = Priority::BestEffort;
    commit.kind = RequestKind::Transaction(TxControl::Commit);
    assert!(matches!(g.admit(&commit, t1), Decision::Bypass(_)));
    assert_eq!(
        stats(&g, "b", t1).refusals.get(&RefusalReason::Overload),
        Some(&2)
    );
    drop(slots);
}

#[test]
fn a_queue_that_stood_serves_the_newest_first_and_drops_what_waited_too_long() {
    let t0 = Instant::now();
    let mut g = adaptive_gate(2.0);
    let slots = take_all_four(&mut g, t0);
    for (client, at) in [(11, 0.0), (12, 0.1), (13, 0.2), (14, 0.3)] {
        queue(&mut g, "b", Priority::Normal, client, t0 + secs(at));
    }
    queue(&mut g, "b", Priority::Critical, 15, t0);
    // Within the first second the queue is first in, first out.
    let t = t0 + secs(0.5);
    g.release(&slots[0], t);
    let first = g
        .next_waiter(UP, Lane::Fast, t, |_| true)
        .expect("a waiter");
    assert_eq!(first.waiter, 15, "critical first");
    g.release(&first.slot, t);
    assert_eq!(
        g.next_waiter(UP, Lane::Fast, t, |_| true).map(|w| w.waiter),
        Some(11)
    );
    // It has stood for a second: newest first.
    let t = t0 + secs(1.1);
    g.release(&slots[1], t);
    assert_eq!(
        g.next_waiter(UP, Lane::Fast, t, |_| true).map(|w| w.waiter),
        Some(14)
    );
    // The clock wakes when the oldest left will have waited standing_wait, and drops it.
    let wake = g.next_wake(t).expect("a wake");
    assert!(wake <= t0 + secs(2.1), "{:?}", wake - t0);
    let dropped = g.expire(t0 + secs(2.15));
    let who: Vec<u64> = dropped.iter().map(|e| e.waiter).collect();
    assert_eq!(who, [12], "{dropped:?}");
    assert!(dropped[0]
        .refusal
        .detail
        .as_deref()
        .is_some_and(|d| d.contains("not emptied")));
}

#[test]
fn without_adaptive_the_queue_stays_first_in_first_out() {
    let t0 = Instant::now();
    let mut g = gate();
    let slots = fill(&mut g, "holder", t0);
    for client in [1, 2, 3] {
        queue(&mut g, "b", Priority::Normal, client, t0);
    }
    let later = t0 + secs(3.0);
    assert!(g.expire(later).is_empty());
    assert_eq!(order(&mut g, slots, later), [1, 2, 3]);
}

#[test]
fn a_standing_queue_drops_only_work_that_waits_for_the_full_lane() {
    let t0 = Instant::now();
    let mut g = adaptive_gate(0.5);
    budget(&mut g, "owes", "rate=1 burst=1 when_over=wait", t0);
    let (_, slot) = run(&mut g, "owes", 100.0, t0).expect("runs into debt");
    g.release(&slot, t0);
    // The debtor waits for its budget while the lane has room, then while it is full.
    let pass = admitted(g.admit(&req("owes", 1, t0), t0));
    assert_eq!(pass.payment(), Payment::AwaitingPayBack);
    g.enqueue(pass, 1, t0);
    let later = t0 + secs(2.0);
    assert!(
        g.expire(later).is_empty(),
        "the lane has room: nothing stands"
    );
    let slots = take_all_four(&mut g, later);
    queue(&mut g, "b", Priority::Normal, 2, later);
    let dropped: Vec<u64> = g
        .expire(later + secs(3.0))
        .iter()
        .map(|e| e.waiter)
        .collect();
    assert_eq!(
        dropped,
        [2],
        "the debtor waits for its budget, not for the lane"
    );
    drop(slots);
}

#[test]
fn critical_work_takes_the_slots_the_adaptive_limit_holds_back() {
    let t0 = Instant::now();
    let mut g = adaptive_gate(30.0);
    let slots = take_all_four(&mut g, t0);
    ran_slower(&mut g, 3.0, t0);
    let t1 = t0 + secs(1.0);
    g.release(&slots[0], t1);
    g.release(&slots[1], t1);
    assert_eq!(fast_limit(&g), 3);
    // Two held, a limit of three: one more for anyone.
    let normal = admitted(g.admit(&req("b", 5, t1), t1));
    let _third = g.try_acquire(&normal, t1).expect("within the limit");
    let later = admitted(g.admit(&req("b", 6, t1), t1));
    assert!(g.try_acquire(&later, t1).is_none(), "at the limit");
    g.enqueue(later, 6, t1);
    // The fourth slot, within the ceiling, is critical work's.
    let mut urgent = req("c", 7, t1);
    urgent.priority = Priority::Critical;
    let urgent = admitted(g.admit(&urgent, t1));
    let fourth = g
        .try_acquire(&urgent, t1)
        .expect("critical work passes the limit");
    let mut more = req("c", 8, t1);
    more.priority = Priority::Critical;
    let more = admitted(g.admit(&more, t1));
    assert!(g.try_acquire(&more, t1).is_none(), "the ceiling holds");
    g.enqueue(more, 8, t1);
    // A slot that comes back over the limit goes to the critical waiter only.
    g.release(&fourth, t1);
    let next = g
        .next_waiter(UP, Lane::Fast, t1, |_| true)
        .map(|w| w.waiter);
    assert_eq!(next, Some(8));
    assert!(g.next_waiter(UP, Lane::Fast, t1, |_| true).is_none());
    drop(slots);
}

#[test]
fn a_wait_through_a_probe_is_nobody_s_and_the_queue_stands_anew_after_it() {
    let t0 = Instant::now() + secs(40.0);
    let mut g = adaptive_gate(0.5);
    let slots = take_all_four(&mut g, t0);
    for client in [11, 12, 13] {
        queue(&mut g, "b", Priority::Normal, client, t0);
    }
    // Full, a queue that stood, no quiet run for 30 s: a probe holds the lane at the floor.
    assert!(
        g.expire(t0 + secs(1.5)).is_empty(),
        "no drop during the probe"
    );
    assert_eq!(fast_limit(&g), 1);
    assert!(g.expire(t0 + secs(2.6)).is_empty());
    // The probe is over: what waited through it is not turned away for that wait.
    assert!(g.expire(t0 + secs(3.6)).is_empty());
    assert_eq!(fast_limit(&g), 4);
    // A queue that stands again, a second later, drops as before.
    let dropped = g.expire(t0 + secs(4.7));
    assert_eq!(dropped.len(), 3, "{dropped:?}");
    drop(slots);
}

#[test]
fn the_gate_gathers_one_record_per_refusal_adds_up_waits_and_gathers_none_when_the_log_is_off() {
    let t0 = Instant::now();
    let mut g = gate();
    budget(&mut g, "b", "rate=100 burst=1000", t0);
    let mut held: Vec<(Pass, Slot)> = (0..2).map(|_| run(&mut g, "b", 1.0, t0).unwrap()).collect();
    assert!(!g.has_decisions(), "nothing refused, nobody waited");
    // A wait that ends in a queue timeout: one refusal, with the wait as a figure.
    let pass = admitted(g.admit(&req("a", 1, t0), t0));
    assert!(g.try_acquire(&pass, t0).is_none());
    g.enqueue(pass, 1, t0);
    assert_eq!(g.expire(t0 + secs(5.0)).len(), 1);
    let records = g.take_decisions();
    assert_eq!(records.len(), 1, "{records:?}");
    let r = &records[0];
    assert_eq!(
        (r.event, r.reason.as_str()),
        (Event::Refused, "queue_timeout")
    );
    assert_eq!((r.tenant.as_deref(), r.client), (Some("a"), Some(1)));
    assert_eq!(r.fingerprint, Some(Fingerprint(0xabc)));
    assert_eq!(r.sqlstate, Some("53000"));
    assert_eq!(r.figures, vec![("waited_s", 5.0)]);
    assert!(!g.has_decisions(), "taken once");
    // A wait that gets its slot is added to the pass's whole wait.
    let mut at = t0 + secs(5.0);
    for (client, waited) in [(2, 1.5), (3, 0.5)] {
        let pass = admitted(g.admit(&req("a", client, at), at));
        assert!(g.try_acquire(&pass, at).is_none());
        g.enqueue(pass, client, at);
        at += secs(waited);
        let (_, slot) = held.pop().expect("a slot to free");
        g.release(&slot, at);
        let granted = g
            .next_waiter(UP, Lane::Fast, at, |_| true)
            .expect("the freed slot");
        assert_eq!(granted.waiter, client);
        assert_eq!(granted.pass.waited, secs(waited));
        assert!(!granted.pass.waited_for_budget);
        held.push((granted.pass, granted.slot));
        // The session logs a wait once the request runs: the gate gathers nothing for it.
        assert!(!g.has_decisions());
    }
    // A request that waits again (for its tenant's pay-back, after its slot) adds it up.
    let pass = admitted(g.admit(&req("a", 5, at), at));
    g.enqueue(pass, 5, at);
    let (_, slot) = held.pop().expect("a slot to free");
    g.release(&slot, at + secs(0.6));
    let first = g
        .next_waiter(UP, Lane::Fast, at + secs(0.6), |_| true)
        .unwrap();
    g.release(&first.slot, at + secs(0.6));
    g.enqueue(first.pass, 5, at + secs(0.6));
    let again = g
        .next_waiter(UP, Lane::Fast, at + secs(1.2), |_| true)
        .unwrap();
    assert_eq!(again.pass.waited, secs(0.6) + secs(0.6));
    held.push((again.pass, again.slot));
    at += secs(1.2);
    // With the log off, the same refusal is counted and gathers nothing.
    let mut settings = g.settings();
    settings.log = false;
    g.set_settings(settings);
    let pass = admitted(g.admit(&req("a", 4, at), at));
    g.enqueue(pass, 4, at);
    assert_eq!(g.expire(at + secs(5.0)).len(), 1);
    assert!(!g.has_decisions());
    assert_eq!(stats(&g, "a", at).refusals[&RefusalReason::QueueTimeout], 2);
}

#[test]
fn tenant_metrics_keep_the_cap_rank_by_what_ran_and_keep_totals_past_forgetting() {
    let t0 = Instant::now();
    let mut g = gate();
    for i in 0..10_000u32 {
        let tenant = format!("t{i}");
        g.settle(&tenant, 0.0, f64::from(i % 100) / 1000.0, t0);
    }
    g.note_refusal(
        req("t7", 1, t0).subject(),
        RefusalReason::Budget,
        "budget",
        "53000",
        t0,
    );
    let m = g.tenant_metrics(5, t0);
    assert_eq!(
        (m.known, m.kept.len(), m.folded.tenants),
        (10_000, 5, 9_995)
    );
    // The most run first; t7's refusal weighs as much as a second of run time.
    assert!(m.kept.iter().any(|t| t.tenant == "t7"));
    assert!(m
        .kept
        .iter()
        .all(|t| t.tenant == "t7" || t.ran >= 0.099 - 1e-12));
    let total: f64 = (0..10_000u32).map(|i| f64::from(i % 100) / 1000.0).sum();
    assert!(
        (m.totals.ran - total).abs() < 1e-6,
        "{} vs {total}",
        m.totals.ran
    );
    assert_eq!(m.totals.refusals[&RefusalReason::Budget], 1);
    // A run faster than charged lowers what was charged, never what ran.
    g.settle("t7", 5.0, 0.5, t0);
    let after = g.tenant_metrics(5, t0);
    assert!(after.totals.ran >= m.totals.ran + 0.5 - 1e-9);
    // Forgotten tenants leave the totals as they were.
    g.forget_idle(t0 + secs(3600.0));
    let later = g.tenant_metrics(5, t0 + secs(3600.0));
    assert!(later.known < 10_000);
    assert_eq!(later.totals, after.totals);
    // A cap of 0 keeps no tenant's series.
    assert!(g.tenant_metrics(0, t0).kept.is_empty());
}

#[test]
fn the_fleets_share_of_slots_caps_both_lanes_and_nothing_runs_before_a_lease() {
    let t0 = Instant::now();
    let mut g = gate();
    g.set_fleet(true, t0);
    // A new upstream under a fleet has no share yet: nothing takes a slot.
    let pass = admitted(g.admit(&req("a", 1, t0), t0));
    assert!(g.try_acquire(&pass, t0).is_none());
    assert_eq!(g.fleet_slots(UP), Some(0));
    g.enqueue(pass, 1, t0);
    // A share of one slot: the waiter goes, the next one waits.
    g.set_fleet_slots(UP, Some(1));
    let granted = g.dispatch(t0, |_| true);
    assert_eq!(granted.len(), 1);
    let pass = admitted(g.admit(&req("a", 2, t0), t0));
    assert!(g.try_acquire(&pass, t0).is_none());
    // Off: the lanes' own limits again.
    g.set_fleet(false, t0);
    assert!(g.try_acquire(&pass, t0).is_some());
}

#[test]
fn a_budget_whose_fleet_share_is_nothing_admits_nothing() {
    let t0 = Instant::now();
    let mut g = gate();
    budget(&mut g, "a", "rate=1 burst=1 when_over=reject", t0);
    assert!(run(&mut g, "a", 0.1, t0).is_ok());
    g.set_fleet_rate("a", Some(0.0), t0);
    assert_eq!(
        run(&mut g, "a", 0.1, t0).unwrap_err().reason,
        RefusalReason::Budget
    );
    // Half the rate: the burst is half too, refilled at half the rate.
    g.set_fleet_rate("a", Some(0.5), t0);
    assert!(run(&mut g, "a", 0.1, t0 + secs(1.0)).is_ok());
    assert!((balance(&g, "a", t0 + secs(1.0)) - 0.4).abs() < 1e-9);
    assert!((balance(&g, "a", t0 + secs(3.0)) - 0.5).abs() < 1e-9);
}

#[test]
fn a_budget_with_no_share_asks_only_for_what_waits_and_waits_without_spinning() {
    let t0 = Instant::now();
    let mut g = gate();
    budget(&mut g, "a", "rate=2 burst=2 when_over=reject", t0);
    budget(&mut g, "b", "rate=2 burst=2 when_over=wait", t0);
    g.set_fleet(true, t0);
    // Nothing used, nothing waits: a share of nothing asks for nothing more.
    let wants = g.fleet_wants(t0);
    assert!(wants.tenants.iter().all(|w| w.demand == 0.0), "{wants:?}");
    // A refusal says to come back in about a second, not at once.
    let refusal = run(&mut g, "a", 0.1, t0).unwrap_err();
    assert_eq!(refusal.reason, RefusalReason::Budget);
    assert!(refusal.retry_after().expect("a hint") >= secs(1.0));
    // A request that waits for its budget wakes the clock only when a share comes.
    let pass = admitted_or_awaiting(g.admit(&req("b", 1, t0), t0));
    g.enqueue(pass, 1, t0);
    let wake = g.next_wake(t0);
    assert!(wake.is_none_or(|at| at >= t0 + secs(1.0)), "{wake:?}");
    let wants = g.fleet_wants(t0);
    let b = wants.tenants.iter().find(|w| w.name == "b").expect("b");
    assert_eq!(b.demand, 2.0, "what waits asks for the whole rate");
}

/// Admits `r` as a session would: with the hint it keeps, which the gate renews when stale.
fn admit_hinted(
    g: &mut Gate<u64>,
    r: &Request,
    kept: &mut Option<Box<Hint>>,
    now: Instant,
) -> Pass {
    let r = Request {
        hint: kept.as_deref(),
        ..*r
    };
    let (decision, hint) = g.admit_hinted(&r, now, None);
    if let Some(h) = hint {
        *kept = Some(h);
    }
    admitted(decision)
}

#[test]
fn a_sessions_hint_finds_its_tenant_and_upstream_and_is_renewed_only_when_stale() {
    let t0 = Instant::now();
    let mut g = gate();
    budget(&mut g, "a", "rate=100 burst=1000", t0);
    let mut kept = None;
    let first = admit_hinted(&mut g, &req("a", 1, t0), &mut kept, t0);
    let hint = kept.clone().expect("a first hint");
    let again = admit_hinted(&mut g, &req("a", 1, t0), &mut kept, t0);
    assert_eq!(again.places, first.places);
    assert!(Arc::ptr_eq(&again.tenant, &first.tenant));
    assert!(
        Arc::ptr_eq(&kept.clone().unwrap().tenant, &hint.tenant),
        "kept as it was"
    );
    // Another tenant with the same hint: charged to itself, and the hint follows it.
    let mut b = admit_hinted(&mut g, &req("b", 1, t0), &mut kept, t0);
    assert_eq!(&*b.tenant, "b");
    assert_ne!(b.places.tenant, first.places.tenant);
    assert_eq!(&*kept.clone().unwrap().tenant, "b");
    g.spend(&mut b, cost(1.0), t0).expect("b pays");
    assert_eq!(stats(&g, "b", t0).charged, 1.0);
    assert_eq!(stats(&g, "a", t0).charged, 0.0);
}

#[test]
fn a_hint_whose_tenant_was_forgotten_and_place_reused_finds_the_tenant_by_name() {
    let t0 = Instant::now();
    let mut g = gate();
    let mut kept = None;
    let old = admit_hinted(&mut g, &req("gone", 1, t0), &mut kept, t0);
    drop(old);
    g.forget_idle(t0 + secs(600.0));
    // Another tenant takes the forgotten one's place.
    let other = admitted(g.admit(&req("other", 2, t0), t0));
    assert_eq!(other.places.tenant, kept.as_ref().unwrap().places.tenant);
    let mut back = admit_hinted(&mut g, &req("gone", 1, t0), &mut kept, t0);
    assert_eq!(&*back.tenant, "gone");
    assert_ne!(back.places.tenant, other.places.tenant);
    g.spend(&mut back, cost(2.0), t0).expect("pays");
    assert_eq!(stats(&g, "gone", t0).charged, 2.0);
    assert_eq!(stats(&g, "other", t0).charged, 0.0);
}

#[test]
fn a_hint_never_skips_noting_a_pool_whose_size_changed_or_a_new_pool() {
    let t0 = Instant::now();
    let mut g = gate();
    g.set_all_lanes(LaneLimits {
        fast: usize::MAX,
        slow: 1,
    });
    let mut kept = None;
    let mut r = req("a", 1, t0);
    r.pool_size = 1;
    let pass = admit_hinted(&mut g, &r, &mut kept, t0);
    let held = g.try_acquire(&pass, t0).expect("the one server");
    let pass = admit_hinted(&mut g, &r, &mut kept, t0);
    assert!(g.try_acquire(&pass, t0).is_none(), "one server, one slot");
    // A reload gives the pool two servers: the same session's next request says so.
    r.pool_size = 2;
    let pass = admit_hinted(&mut g, &r, &mut kept, t0);
    let second = g.try_acquire(&pass, t0).expect("a second slot");
    // Another session's pool onto the same upstream: this session's hint is stale, and its
    // next request is noted again (and renews it).
    let before = kept.clone().unwrap();
    let mut other = req("a", 2, t0);
    other.pool = "db2/app";
    other.pool_size = 1;
    admitted(g.admit(&other, t0));
    let pass = admit_hinted(&mut g, &r, &mut kept, t0);
    assert_ne!(kept.as_ref().unwrap().pools_noted, before.pools_noted);
    let third = g.try_acquire(&pass, t0).expect("three servers now");
    for s in [held, second, third] {
        g.release(&s, t0);
    }
}

#[test]
fn a_pass_made_in_a_spare_ones_allocation_holds_nothing_of_it() {
    let t0 = Instant::now();
    let mut g = gate();
    budget(&mut g, "a", "rate=100 burst=1000", t0);
    budget(&mut g, "b", "rate=100 burst=1000", t0);
    let mut old = admitted(g.admit(&req("a", 1, t0), t0));
    g.spend(&mut old, cost(0.5), t0).expect("paid");
    g.enqueue(old, 1, t0);
    let (old, _) = g.withdraw(TicketId(1), t0).expect("withdrawn");
    let at: *const PassFields = &*old;
    let t1 = t0 + secs(1.0);
    let r = Request {
        fingerprint: None,
        deadline: Some(secs(2.0)),
        ..req("b", 2, t1)
    };
    let (decision, _) = g.admit_hinted(&r, t1, Some(old));
    let new = admitted(decision);
    assert!(std::ptr::eq(&*new, at), "the same allocation");
    let fresh = admitted(g.admit(&r, t1));
    assert_ne!(new.id, fresh.id);
    assert_eq!(&*new.tenant, "b");
    assert_eq!(new.client_id, 2);
    assert_eq!(new.fingerprint, None);
    assert_eq!(new.sent_at, t1);
    assert_eq!(new.deadline, Some(t1 + secs(2.0)));
    assert_eq!(new.enqueued_at, None);
    assert_eq!(new.waited, Duration::ZERO);
    assert!(matches!(new.payment(), Payment::Unpaid));
    assert_eq!(new.places, fresh.places);
}
