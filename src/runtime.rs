//! The running pooler's shared state, passed explicitly to every task: the configuration
//! snapshot, the auth file, the pools and the cancel keys. No global statics.

use std::collections::HashMap;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use rand::RngCore;

use crate::cancel::CancelRegistry;
use crate::config::databases::own_cap;
use crate::config::{Config, ConfigError, DatabaseDef, Secret, ServerCheck, SetOutcome, Settings};
use crate::edge::tls::ServerTls;
use crate::edge::Edge;
use crate::gate::keeper::Gatekeeper;
use crate::gate::GateSettings;
use crate::ops::Ops;
use crate::params::Tracked;
use crate::policy::Governance;
use crate::policy::PolicyError;
use crate::pool::{Limits, Pool, PoolKey, PoolSettings, Pools};
use crate::server::{Credential, ServerAddr, ServerTarget};
use crate::sync::lock;
use crate::workers::Workers;

/// What a reload applied only in part: warnings about the files, and why the running TLS
/// was kept, if it was.
#[derive(Debug, Default)]
pub struct Reloaded {
    pub warnings: Vec<String>,
    pub tls_kept: Option<String>,
}

/// Why a reload changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Policy(#[from] PolicyError),
    #[error("{0}")]
    Log(String),
}

pub struct Runtime {
    /// Shared (`Arc`) so sessions can keep an [`arc_swap::Cache`] of it.
    pub config: Arc<ArcSwap<Config>>,
    pub userlist: ArcSwap<HashMap<String, Secret>>,
    pub tracked: ArcSwap<Tracked>,
    /// The policy and the statement analyzer; `None` when no `policy_file` is set.
    pub governance: Arc<ArcSwap<Option<Arc<Governance>>>>,
    pub pools: Pools,
    pub cancels: CancelRegistry,
    pub clients: AtomicUsize,
    /// Seeds the fake SCRAM secrets shown to unknown users, so a probe cannot tell them apart.
    pub mock_key: [u8; 32],
    /// Turns for password key derivations on the blocking pool (one per core).
    pub derivations: Arc<tokio::sync::Semaphore>,
    /// Clients, counters, pause state and runtime limits.
    pub ops: Arc<Ops>,
    /// When the process started (SHOW MEM, metrics).
    pub started: Instant,
    /// Held while a reload or a console SET reads, changes and installs the configuration,
    /// so one cannot undo the other.
    reconfiguring: Mutex<()>,
    /// TLS, the hba rules, the login throttle and client caps.
    pub edge: Edge,
    /// The admission gate: tenants' budgets, slots and queues, and the plan cache.
    pub gatekeeper: Arc<Gatekeeper>,
    /// The last reading of each PostgreSQL server (under a policy).
    pub watch: crate::watch::Board,
    /// The fleet's leases as this instance last saw them (under a policy's `[fleet]`).
    pub fleet: crate::fleet::Board,
    /// The worker threads, and which serves each client.
    pub workers: Arc<Workers>,
}

impl Runtime {
    pub fn new(
        config: Config,
        userlist: HashMap<String, Secret>,
        governance: Option<Arc<Governance>>,
        (edge, gatekeeper, mut ops, workers): (Edge, Arc<Gatekeeper>, Ops, Workers),
    ) -> Arc<Self> {
        let mut mock_key = [0u8; 32];
        rand::thread_rng().fill_bytes(&mut mock_key);
        let tracked = Tracked::of(&config.settings);
        let workers = Arc::new(workers);
        configure_gate(&gatekeeper, governance.as_deref());
        // A table of statement statistics per worker thread.
        let max_rows = config.settings.max_statement_stats;
        ops.statements = crate::ops::StatementTables::new(workers.count(), max_rows);
        configure_anomalies(&ops, governance.as_deref());
        Arc::new(Runtime {
            config: Arc::new(ArcSwap::from_pointee(config)),
            userlist: ArcSwap::from_pointee(userlist),
            tracked: ArcSwap::from_pointee(tracked),
            governance: Arc::new(ArcSwap::from_pointee(governance)),
            pools: Pools::new(workers.clone()),
            cancels: CancelRegistry::default(),
            clients: AtomicUsize::new(0),
            mock_key,
            derivations: Arc::new(tokio::sync::Semaphore::new(
                std::thread::available_parallelism().map_or(2, |n| n.get()),
            )),
            ops: Arc::new(ops),
            started: Instant::now(),
            reconfiguring: Mutex::new(()),
            edge,
            gatekeeper,
            watch: crate::watch::Board::default(),
            fleet: crate::fleet::Board::default(),
            workers,
        })
    }

