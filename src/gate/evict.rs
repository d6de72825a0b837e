//! Runaway eviction under pressure: when tenants wait and one tenant holds more servers than
//! its share, its idle servers close first and its new work waits behind the others.

/// One tenant's load on an upstream.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TenantLoad<'a> {
    /// The tenant.
    pub tenant: &'a str,
    /// Servers (slots) it holds.
    pub servers: usize,
    /// Its requests waiting.
    pub waiting: usize,
    /// Its weight in the fair share.
    pub share: f64,
}

/// A tenant over its share while others wait.
#[derive(Clone, Debug, PartialEq)]
pub struct Runaway {
    /// The tenant.
    pub tenant: String,
    /// Servers it holds.
    pub servers: usize,
    /// Its fair part of the servers held in all.
    pub fair: f64,
}

impl Runaway {
    /// Servers held beyond the fair part.
    pub fn excess(&self) -> f64 {
        self.servers as f64 - self.fair
    }
}

/// Every tenant holding more than its share (rounded up) of the servers while another tenant
/// waits, largest excess first. A tenant's fair part is the servers (`capacity`, or those in
/// use if more) times its share over the shares of all tenants holding or waiting.
pub fn runaways(loads: &[TenantLoad], capacity: usize) -> Vec<Runaway> {
    let active = || loads.iter().filter(|l| l.servers > 0 || l.waiting > 0);
    let in_use: usize = loads.iter().map(|l| l.servers).sum();
    let total = in_use.max(capacity);
    let shares: f64 = active().map(|l| l.share.max(0.0)).sum();
    if shares <= 0.0 {
        return Vec::new();
    }
    let mut found: Vec<Runaway> = active()
        .filter(|l| loads.iter().any(|o| o.tenant != l.tenant && o.waiting > 0))
        .map(|l| Runaway {
            tenant: l.tenant.to_string(),
            servers: l.servers,
            fair: total as f64 * l.share.max(0.0) / shares,
        })
        .filter(|r| r.servers as f64 > r.fair.ceil())
        .collect();
    found.sort_by(|a, b| {
        b.excess()
            .total_cmp(&a.excess())
            .then_with(|| a.tenant.cmp(&b.tenant))
    });
    found
}

/// The tenant to evict first, if any.
pub fn runaway(loads: &[TenantLoad], capacity: usize) -> Option<Runaway> {
    runaways(loads, capacity).into_iter().next()
}
