//! The session loop: relays a logged-in client's messages to a server checked out from its
//! pool, and hands the server back as soon as the pool mode allows.
//!
//! One task drives both directions with bounded buffers, so a slow reader on either side
//! slows the other (backpressure) and neither side's writes can deadlock the other's.

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use arc_swap::{ArcSwap, Cache};
use bytes::{Buf, BytesMut};
use tokio_util::io::{poll_read_buf, poll_write_buf};

mod admit;
mod link;
mod messages;
mod prepared;
mod readings;
pub mod replication;
mod rules;
mod views;

pub use rules::Peer;

use crate::cancel::{CancelTarget, ClientHandle};
use crate::client::{ClientIo, SessionError, CLOSE_GRACE};
use crate::config::{Config, PoolMode};
use crate::gate::Ticket;
use crate::ops::{Checkout, SessionHooks, Waiting};
use crate::params::{self, ParamSet, Tracked};
use crate::policy::Governance;
use crate::pool::{Pool, ServerGuard, Taken};
use crate::runtime::Runtime;
use crate::server::{Expected, OwnStatement, Route, ServerError};
use crate::wire::{self, backend, frontend, sqlstate, ErrorResponse, FrameSpan, TxStatus};
use admit::SlotAfter;
use link::Link;
use messages::{learn, lost_own_statement, server_message, ClientSide, MessageContext};
use prepared::ClientStatements;
use rules::{RuleCheck, RuleState};

/// Statements each server holds for mapping when max_prepared_statements is 0 but a policy
/// is in force (PgBouncer's default for the setting).
const DEFAULT_MAX_PREPARED: usize = 200;

/// Bytes buffered towards one side before pgward stops reading from the other.
const HIGH_WATER: usize = 256 * 1024;
/// Answers owed past which the client is not read until some come (what pgward answers by
/// itself queues behind an answer the server has not sent yet). A batch still open when the
/// bound is passed is flushed on the server, whose output buffer may hold the answers.
const MAX_OWED: usize = 65_536;

/// The client-side time limits, from the settings.
#[derive(Debug, Clone, Copy, Default)]
pub struct Timeouts {
    pub query: Option<Duration>,
    pub client_idle: Option<Duration>,
    pub idle_transaction: Option<Duration>,
    pub transaction: Option<Duration>,
}

