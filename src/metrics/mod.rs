//! The Prometheus endpoint: pools, clients, servers and per-database traffic, read from the
//! runtime at each scrape. Built on `prometheus-client` (encoding) and `hyper` (HTTP).
//!
//! The metric names are listed in `docs/metrics.md`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::TypedMetric;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::gate::TenantMetrics;
use crate::ops::stats::by_database;
use crate::ops::ClientState;
use crate::runtime::Runtime;

#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("prometheus_listen {0:?} is not an address")]
    BadAddr(String),
    #[error("cannot listen on {addr} for metrics: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
}

type Labels = Vec<(&'static str, String)>;

/// Reads the runtime at every scrape.
struct Snapshot(Arc<Runtime>);

impl std::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Snapshot")
    }
}

/// Writes one family of metrics.
fn emit<M: EncodeMetric + TypedMetric + Default + Clone>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = (Labels, Box<dyn Fn(&M)>)>,
) -> Result<(), std::fmt::Error> {
    let family: Family<Labels, M> = Family::default();
    for (labels, set) in rows {
        set(&family.get_or_create(&labels));
    }
    let metric = encoder.encode_descriptor(name, help, None, family.metric_type())?;
    family.encode(metric)
}

/// Writes one family of metrics whose rows set each metric to a value.
fn family_of<M, V>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: Vec<(Labels, V)>,
    set: fn(&M, V),
) -> Result<(), std::fmt::Error>
where
    M: EncodeMetric + TypedMetric + Default + Clone + 'static,
    V: Copy + 'static,
{
    let rows = rows.into_iter().map(|(l, v)| {
        let apply: Box<dyn Fn(&M)> = Box::new(move |m: &M| set(m, v));
        (l, apply)
    });
    emit::<M>(encoder, name, help, rows)
}

fn gauges(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: Vec<(Labels, i64)>,
) -> Result<(), std::fmt::Error> {
    family_of(encoder, name, help, rows, |g: &Gauge, v| {
        g.set(v);
    })
}

fn counters(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: Vec<(Labels, u64)>,
) -> Result<(), std::fmt::Error> {
    family_of(encoder, name, help, rows, |c: &Counter, v| {
        c.inc_by(v);
    })
}

fn float_gauges(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: Vec<(Labels, f64)>,
) -> Result<(), std::fmt::Error> {
    family_of(encoder, name, help, rows, |g: &FloatGauge, v| {
        g.set(v);
    })
}

fn float_counters(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: Vec<(Labels, f64)>,
) -> Result<(), std::fmt::Error> {
    family_of(encoder, name, help, rows, |c: &FloatCounter, v| {
        c.inc_by(v.max(0.0));
    })
}

type FloatGauge = Gauge<f64, AtomicU64>;
type FloatCounter = Counter<f64, AtomicU64>;

fn gauge_of(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl Collector for Snapshot {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let rt = &self.0;
        pools(rt, &mut encoder)?;
        databases(rt, &mut encoder)?;
        lanes(rt, &mut encoder)?;
        tenants(rt, &mut encoder)?;
        plan_cache(rt, &mut encoder)?;
        statement_stats(rt, &mut encoder)?;
        process(rt, &mut encoder)
    }
}

/// Per-pool gauges: clients by state, servers by state, limits.
fn pools(rt: &Runtime, e: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
    let infos: Vec<_> = rt.ops.clients.all().iter().map(|c| c.info()).collect();
    let mut clients = Vec::new();
    let mut servers = Vec::new();
    let mut sizes = Vec::new();
    for pool in rt.pools.all() {
        let key = |extra: Option<&'static str>| {
            let mut l: Labels = vec![
                ("database", pool.key.db.clone()),
                ("user", pool.key.user.clone()),
            ];
            if let Some(s) = extra {
                l.push(("state", s.to_string()));
            }
            l
        };
        let mine = infos
            .iter()
            .filter(|i| i.database == pool.key.db && i.pool_user == pool.key.user);
        for state in [ClientState::Active, ClientState::Idle, ClientState::Waiting] {
            let n = mine.clone().filter(|i| i.state == state).count();
            clients.push((key(Some(state.as_str())), gauge_of(n)));
        }
        let st = pool.stats();
        for (state, n) in [
            ("active", st.active.saturating_sub(st.tested)),
            ("tested", st.tested),
            ("idle", st.idle),
            ("login", st.connecting),
        ] {
            servers.push((key(Some(state)), gauge_of(n)));
        }
        sizes.push((key(None), gauge_of(pool.settings().limits.pool_size)));
    }
    gauges(
        e,
        "pgward_pool_clients",
        "Clients of a pool by state",
        clients,
    )?;
    gauges(
        e,
        "pgward_pool_servers",
        "Server connections of a pool by state",
        servers,
    )?;
    gauges(e, "pgward_pool_size", "The pool size in force", sizes)
}

