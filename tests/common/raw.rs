//! The tests' one raw protocol 3 client, over TCP, a Unix socket or TLS, for tests that need
//! exact bytes on the wire: encryption requests, malformed packets, cancel keys, pipelines,
//! unsolicited errors, and answers compared byte for byte with PostgreSQL's.
//!
//! Frontend messages are built with [`Batch`] (or the one-message shorthands after it) and
//! sent in one write; backend messages come back as [`Message`] values. Every read has a
//! deadline, so a pooler that stops answering fails the test instead of hanging it: reads that
//! return a `Result` take their limit as an argument or wait ten seconds, and the pipeline
//! reads that panic ([`Raw::recv`], [`Raw::until_ready`], [`Raw::until_tag`],
//! [`Raw::exchange`]) wait fifteen seconds.

use std::io::{self, ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use super::{md5_secret, Pgward, Postgres, HOST};

/// Protocol version 3.0 as a startup code.
pub const PROTOCOL_3_0: u32 = 3 << 16;

/// How long a read waits unless a test asks for another limit.
const DEFAULT_WAIT: Duration = Duration::from_secs(10);

/// How long each of the pipeline reads that panic waits.
const PIPELINE_WAIT: Duration = Duration::from_secs(15);

/// One backend message: its tag and its body (without the length).
#[derive(Clone, PartialEq, Eq)]
pub struct Message {
    pub tag: u8,
    pub body: Vec<u8>,
}

impl std::fmt::Debug for Message {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}{:?}",
            char::from(self.tag),
            String::from_utf8_lossy(&self.body)
        )
    }
}

impl Message {
    /// The fields of an ErrorResponse or NoticeResponse.
    pub fn fields(&self) -> Fields {
        Fields::parse(&self.body)
    }

    /// The SQLSTATE of an ErrorResponse (`None` for other messages).
    pub fn sqlstate(&self) -> Option<String> {
        if self.tag != b'E' {
            return None;
        }
        let fields = self.fields();
        let code = fields.code();
        (!code.is_empty()).then(|| code.to_string())
    }

    /// The columns of a DataRow, as text (`None` for NULL).
    pub fn columns(&self) -> Vec<Option<String>> {
        let body = &self.body;
        let count = body
            .get(..2)
            .map_or(0, |c| u16::from_be_bytes([c[0], c[1]]));
        let mut at = 2;
        let mut out = Vec::new();
        for _ in 0..count {
            let Some(len) = body.get(at..at + 4) else {
                break;
            };
            let len = i32::from_be_bytes([len[0], len[1], len[2], len[3]]);
            at += 4;
            if len < 0 {
                out.push(None);
                continue;
            }
            let end = at + len as usize;
            out.push(
                body.get(at..end)
                    .map(|v| String::from_utf8_lossy(v).into_owned()),
            );
            at = end;
        }
        out
    }

    /// The first column of a DataRow, as text (`None` for NULL or a malformed row).
    pub fn first_column(&self) -> Option<String> {
        self.columns().into_iter().next().flatten()
    }
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

/// Why a read gave up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadError {
    Timeout,
    /// The peer closed the connection (end of stream).
    Closed,
    /// The connection failed (reset by the peer: it closed with bytes unread).
    Reset,
}

impl ReadError {
    /// Whether the connection is gone, closed or reset.
    pub fn is_gone(self) -> bool {
        matches!(self, ReadError::Closed | ReadError::Reset)
    }
}

/// The connection under a [`Raw`].
enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Stream {
    fn set_read_timeout(&self, wait: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_read_timeout(wait),
            Stream::Unix(s) => s.set_read_timeout(wait),
            Stream::Tls(s) => s.sock.set_read_timeout(wait),
        }
    }

    fn set_write_timeout(&self, wait: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_write_timeout(wait),
            Stream::Unix(s) => s.set_write_timeout(wait),
            Stream::Tls(s) => s.sock.set_write_timeout(wait),
        }
    }

    fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_nonblocking(on),
            Stream::Unix(s) => s.set_nonblocking(on),
            Stream::Tls(s) => s.sock.set_nonblocking(on),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.flush(),
            Stream::Unix(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}

