//! The pooler-bound harness (see bench/README.md): one thread and one event loop playing both
//! ends of a pooler. A PostgreSQL backend answers every request at once from canned messages,
//! and closed-loop clients send their next transaction as soon as the last one is answered.
//! Both ends are as cheap as they can be, so that with the harness on one core and the pooler
//! on another, the pooler is the bottleneck.
//!
//! usage: pgward-harness SERVER_PORT POOLER_PORT CLIENTS MODE LIMIT [USER]
//!   SERVER_PORT  where the fake backend listens (127.0.0.1); the pooler's server
//!   POOLER_PORT  where the pooler listens; the clients log in there (database `bench`)
//!   MODE         simple (Query), extended (Parse, Bind, Describe, Execute, Sync of the unnamed
//!                statement, as pgbench -M extended), prepared (Bind, Execute, Sync of a
//!                statement prepared once per client)
//!   LIMIT        `10s` (run that long) or `5000` (transactions per client)
//!   USER         the user the clients log in as (default `bench`; the pooler must trust it)
//!
//! The transactions are counted from the moment every client has logged in. The last line
//! of output is `transactions N seconds S tps T`.

use std::io::{self, Read, Write};
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};

const LISTENER: Token = Token(usize::MAX);
/// SSLRequest and GSSENCRequest codes: answered `N`.
const SSL_REQUEST: u32 = 80_877_103;
const GSS_REQUEST: u32 = 80_877_104;
const CANCEL_REQUEST: u32 = 80_877_102;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Simple,
    Extended,
    Prepared,
}

#[derive(Clone, Copy)]
enum Limit {
    Time(Duration),
    Transactions(u64),
}

struct Args {
    server_port: u16,
    pooler_port: u16,
    clients: usize,
    mode: Mode,
    limit: Limit,
    user: String,
}

fn args() -> Result<Args, String> {
    let a: Vec<String> = std::env::args().skip(1).collect();
    if a.len() < 5 {
        return Err(
            "usage: pgward-harness SERVER_PORT POOLER_PORT CLIENTS MODE LIMIT [USER]".into(),
        );
    }
    let number = |s: &str, what: &str| s.parse::<u64>().map_err(|_| format!("bad {what}: {s}"));
    let mode = match a[3].as_str() {
        "simple" => Mode::Simple,
        "extended" => Mode::Extended,
        "prepared" => Mode::Prepared,
        other => return Err(format!("bad MODE: {other}")),
    };
    let limit = match a[4].strip_suffix('s') {
        Some(secs) => Limit::Time(Duration::from_secs(number(secs, "LIMIT")?)),
        None => Limit::Transactions(number(&a[4], "LIMIT")?),
    };
    let port = |s: &str| s.parse::<u16>().map_err(|_| format!("bad port: {s}"));
    Ok(Args {
        server_port: port(&a[0])?,
        pooler_port: port(&a[1])?,
        clients: number(&a[2], "CLIENTS")? as usize,
        mode,
        limit,
        user: a.get(5).cloned().unwrap_or_else(|| "bench".into()),
    })
}

// --- messages ----------------------------------------------------------------------------------

fn message(out: &mut Vec<u8>, tag: u8, body: &[u8]) {
    out.push(tag);
    out.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
    out.extend_from_slice(body);
}

fn cstr(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(s.as_bytes());
    out.push(0);
}

/// What the backend sends for each kind of request, built once.
struct Canned {
    /// RowDescription of one int4 column.
    row_description: Vec<u8>,
    /// DataRow `1` and CommandComplete `SELECT 1`.
    row_and_complete: Vec<u8>,
    parameter_description: Vec<u8>,
}

