//! Client authentication by the pooler: trust, plain, md5 and scram-sha-256 against the
//! auth file.

use bytes::BytesMut;
use rand::RngCore;

use super::{ClientIo, SessionError};
use crate::config::{AuthType, Secret};
use crate::runtime::Runtime;
use crate::server::Credential;
use crate::wire::{self, sqlstate, ErrorResponse, ScramSecret, ScramServer};

/// Iterations for SCRAM secrets made from a plain password in the auth file.
const SCRAM_ITERATIONS: u32 = 4096;

/// A successful login; `credential` holds what the client proved that pgward may reuse to
/// log in to the server (SCRAM keys), if any.
pub struct Authenticated {
    pub credential: Option<Credential>,
}

/// Runs the exchange `auth_type` asks for. Unknown users go through the same exchange as
/// known ones and fail at the end, so a probe learns nothing.
pub async fn authenticate(
    io: &mut ClientIo,
    rt: &Runtime,
    user: &str,
) -> Result<Authenticated, SessionError> {
    let auth_type = rt.config.load().settings.auth_type;
    let secret = rt.userlist.load().get(user).cloned();
    match auth_type {
        AuthType::Trust | AuthType::Any => Ok(Authenticated { credential: None }),
        AuthType::Plain => plain(io, user, secret.as_ref()).await,
        AuthType::Md5 => match &secret {
            Some(Secret::Scram(_)) => scram(io, rt, user, secret.as_ref()).await,
            _ => md5(io, user, secret.as_ref()).await,
        },
        AuthType::ScramSha256 => scram(io, rt, user, secret.as_ref()).await,
        other => Err(SessionError::Fatal(ErrorResponse::fatal(
            sqlstate::FEATURE_NOT_SUPPORTED,
            format!("auth_type {other:?} is not supported by this pgward build"),
        ))),
    }
}

fn failed(user: &str) -> SessionError {
    SessionError::Fatal(ErrorResponse::fatal(
        sqlstate::INVALID_PASSWORD,
        format!("password authentication failed for user \"{user}\""),
    ))
}

/// Reads the client's 'p' message.
async fn read_password_message(io: &mut ClientIo) -> Result<bytes::Bytes, SessionError> {
    let frame = io.read_frame().await?;
    if frame.tag() != b'p' {
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

async fn plain(
    io: &mut ClientIo,
    user: &str,
    secret: Option<&Secret>,
) -> Result<Authenticated, SessionError> {
    let mut out = BytesMut::new();
    wire::encode_auth_cleartext(&mut out);
    io.send(&out).await?;
    let body = read_password_message(io).await?;
    let given = wire::parse_password(&body)?;
    let given = String::from_utf8_lossy(&given);
    let ok = match secret {
        Some(Secret::Plain(p)) => constant_eq(p.as_bytes(), given.as_bytes()),
        Some(Secret::Md5(m)) => {
            constant_eq(m.as_bytes(), wire::md5_secret(user, &given).as_bytes())
        }
        Some(Secret::Scram(s)) => ScramSecret::parse(s).is_some_and(|sec| {
            let again = ScramSecret::from_password(&given, &sec.salt, sec.iterations);
            constant_eq(&again.stored_key, &sec.stored_key)
        }),
        None => false,
    };
    if ok {
        Ok(Authenticated { credential: None })
    } else {
        Err(failed(user))
    }
}

async fn md5(
    io: &mut ClientIo,
    user: &str,
    secret: Option<&Secret>,
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
        Some(e) if constant_eq(e.as_bytes(), &given) => Ok(Authenticated { credential: None }),
        _ => Err(failed(user)),
    }
}

async fn scram(
    io: &mut ClientIo,
    rt: &Runtime,
    user: &str,
    secret: Option<&Secret>,
) -> Result<Authenticated, SessionError> {
    let (scram_secret, stored) = match secret {
        Some(Secret::Scram(s)) => match ScramSecret::parse(s) {
            Some(sec) => (Some(sec), true),
            None => (None, false),
        },
        Some(Secret::Plain(p)) => {
            let mut salt = [0u8; 16];
            rand::thread_rng().fill_bytes(&mut salt);
            (
                Some(ScramSecret::from_password(p, &salt, SCRAM_ITERATIONS)),
                false,
            )
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
    let first = server.first(&data).map_err(|_| failed(user))?;
    out.clear();
    wire::encode_auth_sasl_continue(&mut out, &first);
    io.send(&out).await?;

    let body = read_password_message(io).await?;
    let outcome = server.finish(&body).map_err(|_| failed(user))?;
    if !known {
        return Err(failed(user));
    }
    out.clear();
    wire::encode_auth_sasl_final(&mut out, &outcome.server_final);
    io.send(&out).await?;
    let credential = stored.then_some(Credential::ScramKeys {
        client_key: outcome.client_key,
        server_key,
    });
    Ok(Authenticated { credential })
}

fn constant_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
