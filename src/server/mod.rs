//! One backend connection: login, simple queries pgward runs itself (parameter sync, reset,
//! check), and the state the pool needs to decide whether it is clean.

mod expect;
mod login;
mod lookup;
mod statements;

use std::io;
use std::sync::Arc;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::net::Stream;
use crate::params::{ParamSet, Tracked};
use crate::wire::{self, Backend, ErrorFields, Frame, TxStatus, WireError};

pub use expect::{Definition, Desync, Expected, Learned, Owed, Renamed, Reopen, Route, Skipped};
pub use login::connect;
pub use lookup::{OwnStatement, TextRow};
pub use statements::ServerStatements;

/// Where a server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerAddr {
    Tcp {
        host: String,
        port: u16,
    },
    /// A Unix socket: the directory and the port that names the socket file.
    Unix {
        dir: String,
        port: u16,
    },
}

impl ServerAddr {
    /// Connects; a TCP socket gets `keepalive`'s options.
    pub async fn connect(&self, keepalive: &crate::net::Keepalive) -> Result<Stream, ServerError> {
        match self {
            ServerAddr::Tcp { host, port } => {
                let addrs: Vec<std::net::SocketAddr> =
                    tokio::net::lookup_host((host.as_str(), *port))
                        .await
                        .map_err(ServerError::Dns)?
                        .collect();
                let s = tokio::net::TcpStream::connect(&addrs[..]).await?;
                s.set_nodelay(true)?;
                keepalive.apply(&s)?;
                Ok(Stream::from(s))
            }
            ServerAddr::Unix { dir, .. } if dir.is_empty() => {
                // A database without a host, and no unix_socket_dir (PgBouncer's words).
                Err(ServerError::Auth(
                    "unix socket dir not configured".to_string(),
                ))
            }
            ServerAddr::Unix { dir, port } => {
                let addr = crate::net::unix_socket_addr(dir, *port)?;
                Ok(Stream::from(crate::net::connect_unix(addr).await?))
            }
        }
    }
}

impl std::fmt::Display for ServerAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ServerAddr::Tcp { host, port } => write!(f, "{host}:{port}"),
            ServerAddr::Unix { dir, port } => write!(f, "{dir}/.s.PGSQL.{port}"),
        }
    }
}

/// What pgward proves to the server with, when it asks.
#[derive(Clone, Default)]
pub enum Credential {
    /// No password known: only trust (or peer) logins work.
    #[default]
    None,
    Password(String),
    /// An MD5 secret (`md5` + 32 hex digits): answers an MD5 challenge without the password.
    Md5Secret(String),
    /// The SCRAM keys a client proved against a stored SCRAM secret.
    ScramKeys {
        client_key: [u8; 32],
        server_key: [u8; 32],
    },
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self {
            Credential::None => "none",
            Credential::Password(_) => "password",
            Credential::Md5Secret(_) => "md5 secret",
            Credential::ScramKeys { .. } => "scram keys",
        };
        f.write_str(kind)
    }
}

/// The servers a pool logs in to: one address, or a `host` list walked as
/// `load_balance_hosts` says (round-robin: each new connection takes the next; disable: the
/// same one until a connection to it fails).
#[derive(Debug)]
pub struct Hosts {
    addrs: Vec<Arc<ServerAddr>>,
    round_robin: bool,
    /// The next entry (round-robin, modulo the list's length) or the current one (disable).
    next: std::sync::atomic::AtomicUsize,
    /// Without round-robin: a connection to the current entry has succeeded since it became
    /// current.
    proven: std::sync::atomic::AtomicBool,
    /// The PostgreSQL server(s) as the admission gate names them: `host:port`, a list's
    /// entries joined by commas.
    label: String,
}

