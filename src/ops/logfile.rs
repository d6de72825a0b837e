//! pgward's own log (`logfile`), opened again at every reload (SIGHUP, RELOAD) so that
//! logrotate can move it away and signal, as with PgBouncer; and its level (`verbose`), which
//! a reload or the console's SET changes at once.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use tracing_subscriber::filter::LevelFilter;

use crate::sync::lock;

/// The log file, and where it is to be found.
#[derive(Debug)]
pub struct LogFile {
    path: Mutex<PathBuf>,
    file: Mutex<File>,
}

fn open(path: &Path) -> io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

impl LogFile {
    pub fn open(path: &Path) -> io::Result<LogFile> {
        Ok(LogFile {
            path: Mutex::new(path.to_path_buf()),
            file: Mutex::new(open(path)?),
        })
    }

    /// Opens the file again, at `path` if given (a changed `logfile`) or where it was (a new
    /// file if logrotate moved it); on failure the file in use stays.
    pub fn reopen(&self, path: Option<&Path>) -> io::Result<()> {
        let path = path.map_or_else(|| lock(&self.path).clone(), Path::to_path_buf);
        let file = open(&path)
            .map_err(|e| io::Error::new(e.kind(), format!("logfile {}: {e}", path.display())))?;
        *lock(&self.file) = file;
        *lock(&self.path) = path;
        Ok(())
    }
}

/// The log's level: `verbose` from the configuration, plus the `-v` flags pgward was started
/// with. 0 logs INFO, 1 DEBUG, 2 and more TRACE, as PgBouncer's levels go.
pub struct LogLevel {
    handle: tracing_subscriber::reload::Handle<LevelFilter, tracing_subscriber::Registry>,
    flags: i32,
}

impl std::fmt::Debug for LogLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogLevel")
            .field("flags", &self.flags)
            .finish()
    }
}

/// The filter for `verbose` (the configuration's plus the command line's).
pub fn level_for(verbose: i32) -> LevelFilter {
    match verbose.max(0) {
        0 => LevelFilter::INFO,
        1 => LevelFilter::DEBUG,
        _ => LevelFilter::TRACE,
    }
}

impl LogLevel {
    pub fn new(
        handle: tracing_subscriber::reload::Handle<LevelFilter, tracing_subscriber::Registry>,
        flags: i32,
    ) -> LogLevel {
        LogLevel { handle, flags }
    }

    /// Logs at the level `verbose` (the configuration's) asks for from now on.
    pub fn set(&self, verbose: i32) {
        let level = level_for(verbose.max(0) + self.flags);
        if let Err(e) = self.handle.modify(|filter| *filter = level) {
            tracing::warn!("cannot change the log's level: {e}");
        }
    }
}

/// Writes to the file in use (tracing's writer for an `Arc<LogFile>`: one formatted line a
/// write).
impl Write for &LogFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        lock(&self.file).write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        lock(&self.file).flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_moved_log_file_is_opened_again_at_its_path() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("pgward.log");
        let log = LogFile::open(&path).expect("open");
        (&log).write_all(b"before\n").unwrap();
        let moved = dir.path().join("pgward.log.1");
        std::fs::rename(&path, &moved).unwrap();
        (&log).write_all(b"still the old file\n").unwrap();
        log.reopen(None).expect("reopen");
        (&log).write_all(b"after\n").unwrap();
        assert_eq!(
            std::fs::read_to_string(&moved).unwrap(),
            "before\nstill the old file\n"
        );
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "after\n");
    }

    #[test]
    fn a_failed_reopen_keeps_the_file_in_use() {
        let dir = tempfile::tempdir().expect("dir");
        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        let path = sub.join("pgward.log");
        let log = LogFile::open(&path).expect("open");
        std::fs::rename(&sub, dir.path().join("gone")).unwrap();
        assert!(log.reopen(None).is_err());
        (&log).write_all(b"kept\n").unwrap();
        let kept = dir.path().join("gone").join("pgward.log");
        assert_eq!(std::fs::read_to_string(kept).unwrap(), "kept\n");
    }
}
