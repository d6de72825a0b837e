//! The vacuum horizon, as a pure state machine over readings: while one backend holds the
//! oldest snapshot, VACUUM can remove no row that died after it, and the dead rows pile up
//! in every table. When a backend has held it longer than `max_age` and the dead rows grew
//! past `dead_rows` since, its tenant is capped to one statement at a time until the
//! horizon has been clear (no snapshot held that long) for twice `max_age`, so it neither
//! flaps nor piles more work on a snapshot it keeps.

use std::collections::BTreeSet;
use std::time::Instant;

pub use crate::policy::HorizonPolicy;

/// The oldest snapshot in a reading.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Oldest {
    pub pid: u32,
    /// Its `backend_xmin`.
    pub xmin: String,
    /// Its tenant, when it is one of pgward's sessions.
    pub tenant: Option<String>,
}

/// A change of the caps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    Cap(String),
    Lift(String),
}

/// What the horizon has seen of one server.
#[derive(Debug, Default)]
pub struct Horizon {
    holder: Option<Holder>,
    capped: BTreeSet<String>,
    /// Since when no snapshot has been held longer than `max_age`.
    clear_since: Option<Instant>,
}

#[derive(Debug)]
struct Holder {
    pid: u32,
    xmin: String,
    /// When a reading first saw it (a snapshot is dated by the readings, not by its
    /// transaction's start: a read-committed transaction takes a new one per statement).
    since: Instant,
    /// Dead rows when it was first seen.
    dead_at_start: u64,
}

impl Horizon {
    /// One reading at `now`: the oldest snapshot and the dead rows of the tables (summed).
    /// Returns the caps to set or lift.
    pub fn observe(
        &mut self,
        now: Instant,
        oldest: Option<Oldest>,
        dead_rows: u64,
        policy: HorizonPolicy,
    ) -> Vec<Change> {
        self.follow(now, oldest.as_ref(), dead_rows);
        let held = self
            .holder
            .as_ref()
            .is_some_and(|h| now.saturating_duration_since(h.since) >= policy.max_age);
        let mut changes = Vec::new();
        if held {
            self.clear_since = None;
            let grew = self
                .holder
                .as_ref()
                .is_some_and(|h| dead_rows.saturating_sub(h.dead_at_start) >= policy.dead_rows);
            let tenant = oldest.and_then(|o| o.tenant);
            if let (true, Some(tenant)) = (grew, tenant) {
                if self.capped.insert(tenant.clone()) {
                    changes.push(Change::Cap(tenant));
                }
            }
            return changes;
        }
        let since = *self.clear_since.get_or_insert(now);
        if now.saturating_duration_since(since) >= policy.max_age * 2 {
            changes.extend(
                std::mem::take(&mut self.capped)
                    .into_iter()
                    .map(Change::Lift),
            );
        }
        changes
    }

    /// Nothing can be read: act as if nothing happened (every cap lifted).
    pub fn forget(&mut self) -> Vec<Change> {
        self.holder = None;
        self.clear_since = None;
        std::mem::take(&mut self.capped)
            .into_iter()
            .map(Change::Lift)
            .collect()
    }

    /// Keeps the holder of the oldest snapshot: the same backend with the same xmin keeps
    /// its start; another starts now.
    fn follow(&mut self, now: Instant, oldest: Option<&Oldest>, dead_rows: u64) {
        let Some(o) = oldest else {
            self.holder = None;
            return;
        };
        let same = self
            .holder
            .as_ref()
            .is_some_and(|h| h.pid == o.pid && h.xmin == o.xmin);
        if !same {
            self.holder = Some(Holder {
                pid: o.pid,
                xmin: o.xmin.clone(),
                since: now,
                dead_at_start: dead_rows,
            });
        }
    }

    /// The tenants capped now.
    pub fn capped(&self) -> impl Iterator<Item = &str> {
        self.capped.iter().map(String::as_str)
    }

    /// Since when the holder has held the oldest snapshot, as far as pgward knows.
    pub fn held_since(&self) -> Option<Instant> {
        self.holder.as_ref().map(|h| h.since)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const POLICY: HorizonPolicy = HorizonPolicy {
        max_age: Duration::from_secs(60),
        dead_rows: 1000,
    };

    fn oldest(pid: u32, xmin: &str, tenant: Option<&str>) -> Option<Oldest> {
        Some(Oldest {
            pid,
            xmin: xmin.into(),
            tenant: tenant.map(str::to_string),
        })
    }

    #[test]
    fn a_held_snapshot_caps_its_tenant_once_rows_died_behind_it_and_clears_slowly() {
        let t0 = Instant::now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        let mut h = Horizon::default();
        assert!(h
            .observe(s(0), oldest(7, "100", Some("etl")), 0, POLICY)
            .is_empty());
        // Held long enough, but few rows died: nothing.
        assert!(h
            .observe(s(61), oldest(7, "100", Some("etl")), 500, POLICY)
            .is_empty());
        // Rows died behind it: its tenant is capped, once.
        assert_eq!(
            h.observe(s(62), oldest(7, "100", Some("etl")), 1500, POLICY),
            vec![Change::Cap("etl".into())]
        );
        assert!(h
            .observe(s(63), oldest(7, "100", Some("etl")), 9000, POLICY)
            .is_empty());
        // Released: still capped for twice max_age of a clear horizon.
        assert!(h.observe(s(64), None, 9000, POLICY).is_empty());
        assert!(h
            .observe(s(150), oldest(8, "200", None), 9000, POLICY)
            .is_empty());
        assert_eq!(
            h.observe(s(184), oldest(8, "200", None), 9000, POLICY),
            vec![Change::Lift("etl".into())]
        );
        assert_eq!(h.capped().count(), 0);
    }

    #[test]
    fn a_new_snapshot_starts_again_and_a_held_horizon_delays_the_lift() {
        let t0 = Instant::now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        let mut h = Horizon::default();
        h.observe(s(0), oldest(7, "100", Some("etl")), 0, POLICY);
        // The same backend with a newer snapshot: counted from now, with the rows now.
        h.observe(s(30), oldest(7, "150", Some("etl")), 5000, POLICY);
        assert!(h
            .observe(s(70), oldest(7, "150", Some("etl")), 5500, POLICY)
            .is_empty());
        assert_eq!(
            h.observe(s(91), oldest(7, "150", Some("etl")), 6000, POLICY),
            vec![Change::Cap("etl".into())]
        );
        // Clear for a while, then held again by another backend: the clock starts over.
        h.observe(s(92), None, 6000, POLICY);
        h.observe(s(180), oldest(9, "300", None), 6000, POLICY);
        h.observe(s(250), oldest(9, "300", None), 6000, POLICY);
        assert!(h.observe(s(260), None, 6000, POLICY).is_empty());
        assert_eq!(
            h.observe(s(380), None, 6000, POLICY),
            vec![Change::Lift("etl".into())]
        );
    }

    #[test]
    fn a_snapshot_outside_pgward_caps_nobody_and_blindness_lifts_every_cap() {
        let t0 = Instant::now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        let mut h = Horizon::default();
        h.observe(s(0), oldest(7, "100", None), 0, POLICY);
        assert!(h
            .observe(s(100), oldest(7, "100", None), 9000, POLICY)
            .is_empty());
        let mut h = Horizon::default();
        h.observe(s(0), oldest(7, "100", Some("etl")), 0, POLICY);
        h.observe(s(100), oldest(7, "100", Some("etl")), 9000, POLICY);
        assert_eq!(h.forget(), vec![Change::Lift("etl".into())]);
    }
}