impl Hosts {
    /// A list of at least one address.
    pub fn new(addrs: Vec<ServerAddr>, round_robin: bool) -> Hosts {
        assert!(!addrs.is_empty(), "a host list has at least one entry");
        let label = addrs
            .iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>()
            .join(",");
        Hosts {
            label,
            addrs: addrs.into_iter().map(Arc::new).collect(),
            round_robin,
            next: Default::default(),
            proven: Default::default(),
        }
    }

    /// The upstream these servers are, for the admission gate's lanes: every pool pooled
    /// onto the same PostgreSQL server shares them.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Whether there is more than one entry.
    pub fn is_list(&self) -> bool {
        self.addrs.len() > 1
    }

    /// The first entry, which names the pool's server in logs and the console.
    pub fn first(&self) -> &Arc<ServerAddr> {
        &self.addrs[0]
    }

    /// The address for a new connection, with its place in the list.
    pub fn pick(&self) -> (usize, Arc<ServerAddr>) {
        use std::sync::atomic::Ordering;
        let n = self.addrs.len();
        let i = match self.round_robin {
            true => self.next.fetch_add(1, Ordering::Relaxed) % n,
            false => self.next.load(Ordering::Relaxed) % n,
        };
        (i, self.addrs[i].clone())
    }

    /// A connection to entry `i` failed: without round-robin, the next one is used from now
    /// on (unless another failure moved on already).
    pub fn failed(&self, i: usize) {
        use std::sync::atomic::Ordering;
        if !self.round_robin {
            let next = (i + 1) % self.addrs.len();
            let moved = self
                .next
                .compare_exchange(i, next, Ordering::AcqRel, Ordering::Relaxed);
            if moved.is_ok() {
                self.proven.store(false, Ordering::Release);
            }
        }
    }

    /// A connection to entry `i` succeeded.
    pub fn succeeded(&self, i: usize) {
        use std::sync::atomic::Ordering;
        if !self.round_robin && self.next.load(Ordering::Acquire) % self.addrs.len() == i {
            self.proven.store(true, Ordering::Release);
        }
    }

    /// Whether a pool should open one server at a time for now: a list walked without
    /// round-robin whose current entry has not been reached yet (as PgBouncer, which opens
    /// one at a time always, each failure then costs one attempt, not one per waiter).
    pub fn probing(&self) -> bool {
        !self.round_robin
            && self.is_list()
            && !self.proven.load(std::sync::atomic::Ordering::Acquire)
    }
}

/// Everything needed to open a server connection for one pool.
#[derive(Debug, Clone)]
pub struct ServerTarget {
    pub hosts: Arc<Hosts>,
    pub database: String,
    pub user: String,
    /// Startup parameters sent at login (client_encoding, DateStyle, TimeZone,
    /// application_name from the connection string).
    pub startup_params: Vec<(String, String)>,
    pub connect_query: Option<String>,
    /// Whether and how TLS is asked for (TCP servers only).
    pub tls: crate::edge::tls::ServerTls,
    /// TCP keepalive and user timeout of its sockets.
    pub keepalive: crate::net::Keepalive,
    /// The routine log lines written for its connections.
    pub log: crate::config::LogLines,
}