impl Timeouts {
    /// The limits of a client logged in as `login_user` whose servers log in as
    /// `server_user`: a `[users]` entry's positive value wins over the global one, as in
    /// PgBouncer, which reads client_idle_timeout from the client's user and the limits on
    /// work at the server from the server's (they differ where `[databases]` forces a user).
    pub fn for_login(config: &Config, login_user: &str, server_user: &str) -> Self {
        let s = &config.settings;
        let server = config.user(server_user);
        let own = |pick: fn(&crate::config::UserDef) -> Option<Duration>| server.and_then(pick);
        Timeouts {
            query: own(|u| u.query_timeout).or(s.query_timeout),
            client_idle: config
                .user(login_user)
                .and_then(|u| u.client_idle_timeout)
                .or(s.client_idle_timeout),
            idle_transaction: own(|u| u.idle_transaction_timeout).or(s.idle_transaction_timeout),
            transaction: own(|u| u.transaction_timeout).or(s.transaction_timeout),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Timer {
    /// The tenant's statement timeout: the request is cancelled, the session goes on.
    TenantStatement,
    Query,
    IdleTransaction,
    Transaction,
    ClientIdle,
}

impl Timer {
    fn error(self) -> ErrorResponse {
        let (code, msg) = match self {
            // PgBouncer's words; PostgreSQL's SQLSTATEs.
            Timer::TenantStatement | Timer::Query => (sqlstate::QUERY_CANCELED, "query timeout"),
            Timer::IdleTransaction => (
                sqlstate::IDLE_IN_TRANSACTION_TIMEOUT,
                "idle transaction timeout",
            ),
            Timer::Transaction => (sqlstate::TRANSACTION_TIMEOUT, "transaction timeout"),
            Timer::ClientIdle => (sqlstate::IDLE_SESSION_TIMEOUT, "client_idle_timeout"),
        };
        ErrorResponse::fatal(code, msg.to_string())
    }
}

enum Event {
    ClientData,
    ClientClosed,
    ServerData,
    ServerClosed,
    /// Everything queued for the server was written.
    ServerDrained,
    Timer(Timer),
}

/// A run of complete client messages.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct ClientChunk {
    /// Bytes of whole messages to forward.
    len: usize,
    /// Whether any of them asks the server for something (all but COPY messages do).
    asks: bool,
    terminate: bool,
}

impl ClientChunk {
    fn asks_nothing(&self) -> bool {
        !self.asks
    }
}

/// The configuration as last seen, re-read only when a reload or a console SET replaced it.
type ConfigCache = Cache<Arc<ArcSwap<Config>>, Arc<Config>>;
/// The policy in force (if any), re-read only when a reload replaced it.
type GovernanceCache = Cache<Arc<ArcSwap<Option<Arc<Governance>>>>, Arc<Option<Arc<Governance>>>>;

pub struct Session {
    id: u64,
    /// `disable_pqexec`: a simple Query ends the session (FATAL 08P01 `PQexec disallowed`),
    /// as in PgBouncer, where the setting is read at startup.
    pqexec_disallowed: bool,
    rt: Arc<Runtime>,
    config: ConfigCache,
    governance: GovernanceCache,
    /// The role the client logged in as, and from where.
    user: String,
    /// That role and the pool's database, as the gate and the plan cache key them.
    role_name: Arc<str>,
    database_name: Arc<str>,
    peer: rules::Peer,
    rule_state: RuleState,
    pool: Arc<Pool>,
    /// The pool as the gate counts it: `database/user`.
    pool_label: String,
    mode: PoolMode,
    handle: Arc<ClientHandle>,
    params: ParamSet,
    tracked: Arc<Tracked>,
    timeouts: Timeouts,
    link: Option<Link>,
    /// Protocol-level prepared statements, when pgward maps them (transaction and statement
    /// pooling with max_prepared_statements above 0): the client's names, and how many each
    /// server may hold.
    statements: ClientStatements,
    to_server: BytesMut,
    to_client: BytesMut,
    last_client_activity: Instant,
    hooks: SessionHooks,
    /// The answer queue of the last server, kept to reuse its allocation.
    spare_expected: Expected,
    /// The room rewritten Bind and Describe messages are written in, kept between them (see
    /// [`MessageContext::keep_room`]).
    rewrite_room: BytesMut,
    /// Client messages wait in the read buffer until the server answers an earlier Parse.
    held: bool,
    /// pgward refused a Parse itself: the client's messages are dropped until Sync.
    skip_to_sync: bool,
    /// The admission gate's slot and verdicts.
    gate: admit::GateState,
    /// What the gate derived from each reading under the policy and parameters in force.
    readings: readings::Readings,
    /// How the server reads a statement as the session's parameters say.
    settled: rules::SettledParams,
    /// The worker thread this session runs on, when there are several: a server it checks
    /// out is served by that thread's reactor (see [`crate::workers`]).
    pub home: Option<crate::workers::WorkerId>,
}

impl Session {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        rt: Arc<Runtime>,
        (user, peer): (String, rules::Peer),
        pool: Arc<Pool>,
        handle: Arc<ClientHandle>,
        params: ParamSet,
        tracked: Arc<Tracked>,
        timeouts: Timeouts,
        hooks: SessionHooks,
    ) -> Self {
        let mode = pool.settings().mode;
        // Without a policy a tenant is its role: KILL TENANT names it.
        let role_name = match *user == *pool.key.user {
            true => Arc::clone(&pool.names.user),
            false => Arc::from(user.as_str()),
        };
        handle.set_tenant(&role_name);
        Session {
            id: hooks.client_id(),
            pqexec_disallowed: rt.config.load().settings.disable_pqexec,
            config: Cache::new(rt.config.clone()),
            governance: Cache::new(rt.governance.clone()),
            rt,
            role_name,
            database_name: Arc::clone(&pool.names.database),
            user,
            peer,
            rule_state: RuleState::default(),
            pool_label: format!("{}/{}", pool.key.db, pool.key.user),
            pool,
            mode,
            handle,
            params,
            tracked,
            timeouts,
            link: None,
            statements: ClientStatements::default(),
            to_server: BytesMut::new(),
            to_client: BytesMut::new(),
            last_client_activity: Instant::now(),
            hooks,
            spare_expected: Expected::default(),
            rewrite_room: BytesMut::new(),
            held: false,
            skip_to_sync: false,
            gate: admit::GateState::default(),
            readings: readings::Readings::default(),
            settled: rules::SettledParams::default(),
            home: None,
        }
    }

    pub async fn run(&mut self, io: &mut ClientIo) -> Result<(), SessionError> {
        let result = self.relay(io).await;
        let log = self.rt.config.load().settings.log_lines();
        let (client, age) = (self.hooks.client_id(), self.hooks.age());
        match &result {
            Err(SessionError::Fatal(err)) => {
                crate::ops::routine::client_refused(log, client, err, age);
                let pending = std::mem::take(&mut self.to_client);
                io.send_error(&pending, err).await;
            }
            ended => {
                if let Some(end) = crate::client::client_end(ended, self.hooks.killed()) {
                    crate::ops::routine::client_closed(log, client, end, age);
                }
            }
        }
        self.finish().await;
        // A client the console ended is told why once what it left running is stopped and
        // its server let go (it may read nothing, and the write wait).
        let pending = std::mem::take(&mut self.to_client);
        crate::client::tell_killed(io, &result, self.hooks.killed(), &pending).await;
        match result {
            Err(SessionError::Fatal(_)) => Ok(()),
            other => other,
        }
    }

    async fn relay(&mut self, io: &mut ClientIo) -> Result<(), SessionError> {
        loop {
            match self.next_event(io).await? {
                Event::ClientData => {
                    self.last_client_activity = Instant::now();
                    if self.on_client_data(io).await? {
                        self.drain_after_terminate().await;
                        return Ok(());
                    }
                }
                Event::ClientClosed => return Err(SessionError::Gone),
                Event::ServerData => {
                    self.on_server_data(io).await?;
                    if self.held && self.retry_held(io).await? {
                        return Ok(());
                    }
                }
                Event::ServerDrained => {
                    self.after_answers(io, None).await?;
                    // Held messages may go now that nothing waits to be written.
                    if self.held && self.retry_held(io).await? {
                        return Ok(());
                    }
                }
                Event::ServerClosed => return Err(self.server_lost()),
                Event::Timer(Timer::TenantStatement) => self.cancel_for_tenant(),
                Event::Timer(t) => return Err(self.timed_out(t)),
            }
        }
    }

    /// Offers held client messages (`held`, checked by the callers) to the server again; true
    /// when the client said Terminate (what came before it has then been drained).
    async fn retry_held(&mut self, io: &mut ClientIo) -> Result<bool, SessionError> {
        if !self.on_client_data(io).await? {
            return Ok(false);
        }
        self.drain_after_terminate().await;
        Ok(true)
    }

    /// Waits for the next thing to act on, moving buffered bytes meanwhile.
    async fn next_event(&mut self, io: &mut ClientIo) -> Result<Event, SessionError> {
        let deadline = self.next_deadline();
        let pump = poll_fn(|cx| self.poll_pump(io, cx));
        match deadline {
            // The timer first: a stream that never pauses must not starve it.
            Some((at, timer)) => tokio::select! {
                biased;
                _ = tokio::time::sleep_until(at.into()) => Ok(Event::Timer(timer)),
                ev = pump => ev,
            },
            None => pump.await,
        }
    }

    fn poll_pump(
        &mut self,
        io: &mut ClientIo,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Event, SessionError>> {
        if let Some(link) = &mut self.link {
            let had_bytes = !self.to_server.is_empty();
            if flush(&mut link.server.stream, &mut self.to_server, cx).is_err() {
                return Poll::Ready(Ok(Event::ServerClosed));
            }
            if had_bytes && self.to_server.is_empty() && link.expected.is_quiet() {
                return Poll::Ready(Ok(Event::ServerDrained));
            }
        }
        if let Err(e) = flush(&mut io.stream, &mut self.to_client, cx) {
            return Poll::Ready(Err(e.into()));
        }
        // The side that is expected to speak next is read first: a woken session usually
        // finds its data there and returns without polling the other. Either way both are
        // polled before pending, so both wake this task.
        let answers_owed = self.link.as_ref().is_some_and(|l| !l.expected.is_empty());
        if answers_owed {
            if let Poll::Ready(ev) = self.poll_server_read(cx) {
                return Poll::Ready(Ok(ev));
            }
            return self.poll_client_read(io, cx).map(Ok);
        }
        if let Poll::Ready(ev) = self.poll_client_read(io, cx) {
            return Poll::Ready(Ok(ev));
        }
        self.poll_server_read(cx).map(Ok)
    }

    /// Reads what the client sent, unless enough waits to go to the server already, or to the
    /// client (answers pgward gives by itself, which no server's pace bounds), or enough
    /// answers are owed.
    #[inline]
    fn poll_client_read(&mut self, io: &mut ClientIo, cx: &mut Context<'_>) -> Poll<Event> {
        // While messages are held, what the client sends waits in the read buffer: bounded.
        let held_full = || self.held && io.rbuf.len() >= HIGH_WATER;
        let owed_full = || {
            self.link
                .as_ref()
                .is_some_and(|l| l.expected.len() >= MAX_OWED)
        };
        let out_full = self.to_server.len() >= HIGH_WATER || self.to_client.len() >= HIGH_WATER;
        if out_full || held_full() || owed_full() {
            return Poll::Pending;
        }
        reserve_for_frame(&mut io.rbuf);
        match poll_read_buf(Pin::new(&mut io.stream), cx, &mut io.rbuf) {
            Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => Poll::Ready(Event::ClientClosed),
            Poll::Ready(Ok(_)) => Poll::Ready(Event::ClientData),
            Poll::Pending => Poll::Pending,
        }
    }

    /// Reads what the server sent, unless enough waits to go to the client already.
    fn poll_server_read(&mut self, cx: &mut Context<'_>) -> Poll<Event> {
        let Some(link) = &mut self.link else {
            return Poll::Pending;
        };
        if self.to_client.len() >= HIGH_WATER {
            return Poll::Pending;
        }
        let server = &mut *link.server;
        reserve_for_frame(&mut server.rbuf);
        match poll_read_buf(Pin::new(&mut server.stream), cx, &mut server.rbuf) {
            Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => Poll::Ready(Event::ServerClosed),
            Poll::Ready(Ok(_)) => Poll::Ready(Event::ServerData),
            Poll::Pending => Poll::Pending,
        }
    }

    fn next_deadline(&self) -> Option<(Instant, Timer)> {
        let t = &self.timeouts;
        let tenant = &self.gate.limits;
        let at_most = |a: Option<Duration>, b: Option<Duration>| match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let mut next: Option<(Instant, Timer)> = None;
        let mut consider = |limit: Option<Duration>, since: Instant, timer: Timer| {
            // (A limit past the clock's range is none.)
            if let Some(at) = limit.and_then(|limit| since.checked_add(limit)) {
                if next.is_none_or(|(n, _)| at < n) {
                    next = Some((at, timer));
                }
            }
        };
        let idle_client = match &self.link {
            None => true,
            Some(link) => {
                let in_tx = link.server.tx != TxStatus::Idle;
                if let Some(since) = link.busy_since {
                    consider(t.query, since, Timer::Query);
                    // Not again for the request already cancelled.
                    if self.gate.timed_out_for(Some(since)).is_none() {
                        consider(tenant.statement, since, Timer::TenantStatement);
                    }
                }
                // A batch left open with everything answered (ended by a Flush) holds the
                // server's implicit transaction as much as an idle transaction block does.
                let batch_left_open = !link.expected.is_quiet();
                if (in_tx || batch_left_open) && link.expected.is_empty() {
                    let limit = at_most(t.idle_transaction, tenant.idle_in_transaction);
                    consider(limit, link.ready_since, Timer::IdleTransaction);
                }
                // A batch the client keeps open (no Sync) is a transaction it holds, unless
                // pgward holds the rest of it.
                let held_open = link.batch_since.filter(|_| !self.held);
                if let Some(since) = link.tx_since.or(held_open) {
                    let limit = at_most(t.transaction, tenant.transaction);
                    consider(limit, since, Timer::Transaction);
                }
                !in_tx && link.expected.is_quiet()
            }
        };
        if idle_client {
            consider(t.client_idle, self.last_client_activity, Timer::ClientIdle);
        }
        next
    }

    /// Requests the server has not answered yet (see [`Expected::requests_owed`]).
    fn requests_owed(&self) -> usize {
        self.link.as_ref().map_or(0, |l| l.expected.requests_owed())
    }

    /// Tells the client's cancel handle what went to the server (`owed` requests were
    /// unanswered before): pgward cancels on its own account only the request its reading
    /// of the server saw, never a later one. Returns whether a cancel is on its way.
    fn note_sent(&mut self, owed: usize) -> bool {
        let now_owed = self.requests_owed();
        self.gate.requests_sent += now_owed.saturating_sub(owed) as u64;
        self.gate.published_owed = now_owed;
        let running = self.link.as_ref().and_then(|l| l.expected.running_work());
        self.handle
            .note_sent(self.gate.requests_sent, now_owed, running)
    }

    /// The tenant's statement timeout passed: the request is cancelled as a client's
    /// CancelRequest would cancel it (its next message waits for the cancel to land), and
    /// PostgreSQL's 57014 will name pgward's timeout.
    fn cancel_for_tenant(&mut self) {
        let Some(limit) = self.gate.limits.statement else {
            return;
        };
        let since = self.link.as_ref().and_then(|l| l.busy_since);
        self.gate.timed_out = Some(admit::TimedOut { limit, since });
        tracing::info!(client = self.id, tenant = %self.gate.tenant, "statement timeout: cancelling");
        let log = &self.rt.gatekeeper.decisions;
        if log.is_on() {
            let who = crate::gate::Subject {
                tenant: &self.gate.tenant,
                database: &self.pool.key.db,
                client: self.id,
                fingerprint: self.handle.fingerprint().map(crate::sql::Fingerprint),
            };
            let record =
                crate::gate::Record::about(crate::gate::Event::Cancelled, "statement_timeout", who)
                    .sqlstate(crate::gate::SQLSTATE_CANCELED)
                    .seconds("timeout_s", limit);
            log.record(&record);
        }
        self.handle.clone().cancel_now(CLOSE_GRACE);
    }

    /// Forwards the complete messages the client sent, checking out a server first if
    /// needed. Returns true when the client said Terminate (after what came before it has
    /// been queued for the server).
    async fn on_client_data(&mut self, io: &mut ClientIo) -> Result<bool, SessionError> {
        loop {
            let chunk = scan_client(&io.rbuf, io.max_message, self.pqexec_disallowed)?;
            if chunk.len == 0 {
                if chunk.terminate {
                    io.rbuf.clear();
                }
                return Ok(chunk.terminate);
            }
            if self.link.is_none() && chunk.asks_nothing() {
                // Only COPY messages outside a COPY: PostgreSQL ignores them, and they must
                // not hold a server that nothing would give back.
                io.rbuf.advance(chunk.len);
                continue;
            }
            // The admission gate (under a policy) may wait, and may read more messages. Each
            // async call costs even when it returns at once, so the common cases are checked
            // here.
            let governance = self.governance.load().as_ref().clone();
            let governed = governance.is_some();
            let ready = match &governance {
                Some(governance) => self.gate_chunk(io, chunk.len, governance).await?,
                None if self.rt.gatekeeper.may_have_kills() => self.kill_chunk(&io.rbuf, chunk.len),
                None => {
                    // (Its Binds go out unread.)
                    self.gate.portals.forget();
                    self.gate.lapsed = true;
                    chunk.len
                }
            };
            if ready == 0 {
                // A request inside an open batch may wait for the answers to what went
                // before it, to be judged before it runs.
                self.flush_for_judging();
                self.held = true;
                return Ok(false);
            }
            if self.link.is_none() {
                // Under a policy a server is taken only with a slot (messages that carry
                // no request, such as a Parse alone, take one for their tenant too).
                // Refusals of simple Queries are answered without one. Anything else takes a
                // slot first (pooled modes: in session pooling the server is the client's own,
                // taken once, and each request waits for its slot holding it).
                if self.answer_refusals_alone(&mut io.rbuf, ready) {
                    continue;
                }
                if governed && self.gate.slot.is_none() && self.mode != PoolMode::Session {
                    self.slot_for_server(io).await?;
                }
                // Waiting may read more messages; scan again once attached.
                self.attach(io).await?;
                continue;
            }
            if self.handle.cancels_in_flight() {
                self.handle.wait_cancels().await;
            }
            if self.mode == PoolMode::Session && self.fast_close_due() {
                return Err(self.fast_close());
            }
            let before = io.rbuf.len();
            let owed = match governed {
                true => self.requests_owed(),
                false => 0,
            };
            self.forward_client(&mut io.rbuf, ready, governed)?;
            self.gate.consumed(before - io.rbuf.len());
            if governed && self.note_sent(owed) {
                // A cancel of pgward's own for what ran before is on its way.
                self.handle.wait_cancels().await;
            }
            // pgward may have answered everything itself (a DEALLOCATE, a Close).
            if self.link.as_ref().is_some_and(|l| l.quiet(&self.to_server)) {
                self.maybe_release(io).await?;
            }
            if self.held {
                return Ok(false);
            }
        }
    }

    /// The client said Terminate: let the server finish what was sent before it (bounded
    /// by [`CLOSE_GRACE`]), so a statement sent just before Terminate still runs to its end,
    /// as it would on a direct connection.
    async fn drain_after_terminate(&mut self) {
        let Some(link) = self.link.as_mut() else {
            return;
        };
        let drain = async {
            if !self.to_server.is_empty() {
                let out = std::mem::take(&mut self.to_server);
                link.server.send(&out).await.ok()?;
            }
            while !link.expected.is_quiet() {
                let frame = link.server.read_frame().await.ok()?;
                let body = frame.body();
                let own_missing = frame.tag() == backend::tag::ERROR_RESPONSE
                    && link.expected.statement_use_next()
                    && lost_own_statement(&link.server.statements, &body);
                let (_, learned) = link.expected.on_message(frame.tag()).ok()?;
                link.note_answer(link::Mark::of(frame.tag(), &body));
                let mut client = ClientSide {
                    statements: &mut self.statements,
                    params: &mut self.params,
                    tracked: &self.tracked,
                    views: &mut self.gate.views,
                };
                let server = &mut *link.server;
                if own_missing {
                    server.poison();
                }
                let ready = learn(
                    frame.tag(),
                    &body,
                    learned,
                    &mut server.statements,
                    &mut server.params,
                    &mut client,
                    &link.expected,
                )
                .ok()?;
                if let Some(status) = ready {
                    server.tx = status;
                }
                while link.expected.pop_synthetic().is_some() {}
            }
            Some(())
        };
        if tokio::time::timeout(CLOSE_GRACE, drain)
            .await
            .ok()
            .flatten()
            .is_none()
        {
            link.server.poison();
        }
    }

    /// Records what each message is owed, rewrites the ones that name prepared statements,
    /// and queues the result for the server. Untouched runs of messages are not copied.
    /// `gated`: the chunk passed the gate. Its rules are those in force now (a reload while
    /// it waited in the gate counts); a chunk no gate read while a policy is in force (one
    /// came with a reload meanwhile) leaves the gate's view of the statements incomplete.
    fn forward_client(
        &mut self,
        rbuf: &mut BytesMut,
        len: usize,
        gated: bool,
    ) -> Result<(), SessionError> {
        self.held = false;
        let governance = self.governance.load();
        if governance.is_none() || !gated {
            // The gate reads nothing now: what it knew of the client's statements may change
            // unseen.
            self.gate.views.forget();
            // Forgotten in place: messages held back below keep their places in the list.
            self.gate
                .unnamed_uses
                .iter_mut()
                .for_each(|known| *known = None);
        }
        let settings = &self.config.load().settings;
        let capacity = prepared_capacity(
            self.mode,
            settings.max_prepared_statements,
            governance.is_some(),
        );
        // Whether this session's runs are counted (SHOW STATEMENTS, unusual minutes, the
        // traffic log: under a policy; `max_statement_stats = 0` keeps no row of them).
        self.gate.stats_on = governance.is_some();
        let Some(link) = self.link.as_mut() else {
            return Ok(());
        };
        let chunk = &rbuf[..len];
        let was_idle = link.expected.is_empty();
        let allowed = self.gate.analyzed.as_mut().and_then(|a| a.allowed.take());
        let settled = &self.settled.of(&self.params).context;
        let rules = governance.as_deref().map(|governance| RuleCheck {
            governance,
            client_id: self.id,
            role: &self.user,
            peer: &self.peer,
            params: &self.params,
            settled,
            state: &mut self.rule_state,
            read_before: self.gate.analyzed.as_ref(),
            allowed,
            keeper: &self.rt.gatekeeper,
            database: &self.pool.key.db,
            log_refusals: true,
            statements: stats_sink(
                (&self.rt, self.home),
                self.gate.stats_on,
                &self.role_name,
                &self.database_name,
            ),
        });
        let mut ctx = MessageContext {
            link: &mut *link,
            statements: &mut self.statements,
            capacity,
            pooled: self.mode != PoolMode::Session,
            rules,
            skip_to_sync: &mut self.skip_to_sync,
            verdicts: &mut self.gate.verdicts,
            counters: self.hooks.counters(),
            defines: &mut self.gate.defines,
            views: &mut self.gate.views,
            unnamed_uses: &mut self.gate.unnamed_uses,
            not_here: &self.rt.gatekeeper.own.not_here,
            room: &mut self.rewrite_room,
        };
        // Whether a message was rewritten: what comes before it, then its replacement, go to
        // the server's buffer as they are read.
        let mut rewritten = false;
        let mut run_start = 0;
        let mut offset = 0;
        let mut executes = false;
        while let Some(span) = frame_at(chunk, offset) {
            executes |= span.tag == frontend::tag::EXECUTE;
            let body = &chunk[span.body()];
            if matches!(
                span.tag,
                frontend::tag::QUERY | frontend::tag::PARSE | frontend::tag::FUNCTION_CALL
            ) && params::names_unreported(body)
            {
                ctx.link.note_unreported();
            }
            if span.tag == frontend::tag::PARSE
                && capacity.is_some()
                && ctx.link.waits_for_parse(body)
            {
                // Whether this name is free depends on how an earlier Parse of it fares:
                // hold the rest until the server has answered that one.
                self.held = true;
                break;
            }
            if capacity.is_some() && ctx.link.waits_for_named(span.tag, body) {
                // Whether this name is the client's depends on how an earlier message that
                // creates or drops it fares: hold the rest until the server has answered.
                self.held = true;
                break;
            }
            if ctx.pooled && ctx.link.waits_for_unnamed(span.tag, body) {
                // Whose unnamed statement the server has depends on how an earlier Parse of
                // it fares: hold the rest until the server has answered that one.
                self.held = true;
                break;
            }
            if let Some(replacement) = ctx.client_message(span.tag, body)? {
                self.to_server
                    .extend_from_slice(&chunk[run_start..span.start]);
                self.to_server.extend_from_slice(&replacement);
                ctx.keep_room(replacement);
                run_start = span.end;
                rewritten = true;
            }
            offset = span.end;
        }
        let len = offset;
        self.hooks.received(len);
        match rewritten {
            false => take_front(&mut self.to_server, rbuf, len),
            true => {
                self.to_server.extend_from_slice(&rbuf[run_start..len]);
                rbuf.advance(len);
            }
        }
        // pgward's own answers go first: what is left is what the server owes, and only that
        // starts the statement timers.
        link.emit_synthetic(&mut self.to_client);
        if was_idle && !link.expected.is_empty() {
            link.busy_since = Some(Instant::now());
        }
        if link.expected.batch_open() || link.batch_since.is_some() {
            link.note_batch(Instant::now());
        }
        if link.expected.len() >= MAX_OWED && link.expected.batch_open() {
            // The client is read no further until answers come (see `poll_client_read`), and
            // the server may keep the one at the head unflushed until a Sync not read yet:
            // it is asked for them.
            crate::wire::encode_flush(&mut self.to_server);
        }
        if governance.is_some() && executes {
            // Under a policy an Execute no request passed the gate for (a suspended portal's
            // next rows) is work too: the run counts from here if it does not already.
            self.gate.run.touch(Instant::now());
        }
        Ok(())
    }

    /// The checkout from `step` on, reading the client meanwhile: a client queued past
    /// query_wait_notify (`notify`) is told so, once.
    async fn wait_for_server(
        &mut self,
        io: &mut ClientIo,
        step: Waiting,
        notify: Option<Duration>,
    ) -> Result<(ServerGuard, Instant), SessionError> {
        let checkout = self.hooks.checkout(&self.pool, step, (notify, self.home));
        tokio::pin!(checkout);
        loop {
            match reading_while(io, checkout.as_mut()).await?? {
                Checkout::Server(server, at) => return Ok((server, at)),
                Checkout::Waiting(step) => {
                    checkout.set(self.hooks.checkout(&self.pool, step, (None, self.home)));
                    tell_queued(io, &mut self.to_client).await?;
                }
            }
        }
    }

    /// Checks out a server (waiting in the pool's queue) and brings its tracked
    /// parameters in line with the client's. How long that took.
    async fn attach(&mut self, io: &mut ClientIo) -> Result<Duration, SessionError> {
        let asked = Instant::now();
        let ticket = Ticket::new(self.id, asked);
        // query_wait_notify: a client queued that long is told so, once. The pool's queue
        // keeps the time, so a wait sets no timer of its own.
        let notify = self.config.load().settings.query_wait_notify;
        // The first step with no future: an idle server (the common case), or the queue.
        let first = self
            .hooks
            .checkout_now(&self.pool, &ticket, (notify, self.home))?;
        // (When the server needed no check, it was taken as the client asked.)
        let mut taken_at = asked;
        let (step, ready) = match first {
            Some(Taken::Idle(server)) if self.pool.check_due(&server, asked) => {
                // server_check_query runs while the client is read (one that leaves ends it),
                // the client waiting meanwhile; a server found broken is closed, and another
                // asked for from the start, as a waiting client (a PAUSE holds it, a SHUTDOWN
                // WAIT_FOR_SERVERS refuses it, as it does the pool's queue).
                self.hooks.checking(asked);
                let check = self.pool.checked(server);
                tokio::pin!(check);
                let checked = reading_while(io, check).await?;
                taken_at = Instant::now();
                (Waiting::Start(ticket), checked)
            }
            Some(Taken::Idle(server)) => (Waiting::Start(ticket), Some(server)),
            Some(Taken::Wait(queued)) => (Waiting::Queued(asked, queued), None),
            None => (Waiting::Start(ticket), None),
        };
        let (mut server, mut now) = match ready {
            Some(server) => {
                let now = self.hooks.checked_out(&server, asked, taken_at);
                (server, now)
            }
            None => self.wait_for_server(io, step, notify).await?,
        };
        if let Some(home) = self.home {
            // Its socket's events wake this session's thread, not the one it last served.
            match server.rehome(home) {
                Ok(true) => self.rt.workers.note_move(),
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(
                        server = server.id,
                        "cannot move a server connection to this worker thread: {e}"
                    );
                    return Err(self.server_lost());
                }
            }
        }
        if self.params != server.params {
            self.sync_params(&mut server).await?;
            now = Instant::now();
        }
        self.handle.attach(CancelTarget {
            addr: server.addr.clone(),
            key: server.key.clone(),
        });
        self.link = Some(Link {
            server,
            expected: std::mem::take(&mut self.spare_expected),
            busy_since: None,
            ready_since: now,
            tx_since: None,
            batch_since: None,
            reset_sent: false,
            unnamed_ours: false,
            unnamed_answered: false,
            unnamed_in_batch: false,
            unnamed_unsettled: false,
            unreported_named: false,
            cursor_declared: false,
            shared: self.mode != crate::config::PoolMode::Session,
        });
        Ok(now.saturating_duration_since(asked))
    }

    /// Sets on `server` the tracked parameters whose values differ from the client's (the
    /// caller has seen that some do).
    async fn sync_params(&mut self, server: &mut ServerGuard) -> Result<(), SessionError> {
        let mut diffs = self.params.to_set_on(&mut server.params);
        if diffs.is_empty() {
            return Ok(());
        }
        let utf8 = server.params.get("client_encoding") == Some("UTF8");
        if !utf8 && diffs.iter().any(|(_, v)| !v.is_ascii()) {
            // Values outside ASCII go in a text the server reads as UTF-8 (see
            // `params::set_statement`); the client's own encoding is set back in it.
            let set = server.simple_query(params::UTF8_FIRST, &self.tracked).await;
            set.map_err(|e| internal_failure(server, e))?;
            diffs = self.params.to_set_on(&mut server.params);
        }
        let pairs: Vec<(&str, &str)> = diffs
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        let before = server.params.clone();
        let set = server
            .simple_query(&params::set_statement(&pairs), &self.tracked)
            .await;
        set.map_err(|e| internal_failure(server, e))?;
        for (name, value) in &diffs {
            // A value the server reported just now wins (it says `UTF8` for `utf8`); a
            // parameter it did not report (unchanged spelling, or one it never reports)
            // now holds what was set.
            let reported = server.params.get(name) != before.get(name);
            match server.params.get(name).map(str::to_string) {
                Some(v) if reported => {
                    self.params.set(name, &v);
                }
                _ => {
                    server.params.set(name, value);
                }
            }
        }
        Ok(())
    }

    /// The client sent a text naming a setting PostgreSQL never reports, and the server it ran
    /// on goes back (its transaction over, nothing owed): the server says what it holds (a SET
    /// rolled back or LOCAL left it as it was), and the client's value follows, to be set on
    /// the next server it is given. If the server cannot say, its value stays unknown (the
    /// next client's is set there) and the client's stays as it was.
    async fn read_unreported(&mut self, link: &mut Link) {
        let name = params::EXTRA_FLOAT_DIGITS;
        let own = Arc::clone(&self.rt.gatekeeper.own);
        let show = OwnStatement::plain(&own.unreported, "SHOW extra_float_digits");
        match link.server.own_batch(&[show], 1, &self.tracked).await {
            Ok(rows) => {
                let value = rows.into_iter().next().and_then(|r| r.into_iter().next());
                if let Some(Some(value)) = value {
                    link.server.params.set(name, &value);
                    self.params.set(name, &value);
                }
            }
            Err(ServerError::Refused(fields)) => {
                tracing::debug!(client = self.id, code = ?fields.code(), "reading {name} failed");
            }
            Err(_) => link.server.poison(),
        }
    }

    /// Moves the server's complete messages to the client, matching each to what it answers,
    /// following ReadyForQuery and ParameterStatus, and gives the server back when the pool
    /// mode allows.
    async fn on_server_data(&mut self, io: &mut ClientIo) -> Result<(), SessionError> {
        let governed = self.governance.load().is_some();
        let Some(link) = self.link.as_mut() else {
            return Ok(());
        };
        let mut offset = 0;
        let mut kept: Option<BytesMut> = None;
        let mut run_start = 0;
        let max = link.server.max_message();
        let mut opened_block = false;
        let mut last_ready = None;
        let owed_before = !link.expected.is_empty();
        while let Some(span) = server_frame_at(&mut link.server, offset, max)? {
            let (tag, end) = (span.tag, span.end);
            if tag == backend::tag::READY_FOR_QUERY
                && self.mode == PoolMode::Statement
                && link.server.rbuf.get(span.body().start) != Some(&TxStatus::Idle.as_byte())
            {
                // Statement pooling: the client never sees the ReadyForQuery that would open
                // a transaction block; what came before it still goes through.
                opened_block = true;
                break;
            }
            let ready_at = (tag == backend::tag::READY_FOR_QUERY).then(Instant::now);
            let marks = ready_at.map(|at| (link.busy_since, link.tx_since, at));
            last_ready = ready_at.or(last_ready);
            if tag == backend::tag::ERROR_RESPONSE || tag == backend::tag::PORTAL_SUSPENDED {
                // A failed or cancelled run, or a portal that stops with rows left, teaches
                // nothing (it is still charged).
                self.gate.run.failed = true;
            }
            if governed
                && (tag == backend::tag::COMMAND_COMPLETE || tag == backend::tag::ERROR_RESPONSE)
            {
                self.gate
                    .run
                    .note_answer(tag, &link.server.rbuf[span.body()]);
            }
            // An error pgward words itself, in place of the server's.
            let replacement = (tag == backend::tag::ERROR_RESPONSE)
                .then(|| {
                    let body = &link.server.rbuf[span.body()];
                    // Under a policy, the number of the request this error answers (the first
                    // one unanswered): requests are counted under a policy only.
                    let request = governed.then(|| {
                        (self.gate.requests_sent + 1)
                            .saturating_sub(link.expected.requests_owed() as u64)
                    });
                    let gate = (&self.gate, link.busy_since);
                    let own = own_cancel_error(body, gate, &self.handle, request);
                    own.map(|err| {
                        let mut out = BytesMut::new();
                        crate::wire::encode_error(&mut out, &err);
                        out
                    })
                    .or_else(|| {
                        messages::foreign_statement_error(body, &self.rt.gatekeeper.own.not_here)
                    })
                    .or_else(|| {
                        let renamed = link.expected.renamed_next()?;
                        messages::renamed_error(body, renamed)
                    })
                })
                .flatten();
            let mut client = ClientSide {
                statements: &mut self.statements,
                params: &mut self.params,
                tracked: &self.tracked,
                views: &mut self.gate.views,
            };
            if let Some(replacement) = replacement {
                // PostgreSQL's answer to pgward's cancel: say why pgward cancelled; or its
                // answer about a statement pgward renamed (or names by its own name): in the
                // client's words.
                let route = server_message(link, &mut client, span, None)?;
                let out = kept.get_or_insert_with(BytesMut::new);
                out.extend_from_slice(&link.server.rbuf[run_start..offset]);
                if route == Route::Forward {
                    out.extend_from_slice(&replacement);
                }
                link.emit_synthetic(out);
                run_start = end;
                offset = end;
                continue;
            }
            let route = server_message(link, &mut client, span, ready_at)?;
            if let Some((busy, tx, at)) = marks {
                self.hooks.ready(link.server.tx, (busy, tx), at);
            }
            if route == Route::Swallow || link.expected.synthetic_next() {
                let out = kept.get_or_insert_with(BytesMut::new);
                out.extend_from_slice(&link.server.rbuf[run_start..offset]);
                if route == Route::Forward {
                    out.extend_from_slice(&link.server.rbuf[offset..end]);
                }
                link.emit_synthetic(out);
                run_start = end;
            }
            offset = end;
        }
        if offset > 0 {
            self.hooks.sent(offset);
            let rbuf = &mut link.server.rbuf;
            match kept {
                None => take_front(&mut self.to_client, rbuf, offset),
                Some(out) => {
                    self.to_client.extend_from_slice(&out);
                    self.to_client.extend_from_slice(&rbuf[run_start..offset]);
                    rbuf.advance(offset);
                }
            }
        }
        if opened_block {
            link.server.poison();
            return Err(statement_mode_refusal());
        }
        if governed {
            // What the server owes, for pgward's own cancels (see `note_sent`).
            let owed = link.expected.requests_owed();
            if owed != self.gate.published_owed {
                self.gate.published_owed = owed;
                self.handle.note_owed(owed, link.expected.running_work());
            }
        }
        if self
            .gate
            .timed_out
            .is_some_and(|t| t.since != link.busy_since)
        {
            // The cancelled request was answered: the next one's 57014 is its own.
            self.gate.timed_out = None;
        }
        if last_ready.is_some() {
            // A cancel asked for during pricing after the fact is for a request sent by
            // then: none came before this ReadyForQuery.
            self.gate.cancel_next = false;
        }
        if link.expected.is_empty() {
            link.busy_since = None;
            self.gate.timed_out = None;
            // Idle time counts from the last answer, not from the last request.
            let answered = last_ready.unwrap_or_else(Instant::now);
            self.last_client_activity = answered;
            if owed_before {
                // Inside a transaction too: a batch answered without a ReadyForQuery (ended
                // by a Flush) ran until now.
                link.ready_since = answered;
            }
        }
        self.after_answers(io, last_ready).await
    }

    /// The server may have answered everything. Messages the client already sent that the
    /// gate held for those answers are the rest of its pipeline: the server stays for them,
    /// as it would have with nothing held (the unnamed statement lives there only), unless
    /// they have to wait for a slot (the slot goes back to the gate meanwhile, and they take
    /// one as any request does). Requests the gate already admitted keep the slot too.
    async fn after_answers(
        &mut self,
        io: &mut ClientIo,
        answered: Option<Instant>,
    ) -> Result<(), SessionError> {
        if self.gate.requests_unsent() {
            // Requests the gate admitted wait behind a Parse of their name that the server
            // has now answered: the run goes on with them, on this server and under the
            // slot they were admitted under (settling now would time them by that Parse).
            // They go out at once; nothing waits meanwhile.
            return Ok(());
        }
        // (Held messages that passed the gate with no request among them, such as a Parse
        // behind a Parse of its name, give back both: they take a slot, then a server.)
        let keep = self.held && !self.gate.admitted_unsent() && self.mode != PoolMode::Session;
        self.release_when_quiet(io, keep, answered).await
    }

    async fn maybe_release(&mut self, io: &mut ClientIo) -> Result<(), SessionError> {
        self.release_when_quiet(io, false, None).await
    }

    /// `keep`: the server stays with the client even outside a transaction (its slot goes).
    /// `answered`: when the server's last answer came, if it just did.
    async fn release_when_quiet(
        &mut self,
        io: &mut ClientIo,
        keep: bool,
        answered: Option<Instant>,
    ) -> Result<(), SessionError> {
        let Some(link) = &self.link else {
            return Ok(());
        };
        if !link.quiet(&self.to_server) {
            return Ok(());
        }
        // The client has its answers first: what follows is pgward's own bookkeeping, and
        // the release, which may run server_reset_query or a CLOSE ALL, or wait for a cancel
        // on its way (PgBouncer too sends the ReadyForQuery, then gives the server back).
        let idle = link.server.tx == TxStatus::Idle;
        self.answers_now(io).await?;
        // PostgreSQL owes this client nothing: the run's time is settled, what ran unpriced
        // in a batch is priced for its next run, and the gate's slot goes back, unless a
        // transaction is open (it keeps its slot, as it keeps its server, to its end).
        let slot = match idle && !self.gate.has_deferred() {
            true => SlotAfter::Goes,
            false => SlotAfter::Stays,
        };
        self.gate.end_run(
            &self.rt.gatekeeper,
            stats_sink(
                (&self.rt, self.home),
                self.gate.stats_on,
                &self.role_name,
                &self.database_name,
            ),
            (slot, answered),
        );
        if self.gate.stale_plans {
            let db = &self.pool.key.db;
            self.rt.gatekeeper.plans().invalidate_database(db);
            self.gate.stale_plans = self
                .link
                .as_ref()
                .is_some_and(|l| l.server.tx != TxStatus::Idle);
        }
        if self.gate.has_deferred() {
            // (The client has its answers already: it need not wait for pgward's pricing of
            // what already ran, nor time it as its statement's.)
            let failed = |s: &Self| s.link.as_ref().map(|l| l.server.tx) == Some(TxStatus::Failed);
            let failed_before = failed(self);
            if self.price_deferred().await? {
                // A cancel the client asked for meanwhile is for what it had sent by then,
                // not yet on the server (on PostgreSQL it would have stopped it), or it took
                // pgward's SAVEPOINT and failed the transaction; a late one that finds
                // nothing sent is dropped, as PostgreSQL drops a cancel at an idle backend.
                let sent = !io.rbuf.is_empty() || io.stream.readable_now();
                self.gate.cancel_next = sent || (failed(self) && !failed_before);
            }
        }
        let Some(link) = &self.link else {
            return Ok(());
        };
        if self.mode == PoolMode::Session {
            if link.server.tx == TxStatus::Idle {
                self.gate.slot = None;
            }
            return Ok(());
        }
        if link.server.tx != TxStatus::Idle {
            if self.mode == PoolMode::Statement {
                return Err(statement_mode_refusal());
            }
            return Ok(());
        }
        if keep {
            self.gate.slot = None;
            return Ok(());
        }
        self.release(true).await;
        Ok(())
    }

    /// Writes what the client is owed as far as its socket takes it now (the rest goes with
    /// the next turn of the relay).
    async fn answers_now(&mut self, io: &mut ClientIo) -> Result<(), SessionError> {
        let to_client = &mut self.to_client;
        poll_fn(|cx| Poll::Ready(flush(&mut io.stream, to_client, cx))).await?;
        Ok(())
    }

    /// Gives the server back, once no cancel for it is still on its way, then the slot.
    /// `stays`: the client goes on (what it set that PostgreSQL never reports is read, to
    /// follow it to its next server).
    async fn release(&mut self, stays: bool) {
        self.gate.end_run(
            &self.rt.gatekeeper,
            stats_sink(
                (&self.rt, self.home),
                self.gate.stats_on,
                &self.role_name,
                &self.database_name,
            ),
            (SlotAfter::Goes, None),
        );
        self.gate.forget_deferred();
        let Some(mut link) = self.link.take() else {
            self.gate.slot = None;
            return;
        };
        if !self.gate.tenant.is_empty() {
            // Runaway eviction knows whose work an idle server last ran.
            link.server.last_tenant = Some(Arc::clone(&self.gate.tenant));
        }
        self.hooks.released();
        if !self.handle.detach() {
            self.gate.settle_kept();
            self.handle.wait_cancels().await;
        }
        if self.handle.take_unsure() {
            // A cancel of this client's may still land on what the server runs next.
            tracing::info!(
                client = self.id,
                "a cancel may still land: its server is closed"
            );
            link.server.poison();
        }
        if stays && link.unreported_named {
            // (No cancel of the client's can reach pgward's own statement now.)
            self.gate.settle_kept();
            self.read_unreported(&mut link).await;
        }
        if link.cursor_declared && link.server.is_clean() {
            // A cursor declared WITH HOLD outlives its transaction: the next client of the
            // server could FETCH from it.
            self.gate.settle_kept();
            let closed = link.server.simple_query("CLOSE ALL", &self.tracked).await;
            if closed.is_err() {
                link.server.poison();
            }
        }
        if link.expected.is_empty() {
            self.spare_expected = std::mem::take(&mut link.expected);
        }
        // (In session pooling the reset runs as the client leaves.)
        let always = self.mode != PoolMode::Session && self.pool.resets_always();
        let reset = always
            .then(|| self.pool.settings_now().reset_query.clone())
            .flatten();
        if let Some(q) = reset {
            self.gate.settle_kept();
            let _tested = self.pool.testing(&link.server);
            if link.server.run_configured(&q, &self.tracked).await.is_err() {
                link.server.poison();
            }
        }
        // The server is back in the pool before the slot goes to the next waiter, who
        // then finds it idle.
        drop(link);
        self.gate.slot = None;
    }

    /// A session timeout fired: the server goes with the client, closed with the same reason
    /// in the log, after what it runs is cancelled; an idle client's clean server (session
    /// pooling) goes back.
    fn timed_out(&mut self, t: Timer) -> SessionError {
        let err = t.error();
        let keeps =
            t == Timer::ClientIdle && self.link.as_ref().is_some_and(|l| l.quiet(&self.to_server));
        if !keeps {
            if let Some(link) = self.link.take() {
                if !link.expected.is_empty() {
                    // Stop what the server is running before closing it.
                    crate::cancel::cancel_in_background(&link.server.addr, &link.server.key);
                }
                self.cut_run_short(&err.code);
                self.handle.detach();
                link.server.close(&err.message);
                self.gate.slot = None;
            }
        }
        SessionError::Fatal(err)
    }

    /// server_fast_close: a session's server that RECONNECT (or a reload) marked is closed
    /// before the client's next request outside a transaction, and the client with it.
    fn fast_close_due(&self) -> bool {
        let Some(link) = &self.link else {
            return false;
        };
        link.quiet(&self.to_server)
            && link.server.tx == TxStatus::Idle
            && self
                .pool
                .closing
                .close_needed(link.server.id, link.server.created)
            && self.rt.config.load().settings.server_fast_close
    }

    /// The gate's run ends before the server answered it (see `GateState::cut_short`).
    fn cut_run_short(&mut self, sqlstate: &str) {
        let stats = stats_sink(
            (&self.rt, self.home),
            self.gate.stats_on,
            &self.role_name,
            &self.database_name,
        );
        self.gate.cut_short(&self.rt.gatekeeper, stats, sqlstate);
    }

    fn fast_close(&mut self) -> SessionError {
        const REASON: &str = "database configuration changed";
        // A request the gate let through for this server never runs: what the gate holds
        // for it is let go, as for a server lost.
        self.cut_run_short(sqlstate::ADMIN_SHUTDOWN);
        if let Some(link) = self.link.take() {
            self.handle.detach();
            link.server.close(REASON);
        }
        SessionError::Fatal(ErrorResponse::fatal(sqlstate::ADMIN_SHUTDOWN, REASON))
    }

    /// The server went away while this client was using it.
    fn server_lost(&mut self) -> SessionError {
        self.cut_run_short(sqlstate::CONNECTION_FAILURE);
        if let Some(mut link) = self.link.take() {
            link.server.poison();
            self.handle.detach();
        }
        self.gate.slot = None;
        SessionError::Fatal(ErrorResponse::fatal(
            sqlstate::CONNECTION_FAILURE,
            "server closed the connection unexpectedly".to_string(),
        ))
    }

    /// The client is gone: a server in the middle of anything is closed, a clean one goes
    /// back (after server_reset_query in session mode).
    async fn finish(&mut self) {
        let Some(link) = &mut self.link else {
            return;
        };
        let quiet = link.quiet(&self.to_server);
        let clean = quiet && link.server.is_clean();
        if !quiet {
            // Cut short: what ran is charged, and teaches nothing.
            self.gate.run.failed = true;
        }
        if !quiet && !link.expected.is_empty() {
            // What the client left running is cancelled on PostgreSQL before its server
            // is closed: a vanished client's statement must not run on.
            crate::cancel::cancel_and_wait(&link.server.addr, &link.server.key, CLOSE_GRACE).await;
        }
        if !clean {
            link.server.poison();
        } else if self.mode == PoolMode::Session {
            if let Some(q) = self.pool.settings().reset_query.clone() {
                // (The client is gone: the server is the pool's, being reset.)
                self.hooks.released();
                let _tested = self.pool.testing(&link.server);
                if link.server.run_configured(&q, &self.tracked).await.is_err() {
                    link.server.poison();
                }
            }
        }
        self.release(false).await;
    }
}

/// What the client is told when pgward's own statement on its server failed: the server's
/// own error, or the connection's loss (the server is then not reused).
fn internal_failure(server: &mut ServerGuard, e: ServerError) -> SessionError {
    if let ServerError::Refused(fields) = e {
        return SessionError::Fatal(fields.to_fatal());
    }
    server.poison();
    SessionError::Fatal(ErrorResponse::fatal(
        sqlstate::CONNECTION_FAILURE,
        e.to_string(),
    ))
}

/// A transaction block under statement pooling ends the session, as in PgBouncer (08P01:
/// the connection is gone, which is how drivers must read it).
fn statement_mode_refusal() -> SessionError {
    SessionError::Fatal(ErrorResponse::fatal(
        sqlstate::PROTOCOL_VIOLATION,
        "transaction blocks not allowed in statement pooling mode",
    ))
}

/// How many mapped statements each server may hold, if pgward maps them: in pooled modes,
/// `max_prepared_statements` as it is set now (the console can change it). Under a policy
/// they are always mapped, so no client can reach a statement another client prepared (and
/// that was judged for that client alone).
fn prepared_capacity(mode: PoolMode, configured: u32, governed: bool) -> Option<usize> {
    let capacity = match configured as usize {
        0 if governed => DEFAULT_MAX_PREPARED,
        n => n,
    };
    (mode != PoolMode::Session && capacity > 0).then_some(capacity)
}

/// The error the client gets in place of the ErrorResponse `body`, when that is
/// PostgreSQL's 57014 after a cancel pgward sent on its own account (the tenant's statement
/// timeout, the lock-queue guard).
fn own_cancel_error(
    body: &[u8],
    (gate, busy_since): (&admit::GateState, Option<Instant>),
    handle: &crate::cancel::ClientHandle,
    request: Option<u64>,
) -> Option<ErrorResponse> {
    let code = wire::ErrorFields::find(body, backend::field::CODE)?;
    if code != sqlstate::QUERY_CANCELED.as_bytes() {
        return None;
    }
    // The request the tenant's statement timeout cancelled (not a later one of the same
    // pipeline, answered in the same read).
    if let Some(t) = gate.timed_out_for(busy_since) {
        return Some(admit::statement_timeout_error(&gate.tenant, t.limit));
    }
    // Without a policy (no `request`) pgward cancels nothing of its own, and a reason left
    // from before is not this error's.
    request
        .and_then(|n| handle.take_own_cancel(n))
        .map(|c| c.error())
}

/// One poll of a wait that reads the client meanwhile: `wait` first, then the client's
/// socket while less than [`HIGH_WATER`] is buffered, so that a client that leaves ends the
/// wait (`Err`) and what it sends meanwhile waits in the buffer. Both in one poll: the waits
/// on the gate's and the pool's queues are polled so, with no future nested for either.
fn poll_reading<T>(
    io: &mut ClientIo,
    cx: &mut Context<'_>,
    wait: impl FnOnce(&mut Context<'_>) -> Poll<T>,
) -> Poll<Result<T, SessionError>> {
    if let Poll::Ready(out) = wait(cx) {
        return Poll::Ready(Ok(out));
    }
    while io.rbuf.len() < HIGH_WATER {
        if let Err(gone) = std::task::ready!(io.poll_fill(cx)) {
            return Poll::Ready(Err(gone));
        }
    }
    Poll::Pending
}

/// Awaits `wait` while reading what the client sends meanwhile (see [`poll_reading`]), with
/// no future of its own around it.
fn reading_while<'a, F: Future>(
    io: &'a mut ClientIo,
    mut wait: Pin<&'a mut F>,
) -> impl Future<Output = Result<F::Output, SessionError>> + 'a {
    poll_fn(move |cx| poll_reading(io, cx, |cx| wait.as_mut().poll(cx)))
}

