//! The gate's keeper, the one part of the gate that runs on tokio: the pure [`Gate`] under
//! one sync mutex, the plan cache, the slots sessions hold, and the clock that ends waits and
//! hands out slots when a debt is paid back. Kept across reloads: a reload only changes tenants' settings and the lanes.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::cost::{Calibration, Flip, FlipReason, PlanCache, Relation, PLAN_CAPACITY, PLAN_TTL};
use crate::gate::decisions::DecisionLog;
use crate::gate::mailbox::{Heard, Mailbox, Sender};
use crate::gate::Spent;
use crate::gate::TenantConfig;
use crate::gate::{
    Cost, Decision, Expired, Gate, GateSettings, Granted, Grants, KillTarget, Near, Pass, Refusal,
    Request, Slot, TenantTimeouts,
};
use crate::sync::Counted;

/// What [`Gatekeeper::admit`] decided.
pub struct Admitted {
    /// The tenant's timeouts.
    pub limits: TenantTimeouts,
    pub decision: Decision,
    /// For a request priced before admission and admitted: its charge, and the slot taken
    /// with it, if one was asked for and free.
    pub paid: Option<Result<(Spent, SlotLook), Refusal>>,
    /// A new hint for the session's next request, when the one it brought was stale.
    pub hint: Option<Box<crate::gate::Hint>>,
}

/// What a charge that may take a slot found.
#[derive(Debug)]
pub enum SlotLook {
    /// No slot was looked for (none asked, or the request may not run yet).
    NotAsked,
    /// None was free, or someone waiting goes first.
    Full,
    /// Taken.
    Taken(SlotGuard),
}

/// [`SlotLook`] under the lock.
enum Looked {
    NotAsked,
    Full,
    Free(Slot),
}

/// What the locked part of a payment leaves to do once the lock is let go.
struct Paid<T> {
    paid: T,
    granted: Grants<SlotWaiter>,
    elsewhere: bool,
    slot: Looked,
}

/// How a waiting ticket hears the end of its wait.
pub type SlotWaiter = Sender<SlotAnswer>;

/// Where a session hears the ends of its waits for a slot, one at a time.
pub type SlotMailbox = Mailbox<SlotAnswer>;

/// The end of a wait for a slot.
#[derive(Debug)]
pub enum SlotAnswer {
    /// A slot: the statement may run.
    Granted(Pass, SlotGuard),
    /// The wait ended without one (deadline, queue timeout); already refunded.
    Refused(Option<Pass>, Refusal),
}

/// The names of pgward's own statements, portals and savepoint on servers, with a random
/// part chosen at start, so that no client can take one of them first. Each pair is
/// (name, SQL) where it runs a fixed statement.
#[derive(Debug)]
pub struct OwnNames {
    pub explain: String,
    pub sizes: String,
    pub savepoint: (String, String),
    pub release: (String, String),
    pub rollback: (String, String),
    /// The statement that reads a setting PostgreSQL never reports back from a server.
    pub unreported: String,
    /// What a statement name starts with that pgward gives a client's statement to make sure
    /// it cannot exist on the server (the client's name follows).
    pub not_here: String,
}

impl OwnNames {
    fn new() -> OwnNames {
        let tag: u64 = rand::random();
        let name = |what: &str| format!("pgward_{what}_{tag:016x}");
        let point = name("point");
        OwnNames {
            explain: name("explain"),
            sizes: name("sizes"),
            savepoint: (name("savepoint"), format!("SAVEPOINT {point}")),
            release: (name("release"), format!("RELEASE SAVEPOINT {point}")),
            rollback: (name("rollback"), format!("ROLLBACK TO SAVEPOINT {point}")),
            unreported: name("unreported"),
            not_here: format!("{}_", name("not_prepared_here")),
        }
    }
}

/// The gate, its plan cache, and the clock's wake-up call.
#[derive(Debug)]
pub struct Gatekeeper {
    /// The gate, with how often its lock was taken.
    gate: Mutex<Counted<Gate<SlotWaiter>>>,
    /// How often the gate's lock was found held by another worker thread.
    gate_contended: crate::sync::Contended,
    plans: Mutex<PlanCache>,
    /// Row counts of tables plans read in full, by database (for `max_scan_rows`).
    sizes: Mutex<HashMap<(String, Relation), f64>>,
    /// Seconds per cost unit learned per plan, and the usual times of statements without
    /// one (see [`crate::cost::calibrate`]).
    calibration: Mutex<Calibration>,
    /// The latest plan flips, newest last (SHOW FLIPS).
    flips: Mutex<std::collections::VecDeque<Flip>>,
    wake: Notify,
    /// A kill was made and not lifted (sessions without a policy look at kills only then).
    kills: AtomicBool,
    /// `adaptive = true` is in force.
    adaptive: AtomicBool,
    /// pgward's own names on servers.
    pub own: Arc<OwnNames>,
    /// The decision log: what the gate decided is written there once the gate is unlocked
    /// ([`GateLock`]); the session, the console and the server reading write theirs too.
    pub decisions: DecisionLog,
}

/// The locked gate. When it is let go, the decisions the gate gathered meanwhile are written
/// to the decision log, after the lock is released: the fields drop in their order, the
/// guard first.
pub struct GateLock<'a> {
    guard: MutexGuard<'a, Counted<Gate<SlotWaiter>>>,
    after: Unwritten<'a>,
}