/// A counter family: name, help, and how to read it from a database's totals.
type Series = (
    &'static str,
    &'static str,
    fn(&crate::ops::StatValues) -> u64,
);

/// Per-database counters, as SHOW STATS totals them.
fn databases(rt: &Runtime, e: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
    let totals = by_database(&rt.ops.stats.totals());
    let series: [Series; 9] = [
        ("pgward_database_transactions", "Transactions pooled", |v| {
            v.xacts
        }),
        (
            "pgward_database_queries",
            "Requests answered (ReadyForQuery)",
            |v| v.queries,
        ),
        (
            "pgward_database_received_bytes",
            "Bytes received from clients",
            |v| v.received,
        ),
        ("pgward_database_sent_bytes", "Bytes sent to clients", |v| {
            v.sent
        }),
        (
            "pgward_database_transaction_microseconds",
            "Time spent in transactions",
            |v| v.xact_time,
        ),
        (
            "pgward_database_query_microseconds",
            "Time spent running requests",
            |v| v.query_time,
        ),
        (
            "pgward_database_wait_microseconds",
            "Time clients waited for a server",
            |v| v.wait_time,
        ),
        (
            "pgward_database_server_assignments",
            "Servers handed to clients",
            |v| v.server_assignments,
        ),
        (
            "pgward_database_client_logins",
            "Successful client logins",
            |v| v.client_logins,
        ),
    ];
    for (name, help, get) in series {
        let rows = totals
            .iter()
            .map(|(db, v)| (vec![("database", db.clone())], get(v)))
            .collect();
        counters(e, name, help, rows)?;
    }
    let state = rt.ops.control.get();
    let mut paused = Vec::new();
    let mut disabled = Vec::new();
    for db in &rt.config.load().databases {
        paused.push((
            vec![("database", db.name.clone())],
            i64::from(state.is_paused(&db.name)),
        ));
        disabled.push((
            vec![("database", db.name.clone())],
            i64::from(state.is_disabled(&db.name)),
        ));
    }
    gauges(
        e,
        "pgward_database_paused",
        "1 while the database is paused",
        paused,
    )?;
    gauges(
        e,
        "pgward_database_disabled",
        "1 while the database is disabled",
        disabled,
    )
}

/// The gate's lanes per PostgreSQL server: limit in force, slots held, tickets waiting;
/// under `adaptive = true` the fast lane's ceiling, its moves and its last one.
fn lanes(rt: &Runtime, e: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
    let rows = rt.gatekeeper.lock().lanes();
    let now = std::time::Instant::now();
    let (mut limit, mut running, mut waiting) = (Vec::new(), Vec::new(), Vec::new());
    let (mut ceiling, mut moves, mut last) = (Vec::new(), Vec::new(), Vec::new());
    for r in &rows {
        let lane = r.lane.as_str();
        let key = || -> Labels { vec![("upstream", r.upstream.clone()), ("lane", lane.into())] };
        limit.push((key(), gauge_of(r.limit)));
        running.push((key(), gauge_of(r.running)));
        waiting.push((key(), gauge_of(r.waiting)));
        let Some(c) = r.ceiling else {
            continue;
        };
        ceiling.push((key(), gauge_of(c)));
        for (direction, n) in [("up", r.moves.0), ("down", r.moves.1)] {
            let mut l = key();
            l.push(("direction", direction.into()));
            moves.push((l, n));
        }
        if let Some(m) = r.last_move {
            let mut l = key();
            l.push(("reason", m.why.reason().into()));
            let ago = now.saturating_duration_since(m.at).as_secs();
            last.push((l, i64::try_from(ago).unwrap_or(i64::MAX)));
        }
    }
    gauges(
        e,
        "pgward_lane_limit",
        "Slots the lane may hand out now",
        limit,
    )?;
    gauges(e, "pgward_lane_running", "Slots of the lane held", running)?;
    gauges(
        e,
        "pgward_lane_waiting",
        "Tickets waiting for a slot of the lane",
        waiting,
    )?;
    gauges(
        e,
        "pgward_lane_ceiling",
        "The adaptive limit's ceiling (max_active within the servers)",
        ceiling,
    )?;
    counters(
        e,
        "pgward_lane_limit_moves",
        "Moves of the adaptive limit, up and down",
        moves,
    )?;
    gauges(
        e,
        "pgward_lane_limit_last_move_seconds",
        "Seconds since the adaptive limit last moved, labelled with why",
        last,
    )
}

