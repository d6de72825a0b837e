//! The gate: tenants, budgets, lanes and the fair queue of one pgward, under one lock.
//!
//! Every method takes `&mut self` and the time: the caller keeps the gate in one sync mutex
//! (never held across `.await`), so checking a budget and charging it are one step, and the
//! gate runs under simulated time in tests.

use super::adapt::{AdaptiveLimit, AdaptiveSettings};
use super::bucket::{charge_of, Budget, DecayingUse, TokenBucket};
use super::events::{Event, Record, Subject};
use super::evict::{runaways, Runaway, TenantLoad};
use super::fair::{FairQueue, Rank};
use super::kills::{KillRow, KillTarget, Kills};
use super::names::NameCounts;
use super::pass::Places;
use super::pass::{
    Cost, Decision, Expired, Granted, Grants, Hint, Lane, Near, Pass, Payment, Request, Slot,
    Spent, TicketId,
};
use super::refusal::{Refusal, RefusalReason};
use super::registry::{Place, Registry};
use super::tenant::{TenantConfig, TenantConfigError, TenantTimeouts, WhenOver};
use crate::sql::Fingerprint;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Slots per lane of an upstream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaneLimits {
    /// `max_active`: statements running at once in the fast lane.
    pub fast: usize,
    /// The slow lane's limit (small).
    pub slow: usize,
}

/// Settings of the whole gate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GateSettings {
    /// Longest wait for a slot (or for a debt to be paid back); `None`: until the deadline.
    pub queue_timeout: Option<Duration>,
    /// Lanes of an upstream not given its own with [`Gate::set_lanes`].
    pub lanes: LaneLimits,
    /// The random part of a budget refusal's retry time, as a fraction of the pay-back time
    /// (at least 50 ms), so refused clients do not all come back at once.
    pub jitter: f64,
    /// `max_active_per_database`: slots one pgward database may hold on an upstream, beside
    /// the lanes' limits (`None`: no cap of its own).
    pub per_database: Option<usize>,
    /// `flip_quarantine`: how long a statement whose plan flipped runs in the slow lane
    /// (`None`: flips are only listed).
    pub flip_quarantine: Option<Duration>,
    /// `adaptive = true`: each upstream's fast-lane limit moves within `max_active` (see
    /// [`crate::gate::adapt`]).
    pub adaptive: Option<AdaptiveSettings>,
    /// The decision log is open: the gate gathers its decisions
    /// ([`take_decisions`](Gate::take_decisions)); false: it gathers none.
    pub log: bool,
}

impl Default for GateSettings {
    fn default() -> Self {
        GateSettings {
            queue_timeout: Some(Duration::from_secs(120)),
            lanes: LaneLimits { fast: 20, slow: 2 },
            jitter: 0.2,
            per_database: None,
            flip_quarantine: None,
            adaptive: None,
            log: false,
        }
    }
}

/// One tenant's row of SHOW TENANTS.
#[derive(Clone, Debug, PartialEq)]
pub struct TenantStats {
    /// The tenant.
    pub tenant: String,
    /// Its settings as words.
    pub settings: String,
    /// Seconds in the bucket (`None`: no budget).
    pub balance: Option<f64>,
    /// Seconds owed (0 when the balance is not negative).
    pub debt: f64,
    /// Recent use (decaying).
    pub recent_use: f64,
    /// Seconds charged since the start.
    pub charged: f64,
    /// Tickets waiting.
    pub waiting: usize,
    /// Slots held.
    pub running: usize,
    /// Refusals by reason.
    pub refusals: BTreeMap<RefusalReason, u64>,
}

