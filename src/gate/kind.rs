//! What kind of request a ticket is for: transaction control never waits for a slot.

/// Transaction control statements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxControl {
    /// `BEGIN`, `START TRANSACTION`.
    Begin,
    /// `COMMIT`, `END`, `PREPARE TRANSACTION`, `COMMIT PREPARED`.
    Commit,
    /// `ROLLBACK`, `ABORT`, `ROLLBACK TO SAVEPOINT`, `ROLLBACK PREPARED`.
    Rollback,
    /// `SAVEPOINT`.
    Savepoint,
    /// `RELEASE SAVEPOINT`.
    Release,
}

/// The kind of a request, as the session classifies it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestKind {
    /// Work that takes a slot and pays its cost.
    Statement,
    /// Transaction control: never waits for a slot or a budget, charged `min_charge`.
    Transaction(TxControl),
    /// Messages that carry no request of their own (a Parse, a Describe, a Sync alone): they
    /// take a server with a slot, for nothing, and no kill or deadline refuses them.
    Carrier,
}

impl RequestKind {
    /// Whether the request waits for a slot in its lane.
    pub fn waits_for_slot(self) -> bool {
        matches!(self, RequestKind::Statement)
    }

    /// Whether a kill refuses it: ending a transaction (or a savepoint in one) always goes
    /// through, so a killed tenant's open transactions can finish.
    pub fn killable(self) -> bool {
        matches!(
            self,
            RequestKind::Statement | RequestKind::Transaction(TxControl::Begin)
        )
    }

    /// Classifies a single statement text by its first keyword. A text with a `;` before its
    /// end (perhaps several statements) is a [`RequestKind::Statement`]: it may do work.
    pub fn of_sql(sql: &str) -> RequestKind {
        let body = skip_blanks(sql);
        let trimmed = body.trim_end().trim_end_matches(';');
        if trimmed.contains(';') {
            return RequestKind::Statement;
        }
        let (first, rest) = word(body);
        let (second, _) = word(skip_blanks(rest));
        let is = |w: &str| first.eq_ignore_ascii_case(w);
        let tx = if is("BEGIN") || is("START") {
            TxControl::Begin
        } else if is("COMMIT")
            || is("END")
            || is("PREPARE") && second.eq_ignore_ascii_case("TRANSACTION")
        {
            TxControl::Commit
        } else if is("ROLLBACK") || is("ABORT") {
            TxControl::Rollback
        } else if is("SAVEPOINT") {
            TxControl::Savepoint
        } else if is("RELEASE") {
            TxControl::Release
        } else {
            return RequestKind::Statement;
        };
        RequestKind::Transaction(tx)
    }
}

/// The first word of a statement text, after blanks and comments (letters and `_`).
pub fn first_keyword(sql: &str) -> &str {
    word(skip_blanks(sql)).0
}

/// Whitespace as PostgreSQL's scanner reads it (`\v` from PostgreSQL 16; an older server
/// refuses a text that has one, so taking it as a blank classifies nothing that runs).
fn pg_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\r' | '\x0c' | '\x0b')
}

/// `s` without leading whitespace and comments (`-- ...` up to a newline, which for
/// PostgreSQL's scanner is `\n` or `\r`, and nested `/* ... */`).
fn skip_blanks(mut s: &str) -> &str {
    loop {
        s = s.trim_start_matches(pg_space);
        if let Some(rest) = s.strip_prefix("--") {
            s = rest
                .find(['\n', '\r'])
                .and_then(|i| rest.get(i..))
                .unwrap_or("");
        } else if s.starts_with("/*") {
            s = after_comment(s);
        } else {
            return s;
        }
    }
}

/// The text after the nested C-style comment `s` starts with (empty if it never ends).
fn after_comment(s: &str) -> &str {
    let mut depth = 0usize;
    let mut i = 0;
    let bytes = s.as_bytes();
    while i + 1 < bytes.len() {
        match (bytes[i], bytes[i + 1]) {
            (b'/', b'*') => {
                depth += 1;
                i += 2;
            }
            (b'*', b'/') => {
                depth -= 1;
                i += 2;
                if depth == 0 {
                    return s.get(i..).unwrap_or("");
                }
            }
            _ => i += 1,
        }
    }
    ""
}

/// The leading word of letters and `_`, and the rest.
fn word(s: &str) -> (&str, &str) {
    let end = s
        .find(|c: char| !(c.is_ascii_alphabetic() || c == '_'))
        .unwrap_or(s.len());
    s.split_at(end)
}
