//! Failed-login throttle: an address that fails to log in as one role too often within a
//! window is refused for a while, before any password is checked or any server is asked.
//!
//! Pure and clock-injected: every method takes `now`, so the policy is tested under
//! simulated time. Memory is bounded by [`LoginThrottle::max_entries`].

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// Who is trying: the client's address (`None` for a Unix socket) and the role it names.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Attempt {
    pub addr: Option<IpAddr>,
    pub role: String,
}

/// The policy's numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThrottleRule {
    /// Failures within `window` that start a block.
    pub failures: usize,
    pub window: Duration,
    /// How long a block lasts.
    pub block: Duration,
}

impl Default for ThrottleRule {
    /// Ten failures within a minute block for a minute.
    fn default() -> Self {
        ThrottleRule {
            failures: 10,
            window: Duration::from_secs(60),
            block: Duration::from_secs(60),
        }
    }
}

/// The state of one (address, role).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Record {
    /// Recent failures, oldest first, all within the window of the newest.
    Failing(Vec<Instant>),
    /// Refused until this instant.
    Blocked(Instant),
}

impl Record {
    /// The last instant at which this record still matters.
    fn expires(&self, rule: &ThrottleRule) -> Option<Instant> {
        match self {
            Record::Failing(times) => times.last().map(|t| *t + rule.window),
            Record::Blocked(until) => Some(*until),
        }
    }
}

/// Failed logins per (address, role).
#[derive(Debug)]
pub struct LoginThrottle {
    rule: ThrottleRule,
    records: HashMap<Attempt, Record>,
    /// Logins under way per pair: they count against the limit before they fail, so
    /// guesses sent in parallel cannot outrun it.
    in_flight: HashMap<Attempt, usize>,
    max_entries: usize,
}

impl LoginThrottle {
    /// A throttle that remembers at most `max_entries` (address, role) pairs; when full, the
    /// pair whose record expires first is forgotten.
    pub fn new(rule: ThrottleRule, max_entries: usize) -> Self {
        LoginThrottle {
            rule,
            records: HashMap::new(),
            in_flight: HashMap::new(),
            max_entries: max_entries.max(1),
        }
    }