/// The gate's tenants: the `prometheus_max_tenants` with the most server time run and
/// refusals as series of their own (a ranking that moves slowly), the gauges of the others
/// summed in `pgward_tenants_folded_*`, and counters over every tenant since the start, so a
/// storm of tenants named by tags cannot blow up a scrape and no counter ever goes back.
fn tenants(rt: &Runtime, e: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
    let cap = rt.config.load().settings.prometheus_max_tenants;
    let m = rt
        .gatekeeper
        .lock()
        .tenant_metrics(cap, std::time::Instant::now());
    let (mut ran, mut debt, mut balance) = (Vec::new(), Vec::new(), Vec::new());
    let (mut waiting, mut running, mut refused) = (Vec::new(), Vec::new(), Vec::new());
    for t in &m.kept {
        let key = || -> Labels { vec![("tenant", t.tenant.clone())] };
        ran.push((key(), t.ran));
        debt.push((key(), t.debt));
        if let Some(b) = t.balance {
            balance.push((key(), b));
        }
        waiting.push((key(), gauge_of(t.waiting)));
        running.push((key(), gauge_of(t.running)));
        for (reason, n) in &t.refusals {
            let mut l = key();
            l.push(("reason", reason.as_str().into()));
            refused.push((l, *n));
        }
    }
    float_counters(
        e,
        "pgward_tenant_server_seconds",
        "Seconds the tenant's runs took on servers",
        ran,
    )?;
    float_gauges(
        e,
        "pgward_tenant_debt_seconds",
        "Seconds the tenant owes",
        debt,
    )?;
    float_gauges(
        e,
        "pgward_tenant_balance_seconds",
        "Seconds in the tenant's budget (tenants with a budget)",
        balance,
    )?;
    gauges(
        e,
        "pgward_tenant_waiting",
        "Tickets of the tenant waiting",
        waiting,
    )?;
    gauges(
        e,
        "pgward_tenant_running",
        "Slots the tenant holds",
        running,
    )?;
    counters(
        e,
        "pgward_tenant_refusals",
        "Statements of the tenant refused by reason (cost_warned: let run by a cost rule in warn mode)",
        refused,
    )?;
    folded(e, &m, rt.gatekeeper.lock_counts())
}

