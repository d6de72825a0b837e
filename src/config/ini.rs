//! A reader for the INI dialect of `pgbouncer.ini`.
//!
//! The grammar follows PgBouncer's configuration parser:
//!
//! * leading whitespace and blank lines are skipped;
//! * a line whose first non-blank character is `;` or `#` is a comment (these characters are
//!   not special later in a line, so `key = value ; note` has the value `value ; note`);
//! * `[name]` opens a section; the name is everything up to `]`, kept as written;
//! * `key = value`: the key is made of ASCII letters, digits and `_ . - *`, or is written
//!   between single quotes (`'any name' = ...`); the value is the rest of the line with
//!   surrounding blanks removed. Values are never unquoted here: quotes belong to the value;
//! * `%include path` reads another file in place. A relative path is taken relative to the
//!   base directory given to the reader (PgBouncer uses the process's working directory);
//!   nesting is limited to [`MAX_INCLUDE_DEPTH`] levels and include loops are refused.
//!
//! Keys are returned as written; callers decide about case.

use std::path::{Path, PathBuf};

use super::error::ConfigError;

/// Deepest `%include` nesting accepted (as in PgBouncer).
pub const MAX_INCLUDE_DEPTH: usize = 10;

/// Largest configuration file read, in bytes.
pub const MAX_FILE_SIZE: u64 = 16 * 1024 * 1024;

/// Where an item was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loc {
    /// File name (as given, or as resolved for included files).
    pub file: String,
    /// 1-based line number.
    pub line: usize,
}

impl Loc {
    /// Builds a [`ConfigError::At`] pointing at this place.
    pub fn error(&self, msg: impl Into<String>) -> ConfigError {
        ConfigError::at(&self.file, self.line, msg)
    }
}

impl std::fmt::Display for Loc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.file, self.line)
    }
}

/// A `key = value` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The key, as written (quotes removed when it was quoted).
    pub key: String,
    /// The value, blanks trimmed, otherwise untouched.
    pub value: String,
    /// Where the line is.
    pub loc: Loc,
}

/// One meaningful line of an INI file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    /// `[name]`.
    Section {
        /// The section name, as written.
        name: String,
        /// Where the header is.
        loc: Loc,
    },
    /// `key = value`.
    Entry(Entry),
}

/// Parses `text` (named `file_name` in errors), expanding `%include` relative to `base_dir`.
pub fn parse(text: &str, file_name: &str, base_dir: &Path) -> Result<Vec<Item>, ConfigError> {
    let mut reader = Reader {
        base_dir,
        stack: Vec::new(),
        items: Vec::new(),
    };
    reader.parse_text(text, file_name, 0)?;
    Ok(reader.items)
}

/// Reads and parses the file at `path`, expanding `%include` relative to `base_dir`.
pub fn parse_file(path: &Path, base_dir: &Path) -> Result<Vec<Item>, ConfigError> {
    let mut reader = Reader {
        base_dir,
        stack: Vec::new(),
        items: Vec::new(),
    };
    reader.parse_path(path, 0)?;
    Ok(reader.items)
}

/// Reads a whole text file, refusing files larger than [`MAX_FILE_SIZE`].
pub fn read_text(path: &Path) -> Result<String, ConfigError> {
    let io_err = |source| ConfigError::Io {
        file: path.to_path_buf(),
        source,
    };
    let len = std::fs::metadata(path).map_err(io_err)?.len();
    if len > MAX_FILE_SIZE {
        return Err(ConfigError::File {
            file: path.display().to_string(),
            msg: format!("file is larger than {MAX_FILE_SIZE} bytes"),
        });
    }
    std::fs::read_to_string(path).map_err(io_err)
}

struct Reader<'a> {
    base_dir: &'a Path,
    /// Canonical paths of the files being read, outermost first.
    stack: Vec<PathBuf>,
    items: Vec<Item>,
}

