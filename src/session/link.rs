//! The session's server link: the server it has checked out and where the conversation with
//! it stands (what the server still owes, since when, the transaction's start).

use std::time::Instant;

use bytes::BytesMut;

use crate::pool::ServerGuard;
use crate::server::Expected;
use crate::wire;

/// What an answer leaves on a server that the statement map and the parameters do not follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mark {
    Nothing,
    /// An error: to pgward's DEALLOCATE ALL or DISCARD ALL, it leaves the server's statements
    /// unknown (the server is closed).
    Error,
    /// A RESET: the value it left is read back when the server goes back.
    Reset,
    /// A statement prepared by SQL, its session's alone on PostgreSQL: a shared server that
    /// holds one is closed when given back, so no other client can EXECUTE or Bind it.
    Prepare,
    /// A cursor declared: one declared WITH HOLD outlives its transaction, so a shared
    /// server's cursors are closed before it goes back (no other client can FETCH from one).
    Cursor,
}

impl Mark {
    pub fn of(tag: u8, body: &[u8]) -> Mark {
        use wire::backend::tag;
        match (tag, body) {
            (tag::ERROR_RESPONSE, _) => Mark::Error,
            (tag::COMMAND_COMPLETE, b"RESET\0") => Mark::Reset,
            (tag::COMMAND_COMPLETE, b"PREPARE\0") => Mark::Prepare,
            (tag::COMMAND_COMPLETE, b"DECLARE CURSOR\0") => Mark::Cursor,
            _ => Mark::Nothing,
        }
    }
}

/// A server checked out by this client, and where the conversation with it stands.
pub struct Link {
    pub server: ServerGuard,
    /// Every answer the server still owes, in order.
    pub expected: Expected,
    /// When the oldest request still owed an answer was sent.
    pub busy_since: Option<Instant>,
    /// When the last ReadyForQuery arrived.
    pub ready_since: Instant,
    /// When the transaction in progress began (the request that opened it was sent).
    pub tx_since: Option<Instant>,
    /// When the batch open on the server (its Sync not sent) became the server's work, every
    /// earlier one answered: a transaction the client holds while it sends no Sync (see
    /// [`Link::note_batch`]).
    pub batch_since: Option<Instant>,
    /// A DEALLOCATE ALL or DISCARD ALL was sent and not yet answered.
    pub reset_sent: bool,
    /// The server's unnamed statement is one this client parsed on this link (or will be,
    /// once the Parse of it in the open batch runs: a message behind it in the batch is
    /// skipped with it).
    pub unnamed_ours: bool,
    /// Whose the server's unnamed statement is, by the answers read so far: the client's
    /// after the ParseComplete of its Parse of it; not after one of pgward's own or a Parse
    /// that failed; as it was after a Parse the server skipped. Once no Parse of it is owed,
    /// `unnamed_ours` is this.
    pub unnamed_answered: bool,
    /// The client parsed the unnamed statement in the open batch (since its last Sync).
    pub unnamed_in_batch: bool,
    /// A batch that parsed the unnamed statement ended (a Sync went out) and may not be
    /// answered yet: until it is, whether the server skipped that Parse is not known.
    pub unnamed_unsettled: bool,
    /// The client sent a text naming a setting PostgreSQL never reports: what the server
    /// holds is read when the server is given back (see [`Link::note_unreported`]).
    pub unreported_named: bool,
    /// The server goes back to the pool for other clients after each transaction
    /// (transaction and statement pooling).
    pub shared: bool,
    /// The client declared a cursor on this shared server (see [`Mark::Cursor`]).
    pub cursor_declared: bool,
}

impl Link {
    /// A client text that names a setting PostgreSQL never reports goes to this server: its
    /// value there is unknown from now on (so whoever gets the server next has theirs set,
    /// whatever happens to this client), until pgward reads it back.
    pub fn note_unreported(&mut self) {
        self.unreported_named = true;
        self.server.params.forget_unreported();
    }

