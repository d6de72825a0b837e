//! Tenants or upstreams by name, each also at a place (a slab key) that the passes and slots
//! made for it remember: the hot path finds its entry by that place, checked against the
//! name's own shared allocation, without hashing or comparing the name. A place that no
//! longer holds that name (the tenant was forgotten, its key reused) falls back to the name.

use std::sync::Arc;

use slab::Slab;

/// Where a pass or slot found its tenant or upstream: a hint, never trusted without the name.
pub type Place = usize;

/// Entries by name and by place.
#[derive(Debug)]
pub(crate) struct Registry<T> {
    entries: Slab<(Arc<str>, T)>,
    index: hashbrown::HashMap<Arc<str>, Place, foldhash::fast::RandomState>,
}

impl<T> Default for Registry<T> {
    fn default() -> Self {
        Registry {
            entries: Slab::new(),
            index: hashbrown::HashMap::default(),
        }
    }
}

impl<T> Registry<T> {
    /// The place of `name`, if it has one.
    pub(crate) fn find(&self, name: &str) -> Option<Place> {
        self.index.get(name).copied()
    }

    /// Whether `place` holds `name` itself (the same allocation, so the same name).
    pub(crate) fn holds(&self, place: Place, name: &Arc<str>) -> bool {
        self.entries
            .get(place)
            .is_some_and(|(n, _)| Arc::ptr_eq(n, name))
    }

    /// The place of `name`, given `hint` where it was last.
    pub(crate) fn locate(&self, hint: Place, name: &Arc<str>) -> Option<Place> {
        match self.holds(hint, name) {
            true => Some(hint),
            false => self.find(name),
        }
    }

    /// The place of `name`, made with `make` if it has none; `name` is kept, shared.
    pub(crate) fn place(&mut self, name: &Arc<str>, make: impl FnOnce() -> T) -> Place {
        if let Some(place) = self.find(name) {
            return place;
        }
        let place = self.entries.insert((Arc::clone(name), make()));
        self.index.insert(Arc::clone(name), place);
        place
    }

    /// The name at `place`, which must hold one.
    pub(crate) fn name_at(&self, place: Place) -> &Arc<str> {
        &self.entries[place].0
    }

    /// The entry at `place`, which must hold one ([`find`](Self::find), [`place`](Self::place)).
    pub(crate) fn at(&self, place: Place) -> &T {
        &self.entries[place].1
    }

    /// The entry at `place`, which must hold one.
    pub(crate) fn at_mut(&mut self, place: Place) -> &mut T {
        &mut self.entries[place].1
    }

    /// The entry of `name`.
    pub(crate) fn get(&self, name: &str) -> Option<&T> {
        self.find(name).map(|p| self.at(p))
    }

    /// The entry of `name`, given `hint` where it was last.
    pub(crate) fn get_at(&self, hint: Place, name: &Arc<str>) -> Option<&T> {
        self.locate(hint, name).map(|p| self.at(p))
    }

    /// The entry of `name`, to change.
    pub(crate) fn get_mut(&mut self, name: &str) -> Option<&mut T> {
        self.find(name).map(|p| self.at_mut(p))
    }

    /// The entry of `name` given `hint`, to change.
    pub(crate) fn get_at_mut(&mut self, hint: Place, name: &Arc<str>) -> Option<&mut T> {
        self.locate(hint, name).map(|p| self.at_mut(p))
    }

    /// How many there are.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Every entry with its name, in no order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&Arc<str>, &T)> {
        self.entries.iter().map(|(_, (n, t))| (n, t))
    }

    /// Every entry with its name, to change, in no order.
    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = (&Arc<str>, &mut T)> {
        self.entries.iter_mut().map(|(_, (n, t))| (&*n, t))
    }

    /// Every entry, in no order.
    pub(crate) fn values(&self) -> impl Iterator<Item = &T> {
        self.entries.iter().map(|(_, (_, t))| t)
    }

    /// Every entry, to change, in no order.
    pub(crate) fn values_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.entries.iter_mut().map(|(_, (_, t))| t)
    }

    /// Keeps the entries for which `keep` is true; the others' places are free again.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&str, &mut T) -> bool) {
        let index = &mut self.index;
        self.entries.retain(|_, (name, entry)| {
            let kept = keep(name, entry);
            if !kept {
                index.remove(&**name);
            }
            kept
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_place_is_trusted_only_for_the_name_it_was_made_for() {
        let mut r: Registry<u32> = Registry::default();
        let acme: Arc<str> = Arc::from("acme");
        let at = r.place(&acme, || 1);
        assert_eq!(r.place(&acme, || 2), at);
        assert_eq!(r.get_at(at, &acme), Some(&1));
        // The same name in another allocation is found by name.
        let other: Arc<str> = Arc::from("acme");
        assert!(!r.holds(at, &other));
        assert_eq!(r.get_at(at, &other), Some(&1));
        // Forgotten, its place reused by another name: the old hint finds nothing wrong.
        r.retain(|_, _| false);
        assert_eq!(r.len(), 0);
        let beta: Arc<str> = Arc::from("beta");
        assert_eq!(r.place(&beta, || 3), at);
        assert_eq!(r.get_at(at, &acme), None);
        assert_eq!(r.get_at(at, &beta), Some(&3));
        *r.get_at_mut(at, &beta).unwrap() += 1;
        assert_eq!(r.get("beta"), Some(&4));
        assert_eq!(
            r.iter().map(|(n, v)| (&**n, *v)).collect::<Vec<_>>(),
            [("beta", 4)]
        );
    }
}
