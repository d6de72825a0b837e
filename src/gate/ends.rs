//! When each waiting ticket's wait ends, soonest first.
//!
//! Tickets mostly join with the latest end (their queue timeout from now) and mostly leave
//! with the earliest (the oldest ticket is served first): while few wait, a deque kept in
//! order serves both at its ends, where an ordered tree would search and rebalance at every
//! wait; a ticket that joins or leaves elsewhere (a deadline sooner than the queue timeout, a
//! slot handed to a ticket that is not the oldest, a client that left) is placed by a binary
//! search. Once many wait, an ordered tree: there a deque would move up to half its entries
//! for each ticket leaving from its middle.

use std::collections::{BTreeSet, VecDeque};
use std::time::Instant;

use super::pass::TicketId;

/// A ticket's end, ordered by time, then by ticket.
type End = (Instant, TicketId);

/// Each waiting ticket's end, in order (ties by ticket).
#[derive(Debug)]
pub enum Ends {
    /// Few tickets wait.
    Few(VecDeque<End>),
    /// Many wait.
    Many(BTreeSet<End>),
}

/// Past this many ends they go into a tree.
const MANY: usize = 256;
/// Below this many they go back into a deque (well below [`MANY`], so that a count that
/// hovers around it does not move them back and forth).
const FEW: usize = 64;

impl Default for Ends {
    fn default() -> Ends {
        Ends::Few(VecDeque::new())
    }
}

impl Ends {
    /// Adds `id`'s end.
    pub fn insert(&mut self, end: Instant, id: TicketId) {
        let entry = (end, id);
        match self {
            Ends::Few(few) => {
                if few.back().is_none_or(|last| *last < entry) {
                    few.push_back(entry);
                } else {
                    let at = few.partition_point(|e| *e < entry);
                    if few.get(at) != Some(&entry) {
                        few.insert(at, entry);
                    }
                }
                if few.len() > MANY {
                    *self = Ends::Many(few.drain(..).collect());
                }
            }
            Ends::Many(many) => {
                many.insert(entry);
            }
        }
    }

    /// Removes `id`'s end, if it is there.
    pub fn remove(&mut self, end: Instant, id: TicketId) {
        let entry = (end, id);
        match self {
            Ends::Few(few) => {
                if few.front() == Some(&entry) {
                    few.pop_front();
                } else if let Ok(at) = few.binary_search(&entry) {
                    few.remove(at);
                }
            }
            Ends::Many(many) => {
                many.remove(&entry);
                self.fewer();
            }
        }
    }

    /// The soonest end.
    pub fn first(&self) -> Option<End> {
        match self {
            Ends::Few(few) => few.front().copied(),
            Ends::Many(many) => many.first().copied(),
        }
    }

    /// Removes the soonest end.
    pub fn pop_first(&mut self) -> Option<End> {
        match self {
            Ends::Few(few) => few.pop_front(),
            Ends::Many(many) => {
                let first = many.pop_first();
                self.fewer();
                first
            }
        }
    }

    /// Back into a deque once few are left in the tree.
    fn fewer(&mut self) {
        if let Ends::Many(many) = self {
            if many.len() < FEW {
                *self = Ends::Few(std::mem::take(many).into_iter().collect());
            }
        }
    }

    /// Every end, in order.
    #[cfg(test)]
    fn iter(&self) -> Box<dyn Iterator<Item = End> + '_> {
        match self {
            Ends::Few(few) => Box::new(few.iter().copied()),
            Ends::Many(many) => Box::new(many.iter().copied()),
        }
    }
}

impl FromIterator<End> for Ends {
    fn from_iter<I: IntoIterator<Item = End>>(iter: I) -> Ends {
        let mut ends: Vec<_> = iter.into_iter().collect();
        ends.sort_unstable();
        ends.dedup();
        match ends.len() > MANY {
            true => Ends::Many(ends.into_iter().collect()),
            false => Ends::Few(ends.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::time::Duration;

    /// What a step does: add an end, remove one, take the soonest.
    #[derive(Clone, Copy, Debug)]
    enum Step {
        Join,
        Leave,
        Take,
    }

    /// `steps` (with an end's time and ticket) applied to `Ends` and to an ordered set alike:
    /// the ends are always the set's.
    fn same_as_a_set(steps: &[(Step, u64, u64)]) -> Result<(), TestCaseError> {
        let base = Instant::now();
        let (mut ends, mut set) = (Ends::default(), BTreeSet::new());
        for (n, &(step, at, id)) in steps.iter().enumerate() {
            let entry = (base + Duration::from_millis(at), TicketId(id));
            match step {
                Step::Join => {
                    ends.insert(entry.0, entry.1);
                    set.insert(entry);
                }
                Step::Leave => {
                    ends.remove(entry.0, entry.1);
                    set.remove(&entry);
                }
                Step::Take => prop_assert_eq!(ends.pop_first(), set.pop_first()),
            }
            prop_assert_eq!(ends.first(), set.first().copied());
            if n % 16 == 0 {
                prop_assert!(ends.iter().eq(set.iter().copied()));
            }
        }
        prop_assert!(ends.iter().eq(set.iter().copied()));
        let rebuilt: Ends = set.iter().copied().chain(set.iter().copied()).collect();
        prop_assert!(rebuilt.iter().eq(set.iter().copied()));
        Ok(())
    }

    proptest! {
        /// Whatever the order of joins and leaves, the ends are those of an ordered set.
        #[test]
        fn the_ends_are_an_ordered_set(ops in prop::collection::vec((0u8..4, 0u64..40, 0u64..8), 0..200)) {
            let steps: Vec<_> = ops
                .into_iter()
                .map(|(op, at, id)| {
                    let step = [Step::Join, Step::Join, Step::Leave, Step::Take][usize::from(op)];
                    (step, at, id)
                })
                .collect();
            same_as_a_set(&steps)?;
        }

        /// The same with many tickets: the ends go into a tree as they grow by joins, and
        /// back into a deque as they shrink, mostly by takes.
        #[test]
        fn many_ends_are_an_ordered_set_too(
            grow in prop::collection::vec((0u8..8, 0u64..400, 0u64..600), 300..700),
            shrink in prop::collection::vec((0u8..8, 0u64..400, 0u64..600), 400..900),
        ) {
            let growing = grow.into_iter().map(|(op, at, id)| {
                (if op < 7 { Step::Join } else { Step::Leave }, at, id)
            });
            let shrinking = shrink.into_iter().map(|(op, at, id)| {
                let step = match op {
                    0 => Step::Join,
                    1 | 2 => Step::Leave,
                    _ => Step::Take,
                };
                (step, at, id)
            });
            let steps: Vec<_> = growing.chain(shrinking).collect();
            same_as_a_set(&steps)?;
        }
    }

    #[test]
    fn many_ends_go_into_a_tree_and_few_back_into_a_deque() {
        let base = Instant::now();
        let mut ends = Ends::default();
        for id in 0..=MANY as u64 {
            ends.insert(base + Duration::from_millis(1000 - id), TicketId(id));
        }
        assert!(matches!(ends, Ends::Many(_)));
        while ends.first().is_some() && matches!(ends, Ends::Many(_)) {
            ends.pop_first();
        }
        assert!(matches!(&ends, Ends::Few(few) if few.len() == FEW - 1));
        let left: Vec<_> = ends.iter().collect();
        assert!(left.windows(2).all(|w| w[0] < w[1]));
    }
}
