//! Limits shared by several pgward instances: each tenant's budget and each upstream's slots
//! is one capacity, leased in shares to the instances that use it (Doorman's design: ask for
//! capacity, not permission; shares are leases; fair share). `lease` is the arithmetic of both
//! sides, pure and clock-injected, so a seeded simulation (tests/fleet_simulation.rs) runs it
//! through outages, cut links, lost replies and dying instances; `store` keeps the ledger in
//! PostgreSQL; [`run`] reports once a second and puts the shares in force in the gate: a
//! budget's rate becomes this instance's share of it, an upstream's slots its share of them.

pub mod lease;
pub mod store;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::gate::keeper::Gatekeeper;
use crate::gate::FleetWants;
use crate::params::Tracked;
use crate::policy::FleetPolicy;
use crate::pool::Pool;
use crate::server::ServerConn;
use crate::sync::lock;
use lease::{Amounts, Holder, Ledger, Standing, Terms};

/// How often an instance reports.
pub const PERIOD: Duration = Duration::from_secs(1);

/// Longest an exchange with the store may take before its connection is dropped.
const EXCHANGE_LIMIT: Duration = Duration::from_secs(5);

/// How much longer the store counts a grant than the instance uses it.
const MARGIN: Duration = Duration::from_secs(1);

/// The application_name of the store's connection.
const APPLICATION_NAME: &str = "pgward fleet";

/// What the fleet needs of the running process.
pub trait Fleeted: Send + Sync + 'static {
    /// The policy's `[fleet]`, `None` without one.
    fn fleet_policy(&self) -> Option<FleetPolicy>;
    /// `peer_id` of pgward.ini.
    fn peer_id(&self) -> u32;
    /// The pool whose login reaches the state database, or why there is none.
    fn store_pool(&self, policy: &FleetPolicy) -> Result<Arc<Pool>, String>;
    fn gatekeeper(&self) -> &Gatekeeper;
    fn tracked(&self) -> Arc<Tracked>;
    /// Where SHOW FLEET reads.
    fn fleet_board(&self) -> &Board;
}

/// A budget's resource name in the ledger.
fn tenant_resource(name: &str) -> String {
    format!("tenant:{name}")
}

/// An upstream's resource name in the ledger.
fn upstream_resource(name: &str) -> String {
    format!("upstream:{name}")
}

/// What SHOW FLEET shows.
#[derive(Debug, Default)]
pub struct Board {
    view: Mutex<Option<View>>,
}

/// The fleet as this instance last saw it.
#[derive(Clone, Debug)]
pub struct View {
    pub instance: u32,
    pub incarnation: u64,
    pub standing: Standing,
    /// When this instance last heard the store.
    pub contact: Option<Instant>,
    pub error: Option<String>,
    /// Its own shares in force, by resource.
    pub shares: BTreeMap<String, f64>,
    /// Its own wants, by resource: (capacity, demand).
    pub wants: BTreeMap<String, (f64, f64)>,
    /// The ledger at the last exchange, and the store's time then.
    pub ledger: Option<(Ledger, Duration)>,
}

impl Board {
    /// The last view, if the fleet is on.
    pub fn view(&self) -> Option<View> {
        lock(&self.view).clone()
    }

    fn set(&self, view: Option<View>) {
        *lock(&self.view) = view;
    }
}

