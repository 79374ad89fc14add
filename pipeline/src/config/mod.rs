//! The pipeline's config model: typed structs for every component. Field doc comments are the
//! reference documentation (`docs/config.md` follows them); defaults are stated there.

mod interpolate;
mod kafka;
pub mod limits;
mod load;

use std::collections::BTreeMap;
use std::fmt;

use bytesize::ByteSize;
use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize};

pub use kafka::{
    Assignment, DeadLetterConfig, DeadLetterFile, DeadLetterKafka, ErrorBudget, HumanDuration,
    KafkaConnection, KafkaFormat, KafkaSourceConfig, Properties, SchemaSpec, StartPosition, Until,
};
pub use load::{Component, ConfigDocument, Located, component_fields};

pub use crate::error::config::{
    ConfigError, ConfigErrors, MAX_MESSAGE_BYTES, MAX_QUOTED_BYTES, MAX_SHOWN_ERRORS, did_you_mean,
};
use crate::types::DataTypeName;
pub use crate::types::Literal;

/// Top-level sections a pipeline file may hold. `sink` is read by the `sluice` binary (crate
/// `sluice-sinks`); the pipeline crate accepts it so one file describes the whole job.
pub const TOP_LEVEL_SECTIONS: &[&str] = &[
    "source",
    "stages",
    "runtime",
    "sink",
    "checkpoint",
    "trainer",
    "loader",
];

/// A whole pipeline: where rows come from and what happens to them.
#[derive(Debug, Clone)]
pub struct PipelineConfig {
    /// Where rows come from.
    pub source: Located<SourceConfig>,
    /// Transformations, applied in order.
    pub stages: Vec<Located<StageConfig>>,
    /// Threads and buffers.
    pub runtime: RuntimeConfig,
}

impl PipelineConfig {
    /// Reads the pipeline sections of a document, collecting every problem. Sections owned by
    /// other crates (`sink`) are accepted but not read here.
    pub fn from_document(doc: &ConfigDocument, errors: &mut Vec<ConfigError>) -> Option<Self> {
        let present = doc.sections(TOP_LEVEL_SECTIONS, errors);
        let source = doc.component::<SourceConfig>("source", errors);
        if source.is_none() && !present.iter().any(|k| k == "source") && errors.is_empty() {
            errors.push(ConfigError::new(
                doc.origin(),
                1,
                1,
                "missing required section `source` (for example `source: {type: parquet, path: data/*.parquet}`)"
                    .to_string(),
            ));
        }
        let stages = doc.component_list::<StageConfig>("stages", errors);
        let runtime = doc
            .value::<RuntimeConfig>("runtime", errors)
            .unwrap_or_default();
        // Every size setting of the file (its other sections' too), before anything runs.
        limits::check(doc, errors);
        Some(PipelineConfig {
            source: source?,
            stages,
            runtime,
        })
    }
}

/// Threads and memory of the pipeline.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RuntimeConfig {
    /// Size of the CPU pool that decodes and transforms batches, at most 1024; `0` means one
    /// per core, as does leaving it out (at most 1024). Default: the number of cores.
    #[serde(default)]
    pub threads: Option<usize>,
    /// Batches transformed concurrently per group of stages (order is preserved). Default:
    /// `threads`.
    #[serde(default)]
    pub parallelism: Option<usize>,
    /// Capacity of each queue between stages, in bytes of Arrow memory (`16 MiB`, `1GB`, or a
    /// number). A single batch larger than this still passes, alone. Default: `16 MiB`.
    #[serde(default = "default_queue_bytes")]
    pub queue_bytes: ByteSize,
    /// This process's rank among the readers of the same source (0-based). Default: from the
    /// environment (`SLUICE_RANK`, `RANK`, `OMPI_COMM_WORLD_RANK`, `PMI_RANK`), else 0.
    #[serde(default)]
    pub rank: Option<usize>,
    /// Number of ranks reading the same source. Default: from the environment
    /// (`SLUICE_WORLD_SIZE`, `WORLD_SIZE`, `OMPI_COMM_WORLD_SIZE`, `PMI_SIZE`), else 1.
    #[serde(default)]
    pub world_size: Option<usize>,
}

impl RuntimeConfig {
    /// `(rank, world_size)`: from the config, else the environment, else `(0, 1)`. Not
    /// checked here (an unusable variable counts as unset): opening the source refuses what
    /// [`RuntimeConfig::checked_rank_and_world`] refuses.
    pub fn rank_and_world(&self) -> (usize, usize) {
        let (rank, world) = self.configured_or_env();
        (
            rank.ok().flatten().unwrap_or(0),
            world.ok().flatten().unwrap_or(1),
        )
    }

    /// [`RuntimeConfig::rank_and_world`], refusing what would make a run read the wrong rows:
    /// an environment variable that is set but not a whole number (the first one set decides:
    /// a typo in `SLUICE_WORLD_SIZE` is not passed over for `WORLD_SIZE`), a rank that is not
    /// below the world size (so a world size of 0), and a world size over 65,536.
    pub fn checked_rank_and_world(&self) -> Result<(usize, usize), String> {
        let (rank, world) = self.configured_or_env();
        let (rank, world) = (rank?.unwrap_or(0), world?.unwrap_or(1));
        if rank >= world {
            return Err(format!(
                "rank {rank} is not below world_size {world} (`runtime.rank`/`world_size`, else SLUICE_RANK/RANK/OMPI_COMM_WORLD_RANK/PMI_RANK and SLUICE_WORLD_SIZE/WORLD_SIZE/OMPI_COMM_WORLD_SIZE/PMI_SIZE): ranks are numbered 0 to world_size − 1"
            ));
        }
        if world > MAX_WORLD_SIZE {
            return Err(format!(
                "world size {world} is out of range: allowed 1–{MAX_WORLD_SIZE} (`runtime.world_size`, else SLUICE_WORLD_SIZE/WORLD_SIZE/OMPI_COMM_WORLD_SIZE/PMI_SIZE)"
            ));
        }
        Ok((rank, world))
    }

    /// The rank and world size as configured, else from the first environment variable set.
    #[allow(clippy::type_complexity)]
    fn configured_or_env(&self) -> (Result<Option<usize>, String>, Result<Option<usize>, String>) {
        fn env(names: &[&str]) -> Result<Option<usize>, String> {
            let Some((name, value)) = names
                .iter()
                .find_map(|n| std::env::var(n).ok().map(|v| (n, v)))
            else {
                return Ok(None);
            };
            value.trim().parse().map(Some).map_err(|_| {
                format!("the environment variable {name}={value:?} is not a whole number; set it to this process's number (or unset it)")
            })
        }
        let rank = match self.rank {
            Some(r) => Ok(Some(r)),
            None => env(&["SLUICE_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"]),
        };
        let world = match self.world_size {
            Some(w) => Ok(Some(w)),
            None => env(&[
                "SLUICE_WORLD_SIZE",
                "WORLD_SIZE",
                "OMPI_COMM_WORLD_SIZE",
                "PMI_SIZE",
            ]),
        };
        (rank, world)
    }
}

