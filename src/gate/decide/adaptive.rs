//! The adaptive limit in the gate (`adaptive = true`): each upstream's fast lane moves its
//! limit once a second ([`crate::gate::adapt`]); while it finds overload, best-effort work is
//! shed; and once the fast lane's queue has stood (not emptied) for a second, it serves the
//! newest ticket first and turns away work that waited past `standing_wait` (adaptive LIFO
//! with CoDel-style dropping). The slow lane stays first in, first out.

use super::queueing::rank;
use super::*;
use crate::gate::adapt::{LimitChange, Moved};
use crate::gate::RequestKind;
use crate::sql::Priority;

/// How long the fast lane's queue must not have emptied before it counts as standing.
pub const STANDING_AFTER: Duration = Duration::from_secs(1);

impl<W> Gate<W> {
    /// Moves the adaptive limit of `upstream` if a period has passed (starting it at the
    /// first request): called as requests come and slots go, and by the clock.
    pub(super) fn adapt(&mut self, upstream: &str, now: Instant) -> Option<Moved> {
        let settings = self.settings.adaptive?;
        let up = self.upstreams.get_mut(upstream)?;
        let ceiling = up.limits.fast.min(up.capacity);
        let a = up
            .adaptive
            .get_or_insert_with(|| AdaptiveLimit::new(ceiling, now));
        if now < a.due_at() {
            return None;
        }
        let full_now = up.fast.active >= up.limit(Lane::Fast);
        let stood = standing(&up.fast, now);
        let a = up.adaptive.as_mut()?;
        let moved = a.tick(ceiling, settings.floor, full_now, stood, now);
        if moved.is_some_and(|m| m.why == LimitChange::ProbeOver) && up.fast.waited_since.is_some()
        {
            // The probe's own wait is nobody's: the queue stands anew from here.
            up.fast.waited_since = Some(now);
        }
        // Full as the new window starts: it counts for that window.
        Self::note_taken(up);
        let moved = moved?;
        self.note(|| {
            Record::new(Event::LimitChanged, moved.why.reason())
                .upstream(upstream)
                .figure("from", moved.from as f64)
                .figure("to", moved.to as f64)
        });
        tracing::info!(
            %upstream,
            from = moved.from,
            to = moved.to,
            reason = moved.why.reason(),
            "adaptive limit: {}",
            moved.why.describe()
        );
        Some(moved)
    }

    /// Ticks every adaptive upstream that is due (the clock).
    fn adapt_all(&mut self, now: Instant) {
        if self.settings.adaptive.is_none() {
            return;
        }
        let mut due: Vec<Arc<str>> = self
            .upstreams
            .iter()
            .filter(|(_, u)| u.adaptive.as_ref().is_some_and(|a| a.due_at() <= now))
            .map(|(name, _)| name.clone())
            .collect();
        due.sort_unstable();
        for upstream in due {
            self.adapt(&upstream, now);
        }
    }

    /// Whether `pass`, about to take a new slot, is shed: best-effort work (never a carrier
    /// of messages without a request of their own) on an upstream whose limit found
    /// overload. Work inside a transaction or a batch already holds its slot and is never
    /// asked.
    pub(super) fn shed_now(&mut self, pass: &Pass, now: Instant) -> bool {
        if pass.priority != Priority::BestEffort || pass.kind == RequestKind::Carrier {
            return false;
        }
        self.adapt(&pass.upstream, now);
        self.upstreams
            .get_at(pass.places.upstream, &pass.upstream)
            .and_then(|u| u.adaptive.as_ref())
            .is_some_and(|a| a.overloaded())
    }

    /// Statement `statement` (its fingerprint) ran `seconds` on `upstream`'s fast lane for a
    /// plan of cost `cost` (none: it has no plan), in a slot taken when `crowd` slots of the
    /// lane were held: a quiet run if that and the slots held now are within the floor.
    pub fn note_run(
        &mut self,
        upstream: &str,
        statement: u64,
        seconds: f64,
        cost: Option<f64>,
        crowd: usize,
        now: Instant,
    ) {
        let Some(up) = self.upstreams.get_mut(upstream) else {
            return;
        };
        let active = up.fast.active;
        if let Some(a) = up.adaptive.as_mut() {
            let quiet = crowd <= a.floor() && active <= a.floor();
            a.note_run(statement, seconds, cost, quiet, now);
        }
    }

    /// The server reading of `upstream` counted `n` of pgward's sessions waiting for a lock.
    pub fn note_lock_waits(&mut self, upstream: &str, n: usize, now: Instant) {
        if let Some(a) = self
            .upstreams
            .get_mut(upstream)
            .and_then(|u| u.adaptive.as_mut())
        {
            a.note_lock_waits(n, now);
        }
    }