    /// `Err(until)` while `who` is blocked.
    pub fn check(&mut self, who: &Attempt, now: Instant) -> Result<(), Instant> {
        match self.records.get(who) {
            Some(Record::Blocked(until)) if *until > now => Err(*until),
            Some(Record::Blocked(_)) => {
                self.records.remove(who);
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Starts a login attempt: refused (`Err(until)`) while `who` is blocked, or, once it
    /// has failed recently, while its failures and the attempts still under way reach the
    /// limit. Every `Ok` must be followed by [`LoginThrottle::end`].
    pub fn begin(&mut self, who: &Attempt, now: Instant) -> Result<(), Instant> {
        self.check(who, now)?;
        let window = self.rule.window;
        let recent = match self.records.get(who) {
            Some(Record::Failing(times)) => times
                .iter()
                .filter(|t| now.saturating_duration_since(**t) < window)
                .count(),
            _ => 0,
        };
        // Once a pair has failed, the attempts under way count as failures to come; before
        // that, logins in parallel (an application opening its pool) are not limited.
        let flying = self.in_flight.get(who).copied().unwrap_or(0);
        if recent > 0 && recent + flying >= self.rule.failures {
            return Err(now + self.rule.block);
        }
        *self.in_flight.entry(who.clone()).or_default() += 1;
        Ok(())
    }

    /// Ends an attempt [`LoginThrottle::begin`] started, whatever its outcome.
    pub fn end(&mut self, who: &Attempt) {
        if let Some(n) = self.in_flight.get_mut(who) {
            *n -= 1;
            if *n == 0 {
                self.in_flight.remove(who);
            }
        }
    }

    /// Records a failed login; returns true when this failure starts a block.
    pub fn failed(&mut self, who: &Attempt, now: Instant) -> bool {
        if !self.records.contains_key(who) && self.records.len() >= self.max_entries {
            self.make_room(now);
        }
        let rule = self.rule;
        let record = self
            .records
            .entry(who.clone())
            .or_insert_with(|| Record::Failing(Vec::new()));
        let times = match record {
            Record::Blocked(until) if *until > now => return false,
            Record::Blocked(_) => {
                *record = Record::Failing(Vec::new());
                match record {
                    Record::Failing(t) => t,
                    Record::Blocked(_) => return false,
                }
            }
            Record::Failing(t) => t,
        };
        times.retain(|t| now.saturating_duration_since(*t) < rule.window);
        times.push(now);
        if times.len() >= rule.failures {
            *record = Record::Blocked(now + rule.block);
            return true;
        }
        false
    }

    /// A successful login forgets the failures before it.
    pub fn succeeded(&mut self, who: &Attempt) {
        if matches!(self.records.get(who), Some(Record::Failing(_))) {
            self.records.remove(who);
        }
    }

    /// How many pairs are remembered.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Forgets every expired record; if none was, the failing pair that expires first (a
    /// block is forgotten only when nothing else is left).
    fn make_room(&mut self, now: Instant) {
        let rule = self.rule;
        self.records
            .retain(|_, r| r.expires(&rule).is_some_and(|e| e > now));
        if self.records.len() < self.max_entries {
            return;
        }
        let first = self
            .records
            .iter()
            .min_by_key(|(_, r)| (matches!(r, Record::Blocked(_)), r.expires(&rule)))
            .map(|(k, _)| k.clone());
        if let Some(k) = first {
            self.records.remove(&k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn who(addr: &str, role: &str) -> Attempt {
        Attempt {
            addr: Some(addr.parse().unwrap()),
            role: role.into(),
        }
    }

    #[test]
    fn ten_failures_in_a_minute_block_for_a_minute() {
        let mut t = LoginThrottle::new(ThrottleRule::default(), 100);
        let start = Instant::now();
        let a = who("10.0.0.1", "alice");
        for i in 0..9 {
            assert!(!t.failed(&a, start + Duration::from_secs(i)));
            assert!(t.check(&a, start + Duration::from_secs(i)).is_ok());
        }
        assert!(t.failed(&a, start + Duration::from_secs(9)));
        let until = t.check(&a, start + Duration::from_secs(10)).unwrap_err();
        assert_eq!(until, start + Duration::from_secs(69));
        assert!(t.check(&a, start + Duration::from_secs(68)).is_err());
        assert!(t.check(&a, start + Duration::from_secs(69)).is_ok());
        // The block is over and the slate is clean.
        assert!(!t.failed(&a, start + Duration::from_secs(70)));
    }

    #[test]
    fn failures_outside_the_window_do_not_add_up() {
        let mut t = LoginThrottle::new(ThrottleRule::default(), 100);
        let start = Instant::now();
        let a = who("10.0.0.1", "alice");
        for i in 0..30 {
            // One failure every 7 seconds: never 10 within 60 seconds.
            assert!(!t.failed(&a, start + Duration::from_secs(i * 7)));
        }
        assert!(t.check(&a, start + Duration::from_secs(300)).is_ok());
    }

    #[test]
    fn blocks_are_per_address_and_role() {
        let mut t = LoginThrottle::new(ThrottleRule::default(), 100);
        let now = Instant::now();
        let a = who("10.0.0.1", "alice");
        for _ in 0..10 {
            t.failed(&a, now);
        }
        assert!(t.check(&a, now).is_err());
        assert!(t.check(&who("10.0.0.2", "alice"), now).is_ok());
        assert!(t.check(&who("10.0.0.1", "bob"), now).is_ok());
    }

    #[test]
    fn failures_while_blocked_do_not_extend_the_block() {
        let mut t = LoginThrottle::new(ThrottleRule::default(), 100);
        let now = Instant::now();
        let a = who("10.0.0.1", "alice");
        for _ in 0..10 {
            t.failed(&a, now);
        }
        assert!(!t.failed(&a, now + Duration::from_secs(30)));
        assert!(t.check(&a, now + Duration::from_secs(60)).is_ok());
    }

    #[test]
    fn success_forgets_failures() {
        let mut t = LoginThrottle::new(ThrottleRule::default(), 100);
        let now = Instant::now();
        let a = who("10.0.0.1", "alice");
        for _ in 0..9 {
            t.failed(&a, now);
        }
        t.succeeded(&a);
        assert!(!t.failed(&a, now));
        assert!(t.check(&a, now).is_ok());
    }

    #[test]
    fn attempts_under_way_count_against_the_limit_after_a_failure() {
        let mut t = LoginThrottle::new(ThrottleRule::default(), 100);
        let now = Instant::now();
        let a = who("10.0.0.1", "alice");
        for _ in 0..20 {
            assert!(
                t.begin(&a, now).is_ok(),
                "no failure yet: parallel logins pass"
            );
        }
        for _ in 0..20 {
            t.end(&a);
        }
        assert!(!t.failed(&a, now));
        for _ in 0..9 {
            assert!(t.begin(&a, now).is_ok());
        }
        assert!(
            t.begin(&a, now).is_err(),
            "one failure and nine under way reach ten"
        );
        assert!(t.begin(&who("10.0.0.1", "bob"), now).is_ok());
        t.end(&a);
        assert!(t.begin(&a, now).is_ok(), "one ended, one more may start");
    }

    #[test]
    fn memory_is_bounded() {
        let mut t = LoginThrottle::new(ThrottleRule::default(), 50);
        let now = Instant::now();
        for i in 0..10_000u32 {
            let a = Attempt {
                addr: Some(std::net::IpAddr::from(i.to_be_bytes())),
                role: "r".into(),
            };
            t.failed(&a, now + Duration::from_millis(u64::from(i)));
            assert!(t.len() <= 50);
        }
        // A blocked pair is kept while fresher single failures come and go.
        let a = who("192.168.0.1", "alice");
        for _ in 0..10 {
            t.failed(&a, now + Duration::from_secs(20));
        }
        assert!(t.check(&a, now + Duration::from_secs(21)).is_err());
    }
}
