//! What the admission gate knows of the client's prepared statements that pgward does not map
//! itself: the unnamed statement, and every named one in session pooling. It is kept from the
//! server's answers (a statement is known once its ParseComplete arrives), never from what
//! the client merely sent: a Parse the server refuses or skips changes nothing.
//!
//! Statements also come and go by SQL (PREPARE, DEALLOCATE, DISCARD ALL) and by Close. The
//! gate cannot see whether those run; it marks the names they touch instead, and a statement
//! created before such a mark is no longer known until a later Parse of its name is answered.

use std::sync::Arc;

use bytes::Bytes;
use foldhash::HashMap;

use crate::server::Definition;
use crate::wire::frontend::{tag, target};
use crate::wire::Parsed;

/// Named statements kept per session, at most.
const MAX_NAMED: usize = 10_000;

/// The bytes of a name PostgreSQL keys a prepared statement by: its first NAMEDATALEN - 1.
pub fn key(name: &[u8]) -> &[u8] {
    &name[..name.len().min(63)]
}

/// Whether the client message `tag`, `body` is a Bind or a Describe of the unnamed
/// statement: one that may have to prepare it on the server first. (Read from the names'
/// ends alone, the same way wherever it is asked.)
pub fn uses_unnamed(tag: u8, body: &[u8]) -> bool {
    match tag {
        // The portal's name, then the statement's.
        tag::BIND => body
            .iter()
            .position(|b| *b == 0)
            .is_some_and(|end| body.get(end + 1) == Some(&0)),
        tag::DESCRIBE => body.starts_with(&[target::STATEMENT, 0]),
        _ => false,
    }
}

/// The named statement a Bind or a Describe of a statement uses (none for the unnamed one).
pub fn named_statement(tag: u8, body: &[u8]) -> Option<&[u8]> {
    let rest = match tag {
        // The portal's name, then the statement's.
        tag::BIND => &body[memchr::memchr(0, body)? + 1..],
        tag::DESCRIBE => body.strip_prefix(&[target::STATEMENT])?,
        _ => return None,
    };
    let name = &rest[..memchr::memchr(0, rest)?];
    (!name.is_empty()).then_some(name)
}

#[derive(Debug, Default)]
pub struct Views {
    /// The unnamed statement the server last created for this client, with the gate's
    /// count at its Parse.
    unnamed: Option<(Arc<Parsed>, u64)>,
    /// The gate's count where something last dropped the unnamed statement (a simple Query,
    /// a Parse or a Close of it): the answer to a Parse of it from before defines nothing.
    unnamed_dropped: u64,
    /// Where the gate last lost sight of the session (see [`Views::forget`]): what was parsed
    /// before is no longer known.
    forgot: u64,
    /// Named statements the server created, by [`key`].
    named: HashMap<Bytes, Arc<Parsed>>,
    /// Names a Close, a DEALLOCATE or a PREPARE may have freed or defined while Parses were
    /// unanswered, with the gate's count there: the answer to a Parse of the name from before
    /// the mark defines nothing.
    touched: HashMap<Bytes, u64>,
    /// The same for every name.
    touched_all: u64,
    /// The gate's count of what may define or free a statement.
    seq: u64,
    /// Parses went to the server that the gate did not see (the session ran without a
    /// policy for a while): a statement not in view may still exist.
    pub partial: bool,
    /// The unnamed statement as it was before the Parses of it sent since, which the server
    /// may yet skip (an error before them in their batch): put back if it skips them all.
    before_parses: Option<BeforeParses>,
}

/// The unnamed statement before Parses of it that are not answered yet (see
/// [`Views::parse_unnamed`]).
#[derive(Debug)]
struct BeforeParses {
    unnamed: Option<(Arc<Parsed>, u64)>,
    dropped: u64,
    /// Each Parse's place in the gate's count.
    parses: Vec<u64>,
}

/// Unanswered Parses of the unnamed statement followed, at most: past them the statement
/// before them is given up (the view knows less, as for any drop).
const MAX_BEFORE_PARSES: usize = 64;

