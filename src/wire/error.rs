//! Errors raised while decoding protocol messages.
//!
//! The `Display` texts are written to be sent verbatim to a client in a FATAL ErrorResponse,
//! with the SQLSTATE PostgreSQL uses ([`WireError::sqlstate`]; 08P01, protocol violation, for
//! most).

/// A protocol message that cannot be accepted.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum WireError {
    /// The declared message length exceeds the configured maximum.
    #[error("message of {len} bytes exceeds the maximum allowed size of {max} bytes")]
    TooLarge {
        /// Declared length.
        len: usize,
        /// Maximum accepted length.
        max: usize,
    },
    /// The declared message length is smaller than its own header or negative.
    #[error("invalid message length {0}")]
    BadLength(i64),
    /// The message body does not follow the protocol layout; the text says what is wrong.
    #[error("{0}")]
    Malformed(&'static str),
    /// The client asked for a protocol version other than 3.x. The value is the raw code.
    /// (A 3.x client above 3.0 is answered with NegotiateProtocolVersion instead.)
    #[error("unsupported frontend protocol {}.{}: server supports 3.0 to 3.0", .0 >> 16, .0 & 0xffff)]
    UnsupportedProtocol(u32),
    /// The startup packet names no user.
    #[error("no PostgreSQL user name specified in startup packet")]
    NoUser,
    /// A startup parameter other than application_name is not UTF-8: pgward could not be
    /// sure to read it (a user name, a database, a setting) as the server would.
    #[error("invalid byte sequence for encoding \"UTF8\" in startup parameter \"{0}\"")]
    NotUtf8Parameter(String),
}

impl WireError {
    /// The SQLSTATE PostgreSQL sends for the same refusal.
    pub fn sqlstate(&self) -> &'static str {
        match self {
            WireError::UnsupportedProtocol(_) => super::sqlstate::FEATURE_NOT_SUPPORTED,
            WireError::NoUser => super::sqlstate::INVALID_AUTHORIZATION,
            WireError::NotUtf8Parameter(_) => super::sqlstate::CHARACTER_NOT_IN_REPERTOIRE,
            _ => super::sqlstate::PROTOCOL_VIOLATION,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_texts_are_plain_sentences() {
        let e = WireError::UnsupportedProtocol(2 << 16);
        assert_eq!(
            e.to_string(),
            "unsupported frontend protocol 2.0: server supports 3.0 to 3.0"
        );
        assert_eq!(e.sqlstate(), "0A000");
        assert_eq!(WireError::NoUser.sqlstate(), "28000");
        assert_eq!(WireError::BadLength(-1).sqlstate(), "08P01");
        let e = WireError::TooLarge { len: 20, max: 10 };
        assert_eq!(
            e.to_string(),
            "message of 20 bytes exceeds the maximum allowed size of 10 bytes"
        );
        assert_eq!(
            WireError::BadLength(-1).to_string(),
            "invalid message length -1"
        );
        assert_eq!(WireError::Malformed("bad").to_string(), "bad");
    }
}