#[derive(Debug)]
struct TenantState {
    config: TenantConfig,
    configured: bool,
    bucket: Option<TokenBucket>,
    recent: DecayingUse,
    charged: f64,
    /// Seconds its runs took on servers (only ever added to, for counters).
    ran: f64,
    waiting: usize,
    running: usize,
    /// Slots held by its requests that have not paid yet (priced, or waiting for pay-back):
    /// a tenant with a budget has at most one, so its waiting requests do not all take
    /// slots (and servers) at once only to find, one by one, that it owes.
    unpaid: BTreeSet<TicketId>,
    /// Runs of work nobody knows the price of yet (no plan, never run), by the ticket that
    /// started each: while one runs, the tenant's unpaid requests wait, so unknown work does
    /// not start on every connection at once.
    unknown: BTreeSet<TicketId>,
    refusals: BTreeMap<RefusalReason, u64>,
    /// Readers of servers that cap it to one slot whatever its settings say (the vacuum
    /// horizon), counted so that one server's lift does not undo another's cap.
    caps: usize,
    /// Seconds moved to the tenants whose locks its statements waited for, not yet taken
    /// off its counters: the waits are charged when their statements end.
    credit: f64,
    /// This instance's share of the budget's rate when several instances share it (the
    /// fleet's lease): the rate becomes the share and the burst shrinks with it.
    fleet: Option<f64>,
    /// The budget in force: the settings' with the fleet's share applied.
    budget: Option<Budget>,
}

impl TenantState {
    fn new(now: Instant) -> TenantState {
        TenantState {
            config: TenantConfig::default(),
            configured: false,
            bucket: None,
            recent: DecayingUse::new(now),
            charged: 0.0,
            ran: 0.0,
            waiting: 0,
            running: 0,
            unpaid: BTreeSet::new(),
            unknown: BTreeSet::new(),
            refusals: BTreeMap::new(),
            caps: 0,
            credit: 0.0,
            fleet: None,
            budget: None,
        }
    }

    fn apply(&mut self, config: TenantConfig, now: Instant) {
        self.config = config;
        self.configured = true;
        self.rebudget(now);
    }

    /// Puts the budget of the settings and the fleet's share in force; the balance is kept
    /// (counted at the old rate up to `now`) within the new burst.
    fn rebudget(&mut self, now: Instant) {
        if let (Some(bucket), Some(old)) = (&mut self.bucket, self.budget) {
            bucket.clamp(&old, now);
        }
        self.budget = self
            .config
            .budget()
            .map(|b| fleet::fleet_budget(b, self.fleet));
        match (self.budget, &mut self.bucket) {
            (Some(b), Some(bucket)) => bucket.clamp(&b, now),
            (Some(b), None) => self.bucket = Some(TokenBucket::full(&b, now)),
            (None, _) => self.bucket = None,
        }
    }

    fn owes(&self, now: Instant) -> bool {
        match (&self.bucket, self.budget) {
            (Some(bucket), Some(b)) => bucket.owes(&b, now),
            _ => false,
        }
    }

    /// Whether its balance is below zero (it spent more than it had).
    fn in_debt(&self, now: Instant) -> bool {
        match (&self.bucket, self.budget) {
            (Some(bucket), Some(b)) => bucket.balance(&b, now) < 0.0,
            _ => false,
        }
    }

    fn paid_back_at(&self, now: Instant) -> Option<Instant> {
        let (bucket, b) = (self.bucket.as_ref()?, self.budget?);
        now.checked_add(bucket.pay_back(&b, now)?)
    }

    fn record_charge(&mut self, charged: f64, now: Instant) {
        self.recent.add(charged, now);
        self.charged += charged;
    }

    fn has_room(&self) -> bool {
        let cap = (self.caps > 0).then_some(1);
        let limit = match (self.config.max_active, cap) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        limit.is_none_or(|m| self.running < m)
    }

    /// Whether `pass` may take a slot as far as paying goes: a paid pass always; an unpaid
    /// one of a tenant with a budget only while no other unpaid one holds a slot.
    fn may_pay(&self, pass: &Pass) -> bool {
        matches!(pass.payment, Payment::Paid(_))
            || self.bucket.is_none()
            || (self.unpaid.is_empty() && self.unknown.is_empty())
    }

