//! TLS from clients: an SSLRequest answered 'S' and a handshake, or direct TLS (PostgreSQL
//! 17's `sslnegotiation=direct`: a TLS ClientHello as the first bytes, ALPN "postgresql"
//! required), and the refusal of plain-text clients when `client_tls_sslmode` requires TLS.

use std::sync::Arc;

use super::{ClientIo, SessionError};
use crate::edge::tls::ALPN_POSTGRESQL;
use crate::net::Stream;
use crate::runtime::Runtime;
use crate::wire::{self, sqlstate, ErrorResponse};

/// The first byte of a TLS handshake record; no startup packet starts with it (its length
/// would be over 369 MB).
const TLS_HANDSHAKE: u8 = 0x16;

/// Upgrades a connection that opens with a TLS ClientHello, when TLS is enabled.
pub async fn accept_direct(io: &mut ClientIo, rt: &Arc<Runtime>) -> Result<(), SessionError> {
    if rt.edge.client_tls.load().config.is_none() || !io.rbuf.is_empty() {
        return Ok(());
    }
    if io.stream.peek_byte().await? != Some(TLS_HANDSHAKE) {
        return Ok(());
    }
    handshake(io, rt).await?;
    if io.stream.alpn() != Some(ALPN_POSTGRESQL) {
        return Err(SessionError::Fatal(ErrorResponse::fatal(
            sqlstate::PROTOCOL_VIOLATION,
            "received direct SSL connection request without ALPN protocol negotiation extension"
                .to_string(),
        )));
    }
    Ok(())
}

/// Answers an SSLRequest: 'S' and a handshake when TLS is enabled on a TCP connection
/// (returns true), else nothing is sent (returns false, the caller answers 'N').
pub async fn accept_requested(io: &mut ClientIo, rt: &Arc<Runtime>) -> Result<bool, SessionError> {
    if rt.edge.client_tls.load().config.is_none() || !io.stream.is_plain_tcp() {
        return Ok(false);
    }
    io.send(&[wire::ENCRYPTION_ACCEPTED]).await?;
    handshake(io, rt).await?;
    Ok(true)
}

/// Refuses a plain-text TCP client when TLS is required (a Unix socket is exempt, as in
/// PgBouncer), with the SQLSTATE PostgreSQL's hba refusal uses.
pub fn check_required(io: &ClientIo, rt: &Runtime) -> Result<(), SessionError> {
    if io.stream.is_plain_tcp() && rt.edge.client_tls.load().required() {
        return Err(SessionError::Fatal(ErrorResponse::fatal(
            sqlstate::INVALID_AUTHORIZATION,
            "SSL required".to_string(),
        )));
    }
    Ok(())
}

/// Runs the server side of a TLS handshake on the client's TCP socket. A failed handshake
/// ends the connection without a message (there is no channel to send one on).
async fn handshake(io: &mut ClientIo, rt: &Runtime) -> Result<(), SessionError> {
    let Some(config) = rt.edge.client_tls.load().config.clone() else {
        return Err(SessionError::Gone);
    };
    let Stream::Tcp(plain) = io.stream.take() else {
        return Err(SessionError::Gone);
    };
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    match acceptor.accept(plain.into_inner()).await {
        Ok(tls) => {
            io.stream = Stream::TlsIn(Box::new(tls));
            Ok(())
        }
        Err(e) => {
            tracing::debug!("client TLS handshake failed: {e}");
            Err(SessionError::Gone)
        }
    }
}
