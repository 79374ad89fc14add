//! Stages: built from their config against the schema they receive (so unknown columns and
//! impossible casts fail before any data moves), then applied batch by batch with Arrow
//! kernels.

mod ars;
mod augment;
mod columns;
mod expr;
mod fused;
mod gathered;
pub(crate) mod image;
mod kernels;
mod mixup;
mod normal;
mod owned;
mod pixels;
pub(crate) mod rebatch;
pub(crate) mod registry;
pub(crate) mod shuffle;
mod stats;
mod tokens;
mod values;
#[rustfmt::skip]
mod ziggurat_tables;

use std::fmt;
use std::sync::Arc;

/// A whole `h`×`w` RGB image (HWC `u8`) to normalized CHW `f32` (`v * scale + bias`), no crop
/// or flip: the `image` stage's kernel on its own (what `sluice bench`'s floor variant uses).
pub fn rgb_to_chw(
    src: &[u8],
    h: usize,
    w: usize,
    scale: [f32; 3],
    bias: [f32; 3],
    dst: &mut [f32],
) {
    let window = pixels::Window {
        top: 0,
        left: 0,
        flip_h: false,
        flip_v: false,
    };
    pixels::rgb_crop(src, h, w, [h, w], &window, scale, bias, [0.0; 3], dst);
}

