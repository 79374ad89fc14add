//! A seeded config-mutation test: hundreds of mutants of every file in `configs/` (deleted,
//! duplicated and re-indented lines, duplicated and unknown keys, swapped types, huge and
//! negative numbers, control bytes, invalid UTF-8, deep nesting, an alias bomb, unset and
//! malformed variables, CR and CRLF line endings, several documents, truncation), each loaded
//! as `sluice validate --no-data` loads a config: `ConfigDocument::from_path`, then
//! `Job::from_document`. Whatever the mutant, loading must not panic and must not hang, and a
//! refused mutant is refused with `file:line:column` on every problem, pointing into the file.
//! Some mutations can only be refused (a key given twice, a variable that is not set, nesting
//! past any sane depth, a mapping replaced by a scalar): alone on an otherwise valid file they
//! must be, a duplicated key on the line of its second occurrence and an unset variable at the
//! line and column of its `$`. A sample also goes through the real binary
//! (`config_mutants_binary.rs`); the mutations themselves are made in
//! `config_mutants_mutations.rs`.
//!
//! The mutants are a function of the seed alone. A failure prints it, and
//! `SLUICE_MUTANT_SEED=<seed> cargo test --test cli_suite config_mutants` replays the same mutants (any
//! other seed explores new ones).
#![allow(clippy::unwrap_used)]
// `*rng.pick(..)` of a list of references: clippy calls the `*` an auto-deref, but without it
// the element type is inferred as unsized and the test does not compile.
#![allow(clippy::explicit_auto_deref)]

use crate::common;
use crate::config_mutants_mutations::apply;

use common::Rng;

use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use sluice::pipeline::{ConfigDocument, ConfigError, Error as PipelineError};
use sluice::{Job, JobError};

/// Base seed of the mutants; `SLUICE_MUTANT_SEED` (decimal or `0x…`) replaces it.
const DEFAULT_SEED: u64 = 0x51CE_C0F1_6D07_A7E5;
/// Mutants per file in `configs/` (1,200 for the six files there now).
pub(crate) const MUTANTS_PER_FILE: usize = 200;
/// Loading a config of a few kilobytes takes milliseconds, even in a debug build on a busy
/// machine: one still loading after this long is hung. A hang detector, not a timing check.
const HANG: Duration = Duration::from_secs(30);

/// The mutations. Each is applied to the text as it stands (after earlier ones of the same
/// mutant).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    DeleteLine,
    DuplicateLine,
    DuplicateKey,
    UnknownKey,
    SwapType,
    MapToScalar,
    HugeNumber,
    NegativeNumber,
    LongValue,
    ControlByte,
    InvalidUtf8,
    DeepNesting,
    AliasBomb,
    UnsetVariable,
    BadVariable,
    LineEndings,
    Indentation,
    Tab,
    MultiDocument,
    WholeDocument,
    Truncate,
}

const KINDS: [Kind; 21] = [
    Kind::DeleteLine,
    Kind::DuplicateLine,
    Kind::DuplicateKey,
    Kind::UnknownKey,
    Kind::SwapType,
    Kind::MapToScalar,
    Kind::HugeNumber,
    Kind::NegativeNumber,
    Kind::LongValue,
    Kind::ControlByte,
    Kind::InvalidUtf8,
    Kind::DeepNesting,
    Kind::AliasBomb,
    Kind::UnsetVariable,
    Kind::BadVariable,
    Kind::LineEndings,
    Kind::Indentation,
    Kind::Tab,
    Kind::MultiDocument,
    Kind::WholeDocument,
    Kind::Truncate,
];

/// What a mutant made by one mutation of a valid file must do (mutants of several mutations
/// only get the invariants).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expect {
    /// Accepted or refused; only the invariants apply.
    Any,
    /// Refused.
    Refused,
    /// Refused, with a problem on this line.
    RefusedOnLine(usize),
    /// Refused, with a problem at this line and column.
    RefusedAt(usize, usize),
}

