//! One message at a time: what each client message is owed and how it is rewritten for
//! prepared statements in transaction pooling, and what each server message answers.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Instant;

use bytes::{Bytes, BytesMut};

use super::link::{Link, Mark};
use super::prepared::{self, ClientStatements, Deallocation, Statement};
use super::rules::{self, RuleCheck};
use super::views::Views;
use crate::client::SessionError;
use crate::params::{ParamSet, Tracked};
use crate::policy::RuleHit;
use crate::server::{
    Definition, Expected, Learned, Owed, Renamed, Reopen, Route, ServerStatements, Skipped,
};
use crate::wire::frontend::target;
use crate::wire::{
    self, backend, frontend, sqlstate, BindView, CloseView, DescribeView, ErrorResponse, FrameSpan,
    ParseView, Parsed, QueryView, TxStatus,
};

/// The client's side of what server messages teach: its statement names and parameters.
pub(super) struct ClientSide<'a> {
    pub statements: &'a mut ClientStatements,
    pub params: &'a mut ParamSet,
    pub tracked: &'a Tracked,
    /// The statements the gate follows itself.
    pub views: &'a mut Views,
}

/// PostgreSQL's message for a Bind or Describe of an unnamed statement that does not exist.
const NO_UNNAMED: &[u8] = b"unnamed prepared statement does not exist";

/// A server's error (26000) naming a statement pgward renamed so that it could not exist,
/// by putting `not_here` (see [`MessageContext::not_here`]) before the client's name: worded
/// for the name the client used, the renaming taken out of its message, and for the unnamed
/// statement PostgreSQL's own message (when the server's is in English; its place in
/// PostgreSQL's source, which is not where that message comes from, left out). None for any
/// other error.
pub(super) fn foreign_statement_error(body: &[u8], not_here: &str) -> Option<BytesMut> {
    use backend::field;
    let code = wire::ErrorFields::find(body, field::CODE)?;
    let message = wire::ErrorFields::find(body, field::MESSAGE)?;
    memchr::memmem::find(message, not_here.as_bytes())?;
    if code != sqlstate::UNDEFINED_PSTATEMENT.as_bytes() {
        return None;
    }
    let unnamed = message == format!("prepared statement \"{not_here}\" does not exist").as_bytes();
    let mut out = BytesMut::new();
    wire::encode_error_reworded(&mut out, body, |kind, value| match kind {
        field::MESSAGE if unnamed => Some(Cow::Borrowed(NO_UNNAMED)),
        field::MESSAGE => Some(replaced(value, not_here.as_bytes(), b"")),
        field::FILE | field::LINE | field::ROUTINE if unnamed => None,
        _ => Some(Cow::Borrowed(value)),
    });
    Some(out)
}

/// The server's refusal (42P05) of a second Parse of a name the client has, which pgward sent
/// under its own name (see [`Renamed`]): worded for the client's name, as PostgreSQL words
/// it. None for any other error.
pub(super) fn renamed_error(body: &[u8], renamed: &Renamed) -> Option<BytesMut> {
    use backend::field;
    let code = wire::ErrorFields::find(body, field::CODE)?;
    if code != sqlstate::DUPLICATE_PSTATEMENT.as_bytes() {
        return None;
    }
    let message = wire::ErrorFields::find(body, field::MESSAGE)?;
    memchr::memmem::find(message, &renamed.ours)?;
    let mut out = BytesMut::new();
    wire::encode_error_reworded(&mut out, body, |kind, value| match kind {
        field::MESSAGE => Some(replaced(value, &renamed.ours, &renamed.client)),
        _ => Some(Cow::Borrowed(value)),
    });
    Some(out)
}

/// `value` with the first `name` in it put as `with` (unchanged if it has none).
fn replaced<'a>(value: &'a [u8], name: &[u8], with: &[u8]) -> Cow<'a, [u8]> {
    match memchr::memmem::find(value, name) {
        Some(at) => {
            let mut reworded = value[..at].to_vec();
            reworded.extend_from_slice(with);
            reworded.extend_from_slice(&value[at + name.len()..]);
            Cow::Owned(reworded)
        }
        None => Cow::Borrowed(value),
    }
}

/// Handles one server message (where it lies in the server's buffer): matches it to what it
/// answers and learns from it. `ready_at` is when a ReadyForQuery arrived (read
/// once per message by the caller, which also counts it).
pub(super) fn server_message(
    link: &mut Link,
    client: &mut ClientSide,
    span: FrameSpan,
    ready_at: Option<Instant>,
) -> Result<Route, SessionError> {
    let tag = span.tag;
    let own_missing = tag == backend::tag::ERROR_RESPONSE
        && link.expected.statement_use_next()
        && lost_own_statement(&link.server.statements, &link.server.rbuf[span.body()]);
    let unnamed_head = match tag {
        backend::tag::PARSE_COMPLETE | backend::tag::ERROR_RESPONSE => {
            link.expected.head_unnamed_parse()
        }
        _ => None,
    };
    let (route, learned) = match link.expected.on_message(tag) {
        Ok(r) => r,
        Err(desync) => {
            link.server.poison();
            return Err(SessionError::Fatal(ErrorResponse::fatal(
                sqlstate::PROTOCOL_VIOLATION,
                format!("lost track of the server conversation: {desync}"),
            )));
        }
    };
    if matches!(
        tag,
        backend::tag::ERROR_RESPONSE | backend::tag::COMMAND_COMPLETE
    ) {
        let mark = Mark::of(tag, &link.server.rbuf[span.body()]);
        link.note_answer(mark);
    }
    if own_missing {
        link.server.poison();
    }
    let skipped_unnamed = matches!(&learned, Learned::Skipped(s) if s.unnamed_parse);
    if unnamed_head.is_some() || skipped_unnamed {
        // Whose the server's unnamed statement is follows its answers: a Parse it skipped
        // left the one it had, which may be another client's.
        link.learn_unnamed(tag, unnamed_head, skipped_unnamed);
    }
    if matches!(learned, Learned::Nothing)
        && !matches!(
            tag,
            backend::tag::PARAMETER_STATUS | backend::tag::COMMAND_COMPLETE
        )
    {
        // Rows, descriptions and the like teach nothing (see `learn`).
        return Ok(route);
    }
    let server = &mut *link.server;
    let body = &server.rbuf[span.body()];
    let ready = learn(
        tag,
        body,
        learned,
        &mut server.statements,
        &mut server.params,
        client,
        &link.expected,
    )?;
    if let Some(status) = ready {
        server.tx = status;
        let now = ready_at.unwrap_or_else(Instant::now);
        link.tx_since = match status {
            TxStatus::Idle => None,
            _ => link.tx_since.or(link.busy_since).or(Some(now)),
        };
        link.ready_since = now;
        link.busy_since = (!link.expected.is_empty()).then_some(now);
        link.note_batch(now);
        if link.expected.is_empty() {
            link.reset_sent = false;
        }
    }
    Ok(route)
}

