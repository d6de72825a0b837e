//! Budgets in seconds of server time: a token bucket per tenant that may go into debt, and recent use
//! that decays.

use std::time::{Duration, Instant};

/// How fast recent use fades: half of it is forgotten every this long.
pub const USE_HALF_LIFE: Duration = Duration::from_secs(10);

/// A tenant's budget settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Budget {
    /// Server-seconds added per second (0.5: half of one backend's time).
    pub rate: f64,
    /// Most seconds the bucket holds.
    pub burst: f64,
    /// Least a statement is charged.
    pub min_charge: f64,
}

/// A token bucket whose balance may go below zero: a statement may start while its tenant
/// owes nothing, and is then charged its whole cost. Refilled lazily from the time given.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TokenBucket {
    balance: f64,
    at: Instant,
}

impl TokenBucket {
    /// A full bucket.
    pub fn full(budget: &Budget, now: Instant) -> TokenBucket {
        TokenBucket {
            balance: budget.burst,
            at: now,
        }
    }

    /// The balance at `now` (negative: what the tenant owes).
    pub fn balance(&self, budget: &Budget, now: Instant) -> f64 {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        (self.balance + elapsed * budget.rate).min(budget.burst)
    }

    fn refill(&mut self, budget: &Budget, now: Instant) {
        if now > self.at {
            self.balance = self.balance(budget, now);
            self.at = now;
        }
    }

    /// Whether the tenant owes time at `now`. A budget of no rate (a fleet's share of
    /// nothing) owes from the start: it admits nothing.
    pub fn owes(&self, budget: &Budget, now: Instant) -> bool {
        budget.rate <= 0.0 || self.balance(budget, now) < 0.0
    }

    /// How long until the debt is paid back (zero when nothing is owed; `None` if it never
    /// will be, at a rate of zero).
    pub fn pay_back(&self, budget: &Budget, now: Instant) -> Option<Duration> {
        if budget.rate <= 0.0 {
            return None;
        }
        let owed = -self.balance(budget, now);
        if owed <= 0.0 {
            return Some(Duration::ZERO);
        }
        Duration::try_from_secs_f64(owed / budget.rate).ok()
    }

    /// Check and charge in one step: if nothing is owed, takes `cost` (at least `min_charge`)
    /// even into debt and returns what was taken; otherwise takes nothing.
    pub fn try_charge(&mut self, budget: &Budget, cost: f64, now: Instant) -> Option<f64> {
        self.refill(budget, now);
        (!self.owes(budget, now)).then(|| self.force_charge(budget, cost, now))
    }

    /// Takes `cost` (at least `min_charge`) whatever is owed; returns what was taken.
    pub fn force_charge(&mut self, budget: &Budget, cost: f64, now: Instant) -> f64 {
        self.refill(budget, now);
        let charged = charge_of(cost, budget.min_charge);
        self.balance -= charged;
        charged
    }

    /// Gives back `amount` that was charged for work that never ran.
    pub fn refund(&mut self, budget: &Budget, amount: f64, now: Instant) {
        self.refill(budget, now);
        self.balance = (self.balance + amount.max(0.0)).min(budget.burst);
    }

    /// Keeps the balance within a new burst.
    pub fn clamp(&mut self, budget: &Budget, now: Instant) {
        self.refill(budget, now);
        self.balance = self.balance.min(budget.burst);
    }
}

/// What a statement of `cost` is charged: its cost, at least `min_charge`; a cost that is not
/// a finite number counts as `min_charge`.
pub fn charge_of(cost: f64, min_charge: f64) -> f64 {
    let cost = if cost.is_finite() { cost } else { 0.0 };
    cost.max(min_charge).max(0.0)
}

/// `2^-half_lives` (`half_lives` at least 0). Under a thousandth of a half-life (the time
/// between two statements of a busy tenant) by the first terms of the series of `e^-z`, whose
/// terms left out are below a thousandth of an f64's precision; longer ones by `exp2`.
fn halving(half_lives: f64) -> f64 {
    if half_lives >= 1.0 / 1024.0 {
        return (-half_lives).exp2();
    }
    let z = half_lives * std::f64::consts::LN_2;
    1.0 - z * (1.0 - z * (0.5 - z * (1.0 / 6.0 - z / 24.0)))
}

/// Recent use in seconds, halving every [`USE_HALF_LIFE`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DecayingUse {
    value: f64,
    at: Instant,
}

impl DecayingUse {
    /// No use.
    pub fn new(now: Instant) -> DecayingUse {
        DecayingUse {
            value: 0.0,
            at: now,
        }
    }

    /// The use at `now`.
    pub fn value(&self, now: Instant) -> f64 {
        if self.value == 0.0 {
            return 0.0;
        }
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.value * halving(elapsed / USE_HALF_LIFE.as_secs_f64())
    }

    /// Adds `amount` (negative to take back a refund; never below zero).
    pub fn add(&mut self, amount: f64, now: Instant) {
        let current = self.value(now);
        self.value = (current + amount).max(0.0);
        self.at = self.at.max(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The series agrees with `exp2` to the last bits wherever it is used, and meets it at the
    /// edge.
    #[test]
    fn halving_is_two_to_the_minus_half_lives() {
        let edge = 1.0 / 1024.0;
        for i in 0..=100_000u32 {
            let y = edge * f64::from(i) / 100_000.0;
            let (got, want) = (halving(y), (-y).exp2());
            assert!(
                (got - want).abs() <= want * 4.0 * f64::EPSILON,
                "{y}: {got} {want}"
            );
        }
        assert_eq!(halving(0.0), 1.0);
        for y in [edge, 0.5, 1.0, 3.0, 60.0] {
            assert_eq!(halving(y), (-y).exp2());
        }
    }

    /// A use halves every half-life, added to or not.
    #[test]
    fn a_use_halves_every_half_life() {
        let t0 = Instant::now();
        let mut u = DecayingUse::new(t0);
        u.add(8.0, t0);
        let close = |a: f64, b: f64| (a - b).abs() <= b * 1e-12;
        assert!(close(u.value(t0 + USE_HALF_LIFE), 4.0));
        assert!(close(u.value(t0 + 3 * USE_HALF_LIFE), 1.0));
        // A thousand adds a millisecond apart: each decays from when it was added.
        let mut v = DecayingUse::new(t0);
        let step = Duration::from_millis(1);
        for i in 0..1_000u32 {
            v.add(1.0, t0 + step * i);
        }
        let end = t0 + step * 999;
        let want: f64 = (0..1_000u32)
            .map(|i| (-(f64::from(999 - i) * 1e-3) / USE_HALF_LIFE.as_secs_f64()).exp2())
            .sum();
        assert!(close(v.value(end), want), "{} {want}", v.value(end));
    }
}