    fn idle(&self, now: Instant) -> bool {
        !self.configured
            && self.caps == 0
            && self.waiting == 0
            && self.running == 0
            && self.recent.value(now) < 1e-3
    }
}

/// What a request's hint held: its upstream and pool (and with them its database), and its
/// tenant's place.
#[derive(Clone, Copy, Debug)]
struct Hinted {
    pool: bool,
    tenant: Option<Place>,
}

#[derive(Debug)]
struct LaneState<W> {
    active: usize,
    queue: FairQueue<W>,
    /// Since when the queue has not been empty.
    waited_since: Option<Instant>,
}

impl<W> Default for LaneState<W> {
    fn default() -> Self {
        LaneState {
            active: 0,
            queue: FairQueue::default(),
            waited_since: None,
        }
    }
}

#[derive(Debug)]
struct Upstream<W> {
    limits: LaneLimits,
    fast: LaneState<W>,
    slow: LaneState<W>,
    /// Slots held per tenant (one at zero may stay listed).
    holding: NameCounts,
    /// Slots held per pgward database (one at zero may stay listed).
    by_database: NameCounts,
    /// Tickets waiting per tenant, in either lane (one at zero may stay listed).
    waiting: NameCounts,
    /// The pools pooled onto this server: each one's database and the servers it may open.
    pools: BTreeMap<String, (String, usize)>,
    /// Each database's `max_db_connections` (0: none).
    database_caps: BTreeMap<String, usize>,
    /// How many times `pools` or `database_caps` changed (a hint noted before is stale).
    pools_noted: u64,
    /// Their sum: slots of both lanes together never exceed it, so a slot is a server.
    capacity: usize,
    /// Idle servers of runaway tenants that may still be closed (refilled per second).
    evict_tokens: f64,
    /// When the tokens were last counted (none yet: a whole burst).
    evicted_at: Option<Instant>,
    /// Idle servers each tenant was told to close since the queue was last empty: a
    /// tenant's excess is closed once, not again at every ticket that waits.
    evicted: BTreeMap<String, usize>,
    /// The fast lane's adaptive limit (`adaptive = true`), started at the first request.
    adaptive: Option<AdaptiveLimit>,
    /// This instance's share of the upstream's slots when several instances share them (the
    /// fleet's lease).
    fleet: Option<usize>,
}

impl<W> Upstream<W> {
    fn new(limits: LaneLimits) -> Self {
        Upstream {
            limits,
            fast: LaneState::default(),
            slow: LaneState::default(),
            holding: NameCounts::default(),
            by_database: NameCounts::default(),
            waiting: NameCounts::default(),
            pools: BTreeMap::new(),
            database_caps: BTreeMap::new(),
            pools_noted: 0,
            capacity: usize::MAX,
            evict_tokens: 0.0,
            evicted_at: None,
            evicted: BTreeMap::new(),
            adaptive: None,
            fleet: None,
        }
    }

    /// Slots both lanes may hold together: the servers the pools may open, within the
    /// fleet's share.
    fn cap(&self) -> usize {
        self.capacity.min(self.fleet.unwrap_or(usize::MAX))
    }

    fn lane(&mut self, lane: Lane) -> (&mut LaneState<W>, usize) {
        let limit = self.limit(lane);
        match lane {
            Lane::Fast => (&mut self.fast, limit),
            Lane::Slow => (&mut self.slow, limit),
        }
    }

    fn lane_ref(&self, lane: Lane) -> &LaneState<W> {
        match lane {
            Lane::Fast => &self.fast,
            Lane::Slow => &self.slow,
        }
    }

    /// A lane's own limit (the fast lane's adaptive one, if any), within the servers the
    /// pools may open.
    fn limit(&self, lane: Lane) -> usize {
        let own = match lane {
            Lane::Fast => match &self.adaptive {
                Some(a) => a.limit().min(self.limits.fast),
                None => self.limits.fast,
            },
            Lane::Slow => self.limits.slow,
        };
        own.min(self.cap())
    }