impl Canned {
    fn new() -> Canned {
        let mut body = Vec::new();
        body.extend_from_slice(&1u16.to_be_bytes());
        cstr(&mut body, "?column?");
        body.extend_from_slice(&0u32.to_be_bytes()); // table
        body.extend_from_slice(&0u16.to_be_bytes()); // column
        body.extend_from_slice(&23u32.to_be_bytes()); // int4
        body.extend_from_slice(&4i16.to_be_bytes());
        body.extend_from_slice(&(-1i32).to_be_bytes());
        body.extend_from_slice(&0u16.to_be_bytes()); // text
        let mut row_description = Vec::new();
        message(&mut row_description, b'T', &body);
        let mut row_and_complete = Vec::new();
        let mut row = Vec::new();
        row.extend_from_slice(&1u16.to_be_bytes());
        row.extend_from_slice(&1u32.to_be_bytes());
        row.push(b'1');
        message(&mut row_and_complete, b'D', &row);
        let mut tag = Vec::new();
        cstr(&mut tag, "SELECT 1");
        message(&mut row_and_complete, b'C', &tag);
        let mut parameter_description = Vec::new();
        message(&mut parameter_description, b't', &0u16.to_be_bytes());
        Canned {
            row_description,
            row_and_complete,
            parameter_description,
        }
    }

    fn login(out: &mut Vec<u8>, pid: u32) {
        message(out, b'R', &0u32.to_be_bytes());
        for (name, value) in [
            ("server_version", "15.0"),
            ("server_encoding", "UTF8"),
            ("client_encoding", "UTF8"),
            ("DateStyle", "ISO, MDY"),
            ("TimeZone", "UTC"),
            ("IntervalStyle", "postgres"),
            ("integer_datetimes", "on"),
            ("standard_conforming_strings", "on"),
            ("application_name", ""),
            ("is_superuser", "off"),
        ] {
            let mut body = Vec::new();
            cstr(&mut body, name);
            cstr(&mut body, value);
            message(out, b'S', &body);
        }
        let mut key = pid.to_be_bytes().to_vec();
        key.extend_from_slice(&0x5eed_u32.to_be_bytes());
        message(out, b'K', &key);
        message(out, b'Z', b"I");
    }
}

/// One complete message at the front of `buf`: tag and body range.
fn frame(buf: &[u8]) -> Option<(u8, usize, usize)> {
    let len = u32::from_be_bytes(buf.get(1..5)?.try_into().ok()?) as usize;
    let end = 1 + len;
    (len >= 4 && buf.len() >= end).then_some((buf[0], 5, end))
}

// --- the backend --------------------------------------------------------------------------------

struct Backend {
    logged_in: bool,
    /// Transaction status for ReadyForQuery.
    tx: u8,
}

impl Backend {
    /// Answers the complete requests in `inbuf` (consumed) into `out`; false to close.
    fn serve(&mut self, inbuf: &mut Vec<u8>, out: &mut Vec<u8>, canned: &Canned, pid: u32) -> bool {
        let mut at = 0;
        while !self.logged_in {
            let Some(len) = inbuf
                .get(at..at + 4)
                .map(|b| u32::from_be_bytes(b.try_into().unwrap()))
            else {
                break;
            };
            let len = len as usize;
            if len < 8 || inbuf.len() < at + len {
                break;
            }
            let code = u32::from_be_bytes(inbuf[at + 4..at + 8].try_into().unwrap());
            at += len;
            match code {
                SSL_REQUEST | GSS_REQUEST => out.push(b'N'),
                CANCEL_REQUEST => return false,
                _ => {
                    Canned::login(out, pid);
                    self.logged_in = true;
                }
            }
        }
        while let Some((tag, start, end)) = frame(&inbuf[at..]) {
            let body = &inbuf[at + start..at + end];
            match tag {
                b'Q' => self.query(body, out, canned),
                b'P' => message(out, b'1', &[]),
                b'B' => message(out, b'2', &[]),
                b'D' => {
                    if body.first() == Some(&b'S') {
                        out.extend_from_slice(&canned.parameter_description);
                    }
                    out.extend_from_slice(&canned.row_description);
                }
                b'E' => out.extend_from_slice(&canned.row_and_complete),
                b'S' => message(out, b'Z', &[self.tx]),
                b'C' => message(out, b'3', &[]),
                b'X' => return false,
                _ => {}
            }
            at += end;
        }
        inbuf.drain(..at);
        true
    }