/// The key the server gave at login, to cancel what it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendKey {
    pub pid: u32,
    pub secret: Bytes,
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("server connection failed: {0}")]
    Io(#[from] io::Error),
    #[error("server DNS lookup failed: {0}")]
    Dns(io::Error),
    #[error("server sent a malformed message: {0}")]
    Wire(#[from] WireError),
    #[error("server did not answer within server_connect_timeout")]
    Timeout,
    #[error("server closed the connection")]
    Closed,
    #[error("{} {}", .0.severity().unwrap_or("ERROR"), .0.text())]
    Refused(ErrorFields),
    #[error("server login failed: {0}")]
    Auth(String),
    #[error("server protocol error: {0}")]
    Protocol(&'static str),
}

impl ServerError {
    /// Whether trying again soon may succeed (network trouble, a server starting up or
    /// shutting down), as opposed to an answer that will not change (bad password, no such
    /// database).
    pub fn is_transient(&self) -> bool {
        match self {
            ServerError::Io(_)
            | ServerError::Dns(_)
            | ServerError::Timeout
            | ServerError::Closed => true,
            ServerError::Refused(fields) => {
                matches!(fields.sqlstate(), "57P03" | "57P01" | "57P02" | "53300")
            }
            _ => false,
        }
    }

    /// PgBouncer's words for a server connection that could not be opened: the server's own
    /// message when it refused the login.
    pub fn closing_reason(&self) -> &str {
        match self {
            ServerError::Dns(_) => "server DNS lookup failed",
            ServerError::Io(_) => "connect failed",
            ServerError::Timeout => "connect timeout",
            ServerError::Refused(fields) => fields.text(),
            _ => "login failed",
        }
    }
}

/// A logged-in backend connection.
#[derive(Debug)]
pub struct ServerConn {
    pub id: u64,
    pub stream: Stream,
    /// Bytes read from the server and not yet handled.
    pub rbuf: BytesMut,
    /// Tracked parameters as the server last reported them.
    pub params: ParamSet,
    /// Every ParameterStatus of the login, in order.
    pub welcome: Vec<(String, String)>,
    pub key: BackendKey,
    pub addr: Arc<ServerAddr>,
    pub created: Instant,
    pub last_used: Instant,
    pub tx: TxStatus,
    /// False once anything left the connection in a state that must not be reused.
    pub reusable: bool,
    /// Protocol-level statements pgward prepared here (transaction pooling).
    pub statements: ServerStatements,
    /// A statement pgward sent on its own is still running: the connection is not clean
    /// until it has been answered, even if whoever waited for it went away.
    pub internal_busy: bool,
    /// The tenant whose work it last ran (under a policy): runaway eviction closes the
    /// idle servers of a tenant over its share.
    pub last_tenant: Option<Arc<str>>,
    /// The worker thread whose reactor serves its socket (with several threads): the one that
    /// opened it for a pool, or the last session's that moved it there (see
    /// [`crate::workers`]).
    pub home: Option<crate::workers::WorkerId>,
    max_message: usize,
}

impl ServerConn {
    /// Whether the connection can go back to the pool: idle, nothing unread, not broken.
    pub fn is_clean(&self) -> bool {
        self.reusable && !self.internal_busy && self.tx == TxStatus::Idle && self.rbuf.is_empty()
    }

    /// The largest message accepted from this server.
    pub fn max_message(&self) -> usize {
        self.max_message
    }

    /// Marks the connection as not to be reused.
    pub fn poison(&mut self) {
        self.reusable = false;
    }

    /// Serves the socket from worker thread `home`'s reactor (the caller runs there), moving
    /// it if it is elsewhere; a TLS connection stays where it is. Whether it left another
    /// worker thread's reactor (a connection with no home, opened where pgward did not note
    /// the thread, is registered anew, and that is not counted). On an error the connection
    /// is lost and poisoned.
    pub fn rehome(&mut self, home: crate::workers::WorkerId) -> io::Result<bool> {
        if self.home == Some(home) {
            return Ok(false);
        }
        match self.stream.rehome() {
            Ok(true) => Ok(self.home.replace(home).is_some()),
            Ok(false) => Ok(false),
            Err(e) => {
                self.poison();
                Err(e)
            }
        }
    }

    /// Whether an idle connection is still open: an idle server sends nothing, so readable
    /// data or end of stream means the server went away (or told us why before it did), or
    /// sent a notification nobody listens for any more.
    pub fn is_alive(&self) -> bool {
        if !self.stream.readable_now() {
            return true;
        }
        let mut probe = [0u8; 1];
        match self.stream.try_read(&mut probe) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => true,
            Ok(1) if probe[0] == wire::backend::tag::NOTIFICATION_RESPONSE => {
                tracing::warn!(server = self.id, "a notification reached an idle server and was dropped: LISTEN does not work under transaction pooling; closing that server");
                false
            }
            _ => false,
        }
    }

    /// Reads one whole message.
    pub async fn read_frame(&mut self) -> Result<Frame, ServerError> {
        loop {
            if let Some(frame) = wire::decode_frame(&mut self.rbuf, self.max_message)? {
                return Ok(frame);
            }
            wire::room_for_read(&mut self.rbuf);
            if self.stream.read_buf(&mut self.rbuf).await? == 0 {
                self.reusable = false;
                return Err(ServerError::Closed);
            }
        }
    }

    pub async fn send(&mut self, bytes: &[u8]) -> Result<(), ServerError> {
        if let Err(e) = self.stream.write_all(bytes).await {
            self.reusable = false;
            return Err(e.into());
        }
        Ok(())
    }

    /// Runs `sql` with the simple query protocol and reads to ReadyForQuery, keeping the
    /// tracked parameters it reports. Rows and notices are dropped; the first error is
    /// returned after ReadyForQuery, so the connection stays in step.
    pub async fn simple_query(&mut self, sql: &str, tracked: &Tracked) -> Result<(), ServerError> {
        let mut out = BytesMut::new();
        wire::encode_query(&mut out, sql);
        self.internal_busy = true;
        self.send(&out).await?;
        let mut failure = None;
        loop {
            let frame = match self.read_frame().await {
                Ok(frame) => frame,
                // A server that went away may have said why first (FATAL 57P01, ...).
                Err(e) => {
                    self.reusable = false;
                    return Err(failure.map_or(e, ServerError::Refused));
                }
            };
            match wire::decode_backend(&frame)? {
                Backend::ReadyForQuery(status) => {
                    self.tx = status;
                    self.internal_busy = false;
                    return failure.map_or(Ok(()), |f| Err(ServerError::Refused(f)));
                }
                Backend::ErrorResponse(fields) => {
                    failure.get_or_insert(fields);
                }
                Backend::ParameterStatus { name, value } => {
                    self.note_parameter(&name, &value, tracked);
                }
                Backend::CommandComplete { tag }
                    if &tag[..] == b"DISCARD ALL" || &tag[..] == b"DEALLOCATE ALL" =>
                {
                    // The server's prepared statements are gone (server_reset_query), and
                    // after DISCARD ALL the settings PostgreSQL does not report are at their
                    // defaults.
                    self.statements.clear();
                    if &tag[..] == b"DISCARD ALL" {
                        self.params.reset_unreported();
                    }
                }
                // RESET ALL as the reset query puts them back at their defaults; another
                // RESET (RESET ROLE has the same tag) leaves them as they were, which pgward
                // cannot tell apart in a longer text: unknown then.
                Backend::CommandComplete { tag } if &tag[..] == b"RESET" => {
                    match is_reset_all(sql) {
                        true => self.params.reset_unreported(),
                        false => self.params.forget_unreported(),
                    }
                }
                Backend::CopyInResponse | Backend::CopyBothResponse => {
                    self.reusable = false;
                    return Err(ServerError::Protocol(
                        "unexpected COPY in an internal query",
                    ));
                }
                _ => {}
            }
        }
    }

    /// Runs an operator's SQL (`connect_query`, `server_reset_query`) as
    /// [`simple_query`](Self::simple_query); a text that names a setting PostgreSQL never
    /// reports leaves that setting's value unknown (the next client has its own set).
    pub async fn run_configured(
        &mut self,
        sql: &str,
        tracked: &Tracked,
    ) -> Result<(), ServerError> {
        let result = self.simple_query(sql, tracked).await;
        if crate::params::names_unreported(sql.as_bytes()) {
            self.params.forget_unreported();
        }
        result
    }

    /// Records a ParameterStatus the server sent; returns the canonical name if tracked.
    pub fn note_parameter<'t>(
        &mut self,
        name: &str,
        value: &str,
        tracked: &'t Tracked,
    ) -> Option<&'t str> {
        let canonical = tracked.canonical(name)?;
        self.params.set(canonical, value);
        Some(canonical)
    }

    /// Ends the connection politely.
    pub async fn terminate(mut self) {
        let mut out = BytesMut::new();
        wire::encode_terminate(&mut out);
        let _ = self.stream.write_all(&out).await;
        let _ = self.stream.shutdown().await;
    }
}