/// A raw connection to a pooler or server.
pub struct Raw {
    stream: Stream,
    buf: Vec<u8>,
}

impl Raw {
    /// Connects to 127.0.0.1:`port`.
    pub fn connect(port: u16) -> Raw {
        let stream = TcpStream::connect((HOST, port))
            .unwrap_or_else(|err| panic!("cannot connect to {HOST}:{port}: {err}"));
        Raw::from_stream(stream)
    }

    /// A client over a TCP connection the test opened itself.
    pub fn from_stream(stream: TcpStream) -> Raw {
        let _ = stream.set_nodelay(true);
        Raw::over(Stream::Tcp(stream))
    }

    /// A second handle on this client's TCP connection, for a thread that writes while this
    /// one reads.
    pub fn writer(&self) -> TcpStream {
        match &self.stream {
            Stream::Tcp(s) => s.try_clone().expect("a second handle on the connection"),
            _ => panic!("not a plain TCP client"),
        }
    }

    /// Connects to the Unix socket at `path`.
    pub fn connect_unix(path: &Path) -> Raw {
        let stream = UnixStream::connect(path)
            .unwrap_or_else(|err| panic!("cannot connect to {}: {err}", path.display()));
        Raw::over(Stream::Unix(stream))
    }

    /// A client over a TLS session the test set up.
    pub fn over_tls(tls: rustls::StreamOwned<rustls::ClientConnection, TcpStream>) -> Raw {
        Raw::over(Stream::Tls(Box::new(tls)))
    }

    fn over(stream: Stream) -> Raw {
        Raw {
            stream,
            buf: Vec::new(),
        }
    }

    /// Connects to 127.0.0.1:`port` and logs in as `user` on `db`, answering a cleartext or
    /// MD5 password request with `password`; panics when the login fails.
    pub fn login(port: u16, user: &str, password: Option<&str>, db: &str) -> Raw {
        Raw::connect(port).logged_in(user, password, db)
    }

    /// Logs in as `user` on `db` (see [`Raw::login`]).
    pub fn logged_in(mut self, user: &str, password: Option<&str>, db: &str) -> Raw {
        let params = [("user", user), ("database", db)];
        if let Err(fields) = self.startup_with_password(&params, password) {
            panic!("login as {user} to {db} refused: {fields:?}");
        }
        self
    }

    /// Logs in to 127.0.0.1:`port` with `params` (trust only) within `wait`; `Err` is the
    /// refusal or the timeout.
    pub fn login_within(port: u16, params: &[(&str, &str)], wait: Duration) -> Result<Raw, String> {
        let mut client = Raw::connect(port);
        client.send(&startup_packet(PROTOCOL_3_0, params));
        let messages = client.until_ready_within(wait)?;
        match first_error(&messages) {
            Some(fields) => Err(format!("{fields:?}")),
            None => Ok(client),
        }
    }

    /// Sends `bytes`; a closed connection is not an error here (the next read shows it).
    pub fn send(&mut self, bytes: &[u8]) {
        let _ = self.stream.write_all(bytes);
    }

    /// Sends `bytes` unless the peer stops reading them for `wait`: whether all went.
    pub fn send_within(&mut self, bytes: &[u8], wait: Duration) -> bool {
        let _ = self.stream.set_write_timeout(Some(wait));
        let sent = self.stream.write_all(bytes).is_ok();
        let _ = self.stream.set_write_timeout(None);
        sent
    }

