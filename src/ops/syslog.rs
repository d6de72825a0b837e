//! pgward's log to syslog (`syslog`, `syslog_ident`, `syslog_facility`), beside the log file
//! or standard error, as PgBouncer writes it: one datagram a line to the local syslog socket,
//! `<priority>ident[pid]: line`. A reload switches it on or off and changes the ident and the
//! facility. A syslog that is not there (no socket, or full) loses the line, never the
//! process's time.

use std::io::{self, Write};
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tracing::Level;

use crate::config::Settings;
use crate::sync::lock;

/// Where the local syslog daemon listens.
pub const SYSLOG_SOCKET: &str = "/dev/log";

/// The syslog facility `name` (PgBouncer's list); `daemon` for a name it does not know.
pub fn facility(name: &str) -> u8 {
    match name.to_ascii_lowercase().as_str() {
        "auth" => 4,
        "authpriv" => 10,
        "user" => 1,
        "local0" => 16,
        "local1" => 17,
        "local2" => 18,
        "local3" => 19,
        "local4" => 20,
        "local5" => 21,
        "local6" => 22,
        "local7" => 23,
        _ => 3,
    }
}

/// The syslog severity of a tracing level.
fn severity(level: &Level) -> u8 {
    match *level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        Level::DEBUG | Level::TRACE => 7,
    }
}

/// One datagram: `<priority>ident[pid]: line`, without the line's end.
pub fn datagram(facility: u8, severity: u8, ident: &str, pid: u32, line: &[u8]) -> Vec<u8> {
    let priority = u16::from(facility) * 8 + u16::from(severity);
    let mut out = format!("<{priority}>{ident}[{pid}]: ").into_bytes();
    let end = line
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(0, |i| i + 1);
    out.extend_from_slice(&line[..end]);
    out
}

#[derive(Debug)]
struct Target {
    ident: String,
    facility: u8,
    socket: Option<UnixDatagram>,
}

/// The syslog writer: off until the configuration turns it on.
#[derive(Debug)]
pub struct Syslog {
    path: PathBuf,
    on: AtomicBool,
    target: Mutex<Target>,
}

impl Syslog {
    /// A writer to the syslog socket at `path` ([`SYSLOG_SOCKET`]), off.
    pub fn new(path: impl Into<PathBuf>) -> Arc<Syslog> {
        Arc::new(Syslog {
            path: path.into(),
            on: AtomicBool::new(false),
            target: Mutex::new(Target {
                ident: "pgbouncer".into(),
                facility: 3,
                socket: None,
            }),
        })
    }

    /// Takes `syslog`, `syslog_ident` and `syslog_facility` (at start and at every reload).
    pub fn configure(&self, settings: &Settings) {
        let mut target = lock(&self.target);
        target.ident = settings.syslog_ident.clone();
        target.facility = facility(&settings.syslog_facility);
        if !settings.syslog {
            target.socket = None;
        }
        self.on.store(settings.syslog, Ordering::Release);
    }

    /// Whether lines go to syslog now.
    pub fn is_on(&self) -> bool {
        self.on.load(Ordering::Acquire)
    }

    /// Sends one line at `severity`; a socket that fails is opened again for the next line.
    fn send(&self, severity: u8, line: &[u8]) {
        let mut target = lock(&self.target);
        let message = datagram(
            target.facility,
            severity,
            &target.ident,
            std::process::id(),
            line,
        );
        if target.socket.is_none() {
            target.socket = self.connect().ok();
        }
        let sent = target.socket.as_ref().map(|s| s.send(&message));
        if let Some(Err(e)) = sent {
            if e.kind() != io::ErrorKind::WouldBlock {
                target.socket = None;
            }
        }
    }

    fn connect(&self) -> io::Result<UnixDatagram> {
        let socket = UnixDatagram::unbound()?;
        socket.connect(&self.path)?;
        socket.set_nonblocking(true)?;
        Ok(socket)
    }
}

/// tracing's writer for syslog: each event's formatted line, sent when it is written whole.
#[derive(Debug, Clone)]
pub struct SyslogWriter(pub Arc<Syslog>);

/// One line on its way to syslog.
#[derive(Debug)]
pub struct SyslogLine {
    syslog: Arc<Syslog>,
    severity: u8,
    buf: Vec<u8>,
}

impl Write for SyslogLine {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for SyslogLine {
    fn drop(&mut self) {
        if !self.buf.is_empty() && self.syslog.is_on() {
            self.syslog.send(self.severity, &self.buf);
        }
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for SyslogWriter {
    type Writer = SyslogLine;

    fn make_writer(&'a self) -> Self::Writer {
        self.line(6)
    }

    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> Self::Writer {
        self.line(severity(meta.level()))
    }
}

impl SyslogWriter {
    fn line(&self, severity: u8) -> SyslogLine {
        SyslogLine {
            syslog: Arc::clone(&self.0),
            severity,
            buf: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::fmt::MakeWriter;

    #[test]
    fn a_datagram_is_priority_ident_pid_and_the_line() {
        let d = datagram(facility("local3"), 4, "pgbouncer", 42, b"WARN pgward: x\n");
        assert_eq!(d, b"<156>pgbouncer[42]: WARN pgward: x");
        assert_eq!(facility("daemon"), 3);
        assert_eq!(facility("nonsense"), 3);
    }

    #[test]
    fn lines_reach_the_socket_only_while_it_is_on() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("log");
        let daemon = UnixDatagram::bind(&path).expect("bind");
        daemon.set_nonblocking(true).expect("nonblocking");
        let syslog = Syslog::new(&path);
        let writer = SyslogWriter(Arc::clone(&syslog));
        let mut settings = Settings::default();
        writer.make_writer().write_all(b"while off\n").unwrap();
        settings.syslog = true;
        settings.syslog_ident = "pgw".into();
        settings.syslog_facility = "user".into();
        syslog.configure(&settings);
        writer
            .make_writer()
            .write_all(b"INFO pgward: on\n")
            .unwrap();
        let mut buf = [0u8; 256];
        let n = daemon.recv(&mut buf).expect("a datagram");
        let pid = std::process::id();
        assert_eq!(
            String::from_utf8_lossy(&buf[..n]),
            format!("<14>pgw[{pid}]: INFO pgward: on")
        );
        // Nothing else was sent: the line written while off was dropped.
        assert!(daemon.recv(&mut buf).is_err());
        settings.syslog = false;
        syslog.configure(&settings);
        writer.make_writer().write_all(b"off again\n").unwrap();
        assert!(daemon.recv(&mut buf).is_err());
    }
}