/// Decisions taken out of the gate, written when dropped.
struct Unwritten<'a> {
    log: &'a DecisionLog,
    decisions: Vec<crate::gate::Record>,
}

impl std::ops::Deref for GateLock<'_> {
    type Target = Gate<SlotWaiter>;
    fn deref(&self) -> &Self::Target {
        &self.guard
    }
}

impl std::ops::DerefMut for GateLock<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.guard
    }
}

impl Drop for GateLock<'_> {
    fn drop(&mut self) {
        if self.guard.has_decisions() {
            self.after.decisions = self.guard.take_decisions();
        }
    }
}

impl Drop for Unwritten<'_> {
    fn drop(&mut self) {
        if !self.decisions.is_empty() {
            self.log.record_all(std::mem::take(&mut self.decisions));
        }
    }
}

/// Plan flips listed at most.
pub const MAX_FLIPS: usize = 100;

/// Table sizes kept at most.
const MAX_SIZES: usize = 10_000;

impl Gatekeeper {
    /// A gate with default settings and no tenants.
    pub fn new() -> Arc<Gatekeeper> {
        let seed = rand::random();
        Arc::new(Gatekeeper {
            gate: Mutex::new(Counted::new(Gate::new(GateSettings::default(), seed))),
            gate_contended: crate::sync::Contended::default(),
            plans: Mutex::new(PlanCache::new(PLAN_TTL, PLAN_CAPACITY)),
            sizes: Mutex::new(HashMap::new()),
            calibration: Mutex::new(Calibration::new()),
            flips: Mutex::new(std::collections::VecDeque::new()),
            wake: Notify::new(),
            kills: AtomicBool::new(false),
            adaptive: AtomicBool::new(false),
            own: Arc::new(OwnNames::new()),
            decisions: DecisionLog::default(),
        })
    }

