//! Byte streams pgward speaks over: TCP and Unix sockets, and TLS over TCP, on either side.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};

/// TLS pgward accepted from a client.
pub type TlsFromClient = tokio_rustls::server::TlsStream<TcpStream>;
/// TLS pgward opened to a server.
pub type TlsToServer = tokio_rustls::client::TlsStream<TcpStream>;

/// The address of the Unix socket of `port` in `dir`, a directory as PgBouncer and libpq read
/// one: a path, or, starting with `@`, a name in Linux's abstract namespace (the rest of the
/// directory, then `/.s.PGSQL.<port>`), which no file stands for.
pub fn unix_socket_addr(dir: &str, port: u16) -> io::Result<std::os::unix::net::SocketAddr> {
    use std::os::linux::net::SocketAddrExt;
    match dir.strip_prefix('@') {
        Some(name) => {
            std::os::unix::net::SocketAddr::from_abstract_name(format!("{name}/.s.PGSQL.{port}"))
        }
        None => std::os::unix::net::SocketAddr::from_pathname(format!("{dir}/.s.PGSQL.{port}")),
    }
}

/// Whether `dir` names a socket in the abstract namespace (see [`unix_socket_addr`]).
pub fn is_abstract(dir: &str) -> bool {
    dir.starts_with('@')
}

/// Connects to the Unix socket at `addr` without blocking: a name in the abstract namespace
/// through a non-blocking socket of its own, refused at once (EAGAIN) when its listener's
/// queue is full, as tokio refuses a path's.
pub async fn connect_unix(addr: std::os::unix::net::SocketAddr) -> io::Result<UnixStream> {
    use nix::sys::socket::{connect, socket, AddressFamily, SockFlag, SockType, UnixAddr};
    use std::os::fd::AsRawFd;
    use std::os::linux::net::SocketAddrExt;
    if let Some(path) = addr.as_pathname() {
        return UnixStream::connect(path).await;
    }
    let name = addr.as_abstract_name().unwrap_or_default();
    let flags = SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC;
    let fd = socket(AddressFamily::Unix, SockType::Stream, flags, None)?;
    connect(fd.as_raw_fd(), &UnixAddr::new_abstract(name)?)?;
    UnixStream::from_std(std::os::unix::net::UnixStream::from(fd))
}

/// TCP keepalive and user timeout, as `tcp_keepalive`, `tcp_keepidle`, `tcp_keepintvl`,
/// `tcp_keepcnt` and `tcp_user_timeout` set them on every client and server socket (a zero
/// leaves the operating system's default), so a peer whose machine vanished (no FIN, no RST)
/// is noticed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Keepalive {
    pub enabled: bool,
    /// Seconds idle before the first probe.
    pub idle: u32,
    /// Seconds between probes.
    pub interval: u32,
    /// Probes unanswered before the connection is dropped.
    pub count: u32,
    /// Milliseconds sent data may stay unacknowledged.
    pub user_timeout: u32,
}

impl Keepalive {
    pub fn of(settings: &crate::config::settings::Settings) -> Self {
        Keepalive {
            enabled: settings.tcp_keepalive,
            idle: settings.tcp_keepidle,
            interval: settings.tcp_keepintvl,
            count: settings.tcp_keepcnt,
            user_timeout: settings.tcp_user_timeout,
        }
    }

    /// Sets the options on a TCP socket.
    pub fn apply(&self, socket: &TcpStream) -> io::Result<()> {
        let sock = socket2::SockRef::from(socket);
        if self.user_timeout > 0 {
            let timeout = std::time::Duration::from_millis(u64::from(self.user_timeout));
            sock.set_tcp_user_timeout(Some(timeout))?;
        }
        if !self.enabled {
            return sock.set_keepalive(false);
        }
        let seconds = |s: u32| std::time::Duration::from_secs(u64::from(s));
        let mut params = socket2::TcpKeepalive::new();
        if self.idle > 0 {
            params = params.with_time(seconds(self.idle));
        }
        if self.interval > 0 {
            params = params.with_interval(seconds(self.interval));
        }
        if self.count > 0 {
            params = params.with_retries(self.count);
        }
        sock.set_tcp_keepalive(&params)
    }
}