/// Whether the error `body` says that one of pgward's own statements in `statements` does
/// not exist on the server (freed by SQL pgward did not see, such as dynamic SQL in a DO
/// block): the server, whose statements pgward may have lost track of, is then to be closed
/// rather than reused. Read only for an error that answers a Bind or a Describe of a
/// statement (`Expected::statement_use_next`). Its map stays as it is: an error's words may
/// still come from a client (a type's input function run at the Bind), and the statement
/// may well be there.
pub(super) fn lost_own_statement(statements: &ServerStatements, body: &[u8]) -> bool {
    if statements.is_empty() {
        return false;
    }
    let Ok(error) = wire::ErrorFields::parse(body) else {
        return false;
    };
    if error.code() != Some(sqlstate::UNDEFINED_PSTATEMENT) {
        return false;
    }
    let text = error.text();
    // What may go on a name (a translated message quotes it in its own marks: « », „ “).
    let in_name = |c: char| c.is_alphanumeric() || c == '_' || c == '$';
    memchr::memmem::find_iter(text.as_bytes(), prepared::OWN_PREFIX.as_bytes()).any(|at| {
        // A name of its own, not the end of a longer one (`at` is at an ASCII byte).
        let alone = !text[..at].chars().next_back().is_some_and(in_name);
        let name = &text[at..];
        let end = name.find(|c: char| !in_name(c)).unwrap_or(name.len());
        alone && statements.contains(&name.as_bytes()[..end])
    })
}

/// What one server message teaches, whoever reads it: statements the server does or does not
/// have, parameters, and the transaction status of a ReadyForQuery (returned). Only
/// ParameterStatus and CommandComplete teach anything beyond what the queue `learned`:
/// [`server_message`] calls this for no other message unless the queue learned something.
/// `owed`: what the server still owes after this message (sent after what it answers).
pub(super) fn learn(
    tag: u8,
    body: &[u8],
    learned: Learned,
    server_statements: &mut ServerStatements,
    server_params: &mut ParamSet,
    client: &mut ClientSide,
    owed: &Expected,
) -> Result<Option<TxStatus>, SessionError> {
    match learned {
        Learned::Ready => {
            let status = body
                .first()
                .copied()
                .and_then(TxStatus::from_byte)
                .ok_or_else(|| {
                    SessionError::Fatal(ErrorResponse::fatal(
                        sqlstate::PROTOCOL_VIOLATION,
                        "server sent a malformed ReadyForQuery".to_string(),
                    ))
                })?;
            return Ok(Some(status));
        }
        Learned::Skipped(skipped) => {
            let Skipped {
                server_statements: missing,
                client_statements,
                still_prepared,
                reopened,
                unnamed_skipped,
                ..
            } = *skipped;
            for seq in unnamed_skipped {
                client.views.skipped_parse(seq);
            }
            for name in &missing {
                server_statements.remove(name);
            }
            for name in &still_prepared {
                server_statements.use_in_batch(name);
            }
            for name in &client_statements {
                client.statements.remove(name);
            }
            // A skipped Close or DEALLOCATE dropped nothing: the name is the client's again.
            for Reopen {
                name,
                parse,
                reading,
            } in reopened
            {
                if let Some(statement) = Statement::from_parse_message(&parse, reading) {
                    client.statements.insert(name, Arc::new(statement));
                }
            }
        }
        Learned::Defined(definition) => client.views.commit(&definition),
        Learned::Prepared(name) => server_statements.parse_answered(&name),
        Learned::Nothing => {}
    }
    match tag {
        backend::tag::PARAMETER_STATUS => {
            if let Some((name, value)) = parameter_status(body) {
                if let Some(canonical) = client.tracked.canonical(name) {
                    server_params.set(canonical, value);
                    client.params.set(canonical, value);
                }
            }
        }
        // A client's RESET (RESET ALL, say) may have put back what PostgreSQL never reports.
        backend::tag::COMMAND_COMPLETE if body == b"RESET\0" => {
            server_params.forget_unreported();
        }
        // A reset sent through the extended protocol is only seen in its answer.
        backend::tag::COMMAND_COMPLETE
            if body == b"DISCARD ALL\0" || body == b"DEALLOCATE ALL\0" =>
        {
            server_statements.clear();
            // Only the names that existed when the reset was sent: a Parse sent after it (in
            // the same pipeline), whose answer is still owed, created its name after it.
            if owed.is_empty() {
                client.statements.clear();
            } else {
                client.statements.retain(|name| owed.owes_creation_of(name));
            }
            if body == b"DISCARD ALL\0" {
                // Every setting is back at its default, those PostgreSQL does not report too;
                // but a value already unknown stays so (a text after the DISCARD, sent with
                // it, may have set it again).
                if !server_params.unreported_unknown() {
                    server_params.reset_unreported();
                }
                client.params.reset_unreported();
            }
        }
        _ => {}
    }
    Ok(None)
}

