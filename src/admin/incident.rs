//! Incident tools of the admission gate: `SET TENANT`, `KILL TENANT` / `KILL STATEMENT ... FOR`
//! and `UNKILL`. Bad values answer 22023 (invalid_parameter_value), as PostgreSQL does for a
//! bad setting; a kill that is not in force answers 42704 (undefined_object).

use std::time::{Duration, Instant};

use bytes::BytesMut;

use super::parse::{Command, Target};
use super::AdminError;
use crate::gate::{parse_duration, Event, KillTarget, Record};
use crate::runtime::Runtime;
use crate::sql::Fingerprint;
use crate::wire::{self, sqlstate};

pub fn run(rt: &Runtime, cmd: Command, out: &mut BytesMut) -> Result<(), AdminError> {
    let tag = match cmd {
        Command::SetTenant { name, value } => set_tenant(rt, &name, &value).map(|()| "SET"),
        Command::KillFor {
            target,
            duration,
            soft,
        } => kill(rt, &target, &duration, soft).map(|()| "KILL"),
        Command::Unkill(target) => unkill(rt, &target).map(|()| "UNKILL"),
        _ => Err(AdminError::protocol("not a gate command")),
    }?;
    wire::encode_command_complete(out, tag);
    Ok(())
}

/// Changes the keys given in `words` for `tenant` (a tenant not seen yet is added); a bad
/// word changes nothing.
fn set_tenant(rt: &Runtime, tenant: &str, words: &str) -> Result<(), AdminError> {
    let tenant = tenant_name(tenant)?;
    rt.gatekeeper
        .lock()
        .set_tenant(tenant, words, Instant::now())
        .map_err(|e| AdminError::invalid_value(format!("SET TENANT failed: {e}")))?;
    // A higher rate or a larger max_active may let waiting tickets run now.
    rt.gatekeeper.wake();
    tracing::info!("SET TENANT {tenant} = '{words}'");
    Ok(())
}

/// How long a kill's cancel of a running statement may take to reach its server.
const CANCEL_LIMIT: Duration = Duration::from_secs(5);

/// A kill refuses what comes; unless `soft`, it also refuses what waits and cancels what
/// runs. Without a policy a tenant is its role, and a statement kill cannot take effect
/// (statements are not read), so it is refused.
fn kill(rt: &Runtime, target: &Target, duration: &str, soft: bool) -> Result<(), AdminError> {
    let target = kill_target(target)?;
    let now = Instant::now();
    let length = kill_duration(duration, now)?;
    if matches!(target, KillTarget::Statement(_)) && rt.governance.load().is_none() {
        return Err(AdminError {
            code: sqlstate::FEATURE_NOT_SUPPORTED,
            message: "KILL STATEMENT needs a policy: without policy_file pgward does not read statements, so it cannot tell one from another".to_string(),
        });
    }
    let queued = rt.gatekeeper.kill(target.clone(), length, soft);
    let running = match soft {
        true => 0,
        false => rt.cancels.cancel_where(
            |tenant, fp| target.stops(tenant, fp.map(Fingerprint)),
            CANCEL_LIMIT,
        ),
    };
    let (reason, tenant, fingerprint) = match &target {
        KillTarget::Tenant(t) => ("tenant", Some(t.as_str()), None),
        KillTarget::Statement(f) => ("statement", None, Some(*f)),
    };
    let mut record = Record::new(Event::Killed, reason)
        .fingerprint(fingerprint)
        .sqlstate(crate::gate::SQLSTATE_RESOURCES)
        .seconds("for_s", length)
        .figure("queued", queued as f64)
        .figure("running", running as f64)
        .figure("soft", f64::from(u8::from(soft)));
    if let Some(t) = tenant {
        record = record.tenant(t);
    }
    rt.gatekeeper.decisions.record(&record);
    tracing::info!(
        queued,
        running,
        soft,
        "KILL {} for {} s",
        target.describe(),
        length.as_secs_f64()
    );
    Ok(())
}

fn unkill(rt: &Runtime, target: &Target) -> Result<(), AdminError> {
    let target = kill_target(target)?;
    let lifted = rt.gatekeeper.unkill(&target);
    if !lifted {
        return Err(AdminError {
            code: sqlstate::UNDEFINED_OBJECT,
            message: format!("no kill of {} is in force", target.describe()),
        });
    }
    tracing::info!("UNKILL {}", target.describe());
    Ok(())
}

fn tenant_name(name: &str) -> Result<&str, AdminError> {
    if name.is_empty() {
        Err(AdminError::invalid_value("a tenant name must not be empty"))
    } else {
        Ok(name)
    }
}

/// The gate's target: a tenant, or a statement by its fingerprint (up to 16 hex digits, as
/// refusals and SHOW KILLS print it).
fn kill_target(target: &Target) -> Result<KillTarget, AdminError> {
    match target {
        Target::Tenant(name) => Ok(KillTarget::Tenant(tenant_name(name)?.to_string())),
        Target::Statement(hex) => KillTarget::statement(hex).ok_or_else(|| {
            AdminError::invalid_value(format!(
                "invalid statement fingerprint \"{hex}\": expected up to 16 hex digits"
            ))
        }),
    }
}

/// A positive duration (`'30s'`, `'10m'`, `'1h'`, `'2d'`; a bare number is milliseconds).
fn kill_duration(text: &str, now: Instant) -> Result<Duration, AdminError> {
    parse_duration(text)
        .filter(|d| !d.is_zero() && now.checked_add(*d).is_some())
        .ok_or_else(|| {
            AdminError::invalid_value(format!(
                "invalid duration \"{text}\": expected a positive duration such as '30s', '10m' or '1h'"
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_and_durations() {
        let now = Instant::now();
        assert_eq!(
            kill_target(&Target::Tenant("acme".into())),
            Ok(KillTarget::Tenant("acme".into()))
        );
        let fp = kill_target(&Target::Statement("00000000000000ff".into())).unwrap();
        assert_eq!(fp.describe(), "statement 00000000000000ff");
        for bad in ["", "xyz", "00000000000000000"] {
            let err = kill_target(&Target::Statement(bad.into())).unwrap_err();
            assert_eq!(err.code, sqlstate::INVALID_PARAMETER_VALUE, "{bad}");
        }
        let err = kill_target(&Target::Tenant(String::new())).unwrap_err();
        assert_eq!(err.code, sqlstate::INVALID_PARAMETER_VALUE);
        assert_eq!(kill_duration("10m", now), Ok(Duration::from_secs(600)));
        assert_eq!(kill_duration("'250'", now), Ok(Duration::from_millis(250)));
        for bad in ["0", "0s", "ten minutes", "-5m", "10 parsecs", ""] {
            let err = kill_duration(bad, now).unwrap_err();
            assert_eq!(err.code, sqlstate::INVALID_PARAMETER_VALUE, "{bad}");
        }
    }
}
