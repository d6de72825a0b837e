//! Opening and logging in a server connection.

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{BackendKey, Credential, ServerAddr, ServerConn, ServerError, ServerTarget};
use crate::net::Stream;
use crate::params::{ParamSet, Tracked};
use crate::wire::{self, AuthRequest, Backend, ScramClient, ScramCredential, TxStatus};

/// Connects and logs in within `timeout`, then runs the target's `connect_query`.
pub async fn connect(
    target: &ServerTarget,
    credential: &Credential,
    tracked: &Tracked,
    timeout: Duration,
    id: u64,
    max_message: usize,
) -> Result<ServerConn, ServerError> {
    let (entry, addr) = target.hosts.pick();
    // A server counts as opened when its connect starts (as PgBouncer's connect_time): a
    // RECONNECT or a changed connection string during the connect and login closes it too.
    let started = Instant::now();
    let attempt = async {
        let stream = negotiate_tls(addr.connect(&target.keepalive).await?, &addr, target).await?;
        let now = Instant::now();
        let mut conn = ServerConn {
            id,
            stream,
            rbuf: BytesMut::with_capacity(16 * 1024),
            params: ParamSet::default(),
            welcome: Vec::new(),
            key: BackendKey {
                pid: 0,
                secret: Bytes::new(),
            },
            addr: addr.clone(),
            created: started,
            last_used: now,
            tx: TxStatus::Idle,
            reusable: true,
            statements: Default::default(),
            internal_busy: false,
            last_tenant: None,
            home: None,
            max_message,
        };
        login(&mut conn, target, credential, tracked).await?;
        if let Some(sql) = &target.connect_query {
            conn.run_configured(sql, tracked).await?;
        }
        Ok(conn)
    };
    let result = tokio::time::timeout(timeout, attempt)
        .await
        .map_err(|_| ServerError::Timeout)
        .and_then(|r| r);
    match &result {
        Ok(conn) if target.log.connections => {
            target.hosts.succeeded(entry);
            tracing::info!(
                server = id,
                "{}@{addr} new connection to server (from {})",
                target.database,
                conn.stream.local_label()
            );
        }
        Ok(_) => target.hosts.succeeded(entry),
        Err(_) => target.hosts.failed(entry),
    }
    result
}

/// Asks a TCP server for TLS when `server_tls_sslmode` says so: SSLRequest, then a handshake
/// on 'S'; on 'N' plain text goes on unless TLS is required. Exactly one byte is read
/// before the handshake, so nothing sent in the clear can pass for encrypted data.
async fn negotiate_tls(
    stream: Stream,
    addr: &ServerAddr,
    target: &ServerTarget,
) -> Result<Stream, ServerError> {
    let (Some(config), ServerAddr::Tcp { host, .. }) = (&target.tls.config, addr) else {
        return Ok(stream);
    };
    let Stream::Tcp(plain) = stream else {
        return Ok(stream);
    };
    let mut tcp = plain.into_inner();
    let mut out = BytesMut::new();
    wire::encode_ssl_request(&mut out);
    tcp.write_all(&out).await?;
    match tcp.read_u8().await? {
        wire::ENCRYPTION_ACCEPTED => {
            let name = ServerName::try_from(host.clone())
                .map_err(|_| ServerError::Auth(format!("{host:?} is not a TLS server name")))?;
            let connector = tokio_rustls::TlsConnector::from(config.clone());
            let tls = connector
                .connect(name, tcp)
                .await
                .map_err(handshake_error)?;
            Ok(Stream::TlsOut(Box::new(tls)))
        }
        wire::ENCRYPTION_REFUSED if target.tls.required() => Err(ServerError::Auth(format!(
            "server does not support TLS and server_tls_sslmode is {:?}",
            target.tls.mode
        ))),
        wire::ENCRYPTION_REFUSED => Ok(Stream::from(tcp)),
        _ => Err(ServerError::Protocol("unexpected answer to SSLRequest")),
    }
}

