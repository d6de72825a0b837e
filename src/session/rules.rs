//! The rules at the session: each statement text is read with PostgreSQL's own parser and
//! judged by the policy before it goes to a server. A refusal is answered by pgward itself
//! when nothing is in flight and no transaction is open; otherwise PostgreSQL is made to raise
//! it (a DO block of fixed text), so the transaction or batch fails exactly as for any error.

use std::net::IpAddr;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use crate::gate::keeper::Gatekeeper;
use crate::gate::{Event, Record, Subject};
use crate::params::ParamSet;
use crate::policy::Governance;
use crate::policy::{RuleHit, Verdict, Who};
use crate::sql::{Analysis, ParseContext, Setting};
use crate::wire::{self, ErrorResponse};

/// What the rules remember across a session's messages.
#[derive(Debug, Default)]
pub struct RuleState {
    /// Tags from a role that is not trusted were already logged for this session.
    pub tags_logged: bool,
}

/// Everything needed to judge one statement.
pub struct RuleCheck<'a> {
    pub governance: &'a Governance,
    pub client_id: u64,
    pub role: &'a str,
    pub peer: &'a Peer,
    pub params: &'a ParamSet,
    /// How the server reads a statement as `params` say, with nothing in flight.
    pub settled: &'a ParseContext,
    pub state: &'a mut RuleState,
    /// The last text the admission gate read, how, and what it found: the same text read
    /// the same way is not read twice.
    pub read_before: Option<&'a Analyzed>,
    /// [`Analyzed::allowed`] of `read_before`, taken out of it: good for one judgement.
    pub allowed: Option<Allowed>,
    /// Where a refusal is counted (SHOW TENANTS) and logged, and the pgward database it was
    /// made in.
    pub keeper: &'a Gatekeeper,
    pub database: &'a str,
    /// Whether a refusal goes to the decision log: not when the gate refused the request
    /// already and logged that (the client gets one refusal, the log has one line).
    pub log_refusals: bool,
    /// The statement statistics, when they are kept (refusals are counted there too).
    pub statements: Option<super::admit::StatsSink<'a>>,
}

/// A statement text read by the analyzer, with the context it was read in.
pub struct Analyzed {
    pub text: bytes::Bytes,
    pub context: ParseContext,
    /// The policy whose analyzer read it (held, so no other can take its address).
    pub governance: Arc<Governance>,
    pub analysis: Arc<Analysis>,
    /// The policy allowed this reading without a warning, for this session's role and
    /// address: the rules need not judge it again while the policy and the session's
    /// parameters (its application_name) stay the same.
    pub allowed: Option<Allowed>,
}

/// What an earlier judgement that allowed a reading was made under.
pub struct Allowed {
    /// The policy (held, so no other policy can take its place at the same address).
    pub policy: Arc<Governance>,
    /// [`ParamSet::changes`] of the session's parameters then.
    pub params: u64,
}

impl std::fmt::Debug for Allowed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Allowed")
            .field("policy", &Arc::as_ptr(&self.policy))
            .field("params", &self.params)
            .finish()
    }
}

impl std::fmt::Debug for Analyzed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Analyzed")
            .field("text", &self.text)
            .field("context", &self.context)
            .field("governance", &Arc::as_ptr(&self.governance))
            .field("analysis", &self.analysis)
            .field("allowed", &self.allowed)
            .finish()
    }
}

impl Analyzed {
    /// Keeps `text`, read in `context` by the analyzer of `governance` as `analysis`, as the
    /// last reading in `last` (not judged yet), in place: what is the same is kept.
    pub fn remember(
        last: &mut Option<Analyzed>,
        text: &bytes::Bytes,
        context: ParseContext,
        governance: &Arc<Governance>,
        analysis: &Arc<Analysis>,
    ) {
        let Some(last) = last else {
            *last = Some(Analyzed {
                text: text.clone(),
                context,
                governance: Arc::clone(governance),
                analysis: Arc::clone(analysis),
                allowed: None,
            });
            return;
        };
        if !crate::name::same_bytes(&last.text, text) {
            last.text = text.clone();
        }
        last.context = context;
        if !Arc::ptr_eq(&last.governance, governance) {
            last.governance = Arc::clone(governance);
        }
        if !Arc::ptr_eq(&last.analysis, analysis) {
            last.analysis = Arc::clone(analysis);
        }
        last.allowed = None;
    }

    /// The analysis, if `text` was read in `context` by the analyzer of `governance`.
    pub fn of(
        &self,
        text: &[u8],
        context: &ParseContext,
        governance: &Governance,
    ) -> Option<&Analyzed> {
        let same = crate::name::same_bytes(&self.text, text)
            && self.context == *context
            && std::ptr::eq(Arc::as_ptr(&self.governance), governance);
        same.then_some(self)
    }
}

