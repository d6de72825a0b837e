//! The admin console: a virtual database named `pgward` (and `pgbouncer`, so PgBouncer's
//! scripts and exporters work) that speaks the simple query protocol and answers SHOW
//! commands, pause / resume / kill / reconnect / shutdown, RELOAD and SET.
//!
//! Access: users in `admin_users` may do everything, users in `stats_users` may only SHOW,
//! and the OS user running pgward may log in over the Unix socket without a password (as
//! user `pgbouncer`, `pgward` or its own name), as PgBouncer allows. Anyone else is refused
//! at login with 28000.

mod control;
mod incident;
pub mod parse;
pub mod result;
mod set;
mod show;
mod show_fleet;
mod show_gate;
mod show_objects;
mod show_sockets;
mod show_stats;

pub use show_gate::gate_minute;

use std::sync::Arc;

use bytes::BytesMut;

use crate::edge::caps::CapGuard;
use rand::RngCore;

use crate::client::{ClientIo, SessionError, StartupRequest};
use crate::config::AuthType;
use crate::net::Stream;
use crate::ops::ClientEntry;
use crate::pool::PoolKey;
use crate::runtime::Runtime;
use crate::wire::frontend::tag;
use crate::wire::{self, sqlstate, ErrorResponse, TxStatus};
use parse::Command;

pub use crate::config::databases::{is_console, CONSOLE_NAMES};

/// What a console user may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Everything.
    Admin,
    /// SHOW only.
    Stats,
}

/// A console command that failed: the SQLSTATE and message sent as an ERROR.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct AdminError {
    pub code: &'static str,
    pub message: String,
}

impl AdminError {
    /// PgBouncer reports console errors as protocol violations (08P01).
    pub fn protocol(message: impl Into<String>) -> Self {
        AdminError {
            code: sqlstate::PROTOCOL_VIOLATION,
            message: message.into(),
        }
    }

    /// A value the command cannot take (22023, as PostgreSQL answers a bad setting).
    pub fn invalid_value(message: impl Into<String>) -> Self {
        AdminError {
            code: sqlstate::INVALID_PARAMETER_VALUE,
            message: message.into(),
        }
    }
}

/// Authenticates a console login and decides its role; refuses users that have none. A
/// stats user is counted against the client caps (the guard holds the slot), as in
/// PgBouncer; admin users are not.
pub async fn login(
    rt: &Arc<Runtime>,
    io: &mut ClientIo,
    user: &str,
    database: &str,
) -> Result<(Role, Option<CapGuard>), SessionError> {
    let role = if local_os_user(rt, &io.stream, user) {
        Some(Role::Admin)
    } else {
        crate::client::authenticate(io, rt, user, database).await?;
        configured_role(rt, user)
    };
    let Some(role) = role else {
        return Err(SessionError::Fatal(ErrorResponse::fatal(
            sqlstate::INVALID_AUTHORIZATION,
            format!("user \"{user}\" is not allowed to use the admin console"),
        )));
    };
    let mut out = BytesMut::new();
    wire::encode_auth_ok(&mut out);
    io.send(&out).await?;
    let cap = match role {
        Role::Admin => None,
        Role::Stats => Some(crate::client::admit_to_caps(
            rt,
            user,
            crate::config::databases::ADMIN_DB,
        )?),
    };
    Ok((role, cap))
}

/// The role `admin_users` / `stats_users` give `user` (with auth_type any, everyone may SHOW).
fn configured_role(rt: &Runtime, user: &str) -> Option<Role> {
    let config = rt.config.load();
    let s = &config.settings;
    if s.admin_users.iter().any(|u| u == user) {
        Some(Role::Admin)
    } else if s.stats_users.iter().any(|u| u == user) || s.auth_type == AuthType::Any {
        Some(Role::Stats)
    } else {
        None
    }
}

/// A Unix-socket peer running as pgward's own OS user, logging in under a console name or
/// that user's name.
fn local_os_user(rt: &Runtime, stream: &Stream, user: &str) -> bool {
    let ops = &rt.ops;
    stream.peer_uid() == Some(ops.os_uid)
        && (is_console(user) || ops.os_user.as_deref() == Some(user))
}

