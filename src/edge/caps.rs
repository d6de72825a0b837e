//! Client connection caps per role (`max_user_client_connections`) and per database
//! (`max_db_client_connections`), counted once a client has authenticated, as PostgreSQL
//! counts its own: a client waiting at the password prompt holds no slot, so nobody can use
//! up a role's slots without its password.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::sync::lock;

/// The caps that apply to one login; 0 is unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CapLimits {
    pub per_role: usize,
    pub per_database: usize,
}

/// Which cap a login is over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CapRefusal {
    Role,
    Database,
}

#[derive(Debug, Default)]
struct Counts {
    roles: HashMap<String, usize>,
    databases: HashMap<String, usize>,
}

/// Authenticated clients per role and per database.
#[derive(Debug, Default)]
pub struct ClientCaps {
    counts: Mutex<Counts>,
}

impl ClientCaps {
    /// Counts an authenticated client, or says which cap it is over. The slot is held until
    /// the guard drops.
    pub fn admit(
        self: &Arc<Self>,
        role: &str,
        database: &str,
        limits: CapLimits,
    ) -> Result<CapGuard, CapRefusal> {
        let mut counts = lock(&self.counts);
        // The database's cap first, as PgBouncer checks them.
        let db_now = counts.databases.get(database).copied().unwrap_or(0);
        if limits.per_database > 0 && db_now >= limits.per_database {
            return Err(CapRefusal::Database);
        }
        let role_now = counts.roles.get(role).copied().unwrap_or(0);
        if limits.per_role > 0 && role_now >= limits.per_role {
            return Err(CapRefusal::Role);
        }
        *counts.roles.entry(role.to_string()).or_insert(0) += 1;
        *counts.databases.entry(database.to_string()).or_insert(0) += 1;
        Ok(CapGuard {
            caps: self.clone(),
            role: role.to_string(),
            database: database.to_string(),
        })
    }

    /// Authenticated clients of `role` now.
    pub fn role_count(&self, role: &str) -> usize {
        lock(&self.counts).roles.get(role).copied().unwrap_or(0)
    }

    /// Authenticated clients of `database` now.
    pub fn database_count(&self, database: &str) -> usize {
        lock(&self.counts)
            .databases
            .get(database)
            .copied()
            .unwrap_or(0)
    }
}

/// One counted client; dropping it frees the slot.
#[derive(Debug)]
pub struct CapGuard {
    caps: Arc<ClientCaps>,
    role: String,
    database: String,
}

impl Drop for CapGuard {
    fn drop(&mut self) {
        let mut counts = lock(&self.caps.counts);
        release(&mut counts.roles, &self.role);
        release(&mut counts.databases, &self.database);
    }
}

fn release(map: &mut HashMap<String, usize>, key: &str) {
    if let Some(n) = map.get_mut(key) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            map.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_and_database_caps_hold_and_free() {
        let caps = Arc::new(ClientCaps::default());
        let limits = CapLimits {
            per_role: 2,
            per_database: 3,
        };
        let a = caps.admit("alice", "app", limits).unwrap();
        let b = caps.admit("alice", "app", limits).unwrap();
        assert_eq!(
            caps.admit("alice", "app", limits).unwrap_err(),
            CapRefusal::Role
        );
        let c = caps.admit("bob", "app", limits).unwrap();
        assert_eq!(
            caps.admit("carol", "app", limits).unwrap_err(),
            CapRefusal::Database
        );
        assert!(caps.admit("carol", "other", limits).is_ok());
        drop(a);
        assert_eq!(caps.role_count("alice"), 1);
        assert!(caps.admit("alice", "app", limits).is_ok());
        drop((b, c));
        assert_eq!(caps.role_count("alice"), 0);
        assert_eq!(caps.database_count("app"), 0);
    }

    #[test]
    fn zero_is_unlimited() {
        let caps = Arc::new(ClientCaps::default());
        let guards: Vec<_> = (0..100)
            .map(|_| caps.admit("u", "d", CapLimits::default()).unwrap())
            .collect();
        assert_eq!(caps.role_count("u"), 100);
        drop(guards);
        assert_eq!(caps.role_count("u"), 0);
    }
}
