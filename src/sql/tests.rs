use super::*;

fn analyze_with(sql: &str, context: &ParseContext) -> Arc<Analysis> {
    Analyzer::new(Depth::Tree, 16).analyze(sql.as_bytes(), context)
}

fn analyze(sql: &str) -> Arc<Analysis> {
    analyze_with(sql, &ParseContext::server_defaults())
}

fn facts(sql: &str) -> Facts {
    let analysis = analyze(sql);
    match &analysis.reading {
        Reading::Tree(facts) => facts.clone(),
        other => panic!("{sql}: {other:?}"),
    }
}

fn has(sql: &str, finding: Finding) -> bool {
    facts(sql).has(&finding)
}

#[test]
fn fingerprint_ignores_constants_and_normalized_text_hides_them() {
    let a = analyze("SELECT * FROM t WHERE id = 1 AND name = 'secret'");
    let b = analyze("SELECT * FROM t WHERE id = 2 AND name = 'other'");
    assert_eq!(a.fingerprint, b.fingerprint);
    let normalized = a.normalized.as_deref().unwrap();
    assert!(!normalized.contains("secret"), "{normalized}");
    assert!(normalized.contains("$1"));
    assert_ne!(
        a.fingerprint,
        analyze("SELECT * FROM s.t WHERE id = 1").fingerprint
    );
    assert_ne!(
        analyze("SELECT * FROM t1").fingerprint,
        analyze("SELECT * FROM t2").fingerprint
    );
}

#[test]
fn statement_kinds_at_top_level_and_nested() {
    let f = facts("SELECT 1; UPDATE t SET a = 1 WHERE id = 2; EXPLAIN ANALYZE DELETE FROM u");
    assert_eq!(f.top_kinds, vec!["SelectStmt", "UpdateStmt", "ExplainStmt"]);
    assert!(f.statements.contains(&"DeleteStmt"));
    assert!(f.has(&Finding::DeleteWithoutWhere));
}

#[test]
fn a_semicolon_in_a_string_is_not_a_second_statement() {
    let f = facts("select 'a;drop table x'");
    assert_eq!(f.top_kinds, vec!["SelectStmt"]);
    assert!(f.findings.is_empty());
    let f = facts("select E'\\';drop table x; --'");
    assert_eq!(f.top_kinds, vec!["SelectStmt"]);
    let f = facts("select $q$;drop table x;$q$");
    assert_eq!(f.top_kinds, vec!["SelectStmt"]);
}

#[test]
fn where_clauses() {
    assert!(has("UPDATE t SET a = 1", Finding::UpdateWithoutWhere));
    assert!(!has(
        "UPDATE t SET a = 1 WHERE true",
        Finding::UpdateWithoutWhere
    ));
    assert!(has("DELETE FROM t", Finding::DeleteWithoutWhere));
    assert!(!has(
        "DELETE FROM t WHERE id = $1",
        Finding::DeleteWithoutWhere
    ));
    assert!(has(
        "WITH d AS (DELETE FROM t RETURNING *) SELECT * FROM d",
        Finding::DeleteWithoutWhere
    ));
    assert!(has(
        "PREPARE p AS UPDATE t SET a = $1",
        Finding::UpdateWithoutWhere
    ));
    assert!(has("TRUNCATE t", Finding::Truncate));
    // A sub-select's WHERE is not the UPDATE's.
    assert!(has(
        "UPDATE t SET a = (SELECT b FROM u WHERE u.id = 1)",
        Finding::UpdateWithoutWhere
    ));
}

#[test]
fn ddl_and_friends() {
    assert!(has("CREATE TABLE t (a int)", Finding::Ddl("CreateStmt")));
    assert!(has("SELECT 1 INTO t2", Finding::SelectInto));
    assert!(!has("SELECT 1", Finding::SelectInto));
    assert!(has("DO $$BEGIN END$$", Finding::Do));
    assert!(has("CALL p()", Finding::Call));
    assert!(has(
        "EXPLAIN CREATE TABLE x AS SELECT 1",
        Finding::Ddl("CreateTableAsStmt")
    ));
    assert!(has(
        "ALTER ROLE r SET search_path = x",
        Finding::Ddl("AlterRoleSetStmt")
    ));
}

