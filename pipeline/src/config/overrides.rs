//! Overrides: `stages[0].seed=3`, `source.path=s3://b/x.parquet` — settings changed on top of
//! a config document without editing it (Python's `overrides=`, a sweep's trials).
//!
//! The document's YAML is read into a plain value tree (mappings keep their order: a Kafka
//! `schema:` is ordered), each override set at its path, and the result written back as
//! flow-style YAML, which is then read like any document, so every check a file gets applies to
//! the overridden settings too. A missing mapping on the way is created (`runtime.threads`
//! without a `runtime:` section); a path through something else (`stages[9]` of three stages,
//! `source.path.x` where `path` is a string) is refused naming the override; a misspelt key is
//! refused by the section's own reader, like a misspelt key in a file.
//!
//! The tree is written by hand (not serde_json's `Value`): serde_json here sorts mappings and
//! has no `.inf`/`.nan`, and turning on its `preserve_order` would change the order of every
//! map the workspace serializes.

use std::fmt::Write as _;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

use super::load::ConfigDocument;
use super::{ConfigError, ConfigErrors};
use crate::error::Result;

/// One step of an override's path: a mapping key or a list index.
#[derive(Debug, PartialEq)]
enum Step {
    Key(String),
    Index(usize),
}

/// `stages[0].ops[1].normalize` → its steps; `None` for a malformed path.
fn parse_path(path: &str) -> Option<Vec<Step>> {
    let mut steps = Vec::new();
    for part in path.split('.') {
        let (key, mut rest) = match part.find('[') {
            Some(i) => (&part[..i], &part[i..]),
            None => (part, ""),
        };
        if (key.is_empty() && steps.is_empty()) || key.contains(']') {
            return None;
        }
        if !key.is_empty() {
            steps.push(Step::Key(key.to_string()));
        }
        while let Some(after) = rest.strip_prefix('[') {
            let end = after.find(']')?;
            steps.push(Step::Index(after[..end].trim().parse().ok()?));
            rest = &after[end + 1..];
        }
        if !rest.is_empty() || (key.is_empty() && !part.starts_with('[')) {
            return None;
        }
    }
    (!steps.is_empty()).then_some(steps)
}

/// A YAML value, mappings in document order.
#[derive(Debug, Clone, PartialEq)]
enum Tree {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    /// A plain (unquoted) word YAML 1.1 reads as a boolean (`y`, `no`, `On`…): written back
    /// plain, so each section's reader takes it as the file's text would be taken.
    Plain(String),
    List(Vec<Tree>),
    Map(Vec<(String, Tree)>),
}

impl<'de> Deserialize<'de> for Tree {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(TreeVisitor)
    }
}

struct TreeVisitor;