    /// Applies a policy's `[gate]` settings and tenants (at start and on every reload); the
    /// balances of tenants that keep a budget are kept. Under a `[fleet]` (`fleet`), budgets
    /// and slots are shared from this moment: nothing shared is admitted before a lease.
    pub fn configure<'a>(
        &self,
        settings: GateSettings,
        tenants: impl Iterator<Item = (&'a str, &'a TenantConfig)>,
        fleet: bool,
    ) {
        let now = Instant::now();
        let mut gate = self.lock();
        self.adaptive
            .store(settings.adaptive.is_some(), Ordering::Release);
        gate.set_settings(settings);
        gate.set_all_lanes(settings.lanes);
        let mut listed = BTreeSet::new();
        for (tenant, config) in tenants {
            gate.configure_tenant(tenant, config.clone(), now);
            listed.insert(tenant);
        }
        gate.reset_others(&listed);
        if gate.fleet() != fleet {
            gate.set_fleet(fleet, now);
        }
        drop(gate);
        self.wake.notify_one();
    }

    /// `KILL`: refuses what comes and, unless `soft`, what waits now (answered here); how
    /// many waiting requests it refused.
    pub fn kill(&self, target: KillTarget, duration: Duration, soft: bool) -> usize {
        let refused = self.lock().kill(target, duration, soft, Instant::now());
        self.kills.store(true, Ordering::Release);
        let n = refused.len();
        self.answer(refused);
        if n > 0 {
            // The tickets behind the refused ones may go now, and refunds pay debts sooner.
            self.wake.notify_one();
        }
        n
    }

    /// `UNKILL`; whether such a kill was in force.
    pub fn unkill(&self, target: &KillTarget) -> bool {
        let mut gate = self.lock();
        // Listing forgets the kills that expired, so only one in force is lifted.
        gate.kills(Instant::now());
        let lifted = gate.unkill(target);
        self.kills.store(gate.has_kills(), Ordering::Release);
        lifted
    }

    /// Whether a kill may be in force (one atomic load).
    pub fn may_have_kills(&self) -> bool {
        self.kills.load(Ordering::Acquire)
    }

    fn answer(&self, expired: Vec<Expired<SlotWaiter>>) {
        for e in expired {
            let _ = e.waiter.send(SlotAnswer::Refused(Some(e.pass), e.refusal));
        }
    }

    /// Asks the clock to look at the queues now (settings changed).
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// The gate, for one step (never held across `.await`).
    pub fn lock(&self) -> GateLock<'_> {
        GateLock {
            guard: crate::sync::lock_counted(&self.gate, &self.gate_contended),
            after: Unwritten {
                log: &self.decisions,
                decisions: Vec::new(),
            },
        }
    }

    /// How often the gate's lock was taken, and how often another worker thread held it then.
    pub fn lock_counts(&self) -> (u64, u64) {
        let taken = crate::sync::lock(&self.gate).taken();
        (taken, self.gate_contended.read())
    }

    /// The plan cache.
    pub fn plans(&self) -> MutexGuard<'_, PlanCache> {
        crate::sync::lock(&self.plans)
    }

    /// Records the row counts of tables of `database`, read with a plan.
    pub fn learn_sizes(&self, database: &str, sizes: Vec<(Relation, f64)>) {
        let mut known = crate::sync::lock(&self.sizes);
        if known.len() + sizes.len() > MAX_SIZES {
            known.clear();
        }
        for (relation, rows) in sizes {
            known.insert((database.to_string(), relation), rows);
        }
    }

    /// The row count of a table of `database`, if known.
    pub fn size_of(&self, database: &str, relation: &Relation) -> Option<f64> {
        let known = crate::sync::lock(&self.sizes);
        known
            .get(&(database.to_string(), relation.clone()))
            .copied()
    }

    /// The calibration: predictions and what runs teach.
    pub fn calibration(&self) -> MutexGuard<'_, Calibration> {
        crate::sync::lock(&self.calibration)
    }

    /// Replaces what was learned with what a state file held (at start).
    pub fn restore_calibration(&self, calibration: Calibration) {
        *self.calibration() = calibration;
    }

    /// What was learned, as the state file's text, if anything was learned since the last
    /// call.
    pub fn calibration_to_save(&self) -> Option<String> {
        let mut c = self.calibration();
        c.dirty().then(|| c.to_json())
    }

    /// The plan of statement `fingerprint` of `database` flipped: it is listed (the latest
    /// [`MAX_FLIPS`]), logged, and quarantined in the slow lane if the policy says so.
    pub fn note_flip(&self, database: &str, fingerprint: u64, reason: FlipReason) {
        let now = Instant::now();
        let until = self
            .lock()
            .quarantine(database, crate::sql::Fingerprint(fingerprint), now);
        let wall = std::time::SystemTime::now();
        let quarantined_until =
            until.and_then(|u| wall.checked_add(u.saturating_duration_since(now)));
        tracing::info!(
            database,
            fingerprint = %format!("{fingerprint:016x}"),
            reason = reason.as_str(),
            quarantined = quarantined_until.is_some(),
            "plan flip"
        );
        let quarantine = until.map_or(0.0, |u| u.saturating_duration_since(now).as_secs_f64());
        let record = crate::gate::Record::new(crate::gate::Event::Flipped, reason.as_str())
            .database(database)
            .fingerprint(Some(crate::sql::Fingerprint(fingerprint)))
            .figure("quarantine_s", quarantine);
        self.decisions.record(&record);
        let mut flips = crate::sync::lock(&self.flips);
        if flips.len() >= MAX_FLIPS {
            flips.pop_front();
        }
        flips.push_back(Flip {
            at: wall,
            database: database.to_string(),
            fingerprint,
            reason,
            quarantined_until,
        });
    }

    /// The latest plan flips, oldest first.
    pub fn flips(&self) -> Vec<Flip> {
        crate::sync::lock(&self.flips).iter().cloned().collect()
    }

    /// `tenant` runs work of unknown price as `id` (see [`Gate::hold_unknown`]); whether it
    /// holds the tenant's other unpriced requests.
    pub fn hold_unknown(&self, tenant: &str, id: crate::gate::TicketId) -> bool {
        self.lock().hold_unknown(tenant, id, Instant::now())
    }

    /// The unknown work `id` of `tenant` has run, or never will: its tenant's waiting unpriced
    /// requests may go, on any upstream, so the clock looks.
    pub fn end_unknown(&self, tenant: &str, id: crate::gate::TicketId) {
        self.lock().end_unknown(tenant, id);
        self.wake.notify_one();
    }

    /// Statement `statement` ran `took` in `slot` of a fast lane for a plan of cost `cost`
    /// (for the adaptive limit; nothing is locked without one).
    pub fn note_run(&self, slot: &Slot, statement: u64, took: Duration, cost: Option<f64>) {
        if self.adaptive.load(Ordering::Acquire) {
            let seconds = took.as_secs_f64();
            let (upstream, crowd) = (slot.upstream(), slot.crowd());
            self.lock()
                .note_run(upstream, statement, seconds, cost, crowd, Instant::now());
        }
    }

    /// The server reading of `upstream` counted `n` of pgward's sessions waiting for a lock.
    pub fn note_lock_waits(&self, upstream: &str, n: usize) {
        if self.adaptive.load(Ordering::Acquire) {
            self.lock().note_lock_waits(upstream, n, Instant::now());
            // The clock ticks the limit even while no slot comes or goes.
            self.wake.notify_one();
        }
    }

    /// Work of `tenant` charged `charged` seconds before it ran took `took`, ending at `now`:
    /// the difference is charged or given back; a refund may let a request waiting for
    /// pay-back go sooner, so the clock looks again.
    pub fn settle(&self, tenant: &str, charged: f64, took: Duration, now: Instant) {
        let mut gate = self.lock();
        let added = gate.settle(tenant, charged, took.as_secs_f64(), now);
        let look = added < 0.0 && gate.has_waiters() && gate.budgeted(tenant);
        drop(gate);
        if look {
            self.wake.notify_one();
        }
    }

    /// A slot for `pass` now, if its lane has room and nobody goes first (otherwise
    /// [`acquire`](Self::acquire) queues it).
    pub fn try_acquire(self: &Arc<Self>, pass: &Pass) -> Option<SlotGuard> {
        let slot = self.lock().try_acquire(pass, Instant::now())?;
        Some(SlotGuard::new(self, slot))
    }

    /// A slot for `pass`: at once if its lane has one free and nobody waiting comes first,
    /// else after a wait in the gate's queue ([`Acquire::Queued`]: dropping it withdraws the
    /// ticket). When the ticket has to wait, `evict` is told how many idle servers of which
    /// tenants holding more than their share while others wait may be closed now (a few a
    /// second), and answers how many of each it closed. The answer comes through `mailbox`,
    /// the session's own; with `notify` (query_wait_notify), a notice comes before it once
    /// the ticket has waited that long, from the gate's clock (no timer of the wait's own).
    pub fn acquire<'a>(
        self: &'a Arc<Self>,
        mut pass: Pass,
        mailbox: &'a Arc<SlotMailbox>,
        evict: impl FnOnce(&[(String, usize)]) -> Vec<usize>,
        notify: Option<Duration>,
    ) -> Acquire<'a> {
        let now = Instant::now();
        // The wait starts before the gate's lock is taken: whatever an earlier wait left in
        // the box (a slot) is dropped outside it.
        let tx = mailbox.sender();
        let (id, over, look) = {
            let mut gate = self.lock();
            if let Some(slot) = gate.try_acquire(&pass, now) {
                return Acquire::Answered(SlotAnswer::Granted(pass, SlotGuard::new(self, slot)));
            }
            pass.notify_at = notify.and_then(|after| now.checked_add(after));
            let (id, places) = (pass.id, pass.places);
            let upstream = pass.upstream.clone();
            let look = gate.enqueue(pass, tx, now);
            let near = Near {
                places,
                upstream: &upstream,
            };
            let over = gate.evictions_near(near, now);
            (id, (upstream, over), look)
        };
        let (upstream, over) = over;
        if !over.is_empty() {
            let closed = evict(&over);
            let mut gate = self.lock();
            for ((tenant, asked), closed) in over.iter().zip(closed) {
                gate.evicted_fewer(&upstream, tenant, *asked, closed);
            }
        }
        if look {
            // The clock would sleep past this ticket's end or notice: it looks again.
            self.wake.notify_one();
        }
        Acquire::Queued(SlotWait {
            withdraw: Withdraw {
                keeper: self,
                id: Some(id),
                mailbox,
            },
            since: now,
        })
    }

    /// [`Gate::spend`]; a priced request lets its tenant's next unpaid one take a slot, so
    /// the slots that can be given now are handed out.
    pub fn spend(self: &Arc<Self>, pass: &mut Pass, cost: Cost) -> Result<Spent, Refusal> {
        self.pay(
            pass,
            |gate, pass, now| gate.spend(pass, cost, now),
            |_| false,
        )
        .0
    }

    /// Gives back what `pass` was charged: its request never ran (it got no server). A
    /// refund may pay a waiting request's debt sooner, so the clock looks again.
    pub fn refund(&self, pass: &mut Pass) {
        let mut gate = self.lock();
        if gate.refund(pass, Instant::now()) > 0.0 && gate.has_waiters() {
            self.wake.notify_one();
        }
    }

    /// [`spend`](Self::spend), and when `pass` may run now, a slot for it in the same turn of
    /// the lock, as [`try_acquire`](Self::try_acquire) would take one right after.
    pub fn spend_and_try_acquire(
        self: &Arc<Self>,
        pass: &mut Pass,
        cost: Cost,
    ) -> Result<(Spent, SlotLook), Refusal> {
        let runs = |spent: &Result<Spent, Refusal>| matches!(spent, Ok(Spent::Run { .. }));
        let (spent, slot) = self.pay(pass, |gate, pass, now| gate.spend(pass, cost, now), runs);
        Ok((spent?, slot))
    }

    /// [`Gate::force_spend`], then as [`spend`](Self::spend).
    pub fn force_spend(self: &Arc<Self>, pass: &mut Pass, seconds: f64) -> f64 {
        let force = |gate: &mut Gate<SlotWaiter>, pass: &mut Pass, now| {
            gate.force_spend(pass, seconds, now)
        };
        self.pay(pass, force, |_| false).0
    }

    /// Charges `pass` with `charge` under the lock, then hands out the slots of its upstream
    /// that can be given now, if anyone waits; then, if `then_slot` says so of the charge, a
    /// slot for `pass` if one is free and nobody waiting comes first.
    fn pay<T>(
        self: &Arc<Self>,
        pass: &mut Pass,
        charge: impl FnOnce(&mut Gate<SlotWaiter>, &mut Pass, Instant) -> T,
        then_slot: impl FnOnce(&T) -> bool,
    ) -> (T, SlotLook) {
        let now = Instant::now();
        let paid = Self::pay_locked(&mut self.lock(), pass, now, charge, then_slot);
        self.after_pay(paid)
    }

    /// The part of [`pay`](Self::pay) done under the lock.
    fn pay_locked<T>(
        gate: &mut Gate<SlotWaiter>,
        pass: &mut Pass,
        now: Instant,
        charge: impl FnOnce(&mut Gate<SlotWaiter>, &mut Pass, Instant) -> T,
        then_slot: impl FnOnce(&T) -> bool,
    ) -> Paid<T> {
        let paid = charge(gate, pass, now);
        let granted = match gate.has_waiters() {
            true => gate.dispatch_near(pass.near(), now, |w| !w.is_closed()),
            false => Grants::new(),
        };
        // (Nobody waits, the common case: nobody waits elsewhere either.)
        let elsewhere = gate.has_waiters() && gate.pass_waits_elsewhere(pass);
        let slot = match then_slot(&paid) {
            true => gate
                .try_acquire(pass, now)
                .map_or(Looked::Full, Looked::Free),
            false => Looked::NotAsked,
        };
        Paid {
            paid,
            granted,
            elsewhere,
            slot,
        }
    }

    /// The part of [`pay`](Self::pay) done once the lock is let go.
    fn after_pay<T>(self: &Arc<Self>, paid: Paid<T>) -> (T, SlotLook) {
        // (Made out of the lock: a guard dropped gives its slot back under it.)
        let slot = match paid.slot {
            Looked::NotAsked => SlotLook::NotAsked,
            Looked::Full => SlotLook::Full,
            Looked::Free(slot) => SlotLook::Taken(SlotGuard::new(self, slot)),
        };
        if paid.elsewhere {
            // A request priced: its tenant's tickets on other upstreams may go now.
            self.wake.notify_one();
        }
        if !paid.granted.is_empty() {
            // (Nearly always empty: nobody waits, or no slot came free.)
            self.deliver(paid.granted);
        }
        (paid.paid, slot)
    }

    /// [`Gate::admit`] of `request`, with its tenant's timeouts. With `priced` (its cost,
    /// known before admission, and whether it takes a slot first), an admitted request is
    /// charged as by [`spend`](Self::spend), or [`spend_and_try_acquire`] when it takes a
    /// slot: admission, charge and slot in one turn of the lock. `spare`, a pass the session
    /// is done with, lends its allocation to the new one.
    ///
    /// [`spend_and_try_acquire`]: Self::spend_and_try_acquire
    pub fn admit(
        self: &Arc<Self>,
        request: &Request,
        now: Instant,
        priced: Option<(Cost, bool)>,
        spare: Option<Pass>,
    ) -> Admitted {
        let (limits, decision, paid, hint) = {
            let mut gate = self.lock();
            let (mut decision, hint) = gate.admit_hinted(request, now, spare);
            let limits = match &decision {
                Decision::Admit(pass) | Decision::Bypass(pass) => gate.timeouts_of(pass),
                Decision::Refuse(_) => gate.timeouts(request.tenant),
            };
            let paid = match (&mut decision, priced) {
                (Decision::Admit(pass), Some((cost, takes_slot))) => {
                    let spend = |gate: &mut Gate<SlotWaiter>, pass: &mut Pass, now| {
                        gate.spend(pass, cost, now)
                    };
                    let runs = |spent: &Result<Spent, Refusal>| {
                        takes_slot && matches!(spent, Ok(Spent::Run { .. }))
                    };
                    Some(Self::pay_locked(&mut gate, pass, now, spend, runs))
                }
                _ => None,
            };
            (limits, decision, paid, hint)
        };
        let paid = paid.map(|paid| {
            let (spent, slot) = self.after_pay(paid);
            spent.map(|spent| (spent, slot))
        });
        Admitted {
            limits,
            decision,
            paid,
            hint,
        }
    }

    /// Settles `run` with the slot's tenant (see [`settle`](Self::settle)), gives the slot
    /// back and hands out what can be handed out now, in one turn of the lock.
    fn release(self: &Arc<Self>, slot: Slot, run: Option<Settlement>) {
        // A run kept for the release ended just now (nothing waited in between).
        let now = run.map_or_else(Instant::now, |r| r.at);
        let granted = {
            let mut gate = self.lock();
            if let Some(run) = run {
                self.settle_locked(&mut gate, &slot, run, now);
            }
            let elsewhere = gate.release(&slot, now);
            if !gate.has_waiters() {
                return;
            }
            if elsewhere {
                // Its tickets on other upstreams may take a slot now: the clock looks.
                self.wake.notify_one();
            }
            gate.dispatch_near(slot.near(), now, |w| !w.is_closed())
        };
        self.deliver(granted);
    }

    /// What `tenant` was charged (SHOW TENANTS' `charged`; 0 for a tenant never seen).
    #[cfg(test)]
    pub(crate) fn charged_of(&self, tenant: &str) -> f64 {
        let stats = self.lock().tenant_stats(Instant::now());
        stats
            .into_iter()
            .find(|s| s.tenant == tenant)
            .map_or(0.0, |s| s.charged)
    }

    /// Settles `run` with the tenant of `slot` under the lock; a refund may let a request
    /// waiting for pay-back go sooner, so the clock looks again.
    fn settle_locked(&self, gate: &mut GateLock, slot: &Slot, run: Settlement, now: Instant) {
        let added = gate.settle_slot(slot, run.charged, run.took, now);
        if added < 0.0 && gate.has_waiters() && gate.budgeted(&slot.tenant) {
            self.wake.notify_one();
        }
    }

    fn deliver(self: &Arc<Self>, granted: impl IntoIterator<Item = Granted<SlotWaiter>>) {
        for g in granted {
            let answer = SlotAnswer::Granted(g.pass, SlotGuard::new(self, g.slot));
            if let Err(answer) = g.waiter.send(answer) {
                self.unclaimed(answer);
            }
        }
    }

    /// An answer whose client gave up its wait (it left, or its request ended otherwise): a
    /// slot granted goes back, and what its request was charged before the wait is refunded.
    fn unclaimed(self: &Arc<Self>, answer: SlotAnswer) {
        if let SlotAnswer::Granted(mut pass, guard) = answer {
            drop(guard);
            self.refund(&mut pass);
        }
    }

    /// Ends the waits that are over, gives notices to those waiting past query_wait_notify,
    /// and hands out slots as debts are paid back; runs for the life of the process.
    pub async fn clock(self: Arc<Self>) {
        loop {
            let notified = self.wake.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let now = Instant::now();
            let mut notices = Vec::new();
            let (expired, granted, at) = {
                let mut gate = self.lock();
                let live = |w: &SlotWaiter| !w.is_closed();
                let notice = |w: &SlotWaiter| notices.extend(w.notifier());
                let (expired, granted) = gate.clock_turn(now, live, notice);
                // Never spin: at least a millisecond between rounds.
                let at = gate
                    .next_wake(now)
                    .map(|t| t.max(now + Duration::from_millis(1)));
                gate.clock_sleeps(at);
                (expired, granted, at)
            };
            self.answer(expired);
            self.deliver(granted);
            for notice in notices {
                notice.notify();
            }
            match at {
                Some(at) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(at.into()) => {}
                        _ = &mut notified => {}
                    }
                }
                None => notified.await,
            }
        }
    }
}

