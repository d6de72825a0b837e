//! The operations layer's shared state: the client registry, traffic counters, the pause /
//! disable / shutdown state, runtime limits set from the console, and the small hooks a
//! session calls as it takes and gives back servers.

pub mod clients;
pub mod hooks;
pub mod overrides;
pub mod sketch;
pub mod state;
pub mod statements;
pub mod stats;

use std::sync::Mutex;

pub use clients::{ClientEntry, ClientInfo, ClientRegistry, ClientState, Registration, ServerLink};
pub use hooks::{Checkout, SessionHooks, Waiting};
pub use overrides::Overrides;
pub use state::{Control, OpState, PauseMode, Shutdown};
pub use statements::{Ran, StatementKey, StatementRow, Statements};
pub use stats::{PoolCounters, StatValues, StatsRegistry};

/// The operations layer's part of the runtime.
#[derive(Debug)]
pub struct Ops {
    pub clients: ClientRegistry,
    pub stats: StatsRegistry,
    pub control: Control,
    /// SET USER / SET POOL values, kept across reloads.
    pub overrides: Mutex<Overrides>,
    /// Statement statistics (SHOW STATEMENTS), under a policy.
    pub statements: Mutex<Statements>,
    /// The OS user pgward runs as, and its name, for console logins over the Unix socket.
    pub os_uid: u32,
    pub os_user: Option<String>,
}

impl Default for Ops {
    fn default() -> Self {
        let os_uid = nix::unistd::getuid().as_raw();
        Ops {
            clients: ClientRegistry::default(),
            stats: StatsRegistry::default(),
            control: Control::default(),
            overrides: Mutex::new(Overrides::default()),
            statements: Mutex::new(Statements::default()),
            os_uid,
            os_user: user_name(os_uid),
        }
    }
}

/// The name of OS user `uid` (from the password database).
pub fn user_name(uid: u32) -> Option<String> {
    let user = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)).ok()??;
    Some(user.name)
}
