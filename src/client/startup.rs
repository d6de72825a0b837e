//! The startup phase: SSL and GSS requests, cancel requests, the startup message and its
//! parameters.

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;

use super::{ClientIo, SessionError};
use crate::params::Tracked;
use crate::runtime::Runtime;
use crate::wire::{self, sqlstate, ErrorResponse, StartupPacket};

/// What the client asked for in its startup message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartupRequest {
    pub user: String,
    pub database: String,
    /// Tracked parameters the client set, by canonical name.
    pub params: Vec<(String, String)>,
    /// The `replication` parameter: such a client gets a server of its own.
    pub replication: Replication,
    /// A replication client's `options`, passed to its server as they came: a server of its
    /// own can take any setting, even one that is not reported back.
    pub options: Option<String>,
    /// What `application_name_add_host` added to `application_name`.
    pub app_host: Option<AddedHost>,
}

impl StartupRequest {
    /// `application_name_add_host`: the client's `application_name` (`app` if it set none)
    /// followed by ` - ` and where it connects from, as PgBouncer names it.
    /// The policy still reads the name the client gave ([`StartupRequest::app_host`]).
    pub fn add_host(&mut self, details: &str) {
        let added = format!(" - {details}");
        let given = self
            .params
            .iter_mut()
            .find(|(n, _)| n == "application_name");
        let defaulted = given.is_none();
        match given {
            Some((_, value)) => value.push_str(&added),
            None => self.params.push((
                "application_name".to_string(),
                format!("{}{added}", DEFAULT_APP),
            )),
        }
        self.app_host = Some(AddedHost {
            suffix: Arc::from(added),
            defaulted,
        });
    }

    /// The `application_name` of the startup packet (with what `application_name_add_host`
    /// added), or "".
    pub fn application_name(&self) -> &str {
        self.params
            .iter()
            .find(|(n, _)| n == "application_name")
            .map_or("", |(_, v)| v.as_str())
    }

    /// The `application_name` the client gave, as the policy reads it: without what
    /// `application_name_add_host` added; "" if it gave none.
    pub fn own_application_name(&self) -> &str {
        without_host(self.application_name(), self.app_host.as_ref())
    }
}

/// What `application_name_add_host` added to a client's application_name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddedHost {
    /// ` - host:port`.
    pub suffix: Arc<str>,
    /// The client gave no name: pgward's `app` stands before the suffix.
    pub defaulted: bool,
}

/// `name` without what `added` says pgward added to it: the name the client gave ("" if it
/// gave none and still has pgward's).
pub fn without_host<'a>(name: &'a str, added: Option<&AddedHost>) -> &'a str {
    let Some(added) = added else {
        return name;
    };
    match name.strip_suffix(&*added.suffix) {
        Some(DEFAULT_APP) if added.defaulted => "",
        Some(own) => own,
        None => name,
    }
}

/// The name `application_name_add_host` puts before the host of a client that gave none.
pub const DEFAULT_APP: &str = "app";

/// What the `replication` startup parameter asks for, as PostgreSQL reads it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Replication {
    #[default]
    None,
    /// `replication=database`: a walsender connected to one database (SQL allowed).
    Logical,
    /// `replication=true` (or any other true boolean): a physical walsender.
    Physical,
}

impl Replication {
    /// Reads the parameter's value as PostgreSQL does: `database`, or a boolean.
    pub fn parse(value: &str) -> Result<Self, SessionError> {
        if value == "database" {
            return Ok(Replication::Logical);
        }
        match pg_bool(value) {
            Some(true) => Ok(Replication::Physical),
            Some(false) => Ok(Replication::None),
            None => Err(SessionError::Fatal(ErrorResponse::fatal(
                sqlstate::INVALID_PARAMETER_VALUE,
                format!("invalid value for parameter \"replication\": \"{value}\""),
            ))),
        }
    }

