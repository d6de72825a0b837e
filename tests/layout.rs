//! The layout of the crate: no import cycles between top-level modules, so the modules can be
//! read in the order a request travels and each stands above what it uses. Every reference
//! `crate::m` in a module's files (comments left out) is an arrow to `m`.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

/// Top-level module -> the top-level modules its files name.
fn arrows() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut graph = BTreeMap::new();
    for entry in fs::read_dir(&src).expect("src") {
        let path = entry.expect("entry").path();
        let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
        if name == "lib" || name == "main" {
            continue;
        }
        let mut named = BTreeSet::new();
        for file in rust_files(&path) {
            let text = fs::read_to_string(&file).expect("source");
            named.extend(crate_refs(&text).filter(|m| m != name));
        }
        graph.insert(name.to_string(), named);
    }
    graph
}

fn rust_files(path: &Path) -> Vec<std::path::PathBuf> {
    if path.is_file() {
        return if path.extension().is_some_and(|e| e == "rs") {
            vec![path.to_path_buf()]
        } else {
            Vec::new()
        };
    }
    let mut files = Vec::new();
    for entry in fs::read_dir(path).expect("dir") {
        files.extend(rust_files(&entry.expect("entry").path()));
    }
    files
}

/// The modules named as `crate::m` in code (line comments, doc comments included, are left
/// out; a `crate::{a, b::{c, d}}` group names `a` and `b`).
fn crate_refs(text: &str) -> impl Iterator<Item = String> + '_ {
    text.lines()
        .map(|line| line.split("//").next().unwrap_or(""))
        .flat_map(|code| {
            code.match_indices("crate::")
                .map(move |(i, _)| &code[i + 7..])
        })
        .flat_map(|rest| match rest.strip_prefix('{') {
            Some(group) => top_level_items(group),
            None => vec![first_ident(rest)],
        })
        .filter(|n| !n.is_empty() && n != "self")
}

/// The first name of each item of a `{...}` group (the text after its `{`), at its own depth.
fn top_level_items(group: &str) -> Vec<String> {
    let mut items = vec![first_ident(group)];
    let mut depth = 0;
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => items.push(first_ident(&group[i + 1..])),
            _ => {}
        }
    }
    items
}

fn first_ident(text: &str) -> String {
    text.trim_start()
        .split(|c: char| !c.is_alphanumeric() && c != '_')
        .next()
        .unwrap_or("")
        .to_string()
}

/// The strongly connected groups of more than one module (Tarjan's algorithm).
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct State<'a> {
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.graph.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !s.graph.contains_key(w) {
                continue;
            }
            if !s.index.contains_key(w) {
                visit(s, w);
                let low = s.low[v].min(s.low[w]);
                s.low.insert(v, low);
            } else if s.on_stack.contains(w) {
                let low = s.low[v].min(s.index[w]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut group = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                group.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if group.len() > 1 {
                group.sort();
                s.found.push(group);
            }
        }
    }
    let mut state = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !state.index.contains_key(v.as_str()) {
            visit(&mut state, v);
        }
    }
    state.found
}

#[test]
fn top_level_modules_form_no_cycle() {
    let graph = arrows();
    assert!(graph.len() > 10, "found only {graph:?}");
    let found = cycles(&graph);
    let listing: String = graph
        .iter()
        .map(|(m, to)| {
            format!(
                "{m} -> {}\n",
                to.iter().cloned().collect::<Vec<_>>().join(", ")
            )
        })
        .collect();
    assert!(found.is_empty(), "import cycles: {found:?}\n{listing}");
}

#[test]
fn the_cycle_finder_finds_cycles() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec!["a"]),
    ]
    .into_iter()
    .map(|(m, to)| (m.to_string(), to.into_iter().map(String::from).collect()))
    .collect();
    assert_eq!(cycles(&graph), vec![vec!["a", "b", "c"]]);
    let refs: Vec<String> =
        crate_refs("use crate::{pool::{Pool, X}, gate};\n// crate::doc\nlet x = crate::wire::A;")
            .collect();
    assert_eq!(refs, ["pool", "gate", "wire"]);
}
