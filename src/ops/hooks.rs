//! What a session tells the operations layer, in a few calls that cost an atomic add or an
//! uncontended lock: it waits for a server, got one, sent and received bytes, a request was
//! answered, it gave the server back.

use std::sync::Arc;
use std::time::Instant;

use super::clients::{ClientEntry, ServerLink};
use super::state::Shutdown;
use super::stats::PoolCounters;
use crate::gate::Ticket;
use crate::pool::{Pool, PoolError, ServerGuard};
use crate::runtime::Runtime;
use crate::wire::TxStatus;

/// One session's link to the registry, the counters of its pool, and the pause gate.
#[derive(Clone)]
pub struct SessionHooks {
    rt: Arc<Runtime>,
    entry: Arc<ClientEntry>,
    counters: Arc<PoolCounters>,
}

impl SessionHooks {
    pub fn new(rt: Arc<Runtime>, entry: Arc<ClientEntry>, pool: &Pool) -> Self {
        let counters = rt.ops.stats.for_pool(&pool.key);
        SessionHooks {
            rt,
            entry,
            counters,
        }
    }

    pub fn client_id(&self) -> u64 {
        self.entry.id
    }

    /// Takes a server for this session: waits while the database is paused or the pooler
    /// suspended, refuses new work while the pooler shuts down waiting for servers, then
    /// checks out through the gate's queue (bounded by query_wait_timeout).
    pub async fn checkout(
        &self,
        pool: Arc<Pool>,
        ticket: Ticket,
    ) -> Result<ServerGuard, PoolError> {
        let since = ticket.enqueued_at;
        self.entry.set_waiting(since);
        let control = &self.rt.ops.control;
        if control.holds(&pool.key.db) {
            control.wait_open(&pool.key.db).await;
        }
        if control.shutdown() == Shutdown::WaitForServers {
            return Err(PoolError::Closed);
        }
        let server = pool.checkout(ticket, pool.settings().query_wait).await?;
        self.counters.add_assignment(since.elapsed());
        self.entry.set_active(ServerLink::of(&server));
        Ok(server)
    }

    pub fn received(&self, n: usize) {
        self.counters.add_received(n);
    }

    pub fn sent(&self, n: usize) {
        self.counters.add_sent(n);
    }

    /// A ReadyForQuery arrived with `status`; `busy_since` and `tx_since` are the session's
    /// marks from before it.
    pub fn ready(&self, status: TxStatus, busy_since: Option<Instant>, tx_since: Option<Instant>) {
        let now = Instant::now();
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
