//! The policy file's TOML form, and its checks that need the file's line numbers.

use super::cidr::Cidr;
use crate::sql::Priority;
use serde::Deserialize;
use std::collections::BTreeMap;

/// `enforce` refuses; `warn` only reports what would have been refused.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Refuse.
    #[default]
    Enforce,
    /// Report only.
    Warn,
}

/// What happens to a statement pgward cannot read with certainty.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UncheckedMode {
    /// Refuse it (the default: fail closed).
    #[default]
    Reject,
    /// Let it run, with a warning.
    Allow,
}

/// How the learned allowlist treats a role.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AllowlistMode {
    /// Record every fingerprint the role runs.
    Learn,
    /// Refuse fingerprints not recorded.
    Enforce,
    /// Report fingerprints not recorded, refuse nothing.
    Warn,
}

/// The checks a rule can make.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RuleKind {
    /// PostgreSQL's DDL, SELECT INTO, DO, CALL.
    DenyDdl,
    /// UPDATE/DELETE without WHERE, TRUNCATE.
    RequireWhere,
    /// CREATE/DROP INDEX and REINDEX without CONCURRENTLY.
    IndexConcurrently,
    /// Schemas (named or put on search_path) outside `schemas`.
    SchemaAllowlist,
    /// Calls of functions in `functions` (or the default list).
    DenyFunctions,
    /// Anything that writes.
    ReadOnly,
}

impl RuleKind {
    /// The rule's name in the file.
    pub fn as_str(self) -> &'static str {
        match self {
            RuleKind::DenyDdl => "deny_ddl",
            RuleKind::RequireWhere => "require_where",
            RuleKind::IndexConcurrently => "index_concurrently",
            RuleKind::SchemaAllowlist => "schema_allowlist",
            RuleKind::DenyFunctions => "deny_functions",
            RuleKind::ReadOnly => "read_only",
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PolicyFile {
    #[serde(default)]
    pub unchecked: UncheckedMode,
    #[serde(default)]
    pub trusted_roles: Vec<String>,
    #[serde(default)]
    pub tenants: BTreeMap<String, toml::Spanned<TenantFile>>,
    pub gate: Option<toml::Spanned<GateFile>>,
    #[serde(default)]
    pub rules: Vec<toml::Spanned<RuleFile>>,
    pub allowlist: Option<AllowlistFile>,
    pub decisions: Option<toml::Spanned<DecisionsFile>>,
    pub anomalies: Option<toml::Spanned<AnomaliesFile>>,
    pub traffic: Option<TrafficFile>,
    pub fleet: Option<toml::Spanned<FleetFile>>,
}

/// `[fleet]`: budgets and slots shared with other pgward instances through a state database.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FleetFile {
    /// The state database: a database of pgward.ini.
    pub store: String,
    /// The login pgward uses there (default: the database's forced user).
    pub user: Option<String>,
    /// This instance's number in the fleet (default: `peer_id`).
    pub instance: Option<u32>,
    /// How long a lease holds.
    pub lease: Option<String>,
    /// How long after its lease an instance that cannot reach the store admits its fallback.
    pub fallback: Option<String>,
}

/// `[traffic]`: the traffic log.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TrafficFile {
    /// The file (relative to the policy file).
    pub file: String,
}

/// `[anomalies]`: how unusual minutes are judged.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct AnomaliesFile {
    /// How long a judged "minute" lasts.
    pub minute: Option<String>,
    /// Statements a minute needs to be judged.
    pub min_statements: Option<u64>,
    /// Normal minutes the baseline keeps.
    pub baseline_minutes: Option<u32>,
}

/// `[decisions]`: the decision log.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DecisionsFile {
    /// The file (relative to the policy file); none: no decision log.
    pub file: Option<String>,
    /// A wait for a slot this long or longer is logged ("off": none is).
    pub wait_over: Option<String>,
    /// Lines a second at most.
    pub max_per_second: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TenantFile {
    #[serde(default)]
    pub mode: Mode,
    pub priority: Option<Priority>,
    #[serde(default)]
    pub roles: Vec<String>,
    // The admission gate's settings for the tenant (the words of `SET TENANT`), and its
    // cost rules. Every key is optional.
    pub rate: Option<f64>,
    pub burst: Option<f64>,
    pub min_charge: Option<f64>,
    pub when_over: Option<String>,
    pub max_active: Option<u32>,
    pub share: Option<f64>,
    pub statement_timeout: Option<String>,
    pub idle_in_transaction_timeout: Option<String>,
    pub transaction_timeout: Option<String>,
    pub max_cost: Option<f64>,
    pub max_scan_rows: Option<f64>,
    /// Longest predicted run time, in seconds.
    pub max_time: Option<f64>,
    /// Whether the cost rules refuse (`enforce`) or only warn.
    pub cost_mode: Option<Mode>,
}

