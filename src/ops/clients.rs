//! Every connected client, for SHOW CLIENTS, SHOW SERVERS, KILL and the shutdown modes: who it
//! is, where it stands (idle, waiting for a server, active on one), and which server it holds.

use std::collections::{BTreeMap, HashSet};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use crate::net::Stream;
use crate::server::{ServerAddr, ServerConn};
use crate::sync::lock;
use crate::wire::{sqlstate, ErrorResponse};

/// Where a client stands, as SHOW CLIENTS names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientState {
    /// Still starting up or authenticating.
    Login,
    /// Logged in, holding no server and asking for none.
    Idle,
    /// Waiting for a server (or for a paused database to resume).
    Waiting,
    /// Holding a server.
    Active,
}

impl ClientState {
    const ALL: [ClientState; 4] = [
        ClientState::Login,
        ClientState::Idle,
        ClientState::Waiting,
        ClientState::Active,
    ];

    fn from_u8(n: u8) -> ClientState {
        Self::ALL
            .get(usize::from(n))
            .copied()
            .unwrap_or(ClientState::Login)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ClientState::Login => "login",
            ClientState::Idle => "idle",
            ClientState::Waiting => "waiting",
            ClientState::Active => "active",
        }
    }
}

/// The server a client holds, as SHOW SERVERS shows it.
#[derive(Debug, Clone)]
pub struct ServerLink {
    pub id: u64,
    pub pid: u32,
    pub addr: Arc<ServerAddr>,
    /// When the server was opened, to tell servers opened before a RECONNECT.
    pub created: Instant,
}

impl ServerLink {
    pub fn of(conn: &ServerConn) -> ServerLink {
        ServerLink {
            id: conn.id,
            pid: conn.key.pid,
            addr: conn.addr.clone(),
            created: conn.created,
        }
    }

    /// When the server was opened, by the wall clock.
    pub fn connected_at(&self) -> SystemTime {
        wall_clock(self.created)
    }
}

/// The wall-clock time of a monotonic instant in the past.
pub fn wall_clock(at: Instant) -> SystemTime {
    SystemTime::now()
        .checked_sub(at.elapsed())
        .unwrap_or(SystemTime::UNIX_EPOCH)
}

/// What changes about a client after it connected.
#[derive(Debug, Clone)]
pub struct ClientInfo {
    pub user: String,
    pub database: String,
    /// The user of the pool it uses: the database's forced user, or `user`.
    pub pool_user: String,
    pub application_name: String,
    pub admin: bool,
    pub state: ClientState,
    pub request_time: SystemTime,
    /// When it began waiting, while it waits.
    pub wait_since: Option<Instant>,
    pub server: Option<ServerLink>,
}

/// Who the client is (set once at login) and the last server it took.
#[derive(Debug, Clone, Default)]
struct Identity {
    user: String,
    database: String,
    pool_user: String,
    application_name: String,
    admin: bool,
    /// Meaningful while the state is `Active` only: a client giving its server back just
    /// changes its state.
    server: Option<ServerLink>,
}

/// One connected client.
///
/// A session changes its state at every transaction (waiting, active, idle): the state and
/// the moment of the last request are atomics, so those changes take no lock but the one
/// that records which server the client took.
#[derive(Debug)]
pub struct ClientEntry {
    pub id: u64,
    /// The peer's address (`unix` for a Unix socket) and port.
    pub addr: String,
    pub port: u16,
    pub local_addr: String,
    pub local_port: u16,
    pub connect_time: SystemTime,
    /// The monotonic moment of `connect_time`; request times are kept relative to it.
    connected: Instant,
    /// A second descriptor of the client's socket, to end the connection from outside
    /// (KILL). It keeps the socket open as long as the entry lives, which ends with the
    /// connection's task.
    fd: OwnedFd,
    state: AtomicU8,
    /// When the last request began waiting for a server, in nanoseconds after `connected`,
    /// plus one; zero before the first request.
    request: AtomicU64,
    identity: Mutex<Identity>,
    /// The console ended the connection: 0 not, else a [`Kill`] as a number.
    killed: AtomicU8,
}

/// How the console ended a client's connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kill {
    /// KILL_CLIENT.
    Client = 1,
    /// KILL of its database (or of every database).
    Database = 2,
}

impl Kill {
    /// What the client is told as its connection ends: PgBouncer's words (KILL_CLIENT's, and
    /// kill_pool's for KILL), with the SQLSTATE PostgreSQL gives a connection its
    /// administrator ended (57P01, as pg_terminate_backend).
    pub fn farewell(self) -> ErrorResponse {
        let reason = super::routine::ClientEnd::Killed(self).reason();
        ErrorResponse::fatal(sqlstate::ADMIN_SHUTDOWN, reason)
    }
}

/// How long a client the console ended has to be told so: its session sees its reads end at
/// once, stops what the client left running, and writes the error; a session that does not
/// get to read (its client reads nothing of what it is sent, and the session waits to write)
/// is cut off whole after this.
pub const KILL_GRACE: Duration = Duration::from_secs(2);

