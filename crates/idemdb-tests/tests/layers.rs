//! Every crate of the workspace is layered: its modules import only modules of their own layer
//! or of a layer below, and never one another in a cycle. The layers of each crate are listed
//! here, bottom first (docs/design.md §0 draws them); a module that is in no layer, an import
//! from a higher layer, an import of the crate root's re-exports from inside the crate, or a
//! cycle fails this test. Between crates, cargo refuses cycles itself.
//!
//! A module is a file (`a/mod.rs` is `a`; a bench target's `benches/<name>/main.rs` is its
//! root, and `benches/shared/` its module `shared`). It imports another when it names it
//! through `crate::…` or `super::…`, or, for a `mod.rs`, names a child as `child::…`. Comment
//! lines and unit tests (`#[cfg(test)] mod …`) are not read: tests may reach anywhere.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Graph = BTreeMap<String, BTreeSet<String>>;

/// The engine, bottom first. Each layer names modules (a module's children are in its layer).
const IDEMDB: &[(&str, &[&str])] = &[
    (
        "foundation: errors, settings, counters, table names, wake-ups",
        &[
            "config",
            "contain",
            "durability",
            "engine_tables",
            "error",
            "log_problem",
            "measured",
            "observe",
            "outbox_row",
            "outbox_state",
            "record",
            "reentry",
            "shard",
            "stats",
            "timer",
            "wait",
        ],
    ),
    ("the write-ahead log", &["wal"]),
    (
        "caller tables and the closure's transaction",
        &["tables", "tx_table", "tx", "tx_outbox", "guard"],
    ),
    ("the record store", &["records"]),
    (
        "whole-file work: meta and upgrades, recovery, scans",
        &["meta", "recovery", "redb_buffer", "scan"],
    ),
    ("the engine's shared state", &["engine"]),
    ("the group-commit writer", &["writer"]),
    (
        "background work above the writer",
        &["compactor", "widen", "reclaim", "recognition"],
    ),
    ("the handle and its builder", &["settings", "db", "builder"]),
    ("the public operations", &["ops"]),
    ("test hooks (feature test-hooks)", &["testing"]),
];

const CORE: &[(&str, &[&str])] = &[
    ("values", &["fencing", "state", "fingerprint", "counters"]),
    ("errors", &["error"]),
    ("names and limits", &["limits", "clock", "scope"]),
    (
        "records and answers",
        &["token", "record", "outcome", "outbox"],
    ),
    (
        "the semantics",
        &[
            "decide",
            "retention",
            "renewal",
            "inbox",
            "saga",
            "dispatch",
        ],
    ),
    ("the store trait", &["store"]),
    ("views over a store", &["typed", "heartbeat"]),
];

const POSTGRES: &[(&str, &[&str])] = &[
    ("errors and SQL text", &["error", "sql", "server_time"]),
    (
        "rows, retries, waits, the batch queue",
        &[
            "errors",
            "rows",
            "wait",
            "stats",
            "tls",
            "batch",
            "outbox_local",
        ],
    ),
    ("schema and partitions", &["schema", "partitions"]),
    ("the store", &["store"]),
    (
        "who runs a batch, and one batch",
        &["batch_run", "batch_sql"],
    ),
    (
        "the operations",
        &["reserve", "owner", "execute", "inbox", "outbox", "dispatch"],
    ),
    ("connecting", &["builder"]),
];

const HTTP: &[(&str, &[&str])] = &[
    (
        "configuration and wire formats",
        &["config", "key", "problem", "stored"],
    ),
    ("responses", &["marker", "finish"]),
    ("the service", &["service"]),
    ("the layer", &["layer"]),
];

const CLI: &[(&str, &[&str])] = &[
    ("errors and output", &["errors", "progress", "output"]),
    ("arguments and opening", &["cli", "open"]),
    ("a file or a PostgreSQL database", &["outbox_target"]),
    ("commands", &["commands", "records", "outbox"]),
];

const TESTKIT: &[(&str, &[&str])] = &[
    ("backends and servers", &["backend", "postgres", "workload"]),
    ("scripted steps", &["steps"]),
];

const BENCH_LIB: &[(&str, &[&str])] = &[];

/// A crate or bench target: where its files are, how many modules it has at least (so that a
/// moved directory fails instead of checking nothing), and its layers.
struct Unit {
    name: &'static str,
    /// Its root's directory (relative to this crate's manifest).
    dir: &'static str,
    at_least: usize,
    layers: &'static [(&'static str, &'static [&'static str])],
}