/// The tenants past the cap, the totals over every tenant, and the gate lock's counts.
fn folded(
    e: &mut DescriptorEncoder,
    m: &TenantMetrics,
    locks: (u64, u64),
) -> Result<(), std::fmt::Error> {
    let one = |v: usize| vec![(Labels::new(), gauge_of(v))];
    gauges(e, "pgward_tenants", "Tenants the gate knows", one(m.known))?;
    gauges(
        e,
        "pgward_tenants_folded",
        "Tenants past prometheus_max_tenants, without series of their own",
        one(m.folded.tenants),
    )?;
    float_gauges(
        e,
        "pgward_tenants_folded_debt_seconds",
        "Seconds the tenants past the cap owe",
        vec![(Vec::new(), m.folded.debt)],
    )?;
    gauges(
        e,
        "pgward_tenants_folded_waiting",
        "Tickets of the tenants past the cap waiting",
        one(m.folded.waiting),
    )?;
    gauges(
        e,
        "pgward_tenants_folded_running",
        "Slots the tenants past the cap hold",
        one(m.folded.running),
    )?;
    let (taken, contended) = locks;
    counters(
        e,
        "pgward_gate_lock_acquisitions",
        "Times the gate's lock was taken",
        vec![(Vec::new(), taken)],
    )?;
    counters(
        e,
        "pgward_gate_lock_contended",
        "Times the gate's lock was held by another worker thread when taken (the taker waited)",
        vec![(Vec::new(), contended)],
    )?;
    float_counters(
        e,
        "pgward_gate_server_seconds",
        "Seconds runs of every tenant took on servers",
        vec![(Vec::new(), m.totals.ran)],
    )?;
    let refusals = m
        .totals
        .refusals
        .iter()
        .map(|(reason, n)| (vec![("reason", reason.as_str().to_string())], *n))
        .collect();
    counters(
        e,
        "pgward_gate_refusals",
        "Statements of every tenant refused, by reason",
        refusals,
    )
}

/// The plan cache since the start (SHOW PLANS).
fn plan_cache(rt: &Runtime, e: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
    let (entries, stats) = {
        let plans = rt.gatekeeper.plans();
        (plans.len(), plans.stats())
    };
    let one = |v: u64| vec![(Labels::new(), v)];
    gauges(
        e,
        "pgward_plan_cache_entries",
        "Plans in the cache",
        vec![(Vec::new(), gauge_of(entries))],
    )?;
    counters(
        e,
        "pgward_plan_cache_hits",
        "Lookups that found a plan",
        one(stats.hits),
    )?;
    counters(
        e,
        "pgward_plan_cache_misses",
        "Lookups that found none",
        one(stats.misses),
    )?;
    counters(
        e,
        "pgward_explains",
        "EXPLAINs run to price statements",
        one(stats.explains),
    )?;
    counters(
        e,
        "pgward_explain_errors",
        "EXPLAINs that failed",
        one(stats.explain_errors),
    )?;
    float_counters(
        e,
        "pgward_explain_seconds",
        "Time spent in EXPLAINs",
        vec![(Vec::new(), stats.explain_time.as_secs_f64())],
    )
}

/// The statement statistics (SHOW STATEMENTS): the `prometheus_max_statements` rows with the
/// most total time, their calls, time and latency percentiles; the rows kept and evicted.
fn statement_stats(rt: &Runtime, e: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
    let cap = rt.config.load().settings.prometheus_max_statements;
    let ((rows, evicted), top) = rt.ops.statements.counts_and_top(cap);
    let (mut calls, mut seconds, mut latency) = (Vec::new(), Vec::new(), Vec::new());
    for (key, row, _) in &top {
        let labels = || -> Labels {
            vec![
                ("fingerprint", format!("{:016x}", key.fingerprint)),
                ("tenant", key.tenant.to_string()),
                ("role", key.role.to_string()),
                ("database", key.database.to_string()),
            ]
        };
        calls.push((labels(), row.calls));
        seconds.push((labels(), row.latency.sum()));
        for (name, q) in [("50", 0.5), ("95", 0.95), ("99", 0.99)] {
            if let Some(v) = row.latency.quantile(q) {
                let mut l = labels();
                l.push(("percentile", name.to_string()));
                latency.push((l, v));
            }
        }
    }
    counters(
        e,
        "pgward_statement_calls",
        "Runs of the statement (the prometheus_max_statements with the most total time)",
        calls,
    )?;
    float_counters(
        e,
        "pgward_statement_seconds",
        "Latency of the statement's runs as clients saw them, summed",
        seconds,
    )?;
    float_gauges(
        e,
        "pgward_statement_latency_seconds",
        "Latency percentiles of the statement as clients saw them, within 1%",
        latency,
    )?;
    gauges(
        e,
        "pgward_statement_stats_rows",
        "Rows of statement statistics kept",
        vec![(Vec::new(), gauge_of(rows))],
    )?;
    counters(
        e,
        "pgward_statement_stats_evicted",
        "Rows of statement statistics evicted at max_statement_stats",
        vec![(Vec::new(), evicted)],
    )?;
    let (started, open) = crate::sync::lock(&rt.ops.anomalies).counts();
    counters(
        e,
        "pgward_anomalies",
        "Anomalies started (two unusual minutes in a row)",
        vec![(Vec::new(), started)],
    )?;
    gauges(
        e,
        "pgward_anomaly_open",
        "1 while an anomaly is under way",
        vec![(Vec::new(), i64::from(open))],
    )
}

