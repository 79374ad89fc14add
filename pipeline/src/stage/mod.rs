//! Stages: built from their config against the schema they receive (so unknown columns and
//! impossible casts fail before any data moves), then applied batch by batch with Arrow
//! kernels.

mod augment;
mod expr;
pub(crate) mod image;
mod kernels;
mod mixup;
mod normal;
mod pixels;
pub(crate) mod rebatch;
pub(crate) mod shuffle;
mod stats;
mod tokens;
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
use crate::config::{Literal, StageConfig};
use crate::error::{Error, Result, StageRef};

pub(crate) use stats::ColumnStats;

/// A stateless, per-batch transformation.
pub(crate) trait Transform: Send + Sync + fmt::Debug {
    /// Applies the transformation; the output has the schema computed at build time.
    fn apply(&self, batch: Batch) -> Result<Batch>;
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
    use augment::splitmix64 as mix;
    let a = mix(seed ^ mix(domain));
    let b = mix(a ^ mix(epoch.wrapping_add(0x0e0c)));
    let c = mix(b ^ mix(extra.wrapping_add(0x7e57)));
    let mut key = [0u8; 32];
    for (i, v) in [a, b, c, mix(c)].iter().enumerate() {
        key[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
    }
    ChaCha8Rng::from_seed(key)
}

/// Statistics computed for a `standardize` stage without given `mean`/`std`, per column.
pub(crate) type ComputedStats = Vec<(String, ColumnStats)>;

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
        crate::config::did_you_mean(name, available.iter().copied())
    )
}

/// Builds a stage for `input`, returning it and its output schema. `stats` must be given for
/// a `standardize` stage without `mean`/`std`.
/// What building a stage needs besides its config and input: where relative paths start
/// (an `image` stage's dead-letter directory) and the rank.
#[derive(Debug, Clone, Default)]
pub(crate) struct BuildContext {
    pub base_dir: std::path::PathBuf,
    pub rank: usize,
}

