//! A client's protocol-level prepared statements in transaction pooling: the client's names
//! map to pgward's server-side names, derived from the statement itself, so every server
//! holding the same statement holds it under the same name.

use foldhash::HashMap;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use sha2::{Digest, Sha256};

use crate::params::ParamSet;
use crate::wire;
pub use crate::wire::Parsed;

/// One statement as pgward prepares it on servers.
#[derive(Debug)]
pub struct Statement {
    pub server_name: Bytes,
    /// The Parse message that prepares it under `server_name`.
    pub parse: Bytes,
    /// Its text names a setting PostgreSQL never reports ([`crate::params::names_unreported`]):
    /// each run of it may change that setting.
    pub names_unreported: bool,
    /// Its text and parameter types, as the gate reads them at each Bind.
    pub parsed: Option<Arc<Parsed>>,
    /// The settings the server read its text under, where they change how it does
    /// ([`reading`]): part of the name, so that clients share a server's statement only if
    /// they would read its text alike.
    pub reading: Option<Bytes>,
}

impl Statement {
    /// `reading`: see [`reading`].
    pub fn new(query: &[u8], param_types: &[u32], reading: Option<Bytes>) -> Self {
        let server_name = server_name(query, param_types, reading.as_deref());
        let mut parse = BytesMut::new();
        wire::encode_parse(&mut parse, &server_name, query, param_types);
        let parse = parse.freeze();
        Statement {
            server_name,
            parsed: Parsed::of_message(&parse).map(Arc::new),
            parse,
            names_unreported: crate::params::names_unreported(query),
            reading,
        }
    }

    /// The statement whose Parse message (under pgward's name) is `parse`, read under
    /// `reading`.
    pub fn from_parse_message(parse: &[u8], reading: Option<Bytes>) -> Option<Self> {
        let view = wire::ParseView::new(parse.get(wire::HEADER_LEN..)?).ok()?;
        let types: Vec<u32> = view.param_types().ok()?.iter().collect();
        Some(Statement::new(view.query, &types, reading))
    }

    /// The statement a server with settings `params` makes of this one's text when it is
    /// prepared there now, if that is another: its text reads differently under them.
    pub fn read_under(&self, params: &ParamSet) -> Option<Statement> {
        let ours = self.reading.as_ref()?;
        let theirs = settings_read_under(params);
        if theirs == *ours {
            return None;
        }
        Statement::from_parse_message(&self.parse, Some(theirs))
    }
}

/// The settings under which a server with `params` reads `query`, where they change how it
/// splits the text into tokens: `standard_conforming_strings` if it holds a backslash,
/// `client_encoding` if it holds a byte outside ASCII. `None` for a text every server reads
/// alike (pgward's name for it is then the same under any settings).
pub fn reading(query: &[u8], params: &ParamSet) -> Option<Bytes> {
    let depends = query.iter().any(|&b| b == b'\\' || !b.is_ascii());
    depends.then(|| settings_read_under(params))
}

fn settings_read_under(params: &ParamSet) -> Bytes {
    let scs = params.get("standard_conforming_strings").unwrap_or("");
    let encoding = params.get("client_encoding").unwrap_or("");
    Bytes::from(format!("{scs}\0{encoding}"))
}

/// How the names of pgward's own statements on servers begin.
pub const OWN_PREFIX: &str = "pgw_";

/// `pgw_` and 128 bits of SHA-256 over the text, the parameter types and the settings it is
/// read under if they matter ([`reading`]): the same statement gets the same name
/// everywhere, and two different statements never share one in practice.
pub fn server_name(query: &[u8], param_types: &[u32], reading: Option<&[u8]>) -> Bytes {
    let mut h = Sha256::new();
    h.update((query.len() as u64).to_be_bytes());
    h.update(query);
    for t in param_types {
        h.update(t.to_be_bytes());
    }
    if let Some(reading) = reading {
        h.update((reading.len() as u64).to_be_bytes());
        h.update(reading);
    }
    let digest = h.finalize();
    let mut name = String::with_capacity(36);
    name.push_str(OWN_PREFIX);
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

    /// Keeps only the names `keep` says.
    pub fn retain(&mut self, mut keep: impl FnMut(&[u8]) -> bool) {
        self.by_name.retain(|name, _| keep(&name[..]));
    }
}

/// What a simple Query does to prepared statements, read from its first words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Deallocation {
    None,
    /// `DEALLOCATE ALL`.
    All,
    /// `DISCARD ALL`, which PostgreSQL refuses inside a transaction block (25001).
    DiscardAll,
    /// `DEALLOCATE [PREPARE] name`.
    One(Bytes),
}

