//! Client authentication by the pooler: the failed-login throttle, the method (`auth_type`,
//! or the hba line that matches), the exchange against the auth file's or auth_query's
//! secret, and the client caps counted once the client is authenticated.

use std::sync::Arc;
use std::time::Instant;

use bytes::BytesMut;
use rand::RngCore;

use super::secrets::{self, Origin};
use super::{ClientIo, Replication, SessionError, StartupRequest};
use crate::config::{AuthType, Secret};
use crate::edge::caps::{CapGuard, CapRefusal};
use crate::edge::hba::{HbaMethod, HbaPeer};
use crate::edge::throttle::{Attempt, Blocked};
use crate::runtime::Runtime;
use crate::server::Credential;
use crate::wire::{self, sqlstate, ErrorResponse, ScramSecret, ScramServer};

/// A successful login; `credential` holds what the client proved that pgward may reuse to
/// log in to the server (SCRAM keys, or the secret auth_query found), if any.
pub struct Authenticated {
    pub credential: Option<Credential>,
}

/// Logs a client in: refuses an address that failed too often, authenticates, sends
/// AuthenticationOk, then counts the client against its role's and database's caps (over a
/// cap, the FATAL follows AuthenticationOk, as in PostgreSQL). The guard holds the slot.
pub async fn login(
    io: &mut ClientIo,
    rt: &Arc<Runtime>,
    req: &StartupRequest,
) -> Result<(Authenticated, CapGuard), SessionError> {
    let authed = throttled(io, rt, req).await?;
    let mut out = BytesMut::new();
    wire::encode_auth_ok(&mut out);
    io.send(&out).await?;
    let cap = admit_to_caps(rt, &cap_user(rt, req), &req.database)?;
    Ok((authed, cap))
}

/// The role a client counts as under max_user_client_connections: under `auth_type = any` the
/// name it gives is ignored, and it counts as the database's forced user, as in PgBouncer
/// (a name of its choosing would escape the cap).
fn cap_user(rt: &Runtime, req: &StartupRequest) -> String {
    let config = rt.config.load();
    let forced = match config.settings.auth_type {
        AuthType::Any => config.database(&req.database).and_then(|d| d.user.clone()),
        _ => None,
    };
    forced.unwrap_or_else(|| req.user.clone())
}

/// Counts an authenticated client of `database` against its caps (max_user_client_connections,
/// max_db_client_connections); over one, PgBouncer's words, which scripts match on, with
/// PostgreSQL's SQLSTATE. The console's logins count too, under the global database cap.
pub fn admit_to_caps(rt: &Runtime, user: &str, database: &str) -> Result<CapGuard, SessionError> {
    let limits = crate::edge::cap_limits(&rt.config.load(), database, user);
    rt.edge.caps.admit(user, database, limits).map_err(|over| {
        let setting = match over {
            CapRefusal::Role => "max_user_client_connections",
            CapRefusal::Database => "max_db_client_connections",
        };
        SessionError::Fatal(ErrorResponse::fatal(
            sqlstate::TOO_MANY_CONNECTIONS,
            format!("client connections exceeded ({setting})"),
        ))
    })
}

/// Authenticates `user` for the admin console (no AuthenticationOk is sent), through the
/// same throttle as every login; hba rules see the console's name the client asked for
/// (`database`), as PostgreSQL matches the name in the startup packet.
pub async fn authenticate(
    io: &mut ClientIo,
    rt: &Arc<Runtime>,
    user: &str,
    database: &str,
) -> Result<Authenticated, SessionError> {
    let req = StartupRequest {
        user: user.to_string(),
        database: database.to_string(),
        params: Vec::new(),
        replication: Default::default(),
        options: None,
        app_host: None,
    };
    throttled(io, rt, &req).await
}

/// The database whose auth settings find a user's secret: the console's by either of its
/// names.
fn lookup_database(req: &StartupRequest) -> &str {
    match crate::config::databases::is_console(&req.database) {
        true => crate::config::databases::ADMIN_DB,
        false => &req.database,
    }
}