#[test]
fn index_operations() {
    assert!(has(
        "CREATE INDEX i ON t (a)",
        Finding::NotConcurrently(IndexOp::Create)
    ));
    assert!(!has(
        "CREATE INDEX CONCURRENTLY i ON t (a)",
        Finding::NotConcurrently(IndexOp::Create)
    ));
    assert!(!has(
        "CREATE INDEX i ON ONLY t (a)",
        Finding::NotConcurrently(IndexOp::Create)
    ));
    assert!(has("DROP INDEX i", Finding::NotConcurrently(IndexOp::Drop)));
    assert!(!has(
        "DROP INDEX CONCURRENTLY i",
        Finding::NotConcurrently(IndexOp::Drop)
    ));
    assert!(!has(
        "DROP TABLE t",
        Finding::NotConcurrently(IndexOp::Drop)
    ));
    assert!(has(
        "REINDEX TABLE t",
        Finding::NotConcurrently(IndexOp::Reindex)
    ));
    assert!(!has(
        "REINDEX TABLE CONCURRENTLY t",
        Finding::NotConcurrently(IndexOp::Reindex)
    ));
    assert!(!has(
        "REINDEX (CONCURRENTLY) TABLE t",
        Finding::NotConcurrently(IndexOp::Reindex)
    ));
    for yes in ["true", "on", "ON", "1", "'on'"] {
        let sql = format!("REINDEX (CONCURRENTLY {yes}) TABLE t");
        assert!(
            !has(&sql, Finding::NotConcurrently(IndexOp::Reindex)),
            "{sql}"
        );
    }
    for no in ["false", "off", "0", "'off'", "'false'", "2", "maybe"] {
        let sql = format!("REINDEX (CONCURRENTLY {no}) TABLE t");
        assert!(
            has(&sql, Finding::NotConcurrently(IndexOp::Reindex)),
            "{sql}"
        );
    }
}

#[test]
fn functions_with_and_without_schema() {
    let f = facts("SELECT pg_catalog.set_config('a', 'b', false), lower(x) FROM t, pg_ls_dir('.')");
    let names: Vec<String> = f.functions.iter().map(|f| f.to_string()).collect();
    assert!(
        names.contains(&"pg_catalog.set_config".to_string()),
        "{names:?}"
    );
    assert!(names.contains(&"lower".to_string()));
    assert!(names.contains(&"pg_ls_dir".to_string()));
    let f = facts("WITH x AS (SELECT pg_terminate_backend(1)) SELECT * FROM x");
    assert_eq!(
        f.functions.first().map(|f| f.name.as_str()),
        Some("pg_terminate_backend")
    );
}

#[test]
fn schemas_named() {
    let f = facts("SELECT s1.f(), x::s2.ty, s3.t.c FROM s4.t JOIN u ON true");
    for s in ["s1", "s2", "s3", "s4"] {
        assert!(f.schemas.iter().any(|x| x == s), "{s} in {:?}", f.schemas);
    }
    assert!(!f.schemas.iter().any(|x| x == "t"));
    assert!(facts("SELECT t.c, t.* FROM t").schemas.is_empty());
    assert!(facts("CREATE SCHEMA evil")
        .schemas
        .contains(&"evil".to_string()));
}

