//! What the parse tree of a statement text says, in the terms the rules use.

use std::fmt;

/// Something a rule may care about, found anywhere in the tree (nested statements included).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Finding {
    /// A statement type `log_statement = 'ddl'` logs (the node type's name).
    Ddl(&'static str),
    /// `SELECT ... INTO` (creates a table).
    SelectInto,
    /// A `DO` block.
    Do,
    /// `CALL`.
    Call,
    /// `UPDATE` without `WHERE`.
    UpdateWithoutWhere,
    /// `DELETE` without `WHERE`.
    DeleteWithoutWhere,
    /// `TRUNCATE`.
    Truncate,
    /// An index built, dropped or rebuilt without `CONCURRENTLY`.
    NotConcurrently(IndexOp),
    /// `FOR UPDATE`, `FOR NO KEY UPDATE`, `FOR SHARE`, `FOR KEY SHARE`.
    RowLock,
    /// `COPY ... FROM`.
    CopyFrom,
    /// `COPY ... PROGRAM`.
    CopyProgram,
    /// `COPY` to or from a server file.
    CopyFile,
    /// A transaction declared `READ WRITE` (BEGIN, START TRANSACTION, SET TRANSACTION, SET
    /// SESSION CHARACTERISTICS).
    ReadWrite,
}

/// Which index operation lacks `CONCURRENTLY`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexOp {
    /// `CREATE INDEX` (not `ON ONLY`).
    Create,
    /// `DROP INDEX`.
    Drop,
    /// `REINDEX`.
    Reindex,
}

/// A function called by name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FunctionName {
    /// The schema written before the name, if any.
    pub schema: Option<String>,
    /// The function's name as PostgreSQL resolves it (folded to lower case unless quoted).
    pub name: String,
}

impl fmt::Display for FunctionName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.schema {
            Some(schema) => write!(f, "{schema}.{}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

/// A change of a session setting, by `SET`/`RESET` (anywhere in the tree, including
/// `ALTER ROLE ... SET`) or by a call of `set_config`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SettingChange {
    /// The setting; `None` for `RESET ALL`, or a `set_config` whose name is not a constant.
    pub name: Option<String>,
    /// What is done to it.
    pub action: SettingAction,
    /// `SET LOCAL` or `set_config(..., true)`.
    pub local: bool,
}

/// What a [`SettingChange`] does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SettingAction {
    /// Set to these values (`None` for a value that is not a constant). For a list setting each
    /// value is one element, as PostgreSQL flattens `SET a = x, 'y, z'` (two elements, the second
    /// being `y, z`); a `set_config` text is split into its elements here.
    Set(Vec<Option<String>>),
    /// `SET ... TO DEFAULT`.
    Default,
    /// `SET ... FROM CURRENT`.
    FromCurrent,
    /// `RESET name`.
    Reset,
    /// `RESET ALL`.
    ResetAll,
    /// `SET TRANSACTION ...`, `SET SESSION CHARACTERISTICS ...`: several settings at once.
    Multi,
}

/// A change of `search_path`, by any route.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SearchPathChange {
    /// Set to these schemas (`$user` kept as written).
    Set(Vec<String>),
    /// Back to the default (RESET, SET ... TO DEFAULT, RESET ALL).
    Reset,
    /// A value that cannot be known before it runs (a non-constant `set_config` argument,
    /// `FROM CURRENT`).
    Unknown,
}

/// Everything the tree walk found in one statement text (all its statements).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Facts {
    /// The node type of each top-level statement, in order (`SelectStmt`, `UpdateStmt`, ...).
    pub top_kinds: Vec<&'static str>,
    /// Every statement node type in the tree, nested ones included, without repeats.
    pub statements: Vec<&'static str>,
    /// Findings, without repeats.
    pub findings: Vec<Finding>,
    /// Every function called by name, in order.
    pub functions: Vec<FunctionName>,
    /// Every schema named (relations, functions, types, columns, CREATE SCHEMA), without repeats.
    pub schemas: Vec<String>,
    /// Every setting changed.
    pub settings: Vec<SettingChange>,
}

impl Facts {
    /// Whether `finding` was found.
    pub fn has(&self, finding: &Finding) -> bool {
        self.findings.contains(finding)
    }

    /// The changes of `search_path` among the settings changed.
    pub fn search_path_changes(&self) -> Vec<SearchPathChange> {
        self.settings
            .iter()
            .filter_map(search_path_change)
            .collect()
    }
}

fn search_path_change(change: &SettingChange) -> Option<SearchPathChange> {
    let named = change
        .name
        .as_deref()
        .map(|n| n.eq_ignore_ascii_case("search_path"));
    match (&change.action, named) {
        (SettingAction::ResetAll, _) => Some(SearchPathChange::Reset),
        (_, Some(false)) | (SettingAction::Multi, _) => None,
        (_, None) => Some(SearchPathChange::Unknown),
        (SettingAction::Default | SettingAction::Reset, Some(true)) => {
            Some(SearchPathChange::Reset)
        }
        (SettingAction::FromCurrent, Some(true)) => Some(SearchPathChange::Unknown),
        (SettingAction::Set(values), Some(true)) => Some(schemas_of(values)),
    }
}

fn schemas_of(values: &[Option<String>]) -> SearchPathChange {
    match values.iter().cloned().collect::<Option<Vec<String>>>() {
        Some(schemas) => SearchPathChange::Set(schemas),
        None => SearchPathChange::Unknown,
    }
}

/// Splits a `search_path` value the way PostgreSQL does: comma-separated identifiers, unquoted
/// ones folded to lower case, `"..."` quoted ones kept (with `""` for a quote). `None` when the
/// value is malformed (PostgreSQL would refuse it too).
pub fn split_identifiers(value: &str) -> Option<Vec<String>> {
    let mut out = Vec::new();
    let mut rest = value.trim_start();
    if rest.is_empty() {
        return Some(out);
    }
    loop {
        let (ident, after) = match rest.strip_prefix('"') {
            Some(quoted) => quoted_identifier(quoted)?,
            None => {
                let end = rest
                    .find(|c: char| c == ',' || c.is_whitespace())
                    .unwrap_or(rest.len());
                let (word, after) = rest.split_at(end);
                (word.to_lowercase(), after)
            }
        };
        if ident.is_empty() {
            return None;
        }
        out.push(ident);
        let after = after.trim_start();
        match after.strip_prefix(',') {
            Some(next) => rest = next.trim_start(),
            None if after.is_empty() => return Some(out),
            None => return None,
        }
    }
}

fn quoted_identifier(s: &str) -> Option<(String, &str)> {
    let mut ident = String::new();
    let mut chars = s.char_indices();
    while let Some((i, c)) = chars.next() {
        if c != '"' {
            ident.push(c);
            continue;
        }
        let after = s.get(i + 1..)?;
        if after.starts_with('"') {
            ident.push('"');
            chars.next();
        } else {
            return Some((ident, after));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn search_path_values_split_like_postgresql() {
        assert_eq!(
            split_identifiers("a, B ,\"C d\""),
            Some(vec!["a".into(), "b".into(), "C d".into()])
        );
        assert_eq!(
            split_identifiers("\"$user\", public"),
            Some(vec!["$user".into(), "public".into()])
        );
        assert_eq!(split_identifiers(""), Some(vec![]));
        assert_eq!(split_identifiers("a b"), None);
        assert_eq!(split_identifiers("\"open"), None);
        assert_eq!(split_identifiers("a,,b"), None);
    }
}
