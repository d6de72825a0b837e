//! Derives the facts rules need from the events of a complete tree walk.

use super::classify::{classify, LogLevel};
use super::facts::{
    split_identifiers, Facts, Finding, FunctionName, IndexOp, SettingAction, SettingChange,
};
use super::walk::Events;

/// What a struct being walked has gathered so far, for the few node types rules look into.
#[derive(Debug)]
enum Acc {
    None,
    /// `FuncCall`: the name's parts, and each argument when it is a constant.
    Func {
        parts: Vec<String>,
        args: Vec<Option<String>>,
    },
    /// `A_Const`: its value as text (`None` for NULL).
    Const(Option<String>),
    /// `IndexStmt`.
    Index {
        concurrent: bool,
        only: bool,
    },
    /// `DropStmt`.
    Drop {
        index: bool,
        concurrent: bool,
    },
    /// `ReindexStmt`.
    Reindex {
        concurrent: bool,
    },
    /// `TypeName.names` or `ColumnRef.fields` (`None` for `*`).
    Names(Vec<Option<String>>),
    /// `VariableSetStmt`.
    Set {
        kind: i64,
        name: String,
        values: Vec<Option<String>>,
        local: bool,
    },
    /// `DefElem`: its name, whether it has an argument, and the argument as text when it is
    /// a constant, a word or a number.
    Def {
        name: String,
        has_arg: bool,
        value: Option<String>,
    },
}

#[derive(Debug)]
struct Frame {
    name: &'static str,
    field: &'static str,
    acc: Acc,
}

/// `ObjectType::ObjectIndex` in pg_query's protobuf.
const OBJECT_INDEX: i64 = 21;
/// `VariableSetKind` values in pg_query's protobuf.
const VAR_SET_VALUE: i64 = 1;
const VAR_SET_DEFAULT: i64 = 2;
const VAR_SET_CURRENT: i64 = 3;
const VAR_RESET: i64 = 5;
const VAR_RESET_ALL: i64 = 6;

/// How the facts depend on the text's constants (see [`super::shape`]).
#[derive(Debug, Default)]
pub(crate) struct ConstantUse {
    /// The location of every `A_Const` in the tree.
    pub locations: Vec<i64>,
    /// A constant's value went into the facts (set_config arguments, SET values, options).
    pub values_read: bool,
}

/// Turns walk events into [`Facts`].
#[derive(Default)]
pub(crate) struct Collector {
    stack: Vec<Frame>,
    facts: Facts,
    constants: ConstantUse,
}

impl Collector {
    /// The facts, and how they depend on constants.
    pub(crate) fn finish(self) -> (Facts, ConstantUse) {
        (self.facts, self.constants)
    }

    fn top(&self) -> Option<(&'static str, &'static str)> {
        self.stack.last().map(|f| (f.name, f.field))
    }

    /// The frame below the innermost one (the innermost one's parent).
    fn parent_mut(&mut self) -> Option<&mut Frame> {
        let len = self.stack.len();
        len.checked_sub(2).and_then(|i| self.stack.get_mut(i))
    }

    fn parent(&self) -> Option<(&'static str, &'static str)> {
        let len = self.stack.len();
        len.checked_sub(2)
            .and_then(|i| self.stack.get(i))
            .map(|f| (f.name, f.field))
    }

    fn find(&mut self, finding: Finding) {
        if !self.facts.findings.contains(&finding) {
            self.facts.findings.push(finding);
        }
    }

    fn schema(&mut self, name: &str) {
        if !name.is_empty() && !self.facts.schemas.iter().any(|s| s == name) {
            self.facts.schemas.push(name.to_string());
        }
    }

    fn statement(&mut self, name: &'static str, level: LogLevel) {
        if self.top() == Some(("RawStmt", "stmt")) {
            self.facts.top_kinds.push(name);
        }
        if !self.facts.statements.contains(&name) {
            self.facts.statements.push(name);
        }
        match (name, level) {
            ("DoStmt", _) => self.find(Finding::Do),
            ("CallStmt", _) => self.find(Finding::Call),
            ("TruncateStmt", _) => self.find(Finding::Truncate),
            (_, LogLevel::Ddl) => self.find(Finding::Ddl(name)),
            _ => {}
        }
    }

    fn acc_for(name: &str) -> Acc {
        match name {
            "FuncCall" => Acc::Func {
                parts: Vec::new(),
                args: Vec::new(),
            },
            "AConst" => Acc::Const(None),
            "IndexStmt" => Acc::Index {
                concurrent: false,
                only: false,
            },
            "DropStmt" => Acc::Drop {
                index: false,
                concurrent: false,
            },
            "ReindexStmt" => Acc::Reindex { concurrent: false },
            "TypeName" | "ColumnRef" => Acc::Names(Vec::new()),
            "VariableSetStmt" => Acc::Set {
                kind: 0,
                name: String::new(),
                values: Vec::new(),
                local: false,
            },
            "DefElem" => Acc::Def {
                name: String::new(),
                has_arg: false,
                value: None,
            },
            _ => Acc::None,
        }
    }

