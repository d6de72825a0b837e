//! Cancel requests: each client gets pgward's own key; a request with a known key cancels
//! what that client runs at that moment, on the server it is using, and nothing else.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
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
    /// Whose work the client sends its server: the tenant of the request last let through,
    /// and the fingerprint of the statement the server runs now, the oldest request not
    /// answered (for KILL TENANT and KILL STATEMENT).
    tenant: Arc<str>,
    fingerprint: Option<u64>,
    /// The fingerprint of the statement the server ran last (what a session idle in a
    /// transaction is shown with).
    last_run: Option<u64>,
    /// Requests (Execute, Query, FunctionCall) the session has sent to its servers so far
    /// (kept only under a policy, for pgward's own cancels).
    sent: u64,
    /// Of those, the ones not answered yet.
    owed: usize,
    /// Why pgward itself cancels what the client runs, for the error the client gets, and
    /// which request (by its number in `sent`) it cancels.
    own_cancel: Option<(u64, OwnCancel)>,
    /// A cancel reached the server's postmaster but was not known to have landed when its
    /// time was up: it may yet land, on whatever the server then runs.
    unsure: bool,
}

/// A cancel pgward sends on its own account, not the client's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnCancel {
    /// The lock-queue guard: a DDL statement waited for a lock `waited` long, with
    /// `queued` sessions waiting behind it.
    LockQueue { waited: Duration, queued: usize },
}

impl OwnCancel {
    /// The error the client gets in place of PostgreSQL's 57014.
    pub fn error(self) -> wire::ErrorResponse {
        match self {
            OwnCancel::LockQueue { waited, queued } => wire::ErrorResponse::error(
                crate::wire::sqlstate::LOCK_NOT_AVAILABLE,
                "canceling statement due to pgward lock-queue guard".to_string(),
            )
            .with_detail(format!(
                "it waited {} ms for a lock, with {queued} other sessions waiting behind it",
                waited.as_millis()
            ))
            .with_hint(
                "retry when the transaction holding the lock has ended, or with a lock_timeout"
                    .to_string(),
            ),
        }
    }
}

/// What a session had sent when pgward's reading of its server was asked for.
#[derive(Debug, Clone)]
pub struct Seen {
    pub handle: Arc<ClientHandle>,
    /// [`CancelState::sent`] then.
    pub sent: u64,
    /// [`CancelState::owed`] then.
    pub owed: usize,
    pub tenant: String,
    /// The fingerprint of the statement the server ran then, or ran last if it was idle.
    pub fingerprint: Option<u64>,
}

impl CancelState {
    /// The server runs the statement `running` now (`None`: nothing, or one the gate did not
    /// read).
    fn runs(&mut self, running: Option<u64>) {
        self.fingerprint = running;
        if running.is_some() {
            self.last_run = running;
        }
    }