/// A connected socket, client or server side.
#[derive(Debug)]
pub enum Stream {
    Tcp(Plain<TcpStream>),
    Unix(Plain<UnixStream>),
    /// A client connection after its TLS handshake.
    TlsIn(Box<TlsFromClient>),
    /// A server connection after its TLS handshake.
    TlsOut(Box<TlsToServer>),
    /// The socket was taken out (for a TLS handshake that did not finish); reads see end of
    /// stream, writes fail.
    Detached,
}

impl Stream {
    /// A client's socket, read by one session for its whole life (see [`Plain`]).
    pub fn client_tcp(s: TcpStream) -> Self {
        Stream::Tcp(Plain::new(s, true))
    }

    /// A client's Unix socket (see [`Plain`]).
    pub fn client_unix(s: UnixStream) -> Self {
        Stream::Unix(Plain::new(s, true))
    }

    /// Takes the socket out, leaving [`Stream::Detached`].
    pub fn take(&mut self) -> Stream {
        std::mem::replace(self, Stream::Detached)
    }

    /// Moves a plain socket to the reactor of the runtime this runs on (a worker thread's,
    /// see [`crate::workers`]), so that its events wake tasks there; false for a TLS stream,
    /// which stays where it is. On an error the socket is gone ([`Stream::Detached`]).
    pub fn rehome(&mut self) -> io::Result<bool> {
        match self.take() {
            Stream::Tcp(p) => {
                let remember = p.arm.is_some();
                let s = TcpStream::from_std(p.into_inner().into_std()?)?;
                *self = Stream::Tcp(Plain::new(s, remember));
                Ok(true)
            }
            Stream::Unix(p) => {
                let remember = p.arm.is_some();
                let s = UnixStream::from_std(p.into_inner().into_std()?)?;
                *self = Stream::Unix(Plain::new(s, remember));
                Ok(true)
            }
            other => {
                *self = other;
                Ok(false)
            }
        }
    }

    /// The TCP socket under a TCP or TLS stream.
    pub fn tcp(&self) -> Option<&TcpStream> {
        match self {
            Stream::Tcp(s) => Some(s.get_ref()),
            Stream::TlsIn(s) => Some(s.get_ref().0),
            Stream::TlsOut(s) => Some(s.get_ref().0),
            Stream::Unix(_) | Stream::Detached => None,
        }
    }

    /// A second descriptor of the socket (none once detached, or if the process is out of
    /// descriptors), to shut the connection down from elsewhere.
    pub fn clone_fd(&self) -> Option<std::os::fd::OwnedFd> {
        use std::os::fd::AsFd;
        let fd = match (self, self.tcp()) {
            (_, Some(s)) => s.as_fd(),
            (Stream::Unix(s), None) => s.get_ref().as_fd(),
            _ => return None,
        };
        fd.try_clone_to_owned().ok()
    }

    /// Whether the stream is encrypted.
    pub fn is_tls(&self) -> bool {
        matches!(self, Stream::TlsIn(_) | Stream::TlsOut(_))
    }

    /// Whether this is a plain-text TCP socket.
    pub fn is_plain_tcp(&self) -> bool {
        matches!(self, Stream::Tcp(_))
    }