impl RuleCheck<'_> {
    /// Judges a statement text; `in_flight` says whether earlier statements are still
    /// unanswered, or their batch still open (PostgreSQL reports a changed setting only
    /// before its ReadyForQuery): any of them may change how the server reads this one (a SET, a COMMIT
    /// or ROLLBACK undoing a SET LOCAL, a function calling set_config), so while one is,
    /// text whose reading depends on standard_conforming_strings or client_encoding is
    /// unchecked. `pooled` says the server is shared between clients: a SQL-level EXECUTE
    /// may then run a statement another client prepared, which pgward never judged for
    /// this one, so it is refused.
    pub fn judge(&mut self, text: &[u8], in_flight: bool, pooled: bool) -> Option<RuleHit> {
        let context = self.context(in_flight);
        let before = self
            .read_before
            .and_then(|r| r.of(text, &context, self.governance));
        let analysis = match before {
            Some(before) => Arc::clone(&before.analysis),
            None => self.governance.analyzer.analyze(text, &context),
        };
        let allowed = before.is_some()
            && self.allowed.take().is_some_and(|a| {
                std::ptr::eq(Arc::as_ptr(&a.policy), self.governance)
                    && a.params == self.params.changes()
            });
        if pooled && executes_prepared(&analysis) {
            let hit = RuleHit::unverifiable(
                "EXECUTE of a SQL-level prepared statement under transaction pooling",
                &analysis,
            );
            tracing::warn!(client = self.client_id, rule = %hit.rule, fingerprint = %hit.fingerprint, statement = %analysis.log_text(), "statement refused");
            if self.log_refusals {
                let tenant = self.tenant_of(&analysis);
                self.log_refusal(&hit, &tenant, &analysis);
            }
            return Some(hit);
        }
        self.verdict(&analysis, allowed)
    }

    /// Judges a fast-path FunctionCall, which carries no SQL to read.
    pub fn judge_function_call(&mut self) -> Option<RuleHit> {
        self.verdict(&Analysis::function_call(), false)
    }

    /// The policy's verdict on `analysis`; `allowed` says the same policy allowed the same
    /// reading for the same client already (only the warning about ignored tags is left).
    fn verdict(&mut self, analysis: &Analysis, allowed: bool) -> Option<RuleHit> {
        let policy = &self.governance.policy;
        let tagged = !analysis.tags.is_empty();
        if allowed && (!tagged || self.state.tags_logged) {
            // Nothing is left to say about this reading.
            return None;
        }
        // (Built from the fields, not `self`: the state below is written while it is held.)
        let who = who_of(self.role, self.params, self.peer);
        if tagged && !self.state.tags_logged && policy.identify(&who, &analysis.tags).ignored_tags {
            tracing::warn!(
                client = self.client_id,
                role = self.role,
                "tags from a role that is not in trusted_roles are ignored"
            );
            self.state.tags_logged = true;
        }
        if allowed {
            return None;
        }
        match policy.judge(analysis, &who) {
            Verdict::Allow => None,
            Verdict::Warn(hits) => {
                for hit in &hits {
                    tracing::info!(client = self.client_id, rule = %hit.rule, fingerprint = %hit.fingerprint, statement = %analysis.log_text(), "rule in warn mode: the statement would be refused");
                }
                None
            }
            Verdict::Reject(hit) => {
                tracing::warn!(client = self.client_id, rule = %hit.rule, fingerprint = %hit.fingerprint, statement = %analysis.log_text(), "statement refused");
                if self.log_refusals {
                    let tenant = self.tenant_of(analysis);
                    self.log_refusal(&hit, &tenant, analysis);
                }
                Some(hit)
            }
        }
    }

    /// The tenant a statement of `analysis` runs for.
    fn tenant_of(&self, analysis: &Analysis) -> String {
        let who = who_of(self.role, self.params, self.peer);
        let identity = self.governance.policy.identify(&who, &analysis.tags);
        identity.tenant.to_string()
    }

    /// A rule's refusal in the decision log and the statement statistics.
    fn log_refusal(&self, hit: &RuleHit, tenant: &str, analysis: &Analysis) {
        let who = Subject {
            tenant,
            database: self.database,
            client: self.client_id,
            fingerprint: analysis.fingerprint,
        };
        log_rule_refusal(self.keeper, hit, who, self.role);
        if let Some(sink) = &self.statements {
            sink.refused(tenant, analysis.fingerprint, &hit.rule);
        }
    }

    fn context(&self, in_flight: bool) -> ParseContext {
        context_from(self.settled, in_flight)
    }
}

