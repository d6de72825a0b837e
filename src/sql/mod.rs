//! Reading SQL with PostgreSQL's own parser (pg_query): fingerprints, normalized text,
//! statement types, functions, schemas, settings, sqlcommenter tags, and whether pgward can be
//! sure it reads a text as the server will.
//!
//! [`Analyzer::analyze`] returns a shared [`Analysis`]; callers keep it per prepared statement
//! and the analyzer keeps a bounded cache per statement text, so a repeated text is read once.
//!
//! Each question is answered with the cheapest pg_query call that can. Measured with
//! `cargo test --release --lib sql::tests::bench -- --ignored --nocapture` on a 2-core machine
//! shared with other builds, for `SELECT abalance FROM pgbench_accounts WHERE aid = 4711`:
//!
//! | call | µs per call | used for |
//! | --- | --- | --- |
//! | `scan_tokens` | 0.7 | tags (only when the text has `/*`), backslashes in strings |
//! | `normalize` | 3.5 | text for logs, constants replaced |
//! | `fingerprint` | 5.5 | the fingerprint; also proves the text parses |
//! | `parse` | 14.5 | the tree, for rules ([`Depth::Tree`]) |
//! | `parse` + the complete tree walk | 16.6 | |
//! | a cold analysis at [`Depth::Shape`] | 10.6 | fingerprint + normalize (+ scan); + parse and walk for the constants |
//! | a cold analysis at [`Depth::Tree`] | 26.6 | the above + parse + walk |
//! | a cache hit | 0.05 | |
//! | the same shape with other constants | 1.8 | scan + shape cache hit |
//!
//! A text missing from the cache is looked up by its shape (the text with its constants left
//! out, in `sql/shape.rs`): pgbench's simple protocol, where every text differs, then costs a
//! scan instead of a parse, without a rule ever seeing another text's verdict. This serves the
//! admission gate too, which reads every governed statement's fingerprint and tags.
//!
//! (`summary`, 3.7 µs, would be cheaper than `parse` but its walker is pg_query's, not ours, and
//! it does not report where clauses, CONCURRENTLY, row locks or settings.)

mod cache;
pub mod classify;
mod collect;
mod facts;
mod fast_shape;
mod shape;
mod tags;
mod walk;

pub use facts::{
    split_identifiers, Facts, Finding, FunctionName, IndexOp, SearchPathChange, SettingAction,
    SettingChange,
};
pub(crate) use tags::backslash_in_plain_string;
pub use tags::{Priority, Tags};

use cache::ModeCache;
use collect::ConstantUse;
use pg_query::{FingerprintOptions, ParserOptions};
use shape::Shape;
use std::borrow::Cow;
use std::fmt;
use std::sync::{Arc, Mutex};

/// Statements longer than this are not read (PostgreSQL's own limit for a message is 1 GB).
pub const MAX_STATEMENT_BYTES: usize = 16 << 20;
/// Default number of statement texts the analyzer remembers.
pub const DEFAULT_CACHE_ENTRIES: usize = 10_000;
/// Texts longer than this are analyzed but not cached.
const MAX_CACHED_TEXT: usize = 1 << 20;

/// A session setting as far as pgward knows it.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum Setting<T> {
    /// Reported by the server (ParameterStatus) and not changed by anything still in flight.
    Known(T),
    /// Not reported yet, or a statement that may change it is still in flight.
    #[default]
    Unknown,
}

/// The values of PostgreSQL's `backslash_quote`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackslashQuote {
    /// `on`
    On,
    /// `off`
    Off,
    /// `safe_encoding` (the default)
    SafeEncoding,
}

/// The session settings that change how PostgreSQL splits a text into tokens.
#[derive(Clone, Debug, Eq, Default)]
pub struct ParseContext {
    /// `standard_conforming_strings`.
    pub standard_conforming_strings: Setting<bool>,
    /// `client_encoding`, as the server reports it (`UTF8`, `SQL_ASCII`, `SJIS`, ...).
    pub client_encoding: Setting<Cow<'static, str>>,
    /// `backslash_quote` (only decides whether `\'` is an error, never where a token ends).
    pub backslash_quote: Setting<BackslashQuote>,
}

