//! A checked-out server: it returns to its pool when the guard drops.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use super::Pool;
use crate::server::ServerConn;

/// The connection is boxed, so a guard is two pointers wide: it travels through the wait
/// queue's channel, the checkout and the session without copying the connection each time.
#[derive(Debug)]
pub struct ServerGuard {
    conn: Option<Box<ServerConn>>,
    pool: Arc<Pool>,
}

impl ServerGuard {
    pub(super) fn new(pool: Arc<Pool>, conn: Box<ServerConn>) -> Self {
        ServerGuard {
            conn: Some(conn),
            pool,
        }
    }

    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// Closes the server now, logging `reason`, instead of giving it back.
    pub fn close(mut self, reason: &str) {
        if let Some(conn) = self.conn.take() {
            self.pool.discard(conn, reason);
        }
    }

    /// Returns a server no client has used (the login that only learned a pool's
    /// parameters): it counts as just opened, so a server_lifetime of 0 still gives it its
    /// one use.
    pub fn give_back_unused(mut self) {
        if let Some(conn) = self.conn.take() {
            self.pool.place(conn, true);
        }
    }
}

impl Deref for ServerGuard {
    type Target = ServerConn;
    fn deref(&self) -> &ServerConn {
        self.conn
            .as_ref()
            .expect("a guard holds its server until dropped")
    }
}

impl DerefMut for ServerGuard {
    fn deref_mut(&mut self) -> &mut ServerConn {
        self.conn
            .as_mut()
            .expect("a guard holds its server until dropped")
    }
}

impl Drop for ServerGuard {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            self.pool.checkin(conn);
        }
    }
}
