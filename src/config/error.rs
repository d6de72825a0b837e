//! Errors raised while reading configuration files.

use std::path::PathBuf;

/// An error found while reading `pgbouncer.ini`, an included file, or the auth file.
///
/// Every error names the file, and where a line is to blame, the line (1-based).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A syntax error or a bad value at a given place.
    #[error("{file}:{line}: {msg}")]
    At {
        /// File name as given (or as resolved for `%include`).
        file: String,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        msg: String,
    },
    /// A file could not be read.
    #[error("{file}: {source}")]
    Io {
        /// The path that failed.
        file: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A problem with the file as a whole (for instance a missing main section).
    #[error("{file}: {msg}")]
    File {
        /// File name.
        file: String,
        /// What is wrong.
        msg: String,
    },
}

impl ConfigError {
    /// Builds an [`ConfigError::At`] error.
    pub fn at(file: &str, line: usize, msg: impl Into<String>) -> Self {
        ConfigError::At {
            file: file.to_string(),
            line,
            msg: msg.into(),
        }
    }
}
