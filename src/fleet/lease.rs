//! Shares of one capacity leased to several pgward instances. An instance never asks about one
//! statement: about once a second it reports what it wants of each resource (a tenant's budget,
//! an upstream lane) and the newest grant it holds, and the store answers with a grant, valid
//! for a lease from the moment the instance sent its report. Until then the instance uses its
//! share on its own; to keep it, it reports again; an instance that dies gives its share back by
//! not renewing it.
//!
//! The store's arithmetic: each live instance's target is its demand plus an even part of what
//! is spare, or a part of the capacity in proportion to its demand when the instances want more
//! than there is. A grant is its target cut to what the other instances may still be using: the
//! store counts every grant an instance may hold, the newest it acknowledged and every newer
//! one (a reply lost on its way is still counted), until that grant's lease and fallback have
//! ended on the store's clock. Each report also says what the instance holds of the resources
//! taken and given back (slots), and that is counted for it too, for as long as its last grant
//! would be: slots held by transactions longer than a lease, above a share since cut, stay
//! counted while the instance reports them (one that cannot report for longer than a lease and
//! its fallback is counted at nothing, whatever it still holds).
//!
//! An instance that cannot reach the store keeps its lease to its end, then falls back to the
//! fallback share its grant carried (never more than the grant, at most an even part of the
//! capacity) for a bounded time, then admits nothing. The store counts the same fallback for the
//! same time, so losing the store, a link or an instance never lets in more than the capacity.
//!
//! Pure: each side says what time it is on its own clock; nothing here reads one.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

/// A point on one side's own clock (the store's, or one instance's), from any fixed start.
pub type Time = Duration;

/// What the shares are of: a tenant's budget or an upstream lane, by name.
pub type Resource = String;

/// How much of each resource, by name.
pub type Amounts = BTreeMap<Resource, f64>;

/// One incarnation of one instance: (instance, incarnation). Two processes started with the
/// same instance number (a rolling restart) are two members, each counted.
pub type Key = (u32, u64);

/// Shares never add up to more than the capacity by more than rounding.
pub const ROUNDING: f64 = 1e-9;

/// Reports whose sending time an instance remembers, to date the replies that answer them.
const REMEMBERED_REPORTS: usize = 64;

/// The lease's timings, the same on both sides.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Terms {
    /// How long a grant holds, from the instance's report (about ten seconds).
    pub lease: Duration,
    /// How long after its lease an instance that heard nothing still admits its fallback share.
    pub fallback: Duration,
    /// How much longer the store counts a grant than the instance uses it (clocks that run at
    /// slightly different rates).
    pub margin: Duration,
}

impl Terms {
    /// How long after a report the store counts what it said the instance holds: as long as
    /// the grant answering it.
    pub fn using_counted(&self) -> Duration {
        self.lease + self.fallback + self.margin
    }
}

impl Default for Terms {
    fn default() -> Self {
        Terms {
            lease: Duration::from_secs(10),
            fallback: Duration::from_secs(60),
            margin: Duration::from_secs(1),
        }
    }
}

/// What an instance tells the store.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    pub instance: u32,
    /// Chosen anew each time the instance starts: a restarted instance holds nothing.
    pub incarnation: u64,
    /// Counts the incarnation's reports, so a late duplicate is told from a newer one.
    pub number: u64,
    /// The sequence number of the newest grant whose shares the instance keeps within (0:
    /// none): it holds that grant or a newer one.
    pub acked: u64,
    /// What it used and wants of each resource, in the resource's unit.
    pub demands: Amounts,
    /// What it holds now of the resources taken and given back (slots).
    pub using: Amounts,
}

/// One resource's part of a grant.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Share {
    /// What the instance may use until its lease ends.
    pub amount: f64,
    /// What it may use after that, while its fallback lasts.
    pub fallback: f64,
}

impl Share {
    const NONE: Share = Share {
        amount: 0.0,
        fallback: 0.0,
    };
}

/// The store's answer to a report.
#[derive(Clone, Debug, PartialEq)]
pub struct Grant {
    pub instance: u32,
    pub incarnation: u64,
    /// The report it answers.
    pub number: u64,
    /// Unique and increasing across the store's whole life, whichever instance it went to.
    pub seq: u64,
    pub shares: BTreeMap<Resource, Share>,
}