/// The most ranks a pipeline may be split over (every rank plans the shares of all ranks).
pub const MAX_WORLD_SIZE: usize = 65_536;

/// 16 MiB: on the CIFAR-style bench, 4, 8, 16 and 32 MiB queues ran equally fast (within
/// this machine's noise) while each doubling added ~30 MiB of peak RSS.
fn default_queue_bytes() -> ByteSize {
    ByteSize::mib(16)
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            threads: None,
            parallelism: None,
            queue_bytes: default_queue_bytes(),
            rank: None,
            world_size: None,
        }
    }
}

/// Where rows come from (`type:` selects the kind).
#[derive(Debug, Clone, PartialEq)]
pub enum SourceConfig {
    /// Parquet files (`type: parquet`).
    Parquet(ParquetSourceConfig),
    /// Kafka topics (`type: kafka`).
    Kafka(KafkaSourceConfig),
}

impl SourceConfig {
    /// The `type` name.
    pub fn kind(&self) -> &'static str {
        match self {
            SourceConfig::Parquet(_) => "parquet",
            SourceConfig::Kafka(_) => "kafka",
        }
    }

    /// Passes over the data: a Parquet source's `epochs` (at least 1); a Kafka stream is one.
    pub fn epochs(&self) -> u64 {
        match self {
            SourceConfig::Parquet(p) => p.epochs.max(1),
            SourceConfig::Kafka(_) => 1,
        }
    }
}

impl Component for SourceConfig {
    const WHAT: &'static str = "source";
    const KINDS: &'static [&'static str] = &["parquet", "kafka"];
    fn deserialize_kind<'de, D: Deserializer<'de>>(kind: &str, d: D) -> Result<Self, D::Error> {
        match kind {
            "parquet" => ParquetSourceConfig::deserialize(d).map(SourceConfig::Parquet),
            "kafka" => KafkaSourceConfig::deserialize(d).map(SourceConfig::Kafka),
            other => Err(de::Error::unknown_variant(other, Self::KINDS)),
        }
    }
}

/// `type: parquet` — one or more Parquet files.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ParquetSourceConfig {
    /// A path, URL (`file://`, `s3://`, `gs://`, `az://`, `abfs(s)://`, `http(s)://`), glob
    /// (`data/*.parquet`, `s3://b/train/**/part-*.parquet`) or prefix, or a list of them.
    /// Relative paths resolve against the config file's directory. Files are read in sorted
    /// order. Exactly one of `path` and `manifest`.
    #[serde(default)]
    pub path: Option<OneOrMany>,
    /// A JSON manifest listing the files instead of `path`, so no listing is needed:
    /// `{"files": [{"path": "part-0.parquet", "size": 1234, "rows": 100}, …]}`. Paths are
    /// relative to the manifest's location; `size` (bytes) saves a HEAD request per file;
    /// `rows`, when given, is checked against the file's footer.
    #[serde(default)]
    pub manifest: Option<String>,
    /// How to reach the object store: options and retry budget.
    #[serde(default)]
    pub storage: crate::storage::StorageConfig,
    /// Columns to read (projection); default: all. Order of the output follows this list.
    #[serde(default)]
    pub columns: Option<Vec<String>>,
    /// Maximum rows per decoded batch. Default: 8192.
    #[serde(default = "default_batch_rows")]
    pub batch_rows: usize,
    /// Row groups fetched and decoded ahead, across files. Default: 4.
    #[serde(default = "default_prefetch")]
    pub prefetch: usize,
    /// Memory the row groups in flight may take (`256 MiB`), estimated from the footers as
    /// the bytes fetched plus the bytes decoded: fewer than `prefetch` row groups are read
    /// ahead when they are large, and one larger than this is read alone. Default: 256 MiB.
    #[serde(default = "default_prefetch_bytes")]
    pub prefetch_bytes: ByteSize,
    /// Passes over the files. Default: 1.
    #[serde(default = "default_epochs")]
    pub epochs: u64,
    /// How rows are split between ranks (`runtime.world_size` > 1) so that every rank gets
    /// the same number of rows, hence batches, in every epoch (decided from the footers
    /// before reading): `redistribute` (default: the epoch's row sequence cut into equal
    /// contiguous ranges; at most `world_size - 1` rows per epoch left out), `drop_last`
    /// (whole row groups dealt round-robin, every rank cut to the smallest share) or `pad`
    /// (row groups dealt round-robin, shorter ranks repeat their own rows up to the largest
    /// share).
    #[serde(default)]
    pub shard: ShardPolicy,
    /// `hive`: each `key=value` directory in a file's path (`…/year=2024/lang=en/part-0.parquet`)
    /// becomes a `utf8` column `key` holding `value` (percent-decoded; null for
    /// `__HIVE_DEFAULT_PARTITION__`) in every row of the file, after the file's own columns or
    /// where `columns` lists it (`cast` it to a number if need be). Every file must have the
    /// same keys. Default: `none` (the paths add nothing).
    #[serde(default)]
    pub partitioning: Partitioning,
    /// Types of partition columns (`{year: int32, day: date32}`), the `cast` type names; the
    /// others stay `utf8`. A directory value that is not of its type stops the run naming the
    /// file. Needs `partitioning: hive`.
    #[serde(default)]
    pub partition_types: BTreeMap<String, crate::types::DataTypeName>,
    /// Mixes the datasets of a `path` list in set proportions, every epoch a new sample of
    /// the larger ones; see [`Mix`]. Default: none (every row of every file, each epoch).
    #[serde(default)]
    pub mix: Option<Mix>,
}

/// `mix` of a Parquet source: each `path` entry is a dataset, and every epoch takes
/// `weights[i] / Σ weights` of its rows from entry `i` — without repeating a row within an
/// epoch. Which rows: a seeded permutation of the entry's row groups is read as a cycle,
/// each epoch taking the next rows of it, so every row of a sampled dataset comes once
/// before any comes again.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Mix {
    /// One positive weight per `path` entry, in the same order.
    pub weights: Vec<f64>,
    /// Rows of an epoch. Default: the most the weights allow without repeating a row (the
    /// entry with the fewest rows per unit of weight is read whole).
    #[serde(default)]
    pub rows_per_epoch: Option<u64>,
    /// Seed of the row-group permutations the samples are taken from. Default: 0.
    #[serde(default)]
    pub seed: u64,
}

/// What a Parquet source reads from its files' paths; see [`ParquetSourceConfig::partitioning`].
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Partitioning {
    /// Nothing.
    #[default]
    None,
    /// `key=value` directories as columns.
    Hive,
}