/// The encoding's name by address first: the same name read at every statement is one
/// allocation (or one static).
impl PartialEq for ParseContext {
    fn eq(&self, other: &ParseContext) -> bool {
        let encodings = match (&self.client_encoding, &other.client_encoding) {
            (Setting::Known(a), Setting::Known(b)) => crate::name::same(a, b),
            (a, b) => a == b,
        };
        self.standard_conforming_strings == other.standard_conforming_strings
            && self.backslash_quote == other.backslash_quote
            && encodings
    }
}

impl ParseContext {
    /// The server defaults: `standard_conforming_strings = on`, `client_encoding = UTF8`,
    /// `backslash_quote = safe_encoding`.
    pub fn server_defaults() -> ParseContext {
        ParseContext {
            standard_conforming_strings: Setting::Known(true),
            client_encoding: Setting::Known(Cow::Borrowed("UTF8")),
            backslash_quote: Setting::Known(BackslashQuote::SafeEncoding),
        }
    }

    fn mode(&self) -> Mode {
        let scs = match self.standard_conforming_strings {
            Setting::Known(true) => Scs::On,
            Setting::Known(false) => Scs::Off,
            Setting::Unknown => Scs::Unknown,
        };
        // (The server reports `UTF8` as such: that one is compared first.)
        let encoding_safe = matches!(&self.client_encoding,
            Setting::Known(e) if e == "UTF8" || ["UTF-8", "UNICODE", "SQL_ASCII", "UTF8"].iter().any(|k| e.eq_ignore_ascii_case(k)));
        let backslash_quote_off = self.backslash_quote == Setting::Known(BackslashQuote::Off);
        Mode {
            scs,
            encoding_safe,
            backslash_quote_off,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Scs {
    On,
    Off,
    Unknown,
}

/// The part of a [`ParseContext`] an analysis depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Mode {
    scs: Scs,
    encoding_safe: bool,
    backslash_quote_off: bool,
}

impl Mode {
    fn parser_options(self) -> ParserOptions {
        let mut options = ParserOptions::DISABLE_ESCAPE_STRING_WARNING;
        if self.scs == Scs::Off {
            options |= ParserOptions::DISABLE_STANDARD_CONFORMING_STRINGS;
        }
        if self.backslash_quote_off {
            options |= ParserOptions::DISABLE_BACKSLASH_QUOTE;
        }
        options
    }
}

/// How deep an analysis reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Depth {
    /// Fingerprint, normalized text and tags only (enough for allowlists and statistics).
    Shape,
    /// Also the whole parse tree, walked for the rules.
    Tree,
}

/// Why pgward cannot be sure it reads a text as PostgreSQL will.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UncheckedReason {
    /// pg_query's grammar does not accept it.
    ParseError,
    /// Longer than [`MAX_STATEMENT_BYTES`].
    TooLarge,
    /// A backslash inside a plain string while `standard_conforming_strings` is not known.
    BackslashUnknownScs,
    /// Bytes outside ASCII while `client_encoding` is not known to be UTF8 or SQL_ASCII.
    NonAsciiUnknownEncoding,
    /// Not valid UTF-8 (or holds a NUL byte), so the parser cannot be handed it.
    NotUtf8,
    /// A fast-path function call (the protocol's FunctionCall message): no SQL to read.
    FunctionCall,
}

impl UncheckedReason {
    /// Fixed text naming the reason.
    pub fn as_str(self) -> &'static str {
        match self {
            UncheckedReason::ParseError => "the parser does not accept the text",
            UncheckedReason::TooLarge => "the statement is larger than 16 MB",
            UncheckedReason::BackslashUnknownScs => {
                "a backslash in a string while standard_conforming_strings is not known"
            }
            UncheckedReason::NonAsciiUnknownEncoding => {
                "non-ASCII bytes while client_encoding is not known to be UTF8"
            }
            UncheckedReason::NotUtf8 => "the text is not valid UTF-8",
            UncheckedReason::FunctionCall => "a fast-path function call",
        }
    }
}

impl fmt::Display for UncheckedReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// pg_query's fingerprint of a statement text: equal for texts that differ only in constants.
/// Schema names count (`FingerprintOptions::RANGEVAR_PG17_COMPAT`), and so do digits in table
/// names (`FULL_RELNAME`), so an allowlisted statement cannot be pointed at another table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint(pub u64);

