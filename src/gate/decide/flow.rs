//! Admission, spending and refunds; kills.

use super::*;
use crate::gate::pass::PassFields;
use crate::gate::RequestKind;

/// Databases where one statement is kept in quarantine at most (scanned under the gate's lock
/// at each of its admissions).
const MAX_QUARANTINED_PLACES: usize = 64;

/// Statements kept in quarantine at most (a flood of flips cannot grow the map).
const MAX_QUARANTINED: usize = 10_000;

/// Most seconds of moved lock waits a tenant's next runs are charged less (so a wait that
/// was never settled, such as pgward's own EXPLAIN's, cannot erase much of later work).
pub const MAX_CREDIT: f64 = 60.0;

impl<W> Gate<W> {
    fn next_ticket(&mut self) -> TicketId {
        self.next_id += 1;
        TicketId(self.next_id)
    }

    /// The first decision on a request, before it is priced: kills, deadline, and the cheap
    /// budget check (reserve): if the tenant already owes time, there is no point paying
    /// for an EXPLAIN. Transaction control never waits and is charged `min_charge`.
    pub fn admit(&mut self, req: &Request, now: Instant) -> Decision {
        self.admit_hinted(req, now, None).0
    }

    /// [`admit`](Self::admit), with a new hint for the session's next request when the one
    /// `req` brought did not hold (see [`Hint`]). The pass is made in `spare`'s allocation,
    /// if given.
    pub fn admit_hinted(
        &mut self,
        req: &Request,
        now: Instant,
        spare: Option<Pass>,
    ) -> (Decision, Option<Box<Hint>>) {
        let (upstream, pool_hinted) = self.note_pool_at(req);
        if req.kind.killable() {
            if let Some(target) = self.kills.is_killed(req.tenant, req.fingerprint, now) {
                let refusal = Refusal::killed(&target.describe());
                return (
                    Decision::Refuse(self.refused(req.subject(), refusal, now)),
                    None,
                );
            }
        }
        let hinted = Hinted {
            pool: pool_hinted,
            tenant: self.hinted_tenant(req),
        };
        let pass = self.new_pass(req, upstream, hinted, now, spare);
        let hint = match (hinted.pool, hinted.tenant) {
            (true, Some(_)) => None,
            _ => self.hint(req, &pass),
        };
        (self.decide(req, pass, now), hint)
    }

    /// What becomes of `pass`, made for `req`, after the kills.
    fn decide(&mut self, req: &Request, pass: Pass, now: Instant) -> Decision {
        if !req.kind.waits_for_slot() {
            return Decision::Bypass(self.charge_min(pass, now));
        }
        if self.settings.adaptive.is_some() {
            self.adapt(req.upstream, now);
        }
        if pass.deadline.is_some_and(|d| d <= now) {
            return Decision::Refuse(self.refused(req.subject(), Refusal::deadline(), now));
        }
        let mut pass = pass;
        if self.is_quarantined(req.database, req.fingerprint, now) {
            pass.lane = Lane::Slow;
        }
        self.reserve(pass, now)
    }

    /// The plan of statement `fingerprint` flipped in `database`: for `flip_quarantine` (if
    /// set) it runs in the slow lane there, where it can only hurt other slow work (the same
    /// statement in another database keeps its plan). Until when it was quarantined.
    pub fn quarantine(
        &mut self,
        database: &str,
        fingerprint: Fingerprint,
        now: Instant,
    ) -> Option<Instant> {
        let until = now.checked_add(self.settings.flip_quarantine?)?;
        if self.quarantined.len() >= MAX_QUARANTINED {
            self.quarantined.retain(|_, places| {
                places.retain(|(_, end)| *end > now);
                !places.is_empty()
            });
        }
        if self.quarantined.len() >= MAX_QUARANTINED && !self.quarantined.contains_key(&fingerprint)
        {
            return None;
        }
        let places = self.quarantined.entry(fingerprint).or_default();
        let full = places.len() >= MAX_QUARANTINED_PLACES;
        match places.iter_mut().find(|(d, _)| &**d == database) {
            Some(place) => place.1 = until,
            None if !full => places.push((database.into(), until)),
            None => return None,
        }
        Some(until)
    }

    fn is_quarantined(
        &mut self,
        database: &str,
        fingerprint: Option<Fingerprint>,
        now: Instant,
    ) -> bool {
        let Some(fp) = fingerprint.filter(|_| !self.quarantined.is_empty()) else {
            return false;
        };
        let Some(places) = self.quarantined.get_mut(&fp) else {
            return false;
        };
        places.retain(|(_, until)| *until > now);
        let here = places.iter().any(|(d, _)| &**d == database);
        if places.is_empty() {
            self.quarantined.remove(&fp);
        }
        here
    }

