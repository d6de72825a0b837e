//! PgBouncer's routine log lines about clients and traffic, in its words (operators grep
//! for them), each written only when its setting asks for it: `login attempt`
//! (`log_connections`), `closing because` (`log_disconnections`), `pooler error`
//! (`log_pooler_errors`) and the `stats:` line (`log_stats`).

use std::time::Duration;

use crate::config::LogLines;
use crate::net::Stream;
use crate::ops::clients::Kill;
use crate::wire::ErrorResponse;

use super::StatValues;

/// Why a client's connection ended, when pgward did not end it with an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientEnd {
    /// The client said Terminate.
    CloseRequest,
    /// The connection ended without a Terminate.
    UnexpectedEof,
    /// The console ended it.
    Killed(Kill),
}

impl ClientEnd {
    pub fn reason(self) -> &'static str {
        match self {
            ClientEnd::CloseRequest => "client close request",
            ClientEnd::UnexpectedEof => "client unexpected eof",
            // PgBouncer's words: KILL_CLIENT's, and kill_pool's for KILL.
            ClientEnd::Killed(Kill::Client) => "admin forced disconnect",
            ClientEnd::Killed(Kill::Database) => "database removed",
        }
    }
}

/// `login attempt: db=... user=... tls=... replication=...`, once the startup packet is read.
pub fn login_attempt(
    log: LogLines,
    client: u64,
    (db, user): (&str, &str),
    stream: &Stream,
    replication: &str,
) {
    if !log.connections {
        return;
    }
    let tls = stream.tls_label().unwrap_or_else(|| "no".to_string());
    // The names as the client sent them, a line break in them shown escaped.
    let (db, user) = (printable(db), printable(user));
    tracing::info!(
        client,
        "login attempt: db={db} user={user} tls={tls} replication={replication}"
    );
}

/// `text` with its control characters (a line break, say) escaped, so that a name cannot
/// write a line of its own into the log.
pub fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    match text.chars().any(char::is_control) {
        false => std::borrow::Cow::Borrowed(text),
        true => text
            .chars()
            .map(|c| match c.is_control() {
                true => c.escape_default().to_string(),
                false => c.to_string(),
            })
            .collect(),
    }
}

/// A client's connection ended as `end` says, `age` after it was accepted.
pub fn client_closed(log: LogLines, client: u64, end: ClientEnd, age: Duration) {
    if matches!(end, ClientEnd::Killed(_)) && log.pooler_errors {
        tracing::warn!(client, "pooler error: {}", end.reason());
    }
    if log.disconnections {
        let age = age.as_secs();
        tracing::info!(client, "closing because: {} (age={age}s)", end.reason());
    }
}

/// pgward ends a client's connection with its own error `err`, `age` after it was accepted.
pub fn client_refused(log: LogLines, client: u64, err: &ErrorResponse, age: Duration) {
    // The message may name what the client sent (a user, a database).
    let message = printable(&err.message);
    if log.pooler_errors {
        tracing::warn!(client, code = %err.code, "pooler error: {message}");
    }
    if log.disconnections {
        let age = age.as_secs();
        tracing::info!(client, code = %err.code, "closing because: {message} (age={age}s)");
    }
}

/// The `stats:` line of a period's averages over every pool (`avg`, as SHOW STATS_AVERAGES
/// computes them per pool).
pub fn stats_line(avg: &StatValues) -> String {
    format!(
        "stats: {} xacts/s, {} queries/s, {} client parses/s, {} server parses/s, {} binds/s, \
         {} client logins/s, in {} B/s, out {} B/s, xact {} us, query {} us, wait {} us",
        avg.xacts,
        avg.queries,
        avg.client_parses,
        avg.server_parses,
        avg.binds,
        avg.client_logins,
        avg.received,
        avg.sent,
        avg.xact_time,
        avg.query_time,
        avg.wait_time
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_printed_without_control_characters() {
        assert_eq!(printable("app"), "app");
        assert_eq!(printable("a\nstats: x"), "a\\nstats: x");
        assert_eq!(printable("o'brien é"), "o'brien é");
    }

    #[test]
    fn the_stats_line_reads_as_pgbouncers() {
        let avg = StatValues {
            xacts: 12,
            queries: 30,
            received: 900,
            sent: 4000,
            xact_time: 250,
            query_time: 90,
            wait_time: 3,
            client_parses: 1,
            server_parses: 2,
            binds: 5,
            client_logins: 7,
            server_assignments: 12,
        };
        assert_eq!(
            stats_line(&avg),
            "stats: 12 xacts/s, 30 queries/s, 1 client parses/s, 2 server parses/s, 5 binds/s, \
             7 client logins/s, in 900 B/s, out 4000 B/s, xact 250 us, query 90 us, wait 3 us"
        );
    }
}
