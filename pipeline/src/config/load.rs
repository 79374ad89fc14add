//! Loading a YAML pipeline description so that *every* problem is reported at once, each with
//! `file:line:column`.
//!
//! serde stops at the first error of a value, so the document is deserialized in several
//! passes over the same (tiny) text with `serde-saphyr`: one for the top-level keys, one per
//! section, and one per element of list sections. Each component (`source`, each stage,
//! `sink`) is read in two steps: its `type` first, then the matching typed struct, fed from a
//! view of the same YAML mapping without the `type` key. Because the typed struct is read
//! straight from the YAML deserializer (not from a buffered copy, as serde's internally-tagged
//! enums do), unknown keys, wrong types and missing fields keep their exact positions.

use std::fmt;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};

use serde::de::{
    self, DeserializeOwned, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess,
    Visitor,
};
use serde_saphyr::Spanned;

use super::interpolate::interpolate;
use super::{ConfigError, ConfigErrors};
use crate::error::{Error, Result};

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
    origin: String,
    base_dir: PathBuf,
}

impl ConfigDocument {
    /// Reads and interpolates a config file. Relative paths inside it resolve against the
    /// file's directory.
    pub fn from_path(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| Error::ConfigFile {
            path: path.display().to_string(),
            source,
        })?;
        let base_dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        Self::from_str(&text, &path.display().to_string(), base_dir)
    }

    /// Interpolates `text` (named `origin` in messages); relative paths resolve against
    /// `base_dir`.
    pub fn from_str(text: &str, origin: &str, base_dir: impl Into<PathBuf>) -> Result<Self> {
        let env = |name: &str| std::env::var(name).ok();
        let text = interpolate(text, origin, &env).map_err(ConfigErrors)?;
        let doc = ConfigDocument {
            text,
            origin: origin.to_string(),
            base_dir: base_dir.into(),
        };
        // A document that is not valid YAML (a syntax error, a key given twice) fails every
        // section's pass in the same place: say it once, before reading any section.
        if let Err(e) = serde_saphyr::from_str::<IgnoredAny>(&doc.text) {
            return Err(ConfigErrors(vec![doc.error("", &e)]).into());
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

    fn error(&self, context: &str, e: &serde_saphyr::Error) -> ConfigError {
        let (line, column) = e
            .location()
            .map(|l| (l.line() as usize, l.column() as usize))
            .unwrap_or((1, 1));
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
        let Some(text) = self.text.lines().nth(line.saturating_sub(1)) else {
            return message;
        };
        let chars: Vec<char> = text.chars().collect();
        let at = column.saturating_sub(1).min(chars.len());
        let value: String = chars[at..]
            .iter()
            .take_while(|c| !matches!(c, ',' | '}' | ']' | '#'))
            .collect();
        let before: String = chars[..at].iter().collect();
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
        serde_saphyr::with_deserializer_from_str(&self.text, |d| {
            TopSeed { key, reader }.deserialize(d)
        })
    }

    /// Checks that the document is a mapping whose keys are all in `allowed`. Returns the
    /// keys present; problems are appended to `errors`.
    pub fn sections(&self, allowed: &[&str], errors: &mut Vec<ConfigError>) -> Vec<String> {
        match serde_saphyr::with_deserializer_from_str(&self.text, |d| {
            d.deserialize_map(KeysVisitor)
        }) {
            Ok(keys) => {
                let mut present = Vec::new();
                for k in keys {
                    if allowed.contains(&k.value.as_str()) {
                        present.push(k.value);
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
                errors.push(self.error("", &e));
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
        let mut out = Vec::new();
        for (index, mut kind) in kinds.into_iter().enumerate() {
            let context = format!("{key}[{index}]");
            let keys = std::mem::take(&mut kind.keys);
            let Some((kind, location)) = self.check_kind::<T>(&context, kind, errors) else {
                continue;
            };
            let skip = self.unknown_keys::<T>(&context, &kind, &keys, errors);
            let reader = NthReader {
                index,
                inner: ComponentReader::<T>::new(&kind, &skip),
            };
            match self.run(key, reader) {
                Ok(Some(Some(value))) => out.push(Located { value, location }),
                Ok(_) => {}
                Err(e) => errors.push(self.error(&format!("{context} ({kind})"), &e)),
            }
        }
        out
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
    ) -> Vec<String> {
        let Some(fields) = component_fields::<T>(kind) else {
            return Vec::new();
        };
        let mut unknown = Vec::new();
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
                unknown.push(k.value.clone());
            }
        }
        unknown
    }
}

/// Reads one value from a deserializer.
trait ValueReader {
    type Out;
    fn read<'de, D: Deserializer<'de>>(self, d: D) -> Result<Self::Out, D::Error>;
}

struct Seed<R>(R);

impl<'de, R: ValueReader> DeserializeSeed<'de> for Seed<R> {
    type Value = R::Out;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<R::Out, D::Error> {
        self.0.read(d)
    }
}

/// Visits the top-level mapping, handing the value of `key` to `reader` and skipping the rest.
struct TopSeed<'k, R> {
    key: &'k str,
    reader: R,
}

impl<'de, R: ValueReader> DeserializeSeed<'de> for TopSeed<'_, R> {
    type Value = Option<R::Out>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, R: ValueReader> Visitor<'de> for TopSeed<'_, R> {
    type Value = Option<R::Out>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a pipeline mapping (source:, stages:, sink:, …)")
    }
    fn visit_map<M: MapAccess<'de>>(self, mut m: M) -> Result<Self::Value, M::Error> {
        let mut reader = Some(self.reader);
        let mut out = None;
        while let Some(k) = m.next_key::<String>()? {
            match (k == self.key, reader.take()) {
                (true, Some(r)) => out = Some(m.next_value_seed(Seed(r))?),
                (_, r) => {
                    reader = r;
                    m.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(out)
    }
}

struct KeysVisitor;

impl<'de> Visitor<'de> for KeysVisitor {
    type Value = Vec<Spanned<String>>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a pipeline mapping (source:, stages:, sink:, …)")
    }
    fn visit_map<M: MapAccess<'de>>(self, mut m: M) -> Result<Self::Value, M::Error> {
        let mut keys = Vec::new();
        while let Some(k) = m.next_key::<Spanned<String>>()? {
            m.next_value::<IgnoredAny>()?;
            keys.push(k);
        }
        Ok(keys)
    }
}

struct TypedReader<T>(PhantomData<T>);

impl<T: DeserializeOwned> ValueReader for TypedReader<T> {
    type Out = T;
    fn read<'de, D: Deserializer<'de>>(self, d: D) -> Result<T, D::Error> {
        T::deserialize(d)
    }
}

/// The `type` of a component and where the component starts.
struct KindInfo {
    kind: Option<Spanned<String>>,
    keys: Vec<Spanned<String>>,
    at: serde_saphyr::Location,
}

#[derive(Clone, Copy)]
struct KindReader;

impl ValueReader for KindReader {
    type Out = KindInfo;
    fn read<'de, D: Deserializer<'de>>(self, d: D) -> Result<KindInfo, D::Error> {
        let s: Spanned<KindOnly> = Spanned::deserialize(d)?;
        Ok(KindInfo {
            kind: s.value.kind,
            keys: s.value.keys,
            at: s.referenced,
        })
    }
}

use serde::Deserialize;

struct KindOnly {
    kind: Option<Spanned<String>>,
    keys: Vec<Spanned<String>>,
}

/// `type: null` is YAML's null, but means the `null` sink.
fn kind_name(v: Spanned<Option<String>>) -> Spanned<String> {
    Spanned::new(
        v.value.unwrap_or_else(|| "null".to_string()),
        v.referenced,
        v.defined,
    )
}

impl<'de> Deserialize<'de> for KindOnly {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = KindOnly;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a mapping with a `type:` key")
            }
            fn visit_map<M: MapAccess<'de>>(self, mut m: M) -> Result<KindOnly, M::Error> {
                let mut kind = None;
                let mut keys = Vec::new();
                while let Some(k) = m.next_key::<Spanned<String>>()? {
                    if k.value == "type" {
                        kind = Some(kind_name(m.next_value::<Spanned<Option<String>>>()?));
                    } else {
                        m.next_value::<IgnoredAny>()?;
                        keys.push(k);
                    }
                }
                Ok(KindOnly { kind, keys })
            }
        }
        d.deserialize_map(V)
    }
}