/// How a Parquet source splits an epoch between ranks; see [`ParquetSourceConfig::shard`].
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ShardPolicy {
    /// Equal contiguous row ranges.
    #[default]
    Redistribute,
    /// Row groups round-robin, cut to the smallest share.
    DropLast,
    /// Row groups round-robin, padded to the largest share.
    Pad,
}

impl ShardPolicy {
    /// The name the config uses.
    pub fn name(self) -> &'static str {
        match self {
            ShardPolicy::Redistribute => "redistribute",
            ShardPolicy::DropLast => "drop_last",
            ShardPolicy::Pad => "pad",
        }
    }
}

fn default_batch_rows() -> usize {
    8192
}
fn default_prefetch() -> usize {
    4
}
fn default_prefetch_bytes() -> ByteSize {
    ByteSize::mib(256)
}
fn default_epochs() -> u64 {
    1
}

/// A string or a list of strings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OneOrMany(pub Vec<String>);

impl<'de> Deserialize<'de> for OneOrMany {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = OneOrMany;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a path or a list of paths")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<OneOrMany, E> {
                Ok(OneOrMany(vec![v.to_string()]))
            }
            fn visit_seq<S: de::SeqAccess<'de>>(self, mut s: S) -> Result<OneOrMany, S::Error> {
                let mut out = Vec::new();
                while let Some(v) = s.next_element::<String>()? {
                    out.push(v);
                }
                if out.is_empty() {
                    return Err(de::Error::invalid_length(0, &"at least one path"));
                }
                Ok(OneOrMany(out))
            }
        }
        d.deserialize_any(V)
    }
}

// The settings that decide the order are stamped into checkpoints as JSON of their effective
// values (see `exec::stamp`), so every config type serializes, in the form its YAML takes.
impl Serialize for OneOrMany {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl Serialize for PadFill {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl Serialize for EraseValue {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            EraseValue::Values(v) => v.serialize(s),
            EraseValue::Random => s.serialize_str("random"),
        }
    }
}

/// A transformation (`type:` selects the kind). Stages run in order; stateless ones run on the
/// CPU pool, several batches at a time, with the order of rows preserved. (Serialized as its
/// settings alone, without `type`: for the resume stamp.)
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum StageConfig {
    /// Keep only these columns, in this order.
    Select(SelectConfig),
    /// Rename columns.
    Rename(RenameConfig),
    /// Change column types.
    Cast(CastConfig),
    /// Keep rows for which a predicate is true.
    Filter(FilterConfig),
    /// Replace nulls with a value.
    FillNull(FillNullConfig),
    /// `(x - mean) / std`.
    Standardize(StandardizeConfig),
    /// Class index → one-hot vector.
    OneHot(OneHotConfig),
    /// Bound values to `[min, max]`.
    Clip(ClipConfig),
    /// Re-batch to a fixed number of rows.
    Batch(BatchConfig),
    /// Add seeded Gaussian noise.
    GaussianNoise(GaussianNoiseConfig),
    /// Zero values at random (seeded).
    FeatureDropout(FeatureDropoutConfig),
    /// Seeded shuffle: row-group order per epoch, a window buffer, optionally across ranks.
    Shuffle(ShuffleConfig),
    /// Decode and augment images into float32 CHW tensors.
    Image(ImageConfig),
    /// Seeded random token masking of integer sequences.
    MaskTokens(MaskTokensConfig),
    /// Seeded mixup: each row blended with its mirror row of the batch.
    Mixup(MixupConfig),
}

impl StageConfig {
    /// Whether the stage's output has its input's columns and types (only nullability may
    /// change): checking can go on past such a stage when it could not be built.
    pub fn keeps_columns(&self) -> bool {
        matches!(
            self,
            StageConfig::Filter(_)
                | StageConfig::FillNull(_)
                | StageConfig::Clip(_)
                | StageConfig::Batch(_)
                | StageConfig::GaussianNoise(_)
                | StageConfig::FeatureDropout(_)
                | StageConfig::Mixup(_)
        )
    }

    /// The stage's `type` name.
    pub fn kind(&self) -> &'static str {
        match self {
            StageConfig::Select(_) => "select",
            StageConfig::Rename(_) => "rename",
            StageConfig::Cast(_) => "cast",
            StageConfig::Filter(_) => "filter",
            StageConfig::FillNull(_) => "fill_null",
            StageConfig::Standardize(_) => "standardize",
            StageConfig::OneHot(_) => "one_hot",
            StageConfig::Clip(_) => "clip",
            StageConfig::Batch(_) => "batch",
            StageConfig::GaussianNoise(_) => "gaussian_noise",
            StageConfig::FeatureDropout(_) => "feature_dropout",
            StageConfig::Shuffle(_) => "shuffle",
            StageConfig::Image(_) => "image",
            StageConfig::MaskTokens(_) => "mask_tokens",
            StageConfig::Mixup(_) => "mixup",
        }
    }

    /// How the run summary names the rows this stage removes: a `filter`'s are filtered out,
    /// a `batch`'s are the tails `drop_last` drops, an `image` stage's are bad images it
    /// skipped (`on_error: skip`) — data to look at, not a choice of the pipeline.
    pub fn removed_as(&self) -> &'static str {
        match self {
            StageConfig::Filter(_) => "filtered out",
            StageConfig::Batch(_) => "dropped by drop_last",
            StageConfig::Image(_) => "bad images skipped (on_error: skip)",
            _ => "removed",
        }
    }

    /// Whether the stage can remove rows (`filter`, `image` with `on_error: skip`): what the
    /// stage-order rules, the plan stamp and the equal-counts warning look for.
    pub fn removes_rows(&self) -> bool {
        match self {
            StageConfig::Filter(_) => true,
            StageConfig::Image(c) => c.on_error == OnError::Skip,
            _ => false,
        }
    }
}

impl Component for StageConfig {
    const WHAT: &'static str = "stage";
    const KINDS: &'static [&'static str] = &[
        "select",
        "rename",
        "cast",
        "filter",
        "fill_null",
        "standardize",
        "one_hot",
        "clip",
        "batch",
        "gaussian_noise",
        "feature_dropout",
        "shuffle",
        "image",
        "mask_tokens",
        "mixup",
    ];
    fn deserialize_kind<'de, D: Deserializer<'de>>(kind: &str, d: D) -> Result<Self, D::Error> {
        Ok(match kind {
            "select" => StageConfig::Select(SelectConfig::deserialize(d)?),
            "rename" => StageConfig::Rename(RenameConfig::deserialize(d)?),
            "cast" => StageConfig::Cast(CastConfig::deserialize(d)?),
            "filter" => StageConfig::Filter(FilterConfig::deserialize(d)?),
            "fill_null" => StageConfig::FillNull(FillNullConfig::deserialize(d)?),
            "standardize" => StageConfig::Standardize(StandardizeConfig::deserialize(d)?),
            "one_hot" => StageConfig::OneHot(OneHotConfig::deserialize(d)?),
            "clip" => StageConfig::Clip(ClipConfig::deserialize(d)?),
            "batch" => StageConfig::Batch(BatchConfig::deserialize(d)?),
            "gaussian_noise" => StageConfig::GaussianNoise(GaussianNoiseConfig::deserialize(d)?),
            "feature_dropout" => StageConfig::FeatureDropout(FeatureDropoutConfig::deserialize(d)?),
            "shuffle" => StageConfig::Shuffle(ShuffleConfig::deserialize(d)?),
            "image" => StageConfig::Image(ImageConfig::deserialize(d)?),
            "mask_tokens" => StageConfig::MaskTokens(MaskTokensConfig::deserialize(d)?),
            "mixup" => StageConfig::Mixup(MixupConfig::deserialize(d)?),
            other => return Err(de::Error::unknown_variant(other, Self::KINDS)),
        })
    }
}