/// Shares the gate's budgets and slots with the other instances for as long as the policy
/// has a `[fleet]`; runs for the life of the process. Reports once a period; between reports,
/// and while a report waits for its answer, the shares change in the gate at the moment a
/// lease or its fallback ends.
pub async fn run<R: Fleeted>(rt: Arc<R>) {
    let epoch = Instant::now();
    let mut tick = tokio::time::interval(PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut member: Option<Member> = None;
    loop {
        let next = member.as_ref().and_then(|m| m.next_change(epoch));
        tokio::select! {
            _ = tick.tick() => {}
            _ = until(next) => {
                if let Some(m) = &member {
                    m.enforce(rt.as_ref(), epoch);
                }
                continue;
            }
        }
        let Some(policy) = rt.fleet_policy() else {
            if member.take().is_some() {
                rt.gatekeeper().lock().set_fleet(false, Instant::now());
                rt.gatekeeper().wake();
                rt.fleet_board().set(None);
            }
            continue;
        };
        let instance = policy.instance.unwrap_or_else(|| rt.peer_id());
        let terms = Terms {
            lease: policy.lease,
            fallback: policy.fallback,
            margin: MARGIN,
        };
        let store = (policy.store.clone(), policy.user.clone());
        // Another store knows nothing of the grants held: a new incarnation starts there,
        // holding nothing until its first lease (its first turn, right below, puts that in
        // force).
        if member
            .as_ref()
            .is_none_or(|m| m.holder.instance != instance || m.terms != terms || m.store != store)
        {
            member = Some(Member::new(instance, terms, store));
        }
        let m = member.as_mut().expect("set above");
        m.turn(rt.as_ref(), &policy, epoch).await;
    }
}

/// Sleeps until `at`, or forever.
async fn until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// This instance in the fleet: its holder and its connection to the store.
struct Member {
    holder: Holder,
    terms: Terms,
    /// The store's database and login.
    store: (String, Option<String>),
    conn: Option<ServerConn>,
    contact: Option<Instant>,
    error: Option<String>,
    ledger: Option<(Ledger, Duration)>,
    /// What the gate wanted at the last report: the resources whose shares are in force.
    wants: FleetWants,
}

impl Member {
    fn new(instance: u32, terms: Terms, store: (String, Option<String>)) -> Member {
        // A new incarnation holds nothing of an earlier one's (a bigint in the store).
        let incarnation = rand::random::<u64>() >> 1;
        Member {
            holder: Holder::new(instance, incarnation, terms),
            terms,
            store,
            conn: None,
            contact: None,
            error: None,
            ledger: None,
            wants: FleetWants::default(),
        }
    }

    /// One report and its answer if the store gives one in time; the shares in force before,
    /// at every change while it waits, and after.
    async fn turn<R: Fleeted>(&mut self, rt: &R, policy: &FleetPolicy, epoch: Instant) {
        let started = Instant::now();
        self.wants = {
            let mut gate = rt.gatekeeper().lock();
            if !gate.fleet() {
                gate.set_fleet(true, started);
            }
            gate.fleet_wants(started)
        };
        self.enforce(rt, epoch);
        if self.holder.instance == 0 || self.holder.instance > i32::MAX as u32 {
            self.error = Some("no instance number: set [fleet] instance or peer_id".into());
            return;
        }
        let shared = resources(&self.wants);
        let report = self
            .holder
            .report(started - epoch, shared.demands, &shared.using);
        let capacities = (shared.capacities, shared.whole);
        let mut conn = self.conn.take();
        let answer = {
            let exchange = tokio::time::timeout(
                EXCHANGE_LIMIT,
                exchange(rt, policy, &mut conn, &report, capacities, self.terms),
            );
            tokio::pin!(exchange);
            loop {
                tokio::select! {
                    answer = &mut exchange => {
                        break answer
                            .unwrap_or_else(|_| Err("the store did not answer in time".into()));
                    }
                    _ = until(self.next_change(epoch)) => self.enforce(rt, epoch),
                }
            }
        };
        match answer {
            Ok((grant, ledger)) => {
                if let Some(grant) = grant {
                    self.holder.receive(&grant);
                }
                self.conn = conn;
                self.contact = Some(Instant::now());
                self.error = None;
                self.ledger = Some(ledger);
            }
            Err(e) => {
                if self.error.as_deref() != Some(e.as_str()) {
                    tracing::warn!("fleet: the state database: {e}");
                }
                self.error = Some(e);
            }
        }
        self.enforce(rt, epoch);
    }

    /// When the lease held ends, or its fallback, whichever comes next.
    fn next_change(&self, epoch: Instant) -> Option<Instant> {
        let held = self.holder.held()?;
        let now = Instant::now();
        [held.ends, held.fallback_ends]
            .into_iter()
            .map(|t| epoch + t)
            .find(|at| *at > now)
    }

    /// Puts this instance's shares at this moment in force: its lease, its fallback, or
    /// nothing.
    fn enforce<R: Fleeted>(&self, rt: &R, epoch: Instant) {
        let now = Instant::now();
        let at = now - epoch;
        let mut shares = BTreeMap::new();
        {
            let mut gate = rt.gatekeeper().lock();
            if !gate.fleet() {
                // A reload took the `[fleet]` away while the store was being asked.
                return;
            }
            for w in &self.wants.tenants {
                let r = tenant_resource(&w.name);
                let share = self.holder.share(&r, at);
                gate.set_fleet_rate(&w.name, Some(share), now);
                shares.insert(r, share);
            }
            for w in &self.wants.upstreams {
                let r = upstream_resource(&w.name);
                let share = self.holder.share(&r, at).floor().max(0.0);
                gate.set_fleet_slots(&w.name, Some(share as usize));
                shares.insert(r, share);
            }
        }
        rt.gatekeeper().wake();
        let shared = resources(&self.wants);
        rt.fleet_board().set(Some(View {
            instance: self.holder.instance,
            incarnation: self.holder.incarnation,
            standing: self.holder.standing(at),
            contact: self.contact,
            error: self.error.clone(),
            shares,
            wants: shared
                .capacities
                .iter()
                .map(|(r, c)| {
                    let demand = shared.demands.get(r).copied().unwrap_or(0.0);
                    (r.clone(), (*c, demand))
                })
                .collect(),
            ledger: self.ledger.clone(),
        }));
    }
}

/// One exchange on `conn`, opened (and the tables made) first if there is none; the
/// connection is left closed after a failure.
async fn exchange<R: Fleeted>(
    rt: &R,
    policy: &FleetPolicy,
    conn: &mut Option<ServerConn>,
    report: &lease::Report,
    capacities: (Amounts, BTreeSet<String>),
    terms: Terms,
) -> Result<(Option<lease::Grant>, (Ledger, Duration)), String> {
    let tracked = rt.tracked();
    let mut open = match conn.take() {
        Some(c) => c,
        None => {
            let pool = rt.store_pool(policy)?;
            let addr = Arc::clone(pool.settings().target.hosts.first());
            let mut c = pool
                .open_own(&addr, APPLICATION_NAME)
                .await
                .map_err(|e| e.to_string())?;
            store::prepare(&mut c, &tracked)
                .await
                .map_err(|e| e.to_string())?;
            c
        }
    };
    let answer = store::exchange(&mut open, report, capacities, terms, &tracked)
        .await
        .map_err(|e| e.to_string())?;
    *conn = Some(open);
    Ok(answer)
}

/// Every shared resource, by name in the ledger.
struct Shared {
    capacities: Amounts,
    /// Those shared in whole units: the upstreams' slots.
    whole: BTreeSet<String>,
    demands: Amounts,
    /// What this instance holds now of those taken and given back: the slots.
    using: Amounts,
}

/// The capacities, demands and use of every shared resource.
fn resources(wants: &FleetWants) -> Shared {
    let mut shared = Shared {
        capacities: Amounts::new(),
        whole: BTreeSet::new(),
        demands: Amounts::new(),
        using: Amounts::new(),
    };
    for w in &wants.tenants {
        let r = tenant_resource(&w.name);
        shared.capacities.insert(r.clone(), w.capacity);
        shared.demands.insert(r, w.demand);
    }
    for w in &wants.upstreams {
        let r = upstream_resource(&w.name);
        shared.capacities.insert(r.clone(), w.capacity);
        shared.demands.insert(r.clone(), w.demand);
        shared.using.insert(r.clone(), w.using);
        shared.whole.insert(r);
    }
    shared
}
