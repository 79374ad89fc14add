//! The per-batch work of each stateless stage, written with Arrow compute kernels.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, FixedSizeListArray, Float32Array, LargeListArray, ListArray,
    PrimitiveArray, RecordBatch, Scalar,
};
use arrow::compute::kernels::{cmp, zip::zip};
use arrow::compute::{CastOptions, cast, cast_with_options, filter_record_batch, is_null};
use arrow::datatypes::{
    ArrowPrimitiveType, DataType, Field, Float16Type, Float32Type, Float64Type, Int64Type,
    SchemaRef,
};
use arrow::error::ArrowError;

use super::expr::Expr;
use super::owned::{rewritable, rewrite_rows};
use super::with_columns;
use crate::batch::Batch;
use crate::error::{Error, Result, StageRef};

/// The element type of a (possibly nested) list, or the type itself.
pub(crate) fn leaf_type(t: &DataType) -> &DataType {
    match t {
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => {
            leaf_type(f.data_type())
        }
        other => other,
    }
}

pub(crate) fn is_numeric_or_numeric_list(t: &DataType) -> bool {
    leaf_type(t).is_numeric()
}

/// `from` with its leaf type replaced by `leaf` when `leaf` is a scalar type (casting a list
/// to `float32` means casting its elements).
pub(crate) fn elementwise_type(from: &DataType, leaf: &DataType) -> DataType {
    let nested = |f: &Arc<Field>| {
        Arc::new(
            f.as_ref()
                .clone()
                .with_data_type(elementwise_type(f.data_type(), leaf)),
        )
    };
    if leaf.is_nested() {
        return leaf.clone();
    }
    match from {
        DataType::List(f) => DataType::List(nested(f)),
        DataType::LargeList(f) => DataType::LargeList(nested(f)),
        DataType::FixedSizeList(f, n) => DataType::FixedSizeList(nested(f), *n),
        _ => leaf.clone(),
    }
}

/// Applies `f` to the leaf values of a (possibly nested) list array, or to the array itself.
fn map_leaf(
    array: &ArrayRef,
    f: &dyn Fn(&ArrayRef) -> Result<ArrayRef, ArrowError>,
) -> Result<ArrayRef, ArrowError> {
    match array.data_type() {
        DataType::List(field) => {
            let l = array.as_list::<i32>();
            let values = map_leaf(l.values(), f)?;
            let field = Arc::new(
                field
                    .as_ref()
                    .clone()
                    .with_data_type(values.data_type().clone()),
            );
            Ok(Arc::new(ListArray::try_new(
                field,
                l.offsets().clone(),
                values,
                l.nulls().cloned(),
            )?))
        }
        DataType::LargeList(field) => {
            let l = array.as_list::<i64>();
            let values = map_leaf(l.values(), f)?;
            let field = Arc::new(
                field
                    .as_ref()
                    .clone()
                    .with_data_type(values.data_type().clone()),
            );
            Ok(Arc::new(LargeListArray::try_new(
                field,
                l.offsets().clone(),
                values,
                l.nulls().cloned(),
            )?))
        }
        DataType::FixedSizeList(field, n) => {
            let l = array.as_fixed_size_list();
            // A sliced fixed-size list shares its child; transform only the visible part.
            let values = l
                .values()
                .slice(l.offset() * *n as usize, l.len() * *n as usize);
            let values = map_leaf(&values, f)?;
            let field = Arc::new(
                field
                    .as_ref()
                    .clone()
                    .with_data_type(values.data_type().clone()),
            );
            Ok(Arc::new(FixedSizeListArray::try_new(
                field,
                *n,
                values,
                l.nulls().cloned(),
            )?))
        }
        _ => f(array),
    }
}

fn arrow_err(stage: &StageRef, e: ArrowError) -> Error {
    Error::Arrow {
        context: stage.to_string(),
        source: e,
    }
}

#[derive(Debug)]
pub(crate) struct Select {
    pub indices: Vec<usize>,
    pub schema: SchemaRef,
}

