//! The session's one call into the admission gate. Before the client's messages go to the
//! server, each request in them (a Query, the Bind of a statement, a FunctionCall) passes
//! the gate: kills and deadlines and the tenant's budget ([`crate::gate::Gate::admit`]);
//! then a server is checked out from the pool, and only then a slot in the request's lane
//! is waited for in the gate's queue (so today a request that waits for its slot holds its
//! server); then its price from the planner (the plan cache, or EXPLAIN on that server),
//! the cost rules, and the charge ([`crate::gate::Gate::spend`]). A request moved to the
//! slow lane or waiting for its budget gives its slot back (and its server, if the server
//! owes nothing) and waits again. A refusal becomes that message's verdict, which
//! `forward_client` answers in its place.
//!
//! The slot is held while PostgreSQL owes the client answers: a pipeline holds one, and it
//! goes back at the ReadyForQuery that leaves nothing owed. Transaction control (BEGIN,
//! COMMIT, ROLLBACK, SAVEPOINT) never waits. A request whose price is unknown while the
//! server still owes earlier answers waits until it owes none (pgward cannot run an EXPLAIN
//! in the middle of the client's batch); one whose price is cached does not.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use foldhash::{HashMap, HashSet};

use super::prepared::Parsed;
use super::readings::{worth_remembering, Derived, Facts};
use super::rules::{context_from, parse_context, Allowed, Analyzed};
use super::views::Views;
use super::{frame_at, poll_reading, reading_while, Session};
use crate::client::{ClientIo, SessionError};
use crate::cost::{
    explain_sql, judged_statement, relation_sizes_sql, CostLimits, Judged, PlanFactorKey, PlanKey,
    PlanSummary, Relation,
};
use crate::gate::keeper::{Acquire, SlotAnswer, SlotGuard, SlotLook, SlotWait, WaitNews};
use crate::gate::RefusalReason;
use crate::gate::{
    Cost, Decision, Pass, Refusal, Request, RequestKind, Spent, Subject, TenantTimeouts,
};
use crate::ops::traffic::{Arrival, Outcome};
use crate::policy::Governance;
use crate::policy::{RuleHit, Verdict, Who};
use crate::runtime::Runtime;
use crate::server::{Definition, OwnStatement, ServerError};
use crate::sql::Fingerprint;
use crate::wire::frontend::{tag, target};
use crate::wire::{
    self, sqlstate, BindView, CloseView, ErrorResponse, ParseView, QueryView, TxStatus,
};

/// Parses remembered per session, to price the Binds of their statements.
const MAX_PARSED: usize = 10_000;

/// The block [`GateState::keep`] copies short-lived bytes into: one allocation serves many
/// statements, and a block lives only while something of it is held.
const KEPT_BLOCK: usize = 1024;
/// Copies longer than this get an allocation of their own, freed with them: a block would
/// be mostly theirs, and kept alive by the session until the next copy.
const KEPT_MAX: usize = KEPT_BLOCK / 2;

/// The server taken for a request admitted with `pass` (`attached`); when none came (the
/// client left, the pool's wait timed out, the server's login failed) the request never runs,
/// and what `pass` was charged is given back.
fn refunded_unless_ok(
    attached: Result<Duration, SessionError>,
    keeper: &crate::gate::keeper::Gatekeeper,
    pass: &mut Pass,
) -> Result<Duration, SessionError> {
    if attached.is_err() {
        keeper.refund(pass);
    }
    attached
}

/// The tenant's statement timeout fired: its `limit`, for the request the server was busy
/// with `since` (the next request, once that one is answered, is timed anew).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::session) struct TimedOut {
    pub limit: Duration,
    pub since: Option<Instant>,
}

/// The gate's verdict on a message (Query, Bind, FunctionCall, Execute) that passed it.
#[derive(Debug)]
pub(in crate::session) struct Gated {
    /// `Some` refuses the message.
    pub hit: Option<Box<RuleHit>>,
    /// The statement it runs, when the gate read it (an Execute: its portal's, by the Bind
    /// that made the portal): what a KILL STATEMENT finds running once the server runs it.
    pub work: Option<u64>,
    /// A request the gate admitted (Query, Bind, FunctionCall), not an Execute.
    pub request: bool,
}

/// What each of the client's portals runs, by the Bind that made it (one the gate let
/// through): the statement's fingerprint, if the gate read it, and whether a kill stops it
/// (what ends a transaction is never stopped).
#[derive(Debug, Default)]
pub(in crate::session) struct PortalWorks {
    unnamed: Portal,
    named: Vec<(Bytes, Portal)>,
}

/// A portal as the gate last saw it bound.
#[derive(Clone, Debug, Default)]
enum Portal {
    /// Not bound since the gate followed the client (or forgotten): an Execute of it runs
    /// whatever it was, stopped by no kill (it may end a transaction).
    #[default]
    Unknown,
    /// Its Bind was refused: the server skips an Execute of it with the rest of the batch.
    Refused,
    Runs(PortalWork),
}

#[derive(Clone, Debug)]
struct PortalWork {
    /// The tenant of its Bind (a kill of that tenant stops it).
    tenant: Arc<str>,
    fingerprint: Option<u64>,
    killable: bool,
}

/// Named portals followed at most; the oldest is forgotten first (an Execute of a portal
/// not followed is stopped by no kill).
const MAX_NAMED_PORTALS: usize = 64;

impl PortalWorks {
    /// A Bind of `portal` passed the gate, running `work` (`None`: it was refused).
    fn bound(&mut self, portal: &[u8], work: Option<PortalWork>) {
        let bound = work.map_or(Portal::Refused, Portal::Runs);
        if portal.is_empty() {
            self.unnamed = bound;
            return;
        }
        self.named.retain(|(name, _)| name != portal);
        if self.named.len() >= MAX_NAMED_PORTALS {
            self.named.remove(0);
        }
        self.named.push((Bytes::copy_from_slice(portal), bound));
    }

    /// What an Execute of `portal` runs, as far as the gate knows.
    fn of(&self, portal: &[u8]) -> &Portal {
        match portal.is_empty() {
            true => &self.unnamed,
            false => self
                .named
                .iter()
                .find(|(n, _)| n == portal)
                .map_or(&Portal::Unknown, |(_, p)| p),
        }
    }

    /// Binds went out that the gate did not read (no policy and no kill in force): what it
    /// knew of the portals may be stale.
    pub(in crate::session) fn forget(&mut self) {
        if !matches!(self.unnamed, Portal::Unknown) || !self.named.is_empty() {
            *self = PortalWorks::default();
        }
    }
}

/// The portal a Bind makes or an Execute runs: the first string of its body.
fn portal_of(body: &[u8]) -> &[u8] {
    body.split(|b| *b == 0).next().unwrap_or_default()
}

/// What the gate keeps per session.
#[derive(Debug, Default)]
pub(in crate::session) struct GateState {
    /// The session's runs are counted in the statement statistics.
    pub stats_on: bool,
    /// The slot held while PostgreSQL owes this client answers.
    pub slot: Option<SlotGuard>,
    /// Where the session hears the ends of its waits for a slot (made at its first wait).
    mailbox: Option<Arc<crate::gate::keeper::SlotMailbox>>,
    /// The pass of the last request admitted, once it is done with: the next one is made in
    /// its allocation.
    spare_pass: Option<Pass>,
    /// The verdicts on the messages (Query, Bind, FunctionCall, Execute) gated at the front
    /// of the client's read buffer, in order.
    pub verdicts: VecDeque<Gated>,
    /// The statement of the request admitted last, until its verdict is queued.
    admitted_work: Option<u64>,
    /// Whether a kill stops the request admitted last (see `admitted_work`).
    admitted_killable: bool,
    /// What the client's portals run, by the Binds that passed the gate.
    pub portals: PortalWorks,
    /// Bytes at the front of the client's read buffer that passed the gate.
    gated: usize,
    /// The Parses that passed the gate and may not have gone out yet, by statement name.
    pending: HashMap<Bytes, Arc<Parsed>>,
    /// The Parses that passed the gate since its last Sync, by statement name: a Bind later
    /// in the same batch runs the last of them, or is skipped with it.
    batch_parses: HashMap<Bytes, Arc<Parsed>>,
    /// Names parsed in batches that ended (a Sync passed the gate) and that the server may
    /// not have answered yet: what they hold depends on how those Parses fared.
    unsettled: HashSet<Bytes>,
    /// Too many names for `unsettled`: every name is unsettled.
    unsettled_all: bool,
    /// Session pooling: the texts bound to portals that may define or free statements
    /// when they run (see [`Session::note_portal`]).
    portal_texts: HashMap<Bytes, Bytes>,
    /// `portal_texts` was full: portals went unfollowed.
    portals_unfollowed: bool,
    /// What each Parse that passed the gate defines for it, in order, taken as it goes out.
    pub defines: VecDeque<Option<Arc<Definition>>>,
    /// For each Bind or Describe of the unnamed statement that passed the gate, in order, the
    /// client's unnamed statement as the gate knew it there (see [`super::views::uses_unnamed`]),
    /// taken as the message goes out: the gate may read past it (and past a Parse that drops
    /// the statement) before it goes.
    pub unnamed_uses: VecDeque<Option<Arc<Parsed>>>,
    /// The statements the gate follows itself, from the server's answers (pgward's
    /// statement map holds the others).
    pub views: Views,
    /// The time limits of the tenant of the last request admitted.
    pub limits: TenantTimeouts,
    /// That tenant.
    pub tenant: Arc<str>,
    /// Where the gate found it, its upstream and its pool (see [`crate::gate::Hint`]).
    pub hint: Option<Box<crate::gate::Hint>>,
    /// pgward cancelled the running request at the tenant's statement timeout: its 57014
    /// says so.
    pub timed_out: Option<TimedOut>,
    /// The work the server does for this client now, timed as one.
    pub run: Run,
    /// The last Query text read, for the rules.
    pub analyzed: Option<Analyzed>,
    /// The client's stream is inside an extended-protocol batch (a message since its last
    /// Sync): PostgreSQL answers nothing of it before the Sync.
    batch_open: bool,
    /// Requests that ran unpriced inside a batch, to price once it is answered.
    deferred: Vec<Deferred>,
    /// The next request is answered with the cancel the client asked for while pgward
    /// priced those (see `Session::release_when_quiet`), unless a ReadyForQuery comes first
    /// (what the client had sent held no request).
    pub cancel_next: bool,
    /// A request inside an open batch must be judged by cost rules before it runs: the
    /// server is to be asked (a Flush) for the answers to what went before it.
    flush_wanted: bool,
    /// That Flush went out: the request waits for the answers.
    flush_sent: bool,
    /// A message of the batch failed and no Sync has passed the gate since: the server skips
    /// every request up to the next one.
    skipping: bool,
    /// Messages went out that the policy's gate did not read (no policy in force, kills
    /// alone or nothing): the Parses noted meanwhile are no record of a batch for it.
    pub lapsed: bool,
    /// DDL or ANALYZE ran: the database's cached plans are dropped at the end of each run
    /// until the transaction is over (its changes count only once it commits).
    pub stale_plans: bool,
    /// Requests (Execute, Query, FunctionCall) sent to servers under a policy, in all.
    pub requests_sent: u64,
    /// Of those, the unanswered ones the cancel handle was last told of.
    pub published_owed: usize,
    /// Room for [`keep`](GateState::keep).
    kept: BytesMut,
}

/// A request that ran unpriced inside a batch: its plan is read once the batch is answered,
/// so its next run is priced before it starts (what it took is charged with its run).
#[derive(Debug)]
struct Deferred {
    sql: String,
    work: Work,
    key: PlanKey,
    tenant: Arc<str>,
}

/// Where a request inside an open batch stands (see [`Session::in_batch_turn`]).
enum InBatch {
    /// Until what went before it is answered.
    Wait,
    /// It cannot be explained as itself.
    Unplannable,
    /// It is explained now, inside the batch.
    Explain,
}

/// What an EXPLAIN gave.
enum Priced {
    /// The plan, or none (the EXPLAIN failed, or there was nothing to explain).
    Plan(Option<Arc<PlanSummary>>),
    /// The client's cancel stopped it.
    Cancelled,
    /// Inside the client's open batch, the EXPLAIN failed: the statement fails there, with
    /// this error (planning is part of running it), and the server skips the rest of the
    /// batch.
    FailedInBatch(crate::wire::ErrorFields),
}

/// The work a server does for one client from the moment it owed that client nothing until
/// it owes nothing again, timed as one (PostgreSQL runs a session's statements one after
/// another, and in a pipeline answers them only at the Sync). Each request in it was charged
/// its predicted time when it was admitted; when the run ends, the time it really took is
/// shared among them in proportion to their predictions and settled with their tenants. A
/// run of one request that ended normally teaches the calibration.
#[derive(Debug, Default)]
pub(in crate::session) struct Run {
    /// When its first request went to the server.
    started: Option<Instant>,
    parts: Vec<Part>,
    /// An error (a failure, a cancel), a suspended portal or a run cut short: nothing is
    /// learned from it.
    pub failed: bool,
    /// Unknown work it holds its tenants' unpriced requests for (see `Gate::hold_unknown`).
    held: Vec<(Arc<str>, crate::gate::TicketId)>,
    /// Rows its CommandCompletes counted, and the SQLSTATE of its first error.
    rows: u64,
    error: Option<String>,
    /// It ran DDL, ANALYZE or VACUUM (or a DO block or a procedure that may): cached plans
    /// of the database may be wrong once it has run.
    changes_plans: bool,
}

/// What one request that ran alone and ended normally teaches: its factor or usual time;
/// but a run far from what a cached plan predicted drops that plan and teaches nothing.
fn learn(keeper: &crate::gate::keeper::Gatekeeper, part: &Part, took: Duration) {
    let Some((key, cost)) = &part.learn else {
        return;
    };
    let seconds = took.as_secs_f64();
    // One line per run that could teach, for the accuracy benchmark (bench/tpch.sh) and for
    // anyone checking the predictions: fingerprint, shape, predicted and measured seconds.
    tracing::debug!(
        target: "pgward::calibration",
        fingerprint = %format!("{:016x}", key.fingerprint),
        shape = %key.shape.map_or_else(|| "none".to_string(), |s| format!("{s:016x}")),
        predicted_s = part.predicted,
        took_s = seconds,
        "run measured"
    );
    let ratio = seconds / part.predicted.max(f64::MIN_POSITIVE);
    let long = seconds.max(part.predicted) >= FLIP_SECONDS;
    let far = long && !(1.0 / FLIP_RATIO..=FLIP_RATIO).contains(&ratio);
    if far && part.learned && ratio > FLIP_RATIO && key.shape.is_some() {
        // Far slower than this plan usually is: a plan no EXPLAIN shows (a generic plan
        // PostgreSQL switched to), or other constants that chose another plan.
        let reason = crate::cost::FlipReason::Slow {
            predicted: part.predicted,
            took: seconds,
        };
        keeper.note_flip(&key.database, key.fingerprint, reason);
    }
    let cached = part.cached.as_ref().and_then(|f| f.plan_key.as_ref());
    if let (true, Some(cached)) = (far, cached) {
        // Perhaps not this plan's time (other constants may have chosen another plan): it
        // teaches nothing, and the plan is read again next time. A plan read for this very
        // run teaches whatever it took, so a statement that really got slower is learned.
        keeper.plans().remove(cached);
        return;
    }
    keeper.calibration().learn(key.clone(), *cost, seconds);
}

/// One admitted request of a [`Run`].
#[derive(Debug)]
struct Part {
    tenant: Arc<str>,
    /// Seconds charged before it ran.
    charged: f64,
    /// Seconds predicted (its share of the run's time follows it).
    predicted: f64,
    /// What its run teaches, and the plan's cost (none for a statement without a plan).
    learn: Option<(PlanFactorKey, Option<f64>)>,
    /// What the gate derived of it, when a plan cache entry (its `plan_key`) priced it
    /// rather than a plan read for it: a run far from its prediction drops the entry (the
    /// constants chose another plan) and teaches nothing.
    cached: Option<Arc<Facts>>,
    /// Whether its prediction rests on its own earlier runs (a run far from it is a flip).
    learned: bool,
    /// The statement, when it was read (statement statistics), and the reading (its
    /// normalized text).
    fingerprint: Option<Fingerprint>,
    reading: Option<Arc<crate::sql::Analysis>>,
    /// When the client sent it, and how long it waited in the gate's queues.
    sent_at: Instant,
    waited: Duration,
    /// What the traffic log says of its request (while the log is on): one, or several
    /// once requests are counted together past [`MAX_PARTS`].
    arrivals: Vec<Arrived>,
}

