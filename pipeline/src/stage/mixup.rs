//! `mixup` (Zhang et al., 2018): each row of a batch blended with its mirror row.
//!
//! Row `i` of a batch of `n` rows is paired with row `n - 1 - i` (timm's "elem" mode: the
//! batch flipped), and every listed column becomes `λᵢ·x_i + (1 - λᵢ)·x_{n-1-i}`, with one
//! `λᵢ ~ Beta(α, α)` per row shared by all the columns (features and one-hot labels alike).
//! `λᵢ` is drawn from the row's own ChaCha8 stream (seed, stage, epoch and lineage, as
//! [`super::augment`]), so it does not depend on threads or timing; the pairs depend on the
//! batch, which is why the stage must come after the last `batch` stage (a resumed run cuts
//! the same batches there).

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, PrimitiveArray};
use arrow::datatypes::{ArrowPrimitiveType, DataType, Float32Type, Float64Type, SchemaRef};
use chacha20::ChaCha8Rng;
use rand::SeedableRng;
use rand_distr::{Beta, Distribution};

use super::augment::{batch_row_ids, column_key, map_float_rows, supported};
use crate::batch::Batch;
use crate::config::MixupConfig;
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
    Ok(Mixup {
        stage: stage.clone(),
        columns,
        beta,
        key: column_key(c.seed, stage.index, "mixup"),
        schema: input.clone(),
    })
}

impl Mixup {
    /// `λ` of every row.
    fn lambdas(&self, ids: &[u64]) -> Vec<f64> {
        let mut rng = ChaCha8Rng::from_seed(self.key);
        ids.iter()
            .map(|id| {
                rng.set_stream(*id);
                self.beta.sample(&mut rng)
            })
            .collect()
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

/// Row `r` of `values` (rows of `width` values) blended with its mirror row.
fn blend<T: ArrowPrimitiveType>(
    values: &PrimitiveArray<T>,
    width: usize,
    lambdas: &[f64],
    mix: impl Fn(T::Native, T::Native, f64) -> T::Native,
) -> PrimitiveArray<T> {
    let src = values.values();
    let n = lambdas.len();
    let mut out = Vec::with_capacity(src.len());
    for (r, &l) in lambdas.iter().enumerate() {
        let (a, b) = (r * width, (n - 1 - r) * width);
        out.extend(
            src[a..a + width]
                .iter()
                .zip(&src[b..b + width])
                .map(|(x, y)| mix(*x, *y, l)),
        );
    }
    PrimitiveArray::<T>::new(out.into(), None)
}

fn blend_values(values: &ArrayRef, width: usize, lambdas: &[f64]) -> Result<ArrayRef, String> {
    Ok(match values.data_type() {
        DataType::Float32 => Arc::new(blend(
            values.as_primitive::<Float32Type>(),
            width,
            lambdas,
            |x, y, l| {
                let l = l as f32;
                l * x + (1.0 - l) * y
            },
        )),
        DataType::Float64 => Arc::new(blend(
            values.as_primitive::<Float64Type>(),
            width,
            lambdas,
            |x, y, l| l * x + (1.0 - l) * y,
        )),
        other => return Err(format!("unsupported type {other}")),
    })
}

fn blend_column(col: &ArrayRef, lambdas: &[f64]) -> Result<ArrayRef, String> {
    map_float_rows(col, |values, width| blend_values(values, width, lambdas))
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
        let lambdas = self.lambdas(&ids);
        for (i, _) in &self.columns {
            cols[*i] = blend_column(&cols[*i], &lambdas).map_err(|m| Error::Stage {
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
        };
        let sref = StageRef {
            index: 2,
            kind: "mixup",
            location: None,
        };
        build(&sref, &config, &batch(1, 0, 0).data.schema()).unwrap()
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
        let l = s.lambdas(&ids);
        let n = l.len() as f64;
        let mean = l.iter().sum::<f64>() / n;
        let var = l.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
        // Beta(α, α): mean 1/2, variance 1 / (4 (2α + 1)) = 0.1389 for α = 0.4.
        assert!((mean - 0.5).abs() < 0.01, "mean {mean}");
        assert!((var - 1.0 / 7.2).abs() < 0.005, "variance {var}");
        // The same rows get the same λ in another batch; another epoch, other λ.
        let again = s.lambdas(&row_ids(&batch(10, 30, 0).lineage));
        assert_eq!(again, l[30..40]);
        let later = s.lambdas(&row_ids(&batch(10, 30, 1).lineage));
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
}
