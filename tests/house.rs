//! The shape of the house, checked from the sources: every `crate::` import points down the
//! layers declared below (no module imports one above it, so there are no cycles), and no
//! source file or function grows past the size a newcomer can read.
//!
//! A new module must be given a layer here; a module that needs something from a layer above
//! it is the sign that the thing belongs lower down (see `docs/architecture.md`).

#![allow(clippy::unwrap_used)]

use crate::common;

use std::collections::{BTreeMap, BTreeSet};

use common::{files_under, repo};

/// Each crate's layers, bottom first. A module may import from its own layer and the ones
/// below. A module is placed by its longest listed prefix (`stage` places `stage::image`).
/// Tests (`tests` modules and files) may import anything.
const LAYERS: &[(&str, &[&[&str]])] = &[
    (
        "pipeline/src",
        &[
            // Plain data: types, errors, positions, the collective trait, leaf kernels.
            &[
                "types",
                "error",
                "state::position",
                "kafka_log",
                "collective",
                "stage::expr",
                "stage::normal",
                "stage::pixels",
                "stage::stats",
                "stage::ziggurat_tables",
            ],
            // Lineage and resumable state.
            &["batch", "state"],
            // The config model and the storage it names.
            &["config", "storage"],
            // Runtime plumbing: CPU pool, byte-bounded channels, recycling, metrics, dead
            // letters.
            &["runtime", "dead_letter", "checkpoint"],
            // Stages: each kind's settings, build step and kernel; the registration table.
            &["stage"],
            // Sources (each kind's settings, opening and read loop), and inspecting what they
            // would read.
            &["source", "inspect"],
            // The whole pipeline document (source, stages, runtime).
            &["pipeline_config"],
            // The executor: plans, order rules, resume.
            &["exec"],
        ],
    ),
    (
        "sinks/src",
        &[
            // Leaves: the output lease, the null sink. (The `sink:` section, `SinkConfig`,
            // is the crate root's, above every sink.)
            &["lease", "null"],
            &["file", "guard"],
            // Each sink kind: its settings, build and writer.
            &["ipc", "kafka", "parquet_sink"],
        ],
    ),
    (
        "loader/src",
        &[&["blob", "convert", "copy_stream", "device_image"]],
    ),
    // The Python extension: errors and batches below the iterator that makes them.
    ("python/src", &[&["errors", "batch"], &["pipeline"]]),
    (
        "trainer/src",
        &[
            &["config", "metrics"],
            &["job", "model", "optim", "sync", "checkpoint", "export"],
            &["trainer", "mpi_backend"],
            &["run"],
        ],
    ),
    (
        "src",
        &[
            &["output", "signals", "observe", "openmp", "overrides"],
            &["report", "inspect", "events"],
            &["job", "train", "bench", "sweep", "k8s"],
        ],
    ),
];

/// Every `.rs` file under `dir` (a crate's sources, relative to the repository), with its
/// module path (`state::position`; `crate` for the crate root).
fn modules(dir: &str) -> BTreeMap<String, String> {
    let root = repo().join(dir);
    let mut out = BTreeMap::new();
    for file in files_under(&root) {
        let Some(rel) = file.strip_suffix(".rs") else {
            continue;
        };
        let mut parts: Vec<&str> = rel.split(std::path::MAIN_SEPARATOR).collect();
        if matches!(parts.last(), Some(&("mod" | "lib" | "main"))) {
            parts.pop();
        }
        let name = if parts.is_empty() {
            "crate".to_string()
        } else {
            parts.join("::")
        };
        out.insert(name, std::fs::read_to_string(root.join(&file)).unwrap());
    }
    // An empty listing (a moved crate) would pass every check below without reading anything.
    assert!(
        out.len() >= 3,
        "{dir}: only {} source files found",
        out.len()
    );
    out
}

/// The code of a file before its inline test module (tests may import anything).
fn code(text: &str) -> &str {
    match text.find("#[cfg(test)]\nmod tests {") {
        Some(at) => &text[..at],
        None => text,
    }
}

fn ident_path(s: &str) -> Vec<&str> {
    let mut segs = Vec::new();
    let mut rest = s;
    loop {
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        if end == 0 {
            break;
        }
        segs.push(&rest[..end]);
        match rest[end..].strip_prefix("::") {
            Some(r) if r.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') => rest = r,
            _ => break,
        }
    }
    segs
}

/// The modules of `names` that `text` names through `crate::` paths (the longest known
/// prefix of each path), itself, its ancestors and descendants excluded.
fn imports(module: &str, text: &str, names: &BTreeSet<String>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let related = |cand: &str| {
        cand == module
            || module.starts_with(&format!("{cand}::"))
            || cand.starts_with(&format!("{module}::"))
    };
    for (at, _) in text.match_indices("crate::") {
        let after = &text[at + "crate::".len()..];
        if let Some(group) = after.strip_prefix('{') {
            let group = &group[..group.find('}').unwrap_or(group.len())];
            for item in group.split(',') {
                let head = ident_path(item.trim()).first().copied().unwrap_or("");
                if names.contains(head) && !related(head) {
                    out.insert(head.to_string());
                }
            }
            continue;
        }
        let segs = ident_path(after);
        for k in (1..=segs.len()).rev() {
            let cand = segs[..k].join("::");
            if names.contains(&cand) {
                if !related(&cand) {
                    out.insert(cand);
                }
                break;
            }
        }
    }
    out
}

fn layer_of(module: &str, layers: &[&[&str]]) -> Option<usize> {
    let mut best: Option<(usize, usize)> = None;
    for (i, layer) in layers.iter().enumerate() {
        for prefix in *layer {
            let fits = module == *prefix || module.starts_with(&format!("{prefix}::"));
            if fits && best.is_none_or(|(len, _)| prefix.len() > len) {
                best = Some((prefix.len(), i));
            }
        }
    }
    best.map(|(_, i)| i)
}

