//! The pooler's operating state: paused or suspended (all databases or some), disabled
//! databases, and the shutdown modes. Sessions wait on it before taking a server; `main`
//! watches it to know when to stop.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::watch;

/// PAUSE / SUSPEND for every database at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PauseMode {
    #[default]
    Running,
    Paused,
    Suspended,
}

/// How the process is stopping, if it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Shutdown {
    #[default]
    No,
    /// SHUTDOWN WAIT_FOR_CLIENTS / SIGTERM: stop accepting, exit once no client is left.
    WaitForClients,
    /// SHUTDOWN WAIT_FOR_SERVERS / SIGINT: stop accepting, refuse new transactions, exit once
    /// no server is in use.
    WaitForServers,
    /// SHUTDOWN / SIGQUIT / a second SIGTERM or SIGINT.
    Now,
}

/// Everything that can hold or refuse a client.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpState {
    pub pause: PauseMode,
    pub shutdown: Shutdown,
    pub paused: BTreeSet<String>,
    pub disabled: BTreeSet<String>,
}

impl OpState {
    /// Whether a client of `db` must wait before it takes a server.
    pub fn holds(&self, db: &str) -> bool {
        self.pause != PauseMode::Running || self.paused.contains(db)
    }

    pub fn is_paused(&self, db: &str) -> bool {
        self.pause == PauseMode::Paused || self.paused.contains(db)
    }

    pub fn is_disabled(&self, db: &str) -> bool {
        self.disabled.contains(db)
    }

    pub fn stopping(&self) -> bool {
        self.shutdown != Shutdown::No
    }

    /// The name SHOW STATE gives the pause mode.
    pub fn state_rows(&self) -> [(&'static str, bool); 3] {
        [
            ("active", self.pause == PauseMode::Running),
            ("paused", self.pause == PauseMode::Paused),
            ("suspended", self.pause == PauseMode::Suspended),
        ]
    }
}

/// Shared operating state, changed by the console and signals.
#[derive(Debug)]
pub struct Control {
    tx: watch::Sender<OpState>,
    /// Some database is paused or the pooler suspended: [`Control::holds`] looks further
    /// only then (one load for every request otherwise). Written with each change, under
    /// the state's lock.
    holds_some: AtomicBool,
}

impl Default for Control {
    fn default() -> Self {
        Control {
            tx: watch::Sender::new(OpState::default()),
            holds_some: AtomicBool::new(false),
        }
    }
}

impl Control {
    pub fn get(&self) -> OpState {
        self.tx.borrow().clone()
    }

    /// Whether a client of `db` must wait now (cheap: no clone, and one load while nothing
    /// is paused).
    pub fn holds(&self, db: &str) -> bool {
        self.holds_some.load(Ordering::Acquire) && self.tx.borrow().holds(db)
    }

    /// Notes after a change whether anything may hold a client now.
    fn note_holds(&self, state: &OpState) {
        let some = state.pause != PauseMode::Running || !state.paused.is_empty();
        self.holds_some.store(some, Ordering::Release);
    }

    pub fn shutdown(&self) -> Shutdown {
        self.tx.borrow().shutdown
    }

    /// Changes the state; waiters re-check it.
    pub fn update(&self, change: impl FnOnce(&mut OpState)) {
        self.tx.send_modify(|state| {
            change(state);
            self.note_holds(state);
        });
    }

    /// Checks and changes the state as one step, so two consoles cannot both pass the same
    /// check: `change` either changes the state and returns Ok, or leaves it untouched and
    /// returns why not.
    pub fn try_update<E>(
        &self,
        change: impl FnOnce(&mut OpState) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut outcome = Ok(());
        self.tx.send_if_modified(|state| {
            outcome = change(state);
            self.note_holds(state);
            outcome.is_ok()
        });
        outcome
    }

    /// Waits until clients of `db` may take a server.
    pub async fn wait_open(&self, db: &str) {
        let mut rx = self.tx.subscribe();
        // The sender lives as long as `self`, so this cannot fail while anyone waits.
        let _ = rx.wait_for(|s| !s.holds(db)).await;
    }

    /// A receiver that sees every change.
    pub fn subscribe(&self) -> watch::Receiver<OpState> {
        self.tx.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn paused_database_holds_until_resumed() {
        let c = std::sync::Arc::new(Control::default());
        c.update(|s| {
            s.paused.insert("a".into());
        });
        assert!(c.holds("a") && !c.holds("b"));
        let waiter = tokio::spawn({
            let c = c.clone();
            async move { c.wait_open("a").await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        c.update(|s| {
            s.paused.remove("a");
        });
        waiter.await.unwrap();
    }

    #[test]
    fn global_modes() {
        let s = OpState {
            pause: PauseMode::Suspended,
            ..OpState::default()
        };
        assert!(s.holds("x") && !s.is_paused("x"));
        assert_eq!(s.state_rows()[2], ("suspended", true));
    }

    #[test]
    fn a_checked_update_changes_all_or_nothing_and_wakes_only_on_change() {
        let control = Control::default();
        let mut rx = control.subscribe();
        rx.borrow_and_update();
        let refused: Result<(), &str> = control.try_update(|s| {
            if s.pause == PauseMode::Running {
                return Err("running");
            }
            s.pause = PauseMode::Paused;
            Ok(())
        });
        assert_eq!(refused, Err("running"));
        assert_eq!(control.get(), OpState::default());
        assert!(
            !rx.has_changed().unwrap(),
            "a refused change woke the waiters"
        );
        let done: Result<(), &str> = control.try_update(|s| {
            s.pause = PauseMode::Paused;
            Ok(())
        });
        assert!(done.is_ok());
        assert_eq!(control.get().pause, PauseMode::Paused);
        assert!(rx.has_changed().unwrap());
    }
}