/// Recognises DEALLOCATE and DISCARD ALL in a simple Query (one statement, optional trailing
/// semicolons, comments anywhere). Anything it cannot read with certainty is `None`, and goes
/// to the server unchanged.
pub fn deallocation(sql: &[u8]) -> Deallocation {
    if !may_deallocate(sql) {
        return Deallocation::None;
    }
    std::str::from_utf8(sql)
        .ok()
        .and_then(read_deallocation)
        .unwrap_or(Deallocation::None)
}

/// Whether a text may be DEALLOCATE or DISCARD, known without reading it (nearly every query
/// is told apart here by its first word): it starts with one of them, or with a comment and
/// names one of them somewhere.
fn may_deallocate(sql: &[u8]) -> bool {
    let rest = &sql[sql.iter().take_while(|b| is_space(**b)).count()..];
    let may = if rest.starts_with(b"--") || rest.starts_with(b"/*") {
        mentions(rest, b"deallocate") || mentions(rest, b"discard")
    } else {
        starts_with_word(rest, b"deallocate") || starts_with_word(rest, b"discard")
    };
    // A vertical tab separates words from PostgreSQL 17 on and is an error before: which
    // one the server is, the scanner cannot say, so such a text is the server's to read.
    may && !sql.contains(&b'\x0b')
}

/// DEALLOCATE [PREPARE] name, DEALLOCATE [PREPARE] ALL or DISCARD ALL, with the words as
/// PostgreSQL's own scanner separates them.
fn read_deallocation(text: &str) -> Option<Deallocation> {
    use pg_query::protobuf::Token;
    let tokens = crate::sql::scan_tokens(text)?;
    let mut words = words_of(text, &tokens)?;
    while words.last().is_some_and(|w| w.kind == Token::Ascii59) {
        words.pop();
    }
    let kinds: Vec<Token> = words.iter().map(|w| w.kind).collect();
    match kinds.as_slice() {
        [Token::Discard, Token::All] => Some(Deallocation::DiscardAll),
        [Token::Deallocate, Token::All] | [Token::Deallocate, Token::Prepare, Token::All] => {
            Some(Deallocation::All)
        }
        [Token::Deallocate, Token::Prepare, _] | [Token::Deallocate, _] => {
            words.last()?.name().map(Deallocation::One)
        }
        _ => None,
    }
}

/// What a text may do to the session's prepared statements by SQL (see [`sql_touches`]).
#[derive(Debug, PartialEq, Eq)]
pub enum Touches {
    Nothing,
    /// The names a PREPARE or a DEALLOCATE of it names.
    Names(Vec<Bytes>),
    /// DEALLOCATE ALL, DISCARD ALL, or a name that cannot be read.
    All,
}

/// The statement names a text may define or free by SQL: what a PREPARE or DEALLOCATE that
/// starts one of its statements names, as PostgreSQL's scanner reads it. Nearly every text is
/// told apart here by naming none of those words; one that names them and cannot be read with
/// certainty touches every name.
pub fn sql_touches(sql: &[u8]) -> Touches {
    let may = [&b"prepare"[..], b"deallocate", b"discard"]
        .iter()
        .any(|w| mentions(sql, w));
    if !may {
        return Touches::Nothing;
    }
    if sql.contains(&b'\x0b') || sql.contains(&b'\\') {
        // Read differently by PostgreSQL 17 on and before (see `may_deallocate`), or by a
        // session with standard_conforming_strings off.
        return Touches::All;
    }
    let Ok(text) = std::str::from_utf8(sql) else {
        return Touches::All;
    };
    let Some(tokens) = crate::sql::scan_tokens(text) else {
        // A text the scanner cannot read is refused by PostgreSQL's too: nothing runs.
        return Touches::Nothing;
    };
    // A name that cannot be read with certainty may be any.
    words_of(text, &tokens)
        .and_then(|words| read_touches(&words))
        .unwrap_or(Touches::All)
}

/// A name read from SQL as PostgreSQL truncates an identifier: at most 63 bytes, cut at a
/// character boundary.
pub fn sql_name_key(name: &[u8]) -> &[u8] {
    let mut end = name.len().min(63);
    while end < name.len() && end > 0 && (name[end] & 0xC0) == 0x80 {
        end -= 1;
    }
    &name[..end]
}

