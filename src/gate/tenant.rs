//! A tenant's settings in the gate, read from `key=value` words: the same words serve the
//! policy file's tenant tables and the admin console's
//! `SET TENANT acme = 'rate=0.5 burst=2 max_active=4 priority=critical'`.
//!
//! | key | value |
//! | --- | --- |
//! | `rate` | server-seconds per second: 0.5 is half of one backend's time (turns the budget on) |
//! | `burst` | most seconds saved up (default: one second of `rate`) |
//! | `min_charge` | least seconds a statement is predicted to cost (default 0.0001) |
//! | `when_over` | `reject`, `wait` or `slow` |
//! | `max_active` | most slots the tenant holds at once (0: no limit) |
//! | `priority` | `critical`, `normal` or `best_effort` |
//! | `share` | weight in the fair share (default 1) |
//! | `statement_timeout`, `idle_in_transaction_timeout`, `transaction_timeout` | a duration (`250ms`, `30s`, `10m`, `1h`; a bare number is milliseconds; 0 is off) |

use super::bucket::Budget;
use crate::sql::Priority;
use std::time::Duration;

/// Default `min_charge`: 100 microseconds, about what the cheapest statement costs a server
/// with its round trip.
pub const DEFAULT_MIN_CHARGE: f64 = 0.0001;

/// What happens to a statement whose tenant owes time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WhenOver {
    /// Refuse it with 53000 and a hint saying when to come back.
    #[default]
    Reject,
    /// Queue it until the debt is paid back, or the queue timeout.
    Wait,
    /// Run it in the slow lane.
    Slow,
}

/// Per-tenant time limits a client cannot switch off; the session enforces them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TenantTimeouts {
    /// Cancel a statement running longer than this (the message names pgward's timeout).
    pub statement: Option<Duration>,
    /// Close a session idle in a transaction longer than this.
    pub idle_in_transaction: Option<Duration>,
    /// End a transaction open longer than this (25P04).
    pub transaction: Option<Duration>,
}

/// A tenant's settings. Everything is optional: an unconfigured tenant has no budget, no
/// slot limit of its own, a share of 1 and its statements' priority.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TenantConfig {
    /// Server-seconds per second; `None`: no budget.
    pub rate: Option<f64>,
    /// Most seconds saved up.
    pub burst: Option<f64>,
    /// Least a statement is charged.
    pub min_charge: Option<f64>,
    /// What happens while the tenant owes time.
    pub when_over: WhenOver,
    /// Most slots held at once.
    pub max_active: Option<usize>,
    /// Replaces the statements' priority when set.
    pub priority: Option<Priority>,
    /// Weight in the fair share.
    pub share: Option<f64>,
    /// Time limits.
    pub timeouts: TenantTimeouts,
}

/// Why tenant settings were refused; nothing is changed then.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TenantConfigError {
    /// A word without `=`.
    #[error("{0:?}: expected key=value")]
    NotAPair(String),
    /// A key the gate does not know.
    #[error("unknown tenant setting {0:?}")]
    UnknownKey(String),
    /// A value that does not fit its key.
    #[error("{key}={value:?}: {reason}")]
    BadValue {
        /// The key.
        key: String,
        /// The value given.
        value: String,
        /// What is wrong.
        reason: &'static str,
    },
}

impl TenantConfig {
    /// The budget, when `rate` is set.
    pub fn budget(&self) -> Option<Budget> {
        let rate = self.rate?;
        Some(Budget {
            rate,
            burst: self.burst.unwrap_or(rate),
            min_charge: self.min_charge.unwrap_or(DEFAULT_MIN_CHARGE),
        })
    }

    /// The weight in the fair share.
    pub fn share(&self) -> f64 {
        self.share.unwrap_or(1.0)
    }

    /// Least a statement is charged, with or without a budget.
    pub fn min_charge(&self) -> f64 {
        self.min_charge.unwrap_or(DEFAULT_MIN_CHARGE)
    }

