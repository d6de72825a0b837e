//! A reader of statement shapes for the common subset of SQL texts, without PostgreSQL's
//! scanner: it finds the same constant tokens the scanner finds, or declines.
//!
//! It declines on everything it is not sure to read as the scanner does: non-ASCII text,
//! backslashes, NULs, dollar quotes, string prefixes (E'', B'', X'', N'', U&''), a string
//! followed by another (PostgreSQL joins them across a newline), nested or unterminated
//! comments, empty or unterminated quoted identifiers, numbers with an exponent or touching an
//! identifier character, integers past 32 bits, parameters touching an identifier, operators of
//! several characters ending in `+` or `-` or holding a comment start, and characters the
//! scanner does not know. What it reads is checked against the scanner by a differential
//! property test and by PostgreSQL's own regression SQL (`corpus` below).

use super::shape::{Constant, Shape};

/// Characters that make up operators (`op_chars` in PostgreSQL's scanner).
const OP_CHARS: &[u8] = b"~!@#^&|`?+-*/%<>=";
/// Characters that are tokens by themselves (`self` without `:`, `.`, and the op chars).
const SELF_CHARS: &[u8] = b",()[];";
/// Whitespace PostgreSQL's scanner skips (vertical tab left out: not in every version).
const SPACE: &[u8] = b" \t\n\r\x0c";

/// What each byte is to the reader, one flag per class (a byte may be in several).
const IS_SPACE: u8 = 1;
const IS_SELF: u8 = 2;
const IS_OP: u8 = 4;
/// Letters and `_`: an identifier starts with one.
const IS_IDENT_START: u8 = 8;
/// Letters, digits, `_` and `$`: an identifier goes on with one.
const IS_IDENT: u8 = 16;
const IS_DIGIT: u8 = 32;

/// The classes of every byte, read once per byte instead of searching the lists above.
const CLASSES: [u8; 256] = classes();

const fn classes() -> [u8; 256] {
    let mut table = [0u8; 256];
    let lists: [(&[u8], u8); 3] = [(SPACE, IS_SPACE), (SELF_CHARS, IS_SELF), (OP_CHARS, IS_OP)];
    let mut l = 0;
    while l < lists.len() {
        let (chars, class) = lists[l];
        let mut i = 0;
        while i < chars.len() {
            table[chars[i] as usize] |= class;
            i += 1;
        }
        l += 1;
    }
    let mut c = 0;
    while c < 128 {
        let byte = c as u8;
        if byte.is_ascii_alphabetic() || byte == b'_' {
            table[c] |= IS_IDENT_START | IS_IDENT;
        }
        if byte.is_ascii_digit() {
            table[c] |= IS_DIGIT | IS_IDENT;
        }
        if byte == b'$' {
            table[c] |= IS_IDENT;
        }
        c += 1;
    }
    table
}

fn is(c: u8, class: u8) -> bool {
    CLASSES[usize::from(c)] & class != 0
}

/// Where the run of bytes of `class` in `b` from `from` on ends.
fn run_end(b: &[u8], from: usize, class: u8) -> usize {
    let mut i = from;
    while i < b.len() && is(b[i], class) {
        i += 1;
    }
    i
}

/// The shape of `text`, or `None` where this reader is not sure (the caller asks PostgreSQL's
/// scanner then).
pub(crate) fn shape(text: &str) -> Option<Shape> {
    let mut out = Shape::default();
    shape_into(text, &mut out).then_some(out)
}

/// [`shape`] into `out`, whose buffers are reused; false where this reader is not sure
/// (`out` then holds nothing of use).
pub(crate) fn shape_into(text: &str, out: &mut Shape) -> bool {
    out.key.clear();
    out.constants.clear();
    read_into(text, out).is_some()
}

