//! One accepted connection: counted against max_client_conn, logged in by the client module,
//! then routed to the admin console or to a pool, greeted, and handed to its session.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::BytesMut;

use crate::cancel::ClientHandle;
use crate::client::{self, ClientIo, Opening, SessionError, StartupRequest};
use crate::net::Stream;
use crate::params::ParamSet;
use crate::pool::Pool;
use crate::runtime::Runtime;
use crate::session::{Session, Timeouts};
use crate::wire::{self, sqlstate, ErrorResponse, TxStatus};
use crate::workers::{Seat, WorkerId};

/// Counts a client from accept to close, for max_client_conn.
struct ClientCount<'a>(&'a Runtime);

impl Drop for ClientCount<'_> {
    fn drop(&mut self) {
        self.0.clients.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Which logins an accepted connection may make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accepts {
    /// Any database.
    All,
    /// Only the admin console: the connection came in on the Unix socket while the pooler
    /// shuts down.
    ConsoleOnly,
}

/// Serves one accepted client connection to its end.
pub async fn serve(rt: Arc<Runtime>, stream: Stream, accepts: Accepts, seat: Seat) {
    let peer = stream.peer_label();
    let max_message =
        (rt.config.load().settings.max_packet_size as usize).min(wire::DEFAULT_MAX_MESSAGE_LEN);
    // Until the client has logged in, no message may be larger than an authentication
    // token can be in PostgreSQL.
    let mut io = ClientIo::new(stream, client::LOGIN_MAX_MESSAGE.min(max_message));
    let over_limit = {
        let n = rt.clients.fetch_add(1, Ordering::AcqRel) + 1;
        n > rt.config.load().settings.max_client_conn as usize
    };
    let _count = ClientCount(&rt);
    let id = rt.next_client_id();
    // Declared after `io`, so the client leaves the registry before its socket closes.
    let Some(registration) = rt.ops.clients.register(id, &io.stream) else {
        tracing::warn!(%peer, "out of file descriptors: connection closed");
        return;
    };
    let entry = registration.entry.clone();
    let limits = Admit {
        over_limit,
        max_message,
        accepts,
        worker: seat.id(),
    };
    // The session's relay runs here, not inside the login's future: every turn of the relay
    // resumes this task, and each enclosing future is one more step on the way in.
    let ended = match open(&rt, &mut io, &entry, limits).await {
        Ok(Some(mut relay)) => {
            relay.session.home = seat.home();
            // The session logs how it ended.
            let result = relay.session.run(&mut io).await;
            rt.cancels.remove(&relay.handle);
            if let Err(SessionError::Io(e)) = result {
                tracing::debug!(client = id, %peer, "client connection lost: {e}");
            }
            return;
        }
        Ok(None) => return,
        Err(e) => e,
    };
    // The login did not end in a session: the client left, or pgward refused it.
    match ended {
        SessionError::Fatal(err) => {
            let log = rt.config.load().settings.log_lines();
            crate::ops::routine::client_refused(log, id, &err, entry.age());
            io.send_error(&[], &err).await;
        }
        left => {
            if let SessionError::Io(e) = &left {
                tracing::debug!(client = id, %peer, "client connection lost: {e}");
            }
            close(&rt, &entry, &mut io, &Err(left)).await;
        }
    }
}

/// Logs how a client's connection ended (`ended`), unless pgward ended it with an error of
/// its own (logged as a refusal).
fn log_end(rt: &Runtime, entry: &crate::ops::ClientEntry, ended: &Result<(), SessionError>) {
    if let Some(end) = client::client_end(ended, entry.killed()) {
        let log = rt.config.load().settings.log_lines();
        crate::ops::routine::client_closed(log, entry.id, end, entry.age());
    }
}

/// Logs how a client's connection ended, and tells a client the console ended why (a client
/// outside a pool's relay: still logging in, or at the console).
async fn close(
    rt: &Runtime,
    entry: &crate::ops::ClientEntry,
    io: &mut ClientIo,
    ended: &Result<(), SessionError>,
) {
    log_end(rt, entry, ended);
    client::tell_killed(io, ended, entry.killed(), &[]).await;
}

/// What an accepted connection is allowed.
struct Admit {
    over_limit: bool,
    max_message: usize,
    accepts: Accepts,
    /// The thread the client is served on.
    worker: WorkerId,
}

/// A completed login: to a pool, or to the admin console.
enum Opened {
    /// The guard counts the client against its caps until the session ends.
    Pool(
        StartupRequest,
        Arc<Pool>,
        crate::pool::Welcome,
        crate::edge::caps::CapGuard,
    ),
    /// The guard counts a stats user against its caps until the console session ends.
    Console(
        StartupRequest,
        crate::admin::Role,
        Option<crate::edge::caps::CapGuard>,
    ),
    /// A replication client, which gets a server of its own (and its greeting from it).
    Replication(StartupRequest, Arc<Pool>, crate::edge::caps::CapGuard),
}

/// A client logged in to a pool and greeted, ready for its relay.
struct Relay {
    session: Session,
    handle: Arc<ClientHandle>,
    /// Counts the client against its caps until the session ends.
    _cap: crate::edge::caps::CapGuard,
}

/// Logs the client in. A pool client comes back greeted, with its session; a console client
/// is served here, and a cancel request handled, both coming back as `None`.
async fn open(
    rt: &Arc<Runtime>,
    io: &mut ClientIo,
    entry: &Arc<crate::ops::ClientEntry>,
    admit: Admit,
) -> Result<Option<Relay>, SessionError> {
    let (id, worker) = (entry.id, admit.worker);
    let login_timeout = rt.config.load().settings.client_login_timeout;
    let login = async {
        let mut req = match client::read_opening(io, rt).await? {
            Opening::Cancel => return Ok(None),
            Opening::Login(req) => req,
        };
        let add_host = {
            let config = rt.config.load();
            let s = &config.settings;
            s.application_name_add_host.then_some(s.listen_port)
        };
        if let Some(port) = add_host {
            req.add_host(&io.stream.peer_details(port));
        }
        if admit.over_limit {
            return Err(SessionError::Fatal(ErrorResponse::fatal(
                sqlstate::TOO_MANY_CONNECTIONS,
                "no more connections allowed (max_client_conn)".to_string(),
            )));
        }
        let log = rt.config.load().settings.log_lines();
        let names = (req.database.as_str(), req.user.as_str());
        crate::ops::routine::login_attempt(
            log,
            id,
            names,
            &io.stream,
            req.replication.startup_value().unwrap_or("no"),
        );
        if crate::admin::is_console(&req.database) {
            let (role, cap) = crate::admin::login(rt, io, &req.user, &req.database).await?;
            return Ok(Some(Opened::Console(req, role, cap)));
        }
        check_accepts(rt, &req.database, admit.accepts)?;
        let (authed, cap) = client::login(io, rt, &req).await?;
        check_startup_search_path(rt, &req, io.stream.peer_ip())?;
        let pool = open_pool(rt, &req, authed.credential)?;
        if req.replication != client::Replication::None {
            return Ok(Some(Opened::Replication(req, pool, cap)));
        }
        let welcome = welcome(rt, &pool, || {
            let app_name = req.application_name();
            entry.identify(&req.user, &req.database, &pool.key.user, app_name, false);
            entry.set_waiting(std::time::Instant::now());
        })
        .await?;
        Ok(Some(Opened::Pool(req, pool, welcome, cap)))
    };
    let opened = match login_timeout {
        Some(limit) => tokio::time::timeout(limit, login).await.map_err(|_| {
            SessionError::Fatal(ErrorResponse::fatal(
                sqlstate::PROTOCOL_VIOLATION,
                "client_login_timeout".to_string(),
            ))
        })??,
        None => login.await?,
    };
    io.max_message = admit.max_message;
    let (req, pool, welcome, cap) = match opened {
        None => return Ok(None),
        Some(Opened::Console(req, role, _cap)) => {
            let ended = crate::admin::serve(rt, io, entry, &req, (role, worker)).await;
            if let Err(SessionError::Fatal(_)) = ended {
                // Logged and answered as a refusal.
                return ended.map(|()| None);
            }
            close(rt, entry, io, &ended).await;
            return Ok(None);
        }
        Some(Opened::Replication(req, pool, _cap)) => {
            logged_in(rt, entry, &req, (&pool, worker));
            let ended = crate::session::replication::serve(rt, io, entry, &req, pool).await;
            if entry.killed().is_some() && !matches!(ended, Err(SessionError::Fatal(_))) {
                // A stream relayed whole cannot tell a Terminate from an end of stream: only
                // the console's ending is told.
                log_end(rt, entry, &ended);
                return Ok(None);
            }
            ended?;
            return Ok(None);
        }
        Some(Opened::Pool(req, pool, welcome, cap)) => (req, pool, welcome, cap),
    };
    logged_in(rt, entry, &req, (&pool, worker));
    let handle = rt
        .cancels
        .register(id, rt.config.load().settings.peer_id as u16);
    let hooks = crate::ops::SessionHooks::new(rt.ops.clone(), entry.clone(), &pool, worker);
    match greet(rt, io, req, pool, &welcome, &handle, hooks).await {
        Ok(session) => Ok(Some(Relay {
            session,
            handle,
            _cap: cap,
        })),
        Err(e) => {
            rt.cancels.remove(&handle);
            Err(e)
        }
    }
}

/// Records a completed login for the console and the pool's statistics.
fn logged_in(
    rt: &Runtime,
    entry: &crate::ops::ClientEntry,
    req: &StartupRequest,
    (pool, worker): (&Pool, WorkerId),
) {
    let app_name = req.application_name();
    entry.logged_in(&req.user, &req.database, &pool.key.user, app_name, false);
    rt.ops.stats.for_pool(&pool.key, worker).add_login();
}

/// A search_path set at startup (options -c) is judged by the schema rules like a SET.
fn check_startup_search_path(
    rt: &Runtime,
    req: &StartupRequest,
    client_addr: Option<std::net::IpAddr>,
) -> Result<(), SessionError> {
    let governance = rt.governance.load();
    let (Some(g), Some((_, value))) = (
        governance.as_deref(),
        req.params.iter().find(|(n, _)| n == "search_path"),
    ) else {
        return Ok(());
    };
    let who = crate::policy::Who {
        role: &req.user,
        application_name: req.own_application_name(),
        client_addr,
    };
    match g.policy.judge_startup_search_path(value, &who) {
        crate::policy::Verdict::Reject(hit) => {
            let no_tags = crate::sql::Tags::default();
            let tenant = g.policy.identify(&who, &no_tags).tenant;
            let record = crate::gate::Record::new(crate::gate::Event::Refused, hit.rule.as_str())
                .tenant(&tenant)
                .role(&req.user)
                .database(&req.database)
                .sqlstate(hit.sqlstate);
            rt.gatekeeper.decisions.record(&record);
            Err(SessionError::Fatal(
                ErrorResponse::fatal(hit.sqlstate, hit.message).with_hint(hit.hint),
            ))
        }
        _ => Ok(()),
    }
}

/// Refuses logins to a disabled database, and logins to any pool over the Unix socket while
/// the pooler shuts down.
fn check_accepts(rt: &Runtime, db: &str, accepts: Accepts) -> Result<(), SessionError> {
    if accepts == Accepts::ConsoleOnly {
        return Err(SessionError::Fatal(ErrorResponse::fatal(
            sqlstate::CANNOT_CONNECT_NOW,
            "pooler is shutting down".to_string(),
        )));
    }
    if rt.ops.control.get().is_disabled(db) {
        return Err(SessionError::Fatal(ErrorResponse::fatal(
            sqlstate::CANNOT_CONNECT_NOW,
            format!("database \"{db}\" is disabled"),
        )));
    }
    Ok(())
}

fn open_pool(
    rt: &Arc<Runtime>,
    req: &StartupRequest,
    credential: Option<crate::server::Credential>,
) -> Result<Arc<Pool>, SessionError> {
    let config = rt.config.load();
    let Some(db) = config.database(&req.database) else {
        return Err(SessionError::Fatal(ErrorResponse::fatal(
            sqlstate::INVALID_CATALOG_NAME,
            format!("no such database: {}", req.database),
        )));
    };
    let pool = rt.pool_for(&db, &req.user);
    if let (Some(c), None) = (credential, &db.user) {
        pool.offer_credential(c);
    }
    Ok(pool)
}

/// The server parameters a client is greeted with: those of the pool's first login (after a
/// RECONNECT, of a login begun after it, waited for); if the pool has never logged in, one
/// server is opened now to learn them. `waits` is called when the client has to wait for
/// them.
async fn welcome(
    rt: &Runtime,
    pool: &Arc<Pool>,
    waits: impl FnOnce(),
) -> Result<crate::pool::Welcome, SessionError> {
    if let Some(w) = pool.current_welcome() {
        return Ok(w);
    }
    waits();
    rt.ops.control.wait_open(&pool.key.db).await;
    let wait = pool.settings().query_wait;
    if pool.welcome().is_some() {
        let held = || rt.ops.control.holds(&pool.key.db);
        return Ok(pool.renewed_welcome(wait, held).await?);
    }
    let ticket = crate::gate::Ticket::new(0, std::time::Instant::now());
    pool.checkout(ticket, wait).await?.give_back_unused();
    pool.welcome().ok_or_else(|| {
        SessionError::Fatal(ErrorResponse::fatal(
            sqlstate::CONNECTION_FAILURE,
            "server sent no parameters at login".to_string(),
        ))
    })
}

/// Sends the client its parameters, key and first ReadyForQuery, and makes its session.
async fn greet(
    rt: &Arc<Runtime>,
    io: &mut ClientIo,
    req: StartupRequest,
    pool: Arc<Pool>,
    welcome: &[(String, String)],
    handle: &Arc<ClientHandle>,
    hooks: crate::ops::SessionHooks,
) -> Result<Session, SessionError> {
    let id = hooks.client_id();
    let tracked = rt.tracked.load_full();
    let mut params = ParamSet::default();
    let mut out = BytesMut::new();
    for (name, value) in welcome {
        let value = req
            .params
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map_or(value.as_str(), |(_, v)| v.as_str());
        if let Some(canonical) = tracked.canonical(name) {
            params.set(canonical, value);
        }
        wire::encode_parameter_status(&mut out, name, value);
    }
    for (name, value) in &req.params {
        if params.get(name).is_none() {
            params.set(name, value);
            wire::encode_parameter_status(&mut out, name, value);
        }
    }
    // A tracked parameter the server does not report (say search_path before PostgreSQL
    // 18) is reset to its default for this client, so no other client's value leaks in.
    for name in tracked.names() {
        if params.get(name).is_none() {
            params.set(name, crate::params::DEFAULT_VALUE);
        }
    }
    if let Some(message) = &rt.config.load().settings.login_notify_message {
        let notice = ErrorResponse::new(wire::Severity::Notice, "00000", message.clone());
        wire::encode_notice(&mut out, &notice);
    }
    wire::encode_backend_key_data(&mut out, handle.pid, &handle.secret());
    wire::encode_ready_for_query(&mut out, TxStatus::Idle);
    io.send(&out).await?;
    tracing::debug!(client = id, db = %req.database, user = %req.user, "client logged in");
    let settings = rt.config.load();
    let timeouts = Timeouts::for_login(&settings, &req.user, &pool.key.user);
    Ok(Session::new(
        rt.clone(),
        (
            req.user.clone(),
            crate::session::Peer {
                addr: io.stream.peer_ip(),
                app_host: req.app_host.clone(),
            },
        ),
        pool,
        handle.clone(),
        params,
        tracked,
        timeouts,
        hooks,
    ))
}
