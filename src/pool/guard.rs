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