    /// Reads more bytes into the buffer before `deadline`: false on end of stream.
    fn fill(&mut self, deadline: Instant) -> Result<bool, ReadError> {
        let now = Instant::now();
        if now >= deadline {
            return Err(ReadError::Timeout);
        }
        let _ = self.stream.set_read_timeout(Some(deadline - now));
        let mut chunk = [0u8; 16384];
        match self.stream.read(&mut chunk) {
            Ok(0) => Ok(false),
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                Ok(true)
            }
            // A signal (a read with a timeout is never restarted): read again.
            Err(err) if err.kind() == ErrorKind::Interrupted => self.fill(deadline),
            Err(err) if matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                Err(ReadError::Timeout)
            }
            Err(_) => Err(ReadError::Reset),
        }
    }

    /// Whether bytes from the peer are waiting to be read, without waiting for any.
    pub fn has_input(&mut self) -> bool {
        if !self.buf.is_empty() {
            return true;
        }
        let _ = self.stream.set_nonblocking(true);
        let mut chunk = [0u8; 16384];
        let waiting = match self.stream.read(&mut chunk) {
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                n > 0
            }
            Err(_) => false,
        };
        let _ = self.stream.set_nonblocking(false);
        waiting
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

    /// The next message; panics when none comes within fifteen seconds.
    pub fn recv(&mut self) -> Message {
        self.read_message_within(PIPELINE_WAIT)
            .unwrap_or_else(|err| panic!("no message within {PIPELINE_WAIT:?}: {err:?}"))
    }

    /// Reads messages up to and including the `count`th that `last` accepts, within `wait`;
    /// `Err` names what came instead.
    fn read_until(
        &mut self,
        count: usize,
        last: impl Fn(&Message) -> bool,
        wait: Duration,
    ) -> Result<Vec<Message>, String> {
        let deadline = Instant::now() + wait;
        let mut seen = Vec::new();
        let mut found = 0;
        while found < count {
            let left = deadline.saturating_duration_since(Instant::now());
            let msg = self
                .read_message_within(left)
                .map_err(|err| format!("{err:?} after [{}]", describe(&seen)))?;
            found += usize::from(last(&msg));
            seen.push(msg);
        }
        Ok(seen)
    }

    /// Reads messages until one with `tag`, within `wait`; `Err` names what came instead.
    pub fn until_tag_within(&mut self, tag: u8, wait: Duration) -> Result<Vec<Message>, String> {
        self.read_until(1, |m| m.tag == tag, wait)
            .map_err(|err| format!("waiting for '{}': {err}", char::from(tag)))
    }

    /// Reads messages up to and including a ReadyForQuery, within `wait`.
    pub fn until_ready_within(&mut self, wait: Duration) -> Result<Vec<Message>, String> {
        self.until_tag_within(b'Z', wait)
    }

    /// Reads messages up to and including the next ReadyForQuery; panics when it does not
    /// come within the default wait.
    pub fn read_to_ready(&mut self) -> Vec<Message> {
        self.until_ready_within(DEFAULT_WAIT)
            .unwrap_or_else(|err| panic!("reading to ReadyForQuery: {err}"))
    }

    /// Reads until `count` ReadyForQuery messages have arrived, within fifteen seconds;
    /// returns everything read.
    pub fn until_ready(&mut self, count: usize) -> Vec<Message> {
        self.read_until(count, |m| m.tag == b'Z', PIPELINE_WAIT)
            .unwrap_or_else(|err| panic!("waiting for {count} ReadyForQuery: {err}"))
    }

    /// Reads until a message with `tag` arrives, within fifteen seconds; returns everything
    /// read, that one included.
    pub fn until_tag(&mut self, tag: u8) -> Vec<Message> {
        self.until_tag_within(tag, PIPELINE_WAIT)
            .unwrap_or_else(|err| panic!("{err}"))
    }

    /// Sends `bytes` and reads until `readies` ReadyForQuery messages (see
    /// [`Raw::until_ready`]).
    pub fn exchange(&mut self, bytes: &[u8], readies: usize) -> Vec<Message> {
        self.send(bytes);
        self.until_ready(readies)
    }

    /// Sends `bytes` and reads to the next ReadyForQuery, panicking (naming `what`) when none
    /// comes within `wait`.
    pub fn exchange_within(&mut self, bytes: &[u8], wait: Duration, what: &str) -> Vec<Message> {
        self.send(bytes);
        self.until_ready_within(wait)
            .unwrap_or_else(|err| panic!("{what}: {err}"))
    }

    /// Reads messages until an ErrorResponse, within `wait`; skips everything else.
    pub fn expect_error_within(&mut self, wait: Duration) -> Fields {
        let deadline = Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.read_message_within(left) {
                Ok(msg) if msg.tag == b'E' => return msg.fields(),
                Ok(_) => {}
                Err(err) => panic!("expected an ErrorResponse, got {err:?}"),
            }
        }
    }

    /// Reads messages until an ErrorResponse within the default wait.
    pub fn expect_error(&mut self) -> Fields {
        self.expect_error_within(DEFAULT_WAIT)
    }

    /// Whether the peer closes the connection within `wait`; whatever it sends before that is
    /// skipped, messages or not (a TLS alert, say).
    pub fn closes_within(&mut self, wait: Duration) -> bool {
        let deadline = Instant::now() + wait;
        loop {
            self.buf.clear();
            match self.fill(deadline) {
                Ok(true) => {}
                Ok(false) | Err(ReadError::Reset) => return true,
                Err(_) => return false,
            }
        }
    }

    /// Sends a 3.0 startup message with `params` and reads to ReadyForQuery; only the trust
    /// exchange (AuthenticationOk) is supported. An ErrorResponse comes back as `Err`.
    pub fn startup(&mut self, params: &[(&str, &str)]) -> Result<Login, Fields> {
        self.startup_with_password(params, None)
    }

    /// Like [`Raw::startup`], answering a cleartext or MD5 password request with `password`.
    pub fn startup_with_password(
        &mut self,
        params: &[(&str, &str)],
        password: Option<&str>,
    ) -> Result<Login, Fields> {
        self.send(&startup_packet(PROTOCOL_3_0, params));
        let user = params
            .iter()
            .find(|(name, _)| *name == "user")
            .map_or("", |(_, value)| *value);
        self.answer_login(user, password)
    }

    /// Reads a login's answer to ReadyForQuery (see [`Raw::startup`]).
    pub fn finish_login(&mut self) -> Result<Login, Fields> {
        self.answer_login("", None)
    }

    /// Reads a login's answer to ReadyForQuery, answering password requests for `user` with
    /// `password`.
    fn answer_login(&mut self, user: &str, password: Option<&str>) -> Result<Login, Fields> {
        let mut login = Login::default();
        loop {
            let msg = self
                .read_message()
                .unwrap_or_else(|err| panic!("login: {err:?}"));
            match msg.tag {
                b'R' => self.answer_authentication(&msg.body, user, password),
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
                b'E' => return Err(msg.fields()),
                b'Z' => return Ok(login),
                _ => {}
            }
        }
    }

    /// Answers an authentication request: nothing for AuthenticationOk, the password for a
    /// cleartext or MD5 request.
    fn answer_authentication(&mut self, body: &[u8], user: &str, password: Option<&str>) {
        let kind = body
            .get(..4)
            .map(|k| u32::from_be_bytes([k[0], k[1], k[2], k[3]]));
        let password = || password.unwrap_or_else(|| panic!("{user}: a password is asked"));
        match kind {
            Some(0) => {}
            Some(3) => self.send(&password_message(password())),
            Some(5) => {
                let salt = body.get(4..8).unwrap_or_else(|| panic!("short salt"));
                self.send(&password_message(&md5_password(user, password(), salt)));
            }
            other => panic!("unsupported authentication request {other:?}"),
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
                b'D' => rows.push(msg.columns()),
                b'E' => {
                    error.get_or_insert(msg.fields());
                }
                b'Z' => return error.map_or(Ok(rows), Err),
                _ => {}
            }
        }
    }

    /// What the answer to a query already sent says: the first column of its first row, or
    /// `Err` with the error or the failure to answer within `wait`.
    pub fn read_value(&mut self, wait: Duration) -> Result<String, String> {
        let messages = self.until_ready_within(wait)?;
        if let Some(fields) = first_error(&messages) {
            return Err(format!("{fields:?}"));
        }
        let row = messages.iter().find(|m| m.tag == b'D');
        Ok(row.and_then(Message::first_column).unwrap_or_default())
    }

    /// Runs `sql` with the simple query protocol; see [`Raw::read_value`].
    pub fn value_within(&mut self, sql: &str, wait: Duration) -> Result<String, String> {
        self.send(&query_message(sql));
        self.read_value(wait)
    }

    /// Runs `sql` and returns the first column of the first row (empty for none or NULL),
    /// panicking on errors.
    pub fn value(&mut self, sql: &str) -> String {
        self.value_within(sql, DEFAULT_WAIT)
            .unwrap_or_else(|err| panic!("{sql}: {err}"))
    }

    /// Sends Terminate and closes.
    pub fn terminate(mut self) {
        self.send(&terminate_message());
    }
}

