//! `mixup` (Zhang et al., 2018): each row of a batch blended with its mirror row.
//!
//! Row `i` of a batch of `n` rows is paired with row `n - 1 - i` (timm's "elem" mode: the
//! batch flipped), and every listed column becomes `λᵢ·x_i + (1 - λᵢ)·x_{n-1-i}`, with one
//! `λᵢ ~ Beta(α, α)` per row shared by all the columns (features and one-hot labels alike).
//! `λᵢ` is drawn from the row's own ChaCha8 stream (seed, stage, epoch and lineage, as
//! [`super::augment`]), so it does not depend on threads or timing; the pairs depend on the
//! batch, which is why the stage must come after the last `batch` stage (a resumed run cuts
//! the same batches there).
//!
//! With `cutmix` (Yun et al., 2019; timm's `switch_prob`), each row first draws whether it
//! gets CutMix instead (probability `p`): then `λ ~ Beta(α_cut, α_cut)` sets a box of
//! `⌊H·√(1-λ)⌋ × ⌊W·√(1-λ)⌋` pixels around a uniform centre (clipped at the edges, as timm's
//! `rand_bbox`), the mirror row's pixels in that box replace the row's own in every channel
//! of the image column, and the other columns are blended by the share of the image that
//! stayed the row's own (`1 - box area / (H·W)`, timm's `correct_lam`).

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, PrimitiveArray};
use arrow::datatypes::{ArrowPrimitiveType, DataType, Float32Type, Float64Type, SchemaRef};
use chacha20::ChaCha8Rng;
use rand::{RngExt, SeedableRng};
use rand_distr::{Beta, Distribution};
use serde::{Deserialize, Serialize};

use super::augment::{batch_row_ids, column_key, map_float_rows, supported};
use super::{Build, BuiltStage, StageKind};
use crate::batch::Batch;
use crate::error::{Error, Result, StageRef};

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

#[derive(Debug)]
pub(crate) struct Mixup {
    stage: StageRef,
    /// Column indexes, and names for messages.
    columns: Vec<(usize, String)>,
    beta: Beta<f64>,
    /// The ChaCha key of the stage's `λ` draws.
    key: [u8; 32],
    schema: SchemaRef,
    cutmix: Option<Cutmix>,
}

/// `cutmix`, checked against the schema.
#[derive(Debug)]
struct Cutmix {
    /// Index of the image column in the stage's `columns`.
    column: usize,
    /// `[channels, height, width]`.
    shape: [usize; 3],
    beta: Beta<f64>,
    p: f64,
}

/// What one row gets: every column blended with the mirror row by `lambda`, except, when
/// `cut` is set, the image column, which gets the mirror row's pixels in the box.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Draw {
    lambda: f64,
    cut: Option<Cut>,
}

/// A CutMix box: rows `y0..y1` and columns `x0..x1` of every channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Cut {
    y0: usize,
    y1: usize,
    x0: usize,
    x1: usize,
}

/// Checks the config against the input schema.
pub(crate) fn build(stage: &StageRef, c: &MixupConfig, input: &SchemaRef) -> Result<Mixup> {
    let err = |message: String| Error::Stage {
        stage: stage.clone(),
        message,
    };
    if !(c.alpha > 0.0 && c.alpha.is_finite()) {
        return Err(err(format!(
            "`alpha` must be a finite number > 0, not {}",
            c.alpha
        )));
    }
    if c.columns.is_empty() {
        return Err(err(
            "`columns` is empty: list the feature columns and the one-hot label column".into(),
        ));
    }
    let mut columns = Vec::new();
    for name in &c.columns {
        let i = super::column_index(stage, input, name)?;
        let t = input.field(i).data_type();
        if !supported(t) {
            return Err(err(format!(
                "column `{name}` is {t}; mixup blends float32/float64 or fixed-size lists of them (class indices: turn them into vectors with `one_hot` first)"
            )));
        }
        columns.push((i, name.clone()));
    }
    let beta = Beta::new(c.alpha, c.alpha).map_err(|e| err(format!("`alpha`: {e}")))?;
    let cutmix = match &c.cutmix {
        None => None,
        Some(cut) => Some(build_cutmix(cut, &columns, input).map_err(err)?),
    };
    Ok(Mixup {
        stage: stage.clone(),
        columns,
        beta,
        key: column_key(c.seed, stage.index, "mixup"),
        schema: input.clone(),
        cutmix,
    })
}