/// `type: select`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SelectConfig {
    /// Columns to keep, in output order.
    pub columns: Vec<String>,
}

/// `type: rename`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RenameConfig {
    /// `old_name: new_name` pairs.
    pub columns: BTreeMap<String, String>,
}

/// `type: cast`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CastConfig {
    /// `column: type` pairs. Types: `bool`, `int8`…`int64`, `uint8`…`uint64`, `float16`,
    /// `float32`, `float64`, `string`, `large_string`, `binary`, `date32`, `timestamp_ms`,
    /// `timestamp_us`. For a list column a scalar type applies to its elements. A value that
    /// cannot be converted stops the run with the column, value and row named.
    pub columns: BTreeMap<String, DataTypeName>,
}

/// `type: filter`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FilterConfig {
    /// A SQL boolean expression over columns, e.g.
    /// `label < 5 AND (weight IS NULL OR weight > 0.5)`. Supported: comparisons, `AND`/`OR`/`NOT`, `IS [NOT] NULL`, `[NOT] IN (…)`,
    /// `[NOT] BETWEEN … AND …`, `+ - * / %`, parentheses, number/string/boolean literals.
    /// Rows where it is false or NULL are removed (and counted in the run summary).
    pub predicate: String,
}

/// `type: fill_null`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FillNullConfig {
    /// `column: value` pairs; the value is converted to the column's type.
    pub columns: BTreeMap<String, Literal>,
}

/// `type: standardize`. A NaN stays NaN and ±inf stays ±inf (`(x - mean) / std`), a null
/// stays null.
#[derive(Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct StandardizeConfig {
    /// Numeric columns (or lists of numbers, standardized element-wise with one mean/std per
    /// column). Output is float32 (float64 stays float64).
    pub columns: Vec<String>,
    /// Mean to subtract. When `mean` and `std` are both absent, each column's mean and
    /// standard deviation are computed in a first pass over the source (through the stages
    /// before this one) and reported in the run summary.
    #[serde(default)]
    pub mean: Option<f64>,
    /// Standard deviation to divide by; must be > 0. A computed std of 0 becomes 1.
    #[serde(default)]
    pub std: Option<f64>,
    /// What the first pass computing `mean` and `std` does with a NaN or ±inf value (nulls
    /// are always left out). Absent means [`NonFinite::Error`]; only allowed when the
    /// statistics are computed.
    #[serde(default)]
    pub non_finite: Option<NonFinite>,
}

// Written by hand so that `non_finite` appears only when set: the resume stamp hashes a
// stage's `Debug` text (`Pipeline::order_settings`, for stages before a `shuffle`), and the
// text of a config without the key must stay what it was before the key existed, or every
// checkpoint taken by an older Sluice would be refused. (The key moves no row anyway.)
impl fmt::Debug for StandardizeConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("StandardizeConfig");
        d.field("columns", &self.columns)
            .field("mean", &self.mean)
            .field("std", &self.std);
        if let Some(n) = &self.non_finite {
            d.field("non_finite", n);
        }
        d.finish()
    }
}

/// What computing `standardize` statistics does with a NaN or ±inf value.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum NonFinite {
    /// Stop the run at the first one, naming its row (file, row group, row) — the default:
    /// a single NaN would otherwise make the mean, and so every output value, NaN.
    #[default]
    Error,
    /// Leave it out of the mean and standard deviation, and report how many were left out
    /// (and where the first was) in the run summary. The value itself stays NaN or ±inf in
    /// the output.
    Skip,
}

/// `type: one_hot`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OneHotConfig {
    /// An integer column of class indices in `0..num_classes`.
    pub column: String,
    /// Number of classes (vector length).
    pub num_classes: usize,
    /// Name of the output column (a fixed-size list of float32). Default: replace `column`.
    #[serde(default)]
    pub output: Option<String>,
    /// Label smoothing ε in `[0, 1)`: the class gets `1 - ε + ε/num_classes`, every other
    /// entry `ε/num_classes`. Default: 0 (plain one-hot).
    #[serde(default)]
    pub smoothing: f64,
}

/// `type: clip`. As numpy's and torch's `clip`: NaN stays NaN, `-inf`/`+inf` become the
/// bounds, a null stays null.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ClipConfig {
    /// Numeric columns (or lists of numbers, clipped element-wise).
    pub columns: Vec<String>,
    /// Lower bound (optional; a number, not NaN).
    #[serde(default)]
    pub min: Option<f64>,
    /// Upper bound (optional; a number, not NaN).
    #[serde(default)]
    pub max: Option<f64>,
}

/// `type: batch`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct BatchConfig {
    /// Rows per output batch.
    pub size: usize,
    /// Drop the short final batch instead of emitting it (the dropped rows are counted in the
    /// run summary). Default: false.
    #[serde(default)]
    pub drop_last: bool,
}

/// `type: gaussian_noise` — adds `std · N(0, 1)` to every value. Each draw is a pure function
/// of (seed, stage, column, epoch, row identity from lineage): the same row gets the same noise
/// for any thread count or batching, and new noise each epoch.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GaussianNoiseConfig {
    /// float32/float64 columns, or fixed-size lists of them (noise per element).
    pub columns: Vec<String>,
    /// Standard deviation of the noise; ≥ 0.
    pub std: f64,
    /// Seed. Default: 0.
    #[serde(default)]
    pub seed: u64,
}

/// `type: feature_dropout` — sets each value to 0 with probability `p` (seeded like
/// `gaussian_noise`).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FeatureDropoutConfig {
    /// float32/float64 columns, or fixed-size lists of them (dropout per element).
    pub columns: Vec<String>,
    /// Probability of zeroing a value, in `[0, 1)`.
    pub p: f64,
    /// Multiply kept values by `1 / (1 - p)` (inverted dropout), keeping the expected value.
    /// Default: false.
    #[serde(default)]
    pub scale: bool,
    /// Seed. Default: 0.
    #[serde(default)]
    pub seed: u64,
}

