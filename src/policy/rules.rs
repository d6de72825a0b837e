//! The checks of each rule over an analysis.

use super::file::RuleKind;
use crate::sql::classify::{classify, Access};
use crate::sql::{Facts, Finding, IndexOp, SearchPathChange, SettingAction};

/// Functions whose effects reach beyond the statement: ending sessions, server files, large
/// objects, other servers, settings, WAL and replication, session advisory locks, shared
/// statistics. Used by `deny_functions` when the rule lists none. `*` matches any characters.
pub const DEFAULT_DENIED_FUNCTIONS: &[&str] = &[
    // Other sessions.
    "pg_terminate_backend",
    "pg_cancel_backend",
    "pg_log_backend_memory_contexts",
    // Server files.
    "pg_read_file",
    "pg_read_binary_file",
    "pg_stat_file",
    "pg_ls_dir",
    "pg_ls_*dir",
    "pg_file_*",
    "pg_logdir_ls",
    // Large objects.
    "lo_*",
    "loread",
    "lowrite",
    // Other servers.
    "dblink*",
    // SQL the function runs that pgward never reads: a query given as text, or a query built
    // from a table, schema or database it is given. PostgreSQL 13 to 18 have the same set
    // (utils/adt/xml.c, tsvector_op.c, tsquery_rewrite.c; every pg_proc entry whose prosrc
    // hands an argument to SPI), and tests/rules.rs derives it from the server's own catalog.
    // `ts_rewrite(tsquery, tsquery, tsquery)` runs nothing, but shares its name with the
    // form that runs its text argument.
    "query_to_xml",
    "query_to_xmlschema",
    "query_to_xml_and_xmlschema",
    "table_to_xml",
    "table_to_xml_and_xmlschema",
    "schema_to_xml",
    "schema_to_xml_and_xmlschema",
    "database_to_xml",
    "database_to_xml_and_xmlschema",
    "ts_stat",
    "ts_rewrite",
    // The same from extensions shipped with PostgreSQL: tablefunc's crosstab (SQL text) and
    // connectby (built from names, unquoted), xml2's xpath_table (built from its arguments).
    "crosstab*",
    "connectby",
    "xpath_table",
    // Settings and the server's configuration.
    "set_config",
    "pg_reload_conf",
    "pg_rotate_logfile",
    // WAL, backups, recovery and replication.
    "pg_switch_wal",
    "pg_create_restore_point",
    "pg_backup_start",
    "pg_backup_stop",
    "pg_start_backup",
    "pg_stop_backup",
    "pg_promote",
    "pg_wal_replay_pause",
    "pg_wal_replay_resume",
    "pg_create_*_replication_slot",
    "pg_copy_*_replication_slot",
    "pg_drop_replication_slot",
    "pg_replication_slot_advance",
    "pg_sync_replication_slots",
    "pg_logical_slot_get_*",
    "pg_logical_emit_message",
    "pg_replication_origin_*",
    // Session-level advisory locks (they outlive the statement, and behind a pooler the client).
    "pg_advisory_lock*",
    "pg_try_advisory_lock*",
    "pg_advisory_unlock*",
    // Shared statistics.
    "pg_stat_reset*",
];

/// Built-in functions that write, for `read_only` (besides the rule's own `functions`).
pub const WRITING_FUNCTIONS: &[&str] = &[
    "nextval",
    "setval",
    "txid_current",
    "pg_current_xact_id",
    "pg_notify",
    "brin_summarize_new_values",
    "brin_summarize_range",
    "brin_desummarize_range",
    "gin_clean_pending_list",
    "pg_import_system_collations",
    "lo_*",
    "lowrite",
];

/// Settings a read-only session must not change.
const PROTECTED_SETTINGS: &[&str] = &[
    "transaction_read_only",
    "default_transaction_read_only",
    "role",
    "session_authorization",
];

/// Schemas every session may use.
const ALWAYS_ALLOWED_SCHEMAS: &[&str] = &["pg_catalog", "information_schema", "pg_temp"];

/// A rule's check with its parameters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Check {
    DenyDdl,
    RequireWhere,
    IndexConcurrently,
    SchemaAllowlist(Vec<String>),
    DenyFunctions(Vec<String>),
    ReadOnly(Vec<String>),
}

impl Check {
    pub(super) fn kind(&self) -> RuleKind {
        match self {
            Check::DenyDdl => RuleKind::DenyDdl,
            Check::RequireWhere => RuleKind::RequireWhere,
            Check::IndexConcurrently => RuleKind::IndexConcurrently,
            Check::SchemaAllowlist(_) => RuleKind::SchemaAllowlist,
            Check::DenyFunctions(_) => RuleKind::DenyFunctions,
            Check::ReadOnly(_) => RuleKind::ReadOnly,
        }
    }

    /// What in `facts` breaks the rule, as fixed text (never text from the statement), or
    /// `None`. `role` resolves `$user` in search_path.
    pub(super) fn violation(&self, facts: &Facts, role: &str) -> Option<String> {
        match self {
            Check::DenyDdl => deny_ddl(facts).map(str::to_string),
            Check::RequireWhere => require_where(facts).map(str::to_string),
            Check::IndexConcurrently => index_concurrently(facts).map(str::to_string),
            Check::SchemaAllowlist(allowed) => {
                schema_allowlist(facts, allowed, role).map(str::to_string)
            }
            Check::DenyFunctions(patterns) => {
                denied_function(facts, patterns).map(|p| format!("call of {p}"))
            }
            Check::ReadOnly(patterns) => read_only(facts, patterns),
        }
    }
}