/// The statements a text runs by SQL `EXECUTE name` at the start of one of its statements, as
/// PostgreSQL's scanner reads them (a statement prepared through the protocol may itself be a
/// DEALLOCATE or a PREPARE).
pub fn sql_executes(sql: &[u8]) -> Vec<Bytes> {
    use pg_query::protobuf::Token;
    if !mentions(sql, b"execute") {
        return Vec::new();
    }
    let Some(text) = std::str::from_utf8(sql).ok() else {
        return Vec::new();
    };
    let tokens = crate::sql::scan_tokens(text).unwrap_or_default();
    let Some(words) = words_of(text, &tokens) else {
        return Vec::new();
    };
    statement_starts(&words)
        .filter(|&i| words[i].kind == Token::Execute)
        .filter_map(|i| words.get(i + 1).and_then(Word::name))
        .collect()
}

/// Where in `words` a statement starts: the first word, and each after a `;`.
fn statement_starts<'w>(words: &'w [Word]) -> impl Iterator<Item = usize> + 'w {
    use pg_query::protobuf::Token;
    (0..words.len()).filter(|&i| i == 0 || words[i - 1].kind == Token::Ascii59)
}

/// The scanner's `tokens` of `text` but its comments.
fn words_of<'t>(text: &'t str, tokens: &[pg_query::protobuf::ScanToken]) -> Option<Vec<Word<'t>>> {
    use pg_query::protobuf::Token;
    let mut words = Vec::with_capacity(tokens.len());
    for t in tokens {
        let kind = Token::try_from(t.token).ok()?;
        if matches!(kind, Token::SqlComment | Token::CComment) {
            continue;
        }
        words.push(Word {
            kind,
            keyword: t.keyword_kind,
            text: text.get(t.start as usize..t.end as usize)?,
        });
    }
    Some(words)
}

/// Whether a text may define or free by SQL a statement under one of pgward's own names
/// (`pgw_` and a hash), which pgward prepares on servers its clients share: another client's
/// Bind would run what it holds.
pub fn touches_reserved(sql: &[u8]) -> bool {
    if !mentions(sql, OWN_PREFIX.as_bytes()) {
        return false;
    }
    match sql_touches(sql) {
        Touches::Nothing => false,
        Touches::Names(names) => names.iter().any(|n| n.starts_with(OWN_PREFIX.as_bytes())),
        // DEALLOCATE ALL is pgward's to follow; anything else that cannot be read may name one.
        Touches::All => !matches!(
            deallocation(sql),
            Deallocation::All | Deallocation::DiscardAll
        ),
    }
}

fn read_touches(words: &[Word]) -> Option<Touches> {
    use pg_query::protobuf::Token;
    let mut names = Vec::new();
    for i in statement_starts(words) {
        let next = |n: usize| words.get(i + n);
        let named = match words[i].kind {
            Token::Prepare if next(1).is_some_and(|w| w.kind == Token::Transaction) => continue,
            Token::Prepare => next(1),
            Token::Deallocate => match next(1) {
                Some(w) if w.kind == Token::Prepare => next(2),
                other => other,
            },
            Token::Discard if next(1).is_some_and(|w| w.kind == Token::All) => {
                return Some(Touches::All)
            }
            _ => continue,
        };
        match named {
            Some(w) if w.kind == Token::All => return Some(Touches::All),
            Some(w) => names.push(w.name()?),
            None => return None,
        }
    }
    Some(match names.is_empty() {
        true => Touches::Nothing,
        false => Touches::Names(names),
    })
}

/// One token of a statement, as PostgreSQL's scanner reads it.
struct Word<'t> {
    kind: pg_query::protobuf::Token,
    keyword: i32,
    text: &'t str,
}

impl Word<'_> {
    /// The statement name this token gives: an identifier, or a keyword that may name things
    /// (PREPARE, say).
    fn name(&self) -> Option<Bytes> {
        use pg_query::protobuf::{KeywordKind, Token};
        let names = self.kind == Token::Ident
            || self.keyword == KeywordKind::UnreservedKeyword as i32
            || self.keyword == KeywordKind::ColNameKeyword as i32;
        names.then(|| identifier(self.text)).flatten()
    }
}

/// PostgreSQL's white space (a vertical tab is one since PostgreSQL 17).
fn is_space(b: u8) -> bool {
    b.is_ascii_whitespace() || b == b'\x0b'
}

/// Whether `sql` starts, after white space, with the keyword `word` (any case) followed by
/// something that cannot continue a word.
pub(super) fn starts_with_word(sql: &[u8], word: &[u8]) -> bool {
    let rest = &sql[sql.iter().take_while(|b| is_space(**b)).count()..];
    rest.get(..word.len())
        .is_some_and(|w| w.eq_ignore_ascii_case(word))
        && rest
            .get(word.len())
            .is_none_or(|b| !(b.is_ascii_alphanumeric() || *b == b'_' || *b == b'$' || *b >= 0x80))
}