/// `mixup`: built by `build`, run on the CPU pool; the schema passes through.
impl StageKind for MixupConfig {
    fn keeps_columns(&self) -> bool {
        true
    }

    fn build(&self, b: &Build<'_>) -> Result<(BuiltStage, SchemaRef)> {
        let built = build(b.stage, self, b.input)?;
        Ok((BuiltStage::Map(Arc::new(built)), b.input.clone()))
    }
}

fn build_cutmix(
    c: &CutmixConfig,
    columns: &[(usize, String)],
    input: &SchemaRef,
) -> Result<Cutmix, String> {
    if !(c.alpha > 0.0 && c.alpha.is_finite()) {
        return Err(format!(
            "`cutmix.alpha` must be a finite number > 0, not {}",
            c.alpha
        ));
    }
    if !(0.0..=1.0).contains(&c.p) {
        return Err(format!("`cutmix.p` must be in [0, 1], not {}", c.p));
    }
    let Some(column) = columns.iter().position(|(_, n)| *n == c.column) else {
        let names: Vec<&str> = columns.iter().map(|(_, n)| n.as_str()).collect();
        return Err(format!(
            "`cutmix.column` `{}` is not one of `columns` ({}): list the image column there too",
            c.column,
            names.join(", ")
        ));
    };
    let [ch, h, w] = c.shape;
    if ch == 0 || h == 0 || w == 0 {
        return Err(format!(
            "`cutmix.shape` {:?} has a zero dimension: give [channels, height, width]",
            c.shape
        ));
    }
    let t = input.field(columns[column].0).data_type();
    match t {
        DataType::FixedSizeList(_, width) if *width as usize == ch * h * w => {}
        DataType::FixedSizeList(_, width) => {
            return Err(format!(
                "`cutmix.shape` {:?} is {} values per image, but column `{}` holds {width} per row",
                c.shape,
                ch * h * w,
                c.column
            ));
        }
        _ => {
            return Err(format!(
                "`cutmix.column` `{}` is {t}; CutMix pastes boxes of images: a fixed-size list (the `image` stage's float32 CHW output)",
                c.column
            ));
        }
    }
    let beta = Beta::new(c.alpha, c.alpha).map_err(|e| format!("`cutmix.alpha`: {e}"))?;
    Ok(Cutmix {
        column,
        shape: c.shape,
        beta,
        p: c.p,
    })
}

impl Mixup {
    /// The draw of every row: with `cutmix`, first whether the row gets it (one uniform
    /// `f64`), then `λ` and, for CutMix, the box centre (row, then column).
    fn draws(&self, ids: &[u64]) -> Vec<Draw> {
        let mut rng = ChaCha8Rng::from_seed(self.key);
        ids.iter()
            .map(|id| {
                rng.set_stream(*id);
                if let Some(c) = &self.cutmix
                    && rng.random::<f64>() < c.p
                {
                    return c.draw(&mut rng);
                }
                Draw {
                    lambda: self.beta.sample(&mut rng),
                    cut: None,
                }
            })
            .collect()
    }
}

impl Cutmix {
    /// timm's `rand_bbox` with `correct_lam`: a box of `⌊H·√(1-λ)⌋ × ⌊W·√(1-λ)⌋` around a
    /// uniform centre, clipped at the edges; `λ` becomes the share outside the clipped box.
    fn draw(&self, rng: &mut ChaCha8Rng) -> Draw {
        let [_, h, w] = self.shape;
        let l = self.beta.sample(rng);
        let cy = rng.random_range(0..h);
        let cx = rng.random_range(0..w);
        cut_box([h, w], l, cy, cx)
    }
}

/// The box of a drawn `λ` around `(cy, cx)` in an `[h, w]` image, and the corrected `λ`.
fn cut_box([h, w]: [usize; 2], lambda: f64, cy: usize, cx: usize) -> Draw {
    let rat = (1.0 - lambda).sqrt();
    let (bh, bw) = ((h as f64 * rat) as usize, (w as f64 * rat) as usize);
    let cut = Cut {
        y0: cy.saturating_sub(bh / 2),
        y1: (cy + bh / 2).min(h),
        x0: cx.saturating_sub(bw / 2),
        x1: (cx + bw / 2).min(w),
    };
    let area = (cut.y1 - cut.y0) * (cut.x1 - cut.x0);
    Draw {
        lambda: 1.0 - area as f64 / (h * w) as f64,
        cut: Some(cut),
    }
}