    /// The TLS version and cipher suite agreed in the handshake (`TLSv1.3/TLS13_AES_..`),
    /// for the logs; `None` for a stream without TLS.
    pub fn tls_label(&self) -> Option<String> {
        let state: &rustls::CommonState = match self {
            Stream::TlsIn(s) => s.get_ref().1,
            Stream::TlsOut(s) => s.get_ref().1,
            _ => return None,
        };
        let version = match state.protocol_version() {
            Some(rustls::ProtocolVersion::TLSv1_3) => "TLSv1.3".to_string(),
            Some(rustls::ProtocolVersion::TLSv1_2) => "TLSv1.2".to_string(),
            Some(v) => format!("{v:?}"),
            None => "?".to_string(),
        };
        let suite = state
            .negotiated_cipher_suite()
            .and_then(|s| s.suite().as_str())
            .unwrap_or("?");
        Some(format!("{version}/{suite}"))
    }

    /// The ALPN protocol agreed in the TLS handshake, if any.
    pub fn alpn(&self) -> Option<&[u8]> {
        match self {
            Stream::TlsIn(s) => s.get_ref().1.alpn_protocol(),
            Stream::TlsOut(s) => s.get_ref().1.alpn_protocol(),
            _ => None,
        }
    }

    /// The common name of the certificate a TLS client presented (checked against
    /// `client_tls_ca_file` during the handshake).
    pub fn peer_cert_name(&self) -> Option<String> {
        let Stream::TlsIn(s) = self else {
            return None;
        };
        let cert = s.get_ref().1.peer_certificates()?.first()?;
        crate::edge::tls::common_name(cert)
    }

    /// The first byte waiting on a plain TCP socket, without reading it; `None` at end of
    /// stream or for other kinds of stream.
    pub async fn peek_byte(&self) -> io::Result<Option<u8>> {
        let Stream::Tcp(s) = self else {
            return Ok(None);
        };
        // The peek waits with the caller's waker; the runtime keeps such waits apart from
        // the stream's own registration, but the mark is cleared all the same.
        s.disarm();
        let mut byte = [0u8; 1];
        match s.io.peek(&mut byte).await? {
            0 => Ok(None),
            _ => Ok(Some(byte[0])),
        }
    }

    /// Reads without waiting: `Ok(0)` is end of stream, `WouldBlock` means nothing is there.
    /// A TLS stream cannot be read past its records this way: anything waiting on it is an
    /// error, which a liveness probe takes as "not idle".
    pub fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.io.try_read(buf),
            Stream::Unix(s) => s.io.try_read(buf),
            Stream::TlsIn(_) | Stream::TlsOut(_) => Err(io::Error::other(
                "data waiting on an encrypted idle connection",
            )),
            Stream::Detached => Ok(0),
        }
    }

    /// Whether the reactor has seen the socket become readable (data or end of stream)
    /// since the last read that found nothing. No system call when it has not.
    pub fn readable_now(&self) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        let ready = match self {
            Stream::Tcp(s) => s.poll_read_ready_elsewhere(&mut cx),
            Stream::Unix(s) => s.poll_read_ready_elsewhere(&mut cx),
            Stream::TlsIn(s) => s.get_ref().0.poll_read_ready(&mut cx),
            Stream::TlsOut(s) => s.get_ref().0.poll_read_ready(&mut cx),
            Stream::Detached => return true,
        };
        ready.is_ready()
    }

    /// The peer's address for logs, `unix` for a Unix socket.
    pub fn peer_label(&self) -> String {
        match self.tcp() {
            Some(s) => s
                .peer_addr()
                .map(|a| a.to_string())
                .unwrap_or_else(|_| "?".into()),
            None => "unix".into(),
        }
    }

    /// The OS user id of the process at the other end of a Unix socket.
    pub fn peer_uid(&self) -> Option<u32> {
        match self {
            Stream::Unix(s) => s.get_ref().peer_cred().ok().map(|c| c.uid()),
            _ => None,
        }
    }

    /// The peer as `application_name_add_host` names it, in PgBouncer's words: `host:port`
    /// (`[v6]:port`) for TCP, `unix(pid@hostname):port` for a Unix socket on `listen_port`
    /// (`unix:port` when the peer's process is unknown).
    pub fn peer_details(&self, listen_port: u16) -> String {
        if self.tcp().is_some() {
            return self.peer_label();
        }
        let pid = match self {
            Stream::Unix(s) => s.get_ref().peer_cred().ok().and_then(|c| c.pid()),
            _ => None,
        };
        match pid.filter(|&p| p > 0) {
            Some(pid) => {
                let host = nix::unistd::gethostname().unwrap_or_default();
                format!("unix({pid}@{}):{listen_port}", host.to_string_lossy())
            }
            None => format!("unix:{listen_port}"),
        }
    }

    /// This end's address, for logs ("unix" for a Unix socket).
    pub fn local_label(&self) -> String {
        match self.tcp() {
            Some(s) => s
                .local_addr()
                .map(|a| a.to_string())
                .unwrap_or_else(|_| "?".into()),
            None => "unix".into(),
        }
    }

    /// The peer's IP address, if any.
    pub fn peer_ip(&self) -> Option<std::net::IpAddr> {
        self.tcp()?.peer_addr().ok().map(|a| a.ip())
    }
}