/// Where a session's client is, as the policy reads it: its address, and what
/// `application_name_add_host` added to its application_name (the policy reads the name the
/// client gave, so that turning the setting on changes no rule's reach).
#[derive(Debug, Clone, Default)]
pub struct Peer {
    pub addr: Option<IpAddr>,
    pub app_host: Option<crate::client::AddedHost>,
}

/// Who sends a session's statements, as the policy reads it: its role, its application_name
/// and its address.
pub fn who_of<'a>(role: &'a str, params: &'a ParamSet, peer: &'a Peer) -> Who<'a> {
    let name = params.get("application_name").unwrap_or("");
    Who {
        role,
        application_name: crate::client::without_host(name, peer.app_host.as_ref()),
        client_addr: peer.addr,
    }
}

/// A SQL rule's refusal of `who`'s statement, run by `role`: counted for SHOW TENANTS, and in
/// the decision log (the rule's name, never the statement's text).
pub fn log_rule_refusal(keeper: &Gatekeeper, hit: &RuleHit, who: Subject<'_>, role: &str) {
    keeper
        .lock()
        .note_rule_refusal(who.tenant, std::time::Instant::now());
    let log = &keeper.decisions;
    if !log.is_on() {
        return;
    }
    let record = Record::about(Event::Refused, hit.rule.as_str(), who)
        .role(role)
        .sqlstate(hit.sqlstate);
    log.record(&record);
}

/// How the server will read the next statement, as far as pgward can be sure, with nothing in
/// flight (see [`context_from`] for a statement behind unanswered ones).
pub fn parse_context(params: &ParamSet) -> ParseContext {
    let scs = match params.get("standard_conforming_strings") {
        Some("on") => Setting::Known(true),
        Some("off") => Setting::Known(false),
        _ => Setting::Unknown,
    };
    let encoding = match params.get("client_encoding") {
        Some(e) => Setting::Known(encoding_name(e)),
        None => Setting::Unknown,
    };
    ParseContext {
        standard_conforming_strings: scs,
        client_encoding: encoding,
        backslash_quote: Setting::Unknown,
    }
}

/// How the server will read the next statement while earlier ones are unanswered: nothing
/// the parameters say is sure.
fn context_in_doubt() -> ParseContext {
    ParseContext {
        standard_conforming_strings: Setting::Unknown,
        client_encoding: Setting::Unknown,
        backslash_quote: Setting::Unknown,
    }
}

/// What the gate reads from a session's parameters for each statement, read again only when
/// they change.
#[derive(Debug)]
pub struct Settled {
    /// [`parse_context`].
    pub context: ParseContext,
    /// The client's own `statement_timeout`, when pgward follows it (`track_extra_parameters`)
    /// and it is not zero.
    pub statement_timeout: Option<std::time::Duration>,
}

/// [`Settled`] of a session's parameters, as of their last change.
#[derive(Debug, Default)]
pub struct SettledParams(Option<(u64, Settled)>);

impl SettledParams {
    /// What `params` say.
    pub fn of(&mut self, params: &ParamSet) -> &Settled {
        let at = params.changes();
        if self.0.as_ref().is_some_and(|(seen, _)| *seen != at) {
            self.0 = None;
        }
        let settled = || Settled {
            context: parse_context(params),
            statement_timeout: params
                .get("statement_timeout")
                .and_then(crate::gate::parse_duration)
                .filter(|d| !d.is_zero()),
        };
        &self.0.get_or_insert_with(|| (at, settled())).1
    }
}

/// How the server will read the next statement, from the context `settled` the parameters say
/// with nothing in flight: `in_flight` says earlier statements are unanswered (any of them may
/// change a setting), and then nothing the parameters say is sure.
pub fn context_from(settled: &ParseContext, in_flight: bool) -> ParseContext {
    match in_flight {
        true => context_in_doubt(),
        false => settled.clone(),
    }
}

/// An encoding's name as the server reports it (the usual ones without a copy).
fn encoding_name(name: &str) -> std::borrow::Cow<'static, str> {
    const USUAL: [&str; 2] = ["UTF8", "SQL_ASCII"];
    match USUAL.iter().find(|u| **u == name) {
        Some(usual) => std::borrow::Cow::Borrowed(usual),
        None => std::borrow::Cow::Owned(name.to_string()),
    }
}

/// Whether the statement runs a SQL-level prepared statement (EXECUTE, also under EXPLAIN).
fn executes_prepared(analysis: &Analysis) -> bool {
    analysis
        .facts()
        .is_some_and(|f| f.statements.contains(&"ExecuteStmt"))
}