/// Whether `word` (any case) appears anywhere in `text`.
fn mentions(text: &[u8], word: &[u8]) -> bool {
    let first = word[0];
    memchr::memchr2_iter(first.to_ascii_lowercase(), first.to_ascii_uppercase(), text).any(|i| {
        text.get(i..i + word.len())
            .is_some_and(|w| w.eq_ignore_ascii_case(word))
    })
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
        let a = server_name(b"select $1", &[23], None);
        assert_eq!(a, server_name(b"select $1", &[23], None));
        assert_ne!(a, server_name(b"select $1", &[25], None));
        assert_ne!(a, server_name(b"select $2", &[23], None));
        assert_ne!(a, server_name(b"select $1", &[23], Some(b"on\0UTF8")));
        assert_eq!(a.len(), 36);
        assert!(a.starts_with(b"pgw_"));
    }

    fn settings(scs: &str, encoding: &str) -> ParamSet {
        let mut params = ParamSet::default();
        params.set("standard_conforming_strings", scs);
        params.set("client_encoding", encoding);
        params
    }

    #[test]
    fn a_text_the_settings_read_differently_is_named_with_them() {
        let (on, off) = (settings("on", "UTF8"), settings("off", "UTF8"));
        let plain = b"select 'a' || $1";
        assert_eq!(reading(plain, &on), None);
        let statement = Statement::new(plain, &[25], reading(plain, &on));
        assert!(statement.read_under(&off).is_none());
        for (text, other) in [
            (r"select 'a\'".as_bytes(), &off),
            ("select 'é'".as_bytes(), &settings("on", "LATIN1")),
        ] {
            let statement = Statement::new(text, &[], reading(text, &on));
            assert_ne!(statement.server_name, server_name(text, &[], None));
            assert!(statement.read_under(&on).is_none());
            let there = statement.read_under(other).expect("read otherwise");
            assert_ne!(there.server_name, statement.server_name);
            assert_eq!(
                there.parsed,
                statement
                    .parsed
                    .as_ref()
                    .map(|p| { Arc::new(Parsed::new(p.text.clone(), p.types.clone())) })
            );
            assert!(there.read_under(other).is_none());
        }
    }

    #[test]
    fn deallocate_forms() {
        assert_eq!(deallocation(b"DEALLOCATE ALL"), Deallocation::All);
        assert_eq!(deallocation(b" discard  all ; "), Deallocation::DiscardAll);
        assert_eq!(deallocation(b"deallocate prepare all"), Deallocation::All);
        assert_eq!(
            deallocation(b"DEALLOCATE S_1"),
            Deallocation::One(Bytes::from_static(b"s_1"))
        );
        assert_eq!(
            deallocation(b"deallocate \"S 1\""),
            Deallocation::One(Bytes::from_static(b"S 1")),
            "a quoted name is one word, spaces and all"
        );
        assert_eq!(
            deallocation(b"deallocate \"S_1\";"),
            Deallocation::One(Bytes::from_static(b"S_1"))
        );
        assert_eq!(deallocation(b"select 1"), Deallocation::None);
        assert_eq!(deallocation(b"discard plans"), Deallocation::None);
        assert_eq!(deallocation(b"deallocate a; select 1"), Deallocation::None);
        assert_eq!(deallocation(b"\n\tDisCard ALL"), Deallocation::DiscardAll);
        assert_eq!(
            deallocation("\u{a0}discard all".as_bytes()),
            Deallocation::None,
            "PostgreSQL reads a no-break space as part of a word, not as a space"
        );
        assert_eq!(deallocation(b""), Deallocation::None);
        // A vertical tab is a space to PostgreSQL 17 and later, an error before: the server
        // reads such a text itself.
        assert_eq!(deallocation(b"\x0bDEALLOCATE s_1"), Deallocation::None);
        assert_eq!(deallocation(b"DISCARD\x0bALL"), Deallocation::None);
    }

    #[test]
    fn deallocate_with_comments_is_read_as_postgresql_reads_it() {
        let one = |name: &'static [u8]| Deallocation::One(Bytes::from_static(name));
        assert_eq!(deallocation(b"/* app */ DEALLOCATE s_1"), one(b"s_1"));
        assert_eq!(
            deallocation(b"-- note\nDISCARD ALL;"),
            Deallocation::DiscardAll
        );
        assert_eq!(
            deallocation(b"DEALLOCATE /* x */ PREPARE s_1 ; -- done"),
            one(b"s_1")
        );
        assert_eq!(
            deallocation(b"/* a /* nested */ one */ deallocate all"),
            Deallocation::All
        );
        assert_eq!(deallocation(b"deallocate prepare"), one(b"prepare"));
        assert_eq!(
            deallocation(b"/* deallocate s_1 */ select 1"),
            Deallocation::None
        );
        assert_eq!(deallocation(b"-- deallocate s_1"), Deallocation::None);
        assert_eq!(deallocation(b"deallocate select"), Deallocation::None);
        assert_eq!(
            deallocation(b"deallocate s_1; deallocate s_2"),
            Deallocation::None
        );
        assert_eq!(deallocation(b"deallocatex s_1"), Deallocation::None);
        assert_eq!(
            deallocation(b"/* unterminated deallocate s_1"),
            Deallocation::None
        );
    }
}

