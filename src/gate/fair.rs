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
use std::collections::{BTreeMap, VecDeque};
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

/// One tenant's line of one class: each ticket's arrival number and where it is kept, in
/// arrival order (tickets join at the back; most leave at the front or the back).
type Line = VecDeque<(u64, usize)>;

/// Each tenant's line of one class.
type Lines = BTreeMap<Arc<str>, Line>;

/// Where a ticket waits: its class (its tenant's line is its pass's), its place in that
/// line, and where it is kept.
#[derive(Debug, Clone, Copy)]
struct Place {
    class: usize,
    seq: u64,
    kept: usize,
}

/// Room for tickets kept once the queue is empty again.
const KEPT_ROOM: usize = 64;

/// Lines kept, empty, for the next ticket of their tenant, while a class has no more lines
/// than this (a tenant that waits again and again does not make a line each time).
const KEPT_LINES: usize = 16;

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
    /// How many tickets wait in each class (its lines may be kept empty).
    counts: [usize; 3],
    /// How many lines hold a ticket, in every class.
    lines_waiting: usize,
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
            counts: [0; 3],
            lines_waiting: 0,
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
        let (id, class) = (pass.id, class(pass.priority));
        let lines = &mut self.classes[class];
        let line = match lines.get_mut(&*pass.tenant) {
            Some(line) => line,
            None => lines.entry(Arc::clone(&pass.tenant)).or_default(),
        };
        let place = Place {
            class,
            seq: self.next_seq,
            kept: self.tickets.insert(Waiting { pass, waiter }),
        };
        if line.is_empty() {
            self.lines_waiting += 1;
        }
        line.push_back((place.seq, place.kept));
        self.counts[class] += 1;
        self.places.insert(id, place);
    }

    /// Whether a ticket of class `priority` waits.
    pub fn has(&self, priority: Priority) -> bool {
        self.counts[class(priority)] > 0
    }

    /// How many tickets wait.
    pub fn len(&self) -> usize {
        self.places.len()
    }

    /// Whether none waits.
    pub fn is_empty(&self) -> bool {
        self.places.is_empty()
    }

    /// How many tenant lines hold a ticket (a tenant waiting in two classes has two).
    pub fn lines_waiting(&self) -> usize {
        self.lines_waiting
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
                    Order::OldestFirst => line.front(),
                    Order::NewestFirst => line.back(),
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
        let tenant = &self.tickets.get(place.kept)?.pass.tenant;
        let lines = &mut self.classes[place.class];
        let line = lines.get_mut(&**tenant)?;
        let at = match (line.front(), line.back()) {
            (Some((seq, _)), _) if *seq == place.seq => 0,
            (_, Some((seq, _))) if *seq == place.seq => line.len() - 1,
            _ => line
                .binary_search_by_key(&place.seq, |(seq, _)| *seq)
                .ok()?,
        };
        line.remove(at);
        if line.is_empty() {
            self.lines_waiting -= 1;
            if lines.len() > KEPT_LINES {
                lines.remove(&**tenant);
            }
        }
        self.counts[place.class] -= 1;
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

    /// The waiting ticket `id`, changeable, and its waiter.
    pub fn get_mut(&mut self, id: TicketId) -> Option<(&mut Pass, &W)> {
        let place = self.places.get(&id)?;
        let w = self.tickets.get_mut(place.kept)?;
        Some((&mut w.pass, &w.waiter))
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
            .flat_map(|line| line.iter())
            .filter_map(|(_, kept)| self.tickets.get(*kept))
            .map(|w| (&w.pass, &w.waiter))
    }

    /// The head ticket of every tenant line.
    pub fn heads(&self) -> impl Iterator<Item = &Pass> {
        self.classes
            .iter()
            .flat_map(|lines| lines.values())
            .filter_map(|line| line.front())
            .filter_map(|(_, kept)| self.tickets.get(*kept))
            .map(|w| &w.pass)
    }
}

#[cfg(test)]
mod tests {
    use super::super::pass::{PassFields, Payment};
    use super::*;
    use crate::gate::{Lane, RequestKind};
    use std::time::{Duration, Instant};

    fn pass(id: u64, tenant: &str) -> Pass {
        let name: Arc<str> = Arc::from("db");
        Pass::new(PassFields {
            id: TicketId(id),
            client_id: id,
            tenant: Arc::from(tenant),
            priority: Priority::Normal,
            kind: RequestKind::Statement,
            fingerprint: None,
            upstream: Arc::clone(&name),
            database: name,
            lane: Lane::Fast,
            sent_at: Instant::now(),
            deadline: None,
            enqueued_at: None,
            notify_at: None,
            waited: Duration::ZERO,
            waited_for_budget: false,
            payment: Payment::Unpaid,
            places: Default::default(),
        })
    }

    fn even(_: &Pass) -> Option<Rank> {
        Some(Rank {
            demoted: false,
            score: 0.0,
        })
    }

    #[test]
    fn a_ticket_leaves_its_line_from_anywhere_and_the_rest_keep_their_order() {
        let mut queue = FairQueue::default();
        for id in 1..=5 {
            queue.push(pass(id, "acme"), id);
        }
        // The middle, the back, then the head.
        assert_eq!(queue.remove(TicketId(3)).map(|(_, w)| w), Some(3));
        assert_eq!(queue.remove(TicketId(5)).map(|(_, w)| w), Some(5));
        assert_eq!(queue.best(even), Some(TicketId(1)));
        assert_eq!(queue.best_in(Order::NewestFirst, even), Some(TicketId(4)));
        assert_eq!(queue.remove(TicketId(1)).map(|(_, w)| w), Some(1));
        assert!(queue.remove(TicketId(1)).is_none());
        let left: Vec<u64> = queue.iter().map(|(_, w)| *w).collect();
        assert_eq!(left, [2, 4]);
        assert_eq!(queue.len(), 2);
        assert_eq!(queue.lines_waiting(), 1);
    }

    #[test]
    fn a_line_kept_empty_holds_no_ticket() {
        let mut queue = FairQueue::default();
        queue.push(pass(1, "acme"), ());
        queue.push(pass(2, "globex"), ());
        assert_eq!(queue.lines_waiting(), 2);
        assert!(queue.remove(TicketId(1)).is_some());
        // acme's line is kept, empty: globex's ticket is the one to serve.
        assert_eq!(queue.lines_waiting(), 1);
        assert!(queue.has(Priority::Normal));
        assert_eq!(queue.best(even), Some(TicketId(2)));
        assert_eq!(queue.heads().count(), 1);
        assert!(queue.remove(TicketId(2)).is_some());
        assert_eq!(queue.lines_waiting(), 0);
        assert!(!queue.has(Priority::Normal));
        assert!(queue.is_empty());
        assert_eq!(queue.best(even), None);
        // acme comes back to its kept line.
        queue.push(pass(3, "acme"), ());
        assert_eq!(queue.best(even), Some(TicketId(3)));
    }

    #[test]
    fn empty_lines_are_kept_only_while_there_are_few() {
        let mut queue = FairQueue::default();
        let tenants = KEPT_LINES as u64 * 2;
        for id in 0..tenants {
            queue.push(pass(id, &format!("t{id}")), ());
        }
        for id in 0..tenants {
            assert!(queue.remove(TicketId(id)).is_some());
        }
        assert!(queue.classes[1].len() <= KEPT_LINES);
        assert!(queue.is_empty());
        assert_eq!(queue.lines_waiting(), 0);
    }
}
