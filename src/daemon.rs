//! The running process: start-up (auth file, policy, TLS, listeners, pidfile, metrics), the
//! maintenance loop, signals, and the shutdown state machine that decides when to exit.
//! `main.rs` only parses the command line, sets up logging and the runtime, and calls
//! [`serve`].

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::admin::parse::Command as Console;
use crate::admin::Role;
use crate::config::{self, Config};
use crate::listener::Listeners;
use crate::ops::Shutdown;
use crate::pool::PoolError;
use crate::runtime::Runtime;
use crate::workers::Workers;

/// What main set up for pgward's own log.
#[derive(Debug, Default)]
pub struct Logging {
    pub file: Option<Arc<crate::ops::logfile::LogFile>>,
    pub level: Option<crate::ops::logfile::LogLevel>,
    pub syslog: Option<Arc<crate::ops::syslog::Syslog>>,
}

/// Serves `config` until a signal or the console stops pgward; the process's exit code.
/// `log`: pgward's own log file, if it writes one (opened again at every reload), and the
/// control of its level.
pub async fn serve(config: Config, log: Logging, workers: Workers) -> ExitCode {
    let userlist = match &config.settings.auth_file {
        Some(path) => match config::load_userlist(path) {
            Ok(u) => u,
            Err(e) => return failed(e),
        },
        None => Default::default(),
    };
    let governance = match crate::policy::Governance::load(&config.settings) {
        Ok(g) => g,
        Err(e) => return failed(e),
    };
    let edge = match crate::edge::Edge::load(&config.settings) {
        Ok(e) => e,
        Err(e) => return failed(e),
    };
    // The decision log and the traffic log are opened before anything is bound: a path that
    // cannot be opened stops the start with nothing taken over (a rolling restart's old
    // process keeps its socket).
    let gatekeeper = crate::gate::keeper::Gatekeeper::new();
    if let Err(e) = crate::runtime::open_decision_log(&gatekeeper, governance.as_deref()) {
        return failed(e);
    }
    let ops = crate::ops::Ops {
        logfile: log.file,
        log_level: log.level,
        syslog: log.syslog,
        ..Default::default()
    };
    if let Err(e) = crate::runtime::open_traffic_log(&ops, governance.as_deref()) {
        return failed(e);
    }
    raise_fd_limit(&config);
    // The signals are pgward's before anything is bound: a reload asked for the moment the
    // port accepts must find a handler, not the default action (which ends the process).
    let signals = match Signals::install() {
        Ok(s) => s,
        Err(e) => return failed(format!("cannot install signal handlers: {e}")),
    };
    // The metrics port is bound before the client listeners: once a client can connect, a
    // scraper can too.
    let metrics = match &config.settings.prometheus_listen {
        Some(addr) => match crate::metrics::bind(addr).await {
            Ok(l) => Some(l),
            Err(e) => return failed(e),
        },
        None => None,
    };
    let listeners = match Listeners::bind(&config.settings) {
        Ok(l) => l,
        Err(e) => return failed(e),
    };
    let pidfile = config.settings.pidfile.clone();
    if let Some(p) = &pidfile {
        if let Err(e) = std::fs::write(p, format!("{}\n", std::process::id())) {
            eprintln!("pgward: cannot write pidfile {}: {e}", p.display());
            return ExitCode::FAILURE;
        }
    }
    let socket = listeners.unix.as_ref().and_then(|(_, p)| {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(p).ok().map(|m| (p.clone(), m.ino()))
    });
    let parts = (edge, gatekeeper, ops, workers);
    let rt = Runtime::new(config, userlist, governance, parts);
    load_state(&rt);
    let mut tasks = Vec::new();
    if let Some(l) = metrics {
        tasks.push(tokio::spawn(crate::metrics::serve(rt.clone(), l)));
    }
    tracing::info!("pgward {} started", env!("CARGO_PKG_VERSION"));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tasks.extend(listeners.spawn(&rt, stop_rx));
    tasks.push(tokio::spawn(maintenance(rt.clone())));
    tasks.push(tokio::spawn(rt.gatekeeper.clone().clock()));
    tasks.push(tokio::spawn(crate::watch::supervise(rt.clone())));
    tasks.push(tokio::spawn(crate::fleet::run(rt.clone())));
    run_until_stopped(&rt, &stop_tx, signals).await;
    for t in tasks {
        t.abort();
    }
    if let Some(g) = rt.governance.load().as_ref() {
        g.save_allowlist();
    }
    save_state(&rt);
    rt.ops.traffic.flush();
    cleanup(pidfile.as_deref(), socket.as_ref());
    tracing::info!("pgward stopped");
    ExitCode::SUCCESS
}

