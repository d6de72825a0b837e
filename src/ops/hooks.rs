//! What a session tells the operations layer, in a few calls that cost an atomic add or an
//! uncontended lock: it waits for a server, got one, sent and received bytes, a request was
//! answered, it gave the server back.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::clients::{ClientEntry, ServerLink};
use super::state::Shutdown;
use super::stats::PoolCounters;
use super::Ops;
use crate::gate::Ticket;
use crate::pool::{Handout, Pool, PoolError, Queued, ServerGuard, Taken, WaitLimits, WaitTimeout};
use crate::wire::TxStatus;
use crate::workers::WorkerId;

/// A session's wait: the pool's query_wait_timeout, and `notify` (query_wait_notify).
fn limits(notify: Option<Duration>, home: Option<WorkerId>) -> WaitLimits {
    WaitLimits {
        timeout: WaitTimeout::Pool,
        notify,
        home,
    }
}

/// Where a session's wait for a server stands.
#[derive(Debug)]
pub enum Waiting {
    /// Not asked yet.
    Start(Ticket),
    /// Told it waits while its database is paused; not in the pool's queue yet.
    Held(Ticket),
    /// In the pool's queue since the given moment, and told so.
    Queued(Instant, Queued),
}

/// What a checkout gives the session.
#[derive(Debug)]
pub enum Checkout {
    /// The server, and the moment it was handed out.
    Server(ServerGuard, Instant),
    /// query_wait_notify passed: tell the client, then go on waiting with this.
    Waiting(Waiting),
}

/// One session's link to the registry, the counters of its pool, and the pause hold.
#[derive(Clone)]
pub struct SessionHooks {
    ops: Arc<Ops>,
    entry: Arc<ClientEntry>,
    counters: Arc<PoolCounters>,
}

impl SessionHooks {
    /// `worker`: the thread the session runs on, whose set of the pool's counters it bumps.
    pub fn new(ops: Arc<Ops>, entry: Arc<ClientEntry>, pool: &Pool, worker: WorkerId) -> Self {
        let counters = ops.stats.for_pool(&pool.key, worker);
        SessionHooks {
            ops,
            entry,
            counters,
        }
    }

    pub fn client_id(&self) -> u64 {
        self.entry.id
    }

    /// How the console ended the client's connection, if it did.
    pub fn killed(&self) -> Option<super::clients::Kill> {
        self.entry.killed()
    }

    /// Takes a server for this session: waits while the database is paused or the pooler
    /// suspended, refuses new work while the pooler shuts down waiting for servers, then
    /// checks out through the pool's wait queue (bounded by query_wait_timeout). A session told
    /// it is still queued (after `notify`, once) calls again with the [`Waiting`] it got.
    /// `home`: the session's worker thread, whose idle servers it takes first.
    pub async fn checkout(
        &self,
        pool: &Arc<Pool>,
        step: Waiting,
        (notify, home): (Option<Duration>, Option<WorkerId>),
    ) -> Result<Checkout, PoolError> {
        let (since, handout) = match step {
            Waiting::Start(ticket) => {
                self.entry.set_waiting(ticket.enqueued_at);
                let notify_at = notify.and_then(|after| ticket.enqueued_at.checked_add(after));
                let held = self.ops.control.holds(&pool.key.db);
                if held && !self.wait_while_paused(pool, notify_at).await {
                    return Ok(Checkout::Waiting(Waiting::Held(ticket)));
                }
                self.refuse_if_stopping()?;
                let since = ticket.enqueued_at;
                (
                    since,
                    pool.wait_for_server(ticket, limits(notify, home)).await?,
                )
            }
            Waiting::Held(ticket) => {
                self.ops.control.wait_open(&pool.key.db).await;
                self.refuse_if_stopping()?;
                let since = ticket.enqueued_at;
                (
                    since,
                    pool.wait_for_server(ticket, limits(None, home)).await?,
                )
            }
            Waiting::Queued(since, queued) => (since, queued.await?),
        };
        match handout {
            Handout::Server(server) => {
                let now = self.checked_out(&server, since, Instant::now());
                Ok(Checkout::Server(server, now))
            }
            Handout::StillQueued(queued) => Ok(Checkout::Waiting(Waiting::Queued(since, queued))),
        }
    }