/// Refuses an address that failed too often as this role or as any roles, else
/// authenticates and records the outcome.
async fn throttled(
    io: &mut ClientIo,
    rt: &Arc<Runtime>,
    req: &StartupRequest,
) -> Result<Authenticated, SessionError> {
    let who = Attempt {
        addr: io.stream.peer_ip(),
        // PostgreSQL reads at most 63 bytes of a name; so does the throttle's memory.
        role: truncate_name(&req.user),
    };
    let begun = crate::sync::lock(&rt.edge.throttle).begin(&who, Instant::now());
    let _attempt = begun.is_ok().then(|| AttemptUnderWay { rt, who: &who });
    if let Err(blocked) = begun {
        return Err(throttle_refusal(blocked, &req.user));
    }
    let authed = match authenticate_for(io, rt, req).await {
        Ok(a) => a,
        // A client that leaves (or breaks the protocol) before its exchange ends counts as a
        // failed login: each try may have cost an auth_query on the server.
        Err(e) if abandoned(&e) => {
            crate::sync::lock(&rt.edge.throttle).failed(&who, Instant::now());
            return Err(e);
        }
        Err(SessionError::Fatal(e)) if is_auth_failure(&e) => {
            match crate::sync::lock(&rt.edge.throttle).failed(&who, Instant::now()) {
                Some(Blocked::Role { .. }) => {
                    tracing::warn!(user = %req.user, addr = ?who.addr, "failed logins: address blocked for this user");
                }
                Some(Blocked::Address { .. }) => {
                    tracing::warn!(addr = ?who.addr, "failed logins: address blocked for every user");
                }
                None => {}
            }
            return Err(SessionError::Fatal(e));
        }
        Err(e) => return Err(e),
    };
    crate::sync::lock(&rt.edge.throttle).succeeded(&who);
    Ok(authed)
}

/// The FATAL 28000 a throttled login gets.
fn throttle_refusal(blocked: Blocked, user: &str) -> SessionError {
    let message = match blocked {
        Blocked::Role { .. } => format!(
            "too many failed login attempts for user \"{user}\" from this address; try again later"
        ),
        Blocked::Address { .. } => {
            "too many failed login attempts from this address; try again later".to_string()
        }
    };
    SessionError::Fatal(ErrorResponse::fatal(
        sqlstate::INVALID_AUTHORIZATION,
        message,
    ))
}

/// A login attempt counted by the throttle until it ends, however it ends.
struct AttemptUnderWay<'a> {
    rt: &'a Runtime,
    who: &'a Attempt,
}

impl Drop for AttemptUnderWay<'_> {
    fn drop(&mut self) {
        crate::sync::lock(&self.rt.edge.throttle).end(self.who);
    }
}

/// The first 63 bytes of a name, as PostgreSQL keeps it.
fn truncate_name(name: &str) -> String {
    let mut end = name.len().min(63);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    name[..end].to_string()
}

/// Whether the client gave up on its login exchange or broke it.
fn abandoned(e: &SessionError) -> bool {
    match e {
        SessionError::Gone | SessionError::Io(_) => true,
        SessionError::Fatal(f) => f.code == sqlstate::PROTOCOL_VIOLATION,
    }
}

/// Whether a refusal counts as a failed login: a wrong password (28P01) or a refusal by the
/// rules (28000).
fn is_auth_failure(e: &ErrorResponse) -> bool {
    e.code == sqlstate::INVALID_PASSWORD || e.code == sqlstate::INVALID_AUTHORIZATION
}

