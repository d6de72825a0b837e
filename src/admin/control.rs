//! Process control: PAUSE, RESUME, SUSPEND, DISABLE, ENABLE, RECONNECT, KILL, KILL_CLIENT,
//! WAIT_CLOSE and SHUTDOWN.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;

use super::parse::{Command, ShutdownKind};
use super::{is_console, AdminError};
use crate::ops::{PauseMode, Shutdown};
use crate::pool::{Pool, Renewal};
use crate::runtime::Runtime;
use crate::wire;

/// How often waiting commands look again.
const POLL: Duration = Duration::from_millis(50);

pub async fn run(rt: &Arc<Runtime>, cmd: Command, out: &mut BytesMut) -> Result<(), AdminError> {
    let tag = match cmd {
        Command::Pause(db) => pause(rt, db.as_deref()).await.map(|()| "PAUSE"),
        Command::Resume(db) => resume(rt, db.as_deref()).map(|()| "RESUME"),
        Command::Suspend => suspend(rt).map(|()| "SUSPEND"),
        Command::Disable(db) => set_disabled(rt, &db, true).map(|()| "DISABLE"),
        Command::Enable(db) => set_disabled(rt, &db, false).map(|()| "ENABLE"),
        Command::Reconnect(db) => reconnect(rt, db.as_deref()).map(|()| "RECONNECT"),
        Command::Kill(db) => kill(rt, db.as_deref()).map(|()| "KILL"),
        Command::KillClient(id) => kill_client(rt, &id).map(|()| "KILL_CLIENT"),
        Command::WaitClose(db) => wait_close(rt, db.as_deref()).await.map(|()| "WAIT_CLOSE"),
        Command::Shutdown(kind) => shutdown(rt, kind).map(|()| "SHUTDOWN"),
        _ => Err(AdminError::protocol("not a control command")),
    }?;
    wire::encode_command_complete(out, tag);
    Ok(())
}

/// Checks that `db` names a configured database (or one with pools) and not the console.
fn known_db(rt: &Runtime, db: &str, verb: &str) -> Result<(), AdminError> {
    if is_console(db) {
        return Err(AdminError::protocol(format!(
            "cannot {verb} admin db: {db}"
        )));
    }
    // A name the `*` entry serves counts as PgBouncer registers it for the command.
    let configured = rt.config.load().database(db).is_some();
    if configured || rt.pools.all().iter().any(|p| p.key.db == db) {
        Ok(())
    } else {
        Err(AdminError::protocol(format!("no such database: {db}")))
    }
}

/// The pools of `db`, or every pool.
fn pools_of(rt: &Runtime, db: Option<&str>) -> Vec<Arc<Pool>> {
    rt.pools
        .all()
        .into_iter()
        .filter(|p| db.is_none_or(|d| p.key.db == d))
        .collect()
}

async fn pause(rt: &Runtime, db: Option<&str>) -> Result<(), AdminError> {
    let already = || AdminError::protocol("already suspended/paused");
    if rt.ops.control.get().pause != PauseMode::Running {
        return Err(already());
    }
    if let Some(db) = db {
        known_db(rt, db, "pause")?;
    }
    // Checked again as one step with the change: another console may have paused meanwhile.
    rt.ops.control.try_update(|s| {
        if s.pause != PauseMode::Running {
            return Err(already());
        }
        match db {
            Some(db) => {
                s.paused.insert(db.to_string());
            }
            None => s.pause = PauseMode::Paused,
        }
        Ok(())
    })?;
    tracing::info!("PAUSE {}", db.unwrap_or("(all)"));
    // Servers still in use are closed as they come back; the command returns when none is,
    // or when a RESUME (or a KILL's end) has lifted the pause meanwhile.
    loop {
        let state = rt.ops.control.get();
        let in_force = match db {
            Some(db) => state.paused.contains(db),
            None => state.pause == PauseMode::Paused,
        };
        if !in_force {
            return Ok(());
        }
        let pools = pools_of(rt, db);
        let mut busy = 0;
        for pool in &pools {
            pool.close_idle("pause mode");
            let s = pool.stats();
            busy += s.active + s.connecting;
        }
        if busy == 0 {
            return Ok(());
        }
        tokio::time::sleep(POLL).await;
    }
}

fn resume(rt: &Runtime, db: Option<&str>) -> Result<(), AdminError> {
    let stopping = || AdminError::protocol("pooler is shutting down");
    if rt.ops.control.get().stopping() {
        return Err(stopping());
    }
    // A database paused and then taken out of the configuration can still be resumed.
    if let Some(db) = db.filter(|db| !rt.ops.control.get().paused.contains(*db)) {
        known_db(rt, db, "resume")?;
    }
    rt.ops.control.try_update(|s| {
        if s.stopping() {
            return Err(stopping());
        }
        match db {
            Some(db) => {
                if !s.paused.remove(db) {
                    return Err(AdminError::protocol(format!("database {db} is not paused")));
                }
            }
            None => {
                // As in PgBouncer, a RESUME of the whole pooler leaves databases paused (or
                // killed) by name as they are: each has its own RESUME db.
                if s.pause == PauseMode::Running {
                    return Err(AdminError::protocol("pooler is not paused/suspended"));
                }
                s.pause = PauseMode::Running;
            }
        }
        Ok(())
    })?;
    tracing::info!("RESUME {}", db.unwrap_or("(all)"));
    Ok(())
}

