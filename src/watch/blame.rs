//! The blocker pays: each second one of pgward's sessions waits for a lock that another of
//! its sessions holds (or waits for ahead of it), that second moves from the waiter's tenant
//! to the tenant of the sessions it waits for. A pure function of a reading.

use std::collections::HashMap;
use std::time::Duration;

use super::reading::Reading;

/// Seconds of server time moved from one tenant to another.
#[derive(Debug, Clone, PartialEq)]
pub struct Move {
    pub from: String,
    pub to: String,
    pub seconds: f64,
}

/// What moves for one reading, `period` after the last: each of pgward's sessions waiting
/// for a lock (`tenants` names the tenant of each of pgward's backends) moves the time it
/// waited since the last reading (at most `period`) to the tenants of the pgward sessions it
/// waits for, in equal parts; time owed to its own tenant, or to sessions outside pgward,
/// stays where it is.
pub fn moves(reading: &Reading, tenants: &HashMap<u32, &str>, period: Duration) -> Vec<Move> {
    let mut out: Vec<Move> = Vec::new();
    for waiter in reading.backends.iter().filter(|b| b.waits_on_lock) {
        let Some(from) = tenants.get(&waiter.pid) else {
            continue;
        };
        if waiter.blocked_by.is_empty() {
            continue;
        }
        let waited = waiter.waited.unwrap_or_default().min(period).as_secs_f64();
        let share = waited / waiter.blocked_by.len() as f64;
        for holder in &waiter.blocked_by {
            let Some(to) = tenants.get(holder) else {
                continue;
            };
            if to == from || share <= 0.0 {
                continue;
            }
            match out.iter_mut().find(|m| m.from == *from && m.to == *to) {
                Some(m) => m.seconds += share,
                None => out.push(Move {
                    from: from.to_string(),
                    to: to.to_string(),
                    seconds: share,
                }),
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watch::reading::Backend;

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
        let moved = moves(&reading, &tenants, Duration::from_secs(1));
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
}