async fn login(
    conn: &mut ServerConn,
    target: &ServerTarget,
    credential: &Credential,
    tracked: &Tracked,
) -> Result<(), ServerError> {
    let mut params: Vec<(&str, &str)> = vec![
        ("user", target.user.as_str()),
        ("database", target.database.as_str()),
    ];
    params.extend(
        target
            .startup_params
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str())),
    );
    let mut out = BytesMut::new();
    wire::encode_startup(&mut out, &params);
    conn.send(&out).await?;
    let mut scram: Option<ScramClient> = None;
    loop {
        let frame = conn.read_frame().await?;
        match wire::decode_backend(&frame)? {
            Backend::Auth(request) => {
                answer_auth(conn, target, credential, &mut scram, request).await?;
            }
            Backend::ParameterStatus { name, value } => {
                conn.note_parameter(&name, &value, tracked);
                conn.welcome.push((name, value));
            }
            Backend::BackendKeyData { pid, secret } => conn.key = BackendKey { pid, secret },
            Backend::ErrorResponse(fields) => return Err(ServerError::Refused(fields)),
            Backend::ReadyForQuery(status) => {
                conn.tx = status;
                return Ok(());
            }
            Backend::NoticeResponse(_) | Backend::NegotiateProtocolVersion => {}
            _ => return Err(ServerError::Protocol("unexpected message during login")),
        }
    }
}

async fn answer_auth(
    conn: &mut ServerConn,
    target: &ServerTarget,
    credential: &Credential,
    scram: &mut Option<ScramClient>,
    request: AuthRequest,
) -> Result<(), ServerError> {
    let mut out = BytesMut::new();
    match request {
        AuthRequest::Ok if scram.is_some() => {
            // SCRAM proves the server too: AuthenticationOk before its signature was checked
            // is not a login pgward can trust.
            return Err(ServerError::Auth(
                "server ended SCRAM authentication without its final message".into(),
            ));
        }
        AuthRequest::Ok => return Ok(()),
        AuthRequest::CleartextPassword => match credential {
            Credential::Password(p) => wire::encode_password(&mut out, p.as_bytes()),
            _ => return Err(no_password(target, "a plain password")),
        },
        AuthRequest::Md5Password { salt } => {
            let answer = match credential {
                Credential::Password(p) => wire::md5_response_from_password(&target.user, p, salt),
                Credential::Md5Secret(s) => wire::md5_response(s, salt),
                _ => return Err(no_password(target, "an MD5 password")),
            };
            wire::encode_password(&mut out, answer.as_bytes());
        }
        AuthRequest::Sasl { mechanisms } => {
            if !mechanisms.iter().any(|m| m == "SCRAM-SHA-256") {
                return Err(ServerError::Auth(
                    "server offers no SASL mechanism pgward supports".into(),
                ));
            }
            let cred = match credential {
                Credential::Password(p) => ScramCredential::Password(p.clone()),
                Credential::ScramKeys {
                    client_key,
                    server_key,
                } => ScramCredential::Keys {
                    client_key: *client_key,
                    server_key: *server_key,
                },
                _ => return Err(no_password(target, "a SCRAM password")),
            };
            let client = ScramClient::new(cred, wire::random_nonce());
            wire::encode_sasl_initial(&mut out, "SCRAM-SHA-256", &client.client_first());
            *scram = Some(client);
        }
        AuthRequest::SaslContinue { data } => {
            let client = scram
                .as_mut()
                .ok_or(ServerError::Protocol("SASL continue before SASL start"))?;
            let reply = client
                .handle_server_first(&data)
                .map_err(|e| ServerError::Auth(e.to_string()))?;
            wire::encode_sasl_response(&mut out, &reply);
        }
        AuthRequest::SaslFinal { data } => {
            let client = scram
                .take()
                .ok_or(ServerError::Protocol("SASL final before SASL start"))?;
            client
                .handle_server_final(&data)
                .map_err(|e| ServerError::Auth(e.to_string()))?;
            return Ok(());
        }
        AuthRequest::Other(code) => {
            return Err(ServerError::Auth(format!(
                "server asks for authentication method {code}, which pgward does not support"
            )))
        }
    }
    conn.send(&out).await
}

fn no_password(target: &ServerTarget, what: &str) -> ServerError {
    ServerError::Auth(format!(
        "wrong password type: server asks for {what} for user \"{}\" and pgward has none usable (set password= in [databases] or add the user to auth_file)",
        target.user
    ))
}

/// A failed TLS handshake with the server: what TLS refused (a certificate, a protocol
/// version: rustls's error, as invalid data) fails the login for good; the connection lost
/// meanwhile (reset, closed) is tried again, as any connect that failed.
fn handshake_error(e: std::io::Error) -> ServerError {
    match e.kind() {
        std::io::ErrorKind::InvalidData => {
            ServerError::Auth(format!("TLS handshake with the server: {e}"))
        }
        _ => ServerError::Io(e),
    }
}
