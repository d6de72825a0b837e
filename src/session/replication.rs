//! A replication client's session (`replication=database` or a true boolean): a server of
//! its own for the client's whole life, opened with the client's own parameters and
//! options, greeted with that server's parameters, then bytes relayed both ways unread (the
//! walsender's commands, COPY BOTH streams). Nothing is pooled, reset or governed.

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;

use crate::cancel::CancelTarget;
use crate::client::{ClientIo, SessionError, StartupRequest};
use crate::ops::{ClientEntry, ServerLink};
use crate::pool::{Dedicated, Pool, PoolError};
use crate::runtime::Runtime;
use crate::wire::{self, ErrorResponse};

/// Serves a logged-in replication client to its end.
pub async fn serve(
    rt: &Arc<Runtime>,
    io: &mut ClientIo,
    entry: &Arc<ClientEntry>,
    req: &StartupRequest,
    pool: Arc<Pool>,
) -> Result<(), SessionError> {
    if rt.governance.load().is_some() {
        // Its bytes are relayed unread, so no rule, budget or lane would see what it runs.
        return Err(SessionError::Fatal(ErrorResponse::fatal(
            wire::sqlstate::FEATURE_NOT_SUPPORTED,
            "replication connections are not served while a policy is in force",
        )));
    }
    let mut server = open_watching_client(io, req, &pool, rt).await?;
    entry.set_active(ServerLink::of(&server));
    let handle = rt
        .cancels
        .register(entry.id, rt.config.load().settings.peer_id as u16);
    handle.attach(CancelTarget {
        addr: server.addr.clone(),
        key: server.key.clone(),
    });
    let key = (handle.pid, handle.secret());
    let result = greet_and_relay(io, &mut server, key, &pool, entry.id).await;
    rt.cancels.remove(&handle);
    result
}

/// Waits for the pause hold, room in the pool and the server's login, while watching the
/// client: one that leaves meanwhile ends the wait (and gives its place back).
async fn open_watching_client(
    io: &mut ClientIo,
    req: &StartupRequest,
    pool: &Arc<Pool>,
    rt: &Runtime,
) -> Result<Dedicated, SessionError> {
    let open = async {
        rt.ops.control.wait_open(&pool.key.db).await;
        let wait = pool.settings().query_wait;
        pool.open_dedicated(&startup_params(req), wait).await
    };
    tokio::pin!(open);
    loop {
        tokio::select! {
            opened = &mut open => return opened.map_err(refusal),
            filled = io.fill() => {
                filled?;
                // Nothing is owed before the greeting: what comes early waits, bounded.
                if io.rbuf.len() > crate::client::LOGIN_MAX_MESSAGE {
                    return Err(SessionError::Fatal(ErrorResponse::fatal(
                        wire::sqlstate::PROTOCOL_VIOLATION,
                        "too much data before the server was ready",
                    )));
                }
            }
        }
    }
}

async fn greet_and_relay(
    io: &mut ClientIo,
    server: &mut Dedicated,
    (pid, secret): (u32, [u8; 4]),
    pool: &Pool,
    client_id: u64,
) -> Result<(), SessionError> {
    let mut out = BytesMut::new();
    for (name, value) in &server.welcome {
        wire::encode_parameter_status(&mut out, name, value);
    }
    wire::encode_backend_key_data(&mut out, pid, &secret);
    wire::encode_ready_for_query(&mut out, server.tx);
    io.send(&out).await?;
    relay(io, server, pool, client_id).await
}

/// What the server is asked for at login: the replication mode, the client's tracked
/// parameters, and its options as they came.
fn startup_params(req: &StartupRequest) -> Vec<(String, String)> {
    let mut params = req.params.clone();
    if let Some(mode) = req.replication.startup_value() {
        params.push(("replication".to_string(), mode.to_string()));
    }
    if let Some(options) = &req.options {
        params.push(("options".to_string(), options.clone()));
    }
    params
}

/// The client sees PgBouncer's words for a server that refused it ("login failed"), with
/// the server's own SQLSTATE and message in the detail.
fn refusal(err: PoolError) -> SessionError {
    let PoolError::Login(server_err) = &err else {
        return err.into();
    };
    let (code, detail) = match server_err.as_ref() {
        crate::server::ServerError::Refused(fields) => {
            (fields.sqlstate().to_string(), fields.text().to_string())
        }
        other => (
            wire::sqlstate::CONNECTION_FAILURE.to_string(),
            other.to_string(),
        ),
    };
    SessionError::Fatal(ErrorResponse::fatal(code, "login failed").with_detail(detail))
}

/// How often a relay looks whether RECONNECT (or a reload) marked its server.
const MARK_CHECK: Duration = Duration::from_secs(1);

/// Relays bytes both ways, those already read on either side first, until either end closes
/// (the other is then closed too: a walsender that ended leaves nothing to wait for). A
/// server that RECONNECT or a reload marked is closed at once, with its client, as PgBouncer
/// does for replication servers: they may live for ever.
async fn relay(
    io: &mut ClientIo,
    server: &mut Dedicated,
    pool: &Pool,
    client_id: u64,
) -> Result<(), SessionError> {
    if !io.rbuf.is_empty() {
        let pending = io.rbuf.split();
        server.stream.write_all(&pending).await?;
    }
    if !server.rbuf.is_empty() {
        let pending = server.rbuf.split();
        io.stream.write_all(&pending).await?;
    }
    let (id, created) = (server.id, server.created);
    let (mut client_read, mut client_write) = tokio::io::split(&mut io.stream);
    let (mut server_read, mut server_write) = tokio::io::split(&mut server.stream);
    let ended = {
        let up = tokio::io::copy(&mut client_read, &mut server_write);
        let down = tokio::io::copy(&mut server_read, &mut client_write);
        tokio::pin!(up, down);
        let mut marks = tokio::time::interval(MARK_CHECK);
        loop {
            tokio::select! {
                copied = &mut up => break copied.map(drop),
                copied = &mut down => break copied.map(drop),
                _ = marks.tick() => {
                    if pool.closing.close_needed(id, created) || pool.closing.retired() {
                        // No ErrorResponse: the client may be in the middle of a message
                        // of the stream, which one would corrupt. The connection just ends.
                        if pool.settings_now().target.log.disconnections {
                            tracing::info!(client = client_id, "closing because: database configuration changed");
                        }
                        break Ok(());
                    }
                }
            }
        }
    };
    // A TLS client gets its close_notify; either way the client sees the end now.
    let _ = tokio::time::timeout(crate::client::CLOSE_GRACE, client_write.shutdown()).await;
    ended.map_err(SessionError::from)
}
