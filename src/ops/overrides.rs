//! Runtime limits: `SET USER name = '...'` and `SET POOL user.db = '...'` from the console,
//! kept across reloads, and eviction when a limit drops below what is in use (idle servers
//! first, then the oldest servers in use, at their next release).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use crate::config::{Config, PoolOverride, UserDef};
use crate::pool::Pool;

use super::clients::ClientRegistry;

/// Values set from the console, laid over every configuration that is loaded.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Overrides {
    users: Vec<UserDef>,
    pools: Vec<PoolOverride>,
}

impl Overrides {
    /// Records `SET USER name = 'settings'`; the settings are checked first.
    pub fn set_user(&mut self, name: &str, settings: &str) -> Result<UserDef, String> {
        let parsed = UserDef::parse(name, settings)?;
        match self.users.iter_mut().find(|u| u.name == name) {
            Some(old) => merge_user(old, &parsed),
            None => self.users.push(parsed.clone()),
        }
        Ok(parsed)
    }

    /// Records `SET POOL user.db = 'settings'`.
    pub fn set_pool(&mut self, key: &str, settings: &str) -> Result<PoolOverride, String> {
        let parsed = PoolOverride::parse(key, settings)?;
        match self
            .pools
            .iter_mut()
            .find(|p| p.user == parsed.user && p.db == parsed.db)
        {
            Some(old) => *old = parsed.clone(),
            None => self.pools.push(parsed.clone()),
        }
        Ok(parsed)
    }

    /// Lays the recorded values over `config`.
    pub fn apply(&self, config: &mut Config) {
        for user in &self.users {
            match config.users.iter_mut().find(|u| u.name == user.name) {
                Some(old) => merge_user(old, user),
                None => config.users.push(user.clone()),
            }
        }
        for pool in &self.pools {
            config
                .pools
                .retain(|p| !(p.user == pool.user && p.db == pool.db));
            config.pools.push(pool.clone());
        }
    }
}

/// Copies every value `new` sets into `old`.
fn merge_user(old: &mut UserDef, new: &UserDef) {
    macro_rules! take {
        ($($field:ident),*) => {
            $( if new.$field.is_some() { old.$field = new.$field; } )*
        };
    }
    take!(
        pool_mode,
        max_user_connections,
        max_user_client_connections,
        pool_size,
        reserve_pool_size,
        query_timeout,
        query_wait_timeout,
        idle_transaction_timeout,
        transaction_timeout,
        client_idle_timeout
    );
}

/// Brings every pool within its limits: a pool over its pool size and reserve, or the pools of a server
/// user over max_user_connections, close idle servers first, then mark their oldest servers
/// in use to close at release. Returns how many servers were closed or marked.
pub fn enforce(pools: &[Arc<Pool>], clients: &ClientRegistry) -> usize {
    let in_use = servers_in_use(clients);
    let mut acted = 0;
    for pool in pools {
        // The reserve's servers are within the pool's limits, as in PgBouncer; a pool_size of
        // 0 is no limit of the pool's own.
        let limits = &pool.settings().limits;
        if limits.pool_size > 0 {
            let limit = limits.pool_size + limits.reserve_pool_size;
            acted += shed(std::slice::from_ref(pool), limit, &in_use);
        }
    }
    let mut by_user: HashMap<String, Vec<Arc<Pool>>> = HashMap::new();
    for pool in pools {
        by_user
            .entry(pool.settings().target.user.clone())
            .or_default()
            .push(pool.clone());
    }
    for group in by_user.values() {
        let max = group
            .iter()
            .map(|p| p.settings().limits.max_user_connections)
            .filter(|m| *m > 0)
            .min();
        if let Some(max) = max {
            acted += shed(group, max, &in_use);
        }
    }
    acted
}

/// Servers in use, by (database, user) of the pool: (server id, opened at).
type InUse = HashMap<(String, String), Vec<(u64, Instant)>>;

fn servers_in_use(clients: &ClientRegistry) -> InUse {
    let mut map: InUse = HashMap::new();
    for c in clients.all() {
        let info = c.info();
        if let Some(s) = info.server {
            map.entry((info.database, info.pool_user))
                .or_default()
                .push((s.id, s.created));
        }
    }
    map
}

/// Closes or marks servers of `group` until at most `limit` remain that will stay.
fn shed(group: &[Arc<Pool>], limit: usize, in_use: &InUse) -> usize {
    let kept = |p: &Pool| {
        let s = p.stats();
        let busy = in_use
            .get(&(p.key.db.clone(), p.key.user.clone()))
            .map_or(0, |v| {
                v.iter()
                    .filter(|(id, t)| !p.closing.close_needed(*id, *t))
                    .count()
            });
        s.idle + s.connecting + busy.min(s.active)
    };
    let mut excess = group
        .iter()
        .map(|p| kept(p))
        .sum::<usize>()
        .saturating_sub(limit);
    let mut acted = 0;
    for pool in group {
        while excess > 0 && pool.evict_idle() {
            excess -= 1;
            acted += 1;
        }
    }
    if excess == 0 {
        return acted;
    }
    let mut busy: Vec<(Instant, u64, &Arc<Pool>)> = Vec::new();
    for pool in group {
        if let Some(list) = in_use.get(&(pool.key.db.clone(), pool.key.user.clone())) {
            for (id, created) in list {
                if !pool.closing.close_needed(*id, *created) {
                    busy.push((*created, *id, pool));
                }
            }
        }
    }
    busy.sort_by_key(|(created, id, _)| (*created, *id));
    for (_, id, pool) in busy.into_iter().take(excess) {
        pool.closing.evict([id]);
        acted += 1;
    }
    acted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_merge_and_apply() {
        let mut o = Overrides::default();
        o.set_user("app", "max_user_connections=40").unwrap();
        o.set_user("app", "pool_size=5").unwrap();
        assert!(o.set_user("app", "bogus=1").is_err());
        o.set_pool("app.db", "pool_size=3").unwrap();
        assert!(o.set_pool("nodot", "pool_size=3").is_err());
        let mut config = crate::config::parse_str(
            "[pgbouncer]\n[users]\napp = pool_mode=transaction max_user_connections=60\n",
            "t.ini",
            std::path::Path::new("/"),
        )
        .unwrap();
        o.apply(&mut config);
        let app = config.user("app").unwrap();
        assert_eq!(app.max_user_connections, Some(40));
        assert_eq!(app.pool_size, Some(5));
        assert_eq!(app.pool_mode, Some(crate::config::PoolMode::Transaction));
        assert_eq!(config.pools.len(), 1);
        assert_eq!(config.pools[0].pool_size, Some(3));
    }
}
