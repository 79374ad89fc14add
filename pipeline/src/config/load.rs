//! Loading a YAML pipeline description so that *every* problem is reported at once, each with
//! `file:line:column`.
//!
//! serde stops at the first error of a value, so the document is deserialized in several
//! passes over the same text with `serde-saphyr`: one for the top-level keys and one or two
//! per section. Each component (`source`, each stage,
//! `sink`) is read in two steps: its `type` first, then the matching typed struct, fed from a
//! view of the same YAML mapping without the `type` key. Because the typed struct is read
//! straight from the YAML deserializer (not from a buffered copy, as serde's internally-tagged
//! enums do), unknown keys, wrong types and missing fields keep their exact positions.
//!
//! A pass reads the section's own lines where nothing refers across sections (else the whole
//! document), so the work must not grow faster than the document: a list section is read in
//! one typed pass over all its elements, and only an element that fails costs another pass
//! (from the element after it), at most [`MAX_LIST_RESTARTS`] times per list. (Reading each
//! element by a pass of its own made 5,000 stages take minutes.)

use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};

use serde::de::{self, DeserializeOwned, DeserializeSeed, Deserializer, IgnoredAny, Visitor};
use serde_saphyr::Spanned;

use self::readers::{
    ComponentReader, ElementPlan, ElementsReader, KeysVisitor, KindInfo, KindReader, ListReader,
    TopSeed, TypedReader, ValueReader,
};
use super::interpolate::{decode, interpolate, normalize_line_breaks};
use super::{ConfigError, ConfigErrors};
use crate::error::{Error, Result};

mod readers;

/// A component configuration selected by a `type:` key (a source, a stage, a sink).
pub trait Component: Sized {
    /// What the component is called in messages: `source`, `stage`, `sink`.
    const WHAT: &'static str;
    /// Accepted values of `type:`.
    const KINDS: &'static [&'static str];
    /// Deserializes the variant named `kind` from a mapping that no longer holds `type`.
    fn deserialize_kind<'de, D: Deserializer<'de>>(kind: &str, d: D) -> Result<Self, D::Error>;
}

/// A value with the place it was declared.
#[derive(Debug, Clone, PartialEq)]
pub struct Located<T> {
    /// The value.
    pub value: T,
    /// `file:line:column` of the value.
    pub location: String,
}

/// A YAML config document after `${VAR}` interpolation, ready to be read section by section.
#[derive(Debug, Clone)]
pub struct ConfigDocument {
    text: String,
    /// Byte offset where each line of `text` starts.
    line_starts: Vec<usize>,
    /// The top-level keys with their positions, or why the document is not a mapping.
    keys: Result<Vec<Spanned<String>>, ConfigError>,
    /// Where each top-level entry's text is, when it can be read on its own (see
    /// [`section_spans`]): then a section is parsed from its own lines, not the whole text.
    spans: Option<Vec<SectionSpan>>,
    origin: String,
    base_dir: PathBuf,
}

/// The lines of one top-level entry (`stages:` and everything up to the next top-level key).
#[derive(Debug, Clone)]
struct SectionSpan {
    key: String,
    /// Byte range in the text.
    start: usize,
    end: usize,
    /// 1-based line of the key.
    line: usize,
}

impl SectionSpan {
    /// The entry alone, after as many empty lines as came before it: positions in it are
    /// positions in the whole document.
    fn text(&self, whole: &str) -> String {
        let mut out = "\n".repeat(self.line.saturating_sub(1));
        out.push_str(whole.get(self.start..self.end).unwrap_or(""));
        out
    }
}

/// Failed elements of one list after which the rest of the list is not read (each costs
/// another pass over the list): a list that bad is fixed from its first problems.
pub const MAX_LIST_RESTARTS: usize = 50;

