//! What pgward keeps of an `EXPLAIN (FORMAT JSON, VERBOSE)` plan: the root's total cost, the
//! relations read in full, and the plan's shape.

use super::CostError;
use serde_json::Value;
use std::fmt;

/// Longest EXPLAIN output read (a plan of a very large statement is still far below this).
pub const MAX_PLAN_BYTES: usize = 16 << 20;

/// A table as the plan names it: VERBOSE gives every scanned relation its schema, so
/// `public.orders` and `archive.orders` are told apart.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Relation {
    /// The schema (`Schema` in the plan).
    pub schema: String,
    /// The table (`Relation Name` in the plan).
    pub name: String,
}

impl fmt::Display for Relation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.schema, self.name)
    }
}

/// A relation a `Seq Scan` node reads from start to end.
#[derive(Clone, Debug, PartialEq)]
pub struct FullScan {
    /// The table.
    pub relation: Relation,
    /// The node's `Plan Rows`: rows it returns after its filter, per process for a parallel
    /// scan. Only a lower bound of the table's size.
    pub plan_rows: f64,
    /// A parallel scan (under a Gather).
    pub parallel: bool,
}

/// One node of a plan's shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ShapeNode {
    /// Depth in the tree; the root is 0.
    pub depth: u16,
    /// The node type, with `Parallel ` in front for a parallel-aware node.
    pub node_type: String,
    /// The relation a scan reads, if any.
    pub relation: Option<Relation>,
}

/// The node types of a plan in pre-order: two plans with the same shape read the same tables
/// the same way, whatever their costs. A change of shape for one statement is a plan flip.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct PlanShape {
    /// The nodes, root first, children in the plan's order.
    pub nodes: Vec<ShapeNode>,
}

impl PlanShape {
    /// A hash of the shape that is the same in every build and process (FNV-1a, 64 bits).
    pub fn fingerprint(&self) -> u64 {
        let mut h = Fnv::default();
        for node in &self.nodes {
            h.write(&node.depth.to_le_bytes());
            h.write(node.node_type.as_bytes());
            if let Some(r) = &node.relation {
                h.write(r.schema.as_bytes());
                h.write(b".");
                h.write(r.name.as_bytes());
            }
            h.write(&[0]);
        }
        h.0
    }
}

struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// What a plan says about a statement before it runs.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanSummary {
    /// `Total Cost` of the root node, in the planner's units.
    pub total_cost: f64,
    /// Every relation some Seq Scan node reads, each once, in plan order.
    pub full_scans: Vec<FullScan>,
    /// The plan's shape.
    pub shape: PlanShape,
    /// [`PlanShape::fingerprint`] of `shape`, worked out once (a cached plan prices every run).
    pub shape_fingerprint: u64,
}

impl PlanSummary {
    /// Reads the text of the one row `EXPLAIN (FORMAT JSON, VERBOSE)` returns.
    pub fn from_json(text: &str) -> Result<PlanSummary, CostError> {
        if text.len() > MAX_PLAN_BYTES {
            return Err(CostError::TooLarge(text.len()));
        }
        let value: Value =
            serde_json::from_str(text).map_err(|e| CostError::Json(e.to_string()))?;
        let root = value
            .as_array()
            .and_then(|a| a.first())
            .and_then(|first| first.get("Plan"))
            .ok_or(CostError::NoPlan)?;
        let total_cost = number(root, "Total Cost").ok_or(CostError::Missing("Total Cost"))?;
        let mut summary = PlanSummary {
            total_cost,
            full_scans: Vec::new(),
            shape: PlanShape::default(),
            shape_fingerprint: 0,
        };
        summary.walk(root)?;
        summary.shape_fingerprint = summary.shape.fingerprint();
        Ok(summary)
    }

    /// Visits every node in pre-order without recursion.
    fn walk(&mut self, root: &Value) -> Result<(), CostError> {
        let mut stack: Vec<(u16, &Value)> = vec![(0, root)];
        while let Some((depth, node)) = stack.pop() {
            self.visit(depth, node)?;
            if let Some(children) = node.get("Plans").and_then(Value::as_array) {
                let child_depth = depth.saturating_add(1);
                stack.extend(children.iter().rev().map(|c| (child_depth, c)));
            }
        }
        Ok(())
    }

    fn visit(&mut self, depth: u16, node: &Value) -> Result<(), CostError> {
        let kind = node
            .get("Node Type")
            .and_then(Value::as_str)
            .ok_or(CostError::Missing("Node Type"))?;
        let parallel = node.get("Parallel Aware").and_then(Value::as_bool) == Some(true);
        let relation = relation_of(node);
        if kind == "Seq Scan" {
            let relation = relation
                .clone()
                .ok_or(CostError::Missing("Relation Name"))?;
            self.add_full_scan(FullScan {
                relation,
                plan_rows: number(node, "Plan Rows").unwrap_or(0.0),
                parallel,
            });
        }
        let node_type = if parallel {
            format!("Parallel {kind}")
        } else {
            kind.to_string()
        };
        self.shape.nodes.push(ShapeNode {
            depth,
            node_type,
            relation,
        });
        Ok(())
    }

    fn add_full_scan(&mut self, scan: FullScan) {
        match self
            .full_scans
            .iter_mut()
            .find(|s| s.relation == scan.relation)
        {
            Some(seen) => seen.plan_rows = seen.plan_rows.max(scan.plan_rows),
            None => self.full_scans.push(scan),
        }
    }

    /// The sum of the sizes of the relations read in full. `size` gives a table's row count
    /// (`pg_class.reltuples`, see [`relation_sizes_sql`](super::relation_sizes_sql)); a table it
    /// does not know counts with its scan node's `Plan Rows`, a lower bound.
    pub fn scan_rows(&self, size: impl Fn(&Relation) -> Option<f64>) -> f64 {
        self.full_scans
            .iter()
            .map(|s| size(&s.relation).unwrap_or(s.plan_rows).max(0.0))
            .sum()
    }
}

fn number(node: &Value, key: &str) -> Option<f64> {
    node.get(key)
        .and_then(Value::as_f64)
        .filter(|v| v.is_finite())
}

fn relation_of(node: &Value) -> Option<Relation> {
    let name = node.get("Relation Name").and_then(Value::as_str)?;
    let schema = node.get("Schema").and_then(Value::as_str).unwrap_or("");
    Some(Relation {
        schema: schema.to_string(),
        name: name.to_string(),
    })
}
