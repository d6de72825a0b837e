use super::*;
use crate::sql::{Analyzer, ParseContext, Setting};

const ALL_RULES: &str = r#"
trusted_roles = ["app"]

[tenants.quiet]
mode = "warn"

[tenants.acme]
priority = "normal"
roles = ["acme_rw"]

[[rules]]
rule = "deny_ddl"
[[rules]]
rule = "require_where"
[[rules]]
rule = "index_concurrently"
mode = "warn"
[[rules]]
rule = "schema_allowlist"
schemas = ["public", "app"]
[[rules]]
rule = "deny_functions"
"#;

fn policy(text: &str) -> Policy {
    Policy::parse(text, Path::new("policy.toml"), Path::new(".")).unwrap()
}

fn who(role: &str) -> Who<'_> {
    Who {
        role,
        application_name: "psql",
        client_addr: Some("10.1.2.3".parse().unwrap()),
    }
}

fn judge_as(p: &Policy, sql: &str, role: &str) -> Verdict {
    let analyzer = Analyzer::new(p.depth(), 64);
    p.judge(
        &analyzer.analyze(sql.as_bytes(), &ParseContext::server_defaults()),
        &who(role),
    )
}

fn rejected_by(p: &Policy, sql: &str) -> Option<String> {
    match judge_as(p, sql, "bob") {
        Verdict::Reject(hit) => Some(hit.rule),
        _ => None,
    }
}

fn warned_by(p: &Policy, sql: &str) -> Vec<String> {
    match judge_as(p, sql, "bob") {
        Verdict::Warn(hits) => hits.into_iter().map(|h| h.rule).collect(),
        _ => Vec::new(),
    }
}

#[test]
fn deny_ddl() {
    let p = policy(ALL_RULES);
    for sql in [
        "CREATE TABLE t (a int)",
        "DROP TABLE t",
        "ALTER TABLE t ADD b int",
        "SELECT 1 INTO x",
        "DO $$BEGIN END$$",
        "CALL p()",
        "GRANT SELECT ON t TO r",
        "SELECT 1; CREATE VIEW v AS SELECT 1",
        "EXPLAIN ANALYZE CREATE TABLE x AS SELECT 1",
        "CREATE TEMP TABLE x AS SELECT 1",
    ] {
        assert_eq!(rejected_by(&p, sql).as_deref(), Some("deny_ddl"), "{sql}");
    }
    for sql in [
        "SELECT 1",
        "SHOW work_mem",
        "VACUUM t",
        "BEGIN",
        "select 'a;drop table x'",
        "LOCK TABLE t",
    ] {
        assert_eq!(rejected_by(&p, sql), None, "{sql}");
    }
}

#[test]
fn require_where() {
    let p = policy(ALL_RULES);
    for sql in [
        "UPDATE t SET a = 1",
        "DELETE FROM t",
        "TRUNCATE t",
        "WITH d AS (DELETE FROM t RETURNING 1) SELECT * FROM d",
        "EXPLAIN ANALYZE DELETE FROM t",
        "PREPARE p AS UPDATE t SET a = $1",
        "SELECT 1; DELETE FROM t",
    ] {
        assert_eq!(
            rejected_by(&p, sql).as_deref(),
            Some("require_where"),
            "{sql}"
        );
    }
    for sql in [
        "UPDATE t SET a = 1 WHERE true",
        "DELETE FROM t WHERE id = 1",
        "EXPLAIN DELETE FROM t WHERE id = 1",
    ] {
        assert_eq!(rejected_by(&p, sql), None, "{sql}");
    }
}

#[test]
fn index_concurrently_in_warn_mode_only_warns() {
    let p = policy(ALL_RULES);
    assert_eq!(warned_by(&p, "REINDEX TABLE t"), vec!["index_concurrently"]);
    assert!(warned_by(&p, "REINDEX TABLE CONCURRENTLY t").is_empty());
    // CREATE INDEX is DDL as well: deny_ddl refuses it first.
    assert_eq!(
        rejected_by(&p, "CREATE INDEX i ON t (a)").as_deref(),
        Some("deny_ddl")
    );
}

