//! Per-pool rules for closing servers when they come back: servers opened before a RECONNECT
//! (or before a reload changed the connection string), and servers picked for eviction
//! because a limit dropped below what is in use.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use crate::server::ServerConn;
use crate::sync::lock;

#[derive(Debug, Default)]
struct CloseRules {
    /// Servers opened before this instant are closed when released; what marked them.
    before: Option<(Instant, Renewal)>,
    /// Servers (by id) to close when released.
    evict: HashSet<u64>,
    /// The pool is no longer configured (its database was removed, or its forced user
    /// changed): every server closes when released, those it opens later too.
    retired: bool,
}

impl CloseRules {
    /// Whether a server opened (its connect begun) at `created` came before the last
    /// RECONNECT or change of the connection string.
    fn opened_before(&self, created: Instant) -> bool {
        self.dropped(created).is_some()
    }

    /// What marked servers opened before it, if a server opened at `created` was.
    fn dropped(&self, created: Instant) -> Option<Renewal> {
        self.before
            .filter(|(b, _)| created < *b)
            .map(|(_, why)| why)
    }
}

/// What renews a pool's servers: those opened before it close.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Renewal {
    /// The console's RECONNECT.
    Reconnect,
    /// A reload changed the database's connection string.
    Reload,
    /// The console's KILL of the database.
    Kill,
}

impl Renewal {
    /// Why an idle server is closed (PgBouncer's words).
    pub fn idle_reason(self) -> &'static str {
        match self {
            Renewal::Reconnect => "obsolete connection",
            Renewal::Reload => "database configuration changed",
            Renewal::Kill => "database removed",
        }
    }

    /// Why a server still logging in is dropped (PgBouncer's words).
    pub fn login_reason(self) -> &'static str {
        match self {
            Renewal::Reconnect | Renewal::Reload => "connect string changed",
            Renewal::Kill => "database removed",
        }
    }
}

/// What a pool closes at check-in. Checking costs one atomic load until a rule is set.
#[derive(Debug, Default)]
pub struct Closing {
    armed: AtomicBool,
    rules: Mutex<CloseRules>,
}

impl Closing {
    /// Whether a server coming back must be closed rather than kept.
    pub fn must_close(&self, conn: &ServerConn) -> bool {
        if !self.armed.load(Ordering::Acquire) {
            return false;
        }
        let mut rules = lock(&self.rules);
        let outdated = rules.retired || rules.opened_before(conn.created);
        rules.evict.remove(&conn.id) || outdated
    }

    /// Whether a server was opened (its connect begun) before the last RECONNECT or change of
    /// the connection string: it serves no one, not even just opened.
    pub fn outdated(&self, conn: &ServerConn) -> bool {
        self.opened_before(conn.created)
    }

    /// Whether a connect begun at `at` came before the last RECONNECT or change of the
    /// connection string.
    pub fn opened_before(&self, at: Instant) -> bool {
        self.dropped(at).is_some()
    }

    /// What marked a connect begun at `at` as begun before the last RECONNECT or change of
    /// the connection string, if anything did.
    pub fn dropped(&self, at: Instant) -> Option<Renewal> {
        match self.armed.load(Ordering::Acquire) {
            true => lock(&self.rules).dropped(at),
            false => None,
        }
    }

    /// The pool's configuration is gone: its clients finish, every server it has or opens
    /// closes when released.
    pub fn retire(&self) {
        lock(&self.rules).retired = true;
        self.armed.store(true, Ordering::Release);
    }

    /// The pool's configuration is back (its database put back, its forced user as it was):
    /// servers it opens from now on are kept again. (The reload that puts it back also closes
    /// the servers opened before, as for a changed connection string.)
    pub fn reinstate(&self) {
        lock(&self.rules).retired = false;
    }

    /// Whether the pool's configuration is gone (see [`Self::retire`]).
    pub fn retired(&self) -> bool {
        self.armed.load(Ordering::Acquire) && lock(&self.rules).retired
    }

    /// Servers opened before `now` close at their next release (RECONNECT). A RECONNECT that
    /// took its instant before another's (a console RECONNECT and a reload at once) does not
    /// move the mark back.
    pub fn reconnect(&self, now: Instant, why: Renewal) {
        let mut rules = lock(&self.rules);
        rules.before = match rules.before {
            Some((b, was)) if b > now => Some((b, was)),
            _ => Some((now, why)),
        };
        drop(rules);
        self.armed.store(true, Ordering::Release);
    }

    /// These servers close at their next release.
    pub fn evict(&self, ids: impl IntoIterator<Item = u64>) {
        lock(&self.rules).evict.extend(ids);
        self.armed.store(true, Ordering::Release);
    }

    /// Whether a server opened at `created` with id `id` will be closed when released
    /// (SHOW SERVERS' close_needed, WAIT_CLOSE).
    pub fn close_needed(&self, id: u64, created: Instant) -> bool {
        if !self.armed.load(Ordering::Acquire) {
            return false;
        }
        let rules = lock(&self.rules);
        rules.opened_before(created) || rules.evict.contains(&id)
    }

    /// Forgets evictions of servers that are gone.
    pub fn retain_evictions(&self, live: impl Fn(u64) -> bool) {
        lock(&self.rules).evict.retain(|id| live(*id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_reconnect_never_moves_the_mark_back() {
        let closing = Closing::default();
        let t0 = Instant::now();
        let (t1, t2) = (t0 + Duration::from_secs(1), t0 + Duration::from_secs(2));
        closing.reconnect(t2, Renewal::Kill);
        closing.reconnect(t1, Renewal::Reconnect);
        assert!(closing.opened_before(t1 + Duration::from_millis(500)));
        assert!(!closing.opened_before(t2));
        assert_eq!(closing.dropped(t1), Some(Renewal::Kill));
    }
}
