//! Whether a pool may open another server connection.

use std::time::Duration;

/// The limits that bound one pool, as PgBouncer reads them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    pub pool_size: usize,
    pub min_pool_size: usize,
    pub reserve_pool_size: usize,
    /// How long a ticket waits before the reserve opens; `None` (a setting of 0) keeps the
    /// reserve closed, as in PgBouncer.
    pub reserve_pool_timeout: Option<Duration>,
    /// `max_db_connections`: servers of all pools of this database; 0 is unlimited.
    pub max_db_connections: usize,
    /// `max_user_connections`: servers of all pools of this user; 0 is unlimited.
    pub max_user_connections: usize,
}

/// What is in use now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Servers of this pool: idle, checked out and being opened.
    pub pool_total: usize,
    /// Servers being opened for this pool.
    pub connecting: usize,
    /// Tickets waiting in this pool.
    pub waiting: usize,
    pub db_total: usize,
    pub user_total: usize,
    /// Whether min_pool_size applies: PgBouncer keeps it filled only for a pool with a
    /// client, or of a database with a forced user.
    pub min_wanted: bool,
}

/// The gate's answer to "may this pool open a server?".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Growth {
    /// Open one within `pool_size` (or to reach `min_pool_size`).
    Open,
    /// Open one from the reserve: a ticket has waited longer than `reserve_pool_timeout`.
    Reserve,
    /// Nothing to open: no waiter is left uncovered by a connection already being opened.
    NotNeeded,
    /// The pool is full.
    PoolFull,
    /// `max_db_connections` is reached.
    DbFull,
    /// `max_user_connections` is reached.
    UserFull,
}

impl Limits {
    /// The servers min_pool_size keeps open: at most the pool's size, and none in a pool
    /// without a size of its own (0).
    pub fn min_filled(&self) -> usize {
        self.min_pool_size.min(self.pool_size)
    }