/// `type: mixup` — blends each row of a batch with its mirror row (row `i` with row
/// `n - 1 - i` of a batch of `n`): `x' = λ·x_i + (1 - λ)·x_mirror` for every listed column,
/// with one `λ ~ Beta(alpha, alpha)` per row, drawn from the row's identity like
/// `gaussian_noise` (seed, stage, epoch, lineage). List the one-hot label column (from
/// `one_hot`) with the features so the targets are blended by the same `λ`. Must come after
/// the last `batch` stage: the batch decides the pairs, and a resumed run cuts the same
/// batches only there.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MixupConfig {
    /// float32/float64 columns, or fixed-size lists of them; blended with the same `λ`.
    pub columns: Vec<String>,
    /// Beta distribution parameter, > 0 (0.2–0.4 typical; small values keep rows nearly
    /// intact, 1 draws `λ` uniformly).
    pub alpha: f64,
    /// Seed. Default: 0.
    #[serde(default)]
    pub seed: u64,
    /// CutMix (Yun et al., 2019) instead of the blend for a share `p` of the rows (timm's
    /// `switch_prob`): a box of the mirror row's image is pasted into the row's image, and the
    /// other columns are blended by the share of the image left (`λ` corrected for clipping).
    #[serde(default)]
    pub cutmix: Option<CutmixConfig>,
}

/// `mixup.cutmix` — see [`MixupConfig::cutmix`].
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CutmixConfig {
    /// The image column (one of the mixup `columns`): fixed-size lists of float32/float64
    /// laid out channel-first as `shape`.
    pub column: String,
    /// `[channels, height, width]` of each image (the `image` stage's output is CHW).
    pub shape: [usize; 3],
    /// Beta parameter of the pasted share, > 0. Default: 1 (timm's default).
    #[serde(default = "default_cutmix_alpha")]
    pub alpha: f64,
    /// Probability that a row gets CutMix instead of the blend, in `[0, 1]`. Default: 0.5
    /// (timm's `switch_prob`).
    #[serde(default = "default_cutmix_p")]
    pub p: f64,
}

fn default_cutmix_alpha() -> f64 {
    1.0
}

fn default_cutmix_p() -> f64 {
    0.5
}

/// `type: shuffle` — a seeded shuffle in up to three levels: (1) the order of row groups is
/// permuted per epoch (`row_groups`), (2) rows are permuted within windows of `buffer_rows`
/// consecutive rows, drawn from every row group the window spans; a window larger than
/// `max_memory` is cut into shuffled runs spilled to disk as zstd Arrow IPC and merged back
/// in a random order (still a uniform permutation of the window), and (3) with
/// `across_ranks`, each window is dealt out evenly to all ranks through the collective.
/// Everything is a function of (seed, epoch, window): output is identical for any thread
/// count and is resumed exactly.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ShuffleConfig {
    /// Rows per shuffle window. Default: 16384.
    #[serde(default = "default_shuffle_rows")]
    pub buffer_rows: usize,
    /// Memory the window may hold before spilling (`256 MiB`). Default: 256 MiB.
    #[serde(default = "default_shuffle_memory")]
    pub max_memory: ByteSize,
    /// Where spilled runs go. Default: the system temporary directory.
    #[serde(default)]
    pub spill_dir: Option<String>,
    /// Seed. Default: 0.
    #[serde(default)]
    pub seed: u64,
    /// Also permute the order of row groups each epoch (Parquet). Default: true.
    #[serde(default = "default_true")]
    pub row_groups: bool,
    /// Exchange rows between ranks (needs a collective: `sluice train`, or
    /// `Pipeline::with_collective`). Default: false.
    #[serde(default)]
    pub across_ranks: bool,
    /// Rows per output batch. Default: 1024.
    #[serde(default = "default_shuffle_batch")]
    pub batch_rows: usize,
    /// Batches of rows of similar length for the `batch` stage after the shuffle (less
    /// padding for variable-length sequences). Default: off.
    #[serde(default)]
    pub group_by_length: Option<GroupByLength>,
}

/// `group_by_length` of a shuffle, like torchdata's `bucketbatch`: the shuffled window is cut
/// into groups of `batches × size` rows (`size`: the `batch` stage after the shuffle); each
/// group is sorted by the length of `column` (longest first, ties in shuffled order), cut
/// into batches of `size`, and those batches leave in a seeded random order.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GroupByLength {
    /// A variable-length column: a list (its length) or a string/binary column (bytes).
    pub column: String,
    /// Batches per group: more gives batches of closer lengths, fewer mixes lengths more
    /// often. Default: 100.
    #[serde(default = "default_group_batches")]
    pub batches: usize,
}

fn default_group_batches() -> usize {
    100
}

fn default_shuffle_rows() -> usize {
    16384
}
fn default_shuffle_memory() -> ByteSize {
    ByteSize::mib(256)
}
fn default_shuffle_batch() -> usize {
    1024
}
fn default_true() -> bool {
    true
}

/// How image bytes are stored.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ImageFormat {
    /// Raw interleaved HWC `uint8` pixels of the declared `shape`.
    #[default]
    Raw,
    /// PNG.
    Png,
    /// JPEG.
    Jpeg,
    /// PNG or JPEG, by magic bytes.
    Auto,
}

/// What `random_crop`'s padding holds (torchvision's `padding_mode`), for an image row
/// `a b c d`, padded by 2 on the left.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum PaddingMode {
    /// Zeros: `0 0 | a b c d`.
    #[default]
    Constant,
    /// The edge pixel repeated: `a a | a b c d`.
    Edge,
    /// Mirrored without repeating the edge: `c b | a b c d`.
    Reflect,
    /// Mirrored, repeating the edge: `b a | a b c d`.
    Symmetric,
}

impl PaddingMode {
    /// The source index (of `n`) that position `i` reads under this mode; `None` when it is
    /// constant padding. Beyond one image width the pattern repeats (as numpy's `pad`).
    pub(crate) fn index(self, i: i64, n: usize) -> Option<usize> {
        let n_i = n as i64;
        if (0..n_i).contains(&i) {
            return Some(i as usize);
        }
        let j = match self {
            PaddingMode::Constant => return None,
            PaddingMode::Edge => i.clamp(0, n_i - 1),
            PaddingMode::Reflect if n == 1 => 0,
            PaddingMode::Reflect => {
                let m = i.rem_euclid(2 * (n_i - 1));
                if m < n_i { m } else { 2 * (n_i - 1) - m }
            }
            PaddingMode::Symmetric => {
                let m = i.rem_euclid(2 * n_i);
                if m < n_i { m } else { 2 * n_i - 1 - m }
            }
        };
        Some(j as usize)
    }
}

/// `random_crop`'s `fill`: one value per channel (a single number is used for every channel).
#[derive(Debug, Clone, PartialEq)]
pub struct PadFill(pub Vec<f32>);

impl Default for PadFill {
    fn default() -> Self {
        PadFill(vec![0.0])
    }
}

