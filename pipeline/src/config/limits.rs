//! The allowed range of every size setting, each with the reason for it: one table
//! ([`LIMITS`]) that loading a config checks — so `sluice validate` (also with `--no-data`),
//! `sluice run` and `sluice train` refuse an absurd value, at its `file:line:column`, before
//! any work starts — and that docs/config.md shows ([`markdown_table`]; a test keeps the two
//! in step).
//!
//! The check reads the document once more as a plain tree of values with their positions,
//! independent of the typed structs: a limit names its place by section, component `type` and
//! key, so settings of other crates' sections (`sink`, `loader`, `trainer`) are bounded here
//! too. A value that is not a number of the right kind is left to the typed reading, which
//! reports it.

use std::fmt::Write as _;

use bytesize::ByteSize;
use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::Spanned;

use super::{ConfigDocument, ConfigError};

/// How a setting is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// An integer.
    Count,
    /// A byte size: an integer or a number with a unit (`64 MiB`).
    Bytes,
    /// The number of entries of a list.
    Entries,
}

/// The allowed range of one setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    /// Top-level section: `runtime`, `source`, `stages`, `sink`, `loader`, `trainer`.
    pub section: &'static str,
    /// The component `type:` the setting belongs to (in `source`, `stages`, `sink`).
    pub kind: Option<&'static str>,
    /// Where the value is below the section (or the stage): keys joined by `.`, `[]` after a
    /// key for each entry of its list, `*` for any key. Empty: the section itself.
    pub key: &'static str,
    /// Smallest allowed value.
    pub min: u64,
    /// Largest allowed value (`u64::MAX`: no upper bound).
    pub max: u64,
    /// How the value is written.
    pub unit: Unit,
    /// What `0` means, where it is allowed with a meaning of its own.
    pub zero: Option<&'static str>,
    /// Why the bound is there.
    pub why: &'static str,
}

/// The limit of `key` in `section` (no component kind), for checking a value that comes from
/// elsewhere than the YAML (a command-line flag).
pub fn lookup(section: &str, key: &str) -> Option<&'static Limit> {
    LIMITS
        .iter()
        .find(|l| l.section == section && l.kind.is_none() && l.key == key)
}

/// Most threads of the CPU pool (`runtime.threads`).
pub const MAX_THREADS: u64 = 1024;

const KIB: u64 = 1 << 10;
const GIB: u64 = 1 << 30;
const TIB: u64 = 1 << 40;
/// Rows of one batch, wherever batches are cut.
const MAX_BATCH_ROWS: u64 = 1 << 24;
/// Height, width or channels of one image.
const MAX_IMAGE_SIDE: u64 = 16_384;

const fn limit(
    section: &'static str,
    kind: Option<&'static str>,
    key: &'static str,
    range: (u64, u64),
    unit: Unit,
    why: &'static str,
) -> Limit {
    Limit {
        section,
        kind,
        key,
        min: range.0,
        max: range.1,
        unit,
        zero: None,
        why,
    }
}

/// `runtime.threads`.
pub const THREADS: Limit = Limit {
    section: "runtime",
    kind: None,
    key: "threads",
    min: 0,
    max: MAX_THREADS,
    unit: Unit::Count,
    zero: Some("one thread per core"),
    why: "each is an operating-system thread: more than the cores only adds switching, and thousands exhaust the system's thread limit",
};

const PARQUET: Option<&str> = Some("parquet");

