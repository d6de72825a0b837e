//! The auth file (`auth_file`, usually `userlist.txt`).
//!
//! Each line holds at least two double-quoted fields, the user name and its secret; `""`
//! inside a field stands for one `"`. Text between and after the fields is ignored, as are
//! blank lines and lines starting with `;`. Any other line is an error: PgBouncer logs such
//! a line and ignores the rest of the file, here the whole file is refused so that a
//! damaged file is noticed.

use std::collections::HashMap;
use std::path::Path;

use super::error::ConfigError;
use super::ini::read_text;

/// Longest user name accepted, in bytes (PgBouncer's limit is 128 including the terminator).
pub const MAX_USERNAME: usize = 127;
/// Longest secret accepted, in bytes.
pub const MAX_PASSWORD: usize = 65530;

/// A stored password, classified as PgBouncer does.
#[derive(Clone, PartialEq, Eq)]
pub enum Secret {
    /// A clear-text password.
    Plain(String),
    /// `md5` followed by 32 lowercase hex digits: md5(password + user).
    Md5(String),
    /// `SCRAM-SHA-256$<iterations>:<salt>$<storedkey>:<serverkey>`.
    Scram(String),
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self {
            Secret::Plain(_) => "Plain",
            Secret::Md5(_) => "Md5",
            Secret::Scram(_) => "Scram",
        };
        write!(f, "Secret::{kind}(..)")
    }
}

impl Secret {
    /// Classifies a stored secret: MD5 hash, well-formed SCRAM secret, or else plain text.
    pub fn classify(s: String) -> Secret {
        if is_md5(&s) {
            Secret::Md5(s)
        } else if is_scram(&s) {
            Secret::Scram(s)
        } else {
            Secret::Plain(s)
        }
    }

    /// The secret as stored.
    pub fn as_str(&self) -> &str {
        match self {
            Secret::Plain(s) | Secret::Md5(s) | Secret::Scram(s) => s,
        }
    }
}