impl<'de> Deserialize<'de> for PadFill {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = PadFill;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a pixel value (0–255) or a list of them, one per channel")
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> std::result::Result<PadFill, E> {
                Ok(PadFill(vec![v as f32]))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> std::result::Result<PadFill, E> {
                Ok(PadFill(vec![v as f32]))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> std::result::Result<PadFill, E> {
                Ok(PadFill(vec![v as f32]))
            }
            fn visit_seq<A: de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> std::result::Result<PadFill, A::Error> {
                let mut v = Vec::new();
                while let Some(x) = seq.next_element::<f32>()? {
                    v.push(x);
                }
                Ok(PadFill(v))
            }
        }
        d.deserialize_any(V)
    }
}

/// What the `image` stage does with a row it cannot decode.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum OnError {
    /// Stop the run, naming the row (file, row group, row).
    #[default]
    Fail,
    /// Drop the row, count it, and log its lineage and the reason (`records_bad`).
    Skip,
}

/// One augmentation step of an `image` stage. The stage applies them in phases — geometry
/// (a crop or resize, flips), colour (`color_jitter`, then `random_grayscale`), `normalize`,
/// `random_erasing` — and `ops` must list them in that order ([`ImageOp::phase`]).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub enum ImageOp {
    /// Pad every side with `padding` pixels (`padding_mode`), then cut a random `size` window.
    RandomCrop {
        /// Output `[height, width]`.
        size: [usize; 2],
        /// Padding on each side. Default: 0.
        #[serde(default)]
        padding: usize,
        /// What the padding holds. Default: `constant` (`fill`).
        #[serde(default)]
        padding_mode: PaddingMode,
        /// Pad an image smaller than `size` (after `padding`) up to it: by the shortfall on
        /// both sides of that axis, like torchvision's `pad_if_needed`. Default: false (such
        /// an image is an error).
        #[serde(default)]
        pad_if_needed: bool,
        /// What `constant` padding holds, in pixel values (0–255): one number, or one per
        /// channel (torchvision's `fill`). Default: 0.
        #[serde(default)]
        fill: PadFill,
    },
    /// Cut a random area (fraction `scale` of the image, aspect ratio in `ratio`), resize
    /// (bilinear) to `size`.
    RandomResizedCrop {
        /// Output `[height, width]`.
        size: [usize; 2],
        /// Area fraction range. Default: [0.08, 1.0].
        #[serde(default = "default_scale")]
        scale: [f64; 2],
        /// Aspect ratio range (width / height). Default: [3/4, 4/3].
        #[serde(default = "default_ratio")]
        ratio: [f64; 2],
    },
    /// Cut the centre `size` window, zero-padded where it is larger than the image (like
    /// torchvision's `CenterCrop`): the deterministic crop, for evaluation.
    CenterCrop {
        /// Output `[height, width]`.
        size: [usize; 2],
    },
    /// Resize the whole image (bilinear) to `size`.
    Resize {
        /// Output `[height, width]`.
        size: [usize; 2],
    },
    /// Mirror left-right with probability `p` (default 0.5).
    HorizontalFlip {
        /// Probability. Default: 0.5.
        #[serde(default = "default_half")]
        p: f64,
    },
    /// Mirror top-bottom with probability `p` (default 0.5).
    VerticalFlip {
        /// Probability. Default: 0.5.
        #[serde(default = "default_half")]
        p: f64,
    },
    /// Random brightness/contrast/saturation factors in `[1 - x, 1 + x]`, and a hue shift in
    /// `[-hue, hue]` (a fraction of the colour wheel).
    ColorJitter {
        /// Default: 0.
        #[serde(default)]
        brightness: f64,
        /// Default: 0.
        #[serde(default)]
        contrast: f64,
        /// Default: 0.
        #[serde(default)]
        saturation: f64,
        /// In `[0, 0.5]`. Default: 0.
        #[serde(default)]
        hue: f64,
    },
    /// Grey with probability `p` (default 0.1): every channel becomes the luma
    /// `0.299 R + 0.587 G + 0.114 B`, like torchvision's `RandomGrayscale`.
    RandomGrayscale {
        /// Probability. Default: 0.1.
        #[serde(default = "default_grayscale_p")]
        p: f64,
    },
    /// `(pixel / 255 - mean[c]) / std[c]` per channel.
    Normalize {
        /// Per-channel mean (of values scaled to [0, 1]).
        mean: Vec<f64>,
        /// Per-channel standard deviation.
        std: Vec<f64>,
    },
    /// With probability `p`, set a random box of the output (area fraction in `scale`, aspect
    /// ratio height / width in `ratio`) to `value` in every channel, like torchvision's
    /// `RandomErasing` after `Normalize` (Zhong et al., 2020). Must be the last op.
    RandomErasing {
        /// Probability. Default: 0.5.
        #[serde(default = "default_half")]
        p: f64,
        /// Area fraction range. Default: [0.02, 0.33].
        #[serde(default = "default_erase_scale")]
        scale: [f64; 2],
        /// Aspect ratio range (height / width). Default: [0.3, 3.3].
        #[serde(default = "default_erase_ratio")]
        ratio: [f64; 2],
        /// What the box holds, in the output's units (after `normalize`: 0 is the mean): one
        /// value, one per channel, or `random` (standard normal noise per value, like
        /// torchvision's `value='random'`). Default: 0.
        #[serde(default)]
        value: EraseValue,
    },
}

impl ImageOp {
    /// The op's name in the config.
    pub fn name(&self) -> &'static str {
        match self {
            ImageOp::RandomCrop { .. } => "random_crop",
            ImageOp::RandomResizedCrop { .. } => "random_resized_crop",
            ImageOp::CenterCrop { .. } => "center_crop",
            ImageOp::Resize { .. } => "resize",
            ImageOp::HorizontalFlip { .. } => "horizontal_flip",
            ImageOp::VerticalFlip { .. } => "vertical_flip",
            ImageOp::ColorJitter { .. } => "color_jitter",
            ImageOp::RandomGrayscale { .. } => "random_grayscale",
            ImageOp::Normalize { .. } => "normalize",
            ImageOp::RandomErasing { .. } => "random_erasing",
        }
    }

    /// When the stage applies the op: 0 geometry (the window is cut and flipped while the
    /// pixels are sampled), 1 `color_jitter`, 2 `random_grayscale` (both on the cut window,
    /// padding included), 3 `normalize`, 4 `random_erasing` (on the finished output).
    pub fn phase(&self) -> u8 {
        match self {
            ImageOp::RandomCrop { .. }
            | ImageOp::RandomResizedCrop { .. }
            | ImageOp::CenterCrop { .. }
            | ImageOp::Resize { .. }
            | ImageOp::HorizontalFlip { .. }
            | ImageOp::VerticalFlip { .. } => 0,
            ImageOp::ColorJitter { .. } => 1,
            ImageOp::RandomGrayscale { .. } => 2,
            ImageOp::Normalize { .. } => 3,
            ImageOp::RandomErasing { .. } => 4,
        }
    }
}