impl super::Transform for Select {
    fn apply(&self, batch: Batch) -> Result<Batch> {
        let columns = self
            .indices
            .iter()
            .map(|&i| batch.data.column(i).clone())
            .collect();
        let data = RecordBatch::try_new(self.schema.clone(), columns)
            .map_err(|e| Error::Internal(e.to_string()))?;
        Ok(batch.with_data(data))
    }
}

/// Same columns, new schema (rename).
#[derive(Debug)]
pub(crate) struct Replace {
    stage: StageRef,
    schema: SchemaRef,
}

impl Replace {
    pub(crate) fn rename(stage: StageRef, schema: SchemaRef) -> Self {
        Replace { stage, schema }
    }
}

impl super::Transform for Replace {
    fn apply(&self, batch: Batch) -> Result<Batch> {
        let cols = batch.data.columns().to_vec();
        with_columns(&self.stage, batch, &self.schema, cols)
    }
}

#[derive(Debug)]
pub(crate) struct Cast {
    pub stage: StageRef,
    pub targets: Vec<(usize, DataType)>,
    pub schema: SchemaRef,
}

impl super::Transform for Cast {
    fn apply(&self, batch: Batch) -> Result<Batch> {
        let strict = CastOptions {
            safe: false,
            ..Default::default()
        };
        let mut cols = batch.data.columns().to_vec();
        for (i, to) in &self.targets {
            let col = &cols[*i];
            match cast_with_options(col, to, &strict) {
                Ok(c) => cols[*i] = c,
                Err(e) => {
                    let name = batch.data.schema().field(*i).name().clone();
                    return Err(Error::Data {
                        stage: self.stage.clone(),
                        message: format!("cannot cast column `{name}` to {to}: {e}"),
                        rows: first_failing_cast(col, to)
                            .map(|r| batch.lineage.describe_row(r as u64))
                            .unwrap_or_else(|| batch.lineage.to_string()),
                    });
                }
            }
        }
        with_columns(&self.stage, batch, &self.schema, cols)
    }
}

/// Index of the first row a lenient cast turns into null although it was not null.
fn first_failing_cast(col: &ArrayRef, to: &DataType) -> Option<usize> {
    let lenient = cast(col, to).ok()?;
    (0..col.len()).find(|&r| col.is_valid(r) && lenient.is_null(r))
}

#[derive(Debug)]
pub(crate) struct Filter {
    pub stage: StageRef,
    pub predicate: Expr,
}

impl super::Transform for Filter {
    fn apply(&self, batch: Batch) -> Result<Batch> {
        let mask = self
            .predicate
            .evaluate_mask(&batch.data)
            .map_err(|e| Error::Data {
                stage: self.stage.clone(),
                message: format!("predicate failed: {e}"),
                rows: batch.lineage.to_string(),
            })?;
        let data =
            filter_record_batch(&batch.data, &mask).map_err(|e| arrow_err(&self.stage, e))?;
        let lineage = batch.lineage.filter(&mask);
        Ok(Batch::new(data, lineage).with_position_of(&batch))
    }
}

#[derive(Debug)]
pub(crate) struct FillNull {
    pub stage: StageRef,
    pub fills: Vec<(usize, ArrayRef)>,
    pub schema: SchemaRef,
}

impl super::Transform for FillNull {
    fn apply(&self, batch: Batch) -> Result<Batch> {
        let mut cols = batch.data.columns().to_vec();
        for (i, value) in &self.fills {
            let col = &cols[*i];
            if col.null_count() == 0 {
                continue;
            }
            let mask = is_null(col.as_ref()).map_err(|e| arrow_err(&self.stage, e))?;
            cols[*i] = zip(&mask, &Scalar::new(value.clone()), col)
                .map_err(|e| arrow_err(&self.stage, e))?;
        }
        with_columns(&self.stage, batch, &self.schema, cols)
    }
}

