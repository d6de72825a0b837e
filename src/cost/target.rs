//! Which statement's plan to judge, and the EXPLAIN that prices it.
//!
//! # Simple query
//!
//! For a Query message, the session sends `EXPLAIN (FORMAT JSON, VERBOSE) <statement>` (see
//! [`explain_sql`]) on the server the statement will run on, before the statement, and reads
//! the one row of the answer with [`PlanSummary::from_json`](super::PlanSummary::from_json).
//! Nothing of that answer reaches the client; an ErrorResponse to the EXPLAIN is the answer to
//! the client's statement (the statement would have failed the same way).
//!
//! # Extended protocol
//!
//! A prepared statement is priced at Bind, with the bound values, because the values choose
//! the plan (a custom plan, as PostgreSQL makes for given values). The session holds the
//! client's Bind and sends on the same server, in the middle of the client's batch:
//!
//! 1. `Parse` of pgward's own statement (a name only pgward uses, such as `pgward_explain`)
//!    with the text `EXPLAIN (FORMAT JSON, VERBOSE) ` + the client's prepared text, and the
//!    parameter types of the client's Parse;
//! 2. `Bind` of pgward's own portal to that statement with the client's parameter formats and
//!    values, asking for text results;
//! 3. `Execute` of that portal, then `Close` of the statement;
//! 4. `Flush`, so PostgreSQL answers now rather than at the client's Sync.
//!
//! The session reads ParseComplete, BindComplete, the DataRow(s) with the plan, CommandComplete
//! and CloseComplete, none of which go to the client. Then it judges the plan and either
//! forwards the held Bind or refuses it. If PostgreSQL answers the EXPLAIN with an
//! ErrorResponse, it now skips everything up to the next Sync: that error becomes the answer
//! to the client's Bind, and the client's messages up to its Sync are answered as PostgreSQL
//! answers messages after an error in a batch.

use pg_query::protobuf::Token;

/// The statement whose plan decides a text's price.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Judged<'a> {
    /// Explain this text (the whole statement, or the part of it that does the work: the `x`
    /// of `EXPLAIN ANALYZE x` or `COPY (x) TO`).
    Plan(&'a str),
    /// `EXECUTE name(...)` of a statement prepared with SQL PREPARE: explain the EXECUTE
    /// itself (`EXPLAIN EXECUTE` plans the prepared statement with these values); the plan
    /// cache keys it by the prepared text's fingerprint.
    Execute {
        /// The prepared statement's name, as written.
        name: &'a str,
        /// The whole EXECUTE statement.
        statement: &'a str,
    },
    /// `COPY table TO`: reads the whole table; explained as `TABLE table`.
    WholeTable(&'a str),
    /// Nothing EXPLAIN can plan (BEGIN, SET, several statements, a plain EXPLAIN, COPY FROM,
    /// text the scanner refuses): charged `min_charge`.
    MinCharge,
    /// A backslash in a plain string where `standard_conforming_strings` may be off: the
    /// scanner reads strings as with it on, so where the statement (or its statements) ends
    /// cannot be known; under cost rules it cannot be priced.
    Unreadable,
}

/// How many `EXPLAIN ANALYZE` / `COPY (...)` wrappers are looked through.
const MAX_NESTING: usize = 4;

/// The options of every EXPLAIN pgward sends.
pub const EXPLAIN_PREFIX: &str = "EXPLAIN (FORMAT JSON, VERBOSE) ";

/// Which statement of `sql` to judge; `conforming` says the server reads it with
/// `standard_conforming_strings` on (as PostgreSQL's scanner here always does).
pub fn judged_statement(sql: &str, conforming: bool) -> Judged<'_> {
    let doubt = !conforming && sql.contains('\\');
    let Ok(scanned) = pg_query::scan(sql) else {
        return match doubt {
            true => Judged::Unreadable,
            false => Judged::MinCharge,
        };
    };
    if doubt && crate::sql::backslash_in_plain_string(sql, &scanned.tokens) {
        return Judged::Unreadable;
    }
    let tokens: Vec<Tok> = scanned
        .tokens
        .iter()
        .filter(|t| t.token != Token::SqlComment as i32 && t.token != Token::CComment as i32)
        .filter_map(|t| Tok::new(sql, t.start, t.end, t.token))
        .collect();
    let Some(tokens) = single_statement(&tokens) else {
        return Judged::MinCharge;
    };
    judge(sql, tokens, MAX_NESTING)
}

