//! A small protocol 3 client over `std::net`, for tests that need exact bytes on the wire:
//! encryption requests, malformed packets, cancel keys, unsolicited errors.
//!
//! Every read has a deadline, so a pooler that stops answering fails the test instead of
//! hanging it.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use super::HOST;

/// Protocol version 3.0 as a startup code.
pub const PROTOCOL_3_0: u32 = 3 << 16;

/// How long a read waits unless a test asks for another limit.
const DEFAULT_WAIT: Duration = Duration::from_secs(10);

/// One backend message: its tag and body.
#[derive(Debug, Clone)]
pub struct Message {
    pub tag: u8,
    pub body: Vec<u8>,
}

/// The fields of an ErrorResponse or NoticeResponse.
#[derive(Debug, Clone, Default)]
pub struct Fields(pub Vec<(u8, String)>);

impl Fields {
    /// Parses the body of an 'E' or 'N' message.
    pub fn parse(body: &[u8]) -> Fields {
        let mut fields = Vec::new();
        let mut rest = body;
        while let Some((&kind, tail)) = rest.split_first() {
            if kind == 0 {
                break;
            }
            let end = tail.iter().position(|b| *b == 0).unwrap_or(tail.len());
            fields.push((kind, String::from_utf8_lossy(&tail[..end]).into_owned()));
            rest = tail.get(end + 1..).unwrap_or(&[]);
        }
        Fields(fields)
    }

    /// The field of `kind`, or an empty string.
    pub fn get(&self, kind: u8) -> &str {
        self.0
            .iter()
            .find(|(k, _)| *k == kind)
            .map_or("", |(_, v)| v.as_str())
    }

    /// The SQLSTATE ('C').
    pub fn code(&self) -> &str {
        self.get(b'C')
    }

    /// The non-localized severity ('V'), else the localized one ('S').
    pub fn severity(&self) -> &str {
        match self.get(b'V') {
            "" => self.get(b'S'),
            v => v,
        }
    }

    /// The hint ('H').
    pub fn hint(&self) -> &str {
        self.get(b'H')
    }

    /// The primary message ('M').
    pub fn message(&self) -> &str {
        self.get(b'M')
    }
}

/// What a successful login returned.
#[derive(Debug, Clone, Default)]
pub struct Login {
    /// BackendKeyData: process id and secret.
    pub key: Option<(u32, Vec<u8>)>,
    /// Every ParameterStatus, in order.
    pub params: Vec<(String, String)>,
    /// Whether a NegotiateProtocolVersion came before the authentication request.
    pub negotiated: bool,
}

impl Login {
    /// The last value reported for `name` (case-insensitive).
    pub fn param(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .rev()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// The rows of a simple query, each column as text (`None` for NULL).
pub type Rows = Vec<Vec<Option<String>>>;

/// A raw connection to a pooler or server on 127.0.0.1.
pub struct Raw {
    pub stream: TcpStream,
    buf: Vec<u8>,
}

impl Raw {
    /// Connects to 127.0.0.1:`port`.
    pub fn connect(port: u16) -> Raw {
        let stream = TcpStream::connect((HOST, port))
            .unwrap_or_else(|err| panic!("cannot connect to {HOST}:{port}: {err}"));
        let _ = stream.set_nodelay(true);
        Raw {
            stream,
            buf: Vec::new(),
        }
    }

    /// Sends `bytes`; a closed connection is not an error here (the next read shows it).
    pub fn send(&mut self, bytes: &[u8]) {
        let _ = self.stream.write_all(bytes);
    }

    /// Reads more bytes into the buffer before `deadline`: false on end of stream or timeout.
    fn fill(&mut self, deadline: Instant) -> Result<bool, ReadError> {
        let now = Instant::now();
        if now >= deadline {
            return Err(ReadError::Timeout);
        }
        let _ = self.stream.set_read_timeout(Some(deadline - now));
        let mut chunk = [0u8; 8192];
        match self.stream.read(&mut chunk) {
            Ok(0) => Ok(false),
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                Ok(true)
            }
            Err(err) if matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                Err(ReadError::Timeout)
            }
            Err(_) => Ok(false),
        }
    }

    /// Reads one byte (the answer to an SSLRequest or GSSENCRequest).
    pub fn read_byte(&mut self) -> Result<u8, ReadError> {
        let deadline = Instant::now() + DEFAULT_WAIT;
        while self.buf.is_empty() {
            if !self.fill(deadline)? {
                return Err(ReadError::Closed);
            }
        }
        Ok(self.buf.remove(0))
    }