impl Views {
    /// The next place in the gate's count.
    pub fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// The server answered the Parse of `definition` with ParseComplete.
    pub fn commit(&mut self, definition: &Definition) {
        let parsed = Arc::clone(&definition.parsed);
        if definition.name.is_empty() {
            if definition.seq > self.unnamed_dropped {
                self.unnamed = Some((parsed, definition.seq));
                // Nothing dropped it since: what it replaced is gone for good.
                self.before_parses = None;
            }
            return;
        }
        let name = key(&definition.name);
        let mark = self.touched.get(name).copied().unwrap_or(0);
        if definition.seq <= mark.max(self.touched_all).max(self.forgot) {
            // Something may have freed or redefined the name after this Parse was sent.
            return;
        }
        if self.named.len() < MAX_NAMED || self.named.contains_key(name) {
            self.named.insert(Bytes::copy_from_slice(name), parsed);
        }
    }

    /// What follows the messages seen so far drops the unnamed statement, as PostgreSQL
    /// does at a simple Query and at a Close of it (a Parse of it: [`Views::parse_unnamed`]).
    /// (One the server skips drops nothing there: the view then knows less than it could.)
    pub fn drop_unnamed(&mut self) {
        self.unnamed = None;
        self.unnamed_dropped = self.seq;
        self.before_parses = None;
    }

    /// A Parse of the unnamed statement follows the messages seen so far: it drops the
    /// statement, unless the server skips it (PostgreSQL never reads a skipped Parse). Returns
    /// the Parse's place in the gate's count, for [`Views::skipped_parse`].
    pub fn parse_unnamed(&mut self) -> u64 {
        let before = self.before_parses.take();
        let mut before = before.unwrap_or_else(|| BeforeParses {
            unnamed: self.unnamed.take(),
            dropped: self.unnamed_dropped,
            parses: Vec::new(),
        });
        self.drop_unnamed();
        let seq = self.next_seq();
        if before.parses.len() < MAX_BEFORE_PARSES {
            before.parses.push(seq);
            self.before_parses = Some(before);
        }
        seq
    }

    /// The server skipped the Parse of the unnamed statement at `seq` in the gate's count
    /// (an error before it in its batch): when it skipped every Parse of it since the
    /// statement last known, that statement is the unnamed one again.
    pub fn skipped_parse(&mut self, seq: u64) {
        let Some(before) = self.before_parses.as_mut() else {
            return;
        };
        before.parses.retain(|s| *s != seq);
        if before.parses.is_empty() {
            let before = self.before_parses.take().expect("looked at above");
            self.unnamed = before.unnamed;
            self.unnamed_dropped = before.dropped;
        }
    }

    /// The unnamed statement, as the server last created it.
    pub fn unnamed(&self) -> Option<Arc<Parsed>> {
        let (parsed, seq) = self.unnamed.as_ref()?;
        (*seq > self.forgot).then(|| Arc::clone(parsed))
    }

    /// The named statement `name`.
    pub fn named(&self, name: &[u8]) -> Option<Arc<Parsed>> {
        self.named.get(key(name)).cloned()
    }

    /// `name` may be freed or defined from here on by something other than a Parse: it is
    /// no longer known.
    pub fn touch(&mut self, name: &[u8]) {
        let name = key(name);
        self.named.remove(name);
        let seq = self.next_seq();
        if self.touched.len() >= MAX_NAMED {
            // Only Parses still unanswered are concerned: theirs define nothing.
            self.touched_all = seq;
            self.touched.clear();
            return;
        }
        self.touched.insert(Bytes::copy_from_slice(name), seq);
    }

    /// Every name may be freed or defined from here on.
    pub fn touch_all(&mut self) {
        self.touched_all = self.next_seq();
        self.touched.clear();
        self.named.clear();
    }

    /// Names are marked (see [`Views::settle`]).
    pub fn has_marks(&self) -> bool {
        !self.touched.is_empty()
    }