impl ConfigDocument {
    /// Reads and interpolates a config file. Relative paths inside it resolve against the
    /// file's directory. A file that is not UTF-8 is refused naming the byte offset, line and
    /// column of the first byte that is not.
    pub fn from_path(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let origin = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|source| Error::ConfigFile {
            path: origin.clone(),
            source,
        })?;
        let text = decode(bytes, &origin).map_err(|e| ConfigErrors(vec![e]))?;
        let base_dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        Self::from_str(&text, &origin, base_dir)
    }

    /// Interpolates `text` (named `origin` in messages); relative paths resolve against
    /// `base_dir`. Line breaks may be `\n`, `\r\n` or `\r`: all read the same.
    pub fn from_str(text: &str, origin: &str, base_dir: impl Into<PathBuf>) -> Result<Self> {
        let env = |name: &str| std::env::var(name).ok();
        // A leading byte-order mark is no part of the document (and would shift columns).
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let text = normalize_line_breaks(text);
        let text = interpolate(&text, origin, &env).map_err(ConfigErrors)?;
        let line_starts = std::iter::once(0)
            .chain(text.match_indices('\n').map(|(i, _)| i + 1))
            .collect();
        let mut doc = ConfigDocument {
            text,
            line_starts,
            keys: Ok(Vec::new()),
            spans: None,
            origin: origin.to_string(),
            base_dir: base_dir.into(),
        };
        match serde_saphyr::with_deserializer_from_str(&doc.text, |d| {
            d.deserialize_map(KeysVisitor)
        }) {
            Ok(keys) => {
                doc.spans = section_spans(&doc.text, &doc.line_starts, &keys);
                doc.keys = Ok(keys);
            }
            Err(e) => {
                // A document that is not valid YAML (a syntax error, a key given twice)
                // fails every section's pass in the same place: say it once, before reading
                // any section. Valid YAML that is not a mapping is said by `sections`.
                if let Err(e) = serde_saphyr::from_str::<IgnoredAny>(&doc.text) {
                    return Err(ConfigErrors(vec![doc.error("", &e)]).into());
                }
                let mut not_sections = doc.error("", &e);
                if not_sections.message == "expected mapping start" {
                    not_sections.message = "a pipeline file is a mapping of sections (`source:`, `stages:`, `sink:`, …); this document is not one".to_string();
                }
                doc.keys = Err(not_sections);
            }
        }
        Ok(doc)
    }

    /// Name of the document in messages (its path).
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// Directory relative paths in the document resolve against.
    pub fn base_dir(&self) -> &Path {
        &self.base_dir
    }

    /// The interpolated text, as the YAML parser reads it.
    pub(crate) fn text(&self) -> &str {
        &self.text
    }

    /// Line `line` (1-based) of the text, without its line break.
    fn line_text(&self, line: usize) -> Option<&str> {
        let start = *self.line_starts.get(line.checked_sub(1)?)?;
        let end = self
            .line_starts
            .get(line)
            .map_or(self.text.len(), |next| next - 1);
        self.text.get(start..end)
    }

    /// A problem at `at` (a value's or key's position in this document).
    pub(crate) fn error_at(&self, at: &serde_saphyr::Location, message: String) -> ConfigError {
        ConfigError::new(
            &self.origin,
            (at.line() as usize).max(1),
            (at.column() as usize).max(1),
            message,
        )
    }

    fn error(&self, context: &str, e: &serde_saphyr::Error) -> ConfigError {
        let (line, column) = e
            .location()
            .map(|l| ((l.line() as usize).max(1), (l.column() as usize).max(1)))
            .unwrap_or((1, 1));
        if let Some(message) = document_message(e.without_snippet()) {
            return ConfigError::new(&self.origin, line, column, message);
        }
        let raw = e.without_snippet().to_string();
        let message = match raw.rsplit_once(" at line ") {
            Some((m, _)) => m.to_string(),
            None => raw,
        };
        // serde-saphyr's advice about its own options means nothing to the config's author.
        let message = match message
            .strip_suffix(", set DuplicateKeyPolicy in Options if acceptable")
            .map(|m| m.strip_prefix("duplicate mapping key").unwrap_or(m))
        {
            Some(key) => match key.strip_prefix(": ") {
                Some(k) => format!("`{k}` is given twice in the same mapping: keep one"),
                None => "a key is given twice in the same mapping: keep one".to_string(),
            },
            None => self.explain(line, column, message),
        };
        let message = if context.is_empty() {
            message
        } else {
            format!("{context}: {message}")
        };
        ConfigError::new(&self.origin, line, column, message)
    }

    /// Turns terse scalar errors ("invalid u64") into "`size`: expected a non-negative
    /// integer, found `many`" using the text at the error's position.
    fn explain(&self, line: usize, column: usize, message: String) -> String {
        let expected = match message.as_str() {
            "invalid u64" | "invalid u32" | "invalid u16" | "invalid u8" | "invalid usize" => {
                "a non-negative integer"
            }
            "invalid i64" | "invalid i32" | "invalid i16" | "invalid i8" | "invalid isize" => {
                "an integer"
            }
            "invalid f64" | "invalid f32" => "a number",
            "invalid boolean" => "true or false",
            _ => return message,
        };
        let Some(text) = self.line_text(line) else {
            return message;
        };
        let at = text
            .char_indices()
            .nth(column.saturating_sub(1))
            .map_or(text.len(), |(i, _)| i);
        let (before, rest) = text.split_at(at);
        let value = rest
            .find([',', '}', ']', '#'])
            .map_or(rest, |end| &rest[..end]);
        let key = before
            .trim_end()
            .strip_suffix(':')
            .map(|k| {
                k.rsplit(|c: char| c == '{' || c == ',' || c == '-' || c.is_whitespace())
                    .next()
                    .unwrap_or("")
                    .trim_matches(|c| c == '"' || c == '\'')
                    .to_string()
            })
            .filter(|k| !k.is_empty());
        match key {
            Some(k) => format!("`{k}`: expected {expected}, found `{}`", value.trim()),
            None => format!("expected {expected}, found `{}`", value.trim()),
        }
    }

    fn loc(&self, l: &serde_saphyr::Location) -> String {
        format!("{}:{}:{}", self.origin, l.line(), l.column())
    }

    fn run<R: ValueReader>(
        &self,
        key: &str,
        reader: R,
    ) -> Result<Option<R::Out>, serde_saphyr::Error> {
        // Read from the section's own lines where it has them: each pass then costs the
        // section's size, not the document's, and an absent section costs nothing. A
        // document that is not a mapping has no sections (`sections` says so, once).
        if self.keys.is_err() {
            return Ok(None);
        }
        let part: String;
        let text = match &self.spans {
            Some(spans) => match spans.iter().find(|s| s.key == key) {
                Some(span) => {
                    part = span.text(&self.text);
                    part.as_str()
                }
                None => return Ok(None),
            },
            None => self.text.as_str(),
        };
        serde_saphyr::with_deserializer_from_str(text, |d| TopSeed { key, reader }.deserialize(d))
    }

    /// Checks that the document is a mapping whose keys are all in `allowed`. Returns the
    /// keys present; problems are appended to `errors`.
    pub fn sections(&self, allowed: &[&str], errors: &mut Vec<ConfigError>) -> Vec<String> {
        match &self.keys {
            Ok(keys) => {
                let mut present = Vec::new();
                for k in keys {
                    if allowed.contains(&k.value.as_str()) {
                        present.push(k.value.clone());
                    } else {
                        errors.push(ConfigError::new(
                            &self.origin,
                            k.referenced.line() as usize,
                            k.referenced.column() as usize,
                            format!(
                                "unknown top-level key `{}`, expected one of: {}",
                                k.value,
                                allowed.join(", ")
                            ),
                        ));
                    }
                }
                present
            }
            Err(e) => {
                errors.push(e.clone());
                Vec::new()
            }
        }
    }

    /// Reads the plain (untagged) section `key`, or `None` when absent or invalid.
    pub fn value<T: DeserializeOwned>(
        &self,
        key: &str,
        errors: &mut Vec<ConfigError>,
    ) -> Option<T> {
        match self.run(key, TypedReader::<T>(PhantomData)) {
            Ok(v) => v,
            Err(e) => {
                errors.push(self.error(key, &e));
                None
            }
        }
    }

    /// Reads the component section `key` (a mapping with `type:`), or `None` when absent or
    /// invalid.
    pub fn component<T: Component>(
        &self,
        key: &str,
        errors: &mut Vec<ConfigError>,
    ) -> Option<Located<T>> {
        let mut kind = match self.run(key, KindReader) {
            Ok(Some(k)) => k,
            Ok(None) => return None,
            Err(e) => {
                errors.push(self.error(key, &e));
                return None;
            }
        };
        let keys = std::mem::take(&mut kind.keys);
        let (kind, location) = self.check_kind::<T>(key, kind, errors)?;
        let skip = self.unknown_keys::<T>(key, &kind, &keys, errors);
        match self.run(key, ComponentReader::<T>::new(&kind, &skip)) {
            Ok(Some(value)) => Some(Located { value, location }),
            Ok(None) => None,
            Err(e) => {
                errors.push(self.error(&format!("{key} ({kind})"), &e));
                None
            }
        }
    }

    /// Reads the list section `key` whose elements are components. Invalid elements are
    /// reported and skipped, so every element is checked.
    ///
    /// Two passes over the document whatever the list's length: the elements' `type`s and
    /// keys, then every element typed. An element whose typed read fails ends that pass (a
    /// streaming parser cannot resume inside a broken value); the next pass starts past it.
    pub fn component_list<T: Component>(
        &self,
        key: &str,
        errors: &mut Vec<ConfigError>,
    ) -> Vec<Located<T>> {
        let kinds = match self.run(key, ListReader(KindReader)) {
            Ok(Some(k)) => k,
            Ok(None) => return Vec::new(),
            Err(e) => {
                errors.push(self.error(key, &e));
                return Vec::new();
            }
        };
        let mut plans = Vec::with_capacity(kinds.len());
        for (index, mut kind) in kinds.into_iter().enumerate() {
            let context = format!("{key}[{index}]");
            let keys = std::mem::take(&mut kind.keys);
            let at = kind.at;
            plans.push(
                self.check_kind::<T>(&context, kind, errors)
                    .map(|(kind, location)| {
                        let skip = self.unknown_keys::<T>(&context, &kind, &keys, errors);
                        ElementPlan {
                            kind,
                            at,
                            location,
                            skip,
                        }
                    }),
            );
        }
        self.read_elements(key, &plans, errors)
    }

    /// The typed passes of [`Self::component_list`]: from element `start` on, restarting past
    /// each element that fails.
    fn read_elements<T: Component>(
        &self,
        key: &str,
        plans: &[Option<ElementPlan>],
        errors: &mut Vec<ConfigError>,
    ) -> Vec<Located<T>> {
        let mut out = Vec::new();
        let mut start = 0;
        let mut restarts = 0;
        while start < plans.len() {
            let at = Cell::new(start);
            let read = RefCell::new(Vec::new());
            let result = self.run(
                key,
                ElementsReader::<T> {
                    start,
                    plans,
                    at: &at,
                    read: &read,
                    _t: PhantomData,
                },
            );
            for (index, value) in read.into_inner() {
                if let Some(Some(plan)) = plans.get(index) {
                    out.push(Located {
                        value,
                        location: plan.location.clone(),
                    });
                }
            }
            let Err(e) = result else { break };
            let failed = at.get();
            let kind = plans
                .get(failed)
                .and_then(Option::as_ref)
                .map_or("?", |p| p.kind.as_str());
            errors.push(self.error(&format!("{key}[{failed}] ({kind})"), &e));
            start = (failed + 1).max(start + 1);
            restarts += 1;
            if restarts >= MAX_LIST_RESTARTS {
                if let Some((next, plan)) = plans
                    .iter()
                    .enumerate()
                    .skip(start)
                    .find_map(|(i, p)| p.as_ref().map(|p| (i, p)))
                {
                    errors.push(self.unchecked(key, next, plan));
                }
                break;
            }
        }
        out
    }

    fn unchecked(&self, key: &str, next: usize, plan: &ElementPlan) -> ConfigError {
        self.error_at(
            &plan.at,
            format!(
                "{key}[{next}] and the entries after it were not checked: {MAX_LIST_RESTARTS} entries of `{key}` before it have problems; fix those and check again"
            ),
        )
    }

    fn check_kind<T: Component>(
        &self,
        context: &str,
        kind: KindInfo,
        errors: &mut Vec<ConfigError>,
    ) -> Option<(String, String)> {
        let location = self.loc(&kind.at);
        match kind.kind {
            None => {
                errors.push(ConfigError::new(
                    &self.origin,
                    kind.at.line() as usize,
                    kind.at.column() as usize,
                    format!(
                        "{context}: missing field `type`; a {} needs `type:` set to one of: {}",
                        T::WHAT,
                        T::KINDS.join(", ")
                    ),
                ));
                None
            }
            Some(k) if !T::KINDS.contains(&k.value.as_str()) => {
                errors.push(ConfigError::new(
                    &self.origin,
                    k.referenced.line() as usize,
                    k.referenced.column() as usize,
                    format!(
                        "{context}: unknown {} type `{}`, expected one of: {}",
                        T::WHAT,
                        k.value,
                        T::KINDS.join(", ")
                    ),
                ));
                None
            }
            Some(k) => Some((k.value, location)),
        }
    }

    /// Reports keys the component's struct does not have (all of them, with positions) and
    /// returns them so the typed pass skips them.
    fn unknown_keys<T: Component>(
        &self,
        context: &str,
        kind: &str,
        keys: &[Spanned<String>],
        errors: &mut Vec<ConfigError>,
    ) -> HashSet<String> {
        let Some(fields) = component_fields::<T>(kind) else {
            return HashSet::new();
        };
        let mut unknown = HashSet::new();
        for k in keys {
            if !fields.contains(&k.value.as_str()) {
                errors.push(ConfigError::new(
                    &self.origin,
                    k.referenced.line() as usize,
                    k.referenced.column() as usize,
                    format!(
                        "{context} ({kind}): unknown field `{}`, expected one of {}",
                        k.value,
                        fields.join(", ")
                    ),
                ));
                unknown.insert(k.value.clone());
            }
        }
        unknown
    }
}