impl<'de> Visitor<'de> for TreeVisitor {
    type Value = Tree;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a YAML value")
    }
    fn visit_unit<E>(self) -> Result<Tree, E> {
        Ok(Tree::Null)
    }
    fn visit_none<E>(self) -> Result<Tree, E> {
        Ok(Tree::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Tree, D::Error> {
        Tree::deserialize(d)
    }
    fn visit_bool<E>(self, v: bool) -> Result<Tree, E> {
        Ok(Tree::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Tree, E> {
        Ok(Tree::Int(v.into()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Tree, E> {
        Ok(Tree::Int(v.into()))
    }
    fn visit_i128<E>(self, v: i128) -> Result<Tree, E> {
        Ok(Tree::Int(v))
    }
    fn visit_u128<E: de::Error>(self, v: u128) -> Result<Tree, E> {
        i128::try_from(v)
            .map(Tree::Int)
            .map_err(|_| E::custom("an integer too large"))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Tree, E> {
        Ok(Tree::Float(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Tree, E> {
        Ok(Tree::Str(v.to_string()))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Tree, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element()? {
            out.push(v);
        }
        Ok(Tree::List(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Tree, A::Error> {
        let mut out = Vec::new();
        while let Some((k, v)) = map.next_entry::<Tree, Tree>()? {
            let key = match k {
                Tree::Str(s) => s,
                other => other.to_yaml(),
            };
            out.push((key, v));
        }
        Ok(Tree::Map(out))
    }
}

impl Tree {
    fn kind(&self) -> &'static str {
        match self {
            Tree::Null => "empty",
            Tree::Bool(_) => "a boolean",
            Tree::Int(_) | Tree::Float(_) => "a number",
            Tree::Str(_) | Tree::Plain(_) => "a string",
            Tree::List(_) => "a list",
            Tree::Map(_) => "a mapping",
        }
    }

    /// Flow-style YAML, one mapping entry or list element per line. `$` is written `$$`, so
    /// reading it again (which interpolates `${VAR}`) gives back the text already interpolated.
    fn to_yaml(&self) -> String {
        let mut out = String::new();
        self.write(&mut out, 0);
        out
    }

    fn write(&self, out: &mut String, depth: usize) {
        let pad = |out: &mut String, d: usize| {
            out.push('\n');
            out.push_str(&"  ".repeat(d));
        };
        match self {
            Tree::Null => out.push_str("null"),
            Tree::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Tree::Int(i) => {
                let _ = write!(out, "{i}");
            }
            Tree::Float(f) if f.is_nan() => out.push_str(".nan"),
            Tree::Float(f) if f.is_infinite() => {
                out.push_str(if *f > 0.0 { ".inf" } else { "-.inf" })
            }
            // `{:?}` keeps a float a float (`1.0`, not `1`) and round-trips it.
            Tree::Float(f) => {
                let _ = write!(out, "{f:?}");
            }
            Tree::Plain(s) => out.push_str(s),
            Tree::Str(s) => quote(out, s),
            Tree::List(items) => {
                out.push('[');
                for (n, v) in items.iter().enumerate() {
                    pad(out, depth + 1);
                    v.write(out, depth + 1);
                    if n + 1 < items.len() {
                        out.push(',');
                    }
                }
                pad(out, depth);
                out.push(']');
            }
            Tree::Map(entries) => {
                out.push('{');
                for (n, (k, v)) in entries.iter().enumerate() {
                    pad(out, depth + 1);
                    quote(out, k);
                    out.push_str(": ");
                    v.write(out, depth + 1);
                    if n + 1 < entries.len() {
                        out.push(',');
                    }
                }
                pad(out, depth);
                out.push('}');
            }
        }
    }
}

/// Reads YAML text into a [`Tree`] that writes back to what each section's reader takes.
///
/// YAML 1.1 reads a plain `y`, `no`, `on`… as a boolean (the typed readers take it as the text
/// where they want text, `loader.tensors.y`, and as the boolean where they want one), while a
/// quoted `"no"` is text everywhere. A value tree cannot tell: read with YAML 1.2's booleans
/// the word is text but its quotes are lost; read with 1.1's, `y:` becomes the key `true`. So
/// the text is read both ways, and a string that the 1.1 reading calls a boolean was a plain
/// word: it becomes [`Tree::Plain`], written back without quotes.
fn read_tree(text: &str) -> std::result::Result<Tree, serde_saphyr::Error> {
    let read = |strict: bool| {
        let mut options = serde_saphyr::Options::default();
        options.strict_booleans = strict;
        serde_saphyr::from_str_with_options::<Tree>(text, options)
    };
    let mut tree = read(true)?;
    mark_plain(&mut tree, &read(false)?);
    Ok(tree)
}

/// Marks the strings of `strict` that `loose` (the same text read with YAML 1.1 booleans) has
/// as booleans. The two trees have the same shape, entries in the same order.
fn mark_plain(strict: &mut Tree, loose: &Tree) {
    match (strict, loose) {
        (t @ Tree::Str(_), Tree::Bool(_)) => {
            if let Tree::Str(s) = std::mem::replace(t, Tree::Null) {
                *t = Tree::Plain(s);
            }
        }
        (Tree::List(a), Tree::List(b)) => {
            for (x, y) in a.iter_mut().zip(b) {
                mark_plain(x, y);
            }
        }
        (Tree::Map(a), Tree::Map(b)) => {
            for ((_, x), (_, y)) in a.iter_mut().zip(b) {
                mark_plain(x, y);
            }
        }
        _ => {}
    }
}

/// A YAML double-quoted scalar (JSON's escapes are YAML's), `$` doubled (see `to_yaml`).
fn quote(out: &mut String, s: &str) {
    let json = serde_json::to_string(s).expect("a string is written");
    out.push_str(&json.replace('$', "$$"));
}

/// Sets `value` at `steps` in `tree`. Mappings missing on the way (or empty, like a bare
/// `loader:`) are created; lists must already hold the index.
fn set(tree: &mut Tree, steps: &[Step], value: Tree) -> std::result::Result<(), String> {
    let mut at = tree;
    let mut walked = String::new();
    for (n, step) in steps.iter().enumerate() {
        let last = n + 1 == steps.len();
        if matches!(step, Step::Key(_)) && matches!(at, Tree::Null) {
            *at = Tree::Map(Vec::new());
        }
        let here = walked.trim_start_matches('.').to_string();
        at = match (step, at) {
            (Step::Key(k), Tree::Map(entries)) => {
                walked.push_str(&format!(".{k}"));
                let i = match entries.iter().position(|(key, _)| key == k) {
                    Some(i) => i,
                    None => {
                        entries.push((k.clone(), Tree::Null));
                        entries.len() - 1
                    }
                };
                &mut entries[i].1
            }
            (Step::Index(i), Tree::List(items)) => {
                let len = items.len();
                walked.push_str(&format!("[{i}]"));
                items.get_mut(*i).ok_or_else(|| {
                    format!(
                        "`{}`: the list has {len} entries",
                        walked.trim_start_matches('.')
                    )
                })?
            }
            (Step::Key(k), other) => {
                return Err(format!(
                    "`{here}` is {}, so it has no key `{k}`",
                    other.kind()
                ));
            }
            (Step::Index(i), other) => {
                let what = if here.is_empty() {
                    "the document".to_string()
                } else {
                    format!("`{here}`")
                };
                return Err(format!(
                    "{what} is {}, not a list: it has no entry [{i}]",
                    other.kind()
                ));
            }
        };
        if last {
            *at = value;
            return Ok(());
        }
    }
    Ok(())
}

impl ConfigDocument {
    /// This document with `overrides` applied: each `(path, value)` sets the YAML `value`
    /// (text: `3`, `[1, 2]`, `{size: 8}`, `s3://b/x`) at `path` (`stages[0].seed`). Every
    /// override that cannot apply is reported, each naming itself. With no overrides the
    /// document is returned as it is (its messages keep the file's lines).
    pub fn with_overrides(self, overrides: &[(String, String)]) -> Result<ConfigDocument> {
        if overrides.is_empty() {
            return Ok(self);
        }
        let origin = self.origin().to_string();
        let problem = |path: &str, message: String| {
            ConfigError::unlocated(&format!("override {path}"), message)
        };
        let mut tree: Tree = read_tree(self.text()).map_err(|e| {
            ConfigErrors(vec![problem(
                "(any)",
                format!("{origin} cannot take overrides: {e}"),
            )])
        })?;
        let mut errors = Vec::new();
        for (path, text) in overrides {
            let Some(steps) = parse_path(path) else {
                errors.push(problem(
                    path,
                    "not a setting's path: write it like `stages[0].seed` or `source.path`".into(),
                ));
                continue;
            };
            let value: Tree = match read_tree(text) {
                Ok(v) => v,
                Err(e) => {
                    errors.push(problem(
                        path,
                        format!("the value {text:?} is not YAML: {e}"),
                    ));
                    continue;
                }
            };
            if let Err(e) = set(&mut tree, &steps, value) {
                errors.push(problem(path, e));
            }
        }
        if !errors.is_empty() {
            return Err(ConfigErrors(errors).into());
        }
        let names: Vec<&str> = overrides.iter().map(|(p, _)| p.as_str()).collect();
        ConfigDocument::from_str(
            &tree.to_yaml(),
            &format!("{origin} (overridden: {})", names.join(", ")),
            self.base_dir().to_path_buf(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(text: &str) -> ConfigDocument {
        ConfigDocument::from_str(text, "p.yaml", ".").unwrap()
    }

    fn over(d: ConfigDocument, sets: &[(&str, &str)]) -> Result<ConfigDocument> {
        let sets: Vec<_> = sets
            .iter()
            .map(|(p, v)| (p.to_string(), v.to_string()))
            .collect();
        d.with_overrides(&sets)
    }

    #[test]
    fn paths_are_keys_and_indices() {
        assert_eq!(
            parse_path("stages[0].ops[1].normalize"),
            Some(vec![
                Step::Key("stages".into()),
                Step::Index(0),
                Step::Key("ops".into()),
                Step::Index(1),
                Step::Key("normalize".into()),
            ])
        );
        for bad in ["", ".a", "a..b", "a[x]", "a[1", "a]b", "[0]"] {
            assert_eq!(parse_path(bad), None, "{bad}");
        }
    }

    #[test]
    fn an_override_sets_a_value_new_keys_included() {
        let d = doc(
            "source: {type: parquet, path: a.parquet}\nstages:\n  - {type: shuffle, buffer_rows: 8}\n",
        );
        let d = over(
            d,
            &[("stages[0].seed", "3"), ("source.path", "'b c.parquet'")],
        )
        .unwrap();
        let tree: serde_json::Value = serde_saphyr::from_str(d.text()).unwrap();
        assert_eq!(tree["stages"][0]["seed"], 3);
        assert_eq!(tree["stages"][0]["buffer_rows"], 8);
        assert_eq!(tree["source"]["path"], "b c.parquet");
        assert!(
            d.origin()
                .starts_with("p.yaml (overridden: stages[0].seed, source.path)")
        );
    }

    /// `y` (a tensor's name), `Yes` (a YAML 1.1 flag) and `'no'` (quoted text) come back as
    /// the file had them: the key stays the text `y`, the plain words stay plain, the quoted
    /// one stays quoted — so any-scalar fields (`fill_null`) keep text as text.
    #[test]
    fn yaml_11_boolean_words_survive_an_override() {
        let d = doc(
            "loader: {tensors: {x: {column: a}, y: {column: label}}}\nflag: Yes\nname: 'no'\nlist: [on, \"off\"]\n",
        );
        let d = over(d, &[("loader.prefetch", "2"), ("extra", "No")]).unwrap();
        let tree: serde_json::Value = serde_saphyr::from_str(d.text()).unwrap();
        assert_eq!(
            tree["loader"]["tensors"]["y"]["column"],
            "label",
            "{}",
            d.text()
        );
        assert_eq!(tree["loader"]["prefetch"], 2);
        assert_eq!(tree["flag"], true, "{}", d.text());
        assert_eq!(tree["name"], "no", "quoted text stays text: {}", d.text());
        assert_eq!(
            tree["list"],
            serde_json::json!([true, "off"]),
            "{}",
            d.text()
        );
        assert_eq!(
            tree["extra"],
            false,
            "an override's plain word too: {}",
            d.text()
        );
    }

    #[test]
    fn overrides_that_cannot_apply_are_all_named() {
        let d = doc("source: {type: parquet, path: a.parquet}\nstages:\n  - {type: shuffle}\n");
        let e = over(
            d,
            &[
                ("stages[4].seed", "1"),
                ("source.path.x", "1"),
                ("stages.x", "1"),
                ("source[0]", "1"),
                ("a[", "1"),
                ("source.batch_rows", "[1"),
            ],
        )
        .unwrap_err()
        .to_string();
        for want in [
            "override stages[4].seed: `stages[4]`: the list has 1 entries",
            "override source.path.x: `source.path` is a string, so it has no key `x`",
            "override stages.x: `stages` is a list, so it has no key `x`",
            "override source[0]: `source` is a mapping, not a list: it has no entry [0]",
            "override a[: not a setting's path",
            "override source.batch_rows: the value \"[1\" is not YAML",
        ] {
            assert!(e.contains(want), "{want:?} not in:\n{e}");
        }
    }

    #[test]
    fn order_dollars_and_odd_numbers_survive_and_missing_mappings_are_made() {
        let text = "source: {type: kafka, topic: t, schema: {z: int64, a: utf8}, group: 'p$${HOME}'}\nloader:\n";
        let d = ConfigDocument::from_str(text, "p.yaml", ".").unwrap();
        let sets = [
            ("runtime.threads", "2"),
            ("loader.prefetch", "3"),
            (
                "stages",
                "[{type: clip, columns: [x], min: -2.0, max: 1.5}]",
            ),
        ];
        let sets: Vec<_> = sets
            .iter()
            .map(|(p, v)| (p.to_string(), v.to_string()))
            .collect();
        let d = d.with_overrides(&sets).unwrap();
        let t = d.text();
        // The schema keeps its order; `$${HOME}` was a literal `${HOME}` and still is.
        assert!(t.find("\"z\"").unwrap() < t.find("\"a\"").unwrap(), "{t}");
        assert!(t.contains("\"p${HOME}\""), "{t}");
        assert!(t.contains("-2.0") && t.contains("1.5"), "{t}");
        let tree: serde_json::Value = serde_saphyr::from_str(t).unwrap();
        assert_eq!(tree["runtime"]["threads"], 2);
        assert_eq!(tree["loader"]["prefetch"], 3);
    }
}