/// A grant as the store counts it.
#[derive(Clone, Debug, PartialEq)]
pub struct Issued {
    pub seq: u64,
    pub shares: BTreeMap<Resource, Share>,
    /// The store's time its lease ends, margin included.
    pub ends: Time,
    /// The store's time its fallback ends, margin included.
    pub fallback_ends: Time,
}

impl Issued {
    /// What the instance may be using of `resource` at `now`, as the store counts it.
    fn level(&self, resource: &str, now: Time) -> f64 {
        let share = self.shares.get(resource).copied().unwrap_or(Share::NONE);
        if now < self.ends {
            share.amount
        } else if now < self.fallback_ends {
            share.fallback
        } else {
            0.0
        }
    }
}

/// One incarnation of an instance as the store knows it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Member {
    pub number: u64,
    /// The newest grant it acknowledged: it holds that one or a newer one.
    pub acked: u64,
    /// The store's time of its last report.
    pub reported: Time,
    pub demands: Amounts,
    /// What it held at its last report, counted until `using_ends`: when the fallback of
    /// the grant answering that report ends (margin included), on the store's clock.
    pub using: Amounts,
    pub using_ends: Time,
    /// Every grant it may still be using.
    pub issued: Vec<Issued>,
}

impl Member {
    /// What it may be using of `resource` at `now`: the most of any grant it may hold, or
    /// what it last said it holds, if more.
    pub fn in_use(&self, resource: &str, now: Time) -> f64 {
        let held = match now < self.using_ends {
            true => self.using.get(resource).copied().unwrap_or(0.0).max(0.0),
            false => 0.0,
        };
        self.issued
            .iter()
            .map(|g| g.level(resource, now))
            .fold(held, f64::max)
    }

    fn forget_spent(&mut self, now: Time) {
        let acked = self.acked;
        self.issued
            .retain(|g| g.seq >= acked && now < g.fallback_ends);
    }
}

/// The store's side: the capacities, every instance's reports and the grants it may be using.
#[derive(Clone, Debug, PartialEq)]
pub struct Ledger {
    pub terms: Terms,
    pub capacities: Amounts,
    /// The resources shared in whole units (an upstream's slots): each share is a whole
    /// number, the units left after the whole parts going to the largest remainders.
    pub whole: BTreeSet<Resource>,
    pub members: BTreeMap<Key, Member>,
    /// The next grant's sequence number (kept with the ledger: never reused, even after a
    /// restart of the store or of an instance).
    pub next_seq: u64,
}

impl Ledger {
    pub fn new(terms: Terms, capacities: Amounts) -> Ledger {
        Ledger {
            terms,
            capacities,
            whole: BTreeSet::new(),
            members: BTreeMap::new(),
            next_seq: 1,
        }
    }

    /// Takes a report at the store's `now` and answers it with a grant, or with nothing when
    /// the report is older than one already taken from the same incarnation.
    pub fn answer(&mut self, now: Time, report: &Report) -> Option<Grant> {
        let key = (report.instance, report.incarnation);
        let member = self.members.entry(key).or_default();
        if member.number > 0 && report.number <= member.number {
            return None;
        }
        member.number = report.number;
        member.acked = member.acked.max(report.acked);
        member.reported = now;
        member.demands = report.demands.clone();
        member.using = report.using.clone();
        member.using_ends = now + self.terms.using_counted();
        // A sequence that went back (its rows rewritten) still never repeats a grant held.
        self.next_seq = self.next_seq.max(report.acked.saturating_add(1));
        self.forget_spent(now);
        let shares = self.shares_for(key, now);
        let seq = self.next_seq;
        self.next_seq += 1;
        let issued = Issued {
            seq,
            shares: shares.clone(),
            ends: now + self.terms.lease + self.terms.margin,
            fallback_ends: now + self.terms.using_counted(),
        };
        if let Some(member) = self.members.get_mut(&key) {
            member.issued.push(issued);
        }
        Some(Grant {
            instance: report.instance,
            incarnation: report.incarnation,
            number: report.number,
            seq,
            shares,
        })
    }