#[test]
fn search_path_changes_by_every_route() {
    let changes = |sql: &str| facts(sql).search_path_changes();
    assert_eq!(
        changes("SET search_path = a, \"B\""),
        vec![SearchPathChange::Set(vec!["a".into(), "B".into()])]
    );
    assert_eq!(
        changes("SET LOCAL search_path TO 'x, y'"),
        vec![SearchPathChange::Set(vec!["x, y".into()])]
    );
    assert_eq!(
        changes("SET SCHEMA 'z'"),
        vec![SearchPathChange::Set(vec!["z".into()])]
    );
    assert_eq!(changes("RESET search_path"), vec![SearchPathChange::Reset]);
    assert_eq!(changes("RESET ALL"), vec![SearchPathChange::Reset]);
    assert_eq!(
        changes("SET search_path TO DEFAULT"),
        vec![SearchPathChange::Reset]
    );
    assert_eq!(
        changes("SELECT set_config('search_path', 'evil, \"X\"', false)"),
        vec![SearchPathChange::Set(vec!["evil".into(), "X".into()])]
    );
    assert_eq!(
        changes("SELECT set_config(name, 'evil', false) FROM t"),
        vec![SearchPathChange::Unknown]
    );
    assert_eq!(
        changes("SELECT set_config('search_path', v, false) FROM t"),
        vec![SearchPathChange::Unknown]
    );
    assert_eq!(
        changes("ALTER ROLE me SET search_path = evil"),
        vec![SearchPathChange::Set(vec!["evil".into()])]
    );
    assert!(changes("SET work_mem = '1GB'").is_empty());
}

#[test]
fn writes_hidden_in_reads() {
    assert!(has("SELECT * FROM t FOR UPDATE", Finding::RowLock));
    assert!(has("COPY t FROM STDIN", Finding::CopyFrom));
    assert!(has("COPY t TO PROGRAM 'x'", Finding::CopyProgram));
    assert!(has("COPY t TO '/tmp/x'", Finding::CopyFile));
    assert!(!has("COPY t TO STDOUT", Finding::CopyFile));
    assert!(has("BEGIN READ WRITE", Finding::ReadWrite));
    assert!(has(
        "START TRANSACTION ISOLATION LEVEL SERIALIZABLE, READ WRITE",
        Finding::ReadWrite
    ));
    assert!(has(
        "SET SESSION CHARACTERISTICS AS TRANSACTION READ WRITE",
        Finding::ReadWrite
    ));
    assert!(!has("BEGIN READ ONLY", Finding::ReadWrite));
    assert!(!has("BEGIN", Finding::ReadWrite));
}

#[test]
fn standard_conforming_strings_off_is_parsed_as_the_server_does() {
    // With scs off, the backslash escapes the quote: the string runs on, and DELETE is real.
    let sql = "SELECT 'x\\' AS a, '; DELETE FROM t; --'";
    let on = analyze(sql);
    assert_eq!(on.facts().unwrap().top_kinds, vec!["SelectStmt"]);
    let off = ParseContext {
        standard_conforming_strings: Setting::Known(false),
        ..ParseContext::server_defaults()
    };
    let read_off = analyze_with(sql, &off);
    assert_eq!(
        read_off.facts().unwrap().top_kinds,
        vec!["SelectStmt", "DeleteStmt"]
    );
    assert_eq!(read_off.normalized, None);
    let unknown = ParseContext {
        standard_conforming_strings: Setting::Unknown,
        ..ParseContext::server_defaults()
    };
    assert_eq!(
        analyze_with(sql, &unknown).unchecked_reason(),
        Some(UncheckedReason::BackslashUnknownScs)
    );
    // No backslash in a plain string: nothing depends on the setting.
    assert!(analyze_with("SELECT E'\\n', 1", &unknown).facts().is_some());
    // A text the default scanner cannot even split (an escaped quote) is read with scs off.
    let quoted = analyze_with("SELECT 'it\\'s'", &off);
    assert_eq!(quoted.facts().unwrap().top_kinds, vec!["SelectStmt"]);
    assert_eq!(
        analyze_with("SELECT 'it\\'s'", &unknown).unchecked_reason(),
        Some(UncheckedReason::BackslashUnknownScs)
    );
}

