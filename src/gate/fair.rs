//! The order in which waiting tickets get a slot: the highest priority class first, then the
//! waiting tenant with the lowest rank (recent use over share, a runaway tenant last), first
//! come first served within a tenant. Never simply whoever came first.

use super::pass::{Pass, TicketId};
use crate::sql::Priority;
use std::cmp::Ordering;
use std::collections::{BTreeMap, VecDeque};

/// Where a waiting tenant stands: lower goes first.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rank {
    /// Holds more than its share while others wait: goes after every tenant that does not.
    pub demoted: bool,
    /// Recent use over share.
    pub score: f64,
}

impl Rank {
    fn cmp(&self, other: &Rank) -> Ordering {
        self.demoted
            .cmp(&other.demoted)
            .then(self.score.total_cmp(&other.score))
    }
}

#[derive(Debug)]
struct Waiting<W> {
    pass: Pass,
    waiter: W,
    seq: u64,
}

/// Tickets waiting for a slot in one lane, each with the waiter `W` that receives the slot.
#[derive(Debug)]
pub struct FairQueue<W> {
    /// Per priority class (critical, normal, best effort): per tenant, in arrival order.
    classes: [BTreeMap<String, VecDeque<Waiting<W>>>; 3],
    next_seq: u64,
    len: usize,
}

impl<W> Default for FairQueue<W> {
    fn default() -> Self {
        FairQueue {
            classes: Default::default(),
            next_seq: 0,
            len: 0,
        }
    }
}

fn class(p: Priority) -> usize {
    match p {
        Priority::Critical => 0,
        Priority::Normal => 1,
        Priority::BestEffort => 2,
    }
}

impl<W> FairQueue<W> {
    /// Adds a ticket at the end of its tenant's line.
    pub fn push(&mut self, pass: Pass, waiter: W) {
        self.next_seq += 1;
        let seq = self.next_seq;
        let line = self.classes[class(pass.priority)]
            .entry(pass.tenant.clone())
            .or_default();
        line.push_back(Waiting { pass, waiter, seq });
        self.len += 1;
    }

    /// How many tickets wait.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether none waits.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The ticket to serve next: in the highest class that has one, the head of the tenant
    /// line with the lowest rank (ties: the earlier arrival). `rank` is `None` for a ticket
    /// that may not take a slot now; its tenant's later tickets wait behind it.
    pub fn best(&self, rank: impl Fn(&Pass) -> Option<Rank>) -> Option<TicketId> {
        self.classes.iter().find_map(|lines| {
            lines
                .values()
                .filter_map(|line| line.front())
                .filter_map(|w| rank(&w.pass).map(|r| (r, w.seq, w.pass.id)))
                .min_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)))
                .map(|(_, _, id)| id)
        })
    }

    /// Removes the ticket `id`, wherever it waits.
    pub fn remove(&mut self, id: TicketId) -> Option<(Pass, W)> {
        for lines in &mut self.classes {
            let found = lines.iter_mut().find_map(|(tenant, line)| {
                let at = line.iter().position(|w| w.pass.id == id)?;
                Some((tenant.clone(), line.remove(at)?))
            });
            if let Some((tenant, w)) = found {
                if lines.get(&tenant).is_some_and(VecDeque::is_empty) {
                    lines.remove(&tenant);
                }
                self.len -= 1;
                return Some((w.pass, w.waiter));
            }
        }
        None
    }

    /// Removes and returns every ticket for which `drop` is true.
    pub fn take_where(&mut self, mut drop: impl FnMut(&Pass, &W) -> bool) -> Vec<(Pass, W)> {
        let ids: Vec<TicketId> = self
            .iter()
            .filter(|(p, w)| drop(p, w))
            .map(|(p, _)| p.id)
            .collect();
        ids.into_iter().filter_map(|id| self.remove(id)).collect()
    }

    /// Every waiting ticket.
    pub fn iter(&self) -> impl Iterator<Item = (&Pass, &W)> {
        self.classes
            .iter()
            .flat_map(|lines| lines.values())
            .flatten()
            .map(|w| (&w.pass, &w.waiter))
    }

    /// The head ticket of every tenant line.
    pub fn heads(&self) -> impl Iterator<Item = &Pass> {
        self.classes
            .iter()
            .flat_map(|lines| lines.values())
            .filter_map(|line| line.front())
            .map(|w| &w.pass)
    }
}