const UNITS: &[Unit] = &[
    Unit {
        name: "idemdb",
        dir: "../../src",
        at_least: 60,
        layers: IDEMDB,
    },
    Unit {
        name: "idemdb-core",
        dir: "../idemdb-core/src",
        at_least: 19,
        layers: CORE,
    },
    Unit {
        name: "idemdb-postgres",
        dir: "../idemdb-postgres/src",
        at_least: 16,
        layers: POSTGRES,
    },
    Unit {
        name: "idemdb-http",
        dir: "../idemdb-http/src",
        at_least: 8,
        layers: HTTP,
    },
    Unit {
        name: "idemdb-cli",
        dir: "../idemdb-cli/src",
        at_least: 8,
        layers: CLI,
    },
    Unit {
        name: "idemdb-testkit",
        dir: "../idemdb-testkit/src",
        at_least: 5,
        layers: TESTKIT,
    },
    Unit {
        name: "idemdb-bench",
        dir: "../idemdb-bench/src",
        at_least: 1,
        layers: BENCH_LIB,
    },
    Unit {
        name: "bench compare",
        dir: "../idemdb-bench/benches/compare",
        at_least: 18,
        layers: BENCH_COMPARE,
    },
    Unit {
        name: "bench pg_compare",
        dir: "../idemdb-bench/benches/pg_compare",
        at_least: 13,
        layers: BENCH_PG_COMPARE,
    },
    Unit {
        name: "bench retention",
        dir: "../idemdb-bench/benches/retention",
        at_least: 19,
        layers: BENCH_RETENTION,
    },
    Unit {
        name: "bench scale",
        dir: "../idemdb-bench/benches/scale",
        at_least: 10,
        layers: BENCH_SCALE,
    },
    Unit {
        name: "bench tail",
        dir: "../idemdb-bench/benches/tail",
        at_least: 9,
        layers: BENCH_TAIL,
    },
];

const BENCH_COMPARE: &[(&str, &[&str])] = &[
    (
        "shared: keys, criterion, callers, CPU, the fsync floor, the report's pieces",
        &["shared"],
    ),
    (
        "the engines' interface: Engine, Session, the stored key",
        &["interface"],
    ),
    (
        "the engines",
        &["floors", "idem", "naive", "sqlite", "postgres", "redis"],
    ),
    ("the line-up", &["engines"]),
    ("the callers: threads and tasks", &["pool", "tasks"]),
    ("the summary", &["report"]),
];
const BENCH_PG_COMPARE: &[(&str, &[&str])] = &[
    (
        "shared: keys, criterion, callers, CPU, the hand-written table, the report's pieces",
        &["shared"],
    ),
    ("the baseline table and a distribution", &["table", "dist"]),
    ("the subjects and their callers", &["subject", "callers"]),
    ("the drop stall", &["stall"]),
    ("the summary", &["report"]),
];
const BENCH_RETENTION: &[(&str, &[&str])] = &[
    (
        "shared: keys, criterion, callers, the report's pieces",
        &["shared"],
    ),
    (
        "settings, the table's pieces, file space",
        &["settings", "report", "space"],
    ),
    (
        "fills, the load, a baseline's measurements",
        &["fill", "load", "baseline"],
    ),
    ("the baselines and opening", &["naive", "sqlite", "open"]),
    ("the cells", &["drop", "absence", "stall"]),
];
const BENCH_SCALE: &[(&str, &[&str])] = &[
    ("shared: keys, quantiles, the report's pieces", &["shared"]),
    ("what is stored, and when", &["settings"]),
    ("the load", &["load"]),
    (
        "the measurements: each store's in a process of its own; a build beside one caller",
        &["probe", "build"],
    ),
    ("the table", &["report"]),
];
const BENCH_TAIL: &[(&str, &[&str])] = &[
    (
        "shared: keys, criterion, the fsync floor, the report's pieces",
        &["shared"],
    ),
    ("the run: setup, workloads, measurements", &["run"]),
    ("the report", &["report"]),
];