impl TenantFile {
    /// The gate settings as `(key, value)` words, in the form `SET TENANT` takes.
    pub fn words(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        let nums = [
            ("rate", self.rate),
            ("burst", self.burst),
            ("min_charge", self.min_charge),
            ("share", self.share),
        ];
        for (key, value) in nums {
            if let Some(v) = value {
                out.push((key, v.to_string()));
            }
        }
        if let Some(n) = self.max_active {
            out.push(("max_active", n.to_string()));
        }
        let texts = [
            ("when_over", &self.when_over),
            ("statement_timeout", &self.statement_timeout),
            (
                "idle_in_transaction_timeout",
                &self.idle_in_transaction_timeout,
            ),
            ("transaction_timeout", &self.transaction_timeout),
        ];
        for (key, value) in texts {
            if let Some(v) = value {
                out.push((key, v.clone()));
            }
        }
        out
    }
}

/// `[gate]`: the admission gate of the whole pgward.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct GateFile {
    /// Longest wait for a slot or a budget ("0": until the statement's deadline).
    pub queue_timeout: Option<String>,
    /// Statements running at once in the fast lane of each PostgreSQL server.
    pub max_active: Option<u32>,
    /// The slow lane's limit.
    pub slow_active: Option<u32>,
    /// Slots one pgward database may hold on a PostgreSQL server, beside `max_active`.
    pub max_active_per_database: Option<u32>,
    /// Whether the fast lane's limit adapts to the server's load within `max_active`.
    pub adaptive: Option<bool>,
    /// The adaptive limit's floor.
    pub min_active: Option<u32>,
    /// Once the fast lane's queue has stood for a second, how long work may wait in it.
    pub standing_wait: Option<String>,
    /// How long a statement whose plan flipped runs in the slow lane (a duration; none: flips
    /// are only listed).
    pub flip_quarantine: Option<String>,
    /// Cost rules for every tenant that sets none of its own.
    pub max_cost: Option<f64>,
    pub max_scan_rows: Option<f64>,
    /// Longest predicted run time, in seconds.
    pub max_time: Option<f64>,
    /// Whether the cost rules refuse (`enforce`, the default) or only warn.
    pub cost_mode: Option<Mode>,
    /// Whether pgward reads each PostgreSQL server's activity once a second (default true).
    pub server_reading: Option<bool>,
    /// How long a DDL statement of a client may wait for a lock before the lock-queue guard
    /// cancels it ("0": only when others queue behind it; "off": never).
    pub lock_wait: Option<String>,
    /// The vacuum horizon: how long a session may hold the oldest snapshot...
    pub horizon_max_age: Option<String>,
    /// ... while this many rows die in the database's tables, before its tenant is capped.
    pub horizon_dead_rows: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RuleFile {
    pub rule: RuleKind,
    pub name: Option<String>,
    #[serde(default)]
    pub mode: Mode,
    pub schemas: Option<Vec<String>>,
    pub functions: Option<Vec<String>>,
    #[serde(default)]
    pub when: WhenFile,
}

/// Narrowing of a rule: every list given must match (an empty list matches anything).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WhenFile {
    /// Session roles.
    #[serde(default)]
    pub roles: Vec<String>,
    /// Tenants.
    #[serde(default)]
    pub tenants: Vec<String>,
    /// `application_name` values.
    #[serde(default)]
    pub application_names: Vec<String>,
    /// Client address ranges.
    #[serde(default)]
    pub clients: Vec<Cidr>,
    /// sqlcommenter tags that must all be present with these values (trusted roles only).
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct AllowlistFile {
    pub file: String,
    #[serde(default)]
    pub roles: BTreeMap<String, AllowlistMode>,
}

/// The 1-based line of byte `offset` in `text`.
pub(super) fn line_of(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    text.as_bytes()
        .get(..end)
        .map_or(0, |b| b.iter().filter(|&&c| c == b'\n').count())
        + 1
}
