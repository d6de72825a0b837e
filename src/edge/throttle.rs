//! Failed-login throttle. An address that fails to log in as one role too often within a
//! window is refused for a while as that role; an address that fails too often whatever the
//! roles (guessing names, each of which may cost an auth_query) is refused for a while as
//! every role. Both refusals come before any password is checked or any server is asked.
//!
//! Pure and clock-injected: every method takes `now`, so the policy is tested under
//! simulated time. Memory is bounded by the number of entries each ledger keeps.

use std::collections::HashMap;
use std::hash::Hash;
use std::net::{IpAddr, Ipv6Addr};
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
    /// Recent failures from which the logins under way count as failures to come (so
    /// guesses sent in parallel cannot outrun the limit); below it, logins in parallel (an
    /// application opening its pool) are not limited.
    pub parallel_after: usize,
}

impl Default for ThrottleRule {
    /// Ten failures within a minute block for a minute.
    fn default() -> Self {
        ThrottleRule {
            failures: 10,
            window: Duration::from_secs(60),
            block: Duration::from_secs(60),
            parallel_after: 1,
        }
    }
}

/// The rules per (address, role) and per address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThrottleRules {
    pub per_role: ThrottleRule,
    pub per_address: ThrottleRule,
}

impl Default for ThrottleRules {
    /// Ten failures as one role, or fifty as any roles, within a minute block for a minute.
    /// An address counts logins under way once it has failed half its limit, so a busy
    /// application server with a stray failure can still open its pool at once.
    fn default() -> Self {
        ThrottleRules {
            per_role: ThrottleRule::default(),
            per_address: ThrottleRule {
                failures: 50,
                parallel_after: 25,
                ..ThrottleRule::default()
            },
        }
    }
}

/// What a refusal or a new block is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blocked {
    /// This address as this role.
    Role { until: Instant },
    /// This address, whatever the role.
    Address { until: Instant },
}

/// The state of one key.
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

/// Failed logins per key under one rule.
#[derive(Debug)]
struct Ledger<K> {
    rule: ThrottleRule,
    records: HashMap<K, Record>,
    /// Logins under way per key.
    in_flight: HashMap<K, usize>,
    max_entries: usize,
}

impl<K: Hash + Eq + Clone> Ledger<K> {
    fn new(rule: ThrottleRule, max_entries: usize) -> Self {
        Ledger {
            rule,
            records: HashMap::new(),
            in_flight: HashMap::new(),
            max_entries: max_entries.max(1),
        }
    }

