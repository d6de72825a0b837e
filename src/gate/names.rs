//! Tenant, upstream and database names, each kept once: a pass, a slot and the counts by
//! name share it instead of copying it for every request.

use std::sync::Arc;

/// The names in use. One no pass, slot or count holds any more is dropped at the next
/// sweep, which comes once the set has doubled since the last one.
#[derive(Debug, Default)]
pub(crate) struct Names {
    names: foldhash::HashSet<Arc<str>>,
    /// How many names the last sweep kept.
    kept: usize,
}

/// Names kept without a sweep.
const SWEEP_FROM: usize = 64;

impl Names {
    /// The name `name`, shared.
    pub(crate) fn get(&mut self, name: &str) -> Arc<str> {
        if let Some(found) = self.names.get(name) {
            return Arc::clone(found);
        }
        if self.names.len() >= (2 * self.kept).max(SWEEP_FROM) {
            self.names.retain(|n| Arc::strong_count(n) > 1);
            self.kept = self.names.len();
        }
        let name: Arc<str> = Arc::from(name);
        self.names.insert(Arc::clone(&name));
        name
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.names.len()
    }
}

/// Counts by name, for names that [`Names`] keeps: a name is found by its allocation (one per
/// name while anything holds it; the count holds its name, so the address is no other's),
/// never by its bytes.
#[derive(Debug, Default)]
pub(crate) struct NameCounts {
    counts: foldhash::HashMap<usize, (Arc<str>, usize)>,
}

/// Counts of a map this small keep their key at zero: a slot taken and given back at every
/// statement then neither inserts nor removes each time.
const KEPT_AT_ZERO: usize = 64;

/// Where `name` is kept.
fn address(name: &Arc<str>) -> usize {
    Arc::as_ptr(name).cast::<u8>() as usize
}

impl NameCounts {
    /// The count of `name` (0 if none).
    pub(crate) fn get(&self, name: &Arc<str>) -> usize {
        self.counts.get(&address(name)).map_or(0, |(_, n)| *n)
    }

    /// Adds one to `name`'s count.
    pub(crate) fn add(&mut self, name: &Arc<str>) {
        debug_assert!(
            self.counts
                .values()
                .all(|(k, _)| Arc::ptr_eq(k, name) || **k != **name),
            "a name counted under two allocations: {name}"
        );
        let entry = self.counts.entry(address(name));
        entry.or_insert_with(|| (Arc::clone(name), 0)).1 += 1;
    }

    /// Takes one from `name`'s count; a count at zero is kept while the map is small.
    pub(crate) fn sub(&mut self, name: &Arc<str>) {
        let small = self.counts.len() <= KEPT_AT_ZERO;
        let at = address(name);
        if let Some((_, n)) = self.counts.get_mut(&at) {
            *n = n.saturating_sub(1);
            if *n == 0 && !small {
                self.counts.remove(&at);
            }
        }
    }

    /// Every name counted (some maybe at zero) and its count, in no order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&Arc<str>, usize)> {
        self.counts.values().map(|(k, n)| (k, *n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_follow_a_kept_name_and_empty_ones_go_from_a_large_map() {
        let mut names = Names::default();
        let mut counts = NameCounts::default();
        let a = names.get("acme");
        counts.add(&a);
        counts.add(&names.get("acme"));
        assert_eq!(counts.get(&a), 2);
        counts.sub(&a);
        counts.sub(&a);
        counts.sub(&a);
        assert_eq!(counts.get(&a), 0);
        // Small: kept at zero.
        assert_eq!(counts.iter().count(), 1);
        let many: Vec<Arc<str>> = (0..100).map(|i| names.get(&format!("t{i}"))).collect();
        for n in &many {
            counts.add(n);
        }
        for n in &many {
            counts.sub(n);
        }
        assert!(counts.iter().count() <= KEPT_AT_ZERO + 1);
        assert!(many.iter().all(|n| counts.get(n) == 0));
    }

    #[test]
    fn a_name_is_shared_and_one_nobody_holds_is_swept() {
        let mut names = Names::default();
        let a = names.get("acme");
        assert!(Arc::ptr_eq(&a, &names.get("acme")));
        for i in 0..10_000 {
            names.get(&format!("tenant-{i}"));
            assert!(names.len() <= SWEEP_FROM);
        }
        // Held all along: still the same.
        assert!(Arc::ptr_eq(&a, &names.get("acme")));
    }
}
