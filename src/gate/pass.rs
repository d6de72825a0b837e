//! What flows through the gate: requests in, passes (admitted tickets) and slots out.

use super::events::Subject;
use super::kind::RequestKind;
use super::refusal::Refusal;
use crate::sql::{Fingerprint, Priority};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A ticket's number, unique within one gate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TicketId(pub u64);

/// The two lanes of an upstream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Lane {
    /// Ordinary work, up to `max_active` at once.
    Fast,
    /// Over-budget work (`when_over = slow`) and suspicious plans, with its own small limit.
    Slow,
}

impl Lane {
    /// Its name in the console and the metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Lane::Fast => "fast",
            Lane::Slow => "slow",
        }
    }
}

/// One request as the session presents it.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    /// The client session.
    pub client_id: u64,
    /// The tenant ([`Identity::tenant`](crate::policy::Identity)).
    pub tenant: &'a str,
    /// The statement's priority ([`Identity::priority`](crate::policy::Identity)).
    pub priority: Priority,
    /// What kind of request it is (see [`RequestKind::of_sql`]).
    pub kind: RequestKind,
    /// The statement's fingerprint, for statement kills.
    pub fingerprint: Option<Fingerprint>,
    /// The upstream (the PostgreSQL server, host:port) it runs on.
    pub upstream: &'a str,
    /// The pool (database/user) it takes a server from, and how many servers that pool
    /// may open: the upstream's slots are the servers of its pools.
    pub pool: &'a str,
    /// See `pool`.
    pub pool_size: usize,
    /// `max_db_connections` of its database, shared by the database's pools (0: none).
    pub database_cap: usize,
    /// The pgward database it runs in (`max_active_per_database`).
    pub database: &'a str,
    /// When the client sent it: deadlines count from here.
    pub sent_at: Instant,
    /// The client's own `statement_timeout`, if not zero.
    pub statement_timeout: Option<Duration>,
    /// The `deadline` tag.
    pub deadline: Option<Duration>,
    /// Where the gate found this session's last request (see [`Hint`]).
    pub hint: Option<&'a Hint>,
}

impl Request<'_> {
    /// Whose statement this is, for the decision log.
    pub fn subject(&self) -> Subject<'_> {
        Subject {
            tenant: self.tenant,
            database: self.database,
            client: self.client_id,
            fingerprint: self.fingerprint,
        }
    }
}

/// Whether a pass has paid for its statement.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Payment {
    /// Not charged yet.
    Unpaid,
    /// Waits in the queue until its tenant's debt is paid back (`when_over = wait`).
    AwaitingPayBack,
    /// Charged this many seconds (refunded if it never runs, settled once it has).
    Paid(f64),
}

/// An admitted request: what it is, where it waits, what it paid. Not `Clone`: what it paid
/// is refunded once. Its fields are boxed: a pass moves through the gate's queue, the
/// grant, the waiter's channel and the session's futures, each move a pointer's.
#[derive(Debug)]
pub struct Pass(Box<PassFields>);

/// What a [`Pass`] holds.
#[derive(Debug)]
pub struct PassFields {
    /// Its number.
    pub id: TicketId,
    /// The client session.
    pub client_id: u64,
    /// The tenant.
    pub tenant: Arc<str>,
    /// Its priority class.
    pub priority: Priority,
    /// What kind of request.
    pub kind: RequestKind,
    /// The statement's fingerprint (statement kills refuse it while it waits).
    pub fingerprint: Option<Fingerprint>,
    /// The upstream.
    pub upstream: Arc<str>,
    /// The pgward database.
    pub database: Arc<str>,
    /// The lane it waits in.
    pub lane: Lane,
    /// When the client sent it.
    pub sent_at: Instant,
    /// When it must have finished.
    pub deadline: Option<Instant>,
    /// When it last joined a queue.
    pub enqueued_at: Option<Instant>,
    /// While it waits: when its client is to be told it is queued (query_wait_notify), if
    /// not told yet (cleared once told and when it leaves the queue).
    pub notify_at: Option<Instant>,
    /// How long it waited in the gate's queues in all, until its last slot (a statement
    /// may wait for a slot, then again for its tenant's debt to be paid back).
    pub waited: Duration,
    /// Some of that wait was for a pay-back.
    pub waited_for_budget: bool,
    pub(super) payment: Payment,
    /// Where the gate keeps its tenant and upstream.
    pub(super) places: Places,
}

/// A pass's or slot's upstream, and where the gate keeps it.
#[derive(Clone, Copy, Debug)]
pub struct Near<'a> {
    pub(super) places: Places,
    pub(super) upstream: &'a Arc<str>,
}

/// Where the gate found a session's last admitted request: its tenant, upstream and pool,
/// and the names it checked them by. A session's next request naming the same ones is
/// admitted without looking them up by name; the gate trusts a hint only while its places
/// still hold those very names and nothing was noted of the upstream's pools since.
#[derive(Clone, Debug)]
pub struct Hint {
    pub(super) places: Places,
    pub(super) tenant: Arc<str>,
    pub(super) upstream: Arc<str>,
    pub(super) database: Arc<str>,
    pub(super) pool: Arc<str>,
    /// The pool's `pool_size` and its database's `max_db_connections` as noted.
    pub(super) sizes: (usize, usize),
    /// The upstream's count of pool notes when this one was made.
    pub(super) pools_noted: u64,
}