#[test]
fn schema_allowlist() {
    let p = policy(ALL_RULES);
    for sql in [
        "SELECT * FROM evil.t",
        "SET search_path = evil",
        "SET LOCAL search_path = public, evil",
        "SELECT evil.f()",
        "SELECT 1::evil.ty",
        "SET search_path = public; SELECT * FROM evil.t",
    ] {
        assert!(rejected_by(&p, sql).is_some(), "{sql}");
    }
    assert_eq!(
        rejected_by(&p, "SET search_path = evil").as_deref(),
        Some("schema_allowlist")
    );
    for sql in [
        "SELECT * FROM public.t",
        "SELECT * FROM pg_catalog.pg_class",
        "SET search_path = app, public",
        "SELECT * FROM information_schema.tables",
        "SELECT * FROM pg_temp.x",
        "RESET search_path",
        "SELECT * FROM t",
    ] {
        assert_eq!(rejected_by(&p, sql), None, "{sql}");
    }
    assert!(matches!(
        p.judge_startup_search_path("evil", &who("bob")),
        Verdict::Reject(_)
    ));
    assert_eq!(
        p.judge_startup_search_path("public, \"$user\"", &who("public")),
        Verdict::Allow
    );
}

#[test]
fn deny_functions() {
    let p = policy(ALL_RULES);
    for sql in [
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity",
        "SELECT pg_catalog.pg_read_file('/etc/passwd')",
        "SELECT set_config('statement_timeout', '0', false)",
        "SELECT lo_import('/etc/passwd')",
        "SELECT * FROM dblink('x', 'y') AS t(a int)",
        "SELECT pg_advisory_lock(1)",
        "SELECT pg_create_logical_replication_slot('s', 'p')",
        "WITH x AS (SELECT pg_cancel_backend(1)) SELECT 1",
    ] {
        assert_eq!(
            rejected_by(&p, sql).as_deref(),
            Some("deny_functions"),
            "{sql}"
        );
    }
    for sql in [
        "SELECT pg_advisory_xact_lock(1)",
        "SELECT lower('x')",
        "SELECT current_setting('work_mem')",
        "SELECT 'pg_terminate_backend(1)'",
    ] {
        assert_eq!(rejected_by(&p, sql), None, "{sql}");
    }
}

#[test]
fn narrowing_by_role_tenant_application_client_and_tag() {
    let p = policy(
        r#"
trusted_roles = ["app"]
[[rules]]
rule = "deny_ddl"
when = { roles = ["bob", "app"], application_names = ["psql"], clients = ["10.0.0.0/8"], tags = { route = "admin" } }
[[rules]]
rule = "require_where"
when = { tenants = ["acme"] }
"#,
    );
    // Tags only count from trusted roles: bob can never match the tag.
    let cases = [
        ("DROP TABLE t /*route='admin'*/", "bob", false),
        ("DROP TABLE t /*route='admin'*/", "app", true),
        ("DROP TABLE t /*route='other'*/", "app", false),
        ("DELETE FROM t /*tenant='acme'*/", "app", true),
        ("DELETE FROM t /*tenant='acme'*/", "bob", false),
        ("DELETE FROM t", "acme", true),
    ];
    for (sql, role, refused) in cases {
        let verdict = judge_as(&p, sql, role);
        assert_eq!(
            matches!(verdict, Verdict::Reject(_)),
            refused,
            "{sql} as {role}: {verdict:?}"
        );
    }
    let elsewhere = Who {
        role: "app",
        application_name: "psql",
        client_addr: Some("192.168.0.1".parse().unwrap()),
    };
    let a = Analyzer::new(Depth::Tree, 4).analyze(
        b"DROP TABLE t /*route='admin'*/",
        &ParseContext::server_defaults(),
    );
    assert_eq!(p.judge(&a, &elsewhere), Verdict::Allow);
}

#[test]
fn a_tenant_in_warn_mode_is_only_warned() {
    let p = policy(ALL_RULES);
    assert!(matches!(
        judge_as(&p, "DROP TABLE t", "quiet"),
        Verdict::Warn(_)
    ));
    assert!(matches!(
        judge_as(&p, "DROP TABLE t /*tenant='quiet'*/", "app"),
        Verdict::Warn(_)
    ));
    assert!(matches!(
        judge_as(&p, "DROP TABLE t /*tenant='quiet'*/", "bob"),
        Verdict::Reject(_)
    ));
}

