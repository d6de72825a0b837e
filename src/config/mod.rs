//! Configuration: a `pgbouncer.ini`-compatible file, read with PgBouncer's rules and defaults.
//!
//! Sections: `[pgbouncer]` (or `[pgward]`) holds [`Settings`]; `[databases]` maps client-side
//! database names to servers ([`DatabaseDef`], with `*` as the fallback); `[users]` holds
//! per-user settings ([`UserDef`]); `[peers]` lists peer poolers ([`PeerDef`]); pgward's
//! `[pools]` sets pool sizes per user and database ([`PoolOverride`]). Any other section is an
//! error, as in PgBouncer.
//!
//! Differences from PgBouncer, all on the side of refusing doubtful input: numbers inside
//! connection strings must be numbers (PgBouncer's `atoi` reads garbage as 0), the `*` entry
//! is checked at load, and a broken auth file line fails the load. Unknown keys in the main
//! section are accepted with a warning instead of failing.

pub mod connstr;
pub mod databases;
pub mod error;
pub mod ini;
pub mod settings;
pub mod userlist;
pub mod users;
pub mod values;

use std::path::{Path, PathBuf};

pub use databases::{DatabaseDef, LoadBalanceHosts, PeerDef};
pub use error::ConfigError;
pub use ini::Loc;
pub use settings::{
    AuthType, LogLines, PoolMode, ServerCheck, SetOutcome, Settings, SslMode,
    DEFAULT_MAX_STATEMENT_STATS,
};
pub use userlist::{load_userlist, parse_userlist, Secret};
pub use users::{PoolOverride, UserDef};

/// Name of the fallback entry in `[databases]`.
pub const AUTODB: &str = "*";

/// A whole configuration as read from a file.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The main section.
    pub settings: Settings,
    /// `[databases]` entries in file order, without the `*` entry.
    pub databases: Vec<DatabaseDef>,
    /// The `*` entry of `[databases]`, if any (its `name` is `*`).
    pub autodb: Option<DatabaseDef>,
    /// `[users]` entries in file order.
    pub users: Vec<UserDef>,
    /// `[pools]` entries in file order.
    pub pools: Vec<PoolOverride>,
    /// `[peers]` entries in file order.
    pub peers: Vec<PeerDef>,
    /// Non-fatal findings, each starting with `file:line:`.
    pub warnings: Vec<String>,
    /// The file this was read from (the name given to [`parse_str`] otherwise).
    pub path: PathBuf,
}

/// Reads the configuration file at `path`.
///
/// `%include` paths that are not absolute are taken relative to the working directory, as
/// PgBouncer does.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let base_dir = std::env::current_dir().map_err(|source| ConfigError::Io {
        file: PathBuf::from("."),
        source,
    })?;
    let items = ini::parse_file(path, &base_dir)?;
    build(items, path)
}

/// Parses configuration text named `file_name`; relative `%include` paths are taken relative
/// to `base_dir`.
pub fn parse_str(text: &str, file_name: &str, base_dir: &Path) -> Result<Config, ConfigError> {
    let items = ini::parse(text, file_name, base_dir)?;
    build(items, Path::new(file_name))
}

impl Config {
    /// Whether auth_query runs as `user` on database `db` for the clients of some database:
    /// of `db` itself (its auth_dbname, by default itself), or of an entry whose auth_dbname
    /// names `db`.
    pub fn runs_auth_query_as(&self, db: &DatabaseDef, user: &str) -> bool {
        let s = &self.settings;
        let runs_on = |d: &DatabaseDef| {
            let auth_user = d.auth_user.as_deref().or(s.auth_user.as_deref());
            let auth_db = d.auth_dbname.as_deref().or(s.auth_dbname.as_deref());
            auth_user == Some(user) && auth_db.unwrap_or(&d.name) == db.name
        };
        runs_on(db) || self.databases.iter().any(runs_on)
    }

    /// The `[databases]` entry of `name` itself (not one the `*` entry would make).
    pub fn own_entry(&self, name: &str) -> Option<&DatabaseDef> {
        self.databases.iter().find(|d| d.name == name)
    }

    /// The entry for client-side database `name`: its own entry, or else one made from the
    /// `*` entry, named `name` and keeping the `*` entry's `dbname` if it has one.
    pub fn database(&self, name: &str) -> Option<DatabaseDef> {
        if let Some(db) = self.own_entry(name) {
            return Some(db.clone());
        }
        let mut db = self.autodb.clone()?;
        db.name = name.to_string();
        Some(db)
    }

    /// The `[users]` entry of `name`.
    pub fn user(&self, name: &str) -> Option<&UserDef> {
        self.users.iter().find(|u| u.name == name)
    }

    /// Pool mode of a pool: the user's, else the database's, else the global one.
    pub fn pool_mode_for(&self, db: &DatabaseDef, user: &str) -> PoolMode {
        self.user(user)
            .and_then(|u| u.pool_mode)
            .or(db.pool_mode)
            .unwrap_or(self.settings.pool_mode)
    }