/// Serves a logged-in console session until the client leaves; `worker` is the thread it is
/// served on (whose set of the console pool's counters it bumps).
pub async fn serve(
    rt: &Arc<Runtime>,
    io: &mut ClientIo,
    entry: &Arc<ClientEntry>,
    req: &StartupRequest,
    (role, worker): (Role, crate::workers::WorkerId),
) -> Result<(), SessionError> {
    let param = |name: &str| {
        req.params
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
    };
    let app_name = param("application_name").unwrap_or_default();
    entry.logged_in(&req.user, &req.database, &req.user, &app_name, true);
    let key = PoolKey {
        db: req.database.clone(),
        user: req.user.clone(),
    };
    let counters = rt.ops.stats.for_pool(&key, worker);
    counters.add_login();
    io.send(&welcome(param("client_encoding"), &app_name))
        .await?;
    let mut in_error = false;
    loop {
        let frame = match io.read_frame().await {
            Ok(f) => f,
            Err(e) => return Err(e),
        };
        counters.add_received(frame.len());
        let mut out = BytesMut::new();
        match frame.tag() {
            tag::QUERY => {
                let body = frame.body();
                let sql = String::from_utf8_lossy(wire::QueryView::new(&body).text).into_owned();
                let started = std::time::Instant::now();
                counters.count_query(true);
                run_query(rt, role, &sql, &mut out).await;
                counters.add_query_time(started.elapsed(), Some(started.elapsed()));
            }
            tag::TERMINATE => return Ok(()),
            tag::SYNC => {
                in_error = false;
                wire::encode_ready_for_query(&mut out, TxStatus::Idle);
            }
            tag::PARSE
            | tag::BIND
            | tag::DESCRIBE
            | tag::EXECUTE
            | tag::CLOSE
            | tag::FLUSH
            | tag::FUNCTION_CALL => {
                if !in_error {
                    in_error = true;
                    wire::encode_error(
                        &mut out,
                        &ErrorResponse::error(
                            sqlstate::PROTOCOL_VIOLATION,
                            "extended query protocol not supported by admin console",
                        ),
                    );
                }
            }
            other => {
                return Err(SessionError::Fatal(ErrorResponse::fatal(
                    sqlstate::PROTOCOL_VIOLATION,
                    format!("unsupported message type for admin console: {other}"),
                )))
            }
        }
        counters.add_sent(out.len());
        io.send(&out).await?;
    }
}

/// AuthenticationOk was sent already: the parameters, a key and ReadyForQuery.
fn welcome(client_encoding: Option<String>, app_name: &str) -> BytesMut {
    let mut out = BytesMut::new();
    let encoding = client_encoding.unwrap_or_else(|| "UTF8".to_string());
    for (name, value) in [
        ("server_version", env!("CARGO_PKG_VERSION")),
        ("server_encoding", "UTF8"),
        ("client_encoding", encoding.as_str()),
        ("DateStyle", "ISO"),
        ("TimeZone", "GMT"),
        ("standard_conforming_strings", "on"),
        ("integer_datetimes", "on"),
        ("is_superuser", "on"),
        ("application_name", app_name),
    ] {
        wire::encode_parameter_status(&mut out, name, value);
    }
    let mut secret = [0u8; 4];
    rand::thread_rng().fill_bytes(&mut secret);
    wire::encode_backend_key_data(&mut out, rand::thread_rng().next_u32(), &secret);
    wire::encode_ready_for_query(&mut out, TxStatus::Idle);
    out
}

/// Runs one query and writes its answer and ReadyForQuery.
async fn run_query(rt: &Arc<Runtime>, role: Role, sql: &str, out: &mut BytesMut) {
    let result = match parse::parse(sql) {
        Ok(cmd) => execute(rt, role, cmd, out).await,
        Err(e) => Err(AdminError::protocol(e.to_string())),
    };
    if let Err(e) = result {
        // Always logged once (a failed RELOAD points the operator here, its reason
        // included): as a pooler error when log_pooler_errors says so, as PgBouncer's
        // admin_error.
        let message = crate::ops::routine::printable(&e.message);
        match rt.config.load().settings.log_pooler_errors {
            true => tracing::warn!(code = %e.code, "pooler error: {message}"),
            false => tracing::warn!(code = %e.code, "admin console: {message}"),
        }
        wire::encode_error(out, &ErrorResponse::error(e.code, e.message));
    }
    wire::encode_ready_for_query(out, TxStatus::Idle);
}

/// Carries out one command, writing its result into `out`.
pub async fn execute(
    rt: &Arc<Runtime>,
    role: Role,
    cmd: Command,
    out: &mut BytesMut,
) -> Result<(), AdminError> {
    match cmd {
        Command::Empty => {
            wire::encode_empty_query_response(out);
            Ok(())
        }
        Command::Show(what) => show::show(rt, &what, out),
        Command::Set { key, .. } if show::fake_param(&key).is_some() => {
            // A client library setting its session up (psql's \encoding, say): answered for
            // any user, changing nothing, as PgBouncer answers it.
            let notice = ErrorResponse::new(wire::Severity::Notice, "00000", "SET ignored");
            wire::encode_notice(out, &notice);
            wire::encode_command_complete(out, "SET");
            Ok(())
        }
        Command::ShowStatements { limit, tenant } => {
            show_gate::statements(rt, limit, tenant.as_deref()).encode(out);
            Ok(())
        }
        _ if role != Role::Admin => Err(AdminError::protocol("admin access needed")),
        Command::Reload
        | Command::Set { .. }
        | Command::SetUser { .. }
        | Command::SetPool { .. } => set::run(rt, cmd, out),
        Command::SetTenant { .. } | Command::KillFor { .. } | Command::Unkill(_) => {
            incident::run(rt, cmd, out)
        }
        other => control::run(rt, other, out).await,
    }
}