/// Every bounded setting.
pub const LIMITS: &[Limit] = &[
    THREADS,
    limit(
        "runtime",
        None,
        "parallelism",
        (1, 4096),
        Unit::Count,
        "batches in flight per group of stages, each held in memory at once",
    ),
    limit(
        "runtime",
        None,
        "queue_bytes",
        (KIB, 64 * GIB),
        Unit::Bytes,
        "every queue between stages may hold this much memory",
    ),
    limit(
        "runtime",
        None,
        "world_size",
        (0, 65_536),
        Unit::Count,
        "every rank plans the shares of all ranks",
    ),
    limit(
        "source",
        PARQUET,
        "batch_rows",
        (1, MAX_BATCH_ROWS),
        Unit::Count,
        "a decoded batch is held whole in memory",
    ),
    limit(
        "source",
        PARQUET,
        "prefetch",
        (1, 1024),
        Unit::Count,
        "each row group read ahead is a task holding its fetched bytes (local: its pages being decoded)",
    ),
    limit(
        "source",
        PARQUET,
        "prefetch_bytes",
        (KIB, 64 * GIB),
        Unit::Bytes,
        "memory the row groups read ahead may take",
    ),
    limit(
        "source",
        Some("kafka"),
        "batch_rows",
        (1, MAX_BATCH_ROWS),
        Unit::Count,
        "a chunk of records is decoded and held as one batch",
    ),
    limit(
        "stages",
        None,
        "",
        (0, 10_000),
        Unit::Entries,
        "every stage is built and checked before any data moves, and a stateful one runs as a task with a queue of its own",
    ),
    limit(
        "stages",
        Some("batch"),
        "size",
        (1, MAX_BATCH_ROWS),
        Unit::Count,
        "a batch is held whole in memory, by every queue and tensor after it too",
    ),
    limit(
        "stages",
        Some("shuffle"),
        "buffer_rows",
        (1, 1 << 28),
        Unit::Count,
        "a window keeps a position per row, and its rows in memory up to `max_memory`",
    ),
    limit(
        "stages",
        Some("shuffle"),
        "max_memory",
        (1, TIB),
        Unit::Bytes,
        "memory a window may hold before it spills to disk",
    ),
    limit(
        "stages",
        Some("shuffle"),
        "batch_rows",
        (1, MAX_BATCH_ROWS),
        Unit::Count,
        "an output batch is held whole in memory",
    ),
    limit(
        "stages",
        Some("shuffle"),
        "group_by_length.batches",
        (1, 65_536),
        Unit::Count,
        "a group of `batches × size` rows is held as one more copy",
    ),
    limit(
        "stages",
        Some("one_hot"),
        "num_classes",
        (1, 1 << 20),
        Unit::Count,
        "each row becomes a vector of this many float32 values",
    ),
    limit(
        "stages",
        Some("image"),
        "shape[]",
        (1, MAX_IMAGE_SIDE),
        Unit::Count,
        "each image becomes height × width × channels float32 values",
    ),
    limit(
        "stages",
        Some("image"),
        "ops[].*.size[]",
        (1, MAX_IMAGE_SIDE),
        Unit::Count,
        "each output image is height × width × channels float32 values",
    ),
    limit(
        "stages",
        Some("image"),
        "ops[].*.padding",
        (0, MAX_IMAGE_SIDE),
        Unit::Count,
        "the padding is added on every side of the image before the crop",
    ),
    limit(
        "sink",
        PARQUET,
        "row_group_size",
        (1, MAX_BATCH_ROWS),
        Unit::Count,
        "a row group is buffered in memory until it is written",
    ),
    limit(
        "sink",
        PARQUET,
        "max_rows_per_file",
        (1, u64::MAX),
        Unit::Count,
        "a part file holds at least one row",
    ),
    limit(
        "sink",
        Some("kafka"),
        "max_message_bytes",
        (KIB, 1_000_000_000 - 64 * KIB),
        Unit::Count,
        "librdkafka refuses messages over 1,000,000,000 bytes, and 64 KiB are kept for the framing",
    ),
    limit(
        "loader",
        None,
        "prefetch",
        (1, 1024),
        Unit::Count,
        "each batch converted ahead is held in (device) memory",
    ),
    limit(
        "trainer",
        None,
        "allreduce.workers",
        (1, 256),
        Unit::Count,
        "each local worker is a thread with a model replica and a pipeline (and CPU pool) of its own",
    ),
    limit(
        "trainer",
        None,
        "accumulate",
        (1, 1024),
        Unit::Count,
        "each micro-batch of a step is a forward and backward pass before the one exchange",
    ),
    limit(
        "trainer",
        None,
        "sync.every",
        (1, 1_000_000),
        Unit::Count,
        "local SGD averages the replicas every this many steps",
    ),
    limit(
        "trainer",
        None,
        "allreduce.compression.rank",
        (1, 64),
        Unit::Count,
        "PowerSGD's factors grow with the rank; past a few it saves little",
    ),
    limit(
        "trainer",
        None,
        "eval.every_steps",
        (1, u64::MAX),
        Unit::Count,
        "evaluation runs at every multiple of it",
    ),
    limit(
        "trainer",
        None,
        "checkpoint.every_steps",
        (1, u64::MAX),
        Unit::Count,
        "a checkpoint is written at every multiple of it",
    ),
];