    /// Forgets a reason whose request has been answered (a cancel that landed on nothing).
    fn forget_answered(&mut self) {
        let answered = self.sent.saturating_sub(self.owed as u64);
        if self.own_cancel.is_some_and(|(n, _)| n <= answered) {
            self.own_cancel = None;
        }
    }
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
    /// Cancels of what the client runs (its own CancelRequests, KILLs) asked for so far.
    requested: AtomicU64,
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
        let mut state = lock(&self.state);
        state.target = None;
        state.owed = 0;
        state.fingerprint = None;
        state.last_run = None;
        state.own_cancel = None;
        drop(state);
        self.in_flight.load(Ordering::Acquire) == 0
    }

    /// Whose work the client sends its server now: a kill of that tenant cancels it.
    pub fn set_tenant(&self, tenant: &Arc<str>) {
        let mut state = lock(&self.state);
        if !crate::name::same(&state.tenant, tenant) {
            state.tenant = Arc::clone(tenant);
        }
    }

    /// The fingerprint of the statement the server runs now, if the gate read it.
    pub fn fingerprint(&self) -> Option<u64> {
        lock(&self.state).fingerprint
    }

    /// The session has sent `sent` requests (Execute, Query, FunctionCall) in all, of which
    /// `owed` are not answered yet, the oldest of them running the statement `running`.
    /// Returns whether a cancel is on its way: the new requests must wait until it has
    /// landed (it was meant for what ran before them).
    pub fn note_sent(&self, sent: u64, owed: usize, running: Option<u64>) -> bool {
        let mut state = lock(&self.state);
        state.sent = sent;
        state.owed = owed;
        state.runs(running);
        state.forget_answered();
        self.in_flight.load(Ordering::Acquire) > 0
    }

    /// Of the requests sent, `owed` are not answered yet, the oldest of them running the
    /// statement `running`.
    pub fn note_owed(&self, owed: usize, running: Option<u64>) {
        let mut state = lock(&self.state);
        state.owed = owed;
        state.runs(running);
        state.forget_answered();
    }

    /// Why pgward cancelled request number `request` (counted as in `note_sent`), if it
    /// did: asked once, at that request's 57014.
    pub fn take_own_cancel(&self, request: u64) -> Option<OwnCancel> {
        let mut state = lock(&self.state);
        match state.own_cancel {
            Some((n, reason)) if n == request => {
                state.own_cancel = None;
                Some(reason)
            }
            _ => None,
        }
    }

    /// Cancels what the client's server `pid` runs for pgward's `reason`, only if, when the
    /// reading was asked for and now, one request was unanswered and none was sent since
    /// (`seen`): then what runs is the request the reading saw, never a later one. Returns
    /// whether the cancel went.
    pub fn cancel_seen(
        self: &Arc<Self>,
        pid: u32,
        seen: (u64, usize),
        reason: OwnCancel,
        limit: Duration,
    ) -> bool {
        let target = {
            let mut state = lock(&self.state);
            let Some(target) = state.target.clone().filter(|t| t.key.pid == pid) else {
                return false;
            };
            let busy = self.in_flight.load(Ordering::Acquire) > 0;
            if busy || seen != (state.sent, 1) || state.owed != 1 {
                return false;
            }
            state.own_cancel = Some((state.sent, reason));
            self.in_flight.fetch_add(1, Ordering::AcqRel);
            target
        };
        let in_flight = InFlight::new(Arc::clone(self));
        tokio::spawn(async move {
            let delivery = deliver(&target, limit).await;
            in_flight.end(delivery);
        });
        true
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

    /// Begins a cancel if the client holds a server and its work matches `hit` (tenant,
    /// fingerprint), looked at under the same lock: the work cannot move on in between.
    fn begin_cancel_if(&self, hit: impl Fn(&str, Option<u64>) -> bool) -> Option<CancelTarget> {
        let state = lock(&self.state);
        if !hit(&state.tenant, state.fingerprint) {
            return None;
        }
        let target = state.target.clone()?;
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.requested.fetch_add(1, Ordering::AcqRel);
        Some(target)
    }

    /// How many cancels of what the client runs were asked for so far: one asked for while
    /// pgward prices the client's statement is meant for that statement.
    pub fn cancels_requested(&self) -> u64 {
        self.requested.load(Ordering::Acquire)
    }

    /// Whether a cancel of this client's may still land on its server (see
    /// [`Delivery::Unsure`]); asked once, as the server goes back: such a server is closed
    /// rather than given to another client.
    pub fn take_unsure(&self) -> bool {
        std::mem::take(&mut lock(&self.state).unsure)
    }

    fn end_cancel(&self, delivery: Delivery) {
        {
            let mut state = lock(&self.state);
            state.unsure |= delivery == Delivery::Unsure;
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
        }
        self.done.notify_waiters();
    }
}

/// The two bits of a key's last byte that count how many more times a peer may forward a
/// cancel for it (PgBouncer's layout, so peers of either kind understand each other).
const TTL_MASK: u8 = 0x03;

/// Every live client's cancel key, by the key's first four bytes (the "process id").
#[derive(Debug, Default)]
pub struct CancelRegistry {
    clients: Mutex<HashMap<u32, Vec<Arc<ClientHandle>>>>,
}