/// A unit-test module (`tests`, `x::tests`, one topic file of it `x::tests::topic`, or
/// `x_tests`): exempt from the layering and size checks, like `tests/` itself.
fn is_test_module(module: &str) -> bool {
    module == "tests"
        || module.ends_with("::tests")
        || module.contains("::tests::")
        || module.ends_with("_tests")
}

#[test]
fn every_import_points_down_the_layers() {
    let mut problems = Vec::new();
    for (dir, layers) in LAYERS {
        let mods = modules(dir);
        let names: BTreeSet<String> = mods.keys().cloned().collect();
        for (module, text) in &mods {
            if module == "crate" || is_test_module(module) {
                continue;
            }
            let Some(mine) = layer_of(module, layers) else {
                problems.push(format!(
                    "{dir}: module `{module}` has no layer: add it to LAYERS in tests/house.rs"
                ));
                continue;
            };
            for used in imports(module, code(text), &names) {
                match layer_of(&used, layers) {
                    Some(theirs) if theirs > mine => problems.push(format!(
                        "{dir}: `{module}` (layer {mine}) imports `{used}` (layer {theirs}, above it)"
                    )),
                    _ => {}
                }
            }
        }
    }
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

/// The checker itself sees an upward import, an unplaced module and a grouped import.
#[test]
fn the_layer_check_sees_upward_imports() {
    let names: BTreeSet<String> = ["batch", "state", "state::position", "exec"]
        .into_iter()
        .map(String::from)
        .collect();
    let text = "use crate::state::position::KafkaMark;\nuse crate::{exec::Plan, batch};";
    let got = imports("batch", text, &names);
    assert_eq!(
        got,
        ["exec", "state::position"]
            .into_iter()
            .map(String::from)
            .collect()
    );
    let layers: &[&[&str]] = &[&["state::position"], &["batch", "state"], &["exec"]];
    assert_eq!(layer_of("state::position", layers), Some(0));
    assert_eq!(layer_of("state::stamp", layers), Some(1));
    assert_eq!(layer_of("exec::rescale", layers), Some(2));
    assert_eq!(layer_of("stage", layers), None);
}

/// Longest source file a newcomer should have to read, in lines before its inline tests.
const MAX_FILE_LINES: usize = 700;
/// Longest function, in lines.
const MAX_FN_LINES: usize = 120;

/// The functions of `lines` longer than `max`, as (name, lines): a function runs from its
/// `fn` line to the line where its braces balance (strings and comments ignored).
fn long_functions(lines: &[&str], max: usize) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(name) = fn_name(lines[i]) else {
            i += 1;
            continue;
        };
        let (mut depth, mut started, mut j) = (0i64, false, i);
        while j < lines.len() {
            let code = code_of(lines[j]);
            depth += code.matches('{').count() as i64 - code.matches('}').count() as i64;
            started |= code.contains('{');
            if (started && depth <= 0) || (!started && code.trim_end().ends_with(';')) {
                break;
            }
            j += 1;
        }
        if started && j - i + 1 > max {
            out.push((name, j - i + 1));
        }
        i = if started { j + 1 } else { i + 1 };
    }
    out
}

/// The name of the function a line declares, if it does.
fn fn_name(line: &str) -> Option<String> {
    let mut rest = line.trim_start();
    for prefix in [
        "pub(crate) ",
        "pub(super) ",
        "pub ",
        "async ",
        "unsafe ",
        "const ",
    ] {
        rest = rest.strip_prefix(prefix).unwrap_or(rest);
    }
    let rest = rest.strip_prefix("fn ")?;
    let end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_'))?;
    Some(rest[..end].to_string())
}

/// A line without its string literals and its `//` comment.
fn code_of(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars().peekable();
    let mut in_str = false;
    while let Some(c) = chars.next() {
        match (in_str, c) {
            (true, '\\') => {
                chars.next();
            }
            (true, '"') => in_str = false,
            (true, _) => {}
            (false, '"') => in_str = true,
            (false, '/') if chars.peek() == Some(&'/') => break,
            (false, c) => out.push(c),
        }
    }
    out
}

#[test]
fn files_and_functions_stay_readable() {
    let mut problems = Vec::new();
    for (dir, _) in LAYERS {
        for (module, text) in modules(dir) {
            if is_test_module(&module) {
                continue;
            }
            let lines: Vec<&str> = code(&text).lines().collect();
            let head = lines.iter().take(5).copied().collect::<Vec<_>>().join("\n");
            if head.to_lowercase().contains("generated") {
                continue;
            }
            if lines.len() > MAX_FILE_LINES {
                problems.push(format!(
                    "{dir}: `{module}` has {} lines (at most {MAX_FILE_LINES}): split it by concern",
                    lines.len()
                ));
            }
            for (name, n) in long_functions(&lines, MAX_FN_LINES) {
                problems.push(format!(
                    "{dir}: `{module}::{name}` has {n} lines (at most {MAX_FN_LINES})"
                ));
            }
        }
    }
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

/// The size check counts a function to its closing brace, ignoring braces in strings and
/// comments.
#[test]
fn the_size_check_measures_functions() {
    let text =
        "fn a() {\n    let s = \"}\"; // }\n    x();\n}\nfn b();\npub(crate) async fn c() {}\n";
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(long_functions(&lines, 3), vec![("a".to_string(), 4)]);
    assert!(long_functions(&lines, 4).is_empty());
    assert_eq!(
        fn_name("    pub(super) fn build_it<'a>(x: u8) {"),
        Some("build_it".into())
    );
}