impl Limit {
    /// The setting as docs/config.md names it: `runtime.threads`, `stages[].size` (`batch`).
    pub fn name(&self) -> String {
        let key = self.key.replace('*', "<op>");
        let list = if self.section == "stages" { "[]" } else { "" };
        match (self.unit, self.kind) {
            (Unit::Entries, _) => format!("`{}` (entries)", self.section),
            (_, Some(kind)) => format!("`{}{list}.{key}` (`{kind}`)", self.section),
            (_, None) => format!("`{}.{key}`", self.section),
        }
    }

    /// The allowed values: `1–16,777,216`, `1 KiB–64 GiB`, `at most 65,536`, `at least 1`,
    /// `0–1,024 (0: one thread per core)`.
    pub fn range(&self) -> String {
        let show = |n: u64| match self.unit {
            Unit::Bytes => bytes(n),
            Unit::Count | Unit::Entries => grouped(n),
        };
        match (self.min, self.max, self.zero) {
            (0, max, Some(zero)) => format!("0–{} (0: {zero})", show(max)),
            (0, max, None) => format!("at most {}", show(max)),
            (min, u64::MAX, _) => format!("at least {}", show(min)),
            (min, max, _) => format!("{}–{}", show(min), show(max)),
        }
    }

    /// Whether `value` is allowed.
    pub fn allows(&self, value: u64) -> bool {
        (self.min..=self.max).contains(&value)
    }

    /// The number a value stands for and how it was written, when it is a number of this
    /// setting's kind (anything else is the typed reading's to report).
    fn read(&self, tree: &Tree) -> Option<(u64, String)> {
        match (self.unit, tree) {
            (_, Tree::Int(v)) => Some((u64::try_from(*v).ok()?, v.to_string())),
            (Unit::Bytes, Tree::Str(s)) => {
                let size: ByteSize = s.parse().ok()?;
                Some((size.as_u64(), s.clone()))
            }
            _ => None,
        }
    }

    /// Checks this setting in `node` (a section, or one stage), named `context` in messages.
    fn apply(
        &self,
        doc: &ConfigDocument,
        node: &Node,
        context: &str,
        errors: &mut Vec<ConfigError>,
    ) {
        if self.unit == Unit::Entries {
            if let Tree::Seq(items) = &node.value
                && !self.allows(items.len() as u64)
            {
                errors.push(doc.error_at(
                    &node.referenced,
                    format!(
                        "`{context}` has {} entries: allowed {}; {}",
                        items.len(),
                        self.range(),
                        self.why
                    ),
                ));
            }
            return;
        }
        let mut found = Vec::new();
        find(node, &segments(self.key), String::new(), &mut found);
        for (key, value) in found {
            let Some((n, shown)) = self.read(&value.value) else {
                continue;
            };
            if !self.allows(n) {
                errors.push(doc.error_at(
                    &value.referenced,
                    format!(
                        "{context}: `{key}: {shown}` is out of range: allowed {}; {}",
                        self.range(),
                        self.why
                    ),
                ));
            }
        }
    }
}