#[derive(Debug, Clone)]
pub(crate) struct Mutant {
    /// The config file it was made from (its name in `configs/`).
    pub(crate) file: String,
    /// Its number among that file's mutants.
    pub(crate) index: usize,
    /// Seed of its own generator (derived from the base seed, the file and the index).
    pub(crate) seed: u64,
    /// The mutations made, in order.
    pub(crate) kinds: Vec<Kind>,
    pub(crate) bytes: Vec<u8>,
    pub(crate) expect: Expect,
}

/// Picking from a list, on top of the shared seeded generator.
impl Rng {
    pub(crate) fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

pub(crate) fn base_seed() -> u64 {
    match std::env::var("SLUICE_MUTANT_SEED") {
        Ok(s) => {
            let s = s.trim();
            match s.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => s.parse(),
            }
            .unwrap_or_else(|e| panic!("SLUICE_MUTANT_SEED={s} is not a number: {e}"))
        }
        Err(_) => DEFAULT_SEED,
    }
}

/// The seed of mutant `index` of `file`: independent of the other files, so adding a config
/// does not change the mutants of the others.
fn mutant_seed(base: u64, file: &str, index: usize) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in file.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    Rng(base ^ h ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)).next_u64()
}

/// Every `*.yaml` in `configs/`, by name, with its bytes.
pub(crate) fn config_files() -> Vec<(String, Vec<u8>)> {
    let dir = common::repo().join("configs");
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(p).unwrap())
        })
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no configs in {}", dir.display());
    files
}

/// Mutant `index` of `file`: one to three mutations.
pub(crate) fn mutant(base: u64, file: &str, original: &[u8], index: usize) -> Mutant {
    let seed = mutant_seed(base, file, index);
    let mut rng = Rng(seed);
    let wanted = match rng.below(10) {
        0..=4 => 1,
        5..=7 => 2,
        _ => 3,
    };
    let mut bytes = original.to_vec();
    let mut kinds = Vec::new();
    let mut expect = Expect::Any;
    let mut attempts = 0;
    while kinds.len() < wanted && attempts < 100 {
        attempts += 1;
        let kind = *rng.pick(&KINDS);
        // An alias bomb costs the parser its whole alias budget (a million replayed events)
        // before it is refused: one in eight of the draws is plenty.
        if kind == Kind::AliasBomb && rng.below(8) != 0 {
            continue;
        }
        if let Some((mutated, e)) = apply(kind, &mut rng, &bytes)
            && mutated != bytes
        {
            bytes = mutated;
            kinds.push(kind);
            expect = e;
        }
    }
    if kinds.len() != 1 {
        expect = Expect::Any;
    }
    Mutant {
        file: file.to_string(),
        index,
        seed,
        kinds,
        bytes,
        expect,
    }
}

/// What loading a config gave.
#[derive(Debug)]
pub(crate) enum Loaded {
    Accepted,
    /// Config problems, each with its file, line and column.
    Refused(Vec<ConfigError>),
    /// The file could not be read as text (invalid UTF-8).
    Unreadable(String),
    /// Any other error: not a located config problem.
    Other(String),
}

/// Loads a config as `sluice validate --no-data` does: the job (pipeline, sink, checkpoint,
/// loader) and, with the `torch` feature, the `trainer:` section.
fn load(path: &Path) -> Loaded {
    let doc = match ConfigDocument::from_path(path) {
        Ok(doc) => doc,
        Err(e) => return classify(JobError::from(e)),
    };
    #[cfg_attr(not(feature = "torch"), allow(unused_mut))]
    let mut trainer_errors: Vec<ConfigError> = Vec::new();
    #[cfg(feature = "torch")]
    let _ = doc.value::<sluice::trainer::TrainerConfig>("trainer", &mut trainer_errors);
    match Job::from_document(&doc) {
        Ok(_) if trainer_errors.is_empty() => Loaded::Accepted,
        Ok(_) => Loaded::Refused(trainer_errors),
        Err(JobError::Pipeline(PipelineError::Config(errors))) => {
            let mut all = errors.0;
            all.extend(trainer_errors);
            Loaded::Refused(all)
        }
        Err(e) => classify(e),
    }
}

