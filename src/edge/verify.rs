//! How pgward checks the other side's certificate, as a TLS client (of servers) and as a
//! TLS server (of clients).
//!
//! webpki checks every chain first. Two things it declines are accepted by OpenSSL, and so
//! by PostgreSQL, libpq and PgBouncer, and are common in certificates made with `openssl
//! ca`: an end certificate of X.509 version 1 (no extensions), and a host name given only in
//! the subject's common name. Those are checked here, as strictly as the rest: validity
//! dates, every signature up to a certificate of the CA file, intermediates that are CAs,
//! and the name in the common name only when the certificate has no subjectAltName names.

use std::net::IpAddr;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{
    verify_tls12_signature, verify_tls13_signature, verify_tls13_signature_with_raw_key,
    WebPkiSupportedAlgorithms,
};
use rustls::pki_types::{CertificateDer, ServerName, SubjectPublicKeyInfoDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, PeerMisbehaved};
use rustls::{Error, SignatureScheme};

use super::x509::Certificate;

/// Most certificates between an end certificate and the CA file's.
const MAX_INTERMEDIATES: usize = 6;

/// The CA file's certificates, as read.
pub type Anchors = Arc<[CertificateDer<'static>]>;

/// Whether webpki declines `der` for its version (anything but X.509 version 3).
fn is_legacy(der: &[u8]) -> bool {
    Certificate::parse(der).is_some_and(|c| c.version < 2)
}

/// Checks the chain of an end certificate webpki declines for its version: valid now, and
/// signed by a certificate of `anchors`, directly or through CA certificates of
/// `intermediates`.
pub fn legacy_chain(
    end_entity: &[u8],
    intermediates: &[CertificateDer<'_>],
    anchors: &[CertificateDer<'_>],
    algs: &WebPkiSupportedAlgorithms,
    now: UnixTime,
) -> Result<(), CertificateError> {
    let now = i64::try_from(now.as_secs()).unwrap_or(i64::MAX);
    let leaf = Certificate::parse(end_entity).ok_or(CertificateError::BadEncoding)?;
    if now < leaf.not_before {
        return Err(CertificateError::NotValidYet);
    }
    if now > leaf.not_after {
        return Err(CertificateError::Expired);
    }
    let roots: Vec<Certificate<'_>> = anchors
        .iter()
        .filter_map(|c| Certificate::parse(c))
        .collect();
    let cas: Vec<Certificate<'_>> = intermediates
        .iter()
        .filter_map(|c| Certificate::parse(c))
        .filter(|c| c.is_ca() && c.valid_at(now))
        .collect();
    let mut current = &leaf;
    for _ in 0..=MAX_INTERMEDIATES {
        let issued =
            |ca: &&Certificate<'_>| ca.subject == current.issuer && signed_by(current, ca, algs);
        if roots.iter().any(|r| issued(&r)) {
            return Ok(());
        }
        match cas.iter().find(issued) {
            Some(ca) => current = ca,
            None => break,
        }
    }
    Err(CertificateError::UnknownIssuer)
}

/// Whether `issuer`'s key signed `cert`.
fn signed_by(
    cert: &Certificate<'_>,
    issuer: &Certificate<'_>,
    algs: &WebPkiSupportedAlgorithms,
) -> bool {
    algs.all
        .iter()
        .filter(|a| *a.public_key_alg_id() == *issuer.key_algorithm)
        .filter(|a| *a.signature_alg_id() == *cert.signature_algorithm)
        .any(|a| {
            a.verify_signature(issuer.public_key, cert.tbs, cert.signature)
                .is_ok()
        })
}

/// Whether `name` matches the common name of `der`, a certificate without subjectAltName
/// names (with any, only they count, as in libpq and OpenSSL). A DNS name matches case
/// insensitively, or a leading `*.` wildcard standing for exactly one label; an address
/// matches a common name that is the same address.
pub fn common_name_matches(der: &[u8], name: &ServerName<'_>) -> bool {
    let Some(cert) = Certificate::parse(der) else {
        return false;
    };
    if !cert.alt_names().is_empty() {
        return false;
    }
    let Some(cn) = cert.common_name() else {
        return false;
    };
    match name {
        ServerName::DnsName(host) => dns_matches(&cn, host.as_ref()),
        ServerName::IpAddress(ip) => cn.parse::<IpAddr>().ok() == Some(IpAddr::from(*ip)),
        _ => false,
    }
}

fn dns_matches(pattern: &str, host: &str) -> bool {
    let host = host.trim_end_matches('.');
    let pattern = pattern.trim_end_matches('.');
    if pattern.eq_ignore_ascii_case(host) {
        return true;
    }
    match (pattern.strip_prefix("*."), host.split_once('.')) {
        (Some(suffix), Some((label, rest))) => {
            !label.is_empty() && !suffix.is_empty() && suffix.eq_ignore_ascii_case(rest)
        }
        _ => false,
    }
}

/// Checks a handshake signature made with the key of `cert`, whatever its version.
#[derive(Debug)]
struct Signatures(WebPkiSupportedAlgorithms);

impl Signatures {
    fn tls12(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        if !is_legacy(cert) {
            return verify_tls12_signature(message, cert, dss, &self.0);
        }
        let parsed = Certificate::parse(cert).ok_or(CertificateError::BadEncoding)?;
        let candidates = self
            .0
            .mapping
            .iter()
            .find(|(scheme, _)| *scheme == dss.scheme)
            .map(|(_, algs)| *algs)
            .ok_or(PeerMisbehaved::SignedHandshakeWithUnadvertisedSigScheme)?;
        let valid = candidates
            .iter()
            .filter(|a| *a.public_key_alg_id() == *parsed.key_algorithm)
            .any(|a| {
                a.verify_signature(parsed.public_key, message, dss.signature())
                    .is_ok()
            });
        match valid {
            true => Ok(HandshakeSignatureValid::assertion()),
            false => Err(CertificateError::BadSignature.into()),
        }
    }

    fn tls13(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        if !is_legacy(cert) {
            return verify_tls13_signature(message, cert, dss, &self.0);
        }
        let parsed = Certificate::parse(cert).ok_or(CertificateError::BadEncoding)?;
        let spki = SubjectPublicKeyInfoDer::from(parsed.spki);
        verify_tls13_signature_with_raw_key(message, &spki, dss, &self.0)
    }

    fn schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_schemes()
    }
}

/// The handshake-signature methods of both verifier traits, answered by the implementing
/// type's `signatures` field.
macro_rules! handshake_signatures {
    () => {
        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, Error> {
            self.signatures.tls12(message, cert, dss)
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, Error> {
            self.signatures.tls13(message, cert, dss)
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.signatures.schemes()
        }
    };
}

/// What is checked of a server's certificate, by `server_tls_sslmode`.
#[derive(Debug)]
pub enum ServerPolicy {
    /// prefer, allow, require: nothing but the handshake signature (libpq's
    /// sslmode=require).
    Unchecked,
    /// verify-ca: the chain, against the CA file.
    Chain {
        webpki: Arc<WebPkiServerVerifier>,
        anchors: Anchors,
    },
    /// verify-full: the chain and the host name.
    ChainAndName {
        webpki: Arc<WebPkiServerVerifier>,
        anchors: Anchors,
    },
}

/// pgward's check of a server's certificate.
#[derive(Debug)]
pub struct ServerCheck {
    policy: ServerPolicy,
    signatures: Signatures,
}

impl ServerCheck {
    pub fn new(policy: ServerPolicy, algs: WebPkiSupportedAlgorithms) -> ServerCheck {
        ServerCheck {
            policy,
            signatures: Signatures(algs),
        }
    }

    fn chain(
        &self,
        webpki: &WebPkiServerVerifier,
        anchors: &Anchors,
        names: bool,
        cert: Presented<'_, '_>,
    ) -> Result<ServerCertVerified, Error> {
        if is_legacy(cert.end_entity) {
            legacy_chain(
                cert.end_entity,
                cert.intermediates,
                anchors,
                &self.signatures.0,
                cert.now,
            )?;
            if names && !common_name_matches(cert.end_entity, cert.name) {
                return Err(CertificateError::NotValidForName.into());
            }
            return Ok(ServerCertVerified::assertion());
        }
        match webpki.verify_server_cert(
            cert.end_entity,
            cert.intermediates,
            cert.name,
            cert.ocsp,
            cert.now,
        ) {
            Err(Error::InvalidCertificate(
                e @ (CertificateError::NotValidForName
                | CertificateError::NotValidForNameContext { .. }),
            )) => match !names || common_name_matches(cert.end_entity, cert.name) {
                true => Ok(ServerCertVerified::assertion()),
                false => Err(Error::InvalidCertificate(e)),
            },
            other => other,
        }
    }
}

/// A server's certificate as presented, with what it is checked for.
#[derive(Clone, Copy)]
struct Presented<'c, 'n> {
    end_entity: &'c CertificateDer<'c>,
    intermediates: &'c [CertificateDer<'c>],
    name: &'c ServerName<'n>,
    ocsp: &'c [u8],
    now: UnixTime,
}

impl ServerCertVerifier for ServerCheck {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        let cert = Presented {
            end_entity,
            intermediates,
            name: server_name,
            ocsp,
            now,
        };
        match &self.policy {
            ServerPolicy::Unchecked => Ok(ServerCertVerified::assertion()),
            ServerPolicy::Chain { webpki, anchors } => self.chain(webpki, anchors, false, cert),
            ServerPolicy::ChainAndName { webpki, anchors } => {
                self.chain(webpki, anchors, true, cert)
            }
        }
    }

    handshake_signatures!();
}

/// pgward's check of a client's certificate: webpki's, with X.509 version 1 certificates
/// checked here.
#[derive(Debug)]
pub struct ClientCheck {
    webpki: Arc<dyn ClientCertVerifier>,
    anchors: Anchors,
    signatures: Signatures,
}

impl ClientCheck {
    pub fn new(
        webpki: Arc<dyn ClientCertVerifier>,
        anchors: Anchors,
        algs: WebPkiSupportedAlgorithms,
    ) -> ClientCheck {
        ClientCheck {
            webpki,
            anchors,
            signatures: Signatures(algs),
        }
    }
}

impl ClientCertVerifier for ClientCheck {
    fn offer_client_auth(&self) -> bool {
        self.webpki.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.webpki.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.webpki.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, Error> {
        if !is_legacy(end_entity) {
            return self
                .webpki
                .verify_client_cert(end_entity, intermediates, now);
        }
        legacy_chain(
            end_entity,
            intermediates,
            &self.anchors,
            &self.signatures.0,
            now,
        )?;
        Ok(ClientCertVerified::assertion())
    }

    handshake_signatures!();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_names_and_wildcards() {
        assert!(dns_matches("localhost", "LOCALHOST"));
        assert!(dns_matches("*.acme.org", "db.acme.org"));
        assert!(!dns_matches("*.acme.org", "acme.org"));
        assert!(!dns_matches("*.acme.org", "a.db.acme.org"));
        assert!(!dns_matches("*.acme.org", ".acme.org"));
        assert!(!dns_matches("db.acme.org", "acme.org"));
        assert!(!dns_matches("*.", "a."));
    }
}
