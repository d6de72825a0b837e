//! The queue of answers a server owes: every message sent to it is matched to the answer that
//! completes it, in order. It is pure (no I/O) so every sequence can be tested.
//!
//! PostgreSQL's rules it follows:
//! - each Parse, Bind, Describe, Execute and Close is answered in order, and each Sync, Query
//!   and FunctionCall ends with one ReadyForQuery;
//! - after an error in the extended protocol the server skips every message up to the next
//!   Sync, so the entries for those messages are dropped, never answered;
//! - an error inside a simple Query does not end it: its ReadyForQuery still comes;
//! - notices, notifications and parameter changes can arrive at any time and complete nothing.
//!
//! Some entries are answered by pgward itself ([`Owed::Synthetic`]): a Parse of a statement
//! the server already has, a Close pgward keeps from the server. Their answer goes to the
//! client when they reach the head of the queue, so the client sees every answer in the order
//! of its messages.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;

use crate::wire::backend::tag;
use crate::wire::Parsed;

/// A client statement the admission gate follows itself (the unnamed one, and every named
/// one in session pooling), carried by the Parse that creates it: only the server's
/// ParseComplete makes it the statement (see [`Learned::Defined`]). A Parse the server refuses
/// or skips defines nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Definition {
    /// The client's name for it (empty: the unnamed statement).
    pub name: Bytes,
    pub parsed: Arc<Parsed>,
    /// Where the Parse stood in the client's stream, in the gate's count of what may define
    /// or free a statement.
    pub seq: u64,
}

/// What one message sent to the server is owed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owed {
    /// ParseComplete. `client` is false for a Parse pgward sent on its own (re-preparing a
    /// statement on this server), whose ParseComplete the client must not see. `statement`
    /// names the server-side statement, so a failed Parse can be forgotten.
    Parse {
        client: bool,
        statement: Option<Bytes>,
        client_name: Option<Bytes>,
        defines: Option<Arc<Definition>>,
        /// A Parse of the unnamed statement (the client's, or pgward's own).
        unnamed: bool,
        /// A second Parse of a name the client has: the server's refusal (42P05) names
        /// pgward's statement, and is worded for the client's name (see [`Renamed`]).
        renamed: Option<Box<Renamed>>,
    },
    /// BindComplete.
    Bind,
    /// BindComplete of a Bind pgward sent on its own: the client must not see it.
    InternalBind,
    /// ParameterDescription, then RowDescription or NoData.
    DescribeStatement,
    /// RowDescription or NoData.
    DescribePortal,
    /// Rows, then CommandComplete, EmptyQueryResponse or PortalSuspended.
    Execute,
    /// An Execute pgward sent on its own (one that raises a refusal): its error goes to the
    /// client, anything else it answers does not.
    InternalExecute,
    /// CloseComplete; `client` as for Parse. `statement` names a server-side statement
    /// pgward closes to make room: if the server skips the Close, it still has it.
    Close {
        client: bool,
        statement: Option<Bytes>,
    },
    /// ReadyForQuery.
    Sync,
    /// A simple Query or a FunctionCall: everything up to ReadyForQuery.
    Query,
    /// Answered by pgward: `answer` goes to the client at its turn, followed by a
    /// ReadyForQuery when `ready` (a simple Query pgward answers itself). `client_name` is the
    /// client's statement a synthetic ParseComplete created, undone if the server skips it.
    /// `batch` says whether it stands for an extended-protocol message (a Parse, a Close),
    /// which keeps the server until Sync like any other. `reopens` is the client's statement
    /// a Close or DEALLOCATE answered here dropped as it went out, put back if the server
    /// skips it.
    Synthetic {
        answer: Bytes,
        client_name: Option<Bytes>,
        ready: bool,
        batch: bool,
        reopens: Option<Box<Reopen>>,
    },
}

/// The client's name of a statement the server knows by pgward's (`ours`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Renamed {
    pub client: Bytes,
    pub ours: Bytes,
}

/// A client's statement dropped by a Close or DEALLOCATE that pgward answers itself: its
/// name, and the Parse message of pgward's statement it named (which says what it was), with
/// the settings its text was read under where they matter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reopen {
    pub name: Bytes,
    pub parse: Bytes,
    pub reading: Option<Bytes>,
}

impl Owed {
    /// A request: an Execute (the client's or pgward's own) or a Query.
    fn is_request(&self) -> bool {
        matches!(self, Owed::Execute | Owed::InternalExecute | Owed::Query)
    }

    /// Whether this Parse (sent, or answered by pgward at its turn) creates the client's
    /// statement `name`.
    fn creates(&self, name: &[u8]) -> bool {
        match self {
            Owed::Parse {
                client_name: Some(n),
                ..
            }
            | Owed::Synthetic {
                client_name: Some(n),
                ..
            } => &n[..] == name,
            _ => false,
        }
    }

    /// Whether this is a Close or DEALLOCATE answered by pgward that dropped the client's
    /// statement `name` (put back if the server skips it).
    fn reopens(&self, name: &[u8]) -> bool {
        matches!(self, Owed::Synthetic { reopens: Some(r), .. } if &r.name[..] == name)
    }

    /// Whether this creates or drops one of the client's statement names.
    fn changes_a_name(&self) -> bool {
        matches!(
            self,
            Owed::Parse {
                client_name: Some(_),
                ..
            } | Owed::Synthetic {
                client_name: Some(_),
                ..
            } | Owed::Synthetic {
                reopens: Some(_),
                ..
            }
        )
    }

    fn ends_with_ready(&self) -> bool {
        matches!(self, Owed::Sync | Owed::Query)
    }

    fn owes_ready(&self) -> bool {
        self.ends_with_ready() || matches!(self, Owed::Synthetic { ready: true, .. })
    }
}

/// Where the answer to a message goes: the client's own, or pgward's.
fn visible(client: bool) -> Route {
    if client {
        Route::Forward
    } else {
        Route::Swallow
    }
}

/// What to do with one server message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// Send it to the client.
    Forward,
    /// pgward asked for it; the client must not see it.
    Swallow,
}