    /// The value sent to the server, as PgBouncer sends it; `None` for a normal client.
    pub fn startup_value(self) -> Option<&'static str> {
        match self {
            Replication::None => None,
            Replication::Logical => Some("database"),
            Replication::Physical => Some("yes"),
        }
    }

    /// The name SHOW CLIENTS and SHOW SOCKETS give it.
    pub fn label(self) -> &'static str {
        match self {
            Replication::None => "none",
            Replication::Logical => "logical",
            Replication::Physical => "physical",
        }
    }
}

pub enum Opening {
    Login(StartupRequest),
    /// A cancel request, already handled.
    Cancel,
}

/// Reads packets until a startup message or a cancel request.
pub async fn read_opening(io: &mut ClientIo, rt: &Arc<Runtime>) -> Result<Opening, SessionError> {
    super::tls::accept_direct(io, rt).await?;
    // Each encryption is negotiated at most once (or not at all after direct TLS); PostgreSQL
    // reads a second request as a startup packet of a protocol it does not speak.
    let (mut ssl_done, mut gss_done) = (io.stream.is_tls(), false);
    loop {
        let packet = loop {
            if let Some(p) = wire::decode_startup(&mut io.rbuf, io.max_message)? {
                break p;
            }
            io.fill().await?;
        };
        match packet {
            StartupPacket::SslRequest | StartupPacket::GssEncRequest => {
                if !io.rbuf.is_empty() {
                    return Err(protocol("data received before the encryption answer"));
                }
                let done = match packet {
                    StartupPacket::SslRequest => &mut ssl_done,
                    _ => &mut gss_done,
                };
                if std::mem::replace(done, true) {
                    return Err(protocol(
                        "unsupported frontend protocol: encryption was negotiated already",
                    ));
                }
                if packet == StartupPacket::GssEncRequest {
                    io.send(&[wire::ENCRYPTION_REFUSED]).await?;
                } else if super::tls::accept_requested(io, rt).await? {
                    // Inside TLS no other encryption is negotiated either.
                    gss_done = true;
                } else {
                    io.send(&[wire::ENCRYPTION_REFUSED]).await?;
                }
            }
            StartupPacket::Cancel { pid, secret } => {
                cancel_request(rt, pid, &secret).await;
                return Ok(Opening::Cancel);
            }
            StartupPacket::Startup { minor, params, .. } => {
                super::tls::check_required(io, rt)?;
                let protocol_options: Vec<String> = params
                    .iter()
                    .filter(|(k, _)| k.starts_with("_pq_."))
                    .map(|(k, _)| k.clone())
                    .collect();
                if minor > 0 || !protocol_options.is_empty() {
                    let mut out = BytesMut::new();
                    wire::encode_negotiate_protocol_version(&mut out, 0, &protocol_options);
                    io.send(&out).await?;
                }
                let settings = &rt.config.load().settings;
                let req = read_params(
                    params,
                    &rt.tracked.load(),
                    &settings.ignore_startup_parameters,
                )?;
                return Ok(Opening::Login(req));
            }
        }
    }
}

/// A CancelRequest: for a client of this instance, or under peering (`peer_id`) for one of
/// another, where it is forwarded (as PgBouncer does), so a cancel works through any
/// instance behind the same address.
async fn cancel_request(rt: &Runtime, pid: u32, secret: &[u8]) {
    use crate::cancel::PeerRoute;
    let config = rt.config.load();
    let limit = config
        .settings
        .cancel_wait_timeout
        .unwrap_or(Duration::from_secs(10));
    let own = config.settings.peer_id as u16;
    let Some(mut key) = <[u8; 4]>::try_from(secret).ok().filter(|_| own > 0) else {
        rt.cancels.cancel(pid, secret, limit);
        return;
    };
    match crate::cancel::peer_route(own, pid, &mut key) {
        PeerRoute::Here => rt.cancels.cancel(pid, &key, limit),
        PeerRoute::Spent => tracing::debug!("cancel request dropped: forwarded too often"),
        PeerRoute::Peer(id) => {
            let peer = config.peers.iter().find(|p| p.id == id);
            let dir = &config.settings.unix_socket_dir;
            let addr = peer.map(|p| crate::runtime::server_addr(p.host.clone(), p.port, dir));
            drop(config);
            match addr {
                Some(addr) => {
                    tracing::debug!(peer = id, "forwarding cancel request to peer");
                    crate::cancel::forward(addr, pid, key, limit).await;
                }
                None => tracing::debug!(peer = id, "cancel request for an unknown peer dropped"),
            }
        }
    }
}

