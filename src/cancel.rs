//! Cancel requests: each client gets pgward's own key; a request with a known key cancels
//! what that client runs at that moment, on the server it is using, and nothing else.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use rand::RngCore;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Notify;

use crate::server::{BackendKey, ServerAddr};
use crate::sync::lock;
use crate::wire;

/// Where a cancel for a client goes: the server it is using and that server's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CancelTarget {
    pub addr: Arc<ServerAddr>,
    pub key: BackendKey,
}

/// The server a cancel for the client goes to. How many cancels are on their way is an
/// atomic beside it: the session reads it before every message it forwards.
#[derive(Debug, Default)]
struct CancelState {
    target: Option<CancelTarget>,
}

/// The part of a client session a cancel request can reach.
#[derive(Debug)]
pub struct ClientHandle {
    pub client_id: u64,
    pub pid: u32,
    secret: [u8; 4],
    state: Mutex<CancelState>,
    /// Cancels being delivered; changed only under `state`'s lock, read without it.
    in_flight: AtomicUsize,
    done: Notify,
}

impl ClientHandle {
    pub fn secret(&self) -> [u8; 4] {
        self.secret
    }

    /// The client now uses this server; cancels go there.
    pub fn attach(&self, target: CancelTarget) {
        lock(&self.state).target = Some(target);
    }

    /// The client is about to give its server back. Returns false while a cancel for that
    /// server is still being delivered: the caller must `wait_cancels` first, so the cancel
    /// cannot land on another client's statement.
    pub fn detach(&self) -> bool {
        lock(&self.state).target = None;
        self.in_flight.load(Ordering::Acquire) == 0
    }

    pub fn cancels_in_flight(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) > 0
    }

    /// Waits until no cancel for this client is being delivered.
    pub async fn wait_cancels(&self) {
        loop {
            let notified = self.done.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if !self.cancels_in_flight() {
                return;
            }
            notified.await;
        }
    }

    fn begin_cancel(&self) -> Option<CancelTarget> {
        let state = lock(&self.state);
        let target = state.target.clone()?;
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        Some(target)
    }

    fn end_cancel(&self) {
        {
            let _state = lock(&self.state);
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
        }
        self.done.notify_waiters();
    }
}

/// Every live client's cancel key.
#[derive(Debug, Default)]
pub struct CancelRegistry {
    clients: Mutex<HashMap<u32, Arc<ClientHandle>>>,
}

impl CancelRegistry {
    /// Gives a client an unguessable key. The handle is removed by [`CancelRegistry::remove`].
    pub fn register(&self, client_id: u64) -> Arc<ClientHandle> {
        let mut rng = rand::thread_rng();
        let mut clients = lock(&self.clients);
        let pid = loop {
            let pid = rng.next_u32() & 0x7fff_ffff;
            if pid != 0 && !clients.contains_key(&pid) {
                break pid;
            }
        };
        let mut secret = [0u8; 4];
        rng.fill_bytes(&mut secret);
        let handle = Arc::new(ClientHandle {
            client_id,
            pid,
            secret,
            state: Mutex::new(CancelState::default()),
            in_flight: AtomicUsize::new(0),
            done: Notify::new(),
        });
        clients.insert(pid, handle.clone());
        handle
    }

    pub fn remove(&self, pid: u32) {
        lock(&self.clients).remove(&pid);
    }

    fn find(&self, pid: u32, secret: &[u8]) -> Option<Arc<ClientHandle>> {
        let handle = lock(&self.clients).get(&pid).cloned()?;
        wire::ct_eq(&handle.secret, secret).then_some(handle)
    }

    /// Handles a CancelRequest: unknown keys are ignored; a known key sends a cancel to the
    /// server that client is using. The delivery runs as its own task, so whatever happens to
    /// the connection that asked (a login timeout, a hang-up), the client's hold on its server
    /// ends when the cancel connection has closed or `limit` has passed.
    pub fn cancel(&self, pid: u32, secret: &[u8], limit: Duration) {
        let Some(handle) = self.find(pid, secret) else {
            tracing::debug!("cancel request with an unknown key ignored");
            return;
        };
        handle.cancel_now(limit);
    }
}

impl ClientHandle {
    /// Cancels what the client's server runs now, as a CancelRequest of the client would:
    /// until the cancel connection has closed (or `limit` has passed), the client's next
    /// message waits and its server is not given back. Returns whether a server was attached.
    pub fn cancel_now(self: Arc<Self>, limit: Duration) -> bool {
        let Some(target) = self.begin_cancel() else {
            return false;
        };
        let in_flight = InFlight(self);
        tokio::spawn(async move {
            deliver(&target, limit).await;
            drop(in_flight);
        });
        true
    }
}

/// A cancel being delivered for a client; dropping it (whatever the path) ends it.
struct InFlight(Arc<ClientHandle>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.end_cancel();
    }
}

/// Cancels what a server runs, without waiting: pgward's own timeouts use it before they
/// close a server that is still working.
pub fn cancel_in_background(addr: &Arc<ServerAddr>, key: &BackendKey) {
    let target = CancelTarget {
        addr: addr.clone(),
        key: key.clone(),
    };
    tokio::spawn(async move { deliver(&target, Duration::from_secs(10)).await });
}

async fn deliver(target: &CancelTarget, limit: Duration) {
    let sent = tokio::time::timeout(limit, send_cancel(target)).await;
    if !matches!(sent, Ok(Ok(()))) {
        tracing::warn!(server = %target.addr, "cancel request could not be delivered");
    }
}

async fn send_cancel(target: &CancelTarget) -> Result<(), crate::server::ServerError> {
    let mut stream = target.addr.connect().await?;
    let mut out = BytesMut::new();
    wire::encode_cancel_request(&mut out, target.key.pid, &target.key.secret);
    stream.write_all(&out).await?;
    // The postmaster closes the connection once it has signalled the backend.
    let mut sink = [0u8; 64];
    while stream.read(&mut sink).await? > 0 {}
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn target() -> CancelTarget {
        CancelTarget {
            addr: Arc::new(ServerAddr::Tcp {
                host: "127.0.0.1".into(),
                port: 1,
            }),
            key: BackendKey {
                pid: 7,
                secret: Bytes::from_static(b"abcd"),
            },
        }
    }

    #[test]
    fn keys_are_unique_and_checked() {
        let reg = CancelRegistry::default();
        let a = reg.register(1);
        let b = reg.register(2);
        assert_ne!(a.pid, b.pid);
        assert!(reg.find(a.pid, &a.secret()).is_some());
        let mut wrong = a.secret();
        wrong[0] ^= 1;
        assert!(reg.find(a.pid, &wrong).is_none());
        reg.remove(a.pid);
        assert!(reg.find(a.pid, &a.secret()).is_none());
    }

    #[test]
    fn a_detached_client_cannot_be_cancelled() {
        let reg = CancelRegistry::default();
        let h = reg.register(1);
        assert!(h.begin_cancel().is_none());
        h.attach(target());
        assert!(h.begin_cancel().is_some());
        assert!(!h.detach(), "a cancel in flight holds the server");
        h.end_cancel();
        assert!(h.detach());
        assert!(h.begin_cancel().is_none());
    }
}