    /// Decides whether one more server should be opened, given what is in use and how long the
    /// oldest ticket has waited.
    pub fn growth(&self, usage: &Usage, oldest_wait: Option<Duration>) -> Growth {
        let uncovered = usage.waiting > usage.connecting;
        // min_pool_size is capped at the pool's size, as PgBouncer's is; a pool without a
        // size of its own (0) is not filled to it, as PgBouncer's janitor fills none.
        let min = match usage.min_wanted {
            false => 0,
            true => self.min_filled(),
        };
        let below_min = usage.pool_total < min;
        if !uncovered && !below_min {
            return Growth::NotNeeded;
        }
        // The pool's own room first, as PgBouncer's launch_new_connection: a full pool is
        // full whatever the shared limits say (so it makes no room under them for nothing).
        let reserve_due = match (oldest_wait, self.reserve_pool_timeout) {
            (Some(waited), Some(timeout)) => waited >= timeout,
            _ => false,
        };
        // A pool_size of 0 is no cap of the pool's own (PgBouncer 1.24 and later): only the
        // shared limits bound it.
        let own = if self.pool_size == 0 || usage.pool_total < self.pool_size.max(min) {
            Growth::Open
        } else if uncovered
            && reserve_due
            && usage.pool_total < self.pool_size + self.reserve_pool_size
        {
            Growth::Reserve
        } else {
            return Growth::PoolFull;
        };
        if self.max_db_connections > 0 && usage.db_total >= self.max_db_connections {
            return Growth::DbFull;
        }
        if self.max_user_connections > 0 && usage.user_total >= self.max_user_connections {
            return Growth::UserFull;
        }
        own
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            pool_size: 2,
            min_pool_size: 0,
            reserve_pool_size: 1,
            reserve_pool_timeout: Some(Duration::from_secs(5)),
            max_db_connections: 0,
            max_user_connections: 0,
        }
    }

    fn usage(pool_total: usize, connecting: usize, waiting: usize) -> Usage {
        Usage {
            pool_total,
            connecting,
            waiting,
            db_total: pool_total,
            user_total: pool_total,
            min_wanted: true,
        }
    }

    #[test]
    fn a_full_pool_is_full_whatever_the_shared_limits_say() {
        let l = Limits {
            max_db_connections: 2,
            ..limits()
        };
        assert_eq!(l.growth(&usage(2, 0, 1), None), Growth::PoolFull);
        let below = Usage {
            db_total: 2,
            ..usage(1, 0, 1)
        };
        assert_eq!(l.growth(&below, None), Growth::DbFull);
    }

    #[test]
    fn opens_only_for_uncovered_waiters() {
        let l = limits();
        assert_eq!(l.growth(&usage(0, 0, 0), None), Growth::NotNeeded);
        assert_eq!(
            l.growth(&usage(0, 0, 1), Some(Duration::ZERO)),
            Growth::Open
        );
        assert_eq!(
            l.growth(&usage(1, 1, 1), Some(Duration::ZERO)),
            Growth::NotNeeded
        );
        assert_eq!(
            l.growth(&usage(1, 1, 2), Some(Duration::ZERO)),
            Growth::Open
        );
    }

    #[test]
    fn full_pool_uses_the_reserve_only_after_the_timeout() {
        let l = limits();
        assert_eq!(
            l.growth(&usage(2, 0, 1), Some(Duration::from_secs(4))),
            Growth::PoolFull
        );
        assert_eq!(
            l.growth(&usage(2, 0, 1), Some(Duration::from_secs(5))),
            Growth::Reserve
        );
        assert_eq!(
            l.growth(&usage(3, 0, 1), Some(Duration::from_secs(50))),
            Growth::PoolFull
        );
    }

    #[test]
    fn min_pool_size_fills_without_waiters() {
        let l = Limits {
            min_pool_size: 2,
            ..limits()
        };
        assert_eq!(l.growth(&usage(1, 0, 0), None), Growth::Open);
        assert_eq!(l.growth(&usage(2, 0, 0), None), Growth::NotNeeded);
    }

    #[test]
    fn min_pool_size_fills_only_a_pool_that_wants_it() {
        let l = Limits {
            min_pool_size: 2,
            ..limits()
        };
        let clientless = Usage {
            min_wanted: false,
            ..usage(0, 0, 0)
        };
        assert_eq!(l.growth(&clientless, None), Growth::NotNeeded);
        let waiting = Usage {
            min_wanted: false,
            ..usage(0, 0, 1)
        };
        assert_eq!(l.growth(&waiting, Some(Duration::ZERO)), Growth::Open);
    }

    #[test]
    fn a_reserve_pool_timeout_of_zero_keeps_the_reserve_closed() {
        let l = Limits {
            reserve_pool_timeout: None,
            ..limits()
        };
        assert_eq!(
            l.growth(&usage(2, 0, 1), Some(Duration::from_secs(50))),
            Growth::PoolFull
        );
    }

    #[test]
    fn min_pool_size_is_capped_at_the_pool_size() {
        let l = Limits {
            min_pool_size: 10,
            ..limits()
        };
        assert_eq!(l.growth(&usage(1, 0, 0), None), Growth::Open);
        assert_eq!(l.growth(&usage(2, 0, 0), None), Growth::NotNeeded);
        assert_eq!(
            l.growth(&usage(2, 0, 1), Some(Duration::ZERO)),
            Growth::PoolFull
        );
    }

    #[test]
    fn a_pool_size_of_zero_fills_no_minimum() {
        let l = Limits {
            pool_size: 0,
            min_pool_size: 2,
            ..limits()
        };
        assert_eq!(l.growth(&usage(1, 0, 0), None), Growth::NotNeeded);
        assert_eq!(l.growth(&usage(1, 0, 1), None), Growth::Open);
    }

    #[test]
    fn a_pool_size_of_zero_leaves_only_the_shared_limits() {
        let l = Limits {
            pool_size: 0,
            ..limits()
        };
        assert_eq!(l.growth(&usage(50, 0, 1), None), Growth::Open);
        assert_eq!(l.growth(&usage(50, 1, 1), None), Growth::NotNeeded);
        let capped = Limits {
            max_db_connections: 3,
            ..l
        };
        assert_eq!(capped.growth(&usage(2, 0, 1), None), Growth::Open);
        assert_eq!(capped.growth(&usage(3, 0, 1), None), Growth::DbFull);
    }

    #[test]
    fn database_and_user_caps_hold() {
        let l = Limits {
            max_db_connections: 3,
            max_user_connections: 2,
            pool_size: 10,
            ..limits()
        };
        let mut u = usage(1, 0, 1);
        u.db_total = 3;
        assert_eq!(l.growth(&u, None), Growth::DbFull);
        u.db_total = 1;
        u.user_total = 2;
        assert_eq!(l.growth(&u, None), Growth::UserFull);
    }
}
