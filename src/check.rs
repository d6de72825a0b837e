//! `pgward check --policy FILE CORPUS.sql...`: runs a corpus of cases against a policy without
//! starting the pooler.
//!
//! A corpus is SQL with marker lines. Each case is a marker followed by the text up to the next
//! marker or directive (one or more statements, sent as one Query message):
//!
//! ```sql
//! -- Lines before the first marker are ignored.
//! -- as role=agent application_name=psql client=10.0.0.7
//! -- settings standard_conforming_strings=off client_encoding=UTF8
//! -- reject deny_ddl
//! DROP TABLE orders;
//! -- reject
//! DELETE FROM orders;
//! -- warn index_concurrently
//! REINDEX TABLE orders;
//! -- allow
//! SELECT * FROM orders WHERE id = 1;
//! ```
//!
//! - `-- reject [rule]`: the policy must refuse the case (by that rule, when named).
//! - `-- warn [rule]`: it must let it run with a warning (from that rule, when named).
//! - `-- allow`: it must let it run without a warning.
//! - `-- as key=value...` sets who sends the following cases: `role` (default `check`),
//!   `application_name`, `client` (an IP address). Keys left out keep their value.
//! - `-- settings key=value...` sets the session settings the following cases are read under:
//!   `standard_conforming_strings` (`on`, `off`, `unknown`), `client_encoding` (a name or
//!   `unknown`). Default: the server's defaults (on, UTF8).
//!
//! Other comment lines belong to the case's text. Learned allowlists learn in memory only: the
//! allowlist file is never written.

use crate::policy::{Policy, PolicyError, RuleHit, Verdict, Who};
use crate::sql::{Analyzer, ParseContext, Setting, DEFAULT_CACHE_ENTRIES};
use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

/// Why a check could not run at all.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// The policy file is invalid.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// A corpus file could not be read.
    #[error("{}: {source}", file.display())]
    Io {
        /// The corpus file.
        file: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// A corpus file is malformed.
    #[error("{}:{line}: {message}", file.display())]
    Corpus {
        /// The corpus file.
        file: PathBuf,
        /// 1-based line.
        line: usize,
        /// What is wrong.
        message: String,
    },
}

/// What a case expects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expect {
    /// Refused, by the named rule if any.
    Reject(Option<String>),
    /// Run with a warning, from the named rule if any.
    Warn(Option<String>),
    /// Run without a warning.
    Allow,
}

impl Expect {
    fn matches(&self, verdict: &Verdict) -> bool {
        let named = |rule: &Option<String>, hits: &[RuleHit]| {
            rule.as_ref()
                .is_none_or(|r| hits.iter().any(|h| &h.rule == r))
        };
        match (self, verdict) {
            (Expect::Allow, Verdict::Allow) => true,
            (Expect::Reject(rule), Verdict::Reject(hit)) => named(rule, std::slice::from_ref(hit)),
            (Expect::Warn(rule), Verdict::Warn(hits)) => named(rule, hits),
            _ => false,
        }
    }
}

fn describe(kind: &str, rule: Option<&str>) -> String {
    match rule {
        Some(rule) => format!("{kind} {rule}"),
        None => kind.to_string(),
    }
}

impl fmt::Display for Expect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expect::Reject(rule) => f.write_str(&describe("reject", rule.as_deref())),
            Expect::Warn(rule) => f.write_str(&describe("warn", rule.as_deref())),
            Expect::Allow => f.write_str("allow"),
        }
    }
}

/// A case the policy got wrong.
#[derive(Clone, Debug)]
pub struct Failure {
    /// The corpus file.
    pub file: PathBuf,
    /// The line of the case's marker.
    pub line: usize,
    /// What the case expects.
    pub want: Expect,
    /// What the policy decided, as `reject RULE`, `warn RULE,...` or `allow`.
    pub got: String,
    /// The case's normalized text (never its literals).
    pub text: String,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}: want {}, got {}: {}",
            self.file.display(),
            self.line,
            self.want,
            self.got,
            self.text
        )
    }
}

/// The result of a check.
#[derive(Clone, Debug, Default)]
pub struct CheckReport {
    /// How many cases ran.
    pub cases: usize,
    /// The cases the policy got wrong.
    pub failures: Vec<Failure>,
}

impl CheckReport {
    /// The process exit status: 0 when every case passed, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        i32::from(!self.failures.is_empty())
    }
}

impl fmt::Display for CheckReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for failure in &self.failures {
            writeln!(f, "{failure}")?;
        }
        writeln!(f, "{} cases, {} wrong", self.cases, self.failures.len())
    }
}

