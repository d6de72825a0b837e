//! The governance policy: who the tenant is, which statements each rule refuses, and the
//! learned allowlist. Pure: no sockets, no clock.
//!
//! ```toml
//! unchecked = "reject"            # or "allow": statements pgward cannot read with certainty
//! trusted_roles = ["app"]         # roles whose sqlcommenter tags count
//!
//! [tenants.acme]
//! mode = "warn"                   # every rule only warns for this tenant
//! priority = "normal"             # critical | normal | best_effort
//! roles = ["acme_rw"]             # roles that are this tenant (default: the role is the tenant)
//!
//! [[rules]]
//! rule = "deny_ddl"               # deny_ddl | require_where | index_concurrently |
//!                                 # schema_allowlist | deny_functions | read_only
//! name = "no_ddl_for_app"         # optional, defaults to the rule; letters, digits, _
//! mode = "enforce"                # or "warn"
//! when = { roles = ["app"], tenants = [], application_names = [], clients = ["10.0.0.0/8"],
//!          tags = { route = "/admin" } }
//!
//! [allowlist]
//! file = "allowlist.json"         # relative to this file
//! roles = { agent = "learn" }     # learn | enforce | warn
//!
//! [decisions]
//! file = "decisions.jsonl"        # relative to this file: one JSON line per decision
//! wait_over = "1s"                # waits for a slot this long are logged ("off": none)
//! max_per_second = 100            # lines a second at most; the rest are counted
//!
//! [anomalies]
//! minute = "60s"                  # how long a judged minute lasts
//! min_statements = 20             # a minute with fewer is not judged
//! baseline_minutes = 30           # normal minutes each signal's baseline keeps
//!
//! [traffic]
//! file = "traffic.jsonl"          # relative to this file: one JSON line per statement
//!
//! [fleet]
//! store = "pgward_state"          # a database of pgward.ini holding the shared leases
//! user = "pgward"                 # its login (default: the database's forced user)
//! instance = 1                    # this instance's number (default: peer_id)
//! lease = "10s"                   # how long a lease holds
//! fallback = "60s"                # then its fallback share, if the store is out of reach
//! ```

mod allowlist;
mod cidr;
mod file;
mod governance;
mod rules;

pub use allowlist::{Allowlist, Learned, MAX_PER_ROLE};
pub use cidr::Cidr;
pub use file::{AllowlistMode, Mode, RuleKind, UncheckedMode, WhenFile as When};
pub use governance::Governance;
pub use rules::{DEFAULT_DENIED_FUNCTIONS, WRITING_FUNCTIONS};

use crate::cost::CostLimits;
use crate::gate::{parse_duration, AdaptiveSettings, GateSettings, TenantConfig};
use crate::sql::{Analysis, Depth, Priority, Reading, Tags};
use file::{line_of, PolicyFile, RuleFile};
use rules::Check;
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// SQLSTATE of every refusal by a rule: insufficient_privilege.
pub const SQLSTATE_REFUSED: &str = "42501";

/// Why a policy file could not be used. Loading changes nothing when it fails.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The file could not be read or written.
    #[error("{}: {source}", file.display())]
    Io {
        /// The file.
        file: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// The file is not valid TOML (or JSON), or has a key or value of the wrong kind.
    #[error("{}:{line}: {message}", file.display())]
    Syntax {
        /// The file.
        file: PathBuf,
        /// 1-based line.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// A rule or setting that reads well but means nothing.
    #[error("{}:{line}: {message}", file.display())]
    Invalid {
        /// The file.
        file: PathBuf,
        /// 1-based line.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// The allowlist file could not be used.
    #[error("{}: {message}", file.display())]
    Allowlist {
        /// The file.
        file: PathBuf,
        /// What is wrong.
        message: String,
    },
}

/// The session a statement comes from.
#[derive(Clone, Copy, Debug)]
pub struct Who<'a> {
    /// The role the session logged in as.
    pub role: &'a str,
    /// The session's `application_name`.
    pub application_name: &'a str,
    /// The client's address (`None` for a Unix socket).
    pub client_addr: Option<IpAddr>,
}

/// Who a statement is run for, and how urgently.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity<'a> {
    /// The tenant: a trusted role's `tenant` tag, else the tenant whose `roles` list the role,
    /// else the role.
    pub tenant: Cow<'a, str>,
    /// The tenant's priority, lowered by a `priority` tag; raised only by a trusted role's tag.
    pub priority: Priority,
    /// A trusted role's `deadline` tag.
    pub deadline: Option<Duration>,
    /// Tags that were ignored because the role is not trusted (log this once per session).
    pub ignored_tags: bool,
}

