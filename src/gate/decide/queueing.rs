//! Slots and the wait for them. A decision (take a slot, serve the next waiter, give one
//! back, withdraw a ticket) looks at the heads of the tenants' lines and at counts kept as
//! tickets come and go, never at every waiting ticket.

use super::*;
use crate::gate::adapt::Moved;
use crate::gate::fair::Order;
use std::sync::Arc;

/// What else a ticket's chance depends on: the runaways of its upstream, and the slots each
/// of its databases holds there against `max_active_per_database`.
pub(super) struct Room<'a> {
    /// The runaway tenants (none: `None`, which costs nothing to drop).
    demoted: Option<BTreeSet<String>>,
    by_database: Option<&'a NameCounts>,
    per_database: Option<usize>,
    /// One tenant's tickets are ranked, against none of another: its rank orders nothing.
    alone: bool,
}

impl Room<'_> {
    fn database_ok(&self, database: &Arc<str>) -> bool {
        let held = self.by_database.map_or(0, |m| m.get(database));
        self.per_database.is_none_or(|cap| held < cap)
    }
}

/// Whether `pass` may take a slot now, and its tenant's rank.
pub(super) fn rank(
    tenants: &Named<TenantState>,
    room: &Room,
    pass: &Pass,
    now: Instant,
) -> Option<Rank> {
    let state = tenants.get_at(pass.places.tenant, &pass.tenant)?;
    may_take(state, room, pass, now).then(|| match room.alone {
        true => Rank {
            demoted: false,
            score: 0.0,
        },
        false => Rank {
            demoted: room
                .demoted
                .as_ref()
                .is_some_and(|d| d.contains(&*pass.tenant)),
            score: state.recent.value(now) / state.config.share(),
        },
    })
}

/// Whether `pass`, of the tenant in `state`, may take a slot now (whatever its rank).
fn may_take(state: &TenantState, room: &Room, pass: &Pass, now: Instant) -> bool {
    let budget_ok = pass.payment != Payment::AwaitingPayBack || !state.owes(now);
    let in_time = pass.deadline.is_none_or(|d| d > now);
    budget_ok
        && in_time
        && state.has_room()
        && state.may_pay(pass)
        && room.database_ok(&pass.database)
}

/// One lane of one upstream, as SHOW LANES lists it.
#[derive(Clone, Debug, PartialEq)]
pub struct LaneRow {
    /// The PostgreSQL server (host:port).
    pub upstream: String,
    /// The lane.
    pub lane: Lane,
    /// Slots the lane may hand out now: its own limit, within the servers its pools may
    /// open.
    pub limit: usize,
    /// Slots held.
    pub running: usize,
    /// Tickets waiting.
    pub waiting: usize,
    /// The fast lane's ceiling under `adaptive = true` (its `max_active`, within the
    /// servers), `None` otherwise.
    pub ceiling: Option<usize>,
    /// The adaptive limit's last move.
    pub last_move: Option<Moved>,
    /// Its moves up and down since the start.
    pub moves: (u64, u64),
}

/// Idle servers of runaway tenants that may be closed per second, per upstream.
const EVICTIONS_PER_SECOND: f64 = 2.0;
/// At most this many at once.
const EVICTION_BURST: f64 = 4.0;

impl<W> Gate<W> {
    /// Tenants of `upstream` holding more than their share while others wait there.
    pub fn runaways(&self, upstream: &str) -> Vec<Runaway> {
        match self.upstreams.find(upstream) {
            Some(place) => self.runaways_at(place),
            None => Vec::new(),
        }
    }

    /// [`runaways`](Self::runaways) of the upstream at `place`.
    fn runaways_at(&self, place: Place) -> Vec<Runaway> {
        let up = self.upstreams.at(place);
        // A runaway needs another tenant waiting: with one tenant alone (the common case, and
        // at every slot handed over) nothing is counted or allocated.
        let mut waiting = up.waiting.iter().filter(|(_, n)| *n > 0).map(|(t, _)| t);
        let Some(first) = waiting.next() else {
            return Vec::new();
        };
        let alone = up
            .holding
            .iter()
            .all(|(t, n)| n == 0 || Arc::ptr_eq(t, first));
        if waiting.next().is_none() && alone {
            return Vec::new();
        }
        let names: BTreeSet<&Arc<str>> = up
            .waiting
            .iter()
            .chain(up.holding.iter())
            .map(|(n, _)| n)
            .collect();
        let loads: Vec<TenantLoad> = names
            .into_iter()
            .map(|tenant| TenantLoad {
                tenant,
                servers: up.holding.get(tenant),
                waiting: up.waiting.get(tenant),
                share: self.tenants.get(tenant).map_or(1.0, |t| t.config.share()),
            })
            .collect();
        runaways(&loads, up.slots())
    }