#[test]
fn tenants_priorities_and_deadlines() {
    let p = policy(ALL_RULES);
    let tags = |sql: &str| {
        Analyzer::new(Depth::Shape, 4)
            .analyze(sql.as_bytes(), &ParseContext::server_defaults())
            .tags
            .clone()
    };
    let t = tags("SELECT 1 /*tenant='acme',priority='critical',deadline='250ms'*/");
    let trusted = p.identify(&who("app"), &t);
    assert_eq!(trusted.tenant, "acme");
    assert_eq!(trusted.priority, Priority::Critical);
    assert_eq!(trusted.deadline, Some(Duration::from_millis(250)));
    assert!(!trusted.ignored_tags);
    let untrusted = p.identify(&who("bob"), &t);
    assert_eq!(untrusted.tenant, "bob");
    assert_eq!(untrusted.priority, Priority::Normal);
    assert_eq!(untrusted.deadline, None);
    assert!(untrusted.ignored_tags);
    let lower = tags("SELECT 1 /*priority='best_effort'*/");
    let lowered = p.identify(&who("bob"), &lower);
    assert_eq!(lowered.priority, Priority::BestEffort);
    assert!(!lowered.ignored_tags);
    assert_eq!(p.identify(&who("acme_rw"), &Tags::default()).tenant, "acme");
}

#[test]
fn unchecked_statements_fail_closed_unless_allowed() {
    let p = policy(ALL_RULES);
    assert_eq!(rejected_by(&p, "SELEC 1").as_deref(), Some("unchecked"));
    let unknown = ParseContext {
        standard_conforming_strings: Setting::Unknown,
        ..ParseContext::server_defaults()
    };
    let a = Analyzer::new(Depth::Tree, 4).analyze(b"SELECT 'a\\'", &unknown);
    assert!(matches!(p.judge(&a, &who("bob")), Verdict::Reject(_)));
    let lenient = policy("unchecked = \"allow\"");
    assert!(matches!(
        lenient.judge(&Analysis::function_call(), &who("bob")),
        Verdict::Warn(_)
    ));
}

#[test]
fn learned_allowlist() {
    let dir = tempfile::tempdir().unwrap();
    let text = "[allowlist]\nfile = \"allow.json\"\nroles = { agent = \"learn\" }\n";
    let learning = Policy::parse(text, &dir.path().join("p.toml"), dir.path()).unwrap();
    assert_eq!(
        judge_as(&learning, "SELECT * FROM t WHERE id = 1", "agent"),
        Verdict::Allow
    );
    assert!(learning.allowlist().unwrap().save().unwrap());
    let enforcing = Policy::parse(
        &text.replace("learn", "enforce"),
        &dir.path().join("p.toml"),
        dir.path(),
    )
    .unwrap();
    assert_eq!(
        judge_as(&enforcing, "SELECT * FROM t WHERE id = 42", "agent"),
        Verdict::Allow
    );
    let Verdict::Reject(hit) =
        judge_as(&enforcing, "SELECT * FROM t WHERE id = 1 OR 1 = 1", "agent")
    else {
        panic!("not refused")
    };
    assert_eq!((hit.rule.as_str(), hit.sqlstate), ("allowlist", "42501"));
    assert_eq!(
        judge_as(&enforcing, "SELECT 2", "someone_else"),
        Verdict::Allow
    );
}

#[test]
fn refusals_name_the_rule_and_fingerprint_and_never_client_text() {
    let p = policy(ALL_RULES);
    let Verdict::Reject(hit) = judge_as(&p, "DELETE FROM secret_table_name", "bob") else {
        panic!()
    };
    assert_eq!(hit.sqlstate, "42501");
    assert!(hit.message.contains("require_where"));
    assert!(hit.hint.contains(&hit.fingerprint));
    assert!(!hit.hint.contains("secret") && !hit.message.contains("secret"));
    let sql = hit.raise_sql();
    assert!(
        sql.starts_with("DO $pgward$BEGIN RAISE EXCEPTION USING ERRCODE = '42501'"),
        "{sql}"
    );
    assert!(sql.ends_with("END$pgward$"));
    assert!(!sql.contains("secret"));
    let evil = RuleHit {
        message: "x'; DROP TABLE t; --$pgward$".into(),
        ..hit
    };
    assert!(!evil.raise_sql().contains("x'"));
    // It parses as one DO statement.
    let a = Analyzer::new(Depth::Tree, 4).analyze(
        evil.raise_sql().as_bytes(),
        &ParseContext::server_defaults(),
    );
    assert_eq!(a.facts().unwrap().top_kinds, vec!["DoStmt"]);
}