/// Runs the exchange the method asks for. Users unknown to the auth file go through the
/// same exchange as known ones and fail at the end, so a probe learns nothing; one that
/// auth_query does not find is refused at once, as in PgBouncer.
async fn authenticate_for(
    io: &mut ClientIo,
    rt: &Arc<Runtime>,
    req: &StartupRequest,
) -> Result<Authenticated, SessionError> {
    let user = req.user.as_str();
    let (method, map) = method_for(io, rt, req)?;
    match method {
        HbaMethod::Trust => return trust(rt, req).await,
        HbaMethod::Cert => return cert(io, rt, req, map.as_deref()).await,
        HbaMethod::Peer => return peer(io, rt, req, map.as_deref()).await,
        HbaMethod::Reject => return Err(hba_refusal(io, req, "pg_hba.conf rejects connection")),
        _ => {}
    }
    let (secret, origin) = secrets::find_secret(rt, lookup_database(req), user)
        .await
        .map_err(lookup_failed(user))?;
    if origin == Origin::NoRow {
        // As PgBouncer does: an auth_query that finds no one ends the login before any
        // exchange (PgBouncer has no mock exchange for auth_query users).
        return Err(SessionError::Fatal(ErrorResponse::fatal(
            sqlstate::INVALID_AUTHORIZATION,
            "no such user",
        )));
    }
    let from_query = origin == Origin::AuthQuery;
    // An empty password proves nothing (the auth file's entry for a user who logs in by
    // trust or certificate): no password exchange can succeed with it, as in PgBouncer.
    let secret = secret.filter(|s| !matches!(s, Secret::Plain(p) if p.is_empty()));
    match (method, &secret) {
        (HbaMethod::Password, _) => plain(io, rt, user, secret.as_ref(), from_query).await,
        (HbaMethod::Md5, Some(Secret::Scram(_))) | (HbaMethod::ScramSha256, _) => {
            scram(io, rt, user, secret.as_ref(), from_query).await
        }
        _ => md5(io, user, secret.as_ref(), from_query).await,
    }
}

/// Whether pgward knows a user who proves nothing by password (trust, cert).
enum Known {
    /// In the auth file, or found by auth_query (with what the server login may reuse).
    Yes(Option<Credential>),
    /// Unknown, with PgBouncer's words for why.
    No(&'static str),
}

/// Looks `req.user` up in the auth file, else with auth_query.
async fn known(rt: &Arc<Runtime>, req: &StartupRequest) -> Result<Known, SessionError> {
    let (secret, origin) = secrets::find_secret(rt, lookup_database(req), &req.user)
        .await
        .map_err(lookup_failed(&req.user))?;
    Ok(match origin {
        Origin::AuthFile => Known::Yes(None),
        Origin::AuthQuery => Known::Yes(reusable(secret.as_ref(), true)),
        Origin::NoRow => Known::No("no such user"),
        Origin::Nowhere => Known::No("\"trust\" authentication failed"),
    })
}

/// `trust` admits a user pgward knows (in the auth file, or found by auth_query) without a
/// password, as PgBouncer does; `auth_type = any` admits every name to a database that
/// forces its server user (and to the console). Anyone else is
/// refused: a forced user in `[databases]` must not lend its session to any name.
async fn trust(rt: &Arc<Runtime>, req: &StartupRequest) -> Result<Authenticated, SessionError> {
    let config = rt.config.load();
    if config.settings.auth_type == AuthType::Any {
        // The name the client gives is ignored, so the database must name the server's user
        // (as in PgBouncer): otherwise any name, a superuser's included, would log in.
        // (An unknown database is refused for what it is, later.)
        let console = crate::config::databases::is_console(&req.database);
        let unforced = config
            .database(&req.database)
            .is_some_and(|d| d.user.is_none());
        if !console && unforced {
            tracing::error!(database = %req.database, "auth_type=any requires forced user");
            return Err(SessionError::Fatal(ErrorResponse::fatal(
                sqlstate::CONFIG_FILE_ERROR,
                "bouncer config error",
            )));
        }
        return Ok(Authenticated { credential: None });
    }
    drop(config);
    admit_known(rt, req).await
}

/// Admits a user pgward knows (trust, peer), with what the server login may reuse; refuses
/// anyone else with PgBouncer's words for why.
async fn admit_known(
    rt: &Arc<Runtime>,
    req: &StartupRequest,
) -> Result<Authenticated, SessionError> {
    match known(rt, req).await? {
        Known::Yes(credential) => Ok(Authenticated { credential }),
        Known::No(message) => Err(SessionError::Fatal(ErrorResponse::fatal(
            sqlstate::INVALID_AUTHORIZATION,
            message.to_string(),
        ))),
    }
}

/// The refusal when the secret lookup itself failed, in PgBouncer's words: a client of a
/// database whose auth_query cannot run sees "bouncer config error" (the log says why); one
/// whose auth_user pool has no server sees why, as any client of a pool would.
fn lookup_failed(user: &str) -> impl FnOnce(secrets::LookupError) -> SessionError + '_ {
    use secrets::LookupError;
    move |e| {
        tracing::error!(user, "{e}");
        let refusal = match e {
            LookupError::Disabled(_) => {
                ErrorResponse::fatal(sqlstate::CANNOT_CONNECT_NOW, e.to_string())
            }
            LookupError::Pool(pool) => crate::client::pool_error_response(&pool),
            LookupError::NoDatabase(_) | LookupError::Reserved(_) | LookupError::Server(_) => {
                ErrorResponse::fatal(sqlstate::CONFIG_FILE_ERROR, "bouncer config error")
            }
        };
        SessionError::Fatal(refusal)
    }
}