/// A request for the traffic log: its arrival, its prediction and its wait.
#[derive(Debug)]
struct Arrived {
    arrival: Box<Arrival>,
    predicted: f64,
    learned: bool,
    waited: Duration,
}

impl Arrived {
    fn of(
        arrival: Option<Box<Arrival>>,
        predicted: f64,
        learned: bool,
        waited: Duration,
    ) -> Vec<Arrived> {
        arrival
            .map(|arrival| Arrived {
                arrival,
                predicted,
                learned,
                waited,
            })
            .into_iter()
            .collect()
    }
}

/// Room for requests a session keeps between runs.
const KEPT_PARTS: usize = 4;

/// Requests kept apart in one run; past this, a tenant's requests are counted together (a
/// client that pipelines without pause never lets its run end).
const MAX_PARTS: usize = 64;

/// A run this much faster or slower than its prediction (learned, or from a cached plan),
/// and at least [`FLIP_SECONDS`] long, was not that plan's.
const FLIP_RATIO: f64 = 10.0;
/// See [`FLIP_RATIO`]: shorter runs are too noisy to tell (a lookup slowed by a busy machine
/// is no flip).
const FLIP_SECONDS: f64 = 0.1;

impl Run {
    fn add(&mut self, part: Part, now: Instant) {
        self.started.get_or_insert(now);
        if self.parts.len() < MAX_PARTS {
            self.parts.push(part);
            return;
        }
        match self.parts.iter_mut().find(|p| p.tenant == part.tenant) {
            Some(same) => {
                same.charged += part.charged;
                same.predicted += part.predicted;
                same.learn = None;
                same.cached = None;
                same.arrivals.extend(part.arrivals);
            }
            None => self.parts.push(part),
        }
    }

    /// A message of the server's answer: CommandComplete's rows and an error's SQLSTATE are
    /// kept for the statement statistics.
    pub fn note_answer(&mut self, tag: u8, body: &[u8]) {
        match tag {
            crate::wire::backend::tag::COMMAND_COMPLETE => self.rows += rows_of(body),
            crate::wire::backend::tag::ERROR_RESPONSE if self.error.is_none() => {
                let code = crate::wire::ErrorFields::find(body, b'C');
                self.error = Some(String::from_utf8_lossy(code.unwrap_or(b"XX000")).into_owned());
            }
            _ => {}
        }
    }

    /// An Execute went to the server: the run's time counts from now if it is not counting
    /// already (a portal's later Executes).
    pub fn touch(&mut self, now: Instant) {
        self.started.get_or_insert(now);
    }
}

/// What becomes of the session's slot once a run is settled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::session) enum SlotAfter {
    /// It goes back next, with nothing awaited before but the server's own release: the
    /// run is settled in the same turn of the gate's lock.
    Goes,
    /// It stays (a transaction is open, or more is to run first): the run is settled now.
    Stays,
}

/// Each part's share of `took`, the run's time, in proportion to its prediction (evenly when
/// nothing was predicted).
fn shares(parts: &[Part], took: Duration) -> smallvec::SmallVec<[Duration; 2]> {
    if parts.len() == 1 {
        // All of it (what the sums below give, without a trip through floating point).
        return smallvec::smallvec![took];
    }
    let weight = |p: &Part| match p.predicted.is_finite() {
        true => p.predicted.max(0.0),
        false => 0.0,
    };
    let total: f64 = parts.iter().map(weight).sum();
    let n = parts.len() as f64;
    parts
        .iter()
        .map(|part| {
            let share = match total > 0.0 {
                true => weight(part) / total,
                false => 1.0 / n,
            };
            Duration::try_from_secs_f64(took.as_secs_f64() * share).unwrap_or_default()
        })
        .collect()
}

impl GateState {
    /// The tenant's statement timeout, if it cancelled the request the server is busy with
    /// since `busy_since` (not a later one of the same pipeline).
    pub fn timed_out_for(&self, busy_since: Option<Instant>) -> Option<TimedOut> {
        self.timed_out.filter(|t| t.since == busy_since)
    }

    /// A copy of `bytes` out of the read buffer, for what the gate holds while it reads a
    /// request (a Query's text, a Bind's values): short copies share a block, so one
    /// allocation serves many and a copy's clones share it without one; a long one has its
    /// own (see [`KEPT_MAX`]).
    fn keep(&mut self, bytes: &[u8]) -> Bytes {
        if bytes.is_empty() {
            return Bytes::new();
        }
        if bytes.len() > KEPT_MAX {
            return Bytes::copy_from_slice(bytes);
        }
        if self.kept.capacity() - self.kept.len() < bytes.len() {
            self.kept = BytesMut::with_capacity(KEPT_BLOCK);
        }
        self.kept.extend_from_slice(bytes);
        self.kept.split().freeze()
    }

    /// The server owes this client nothing (or the session lost its server): the run's time
    /// is settled with the tenants of its requests, and a request that ran alone and ended
    /// normally teaches its time. `ended`: when the server's last answer came, if known (else
    /// the run ends now).
    pub fn end_run(
        &mut self,
        keeper: &crate::gate::keeper::Gatekeeper,
        stats: Option<StatsSink>,
        (slot, ended): (SlotAfter, Option<Instant>),
    ) {
        let run = &mut self.run;
        if run.started.is_none() && run.parts.is_empty() && run.held.is_empty() {
            // Nothing was admitted or timed (no policy, or nothing went out): there is
            // nothing to settle, and only the run's marks are cleared.
            run.failed = false;
            run.rows = 0;
            run.error = None;
            run.changes_plans = false;
            return;
        }
        let mut run = std::mem::take(&mut self.run);
        self.settle_run(&run, keeper, stats, (slot, ended));
        // The next run keeps the lists' room (emptied: what they held is dropped here), a
        // little of it after a long pipeline.
        run.parts.clear();
        run.parts.shrink_to(KEPT_PARTS);
        run.held.clear();
        run.held.shrink_to(KEPT_PARTS);
        self.run.parts = run.parts;
        self.run.held = run.held;
    }

    /// [`end_run`](Self::end_run) of `run`, taken out of the session.
    fn settle_run(
        &mut self,
        run: &Run,
        keeper: &crate::gate::keeper::Gatekeeper,
        stats: Option<StatsSink>,
        (slot, ended): (SlotAfter, Option<Instant>),
    ) {
        // One reading of the clock for the run's end, unless the last answer's is known.
        let now = ended.unwrap_or_else(Instant::now);
        if let Some(sink) = &stats {
            sink.record(run, now);
        }
        for (tenant, id) in &run.held {
            keeper.end_unknown(tenant, *id);
        }
        let took = run.started.map(|s| now.saturating_duration_since(s));
        let shares = shares(&run.parts, took.unwrap_or_default());
        if let Some(sink) = &stats {
            sink.log_traffic(run, &shares, took.is_some());
        }
        let Some(took) = took else {
            return;
        };
        if run.changes_plans {
            // Even if something in the run failed: the DDL may have taken effect.
            self.stale_plans = true;
        }
        // Only a run of one part is kept for the release: the parts of a longer one are
        // settled in their order (a refund stops at the burst, a charge does not).
        let slot = match run.parts.len() > 1 {
            true => SlotAfter::Stays,
            false => slot,
        };
        if run.parts.is_empty() {
            // Server work no request was admitted for (a portal's later Executes): the
            // tenant last admitted pays it.
            if !self.tenant.is_empty() {
                let tenant = Arc::clone(&self.tenant);
                self.settle(keeper, slot, &tenant, 0.0, (took, now));
            }
            return;
        }
        for (part, own) in run.parts.iter().zip(shares) {
            self.settle(keeper, slot, &part.tenant, part.charged, (own, now));
        }
        if let ([part], false) = (run.parts.as_slice(), run.failed) {
            // Its time against its usual one: the adaptive limit's measure of the fast
            // lane's load (the slow lane's runs, quarantined flips among them, are not the
            // fast lane's).
            let slot = self.slot.as_ref().and_then(|g| g.slot());
            let fast = slot.filter(|s| s.lane() == crate::gate::Lane::Fast);
            if let (Some(slot), Some((key, cost))) = (fast, &part.learn) {
                // One usual time per statement and plan (another plan's time per unit of
                // cost is not this one's).
                let statement = key.fingerprint ^ key.shape.unwrap_or(0).rotate_left(17);
                keeper.note_run(slot, statement, took, *cost);
            }
            learn(keeper, part, took);
        }
    }

    /// Settles a run's `took` (ended `at`) with `tenant`, charged `charged` before it ran:
    /// with the slot's release when the slot goes back next, in the same turn of the gate's
    /// lock.
    fn settle(
        &mut self,
        keeper: &crate::gate::keeper::Gatekeeper,
        slot: SlotAfter,
        tenant: &str,
        charged: f64,
        (took, at): (Duration, Instant),
    ) {
        let kept = match (slot, self.slot.as_mut()) {
            (SlotAfter::Goes, Some(guard)) => guard.settle_on_release(tenant, charged, took, at),
            _ => false,
        };
        if !kept {
            keeper.settle(tenant, charged, took, at);
        }
    }

    /// The slot's release is to wait for something (a cancel on its way, a query of
    /// pgward's on the server): a run kept to settle with it is settled now.
    pub fn settle_kept(&mut self) {
        if let Some(guard) = self.slot.as_mut() {
            guard.settle_kept();
        }
    }

    /// Requests ran unpriced and wait to be priced.
    pub fn has_deferred(&self) -> bool {
        !self.deferred.is_empty()
    }

    /// The session lost its server before those requests were priced: they are not.
    pub fn forget_deferred(&mut self) {
        self.deferred.clear();
    }

    /// The run ends before the server answered (a timeout, the server gone: `sqlstate`, the
    /// client's error): what it took so far is charged, it teaches nothing, and what ran
    /// unpriced is not priced.
    pub fn cut_short(
        &mut self,
        keeper: &crate::gate::keeper::Gatekeeper,
        stats: Option<StatsSink>,
        sqlstate: &str,
    ) {
        self.run.failed = true;
        self.run.error.get_or_insert_with(|| sqlstate.to_string());
        self.end_run(keeper, stats, (SlotAfter::Stays, None));
        self.forget_deferred();
    }

    /// The policy's gate reads on after messages it did not read: what a name parsed since
    /// holds is known from the server's answers alone (the kill-only path keeps the last
    /// Parse of each name, across Syncs and whether or not the server ran it), and a Flush a
    /// held request waited for before is spent.
    fn lapse_ended(&mut self) {
        self.batch_parses.clear();
        self.unsettled.clear();
        self.unsettled_all = true;
        self.flush_wanted = false;
        self.flush_sent = false;
    }

    /// A message with the tag `message` passed a gate: an extended-protocol message opens the
    /// batch, a Sync ends it and the failed-batch mark with it. Whether it was a Sync.
    fn mark_batch(&mut self, message: u8) -> bool {
        match message {
            tag::SYNC => {
                self.batch_open = false;
                self.skipping = false;
                return true;
            }
            tag::PARSE | tag::BIND | tag::DESCRIBE | tag::EXECUTE | tag::CLOSE => {
                self.batch_open = true
            }
            _ => {}
        }
        false
    }

    /// A Sync passed the gate: the names parsed in its batch are settled by the answers.
    fn end_batch(&mut self) {
        if self.batch_parses.is_empty() {
            return;
        }
        if self.unsettled_all || self.unsettled.len() + self.batch_parses.len() > MAX_PARSED {
            self.unsettled_all = true;
            self.unsettled.clear();
            self.batch_parses.clear();
            return;
        }
        self.unsettled
            .extend(self.batch_parses.drain().map(|(name, _)| name));
    }

    /// The server has answered everything sent before what is gated now: every name parsed
    /// holds what the answers say.
    fn settle_names(&mut self) {
        self.views.settle();
        self.unsettled.clear();
        self.unsettled_all = false;
    }

    /// Whether requests that passed the gate wait in the read buffer to go out (admitted
    /// under the slot the session holds).
    pub fn admitted_unsent(&self) -> bool {
        self.gated > 0
    }

    /// Whether requests (Query, Bind, FunctionCall) that the gate admitted wait in the read
    /// buffer to go out: they are part of the current run, under the slot the session holds
    /// (a refused one has no part in it).
    pub fn requests_unsent(&self) -> bool {
        self.gated > 0 && self.verdicts.iter().any(|v| v.request && v.hit.is_none())
    }

    /// `n` gated bytes went to the server.
    pub fn consumed(&mut self, n: usize) {
        self.gated = self.gated.saturating_sub(n);
        if self.gated == 0 {
            // Every Parse that passed the gate has gone out: the statement map knows them.
            self.pending.clear();
        }
    }
}

/// Where a session's runs are counted (SHOW STATEMENTS): the tables and the session's
/// thread, whose table it records in, and the session's role and pgward database.
pub(in crate::session) struct StatsSink<'a> {
    pub tables: &'a crate::ops::StatementTables,
    pub worker: crate::workers::WorkerId,
    pub traffic: &'a crate::ops::traffic::TrafficLog,
    pub role: &'a Arc<str>,
    pub database: &'a Arc<str>,
}

impl StatsSink<'_> {
    /// Counts each request of `run` that was read: its latency runs from its arrival to the
    /// run's last answer. A run of one request has its rows and error; in a pipeline they
    /// cannot be told apart, and are left out.
    fn record(&self, run: &Run, now: Instant) {
        let alone = run.parts.len() == 1;
        self.tables
            .record(self.worker, |table| self.record_in(table, run, now, alone));
    }

    /// [`record`](Self::record) in the session's table.
    fn record_in(&self, table: &mut crate::ops::Statements, run: &Run, now: Instant, alone: bool) {
        for part in &run.parts {
            let Some(fingerprint) = part.fingerprint else {
                continue;
            };
            let key = crate::ops::statements::KeyRef {
                fingerprint: fingerprint.0,
                tenant: &part.tenant,
                role: self.role,
                database: self.database,
            };
            let ran = crate::ops::Ran {
                seconds: now.saturating_duration_since(part.sent_at).as_secs_f64(),
                waited: part.waited.as_secs_f64(),
                rows: if alone { run.rows } else { 0 },
                error: run.error.as_deref().filter(|_| alone),
            };
            table.record(key, &ran);
            let normalized = part.reading.as_ref().and_then(|a| a.normalized.as_ref());
            if let (false, Some(text)) = (table.has_text(fingerprint.0), normalized) {
                // (Read by the scanner once per statement: never a text with a constant or a
                // comment left in it.)
                let shown = crate::sql::shown_text(text).unwrap_or_default();
                table.set_text(fingerprint.0, shown);
            }
        }
    }

    /// The traffic log's line of each request of `run` (each part took its share in
    /// `shares`, if the run reached the server at all; requests counted together share
    /// their part's in proportion to their predictions).
    fn log_traffic(&self, run: &Run, shares: &[Duration], ran: bool) {
        for (part, own) in run.parts.iter().zip(shares) {
            let n = part.arrivals.len() as f64;
            for a in &part.arrivals {
                let share = match part.predicted > 0.0 && a.predicted.is_finite() {
                    true => a.predicted / part.predicted,
                    false => 1.0 / n,
                };
                let outcome = Outcome {
                    predicted: Some(a.predicted),
                    learned: a.learned,
                    took: ran.then_some(own.as_secs_f64() * share),
                    waited: a.waited.as_secs_f64(),
                    outcome: "ran",
                };
                let who = (&*part.tenant, &**self.role, &**self.database);
                self.traffic.write(&a.arrival.entry(who, outcome));
            }
        }
    }

    /// The traffic log's line of a request the gate refused (or whose client left: `reason`
    /// says which).
    pub fn log_refusal(
        &self,
        arrival: &Arrival,
        tenant: &str,
        reason: &str,
        predicted: Option<f64>,
    ) {
        let outcome = Outcome {
            predicted,
            learned: false,
            took: None,
            waited: arrival.age().as_secs_f64(),
            outcome: reason,
        };
        let who = (tenant, &**self.role, &**self.database);
        self.traffic.write(&arrival.entry(who, outcome));
    }

    /// Counts a refusal of `tenant`'s statement `fingerprint` by pgward.
    pub fn refused(&self, tenant: &str, fingerprint: Option<Fingerprint>, reason: &str) {
        let Some(fingerprint) = fingerprint else {
            return;
        };
        let tenant = Arc::from(tenant);
        let key = crate::ops::statements::KeyRef {
            fingerprint: fingerprint.0,
            tenant: &tenant,
            role: self.role,
            database: self.database,
        };
        self.tables
            .record(self.worker, |table| table.refused(key, reason));
    }
}

