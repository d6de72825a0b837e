//! A server of its own for a replication client: room in the pool first (evicting an idle
//! server if need be, as PgBouncer does), then a login that asks for a walsender. It is
//! never idle, never lent to anyone else, and closed when its client leaves.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::pool::Room;
use super::{Growth, Pool, PoolError};
use crate::server::ServerConn;

/// How often a client waiting for room under a limit shared with other pools looks again:
/// a server closing in another pool does not wake this one's waiters.
pub(super) const SHARED_LIMIT_RECHECK: Duration = Duration::from_millis(250);

/// A pool's place held for one dedicated server; given back when dropped.
struct Place(Arc<Pool>);

impl Drop for Place {
    fn drop(&mut self) {
        self.0.release_dedicated();
    }
}

/// Counts its holder among the pool's replication clients waiting for room while it lives.
struct RoomWaiter<'a>(&'a Pool);

impl<'a> RoomWaiter<'a> {
    fn new(pool: &'a Pool) -> Self {
        pool.count_room_waiter(true);
        RoomWaiter(pool)
    }
}

impl Drop for RoomWaiter<'_> {
    fn drop(&mut self) {
        self.0.count_room_waiter(false);
    }
}

/// A logged-in dedicated server. Dropping it closes the server and gives its place back.
pub struct Dedicated {
    conn: Option<Box<ServerConn>>,
    place: Place,
}

impl Deref for Dedicated {
    type Target = ServerConn;
    fn deref(&self) -> &ServerConn {
        self.conn
            .as_ref()
            .expect("a dedicated server is present until dropped")
    }
}

impl DerefMut for Dedicated {
    fn deref_mut(&mut self) -> &mut ServerConn {
        self.conn
            .as_mut()
            .expect("a dedicated server is present until dropped")
    }
}

impl Drop for Dedicated {
    /// What the server may still run (a walsender's command, a SQL statement on a logical
    /// replication connection) is cancelled first: its client is gone, and a backend busy
    /// running would not notice the closed socket until it finishes.
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            if tokio::runtime::Handle::try_current().is_ok() {
                crate::cancel::cancel_in_background(&conn.addr, &conn.key);
            }
            self.place.0.close(conn, "replication client was closed");
        }
    }
}

impl Pool {
    /// Waits, within `wait` (query_wait_timeout), for room in the pool and the limits it
    /// shares, then logs a server in with the pool's startup parameters overridden by
    /// `startup` (the replication mode, the client's own parameters and options). No
    /// `connect_query` is run: a physical walsender takes no SQL. A failed login is the
    /// client's alone: other clients of the pool are not refused for it.
    pub async fn open_dedicated(
        self: &Arc<Self>,
        startup: &[(String, String)],
        wait: Option<Duration>,
    ) -> Result<Dedicated, PoolError> {
        let place = self.room_for_dedicated(wait).await?;
        let settings = self.settings();
        let mut target = settings.target.clone();
        for (name, value) in startup {
            target.startup_params.retain(|(n, _)| n != name);
            target.startup_params.push((name.clone(), value.clone()));
        }
        target.connect_query = None;
        let id = self.next_server_id();
        match self.connect(&target, &settings, id).await {
            Ok(conn) => Ok(Dedicated {
                conn: Some(Box::new(conn)),
                place,
            }),
            Err(err) => {
                tracing::warn!(pool = %self.key.db, user = %self.key.user, server = id, "server login failed: {err}");
                // A replication login is the client's alone: PgBouncer's words for it.
                if target.log.disconnections {
                    tracing::info!(server = id, pool = %self.key.db, user = %self.key.user, "closing because: login failed (age=0s)");
                }
                Err(PoolError::Login(Arc::new(err)))
            }
        }
    }

    async fn room_for_dedicated(
        self: &Arc<Self>,
        wait: Option<Duration>,
    ) -> Result<Place, PoolError> {
        let deadline = wait.map(|w| Instant::now() + w);
        let _waiting = RoomWaiter::new(self);
        loop {
            let changed = self.room_changed();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let full = match self.reserve_dedicated() {
                Room::Reserved => return Ok(Place(self.clone())),
                Room::Evicted => continue,
                Room::Full(full) => full,
            };
            self.make_room_elsewhere(full);
            super::pool::wait_turn(changed, deadline, full != Growth::PoolFull).await?;
        }
    }
}
