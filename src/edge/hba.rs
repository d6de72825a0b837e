//! `auth_hba_file`: the subset of pg_hba.conf that PgBouncer reads. Connection types `local`,
//! `host`, `hostssl`, `hostnossl`; database and user lists (`all`, `sameuser`, names, quoted
//! names, comma-separated; `samerole`, `samegroup` and regular expressions are refused);
//! addresses as CIDR, address and mask, or `all`; methods `trust`,
//! `reject`, `md5`, `scram-sha-256`, `password`, `cert` and `peer` (Unix sockets), the last
//! two with an optional `map=` naming a map of `auth_ident_file`. The first matching line
//! decides; no match refuses. Anything else is a load error naming the file and line.

use std::net::IpAddr;
use std::path::Path;

use crate::config::databases::is_console;
use crate::policy::Cidr;

#[derive(Debug, thiserror::Error)]
pub enum HbaError {
    #[error("cannot read {file}: {source}")]
    Io {
        file: String,
        source: std::io::Error,
    },
    #[error("{file}:{line}: {msg}")]
    Line {
        file: String,
        line: usize,
        msg: String,
    },
}

/// How a line asks the client to authenticate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HbaMethod {
    Trust,
    Reject,
    /// MD5, or SCRAM when the stored secret is a SCRAM secret (as PostgreSQL does).
    Md5,
    ScramSha256,
    Password,
    Cert,
    /// The client's OS user, read from its Unix socket, must be the user it logs in as (or
    /// be mapped to it).
    Peer,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ConnType {
    Local,
    Host,
    HostSsl,
    HostNoSsl,
}

/// One name in a database or user list.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Name {
    All,
    /// Database list only: the database named like the user.
    SameUser,
    /// Database list only: a physical replication connection (nothing else matches one).
    Replication,
    Literal(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum AddrMatch {
    Any,
    Net(Cidr),
}

/// One line of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HbaRule {
    conn: ConnType,
    databases: Vec<Name>,
    users: Vec<Name>,
    addr: AddrMatch,
    pub method: HbaMethod,
    /// The ident map (`map=`) of a `cert` or `peer` line.
    pub map: Option<String>,
    /// Line number in the file, for logs.
    pub line: usize,
}

/// One line of `auth_ident_file`: in map `map`, the system name `system` may log in as
/// `user` (`None`: as anyone).
#[derive(Debug, Clone, PartialEq, Eq)]
struct IdentLine {
    map: String,
    system: String,
    user: Option<String>,
}

/// The connection being judged.
#[derive(Debug, Clone, Copy)]
pub struct HbaPeer<'a> {
    /// `None` for a Unix socket.
    pub addr: Option<IpAddr>,
    pub tls: bool,
    pub database: &'a str,
    pub user: &'a str,
    /// A physical replication connection, which only the `replication` keyword matches.
    pub physical_replication: bool,
    /// A login to the console, which answers to each of its names: a line naming either
    /// matches (a PgBouncer file names only `pgbouncer`).
    pub console: bool,
}

/// A parsed hba file.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Hba {
    rules: Vec<HbaRule>,
    idents: Vec<IdentLine>,
}

impl Hba {
    /// Reads and parses `path`, and the ident map file `ident` if there is one. A `map=`
    /// that names no map of it is an error on its line.
    pub fn load(path: &Path, ident: Option<&Path>) -> Result<Hba, HbaError> {
        let mut hba = Hba::parse(&read(path)?, &path.display().to_string())?;
        if let Some(ident) = ident {
            hba.idents = parse_idents(&read(ident)?, &ident.display().to_string())?;
        }
        if let Some(rule) = hba.rules.iter().find(|r| {
            r.map
                .as_ref()
                .is_some_and(|m| !hba.idents.iter().any(|i| &i.map == m))
        }) {
            return Err(HbaError::Line {
                file: path.display().to_string(),
                line: rule.line,
                msg: format!(
                    "ident map \"{}\" is not in auth_ident_file",
                    rule.map.as_deref().unwrap_or_default()
                ),
            });
        }
        Ok(hba)
    }

    /// Whether ident map `map` lets system name `system` log in as `user`.
    pub fn ident_permits(&self, map: &str, system: &str, user: &str) -> bool {
        self.idents.iter().any(|i| {
            i.map == map && i.system == system && i.user.as_deref().is_none_or(|u| u == user)
        })
    }