    /// Slots there are in all.
    fn slots(&self) -> usize {
        self.limits
            .fast
            .saturating_add(self.limits.slow)
            .min(self.cap())
    }

    /// Whether `lane` may hand out a slot now.
    fn room(&self, lane: Lane) -> bool {
        let total = self.fast.active + self.slow.active;
        self.lane_ref(lane).active < self.limit(lane) && total < self.cap()
    }

    /// Whether a ticket waiting in `lane` may take a slot now, as far as the lane goes: room
    /// for anyone, or the headroom and a critical ticket waiting.
    fn may_serve(&self, lane: Lane) -> bool {
        let queue = &self.lane_ref(lane).queue;
        !queue.is_empty()
            && (self.room(lane)
                || queue.has(crate::sql::Priority::Critical)
                    && self.room_for(lane, crate::sql::Priority::Critical))
    }

    /// Whether `lane` may hand out a slot now to work of `priority`: critical work may take
    /// the fast lane's slots between its adaptive limit and its ceiling (the limit holds the
    /// other classes back and leaves them to latency-sensitive work).
    fn room_for(&self, lane: Lane, priority: crate::sql::Priority) -> bool {
        if !(lane == Lane::Fast && self.adaptive.is_some())
            || priority != crate::sql::Priority::Critical
        {
            return self.room(lane);
        }
        let total = self.fast.active + self.slow.active;
        self.fast.active < self.limits.fast.min(self.cap()) && total < self.cap()
    }

    /// Whether any ticket waits here, in either lane.
    fn anyone_waits(&self) -> bool {
        !self.fast.queue.is_empty() || !self.slow.queue.is_empty()
    }

    fn queues(&self) -> impl Iterator<Item = &FairQueue<W>> {
        [&self.fast.queue, &self.slow.queue].into_iter()
    }
}

/// The admission gate. `W` is what a waiting client is told through (the sender of a
/// session's mailbox).
#[derive(Debug)]
pub struct Gate<W> {
    settings: GateSettings,
    /// Looked up several times per request: hashed, each in one probe.
    tenants: Named<TenantState>,
    upstreams: Named<Upstream<W>>,
    kills: Kills,
    rng: StdRng,
    next_id: u64,
    /// When each waiting ticket's wait ends (deadline or queue timeout), soonest first.
    ends: super::ends::Ends,
    /// When each waiting ticket's client is to be told it is queued (query_wait_notify),
    /// soonest first: the queue keeps the time, so a wait sets no timer of its own.
    notices: super::ends::Ends,
    /// Until when the clock sleeps, as it said last ([`clock_sleeps`](Self::clock_sleeps));
    /// `None` before it has said, or while it sleeps until woken.
    clock_until: Option<Instant>,
    /// Where each waiting ticket waits.
    located: foldhash::HashMap<TicketId, (Arc<str>, Places, Lane)>,
    /// Tenant, upstream and database names, shared by passes, slots and counts.
    names: super::names::Names,
    /// Statements whose plan flipped, the databases where it did, and until when they run
    /// in the slow lane there.
    quarantined: HashMap<Fingerprint, Vec<(Box<str>, Instant)>>,
    /// Decisions for the decision log, gathered under the lock and written after it.
    decisions: Vec<Record>,
    /// What every tenant ran and had refused since the start, forgotten tenants included.
    totals: GateTotals,
    /// Whether budgets and slots are shared with other instances: a tenant's budget or an
    /// upstream new to the gate has no share until the fleet's lease gives it one.
    fleet: bool,
}

/// Tenants or upstreams by name, and at the places passes and slots remember. Listings sort
/// by name themselves.
type Named<T> = Registry<T>;

/// Totals over every tenant since the start (only ever added to, for counters).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GateTotals {
    /// Seconds runs took on servers.
    pub ran: f64,
    /// Refusals by reason.
    pub refusals: BTreeMap<RefusalReason, u64>,
}