/// Sorts startup parameters into tracked ones and ignored ones; anything else is refused,
/// as PgBouncer does, because it could not follow the client to another server.
pub fn read_params(
    params: Vec<(String, String)>,
    tracked: &Tracked,
    ignored: &[String],
) -> Result<StartupRequest, SessionError> {
    let mut user = None;
    let mut database = None;
    let mut set = Vec::new();
    let mut options = None;
    // Read first: it decides how `options` is read, wherever it stands in the packet.
    let replication = match params.iter().find(|(k, _)| k == "replication") {
        Some((_, value)) => Replication::parse(value)?,
        None => Replication::None,
    };
    for (key, value) in params {
        match key.as_str() {
            "user" => user = Some(value),
            "database" => database = Some(value),
            "replication" => {}
            "options" if replication != Replication::None => options = Some(value),
            "options" => {
                for (k, v) in parse_options(&value)? {
                    accept(&k, v, tracked, ignored, &mut set, true)?;
                }
            }
            k if k.starts_with("_pq_.") => {}
            _ => accept(&key, value, tracked, ignored, &mut set, false)?,
        }
    }
    let user = user
        .filter(|u| !u.is_empty())
        .ok_or(crate::wire::WireError::NoUser)?;
    let database = database
        .filter(|d| !d.is_empty())
        .unwrap_or_else(|| user.clone());
    Ok(StartupRequest {
        user,
        database,
        params: set,
        replication,
        options,
        app_host: None,
    })
}

fn accept(
    key: &str,
    value: String,
    tracked: &Tracked,
    ignored: &[String],
    set: &mut Vec<(String, String)>,
    from_options: bool,
) -> Result<(), SessionError> {
    let ignores = |name: &str| ignored.iter().any(|i| i.eq_ignore_ascii_case(name));
    if key.eq_ignore_ascii_case(crate::params::EXTRA_FLOAT_DIGITS) && ignores(key) {
        // Tracked, but listed: ignored as PgBouncer ignores it.
        return Ok(());
    }
    if let Some(name) = tracked.canonical(key) {
        set.retain(|(n, _)| n != name);
        set.push((name.to_string(), value));
        return Ok(());
    }
    let ignore_options = from_options && ignored.iter().any(|i| i.eq_ignore_ascii_case("options"));
    if ignore_options || ignored.iter().any(|i| i.eq_ignore_ascii_case(key)) {
        return Ok(());
    }
    let message = if from_options {
        format!("unsupported startup parameter in options: {key}")
    } else {
        format!("unsupported startup parameter: {key}")
    };
    Err(SessionError::Fatal(ErrorResponse::fatal(
        sqlstate::PROTOCOL_VIOLATION,
        message,
    )))
}

/// What PgBouncer says of an `options` value it cannot read, word for word.
const BAD_OPTIONS: &str =
    "unsupported options startup parameter: only '-c config=val' and '--config=val' are allowed";

/// Splits a libpq `options` value: `-c key=value`, `-ckey=value` and `--key=value`, separated
/// by white space, where a backslash escapes the next character.
pub fn parse_options(options: &str) -> Result<Vec<(String, String)>, SessionError> {
    let words = split_words(options);
    let mut out = Vec::new();
    let mut i = 0;
    while i < words.len() {
        let word = &words[i];
        let setting = if word == "-c" {
            i += 1;
            words.get(i).cloned().ok_or_else(|| protocol(BAD_OPTIONS))?
        } else if let Some(rest) = word.strip_prefix("--").or_else(|| word.strip_prefix("-c")) {
            rest.to_string()
        } else {
            return Err(protocol(BAD_OPTIONS));
        };
        let (k, v) = setting
            .split_once('=')
            .ok_or_else(|| protocol(BAD_OPTIONS))?;
        out.push((k.replace('-', "_"), v.to_string()));
        i += 1;
    }
    Ok(out)
}

