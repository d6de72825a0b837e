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

#[cfg(test)]
mod tests {
    use super::*;

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