    /// An id for a new client, from the counter servers take theirs from too: as in
    /// PgBouncer, every socket has its own number.
    pub fn next_client_id(&self) -> u64 {
        self.pools.next_socket_id()
    }

    /// Re-reads the configuration file and the auth file. Everything is read and checked
    /// first; on any error nothing changes and the error (with file and line) is returned.
    /// Pools whose connection settings did not change keep their servers; a changed
    /// connection string or server TLS setup closes the old servers as they are released;
    /// new databases appear; the pools of removed databases drain. Runtime limits set from
    /// the console stay. The policy file is read again too. TLS that cannot be set up keeps
    /// the running TLS (both sides, modes and certificates) while the rest applies, as in
    /// PgBouncer; the answer says so.
    pub fn reload_parts(&self) -> Result<Reloaded, ReloadError> {
        let _one_at_a_time = lock(&self.reconfiguring);
        // logrotate moved the decision log and signalled: it is opened again even if the
        // files turn out broken (and then kept as it is).
        if let Err(e) = self.gatekeeper.decisions.reopen() {
            tracing::warn!("{e}");
        }
        if let Err(e) = self.ops.traffic.reopen() {
            tracing::warn!("{e}");
        }
        if let Some(Err(e)) = self.ops.logfile.as_ref().map(|l| l.reopen(None)) {
            tracing::warn!("{e}");
        }
        let path = self.config.load().path.clone();
        let mut config = crate::config::load(&path)?;
        let userlist = match &config.settings.auth_file {
            Some(p) => crate::config::load_userlist(p)?,
            None => HashMap::new(),
        };
        if let Some(old) = self.governance.load().as_ref() {
            // What learn mode recorded is kept before the policy is read again.
            old.save_allowlist();
        }
        let governance = Governance::load(&config.settings)?;
        // Every file is opened before anything changes: one that cannot be opened leaves
        // the running configuration, and both logs, as they were.
        let traffic = crate::ops::traffic::TrafficLog::prepare(
            governance.as_deref().and_then(|g| g.policy.traffic()),
        )
        .map_err(ReloadError::Log)?;
        open_decision_log(&self.gatekeeper, governance.as_deref()).map_err(ReloadError::Log)?;
        self.ops.traffic.install(traffic);
        lock(&self.ops.overrides).apply(&mut config);
        let mut warnings = config.warnings.clone();
        let edge = self.edge.reload(&config.settings);
        warnings.extend(edge.hba_kept);
        configure_gate(&self.gatekeeper, governance.as_deref());
        configure_anomalies(&self.ops, governance.as_deref());
        self.governance.store(Arc::new(governance));
        let new_log = config.settings.logfile.clone();
        if new_log != self.config.load().settings.logfile {
            // A changed logfile: the log goes there from now on (if it can be opened).
            if let Some(Err(e)) = self
                .ops
                .logfile
                .as_ref()
                .map(|l| l.reopen(new_log.as_deref()))
            {
                tracing::warn!("{e}");
            }
        }
        self.install(config, Some(userlist));
        Ok(Reloaded {
            warnings,
            tls_kept: edge.tls_kept,
        })
    }

