//! The protocol-level prepared statements one server holds in transaction pooling: pgward's
//! own names, least recently used first out, never evicting one the open batch still needs.

use foldhash::HashMap;

use bytes::Bytes;

#[derive(Debug, Default, Clone)]
pub struct ServerStatements {
    /// Statement name to the tick of its last use, whether the open batch uses it, and where
    /// the Parse that put it there stands.
    entries: HashMap<Bytes, (u64, bool, ParseState)>,
    tick: u64,
}

/// Where the Parse pgward sent for a statement stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ParseState {
    /// Answered (or the server was found to have it).
    Answered,
    /// Sent in the open batch: a message behind it in the batch is skipped with it.
    ThisBatch,
    /// Sent in a batch that ended, not answered yet: the server may yet skip it.
    EarlierBatch,
}

impl ServerStatements {
    pub fn contains(&self, name: &[u8]) -> bool {
        self.entries.contains_key(name)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether a message sent now may use the statement: the server has it, or its Parse
    /// went out in the open batch (if the server skips that Parse, it skips the message
    /// too). Not while its Parse went out in an earlier batch and is not answered.
    pub fn settled(&self, name: &[u8]) -> bool {
        self.entries
            .get(name)
            .is_some_and(|(_, _, parse)| *parse != ParseState::EarlierBatch)
    }

    /// Marks a statement used by the open batch (inserting it if new).
    pub fn use_in_batch(&mut self, name: &Bytes) {
        self.tick += 1;
        let tick = self.tick;
        self.entries
            .entry(name.clone())
            .and_modify(|e| {
                e.0 = tick;
                e.1 = true;
            })
            .or_insert((tick, true, ParseState::Answered));
    }

    /// A Parse of the statement goes out in the open batch; it is used there.
    pub fn parse_in_batch(&mut self, name: &Bytes) {
        self.tick += 1;
        self.entries
            .insert(name.clone(), (self.tick, true, ParseState::ThisBatch));
    }

    /// The server answered a Parse of the statement (ParseComplete).
    pub fn parse_answered(&mut self, name: &[u8]) {
        if let Some(e) = self.entries.get_mut(name) {
            e.2 = ParseState::Answered;
        }
    }

    /// The least recently used statement that no open batch needs, to close when the set
    /// holds `capacity` or more.
    pub fn victim(&self, capacity: usize) -> Option<Bytes> {
        if self.entries.len() < capacity {
            return None;
        }
        self.entries
            .iter()
            // Not one whose Parse went out in an earlier batch and is not answered: if the
            // server skipped that Parse and then the Close too, it would be taken as there.
            .filter(|(_, (_, pinned, parse))| !pinned && *parse != ParseState::EarlierBatch)
            .min_by_key(|(_, (tick, _, _))| *tick)
            .map(|(name, _)| name.clone())
    }

    pub fn remove(&mut self, name: &[u8]) {
        self.entries.remove(name);
    }

    pub fn clear(&mut self) {
        self.entries.clear();
    }

    /// A Sync was sent: no statement is pinned by a batch any more, and the Parses sent in
    /// it are in an earlier batch now.
    pub fn end_batch(&mut self) {
        for (_, pinned, parse) in self.entries.values_mut() {
            *pinned = false;
            if *parse == ParseState::ThisBatch {
                *parse = ParseState::EarlierBatch;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &'static str) -> Bytes {
        Bytes::from_static(s.as_bytes())
    }

    #[test]
    fn least_recently_used_unpinned_goes_first() {
        let mut s = ServerStatements::default();
        s.use_in_batch(&b("a"));
        s.use_in_batch(&b("b"));
        assert_eq!(s.victim(3), None, "below capacity");
        assert_eq!(s.victim(2), None, "everything is pinned by the open batch");
        s.end_batch();
        s.use_in_batch(&b("a"));
        assert_eq!(s.victim(2), Some(b("b")));
        s.end_batch();
        assert_eq!(s.victim(2), Some(b("b")));
        s.remove(b"b");
        assert!(!s.contains(b"b"));
        assert_eq!(s.len(), 1);
        s.clear();
        assert!(s.is_empty());
    }

    #[test]
    fn a_statement_whose_parse_is_not_answered_is_no_victim() {
        let mut s = ServerStatements::default();
        s.parse_in_batch(&b("a"));
        s.end_batch();
        s.use_in_batch(&b("b"));
        s.end_batch();
        assert_eq!(s.victim(1), Some(b("b")), "a, older, is not answered");
        s.parse_answered(b"a");
        assert_eq!(s.victim(1), Some(b("a")));
    }

    #[test]
    fn a_parse_in_an_earlier_batch_is_settled_by_its_answer() {
        let mut s = ServerStatements::default();
        s.parse_in_batch(&b("a"));
        assert!(s.settled(b"a"), "its own batch is skipped with it");
        s.end_batch();
        assert!(!s.settled(b"a"), "the server may skip it");
        s.use_in_batch(&b("a"));
        assert!(!s.settled(b"a"), "a use does not answer it");
        s.parse_answered(b"a");
        assert!(s.settled(b"a"));
        s.end_batch();
        assert!(s.settled(b"a"));
    }
}