/// The rows a CommandComplete counts: the last number of its tag (`SELECT 5`, `INSERT 0 5`).
fn rows_of(body: &[u8]) -> u64 {
    let tag = body.strip_suffix(&[0]).unwrap_or(body);
    let last = tag.rsplit(|b| *b == b' ').next().unwrap_or_default();
    std::str::from_utf8(last)
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// One request the gate judges.
#[derive(Debug)]
enum Work {
    /// A Query's text, the bytes the server reads.
    Query(Bytes),
    Bind {
        parsed: Option<Arc<Parsed>>,
        /// The Bind body after the statement name.
        tail: Bytes,
        /// Its statement's Parse has not gone out yet.
        fresh: bool,
        /// What its statement's name holds waits on the server's answers to earlier Parses.
        unsettled: bool,
        /// The gate follows every statement the name could hold: `parsed` is none only for
        /// one no Parse the server answered created.
        in_view: bool,
    },
    Function,
}

impl Work {
    /// What may choose its plan beyond its statement: a hash of a Query's text (its
    /// constants), or of a Bind's statement text and values.
    fn constants(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        match self {
            Work::Query(t) => match may_comment(t).then(|| std::str::from_utf8(t).ok()) {
                // Comments (a sqlcommenter tag, a trace id) are no constants: the tokens
                // without them, as PostgreSQL's scanner reads them.
                Some(Some(t)) => hash_tokens(t, &mut h),
                _ => t.hash(&mut h),
            },
            Work::Bind { parsed, tail, .. } => {
                parsed.as_ref().map(|p| &p.text).hash(&mut h);
                tail.hash(&mut h);
            }
            Work::Function => {}
        }
        h.finish()
    }

    /// A Bind of a statement the gate follows and does not know.
    fn unknown_statement(&self) -> bool {
        matches!(
            self,
            Work::Bind {
                parsed: None,
                in_view: true,
                ..
            }
        )
    }

    /// The statement text as the server reads it.
    fn text(&self) -> Option<&[u8]> {
        self.bytes().map(|b| &b[..])
    }

    /// [`text`](Self::text), shared.
    fn bytes(&self) -> Option<&Bytes> {
        match self {
            Work::Query(t) => Some(t),
            Work::Bind {
                parsed: Some(p), ..
            } => Some(&p.text),
            _ => None,
        }
    }

    /// The statement text, when it is UTF-8 (what pgward can hand to PostgreSQL's parser
    /// and send again as it is, in an EXPLAIN).
    fn sql(&self) -> Option<&str> {
        match self {
            Work::Bind {
                parsed: Some(p), ..
            } => p.sql(),
            _ => self.text().and_then(|t| std::str::from_utf8(t).ok()),
        }
    }

    /// The statement text for its keywords alone (what kind of request it is, whether it
    /// may change plans): not UTF-8, its other bytes read as U+FFFD.
    fn words(&self) -> Option<Cow<'_, str>> {
        self.text().map(words_of)
    }
}

/// A request's predicted time, and what its run teaches.
struct Estimate {
    cost: Cost,
    learn: Option<(PlanFactorKey, Option<f64>)>,
}

impl Estimate {
    /// Nothing predicts it: it is charged `min_charge` before it runs.
    fn unknown(learn: Option<(PlanFactorKey, Option<f64>)>) -> Estimate {
        Estimate {
            cost: Cost {
                seconds: 0.0,
                known: false,
                learned: false,
            },
            learn,
        }
    }
}

/// The gate's answer for one request.
enum Step {
    /// Pass it on (`None`) or refuse it (boxed: a refusal is rare, and the verdict is
    /// moved about at every request).
    Verdict(Option<Box<RuleHit>>),
    /// Wait until the server owes nothing: its price needs an EXPLAIN.
    Hold,
}

impl Step {
    /// Refuse it with `hit`.
    fn refuse(hit: RuleHit) -> Step {
        Step::Verdict(Some(Box::new(hit)))
    }
}

impl Session {
    /// Runs the gate of the policy in force over the client's complete messages in the first
    /// `len` bytes of its read buffer that have not passed it yet. Returns how many bytes at
    /// the front may go to the server now.
    pub(super) async fn gate_chunk(
        &mut self,
        io: &mut ClientIo,
        len: usize,
        governance: &Arc<Governance>,
    ) -> Result<usize, SessionError> {
        // Under a policy the runs are counted (SHOW STATEMENTS, the unusual minutes, the
        // traffic log), even when `max_statement_stats = 0` keeps no row of them.
        self.gate.stats_on = true;
        if std::mem::take(&mut self.gate.lapsed) {
            self.gate.lapse_ended();
        }
        self.fresh_marks();
        while let Some(span) = frame_at(&io.rbuf[..len], self.gate.gated) {
            // Read in place; only what the gate keeps (a Parse's text and types, a Query's
            // text, a Bind's values) is copied out of the read buffer.
            let body = &io.rbuf[span.body()];
            let work = match span.tag {
                tag::PARSE => {
                    self.note_parse(&Bytes::copy_from_slice(body));
                    None
                }
                tag::CLOSE => {
                    self.note_close(body);
                    None
                }
                tag::QUERY => {
                    let text = QueryView::new(body).text;
                    self.note_query(text);
                    Some(Work::Query(self.gate.keep(text)))
                }
                tag::BIND => Some(self.bind_work(body)),
                tag::DESCRIBE => {
                    self.note_unnamed_use(span.tag, body);
                    None
                }
                tag::FUNCTION_CALL => Some(Work::Function),
                tag::EXECUTE => {
                    self.note_execute(body);
                    // A refused Execute fails its batch: the server skips the rest of it.
                    self.gate.skipping |= self.gate_execute(body);
                    None
                }
                _ => None,
            };
            if let Some(work) = work {
                match self.admit_work(io, governance, work).await? {
                    Step::Verdict(v) => {
                        // The Flush it may have waited for is spent.
                        self.gate.flush_sent = false;
                        let work = self.gate.admitted_work.take();
                        let killable = std::mem::take(&mut self.gate.admitted_killable);
                        if span.tag == tag::BIND {
                            let made = v.is_none().then(|| PortalWork {
                                tenant: Arc::clone(&self.gate.tenant),
                                fingerprint: work,
                                killable,
                            });
                            self.gate
                                .portals
                                .bound(portal_of(&io.rbuf[span.body()]), made);
                        }
                        if v.is_some() && span.tag == tag::BIND {
                            // Refused in its batch: the server skips everything up to the Sync.
                            self.gate.skipping = true;
                        }
                        self.gate.verdicts.push_back(Gated {
                            hit: v,
                            work,
                            request: true,
                        });
                        // (Known now: what went before it has been answered.)
                        self.note_unnamed_use(span.tag, &io.rbuf[span.body()]);
                    }
                    Step::Hold => return Ok(self.gate.gated),
                }
            }
            if self.gate.mark_batch(span.tag) {
                self.gate.end_batch();
            }
            self.gate.gated = span.end;
        }
        Ok(self.gate.gated)
    }

    /// When everything gated so far has gone out, the batch's marks are read again from the
    /// server's view, which is exact then (whichever gate read what went before).
    fn fresh_marks(&mut self) {
        if self.gate.gated != 0 {
            return;
        }
        let link = self.link.as_ref();
        self.gate.batch_open = link.is_some_and(|l| l.expected.batch_open());
        // The server skips what comes up to the Sync after an error, and after a refusal
        // pgward raised there that is not answered yet; pgward drops what follows one it
        // answered itself.
        self.gate.skipping = self.skip_to_sync
            || link.is_some_and(|l| l.expected.skipping() || l.expected.raises_before_sync());
        let marks = self.gate.views.has_marks();
        if (self.gate.unsettled_all || !self.gate.unsettled.is_empty() || marks)
            && self.answered_before_gated()
        {
            self.gate.settle_names();
        }
    }

    /// An Execute passed the gate (under a policy, or while a kill may be in force without
    /// one): it runs what its portal's Bind did (what KILL STATEMENT finds running), and a
    /// kill (not SOFT) of the Bind's tenant or statement made since refuses it, as one made
    /// while an admitted request waits does. Whether it refused it.
    fn gate_execute(&mut self, body: &[u8]) -> bool {
        let (tenant, fingerprint) = match self.gate.portals.of(portal_of(body)) {
            Portal::Runs(w) if w.killable => (Some(Arc::clone(&w.tenant)), w.fingerprint),
            Portal::Runs(w) => (None, w.fingerprint),
            // (Refused once already, at its Bind; or not known, and perhaps a COMMIT.)
            Portal::Refused | Portal::Unknown => (None, None),
        };
        let hit = match (tenant, self.rt.gatekeeper.may_have_kills()) {
            (Some(tenant), true) => {
                let now = Instant::now();
                self.killed_by(&tenant, fingerprint.map(Fingerprint), now, true)
            }
            _ => None,
        };
        let refused = hit.is_some();
        self.gate.verdicts.push_back(Gated {
            hit: hit.map(|r| Box::new(refusal_hit(&r))),
            work: fingerprint,
            request: false,
        });
        refused
    }

    fn note_parse(&mut self, body: &Bytes) {
        let Ok(parse) = ParseView::new(body) else {
            // The message is refused as it goes out; it defines nothing.
            self.gate.defines.push_back(None);
            return;
        };
        let parsed = Arc::new(Parsed::of(body, &parse));
        let name = Bytes::copy_from_slice(self.gate_key(parse.name));
        // The unnamed statement, and every named one in session pooling, are the gate's to
        // follow; pgward's statement map follows the others.
        let followed = name.is_empty() || !self.statements_mapped();
        let gate = &mut self.gate;
        let definition = followed.then(|| {
            // PostgreSQL drops the unnamed statement before it reads the new text (unless it
            // skips the Parse).
            let seq = match name.is_empty() {
                true => gate.views.parse_unnamed(),
                false => gate.views.next_seq(),
            };
            Arc::new(Definition {
                name: name.clone(),
                parsed: Arc::clone(&parsed),
                seq,
            })
        });
        gate.defines.push_back(definition);
        if gate.pending.len() >= MAX_PARSED || gate.batch_parses.len() >= MAX_PARSED {
            // Unreachable with a sane read buffer; a Bind of a name not found is priced as
            // a statement the gate does not know.
            gate.pending.clear();
            gate.batch_parses.clear();
        }
        gate.batch_parses.insert(name.clone(), Arc::clone(&parsed));
        gate.pending.insert(name, parsed);
    }

    /// A Query read: PostgreSQL drops the unnamed statement, and the text may define or
    /// free statements.
    fn note_query(&mut self, text: &[u8]) {
        self.gate.views.drop_unnamed();
        self.note_sql_touches(text);
    }

    /// A message read that uses the unnamed statement (a Bind or Describe of it): the
    /// statement as the gate knows it now, taken as the message goes out.
    fn note_unnamed_use(&mut self, tag: u8, body: &[u8]) {
        if super::views::uses_unnamed(tag, body) {
            let known = self.gate.views.unnamed();
            self.gate.unnamed_uses.push_back(known);
        }
    }

    /// A text that may define or free statements by SQL (PREPARE, DEALLOCATE, DISCARD ALL,
    /// or EXECUTE of a statement that does) marks the names it touches: in session pooling
    /// the gate follows them itself, and no longer knows what they hold (pgward's statement
    /// map answers for the others).
    fn note_sql_touches(&mut self, text: &[u8]) {
        if !self.statements_mapped() {
            self.touch_by_sql(text, 0);
        }
    }

    /// Whether `text` may define or free statements (what it touches is marked).
    fn touch_by_sql(&mut self, text: &[u8], depth: usize) -> bool {
        use super::prepared::{sql_executes, sql_touches, Touches};
        let touches = sql_touches(text);
        let may = touches != Touches::Nothing;
        match touches {
            Touches::Nothing => {}
            Touches::All => {
                self.gate.views.touch_all();
                self.gate.batch_parses.clear();
            }
            Touches::Names(names) => {
                for name in names {
                    let name = super::prepared::sql_name_key(&name);
                    self.gate.batch_parses.remove(name);
                    self.gate.views.touch(name);
                }
            }
        }
        let executes = sql_executes(text);
        let may = may || !executes.is_empty();
        for name in executes {
            // A statement run by SQL EXECUTE may itself be a DEALLOCATE or a PREPARE.
            let name = super::prepared::sql_name_key(&name);
            let gate = &self.gate;
            let sent = gate
                .batch_parses
                .get(name)
                .or_else(|| gate.pending.get(name));
            let statement = sent.cloned().or_else(|| gate.views.named(name));
            // One parsed through the protocol and not answered yet, or parsed unseen: its
            // text is not known here.
            let unknown = gate.unsettled_all || gate.unsettled.contains(name) || gate.views.partial;
            match (statement, depth) {
                (Some(p), 0..=2) => {
                    self.touch_by_sql(&p.text, depth + 1);
                }
                (Some(_), _) => self.gate.views.touch_all(),
                (None, _) if unknown => self.gate.views.touch_all(),
                // Prepared in SQL (which prepares no DEALLOCATE or PREPARE), or none.
                (None, _) => {}
            }
        }
        may
    }

