//! One client's login: the startup phase (encryption requests, cancel requests, the startup
//! packet), TLS, and authentication. What a logged-in client does next is the session's.

mod auth;
mod io;
mod secrets;
mod startup;
mod tls;

use std::time::Duration;

pub use auth::{admit_to_caps, authenticate, login, Authenticated};
pub use io::ClientIo;
pub use startup::{parse_options, read_opening, read_params, Opening, Replication, StartupRequest};

use crate::pool::PoolError;
use crate::wire::{sqlstate, ErrorResponse, WireError};

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("client closed the connection")]
    Gone,
    #[error("client i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("{}", .0.message)]
    Fatal(ErrorResponse),
}

impl From<WireError> for SessionError {
    fn from(e: WireError) -> Self {
        SessionError::Fatal(ErrorResponse::fatal(e.sqlstate(), e.to_string()))
    }
}

impl From<PoolError> for SessionError {
    fn from(e: PoolError) -> Self {
        SessionError::Fatal(pool_error_response(&e))
    }
}

/// The error a client sees when it could not get a server.
pub fn pool_error_response(e: &PoolError) -> ErrorResponse {
    match e {
        PoolError::WaitTimeout | PoolError::QueryTimeout => {
            ErrorResponse::fatal(sqlstate::QUERY_CANCELED, e.to_string())
        }
        PoolError::Closed | PoolError::ShuttingDown => {
            ErrorResponse::fatal(sqlstate::ADMIN_SHUTDOWN, e.to_string())
        }
        PoolError::Login(err) => match err.as_ref() {
            crate::server::ServerError::Refused(fields) => fields.to_fatal(),
            other => ErrorResponse::fatal(sqlstate::CONNECTION_FAILURE, other.to_string()),
        },
    }
}

/// The largest message a client may send before it has logged in (PostgreSQL's limit for an
/// authentication token).
pub const LOGIN_MAX_MESSAGE: usize = 65535;

/// How long to wait for a session's final writes.
pub const CLOSE_GRACE: Duration = Duration::from_secs(5);