/// Restores what the gate learned from `state_file`, if one is named: a missing file is a
/// first start; one that cannot be read is a warning, never a failed start.
fn load_state(rt: &Runtime) {
    let Some(path) = rt.config.load().settings.state_file.clone() else {
        return;
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
        Err(e) => {
            tracing::warn!("state file {}: {e}; starting without it", path.display());
            return;
        }
    };
    match crate::cost::Calibration::from_json(&text) {
        Ok(c) => {
            tracing::info!(factors = c.len(), "state file {} read", path.display());
            rt.gatekeeper.restore_calibration(c);
        }
        Err(e) => tracing::warn!("state file {}: {e}; starting without it", path.display()),
    }
}

/// Writes what the gate learned to `state_file`, if one is named and something was learned
/// since the last write: a new file renamed over the old one, so a crash leaves one or the
/// other whole; one pgward could not read is replaced only once something new was learned. A
/// failed write is tried again next time.
fn save_state(rt: &Runtime) {
    let Some(path) = rt.config.load().settings.state_file.clone() else {
        return;
    };
    let Some(text) = rt.gatekeeper.calibration_to_save() else {
        return;
    };
    if let Err(e) = write_atomically(&path, text.as_bytes()) {
        tracing::warn!("cannot write state file {}: {e}", path.display());
        rt.gatekeeper.calibration().mark_dirty();
    }
}

fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// A start-up failure: said in the log and on stderr.
fn failed(e: impl std::fmt::Display) -> ExitCode {
    tracing::error!("{e}");
    eprintln!("pgward: {e}");
    ExitCode::FAILURE
}

/// Makes room for every client and server socket pgward may hold, as far as the hard limit
/// allows: two descriptors per client (its socket, and the registry's copy that KILL shuts
/// down), plus the servers and a margin for listeners and files.
fn raise_fd_limit(config: &Config) {
    let s = &config.settings;
    // Pools without a size of their own (0) have as many servers as clients, at most.
    let pools = match s.default_pool_size {
        0 => u64::from(s.max_client_conn),
        n => u64::from(n) * (config.databases.len() as u64 + 1),
    };
    let servers = pools + u64::from(s.max_db_connections);
    let wanted = 2 * u64::from(s.max_client_conn) + servers + 100;
    match crate::edge::raise_fd_limit(wanted) {
        Ok(limit) if limit < wanted => tracing::warn!(
            "open files limited to {limit}, fewer than the {wanted} max_client_conn and the pools may need"
        ),
        Ok(_) => {}
        Err(e) => tracing::warn!("cannot raise the open files limit: {e}"),
    }
}

/// Once a second: each pool's maintenance pass (not for paused databases, which must not
/// open servers), the stats period, and the end of a judged minute when its time has come
/// (unusual minutes); once a minute, the gate's upkeep (the plan cache's
/// log line, expired plans, idle tenants).
pub async fn maintenance(rt: Arc<Runtime>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut minute = Instant::now();
    loop {
        tick.tick().await;
        let now = Instant::now();
        rt.ensure_forced_pools();
        let with_clients = rt.ops.clients.pools_with_clients();
        let config = rt.config.load();
        for pool in rt.pools.all() {
            if !rt.ops.control.holds(&pool.key.db) {
                // The database's forced user is this pool's (not a pool left from before a
                // reload that forced another); an auto-database's `*` entry counts too.
                let forced = config
                    .database(&pool.key.db)
                    .is_some_and(|d| d.user.as_deref() == Some(pool.key.user.as_str()));
                let key = (pool.key.db.clone(), pool.key.user.clone());
                // A pool whose database a reload removed (or whose forced user it changed)
                // closes its servers as they come back: it is not filled for its clients.
                let wanted = forced || with_clients.contains(&key);
                pool.maintain(now, wanted && !pool.closing.retired());
            }
        }
        let settings = &rt.config.load().settings;
        if let Some(after) = settings.pool_idle_timeout {
            rt.pools.free_idle(after, now);
        }
        if let (Some(after), true) = (settings.autodb_idle_timeout, config.autodb.is_some()) {
            let is_auto = |db: &str| config.own_entry(db).is_none();
            let paused = |db: &str| rt.ops.control.get().is_paused(db);
            rt.pools.free_idle_auto(after, now, is_auto, paused);
        }
        let averages = rt.ops.stats.tick(now, settings.stats_period);
        if let (Some(avg), true) = (averages, settings.log_stats) {
            tracing::info!("{}", crate::ops::routine::stats_line(&avg));
        }
        rt.ops.judge_minute(now, std::time::SystemTime::now());
        rt.ops.traffic.flush();
        if now.saturating_duration_since(minute) >= Duration::from_secs(60) {
            minute = now;
            crate::admin::gate_minute(&rt, now);
            // A disk write, off the threads that serve clients.
            let saving = rt.clone();
            tokio::task::spawn_blocking(move || save_state(&saving));
        }
    }
}