impl<W> Gate<W> {
    /// A gate; `seed` drives the jitter of retry hints (fixed in tests).
    pub fn new(settings: GateSettings, seed: u64) -> Gate<W> {
        Gate {
            settings,
            tenants: Named::default(),
            upstreams: Named::default(),
            kills: Kills::default(),
            rng: StdRng::seed_from_u64(seed),
            next_id: 0,
            ends: super::ends::Ends::default(),
            notices: super::ends::Ends::default(),
            clock_until: None,
            located: foldhash::HashMap::default(),
            names: super::names::Names::default(),
            quarantined: HashMap::new(),
            decisions: Vec::new(),
            totals: GateTotals::default(),
            fleet: false,
        }
    }

    /// The decisions gathered since the last call, oldest first.
    pub fn take_decisions(&mut self) -> Vec<Record> {
        std::mem::take(&mut self.decisions)
    }

    /// Whether decisions were gathered and not taken yet.
    pub fn has_decisions(&self) -> bool {
        !self.decisions.is_empty()
    }

    /// Gathers `decision` if the decision log is open.
    fn note(&mut self, decision: impl FnOnce() -> Record) {
        if self.settings.log {
            self.decisions.push(decision());
        }
    }

    /// The gate-wide settings in force.
    pub fn settings(&self) -> GateSettings {
        self.settings
    }

    /// Replaces the gate-wide settings (a reload).
    pub fn set_settings(&mut self, settings: GateSettings) {
        let retime = settings.queue_timeout != self.settings.queue_timeout;
        if settings.adaptive.is_none() {
            for up in self.upstreams.values_mut() {
                up.adaptive = None;
            }
        }
        self.settings = settings;
        if retime {
            self.recompute_ends();
        }
    }

    /// Records that the pool `pool` (database/user) of pgward database `database` is pooled
    /// onto `upstream` and may open `servers` servers there, within `database_cap`
    /// (`max_db_connections`, shared by the database's pools; 0: none): the upstream's slots
    /// never exceed the servers its pools may open, so a client holding a slot finds a
    /// server, and one waiting for a slot holds none.
    pub fn note_pool(&mut self, req: &Request) {
        self.note_pool_at(req);
    }

    /// [`note_pool`](Self::note_pool), and where the upstream is kept.
    fn note_pool_at(&mut self, req: &Request) -> (Place, bool) {
        if let Some(place) = self.hinted_upstream(req) {
            return (place, true);
        }
        let place = self.upstream_place(req.upstream);
        let up = self.upstreams.at_mut(place);
        // A pool_size of 0 puts no bound of the pool's own on its servers.
        let servers = match req.pool_size {
            0 => usize::MAX,
            n => n,
        };
        let same_pool = up
            .pools
            .get(req.pool)
            .is_some_and(|(db, n)| db == req.database && *n == servers);
        let same_cap = up.database_caps.get(req.database) == Some(&req.database_cap);
        if same_pool && same_cap {
            return (place, false);
        }
        up.pools_noted += 1;
        up.pools
            .insert(req.pool.to_string(), (req.database.to_string(), servers));
        up.database_caps
            .insert(req.database.to_string(), req.database_cap);
        let mut per_database: BTreeMap<&str, usize> = BTreeMap::new();
        for (database, servers) in up.pools.values() {
            let n = per_database.entry(database).or_default();
            *n = n.saturating_add(*servers);
        }
        up.capacity = per_database
            .into_iter()
            .map(
                |(db, n)| match up.database_caps.get(db).copied().unwrap_or(0) {
                    0 => n,
                    cap => n.min(cap),
                },
            )
            .fold(0usize, usize::saturating_add);
        (place, false)
    }

    /// Sets a tenant's settings (from the policy file). Its balance is kept, within the new
    /// burst; a new budget starts full.
    pub fn configure_tenant(&mut self, tenant: &str, config: TenantConfig, now: Instant) {
        self.tenant_mut(tenant, now).apply(config, now);
    }