    /// Records that every slot of the fast lane of `up` is taken, if it is.
    pub(super) fn note_taken(up: &mut Upstream<W>) {
        if up.adaptive.is_some() && up.fast.active >= up.limit(Lane::Fast) {
            if let Some(a) = up.adaptive.as_mut() {
                a.note_full();
            }
        }
    }

    /// Whether the fast lane of `up` serves its newest ticket first now.
    pub(super) fn newest_first(up: &Upstream<W>, lane: Lane, now: Instant) -> bool {
        lane == Lane::Fast && up.adaptive.is_some() && standing(&up.fast, now)
    }

    /// The clock's part: ticks what is due, then turns away the best-effort work waiting on
    /// an overloaded upstream, and, in a fast lane that is full and whose queue has stood,
    /// the work that waited there past `standing_wait` for the lane alone (not for its
    /// budget or its tenant's own limits). Critical work and carriers (a Parse or a Sync
    /// alone, whose refusal would end the session) are never turned away.
    pub(super) fn shed_waiting(&mut self, now: Instant) -> Vec<Expired<W>> {
        let Some(settings) = self.settings.adaptive else {
            return Vec::new();
        };
        self.adapt_all(now);
        let mut out: Vec<(TicketId, Refusal)> = Vec::new();
        for (name, up) in self.upstreams.iter() {
            let Some(a) = up.adaptive.as_ref().filter(|_| !up.fast.queue.is_empty()) else {
                continue;
            };
            // A probe's own wait is no reason to turn work away.
            let full = !up.room(Lane::Fast) && !a.probing();
            let stood = full && standing(&up.fast, now);
            let room = self.room(name);
            for (pass, _) in up.fast.queue.iter() {
                if pass.kind == RequestKind::Carrier || pass.priority == Priority::Critical {
                    continue;
                }
                // A wait through a probe counts from its end.
                let since = pass.enqueued_at.max(a.probed_at());
                let waited = since.map_or(Duration::ZERO, |t| now.saturating_duration_since(t));
                if a.overloaded() && pass.priority == Priority::BestEffort {
                    out.push((pass.id, Refusal::shed()));
                } else if stood
                    && waited >= settings.standing_wait
                    && rank(&self.tenants, &room, pass, now).is_some()
                {
                    out.push((pass.id, Refusal::stood(waited)));
                }
            }
        }
        self.end_waits(out, now)
    }

    /// When the clock next has work for the adaptive limits: the tick of a lane in use
    /// (slots held or tickets waiting), the moment its oldest droppable ticket has waited
    /// `standing_wait` in a queue that stands, or now if best-effort work waits on an
    /// overloaded upstream. `looked` is true right after the clock's own look at `now`
    /// ([`shed_waiting`](Self::shed_waiting)): what it left is not droppable now, so only
    /// later moments count (the clock never spins on a ticket that waits for its budget).
    pub(super) fn adaptive_wake(&self, now: Instant, looked: bool) -> Option<Instant> {
        let settings = self.settings.adaptive?;
        let later = |t: &Instant| !looked || *t > now;
        self.upstreams
            .values()
            .filter(|u| u.fast.active > 0 || !u.fast.queue.is_empty())
            .filter_map(|u| {
                let a = u.adaptive.as_ref()?;
                let heads = || {
                    u.fast
                        .queue
                        .heads()
                        .filter(|p| p.kind != RequestKind::Carrier)
                };
                let shed = a.overloaded() && heads().any(|p| p.priority == Priority::BestEffort);
                let oldest = heads()
                    .filter(|p| p.priority != Priority::Critical)
                    .filter_map(|p| p.enqueued_at.max(a.probed_at()))
                    .min()
                    .and_then(|t| t.checked_add(settings.standing_wait));
                let stands = u
                    .fast
                    .waited_since
                    .and_then(|t| t.checked_add(STANDING_AFTER));
                let drop = oldest.zip(stands).map(|(a, b)| a.max(b));
                [Some(a.due_at()), drop, shed.then_some(now)]
                    .into_iter()
                    .flatten()
                    .filter(later)
                    .min()
            })
            .min()
    }
}

/// Whether a lane's queue has not emptied for [`STANDING_AFTER`].
fn standing<W>(lane: &LaneState<W>, now: Instant) -> bool {
    lane.waited_since
        .is_some_and(|t| now.saturating_duration_since(t) >= STANDING_AFTER)
}