/// Serves signals and watches the shutdown state until the process should exit.
///
/// SIGHUP reloads; SIGTERM waits for clients to leave and SIGINT for servers to be released
/// (a second one of either exits at once); SIGQUIT exits at once; SIGUSR1 pauses and SIGUSR2
/// resumes. The console's SHUTDOWN commands set the same states.
pub async fn run_until_stopped(
    rt: &Arc<Runtime>,
    stop: &tokio::sync::watch::Sender<bool>,
    signals: Signals,
) {
    let Signals {
        mut term,
        mut int,
        mut quit,
        mut hup,
        mut usr1,
        mut usr2,
    } = signals;
    let mut changes = rt.ops.control.subscribe();
    let mut refused_waiters = false;
    loop {
        let mode = rt.ops.control.shutdown();
        if mode != Shutdown::No {
            let _ = stop.send(true);
        }
        if mode == Shutdown::WaitForServers && !refused_waiters {
            // Clients already queued for a server get none, as new requests get none.
            refused_waiters = true;
            for pool in rt.pools.all() {
                pool.refuse_waiters(PoolError::ShuttingDown);
            }
        }
        if done(rt, mode) {
            return;
        }
        let stopping = mode != Shutdown::No;
        tokio::select! {
            _ = term.recv() => stop_signal(rt, "SIGTERM", Shutdown::WaitForClients),
            _ = int.recv() => stop_signal(rt, "SIGINT", Shutdown::WaitForServers),
            _ = quit.recv() => stop_signal(rt, "SIGQUIT", Shutdown::Now),
            _ = hup.recv() => reload(rt),
            _ = usr1.recv() => console(rt, Console::Pause(None), "SIGUSR1"),
            _ = usr2.recv() => {
                // Read now: a SHUTDOWN may have come since this turn of the loop began.
                if rt.ops.control.shutdown() != Shutdown::No {
                    tracing::info!("got SIGUSR2 while shutting down, ignoring");
                } else {
                    console(rt, Console::Resume(None), "SIGUSR2");
                }
            }
            _ = changes.changed() => {}
            _ = tokio::time::sleep(Duration::from_millis(100)), if stopping => {}
        }
    }
}

/// The signals pgward serves, taken from their default actions.
pub struct Signals {
    term: Signal,
    int: Signal,
    quit: Signal,
    hup: Signal,
    usr1: Signal,
    usr2: Signal,
}

type Signal = tokio::signal::unix::Signal;

impl Signals {
    /// Installs the handlers (on the running tokio runtime).
    pub fn install() -> std::io::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            quit: signal(SignalKind::quit())?,
            hup: signal(SignalKind::hangup())?,
            usr1: signal(SignalKind::user_defined1())?,
            usr2: signal(SignalKind::user_defined2())?,
        })
    }
}

/// A stop signal: the first asks for `mode`, a second one (or SIGQUIT) exits at once.
fn stop_signal(rt: &Runtime, name: &str, mode: Shutdown) {
    let control = &rt.ops.control;
    let next = if control.shutdown() == Shutdown::No {
        mode
    } else {
        Shutdown::Now
    };
    tracing::info!("{name} received: {next:?}");
    control.update(|s| s.shutdown = next);
}

/// Whether the shutdown in progress may finish now.
pub fn done(rt: &Runtime, mode: Shutdown) -> bool {
    match mode {
        Shutdown::No => false,
        Shutdown::Now => true,
        Shutdown::WaitForClients => rt.ops.clients.pool_clients() == 0,
        Shutdown::WaitForServers => rt.pools.all().iter().all(|p| {
            let s = p.stats();
            s.active + s.connecting == 0
        }),
    }
}

/// Runs a console command for a signal, in its own task (PAUSE waits for servers).
fn console(rt: &Arc<Runtime>, cmd: Console, signal: &'static str) {
    let rt = rt.clone();
    tokio::spawn(async move {
        let mut out = bytes::BytesMut::new();
        match crate::admin::execute(&rt, Role::Admin, cmd, &mut out).await {
            Ok(()) => tracing::info!("{signal}: done"),
            Err(e) => tracing::warn!("{signal}: {}", e.message),
        }
    });
}

fn reload(rt: &Runtime) {
    match rt.reload() {
        Ok(warnings) => {
            for w in warnings {
                tracing::warn!("{w}");
            }
            tracing::info!("configuration reloaded");
        }
        Err(e) => tracing::error!("reload failed, keeping the running configuration: {e}"),
    }
}

/// Removes the pidfile and the Unix socket, but only while they are still this process's:
/// in a rolling restart the new process has replaced both by the time the old one exits.
fn cleanup(pidfile: Option<&Path>, socket: Option<&(PathBuf, u64)>) {
    use std::os::unix::fs::MetadataExt;
    if let Some(p) = pidfile {
        let ours = std::fs::read_to_string(p)
            .is_ok_and(|text| text.trim() == std::process::id().to_string());
        if ours {
            let _ = std::fs::remove_file(p);
        }
    }
    if let Some((path, inode)) = socket {
        if std::fs::metadata(path).is_ok_and(|m| m.ino() == *inode) {
            let _ = std::fs::remove_file(path);
        }
    }
}
