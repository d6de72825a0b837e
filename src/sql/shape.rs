//! Statement shapes: a text with the contents of its constant tokens left out, read with
//! PostgreSQL's scanner.
//!
//! Two texts with the same shape differ only inside constant tokens ('...', 42, 1.5, B'1',
//! X'1F', U&'...'); everything else, comments and whitespace included, is the same byte for
//! byte, so the parser builds the same tree from both, constants' values aside. An analysis can
//! then be shared by every text of a shape when two things hold for the first text read: every
//! constant token is a plain constant in the tree (an `A_Const`, whose value the fingerprint and
//! the normalized text leave out), and no fact the rules use was read from a constant's value
//! (`set_config`'s arguments, `SET` values, options such as `CONCURRENTLY false`). The
//! [`Collector`](super::collect::Collector) reports both; [`Shape::is_shared_by`] checks the
//! first.

use pg_query::protobuf::Token;

/// One constant token: where it starts, and where a `-` right before it starts (PostgreSQL folds
/// `-1` into one constant located at the `-`).
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Constant {
    pub(super) start: i32,
    pub(super) minus: Option<i32>,
}

/// The shape of a text and where its constants are.
#[derive(Debug, Default)]
pub(crate) struct Shape {
    /// The text with each constant token replaced by a NUL and a letter for its kind (a text
    /// pgward reads never holds a NUL, so a key cannot be confused with a text).
    pub key: String,
    pub(super) constants: Vec<Constant>,
}

/// The kinds of constant tokens, with the letter each stands for in a key.
const CONSTANTS: [(Token, char); 6] = [
    (Token::Sconst, 's'),
    (Token::Usconst, 'u'),
    (Token::Iconst, 'i'),
    (Token::Fconst, 'f'),
    (Token::Bconst, 'b'),
    (Token::Xconst, 'x'),
];

pub(super) fn constant_letter(token: i32) -> Option<char> {
    CONSTANTS
        .iter()
        .find(|(t, _)| *t as i32 == token)
        .map(|(_, c)| *c)
}

impl Shape {
    /// The shape of `text` under PostgreSQL's default scanner; `None` when the scanner refuses
    /// it or it holds a NUL. Callers make sure the server reads it with the same scanner
    /// (standard_conforming_strings on, or no backslash). The common texts are read without
    /// the scanner ([`super::fast_shape`]), the rest with it.
    pub(crate) fn of(text: &str) -> Option<Shape> {
        super::fast_shape::shape(text).or_else(|| Shape::scanned(text))
    }

    /// [`Shape::of`], read by PostgreSQL's scanner.
    pub(crate) fn scanned(text: &str) -> Option<Shape> {
        if text.contains('\0') {
            return None;
        }
        let tokens = super::scan_tokens(text)?;
        let mut key = String::with_capacity(text.len());
        let mut constants = Vec::new();
        let mut copied = 0;
        let mut previous: Option<(i32, i32)> = None;
        for token in &tokens {
            if let Some(letter) = constant_letter(token.token) {
                let start = usize::try_from(token.start).ok()?;
                let end = usize::try_from(token.end).ok()?;
                key.push_str(text.get(copied..start)?);
                key.push('\0');
                key.push(letter);
                copied = end;
                let minus = previous
                    .filter(|&(s, e)| text.get(s as usize..e as usize) == Some("-"))
                    .map(|(s, _)| s);
                constants.push(Constant {
                    start: token.start,
                    minus,
                });
            }
            previous = Some((token.start, token.end));
        }
        key.push_str(text.get(copied..)?);
        Some(Shape { key, constants })
    }

    /// Whether every constant token of the text is one of the `A_Const` nodes at `locations`
    /// (their byte offsets in the text, as the parse tree reports them).
    pub(crate) fn is_shared_by(&self, locations: &[i64]) -> bool {
        let at = |offset: i32| locations.contains(&i64::from(offset));
        self.constants
            .iter()
            .all(|c| at(c.start) || c.minus.is_some_and(at))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constants_are_left_out_and_the_rest_kept() {
        let a = Shape::of("SELECT a FROM t WHERE b = 'x' AND c = 1 /* note */").unwrap();
        let b = Shape::of("SELECT a FROM t WHERE b = 'yy' AND c = 250 /* note */").unwrap();
        assert_eq!(a.key, b.key);
        assert_eq!(a.constants.len(), 2);
        let c = Shape::of("SELECT a FROM t WHERE b = 'x' AND c = 1.5 /* note */").unwrap();
        assert_ne!(a.key, c.key);
        let d = Shape::of("SELECT a FROM t  WHERE b = 'x' AND c = 1 /* note */").unwrap();
        assert_ne!(a.key, d.key);
        let e = Shape::of("SELECT a FROM t WHERE b = 'x' AND c = 1 /* other */").unwrap();
        assert_ne!(a.key, e.key);
        assert!(Shape::of("SELECT 'open").is_none());
    }

    #[test]
    fn a_text_of_whitespace_alone_has_an_empty_shape() {
        for text in ["", " ", "\n\t", "\u{b}", " \u{c}\r"] {
            let s = Shape::scanned(text).unwrap();
            assert_eq!(s.key, text);
            assert!(s.constants.is_empty());
        }
    }

    #[test]
    fn a_minus_sign_is_part_of_the_constant() {
        let s = Shape::of("SELECT -1").unwrap();
        assert!(s.is_shared_by(&[7]));
        assert!(s.is_shared_by(&[8]));
        assert!(!s.is_shared_by(&[0]));
    }
}
