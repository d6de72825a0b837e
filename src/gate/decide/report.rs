//! SHOW TENANTS, and forgetting tenants that left.

use super::*;

impl<W> Gate<W> {
    /// One row per tenant, by name.
    pub fn tenant_stats(&self, now: Instant) -> Vec<TenantStats> {
        self.tenants
            .iter()
            .map(|(name, t)| {
                let balance = match (&t.bucket, t.config.budget()) {
                    (Some(bucket), Some(b)) => Some(bucket.balance(&b, now)),
                    _ => None,
                };
                TenantStats {
                    tenant: name.clone(),
                    settings: match t.caps {
                        0 => t.config.words(),
                        _ => format!("{} cap=1", t.config.words()).trim().to_string(),
                    },
                    balance,
                    debt: balance.map_or(0.0, |b| (-b).max(0.0)),
                    recent_use: t.recent.value(now),
                    charged: t.charged,
                    waiting: t.waiting,
                    running: t.running,
                    refusals: t.refusals.clone(),
                }
            })
            .collect()
    }

    /// Forgets tenants that were never configured and have nothing waiting, running or
    /// recently used (tenants named by tags come and go).
    pub fn forget_idle(&mut self, now: Instant) {
        self.tenants.retain(|_, t| !t.idle(now));
    }

    /// A reload: every tenant with settings of its own that `keep` does not name (gone from
    /// the policy, or set only with SET TENANT) is back to the defaults, budget and time
    /// limits included.
    pub fn reset_others(&mut self, keep: &BTreeSet<&str>) {
        for (name, t) in self.tenants.iter_mut() {
            if t.configured && !keep.contains(name.as_str()) {
                t.config = TenantConfig::default();
                t.bucket = None;
                t.configured = false;
            }
        }
    }
}