    /// Forgets the grants no longer counted, and the members that hold none and are silent.
    fn forget_spent(&mut self, now: Time) {
        let lease = self.terms.lease;
        for m in self.members.values_mut() {
            m.forget_spent(now);
        }
        self.members
            .retain(|_, m| !m.issued.is_empty() || now.saturating_sub(m.reported) < lease);
    }

    /// Members that reported within a lease of `now`: those the spare is shared among.
    fn live(&self, now: Time) -> impl Iterator<Item = (&Key, &Member)> {
        let lease = self.terms.lease;
        self.members
            .iter()
            .filter(move |(_, m)| now.saturating_sub(m.reported) < lease)
    }

    fn shares_for(&self, key: Key, now: Time) -> BTreeMap<Resource, Share> {
        let live = self.live(now).count().max(1) as f64;
        self.capacities
            .iter()
            .map(|(resource, &capacity)| {
                let whole = self.whole.contains(resource);
                let targets = self.targets(resource, capacity, whole, now);
                let target = targets.get(&key).copied().unwrap_or(0.0);
                let others: f64 = self
                    .members
                    .iter()
                    .filter(|(k, _)| **k != key)
                    .map(|(_, m)| m.in_use(resource, now))
                    .sum();
                let amount = target.min(capacity - others).max(0.0);
                let share = match whole {
                    true => {
                        let amount = units(amount);
                        Share {
                            amount,
                            fallback: amount.min((capacity / live).ceil()),
                        }
                    }
                    false => Share {
                        amount,
                        fallback: amount.min(capacity / live),
                    },
                };
                (resource.clone(), share)
            })
            .collect()
    }

    /// Each live member's target: its demand plus an even part of the spare, or its part in
    /// proportion to its demand; in whole units for a whole resource.
    fn targets(&self, resource: &str, capacity: f64, whole: bool, now: Time) -> BTreeMap<Key, f64> {
        let demands: Vec<(Key, f64)> = self
            .live(now)
            .map(|(k, m)| (*k, m.demands.get(resource).copied().unwrap_or(0.0).max(0.0)))
            .collect();
        let total: f64 = demands.iter().map(|(_, d)| d).sum();
        let live = demands.len().max(1) as f64;
        let mut targets: BTreeMap<Key, f64> = demands
            .into_iter()
            .map(|(k, d)| match total <= capacity {
                true => (k, d + (capacity - total) / live),
                false => (k, capacity * d / total),
            })
            .collect();
        if whole {
            apportion(&mut targets, capacity);
        }
        targets
    }

    /// What every instance may be using of `resource` at `now`, added up.
    pub fn counted(&self, resource: &str, now: Time) -> f64 {
        self.members.values().map(|m| m.in_use(resource, now)).sum()
    }
}

/// The whole units in `amount`, a rounding error below a unit counting as the unit.
fn units(amount: f64) -> f64 {
    (amount + ROUNDING).floor().max(0.0)
}

/// Shares in whole units: each its whole part, then the units left over one each to the
/// largest remainders (the lower key first among equals).
fn apportion(targets: &mut BTreeMap<Key, f64>, capacity: f64) {
    let mut remainders: Vec<(Key, f64)> =
        targets.iter().map(|(k, t)| (*k, t - units(*t))).collect();
    for t in targets.values_mut() {
        *t = units(*t);
    }
    let given: f64 = targets.values().sum();
    let left = (units(capacity) - given).max(0.0) as usize;
    remainders.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    for (k, _) in remainders.into_iter().take(left) {
        if let Some(t) = targets.get_mut(&k) {
            *t += 1.0;
        }
    }
}

/// Where an instance's lease stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standing {
    /// No grant yet: it admits nothing shared.
    Unleased,
    /// Within its lease.
    Leased,
    /// Its lease ended unrenewed; it admits its fallback share.
    Fallback,
    /// Its fallback ended too: it admits nothing shared until the store answers.
    Lapsed,
}

impl Standing {
    pub fn as_str(self) -> &'static str {
        match self {
            Standing::Unleased => "unleased",
            Standing::Leased => "leased",
            Standing::Fallback => "fallback",
            Standing::Lapsed => "lapsed",
        }
    }
}