    /// The name the gate keys a statement by: pgward's map keys the client's own names;
    /// PostgreSQL keys by the first 63 bytes.
    fn gate_key<'a>(&self, name: &'a [u8]) -> &'a [u8] {
        match self.statements_mapped() {
            true => name,
            false => super::views::key(name),
        }
    }

    /// The statement bound to `portal` (a Bind), if it may define or free statements when it
    /// runs: its Executes mark them again, in their place.
    fn note_portal(&mut self, portal: &[u8], touching: Option<&Parsed>) {
        if self.statements_mapped() {
            return;
        }
        let portal = super::views::key(portal);
        if !self.gate.portal_texts.is_empty() {
            self.gate.portal_texts.remove(portal);
        }
        let Some(statement) = touching else {
            return;
        };
        if self.gate.portal_texts.len() >= MAX_PARSED {
            // Too many such portals to follow: each Execute of a portal not followed may
            // free or define any name.
            self.gate.portals_unfollowed = true;
            return;
        }
        self.gate
            .portal_texts
            .insert(Bytes::copy_from_slice(portal), statement.text.clone());
    }

    /// An Execute of a portal whose statement may define or free statements.
    fn note_execute(&mut self, body: &[u8]) {
        if self.gate.portal_texts.is_empty() {
            return;
        }
        let portal = body.split(|b| *b == 0).next().unwrap_or_default();
        let portal = super::views::key(portal);
        match self.gate.portal_texts.get(portal).cloned() {
            Some(text) => {
                self.touch_by_sql(&text, 0);
            }
            None if self.gate.portals_unfollowed => self.gate.views.touch_all(),
            None => {}
        }
    }

    /// Whether pgward maps this client's named statements (pooled modes).
    fn statements_mapped(&self) -> bool {
        self.mode != crate::config::PoolMode::Session
    }

    /// A Close of a statement: a Bind later in its batch does not run it, and in session
    /// pooling what the name holds afterwards depends on whether the server ran the Close.
    fn note_close(&mut self, body: &[u8]) {
        if let Ok(CloseView {
            kind: target::STATEMENT,
            name,
        }) = CloseView::new(body)
        {
            let key = self.gate_key(name);
            self.gate.pending.remove(key);
            self.gate.batch_parses.remove(key);
            if name.is_empty() {
                self.gate.views.drop_unnamed();
            } else if !self.statements_mapped() {
                self.gate.views.touch(name);
            }
        }
    }

    /// What the statement `name` is, and whether that is still to be settled by the server's
    /// answers: a Parse of it earlier in the Bind's own batch (the Bind runs it or is skipped
    /// with it), else what the server created, once it has answered every Parse of the name
    /// (pgward's statement map for the names it maps, else the gate's own view).
    fn statement_of(&mut self, name: &[u8]) -> (Option<Arc<Parsed>>, bool) {
        let name = self.gate_key(name);
        if let Some(p) = self.gate.batch_parses.get(name) {
            return (Some(Arc::clone(p)), false);
        }
        let gate = &self.gate;
        let listed =
            gate.unsettled_all || !gate.unsettled.is_empty() && gate.unsettled.contains(name);
        // Settled once the server has answered everything sent before this Bind.
        let unsettled = listed && !self.answered_before_gated();
        if listed && !unsettled {
            self.gate.settle_names();
        }
        let known = if name.is_empty() {
            self.gate.views.unnamed()
        } else if self.statements_mapped() {
            self.statements.get(name).and_then(|s| s.parsed.clone())
        } else {
            self.gate.views.named(name)
        };
        (known, unsettled)
    }

    /// Whether the server has answered everything sent before the messages gated now.
    fn answered_before_gated(&self) -> bool {
        self.gate.gated == 0
            && self.gate.verdicts.is_empty()
            && self
                .link
                .as_ref()
                .is_none_or(|l| l.expected.is_empty() && l.server.rbuf.is_empty())
    }

    fn bind_work(&mut self, body: &[u8]) -> Work {
        let Ok(bind) = BindView::new(body) else {
            return Work::Function;
        };
        let (parsed, unsettled) = self.statement_of(bind.statement);
        // Where the gate follows every statement the name could hold, one it does not know
        // was not created by a Parse the server answered (a PREPARE in SQL, say).
        let named_mapped = !bind.statement.is_empty() && self.statements_mapped();
        let in_view = named_mapped || !self.gate.views.partial;
        // A statement that runs PREPARE, DEALLOCATE or DISCARD ALL (or EXECUTE): marked now,
        // and again as its portal runs.
        let touching = match (&parsed, self.statements_mapped()) {
            (Some(p), false) => self.touch_by_sql(&p.text, 0).then_some(&**p),
            _ => None,
        };
        self.note_portal(bind.portal, touching);
        Work::Bind {
            parsed,
            tail: self.gate.keep(bind.rest),
            fresh: self
                .gate
                .pending
                .contains_key(self.gate_key(bind.statement)),
            unsettled,
            in_view,
        }
    }

    /// Whether the server owes this client nothing (or none is checked out).
    fn link_quiet(&self) -> bool {
        self.link.as_ref().is_none_or(|l| l.quiet(&self.to_server))
    }

    /// Whether a request at this point of the client's stream is the first in line: the
    /// server owes nothing and no request ahead of it waits to be forwarded, so nothing can
    /// change how the server will read it before it runs.
    fn first_in_line(&self) -> bool {
        self.link_quiet() && self.gate.verdicts.is_empty()
    }

    async fn admit_work(
        &mut self,
        io: &mut ClientIo,
        governance: &Arc<Governance>,
        work: Work,
    ) -> Result<Step, SessionError> {
        if self.gate.skipping {
            // An earlier message of this batch failed: the server skips this one.
            return Ok(Step::Verdict(None));
        }
        if let Work::Bind {
            unsettled: true, ..
        } = work
        {
            // What its statement is depends on how earlier Parses of the name fare: it waits
            // for the server's answers (asked for by a Flush inside an open batch).
            self.gate.flush_wanted = self.gate.batch_open && !self.gate.flush_sent;
            return Ok(Step::Hold);
        }
        let keeper = self.rt.gatekeeper.clone();
        let text = work.sql();
        let in_flight = !self.link_quiet();
        let settled = self.settled.of(&self.params);
        let (context, statement_timeout) = (
            context_from(&settled.context, in_flight),
            settled.statement_timeout,
        );
        let scs_on = conforming(&context);
        let at = self.params.changes();
        let read = work.bytes();
        let analysis = read.map(|t| {
            // The text of the last request read the same way (a prepared statement run
            // again) is not read again.
            let last = self.gate.analyzed.as_ref();
            match last.and_then(|a| a.of(t, &context, governance)) {
                Some(again) => Arc::clone(&again.analysis),
                None => {
                    let memo = self.readings.memo(governance, at);
                    governance
                        .analyzer
                        .analyze_utf8_with(t, text, &context, memo)
                }
            }
        });
        // The rules read the same text next, as the message goes out (a Query, or the Parse
        // of a Bind that goes out with it): they take this reading, and its verdict below, if
        // nothing changed.
        let judged_next = match &work {
            Work::Query(_) => true,
            Work::Bind { fresh, .. } => *fresh,
            Work::Function => false,
        };
        if let (Some(t), Some(a)) = (read, &analysis) {
            Analyzed::remember(&mut self.gate.analyzed, t, context, governance, a);
        }
        let judged_next = judged_next && analysis.is_some();
        let facts = match &analysis {
            Some(a) => self.derive(governance, &work, a),
            None => self.underived(governance),
        };
        let kind = facts.kind;
        if self.gate.cancel_next && kind.killable() {
            // The client asked for a cancel while pgward priced what ran before, and had sent
            // this request by then (or the cancel failed its transaction on pgward's
            // statement): it is this request's answer, as the cancel would have been on the
            // server. What ends a transaction goes through, as under a kill.
            self.gate.cancel_next = false;
            return Ok(Step::refuse(cancelled()));
        }
        let fingerprint = analysis.as_ref().and_then(|a| a.fingerprint);
        let tenant = Arc::clone(&facts.tenant);
        let key = facts.plan_key.as_ref().filter(|_| kind.waits_for_slot());
        let now = Instant::now();
        // Only statements that were explained have plans cached: a hit needs no reading.
        let cached = key
            .as_ref()
            .and_then(|k| keeper.plans().get_for(k, || work.constants(), now));
        let judged = match (text, &key, &cached) {
            (Some(t), Some(_), None) => Some(judged_statement(t, scs_on)),
            _ => None,
        };
        let sql = judged.as_ref().and_then(explain_sql);
        // An EXPLAIN of it reads the statement itself (not EXECUTE's statement, a whole table).
        let plannable = matches!(judged, Some(Judged::Plan(_)));
        let first = self.first_in_line();
        // A simple Query of several statements under cost rules: each statement is judged
        // before the text runs.
        let parts_judged = matches!(work, Work::Query(_))
            && text.is_some()
            && facts.several
            && facts.cost_limits.any();
        // An unknown price is read by an EXPLAIN only for the first request in line; a later
        // one waits until the server owes nothing, or, inside a batch that is still open
        // (the server answers nothing before its Sync), is priced once it has run; under
        // cost rules it is judged inside the batch before it runs.
        let mut deferred = (sql.is_some() && cached.is_none() || parts_judged) && !first;
        if deferred && !self.gate.batch_open {
            return Ok(Step::Hold);
        }
        let ruled = facts.cost_limits.any();
        if ruled && work.unknown_statement() {
            // No Parse the server answered created it: a PREPARE in SQL, say, whose text the
            // gate never read.
            let hit = self.unpriceable(governance, &tenant, UNKNOWN_STATEMENT);
            if let Some(hit) = hit {
                self.note_cost_refusal(&tenant, fingerprint, &hit);
                return Ok(Step::refuse(hit));
            }
        }
        if ruled && matches!(judged, Some(Judged::Unreadable)) {
            let hit = self.unpriceable(governance, &tenant, UNREADABLE);
            if let Some(hit) = hit {
                self.note_cost_refusal(&tenant, fingerprint, &hit);
                return Ok(Step::refuse(hit));
            }
        }
        if ruled && work.text().is_some() && text.is_none() {
            // Not UTF-8: neither PostgreSQL's parser nor an EXPLAIN of pgward's can read it
            // as the server will, so its price cannot be known before it runs.
            let hit = self.unpriceable(governance, &tenant, NOT_UTF8);
            if let Some(hit) = hit {
                self.note_cost_refusal(&tenant, fingerprint, &hit);
                return Ok(Step::refuse(hit));
            }
        }
        if deferred && ruled && matches!(work, Work::Bind { .. }) {
            // Cost rules judge a Bind inside an open batch before it runs: once the server
            // has answered what went before it, it is explained in the batch.
            match self.in_batch_turn(plannable) {
                InBatch::Wait => {
                    self.gate.flush_wanted = !self.gate.flush_sent;
                    return Ok(Step::Hold);
                }
                InBatch::Explain => deferred = false,
                InBatch::Unplannable => {}
            }
        }
        if deferred && (parts_judged || ruled) {
            // Behind an extended batch still open on the server (no Sync yet), a simple Query
            // cannot be read before it runs, nor what an EXPLAIN cannot read as itself.
            let hit = self.unpriceable(governance, &tenant, IN_OPEN_BATCH);
            if let Some(hit) = hit {
                self.note_cost_refusal(&tenant, fingerprint, &hit);
                return Ok(Step::refuse(hit));
            }
        }
        match self.rules_verdict(governance, &work, analysis.as_ref()) {
            Some(Verdict::Reject(hit)) => {
                // Refused by a rule: neither priced nor charged (the rules raise it again as
                // the message goes out, and log it there).
                return Ok(Step::refuse(hit));
            }
            Some(Verdict::Allow) => {
                // The rules at the message take this verdict for the same reading.
                if let (true, Some(a)) = (judged_next, self.gate.analyzed.as_mut()) {
                    a.allowed = Some(Allowed {
                        policy: Arc::clone(governance),
                        params: self.params.changes(),
                    });
                }
            }
            _ => {}
        }
        let settings = self.pool_settings();
        let spare = self.gate.spare_pass.take();
        let request = Request {
            priority: facts.priority,
            kind,
            fingerprint,
            deadline: facts.deadline,
            ..self.request(&tenant, &settings, statement_timeout)
        };
        let arrival = self
            .rt
            .ops
            .traffic
            .is_on()
            .then(|| Box::new(Arrival::of(&request, now, std::time::SystemTime::now())));
        // A price known before admission (a cached plan) is estimated and judged by the cost
        // rules first: when they let it pass, admission, charge and slot are one turn of the
        // gate's lock.
        let early = cached.as_ref().filter(|_| !deferred).map(|known| {
            let estimate = self.estimate(Some(known), fingerprint);
            let violation = self.cost_violation(&facts.cost_limits, known, estimate.cost);
            (estimate, violation)
        });
        // (Looked at once: nothing it reads changes until the charge below.)
        let slot_first = early.is_some() && self.takes_slot_first();
        let charge = match &early {
            Some((estimate, None)) => Some((estimate.cost, slot_first)),
            _ => None,
        };
        let admitted = keeper.admit(&request, now, charge, spare);
        self.gate.limits = admitted.limits;
        if let Some(hint) = admitted.hint {
            self.gate.hint = Some(hint);
        }
        self.gate.tenant = Arc::clone(&tenant);
        let mut paid = admitted.paid;
        let (mut pass, bypass) = match admitted.decision {
            Decision::Refuse(r) => {
                return Ok(self.refuse(&r, &tenant, fingerprint, (arrival.as_deref(), None)))
            }
            Decision::Bypass(pass) => (pass, true),
            Decision::Admit(pass) => (pass, false),
        };
        let mut plan = cached;
        // Whether the plan came from the cache rather than from this request's EXPLAIN.
        let mut from_cache = plan.is_some();
        // A price already known is charged before any wait: a request its tenant cannot pay
        // for waits for pay-back holding no slot, and one refused by a cost rule is refused
        // before it takes anything.
        let mut ruled = false;
        // That price, kept for the charge after the wait (the plan stays the same).
        let mut priced = None;
        // The gate was asked for a slot just now and had none free: the wait need not ask
        // again before it queues.
        let mut full = false;
        if let (Some((estimate, violation)), false) = (early, bypass) {
            let predicted = estimate.cost;
            if let Some(hit) = violation.and_then(|v| self.cost_verdict(governance, &tenant, v)) {
                self.note_cost_refusal(&tenant, fingerprint, &hit);
                return Ok(Step::refuse(hit));
            }
            ruled = true;
            // A slot free now is taken in the same turn of the gate's lock (as the wait below
            // would at once), unless the server has to be taken first; with the admission
            // itself when the cost rules had nothing to say.
            let spent = match (paid.take(), slot_first) {
                (Some(paid), _) => paid,
                (None, true) => keeper.spend_and_try_acquire(&mut pass, predicted),
                (None, false) => keeper
                    .spend(&mut pass, predicted)
                    .map(|s| (s, SlotLook::NotAsked)),
            };
            match spent {
                Err(r) => {
                    let priced = (arrival.as_deref(), Some(predicted.seconds));
                    return Ok(self.refuse(&r, &tenant, fingerprint, priced));
                }
                Ok((_, SlotLook::Taken(guard))) => {
                    // Taken in the turn of the lock that admitted it, at `now`.
                    self.hooks.gate_slot_at_once(now);
                    self.gate.slot = Some(guard);
                }
                Ok((_, SlotLook::Full)) => full = true,
                Ok((_, SlotLook::NotAsked)) => {}
            }
            priced = Some(estimate);
        }
        // Time spent waiting for a server from the pool (statement statistics: pgward's own
        // queues, beside the gate's).
        let mut for_server = Duration::ZERO;
        loop {
            if !bypass && self.holds_another_slot(&pass) && !self.in_transaction() {
                // Pipelined behind a request of another lane or tenant, whose slot the
                // session holds: it does not run there (a quarantined flip or a tenant in debt
                // in the fast lane, a tenant past its max_active), but waits for a slot of its
                // own once what runs in that one is answered. A batch still open on the server
                // cannot wait (its Sync is behind it): it runs, as a debt does there.
                if !self.gate.batch_open {
                    keeper.refund(&mut pass);
                    if !first {
                        return Ok(Step::Hold);
                    }
                    self.maybe_release(io).await?;
                    self.gate.slot = None;
                }
            }
            // The slot first, then the server: a client waiting for a slot holds no server.
            // In session pooling the server is the client's own for the whole session: it
            // is taken first (never while holding a slot, which a client holding its server
            // may be waiting for), and each request waits for its slot holding it. A client
            // inside a transaction keeps its slot and its server to the end of it, and never
            // waits for a slot: it may hold locks that the statements ahead of it in the
            // queue wait for.
            if self.link.is_none() && self.mode == crate::config::PoolMode::Session {
                let attached = self.attach(io).await;
                for_server += refunded_unless_ok(attached, &keeper, &mut pass)?;
            }
            if self.gate.slot.is_none() && !self.in_transaction() {
                match self.wait_while_held(io).await {
                    // What the gate said of its slots before the wait is old news.
                    Ok(waited) => full &= !waited,
                    Err(gone) => {
                        keeper.refund(&mut pass);
                        if let Some(arrival) = &arrival {
                            // As for a client that leaves while it waits for its slot.
                            let left = crate::ops::traffic::CLIENT_LEFT;
                            self.log_unrun(arrival, &tenant, left, None);
                        }
                        return Err(gone);
                    }
                }
                let answer = self
                    .wait_for_slot(io, pass, std::mem::take(&mut full))
                    .await;
                if let (Err(_), Some(arrival)) = (&answer, &arrival) {
                    // The client left while its request waited: the traffic log says so.
                    self.log_unrun(arrival, &tenant, crate::ops::traffic::CLIENT_LEFT, None);
                }
                match answer? {
                    SlotAnswer::Granted(p, guard) => {
                        pass = p;
                        self.gate.slot = Some(guard);
                    }
                    SlotAnswer::Refused(_, r) => {
                        let unpriced = (arrival.as_deref(), None);
                        return Ok(self.refuse(&r, &tenant, fingerprint, unpriced));
                    }
                }
            }
            if self.link.is_none() {
                let attached = self.attach(io).await;
                for_server += refunded_unless_ok(attached, &keeper, &mut pass)?;
            }
            if let Some(r) = self.killed_while_waiting(&tenant, fingerprint, kind) {
                keeper.refund(&mut pass);
                return Ok(self.refuse(&r, &tenant, fingerprint, (arrival.as_deref(), None)));
            }
            if bypass {
                self.note_waited(governance, &pass);
                self.handle.set_tenant(&tenant);
                self.gate.admitted_work = fingerprint.map(|f| f.0);
                self.gate.admitted_killable = kind.killable();
                let charged = pass.charged();
                self.gate.run.add(
                    Part {
                        tenant,
                        charged,
                        predicted: charged,
                        learn: None,
                        cached: None,
                        learned: false,
                        fingerprint,
                        reading: analysis.clone(),
                        sent_at: pass.sent_at,
                        waited: pass.waited + for_server,
                        arrivals: Arrived::of(arrival, charged, false, pass.waited + for_server),
                    },
                    Instant::now(),
                );
                return Ok(Step::Verdict(None));
            }
            if let (None, Some(sql), Some(key), false) = (&plan, &sql, &key, deferred) {
                let sizes = facts.cost_limits.max_scan_rows.is_some();
                match self.explain(sql, &work, key, sizes).await? {
                    Priced::Plan(p) => plan = p,
                    Priced::Cancelled => return Ok(Step::refuse(cancelled())),
                    Priced::FailedInBatch(error) => {
                        self.fail_in_batch(&error);
                        return Ok(Step::Verdict(None));
                    }
                }
                from_cache = false;
                self.check_shape(plan.as_deref(), fingerprint);
            }
            if let (true, false, Some(text)) = (parts_judged, deferred, text) {
                let text = text.to_string();
                if let Some(hit) = self.judge_parts(governance, &tenant, &text).await? {
                    if hit.sqlstate != sqlstate::QUERY_CANCELED {
                        // (The client's own cancel stopped the pricing: no refusal of pgward's.)
                        self.note_cost_refusal(&tenant, fingerprint, &hit);
                    }
                    return Ok(Step::refuse(hit));
                }
            }
            let estimate = match priced.take() {
                Some(known) => known,
                None => self.estimate(plan.as_deref(), fingerprint),
            };
            let verdict = match ruled {
                true => None,
                false => {
                    let plan = plan.as_deref();
                    let limits = &facts.cost_limits;
                    self.cost_rules(governance, &tenant, limits, plan, estimate.cost)
                }
            };
            if let Some(hit) = verdict {
                self.note_cost_refusal(&tenant, fingerprint, &hit);
                return Ok(Step::refuse(hit));
            }
            let cost = estimate.cost;
            // A DECLARE runs nothing of its query: its time teaches nothing of its plan.
            let learn = estimate.learn.filter(|_| !facts.declares_cursor);
            self.gate.run.changes_plans |= facts.changes_plans;
            // Nobody knows yet what this takes: the tenant's other unpriced work waits until
            // it has run (held before the charge, which offers freed slots to the waiting).
            let held = !cost.known && keeper.hold_unknown(&tenant, pass.id);
            let spent = match pass.paid() {
                // Charged before its wait.
                Some(charged) => Ok(Spent::Run { charged }),
                None => keeper.spend(&mut pass, cost),
            };
            let end_hold = || {
                if held {
                    keeper.end_unknown(&tenant, pass.id);
                }
            };
            match spent {
                Ok(Spent::Run { .. }) => {}
                Err(r) => {
                    end_hold();
                    let priced = (arrival.as_deref(), Some(cost.seconds));
                    return Ok(self.refuse(&r, &tenant, fingerprint, priced));
                }
                Ok(Spent::MovedToSlow | Spent::WaitForBudget { .. })
                    if first && !self.in_transaction() =>
                {
                    end_hold();
                    // Wait again, in the slow lane or until the debt is paid back, holding
                    // nothing: the server owes nothing and goes back to the pool meanwhile
                    // (before the slot, so the next holder finds it).
                    self.maybe_release(io).await?;
                    self.gate.slot = None;
                    continue;
                }
                Ok(Spent::MovedToSlow | Spent::WaitForBudget { .. })
                    if !self.gate.batch_open && !self.in_transaction() =>
                {
                    // Earlier requests still run in this slot: wait until they are answered.
                    end_hold();
                    return Ok(Step::Hold);
                }
                Ok(Spent::MovedToSlow | Spent::WaitForBudget { .. }) => {
                    // Inside a transaction, or a batch already open on the server: it runs
                    // now, and pays in full (into debt).
                    keeper.force_spend(&mut pass, cost.seconds);
                }
            }
            if let (true, Some(sql), Some(key)) = (deferred, sql, key.cloned()) {
                self.gate.deferred.push(Deferred {
                    sql,
                    work,
                    key,
                    tenant: tenant.clone(),
                });
            }
            self.note_waited(governance, &pass);
            self.handle.set_tenant(&tenant);
            self.gate.admitted_work = fingerprint.map(|f| f.0);
            self.gate.admitted_killable = kind.killable();
            if held {
                self.gate.run.held.push((tenant.clone(), pass.id));
            }
            let part = Part {
                tenant,
                charged: pass.charged(),
                predicted: cost.seconds,
                learn,
                cached: (key.is_some() && from_cache).then(|| Arc::clone(&facts)),
                learned: cost.learned,
                fingerprint,
                reading: analysis.clone(),
                sent_at: pass.sent_at,
                waited: pass.waited + for_server,
                arrivals: Arrived::of(
                    arrival,
                    cost.seconds,
                    cost.learned,
                    pass.waited + for_server,
                ),
            };
            self.gate.run.add(part, Instant::now());
            // The next request's pass is made in this one's allocation.
            self.gate.spare_pass = Some(pass);
            return Ok(Step::Verdict(None));
        }
    }

    /// Whether the session holds a slot that is not `pass`'s to use: of another lane, or of
    /// another tenant.
    fn holds_another_slot(&self, pass: &Pass) -> bool {
        let held = self.gate.slot.as_ref().and_then(|g| g.slot());
        held.is_some_and(|s| s.lane() != pass.lane || s.tenant() != &*pass.tenant)
    }

    /// Whether this request's wait for a slot comes before anything else: it holds none, is
    /// outside a transaction, and is not in session pooling without its server yet (taken
    /// before the slot there).
    fn takes_slot_first(&self) -> bool {
        let server_first = self.link.is_none() && self.mode == crate::config::PoolMode::Session;
        // (A client of a paused database takes none before the RESUME.)
        let held = !server_first && self.hooks.held(&self.pool);
        self.gate.slot.is_none() && !self.in_transaction() && !server_first && !held
    }

    /// The cost rules on each statement of a text of several, before it runs: each that
    /// EXPLAIN can plan is read on the server (and its plan cached) and judged. A statement
    /// after one that may change how the next are planned (DDL, SET, PREPARE, ANALYZE...), or
    /// one EXPLAIN cannot plan now (it uses what an earlier one creates; the transaction has
    /// failed), cannot be read before the text runs: the text is refused (54000), as pgward
    /// refuses what it cannot read with certainty.
    async fn judge_parts(
        &mut self,
        governance: &Governance,
        tenant: &str,
        text: &str,
    ) -> Result<Option<RuleHit>, SessionError> {
        let Some(parts) = statements_of(text, parser_options(&self.params)) else {
            // Not a text PostgreSQL's parser reads: the server refuses it by itself.
            return Ok(None);
        };
        let limits = governance.policy.cost_limits(tenant);
        let sizes = limits.max_scan_rows.is_some();
        let mut changed = false;
        for part in &parts {
            let word = crate::gate::first_keyword(part);
            let session = ["set", "reset", "prepare", "deallocate", "discard", "load"];
            if changes_plans(part) || session.iter().any(|w| word.eq_ignore_ascii_case(w)) {
                changed = true;
                continue;
            }
            let context = parse_context(&self.params);
            let judged = judged_statement(part, conforming(&context));
            if judged == Judged::Unreadable {
                return Ok(self.unpriceable(governance, tenant, UNREADABLE));
            }
            let Some(sql) = explain_sql(&judged) else {
                continue;
            };
            if changed {
                return Ok(self.unpriceable(governance, tenant, AFTER_PLAN_CHANGE));
            }
            let analysis = governance.analyzer.analyze(part.as_bytes(), &context);
            let Some(fp) = analysis.fingerprint else {
                return Ok(self.unpriceable(governance, tenant, AFTER_PLAN_CHANGE));
            };
            let key = self.plan_key(&Arc::from(tenant), fp);
            let work = Work::Query(Bytes::from(part.clone()));
            let plan = match self.explain(&sql, &work, &key, sizes).await? {
                Priced::Plan(Some(plan)) => plan,
                // Not plannable now (it uses what an earlier statement creates, the
                // transaction has failed...): it cannot be judged before it runs.
                Priced::Plan(None) => {
                    return Ok(self.unpriceable(governance, tenant, AFTER_PLAN_CHANGE))
                }
                Priced::Cancelled => return Ok(Some(cancelled())),
                // Not inside an open batch: a text of several is judged first in line.
                Priced::FailedInBatch(_) => {
                    return Ok(self.unpriceable(governance, tenant, AFTER_PLAN_CHANGE))
                }
            };
            let predicted = self.estimate(Some(&plan), Some(fp)).cost;
            let hit = self.cost_rules(governance, tenant, &limits, Some(&plan), predicted);
            if let Some(hit) = hit {
                return Ok(Some(hit));
            }
        }
        Ok(None)
    }

    /// What the plan of statement `fingerprint` of `tenant` is cached under in this session.
    fn plan_key(&self, tenant: &Arc<str>, fingerprint: Fingerprint) -> PlanKey {
        PlanKey {
            database: Arc::clone(&self.database_name),
            role: Arc::clone(&self.role_name),
            tenant: Arc::clone(tenant),
            search_path: match self.params.get("search_path") {
                None | Some("") => Arc::clone(&self.pool.names.default_search_path),
                Some(path) => Arc::from(path),
            },
            fingerprint: fingerprint.0,
            generic: false,
        }
    }

    /// A plan just read whose shape the statement never ran with, where it has a usual one,
    /// is a plan flip (an index dropped, new statistics, a table grown past the point where a
    /// full read looks cheaper).
    fn check_shape(&self, plan: Option<&PlanSummary>, fingerprint: Option<Fingerprint>) {
        let (Some(plan), Some(fp)) = (plan, fingerprint) else {
            return;
        };
        let database = &self.pool.key.db;
        let shape = plan.shape_fingerprint;
        let usual = {
            let calibration = self.rt.gatekeeper.calibration();
            let key = PlanFactorKey {
                database: Arc::clone(&self.database_name),
                fingerprint: fp.0,
                shape: Some(shape),
            };
            match calibration.factor(&key) {
                Some(_) => None,
                None => calibration.usual_shape(database, fp.0),
            }
        };
        if let Some(usual) = usual.filter(|u| *u != shape) {
            let reason = crate::cost::FlipReason::Shape { usual, new: shape };
            self.rt.gatekeeper.note_flip(database, fp.0, reason);
        }
    }

    /// The predicted time of a request: its plan's cost times the factor learned for that
    /// plan (or the database's median factor), or, without a plan, the usual time of its
    /// statement once it has run; and what its run will teach.
    fn estimate(&self, plan: Option<&PlanSummary>, fingerprint: Option<Fingerprint>) -> Estimate {
        let database = &self.pool.key.db;
        let mut calibration = self.rt.gatekeeper.calibration();
        if let (Some(plan), Some(fp)) = (plan, fingerprint) {
            let key = PlanFactorKey {
                database: Arc::clone(&self.database_name),
                fingerprint: fp.0,
                shape: Some(plan.shape_fingerprint),
            };
            let p = calibration.predict_plan(&key, plan.total_cost);
            return Estimate {
                cost: Cost {
                    seconds: p.seconds,
                    known: true,
                    learned: p.learned(),
                },
                learn: Some((key, Some(plan.total_cost))),
            };
        }
        let Some(fp) = fingerprint else {
            return Estimate::unknown(None);
        };
        let key = PlanFactorKey {
            database: Arc::clone(&self.database_name),
            fingerprint: fp.0,
            shape: None,
        };
        match calibration.predict_unplanned(database, fp.0) {
            Some(p) => Estimate {
                cost: Cost {
                    seconds: p.seconds,
                    known: true,
                    learned: true,
                },
                learn: Some((key, None)),
            },
            None => Estimate::unknown(Some((key, None))),
        }
    }

    /// The settings of this session's pool, held: `target.hosts.label()` is the PostgreSQL
    /// server it takes servers from, as the gate names it.
    fn pool_settings(&self) -> Arc<crate::pool::PoolSettings> {
        arc_swap::Guard::into_inner(self.pool.settings_now())
    }

    /// A request of this session for the gate: a statement of normal priority with no
    /// fingerprint or deadline tag, which the caller fills in.
    /// `settings`: the pool's, as the caller read them (with its upstream); `statement_timeout`:
    /// the client's own (see [`super::rules::Settled`]).
    fn request<'a>(
        &'a self,
        tenant: &'a str,
        settings: &'a crate::pool::PoolSettings,
        statement_timeout: Option<Duration>,
    ) -> Request<'a> {
        let limits = &settings.limits;
        Request {
            client_id: self.id,
            tenant,
            priority: crate::sql::Priority::Normal,
            kind: RequestKind::Statement,
            fingerprint: None,
            upstream: settings.target.hosts.label(),
            pool: &self.pool_label,
            pool_size: limits.pool_size,
            database_cap: limits.max_db_connections,
            database: &self.pool.key.db,
            sent_at: self.last_client_activity,
            statement_timeout,
            deadline: None,
            hint: self.gate.hint.as_deref(),
        }
    }

    /// Under a policy, a server is taken with a slot: messages that carry no request of
    /// their own (a Parse, a Describe, a Sync alone) wait for one for the tenant of the
    /// client's role, charged nothing. A wait that ends without one ends the session.
    pub(super) async fn slot_for_server(&mut self, io: &mut ClientIo) -> Result<(), SessionError> {
        let governance = self.governance.load().as_ref().clone();
        let Some(governance) = governance else {
            return Ok(());
        };
        let who = super::rules::who_of(&self.user, &self.params, &self.peer);
        let tenant = governance
            .policy
            .identify(&who, &crate::sql::Tags::default())
            .tenant
            .to_string();
        let settings = self.pool_settings();
        let statement_timeout = self.settled.of(&self.params).statement_timeout;
        let pass = {
            let request = self.request(&tenant, &settings, statement_timeout);
            self.rt
                .gatekeeper
                .lock()
                .server_pass(&request, Instant::now())
        };
        match self.wait_for_slot(io, pass, false).await? {
            SlotAnswer::Granted(_, guard) => {
                self.gate.slot = Some(guard);
                self.gate.tenant = Arc::from(tenant);
                Ok(())
            }
            SlotAnswer::Refused(_, r) => Err(SessionError::Fatal(ErrorResponse::fatal(
                r.sqlstate,
                r.message.clone(),
            ))),
        }
    }

    /// With no server and no slot: if the first `len` bytes of `rbuf` (all gated) are simple
    /// Queries the gate refused, each is answered here as PostgreSQL would outside a
    /// transaction (the ErrorResponse, then ReadyForQuery), and consumed; true if so.
    pub(super) fn answer_refusals_alone(&mut self, rbuf: &mut bytes::BytesMut, len: usize) -> bool {
        if self.gate.verdicts.is_empty() || self.skip_to_sync {
            return false;
        }
        let mut at = 0;
        let mut spans = Vec::new();
        while let Some(span) = frame_at(&rbuf[..len], at) {
            let n = spans.len();
            let refused = self.gate.verdicts.get(n).is_some_and(|v| v.hit.is_some());
            if span.tag != tag::QUERY || !refused {
                return false;
            }
            at = span.end;
            spans.push(span.body());
        }
        if spans.is_empty() || at != len {
            return false;
        }
        let hits: Vec<RuleHit> = self
            .gate
            .verdicts
            .drain(..spans.len())
            .filter_map(|v| v.hit)
            .map(|h| *h)
            .collect();
        for (hit, body) in hits.into_iter().zip(spans) {
            tracing::warn!(client = self.id, rule = %hit.rule, fingerprint = %hit.fingerprint, "statement refused");
            if hit.by_rule {
                self.log_rule_refusal(&hit, QueryView::new(&rbuf[body]).text);
            }
            self.to_client
                .extend_from_slice(&super::rules::error_message(&hit));
            wire::encode_ready_for_query(&mut self.to_client, TxStatus::Idle);
        }
        self.hooks.received(len);
        bytes::Buf::advance(rbuf, len);
        self.gate.consumed(len);
        true
    }

    /// Without a policy, while a kill may be in force: each request in the first `len`
    /// bytes of `rbuf` not looked at yet is refused if its tenant (the client's role) is
    /// killed. Returns how many bytes may go.
    pub(super) fn kill_chunk(&mut self, rbuf: &[u8], len: usize) -> usize {
        let now = Instant::now();
        self.gate.lapsed = true;
        self.fresh_marks();
        while let Some(span) = frame_at(&rbuf[..len], self.gate.gated) {
            let body = &rbuf[span.body()];
            let kind = match span.tag {
                tag::QUERY => {
                    // What a Query does to the client's statements, as the gate's own
                    // reading notes it.
                    let text = QueryView::new(body).text;
                    self.note_query(text);
                    Some(kind_of(text))
                }
                // A Bind is what its statement is: a prepared COMMIT or ROLLBACK still ends
                // the client's transaction.
                tag::BIND => Some(
                    BindView::new(body)
                        .ok()
                        .and_then(|b| self.statement_of(b.statement).0)
                        .map_or(RequestKind::Statement, |p| kind_of(&p.text)),
                ),
                tag::FUNCTION_CALL => Some(RequestKind::Statement),
                tag::PARSE => {
                    self.note_parse(&Bytes::copy_from_slice(body));
                    None
                }
                tag::CLOSE => {
                    self.note_close(body);
                    None
                }
                _ => None,
            };
            if let Some(kind) = kind {
                let hit = kind.killable().then(|| self.killed_role(now)).flatten();
                if span.tag == tag::BIND {
                    let made = hit.is_none().then(|| PortalWork {
                        tenant: Arc::from(self.user.as_str()),
                        fingerprint: None,
                        killable: kind.killable(),
                    });
                    self.gate.portals.bound(portal_of(body), made);
                }
                let hit = hit.as_ref().map(|h| Box::new(refusal_hit(h)));
                self.gate.verdicts.push_back(Gated {
                    hit,
                    work: None,
                    request: true,
                });
            }
            if span.tag == tag::EXECUTE {
                // (Only the policy's gate follows what the server skips.)
                self.gate_execute(body);
            }
            // The batch's marks are kept whichever gate reads it: a policy that comes with a
            // reload before these go out reads on after them (with none left from before a
            // Sync). Its Parses stand for their names across Syncs (not ended at a Sync): a
            // Bind's statement is the name's last Parse here, as no Bind waits for the
            // server's answers.
            self.gate.mark_batch(span.tag);
            // Kept in step with the messages, as the gate's own reading keeps it: a policy
            // that comes with a reload before these go out reads on after them.
            self.note_unnamed_use(span.tag, body);
            self.gate.gated = span.end;
        }
        self.gate.gated
    }

    /// Whose statement it is, for the decision log.
    fn subject<'a>(&'a self, tenant: &'a str, fingerprint: Option<Fingerprint>) -> Subject<'a> {
        Subject {
            tenant,
            database: &self.pool.key.db,
            client: self.id,
            fingerprint,
        }
    }

    /// A SQL rule's refusal of `text`, answered without the rules at the message (they count
    /// and log theirs): counted, logged and in the statement statistics.
    fn log_rule_refusal(&self, hit: &RuleHit, text: &[u8]) {
        let stats = super::stats_sink(
            (&self.rt, self.home),
            self.gate.stats_on,
            &self.role_name,
            &self.database_name,
        );
        let governance = self.rt.governance.load();
        let Some(governance) = governance.as_ref() else {
            return;
        };
        let analysis = governance
            .analyzer
            .analyze(text, &parse_context(&self.params));
        let who = super::rules::who_of(&self.user, &self.params, &self.peer);
        let tenant = governance.policy.identify(&who, &analysis.tags).tenant;
        let subject = self.subject(&tenant, analysis.fingerprint);
        super::rules::log_rule_refusal(&self.rt.gatekeeper, hit, subject, &self.user);
        if let Some(sink) = stats {
            sink.refused(&tenant, analysis.fingerprint, &hit.rule);
        }
    }

    /// The request of `pass` runs now: if it waited in the gate's queues at least the
    /// decision log's `wait_over` in all, that is one line.
    fn note_waited(&self, governance: &Governance, pass: &Pass) {
        let log = &self.rt.gatekeeper.decisions;
        let over = governance.policy.decisions().wait_over;
        if !log.is_on() || over.is_none_or(|o| pass.waited < o) {
            return;
        }
        let reason = match pass.waited_for_budget {
            true => "budget",
            false => "slot",
        };
        let record = crate::gate::Record::about(crate::gate::Event::Waited, reason, pass.subject())
            .upstream(&pass.upstream)
            .role(&self.user)
            .seconds("waited_s", pass.waited)
            .figure(
                "slow_lane",
                f64::from(u8::from(pass.lane == crate::gate::Lane::Slow)),
            );
        log.record(&record);
    }

    /// Counts a refusal by a cost rule (SHOW TENANTS' `refused_cost`) and logs it.
    fn note_cost_refusal(&self, tenant: &str, fingerprint: Option<Fingerprint>, hit: &RuleHit) {
        let who = self.subject(tenant, fingerprint);
        let now = Instant::now();
        self.rt.gatekeeper.lock().note_refusal(
            who,
            RefusalReason::Cost,
            &hit.rule,
            hit.sqlstate,
            now,
        );
        self.count_refusal(tenant, fingerprint, &hit.rule);
    }

    /// A refusal by the gate (counted and logged there), in the statement statistics and the
    /// traffic log (with the request's arrival and its predicted time, if it was priced).
    fn refuse(
        &self,
        r: &Refusal,
        tenant: &str,
        fingerprint: Option<Fingerprint>,
        (arrival, predicted): (Option<&Arrival>, Option<f64>),
    ) -> Step {
        let reason = r.reason.as_str();
        self.count_refusal(tenant, fingerprint, reason);
        if let Some(arrival) = arrival {
            self.log_unrun(arrival, tenant, reason, predicted);
        }
        refused(r)
    }

    /// The traffic log's line of a request that did not run: `outcome` is the refusal's
    /// reason, or that its client left while it waited.
    fn log_unrun(&self, arrival: &Arrival, tenant: &str, outcome: &str, predicted: Option<f64>) {
        let sink = super::stats_sink(
            (&self.rt, self.home),
            self.gate.stats_on,
            &self.role_name,
            &self.database_name,
        );
        if let Some(sink) = sink {
            sink.log_refusal(arrival, tenant, outcome, predicted);
        }
    }

    /// A refusal of pgward's in the statement statistics.
    pub(super) fn count_refusal(
        &self,
        tenant: &str,
        fingerprint: Option<Fingerprint>,
        reason: &str,
    ) {
        if let Some(sink) = super::stats_sink(
            (&self.rt, self.home),
            self.gate.stats_on,
            &self.role_name,
            &self.database_name,
        ) {
            sink.refused(tenant, fingerprint, reason);
        }
    }

    /// The refusal of a request of the client's role, if a kill of it is in force (and then
    /// counted).
    fn killed_role(&self, now: Instant) -> Option<Refusal> {
        self.killed_by(&self.user, None, now, false)
    }

    /// The refusal of `tenant`'s statement `fingerprint` by a kill in force, counted by the
    /// gate; `admitted`: the statement was admitted before (a soft kill lets it go).
    fn killed_by(
        &self,
        tenant: &str,
        fingerprint: Option<Fingerprint>,
        now: Instant,
        admitted: bool,
    ) -> Option<Refusal> {
        let mut gate = self.rt.gatekeeper.lock();
        let target = match admitted {
            true => gate.stops_admitted(tenant, fingerprint, now),
            false => gate.is_killed(tenant, fingerprint, now),
        };
        let refusal = Refusal::killed(&target?.describe());
        let who = self.subject(tenant, fingerprint);
        gate.note_refusal(who, RefusalReason::Killed, "killed", refusal.sqlstate, now);
        Some(refusal)
    }

    /// A kill issued while the request waited after its admission (for a slot, a paused
    /// database, a server): refused now, before it goes out, as at admission (unless the
    /// kill is soft, which stops only what is admitted after it).
    fn killed_while_waiting(
        &self,
        tenant: &str,
        fingerprint: Option<Fingerprint>,
        kind: RequestKind,
    ) -> Option<Refusal> {
        if !kind.killable() || !self.rt.gatekeeper.may_have_kills() {
            return None;
        }
        self.killed_by(tenant, fingerprint, Instant::now(), true)
    }

    /// In transaction and statement pooling, a client of a paused database (or a suspended
    /// pooler) waits for the RESUME before it takes a slot: the slots are the upstream's,
    /// which other databases share, and a client that waits holds none. Whether it waited.
    async fn wait_while_held(&mut self, io: &mut ClientIo) -> Result<bool, SessionError> {
        let session = self.mode == crate::config::PoolMode::Session;
        if session || !self.hooks.held(&self.pool) {
            return Ok(false);
        }
        self.maybe_release(io).await?;
        let (pool, hooks) = (Arc::clone(&self.pool), self.hooks.clone());
        let waited = self.queued_while(io, hooks.until_open(&pool)).await;
        self.hooks
            .gate_wait_ends(self.link.as_ref().map(|l| &*l.server));
        waited.map(|()| true)
    }

    /// Whether the client is inside a transaction block on its server (the last
    /// ReadyForQuery said so).
    fn in_transaction(&self) -> bool {
        self.link
            .as_ref()
            .is_some_and(|l| l.server.tx != TxStatus::Idle)
    }

    /// The rules' verdict on a request's text, read before the gate so that a refused
    /// statement is neither priced nor charged: a Query, or the Bind of a statement whose
    /// Parse has not gone out yet (the rules judge that Parse as it goes). A Bind of a
    /// statement the server already has was judged when it was parsed.
    fn rules_verdict(
        &mut self,
        governance: &Arc<Governance>,
        work: &Work,
        analysis: Option<&Arc<crate::sql::Analysis>>,
    ) -> Option<Verdict> {
        let judged = match work {
            Work::Query(_) => true,
            Work::Bind { fresh, .. } => *fresh,
            Work::Function => false,
        };
        let analysis = analysis.filter(|_| judged)?;
        let at = self.params.changes();
        let derived = self.readings.get_mut(governance, at, analysis);
        if derived.as_ref().is_some_and(|d| d.allowed == Some(true)) {
            return Some(Verdict::Allow);
        }
        let who = super::rules::who_of(&self.user, &self.params, &self.peer);
        let verdict = governance.policy.judge(analysis, &who);
        if let Some(d) = self.readings.get_mut(governance, at, analysis) {
            d.allowed = Some(matches!(verdict, Verdict::Allow));
        }
        Some(verdict)
    }

    /// What the gate derives from `analysis`, the reading of `work`'s text: from this
    /// session's readings when it was derived under the same policy and parameters.
    fn derive(
        &mut self,
        governance: &Arc<Governance>,
        work: &Work,
        analysis: &Arc<crate::sql::Analysis>,
    ) -> Arc<Facts> {
        let at = self.params.changes();
        if let Some(d) = self.readings.get_mut(governance, at, analysis) {
            return Arc::clone(&d.facts);
        }
        let who = super::rules::who_of(&self.user, &self.params, &self.peer);
        let identity = governance.policy.identify(&who, &analysis.tags);
        let tenant = self.tenant_name(&identity.tenant);
        let words = work.words().unwrap_or_default();
        let facts = Facts {
            kind: RequestKind::of_sql(&words),
            plan_key: analysis.fingerprint.map(|f| self.plan_key(&tenant, f)),
            tenant,
            priority: identity.priority,
            deadline: identity.deadline,
            several: work
                .sql()
                .is_some_and(|t| several_statements(t, parser_options(&self.params))),
            changes_plans: changes_plans(&words),
            declares_cursor: declares_cursor(&words),
            cost_limits: governance.policy.cost_limits(&identity.tenant),
        };
        if !worth_remembering(work.sql()) {
            return Arc::new(facts);
        }
        let derived = Derived::new(Arc::clone(analysis), facts);
        Arc::clone(&self.readings.put(governance, at, derived).facts)
    }

    /// `name`, the tenant of a request, as an allocation the session holds already where it
    /// can (the role's name, shared by the pool's sessions, or the last tenant's): keys that
    /// name it then compare by address.
    fn tenant_name(&self, name: &str) -> Arc<str> {
        [&self.role_name, &self.gate.tenant]
            .into_iter()
            .find(|known| ***known == *name)
            .map_or_else(|| Arc::from(name), Arc::clone)
    }

    /// What the gate knows of a request with no reading (a FunctionCall, the Bind of a
    /// statement pgward never saw): its tenant is the role's.
    fn underived(&self, governance: &Governance) -> Arc<Facts> {
        let who = super::rules::who_of(&self.user, &self.params, &self.peer);
        let no_tags = crate::sql::Tags::default();
        let identity = governance.policy.identify(&who, &no_tags);
        Arc::new(Facts {
            kind: RequestKind::Statement,
            tenant: self.tenant_name(&identity.tenant),
            priority: identity.priority,
            deadline: identity.deadline,
            plan_key: None,
            several: false,
            changes_plans: false,
            declares_cursor: false,
            cost_limits: governance.policy.cost_limits(&identity.tenant),
        })
    }

    /// Prices the requests that ran unpriced inside a batch, now that the server owes the
    /// client nothing, and charges their tenants (into debt if need be). Their plans are
    /// cached, so their next runs are priced before they start. Returns whether the client
    /// asked for a cancel meanwhile (landed by now, on pgward's statements or on the idle
    /// server).
    pub(super) async fn price_deferred(&mut self) -> Result<bool, SessionError> {
        let deferred = std::mem::take(&mut self.gate.deferred);
        let governance = self.rt.governance.load_full();
        let Some(governance) = governance.as_ref() else {
            return Ok(false);
        };
        let requested = self.handle.cancels_requested();
        for d in deferred {
            if self.handle.cancels_requested() != requested {
                // The client asked for a cancel: the rest (plans for next runs only) is not
                // read, so that it waits for nothing more.
                break;
            }
            let limits = governance.policy.cost_limits(&d.tenant);
            let sizes = limits.max_scan_rows.is_some();
            // Its price cannot be read any more (a failed transaction, an object it read is
            // gone): its next run is priced before it starts, or is unknown.
            let Priced::Plan(Some(plan)) = self.explain(&d.sql, &d.work, &d.key, sizes).await?
            else {
                continue;
            };
            let predicted = self
                .estimate(Some(&plan), Some(Fingerprint(d.key.fingerprint)))
                .cost;
            let hit = self.cost_rules(governance, &d.tenant, &limits, Some(&plan), predicted);
            if let Some(hit) = hit {
                tracing::warn!(client = self.id, tenant = %d.tenant, rule = %hit.rule, "a statement priced after it ran in a batch broke a cost rule");
            }
        }
        if self.handle.cancels_requested() == requested {
            return Ok(false);
        }
        // Not on what the client sends next.
        self.handle.wait_cancels().await;
        Ok(true)
    }

    /// Awaits `wait` (for a RESUME) while reading the client (see [`super::reading_while`]): a
    /// client still waiting after query_wait_notify is told it is queued, once, as one that
    /// waits for a server or a slot is.
    async fn queued_while<F: std::future::Future>(
        &mut self,
        io: &mut ClientIo,
        wait: F,
    ) -> Result<F::Output, SessionError> {
        tokio::pin!(wait);
        let Some(after) = self.config.load().settings.query_wait_notify else {
            return reading_while(io, wait).await;
        };
        let first = tokio::time::timeout(after, wait.as_mut());
        tokio::pin!(first);
        if let Ok(out) = reading_while(io, first).await? {
            return Ok(out);
        }
        super::tell_queued(io, &mut self.to_client).await?;
        reading_while(io, wait).await
    }

    /// Waits in the gate's queue, reading what the client sends meanwhile (a client that
    /// leaves ends the wait and takes its ticket out). `full`: the gate had no slot for
    /// `pass` a moment ago (the queueing still looks once more, under its lock).
    async fn wait_for_slot(
        &mut self,
        io: &mut ClientIo,
        pass: Pass,
        full: bool,
    ) -> Result<SlotAnswer, SessionError> {
        let keeper = self.rt.gatekeeper.clone();
        // A free slot is taken at once: no wait, nothing to read meanwhile.
        if let Some(guard) = (!full).then(|| keeper.try_acquire(&pass)).flatten() {
            self.hooks.gate_slot_at_once(Instant::now());
            return Ok(SlotAnswer::Granted(pass, guard));
        }
        if self.mode != crate::config::PoolMode::Session {
            // A client that waits holds no server: one kept for held messages goes back.
            self.maybe_release(io).await?;
        }
        let rt = self.rt.clone();
        let upstream = pass.upstream.clone();
        let mailbox = Arc::clone(self.gate.mailbox.get_or_insert_default());
        let evict = move |over: &[(String, usize)]| evict_runaways(&rt, &upstream, over);
        // query_wait_notify: the gate's queue keeps the time (no timer of the wait's own).
        let notify = self.config.load().settings.query_wait_notify;
        self.hooks.gate_wait_starts();
        let answer = match keeper.acquire(pass, &mailbox, evict, notify) {
            Acquire::Answered(answer) => Ok(answer),
            Acquire::Queued(wait) => self.slot_wait(io, wait).await,
        };
        self.hooks
            .gate_wait_ends(self.link.as_ref().map(|l| &*l.server));
        answer
    }

    /// Waits in the gate's queue, reading the client meanwhile (see [`poll_reading`]); a
    /// client still waiting after query_wait_notify is told it is queued, once.
    async fn slot_wait(
        &mut self,
        io: &mut ClientIo,
        mut wait: SlotWait<'_>,
    ) -> Result<SlotAnswer, SessionError> {
        loop {
            let news = std::future::poll_fn(|cx| poll_reading(io, cx, |cx| wait.poll_next(cx)));
            match news.await? {
                WaitNews::Answer(answer) => return Ok(answer),
                WaitNews::Notice => super::tell_queued(io, &mut self.to_client).await?,
            }
        }
    }

    /// The plan of the request, from an EXPLAIN on the checked-out server (which owes the
    /// client nothing). Inside a transaction block the EXPLAIN runs under a savepoint, so its
    /// failure leaves the transaction as it was. A failed EXPLAIN prices nothing: the
    /// statement then fails by itself with PostgreSQL's own error, or runs for min_charge.
    async fn explain(
        &mut self,
        sql: &str,
        work: &Work,
        key: &PlanKey,
        sizes: bool,
    ) -> Result<Priced, SessionError> {
        if self.handle.cancels_in_flight() {
            // A cancel of the client's earlier statement must not land on the EXPLAIN.
            self.handle.wait_cancels().await;
        }
        let requested = self.handle.cancels_requested();
        let tracked = self.tracked.clone();
        let own = Arc::clone(&self.rt.gatekeeper.own);
        let Some(link) = self.link.as_mut() else {
            return Ok(Priced::Plan(None));
        };
        // Inside the client's open batch (what it sent so far answered, no Sync yet): no
        // savepoint can be taken there, and no Sync may be sent.
        let open_batch = link.expected.batch_open();
        let in_block = match link.server.tx {
            _ if open_batch => false,
            TxStatus::Failed => return Ok(Priced::Plan(None)),
            TxStatus::InTransaction => true,
            TxStatus::Idle => false,
        };
        let server = &mut link.server;
        let (types, values): (&[u8], &[u8]) = match work {
            Work::Bind {
                parsed: Some(p),
                tail,
                ..
            } => (&p.types, tail),
            _ => (&[0, 0], &[0, 0, 0, 0]),
        };
        // Inside a transaction block, under a savepoint: a failed EXPLAIN must not fail
        // the client's transaction.
        let mut batch = Vec::with_capacity(2);
        if in_block {
            batch.push(OwnStatement::plain(&own.savepoint.0, &own.savepoint.1));
        }
        batch.push(OwnStatement {
            name: &own.explain,
            sql,
            types,
            values,
        });
        if open_batch && !self.to_server.is_empty() {
            // Only messages that owe nothing wait there (a Flush): they go first.
            let out = std::mem::take(&mut self.to_server);
            server.send(&out).await.map_err(|e| lost(server, e))?;
        }
        let started = Instant::now();
        let answer = server.own_statements(&batch, 1, open_batch, &tracked).await;
        let took = started.elapsed();
        let mut cancelled = false;
        let row = match answer {
            Ok(rows) => rows.into_iter().next(),
            Err(ServerError::Refused(fields)) if open_batch => {
                return Ok(Priced::FailedInBatch(fields));
            }
            Err(ServerError::Refused(fields)) => {
                // The client's cancel, sent while pgward was pricing its statement, stopped
                // the SAVEPOINT or the EXPLAIN (or their Close): it is the statement's answer.
                cancelled = fields.code() == Some(sqlstate::QUERY_CANCELED);
                None
            }
            Err(e) => return Err(lost(server, e)),
        };
        let text = row.and_then(|r| r.into_iter().next().flatten());
        let plan = text.and_then(|t| PlanSummary::from_json(&t).ok());
        let mut failed = plan.is_none();
        if let (Some(plan), true) = (&plan, sizes) {
            match read_sizes(server, plan, &own.sizes, open_batch, &tracked).await? {
                Sizes::Read(sizes) => self.rt.gatekeeper.learn_sizes(&key.database, sizes),
                Sizes::Failed { cancelled: c } => {
                    failed = true;
                    // The cancel landed on the size query: still the statement's answer.
                    cancelled |= c;
                }
                Sizes::FailedInBatch(fields) => return Ok(Priced::FailedInBatch(fields)),
            }
        }
        if self.handle.cancels_requested() != requested {
            // The client asked to cancel its statement while pgward priced it, and the
            // cancel missed pgward's statements (or has not landed yet): it is the
            // statement's answer all the same. It lands first, on an idle server (where
            // PostgreSQL drops it), not on the RELEASE below nor on the statement, which
            // would wait for it anyway.
            cancelled = true;
            self.handle.wait_cancels().await;
        }
        if in_block {
            // Whatever failed since the savepoint, the transaction is put back as it was.
            let rollback = OwnStatement::plain(&own.rollback.0, &own.rollback.1);
            let release = OwnStatement::plain(&own.release.0, &own.release.1);
            let undo = match failed {
                true => vec![rollback, release],
                false => vec![release],
            };
            match server.own_batch(&undo, 0, &tracked).await {
                Ok(_) => {}
                Err(ServerError::Refused(fields))
                    if cancelled || fields.code() == Some(sqlstate::QUERY_CANCELED) =>
                {
                    // The client's cancel landed on pgward's own statements: on the RELEASE
                    // or ROLLBACK TO (the savepoint may still be there, aborted), or earlier
                    // on the SAVEPOINT (there is none to go back to). Put the transaction
                    // back if the savepoint is there; if it is gone the client's transaction
                    // has failed, as PostgreSQL leaves it after a cancel. Either way the
                    // client's statement is answered with the cancel (57014).
                    cancelled = true;
                    let again = server.own_batch(&[rollback, release], 0, &tracked).await;
                    match again {
                        Ok(_) | Err(ServerError::Refused(_)) => {}
                        Err(e) => return Err(lost(server, e)),
                    }
                    if server.tx == TxStatus::Idle {
                        // Neither can end the client's transaction block.
                        let e = ServerError::Protocol("transaction block ended while pricing");
                        return Err(lost(server, e));
                    }
                }
                Err(e) => return Err(lost(server, e)),
            }
        }
        let keeper = &self.rt.gatekeeper;
        let Some(plan) = plan else {
            keeper.plans().record_failure(took);
            return Ok(match cancelled {
                true => Priced::Cancelled,
                false => Priced::Plan(None),
            });
        };
        let plan = Arc::new(plan);
        keeper.plans().insert_for(
            key.clone(),
            (*plan).clone(),
            work.constants(),
            took,
            Instant::now(),
        );
        if cancelled {
            // The plan was read, but the cancel landed on what came after it.
            return Ok(Priced::Cancelled);
        }
        Ok(Priced::Plan(Some(plan)))
    }

    /// Where a Bind inside an open batch stands when cost rules must judge it before it
    /// runs: it waits until everything before it went out and was answered (a Flush asks the
    /// server for the answers), then is explained inside the batch.
    fn in_batch_turn(&self, plannable: bool) -> InBatch {
        if !plannable {
            // What an EXPLAIN of it would read is not the statement itself (EXECUTE, a
            // whole table): a failed EXPLAIN would not tell that the statement fails.
            return InBatch::Unplannable;
        }
        // What is still to be written to the server then owes nothing (a Flush): the
        // EXPLAIN sends it first.
        let answered = self.link.as_ref().is_some_and(|l| {
            l.expected.is_empty() && l.expected.batch_open() && l.server.rbuf.is_empty()
        });
        match answered && self.gate.gated == 0 && self.gate.verdicts.is_empty() {
            true => InBatch::Explain,
            false => InBatch::Wait,
        }
    }

    /// The Flush a request inside an open batch waits for, if it is wanted: queued for the
    /// server (after what went before the request).
    pub(super) fn flush_for_judging(&mut self) {
        if !std::mem::take(&mut self.gate.flush_wanted) || self.link.is_none() {
            return;
        }
        wire::encode_flush(&mut self.to_server);
        self.gate.flush_sent = true;
    }

    /// The EXPLAIN of a request inside the client's open batch failed: that is the request's
    /// own failure (PostgreSQL plans a statement when it is bound), answered with the error,
    /// and the server now skips the client's messages up to its Sync.
    fn fail_in_batch(&mut self, error: &crate::wire::ErrorFields) {
        let Some(link) = self.link.as_mut() else {
            return;
        };
        use crate::wire::backend::field;
        match self.gate.timed_out_for(link.busy_since) {
            // pgward's statement timeout cancelled it: say whose timeout it was.
            Some(t) if error.code() == Some(sqlstate::QUERY_CANCELED) => {
                let err = statement_timeout_error(&self.gate.tenant, t.limit);
                wire::encode_error(&mut self.to_client, &err);
            }
            _ => {
                // Positions point into the EXPLAIN's text, not the client's.
                let positions = [
                    field::POSITION,
                    field::INTERNAL_POSITION,
                    field::INTERNAL_QUERY,
                ];
                wire::backend::encode_error_fields(&mut self.to_client, error, &positions);
            }
        }
        link.expected.own_error_in_batch();
        self.gate.skipping = true;
    }

    /// The refusal of a statement that cannot be priced before it runs (`why`: detail and
    /// hint), or none where the tenant's cost rules only warn (logged and counted, and the
    /// statement runs).
    fn unpriceable(
        &self,
        governance: &Governance,
        tenant: &str,
        why: (&str, &str),
    ) -> Option<RuleHit> {
        if !governance.policy.cost_warns(tenant) {
            return Some(unpriceable_hit(why));
        }
        tracing::info!(client = self.id, tenant, why = why.0, "cost rule in warn mode: a statement that cannot be priced before it runs would be refused");
        let mut gate = self.rt.gatekeeper.lock();
        gate.note_warned(tenant, Instant::now());
        None
    }

    /// The verdict of the tenant's cost rules on `plan`.
    fn cost_rules(
        &self,
        governance: &Governance,
        tenant: &str,
        limits: &CostLimits,
        plan: Option<&PlanSummary>,
        predicted: Cost,
    ) -> Option<RuleHit> {
        let violation = self.cost_violation(limits, plan?, predicted)?;
        self.cost_verdict(governance, tenant, violation)
    }

    /// The first of `limits` (the tenant's cost limits) `plan` is over, with its predicted
    /// run time, as [`cost_rules`](Self::cost_rules) judges.
    fn cost_violation(
        &self,
        limits: &CostLimits,
        plan: &PlanSummary,
        predicted: Cost,
    ) -> Option<crate::cost::CostViolation> {
        // max_time judges a prediction learned from the statement's own runs, never a guess.
        let seconds = predicted.learned.then_some(predicted.seconds);
        limits.check(plan, seconds, |r| {
            self.rt.gatekeeper.size_of(&self.pool.key.db, r)
        })
    }

    /// What the tenant's cost rules do about `violation`: refuse it, or, in warn mode, log
    /// and count it and let it run.
    fn cost_verdict(
        &self,
        governance: &Governance,
        tenant: &str,
        violation: crate::cost::CostViolation,
    ) -> Option<RuleHit> {
        let tables: Vec<String> = violation.tables.iter().map(|t| t.to_string()).collect();
        if governance.policy.cost_warns(tenant) {
            // Warn mode: logged and counted, and the statement runs.
            tracing::info!(
                client = self.id,
                tenant,
                rule = violation.rule.as_str(),
                tables = %tables.join(", "),
                "cost rule in warn mode: the statement would be refused"
            );
            let now = Instant::now();
            let mut gate = self.rt.gatekeeper.lock();
            gate.note_warned(tenant, now);
            return None;
        }
        tracing::warn!(
            client = self.id,
            tenant,
            rule = violation.rule.as_str(),
            tables = %tables.join(", "),
            "statement refused by a cost rule"
        );
        Some(RuleHit::refusal(
            violation.rule.as_str(),
            violation.sqlstate(),
            violation.message(),
            Some(violation.detail()),
            None,
        ))
    }
}

