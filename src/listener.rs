//! Listening sockets: TCP (`listen_addr`, `listen_port`) and the Unix socket in
//! `unix_socket_dir`, each accepted connection served by its own task.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use std::time::Duration;

use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;

use crate::config::Settings;
use crate::connection::{self, Accepts};
use crate::net::Stream;
use crate::runtime::Runtime;

#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: String, source: io::Error },
    #[error("listen_addr {0:?} is not an address")]
    BadAddr(String),
}

/// The sockets pgward accepts on.
pub struct Listeners {
    pub tcp: Vec<TcpListener>,
    pub unix: Option<(UnixListener, PathBuf)>,
}

impl Listeners {
    pub fn bind(s: &Settings) -> Result<Self, ListenError> {
        let mut tcp = Vec::new();
        for addr in s.listen_addrs() {
            for sa in socket_addrs(&addr, s.listen_port)? {
                tcp.push(bind_tcp(sa, s)?);
            }
        }
        let unix = if s.unix_socket_dir.is_empty() {
            None
        } else {
            Some(bind_unix(s)?)
        };
        Ok(Listeners { tcp, unix })
    }

    /// Accepts, spawning a task per client. When `stop` turns true the TCP listeners take
    /// the connections already queued and close (so a pooler sharing the port through
    /// `so_reuseport` gets every new one); the Unix socket stays open for the admin console.
    pub fn spawn(
        self,
        rt: &Arc<Runtime>,
        stop: watch::Receiver<bool>,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        let mut tasks = Vec::new();
        for l in self.tcp {
            tasks.push(tokio::spawn(accept_tcp(rt.clone(), l, stop.clone())));
        }
        if let Some((l, _)) = self.unix {
            tasks.push(tokio::spawn(accept_unix(rt.clone(), l, stop)));
        }
        tasks
    }
}

fn serve_tcp(rt: &Arc<Runtime>, s: tokio::net::TcpStream) {
    let _ = s.set_nodelay(true);
    let keepalive = crate::net::Keepalive::of(&rt.config.load().settings);
    if let Err(e) = keepalive.apply(&s) {
        tracing::warn!("could not set TCP keepalive on a client socket: {e}");
    }
    serve_on_worker(rt, Accepted::Tcp(s), Accepts::All);
}

/// A connection just accepted, on the acceptor's thread.
enum Accepted {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

/// The same connection taken off the acceptor's reactor, on its way to a worker thread.
enum Moving {
    Tcp(std::net::TcpStream),
    Unix(std::os::unix::net::UnixStream),
}

impl Accepted {
    fn stream(self) -> Stream {
        match self {
            Accepted::Tcp(s) => Stream::client_tcp(s),
            Accepted::Unix(s) => Stream::client_unix(s),
        }
    }

    fn moving(self) -> io::Result<Moving> {
        match self {
            Accepted::Tcp(s) => s.into_std().map(Moving::Tcp),
            Accepted::Unix(s) => s.into_std().map(Moving::Unix),
        }
    }
}

impl Moving {
    /// Registered with the reactor of the thread this runs on.
    fn arrived(self) -> io::Result<Stream> {
        match self {
            Moving::Tcp(s) => tokio::net::TcpStream::from_std(s).map(Stream::client_tcp),
            Moving::Unix(s) => tokio::net::UnixStream::from_std(s).map(Stream::client_unix),
        }
    }
}

/// Serves a connection on the worker thread with the fewest clients (the acceptors run on
/// the daemon's thread, worker 0): its socket moves to that thread's reactor first.
fn serve_on_worker(rt: &Arc<Runtime>, accepted: Accepted, accepts: Accepts) {
    let seat = rt.workers.seat();
    let id = seat.id();
    if id == 0 {
        tokio::spawn(connection::serve(
            rt.clone(),
            accepted.stream(),
            accepts,
            seat,
        ));
        return;
    }
    let moving = match accepted.moving() {
        Ok(m) => m,
        Err(e) => {
            tracing::warn!("cannot hand a client connection to a worker thread: {e}");
            return;
        }
    };
    let rt2 = rt.clone();
    rt.workers.spawn(id, async move {
        match moving.arrived() {
            Ok(stream) => connection::serve(rt2, stream, accepts, seat).await,
            Err(e) => tracing::warn!("a worker thread cannot take a client connection: {e}"),
        }
    });
}

async fn accept_tcp(rt: Arc<Runtime>, l: TcpListener, mut stop: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            accepted = l.accept() => match accepted {
                Ok((s, _)) => serve_tcp(&rt, s),
                Err(e) => accept_failed(e).await,
            },
            () = stopped(&mut stop) => break,
        }
    }
    // Connections the kernel already queued on this socket would be reset by closing it.
    while let Ok(Ok((s, _))) = tokio::time::timeout(Duration::ZERO, l.accept()).await {
        serve_tcp(&rt, s);
    }
}