/// What one client message needs: the statement maps, the rules, and the server it goes to.
pub(super) struct MessageContext<'a> {
    pub link: &'a mut Link,
    pub statements: &'a mut ClientStatements,
    /// max_prepared_statements when pgward maps prepared statements, else None.
    pub capacity: Option<usize>,
    /// The server goes back to the pool after each transaction.
    pub pooled: bool,
    /// The policy's rules, when a policy is in force.
    pub rules: Option<RuleCheck<'a>>,
    /// pgward refused a Parse itself and drops the client's messages until Sync.
    pub skip_to_sync: &'a mut bool,
    /// The admission gate's verdicts on the Query, Bind, FunctionCall and Execute messages to
    /// come, in order (empty without a policy).
    pub verdicts: &'a mut std::collections::VecDeque<super::admit::Gated>,
    /// SHOW STATS' parse and bind counts.
    pub counters: &'a crate::ops::PoolCounters,
    /// What each Parse that passed the gate defines for it, in order (see
    /// [`Definition`]); the gate's view of the statements, told when a Parse it did not see
    /// goes out.
    pub defines: &'a mut std::collections::VecDeque<Option<Arc<Definition>>>,
    pub views: &'a mut Views,
    /// The client's unnamed statement as the gate knew it at each Bind or Describe of it
    /// that passed the gate, in order.
    pub unnamed_uses: &'a mut std::collections::VecDeque<Option<Arc<Parsed>>>,
    /// What the name pgward gives a statement it makes sure cannot exist starts with (a part
    /// drawn at random at start, so that no client's own name starts so); the client's name
    /// follows.
    pub not_here: &'a str,
    /// Room for a rewritten Bind or Describe, kept from one to the next (no allocation for
    /// each).
    pub room: &'a mut BytesMut,
}

/// A replacement's buffer is kept as the room of the next only up to this capacity (a Bind
/// with large parameters, a long text prepared again, do not leave their buffers behind: with
/// many clients connected, each keeps at most this much).
const KEPT_ROOM: usize = 1024;

