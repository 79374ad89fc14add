//! The mutations of the seeded config-mutation test (`config_mutants.rs`): deleted, duplicated
//! and re-indented lines, duplicated and unknown keys, swapped types, huge and negative
//! numbers, control bytes, invalid UTF-8, deep nesting, an alias bomb, unset and malformed
//! variables, CR and CRLF line endings, several documents, truncation. Each is applied to a
//! config's text as it stands, and says what a mutant made by it alone must do: some can only
//! be refused (a key given twice, a variable that is not set, nesting past any sane depth, a
//! mapping replaced by a scalar), a duplicated key on the line of its second occurrence and an
//! unset variable at the line and column of its `$`.
#![allow(clippy::unwrap_used)]
// `*rng.pick(..)` of a list of references: clippy calls the `*` an auto-deref, but without it
// the element type is inferred as unsized and the test does not compile.
#![allow(clippy::explicit_auto_deref)]

use crate::common::Rng;
use crate::config_mutants::{Expect, Kind};

use std::ops::Range;

/// Applies one mutation, or `None` where it has nothing to work on.
pub(crate) fn apply(kind: Kind, rng: &mut Rng, bytes: &[u8]) -> Option<(Vec<u8>, Expect)> {
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
