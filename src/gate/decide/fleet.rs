//! The gate's side of limits shared with other pgward instances: what this instance used and
//! wants of each tenant's budget and each upstream's slots, and the shares the fleet's lease
//! gives it, put in force as the budget's rate and the upstream's slots.

use std::time::Instant;

use super::super::bucket::{Budget, USE_HALF_LIFE};
use super::Gate;

/// What this instance used and wants of one shared capacity.
#[derive(Clone, Debug, PartialEq)]
pub struct FleetWant {
    /// The tenant or the upstream.
    pub name: String,
    /// The whole capacity the settings give: server-seconds per second, or slots.
    pub capacity: f64,
    /// What this instance used lately, plus the whole capacity while its own share holds
    /// work back.
    pub demand: f64,
    /// What it holds now, of what is taken and given back (an upstream's slots; a budget is
    /// spent at admission: 0).
    pub using: f64,
}

/// [`FleetWant`]s of every budget and every upstream.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FleetWants {
    pub tenants: Vec<FleetWant>,
    pub upstreams: Vec<FleetWant>,
}

/// A budget cut to this instance's share of its rate: the rate is the share (never more than
/// the settings'), the burst shrinks in proportion.
pub(super) fn fleet_budget(b: Budget, share: Option<f64>) -> Budget {
    let Some(share) = share else { return b };
    let rate = share.clamp(0.0, b.rate);
    let burst = match b.rate > 0.0 {
        true => b.burst * rate / b.rate,
        false => 0.0,
    };
    Budget { rate, burst, ..b }
}

impl<W> Gate<W> {
    /// Shares budgets and slots with other instances (`on`), or stops: on, whatever has no
    /// share yet has none (nothing shared is admitted until a lease comes); off, every share
    /// is lifted.
    pub fn set_fleet(&mut self, on: bool, now: Instant) {
        self.fleet = on;
        for state in self.tenants.values_mut() {
            state.fleet = match on {
                true => state.fleet.or(Some(0.0)),
                false => None,
            };
            state.rebudget(now);
        }
        for up in self.upstreams.values_mut() {
            up.fleet = match on {
                true => up.fleet.or(Some(0)),
                false => None,
            };
        }
    }

    /// Whether budgets and slots are shared with other instances.
    pub fn fleet(&self) -> bool {
        self.fleet
    }

    /// What this instance used and wants of every budget and every upstream's slots. A
    /// budget's use is its recent charge as a rate; an upstream's, its slots held and the
    /// tickets waiting for one.
    pub fn fleet_wants(&self, now: Instant) -> FleetWants {
        let per_second = std::f64::consts::LN_2 / USE_HALF_LIFE.as_secs_f64();
        let mut tenants: Vec<FleetWant> = self
            .tenants
            .iter()
            .filter_map(|(name, t)| {
                let capacity = t.config.budget()?.rate;
                // Work waits, or the share was spent into debt (a share of nothing owes from
                // the start, but holds nothing back that nobody asked for).
                let held_back = t.waiting > 0 || t.in_debt(now);
                let used = t.recent.value(now) * per_second;
                Some(FleetWant {
                    name: name.to_string(),
                    capacity,
                    demand: used + if held_back { capacity } else { 0.0 },
                    using: 0.0,
                })
            })
            .collect();
        let mut upstreams: Vec<FleetWant> = self
            .upstreams
            .iter()
            .map(|(name, up)| {
                let busy = up.fast.active + up.slow.active;
                let waiting = up.fast.queue.len() + up.slow.queue.len();
                FleetWant {
                    name: name.to_string(),
                    capacity: up.limits.fast.saturating_add(up.limits.slow) as f64,
                    demand: (busy + waiting) as f64,
                    using: busy as f64,
                }
            })
            .collect();
        tenants.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        upstreams.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        FleetWants { tenants, upstreams }
    }

    /// This instance's share of `tenant`'s rate (`None`: the whole of it).
    pub fn set_fleet_rate(&mut self, tenant: &str, share: Option<f64>, now: Instant) {
        let state = self.tenant_mut(tenant, now);
        if state.fleet != share {
            state.fleet = share;
            state.rebudget(now);
        }
    }

    /// This instance's share of `upstream`'s slots (`None`: all of them).
    pub fn set_fleet_slots(&mut self, upstream: &str, share: Option<usize>) {
        self.upstream_mut(upstream).fleet = share;
    }

    /// The share of a tenant's rate in force, if shared.
    pub fn fleet_rate(&self, tenant: &str) -> Option<f64> {
        self.tenants.get(tenant)?.fleet
    }

    /// The share of an upstream's slots in force, if shared.
    pub fn fleet_slots(&self, upstream: &str) -> Option<usize> {
        self.upstreams.get(upstream)?.fleet
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gate::{GateSettings, TenantConfig};

    #[test]
    fn a_share_of_the_rate_shrinks_the_burst_with_it_and_nothing_before_a_lease() {
        let b = Budget {
            rate: 2.0,
            burst: 4.0,
            min_charge: 0.001,
        };
        assert_eq!(fleet_budget(b, None), b);
        let half = fleet_budget(b, Some(1.0));
        assert_eq!((half.rate, half.burst), (1.0, 2.0));
        assert_eq!(
            fleet_budget(b, Some(5.0)),
            b,
            "never more than the settings"
        );
        let now = Instant::now();
        let mut gate: Gate<()> = Gate::new(GateSettings::default(), 1);
        let config = TenantConfig {
            rate: Some(2.0),
            ..TenantConfig::default()
        };
        gate.configure_tenant("acme", config.clone(), now);
        gate.set_fleet(true, now);
        assert_eq!(gate.fleet_rate("acme"), Some(0.0));
        gate.configure_tenant("other", config, now);
        assert_eq!(
            gate.fleet_rate("other"),
            Some(0.0),
            "a new budget waits for a lease"
        );
        gate.set_fleet_rate("acme", Some(0.5), now);
        let wants = gate.fleet_wants(now);
        assert_eq!(wants.tenants.len(), 2);
        assert_eq!(wants.tenants[0].capacity, 2.0);
        gate.set_fleet(false, now);
        assert_eq!(gate.fleet_rate("acme"), None);
    }
}
