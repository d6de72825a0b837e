//! Byte streams pgward speaks over: TCP and Unix sockets, and TLS over TCP, on either side.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};

/// TLS pgward accepted from a client.
pub type TlsFromClient = tokio_rustls::server::TlsStream<TcpStream>;
/// TLS pgward opened to a server.
pub type TlsToServer = tokio_rustls::client::TlsStream<TcpStream>;

/// A connected socket, client or server side.
#[derive(Debug)]
pub enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
    /// A client connection after its TLS handshake.
    TlsIn(Box<TlsFromClient>),
    /// A server connection after its TLS handshake.
    TlsOut(Box<TlsToServer>),
    /// The socket was taken out (for a TLS handshake that did not finish); reads see end of
    /// stream, writes fail.
    Detached,
}

impl Stream {
    /// Takes the socket out, leaving [`Stream::Detached`].
    pub fn take(&mut self) -> Stream {
        std::mem::replace(self, Stream::Detached)
    }

    /// The TCP socket under a TCP or TLS stream.
    pub fn tcp(&self) -> Option<&TcpStream> {
        match self {
            Stream::Tcp(s) => Some(s),
            Stream::TlsIn(s) => Some(s.get_ref().0),
            Stream::TlsOut(s) => Some(s.get_ref().0),
            Stream::Unix(_) | Stream::Detached => None,
        }
    }

    /// The file descriptor of the socket, -1 once detached.
    pub fn raw_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        match (self, self.tcp()) {
            (_, Some(s)) => s.as_raw_fd(),
            (Stream::Unix(s), None) => s.as_raw_fd(),
            _ => -1,
        }
    }

    /// Whether the stream is encrypted.
    pub fn is_tls(&self) -> bool {
        matches!(self, Stream::TlsIn(_) | Stream::TlsOut(_))
    }

    /// Whether this is a plain-text TCP socket.
    pub fn is_plain_tcp(&self) -> bool {
        matches!(self, Stream::Tcp(_))
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
        let mut byte = [0u8; 1];
        match s.peek(&mut byte).await? {
            0 => Ok(None),
            _ => Ok(Some(byte[0])),
        }
    }

    /// Reads without waiting: `Ok(0)` is end of stream, `WouldBlock` means nothing is there.
    /// A TLS stream cannot be read past its records this way: anything waiting on it is an
    /// error, which a liveness probe takes as "not idle".
    pub fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.try_read(buf),
            Stream::Unix(s) => s.try_read(buf),
            Stream::TlsIn(_) | Stream::TlsOut(_) => Err(io::Error::other(
                "data waiting on an encrypted idle connection",
            )),
            Stream::Detached => Ok(0),
        }
    }

    /// Whether the reactor has seen the socket become readable (data or end of stream)
    /// since the last read that found nothing. No system call when it has not.
    pub fn readable_now(&self) -> bool {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let ready = match (self, self.tcp()) {
            (_, Some(tcp)) => tcp.poll_read_ready(&mut cx),
            (Stream::Unix(s), None) => s.poll_read_ready(&mut cx),
            _ => return true,
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
            Stream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_read(cx, buf),
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
            Stream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_write(cx, buf),
            Stream::TlsIn(s) => Pin::new(&mut **s).poll_write(cx, buf),
            Stream::TlsOut(s) => Pin::new(&mut **s).poll_write(cx, buf),
            Stream::Detached => Poll::Ready(Err(detached())),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_flush(cx),
            Stream::Unix(s) => Pin::new(s).poll_flush(cx),
            Stream::TlsIn(s) => Pin::new(&mut **s).poll_flush(cx),
            Stream::TlsOut(s) => Pin::new(&mut **s).poll_flush(cx),
            Stream::Detached => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Unix(s) => Pin::new(s).poll_shutdown(cx),
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
            Stream::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Unix(s) => Pin::new(s).poll_write_vectored(cx, bufs),
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