/// The ErrorResponse for a request pgward cancelled at its tenant's statement timeout, in the
/// place of PostgreSQL's "canceling statement due to user request".
pub(super) fn statement_timeout_error(tenant: &str, limit: Duration) -> ErrorResponse {
    ErrorResponse::error(
        sqlstate::QUERY_CANCELED,
        "canceling statement due to pgward statement timeout".to_string(),
    )
    .with_detail(format!(
        "tenant {tenant} may run a statement for {} ms",
        limit.as_millis()
    ))
}

/// Runaway eviction: of the pools pooled onto `upstream`, idle servers that last ran the
/// work of a tenant holding more than its share while others wait are closed, as many as
/// the gate says (its excess, a few a second), so the servers it leaves go to the others
/// (its new work already waits behind theirs in the gate). A server that has not run
/// governed work yet belongs to the tenant of its pool's role.
fn evict_runaways(rt: &Runtime, upstream: &str, over: &[(String, usize)]) -> Vec<usize> {
    let governance = rt.governance.load();
    let Some(governance) = governance.as_ref() else {
        return vec![0; over.len()];
    };
    let no_tags = crate::sql::Tags::default();
    let pools: Vec<_> = rt
        .pools
        .all()
        .into_iter()
        .filter(|p| p.settings_now().target.hosts.label() == upstream)
        .collect();
    let mut done = Vec::with_capacity(over.len());
    for (tenant, wanted) in over {
        let mut left = *wanted;
        for pool in &pools {
            if left == 0 {
                break;
            }
            let who = Who {
                role: &pool.key.user,
                application_name: "",
                client_addr: None,
            };
            let of_role = governance.policy.identify(&who, &no_tags).tenant == tenant.as_str();
            let closed = pool.close_idle_of(
                left,
                |last| last.map_or(of_role, |t| t == tenant.as_str()),
                "evicted",
            );
            if closed > 0 {
                tracing::info!(tenant = %tenant, closed, pool = %pool.key.user, "tenant over its share while others wait: idle servers it used are closed");
            }
            left -= closed;
        }
        let closed = wanted - left;
        if closed > 0 {
            let record = crate::gate::Record::new(crate::gate::Event::Evicted, "over_share")
                .tenant(tenant)
                .upstream(upstream)
                .figure("servers_closed", closed as f64);
            rt.gatekeeper.decisions.record(&record);
        }
        done.push(closed);
    }
    done
}

