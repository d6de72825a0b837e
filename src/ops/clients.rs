//! Every connected client, for SHOW CLIENTS, SHOW SERVERS, KILL and the shutdown modes: who it
//! is, where it stands (idle, waiting for a server, active on one), and which server it holds.

use std::collections::BTreeMap;
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use crate::net::Stream;
use crate::pool::lock;
use crate::server::{ServerAddr, ServerConn};

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

/// One connected client.
#[derive(Debug)]
pub struct ClientEntry {
    pub id: u64,
    /// The peer's address (`unix` for a Unix socket) and port.
    pub addr: String,
    pub port: u16,
    pub local_addr: String,
    pub local_port: u16,
    pub connect_time: SystemTime,
    /// The socket, to end the connection from outside (KILL); valid while registered.
    fd: RawFd,
    info: Mutex<ClientInfo>,
}

impl ClientEntry {
    pub fn info(&self) -> ClientInfo {
        lock(&self.info).clone()
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
        let mut i = lock(&self.info);
        i.user = user.to_string();
        i.pool_user = pool_user.to_string();
        i.database = database.to_string();
        i.application_name = application_name.to_string();
        i.admin = admin;
        i.state = ClientState::Idle;
    }

    pub fn set_waiting(&self, since: Instant) {
        let mut i = lock(&self.info);
        i.state = ClientState::Waiting;
        i.wait_since = Some(since);
        i.request_time = SystemTime::now();
    }

    pub fn set_active(&self, server: ServerLink) {
        let mut i = lock(&self.info);
        i.state = ClientState::Active;
        i.wait_since = None;
        i.server = Some(server);
    }

    pub fn set_idle(&self) {
        let mut i = lock(&self.info);
        i.state = ClientState::Idle;
        i.wait_since = None;
        i.server = None;
    }

    pub fn is_admin(&self) -> bool {
        lock(&self.info).admin
    }

    /// Ends the connection: both directions are shut down, so the session sees the client
    /// leave and closes (or returns) its server as it would for any client that left.
    fn shut_down(&self) {
        // SAFETY: `fd` is the client's socket, which stays open while this entry is
        // registered (the registration drops before the socket); shutdown(2) touches no
        // memory of ours.
        unsafe {
            libc::shutdown(self.fd, libc::SHUT_RDWR);
        }
    }
}

/// Every connected client by id.
#[derive(Debug, Default)]
pub struct ClientRegistry {
    clients: Mutex<BTreeMap<u64, Arc<ClientEntry>>>,
}

/// Keeps a client registered; dropping it removes the client. It must be dropped before the
/// client's socket is closed.
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
    /// Registers a client that just connected on `stream`.
    pub fn register<'a>(&'a self, id: u64, stream: &Stream) -> Registration<'a> {
        let ((addr, port), (local_addr, local_port)) = stream_addresses(stream);
        let now = SystemTime::now();
        let entry = Arc::new(ClientEntry {
            id,
            addr,
            port,
            local_addr,
            local_port,
            connect_time: now,
            fd: stream_fd(stream),
            info: Mutex::new(ClientInfo {
                user: String::new(),
                database: String::new(),
                pool_user: String::new(),
                application_name: String::new(),
                admin: false,
                state: ClientState::Login,
                request_time: now,
                wait_since: None,
                server: None,
            }),
        });
        lock(&self.clients).insert(id, entry.clone());
        Registration {
            registry: self,
            entry,
        }
    }

    /// Every client, by id.
    pub fn all(&self) -> Vec<Arc<ClientEntry>> {
        lock(&self.clients).values().cloned().collect()
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
                entry.shut_down();
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
            .filter(|c| {
                let i = lock(&c.info);
                !i.admin && i.state != ClientState::Login && matches(&i.database)
            })
            .map(|c| c.id)
            .collect();
        for id in &doomed {
            if let Some(entry) = clients.remove(id) {
                entry.shut_down();
            }
        }
        doomed.len()
    }
}

fn stream_fd(stream: &Stream) -> RawFd {
    stream.raw_fd()
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