/// A wait for a slot, as [`Gatekeeper::acquire`] starts it.
#[derive(Debug)]
pub enum Acquire<'a> {
    /// A slot was free: no wait.
    Answered(SlotAnswer),
    /// The ticket waits in the gate's queue.
    Queued(SlotWait<'a>),
}

#[cfg(test)]
impl Acquire<'_> {
    /// The answer, any notice before it passed over.
    pub async fn answer(self) -> SlotAnswer {
        let mut wait = match self {
            Acquire::Answered(answer) => return answer,
            Acquire::Queued(wait) => wait,
        };
        loop {
            if let WaitNews::Answer(answer) = wait.next().await {
                return answer;
            }
        }
    }
}

/// A ticket waiting in the gate's queue: dropped, it is withdrawn.
#[derive(Debug)]
pub struct SlotWait<'a> {
    withdraw: Withdraw<'a>,
    /// When it joined the queue.
    since: Instant,
}

/// What a waiting ticket hears next.
#[derive(Debug)]
pub enum WaitNews {
    /// Its client is to be told it is queued (query_wait_notify); it still waits.
    Notice,
    /// The wait is over.
    Answer(SlotAnswer),
}

impl SlotWait<'_> {
    /// What comes next, polled: a notice (the ticket still waits), or the answer (the wait
    /// is over, and is not polled again). Polled by hand, so that a session waits for it and
    /// reads its client in one poll.
    pub fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<WaitNews> {
        let answer = match ready!(self.withdraw.mailbox.poll_heard(cx)) {
            Heard::Notice => return Poll::Ready(WaitNews::Notice),
            Heard::Answer(answer) => answer,
            // The gate dropped the ticket without an answer (it does not while the client
            // waits): a refusal is the safe reading.
            Heard::Unanswered => {
                let keeper = self.withdraw.keeper;
                let id = self.withdraw.id.take();
                let pass = id.and_then(|id| keeper.lock().withdraw(id, Instant::now()));
                let pass = pass.map(|(p, _)| p);
                SlotAnswer::Refused(pass, Refusal::queue_timeout(self.since.elapsed()))
            }
        };
        self.withdraw.id = None;
        Poll::Ready(WaitNews::Answer(answer))
    }

    /// [`poll_next`](Self::poll_next), awaited.
    #[cfg(test)]
    pub async fn next(&mut self) -> WaitNews {
        std::future::poll_fn(|cx| self.poll_next(cx)).await
    }
}

