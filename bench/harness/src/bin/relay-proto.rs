//! Three prototypes of a transaction-pooling relay's steady state, to decide the design of
//! pgward's relay by measurement (see bench/README.md, `TARGETS=proto-mio`, `proto-tokio` and
//! `proto-unordered` of bench/pooler-bound.sh). Each answers a client's login itself from
//! canned messages, holds `POOL_SIZE` server connections logged in at start, and relays whole
//! messages: a client with something to send takes an idle server (or waits for one, first
//! come first served), and gives it back when the server says ReadyForQuery idle and the
//! client has nothing more to send. Nothing else: no authentication, no parameters, no
//! statements, no gate. What each costs per transaction is the floor of its design, not a
//! pooler.
//!
//! - `mio`: one loop per thread over plain state machines in a slab, driven by readiness
//!   events; a released server goes to the next waiter in the same turn.
//! - `tokio`: a current-thread tokio runtime per thread with one task per client, a pool
//!   shared by the thread's tasks, a waiter woken through a oneshot channel.
//! - `unordered`: the same clients as futures in one `FuturesUnordered` per thread, polled by
//!   one task, each woken through its own waker into the set's ready queue.
//!
//! With `worker_threads` above 1, each thread has its own listener on the same port (SO_REUSEPORT,
//! the kernel spreads the clients) and its own share of the servers.
//!
//! usage: relay-proto POOLER_INI (the pgbouncer.ini of bench/pooler-bound.sh, with
//! `relay_design = mio`, `tokio` or `unordered` and optionally `worker_threads = N`)

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::SocketAddr;

const SSL_REQUEST: u32 = 80_877_103;
const GSS_REQUEST: u32 = 80_877_104;

struct Args {
    design: String,
    listen: SocketAddr,
    server: SocketAddr,
    pool_size: usize,
    threads: usize,
}

/// Reads the pooler.ini bench/pooler-bound.sh writes: `listen_port`, `default_pool_size`,
/// `worker_threads` (default 1), `relay_design` (mio or tokio), and the server's `port=` of
/// the one database line.
fn args() -> Result<Args, String> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: relay-proto POOLER_INI")?;
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    let get = |key: &str| -> Option<String> {
        text.lines().find_map(|line| {
            let (k, v) = line.split_once('=')?;
            (k.trim() == key).then(|| v.trim().to_string())
        })
    };
    let number = |s: Option<String>, what: &str| -> Result<u16, String> {
        let s = s.ok_or(format!("{path}: no {what}"))?;
        s.parse()
            .map_err(|_| format!("{path}: {what} is not a number: {s}"))
    };
    let server_port = text
        .split_whitespace()
        .find_map(|w| w.strip_prefix("port="))
        .map(str::to_string);
    let threads =
        usize::from(number(get("worker_threads").or(Some("1".into())), "worker_threads")?.max(1));
    let pool_size = usize::from(number(get("default_pool_size"), "default_pool_size")?);
    if pool_size < threads {
        return Err("default_pool_size must be at least worker_threads".into());
    }
    Ok(Args {
        design: get("relay_design").unwrap_or_else(|| "mio".into()),
        listen: SocketAddr::from(([127, 0, 0, 1], number(get("listen_port"), "listen_port")?)),
        server: SocketAddr::from(([127, 0, 0, 1], number(server_port, "server port=")?)),
        pool_size,
        threads,
    })
}

fn main() {
    let args = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let run: fn(&Args, usize, std::net::TcpListener) -> io::Result<()> = match args.design.as_str()
    {
        "mio" => mio_relay::run,
        "tokio" => tokio_relay::run,
        "unordered" => tokio_relay::run_unordered,
        other => {
            eprintln!("unknown design {other}: mio, tokio or unordered");
            std::process::exit(2);
        }
    };
    // The listeners exist before any thread runs, so the port is open once this prints.
    let listeners: Vec<std::net::TcpListener> = (0..args.threads)
        .map(|_| listener(args.listen))
        .collect::<io::Result<_>>()
        .unwrap_or_else(|e| {
            eprintln!("listen on {}: {e}", args.listen);
            std::process::exit(1);
        });
    std::thread::scope(|s| {
        for (i, l) in listeners.into_iter().enumerate() {
            let servers =
                args.pool_size / args.threads + usize::from(i < args.pool_size % args.threads);
            let args = &args;
            s.spawn(move || {
                if let Err(e) = run(args, servers, l) {
                    eprintln!("relay thread {i}: {e}");
                    std::process::exit(1);
                }
            });
        }
    });
}

