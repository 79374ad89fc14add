//! The serde plumbing of [`super::ConfigDocument`]: seeds and visitors that pick one section
//! out of the document, read a component's `type` and keys, and read a component's typed
//! struct from a view of its mapping without `type` (and without keys already reported).

use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::fmt;
use std::marker::PhantomData;

use serde::Deserialize;
use serde::de::{
    self, DeserializeOwned, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess,
    Visitor,
};
use serde_saphyr::Spanned;

use super::Component;

/// Reads one value from a deserializer.
pub(super) trait ValueReader {
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
pub(super) struct TopSeed<'k, R> {
    pub(super) key: &'k str,
    pub(super) reader: R,
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

pub(super) struct KeysVisitor;

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

pub(super) struct TypedReader<T>(pub(super) PhantomData<T>);

impl<T: DeserializeOwned> ValueReader for TypedReader<T> {
    type Out = T;
    fn read<'de, D: Deserializer<'de>>(self, d: D) -> Result<T, D::Error> {
        T::deserialize(d)
    }
}

/// The `type` of a component and where the component starts.
pub(super) struct KindInfo {
    pub(super) kind: Option<Spanned<String>>,
    pub(super) keys: Vec<Spanned<String>>,
    pub(super) at: serde_saphyr::Location,
}

#[derive(Clone, Copy)]
pub(super) struct KindReader;

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

pub(super) struct ComponentReader<'k, T> {
    kind: &'k str,
    /// Keys already reported as unknown: hidden from the typed pass so it can report the next
    /// problem.
    skip: &'k HashSet<String>,
    _t: PhantomData<T>,
}

impl<'k, T> ComponentReader<'k, T> {
    pub(super) fn new(kind: &'k str, skip: &'k HashSet<String>) -> Self {
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
    skip: &'k HashSet<String>,
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
pub(super) struct ListReader<R>(pub(super) R);

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

/// What the typed pass does with one element of a component list (`None` in its place: skip
/// the element, its `type` was already reported).
pub(super) struct ElementPlan {
    pub(super) kind: String,
    pub(super) at: serde_saphyr::Location,
    pub(super) location: String,
    pub(super) skip: HashSet<String>,
}

/// Reads elements `start..` of a component list with their plans, into `read`; `at` is the
/// element being read, so that a failure can be pinned to it (and the values read before it
/// are kept).
pub(super) struct ElementsReader<'p, T> {
    pub(super) start: usize,
    pub(super) plans: &'p [Option<ElementPlan>],
    pub(super) at: &'p Cell<usize>,
    pub(super) read: &'p RefCell<Vec<(usize, T)>>,
    pub(super) _t: PhantomData<T>,
}

impl<T: Component> ValueReader for ElementsReader<'_, T> {
    type Out = ();
    fn read<'de, D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de, T: Component> Visitor<'de> for ElementsReader<'_, T> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list")
    }
    fn visit_seq<S: SeqAccess<'de>>(self, mut s: S) -> Result<(), S::Error> {
        let mut i = 0;
        loop {
            self.at.set(i);
            let plan = match self.plans.get(i) {
                Some(Some(plan)) if i >= self.start => Some(plan),
                _ => None,
            };
            match plan {
                Some(p) => {
                    let reader = ComponentReader::<T>::new(&p.kind, &p.skip);
                    match s.next_element_seed(Seed(reader))? {
                        Some(v) => self.read.borrow_mut().push((i, v)),
                        None => break,
                    }
                }
                None => {
                    if s.next_element::<IgnoredAny>()?.is_none() {
                        break;
                    }
                }
            }
            i += 1;
        }
        Ok(())
    }
}
