//! SHOW CLIENTS, SHOW SERVERS, SHOW SOCKETS and SHOW ACTIVE_SOCKETS: one row per connection.

use std::time::Instant;

use super::result::format_time;
use super::result::{Cell, Table, Ty};
use crate::ops::{clients::wall_clock, ClientEntry, ClientInfo, ClientState};
use crate::runtime::Runtime;
use crate::server::ServerAddr;

/// PgBouncer's socket columns; SOCKETS adds buffer columns after them.
const SOCKET: &[(&str, Ty)] = &[
    ("type", Ty::Text),
    ("user", Ty::Text),
    ("database", Ty::Text),
    ("replication", Ty::Text),
    ("state", Ty::Text),
    ("addr", Ty::Text),
    ("port", Ty::Int4),
    ("local_addr", Ty::Text),
    ("local_port", Ty::Int4),
    ("connect_time", Ty::Text),
    ("request_time", Ty::Text),
    ("wait", Ty::Int4),
    ("wait_us", Ty::Int4),
    ("close_needed", Ty::Int4),
    ("ptr", Ty::Text),
    ("link", Ty::Text),
    ("remote_pid", Ty::Int4),
    ("tls", Ty::Text),
    ("application_name", Ty::Text),
    ("prepared_statements", Ty::Int4),
    ("id", Ty::Int4),
];

/// Buffer columns SOCKETS adds; pgward has no such buffers and shows NULL.
const DEBUG_EXTRA: [&str; 7] = [
    "recv_pos",
    "pkt_pos",
    "pkt_remain",
    "send_pos",
    "send_remain",
    "pkt_avail",
    "send_avail",
];

const fn socket_debug() -> [(&'static str, Ty); 28] {
    let mut out = [("", Ty::Int4); 28];
    let mut i = 0;
    while i < SOCKET.len() {
        out[i] = SOCKET[i];
        i += 1;
    }
    while i < 28 {
        out[i].0 = DEBUG_EXTRA[i - SOCKET.len()];
        i += 1;
    }
    out
}

const SOCKET_DEBUG: &[(&str, Ty)] = &socket_debug();

/// Pointers are opaque in PgBouncer; pgward shows ids, servers marked apart from clients.
fn client_ptr(id: u64) -> String {
    format!("c{id:x}")
}

fn server_ptr(id: u64) -> String {
    format!("s{id:x}")
}

fn client_row(c: &ClientEntry, i: &ClientInfo, now: Instant) -> Vec<Cell> {
    let wait = i
        .wait_since
        .map_or(0, |t| now.saturating_duration_since(t).as_micros());
    vec![
        "C".into(),
        i.user.clone().into(),
        i.database.clone().into(),
        "none".into(),
        i.state.as_str().into(),
        c.addr.clone().into(),
        c.port.into(),
        c.local_addr.clone().into(),
        c.local_port.into(),
        format_time(c.connect_time),
        format_time(i.request_time),
        u64::try_from(wait / 1_000_000).unwrap_or(u64::MAX).into(),
        u64::try_from(wait % 1_000_000).unwrap_or(0).into(),
        0u32.into(),
        client_ptr(c.id).into(),
        i.server.as_ref().map(|s| server_ptr(s.id)).into(),
        0u32.into(),
        "".into(),
        i.application_name.clone().into(),
        0u32.into(),
        c.id.into(),
    ]
}

pub fn clients(rt: &Runtime) -> Table {
    let mut t = Table::new(SOCKET);
    let now = Instant::now();
    for c in rt.ops.clients.all() {
        let i = c.info();
        if i.state != ClientState::Login {
            t.push(client_row(&c, &i, now));
        }
    }
    t
}

/// One server row, described by its fields.
struct ServerRow<'a> {
    id: u64,
    pid: u32,
    user: &'a str,
    database: &'a str,
    state: &'a str,
    addr: &'a ServerAddr,
    created: Instant,
    used: Instant,
    close_needed: bool,
    client: Option<(u64, &'a str)>,
}

fn server_row(s: &ServerRow<'_>) -> Vec<Cell> {
    let (host, port) = match s.addr {
        ServerAddr::Tcp { host, port } => (host.clone(), *port),
        ServerAddr::Unix { port, .. } => ("unix".to_string(), *port),
    };
    vec![
        "S".into(),
        s.user.into(),
        s.database.into(),
        "none".into(),
        s.state.into(),
        host.into(),
        port.into(),
        Cell::Null,
        0u32.into(),
        format_time(wall_clock(s.created)),
        format_time(wall_clock(s.used)),
        0u32.into(),
        0u32.into(),
        s.close_needed.into(),
        server_ptr(s.id).into(),
        s.client.map(|(id, _)| client_ptr(id)).into(),
        s.pid.into(),
        "".into(),
        s.client.map_or("", |(_, app)| app).into(),
        0u32.into(),
        s.id.into(),
    ]
}

/// Servers in use (from their clients), then idle ones, then those being opened are counted
/// only in SHOW POOLS.
pub fn servers(rt: &Runtime) -> Table {
    let mut t = Table::new(SOCKET);
    for row in server_rows(rt) {
        t.push(row);
    }
    t
}

fn server_rows(rt: &Runtime) -> Vec<Vec<Cell>> {
    let mut rows = Vec::new();
    let pools = rt.pools.all();
    for c in rt.ops.clients.all() {
        let i = c.info();
        let Some(link) = &i.server else { continue };
        let pool = pools
            .iter()
            .find(|p| p.key.db == i.database && p.key.user == i.pool_user);
        let Some(pool) = pool else { continue };
        let settings = pool.settings();
        rows.push(server_row(&ServerRow {
            id: link.id,
            pid: link.pid,
            user: &settings.target.user,
            database: &pool.key.db,
            state: "active",
            addr: &link.addr,
            created: link.created,
            used: link.created,
            close_needed: pool.closing.close_needed(link.id, link.created),
            client: Some((c.id, &i.application_name)),
        }));
    }
    let now = Instant::now();
    for pool in &pools {
        let settings = pool.settings();
        let idle = pool.idle_servers().into_iter().map(|s| {
            let used = settings
                .check_delay
                .is_some_and(|d| now.saturating_duration_since(s.last_used) >= d);
            (s, if used { "used" } else { "idle" })
        });
        let tested = pool.tested_servers().into_iter().map(|s| (s, "tested"));
        for (s, state) in idle.chain(tested) {
            rows.push(server_row(&ServerRow {
                id: s.id,
                pid: s.pid,
                user: &settings.target.user,
                database: &pool.key.db,
                state,
                addr: &s.addr,
                created: s.created,
                used: s.last_used,
                close_needed: pool.closing.close_needed(s.id, s.created),
                client: None,
            }));
        }
    }
    rows
}

pub fn sockets(rt: &Runtime, active_only: bool) -> Table {
    let mut t = Table::new(SOCKET_DEBUG);
    let now = Instant::now();
    for c in rt.ops.clients.all() {
        let i = c.info();
        if active_only && i.state != ClientState::Active {
            continue;
        }
        t.push(client_row(&c, &i, now));
    }
    for row in server_rows(rt) {
        if active_only && row.get(4) != Some(&Cell::from("active")) {
            continue;
        }
        t.push(row);
    }
    t
}