    /// [`evictions_near`](Self::evictions_near) of the upstream named `upstream`.
    #[cfg(test)]
    pub fn evictions(&mut self, upstream: &str, now: Instant) -> Vec<(String, usize)> {
        match self.upstreams.find(upstream) {
            Some(place) => self.evictions_at(place, now),
            None => Vec::new(),
        }
    }

    /// How many idle servers of each runaway tenant of the upstream of a ticket just queued
    /// (`near`: found at its place, no name looked up) to close now: each its excess (rounded
    /// up), within a small budget per second, so that sustained pressure closes a few servers
    /// a second and never all of them at every wait.
    pub fn evictions_near(&mut self, near: Near<'_>, now: Instant) -> Vec<(String, usize)> {
        match self.upstreams.locate(near.places.upstream, near.upstream) {
            Some(place) => self.evictions_at(place, now),
            None => Vec::new(),
        }
    }

    /// [`evictions_near`](Self::evictions_near) on the upstream at `place`.
    fn evictions_at(&mut self, place: Place, now: Instant) -> Vec<(String, usize)> {
        let over = self.runaways_at(place);
        if over.is_empty() {
            return Vec::new();
        }
        let up = self.upstreams.at_mut(place);
        let refill = match up.evicted_at {
            Some(at) => now.saturating_duration_since(at).as_secs_f64() * EVICTIONS_PER_SECOND,
            None => EVICTION_BURST,
        };
        up.evict_tokens = (up.evict_tokens + refill).min(EVICTION_BURST);
        up.evicted_at = Some(now);
        let mut out = Vec::new();
        for r in over {
            let done = up.evicted.get(&r.tenant).copied().unwrap_or(0);
            let excess = (r.excess().ceil().max(0.0) as usize).saturating_sub(done);
            let n = excess.min(up.evict_tokens.floor() as usize);
            if n == 0 {
                continue;
            }
            up.evict_tokens -= n as f64;
            *up.evicted.entry(r.tenant.clone()).or_default() += n;
            out.push((r.tenant, n));
        }
        out
    }

