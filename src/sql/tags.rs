//! sqlcommenter tags (`/*tenant='acme',priority='best_effort'*/`) and the lexical checks that
//! need PostgreSQL's scanner.
//!
//! The scanner is PostgreSQL's own tokenizer (through pg_query), so text that only looks like a
//! comment inside a string literal, a quoted identifier or a dollar-quoted body is never taken
//! for one. The tags come from the text's last `/* ... */` comment.

use pg_query::protobuf::{ScanToken, Token};
use std::time::Duration;

/// Longest comment read for tags; longer ones are ignored.
const MAX_COMMENT: usize = 4096;
/// Most key/value pairs read from one comment.
const MAX_PAIRS: usize = 32;

/// How urgent a statement is, from least to most.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Priority {
    /// Runs when nothing else waits.
    BestEffort,
    /// The default.
    Normal,
    /// Goes first.
    Critical,
}

impl Priority {
    /// Reads `critical`, `normal` or `best_effort` (also `best-effort`).
    pub fn parse(s: &str) -> Option<Priority> {
        match s.to_ascii_lowercase().as_str() {
            "critical" => Some(Priority::Critical),
            "normal" => Some(Priority::Normal),
            "best_effort" | "best-effort" => Some(Priority::BestEffort),
            _ => None,
        }
    }

    /// The name used in the policy file and in tags.
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Critical => "critical",
            Priority::Normal => "normal",
            Priority::BestEffort => "best_effort",
        }
    }
}

/// The key/value pairs of a statement's sqlcommenter comment, decoded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tags {
    pairs: Vec<(String, String)>,
}

impl Tags {
    /// The value of `key`, if the comment had it.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Every pair, in the comment's order.
    pub fn pairs(&self) -> &[(String, String)] {
        &self.pairs
    }

    /// Whether there are no tags.
    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    /// The `tenant` tag.
    pub fn tenant(&self) -> Option<&str> {
        self.get("tenant").filter(|t| !t.is_empty())
    }

    /// The `priority` tag, when it names a priority.
    pub fn priority(&self) -> Option<Priority> {
        self.get("priority").and_then(Priority::parse)
    }

    /// The `deadline` tag: a duration such as `250ms`, `2s`, `1m` or a number of milliseconds.
    pub fn deadline(&self) -> Option<Duration> {
        self.get("deadline").and_then(parse_duration)
    }
}

fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let n: u64 = digits.parse().ok()?;
    match unit.trim() {
        "" | "ms" => Some(Duration::from_millis(n)),
        "s" => Some(Duration::from_secs(n)),
        "m" | "min" => n.checked_mul(60).map(Duration::from_secs),
        _ => None,
    }
}

/// The tags of the last C-style comment among `tokens` of `text`.
pub(crate) fn tags_from_tokens(text: &str, tokens: &[ScanToken]) -> Tags {
    let last = tokens
        .iter()
        .rev()
        .find(|t| t.token == Token::CComment as i32);
    last.and_then(|t| token_text(text, t))
        .and_then(|c| c.strip_prefix("/*"))
        .and_then(|c| c.strip_suffix("*/"))
        .and_then(parse_sqlcommenter)
        .unwrap_or_default()
}

/// Whether a plain `'...'` string among `tokens` holds a backslash: the only place where
/// `standard_conforming_strings` changes how PostgreSQL splits the text into tokens.
pub(crate) fn backslash_in_plain_string(text: &str, tokens: &[ScanToken]) -> bool {
    tokens
        .iter()
        .filter(|t| t.token == Token::Sconst as i32)
        .filter_map(|t| token_text(text, t))
        .any(|s| s.starts_with('\'') && s.contains('\\'))
}

fn token_text<'t>(text: &'t str, token: &ScanToken) -> Option<&'t str> {
    let start = usize::try_from(token.start).ok()?;
    let end = usize::try_from(token.end).ok()?;
    text.get(start..end)
}

/// Parses `key='value',key2='value2'` (keys and values URL-encoded, `\'` inside values).
/// `None` when the comment is not in that form.
fn parse_sqlcommenter(comment: &str) -> Option<Tags> {
    let body = comment.trim();
    if body.is_empty() || body.len() > MAX_COMMENT {
        return None;
    }
    let mut pairs = Vec::new();
    let mut rest = body;
    while !rest.is_empty() {
        if pairs.len() == MAX_PAIRS {
            return None;
        }
        let (key, after) = rest.split_once('=')?;
        let (value, after) = quoted_value(after.trim_start())?;
        pairs.push((url_decode(key.trim())?, url_decode(&value)?));
        let after = after.trim_start();
        rest = match after.strip_prefix(',') {
            Some(next) => next.trim_start(),
            None if after.is_empty() => after,
            None => return None,
        };
    }
    Some(Tags { pairs })
}

/// A `'...'` value with `\'` for a quote; returns the value and the text after it.
fn quoted_value(s: &str) -> Option<(String, &str)> {
    let inner = s.strip_prefix('\'')?;
    let mut value = String::new();
    let mut chars = inner.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' => value.push(chars.next()?.1),
            '\'' => return Some((value, inner.get(i + 1..)?)),
            c => value.push(c),
        }
    }
    None
}

fn url_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        if b == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tags(sql: &str) -> Tags {
        let tokens = pg_query::scan_tokens(sql).unwrap();
        tags_from_tokens(sql, &tokens)
    }

    #[test]
    fn reads_the_last_comment() {
        let t = tags(
            "/*tenant='x'*/ SELECT 1 /*tenant='acme',priority='best_effort',route='%2Forders'*/",
        );
        assert_eq!(t.tenant(), Some("acme"));
        assert_eq!(t.priority(), Some(Priority::BestEffort));
        assert_eq!(t.get("route"), Some("/orders"));
    }

    #[test]
    fn a_comment_inside_a_literal_is_not_a_tag() {
        assert!(tags("SELECT '/*tenant=''acme''*/'").is_empty());
        assert!(tags("SELECT $$ /*tenant='acme'*/ $$").is_empty());
        assert!(tags("SELECT \"/*tenant='acme'*/\" FROM t").is_empty());
        assert!(tags("SELECT E'\\' /*tenant=''acme''*/'").is_empty());
    }

    #[test]
    fn malformed_comments_give_no_tags() {
        assert!(tags("SELECT 1 /* just a note */").is_empty());
        assert!(tags("SELECT 1 /*tenant=acme*/").is_empty());
        assert!(tags("SELECT 1 /*tenant='acme'x*/").is_empty());
        assert!(tags("SELECT 1 /*tenant='%zz'*/").is_empty());
    }

    #[test]
    fn escaped_quotes_and_deadlines() {
        let t = tags("SELECT 1 /*app='it\\'s',deadline='250ms'*/");
        assert_eq!(t.get("app"), Some("it's"));
        assert_eq!(t.deadline(), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("2s"), Some(Duration::from_secs(2)));
        assert_eq!(parse_duration("1500"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_duration("soon"), None);
    }

    #[test]
    fn backslashes_that_depend_on_standard_conforming_strings() {
        let check =
            |sql: &str| backslash_in_plain_string(sql, &pg_query::scan_tokens(sql).unwrap());
        assert!(check("SELECT 'a\\'"));
        assert!(!check("SELECT E'a\\\\'"));
        assert!(!check("SELECT $$a\\$$"));
        assert!(!check("SELECT 1 -- \\"));
    }
}
