//! Which statement types are DDL, which write, which only read.
//!
//! The DDL column is PostgreSQL's own list: the statements `log_statement = 'ddl'` logs, as
//! `GetCommandLogLevel` in `src/backend/tcop/utility.c` (PostgreSQL 18) decides for a raw parse
//! tree. SELECT INTO is DDL there as well; it is a `SelectStmt` with an INTO clause and is reported
//! by the walk as [`Finding::SelectInto`](super::Finding::SelectInto). Every statement type
//! pg_query knows is listed here; a test enumerates the parser's node types and fails when one is
//! missing, so a parser upgrade cannot change the classification silently.

/// How PostgreSQL's `log_statement` classifies a statement type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogLevel {
    /// Logged by `log_statement = 'ddl'`.
    Ddl,
    /// Logged by `log_statement = 'mod'` (and not DDL): changes data.
    Mod,
    /// Logged only by `log_statement = 'all'`.
    All,
}

/// Whether a statement type only reads (for rules that allow reads only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Reads, or changes only the session's own transient state. Some still carry findings
    /// that make them writes (SELECT ... FOR UPDATE, COPY FROM, BEGIN READ WRITE).
    Read,
    /// Changes data, the schema, the server or other sessions.
    Write,
}

use Access::{Read, Write};
use LogLevel::{All, Ddl, Mod};

/// Every statement node type of pg_query 18 (by its Rust type name), with its log level and access.
const STATEMENTS: &[(&str, LogLevel, Access)] = &[
    // Plannable statements.
    ("SelectStmt", All, Read),
    ("InsertStmt", Mod, Write),
    ("UpdateStmt", Mod, Write),
    ("DeleteStmt", Mod, Write),
    ("MergeStmt", Mod, Write),
    // Parts of other statements, never a statement of their own in a raw parse tree.
    ("RawStmt", All, Read),
    ("SetOperationStmt", All, Read),
    ("ReturnStmt", All, Read),
    ("PlAssignStmt", All, Read),
    ("ReplicaIdentityStmt", Ddl, Write),
    // Utility statements logged only by 'all'.
    ("TransactionStmt", All, Read),
    ("DeclareCursorStmt", All, Read),
    ("ClosePortalStmt", All, Read),
    ("FetchStmt", All, Read),
    ("CopyStmt", All, Read),
    ("PrepareStmt", All, Read),
    ("ExecuteStmt", All, Read),
    ("DeallocateStmt", All, Read),
    ("DoStmt", All, Write),
    ("NotifyStmt", All, Write),
    ("ListenStmt", All, Write),
    ("UnlistenStmt", All, Read),
    ("LoadStmt", All, Write),
    ("CallStmt", All, Write),
    ("VacuumStmt", All, Write),
    ("ExplainStmt", All, Read),
    ("VariableSetStmt", All, Read),
    ("VariableShowStmt", All, Read),
    ("DiscardStmt", All, Read),
    ("LockStmt", All, Write),
    ("ConstraintsSetStmt", All, Read),
    ("CheckPointStmt", All, Write),
    ("ReindexStmt", All, Write),
    // Logged by 'mod'.
    ("TruncateStmt", Mod, Write),
    // Logged by 'ddl'.
    ("CreateSchemaStmt", Ddl, Write),
    ("CreateStmt", Ddl, Write),
    ("CreateForeignTableStmt", Ddl, Write),
    ("CreateTableSpaceStmt", Ddl, Write),
    ("DropTableSpaceStmt", Ddl, Write),
    ("AlterTableSpaceOptionsStmt", Ddl, Write),
    ("CreateExtensionStmt", Ddl, Write),
    ("AlterExtensionStmt", Ddl, Write),
    ("AlterExtensionContentsStmt", Ddl, Write),
    ("CreateFdwStmt", Ddl, Write),
    ("AlterFdwStmt", Ddl, Write),
    ("CreateForeignServerStmt", Ddl, Write),
    ("AlterForeignServerStmt", Ddl, Write),
    ("CreateUserMappingStmt", Ddl, Write),
    ("AlterUserMappingStmt", Ddl, Write),
    ("DropUserMappingStmt", Ddl, Write),
    ("ImportForeignSchemaStmt", Ddl, Write),
    ("DropStmt", Ddl, Write),
    ("CommentStmt", Ddl, Write),
    ("SecLabelStmt", Ddl, Write),
    ("RenameStmt", Ddl, Write),
    ("AlterObjectDependsStmt", Ddl, Write),
    ("AlterObjectSchemaStmt", Ddl, Write),
    ("AlterOwnerStmt", Ddl, Write),
    ("AlterOperatorStmt", Ddl, Write),
    ("AlterTypeStmt", Ddl, Write),
    ("AlterTableMoveAllStmt", Ddl, Write),
    ("AlterTableStmt", Ddl, Write),
    ("AlterDomainStmt", Ddl, Write),
    ("GrantStmt", Ddl, Write),
    ("GrantRoleStmt", Ddl, Write),
    ("AlterDefaultPrivilegesStmt", Ddl, Write),
    ("DefineStmt", Ddl, Write),
    ("CompositeTypeStmt", Ddl, Write),
    ("CreateEnumStmt", Ddl, Write),
    ("CreateRangeStmt", Ddl, Write),
    ("AlterEnumStmt", Ddl, Write),
    ("ViewStmt", Ddl, Write),
    ("CreateFunctionStmt", Ddl, Write),
    ("AlterFunctionStmt", Ddl, Write),
    ("IndexStmt", Ddl, Write),
    ("RuleStmt", Ddl, Write),
    ("CreateSeqStmt", Ddl, Write),
    ("AlterSeqStmt", Ddl, Write),
    ("CreatedbStmt", Ddl, Write),
    ("AlterDatabaseStmt", Ddl, Write),
    ("AlterDatabaseRefreshCollStmt", Ddl, Write),
    ("AlterDatabaseSetStmt", Ddl, Write),
    ("DropdbStmt", Ddl, Write),
    ("ClusterStmt", Ddl, Write),
    ("CreateTableAsStmt", Ddl, Write),
    ("RefreshMatViewStmt", Ddl, Write),
    ("AlterSystemStmt", Ddl, Write),
    ("CreateTrigStmt", Ddl, Write),
    ("CreateEventTrigStmt", Ddl, Write),
    ("AlterEventTrigStmt", Ddl, Write),
    ("CreatePLangStmt", Ddl, Write),
    ("CreateDomainStmt", Ddl, Write),
    ("CreateRoleStmt", Ddl, Write),
    ("AlterRoleStmt", Ddl, Write),
    ("AlterRoleSetStmt", Ddl, Write),
    ("DropRoleStmt", Ddl, Write),
    ("DropOwnedStmt", Ddl, Write),
    ("ReassignOwnedStmt", Ddl, Write),
    ("CreateConversionStmt", Ddl, Write),
    ("CreateCastStmt", Ddl, Write),
    ("CreateOpClassStmt", Ddl, Write),
    ("CreateOpFamilyStmt", Ddl, Write),
    ("CreateTransformStmt", Ddl, Write),
    ("AlterOpFamilyStmt", Ddl, Write),
    ("CreatePolicyStmt", Ddl, Write),
    ("AlterPolicyStmt", Ddl, Write),
    ("AlterTsDictionaryStmt", Ddl, Write),
    ("AlterTsConfigurationStmt", Ddl, Write),
    ("CreateAmStmt", Ddl, Write),
    ("CreatePublicationStmt", Ddl, Write),
    ("AlterPublicationStmt", Ddl, Write),
    ("CreateSubscriptionStmt", Ddl, Write),
    ("AlterSubscriptionStmt", Ddl, Write),
    ("DropSubscriptionStmt", Ddl, Write),
    ("CreateStatsStmt", Ddl, Write),
    ("AlterStatsStmt", Ddl, Write),
    ("AlterCollationStmt", Ddl, Write),
];