impl Fingerprint {
    /// Sixteen lower-case hex digits.
    pub fn hex(self) -> String {
        format!("{:016x}", self.0)
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// What pgward read in a statement text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reading {
    /// Read with the whole tree; the facts the rules use.
    Tree(Facts),
    /// Fingerprinted only: the text parses, its tree was not walked ([`Depth::Shape`]).
    Shape,
    /// Not read with certainty.
    Unchecked(UncheckedReason),
}

/// The analysis of one statement text (which may hold several statements).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Analysis {
    /// `None` when the text was not parsed.
    pub fingerprint: Option<Fingerprint>,
    /// The text with every constant replaced by `$n`, for logs. `None` when it cannot be made
    /// without risk of showing a literal (unparsed text, or `standard_conforming_strings = off`
    /// with backslashes in strings).
    pub normalized: Option<String>,
    /// The sqlcommenter tags of the last comment (whoever wrote them: trust is the policy's call).
    pub tags: Tags,
    /// What was read.
    pub reading: Reading,
}

impl Analysis {
    /// An analysis for a message that carries no SQL (a fast-path FunctionCall).
    pub fn function_call() -> Analysis {
        Analysis::unchecked(UncheckedReason::FunctionCall)
    }

    fn unchecked(reason: UncheckedReason) -> Analysis {
        Analysis {
            fingerprint: None,
            normalized: None,
            tags: Tags::default(),
            reading: Reading::Unchecked(reason),
        }
    }

    /// The facts of the tree, when it was walked.
    pub fn facts(&self) -> Option<&Facts> {
        match &self.reading {
            Reading::Tree(facts) => Some(facts),
            _ => None,
        }
    }

    /// Why the text is unchecked, if it is.
    pub fn unchecked_reason(&self) -> Option<UncheckedReason> {
        match self.reading {
            Reading::Unchecked(reason) => Some(reason),
            _ => None,
        }
    }

    /// The fingerprint as hex, or `none`.
    pub fn fingerprint_hex(&self) -> String {
        self.fingerprint
            .map_or_else(|| "none".to_string(), Fingerprint::hex)
    }

    /// Text safe for logs: the normalized text, or a fixed description.
    pub fn log_text(&self) -> &str {
        match (&self.normalized, &self.reading) {
            (Some(text), _) => text,
            (None, Reading::Unchecked(reason)) => reason.as_str(),
            (None, _) => "(text not shown)",
        }
    }
}

/// Reads statement texts and remembers what it read.
#[derive(Debug)]
pub struct Analyzer {
    depth: Depth,
    cache: Mutex<Caches>,
}

/// Analyses by exact text, and by shape for the texts whose analysis every text of the same
/// shape shares (see [`shape`]).
#[derive(Debug)]
struct Caches {
    texts: ModeCache<Mode, Analysis>,
    shapes: ModeCache<Mode, Analysis>,
}

/// One session's readings by shape, for [`Analyzer::analyze_with`]: only analyses that stand
/// for every text of their shape, of one analyzer (empty it when the analyzer changes).
#[derive(Debug)]
pub struct ShapeMemo {
    shapes: ModeCache<Mode, Analysis>,
    /// The bytes of the shapes remembered since it was last emptied.
    bytes: usize,
    /// The shape of the text read last, its buffers kept for the next.
    scratch: Shape,
    /// The last text read by shape.
    last: LastRead,
}

/// The last text the fast reader read whose analysis stands for every text of its shape, in
/// its mode: a next text that differs from it only inside one integer constant has its shape
/// ([`fast_shape::same_key`]), and so its analysis, without a reading of its own.
#[derive(Debug, Default)]
struct LastRead {
    text: String,
    /// Its shape (its constants are where `same_key` looks).
    shape: Shape,
    read: Option<(Mode, Arc<Analysis>)>,
}

/// Shapes a session remembers.
const MEMO_SHAPES: usize = 256;
/// Bytes of shapes a session remembers, at most: past this it starts over (every client has
/// one memo; the analyzer's own caches are the ones sized for the whole process).
const MEMO_BYTES: usize = 64 << 10;
/// A shape longer than this is not remembered by the session (a text that long is read
/// seldom enough for the analyzer's caches to do).
const MEMO_MAX_SHAPE: usize = 4 << 10;

impl Default for ShapeMemo {
    fn default() -> Self {
        ShapeMemo {
            shapes: ModeCache::new(MEMO_SHAPES),
            bytes: 0,
            scratch: Shape::default(),
            last: LastRead::default(),
        }
    }
}

impl ShapeMemo {
    /// Forgets every reading (another analyzer's are not this one's).
    pub fn clear(&mut self) {
        *self = ShapeMemo::default();
    }

