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
    pub tenants: BTreeMap<String, TenantFile>,
    #[serde(default)]
    pub rules: Vec<toml::Spanned<RuleFile>>,
    pub allowlist: Option<AllowlistFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TenantFile {
    #[serde(default)]
    pub mode: Mode,
    pub priority: Option<Priority>,
    #[serde(default)]
    pub roles: Vec<String>,
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