fn classify(e: JobError) -> Loaded {
    match e {
        JobError::Pipeline(PipelineError::Config(errors)) => Loaded::Refused(errors.0),
        JobError::Pipeline(PipelineError::ConfigFile { .. }) => Loaded::Unreadable(e.to_string()),
        _ => Loaded::Other(e.to_string()),
    }
}

/// [`load`] on a thread of its own (with the 8 MiB stack of the binary's main thread, where
/// `validate` runs): a panic comes back as `Err`, and so does a load that does not finish
/// within [`HANG`] (the thread is then left behind; the test fails anyway).
pub(crate) fn load_bounded(path: &Path) -> Result<Loaded, String> {
    let (tx, rx) = mpsc::channel();
    let owned = path.to_path_buf();
    let worker = std::thread::Builder::new()
        .name("config-mutant".into())
        .stack_size(8 << 20)
        .spawn(move || {
            let result = std::panic::catch_unwind(AssertUnwindSafe(|| load(&owned)));
            let _ = tx.send(result.map_err(|p| panic_message(&*p)));
        })
        .unwrap();
    match rx.recv_timeout(HANG) {
        Ok(result) => {
            let _ = worker.join();
            result.map_err(|m| format!("loading panicked: {m}"))
        }
        Err(mpsc::RecvTimeoutError::Timeout) => Err(format!(
            "loading did not finish within {} s: a hang",
            HANG.as_secs()
        )),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            Err("the loading thread ended without an answer".to_string())
        }
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(a panic without a message)".to_string()
    }
}

/// The last line a position in `bytes` can be on, counting every character some YAML reader
/// might take for a line break.
fn last_line(bytes: &[u8]) -> usize {
    1 + String::from_utf8_lossy(bytes)
        .chars()
        .filter(|c| {
            matches!(
                *c,
                '\n' | '\r' | '\u{0b}' | '\u{0c}' | '\u{85}' | '\u{2028}' | '\u{2029}'
            )
        })
        .count()
}