    /// The analysis of `text` in `mode`, when it has the shape of the last text read by shape.
    /// (Differing from it only in digits, it is ASCII, holds a backslash or is short enough
    /// exactly when that one is: it is as readable by shape.)
    fn last_of(&self, text: &str, mode: Mode) -> Option<Arc<Analysis>> {
        let (last_mode, analysis) = self.last.read.as_ref()?;
        let same = *last_mode == mode
            && fast_shape::same_key(&self.last.text, &self.last.shape.constants, text);
        same.then(|| Arc::clone(analysis))
    }

    /// Keeps `text`, read in `mode` as `shape` (whose buffers it takes, leaving the last
    /// one's), as the last text read by shape.
    fn keep_last(&mut self, text: &str, mode: Mode, shape: &mut Shape, analysis: &Arc<Analysis>) {
        if text.len() > MEMO_MAX_SHAPE {
            return;
        }
        let last = &mut self.last;
        last.text.clear();
        last.text.push_str(text);
        std::mem::swap(&mut last.shape, shape);
        match &mut last.read {
            Some((m, a)) if *m == mode && Arc::ptr_eq(a, analysis) => {}
            read => *read = Some((mode, Arc::clone(analysis))),
        }
    }

    fn put(&mut self, mode: Mode, key: &str, analysis: &Arc<Analysis>) {
        if key.len() > MEMO_MAX_SHAPE {
            return;
        }
        if self.bytes + key.len() > MEMO_BYTES {
            self.clear();
        }
        self.bytes += key.len();
        self.shapes.put(mode, key, Arc::clone(analysis));
    }
}

impl Analyzer {
    /// An analyzer reading to `depth`, remembering up to `capacity` texts and as many shapes
    /// per parse mode.
    pub fn new(depth: Depth, capacity: usize) -> Analyzer {
        Analyzer {
            depth,
            cache: Mutex::new(Caches {
                texts: ModeCache::new(capacity),
                shapes: ModeCache::new(capacity),
            }),
        }
    }

    /// How deep this analyzer reads.
    pub fn depth(&self) -> Depth {
        self.depth
    }

