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
//! line and column of its `$`. A sample also goes through the real binary.
//!
//! The mutants are a function of the seed alone. A failure prints it, and
//! `SLUICE_MUTANT_SEED=<seed> cargo test --test cli_suite config_mutants` replays the same mutants (any
//! other seed explores new ones).
#![allow(clippy::unwrap_used)]
// `*rng.pick(..)` of a list of references: clippy calls the `*` an auto-deref, but without it
// the element type is inferred as unsized and the test does not compile.
#![allow(clippy::explicit_auto_deref)]

use crate::common;

use common::Rng;

use std::ops::Range;
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use sluice::pipeline::{ConfigDocument, ConfigError, Error as PipelineError};
use sluice::{Job, JobError};

/// Base seed of the mutants; `SLUICE_MUTANT_SEED` (decimal or `0x…`) replaces it.
const DEFAULT_SEED: u64 = 0x51CE_C0F1_6D07_A7E5;
/// Mutants per file in `configs/` (1,200 for the six files there now).
const MUTANTS_PER_FILE: usize = 200;
/// Loading a config of a few kilobytes takes milliseconds, even in a debug build on a busy
/// machine: one still loading after this long is hung. A hang detector, not a timing check.
const HANG: Duration = Duration::from_secs(30);
/// The same for a whole `sluice validate --no-data` process.
const BINARY_HANG: Duration = Duration::from_secs(60);
/// Mutants of the sample run through the binary: some the library refuses, some it accepts.
const BINARY_REFUSED: usize = 14;
const BINARY_ACCEPTED: usize = 6;