/// Something the queue learned from a message, beyond where it goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Learned {
    Nothing,
    /// An error made the server skip messages up to Sync: the server-side statements whose
    /// Parse failed or was skipped do not exist there, and the client's statements those
    /// Parses would have created do not exist either. Boxed: rare, and it would make every
    /// answer to every message as large as itself.
    Skipped(Box<Skipped>),
    /// The server answered a ReadyForQuery.
    Ready,
    /// The server created a statement the gate follows (its ParseComplete).
    Defined(Arc<Definition>),
    /// The server created pgward's statement (the ParseComplete of a Parse of it).
    Prepared(Bytes),
}

/// The statements an error made the server skip (see [`Learned::Skipped`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    pub server_statements: Vec<Bytes>,
    pub client_statements: Vec<Bytes>,
    /// The client's statements dropped by skipped Closes that the skipped messages did not
    /// create (see [`Reopen`]): each name as it was before the first of them that touched it.
    /// Put back after `client_statements` are forgotten.
    pub reopened: Vec<Reopen>,
    /// Statements whose Close the server skipped: it still has them.
    pub still_prepared: Vec<Bytes>,
    /// A Parse of the unnamed statement (the client's, or one of pgward's own) failed or was
    /// skipped: the server's unnamed statement may not be the client's.
    pub unnamed_parse: bool,
    /// The gate's places of the client's Parses of the unnamed statement that the server
    /// skipped (not the one that failed): they dropped nothing there.
    pub unnamed_skipped: Vec<u64>,
}

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[error("server sent '{}' while pgward expected {expected}", char::from(*.tag))]
pub struct Desync {
    pub tag: u8,
    pub expected: &'static str,
}

/// The answers a server owes, oldest first.
#[derive(Debug, Default, Clone)]
pub struct Expected {
    queue: VecDeque<Owed>,
    /// Extended-protocol messages were sent since the last Sync.
    batch_open: bool,
    /// Sync, Query and FunctionCall messages whose ReadyForQuery has not arrived.
    syncs: usize,
    /// The server is in COPY FROM STDIN: it ignores Sync and Flush until CopyDone or CopyFail.
    copy_in: bool,
    /// COPY FROM STDIN the client ended (CopyDone or CopyFail) before the server began it:
    /// the statement that starts it (its place among every message ever owed, see
    /// `popped`), and how many Syncs had been sent right behind it by then. Only those are
    /// ignored by the server; one sent after the end is answered.
    copy_ends: VecDeque<(u64, usize)>,
    /// The statements requests run (an Execute, a Query), by the request's place among
    /// every message ever owed (see `popped`): what a KILL STATEMENT finds running.
    works: VecDeque<(u64, u64)>,
    /// How many requests (Execute, pgward's own Execute, Query) the queue holds.
    requests: usize,
    /// How many owed messages have left the front of the queue: the one at the front now is
    /// the `popped`-th.
    popped: u64,
    /// An error in the extended protocol with no Sync sent yet: the server skips every
    /// message until the client's next Sync.
    skipping: bool,
    /// A refusal pgward raised in the client's batch went out with no Sync behind it yet.
    raised: bool,
    /// A message that creates or drops one of the client's statement names may still be
    /// owed an answer (see [`Expected::waits_for_name`]): set as one goes out, cleared once
    /// none is owed.
    names_changing: bool,
}

impl Expected {
    /// Records a message sent to the server (or answered by pgward, for `Synthetic`).
    pub fn push(&mut self, owed: Owed) {
        match &owed {
            Owed::Sync => {
                self.batch_open = false;
                self.skipping = false;
                self.raised = false;
            }
            Owed::Query | Owed::Synthetic { batch: false, .. } => {}
            Owed::InternalExecute => {
                self.batch_open = true;
                self.raised = true;
            }
            _ => self.batch_open = true,
        }
        if owed.owes_ready() {
            self.syncs += 1;
        }
        self.names_changing |= owed.changes_a_name();
        self.requests += usize::from(owed.is_request());
        self.queue.push_back(owed);
    }

    /// Whether a Bind or Describe of the client's statement `name` must wait: a message that
    /// creates or drops the name, in an earlier batch closed by a Sync, is still owed an
    /// answer (the server may skip it after an error before it). Asked only while
    /// [`Expected::names_changing`].
    pub fn waits_for_name(&mut self, name: &[u8]) -> bool {
        if self.owes_parse_of(name) {
            return true;
        }
        self.names_changing = self.queue.iter().any(Owed::changes_a_name);
        false
    }

    /// Whether a message that changes one of the client's statement names may be owed (see
    /// [`Expected::waits_for_name`]).
    pub fn names_changing(&self) -> bool {
        self.names_changing
    }

    /// The client's name of the statement whose second Parse the server answers next (see
    /// [`Renamed`]).
    pub fn renamed_next(&self) -> Option<&Renamed> {
        match self.queue.front() {
            Some(Owed::Parse {
                renamed: Some(r), ..
            }) => Some(r),
            _ => None,
        }
    }

    /// Whether the message at the head of the queue is a Parse of the unnamed statement, and
    /// then whether it is the client's own.
    pub fn head_unnamed_parse(&self) -> Option<bool> {
        match self.queue.front() {
            Some(Owed::Parse {
                unnamed: true,
                client,
                ..
            }) => Some(*client),
            _ => None,
        }
    }

    /// Whether a Parse of the unnamed statement is still owed an answer.
    pub fn owes_any_unnamed_parse(&self) -> bool {
        self.queue
            .iter()
            .any(|o| matches!(o, Owed::Parse { unnamed: true, .. }))
    }

    /// The server skips what the client sends until Sync, after an error: nothing sent now
    /// is answered, and nothing pgward would answer itself may be answered either.
    pub fn skipping(&self) -> bool {
        self.skipping
    }

    /// Whether a refusal pgward raised in the client's batch (in a refused message's place)
    /// went out with no Sync sent behind it: the server fails there, and skips what the
    /// client sends until its Sync.
    pub fn raises_before_sync(&self) -> bool {
        self.raised
    }

    /// One of pgward's own statements failed inside the client's open batch: the server
    /// skips what the client sends until its Sync.
    pub fn own_error_in_batch(&mut self) {
        if self.batch_open {
            self.skipping = true;
        }
    }