    /// A list element that is not a constant: recorded as unknown where constants matter.
    fn non_constant_element(&mut self, name: &str) {
        let Some(top) = self.stack.last_mut() else {
            return;
        };
        match (&mut top.acc, top.field, name) {
            (Acc::Func { args, .. }, "args", n) if n != "AConst" => args.push(None),
            (Acc::Set { values, .. }, "args", n) if n != "AConst" => values.push(None),
            (Acc::Names(parts), "fields", "AStar") => parts.push(None),
            (Acc::Def { has_arg, .. }, "arg", _) => *has_arg = true,
            _ => {}
        }
    }

    fn string_node(&mut self, value: &str) {
        let Some(parent) = self.parent_mut() else {
            return;
        };
        match (&mut parent.acc, parent.field) {
            (Acc::Func { parts, .. }, "funcname") => parts.push(value.to_string()),
            (Acc::Names(parts), "names" | "fields") => parts.push(Some(value.to_string())),
            (Acc::Const(v), "val") | (Acc::Def { value: v, .. }, "arg") => {
                *v = Some(value.to_string())
            }
            _ => {}
        }
    }

    /// A number or boolean: the value of the constant, or of the option, it belongs to.
    fn set_const(&mut self, value: String) {
        match self.parent_mut() {
            Some(Frame {
                acc: Acc::Const(v),
                field: "val",
                ..
            })
            | Some(Frame {
                acc: Acc::Def { value: v, .. },
                field: "arg",
                ..
            }) => *v = Some(value),
            _ => {}
        }
    }

    fn close(&mut self, frame: Frame) {
        match frame.acc {
            Acc::Func { parts, args } => self.close_func(parts, args),
            Acc::Const(value) => self.close_const(value),
            Acc::Index { concurrent, only } if !concurrent && !only => {
                self.find(Finding::NotConcurrently(IndexOp::Create))
            }
            Acc::Drop {
                index: true,
                concurrent: false,
            } => self.find(Finding::NotConcurrently(IndexOp::Drop)),
            Acc::Reindex { concurrent: false } => {
                self.find(Finding::NotConcurrently(IndexOp::Reindex))
            }
            Acc::Names(parts) => self.close_names(frame.name, &parts),
            Acc::Set {
                kind,
                name,
                values,
                local,
            } => self.close_set(kind, name, values, local),
            Acc::Def {
                name,
                has_arg,
                value,
            } => self.close_def(&name, has_arg, value),
            _ => {}
        }
    }

    fn close_func(&mut self, mut parts: Vec<String>, args: Vec<Option<String>>) {
        let Some(name) = parts.pop() else { return };
        let schema = parts.pop();
        if let Some(s) = &schema {
            self.schema(s);
        }
        if name == "set_config" {
            self.constants.values_read = true;
            let setting = args.first().cloned().flatten();
            // The value is one text that PostgreSQL splits itself, like a list in the config file.
            let values = match args
                .get(1)
                .cloned()
                .flatten()
                .map(|v| split_identifiers(&v))
            {
                Some(Some(list)) => list.into_iter().map(Some).collect(),
                _ => vec![None],
            };
            let local = args.get(2).cloned().flatten().is_some_and(|v| v == "true");
            let action = SettingAction::Set(values);
            self.facts.settings.push(SettingChange {
                name: setting,
                action,
                local,
            });
        }
        self.facts.functions.push(FunctionName { schema, name });
    }

    fn close_const(&mut self, value: Option<String>) {
        let Some(parent) = self.stack.last_mut() else {
            return;
        };
        match (&mut parent.acc, parent.field) {
            (Acc::Func { args, .. }, "args") => args.push(value),
            (Acc::Set { values, .. }, "args") => {
                values.push(value);
                self.constants.values_read = true;
            }
            (Acc::Def { value: v, .. }, "arg") => *v = value,
            _ => {}
        }
    }

    fn close_names(&mut self, node: &str, parts: &[Option<String>]) {
        // TypeName: schema.type; ColumnRef: schema.table.column (or catalog.schema.table.column).
        let back = if node == "TypeName" { 2 } else { 3 };
        if let Some(Some(schema)) = parts.len().checked_sub(back).and_then(|i| parts.get(i)) {
            let schema = schema.clone();
            self.schema(&schema);
        }
    }