/// A rule a statement broke.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleHit {
    /// The rule's name (`deny_ddl`, a custom name, `allowlist` or `unchecked`).
    pub rule: String,
    /// Always [`SQLSTATE_REFUSED`].
    pub sqlstate: &'static str,
    /// The error message: fixed text naming the rule.
    pub message: String,
    /// The hint: what broke the rule (fixed text) and the fingerprint.
    pub hint: String,
    /// The statement's fingerprint in hex (`none` when it was not parsed).
    pub fingerprint: String,
    /// Numbers that explain it (the admission gate's refusals), if any.
    pub detail: Option<String>,
    /// A SQL rule's refusal (not yet in the decision log), not the gate's or a cost rule's
    /// (logged where they were made).
    pub by_rule: bool,
}

impl RuleHit {
    fn new(rule: &str, what: &str, fingerprint: String) -> RuleHit {
        RuleHit {
            rule: rule.to_string(),
            sqlstate: SQLSTATE_REFUSED,
            message: format!("pgward: statement refused by rule {rule}"),
            hint: format!("rule {rule}: {what}; fingerprint {fingerprint}"),
            fingerprint,
            detail: None,
            by_rule: true,
        }
    }

    /// A refusal by the admission gate (budget, kill, wait, deadline) or a cost rule, with
    /// its own SQLSTATE, message, detail and hint.
    pub fn refusal(
        rule: &str,
        sqlstate: &'static str,
        message: String,
        detail: Option<String>,
        hint: Option<String>,
    ) -> RuleHit {
        RuleHit {
            rule: rule.to_string(),
            sqlstate,
            message,
            hint: hint.unwrap_or_default(),
            fingerprint: String::new(),
            detail,
            by_rule: false,
        }
    }

    /// A refusal of a statement whose effect pgward cannot judge (the rule `unverifiable`).
    pub fn unverifiable(what: &str, analysis: &Analysis) -> RuleHit {
        RuleHit::new("unverifiable", what, analysis.fingerprint_hex())
    }

    /// SQL that makes PostgreSQL raise this refusal itself (used inside a transaction or a
    /// pipeline, so the transaction or batch fails as for any error). Only fixed text, rule
    /// names from the policy and the hex fingerprint go in, filtered to a safe alphabet.
    pub fn raise_sql(&self) -> String {
        let detail = self
            .detail
            .as_deref()
            .map(|d| format!(", DETAIL = '{}'", safe_text(d)))
            .unwrap_or_default();
        let hint = match self.hint.as_str() {
            "" => String::new(),
            h => format!(", HINT = '{}'", safe_text(h)),
        };
        format!(
            "DO $pgward$BEGIN RAISE EXCEPTION USING ERRCODE = '{}', MESSAGE = '{}'{hint}{detail}; END$pgward$",
            safe_text(self.sqlstate),
            safe_text(&self.message),
        )
    }
}

/// Keeps letters, digits, space and `_.,:;()/-`; anything else becomes `?`.
fn safe_text(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || " _.,:;()/-".contains(c) {
                c
            } else {
                '?'
            }
        })
        .collect()
}

/// The policy's decision on one statement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Run it.
    Allow,
    /// Run it, and log these (warn-mode rules, warn-mode tenants, `unchecked = "allow"`).
    Warn(Vec<RuleHit>),
    /// Refuse it with this.
    Reject(RuleHit),
}

#[derive(Clone, Debug)]
struct Tenant {
    mode: Mode,
    priority: Priority,
    gate: TenantConfig,
    cost_limits: CostLimits,
    /// `cost_mode`: whether its cost rules refuse or only warn (else the `[gate]` table's).
    cost_mode: Option<Mode>,
}