    /// [`Runtime::reload_parts`], with why the TLS was kept (if it was) among the warnings.
    pub fn reload(&self) -> Result<Vec<String>, ReloadError> {
        let mut done = self.reload_parts()?;
        done.warnings.extend(done.tls_kept);
        Ok(done.warnings)
    }

    /// Makes `config` (and `userlist`, if given) the running configuration and brings every
    /// pool in line with it.
    pub fn install(&self, config: Config, userlist: Option<HashMap<String, Secret>>) {
        self.ops
            .statements
            .set_max_rows(config.settings.max_statement_stats);
        if let Some(level) = &self.ops.log_level {
            level.set(config.settings.verbose);
        }
        if let Some(syslog) = &self.ops.syslog {
            syslog.configure(&config.settings);
        }
        let old_config = self.config.load_full();
        let tracked = Arc::new(Tracked::of(&config.settings));
        let old_userlist = self.userlist.load_full();
        if let Some(u) = userlist {
            self.userlist.store(Arc::new(u));
        }
        let server_tls = ServerTls::clone(&self.edge.server_tls.load());
        for pool in self.pools.all() {
            let tls_changed = pool.settings().target.tls.source != server_tls.source;
            let db = config.database(&pool.key.db).filter(|db| {
                // A pool logs in as its key's user; a forced user that changed makes a new pool
                // (an auth_user's pool, where auth_query runs, is its own).
                db.user.as_deref().unwrap_or(&pool.key.user) == pool.key.user
                    || config.runs_auth_query_as(db, &pool.key.user)
            });
            let Some(db) = db else {
                // Removed: clients still on it finish, its servers close as they come back.
                pool.closing.retire();
                pool.close_idle("database removed");
                continue;
            };
            let reinstated = pool.closing.retired();
            if reinstated {
                pool.closing.reinstate();
            }
            let changed = tls_changed
                || reinstated
                || old_config
                    .database(&pool.key.db)
                    .is_none_or(|old| connection_changed(&old, &db));
            let settings = pool_settings_as(
                &config,
                &db,
                &pool.key.user,
                tracked.clone(),
                server_tls.clone(),
            );
            let user = settings.target.user.clone();
            let mut credential = self.server_credential(&db, &user);
            // SCRAM keys a client proved stay valid while the stored secret is the same.
            let kept = pool.credential();
            if matches!(credential, Credential::None)
                && matches!(kept, Credential::ScramKeys { .. })
                && old_userlist.get(&user) == self.userlist.load().get(&user)
            {
                credential = kept;
            }
            pool.reconfigure(settings, credential);
            if changed {
                tracing::info!(
                    "{}/{}: database configuration changed, its servers are replaced as they come back",
                    pool.key.db,
                    pool.key.user
                );
                // After the new settings are in place: every connect begun before this
                // instant (the old settings' among them) is replaced.
                pool.reconnect(Instant::now(), crate::pool::Renewal::Reload);
            }
        }
        self.tracked.store(tracked);
        self.config.store(Arc::new(config));
        crate::ops::overrides::enforce(&self.pools.all(), &self.ops.clients);
    }

    /// `SET key = value` on the console: a setting of the main section, applied at once.
    /// TLS that cannot be set up with the new value keeps running as it was (both sides,
    /// modes and certificates): the SET still succeeds, as in PgBouncer, and the answer
    /// (`Ok`) carries the notice saying why.
    pub fn set_setting(&self, key: &str, value: &str) -> Result<Vec<String>, String> {
        if Settings::requires_restart(key) {
            return Err(format!("parameter {key} can only be changed by a restart"));
        }
        let _one_at_a_time = lock(&self.reconfiguring);
        let mut config = Config::clone(&self.config.load());
        match config.settings.set(key, value)? {
            SetOutcome::Applied => {}
            SetOutcome::NotImplemented | SetOutcome::Unknown => {
                return Err(format!("unknown or unsupported parameter: {key}"))
            }
        }
        config.settings.validate()?;
        let edge = self.edge.reload(&config.settings);
        let mut notices: Vec<String> = edge.tls_kept.into_iter().collect();
        if let Some(e) = edge.hba_kept {
            // The hba file cannot be read: a SET of how clients log in changes nothing (the
            // running rules stay); any other SET goes ahead, and says so.
            let login = ["auth_type", "auth_hba_file", "auth_ident_file"];
            if login.contains(&key.to_ascii_lowercase().as_str()) {
                return Err(e);
            }
            notices.push(e);
        }
        self.install(config, None);
        Ok(notices)
    }