/// Where the gate keeps a pass's or slot's tenant and upstream (hints checked against the
/// names: see `registry`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Places {
    pub(super) tenant: super::registry::Place,
    pub(super) upstream: super::registry::Place,
}

impl std::ops::Deref for Pass {
    type Target = PassFields;

    fn deref(&self) -> &PassFields {
        &self.0
    }
}

impl std::ops::DerefMut for Pass {
    fn deref_mut(&mut self) -> &mut PassFields {
        &mut self.0
    }
}

impl Pass {
    /// A pass holding `fields`.
    pub(super) fn new(fields: PassFields) -> Pass {
        Pass(Box::new(fields))
    }

    /// A pass holding `fields`, in the allocation of `spare` (a pass that served its turn)
    /// when there is one.
    pub(super) fn new_in(fields: PassFields, spare: Option<Pass>) -> Pass {
        match spare {
            Some(mut pass) => {
                *pass.0 = fields;
                pass
            }
            None => Pass::new(fields),
        }
    }

    /// Its upstream, and where the gate keeps it.
    pub fn near(&self) -> Near<'_> {
        Near {
            places: self.places,
            upstream: &self.upstream,
        }
    }

    /// Whose statement this is, for the decision log.
    pub fn subject(&self) -> Subject<'_> {
        Subject {
            tenant: &self.tenant,
            database: &self.database,
            client: self.client_id,
            fingerprint: self.fingerprint,
        }
    }

    /// What it paid, or waits for.
    pub fn payment(&self) -> Payment {
        self.payment
    }

    /// Seconds charged so far.
    pub fn charged(&self) -> f64 {
        match self.payment {
            Payment::Paid(c) => c,
            _ => 0.0,
        }
    }

    /// What it was charged, once it was.
    pub fn paid(&self) -> Option<f64> {
        match self.payment {
            Payment::Paid(c) => Some(c),
            _ => None,
        }
    }
}

/// A slot held: one checked-out server of a lane. Give it back with
/// [`Gate::release`](super::Gate::release) when PostgreSQL owes the client nothing more.
#[derive(Debug, PartialEq, Eq)]
pub struct Slot {
    pub(super) id: TicketId,
    pub(super) upstream: Arc<str>,
    pub(super) database: Arc<str>,
    pub(super) lane: Lane,
    pub(super) tenant: Arc<str>,
    /// Slots of its lane held when it was taken, itself included.
    pub(super) crowd: usize,
    pub(super) places: Places,
}

impl Slot {
    /// Its upstream, and where the gate keeps it.
    pub fn near(&self) -> Near<'_> {
        Near {
            places: self.places,
            upstream: &self.upstream,
        }
    }

    /// Slots of its lane held when it was taken, itself included.
    pub fn crowd(&self) -> usize {
        self.crowd
    }

    /// The ticket it was granted to.
    pub fn ticket(&self) -> TicketId {
        self.id
    }

    /// The upstream.
    pub fn upstream(&self) -> &str {
        &self.upstream
    }

    /// The lane.
    pub fn lane(&self) -> Lane {
        self.lane
    }

    /// The tenant holding it.
    pub fn tenant(&self) -> &str {
        &self.tenant
    }
}

/// The predicted price of a statement: seconds of server time (from its plan and the
/// factor learned for it, or its usual time), settled against what it really took once it
/// has run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Cost {
    /// Predicted seconds (`min_charge` applies).
    pub seconds: f64,
    /// Whether anything backs the prediction (a plan, or a time learned from earlier runs);
    /// work whose price is unknown holds its tenant's unknown-work hold until it has run.
    pub known: bool,
    /// Whether the prediction rests on this statement's own runs (not on a median or a
    /// default): only then is a statement that cannot finish before its deadline refused
    /// without running, so a guess never refuses anything for good.
    pub learned: bool,
}

/// The answer to [`Gate::admit`](super::Gate::admit).
#[derive(Debug)]
pub enum Decision {
    /// Wait for a slot in `pass.lane` (or take one at once), then price and spend.
    Admit(Pass),
    /// Transaction control: run now without a slot; `min_charge` is already charged.
    Bypass(Pass),
    /// Refuse it.
    Refuse(Refusal),
}

/// The answer to [`Gate::spend`](super::Gate::spend) when nothing refuses.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Spent {
    /// Run it; this many seconds were charged.
    Run {
        /// Seconds charged.
        charged: f64,
    },
    /// The tenant owes time and `when_over = slow`: the pass is now in the slow lane. Give
    /// back a fast slot if one is held, and wait for a slow one; spend again there.
    MovedToSlow,
    /// The tenant owes time and `when_over = wait`: give back the slot if one is held and
    /// queue the pass again; it gets a slot once the debt is paid back (about `until`);
    /// spend again then.
    WaitForBudget {
        /// When the debt will be paid back.
        until: Option<Instant>,
    },
}

/// A waiting ticket that got a slot.
#[derive(Debug)]
pub struct Granted<W> {
    /// The ticket.
    pub pass: Pass,
    /// Its slot.
    pub slot: Slot,
    /// Who to tell.
    pub waiter: W,
}

/// The slots handed out at once: after a release nearly always one, so none is allocated.
pub type Grants<W> = smallvec::SmallVec<[Granted<W>; 1]>;

/// A waiting ticket whose wait ended without a slot (refunded already).
#[derive(Debug)]
pub struct Expired<W> {
    /// The ticket.
    pub pass: Pass,
    /// Who to tell.
    pub waiter: W,
    /// What to answer.
    pub refusal: Refusal,
}
