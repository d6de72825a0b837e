//! A bounded cache of analyses keyed by statement text.
//!
//! Two generations approximate least-recently-used eviction in O(1): entries go into the young
//! generation; when it holds half the capacity, it becomes the old one and the previous old one
//! is dropped. A hit in the old generation moves the entry back to the young one.

use foldhash::HashMap;
use std::hash::Hash;
use std::sync::Arc;

/// One generation-pair cache.
#[derive(Debug)]
pub(crate) struct Generations<V> {
    young: HashMap<Box<str>, Arc<V>>,
    old: HashMap<Box<str>, Arc<V>>,
    half: usize,
}

impl<V> Generations<V> {
    pub(crate) fn new(capacity: usize) -> Self {
        Generations {
            young: HashMap::default(),
            old: HashMap::default(),
            half: (capacity / 2).max(1),
        }
    }

    pub(crate) fn get(&mut self, key: &str) -> Option<Arc<V>> {
        if let Some(v) = self.young.get(key) {
            return Some(Arc::clone(v));
        }
        let (k, v) = self.old.remove_entry(key)?;
        self.put(k, Arc::clone(&v));
        Some(v)
    }

    pub(crate) fn put(&mut self, key: Box<str>, value: Arc<V>) {
        if self.young.len() >= self.half {
            self.old = std::mem::take(&mut self.young);
        }
        self.young.insert(key, value);
    }

    pub(crate) fn len(&self) -> usize {
        self.young.len() + self.old.len()
    }
}

/// Caches per mode (the settings a reading depends on); there are only a handful of modes.
#[derive(Debug)]
pub(crate) struct ModeCache<M, V> {
    modes: Vec<(M, Generations<V>)>,
    capacity: usize,
}

impl<M: Eq + Hash + Copy, V> ModeCache<M, V> {
    pub(crate) fn new(capacity: usize) -> Self {
        ModeCache {
            modes: Vec::new(),
            capacity,
        }
    }

    pub(crate) fn get(&mut self, mode: M, key: &str) -> Option<Arc<V>> {
        self.modes
            .iter_mut()
            .find(|(m, _)| *m == mode)
            .and_then(|(_, g)| g.get(key))
    }

    pub(crate) fn put(&mut self, mode: M, key: &str, value: Arc<V>) {
        let index = match self.modes.iter().position(|(m, _)| *m == mode) {
            Some(i) => i,
            None => {
                self.modes.push((mode, Generations::new(self.capacity)));
                self.modes.len() - 1
            }
        };
        if let Some((_, g)) = self.modes.get_mut(index) {
            g.put(key.into(), value);
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.modes.iter().map(|(_, g)| g.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stays_bounded_and_keeps_recent_entries() {
        let mut c = Generations::new(4);
        for i in 0..100 {
            c.put(i.to_string().into(), Arc::new(i));
            assert!(c.len() <= 4);
        }
        assert_eq!(c.get("99").as_deref(), Some(&99));
        assert_eq!(c.get("0"), None);
    }

    #[test]
    fn an_old_hit_survives_the_next_turn() {
        let mut c = Generations::new(4);
        c.put("a".into(), Arc::new(1));
        c.put("b".into(), Arc::new(2));
        c.put("c".into(), Arc::new(3)); // a, b become old
        assert!(c.get("a").is_some()); // a moves back to young
        c.put("d".into(), Arc::new(4)); // young (c, a) becomes old; b dropped
        assert!(c.get("a").is_some());
        assert!(c.get("b").is_none());
    }
}
