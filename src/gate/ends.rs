//! When each waiting ticket's wait ends, soonest first.
//!
//! Tickets mostly join with the latest end (their queue timeout from now) and mostly leave
//! with the earliest (the oldest ticket is served first): a deque kept in order serves both at
//! its ends, where an ordered tree would search and rebalance at every wait. A ticket that
//! joins or leaves elsewhere (a deadline sooner than the queue timeout, a client that left)
//! is placed by a binary search.

use std::collections::VecDeque;
use std::time::Instant;

use super::pass::TicketId;

/// Each waiting ticket's end, in order (ties by ticket).
#[derive(Debug, Default)]
pub struct Ends(VecDeque<(Instant, TicketId)>);

impl Ends {
    /// Adds `id`'s end.
    pub fn insert(&mut self, end: Instant, id: TicketId) {
        let entry = (end, id);
        if self.0.back().is_none_or(|last| *last < entry) {
            self.0.push_back(entry);
            return;
        }
        let at = self.0.partition_point(|e| *e < entry);
        if self.0.get(at) != Some(&entry) {
            self.0.insert(at, entry);
        }
    }

    /// Removes `id`'s end, if it is there.
    pub fn remove(&mut self, end: Instant, id: TicketId) {
        let entry = (end, id);
        if self.0.front() == Some(&entry) {
            self.0.pop_front();
        } else if let Ok(at) = self.0.binary_search(&entry) {
            self.0.remove(at);
        }
    }

    /// The soonest end.
    pub fn first(&self) -> Option<(Instant, TicketId)> {
        self.0.front().copied()
    }

    /// Removes the soonest end.
    pub fn pop_first(&mut self) -> Option<(Instant, TicketId)> {
        self.0.pop_front()
    }
}

impl FromIterator<(Instant, TicketId)> for Ends {
    fn from_iter<I: IntoIterator<Item = (Instant, TicketId)>>(iter: I) -> Ends {
        let mut ends: Vec<_> = iter.into_iter().collect();
        ends.sort_unstable();
        ends.dedup();
        Ends(ends.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;
    use std::time::Duration;

    proptest! {
        /// Whatever the order of joins and leaves, the ends are those of an ordered set.
        #[test]
        fn the_ends_are_an_ordered_set(ops in prop::collection::vec((0u8..4, 0u64..40, 0u64..8), 0..200)) {
            let base = Instant::now();
            let (mut ends, mut set) = (Ends::default(), BTreeSet::new());
            for (op, at, id) in ops {
                let entry = (base + Duration::from_millis(at), TicketId(id));
                match op {
                    0 | 1 => {
                        ends.insert(entry.0, entry.1);
                        set.insert(entry);
                    }
                    2 => {
                        ends.remove(entry.0, entry.1);
                        set.remove(&entry);
                    }
                    _ => {
                        prop_assert_eq!(ends.pop_first(), set.pop_first());
                    }
                }
                prop_assert_eq!(ends.first(), set.first().copied());
                prop_assert!(ends.0.iter().copied().eq(set.iter().copied()));
            }
            let rebuilt: Ends = set.iter().copied().chain(set.iter().copied()).collect();
            prop_assert!(rebuilt.0.iter().copied().eq(set.iter().copied()));
        }
    }
}