    /// A pass for a client that needs a server for messages carrying no request of their
    /// own (a Parse, a Describe, a Sync): no budget is looked at and nothing is charged, but
    /// the server is taken with a slot like any other.
    pub fn server_pass(&mut self, req: &Request, now: Instant) -> Pass {
        let (upstream, pool) = self.note_pool_at(req);
        let tenant = self.hinted_tenant(req);
        let mut pass = self.new_pass(req, upstream, Hinted { pool, tenant }, now, None);
        pass.kind = RequestKind::Carrier;
        pass.deadline = None;
        pass.payment = Payment::Paid(0.0);
        pass
    }

    /// A pass for `req`, whose upstream is kept at `upstream`; what its hint held is
    /// `hinted`.
    fn new_pass(
        &mut self,
        req: &Request,
        upstream: Place,
        hinted: Hinted,
        now: Instant,
        spare: Option<Pass>,
    ) -> Pass {
        let id = self.next_ticket();
        let database = match (req.hint, hinted.pool) {
            (Some(h), true) => Arc::clone(&h.database),
            _ => self.names.get(req.database),
        };
        let tenant = match hinted.tenant {
            Some(place) => place,
            None => self.tenant_place(req.tenant, now),
        };
        let places = Places { tenant, upstream };
        // The registries keep the names the gate shares.
        let tenant = Arc::clone(self.tenants.name_at(places.tenant));
        let upstream = Arc::clone(self.upstreams.name_at(upstream));
        let config = &self.tenants.at(places.tenant).config;
        let limits = [
            req.statement_timeout,
            req.deadline,
            config.timeouts.statement,
        ];
        let within = limits.into_iter().flatten().filter(|d| !d.is_zero()).min();
        let fields = PassFields {
            id,
            client_id: req.client_id,
            tenant,
            priority: config.priority.unwrap_or(req.priority),
            kind: req.kind,
            fingerprint: req.fingerprint,
            upstream,
            database,
            lane: Lane::Fast,
            sent_at: req.sent_at,
            deadline: within.and_then(|d| req.sent_at.checked_add(d)),
            enqueued_at: None,
            notify_at: None,
            waited: Duration::ZERO,
            waited_for_budget: false,
            payment: Payment::Unpaid,
            places,
        };
        Pass::new_in(fields, spare)
    }

    fn charge_min(&mut self, mut pass: Pass, now: Instant) -> Pass {
        let state = self.tenant_at(pass.places, &pass.tenant, now);
        let min = state.config.min_charge();
        let charged = match (&mut state.bucket, state.budget) {
            (Some(bucket), Some(b)) => bucket.force_charge(&b, min, now),
            _ => charge_of(min, min),
        };
        state.record_charge(charged, now);
        pass.payment = Payment::Paid(charged);
        pass
    }

    fn reserve(&mut self, mut pass: Pass, now: Instant) -> Decision {
        let state = self.tenant_at(pass.places, &pass.tenant, now);
        if !state.owes(now) {
            return Decision::Admit(pass);
        }
        match state.config.when_over {
            WhenOver::Reject => Decision::Refuse(self.budget_refusal(pass.subject(), now)),
            WhenOver::Wait => {
                pass.payment = Payment::AwaitingPayBack;
                Decision::Admit(pass)
            }
            WhenOver::Slow => {
                pass.lane = Lane::Slow;
                Decision::Admit(pass)
            }
        }
    }

    /// 53000 with a hint: the time until the debt is paid back, plus jitter.
    fn budget_refusal(&mut self, who: Subject<'_>, now: Instant) -> Refusal {
        let tenant = who.tenant;
        let state = self.tenant_mut(tenant, now);
        let (owed, pay_back) = match (&state.bucket, state.budget) {
            (Some(bucket), Some(b)) => (-bucket.balance(&b, now), bucket.pay_back(&b, now)),
            _ => (0.0, None),
        };
        let base = pay_back.unwrap_or(Duration::from_secs(1)).as_secs_f64();
        let spread = (base * self.settings.jitter.max(0.0)).max(0.05);
        let jitter = self.rng.gen_range(0.0..spread);
        let retry = Duration::try_from_secs_f64(base + jitter).unwrap_or(Duration::MAX);
        let refusal = Refusal::budget(tenant, owed, retry);
        self.refused(who, refusal, now)
    }