/// The method for this connection, with its ident map: from `auth_type`, or the first hba
/// line that matches.
fn method_for(
    io: &ClientIo,
    rt: &Runtime,
    req: &StartupRequest,
) -> Result<(HbaMethod, Option<String>), SessionError> {
    let auth_type = rt.config.load().settings.auth_type;
    let method = match auth_type {
        AuthType::Trust | AuthType::Any => HbaMethod::Trust,
        AuthType::Plain => HbaMethod::Password,
        AuthType::Md5 => HbaMethod::Md5,
        AuthType::ScramSha256 => HbaMethod::ScramSha256,
        AuthType::Cert => HbaMethod::Cert,
        AuthType::Hba => {
            let hba = rt.edge.hba.load();
            let peer = HbaPeer {
                addr: io.stream.peer_ip(),
                tls: io.stream.is_tls(),
                database: &req.database,
                user: &req.user,
                physical_replication: req.replication == Replication::Physical,
                console: crate::config::databases::is_console(&req.database),
            };
            match hba.as_ref().as_ref().and_then(|h| h.find(&peer)) {
                Some(rule) => return Ok((rule.method, rule.map.clone())),
                None => return Err(hba_refusal(io, req, "no pg_hba.conf entry")),
            }
        }
    };
    Ok((method, None))
}

/// PostgreSQL's refusal by its hba rules: `what for host "...", user "...", database "...",
/// SSL encryption|no encryption`.
fn hba_refusal(io: &ClientIo, req: &StartupRequest, what: &str) -> SessionError {
    let host = io
        .stream
        .peer_ip()
        .map_or_else(|| "[local]".to_string(), |ip| ip.to_string());
    let encryption = if io.stream.is_tls() {
        "SSL encryption"
    } else {
        "no encryption"
    };
    SessionError::Fatal(ErrorResponse::fatal(
        sqlstate::INVALID_AUTHORIZATION,
        format!(
            "{what} for host \"{host}\", user \"{}\", database \"{}\", {encryption}",
            req.user, req.database
        ),
    ))
}

/// Certificate authentication: the client certificate (checked against
/// `client_tls_ca_file` in the handshake) must name the user as its common name, and the
/// user must be one pgward knows, as under trust.
async fn cert(
    io: &ClientIo,
    rt: &Arc<Runtime>,
    req: &StartupRequest,
    map: Option<&str>,
) -> Result<Authenticated, SessionError> {
    let user = req.user.as_str();
    let named = io
        .stream
        .peer_cert_name()
        .is_some_and(|name| maps_to(rt, map, &name, user));
    match (named, known(rt, req).await?) {
        (true, Known::Yes(_)) => Ok(Authenticated { credential: None }),
        _ => Err(SessionError::Fatal(ErrorResponse::fatal(
            sqlstate::INVALID_AUTHORIZATION,
            format!("certificate authentication failed for user \"{user}\""),
        ))),
    }
}

/// Peer authentication (hba `peer`, Unix sockets only): the OS user at the other end of the
/// socket must be the user logging in, or be mapped to it by the line's ident map; and the
/// user must be one pgward knows, as under trust.
async fn peer(
    io: &ClientIo,
    rt: &Arc<Runtime>,
    req: &StartupRequest,
    map: Option<&str>,
) -> Result<Authenticated, SessionError> {
    let user = req.user.as_str();
    let system = io.stream.peer_uid().and_then(crate::ops::user_name);
    let matched = system
        .as_deref()
        .is_some_and(|name| maps_to(rt, map, name, user));
    if !matched {
        if let Some(map) = map {
            tracing::warn!(user, system = ?system, "ident map {map} cannot be matched");
        }
        return Err(SessionError::Fatal(ErrorResponse::fatal(
            sqlstate::INVALID_AUTHORIZATION,
            format!("peer authentication failed for user \"{user}\""),
        )));
    }
    admit_known(rt, req).await
}