fn detached() -> io::Error {
    io::Error::new(io::ErrorKind::NotConnected, "connection detached")
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        // A TLS write can leave encrypted bytes queued when the socket was full; every read
        // pushes them on first, so a peer waiting for them is never stuck.
        match self.get_mut() {
            Stream::Tcp(s) => s.poll_read(cx, buf),
            Stream::Unix(s) => s.poll_read(cx, buf),
            Stream::TlsIn(s) => {
                if let Poll::Ready(Err(e)) = Pin::new(&mut **s).poll_flush(cx) {
                    return Poll::Ready(Err(e));
                }
                Pin::new(&mut **s).poll_read(cx, buf)
            }
            Stream::TlsOut(s) => {
                if let Poll::Ready(Err(e)) = Pin::new(&mut **s).poll_flush(cx) {
                    return Poll::Ready(Err(e));
                }
                Pin::new(&mut **s).poll_read(cx, buf)
            }
            Stream::Detached => Poll::Ready(Ok(())),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(&mut s.io).poll_write(cx, buf),
            Stream::Unix(s) => Pin::new(&mut s.io).poll_write(cx, buf),
            Stream::TlsIn(s) => Pin::new(&mut **s).poll_write(cx, buf),
            Stream::TlsOut(s) => Pin::new(&mut **s).poll_write(cx, buf),
            Stream::Detached => Poll::Ready(Err(detached())),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(&mut s.io).poll_flush(cx),
            Stream::Unix(s) => Pin::new(&mut s.io).poll_flush(cx),
            Stream::TlsIn(s) => Pin::new(&mut **s).poll_flush(cx),
            Stream::TlsOut(s) => Pin::new(&mut **s).poll_flush(cx),
            Stream::Detached => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(&mut s.io).poll_shutdown(cx),
            Stream::Unix(s) => Pin::new(&mut s.io).poll_shutdown(cx),
            Stream::TlsIn(s) => Pin::new(&mut **s).poll_shutdown(cx),
            Stream::TlsOut(s) => Pin::new(&mut **s).poll_shutdown(cx),
            Stream::Detached => Poll::Ready(Ok(())),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(&mut s.io).poll_write_vectored(cx, bufs),
            Stream::Unix(s) => Pin::new(&mut s.io).poll_write_vectored(cx, bufs),
            Stream::TlsIn(s) => Pin::new(&mut **s).poll_write_vectored(cx, bufs),
            Stream::TlsOut(s) => Pin::new(&mut **s).poll_write_vectored(cx, bufs),
            Stream::Detached => Poll::Ready(Err(detached())),
        }
    }

    fn is_write_vectored(&self) -> bool {
        // One buffer a write: a plain write is cheaper than writev.
        false
    }
}

impl From<TcpStream> for Stream {
    fn from(s: TcpStream) -> Self {
        Stream::Tcp(Plain::new(s, false))
    }
}

