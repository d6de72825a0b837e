//! Plans captured from PostgreSQL 15 (`fixtures/`), with tables `public.orders` (200,000 rows),
//! `archive.orders` (50,000) and `public.customers` (1,000).

use super::*;
use std::time::{Duration, Instant};

fn fixture(name: &str) -> PlanSummary {
    let text = match name {
        "index_scan" => include_str!("fixtures/index_scan.json"),
        "seq_scan_filter" => include_str!("fixtures/seq_scan_filter.json"),
        "parallel_seq_scan" => include_str!("fixtures/parallel_seq_scan.json"),
        "join_three" => include_str!("fixtures/join_three.json"),
        "update_seq" => include_str!("fixtures/update_seq.json"),
        "result_only" => include_str!("fixtures/result_only.json"),
        "execute_prepared" => include_str!("fixtures/execute_prepared.json"),
        "subplan" => include_str!("fixtures/subplan.json"),
        _ => "",
    };
    match PlanSummary::from_json(text) {
        Ok(plan) => plan,
        Err(e) => panic!("{name}: {e}"),
    }
}

fn rel(schema: &str, name: &str) -> Relation {
    Relation {
        schema: schema.into(),
        name: name.into(),
    }
}

fn scanned(plan: &PlanSummary) -> Vec<String> {
    plan.full_scans
        .iter()
        .map(|s| s.relation.to_string())
        .collect()
}

fn sizes(r: &Relation) -> Option<f64> {
    match (r.schema.as_str(), r.name.as_str()) {
        ("public", "orders") => Some(200_000.0),
        ("archive", "orders") => Some(50_000.0),
        ("public", "customers") => Some(1_000.0),
        _ => None,
    }
}

#[test]
fn index_scan_reads_nothing_in_full() {
    let plan = fixture("index_scan");
    assert!(plan.total_cost > 0.0 && plan.total_cost < 10.0);
    assert!(plan.full_scans.is_empty());
    assert_eq!(plan.shape.nodes.len(), 1);
    assert_eq!(plan.shape.nodes[0].node_type, "Index Scan");
}

#[test]
fn filtered_seq_scan_counts_the_whole_table() {
    let plan = fixture("seq_scan_filter");
    assert_eq!(scanned(&plan), ["public.orders"]);
    // Plan Rows is what passes the filter; the table's size is what is read.
    assert!(plan.full_scans[0].plan_rows < 10.0);
    assert_eq!(plan.scan_rows(sizes), 200_000.0);
    assert_eq!(plan.scan_rows(|_| None), plan.full_scans[0].plan_rows);
}

#[test]
fn parallel_seq_scan_under_gather_counts() {
    let plan = fixture("parallel_seq_scan");
    assert_eq!(plan.total_cost, 2617.0);
    assert_eq!(scanned(&plan), ["public.orders"]);
    assert!(plan.full_scans[0].parallel);
    let types: Vec<&str> = plan
        .shape
        .nodes
        .iter()
        .map(|n| n.node_type.as_str())
        .collect();
    assert_eq!(
        types,
        ["Aggregate", "Gather", "Aggregate", "Parallel Seq Scan"]
    );
    let depths: Vec<u16> = plan.shape.nodes.iter().map(|n| n.depth).collect();
    assert_eq!(depths, [0, 1, 2, 3]);
}

#[test]
fn root_cost_is_the_plan_cost_and_schemas_tell_tables_apart() {
    let plan = fixture("join_three");
    // The merge join stops early: its child's cost is larger than the root's.
    assert_eq!(plan.total_cost, 4253.91);
    assert_eq!(scanned(&plan), ["public.customers"]);
    let relations: Vec<String> = plan
        .shape
        .nodes
        .iter()
        .filter_map(|n| n.relation.as_ref().map(|r| r.to_string()))
        .collect();
    assert!(relations.contains(&"archive.orders".to_string()));
    assert!(relations.contains(&"public.orders".to_string()));
}

#[test]
fn a_table_read_twice_counts_once() {
    let plan = fixture("subplan");
    assert_eq!(scanned(&plan), ["archive.orders", "public.customers"]);
    assert_eq!(plan.scan_rows(sizes), 51_000.0);
}

#[test]
fn writes_and_prepared_statements_are_planned() {
    assert_eq!(scanned(&fixture("update_seq")), ["archive.orders"]);
    assert_eq!(
        fixture("update_seq").shape.nodes[0].node_type,
        "ModifyTable"
    );
    assert_eq!(scanned(&fixture("execute_prepared")), ["public.orders"]);
    let result = fixture("result_only");
    assert!(result.full_scans.is_empty());
    assert_eq!(result.total_cost, 0.01);
}

