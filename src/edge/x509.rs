//! A small reader of DER-encoded X.509 certificates: the fields pgward needs to check a
//! certificate webpki declines (an X.509 version 1 certificate, as `openssl ca` issues
//! without an extensions section, or a name only in the common name): issuer, subject,
//! validity, public key, signature, and the basicConstraints and subjectAltName extensions.
//!
//! Every length is checked against the input; malformed input gives `None`, never a panic.

use std::net::IpAddr;

/// OID 2.5.4.3, commonName.
const OID_COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];
/// OID 2.5.29.19, basicConstraints.
const OID_BASIC_CONSTRAINTS: &[u8] = &[0x55, 0x1d, 0x13];
/// OID 2.5.29.17, subjectAltName.
const OID_SUBJECT_ALT_NAME: &[u8] = &[0x55, 0x1d, 0x11];

const TAG_BOOLEAN: u8 = 0x01;
const TAG_INTEGER: u8 = 0x02;
const TAG_BIT_STRING: u8 = 0x03;
const TAG_OCTET_STRING: u8 = 0x04;
const TAG_OID: u8 = 0x06;
const TAG_UTC_TIME: u8 = 0x17;
const TAG_GENERALIZED_TIME: u8 = 0x18;
const TAG_SEQUENCE: u8 = 0x30;
const TAG_SET: u8 = 0x31;
/// `[0] EXPLICIT` version.
const TAG_VERSION: u8 = 0xa0;
/// `[1]` and `[2] IMPLICIT` unique identifiers (version 2 and 3).
const TAG_ISSUER_UID: u8 = 0x81;
const TAG_SUBJECT_UID: u8 = 0x82;
/// `[3] EXPLICIT` extensions (version 3).
const TAG_EXTENSIONS: u8 = 0xa3;
/// GeneralName choices: dNSName `[2]` and iPAddress `[7]`.
const TAG_DNS_NAME: u8 = 0x82;
const TAG_IP_ADDRESS: u8 = 0x87;

/// One DER element.
#[derive(Debug, Clone, Copy)]
struct Element<'a> {
    tag: u8,
    contents: &'a [u8],
    /// The whole encoding: tag, length and contents.
    raw: &'a [u8],
}

/// The element at the start of `input` and what follows it. Only definite lengths of up to
/// four bytes are read; each is checked against the input.
fn element(input: &[u8]) -> Option<(Element<'_>, &[u8])> {
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
    let header = input.len() - rest.len();
    let (contents, after) = rest.split_at(len);
    let raw = input.get(..header + len)?;
    Some((Element { tag, contents, raw }, after))
}

/// The element at the start of `input` if it has tag `tag`.
fn expect(input: &[u8], tag: u8) -> Option<(Element<'_>, &[u8])> {
    element(input).filter(|(e, _)| e.tag == tag)
}

/// The element at the start of `input` if it has tag `tag`, else `None` and `input` whole.
fn optional(input: &[u8], tag: u8) -> (Option<Element<'_>>, &[u8]) {
    match expect(input, tag) {
        Some((e, rest)) => (Some(e), rest),
        None => (None, input),
    }
}

/// The bits of a BIT STRING with no unused bits (keys and signatures are whole bytes).
fn whole_bytes(bits: Element<'_>) -> Option<&[u8]> {
    match bits.contents.split_first() {
        Some((0, bytes)) if bits.tag == TAG_BIT_STRING => Some(bytes),
        _ => None,
    }
}