    /// Pool size of the pool of `user` (the forced user if the database has one) on `db`:
    /// the `[pools]` entry, else the user's, else the database's, else `default_pool_size`.
    pub fn pool_size_for(&self, db: &DatabaseDef, user: &str) -> u32 {
        self.pools
            .iter()
            .rev()
            .find(|p| p.user == user && p.db == db.name)
            .and_then(|p| p.pool_size)
            .or_else(|| self.user(user).and_then(|u| u.pool_size))
            .or(db.pool_size)
            .unwrap_or(self.settings.default_pool_size)
    }
}

/// The section being read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Section {
    None,
    Main,
    Databases,
    Users,
    Peers,
    Pools,
}

impl Section {
    fn from_name(name: &str) -> Option<Section> {
        match name {
            "pgbouncer" | "pgward" => Some(Section::Main),
            "databases" => Some(Section::Databases),
            "users" => Some(Section::Users),
            "peers" => Some(Section::Peers),
            "pools" => Some(Section::Pools),
            _ => None,
        }
    }
}

/// Turns INI items into a [`Config`].
struct Builder {
    config: Config,
    section: Section,
    main_seen: bool,
}

fn build(items: Vec<ini::Item>, path: &Path) -> Result<Config, ConfigError> {
    let mut b = Builder {
        config: Config {
            settings: Settings::default(),
            databases: Vec::new(),
            autodb: None,
            users: Vec::new(),
            pools: Vec::new(),
            peers: Vec::new(),
            warnings: Vec::new(),
            path: path.to_path_buf(),
        },
        section: Section::None,
        main_seen: false,
    };
    for item in items {
        match item {
            ini::Item::Section { name, loc } => b.section(&name, &loc)?,
            ini::Item::Entry(entry) => b.entry(entry)?,
        }
    }
    b.finish()
}

impl Builder {
    fn section(&mut self, name: &str, loc: &Loc) -> Result<(), ConfigError> {
        self.section = Section::from_name(name)
            .ok_or_else(|| loc.error(format!("unknown section [{name}]")))?;
        if self.section == Section::Main {
            if self.main_seen {
                self.config.settings.reset_to_defaults();
                self.config.warnings.push(format!(
                    "{loc}: repeated [{name}] section: settings before it are reset to their defaults"
                ));
            }
            self.main_seen = true;
        }
        Ok(())
    }

    fn entry(&mut self, e: ini::Entry) -> Result<(), ConfigError> {
        let c = &mut self.config;
        match self.section {
            Section::None => return Err(e.loc.error(format!("key {} outside any section", e.key))),
            Section::Main => self.main_entry(e)?,
            Section::Databases => self.database_entry(e)?,
            Section::Users => {
                let user = UserDef::parse(&e.key, &e.value).map_err(|m| e.loc.error(m))?;
                upsert(&mut c.users, user, |a, b| a.name == b.name);
            }
            Section::Peers => {
                let peer = PeerDef::parse(&e.key, &e.value).map_err(|m| e.loc.error(m))?;
                upsert(&mut c.peers, peer, |a, b| a.id == b.id);
            }
            Section::Pools => {
                let pool = PoolOverride::parse(&e.key, &e.value).map_err(|m| e.loc.error(m))?;
                upsert(&mut c.pools, pool, |a, b| a.user == b.user && a.db == b.db);
            }
        }
        Ok(())
    }

    fn main_entry(&mut self, e: ini::Entry) -> Result<(), ConfigError> {
        let outcome = self
            .config
            .settings
            .set(&e.key, &e.value)
            .map_err(|m| e.loc.error(m))?;
        let key = e.key.to_ascii_lowercase();
        let note = match outcome {
            SetOutcome::Applied => return Ok(()),
            SetOutcome::NotImplemented => "is not implemented by pgward; ignored",
            SetOutcome::Unknown => "is unknown; ignored",
        };
        self.config
            .warnings
            .push(format!("{}: parameter {key} {note}", e.loc));
        Ok(())
    }

    fn database_entry(&mut self, e: ini::Entry) -> Result<(), ConfigError> {
        let db = DatabaseDef::parse(&e.key, &e.value).map_err(|m| e.loc.error(m))?;
        if db.name == AUTODB {
            self.config.autodb = Some(db);
        } else {
            upsert(&mut self.config.databases, db, |a, b| a.name == b.name);
        }
        Ok(())
    }

    fn finish(self) -> Result<Config, ConfigError> {
        let file = self.config.path.display().to_string();
        if !self.main_seen {
            return Err(ConfigError::File {
                file,
                msg: "main section [pgbouncer] missing".into(),
            });
        }
        self.config
            .settings
            .validate()
            .map_err(|msg| ConfigError::File { file, msg })?;
        Ok(self.config)
    }
}

/// Replaces the element `same` as `item` in place (a later entry wins), or appends it.
fn upsert<T>(list: &mut Vec<T>, item: T, same: impl Fn(&T, &T) -> bool) {
    match list.iter_mut().find(|old| same(old, &item)) {
        Some(old) => *old = item,
        None => list.push(item),
    }
}

#[cfg(test)]
mod tests;