fn listed(errors: &[ConfigError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(" | ")
}

/// Checks the outcome of loading a mutant written at `origin`: `Ok(refused?)`, or what is
/// wrong.
fn check(m: &Mutant, origin: &str, outcome: Result<Loaded, String>) -> Result<bool, String> {
    let errors = match outcome? {
        Loaded::Accepted => {
            return match m.expect {
                Expect::Any => Ok(false),
                other => Err(format!("accepted, but it can only be refused ({other:?})")),
            };
        }
        Loaded::Unreadable(message) => {
            if std::str::from_utf8(&m.bytes).is_ok() {
                return Err(format!("valid UTF-8, yet refused as unreadable: {message}"));
            }
            if !message.contains(origin) {
                return Err(format!("the error does not name the file: {message}"));
            }
            return Ok(true);
        }
        Loaded::Other(message) => {
            return Err(format!(
                "refused without file:line:column (not a config error): {message}"
            ));
        }
        Loaded::Refused(errors) => errors,
    };
    if errors.is_empty() {
        return Err("refused with an empty list of problems".to_string());
    }
    let lines = last_line(&m.bytes);
    for e in &errors {
        if e.file != origin || e.line == 0 || e.column == 0 || e.line > lines {
            return Err(format!(
                "a problem not located in the file ({lines} lines): {e:?}"
            ));
        }
        if e.message.trim().is_empty() || e.message.contains('\n') {
            return Err(format!(
                "a problem without a one-line message (printed, its other lines would lose the location): {e:?}"
            ));
        }
    }
    let found = |line: usize, column: Option<usize>| {
        errors
            .iter()
            .any(|e| e.line == line && column.is_none_or(|c| e.column == c))
    };
    match m.expect {
        Expect::RefusedOnLine(line) if !found(line, None) => Err(format!(
            "refused, but with no problem on line {line}: {}",
            listed(&errors)
        )),
        Expect::RefusedAt(line, column) if !found(line, Some(column)) => Err(format!(
            "refused, but with no problem at {line}:{column}: {}",
            listed(&errors)
        )),
        _ => Ok(true),
    }
}

/// How a failing mutant is shown: enough to reproduce it, and its text.
pub(crate) fn describe(m: &Mutant, base: u64, problem: &str) -> String {
    const SHOWN: usize = 1500;
    let text: String = String::from_utf8_lossy(&m.bytes[..m.bytes.len().min(SHOWN)])
        .chars()
        .map(|c| match c {
            '\n' | '\t' => c.to_string(),
            c if c.is_control() || matches!(c, '\u{feff}' | '\u{2028}' | '\u{2029}') => {
                c.escape_unicode().to_string()
            }
            c => c.to_string(),
        })
        .collect();
    format!(
        "configs/{} mutant #{} {:?} (its seed {:#x}; replay with SLUICE_MUTANT_SEED={base:#x}): {problem}\n----- the mutant ({} bytes{}) -----\n{text}\n-----",
        m.file,
        m.index,
        m.kinds,
        m.seed,
        m.bytes.len(),
        if m.bytes.len() > SHOWN {
            ", the start shown"
        } else {
            ""
        }
    )
}

fn kind_index(kind: Kind) -> usize {
    KINDS.iter().position(|k| *k == kind).unwrap()
}

#[test]
fn config_mutants_load_without_panics_hangs_or_unlocated_errors() {
    let base = base_seed();
    let files = config_files();
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("configs");
    std::fs::create_dir(&work).unwrap();
    let started = Instant::now();
    let mut made = [0usize; KINDS.len()];
    let mut refused_with = [0usize; KINDS.len()];
    let (mut accepted, mut refused, mut with_expectation) = (0usize, 0usize, 0usize);
    let mut problems: Vec<String> = Vec::new();
    'files: for (name, original) in &files {
        let path = work.join(name);
        let origin = path.display().to_string();
        std::fs::write(&path, original).unwrap();
        match load_bounded(&path) {
            Ok(Loaded::Accepted) => {}
            other => panic!("configs/{name} itself does not load: {other:?}"),
        }
        for index in 0..MUTANTS_PER_FILE {
            let m = mutant(base, name, original, index);
            std::fs::write(&path, &m.bytes).unwrap();
            if m.expect != Expect::Any {
                with_expectation += 1;
            }
            match check(&m, &origin, load_bounded(&path)) {
                Ok(was_refused) => {
                    for k in &m.kinds {
                        made[kind_index(*k)] += 1;
                        if was_refused {
                            refused_with[kind_index(*k)] += 1;
                        }
                    }
                    if was_refused {
                        refused += 1;
                    } else {
                        accepted += 1;
                    }
                }
                Err(problem) => {
                    let hung = problem.contains("a hang");
                    problems.push(describe(&m, base, &problem));
                    // A hung load keeps a core busy: stop at the first; else show up to ten.
                    if hung || problems.len() >= 10 {
                        break 'files;
                    }
                }
            }
        }
    }
    let total = accepted + refused;
    let per_kind: Vec<String> = KINDS
        .iter()
        .enumerate()
        .map(|(i, k)| {
            format!(
                "  {k:?}: in {} mutants, {} refused",
                made[i], refused_with[i]
            )
        })
        .collect();
    eprintln!(
        "{total} config mutants (base seed {base:#x}) in {:.1} s: {refused} refused, {accepted} accepted, {with_expectation} with a required outcome\n{}",
        started.elapsed().as_secs_f64(),
        per_kind.join("\n")
    );
    assert!(
        problems.is_empty(),
        "{} config mutant(s) misbehaved (base seed {base:#x}):\n\n{}",
        problems.len(),
        problems.join("\n\n")
    );
    // The generator itself: every kind of mutation was made, some mutants are refused (the
    // checks above had something to check), and some are still valid configs.
    for (k, n) in KINDS.iter().zip(made) {
        assert!(n > 0, "no mutant of kind {k:?} was made");
    }
    assert!(
        refused * 4 >= total,
        "only {refused} of {total} mutants were refused: the mutations are too mild"
    );
    assert!(accepted > 0, "all {total} mutants were refused");
    assert!(
        with_expectation * 10 >= total,
        "only {with_expectation} of {total} mutants had a required outcome"
    );
}
