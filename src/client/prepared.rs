//! A client's protocol-level prepared statements in transaction pooling: the client's names
//! map to pgward's server-side names, derived from the statement itself, so every server
//! holding the same statement holds it under the same name.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use sha2::{Digest, Sha256};

use crate::wire;

/// One statement as pgward prepares it on servers.
#[derive(Debug)]
pub struct Statement {
    pub server_name: Bytes,
    /// The Parse message that prepares it under `server_name`.
    pub parse: Bytes,
}

impl Statement {
    pub fn new(query: &[u8], param_types: &[u32]) -> Self {
        let server_name = server_name(query, param_types);
        let mut parse = BytesMut::new();
        wire::encode_parse(&mut parse, &server_name, query, param_types);
        Statement {
            server_name,
            parse: parse.freeze(),
        }
    }
}

/// `pgw_` and 128 bits of SHA-256 over the text and the parameter types: the same statement
/// gets the same name everywhere, and two different statements never share one in practice.
pub fn server_name(query: &[u8], param_types: &[u32]) -> Bytes {
    let mut h = Sha256::new();
    h.update((query.len() as u64).to_be_bytes());
    h.update(query);
    for t in param_types {
        h.update(t.to_be_bytes());
    }
    let digest = h.finalize();
    let mut name = String::with_capacity(36);
    name.push_str("pgw_");
    for byte in &digest[..16] {
        name.push_str(&format!("{byte:02x}"));
    }
    Bytes::from(name)
}

/// The client's statement names.
#[derive(Debug, Default)]
pub struct ClientStatements {
    by_name: HashMap<Bytes, Arc<Statement>>,
}

impl ClientStatements {
    pub fn get(&self, name: &[u8]) -> Option<&Arc<Statement>> {
        self.by_name.get(name)
    }

    pub fn insert(&mut self, name: Bytes, statement: Arc<Statement>) {
        self.by_name.insert(name, statement);
    }

    pub fn remove(&mut self, name: &[u8]) -> Option<Arc<Statement>> {
        self.by_name.remove(name)
    }

    pub fn clear(&mut self) {
        self.by_name.clear();
    }
}

/// What a simple Query does to prepared statements, read from its first words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Deallocation {
    None,
    /// `DEALLOCATE ALL` or `DISCARD ALL`.
    All,
    /// `DEALLOCATE [PREPARE] name`.
    One(Bytes),
}

/// Recognises DEALLOCATE and DISCARD ALL in a simple Query (one statement, optional trailing
/// semicolon). Anything it cannot read with certainty is `None`, and goes to the server
/// unchanged.
pub fn deallocation(sql: &[u8]) -> Deallocation {
    // Nearly every query starts with another word: it is known at its first letter. The
    // spaces skipped are PostgreSQL's (a vertical tab is one since PostgreSQL 17).
    let first_letter = sql
        .iter()
        .find(|b| !(b.is_ascii_whitespace() || **b == b'\x0b'));
    if !matches!(first_letter, Some(b'd' | b'D')) {
        return Deallocation::None;
    }
    let Ok(text) = std::str::from_utf8(sql) else {
        return Deallocation::None;
    };
    let text = text.trim().trim_end_matches(';').trim_end();
    let mut words = text.split_ascii_whitespace();
    let first = words.next().unwrap_or("");
    if first.eq_ignore_ascii_case("discard") {
        let rest: Vec<&str> = words.collect();
        return match rest.as_slice() {
            [w] if w.eq_ignore_ascii_case("all") => Deallocation::All,
            _ => Deallocation::None,
        };
    }
    if !first.eq_ignore_ascii_case("deallocate") {
        return Deallocation::None;
    }
    let mut rest: Vec<&str> = words.collect();
    if rest
        .first()
        .is_some_and(|w| w.eq_ignore_ascii_case("prepare"))
    {
        rest.remove(0);
    }
    match rest.as_slice() {
        [w] if w.eq_ignore_ascii_case("all") => Deallocation::All,
        [w] => identifier(w).map_or(Deallocation::None, Deallocation::One),
        _ => Deallocation::None,
    }
}

/// An SQL identifier as PostgreSQL folds it: quoted keeps case, unquoted is lowered.
fn identifier(word: &str) -> Option<Bytes> {
    if let Some(inner) = word.strip_prefix('"').and_then(|w| w.strip_suffix('"')) {
        if inner.is_empty() || inner.contains('"') {
            return None;
        }
        return Some(Bytes::from(inner.to_string()));
    }
    let plain = word
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$');
    (plain && !word.is_empty()).then(|| Bytes::from(word.to_ascii_lowercase()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_depend_on_text_and_types() {
        let a = server_name(b"select $1", &[23]);
        assert_eq!(a, server_name(b"select $1", &[23]));
        assert_ne!(a, server_name(b"select $1", &[25]));
        assert_ne!(a, server_name(b"select $2", &[23]));
        assert_eq!(a.len(), 36);
        assert!(a.starts_with(b"pgw_"));
    }

    #[test]
    fn deallocate_forms() {
        assert_eq!(deallocation(b"DEALLOCATE ALL"), Deallocation::All);
        assert_eq!(deallocation(b" discard  all ; "), Deallocation::All);
        assert_eq!(deallocation(b"deallocate prepare all"), Deallocation::All);
        assert_eq!(
            deallocation(b"DEALLOCATE S_1"),
            Deallocation::One(Bytes::from_static(b"s_1"))
        );
        assert_eq!(
            deallocation(b"deallocate \"S 1\""),
            Deallocation::None,
            "a quoted name with a space is not one word"
        );
        assert_eq!(
            deallocation(b"deallocate \"S_1\";"),
            Deallocation::One(Bytes::from_static(b"S_1"))
        );
        assert_eq!(deallocation(b"select 1"), Deallocation::None);
        assert_eq!(deallocation(b"discard plans"), Deallocation::None);
        assert_eq!(deallocation(b"deallocate a; select 1"), Deallocation::None);
        assert_eq!(deallocation(b"\n\tDisCard ALL"), Deallocation::All);
        assert_eq!(
            deallocation("\u{a0}discard all".as_bytes()),
            Deallocation::None,
            "PostgreSQL reads a no-break space as part of a word, not as a space"
        );
        assert_eq!(deallocation(b""), Deallocation::None);
        // PostgreSQL 17 and later read a vertical tab as a space.
        assert_eq!(
            deallocation(b"\x0bDEALLOCATE s_1"),
            Deallocation::One(Bytes::from_static(b"s_1"))
        );
        assert_eq!(deallocation(b"\x0bDISCARD ALL"), Deallocation::All);
    }
}