    /// `SET USER name = 'settings'` / `SET POOL user.db = 'settings'`: recorded, laid over the
    /// configuration, and enforced at once (evicting servers above the new limits).
    pub fn set_limits(&self, target: LimitTarget, settings: &str) -> Result<(), String> {
        let _one_at_a_time = lock(&self.reconfiguring);
        let mut config = Config::clone(&self.config.load());
        {
            let mut overrides = lock(&self.ops.overrides);
            let mut next = overrides.clone();
            match &target {
                LimitTarget::User(name) => next.set_user(name, settings).map(drop)?,
                LimitTarget::Pool(key) => next.set_pool(key, settings).map(drop)?,
            }
            next.apply(&mut config);
            *overrides = next;
        }
        self.install(config, None);
        Ok(())
    }

    /// Creates the pools of databases with a forced user and a min_pool_size, so that
    /// maintenance opens their servers before any client comes, as PgBouncer does.
    pub fn ensure_forced_pools(&self) {
        let config = self.config.load();
        for db in &config.databases {
            let min = db.min_pool_size.unwrap_or(config.settings.min_pool_size);
            if let (Some(user), true) = (&db.user, min > 0) {
                self.pool_for(db, user);
            }
        }
    }

    /// The pool serving `user` on database entry `db`, created on first use.
    pub fn pool_for(&self, db: &DatabaseDef, user: &str) -> Arc<Pool> {
        // A database with a forced user has one pool, whoever logs in, as in PgBouncer.
        self.pool_as(db, db.user.as_deref().unwrap_or(user))
    }

    /// The pool of database entry `db` whose servers log in as `server_user` (whatever user
    /// the entry forces: auth_query runs as `auth_user`, as in PgBouncer), created on first
    /// use.
    pub fn pool_as(&self, db: &DatabaseDef, server_user: &str) -> Arc<Pool> {
        let config = self.config.load();
        let server_user = server_user.to_string();
        let user = &server_user;
        let key = PoolKey {
            db: db.name.clone(),
            user: server_user.clone(),
        };
        let credential = self.server_credential(db, &server_user);
        self.pools.get_or_create(
            &key,
            || {
                if config.own_entry(&db.name).is_none() {
                    // PgBouncer's words for a name served by the `*` entry.
                    tracing::info!(user = %key.user, "registered new auto-database: {}", db.name);
                }
                let server_tls = ServerTls::clone(&self.edge.server_tls.load());
                pool_settings_as(&config, db, user, self.tracked.load_full(), server_tls)
            },
            credential,
        )
    }

    /// What pgward proves to the server for `server_user`: the connection string's password
    /// (for the user it names, if it names one), else the auth file's secret.
    fn server_credential(&self, db: &DatabaseDef, server_user: &str) -> Credential {
        let its_user = db.user.as_deref().is_none_or(|u| u == server_user);
        if let (Some(p), true) = (&db.password, its_user) {
            return Credential::Password(p.clone());
        }
        match self.userlist.load().get(server_user) {
            Some(Secret::Plain(p)) => Credential::Password(p.clone()),
            Some(Secret::Md5(s)) => Credential::Md5Secret(s.clone()),
            _ => Credential::None,
        }
    }
}

/// Builds the settings of the pool serving `user` on `db` from the configuration: with a
/// forced user, that user's settings apply, not those of whoever logged in.
pub fn pool_settings(
    config: &Config,
    db: &DatabaseDef,
    user: &str,
    tracked: Arc<Tracked>,
    server_tls: ServerTls,
) -> PoolSettings {
    let server_user = db.user.as_deref().unwrap_or(user);
    pool_settings_as(config, db, server_user, tracked, server_tls)
}