/// The `[gate]` table: the admission gate's settings and the default cost rules.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GatePolicy {
    /// Queue timeout and lanes.
    pub settings: GateSettings,
    /// Cost rules of tenants that set none of their own.
    pub cost_limits: CostLimits,
    /// `cost_mode`: `warn` logs and counts a statement over a cost rule and lets it run.
    pub cost_mode: Mode,
    /// The reading of each server and the lock-queue guard.
    pub watch: WatchPolicy,
}

/// `server_reading` and `lock_wait` of `[gate]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WatchPolicy {
    /// Read each PostgreSQL server's activity once a second.
    pub reading: bool,
    /// The lock-queue guard: how long a client's DDL statement may wait for a lock with no
    /// one queued behind it (`None`: the guard is off).
    pub lock_wait: Option<Duration>,
    /// The vacuum horizon (`None`: off).
    pub horizon: Option<HorizonPolicy>,
}

/// `horizon_max_age` and `horizon_dead_rows`: a tenant whose session has held the oldest
/// snapshot longer than `max_age`, while the dead rows of the database's tables grew by
/// `dead_rows`, runs one statement at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HorizonPolicy {
    pub max_age: Duration,
    pub dead_rows: u64,
}

/// `horizon_dead_rows` when the policy sets `horizon_max_age` alone.
pub const DEFAULT_HORIZON_DEAD_ROWS: u64 = 10_000;

impl Default for WatchPolicy {
    fn default() -> Self {
        WatchPolicy {
            reading: true,
            lock_wait: Some(Duration::from_secs(2)),
            horizon: None,
        }
    }
}

#[derive(Clone, Debug)]
struct Rule {
    name: String,
    check: Check,
    mode: Mode,
    when: When,
}

/// A loaded policy file. Immutable except for the learned allowlist.
#[derive(Debug)]
pub struct Policy {
    unchecked: UncheckedMode,
    trusted_roles: Vec<String>,
    tenants: BTreeMap<String, Tenant>,
    tenant_of_role: BTreeMap<String, String>,
    rules: Vec<Rule>,
    allowlist_roles: BTreeMap<String, AllowlistMode>,
    allowlist: Option<Arc<Allowlist>>,
    gate: GatePolicy,
    decisions: DecisionPolicy,
    anomalies: AnomalySettings,
    traffic: Option<PathBuf>,
    fleet: Option<FleetPolicy>,
}

/// `[fleet]`: where the shared leases are kept, and their timings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FleetPolicy {
    /// The state database, a database of pgward.ini.
    pub store: String,
    /// Its login; `None`: the database's forced user.
    pub user: Option<String>,
    /// This instance's number; `None`: `peer_id`.
    pub instance: Option<u32>,
    pub lease: std::time::Duration,
    pub fallback: std::time::Duration,
}

impl Policy {
    /// A policy with no rules, no tenants and `unchecked = "reject"`.
    pub fn empty() -> Policy {
        Policy {
            unchecked: UncheckedMode::Reject,
            trusted_roles: Vec::new(),
            tenants: BTreeMap::new(),
            tenant_of_role: BTreeMap::new(),
            rules: Vec::new(),
            allowlist_roles: BTreeMap::new(),
            allowlist: None,
            gate: GatePolicy::default(),
            decisions: DecisionPolicy::default(),
            anomalies: AnomalySettings::default(),
            traffic: None,
            fleet: None,
        }
    }

    /// Reads and checks the policy file at `path`, and the allowlist file it names.
    pub fn load(path: &Path) -> Result<Policy, PolicyError> {
        let text = std::fs::read_to_string(path).map_err(|source| PolicyError::Io {
            file: path.to_path_buf(),
            source,
        })?;
        let dir = path.parent().unwrap_or(Path::new("."));
        Policy::parse(&text, path, dir)
    }

