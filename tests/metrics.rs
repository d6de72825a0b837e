//! The gate's metrics scraped from a pgward in front of a real PostgreSQL and read by the
//! Prometheus project's own OpenMetrics parser (the Python client's, in the drivers' virtual
//! environment): per-tenant series, the label cap under thousands of tenants named by tags,
//! the plan cache.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::driver::{must_connect, outcome};
use common::gate::{gated, FULL_READ, REJECT_POLICY};
use serde_json::Value;

/// Tenants named by tags, each running one statement.
const TAGGED: usize = 10_000;
/// `prometheus_max_tenants`.
const CAP: usize = 5;

/// The body of GET /metrics.
fn scrape(port: u16) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("metrics port");
    write!(s, "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").expect("request");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("response");
    assert!(text.contains(" 200 "), "{text}");
    text.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default()
}

/// `text` read by prometheus_client's OpenMetrics parser: each family's name, type and
/// samples (name, labels, value). A text it cannot read fails the test.
fn parse(text: &str) -> Vec<Value> {
    const SCRIPT: &str = r#"
import json, math, sys
from prometheus_client.openmetrics.parser import text_string_to_metric_families
out = []
for f in text_string_to_metric_families(sys.stdin.read()):
    out.append({"name": f.name, "type": f.type,
                "samples": [[s.name, s.labels, None if math.isnan(s.value) else s.value]
                            for s in f.samples]})
print(json.dumps(out))
"#;
    let mut child = Command::new(common::venv_python())
        .args(["-c", SCRIPT])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().expect("python");
    assert!(
        out.status.success(),
        "the parser refused the text: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let families: Value = serde_json::from_slice(&out.stdout).expect("json");
    families.as_array().unwrap().clone()
}

fn family<'a>(families: &'a [Value], name: &str) -> &'a Value {
    families
        .iter()
        .find(|f| f["name"] == name)
        .unwrap_or_else(|| panic!("no family {name}"))
}

/// The value of the sample `sample` whose labels include `labels`, if there is one.
fn find(families: &[Value], name: &str, sample: &str, labels: &[(&str, &str)]) -> Option<f64> {
    families.iter().find(|f| f["name"] == name)?["samples"]
        .as_array()?
        .iter()
        .find(|s| s[0] == sample && labels.iter().all(|(k, v)| s[1][*k] == *v))?[2]
        .as_f64()
}

/// [`find`], which must find it.
fn value(families: &[Value], name: &str, sample: &str, labels: &[(&str, &str)]) -> f64 {
    find(families, name, sample, labels).unwrap_or_else(|| panic!("no {sample} {labels:?}"))
}