/// `(x - mean) / std` per value: NaN stays NaN, ±inf stays ±inf, null stays null (whatever
/// the statistics were computed with, see [`super::ColumnStats::update`]).
#[derive(Debug)]
pub(crate) struct Standardize {
    pub stage: StageRef,
    pub columns: Vec<StandardizeColumn>,
    pub schema: SchemaRef,
}

/// One column of a [`Standardize`]: its index, output type, and the mean and std — one
/// value, or one per element of a fixed-size list (element `k` of every row uses `[k]`).
#[derive(Debug, Clone)]
pub(crate) struct StandardizeColumn {
    pub index: usize,
    pub to: DataType,
    pub mean: Vec<f64>,
    pub std: Vec<f64>,
}

impl super::Transform for Standardize {
    fn standardizes(&self) -> Option<&[StandardizeColumn]> {
        Some(&self.columns)
    }

    fn apply(&self, mut batch: Batch) -> Result<Batch> {
        let mut cols = super::take_columns(&mut batch);
        for c in &self.columns {
            let leaf = leaf_type(&c.to).clone();
            let col = std::mem::replace(&mut cols[c.index], super::placeholder());
            // `(x - mean) / std` in one pass: the same IEEE operations as the `sub` and `div`
            // kernels one after the other, without the intermediate array (measured on the
            // tabular bench: 5.4 % of the CPU in two passes), on the column's own buffer when
            // the batch holds the only reference to it (see `owned`).
            let (mean, std) = (&c.mean, &c.std);
            cols[c.index] = match leaf {
                DataType::Float32 if rewritable::<Float32Type>(col.data_type()) => {
                    rewrite_rows::<Float32Type>(col, |v, _| affine(v, mean, std, |x| x as f32))
                }
                DataType::Float64 if rewritable::<Float64Type>(col.data_type()) => {
                    rewrite_rows::<Float64Type>(col, |v, _| affine(v, mean, std, |x| x))
                }
                _ => map_leaf(&col, &|x| {
                    let x = cast(x, &leaf)?;
                    Ok(if leaf == DataType::Float64 {
                        affine_copy::<Float64Type>(x.as_primitive(), mean, std, |v| v)
                    } else {
                        affine_copy::<Float32Type>(x.as_primitive(), mean, std, |v| v as f32)
                    })
                }),
            }
            .map_err(|e| arrow_err(&self.stage, e))?;
        }
        with_columns(&self.stage, batch, &self.schema, cols)
    }
}

/// `v = (v - mean[k]) / std[k]` for the `k`-th value of each group of `mean.len()` values
/// (the leaf values of a fixed-size list start at element 0 of a row, see [`map_leaf`]); with
/// one mean, every value. The same [`RowAffine`](super::fused::RowAffine) a stage fused with
/// this one runs on each row.
fn affine<N>(values: &mut [N], mean: &[f64], std: &[f64], of: fn(f64) -> N)
where
    N: Copy + std::ops::Sub<Output = N> + std::ops::Div<Output = N>,
{
    super::fused::RowAffine::new(mean, std, of).apply(values);
}

/// [`affine`] into a new array (a column that was cast, or a variable-length list). Nulls
/// are kept.
fn affine_copy<T>(
    x: &PrimitiveArray<T>,
    mean: &[f64],
    std: &[f64],
    of: fn(f64) -> T::Native,
) -> ArrayRef
where
    T: ArrowPrimitiveType,
    T::Native: std::ops::Sub<Output = T::Native> + std::ops::Div<Output = T::Native>,
{
    let mut out = x.values().to_vec();
    affine(&mut out, mean, std, of);
    Arc::new(PrimitiveArray::<T>::new(out.into(), x.nulls().cloned()))
}

#[derive(Debug)]
pub(crate) struct Clip {
    pub stage: StageRef,
    pub columns: Vec<(usize, Option<ArrayRef>, Option<ArrayRef>)>,
    pub schema: SchemaRef,
}

