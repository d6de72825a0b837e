//! RELOAD and the SET family: main-section settings, and the runtime limits of users and
//! pools.

use std::sync::Arc;

use bytes::BytesMut;

use super::parse::Command;
use super::AdminError;
use crate::runtime::{LimitTarget, Runtime};
use crate::wire::{self, sqlstate, ErrorResponse, Severity};

/// The SQLSTATE of a NOTICE that reports no error.
const SUCCESSFUL_COMPLETION: &str = "00000";

pub fn run(rt: &Arc<Runtime>, cmd: Command, out: &mut BytesMut) -> Result<(), AdminError> {
    match cmd {
        Command::Reload => reload(rt, out),
        Command::Set { key, value } => {
            let notices = rt
                .set_setting(&key, &value)
                .map_err(|e| AdminError::protocol(format!("SET failed: {e}")))?;
            tracing::info!("SET {key} = {value}");
            for n in notices {
                tracing::warn!("{n}");
                let notice = ErrorResponse::new(Severity::Notice, SUCCESSFUL_COMPLETION, n);
                wire::encode_notice(out, &notice);
            }
            // PgBouncer's tag names what was set.
            wire::encode_command_complete(out, &format!("SET {key}={value}"));
            Ok(())
        }
        Command::SetUser { name, value } => limits(rt, LimitTarget::User(name), &value, out),
        Command::SetPool { key, value } => limits(rt, LimitTarget::Pool(key), &value, out),
        _ => Err(AdminError::protocol("not a SET command")),
    }
}

fn reload(rt: &Runtime, out: &mut BytesMut) -> Result<(), AdminError> {
    match rt.reload_parts() {
        Ok(done) => {
            for w in done.warnings {
                tracing::warn!("{w}");
            }
            if let Some(why) = done.tls_kept {
                // As PgBouncer: the rest is applied, but the RELOAD reports the failure.
                tracing::error!("{why}");
                return Err(AdminError {
                    code: sqlstate::CONFIG_FILE_ERROR,
                    message: format!("RELOAD failed, see logs for additional details: {why}"),
                });
            }
            tracing::info!("configuration reloaded");
            wire::encode_command_complete(out, "RELOAD");
            Ok(())
        }
        // The console logs the refusal once, reason included (see `run_query`).
        Err(e) => Err(AdminError {
            code: sqlstate::CONFIG_FILE_ERROR,
            message: format!(
                "RELOAD failed, see logs for additional details: keeping the running configuration: {e}"
            ),
        }),
    }
}

fn limits(
    rt: &Runtime,
    target: LimitTarget,
    value: &str,
    out: &mut BytesMut,
) -> Result<(), AdminError> {
    rt.set_limits(target.clone(), value)
        .map_err(|e| AdminError::protocol(format!("SET failed: {e}")))?;
    tracing::info!("SET {target:?} = '{value}'");
    wire::encode_command_complete(out, "SET");
    Ok(())
}
