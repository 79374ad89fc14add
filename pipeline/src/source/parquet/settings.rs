//! The `parquet` source's settings: which files, how many rows per batch and how much is read
//! ahead, epochs, mixing datasets, partition columns from paths, and sharding between ranks.

use std::collections::BTreeMap;

use bytesize::ByteSize;
use serde::{Deserialize, Serialize};

use crate::config::OneOrMany;

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
    /// the bytes fetched (a local file's pages as they are decoded: at most 8 MiB) plus the
    /// bytes decoded: fewer than `prefetch` row groups are read ahead when they are large, and
    /// one larger than this is read alone. Default: 256 MiB.
    #[serde(default = "default_prefetch_bytes")]
    pub prefetch_bytes: ByteSize,
    /// Local files are mapped into memory and their pages decoded where they lie, without
    /// the copy a `pread` makes (see `source::mapped`); `false` reads them with `pread`. A
    /// mapped file cut shorter while one of its pages is being decoded ends the process
    /// (`SIGBUS`); read with `pread`, it is an error naming the file. Default: true.
    #[serde(default = "default_memory_map")]
    pub memory_map: bool,
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
fn default_memory_map() -> bool {
    true
}
fn default_epochs() -> u64 {
    1
}