/// Tells a client that has waited query_wait_notify (for a server, a slot, a RESUME) that it
/// is queued, in PgBouncer's words (the same whatever the database): behind what it is still
/// owed (`to_client`), written as far as the socket takes it now; the rest goes with the
/// client's next answers (a client that reads nothing while it sends is not waited on).
async fn tell_queued(io: &mut ClientIo, to_client: &mut BytesMut) -> Result<(), SessionError> {
    let notice = ErrorResponse::new(
        crate::wire::Severity::Notice,
        "00000",
        "No server connection available in postgres backend, client being queued".to_string(),
    );
    crate::wire::encode_notice(to_client, &notice);
    poll_fn(|cx| Poll::Ready(flush(&mut io.stream, to_client, cx))).await?;
    Ok(())
}

/// Writes as much of `buf` as the socket takes now.
fn flush<S: tokio::io::AsyncWrite + Unpin>(
    stream: &mut S,
    buf: &mut BytesMut,
    cx: &mut Context<'_>,
) -> std::io::Result<()> {
    while !buf.is_empty() {
        match poll_write_buf(Pin::new(&mut *stream), cx, buf) {
            Poll::Ready(Ok(0)) => return Err(std::io::ErrorKind::WriteZero.into()),
            Poll::Ready(Ok(_)) => {}
            Poll::Ready(Err(e)) => return Err(e),
            Poll::Pending => break,
        }
    }
    Ok(())
}