fn read_into(text: &str, out: &mut Shape) -> Option<()> {
    let b = text.as_bytes();
    // (A byte outside ASCII, a backslash or a NUL declines where it stands: outside a token
    // it is no token, and the readers of quotes and comments decline on one.)
    let Shape { key, constants } = out;
    key.reserve(text.len());
    let mut copied = 0;
    // Where the previous token (whitespace is no token; comments are) was a lone `-`.
    let mut minus: Option<usize> = None;
    let mut at = 0;
    while at < b.len() {
        let c = b[at];
        if is(c, IS_SPACE) {
            at += 1;
            continue;
        }
        if is(c, IS_IDENT_START) {
            // Identifiers and keywords, most of a statement's tokens.
            at = identifier(b, at)?;
            minus = None;
            continue;
        }
        let (end, constant) = token(b, at)?;
        if let Some(letter) = constant {
            key.push_str(&text[copied..at]);
            key.push('\0');
            key.push(letter);
            copied = end;
            constants.push(Constant {
                start: i32::try_from(at).ok()?,
                minus: minus.and_then(|m| i32::try_from(m).ok()),
            });
        }
        minus = (c == b'-' && end == at + 1).then_some(at);
        at = end;
    }
    key.push_str(&text[copied..]);
    Some(())
}

/// The token at `at` (not whitespace): where it ends, and its letter if it is a constant.
fn token(b: &[u8], at: usize) -> Option<(usize, Option<char>)> {
    let c = b[at];
    let next = b.get(at + 1).copied();
    match c {
        b'-' if next == Some(b'-') => Some((line_end(b, at)?, None)),
        b'/' if next == Some(b'*') => Some((comment_end(b, at)?, None)),
        b'\'' => string(b, at).map(|end| (end, Some('s'))),
        b'"' => quoted_identifier(b, at).map(|end| (end, None)),
        b'0'..=b'9' => number(b, at),
        b'.' if next.is_some_and(|n| n.is_ascii_digit()) => number(b, at),
        b'.' if next == Some(b'.') => Some((at + 2, None)),
        b':' if matches!(next, Some(b':') | Some(b'=')) => Some((at + 2, None)),
        b'.' | b':' => Some((at + 1, None)),
        b'$' => parameter(b, at).map(|end| (end, None)),
        _ if is(c, IS_SELF) => Some((at + 1, None)),
        _ if is(c, IS_OP) => operator(b, at).map(|end| (end, None)),
        _ if is(c, IS_IDENT_START) => identifier(b, at).map(|end| (end, None)),
        _ => None,
    }
}

fn ident_char(c: u8) -> bool {
    is(c, IS_IDENT)
}

/// A byte the reader declines on wherever it stands: outside ASCII, a backslash, a NUL.
fn unread(c: u8) -> bool {
    c == b'\\' || c == 0 || !c.is_ascii()
}

/// A `--` comment: up to the end of its line (the newline is not part of it); none with a
/// byte the reader declines on.
fn line_end(b: &[u8], at: usize) -> Option<usize> {
    let end = b[at..]
        .iter()
        .position(|&c| matches!(c, b'\n' | b'\r') || unread(c))
        .map_or(b.len(), |p| at + p);
    (!b.get(end).is_some_and(|&c| unread(c))).then_some(end)
}

/// A `/* */` comment, not nested, terminated, with no byte the reader declines on.
fn comment_end(b: &[u8], at: usize) -> Option<usize> {
    let body = &b[at + 2..];
    let close = body.windows(2).position(|w| w == b"*/")?;
    if body[..close].windows(2).any(|w| w == b"/*")
        || body.get(close.wrapping_sub(1)) == Some(&b'/')
        || body[..close].iter().any(|&c| unread(c))
    {
        // Nested (or `/*/`, where a nested start and the end overlap): the scanner counts.
        return None;
    }
    Some(at + 2 + close + 2)
}

/// A string constant `'...'` (`''` inside), not prefixed, not followed by another string
/// (which the scanner may join to it), terminated.
fn string(b: &[u8], at: usize) -> Option<usize> {
    if at > 0 && (ident_char(b[at - 1]) || b[at - 1] == b'&') {
        // E'', B'', X'', N'', U&'' and the like.
        return None;
    }
    let end = closing(b, at)?;
    if next_meaningful(b, end) == Some(b'\'') {
        return None;
    }
    Some(end)
}