/// What `random_erasing` writes into its box.
#[derive(Debug, Clone, PartialEq)]
pub enum EraseValue {
    /// One value per channel (a single number is used for every channel).
    Values(Vec<f32>),
    /// Standard normal noise, one draw per erased value.
    Random,
}

impl Default for EraseValue {
    fn default() -> Self {
        EraseValue::Values(vec![0.0])
    }
}

impl<'de> Deserialize<'de> for EraseValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = EraseValue;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a number, a list of numbers (one per channel), or `random`")
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> std::result::Result<EraseValue, E> {
                Ok(EraseValue::Values(vec![v as f32]))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> std::result::Result<EraseValue, E> {
                Ok(EraseValue::Values(vec![v as f32]))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> std::result::Result<EraseValue, E> {
                Ok(EraseValue::Values(vec![v as f32]))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<EraseValue, E> {
                match v {
                    "random" => Ok(EraseValue::Random),
                    other => Err(E::invalid_value(de::Unexpected::Str(other), &self)),
                }
            }
            fn visit_seq<A: de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> std::result::Result<EraseValue, A::Error> {
                let mut v = Vec::new();
                while let Some(x) = seq.next_element::<f32>()? {
                    v.push(x);
                }
                Ok(EraseValue::Values(v))
            }
        }
        d.deserialize_any(V)
    }
}

fn default_grayscale_p() -> f64 {
    0.1
}
fn default_erase_scale() -> [f64; 2] {
    [0.02, 0.33]
}
fn default_erase_ratio() -> [f64; 2] {
    [0.3, 3.3]
}

fn default_scale() -> [f64; 2] {
    [0.08, 1.0]
}
fn default_ratio() -> [f64; 2] {
    [3.0 / 4.0, 4.0 / 3.0]
}
fn default_half() -> f64 {
    0.5
}

/// `type: image` — decodes an image column (raw HWC `uint8`, PNG, JPEG) and applies seeded
/// augmentation; the output is a `fixed_size_list<float32>` in CHW order. Every random
/// choice is a pure function of (seed, stage, epoch, row identity).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ImageConfig {
    /// The binary (or fixed-size binary) column holding the images.
    pub column: String,
    /// Output column. Default: replaces `column`.
    #[serde(default)]
    pub output: Option<String>,
    /// Storage format. Default: `raw`.
    #[serde(default)]
    pub format: ImageFormat,
    /// `[height, width, channels]`: the raw layout, and the size PNG/JPEG images must have
    /// (channels 1 or 3).
    pub shape: [usize; 3],
    /// Augmentation steps, in order (at most one crop).
    #[serde(default)]
    pub ops: Vec<ImageOp>,
    /// Seed. Default: 0.
    #[serde(default)]
    pub seed: u64,
    /// What to do with an undecodable image or wrong byte length. Default: `fail`.
    #[serde(default)]
    pub on_error: OnError,
    /// With `on_error: skip`: where the skipped rows also go (`{type: file, path: …}`), as
    /// JSON lines with their lineage, the error and the bytes. (Where they go does not
    /// change which rows come out: not part of the resume stamp.)
    #[serde(default, skip_serializing)]
    pub dead_letter: Option<DeadLetterConfig>,
}

/// `type: mask_tokens` — BERT-style masking of integer token sequences: each token (but the
/// special ones) is selected with probability `p`; a selected token is replaced by
/// `mask_token` (fraction `mask_replace_prob`), by a random id (`random_replace_prob`) or kept;
/// a boolean list column (`<column>_mask` by default) marks the selected positions, and
/// optionally a labels column holds the original ids there (Hugging Face's
/// `DataCollatorForLanguageModeling`).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MaskTokensConfig {
    /// A `list<int*>` or `fixed_size_list<int*>` column.
    pub column: String,
    /// Selection probability, in `[0, 1)`.
    pub p: f64,
    /// The replacement token id.
    pub mask_token: i64,
    /// Of the selected tokens, the fraction replaced by `mask_token` (BERT: 0.8). Default: 1.
    #[serde(default = "one")]
    pub mask_replace_prob: f64,
    /// Of the selected tokens, the fraction replaced by an id drawn uniformly from
    /// `[0, vocab_size)` (BERT: 0.1); the rest keep their id. Default: 0.
    #[serde(default)]
    pub random_replace_prob: f64,
    /// Vocabulary size, needed by `random_replace_prob`.
    #[serde(default)]
    pub vocab_size: Option<u64>,
    /// Ids that are never selected (`[CLS]`, `[SEP]`, padding…). Default: none.
    #[serde(default)]
    pub special_tokens: Vec<i64>,
    /// Name of the mask column. Default: `<column>_mask`.
    #[serde(default)]
    pub mask_column: Option<String>,
    /// A labels column to add: the original id at selected positions, `ignore_index`
    /// elsewhere (same list type as `column`). Default: none.
    #[serde(default)]
    pub labels_column: Option<String>,
    /// The label of positions not selected. Default: -100 (PyTorch cross-entropy's
    /// `ignore_index`).
    #[serde(default = "minus_100")]
    pub ignore_index: i64,
    /// Seed. Default: 0.
    #[serde(default)]
    pub seed: u64,
}

fn one() -> f64 {
    1.0
}

