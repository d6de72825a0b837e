//! What the decision log records: one [`Record`] per refusal, long wait, kill, eviction,
//! plan flip, limit change and cancel pgward made. Pure: a decision names who (tenant, role,
//! database, upstream, client), what (the statement's fingerprint, never its text), why (a
//! fixed reason and the SQLSTATE the client got) and the figures behind it; the log adds the
//! time as it writes the line (see [`super::decisions`]). The gate gathers its own decisions
//! in an outbox ([`super::Gate::take_decisions`]) that its keeper writes out once the gate is
//! unlocked.

use std::time::Duration;

use serde::Serialize;

use crate::sql::Fingerprint;

/// What kind of decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Event {
    /// A statement refused: by the gate (its reason is a SHOW TENANTS refusal column), a cost
    /// rule or a SQL rule (its reason is the rule's name).
    Refused,
    /// A statement waited in the gate's queues at least `wait_over` in all before it ran
    /// (written by the session, which knows when the waits are over).
    Waited,
    /// `KILL TENANT` or `KILL STATEMENT`.
    Killed,
    /// Idle servers of a tenant over its share were closed while others waited.
    Evicted,
    /// A statement's plan flipped.
    Flipped,
    /// The adaptive limit of a fast lane moved.
    LimitChanged,
    /// pgward cancelled a running statement (a tenant's statement timeout, the lock-queue
    /// guard).
    Cancelled,
    /// Lines left out by the rate bound since the last line written.
    Suppressed,
}

/// One decision, as one line of the decision log.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Record {
    pub event: Event,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub database: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client: Option<u64>,
    /// Sixteen hex digits, as SHOW PLANS and the refusal hints print it.
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "fingerprint_hex"
    )]
    pub fingerprint: Option<Fingerprint>,
    /// Why, in a word: a refusal reason, a rule's name, a kill's target kind, a limit's
    /// change reason.
    pub reason: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sqlstate: Option<&'static str>,
    /// The numbers behind it (seconds, counts), by name.
    #[serde(skip_serializing_if = "Vec::is_empty", serialize_with = "figures_map")]
    pub figures: Vec<(&'static str, f64)>,
}

/// Whose statement a decision is about.
#[derive(Clone, Copy, Debug)]
pub struct Subject<'a> {
    pub tenant: &'a str,
    pub database: &'a str,
    pub client: u64,
    pub fingerprint: Option<Fingerprint>,
}

impl Record {
    /// A decision of kind `event` for `reason` about `who`'s statement.
    pub fn about(event: Event, reason: impl Into<String>, who: Subject<'_>) -> Record {
        Record::new(event, reason)
            .tenant(who.tenant)
            .database(who.database)
            .client(who.client)
            .fingerprint(who.fingerprint)
    }

    /// A decision of kind `event` for `reason`, naming nobody yet.
    pub fn new(event: Event, reason: impl Into<String>) -> Record {
        Record {
            event,
            tenant: None,
            role: None,
            database: None,
            upstream: None,
            client: None,
            fingerprint: None,
            reason: reason.into(),
            sqlstate: None,
            figures: Vec::new(),
        }
    }

    pub fn tenant(mut self, tenant: &str) -> Record {
        self.tenant = Some(tenant.to_string());
        self
    }

    pub fn role(mut self, role: &str) -> Record {
        self.role = Some(role.to_string());
        self
    }

    pub fn database(mut self, database: &str) -> Record {
        self.database = Some(database.to_string());
        self
    }

    pub fn upstream(mut self, upstream: &str) -> Record {
        self.upstream = Some(upstream.to_string());
        self
    }

    pub fn client(mut self, client: u64) -> Record {
        self.client = Some(client);
        self
    }

    pub fn fingerprint(mut self, fingerprint: Option<Fingerprint>) -> Record {
        self.fingerprint = fingerprint;
        self
    }

    pub fn sqlstate(mut self, sqlstate: &'static str) -> Record {
        self.sqlstate = Some(sqlstate);
        self
    }

    pub fn figure(mut self, name: &'static str, value: f64) -> Record {
        self.figures.push((name, value));
        self
    }

    pub fn figures(mut self, figures: &[(&'static str, f64)]) -> Record {
        self.figures.extend_from_slice(figures);
        self
    }

    /// A duration as a figure in seconds.
    pub fn seconds(self, name: &'static str, d: Duration) -> Record {
        self.figure(name, d.as_secs_f64())
    }
}

fn fingerprint_hex<S: serde::Serializer>(f: &Option<Fingerprint>, s: S) -> Result<S::Ok, S::Error> {
    match f {
        Some(f) => s.serialize_str(&f.hex()),
        None => s.serialize_none(),
    }
}

fn figures_map<S: serde::Serializer>(
    figures: &[(&'static str, f64)],
    s: S,
) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut map = s.serialize_map(Some(figures.len()))?;
    for (name, value) in figures {
        // JSON has no NaN or infinity: such a figure is written as null.
        map.serialize_entry(name, &value.is_finite().then_some(*value))?;
    }
    map.end()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_decision_is_one_json_object_of_the_fields_it_has() {
        let d = Record::new(Event::Refused, "budget")
            .tenant("acme")
            .fingerprint(Some(Fingerprint(0xab)))
            .sqlstate("53000")
            .figure("owed_s", 1.5)
            .figure("odd", f64::NAN);
        let json = serde_json::to_value(&d).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "event": "refused",
                "tenant": "acme",
                "fingerprint": "00000000000000ab",
                "reason": "budget",
                "sqlstate": "53000",
                "figures": {"owed_s": 1.5, "odd": null},
            })
        );
        let bare = serde_json::to_value(Record::new(Event::LimitChanged, "slow")).unwrap();
        assert_eq!(
            bare,
            serde_json::json!({"event": "limit_changed", "reason": "slow"})
        );
    }
}