impl CancelRegistry {
    /// Gives a client an unguessable key. Under peering (`peer_id` > 0) the key carries the
    /// instance's id in its second and third bytes and a forwarding budget in the last
    /// byte's low bits, as in PgBouncer, which leaves 45 random bits. The handle is removed
    /// by [`CancelRegistry::remove`].
    pub fn register(&self, client_id: u64, peer_id: u16) -> Arc<ClientHandle> {
        let mut rng = rand::thread_rng();
        let mut clients = lock(&self.clients);
        let (pid, secret) = loop {
            let (pid, secret) = new_key(&mut rng, peer_id);
            let taken = clients
                .get(&pid)
                .is_some_and(|same| peer_id == 0 || same.iter().any(|h| h.secret == secret));
            if pid != 0 && !taken {
                break (pid, secret);
            }
        };
        let handle = Arc::new(ClientHandle {
            client_id,
            pid,
            secret,
            state: Mutex::new(CancelState::default()),
            in_flight: AtomicUsize::new(0),
            requested: AtomicU64::new(0),
            done: Notify::new(),
        });
        clients.entry(pid).or_default().push(handle.clone());
        handle
    }

    /// Cancels what runs now for every client holding a server whose work matches `hit`
    /// (tenant, fingerprint), as its own cancel would; how many were cancelled.
    pub fn cancel_where(&self, hit: impl Fn(&str, Option<u64>) -> bool, limit: Duration) -> usize {
        let handles: Vec<Arc<ClientHandle>> =
            lock(&self.clients).values().flatten().cloned().collect();
        handles
            .into_iter()
            .filter(|h| h.clone().cancel_if(&hit, limit))
            .count()
    }

    /// Every client using a server at `addr`, by the server's process id, with what it had
    /// sent by now.
    pub fn seen_at(&self, addr: &ServerAddr) -> HashMap<u32, Seen> {
        let handles: Vec<Arc<ClientHandle>> =
            lock(&self.clients).values().flatten().cloned().collect();
        handles
            .into_iter()
            .filter_map(|handle| {
                let state = lock(&handle.state);
                let target = state.target.as_ref().filter(|t| *t.addr == *addr)?;
                let pid = target.key.pid;
                let (sent, owed, tenant) = (state.sent, state.owed, state.tenant.to_string());
                // (Busy with a statement the gate did not read: not the last one.)
                let idle = state.owed == 0;
                let fingerprint = state.fingerprint.or(state.last_run.filter(|_| idle));
                drop(state);
                Some((
                    pid,
                    Seen {
                        handle,
                        sent,
                        owed,
                        tenant,
                        fingerprint,
                    },
                ))
            })
            .collect()
    }

    pub fn remove(&self, handle: &ClientHandle) {
        let mut clients = lock(&self.clients);
        if let Some(same) = clients.get_mut(&handle.pid) {
            same.retain(|h| h.client_id != handle.client_id);
            if same.is_empty() {
                clients.remove(&handle.pid);
            }
        }
    }

    fn find(&self, pid: u32, secret: &[u8]) -> Option<Arc<ClientHandle>> {
        let clients = lock(&self.clients);
        clients
            .get(&pid)?
            .iter()
            .find(|h| wire::ct_eq(&h.secret, secret))
            .cloned()
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
        self.cancel_if(|_, _| true, limit)
    }

    /// [`cancel_now`](Self::cancel_now), if the work the client's server runs matches `hit`
    /// (tenant, fingerprint) as the cancel begins.
    fn cancel_if(
        self: Arc<Self>,
        hit: impl Fn(&str, Option<u64>) -> bool,
        limit: Duration,
    ) -> bool {
        let Some(target) = self.begin_cancel_if(hit) else {
            return false;
        };
        let in_flight = InFlight::new(self);
        tokio::spawn(async move {
            let delivery = deliver(&target, limit).await;
            in_flight.end(delivery);
        });
        true
    }
}