    /// The real budget decision, once the predicted time is known: check and charge in one
    /// step, so a second statement of the tenant sees what the first spent. A statement
    /// whose tenant owes nothing is charged its whole predicted time, even into debt; once it
    /// has run, [`settle`](Self::settle) charges what it really took instead. Refused, as
    /// well, when its predicted time does not fit before its deadline (57014, nothing
    /// charged). A pass that has paid already is not charged again.
    pub fn spend(&mut self, pass: &mut Pass, cost: Cost, now: Instant) -> Result<Spent, Refusal> {
        if let Payment::Paid(charged) = pass.payment {
            return Ok(Spent::Run { charged });
        }
        if let Some(refusal) = deadline_check(pass, &cost, now) {
            self.tenant_at(pass.places, &pass.tenant, now)
                .unpaid
                .remove(&pass.id);
            return Err(self.refused(pass.subject(), refusal, now));
        }
        // Priced: its tenant's next unpaid request may take a slot (the caller offers it).
        let state = self.tenant_at(pass.places, &pass.tenant, now);
        state.unpaid.remove(&pass.id);
        let min = state.config.min_charge();
        let charged = match (&mut state.bucket, state.budget) {
            // Moved to the slow lane for being over budget: it runs there, into debt. (A pass
            // in the slow lane for a plan flip pays as any other.)
            (Some(bucket), Some(b))
                if pass.lane == Lane::Slow && state.config.when_over == WhenOver::Slow =>
            {
                Some(bucket.force_charge(&b, cost.seconds, now))
            }
            (Some(bucket), Some(b)) => bucket.try_charge(&b, cost.seconds, now),
            _ => Some(charge_of(cost.seconds, min)),
        };
        let Some(charged) = charged else {
            return self.over_budget(pass, now);
        };
        state.record_charge(charged, now);
        pass.payment = Payment::Paid(charged);
        Ok(Spent::Run { charged })
    }

    /// Charges `pass` its whole predicted time whatever its tenant owes: a request that must
    /// run now because its pipeline is already on the server (it cannot wait or change lanes
    /// there).
    pub fn force_spend(&mut self, pass: &mut Pass, seconds: f64, now: Instant) -> f64 {
        if let Payment::Paid(charged) = pass.payment {
            return charged;
        }
        let state = self.tenant_at(pass.places, &pass.tenant, now);
        state.unpaid.remove(&pass.id);
        let min = state.config.min_charge();
        let charged = match (&mut state.bucket, state.budget) {
            (Some(bucket), Some(b)) => bucket.force_charge(&b, seconds, now),
            _ => charge_of(seconds, min),
        };
        state.record_charge(charged, now);
        pass.payment = Payment::Paid(charged);
        charged
    }

    /// Work of `tenant` that was charged `charged` seconds before it ran took `took`: the
    /// difference is charged (even into debt) or given back (within the burst). Seconds of
    /// lock waits already moved to the tenants it waited for (its credit) are taken off what
    /// it took. Returns the seconds added (negative when given back).
    pub fn settle(&mut self, tenant: &str, charged: f64, took: f64, now: Instant) -> f64 {
        let place = self.tenant_place(tenant, now);
        self.settle_in(place, charged, took, now)
    }

    /// [`settle`](Self::settle) for the tenant of `slot`.
    pub fn settle_slot(&mut self, slot: &Slot, charged: f64, took: f64, now: Instant) -> f64 {
        let place = self.tenant_place_at(slot.places, &slot.tenant, now);
        self.settle_in(place, charged, took, now)
    }

    /// [`settle`](Self::settle) for the tenant at `place`.
    fn settle_in(&mut self, place: Place, charged: f64, took: f64, now: Instant) -> f64 {
        let took = if took.is_finite() { took.max(0.0) } else { 0.0 };
        self.totals.ran += took;
        let state = self.tenants.at_mut(place);
        state.ran += took;
        let moved = took.min(state.credit);
        state.credit -= moved;
        let delta = took - moved - charged.max(0.0);
        if let (Some(bucket), Some(b)) = (&mut state.bucket, state.budget) {
            match delta >= 0.0 {
                true => {
                    let exact = Budget {
                        min_charge: 0.0,
                        ..b
                    };
                    bucket.force_charge(&exact, delta, now);
                }
                false => bucket.refund(&b, -delta, now),
            }
        }
        state.recent.add(delta, now);
        state.charged = (state.charged + delta).max(0.0);
        delta
    }

    /// Moves `seconds` of a running statement of tenant `from` that waited for a lock to
    /// tenant `to` (the blocker pays): `to` is charged now, and `from` is charged that much
    /// less when its statement's run is settled (a credit, at most [`MAX_CREDIT`] seconds).
    pub fn move_charge(&mut self, from: &str, to: &str, seconds: f64, now: Instant) {
        if !(seconds.is_finite() && seconds > 0.0) || from == to {
            return;
        }
        let to_state = self.tenant_mut(to, now);
        if let (Some(bucket), Some(b)) = (&mut to_state.bucket, to_state.budget) {
            let exact = Budget {
                min_charge: 0.0,
                ..b
            };
            bucket.force_charge(&exact, seconds, now);
        }
        to_state.recent.add(seconds, now);
        to_state.charged += seconds;
        let from_state = self.tenant_mut(from, now);
        from_state.credit = (from_state.credit + seconds).min(MAX_CREDIT);
    }

