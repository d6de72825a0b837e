//! TLS configurations built from the `client_tls_*` and `server_tls_*` settings with rustls:
//! the one pgward accepts clients with, and the one it opens servers with.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::sign::{CertifiedKey, SingleCertAndKey};
use rustls::{ClientConfig, RootCertStore, ServerConfig, SupportedProtocolVersion};

use super::verify::{Anchors, ClientCheck, ServerCheck, ServerPolicy};
use super::x509::Certificate;
use crate::config::{Settings, SslMode};

pub use super::x509::common_name;

/// The ALPN protocol name PostgreSQL 17 uses (required for direct TLS).
pub const ALPN_POSTGRESQL: &[u8] = b"postgresql";

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{setting}: cannot read {path}: {reason}")]
    File {
        setting: &'static str,
        path: String,
        reason: String,
    },
    #[error("{setting}: {path} holds no certificate")]
    NoCertificate { setting: &'static str, path: String },
    #[error("{setting}: {path} holds a certificate that cannot be read")]
    BadCertificate { setting: &'static str, path: String },
    #[error("{key}: the key does not match the certificate of {cert}")]
    KeyMismatch {
        key: &'static str,
        cert: &'static str,
    },
    #[error("{0} is needed for TLS")]
    Missing(&'static str),
    #[error("{setting}: {reason}")]
    Protocols {
        setting: &'static str,
        reason: String,
    },
    #[error("TLS setup: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("client certificate check: {0}")]
    Verifier(String),
}

/// One side's TLS: the mode and, unless TLS is disabled, the rustls configuration.
#[derive(Clone)]
pub struct TlsSide<C> {
    pub mode: SslMode,
    /// `None` when the mode is `disable`.
    pub config: Option<Arc<C>>,
    /// The settings it was built from.
    pub source: TlsSource,
}

/// The settings one side's TLS is built from. Servers opened under other settings are
/// replaced when they come back to their pool, as PgBouncer does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSource {
    pub mode: SslMode,
    pub protocols: String,
    pub cert_file: String,
    pub key_file: String,
    pub ca_file: String,
}

impl TlsSource {
    /// The `client_tls_*` settings.
    pub fn client(s: &Settings) -> TlsSource {
        TlsSource {
            mode: s.client_tls_sslmode,
            protocols: s.client_tls_protocols.clone(),
            cert_file: s.client_tls_cert_file.clone(),
            key_file: s.client_tls_key_file.clone(),
            ca_file: s.client_tls_ca_file.clone(),
        }
    }

    /// The `server_tls_*` settings.
    pub fn server(s: &Settings) -> TlsSource {
        TlsSource {
            mode: s.server_tls_sslmode,
            protocols: s.server_tls_protocols.clone(),
            cert_file: s.server_tls_cert_file.clone(),
            key_file: s.server_tls_key_file.clone(),
            ca_file: s.server_tls_ca_file.clone(),
        }
    }

    /// TLS off.
    fn disabled() -> TlsSource {
        TlsSource {
            mode: SslMode::Disable,
            protocols: String::new(),
            cert_file: String::new(),
            key_file: String::new(),
            ca_file: String::new(),
        }
    }
}

/// How pgward treats clients' TLS (pgward is the TLS server).
pub type ClientTls = TlsSide<ServerConfig>;
/// How pgward asks servers for TLS (pgward is the TLS client).
pub type ServerTls = TlsSide<ClientConfig>;

impl<C> TlsSide<C> {
    /// No TLS.
    pub fn disabled() -> Self {
        TlsSide {
            mode: SslMode::Disable,
            config: None,
            source: TlsSource::disabled(),
        }
    }

    /// Whether a peer without TLS is refused.
    pub fn required(&self) -> bool {
        matches!(
            self.mode,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull
        )
    }
}

impl<C> fmt::Debug for TlsSide<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tls({:?})", self.mode)
    }
}