impl super::Transform for Clip {
    fn apply(&self, batch: Batch) -> Result<Batch> {
        let mut cols = batch.data.columns().to_vec();
        for (i, lo, hi) in &self.columns {
            cols[*i] = map_leaf(&cols[*i], &|x| clip_leaf(x, lo.as_ref(), hi.as_ref()))
                .map_err(|e| arrow_err(&self.stage, e))?;
        }
        with_columns(&self.stage, batch, &self.schema, cols)
    }
}

/// `x` bounded to `[lo, hi]` (arrays of `x`'s type: one element, or one per element of the
/// fixed-size list `x` holds the leaf values of — value `i` is element `i % len` of its row).
/// Floats clip as numpy's and torch's `clip`: NaN stays NaN and ±inf become the bounds.
/// (Arrow's comparison kernels order floats totally, NaN above every number: `gt(NaN, hi)`
/// is true, and a `zip` on it turned NaN into `hi`.)
fn clip_leaf(
    x: &ArrayRef,
    lo: Option<&ArrayRef>,
    hi: Option<&ArrayRef>,
) -> Result<ArrayRef, ArrowError> {
    match x.data_type() {
        DataType::Float16 => clip_float::<Float16Type>(x, lo, hi),
        DataType::Float32 => clip_float::<Float32Type>(x, lo, hi),
        DataType::Float64 => clip_float::<Float64Type>(x, lo, hi),
        _ => {
            // Integers: no NaN, the kernels' order is the numbers' order. A per-element bound
            // is laid out along `x` (one `take`) for the same comparison kernels.
            let along = |b: &ArrayRef| -> Result<Box<dyn arrow::array::Datum>, ArrowError> {
                if b.len() == 1 {
                    return Ok(Box::new(Scalar::new(b.clone())));
                }
                let width = b.len() as u32;
                let idx = arrow::array::UInt32Array::from_iter_values(
                    (0..x.len() as u32).map(|i| i % width),
                );
                Ok(Box::new(arrow::compute::take(b, &idx, None)?))
            };
            let mut x = x.clone();
            if let Some(lo) = lo {
                let lo = along(lo)?;
                x = zip(&cmp::lt(&x, lo.as_ref())?, lo.as_ref(), &x)?;
            }
            if let Some(hi) = hi {
                let hi = along(hi)?;
                x = zip(&cmp::gt(&x, hi.as_ref())?, hi.as_ref(), &x)?;
            }
            Ok(x)
        }
    }
}

/// [`clip_leaf`] for a float type, in one pass: `v < lo` and `v > hi` are false for NaN
/// (IEEE 754), so NaN passes through; nulls stay null.
fn clip_float<T: ArrowPrimitiveType>(
    x: &ArrayRef,
    lo: Option<&ArrayRef>,
    hi: Option<&ArrayRef>,
) -> Result<ArrayRef, ArrowError> {
    let bound = |b: Option<&ArrayRef>| -> Result<Option<Vec<T::Native>>, ArrowError> {
        b.map(|b| {
            b.as_primitive_opt::<T>()
                .filter(|p| !p.is_empty() && p.null_count() == 0)
                .map(|p| p.values().to_vec())
                .ok_or_else(|| {
                    ArrowError::InvalidArgumentError(format!(
                        "clip bound of type {} for a {} column",
                        b.data_type(),
                        x.data_type()
                    ))
                })
        })
        .transpose()
    };
    let (lo, hi) = (bound(lo)?, bound(hi)?);
    let a = x
        .as_primitive_opt::<T>()
        .ok_or_else(|| ArrowError::InvalidArgumentError(format!("clip: {}", x.data_type())))?;
    let one = |v: T::Native, lo: Option<T::Native>, hi: Option<T::Native>| {
        let v = match lo {
            Some(l) if v < l => l,
            _ => v,
        };
        match hi {
            Some(h) if v > h => h,
            _ => v,
        }
    };
    let width = [&lo, &hi]
        .iter()
        .filter_map(|b| b.as_ref())
        .map(Vec::len)
        .max()
        .unwrap_or(1);
    if width == 1 {
        let (l, h) = (lo.map(|v| v[0]), hi.map(|v| v[0]));
        return Ok(Arc::new(a.unary::<_, T>(move |v| one(v, l, h))));
    }
    let at = |b: &Option<Vec<T::Native>>, k: usize| b.as_ref().map(|b| b[k % b.len()]);
    let mut out = Vec::with_capacity(a.len());
    for row in a.values().chunks(width) {
        out.extend(
            row.iter()
                .enumerate()
                .map(|(k, &v)| one(v, at(&lo, k), at(&hi, k))),
        );
    }
    Ok(Arc::new(PrimitiveArray::<T>::new(
        out.into(),
        a.nulls().cloned(),
    )))
}

