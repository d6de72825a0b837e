//! SHOW dispatch and the small SHOW commands: HELP, VERSION, CONFIG, STATE, LISTS, MEM, PEERS,
//! PEER_POOLS, DNS_HOSTS, DNS_ZONES. The gate's SHOWs are in `show_gate`.

use std::sync::Arc;

use bytes::BytesMut;

use super::result::{Table, Ty};
use super::show_objects::server_total;
use super::{show_gate, show_objects, show_sockets, show_stats, AdminError};
use crate::config::Settings;
use crate::runtime::Runtime;
use crate::wire::{self, ErrorResponse, Severity};

pub fn show(rt: &Arc<Runtime>, what: &str, out: &mut BytesMut) -> Result<(), AdminError> {
    if what == "help" {
        help(out);
        return Ok(());
    }
    if let Some((columns, value)) = fake_param(what) {
        let mut table = Table::new(columns);
        table.push(vec![value.into()]);
        table.encode(out);
        return Ok(());
    }
    let table = match what {
        "version" => version(),
        "config" => config(rt),
        "state" => state(rt),
        "lists" => lists(rt),
        "mem" => mem(rt),
        "peers" => peers(rt),
        "peer_pools" => Table::new(PEER_POOLS),
        "dns_hosts" => Table::new(DNS_HOSTS),
        "dns_zones" => Table::new(DNS_ZONES),
        "databases" => show_objects::databases(rt),
        "pools" => show_objects::pools(rt),
        "users" => show_objects::users(rt),
        "clients" => show_sockets::clients(rt),
        "servers" => show_sockets::servers(rt),
        "sockets" | "active_sockets" => show_sockets::sockets(rt, what == "active_sockets"),
        "stats" => show_stats::stats(rt),
        "stats_totals" => show_stats::totals(rt),
        "stats_averages" => show_stats::averages(rt),
        "totals" => show_stats::overall(rt),
        "tenants" => show_gate::tenants(rt),
        "kills" => show_gate::kills(rt),
        "lanes" => show_gate::lanes(rt),
        "plans" | "plan_cache" => show_gate::plans(rt),
        "calibration" => show_gate::calibration(rt),
        "flips" => show_gate::flips(rt),
        "readings" => show_gate::readings(rt),
        "activity" => show_gate::activity(rt),
        "anomalies" => show_gate::anomalies(rt),
        "fleet" => super::show_fleet::fleet(rt),
        other => {
            return Err(AdminError::protocol(format!(
                "invalid command 'SHOW {other}', use SHOW HELP;"
            )))
        }
    };
    table.encode(out);
    Ok(())
}

/// The session parameters client libraries set or read on connecting, which the console
/// answers with fixed values as PgBouncer does (a SET of one is ignored): the one column of
/// its SHOW, and its value.
const FAKE_PARAMS: &[(&[(&str, Ty)], &str)] = &[
    (&[("client_encoding", Ty::Text)], "UTF-8"),
    (
        &[("default_transaction_isolation", Ty::Text)],
        "read committed",
    ),
    (&[("standard_conforming_strings", Ty::Text)], "on"),
    (&[("datestyle", Ty::Text)], "ISO"),
    (&[("timezone", Ty::Text)], "GMT"),
];

/// The fixed answer for the session parameter `name` (any case), if the console fakes it.
pub fn fake_param(name: &str) -> Option<(&'static [(&'static str, Ty)], &'static str)> {
    FAKE_PARAMS
        .iter()
        .find(|(columns, _)| columns[0].0.eq_ignore_ascii_case(name))
        .copied()
}

/// The version string, the same as the first line of `pgward --version`.
pub fn version_string() -> String {
    format!("pgward {}", env!("CARGO_PKG_VERSION"))
}

const HELP: &str = "\n\tSHOW HELP|CONFIG|DATABASES|POOLS|CLIENTS|SERVERS|USERS|VERSION\n\
\tSHOW PEERS|PEER_POOLS\n\
\tSHOW SOCKETS|ACTIVE_SOCKETS|LISTS|MEM|STATE\n\
\tSHOW DNS_HOSTS|DNS_ZONES\n\
\tSHOW STATS|STATS_TOTALS|STATS_AVERAGES|TOTALS\n\
\tSHOW TENANTS|KILLS|PLANS|LANES|READINGS|ACTIVITY|ANOMALIES|FLEET\n\
\tSHOW STATEMENTS [n] [FOR tenant]\n\
\tSET key = arg\n\
\tSET USER name = 'max_user_connections=N pool_size=N pool_mode=M'\n\
\tSET POOL user.db = 'pool_size=N'\n\
\tSET TENANT name = 'rate=N burst=N max_active=N priority=P ...'\n\
\tRELOAD\n\
\tPAUSE [<db>]\n\
\tRESUME [<db>]\n\
\tDISABLE <db>\n\
\tENABLE <db>\n\
\tRECONNECT [<db>]\n\
\tKILL [<db>]\n\
\tKILL_CLIENT <client_id>\n\
\tKILL TENANT <name> FOR '<duration>' [SOFT]\n\
\tKILL STATEMENT <fingerprint> FOR '<duration>' [SOFT]\n\
\tUNKILL TENANT <name>\n\
\tUNKILL STATEMENT <fingerprint>\n\
\tSUSPEND\n\
\tSHUTDOWN\n\
\tSHUTDOWN WAIT_FOR_SERVERS|WAIT_FOR_CLIENTS\n\
\tWAIT_CLOSE [<db>]";