impl ClientEntry {
    pub fn info(&self) -> ClientInfo {
        // The state first: writers set the identity before the state they publish, so the
        // identity read after it is at least as new (the server shown is the one in use).
        let state = self.state();
        let request = self.request_instant();
        let identity = lock(&self.identity).clone();
        ClientInfo {
            user: identity.user,
            database: identity.database,
            pool_user: identity.pool_user,
            application_name: identity.application_name,
            admin: identity.admin,
            state,
            request_time: request.map_or(self.connect_time, wall_clock),
            wait_since: request.filter(|_| state == ClientState::Waiting),
            server: identity.server.filter(|_| state == ClientState::Active),
        }
    }

    /// How the console ended the connection, if it did.
    pub fn killed(&self) -> Option<Kill> {
        match self.killed.load(Ordering::Acquire) {
            1 => Some(Kill::Client),
            2 => Some(Kill::Database),
            _ => None,
        }
    }

    /// How long the client has been connected.
    pub fn age(&self) -> Duration {
        self.connected.elapsed()
    }

    pub fn state(&self) -> ClientState {
        ClientState::from_u8(self.state.load(Ordering::Acquire))
    }

    fn set_state(&self, state: ClientState) {
        self.state.store(state as u8, Ordering::Release);
    }

    /// The moment the last request began, if there was one.
    fn request_instant(&self) -> Option<Instant> {
        let n = self.request.load(Ordering::Acquire).checked_sub(1)?;
        self.connected.checked_add(Duration::from_nanos(n))
    }

    /// Fills in who the client is once it has logged in; `pool_user` is the user of the
    /// pool it uses.
    pub fn logged_in(
        &self,
        user: &str,
        database: &str,
        pool_user: &str,
        application_name: &str,
        admin: bool,
    ) {
        self.identify(user, database, pool_user, application_name, admin);
        self.set_state(ClientState::Idle);
    }

    /// Who the client is, once its login is checked. A client that then waits for the
    /// parameters its pool's server will greet it with (the pool's first server, or one
    /// logged in after a RECONNECT) is set waiting: it is counted among its pool's waiting
    /// clients, as PgBouncer counts a client waiting to finish its login.
    pub fn identify(
        &self,
        user: &str,
        database: &str,
        pool_user: &str,
        application_name: &str,
        admin: bool,
    ) {
        let mut i = lock(&self.identity);
        i.user = user.to_string();
        i.pool_user = pool_user.to_string();
        i.database = database.to_string();
        i.application_name = application_name.to_string();
        i.admin = admin;
    }

    /// The client asked for a server at `since` and waits for one.
    pub fn set_waiting(&self, since: Instant) {
        self.note_request(since);
        self.set_state(ClientState::Waiting);
    }

    /// A request began at `since` (SHOW CLIENTS' request_time), whatever its state.
    pub fn note_request(&self, since: Instant) {
        let offset = since.saturating_duration_since(self.connected).as_nanos();
        let offset = u64::try_from(offset).unwrap_or(u64::MAX - 1) + 1;
        self.request.store(offset, Ordering::Release);
    }

    pub fn set_active(&self, server: ServerLink) {
        lock(&self.identity).server = Some(server);
        self.set_state(ClientState::Active);
    }

    pub fn set_idle(&self) {
        self.set_state(ClientState::Idle);
    }

    pub fn is_admin(&self) -> bool {
        lock(&self.identity).admin
    }

    /// The database the client logged in to, unless it is still logging in or uses the
    /// console.
    fn pool_database(&self) -> Option<String> {
        if self.state() == ClientState::Login {
            return None;
        }
        let i = lock(&self.identity);
        (!i.admin).then(|| i.database.clone())
    }

    /// Ends the connection: its reading side is shut down, so the session sees the client
    /// leave, closes (or returns) its server as it would for any client that left, and tells
    /// the client why ([`Kill::farewell`]) before it closes; both directions are shut down
    /// [`KILL_GRACE`] later, for a session that never got to read.
    fn shut_down(self: &Arc<Self>, why: Kill) {
        self.killed.store(why as u8, Ordering::Release);
        let socket = socket2::SockRef::from(&self.fd);
        let cut_off = |entry: &ClientEntry| {
            let _ = socket2::SockRef::from(&entry.fd).shutdown(std::net::Shutdown::Both);
        };
        let later = tokio::runtime::Handle::try_current();
        match (socket.shutdown(std::net::Shutdown::Read), later) {
            (Ok(()), Ok(runtime)) => {
                let entry = Arc::clone(self);
                runtime.spawn(async move {
                    tokio::time::sleep(KILL_GRACE).await;
                    cut_off(&entry);
                });
            }
            _ => cut_off(self),
        }
    }
}

/// Every connected client by id.
#[derive(Debug, Default)]
pub struct ClientRegistry {
    clients: Mutex<BTreeMap<u64, Arc<ClientEntry>>>,
}

/// Keeps a client registered; dropping it removes the client.
#[derive(Debug)]
pub struct Registration<'a> {
    registry: &'a ClientRegistry,
    pub entry: Arc<ClientEntry>,
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        lock(&self.registry.clients).remove(&self.entry.id);
    }
}