#[test]
fn encodings_that_are_not_known_make_non_ascii_text_unchecked() {
    let sjis = ParseContext {
        client_encoding: Setting::Known("SJIS".into()),
        ..ParseContext::server_defaults()
    };
    assert_eq!(
        analyze_with("SELECT 'ソ'", &sjis).unchecked_reason(),
        Some(UncheckedReason::NonAsciiUnknownEncoding)
    );
    assert!(analyze_with("SELECT 1", &sjis).facts().is_some());
    assert!(analyze("SELECT 'ソ'").facts().is_some());
    let unknown = ParseContext::default();
    assert_eq!(
        analyze_with("SELECT 'é'", &unknown).unchecked_reason(),
        Some(UncheckedReason::NonAsciiUnknownEncoding)
    );
}

#[test]
fn unreadable_texts_are_unchecked() {
    assert_eq!(
        analyze("SELEC 1").unchecked_reason(),
        Some(UncheckedReason::ParseError)
    );
    let a = Analyzer::new(Depth::Tree, 4);
    let big = vec![b' '; MAX_STATEMENT_BYTES + 1];
    assert_eq!(
        a.analyze(&big, &ParseContext::server_defaults())
            .unchecked_reason(),
        Some(UncheckedReason::TooLarge)
    );
    assert_eq!(
        a.analyze(b"SELECT '\xff'", &ParseContext::server_defaults())
            .unchecked_reason(),
        Some(UncheckedReason::NotUtf8)
    );
    assert_eq!(
        Analysis::function_call().log_text(),
        "a fast-path function call"
    );
}

#[test]
fn tags_come_from_the_last_real_comment() {
    let a = analyze("SELECT '/*tenant=''evil''*/' /*tenant='acme'*/");
    assert_eq!(a.tags.tenant(), Some("acme"));
    let a = analyze("SELECT '/*tenant=''evil''*/'");
    assert_eq!(a.tags.tenant(), None);
}

#[test]
fn repeated_texts_come_from_the_cache() {
    let analyzer = Analyzer::new(Depth::Shape, 100);
    let ctx = ParseContext::server_defaults();
    let first = analyzer.analyze(b"SELECT 1", &ctx);
    let second = analyzer.analyze(b"SELECT 1", &ctx);
    assert!(Arc::ptr_eq(&first, &second));
    assert_eq!(first.reading, Reading::Shape);
    let other_mode = analyzer.analyze(b"SELECT 1", &ParseContext::default());
    assert!(!Arc::ptr_eq(&first, &other_mode));
    assert_eq!(analyzer.cached(), 2);
}

/// Pairs of texts of the same shape: a cache hit for the second must read it exactly as a
/// fresh analysis does, whatever the first one's constants were.
const SAME_SHAPES: &[(&str, &str)] = &[
    (
        "SELECT abalance FROM pgbench_accounts WHERE aid = 1",
        "SELECT abalance FROM pgbench_accounts WHERE aid = 99999",
    ),
    ("SELECT -1, 'a', 2.5", "SELECT -7, 'bb', 3.25"),
    (
        "SELECT * FROM t WHERE d > now() - interval '1 day' LIMIT 10",
        "SELECT * FROM t WHERE d > now() - interval '2 hours' LIMIT 5",
    ),
    (
        "SELECT set_config('search_path', 'public', false)",
        "SELECT set_config('search_path', 'secret', false)",
    ),
    (
        "SELECT pg_catalog.set_config('search_path', 'public', true)",
        "SELECT pg_catalog.set_config('search_path', 'a, secret', true)",
    ),
    ("SET search_path = 'public'", "SET search_path = 'secret'"),
    (
        "SET search_path TO public, 'x'",
        "SET search_path TO public, 'y'",
    ),
    (
        "ALTER ROLE r SET search_path = 'public'",
        "ALTER ROLE r SET search_path = 'secret'",
    ),
    (
        "REINDEX (CONCURRENTLY 1) TABLE t",
        "REINDEX (CONCURRENTLY 0) TABLE t",
    ),
    (
        "REINDEX (CONCURRENTLY 'on') TABLE t",
        "REINDEX (CONCURRENTLY 'off') TABLE t",
    ),
    ("COPY t TO ''", "COPY t TO '/tmp/x'"),
    ("COPY (SELECT 1) TO STDOUT", "COPY (SELECT 2) TO STDOUT"),
    (
        "SELECT a FROM t WHERE b IN (1, 2, 3) /*tenant='acme'*/",
        "SELECT a FROM t WHERE b IN (4, 5, 6) /*tenant='acme'*/",
    ),
    (
        "SELECT B'101', X'1F', U&'d\\0061t'",
        "SELECT B'1', X'FF', U&'x'",
    ),
    ("SELECT 'a' || $1", "SELECT 'b' || $1"),
    ("DO 'BEGIN END'", "DO 'BEGIN PERFORM 1; END'"),
    (
        "SELECT 1; SELECT set_config('role', 'x', false)",
        "SELECT 2; SELECT set_config('role', 'y', false)",
    ),
    (
        "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE",
        "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE",
    ),
    ("SELECT 9999999999", "SELECT 1"),
];