fn deny_ddl(facts: &Facts) -> Option<&'static str> {
    facts.findings.iter().find_map(|f| match f {
        Finding::Ddl(_) => Some("DDL"),
        Finding::SelectInto => Some("SELECT INTO"),
        Finding::Do => Some("DO block"),
        Finding::Call => Some("CALL"),
        _ => None,
    })
}

fn require_where(facts: &Facts) -> Option<&'static str> {
    facts.findings.iter().find_map(|f| match f {
        Finding::UpdateWithoutWhere => {
            Some("UPDATE without WHERE (write WHERE true to mean every row)")
        }
        Finding::DeleteWithoutWhere => {
            Some("DELETE without WHERE (write WHERE true to mean every row)")
        }
        Finding::Truncate => Some("TRUNCATE"),
        _ => None,
    })
}

fn index_concurrently(facts: &Facts) -> Option<&'static str> {
    facts.findings.iter().find_map(|f| match f {
        Finding::NotConcurrently(IndexOp::Create) => Some("CREATE INDEX without CONCURRENTLY"),
        Finding::NotConcurrently(IndexOp::Drop) => Some("DROP INDEX without CONCURRENTLY"),
        Finding::NotConcurrently(IndexOp::Reindex) => Some("REINDEX without CONCURRENTLY"),
        _ => None,
    })
}

/// Whether `schema` may be used by `role` under an allowlist.
pub(super) fn schema_allowed(schema: &str, allowed: &[String], role: &str) -> bool {
    let schema = if schema == "$user" { role } else { schema };
    ALWAYS_ALLOWED_SCHEMAS.contains(&schema)
        || schema
            .strip_prefix("pg_temp_")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        || allowed.iter().any(|a| a == schema)
}

fn schema_allowlist(facts: &Facts, allowed: &[String], role: &str) -> Option<&'static str> {
    if facts
        .schemas
        .iter()
        .any(|s| !schema_allowed(s, allowed, role))
    {
        return Some("a schema outside the allowlist");
    }
    facts
        .search_path_changes()
        .iter()
        .find_map(|change| match change {
            SearchPathChange::Set(list)
                if list.iter().any(|s| !schema_allowed(s, allowed, role)) =>
            {
                Some("search_path set to a schema outside the allowlist")
            }
            SearchPathChange::Unknown => Some("search_path set to a value not known in advance"),
            _ => None,
        })
}

/// `*` matches any run of characters; everything else matches itself.
pub(super) fn glob(pattern: &str, name: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == name,
        Some((head, tail)) => {
            let Some(rest) = name.strip_prefix(head) else {
                return false;
            };
            (0..=rest.len())
                .filter(|&i| rest.is_char_boundary(i))
                .any(|i| glob(tail, rest.get(i..).unwrap_or("")))
        }
    }
}

fn denied_function<'p>(facts: &Facts, patterns: &'p [String]) -> Option<&'p str> {
    facts
        .functions
        .iter()
        .find_map(|f| patterns.iter().find(|p| glob(p, &f.name)))
        .map(String::as_str)
}

fn read_only(facts: &Facts, patterns: &[String]) -> Option<String> {
    let writes = |s: &&str| classify(s).is_none_or(|(_, access)| access == Access::Write);
    if facts.statements.iter().any(writes) {
        return Some("a statement that writes".into());
    }
    let found = facts.findings.iter().find_map(|f| match f {
        Finding::SelectInto => Some("SELECT INTO"),
        Finding::RowLock => Some("a row lock (FOR UPDATE or FOR SHARE)"),
        Finding::CopyFrom => Some("COPY FROM"),
        Finding::CopyProgram => Some("COPY PROGRAM"),
        Finding::CopyFile => Some("COPY to or from a server file"),
        Finding::ReadWrite => Some("a READ WRITE transaction"),
        _ => None,
    });
    if let Some(found) = found {
        return Some(found.into());
    }
    if facts.settings.iter().any(|s| match (&s.name, &s.action) {
        (_, SettingAction::ResetAll) | (None, _) => true,
        (Some(name), _) => PROTECTED_SETTINGS
            .iter()
            .any(|p| name.eq_ignore_ascii_case(p)),
    }) {
        return Some("a change of transaction_read_only, role or every setting".into());
    }
    let builtin = facts
        .functions
        .iter()
        .find_map(|f| WRITING_FUNCTIONS.iter().find(|p| glob(p, &f.name)));
    let own = || denied_function(facts, patterns);
    builtin
        .copied()
        .or_else(own)
        .map(|p| format!("call of writing function {p}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob("lo_*", "lo_import"));
        assert!(!glob("lo_*", "lower"));
        assert!(glob(
            "pg_create_*_replication_slot",
            "pg_create_logical_replication_slot"
        ));
        assert!(glob("dblink*", "dblink"));
        assert!(!glob("pg_advisory_lock*", "pg_advisory_xact_lock"));
        assert!(glob("pg_ls_*dir", "pg_ls_waldir"));
        assert!(glob("*", ""));
    }

    #[test]
    fn always_allowed_schemas() {
        assert!(schema_allowed("pg_catalog", &[], "r"));
        assert!(schema_allowed("pg_temp_3", &[], "r"));
        assert!(!schema_allowed("pg_temp_x", &[], "r"));
        assert!(schema_allowed("$user", &[], "pg_catalog"));
        assert!(schema_allowed("$user", &["alice".into()], "alice"));
        assert!(!schema_allowed("public", &[], "r"));
    }
}