/// Takes a waiting ticket out when its client stops waiting.
#[derive(Debug)]
struct Withdraw<'a> {
    keeper: &'a Arc<Gatekeeper>,
    id: Option<crate::gate::TicketId>,
    mailbox: &'a SlotMailbox,
}

impl Drop for Withdraw<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.keeper.lock().withdraw(id, Instant::now());
            // A slot granted just before, not yet taken, goes back (outside the gate's lock).
            if let Some(answer) = self.mailbox.close() {
                self.keeper.unclaimed(answer);
            }
            self.keeper.wake.notify_one();
        }
    }
}

/// A slot held by a session: given back when dropped (the server owes nothing more, or the
/// session ended), and the next waiter served.
#[derive(Debug)]
pub struct SlotGuard {
    keeper: Arc<Gatekeeper>,
    slot: Option<Slot>,
    /// A run of the slot's tenant, settled when the slot goes back.
    run: Option<Settlement>,
}

/// A run's time, in seconds: charged before it ran, and what it took (see
/// [`Gatekeeper::settle`]); and when it ended.
#[derive(Clone, Copy, Debug)]
struct Settlement {
    charged: f64,
    took: f64,
    at: Instant,
}

impl SlotGuard {
    fn new(keeper: &Arc<Gatekeeper>, slot: Slot) -> SlotGuard {
        SlotGuard {
            keeper: keeper.clone(),
            slot: Some(slot),
            run: None,
        }
    }