/// An sslmode as the configuration file spells it.
pub fn mode_name(mode: SslMode) -> &'static str {
    match mode {
        SslMode::Disable => "disable",
        SslMode::Allow => "allow",
        SslMode::Prefer => "prefer",
        SslMode::Require => "require",
        SslMode::VerifyCa => "verify-ca",
        SslMode::VerifyFull => "verify-full",
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Builds the client-facing TLS setup from the settings, reading the files now.
pub fn client_tls(s: &Settings) -> Result<ClientTls, TlsError> {
    if s.client_tls_sslmode == SslMode::Disable {
        return Ok(ClientTls::disabled());
    }
    let provider = provider();
    let key = certified_key(
        &provider,
        ("client_tls_cert_file", &s.client_tls_cert_file),
        ("client_tls_key_file", &s.client_tls_key_file),
    )?;
    let versions = protocols("client_tls_protocols", &s.client_tls_protocols)?;
    let verify = matches!(
        s.client_tls_sslmode,
        SslMode::VerifyCa | SslMode::VerifyFull
    );
    let builder =
        ServerConfig::builder_with_provider(provider.clone()).with_protocol_versions(&versions)?;
    let builder = if s.client_tls_ca_file.is_empty() {
        if verify {
            return Err(TlsError::Missing("client_tls_ca_file"));
        }
        builder.with_no_client_auth()
    } else {
        let (roots, anchors) = read_roots("client_tls_ca_file", &s.client_tls_ca_file)?;
        let verifier =
            WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone());
        // Below verify-ca a certificate is optional, but one that is offered is checked, so
        // auth_type = cert never sees an unchecked name.
        let verifier = if verify {
            verifier
        } else {
            verifier.allow_unauthenticated()
        };
        let verifier = verifier
            .build()
            .map_err(|e| TlsError::Verifier(e.to_string()))?;
        let algs = provider.signature_verification_algorithms;
        builder.with_client_cert_verifier(Arc::new(ClientCheck::new(verifier, anchors, algs)))
    };
    let mut config = builder.with_cert_resolver(Arc::new(SingleCertAndKey::from(key)));
    config.alpn_protocols = vec![ALPN_POSTGRESQL.to_vec()];
    Ok(ClientTls {
        mode: s.client_tls_sslmode,
        config: Some(Arc::new(config)),
        source: TlsSource::client(s),
    })
}

/// Builds the server-facing TLS setup from the settings, reading the files now.
pub fn server_tls(s: &Settings) -> Result<ServerTls, TlsError> {
    if s.server_tls_sslmode == SslMode::Disable {
        return Ok(ServerTls::disabled());
    }
    let provider = provider();
    let versions = protocols("server_tls_protocols", &s.server_tls_protocols)?;
    let builder =
        ClientConfig::builder_with_provider(provider.clone()).with_protocol_versions(&versions)?;
    let policy = server_policy(s, &provider)?;
    let verifier = Arc::new(ServerCheck::new(
        policy,
        provider.signature_verification_algorithms,
    ));
    let builder = builder
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let mut config = match (
        s.server_tls_cert_file.is_empty(),
        s.server_tls_key_file.is_empty(),
    ) {
        (true, true) => builder.with_no_client_auth(),
        _ => {
            let key = certified_key(
                &provider,
                ("server_tls_cert_file", &s.server_tls_cert_file),
                ("server_tls_key_file", &s.server_tls_key_file),
            )?;
            builder.with_client_cert_resolver(Arc::new(SingleCertAndKey::from(key)))
        }
    };
    config.alpn_protocols = vec![ALPN_POSTGRESQL.to_vec()];
    Ok(ServerTls {
        mode: s.server_tls_sslmode,
        config: Some(Arc::new(config)),
        source: TlsSource::server(s),
    })
}

/// What `server_tls_sslmode` checks of a server's certificate.
fn server_policy(s: &Settings, provider: &Arc<CryptoProvider>) -> Result<ServerPolicy, TlsError> {
    let names = match s.server_tls_sslmode {
        SslMode::VerifyCa => false,
        SslMode::VerifyFull => true,
        _ => return Ok(ServerPolicy::Unchecked),
    };
    if s.server_tls_ca_file.is_empty() {
        return Err(TlsError::Missing("server_tls_ca_file"));
    }
    let (roots, anchors) = read_roots("server_tls_ca_file", &s.server_tls_ca_file)?;
    let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| TlsError::Verifier(e.to_string()))?;
    Ok(match names {
        true => ServerPolicy::ChainAndName { webpki, anchors },
        false => ServerPolicy::Chain { webpki, anchors },
    })
}