    /// The checkout's first step with no future, when nothing holds the client back (a
    /// pause, a suspend, a shutdown that refuses new work): an idle server of `pool` (not
    /// checked yet; once it is, [`checked_out`](Self::checked_out) counts it), or a place in
    /// its queue (the client counted as waiting: go on with [`checkout`](Self::checkout) from
    /// [`Waiting::Queued`]); the request's time noted either way (SHOW CLIENTS). `None`: the
    /// client is held, or pgward stops; it goes through [`checkout`](Self::checkout) from
    /// [`Waiting::Start`].
    pub fn checkout_now(
        &self,
        pool: &Arc<Pool>,
        ticket: &Ticket,
        (notify, home): (Option<Duration>, Option<WorkerId>),
    ) -> Result<Option<Taken>, PoolError> {
        if self.held(pool) || self.refuse_if_stopping().is_err() {
            return Ok(None);
        }
        // (The ticket was made just now: its time is the clock's.)
        let taken = pool.take_or_queue(ticket, limits(notify, home), ticket.enqueued_at)?;
        match taken {
            Taken::Wait(_) => self.entry.set_waiting(ticket.enqueued_at),
            // (Not waiting, but a request all the same: SHOW CLIENTS' request_time.)
            Taken::Idle(_) => self.entry.note_request(ticket.enqueued_at),
        }
        Ok(Some(taken))
    }

    /// The idle server taken for the client's request of `since` runs server_check_query
    /// first: the client waits meanwhile (SHOW CLIENTS, SHOW POOLS' cl_waiting and maxwait).
    pub fn checking(&self, since: Instant) {
        self.entry.set_waiting(since);
    }

    /// A server checked out for the client `now`, which asked for it `since`: its wait
    /// counted (SHOW STATS), the client active on it (SHOW CLIENTS). Returns `now`.
    pub fn checked_out(&self, server: &ServerGuard, since: Instant, now: Instant) -> Instant {
        self.counters
            .add_assignment(now.saturating_duration_since(since));
        self.entry.set_active(ServerLink::of(server));
        now
    }

    /// Whether the pool's database is paused or the pooler suspended: a client of it waits.
    pub fn held(&self, pool: &Pool) -> bool {
        self.ops.control.holds(&pool.key.db)
    }

    /// Waits until the pool's database is neither paused nor the pooler suspended, counted in
    /// SHOW CLIENTS and SHOW POOLS as waiting (ended with [`SessionHooks::gate_wait_ends`]).
    pub async fn until_open(&self, pool: &Pool) {
        self.entry.set_waiting(Instant::now());
        self.ops.control.wait_open(&pool.key.db).await;
    }

    /// Waits while the pool's database is paused or the pooler suspended (the caller has seen
    /// that it is); false when `notify_at` came first (the client is to be told it waits).
    async fn wait_while_paused(&self, pool: &Pool, notify_at: Option<Instant>) -> bool {
        let open = self.ops.control.wait_open(&pool.key.db);
        match notify_at {
            Some(at) => tokio::time::timeout_at(at.into(), open).await.is_ok(),
            None => {
                open.await;
                true
            }
        }
    }

    /// New work is refused while the pooler shuts down waiting for servers.
    fn refuse_if_stopping(&self) -> Result<(), PoolError> {
        match self.ops.control.shutdown() {
            Shutdown::WaitForServers => Err(PoolError::ShuttingDown),
            _ => Ok(()),
        }
    }

    /// A request took its slot in the admission gate at once, at `at`: it waited for
    /// nothing, and SHOW CLIENTS' request_time is then.
    pub fn gate_slot_at_once(&self, at: Instant) {
        self.entry.note_request(at);
    }

    /// The client waits in the admission gate's queue: SHOW CLIENTS and SHOW POOLS count it
    /// as waiting, as for the pool's queue.
    pub fn gate_wait_starts(&self) {
        self.entry.set_waiting(Instant::now());
    }

    /// The wait in the gate is over: back to active on the server it holds, or idle.
    pub fn gate_wait_ends(&self, server: Option<&crate::server::ServerConn>) {
        match server {
            Some(server) => self.entry.set_active(ServerLink::of(server)),
            None => self.entry.set_idle(),
        }
    }

    /// How long the client has been connected.
    pub fn age(&self) -> std::time::Duration {
        self.entry.age()
    }

    /// The pool's counters (the prepared-statement counts are bumped where messages are
    /// mapped).
    pub fn counters(&self) -> &PoolCounters {
        &self.counters
    }

    pub fn received(&self, n: usize) {
        self.counters.add_received(n);
    }

    pub fn sent(&self, n: usize) {
        self.counters.add_sent(n);
    }

    /// A ReadyForQuery arrived `now` with `status`; `busy_since` and `tx_since` are the
    /// session's marks from before it.
    pub fn ready(
        &self,
        status: TxStatus,
        (busy_since, tx_since): (Option<Instant>, Option<Instant>),
        now: Instant,
    ) {
        let query = busy_since.map_or_else(Default::default, |t| now.saturating_duration_since(t));
        let xact = (status == TxStatus::Idle)
            .then(|| tx_since.map_or(query, |t| now.saturating_duration_since(t)));
        self.counters.add_query(query, xact);
    }

    /// The session gave its server back.
    pub fn released(&self) {
        self.entry.set_idle();
    }
}