    pub(super) fn room(&self, upstream: &str) -> Room<'_> {
        match self.upstreams.find(upstream) {
            Some(place) => self.room_at(place),
            None => Room {
                demoted: None,
                by_database: None,
                per_database: self.settings.per_database,
                alone: false,
            },
        }
    }

    /// [`room`](Self::room) at the upstream at `place`.
    fn room_at(&self, place: Place) -> Room<'_> {
        Room {
            demoted: self.demoted_at(place),
            by_database: Some(&self.upstreams.at(place).by_database),
            per_database: self.settings.per_database,
            alone: false,
        }
    }

    /// [`room_at`](Self::room_at) for ranking the tickets of one tenant line alone: who is
    /// a runaway, and the tenant's recent use, only order tenants against each other.
    fn room_alone_at(&self, place: Place) -> Room<'_> {
        Room {
            demoted: None,
            by_database: Some(&self.upstreams.at(place).by_database),
            per_database: self.settings.per_database,
            alone: true,
        }
    }

    /// Of `asked` idle servers of `tenant` that [`evictions_near`](Self::evictions_near) said
    /// to close, only `closed` were there: the rest is not counted as done, and its tokens
    /// come back.
    pub fn evicted_fewer(&mut self, upstream: &str, tenant: &str, asked: usize, closed: usize) {
        let missing = asked.saturating_sub(closed);
        if missing == 0 {
            return;
        }
        let up = self.upstream_mut(upstream);
        if let Some(done) = up.evicted.get_mut(tenant) {
            *done = done.saturating_sub(missing);
        }
        up.evict_tokens = (up.evict_tokens + missing as f64).min(EVICTION_BURST);
    }

    fn demoted_at(&self, place: Place) -> Option<BTreeSet<String>> {
        // Nobody waits: nobody is a runaway (and nothing is allocated).
        if !self.upstreams.at(place).anyone_waits() {
            return None;
        }
        let runaways = self.runaways_at(place);
        (!runaways.is_empty()).then(|| runaways.into_iter().map(|r| r.tenant).collect())
    }

    /// Takes a slot at once if the lane has one free and no waiting ticket may take it
    /// first; otherwise the caller queues the pass with [`enqueue`](Self::enqueue).
    pub fn try_acquire(&mut self, pass: &Pass, now: Instant) -> Option<Slot> {
        // A full lane first: it needs no look at who holds what.
        if !self
            .upstream_at(pass.places, &pass.upstream)
            .room_for(pass.lane, pass.priority)
        {
            return None;
        }
        if self.settings.adaptive.is_some() && self.shed_now(pass, now) {
            // It queues, and the clock turns it away at once.
            return None;
        }
        let up = self
            .upstreams
            .get_at(pass.places.upstream, &pass.upstream)?;
        if !up.anyone_waits() {
            // Nobody waits here (the common case): nobody goes first and nobody is a
            // runaway, so only whether it may take a slot at all is left.
            let room = Room {
                demoted: None,
                by_database: Some(&up.by_database),
                per_database: self.settings.per_database,
                alone: false,
            };
            let state = self.tenants.get_at(pass.places.tenant, &pass.tenant)?;
            return may_take(state, &room, pass, now).then(|| self.take_slot(pass, now));
        }
        let place = self
            .upstreams
            .locate(pass.places.upstream, &pass.upstream)?;
        let room = self.room_at(place);
        rank(&self.tenants, &room, pass, now)?;
        let up = self
            .upstreams
            .get_at(pass.places.upstream, &pass.upstream)?;
        let someone_first = [Lane::Fast, Lane::Slow].into_iter().any(|lane| {
            up.may_serve(lane)
                && up
                    .lane_ref(lane)
                    .queue
                    .best(|p| {
                        up.room_for(lane, p.priority)
                            .then(|| rank(&self.tenants, &room, p, now))?
                    })
                    .is_some()
        });
        if someone_first {
            return None;
        }
        Some(self.take_slot(pass, now))
    }

    fn take_slot(&mut self, pass: &Pass, now: Instant) -> Slot {
        let up = self.upstream_at(pass.places, &pass.upstream);
        let lane = up.lane(pass.lane).0;
        lane.active += 1;
        let crowd = lane.active;
        if pass.lane == Lane::Fast {
            Self::note_taken(up);
        }
        up.holding.add(&pass.tenant);
        up.by_database.add(&pass.database);
        let state = self.tenant_at(pass.places, &pass.tenant, now);
        state.running += 1;
        if !matches!(pass.payment, Payment::Paid(_)) && state.bucket.is_some() {
            state.unpaid.insert(pass.id);
        }
        Slot {
            id: pass.id,
            upstream: pass.upstream.clone(),
            database: pass.database.clone(),
            lane: pass.lane,
            tenant: pass.tenant.clone(),
            crowd,
            places: pass.places,
        }
    }

    /// Queues `pass` for a slot in its lane; `waiter` is told through
    /// [`next_waiter`](Self::next_waiter) or [`expire`](Self::expire). Whether the clock must
    /// look again for it: a lane of its upstream has a free slot and tickets waiting, or the
    /// ticket has a moment the clock must act at (its wait ends, its client is to be told it
    /// is queued at `pass.notify_at`, or its tenant's debt is paid back) before the clock's
    /// next look.
    pub fn enqueue(&mut self, mut pass: Pass, waiter: W, now: Instant) -> bool {
        pass.enqueued_at = Some(now);
        self.tenant_at(pass.places, &pass.tenant, now).waiting += 1;
        let end = wait_end(&pass, self.settings.queue_timeout);
        if let Some(end) = end {
            self.ends.insert(end, pass.id);
        }
        let notice = pass.notify_at;
        if let Some(at) = notice {
            self.notices.insert(at, pass.id);
        }
        let paid = self.paid_back_at(&pass, now);
        self.located
            .insert(pass.id, (pass.upstream.clone(), pass.places, pass.lane));
        let up = self.upstream_at(pass.places, &pass.upstream);
        up.waiting.add(&pass.tenant);
        let lane = up.lane(pass.lane).0;
        lane.waited_since.get_or_insert(now);
        lane.queue.push(pass, waiter);
        // A lane with a free slot and tickets waiting (this one's, or the other lane's after
        // the pools grew): the clock hands it out.
        let free = [Lane::Fast, Lane::Slow]
            .into_iter()
            .any(|l| up.may_serve(l));
        free || self.clock_sleeps_past([end, paid, notice], now)
    }

    /// When `pass`'s tenant's debt is paid back, if it waits for that.
    fn paid_back_at(&self, pass: &Pass, now: Instant) -> Option<Instant> {
        match pass.payment {
            Payment::AwaitingPayBack => self
                .tenants
                .get_at(pass.places.tenant, &pass.tenant)
                .and_then(|t| t.paid_back_at(now)),
            _ => None,
        }
    }

    /// Whether the clock's next look comes after the first of `moments` (or of the adaptive
    /// limit's), or it has not said when it looks.
    fn clock_sleeps_past(&self, moments: [Option<Instant>; 3], now: Instant) -> bool {
        let adaptive = self.adaptive_wake(now, false);
        let need = moments.into_iter().flatten().chain(adaptive).min();
        need.is_some_and(|t| self.clock_until.is_none_or(|at| t < at))
    }

    /// Takes the ticket `id` out of the queue it waits in, with every count that knows it.
    fn take_waiting(&mut self, id: TicketId, now: Instant) -> Option<(Pass, W)> {
        let (upstream, places, lane) = self.located.remove(&id)?;
        let timeout = self.settings.queue_timeout;
        let up = self.upstreams.get_at_mut(places.upstream, &upstream)?;
        let state = up.lane(lane).0;
        let (mut pass, waiter) = state.queue.remove(id)?;
        if state.queue.is_empty() {
            state.waited_since = None;
        }
        up.waiting.sub(&pass.tenant);
        if !up.anyone_waits() {
            // The pressure is over: a tenant over its share next time is evicted anew.
            up.evicted.clear();
        }
        if let Some(end) = wait_end(&pass, timeout) {
            self.ends.remove(end, id);
        }
        if let Some(at) = pass.notify_at.take() {
            self.notices.remove(at, id);
        }
        let state = self.tenant_at(pass.places, &pass.tenant, now);
        state.waiting = state.waiting.saturating_sub(1);
        Some((pass, waiter))
    }

    /// Gives a free slot of the lane to the waiting ticket the gate chooses, if there is a
    /// free slot and a ticket that may take it. Waiters for which `live` is false (clients
    /// that left) are dropped on the way and refunded.
    pub fn next_waiter(
        &mut self,
        upstream: &str,
        lane: Lane,
        now: Instant,
        live: impl Fn(&W) -> bool,
    ) -> Option<Granted<W>> {
        let place = self.upstreams.find(upstream)?;
        self.next_waiter_at(place, lane, now, live)
    }

    /// [`next_waiter`](Self::next_waiter) at the upstream at `place`.
    fn next_waiter_at(
        &mut self,
        place: Place,
        lane: Lane,
        now: Instant,
        live: impl Fn(&W) -> bool,
    ) -> Option<Granted<W>> {
        loop {
            // A full lane or an empty queue first: they need no look at who holds what.
            let up = self.upstreams.at(place);
            if !up.may_serve(lane) {
                return None;
            }
            let queue = &up.lane_ref(lane).queue;
            let room = match queue.lines_waiting() {
                0 | 1 => self.room_alone_at(place),
                _ => self.room_at(place),
            };
            let rank = |p: &Pass| {
                up.room_for(lane, p.priority)
                    .then(|| rank(&self.tenants, &room, p, now))?
            };
            let order = match Self::newest_first(up, lane, now) {
                true => Order::NewestFirst,
                false => Order::OldestFirst,
            };
            let id = queue.best_in(order, rank)?;
            let (mut pass, waiter) = self.take_waiting(id, now)?;
            if live(&waiter) {
                let slot = self.take_slot(&pass, now);
                add_wait(&mut pass, now);
                return Some(Granted { pass, slot, waiter });
            }
            self.drop_pass(pass, now);
        }
    }

    /// Whether any ticket waits, in any lane.
    pub fn has_waiters(&self) -> bool {
        !self.located.is_empty()
    }

    /// Hands out every slot of `upstream` that can be given now (after a release).
    pub fn dispatch_upstream(
        &mut self,
        upstream: &str,
        now: Instant,
        live: impl Fn(&W) -> bool,
    ) -> Grants<W> {
        match self.upstreams.find(upstream) {
            Some(place) => self.dispatch_at(place, now, live),
            None => Grants::new(),
        }
    }

    /// [`dispatch_upstream`](Self::dispatch_upstream) of the upstream of a pass or of a slot
    /// given back.
    pub fn dispatch_near(
        &mut self,
        near: Near<'_>,
        now: Instant,
        live: impl Fn(&W) -> bool,
    ) -> Grants<W> {
        match self.upstreams.locate(near.places.upstream, near.upstream) {
            Some(place) => self.dispatch_at(place, now, live),
            None => Grants::new(),
        }
    }

    /// [`dispatch_upstream`](Self::dispatch_upstream) at the upstream at `place`.
    fn dispatch_at(&mut self, place: Place, now: Instant, live: impl Fn(&W) -> bool) -> Grants<W> {
        let mut granted = Grants::new();
        for lane in [Lane::Fast, Lane::Slow] {
            while let Some(g) = self.next_waiter_at(place, lane, now, &live) {
                granted.push(g);
            }
        }
        granted
    }

    /// Hands out every slot that can be given now, in every lane (after a debt is paid back,
    /// or a change of limits).
    pub fn dispatch(&mut self, now: Instant, live: impl Fn(&W) -> bool) -> Vec<Granted<W>> {
        let mut waiting: Vec<Arc<str>> = self
            .upstreams
            .iter()
            .filter(|(_, u)| u.anyone_waits())
            .map(|(name, _)| name.clone())
            .collect();
        waiting.sort_unstable();
        let mut granted = Vec::new();
        for upstream in waiting {
            granted.extend(self.dispatch_upstream(&upstream, now, &live));
        }
        granted
    }

    /// A slot comes back: PostgreSQL owes its client nothing more. The caller then offers it
    /// with [`next_waiter`](Self::next_waiter). True when the tenant waits on other upstreams
    /// too ([`waits_elsewhere`](Self::waits_elsewhere)): then every upstream is looked at
    /// ([`dispatch`](Self::dispatch)).
    pub fn release(&mut self, slot: &Slot, now: Instant) -> bool {
        let up = self.upstream_at(slot.places, &slot.upstream);
        if slot.lane == Lane::Fast {
            // Full until this moment: it counts for the window.
            Self::note_taken(up);
        }
        let lane = &mut up.lane(slot.lane).0.active;
        *lane = lane.saturating_sub(1);
        up.holding.sub(&slot.tenant);
        up.by_database.sub(&slot.database);
        if let (Lane::Fast, Some(a)) = (slot.lane, up.adaptive.as_mut()) {
            a.note_finished();
            self.adapt(&slot.upstream, now);
        }
        let state = self.tenant_at(slot.places, &slot.tenant, now);
        state.running = state.running.saturating_sub(1);
        state.unpaid.remove(&slot.id);
        self.has_waiters() && self.waits_elsewhere_near(slot.places, &slot.tenant, &slot.upstream)
    }

    /// Whether `tenant` has tickets waiting on another upstream than `upstream`: what holds
    /// them (its `max_active`, its unpaid requests) may have let go of them, and only a look
    /// at every upstream ([`dispatch`](Self::dispatch)) finds them.
    pub fn waits_elsewhere(&self, tenant: &str, upstream: &str) -> bool {
        // (A tenant the gate does not know waits nowhere.)
        self.tenants.find(tenant).is_some_and(|place| {
            let name = self.tenants.name_at(place);
            let up = self.upstreams.get(upstream);
            waits_beyond(Some(self.tenants.at(place)), up, name)
        })
    }

    /// [`waits_elsewhere`](Self::waits_elsewhere) of `pass`'s tenant and upstream.
    pub fn pass_waits_elsewhere(&self, pass: &Pass) -> bool {
        self.waits_elsewhere_near(pass.places, &pass.tenant, &pass.upstream)
    }

    /// [`waits_elsewhere`](Self::waits_elsewhere), given where they were kept.
    fn waits_elsewhere_near(&self, places: Places, tenant: &Arc<str>, upstream: &Arc<str>) -> bool {
        if self.upstreams.len() == 1 {
            // One upstream: every wait is there.
            return false;
        }
        let state = self.tenants.get_at(places.tenant, tenant);
        waits_beyond(
            state,
            self.upstreams.get_at(places.upstream, upstream),
            tenant,
        )
    }

    /// Takes a waiting ticket out (its client gave up or timed out on its own clock), refunded.
    pub fn withdraw(&mut self, id: TicketId, now: Instant) -> Option<(Pass, W)> {
        let (mut pass, waiter) = self.take_waiting(id, now)?;
        self.refund(&mut pass, now);
        Some((pass, waiter))
    }

    /// Ends the waits whose deadline (57014) or queue timeout (53000) has come, refunded.
    pub fn expire(&mut self, now: Instant) -> Vec<Expired<W>> {
        let mut ended = self.shed_waiting(now);
        while let Some((end, id)) = self.ends.first() {
            if end > now {
                break;
            }
            self.ends.pop_first();
            let Some((mut pass, waiter)) = self.take_waiting(id, now) else {
                continue;
            };
            let timeout = self.settings.queue_timeout;
            let refusal = wait_refusal(&pass, timeout, now).unwrap_or_else(Refusal::deadline);
            self.refund(&mut pass, now);
            let refusal = self.refused(pass.subject(), refusal, now);
            ended.push(Expired {
                pass,
                waiter,
                refusal,
            });
        }
        ended
    }

    /// The clock's turn at `now`: ends the waits that are over ([`expire`](Self::expire)),
    /// hands out what slots can be given ([`dispatch`](Self::dispatch)), then tells those
    /// still waiting whose notice is due ([`notices_due`](Self::notices_due)): a ticket given
    /// its slot in this turn is told nothing.
    pub fn clock_turn(
        &mut self,
        now: Instant,
        live: impl Fn(&W) -> bool,
        notice: impl FnMut(&W),
    ) -> (Vec<Expired<W>>, Vec<Granted<W>>) {
        let expired = self.expire(now);
        let granted = self.dispatch(now, live);
        self.notices_due(now, notice);
        (expired, granted)
    }

    /// The waiters of the tickets whose client is to be told by `now` that it is queued
    /// (query_wait_notify), each once: `each` is called with every one.
    pub fn notices_due(&mut self, now: Instant, mut each: impl FnMut(&W)) {
        while let Some((at, id)) = self.notices.first() {
            if at > now {
                break;
            }
            self.notices.pop_first();
            let Some((upstream, places, lane)) = self.located.get(&id) else {
                continue;
            };
            let up = self.upstreams.get_at_mut(places.upstream, upstream);
            let waiting = up.and_then(|u| u.lane(*lane).0.queue.get_mut(id));
            // (Only at the moment of its present wait.)
            if let Some((pass, waiter)) = waiting.filter(|(p, _)| p.notify_at == Some(at)) {
                pass.notify_at = None;
                each(waiter);
            }
        }
    }

    /// Answers every waiting ticket for which `hit` is true with `refusal` (refunded): a
    /// kill refuses what is queued as well as what comes.
    pub(super) fn refuse_waiting(
        &mut self,
        hit: impl Fn(&Pass) -> bool,
        refusal: &Refusal,
        now: Instant,
    ) -> Vec<Expired<W>> {
        let ids: Vec<(TicketId, Refusal)> = self
            .upstreams
            .values()
            .flat_map(|u| u.queues())
            .flat_map(|q| q.iter())
            .filter(|(p, _)| hit(p))
            .map(|(p, _)| (p.id, refusal.clone()))
            .collect();
        self.end_waits(ids, now)
    }

    /// Takes each ticket out of its queue, refunded, with its refusal counted.
    pub(super) fn end_waits(
        &mut self,
        ids: Vec<(TicketId, Refusal)>,
        now: Instant,
    ) -> Vec<Expired<W>> {
        let mut out = Vec::new();
        for (id, refusal) in ids {
            let Some((mut pass, waiter)) = self.take_waiting(id, now) else {
                continue;
            };
            self.refund(&mut pass, now);
            let refusal = self.refused(pass.subject(), refusal, now);
            out.push(Expired {
                pass,
                waiter,
                refusal,
            });
        }
        out
    }

    /// When [`expire`](Self::expire), [`notices_due`](Self::notices_due) or
    /// [`dispatch`](Self::dispatch) next has work: the earliest deadline, queue timeout or
    /// notice of a waiting ticket, pay-back of a waiting debt, or a moment of the adaptive
    /// limits later than `now` (the clock calls this right after `clock_turn(now)`).
    pub fn next_wake(&self, now: Instant) -> Option<Instant> {
        let end = self.ends.first().map(|(at, _)| at);
        let notice = self.notices.first().map(|(at, _)| at);
        let paid = self
            .upstreams
            .values()
            .filter(|u| u.anyone_waits())
            .flat_map(|u| u.queues())
            .flat_map(|q| q.heads())
            .filter_map(|p| self.paid_back_at(p, now));
        let adaptive = self.adaptive_wake(now, true);
        end.into_iter()
            .chain(notice)
            .chain(paid)
            .chain(adaptive)
            .min()
    }

    /// The clock sleeps until `at` (`None`: until it is woken), having looked at everything
    /// that waits now.
    pub fn clock_sleeps(&mut self, at: Option<Instant>) {
        self.clock_until = at;
    }

    /// The queue timeout changed: every waiting ticket's end moves with it.
    pub(super) fn recompute_ends(&mut self) {
        let timeout = self.settings.queue_timeout;
        self.ends = self
            .upstreams
            .values()
            .flat_map(|u| u.queues())
            .flat_map(|q| q.iter())
            .filter_map(|(p, _)| Some((wait_end(p, timeout)?, p.id)))
            .collect();
    }

    /// Every lane of every upstream, for SHOW LANES.
    pub fn lanes(&self) -> Vec<LaneRow> {
        let mut upstreams: Vec<_> = self.upstreams.iter().collect();
        upstreams.sort_unstable_by(|a, b| a.0.cmp(b.0));
        upstreams
            .into_iter()
            .flat_map(|(name, up)| {
                [Lane::Fast, Lane::Slow].map(|lane| {
                    let state = up.lane_ref(lane);
                    let adaptive = up.adaptive.as_ref().filter(|_| lane == Lane::Fast);
                    LaneRow {
                        ceiling: adaptive.map(|_| up.limits.fast.min(up.capacity)),
                        last_move: adaptive.and_then(|a| a.last_move()),
                        moves: adaptive.map_or((0, 0), |a| a.moves()),
                        upstream: name.to_string(),
                        lane,
                        limit: up.limit(lane),
                        running: state.active,
                        waiting: state.queue.len(),
                    }
                })
            })
            .collect()
    }

    fn drop_pass(&mut self, mut pass: Pass, now: Instant) {
        self.refund(&mut pass, now);
    }
}