// ---------------------------------------------------------------------------------------------
// Clients of the fixtures.

impl Pgward {
    /// A raw client logged in as `trustuser` on `app` (trust); panics with pgward's log when
    /// the login is refused or not done within ten seconds.
    pub fn client(&self) -> Raw {
        self.client_as("trustuser", "app")
    }

    /// A raw client logged in as `user` on `db` (see [`Pgward::client`]).
    pub fn client_as(&self, user: &str, db: &str) -> Raw {
        self.client_with(&[("user", user), ("database", db)])
    }

    /// A raw client logged in with the startup parameters `params` (see [`Pgward::client`]).
    pub fn client_with(&self, params: &[(&str, &str)]) -> Raw {
        Raw::login_within(self.port, params, DEFAULT_WAIT)
            .unwrap_or_else(|err| panic!("login with {params:?}: {err}\n{}", self.log()))
    }
}

impl Postgres {
    /// A raw client logged in to PostgreSQL itself as `trustuser` on `app`, for reference
    /// answers.
    pub fn client(&self) -> Raw {
        let params = [("user", "trustuser"), ("database", "app")];
        Raw::login_within(self.port, &params, DEFAULT_WAIT)
            .unwrap_or_else(|err| panic!("login to PostgreSQL: {err}"))
    }
}