    /// A simple Query: each statement answered by its first word.
    fn query(&mut self, body: &[u8], out: &mut Vec<u8>, canned: &Canned) {
        let text = String::from_utf8_lossy(body.strip_suffix(&[0]).unwrap_or(body));
        let statements: Vec<&str> = text
            .split(';')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        if statements.is_empty() {
            message(out, b'I', &[]);
        }
        for statement in statements {
            let word = statement
                .split_whitespace()
                .next()
                .unwrap_or("")
                .to_ascii_uppercase();
            let tag = match word.as_str() {
                "SELECT" | "SHOW" | "VALUES" | "WITH" => {
                    out.extend_from_slice(&canned.row_description);
                    out.extend_from_slice(&canned.row_and_complete);
                    continue;
                }
                "BEGIN" | "START" => {
                    self.tx = b'T';
                    "BEGIN".to_string()
                }
                "COMMIT" | "END" => {
                    self.tx = b'I';
                    "COMMIT".to_string()
                }
                "ROLLBACK" | "ABORT" => {
                    self.tx = b'I';
                    "ROLLBACK".to_string()
                }
                "DISCARD" => "DISCARD ALL".to_string(),
                "DEALLOCATE" => "DEALLOCATE ALL".to_string(),
                other => other.to_string(),
            };
            let mut b = Vec::new();
            cstr(&mut b, &tag);
            message(out, b'C', &b);
        }
        message(out, b'Z', &[self.tx]);
    }
}

// --- the clients --------------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Connecting,
    LoggingIn,
    /// Its statement is being prepared (prepared mode).
    Preparing,
    /// Logged in (and its statement prepared): waits for the others.
    Ready,
    Running,
    Finished,
}

struct Client {
    phase: Phase,
    done: u64,
}

/// The bytes of one transaction, and of what a client sends once after login.
fn requests(mode: Mode) -> (Vec<u8>, Vec<u8>) {
    let mut once = Vec::new();
    let mut each = Vec::new();
    let parse = |out: &mut Vec<u8>, name: &str| {
        let mut b = Vec::new();
        cstr(&mut b, name);
        cstr(&mut b, "SELECT 1");
        b.extend_from_slice(&0u16.to_be_bytes());
        message(out, b'P', &b);
    };
    let bind = |out: &mut Vec<u8>, statement: &str| {
        let mut b = Vec::new();
        cstr(&mut b, "");
        cstr(&mut b, statement);
        b.extend_from_slice(&[0, 0, 0, 0, 0, 0]); // no formats, no parameters, text results
        message(out, b'B', &b);
    };
    let execute = |out: &mut Vec<u8>| {
        let mut b = Vec::new();
        cstr(&mut b, "");
        b.extend_from_slice(&0u32.to_be_bytes());
        message(out, b'E', &b);
    };
    match mode {
        Mode::Simple => {
            let mut b = Vec::new();
            cstr(&mut b, "SELECT 1");
            message(&mut each, b'Q', &b);
        }
        Mode::Extended => {
            parse(&mut each, "");
            bind(&mut each, "");
            message(&mut each, b'D', b"P\0");
            execute(&mut each);
            message(&mut each, b'S', &[]);
        }
        Mode::Prepared => {
            parse(&mut once, "s1");
            message(&mut once, b'S', &[]);
            bind(&mut each, "s1");
            execute(&mut each);
            message(&mut each, b'S', &[]);
        }
    }
    (once, each)
}

fn startup_packet(user: &str) -> Vec<u8> {
    let mut body = 196_608u32.to_be_bytes().to_vec();
    for (k, v) in [("user", user), ("database", "bench")] {
        cstr(&mut body, k);
        cstr(&mut body, v);
    }
    body.push(0);
    let mut out = (body.len() as u32 + 4).to_be_bytes().to_vec();
    out.extend_from_slice(&body);
    out
}