    /// Reads policy `text` as if from `file`; relative allowlist paths are taken from `dir`.
    pub fn parse(text: &str, file: &Path, dir: &Path) -> Result<Policy, PolicyError> {
        let raw: PolicyFile = toml::from_str(text).map_err(|e| PolicyError::Syntax {
            file: file.to_path_buf(),
            line: e.span().map_or(1, |s| line_of(text, s.start)),
            message: e.message().to_string(),
        })?;
        let invalid = |offset: usize, message: String| PolicyError::Invalid {
            file: file.to_path_buf(),
            line: line_of(text, offset),
            message,
        };
        let mut rules = Vec::new();
        for spanned in raw.rules {
            let start = spanned.span().start;
            rules.push(build_rule(spanned.into_inner()).map_err(|m| invalid(start, m))?);
        }
        let (tenants, tenant_of_role) =
            build_tenants(raw.tenants).map_err(|(o, m)| invalid(o, m))?;
        let gate = match raw.gate {
            Some(g) => {
                let start = g.span().start;
                build_gate(g.into_inner()).map_err(|m| invalid(start, m))?
            }
            None => GatePolicy::default(),
        };
        let decisions = match raw.decisions {
            Some(d) => {
                let start = d.span().start;
                build_decisions(d.into_inner(), dir).map_err(|m| invalid(start, m))?
            }
            None => DecisionPolicy::default(),
        };
        let anomalies = match raw.anomalies {
            Some(a) => {
                let start = a.span().start;
                build_anomalies(a.into_inner()).map_err(|m| invalid(start, m))?
            }
            None => AnomalySettings::default(),
        };
        let fleet = match raw.fleet {
            Some(f) => {
                let start = f.span().start;
                Some(build_fleet(f.into_inner()).map_err(|m| invalid(start, m))?)
            }
            None => None,
        };
        let (allowlist, allowlist_roles) = match raw.allowlist {
            Some(a) => (
                Some(Arc::new(Allowlist::load(&dir.join(&a.file))?)),
                a.roles,
            ),
            None => (None, BTreeMap::new()),
        };
        Ok(Policy {
            unchecked: raw.unchecked,
            trusted_roles: raw.trusted_roles,
            tenants,
            tenant_of_role,
            rules,
            allowlist_roles,
            allowlist,
            gate,
            decisions,
            anomalies,
            traffic: raw.traffic.map(|t| dir.join(t.file)),
            fleet,
        })
    }

    /// The `[gate]` table.
    pub fn gate(&self) -> &GatePolicy {
        &self.gate
    }

    /// The `[decisions]` table.
    pub fn decisions(&self) -> &DecisionPolicy {
        &self.decisions
    }

    /// The traffic log's file (`[traffic]`), if any.
    pub fn traffic(&self) -> Option<&Path> {
        self.traffic.as_deref()
    }

    /// The `[fleet]` table, if any.
    pub fn fleet(&self) -> Option<&FleetPolicy> {
        self.fleet.as_ref()
    }

    /// The `[anomalies]` table.
    pub fn anomalies(&self) -> AnomalySettings {
        self.anomalies
    }

    /// Each tenant named in the file, with its gate settings.
    pub fn tenant_configs(&self) -> impl Iterator<Item = (&str, &TenantConfig)> {
        self.tenants
            .iter()
            .map(|(name, t)| (name.as_str(), &t.gate))
    }

    /// The cost rules for `tenant`: its own, else the `[gate]` table's.
    pub fn cost_limits(&self, tenant: &str) -> CostLimits {
        let own = self.tenants.get(tenant).map(|t| t.cost_limits);
        let default = self.gate.cost_limits;
        match own {
            Some(c) => CostLimits {
                max_cost: c.max_cost.or(default.max_cost),
                max_scan_rows: c.max_scan_rows.or(default.max_scan_rows),
                max_time: c.max_time.or(default.max_time),
            },
            None => default,
        }
    }

    /// Whether `tenant`'s cost rules only warn: its own `cost_mode`, else the `[gate]`
    /// table's; a tenant in `mode = "warn"` warns for every rule.
    pub fn cost_warns(&self, tenant: &str) -> bool {
        let own = self.tenants.get(tenant);
        if own.is_some_and(|t| t.mode == Mode::Warn) {
            return true;
        }
        own.and_then(|t| t.cost_mode).unwrap_or(self.gate.cost_mode) == Mode::Warn
    }

    /// How deep statements must be read for this policy's rules.
    pub fn depth(&self) -> Depth {
        if self.rules.is_empty() {
            Depth::Shape
        } else {
            Depth::Tree
        }
    }

    /// The learned allowlist, if the policy names one (save it before a reload, and at exit).
    pub fn allowlist(&self) -> Option<&Arc<Allowlist>> {
        self.allowlist.as_ref()
    }

