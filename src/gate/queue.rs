//! The queue of tickets waiting for a server.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// What a client presents when it asks for a server: who it is and when it started waiting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ticket {
    pub client_id: u64,
    pub enqueued_at: Instant,
}

impl Ticket {
    pub fn new(client_id: u64, now: Instant) -> Self {
        Ticket {
            client_id,
            enqueued_at: now,
        }
    }
}

/// How far into the queue [`WaitQueue::pop_preferring`] looks for a waiter it prefers.
pub const PREFER_WITHIN: usize = 64;

/// Tickets waiting for a server, each with the waiter `W` that receives it. The order in
/// which waiters are served is the gate's decision; today it is first come, first served.
#[derive(Debug)]
pub struct WaitQueue<W> {
    entries: VecDeque<(Ticket, W)>,
}

impl<W> Default for WaitQueue<W> {
    fn default() -> Self {
        WaitQueue {
            entries: VecDeque::new(),
        }
    }
}

impl<W> WaitQueue<W> {
    pub fn push(&mut self, ticket: Ticket, waiter: W) {
        self.entries.push_back((ticket, waiter));
    }

    /// The next waiter to serve, skipping (and dropping) those for which `live` is false:
    /// a client that gave up waiting removes itself this way.
    pub fn pop_next(&mut self, live: impl Fn(&W) -> bool) -> Option<(Ticket, W)> {
        while let Some((ticket, waiter)) = self.entries.pop_front() {
            if live(&waiter) {
                return Some((ticket, waiter));
            }
        }
        None
    }

    /// Like [`pop_next`](Self::pop_next), but the first live waiter for which `prefer` holds
    /// goes first if every live waiter ahead of it may be passed (`may_pass`; each one passed
    /// is told through `passed`). Only the first [`PREFER_WITHIN`] waiters are looked at.
    pub fn pop_preferring(
        &mut self,
        live: impl Fn(&W) -> bool,
        prefer: impl Fn(&W) -> bool,
        may_pass: impl Fn(&W) -> bool,
        passed: impl Fn(&mut W),
    ) -> Option<(Ticket, W)> {
        while self.entries.front().is_some_and(|(_, w)| !live(w)) {
            self.entries.pop_front();
        }
        let mut chosen = None;
        for (i, (_, w)) in self.entries.iter().enumerate().take(PREFER_WITHIN) {
            if !live(w) {
                continue;
            }
            if prefer(w) {
                chosen = Some(i);
                break;
            }
            if !may_pass(w) {
                break;
            }
        }
        let Some(at) = chosen.filter(|&i| i > 0) else {
            return self.pop_next(live);
        };
        for (_, w) in self.entries.iter_mut().take(at) {
            if live(w) {
                passed(w);
            }
        }
        self.entries.remove(at)
    }

    /// Drops every waiter for which `live` is false.
    pub fn prune(&mut self, live: impl Fn(&W) -> bool) {
        self.entries.retain(|(_, w)| live(w));
    }

    /// Removes and returns every waiter, in order.
    pub fn drain(&mut self) -> impl Iterator<Item = (Ticket, W)> + '_ {
        self.entries.drain(..)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// How long the longest-waiting ticket has waited.
    pub fn oldest_wait(&self, now: Instant) -> Option<Duration> {
        self.entries
            .iter()
            .map(|(t, _)| now.saturating_duration_since(t.enqueued_at))
            .max()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_come_first_served() {
        let t0 = Instant::now();
        let mut q = WaitQueue::default();
        for id in 1..=3 {
            q.push(Ticket::new(id, t0 + Duration::from_millis(id)), id);
        }
        let order: Vec<u64> =
            std::iter::from_fn(|| q.pop_next(|_| true).map(|(t, _)| t.client_id)).collect();
        assert_eq!(order, vec![1, 2, 3]);
    }

    #[test]
    fn a_preferred_waiter_passes_only_those_that_may_still_be_passed() {
        let t0 = Instant::now();
        let mut q = WaitQueue::default();
        // (thread, times passed); client 1's waiter has gone.
        for (id, home) in [(1, 0u8), (2, 1), (3, 1), (4, 0), (5, 0)] {
            q.push(Ticket::new(id, t0), (home, 0u8, id != 1));
        }
        let mut next = |home: u8| {
            q.pop_preferring(|w| w.2, |w| w.0 == home, |w| w.1 < 1, |w| w.1 += 1)
                .map(|(t, _)| t.client_id)
        };
        // Thread 0's server goes to its first waiter, past 2 and 3 (each passed once).
        assert_eq!(next(0), Some(4));
        // Nobody may pass 2 again: it goes first whatever the thread.
        assert_eq!(next(0), Some(2));
        assert_eq!(next(1), Some(3));
        // No waiter of thread 1 left: first come, first served.
        assert_eq!(next(1), Some(5));
        assert_eq!(next(0), None);
    }

    #[test]
    fn dead_waiters_are_skipped() {
        let t0 = Instant::now();
        let mut q = WaitQueue::default();
        q.push(Ticket::new(1, t0), false);
        q.push(Ticket::new(2, t0), true);
        let (t, _) = q.pop_next(|live| *live).expect("a live waiter");
        assert_eq!(t.client_id, 2);
        assert!(q.is_empty());
    }

    #[test]
    fn oldest_wait_is_measured_from_the_earliest_ticket() {
        let t0 = Instant::now();
        let mut q = WaitQueue::default();
        assert_eq!(q.oldest_wait(t0), None);
        q.push(Ticket::new(1, t0), ());
        q.push(Ticket::new(2, t0 + Duration::from_secs(2)), ());
        assert_eq!(
            q.oldest_wait(t0 + Duration::from_secs(5)),
            Some(Duration::from_secs(5))
        );
        q.prune(|_| false);
        assert!(q.is_empty());
    }
}