/// The first character after `from` that is neither whitespace nor in a comment.
fn next_meaningful(b: &[u8], from: usize) -> Option<u8> {
    let mut i = from;
    loop {
        let c = *b.get(i)?;
        if is(c, IS_SPACE) {
            i += 1;
        } else if c == b'-' && b.get(i + 1) == Some(&b'-') {
            // (One the reader declines on declines when the reader gets to it.)
            i = line_end(b, i).unwrap_or(b.len());
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            i = comment_end(b, i).unwrap_or(b.len());
        } else {
            return Some(c);
        }
    }
}

/// A quoted identifier `"..."` (`""` inside), not empty, terminated, not `U&"..."`.
fn quoted_identifier(b: &[u8], at: usize) -> Option<usize> {
    if at > 0 && (ident_char(b[at - 1]) || b[at - 1] == b'&') {
        return None;
    }
    let end = closing(b, at)?;
    (end > at + 2).then_some(end)
}

/// Where the quoted text starting at `at` (a `'` or a `"`, doubled inside) ends, past its
/// closing quote; `None` when it is not closed or holds a byte the reader declines on.
fn closing(b: &[u8], at: usize) -> Option<usize> {
    let quote = b[at];
    let mut i = at + 1;
    loop {
        match *b.get(i)? {
            c if unread(c) => return None,
            c if c == quote && b.get(i + 1) == Some(&quote) => i += 2,
            c if c == quote => return Some(i + 1),
            _ => i += 1,
        }
    }
}

/// A number: an integer that fits in 32 bits (Iconst) or a decimal (Fconst); none with an
/// exponent, none touching an identifier character or another dot.
fn number(b: &[u8], at: usize) -> Option<(usize, Option<char>)> {
    let digits = |from: usize| run_end(b, from, IS_DIGIT);
    let int_end = digits(at);
    let (end, decimal) = match b.get(int_end) {
        Some(b'.') if b.get(int_end + 1) == Some(&b'.') => return None,
        Some(b'.') => (digits(int_end + 1), true),
        _ => (int_end, false),
    };
    if b.get(end).is_some_and(|&c| ident_char(c) || c == b'.') {
        return None;
    }
    if decimal {
        return Some((end, Some('f')));
    }
    fits_32_bits(&b[at..end]).then_some((end, Some('i')))
}

/// Whether the digits say an integer of at most `i32::MAX` (more than ten digits decline,
/// leading zeros or not: the caller then asks the scanner).
fn fits_32_bits(digits: &[u8]) -> bool {
    digits.len() <= 10
        && digits
            .iter()
            .fold(0u64, |n, d| n * 10 + u64::from(d - b'0'))
            <= i32::MAX as u64
}

/// A parameter `$1`; a dollar quote or a parameter touching an identifier declines.
fn parameter(b: &[u8], at: usize) -> Option<usize> {
    let end = run_end(b, at + 1, IS_DIGIT);
    if end == at + 1 || b.get(end).is_some_and(|&c| ident_char(c)) {
        return None;
    }
    // A number past 32 bits is an error of the scanner's.
    fits_32_bits(&b[at + 1..end]).then_some(end)
}

/// An operator: a run of operator characters, taken whole unless the scanner would cut it
/// (a comment start inside, or a trailing `+` or `-` it may split off).
fn operator(b: &[u8], at: usize) -> Option<usize> {
    let len = run_end(b, at, IS_OP) - at;
    let run = &b[at..at + len];
    if run.windows(2).any(|w| w == b"--" || w == b"/*") {
        return None;
    }
    if len >= 2 && matches!(run[len - 1], b'+' | b'-') {
        return None;
    }
    // The scanner refuses an operator as long as a name may be (NAMEDATALEN).
    (len < 64).then_some(at + len)
}

/// An identifier or keyword.
fn identifier(b: &[u8], at: usize) -> Option<usize> {
    let end = run_end(b, at, IS_IDENT);
    if matches!(b.get(end), Some(b'\'') | Some(b'"')) || (b.get(end) == Some(&b'&')) {
        // A prefixed string or identifier (E'', U&'', U&"").
        return None;
    }
    Some(end)
}