    /// The server is receiving COPY data: Syncs the client sends now are ignored by it.
    pub fn copy_in(&self) -> bool {
        self.copy_in
    }

    /// The client sent CopyDone or CopyFail: the server leaves COPY FROM STDIN (or, if its
    /// CopyInResponse has not come yet, will leave it as soon as it enters).
    pub fn end_copy_in(&mut self) {
        if !self.copy_in {
            // The statement it ends is the last one sent, behind which only Syncs went.
            let syncs = self.queue.iter().rev();
            let syncs = syncs.take_while(|o| matches!(o, Owed::Sync)).count();
            let at = self.queue.len().checked_sub(syncs + 1);
            let starts = at.filter(|&i| matches!(self.queue[i], Owed::Execute | Owed::Query));
            if let Some(i) = starts {
                // One mark per statement (a client may send CopyDone after CopyDone), none
                // for statements answered already.
                let at = self.popped + i as u64;
                let popped = self.popped;
                self.copy_ends
                    .retain(|(marked, _)| *marked >= popped && *marked != at);
                self.copy_ends.push_back((at, syncs));
            }
        }
        self.copy_in = false;
    }

    /// Takes the owed message at the front of the queue.
    #[inline]
    fn pop_front(&mut self) -> Option<Owed> {
        let owed = self.queue.pop_front();
        if let Some(o) = &owed {
            self.requests -= usize::from(o.is_request());
            self.popped += 1;
            let head = self.popped;
            while self.works.front().is_some_and(|(at, _)| *at < head) {
                self.works.pop_front();
            }
        }
        owed
    }

    /// The request just pushed (an Execute or a Query) runs the statement `fingerprint`.
    pub fn mark_work(&mut self, fingerprint: Option<u64>) {
        let at = (self.popped + self.queue.len() as u64).checked_sub(1);
        let last = self.queue.back();
        if let (Some(at), Some(fp), Some(Owed::Execute | Owed::Query)) = (at, fingerprint, last) {
            self.works.push_back((at, fp));
        }
    }

    /// The statement the server runs now (or runs next: the oldest request not answered),
    /// if it was marked.
    pub fn running_work(&self) -> Option<u64> {
        // The oldest mark is the running request's unless a request before it is owed
        // (one with no mark: pgward's own, or one the gate did not read).
        let &(at, fingerprint) = self.works.front()?;
        let before = usize::try_from(at.checked_sub(self.popped)?).ok()?;
        let first = !self.queue.iter().take(before).any(Owed::is_request);
        first.then_some(fingerprint)
    }

    /// For the statement at the front, which starts COPY FROM STDIN now: how many of the
    /// Syncs behind it the client sent before it ended the copy, if it did already.
    fn copy_ended_early(&mut self) -> Option<usize> {
        let head = self.popped;
        // (Ends of statements answered otherwise, or a CopyDone sent after a failed COPY.)
        while self.copy_ends.front().is_some_and(|(at, _)| *at < head) {
            self.copy_ends.pop_front();
        }
        let (at, syncs) = *self.copy_ends.front()?;
        (at == head).then(|| {
            self.copy_ends.pop_front();
            syncs
        })
    }