    /// Whether `tenant` has a budget: a refund to it may let its waiting requests go.
    pub fn budgeted(&self, tenant: &str) -> bool {
        self.tenants.get(tenant).is_some_and(|t| t.bucket.is_some())
    }

    /// `tenant` is about to run work whose price nobody knows yet (no plan, never run), as
    /// `id`: its other unpriced requests wait until [`end_unknown`](Self::end_unknown), once
    /// the work has run and taught its time, so a tenant cannot start the same unknown work
    /// on every connection at once. Whether it held (a tenant without a budget is not held).
    pub fn hold_unknown(&mut self, tenant: &str, id: TicketId, now: Instant) -> bool {
        let state = self.tenant_mut(tenant, now);
        state.bucket.is_some() && state.unknown.insert(id)
    }

    /// The unknown work `id` of `tenant` has run (or never will).
    pub fn end_unknown(&mut self, tenant: &str, id: TicketId) {
        if let Some(state) = self.tenants.get_mut(tenant) {
            state.unknown.remove(&id);
        }
    }

    fn over_budget(&mut self, pass: &mut Pass, now: Instant) -> Result<Spent, Refusal> {
        let state = self.tenant_at(pass.places, &pass.tenant, now);
        match state.config.when_over {
            WhenOver::Reject => Err(self.budget_refusal(pass.subject(), now)),
            WhenOver::Slow => {
                pass.lane = Lane::Slow;
                Ok(Spent::MovedToSlow)
            }
            WhenOver::Wait => {
                pass.payment = Payment::AwaitingPayBack;
                Ok(Spent::WaitForBudget {
                    until: state.paid_back_at(now),
                })
            }
        }
    }

    /// Gives back what `pass` was charged (its statement never ran: a refused or timed-out
    /// wait, a client that left); returns the seconds refunded.
    pub fn refund(&mut self, pass: &mut Pass, now: Instant) -> f64 {
        let Payment::Paid(amount) = pass.payment else {
            return 0.0;
        };
        pass.payment = Payment::Unpaid;
        let state = self.tenant_at(pass.places, &pass.tenant, now);
        if let (Some(bucket), Some(b)) = (&mut state.bucket, state.budget) {
            bucket.refund(&b, amount, now);
        }
        state.recent.add(-amount, now);
        state.charged -= amount;
        amount
    }

    /// `KILL TENANT` / `KILL STATEMENT`: 53000 for `duration`, for what comes and (unless
    /// `soft`) for what waits now: the waiting tickets it stops are handed back, refused and
    /// refunded, for the caller to answer.
    pub fn kill(
        &mut self,
        target: KillTarget,
        duration: Duration,
        soft: bool,
        now: Instant,
    ) -> Vec<Expired<W>> {
        self.kills.kill(target.clone(), duration, soft, now);
        if soft {
            return Vec::new();
        }
        let refusal = Refusal::killed(&target.describe());
        self.refuse_waiting(
            |p| p.kind.killable() && target.stops(&p.tenant, p.fingerprint),
            &refusal,
            now,
        )
    }

    /// Whether any kill may be in force.
    pub fn has_kills(&self) -> bool {
        self.kills.any()
    }

    /// `UNKILL`; whether there was such a kill.
    pub fn unkill(&mut self, target: &KillTarget) -> bool {
        self.kills.unkill(target)
    }

    /// The kill stopping this statement of `tenant`, if any (checked at every Bind).
    pub fn is_killed(
        &self,
        tenant: &str,
        fingerprint: Option<Fingerprint>,
        now: Instant,
    ) -> Option<&KillTarget> {
        self.kills.is_killed(tenant, fingerprint, now)
    }

    /// The kill stopping this statement of `tenant`, admitted already and about to go out,
    /// if any: a kill issued while it waited, unless soft.
    pub fn stops_admitted(
        &self,
        tenant: &str,
        fingerprint: Option<Fingerprint>,
        now: Instant,
    ) -> Option<&KillTarget> {
        self.kills.stops_admitted(tenant, fingerprint, now)
    }

    /// `SHOW KILLS`.
    pub fn kills(&mut self, now: Instant) -> Vec<KillRow> {
        self.kills.list(now)
    }
}

/// 57014 when the deadline has passed, or the predicted run time does not fit before it.
fn deadline_check(pass: &Pass, cost: &Cost, now: Instant) -> Option<Refusal> {
    let deadline = pass.deadline?;
    let Some(left) = deadline
        .checked_duration_since(now)
        .filter(|l| !l.is_zero())
    else {
        return Some(Refusal::deadline());
    };
    if !cost.learned {
        return None;
    }
    let expected = Duration::try_from_secs_f64(cost.seconds.max(0.0)).unwrap_or(Duration::MAX);
    (expected > left).then(|| Refusal::too_slow(expected, left))
}