    /// Whether `role`'s sqlcommenter tags count.
    pub fn is_trusted(&self, role: &str) -> bool {
        self.trusted_roles.iter().any(|r| r == role)
    }

    /// The tenant, priority and deadline of a statement with `tags` from `who`.
    pub fn identify<'a>(&self, who: &Who<'a>, tags: &'a Tags) -> Identity<'a> {
        let trusted = self.is_trusted(who.role);
        let fallback = || match self.tenant_of_role.get(who.role) {
            Some(t) => Cow::Owned(t.clone()),
            None => Cow::Borrowed(who.role),
        };
        let tenant = match tags.tenant() {
            Some(t) if trusted => Cow::Borrowed(t),
            _ => fallback(),
        };
        let base = self
            .tenants
            .get(tenant.as_ref())
            .map_or(Priority::Normal, |t| t.priority);
        let priority = match tags.priority() {
            Some(p) if trusted => p,
            Some(p) => p.min(base),
            None => base,
        };
        let deadline = if trusted { tags.deadline() } else { None };
        let raised = tags.priority().is_some_and(|p| p > base);
        let ignored_tags =
            !trusted && (tags.tenant().is_some() || tags.deadline().is_some() || raised);
        Identity {
            tenant,
            priority,
            deadline,
            ignored_tags,
        }
    }

    /// Judges one analyzed statement text from `who`. In `learn` mode for the role, the
    /// statement's fingerprint is recorded in the allowlist (in memory; see [`Allowlist::save`]).
    pub fn judge(&self, analysis: &Analysis, who: &Who) -> Verdict {
        let identity = self.identify(who, &analysis.tags);
        let tenant_warns = self
            .tenants
            .get(identity.tenant.as_ref())
            .is_some_and(|t| t.mode == Mode::Warn);
        let mut warnings = Vec::new();
        if let Some(reason) = analysis.unchecked_reason() {
            let hit = RuleHit::new("unchecked", reason.as_str(), analysis.fingerprint_hex());
            if self.unchecked == UncheckedMode::Reject && !tenant_warns {
                return Verdict::Reject(hit);
            }
            return Verdict::Warn(vec![hit]);
        }
        let trusted = self.is_trusted(who.role);
        for rule in self
            .rules
            .iter()
            .filter(|r| applies(&r.when, who, &identity.tenant, &analysis.tags, trusted))
        {
            let Some(what) = violation(rule, analysis, who.role) else {
                continue;
            };
            let hit = RuleHit::new(&rule.name, &what, analysis.fingerprint_hex());
            if rule.mode == Mode::Enforce && !tenant_warns {
                return Verdict::Reject(hit);
            }
            warnings.push(hit);
        }
        if let Some(hit) = self.allowlist_check(analysis, who.role) {
            if !tenant_warns && self.allowlist_roles.get(who.role) == Some(&AllowlistMode::Enforce)
            {
                return Verdict::Reject(hit);
            }
            warnings.push(hit);
        }
        if warnings.is_empty() {
            Verdict::Allow
        } else {
            Verdict::Warn(warnings)
        }
    }

    /// Learns, or checks, the statement against the role's allowlist; a hit when it is not there.
    fn allowlist_check(&self, analysis: &Analysis, role: &str) -> Option<RuleHit> {
        let mode = self.allowlist_roles.get(role)?;
        let list = self.allowlist.as_ref()?;
        let fingerprint = analysis.fingerprint?;
        match mode {
            AllowlistMode::Learn => {
                list.learn(role, fingerprint, analysis.log_text());
                None
            }
            _ if list.contains(role, fingerprint) => None,
            _ => Some(RuleHit::new(
                "allowlist",
                "statement not in the role's allowlist",
                fingerprint.hex(),
            )),
        }
    }