#[test]
fn texts_of_one_shape_read_as_a_fresh_analysis_reads_them() {
    let ctx = ParseContext::server_defaults();
    for (first, second) in SAME_SHAPES {
        let analyzer = Analyzer::new(Depth::Tree, 100);
        analyzer.analyze(first.as_bytes(), &ctx);
        let cached = analyzer.analyze(second.as_bytes(), &ctx);
        let fresh = Analyzer::new(Depth::Tree, 100).analyze(second.as_bytes(), &ctx);
        assert_eq!(*cached, *fresh, "{first} then {second}");
    }
}

/// A session's own memo of shapes reads every text as a fresh analysis does, and keeps the
/// modes apart.
#[test]
fn a_sessions_memo_reads_texts_of_one_shape_as_a_fresh_analysis_reads_them() {
    let ctx = ParseContext::server_defaults();
    for (first, second) in SAME_SHAPES {
        let analyzer = Analyzer::new(Depth::Tree, 100);
        let mut memo = ShapeMemo::default();
        analyzer.analyze_with(first.as_bytes(), &ctx, &mut memo);
        let through_memo = analyzer.analyze_with(second.as_bytes(), &ctx, &mut memo);
        let fresh = Analyzer::new(Depth::Tree, 100).analyze(second.as_bytes(), &ctx);
        assert_eq!(*through_memo, *fresh, "{first} then {second}");
        assert!(Arc::ptr_eq(
            &through_memo,
            &analyzer.analyze(second.as_bytes(), &ctx)
        ));
    }
    let analyzer = Analyzer::new(Depth::Tree, 100);
    let mut memo = ShapeMemo::default();
    let on = analyzer.analyze_with(b"SELECT 'a'", &ctx, &mut memo);
    let off = ParseContext {
        standard_conforming_strings: Setting::Known(false),
        ..ParseContext::server_defaults()
    };
    let other_mode = analyzer.analyze_with(b"SELECT 'b'", &off, &mut memo);
    assert!(!Arc::ptr_eq(&on, &other_mode));
    assert!(Arc::ptr_eq(
        &on,
        &analyzer.analyze_with(b"SELECT 'c'", &ctx, &mut memo)
    ));
}

/// A session's memo stays small: long shapes are left to the analyzer's caches, and the
/// bytes it holds are bounded.
#[test]
fn a_sessions_memo_is_bounded_in_bytes() {
    let ctx = ParseContext::server_defaults();
    let analyzer = Analyzer::new(Depth::Tree, 100_000);
    let mut memo = ShapeMemo::default();
    let long = format!(
        "SELECT 1 FROM t WHERE a IN ({})",
        vec!["1"; 3_000].join(", ")
    );
    analyzer.analyze_with(long.as_bytes(), &ctx, &mut memo);
    assert_eq!(memo.bytes, 0);
    for n in 1..2_000 {
        let text = format!("SELECT a{n} FROM t WHERE b = 1 /* {} */", "x".repeat(200));
        analyzer.analyze_with(text.as_bytes(), &ctx, &mut memo);
        assert!(memo.bytes <= MEMO_BYTES);
    }
    assert!(memo.bytes > 0);
}