use arrow::array::{ArrayRef, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use chacha20::ChaCha8Rng;
use rand::SeedableRng;

use crate::batch::Batch;
use crate::error::{Error, Result, StageRef};
use crate::types::Literal;

// Each kind's settings live with its build step and kernel; `registry` lists the kinds.
pub use augment::{FeatureDropoutConfig, GaussianNoiseConfig};
pub use columns::{CastConfig, RenameConfig, SelectConfig};
pub(crate) use gathered::viewable_list;
pub use image::{
    AugmentOn, DEVICE_IMAGE_KEY, DeviceImage, EraseValue, ImageConfig, ImageDtype, ImageFormat,
    ImageOp, OnError, PadFill, PaddingMode,
};
pub use mixup::{CutmixConfig, MixupConfig};
pub(crate) use normal::splitmix64;
pub use rebatch::BatchConfig;
pub use registry::StageConfig;
pub(crate) use registry::build;
pub use shuffle::settings::{GroupByLength, ShuffleConfig, ShuffleMode};
pub(crate) use stats::{ColumnStats, update_elements};
pub use tokens::MaskTokensConfig;
pub(crate) use values::per_element_width;
pub use values::{
    ClipConfig, FillNullConfig, FilterConfig, NonFinite, NumberOrList, OneHotConfig,
    StandardizeConfig,
};

/// A stateless, per-batch transformation.
pub(crate) trait Transform: Send + Sync + fmt::Debug {
    /// Applies the transformation; the output has the schema computed at build time.
    fn apply(&self, batch: Batch) -> Result<Batch>;

    /// The columns this stage standardizes, when that is all it does (`standardize`): what a
    /// next stage may do in its own pass over each row instead (see [`fused`]).
    fn standardizes(&self) -> Option<&[kernels::StandardizeColumn]> {
        None
    }

    /// This stage standardizing each row of `pre`'s columns just before its own work on the
    /// row, bit for bit as the `standardize` stage before it would have (see [`fused`]);
    /// `None` when it cannot take all of them.
    fn after_standardize(&self, _pre: &[kernels::StandardizeColumn]) -> Option<Arc<dyn Transform>> {
        None
    }

    /// Whether this stage also takes `column` (a fixed-size list) as `BinaryView` rows into a
    /// shuffle's window, reading each row once and writing the list itself (see [`gathered`]).
    fn takes_views(&self, _column: usize) -> bool {
        false
    }

    /// Whether batches pass through untouched (a `standardize` the next stage does).
    fn passes_through(&self) -> bool {
        false
    }
}

/// What a `standardize` stage becomes when the stage after it does its work (see [`fused`]).
pub(crate) fn deferred() -> BuiltStage {
    BuiltStage::Map(Arc::new(fused::Deferred))
}

/// A stage ready to run.
#[derive(Debug)]
pub(crate) enum BuiltStage {
    /// Stateless: runs on the CPU pool, several batches at once.
    Map(Arc<dyn Transform>),
    /// Re-batching to a fixed size.
    Rebatch { size: usize, drop_last: bool },
    /// The shuffle window buffer (row-group order is the source's part).
    Shuffle(shuffle::ShuffleSpec),
}

/// A ChaCha8 generator keyed by `(seed, domain, epoch, extra)`: the one way Sluice derives
/// random streams (row-group order, shuffle windows), so results never depend on timing.
pub(crate) fn seeded_rng(seed: u64, domain: u64, epoch: u64, extra: u64) -> ChaCha8Rng {
    use normal::splitmix64 as mix;
    let a = mix(seed ^ mix(domain));
    let b = mix(a ^ mix(epoch.wrapping_add(0x0e0c)));
    let c = mix(b ^ mix(extra.wrapping_add(0x7e57)));
    let mut key = [0u8; 32];
    for (i, v) in [a, b, c, mix(c)].iter().enumerate() {
        key[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
    }
    ChaCha8Rng::from_seed(key)
}

/// Statistics computed for a `standardize` stage without given `mean`/`std`, per column: one
/// for the whole column, or one per list element (`per_element`; none in a placeholder built
/// before the list size is known).
pub(crate) type ComputedStats = Vec<(String, Vec<ColumnStats>)>;

/// A schema's fields as owned values, for a stage to change some and build its output schema.
pub(crate) fn owned_fields(schema: &Schema) -> Vec<Field> {
    schema.fields().iter().map(|f| f.as_ref().clone()).collect()
}

pub(crate) fn column_index(stage: &StageRef, schema: &Schema, name: &str) -> Result<usize> {
    schema.index_of(name).map_err(|_| Error::Stage {
        stage: stage.clone(),
        message: no_such_column(name, &column_names(schema), ""),
    })
}

/// The names of `schema`'s columns.
pub(crate) fn column_names(schema: &Schema) -> Vec<&str> {
    schema.fields().iter().map(|f| f.name().as_str()).collect()
}

/// "column `x` does not exist; available columns: a, b[{note}]; did you mean `a`?"
pub(crate) fn no_such_column(name: &str, available: &[&str], note: &str) -> String {
    format!(
        "column `{name}` does not exist; available columns: {}{note}{}",
        available.join(", "),
        crate::error::config::did_you_mean(name, available.iter().copied())
    )
}

/// What building a stage needs besides its config and input: where relative paths start
/// (an `image` stage's dead-letter directory) and the rank.
#[derive(Debug, Clone, Default)]
pub(crate) struct BuildContext {
    pub base_dir: std::path::PathBuf,
    pub rank: usize,
    /// How `gaussian_noise` draws: the resumed state's version, else `runtime.draws`, else
    /// today's.
    pub draws: crate::state::Draws,
}

/// What a stage kind's build step reads besides its own config: the stage, the schema it
/// receives, statistics computed for it and the build context.
pub(crate) struct Build<'a> {
    pub(crate) stage: &'a StageRef,
    pub(crate) input: &'a SchemaRef,
    /// Given for a `standardize` stage without `mean`/`std`.
    pub(crate) stats: Option<ComputedStats>,
    pub(crate) ctx: &'a BuildContext,
}

impl Build<'_> {
    /// A build error of this stage with `message`.
    fn err(&self, message: String) -> Error {
        Error::Stage {
            stage: self.stage.clone(),
            message,
        }
    }
}