/// Builds the settings of a pool of `db` whose servers log in as `server_user`.
pub fn pool_settings_as(
    config: &Config,
    db: &DatabaseDef,
    server_user: &str,
    tracked: Arc<Tracked>,
    server_tls: ServerTls,
) -> PoolSettings {
    let s = &config.settings;
    let server_user = server_user.to_string();
    let user = server_user.as_str();
    let pool_size = config.pool_size_for(db, user) as usize;
    let user_def = config.user(user);
    let limits = Limits {
        pool_size,
        min_pool_size: db.min_pool_size.unwrap_or(s.min_pool_size) as usize,
        // The server user's [users] value, else the database's, else the global one.
        reserve_pool_size: user_def
            .and_then(|u| u.reserve_pool_size)
            .or(db.reserve_pool)
            .unwrap_or(s.reserve_pool_size) as usize,
        reserve_pool_timeout: s.reserve_pool_timeout,
        max_db_connections: own_cap(db.max_db_connections).unwrap_or(s.max_db_connections) as usize,
        max_user_connections: own_cap(user_def.and_then(|u| u.max_user_connections))
            .unwrap_or(s.max_user_connections) as usize,
    };
    PoolSettings {
        target: ServerTarget {
            keepalive: crate::net::Keepalive::of(s),
            log: s.log_lines(),
            ..server_target(db, server_user.clone(), server_tls, &s.unix_socket_dir)
        },
        limits,
        mode: config.pool_mode_for(db, user),
        connect_timeout: s.server_connect_timeout.unwrap_or(Duration::from_secs(15)),
        query_wait: match user_def
            .and_then(|u| u.query_wait_timeout)
            .or(db.query_wait_timeout)
        {
            Some(d) if d.is_zero() => None,
            Some(d) => Some(d),
            None => s.query_wait_timeout,
        },
        // The server user's own query_timeout when it sets one, as a session takes it.
        query_timeout: user_def
            .and_then(|u| u.query_timeout)
            .filter(|t| !t.is_zero())
            .or(s.query_timeout),
        login_retry: s.server_login_retry,
        lifetime: Some(db.server_lifetime_or(s.server_lifetime)),
        idle_timeout: s.server_idle_timeout,
        check_delay: Some(s.server_check_delay),
        check_query: match s.server_check() {
            ServerCheck::Disabled => None,
            ServerCheck::EmptyQuery => Some(String::new()),
            ServerCheck::Query(q) => Some(q.to_string()),
        },
        reset_query: non_empty(&s.server_reset_query),
        reset_always: s.server_reset_query_always,
        round_robin: s.server_round_robin,
        tracked,
        max_message: (s.max_packet_size as usize).min(crate::wire::DEFAULT_MAX_MESSAGE_LEN),
    }
}

/// One `host` entry: a TCP host, or a Unix socket directory (a path, a name in the abstract
/// namespace after `@`, or nothing for `unix_socket_dir`, `socket_dir`, as PgBouncer reads it).
pub fn server_addr(host: String, port: u16, socket_dir: &str) -> ServerAddr {
    if host.is_empty() || host.starts_with('/') || crate::net::is_abstract(&host) {
        let dir = if host.is_empty() {
            socket_dir.to_string()
        } else {
            host
        };
        ServerAddr::Unix { dir, port }
    } else {
        ServerAddr::Tcp { host, port }
    }
}