    /// Judges a `search_path` given at startup (the `options` or `search_path` startup
    /// parameter) for `who`, under every schema_allowlist rule that applies to the session.
    pub fn judge_startup_search_path(&self, value: &str, who: &Who) -> Verdict {
        let tags = Tags::default();
        let identity = self.identify(who, &tags);
        let schemas = crate::sql::split_identifiers(value);
        for rule in self
            .rules
            .iter()
            .filter(|r| applies(&r.when, who, &identity.tenant, &tags, false))
        {
            let Check::SchemaAllowlist(allowed) = &rule.check else {
                continue;
            };
            let ok = schemas.as_ref().is_some_and(|l| {
                l.iter()
                    .all(|s| rules::schema_allowed(s, allowed, who.role))
            });
            if !ok {
                let hit = RuleHit::new(
                    &rule.name,
                    "search_path at startup outside the allowlist",
                    "none".into(),
                );
                return match rule.mode {
                    Mode::Enforce => Verdict::Reject(hit),
                    Mode::Warn => Verdict::Warn(vec![hit]),
                };
            }
        }
        Verdict::Allow
    }
}

fn violation(rule: &Rule, analysis: &Analysis, role: &str) -> Option<String> {
    match &analysis.reading {
        Reading::Tree(facts) => rule.check.violation(facts, role),
        Reading::Shape => Some("statement not read to its tree".to_string()),
        Reading::Unchecked(reason) => Some(reason.as_str().to_string()),
    }
}

fn applies(when: &When, who: &Who, tenant: &str, tags: &Tags, trusted: bool) -> bool {
    let listed = |list: &[String], v: &str| list.is_empty() || list.iter().any(|x| x == v);
    listed(&when.roles, who.role)
        && listed(&when.tenants, tenant)
        && listed(&when.application_names, who.application_name)
        && (when.clients.is_empty()
            || who
                .client_addr
                .is_some_and(|ip| when.clients.iter().any(|c| c.contains(ip))))
        && (when.tags.is_empty()
            || (trusted
                && when
                    .tags
                    .iter()
                    .all(|(k, v)| tags.get(k) == Some(v.as_str()))))
}

type Tenants = (BTreeMap<String, Tenant>, BTreeMap<String, String>);

/// The tenants, and the tenant of each role listed; an error carries its byte offset.
fn build_tenants(
    raw: BTreeMap<String, toml::Spanned<file::TenantFile>>,
) -> Result<Tenants, (usize, String)> {
    let mut of_role = BTreeMap::new();
    let mut tenants = BTreeMap::new();
    for (name, spanned) in raw {
        let start = spanned.span().start;
        let t = spanned.into_inner();
        let mut gate = TenantConfig::default();
        for (key, value) in t.words() {
            gate.set(key, &value)
                .map_err(|e| (start, format!("tenant {name}: {e}")))?;
        }
        for role in &t.roles {
            of_role.insert(role.clone(), name.clone());
        }
        let tenant = Tenant {
            mode: t.mode,
            priority: t.priority.unwrap_or(Priority::Normal),
            gate,
            cost_limits: CostLimits {
                max_cost: t.max_cost,
                max_scan_rows: t.max_scan_rows,
                max_time: t.max_time,
            },
            cost_mode: t.cost_mode,
        };
        tenants.insert(name, tenant);
    }
    Ok((tenants, of_role))
}

/// The fast lane's limit when `[gate]` sets none: the pool limits alone decide, as without
/// a policy.
pub const UNLIMITED_ACTIVE: usize = 1 << 20;

impl Default for GatePolicy {
    fn default() -> Self {
        let mut settings = GateSettings::default();
        settings.lanes.fast = UNLIMITED_ACTIVE;
        GatePolicy {
            settings,
            cost_limits: CostLimits::default(),
            cost_mode: Mode::Enforce,
            watch: WatchPolicy::default(),
        }
    }
}

/// The `[anomalies]` table: how unusual minutes are judged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AnomalySettings {
    /// How long a "minute" is.
    pub minute: Duration,
    /// Statements a minute needs to be judged.
    pub min_statements: u64,
    /// Normal minutes the baseline keeps.
    pub baseline_minutes: usize,
    /// Normal minutes needed before any minute is judged.
    pub min_baseline: usize,
}

impl Default for AnomalySettings {
    fn default() -> Self {
        AnomalySettings {
            minute: Duration::from_secs(60),
            min_statements: 20,
            baseline_minutes: 30,
            min_baseline: 5,
        }
    }
}

/// The `[decisions]` table: the decision log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecisionPolicy {
    /// The file (`None`: no decision log).
    pub file: Option<PathBuf>,
    /// Waits for a slot at least this long are logged (`None`: none is).
    pub wait_over: Option<Duration>,
    /// Lines a second at most.
    pub max_per_second: u32,
}