impl Reader<'_> {
    fn parse_path(&mut self, path: &Path, depth: usize) -> Result<(), ConfigError> {
        let text = read_text(path)?;
        let canonical = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        self.stack.push(canonical);
        let result = self.parse_text(&text, &path.display().to_string(), depth);
        self.stack.pop();
        result
    }

    fn include(&mut self, target: &str, loc: &Loc, depth: usize) -> Result<(), ConfigError> {
        if target.is_empty() {
            return Err(loc.error("%include without a file name"));
        }
        if depth + 1 > MAX_INCLUDE_DEPTH {
            return Err(loc.error("include nesting level too deep"));
        }
        let path = self.base_dir.join(target);
        let canonical = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
        if self.stack.contains(&canonical) {
            return Err(loc.error(format!(
                "include loop: {} is already being read",
                path.display()
            )));
        }
        self.parse_path(&path, depth + 1)
    }

    fn parse_text(&mut self, text: &str, file: &str, depth: usize) -> Result<(), ConfigError> {
        let mut cur = Cursor::new(text);
        loop {
            cur.skip_while(|b| b.is_ascii_whitespace());
            let Some(first) = cur.peek() else {
                return Ok(());
            };
            let loc = Loc {
                file: file.to_string(),
                line: cur.line,
            };
            if cur.rest().starts_with("%include")
                && matches!(cur.rest().as_bytes().get(8), Some(b' ' | b'\t'))
            {
                cur.advance(8);
                let target = cur.take_line().trim().to_string();
                self.include(&target, &loc, depth)?;
                continue;
            }
            match first {
                b'#' | b';' => {
                    cur.take_line();
                }
                b'[' => {
                    let name = section_header(&mut cur, &loc)?;
                    self.items.push(Item::Section { name, loc });
                }
                _ => {
                    let entry = key_value(&mut cur, loc)?;
                    self.items.push(Item::Entry(entry));
                }
            }
        }
    }
}

/// Reads `[name]`; the cursor is on `[`.
fn section_header(cur: &mut Cursor<'_>, loc: &Loc) -> Result<String, ConfigError> {
    cur.advance(1);
    let name = cur.take_while(|b| b != b']' && b != b'\n');
    if cur.peek() != Some(b']') {
        return Err(loc.error("syntax error: section header without closing ']'"));
    }
    cur.advance(1);
    Ok(name.to_string())
}

/// Reads `key = value`; the cursor is on the first character of the key.
fn key_value(cur: &mut Cursor<'_>, loc: Loc) -> Result<Entry, ConfigError> {
    let key = if cur.peek() == Some(b'\'') {
        cur.advance(1);
        let key = cur.take_while(|b| b != b'\'' && b != b'\n');
        if cur.peek() != Some(b'\'') || key.is_empty() {
            return Err(loc.error("syntax error: bad quoted key"));
        }
        cur.advance(1);
        key
    } else {
        cur.take_while(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-' | b'*'))
    };
    cur.skip_while(|b| b == b' ' || b == b'\t');
    if key.is_empty() || cur.peek() != Some(b'=') {
        return Err(loc.error("syntax error: expected 'key = value'"));
    }
    cur.advance(1);
    let value = cur
        .take_line()
        .trim_matches(|c: char| c.is_ascii_whitespace());
    Ok(Entry {
        key: key.to_string(),
        value: value.to_string(),
        loc,
    })
}

/// A position in a text that counts lines as it moves.
struct Cursor<'a> {
    text: &'a str,
    pos: usize,
    line: usize,
}

impl<'a> Cursor<'a> {
    fn new(text: &'a str) -> Self {
        Cursor {
            text,
            pos: 0,
            line: 1,
        }
    }