    /// `Err(until)` while `key` is blocked.
    fn check(&mut self, key: &K, now: Instant) -> Result<(), Instant> {
        match self.records.get(key) {
            Some(Record::Blocked(until)) if *until > now => Err(*until),
            Some(Record::Blocked(_)) => {
                self.records.remove(key);
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// `Err(until)` while `key` is blocked, or while its recent failures and the attempts
    /// under way reach the limit.
    fn may_begin(&mut self, key: &K, now: Instant) -> Result<(), Instant> {
        self.check(key, now)?;
        let window = self.rule.window;
        let recent = match self.records.get(key) {
            Some(Record::Failing(times)) => times
                .iter()
                .filter(|t| now.saturating_duration_since(**t) < window)
                .count(),
            _ => 0,
        };
        let flying = self.in_flight.get(key).copied().unwrap_or(0);
        if recent >= self.rule.parallel_after.max(1) && recent + flying >= self.rule.failures {
            return Err(now + self.rule.block);
        }
        Ok(())
    }

    fn begin(&mut self, key: &K) {
        *self.in_flight.entry(key.clone()).or_default() += 1;
    }

    fn end(&mut self, key: &K) {
        if let Some(n) = self.in_flight.get_mut(key) {
            *n -= 1;
            if *n == 0 {
                self.in_flight.remove(key);
            }
        }
    }

    /// Records a failure; `Some(until)` when it starts a block.
    fn failed(&mut self, key: &K, now: Instant) -> Option<Instant> {
        if !self.records.contains_key(key) && self.records.len() >= self.max_entries {
            self.make_room(now);
        }
        let rule = self.rule;
        let record = self
            .records
            .entry(key.clone())
            .or_insert_with(|| Record::Failing(Vec::new()));
        if let Record::Blocked(until) = record {
            if *until > now {
                return None;
            }
            *record = Record::Failing(Vec::new());
        }
        let Record::Failing(times) = record else {
            return None;
        };
        times.retain(|t| now.saturating_duration_since(*t) < rule.window);
        times.push(now);
        if times.len() >= rule.failures {
            *record = Record::Blocked(now + rule.block);
            return Some(now + rule.block);
        }
        None
    }

    /// Forgets the failures of `key` (not a block).
    fn forgive(&mut self, key: &K) {
        if matches!(self.records.get(key), Some(Record::Failing(_))) {
            self.records.remove(key);
        }
    }

    /// Forgets every expired record; if none was, the failing key that expires first (a
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

/// The address an attempt is counted under: IPv4 as is (also when mapped into IPv6), IPv6
/// by its /64 prefix, which one host usually holds whole. A Unix socket is not counted per
/// address (the console is reached that way; its peers are local).
fn address_key(addr: Option<IpAddr>) -> Option<IpAddr> {
    match addr?.to_canonical() {
        IpAddr::V6(v6) => {
            let bits = u128::from(v6) & !((1u128 << 64) - 1);
            Some(IpAddr::V6(Ipv6Addr::from(bits)))
        }
        v4 => Some(v4),
    }
}

/// The (address, role) pair an attempt is counted under: the address as
/// [`address_key`] counts it, so an IPv6 host cannot spread its guesses at one role over its
/// /64.
fn keyed(who: &Attempt) -> Attempt {
    Attempt {
        addr: address_key(who.addr),
        role: who.role.clone(),
    }
}

/// Failed logins per (address, role) and per address.
#[derive(Debug)]
pub struct LoginThrottle {
    pairs: Ledger<Attempt>,
    addresses: Ledger<IpAddr>,
}

impl LoginThrottle {
    /// A throttle that remembers at most `max_entries` (address, role) pairs and as many
    /// addresses; when full, the entry whose record expires first is forgotten.
    pub fn new(rules: ThrottleRules, max_entries: usize) -> Self {
        LoginThrottle {
            pairs: Ledger::new(rules.per_role, max_entries),
            addresses: Ledger::new(rules.per_address, max_entries),
        }
    }

    /// `Err` while `who` is blocked, as this role or as its address.
    pub fn check(&mut self, who: &Attempt, now: Instant) -> Result<(), Blocked> {
        self.pairs
            .check(&keyed(who), now)
            .map_err(|until| Blocked::Role { until })?;
        match address_key(who.addr) {
            Some(a) => self
                .addresses
                .check(&a, now)
                .map_err(|until| Blocked::Address { until }),
            None => Ok(()),
        }
    }

    /// Starts a login attempt: refused while `who` is blocked, or, once it has failed
    /// recently, while its failures and the attempts still under way reach a limit. Every
    /// `Ok` must be followed by [`LoginThrottle::end`].
    pub fn begin(&mut self, who: &Attempt, now: Instant) -> Result<(), Blocked> {
        let addr = address_key(who.addr);
        if let Some(a) = &addr {
            self.addresses
                .may_begin(a, now)
                .map_err(|until| Blocked::Address { until })?;
        }
        let pair = keyed(who);
        self.pairs
            .may_begin(&pair, now)
            .map_err(|until| Blocked::Role { until })?;
        self.pairs.begin(&pair);
        if let Some(a) = &addr {
            self.addresses.begin(a);
        }
        Ok(())
    }

    /// Ends an attempt [`LoginThrottle::begin`] started, whatever its outcome.
    pub fn end(&mut self, who: &Attempt) {
        self.pairs.end(&keyed(who));
        if let Some(a) = address_key(who.addr) {
            self.addresses.end(&a);
        }
    }

    /// Records a failed login; returns the block it starts, if it starts one.
    pub fn failed(&mut self, who: &Attempt, now: Instant) -> Option<Blocked> {
        let by_address = address_key(who.addr)
            .and_then(|a| self.addresses.failed(&a, now))
            .map(|until| Blocked::Address { until });
        let by_role = self
            .pairs
            .failed(&keyed(who), now)
            .map(|until| Blocked::Role { until });
        by_address.or(by_role)
    }

    /// A successful login forgets the failures as this role before it. The address's
    /// failures stay: logging in as one's own role does not make guesses at others free.
    pub fn succeeded(&mut self, who: &Attempt) {
        self.pairs.forgive(&keyed(who));
    }

    /// How many (address, role) pairs are remembered.
    pub fn len(&self) -> usize {
        self.pairs.records.len()
    }

    /// How many addresses are remembered.
    pub fn addresses(&self) -> usize {
        self.addresses.records.len()
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.pairs.records.is_empty() && self.addresses.records.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guesses_at_one_role_from_one_ipv6_slash_64_count_together() {
        let mut t = LoginThrottle::new(ThrottleRules::default(), 100);
        let now = Instant::now();
        for i in 0..ThrottleRules::default().per_role.failures {
            let w = who(&format!("2001:db8::{:x}", i + 1), "alice");
            t.begin(&w, now).unwrap();
            t.failed(&w, now);
            t.end(&w);
        }
        assert!(t.check(&who("2001:db8::ffff", "alice"), now).is_err());
        assert!(t.check(&who("2001:db8:0:1::1", "alice"), now).is_ok());
    }

    fn who(addr: &str, role: &str) -> Attempt {
        Attempt {
            addr: Some(addr.parse().unwrap()),
            role: role.into(),
        }
    }

    #[test]
    fn ten_failures_in_a_minute_block_for_a_minute() {
        let mut t = LoginThrottle::new(ThrottleRules::default(), 100);
        let start = Instant::now();
        let a = who("10.0.0.1", "alice");
        for i in 0..9 {
            assert!(t.failed(&a, start + Duration::from_secs(i)).is_none());
            assert!(t.check(&a, start + Duration::from_secs(i)).is_ok());
        }
        assert!(t.failed(&a, start + Duration::from_secs(9)).is_some());
        let until = t.check(&a, start + Duration::from_secs(10)).unwrap_err();
        assert_eq!(
            until,
            Blocked::Role {
                until: start + Duration::from_secs(69)
            }
        );
        assert!(t.check(&a, start + Duration::from_secs(68)).is_err());
        assert!(t.check(&a, start + Duration::from_secs(69)).is_ok());
        // The block is over and the slate is clean.
        assert!(t.failed(&a, start + Duration::from_secs(70)).is_none());
    }

    #[test]
    fn failures_outside_the_window_do_not_add_up() {
        let mut t = LoginThrottle::new(ThrottleRules::default(), 100);
        let start = Instant::now();
        let a = who("10.0.0.1", "alice");
        for i in 0..30 {
            // One failure every 7 seconds: never 10 within 60 seconds.
            assert!(t.failed(&a, start + Duration::from_secs(i * 7)).is_none());
        }
        assert!(t.check(&a, start + Duration::from_secs(300)).is_ok());
    }

    #[test]
    fn blocks_are_per_address_and_role() {
        let mut t = LoginThrottle::new(ThrottleRules::default(), 100);
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
        let mut t = LoginThrottle::new(ThrottleRules::default(), 100);
        let now = Instant::now();
        let a = who("10.0.0.1", "alice");
        for _ in 0..10 {
            t.failed(&a, now);
        }
        assert!(t.failed(&a, now + Duration::from_secs(30)).is_none());
        assert!(t.check(&a, now + Duration::from_secs(60)).is_ok());
    }

    #[test]
    fn success_forgets_failures() {
        let mut t = LoginThrottle::new(ThrottleRules::default(), 100);
        let now = Instant::now();
        let a = who("10.0.0.1", "alice");
        for _ in 0..9 {
            t.failed(&a, now);
        }
        t.succeeded(&a);
        assert!(t.failed(&a, now).is_none());
        assert!(t.check(&a, now).is_ok());
    }

    #[test]
    fn attempts_under_way_count_against_the_limit_after_a_failure() {
        let mut t = LoginThrottle::new(ThrottleRules::default(), 100);
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
        assert!(t.failed(&a, now).is_none());
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
        let mut t = LoginThrottle::new(ThrottleRules::default(), 50);
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

    #[test]
    fn fifty_failures_from_one_address_block_every_role() {
        let mut t = LoginThrottle::new(ThrottleRules::default(), 1000);
        let start = Instant::now();
        for i in 0..49u64 {
            let guess = who("10.0.0.1", &format!("name{i}"));
            assert!(t.begin(&guess, start + Duration::from_millis(i)).is_ok());
            assert_eq!(t.failed(&guess, start + Duration::from_millis(i)), None);
            t.end(&guess);
        }
        let last = who("10.0.0.1", "name49");
        let at = start + Duration::from_secs(1);
        assert_eq!(
            t.failed(&last, at),
            Some(Blocked::Address {
                until: at + Duration::from_secs(60)
            })
        );
        // Every role from that address, known or not, is refused before any work.
        let alice = who("10.0.0.1", "alice");
        assert!(matches!(t.begin(&alice, at), Err(Blocked::Address { .. })));
        assert!(matches!(t.check(&alice, at), Err(Blocked::Address { .. })));
        assert!(t.begin(&who("10.0.0.2", "alice"), at).is_ok());
        assert!(t.begin(&alice, at + Duration::from_secs(61)).is_ok());
    }

    #[test]
    fn a_success_does_not_forgive_the_address() {
        let mut t = LoginThrottle::new(ThrottleRules::default(), 1000);
        let now = Instant::now();
        for i in 0..49 {
            t.failed(&who("10.0.0.1", &format!("name{i}")), now);
        }
        t.succeeded(&who("10.0.0.1", "mine"));
        assert!(t.failed(&who("10.0.0.1", "another"), now).is_some());
        assert!(t.check(&who("10.0.0.1", "mine"), now).is_err());
    }

    #[test]
    fn rotating_names_in_parallel_are_bounded() {
        let mut t = LoginThrottle::new(ThrottleRules::default(), 1000);
        let now = Instant::now();
        for i in 0..25 {
            t.failed(&who("10.0.0.1", &format!("name{i}")), now);
        }
        let started = (0..100)
            .filter(|i| t.begin(&who("10.0.0.1", &format!("guess{i}")), now).is_ok())
            .count();
        assert_eq!(
            started, 25,
            "twenty-five failures and twenty-five under way reach fifty"
        );
    }

    #[test]
    fn addresses_are_grouped_and_sockets_are_not_counted() {
        let mut t = LoginThrottle::new(ThrottleRules::default(), 1000);
        let now = Instant::now();
        for i in 0..50u16 {
            let addr = std::net::Ipv6Addr::new(0x2001, 0xdb8, 0, 1, 0, 0, 0, i);
            t.failed(
                &Attempt {
                    addr: Some(addr.into()),
                    role: format!("name{i}"),
                },
                now,
            );
        }
        let neighbour = Attempt {
            addr: Some("2001:db8:0:1::ffff".parse().unwrap()),
            role: "alice".into(),
        };
        assert!(t.check(&neighbour, now).is_err(), "same /64");
        let elsewhere = Attempt {
            addr: Some("2001:db8:0:2::1".parse().unwrap()),
            role: "alice".into(),
        };
        assert!(t.check(&elsewhere, now).is_ok());
        // IPv4 mapped into IPv6 is its IPv4 address, not one /64 of all IPv4.
        let mapped = |last: u8| Attempt {
            addr: Some(
                std::net::Ipv4Addr::new(10, 0, 0, last)
                    .to_ipv6_mapped()
                    .into(),
            ),
            role: format!("r{last}"),
        };
        for _ in 0..50 {
            t.failed(&mapped(1), now);
        }
        assert!(t.check(&who("10.0.0.1", "x"), now).is_err());
        assert!(t.check(&mapped(2), now).is_ok());
        // Over a Unix socket only the (address, role) rule applies.
        for i in 0..100 {
            let local = Attempt {
                addr: None,
                role: format!("name{i}"),
            };
            t.failed(&local, now);
        }
        let admin = Attempt {
            addr: None,
            role: "pgbouncer".into(),
        };
        assert!(t.begin(&admin, now).is_ok());
    }
}