/// Logs a new client in to `pw` as `user` on `db` and runs `sql`, each step within `wait`: the
/// first column of the first row, or why there is none.
pub fn new_client_value(
    pw: &Pgward,
    (user, db): (&str, &str),
    sql: &str,
    wait: Duration,
) -> Result<String, String> {
    let mut client = Raw::login_within(pw.port, &[("user", user), ("database", db)], wait)?;
    client.value_within(sql, wait)
}

/// Sends a CancelRequest on a new connection to `port` and waits until the pooler closes it.
pub fn send_cancel(port: u16, pid: u32, secret: &[u8]) {
    let mut raw = Raw::connect(port);
    raw.send(&cancel_request(pid, secret));
    let closed = raw.closes_within(DEFAULT_WAIT);
    assert!(closed, "the cancel connection was not closed");
}

// ---------------------------------------------------------------------------------------------
// What came back.

/// The tags of `messages`, as a string (`"12TDCZ"`), for compact assertions.
pub fn tags(messages: &[Message]) -> String {
    messages.iter().map(|m| char::from(m.tag)).collect()
}

/// Messages with errors spelled out, for failure reports.
pub fn describe(messages: &[Message]) -> String {
    let parts: Vec<String> = messages
        .iter()
        .map(|m| match m.tag {
            b'E' => {
                let f = m.fields();
                format!("E({} {} {})", f.severity(), f.code(), f.message())
            }
            tag => char::from(tag).to_string(),
        })
        .collect();
    parts.join(" ")
}

/// The fields of the first ErrorResponse among `messages`.
pub fn first_error(messages: &[Message]) -> Option<Fields> {
    messages.iter().find(|m| m.tag == b'E').map(Message::fields)
}

/// The SQLSTATE of the first error among `messages`, or `""`.
pub fn error_code(messages: &[Message]) -> String {
    first_error(messages).map_or_else(String::new, |f| f.code().to_string())
}

/// The SQLSTATEs of the errors among `messages`.
pub fn errors(messages: &[Message]) -> Vec<String> {
    messages.iter().filter_map(Message::sqlstate).collect()
}

/// The first column of every DataRow among `messages`.
pub fn values(messages: &[Message]) -> Vec<Option<String>> {
    messages
        .iter()
        .filter(|m| m.tag == b'D')
        .map(Message::first_column)
        .collect()
}

