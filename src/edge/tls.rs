//! TLS configurations built from the `client_tls_*` and `server_tls_*` settings with rustls:
//! the one pgward accepts clients with, and the one it opens servers with.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig,
    SignatureScheme, SupportedProtocolVersion,
};

use crate::config::{Settings, SslMode};

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

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Builds the client-facing TLS setup from the settings, reading the files now.
pub fn client_tls(s: &Settings) -> Result<ClientTls, TlsError> {
    if s.client_tls_sslmode == SslMode::Disable {
        return Ok(ClientTls::disabled());
    }
    let provider = provider();
    let certs = read_certs("client_tls_cert_file", &s.client_tls_cert_file)?;
    let key = read_key("client_tls_key_file", &s.client_tls_key_file)?;
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
        let roots = read_roots("client_tls_ca_file", &s.client_tls_ca_file)?;
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
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
        builder.with_client_cert_verifier(verifier)
    };
    let mut config = builder.with_single_cert(certs, key)?;
    config.alpn_protocols = vec![ALPN_POSTGRESQL.to_vec()];
    Ok(ClientTls {
        mode: s.client_tls_sslmode,
        config: Some(Arc::new(config)),
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
    let chain = match s.server_tls_sslmode {
        SslMode::VerifyCa | SslMode::VerifyFull => {
            if s.server_tls_ca_file.is_empty() {
                return Err(TlsError::Missing("server_tls_ca_file"));
            }
            let roots = read_roots("server_tls_ca_file", &s.server_tls_ca_file)?;
            let webpki =
                WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                    .build()
                    .map_err(|e| TlsError::Verifier(e.to_string()))?;
            Some((webpki, s.server_tls_sslmode == SslMode::VerifyFull))
        }
        _ => None,
    };
    let verifier = Arc::new(ServerCheck { provider, chain });
    let builder = builder
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let mut config = match (
        s.server_tls_cert_file.is_empty(),
        s.server_tls_key_file.is_empty(),
    ) {
        (true, true) => builder.with_no_client_auth(),
        _ => {
            let certs = read_certs("server_tls_cert_file", &s.server_tls_cert_file)?;
            let key = read_key("server_tls_key_file", &s.server_tls_key_file)?;
            builder.with_client_auth_cert(certs, key)?
        }
    };
    config.alpn_protocols = vec![ALPN_POSTGRESQL.to_vec()];
    Ok(ServerTls {
        mode: s.server_tls_sslmode,
        config: Some(Arc::new(config)),
    })
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

fn read_roots(setting: &'static str, path: &str) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in read_certs(setting, path)? {
        roots.add(cert).map_err(|e| file_error(setting, path, e))?;
    }
    Ok(roots)
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

/// How a server's certificate is checked. prefer and require check nothing but the
/// handshake signature (libpq's sslmode=require); verify-ca also checks the chain against
/// `server_tls_ca_file`; verify-full also the host name.
#[derive(Debug)]
struct ServerCheck {
    provider: Arc<CryptoProvider>,
    /// The chain verifier and whether the host name is checked too.
    chain: Option<(Arc<WebPkiServerVerifier>, bool)>,
}

impl ServerCertVerifier for ServerCheck {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some((chain, check_name)) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if !check_name => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// The first commonName (OID 2.5.4.3) in the subject of a DER certificate.
pub fn common_name(der: &[u8]) -> Option<String> {
    let (_, cert, _) = der_item(der, 0x30)?;
    let (_, tbs, _) = der_item(cert, 0x30)?;
    let mut rest = tbs;
    if rest.first() == Some(&0xa0) {
        rest = der_any(rest)?.2;
    }
    // serialNumber, signature, issuer, validity
    for _ in 0..4 {
        rest = der_any(rest)?.2;
    }
    let (_, mut subject, _) = der_item(rest, 0x30)?;
    while !subject.is_empty() {
        let (_, set, next) = der_item(subject, 0x31)?;
        subject = next;
        let mut attrs = set;
        while !attrs.is_empty() {
            let (_, attr, after) = der_item(attrs, 0x30)?;
            attrs = after;
            let (_, oid, value) = der_item(attr, 0x06)?;
            if oid == [0x55, 0x04, 0x03] {
                let (tag, text, _) = der_any(value)?;
                return decode_string(tag, text);
            }
        }
    }
    None
}

fn decode_string(tag: u8, bytes: &[u8]) -> Option<String> {
    match tag {
        // BMPString: UTF-16 big-endian.
        0x1e => {
            let units: Vec<u16> = bytes
                .chunks_exact(2)
                .map(|c| u16::from_be_bytes([c[0], c[1]]))
                .collect();
            String::from_utf16(&units).ok()
        }
        _ => String::from_utf8(bytes.to_vec()).ok(),
    }
}

/// One DER element with the expected tag: (tag, contents, what follows).
fn der_item(input: &[u8], tag: u8) -> Option<(u8, &[u8], &[u8])> {
    der_any(input).filter(|(t, _, _)| *t == tag)
}

/// One DER element: (tag, contents, what follows). Lengths are checked against the input.
fn der_any(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let (bytes, rest) = rest.split_at(n);
        let len = bytes
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        (len, rest)
    };
    if rest.len() < len {
        return None;
    }
    let (contents, after) = rest.split_at(len);
    Some((tag, contents, after))
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

    #[test]
    fn common_name_of_generated_certificates() {
        let mut params = rcgen::CertificateParams::new(vec!["localhost".into()]).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "pgward");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "alice");
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        assert_eq!(common_name(cert.der()).as_deref(), Some("alice"));
        // No common name at all.
        let params = rcgen::CertificateParams::new(vec!["x".into()]).unwrap();
        let mut params = params;
        params.distinguished_name = rcgen::DistinguishedName::new();
        let cert = params.self_signed(&key).unwrap();
        assert_eq!(common_name(cert.der()), None);
    }

    #[test]
    fn garbage_is_no_name() {
        assert_eq!(common_name(&[]), None);
        assert_eq!(common_name(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]), None);
        assert_eq!(common_name(&[0x30, 0x02, 0x30, 0x00]), None);
        for len in 0..64u8 {
            let bytes: Vec<u8> = (0..len).map(|i| i.wrapping_mul(37)).collect();
            let _ = common_name(&bytes);
        }
    }
}
