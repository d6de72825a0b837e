//! SHOW DATABASES, SHOW POOLS and SHOW USERS.

use std::collections::{BTreeSet, HashMap};
use std::time::Instant;

use super::result::{Cell, Table, Ty};
use crate::config::databases::own_cap;
use crate::config::{Config, DatabaseDef, LoadBalanceHosts};
use crate::ops::{ClientInfo, ClientState};
use crate::runtime::Runtime;

/// Servers of a pool: idle, in use and being opened.
pub fn server_total(pool: &crate::pool::Pool) -> usize {
    let s = pool.stats();
    s.idle + s.active + s.connecting
}

/// Every client's info (registry snapshot).
fn client_infos(rt: &Runtime) -> Vec<ClientInfo> {
    rt.ops.clients.all().iter().map(|c| c.info()).collect()
}

fn load_balance(db: &DatabaseDef) -> Cell {
    if db.hosts.len() < 2 {
        return Cell::Null;
    }
    match db.load_balance_hosts {
        LoadBalanceHosts::RoundRobin => "round-robin".into(),
        LoadBalanceHosts::Disable => "disable".into(),
    }
}

const DATABASES: &[(&str, Ty)] = &[
    ("name", Ty::Text),
    ("host", Ty::Text),
    ("port", Ty::Int4),
    ("database", Ty::Text),
    ("force_user", Ty::Text),
    ("pool_size", Ty::Int4),
    ("min_pool_size", Ty::Int4),
    ("reserve_pool_size", Ty::Int4),
    ("server_lifetime", Ty::Int4),
    ("pool_mode", Ty::Text),
    ("load_balance_hosts", Ty::Text),
    ("max_connections", Ty::Int4),
    ("current_connections", Ty::Int4),
    ("max_client_connections", Ty::Int4),
    ("current_client_connections", Ty::Int4),
    ("paused", Ty::Int4),
    ("disabled", Ty::Int4),
];

/// The databases to list: the configured ones, then those made from `*` that have pools.
fn database_defs(rt: &Runtime, config: &Config) -> Vec<DatabaseDef> {
    let mut defs = config.databases.clone();
    let mut names: BTreeSet<String> = defs.iter().map(|d| d.name.clone()).collect();
    for pool in rt.pools.all() {
        if names.insert(pool.key.db.clone()) {
            if let Some(db) = config.database(&pool.key.db) {
                defs.push(db);
            }
        }
    }
    defs
}

pub fn databases(rt: &Runtime) -> Table {
    let mut t = Table::new(DATABASES);
    let config = rt.config.load();
    let s = &config.settings;
    let state = rt.ops.control.get();
    let infos = client_infos(rt);
    let pools = rt.pools.all();
    for db in database_defs(rt, &config) {
        let servers: usize = pools
            .iter()
            .filter(|p| p.key.db == db.name)
            .map(|p| server_total(p))
            .sum();
        let clients = infos.iter().filter(|i| i.database == db.name).count();
        t.push(vec![
            db.name.clone().into(),
            // A host list whole, as PgBouncer shows it.
            db.host.as_ref().map(|_| db.hosts.join(",")).into(),
            db.port.into(),
            db.dbname.clone().unwrap_or_else(|| db.name.clone()).into(),
            db.user.clone().into(),
            db.pool_size.unwrap_or(s.default_pool_size).into(),
            db.min_pool_size.unwrap_or(s.min_pool_size).into(),
            db.reserve_pool.unwrap_or(s.reserve_pool_size).into(),
            db.server_lifetime_or(s.server_lifetime).as_secs().into(),
            db.pool_mode.map(|m| m.as_str().to_string()).into(),
            load_balance(&db),
            own_cap(db.max_db_connections)
                .unwrap_or(s.max_db_connections)
                .into(),
            servers.into(),
            own_cap(db.max_db_client_connections)
                .unwrap_or(s.max_db_client_connections)
                .into(),
            clients.into(),
            state.is_paused(&db.name).into(),
            state.is_disabled(&db.name).into(),
        ]);
    }
    let console_clients = infos.iter().filter(|i| i.admin).count();
    t.push(vec![
        "pgbouncer".into(),
        Cell::Null,
        s.listen_port.into(),
        "pgbouncer".into(),
        "pgbouncer".into(),
        2u32.into(),
        0u32.into(),
        0u32.into(),
        0u32.into(),
        "statement".into(),
        Cell::Null,
        0u32.into(),
        0u32.into(),
        s.max_db_client_connections.into(),
        console_clients.into(),
        0u32.into(),
        0u32.into(),
    ]);
    t
}

const POOLS: &[(&str, Ty)] = &[
    ("database", Ty::Text),
    ("user", Ty::Text),
    ("cl_active", Ty::Int4),
    ("cl_waiting", Ty::Int4),
    ("cl_active_cancel_req", Ty::Int4),
    ("cl_waiting_cancel_req", Ty::Int4),
    ("sv_active", Ty::Int4),
    ("sv_active_cancel", Ty::Int4),
    ("sv_being_canceled", Ty::Int4),
    ("sv_idle", Ty::Int4),
    ("sv_used", Ty::Int4),
    ("sv_tested", Ty::Int4),
    ("sv_login", Ty::Int4),
    ("maxwait", Ty::Int4),
    ("maxwait_us", Ty::Int4),
    ("pool_mode", Ty::Text),
    ("load_balance_hosts", Ty::Text),
    // pgward's own, after PgBouncer's columns: the limits in force.
    ("pool_size", Ty::Int4),
    ("max_user_connections", Ty::Int4),
];