fn help(out: &mut BytesMut) {
    let notice = ErrorResponse::new(Severity::Notice, "00000", "Console usage").with_detail(HELP);
    wire::encode_notice(out, &notice);
    wire::encode_command_complete(out, "SHOW");
}

fn version() -> Table {
    const COLS: &[(&str, Ty)] = &[("version", Ty::Text)];
    let mut t = Table::new(COLS);
    t.push(vec![version_string().into()]);
    t
}

fn state(rt: &Runtime) -> Table {
    const COLS: &[(&str, Ty)] = &[("key", Ty::Text), ("value", Ty::Text)];
    let mut t = Table::new(COLS);
    for (key, on) in rt.ops.control.get().state_rows() {
        t.push(vec![key.into(), if on { "yes" } else { "no" }.into()]);
    }
    t
}

/// Keys SHOW CONFIG lists, with PgBouncer's defaults as text.
const CONFIG_KEYS: &[(&str, &str)] = &[
    ("admin_users", ""),
    ("application_name_add_host", "0"),
    ("auth_dbname", ""),
    ("auth_file", ""),
    ("auth_hba_file", ""),
    ("auth_query", crate::config::settings::DEFAULT_AUTH_QUERY),
    ("auth_type", "md5"),
    ("auth_user", ""),
    ("autodb_idle_timeout", "3600"),
    ("cancel_wait_timeout", "10"),
    ("client_idle_timeout", "0"),
    ("client_login_timeout", "60"),
    ("client_tls_sslmode", "disable"),
    ("default_pool_size", "20"),
    ("disable_pqexec", "0"),
    ("idle_transaction_timeout", "0"),
    ("ignore_startup_parameters", ""),
    ("listen_addr", ""),
    ("listen_backlog", "128"),
    ("listen_port", "6432"),
    ("log_connections", "1"),
    ("log_disconnections", "1"),
    ("log_pooler_errors", "1"),
    ("log_stats", "1"),
    ("logfile", ""),
    ("max_client_conn", "100"),
    ("max_db_client_connections", "0"),
    ("max_db_connections", "0"),
    ("max_packet_size", "2147483647"),
    ("max_prepared_statements", "200"),
    ("max_statement_stats", "5000"),
    ("max_user_client_connections", "0"),
    ("max_user_connections", "0"),
    ("min_pool_size", "0"),
    ("pidfile", ""),
    ("pkt_buf", "4096"),
    ("pool_idle_timeout", "0"),
    ("pool_mode", "session"),
    ("prometheus_listen", ""),
    ("prometheus_max_statements", "20"),
    ("prometheus_max_tenants", "100"),
    ("query_timeout", "0"),
    ("query_wait_timeout", "120"),
    ("reserve_pool_size", "0"),
    ("reserve_pool_timeout", "5"),
    ("server_check_delay", "30"),
    ("server_check_query", "<empty>"),
    ("server_connect_timeout", "15"),
    ("server_fast_close", "0"),
    ("server_idle_timeout", "600"),
    ("server_lifetime", "3600"),
    ("server_login_retry", "15"),
    ("server_reset_query", "DISCARD ALL"),
    ("server_reset_query_always", "0"),
    ("server_round_robin", "0"),
    ("server_tls_sslmode", "prefer"),
    ("so_reuseport", "0"),
    ("stats_period", "60"),
    ("stats_users", ""),
    ("suspend_timeout", "10"),
    ("tcp_keepalive", "1"),
    ("track_extra_parameters", "IntervalStyle"),
    ("transaction_timeout", "0"),
    ("unix_socket_dir", "/tmp"),
    ("unix_socket_mode", "0777"),
    ("verbose", "0"),
    ("worker_threads", "1"),
];

