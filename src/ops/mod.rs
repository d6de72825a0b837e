//! The operations layer's shared state: the client registry, traffic counters, the pause /
//! disable / shutdown state, runtime limits set from the console, and the small hooks a
//! session calls as it takes and gives back servers.

pub mod anomalies;
pub mod clients;
pub mod hooks;
pub mod logfile;
pub mod overrides;
pub mod routine;
pub mod sketch;
pub mod state;
pub mod statements;
pub mod syslog;
pub mod stats;
pub mod traffic;

use std::sync::Mutex;
use std::time::{Instant, SystemTime};

use crate::sync::lock;

pub use anomalies::{Change, Detector, Incident};
pub use clients::{ClientEntry, ClientInfo, ClientRegistry, ClientState, Registration, ServerLink};
pub use hooks::{Checkout, SessionHooks, Waiting};
pub use overrides::Overrides;
pub use state::{Control, OpState, PauseMode, Shutdown};
pub use statements::{Ran, StatementKey, StatementRow, StatementTables, Statements};
pub use stats::{PoolCounters, StatValues, StatsRegistry};

/// The operations layer's part of the runtime.
#[derive(Debug)]
pub struct Ops {
    pub clients: ClientRegistry,
    pub stats: StatsRegistry,
    pub control: Control,
    /// SET USER / SET POOL values, kept across reloads.
    pub overrides: Mutex<Overrides>,
    /// Statement statistics (SHOW STATEMENTS), under a policy: a table per worker thread.
    pub statements: StatementTables,
    /// The judge of unusual minutes (SHOW ANOMALIES), fed by the statement statistics.
    pub anomalies: Mutex<Detector>,
    /// The traffic log (`pgward simulate` reads it), under a policy that names one.
    pub traffic: traffic::TrafficLog,
    /// pgward's own log file, when `logfile` names one (opened again at every reload).
    pub logfile: Option<std::sync::Arc<logfile::LogFile>>,
    /// The log's level, changed by a reload or SET verbose (absent where nothing installed
    /// pgward's log, as in tests that run the daemon in process).
    pub log_level: Option<logfile::LogLevel>,
    /// pgward's log to syslog, switched on and off by `syslog` (absent where nothing installed
    /// pgward's log).
    pub syslog: Option<std::sync::Arc<syslog::Syslog>>,
    /// The OS user pgward runs as, and its name, for console logins over the Unix socket.
    pub os_uid: u32,
    pub os_user: Option<String>,
}

impl Default for Ops {
    fn default() -> Self {
        let os_uid = nix::unistd::getuid().as_raw();
        Ops {
            clients: ClientRegistry::default(),
            stats: StatsRegistry::default(),
            control: Control::default(),
            overrides: Mutex::new(Overrides::default()),
            statements: StatementTables::default(),
            anomalies: Mutex::new(Detector::default()),
            traffic: traffic::TrafficLog::default(),
            logfile: None,
            log_level: None,
            syslog: None,
            os_uid,
            os_user: user_name(os_uid),
        }
    }
}

impl Ops {
    /// Ends the current minute of the statement statistics if its time has come at `now`
    /// (`wall` on the clock), judges it, and says in the log what started or ended.
    pub fn judge_minute(&self, now: Instant, wall: SystemTime) {
        let mut detector = lock(&self.anomalies);
        if !detector.due(now) {
            return;
        }
        let tally = self.statements.take_minute();
        let change = detector.close(tally, wall);
        drop(detector);
        match change {
            Some(Change::Started(i)) => tracing::warn!(
                "anomaly {} started: {}; statements: {}; tenants: {}; lock waits: {}",
                i.id,
                signals_of(&i),
                self.statements_of(&i),
                i.tenants().join(", "),
                i.lock_waits
            ),
            Some(Change::Ended(i)) => tracing::warn!(
                "anomaly {} ended after {} unusual minutes: {}; statements: {}",
                i.id,
                i.minutes,
                signals_of(&i),
                self.statements_of(&i)
            ),
            None => {}
        }
    }

    /// The statements behind `incident`, as SHOW ANOMALIES and the log name them: each one's
    /// fingerprint, normalized text (when it can be shown), tenant and runs that failed or
    /// were slow or long.
    pub fn statements_of(&self, incident: &Incident) -> String {
        let named: Vec<String> = incident
            .named(anomalies::NAMED)
            .into_iter()
            .map(|(fingerprint, tenant, b)| {
                let text = self.statements.text(fingerprint);
                let text = text.as_deref().unwrap_or("?");
                format!(
                    "{fingerprint:016x} [{text}] tenant={tenant} failed={} slow={} long={}",
                    b.failed, b.slow, b.long
                )
            })
            .collect();
        named.join("; ")
    }
}

/// The signals that rose in `incident`, each with its peak and its baseline's mean.
pub fn signals_of(incident: &Incident) -> String {
    let rose: Vec<String> = incident
        .signals
        .iter()
        .map(|(s, r)| {
            let (peak, base) = (s.show(r.peak), s.show(r.baseline));
            format!("{} {peak} (baseline {base})", s.as_str())
        })
        .collect();
    rose.join(", ")
}

/// The name of OS user `uid` (from the password database).
pub fn user_name(uid: u32) -> Option<String> {
    let user = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)).ok()??;
    Some(user.name)
}
