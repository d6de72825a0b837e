//! The learned allowlist: per role, the fingerprints it may run.
//!
//! The file is JSON a person can review and edit: `{"role": {"fingerprint": "normalized text"}}`.
//! Learning stops at [`MAX_PER_ROLE`] statements per role, so an application that inlines its
//! values cannot grow the list without end.

use super::PolicyError;
use crate::sql::Fingerprint;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Most fingerprints learned for one role.
pub const MAX_PER_ROLE: usize = 10_000;
/// Largest allowlist file read.
const MAX_FILE_BYTES: u64 = 64 << 20;

type Roles = BTreeMap<String, BTreeMap<String, String>>;

/// What learning a statement did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Learned {
    /// Recorded now.
    New,
    /// Already recorded.
    Known,
    /// Not recorded: the role has [`MAX_PER_ROLE`] statements already.
    Full,
}

#[derive(Debug, Default)]
struct State {
    roles: Roles,
    dirty: bool,
}

/// The allowlist and the file it is kept in.
#[derive(Debug)]
pub struct Allowlist {
    path: PathBuf,
    state: Mutex<State>,
}

impl Allowlist {
    /// Reads the file at `path`; a missing file is an empty list.
    pub fn load(path: &Path) -> Result<Allowlist, PolicyError> {
        let roles = match std::fs::metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Roles::new(),
            Err(source) => {
                return Err(PolicyError::Io {
                    file: path.to_path_buf(),
                    source,
                })
            }
            Ok(meta) if meta.len() > MAX_FILE_BYTES => {
                return Err(PolicyError::Allowlist {
                    file: path.to_path_buf(),
                    message: "file too large".into(),
                })
            }
            Ok(_) => read(path)?,
        };
        Ok(Allowlist {
            path: path.to_path_buf(),
            state: Mutex::new(State {
                roles,
                dirty: false,
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        crate::sync::lock(&self.state)
    }

    /// The file this list is kept in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether `role` may run `fingerprint`.
    pub fn contains(&self, role: &str, fingerprint: Fingerprint) -> bool {
        let key = HexKey::new(fingerprint);
        self.lock()
            .roles
            .get(role)
            .is_some_and(|fps| fps.contains_key(key.as_str()))
    }

    /// How many fingerprints `role` has.
    pub fn len(&self, role: &str) -> usize {
        self.lock().roles.get(role).map_or(0, BTreeMap::len)
    }

    /// Records that `role` runs `fingerprint` (with its normalized `text`, for the reader).
    pub fn learn(&self, role: &str, fingerprint: Fingerprint, text: &str) -> Learned {
        let key = HexKey::new(fingerprint);
        let mut state = self.lock();
        if let Some(fps) = state.roles.get(role) {
            if fps.contains_key(key.as_str()) {
                return Learned::Known;
            }
        }
        let fps = state.roles.entry(role.to_string()).or_default();
        if fps.len() >= MAX_PER_ROLE {
            return Learned::Full;
        }
        fps.insert(key.as_str().to_string(), text.to_string());
        state.dirty = true;
        Learned::New
    }

    /// Writes the list to its file (through a temporary file and a rename) if it changed since
    /// it was read or last saved. Returns whether it wrote.
    pub fn save(&self) -> Result<bool, PolicyError> {
        let mut state = self.lock();
        if !state.dirty {
            return Ok(false);
        }
        let io = |source| PolicyError::Io {
            file: self.path.clone(),
            source,
        };
        let json =
            serde_json::to_string_pretty(&state.roles).map_err(|e| PolicyError::Allowlist {
                file: self.path.clone(),
                message: e.to_string(),
            })?;
        let tmp = self.path.with_extension("tmp");
        std::fs::write(&tmp, json + "\n").map_err(io)?;
        std::fs::rename(&tmp, &self.path).map_err(io)?;
        state.dirty = false;
        Ok(true)
    }
}

/// A fingerprint's sixteen hex digits without an allocation, for lookups in the list.
struct HexKey([u8; 16]);

impl HexKey {
    fn new(fingerprint: Fingerprint) -> HexKey {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0u8; 16];
        for (i, byte) in out.iter_mut().enumerate() {
            let nibble = (fingerprint.0 >> (60 - 4 * i)) & 0xf;
            *byte = DIGITS[nibble as usize];
        }
        HexKey(out)
    }

    fn as_str(&self) -> &str {
        // Only ASCII hex digits are ever written.
        std::str::from_utf8(&self.0).unwrap_or("")
    }
}

fn read(path: &Path) -> Result<Roles, PolicyError> {
    let text = std::fs::read_to_string(path).map_err(|source| PolicyError::Io {
        file: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|e| PolicyError::Syntax {
        file: path.to_path_buf(),
        line: e.line(),
        message: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn learns_saves_and_reloads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("allow.json");
        let list = Allowlist::load(&path).unwrap();
        assert_eq!(
            list.learn("agent", Fingerprint(1), "SELECT $1"),
            Learned::New
        );
        assert_eq!(
            list.learn("agent", Fingerprint(1), "SELECT $1"),
            Learned::Known
        );
        assert!(list.save().unwrap());
        assert!(!list.save().unwrap());
        let again = Allowlist::load(&path).unwrap();
        assert!(again.contains("agent", Fingerprint(1)));
        assert!(!again.contains("agent", Fingerprint(2)));
        assert!(!again.contains("other", Fingerprint(1)));
    }

    #[test]
    fn hex_keys_match_the_fingerprint_text() {
        for v in [0, 1, 0xdead_beef, u64::MAX, 0x0123_4567_89ab_cdef] {
            assert_eq!(HexKey::new(Fingerprint(v)).as_str(), Fingerprint(v).hex());
        }
    }

    #[test]
    fn learning_stops_at_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let list = Allowlist::load(&dir.path().join("a.json")).unwrap();
        for i in 0..MAX_PER_ROLE as u64 {
            list.learn("r", Fingerprint(i), "x");
        }
        assert_eq!(list.learn("r", Fingerprint(u64::MAX), "x"), Learned::Full);
        assert_eq!(list.len("r"), MAX_PER_ROLE);
    }

    #[test]
    fn a_broken_file_says_where() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.json");
        std::fs::write(&path, "{\n\"r\": [}\n").unwrap();
        let err = Allowlist::load(&path).unwrap_err().to_string();
        assert!(err.contains("a.json:2"), "{err}");
    }
}