impl MessageContext<'_> {
    /// Takes back a replacement [`client_message`](Self::client_message) gave, once copied
    /// out, as the room of the next.
    pub fn keep_room(&mut self, mut used: BytesMut) {
        if used.capacity() <= KEPT_ROOM && self.room.capacity() == 0 {
            used.clear();
            *self.room = used;
        }
    }

    /// Records what the server owes for one client message; returns what to send instead of
    /// it, if anything else (an empty buffer sends nothing).
    pub fn client_message(
        &mut self,
        tag: u8,
        body: &[u8],
    ) -> Result<Option<BytesMut>, SessionError> {
        // Each gated request has its verdict, even one that is skipped below, and each gated
        // Parse what it defines for the gate.
        let (verdict, work) = match tag {
            frontend::tag::QUERY
            | frontend::tag::BIND
            | frontend::tag::FUNCTION_CALL
            | frontend::tag::EXECUTE => self
                .verdicts
                .pop_front()
                .map_or((None, None), |g| (g.hit, g.work)),
            _ => (None, None),
        };
        let definition = match tag {
            frontend::tag::PARSE => self.defines.pop_front().unwrap_or_else(|| {
                self.views.partial = true;
                None
            }),
            _ => None,
        };
        let unnamed = match super::views::uses_unnamed(tag, body) {
            true => self.unnamed_uses.pop_front().flatten(),
            false => None,
        };
        if let Some(d) = definition.as_ref().filter(|d| d.name.is_empty()) {
            if *self.skip_to_sync || self.link.expected.skipping() {
                // A Parse PostgreSQL skips drops nothing.
                self.views.skipped_parse(d.seq);
            }
        }
        if *self.skip_to_sync {
            // pgward refused a Parse itself: drop what PostgreSQL would skip.
            if tag == frontend::tag::SYNC {
                *self.skip_to_sync = false;
                self.link.expected.push(Owed::Synthetic {
                    answer: Bytes::new(),
                    client_name: None,
                    ready: true,
                    batch: false,
                    reopens: None,
                });
            }
            return Ok(Some(BytesMut::new()));
        }
        let expected = &mut self.link.expected;
        if expected.skipping() && tag != frontend::tag::SYNC {
            // The server skips everything up to Sync after an error: nothing is owed, and
            // nothing may be rewritten or answered by pgward.
            return Ok(None);
        }
        match tag {
            frontend::tag::QUERY => {
                let out = self.query(body, verdict)?;
                self.link.expected.mark_work(work);
                return Ok(out);
            }
            frontend::tag::FUNCTION_CALL => return self.function_call(verdict),
            // PostgreSQL ignores Sync and Flush during COPY FROM STDIN.
            frontend::tag::SYNC if expected.copy_in() => {}
            frontend::tag::SYNC => {
                expected.push(Owed::Sync);
                self.link.server.statements.end_batch();
                if self.link.unnamed_in_batch {
                    // Whether that Parse ran is known from its answer only.
                    self.link.unnamed_in_batch = false;
                    self.link.unnamed_unsettled = true;
                }
            }
            frontend::tag::COPY_DONE | frontend::tag::COPY_FAIL => expected.end_copy_in(),
            frontend::tag::EXECUTE => {
                if let Some(hit) = verdict {
                    // (A kill made since its portal was bound.)
                    return Ok(Some(self.refuse_in_batch(&hit)));
                }
                expected.push(Owed::Execute);
                expected.mark_work(work);
            }
            frontend::tag::PARSE => return self.parse(body, definition),
            frontend::tag::BIND => return self.bind(body, verdict, unnamed),
            frontend::tag::DESCRIBE => return self.describe(body, unnamed),
            frontend::tag::CLOSE => return self.close(body),
            _ => {}
        }
        Ok(None)
    }

    /// Nothing is in flight and no transaction or batch is open: pgward may answer a refusal
    /// itself, as PostgreSQL would. So may it the client's cancel that landed on pgward's own
    /// statements while it priced the request and left the transaction failed (the savepoint
    /// gone): the server would answer anything raised there with 25P02, not the cancel.
    fn can_answer_alone(&self, hit: &RuleHit) -> bool {
        let cancel = hit.sqlstate == sqlstate::QUERY_CANCELED && hit.rule == "cancel";
        self.link.expected.is_quiet()
            && match self.link.server.tx {
                TxStatus::Idle => true,
                TxStatus::Failed => cancel,
                TxStatus::InTransaction => false,
            }
    }

    /// The rules' verdict on a statement text, if they refuse it. `verdict` is the gate's,
    /// if it refused the request already (and logged it, unless it was a rule's).
    fn refusal(&mut self, text: &[u8], verdict: Option<&RuleHit>) -> Option<RuleHit> {
        // A batch still open counts as in flight though all of it was answered (through a
        // Flush): PostgreSQL reports a setting changed in it only before its ReadyForQuery.
        let in_flight = !self.link.expected.is_quiet();
        let pooled = self.pooled;
        let rules = self.rules.as_mut()?;
        rules.log_refusals = verdict.is_none_or(|v| v.by_rule);
        rules.judge(text, in_flight, pooled)
    }

    /// The refusal of a text that would define or free a statement under one of pgward's own
    /// names, where pgward maps statements (42939, as PostgreSQL refuses a reserved name).
    fn reserved(&self, text: &[u8]) -> Option<RuleHit> {
        if self.capacity.is_none() || !prepared::touches_reserved(text) {
            return None;
        }
        Some(RuleHit::refusal(
            "reserved_name",
            sqlstate::RESERVED_NAME,
            "pgward: prepared statement names starting with \"pgw_\" are reserved".to_string(),
            Some(
                "pgward prepares statements under such names on servers its clients share"
                    .to_string(),
            ),
            Some("use another name".to_string()),
        ))
    }

    fn query(
        &mut self,
        body: &[u8],
        verdict: Option<Box<RuleHit>>,
    ) -> Result<Option<BytesMut>, SessionError> {
        let sql = QueryView::new(body).text;
        let hit = self
            .refusal(sql, verdict.as_deref())
            .or(verdict.map(|v| *v));
        if let Some(hit) = hit.or_else(|| self.reserved(sql)) {
            if self.can_answer_alone(&hit) {
                self.answer_alone(rules::error_message(&hit), true);
                return Ok(Some(BytesMut::new()));
            }
            self.link.expected.push(Owed::Query);
            return Ok(Some(rules::raise_as_query(&hit)));
        }
        if self.capacity.is_some() {
            match prepared::deallocation(sql) {
                reset @ (Deallocation::All | Deallocation::DiscardAll) => {
                    // What follows in the same pipeline runs after the reset: the client's
                    // names are gone, and so are pgward's statements on this server. If the
                    // reset fails, the server may keep statements pgward forgot: it is then
                    // closed rather than reused. In a transaction last seen failed PostgreSQL
                    // refuses it (25P02), and DISCARD ALL in any transaction block (25001):
                    // the client keeps its names, which go only if its answer says it ran
                    // (see `learn`).
                    let refused = match reset {
                        Deallocation::DiscardAll => self.link.server.tx != TxStatus::Idle,
                        _ => self.link.server.tx == TxStatus::Failed,
                    };
                    if !refused {
                        self.statements.clear();
                    }
                    self.link.server.statements.clear();
                    self.link.reset_sent = true;
                }
                Deallocation::One(name) if self.link.server.tx != TxStatus::Failed => {
                    if let Some(statement) = self.statements.remove(&name) {
                        // The statement lives on servers under pgward's name; the client's
                        // DEALLOCATE is answered here, at its turn (put back if the server
                        // skips the Query, sent inside a batch that failed).
                        self.link.expected.push(Owed::Synthetic {
                            answer: command_complete("DEALLOCATE"),
                            client_name: None,
                            ready: true,
                            batch: false,
                            reopens: Some(Box::new(Reopen {
                                name,
                                parse: statement.parse.clone(),
                                reading: statement.reading.clone(),
                            })),
                        });
                        return Ok(Some(BytesMut::new()));
                    }
                }
                _ => {}
            }
        }
        if self.pooled && prepared::starts_with_word(body, b"listen") {
            self.answer_alone(listen_warning(), false);
        }
        self.link.expected.push(Owed::Query);
        Ok(None)
    }

    /// Queues an answer pgward gives itself, at its turn; `ready` adds a ReadyForQuery.
    fn answer_alone(&mut self, answer: Bytes, ready: bool) {
        self.link.expected.push(Owed::Synthetic {
            answer,
            client_name: None,
            ready,
            batch: false,
            reopens: None,
        });
    }

    fn function_call(
        &mut self,
        verdict: Option<Box<RuleHit>>,
    ) -> Result<Option<BytesMut>, SessionError> {
        let logs = verdict.as_ref().is_none_or(|v| v.by_rule);
        let rules = self.rules.as_mut().and_then(|r| {
            r.log_refusals = logs;
            r.judge_function_call()
        });
        let Some(hit) = rules.or(verdict.map(|v| *v)) else {
            self.link.expected.push(Owed::Query);
            return Ok(None);
        };
        if self.can_answer_alone(&hit) {
            self.answer_alone(rules::error_message(&hit), true);
            return Ok(Some(BytesMut::new()));
        }
        self.link.expected.push(Owed::Query);
        Ok(Some(rules::raise_as_query(&hit)))
    }

    /// `definition`: what the Parse defines for the gate, once the server answers it.
    fn parse(
        &mut self,
        body: &[u8],
        definition: Option<Arc<Definition>>,
    ) -> Result<Option<BytesMut>, SessionError> {
        let parse = ParseView::new(body).map_err(|_| malformed("Parse"))?;
        let types = parse.param_types().map_err(|_| malformed("Parse"))?;
        let (name, query) = (parse.name, parse.query);
        if let Some(hit) = self.refusal(query, None).or_else(|| self.reserved(query)) {
            if name.is_empty() && self.can_answer_alone(&hit) {
                // PostgreSQL drops the unnamed statement before it reads the new text: the
                // client has none now. (A refusal raised on the server in its place says so
                // by its own answers, and leaves the client's where the server skips it.)
                self.link.unnamed_ours = false;
                self.link.unnamed_answered = false;
            }
            return Ok(Some(self.refuse_in_batch(&hit)));
        }
        if name.is_empty() {
            // Taken as the client's for the rest of this batch only (see `Link::
            // waits_for_unnamed`): a later batch's use waits for the answer.
            self.link.unnamed_ours = true;
            self.link.unnamed_in_batch = true;
        }
        let Some(capacity) = self.capacity.filter(|_| !name.is_empty()) else {
            self.link.expected.push(Owed::Parse {
                client: true,
                statement: None,
                client_name: None,
                unnamed: name.is_empty(),
                defines: definition,
                renamed: None,
            });
            return Ok(None);
        };
        self.counters.add_client_parse();
        let mut out = BytesMut::new();
        if let Some(existing) = self.statements.get(name).cloned() {
            // PostgreSQL refuses a second statement of the same name: let the server say so,
            // by preparing pgward's name for it twice.
            tracing::warn!(
                "prepared statement '{}' was already prepared",
                String::from_utf8_lossy(name)
            );
            let here = match self.ensure(&existing, capacity, &mut out) {
                Ok(here) => here,
                Err(hit) => return Ok(Some(self.refuse_in_batch(&hit))),
            };
            self.counters.add_server_parse();
            let sent = here.as_ref().unwrap_or(&existing);
            out.extend_from_slice(&sent.parse);
            // Its 42P05 names pgward's statement: worded for the client's name.
            let renamed = Renamed {
                client: Bytes::copy_from_slice(name),
                ours: sent.server_name.clone(),
            };
            self.link.expected.push(Owed::Parse {
                client: true,
                statement: None,
                client_name: None,
                unnamed: false,
                defines: None,
                renamed: Some(Box::new(renamed)),
            });
            return Ok(Some(out));
        }
        let types: Vec<u32> = types.iter().collect();
        let reading = prepared::reading(query, &self.link.server.params);
        let statement = Arc::new(Statement::new(query, &types, reading));
        let client_name = Bytes::copy_from_slice(name);
        self.statements
            .insert(client_name.clone(), statement.clone());
        let server = &mut self.link.server;
        // A statement the server has is answered here, unless the transaction was last seen
        // failed (below). One whose Parse went out in an earlier batch and is not answered
        // yet may still be skipped: it is prepared again.
        let settled = server.statements.settled(&statement.server_name);
        if settled && server.tx != TxStatus::Failed {
            server.statements.use_in_batch(&statement.server_name);
            self.link.expected.push(Owed::Synthetic {
                answer: Bytes::from_static(backend::PARSE_COMPLETE_MESSAGE),
                client_name: Some(client_name),
                ready: false,
                batch: true,
                reopens: None,
            });
            return Ok(Some(out));
        }
        if settled {
            // The transaction was last seen failed, where PostgreSQL refuses every Parse
            // (25P02): the client must get the server's answer, not a ParseComplete. But a
            // ROLLBACK sent ahead may have ended it, and a Parse of pgward's name, which the
            // server has, would then fail (42P05). The text is parsed under a name no
            // statement has, closed right behind it: it fails, or succeeds, as the client's
            // own Parse would, and leaves the server's statement alone.
            server.statements.use_in_batch(&statement.server_name);
            self.counters.add_server_parse();
            let probe = self.not_here.as_bytes();
            wire::encode_parse(&mut out, probe, query, &types);
            self.link.expected.push(Owed::Parse {
                client: true,
                statement: None,
                client_name: Some(client_name),
                unnamed: false,
                defines: None,
                renamed: None,
            });
            wire::encode_close(&mut out, target::STATEMENT, probe);
            self.link.expected.push(Owed::Close {
                client: false,
                statement: None,
            });
            return Ok(Some(out));
        }
        if !server.statements.contains(&statement.server_name) {
            self.evict_for_one(capacity, &mut out);
        }
        self.close_first(&statement.server_name, &mut out);
        self.link
            .server
            .statements
            .parse_in_batch(&statement.server_name);
        self.counters.add_server_parse();
        out.extend_from_slice(&statement.parse);
        self.link.expected.push(Owed::Parse {
            client: true,
            statement: Some(statement.server_name.clone()),
            client_name: Some(client_name),
            unnamed: false,
            defines: None,
            renamed: None,
        });
        Ok(Some(out))
    }

    /// A refused Parse or Bind: answered by pgward when nothing is in flight (then it drops
    /// messages until Sync, as PostgreSQL would), else raised by PostgreSQL in its place.
    fn refuse_in_batch(&mut self, hit: &RuleHit) -> BytesMut {
        if self.can_answer_alone(hit) {
            self.link.expected.push(Owed::Synthetic {
                answer: rules::error_message(hit),
                client_name: None,
                ready: false,
                batch: false,
                reopens: None,
            });
            *self.skip_to_sync = true;
            return BytesMut::new();
        }
        // The unnamed statement now holds the refusal, not anything of the client's.
        self.link.unnamed_ours = false;
        for owed in [
            Owed::Parse {
                client: false,
                statement: None,
                client_name: None,
                unnamed: true,
                defines: None,
                renamed: None,
            },
            Owed::InternalBind,
            Owed::InternalExecute,
        ] {
            self.link.expected.push(owed);
        }
        rules::raise_in_batch(hit)
    }

    /// `unnamed`: the client's unnamed statement where the gate read the Bind, if it binds
    /// that one.
    fn bind(
        &mut self,
        body: &[u8],
        verdict: Option<Box<RuleHit>>,
        unnamed: Option<Arc<Parsed>>,
    ) -> Result<Option<BytesMut>, SessionError> {
        let bind = BindView::new(body).map_err(|_| malformed("Bind"))?;
        if let Some(hit) = verdict {
            return Ok(Some(self.refuse_in_batch(&hit)));
        }
        let Some((stmt, capacity)) = self.mapped(bind.statement) else {
            if self.pooled && !bind.statement.is_empty() {
                // A statement pgward does not map: its text is not known here, and it may
                // change a setting PostgreSQL never reports (the next client's is set).
                self.link.server.params.forget_unreported();
            }
            let mut out = std::mem::take(self.room);
            let injected = match self.ensure_unnamed(bind.statement, unnamed, &mut out) {
                Ok(injected) => injected,
                Err(hit) => return Ok(Some(self.refuse_in_batch(&hit))),
            };
            self.link.expected.push(Owed::Bind);
            let foreign = self.foreign_statement(bind.statement).filter(|_| !injected);
            if foreign.is_none() && out.is_empty() {
                *self.room = out;
                return Ok(None);
            }
            bind.encode_renamed(&mut out, foreign.as_deref().unwrap_or(bind.statement));
            return Ok(Some(out));
        };
        self.counters.add_bind();
        if stmt.names_unreported {
            // A run of a statement whose text names a setting PostgreSQL never reports.
            self.link.note_unreported();
        }
        let mut out = std::mem::take(self.room);
        let here = match self.ensure(&stmt, capacity, &mut out) {
            Ok(here) => here,
            Err(hit) => return Ok(Some(self.refuse_in_batch(&hit))),
        };
        bind.encode_renamed(&mut out, &here.as_ref().unwrap_or(&stmt).server_name);
        self.link.expected.push(Owed::Bind);
        Ok(Some(out))
    }

    /// The client's named statement, and the capacity, when pgward maps statements.
    fn mapped(&self, name: &[u8]) -> Option<(Arc<Statement>, usize)> {
        let capacity = self.capacity.filter(|_| !name.is_empty())?;
        Some((self.statements.get(name)?.clone(), capacity))
    }

    /// A statement name that would reach something this client did not prepare on this
    /// server (the unnamed statement of another transaction, which may be another client's,
    /// or the one a refusal left, or one of pgward's own names): the name to use instead,
    /// which cannot exist, so the server answers 26000 as for any statement that does not
    /// exist.
    fn foreign_statement(&self, name: &[u8]) -> Option<Bytes> {
        let foreign = if name.is_empty() {
            // In session pooling too: a refusal pgward raised in a message's place left its
            // own statement there, or one it answered itself left the client none.
            !self.link.unnamed_ours
        } else {
            self.pooled
                && self.capacity.is_some()
                && name.starts_with(prepared::OWN_PREFIX.as_bytes())
        };
        foreign.then(|| {
            let mut out = self.not_here.as_bytes().to_vec();
            out.extend_from_slice(name);
            Bytes::from(out)
        })
    }

    /// `unnamed`: as for [`bind`](Self::bind).
    fn describe(
        &mut self,
        body: &[u8],
        unnamed: Option<Arc<Parsed>>,
    ) -> Result<Option<BytesMut>, SessionError> {
        let described = DescribeView::new(body).map_err(|_| malformed("Describe or Close"))?;
        if described.kind != target::STATEMENT {
            self.link.expected.push(Owed::DescribePortal);
            return Ok(None);
        }
        let name = described.name;
        let Some((stmt, capacity)) = self.mapped(name) else {
            let mut out = std::mem::take(self.room);
            let injected = match self.ensure_unnamed(name, unnamed, &mut out) {
                Ok(injected) => injected,
                Err(hit) => return Ok(Some(self.refuse_in_batch(&hit))),
            };
            self.link.expected.push(Owed::DescribeStatement);
            let foreign = self.foreign_statement(name).filter(|_| !injected);
            if foreign.is_none() && out.is_empty() {
                *self.room = out;
                return Ok(None);
            }
            let name = foreign.as_deref().unwrap_or(name);
            wire::encode_describe(&mut out, target::STATEMENT, name);
            return Ok(Some(out));
        };
        let mut out = std::mem::take(self.room);
        let here = match self.ensure(&stmt, capacity, &mut out) {
            Ok(here) => here,
            Err(hit) => return Ok(Some(self.refuse_in_batch(&hit))),
        };
        let name = &here.as_ref().unwrap_or(&stmt).server_name;
        wire::encode_describe(&mut out, target::STATEMENT, name);
        self.link.expected.push(Owed::DescribeStatement);
        Ok(Some(out))
    }

    fn close(&mut self, body: &[u8]) -> Result<Option<BytesMut>, SessionError> {
        let closed = CloseView::new(body).map_err(|_| malformed("Describe or Close"))?;
        let name = closed.name;
        if closed.kind != target::STATEMENT || name.is_empty() || self.capacity.is_none() {
            self.link.expected.push(Owed::Close {
                client: true,
                statement: None,
            });
            return Ok(None);
        }
        // The server keeps pgward's statement for other clients; the client's name goes now
        // (what follows in the pipeline no longer finds it), and comes back if the server
        // skips the Close after an error before it.
        let reopens = self.statements.remove(name).map(|statement| {
            Box::new(Reopen {
                name: Bytes::copy_from_slice(name),
                parse: statement.parse.clone(),
                reading: statement.reading.clone(),
            })
        });
        self.link.expected.push(Owed::Synthetic {
            answer: Bytes::from_static(backend::CLOSE_COMPLETE_MESSAGE),
            client_name: None,
            ready: false,
            batch: true,
            reopens,
        });
        Ok(Some(BytesMut::new()))
    }

    /// A Bind or Describe of `name`, the unnamed statement, on a server where it is not the
    /// client's: prepares it there first when the gate knew, where it read the message, what
    /// PostgreSQL kept for the client (`known`: its last Parse of it, answered, with nothing
    /// since that dropped it), as it would be on a server of the client's own. (A run that
    /// waited in the gate after the Sync of its Parse comes here on the next server.) True
    /// when it did: the message goes right behind that Parse, and is skipped with it if the
    /// server skips it; the rules' refusal of the text, read as the server reads it here, is
    /// the error. The server's unnamed statement is not taken as the client's after it
    /// (a later batch's use of it is prepared again): the Parse may yet be skipped, leaving
    /// another client's there.
    fn ensure_unnamed(
        &mut self,
        name: &[u8],
        known: Option<Arc<Parsed>>,
        out: &mut BytesMut,
    ) -> Result<bool, Box<RuleHit>> {
        // (In session pooling too: a refusal raised in a Bind's place leaves pgward's own
        // statement there.)
        if !name.is_empty() || self.link.unnamed_ours {
            return Ok(false);
        }
        let Some(parsed) = known else {
            return Ok(false);
        };
        // Judged again as the server reads it here (see `ensure`).
        if let Some(hit) = self.refusal(&parsed.text, None) {
            return Err(Box::new(hit));
        }
        wire::encode_parse_raw(out, b"", &parsed.text, &parsed.types);
        self.link.expected.push(Owed::Parse {
            client: false,
            statement: None,
            client_name: None,
            unnamed: true,
            defines: None,
            renamed: None,
        });
        Ok(true)
    }

    /// Prepares `stmt` on this server first if it does not have it (or if its Parse, sent in
    /// an earlier batch, is not answered yet: the server may skip it). The server reads the
    /// text under the settings it has now: where they make another statement of it, that one
    /// is prepared and returned (the name is then its own). A text pgward prepares on its own
    /// is judged again by the rules, as the server reads it there and then: their refusal is
    /// the error.
    fn ensure(
        &mut self,
        stmt: &Arc<Statement>,
        capacity: usize,
        out: &mut BytesMut,
    ) -> Result<Option<Arc<Statement>>, Box<RuleHit>> {
        if self.use_settled(&stmt.server_name) {
            return Ok(None);
        }
        let here = stmt.read_under(&self.link.server.params).map(Arc::new);
        let stmt = here.as_ref().unwrap_or(stmt);
        if here.is_some() && self.use_settled(&stmt.server_name) {
            return Ok(here);
        }
        // (Judged as the client's Parse was: where it goes out, under the policy of then.)
        let text = stmt.parsed.as_ref().map(|p| &p.text);
        if let Some(hit) = text.and_then(|t| self.refusal(t, None)) {
            return Err(Box::new(hit));
        }
        if !self.link.server.statements.contains(&stmt.server_name) {
            self.evict_for_one(capacity, out);
        }
        self.close_first(&stmt.server_name, out);
        self.counters.add_server_parse();
        out.extend_from_slice(&stmt.parse);
        self.link
            .server
            .statements
            .parse_in_batch(&stmt.server_name);
        self.link.expected.push(Owed::Parse {
            client: false,
            statement: Some(stmt.server_name.clone()),
            client_name: None,
            unnamed: false,
            defines: None,
            renamed: None,
        });
        Ok(here)
    }

    /// Whether the server has statement `name` (answered): then this batch uses it.
    fn use_settled(&mut self, name: &Bytes) -> bool {
        let statements = &mut self.link.server.statements;
        let settled = statements.settled(name);
        if settled {
            statements.use_in_batch(name);
        }
        settled
    }

    /// Closes pgward's statement `name` before it is prepared on a server that should not
    /// have it. The server may have it all the same: a Close of it sent in an earlier batch,
    /// not answered yet, may be skipped after an error, or a DEALLOCATE ALL answered later may
    /// be taken to have dropped it. PostgreSQL's Close of a statement that does not exist is no
    /// error, so the Parse that follows works either way (pgward's names are made from the
    /// text and types, so the statement is the same).
    fn close_first(&mut self, name: &Bytes, out: &mut BytesMut) {
        wire::encode_close(out, target::STATEMENT, name);
        self.link.expected.push(Owed::Close {
            client: false,
            statement: None,
        });
    }

    /// Makes room for one more statement on the server: closes the least recently used one
    /// no open batch needs, if the server holds `capacity` already.
    fn evict_for_one(&mut self, capacity: usize, out: &mut BytesMut) {
        // The capacity may have been lowered at run time: close until there is room.
        while let Some(victim) = self.link.server.statements.victim(capacity) {
            let server = &mut self.link.server;
            server.statements.remove(&victim);
            wire::encode_close(out, target::STATEMENT, &victim);
            self.link.expected.push(Owed::Close {
                client: false,
                statement: Some(victim),
            });
        }
    }
}