fn server_target(
    db: &DatabaseDef,
    server_user: String,
    tls: ServerTls,
    socket_dir: &str,
) -> ServerTarget {
    let addrs = match db.hosts.is_empty() {
        true => vec![server_addr(String::new(), db.port, socket_dir)],
        false => db
            .hosts
            .iter()
            .map(|host| server_addr(host.clone(), db.port, socket_dir))
            .collect(),
    };
    let round_robin =
        db.load_balance_hosts == crate::config::databases::LoadBalanceHosts::RoundRobin;
    let mut startup_params = Vec::new();
    for (name, value) in [
        ("client_encoding", &db.client_encoding),
        ("DateStyle", &db.datestyle),
        ("TimeZone", &db.timezone),
        ("application_name", &db.application_name),
    ] {
        if let Some(v) = value {
            startup_params.push((name.to_string(), v.clone()));
        }
    }
    ServerTarget {
        hosts: Arc::new(crate::server::Hosts::new(addrs, round_robin)),
        database: db.dbname.clone().unwrap_or_else(|| db.name.clone()),
        user: server_user,
        startup_params,
        connect_query: db.connect_query.clone(),
        tls,
        keepalive: crate::net::Keepalive::default(),
        log: crate::config::LogLines::default(),
    }
}

fn non_empty(s: &str) -> Option<String> {
    let t = s.trim();
    (!t.is_empty()).then(|| t.to_string())
}

/// What a runtime limit applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LimitTarget {
    /// Every pool of this user.
    User(String),
    /// One pool, `user.db`.
    Pool(String),
}

/// Whether a database entry now points pgward's servers somewhere else (or logs in
/// differently), so that servers opened under the old entry must go.
fn connection_changed(old: &DatabaseDef, new: &DatabaseDef) -> bool {
    (
        &old.hosts,
        old.load_balance_hosts,
        old.port,
        &old.dbname,
        &old.user,
        &old.password,
        &old.connect_query,
    ) != (
        &new.hosts,
        new.load_balance_hosts,
        new.port,
        &new.dbname,
        &new.user,
        &new.password,
        &new.connect_query,
    ) || (
        &old.client_encoding,
        &old.datestyle,
        &old.timezone,
        &old.application_name,
    ) != (
        &new.client_encoding,
        &new.datestyle,
        &new.timezone,
        &new.application_name,
    )
}

/// Hands the gate the policy's `[gate]` settings and tenants; without a policy, defaults.
/// Opens the decision log `governance` names (again, if it is the one open: logrotate
/// signals after moving it), or closes it. One that cannot be opened changes nothing and
/// says why.
pub fn open_decision_log(
    keeper: &Gatekeeper,
    governance: Option<&Governance>,
) -> Result<(), String> {
    let decisions = governance.map(|g| g.policy.decisions().clone());
    let decisions = decisions.unwrap_or_default();
    keeper
        .decisions
        .open(decisions.file.as_deref(), decisions.max_per_second)
}

/// Opens the traffic log `governance` names (again, if it is the one open), or closes it.
pub fn open_traffic_log(ops: &Ops, governance: Option<&Governance>) -> Result<(), String> {
    ops.traffic
        .open(governance.and_then(|g| g.policy.traffic()))
}

/// Applies the policy to the gate (its decision log opened already).
fn configure_gate(keeper: &Gatekeeper, governance: Option<&Governance>) {
    let log = governance.is_some_and(|g| g.policy.decisions().file.is_some());
    match governance {
        Some(g) => keeper.configure(
            GateSettings {
                log,
                ..g.policy.gate().settings
            },
            g.policy.tenant_configs(),
            g.policy.fleet().is_some(),
        ),
        None => keeper.configure(
            crate::policy::GatePolicy::default().settings,
            std::iter::empty(),
            false,
        ),
    }
}

/// Hands the judge of unusual minutes the policy's `[anomalies]` settings.
fn configure_anomalies(ops: &Ops, governance: Option<&Governance>) {
    let settings = governance.map(|g| g.policy.anomalies()).unwrap_or_default();
    lock(&ops.anomalies).set_settings(settings);
}

impl crate::fleet::Fleeted for Runtime {
    fn fleet_policy(&self) -> Option<crate::policy::FleetPolicy> {
        let governance = self.governance.load();
        governance.as_ref().as_ref()?.policy.fleet().cloned()
    }