    /// The slot.
    pub fn slot(&self) -> Option<&Slot> {
        self.slot.as_ref()
    }

    /// Keeps a run of `tenant` that ended at `at` to settle in the same turn of the gate's
    /// lock as the slot's release, which the caller is about to drop this guard for (the
    /// release then reads no clock of its own); false when it cannot (the run is not the
    /// slot's tenant's, or one is kept already): the caller settles it now.
    pub fn settle_on_release(
        &mut self,
        tenant: &str,
        charged: f64,
        took: Duration,
        at: Instant,
    ) -> bool {
        let own = self.slot.as_ref().is_some_and(|s| *s.tenant == *tenant);
        if !own || self.run.is_some() {
            return false;
        }
        let took = took.as_secs_f64();
        self.run = Some(Settlement { charged, took, at });
        true
    }

    /// Settles the run kept for the release now, in a turn of the lock of its own: the
    /// release is to wait for something first.
    pub fn settle_kept(&mut self) {
        if let (Some(slot), Some(run)) = (&self.slot, self.run.take()) {
            let mut gate = self.keeper.lock();
            self.keeper.settle_locked(&mut gate, slot, run, run.at);
        }
    }
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            self.keeper.release(slot, self.run.take());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gate::RequestKind;
    use crate::sql::{Fingerprint, Priority};

