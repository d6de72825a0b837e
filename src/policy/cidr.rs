//! Client address ranges (`10.0.0.0/8`, `::1/128`, or a bare address).

use std::fmt;
use std::net::IpAddr;

/// An address range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(try_from = "String")]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Whether `ip` is in the range (IPv4-mapped IPv6 addresses count as IPv4).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                prefix_eq(&net.octets(), &ip.octets(), self.prefix)
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                prefix_eq(&net.octets(), &ip.octets(), self.prefix)
            }
            _ => false,
        }
    }
}

fn prefix_eq(a: &[u8], b: &[u8], prefix: u8) -> bool {
    let full = usize::from(prefix / 8);
    let rest = prefix % 8;
    if a.get(..full) != b.get(..full) {
        return false;
    }
    if rest == 0 {
        return true;
    }
    let mask = 0xffu8 << (8 - rest);
    matches!((a.get(full), b.get(full)), (Some(x), Some(y)) if x & mask == y & mask)
}

impl TryFrom<String> for Cidr {
    type Error = String;
    fn try_from(s: String) -> Result<Cidr, String> {
        let bad =
            || format!("invalid client address range {s:?} (want an address or address/prefix)");
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s.as_str(), None),
        };
        let addr: IpAddr = addr.trim().parse().map_err(|_| bad())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => p
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(bad)?,
            None => max,
        };
        Ok(Cidr { addr, prefix })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cidr(s: &str) -> Cidr {
        Cidr::try_from(s.to_string()).unwrap()
    }

    #[test]
    fn ranges() {
        assert!(cidr("10.0.0.0/8").contains("10.1.2.3".parse().unwrap()));
        assert!(!cidr("10.0.0.0/8").contains("11.1.2.3".parse().unwrap()));
        assert!(cidr("192.168.1.0/25").contains("192.168.1.127".parse().unwrap()));
        assert!(!cidr("192.168.1.0/25").contains("192.168.1.128".parse().unwrap()));
        assert!(cidr("127.0.0.1").contains("::ffff:127.0.0.1".parse().unwrap()));
        assert!(cidr("::1").contains("::1".parse().unwrap()));
        assert!(cidr("0.0.0.0/0").contains("8.8.8.8".parse().unwrap()));
        assert!(Cidr::try_from("10.0.0.0/33".to_string()).is_err());
        assert!(Cidr::try_from("nope".to_string()).is_err());
    }
}