/// Whether `text` has the key of `last`, which this reader read with its constants at
/// `constants`: the two texts differ only inside one integer constant of `last`, whose digits
/// in `text` still make one integer of at most 32 bits, followed by what followed it. Every
/// token before and after it is then the same, byte for byte, and so is every choice the
/// reader made on them (what it looks at next to a token is the same kind of byte).
pub(crate) fn same_key(last: &str, constants: &[Constant], text: &str) -> bool {
    let (l, t) = (last.as_bytes(), text.as_bytes());
    let p = common_prefix(l, t);
    if p == l.len() && p == t.len() {
        return true;
    }
    let s = common_suffix(&l[p..], &t[p..]);
    let (l_end, t_end) = (l.len() - s, t.len() - s);
    let Some(c) = constants
        .partition_point(|c| usize::try_from(c.start).is_ok_and(|at| at <= p))
        .checked_sub(1)
    else {
        return false;
    };
    let Ok(start) = usize::try_from(constants[c].start) else {
        return false;
    };
    if !l.get(start).is_some_and(u8::is_ascii_digit) {
        // A string, a decimal starting with a dot.
        return false;
    }
    // The integer's digits in `last`, and where they end in `text`.
    let run = run_end(l, start, IS_DIGIT);
    if l_end > run || l.get(run) == Some(&b'.') {
        return false;
    }
    let t_run = run - l_end + t_end;
    t_run > start && t[p..t_end].iter().all(u8::is_ascii_digit) && fits_32_bits(&t[start..t_run])
}

/// How many bytes `a` and `b` share at their start.
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    let n = a.len().min(b.len());
    let mut i = 0;
    while i + 8 <= n && word(a, i) == word(b, i) {
        i += 8;
    }
    while i < n && a[i] == b[i] {
        i += 1;
    }
    i
}

/// How many bytes `a` and `b` share at their end.
fn common_suffix(a: &[u8], b: &[u8]) -> usize {
    let n = a.len().min(b.len());
    let (a_end, b_end) = (a.len(), b.len());
    let mut i = 0;
    while i + 8 <= n && word(a, a_end - i - 8) == word(b, b_end - i - 8) {
        i += 8;
    }
    while i < n && a[a_end - i - 1] == b[b_end - i - 1] {
        i += 1;
    }
    i
}

/// The eight bytes of `b` from `at`.
fn word(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_ne_bytes(w)
}

#[cfg(test)]
mod tests {
    use super::super::shape::Shape;
    use super::*;
    use proptest::prelude::*;

    /// The fast reader agrees with PostgreSQL's scanner wherever it reads: same key, same
    /// constants. Returns whether it read the text.
    fn agrees(text: &str) -> bool {
        let Some(fast) = shape(text) else {
            return false;
        };
        let slow = Shape::scanned(text);
        let slow = slow
            .unwrap_or_else(|| panic!("the scanner refuses what the fast reader read: {text:?}"));
        assert_eq!(fast.key, slow.key, "{text:?}");
        assert_eq!(fast.constants, slow.constants, "{text:?}");
        true
    }

    #[test]
    fn common_texts_are_read_and_agree() {
        for text in [
            "SELECT 1",
            "SELECT abalance FROM pgbench_accounts WHERE aid = 42",
            "select * from t where a = 'it''s' and b = -1.5 /* c */ -- d",
            "UPDATE t SET x = x + 1 WHERE id = $1",
            "SELECT a::int, b FROM \"My \"\"T\"\"\" WHERE c <> 3 AND d >= .5",
            "SELECT - 1, - /**/1, 2147483647",
            "SELECT a FROM t WHERE b IN (1, 2, 3) ORDER BY 1 LIMIT 10",
            "/* tenant='acme' */ SELECT 1",
        ] {
            assert!(agrees(text), "declined: {text:?}");
        }
    }