    fn peer_id(&self) -> u32 {
        self.config.load().settings.peer_id
    }

    fn store_pool(&self, policy: &crate::policy::FleetPolicy) -> Result<Arc<Pool>, String> {
        let db = self.config.load().database(&policy.store).ok_or_else(|| {
            format!(
                "[fleet] store: no database {:?} in the configuration",
                policy.store
            )
        })?;
        let user = policy
            .user
            .clone()
            .or_else(|| db.user.clone())
            .ok_or_else(|| {
                format!(
                    "[fleet] user: database {:?} has no forced user; name the store's login",
                    policy.store
                )
            })?;
        Ok(self.pool_for(&db, &user))
    }

    fn gatekeeper(&self) -> &Gatekeeper {
        &self.gatekeeper
    }

    fn tracked(&self) -> Arc<Tracked> {
        self.tracked.load_full()
    }

    fn fleet_board(&self) -> &crate::fleet::Board {
        &self.fleet
    }
}

impl crate::watch::Watched for Runtime {
    fn watch_policy(&self) -> Option<crate::policy::WatchPolicy> {
        self.governance
            .load()
            .as_ref()
            .as_ref()
            .map(|g| g.policy.gate().watch)
    }

    fn pools(&self) -> Vec<Arc<Pool>> {
        self.pools.all()
    }

    fn cancels(&self) -> &CancelRegistry {
        &self.cancels
    }

    fn board(&self) -> &crate::watch::Board {
        &self.watch
    }

    fn move_charge(&self, from: &str, to: &str, seconds: f64) {
        self.gatekeeper
            .lock()
            .move_charge(from, to, seconds, Instant::now());
        // The refund may let the waiter's tenant's waiting tickets go sooner.
        self.gatekeeper.wake();
    }

    fn note_lock_waits(&self, upstream: &str, n: usize) {
        self.gatekeeper.note_lock_waits(upstream, n);
        self.ops.statements.note_lock_waits(n);
    }

    fn decisions(&self) -> &crate::gate::DecisionLog {
        &self.gatekeeper.decisions
    }

    fn add_server_statements(&self, changes: Vec<crate::watch::server_stats::Delta>) {
        let changes: Vec<_> = changes
            .iter()
            .map(|c| (c.fingerprint, &*c.role, &*c.database, &c.counters))
            .collect();
        self.ops.statements.add_server(&changes);
    }

    fn cap_tenant(&self, tenant: &str, on: bool) {
        self.gatekeeper
            .lock()
            .cap_tenant(tenant, on, Instant::now());
        // A lifted cap may let waiting tickets run now.
        self.gatekeeper.wake();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn settings_of(ini: &str, db: &str, user: &str) -> PoolSettings {
        let config = crate::config::parse_str(ini, "t.ini", Path::new(".")).unwrap();
        let def = config.database(db).unwrap();
        let tracked = Arc::new(Tracked::of(&config.settings));
        pool_settings(&config, &def, user, tracked, ServerTls::disabled())
    }

    #[test]
    fn reserve_pool_size_from_the_server_user_then_the_database_then_global() {
        let ini = "[databases]\nd = host=h reserve_pool=3\nforced = host=h user=owner\n\
                   [users]\nalice = reserve_pool_size=5\nowner = reserve_pool_size=7\n\
                   [pgbouncer]\nreserve_pool_size = 1\n";
        assert_eq!(settings_of(ini, "d", "alice").limits.reserve_pool_size, 5);
        assert_eq!(settings_of(ini, "d", "bob").limits.reserve_pool_size, 3);
        assert_eq!(
            settings_of(ini, "forced", "alice").limits.reserve_pool_size,
            7
        );
        let ini = "[databases]\nd = host=h\n[pgbouncer]\nreserve_pool_size = 1\n";
        assert_eq!(settings_of(ini, "d", "bob").limits.reserve_pool_size, 1);
    }
}