/// What a client read means: how many ReadyForQuery arrived, or the pooler's error.
fn readies(inbuf: &mut Vec<u8>) -> Result<usize, String> {
    let mut at = 0;
    let mut count = 0;
    while let Some((tag, start, end)) = frame(&inbuf[at..]) {
        let body = &inbuf[at + start..at + end];
        match tag {
            b'Z' => count += 1,
            b'E' => return Err(String::from_utf8_lossy(body).replace('\0', " ")),
            b'R' if body.get(..4) != Some(&[0, 0, 0, 0]) => {
                return Err("the pooler asks for a password: it must trust the user".into())
            }
            _ => {}
        }
        at += end;
    }
    inbuf.drain(..at);
    Ok(count)
}

// --- the loop -----------------------------------------------------------------------------------

enum Role {
    Backend(Backend),
    Client(Client),
}

struct Conn {
    sock: TcpStream,
    inbuf: Vec<u8>,
    out: Vec<u8>,
    role: Role,
}

impl Conn {
    fn new(sock: TcpStream, role: Role) -> Conn {
        Conn {
            sock,
            inbuf: Vec::with_capacity(16 * 1024),
            out: Vec::with_capacity(16 * 1024),
            role,
        }
    }
}

/// Reads what is there into `inbuf`; false when the peer closed.
fn fill(sock: &mut TcpStream, inbuf: &mut Vec<u8>) -> io::Result<bool> {
    let mut chunk = [0u8; 16 * 1024];
    loop {
        match sock.read(&mut chunk) {
            Ok(0) => return Ok(false),
            Ok(n) => inbuf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(true),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Writes what waits in `out`, as far as the socket takes it.
fn flush(sock: &mut TcpStream, out: &mut Vec<u8>) -> io::Result<()> {
    while !out.is_empty() {
        match sock.write(out) {
            Ok(n) => {
                out.drain(..n);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

struct Harness {
    args: Args,
    canned: Canned,
    once: Vec<u8>,
    each: Vec<u8>,
    conns: Vec<Option<Conn>>,
    ready: usize,
    finished: usize,
    started: Option<Instant>,
    total: u64,
}

impl Harness {
    fn client_event(&mut self, i: usize) -> Result<(), String> {
        let Conn {
            sock,
            inbuf,
            out,
            role: Role::Client(client),
        } = self.conns[i].as_mut().unwrap()
        else {
            unreachable!()
        };
        if client.phase == Phase::Connecting {
            if let Some(e) = sock.take_error().map_err(|e| e.to_string())? {
                return Err(format!("cannot connect to the pooler: {e}"));
            }
            if sock.peer_addr().is_err() {
                return Ok(());
            }
            client.phase = Phase::LoggingIn;
            out.extend_from_slice(&startup_packet(&self.args.user));
        }
        let open = fill(sock, inbuf).map_err(|e| e.to_string())?;
        let mut n = readies(inbuf)?;
        if !open && client.phase != Phase::Finished {
            return Err("the pooler closed a client connection".into());
        }
        while n > 0 {
            n -= 1;
            match client.phase {
                Phase::LoggingIn if !self.once.is_empty() => {
                    out.extend_from_slice(&self.once);
                    client.phase = Phase::Preparing;
                }
                Phase::LoggingIn | Phase::Preparing => {
                    client.phase = Phase::Ready;
                    self.ready += 1;
                }
                Phase::Running => {
                    client.done += 1;
                    self.total += 1;
                    let over = match self.args.limit {
                        Limit::Time(t) => self.started.is_some_and(|s| s.elapsed() >= t),
                        Limit::Transactions(n) => client.done >= n,
                    };
                    if over {
                        client.phase = Phase::Finished;
                        message(out, b'X', &[]);
                        self.finished += 1;
                    } else {
                        out.extend_from_slice(&self.each);
                    }
                }
                _ => {}
            }
        }
        flush(sock, out).map_err(|e| e.to_string())?;
        if self.ready == self.args.clients && self.started.is_none() {
            self.start_all()?;
        }
        Ok(())
    }

    /// Every client has logged in: each sends its first transaction.
    fn start_all(&mut self) -> Result<(), String> {
        self.started = Some(Instant::now());
        for conn in self.conns.iter_mut().flatten() {
            if let Role::Client(c) = &mut conn.role {
                c.phase = Phase::Running;
                conn.out.extend_from_slice(&self.each);
                flush(&mut conn.sock, &mut conn.out).map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    }

    fn backend_event(&mut self, i: usize) {
        let Conn {
            sock,
            inbuf,
            out,
            role: Role::Backend(backend),
        } = self.conns[i].as_mut().unwrap()
        else {
            unreachable!()
        };
        let open = matches!(fill(sock, inbuf), Ok(true));
        let keep = backend.serve(inbuf, out, &self.canned, i as u32);
        if flush(sock, out).is_err() || !open || !keep {
            self.conns[i] = None;
        }
    }
}

fn run(args: Args) -> Result<(), String> {
    let mut poll = Poll::new().map_err(|e| e.to_string())?;
    let addr = |port: u16| std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut listener =
        TcpListener::bind(addr(args.server_port)).map_err(|e| format!("bind: {e}"))?;
    poll.registry()
        .register(&mut listener, LISTENER, Interest::READABLE)
        .map_err(|e| e.to_string())?;
    let (once, each) = requests(args.mode);
    let mut h = Harness {
        canned: Canned::new(),
        once,
        each,
        conns: Vec::new(),
        ready: 0,
        finished: 0,
        started: None,
        total: 0,
        args,
    };
    for i in 0..h.args.clients {
        let mut sock = TcpStream::connect(addr(h.args.pooler_port)).map_err(|e| e.to_string())?;
        sock.set_nodelay(true).map_err(|e| e.to_string())?;
        let interest = Interest::READABLE | Interest::WRITABLE;
        poll.registry()
            .register(&mut sock, Token(i), interest)
            .map_err(|e| e.to_string())?;
        let client = Client {
            phase: Phase::Connecting,
            done: 0,
        };
        h.conns.push(Some(Conn::new(sock, Role::Client(client))));
    }
    let mut events = Events::with_capacity(1024);
    while h.finished < h.args.clients {
        poll.poll(&mut events, Some(Duration::from_secs(30)))
            .map_err(|e| e.to_string())?;
        if events.is_empty() {
            return Err("nothing happened for 30 s".into());
        }
        for event in events.iter() {
            match event.token() {
                LISTENER => loop {
                    match listener.accept() {
                        Ok((mut sock, _)) => {
                            sock.set_nodelay(true).map_err(|e| e.to_string())?;
                            let token = Token(h.conns.len());
                            let interest = Interest::READABLE | Interest::WRITABLE;
                            poll.registry()
                                .register(&mut sock, token, interest)
                                .map_err(|e| e.to_string())?;
                            let backend = Backend {
                                logged_in: false,
                                tx: b'I',
                            };
                            h.conns.push(Some(Conn::new(sock, Role::Backend(backend))));
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) => return Err(format!("accept: {e}")),
                    }
                },
                Token(i) => match h.conns.get(i) {
                    Some(Some(Conn {
                        role: Role::Client(_),
                        ..
                    })) => h.client_event(i)?,
                    Some(Some(_)) => h.backend_event(i),
                    _ => {}
                },
            }
        }
    }
    let seconds = h.started.map_or(0.0, |s| s.elapsed().as_secs_f64());
    println!(
        "transactions {} seconds {:.3} tps {:.0}",
        h.total,
        seconds,
        h.total as f64 / seconds.max(1e-9)
    );
    Ok(())
}

fn main() {
    let result = args().and_then(run);
    if let Err(e) = result {
        eprintln!("pgward-harness: {e}");
        std::process::exit(1);
    }
}