#[cfg(test)]
mod touches {
    use super::{sql_touches, Touches};
    use bytes::Bytes;

    fn names(list: &[&'static str]) -> Touches {
        Touches::Names(
            list.iter()
                .map(|n| Bytes::from_static(n.as_bytes()))
                .collect(),
        )
    }

    #[test]
    fn sql_that_defines_or_frees_a_statement_names_it() {
        assert_eq!(sql_touches(b"SELECT prepared_at FROM t"), Touches::Nothing);
        assert_eq!(sql_touches(b"SELECT 'prepare x'"), Touches::Nothing);
        assert_eq!(sql_touches(b"PREPARE TRANSACTION 'x'"), Touches::Nothing);
        assert_eq!(sql_touches(b"DISCARD PLANS"), Touches::Nothing);
        assert_eq!(sql_touches(b"prepare P1 AS SELECT 1"), names(&["p1"]));
        assert_eq!(
            sql_touches(b"/* c */ PREPARE \"Q\" (int) AS SELECT $1"),
            names(&["Q"])
        );
        assert_eq!(
            sql_touches(b"SELECT 1; DEALLOCATE a; DEALLOCATE PREPARE b; PREPARE c AS SELECT 2"),
            names(&["a", "b", "c"])
        );
        assert_eq!(sql_touches(b"DEALLOCATE ALL"), Touches::All);
        assert_eq!(sql_touches(b"discard all"), Touches::All);
        assert_eq!(sql_touches(b"SELECT 1; PREPARE"), Touches::All);
        assert_eq!(sql_touches(b"PREPARE \"a\"\"b\" AS SELECT 1"), Touches::All);
        assert_eq!(sql_touches(b"SELECT 'x\\''; DEALLOCATE s1"), Touches::All);
        assert_eq!(sql_touches(b"SELECT 'not prepared"), Touches::Nothing);
        assert_eq!(sql_touches(b"PREPARE \x0bp AS SELECT 1"), Touches::All);
        assert_eq!(sql_touches(b"PREPARE p AS SELECT '\xff'"), Touches::All);
    }

    #[test]
    fn sql_names_are_cut_at_a_character_boundary() {
        use super::sql_name_key;
        let long = format!("{}\u{e9}", "a".repeat(62));
        assert_eq!(sql_name_key(long.as_bytes()), "a".repeat(62).as_bytes());
        assert_eq!(sql_name_key("a".repeat(70).as_bytes()).len(), 63);
        assert_eq!(sql_name_key(b"s1"), b"s1");
    }

    #[test]
    fn sql_execute_names_the_statement_it_runs() {
        use super::sql_executes;
        assert_eq!(sql_executes(b"EXECUTE x"), vec![Bytes::from_static(b"x")]);
        assert_eq!(
            sql_executes(b"SELECT 1; execute \"Y\"(1)"),
            vec![Bytes::from_static(b"Y")]
        );
        assert!(sql_executes(b"SELECT 'execute x'").is_empty());
    }

    #[test]
    fn pgwards_own_names_are_reserved() {
        use super::touches_reserved;
        assert!(touches_reserved(b"DEALLOCATE pgw_0123"));
        assert!(touches_reserved(b"deallocate prepare PGW_0123"));
        assert!(touches_reserved(b"SELECT 1; PREPARE pgw_0123 AS SELECT 2"));
        assert!(touches_reserved(b"PREPARE \x0bpgw_1 AS SELECT 1"));
        assert!(!touches_reserved(b"SELECT 'pgw_0123'"));
        assert!(!touches_reserved(b"DEALLOCATE mine"));
        assert!(!touches_reserved(b"EXECUTE pgw_0123"));
        assert!(!touches_reserved(b"DEALLOCATE ALL /* pgw_ */"));
    }
}