/// The grant an instance holds, dated on its own clock.
#[derive(Clone, Debug, PartialEq)]
pub struct Held {
    pub seq: u64,
    pub shares: BTreeMap<Resource, Share>,
    /// When its lease ends: a lease from the report's sending, never later than the store's.
    pub ends: Time,
    pub fallback_ends: Time,
}

/// An instance's side: its reports and the newest grant it holds.
#[derive(Clone, Debug)]
pub struct Holder {
    pub instance: u32,
    pub incarnation: u64,
    terms: Terms,
    next_number: u64,
    /// The newest grant whose shares its use kept within, as the reports say.
    acked: u64,
    /// (report number, when it was sent), the newest last.
    sent: VecDeque<(u64, Time)>,
    held: Option<Held>,
}

impl Holder {
    pub fn new(instance: u32, incarnation: u64, terms: Terms) -> Holder {
        Holder {
            instance,
            incarnation,
            terms,
            next_number: 1,
            acked: 0,
            sent: VecDeque::new(),
            held: None,
        }
    }

    /// The report to send at `now`, `using` what it holds now of the resources taken and
    /// given back (slots). It acknowledges the grant it holds only once what it uses fits
    /// within that grant: until then the store goes on counting the larger one before it.
    pub fn report(&mut self, now: Time, demands: Amounts, using: &Amounts) -> Report {
        if let Some(h) = &self.held {
            if using
                .iter()
                .all(|(r, used)| *used <= self.share(r, now) + ROUNDING)
            {
                self.acked = h.seq;
            }
        }
        let number = self.next_number;
        self.next_number += 1;
        if self.sent.len() == REMEMBERED_REPORTS {
            self.sent.pop_front();
        }
        self.sent.push_back((number, now));
        Report {
            instance: self.instance,
            incarnation: self.incarnation,
            number,
            acked: self.acked,
            demands,
            using: using.clone(),
        }
    }

    /// Takes a grant, unless it is not for this incarnation, answers a report it no longer
    /// remembers, or is older than the one it holds. Says whether it was taken.
    pub fn receive(&mut self, grant: &Grant) -> bool {
        if grant.instance != self.instance || grant.incarnation != self.incarnation {
            return false;
        }
        if self.held.as_ref().is_some_and(|h| h.seq >= grant.seq) {
            return false;
        }
        let Some(&(_, sent)) = self.sent.iter().find(|(n, _)| *n == grant.number) else {
            return false;
        };
        self.held = Some(Held {
            seq: grant.seq,
            shares: grant.shares.clone(),
            ends: sent + self.terms.lease,
            fallback_ends: sent + self.terms.lease + self.terms.fallback,
        });
        true
    }

    pub fn standing(&self, now: Time) -> Standing {
        match &self.held {
            None => Standing::Unleased,
            Some(h) if now < h.ends => Standing::Leased,
            Some(h) if now < h.fallback_ends => Standing::Fallback,
            Some(_) => Standing::Lapsed,
        }
    }

    /// What it may use of `resource` at `now`.
    pub fn share(&self, resource: &str, now: Time) -> f64 {
        let Some(h) = &self.held else { return 0.0 };
        let share = h.shares.get(resource).copied().unwrap_or(Share::NONE);
        match self.standing(now) {
            Standing::Leased => share.amount,
            Standing::Fallback => share.fallback,
            Standing::Unleased | Standing::Lapsed => 0.0,
        }
    }