    /// Parses hba text; `file` names it in errors.
    pub fn parse(text: &str, file: &str) -> Result<Hba, HbaError> {
        let mut rules = Vec::new();
        for (index, raw) in logical_lines(text) {
            let line = index + 1;
            let err = |msg: String| HbaError::Line {
                file: file.to_string(),
                line,
                msg,
            };
            let fields = tokenize(&raw).map_err(err)?;
            if fields.is_empty() {
                continue;
            }
            rules.push(parse_rule(fields, line).map_err(err)?);
        }
        Ok(Hba {
            rules,
            idents: Vec::new(),
        })
    }

    /// The first rule that matches, if any.
    pub fn find(&self, peer: &HbaPeer<'_>) -> Option<&HbaRule> {
        self.rules.iter().find(|r| r.matches(peer))
    }
}

impl HbaRule {
    fn matches(&self, peer: &HbaPeer<'_>) -> bool {
        let conn_ok = match (self.conn, peer.addr) {
            (ConnType::Local, None) => true,
            (ConnType::Host, Some(_)) => true,
            (ConnType::HostSsl, Some(_)) => peer.tls,
            (ConnType::HostNoSsl, Some(_)) => !peer.tls,
            _ => false,
        };
        let addr_ok = match (&self.addr, peer.addr) {
            (AddrMatch::Any, _) => true,
            (AddrMatch::Net(net), Some(ip)) => net.contains(ip),
            (AddrMatch::Net(_), None) => false,
        };
        conn_ok
            && addr_ok
            && self
                .databases
                .iter()
                .any(|d| match (d, peer.physical_replication) {
                    (Name::Replication, physical) => physical,
                    (_, true) => false,
                    (Name::All, false) => true,
                    (Name::SameUser, false) => peer.database == peer.user,
                    (Name::Literal(name), false) => {
                        name == peer.database || peer.console && is_console(name)
                    }
                })
            && self.users.iter().any(|u| match u {
                Name::All => true,
                Name::SameUser | Name::Replication => false,
                Name::Literal(name) => name == peer.user,
            })
    }
}

/// Joins lines ending in a backslash with the next (PostgreSQL 16 and later), keeping the
/// number of the first line.
fn logical_lines(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut pending: Option<(usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        let (start, mut acc) = pending.take().unwrap_or((i, String::new()));
        match line.strip_suffix('\\') {
            Some(head) => {
                acc.push_str(head);
                acc.push(' ');
                pending = Some((start, acc));
            }
            None => {
                acc.push_str(line);
                out.push((start, acc));
            }
        }
    }
    out.extend(pending);
    out
}

/// One item of a field: its text and whether it was quoted (a quoted `all` is a name).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Item {
    text: String,
    quoted: bool,
}

/// Splits a line into fields, each a comma-separated list of items. `#` starts a comment
/// outside quotes; a comma followed by white space continues the same field.
fn tokenize(line: &str) -> Result<Vec<Vec<Item>>, String> {
    let mut fields: Vec<Vec<Item>> = Vec::new();
    let mut chars = line.chars().peekable();
    let mut continues = false;
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        match chars.peek() {
            None | Some('#') => break,
            _ => {}
        }
        let mut item = Item {
            text: String::new(),
            quoted: false,
        };
        let mut in_quote = false;
        let mut ended_by_comma = false;
        while let Some(&c) = chars.peek() {
            if in_quote {
                chars.next();
                if c == '"' {
                    in_quote = false;
                } else {
                    item.text.push(c);
                }
                continue;
            }
            if c.is_whitespace() || c == '#' {
                break;
            }
            chars.next();
            match c {
                '"' => {
                    in_quote = true;
                    item.quoted = true;
                }
                ',' => {
                    ended_by_comma = true;
                    break;
                }
                _ => item.text.push(c),
            }
        }
        if in_quote {
            return Err("unterminated quoted string".into());
        }
        match fields.last_mut() {
            Some(last) if continues => last.push(item),
            _ => fields.push(vec![item]),
        }
        continues = ended_by_comma;
    }
    Ok(fields)
}

