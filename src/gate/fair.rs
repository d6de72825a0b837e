//! The order in which waiting tickets get a slot: the highest priority class first, then the
//! waiting tenant with the lowest rank (recent use over share, a runaway tenant last), first
//! come first served within a tenant. Never simply whoever came first.
//!
//! Every operation costs the same whatever the number of tickets in a tenant's line: a
//! choice looks at the head of each tenant's line only, and a ticket is found through an
//! index, never by a walk over the queue.

use super::pass::{Pass, TicketId};
use crate::sql::Priority;
use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::sync::Arc;

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
}

/// Each tenant's line of one class, in arrival order: where each ticket is kept.
type Lines = BTreeMap<Arc<str>, BTreeMap<u64, usize>>;

/// Where a ticket waits: its class, its tenant's line, its place in that line, and where
/// it is kept.
#[derive(Debug, Clone)]
struct Place {
    class: usize,
    tenant: Arc<str>,
    seq: u64,
    kept: usize,
}

/// Room for tickets kept once the queue is empty again.
const KEPT_ROOM: usize = 64;

/// Which ticket of a tenant's line goes first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// First come, first served.
    OldestFirst,
    /// Last come, first served (a standing queue).
    NewestFirst,
}

/// Tickets waiting for a slot in one lane, each with the waiter `W` that receives the slot.
#[derive(Debug)]
pub struct FairQueue<W> {
    /// Per priority class (critical, normal, best effort): per tenant, in arrival order.
    classes: [Lines; 3],
    places: foldhash::HashMap<TicketId, Place>,
    /// The tickets, kept in place while the lines order them (a line's nodes then move
    /// small keys, never a ticket).
    tickets: slab::Slab<Waiting<W>>,
    next_seq: u64,
}

impl<W> Default for FairQueue<W> {
    fn default() -> Self {
        FairQueue {
            classes: Default::default(),
            places: foldhash::HashMap::default(),
            tickets: slab::Slab::new(),
            next_seq: 0,
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
        let id = pass.id;
        let place = Place {
            class: class(pass.priority),
            tenant: Arc::clone(&pass.tenant),
            seq: self.next_seq,
            kept: self.tickets.insert(Waiting { pass, waiter }),
        };
        self.classes[place.class]
            .entry(Arc::clone(&place.tenant))
            .or_default()
            .insert(place.seq, place.kept);
        self.places.insert(id, place);
    }

    /// Whether a ticket of class `priority` waits.
    pub fn has(&self, priority: Priority) -> bool {
        !self.classes[class(priority)].is_empty()
    }

    /// How many tickets wait.
    pub fn len(&self) -> usize {
        self.places.len()
    }

    /// Whether none waits.
    pub fn is_empty(&self) -> bool {
        self.places.is_empty()
    }

    /// The ticket to serve next: in the highest class that has one, the head of the tenant
    /// line with the lowest rank (ties: the earlier arrival). `rank` is `None` for a ticket
    /// that may not take a slot now; its tenant's later tickets wait behind it.
    pub fn best(&self, rank: impl Fn(&Pass) -> Option<Rank>) -> Option<TicketId> {
        self.best_in(Order::OldestFirst, rank)
    }

    /// As [`best`](Self::best) in `order`: newest first (a queue that has stood, where the
    /// tickets that waited longest are the likeliest to have been given up on) takes the
    /// newest ticket of each tenant line, and the later arrival on a tie.
    pub fn best_in(&self, order: Order, rank: impl Fn(&Pass) -> Option<Rank>) -> Option<TicketId> {
        self.classes.iter().find_map(|lines| {
            lines
                .values()
                .filter_map(|line| match order {
                    Order::OldestFirst => line.iter().next(),
                    Order::NewestFirst => line.iter().next_back(),
                })
                .filter_map(|(seq, kept)| {
                    let pass = &self.tickets.get(*kept)?.pass;
                    rank(pass).map(|r| (r, *seq, pass.id))
                })
                .min_by(|a, b| {
                    let by_arrival = match order {
                        Order::OldestFirst => a.1.cmp(&b.1),
                        Order::NewestFirst => b.1.cmp(&a.1),
                    };
                    a.0.cmp(&b.0).then(by_arrival)
                })
                .map(|(_, _, id)| id)
        })
    }

    /// Removes the ticket `id`, wherever it waits.
    pub fn remove(&mut self, id: TicketId) -> Option<(Pass, W)> {
        let place = self.places.remove(&id)?;
        let lines = &mut self.classes[place.class];
        let line = lines.get_mut(&place.tenant)?;
        line.remove(&place.seq)?;
        if line.is_empty() {
            lines.remove(&place.tenant);
        }
        let w = self.tickets.try_remove(place.kept)?;
        if self.tickets.is_empty() && self.tickets.capacity() > KEPT_ROOM {
            // The crowd is gone: so is the room it took.
            self.tickets = slab::Slab::new();
        }
        Some((w.pass, w.waiter))
    }

    /// Whether the ticket `id` waits here.
    pub fn contains(&self, id: TicketId) -> bool {
        self.places.contains_key(&id)
    }

    /// The waiting ticket `id`.
    pub fn get(&self, id: TicketId) -> Option<&Pass> {
        let place = self.places.get(&id)?;
        Some(&self.tickets.get(place.kept)?.pass)
    }

    /// Removes and returns every ticket for which `drop` is true (a walk over the queue:
    /// for rare events such as a kill, never for a decision).
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
            .flat_map(|line| line.values())
            .filter_map(|kept| self.tickets.get(*kept))
            .map(|w| (&w.pass, &w.waiter))
    }

    /// The head ticket of every tenant line.
    pub fn heads(&self) -> impl Iterator<Item = &Pass> {
        self.classes
            .iter()
            .flat_map(|lines| lines.values())
            .filter_map(|line| line.values().next())
            .filter_map(|kept| self.tickets.get(*kept))
            .map(|w| &w.pass)
    }
}
