//! User-facing error messages pinned as data. Each `tests/golden/errors/<case>.yaml` is run
//! through the real `sluice` binary, and its whole stderr must equal `<case>.stderr` byte for
//! byte (after the repository and the scratch directory are replaced by `<repo>` and `<out>`).
//!
//! The first line of a case says how to run it: `# sluice <command> [args…]` runs
//! `sluice <command> <case>.yaml [args…]`. An optional `# exit N` line (default 1) gives the
//! expected exit status. `${OUT}` in a case is a fresh scratch directory, for anything a run
//! would write.
//!
//! After changing a message on purpose, re-bless the files and review the diff:
//!
//! ```text
//! SLUICE_BLESS=1 cargo test --test cli_suite golden_errors
//! git diff tests/golden/errors
//! ```
#![allow(clippy::unwrap_used)]

use crate::common;

use std::path::{Path, PathBuf};

use common::*;

fn cases_dir() -> PathBuf {
    repo().join("tests/golden/errors")
}

/// How to run a case, from its first lines.
struct Header {
    command: String,
    args: Vec<String>,
    exit: i32,
}

fn header(case: &Path, text: &str) -> Header {
    let mut lines = text.lines();
    let first = lines.next().unwrap_or("");
    let Some(words) = first.strip_prefix("# sluice ") else {
        panic!(
            "{}: the first line must be `# sluice <command> [args…]`",
            case.display()
        );
    };
    let mut words = words.split_whitespace().map(String::from);
    let command = words.next().unwrap();
    let exit = lines
        .next()
        .and_then(|l| l.strip_prefix("# exit "))
        .map_or(1, |n| n.trim().parse().unwrap());
    Header {
        command,
        args: words.collect(),
        exit,
    }
}

/// `text` with the machine-specific paths replaced.
fn normalize(text: &str, out: &Path) -> String {
    let repo = repo().display().to_string();
    text.replace(&out.display().to_string(), "<out>")
        .replace(&repo, "<repo>")
}

/// Runs one case; `Err` says how its stderr or exit status differs from the golden file.
fn check(case: &Path, bless: bool) -> Result<(), String> {
    let text = std::fs::read_to_string(case).unwrap();
    let h = header(case, &text);
    let out_dir = tempfile::tempdir().unwrap();
    let output = sluice()
        .current_dir(out_dir.path())
        .env("OUT", out_dir.path())
        .arg(&h.command)
        .arg(case)
        .args(&h.args)
        .output()
        .unwrap();
    let stderr = normalize(&String::from_utf8_lossy(&output.stderr), out_dir.path());
    let name = case.file_stem().unwrap().to_string_lossy().into_owned();
    if stderr.contains("panicked") {
        return Err(format!("{name}: panicked:\n{stderr}"));
    }
    if output.status.code() != Some(h.exit) {
        return Err(format!(
            "{name}: exit status {:?}, expected {}; stderr:\n{stderr}",
            output.status.code(),
            h.exit
        ));
    }
    let golden = case.with_extension("stderr");
    if bless {
        std::fs::write(&golden, &stderr).unwrap();
        return Ok(());
    }
    let Ok(expected) = std::fs::read_to_string(&golden) else {
        return Err(format!(
            "{name}: no {} yet; run `SLUICE_BLESS=1 cargo test --test cli_suite golden_errors` and review it",
            golden.display()
        ));
    };
    if stderr != expected {
        return Err(format!(
            "{name}: stderr differs from {}\n--- expected\n{expected}--- got\n{stderr}",
            golden.display()
        ));
    }
    Ok(())
}

#[test]
fn error_messages_match_their_golden_files() {
    let bless = std::env::var_os("SLUICE_BLESS").is_some_and(|v| v == "1");
    let mut cases: Vec<PathBuf> = std::fs::read_dir(cases_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    cases.sort();
    assert!(cases.len() >= 20, "only {} cases found", cases.len());
    let failures: Vec<String> = cases.iter().filter_map(|c| check(c, bless).err()).collect();
    // A golden file whose case is gone would pin nothing.
    for entry in std::fs::read_dir(cases_dir()).unwrap() {
        let p = entry.unwrap().path();
        if p.extension().is_some_and(|e| e == "stderr") {
            assert!(
                p.with_extension("yaml").exists(),
                "{} has no case",
                p.display()
            );
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n\n")
    );
}

/// The harness fails on a message that differs, a wrong exit status and a missing golden file.
#[test]
fn the_harness_sees_a_changed_message() {
    let dir = tempfile::tempdir().unwrap();
    let case = dir.path().join("c.yaml");
    std::fs::write(&case, "# sluice validate\nsource: {type: parquet}\n").unwrap();
    let missing = check(&case, false).unwrap_err();
    assert!(missing.contains("no "), "{missing}");
    check(&case, true).unwrap();
    check(&case, false).unwrap();
    let golden = case.with_extension("stderr");
    let blessed = std::fs::read_to_string(&golden).unwrap();
    std::fs::write(&golden, format!("{blessed}one more line\n")).unwrap();
    let changed = check(&case, false).unwrap_err();
    assert!(changed.contains("stderr differs"), "{changed}");
    std::fs::write(
        &case,
        "# sluice validate\n# exit 0\nsource: {type: parquet}\n",
    )
    .unwrap();
    let status = check(&case, false).unwrap_err();
    assert!(
        status.contains("exit status Some(1), expected 0"),
        "{status}"
    );
}