/// The refusal as pgward's own ErrorResponse.
pub fn error_message(hit: &RuleHit) -> Bytes {
    let mut err = ErrorResponse::error(hit.sqlstate, hit.message.clone());
    if !hit.hint.is_empty() {
        err = err.with_hint(hit.hint.clone());
    }
    if let Some(detail) = &hit.detail {
        err = err.with_detail(detail.clone());
    }
    let mut out = BytesMut::new();
    wire::encode_error(&mut out, &err);
    out.freeze()
}

/// A simple Query that makes PostgreSQL raise the refusal.
pub fn raise_as_query(hit: &RuleHit) -> BytesMut {
    let mut out = BytesMut::new();
    wire::encode_query(&mut out, &hit.raise_sql());
    out
}

/// Parse, Bind and Execute of the unnamed statement that makes PostgreSQL raise the refusal
/// in the place of a refused Parse: the batch fails there, and the server skips the rest of
/// it up to Sync, as it would after the Parse's own error.
pub fn raise_in_batch(hit: &RuleHit) -> BytesMut {
    let mut out = BytesMut::new();
    wire::encode_parse(&mut out, b"", hit.raise_sql().as_bytes(), &[]);
    // Bind: unnamed portal, unnamed statement, no parameters.
    wire::encode_bind_text(&mut out, b"", b"", &[]);
    // Execute: unnamed portal, no row limit.
    wire::encode_execute(&mut out, b"", 0);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::{without_host, AddedHost};

    #[test]
    fn the_policy_reads_the_application_name_the_client_gave() {
        let added = |defaulted| AddedHost {
            suffix: Arc::from(" - 10.0.0.1:5555"),
            defaulted,
        };
        let (given, none) = (Some(added(false)), Some(added(true)));
        assert_eq!(without_host("psql - 10.0.0.1:5555", given.as_ref()), "psql");
        assert_eq!(without_host("app - 10.0.0.1:5555", given.as_ref()), "app");
        assert_eq!(without_host("app - 10.0.0.1:5555", none.as_ref()), "");
        // A name set later keeps what the client made of it.
        assert_eq!(
            without_host("worker:app - 10.0.0.1:5555", none.as_ref()),
            "worker:app"
        );
        assert_eq!(without_host("other", none.as_ref()), "other");
        assert_eq!(without_host("psql", None), "psql");
    }

    #[test]
    fn what_the_gate_reads_from_the_parameters_follows_them() {
        let mut params = ParamSet::default();
        let mut settled = SettledParams::default();
        for (name, value) in [
            ("standard_conforming_strings", "on"),
            ("client_encoding", "SJIS"),
            ("standard_conforming_strings", "off"),
            ("client_encoding", "UTF8"),
        ] {
            params.set(name, value);
            assert_eq!(&settled.of(&params).context, &parse_context(&params));
            assert_eq!(
                context_from(&settled.of(&params).context, false),
                parse_context(&params)
            );
            let doubt = context_from(&settled.of(&params).context, true);
            assert_eq!(doubt.standard_conforming_strings, Setting::Unknown);
            assert_eq!(doubt.client_encoding, Setting::Unknown);
            assert_eq!(doubt.backslash_quote, Setting::Unknown);
        }
        assert_eq!(
            settled.of(&params).context.standard_conforming_strings,
            Setting::Known(false)
        );
        assert_eq!(settled.of(&params).statement_timeout, None);
        params.set("statement_timeout", "1500");
        assert_eq!(
            settled.of(&params).statement_timeout,
            Some(std::time::Duration::from_millis(1500))
        );
        params.set("statement_timeout", "0");
        assert_eq!(settled.of(&params).statement_timeout, None);
    }

    #[test]
    fn the_refusal_raised_in_a_batch_is_parse_bind_execute() {
        let hit = RuleHit::unverifiable("test", &Analysis::function_call());
        let out = raise_in_batch(&hit);
        let mut tags = Vec::new();
        let mut at = 0;
        while let Some(span) = wire::scan_frame(&out, at, usize::MAX).unwrap() {
            tags.push(span.tag);
            at = span.end;
        }
        assert_eq!(at, out.len());
        assert_eq!(
            tags,
            [
                wire::frontend::tag::PARSE,
                wire::frontend::tag::BIND,
                wire::frontend::tag::EXECUTE
            ]
        );
        // Bind and Execute of the unnamed statement and portal, nothing else.
        let tail = &out[out.len() - 23..];
        assert_eq!(tail, b"B\0\0\0\x0c\0\0\0\0\0\0\0\0E\0\0\0\x09\0\0\0\0\0");
    }
}