    /// The server has answered every Parse sent: the marks have nothing left to hide.
    pub fn settle(&mut self) {
        if !self.touched.is_empty() {
            self.touched.clear();
        }
    }

    /// Messages go to the server that the gate does not read (the session runs without a
    /// policy): from here on no statement is known but those parsed later, and one not in
    /// view may exist.
    pub fn forget(&mut self) {
        self.partial = true;
        // The answers to Parses sent so far define nothing.
        self.forgot = self.seq;
        self.before_parses = None;
        if !self.named.is_empty() || !self.touched.is_empty() || self.unnamed.is_some() {
            self.touched.clear();
            self.named.clear();
            self.unnamed = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn definition(views: &mut Views, name: &str, text: &'static str) -> Definition {
        Definition {
            name: Bytes::copy_from_slice(name.as_bytes()),
            parsed: Arc::new(Parsed::new(
                Bytes::from_static(text.as_bytes()),
                Bytes::from_static(b"\0\0"),
            )),
            seq: views.next_seq(),
        }
    }

    fn text(parsed: Option<Arc<Parsed>>) -> Option<Bytes> {
        parsed.map(|p| p.text.clone())
    }

    #[test]
    fn a_statement_is_known_once_its_parse_is_answered() {
        let mut views = Views::default();
        let d = definition(&mut views, "s1", "SELECT 1");
        assert_eq!(views.named(b"s1"), None, "sent is not answered");
        views.commit(&d);
        assert_eq!(text(views.named(b"s1")).as_deref(), Some(&b"SELECT 1"[..]));
        let u = definition(&mut views, "", "SELECT 2");
        views.commit(&u);
        assert_eq!(text(views.unnamed()).as_deref(), Some(&b"SELECT 2"[..]));
    }

    #[test]
    fn a_mark_hides_what_was_parsed_before_it_not_after() {
        let mut views = Views::default();
        let before = definition(&mut views, "s1", "SELECT 1");
        views.touch(b"s1");
        let after = definition(&mut views, "s2", "SELECT 2");
        // Answered after the mark, parsed before it: still hidden.
        views.commit(&before);
        views.commit(&after);
        assert_eq!(views.named(b"s1"), None);
        assert!(views.named(b"s2").is_some());
        let again = definition(&mut views, "s1", "SELECT 3");
        views.commit(&again);
        assert_eq!(text(views.named(b"s1")).as_deref(), Some(&b"SELECT 3"[..]));
        views.touch_all();
        assert_eq!(views.named(b"s1"), None);
        assert_eq!(views.named(b"s2"), None);
    }

    #[test]
    fn names_are_told_apart_by_their_first_63_bytes() {
        let mut views = Views::default();
        let stem = "a".repeat(63);
        let one = definition(&mut views, &format!("{stem}1"), "SELECT 1");
        views.commit(&one);
        assert!(views.named(format!("{stem}2").as_bytes()).is_some());
        views.touch(format!("{stem}x").as_bytes());
        assert_eq!(views.named(format!("{stem}1").as_bytes()), None);
    }

    #[test]
    fn closing_many_names_keeps_the_live_ones() {
        let mut views = Views::default();
        let live = definition(&mut views, "live", "SELECT 1");
        views.commit(&live);
        for i in 0..(MAX_NAMED + 100) {
            let name = format!("s{i}");
            let d = definition(&mut views, &name, "SELECT 2");
            views.commit(&d);
            views.touch(name.as_bytes());
        }
        assert!(views.named(b"live").is_some());
        views.settle();
        let after = definition(&mut views, "later", "SELECT 3");
        views.commit(&after);
        assert!(views.named(b"later").is_some());
    }

    #[test]
    fn what_was_parsed_before_the_gate_looked_away_is_forgotten() {
        let mut views = Views::default();
        let named = definition(&mut views, "s1", "SELECT 1");
        let unnamed = definition(&mut views, "", "SELECT 2");
        views.forget();
        views.commit(&named);
        views.commit(&unnamed);
        assert!(views.partial);
        assert_eq!(views.named(b"s1"), None);
        assert_eq!(views.unnamed(), None);
        let later = definition(&mut views, "", "SELECT 3");
        views.commit(&later);
        assert_eq!(text(views.unnamed()).as_deref(), Some(&b"SELECT 3"[..]));
    }

    #[test]
    fn a_drop_of_the_unnamed_statement_hides_the_parses_before_it() {
        let mut views = Views::default();
        let first = definition(&mut views, "", "SELECT 1");
        views.commit(&first);
        // A Parse of it sent, then a simple Query, before the Parse is answered.
        views.drop_unnamed();
        let second = definition(&mut views, "", "SELECT 2");
        assert_eq!(views.unnamed(), None, "dropped before its answer");
        views.drop_unnamed();
        views.commit(&second);
        assert_eq!(views.unnamed(), None, "the Query came after it");
        views.drop_unnamed();
        let third = definition(&mut views, "", "SELECT 3");
        views.commit(&third);
        assert_eq!(text(views.unnamed()).as_deref(), Some(&b"SELECT 3"[..]));
    }

    fn unnamed_parse(views: &mut Views, text: &'static str) -> Definition {
        let seq = views.parse_unnamed();
        Definition {
            name: Bytes::new(),
            parsed: Arc::new(Parsed::new(
                Bytes::from_static(text.as_bytes()),
                Bytes::from_static(b"\0\0"),
            )),
            seq,
        }
    }

    #[test]
    fn parses_of_the_unnamed_statement_that_the_server_skips_drop_nothing() {
        let mut views = Views::default();
        let first = unnamed_parse(&mut views, "SELECT 1");
        views.commit(&first);
        // Two Parses skipped: the first statement again, once both are known skipped.
        let two = unnamed_parse(&mut views, "SELECT 2");
        let three = unnamed_parse(&mut views, "SELECT 3");
        assert_eq!(views.unnamed(), None);
        views.skipped_parse(three.seq);
        assert_eq!(views.unnamed(), None, "the other may still run");
        views.skipped_parse(two.seq);
        assert_eq!(text(views.unnamed()).as_deref(), Some(&b"SELECT 1"[..]));
        // One that failed (not skipped) dropped it; a skip after it brings nothing back.
        let _failed = unnamed_parse(&mut views, "SELEC 4");
        let skipped = unnamed_parse(&mut views, "SELECT 5");
        views.skipped_parse(skipped.seq);
        assert_eq!(views.unnamed(), None);
        // One answered replaces it for good, and a simple Query drops it for good.
        let six = unnamed_parse(&mut views, "SELECT 6");
        views.commit(&six);
        let seven = unnamed_parse(&mut views, "SELECT 7");
        views.drop_unnamed();
        views.skipped_parse(seven.seq);
        assert_eq!(views.unnamed(), None, "the Query dropped it");
        let eight = unnamed_parse(&mut views, "SELECT 8");
        views.commit(&eight);
        let nine = unnamed_parse(&mut views, "SELECT 9");
        views.forget();
        views.skipped_parse(nine.seq);
        assert_eq!(views.unnamed(), None, "forgotten");
    }

    #[test]
    fn binds_and_describes_of_the_unnamed_statement_are_told_by_their_names() {
        assert!(uses_unnamed(tag::BIND, b"\0\0\0\0"));
        assert!(uses_unnamed(tag::BIND, b"p\0\0\0\0"));
        assert!(!uses_unnamed(tag::BIND, b"\0s\0\0\0"));
        assert!(!uses_unnamed(tag::BIND, b"p"));
        assert!(uses_unnamed(tag::DESCRIBE, b"S\0"));
        assert!(!uses_unnamed(tag::DESCRIBE, b"P\0"));
        assert!(!uses_unnamed(tag::DESCRIBE, b"Ss\0"));
        assert!(!uses_unnamed(tag::EXECUTE, b"\0\0\0\0\0"));
    }
}