/// `16,777,216`.
fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `64 GiB`, `1 KiB`, `1 byte`: the largest binary unit that divides `n`.
fn bytes(n: u64) -> String {
    for (unit, size) in [("TiB", TIB), ("GiB", GIB), ("MiB", 1 << 20), ("KiB", KIB)] {
        if n >= size && n.is_multiple_of(size) {
            return format!("{} {unit}", grouped(n / size));
        }
    }
    match n {
        1 => "1 byte".to_string(),
        n => format!("{} bytes", grouped(n)),
    }
}

/// The Limits table of docs/config.md.
pub fn markdown_table() -> String {
    let mut out = String::from("| setting | allowed | why |\n|---|---|---|\n");
    for l in LIMITS {
        let _ = writeln!(out, "| {} | {} | {} |", l.name(), l.range(), l.why);
    }
    out
}

/// Checks every setting of [`LIMITS`] in `doc`, with an error at each value out of range.
pub(crate) fn check(doc: &ConfigDocument, errors: &mut Vec<ConfigError>) {
    let Some(root) = read_tree(doc.text()) else {
        // Not readable as YAML values: the other passes say why.
        return;
    };
    let Tree::Map(sections) = &root.value else {
        return;
    };
    for (name, node) in sections {
        for l in LIMITS.iter().filter(|l| l.section == name.as_str()) {
            match (l.kind, &node.value) {
                (None, _) => l.apply(doc, node, name, errors),
                (Some(kind), Tree::Seq(items)) => {
                    for (i, item) in items.iter().enumerate() {
                        if kind_of(item) == Some(kind) {
                            l.apply(doc, item, &format!("{name}[{i}] ({kind})"), errors);
                        }
                    }
                }
                (Some(kind), _) => {
                    if kind_of(node) == Some(kind) {
                        l.apply(doc, node, &format!("{name} ({kind})"), errors);
                    }
                }
            }
        }
    }
}

/// A YAML value with its position, as far as the limits need it.
type Node = Spanned<Tree>;

#[derive(Debug)]
enum Tree {
    Map(Vec<(String, Node)>),
    Seq(Vec<Node>),
    Int(i128),
    Str(String),
    /// Null, a boolean, a float, bytes.
    Other,
}

fn read_tree(text: &str) -> Option<Node> {
    let mut options = serde_saphyr::Options::default();
    // `.nan` and `.inf` are fine values here (`clip`, `fill_null`): do not refuse them.
    options.non_finite_float_policy = serde_saphyr::NonFiniteFloatPolicy::PassThrough;
    serde_saphyr::from_str_with_options::<Node>(text, options).ok()
}

/// A component's `type`.
fn kind_of(node: &Node) -> Option<&str> {
    match &node.value {
        Tree::Map(entries) => entries
            .iter()
            .find_map(|(k, v)| match (&v.value, k.as_str()) {
                (Tree::Str(s), "type") => Some(s.as_str()),
                _ => None,
            }),
        _ => None,
    }
}

enum Seg<'a> {
    Key(&'a str),
    AnyKey,
    Each,
}

fn segments(key: &str) -> Vec<Seg<'_>> {
    let mut out = Vec::new();
    for part in key.split('.').filter(|p| !p.is_empty()) {
        let (name, each) = match part.strip_suffix("[]") {
            Some(name) => (name, true),
            None => (part, false),
        };
        match name {
            "" => {}
            "*" => out.push(Seg::AnyKey),
            name => out.push(Seg::Key(name)),
        }
        if each {
            out.push(Seg::Each);
        }
    }
    out
}