#[test]
fn a_shape_is_shared_only_when_no_rule_reads_a_constant() {
    let ctx = ParseContext::server_defaults();
    let shared = |a: &str, b: &str| {
        let analyzer = Analyzer::new(Depth::Tree, 100);
        let first = analyzer.analyze(a.as_bytes(), &ctx);
        Arc::ptr_eq(&first, &analyzer.analyze(b.as_bytes(), &ctx))
    };
    assert!(shared(
        "SELECT abalance FROM pgbench_accounts WHERE aid = 1",
        "SELECT abalance FROM pgbench_accounts WHERE aid = 2"
    ));
    assert!(shared("SELECT -1", "SELECT -2"));
    assert!(!shared(
        "SELECT set_config('search_path', 'public', false)",
        "SELECT set_config('search_path', 'secret', false)"
    ));
    assert!(!shared(
        "SET search_path = 'public'",
        "SET search_path = 'secret'"
    ));
    assert!(!shared(
        "REINDEX (CONCURRENTLY 1) TABLE t",
        "REINDEX (CONCURRENTLY 0) TABLE t"
    ));
    assert!(!shared("COPY t TO ''", "COPY t TO '/tmp/x'"));
    assert!(!shared("BEGIN READ ONLY", "BEGIN READ WRITE"));
    // Another comment, other whitespace or another identifier is another shape.
    assert!(!shared(
        "SELECT 1 /*tenant='a'*/",
        "SELECT 1 /*tenant='b'*/"
    ));
    assert!(!shared("SELECT * FROM a.t", "SELECT * FROM b.t"));
    // A backslash while standard_conforming_strings is off is never read by shape.
    let off = ParseContext {
        standard_conforming_strings: Setting::Known(false),
        ..ParseContext::server_defaults()
    };
    let analyzer = Analyzer::new(Depth::Tree, 100);
    let first = analyzer.analyze(br"SELECT 'a\'; DROP TABLE t; --'", &off);
    let second = analyzer.analyze(br"SELECT 'b\'; DROP TABLE t; --'", &off);
    assert!(!Arc::ptr_eq(&first, &second));
}

/// Prints the cost of each pg_query call; run with
/// `cargo test --release --lib sql::tests::bench -- --ignored --nocapture`.
#[test]
#[ignore]
fn bench() {
    use std::time::Instant;
    const N: u32 = 20_000;
    let sql = "SELECT abalance FROM pgbench_accounts WHERE aid = 4711";
    let time = |name: &str, f: &dyn Fn(u32)| {
        let start = Instant::now();
        for i in 0..N {
            f(i);
        }
        println!(
            "{name}: {:.2} µs",
            start.elapsed().as_secs_f64() * 1e6 / f64::from(N)
        );
    };
    time("scan_tokens", &|_| drop(pg_query::scan_tokens(sql)));
    time("fingerprint", &|_| drop(pg_query::fingerprint(sql, 0, 0)));
    time("normalize", &|_| drop(pg_query::normalize(sql)));
    time("summary", &|_| drop(pg_query::summary(sql, 0, -1)));
    time("parse", &|_| drop(pg_query::parse(sql, 0)));
    time("parse + walk", &|_| {
        drop(walk_tree(sql, ParserOptions::DEFAULT))
    });
    let ctx = ParseContext::server_defaults();
    let shape = Analyzer::new(Depth::Shape, 100);
    let tree = Analyzer::new(Depth::Tree, 100);
    time("cold analysis, shape", &|i| {
        drop(shape.analyze(format!("{sql} + c{i}").as_bytes(), &ctx))
    });
    time("cold analysis, tree", &|i| {
        drop(tree.analyze(format!("{sql} + c{i}").as_bytes(), &ctx))
    });
    time("same shape, other constants, tree", &|i| {
        drop(tree.analyze(format!("{sql} + {i}").as_bytes(), &ctx))
    });
    time("cache hit", &|_| drop(tree.analyze(sql.as_bytes(), &ctx)));
}