    /// `SET TENANT name = 'words'`: changes only the keys given; nothing on an error.
    pub fn set_tenant(
        &mut self,
        tenant: &str,
        words: &str,
        now: Instant,
    ) -> Result<(), TenantConfigError> {
        let state = self.tenant_mut(tenant, now);
        let next = state.config.with_words(words)?;
        state.apply(next, now);
        Ok(())
    }

    /// One more (`on`) or one fewer reason to hold `tenant` to one slot at a time, whatever
    /// its settings say.
    pub fn cap_tenant(&mut self, tenant: &str, on: bool, now: Instant) {
        let t = self.tenant_mut(tenant, now);
        t.caps = match on {
            true => t.caps + 1,
            false => t.caps.saturating_sub(1),
        };
    }

    /// Sets the lane limits of every upstream, and of those to come (a reload).
    pub fn set_all_lanes(&mut self, limits: LaneLimits) {
        self.settings.lanes = limits;
        for up in self.upstreams.values_mut() {
            up.limits = limits;
        }
    }

    /// Sets an upstream's lane limits (`max_active` and the slow lane's).
    pub fn set_lanes(&mut self, upstream: &str, limits: LaneLimits) {
        self.upstream_mut(upstream).limits = limits;
    }

    /// The place of `req`'s upstream from its hint, if the hint holds for it: the same
    /// upstream at the same place, and its pool noted there with the same sizes since.
    fn hinted_upstream(&self, req: &Request) -> Option<Place> {
        let h = req.hint?;
        let place = h.places.upstream;
        if !self.upstreams.holds(place, &h.upstream) {
            return None;
        }
        let up = self.upstreams.at(place);
        let same = up.pools_noted == h.pools_noted
            && h.sizes == (req.pool_size, req.database_cap)
            && *h.upstream == *req.upstream
            && *h.pool == *req.pool
            && *h.database == *req.database;
        same.then_some(place)
    }

    /// The place of `req`'s tenant from its hint, if the hint holds for it.
    fn hinted_tenant(&self, req: &Request) -> Option<Place> {
        let h = req.hint?;
        let place = h.places.tenant;
        (self.tenants.holds(place, &h.tenant) && *h.tenant == *req.tenant).then_some(place)
    }

    /// A hint for the next request of `req`'s session, admitted as `pass`.
    fn hint(&self, req: &Request, pass: &Pass) -> Option<Box<Hint>> {
        if !self.upstreams.holds(pass.places.upstream, &pass.upstream) {
            return None;
        }
        let up = self.upstreams.at(pass.places.upstream);
        Some(Box::new(Hint {
            places: pass.places,
            tenant: Arc::clone(&pass.tenant),
            upstream: Arc::clone(&pass.upstream),
            database: Arc::clone(&pass.database),
            pool: Arc::from(req.pool),
            sizes: (req.pool_size, req.database_cap),
            pools_noted: up.pools_noted,
        }))
    }

    /// The timeouts of the tenant of `pass`.
    pub fn timeouts_of(&self, pass: &Pass) -> TenantTimeouts {
        self.tenants
            .get_at(pass.places.tenant, &pass.tenant)
            .map(|t| t.config.timeouts)
            .unwrap_or_default()
    }

    /// A tenant's time limits, for the session to enforce.
    pub fn timeouts(&self, tenant: &str) -> TenantTimeouts {
        self.tenants
            .get(tenant)
            .map(|t| t.config.timeouts)
            .unwrap_or_default()
    }

    /// The place of tenant `tenant`, made if it is new.
    fn tenant_place(&mut self, tenant: &str, now: Instant) -> Place {
        if let Some(place) = self.tenants.find(tenant) {
            return place;
        }
        let fleet = self.fleet;
        let name = self.names.get(tenant);
        self.tenants.place(&name, || {
            let mut state = TenantState::new(now);
            state.fleet = fleet.then_some(0.0);
            state
        })
    }

