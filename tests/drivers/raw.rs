//! A minimal PostgreSQL protocol 3 client over `std::net`, built message by message, for
//! tests that must control exactly what goes on the wire: the differential test and the
//! prepared-statement edge cases of the driver tests.
//!
//! It logs in with trust, cleartext or MD5 authentication, then sends whatever bytes a test
//! builds with [`Batch`] and reads the answers back as [`Msg`] values. Every read has a
//! deadline, so a pooler that loses track of a conversation fails the test instead of
//! hanging it.
#![allow(dead_code)]

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// How long one read may wait before the test fails.
const READ_TIMEOUT: Duration = Duration::from_secs(15);

/// One backend message: its tag and its body (without the length).
#[derive(Clone, PartialEq, Eq)]
pub struct Msg {
    pub tag: u8,
    pub body: Vec<u8>,
}

impl std::fmt::Debug for Msg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}{:?}",
            char::from(self.tag),
            String::from_utf8_lossy(&self.body)
        )
    }
}

impl Msg {
    /// The fields of an ErrorResponse or NoticeResponse, as (code, text) pairs.
    pub fn fields(&self) -> Vec<(u8, String)> {
        self.body
            .split(|b| *b == 0)
            .filter(|f| !f.is_empty())
            .map(|f| (f[0], String::from_utf8_lossy(&f[1..]).into_owned()))
            .collect()
    }

    /// One field of an ErrorResponse or NoticeResponse.
    pub fn field(&self, code: u8) -> Option<String> {
        self.fields()
            .into_iter()
            .find(|(c, _)| *c == code)
            .map(|(_, text)| text)
    }

    /// The SQLSTATE of an ErrorResponse.
    pub fn sqlstate(&self) -> Option<String> {
        (self.tag == b'E').then(|| self.field(b'C')).flatten()
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

    /// The first column of a DataRow, as text.
    pub fn first_column(&self) -> Option<String> {
        self.columns().into_iter().next().flatten()
    }
}

/// Frontend messages, appended one after the other into one buffer sent in one write.
#[derive(Debug, Default, Clone)]
pub struct Batch {
    pub bytes: Vec<u8>,
}

impl Batch {
    pub fn new() -> Batch {
        Batch::default()
    }

    fn message(mut self, tag: u8, body: &[u8]) -> Batch {
        self.bytes.push(tag);
        let len = u32::try_from(body.len() + 4).unwrap_or_else(|_| panic!("message too long"));
        self.bytes.extend_from_slice(&len.to_be_bytes());
        self.bytes.extend_from_slice(body);
        self
    }

    pub fn query(self, sql: &str) -> Batch {
        self.message(b'Q', &cstring(sql))
    }

    pub fn parse(self, name: &str, sql: &str, types: &[u32]) -> Batch {
        let mut body = cstring(name);
        body.extend(cstring(sql));
        body.extend(count16(types.len()));
        for oid in types {
            body.extend(oid.to_be_bytes());
        }
        self.message(b'P', &body)
    }

    /// A Bind with text parameters (`None` is NULL) and text results.
    pub fn bind(self, portal: &str, statement: &str, params: &[Option<&str>]) -> Batch {
        let mut body = cstring(portal);
        body.extend(cstring(statement));
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
        self.message(b'B', &body)
    }

    pub fn describe(self, kind: u8, name: &str) -> Batch {
        let mut body = vec![kind];
        body.extend(cstring(name));
        self.message(b'D', &body)
    }

    pub fn execute(self, portal: &str, max_rows: u32) -> Batch {
        let mut body = cstring(portal);
        body.extend(max_rows.to_be_bytes());
        self.message(b'E', &body)
    }

    pub fn close(self, kind: u8, name: &str) -> Batch {
        let mut body = vec![kind];
        body.extend(cstring(name));
        self.message(b'C', &body)
    }

    pub fn sync(self) -> Batch {
        self.message(b'S', &[])
    }

    pub fn flush(self) -> Batch {
        self.message(b'H', &[])
    }

    pub fn copy_data(self, data: &[u8]) -> Batch {
        self.message(b'd', data)
    }

    pub fn copy_done(self) -> Batch {
        self.message(b'c', &[])
    }