/// The answer to a request whose pricing the client's own cancel stopped.
fn cancelled() -> RuleHit {
    RuleHit::refusal(
        "cancel",
        sqlstate::QUERY_CANCELED,
        "canceling statement due to user request".to_string(),
        None,
        None,
    )
}

/// A refusal by the gate as the request's verdict.
fn refused(r: &Refusal) -> Step {
    Step::refuse(refusal_hit(r))
}

/// A refusal by the gate as a message's refusal.
fn refusal_hit(r: &Refusal) -> RuleHit {
    RuleHit::refusal(
        r.reason.as_str(),
        r.sqlstate,
        r.message.clone(),
        r.detail.clone(),
        r.hint.clone(),
    )
}

/// The row counts of the tables `plan` reads in full (`pg_class.reltuples`; -1 when never
/// analyzed, then left out).
async fn read_sizes(
    server: &mut crate::pool::ServerGuard,
    plan: &PlanSummary,
    name: &str,
    open_batch: bool,
    tracked: &crate::params::Tracked,
) -> Result<Sizes, SessionError> {
    let relations: Vec<Relation> = plan.full_scans.iter().map(|s| s.relation.clone()).collect();
    let Some(sql) = relation_sizes_sql(&relations) else {
        return Ok(Sizes::Read(Vec::new()));
    };
    let own = [OwnStatement::plain(name, &sql)];
    let answer = server
        .own_statements(&own, relations.len(), open_batch, tracked)
        .await;
    let rows = match answer {
        Ok(rows) => rows,
        Err(ServerError::Refused(fields)) if open_batch => return Ok(Sizes::FailedInBatch(fields)),
        Err(ServerError::Refused(fields)) => {
            let cancelled = fields.code() == Some(sqlstate::QUERY_CANCELED);
            return Ok(Sizes::Failed { cancelled });
        }
        Err(e) => return Err(lost(server, e)),
    };
    Ok(Sizes::Read(
        rows.into_iter()
            .filter_map(|row| match row.as_slice() {
                [Some(schema), Some(name), Some(n)] => Some((
                    Relation {
                        schema: schema.clone(),
                        name: name.clone(),
                    },
                    n.parse::<f64>().ok().filter(|n| *n >= 0.0)?,
                )),
                _ => None,
            })
            .collect(),
    ))
}