impl From<UnixStream> for Stream {
    fn from(s: UnixStream) -> Self {
        Stream::Unix(Plain::new(s, false))
    }
}

/// A plain socket. A client's socket also remembers whether its read interest is already
/// registered with the reactor for the task reading it, so asking again (as the relay does at
/// every turn) costs nothing until the socket has news. (A server's socket changes hands
/// with every transaction, so remembering would cost more than it saves.)
///
/// Such reads wait with the stream's own waker, which marks the stream and then wakes the
/// task. A read that finds the interest registered, unfired and for the same task returns
/// pending without asking the reactor. Anything that waits on the socket with another waker
/// ([`Stream::readable_now`], [`Stream::peek_byte`]) clears the mark first.
#[derive(Debug)]
pub struct Plain<S> {
    io: S,
    arm: Option<ReadArm>,
}

impl<S: AsyncRead + Unpin> Plain<S> {
    fn new(io: S, remember: bool) -> Self {
        Plain {
            io,
            arm: remember.then(ReadArm::new),
        }
    }

    pub fn get_ref(&self) -> &S {
        &self.io
    }

    pub fn into_inner(self) -> S {
        self.io
    }

    fn poll_read(&mut self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let Some(arm) = &mut self.arm else {
            return Pin::new(&mut self.io).poll_read(cx, buf);
        };
        if arm.still_waiting(cx.waker()) {
            return Poll::Pending;
        }
        arm.start_read(cx.waker());
        let read = Pin::new(&mut self.io).poll_read(&mut Context::from_waker(&arm.own), buf);
        if read.is_pending() {
            arm.armed();
        }
        read
    }

    /// Someone is about to wait on the socket with another waker.
    fn disarm(&self) {
        if let Some(arm) = &self.arm {
            arm.disarm();
        }
    }
}

impl Plain<TcpStream> {
    fn poll_read_ready_elsewhere(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.disarm();
        self.io.poll_read_ready(cx)
    }
}

impl Plain<UnixStream> {
    fn poll_read_ready_elsewhere(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.disarm();
        self.io.poll_read_ready(cx)
    }
}

/// A read registered with the stream's waker and not woken since.
const ARMED: u8 = 1;
/// The stream's waker was woken (the socket has news, or the runtime asked for a yield).
const FIRED: u8 = 2;

/// The state behind [`Plain`]: see there.
#[derive(Debug)]
struct ReadArm {
    shared: Arc<ArmShared>,
    /// The stream's own waker, handed to the reactor.
    own: Waker,
    /// The task the reactor's registration wakes (a copy of the one in `shared`, to compare
    /// against without a lock).
    task: Option<Waker>,
}

#[derive(Debug, Default)]
struct ArmShared {
    state: AtomicU8,
    task: Mutex<Option<Waker>>,
}

impl Wake for ArmShared {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.state.fetch_or(FIRED, Ordering::AcqRel);
        if let Some(task) = &*self.task.lock().unwrap_or_else(|e| e.into_inner()) {
            task.wake_by_ref();
        }
    }
}

impl ReadArm {
    fn new() -> Self {
        let shared = Arc::new(ArmShared::default());
        ReadArm {
            own: Waker::from(shared.clone()),
            shared,
            task: None,
        }
    }

    /// Whether the last read registered interest for this same task and nothing has woken
    /// it since: asking the reactor again would only register it again.
    fn still_waiting(&self, task: &Waker) -> bool {
        self.shared.state.load(Ordering::Acquire) == ARMED
            && self.task.as_ref().is_some_and(|t| t.will_wake(task))
    }

    /// Before a read: clears the marks and makes `task` the one a registration wakes.
    fn start_read(&mut self, task: &Waker) {
        self.shared.state.store(0, Ordering::Release);
        if !self.task.as_ref().is_some_and(|t| t.will_wake(task)) {
            self.set_task(task.clone());
        }
    }