    fn rest(&self) -> &'a str {
        self.text.get(self.pos..).unwrap_or("")
    }

    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.pos).copied()
    }

    /// Moves over `n` ASCII bytes that contain no newline.
    fn advance(&mut self, n: usize) {
        self.pos = (self.pos + n).min(self.text.len());
    }

    /// Consumes bytes while `pred` holds; `pred` must only accept ASCII or only stop on ASCII,
    /// so the returned slice always ends on a character boundary.
    fn take_while(&mut self, pred: impl Fn(u8) -> bool) -> &'a str {
        let start = self.pos;
        while let Some(b) = self.peek() {
            if !pred(b) {
                break;
            }
            if b == b'\n' {
                self.line += 1;
            }
            self.pos += 1;
        }
        self.text.get(start..self.pos).unwrap_or("")
    }

    fn skip_while(&mut self, pred: impl Fn(u8) -> bool) {
        self.take_while(pred);
    }

    /// Consumes the rest of the line (not the newline itself).
    fn take_line(&mut self) -> &'a str {
        self.take_while(|b| b != b'\n')
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(text: &str) -> Vec<(String, String, usize)> {
        parse(text, "t.ini", Path::new("."))
            .unwrap()
            .into_iter()
            .filter_map(|i| match i {
                Item::Entry(e) => Some((e.key, e.value, e.loc.line)),
                Item::Section { .. } => None,
            })
            .collect()
    }

    #[test]
    fn sections_keys_values_and_lines() {
        let items = parse(
            "\n; comment\n# other\n[pgbouncer]\n  listen_port =  6432  \nx=\n",
            "t.ini",
            Path::new("."),
        )
        .unwrap();
        assert_eq!(
            items[0],
            Item::Section {
                name: "pgbouncer".into(),
                loc: Loc {
                    file: "t.ini".into(),
                    line: 4
                }
            }
        );
        let Item::Entry(e) = &items[1] else { panic!() };
        assert_eq!(
            (e.key.as_str(), e.value.as_str(), e.loc.line),
            ("listen_port", "6432", 5)
        );
        let Item::Entry(e) = &items[2] else { panic!() };
        assert_eq!((e.key.as_str(), e.value.as_str()), ("x", ""));
    }

    #[test]
    fn comment_chars_inside_values_are_kept() {
        let e = entries("[a]\nk = v ; not a comment # either\n");
        assert_eq!(e[0].1, "v ; not a comment # either");
    }

    #[test]
    fn quoted_keys_and_key_charset() {
        let e = entries("[d]\n'my db' = host=x\nfoo.bar-1* = y\r\n");
        assert_eq!(e[0].0, "my db");
        assert_eq!(e[1], ("foo.bar-1*".into(), "y".into(), 3));
    }

    #[test]
    fn syntax_errors_carry_line() {
        for (text, line) in [
            ("[a]\n\nfoo bar = 1\n", 3),
            ("[a\nk=v\n", 1),
            ("[a]\n= v\n", 2),
            ("[a]\n'' = v\n", 2),
            ("[a]\n'unterminated = v\n", 2),
            ("[a]\n\"x\" = v\n", 2),
        ] {
            match parse(text, "f.ini", Path::new(".")) {
                Err(ConfigError::At { file, line: l, .. }) => {
                    assert_eq!((file.as_str(), l), ("f.ini", line), "{text:?}")
                }
                other => panic!("{text:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn header_followed_by_entry_on_same_line() {
        let items = parse("[a] k = v\n", "t", Path::new(".")).unwrap();
        assert_eq!(items.len(), 2);
    }

    #[test]
    fn include_nested_relative_to_base_dir() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("b.ini"), "k2 = 2\n%include c.ini\n").unwrap();
        std::fs::write(dir.path().join("c.ini"), "\n\nk3 = 3\n").unwrap();
        let items = parse("[s]\nk1 = 1\n%include b.ini\nk4 = 4\n", "a.ini", dir.path()).unwrap();
        let keys: Vec<_> = items
            .iter()
            .filter_map(|i| match i {
                Item::Entry(e) => Some((e.key.clone(), e.loc.to_string())),
                _ => None,
            })
            .collect();
        let c = dir.path().join("c.ini").display().to_string();
        assert_eq!(keys[0], ("k1".into(), "a.ini:2".into()));
        assert_eq!(keys[2], ("k3".into(), format!("{c}:3")));
        assert_eq!(keys[3], ("k4".into(), "a.ini:4".into()));
    }

    #[test]
    fn include_loop_and_missing_file() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.ini");
        std::fs::write(&a, "[s]\n%include b.ini\n").unwrap();
        std::fs::write(dir.path().join("b.ini"), "%include a.ini\n").unwrap();
        let err = parse_file(&a, dir.path()).unwrap_err().to_string();
        assert!(err.contains("include loop"), "{err}");
        assert!(err.contains("b.ini:1"), "{err}");

        let err = parse("%include nope.ini\n", "m.ini", dir.path()).unwrap_err();
        assert!(matches!(err, ConfigError::Io { .. }), "{err}");
    }

    #[test]
    fn include_depth_limit() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..12 {
            let body = format!("k{i} = {i}\n%include f{}.ini\n", i + 1);
            std::fs::write(dir.path().join(format!("f{i}.ini")), body).unwrap();
        }
        let err = parse("%include f0.ini\n", "m.ini", dir.path())
            .unwrap_err()
            .to_string();
        assert!(err.contains("too deep"), "{err}");
    }

    #[test]
    fn percent_include_needs_blank() {
        let err = parse("[a]\n%includex\n", "m", Path::new(".")).unwrap_err();
        assert!(matches!(err, ConfigError::At { line: 2, .. }));
    }
}