fn suspend(rt: &Runtime) -> Result<(), AdminError> {
    rt.ops.control.try_update(|s| {
        if s.pause != PauseMode::Running {
            return Err(AdminError::protocol("already suspended/paused"));
        }
        if !s.paused.is_empty() {
            return Err(AdminError::protocol("cannot suspend with paused databases"));
        }
        s.pause = PauseMode::Suspended;
        Ok(())
    })?;
    tracing::info!("SUSPEND");
    Ok(())
}

fn set_disabled(rt: &Runtime, db: &str, disabled: bool) -> Result<(), AdminError> {
    known_db(rt, db, if disabled { "disable" } else { "enable" })?;
    rt.ops.control.update(|s| {
        if disabled {
            s.disabled.insert(db.to_string());
        } else {
            s.disabled.remove(db);
        }
    });
    tracing::info!("{} {db}", if disabled { "DISABLE" } else { "ENABLE" });
    Ok(())
}

fn reconnect(rt: &Runtime, db: Option<&str>) -> Result<(), AdminError> {
    if let Some(db) = db {
        known_db(rt, db, "reconnect")?;
    }
    let now = Instant::now();
    for pool in pools_of(rt, db) {
        pool.reconnect(now, Renewal::Reconnect);
    }
    tracing::info!("RECONNECT {}", db.unwrap_or("(all)"));
    Ok(())
}

fn kill(rt: &Runtime, db: Option<&str>) -> Result<(), AdminError> {
    if let Some(db) = db {
        known_db(rt, db, "kill")?;
    }
    // As in PgBouncer, a KILL pauses the database it names, or each database with a pool
    // (the pooler itself is not paused: each one has its RESUME db), and is refused while
    // the pooler is paused or suspended.
    let pools = pools_of(rt, db);
    let paused: Vec<String> = match db {
        Some(db) => vec![db.to_string()],
        None => pools.iter().map(|p| p.key.db.clone()).collect(),
    };
    rt.ops.control.try_update(|s| {
        if s.pause != PauseMode::Running {
            return Err(AdminError::protocol("already suspended/paused"));
        }
        s.paused.extend(paused.iter().cloned());
        Ok(())
    })?;
    let killed = rt
        .ops
        .clients
        .kill_where(|d| db.is_none_or(|want| want == d));
    let now = Instant::now();
    for pool in pools {
        pool.reconnect(now, Renewal::Kill);
    }
    tracing::info!("KILL {}: {killed} clients", db.unwrap_or("(all)"));
    Ok(())
}

fn kill_client(rt: &Runtime, id: &str) -> Result<(), AdminError> {
    let id: u64 = id
        .parse()
        .map_err(|_| AdminError::protocol("invalid client pointer supplied"))?;
    if !rt.ops.clients.kill(id) {
        return Err(AdminError::protocol("client not found"));
    }
    tracing::info!("KILL_CLIENT {id}");
    Ok(())
}

/// Waits until no server of `db` (or of any database) is marked to close.
async fn wait_close(rt: &Runtime, db: Option<&str>) -> Result<(), AdminError> {
    if let Some(db) = db {
        known_db(rt, db, "wait in")?;
    }
    loop {
        let pools = pools_of(rt, db);
        let pending = rt.ops.clients.all().iter().any(|c| {
            let info = c.info();
            let Some(server) = info.server else {
                return false;
            };
            pools.iter().any(|p| {
                p.key.db == info.database
                    && p.key.user == info.pool_user
                    && p.closing.close_needed(server.id, server.created)
            })
        });
        if !pending && !pools.iter().any(|p| p.opening_outdated()) {
            return Ok(());
        }
        tokio::time::sleep(POLL).await;
    }
}

fn shutdown(rt: &Runtime, kind: ShutdownKind) -> Result<(), AdminError> {
    let mode = match kind {
        ShutdownKind::Now => Shutdown::Now,
        ShutdownKind::WaitForServers => Shutdown::WaitForServers,
        ShutdownKind::WaitForClients => Shutdown::WaitForClients,
    };
    rt.ops.control.try_update(|s| {
        if mode != Shutdown::Now && s.stopping() {
            return Err(AdminError::protocol("pooler is already shutting down"));
        }
        s.shutdown = mode;
        Ok(())
    })?;
    tracing::info!("SHUTDOWN {kind:?}");
    Ok(())
}