/// Review: at Depth::Shape the analyzer now needs pg_query's protobuf tree (for the
/// constants); a text the fingerprint reads but whose tree is too deep for the protobuf
/// decoder loses its fingerprint and becomes unchecked.
#[test]
fn shape_depth_keeps_the_fingerprint_of_a_deep_expression() {
    for terms in [30usize, 45, 60, 120] {
        let expr = vec!["a"; terms].join(" + ");
        let sql = format!("SELECT {expr} FROM t");
        let a = Analyzer::new(Depth::Shape, 16)
            .analyze(sql.as_bytes(), &ParseContext::server_defaults());
        println!(
            "{terms} terms: {:?} {:?}",
            a.fingerprint.is_some(),
            a.reading
        );
        assert!(a.fingerprint.is_some(), "{terms} terms: {:?}", a.reading);
        assert_eq!(a.reading, Reading::Shape, "{terms} terms");
    }
}

#[test]
fn a_normalized_text_is_shown_without_comments_and_only_without_constants() {
    let shown = |sql: &str| super::shown_text(&pg_query::normalize(sql).unwrap());
    assert_eq!(
        shown("SELECT v FROM t WHERE id = 7 AND name = 'x'").as_deref(),
        Some("SELECT v FROM t WHERE id = $1 AND name = $2")
    );
    assert_eq!(
        shown("/*tenant='acme',user_email='bob@x.com'*/ SELECT 1 -- ssn 123-45-6789").as_deref(),
        Some("SELECT $1")
    );
    for sql in [
        "PREPARE p AS SELECT * FROM t WHERE ssn = 'secret1'",
        "EXECUTE p('secret2')",
        "CREATE TABLE x AS SELECT 'secret3'",
        "COMMENT ON TABLE t IS 'secret5'",
        "CREATE TABLE t (a text DEFAULT 'secret9')",
        "SELECT 'a'; EXECUTE p('secret8')",
    ] {
        assert_eq!(
            shown(sql),
            None,
            "{sql} -> {}",
            pg_query::normalize(sql).unwrap()
        );
    }
}

#[test]
fn pg_stat_statements_normalized_text_has_the_fingerprint_of_the_statement() {
    for (sent, normalized) in [
        (
            "SELECT id FROM small WHERE v = 'v-secret'",
            "SELECT id FROM small WHERE v = $1",
        ),
        ("SELECT count(*) FROM big", "SELECT count(*) FROM big"),
        (
            "UPDATE t SET a = 5, b = 'x' WHERE id IN (1, 2, 3)",
            "UPDATE t SET a = $1, b = $2 WHERE id IN ($3, $4, $5)",
        ),
        ("SELECT pg_sleep(0.1)", "SELECT pg_sleep($1)"),
    ] {
        assert_eq!(
            analyze(sent).fingerprint,
            analyze(normalized).fingerprint,
            "{sent}"
        );
    }
}

/// A caller's UTF-8 reading is taken only for the very bytes analyzed: any other is read
/// again from the bytes.
#[test]
fn a_utf8_reading_of_other_bytes_is_not_taken() {
    let ctx = ParseContext::server_defaults();
    let analyzer = Analyzer::new(Depth::Tree, 100);
    let mut memo = ShapeMemo::default();
    let text = b"SELECT a FROM t";
    let other = "DELETE FROM t";
    let read = analyzer.analyze_utf8_with(text, Some(other), &ctx, &mut memo);
    let fresh = Analyzer::new(Depth::Tree, 100);
    assert_eq!(*read, *fresh.analyze(text, &ctx));
    // Nothing was kept under the other text's name.
    let deleted = analyzer.analyze_utf8_with(other.as_bytes(), Some(other), &ctx, &mut memo);
    assert_eq!(*deleted, *fresh.analyze(other.as_bytes(), &ctx));
    assert_ne!(*deleted, *read);
    let same = std::str::from_utf8(text).unwrap();
    let taken = analyzer.analyze_utf8_with(text, Some(same), &ctx, &mut memo);
    assert_eq!(*taken, *read);
    let unsure = analyzer.analyze_utf8_with(text, None, &ctx, &mut memo);
    assert_eq!(*unsure, *read);
}