/// The log level and access of a statement node type, or `None` when `name` is not a statement.
pub fn classify(name: &str) -> Option<(LogLevel, Access)> {
    STATEMENTS
        .iter()
        .find(|(n, _, _)| *n == name)
        .map(|&(_, level, access)| (level, access))
}

/// The statement node types this table knows, for tests and documentation.
pub fn statement_types() -> impl Iterator<Item = &'static str> {
    STATEMENTS.iter().map(|(n, _, _)| *n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::walk::{walk, Events};
    use prost::Message;
    use std::collections::BTreeSet;

    /// Records the first struct name a walk reports: for a `Node`, its variant's type.
    #[derive(Default)]
    struct FirstName(Option<&'static str>);

    impl Events for FirstName {
        fn enter(&mut self, name: &'static str) {
            self.0.get_or_insert(name);
        }
        fn leave(&mut self) {}
        fn field(&mut self, _: &'static str) {}
        fn string(&mut self, _: &str) {}
        fn int(&mut self, _: i64) {}
        fn boolean(&mut self, _: bool) {}
        fn none(&mut self) {}
    }

    fn varint(mut v: u64, out: &mut Vec<u8>) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    /// Every node type pg_query's `Node` can hold, found by decoding each oneof field number.
    fn parser_node_types() -> BTreeSet<&'static str> {
        let mut names = BTreeSet::new();
        for tag in 1u64..2048 {
            let mut bytes = Vec::new();
            varint((tag << 3) | 2, &mut bytes);
            bytes.push(0);
            let Ok(node) = pg_query::protobuf::Node::decode(bytes.as_slice()) else {
                continue;
            };
            let mut first = FirstName::default();
            walk(&node, &mut first).unwrap();
            if let Some(name) = first.0 {
                names.insert(name);
            }
        }
        names
    }

    #[test]
    fn every_statement_type_of_the_parser_is_classified() {
        let known = parser_node_types();
        assert!(
            known.len() > 250,
            "enumeration found only {} node types",
            known.len()
        );
        let statements: BTreeSet<_> = known
            .iter()
            .copied()
            .filter(|n| n.ends_with("Stmt"))
            .collect();
        let listed: BTreeSet<_> = statement_types().collect();
        let unlisted: Vec<_> = statements.difference(&listed).collect();
        assert!(
            unlisted.is_empty(),
            "statement types without a classification: {unlisted:?}"
        );
        let stale: Vec<_> = listed.difference(&statements).collect();
        assert!(
            stale.is_empty(),
            "classified types the parser no longer has: {stale:?}"
        );
    }

    #[test]
    fn ddl_list_matches_postgresql() {
        let ddl = STATEMENTS.iter().filter(|(_, l, _)| *l == Ddl).count();
        // The 83 types GetCommandLogLevel calls DDL, plus ReplicaIdentityStmt (part of ALTER TABLE).
        assert_eq!(ddl, 84);
        assert_eq!(classify("TruncateStmt"), Some((Mod, Write)));
        assert_eq!(classify("ReindexStmt"), Some((All, Write)));
        assert_eq!(classify("DoStmt"), Some((All, Write)));
        assert_eq!(classify("AConst"), None);
    }
}