/// Makes room for the rest of the message at the front of `buf`, or a read's worth.
fn reserve_for_frame(buf: &mut BytesMut) {
    let want = match wire::FrameHeader::at(buf, 0) {
        // The length word read unsigned: a bad one is refused by the scan that follows.
        Some(head) => (head.len as u32 as usize + 1)
            .saturating_sub(buf.len())
            .clamp(wire::frame::READ_ROOM, 1 << 20),
        None => wire::frame::READ_ROOM,
    };
    if buf.capacity() - buf.len() < want {
        buf.reserve(want);
    }
}

/// Moves the first `n` bytes of `src` to the end of `dst`. When `dst` is empty and all of
/// `src` moves, the two buffers trade places; otherwise small runs are copied, so both
/// buffers keep their own allocation from one message to the next, and large ones are handed
/// over without copying.
fn take_front(dst: &mut BytesMut, src: &mut BytesMut, n: usize) {
    if dst.is_empty() && n == src.len() {
        std::mem::swap(dst, src);
    } else if n >= ZERO_COPY_FROM && dst.is_empty() {
        *dst = src.split_to(n);
    } else {
        dst.extend_from_slice(&src[..n]);
        src.advance(n);
    }
}

/// Runs at least this long move between buffers without a copy.
const ZERO_COPY_FROM: usize = 64 * 1024;