    #[test]
    fn declines_what_it_cannot_be_sure_of() {
        for text in [
            "SELECT E'a'",
            "SELECT B'1'",
            "SELECT X'1F'",
            "SELECT U&'a'",
            "SELECT 'a'\n'b'",
            "SELECT $$a$$",
            "SELECT 1e5",
            "SELECT 2147483648",
            "SELECT 123abc",
            "SELECT 1_000",
            "SELECT 0x1F",
            "/* a /* b */ c */ SELECT 1",
            "SELECT 'é'",
            "SELECT 'a\\'",
            "SELECT 'a\0b'",
            "SELECT 1 -- \u{80}",
            "SELECT 1 =- 1",
            "SELECT 'open",
            "SELECT \"\"",
            "SELECT {",
        ] {
            assert!(shape(text).is_none(), "read: {text:?}");
            // Whatever the scanner makes of it, nothing to compare: declined.
        }
        // A backslash, a NUL or a byte outside ASCII anywhere: where it stands, in a quote or
        // in a comment, and after a string whose next meaningful character is looked for
        // through that comment.
        for text in [
            "SELECT 1 \\ 2",
            "SELECT \"a\\b\" FROM t",
            "SELECT 1 -- a\\b\nFROM t",
            "SELECT 1 /* a\\b */ FROM t",
            "SELECT 'a' -- \\\n, 2",
            "SELECT 'a' /* \\ */ 'b'",
            "SELECT 1 --\\",
            "SELECT \"a\0b\" FROM t",
            "SELECT 1 -- a\0b\nFROM t",
            "SELECT 1 /* a\0b */ FROM t",
            "SELECT \"é\" FROM t",
            "SELECT 1 /* é */ FROM t",
            "SELECT 'a' -- é\n'b'",
            "SELECT café FROM t",
            "SELECT 1 ¬ 2",
        ] {
            assert!(text.bytes().any(unread), "{text:?}");
            assert!(shape(text).is_none(), "read: {text:?}");
        }
        // An operator as long as a name: the scanner refuses it.
        let long = format!("SELECT 1 {} 1", "<".repeat(64));
        assert!(Shape::scanned(&long).is_none());
        assert!(shape(&long).is_none());
        assert!(agrees(&format!("SELECT 1 {} 1", "<".repeat(63))));
    }

