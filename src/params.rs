//! Session parameters that must follow a client from server to server.

/// The parameters PgBouncer tracks by default; `track_extra_parameters` adds to them.
pub const DEFAULT_TRACKED: [&str; 6] = [
    "client_encoding",
    "DateStyle",
    "TimeZone",
    "IntervalStyle",
    "standard_conforming_strings",
    "application_name",
];

/// Tracked, never reported (see [`Tracked::of`]).
pub const EXTRA_FLOAT_DIGITS: &str = "extra_float_digits";

/// The value of a tracked parameter a client never set and the server never reported: the
/// server's default, set with `SET name TO DEFAULT`. It contains a NUL byte, which no value
/// sent over the protocol can.
pub const DEFAULT_VALUE: &str = "\0DEFAULT";

/// Which parameter names are tracked, in the spelling the server reports them.
#[derive(Debug, Clone)]
pub struct Tracked {
    names: Vec<String>,
}

impl Tracked {
    /// The default list plus `extra` (case-insensitive, duplicates ignored).
    pub fn new<S: AsRef<str>>(extra: &[S]) -> Self {
        let mut names: Vec<String> = DEFAULT_TRACKED.iter().map(|s| s.to_string()).collect();
        for e in extra {
            let e = e.as_ref().trim();
            if is_plain_name(e) && !names.iter().any(|n| n.eq_ignore_ascii_case(e)) {
                names.push(e.to_string());
            }
        }
        Tracked { names }
    }

    /// What the settings track: the default list, `track_extra_parameters`, and
    /// `extra_float_digits` (pgJDBC sends it at every login; it changes how floats are
    /// printed; where `ignore_startup_parameters` names it, a client's value is ignored at
    /// login as PgBouncer ignores it). PostgreSQL never reports it: a server holds the value
    /// pgward set there, or its default after a reset.
    pub fn of(settings: &crate::config::settings::Settings) -> Self {
        let mut extra = settings.track_extra_parameters.clone();
        extra.push(EXTRA_FLOAT_DIGITS.to_string());
        Tracked::new(&extra)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.names.iter().map(|s| s.as_str())
    }

    /// The canonical spelling of `name` if it is tracked.
    pub fn canonical(&self, name: &str) -> Option<&str> {
        self.names
            .iter()
            .find(|n| n.eq_ignore_ascii_case(name))
            .map(|s| s.as_str())
    }
}

/// A name that can stand unquoted after SET.
fn is_plain_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
}

/// A server's value of a setting PostgreSQL never reports, when a client's text may have
/// changed it: it equals no client's value (it holds a NUL), so the next client's is set.
pub const UNKNOWN_VALUE: &str = "\0UNKNOWN";

/// Values of tracked parameters, keyed by canonical name.
#[derive(Debug, Clone, Default)]
pub struct ParamSet {
    entries: Vec<(String, String)>,
    /// Every entry, sorted by name, each part preceded by its length: two sets are equal
    /// when their keys are. Comparing is one memcmp, which the session does at every
    /// checkout.
    key: Vec<u8>,
    /// Changes made so far: a reading of the set stays true while this stays the same.
    changes: u64,
}

impl PartialEq for ParamSet {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key
    }
}

impl Eq for ParamSet {}

