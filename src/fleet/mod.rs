//! Limits shared by several pgward instances: each tenant's budget and each upstream lane is
//! one capacity, leased in shares to the instances that use it (Doorman's design: ask for
//! capacity, not permission; shares are leases; fair share). `lease` is the arithmetic of both
//! sides, pure and clock-injected, so a seeded simulation (tests/fleet_simulation.rs) runs it
//! through outages, cut links, lost replies and dying instances.

pub mod lease;