fn config(rt: &Runtime) -> Table {
    const COLS: &[(&str, Ty)] = &[
        ("key", Ty::Text),
        ("value", Ty::Text),
        ("default", Ty::Text),
        ("changeable", Ty::Text),
    ];
    let mut t = Table::new(COLS);
    let config = rt.config.load();
    let raw = &config.settings.raw;
    let mut keys: Vec<(&str, &str)> = CONFIG_KEYS.to_vec();
    for k in raw.keys() {
        if !keys.iter().any(|(name, _)| name == k) {
            keys.push((k.as_str(), ""));
        }
    }
    keys.sort();
    for (key, default) in keys {
        let value = raw.get(key).map_or(default, String::as_str);
        let changeable = if Settings::requires_restart(key) {
            "no"
        } else {
            "yes"
        };
        t.push(vec![
            key.into(),
            value.into(),
            default.into(),
            changeable.into(),
        ]);
    }
    t
}

fn lists(rt: &Runtime) -> Table {
    const COLS: &[(&str, Ty)] = &[("list", Ty::Text), ("items", Ty::Int4)];
    let mut t = Table::new(COLS);
    let config = rt.config.load();
    let pools = rt.pools.all();
    let clients = rt.ops.clients.all();
    let login = clients
        .iter()
        .filter(|c| c.info().state == crate::ops::ClientState::Login)
        .count();
    let servers: usize = pools.iter().map(|p| server_total(p)).sum();
    let rows: [(&str, usize); 14] = [
        ("databases", config.databases.len()),
        ("users", show_objects::user_names(rt).len()),
        ("peers", config.peers.len()),
        ("pools", pools.len()),
        ("peer_pools", 0),
        ("free_clients", 0),
        ("used_clients", clients.len()),
        ("login_clients", login),
        ("free_servers", 0),
        ("used_servers", servers),
        ("dns_names", 0),
        ("dns_zones", 0),
        ("dns_queries", 0),
        ("dns_pending", 0),
    ];
    for (name, n) in rows {
        t.push(vec![name.into(), n.into()]);
    }
    t
}

fn mem(rt: &Runtime) -> Table {
    const COLS: &[(&str, Ty)] = &[
        ("name", Ty::Text),
        ("size", Ty::Int4),
        ("used", Ty::Int4),
        ("free", Ty::Int4),
        ("memtotal", Ty::Int4),
    ];
    let mut t = Table::new(COLS);
    let pools = rt.pools.all();
    let servers: usize = pools.iter().map(|p| server_total(p)).sum();
    let rows = [
        (
            "client_cache",
            std::mem::size_of::<crate::ops::ClientEntry>(),
            rt.ops.clients.all().len(),
        ),
        (
            "server_cache",
            std::mem::size_of::<crate::server::ServerConn>(),
            servers,
        ),
        (
            "pool_cache",
            std::mem::size_of::<crate::pool::Pool>(),
            pools.len(),
        ),
        (
            "db_cache",
            std::mem::size_of::<crate::config::DatabaseDef>(),
            rt.config.load().databases.len(),
        ),
    ];
    for (name, size, used) in rows {
        t.push(vec![
            name.into(),
            size.into(),
            used.into(),
            0u32.into(),
            size.saturating_mul(used).into(),
        ]);
    }
    t
}

fn peers(rt: &Runtime) -> Table {
    const COLS: &[(&str, Ty)] = &[
        ("peer_id", Ty::Int4),
        ("host", Ty::Text),
        ("port", Ty::Int4),
        ("pool_size", Ty::Int4),
    ];
    let mut t = Table::new(COLS);
    let config = rt.config.load();
    for p in &config.peers {
        let size = p.pool_size.unwrap_or(config.settings.default_pool_size);
        t.push(vec![
            p.id.into(),
            p.host.clone().into(),
            p.port.into(),
            size.into(),
        ]);
    }
    t
}

const PEER_POOLS: &[(&str, Ty)] = &[
    ("peer_id", Ty::Int4),
    ("cl_active_cancel_req", Ty::Int4),
    ("cl_waiting_cancel_req", Ty::Int4),
    ("sv_active_cancel", Ty::Int4),
    ("sv_login", Ty::Int4),
];
const DNS_HOSTS: &[(&str, Ty)] = &[
    ("hostname", Ty::Text),
    ("ttl", Ty::Int8),
    ("addrs", Ty::Text),
];
const DNS_ZONES: &[(&str, Ty)] = &[
    ("zonename", Ty::Text),
    ("serial", Ty::Int8),
    ("count", Ty::Int4),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn help_lists_the_gate_commands() {
        for cmd in [
            "SHOW TENANTS|KILLS|PLANS",
            "SET TENANT name",
            "KILL TENANT <name> FOR",
            "KILL STATEMENT <fingerprint> FOR",
            "UNKILL TENANT",
            "UNKILL STATEMENT",
        ] {
            assert!(HELP.contains(cmd), "{cmd}");
        }
    }
}