/// The mutations. Each is applied to the text as it stands (after earlier ones of the same
/// mutant).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
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
enum Expect {
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
struct Mutant {
    /// The config file it was made from (its name in `configs/`).
    file: String,
    /// Its number among that file's mutants.
    index: usize,
    /// Seed of its own generator (derived from the base seed, the file and the index).
    seed: u64,
    /// The mutations made, in order.
    kinds: Vec<Kind>,
    bytes: Vec<u8>,
    expect: Expect,
}

/// Picking from a list, on top of the shared seeded generator.
impl Rng {
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

fn base_seed() -> u64 {
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
fn config_files() -> Vec<(String, Vec<u8>)> {
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
fn mutant(base: u64, file: &str, original: &[u8], index: usize) -> Mutant {
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

/// Applies one mutation, or `None` where it has nothing to work on.
fn apply(kind: Kind, rng: &mut Rng, bytes: &[u8]) -> Option<(Vec<u8>, Expect)> {
    match kind {
        Kind::Truncate => {
            if bytes.is_empty() {
                return None;
            }
            let cut = rng.below(bytes.len());
            Some((bytes[..cut].to_vec(), Expect::Any))
        }
        Kind::InvalidUtf8 => {
            const BAD: [&[u8]; 5] = [
                b"\xff",
                b"\xc3",
                b"\xed\xa0\x80",
                b"\xf8\x88\x80\x80\x80",
                b"\xc0\xaf",
            ];
            let at = rng.below(bytes.len() + 1);
            let mut out = bytes[..at].to_vec();
            out.extend_from_slice(*rng.pick(&BAD));
            out.extend_from_slice(&bytes[at..]);
            Some((out, Expect::Any))
        }
        _ => {
            let text = String::from_utf8_lossy(bytes).into_owned();
            let (text, expect) = apply_text(kind, rng, &text)?;
            Some((text.into_bytes(), expect))
        }
    }
}

/// Replacement values of another type.
const SWAPS: [&str; 22] = [
    "\"7\"",
    "'text'",
    "[1, 2]",
    "[]",
    "{a: 1}",
    "{}",
    "true",
    "null",
    "~",
    "3.5",
    "0",
    "\"\"",
    "[[x]]",
    "!!binary aGVsbG8=",
    "!custom 1",
    "2026-01-31",
    "0x10",
    "0o17",
    "1_000",
    "yes",
    "&anchor 5",
    "*undefined_alias",
];

const HUGE: [&str; 14] = [
    "1e308",
    "1e309",
    "-1e309",
    "18446744073709551616",
    "18446744073709551615",
    "4294967296",
    "9223372036854775808",
    "-9223372036854775809",
    "99999999999999999999999999999999",
    ".inf",
    "-.inf",
    ".nan",
    "0x7fffffffffffffff",
    "1e-400",
];

const NEGATIVE: [&str; 6] = [
    "-1",
    "-0",
    "-1e10",
    "-4294967296",
    "-9223372036854775808",
    "-0.5",
];

const CONTROLS: [&str; 11] = [
    "\0", "\x07", "\x1b", "\x08", "\x7f", "\x0b", "\x0c", "\u{85}", "\u{2028}", "\u{feff}",
    "\x1b[31m",
];

/// Malformed variable references: each is an error at its `$`.
const BAD_REFERENCES: [&str; 5] = ["${", "${A B}", "${}", "${-x}", "${X:-"];

/// Whole documents that are not a pipeline.
const NOT_PIPELINES: [&str; 12] = [
    "",
    "\n",
    "---\n",
    "null\n",
    "~\n",
    "[]\n",
    "42\n",
    "{}\n",
    "source\n",
    "# only a comment\n",
    "source:\n",
    "- source: {type: parquet, path: x.parquet}\n",
];

fn apply_text(kind: Kind, rng: &mut Rng, text: &str) -> Option<(String, Expect)> {
    let mut lines: Vec<String> = text.split_inclusive('\n').map(String::from).collect();
    let keyed: Vec<(usize, KeyLine)> = lines
        .iter()
        .enumerate()
        .filter_map(|(i, l)| key_line(l).map(|k| (i, k)))
        .collect();
    let valued: Vec<&(usize, KeyLine)> =
        keyed.iter().filter(|(_, k)| !k.value.is_empty()).collect();
    let code: Vec<usize> = (0..lines.len()).filter(|i| is_code(&lines[*i])).collect();
    match kind {
        Kind::DeleteLine => {
            if lines.is_empty() {
                return None;
            }
            lines.remove(rng.below(lines.len()));
            Some((lines.concat(), Expect::Any))
        }
        Kind::DuplicateLine => {
            if lines.is_empty() {
                return None;
            }
            let i = rng.below(lines.len());
            let copy = terminated(&lines[i]);
            lines[i] = copy.clone();
            lines.insert(i + 1, copy);
            Some((lines.concat(), Expect::Any))
        }
        Kind::DuplicateKey => {
            // `key: …` given again right after itself, in the same mapping: the second one is
            // the problem.
            let candidates: Vec<&(usize, KeyLine)> =
                keyed.iter().filter(|(_, k)| !k.list_item).collect();
            if candidates.is_empty() {
                return None;
            }
            let i = rng.pick(&candidates).0;
            let copy = terminated(&lines[i]);
            lines[i] = copy.clone();
            lines.insert(i + 1, copy);
            Some((lines.concat(), Expect::RefusedOnLine(i + 2)))
        }
        Kind::UnknownKey => {
            if keyed.is_empty() {
                return None;
            }
            let (i, k) = pair(rng.pick(&keyed));
            let extra = format!("{}zz_unknown_{}: 1\n", " ".repeat(k.key), rng.below(1000));
            lines[i] = terminated(&lines[i]);
            lines.insert(i + 1, extra);
            Some((lines.concat(), Expect::Any))
        }
        Kind::SwapType => {
            if valued.is_empty() {
                return None;
            }
            let (i, k) = pair(*rng.pick(&valued));
            let new = *rng.pick(&SWAPS);
            if value_of(&lines, i, k) == new {
                return None;
            }
            lines[i] = with_value(&lines[i], k, new);
            Some((lines.concat(), Expect::Any))
        }
        Kind::MapToScalar => {
            // A mapping or list (a `key:` line with an indented block under it) replaced by a
            // scalar, its block left below it: never YAML.
            let headers: Vec<&(usize, KeyLine)> = keyed
                .iter()
                .filter(|(i, k)| has_children(&lines, *i, k))
                .collect();
            if headers.is_empty() {
                return None;
            }
            let (i, k) = pair(*rng.pick(&headers));
            let new = *rng.pick(&["42", "-1", "some text", "true"]);
            lines[i] = with_value(&lines[i], k, new);
            Some((lines.concat(), Expect::Refused))
        }
        Kind::HugeNumber | Kind::NegativeNumber => {
            let numeric: Vec<&(usize, KeyLine)> = valued
                .iter()
                .copied()
                .filter(|(i, k)| looks_numeric(value_of(&lines, *i, k)))
                .collect();
            let pool = if !numeric.is_empty() && rng.below(10) < 7 {
                &numeric
            } else {
                &valued
            };
            if pool.is_empty() {
                return None;
            }
            let (i, k) = pair(*rng.pick(pool));
            let new = if kind == Kind::HugeNumber {
                *rng.pick(&HUGE)
            } else {
                *rng.pick(&NEGATIVE)
            };
            lines[i] = with_value(&lines[i], k, new);
            Some((lines.concat(), Expect::Any))
        }
        Kind::LongValue => {
            if valued.is_empty() {
                return None;
            }
            let (i, k) = pair(*rng.pick(&valued));
            let new = if rng.below(2) == 0 {
                "x".repeat(65_536)
            } else {
                format!("\"{}\"", "y".repeat(100_000))
            };
            lines[i] = with_value(&lines[i], k, &new);
            Some((lines.concat(), Expect::Any))
        }
        Kind::ControlByte => {
            let bounds: Vec<usize> = text
                .char_indices()
                .map(|(i, _)| i)
                .chain([text.len()])
                .collect();
            let at = *rng.pick(&bounds);
            let mut out = text.to_string();
            out.insert_str(at, *rng.pick(&CONTROLS));
            Some((out, Expect::Any))
        }
        Kind::DeepNesting => {
            if keyed.is_empty() {
                return None;
            }
            let (i, k) = pair(rng.pick(&keyed));
            let nested = match rng.below(5) {
                0 => "[".repeat(10_000),
                1 => format!("{}1{}", "[".repeat(200), "]".repeat(200)),
                2 => format!("{}1{}", "{a: ".repeat(200), "}".repeat(200)),
                3 => "{a: ".repeat(10_000),
                _ => {
                    // 100 levels of block mappings under the key.
                    let mut block = format!("{}\n", &body(&lines[i])[..=k.colon]);
                    for depth in 1..=100 {
                        let value = if depth == 100 { " 1" } else { "" };
                        block += &format!("{}a:{value}\n", " ".repeat(k.key + 2 * depth));
                    }
                    lines[i] = block;
                    return Some((lines.concat(), Expect::Refused));
                }
            };
            lines[i] = with_value(&lines[i], k, &nested);
            Some((lines.concat(), Expect::Refused))
        }
        Kind::AliasBomb => {
            // Nine levels of ten aliases each: 10^9 nodes if expanded. New top-level keys, so
            // refused even if the parser's alias budget let it through.
            let mut bomb = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
            for level in 1..9 {
                let previous = format!("*a{}", level - 1);
                let items: Vec<&str> = (0..10).map(|_| previous.as_str()).collect();
                bomb += &format!("a{level}: &a{level} [{}]\n", items.join(", "));
            }
            Some((terminated(text) + &bomb, Expect::Refused))
        }
        Kind::UnsetVariable => {
            let name = format!("SLUICE_MUTANT_UNSET_{}", rng.below(1_000_000));
            let references: Vec<(usize, Range<usize>)> = lines
                .iter()
                .enumerate()
                .flat_map(|(i, l)| variable_references(l).into_iter().map(move |r| (i, r)))
                .collect();
            if !references.is_empty() && rng.below(2) == 0 {
                // An existing `${VAR:-default}` made a variable that is not set, no default.
                let (i, r) = rng.pick(&references).clone();
                let column = lines[i][..r.start].chars().count() + 1;
                lines[i].replace_range(r, &format!("${{{name}}}"));
                return Some((lines.concat(), Expect::RefusedAt(i + 1, column)));
            }
            if valued.is_empty() {
                return None;
            }
            let (i, k) = pair(*rng.pick(&valued));
            let new = if rng.below(2) == 0 {
                format!("${{{name}}}")
            } else {
                format!("${{{name}}}/{}", value_of(&lines, i, k))
            };
            let column = value_column(&lines[i], k);
            lines[i] = with_value(&lines[i], k, &new);
            Some((lines.concat(), Expect::RefusedAt(i + 1, column)))
        }
        Kind::BadVariable => {
            if valued.is_empty() {
                return None;
            }
            let (i, k) = pair(*rng.pick(&valued));
            let column = value_column(&lines[i], k);
            lines[i] = with_value(&lines[i], k, *rng.pick(&BAD_REFERENCES));
            Some((lines.concat(), Expect::RefusedAt(i + 1, column)))
        }
        Kind::LineEndings => {
            if !text.contains('\n') {
                return None;
            }
            let ending = *rng.pick(&["\r\n", "\r"]);
            Some((text.replace('\n', ending), Expect::Any))
        }
        Kind::Indentation => {
            if code.is_empty() {
                return None;
            }
            let i = *rng.pick(&code);
            let n = 1 + rng.below(4);
            let current = indent(&lines[i]);
            if current > 0 && rng.below(2) == 0 {
                lines[i].replace_range(..n.min(current), "");
            } else {
                lines[i].insert_str(0, &" ".repeat(n));
            }
            Some((lines.concat(), Expect::Any))
        }
        Kind::Tab => {
            if code.is_empty() {
                return None;
            }
            let i = *rng.pick(&code);
            let current = indent(&lines[i]);
            if current > 0 {
                lines[i].replace_range(..current, "\t");
            } else {
                lines[i].insert(0, '\t');
            }
            Some((lines.concat(), Expect::Any))
        }
        Kind::MultiDocument => {
            if text.is_empty() {
                return None;
            }
            let second = if rng.below(2) == 0 {
                text
            } else {
                "source: {type: parquet, path: x.parquet}\n"
            };
            Some((
                format!("{}---\n{second}", terminated(text)),
                Expect::Refused,
            ))
        }
        Kind::WholeDocument => {
            let doc = *rng.pick(&NOT_PIPELINES);
            (doc != text).then(|| (doc.to_string(), Expect::Refused))
        }
        Kind::Truncate | Kind::InvalidUtf8 => None,
    }
}

/// A `key: value` line of a block mapping (also `- key: value`, the first key of a list item).
#[derive(Debug, Clone)]
struct KeyLine {
    /// Byte offset of the key (after the indentation and any `- `).
    key: usize,
    /// Byte offset of the `:` after the key.
    colon: usize,
    /// The value, without a trailing comment; empty for a header like `source:`.
    value: Range<usize>,
    /// The line starts a list item.
    list_item: bool,
}

fn pair(entry: &(usize, KeyLine)) -> (usize, &KeyLine) {
    (entry.0, &entry.1)
}

/// A line without its line ending.
fn body(line: &str) -> &str {
    line.trim_end_matches(['\n', '\r'])
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start_matches(' ').len()
}

/// Neither blank nor only a comment.
fn is_code(line: &str) -> bool {
    let t = body(line).trim_start();
    !t.is_empty() && !t.starts_with('#')
}

fn terminated(line: &str) -> String {
    if line.ends_with('\n') {
        line.to_string()
    } else {
        format!("{line}\n")
    }
}

fn key_line(line: &str) -> Option<KeyLine> {
    let body = body(line);
    let indent = indent(body);
    let list_item = body[indent..].starts_with("- ");
    let key = if list_item { indent + 2 } else { indent };
    let name = body[key..]
        .bytes()
        .take_while(|b| b.is_ascii_alphanumeric() || *b == b'_')
        .count();
    let colon = key + name;
    if name == 0 || body.as_bytes().get(colon) != Some(&b':') {
        return None;
    }
    let after = &body[colon + 1..];
    if !after.is_empty() && !after.starts_with(' ') {
        return None;
    }
    let start = colon + 1 + (after.len() - after.trim_start_matches(' ').len());
    let code_end = comment_start(body).max(start);
    let end = body[..code_end].trim_end().len().max(start);
    Some(KeyLine {
        key,
        colon,
        value: start..end,
        list_item,
    })
}

/// Where a comment starts, as the config loader's `${VAR}` interpolation sees it: a `#` at the
/// start of the line or after whitespace, outside quotes.
fn comment_start(line: &str) -> usize {
    let mut quote: Option<char> = None;
    let mut prev_ws = true;
    for (i, c) in line.char_indices() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None if c == '"' || c == '\'' => quote = Some(c),
            None if c == '#' && prev_ws => return i,
            None => {}
        }
        prev_ws = c.is_whitespace();
    }
    line.len()
}

fn value_of<'a>(lines: &'a [String], i: usize, k: &KeyLine) -> &'a str {
    &body(&lines[i])[k.value.clone()]
}

/// The line with its value replaced by `value` (after `key: `, comment kept).
fn with_value(line: &str, k: &KeyLine, value: &str) -> String {
    let body = body(line);
    let ending = &line[body.len()..];
    let tail = &body[k.value.end..];
    let gap = if tail.is_empty() || tail.starts_with(' ') {
        ""
    } else {
        " "
    };
    format!("{} {value}{gap}{tail}{ending}", &body[..=k.colon])
}

/// 1-based column of the value [`with_value`] puts on the line.
fn value_column(line: &str, k: &KeyLine) -> usize {
    line[..=k.colon].chars().count() + 2
}

/// A header (`key:` with nothing after it) with a more indented block under it.
fn has_children(lines: &[String], i: usize, k: &KeyLine) -> bool {
    k.value.is_empty()
        && lines[i + 1..]
            .iter()
            .find(|l| is_code(l))
            .is_some_and(|l| indent(l) > k.key)
}

fn looks_numeric(value: &str) -> bool {
    value.bytes().any(|b| b.is_ascii_digit())
        && value
            .bytes()
            .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'-' | b'+' | b'e'))
}

/// Byte ranges of the `${…}` references outside comments.
fn variable_references(line: &str) -> Vec<Range<usize>> {
    let code = &line[..comment_start(line)];
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(p) = code[from..].find("${") {
        let start = from + p;
        match code[start..].find('}') {
            Some(len) if !code[..start].ends_with('$') => {
                out.push(start..start + len + 1);
                from = start + len + 1;
            }
            _ => from = start + 2,
        }
    }
    out
}

/// What loading a config gave.
#[derive(Debug)]
enum Loaded {
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
fn load_bounded(path: &Path) -> Result<Loaded, String> {
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
fn describe(m: &Mutant, base: u64, problem: &str) -> String {
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