/// The command tag of a CommandComplete body.
pub fn command_tag(msg: &Message) -> String {
    String::from_utf8_lossy(msg.body.strip_suffix(&[0]).unwrap_or(&msg.body)).into_owned()
}

// ---------------------------------------------------------------------------------------------
// Frontend messages.

/// Frontend messages, appended one after the other into one buffer sent in one write.
#[derive(Debug, Default, Clone)]
pub struct Batch {
    pub bytes: Vec<u8>,
}

impl std::ops::Deref for Batch {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

impl Batch {
    pub fn new() -> Batch {
        Batch::default()
    }

    fn push(mut self, tag: u8, body: &[u8]) -> Batch {
        self.bytes.extend(message(tag, body));
        self
    }

    pub fn query(self, sql: &str) -> Batch {
        self.push(b'Q', &cstr(sql))
    }

    pub fn parse(self, name: &str, sql: &str, types: &[u32]) -> Batch {
        let mut body = cstr(name);
        body.extend(cstr(sql));
        body.extend(count16(types.len()));
        for oid in types {
            body.extend(oid.to_be_bytes());
        }
        self.push(b'P', &body)
    }

    /// A Bind with text parameters (`None` is NULL) and text results.
    pub fn bind(self, portal: &str, statement: &str, params: &[Option<&str>]) -> Batch {
        let mut body = cstr(portal);
        body.extend(cstr(statement));
        body.extend(count16(0));
        body.extend(count16(params.len()));
        for param in params {
            match param {
                None => body.extend((-1i32).to_be_bytes()),
                Some(text) => {
                    body.extend(count32(text.len()));
                    body.extend(text.as_bytes());
                }
            }
        }
        body.extend(count16(0));
        self.push(b'B', &body)
    }

    pub fn describe(self, kind: u8, name: &str) -> Batch {
        let mut body = vec![kind];
        body.extend(cstr(name));
        self.push(b'D', &body)
    }

    pub fn execute(self, portal: &str, max_rows: u32) -> Batch {
        let mut body = cstr(portal);
        body.extend(max_rows.to_be_bytes());
        self.push(b'E', &body)
    }

    pub fn close(self, kind: u8, name: &str) -> Batch {
        let mut body = vec![kind];
        body.extend(cstr(name));
        self.push(b'C', &body)
    }

    pub fn sync(self) -> Batch {
        self.push(b'S', &[])
    }

    pub fn flush(self) -> Batch {
        self.push(b'H', &[])
    }

    pub fn copy_data(self, data: &[u8]) -> Batch {
        self.push(b'd', data)
    }

    pub fn copy_done(self) -> Batch {
        self.push(b'c', &[])
    }

    pub fn copy_fail(self, why: &str) -> Batch {
        self.push(b'f', &cstr(why))
    }

    pub fn password(self, text: &str) -> Batch {
        self.push(b'p', &cstr(text))
    }

    pub fn terminate(self) -> Batch {
        self.push(b'X', &[])
    }

    /// Parse (unnamed), Bind and Execute of one statement with text parameters.
    pub fn unnamed(self, sql: &str, params: &[Option<&str>]) -> Batch {
        self.parse("", sql, &[]).bind("", "", params).execute("", 0)
    }