struct ComponentReader<'k, T> {
    kind: &'k str,
    /// Keys already reported as unknown: hidden from the typed pass so it can report the next
    /// problem.
    skip: &'k [String],
    _t: PhantomData<T>,
}

impl<'k, T> ComponentReader<'k, T> {
    fn new(kind: &'k str, skip: &'k [String]) -> Self {
        ComponentReader {
            kind,
            skip,
            _t: PhantomData,
        }
    }
}

impl<T: Component> ValueReader for ComponentReader<'_, T> {
    type Out = T;
    fn read<'de, D: Deserializer<'de>>(self, d: D) -> Result<T, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, T: Component> Visitor<'de> for ComponentReader<'_, T> {
    type Value = T;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a {} mapping", T::WHAT)
    }
    fn visit_map<M: MapAccess<'de>>(self, m: M) -> Result<T, M::Error> {
        T::deserialize_kind(
            self.kind,
            de::value::MapAccessDeserializer::new(WithoutKey {
                inner: m,
                skip: self.skip,
            }),
        )
    }
}

/// A view of a mapping without `type` and the given keys.
struct WithoutKey<'k, M> {
    inner: M,
    skip: &'k [String],
}

impl<'de, M: MapAccess<'de>> MapAccess<'de> for WithoutKey<'_, M> {
    type Error = M::Error;
    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, M::Error> {
        loop {
            match self.inner.next_key::<String>()? {
                None => return Ok(None),
                Some(k) if k == "type" || self.skip.contains(&k) => {
                    self.inner.next_value::<IgnoredAny>()?;
                }
                Some(k) => {
                    return seed
                        .deserialize(de::value::StringDeserializer::<M::Error>::new(k))
                        .map(Some);
                }
            }
        }
    }
    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, M::Error> {
        self.inner.next_value_seed(seed)
    }
}