impl ParamSet {
    pub fn get(&self, name: &str) -> Option<&str> {
        self.entries
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// A `DISCARD ALL` or `RESET ALL` ran: the settings PostgreSQL does not report
    /// (`extra_float_digits`) are at the server's default, if they were followed at all.
    pub fn reset_unreported(&mut self) {
        if self.get(EXTRA_FLOAT_DIGITS).is_some() {
            self.set(EXTRA_FLOAT_DIGITS, DEFAULT_VALUE);
        }
    }

    /// A server's settings that PostgreSQL never reports may have been changed by a client
    /// without pgward seeing how: their values are unknown (see [`UNKNOWN_VALUE`]).
    pub fn forget_unreported(&mut self) {
        self.set(EXTRA_FLOAT_DIGITS, UNKNOWN_VALUE);
    }

    /// Whether a setting PostgreSQL never reports has an unknown value here.
    pub fn unreported_unknown(&self) -> bool {
        self.get(EXTRA_FLOAT_DIGITS) == Some(UNKNOWN_VALUE)
    }

    /// Sets a value; returns whether it changed.
    pub fn set(&mut self, name: &str, value: &str) -> bool {
        match self.entries.iter_mut().find(|(n, _)| n == name) {
            Some((_, v)) if v == value => return false,
            Some((_, v)) => *v = value.to_string(),
            None => self.entries.push((name.to_string(), value.to_string())),
        }
        self.rekey();
        true
    }

    /// How many changes the set has seen: equal counts of one set mean the same values.
    pub fn changes(&self) -> u64 {
        self.changes
    }

    fn rekey(&mut self) {
        self.changes += 1;
        let mut sorted: Vec<&(String, String)> = self.entries.iter().collect();
        sorted.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        self.key.clear();
        for part in sorted.into_iter().flat_map(|(n, v)| [n, v]) {
            self.key.extend_from_slice(&part.len().to_le_bytes());
            self.key.extend_from_slice(part.as_bytes());
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.entries.iter().map(|(n, v)| (n.as_str(), v.as_str()))
    }

    /// The entries of `self` that `other` lacks or holds with another value.
    pub fn differences<'a>(&'a self, other: &'a ParamSet) -> Vec<(&'a str, &'a str)> {
        self.iter()
            .filter(|(n, v)| other.get(n) != Some(v))
            .collect()
    }

    /// What must be set on a server holding `server` for it to hold these values, as
    /// (name, value) pairs. A setting the server never reported and pgward never set there is
    /// still at its default, so a default value is nothing to set (PgBouncer skips it too);
    /// `server` records it as held at its default, so that the next client holding the same
    /// set finds the two equal.
    pub fn to_set_on(&self, server: &mut ParamSet) -> Vec<(String, String)> {
        let mut at_default = Vec::new();
        let mut diffs = Vec::new();
        for (name, value) in self.differences(server) {
            match value == DEFAULT_VALUE && server.get(name).is_none() {
                true => at_default.push(name.to_string()),
                false => diffs.push((name.to_string(), value.to_string())),
            }
        }
        for name in &at_default {
            server.set(name, DEFAULT_VALUE);
        }
        diffs
    }
}

/// Whether a client's text names a setting PostgreSQL never reports (`extra_float_digits`,
/// in any case): the server's value is then unknown until pgward reads it.
pub fn names_unreported(text: &[u8]) -> bool {
    const NAME: &[u8] = EXTRA_FLOAT_DIGITS.as_bytes();
    // The name's first underscore is its sixth byte.
    memchr::memchr_iter(b'_', text).any(|i| {
        i >= 5
            && text
                .get(i - 5..i - 5 + NAME.len())
                .is_some_and(|w| w.eq_ignore_ascii_case(NAME))
    })
}

/// The statement that makes a server read the next text as UTF-8 (see [`set_statement`]).
pub const UTF8_FIRST: &str = "SET client_encoding TO 'UTF8'";

/// `SET name TO E'value'; ...` for each pair, quoted so that no value can end the literal
/// whatever `standard_conforming_strings` says. The server reads the text in the
/// client_encoding it holds when the text arrives: one with a value outside ASCII goes only to
/// a server that reads UTF-8 ([`UTF8_FIRST`] first where it does not), since in an encoding
/// such as SJIS or BIG5 a byte of a character may be a backslash, which would end the literal
/// early and run the rest as SQL.
pub fn set_statement(pairs: &[(&str, &str)]) -> String {
    let mut sql = String::new();
    for (name, value) in pairs {
        sql.push_str("SET ");
        sql.push_str(name);
        if *value == DEFAULT_VALUE {
            sql.push_str(" TO DEFAULT;");
            continue;
        }
        sql.push_str(" TO E'");
        for c in value.chars() {
            match c {
                '\'' => sql.push_str("''"),
                '\\' => sql.push_str("\\\\"),
                c => sql.push(c),
            }
        }
        sql.push_str("';");
    }
    sql
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unreported_names_are_found_in_any_case_and_place() {
        for text in [
            "SET extra_float_digits = 3",
            "set EXTRA_FLOAT_DIGITS to 3",
            "SELECT set_config('Extra_Float_Digits', '1', false)",
            "extra_float_digits",
            "SET \"extra_float_digits\" = 3",
        ] {
            assert!(names_unreported(text.as_bytes()), "{text}");
        }
        for text in [
            "",
            "SELECT 1",
            "SET float_digits = 3",
            "xtra_float_digits",
            "extra_float_digit",
        ] {
            assert!(!names_unreported(text.as_bytes()), "{text}");
        }
    }

    #[test]
    fn tracked_names_are_case_insensitive_and_canonical() {
        let t = Tracked::new(&["search_path", "DATESTYLE", "bad name;"]);
        assert_eq!(t.canonical("datestyle"), Some("DateStyle"));
        assert_eq!(t.canonical("SEARCH_PATH"), Some("search_path"));
        assert_eq!(t.canonical("bad name;"), None);
        assert_eq!(t.canonical("work_mem"), None);
    }

    #[test]
    fn differences_list_what_the_other_lacks() {
        let mut a = ParamSet::default();
        let mut b = ParamSet::default();
        a.set("TimeZone", "UTC");
        a.set("DateStyle", "ISO, MDY");
        b.set("DateStyle", "ISO, MDY");
        assert_eq!(a.differences(&b), vec![("TimeZone", "UTC")]);
        assert!(b.set("TimeZone", "UTC"));
        assert!(!b.set("TimeZone", "UTC"));
        assert!(a.differences(&b).is_empty());
    }

    #[test]
    fn equality_ignores_order_and_sees_every_byte() {
        let mut a = ParamSet::default();
        let mut b = ParamSet::default();
        a.set("TimeZone", "UTC");
        a.set("DateStyle", "ISO, MDY");
        b.set("DateStyle", "ISO, MDY");
        assert_ne!(a, b);
        b.set("TimeZone", "UTC");
        assert_eq!(a, b);
        b.set("TimeZone", "UTC ");
        assert_ne!(a, b);
        // Parts cannot run into each other.
        let mut c = ParamSet::default();
        let mut d = ParamSet::default();
        c.set("a", "bc");
        d.set("ab", "c");
        assert_ne!(c, d);
    }

    #[test]
    fn a_default_the_server_never_reported_is_nothing_to_set_and_is_recorded() {
        let mut client = ParamSet::default();
        client.set("search_path", DEFAULT_VALUE);
        client.set("TimeZone", "UTC");
        let mut server = ParamSet::default();
        server.set("TimeZone", "UTC");
        assert_ne!(client, server);
        assert!(client.to_set_on(&mut server).is_empty());
        assert_eq!(client, server, "the next checkout sees them equal");
        // A value the server holds is set back to the default; another value is set.
        server.set("search_path", "app");
        client.set("TimeZone", "Europe/Paris");
        assert_eq!(
            client.to_set_on(&mut server),
            [
                ("search_path".to_string(), DEFAULT_VALUE.to_string()),
                ("TimeZone".to_string(), "Europe/Paris".to_string())
            ]
        );
    }

    #[test]
    fn default_values_are_reset() {
        assert_eq!(
            set_statement(&[("search_path", DEFAULT_VALUE), ("TimeZone", "UTC")]),
            "SET search_path TO DEFAULT;SET TimeZone TO E'UTC';"
        );
    }

    #[test]
    fn set_statement_quotes_values() {
        assert_eq!(
            set_statement(&[("application_name", "it's a \\ test")]),
            "SET application_name TO E'it''s a \\\\ test';"
        );
    }
}