    /// Reads one message within `wait`.
    pub fn read_message_within(&mut self, wait: Duration) -> Result<Message, ReadError> {
        let deadline = Instant::now() + wait;
        loop {
            if self.buf.len() >= 5 {
                let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]])
                    as usize;
                assert!(len >= 4, "message with length {len}");
                if self.buf.len() > len {
                    let body = self.buf[5..1 + len].to_vec();
                    let tag = self.buf[0];
                    self.buf.drain(..1 + len);
                    return Ok(Message { tag, body });
                }
            }
            if !self.fill(deadline)? {
                return Err(ReadError::Closed);
            }
        }
    }

    /// Reads one message within the default wait.
    pub fn read_message(&mut self) -> Result<Message, ReadError> {
        self.read_message_within(DEFAULT_WAIT)
    }

    /// Reads messages until an ErrorResponse, within `wait`; skips everything else.
    pub fn expect_error_within(&mut self, wait: Duration) -> Fields {
        let deadline = Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.read_message_within(left) {
                Ok(msg) if msg.tag == b'E' => return Fields::parse(&msg.body),
                Ok(_) => {}
                Err(err) => panic!("expected an ErrorResponse, got {err:?}"),
            }
        }
    }

    /// Reads messages until an ErrorResponse within the default wait.
    pub fn expect_error(&mut self) -> Fields {
        self.expect_error_within(DEFAULT_WAIT)
    }

    /// Whether the peer closes the connection within `wait` (messages before that are skipped).
    pub fn closes_within(&mut self, wait: Duration) -> bool {
        let deadline = Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.read_message_within(left) {
                Ok(_) => {}
                Err(ReadError::Closed) => return true,
                Err(ReadError::Timeout) => return false,
            }
        }
    }

    /// Sends a 3.0 startup message with `params` and reads to ReadyForQuery; only the trust
    /// exchange (AuthenticationOk) is supported. An ErrorResponse comes back as `Err`.
    pub fn startup(&mut self, params: &[(&str, &str)]) -> Result<Login, Fields> {
        self.send(&startup_packet(PROTOCOL_3_0, params));
        self.finish_login()
    }

    /// Reads a login's answer to ReadyForQuery (see [`Raw::startup`]).
    pub fn finish_login(&mut self) -> Result<Login, Fields> {
        let mut login = Login::default();
        loop {
            let msg = self
                .read_message()
                .unwrap_or_else(|err| panic!("login: {err:?}"));
            match msg.tag {
                b'R' => assert_eq!(msg.body, [0, 0, 0, 0], "only trust logins are supported"),
                b'v' => login.negotiated = true,
                b'S' => {
                    let mut parts = msg.body.split(|b| *b == 0);
                    let name = String::from_utf8_lossy(parts.next().unwrap_or(&[])).into_owned();
                    let value = String::from_utf8_lossy(parts.next().unwrap_or(&[])).into_owned();
                    login.params.push((name, value));
                }
                b'K' => {
                    assert!(msg.body.len() >= 8, "short BackendKeyData");
                    let pid =
                        u32::from_be_bytes([msg.body[0], msg.body[1], msg.body[2], msg.body[3]]);
                    login.key = Some((pid, msg.body[4..].to_vec()));
                }
                b'E' => return Err(Fields::parse(&msg.body)),
                b'Z' => return Ok(login),
                _ => {}
            }
        }
    }

    /// Runs `sql` with the simple query protocol and reads to ReadyForQuery. The first error
    /// is returned as `Err` (after ReadyForQuery, or when the connection closes after a FATAL).
    pub fn query(&mut self, sql: &str) -> Result<Rows, Fields> {
        self.send(&query_message(sql));
        self.read_result(DEFAULT_WAIT)
    }

    /// Reads the answer to a query already sent, within `wait`.
    pub fn read_result(&mut self, wait: Duration) -> Result<Rows, Fields> {
        let deadline = Instant::now() + wait;
        let mut rows = Vec::new();
        let mut error = None;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let msg = match self.read_message_within(left) {
                Ok(msg) => msg,
                Err(err) => {
                    return match error {
                        Some(fields) => Err(fields),
                        None => panic!("query: {err:?}"),
                    }
                }
            };
            match msg.tag {
                b'D' => rows.push(data_row(&msg.body)),
                b'E' => {
                    error.get_or_insert(Fields::parse(&msg.body));
                }
                b'Z' => return error.map_or(Ok(rows), Err),
                _ => {}
            }
        }
    }

    /// Runs `sql` and returns the first column of the first row, panicking on errors.
    pub fn value(&mut self, sql: &str) -> String {
        match self.query(sql) {
            Ok(rows) => rows
                .first()
                .and_then(|row| row.first().cloned().flatten())
                .unwrap_or_default(),
            Err(fields) => panic!("{sql}: {fields:?}"),
        }
    }

    /// Sends Terminate and closes.
    pub fn terminate(mut self) {
        self.send(&[b'X', 0, 0, 0, 4]);
    }
}

/// Why a read gave up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadError {
    Timeout,
    Closed,
}

fn data_row(body: &[u8]) -> Vec<Option<String>> {
    let count = u16::from_be_bytes([body[0], body[1]]) as usize;
    let mut at = 2;
    let mut row = Vec::with_capacity(count);
    for _ in 0..count {
        let len = i32::from_be_bytes([body[at], body[at + 1], body[at + 2], body[at + 3]]);
        at += 4;
        if len < 0 {
            row.push(None);
        } else {
            let end = at + len as usize;
            row.push(Some(String::from_utf8_lossy(&body[at..end]).into_owned()));
            at = end;
        }
    }
    row
}