/// The directory every bench target includes as its module `shared` (`#[path]`).
const BENCH_SHARED: &str = "../idemdb-bench/benches/shared";

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module a file is, under the directory of its crate's root (`prefix` for an included
/// directory).
fn module_of(root_dir: &Path, file: &Path, prefix: &str) -> String {
    let rel = file.strip_prefix(root_dir).unwrap().with_extension("");
    let mut parts: Vec<String> = prefix
        .split("::")
        .filter(|p| !p.is_empty())
        .map(String::from)
        .collect();
    parts.extend(
        rel.components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned()),
    );
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
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':' || c == '$') {
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

/// `text` without its comment lines and its unit tests.
fn code_of(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod ") {
        Some(at) => &text[..at],
        None => text,
    };
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
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

/// The longest prefix of `path` (under `base`) that is a module; `base` itself when none is
/// (an item of `base`: the root, for `crate::Item`).
fn resolve(modules: &BTreeSet<String>, base: &str, path: &str) -> String {
    let mut parts: Vec<&str> = path.split("::").filter(|p| !p.is_empty()).collect();
    while !parts.is_empty() {
        let name = if base.is_empty() {
            parts.join("::")
        } else {
            format!("{base}::{}", parts.join("::"))
        };
        if modules.contains(&name) {
            return name;
        }
        parts.pop();
    }
    base.to_string()
}

/// The files of a unit, by module.
fn files_of(unit: &Unit) -> BTreeMap<String, PathBuf> {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = here.join(unit.dir);
    let mut files = Vec::new();
    rust_files(&dir, &mut files);
    let mut modules: BTreeMap<String, PathBuf> = files
        .into_iter()
        .map(|f| (module_of(&dir, &f, ""), f))
        .collect();
    if unit.dir.contains("/benches/") {
        let shared = here.join(BENCH_SHARED);
        let mut files = Vec::new();
        rust_files(&shared, &mut files);
        modules.extend(
            files
                .into_iter()
                .map(|f| (module_of(&shared, &f, "shared"), f)),
        );
    }
    modules
}

/// Which modules each module imports, from the text of each.
fn graph(texts: &BTreeMap<String, String>) -> Graph {
    let modules: BTreeSet<String> = texts.keys().cloned().collect();
    let mut edges = Graph::new();
    for (module, text) in texts {
        let mut to = BTreeSet::new();
        for path in paths_after(text, "crate::") {
            to.insert(resolve(&modules, "", &path));
        }
        let outer = without_inline_modules(text);
        if !module.is_empty() {
            let parent = module.rsplit_once("::").map_or("", |(p, _)| p);
            for path in paths_after(&outer, "super::") {
                to.insert(resolve(&modules, parent, &path));
            }
        }
        // A module's children, when it names them.
        for child in modules
            .iter()
            .filter(|m| parent_of(m) == Some(module.as_str()))
        {
            let name = child.rsplit("::").next().unwrap_or(child);
            let named = paths_after(&outer, &format!("{name}::")).len()
                + paths_after(&outer, &format!("self::{name}::")).len();
            if named > 0 {
                to.insert(child.clone());
            }
        }
        to.remove(module);
        edges.insert(module.clone(), to);
    }
    edges
}

fn parent_of(module: &str) -> Option<&str> {
    if module.is_empty() {
        return None;
    }
    Some(module.rsplit_once("::").map_or("", |(p, _)| p))
}

/// Strongly connected components of more than one module (Tarjan's algorithm).
fn cycles(edges: &Graph) -> BTreeSet<BTreeSet<String>> {
    struct State<'a> {
        edges: &'a Graph,
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
        for w in s.edges.get(v).into_iter().flatten() {
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

/// The layer of `module`: that of the nearest of it and its ancestors that a layer names. The
/// root is above every layer.
fn layer_of(layers: &[(&str, &[&str])], module: &str) -> Option<usize> {
    if module.is_empty() {
        return Some(layers.len());
    }
    let mut at = module;
    loop {
        if let Some(i) = layers.iter().position(|(_, ms)| ms.contains(&at)) {
            return Some(i);
        }
        at = at.rsplit_once("::")?.0;
    }
}

/// What is wrong with `edges` under `layers`: modules in no layer, imports from a higher layer
/// (the root's re-exports included), and cycles.
fn violations(layers: &[(&str, &[&str])], edges: &Graph) -> Vec<String> {
    let name = |i: usize| layers.get(i).map_or("the crate root", |l| l.0);
    let mut found = Vec::new();
    for module in edges.keys() {
        if layer_of(layers, module).is_none() {
            found.push(format!("module `{module}` is in no layer: add it to one"));
        }
    }
    for (from, tos) in edges {
        let Some(lf) = layer_of(layers, from) else {
            continue;
        };
        for to in tos {
            let Some(lt) = layer_of(layers, to) else {
                continue;
            };
            if lt > lf {
                let what = if to.is_empty() {
                    "the crate root (name the defining module instead)".to_string()
                } else {
                    format!("`{to}`")
                };
                found.push(format!(
                    "`{from}` ({}) imports {what} ({}), a higher layer",
                    name(lf),
                    name(lt)
                ));
            }
        }
    }
    for cycle in cycles(edges) {
        let detail: Vec<String> = cycle
            .iter()
            .map(|m| {
                let inside: Vec<&String> = edges[m].iter().filter(|t| cycle.contains(*t)).collect();
                format!("{m} -> {inside:?}")
            })
            .collect();
        found.push(format!("an import cycle: {detail:?}"));
    }
    found
}

fn read(unit: &Unit) -> Graph {
    let texts: BTreeMap<String, String> = files_of(unit)
        .into_iter()
        .map(|(m, f)| (m, code_of(&std::fs::read_to_string(f).unwrap())))
        .collect();
    graph(&texts)
}

#[test]
fn every_crate_imports_only_downwards_and_without_cycles() {
    let mut problems = Vec::new();
    for unit in UNITS {
        let edges = read(unit);
        assert!(
            edges.len() >= unit.at_least,
            "{}'s modules were not read: {} found",
            unit.name,
            edges.len()
        );
        problems.extend(
            violations(unit.layers, &edges)
                .into_iter()
                .map(|p| format!("{}: {p}", unit.name)),
        );
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

/// The check itself: an import of a public operation from inside the writer, the mistake the
/// layers exist to refuse, is reported against the engine's real graph.
#[test]
fn an_import_from_ops_into_the_writer_is_refused() {
    let engine = &UNITS[0];
    let mut texts: BTreeMap<String, String> = files_of(engine)
        .into_iter()
        .map(|(m, f)| (m, code_of(&std::fs::read_to_string(f).unwrap())))
        .collect();
    assert!(violations(engine.layers, &graph(&texts)).is_empty());
    texts
        .get_mut("writer::batch")
        .expect("the writer's batch module")
        .push_str("\nuse crate::ops::Call;\n");
    let found = violations(engine.layers, &graph(&texts));
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(
        found[0].starts_with("`writer::batch` (the group-commit writer) imports `ops`"),
        "{}",
        found[0]
    );
}

/// Names of the crate root's re-exports from inside the crate are refused: the module that
/// defines an item is named, so that the root stays out of the import graph.
#[test]
fn an_import_through_the_crate_root_is_refused() {
    let layers: &[(&str, &[&str])] = &[("low", &["error"]), ("high", &["ops"])];
    let texts: BTreeMap<String, String> = [
        (
            "".to_string(),
            "mod error;\nmod ops;\npub use error::Error;".to_string(),
        ),
        ("error".to_string(), "pub enum Error {}".to_string()),
        ("ops".to_string(), "use crate::Error;".to_string()),
    ]
    .into();
    let found = violations(layers, &graph(&texts));
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(found[0].contains("the crate root"), "{}", found[0]);
}

#[test]
fn the_checker_sees_a_cycle_and_a_module_in_no_layer() {
    let mut edges = Graph::new();
    edges.insert("error".into(), ["record".to_string()].into());
    edges.insert("record".into(), ["error".to_string()].into());
    edges.insert("scope".into(), ["error".to_string()].into());
    let want: BTreeSet<String> = ["error".to_string(), "record".to_string()].into();
    assert_eq!(cycles(&edges), [want].into());
    let layers: &[(&str, &[&str])] = &[("all", &["error", "record"])];
    let found = violations(layers, &edges);
    assert!(
        found.iter().any(|p| p.contains("`scope` is in no layer")),
        "{found:#?}"
    );
    assert!(
        found.iter().any(|p| p.contains("an import cycle")),
        "{found:#?}"
    );
}

/// A top-level module's `super::` is the crate root: `super::sibling::X` imports the sibling.
#[test]
fn super_of_a_top_level_module_names_its_siblings() {
    let texts: BTreeMap<String, String> = [
        ("".to_string(), "mod a;\nmod b;".to_string()),
        ("a".to_string(), "use super::b::Thing;".to_string()),
        ("b".to_string(), "pub struct Thing;".to_string()),
    ]
    .into();
    let edges = graph(&texts);
    assert_eq!(edges["a"], ["b".to_string()].into());
}