fn parse_rule(fields: Vec<Vec<Item>>, line: usize) -> Result<HbaRule, String> {
    let mut fields = fields.into_iter();
    let mut next = |what: &str| {
        fields
            .next()
            .ok_or_else(|| format!("end-of-line before {what} specification"))
    };
    let conn = match single(next("connection type")?, "connection type")?.as_str() {
        "local" => ConnType::Local,
        "host" => ConnType::Host,
        "hostssl" => ConnType::HostSsl,
        "hostnossl" => ConnType::HostNoSsl,
        other => return Err(format!("invalid connection type \"{other}\"")),
    };
    let databases = names(next("database")?, true)?;
    let users = names(next("role")?, false)?;
    let addr = if conn == ConnType::Local {
        AddrMatch::Any
    } else {
        let addr = single(next("IP address")?, "IP address")?;
        address(&addr, &mut next)?
    };
    let method = method(&single(
        next("authentication method")?,
        "authentication method",
    )?)?;
    let mut map = None;
    for option in fields {
        let text: Vec<String> = option.into_iter().map(|i| i.text).collect();
        let text = text.join(",");
        match text.split_once('=') {
            Some(("map", name)) if matches!(method, HbaMethod::Cert | HbaMethod::Peer) => {
                map = Some(name.to_string());
            }
            _ => return Err(format!("authentication option \"{text}\" is not supported")),
        }
    }
    if method == HbaMethod::Cert && conn != ConnType::HostSsl {
        return Err("cert authentication is only supported on hostssl connections".into());
    }
    if method == HbaMethod::Peer && conn != ConnType::Local {
        return Err("peer authentication is only supported on local sockets".into());
    }
    Ok(HbaRule {
        conn,
        databases,
        users,
        addr,
        method,
        map,
        line,
    })
}

fn read(path: &Path) -> Result<String, HbaError> {
    std::fs::read_to_string(path).map_err(|source| HbaError::Io {
        file: path.display().to_string(),
        source,
    })
}

/// Parses an ident map file (PostgreSQL's pg_ident.conf): `map system-name user` per line,
/// where `user` may be `all`. Regular expressions and groups are not supported.
fn parse_idents(text: &str, file: &str) -> Result<Vec<IdentLine>, HbaError> {
    let mut idents = Vec::new();
    for (index, raw) in logical_lines(text) {
        let err = |msg: String| HbaError::Line {
            file: file.to_string(),
            line: index + 1,
            msg,
        };
        let fields = tokenize(&raw).map_err(err)?;
        if fields.is_empty() {
            continue;
        }
        idents.push(ident_line(fields).map_err(err)?);
    }
    Ok(idents)
}

fn ident_line(fields: Vec<Vec<Item>>) -> Result<IdentLine, String> {
    let Ok([map, system, user]) = <[Vec<Item>; 3]>::try_from(fields) else {
        return Err("an ident map line has three fields: map, system user, user".into());
    };
    let single_item = |items: Vec<Item>, what: &str| match <[Item; 1]>::try_from(items) {
        Ok([item]) => Ok(item),
        Err(_) => Err(format!("multiple values in {what} field")),
    };
    let system = single_item(system, "system user")?;
    if !system.quoted && (system.text.starts_with('/') || system.text.starts_with('+')) {
        return Err("regular expressions and groups are not supported".into());
    }
    let user = single_item(user, "user")?;
    Ok(IdentLine {
        map: single_item(map, "map")?.text,
        system: system.text,
        user: (user.quoted || user.text != "all").then_some(user.text),
    })
}

fn single(items: Vec<Item>, what: &str) -> Result<String, String> {
    match <[Item; 1]>::try_from(items) {
        Ok([item]) => Ok(item.text),
        Err(_) => Err(format!("multiple values in {what} field")),
    }
}

fn names(items: Vec<Item>, database: bool) -> Result<Vec<Name>, String> {
    items
        .into_iter()
        .map(|item| match (item.quoted, item.text.as_str()) {
            (false, "all") => Ok(Name::All),
            (false, "sameuser") if database => Ok(Name::SameUser),
            (false, "replication") if database => Ok(Name::Replication),
            (false, t) if t.starts_with('@') || t.starts_with('+') => Err(format!(
                "\"{t}\": files and group membership are not supported"
            )),
            (false, t @ ("samerole" | "samegroup")) if database => {
                Err(format!("\"{t}\": group membership is not supported"))
            }
            (false, t) if t.starts_with('/') => Err(format!(
                "\"{t}\": regular expressions are not supported (quote the name to match it as it is)"
            )),
            (_, "") => Err("empty name in list".into()),
            (_, t) => Ok(Name::Literal(t.to_string())),
        })
        .collect()
}

fn address(
    addr: &str,
    next: &mut impl FnMut(&str) -> Result<Vec<Item>, String>,
) -> Result<AddrMatch, String> {
    match addr {
        "all" => return Ok(AddrMatch::Any),
        "samehost" | "samenet" => return Err(format!("\"{addr}\" is not supported")),
        _ => {}
    }
    let text = if addr.contains('/') {
        addr.to_string()
    } else {
        let ip: IpAddr = addr
            .parse()
            .map_err(|_| format!("invalid IP address \"{addr}\" (host names are not supported)"))?;
        let mask = single(next("netmask")?, "netmask")?;
        let prefix = mask_prefix(&mask, ip.is_ipv4())?;
        format!("{ip}/{prefix}")
    };
    Cidr::try_from(text)
        .map(AddrMatch::Net)
        .map_err(|_| format!("invalid CIDR mask in address \"{addr}\""))
}