fn minus_100() -> i64 {
    -100
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<PipelineConfig, Vec<ConfigError>> {
        let doc = ConfigDocument::from_str(text, "p.yaml", ".").map_err(|e| match e {
            crate::Error::Config(c) => c.0,
            other => panic!("{other}"),
        })?;
        let mut errors = Vec::new();
        let cfg = PipelineConfig::from_document(&doc, &mut errors);
        if errors.is_empty() {
            Ok(cfg.expect("config"))
        } else {
            Err(errors)
        }
    }

    #[test]
    fn parses_a_full_pipeline() {
        let cfg = load(
            "source:\n  type: parquet\n  path: [a.parquet, 'b/*.parquet']\n  columns: [x, y]\nstages:\n  - {type: cast, columns: {x: float32}}\n  - type: filter\n    predicate: y < 5\n  - {type: batch, size: 32, drop_last: true}\nruntime:\n  threads: 2\n  queue_bytes: 1 MiB\nsink: {type: null}\n",
        )
        .unwrap();
        let SourceConfig::Parquet(p) = &cfg.source.value else {
            panic!("not parquet")
        };
        assert_eq!(p.path.as_ref().unwrap().0, vec!["a.parquet", "b/*.parquet"]);
        assert_eq!(p.batch_rows, 8192);
        assert_eq!(cfg.stages.len(), 3);
        assert_eq!(cfg.stages[1].location, "p.yaml:7:5");
        assert_eq!(cfg.runtime.queue_bytes, ByteSize::mib(1));
        assert_eq!(
            cfg.stages[2].value,
            StageConfig::Batch(BatchConfig {
                size: 32,
                drop_last: true
            })
        );
    }

    #[test]
    fn reports_every_problem_with_positions() {
        let errs = load(
            "source:\n  type: parquet\n  path: a.parquet\n  colums: [x]\nstages:\n  - type: cast\n    columns: {x: float33}\n  - type: batch\n    size: many\n  - type: shufle\n  - {type: clip}\n  - {columns: [x]}\nextra: 1\n",
        )
        .unwrap_err();
        let text: Vec<String> = errs.iter().map(ToString::to_string).collect();
        let all = text.join("\n");
        assert_eq!(errs.len(), 7, "{all}");
        assert!(all.contains("p.yaml:13:1: unknown top-level key `extra`, expected one of: source, stages, runtime, sink"), "{all}");
        assert!(
            all.contains("p.yaml:4:3: source (parquet): unknown field `colums`, expected one of"),
            "{all}"
        );
        assert!(
            all.contains("p.yaml:7:18: stages[0] (cast): unknown type `float33`"),
            "{all}"
        );
        assert!(all.contains("p.yaml:9:11: stages[1] (batch)"), "{all}");
        assert!(
            all.contains(
                "p.yaml:10:11: stages[2]: unknown stage type `shufle`, expected one of: select,"
            ),
            "{all}"
        );
        // The likely intended name, when one is close; none for a name like none of them.
        assert!(
            all.contains("expected one of path, manifest, storage, columns, batch_rows, prefetch, prefetch_bytes, epochs, shard, partitioning, partition_types, mix; did you mean `columns`?"),
            "{all}"
        );
        assert!(
            all.contains("mask_tokens, mixup; did you mean `shuffle`?"),
            "{all}"
        );
        assert!(
            !all.contains("`extra`, expected one of: source, stages, runtime, sink; did you mean"),
            "{all}"
        );
        assert!(
            all.contains("stages[3] (clip): missing field `columns`"),
            "{all}"
        );
        assert!(all.contains("stages[4]: missing field `type`"), "{all}");
    }

    /// One image op read from its YAML (`- <op>` in an image stage's `ops`, on line 7 of the
    /// document), or every error, joined.
    fn image_op(op: &str) -> Result<ImageOp, String> {
        let doc = format!(
            "source: {{type: parquet, path: a.parquet}}\nstages:\n  - type: image\n    column: img\n    shape: [32, 32, 3]\n    ops:\n      - {op}\n"
        );
        match load(&doc) {
            Ok(cfg) => match &cfg.stages[0].value {
                StageConfig::Image(img) => Ok(img.ops[0].clone()),
                other => panic!("not an image stage: {other:?}"),
            },
            Err(errs) => Err(errs
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n")),
        }
    }

    #[test]
    fn padding_mode_is_read_and_a_wrong_one_is_placed() {
        let crop = |mode: &str| {
            image_op(&format!(
                "random_crop: {{size: [32, 32], padding: 4, padding_mode: {mode}}}"
            ))
        };
        assert_eq!(
            crop("reflect").unwrap(),
            ImageOp::RandomCrop {
                size: [32, 32],
                padding: 4,
                padding_mode: PaddingMode::Reflect,
                pad_if_needed: false,
                fill: PadFill::default(),
            }
        );
        let all = crop("mirror").unwrap_err();
        assert!(all.contains("p.yaml:7:"), "{all}");
        assert!(all.contains("unknown variant `mirror`"), "{all}");
        assert!(
            all.contains("constant") && all.contains("symmetric"),
            "{all}"
        );
    }

    #[test]
    fn crop_fill_is_a_number_or_a_list_and_pad_if_needed_a_bool() {
        let crop = |rest: &str| image_op(&format!("random_crop: {{size: [8, 8]{rest}}}"));
        let read = |rest: &str| match crop(rest).unwrap() {
            ImageOp::RandomCrop {
                pad_if_needed,
                fill,
                ..
            } => (pad_if_needed, fill.0),
            other => panic!("not a crop: {other:?}"),
        };
        assert_eq!(read(""), (false, vec![0.0]));
        assert_eq!(read(", fill: 128"), (false, vec![128.0]));
        assert_eq!(
            read(", pad_if_needed: true, fill: [124, 116.5, 104]"),
            (true, vec![124.0, 116.5, 104.0])
        );
        let e = crop(", fill: grey").unwrap_err();
        assert!(e.contains("p.yaml:7:"), "{e}");
        assert!(
            e.contains("a pixel value (0–255) or a list of them, one per channel"),
            "{e}"
        );
        let e = crop(", pad_if_needed: sometimes").unwrap_err();
        assert!(e.contains("p.yaml:7:"), "{e}");
    }

    #[test]
    fn erase_value_is_a_number_a_list_or_random() {
        let erase = |value: &str| image_op(&format!("random_erasing: {{p: 0.5, value: {value}}}"));
        let value = |text: &str| match erase(text).unwrap() {
            ImageOp::RandomErasing { value, .. } => value,
            other => panic!("not erasing: {other:?}"),
        };
        assert_eq!(value("-1"), EraseValue::Values(vec![-1.0]));
        assert_eq!(value("0.5"), EraseValue::Values(vec![0.5]));
        assert_eq!(
            value("[0.1, 0.2, 0.3]"),
            EraseValue::Values(vec![0.1, 0.2, 0.3])
        );
        assert_eq!(value("random"), EraseValue::Random);
        let all = erase("noise").unwrap_err();
        assert!(all.contains("p.yaml:7:"), "{all}");
        assert!(
            all.contains("a number, a list of numbers (one per channel), or `random`"),
            "{all}"
        );
    }

    /// A document that is not valid YAML is reported once, where it breaks, not once per
    /// section read from it; a key given twice says so in the config's terms.
    #[test]
    fn yaml_errors_are_reported_once() {
        for (text, want) in [
            (
                "source: {type: parquet, path: a.parquet}\nsource: {type: parquet, path: b.parquet}\n",
                "p.yaml:2:1: `source` is given twice in the same mapping: keep one",
            ),
            (
                "source: {type: parquet, path: a.parquet}\nstages:\n  - {type: batch, size: 10, size: 20}\n",
                "p.yaml:3:29: `size` is given twice in the same mapping: keep one",
            ),
            (
                "source: {type: parquet, path: a.parquet\nstages: []\n",
                "p.yaml:2:7: while parsing a flow mapping, did not find expected ',' or '}'",
            ),
        ] {
            let err = ConfigDocument::from_str(text, "p.yaml", ".").unwrap_err();
            let crate::Error::Config(errs) = err else {
                panic!("{err}")
            };
            let all: Vec<String> = errs.0.iter().map(ToString::to_string).collect();
            assert_eq!(all, vec![want.to_string()]);
        }
    }

    #[test]
    fn missing_source_is_reported() {
        let errs = load("stages: []\n").unwrap_err();
        assert!(
            errs[0]
                .message
                .contains("missing required section `source`"),
            "{}",
            errs[0]
        );
    }
}