fn split_words(s: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(n) = chars.next() {
                    cur.push(n);
                }
            }
            c if c.is_whitespace() => {
                if !cur.is_empty() {
                    words.push(std::mem::take(&mut cur));
                }
            }
            c => cur.push(c),
        }
    }
    if !cur.is_empty() {
        words.push(cur);
    }
    words
}

/// A boolean as PostgreSQL's `parse_bool` reads one: any case, a unique prefix of true,
/// false, yes or no, on, off (from "of"), 1 or 0.
fn pg_bool(value: &str) -> Option<bool> {
    let v = value.to_ascii_lowercase();
    let prefix_of = |word: &str, min: usize| v.len() >= min && word.starts_with(v.as_str());
    if prefix_of("true", 1) || prefix_of("yes", 1) || v == "on" || v == "1" {
        Some(true)
    } else if prefix_of("false", 1) || prefix_of("no", 1) || prefix_of("off", 2) || v == "0" {
        Some(false)
    } else {
        None
    }
}

fn protocol(msg: &str) -> SessionError {
    SessionError::Fatal(ErrorResponse::fatal(
        sqlstate::PROTOCOL_VIOLATION,
        msg.to_string(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn options_accept_c_and_double_dash() {
        let got = parse_options(r"-c search_path=a\ b --work-mem=64MB -cTimeZone=UTC").unwrap();
        assert_eq!(
            got,
            vec![
                ("search_path".to_string(), "a b".to_string()),
                ("work_mem".to_string(), "64MB".to_string()),
                ("TimeZone".to_string(), "UTC".to_string()),
            ]
        );
        assert!(parse_options("-x").is_err());
        assert!(parse_options("-c").is_err());
        assert!(parse_options("-c novalue").is_err());
    }

    #[test]
    fn tracked_params_are_kept_and_unknown_ones_refused() {
        let tracked = Tracked::new::<&str>(&[]);
        let req = read_params(
            params(&[
                ("user", "u"),
                ("datestyle", "ISO"),
                ("options", "-c timezone=UTC"),
            ]),
            &tracked,
            &[],
        )
        .unwrap();
        assert_eq!(req.database, "u");
        assert_eq!(
            req.params,
            params(&[("DateStyle", "ISO"), ("TimeZone", "UTC")])
        );
        assert!(read_params(
            params(&[("user", "u"), ("extra_float_digits", "3")]),
            &tracked,
            &[]
        )
        .is_err());
        let ok = read_params(
            params(&[("user", "u"), ("extra_float_digits", "3")]),
            &tracked,
            &["extra_float_digits".to_string()],
        );
        assert!(ok.is_ok());
        assert!(read_params(params(&[("database", "d")]), &tracked, &[]).is_err());
    }

    #[test]
    fn replication_is_read_as_postgresql_reads_it() {
        for (value, want) in [
            ("database", Replication::Logical),
            ("true", Replication::Physical),
            ("YES", Replication::Physical),
            ("on", Replication::Physical),
            ("1", Replication::Physical),
            ("t", Replication::Physical),
            ("off", Replication::None),
            ("of", Replication::None),
            ("no", Replication::None),
            ("0", Replication::None),
        ] {
            assert_eq!(Replication::parse(value).unwrap(), want, "{value}");
        }
        for bad in ["", "o", "Database", "2", "yess"] {
            assert!(Replication::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_replication_client_keeps_its_options_as_they_came() {
        let tracked = Tracked::new::<&str>(&[]);
        let options = "-c extra_float_digits=3 -c enable_seqscan=off";
        let req = read_params(
            params(&[
                ("options", options),
                ("user", "u"),
                ("replication", "database"),
            ]),
            &tracked,
            &[],
        )
        .unwrap();
        assert_eq!(req.replication, Replication::Logical);
        assert_eq!(req.options.as_deref(), Some(options));
        let normal = read_params(
            params(&[("user", "u"), ("options", options)]),
            &tracked,
            &[],
        );
        assert!(
            normal.is_err(),
            "a normal client cannot set what is not tracked"
        );
    }
}