/// The prefix length of a netmask like `255.255.255.0`.
fn mask_prefix(mask: &str, v4: bool) -> Result<u32, String> {
    let bad = || format!("invalid IP mask \"{mask}\"");
    let ip: IpAddr = mask.parse().map_err(|_| bad())?;
    let bits: u128 = match ip {
        IpAddr::V4(m) if v4 => u128::from(u32::from(m)) << 96,
        IpAddr::V6(m) if !v4 => u128::from(m),
        _ => return Err("IP address and mask do not match".into()),
    };
    let prefix = bits.leading_ones();
    if bits.checked_shl(prefix).unwrap_or(0) != 0 {
        return Err(bad());
    }
    Ok(prefix)
}

fn method(name: &str) -> Result<HbaMethod, String> {
    Ok(match name {
        "trust" => HbaMethod::Trust,
        "reject" => HbaMethod::Reject,
        "md5" => HbaMethod::Md5,
        "scram-sha-256" => HbaMethod::ScramSha256,
        "password" => HbaMethod::Password,
        "cert" => HbaMethod::Cert,
        "peer" => HbaMethod::Peer,
        other => {
            return Err(format!(
                "invalid or unsupported authentication method \"{other}\""
            ))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer<'a>(addr: Option<&str>, tls: bool, database: &'a str, user: &'a str) -> HbaPeer<'a> {
        HbaPeer {
            addr: addr.map(|a| a.parse().unwrap()),
            tls,
            database,
            user,
            physical_replication: false,
            console: is_console(database),
        }
    }

    #[test]
    fn a_line_naming_either_console_name_matches_the_console() {
        for named in ["pgbouncer", "pgward"] {
            let text = format!("host {named} all all reject\nhost all all all trust\n");
            let hba = Hba::parse(&text, "hba.conf").unwrap();
            for asked in ["pgbouncer", "pgward"] {
                let p = peer(Some("10.0.0.1"), false, asked, "admin");
                assert_eq!(
                    method_for(&hba, p),
                    Some(HbaMethod::Reject),
                    "{named} {asked}"
                );
            }
            let p = peer(Some("10.0.0.1"), false, "app", "admin");
            assert_eq!(method_for(&hba, p), Some(HbaMethod::Trust));
        }
    }

    fn method_for(hba: &Hba, p: HbaPeer<'_>) -> Option<HbaMethod> {
        hba.find(&p).map(|r| r.method)
    }

    const FILE: &str = r#"
# comment
local   all         all                         trust
hostssl app         alice     10.0.0.0/8        cert
hostnossl app       alice     10.0.0.0/8        reject
host    "all",sameuser  bob, carol  192.168.1.0 255.255.255.0  md5   # trailing
host    app,reports all       ::1/128           scram-sha-256
host    all         all       all               password
"#;

    #[test]
    fn first_matching_line_decides() {
        let hba = Hba::parse(FILE, "hba.conf").unwrap();
        use HbaMethod::*;
        assert_eq!(method_for(&hba, peer(None, false, "x", "y")), Some(Trust));
        assert_eq!(
            method_for(&hba, peer(Some("10.1.1.1"), true, "app", "alice")),
            Some(Cert)
        );
        assert_eq!(
            method_for(&hba, peer(Some("10.1.1.1"), false, "app", "alice")),
            Some(Reject)
        );
        // A quoted "all" is a database named all; sameuser matches bob's own database.
        assert_eq!(
            method_for(&hba, peer(Some("192.168.1.7"), false, "bob", "bob")),
            Some(Md5)
        );
        assert_eq!(
            method_for(&hba, peer(Some("192.168.1.7"), false, "all", "carol")),
            Some(Md5)
        );
        assert_eq!(
            method_for(&hba, peer(Some("192.168.1.7"), false, "app", "carol")),
            Some(Password)
        );
        assert_eq!(
            method_for(&hba, peer(Some("::1"), false, "reports", "dave")),
            Some(ScramSha256)
        );
        assert_eq!(
            hba.find(&peer(Some("::1"), false, "reports", "d"))
                .unwrap()
                .line,
            7
        );
    }

    #[test]
    fn only_the_replication_keyword_matches_physical_replication() {
        let hba = Hba::parse(
            "host replication rep all md5\nhost all all all trust\n",
            "hba.conf",
        )
        .unwrap();
        let physical = |user| HbaPeer {
            physical_replication: true,
            ..peer(Some("10.0.0.1"), false, "app", user)
        };
        assert_eq!(method_for(&hba, physical("rep")), Some(HbaMethod::Md5));
        assert_eq!(
            method_for(&hba, physical("other")),
            None,
            "all is not replication"
        );
        let logical = peer(Some("10.0.0.1"), false, "replication", "rep");
        assert_eq!(method_for(&hba, logical), Some(HbaMethod::Trust));
    }

    #[test]
    fn no_match_is_none() {
        let hba = Hba::parse("host app alice 10.0.0.0/8 trust\n", "f").unwrap();
        assert_eq!(
            method_for(&hba, peer(Some("11.0.0.1"), false, "app", "alice")),
            None
        );
        assert_eq!(method_for(&hba, peer(None, false, "app", "alice")), None);
    }

    #[test]
    fn continuation_lines() {
        let hba = Hba::parse("host app \\\n  alice 10.0.0.0/8 trust\n", "f").unwrap();
        assert_eq!(
            method_for(&hba, peer(Some("10.0.0.1"), false, "app", "alice")),
            Some(HbaMethod::Trust)
        );
    }

    #[test]
    fn errors_name_file_and_line() {
        let cases = [
            ("hots all all all trust", "invalid connection type"),
            ("host all all", "end-of-line before IP address"),
            (
                "host all all 10.0.0.0/8 ident",
                "unsupported authentication method",
            ),
            ("host all all 10.0.0.0/33 trust", "invalid CIDR"),
            ("host all all 10.0.0.1 255.0.255.0 trust", "invalid IP mask"),
            (
                "host all all example.com trust",
                "host names are not supported",
            ),
            ("host all +admins all trust", "group membership"),
            ("host samerole all all reject", "group membership"),
            ("host samegroup all all reject", "group membership"),
            ("host all /^etl_ all reject", "regular expressions"),
            ("host /^app all all reject", "regular expressions"),
            ("host all all all trust map=x", "option"),
            ("host all all all peer", "local sockets"),
            ("local all all peer opt=1", "option"),
            ("host all all all cert", "hostssl"),
            ("host \"app all all all trust", "unterminated"),
        ];
        for (line, want) in cases {
            let text = format!("# first\n{line}\n");
            let err = Hba::parse(&text, "hba.conf").unwrap_err().to_string();
            assert!(err.starts_with("hba.conf:2: "), "{line}: {err}");
            assert!(err.contains(want), "{line}: {err}");
        }
    }

    #[test]
    fn peer_and_cert_lines_name_ident_maps() {
        let dir = std::env::temp_dir().join(format!("pgward-hba-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (hba_path, ident_path) = (dir.join("hba.conf"), dir.join("ident.conf"));
        std::fs::write(
            &hba_path,
            "local all all peer map=mymap\nhostssl all all all cert map=certs\n",
        )
        .unwrap();
        std::fs::write(
            &ident_path,
            "# map system user\nmymap alice postgres\nmymap alice \"bob\"\ncerts \"host.example\" all\n",
        )
        .unwrap();
        let hba = Hba::load(&hba_path, Some(&ident_path)).unwrap();
        let local = peer(None, false, "app", "postgres");
        assert_eq!(method_for(&hba, local), Some(HbaMethod::Peer));
        assert_eq!(hba.find(&local).unwrap().map.as_deref(), Some("mymap"));
        assert!(hba.ident_permits("mymap", "alice", "postgres"));
        assert!(hba.ident_permits("mymap", "alice", "bob"));
        assert!(!hba.ident_permits("mymap", "alice", "carol"));
        assert!(!hba.ident_permits("mymap", "mallory", "postgres"));
        assert!(hba.ident_permits("certs", "host.example", "anyone"), "all");
        // A map the ident file does not have is an error on its line.
        std::fs::write(&ident_path, "other alice postgres\n").unwrap();
        let err = Hba::load(&hba_path, Some(&ident_path))
            .unwrap_err()
            .to_string();
        assert!(err.contains("hba.conf:1: "), "{err}");
        assert!(err.contains("mymap"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn masks() {
        assert_eq!(mask_prefix("255.255.255.0", true), Ok(24));
        assert_eq!(mask_prefix("0.0.0.0", true), Ok(0));
        assert_eq!(mask_prefix("255.255.255.255", true), Ok(32));
        assert!(mask_prefix("ffff::", true).is_err());
        assert_eq!(mask_prefix("ffff:ffff::", false), Ok(32));
    }
}