/// A cancel being delivered for a client; dropping it (whatever the path) ends it, as
/// unsure of having landed unless [`end`](Self::end) said how it went.
struct InFlight {
    handle: Arc<ClientHandle>,
    delivery: Delivery,
}

impl InFlight {
    fn new(handle: Arc<ClientHandle>) -> InFlight {
        InFlight {
            handle,
            delivery: Delivery::Unsure,
        }
    }

    fn end(mut self, delivery: Delivery) {
        self.delivery = delivery;
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.handle.end_cancel(self.delivery);
    }
}

/// How the delivery of a cancel ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Delivery {
    /// The postmaster took it and closed the connection: it has signalled the backend.
    Landed,
    /// It never reached the postmaster (no connection, or the time was up before).
    Unsent,
    /// The postmaster has it, but had not closed the connection when the time was up.
    Unsure,
}

/// A new key: 31 random bits of "process id" and 32 of secret, or under peering the
/// instance's id in the id's middle bytes and the forwarding budget set.
fn new_key(rng: &mut impl RngCore, peer_id: u16) -> (u32, [u8; 4]) {
    let mut key = [0u8; 8];
    rng.fill_bytes(&mut key);
    if peer_id > 0 {
        let [low, high] = peer_id.to_le_bytes();
        key[1] = low;
        key[2] = high;
        key[7] |= TTL_MASK;
    }
    // Always a positive process id: some clients mishandle a negative one.
    key[0] &= 0x7f;
    let pid = u32::from_be_bytes([key[0], key[1], key[2], key[3]]);
    (pid, [key[4], key[5], key[6], key[7]])
}

/// Where a cancel request goes under peering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerRoute {
    /// The key is this instance's: look it up here.
    Here,
    /// The key is instance `id`'s: forward it there (its budget was lowered by one).
    Peer(u16),
    /// The key's forwarding budget is spent: drop it.
    Spent,
}

/// Reads the instance id a key carries (as PgBouncer lays it out) and says where the cancel
/// goes; adjusts `secret` for that place: the budget bits set to compare with this instance's
/// keys, or lowered by one before forwarding.
pub fn peer_route(own: u16, pid: u32, secret: &mut [u8; 4]) -> PeerRoute {
    let [_, low, high, _] = pid.to_be_bytes();
    let owner = u16::from_le_bytes([low, high]);
    if owner == own {
        secret[3] |= TTL_MASK;
        return PeerRoute::Here;
    }
    if secret[3] & TTL_MASK == 0 {
        return PeerRoute::Spent;
    }
    secret[3] -= 1;
    PeerRoute::Peer(owner)
}