impl Default for DecisionPolicy {
    fn default() -> Self {
        DecisionPolicy {
            file: None,
            wait_over: Some(Duration::from_secs(1)),
            max_per_second: crate::gate::decisions::DEFAULT_MAX_PER_SECOND,
        }
    }
}

/// A duration, or `"off"` (`None`), for the key `key`.
fn duration_or_off(key: &str, t: &str) -> Result<Option<Duration>, String> {
    match t {
        "off" => Ok(None),
        _ => parse_duration(t)
            .map(Some)
            .ok_or_else(|| format!("{key} {t:?}: a duration such as 2s or 500ms, or \"off\"")),
    }
}

fn build_decisions(raw: file::DecisionsFile, dir: &Path) -> Result<DecisionPolicy, String> {
    let mut d = DecisionPolicy {
        file: raw.file.map(|f| dir.join(f)),
        ..DecisionPolicy::default()
    };
    if let Some(t) = &raw.wait_over {
        d.wait_over = duration_or_off("wait_over", t)?;
    }
    if let Some(n) = raw.max_per_second {
        if n == 0 {
            return Err("max_per_second must be at least 1".to_string());
        }
        d.max_per_second = n;
    }
    Ok(d)
}

fn build_anomalies(raw: file::AnomaliesFile) -> Result<AnomalySettings, String> {
    let mut a = AnomalySettings::default();
    if let Some(t) = &raw.minute {
        a.minute = parse_duration(t)
            .filter(|d| *d >= Duration::from_secs(1))
            .ok_or_else(|| format!("minute {t:?}: a duration of at least 1s, such as 60s"))?;
    }
    if let Some(n) = raw.min_statements {
        a.min_statements = n.max(1);
    }
    if let Some(n) = raw.baseline_minutes {
        if n < 2 {
            return Err("baseline_minutes must be at least 2".to_string());
        }
        a.baseline_minutes = n as usize;
        a.min_baseline = a.min_baseline.min(a.baseline_minutes);
    }
    Ok(a)
}

/// The `[fleet]` table: a lease of 10 s and a fallback of 60 s unless it says otherwise.
fn build_fleet(raw: file::FleetFile) -> Result<FleetPolicy, String> {
    let longest = std::time::Duration::from_secs(24 * 3600);
    let duration = |key: &str, value: &Option<String>, default: u64| match value {
        None => Ok(std::time::Duration::from_secs(default)),
        Some(t) => parse_duration(t)
            .filter(|d| !d.is_zero() && *d <= longest)
            .ok_or_else(|| format!("{key} {t:?}: a duration from 1s to 1d, such as 10s or 1m")),
    };
    if raw.store.is_empty() {
        return Err("store: the name of a database of pgward.ini".into());
    }
    if raw.instance.is_some_and(|i| i == 0 || i > i32::MAX as u32) {
        return Err(format!("instance: a number from 1 to {}", i32::MAX));
    }
    Ok(FleetPolicy {
        store: raw.store,
        user: raw.user,
        instance: raw.instance,
        lease: duration("lease", &raw.lease, 10)?,
        fallback: duration("fallback", &raw.fallback, 60)?,
    })
}

