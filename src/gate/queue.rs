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
