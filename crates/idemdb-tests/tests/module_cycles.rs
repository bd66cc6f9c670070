//! Inside each crate of the workspace, modules import one another without cycles (issue 23),
//! apart from the parent/child knots listed in `KNOWN`, which only shrink: a module that joins
//! a cycle, or a new cycle, fails this test. Between crates, cargo refuses cycles itself.
//!
//! A module is a file under a crate's src/ (`a/mod.rs` is `a`). It depends on another when it names it
//! through `crate::…`, through `super::…`, or, for a `mod.rs`, names a child as `child::…`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Cycles still to break in the engine (crate idemdb): none are left. A knot a change cannot
/// avoid would be listed here, each as the set of modules it joins.
const KNOWN: &[&[&str]] = &[];

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts.join("::")
}

/// The identifier paths that follow `prefix` in `text`, e.g. `a::b::C` after `crate::`, and
/// each item of a `prefix{a, b::c}` group.
fn paths_after(text: &str, prefix: &str) -> Vec<String> {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(prefix) {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + prefix.len()..];
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            found.extend(group[..end].split(',').map(|s| s.trim().to_string()));
        } else {
            let end = rest.find(|c: char| !ident(c)).unwrap_or(rest.len());
            found.push(rest[..end].trim_end_matches(':').to_string());
        }
    }
    found
}

/// `text` without the bodies of inline modules (`mod name { … }`), where `super::` names this
/// file's module rather than its parent.
fn without_inline_modules(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let bytes = text.as_bytes();
    let mut at = 0;
    while at < text.len() {
        let opens_module = text[at..].starts_with("mod ")
            && (at == 0 || !(bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_'));
        let brace = text[at..].find(['{', ';', '\n']).map(|i| at + i);
        match brace {
            Some(b) if opens_module && bytes[b] == b'{' => {
                let mut depth = 0usize;
                let mut end = b;
                for (i, c) in text[b..].char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = b + i + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                at = end.max(b + 1);
            }
            _ => {
                let c = text[at..].chars().next().unwrap_or(' ');
                out.push(c);
                at += c.len_utf8();
            }
        }
    }
    out
}

/// The longest prefix of `path` (under `base`) that is a module.
fn resolve(modules: &BTreeSet<String>, base: &str, path: &str) -> Option<String> {
    let mut parts: Vec<&str> = path.split("::").filter(|p| !p.is_empty()).collect();
    while !parts.is_empty() {
        let name = if base.is_empty() {
            parts.join("::")
        } else {
            format!("{base}::{}", parts.join("::"))
        };
        if modules.contains(&name) {
            return Some(name);
        }
        parts.pop();
    }
    (!base.is_empty() && modules.contains(base)).then(|| base.to_string())
}

/// The src/ directories of the workspace's crates, by crate, and how many modules each has
/// at least (so that a moved directory fails instead of checking nothing).
const CRATES: &[(&str, &str, usize)] = &[
    ("idemdb", "../../src", 45),
    ("idemdb-core", "../idemdb-core/src", 19),
    ("idemdb-postgres", "../idemdb-postgres/src", 16),
    ("idemdb-http", "../idemdb-http/src", 8),
    ("idemdb-cli", "../idemdb-cli/src", 8),
    ("idemdb-testkit", "../idemdb-testkit/src", 5),
];

fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    sources(src, &mut files);
    let texts: BTreeMap<String, (PathBuf, String)> = files
        .into_iter()
        .map(|f| {
            let text = std::fs::read_to_string(&f).unwrap();
            // Unit tests (a `#[cfg(test)]` module, whatever its name) may reach anywhere, and
            // their `super::` is this module, not its parent.
            let text = match text.find("#[cfg(test)]\nmod ") {
                Some(at) => text[..at].to_string(),
                None => text,
            };
            (module_of(src, &f), (f, text))
        })
        .collect();
    let modules: BTreeSet<String> = texts.keys().cloned().collect();
    let mut edges = BTreeMap::new();
    for (module, (file, text)) in &texts {
        let mut to = BTreeSet::new();
        for path in paths_after(text, "crate::") {
            to.extend(resolve(&modules, "", &path));
        }
        let outer = without_inline_modules(text);
        let parent = module.rsplit_once("::").map(|(p, _)| p.to_string());
        if let Some(parent) = &parent {
            for path in paths_after(&outer, "super::") {
                to.extend(resolve(&modules, parent, &path));
            }
        }
        let is_parent = file
            .file_name()
            .is_some_and(|n| n == "mod.rs" || n == "lib.rs" || n == "main.rs");
        if is_parent {
            for child in modules.iter().filter(|m| {
                m.strip_prefix(&format!("{module}::"))
                    .is_some_and(|rest| !rest.contains("::"))
                    || (module.is_empty() && !m.contains("::"))
            }) {
                let name = child.rsplit("::").next().unwrap_or(child);
                let named = paths_after(&outer, &format!("{name}::")).len()
                    + paths_after(&outer, &format!("self::{name}::")).len();
                if named > 0 {
                    to.insert(child.clone());
                }
            }
        }
        to.remove(module);
        edges.insert(module.clone(), to);
    }
    edges
}

/// Strongly connected components of more than one module (Tarjan's algorithm).
fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> BTreeSet<BTreeSet<String>> {
    struct State<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: BTreeSet<BTreeSet<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in &s.edges[v] {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = BTreeSet::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.insert(w.to_string());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                s.found.insert(component);
            }
        }
    }
    let mut s = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: BTreeSet::new(),
    };
    for v in edges.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.found
}

#[test]
fn no_module_joins_an_import_cycle() {
    let known: Vec<BTreeSet<String>> = KNOWN
        .iter()
        .map(|c| c.iter().map(|m| m.to_string()).collect())
        .collect();
    for (name, dir, at_least) in CRATES {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
        let edges = graph(&src);
        assert!(
            edges.len() >= *at_least,
            "{name}'s src/ was not read: {} modules",
            edges.len()
        );
        check(name, &edges, if *name == "idemdb" { &known } else { &[] });
    }
}

fn check(name: &str, edges: &BTreeMap<String, BTreeSet<String>>, known: &[BTreeSet<String>]) {
    for cycle in cycles(edges) {
        let allowed = known.iter().any(|k| cycle.is_subset(k));
        let detail: Vec<String> = cycle
            .iter()
            .map(|m| {
                let inside: Vec<&String> = edges[m].iter().filter(|t| cycle.contains(*t)).collect();
                format!("{m} -> {inside:?}")
            })
            .collect();
        assert!(allowed, "an import cycle in {name}: {detail:#?}");
    }
}

#[test]
fn the_checker_sees_a_cycle() {
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    edges.insert("error".into(), ["record".to_string()].into());
    edges.insert("record".into(), ["error".to_string()].into());
    edges.insert("scope".into(), ["error".to_string()].into());
    let found = cycles(&edges);
    let want: BTreeSet<String> = ["error".to_string(), "record".to_string()].into();
    assert_eq!(found, [want].into());
}