impl ClientRegistry {
    /// Registers a client that just connected on `stream`; `None` when the socket's second
    /// descriptor cannot be had (the process is out of descriptors): such a client could not
    /// be killed, so it must not be served.
    pub fn register<'a>(&'a self, id: u64, stream: &Stream) -> Option<Registration<'a>> {
        let fd = stream.clone_fd()?;
        let ((addr, port), (local_addr, local_port)) = stream_addresses(stream);
        let entry = Arc::new(ClientEntry {
            id,
            addr,
            port,
            local_addr,
            local_port,
            connect_time: SystemTime::now(),
            connected: Instant::now(),
            fd,
            state: AtomicU8::new(ClientState::Login as u8),
            request: AtomicU64::new(0),
            identity: Mutex::new(Identity::default()),
            killed: AtomicU8::new(0),
        });
        lock(&self.clients).insert(id, entry.clone());
        Some(Registration {
            registry: self,
            entry,
        })
    }

    /// Every client, by id.
    pub fn all(&self) -> Vec<Arc<ClientEntry>> {
        lock(&self.clients).values().cloned().collect()
    }

    /// The pools that have a client now, as (database, pool user).
    pub fn pools_with_clients(&self) -> HashSet<(String, String)> {
        self.all()
            .iter()
            .filter(|c| !c.is_admin())
            .map(|c| {
                let identity = lock(&c.identity);
                (identity.database.clone(), identity.pool_user.clone())
            })
            .collect()
    }

    /// Clients that came for a pool (not the console) and are still connected.
    pub fn pool_clients(&self) -> usize {
        self.all().iter().filter(|c| !c.is_admin()).count()
    }

    /// Ends client `id`; false if there is no such client.
    pub fn kill(&self, id: u64) -> bool {
        let mut clients = lock(&self.clients);
        match clients.remove(&id) {
            Some(entry) => {
                entry.shut_down(Kill::Client);
                true
            }
            None => false,
        }
    }

    /// Ends every logged-in client of the pools for which `matches(database)` holds; the
    /// console's clients are left alone. Returns how many were ended.
    pub fn kill_where(&self, matches: impl Fn(&str) -> bool) -> usize {
        let mut clients = lock(&self.clients);
        let doomed: Vec<u64> = clients
            .values()
            .filter(|c| c.pool_database().is_some_and(|db| matches(&db)))
            .map(|c| c.id)
            .collect();
        for id in &doomed {
            if let Some(entry) = clients.remove(id) {
                entry.shut_down(Kill::Database);
            }
        }
        doomed.len()
    }
}

type Endpoint = (String, u16);

fn stream_addresses(stream: &Stream) -> (Endpoint, Endpoint) {
    match stream.tcp() {
        Some(s) => {
            let split = |a: std::io::Result<std::net::SocketAddr>| {
                a.map(|a| (a.ip().to_string(), a.port()))
                    .unwrap_or_else(|_| ("?".into(), 0))
            };
            (split(s.peer_addr()), split(s.local_addr()))
        }
        None => (("unix".into(), 0), ("unix".into(), 0)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn a_request_is_timed_whether_or_not_it_waits() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let _peer = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        accepted.set_nonblocking(true).unwrap();
        let stream = Stream::client_tcp(tokio::net::TcpStream::from_std(accepted).unwrap());
        let registry = ClientRegistry::default();
        let registration = registry.register(3, &stream).expect("registered");
        let entry = &registration.entry;
        assert!(entry.request_instant().is_none());
        entry.set_state(ClientState::Active);
        let now = Instant::now();
        entry.note_request(now);
        assert!(entry.request_instant().is_some_and(|t| t <= now));
        assert_eq!(entry.state(), ClientState::Active);
    }

    #[tokio::test]
    async fn kill_ends_a_registered_connection_and_a_socketless_one_is_not_registered() {
        let registry = ClientRegistry::default();
        assert!(registry.register(1, &Stream::Detached).is_none());
        assert!(registry.all().is_empty());

        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut peer = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        accepted.set_nonblocking(true).unwrap();
        let mut stream = Stream::client_tcp(tokio::net::TcpStream::from_std(accepted).unwrap());
        let registration = registry.register(2, &stream).expect("registered");
        assert_eq!(registry.all().len(), 1);
        assert!(registry.kill(2));
        let mut byte = [0u8; 1];
        // The session's reads end at once; it may still write (the client is told why).
        let read = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut byte));
        assert_eq!(read.await.expect("the read ended").unwrap(), 0);
        stream.write_all(b"E").await.unwrap();
        // After the grace the peer sees the end, though nothing else closed the socket.
        tokio::time::sleep(KILL_GRACE + Duration::from_millis(200)).await;
        peer.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert_eq!(peer.read(&mut byte).unwrap(), 1);
        assert_eq!(peer.read(&mut byte).unwrap(), 0, "the peer saw no end");
        drop(registration);
        assert!(!registry.kill(2));
    }
}
