//! What a position is relative to: the stamp of the plan (settings that decide the order)
//! and of the data (the files), and how a stored stamp is compared with today's.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// What the positions of a Parquet pipeline ([`Mark`]: epoch, unit, row, shuffle window) are
/// relative to: the files, and the settings that decide which rows come in which order. A
/// position restored into a pipeline with another plan would point at other rows (rows lost
/// or repeated), so [`crate::Pipeline::prepare`] refuses it and says what changed.
///
/// Settings that do not move rows are left out, so they can change between runs: threads,
/// queues, prefetch, storage options and where the files live, the number of epochs, batch
/// size, and stages after the last `shuffle` that keep every row (augmentation, `select`, …).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanStamp {
    /// The files: all of them once every footer has been read, or (reading in listing order)
    /// those up to the position.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<DataStamp>,
    /// The order-deciding settings by what they belong to (`rank`, `source`,
    /// `stages[0] (shuffle)`): short text, or (form 2) canonical JSON of a config's effective
    /// values, or (form 1) a hash of its `Debug` text.
    #[serde(default)]
    pub order: BTreeMap<String, String>,
    /// The form of `order`'s values: 1 (absent: Sluice 0.1.0) hashed stage configs' `Debug`
    /// text, 2 keeps canonical JSON ([`ORDER_FORM`]).
    #[serde(default = "first_form")]
    pub form: u32,
}

/// The form of [`PlanStamp::order`] this Sluice writes: 2, canonical JSON of the effective
/// settings, compared field by field (`exec/stamp.rs`).
pub const ORDER_FORM: u32 = 2;

fn first_form() -> u32 {
    1
}

impl Default for PlanStamp {
    fn default() -> Self {
        PlanStamp {
            data: None,
            order: BTreeMap::new(),
            form: ORDER_FORM,
        }
    }
}

/// The files a Parquet pipeline reads: how many, their rows, and a hash of their paths
/// (relative to the first file's directory, so a copy elsewhere matches) and row-group sizes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataStamp {
    /// Files.
    pub files: u64,
    /// Rows in one epoch (all ranks).
    pub rows: u64,
    /// Hash of the relative paths and row-group sizes, in reading order.
    pub hash: String,
    /// Only the files up to the position were stamped (a pipeline reading in listing order,
    /// where files after the position do not move it).
    #[serde(default, skip_serializing_if = "is_false")]
    pub prefix: bool,
    /// With a `mix`: the rows of each `path` entry (the datasets an epoch's shares are taken
    /// from), so the epoch can be counted from the state and the config alone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub entries: Vec<u64>,
}

fn is_false(v: &bool) -> bool {
    !*v
}

impl PlanStamp {
    /// What differs between the plan a state was taken under (`self`) and the plan of the
    /// pipeline resuming it (`now`), in words; empty when the positions still mean the same
    /// rows. Files are compared only when both sides stamped them the same way.
    pub fn differences(&self, now: &PlanStamp) -> Vec<String> {
        let mut out = self.data_differences(now);
        self.order_differences(now, &mut out);
        out
    }

    /// [`PlanStamp::differences`] in the files alone: what matters to a position at the start
    /// of an epoch, which no setting moves.
    pub fn data_differences(&self, now: &PlanStamp) -> Vec<String> {
        let mut out = Vec::new();
        if let (Some(a), Some(b)) = (&self.data, &now.data)
            && a.prefix == b.prefix
            && a != b
        {
            let what = if a.prefix {
                "the files up to the position"
            } else {
                "the files"
            };
            out.push(if (a.files, a.rows) == (b.files, b.rows) {
                format!(
                    "{what}: as many ({}, {} rows) but with other paths or row groups",
                    a.files, a.rows
                )
            } else {
                format!(
                    "{what}: {} file(s) with {} rows then, {} file(s) with {} rows now",
                    a.files, a.rows, b.files, b.rows
                )
            });
        }
        out
    }

    fn order_differences(&self, now: &PlanStamp, out: &mut Vec<String>) {
        let keys: BTreeSet<&String> = self.order.keys().chain(now.order.keys()).collect();
        // Stages in pipeline order (`stages[2]` before `stages[10]`), after the rest.
        let mut keys: Vec<&String> = keys.into_iter().collect();
        keys.sort_by_key(|k| {
            let index = k
                .strip_prefix("stages[")
                .and_then(|r| r.split(']').next())
                .and_then(|i| i.parse::<usize>().ok());
            (index.is_some(), index, k.as_str())
        });
        for k in keys {
            match (self.order.get(k), now.order.get(k)) {
                (Some(a), Some(b)) if a == b => {}
                (Some(a), Some(b)) => match changed_fields(a, b) {
                    // Equal objects written in another key order are the same settings.
                    Some((x, y)) if x.is_empty() && y.is_empty() => {}
                    Some((x, y)) => out.push(format!("{k}: {x} then, {y} now")),
                    None if !is_hash(a) && !is_hash(b) => {
                        let (x, y) = changed_parts(a, b);
                        out.push(format!("{k}: {x} then, {y} now"));
                    }
                    None => out.push(format!("{k}: its settings changed")),
                },
                (Some(_), None) => out.push(format!("{k}: there then, not now")),
                (None, Some(_)) => out.push(format!("{k}: not there then")),
                (None, None) => {}
            }
        }
    }
}

/// The `, `-separated parts of two settings texts that differ (the whole texts when their
/// parts do not line up).
fn changed_parts(a: &str, b: &str) -> (String, String) {
    let (pa, pb): (Vec<&str>, Vec<&str>) = (a.split(", ").collect(), b.split(", ").collect());
    if pa.len() != pb.len() {
        return (a.to_string(), b.to_string());
    }
    let (da, db): (Vec<&str>, Vec<&str>) = pa.iter().zip(&pb).filter(|(x, y)| x != y).unzip();
    (da.join(", "), db.join(", "))
}

/// The fields that differ between two stamped configs (form 2: JSON objects), as `name value`
/// lists; `None` when they are not both objects. Equal objects (keys in another order) give
/// two empty lists.
fn changed_fields(a: &str, b: &str) -> Option<(String, String)> {
    let (Ok(serde_json::Value::Object(a)), Ok(serde_json::Value::Object(b))) = (
        serde_json::from_str::<serde_json::Value>(a),
        serde_json::from_str::<serde_json::Value>(b),
    ) else {
        return None;
    };
    let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    let show = |m: &serde_json::Map<String, serde_json::Value>, k: &str| match m.get(k) {
        Some(v) => format!("{k} {v}"),
        None => format!("{k} not set"),
    };
    let (then, now): (Vec<String>, Vec<String>) = keys
        .into_iter()
        .filter(|k| a.get(*k) != b.get(*k))
        .map(|k| (show(&a, k), show(&b, k)))
        .unzip();
    Some((then.join(", "), now.join(", ")))
}

const HASH_PREFIX: &str = "fnv:";

fn is_hash(v: &str) -> bool {
    v.starts_with(HASH_PREFIX)
}

/// FNV-1a, 64 bits: stable across platforms and Rust releases (unlike `std`'s hasher), for
/// augmentation identities and plan stamps.
pub(crate) fn fnv1a(bytes: &[u8], mut h: u64) -> u64 {
    for b in bytes {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The FNV-1a offset basis.
pub(crate) const FNV_BASIS: u64 = 0xcbf2_9ce4_8422_2325;

/// A short, stable hash of a setting's text, as stored in [`PlanStamp::order`].
pub(crate) fn setting_hash(text: &str) -> String {
    format!("{HASH_PREFIX}{:016x}", fnv1a(text.as_bytes(), FNV_BASIS))
}
