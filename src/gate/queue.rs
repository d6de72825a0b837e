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

/// How many later arrivals may be served before a waiter because a server came back on their
/// worker thread (see [`WaitQueue::pop_preferring`]).
pub const PASS_WINDOW: u64 = 16;

/// Tickets waiting for a server, each with the waiter `W` that receives it, first come, first
/// served; with several worker threads, in a line per thread, so that a server coming back on
/// one can go to that thread's first waiter.
#[derive(Debug)]
pub struct WaitQueue<W> {
    /// Line 0 holds the waiters of no particular thread; line `i + 1` those of thread `i`.
    lines: Vec<VecDeque<Waiting<W>>>,
    /// The number the next arrival takes.
    arrivals: u64,
}

#[derive(Debug)]
struct Waiting<W> {
    arrival: u64,
    ticket: Ticket,
    waiter: W,
}

impl<W> Default for WaitQueue<W> {
    fn default() -> Self {
        WaitQueue {
            lines: vec![VecDeque::new()],
            arrivals: 0,
        }
    }
}

impl<W> WaitQueue<W> {
    pub fn push(&mut self, ticket: Ticket, waiter: W) {
        self.push_on(None, ticket, waiter);
    }

    /// Queues a waiter of worker thread `thread` (`None`: of no particular one).
    pub fn push_on(&mut self, thread: Option<usize>, ticket: Ticket, waiter: W) {
        let line = thread.map_or(0, |t| t + 1);
        if self.lines.len() <= line {
            self.lines.resize_with(line + 1, VecDeque::new);
        }
        let arrival = self.arrivals;
        self.arrivals += 1;
        self.lines[line].push_back(Waiting {
            arrival,
            ticket,
            waiter,
        });
    }

    /// The next waiter to serve, skipping (and dropping) those for which `live` is false:
    /// a client that gave up waiting removes itself this way.
    pub fn pop_next(&mut self, live: impl Fn(&W) -> bool) -> Option<(Ticket, W)> {
        let line = self.first_line(&live)?;
        self.take_front(line)
    }

    /// Like [`pop_next`](Self::pop_next), but the first waiter of worker thread `thread`
    /// goes first, unless it came more than [`PASS_WINDOW`] arrivals after the first waiter
    /// of all: no waiter is passed by one that came much later, so none starves.
    pub fn pop_preferring(
        &mut self,
        thread: usize,
        live: impl Fn(&W) -> bool,
    ) -> Option<(Ticket, W)> {
        // (Every line's front is live now: `first_line` dropped the dead ones.)
        let first = self.first_line(&live)?;
        let own = thread + 1;
        let front = |line: usize| self.lines.get(line)?.front().map(|w| w.arrival);
        let (ahead, mine) = (front(first), front(own));
        let near = mine
            .zip(ahead)
            .is_some_and(|(m, a)| m.saturating_sub(a) <= PASS_WINDOW);
        self.take_front(if own != first && near { own } else { first })
    }

    /// Drops line `line`'s dead waiters at its front; whether a live one is left there.
    fn drop_dead(&mut self, line: usize, live: &impl Fn(&W) -> bool) -> bool {
        while let Some(front) = self.lines[line].front() {
            if live(&front.waiter) {
                return true;
            }
            self.lines[line].pop_front();
        }
        false
    }

    /// The line whose first live waiter came first (dead ones at the fronts are dropped).
    fn first_line(&mut self, live: &impl Fn(&W) -> bool) -> Option<usize> {
        let mut first: Option<(u64, usize)> = None;
        for line in 0..self.lines.len() {
            if !self.drop_dead(line, live) {
                continue;
            }
            let arrival = self.lines[line].front().map_or(u64::MAX, |w| w.arrival);
            if first.is_none_or(|(a, _)| arrival < a) {
                first = Some((arrival, line));
            }
        }
        first.map(|(_, line)| line)
    }

    fn take_front(&mut self, line: usize) -> Option<(Ticket, W)> {
        let w = self.lines.get_mut(line)?.pop_front()?;
        Some((w.ticket, w.waiter))
    }

    /// Passes every waiter through `keep` (a thread's line at a time): it goes on waiting, in
    /// its place and with its arrival number (so with the same standing against later
    /// arrivals), as what `keep` returns, or leaves the queue when that is `None`.
    pub fn retain_map(&mut self, mut keep: impl FnMut(W) -> Option<W>) {
        for line in &mut self.lines {
            let waiting = std::mem::take(line);
            line.extend(waiting.into_iter().filter_map(|w| {
                let waiter = keep(w.waiter)?;
                Some(Waiting { waiter, ..w })
            }));
        }
    }

