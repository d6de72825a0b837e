//! The adaptive limit in the gate (`adaptive = true`): each upstream's fast lane moves its
//! limit once a second ([`crate::gate::adapt`]); while it finds overload, best-effort work is
//! shed; and once the fast lane's queue has stood (not emptied) for a second, it serves the
//! newest ticket first and turns away work that waited past `standing_wait` (adaptive LIFO
//! with CoDel-style dropping). The slow lane stays first in, first out.

use super::*;
use crate::gate::adapt::Moved;
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
        let a = up.adaptive.as_mut()?;
        let moved = a.tick(ceiling, settings.floor, full_now, now);
        // Full as the new window starts: it counts for that window.
        Self::note_taken(up);
        let moved = moved?;
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
        let due: Vec<String> = self
            .upstreams
            .iter()
            .filter(|(_, u)| u.adaptive.as_ref().is_some_and(|a| a.due_at() <= now))
            .map(|(name, _)| name.clone())
            .collect();
        for upstream in due {
            self.adapt(&upstream, now);
        }
    }

    /// Whether best-effort work on `upstream` is shed now: its limit found overload.
    pub(super) fn sheds(&self, upstream: &str) -> bool {
        self.upstreams
            .get(upstream)
            .and_then(|u| u.adaptive.as_ref())
            .is_some_and(|a| a.overloaded())
    }

    /// A statement on `upstream` with a usual time ran `slowdown` times that time.
    pub fn note_slowdown(&mut self, upstream: &str, slowdown: f64) {
        if let Some(a) = self
            .upstreams
            .get_mut(upstream)
            .and_then(|u| u.adaptive.as_mut())
        {
            a.note_slowdown(slowdown);
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
    /// an overloaded upstream and the work that waited past `standing_wait` in a fast lane
    /// whose queue has stood (critical work is never dropped).
    pub(super) fn shed_waiting(&mut self, now: Instant) -> Vec<Expired<W>> {
        let Some(settings) = self.settings.adaptive else {
            return Vec::new();
        };
        self.adapt_all(now);
        let mut out: Vec<(TicketId, Refusal)> = Vec::new();
        for up in self.upstreams.values() {
            if up.adaptive.is_none() || up.fast.queue.is_empty() {
                continue;
            }
            let shed = up.adaptive.as_ref().is_some_and(|a| a.overloaded());
            let stood = standing(&up.fast, now);
            for (pass, _) in up.fast.queue.iter() {
                let waited = pass
                    .enqueued_at
                    .map_or(Duration::ZERO, |t| now.saturating_duration_since(t));
                if shed && pass.priority == Priority::BestEffort {
                    out.push((pass.id, Refusal::shed()));
                } else if stood
                    && pass.priority != Priority::Critical
                    && waited >= settings.standing_wait
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
    /// overloaded upstream.
    pub(super) fn adaptive_wake(&self, now: Instant) -> Option<Instant> {
        let settings = self.settings.adaptive?;
        self.upstreams
            .values()
            .filter(|u| u.fast.active > 0 || !u.fast.queue.is_empty())
            .filter_map(|u| {
                let a = u.adaptive.as_ref()?;
                let heads = || u.fast.queue.heads();
                let shed = a.overloaded() && heads().any(|p| p.priority == Priority::BestEffort);
                let oldest = heads()
                    .filter(|p| p.priority != Priority::Critical)
                    .filter_map(|p| p.enqueued_at)
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