/// Reads a certificate chain and its private key, and checks that the key is the
/// certificate's. The certificate itself is not judged: it is what the peer checks (an
/// X.509 version 1 certificate is fine here, as it is for OpenSSL).
fn certified_key(
    provider: &CryptoProvider,
    (cert_setting, cert_path): (&'static str, &str),
    (key_setting, key_path): (&'static str, &str),
) -> Result<CertifiedKey, TlsError> {
    let certs = read_certs(cert_setting, cert_path)?;
    let key = read_key(key_setting, key_path)?;
    let signer = provider.key_provider.load_private_key(key)?;
    let first = certs.first().and_then(|c| Certificate::parse(c));
    let Some(first) = first else {
        return Err(TlsError::BadCertificate {
            setting: cert_setting,
            path: cert_path.to_string(),
        });
    };
    if signer.public_key().is_some_and(|spki| *spki != *first.spki) {
        return Err(TlsError::KeyMismatch {
            key: key_setting,
            cert: cert_setting,
        });
    }
    Ok(CertifiedKey::new(certs, signer))
}

fn file_error(setting: &'static str, path: &str, reason: impl fmt::Display) -> TlsError {
    TlsError::File {
        setting,
        path: path.to_string(),
        reason: reason.to_string(),
    }
}

fn read_certs(setting: &'static str, path: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    if path.is_empty() {
        return Err(TlsError::Missing(setting));
    }
    let certs = CertificateDer::pem_file_iter(Path::new(path))
        .map_err(|e| file_error(setting, path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(setting, path, e))?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            setting,
            path: path.to_string(),
        });
    }
    Ok(certs)
}

fn read_key(setting: &'static str, path: &str) -> Result<PrivateKeyDer<'static>, TlsError> {
    if path.is_empty() {
        return Err(TlsError::Missing(setting));
    }
    PrivateKeyDer::from_pem_file(Path::new(path)).map_err(|e| file_error(setting, path, e))
}

/// The CA file as webpki's trust anchors, and as read (for the certificates webpki
/// declines, checked in [`super::verify`]).
fn read_roots(setting: &'static str, path: &str) -> Result<(RootCertStore, Anchors), TlsError> {
    let certs = read_certs(setting, path)?;
    let mut roots = RootCertStore::empty();
    for cert in &certs {
        roots
            .add(cert.clone())
            .map_err(|e| file_error(setting, path, e))?;
    }
    Ok((roots, certs.into()))
}

/// The TLS versions a `*_tls_protocols` value allows, of those rustls offers (1.2 and 1.3):
/// names `tlsv1.0` to `tlsv1.3`, `all`, `secure`, `default`, `legacy`, separated by commas,
/// colons or spaces, each optionally negated with `!`.
pub fn protocols(
    setting: &'static str,
    value: &str,
) -> Result<Vec<&'static SupportedProtocolVersion>, TlsError> {
    let mut allowed = [false; 4];
    for word in value.split([',', ':', ' ', '\t']).filter(|w| !w.is_empty()) {
        let (negate, name) = match word.strip_prefix('!') {
            Some(rest) => (true, rest),
            None => (false, word),
        };
        let versions: &[usize] = match name.to_ascii_lowercase().as_str() {
            "tlsv1.0" => &[0],
            "tlsv1.1" => &[1],
            "tlsv1.2" => &[2],
            "tlsv1.3" => &[3],
            "all" | "legacy" => &[0, 1, 2, 3],
            "secure" | "default" => &[2, 3],
            other => {
                return Err(TlsError::Protocols {
                    setting,
                    reason: format!("unknown protocol {other:?}"),
                })
            }
        };
        for v in versions {
            if let Some(slot) = allowed.get_mut(*v) {
                *slot = !negate;
            }
        }
    }
    let mut out = Vec::new();
    if allowed[2] {
        out.push(&rustls::version::TLS12);
    }
    if allowed[3] {
        out.push(&rustls::version::TLS13);
    }
    if out.is_empty() {
        return Err(TlsError::Protocols {
            setting,
            reason: format!("{value:?} allows neither TLS 1.2 nor TLS 1.3"),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocol_lists() {
        assert_eq!(protocols("p", "secure").unwrap().len(), 2);
        assert_eq!(protocols("p", "all").unwrap().len(), 2);
        assert_eq!(protocols("p", "tlsv1.3").unwrap().len(), 1);
        assert_eq!(protocols("p", "all,!tlsv1.2").unwrap().len(), 1);
        assert!(protocols("p", "tlsv1.0,tlsv1.1").is_err());
        assert!(protocols("p", "sslv3").is_err());
    }
}