/// Whether `system` (an OS user, or a certificate's name) may log in as `user`: through the
/// hba line's ident map, or without one by being the same name.
fn maps_to(rt: &Runtime, map: Option<&str>, system: &str, user: &str) -> bool {
    let Some(map) = map else {
        return system == user;
    };
    let hba = rt.edge.hba.load();
    hba.as_ref()
        .as_ref()
        .is_some_and(|h| h.ident_permits(map, system, user))
}

/// What pgward may log in to the server with after a password check against `secret`: the
/// secret itself when it came from auth_query (the auth file's secrets reach the pool from
/// the file).
fn reusable(secret: Option<&Secret>, from_query: bool) -> Option<Credential> {
    match secret? {
        Secret::Plain(p) if from_query => Some(Credential::Password(p.clone())),
        Secret::Md5(m) if from_query => Some(Credential::Md5Secret(m.clone())),
        _ => None,
    }
}

fn failed(user: &str) -> SessionError {
    SessionError::Fatal(ErrorResponse::fatal(
        sqlstate::INVALID_PASSWORD,
        format!("password authentication failed for user \"{user}\""),
    ))
}

/// A SCRAM exchange that failed, in PgBouncer's words (PostgreSQL says "password
/// authentication failed" here too; scripts written against PgBouncer match these).
fn sasl_failed() -> SessionError {
    SessionError::Fatal(ErrorResponse::fatal(
        sqlstate::INVALID_PASSWORD,
        "SASL authentication failed",
    ))
}

/// Reads the client's 'p' message.
async fn read_password_message(io: &mut ClientIo) -> Result<bytes::Bytes, SessionError> {
    let frame = io.read_frame().await?;
    if frame.tag() != wire::frontend::tag::PASSWORD {
        return Err(SessionError::Fatal(ErrorResponse::fatal(
            sqlstate::PROTOCOL_VIOLATION,
            format!(
                "expected a password response, got message type '{}'",
                char::from(frame.tag())
            ),
        )));
    }
    Ok(frame.body())
}

/// Runs a password's key derivation on the blocking pool: its iteration count comes from a
/// stored secret (a role may set its own), and the loop that serves every other client must
/// not wait for it, as PostgreSQL spends it in the one connection's backend. At most
/// [`Runtime::derivations`] run at once: tries against a costly secret queue behind each
/// other rather than fill the blocking pool.
async fn off_the_loop(
    rt: &Runtime,
    derive: impl FnOnce() -> ScramSecret + Send + 'static,
) -> Result<ScramSecret, SessionError> {
    let stopped = || {
        SessionError::Fatal(ErrorResponse::fatal(
            sqlstate::INTERNAL_ERROR,
            "the password check stopped".to_string(),
        ))
    };
    // The turn goes with the work: a login that gives up its wait (a timeout) does not give
    // it back while the derivation still runs.
    let turn = Arc::clone(&rt.derivations).acquire_owned().await;
    let turn = turn.map_err(|_| stopped())?;
    tokio::task::spawn_blocking(move || {
        let derived = derive();
        drop(turn);
        derived
    })
    .await
    .map_err(|_| stopped())
}