/// Whether `sql` is `RESET ALL` alone (any case, spaces, a final `;`).
fn is_reset_all(sql: &str) -> bool {
    let words: Vec<&str> = sql
        .trim()
        .trim_end_matches(';')
        .split_whitespace()
        .collect();
    matches!(words.as_slice(), [a, b] if a.eq_ignore_ascii_case("reset") && b.eq_ignore_ascii_case("all"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A database without a host and no unix_socket_dir is refused with PgBouncer's words, for
    /// good (not tried again as a socket in the file system's root).
    #[tokio::test]
    async fn a_socket_without_a_directory_is_refused() {
        let addr = ServerAddr::Unix {
            dir: String::new(),
            port: 5432,
        };
        let Err(err) = addr.connect(&crate::net::Keepalive::default()).await else {
            panic!("connected to a socket without a directory");
        };
        assert!(!err.is_transient(), "{err}");
        assert!(
            err.to_string().contains("unix socket dir not configured"),
            "{err}"
        );
    }

    #[test]
    fn only_reset_all_alone_is_taken_for_reset_all() {
        for sql in ["RESET ALL", "reset all;", "  Reset   ALL ; "] {
            assert!(is_reset_all(sql), "{sql}");
        }
        for sql in [
            "RESET ROLE",
            "RESET ALL; SET x = 1",
            "RESET",
            "DISCARD ALL",
            "",
        ] {
            assert!(!is_reset_all(sql), "{sql}");
        }
    }

    fn hosts(round_robin: bool) -> Hosts {
        let addr = |host: &str| ServerAddr::Tcp {
            host: host.into(),
            port: 5432,
        };
        Hosts::new(vec![addr("a"), addr("b"), addr("c")], round_robin)
    }

    fn host_of(pick: (usize, Arc<ServerAddr>)) -> String {
        match &*pick.1 {
            ServerAddr::Tcp { host, .. } => host.clone(),
            ServerAddr::Unix { dir, .. } => dir.clone(),
        }
    }

    #[test]
    fn round_robin_takes_the_next_host_for_each_connection() {
        let h = hosts(true);
        let got: Vec<String> = (0..4).map(|_| host_of(h.pick())).collect();
        assert_eq!(got, ["a", "b", "c", "a"]);
        h.failed(0);
        assert_eq!(
            host_of(h.pick()),
            "b",
            "a failure does not move round-robin"
        );
    }

    #[test]
    fn disable_stays_on_one_host_until_it_fails() {
        let h = hosts(false);
        assert_eq!(host_of(h.pick()), "a");
        assert_eq!(host_of(h.pick()), "a");
        h.failed(0);
        assert_eq!(host_of(h.pick()), "b");
        // A second failure of the host already left behind changes nothing.
        h.failed(0);
        assert_eq!(host_of(h.pick()), "b");
        h.failed(1);
        h.failed(2);
        assert_eq!(host_of(h.pick()), "a", "the list wraps around");
    }

    #[test]
    fn a_list_without_round_robin_probes_until_its_current_host_answers() {
        let h = hosts(false);
        assert!(h.probing());
        h.succeeded(1);
        assert!(h.probing(), "a success on another entry proves nothing");
        h.succeeded(0);
        assert!(!h.probing());
        h.failed(0);
        assert!(h.probing(), "a new current host is unproven");
        assert!(!hosts(true).probing());
    }
}
