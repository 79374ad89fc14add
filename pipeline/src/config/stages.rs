//! The `stages` list: the stage kinds and the settings of every stage but `image` (in
//! `image.rs`).

use std::collections::BTreeMap;
use std::fmt;

use bytesize::ByteSize;
use serde::de::{self, Deserializer};
use serde::{Deserialize, Serialize};

use super::image::{ImageConfig, OnError};
use super::load::Component;
use crate::types::{DataTypeName, Literal};

/// The one table of stage kinds: per stage, its variant, its settings and its `type:` name.
/// The enum, [`StageConfig::kind`], `KINDS` and `deserialize_kind` are generated from it, so
/// they cannot drift apart; each kind's build step matches on the enum (in `stage`), so a
/// kind without one is a compile error. Adding a stage is one line here (its position is
/// its place in the messages that list the kinds).
macro_rules! stage_table {
    ($($(#[doc = $doc:literal])* $variant:ident($config:ty) = $kind:literal,)*) => {
        /// A transformation (`type:` selects the kind). Stages run in order; stateless ones
        /// run on the CPU pool, several batches at a time, with the order of rows preserved.
        /// (Serialized as its settings alone, without `type`: for the resume stamp.)
        #[derive(Debug, Clone, PartialEq, Serialize)]
        #[serde(untagged)]
        pub enum StageConfig {
            $($(#[doc = $doc])* $variant($config),)*
        }

        impl StageConfig {
            /// The stage's `type` name.
            pub fn kind(&self) -> &'static str {
                match self {
                    $(StageConfig::$variant(_) => $kind,)*
                }
            }
        }

        impl Component for StageConfig {
            const WHAT: &'static str = "stage";
            const KINDS: &'static [&'static str] = &[$($kind),*];
            fn deserialize_kind<'de, D: Deserializer<'de>>(
                kind: &str,
                d: D,
            ) -> Result<Self, D::Error> {
                Ok(match kind {
                    $($kind => StageConfig::$variant(<$config>::deserialize(d)?),)*
                    other => return Err(de::Error::unknown_variant(other, Self::KINDS)),
                })
            }
        }
    };
}

stage_table! {
    /// Keep only these columns, in this order.
    Select(SelectConfig) = "select",
    /// Rename columns.
    Rename(RenameConfig) = "rename",
    /// Change column types.
    Cast(CastConfig) = "cast",
    /// Keep rows for which a predicate is true.
    Filter(FilterConfig) = "filter",
    /// Replace nulls with a value.
    FillNull(FillNullConfig) = "fill_null",
    /// `(x - mean) / std`.
    Standardize(StandardizeConfig) = "standardize",
    /// Class index → one-hot vector.
    OneHot(OneHotConfig) = "one_hot",
    /// Bound values to `[min, max]`.
    Clip(ClipConfig) = "clip",
    /// Re-batch to a fixed number of rows.
    Batch(BatchConfig) = "batch",
    /// Add seeded Gaussian noise.
    GaussianNoise(GaussianNoiseConfig) = "gaussian_noise",
    /// Zero values at random (seeded).
    FeatureDropout(FeatureDropoutConfig) = "feature_dropout",
    /// Seeded shuffle: row-group order per epoch, a window buffer, optionally across ranks.
    Shuffle(ShuffleConfig) = "shuffle",
    /// Decode and augment images into float32 CHW tensors.
    Image(ImageConfig) = "image",
    /// Seeded random token masking of integer sequences.
    MaskTokens(MaskTokensConfig) = "mask_tokens",
    /// Seeded mixup: each row blended with its mirror row of the batch.
    Mixup(MixupConfig) = "mixup",
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