fn listener(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    s.set_reuse_address(true)?;
    s.set_reuse_port(true)?;
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    s.listen(1024)?;
    Ok(s.into())
}

// --- what both designs share ---------------------------------------------------------------

fn message(out: &mut Vec<u8>, tag: u8, body: &[u8]) {
    out.push(tag);
    out.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
    out.extend_from_slice(body);
}

/// What the relay tells a client at login: AuthenticationOk, a few parameters, a key,
/// ReadyForQuery.
fn login_answer() -> Vec<u8> {
    let mut out = Vec::new();
    message(&mut out, b'R', &0u32.to_be_bytes());
    for (name, value) in [("server_version", "15.0"), ("client_encoding", "UTF8")] {
        let mut body = Vec::new();
        body.extend_from_slice(name.as_bytes());
        body.push(0);
        body.extend_from_slice(value.as_bytes());
        body.push(0);
        message(&mut out, b'S', &body);
    }
    message(&mut out, b'K', &[0, 0, 0, 1, 0, 0, 0, 2]);
    message(&mut out, b'Z', b"I");
    out
}

/// The StartupMessage the relay logs in to a server with.
fn startup_message() -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&196_608u32.to_be_bytes());
    for kv in ["user", "bench", "database", "bench"] {
        body.extend_from_slice(kv.as_bytes());
        body.push(0);
    }
    body.push(0);
    let mut out = (body.len() as u32 + 4).to_be_bytes().to_vec();
    out.extend_from_slice(&body);
    out
}

/// The length of the complete messages at the front of `buf` (tag and length framed), and
/// whether the last of them is ReadyForQuery with status idle.
fn complete(buf: &[u8]) -> (usize, bool) {
    let mut at = 0;
    let mut idle = false;
    while let Some(len) = buf.get(at + 1..at + 5) {
        let len = u32::from_be_bytes(len.try_into().unwrap_or_default()) as usize;
        if buf.len() < at + 1 + len {
            break;
        }
        idle = buf[at] == b'Z' && len == 5 && buf[at + 5] == b'I';
        at += 1 + len;
    }
    (at, idle)
}

/// Whether `buf` starts with a Terminate message: the client leaves (and its server, if it
/// holds none, never hears of it).
fn terminate(buf: &[u8]) -> bool {
    buf.first() == Some(&b'X')
}

/// A client's startup packets at the front of `buf`: the length consumed and what to answer;
/// `Some` answer with `true` once logged in.
fn startup(buf: &[u8]) -> Option<(usize, Vec<u8>, bool)> {
    let len = u32::from_be_bytes(buf.get(..4)?.try_into().ok()?) as usize;
    if len < 8 || buf.len() < len {
        return None;
    }
    let code = u32::from_be_bytes(buf[4..8].try_into().ok()?);
    Some(match code {
        SSL_REQUEST | GSS_REQUEST => (len, vec![b'N'], false),
        _ => (len, login_answer(), true),
    })
}

/// Logs in to the server at `addr` (blocking), returns the connection once it is ready.
fn server_login(addr: SocketAddr) -> io::Result<std::net::TcpStream> {
    let mut s = std::net::TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    s.write_all(&startup_message())?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = s.read(&mut chunk)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "server closed at login",
            ));
        }
        buf.extend_from_slice(&chunk[..n]);
        let (len, idle) = complete(&buf);
        if idle && len == buf.len() {
            s.set_nonblocking(true)?;
            return Ok(s);
        }
    }
}

// --- one loop per thread over state machines -------------------------------------------------

mod mio_relay {
    use super::*;
    use mio::net::{TcpListener, TcpStream};
    use mio::{Events, Interest, Poll, Registry, Token};
    use slab::Slab;

    const LISTENER: Token = Token(usize::MAX);

    #[derive(Clone, Copy, PartialEq, Eq)]
    enum Client {
        /// Not logged in yet.
        Login,
        /// Holds no server and wants none.
        Idle,
        /// Has something to send and waits for a server.
        Queued,
        /// Holds this server.
        Active(usize),
    }

    #[derive(Clone, Copy)]
    enum Role {
        Client(Client),
        /// A server, and the client it serves.
        Server(Option<usize>),
    }

    struct Conn {
        sock: TcpStream,
        role: Role,
        /// Read and not yet passed on.
        inbuf: Vec<u8>,
        /// To write to this socket once it is writable again.
        out: Vec<u8>,
    }