/// Process-wide gauges.
fn process(rt: &Runtime, e: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
    let clients = rt.ops.clients.all().len();
    gauges(
        e,
        "pgward_client_connections",
        "Client connections, console included",
        vec![(Vec::new(), gauge_of(clients))],
    )?;
    let by_worker = rt.workers.clients();
    if !by_worker.is_empty() {
        gauges(
            e,
            "pgward_worker_clients",
            "Client connections served on each worker thread (with worker_threads above 1)",
            by_worker
                .into_iter()
                .enumerate()
                .map(|(i, n)| (vec![("worker", i.to_string())], gauge_of(n)))
                .collect(),
        )?;
        counters(
            e,
            "pgward_worker_server_moves",
            "Server connections moved from one worker thread to the thread of the session that checked them out",
            vec![(Vec::new(), rt.workers.moves())],
        )?;
    }
    let uptime = rt.started.elapsed().as_secs();
    gauges(
        e,
        "pgward_uptime_seconds",
        "Seconds since start",
        vec![(Vec::new(), i64::try_from(uptime).unwrap_or(i64::MAX))],
    )
}

/// The exposition text of every metric.
pub fn render(rt: &Arc<Runtime>) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Snapshot(rt.clone())));
    let mut text = String::new();
    if prometheus_client::encoding::text::encode(&mut text, &registry).is_err() {
        text.clear();
    }
    text
}

/// Binds `prometheus_listen`.
pub async fn bind(addr: &str) -> Result<TcpListener, MetricsError> {
    let sa: SocketAddr = addr
        .parse()
        .map_err(|_| MetricsError::BadAddr(addr.to_string()))?;
    TcpListener::bind(sa)
        .await
        .map_err(|source| MetricsError::Bind {
            addr: addr.to_string(),
            source,
        })
}

/// A request's header must arrive within this long of the connection's start (or of the
/// previous answer, on a kept-alive connection).
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// After this long a connection finishes the answer under way (if any, within
/// [`HEADER_TIMEOUT`]) and closes; a scraper opens a new one.
const CONNECTION_LIFETIME: Duration = Duration::from_secs(60);
/// Connections served at once; more wait to be accepted.
const MAX_CONNECTIONS: usize = 64;

/// Serves `GET /metrics` on `listener` until the task is dropped. Connections that send no
/// whole request header in time are closed, none lasts long, and only a few are served at
/// once, so idle or slow connections cannot pile up.
pub async fn serve(rt: Arc<Runtime>, listener: TcpListener) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let rt = rt.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let service = service_fn(move |req| answer(rt.clone(), req));
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            let served = match tokio::time::timeout(CONNECTION_LIFETIME, conn.as_mut()).await {
                Ok(served) => served,
                Err(_) => {
                    // An answer under way is finished (within a grace period); no new
                    // request is read.
                    conn.as_mut().graceful_shutdown();
                    tokio::time::timeout(HEADER_TIMEOUT, conn.as_mut())
                        .await
                        .unwrap_or(Ok(()))
                }
            };
            if let Err(e) = served {
                tracing::debug!("metrics connection: {e}");
            }
        });
    }
}

async fn answer(
    rt: Arc<Runtime>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (status, body) = if req.uri().path() == "/metrics" {
        (StatusCode::OK, render(&rt))
    } else {
        (
            StatusCode::NOT_FOUND,
            "not found; metrics are at /metrics\n".to_string(),
        )
    };
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        ),
    );
    Ok(resp)
}
