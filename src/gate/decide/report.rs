//! SHOW TENANTS, and forgetting tenants that left.

use super::*;

impl<W> Gate<W> {
    /// One row per tenant, by name.
    pub fn tenant_stats(&self, now: Instant) -> Vec<TenantStats> {
        let mut rows: Vec<TenantStats> = self
            .tenants
            .iter()
            .map(|(name, t)| {
                let balance = balance_of(t, now);
                TenantStats {
                    tenant: name.to_string(),
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
            .collect();
        rows.sort_unstable_by(|a, b| a.tenant.cmp(&b.tenant));
        rows
    }

    /// What the metrics show of the tenants: the `cap` with the most server time run and
    /// refusals (a ranking that moves slowly, so a tenant's series does not come and go from
    /// one scrape to the next) one by one, the others' gauges summed, and the totals over
    /// every tenant. Only the kept tenants' names are copied.
    pub fn tenant_metrics(&self, cap: usize, now: Instant) -> TenantMetrics {
        let weight = |t: &TenantState| t.ran + t.refusals.values().sum::<u64>() as f64;
        let mut all: Vec<(&Arc<str>, &TenantState)> = self.tenants.iter().collect();
        all.sort_unstable_by(|a, b| a.0.cmp(b.0));
        if all.len() > cap && cap > 0 {
            all.select_nth_unstable_by(cap - 1, |a, b| {
                weight(b.1).total_cmp(&weight(a.1)).then(a.0.cmp(b.0))
            });
        }
        let kept_n = cap.min(all.len());
        let mut folded = FoldedTenants::default();
        for (_, t) in &all[kept_n..] {
            folded.tenants += 1;
            folded.debt += balance_of(t, now).map_or(0.0, |b| (-b).max(0.0));
            folded.waiting += t.waiting;
            folded.running += t.running;
        }
        let kept = all[..kept_n]
            .iter()
            .map(|(name, t)| {
                let balance = balance_of(t, now);
                TenantMetric {
                    tenant: name.to_string(),
                    ran: t.ran,
                    debt: balance.map_or(0.0, |b| (-b).max(0.0)),
                    balance,
                    waiting: t.waiting,
                    running: t.running,
                    refusals: t.refusals.clone(),
                }
            })
            .collect();
        TenantMetrics {
            known: self.tenants.len(),
            kept,
            folded,
            totals: self.totals.clone(),
        }
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
            if t.configured && !keep.contains(&**name) {
                t.config = TenantConfig::default();
                t.bucket = None;
                t.budget = None;
                t.configured = false;
            }
        }
    }
}

/// Seconds in the tenant's budget (`None`: no budget).
fn balance_of(t: &TenantState, now: Instant) -> Option<f64> {
    match (&t.bucket, t.budget) {
        (Some(bucket), Some(b)) => Some(bucket.balance(&b, now)),
        _ => None,
    }
}

/// One tenant as the metrics show it.
#[derive(Clone, Debug, PartialEq)]
pub struct TenantMetric {
    pub tenant: String,
    /// Seconds its runs took on servers since the gate first saw it (only ever added to).
    pub ran: f64,
    pub debt: f64,
    pub balance: Option<f64>,
    pub waiting: usize,
    pub running: usize,
    pub refusals: BTreeMap<RefusalReason, u64>,
}

/// The gauges of the tenants past the cap, summed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FoldedTenants {
    pub tenants: usize,
    pub debt: f64,
    pub waiting: usize,
    pub running: usize,
}

/// [`Gate::tenant_metrics`].
#[derive(Clone, Debug, PartialEq)]
pub struct TenantMetrics {
    /// Tenants the gate knows.
    pub known: usize,
    pub kept: Vec<TenantMetric>,
    pub folded: FoldedTenants,
    pub totals: GateTotals,
}