fn is_md5(s: &str) -> bool {
    s.len() == 35
        && s.starts_with("md5")
        && s.bytes()
            .skip(3)
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

fn is_scram(s: &str) -> bool {
    let Some(rest) = s.strip_prefix("SCRAM-SHA-256$") else {
        return false;
    };
    let Some((iter_salt, keys)) = rest.split_once('$') else {
        return false;
    };
    let (Some((iterations, salt)), Some((stored, server))) =
        (iter_salt.split_once(':'), keys.split_once(':'))
    else {
        return false;
    };
    iterations.parse::<i32>().is_ok()
        && base64_len(salt).is_some()
        && base64_len(stored) == Some(32)
        && base64_len(server) == Some(32)
}

/// Decoded length of standard padded base64 text, or `None` when it is not base64.
fn base64_len(s: &str) -> Option<usize> {
    if s.len() % 4 != 0 {
        return None;
    }
    let body = s.trim_end_matches('=');
    let pad = s.len() - body.len();
    let alphabet = |b: u8| b.is_ascii_alphanumeric() || b == b'+' || b == b'/';
    if pad > 2 || !body.bytes().all(alphabet) {
        return None;
    }
    Some(s.len() / 4 * 3 - pad)
}

/// Parses auth file text; `file` names it in errors. A later line for a user wins.
pub fn parse_userlist(text: &str, file: &str) -> Result<HashMap<String, Secret>, ConfigError> {
    let mut users = HashMap::new();
    for (index, line) in text.lines().enumerate() {
        let line = line.trim_start_matches(|c: char| c.is_ascii_whitespace());
        if line.is_empty() || line.starts_with(';') {
            continue;
        }
        let (user, secret) =
            parse_line(line).map_err(|msg| ConfigError::at(file, index + 1, msg))?;
        users.insert(user, Secret::classify(secret));
    }
    Ok(users)
}

/// Reads and parses the auth file at `path`.
pub fn load_userlist(path: &Path) -> Result<HashMap<String, Secret>, ConfigError> {
    let text = read_text(path)?;
    parse_userlist(&text, &path.display().to_string())
}

fn parse_line(line: &str) -> Result<(String, String), String> {
    let rest = line
        .strip_prefix('"')
        .ok_or("broken auth file: a line must start with a double-quoted user name")?;
    let (user, rest) = quoted_field(rest)?;
    if user.len() > MAX_USERNAME {
        return Err("user name too long in auth file".into());
    }
    let start = rest
        .find('"')
        .ok_or("broken auth file: password field missing")?;
    let (secret, _) = quoted_field(rest.get(start + 1..).unwrap_or(""))?;
    if secret.len() > MAX_PASSWORD {
        return Err("password too long in auth file".into());
    }
    Ok((user, secret))
}

/// Reads a field after its opening quote; returns it and the text after the closing quote.
fn quoted_field(s: &str) -> Result<(String, &str), String> {
    let mut field = String::new();
    let mut rest = s;
    loop {
        let end = rest
            .find('"')
            .ok_or("broken auth file: unterminated quoted field")?;
        field.push_str(rest.get(..end).unwrap_or(""));
        let after = rest.get(end + 1..).unwrap_or("");
        match after.strip_prefix('"') {
            Some(after_escape) => {
                field.push('"');
                rest = after_escape;
            }
            None => return Ok((field, after)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCRAM: &str = "SCRAM-SHA-256$4096:c2FsdHNhbHRzYWx0$\
        AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=:\
        BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBA=";

    #[test]
    fn classify() {
        let md5 = "md545f2603610af569b6155c45067268c6b".to_string();
        assert_eq!(Secret::classify(md5.clone()), Secret::Md5(md5));
        assert!(matches!(
            Secret::classify("md5short".into()),
            Secret::Plain(_)
        ));
        assert!(matches!(
            Secret::classify("md545F2603610AF569B6155C45067268C6B".into()),
            Secret::Plain(_)
        ));
        assert!(matches!(Secret::classify(SCRAM.into()), Secret::Scram(_)));
        assert!(matches!(
            Secret::classify("SCRAM-SHA-256$x".into()),
            Secret::Plain(_)
        ));
        assert!(matches!(
            Secret::classify("secret".into()),
            Secret::Plain(_)
        ));
        assert_eq!(
            format!("{:?}", Secret::Plain("hunter2".into())),
            "Secret::Plain(..)"
        );
    }

    #[test]
    fn parse_lines() {
        let text = format!(
            "; comment\n\n  \"alice\" \"md545f2603610af569b6155c45067268c6b\"\n\
             \"bob\"\t\"pa\"\"ss\" trailing junk\n\"carol\" \"{SCRAM}\"\n\"bob\" \"second\"\n\
             \"\" \"\"\n"
        );
        let users = parse_userlist(&text, "userlist.txt").unwrap();
        assert!(matches!(users["alice"], Secret::Md5(_)));
        assert_eq!(users["bob"], Secret::Plain("second".into()));
        assert!(matches!(users["carol"], Secret::Scram(_)));
        assert_eq!(users[""], Secret::Plain(String::new()));
        let users = parse_userlist("\"a\"\"b\" \"p\"\"\"\"q\"", "f").unwrap();
        assert_eq!(users["a\"b"], Secret::Plain("p\"\"q".into()));
    }

    #[test]
    fn errors_carry_line() {
        for (text, line) in [
            ("\"a\" \"b\"\nalice password\n", 2),
            ("\"a\"\n", 1),
            ("\"a\" \"b\"\n\n\"c\" \"unterminated\n", 3),
            ("\"a\n", 1),
            ("# hash comments are not comments in an auth file\n", 1),
        ] {
            match parse_userlist(text, "u.txt") {
                Err(ConfigError::At { file, line: l, .. }) => {
                    assert_eq!((file.as_str(), l), ("u.txt", line))
                }
                other => panic!("{text:?}: {other:?}"),
            }
        }
        let long = format!("\"{}\" \"p\"", "u".repeat(200));
        assert!(parse_userlist(&long, "f").is_err());
    }

    #[test]
    fn load_from_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("userlist.txt");
        std::fs::write(&path, "\"u\" \"p\"\n").unwrap();
        assert_eq!(
            load_userlist(&path).unwrap()["u"],
            Secret::Plain("p".into())
        );
        assert!(matches!(
            load_userlist(&dir.path().join("missing")),
            Err(ConfigError::Io { .. })
        ));
    }
}
