//! The admission gate's own work per decision, with few and with many waiting tickets: a
//! slot is given back, the next waiter the gate chooses takes it, and a new request is
//! admitted and queued. Prints the median time per decision of several rounds for each queue
//! length; the figures are for comparison within one run, not absolute.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use pgward::gate::{Decision, Gate, GateSettings, Lane, LaneLimits, Request, RequestKind, Slot};
use pgward::sql::Priority;

const TENANTS: [&str; 10] = ["t0", "t1", "t2", "t3", "t4", "t5", "t6", "t7", "t8", "t9"];
const SLOTS: usize = 8;
const DECISIONS: usize = 20_000;
const ROUNDS: usize = 7;

fn request(tenant: &str, client_id: u64, now: Instant) -> Request<'_> {
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
        statement_timeout: None,
        deadline: None,
        hint: None,
    }
}

fn queue(gate: &mut Gate<u64>, client: u64, now: Instant) {
    let tenant = TENANTS[client as usize % TENANTS.len()];
    match gate.admit(&request(tenant, client, now), now) {
        Decision::Admit(pass) => {
            gate.enqueue(pass, client, now);
        }
        other => panic!("not admitted: {other:?}"),
    }
}

/// A gate whose slots are all held, with `waiting` tickets queued.
fn loaded(waiting: usize, now: Instant) -> (Gate<u64>, VecDeque<Slot>) {
    let settings = GateSettings {
        queue_timeout: None,
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
        let Decision::Admit(pass) = gate.admit(&request(tenant, client, now), now) else {
            panic!("not admitted");
        };
        held.push_back(gate.try_acquire(&pass, now).expect("a free slot"));
    }
    for client in 0..waiting as u64 {
        queue(&mut gate, 1_000 + client, now);
    }
    (gate, held)
}

/// Time per decision over one round.
fn round(waiting: usize) -> Duration {
    let now = Instant::now();
    let (mut gate, mut held) = loaded(waiting, now);
    let started = Instant::now();
    for i in 0..DECISIONS {
        let slot = held.pop_front().expect("a held slot");
        gate.release(&slot, now);
        let granted = gate
            .next_waiter("127.0.0.1:5432", Lane::Fast, now, |_| true)
            .expect("a waiter takes the slot");
        held.push_back(granted.slot);
        queue(&mut gate, 10_000_000 + i as u64, now);
    }
    started.elapsed() / DECISIONS as u32
}

fn main() {
    // `cargo test --all-targets` runs this too (without `--bench`): one short round each.
    if !std::env::args().any(|a| a == "--bench") {
        for waiting in [10, 10_000] {
            round(waiting);
        }
        return;
    }
    println!("waiting  median ns per decision ({ROUNDS} rounds of {DECISIONS})");
    for waiting in [10, 10_000] {
        let mut times: Vec<Duration> = (0..ROUNDS).map(|_| round(waiting)).collect();
        times.sort();
        println!("{waiting:>7}  {:>8}", times[ROUNDS / 2].as_nanos());
    }
}