/// Returns once `stop` is true.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    if stop.wait_for(|s| *s).await.is_err() {
        // The sender is gone: nobody can stop us any more.
        std::future::pending::<()>().await;
    }
}

async fn accept_unix(rt: Arc<Runtime>, l: UnixListener, stop: watch::Receiver<bool>) {
    loop {
        match l.accept().await {
            Ok((s, _)) => {
                let admission = if *stop.borrow() {
                    Accepts::ConsoleOnly
                } else {
                    Accepts::All
                };
                serve_on_worker(&rt, Accepted::Unix(s), admission);
            }
            Err(e) => accept_failed(e).await,
        }
    }
}

/// Out of file descriptors and the like: wait a moment rather than spin.
async fn accept_failed(e: io::Error) {
    tracing::warn!("accept failed: {e}");
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
}

fn socket_addrs(addr: &str, port: u16) -> Result<Vec<SocketAddr>, ListenError> {
    if addr == "*" {
        return Ok(vec![
            SocketAddr::from(([0, 0, 0, 0], port)),
            SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, port)),
        ]);
    }
    let host = addr.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = host.parse::<std::net::IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    use std::net::ToSocketAddrs;
    (host, port)
        .to_socket_addrs()
        .map(|it| it.collect())
        .map_err(|_| ListenError::BadAddr(addr.to_string()))
}

fn bind_tcp(sa: SocketAddr, s: &Settings) -> Result<TcpListener, ListenError> {
    let err = |source| ListenError::Bind {
        addr: sa.to_string(),
        source,
    };
    let domain = socket2::Domain::for_address(sa);
    let sock = socket2::Socket::new(domain, socket2::Type::STREAM, None).map_err(err)?;
    sock.set_reuse_address(true).map_err(err)?;
    if s.so_reuseport {
        sock.set_reuse_port(true).map_err(err)?;
    }
    if sa.is_ipv6() {
        sock.set_only_v6(true).map_err(err)?;
    }
    sock.set_nonblocking(true).map_err(err)?;
    sock.bind(&sa.into()).map_err(err)?;
    sock.listen(s.listen_backlog.min(i32::MAX as u32) as i32)
        .map_err(err)?;
    TcpListener::from_std(sock.into()).map_err(err)
}

fn bind_unix(s: &Settings) -> Result<(UnixListener, PathBuf), ListenError> {
    let path = PathBuf::from(format!("{}/.s.PGSQL.{}", s.unix_socket_dir, s.listen_port));
    let err = |source| ListenError::Bind {
        addr: path.display().to_string(),
        source,
    };
    if crate::net::is_abstract(&s.unix_socket_dir) {
        // No file: nothing left behind to remove, and no mode or group to give it (as in
        // PgBouncer); a name in use is refused by the bind itself.
        let addr = crate::net::unix_socket_addr(&s.unix_socket_dir, s.listen_port);
        let bound = addr.and_then(|a| std::os::unix::net::UnixListener::bind_addr(&a));
        let bound = bound.map_err(|e| match e.kind() {
            // Two processes cannot share one (so_reuseport's restart needs a directory).
            io::ErrorKind::AddrInUse => io::Error::new(
                io::ErrorKind::AddrInUse,
                "another process is listening there (a name in the abstract namespace \
                 cannot be shared, even under so_reuseport)",
            ),
            _ => e,
        });
        let listener = bound.and_then(|l| l.set_nonblocking(true).map(|()| l));
        let listener = listener.and_then(UnixListener::from_std).map_err(err)?;
        return Ok((listener, path));
    }
    if path.exists() {
        // A socket file left by a process that is gone; a live one answers connect.
        if std::os::unix::net::UnixStream::connect(&path).is_ok() && !s.so_reuseport {
            return Err(err(io::Error::new(
                io::ErrorKind::AddrInUse,
                "another process is listening there",
            )));
        }
        let _ = std::fs::remove_file(&path);
    }
    let listener = UnixListener::bind(&path).map_err(err)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(s.unix_socket_mode))
        .map_err(err)?;
    if let Some(group) = &s.unix_socket_group {
        let gid = group_id(group).map_err(err)?;
        nix::unistd::chown(&path, None, Some(gid)).map_err(|e| err(e.into()))?;
    }
    Ok((listener, path))
}

/// The group `unix_socket_group` names, by number or by name.
fn group_id(group: &str) -> io::Result<nix::unistd::Gid> {
    if let Ok(n) = group.parse::<u32>() {
        return Ok(nix::unistd::Gid::from_raw(n));
    }
    match nix::unistd::Group::from_name(group) {
        Ok(Some(g)) => Ok(g.gid),
        Ok(None) => Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("unix_socket_group: could not find group '{group}'"),
        )),
        Err(e) => Err(io::Error::other(format!(
            "unix_socket_group: could not find group '{group}': {e}"
        ))),
    }
}
