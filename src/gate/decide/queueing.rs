//! Slots and the wait for them.

use super::*;

/// Whether `pass` may take a slot now, and its tenant's rank.
fn rank(
    tenants: &BTreeMap<String, TenantState>,
    demoted: &BTreeSet<String>,
    pass: &Pass,
    now: Instant,
) -> Option<Rank> {
    let state = tenants.get(&pass.tenant)?;
    let budget_ok = pass.payment != Payment::AwaitingPayBack || !state.owes(now);
    let in_time = pass.deadline.is_none_or(|d| d > now);
    (budget_ok && in_time && state.has_room()).then(|| Rank {
        demoted: demoted.contains(&pass.tenant),
        score: state.recent.value(now) / state.config.share(),
    })
}

impl<W> Gate<W> {
    /// Tenants of `upstream` holding more than their share while others wait there.
    pub fn runaways(&self, upstream: &str) -> Vec<Runaway> {
        let Some(up) = self.upstreams.get(upstream) else {
            return Vec::new();
        };
        let mut waiting: BTreeMap<&str, usize> = BTreeMap::new();
        for pass in up.queues().flat_map(|q| q.iter().map(|(p, _)| p)) {
            *waiting.entry(pass.tenant.as_str()).or_default() += 1;
        }
        let names: BTreeSet<&str> = waiting
            .keys()
            .copied()
            .chain(up.holding.keys().map(String::as_str))
            .collect();
        let loads: Vec<TenantLoad> = names
            .into_iter()
            .map(|tenant| TenantLoad {
                tenant,
                servers: up.holding.get(tenant).copied().unwrap_or(0),
                waiting: waiting.get(tenant).copied().unwrap_or(0),
                share: self.tenants.get(tenant).map_or(1.0, |t| t.config.share()),
            })
            .collect();
        runaways(&loads, up.limits.fast + up.limits.slow)
    }

    fn demoted(&self, upstream: &str) -> BTreeSet<String> {
        // Nobody waits: nobody is a runaway (and nothing is allocated).
        let waiting = self
            .upstreams
            .get(upstream)
            .is_some_and(|u| u.queues().any(|q| q.iter().next().is_some()));
        if !waiting {
            return BTreeSet::new();
        }
        self.runaways(upstream)
            .into_iter()
            .map(|r| r.tenant)
            .collect()
    }

    /// Takes a slot at once if the lane has one free and no waiting ticket may take it
    /// first; otherwise the caller queues the pass with [`enqueue`](Self::enqueue).
    pub fn try_acquire(&mut self, pass: &Pass, now: Instant) -> Option<Slot> {
        let demoted = self.demoted(&pass.upstream);
        rank(&self.tenants, &demoted, pass, now)?;
        self.upstream_mut(&pass.upstream);
        let Gate {
            upstreams, tenants, ..
        } = self;
        let up = upstreams.get_mut(&pass.upstream)?;
        let (lane, limit) = up.lane(pass.lane);
        let someone_first = lane
            .queue
            .best(|p| rank(tenants, &demoted, p, now))
            .is_some();
        if lane.active >= limit || someone_first {
            return None;
        }
        Some(self.take_slot(pass, now))
    }

    fn take_slot(&mut self, pass: &Pass, now: Instant) -> Slot {
        let up = self.upstream_mut(&pass.upstream);
        up.lane(pass.lane).0.active += 1;
        *up.holding.entry(pass.tenant.clone()).or_default() += 1;
        self.tenant_mut(&pass.tenant, now).running += 1;
        Slot {
            id: pass.id,
            upstream: pass.upstream.clone(),
            lane: pass.lane,
            tenant: pass.tenant.clone(),
        }
    }

    /// Queues `pass` for a slot in its lane; `waiter` is told through
    /// [`next_waiter`](Self::next_waiter) or [`expire`](Self::expire).
    pub fn enqueue(&mut self, mut pass: Pass, waiter: W, now: Instant) {
        pass.enqueued_at = Some(now);
        self.tenant_mut(&pass.tenant, now).waiting += 1;
        self.upstream_mut(&pass.upstream)
            .lane(pass.lane)
            .0
            .queue
            .push(pass, waiter);
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
        let demoted = self.demoted(upstream);
        loop {
            let Gate {
                upstreams, tenants, ..
            } = &mut *self;
            let (state, limit) = upstreams.get_mut(upstream)?.lane(lane);
            if state.active >= limit {
                return None;
            }
            let id = state.queue.best(|p| rank(tenants, &demoted, p, now))?;
            let (pass, waiter) = state.queue.remove(id)?;
            let pass = self.left_queue(pass, now);
            if live(&waiter) {
                let slot = self.take_slot(&pass, now);
                return Some(Granted { pass, slot, waiter });
            }
            self.drop_pass(pass, now);
        }
    }