    fn request(client_id: u64, now: Instant) -> Request<'static> {
        Request {
            client_id,
            tenant: "acme",
            priority: Priority::Normal,
            kind: RequestKind::Statement,
            fingerprint: Some(Fingerprint(0xabc)),
            upstream: "db1",
            pool: "db1/app",
            // One server, so one slot.
            pool_size: 1,
            database_cap: 0,
            database: "db1",
            sent_at: now,
            statement_timeout: None,
            deadline: None,
            hint: None,
        }
    }

    const PRICE: Cost = Cost {
        seconds: 0.001,
        known: true,
        learned: true,
    };

    fn locks(keeper: &Gatekeeper) -> u64 {
        keeper.lock_counts().0
    }

    #[test]
    fn a_request_priced_before_admission_is_admitted_charged_and_seated_in_one_turn() {
        let keeper = Gatekeeper::new();
        let now = Instant::now();
        let before = locks(&keeper);
        let first = keeper.admit(&request(1, now), now, Some((PRICE, true)), None);
        assert_eq!(locks(&keeper), before + 1);
        assert!(matches!(first.decision, Decision::Admit(ref p) if p.paid().is_some()));
        let Some(Ok((Spent::Run { .. }, SlotLook::Taken(slot)))) = first.paid else {
            panic!("no slot with the charge: {:?}", first.paid);
        };
        // The only slot is held: the next one is charged and finds it taken.
        let second = keeper.admit(&request(2, now), now, Some((PRICE, true)), None);
        assert!(matches!(
            second.paid,
            Some(Ok((Spent::Run { .. }, SlotLook::Full)))
        ));
        // Charged, but asked for no slot (its server comes first): the gate never looked,
        // so it cannot say the lane is full, even while it is.
        let third = keeper.admit(&request(3, now), now, Some((PRICE, false)), None);
        assert!(matches!(
            third.paid,
            Some(Ok((Spent::Run { .. }, SlotLook::NotAsked)))
        ));
        assert!(matches!(third.decision, Decision::Admit(ref p) if p.paid().is_some()));
        drop(slot);
        let fourth = keeper.admit(&request(4, now), now, Some((PRICE, true)), None);
        assert!(matches!(fourth.paid, Some(Ok((_, SlotLook::Taken(_))))));
    }

    #[test]
    fn a_request_without_a_price_or_refused_at_admission_is_not_charged() {
        let keeper = Gatekeeper::new();
        let now = Instant::now();
        let unpriced = keeper.admit(&request(1, now), now, None, None);
        assert!(unpriced.paid.is_none());
        assert!(matches!(unpriced.decision, Decision::Admit(ref p) if p.paid().is_none()));
        keeper.kill(
            KillTarget::Tenant("acme".to_string()),
            Duration::from_secs(60),
            false,
        );
        let killed = keeper.admit(&request(2, now), now, Some((PRICE, true)), None);
        assert!(matches!(killed.decision, Decision::Refuse(_)));
        assert!(killed.paid.is_none());
    }

    #[test]
    fn runs_settled_on_release_are_settled_in_the_releases_turn_of_the_lock() {
        let keeper = Gatekeeper::new();
        let now = Instant::now();
        let admitted = keeper.admit(&request(1, now), now, Some((PRICE, true)), None);
        let Some(Ok((_, SlotLook::Taken(mut slot)))) = admitted.paid else {
            panic!("a slot: {:?}", admitted.paid);
        };
        let second = keeper.admit(&request(2, now), now, None, None);
        let Decision::Admit(waiting) = second.decision else {
            panic!("admitted");
        };
        assert!(
            keeper.try_acquire(&waiting).is_none(),
            "the one slot is held"
        );
        // The run took a second where a millisecond was charged; one run is kept, and
        // neither a second nor another tenant's.
        let took = Duration::from_secs(1);
        assert!(slot.settle_on_release("acme", PRICE.seconds, took, now));
        assert!(!slot.settle_on_release("acme", 0.0, took, now));
        assert!(!slot.settle_on_release("other", 0.0, took, now));
        assert!(
            keeper.charged_of("acme") < 0.01,
            "nothing settled before the release"
        );
        let before = locks(&keeper);
        drop(slot);
        assert_eq!(
            locks(&keeper),
            before + 1,
            "settled and released in one turn"
        );
        assert!((keeper.charged_of("acme") - 1.0).abs() < 1e-6);
        assert!(keeper.try_acquire(&waiting).is_some(), "the slot is back");
    }

    /// A wait given up as its slot comes (granted, not yet taken): the slot goes back, and
    /// what the request was charged before its wait is refunded, as for a wait withdrawn.
    #[test]
    fn a_slot_granted_to_a_wait_given_up_is_not_charged() {
        use std::future::Future;
        use std::task::{Context, Waker};
        let keeper = Gatekeeper::new();
        let now = Instant::now();
        let first = keeper.admit(&request(1, now), now, Some((PRICE, true)), None);
        let Some(Ok((_, SlotLook::Taken(slot)))) = first.paid else {
            panic!("a slot: {:?}", first.paid);
        };
        let second = keeper.admit(&request(2, now), now, Some((PRICE, true)), None);
        let Decision::Admit(pass) = second.decision else {
            panic!("admitted");
        };
        assert!((keeper.charged_of("acme") - 2.0 * PRICE.seconds).abs() < 1e-9);
        let mailbox = Arc::new(SlotMailbox::default());
        let mut acquire = Box::pin(
            keeper
                .acquire(pass, &mailbox, |_| Vec::new(), None)
                .answer(),
        );
        let mut cx = Context::from_waker(Waker::noop());
        assert!(acquire.as_mut().poll(&mut cx).is_pending(), "it waits");
        // The slot goes back and is granted to the wait, which is given up before it looks.
        drop(slot);
        drop(acquire);
        assert!(
            (keeper.charged_of("acme") - PRICE.seconds).abs() < 1e-9,
            "charged for a slot it never took: {}",
            keeper.charged_of("acme")
        );
        let third = keeper.admit(&request(3, now), now, None, None);
        let Decision::Admit(third) = third.decision else {
            panic!("admitted");
        };
        assert!(keeper.try_acquire(&third).is_some(), "the slot is back");
    }

    /// query_wait_notify: the gate's clock tells a wait once it has waited that long, and
    /// the wait goes on to its slot; one answered at once hears nothing.
    #[tokio::test]
    async fn a_wait_hears_its_notice_from_the_clock_and_then_its_slot() {
        let keeper = Gatekeeper::new();
        let clock = tokio::spawn(Arc::clone(&keeper).clock());
        let now = Instant::now();
        let first = keeper.admit(&request(1, now), now, Some((PRICE, true)), None);
        let Some(Ok((_, SlotLook::Taken(slot)))) = first.paid else {
            panic!("a slot: {:?}", first.paid);
        };
        let Decision::Admit(pass) = keeper.admit(&request(2, now), now, None, None).decision else {
            panic!("admitted");
        };
        let mailbox = Arc::new(SlotMailbox::default());
        let notify = Some(Duration::from_millis(30));
        let Acquire::Queued(mut wait) = keeper.acquire(pass, &mailbox, |_| Vec::new(), notify)
        else {
            panic!("the one slot is held");
        };
        let heard = tokio::time::timeout(Duration::from_secs(5), wait.next()).await;
        let WaitNews::Notice = heard.expect("told before the queue timeout") else {
            panic!("no slot came");
        };
        assert!(now.elapsed() >= Duration::from_millis(30), "told too soon");
        drop(slot);
        let WaitNews::Answer(SlotAnswer::Granted(pass, slot)) = wait.next().await else {
            panic!("the slot given back");
        };
        drop(slot);
        let quick = keeper.acquire(pass, &mailbox, |_| Vec::new(), notify);
        assert!(matches!(quick, Acquire::Answered(SlotAnswer::Granted(..))));
        clock.abort();
    }

    /// Sessions on two threads take turns at two slots, a third of them giving up their wait
    /// at any moment (a slot may be on its way to them): every wait ends, and afterwards no
    /// slot is held and no ticket waits.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn waits_given_up_at_any_moment_leave_no_slot_held() {
        let keeper = Gatekeeper::new();
        let clock = tokio::spawn(Arc::clone(&keeper).clock());
        let sessions: Vec<_> = (0..16u64)
            .map(|client| {
                let keeper = Arc::clone(&keeper);
                tokio::spawn(async move {
                    let mailbox = Arc::new(SlotMailbox::default());
                    for round in 0..200u64 {
                        let now = Instant::now();
                        let request = Request {
                            pool_size: 2,
                            ..request(client, now)
                        };
                        let Decision::Admit(pass) =
                            keeper.admit(&request, now, None, None).decision
                        else {
                            panic!("admitted");
                        };
                        // Every other wait hears a notice from the clock first, or does not
                        // (given up or granted as it comes).
                        let notify = (round % 2 == 0).then(|| Duration::from_micros(500));
                        let acquire = keeper
                            .acquire(pass, &mailbox, |_| Vec::new(), notify)
                            .answer();
                        // Given up after 0 to 2.1 ms: often as a slot comes (the slots are
                        // held about a millisecond at a time).
                        let give_up = Duration::from_micros(700 * (round % 4));
                        let answer = match (client + round) % 3 {
                            0 => tokio::time::timeout(give_up, acquire).await.ok(),
                            _ => Some(acquire.await),
                        };
                        if let Some(SlotAnswer::Granted(_, guard)) = answer {
                            tokio::time::sleep(Duration::from_micros(100)).await;
                            drop(guard);
                        }
                    }
                })
            })
            .collect();
        for session in sessions {
            tokio::time::timeout(Duration::from_secs(60), session)
                .await
                .expect("every wait ended (no answer or wake-up lost)")
                .expect("the session ran");
        }
        clock.abort();
        let lanes = keeper.lock().lanes();
        assert!(
            lanes.iter().all(|l| l.running == 0 && l.waiting == 0),
            "{lanes:?}"
        );
    }
}
