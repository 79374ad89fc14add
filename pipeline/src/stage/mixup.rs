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

use super::augment::{batch_row_ids, column_key, map_float_rows, supported};
use super::{Build, BuildStage, BuiltStage};
use crate::batch::Batch;
use crate::config::{CutmixConfig, MixupConfig};
use crate::error::{Error, Result, StageRef};

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
impl BuildStage for MixupConfig {
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
mod tests {
    use super::*;
    use crate::batch::{Lineage, Name, Origin};
    use crate::stage::Transform;
    use crate::stage::augment::row_ids;
    use arrow::array::{FixedSizeListArray, Float32Array, Float64Array, RecordBatch};
    use arrow::datatypes::{Field, Schema};

    /// `n` rows: `x` = [r, 10r] (float32 list), `y` = one-hot of `r % 3` (float32 list),
    /// `s` = r (float64).
    fn batch(n: usize, first: u64, epoch: u64) -> Batch {
        let item = Arc::new(Field::new_list_field(DataType::Float32, false));
        let x = Float32Array::from_iter_values((0..n).flat_map(|r| [r as f32, 10.0 * r as f32]));
        let y = Float32Array::from_iter_values(
            (0..n).flat_map(|r| (0..3).map(move |k| f32::from(u8::from(r % 3 == k)))),
        );
        let schema = Arc::new(Schema::new(vec![
            Field::new("x", DataType::FixedSizeList(item.clone(), 2), false),
            Field::new("y", DataType::FixedSizeList(item.clone(), 3), false),
            Field::new("s", DataType::Float64, false),
        ]));
        let data = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(FixedSizeListArray::new(item.clone(), 2, Arc::new(x), None)),
                Arc::new(FixedSizeListArray::new(item, 3, Arc::new(y), None)),
                Arc::new(Float64Array::from_iter_values((0..n).map(|r| r as f64))),
            ],
        )
        .unwrap();
        let origin = Origin::Object {
            url: Name::from("file:///d.parquet"),
            row_group: 0,
        };
        Batch::new(data, Lineage::new(origin, first, n as u64, epoch))
    }

    fn stage(alpha: f64) -> Mixup {
        let config = MixupConfig {
            columns: vec!["x".into(), "y".into(), "s".into()],
            alpha,
            seed: 3,
            cutmix: None,
        };
        let sref = StageRef {
            index: 2,
            kind: "mixup",
            location: None,
        };
        build(&sref, &config, &batch(1, 0, 0).data.schema()).unwrap()
    }

    fn lambdas(s: &Mixup, ids: &[u64]) -> Vec<f64> {
        s.draws(ids).iter().map(|d| d.lambda).collect()
    }

    fn list(b: &Batch, c: usize, width: usize) -> Vec<f32> {
        let l = b.data.column(c).as_fixed_size_list();
        let v = l.values().slice(l.offset() * width, l.len() * width);
        v.as_primitive::<Float32Type>().values().to_vec()
    }

    #[test]
    fn every_column_of_a_row_is_blended_with_the_mirror_row_by_one_lambda() {
        let s = stage(0.4);
        let n = 9;
        let out = s.apply(batch(n, 100, 0)).unwrap();
        let (x, y) = (list(&out, 0, 2), list(&out, 1, 3));
        let sc = out.data.column(2).as_primitive::<Float64Type>().values();
        for r in 0..n {
            let m = (n - 1 - r) as f64;
            let rf = r as f64;
            // s = λ·r + (1-λ)·m  ⇒  λ = (s - m) / (r - m); the middle row is its own mirror.
            if r == n / 2 {
                assert_eq!(sc[r], rf);
                assert_eq!(x[2 * r..2 * r + 2], [rf as f32, 10.0 * rf as f32]);
                continue;
            }
            let l = (sc[r] - m) / (rf - m);
            assert!((0.0..=1.0).contains(&l), "λ {l}");
            let expect = |a: f64, b: f64| (l * a + (1.0 - l) * b) as f32;
            assert!((x[2 * r] - expect(rf, m)).abs() < 1e-4);
            assert!((x[2 * r + 1] - expect(10.0 * rf, 10.0 * m)).abs() < 1e-3);
            for k in 0..3 {
                let hot = |row: f64| f64::from(u8::from(row as usize % 3 == k));
                assert!((y[3 * r + k] - expect(hot(rf), hot(m))).abs() < 1e-6);
            }
            // Blended labels still sum to 1.
            let sum: f32 = y[3 * r..3 * r + 3].iter().sum();
            assert!((sum - 1.0).abs() < 1e-6);
        }
    }

    #[test]
    fn lambda_follows_the_beta_distribution_and_the_row_identity() {
        let s = stage(0.4);
        let ids: Vec<u64> = row_ids(&batch(40_000, 0, 0).lineage);
        let l = lambdas(&s, &ids);
        let n = l.len() as f64;
        let mean = l.iter().sum::<f64>() / n;
        let var = l.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
        // Beta(α, α): mean 1/2, variance 1 / (4 (2α + 1)) = 0.1389 for α = 0.4.
        assert!((mean - 0.5).abs() < 0.01, "mean {mean}");
        assert!((var - 1.0 / 7.2).abs() < 0.005, "variance {var}");
        // The same rows get the same λ in another batch; another epoch, other λ.
        let again = lambdas(&s, &row_ids(&batch(10, 30, 0).lineage));
        assert_eq!(again, l[30..40]);
        let later = lambdas(&s, &row_ids(&batch(10, 30, 1).lineage));
        assert_ne!(later, again);
    }

    #[test]
    fn a_null_is_an_error_naming_the_row_and_bad_settings_are_refused() {
        let item = Arc::new(Field::new_list_field(DataType::Float32, true));
        let x = FixedSizeListArray::new(
            item.clone(),
            1,
            Arc::new(Float32Array::from(vec![Some(1.0), None, Some(3.0)])),
            None,
        );
        let schema = Arc::new(Schema::new(vec![Field::new(
            "x",
            DataType::FixedSizeList(item, 1),
            true,
        )]));
        let data = RecordBatch::try_new(schema.clone(), vec![Arc::new(x)]).unwrap();
        let origin = Origin::Object {
            url: Name::from("file:///d.parquet"),
            row_group: 4,
        };
        let b = Batch::new(data, Lineage::new(origin, 20, 3, 0));
        let sref = StageRef {
            index: 0,
            kind: "mixup",
            location: None,
        };
        let config = |alpha: f64, col: &str| MixupConfig {
            columns: vec![col.into()],
            alpha,
            seed: 0,
            cutmix: None,
        };
        let s = build(&sref, &config(0.2, "x"), &schema).unwrap();
        let e = s.apply(b).unwrap_err().to_string();
        assert!(e.contains("column `x` holds a null"), "{e}");
        assert!(e.contains("row group 4, row 21"), "{e}");
        for (alpha, col, expected) in [
            (0.0, "x", "`alpha` must be a finite number > 0"),
            (f64::NAN, "x", "`alpha` must be a finite number > 0"),
            (0.2, "nope", "nope"),
        ] {
            let e = build(&sref, &config(alpha, col), &schema)
                .unwrap_err()
                .to_string();
            assert!(e.contains(expected), "{e}");
        }
    }

    /// `n` CHW images `[2, 4, 5]` whose value names the row and the pixel
    /// (`1000 r + 100 k + 10 y + x`), and one-hot labels of `r % 3`.
    fn images(n: usize) -> Batch {
        let item = Arc::new(Field::new_list_field(DataType::Float32, false));
        let img = Float32Array::from_iter_values((0..n).flat_map(|r| {
            (0..2).flat_map(move |k| {
                (0..4).flat_map(move |y| {
                    (0..5).map(move |x| (1000 * r + 100 * k + 10 * y + x) as f32)
                })
            })
        }));
        let y = Float32Array::from_iter_values(
            (0..n).flat_map(|r| (0..3).map(move |k| f32::from(u8::from(r % 3 == k)))),
        );
        let schema = Arc::new(Schema::new(vec![
            Field::new("img", DataType::FixedSizeList(item.clone(), 40), false),
            Field::new("y", DataType::FixedSizeList(item.clone(), 3), false),
        ]));
        let data = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(FixedSizeListArray::new(
                    item.clone(),
                    40,
                    Arc::new(img),
                    None,
                )),
                Arc::new(FixedSizeListArray::new(item, 3, Arc::new(y), None)),
            ],
        )
        .unwrap();
        let origin = Origin::Object {
            url: Name::from("file:///i.parquet"),
            row_group: 0,
        };
        Batch::new(data, Lineage::new(origin, 0, n as u64, 0))
    }

    fn cutmix_stage(p: f64, image: &str, shape: [usize; 3]) -> Result<Mixup> {
        let config = MixupConfig {
            columns: vec!["img".into(), "y".into()],
            alpha: 0.4,
            seed: 5,
            cutmix: Some(CutmixConfig {
                column: image.into(),
                shape,
                alpha: 1.0,
                p,
            }),
        };
        let sref = StageRef {
            index: 4,
            kind: "mixup",
            location: None,
        };
        build(&sref, &config, &images(1).data.schema())
    }

    #[test]
    fn a_cutmix_box_by_hand() {
        // λ 0.75: √(1-λ) = 0.5, a 16×16 box around (5, 30) in 32×32, clipped to rows 0..13
        // and columns 22..32: 130 pixels, so the labels keep 1 - 130/1024 of the row.
        let d = cut_box([32, 32], 0.75, 5, 30);
        let cut = d.cut.unwrap();
        assert_eq!((cut.y0, cut.y1, cut.x0, cut.x1), (0, 13, 22, 32));
        assert_eq!(d.lambda, 1.0 - 130.0 / 1024.0);
        // Inside: an 8×8 box (λ 0.9375: √0.0625 = 0.25), no clipping.
        let d = cut_box([32, 32], 0.9375, 16, 16);
        let cut = d.cut.unwrap();
        assert_eq!((cut.y0, cut.y1, cut.x0, cut.x1), (12, 20, 12, 20));
        assert_eq!(d.lambda, 0.9375);
        // λ 1: an empty box, the row stays whole.
        assert_eq!(cut_box([32, 32], 1.0, 3, 3).lambda, 1.0);
    }

    #[test]
    fn cutmix_pastes_the_mirror_rows_box_and_blends_the_labels_by_the_share_left() {
        let n = 64;
        let s = cutmix_stage(1.0, "img", [2, 4, 5]).unwrap();
        let input = images(n);
        let draws = s.draws(&row_ids(&input.lineage));
        let out = s.apply(input).unwrap();
        let (img, y) = (list(&out, 0, 40), list(&out, 1, 3));
        let mut pasted = 0;
        for (r, d) in draws.iter().enumerate() {
            let cut = d.cut.expect("p = 1: every row gets CutMix");
            let m = n - 1 - r;
            let mut inside = 0;
            for k in 0..2 {
                for yy in 0..4 {
                    for x in 0..5 {
                        let boxed = (cut.y0..cut.y1).contains(&yy) && (cut.x0..cut.x1).contains(&x);
                        inside += usize::from(boxed);
                        let from = if boxed { m } else { r };
                        assert_eq!(
                            img[40 * r + 20 * k + 5 * yy + x],
                            (1000 * from + 100 * k + 10 * yy + x) as f32,
                            "row {r} channel {k} pixel ({yy}, {x}), box {cut:?}"
                        );
                    }
                }
            }
            // λ is the share of the image that stayed the row's own.
            assert_eq!(d.lambda, 1.0 - (inside / 2) as f64 / 20.0);
            pasted += usize::from(inside > 0 && m != r);
            for k in 0..3 {
                let hot = |row: usize| f64::from(u8::from(row % 3 == k));
                let expect = (d.lambda * hot(r) + (1.0 - d.lambda) * hot(m)) as f32;
                assert!((y[3 * r + k] - expect).abs() < 1e-6, "row {r} label {k}");
            }
        }
        assert!(pasted > n / 2, "only {pasted} of {n} rows got a box");
    }

    #[test]
    fn cutmix_takes_its_share_of_the_rows_and_keeps_the_blend_for_the_rest() {
        let ids: Vec<u64> = row_ids(&images(20_000).lineage);
        for (p, lo, hi) in [(0.0, 0, 0), (0.3, 5_700, 6_300), (1.0, 20_000, 20_000)] {
            let s = cutmix_stage(p, "img", [2, 4, 5]).unwrap();
            let cut = s.draws(&ids).iter().filter(|d| d.cut.is_some()).count();
            assert!((lo..=hi).contains(&cut), "p {p}: {cut} of 20000 rows");
        }
        // With p = 0 every image is blended whole, by the row's λ.
        let s = cutmix_stage(0.0, "img", [2, 4, 5]).unwrap();
        let input = images(5);
        let draws = s.draws(&row_ids(&input.lineage));
        let img = list(&s.apply(input).unwrap(), 0, 40);
        for (r, d) in draws.iter().enumerate() {
            let l = d.lambda as f32;
            for i in 0..40 {
                let (own, other) = (
                    (1000 * r + i / 20 * 100 + i % 20 / 5 * 10 + i % 5) as f32,
                    (1000 * (4 - r) + i / 20 * 100 + i % 20 / 5 * 10 + i % 5) as f32,
                );
                assert_eq!(
                    img[40 * r + i],
                    l * own + (1.0 - l) * other,
                    "row {r} value {i}"
                );
            }
        }
    }

    #[test]
    fn bad_cutmix_settings_are_refused_with_the_reason() {
        for (p, column, shape, expected) in [
            (1.5, "img", [2, 4, 5], "`cutmix.p` must be in [0, 1]"),
            (
                0.5,
                "other",
                [2, 4, 5],
                "`cutmix.column` `other` is not one of `columns` (img, y)",
            ),
            (
                0.5,
                "img",
                [3, 4, 5],
                "is 60 values per image, but column `img` holds 40",
            ),
            (0.5, "img", [2, 0, 20], "has a zero dimension"),
        ] {
            let e = cutmix_stage(p, column, shape).unwrap_err().to_string();
            assert!(e.contains(expected), "{e}");
        }
    }
}