#[derive(Debug)]
pub(crate) struct OneHot {
    pub stage: StageRef,
    pub input: usize,
    pub output: usize,
    pub num_classes: usize,
    /// Label smoothing ε: `(on, off)` = `(1 - ε + ε/k, ε/k)`.
    pub on_off: (f32, f32),
    pub schema: SchemaRef,
}

/// "is 12, outside 0..10 (…)": a class index `v` that `num_classes: k` has no class for,
/// with what to do about it.
fn one_hot_out_of_range(v: i64, k: usize) -> String {
    let fix = if v < 0 {
        format!("a class index is never negative: map the labels to 0..{k} first")
    } else {
        format!(
            "class indices run from 0 to num_classes - 1: set `num_classes` to at least {} if the column has that many classes, or filter such rows out first",
            v.saturating_add(1)
        )
    };
    format!("is {v}, outside 0..{k} ({fix})")
}

impl super::Transform for OneHot {
    fn apply(&self, batch: Batch) -> Result<Batch> {
        let col = batch.data.column(self.input);
        let name = batch.data.schema().field(self.input).name().clone();
        let idx = cast(col, &DataType::Int64).map_err(|e| arrow_err(&self.stage, e))?;
        let idx = idx.as_primitive::<Int64Type>();
        let k = self.num_classes;
        // Validate with kernels first, so the loop below is branch-free on good data.
        let bad = self
            .first_invalid(idx)
            .map_err(|e| arrow_err(&self.stage, e))?;
        if let Some(r) = bad {
            let what = match idx.is_null(r) {
                true => {
                    "is null (fill nulls with `fill_null` or filter them out first)".to_string()
                }
                false => one_hot_out_of_range(idx.value(r), k),
            };
            return Err(Error::Data {
                stage: self.stage.clone(),
                message: format!("class index in column `{name}` {what}"),
                rows: batch.lineage.describe_row(r as u64),
            });
        }
        // No Arrow kernel builds one-hot vectors: fill one preallocated buffer.
        let (on, off) = self.on_off;
        let mut values = vec![off; idx.len() * k];
        for (row, &c) in idx.values().iter().enumerate() {
            values[row * k + c as usize] = on;
        }
        let field = Arc::new(Field::new_list_field(DataType::Float32, false));
        let list = FixedSizeListArray::try_new(
            field,
            k as i32,
            Arc::new(Float32Array::from(values)),
            None,
        )
        .map_err(|e| arrow_err(&self.stage, e))?;
        let mut cols = batch.data.columns().to_vec();
        if self.output == cols.len() {
            cols.push(Arc::new(list));
        } else {
            cols[self.output] = Arc::new(list);
        }
        with_columns(&self.stage, batch, &self.schema, cols)
    }
}