    fn close_set(&mut self, kind: i64, name: String, values: Vec<Option<String>>, local: bool) {
        let action = match kind {
            VAR_SET_VALUE => SettingAction::Set(values),
            VAR_SET_DEFAULT => SettingAction::Default,
            VAR_SET_CURRENT => SettingAction::FromCurrent,
            VAR_RESET => SettingAction::Reset,
            VAR_RESET_ALL => SettingAction::ResetAll,
            _ => SettingAction::Multi,
        };
        let name = (kind != VAR_RESET_ALL).then_some(name);
        self.facts.settings.push(SettingChange {
            name,
            action,
            local,
        });
    }

    fn close_def(&mut self, name: &str, has_arg: bool, value: Option<String>) {
        if has_arg && ["transaction_read_only", "concurrently"].contains(&name) {
            self.constants.values_read = true;
        }
        if name == "transaction_read_only" && value.as_deref() != Some("1") {
            self.find(Finding::ReadWrite);
        }
        if name == "concurrently" && (!has_arg || value.as_deref().is_some_and(true_option)) {
            if let Some(Frame {
                acc: Acc::Reindex { concurrent },
                ..
            }) = self.stack.last_mut()
            {
                *concurrent = true;
            }
        }
    }
}

/// Whether PostgreSQL's `defGetBoolean` reads an option's value as true (any other value is
/// false or an error).
fn true_option(value: &str) -> bool {
    ["true", "on", "1"]
        .iter()
        .any(|t| value.eq_ignore_ascii_case(t))
}

impl Events for Collector {
    fn enter(&mut self, name: &'static str) {
        match name {
            "IntoClause" if self.top().is_some_and(|(n, _)| n == "SelectStmt") => {
                self.find(Finding::SelectInto)
            }
            "LockingClause" => self.find(Finding::RowLock),
            _ => {}
        }
        if name.ends_with("Stmt") {
            if let Some((level, _)) = classify(name) {
                self.statement(name, level);
            }
        }
        self.non_constant_element(name);
        self.stack.push(Frame {
            name,
            field: "",
            acc: Self::acc_for(name),
        });
    }

    fn leave(&mut self) {
        if let Some(frame) = self.stack.pop() {
            self.close(frame);
        }
    }

    fn field(&mut self, key: &'static str) {
        if let Some(top) = self.stack.last_mut() {
            top.field = key;
        }
    }

    fn string(&mut self, value: &str) {
        let Some(top) = self.stack.last_mut() else {
            return;
        };
        match (top.name, top.field, &mut top.acc) {
            ("String", "sval", _) => self.string_node(value),
            ("Float", "fval", _) => self.set_const(value.to_string()),
            ("RangeVar", "schemaname", _)
            | ("CreateSchemaStmt", "schemaname", _)
            | ("AlterObjectSchemaStmt", "newschema", _) => self.schema(value),
            ("CopyStmt", "filename", _) if !value.is_empty() => self.find(Finding::CopyFile),
            (_, "name", Acc::Set { name, .. }) | (_, "defname", Acc::Def { name, .. }) => {
                *name = value.to_string()
            }
            _ => {}
        }
    }

    fn int(&mut self, value: i64) {
        let Some(top) = self.stack.last_mut() else {
            return;
        };
        match (top.field, &mut top.acc) {
            ("location", _) if top.name == "AConst" => self.constants.locations.push(value),
            ("remove_type", Acc::Drop { index, .. }) => *index = value == OBJECT_INDEX,
            ("kind", Acc::Set { kind, .. }) => *kind = value,
            ("ival", _) if top.name == "Integer" => self.set_const(value.to_string()),
            _ => {}
        }
    }

    fn boolean(&mut self, value: bool) {
        let Some((name, field)) = self.top() else {
            return;
        };
        match (name, field) {
            ("CopyStmt", "is_from") if value => self.find(Finding::CopyFrom),
            ("CopyStmt", "is_program") if value => self.find(Finding::CopyProgram),
            ("Boolean", "boolval") => self.set_const(value.to_string()),
            ("RangeVar", "inh") if self.parent() == Some(("IndexStmt", "relation")) => {
                if let Some(Frame {
                    acc: Acc::Index { only, .. },
                    ..
                }) = self.parent_mut()
                {
                    *only = !value;
                }
            }
            _ => self.flag(field, value),
        }
    }

    fn none(&mut self) {
        match self.top() {
            Some(("UpdateStmt", "where_clause")) => self.find(Finding::UpdateWithoutWhere),
            Some(("DeleteStmt", "where_clause")) => self.find(Finding::DeleteWithoutWhere),
            _ => {}
        }
    }
}

impl Collector {
    /// Boolean fields kept by the innermost struct's accumulator.
    fn flag(&mut self, field: &str, value: bool) {
        let Some(top) = self.stack.last_mut() else {
            return;
        };
        match (field, &mut top.acc) {
            ("concurrent", Acc::Index { concurrent, .. } | Acc::Drop { concurrent, .. }) => {
                *concurrent = value
            }
            ("is_local", Acc::Set { local, .. }) => *local = value,
            _ => {}
        }
    }
}
