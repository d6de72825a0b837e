//! Certificates made for a test: a CA and the certificates it signs, written as PEM files.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};

/// A certificate authority made for one test.
pub struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

/// A certificate and its key, as files.
pub struct Issued {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Ca {
    /// A new self-signed CA named `name`.
    pub fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().expect("CA key");
        let cert = params.self_signed(&key).expect("CA certificate");
        Ca { cert, key }
    }

    /// Writes the CA certificate to `path` and returns the path.
    pub fn write(&self, path: &Path) -> PathBuf {
        fs::write(path, self.cert.pem()).expect("write CA certificate");
        path.to_path_buf()
    }

    /// A certificate for `cn` with subject alternative names `sans` (addresses or DNS
    /// names), written as `{stem}.crt` and `{stem}.key` (mode 0600) in `dir`.
    pub fn issue(&self, dir: &Path, stem: &str, cn: &str, sans: &[&str]) -> Issued {
        let names: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
        let mut params = CertificateParams::new(names).expect("certificate parameters");
        params.distinguished_name.push(DnType::CommonName, cn);
        let key = KeyPair::generate().expect("key");
        let cert = params
            .signed_by(&key, &self.cert, &self.key)
            .expect("signed certificate");
        let issued = Issued {
            cert: dir.join(format!("{stem}.crt")),
            key: dir.join(format!("{stem}.key")),
        };
        fs::write(&issued.cert, cert.pem()).expect("write certificate");
        fs::write(&issued.key, key.serialize_pem()).expect("write key");
        fs::set_permissions(&issued.key, fs::Permissions::from_mode(0o600)).expect("chmod key");
        issued
    }
}
