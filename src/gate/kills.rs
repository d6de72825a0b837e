//! Incident switches: `KILL TENANT name FOR '10m'`, `KILL STATEMENT fingerprint FOR '10m'`,
//! `UNKILL`, `SHOW KILLS`. A killed tenant or statement gets 53000 until the kill expires;
//! the session checks at every Bind.

use crate::sql::Fingerprint;
use std::time::{Duration, Instant};

/// What a kill stops.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum KillTarget {
    /// Every statement of a tenant.
    Tenant(String),
    /// Every run of a statement (by its fingerprint), for any tenant.
    Statement(Fingerprint),
}

impl KillTarget {
    /// Reads a fingerprint as SHOW and the hints print it (16 hex digits).
    pub fn statement(hex: &str) -> Option<KillTarget> {
        let hex = hex.trim().trim_matches('\'');
        if hex.is_empty() || hex.len() > 16 {
            return None;
        }
        u64::from_str_radix(hex, 16)
            .ok()
            .map(|v| KillTarget::Statement(Fingerprint(v)))
    }

    /// Whether it stops a statement of `tenant` with `fingerprint`.
    pub fn stops(&self, tenant: &str, fingerprint: Option<Fingerprint>) -> bool {
        match self {
            KillTarget::Tenant(name) => name == tenant,
            KillTarget::Statement(f) => Some(*f) == fingerprint,
        }
    }

    /// How it is named in messages and SHOW KILLS.
    pub fn describe(&self) -> String {
        match self {
            KillTarget::Tenant(t) => format!("tenant \"{t}\""),
            KillTarget::Statement(f) => format!("statement {f}"),
        }
    }
}

/// One kill, as SHOW KILLS lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KillRow {
    /// What is killed.
    pub target: KillTarget,
    /// How long it still holds.
    pub remaining: Duration,
}

#[derive(Clone, Debug)]
struct Kill {
    target: KillTarget,
    until: Instant,
    /// `SOFT`: it stops only what is admitted after it.
    soft: bool,
}

/// The kills in force.
#[derive(Clone, Debug, Default)]
pub struct Kills {
    kills: Vec<Kill>,
}

impl Kills {
    /// Kills `target` for `duration` from `now` (a second kill of the same target replaces
    /// the first); a `soft` one stops only what is admitted after it.
    pub fn kill(&mut self, target: KillTarget, duration: Duration, soft: bool, now: Instant) {
        self.kills.retain(|k| k.target != target && k.until > now);
        let until = now.checked_add(duration).unwrap_or(now);
        self.kills.push(Kill {
            target,
            until,
            soft,
        });
    }

    /// Lifts a kill; whether there was one.
    pub fn unkill(&mut self, target: &KillTarget) -> bool {
        let before = self.kills.len();
        self.kills.retain(|k| &k.target != target);
        self.kills.len() != before
    }

    /// The kill that stops this tenant's statement, if any.
    pub fn is_killed(
        &self,
        tenant: &str,
        fingerprint: Option<Fingerprint>,
        now: Instant,
    ) -> Option<&KillTarget> {
        self.stopping(tenant, fingerprint, now, true)
    }

    /// The kill that stops this tenant's statement, admitted before the kill and not sent
    /// yet, if any (a soft kill lets it go).
    pub fn stops_admitted(
        &self,
        tenant: &str,
        fingerprint: Option<Fingerprint>,
        now: Instant,
    ) -> Option<&KillTarget> {
        self.stopping(tenant, fingerprint, now, false)
    }

    /// The first kill in force that stops the statement, soft ones only if `soft_too`.
    fn stopping(
        &self,
        tenant: &str,
        fingerprint: Option<Fingerprint>,
        now: Instant,
        soft_too: bool,
    ) -> Option<&KillTarget> {
        self.kills
            .iter()
            .filter(|k| k.until > now && (soft_too || !k.soft))
            .map(|k| &k.target)
            .find(|t| t.stops(tenant, fingerprint))
    }

    /// Whether any kill may be in force (expired ones count until listed or replaced).
    pub fn any(&self) -> bool {
        !self.kills.is_empty()
    }

    /// The kills in force, soonest to expire first; expired ones are forgotten.
    pub fn list(&mut self, now: Instant) -> Vec<KillRow> {
        self.kills.retain(|k| k.until > now);
        let mut rows: Vec<KillRow> = self
            .kills
            .iter()
            .map(|k| KillRow {
                target: k.target.clone(),
                remaining: k.until.saturating_duration_since(now),
            })
            .collect();
        rows.sort_by(|a, b| a.remaining.cmp(&b.remaining).then(a.target.cmp(&b.target)));
        rows
    }
}