/// Where each top-level entry's lines are, when each can be parsed on its own exactly as in
/// the whole document: every top-level key starts a line of its own (a block mapping), and
/// nothing refers across entries — no anchors or aliases (`&a`, `*a`), tags (`!t`) or
/// directives (`%YAML`), which are looked for conservatively (a false alarm only costs
/// speed). `None`: read every section from the whole text.
fn section_spans(
    text: &str,
    line_starts: &[usize],
    keys: &[Spanned<String>],
) -> Option<Vec<SectionSpan>> {
    if may_refer_across(text) {
        return None;
    }
    let mut spans = Vec::with_capacity(keys.len());
    for (i, k) in keys.iter().enumerate() {
        let line = k.referenced.line() as usize;
        if k.referenced.column() != 1 || line == 0 {
            return None;
        }
        let end = match keys.get(i + 1) {
            Some(next) => {
                let next_line = next.referenced.line() as usize;
                if next_line <= line {
                    return None;
                }
                *line_starts.get(next_line - 1)?
            }
            None => text.len(),
        };
        spans.push(SectionSpan {
            key: k.value.clone(),
            start: *line_starts.get(line - 1)?,
            end,
            line,
        });
    }
    Some(spans)
}

/// Whether the text may hold an anchor, alias or tag (`&`, `*` or `!` where a YAML node can
/// start: after `:`, `-`, `?`, `[`, `{`, `,` or at the start of a line) or a directive.
fn may_refer_across(text: &str) -> bool {
    text.lines().any(|line| {
        line.starts_with('%')
            || line.char_indices().any(|(i, c)| {
                matches!(c, '&' | '*' | '!') && {
                    let before = line[..i].trim_end_matches([' ', '\t']);
                    before.is_empty() || before.ends_with([':', '-', '?', '[', '{', ','])
                }
            })
    })
}

