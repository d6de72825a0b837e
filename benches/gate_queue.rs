//! The admission gate's own work per decision, with few and with many waiting tickets, whose
//! waits have no end, end in the order they began (a queue timeout), or end out of that order
//! (each client's own statement timeout sooner than the queue timeout): a slot is given back,
//! the next waiter the gate chooses takes it, and a new request is admitted and queued. Prints the median time per decision of several rounds for each queue
//! length; the figures are for comparison within one run, not absolute.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use pgward::gate::{Decision, Gate, GateSettings, Lane, LaneLimits, Request, RequestKind, Slot};
use pgward::sql::Priority;

const TENANTS: [&str; 10] = ["t0", "t1", "t2", "t3", "t4", "t5", "t6", "t7", "t8", "t9"];
const SLOTS: usize = 8;
const DECISIONS: usize = 20_000;
const ROUNDS: usize = 7;

/// When the waits end.
#[derive(Clone, Copy)]
enum Ends {
    /// Never.
    None,
    /// In the order they began: a queue timeout.
    InOrder,
    /// Out of that order: each client's own statement timeout, sooner than the queue timeout.
    OutOfOrder,
}

impl Ends {
    fn queue_timeout(self) -> Option<Duration> {
        match self {
            Ends::None => None,
            Ends::InOrder | Ends::OutOfOrder => Some(Duration::from_secs(120)),
        }
    }

    /// The statement timeout of client `client_id`.
    fn statement_timeout(self, client_id: u64) -> Option<Duration> {
        match self {
            Ends::OutOfOrder => Some(Duration::from_millis(60_000 + client_id * 7_919 % 50_000)),
            Ends::None | Ends::InOrder => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Ends::None => "none",
            Ends::InOrder => "in order",
            Ends::OutOfOrder => "out of order",
        }
    }
}

fn request(tenant: &str, client_id: u64, ends: Ends, now: Instant) -> Request<'_> {
    Request {
        client_id,
        tenant,
        priority: Priority::Normal,
        kind: RequestKind::Statement,
        fingerprint: None,
        upstream: "127.0.0.1:5432",
        pool: "app/app",
        pool_size: SLOTS,
        database_cap: 0,
        database: "app",
        sent_at: now,
        statement_timeout: ends.statement_timeout(client_id),
        deadline: None,
        hint: None,
    }
}

fn queue(gate: &mut Gate<u64>, client: u64, ends: Ends, now: Instant) {
    let tenant = TENANTS[client as usize % TENANTS.len()];
    match gate.admit(&request(tenant, client, ends, now), now) {
        Decision::Admit(pass) => {
            gate.enqueue(pass, client, now);
        }
        other => panic!("not admitted: {other:?}"),
    }
}

/// A gate whose slots are all held, with `waiting` tickets queued whose waits end as `ends`
/// says.
fn loaded(waiting: usize, ends: Ends, now: Instant) -> (Gate<u64>, VecDeque<Slot>) {
    let settings = GateSettings {
        queue_timeout: ends.queue_timeout(),
        lanes: LaneLimits {
            fast: SLOTS,
            slow: 1,
        },
        jitter: 0.0,
        per_database: None,
        flip_quarantine: None,
        adaptive: None,
        log: false,
    };
    let mut gate = Gate::new(settings, 1);
    let mut held = VecDeque::new();
    for client in 0..SLOTS as u64 {
        let tenant = TENANTS[client as usize % TENANTS.len()];
        let Decision::Admit(pass) = gate.admit(&request(tenant, client, ends, now), now) else {
            panic!("not admitted");
        };
        held.push_back(gate.try_acquire(&pass, now).expect("a free slot"));
    }
    for client in 0..waiting as u64 {
        queue(&mut gate, 1_000 + client, ends, now);
    }
    (gate, held)
}

/// Time per decision over one round.
fn round(waiting: usize, ends: Ends) -> Duration {
    let now = Instant::now();
    let (mut gate, mut held) = loaded(waiting, ends, now);
    let started = Instant::now();
    for i in 0..DECISIONS {
        let slot = held.pop_front().expect("a held slot");
        gate.release(&slot, now);
        let granted = gate
            .next_waiter("127.0.0.1:5432", Lane::Fast, now, |_| true)
            .expect("a waiter takes the slot");
        held.push_back(granted.slot);
        queue(&mut gate, 10_000_000 + i as u64, ends, now);
    }
    started.elapsed() / DECISIONS as u32
}

fn main() {
    // `cargo test --all-targets` runs this too (without `--bench`): one short round each.
    let kinds = [Ends::None, Ends::InOrder, Ends::OutOfOrder];
    if !std::env::args().any(|a| a == "--bench") {
        for ends in kinds {
            round(10, ends);
        }
        round(10_000, Ends::OutOfOrder);
        return;
    }
    println!("waiting  ends          median ns per decision ({ROUNDS} rounds of {DECISIONS})");
    for ends in kinds {
        for waiting in [10, 10_000] {
            let mut times: Vec<Duration> = (0..ROUNDS).map(|_| round(waiting, ends)).collect();
            times.sort();
            let median = times[ROUNDS / 2].as_nanos();
            println!("{waiting:>7}  {:<12}  {median:>8}", ends.name());
        }
    }
}