/// The `[gate]` table's settings over the defaults.
fn build_gate(raw: file::GateFile) -> Result<GatePolicy, String> {
    let mut settings = GatePolicy::default().settings;
    if let Some(t) = &raw.queue_timeout {
        let d = parse_duration(t)
            .ok_or_else(|| format!("queue_timeout {t:?}: a duration such as 30s or 2m"))?;
        settings.queue_timeout = (!d.is_zero()).then_some(d);
    }
    let lanes = &mut settings.lanes;
    if let Some(n) = raw.max_active {
        lanes.fast = (n as usize).max(1);
    }
    if let Some(n) = raw.slow_active {
        lanes.slow = (n as usize).max(1);
    }
    settings.per_database = raw.max_active_per_database.map(|n| (n as usize).max(1));
    settings.adaptive = build_adaptive(&raw)?;
    if let Some(t) = &raw.flip_quarantine {
        let d = parse_duration(t)
            .ok_or_else(|| format!("flip_quarantine {t:?}: a duration such as 30s or 10m"))?;
        settings.flip_quarantine = (!d.is_zero()).then_some(d);
    }
    let mut watch = WatchPolicy {
        reading: raw.server_reading.unwrap_or(true),
        ..WatchPolicy::default()
    };
    if let Some(t) = &raw.lock_wait {
        watch.lock_wait = duration_or_off("lock_wait", t)?;
    }
    if let Some(t) = &raw.horizon_max_age {
        let max_age = parse_duration(t)
            .filter(|d| !d.is_zero())
            .ok_or_else(|| format!("horizon_max_age {t:?}: a duration such as 10m"))?;
        watch.horizon = Some(HorizonPolicy {
            max_age,
            dead_rows: raw.horizon_dead_rows.unwrap_or(DEFAULT_HORIZON_DEAD_ROWS),
        });
    } else if raw.horizon_dead_rows.is_some() {
        return Err("horizon_dead_rows needs horizon_max_age".to_string());
    }
    Ok(GatePolicy {
        watch,
        settings,
        cost_limits: CostLimits {
            max_cost: raw.max_cost,
            max_scan_rows: raw.max_scan_rows,
            max_time: raw.max_time,
        },
        cost_mode: raw.cost_mode.unwrap_or_default(),
    })
}

/// `adaptive`, `min_active` and `standing_wait`: the last two only with the first.
fn build_adaptive(raw: &file::GateFile) -> Result<Option<AdaptiveSettings>, String> {
    if raw.adaptive != Some(true) {
        return match (raw.min_active, &raw.standing_wait) {
            (None, None) => Ok(None),
            _ => Err("min_active and standing_wait need adaptive = true".to_string()),
        };
    }
    let mut adaptive = AdaptiveSettings::default();
    if let Some(n) = raw.min_active {
        adaptive.floor = (n as usize).max(1);
        if raw.max_active.is_some_and(|max| n > max) {
            return Err(format!("min_active {n} is above max_active"));
        }
    }
    if let Some(t) = &raw.standing_wait {
        adaptive.standing_wait = parse_duration(t)
            .filter(|d| !d.is_zero())
            .ok_or_else(|| format!("standing_wait {t:?}: a duration such as 1s or 500ms"))?;
    }
    Ok(Some(adaptive))
}

fn build_rule(raw: RuleFile) -> Result<Rule, String> {
    let kind = raw.rule;
    let name = raw.name.unwrap_or_else(|| kind.as_str().to_string());
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return Err(format!("rule name {name:?}: use letters, digits and _"));
    }
    if raw.schemas.is_some() && kind != RuleKind::SchemaAllowlist {
        return Err(format!(
            "`schemas` belongs to schema_allowlist, not {}",
            kind.as_str()
        ));
    }
    if raw.functions.is_some() && !matches!(kind, RuleKind::DenyFunctions | RuleKind::ReadOnly) {
        return Err(format!(
            "`functions` belongs to deny_functions or read_only, not {}",
            kind.as_str()
        ));
    }
    let functions = raw.functions.unwrap_or_default();
    if let Some(bad) = functions
        .iter()
        .find(|f| f.is_empty() || f.contains(|c: char| c == '.' || c.is_whitespace()))
    {
        return Err(format!(
            "function pattern {bad:?}: give the name without schema (`*` matches any characters)"
        ));
    }
    let check = match kind {
        RuleKind::DenyDdl => Check::DenyDdl,
        RuleKind::RequireWhere => Check::RequireWhere,
        RuleKind::IndexConcurrently => Check::IndexConcurrently,
        RuleKind::SchemaAllowlist => {
            Check::SchemaAllowlist(raw.schemas.ok_or("schema_allowlist needs `schemas`")?)
        }
        RuleKind::DenyFunctions if functions.is_empty() => Check::DenyFunctions(
            DEFAULT_DENIED_FUNCTIONS
                .iter()
                .map(|f| f.to_string())
                .collect(),
        ),
        RuleKind::DenyFunctions => Check::DenyFunctions(functions),
        RuleKind::ReadOnly => Check::ReadOnly(functions),
    };
    debug_assert_eq!(check.kind(), kind);
    Ok(Rule {
        name,
        check,
        mode: raw.mode,
        when: raw.when,
    })
}

#[cfg(test)]
mod tests;