/// What every stage kind implements, next to its settings and kernel: its build step (schema
/// checks against the input, then the runtime stage) and what the executor's order rules and
/// the run summary need to know about it. `registry::stage_table!` requires it of every kind.
pub(crate) trait StageKind {
    /// Checks these settings against `b`'s input schema; returns the stage and its output
    /// schema.
    fn build(&self, b: &Build<'_>) -> Result<(BuiltStage, SchemaRef)>;

    /// Whether the output has the input's columns and types (only nullability may change):
    /// checking a config can go on past such a stage when it could not be built.
    fn keeps_columns(&self) -> bool {
        false
    }

    /// Whether the stage can remove rows: what the stage-order rules, the plan stamp and the
    /// equal-counts warning look for.
    fn removes_rows(&self) -> bool {
        false
    }

    /// How the run summary names the rows this stage removes.
    fn removed_as(&self) -> &'static str {
        "removed"
    }
}

/// A one-element array holding `value` converted to `ty`, or why it cannot be.
pub(crate) fn literal_array(value: &Literal, ty: &DataType) -> Result<ArrayRef, String> {
    use arrow::array::{BooleanArray, Float64Array, Int64Array, StringArray};
    let raw: ArrayRef = match value {
        Literal::Bool(b) => Arc::new(BooleanArray::from(vec![*b])),
        Literal::Int(i) => Arc::new(Int64Array::from(vec![*i])),
        Literal::Float(f) => Arc::new(Float64Array::from(vec![*f])),
        Literal::Str(s) => Arc::new(StringArray::from(vec![s.as_str()])),
    };
    if raw.data_type() == ty {
        return Ok(raw);
    }
    let opts = arrow::compute::CastOptions {
        safe: false,
        ..Default::default()
    };
    let cast = arrow::compute::cast_with_options(&raw, ty, &opts)
        .map_err(|e| format!("value {value} cannot be used as {ty}: {e}"))?;
    // Reject lossy conversions (1.5 into an integer column, 300 into uint8).
    if matches!(value, Literal::Float(_) | Literal::Int(_)) && ty.is_numeric() {
        let back = arrow::compute::cast(&cast, raw.data_type()).map_err(|e| e.to_string())?;
        if back.as_ref() != raw.as_ref() {
            return Err(format!("value {value} does not fit exactly in {ty}"));
        }
    }
    Ok(cast)
}

/// The columns of `batch`, moved out of it (its data is left empty until [`with_columns`]
/// puts new ones back), so that a stage holding the only reference to a column's buffers can
/// rewrite them in place (see [`owned`]).
pub(crate) fn take_columns(batch: &mut Batch) -> Vec<ArrayRef> {
    let empty = RecordBatch::new_empty(Arc::new(arrow::datatypes::Schema::empty()));
    std::mem::replace(&mut batch.data, empty).into_parts().1
}

/// A column that holds nothing, left where one was taken out of a `Vec` of columns.
pub(crate) fn placeholder() -> ArrayRef {
    arrow::array::new_null_array(&arrow::datatypes::DataType::Null, 0)
}

/// Replaces some columns of a batch, keeping lineage.
pub(crate) fn with_columns(
    stage: &StageRef,
    batch: Batch,
    schema: &SchemaRef,
    columns: Vec<ArrayRef>,
) -> Result<Batch> {
    let data = RecordBatch::try_new(schema.clone(), columns).map_err(|e| Error::Arrow {
        context: stage.to_string(),
        source: e,
    })?;
    Ok(batch.with_data(data))
}

fn augment_stage(
    stage: &StageRef,
    input: &SchemaRef,
    columns: &[String],
    seed: u64,
    noise: augment::Noise,
) -> Result<(BuiltStage, SchemaRef)> {
    let mut cols = Vec::new();
    for name in columns {
        let i = column_index(stage, input, name)?;
        let t = input.field(i).data_type();
        if !augment::supported(t) {
            return Err(Error::Stage {
                stage: stage.clone(),
                message: format!(
                    "column `{name}` is {t}; {} needs float32/float64 or fixed-size lists of them (add a `cast` first)",
                    stage.kind
                ),
            });
        }
        cols.push((i, augment::column_key(seed, stage.index, name)));
    }
    Ok((
        BuiltStage::Map(Arc::new(augment::Augment {
            stage: stage.clone(),
            noise,
            columns: cols,
            schema: input.clone(),
            pre: Vec::new(),
        })),
        input.clone(),
    ))
}
