//! The edge: what stands between the network and the pools. TLS on both sides, the hba
//! file, the failed-login throttle and client caps counted after authentication. Pure of
//! pools and servers: auth_query's lookup is the login's (`client::secrets`).

pub mod caps;
pub mod hba;
pub mod throttle;
pub mod tls;
pub mod verify;
pub mod x509;

use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;

use crate::config::{AuthType, Config, Settings};
use caps::{CapLimits, ClientCaps};
use hba::{Hba, HbaError};
use throttle::{LoginThrottle, ThrottleRules};
use tls::{ClientTls, ServerTls, TlsError};

/// Most (address, role) pairs, and most addresses, the throttle remembers.
const THROTTLE_ENTRIES: usize = 65_536;

#[derive(Debug, thiserror::Error)]
pub enum EdgeError {
    #[error("client TLS: {0}")]
    ClientTls(TlsError),
    #[error("server TLS: {0}")]
    ServerTls(TlsError),
    #[error(transparent)]
    Hba(#[from] HbaError),
}

/// The edge's state, shared by every client task.
pub struct Edge {
    pub client_tls: ArcSwap<ClientTls>,
    pub server_tls: ArcSwap<ServerTls>,
    /// The parsed `auth_hba_file`, when `auth_type = hba`.
    pub hba: ArcSwap<Option<Hba>>,
    pub throttle: Mutex<LoginThrottle>,
    pub caps: Arc<ClientCaps>,
}

impl Edge {
    /// Reads the certificates and the hba file; any error stops the start.
    pub fn load(s: &Settings) -> Result<Edge, EdgeError> {
        Ok(Edge {
            client_tls: ArcSwap::from_pointee(tls::client_tls(s).map_err(EdgeError::ClientTls)?),
            server_tls: ArcSwap::from_pointee(tls::server_tls(s).map_err(EdgeError::ServerTls)?),
            hba: ArcSwap::from_pointee(load_hba(s)?),
            throttle: Mutex::new(LoginThrottle::new(
                ThrottleRules::default(),
                THROTTLE_ENTRIES,
            )),
            caps: Arc::new(ClientCaps::default()),
        })
    }

    /// Reads the certificates and the hba file again. TLS changes as a whole, both sides
    /// with their modes, or not at all (as in PgBouncer): a setup that fails on either side
    /// keeps the running one, so the mode in force always goes with its certificates. A
    /// part that fails to load keeps its running version; the answer says which and why.
    pub fn reload(&self, s: &Settings) -> EdgeReload {
        let tls_kept = self.reload_tls(s).err();
        let hba_kept = match load_hba(s) {
            Ok(h) => {
                self.hba.store(Arc::new(h));
                None
            }
            Err(e) => Some(format!(
                "auth_hba_file not reloaded, keeping the running rules: {e}"
            )),
        };
        EdgeReload { tls_kept, hba_kept }
    }

    /// Builds both sides' TLS from `s` and installs them together, or keeps both.
    fn reload_tls(&self, s: &Settings) -> Result<(), String> {
        let (client, server) = (tls::client_tls(s), tls::server_tls(s));
        let (client, server) = match (client, server) {
            (Ok(c), Ok(s)) => (c, s),
            (client, server) => {
                let why: Vec<String> = [client.err(), server.err()]
                    .into_iter()
                    .flatten()
                    .map(|e| e.to_string())
                    .collect();
                return Err(format!(
                    "TLS setup failed: TLS settings not applied, keeping the running certificates and modes \
                     (client_tls_sslmode = {}, server_tls_sslmode = {}): {}",
                    tls::mode_name(self.client_tls.load().mode),
                    tls::mode_name(self.server_tls.load().mode),
                    why.join("; ")
                ));
            }
        };
        self.client_tls.store(Arc::new(client));
        self.server_tls.store(Arc::new(server));
        Ok(())
    }
}

/// What a reload of the edge could not apply, and why; those parts keep running as they
/// were.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct EdgeReload {
    /// Both sides' TLS, mode and certificates, stayed as they were.
    pub tls_kept: Option<String>,
    /// The hba rules stayed as they were.
    pub hba_kept: Option<String>,
}

fn load_hba(s: &Settings) -> Result<Option<Hba>, HbaError> {
    match (&s.auth_hba_file, s.auth_type) {
        (Some(path), AuthType::Hba) => Hba::load(path, s.auth_ident_file.as_deref()).map(Some),
        _ => Ok(None),
    }
}

/// The caps that apply to `user` logging in to client database `database`.
pub fn cap_limits(config: &Config, database: &str, user: &str) -> CapLimits {
    let s = &config.settings;
    let own_cap = crate::config::databases::own_cap;
    let per_role = own_cap(
        config
            .user(user)
            .and_then(|u| u.max_user_client_connections),
    )
    .unwrap_or(s.max_user_client_connections);
    // The console has no entry of its own (a `*` entry is not it): the global cap.
    let entry = match database == crate::config::databases::ADMIN_DB {
        true => None,
        false => config.database(database),
    };
    let per_database = own_cap(entry.and_then(|d| d.max_db_client_connections))
        .unwrap_or(s.max_db_client_connections);
    CapLimits {
        per_role: per_role as usize,
        per_database: per_database as usize,
    }
}

/// Raises the soft limit on open files towards `wanted` (never past the hard limit), as a
/// pooler with many clients needs; returns the soft limit in force afterwards.
pub fn raise_fd_limit(wanted: u64) -> std::io::Result<u64> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    let target = wanted.min(hard);
    if soft >= target {
        return Ok(soft);
    }
    // Raising the soft limit up to the hard limit needs no privilege.
    setrlimit(Resource::RLIMIT_NOFILE, target, hard)?;
    Ok(target)
}
