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
        Ok(ConfigDocument {
            text,
            origin: origin.to_string(),
            base_dir: base_dir.into(),
        })
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
        let message = if context.is_empty() {
            message
        } else {
            format!("{context}: {message}")
        };
        ConfigError::new(&self.origin, line, column, message)
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
        let kind = match self.run(key, KindReader) {
            Ok(Some(k)) => k,
            Ok(None) => return None,
            Err(e) => {
                errors.push(self.error(key, &e));
                return None;
            }
        };
        let (kind, location) = self.check_kind::<T>(key, kind, errors)?;
        match self.run(key, ComponentReader::<T>::new(&kind)) {
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
        for (index, kind) in kinds.into_iter().enumerate() {
            let context = format!("{key}[{index}]");
            let Some((kind, location)) = self.check_kind::<T>(&context, kind, errors) else {
                continue;
            };
            let reader = NthReader {
                index,
                inner: ComponentReader::<T>::new(&kind),
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
    at: serde_saphyr::Location,
}

struct KindReader;

impl ValueReader for KindReader {
    type Out = KindInfo;
    fn read<'de, D: Deserializer<'de>>(self, d: D) -> Result<KindInfo, D::Error> {
        let s: Spanned<KindOnly> = Spanned::deserialize(d)?;
        Ok(KindInfo {
            kind: s.value.0,
            at: s.referenced,
        })
    }
}

use serde::Deserialize;

struct KindOnly(Option<Spanned<String>>);

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
                while let Some(k) = m.next_key::<String>()? {
                    if k == "type" {
                        kind = Some(m.next_value::<Spanned<String>>()?);
                    } else {
                        m.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(KindOnly(kind))
            }
        }
        d.deserialize_map(V)
    }
}

struct ComponentReader<'k, T> {
    kind: &'k str,
    _t: PhantomData<T>,
}

impl<'k, T> ComponentReader<'k, T> {
    fn new(kind: &'k str) -> Self {
        ComponentReader {
            kind,
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
                skip: "type",
            }),
        )
    }
}

/// A view of a mapping without one key.
struct WithoutKey<M> {
    inner: M,
    skip: &'static str,
}

impl<'de, M: MapAccess<'de>> MapAccess<'de> for WithoutKey<M> {
    type Error = M::Error;
    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, M::Error> {
        loop {
            match self.inner.next_key::<String>()? {
                None => return Ok(None),
                Some(k) if k == self.skip => {
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

impl Clone for KindReader {
    fn clone(&self) -> Self {
        KindReader
    }
}
impl Copy for KindReader {}

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
