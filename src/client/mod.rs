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
pub use startup::{
    parse_options, read_opening, read_params, without_host, AddedHost, Opening, Replication,
    StartupRequest, DEFAULT_APP,
};

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

/// How a session or a login that came back with `result` ended, in PgBouncer's words
/// (`killed`: how the console shut its connection down); `None` for pgward's own error,
/// logged as a refusal.
pub fn client_end(
    result: &Result<(), SessionError>,
    killed: Option<crate::ops::clients::Kill>,
) -> Option<crate::ops::routine::ClientEnd> {
    use crate::ops::routine::ClientEnd;
    match (result, killed) {
        (Err(SessionError::Fatal(_)), _) => None,
        (_, Some(kill)) => Some(ClientEnd::Killed(kill)),
        (Ok(()), None) => Some(ClientEnd::CloseRequest),
        (Err(SessionError::Gone | SessionError::Io(_)), None) => Some(ClientEnd::UnexpectedEof),
    }
}

/// Tells a client the console ended (`killed`) why, after `pending` (what was queued for it
/// still), unless pgward ended it with an error of its own already (`ended`).
pub async fn tell_killed(
    io: &mut ClientIo,
    ended: &Result<(), SessionError>,
    killed: Option<crate::ops::clients::Kill>,
    pending: &[u8],
) {
    if let (Some(kill), false) = (killed, matches!(ended, Err(SessionError::Fatal(_)))) {
        io.send_error(pending, &kill.farewell()).await;
    }
}

#[cfg(test)]
mod end_tests {
    use super::*;
    use crate::ops::clients::Kill;

    #[test]
    fn a_client_end_is_named_as_pgbouncer_names_it() {
        let of = |r: Result<(), SessionError>, k| client_end(&r, k).map(|e| e.reason());
        assert_eq!(of(Ok(()), None), Some("client close request"));
        assert_eq!(
            of(Err(SessionError::Gone), None),
            Some("client unexpected eof")
        );
        let kill = Some(Kill::Client);
        assert_eq!(
            of(Err(SessionError::Gone), kill),
            Some("admin forced disconnect")
        );
        let kill = Some(Kill::Database);
        assert_eq!(of(Ok(()), kill), Some("database removed"));
    }
}