async fn plain(
    io: &mut ClientIo,
    rt: &Runtime,
    user: &str,
    secret: Option<&Secret>,
    from_query: bool,
) -> Result<Authenticated, SessionError> {
    let mut out = BytesMut::new();
    wire::encode_auth_cleartext(&mut out);
    io.send(&out).await?;
    let body = read_password_message(io).await?;
    let given = wire::parse_password(&body)?;
    if given.is_empty() {
        // As PostgreSQL: never compared, whatever the secret is of.
        return Err(SessionError::Fatal(ErrorResponse::fatal(
            sqlstate::INVALID_PASSWORD,
            "empty password returned by client".to_string(),
        )));
    }
    let given = String::from_utf8_lossy(&given);
    let ok = match secret {
        Some(Secret::Plain(p)) => wire::ct_eq(p.as_bytes(), given.as_bytes()),
        Some(Secret::Md5(m)) => {
            wire::ct_eq(m.as_bytes(), wire::md5_secret(user, &given).as_bytes())
        }
        Some(Secret::Scram(s)) => match ScramSecret::parse(s) {
            Some(sec) => {
                let given = given.to_string();
                let (salt, iterations) = (sec.salt.clone(), sec.iterations);
                let again = off_the_loop(rt, move || {
                    ScramSecret::from_password(&given, &salt, iterations)
                });
                wire::ct_eq(&again.await?.stored_key, &sec.stored_key)
            }
            None => false,
        },
        None => false,
    };
    if ok {
        Ok(Authenticated {
            credential: reusable(secret, from_query),
        })
    } else {
        Err(failed(user))
    }
}

async fn md5(
    io: &mut ClientIo,
    user: &str,
    secret: Option<&Secret>,
    from_query: bool,
) -> Result<Authenticated, SessionError> {
    let mut salt = [0u8; 4];
    rand::thread_rng().fill_bytes(&mut salt);
    let mut out = BytesMut::new();
    wire::encode_auth_md5(&mut out, salt);
    io.send(&out).await?;
    let body = read_password_message(io).await?;
    let given = wire::parse_password(&body)?;
    let expected = match secret {
        Some(Secret::Plain(p)) => Some(wire::md5_response_from_password(user, p, salt)),
        Some(Secret::Md5(m)) => Some(wire::md5_response(m, salt)),
        _ => None,
    };
    match expected {
        Some(e) if wire::ct_eq(e.as_bytes(), &given) => Ok(Authenticated {
            credential: reusable(secret, from_query),
        }),
        _ => Err(failed(user)),
    }
}

async fn scram(
    io: &mut ClientIo,
    rt: &Runtime,
    user: &str,
    secret: Option<&Secret>,
    from_query: bool,
) -> Result<Authenticated, SessionError> {
    let offered = secret;
    let (scram_secret, stored) = match secret {
        Some(Secret::Scram(s)) => match ScramSecret::parse(s) {
            Some(sec) => (Some(sec), true),
            None => (None, false),
        },
        Some(Secret::Plain(p)) => {
            let (seed, user, password) = (rt.mock_key, user.to_string(), p.clone());
            let derived = off_the_loop(rt, move || ScramSecret::of_plain(&seed, &user, &password));
            (Some(derived.await?), false)
        }
        _ => (None, false),
    };
    let known = scram_secret.is_some();
    let secret = scram_secret.unwrap_or_else(|| ScramSecret::mock(&rt.mock_key, user));
    let server_key = secret.server_key;
    let mut server = ScramServer::new(secret, wire::random_nonce());

    let mut out = BytesMut::new();
    wire::encode_auth_sasl(&mut out, &["SCRAM-SHA-256"]);
    io.send(&out).await?;

    let body = read_password_message(io).await?;
    let (mechanism, data) = wire::parse_sasl_initial(&body)?;
    if mechanism != "SCRAM-SHA-256" {
        return Err(SessionError::Fatal(ErrorResponse::fatal(
            sqlstate::PROTOCOL_VIOLATION,
            "client selected an invalid SASL authentication mechanism".to_string(),
        )));
    }
    let first = server.first(&data).map_err(|_| sasl_failed())?;
    out.clear();
    wire::encode_auth_sasl_continue(&mut out, &first);
    io.send(&out).await?;

    let body = read_password_message(io).await?;
    let outcome = server.finish(&body).map_err(|_| sasl_failed())?;
    if !known {
        return Err(sasl_failed());
    }
    out.clear();
    wire::encode_auth_sasl_final(&mut out, &outcome.server_final);
    io.send(&out).await?;
    let credential = if stored {
        Some(Credential::ScramKeys {
            client_key: outcome.client_key,
            server_key,
        })
    } else {
        reusable(offered, from_query)
    };
    Ok(Authenticated { credential })
}
