//! RELOAD and the SET family: main-section settings, and the runtime limits of users and
//! pools.

use std::sync::Arc;

use bytes::BytesMut;

use super::parse::Command;
use super::AdminError;
use crate::runtime::{LimitTarget, Runtime};
use crate::wire::{self, sqlstate};

pub fn run(rt: &Arc<Runtime>, cmd: Command, out: &mut BytesMut) -> Result<(), AdminError> {
    match cmd {
        Command::Reload => reload(rt, out),
        Command::Set { key, value } => {
            rt.set_setting(&key, &value)
                .map_err(|e| AdminError::protocol(format!("SET failed: {e}")))?;
            tracing::info!("SET {key} = {value}");
            wire::encode_command_complete(out, "SET");
            Ok(())
        }
        Command::SetUser { name, value } => limits(rt, LimitTarget::User(name), &value, out),
        Command::SetPool { key, value } => limits(rt, LimitTarget::Pool(key), &value, out),
        _ => Err(AdminError::protocol("not a SET command")),
    }
}

fn reload(rt: &Runtime, out: &mut BytesMut) -> Result<(), AdminError> {
    match rt.reload() {
        Ok(warnings) => {
            for w in warnings {
                tracing::warn!("{w}");
            }
            tracing::info!("configuration reloaded");
            wire::encode_command_complete(out, "RELOAD");
            Ok(())
        }
        Err(e) => {
            tracing::error!("reload failed, keeping the running configuration: {e}");
            Err(AdminError {
                code: sqlstate::CONFIG_FILE_ERROR,
                message: format!("RELOAD failed, see logs for additional details: {e}"),
            })
        }
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