#[test]
fn shapes_ignore_costs_but_not_node_types() {
    let a = fixture("seq_scan_filter");
    let mut b = a.clone();
    b.total_cost *= 10.0;
    assert_eq!(a.shape.fingerprint(), b.shape.fingerprint());
    assert_ne!(
        a.shape.fingerprint(),
        fixture("parallel_seq_scan").shape.fingerprint()
    );
    assert_ne!(
        fixture("index_scan").shape.fingerprint(),
        fixture("execute_prepared").shape.fingerprint()
    );
    for name in ["seq_scan_filter", "parallel_seq_scan", "index_scan"] {
        let plan = fixture(name);
        assert_eq!(plan.shape_fingerprint, plan.shape.fingerprint(), "{name}");
    }
}

#[test]
fn bad_answers_are_errors() {
    assert!(matches!(
        PlanSummary::from_json("nope"),
        Err(CostError::Json(_))
    ));
    assert_eq!(PlanSummary::from_json("[]"), Err(CostError::NoPlan));
    assert_eq!(
        PlanSummary::from_json(r#"[{"Plan": {"Node Type": "Result"}}]"#),
        Err(CostError::Missing("Total Cost"))
    );
    let deep = "[".repeat(10_000);
    assert!(PlanSummary::from_json(&deep).is_err());
}

#[test]
fn max_cost_detail_has_numbers_only() {
    let plan = fixture("parallel_seq_scan");
    let limits = CostLimits {
        max_cost: Some(1000.0),
        max_scan_rows: None,
        max_time: None,
    };
    let v = limits.check(&plan, None, sizes).expect("over max_cost");
    assert_eq!(v.rule, CostRule::MaxCost);
    assert_eq!(v.sqlstate(), "54000");
    assert_eq!(v.detail(), "planned cost 2617 is over the limit 1000");
    assert!(!v.detail().contains("orders") && !v.message().contains("orders"));
    assert_eq!(v.tables, [rel("public", "orders")]);
    let relaxed = CostLimits {
        max_cost: Some(3000.0),
        ..limits
    };
    assert_eq!(relaxed.check(&plan, None, sizes), None);
}

#[test]
fn max_time_judges_the_predicted_seconds() {
    let plan = fixture("parallel_seq_scan");
    let limits = CostLimits {
        max_time: Some(0.5),
        ..CostLimits::default()
    };
    assert!(limits.any());
    assert_eq!(limits.check(&plan, Some(0.4), sizes), None);
    assert_eq!(
        limits.check(&plan, None, sizes),
        None,
        "no learned prediction: no verdict"
    );
    let v = limits
        .check(&plan, Some(0.75), sizes)
        .expect("over max_time");
    assert_eq!(v.rule, CostRule::MaxTime);
    assert_eq!(v.sqlstate(), "54000");
    assert_eq!(v.detail(), "predicted time 0.750 s is over the limit 0.5 s");
    assert!(!CostLimits::default().any());
}

#[test]
fn max_scan_rows_sums_table_sizes() {
    let limits = CostLimits {
        max_cost: None,
        max_scan_rows: Some(50_500.0),
        max_time: None,
    };
    let v = limits
        .check(&fixture("subplan"), None, sizes)
        .expect("over max_scan_rows");
    assert_eq!(v.rule, CostRule::MaxScanRows);
    assert_eq!(
        v.detail(),
        "rows read in full 51000 is over the limit 50500"
    );
    assert_eq!(limits.check(&fixture("index_scan"), None, sizes), None);
    assert_eq!(limits.check(&fixture("join_three"), None, sizes), None);
}

#[test]
fn judged_statements() {
    let plan = |s| judged_statement(s, true);
    assert_eq!(plan("SELECT 1"), Judged::Plan("SELECT 1"));
    // standard_conforming_strings off (or unknown): a backslash leaves the ends unknown.
    let hidden = r"SELECT count(*) FROM t WHERE x <> '\'; x; --'";
    assert_eq!(
        plan(hidden),
        Judged::MinCharge,
        "two statements, with it on"
    );
    assert_eq!(judged_statement(hidden, false), Judged::Unreadable);
    assert_eq!(
        judged_statement("SELECT 1", false),
        Judged::Plan("SELECT 1")
    );
    // A backslash outside a plain string reads the same either way.
    let escaped = r"SELECT E'a\'b', $$c\$$ /* \ */";
    let read = r"SELECT E'a\'b', $$c\$$";
    assert_eq!(judged_statement(escaped, false), Judged::Plan(read));
    assert_eq!(
        plan("  /* c */ with x as (select 1) select * from x; "),
        Judged::Plan("with x as (select 1) select * from x")
    );
    assert_eq!(
        plan("EXPLAIN ANALYZE SELECT * FROM t"),
        Judged::Plan("SELECT * FROM t")
    );
    assert_eq!(
        plan("explain (analyze, buffers) delete from t"),
        Judged::Plan("delete from t")
    );
    assert_eq!(plan("explain (analyze off) select 1"), Judged::MinCharge);
    assert_eq!(plan("EXPLAIN SELECT * FROM t"), Judged::MinCharge);
    assert_eq!(
        plan("COPY (SELECT a FROM t WHERE b = ')') TO STDOUT"),
        Judged::Plan("SELECT a FROM t WHERE b = ')'")
    );
    assert_eq!(plan("copy s.t (a, b) to stdout"), Judged::WholeTable("s.t"));
    assert_eq!(plan("COPY t FROM STDIN"), Judged::MinCharge);
    assert_eq!(
        plan("EXECUTE q(1, 'x')"),
        Judged::Execute {
            name: "q",
            statement: "EXECUTE q(1, 'x')"
        }
    );
    for none in [
        "BEGIN",
        "SET x = 1",
        "SELECT 1; SELECT 2",
        "",
        "CREATE TABLE t (a int)",
    ] {
        assert_eq!(plan(none), Judged::MinCharge, "{none:?}");
    }
}

#[test]
fn explain_text() {
    assert_eq!(
        explain_sql(&Judged::Plan("SELECT 1")).as_deref(),
        Some("EXPLAIN (FORMAT JSON, VERBOSE) SELECT 1")
    );
    assert_eq!(
        explain_sql(&Judged::WholeTable("s.t")).as_deref(),
        Some("EXPLAIN (FORMAT JSON, VERBOSE) TABLE s.t")
    );
    assert_eq!(explain_sql(&Judged::MinCharge), None);
    let sql = relation_sizes_sql(&[rel("public", "o'x")]).expect("a query");
    assert!(sql.contains("decode('6f2778', 'hex')"));
    assert!(!sql.contains("o'x"));
    assert_eq!(relation_sizes_sql(&[]), None);
}

fn key(fp: u64) -> PlanKey {
    PlanKey {
        database: "db".into(),
        role: "app".into(),
        fingerprint: fp,
        tenant: "t".into(),
        search_path: "".into(),
        generic: false,
    }
}

#[test]
fn plan_cache_expires_after_a_minute() {
    let t0 = Instant::now();
    let mut cache = PlanCache::default();
    assert!(cache.get(&key(1), t0).is_none());
    cache.insert(key(1), fixture("index_scan"), Duration::from_millis(3), t0);
    assert!(cache.get(&key(1), t0 + Duration::from_secs(59)).is_some());
    let other_role = PlanKey {
        role: "other".into(),
        ..key(1)
    };
    assert!(cache.get(&other_role, t0).is_none());
    assert!(cache.get(&key(1), t0 + Duration::from_secs(60)).is_none());
    let stats = cache.stats();
    assert_eq!((stats.hits, stats.misses, stats.explains), (1, 3, 1));
    assert_eq!(stats.hit_rate(), 0.25);
    cache.purge(t0 + Duration::from_secs(60));
    assert!(cache.is_empty());
}

#[test]
fn plan_cache_is_bounded_and_counts_explain_time() {
    let t0 = Instant::now();
    let mut cache = PlanCache::new(PLAN_TTL, 3);
    for fp in 0..5 {
        cache.insert(
            key(fp),
            fixture("result_only"),
            Duration::from_millis(fp + 1),
            t0,
        );
    }
    assert_eq!(cache.len(), 3);
    assert!(cache.get(&key(0), t0).is_none());
    assert!(cache.get(&key(4), t0).is_some());
    cache.record_failure(Duration::from_millis(10));
    let window = cache.take_window();
    assert_eq!((window.explains, window.explain_errors), (6, 1));
    assert_eq!(window.explain_max, Duration::from_millis(10));
    assert_eq!(window.explain_mean(), Duration::from_millis(25) / 6);
    assert_eq!(cache.take_window(), CacheStats::default());
    assert_eq!(cache.stats().explains, 6);
}

#[test]
fn a_plan_prices_other_constants_only_once_several_gave_the_same_plan() {
    let t0 = Instant::now();
    let ms = Duration::from_millis(1);
    let mut cache = PlanCache::default();
    let plan = fixture("index_scan");
    cache.insert_for(key(1), plan.clone(), 11, ms, t0);
    // Explained for these constants only: others are explained too.
    assert!(cache.get_for(&key(1), || 11, t0).is_some());
    assert!(cache.get_for(&key(1), || 12, t0).is_none());
    cache.insert_for(key(1), plan.clone(), 12, ms, t0);
    assert!(cache.get_for(&key(1), || 13, t0).is_none());
    cache.insert_for(key(1), plan.clone(), 13, ms, t0);
    // Three different constants, one plan: it prices any.
    assert!(cache.get_for(&key(1), || 99, t0).is_some());

    // Constants that choose another plan start the proof again.
    cache.insert_for(key(2), plan.clone(), 1, ms, t0);
    cache.insert_for(key(2), fixture("parallel_seq_scan"), 2, ms, t0);
    assert!(cache.get_for(&key(2), || 1, t0).is_none());
    assert!(cache.get_for(&key(2), || 2, t0).is_some());
    // The same shape at a cost far from it does too.
    let mut dearer = plan.clone();
    dearer.total_cost *= 3.0;
    cache.insert_for(key(3), plan.clone(), 1, ms, t0);
    cache.insert_for(key(3), dearer, 2, ms, t0);
    assert!(cache.get_for(&key(3), || 1, t0).is_none());
}