/// The EXPLAIN that prices `judged`, or `None` when there is nothing to plan.
pub fn explain_sql(judged: &Judged) -> Option<String> {
    match judged {
        Judged::Plan(text) => Some(format!("{EXPLAIN_PREFIX}{text}")),
        Judged::Execute { statement, .. } => Some(format!("{EXPLAIN_PREFIX}{statement}")),
        Judged::WholeTable(table) => Some(format!("{EXPLAIN_PREFIX}TABLE {table}")),
        Judged::MinCharge | Judged::Unreadable => None,
    }
}

/// A query for the row counts of `relations` (schema, table, `reltuples`), for
/// `max_scan_rows`. Names travel hex-encoded, so no setting changes how the text is read.
/// A table never analyzed reports -1 (unknown).
pub fn relation_sizes_sql(relations: &[super::Relation]) -> Option<String> {
    if relations.is_empty() {
        return None;
    }
    let pairs: Vec<String> = relations
        .iter()
        .map(|r| format!("({}, {})", hex_name(&r.schema), hex_name(&r.name)))
        .collect();
    Some(format!(
        "SELECT n.nspname::pg_catalog.text, c.relname::pg_catalog.text, \
         c.reltuples::pg_catalog.float8 \
         FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
         WHERE (n.nspname, c.relname) IN ({})",
        pairs.join(", ")
    ))
}

fn hex_name(s: &str) -> String {
    let hex: String = s.bytes().map(|b| format!("{b:02x}")).collect();
    format!("pg_catalog.convert_from(pg_catalog.decode('{hex}', 'hex'), 'UTF8')::pg_catalog.name")
}

#[derive(Clone, Copy, Debug)]
struct Tok<'a> {
    start: usize,
    end: usize,
    token: i32,
    text: &'a str,
}

impl<'a> Tok<'a> {
    fn new(sql: &'a str, start: i32, end: i32, token: i32) -> Option<Tok<'a>> {
        let start = usize::try_from(start).ok()?;
        let end = usize::try_from(end).ok()?;
        Some(Tok {
            start,
            end,
            token,
            text: sql.get(start..end)?,
        })
    }

    fn is(&self, token: Token) -> bool {
        self.token == token as i32
    }

    fn word(&self, w: &str) -> bool {
        self.text.eq_ignore_ascii_case(w)
    }
}

/// The tokens of the only statement, without a trailing `;`; `None` for several statements.
fn single_statement<'t, 'a>(tokens: &'t [Tok<'a>]) -> Option<&'t [Tok<'a>]> {
    let mut parts = tokens
        .split(|t| t.is(Token::Ascii59))
        .filter(|p| !p.is_empty());
    let first = parts.next()?;
    parts.next().is_none().then_some(first)
}

fn span<'a>(sql: &'a str, tokens: &[Tok]) -> Option<&'a str> {
    let (first, last) = (tokens.first()?, tokens.last()?);
    sql.get(first.start..last.end)
}

