//! The blocker pays: each second one of pgward's sessions waits for a lock that another of
//! its sessions holds (or waits for ahead of it), that second moves from the waiter's tenant
//! to the tenant of the sessions it waits for. A pure function of a reading.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use super::reading::{Backend, Reading};

/// Seconds of server time moved from one tenant to another.
#[derive(Debug, Clone, PartialEq)]
pub struct Move {
    pub from: String,
    pub to: String,
    pub seconds: f64,
}

/// What moves for one reading, `elapsed` after the last one: each of pgward's sessions
/// waiting for a lock while its client waits for an answer (`busy`; `tenants` names the
/// tenant of each of pgward's backends) moves the time it waited since the last reading (at
/// most `elapsed`) to the tenants of the pgward sessions at the root of what it waits for, in
/// equal parts. A session it waits for that waits itself passes its part on to what it waits
/// for (the first waiter for a hot row holds the row's tuple lock, but the transaction holding
/// the row is the root). Time owed to its own tenant, or to sessions outside pgward, stays.
pub fn moves(
    reading: &Reading,
    tenants: &HashMap<u32, &str>,
    busy: impl Fn(u32) -> bool,
    elapsed: Duration,
) -> Vec<Move> {
    let by_pid: HashMap<u32, &Backend> = reading.backends.iter().map(|b| (b.pid, b)).collect();
    let mut out: Vec<Move> = Vec::new();
    for waiter in reading.backends.iter().filter(|b| b.waits_on_lock) {
        let Some(from) = tenants.get(&waiter.pid).filter(|_| busy(waiter.pid)) else {
            continue;
        };
        let waited = waiter.waited.unwrap_or_default().min(elapsed).as_secs_f64();
        let mut shares = Vec::new();
        let mut visited = HashSet::from([waiter.pid]);
        spread(&by_pid, waiter, waited, &mut visited, &mut shares);
        for (holder, seconds) in shares {
            let Some(to) = tenants.get(&holder) else {
                continue;
            };
            if to == from || seconds <= 0.0 {
                continue;
            }
            match out.iter_mut().find(|m| m.from == *from && m.to == *to) {
                Some(m) => m.seconds += seconds,
                None => out.push(Move {
                    from: from.to_string(),
                    to: to.to_string(),
                    seconds,
                }),
            }
        }
    }
    out
}

/// Spreads `seconds` of `waiter`'s wait over what it waits for, down to sessions that wait
/// for nothing (each pid once).
fn spread(
    by_pid: &HashMap<u32, &Backend>,
    waiter: &Backend,
    seconds: f64,
    visited: &mut HashSet<u32>,
    shares: &mut Vec<(u32, f64)>,
) {
    let mut blockers: Vec<u32> = waiter.blocked_by.clone();
    blockers.sort_unstable();
    blockers.dedup();
    blockers.retain(|p| !visited.contains(p));
    if blockers.is_empty() {
        return;
    }
    let part = seconds / blockers.len() as f64;
    for pid in blockers {
        visited.insert(pid);
        match by_pid.get(&pid) {
            Some(b) if b.waits_on_lock && !b.blocked_by.is_empty() => {
                spread(by_pid, b, part, visited, shares)
            }
            _ => shares.push((pid, part)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiting(pid: u32, waited_ms: u64, blocked_by: &[u32]) -> Backend {
        Backend {
            pid,
            waits_on_lock: true,
            waited: Some(Duration::from_millis(waited_ms)),
            blocked_by: blocked_by.to_vec(),
            ..Backend::default()
        }
    }

    #[test]
    fn a_waiters_second_goes_to_the_tenants_it_waits_for() {
        let reading = Reading {
            backends: vec![
                Backend {
                    pid: 1,
                    ..Backend::default()
                },
                Backend {
                    pid: 2,
                    ..Backend::default()
                },
                // Waits 5 s (one second since the last reading) for 1 and 2.
                waiting(3, 5_000, &[1, 2]),
                // Waits 300 ms for 1.
                waiting(4, 300, &[1]),
                // Waits for its own tenant, and for a session outside pgward.
                waiting(5, 5_000, &[6, 9]),
            ],
            ..Reading::default()
        };
        let tenants: HashMap<u32, &str> =
            [(1, "a"), (2, "b"), (3, "c"), (4, "c"), (5, "d"), (6, "d")].into();
        let moved = moves(&reading, &tenants, |_| true, Duration::from_secs(1));
        assert_eq!(
            moved,
            vec![
                Move {
                    from: "c".into(),
                    to: "a".into(),
                    seconds: 0.8
                },
                Move {
                    from: "c".into(),
                    to: "b".into(),
                    seconds: 0.5
                },
            ]
        );
    }

    #[test]
    fn a_queue_for_a_hot_row_is_paid_by_the_transaction_holding_the_row() {
        // 1 holds the row; 2 waits for 1's transaction (holding the tuple lock); 3 and 4
        // wait for 2's tuple lock. 5 waits for 6, which waits for 5 (a deadlock, which
        // PostgreSQL breaks): nobody is at its root, nothing moves.
        let reading = Reading {
            backends: vec![
                Backend {
                    pid: 1,
                    ..Backend::default()
                },
                waiting(2, 5_000, &[1]),
                waiting(3, 5_000, &[2, 2]),
                waiting(4, 5_000, &[2]),
                waiting(5, 5_000, &[6]),
                waiting(6, 5_000, &[5]),
            ],
            ..Reading::default()
        };
        let tenants: HashMap<u32, &str> =
            [(1, "a"), (2, "b"), (3, "c"), (4, "c"), (5, "d"), (6, "e")].into();
        let moved = moves(&reading, &tenants, |pid| pid != 4, Duration::from_secs(1));
        assert_eq!(
            moved,
            vec![
                Move {
                    from: "b".into(),
                    to: "a".into(),
                    seconds: 1.0
                },
                Move {
                    from: "c".into(),
                    to: "a".into(),
                    seconds: 1.0
                },
            ]
        );
    }
}
