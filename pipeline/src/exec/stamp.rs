//! The settings that decide which rows come in which order, as a resumed state records them
//! ([`crate::PlanStamp`]'s `order`), and how a state written by an older Sluice is compared
//! with today's settings.
//!
//! Two forms exist. Form 1 (Sluice 0.1.0) hashed the `Debug` text of stage configs, so adding
//! any field to a stage's config, even one with a default, changed the hash and refused every
//! older checkpoint. Form 2 (today) keeps each stage's effective settings as canonical JSON, so
//! a state is compared field by field: a field the older Sluice did not know compares at the
//! value it takes when not written (its default, which must reproduce the older behaviour), and
//! a refusal names the field that changed. A form-1 state is checked against today's form-1
//! stamp of the same config, which is kept for that alone.

use std::collections::BTreeMap;

use serde_json::Value;

use super::Pipeline;
use crate::source::{Partitioning, SourceConfig};
use crate::stage::StageConfig;
use crate::state::{ORDER_FORM, PlanStamp, setting_hash};

/// How a stage's or the source's settings are written into the stamp.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Form {
    /// Form 1: a hash of the `Debug` text (only to check states written in that form).
    DebugHash,
    /// Form 2: canonical JSON of the effective values.
    Json,
}

impl Pipeline {
    /// The settings that decide which rows come in which order (see [`crate::PlanStamp`]):
    /// rank and world size; the shard policy; every `shuffle`'s window, memory cap and seeds;
    /// every stage before the last shuffle (they shape its windows and its spills: with one,
    /// the source's projection and batch size too); and every stage that drops rows.
    pub(super) fn order_settings(&self) -> BTreeMap<String, String> {
        self.order_settings_in(Form::Json)
    }

    /// The stamp a resumed state (`then`) is compared with: today's plan `now`, in the form
    /// `then` was written in. A form-2 `then` gets today's defaults for the fields its Sluice
    /// did not know (see the module's docs).
    pub(super) fn comparable(&self, then: &PlanStamp, now: PlanStamp) -> (PlanStamp, PlanStamp) {
        if then.form < ORDER_FORM {
            let now = PlanStamp {
                form: then.form,
                order: self.order_settings_in(Form::DebugHash),
                ..now
            };
            return (then.clone(), now);
        }
        let mut then = then.clone();
        for (key, value) in then.order.iter_mut() {
            if let Some(kind) = stage_kind(key)
                && let Some(filled) = with_defaults(kind, value)
            {
                *value = filled;
            }
        }
        (then, now)
    }

    fn order_settings_in(&self, form: Form) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        let (rank, world) = self.rank_and_world();
        out.insert("rank".to_string(), format!("{rank} of {world}"));
        let stages = &self.config.stages;
        let last_shuffle = stages
            .iter()
            .rposition(|s| matches!(s.value, StageConfig::Shuffle(_)));
        if let SourceConfig::Parquet(p) = &self.config.source.value {
            let value = match form {
                Form::DebugHash => {
                    let mut text = match last_shuffle {
                        Some(_) => format!("{:?}", (p.shard, &p.columns, p.batch_rows)),
                        None => format!("{:?}", p.shard),
                    };
                    // The partition columns widen a shuffle's rows (so move its spills); left
                    // out when off, so states taken before the setting existed still match.
                    if last_shuffle.is_some() && p.partitioning != Partitioning::None {
                        text += &format!(", {:?}", p.partitioning);
                        if !p.partition_types.is_empty() {
                            text += &format!(", {:?}", p.partition_types);
                        }
                    }
                    setting_hash(&text)
                }
                Form::Json => {
                    let mut v = serde_json::Map::new();
                    v.insert("shard".into(), json(&p.shard));
                    if last_shuffle.is_some() {
                        v.insert("columns".into(), json(&p.columns));
                        v.insert("batch_rows".into(), json(&p.batch_rows));
                        v.insert("partitioning".into(), json(&p.partitioning));
                        v.insert("partition_types".into(), json(&p.partition_types));
                    }
                    Value::Object(v).to_string()
                }
            };
            out.insert("source".to_string(), value);
            // Which rows each epoch takes, as text: a refusal can say which setting moved.
            if let Some(mix) = &p.mix {
                let weights: Vec<String> = mix.weights.iter().map(|w| w.to_string()).collect();
                let rows = mix
                    .rows_per_epoch
                    .map_or("the most".to_string(), |n| n.to_string());
                out.insert(
                    "source mix".to_string(),
                    format!(
                        "weights {}, rows_per_epoch {rows}, seed {}",
                        weights.join(":"),
                        mix.seed
                    ),
                );
            }
        }
        for (i, s) in stages.iter().enumerate() {
            let value = match &s.value {
                StageConfig::Shuffle(c) => {
                    // Short enough to keep as text: a refusal can say which setting moved.
                    if c.mode == crate::stage::ShuffleMode::Global {
                        // Only what decides a global permutation and its blocks.
                        let text =
                            format!("mode global, max_memory {}, seed {}", c.max_memory, c.seed);
                        out.insert(format!("stages[{i}] ({})", s.value.kind()), text);
                        continue;
                    }
                    let mut text = format!(
                        "buffer_rows {}, max_memory {}, seed {}",
                        c.buffer_rows, c.max_memory, c.seed
                    );
                    if !c.row_groups {
                        text.push_str(", row_groups false");
                    }
                    if c.across_ranks {
                        text.push_str(", across_ranks true");
                    }
                    if let Some(g) = &c.group_by_length {
                        text += &format!(
                            ", group_by_length `{}` in {} batches of {}",
                            g.column,
                            g.batches,
                            self.batch_after(i).unwrap_or(0)
                        );
                    }
                    text
                }
                v if v.removes_rows() || last_shuffle.is_some_and(|l| i < l) => match form {
                    Form::DebugHash => setting_hash(&format!("{v:?}")),
                    Form::Json => json(v).to_string(),
                },
                _ => continue,
            };
            out.insert(format!("stages[{i}] ({})", s.value.kind()), value);
        }
        out
    }
}