    pub fn copy_fail(self, why: &str) -> Batch {
        self.message(b'f', &cstring(why))
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

fn cstring(text: &str) -> Vec<u8> {
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

/// One logged-in connection.
pub struct Raw {
    stream: TcpStream,
    buf: Vec<u8>,
    /// What the server sent from AuthenticationOk up to the first ReadyForQuery.
    pub startup: Vec<Msg>,
}

impl Raw {
    /// Connects to 127.0.0.1:`port` and logs in.
    pub fn connect(port: u16, user: &str, password: Option<&str>, db: &str) -> Raw {
        let stream = TcpStream::connect(("127.0.0.1", port))
            .unwrap_or_else(|err| panic!("cannot connect to port {port}: {err}"));
        Raw::login(stream, user, password, db)
    }

    /// Logs in over an already connected stream.
    pub fn login(stream: TcpStream, user: &str, password: Option<&str>, db: &str) -> Raw {
        stream
            .set_read_timeout(Some(READ_TIMEOUT))
            .unwrap_or_else(|err| panic!("set_read_timeout: {err}"));
        let _ = stream.set_nodelay(true);
        let mut raw = Raw {
            stream,
            buf: Vec::new(),
            startup: Vec::new(),
        };
        raw.send_startup(user, db);
        raw.authenticate(user, password);
        raw.startup = raw.until_ready(1);
        raw
    }

    fn send_startup(&mut self, user: &str, db: &str) {
        let mut body = 196_608u32.to_be_bytes().to_vec();
        for (key, value) in [("user", user), ("database", db)] {
            body.extend(cstring(key));
            body.extend(cstring(value));
        }
        body.push(0);
        let mut packet = count32(body.len() + 4).to_vec();
        packet.extend(body);
        self.send_bytes(&packet);
    }

    fn authenticate(&mut self, user: &str, password: Option<&str>) {
        loop {
            let msg = self.recv();
            assert_eq!(msg.tag, b'R', "during login: {msg:?}");
            let kind = msg
                .body
                .get(..4)
                .map(|k| u32::from_be_bytes([k[0], k[1], k[2], k[3]]));
            let password = || password.unwrap_or_else(|| panic!("{user}: a password is asked"));
            match kind {
                Some(0) => return,
                Some(3) => self.send_password(password()),
                Some(5) => {
                    let salt = msg.body.get(4..8).unwrap_or_else(|| panic!("short salt"));
                    self.send_password(&md5_answer(user, password(), salt));
                }
                other => panic!("unsupported authentication request {other:?}"),
            }
        }
    }

    fn send_password(&mut self, text: &str) {
        let bytes = Batch::new().message(b'p', &cstring(text)).bytes;
        self.send_bytes(&bytes);
    }

    pub fn send(&mut self, batch: &Batch) {
        self.send_bytes(&batch.bytes);
    }

    pub fn send_bytes(&mut self, bytes: &[u8]) {
        self.stream
            .write_all(bytes)
            .unwrap_or_else(|err| panic!("cannot send: {err}"));
    }

    /// The next message; panics on a timeout or a closed connection.
    pub fn recv(&mut self) -> Msg {
        self.try_recv()
            .unwrap_or_else(|| panic!("no answer within {READ_TIMEOUT:?}"))
    }

    /// The next message, or `None` if the read deadline passed first.
    pub fn try_recv(&mut self) -> Option<Msg> {
        loop {
            if let Some(msg) = self.take_message() {
                return Some(msg);
            }
            let mut chunk = [0u8; 16384];
            match self.stream.read(&mut chunk) {
                Ok(0) => panic!("connection closed; unread: {:?}", self.buf),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(err) if matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return None
                }
                Err(err) => panic!("cannot read: {err}"),
            }
        }
    }

    fn take_message(&mut self) -> Option<Msg> {
        let head = self.buf.get(..5)?;
        let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
        assert!(len >= 4, "bad length {len}");
        if self.buf.len() < 1 + len {
            return None;
        }
        let tag = self.buf[0];
        let body = self.buf[5..1 + len].to_vec();
        self.buf.drain(..1 + len);
        Some(Msg { tag, body })
    }

    /// Reads until `count` ReadyForQuery messages have arrived; returns everything read.
    pub fn until_ready(&mut self, count: usize) -> Vec<Msg> {
        let mut out = Vec::new();
        let mut seen = 0;
        while seen < count {
            let msg = self.recv();
            seen += usize::from(msg.tag == b'Z');
            out.push(msg);
        }
        out
    }

    /// Reads until a message with `tag` arrives; returns everything read, that one included.
    pub fn until_tag(&mut self, tag: u8) -> Vec<Msg> {
        let mut out = Vec::new();
        loop {
            let msg = self.recv();
            let done = msg.tag == tag;
            out.push(msg);
            if done {
                return out;
            }
        }
    }

    /// Sends `batch` and reads until `readies` ReadyForQuery messages.
    pub fn exchange(&mut self, batch: &Batch, readies: usize) -> Vec<Msg> {
        self.send(batch);
        self.until_ready(readies)
    }

    /// Runs one simple query and returns the first column of its first row; panics on an
    /// error.
    pub fn value(&mut self, sql: &str) -> Option<String> {
        let answers = self.exchange(&Batch::new().query(sql), 1);
        if let Some(err) = answers.iter().find(|m| m.tag == b'E') {
            panic!("{sql}: {err:?}");
        }
        answers
            .iter()
            .find(|m| m.tag == b'D')
            .and_then(Msg::first_column)
    }

    /// Says Terminate and closes the socket.
    pub fn terminate(mut self) {
        let bytes = Batch::new().message(b'X', &[]).bytes;
        let _ = self.stream.write_all(&bytes);
    }
}

/// The answer to AuthenticationMD5Password: "md5" and md5(md5(password + user) + salt).
fn md5_answer(user: &str, password: &str, salt: &[u8]) -> String {
    use md5::{Digest, Md5};
    let hex = |bytes: &[u8]| -> String { bytes.iter().map(|b| format!("{b:02x}")).collect() };
    let inner = hex(&Md5::digest(format!("{password}{user}").as_bytes()));
    let mut outer = Md5::new();
    outer.update(inner.as_bytes());
    outer.update(salt);
    format!("md5{}", hex(&outer.finalize()))
}

/// The tags of `msgs`, as a string (`"12TDCZ"`), for compact assertions.
pub fn tags(msgs: &[Msg]) -> String {
    msgs.iter().map(|m| char::from(m.tag)).collect()
}

/// The SQLSTATEs of the errors among `msgs`.
pub fn errors(msgs: &[Msg]) -> Vec<String> {
    msgs.iter().filter_map(Msg::sqlstate).collect()
}

/// The first column of every DataRow among `msgs`.
pub fn values(msgs: &[Msg]) -> Vec<Option<String>> {
    msgs.iter()
        .filter(|m| m.tag == b'D')
        .map(|m| m.columns().into_iter().next().flatten())
        .collect()
}