    /// [`Batch::unnamed`], then Sync.
    pub fn extended(self, sql: &str, params: &[Option<&str>]) -> Batch {
        self.unnamed(sql, params).sync()
    }
}

/// `text` followed by a NUL byte.
pub fn cstr(text: &str) -> Vec<u8> {
    let mut out = text.as_bytes().to_vec();
    out.push(0);
    out
}

fn count16(n: usize) -> [u8; 2] {
    u16::try_from(n)
        .unwrap_or_else(|_| panic!("count {n} out of range"))
        .to_be_bytes()
}

fn count32(n: usize) -> [u8; 4] {
    u32::try_from(n)
        .unwrap_or_else(|_| panic!("length {n} out of range"))
        .to_be_bytes()
}

/// A tagged message.
pub fn message(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    out.extend_from_slice(&count32(body.len() + 4));
    out.extend_from_slice(body);
    out
}

/// An untagged packet: length (including itself) then `body`.
pub fn untagged(body: &[u8]) -> Vec<u8> {
    let mut out = count32(body.len() + 4).to_vec();
    out.extend_from_slice(body);
    out
}

/// A startup message with protocol `version` and `params`, properly terminated.
pub fn startup_packet(version: u32, params: &[(&str, &str)]) -> Vec<u8> {
    let mut body = version.to_be_bytes().to_vec();
    for (name, value) in params {
        body.extend(cstr(name));
        body.extend(cstr(value));
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

/// A PasswordMessage carrying `text`.
pub fn password_message(text: &str) -> Vec<u8> {
    Batch::new().password(text).bytes
}

/// The answer to AuthenticationMD5Password: "md5" and md5(md5(password + user) + salt).
pub fn md5_password(user: &str, password: &str, salt: &[u8]) -> String {
    use md5::{Digest, Md5};
    let secret = md5_secret(user, password);
    let mut outer = Md5::new();
    outer.update(&secret.as_bytes()[3..]);
    outer.update(salt);
    let hex: String = outer
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("md5{hex}")
}

/// A simple Query message.
pub fn query_message(sql: &str) -> Vec<u8> {
    Batch::new().query(sql).bytes
}

/// A simple Query message of any bytes (a text in another client_encoding, or not text).
pub fn query_bytes(text: &[u8]) -> Vec<u8> {
    message(b'Q', &[text, b"\0"].concat())
}

/// A Parse message: statement `name`, `sql`, no parameter types.
pub fn parse_message(name: &str, sql: &str) -> Vec<u8> {
    Batch::new().parse(name, sql, &[]).bytes
}

/// A Bind message of the unnamed portal to statement `name`, no parameters, text results.
pub fn bind_message(name: &str) -> Vec<u8> {
    Batch::new().bind("", name, &[]).bytes
}

/// A Describe message of the unnamed portal.
pub fn describe_portal_message() -> Vec<u8> {
    Batch::new().describe(b'P', "").bytes
}

/// An Execute message of the unnamed portal, no row limit.
pub fn execute_message() -> Vec<u8> {
    Batch::new().execute("", 0).bytes
}

/// A Sync message.
pub fn sync_message() -> Vec<u8> {
    Batch::new().sync().bytes
}

/// A Flush message.
pub fn flush_message() -> Vec<u8> {
    Batch::new().flush().bytes
}

/// A CopyData message carrying `bytes`.
pub fn copy_data_message(bytes: &[u8]) -> Vec<u8> {
    Batch::new().copy_data(bytes).bytes
}

/// A CopyDone message.
pub fn copy_done_message() -> Vec<u8> {
    Batch::new().copy_done().bytes
}

/// A Terminate message.
pub fn terminate_message() -> Vec<u8> {
    Batch::new().terminate().bytes
}

/// Parse, Bind and Execute of `sql` as the unnamed statement (no Sync).
pub fn extended_query(sql: &str) -> Vec<u8> {
    named_extended_query("", sql)
}

/// Parse, Bind and Execute of `sql` as statement `name` (no Sync).
pub fn named_extended_query(name: &str, sql: &str) -> Vec<u8> {
    Batch::new()
        .parse(name, sql, &[])
        .bind("", name, &[])
        .execute("", 0)
        .bytes
}

/// Bind of the statement `name`, Execute and Sync.
pub fn run_prepared(name: &str) -> Vec<u8> {
    Batch::new().bind("", name, &[]).execute("", 0).sync().bytes
}

/// A fast-path FunctionCall of function `oid` with text arguments, text result.
pub fn function_call_message(oid: u32, args: &[&str]) -> Vec<u8> {
    let mut body = oid.to_be_bytes().to_vec();
    body.extend_from_slice(&1u16.to_be_bytes());
    body.extend_from_slice(&0u16.to_be_bytes());
    body.extend_from_slice(&count16(args.len()));
    for arg in args {
        body.extend_from_slice(&count32(arg.len()));
        body.extend_from_slice(arg.as_bytes());
    }
    body.extend_from_slice(&0u16.to_be_bytes());
    message(b'F', &body)
}