/// A config's effective values as JSON (serde_json's maps keep keys sorted: canonical).
fn json<T: serde::Serialize>(value: &T) -> Value {
    // Config types serialize plain data (no maps with non-string keys): this cannot fail.
    serde_json::to_value(value).unwrap_or(Value::Null)
}

/// The stage kind in a stamp key (`stages[2] (clip)` → `clip`).
fn stage_kind(key: &str) -> Option<&str> {
    key.strip_prefix("stages[")?
        .split_once("] (")?
        .1
        .strip_suffix(')')
}

/// A stage's stamped settings (form 2) read back as today's config of `kind` and written out
/// again: fields the writing Sluice did not know get today's defaults. `None` when they are
/// not JSON (a shuffle's text) or no longer read (a field was removed or renamed: the
/// comparison then shows them as they were).
fn with_defaults(kind: &str, stamped: &str) -> Option<String> {
    let value: Value = serde_json::from_str(stamped).ok()?;
    if !value.is_object() {
        return None;
    }
    let config = <StageConfig as crate::config::Component>::deserialize_kind(kind, value).ok()?;
    Some(json(&config).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_kinds_are_read_from_stamp_keys() {
        assert_eq!(
            stage_kind("stages[12] (gaussian_noise)"),
            Some("gaussian_noise")
        );
        assert_eq!(stage_kind("source"), None);
        assert_eq!(stage_kind("source mix"), None);
    }

    /// A field an older Sluice did not write (it did not exist then) compares at its default:
    /// the stamp of `clip` written without `min`'s sibling fields reads back with them.
    #[test]
    fn a_field_missing_from_an_older_stamp_takes_its_default() {
        let today = StageConfig::GaussianNoise(
            serde_json::from_value(serde_json::json!({"columns": ["x"], "std": 0.5})).unwrap(),
        );
        let full = json(&today);
        let mut older = full.clone();
        // Every field with a default left out, as a Sluice before those fields wrote it.
        let required = ["columns", "std"];
        older
            .as_object_mut()
            .unwrap()
            .retain(|k, _| required.contains(&k.as_str()));
        assert_ne!(older, full, "the config has defaulted fields to leave out");
        assert_eq!(
            with_defaults("gaussian_noise", &older.to_string()),
            Some(full.to_string())
        );
        // A field set away from its default stays different.
        let mut seeded = older.clone();
        seeded["seed"] = serde_json::json!(77);
        assert_ne!(
            with_defaults("gaussian_noise", &seeded.to_string()),
            Some(full.to_string())
        );
        // Text (a shuffle's) and fields today's config no longer reads are left as they are.
        assert_eq!(with_defaults("shuffle", "buffer_rows 10, seed 1"), None);
        let mut unknown = older;
        unknown["gone"] = serde_json::json!(1);
        assert_eq!(with_defaults("gaussian_noise", &unknown.to_string()), None);
    }
}