impl OneHot {
    fn first_invalid(&self, idx: &arrow::array::Int64Array) -> Result<Option<usize>, ArrowError> {
        let lo = Scalar::new(arrow::array::Int64Array::from(vec![0]));
        let hi = Scalar::new(arrow::array::Int64Array::from(vec![
            self.num_classes as i64,
        ]));
        let below = cmp::lt(idx, &lo)?;
        let above = cmp::gt_eq(idx, &hi)?;
        let out_of_range = arrow::compute::or(&below, &above)?;
        // Bits under null slots are unspecified: mask them, then mark nulls as invalid.
        let bits = match idx.nulls() {
            Some(n) => &(out_of_range.values() & n.inner()) | &!n.inner(),
            None => out_of_range.values().clone(),
        };
        Ok(bits.set_indices().next())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::{Lineage, Name, Origin};
    use crate::stage::Transform;
    use arrow::array::Float64Array;
    use arrow::compute::kernels::numeric;
    use arrow::datatypes::Schema;

    /// The fused standardize pass gives, bit for bit, what Arrow's `sub` then `div` kernels
    /// give, for float32 (inside a fixed-size list, with nulls) and float64.
    #[test]
    fn standardize_matches_sub_then_div_exactly() {
        let values: Vec<Option<f32>> = (0..999)
            .map(|i| (i % 37 != 0).then(|| (i as f32 * 0.7311).sin() * 1e3 + 0.1))
            .collect();
        let x32: ArrayRef = Arc::new(Float32Array::from(values.clone()));
        let item = Arc::new(Field::new("item", DataType::Float32, true));
        let list: ArrayRef = Arc::new(
            arrow::array::FixedSizeListArray::try_new(item.clone(), 3, x32.clone(), None).unwrap(),
        );
        let x64: ArrayRef = Arc::new(Float64Array::from(
            values[..333]
                .iter()
                .map(|v| v.map(|v| f64::from(v) * 1.1))
                .collect::<Vec<_>>(),
        ));
        let schema = Arc::new(Schema::new(vec![
            Field::new("l", list.data_type().clone(), true),
            Field::new("d", DataType::Float64, true),
        ]));
        let data = RecordBatch::try_new(schema.clone(), vec![list.clone(), x64.clone()]).unwrap();
        let origin = Origin::Object {
            url: Name::from("file:///s.parquet"),
            row_group: 0,
        };
        let batch = Batch::new(data, Lineage::new(origin, 0, 333, 0));
        let (mean, std) = (3.25f64, 7.5f64);
        let stage = Standardize {
            stage: StageRef {
                index: 0,
                kind: "standardize",
                location: None,
            },
            columns: vec![
                StandardizeColumn {
                    index: 0,
                    to: list.data_type().clone(),
                    mean: vec![mean],
                    std: vec![std],
                },
                StandardizeColumn {
                    index: 1,
                    to: DataType::Float64,
                    mean: vec![mean],
                    std: vec![std],
                },
            ],
            schema,
        };
        let out = stage.apply(batch).unwrap();
        let two_kernels = |x: &ArrayRef, m: ArrayRef, s: ArrayRef| {
            numeric::div(&numeric::sub(x, &Scalar::new(m)).unwrap(), &Scalar::new(s)).unwrap()
        };
        let want32 = two_kernels(
            &x32,
            Arc::new(Float32Array::from(vec![mean as f32])),
            Arc::new(Float32Array::from(vec![std as f32])),
        );
        let got32 = out.data.column(0).as_fixed_size_list().values().clone();
        assert_eq!(got32.nulls(), want32.nulls());
        let bits = |a: &ArrayRef| -> Vec<u64> {
            match a.data_type() {
                DataType::Float32 => a
                    .as_primitive::<Float32Type>()
                    .iter()
                    .map(|v| v.map_or(u64::MAX, |v| u64::from(v.to_bits())))
                    .collect(),
                _ => a
                    .as_primitive::<Float64Type>()
                    .iter()
                    .map(|v| v.map_or(u64::MAX, f64::to_bits))
                    .collect(),
            }
        };
        assert_eq!(bits(&got32), bits(&want32));
        let want64 = two_kernels(
            &x64,
            Arc::new(Float64Array::from(vec![mean])),
            Arc::new(Float64Array::from(vec![std])),
        );
        assert_eq!(bits(out.data.column(1)), bits(&want64));
        // Columns no one else holds are rewritten in place (`owned`): the same bits.
        let fresh = |a: &ArrayRef, n: u32| {
            arrow::compute::take(a, &arrow::array::UInt32Array::from_iter_values(0..n), None)
                .unwrap()
        };
        let data = RecordBatch::try_new(
            stage.schema.clone(),
            vec![fresh(&list, 333), fresh(&x64, 333)],
        );
        let owned = Batch::new(data.unwrap(), Lineage::new(origin, 0, 333, 0));
        let again = stage.apply(owned).unwrap();
        let values = again.data.column(0).as_fixed_size_list().values().clone();
        assert_eq!(bits(&values), bits(&want32));
        assert_eq!(bits(again.data.column(1)), bits(&want64));
    }

    /// NaN passes through `clip` (numpy, torch); ±inf and out-of-range values take the bounds.
    #[test]
    fn clip_keeps_nan() {
        let x: ArrayRef = Arc::new(Float32Array::from(vec![
            Some(f32::NAN),
            Some(-f32::NAN),
            Some(f32::INFINITY),
            Some(f32::NEG_INFINITY),
            Some(0.25),
            None,
        ]));
        let lo: ArrayRef = Arc::new(Float32Array::from(vec![-1.0]));
        let hi: ArrayRef = Arc::new(Float32Array::from(vec![1.0]));
        let out = clip_leaf(&x, Some(&lo), Some(&hi)).unwrap();
        let out: Vec<Option<f32>> = out.as_primitive::<Float32Type>().iter().collect();
        assert!(
            out[0].unwrap().is_nan() && out[1].unwrap().is_nan(),
            "{out:?}"
        );
        assert_eq!(out[2..], [Some(1.0), Some(-1.0), Some(0.25), None]);
        // Integers still clip through the comparison kernels.
        let i: ArrayRef = Arc::new(arrow::array::Int32Array::from(vec![-5, 0, 5]));
        let lo: ArrayRef = Arc::new(arrow::array::Int32Array::from(vec![-1]));
        let out = clip_leaf(&i, Some(&lo), None).unwrap();
        assert_eq!(
            out.as_primitive::<arrow::datatypes::Int32Type>()
                .values()
                .to_vec(),
            vec![-1, 0, 5]
        );
    }

    #[test]
    fn one_hot_with_smoothing_spreads_epsilon_over_the_classes() {
        use crate::stage::{OneHotConfig, StageConfig};
        let schema = Arc::new(Schema::new(vec![Field::new("y", DataType::Int32, false)]));
        let data = RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(arrow::array::Int32Array::from(vec![2, 0]))],
        )
        .unwrap();
        let origin = Origin::Object {
            url: Name::from("file:///d.parquet"),
            row_group: 0,
        };
        let batch = Batch::new(data, Lineage::new(origin, 0, 2, 0));
        let sref = StageRef {
            index: 0,
            kind: "one_hot",
            location: None,
        };
        let one_hot = |smoothing: f64| {
            let c = StageConfig::OneHot(OneHotConfig {
                column: "y".into(),
                num_classes: 4,
                output: None,
                smoothing,
            });
            super::super::build(&sref, &c, &schema, None, &Default::default())
        };
        let Ok((super::super::BuiltStage::Map(t), _)) = one_hot(0.2) else {
            panic!("not a map stage");
        };
        let out = t.apply(batch).unwrap();
        let l = out.data.column(0).as_fixed_size_list();
        let v = l
            .values()
            .as_primitive::<arrow::datatypes::Float32Type>()
            .values();
        // ε = 0.2 over 4 classes: 0.05 each, the class 1 - 0.2 + 0.05 = 0.85.
        assert_eq!(&v[..], &[0.05, 0.05, 0.85, 0.05, 0.85, 0.05, 0.05, 0.05]);
        let e = one_hot(1.0).err().unwrap().to_string();
        assert!(e.contains("`smoothing` must be in [0, 1)"), "{e}");
    }
}
