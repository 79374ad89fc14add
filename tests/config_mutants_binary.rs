//! The seeded config-mutation test through the real binary: a seeded sample of the mutants of
//! `config_mutants.rs` (some the library refuses, some it accepts, and two only the binary path
//! meets this way: bytes that are not UTF-8 and nesting 10,000 deep) goes through
//! `sluice validate --no-data`. Whatever the mutant, the process must exit cleanly, without a
//! panic or a hang, and a mutant the library refuses is refused with `file:line:column` on
//! every error line.
//!
//! The mutants are a function of the seed alone. A failure prints it, and
//! `SLUICE_MUTANT_SEED=<seed> cargo test --test cli_suite config_mutants` replays the same mutants (any
//! other seed explores new ones).
#![allow(clippy::unwrap_used)]
// `*rng.pick(..)` of a list of references: clippy calls the `*` an auto-deref, but without it
// the element type is inferred as unsized and the test does not compile.
#![allow(clippy::explicit_auto_deref)]

use crate::common;
use crate::config_mutants::{
    Expect, Kind, Loaded, MUTANTS_PER_FILE, Mutant, base_seed, config_files, describe,
    load_bounded, mutant,
};

use common::Rng;

use std::time::Duration;

/// The same for a whole `sluice validate --no-data` process.
const BINARY_HANG: Duration = Duration::from_secs(60);
/// Mutants of the sample run through the binary: some the library refuses, some it accepts.
const BINARY_REFUSED: usize = 14;
const BINARY_ACCEPTED: usize = 6;

/// `error: <origin>:<line>:<column>: <message>`.
fn located(line: &str, origin: &str) -> bool {
    let Some(rest) = line
        .strip_prefix("error: ")
        .and_then(|r| r.strip_prefix(origin))
        .and_then(|r| r.strip_prefix(':'))
    else {
        return false;
    };
    let number =
        |s: Option<&str>| s.is_some_and(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()));
    let mut parts = rest.splitn(3, ':');
    number(parts.next()) && number(parts.next()) && parts.next().is_some_and(|m| m.starts_with(' '))
}

/// Checks what `sluice validate --no-data` did with a mutant the library refuses
/// (`lib_refused`) or accepts.
fn check_binary(
    m: &Mutant,
    origin: &str,
    lib_refused: bool,
    out: &std::process::Output,
) -> Result<(), String> {
    let stderr = String::from_utf8_lossy(&out.stderr);
    let said = format!(
        "\n--- stderr ---\n{}",
        stderr.chars().take(3000).collect::<String>()
    );
    if stderr.contains("panicked") {
        return Err(format!("sluice validate panicked{said}"));
    }
    match out.status.code() {
        Some(0) if lib_refused => Err(format!(
            "exit 0, but loading it in the library refuses it{said}"
        )),
        Some(0) => Ok(()),
        Some(1) => {
            let errors: Vec<&str> = stderr
                .lines()
                .filter(|l| l.starts_with("error: "))
                .collect();
            if errors.is_empty() {
                return Err(format!("exit 1 without an `error:` line{said}"));
            }
            if !lib_refused {
                // Refused by what `sluice train` checks beyond the YAML (a tensor the trainer
                // names that the loader lacks, …): not a YAML-level problem.
                return Ok(());
            }
            // Every problem on a line of its own at its place; a long list may end with a
            // count of the problems not shown.
            let unreadable = std::str::from_utf8(&m.bytes).is_err();
            if !unreadable && !errors.iter().any(|l| located(l, origin)) {
                return Err(format!(
                    "no error line starts with `{origin}:line:column: `{said}"
                ));
            }
            match errors.iter().find(|l| {
                !(located(l, origin)
                    || l.contains(" more problem")
                    || (unreadable && l.contains(origin)))
            }) {
                Some(l) => Err(format!(
                    "an error line without `{origin}:line:column: `: {l}{said}"
                )),
                None => Ok(()),
            }
        }
        _ => Err(format!(
            "exit status {:?}: not a clean refusal (101: a panic, 134: an abort, no code: killed by a signal, or after the {} s hang timeout){said}",
            out.status,
            BINARY_HANG.as_secs()
        )),
    }
}

#[test]
fn a_sample_of_mutants_through_sluice_validate_exits_cleanly() {
    let base = base_seed();
    let files = config_files();
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("configs");
    std::fs::create_dir(&work).unwrap();
    let mut all: Vec<Mutant> = files
        .iter()
        .flat_map(|(name, text)| (0..MUTANTS_PER_FILE).map(move |i| mutant(base, name, text, i)))
        .collect();
    // A seeded shuffle, then the first mutants the library refuses and accepts.
    let mut rng = Rng(base ^ 0xB1A5);
    for i in (1..all.len()).rev() {
        let j = rng.below(i + 1);
        all.swap(i, j);
    }
    let mut sample: Vec<(Mutant, bool)> = Vec::new();
    let (mut refused, mut accepted) = (0, 0);
    for m in all {
        if refused == BINARY_REFUSED && accepted == BINARY_ACCEPTED {
            break;
        }
        let path = work.join(&m.file);
        std::fs::write(&path, &m.bytes).unwrap();
        match load_bounded(&path) {
            Ok(Loaded::Accepted) if accepted < BINARY_ACCEPTED => {
                accepted += 1;
                sample.push((m, false));
            }
            // A panic or hang in the library is the other test's to report.
            Ok(Loaded::Accepted) | Err(_) => {}
            Ok(_) if refused < BINARY_REFUSED => {
                refused += 1;
                sample.push((m, true));
            }
            Ok(_) => {}
        }
    }
    assert!(
        refused == BINARY_REFUSED && accepted > 0,
        "the sample has {refused} refused and {accepted} accepted mutants"
    );
    // Two that only the binary path meets this way: bytes that are not UTF-8, and nesting
    // 10,000 deep.
    let (name, original) = &files[0];
    let half = original.len() / 2;
    let mut not_utf8 = original[..half].to_vec();
    not_utf8.extend_from_slice(b"\xff\xfe");
    not_utf8.extend_from_slice(&original[half..]);
    let mut deep = original.clone();
    deep.extend_from_slice(format!("zz: {}\n", "[".repeat(10_000)).as_bytes());
    for (index, (kind, bytes)) in [(Kind::InvalidUtf8, not_utf8), (Kind::DeepNesting, deep)]
        .into_iter()
        .enumerate()
    {
        let m = Mutant {
            file: name.clone(),
            index: MUTANTS_PER_FILE + index,
            seed: 0,
            kinds: vec![kind],
            bytes,
            expect: Expect::Refused,
        };
        sample.push((m, true));
    }
    let mut problems = Vec::new();
    for (m, lib_refused) in &sample {
        let path = work.join(&m.file);
        std::fs::write(&path, &m.bytes).unwrap();
        let origin = path.display().to_string();
        let out = common::sluice()
            .arg("validate")
            .arg("--no-data")
            .arg(path.as_path())
            .current_dir(dir.path())
            .timeout(BINARY_HANG)
            .output()
            .unwrap();
        if let Err(problem) = check_binary(m, &origin, *lib_refused, &out) {
            problems.push(describe(m, base, &problem));
        }
    }
    assert!(
        problems.is_empty(),
        "{} of {} mutants went wrong through `sluice validate --no-data`:\n\n{}",
        problems.len(),
        sample.len(),
        problems.join("\n\n")
    );
}