/// What [`read_sizes`] found.
enum Sizes {
    Read(Vec<(Relation, f64)>),
    /// The query failed (its transaction is put back as it was); `cancelled`: by a cancel
    /// (57014), the client's, which is then its statement's answer.
    Failed {
        cancelled: bool,
    },
    /// It failed inside the client's open batch: see [`Priced::FailedInBatch`].
    FailedInBatch(crate::wire::ErrorFields),
}

/// A failure while pricing: the connection cannot be trusted to be in step.
fn lost(server: &mut crate::pool::ServerGuard, e: ServerError) -> SessionError {
    server.poison();
    SessionError::Fatal(ErrorResponse::fatal(
        sqlstate::CONNECTION_FAILURE,
        format!("server connection failed while pricing a statement: {e}"),
    ))
}

/// Whether `text` holds `/*` or `--` (where a comment may begin).
fn may_comment(text: &[u8]) -> bool {
    memchr::memchr2_iter(b'/', b'-', text)
        .any(|i| text.get(i + 1) == Some(&if text[i] == b'/' { b'*' } else { b'-' }))
}

/// Hashes the tokens of `text` but its comments (the whole text if the scanner refuses it).
fn hash_tokens(text: &str, h: &mut impl std::hash::Hasher) {
    use pg_query::protobuf::Token;
    use std::hash::Hash;
    let Ok(scanned) = pg_query::scan(text) else {
        return text.hash(h);
    };
    let comments = [Token::SqlComment as i32, Token::CComment as i32];
    for t in scanned
        .tokens
        .iter()
        .filter(|t| !comments.contains(&t.token))
    {
        let span = usize::try_from(t.start)
            .ok()
            .zip(usize::try_from(t.end).ok());
        span.and_then(|(a, b)| text.get(a..b)).hash(h);
    }
}