/// Said to a client that LISTENs in transaction pooling: notifications reach it only while
/// it holds a server.
fn listen_warning() -> Bytes {
    let mut out = BytesMut::new();
    let notice = ErrorResponse::new(
        wire::Severity::Warning,
        "01000",
        "LISTEN under transaction pooling: notifications arrive only while this client holds a server, that is inside a transaction",
    )
    .with_hint("Use session pooling (pool_mode = session) for clients that LISTEN.");
    wire::encode_notice(&mut out, &notice);
    out.freeze()
}

fn command_complete(tag: &str) -> Bytes {
    let mut out = BytesMut::new();
    wire::encode_command_complete(&mut out, tag);
    out.freeze()
}

fn malformed(what: &str) -> SessionError {
    SessionError::Fatal(ErrorResponse::fatal(
        sqlstate::PROTOCOL_VIOLATION,
        format!("invalid {what} message"),
    ))
}

fn parameter_status(body: &[u8]) -> Option<(&str, &str)> {
    let mut parts = body.split(|b| *b == 0);
    let name = std::str::from_utf8(parts.next()?).ok()?;
    let value = std::str::from_utf8(parts.next()?).ok()?;
    Some((name, value))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The body of an ErrorResponse with `code` and `message`.
    fn error(code: &str, message: &str) -> BytesMut {
        let mut out = BytesMut::new();
        wire::encode_error(&mut out, &ErrorResponse::error(code.to_string(), message));
        out.split_off(wire::HEADER_LEN)
    }

    fn holding(name: &str) -> ServerStatements {
        let mut statements = ServerStatements::default();
        statements.use_in_batch(&Bytes::copy_from_slice(name.as_bytes()));
        statements
    }

    const NAME: &str = "pgw_81d68d7230ba0d375d2ce10a1112fbfc";

    /// A start of pgward's names for statements that cannot exist, random part included.
    const NOT_HERE: &str = "pgward_not_prepared_here_0123456789abcdef_";

    #[test]
    fn a_missing_statement_of_pgwards_is_lost() {
        let missing = format!("prepared statement \"{NAME}\" does not exist");
        assert!(lost_own_statement(
            &holding(NAME),
            &error("26000", &missing)
        ));
        // In another language's words and quotes, the name is still the name.
        let german = format!("Prepared Statement »{NAME}« existiert nicht");
        assert!(lost_own_statement(&holding(NAME), &error("26000", &german)));
    }

    #[test]
    fn only_a_name_of_its_own_in_the_map_is_lost() {
        let statements = holding(NAME);
        for other in ["a", "a_", "a$", "ñ", NOT_HERE] {
            let message = format!("prepared statement \"{other}{NAME}\" does not exist");
            assert!(
                !lost_own_statement(&statements, &error("26000", &message)),
                "{message}"
            );
        }
        let longer = format!("prepared statement \"{NAME}0\" does not exist");
        assert!(!lost_own_statement(&statements, &error("26000", &longer)));
        let missing = format!("prepared statement \"{NAME}\" does not exist");
        assert!(!lost_own_statement(&statements, &error("42P05", &missing)));
        assert!(!lost_own_statement(
            &ServerStatements::default(),
            &error("26000", &missing)
        ));
        assert!(!lost_own_statement(&statements, b"not an error body"));
    }

    /// The fields of an ErrorResponse message (its header included).
    fn fields_of(message: &[u8]) -> Vec<(u8, Vec<u8>)> {
        message[wire::HEADER_LEN..]
            .split(|b| *b == 0)
            .filter_map(|f| f.split_first().map(|(k, v)| (*k, v.to_vec())))
            .collect()
    }

    fn field_of(fields: &[(u8, Vec<u8>)], kind: u8) -> Option<&[u8]> {
        fields.iter().find(|(k, _)| *k == kind).map(|(_, v)| &v[..])
    }

    #[test]
    fn an_error_about_a_renamed_statement_names_the_clients_statement() {
        use backend::field;
        // The unnamed statement, in English: PostgreSQL's own message, without the place in
        // PostgreSQL's source of another message.
        let mut body = BytesMut::new();
        let english = format!("prepared statement \"{NOT_HERE}\" does not exist");
        for (kind, value) in [
            (field::SEVERITY, "ERROR"),
            (field::CODE, "26000"),
            (field::MESSAGE, english.as_str()),
            (field::FILE, "prepare.c"),
            (field::LINE, "537"),
            (field::ROUTINE, "FetchPreparedStatement"),
        ] {
            body.extend_from_slice(&[kind]);
            body.extend_from_slice(value.as_bytes());
            body.extend_from_slice(&[0]);
        }
        body.extend_from_slice(&[0]);
        let out = foreign_statement_error(&body, NOT_HERE).expect("reworded");
        assert_eq!(out[0], backend::tag::ERROR_RESPONSE);
        let fields = fields_of(&out);
        assert_eq!(field_of(&fields, field::MESSAGE), Some(NO_UNNAMED));
        assert_eq!(field_of(&fields, field::SEVERITY), Some(&b"ERROR"[..]));
        assert_eq!(field_of(&fields, field::CODE), Some(&b"26000"[..]));
        assert!(
            field_of(&fields, field::FILE).is_none() && field_of(&fields, field::ROUTINE).is_none()
        );
        // A name of pgward's own, in another language and encoding: the renaming is taken out,
        // every other byte kept.
        let mut german = b"Prepared Statement \xbb".to_vec();
        german.extend_from_slice(NOT_HERE.as_bytes());
        german.extend_from_slice(NAME.as_bytes());
        german.extend_from_slice(b"\xab existiert nicht");
        let mut body = b"SFEHLER\0C26000\0M".to_vec();
        body.extend_from_slice(&german);
        body.extend_from_slice(b"\0Fprepare.c\0\0");
        let fields = fields_of(&foreign_statement_error(&body, NOT_HERE).expect("reworded"));
        let mut want = b"Prepared Statement \xbb".to_vec();
        want.extend_from_slice(NAME.as_bytes());
        want.extend_from_slice(b"\xab existiert nicht");
        assert_eq!(field_of(&fields, field::MESSAGE), Some(&want[..]));
        assert_eq!(field_of(&fields, field::FILE), Some(&b"prepare.c"[..]));
        // Any other error is left alone: a client's own name, one that starts as pgward's
        // would without its random part, another SQLSTATE.
        let reworded = |body: &[u8]| foreign_statement_error(body, NOT_HERE);
        let other = format!("prepared statement \"{NAME}\" does not exist");
        assert!(reworded(&error("26000", &other)).is_none());
        let alike = "prepared statement \"pgward_not_prepared_here_\" does not exist";
        assert!(reworded(&error("26000", alike)).is_none());
        assert!(reworded(&error("42P05", &english)).is_none());
        assert!(reworded(b"not an error body").is_none());
        // A server's error with two messages, the second shorter: each is read for itself.
        let mut twice = b"C26000\0M".to_vec();
        let own = format!("prepared statement \"{NOT_HERE}{NAME}\" does not exist");
        twice.extend_from_slice(own.as_bytes());
        twice.extend_from_slice(b"\0Mx\0\0");
        let fields = fields_of(&reworded(&twice).expect("reworded"));
        let messages: Vec<_> = fields
            .iter()
            .filter(|(k, _)| *k == field::MESSAGE)
            .collect();
        assert_eq!(messages.len(), 2);
        assert_eq!(messages[0].1, other.as_bytes());
        assert_eq!(messages[1].1, b"x");
    }

    #[test]
    fn a_refusal_of_a_second_parse_names_the_clients_statement() {
        use backend::field;
        let renamed = Renamed {
            client: Bytes::from_static(b"s1"),
            ours: Bytes::from_static(NAME.as_bytes()),
        };
        let message = |m: &BytesMut| field_of(&fields_of(m), field::MESSAGE).map(<[u8]>::to_vec);
        let english = format!("prepared statement \"{NAME}\" already exists");
        let reworded = renamed_error(&error("42P05", &english), &renamed).expect("reworded");
        let want = b"prepared statement \"s1\" already exists".to_vec();
        assert_eq!(message(&reworded), Some(want));
        // In another language, the name is put in its place.
        let german = format!("Prepared Statement \u{bb}{NAME}\u{ab} existiert bereits");
        let reworded = renamed_error(&error("42P05", &german), &renamed).expect("reworded");
        let want = "Prepared Statement \u{bb}s1\u{ab} existiert bereits"
            .as_bytes()
            .to_vec();
        assert_eq!(message(&reworded), Some(want));
        // Any other error, or one not naming pgward's statement, is left alone.
        assert!(renamed_error(&error("42601", &english), &renamed).is_none());
        let other = "prepared statement \"s2\" already exists";
        assert!(renamed_error(&error("42P05", other), &renamed).is_none());
        assert!(renamed_error(b"not an error body", &renamed).is_none());
    }
}