/// Applies a reader to every element of a sequence.
struct ListReader<R>(R);

impl<R: ValueReader + Copy> ValueReader for ListReader<R> {
    type Out = Vec<R::Out>;
    fn read<'de, D: Deserializer<'de>>(self, d: D) -> Result<Self::Out, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de, R: ValueReader + Copy> Visitor<'de> for ListReader<R> {
    type Value = Vec<R::Out>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list")
    }
    fn visit_seq<S: SeqAccess<'de>>(self, mut s: S) -> Result<Self::Value, S::Error> {
        let mut out = Vec::new();
        while let Some(v) = s.next_element_seed(Seed(self.0))? {
            out.push(v);
        }
        Ok(out)
    }
}

/// Applies a reader to element `index` of a sequence, skipping the others.
struct NthReader<R> {
    index: usize,
    inner: R,
}

impl<R: ValueReader> ValueReader for NthReader<R> {
    type Out = Option<R::Out>;
    fn read<'de, D: Deserializer<'de>>(self, d: D) -> Result<Self::Out, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de, R: ValueReader> Visitor<'de> for NthReader<R> {
    type Value = Option<R::Out>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list")
    }
    fn visit_seq<S: SeqAccess<'de>>(self, mut s: S) -> Result<Self::Value, S::Error> {
        let mut inner = Some(self.inner);
        let mut out = None;
        let mut i = 0;
        loop {
            if i == self.index
                && let Some(r) = inner.take()
            {
                match s.next_element_seed(Seed(r))? {
                    Some(v) => out = Some(v),
                    None => break,
                }
            } else if s.next_element::<IgnoredAny>()?.is_none() {
                break;
            }
            i += 1;
        }
        Ok(out)
    }
}

/// The field names of the struct behind component `kind` (`None` for an unknown kind), found
/// by letting serde's derived code announce them to a deserializer that only listens.
pub fn component_fields<T: Component>(kind: &str) -> Option<&'static [&'static str]> {
    let mut fields = None;
    let _ = T::deserialize_kind(kind, FieldsProbe(&mut fields));
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