/// Whether `text` holds more than one statement (a `;` before its end; the parser then says
/// how many, so `BEGIN ATOMIC ... END` is one).
fn several_statements(text: &str, options: pg_query::ParserOptions) -> bool {
    text.trim_end().trim_end_matches(';').contains(';')
        && statements_of(text, options).is_none_or(|parts| parts.len() > 1)
}

/// How PostgreSQL's parser reads this session's texts: with `standard_conforming_strings`
/// off, a backslash in a plain string escapes.
fn parser_options(params: &crate::params::ParamSet) -> pg_query::ParserOptions {
    let mut options = pg_query::ParserOptions::DISABLE_ESCAPE_STRING_WARNING;
    if params.get("standard_conforming_strings") == Some("off") {
        options |= pg_query::ParserOptions::DISABLE_STANDARD_CONFORMING_STRINGS;
    }
    options
}

/// The statements of `text` as PostgreSQL's parser splits it (by the statements' locations in
/// its parse tree), or `None` when it does not parse.
fn statements_of(text: &str, options: pg_query::ParserOptions) -> Option<Vec<String>> {
    let parsed = pg_query::parse(text, options).ok()?;
    parsed
        .protobuf
        .stmts
        .iter()
        .map(|st| {
            let start = usize::try_from(st.stmt_location).ok()?;
            let end = match st.stmt_len {
                0 => text.len(),
                n => start.checked_add(usize::try_from(n).ok()?)?,
            };
            text.get(start..end).map(|s| s.trim().to_string())
        })
        .collect()
}

/// The refusal of a text whose statements cannot all be priced before it runs.
/// Why a statement could not be priced before it ran: after a statement that may change how
/// it is planned, in a text of several.
const AFTER_PLAN_CHANGE: (&str, &str) = (
    "it follows a statement that may change how it is planned",
    "send the statements one at a time",
);

/// ... a text that is not UTF-8 (another client_encoding's bytes).
const NOT_UTF8: (&str, &str) = (
    "its text is not UTF-8, which pgward can neither parse nor explain as the server reads it",
    "send it with client_encoding UTF8",
);

/// ... a text with a backslash where standard_conforming_strings may be off.
const UNREADABLE: (&str, &str) = (
    "a string of it holds a backslash and standard_conforming_strings is not known to be on (it may be off, or a statement still in flight may change it), so where its statements end cannot be read as the server reads them",
    "write the string with E'' or $$ quoting, or send it once nothing is in flight with standard_conforming_strings on",
);

/// Whether the server reads a text as with `standard_conforming_strings` on.
fn conforming(context: &crate::sql::ParseContext) -> bool {
    context.standard_conforming_strings == crate::sql::Setting::Known(true)
}

/// ... inside an extended batch still open, where an EXPLAIN cannot read it as itself.
const IN_OPEN_BATCH: (&str, &str) = (
    "it is sent inside an extended-protocol batch still open on the server (no Sync yet) \
     and cannot be explained there as itself",
    "send it after a Sync",
);

/// A Bind of a statement no Parse the gate saw answered created.
const UNKNOWN_STATEMENT: (&str, &str) = (
    "the statement it binds was not created by a Parse message pgward saw answered (a PREPARE in SQL, or a name freed since)",
    "prepare it with a Parse message, or run it with EXECUTE",
);

fn unpriceable_hit((detail, hint): (&str, &str)) -> RuleHit {
    RuleHit::refusal(
        "max_cost",
        crate::cost::SQLSTATE_COST,
        "pgward: a statement of this text cannot be priced before it runs".to_string(),
        Some(detail.to_string()),
        Some(hint.to_string()),
    )
}

/// Whether `text` declares a cursor (its first word is DECLARE).
fn declares_cursor(text: &str) -> bool {
    crate::gate::first_keyword(text).eq_ignore_ascii_case("declare")
}

/// Whether running `text` may change the plans of other statements: DDL, ANALYZE, VACUUM, or a
/// DO block or procedure that may run them (each statement of a text with several; one that
/// cannot be split counts).
fn changes_plans(text: &str) -> bool {
    const WORDS: [&str; 11] = [
        "create", "alter", "drop", "analyze", "analyse", "vacuum", "truncate", "reindex",
        "cluster", "do", "call",
    ];
    let changes = |t: &str| {
        let word = crate::gate::first_keyword(t);
        WORDS.iter().any(|w| word.eq_ignore_ascii_case(w))
    };
    if !text.trim_end().trim_end_matches(';').contains(';') {
        return changes(text);
    }
    match pg_query::split_with_scanner(text) {
        Ok(parts) => parts.into_iter().any(changes),
        Err(_) => true,
    }
}

/// A statement text for its keywords: itself when it is UTF-8, else with its other bytes
/// read as U+FFFD.
fn words_of(text: &[u8]) -> Cow<'_, str> {
    match std::str::from_utf8(text) {
        Ok(text) => Cow::Borrowed(text),
        Err(_) => String::from_utf8_lossy(text),
    }
}

/// The kind of a statement text, by its keywords (a `SAVEPOINT` named in another
/// client_encoding is still one).
fn kind_of(text: &[u8]) -> RequestKind {
    RequestKind::of_sql(&words_of(text))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::traffic::{Entry, TrafficLog};

    /// What the gate keeps of the read buffer is the bytes it was given, whatever is kept
    /// after it; short copies share a block, a long one has its own allocation, which nothing
    /// else holds (a Bind of a large value does not leave it allocated after the request).
    #[test]
    fn kept_copies_hold_their_bytes_and_share_blocks() {
        let mut gate = GateState::default();
        let texts: Vec<Vec<u8>> = (0..100u8)
            .map(|i| format!("SELECT {i} FROM t WHERE a = {}", u32::from(i) * 7).into_bytes())
            .collect();
        let kept: Vec<Bytes> = texts.iter().map(|t| gate.keep(t)).collect();
        let long = vec![b'x'; 3 * KEPT_BLOCK];
        let kept_long = gate.keep(&long);
        let after = gate.keep(b"SELECT 1");
        for (k, t) in kept.iter().zip(&texts) {
            assert_eq!(&k[..], &t[..]);
        }
        assert_eq!(&kept_long[..], &long[..]);
        assert!(kept_long.is_unique());
        assert!(gate.keep(&long[..KEPT_MAX + 1]).is_unique());
        assert!(!gate.keep(&long[..KEPT_MAX]).is_unique());
        assert_eq!(&after[..], b"SELECT 1");
        // The first two are neighbours in one block.
        assert_eq!(
            kept[0].as_ptr().wrapping_add(kept[0].len()),
            kept[1].as_ptr()
        );
        assert_eq!(gate.keep(b""), Bytes::new());
    }

    /// A statement of `tenant`.
    fn request_of(tenant: &str) -> Request<'_> {
        Request {
            client_id: 1,
            tenant,
            priority: crate::sql::Priority::Normal,
            kind: RequestKind::Statement,
            fingerprint: Some(Fingerprint(7)),
            upstream: "pg:5432",
            pool: "app/app",
            pool_size: 4,
            database_cap: 0,
            database: "app",
            sent_at: Instant::now(),
            statement_timeout: None,
            deadline: None,
            hint: None,
        }
    }

    /// A request of `tenant` predicted at `predicted` seconds, with its arrival for the log.
    fn part(tenant: &str, predicted: f64) -> Part {
        let request = request_of(tenant);
        let arrival = Arrival::of(&request, Instant::now(), std::time::SystemTime::now());
        Part {
            tenant: tenant.into(),
            charged: predicted,
            predicted,
            learn: None,
            cached: None,
            learned: false,
            fingerprint: Some(Fingerprint(7)),
            reading: None,
            sent_at: Instant::now(),
            waited: Duration::ZERO,
            arrivals: Arrived::of(Some(Box::new(arrival)), predicted, false, Duration::ZERO),
        }
    }

    /// What the session derives once per reading holds for every text the reading stands
    /// for: texts of one shape that share an analysis agree on each of them, a `;` or a
    /// keyword inside a constant notwithstanding.
    #[test]
    fn texts_that_share_a_reading_share_what_is_derived_from_it() {
        let analyzer = crate::sql::Analyzer::new(crate::sql::Depth::Tree, 64);
        let context = crate::sql::ParseContext::server_defaults();
        let options = pg_query::ParserOptions::DISABLE_ESCAPE_STRING_WARNING;
        let pairs = [
            ("SELECT 'a'", "SELECT ';'"),
            ("SELECT 'x' FROM t", "SELECT 'begin; drop table t' FROM t"),
            ("PREPARE TRANSACTION 'ab'", "PREPARE TRANSACTION 'a;b'"),
            ("COMMIT PREPARED 'ab'", "COMMIT PREPARED 'a;b'"),
            ("SELECT 1; SELECT 'a'", "SELECT 1; SELECT ';'"),
            (
                "DECLARE c CURSOR FOR SELECT 'a'",
                "DECLARE c CURSOR FOR SELECT ';x'",
            ),
            ("/* a */ SELECT 1", "/* a */ SELECT 2"),
            ("VACUUM t", "VACUUM t"),
            (
                "SELECT set_config('a', 'b', false)",
                "SELECT set_config('a;', 'b', false)",
            ),
            ("CALL p('x')", "CALL p(';')"),
        ];
        let mut shared = 0;
        for (a, b) in pairs {
            let (ra, rb) = (
                analyzer.analyze(a.as_bytes(), &context),
                analyzer.analyze(b.as_bytes(), &context),
            );
            if !Arc::ptr_eq(&ra, &rb) {
                continue;
            }
            shared += 1;
            assert_eq!(RequestKind::of_sql(a), RequestKind::of_sql(b), "{a} / {b}");
            assert_eq!(changes_plans(a), changes_plans(b), "{a} / {b}");
            assert_eq!(declares_cursor(a), declares_cursor(b), "{a} / {b}");
            assert_eq!(
                several_statements(a, options),
                several_statements(b, options),
                "{a} / {b}"
            );
        }
        assert!(shared >= 5, "only {shared} pairs shared a reading");
    }

    #[test]
    fn requests_counted_together_past_max_parts_each_keep_their_traffic_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.jsonl");
        let traffic = TrafficLog::default();
        traffic.open(Some(&path)).unwrap();
        let tables = crate::ops::StatementTables::new(1, 10);
        let app: Arc<str> = Arc::from("app");
        let sink = StatsSink {
            tables: &tables,
            worker: 0,
            traffic: &traffic,
            role: &app,
            database: &app,
        };
        let mut run = Run::default();
        for _ in 0..MAX_PARTS + 36 {
            run.add(part("a", 0.01), Instant::now());
        }
        assert_eq!(run.parts.len(), MAX_PARTS);
        let took = Duration::from_secs(1);
        let shares = shares(&run.parts, took);
        sink.log_traffic(&run, &shares, true);
        traffic.flush();
        let lines: Vec<Entry> = std::fs::read_to_string(&path)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), MAX_PARTS + 36);
        let total: f64 = lines.iter().filter_map(|e| e.took).sum();
        assert!((total - 1.0).abs() < 1e-6, "{total}");
        assert!(lines.iter().all(|e| e.predicted == Some(0.01)));
    }

    #[test]
    fn a_query_s_constants_leave_out_its_comments_and_only_its_comments() {
        let q = |t: &'static str| Work::Query(Bytes::from_static(t.as_bytes())).constants();
        let tagged = q("SELECT 1 /* tenant='a' */");
        assert_eq!(tagged, q("SELECT 1 /* tenant='b' */"));
        assert_eq!(q("SELECT 1 -- one"), q("SELECT 1 -- two"));
        assert_ne!(tagged, q("SELECT 2 /* tenant='a' */"));
        // A slash or a minus alone is no comment: the text is read as it is.
        assert_ne!(q("SELECT 4 / 2"), q("SELECT 4 /2"));
        assert_ne!(q("SELECT 4 - 2"), q("SELECT 4 -2"));
        for text in ["-", "/", "a-", "a/", "a-/", "a/-"] {
            assert!(!may_comment(text.as_bytes()), "{text}");
        }
        for text in ["--", "/*", "a--b", "x/*", "- --", "/ /*"] {
            assert!(may_comment(text.as_bytes()), "{text}");
        }
    }

    #[test]
    fn a_run_nothing_was_admitted_for_only_clears_its_marks() {
        let keeper = crate::gate::keeper::Gatekeeper::new();
        let mut gate = GateState::default();
        gate.run.failed = true;
        gate.run.rows = 3;
        gate.run.error = Some("57014".to_string());
        gate.run.changes_plans = true;
        gate.end_run(&keeper, None, (SlotAfter::Goes, None));
        let run = &gate.run;
        assert!(!run.failed && run.rows == 0 && run.error.is_none() && !run.changes_plans);
        assert!(!gate.stale_plans, "nothing ran that was timed");
    }

    #[test]
    fn a_run_of_several_parts_is_settled_at_once_in_their_order() {
        let keeper = crate::gate::keeper::Gatekeeper::new();
        let now = Instant::now();
        let request = request_of("a");
        let price = crate::gate::Cost {
            seconds: 0.001,
            known: true,
            learned: true,
        };
        let admitted = keeper.admit(&request, now, Some((price, true)), None);
        let Some(Ok((_, crate::gate::keeper::SlotLook::Taken(guard)))) = admitted.paid else {
            panic!("a slot");
        };
        let mut gate = GateState {
            slot: Some(guard),
            ..GateState::default()
        };
        let two_seconds_ago = now.checked_sub(Duration::from_secs(2)).unwrap();
        gate.run.add(part("a", 0.5), two_seconds_ago);
        gate.run.add(part("a", 0.5), two_seconds_ago);
        gate.end_run(&keeper, None, (SlotAfter::Goes, None));
        // Each part took about a second where half of one was charged: both are settled
        // before the slot goes back.
        let charged = keeper.charged_of("a");
        assert!(charged >= 0.99, "{charged}");
    }
}