    /// Drops every waiter for which `live` is false.
    pub fn prune(&mut self, live: impl Fn(&W) -> bool) {
        for line in &mut self.lines {
            line.retain(|w| live(&w.waiter));
        }
    }

    /// Removes and returns every waiter, in the order they came.
    pub fn drain(&mut self) -> impl Iterator<Item = (Ticket, W)> {
        let mut all: Vec<Waiting<W>> = Vec::with_capacity(self.len());
        for waiters in &mut self.lines {
            all.extend(waiters.drain(..));
        }
        all.sort_unstable_by_key(|w| w.arrival);
        all.into_iter().map(|w| (w.ticket, w.waiter))
    }

    /// Waiters in every line (a line per worker thread, and one more).
    pub fn len(&self) -> usize {
        self.lines.iter().map(VecDeque::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.lines.iter().all(VecDeque::is_empty)
    }

    /// How long the longest-waiting ticket has waited.
    pub fn oldest_wait(&self, now: Instant) -> Option<Duration> {
        self.lines
            .iter()
            .flatten()
            .map(|w| now.saturating_duration_since(w.ticket.enqueued_at))
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
    fn a_threads_waiter_goes_first_unless_it_came_far_later() {
        let t0 = Instant::now();
        let mut q = WaitQueue::default();
        // Client 1 (thread 0) has gone; 2 waits on thread 1, 3 on thread 0.
        q.push_on(Some(0), Ticket::new(1, t0), false);
        q.push_on(Some(1), Ticket::new(2, t0), true);
        q.push_on(Some(0), Ticket::new(3, t0), true);
        // Thread 0's waiter 3 passes 2, which came just before it.
        assert_eq!(
            q.pop_preferring(0, |w| *w).map(|(t, _)| t.client_id),
            Some(3)
        );
        // Later arrivals on thread 0 pass 2 as long as they came at most PASS_WINDOW
        // arrivals after it (it came second: arrival 1).
        for id in 10..10 + PASS_WINDOW + 2 {
            q.push_on(Some(0), Ticket::new(id, t0), true);
        }
        let served: Vec<u64> = (0..PASS_WINDOW)
            .filter_map(|_| q.pop_preferring(0, |w| *w).map(|(t, _)| t.client_id))
            .collect();
        // Arrivals 3 to 17 (clients 10 to 24) passed it; 25 came too late to.
        assert_eq!(served.last(), Some(&2), "{served:?}");
        assert_eq!(served.len() as u64, PASS_WINDOW);
        assert!(served[..served.len() - 1]
            .windows(2)
            .all(|p| p[0] + 1 == p[1]));
        // With no waiter of its own thread (or an unknown one), a server goes to the first
        // waiter of all.
        assert_eq!(
            q.pop_preferring(1, |w| *w).map(|(t, _)| t.client_id),
            Some(25)
        );
        q.push_on(Some(1), Ticket::new(30, t0), true);
        assert_eq!(
            q.pop_preferring(5, |w| *w).map(|(t, _)| t.client_id),
            Some(26)
        );
        q.push(Ticket::new(31, t0), true);
        // Drained in the order they came.
        let order: Vec<u64> = q.drain().map(|(t, _)| t.client_id).collect();
        assert_eq!(order, vec![27, 30, 31]);
        assert!(q.is_empty());
    }

    #[test]
    fn a_waiter_kept_by_the_watchdog_keeps_its_standing() {
        let t0 = Instant::now();
        let mut q = WaitQueue::default();
        q.push_on(Some(1), Ticket::new(1, t0), ());
        for id in 10..10 + PASS_WINDOW + 4 {
            q.push_on(Some(0), Ticket::new(id, t0), ());
        }
        let thread0 =
            |q: &mut WaitQueue<()>| q.pop_preferring(0, |_| true).map(|(t, _)| t.client_id);
        for _ in 0..PASS_WINDOW - 1 {
            assert_ne!(thread0(&mut q), Some(1));
        }
        // The watchdog's look at every waiter (each kept) changes no one's standing: client 1
        // has been passed by 15 later arrivals, and goes after one more.
        q.retain_map(Some);
        assert_eq!(q.len(), PASS_WINDOW as usize + 4 - 15 + 1);
        assert_ne!(thread0(&mut q), Some(1));
        assert_eq!(thread0(&mut q), Some(1));
        // A waiter `keep` drops leaves.
        q.retain_map(|_| None);
        assert!(q.is_empty());
    }

    #[test]
    fn first_come_first_served_across_threads() {
        let t0 = Instant::now();
        let mut q = WaitQueue::default();
        q.push_on(Some(1), Ticket::new(1, t0), ());
        q.push(Ticket::new(2, t0), ());
        q.push_on(Some(0), Ticket::new(3, t0), ());
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