    fn tenant_mut(&mut self, tenant: &str, now: Instant) -> &mut TenantState {
        let place = self.tenant_place(tenant, now);
        self.tenants.at_mut(place)
    }

    /// The tenant `tenant` of a pass or slot: at its place while that still holds it.
    fn tenant_at(&mut self, places: Places, tenant: &Arc<str>, now: Instant) -> &mut TenantState {
        let place = self.tenant_place_at(places, tenant, now);
        self.tenants.at_mut(place)
    }

    /// The place of the tenant `tenant` of a pass or slot: its own while that still holds it.
    fn tenant_place_at(&mut self, places: Places, tenant: &Arc<str>, now: Instant) -> Place {
        match self.tenants.holds(places.tenant, tenant) {
            true => places.tenant,
            false => self.tenant_place(tenant, now),
        }
    }

    /// The place of upstream `upstream`, made if it is new.
    fn upstream_place(&mut self, upstream: &str) -> Place {
        if let Some(place) = self.upstreams.find(upstream) {
            return place;
        }
        let (fleet, limits) = (self.fleet, self.settings.lanes);
        let name = self.names.get(upstream);
        self.upstreams.place(&name, || {
            let mut up = Upstream::new(limits);
            up.fleet = fleet.then_some(0);
            up
        })
    }

    fn upstream_mut(&mut self, upstream: &str) -> &mut Upstream<W> {
        let place = self.upstream_place(upstream);
        self.upstreams.at_mut(place)
    }

    /// The upstream `upstream` of a pass or slot: at its place while that still holds it.
    fn upstream_at(&mut self, places: Places, upstream: &Arc<str>) -> &mut Upstream<W> {
        let place = match self.upstreams.holds(places.upstream, upstream) {
            true => places.upstream,
            false => self.upstream_place(upstream),
        };
        self.upstreams.at_mut(place)
    }

    /// Counts a refusal for SHOW TENANTS, gathers it for the decision log and hands it back.
    fn refused(&mut self, who: Subject<'_>, refusal: Refusal, now: Instant) -> Refusal {
        self.count_refusal(who.tenant, refusal.reason, now);
        self.note(|| {
            Record::about(Event::Refused, refusal.reason.as_str(), who)
                .sqlstate(refusal.sqlstate)
                .figures(&refusal.figures)
        });
        refusal
    }

    /// Counts a refusal made by the caller (a cost limit, a kill seen at a Bind) with the
    /// SQLSTATE the client gets, and gathers it for the decision log.
    /// `why` is the rule's name (or the reason's, for a kill).
    pub fn note_refusal(
        &mut self,
        who: Subject<'_>,
        reason: RefusalReason,
        why: &str,
        sqlstate: &'static str,
        now: Instant,
    ) {
        self.count_refusal(who.tenant, reason, now);
        self.note(|| Record::about(Event::Refused, why, who).sqlstate(sqlstate));
    }

    /// Counts, for SHOW TENANTS, a statement a SQL rule refused (its decision-log line is
    /// written where it was refused, with the role).
    pub fn note_rule_refusal(&mut self, tenant: &str, now: Instant) {
        self.count_refusal(tenant, RefusalReason::Rule, now);
    }

    /// Counts, for SHOW TENANTS, a statement a cost rule in warn mode would have refused (it
    /// ran: the decision log has no line for it).
    pub fn note_warned(&mut self, tenant: &str, now: Instant) {
        self.count_refusal(tenant, RefusalReason::CostWarned, now);
    }

    fn count_refusal(&mut self, tenant: &str, reason: RefusalReason, now: Instant) {
        *self
            .tenant_mut(tenant, now)
            .refusals
            .entry(reason)
            .or_default() += 1;
        *self.totals.refusals.entry(reason).or_default() += 1;
    }
}

mod adaptive;
mod fleet;
pub use fleet::{FleetWant, FleetWants};
mod flow;
mod queueing;
pub use queueing::LaneRow;
mod report;
pub use report::{FoldedTenants, TenantMetric, TenantMetrics};