/// What a problem of the document as a whole means to its author, in place of the parser's
/// wording (which names its own API and options): several documents in one file, or a
/// document beyond the parser's resource budget.
fn document_message(e: &serde_saphyr::Error) -> Option<String> {
    use serde_saphyr::budget::BudgetBreach;
    match e {
        serde_saphyr::Error::MultipleDocuments { .. } => Some(
            "this file holds several YAML documents (`---`); a pipeline file holds one: keep one, or put each in a file of its own"
                .to_string(),
        ),
        serde_saphyr::Error::Budget { breach, .. } => {
            let what = match breach {
                BudgetBreach::Depth { .. } => "it is nested more than 64 levels deep".to_string(),
                BudgetBreach::Nodes { nodes } => format!("it holds more than {nodes} values"),
                BudgetBreach::Events { events } => format!("it holds more than {events} items"),
                BudgetBreach::ScalarBytes { .. } => {
                    "its values hold more than 64 MiB of text".to_string()
                }
                BudgetBreach::Aliases { .. }
                | BudgetBreach::AliasAnchorRatio { .. }
                | BudgetBreach::Anchors { .. } => {
                    "it uses too many aliases (`*name`) or anchors (`&name`)".to_string()
                }
                BudgetBreach::Documents { .. } => "it holds too many YAML documents".to_string(),
                _ => "it is too large or too deeply nested".to_string(),
            };
            Some(format!(
                "this document cannot be read as a pipeline file: {what}; a pipeline file is a few screens of YAML"
            ))
        }
        _ => None,
    }
}

/// The field names of the struct behind component `kind` (`None` for an unknown kind), found
/// by letting serde's derived code announce them to a deserializer that only listens.
pub fn component_fields<T: Component>(kind: &str) -> Option<&'static [&'static str]> {
    let mut fields = None;
    let _ = T::deserialize_kind(kind, FieldsProbe(&mut fields));
    fields
}

/// The field names of a config struct (`runtime:`, `loader:`, `trainer:` …), found the same
/// way: for checking from the code that the reference documents every key.
pub fn struct_fields<T: DeserializeOwned>() -> Option<&'static [&'static str]> {
    let mut fields = None;
    let _ = T::deserialize(FieldsProbe(&mut fields));
    fields
}

struct FieldsProbe<'a>(&'a mut Option<&'static [&'static str]>);

impl<'de> Deserializer<'de> for FieldsProbe<'_> {
    type Error = de::value::Error;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
        Err(de::Error::custom("probe"))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, Self::Error> {
        *self.0 = Some(fields);
        Err(de::Error::custom("probe"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
        ignored_any
    }
}