/// A parsed certificate, borrowing its DER encoding.
#[derive(Debug, Clone)]
pub struct Certificate<'a> {
    /// 0 for X.509 version 1, 1 for version 2, 2 for version 3.
    pub version: u8,
    /// The signed part, whole (what the issuer's signature covers).
    pub tbs: &'a [u8],
    /// The contents of the signatureAlgorithm AlgorithmIdentifier.
    pub signature_algorithm: &'a [u8],
    pub signature: &'a [u8],
    /// The issuer's and subject's Names, whole encodings (compared byte for byte).
    pub issuer: &'a [u8],
    pub subject: &'a [u8],
    /// Validity, in seconds since the Unix epoch.
    pub not_before: i64,
    pub not_after: i64,
    /// The SubjectPublicKeyInfo, whole.
    pub spki: &'a [u8],
    /// The contents of the public key's AlgorithmIdentifier.
    pub key_algorithm: &'a [u8],
    /// The subjectPublicKey bits.
    pub public_key: &'a [u8],
    /// The contents of the extensions SEQUENCE; empty when there are none.
    extensions: &'a [u8],
}

impl<'a> Certificate<'a> {
    /// Parses a DER certificate; `None` when it is malformed.
    pub fn parse(der: &'a [u8]) -> Option<Certificate<'a>> {
        let (cert, rest) = expect(der, TAG_SEQUENCE)?;
        if !rest.is_empty() {
            return None;
        }
        let (tbs, after) = expect(cert.contents, TAG_SEQUENCE)?;
        let (outer_alg, after) = expect(after, TAG_SEQUENCE)?;
        let (sig, after) = element(after)?;
        if !after.is_empty() {
            return None;
        }
        let mut out = Self::parse_tbs(tbs)?;
        if out.signature_algorithm != outer_alg.contents {
            // RFC 5280: the signed and the unsigned algorithm must agree.
            return None;
        }
        out.signature = whole_bytes(sig)?;
        Some(out)
    }

    fn parse_tbs(tbs: Element<'a>) -> Option<Certificate<'a>> {
        let (version, rest) = optional(tbs.contents, TAG_VERSION);
        let version = match version {
            None => 0,
            Some(v) => match expect(v.contents, TAG_INTEGER)?.0.contents {
                [n @ 0..=2] => *n,
                _ => return None,
            },
        };
        let (_serial, rest) = expect(rest, TAG_INTEGER)?;
        let (alg, rest) = expect(rest, TAG_SEQUENCE)?;
        let (issuer, rest) = expect(rest, TAG_SEQUENCE)?;
        let (validity, rest) = expect(rest, TAG_SEQUENCE)?;
        let (subject, rest) = expect(rest, TAG_SEQUENCE)?;
        let (spki, rest) = expect(rest, TAG_SEQUENCE)?;
        let (_, rest) = optional(rest, TAG_ISSUER_UID);
        let (_, rest) = optional(rest, TAG_SUBJECT_UID);
        let (extensions, rest) = optional(rest, TAG_EXTENSIONS);
        if !rest.is_empty() || (extensions.is_some() && version != 2) {
            return None;
        }
        let extensions = match extensions {
            Some(e) => expect(e.contents, TAG_SEQUENCE)?.0.contents,
            None => &[],
        };
        let (not_before, rest) = element(validity.contents)?;
        let (not_after, _) = element(rest)?;
        let (key_alg, rest) = expect(spki.contents, TAG_SEQUENCE)?;
        let (key_bits, _) = element(rest)?;
        Some(Certificate {
            version,
            tbs: tbs.raw,
            signature_algorithm: alg.contents,
            signature: &[],
            issuer: issuer.raw,
            subject: subject.raw,
            not_before: time(not_before)?,
            not_after: time(not_after)?,
            spki: spki.raw,
            key_algorithm: key_alg.contents,
            public_key: whole_bytes(key_bits)?,
            extensions,
        })
    }

    /// Whether the certificate is valid at `now` (seconds since the Unix epoch).
    pub fn valid_at(&self, now: i64) -> bool {
        self.not_before <= now && now <= self.not_after
    }

    /// Whether the certificate may sign others: version 3 with basicConstraints cA TRUE.
    pub fn is_ca(&self) -> bool {
        let Some(value) = self.extension(OID_BASIC_CONSTRAINTS) else {
            return false;
        };
        let Some((seq, _)) = expect(value, TAG_SEQUENCE) else {
            return false;
        };
        matches!(expect(seq.contents, TAG_BOOLEAN), Some((flag, _)) if flag.contents.first().is_some_and(|b| *b != 0))
    }

    /// The DNS names and addresses of the subjectAltName extension.
    pub fn alt_names(&self) -> Vec<AltName> {
        let mut names = Vec::new();
        let Some(value) = self.extension(OID_SUBJECT_ALT_NAME) else {
            return names;
        };
        let Some((seq, _)) = expect(value, TAG_SEQUENCE) else {
            return names;
        };
        let mut rest = seq.contents;
        while let Some((name, after)) = element(rest) {
            rest = after;
            match name.tag {
                TAG_DNS_NAME => names.push(AltName::Dns(
                    String::from_utf8_lossy(name.contents).into_owned(),
                )),
                TAG_IP_ADDRESS => {
                    if let Some(ip) = ip_from_bytes(name.contents) {
                        names.push(AltName::Ip(ip));
                    }
                }
                _ => {}
            }
        }
        names
    }

    /// The first commonName of the subject.
    pub fn common_name(&self) -> Option<String> {
        let (subject, _) = expect(self.subject, TAG_SEQUENCE)?;
        let mut sets = subject.contents;
        while !sets.is_empty() {
            let (set, next) = expect(sets, TAG_SET)?;
            sets = next;
            let mut attrs = set.contents;
            while !attrs.is_empty() {
                let (attr, after) = expect(attrs, TAG_SEQUENCE)?;
                attrs = after;
                let (oid, value) = expect(attr.contents, TAG_OID)?;
                if oid.contents == OID_COMMON_NAME {
                    let (text, _) = element(value)?;
                    return decode_string(text.tag, text.contents);
                }
            }
        }
        None
    }

    /// The value (the contents of extnValue) of the extension `oid`.
    fn extension(&self, oid: &[u8]) -> Option<&'a [u8]> {
        let mut rest = self.extensions;
        while !rest.is_empty() {
            let (ext, after) = expect(rest, TAG_SEQUENCE)?;
            rest = after;
            let (id, fields) = expect(ext.contents, TAG_OID)?;
            if id.contents != oid {
                continue;
            }
            let (_, fields) = optional(fields, TAG_BOOLEAN);
            return expect(fields, TAG_OCTET_STRING).map(|(v, _)| v.contents);
        }
        None
    }
}

/// A subjectAltName entry pgward checks host names against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AltName {
    Dns(String),
    Ip(IpAddr),
}