/// Runs every case of `corpus_paths` against the policy at `policy_path`.
pub fn run_check(policy_path: &Path, corpus_paths: &[PathBuf]) -> Result<CheckReport, CheckError> {
    let policy = Policy::load(policy_path)?;
    let analyzer = Analyzer::new(policy.depth(), DEFAULT_CACHE_ENTRIES);
    let mut report = CheckReport::default();
    for path in corpus_paths {
        let text = std::fs::read_to_string(path).map_err(|source| CheckError::Io {
            file: path.clone(),
            source,
        })?;
        for case in parse_corpus(&text, path)? {
            report.cases += 1;
            if let Some(failure) = run_case(&policy, &analyzer, &case, path) {
                report.failures.push(failure);
            }
        }
    }
    Ok(report)
}

fn run_case(policy: &Policy, analyzer: &Analyzer, case: &Case, file: &Path) -> Option<Failure> {
    let analysis = analyzer.analyze(case.sql.as_bytes(), &case.context);
    let who = Who {
        role: &case.who.role,
        application_name: &case.who.application_name,
        client_addr: case.who.client,
    };
    let verdict = policy.judge(&analysis, &who);
    if case.expect.matches(&verdict) {
        return None;
    }
    let got = match &verdict {
        Verdict::Allow => "allow".to_string(),
        Verdict::Reject(hit) => describe("reject", Some(&hit.rule)),
        Verdict::Warn(hits) => describe(
            "warn",
            Some(
                &hits
                    .iter()
                    .map(|h| h.rule.as_str())
                    .collect::<Vec<_>>()
                    .join(","),
            ),
        ),
    };
    let text = analysis.log_text().to_string();
    Some(Failure {
        file: file.to_path_buf(),
        line: case.line,
        want: case.expect.clone(),
        got,
        text,
    })
}

/// Who sends a case.
#[derive(Clone, Debug)]
struct Sender {
    role: String,
    application_name: String,
    client: Option<IpAddr>,
}

#[derive(Clone, Debug)]
struct Case {
    line: usize,
    expect: Expect,
    sql: String,
    who: Sender,
    context: ParseContext,
}

/// A marker or directive line.
enum Directive {
    Case(Expect),
    As(Vec<(String, String)>),
    Settings(Vec<(String, String)>),
}

fn directive(line: &str) -> Option<Result<Directive, String>> {
    let rest = line.trim().strip_prefix("--")?.trim();
    let mut words = rest.split_whitespace();
    let first = words.next()?;
    let args: Vec<&str> = words.collect();
    let rule = || args.first().map(|r| r.to_string());
    let pairs = || {
        args.iter()
            .map(|a| {
                a.split_once('=')
                    .map(|(k, v)| (k.to_string(), v.to_string()))
            })
            .collect::<Option<Vec<_>>>()
    };
    let parsed = match (first, args.len()) {
        ("reject", 0 | 1) => Ok(Directive::Case(Expect::Reject(rule()))),
        ("warn", 0 | 1) => Ok(Directive::Case(Expect::Warn(rule()))),
        ("allow", 0) => Ok(Directive::Case(Expect::Allow)),
        ("as", _) => pairs()
            .map(Directive::As)
            .ok_or_else(|| "want `-- as key=value ...`".to_string()),
        ("settings", _) => pairs()
            .map(Directive::Settings)
            .ok_or_else(|| "want `-- settings key=value ...`".to_string()),
        _ => return None,
    };
    Some(parsed)
}

fn apply_as(who: &mut Sender, pairs: Vec<(String, String)>) -> Result<(), String> {
    for (key, value) in pairs {
        match key.as_str() {
            "role" => who.role = value,
            "application_name" => who.application_name = value,
            "client" => {
                who.client = Some(
                    value
                        .parse()
                        .map_err(|_| format!("bad client address {value:?}"))?,
                )
            }
            _ => {
                return Err(format!(
                    "unknown key {key:?} (role, application_name, client)"
                ))
            }
        }
    }
    Ok(())
}

fn apply_settings(context: &mut ParseContext, pairs: Vec<(String, String)>) -> Result<(), String> {
    for (key, value) in pairs {
        match (key.as_str(), value.as_str()) {
            ("standard_conforming_strings", "on") => {
                context.standard_conforming_strings = Setting::Known(true)
            }
            ("standard_conforming_strings", "off") => {
                context.standard_conforming_strings = Setting::Known(false)
            }
            ("standard_conforming_strings", "unknown") => {
                context.standard_conforming_strings = Setting::Unknown
            }
            ("client_encoding", "unknown") => context.client_encoding = Setting::Unknown,
            ("client_encoding", name) => {
                context.client_encoding = Setting::Known(name.to_string().into())
            }
            _ => return Err(format!("unknown setting {key}={value}")),
        }
    }
    Ok(())
}

/// A case being read: its marker line, expectation and text so far.
type Open = (usize, Expect, String);