/// The values at `path` below `node`, each with its key path as the config writes it
/// (`ops[0].random_crop.size[1]`).
fn find<'a>(node: &'a Node, path: &[Seg<'_>], trail: String, out: &mut Vec<(String, &'a Node)>) {
    let Some((first, rest)) = path.split_first() else {
        out.push((trail, node));
        return;
    };
    let join = |name: &str| {
        if trail.is_empty() {
            name.to_string()
        } else {
            format!("{trail}.{name}")
        }
    };
    match (first, &node.value) {
        (Seg::Key(key), Tree::Map(entries)) => {
            for (name, value) in entries.iter().filter(|(name, _)| name == key) {
                find(value, rest, join(name), out);
            }
        }
        (Seg::AnyKey, Tree::Map(entries)) => {
            for (name, value) in entries {
                find(value, rest, join(name), out);
            }
        }
        (Seg::Each, Tree::Seq(items)) => {
            for (i, value) in items.iter().enumerate() {
                find(value, rest, format!("{trail}[{i}]"), out);
            }
        }
        _ => {}
    }
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
        f.write_str("any YAML value")
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Tree, E> {
        Ok(Tree::Other)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Tree, E> {
        Ok(Tree::Int(v.into()))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Tree, E> {
        Ok(Tree::Int(v.into()))
    }
    fn visit_i128<E: de::Error>(self, v: i128) -> Result<Tree, E> {
        Ok(Tree::Int(v))
    }
    fn visit_u128<E: de::Error>(self, v: u128) -> Result<Tree, E> {
        Ok(Tree::Int(i128::try_from(v).unwrap_or(i128::MAX)))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Tree, E> {
        Ok(Tree::Other)
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Tree, E> {
        Ok(Tree::Str(v.to_string()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Tree, E> {
        Ok(Tree::Str(v))
    }
    fn visit_bytes<E: de::Error>(self, _: &[u8]) -> Result<Tree, E> {
        Ok(Tree::Other)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Tree, E> {
        Ok(Tree::Other)
    }
    fn visit_none<E: de::Error>(self) -> Result<Tree, E> {
        Ok(Tree::Other)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Tree, D::Error> {
        Tree::deserialize(d)
    }
    fn visit_seq<S: SeqAccess<'de>>(self, mut s: S) -> Result<Tree, S::Error> {
        let mut items = Vec::new();
        while let Some(item) = s.next_element::<Node>()? {
            items.push(item);
        }
        Ok(Tree::Seq(items))
    }
    fn visit_map<M: MapAccess<'de>>(self, mut m: M) -> Result<Tree, M::Error> {
        let mut entries = Vec::new();
        while let Some(key) = m.next_key::<Tree>()? {
            let value = m.next_value::<Node>()?;
            match key {
                Tree::Str(name) => entries.push((name, value)),
                Tree::Int(n) => entries.push((n.to_string(), value)),
                _ => {}
            }
        }
        Ok(Tree::Map(entries))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_read_well() {
        assert_eq!(THREADS.range(), "0–1,024 (0: one thread per core)");
        let find = |key: &str| LIMITS.iter().find(|l| l.key == key).copied();
        assert_eq!(
            find("queue_bytes").map(|l| l.range()).as_deref(),
            Some("1 KiB–64 GiB")
        );
        assert_eq!(
            find("world_size").map(|l| l.range()).as_deref(),
            Some("at most 65,536")
        );
        assert_eq!(
            find("max_rows_per_file").map(|l| l.range()).as_deref(),
            Some("at least 1")
        );
        assert_eq!(
            find("size").map(|l| l.range()).as_deref(),
            Some("1–16,777,216")
        );
        assert_eq!(
            find("size").map(|l| l.name()).as_deref(),
            Some("`stages[].size` (`batch`)")
        );
        assert_eq!(
            find("ops[].*.size[]").map(|l| l.name()).as_deref(),
            Some("`stages[].ops[].<op>.size[]` (`image`)")
        );
        assert_eq!(grouped(0), "0");
        assert_eq!(grouped(999), "999");
        assert_eq!(grouped(1000), "1,000");
        assert_eq!(bytes(1), "1 byte");
        assert_eq!(bytes(1536), "1,536 bytes");
        assert_eq!(bytes(TIB), "1 TiB");
    }

    /// docs/config.md shows the table the code checks.
    #[test]
    fn the_docs_show_this_table() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/config.md");
        let docs = std::fs::read_to_string(path).expect("docs/config.md");
        let table = markdown_table();
        assert!(
            docs.contains(&table),
            "docs/config.md (## Limits) must hold this table:\n{table}"
        );
    }
}