fn ip_from_bytes(bytes: &[u8]) -> Option<IpAddr> {
    match bytes.len() {
        4 => <[u8; 4]>::try_from(bytes).ok().map(IpAddr::from),
        16 => <[u8; 16]>::try_from(bytes).ok().map(IpAddr::from),
        _ => None,
    }
}

/// The first commonName in the subject of a DER certificate.
pub fn common_name(der: &[u8]) -> Option<String> {
    Certificate::parse(der)?.common_name()
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

/// A UTCTime (`YYMMDDHHMMSSZ`, years 1950 to 2049) or GeneralizedTime (`YYYYMMDDHHMMSSZ`)
/// as seconds since the Unix epoch.
fn time(t: Element<'_>) -> Option<i64> {
    let (year, rest) = match t.tag {
        TAG_UTC_TIME => {
            let (yy, rest) = digits(t.contents, 2)?;
            (if yy < 50 { 2000 + yy } else { 1900 + yy }, rest)
        }
        TAG_GENERALIZED_TIME => digits(t.contents, 4)?,
        _ => return None,
    };
    let (month, rest) = digits(rest, 2)?;
    let (day, rest) = digits(rest, 2)?;
    let (hour, rest) = digits(rest, 2)?;
    let (minute, rest) = digits(rest, 2)?;
    let (second, rest) = digits(rest, 2)?;
    if rest != b"Z"
        || !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let days = days_from_civil(year, month, day);
    Some(days * 86_400 + hour * 3_600 + minute * 60 + second)
}

/// The first `n` bytes of `input` as a decimal number, and the rest.
fn digits(input: &[u8], n: usize) -> Option<(i64, &[u8])> {
    let head = input.get(..n)?;
    let rest = input.get(n..)?;
    let mut value = 0i64;
    for b in head {
        if !b.is_ascii_digit() {
            return None;
        }
        value = value * 10 + i64::from(b - b'0');
    }
    Some((value, rest))
}

/// Days from 1970-01-01 to the given date of the proleptic Gregorian calendar.
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let month_from_march = (month + 9) % 12;
    let day_of_year = (153 * month_from_march + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(text: &str) -> Option<i64> {
        let mut der = vec![TAG_UTC_TIME, text.len() as u8];
        der.extend_from_slice(text.as_bytes());
        time(element(&der)?.0)
    }

    fn generalized(text: &str) -> Option<i64> {
        let mut der = vec![TAG_GENERALIZED_TIME, text.len() as u8];
        der.extend_from_slice(text.as_bytes());
        time(element(&der)?.0)
    }

    #[test]
    fn times() {
        assert_eq!(utc("700101000000Z"), Some(0));
        assert_eq!(utc("000301000000Z"), Some(951_868_800));
        assert_eq!(generalized("20380119031408Z"), Some(2_147_483_648));
        assert_eq!(utc("491231235959Z"), Some(2_524_607_999));
        assert_eq!(generalized("19691231235959Z"), Some(-1));
        assert_eq!(utc("700101000000"), None);
        assert_eq!(utc("701301000000Z"), None);
        assert_eq!(utc("7001010000a0Z"), None);
        assert_eq!(generalized("2038011903140Z"), None);
    }

    fn generated(sans: &[&str], ca: bool) -> (rcgen::Certificate, rcgen::KeyPair) {
        let names: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
        let mut params = rcgen::CertificateParams::new(names).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "alice");
        if ca {
            params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        }
        let key = rcgen::KeyPair::generate().unwrap();
        (params.self_signed(&key).unwrap(), key)
    }

    #[test]
    fn fields_of_generated_certificates() {
        let (cert, key) = generated(&["localhost", "127.0.0.1"], false);
        let c = Certificate::parse(cert.der()).unwrap();
        assert_eq!(c.version, 2);
        assert_eq!(c.issuer, c.subject);
        assert_eq!(c.spki, key.public_key_der().as_slice());
        assert!(!c.is_ca());
        assert_eq!(
            c.alt_names(),
            vec![
                AltName::Dns("localhost".into()),
                AltName::Ip("127.0.0.1".parse().unwrap())
            ]
        );
        assert_eq!(c.common_name().as_deref(), Some("alice"));
        assert!(c.valid_at(c.not_before) && !c.valid_at(c.not_after + 1));
        let (ca, _) = generated(&[], true);
        assert!(Certificate::parse(ca.der()).unwrap().is_ca());
    }

    #[test]
    fn common_name_of_generated_certificates() {
        let (cert, _) = generated(&["x"], false);
        assert_eq!(common_name(cert.der()).as_deref(), Some("alice"));
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["x".into()]).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        let cert = params.self_signed(&key).unwrap();
        assert_eq!(common_name(cert.der()), None);
    }

    #[test]
    fn garbage_is_no_certificate() {
        assert!(Certificate::parse(&[]).is_none());
        assert!(Certificate::parse(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]).is_none());
        assert!(Certificate::parse(&[0x30, 0x02, 0x30, 0x00]).is_none());
        let (cert, _) = generated(&["x"], false);
        let der = cert.der().to_vec();
        for cut in 0..der.len() {
            assert!(Certificate::parse(&der[..cut]).is_none());
        }
        for i in 0..der.len() {
            let mut bent = der.clone();
            bent[i] ^= 0xa5;
            let _ = Certificate::parse(&bent).map(|c| (c.alt_names(), c.is_ca()));
        }
    }
}