fn parse_corpus(text: &str, file: &Path) -> Result<Vec<Case>, CheckError> {
    let mut cases = Vec::new();
    let mut who = Sender {
        role: "check".into(),
        application_name: String::new(),
        client: None,
    };
    let mut context = ParseContext::server_defaults();
    let mut open: Option<Open> = None;
    for (index, line) in text.lines().enumerate() {
        let number = index + 1;
        let error = |message: String| CheckError::Corpus {
            file: file.to_path_buf(),
            line: number,
            message,
        };
        let Some(parsed) = directive(line) else {
            if let Some((_, _, sql)) = open.as_mut() {
                sql.push_str(line);
                sql.push('\n');
            }
            continue;
        };
        close(open.take(), &who, &context, &mut cases).map_err(|(line, m)| CheckError::Corpus {
            file: file.to_path_buf(),
            line,
            message: m,
        })?;
        match parsed.map_err(error)? {
            Directive::Case(expect) => open = Some((number, expect, String::new())),
            Directive::As(pairs) => apply_as(&mut who, pairs).map_err(error)?,
            Directive::Settings(pairs) => apply_settings(&mut context, pairs).map_err(error)?,
        }
    }
    close(open, &who, &context, &mut cases).map_err(|(line, m)| CheckError::Corpus {
        file: file.to_path_buf(),
        line,
        message: m,
    })?;
    Ok(cases)
}

fn close(
    open: Option<Open>,
    who: &Sender,
    context: &ParseContext,
    cases: &mut Vec<Case>,
) -> Result<(), (usize, String)> {
    let Some((line, expect, sql)) = open else {
        return Ok(());
    };
    let sql = sql.trim().to_string();
    if sql.is_empty() {
        return Err((line, "a case without SQL".to_string()));
    }
    cases.push(Case {
        line,
        expect,
        sql,
        who: who.clone(),
        context: context.clone(),
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn reports_every_wrong_case_with_its_line() {
        let dir = tempfile::tempdir().unwrap();
        let policy = write(
            dir.path(),
            "p.toml",
            "[[rules]]\nrule = \"require_where\"\n",
        );
        let corpus = write(
            dir.path(),
            "c.sql",
            "-- header\n-- reject require_where\nDELETE FROM t;\n-- allow\nDELETE FROM t WHERE id = 'secret';\n\
             -- reject\nSELECT 'secret';\n-- reject deny_ddl\nTRUNCATE t;\n",
        );
        let report = run_check(&policy, &[corpus]).unwrap();
        assert_eq!(report.cases, 4);
        let lines: Vec<String> = report.failures.iter().map(|f| f.to_string()).collect();
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(
            lines[0].ends_with("c.sql:6: want reject, got allow: SELECT $1;"),
            "{}",
            lines[0]
        );
        assert!(
            lines[1].contains("c.sql:8: want reject deny_ddl, got reject require_where"),
            "{}",
            lines[1]
        );
        assert_eq!(report.exit_code(), 1);
    }

    #[test]
    fn directives_set_who_and_settings() {
        let dir = tempfile::tempdir().unwrap();
        let policy = write(
            dir.path(),
            "p.toml",
            "[[rules]]\nrule = \"require_where\"\nwhen = { roles = [\"a\"] }\n",
        );
        let corpus = write(
            dir.path(),
            "c.sql",
            "-- allow\nDELETE FROM t\n-- as role=a client=127.0.0.1\n-- reject\nDELETE FROM t\n\
             -- settings standard_conforming_strings=unknown\n-- reject unchecked\nSELECT 'a\\'\n",
        );
        let report = run_check(&policy, &[corpus]).unwrap();
        assert_eq!(report.cases, 3);
        assert!(report.failures.is_empty(), "{report}");
    }

    #[test]
    fn malformed_corpora_say_where() {
        let dir = tempfile::tempdir().unwrap();
        let policy = write(dir.path(), "p.toml", "");
        let empty = write(dir.path(), "e.sql", "-- allow\n\n-- allow\nSELECT 1\n");
        assert!(run_check(&policy, &[empty])
            .unwrap_err()
            .to_string()
            .ends_with("e.sql:1: a case without SQL"));
        let bad = write(dir.path(), "b.sql", "-- as role\n");
        assert!(run_check(&policy, &[bad])
            .unwrap_err()
            .to_string()
            .contains("b.sql:1:"));
    }

    #[test]
    fn the_ai_agent_preset_passes_its_corpus() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let report = run_check(
            &root.join("etc/presets/ai-agent.toml"),
            &[root.join("tests/check_corpus/ai-agent.sql")],
        )
        .unwrap();
        assert!(report.cases >= 60, "only {} cases", report.cases);
        assert!(report.failures.is_empty(), "{report}");
    }
}