/// The first row of `col` holding a null (the row itself, or an element of its list).
fn first_null(col: &ArrayRef) -> Option<usize> {
    if let Some(n) = col.nulls().filter(|n| n.null_count() > 0) {
        return n.iter().position(|valid| !valid);
    }
    if let DataType::FixedSizeList(_, w) = col.data_type() {
        let list = col.as_fixed_size_list();
        let w = *w as usize;
        let values = list.values().slice(list.offset() * w, list.len() * w);
        if let Some(n) = values.nulls().filter(|n| n.null_count() > 0) {
            return n.iter().position(|valid| !valid).map(|e| e / w.max(1));
        }
    }
    None
}

/// Row `r` of `values` (rows of `width` values) blended with its mirror row by its `λ`, or,
/// when `image` (`[channels, height, width]`) is given and the row has a CutMix box, the row
/// with the mirror row's pixels in the box.
fn blend<T: ArrowPrimitiveType>(
    values: &PrimitiveArray<T>,
    width: usize,
    draws: &[Draw],
    image: Option<[usize; 3]>,
    mix: impl Fn(T::Native, T::Native, f64) -> T::Native,
) -> PrimitiveArray<T> {
    let src = values.values();
    let n = draws.len();
    let mut out = Vec::with_capacity(src.len());
    for (r, d) in draws.iter().enumerate() {
        let (a, b) = (r * width, (n - 1 - r) * width);
        let (own, other) = (&src[a..a + width], &src[b..b + width]);
        match (d.cut, image) {
            (Some(cut), Some([ch, h, w])) => {
                out.extend_from_slice(own);
                let row = &mut out[a..a + width];
                for k in 0..ch {
                    for y in cut.y0..cut.y1 {
                        let at = (k * h + y) * w;
                        row[at + cut.x0..at + cut.x1]
                            .copy_from_slice(&other[at + cut.x0..at + cut.x1]);
                    }
                }
            }
            _ => out.extend(own.iter().zip(other).map(|(x, y)| mix(*x, *y, d.lambda))),
        }
    }
    PrimitiveArray::<T>::new(out.into(), None)
}

fn blend_values(
    values: &ArrayRef,
    width: usize,
    draws: &[Draw],
    image: Option<[usize; 3]>,
) -> Result<ArrayRef, String> {
    Ok(match values.data_type() {
        DataType::Float32 => Arc::new(blend(
            values.as_primitive::<Float32Type>(),
            width,
            draws,
            image,
            |x, y, l| {
                let l = l as f32;
                l * x + (1.0 - l) * y
            },
        )),
        DataType::Float64 => Arc::new(blend(
            values.as_primitive::<Float64Type>(),
            width,
            draws,
            image,
            |x, y, l| l * x + (1.0 - l) * y,
        )),
        other => return Err(format!("unsupported type {other}")),
    })
}

fn blend_column(
    col: &ArrayRef,
    draws: &[Draw],
    image: Option<[usize; 3]>,
) -> Result<ArrayRef, String> {
    map_float_rows(col, |values, width| {
        blend_values(values, width, draws, image)
    })
}

impl super::Transform for Mixup {
    fn apply(&self, batch: Batch) -> Result<Batch> {
        let ids = batch_row_ids(&self.stage, &batch)?;
        let mut cols = batch.data.columns().to_vec();
        for (i, name) in &self.columns {
            if let Some(r) = first_null(&cols[*i]) {
                return Err(Error::Data {
                    stage: self.stage.clone(),
                    message: format!(
                        "column `{name}` holds a null; mixup blends values (fill nulls with `fill_null` before it)"
                    ),
                    rows: batch.lineage.describe_row(r as u64),
                });
            }
        }
        let draws = self.draws(&ids);
        for (k, (i, _)) in self.columns.iter().enumerate() {
            let image = self
                .cutmix
                .as_ref()
                .filter(|c| c.column == k)
                .map(|c| c.shape);
            cols[*i] = blend_column(&cols[*i], &draws, image).map_err(|m| Error::Stage {
                stage: self.stage.clone(),
                message: m,
            })?;
        }
        super::with_columns(&self.stage, batch, &self.schema, cols)
    }
}

#[cfg(test)]
mod tests;