    /// These settings with `words` (`key=value` separated by blanks) applied.
    pub fn with_words(&self, words: &str) -> Result<TenantConfig, TenantConfigError> {
        let mut next = self.clone();
        for pair in words.split_whitespace() {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| TenantConfigError::NotAPair(pair.to_string()))?;
            next.set(key, value)?;
        }
        Ok(next)
    }

    /// Sets one key.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), TenantConfigError> {
        let bad = |reason| TenantConfigError::BadValue {
            key: key.to_string(),
            value: value.to_string(),
            reason,
        };
        match key {
            "rate" => self.rate = Some(positive(value).ok_or_else(|| bad("a number above 0"))?),
            "burst" => self.burst = Some(non_negative(value).ok_or_else(|| bad("a number"))?),
            "min_charge" => {
                self.min_charge = Some(non_negative(value).ok_or_else(|| bad("a number"))?)
            }
            "share" => self.share = Some(positive(value).ok_or_else(|| bad("a number above 0"))?),
            "when_over" => {
                self.when_over = when_over(value).ok_or_else(|| bad("reject, wait or slow"))?
            }
            "max_active" => {
                let n: usize = value.parse().map_err(|_| bad("a count"))?;
                self.max_active = (n > 0).then_some(n);
            }
            "priority" => {
                self.priority = Some(
                    Priority::parse(value).ok_or_else(|| bad("critical, normal or best_effort"))?,
                )
            }
            _ => return self.set_timeout(key, value),
        }
        Ok(())
    }

    fn set_timeout(&mut self, key: &str, value: &str) -> Result<(), TenantConfigError> {
        let slot = match key {
            "statement_timeout" => &mut self.timeouts.statement,
            "idle_in_transaction_timeout" => &mut self.timeouts.idle_in_transaction,
            "transaction_timeout" => &mut self.timeouts.transaction,
            _ => return Err(TenantConfigError::UnknownKey(key.to_string())),
        };
        let bad = |reason| TenantConfigError::BadValue {
            key: key.to_string(),
            value: value.to_string(),
            reason,
        };
        let d =
            parse_duration(value).ok_or_else(|| bad("a duration such as 250ms, 30s, 10m or 1h"))?;
        if d > LONGEST_TIMEOUT {
            return Err(bad("at most 2147483647ms, as PostgreSQL's own timeouts"));
        }
        *slot = (!d.is_zero()).then_some(d);
        Ok(())
    }

    /// The settings as `key=value` words (for SHOW TENANTS).
    pub fn words(&self) -> String {
        let mut out = Vec::new();
        let mut num = |k: &str, v: Option<f64>| {
            if let Some(v) = v {
                out.push(format!("{k}={v}"));
            }
        };
        num("rate", self.rate);
        num("burst", self.burst);
        num("min_charge", self.min_charge);
        num("share", self.share);
        if let Some(n) = self.max_active {
            out.push(format!("max_active={n}"));
        }
        if let Some(p) = self.priority {
            out.push(format!("priority={}", p.as_str()));
        }
        if self.when_over != WhenOver::Reject {
            out.push(format!("when_over={}", self.when_over.as_str()));
        }
        out.join(" ")
    }
}

impl WhenOver {
    /// The word for it.
    pub fn as_str(self) -> &'static str {
        match self {
            WhenOver::Reject => "reject",
            WhenOver::Wait => "wait",
            WhenOver::Slow => "slow",
        }
    }
}

fn when_over(s: &str) -> Option<WhenOver> {
    match s.to_ascii_lowercase().as_str() {
        "reject" => Some(WhenOver::Reject),
        "wait" => Some(WhenOver::Wait),
        "slow" => Some(WhenOver::Slow),
        _ => None,
    }
}

fn non_negative(s: &str) -> Option<f64> {
    s.parse::<f64>().ok().filter(|v| v.is_finite() && *v >= 0.0)
}

fn positive(s: &str) -> Option<f64> {
    non_negative(s).filter(|v| *v > 0.0)
}

/// The longest timeout a tenant may have: PostgreSQL's own (`statement_timeout` and its kin
/// are at most `INT_MAX` milliseconds).
const LONGEST_TIMEOUT: Duration = Duration::from_millis(i32::MAX as u64);

/// A duration such as `250ms`, `30s`, `10m`, `10min` or `1h`; a bare number is milliseconds.
/// Quotes around it are ignored (`'10m'`).
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim().trim_matches('\'');
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let n: u64 = digits.parse().ok()?;
    let seconds = |factor: u64| n.checked_mul(factor).map(Duration::from_secs);
    match unit.trim().to_ascii_lowercase().as_str() {
        "" | "ms" => Some(Duration::from_millis(n)),
        "s" => seconds(1),
        "m" | "min" => seconds(60),
        "h" => seconds(3600),
        "d" => seconds(86_400),
        _ => None,
    }
}
