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
                    settings: t.config.words(),
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
}