    /// Whether any ticket waits, in any lane.
    pub fn has_waiters(&self) -> bool {
        self.upstreams
            .values()
            .any(|u| u.queues().any(|q| q.iter().next().is_some()))
    }

    /// Hands out every slot that can be given now, in every lane (after a debt is paid back,
    /// a release, or a change of limits).
    pub fn dispatch(&mut self, now: Instant, live: impl Fn(&W) -> bool) -> Vec<Granted<W>> {
        let lanes: Vec<(String, Lane)> = self
            .upstreams
            .keys()
            .flat_map(|u| [(u.clone(), Lane::Fast), (u.clone(), Lane::Slow)])
            .collect();
        let mut granted = Vec::new();
        for (upstream, lane) in lanes {
            while let Some(g) = self.next_waiter(&upstream, lane, now, &live) {
                granted.push(g);
            }
        }
        granted
    }

    /// A slot comes back: PostgreSQL owes its client nothing more. The caller then offers it
    /// with [`next_waiter`](Self::next_waiter).
    pub fn release(&mut self, slot: Slot, now: Instant) {
        let up = self.upstream_mut(&slot.upstream);
        let lane = &mut up.lane(slot.lane).0.active;
        *lane = lane.saturating_sub(1);
        if let Some(n) = up.holding.get_mut(&slot.tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                up.holding.remove(&slot.tenant);
            }
        }
        let state = self.tenant_mut(&slot.tenant, now);
        state.running = state.running.saturating_sub(1);
    }

    /// Takes a waiting ticket out (its client gave up or timed out on its own clock), refunded.
    pub fn withdraw(&mut self, id: TicketId, now: Instant) -> Option<(Pass, W)> {
        let found = self
            .upstreams
            .values_mut()
            .flat_map(|u| u.queues_mut())
            .find_map(|q| q.remove(id));
        let (pass, waiter) = found?;
        let mut pass = self.left_queue(pass, now);
        self.refund(&mut pass, now);
        Some((pass, waiter))
    }

    /// Ends the waits whose deadline (57014) or queue timeout (53000) has come, refunded.
    pub fn expire(&mut self, now: Instant) -> Vec<Expired<W>> {
        let timeout = self.settings.queue_timeout;
        let mut ended = Vec::new();
        for up in self.upstreams.values_mut() {
            for q in up.queues_mut() {
                ended.extend(q.take_where(|p, _| wait_refusal(p, timeout, now).is_some()));
            }
        }
        ended
            .into_iter()
            .map(|(pass, waiter)| {
                let refusal = wait_refusal(&pass, timeout, now).unwrap_or_else(Refusal::deadline);
                let mut pass = self.left_queue(pass, now);
                self.refund(&mut pass, now);
                let refusal = self.refused(&pass.tenant, refusal, now);
                Expired {
                    pass,
                    waiter,
                    refusal,
                }
            })
            .collect()
    }

    /// When [`expire`](Self::expire) or [`dispatch`](Self::dispatch) next has work: the
    /// earliest deadline or queue timeout of a waiting ticket, or pay-back of a waiting debt.
    pub fn next_wake(&self, now: Instant) -> Option<Instant> {
        let timeout = self.settings.queue_timeout;
        let queues = || self.upstreams.values().flat_map(|u| u.queues());
        let ends = queues()
            .flat_map(|q| q.iter().map(|(p, _)| p))
            .filter_map(|p| wait_end(p, timeout));
        let paid = queues()
            .flat_map(|q| q.heads())
            .filter(|p| p.payment == Payment::AwaitingPayBack)
            .filter_map(|p| self.tenants.get(&p.tenant)?.paid_back_at(now));
        ends.chain(paid).min()
    }

    fn left_queue(&mut self, pass: Pass, now: Instant) -> Pass {
        let state = self.tenant_mut(&pass.tenant, now);
        state.waiting = state.waiting.saturating_sub(1);
        pass
    }

    fn drop_pass(&mut self, mut pass: Pass, now: Instant) {
        self.refund(&mut pass, now);
    }
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