    /// How many analyses are cached, by text and by shape.
    pub fn cached(&self) -> usize {
        let caches = self.lock();
        caches.texts.len() + caches.shapes.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Caches> {
        crate::sync::lock(&self.cache)
    }

    /// Analyzes `text` (the bytes of a Query or Parse message, without its NUL) as PostgreSQL
    /// will read it under `context`, from the cache when it, or a text of the same shape whose
    /// analysis does not depend on its constants, was read before in the same mode.
    pub fn analyze(&self, text: &[u8], context: &ParseContext) -> Arc<Analysis> {
        let mode = context.mode();
        let Some(key) = std::str::from_utf8(text).ok() else {
            return Arc::new(analyze_text(text, mode, self.depth).0);
        };
        if let Some(hit) = self.lock().texts.get(mode, key) {
            return hit;
        }
        let shape = self.shape_of(key, mode);
        self.analyze_shaped(text, key, mode, shape.as_ref()).0
    }

    /// [`analyze`](Self::analyze), first from `memo`, one session's own readings by shape
    /// (of this analyzer alone): a text of a shape the session read before is not looked up
    /// in the analyzer's caches, which every session shares.
    pub fn analyze_with(
        &self,
        text: &[u8],
        context: &ParseContext,
        memo: &mut ShapeMemo,
    ) -> Arc<Analysis> {
        let utf8 = std::str::from_utf8(text).ok();
        self.analyze_utf8_with(text, utf8, context, memo)
    }

    /// [`analyze_with`](Self::analyze_with) of `text`, whose UTF-8 reading the caller may
    /// have: `utf8`, trusted only as the very same bytes (else `text` is read again).
    pub fn analyze_utf8_with(
        &self,
        text: &[u8],
        utf8: Option<&str>,
        context: &ParseContext,
        memo: &mut ShapeMemo,
    ) -> Arc<Analysis> {
        let mode = context.mode();
        let key = match utf8 {
            Some(u) if std::ptr::eq(u.as_bytes(), text) => Some(u),
            _ => std::str::from_utf8(text).ok(),
        };
        let Some(key) = key else {
            return self.analyze(text, context);
        };
        if let Some(hit) = memo.last_of(key, mode) {
            return hit;
        }
        // Only what the fast reader reads is looked up in the memo: a text it declines is
        // found in the analyzer's caches by its text, before any scan.
        let mut shape = std::mem::take(&mut memo.scratch);
        let read = self.shape_readable(key, mode) && fast_shape::shape_into(key, &mut shape);
        let analysis = match read {
            true => {
                let (analysis, shared) = self.analyze_read(text, key, mode, &shape, memo);
                if shared {
                    memo.keep_last(key, mode, &mut shape, &analysis);
                }
                analysis
            }
            false => self.analyze(text, context),
        };
        if shape.key.capacity() <= MEMO_MAX_SHAPE
            && shape.constants.capacity() <= MEMO_MAX_SHAPE / 8
        {
            // (The buffers of a long text are not kept.)
            memo.scratch = shape;
        }
        analysis
    }

    /// [`analyze_with`](Self::analyze_with) of a text the fast reader read as `shape`.
    fn analyze_read(
        &self,
        text: &[u8],
        key: &str,
        mode: Mode,
        shape: &Shape,
        memo: &mut ShapeMemo,
    ) -> (Arc<Analysis>, bool) {
        if let Some(hit) = memo.shapes.get(mode, &shape.key) {
            return (hit, true);
        }
        if let Some(hit) = self.lock().texts.get(mode, key) {
            return (hit, false);
        }
        let (analysis, shared) = self.analyze_shaped(text, key, mode, Some(shape));
        if shared {
            memo.put(mode, &shape.key, &analysis);
        }
        (analysis, shared)
    }

    /// `text` (`key`, its UTF-8) of `shape` read in `mode`: from the shape cache, or read now
    /// and cached; and whether the analysis stands for every text of its shape.
    fn analyze_shaped(
        &self,
        text: &[u8],
        key: &str,
        mode: Mode,
        shape: Option<&Shape>,
    ) -> (Arc<Analysis>, bool) {
        if let Some(shape) = shape {
            if let Some(hit) = self.lock().shapes.get(mode, &shape.key) {
                return (hit, true);
            }
        }
        let (analysis, constants) = analyze_text(text, mode, self.depth);
        let analysis = Arc::new(analysis);
        let shared = shape.filter(|shape| {
            constants
                .as_ref()
                .is_some_and(|c| !c.values_read && shape.is_shared_by(&c.locations))
        });
        if key.len() <= MAX_CACHED_TEXT {
            let mut caches = self.lock();
            match shared {
                Some(shape) => caches.shapes.put(mode, &shape.key, Arc::clone(&analysis)),
                None => caches.texts.put(mode, key, Arc::clone(&analysis)),
            }
        }
        (analysis, shared.is_some())
    }

    /// The shape of `text`, when shapes can stand for texts: the rules read the tree, and the
    /// server splits the text into tokens as PostgreSQL's default scanner does.
    fn shape_of(&self, text: &str, mode: Mode) -> Option<Shape> {
        self.shape_readable(text, mode)
            .then(|| Shape::of(text))
            .flatten()
    }

    /// Whether the shape of `text` stands for it in `mode` (see [`shape_of`](Self::shape_of)).
    fn shape_readable(&self, text: &str, mode: Mode) -> bool {
        let same_scanner = mode.scs == Scs::On || !text.contains('\\');
        let readable = mode.encoding_safe || text.is_ascii();
        let worth = text.len() <= MAX_CACHED_TEXT;
        same_scanner && readable && worth
    }
}

/// Reads one text without the cache; with the tree, says how its facts depend on constants.
fn analyze_text(bytes: &[u8], mode: Mode, depth: Depth) -> (Analysis, Option<ConstantUse>) {
    if bytes.len() > MAX_STATEMENT_BYTES {
        return (Analysis::unchecked(UncheckedReason::TooLarge), None);
    }
    if !mode.encoding_safe && !bytes.is_ascii() {
        return (
            Analysis::unchecked(UncheckedReason::NonAsciiUnknownEncoding),
            None,
        );
    }
    let text = match std::str::from_utf8(bytes) {
        Ok(text) if !text.contains('\0') => text,
        _ => return (Analysis::unchecked(UncheckedReason::NotUtf8), None),
    };
    match read(text, mode, depth) {
        Ok((analysis, constants)) => (analysis, constants),
        Err(reason) => (Analysis::unchecked(reason), None),
    }
}

/// `normalized` (pg_query's normalization of a statement) as it may be shown: without its
/// comments (a sqlcommenter tag, a note with a value in it), and only if no constant is left
/// as PostgreSQL's scanner reads it (pg_query leaves the constants of some statements in
/// place: utility statements, EXECUTE's arguments). `None`: it cannot be shown.
pub fn shown_text(normalized: &str) -> Option<String> {
    use pg_query::protobuf::Token;
    let tokens = scan_tokens(normalized)?;
    let comments = [Token::SqlComment as i32, Token::CComment as i32];
    let mut out = String::with_capacity(normalized.len());
    let mut copied = 0;
    for t in &tokens {
        if shape::constant_letter(t.token).is_some() {
            return None;
        }
        if comments.contains(&t.token) {
            let (start, end) = (usize::try_from(t.start).ok()?, usize::try_from(t.end).ok()?);
            out.push_str(normalized.get(copied..start)?);
            copied = end;
        }
    }
    out.push_str(normalized.get(copied..)?);
    Some(out.split_whitespace().collect::<Vec<_>>().join(" "))
}

/// PostgreSQL's scanner over `text` (`None` when it refuses the text). A text of whitespace
/// alone has no token: pg_query's `scan_tokens` builds its empty list from a null pointer
/// there, which is undefined behaviour, so such a text never reaches it.
pub(crate) fn scan_tokens(text: &str) -> Option<Vec<pg_query::protobuf::ScanToken>> {
    // PostgreSQL's whitespace, vertical tab included.
    if text.bytes().all(|b| b" \t\n\r\x0b\x0c".contains(&b)) {
        return Some(Vec::new());
    }
    pg_query::scan_tokens(text).ok()
}

fn read(
    text: &str,
    mode: Mode,
    depth: Depth,
) -> Result<(Analysis, Option<ConstantUse>), UncheckedReason> {
    let wants_tags = text.contains("/*");
    let has_backslash = text.contains('\\');
    let scs_matters = has_backslash && mode.scs != Scs::On;
    let tokens = if wants_tags || scs_matters {
        scan_tokens(text)
    } else {
        Some(Vec::new())
    };
    // With scs off and a backslash in a plain string, the default scanner (used for tags and
    // normalization) splits the text differently from the server, or not at all: use neither.
    let scs_sensitive = scs_matters
        && tokens
            .as_ref()
            .is_none_or(|t| tags::backslash_in_plain_string(text, t));
    if scs_sensitive && mode.scs == Scs::Unknown {
        return Err(UncheckedReason::BackslashUnknownScs);
    }
    let tokens = match tokens {
        Some(tokens) => tokens,
        None if scs_sensitive => Vec::new(),
        None => return Err(UncheckedReason::ParseError),
    };
    let options = mode.parser_options();
    let fingerprint_options =
        FingerprintOptions::RANGEVAR_PG17_COMPAT | FingerprintOptions::FULL_RELNAME;
    let fingerprint = pg_query::fingerprint(text, options, fingerprint_options)
        .map_err(|_| UncheckedReason::ParseError)?;
    let (reading, constants) = match depth {
        // The constants are still read, so that texts differing only in them share one
        // analysis through the shape cache (this parse is paid once per shape).
        // A tree too deep for the decoder leaves the text to the cache by exact text.
        Depth::Shape => (Reading::Shape, walk_tree(text, options).ok().map(|t| t.1)),
        Depth::Tree => {
            let (facts, constants) = walk_tree(text, options)?;
            (Reading::Tree(facts), Some(constants))
        }
    };
    let (tags, normalized) = match scs_sensitive {
        true => (Tags::default(), None),
        false => (
            tags::tags_from_tokens(text, &tokens),
            pg_query::normalize(text).ok(),
        ),
    };
    let analysis = Analysis {
        fingerprint: Some(Fingerprint(fingerprint.value)),
        normalized,
        tags,
        reading,
    };
    Ok((analysis, constants))
}

fn walk_tree(text: &str, options: ParserOptions) -> Result<(Facts, ConstantUse), UncheckedReason> {
    let parsed = pg_query::parse(text, options).map_err(|_| UncheckedReason::ParseError)?;
    let mut collector = collect::Collector::default();
    walk::walk(&parsed.protobuf, &mut collector).map_err(|_| UncheckedReason::ParseError)?;
    Ok(collector.finish())
}

#[cfg(test)]
mod tests;