/// The complete message at `offset` in a run of messages whose lengths were checked when it
/// was scanned ([`scan_client`], [`server_frame_at`]), if one is there.
fn frame_at(buf: &[u8], offset: usize) -> Option<FrameSpan> {
    wire::scan_frame(buf, offset, usize::MAX).ok().flatten()
}

/// The complete server message at `offset`, if one is there; a length PostgreSQL never sends
/// means the conversation is lost.
fn server_frame_at(
    server: &mut crate::server::ServerConn,
    offset: usize,
    max: usize,
) -> Result<Option<FrameSpan>, SessionError> {
    wire::scan_frame(&server.rbuf, offset, max).map_err(|bad| {
        server.poison();
        SessionError::Fatal(ErrorResponse::fatal(
            sqlstate::PROTOCOL_VIOLATION,
            // The length word read unsigned, as it always was in this message.
            format!(
                "server sent a message with an invalid length ({})",
                bad.len as u32
            ),
        ))
    })
}

/// Reads the complete client messages at the front of `buf`: their size, and what they ask
/// of the server. Unknown message types and oversized lengths are protocol violations.
fn scan_client(
    buf: &[u8],
    max_message: usize,
    pqexec_disallowed: bool,
) -> Result<ClientChunk, SessionError> {
    use frontend::tag;
    let mut chunk = ClientChunk::default();
    let mut offset = 0;
    loop {
        let span = match wire::scan_frame(buf, offset, max_message) {
            Ok(Some(span)) => span,
            Ok(None) => break,
            Err(bad) => {
                return Err(SessionError::Fatal(ErrorResponse::fatal(
                    sqlstate::PROTOCOL_VIOLATION,
                    // The length word read unsigned, as it always was in this message.
                    format!("invalid message length {}", bad.len as u32),
                )));
            }
        };
        match span.tag {
            tag::TERMINATE => {
                chunk.terminate = true;
                break;
            }
            tag::QUERY if pqexec_disallowed => {
                if offset > 0 {
                    // What came before it goes first, as PgBouncer reads message by message.
                    break;
                }
                return Err(SessionError::Fatal(ErrorResponse::fatal(
                    sqlstate::PROTOCOL_VIOLATION,
                    "PQexec disallowed".to_string(),
                )));
            }
            tag::QUERY
            | tag::FUNCTION_CALL
            | tag::SYNC
            | tag::PARSE
            | tag::BIND
            | tag::DESCRIBE
            | tag::EXECUTE
            | tag::CLOSE
            | tag::FLUSH => chunk.asks = true,
            tag::COPY_DATA | tag::COPY_DONE | tag::COPY_FAIL => {}
            other => {
                return Err(SessionError::Fatal(ErrorResponse::fatal(
                    sqlstate::PROTOCOL_VIOLATION,
                    format!("invalid frontend message type {other}"),
                )))
            }
        }
        offset = span.end;
        chunk.len = offset;
    }
    Ok(chunk)
}