/// An untagged packet: length (including itself) then `body`.
pub fn untagged(body: &[u8]) -> Vec<u8> {
    let mut out = ((body.len() + 4) as u32).to_be_bytes().to_vec();
    out.extend_from_slice(body);
    out
}

/// A tagged message.
pub fn message(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    out.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
    out.extend_from_slice(body);
    out
}

/// A startup message with protocol `version` and `params`, properly terminated.
pub fn startup_packet(version: u32, params: &[(&str, &str)]) -> Vec<u8> {
    let mut body = version.to_be_bytes().to_vec();
    for (name, value) in params {
        body.extend_from_slice(name.as_bytes());
        body.push(0);
        body.extend_from_slice(value.as_bytes());
        body.push(0);
    }
    body.push(0);
    untagged(&body)
}

/// SSLRequest.
pub fn ssl_request() -> Vec<u8> {
    untagged(&80_877_103u32.to_be_bytes())
}

/// GSSENCRequest.
pub fn gssenc_request() -> Vec<u8> {
    untagged(&80_877_104u32.to_be_bytes())
}

/// CancelRequest for key (`pid`, `secret`).
pub fn cancel_request(pid: u32, secret: &[u8]) -> Vec<u8> {
    let mut body = 80_877_102u32.to_be_bytes().to_vec();
    body.extend_from_slice(&pid.to_be_bytes());
    body.extend_from_slice(secret);
    untagged(&body)
}

/// Sends a CancelRequest on a new connection to `port` and waits until the pooler closes it.
pub fn send_cancel(port: u16, pid: u32, secret: &[u8]) {
    let mut raw = Raw::connect(port);
    raw.send(&cancel_request(pid, secret));
    let closed = raw.closes_within(DEFAULT_WAIT);
    assert!(closed, "the cancel connection was not closed");
}

/// A simple Query message.
pub fn query_message(sql: &str) -> Vec<u8> {
    let mut body = sql.as_bytes().to_vec();
    body.push(0);
    message(b'Q', &body)
}

/// A Parse message: statement `name`, `sql`, no parameter types.
pub fn parse_message(name: &str, sql: &str) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(name.as_bytes());
    body.push(0);
    body.extend_from_slice(sql.as_bytes());
    body.extend_from_slice(&[0, 0, 0]);
    message(b'P', &body)
}

/// A Bind message of the unnamed portal to statement `name`, no parameters, text results.
pub fn bind_message(name: &str) -> Vec<u8> {
    let mut body = vec![0];
    body.extend_from_slice(name.as_bytes());
    body.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0]);
    message(b'B', &body)
}

/// An Execute message of the unnamed portal, no row limit.
pub fn execute_message() -> Vec<u8> {
    message(b'E', &[0, 0, 0, 0, 0])
}

/// A Sync message.
pub fn sync_message() -> Vec<u8> {
    message(b'S', &[])
}

/// Parse, Bind and Execute of `sql` as the unnamed statement (no Sync).
pub fn extended_query(sql: &str) -> Vec<u8> {
    named_extended_query("", sql)
}

/// Parse, Bind and Execute of `sql` as statement `name` (no Sync).
pub fn named_extended_query(name: &str, sql: &str) -> Vec<u8> {
    let mut out = parse_message(name, sql);
    out.extend_from_slice(&bind_message(name));
    out.extend_from_slice(&execute_message());
    out
}

/// A fast-path FunctionCall of function `oid` with text arguments, text result.
pub fn function_call_message(oid: u32, args: &[&str]) -> Vec<u8> {
    let mut body = oid.to_be_bytes().to_vec();
    body.extend_from_slice(&1u16.to_be_bytes());
    body.extend_from_slice(&0u16.to_be_bytes());
    body.extend_from_slice(&(args.len() as u16).to_be_bytes());
    for arg in args {
        body.extend_from_slice(&(arg.len() as u32).to_be_bytes());
        body.extend_from_slice(arg.as_bytes());
    }
    body.extend_from_slice(&0u16.to_be_bytes());
    message(b'F', &body)
}

impl Raw {
    /// Reads every message up to and including the next ReadyForQuery.
    pub fn read_to_ready(&mut self) -> Vec<Message> {
        let mut out = Vec::new();
        loop {
            let msg = self
                .read_message()
                .unwrap_or_else(|err| panic!("reading to ReadyForQuery: {err:?} after {out:?}"));
            let ready = msg.tag == b'Z';
            out.push(msg);
            if ready {
                return out;
            }
        }
    }
}

/// The tags of `messages`, as characters.
pub fn tags(messages: &[Message]) -> String {
    messages.iter().map(|m| m.tag as char).collect()
}

/// The command tag of a CommandComplete body.
pub fn command_tag(msg: &Message) -> String {
    String::from_utf8_lossy(msg.body.strip_suffix(&[0]).unwrap_or(&msg.body)).into_owned()
}