#[test]
fn errors_name_the_file_and_line() {
    let error = |text: &str| {
        Policy::parse(text, Path::new("p.toml"), Path::new("."))
            .unwrap_err()
            .to_string()
    };
    let cases = [
        (
            "trusted_roles = [\"a\"]\n[[rules]]\nrule = \"deny_everything\"\n",
            "deny_everything",
        ),
        (
            "\n\n[[rules]]\nrule = \"deny_ddl\"\nschemas = [\"x\"]\n",
            "schemas",
        ),
        (
            "[[rules]]\nrule = \"deny_ddl\"\nwhen = { clients = [\"10.0.0.0/99\"] }\n",
            "10.0.0.0/99",
        ),
        (
            "\n\n[tenants.acme]\nwhen_over = \"sometimes\"\n",
            "when_over",
        ),
        ("\n\n[gate]\nqueue_timeout = \"soon\"\n", "queue_timeout"),
        ("\n\n[tenants.acme]\nrate = -5\n", "rate"),
        ("\n\n[gate]\nmin_active = 2\n", "adaptive = true"),
        (
            "\n\n[gate]\nadaptive = true\nmax_active = 4\nmin_active = 5\n",
            "min_active 5 is above max_active",
        ),
        (
            "\n\n[gate]\nadaptive = true\nstanding_wait = \"0\"\n",
            "standing_wait",
        ),
    ];
    for (text, mentions) in cases {
        let err = error(text);
        assert!(
            err.starts_with("p.toml:3:") && err.contains(mentions),
            "{err}"
        );
    }
    assert!(error("bogus = 1").starts_with("p.toml:1:"));
}

#[test]
fn gate_settings_and_tenant_budgets_are_read() {
    let p = policy(
        "[gate]\nqueue_timeout = \"5s\"\nmax_active = 3\nmax_cost = 100\n\
         [tenants.acme]\nroles = [\"a\"]\nrate = 10\nburst = 50\nwhen_over = \"slow\"\n\
         statement_timeout = \"2s\"\nmax_cost = 7\n",
    );
    let gate = p.gate();
    assert_eq!(
        gate.settings.queue_timeout,
        Some(std::time::Duration::from_secs(5))
    );
    assert_eq!(gate.settings.lanes.fast, 3);
    let (name, config) = p.tenant_configs().next().unwrap();
    assert_eq!(name, "acme");
    assert_eq!(config.words(), "rate=10 burst=50 when_over=slow");
    assert_eq!(
        config.timeouts.statement,
        Some(std::time::Duration::from_secs(2))
    );
    assert_eq!(p.cost_limits("acme").max_cost, Some(7.0));
    assert_eq!(p.cost_limits("other").max_cost, Some(100.0));
    // Without a [gate] table the pools alone limit how much runs at once.
    assert_eq!(policy("").gate().settings.lanes.fast, UNLIMITED_ACTIVE);
    assert_eq!(p.gate().settings.adaptive, None);
    let adaptive = policy("[gate]\nadaptive = true\nmax_active = 8\nmin_active = 2\n");
    let settings = adaptive.gate().settings.adaptive.expect("adaptive");
    assert_eq!(
        (settings.floor, settings.standing_wait),
        (2, std::time::Duration::from_secs(1))
    );
}

#[test]
fn the_shipped_policies_load() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for file in ["etc/policy.toml", "etc/presets/ai-agent.toml"] {
        let p = Policy::load(&root.join(file)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(p.depth(), Depth::Tree);
    }
}

#[test]
fn the_server_reading_keys() {
    use std::time::Duration;
    let watch = |text: &str| policy(text).gate().watch;
    let default = watch("");
    assert!(default.reading);
    assert_eq!(default.lock_wait, Some(Duration::from_secs(2)));
    assert_eq!(default.horizon, None);
    let set =
        watch("[gate]\nserver_reading = false\nlock_wait = \"off\"\nhorizon_max_age = \"10m\"\n");
    assert!(!set.reading);
    assert_eq!(set.lock_wait, None);
    assert_eq!(
        set.horizon,
        Some(crate::policy::HorizonPolicy {
            max_age: Duration::from_secs(600),
            dead_rows: crate::policy::DEFAULT_HORIZON_DEAD_ROWS,
        })
    );
    assert_eq!(
        watch("[gate]\nlock_wait = \"0\"\n").lock_wait,
        Some(Duration::ZERO)
    );
    for bad in [
        "[gate]\nlock_wait = \"soon\"\n",
        "[gate]\nhorizon_max_age = \"0\"\n",
        "[gate]\nhorizon_dead_rows = 5\n",
    ] {
        let e = Policy::parse(bad, Path::new("p.toml"), Path::new("."));
        assert!(e.is_err(), "{bad}");
    }
}