/// Whether the tenant in `state` has more tickets waiting than those at `up`.
fn waits_beyond<W>(
    state: Option<&TenantState>,
    up: Option<&Upstream<W>>,
    tenant: &Arc<str>,
) -> bool {
    let total = state.map_or(0, |t| t.waiting);
    let here = up.map_or(0, |u| u.waiting.get(tenant));
    total > here
}

/// When a waiting ticket's wait ends: its deadline or its queue timeout.
fn wait_end(pass: &Pass, timeout: Option<Duration>) -> Option<Instant> {
    let queue_end = timeout.and_then(|t| pass.enqueued_at?.checked_add(t));
    [pass.deadline, queue_end].into_iter().flatten().min()
}

/// The refusal for a wait that has ended by `now`.
fn wait_refusal(pass: &Pass, timeout: Option<Duration>, now: Instant) -> Option<Refusal> {
    if pass.deadline.is_some_and(|d| d <= now) {
        return Some(Refusal::deadline());
    }
    let since = pass.enqueued_at?;
    let waited = now.saturating_duration_since(since);
    timeout
        .filter(|t| waited >= *t)
        .map(|_| Refusal::queue_timeout(waited))
}

/// Adds the wait of `pass` that ends now, with its slot, to its whole wait.
fn add_wait(pass: &mut Pass, now: Instant) {
    if let Some(t) = pass.enqueued_at {
        pass.waited += now.saturating_duration_since(t);
        pass.waited_for_budget |= pass.payment() == Payment::AwaitingPayBack;
    }
}
