//! The governance in force: the policy file read from `policy_file` and the analyzer sized
//! for what its rules need. Replaced whole on reload.

use std::sync::Arc;

use super::{Policy, PolicyError};
use crate::config::Settings;
use crate::sql::{Analyzer, DEFAULT_CACHE_ENTRIES};

pub struct Governance {
    pub policy: Policy,
    pub analyzer: Analyzer,
}

impl Governance {
    /// Reads the policy the settings name; `None` when there is none (no statement is read).
    pub fn load(settings: &Settings) -> Result<Option<Arc<Governance>>, PolicyError> {
        let Some(path) = &settings.policy_file else {
            return Ok(None);
        };
        let policy = Policy::load(path)?;
        let analyzer = Analyzer::new(policy.depth(), DEFAULT_CACHE_ENTRIES);
        Ok(Some(Arc::new(Governance { policy, analyzer })))
    }

    /// Writes what learn mode recorded to the allowlist file, if the policy has one.
    pub fn save_allowlist(&self) {
        if let Some(list) = self.policy.allowlist() {
            if let Err(e) = list.save() {
                tracing::error!("cannot save the learned allowlist: {e}");
            }
        }
    }
}