pub(crate) fn build(
    stage: &StageRef,
    config: &StageConfig,
    input: &SchemaRef,
    stats: Option<ComputedStats>,
    ctx: &BuildContext,
) -> Result<(BuiltStage, SchemaRef)> {
    let err = |message: String| Error::Stage {
        stage: stage.clone(),
        message,
    };
    match config {
        StageConfig::Select(c) => {
            let mut indices = Vec::with_capacity(c.columns.len());
            for name in &c.columns {
                let i = column_index(stage, input, name)?;
                if indices.contains(&i) {
                    return Err(err(format!("column `{name}` is selected twice")));
                }
                indices.push(i);
            }
            let schema = Arc::new(input.project(&indices).map_err(|e| err(e.to_string()))?);
            Ok((
                BuiltStage::Map(Arc::new(kernels::Select {
                    indices,
                    schema: schema.clone(),
                })),
                schema,
            ))
        }
        StageConfig::Rename(c) => {
            let mut fields: Vec<Field> =
                input.fields().iter().map(|f| f.as_ref().clone()).collect();
            for (old, new) in &c.columns {
                let i = column_index(stage, input, old)?;
                fields[i] = fields[i].clone().with_name(new);
            }
            let mut seen = std::collections::HashSet::new();
            for f in &fields {
                if !seen.insert(f.name().clone()) {
                    return Err(err(format!(
                        "renaming would create two columns named `{}`",
                        f.name()
                    )));
                }
            }
            let schema = Arc::new(Schema::new(fields));
            Ok((
                BuiltStage::Map(Arc::new(kernels::Replace::rename(
                    stage.clone(),
                    schema.clone(),
                ))),
                schema,
            ))
        }
        StageConfig::Cast(c) => {
            let mut targets = Vec::new();
            let mut fields: Vec<Field> =
                input.fields().iter().map(|f| f.as_ref().clone()).collect();
            for (name, ty) in &c.columns {
                let i = column_index(stage, input, name)?;
                let from = input.field(i).data_type();
                let to = kernels::elementwise_type(from, ty.data_type());
                if !arrow::compute::can_cast_types(from, &to) {
                    return Err(err(format!("column `{name}`: cannot cast {from} to {ty}")));
                }
                fields[i] = fields[i].clone().with_data_type(to.clone());
                targets.push((i, to));
            }
            let schema = Arc::new(Schema::new(fields));
            Ok((
                BuiltStage::Map(Arc::new(kernels::Cast {
                    stage: stage.clone(),
                    targets,
                    schema: schema.clone(),
                })),
                schema,
            ))
        }
        StageConfig::Filter(c) => {
            let predicate = expr::compile(&c.predicate, input).map_err(err)?;
            Ok((
                BuiltStage::Map(Arc::new(kernels::Filter {
                    stage: stage.clone(),
                    predicate,
                })),
                input.clone(),
            ))
        }
        StageConfig::FillNull(c) => {
            let mut fills = Vec::new();
            let mut fields: Vec<Field> =
                input.fields().iter().map(|f| f.as_ref().clone()).collect();
            for (name, value) in &c.columns {
                let i = column_index(stage, input, name)?;
                let ty = input.field(i).data_type();
                let scalar =
                    literal_array(value, ty).map_err(|m| err(format!("column `{name}`: {m}")))?;
                fields[i] = fields[i].clone().with_nullable(false);
                fills.push((i, scalar));
            }
            let schema = Arc::new(Schema::new(fields));
            Ok((
                BuiltStage::Map(Arc::new(kernels::FillNull {
                    stage: stage.clone(),
                    fills,
                    schema: schema.clone(),
                })),
                schema,
            ))
        }
        StageConfig::Standardize(c) => {
            let mut cols = Vec::new();
            let mut fields: Vec<Field> =
                input.fields().iter().map(|f| f.as_ref().clone()).collect();
            let given = match (c.mean, c.std) {
                (Some(m), Some(s)) => {
                    if !(s > 0.0 && s.is_finite() && m.is_finite()) {
                        return Err(err(format!(
                            "`std` must be a positive number and `mean` finite (got mean {m}, std {s})"
                        )));
                    }
                    if c.non_finite.is_some() {
                        return Err(err(
                            "`non_finite` applies only to statistics computed from the data; with `mean` and `std` given there is nothing to compute (a NaN or ±inf value stays NaN or ±inf)"
                                .into(),
                        ));
                    }
                    Some(ColumnStats::given(m, s))
                }
                (None, None) => None,
                _ => return Err(err(
                    "give both `mean` and `std`, or neither (then they are computed from the data)"
                        .into(),
                )),
            };
            for name in &c.columns {
                let i = column_index(stage, input, name)?;
                let from = input.field(i).data_type();
                if !kernels::is_numeric_or_numeric_list(from) {
                    return Err(err(format!(
                        "column `{name}` is {from}; standardize needs numbers or lists of numbers"
                    )));
                }
                let out_elem = if kernels::leaf_type(from) == &DataType::Float64 {
                    DataType::Float64
                } else {
                    DataType::Float32
                };
                let to = kernels::elementwise_type(from, &out_elem);
                fields[i] = fields[i].clone().with_data_type(to.clone());
                let st = match &given {
                    Some(g) => g.clone(),
                    None => stats
                        .as_ref()
                        .and_then(|s| s.iter().find(|(n, _)| n == name))
                        .map(|(_, s)| s.clone())
                        .ok_or_else(|| {
                            Error::Internal(format!(
                                "{stage}: statistics for `{name}` were not computed"
                            ))
                        })?,
                };
                cols.push((i, to, st));
            }
            let schema = Arc::new(Schema::new(fields));
            Ok((
                BuiltStage::Map(Arc::new(kernels::Standardize {
                    stage: stage.clone(),
                    columns: cols,
                    schema: schema.clone(),
                })),
                schema,
            ))
        }
        StageConfig::OneHot(c) => {
            let i = column_index(stage, input, &c.column)?;
            let from = input.field(i).data_type();
            if !from.is_integer() {
                return Err(err(format!(
                    "column `{}` is {from}; one_hot needs integer class indices",
                    c.column
                )));
            }
            if c.num_classes == 0 || c.num_classes > i32::MAX as usize {
                return Err(err("`num_classes` must be between 1 and 2^31-1".into()));
            }
            if !(0.0..1.0).contains(&c.smoothing) {
                return Err(err(format!(
                    "`smoothing` must be in [0, 1), not {}",
                    c.smoothing
                )));
            }
            let off = c.smoothing / c.num_classes as f64;
            let on_off = ((1.0 - c.smoothing + off) as f32, off as f32);
            let out_name = c.output.clone().unwrap_or_else(|| c.column.clone());
            let out_type = DataType::FixedSizeList(
                Arc::new(Field::new_list_field(DataType::Float32, false)),
                c.num_classes as i32,
            );
            let mut fields: Vec<Field> =
                input.fields().iter().map(|f| f.as_ref().clone()).collect();
            let out_index = if out_name == c.column {
                fields[i] = Field::new(&out_name, out_type, false);
                i
            } else {
                if input.index_of(&out_name).is_ok() {
                    return Err(err(format!("output column `{out_name}` already exists")));
                }
                fields.push(Field::new(&out_name, out_type, false));
                fields.len() - 1
            };
            let schema = Arc::new(Schema::new(fields));
            Ok((
                BuiltStage::Map(Arc::new(kernels::OneHot {
                    stage: stage.clone(),
                    input: i,
                    output: out_index,
                    num_classes: c.num_classes,
                    on_off,
                    schema: schema.clone(),
                })),
                schema,
            ))
        }
        StageConfig::Clip(c) => {
            if c.min.is_none() && c.max.is_none() {
                return Err(err("give `min`, `max` or both".into()));
            }
            for (key, v) in [("min", c.min), ("max", c.max)] {
                if v.is_some_and(f64::is_nan) {
                    return Err(err(format!(
                        "`{key}` must be a number, not NaN (leave it out for no bound)"
                    )));
                }
            }
            if let (Some(lo), Some(hi)) = (c.min, c.max)
                && lo > hi
            {
                return Err(err(format!("`min` ({lo}) is greater than `max` ({hi})")));
            }
            let mut cols = Vec::new();
            for name in &c.columns {
                let i = column_index(stage, input, name)?;
                let from = input.field(i).data_type();
                if !kernels::is_numeric_or_numeric_list(from) {
                    return Err(err(format!(
                        "column `{name}` is {from}; clip needs numbers or lists of numbers"
                    )));
                }
                let leaf = kernels::leaf_type(from);
                let bound = |v: Option<f64>| -> Result<Option<ArrayRef>> {
                    v.map(|v| {
                        literal_array(&Literal::Float(v), leaf)
                            .map_err(|m| err(format!("column `{name}`: {m}")))
                    })
                    .transpose()
                };
                cols.push((i, bound(c.min)?, bound(c.max)?));
            }
            Ok((
                BuiltStage::Map(Arc::new(kernels::Clip {
                    stage: stage.clone(),
                    columns: cols,
                    schema: input.clone(),
                })),
                input.clone(),
            ))
        }
        StageConfig::GaussianNoise(c) => {
            if !(c.std >= 0.0 && c.std.is_finite()) {
                return Err(err(format!(
                    "`std` must be a finite number ≥ 0, not {}",
                    c.std
                )));
            }
            augment_stage(
                stage,
                input,
                &c.columns,
                c.seed,
                augment::Noise::Gaussian { std: c.std },
            )
        }
        StageConfig::FeatureDropout(c) => {
            if !(0.0..1.0).contains(&c.p) {
                return Err(err(format!("`p` must be in [0, 1), not {}", c.p)));
            }
            let scale = if c.scale { 1.0 / (1.0 - c.p) } else { 1.0 };
            augment_stage(
                stage,
                input,
                &c.columns,
                c.seed,
                augment::Noise::Dropout { p: c.p, scale },
            )
        }
        StageConfig::Shuffle(c) => {
            if c.buffer_rows == 0 || c.batch_rows == 0 {
                return Err(err(
                    "`buffer_rows` and `batch_rows` must be at least 1".into()
                ));
            }
            if c.max_memory.as_u64() == 0 {
                return Err(err("`max_memory` must be more than 0".into()));
            }
            let group = match &c.group_by_length {
                None => None,
                Some(g) => Some(shuffle::group_spec(stage, g, input)?),
            };
            Ok((
                BuiltStage::Shuffle(shuffle::ShuffleSpec {
                    buffer_rows: c.buffer_rows,
                    max_memory: c.max_memory.as_u64() as usize,
                    spill_dir: c.spill_dir.as_ref().map(std::path::PathBuf::from),
                    seed: c.seed,
                    batch_rows: c.batch_rows,
                    across_ranks: c.across_ranks,
                    views: Vec::new(),
                    group,
                    rank: ctx.rank,
                }),
                input.clone(),
            ))
        }
        StageConfig::Image(c) => {
            let (built, schema) = image::build(stage, c, input, ctx)?;
            Ok((BuiltStage::Map(Arc::new(built)), schema))
        }
        StageConfig::MaskTokens(c) => {
            let (built, schema) = tokens::build(stage, c, input)?;
            Ok((BuiltStage::Map(Arc::new(built)), schema))
        }
        StageConfig::Mixup(c) => {
            let built = mixup::build(stage, c, input)?;
            Ok((BuiltStage::Map(Arc::new(built)), input.clone()))
        }
        StageConfig::Batch(c) => {
            if c.size == 0 {
                return Err(err("`size` must be at least 1".into()));
            }
            Ok((
                BuiltStage::Rebatch {
                    size: c.size,
                    drop_last: c.drop_last,
                },
                input.clone(),
            ))
        }
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
        })),
        input.clone(),
    ))
}
