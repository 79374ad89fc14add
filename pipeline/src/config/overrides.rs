//! Overrides: `stages[0].seed=3`, `source.path=s3://b/x.parquet` — settings changed on top of
//! a config document without editing it (Python's `overrides=`, a sweep's trials).
//!
//! The document's YAML is read into a plain value tree, each override set at its path, and the
//! result written back as JSON text (JSON is YAML), which is then read like any document, so
//! every check a file gets applies to the overridden settings too. A path whose parent is not
//! in the document (`stages[9]` of three stages, `source.x.y` where `x` is a number) is refused
//! naming the override; a misspelt leaf key is refused by the section's own reader, like a
//! misspelt key in a file.

use serde_json::Value;

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

/// Sets `value` at `steps` in `tree`; a mapping key may be new, everything above it must exist.
fn set(tree: &mut Value, steps: &[Step], value: Value) -> std::result::Result<(), String> {
    let (last, parents) = steps.split_last().expect("a path has a step");
    let mut at = tree;
    let mut walked = String::new();
    for step in parents {
        at = match (step, at) {
            (Step::Key(k), Value::Object(map)) => {
                walked.push_str(&format!(".{k}"));
                map.get_mut(k)
                    .ok_or_else(|| format!("`{}` is not in the document", &walked[1..]))?
            }
            (Step::Index(i), Value::Array(list)) => {
                let len = list.len();
                walked.push_str(&format!("[{i}]"));
                list.get_mut(*i).ok_or_else(|| {
                    format!(
                        "`{}`: the list has {len} entries",
                        walked.trim_start_matches('.')
                    )
                })?
            }
            (_, other) => {
                return Err(format!(
                    "`{}` is {}, not a {}",
                    walked.trim_start_matches('.'),
                    kind(other),
                    if matches!(step, Step::Key(_)) {
                        "mapping"
                    } else {
                        "list"
                    }
                ));
            }
        };
    }
    match (last, at) {
        (Step::Key(k), Value::Object(map)) => {
            map.insert(k.clone(), value);
            Ok(())
        }
        (Step::Index(i), Value::Array(list)) if *i < list.len() => {
            list[*i] = value;
            Ok(())
        }
        (Step::Index(_), Value::Array(list)) => Err(format!(
            "`{}`: the list has {} entries",
            walked.trim_start_matches('.'),
            list.len()
        )),
        (_, other) => Err(format!(
            "`{}` is {}, which has no entries",
            walked.trim_start_matches('.'),
            kind(other)
        )),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "empty",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
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
        let mut tree: Value = serde_saphyr::from_str(self.text()).map_err(|e| {
            ConfigErrors(vec![problem(
                "(any)",
                format!("{origin} cannot take overrides: {e}"),
            )])
        })?;
        if tree.is_null() {
            tree = Value::Object(Default::default());
        }
        let mut errors = Vec::new();
        for (path, text) in overrides {
            let Some(steps) = parse_path(path) else {
                errors.push(problem(
                    path,
                    "not a setting's path: write it like `stages[0].seed` or `source.path`".into(),
                ));
                continue;
            };
            let value: Value = match serde_saphyr::from_str(text) {
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
        let text = serde_json::to_string_pretty(&tree).expect("a JSON value is written");
        ConfigDocument::from_str(
            &text,
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
        let tree: Value = serde_saphyr::from_str(d.text()).unwrap();
        assert_eq!(tree["stages"][0]["seed"], 3);
        assert_eq!(tree["stages"][0]["buffer_rows"], 8);
        assert_eq!(tree["source"]["path"], "b c.parquet");
        assert!(
            d.origin()
                .starts_with("p.yaml (overridden: stages[0].seed, source.path)")
        );
    }

    #[test]
    fn overrides_that_cannot_apply_are_all_named() {
        let d = doc("source: {type: parquet, path: a.parquet}\nstages:\n  - {type: shuffle}\n");
        let e = over(
            d,
            &[
                ("stages[4].seed", "1"),
                ("sink.path", "x"),
                ("source.path.x", "1"),
                ("a[", "1"),
                ("source.batch_rows", "[1"),
            ],
        )
        .unwrap_err()
        .to_string();
        for want in [
            "override stages[4].seed: `stages[4]`: the list has 1 entries",
            "override sink.path: `sink` is not in the document",
            "override source.path.x: `source.path` is a string, which has no entries",
            "override a[: not a setting's path",
            "override source.batch_rows: the value \"[1\" is not YAML",
        ] {
            assert!(e.contains(want), "{want:?} not in:\n{e}");
        }
    }
}