    pub fn held(&self) -> Option<&Held> {
        self.held.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Time {
        Duration::from_secs(s)
    }

    fn amounts(pairs: &[(&str, f64)]) -> Amounts {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    fn terms() -> Terms {
        Terms {
            lease: secs(10),
            fallback: secs(20),
            margin: Duration::ZERO,
        }
    }

    /// `holder` reports wanting `want` of acme at `at`; the store's grant (not yet received).
    fn ask(ledger: &mut Ledger, holder: &mut Holder, at: u64, want: f64) -> Grant {
        let report = holder.report(secs(at), amounts(&[("acme", want)]), &Amounts::new());
        ledger.answer(secs(at), &report).expect("answered")
    }

    /// [`ask`], the grant received; its amount.
    fn renew(ledger: &mut Ledger, holder: &mut Holder, at: u64, want: f64) -> f64 {
        let grant = ask(ledger, holder, at, want);
        assert!(holder.receive(&grant));
        grant.shares["acme"].amount
    }

    /// A ledger of one resource shared in whole units (slots), `lane`, of `capacity`.
    fn lane_ledger(capacity: f64) -> Ledger {
        let mut ledger = Ledger::new(terms(), amounts(&[("lane", capacity)]));
        ledger.whole.insert("lane".into());
        ledger
    }

    /// `holder` reports wanting `want` of the lane and holding `using` at `at`, and receives
    /// the grant; its amount.
    fn lane_turn(ledger: &mut Ledger, holder: &mut Holder, at: u64, want: f64, using: f64) -> f64 {
        let lane = |n: f64| amounts(&[("lane", n)]);
        let report = holder.report(secs(at), lane(want), &lane(using));
        let grant = ledger.answer(secs(at), &report).expect("answered");
        assert!(holder.receive(&grant));
        grant.shares["lane"].amount
    }

    #[test]
    fn enough_for_everyone_gives_demand_plus_an_even_part_of_the_spare() {
        let mut ledger = Ledger::new(terms(), amounts(&[("acme", 10.0)]));
        let mut a = Holder::new(1, 7, terms());
        let mut b = Holder::new(2, 8, terms());
        // Alone, a is offered everything; b, arriving, gets what a does not hold.
        assert_eq!(renew(&mut ledger, &mut a, 0, 2.0), 10.0);
        assert_eq!(renew(&mut ledger, &mut b, 0, 4.0), 0.0);
        // a's renewal is cut to its target; once a says it holds it, b gets its own.
        assert_eq!(renew(&mut ledger, &mut a, 1, 2.0), 2.0 + 2.0);
        assert_eq!(
            renew(&mut ledger, &mut b, 1, 4.0),
            0.0,
            "a's first grant still counts"
        );
        assert_eq!(renew(&mut ledger, &mut a, 2, 2.0), 2.0 + 2.0);
        assert_eq!(renew(&mut ledger, &mut b, 2, 4.0), 4.0 + 2.0);
        assert!(ledger.counted("acme", secs(2)) <= 10.0);
    }

    #[test]
    fn more_wanted_than_there_is_splits_in_proportion_to_demand() {
        let mut ledger = Ledger::new(terms(), amounts(&[("acme", 8.0)]));
        let mut a = Holder::new(1, 1, terms());
        let mut b = Holder::new(2, 1, terms());
        renew(&mut ledger, &mut a, 0, 12.0);
        renew(&mut ledger, &mut b, 0, 4.0);
        renew(&mut ledger, &mut a, 1, 12.0);
        renew(&mut ledger, &mut a, 2, 12.0);
        let g = ask(&mut ledger, &mut b, 2, 4.0);
        assert_eq!(g.shares["acme"].amount, 8.0 * 4.0 / 16.0);
        // The fallback is never more than the grant, at most an even part.
        assert_eq!(g.shares["acme"].fallback, 2.0);
        assert_eq!(renew(&mut ledger, &mut a, 3, 12.0), 8.0 * 12.0 / 16.0);
    }

    #[test]
    fn a_lost_reply_is_still_counted_until_the_instance_says_it_holds_a_newer_one() {
        let mut ledger = Ledger::new(terms(), amounts(&[("acme", 10.0)]));
        let mut a = Holder::new(1, 1, terms());
        let mut b = Holder::new(2, 1, terms());
        let lost = ask(&mut ledger, &mut a, 0, 10.0);
        assert_eq!(lost.shares["acme"].amount, 10.0);
        // Another instance gets nothing while the lost grant may be in use.
        assert_eq!(renew(&mut ledger, &mut b, 1, 10.0), 0.0);
        // a hears its next grant and says so: the lost one is forgotten.
        let heard = renew(&mut ledger, &mut a, 2, 10.0);
        assert_eq!(heard, 5.0, "half of what both want");
        ask(&mut ledger, &mut a, 3, 10.0);
        assert!(ledger.members[&(1, 1)]
            .issued
            .iter()
            .all(|i| i.seq > lost.seq));
    }

    #[test]
    fn an_instance_that_hears_nothing_falls_back_then_admits_nothing() {
        let mut ledger = Ledger::new(terms(), amounts(&[("acme", 10.0)]));
        let mut a = Holder::new(1, 1, terms());
        let mut b = Holder::new(2, 1, terms());
        renew(&mut ledger, &mut b, 0, 1.0);
        renew(&mut ledger, &mut b, 1, 1.0);
        renew(&mut ledger, &mut a, 1, 8.0);
        let g = ask(&mut ledger, &mut a, 2, 8.0);
        assert!(a.receive(&g));
        let share = g.shares["acme"];
        assert!(share.fallback <= share.amount && share.fallback <= 10.0 / 2.0);
        assert_eq!(a.standing(secs(11)), Standing::Leased);
        assert_eq!(a.standing(secs(12)), Standing::Fallback);
        assert_eq!(a.share("acme", secs(12)), share.fallback);
        assert_eq!(a.standing(secs(32)), Standing::Lapsed);
        assert_eq!(a.share("acme", secs(32)), 0.0);
        // The store counts the same fallback for the same time.
        assert_eq!(
            ledger.members[&(1, 1)].in_use("acme", secs(12)),
            share.fallback
        );
        assert_eq!(ledger.members[&(1, 1)].in_use("acme", secs(32)), 0.0);
    }

    #[test]
    fn a_late_duplicate_or_an_old_grant_changes_nothing() {
        let mut ledger = Ledger::new(terms(), amounts(&[("acme", 10.0)]));
        let mut a = Holder::new(1, 1, terms());
        let r1 = a.report(secs(0), amounts(&[("acme", 1.0)]), &Amounts::new());
        let r2 = a.report(secs(1), amounts(&[("acme", 1.0)]), &Amounts::new());
        let g2 = ledger.answer(secs(1), &r2).unwrap();
        assert_eq!(ledger.answer(secs(2), &r1), None);
        assert!(a.receive(&g2));
        assert!(!a.receive(&g2));
        // A grant for an earlier incarnation is not taken by a restarted instance.
        let mut again = Holder::new(1, 2, terms());
        again.report(secs(3), amounts(&[("acme", 1.0)]), &Amounts::new());
        assert!(!again.receive(&g2));
        assert_eq!(again.standing(secs(3)), Standing::Unleased);
        // Its sequence numbers go on from where they were.
        let g = ask(&mut ledger, &mut again, 3, 1.0);
        assert!(g.seq > g2.seq);
    }

    #[test]
    fn two_processes_with_one_instance_number_are_counted_apart() {
        let mut ledger = Ledger::new(terms(), amounts(&[("acme", 10.0)]));
        // A rolling restart: the new process starts while the old one still runs.
        let mut old = Holder::new(1, 1, terms());
        let mut new = Holder::new(1, 2, terms());
        for at in 0..4 {
            renew(&mut ledger, &mut old, at, 10.0);
            renew(&mut ledger, &mut new, at, 10.0);
            let both = old.share("acme", secs(at)) + new.share("acme", secs(at));
            assert!(both <= 10.0 + ROUNDING, "at {at}s both admit {both}");
        }
        assert_eq!(ledger.members.len(), 2);
    }

    #[test]
    fn a_cut_share_of_slots_still_counts_the_slots_held_until_they_are_given_back() {
        let mut ledger = lane_ledger(4.0);
        let mut a = Holder::new(1, 1, terms());
        let mut b = Holder::new(2, 1, terms());
        let mut turn = |h: &mut Holder, at, want, using| lane_turn(&mut ledger, h, at, want, using);
        assert_eq!(turn(&mut a, 0, 4.0, 0.0), 4.0);
        assert_eq!(turn(&mut a, 1, 4.0, 4.0), 4.0);
        // b arrives: a's share is cut to half, but a still holds its four slots.
        assert_eq!(turn(&mut b, 1, 4.0, 0.0), 0.0);
        assert_eq!(turn(&mut a, 2, 4.0, 4.0), 2.0);
        assert_eq!(turn(&mut a, 3, 4.0, 4.0), 2.0);
        assert_eq!(
            turn(&mut b, 3, 4.0, 0.0),
            0.0,
            "a's four slots are still counted"
        );
        // a gives two back and says it keeps within its share: b gets the other half.
        assert_eq!(turn(&mut a, 4, 4.0, 2.0), 2.0);
        assert_eq!(turn(&mut b, 4, 4.0, 0.0), 2.0);
    }

    #[test]
    fn slots_held_past_a_lease_and_its_fallback_are_still_counted() {
        let mut ledger = lane_ledger(4.0);
        let mut a = Holder::new(1, 1, terms());
        let mut b = Holder::new(2, 1, terms());
        let mut turn = |h: &mut Holder, at, want, using| lane_turn(&mut ledger, h, at, want, using);
        assert_eq!(turn(&mut a, 0, 4.0, 0.0), 4.0);
        assert_eq!(turn(&mut a, 1, 4.0, 4.0), 4.0);
        // a's four slots are taken by transactions that outlast the grant's lease and
        // fallback (30 s here) by far, while both go on reporting each second.
        for at in 1..120 {
            turn(&mut a, at, 4.0, 4.0);
            let got = turn(&mut b, at, 4.0, 0.0);
            assert_eq!(got, 0.0, "at {at} s b was granted slots a still holds");
        }
        // They end: b gets its half.
        assert_eq!(turn(&mut a, 120, 4.0, 2.0), 2.0);
        assert_eq!(turn(&mut b, 120, 4.0, 0.0), 2.0);
    }

    #[test]
    fn what_an_instance_says_it_holds_counts_beyond_any_grant_it_acknowledged() {
        let mut ledger = Ledger::new(terms(), amounts(&[("u", 4.0), ("v", 4.0)]));
        ledger.whole.extend(["u".to_string(), "v".to_string()]);
        let mut number = 0;
        let mut report =
            |instance: u32, acked: u64, want: &[(&str, f64)], using: &[(&str, f64)]| {
                number += 1;
                Report {
                    instance,
                    incarnation: 1,
                    number,
                    acked,
                    demands: amounts(want),
                    using: amounts(using),
                }
            };
        // a acknowledged a grant of two slots of u (its use of v never fit a later one),
        // but holds four of u, taken under a newer grant that has since run out.
        let first = report(1, 0, &[("u", 2.0), ("v", 2.0)], &[]);
        ledger.answer(secs(0), &first).expect("answered");
        let both = [("u", 4.0), ("v", 4.0)];
        for at in 1..120 {
            let mine = report(1, 1, &both, &both);
            ledger.answer(secs(at), &mine).expect("answered");
            let theirs = report(2, 0, &both, &[]);
            let grant = ledger.answer(secs(at), &theirs).expect("answered");
            assert_eq!(grant.shares["u"].amount, 0.0, "at {at} s");
            assert!(ledger.counted("u", secs(at)) >= 4.0, "at {at} s");
        }
        // What a says it holds once it stops reporting counts as long as its grants would.
        assert!(ledger.counted("u", secs(119 + 30 - 1)) >= 4.0);
        assert_eq!(ledger.counted("u", secs(119 + 30)), 0.0);
    }

    #[test]
    fn slots_are_shared_in_whole_units_that_add_up_to_all_of_them() {
        let mut ledger = Ledger::new(terms(), amounts(&[("lane", 3.0)]));
        ledger.whole.insert("lane".into());
        let mut holders: Vec<Holder> = (1..=4).map(|i| Holder::new(i, 1, terms())).collect();
        let lane = amounts(&[("lane", 3.0)]);
        for at in 0..4 {
            for h in holders.iter_mut() {
                let report = h.report(secs(at), lane.clone(), &Amounts::new());
                let grant = ledger.answer(secs(at), &report).expect("answered");
                assert!(h.receive(&grant));
            }
        }
        let shares: Vec<f64> = holders.iter().map(|h| h.share("lane", secs(3))).collect();
        assert!(shares.iter().all(|s| *s == 0.0 || *s == 1.0), "{shares:?}");
        assert_eq!(shares.iter().sum::<f64>(), 3.0, "{shares:?}");
    }

    #[test]
    fn a_sequence_that_went_back_goes_on_past_the_grant_an_instance_holds() {
        let mut ledger = Ledger::new(terms(), amounts(&[("acme", 1.0)]));
        let report = Report {
            instance: 1,
            incarnation: 1,
            number: 9,
            acked: 50,
            demands: Amounts::new(),
            using: Amounts::new(),
        };
        assert_eq!(ledger.answer(secs(0), &report).expect("answered").seq, 51);
    }
}
