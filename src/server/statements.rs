//! The protocol-level prepared statements one server holds in transaction pooling: pgward's
//! own names, least recently used first out, never evicting one the open batch still needs.

use foldhash::HashMap;

use bytes::Bytes;

#[derive(Debug, Default, Clone)]
pub struct ServerStatements {
    /// Statement name to the tick of its last use, and whether the open batch uses it.
    entries: HashMap<Bytes, (u64, bool)>,
    tick: u64,
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

    /// Marks a statement used by the open batch (inserting it if new).
    pub fn use_in_batch(&mut self, name: &Bytes) {
        self.tick += 1;
        self.entries.insert(name.clone(), (self.tick, true));
    }

    /// The least recently used statement that no open batch needs, to close when the set
    /// holds `capacity` or more.
    pub fn victim(&self, capacity: usize) -> Option<Bytes> {
        if self.entries.len() < capacity {
            return None;
        }
        self.entries
            .iter()
            .filter(|(_, (_, pinned))| !pinned)
            .min_by_key(|(_, (tick, _))| *tick)
            .map(|(name, _)| name.clone())
    }

    pub fn remove(&mut self, name: &[u8]) {
        self.entries.remove(name);
    }

    pub fn clear(&mut self) {
        self.entries.clear();
    }

    /// A Sync was sent: no statement is pinned by a batch any more.
    pub fn end_batch(&mut self) {
        for (_, pinned) in self.entries.values_mut() {
            *pinned = false;
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
}