    /// What an answer leaves on the server beyond what the statement map and the parameters
    /// follow, whoever read it (the relay, or the drain after a Terminate): see [`Mark`].
    pub fn note_answer(&mut self, mark: Mark) {
        match mark {
            Mark::Error if self.reset_sent => self.server.poison(),
            Mark::Reset => self.unreported_named = true,
            Mark::Prepare if self.shared => self.server.reusable = false,
            Mark::Cursor if self.shared => self.cursor_declared = true,
            _ => {}
        }
    }

    /// Follows the batch open on the server, after messages went out or a ReadyForQuery
    /// came (`now`): from the moment it is the server's work (no earlier batch's
    /// ReadyForQuery still to come) until its Sync goes out. A COPY FROM STDIN inside it is
    /// one statement's run, not counted.
    pub fn note_batch(&mut self, now: Instant) {
        let open = self.expected.batch_open() && !self.expected.copy_in();
        self.batch_since = match open && self.expected.pending_ready() == 0 {
            true => self.batch_since.or(Some(now)),
            false if open => self.batch_since,
            false => None,
        };
    }

    /// Nothing owed, nothing buffered, no batch open.
    pub fn quiet(&self, to_server: &BytesMut) -> bool {
        self.expected.is_quiet() && to_server.is_empty() && self.server.rbuf.is_empty()
    }

    /// Whether the Bind or Describe in `tag`, `body` uses the unnamed statement while the
    /// Parse of it, sent in an earlier batch, is still owed an answer: if the server skips
    /// that Parse, it keeps the unnamed statement it had, which may be another client's.
    /// (One in the same batch as its Parse needs no wait: it is skipped with it.)
    pub fn waits_for_unnamed(&mut self, tag: u8, body: &[u8]) -> bool {
        if !self.unnamed_unsettled || self.unnamed_in_batch {
            return false;
        }
        if !super::views::uses_unnamed(tag, body) {
            return false;
        }
        if self.expected.owes_unnamed_parse() {
            return true;
        }
        self.unnamed_unsettled = false;
        false
    }

    /// Whether the Bind or Describe in `tag`, `body` uses a named statement of the client's
    /// that a message in an earlier batch, not answered yet, creates or drops (see
    /// [`Expected::waits_for_name`]).
    pub fn waits_for_named(&mut self, tag: u8, body: &[u8]) -> bool {
        if !self.expected.names_changing() {
            return false;
        }
        super::views::named_statement(tag, body).is_some_and(|n| self.expected.waits_for_name(n))
    }

    /// What the server's answer `tag` to the head of the queue, read now, says of whose its
    /// unnamed statement is; `head` is [`Expected::head_unnamed_parse`] before it was read.
    pub fn learn_unnamed(&mut self, tag: u8, head: Option<bool>, skipped_unnamed: bool) {
        match (tag, head) {
            (wire::backend::tag::PARSE_COMPLETE, Some(client)) => self.unnamed_answered = client,
            (wire::backend::tag::ERROR_RESPONSE, Some(_)) => self.unnamed_answered = false,
            _ if !skipped_unnamed => return,
            _ => {}
        }
        if !self.expected.owes_any_unnamed_parse() {
            self.unnamed_ours = self.unnamed_answered;
        }
    }

    /// Whether the Parse in `body` names a statement whose creating Parse the server has
    /// not answered yet.
    pub fn waits_for_parse(&self, body: &[u8]) -> bool {
        let name = body.split(|b| *b == 0).next().unwrap_or_default();
        !name.is_empty() && self.expected.owes_parse_of(name)
    }

    /// Sends the answers pgward owes the client that are now at the head of the queue.
    pub fn emit_synthetic(&mut self, out: &mut BytesMut) {
        while let Some((answer, ready)) = self.expected.pop_synthetic() {
            out.extend_from_slice(&answer);
            if ready {
                wire::encode_ready_for_query(out, self.server.tx);
            }
        }
    }
}
