//! The registration table of stage kinds. Each kind's settings, build step and kernel live
//! in its own module (`columns`, `values`, `augment`, `image/`, `shuffle/`, …); this table
//! names them once.

use arrow::datatypes::SchemaRef;
use serde::Serialize;
use serde::de::{self, Deserialize, Deserializer};

use super::{
    BatchConfig, Build, BuildContext, BuiltStage, CastConfig, ClipConfig, ComputedStats,
    FeatureDropoutConfig, FillNullConfig, FilterConfig, GaussianNoiseConfig, ImageConfig,
    MaskTokensConfig, MixupConfig, OneHotConfig, RenameConfig, SelectConfig, ShuffleConfig,
    StageKind, StandardizeConfig,
};
use crate::config::Component;
use crate::error::{Result, StageRef};

/// The one table of stage kinds: per stage, its variant, its settings and its `type:` name.
/// The enum, [`StageConfig::kind`], `KINDS`, `deserialize_kind` and the dispatch to each
/// kind's [`StageKind`] are generated from it, so they cannot drift apart, and a kind whose
/// settings do not implement [`StageKind`] is a compile error. Adding a stage is one line
/// here (its position is its place in the messages that list the kinds).
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

            /// The kind's build step and properties.
            fn as_kind(&self) -> &dyn StageKind {
                match self {
                    $(StageConfig::$variant(c) => c,)*
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
        self.as_kind().keeps_columns()
    }

    /// How the run summary names the rows this stage removes: a `filter`'s are filtered out,
    /// a `batch`'s are the tails `drop_last` drops, an `image` stage's are bad images it
    /// skipped (`on_error: skip`) — data to look at, not a choice of the pipeline.
    pub fn removed_as(&self) -> &'static str {
        self.as_kind().removed_as()
    }

    /// Whether the stage can remove rows (`filter`, `image` with `on_error: skip`): what the
    /// stage-order rules, the plan stamp and the equal-counts warning look for.
    pub fn removes_rows(&self) -> bool {
        self.as_kind().removes_rows()
    }
}

/// Builds a stage for `input`, returning it and its output schema. `stats` must be given for
/// a `standardize` stage without `mean`/`std`.
pub(crate) fn build(
    stage: &StageRef,
    config: &StageConfig,
    input: &SchemaRef,
    stats: Option<ComputedStats>,
    ctx: &BuildContext,
) -> Result<(BuiltStage, SchemaRef)> {
    config.as_kind().build(&Build {
        stage,
        input,
        stats,
        ctx,
    })
}