/// Clients of one pool: (logged in and not waiting, waiting, longest wait in µs).
fn pool_clients(infos: &[ClientInfo], db: &str, user: &str, now: Instant) -> (usize, usize, u128) {
    let mut active = 0;
    let mut waiting = 0;
    let mut max_wait = 0;
    for i in infos
        .iter()
        .filter(|i| i.database == db && i.pool_user == user)
    {
        match i.state {
            ClientState::Waiting => {
                waiting += 1;
                let w = i
                    .wait_since
                    .map_or(0, |t| now.saturating_duration_since(t).as_micros());
                max_wait = max_wait.max(w);
            }
            ClientState::Idle | ClientState::Active => active += 1,
            ClientState::Login => {}
        }
    }
    (active, waiting, max_wait)
}

pub fn pools(rt: &Runtime) -> Table {
    let mut t = Table::new(POOLS);
    let config = rt.config.load();
    let infos = client_infos(rt);
    let now = Instant::now();
    for pool in rt.pools.all() {
        let settings = pool.settings();
        let st = pool.stats();
        let check_delay = settings.check_delay;
        let used = pool
            .idle_servers()
            .iter()
            .filter(|s| {
                check_delay.is_some_and(|d| now.saturating_duration_since(s.last_used) >= d)
            })
            .count();
        let (active, waiting, max_wait) = pool_clients(&infos, &pool.key.db, &pool.key.user, now);
        let lb = config
            .database(&pool.key.db)
            .map_or(Cell::Null, |d| load_balance(&d));
        t.push(vec![
            pool.key.db.clone().into(),
            pool.key.user.clone().into(),
            active.into(),
            waiting.into(),
            0u32.into(),
            0u32.into(),
            st.active.saturating_sub(st.tested).into(),
            0u32.into(),
            0u32.into(),
            st.idle.saturating_sub(used).into(),
            used.into(),
            st.tested.into(),
            st.connecting.into(),
            u64::try_from(max_wait / 1_000_000)
                .unwrap_or(u64::MAX)
                .into(),
            u64::try_from(max_wait % 1_000_000).unwrap_or(0).into(),
            settings.mode.as_str().into(),
            lb,
            settings.limits.pool_size.into(),
            settings.limits.max_user_connections.into(),
        ]);
    }
    let console = infos.iter().filter(|i| i.admin).count();
    t.push(vec![
        "pgbouncer".into(),
        "pgbouncer".into(),
        console.into(),
        0u32.into(),
        0u32.into(),
        0u32.into(),
        0u32.into(),
        0u32.into(),
        0u32.into(),
        0u32.into(),
        0u32.into(),
        0u32.into(),
        0u32.into(),
        0u32.into(),
        0u32.into(),
        "statement".into(),
        Cell::Null,
    ]);
    t
}

/// Users SHOW USERS lists: `[users]` entries first, then the auth file's and pool users.
pub fn user_names(rt: &Runtime) -> Vec<String> {
    let config = rt.config.load();
    let mut names: Vec<String> = config.users.iter().map(|u| u.name.clone()).collect();
    let mut others: BTreeSet<String> = rt.userlist.load().keys().cloned().collect();
    for pool in rt.pools.all() {
        others.insert(pool.key.user.clone());
        others.insert(pool.settings().target.user.clone());
    }
    others.retain(|n| !names.contains(n));
    names.extend(others);
    names
}

const USERS: &[(&str, Ty)] = &[
    ("name", Ty::Text),
    ("pool_size", Ty::Text),
    ("reserve_pool_size", Ty::Text),
    ("pool_mode", Ty::Text),
    ("max_user_connections", Ty::Int4),
    ("current_connections", Ty::Int4),
    ("max_user_client_connections", Ty::Int4),
    ("current_client_connections", Ty::Int4),
];

pub fn users(rt: &Runtime) -> Table {
    let mut t = Table::new(USERS);
    let config = rt.config.load();
    let s = &config.settings;
    let mut servers: HashMap<String, usize> = HashMap::new();
    for pool in rt.pools.all() {
        *servers
            .entry(pool.settings().target.user.clone())
            .or_default() += server_total(&pool);
    }
    let infos = client_infos(rt);
    let padded = |n: Option<u32>| n.map_or_else(String::new, |n| format!("{n:9}"));
    for name in user_names(rt) {
        let def = config.user(&name);
        t.push(vec![
            name.clone().into(),
            padded(def.and_then(|u| u.pool_size)).into(),
            padded(def.and_then(|u| u.reserve_pool_size)).into(),
            def.and_then(|u| u.pool_mode)
                .map(|m| m.as_str().to_string())
                .into(),
            own_cap(def.and_then(|u| u.max_user_connections))
                .unwrap_or(s.max_user_connections)
                .into(),
            servers.get(&name).copied().unwrap_or(0).into(),
            own_cap(def.and_then(|u| u.max_user_client_connections))
                .unwrap_or(s.max_user_client_connections)
                .into(),
            infos.iter().filter(|i| i.user == name).count().into(),
        ]);
    }
    t
}