    /// Fragments that make up statement-like texts, the tricky ones included.
    fn fragment() -> impl Strategy<Value = &'static str> {
        prop::sample::select(vec![
            "SELECT",
            "select",
            " ",
            "\n",
            "\t",
            "a",
            "t1",
            "_x$",
            "\"Q\"",
            "\"q\"\"r\"",
            "'s'",
            "''",
            "'it''s'",
            "'a\nb'",
            "1",
            "42",
            "2147483647",
            "2147483648",
            "9999999999",
            "1.5",
            ".5",
            "5.",
            "1e3",
            "1..2",
            "-",
            "+",
            "*",
            "/",
            "<",
            ">",
            "=",
            "<>",
            "!=",
            "<=",
            "||",
            "::",
            ":",
            ":=",
            "=>",
            ".",
            "..",
            ",",
            "(",
            ")",
            "[",
            "]",
            ";",
            "$1",
            "$",
            "$$",
            "$a$",
            "--c\n",
            "/* c */",
            "/*",
            "*/",
            "E",
            "B",
            "X",
            "N",
            "U&",
            "&",
            "@",
            "#",
            "~",
            "%",
            "^",
            "`",
            "?",
            "|",
            "é",
            "\\",
            "{",
            "\u{b}",
            "0x1F",
            "1_0",
            "e",
        ])
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(20_000))]
        #[test]
        fn agrees_with_the_scanner_on_generated_texts(parts in prop::collection::vec(fragment(), 0..24)) {
            agrees(&parts.concat());
        }

        /// A text said to have the key of one read before is read to that very key.
        #[test]
        fn a_text_of_the_same_key_reads_to_it(
            parts in prop::collection::vec(fragment(), 0..24),
            which in 0usize..8,
            digits in "[0-9]{0,12}",
            edit in (0usize..64, prop::sample::select(vec!["", "1", "0", "a", " ", "-", ".", "'", "e"])),
        ) {
            let last = parts.concat();
            let Some(read) = shape(&last) else {
                return Ok(());
            };
            // Another integer in one of its constants, or another edit anywhere.
            let mut text = last.clone();
            if let Some(c) = read.constants.get(which % read.constants.len().max(1)) {
                let start = c.start as usize;
                let end = run_end(last.as_bytes(), start, IS_DIGIT);
                text.replace_range(start..end, &digits);
            }
            let (at, with) = edit;
            if which % 3 == 0 && at <= text.len() {
                text.insert_str(at, with);
            }
            if same_key(&last, &read.constants, &text) {
                let again = shape(&text);
                prop_assert_eq!(again.map(|s| s.key), Some(read.key), "{:?} then {:?}", last, text);
            }
        }
    }

    #[test]
    fn another_integer_in_one_constant_keeps_the_key() {
        let last = "SELECT abalance FROM pgbench_accounts WHERE aid = 12345;";
        let read = shape(last).unwrap();
        for text in [
            last,
            "SELECT abalance FROM pgbench_accounts WHERE aid = 12346;",
            "SELECT abalance FROM pgbench_accounts WHERE aid = 7;",
            "SELECT abalance FROM pgbench_accounts WHERE aid = 2147483647;",
            "SELECT abalance FROM pgbench_accounts WHERE aid = 0012345;",
        ] {
            assert!(same_key(last, &read.constants, text), "{text:?}");
            assert_eq!(shape(text).unwrap().key, read.key);
        }
        for text in [
            "SELECT abalance FROM pgbench_accounts WHERE aid = 2147483648;",
            "SELECT abalance FROM pgbench_accounts WHERE aid = ;",
            "SELECT abalance FROM pgbench_accounts WHERE aid = 1.5;",
            "SELECT abalance FROM pgbench_accounts WHERE aid = 1e5;",
            "SELECT abalance FROM pgbench_accounts WHERE aid = 12a;",
            "SELECT abalance FROM pgbench_accounts WHERE bid = 12345;",
            "SELECT abalance FROM pgbench_accounts WHERE aid = 12345 ;",
            "SELECT abalance FROM pgbench_accounts WHERE aid = 12345;;",
            "SELECT abalance FROM pgbench_accounts WHERE aid = '12345';",
        ] {
            assert!(!same_key(last, &read.constants, text), "{text:?}");
        }
        // Two constants changed: another key may still be the same, but it is read again.
        let two = "SELECT 1 + 2";
        let read = shape(two).unwrap();
        assert!(same_key(two, &read.constants, "SELECT 1 + 3"));
        assert!(!same_key(two, &read.constants, "SELECT 4 + 3"));
    }

    /// PostgreSQL's own regression SQL (`src/test/regress/sql`), fetched by contrib/test.sh
    /// into target/sql-corpus (or PGWARD_SQL_CORPUS): every statement the fast reader reads,
    /// it reads as the scanner does.
    #[test]
    fn agrees_with_the_scanner_on_postgresql_regression_sql() {
        let dir = std::env::var_os("PGWARD_SQL_CORPUS").map_or_else(
            || std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/sql-corpus/regress"),
            std::path::PathBuf::from,
        );
        let files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| {
                panic!(
                    "{}: {e}: run contrib/test.sh, which fetches PostgreSQL's regression SQL",
                    dir.display()
                )
            })
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "sql"))
            .collect();
        assert!(
            files.len() >= 100,
            "{}: only {} files",
            dir.display(),
            files.len()
        );
        let (mut statements, mut read) = (0usize, 0usize);
        for file in files {
            let bytes = std::fs::read(&file).unwrap();
            let text = String::from_utf8_lossy(&bytes);
            // psql's meta-commands are not SQL.
            let sql: String = text
                .lines()
                .filter(|l| !l.trim_start().starts_with('\\'))
                .map(|l| format!("{l}\n"))
                .collect();
            let Ok(parts) = pg_query::split_with_scanner(&sql) else {
                continue;
            };
            for part in parts {
                statements += 1;
                read += usize::from(agrees(part));
            }
        }
        assert!(statements > 10_000, "{statements} statements");
        eprintln!("fast shape reader: read {read} of {statements} regression statements");
    }
}
