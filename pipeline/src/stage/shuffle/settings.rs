//! The `shuffle` stage's settings, and its build step: the settings checked against the input
//! schema (the shuffle itself is the rest of this folder).

use arrow::datatypes::{DataType, Schema, SchemaRef};
use bytesize::ByteSize;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::stage::{Build, BuiltStage, StageKind};

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
    /// `window` (default): the three levels above. `global`: the Parquet source reads the
    /// epoch in a seeded permutation of all its rows (no window: any row can come next),
    /// by random access in blocks of `max_memory`.
    #[serde(default)]
    pub mode: ShuffleMode,
}

/// How a `shuffle` permutes rows.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ShuffleMode {
    /// Windows of `buffer_rows` consecutive rows (and the row-group order), in memory.
    #[default]
    Window,
    /// A seeded bijection over the epoch's positions: every row read by random access.
    Global,
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

impl ShuffleConfig {
    /// Whether this shuffle gathers a window of `input` rows at random from memory: a window
    /// shuffle that exchanges nothing between ranks and whose fixed-size list values
    /// (`buffer_rows` rows of them) fit in `max_memory`. A spilled or exchanged window is
    /// gathered from rows read back or received, not from the source's buffers.
    pub(crate) fn gathers_in_memory(&self, input: &Schema) -> bool {
        let row_bytes: usize = (input.fields().iter())
            .filter_map(|f| match f.data_type() {
                DataType::FixedSizeList(item, n) => {
                    Some(item.data_type().primitive_width()? * (*n).max(0) as usize)
                }
                _ => None,
            })
            .sum();
        self.mode == ShuffleMode::Window
            && !self.across_ranks
            && (self.buffer_rows as u128) * (row_bytes as u128) <= self.max_memory.as_u64() as u128
    }
}

impl StageKind for ShuffleConfig {
    fn build(&self, b: &Build<'_>) -> Result<(BuiltStage, SchemaRef)> {
        if self.buffer_rows == 0 || self.batch_rows == 0 {
            return Err(b.err("`buffer_rows` and `batch_rows` must be at least 1".into()));
        }
        if self.max_memory.as_u64() == 0 {
            return Err(b.err("`max_memory` must be more than 0".into()));
        }
        if self.mode == ShuffleMode::Global {
            // The source reads the epoch in its permuted order (`configure`): this stage only
            // cuts the rows into batches of `batch_rows`.
            let rebatch = BuiltStage::Rebatch {
                size: self.batch_rows,
                drop_last: false,
            };
            return Ok((rebatch, b.input.clone()));
        }
        let group = match &self.group_by_length {
            None => None,
            Some(g) => Some(super::group_spec(b.stage, g, b.input)?),
        };
        Ok((
            BuiltStage::Shuffle(super::ShuffleSpec {
                buffer_rows: self.buffer_rows,
                max_memory: self.max_memory.as_u64() as usize,
                spill_dir: self.spill_dir.as_ref().map(std::path::PathBuf::from),
                seed: self.seed,
                batch_rows: self.batch_rows,
                across_ranks: self.across_ranks,
                views: Vec::new(),
                group,
                rank: b.ctx.rank,
            }),
            b.input.clone(),
        ))
    }
}
