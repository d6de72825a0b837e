//! Scripted protocol exchanges with deadlines: messages by name, reads up to a tag with a
//! report of what came instead, and logins and queries that give up instead of hanging.

use std::time::{Duration, Instant};

use super::raw::{self, Message, Raw};
use super::{Pgward, Postgres};

/// One second.
pub const SECOND: Duration = Duration::from_secs(1);

/// Starts pgward in front of `pg` with `auth_type = trust`, the `[pgbouncer]` `settings` and
/// the extra `[databases]` lines `dbs`.
pub fn start(pg: &Postgres, settings: &str, dbs: &str) -> Pgward {
    let settings = format!("auth_type = trust\n{settings}");
    Pgward::start(&Pgward::ini(pg, &settings, dbs))
}

/// Starts pgward with `pool_mode = transaction` and `settings`.
pub fn transaction_pool(pg: &Postgres, settings: &str) -> Pgward {
    start(pg, &format!("pool_mode = transaction\n{settings}"), "")
}

// ---------------------------------------------------------------------------------------------
// Protocol messages and reads with deadlines.

/// `text` followed by a NUL byte.
pub fn cstr(text: &str) -> Vec<u8> {
    let mut out = text.as_bytes().to_vec();
    out.push(0);
    out
}

/// Parse of `sql` into the unnamed statement, no parameter types.
pub fn parse(sql: &str) -> Vec<u8> {
    raw::parse_message("", sql)
}

/// Bind of the unnamed statement to the unnamed portal, no parameters, text results.
pub fn bind() -> Vec<u8> {
    raw::bind_message("")
}

/// Describe of the unnamed portal.
pub fn describe_portal() -> Vec<u8> {
    raw::message(b'D', b"P\0")
}

/// Execute of the unnamed portal, all rows.
pub fn execute() -> Vec<u8> {
    raw::execute_message()
}

/// Sync.
pub fn sync() -> Vec<u8> {
    raw::sync_message()
}

/// Flush.
pub fn flush() -> Vec<u8> {
    raw::message(b'H', &[])
}

/// CopyData carrying `bytes`.
pub fn copy_data(bytes: &[u8]) -> Vec<u8> {
    raw::message(b'd', bytes)
}

/// CopyDone.
pub fn copy_done() -> Vec<u8> {
    raw::message(b'c', &[])
}

/// Terminate.
pub fn terminate() -> Vec<u8> {
    raw::message(b'X', &[])
}

/// Reads messages until one with `tag`, within `wait`; `Err` names what came instead.
pub fn until_tag(client: &mut Raw, tag: u8, wait: Duration) -> Result<Vec<Message>, String> {
    let deadline = Instant::now() + wait;
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match client.read_message_within(left) {
            Ok(msg) => {
                let done = msg.tag == tag;
                seen.push(msg);
                if done {
                    return Ok(seen);
                }
            }
            Err(err) => {
                return Err(format!(
                    "{err:?} waiting for '{}' after [{}]",
                    char::from(tag),
                    describe(&seen)
                ))
            }
        }
    }
}

/// Reads messages up to and including a ReadyForQuery, within `wait`.
pub fn until_ready(client: &mut Raw, wait: Duration) -> Result<Vec<Message>, String> {
    until_tag(client, b'Z', wait)
}

/// Messages with errors spelled out, for failure reports.
pub fn describe(messages: &[Message]) -> String {
    let parts: Vec<String> = messages
        .iter()
        .map(|m| match m.tag {
            b'E' => {
                let f = raw::Fields::parse(&m.body);
                format!("E({} {} {})", f.severity(), f.code(), f.message())
            }
            tag => char::from(tag).to_string(),
        })
        .collect();
    parts.join(" ")
}

/// The first column of a DataRow as text (None for NULL or a malformed row).
pub fn first_column(body: &[u8]) -> Option<String> {
    let len = body.get(2..6)?;
    let len = i32::from_be_bytes([len[0], len[1], len[2], len[3]]);
    let len = usize::try_from(len).ok()?;
    let text = body.get(6..6 + len)?;
    Some(String::from_utf8_lossy(text).into_owned())
}

/// The fields of the first ErrorResponse among `messages`.
pub fn first_error(messages: &[Message]) -> Option<raw::Fields> {
    messages
        .iter()
        .find(|m| m.tag == b'E')
        .map(|m| raw::Fields::parse(&m.body))
}

/// What the answer to a query already sent says: the first column of its first row, or
/// `Err` with the error or the failure to answer within `wait`.
pub fn read_value(client: &mut Raw, wait: Duration) -> Result<String, String> {
    let messages = until_ready(client, wait)?;
    if let Some(fields) = first_error(&messages) {
        return Err(format!("{fields:?}"));
    }
    let row = messages.iter().find(|m| m.tag == b'D');
    Ok(row.and_then(|m| first_column(&m.body)).unwrap_or_default())
}

/// Runs `sql` with the simple query protocol; see [`read_value`].
pub fn value_within(client: &mut Raw, sql: &str, wait: Duration) -> Result<String, String> {
    client.send(&raw::query_message(sql));
    read_value(client, wait)
}

/// Logs in with `params` (trust only) within `wait`; `Err` is the refusal or the timeout.
pub fn login_within(port: u16, params: &[(&str, &str)], wait: Duration) -> Result<Raw, String> {
    let mut client = Raw::connect(port);
    client.send(&raw::startup_packet(raw::PROTOCOL_3_0, params));
    let messages = until_ready(&mut client, wait)?;
    match first_error(&messages) {
        Some(fields) => Err(format!("{fields:?}")),
        None => Ok(client),
    }
}

/// Logs a new client in as `user` to `db` and runs `sql`, each step within `wait`: the first
/// column of the first row, or why there is none.
pub fn new_client_value(
    pw: &Pgward,
    (user, db): (&str, &str),
    sql: &str,
    wait: Duration,
) -> Result<String, String> {
    let mut client = login_within(pw.port, &[("user", user), ("database", db)], wait)?;
    value_within(&mut client, sql, wait)
}

/// Logs a new client in as `user` to `db`, panicking with pgward's log on failure.
pub fn login_as(pw: &Pgward, user: &str, db: &str) -> Raw {
    login_within(pw.port, &[("user", user), ("database", db)], 5 * SECOND)
        .unwrap_or_else(|err| panic!("login as {user} to {db}: {err}\n{}", pw.log()))
}

/// Logs a new client in as `trustuser` to `app`.
pub fn login(pw: &Pgward) -> Raw {
    login_as(pw, "trustuser", "app")
}

/// Runs `sql` and returns the first column of its first row, panicking on errors.
pub fn must_value(client: &mut Raw, sql: &str) -> String {
    value_within(client, sql, 5 * SECOND).unwrap_or_else(|err| panic!("{sql}: {err}"))
}