    struct Relay {
        conns: Slab<Conn>,
        idle: Vec<usize>,
        waiting: VecDeque<usize>,
        chunk: Vec<u8>,
        /// Servers not connected yet (they are, the first time they are needed) and where.
        unopened: usize,
        server: SocketAddr,
    }

    pub fn run(args: &Args, servers: usize, listener: std::net::TcpListener) -> io::Result<()> {
        let mut poll = Poll::new()?;
        let mut listener = TcpListener::from_std(listener);
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)?;
        let mut relay = Relay {
            conns: Slab::with_capacity(1024),
            idle: Vec::new(),
            waiting: VecDeque::new(),
            chunk: vec![0; 64 * 1024],
            unopened: servers,
            server: args.server,
        };
        let mut events = Events::with_capacity(1024);
        loop {
            match poll.poll(&mut events, None) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                r => r?,
            }
            for ev in events.iter() {
                if ev.token() == LISTENER {
                    while let Ok((sock, _)) = listener.accept() {
                        sock.set_nodelay(true)?;
                        relay.add(poll.registry(), sock, Role::Client(Client::Login))?;
                    }
                    continue;
                }
                let id = ev.token().0;
                if ev.is_writable() {
                    relay.flush(id);
                }
                if ev.is_readable() || ev.is_read_closed() {
                    relay.readable(poll.registry(), id)?;
                }
            }
        }
    }

    impl Relay {
        fn add(&mut self, reg: &Registry, mut sock: TcpStream, role: Role) -> io::Result<usize> {
            let entry = self.conns.vacant_entry();
            let id = entry.key();
            reg.register(
                &mut sock,
                Token(id),
                Interest::READABLE | Interest::WRITABLE,
            )?;
            entry.insert(Conn {
                sock,
                role,
                inbuf: Vec::new(),
                out: Vec::new(),
            });
            Ok(id)
        }

        /// Reads what `id` has; false when it closed.
        fn fill(&mut self, id: usize) -> bool {
            let Some(c) = self.conns.get_mut(id) else {
                return false;
            };
            loop {
                match c.sock.read(&mut self.chunk) {
                    Ok(0) => return false,
                    Ok(n) => c.inbuf.extend_from_slice(&self.chunk[..n]),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => return false,
                }
            }
        }

        fn readable(&mut self, reg: &Registry, id: usize) -> io::Result<()> {
            let open = self.fill(id);
            match self.conns.get(id).map(|c| c.role) {
                Some(Role::Client(state)) => self.client_data(reg, id, state)?,
                Some(Role::Server(client)) => self.server_data(id, client),
                None => return Ok(()),
            }
            if !open {
                self.close(id);
            }
            Ok(())
        }

        /// An idle server, or a new one while fewer than the pool's size are open (a
        /// blocking login: only while the pool fills).
        fn idle_server(&mut self, reg: &Registry) -> io::Result<Option<usize>> {
            if let Some(s) = self.idle.pop() {
                return Ok(Some(s));
            }
            if self.unopened == 0 {
                return Ok(None);
            }
            self.unopened -= 1;
            let sock = TcpStream::from_std(server_login(self.server)?);
            self.add(reg, sock, Role::Server(None)).map(Some)
        }

        fn client_data(&mut self, reg: &Registry, id: usize, state: Client) -> io::Result<()> {
            match state {
                Client::Login => self.client_login(reg, id)?,
                Client::Queued => {}
                Client::Active(s) => {
                    let (len, _) = complete(&self.conns[id].inbuf);
                    self.pass(id, s, len);
                }
                Client::Idle => {
                    if terminate(&self.conns[id].inbuf) {
                        self.close(id);
                        return Ok(());
                    }
                    if complete(&self.conns[id].inbuf).0 == 0 {
                        return Ok(());
                    }
                    match self.idle_server(reg)? {
                        Some(s) => self.assign(id, s),
                        None => {
                            self.conns[id].role = Role::Client(Client::Queued);
                            self.waiting.push_back(id);
                        }
                    }
                }
            }
            Ok(())
        }

        fn client_login(&mut self, reg: &Registry, id: usize) -> io::Result<()> {
            while let Some((len, answer, done)) = startup(&self.conns[id].inbuf) {
                self.conns[id].inbuf.drain(..len);
                let c = &mut self.conns[id];
                write_or_keep(&mut c.sock, &mut c.out, &answer);
                if done {
                    self.conns[id].role = Role::Client(Client::Idle);
                    return self.client_data(reg, id, Client::Idle);
                }
            }
            Ok(())
        }

        /// Server `s` now serves client `c`: what the client has goes to it.
        fn assign(&mut self, c: usize, s: usize) {
            self.conns[c].role = Role::Client(Client::Active(s));
            self.conns[s].role = Role::Server(Some(c));
            let (len, _) = complete(&self.conns[c].inbuf);
            self.pass(c, s, len);
        }

        /// The first `len` bytes read from `from` go to `to`, with no copy when `to` is
        /// writable.
        fn pass(&mut self, from: usize, to: usize, len: usize) {
            if len == 0 {
                return;
            }
            let Some((f, t)) = self.conns.get2_mut(from, to) else {
                return;
            };
            write_or_keep(&mut t.sock, &mut t.out, &f.inbuf[..len]);
            f.inbuf.drain(..len);
        }

        fn flush(&mut self, id: usize) {
            let Some(c) = self.conns.get_mut(id) else {
                return;
            };
            if c.out.is_empty() {
                return;
            }
            let out = std::mem::take(&mut c.out);
            write_or_keep(&mut c.sock, &mut c.out, &out);
        }

        fn server_data(&mut self, s: usize, client: Option<usize>) {
            let Some(c) = client else {
                self.conns[s].inbuf.clear();
                return;
            };
            let (len, idle) = complete(&self.conns[s].inbuf);
            self.pass(s, c, len);
            let client_quiet = complete(&self.conns[c].inbuf).0 == 0;
            if len > 0 && idle && self.conns[s].inbuf.is_empty() && client_quiet {
                self.release(c, s);
            }
        }

        /// The client is done with the server: the next waiter gets it in this same turn.
        fn release(&mut self, c: usize, s: usize) {
            self.conns[c].role = Role::Client(Client::Idle);
            self.conns[s].role = Role::Server(None);
            match self.waiting.pop_front() {
                Some(next) => self.assign(next, s),
                None => self.idle.push(s),
            }
        }

        fn close(&mut self, id: usize) {
            let Some(conn) = self.conns.try_remove(id) else {
                return;
            };
            match conn.role {
                // Mid-transaction: the server's state is unknown, so it goes too.
                Role::Client(Client::Active(s)) => self.close(s),
                Role::Client(Client::Queued) => self.waiting.retain(|&w| w != id),
                Role::Client(_) => {}
                Role::Server(client) => {
                    self.unopened += 1;
                    self.idle.retain(|&i| i != id);
                    if let Some(c) = client {
                        self.close(c);
                    }
                }
            }
        }
    }

    /// Writes `bytes` now as far as the socket takes them; the rest (and everything, when
    /// something already waits in `out`) waits in `out` for the socket to be writable.
    fn write_or_keep(sock: &mut TcpStream, out: &mut Vec<u8>, bytes: &[u8]) {
        if !out.is_empty() {
            out.extend_from_slice(bytes);
            return;
        }
        let mut at = 0;
        while at < bytes.len() {
            match sock.write(&bytes[at..]) {
                Ok(n) => at += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        out.extend_from_slice(&bytes[at..]);
    }
}

// --- a task per client on a current-thread runtime ------------------------------------------

mod tokio_relay {
    use super::*;
    use std::cell::RefCell;
    use std::rc::Rc;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};
    use tokio::sync::oneshot;

    struct Pool {
        idle: Vec<TcpStream>,
        waiting: VecDeque<oneshot::Sender<TcpStream>>,
        /// Servers not connected yet (they are, the first time they are needed) and where.
        unopened: usize,
        server: SocketAddr,
    }

    type Shared = Rc<RefCell<Pool>>;

    /// A thread's pool of `servers` servers, none opened yet.
    fn shared_pool(args: &Args, servers: usize) -> Shared {
        Rc::new(RefCell::new(Pool {
            idle: Vec::new(),
            waiting: VecDeque::new(),
            unopened: servers,
            server: args.server,
        }))
    }

    pub fn run(args: &Args, servers: usize, listener: std::net::TcpListener) -> io::Result<()> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()?;
        let local = tokio::task::LocalSet::new();
        local.block_on(&rt, async move {
            let pool = shared_pool(args, servers);
            let listener = TcpListener::from_std(listener)?;
            loop {
                let (sock, _) = listener.accept().await?;
                sock.set_nodelay(true)?;
                tokio::task::spawn_local(client(sock, pool.clone()));
            }
        })
    }

    /// The same clients as futures in one `FuturesUnordered`, polled by one task per thread
    /// (each woken by its own waker through the set's ready queue) instead of a task each.
    pub fn run_unordered(
        args: &Args,
        servers: usize,
        listener: std::net::TcpListener,
    ) -> io::Result<()> {
        use futures_util::stream::{FuturesUnordered, StreamExt};
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()?;
        rt.block_on(async move {
            let pool = shared_pool(args, servers);
            let listener = TcpListener::from_std(listener)?;
            let mut clients = FuturesUnordered::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let (sock, _) = accepted?;
                        sock.set_nodelay(true)?;
                        clients.push(client(sock, pool.clone()));
                    }
                    Some(_) = clients.next(), if !clients.is_empty() => {}
                }
            }
        })
    }

    async fn take(pool: &Shared) -> Option<TcpStream> {
        let rx = {
            let mut p = pool.borrow_mut();
            if let Some(s) = p.idle.pop() {
                return Some(s);
            }
            if p.unopened > 0 {
                // A blocking login: only while the pool fills.
                p.unopened -= 1;
                return server_login(p.server).and_then(TcpStream::from_std).ok();
            }
            let (tx, rx) = oneshot::channel();
            p.waiting.push_back(tx);
            rx
        };
        rx.await.ok()
    }

    /// A server a client holds: if the client's task ends before giving it back (an error, a
    /// closed connection), the pool opens another one when it needs it.
    struct Held<'a>(Option<TcpStream>, &'a Shared);

    impl Drop for Held<'_> {
        fn drop(&mut self) {
            if self.0.is_some() {
                self.1.borrow_mut().unopened += 1;
            }
        }
    }

    fn give_back(pool: &Shared, mut server: TcpStream) {
        let mut p = pool.borrow_mut();
        while let Some(w) = p.waiting.pop_front() {
            match w.send(server) {
                Ok(()) => return,
                Err(back) => server = back,
            }
        }
        p.idle.push(server);
    }

    async fn client(mut sock: TcpStream, pool: Shared) -> io::Result<()> {
        let mut inbuf = Vec::with_capacity(8192);
        loop {
            let (len, answer, done) = loop {
                if let Some(s) = startup(&inbuf) {
                    break s;
                }
                if sock.read_buf(&mut inbuf).await? == 0 {
                    return Ok(());
                }
            };
            inbuf.drain(..len);
            sock.write_all(&answer).await?;
            if done {
                break;
            }
        }
        let mut sbuf = Vec::with_capacity(8192);
        loop {
            while complete(&inbuf).0 == 0 {
                if sock.read_buf(&mut inbuf).await? == 0 {
                    return Ok(());
                }
            }
            if terminate(&inbuf) {
                return Ok(());
            }
            let Some(server) = take(&pool).await else {
                return Ok(());
            };
            let mut held = Held(Some(server), &pool);
            let server = held.0.as_mut().expect("held");
            // A server that closed while idle (its backend went away) shows here, before
            // anything of this transaction reached the client: another one takes it.
            let (len, _) = complete(&inbuf);
            let sent = server.write_all(&inbuf[..len]).await.is_ok();
            if !sent || server.read_buf(&mut sbuf).await.map_or(true, |n| n == 0) {
                sbuf.clear();
                continue;
            }
            inbuf.drain(..len);
            // The transaction: requests to the server, answers to the client, until the
            // server is idle and the client has nothing more to send.
            loop {
                let (len, _) = complete(&inbuf);
                if len > 0 {
                    server.write_all(&inbuf[..len]).await?;
                    inbuf.drain(..len);
                }
                let idle = loop {
                    let (len, idle) = complete(&sbuf);
                    if len > 0 {
                        sock.write_all(&sbuf[..len]).await?;
                        sbuf.drain(..len);
                        break idle && sbuf.is_empty();
                    }
                    if server.read_buf(&mut sbuf).await? == 0 {
                        return Ok(());
                    }
                };
                if idle && complete(&inbuf).0 == 0 {
                    break;
                }
                if complete(&inbuf).0 == 0 {
                    // Still in a transaction with nothing to send: the client goes on.
                    tokio::select! {
                        r = sock.read_buf(&mut inbuf) => if r? == 0 { return Ok(()) },
                        r = server.read_buf(&mut sbuf) => if r? == 0 { return Ok(()) },
                    }
                }
            }
            give_back(&pool, held.0.take().expect("held"));
        }
    }
}