    /// Nothing is owed and no batch is open: the server is between transactions or idle in
    /// one, and may be given back if its transaction status is idle.
    pub fn is_quiet(&self) -> bool {
        self.queue.is_empty() && !self.batch_open
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    pub fn batch_open(&self) -> bool {
        self.batch_open
    }

    /// ReadyForQuery messages still to come.
    pub fn pending_ready(&self) -> usize {
        self.syncs
    }

    /// Requests the server runs (Execute, a simple Query, a FunctionCall) not answered yet.
    pub fn requests_owed(&self) -> usize {
        self.requests
    }

    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Whether a Parse creating the client's statement `name` (sent, or answered by pgward
    /// at its turn), or a Close dropping it, in an earlier batch, closed by a Sync, is still
    /// owed an answer. Within one batch the question never arises: a second Parse of a name
    /// fails or is skipped, and so is a Parse behind a skipped Close.
    pub fn owes_parse_of(&self, name: &[u8]) -> bool {
        self.owes_before_a_sync(|o| o.creates(name) || o.reopens(name))
    }

    /// Whether a Parse of the unnamed statement in a batch closed by a Sync is still owed an
    /// answer (the Sync makes sure that it comes).
    pub fn owes_unnamed_parse(&self) -> bool {
        self.owes_before_a_sync(|o| matches!(o, Owed::Parse { unnamed: true, .. }))
    }

    /// Whether a message that `is` says is one of those wanted is owed, in a batch already
    /// closed by a Sync (so that its answer comes whatever the client sends next).
    fn owes_before_a_sync(&self, is: impl Fn(&Owed) -> bool) -> bool {
        self.queue
            .iter()
            .position(is)
            .is_some_and(|at| self.queue.iter().skip(at).any(|o| matches!(o, Owed::Sync)))
    }

    /// Whether a Parse still owed an answer creates the client's statement `name` (sent, or
    /// answered by pgward at its turn): it was sent after everything answered so far.
    pub fn owes_creation_of(&self, name: &[u8]) -> bool {
        self.queue.iter().any(|o| o.creates(name))
    }

    /// Whether an error now would answer a Bind or a Describe of a statement, the messages
    /// that find a prepared statement missing (an error in a statement's run may carry any
    /// SQLSTATE and words its SQL raises).
    pub fn statement_use_next(&self) -> bool {
        matches!(
            self.queue.front(),
            Some(Owed::Bind | Owed::DescribeStatement)
        )
    }

    /// Whether the head of the queue is an answer pgward gives itself.
    pub fn synthetic_next(&self) -> bool {
        matches!(self.queue.front(), Some(Owed::Synthetic { .. }))
    }

    /// The answer pgward owes the client now, if the head of the queue is one of its own:
    /// the bytes, and whether a ReadyForQuery must follow them.
    pub fn pop_synthetic(&mut self) -> Option<(Bytes, bool)> {
        if !matches!(self.queue.front(), Some(Owed::Synthetic { .. })) {
            return None;
        }
        match self.pop_front() {
            Some(Owed::Synthetic { answer, ready, .. }) => {
                if ready {
                    self.syncs -= 1;
                }
                Some((answer, ready))
            }
            _ => None,
        }
    }

    /// Matches one server message (by tag) to what is owed.
    pub fn on_message(&mut self, tag: u8) -> Result<(Route, Learned), Desync> {
        match tag {
            tag::PARSE_COMPLETE => self.complete_parse(),
            tag::BIND_COMPLETE => self.complete_bind(),
            tag::CLOSE_COMPLETE => self.complete_close(),
            tag::NO_DATA => self.complete_head(tag, "NoData", |o| {
                matches!(o, Owed::DescribeStatement | Owed::DescribePortal)
                    .then_some(Route::Forward)
            }),
            tag::ROW_DESCRIPTION => self.row_description(),
            tag::PARAMETER_DESCRIPTION => self.inside(tag, "ParameterDescription", |o| {
                matches!(o, Owed::DescribeStatement)
            }),
            tag::COMMAND_COMPLETE | tag::EMPTY_QUERY_RESPONSE | tag::PORTAL_SUSPENDED => {
                self.end_of_execute(tag)
            }
            tag::ERROR_RESPONSE => Ok(self.error()),
            tag::READY_FOR_QUERY => self.ready(),
            tag::COPY_IN_RESPONSE => self.start_copy_in(),
            tag::DATA_ROW
            | tag::COPY_OUT_RESPONSE
            | tag::COPY_BOTH_RESPONSE
            | tag::COPY_DATA
            | tag::COPY_DONE
            | tag::FUNCTION_CALL_RESPONSE => self.inside_execute(tag),
            // Notices, notifications, parameter changes and anything unknown: passed on.
            _ => Ok((Route::Forward, Learned::Nothing)),
        }
    }

    /// CopyInResponse: the server now ignores Sync until the copy ends, so the Syncs already
    /// sent behind the statement that started it will get no ReadyForQuery.
    fn start_copy_in(&mut self) -> Result<(Route, Learned), Desync> {
        if !matches!(self.queue.front(), Some(Owed::Execute | Owed::Query)) {
            return Err(Desync {
                tag: tag::COPY_IN_RESPONSE,
                expected: "CopyInResponse",
            });
        }
        // The Syncs sent right behind the statement (libpq sends one with the batch) will be
        // ignored; the batch stays open until the client's Sync after CopyDone.
        // If the client ended the copy already, only the Syncs sent before its end are.
        let extended = matches!(self.queue.front(), Some(Owed::Execute));
        let ended = self.copy_ended_early();
        let mut ignored = 0;
        while ended.is_none_or(|n| ignored < n) && matches!(self.queue.get(1), Some(Owed::Sync)) {
            self.queue.remove(1);
            ignored += 1;
        }
        self.syncs -= ignored;
        // What was behind the removed Syncs moved up.
        for (at, _) in &mut self.copy_ends {
            *at -= ignored as u64;
        }
        let head = self.popped;
        for (at, _) in self.works.iter_mut().filter(|(at, _)| *at > head) {
            *at -= ignored as u64;
        }
        if extended && self.queue.len() == 1 {
            self.batch_open = true;
        }
        self.copy_in = ended.is_none();
        Ok((Route::Forward, Learned::Nothing))
    }

    fn head_real(&self) -> Option<&Owed> {
        self.queue.front()
    }

    fn inside(
        &self,
        tag: u8,
        expected: &'static str,
        fits: impl Fn(&Owed) -> bool,
    ) -> Result<(Route, Learned), Desync> {
        match self.head_real() {
            Some(o) if fits(o) => Ok((Route::Forward, Learned::Nothing)),
            _ => Err(Desync { tag, expected }),
        }
    }

    /// Completes the head entry if `route_of` says how its answer is routed.
    fn complete_head(
        &mut self,
        tag: u8,
        expected: &'static str,
        route_of: impl Fn(&Owed) -> Option<Route>,
    ) -> Result<(Route, Learned), Desync> {
        let route = self
            .queue
            .front()
            .and_then(route_of)
            .ok_or(Desync { tag, expected })?;
        self.pop_front();
        Ok((route, Learned::Nothing))
    }

    fn complete_bind(&mut self) -> Result<(Route, Learned), Desync> {
        self.complete_head(tag::BIND_COMPLETE, "BindComplete", |o| match o {
            Owed::Bind => Some(Route::Forward),
            Owed::InternalBind => Some(Route::Swallow),
            _ => None,
        })
    }

    fn complete_parse(&mut self) -> Result<(Route, Learned), Desync> {
        let Some(Owed::Parse { client, .. }) = self.queue.front() else {
            return Err(Desync {
                tag: tag::PARSE_COMPLETE,
                expected: "ParseComplete",
            });
        };
        let route = visible(*client);
        let learned = match self.pop_front() {
            Some(Owed::Parse {
                defines: Some(definition),
                ..
            }) => Learned::Defined(definition),
            Some(Owed::Parse {
                statement: Some(name),
                ..
            }) => Learned::Prepared(name),
            _ => Learned::Nothing,
        };
        Ok((route, learned))
    }

    fn complete_close(&mut self) -> Result<(Route, Learned), Desync> {
        self.complete_head(tag::CLOSE_COMPLETE, "CloseComplete", |o| match o {
            Owed::Close { client, .. } => Some(visible(*client)),
            _ => None,
        })
    }

    fn row_description(&mut self) -> Result<(Route, Learned), Desync> {
        match self.queue.front() {
            Some(Owed::DescribeStatement | Owed::DescribePortal) => {
                self.pop_front();
                Ok((Route::Forward, Learned::Nothing))
            }
            Some(Owed::Query) => Ok((Route::Forward, Learned::Nothing)),
            _ => Err(Desync {
                tag: tag::ROW_DESCRIPTION,
                expected: "RowDescription",
            }),
        }
    }

    fn inside_execute(&self, tag: u8) -> Result<(Route, Learned), Desync> {
        match self.queue.front() {
            Some(Owed::Execute | Owed::Query) => Ok((Route::Forward, Learned::Nothing)),
            Some(Owed::InternalExecute) => Ok((Route::Swallow, Learned::Nothing)),
            _ => Err(Desync {
                tag,
                expected: "rows or COPY data",
            }),
        }
    }

    fn end_of_execute(&mut self, tag: u8) -> Result<(Route, Learned), Desync> {
        self.copy_in = false;
        match self.queue.front() {
            Some(Owed::Execute) => {
                self.pop_front();
                Ok((Route::Forward, Learned::Nothing))
            }
            Some(Owed::InternalExecute) => {
                self.pop_front();
                Ok((Route::Swallow, Learned::Nothing))
            }
            Some(Owed::Query) => Ok((Route::Forward, Learned::Nothing)),
            _ => Err(Desync {
                tag,
                expected: "the end of an Execute",
            }),
        }
    }

    /// An ErrorResponse: inside a simple Query it ends nothing; in the extended protocol it
    /// answers the head message and the server skips the rest up to Sync. An error with
    /// nothing owed at the head (a Sync whose commit failed) ends nothing either.
    fn error(&mut self) -> (Route, Learned) {
        self.copy_in = false;
        let mut server_statements = Vec::new();
        let mut client_statements = Vec::new();
        let mut still_prepared = Vec::new();
        let mut reopened: Vec<Reopen> = Vec::new();
        let mut unnamed_parse = false;
        let mut unnamed_skipped = Vec::new();
        if matches!(self.queue.front(), Some(Owed::Query)) {
            return (Route::Forward, Learned::Nothing);
        }
        if self.queue.is_empty() || matches!(self.queue.front(), Some(Owed::Sync)) {
            // An error at a Sync (a commit that failed) ends nothing.
            return (Route::Forward, Learned::Nothing);
        }
        // Everything up to the next Sync is skipped, a simple Query included: the server
        // answers nothing for it, not even ReadyForQuery.
        // The first is the one that failed; the server skips the rest.
        let mut failed = true;
        while let Some(head) = self.queue.front() {
            if matches!(head, Owed::Sync) {
                break;
            }
            let skipped = self.pop_front();
            if skipped.as_ref().is_some_and(Owed::owes_ready) {
                self.syncs -= 1;
            }
            let was_failed = std::mem::take(&mut failed);
            match skipped {
                Some(Owed::Parse {
                    statement,
                    client_name,
                    unnamed,
                    defines,
                    ..
                }) => {
                    unnamed_parse |= unnamed;
                    if let (false, Some(d)) = (was_failed, defines) {
                        // (Only the client's Parses define anything for the gate.)
                        if d.name.is_empty() {
                            unnamed_skipped.push(d.seq);
                        }
                    }
                    server_statements.extend(statement);
                    client_statements.extend(client_name);
                }
                Some(Owed::Synthetic {
                    client_name,
                    reopens,
                    ..
                }) => {
                    client_statements.extend(client_name);
                    // Only the first skipped message touching a name says what it was: a
                    // Parse of it (which creates only a name that is free) or a Close.
                    if let Some(r) = reopens {
                        let touched = client_statements.iter().any(|n| n == &r.name)
                            || reopened.iter().any(|o| o.name == r.name);
                        if !touched {
                            reopened.push(*r);
                        }
                    }
                }
                Some(Owed::Close {
                    statement: Some(name),
                    ..
                }) => still_prepared.push(name),
                _ => {}
            }
        }
        if self.queue.is_empty() {
            // No Sync was sent yet: the server goes on skipping until the client's.
            self.skipping = true;
        }
        if server_statements.is_empty()
            && client_statements.is_empty()
            && still_prepared.is_empty()
            && reopened.is_empty()
            && !unnamed_parse
            && unnamed_skipped.is_empty()
        {
            return (Route::Forward, Learned::Nothing);
        }
        (
            Route::Forward,
            Learned::Skipped(Box::new(Skipped {
                server_statements,
                client_statements,
                still_prepared,
                reopened,
                unnamed_parse,
                unnamed_skipped,
            })),
        )
    }

    fn ready(&mut self) -> Result<(Route, Learned), Desync> {
        match self.queue.front() {
            Some(o) if o.ends_with_ready() => {
                self.pop_front();
                self.syncs -= 1;
                Ok((Route::Forward, Learned::Ready))
            }
            _ => Err(Desync {
                tag: tag::READY_FOR_QUERY,
                expected: "ReadyForQuery",
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse() -> Owed {
        Owed::Parse {
            client: true,
            statement: None,
            client_name: None,
            defines: None,
            unnamed: true,
            renamed: None,
        }
    }

    fn named_parse(server: &'static str, client: Option<&'static str>, visible: bool) -> Owed {
        Owed::Parse {
            client: visible,
            statement: Some(Bytes::from_static(server.as_bytes())),
            client_name: client.map(|c| Bytes::from_static(c.as_bytes())),
            defines: None,
            unnamed: false,
            renamed: None,
        }
    }

    fn feed(q: &mut Expected, tags: &[u8]) -> Vec<(Route, Learned)> {
        tags.iter()
            .map(|t| q.on_message(*t).unwrap_or_else(|e| panic!("{e}")))
            .collect()
    }

    fn batch(q: &mut Expected) {
        for o in [
            parse(),
            Owed::Bind,
            Owed::DescribePortal,
            Owed::Execute,
            Owed::Sync,
        ] {
            q.push(o);
        }
    }

    #[test]
    fn simple_query_ends_at_ready() {
        let mut q = Expected::default();
        q.push(Owed::Query);
        assert_eq!(q.pending_ready(), 1);
        feed(&mut q, b"TDDCTDC");
        assert!(!q.is_quiet());
        let last = feed(&mut q, b"Z");
        assert_eq!(last[0].1, Learned::Ready);
        assert!(q.is_quiet());
        assert_eq!(q.pending_ready(), 0);
    }

    #[test]
    fn the_running_work_is_the_oldest_request_not_answered() {
        let mut q = Expected::default();
        q.push(Owed::Query);
        q.mark_work(Some(1));
        q.push(Owed::Parse {
            client: true,
            statement: None,
            client_name: None,
            defines: None,
            unnamed: true,
            renamed: None,
        });
        q.push(Owed::Bind);
        q.push(Owed::Execute);
        q.mark_work(Some(2));
        q.push(Owed::Bind);
        q.push(Owed::Execute);
        q.mark_work(None);
        q.push(Owed::Sync);
        assert_eq!(q.running_work(), Some(1));
        assert_eq!(q.requests_owed(), 3);
        feed(&mut q, b"TDC");
        assert_eq!(q.running_work(), Some(1), "until its ReadyForQuery");
        assert_eq!(q.requests_owed(), 3);
        feed(&mut q, b"Z12");
        assert_eq!(q.running_work(), Some(2));
        assert_eq!(q.requests_owed(), 2);
        feed(&mut q, b"DC");
        assert_eq!(q.running_work(), None, "an Execute the gate did not read");
        feed(&mut q, b"2CZ");
        assert_eq!(q.running_work(), None);
        assert!(q.works.is_empty());
        assert_eq!(q.requests_owed(), 0);
        // pgward's own request ahead of a marked one runs first.
        q.push(Owed::InternalExecute);
        q.push(Owed::Execute);
        q.mark_work(Some(5));
        assert_eq!(q.running_work(), None);
        feed(&mut q, b"C");
        assert_eq!(q.running_work(), Some(5));
    }

    #[test]
    fn error_inside_a_query_waits_for_its_ready() {
        let mut q = Expected::default();
        q.push(Owed::Query);
        q.push(Owed::Query);
        feed(&mut q, b"CE");
        assert_eq!(q.len(), 2, "the error ends neither query");
        feed(&mut q, b"ZTDCZ");
        assert!(q.is_quiet());
    }

    #[test]
    fn extended_batch_is_matched_in_order() {
        let mut q = Expected::default();
        batch(&mut q);
        assert!(!q.batch_open(), "Sync closed the batch");
        feed(&mut q, b"12TDDC");
        assert_eq!(q.len(), 1);
        feed(&mut q, b"Z");
        assert!(q.is_quiet());
    }

    #[test]
    fn many_batches_in_flight() {
        let mut q = Expected::default();
        for _ in 0..3 {
            batch(&mut q);
        }
        assert_eq!(q.pending_ready(), 3);
        feed(&mut q, b"12nCZ12TDCZ");
        assert_eq!(q.pending_ready(), 1);
        feed(&mut q, b"12nIZ");
        assert!(q.is_quiet());
    }

    #[test]
    fn error_mid_batch_drops_what_the_server_skips() {
        let mut q = Expected::default();
        q.push(parse());
        q.push(Owed::Bind);
        q.push(Owed::Execute);
        q.push(named_parse("s2", Some("c2"), true));
        q.push(Owed::Bind);
        q.push(Owed::Execute);
        q.push(Owed::Sync);
        q.push(parse());
        q.push(Owed::Sync);
        feed(&mut q, b"12");
        let r = feed(&mut q, b"E");
        assert_eq!(
            r[0],
            (
                Route::Forward,
                Learned::Skipped(Box::new(Skipped {
                    server_statements: vec![Bytes::from_static(b"s2")],
                    client_statements: vec![Bytes::from_static(b"c2")],
                    still_prepared: vec![],
                    reopened: vec![],
                    unnamed_parse: false,
                    unnamed_skipped: vec![],
                }))
            )
        );
        assert_eq!(q.len(), 3, "only the Sync and the next batch remain");
        feed(&mut q, b"Z1Z");
        assert!(q.is_quiet());
    }

    #[test]
    fn the_clients_parses_of_the_unnamed_statement_skipped_after_an_error_are_listed() {
        let unnamed = |seq: u64| Owed::Parse {
            client: true,
            statement: None,
            client_name: None,
            defines: Some(Arc::new(Definition {
                name: Bytes::new(),
                parsed: Arc::new(crate::wire::Parsed::new(
                    Bytes::from_static(b"SELECT 1"),
                    Bytes::from_static(b"\0\0"),
                )),
                seq,
            })),
            unnamed: true,
            renamed: None,
        };
        let mut q = Expected::default();
        // The first fails (it dropped the statement); the server skips the next two.
        q.push(unnamed(1));
        q.push(unnamed(2));
        q.push(Owed::Bind);
        q.push(unnamed(3));
        q.push(Owed::Sync);
        let r = feed(&mut q, b"E");
        let Learned::Skipped(skipped) = &r[0].1 else {
            panic!("{r:?}");
        };
        assert_eq!(skipped.unnamed_skipped, vec![2, 3]);
        assert!(skipped.unnamed_parse);
    }

    #[test]
    fn a_query_sent_while_skipping_gets_no_answer() {
        let mut q = Expected::default();
        q.push(Owed::Execute);
        q.push(Owed::Query);
        q.push(Owed::Sync);
        assert_eq!(q.pending_ready(), 2);
        feed(&mut q, b"E");
        assert_eq!(
            q.pending_ready(),
            1,
            "the skipped Query owes no ReadyForQuery"
        );
        feed(&mut q, b"Z");
        assert!(q.is_quiet());
    }

    #[test]
    fn a_failed_parse_is_reported_missing() {
        let mut q = Expected::default();
        q.push(named_parse("pgw_1", None, false));
        q.push(Owed::Bind);
        q.push(Owed::Sync);
        let r = feed(&mut q, b"E");
        assert_eq!(
            r[0].1,
            Learned::Skipped(Box::new(Skipped {
                server_statements: vec![Bytes::from_static(b"pgw_1")],
                client_statements: vec![],
                still_prepared: vec![],
                reopened: vec![],
                unnamed_parse: false,
                unnamed_skipped: vec![],
            }))
        );
        feed(&mut q, b"Z");
        assert!(q.is_quiet());
    }

    #[test]
    fn error_at_sync_is_answered_before_ready() {
        let mut q = Expected::default();
        q.push(Owed::Execute);
        q.push(Owed::Sync);
        feed(&mut q, b"C");
        assert_eq!(feed(&mut q, b"E")[0], (Route::Forward, Learned::Nothing));
        assert_eq!(q.len(), 1);
        feed(&mut q, b"Z");
        assert!(q.is_quiet());
    }

    #[test]
    fn parse_holds_the_batch_open_until_sync() {
        let mut q = Expected::default();
        q.push(parse());
        feed(&mut q, b"1");
        assert!(q.is_empty());
        assert!(!q.is_quiet(), "no Sync yet: the server is inside the batch");
        q.push(Owed::Sync);
        feed(&mut q, b"Z");
        assert!(q.is_quiet());
    }

    #[test]
    fn internal_messages_are_swallowed() {
        let mut q = Expected::default();
        q.push(Owed::Close {
            client: false,
            statement: None,
        });
        q.push(named_parse("pgw_2", None, false));
        q.push(Owed::Bind);
        q.push(Owed::Sync);
        let routes: Vec<Route> = feed(&mut q, b"312Z").into_iter().map(|r| r.0).collect();
        assert_eq!(
            routes,
            vec![
                Route::Swallow,
                Route::Swallow,
                Route::Forward,
                Route::Forward
            ]
        );
    }

    /// What a refusal raised in the client's batch owes: pgward's Parse, Bind and Execute.
    fn push_raise(q: &mut Expected) {
        q.push(Owed::Parse {
            client: false,
            statement: None,
            client_name: None,
            defines: None,
            unnamed: true,
            renamed: None,
        });
        q.push(Owed::InternalBind);
        q.push(Owed::InternalExecute);
    }

    #[test]
    fn a_refusal_raised_in_a_batch_answers_the_refused_parse() {
        let mut q = Expected::default();
        q.push(Owed::Bind);
        q.push(Owed::Execute);
        push_raise(&mut q);
        q.push(Owed::Bind);
        q.push(Owed::Execute);
        q.push(Owed::Sync);
        let routes: Vec<Route> = feed(&mut q, b"2C12E").into_iter().map(|r| r.0).collect();
        assert_eq!(
            routes,
            vec![
                Route::Forward,
                Route::Forward,
                Route::Swallow,
                Route::Swallow,
                Route::Forward
            ]
        );
        assert_eq!(
            q.len(),
            1,
            "the client's messages after the refusal are skipped"
        );
        feed(&mut q, b"Z");
        assert!(q.is_quiet());
    }

    /// A refusal raised in the batch fails it until the Sync sent behind it, answered or not.
    #[test]
    fn a_raised_refusal_is_known_to_fail_its_batch_up_to_its_sync() {
        let mut q = Expected::default();
        q.push(Owed::Bind);
        q.push(Owed::Execute);
        assert!(!q.raises_before_sync());
        push_raise(&mut q);
        q.push(Owed::Bind);
        assert!(
            q.raises_before_sync(),
            "owed, the rest of the batch behind it"
        );
        q.push(Owed::Sync);
        assert!(!q.raises_before_sync(), "a Sync went out behind it");
        q.push(Owed::Bind);
        assert!(!q.raises_before_sync(), "a later batch");
    }

    #[test]
    fn synthetic_answers_come_out_at_their_turn() {
        let mut q = Expected::default();
        let answer = Bytes::from_static(b"1\0\0\0\x04");
        q.push(Owed::Synthetic {
            answer: answer.clone(),
            client_name: None,
            ready: false,
            batch: true,
            reopens: None,
        });
        assert_eq!(q.pop_synthetic(), Some((answer.clone(), false)));
        q.push(Owed::Bind);
        q.push(Owed::Synthetic {
            answer: answer.clone(),
            client_name: None,
            ready: false,
            batch: true,
            reopens: None,
        });
        q.push(Owed::Sync);
        assert_eq!(q.pop_synthetic(), None, "not its turn yet");
        feed(&mut q, b"2");
        assert_eq!(q.pop_synthetic(), Some((answer.clone(), false)));
        feed(&mut q, b"Z");
        assert!(q.is_quiet());
        q.push(Owed::Synthetic {
            answer: answer.clone(),
            client_name: None,
            ready: true,
            batch: false,
            reopens: None,
        });
        assert_eq!(q.pending_ready(), 1);
        assert_eq!(q.pop_synthetic(), Some((answer, true)));
        assert_eq!(q.pending_ready(), 0);
        assert!(q.is_quiet());
    }

    #[test]
    fn skipped_synthetic_parse_undoes_the_client_statement() {
        let mut q = Expected::default();
        q.push(Owed::Bind);
        q.push(Owed::Synthetic {
            answer: Bytes::from_static(b"x"),
            client_name: Some(Bytes::from_static(b"c1")),
            ready: false,
            batch: true,
            reopens: None,
        });
        q.push(Owed::Sync);
        let r = feed(&mut q, b"E");
        assert_eq!(
            r[0].1,
            Learned::Skipped(Box::new(Skipped {
                server_statements: vec![],
                client_statements: vec![Bytes::from_static(b"c1")],
                still_prepared: vec![],
                reopened: vec![],
                unnamed_parse: false,
                unnamed_skipped: vec![],
            }))
        );
    }

    #[test]
    fn describe_statement_and_portal() {
        let mut q = Expected::default();
        q.push(Owed::DescribeStatement);
        q.push(Owed::DescribeStatement);
        q.push(Owed::DescribePortal);
        q.push(Owed::Sync);
        feed(&mut q, b"tTtnnZ");
        assert!(q.is_quiet());
    }

    #[test]
    fn copy_and_suspended_portals() {
        let mut q = Expected::default();
        q.push(Owed::Query);
        feed(&mut q, b"GCZ");
        assert!(!q.copy_in());
        q.push(Owed::Query);
        feed(&mut q, b"HddcCZ");
        q.push(Owed::Execute);
        q.push(Owed::Execute);
        q.push(Owed::Sync);
        feed(&mut q, b"DDsDCZ");
        assert!(q.is_quiet());
    }

    #[test]
    fn extended_copy_in_ignores_the_sync_sent_with_it() {
        let mut q = Expected::default();
        batch(&mut q);
        feed(&mut q, b"12n");
        assert_eq!(q.pending_ready(), 1);
        feed(&mut q, b"G");
        assert!(q.copy_in());
        assert_eq!(
            q.pending_ready(),
            0,
            "the Sync sent with the batch is ignored by COPY"
        );
        q.end_copy_in();
        q.push(Owed::Sync);
        feed(&mut q, b"CZ");
        assert!(q.is_quiet());
    }

    #[test]
    fn a_copy_ended_before_the_server_began_it_answers_the_sync_sent_after_its_end() {
        let mut q = Expected::default();
        batch(&mut q);
        q.end_copy_in();
        q.push(Owed::Sync);
        feed(&mut q, b"12nG");
        assert!(!q.copy_in(), "the client ended it already");
        assert_eq!(q.pending_ready(), 1, "the Sync behind its end is answered");
        feed(&mut q, b"CZ");
        assert!(q.is_quiet());
    }

    #[test]
    fn a_copy_ended_early_behind_other_statements_is_the_copy_s() {
        // SELECT, then COPY with its data, CopyDone and a second Sync, in one batch.
        let mut q = Expected::default();
        for o in [
            parse(),
            Owed::Bind,
            Owed::Execute,
            parse(),
            Owed::Bind,
            Owed::Execute,
        ] {
            q.push(o);
        }
        q.push(Owed::Sync);
        q.end_copy_in();
        q.push(Owed::Sync);
        feed(&mut q, b"12DC12G");
        assert!(!q.copy_in());
        assert_eq!(q.pending_ready(), 1);
        feed(&mut q, b"CZ");
        assert!(q.is_quiet());
    }

    #[test]
    fn copydones_for_one_statement_mark_it_once() {
        let mut q = Expected::default();
        q.push(Owed::Query);
        for _ in 0..1000 {
            q.end_copy_in();
        }
        assert_eq!(q.copy_ends.len(), 1);
        feed(&mut q, b"CZ");
        q.push(Owed::Query);
        q.end_copy_in();
        assert_eq!(
            q.copy_ends.len(),
            1,
            "the answered statement's mark is gone"
        );
    }

    #[test]
    fn a_copydone_after_a_failed_copy_ends_no_later_copy() {
        let mut q = Expected::default();
        q.push(Owed::Query);
        feed(&mut q, b"GEZ");
        // The client still streamed when the COPY failed: its CopyDone comes after.
        q.end_copy_in();
        batch(&mut q);
        feed(&mut q, b"12nG");
        assert!(q.copy_in(), "the next COPY runs until its own end");
        assert_eq!(q.pending_ready(), 0);
        q.end_copy_in();
        q.push(Owed::Sync);
        feed(&mut q, b"CZ");
        assert!(q.is_quiet());
    }

    #[test]
    fn extended_copy_in_keeps_the_batch_until_the_clients_sync() {
        let mut q = Expected::default();
        q.push(Owed::Execute);
        q.push(Owed::Sync);
        feed(&mut q, b"G");
        feed(&mut q, b"C");
        assert!(q.is_empty());
        assert!(
            !q.is_quiet(),
            "the COPY's transaction ends only at the client's Sync"
        );
        q.end_copy_in();
        q.push(Owed::Sync);
        feed(&mut q, b"Z");
        assert!(q.is_quiet());
    }

    #[test]
    fn an_error_before_any_sync_keeps_the_server_skipping() {
        let mut q = Expected::default();
        q.push(parse());
        let r = feed(&mut q, b"E");
        // The client's unnamed Parse failed: its unnamed statement is gone.
        assert!(matches!(&r[0].1, Learned::Skipped(s) if s.unnamed_parse));
        assert!(q.skipping());
        assert!(!q.is_quiet());
        q.push(Owed::Sync);
        assert!(!q.skipping());
        feed(&mut q, b"Z");
        assert!(q.is_quiet());
    }

    #[test]
    fn a_skipped_eviction_leaves_the_statement_prepared() {
        let mut q = Expected::default();
        q.push(parse());
        q.push(Owed::Close {
            client: false,
            statement: Some(Bytes::from_static(b"pgw_old")),
        });
        q.push(Owed::Sync);
        let r = feed(&mut q, b"E");
        assert_eq!(
            r[0].1,
            Learned::Skipped(Box::new(Skipped {
                server_statements: vec![],
                client_statements: vec![],
                still_prepared: vec![Bytes::from_static(b"pgw_old")],
                reopened: vec![],
                unnamed_parse: true,
                unnamed_skipped: vec![],
            }))
        );
    }

    #[test]
    fn copy_in_that_fails_ends_the_copy() {
        let mut q = Expected::default();
        q.push(Owed::Execute);
        q.push(Owed::Sync);
        feed(&mut q, b"G");
        feed(&mut q, b"E");
        assert!(!q.copy_in());
        assert!(q.is_empty());
        q.push(Owed::Sync);
        feed(&mut q, b"Z");
        assert!(q.is_quiet());
        q.push(Owed::Query);
        feed(&mut q, b"GEZ");
        assert!(q.is_quiet() && !q.copy_in());
    }

    #[test]
    fn a_parse_is_owed_only_for_a_closed_batch() {
        let mut q = Expected::default();
        q.push(named_parse("pgw_a", Some("a"), true));
        assert!(!q.owes_parse_of(b"a"), "same batch: no Sync yet");
        q.push(Owed::Sync);
        assert!(q.owes_parse_of(b"a"));
        assert!(!q.owes_parse_of(b"b"));
        feed(&mut q, b"1Z");
        assert!(!q.owes_parse_of(b"a"));
    }

    #[test]
    fn async_messages_complete_nothing() {
        let mut q = Expected::default();
        assert_eq!(
            q.on_message(tag::NOTICE_RESPONSE),
            Ok((Route::Forward, Learned::Nothing))
        );
        assert_eq!(
            q.on_message(tag::NOTIFICATION_RESPONSE),
            Ok((Route::Forward, Learned::Nothing))
        );
        assert_eq!(
            q.on_message(tag::PARAMETER_STATUS),
            Ok((Route::Forward, Learned::Nothing))
        );
        assert!(q.is_quiet());
    }

    #[test]
    fn unexpected_answers_are_a_desync() {
        let mut q = Expected::default();
        for tag in *b"123nTtCIsZDGH" {
            assert!(
                q.on_message(tag).is_err(),
                "{} with nothing owed",
                char::from(tag)
            );
        }
        q.push(Owed::Bind);
        assert!(q.on_message(tag::PARSE_COMPLETE).is_err());
        assert!(q.on_message(tag::COMMAND_COMPLETE).is_err());
    }
}