/// Forwards a cancel request to another pooler (a peer) as it came, and waits, within
/// `limit`, until the peer has closed that connection: the client's own cancel connection
/// stays open until then, as for a local cancel, so its next statement cannot be sent before
/// the cancel is delivered.
pub async fn forward(addr: ServerAddr, pid: u32, secret: [u8; 4], limit: Duration) {
    let target = CancelTarget {
        addr: Arc::new(addr),
        key: BackendKey {
            pid,
            secret: bytes::Bytes::copy_from_slice(&secret),
        },
    };
    deliver(&target, limit).await;
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

/// Cancels what a server runs, and waits (within `limit`) until the cancel is delivered: a
/// session whose client vanished uses it before it closes the server.
pub async fn cancel_and_wait(addr: &Arc<ServerAddr>, key: &BackendKey, limit: Duration) {
    let target = CancelTarget {
        addr: addr.clone(),
        key: key.clone(),
    };
    deliver(&target, limit).await;
}

/// Sends the cancel; `limit` bounds the whole delivery.
async fn deliver(target: &CancelTarget, limit: Duration) -> Delivery {
    let until = tokio::time::Instant::now() + limit;
    let mut stream = match tokio::time::timeout_at(until, send_cancel(target)).await {
        Ok(Ok(stream)) => stream,
        _ => {
            tracing::warn!(server = %target.addr, "cancel request could not be delivered");
            return Delivery::Unsent;
        }
    };
    // The postmaster closes the connection once it has signalled the backend (an error
    // reading is the connection closed too).
    let mut sink = [0u8; 64];
    let closed = async { while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {} };
    match tokio::time::timeout_at(until, closed).await {
        Ok(()) => Delivery::Landed,
        Err(_) => {
            tracing::warn!(
                server = %target.addr,
                "cancel request not known to have landed when its time was up"
            );
            Delivery::Unsure
        }
    }
}

/// Connects to the server's postmaster and writes the CancelRequest.
async fn send_cancel(
    target: &CancelTarget,
) -> Result<crate::net::Stream, crate::server::ServerError> {
    let mut stream = target
        .addr
        .connect(&crate::net::Keepalive::default())
        .await?;
    let mut out = BytesMut::new();
    wire::encode_cancel_request(&mut out, target.key.pid, &target.key.secret);
    stream.write_all(&out).await?;
    Ok(stream)
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
        let a = reg.register(1, 0);
        let b = reg.register(2, 0);
        assert_ne!(a.pid, b.pid);
        assert!(reg.find(a.pid, &a.secret()).is_some());
        let mut wrong = a.secret();
        wrong[0] ^= 1;
        assert!(reg.find(a.pid, &wrong).is_none());
        reg.remove(&a);
        assert!(reg.find(a.pid, &a.secret()).is_none());
    }

    #[test]
    fn peered_keys_carry_the_instance_and_a_forwarding_budget() {
        let reg = CancelRegistry::default();
        // Many clients share the few random bits of the process id; keys stay distinct.
        let handles: Vec<_> = (0..2000).map(|i| reg.register(i, 0x0203)).collect();
        for h in &handles {
            let [b0, low, high, _] = h.pid.to_be_bytes();
            assert_eq!((low, high), (0x03, 0x02));
            assert!(b0 < 0x80, "a positive process id");
            assert_eq!(h.secret()[3] & TTL_MASK, TTL_MASK);
            assert_eq!(reg.find(h.pid, &h.secret()).unwrap().client_id, h.client_id);
        }
        let h = &handles[7];
        // Here: found again even after a peer spent some of its budget.
        let mut secret = h.secret();
        secret[3] &= !TTL_MASK;
        assert_eq!(peer_route(0x0203, h.pid, &mut secret), PeerRoute::Here);
        assert_eq!(reg.find(h.pid, &secret).unwrap().client_id, h.client_id);
        // Elsewhere: forwarded with one less, until the budget is spent.
        let mut secret = h.secret();
        for left in (0..3).rev() {
            assert_eq!(peer_route(9, h.pid, &mut secret), PeerRoute::Peer(0x0203));
            assert_eq!(secret[3] & TTL_MASK, left);
        }
        assert_eq!(peer_route(9, h.pid, &mut secret), PeerRoute::Spent);
        reg.remove(h);
        assert!(reg.find(h.pid, &h.secret()).is_none());
        assert!(reg.find(handles[8].pid, &handles[8].secret()).is_some());
    }

    #[test]
    fn a_detached_client_cannot_be_cancelled() {
        let reg = CancelRegistry::default();
        let h = reg.register(1, 0);
        assert!(h.begin_cancel_if(|_, _| true).is_none());
        h.attach(target());
        assert!(h.begin_cancel_if(|_, _| true).is_some());
        assert!(!h.detach(), "a cancel in flight holds the server");
        h.end_cancel(Delivery::Landed);
        assert!(h.detach());
        assert!(h.begin_cancel_if(|_, _| true).is_none());
        assert!(!h.take_unsure());
    }

    #[test]
    fn a_kill_matches_the_statement_running_and_an_idle_session_shows_its_last() {
        let reg = CancelRegistry::default();
        let h = reg.register(1, 0);
        h.attach(target());
        h.note_sent(2, 2, Some(7));
        let seen = |reg: &CancelRegistry| reg.seen_at(&target().addr)[&7].fingerprint;
        assert_eq!(seen(&reg), Some(7));
        // The statement behind it is not what runs: no cancel begins.
        assert!(h.begin_cancel_if(|_, fp| fp == Some(8)).is_none());
        h.note_owed(1, Some(8));
        assert!(h.begin_cancel_if(|_, fp| fp == Some(7)).is_none());
        assert!(h.begin_cancel_if(|_, fp| fp == Some(8)).is_some());
        h.end_cancel(Delivery::Landed);
        // Idle in its transaction: nothing to cancel, but it is shown with what ran last.
        h.note_owed(0, None);
        assert_eq!(h.fingerprint(), None);
        assert!(h.begin_cancel_if(|_, fp| fp == Some(8)).is_none());
        assert_eq!(seen(&reg), Some(8));
    }

    #[test]
    fn a_cancel_not_known_to_have_landed_is_told_once() {
        let reg = CancelRegistry::default();
        let h = reg.register(1, 0);
        h.attach(target());
        assert!(h.begin_cancel_if(|_, _| true).is_some());
        h.end_cancel(Delivery::Unsure);
        assert!(h.detach());
        assert!(h.take_unsure());
        assert!(!h.take_unsure());
        h.attach(target());
        assert!(h.begin_cancel_if(|_, _| true).is_some());
        h.end_cancel(Delivery::Unsent);
        assert!(!h.take_unsure());
    }

    const REASON: OwnCancel = OwnCancel::LockQueue {
        waited: Duration::from_secs(3),
        queued: 2,
    };

    const LIMIT: Duration = Duration::from_millis(100);

    fn seen(reg: &CancelRegistry) -> (u64, usize) {
        let s = &reg.seen_at(&target().addr)[&7];
        (s.sent, s.owed)
    }

    #[tokio::test]
    async fn pgward_cancels_only_the_request_its_reading_saw() {
        let reg = CancelRegistry::default();
        let h = reg.register(1, 0);
        h.attach(target());
        // Two requests pipelined: the first may end and the second start before the cancel
        // lands, so neither is cancelled.
        assert!(!h.note_sent(2, 2, None));
        let two = seen(&reg);
        assert!(!h.cancel_seen(7, two, REASON, LIMIT));
        h.note_owed(1, None);
        assert!(!h.cancel_seen(7, two, REASON, LIMIT), "the second runs now");
        // One request, alone; then another sent after the reading was asked for.
        h.note_owed(0, None);
        assert!(!h.note_sent(3, 1, None));
        let one = seen(&reg);
        h.note_owed(0, None);
        assert!(!h.note_sent(4, 1, None));
        assert!(!h.cancel_seen(7, one, REASON, LIMIT), "a later request");
        // Another server process: not this client.
        let now = seen(&reg);
        assert!(!h.cancel_seen(8, now, REASON, LIMIT));
        // The request the reading saw, alone: cancelled once, and its 57014 says why.
        assert!(h.cancel_seen(7, now, REASON, LIMIT));
        assert!(h.cancels_in_flight());
        assert!(!h.cancel_seen(7, now, REASON, LIMIT));
        h.wait_cancels().await;
        assert_eq!(h.take_own_cancel(3), None, "another request's error");
        assert_eq!(h.take_own_cancel(4), Some(REASON));
        assert_eq!(h.take_own_cancel(4), None);
    }

    #[tokio::test]
    async fn a_cancel_that_found_its_request_answered_names_no_later_error() {
        let reg = CancelRegistry::default();
        let h = reg.register(1, 0);
        h.attach(target());
        assert!(!h.note_sent(1, 1, None));
        assert!(h.cancel_seen(7, seen(&reg), REASON, LIMIT));
        h.wait_cancels().await;
        // The request was answered before the cancel landed: its reason is forgotten, and
        // the next request's 57014 (the client's own cancel, a statement_timeout) is not
        // pgward's.
        h.note_owed(0, None);
        assert!(!h.note_sent(2, 1, None));
        assert_eq!(h.take_own_cancel(1), None);
        assert_eq!(h.take_own_cancel(2), None);
    }
}