/// Where the runs of a session of `role` in `database` on thread `home` are counted, if they
/// are (`on`: under a policy, which reads statements, unless `max_statement_stats` is 0).
fn stats_sink<'a>(
    (rt, home): (&'a Runtime, Option<crate::workers::WorkerId>),
    on: bool,
    role: &'a Arc<str>,
    database: &'a Arc<str>,
) -> Option<admit::StatsSink<'a>> {
    on.then_some(admit::StatsSink {
        tables: &rt.ops.statements,
        // The session's thread's table.
        worker: home.unwrap_or(0),
        traffic: &rt.ops.traffic,
        role,
        database,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::frontend::tag;

    fn msg(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut v = vec![tag];
        v.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
        v.extend_from_slice(body);
        v
    }

    #[test]
    fn scan_finds_whole_messages_that_ask_something() {
        let mut buf = msg(tag::PARSE, b"\0select 1\0\0\0");
        buf.extend(msg(tag::BIND, b"\0\0\0\0\0\0\0\0"));
        buf.extend(msg(tag::EXECUTE, b"\0\0\0\0\0"));
        let c = scan_client(&buf, 1 << 20, false).unwrap();
        assert_eq!((c.asks, c.len), (true, buf.len()));
        let copy = msg(tag::COPY_DATA, b"data");
        let c = scan_client(&copy, 1 << 20, false).unwrap();
        assert!(c.asks_nothing());
    }

    #[test]
    fn scan_stops_at_partial_messages_and_terminate() {
        let mut buf = msg(tag::QUERY, b"select 1\0");
        let whole = buf.len();
        buf.extend(&msg(tag::QUERY, b"select 2\0")[..6]);
        let c = scan_client(&buf, 1 << 20, false).unwrap();
        assert_eq!(c.len, whole);
        let mut buf = msg(tag::TERMINATE, b"");
        buf.extend(msg(tag::QUERY, b"select 1\0"));
        let c = scan_client(&buf, 1 << 20, false).unwrap();
        assert!(c.terminate);
        assert_eq!(c.len, 0);
    }

    #[test]
    fn take_front_moves_bytes_in_order() {
        // All of it into an empty buffer: the buffers trade places.
        let mut src = BytesMut::from(&b"abc"[..]);
        let mut dst = BytesMut::with_capacity(64);
        take_front(&mut dst, &mut src, 3);
        assert_eq!((&dst[..], &src[..]), (&b"abc"[..], &b""[..]));
        assert!(src.capacity() >= 64, "the source keeps the emptied buffer");
        // Part of it, or behind what is already there: copied.
        let mut src = BytesMut::from(&b"defgh"[..]);
        take_front(&mut dst, &mut src, 2);
        assert_eq!((&dst[..], &src[..]), (&b"abcde"[..], &b"fgh"[..]));
        let mut empty = BytesMut::new();
        take_front(&mut empty, &mut src, 1);
        assert_eq!((&empty[..], &src[..]), (&b"f"[..], &b"gh"[..]));
    }

    #[test]
    fn scan_refuses_bad_lengths_and_types() {
        assert!(scan_client(&[tag::QUERY, 0, 0, 0, 3], 1 << 20, false).is_err());
        assert!(scan_client(&[tag::QUERY, 0x7f, 0xff, 0xff, 0xff], 1 << 20, false).is_err());
        assert!(scan_client(&msg(b'z', b""), 1 << 20, false).is_err());
    }
}