fn judge<'a>(sql: &'a str, tokens: &[Tok<'a>], depth: usize) -> Judged<'a> {
    let Some(first) = tokens.first() else {
        return Judged::MinCharge;
    };
    let plannable = [
        "SELECT", "INSERT", "UPDATE", "DELETE", "MERGE", "VALUES", "TABLE",
    ];
    let whole = || span(sql, tokens).map_or(Judged::MinCharge, Judged::Plan);
    match first.text.to_ascii_uppercase().as_str() {
        _ if depth == 0 => Judged::MinCharge,
        "(" | "WITH" | "DECLARE" => whole(),
        w if plannable.contains(&w) => whole(),
        "EXPLAIN" => explained(sql, tokens.get(1..).unwrap_or_default(), depth),
        "COPY" => copied(sql, tokens.get(1..).unwrap_or_default(), depth),
        "EXECUTE" => match (tokens.get(1), span(sql, tokens)) {
            (Some(name), Some(statement)) => Judged::Execute {
                name: name.text,
                statement,
            },
            _ => Judged::MinCharge,
        },
        _ => Judged::MinCharge,
    }
}

/// After `EXPLAIN`: the statement it runs if ANALYZE is on, else nothing to price.
fn explained<'a>(sql: &'a str, rest: &[Tok<'a>], depth: usize) -> Judged<'a> {
    let (analyze, body) = match rest.first() {
        Some(t) if t.is(Token::Ascii40) => match closing(rest) {
            Some(close) => (
                analyze_option(rest.get(1..close).unwrap_or_default()),
                rest.get(close + 1..).unwrap_or_default(),
            ),
            None => return Judged::MinCharge,
        },
        _ => {
            let n = rest
                .iter()
                .take_while(|t| t.word("ANALYZE") || t.word("ANALYSE") || t.word("VERBOSE"))
                .count();
            let head = rest.get(..n).unwrap_or_default();
            let analyze = head.iter().any(|t| !t.word("VERBOSE"));
            (analyze, rest.get(n..).unwrap_or_default())
        }
    };
    if analyze {
        judge(sql, body, depth - 1)
    } else {
        Judged::MinCharge
    }
}

/// Whether an EXPLAIN option list turns ANALYZE on (`analyze`, `analyze true`, `analyze on`, `analyze 1`).
fn analyze_option(options: &[Tok]) -> bool {
    options.split(|t| t.text == ",").any(|opt| match opt {
        [name] => name.word("ANALYZE") || name.word("ANALYSE"),
        [name, value] => {
            (name.word("ANALYZE") || name.word("ANALYSE"))
                && !["false", "off", "0"].iter().any(|v| value.word(v))
        }
        _ => false,
    })
}

/// After `COPY`: `(x) TO` judges x; `table TO` reads the table; anything else is a write or
/// an error and costs `min_charge`.
fn copied<'a>(sql: &'a str, rest: &[Tok<'a>], depth: usize) -> Judged<'a> {
    if rest.first().is_some_and(|t| t.is(Token::Ascii40)) {
        let Some(close) = closing(rest) else {
            return Judged::MinCharge;
        };
        let to = rest.get(close + 1).is_some_and(|t| t.word("TO"));
        return match rest.get(1..close) {
            Some(inner) if to => judge(sql, inner, depth - 1),
            _ => Judged::MinCharge,
        };
    }
    let end = rest
        .iter()
        .position(|t| t.is(Token::Ascii40) || t.word("TO") || t.word("FROM"));
    let to = end
        .and_then(|e| rest.get(e..))
        .and_then(|tail| tail.iter().find(|t| t.word("TO") || t.word("FROM")))
        .is_some_and(|t| t.word("TO"));
    match end.and_then(|e| rest.get(..e)).and_then(|n| span(sql, n)) {
        Some(table) if to => Judged::WholeTable(table),
        _ => Judged::MinCharge,
    }
}

/// The index of the `)` that closes the `(` at index 0.
fn closing(tokens: &[Tok]) -> Option<usize> {
    let mut depth = 0usize;
    for (i, t) in tokens.iter().enumerate() {
        if t.is(Token::Ascii40) {
            depth += 1;
        } else if t.is(Token::Ascii41) {
            depth = depth.checked_sub(1)?;
            if depth == 0 {
                return Some(i);
            }
        }
    }
    None
}