#[test]
fn the_decisions_table_names_the_log_beside_the_policy_and_its_bounds() {
    let parse = |text: &str| Policy::parse(text, Path::new("etc/p.toml"), Path::new("etc"));
    let none = parse("").unwrap();
    assert_eq!(none.decisions(), &DecisionPolicy::default());
    assert_eq!(none.decisions().file, None);
    let d = parse("[decisions]\nfile = \"d.jsonl\"\nwait_over = \"250ms\"\nmax_per_second = 5\n")
        .unwrap();
    assert_eq!(
        d.decisions(),
        &DecisionPolicy {
            file: Some(PathBuf::from("etc/d.jsonl")),
            wait_over: Some(Duration::from_millis(250)),
            max_per_second: 5,
        }
    );
    let off = parse("[decisions]\nfile = \"/var/log/d\"\nwait_over = \"off\"\n").unwrap();
    assert_eq!(off.decisions().file, Some(PathBuf::from("/var/log/d")));
    assert_eq!(off.decisions().wait_over, None);
    for (bad, says) in [
        ("\n[decisions]\nwait_over = \"soon\"\n", "p.toml:2"),
        ("[decisions]\nmax_per_second = 0\n", "max_per_second"),
        ("[decisions]\nfiles = \"x\"\n", "files"),
    ] {
        let e = parse(bad).unwrap_err().to_string();
        assert!(e.contains(says), "{bad}: {e}");
    }
}

#[test]
fn the_anomalies_table_sets_the_minute_and_its_bounds() {
    use crate::policy::AnomalySettings;
    let parse = |text: &str| Policy::parse(text, Path::new("p.toml"), Path::new("."));
    assert_eq!(parse("").unwrap().anomalies(), AnomalySettings::default());
    let a = parse("[anomalies]\nminute = \"2s\"\nmin_statements = 10\nbaseline_minutes = 3\n")
        .unwrap()
        .anomalies();
    assert_eq!(a.minute, Duration::from_secs(2));
    assert_eq!(
        (a.min_statements, a.baseline_minutes, a.min_baseline),
        (10, 3, 3)
    );
    for (bad, says) in [
        ("\n[anomalies]\nminute = \"10ms\"\n", "p.toml:2"),
        ("[anomalies]\nbaseline_minutes = 1\n", "baseline_minutes"),
        ("[anomalies]\nminutes = \"1s\"\n", "minutes"),
    ] {
        let e = parse(bad).unwrap_err().to_string();
        assert!(e.contains(says), "{bad}: {e}");
    }
}

#[test]
fn the_fleet_table_takes_a_store_an_instance_and_bounded_timings() {
    let parse = |text: &str| Policy::parse(text, Path::new("p.toml"), Path::new("."));
    let f = parse("[fleet]\nstore = \"state\"\ninstance = 3\nlease = \"5s\"\n").unwrap();
    let f = f.fleet().expect("a fleet").clone();
    assert_eq!((f.instance, f.lease), (Some(3), Duration::from_secs(5)));
    assert_eq!(f.fallback, Duration::from_secs(60));
    for (bad, says) in [
        ("\n[fleet]\nstore = \"s\"\ninstance = 0\n", "p.toml:2"),
        (
            "[fleet]\nstore = \"s\"\ninstance = 3000000000\n",
            "instance",
        ),
        ("[fleet]\nstore = \"s\"\nlease = \"0s\"\n", "lease"),
        (
            "[fleet]\nstore = \"s\"\nfallback = \"400000d\"\n",
            "fallback",
        ),
        ("[fleet]\nstore = \"\"\n", "store"),
    ] {
        let e = parse(bad).unwrap_err().to_string();
        assert!(e.contains(says), "{bad}: {e}");
    }
}