    /// The read registered interest with the stream's waker. A wake that came meanwhile has
    /// set FIRED, so the next read still asks the reactor.
    fn armed(&self) {
        self.shared.state.fetch_or(ARMED, Ordering::AcqRel);
    }

    /// Someone waits on the socket with another waker: the next read asks the reactor.
    fn disarm(&self) {
        self.shared.state.store(0, Ordering::Release);
    }

    fn set_task(&mut self, task: Waker) {
        *self.shared.task.lock().unwrap_or_else(|e| e.into_inner()) = Some(task.clone());
        self.task = Some(task);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;
    use tokio::io::AsyncWriteExt;

    /// Counts its wakes.
    #[derive(Default)]
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.wake_by_ref();
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn counter() -> (Arc<Count>, Waker) {
        let count = Arc::new(Count::default());
        (count.clone(), Waker::from(count))
    }

    async fn pair() -> (Stream, TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let peer = TcpStream::connect(listener.local_addr().unwrap());
        let (accepted, peer) = tokio::join!(listener.accept(), peer);
        (Stream::client_tcp(accepted.unwrap().0), peer.unwrap())
    }

    fn poll_once(stream: &mut Stream, waker: &Waker, out: &mut [u8]) -> Poll<usize> {
        let mut buf = ReadBuf::new(out);
        match Pin::new(stream).poll_read(&mut Context::from_waker(waker), &mut buf) {
            Poll::Ready(r) => Poll::Ready(r.map(|()| buf.filled().len()).unwrap()),
            Poll::Pending => Poll::Pending,
        }
    }

    fn arm_state(stream: &Stream) -> u8 {
        let Stream::Tcp(s) = stream else {
            unreachable!()
        };
        s.arm.as_ref().unwrap().shared.state.load(Ordering::SeqCst)
    }

    /// Lets the reactor deliver what the peer sent.
    async fn settle() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    #[tokio::test]
    async fn a_registered_read_is_not_asked_again_until_the_socket_has_news() {
        let (mut stream, mut peer) = pair().await;
        let (count, waker) = counter();
        let mut out = [0u8; 16];
        assert!(poll_once(&mut stream, &waker, &mut out).is_pending());
        assert_eq!(arm_state(&stream), ARMED);
        assert!(poll_once(&mut stream, &waker, &mut out).is_pending());
        peer.write_all(b"hi").await.unwrap();
        settle().await;
        assert_eq!(count.0.load(Ordering::SeqCst), 1, "the task is woken once");
        assert_eq!(poll_once(&mut stream, &waker, &mut out), Poll::Ready(2));
        assert_eq!(&out[..2], b"hi");
    }

    #[tokio::test]
    async fn a_probe_with_another_waker_makes_the_next_read_ask_again() {
        let (mut stream, mut peer) = pair().await;
        let (_count, waker) = counter();
        let mut out = [0u8; 16];
        assert!(poll_once(&mut stream, &waker, &mut out).is_pending());
        // The pool's liveness probe registers a no-op waker in the stream's place.
        assert!(!stream.readable_now());
        peer.write_all(b"x").await.unwrap();
        settle().await;
        assert_eq!(poll_once(&mut stream, &waker, &mut out), Poll::Ready(1));
    }

    #[tokio::test]
    async fn another_task_reading_registers_itself() {
        let (mut stream, mut peer) = pair().await;
        let (first, first_waker) = counter();
        let (second, second_waker) = counter();
        let mut out = [0u8; 16];
        assert!(poll_once(&mut stream, &first_waker, &mut out).is_pending());
        assert!(poll_once(&mut stream, &second_waker, &mut out).is_pending());
        peer.write_all(b"z").await.unwrap();
        settle().await;
        assert_eq!(second.0.load(Ordering::SeqCst), 1);
        assert_eq!(first.0.load(Ordering::SeqCst), 0);
        assert_eq!(
            poll_once(&mut stream, &second_waker, &mut out),
            Poll::Ready(1)
        );
    }
}