fn tenant_labels(families: &[Value], name: &str) -> Vec<String> {
    family(families, name)["samples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s[1]["tenant"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_series_stay_within_the_cap_under_ten_thousand_tenants_and_parse() {
    let metrics_port = common::free_port();
    let settings = format!(
        "default_pool_size = 4\nprometheus_listen = 127.0.0.1:{metrics_port}\n\
         prometheus_max_tenants = {CAP}\n"
    );
    let started = std::time::Instant::now();
    let f = gated(
        &format!("trusted_roles = [\"postgres\"]\n{REJECT_POLICY}"),
        &settings,
    );
    // acme: one full read, then refused over its budget.
    let acme = must_connect(&f.pw.connstr("trustuser", None, "app")).await;
    assert_eq!(outcome(&acme.client, FULL_READ).await, "");
    assert_eq!(outcome(&acme.client, FULL_READ).await, "53000");
    // Ten thousand tenants named by tags, one statement each, from one psql.
    common::psql_script(
        f.pw.port,
        (0..TAGGED).map(|i| format!("/*tenant='t{i}'*/ SELECT 1;")),
    );

    let body = scrape(metrics_port);
    let families = parse(&body);
    let known = value(&families, "pgward_tenants", "pgward_tenants", &[]);
    let folded = value(
        &families,
        "pgward_tenants_folded",
        "pgward_tenants_folded",
        &[],
    );
    // Idle tenants named by tags are forgotten once a minute: all ten thousand are known
    // unless that already happened.
    if started.elapsed() < Duration::from_secs(50) {
        assert!(known >= TAGGED as f64, "{known}");
    }
    assert_eq!(folded, known - CAP as f64);
    for name in [
        "pgward_tenant_server_seconds",
        "pgward_tenant_debt_seconds",
        "pgward_tenant_waiting",
        "pgward_tenant_running",
    ] {
        let labels = tenant_labels(&families, name);
        assert_eq!(labels.len(), CAP, "{name}: {labels:?}");
    }
    assert_eq!(
        family(&families, "pgward_tenant_server_seconds")["type"],
        "counter"
    );
    // acme, which ran the most, keeps its own series, with its refusal.
    let acme_labels = [("tenant", "acme"), ("reason", "budget")];
    let refusals = "pgward_tenant_refusals";
    assert_eq!(
        value(
            &families,
            refusals,
            "pgward_tenant_refusals_total",
            &acme_labels
        ),
        1.0
    );
    let debt = value(
        &families,
        "pgward_tenant_debt_seconds",
        "pgward_tenant_debt_seconds",
        &[("tenant", "acme")],
    );
    assert!(debt > 0.0, "{debt}");
    // The totals over every tenant hold at least what the kept ones ran, and acme's refusal.
    let kept: f64 = family(&families, "pgward_tenant_server_seconds")["samples"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s[0] == "pgward_tenant_server_seconds_total")
        .map(|s| s[2].as_f64().unwrap())
        .sum();
    let all = value(
        &families,
        "pgward_gate_server_seconds",
        "pgward_gate_server_seconds_total",
        &[],
    );
    assert!(kept > 0.0 && all >= kept - 1e-9, "{kept} of {all}");
    let budget = [("reason", "budget")];
    assert_eq!(
        value(
            &families,
            "pgward_gate_refusals",
            "pgward_gate_refusals_total",
            &budget
        ),
        1.0
    );
    // The gate's lock was taken for every statement; one worker thread never finds it held.
    let taken = value(
        &families,
        "pgward_gate_lock_acquisitions",
        "pgward_gate_lock_acquisitions_total",
        &[],
    );
    assert!(taken >= 2.0, "{taken}");
    let contended = value(
        &families,
        "pgward_gate_lock_contended",
        "pgward_gate_lock_contended_total",
        &[],
    );
    assert!((0.0..=taken).contains(&contended), "{contended} of {taken}");
    // The plan cache priced the full read.
    let explains = value(&families, "pgward_explains", "pgward_explains_total", &[]);
    assert!(explains >= 1.0, "{explains}");
    let entries = value(
        &families,
        "pgward_plan_cache_entries",
        "pgward_plan_cache_entries",
        &[],
    );
    assert!(entries >= 1.0, "{entries}");
    assert!(body.len() < 64 * 1024, "a scrape of {} bytes", body.len());
    // The statements with the most total time, no more than prometheus_max_statements (20).
    let latency = family(&families, "pgward_statement_latency_seconds")["samples"]
        .as_array()
        .unwrap()
        .clone();
    assert!(
        !latency.is_empty() && latency.len() <= 3 * 20,
        "{}",
        latency.len()
    );
    let read = pgward::sql::Analyzer::new(pgward::sql::Depth::Shape, 4)
        .analyze(
            FULL_READ.as_bytes(),
            &pgward::sql::ParseContext::server_defaults(),
        )
        .fingerprint_hex();
    let p99 = [
        ("fingerprint", read.as_str()),
        ("tenant", "acme"),
        ("percentile", "99"),
    ];
    assert!(
        value(
            &families,
            "pgward_statement_latency_seconds",
            "pgward_statement_latency_seconds",
            &p99
        ) > 0.0
    );
    // Every metric the dashboard in contrib/ reads is one pgward serves.
    let dashboard = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("contrib/grafana-dashboard.json"),
    )
    .expect("the dashboard");
    let mut names: Vec<&str> = dashboard
        .match_indices("pgward_")
        .map(|(at, _)| {
            let rest = &dashboard[at..];
            let end = rest
                .find(|c: char| !(c.is_ascii_lowercase() || c == '_'))
                .unwrap_or(rest.len());
            &rest[..end]
        })
        .filter(|n| *n != "pgward_" && !n.starts_with("pgward_overview"))
        .collect();
    names.sort_unstable();
    names.dedup();
    assert!(names.len() > 10, "{names:?}");
    for name in names {
        let family = name.strip_suffix("_total").unwrap_or(name);
        assert!(
            body.contains(&format!("# TYPE {family} ")),
            "the dashboard reads {name}, which pgward does not serve"
        );
    }
    // Counters never go back: a second scrape after more work has each one at least as high.
    assert_eq!(outcome(&acme.client, FULL_READ).await, "53000");
    let again = parse(&scrape(metrics_port));
    for f in families.iter().filter(|f| f["type"] == "counter") {
        for s in f["samples"].as_array().unwrap() {
            let labels: Vec<(&str, &str)> = s[1]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str().unwrap()))
                .collect();
            let name = f["name"].as_str().unwrap();
            let sample = s[0].as_str().unwrap();
            if !sample.ends_with("_total") {
                continue;
            }
            // (A tenant's series may go: the gate forgets idle tenants named by tags.)
            let Some(now) = find(&again, name, sample, &labels) else {
                assert!(!labels.iter().any(|(k, _)| *k != "tenant" && *k != "reason"));
                assert!(
                    labels.iter().any(|(k, _)| *k == "tenant"),
                    "{sample} is gone"
                );
                continue;
            };
            assert!(
                now >= s[2].as_f64().unwrap(),
                "{sample} {labels:?} went back"
            );
        }
    }
}
