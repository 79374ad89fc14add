//! Mean and standard deviation of `standardize` columns, computed in a first pass over the
//! source: nulls, NaN and ±inf are left out (the caller decides whether a NaN or ±inf stops
//! the run, see `non_finite`), and the first such value is found with its row.

use arrow::array::{
    Array, ArrayRef, AsArray, Float64Array, GenericListArray, OffsetSizeTrait, Scalar,
};
use arrow::buffer::{BooleanBuffer, NullBuffer};
use arrow::compute::cast;
use arrow::compute::kernels::numeric;
use arrow::datatypes::{DataType, Float64Type};
use arrow::error::ArrowError;

/// Mean and standard deviation of a column, merged across batches with Chan et al.'s formula.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ColumnStats {
    /// Values folded in: not null, finite.
    pub count: u64,
    pub mean: f64,
    /// Sum of squared deviations from the mean.
    pub m2: f64,
    /// NaN and ±inf values left out (`non_finite: skip`).
    pub skipped: u64,
    /// Where the first value left out was (the row's lineage), for the run summary.
    pub first_skipped: Option<String>,
    given_std: Option<f64>,
}

/// The first NaN or ±inf value [`ColumnStats::update`] met in an array.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct NonFiniteValue {
    /// Row of the array (of the batch) that holds it.
    pub row: usize,
    /// The value (NaN, `inf` or `-inf`), as float64.
    pub value: f64,
}

impl ColumnStats {
    pub(crate) fn empty() -> Self {
        ColumnStats {
            count: 0,
            mean: 0.0,
            m2: 0.0,
            skipped: 0,
            first_skipped: None,
            given_std: None,
        }
    }

    pub(crate) fn given(mean: f64, std: f64) -> Self {
        ColumnStats {
            given_std: Some(std),
            mean,
            ..ColumnStats::empty()
        }
    }

    /// Population standard deviation; 1 when it is 0 (constant column), as scikit-learn does.
    pub(crate) fn std(&self) -> f64 {
        if let Some(s) = self.given_std {
            return s;
        }
        let s = if self.count > 0 {
            (self.m2 / self.count as f64).sqrt()
        } else {
            0.0
        };
        if s > 0.0 && s.is_finite() { s } else { 1.0 }
    }

    /// Folds in every non-null, finite leaf value of `array`; NaN and ±inf values are left
    /// out and counted in `skipped`, and the first of them is returned (with its row), so the
    /// caller can stop there instead (`non_finite: error`).
    pub(crate) fn update(
        &mut self,
        array: &ArrayRef,
    ) -> Result<Option<NonFiniteValue>, ArrowError> {
        let leaf = leaf_values(array);
        let x = cast(&leaf, &DataType::Float64)?;
        let xf = x.as_primitive::<Float64Type>();
        let valid = xf.len() - xf.null_count();
        if valid == 0 {
            return Ok(None);
        }
        let sum = arrow::compute::sum(xf).unwrap_or(0.0);
        // Any NaN or ±inf makes the sum NaN or ±inf: a finite sum proves there is none, and
        // the common case pays for no mask. (A non-finite sum of finite values — an overflow —
        // finds nothing to leave out below, and the caller refuses the statistics.)
        let (masked, first) = if sum.is_finite() {
            (None, None)
        } else {
            let values = xf.values();
            let first = (0..xf.len()).find(|&i| xf.is_valid(i) && !values[i].is_finite());
            let finite = BooleanBuffer::collect_bool(xf.len(), |i| values[i].is_finite());
            let keep = match xf.nulls() {
                Some(n) => &finite & n.inner(),
                None => finite,
            };
            let kept = Float64Array::try_new(values.clone(), Some(NullBuffer::new(keep)))?;
            (Some(kept), first)
        };
        let (xf, sum) = match &masked {
            Some(kept) => (kept, arrow::compute::sum(kept).unwrap_or(0.0)),
            None => (xf, sum),
        };
        let n = (xf.len() - xf.null_count()) as u64;
        let first = first.map(|i| NonFiniteValue {
            row: row_of_leaf(array, i),
            value: x.as_primitive::<Float64Type>().value(i),
        });
        self.skipped += valid as u64 - n;
        if n == 0 {
            return Ok(first);
        }
        let mean = sum / n as f64;
        let centered = numeric::sub(xf, &Scalar::new(Float64Array::from(vec![mean])))?;
        let sq = numeric::mul(&centered, &centered)?;
        let m2 = arrow::compute::sum(sq.as_primitive::<Float64Type>()).unwrap_or(0.0);
        self.merge(n, mean, m2);
        Ok(first)
    }

    /// Merges `n` values with mean `mean` and squared deviations `m2` (Chan et al.).
    fn merge(&mut self, n: u64, mean: f64, m2: f64) {
        if n == 0 {
            return;
        }
        let total = self.count + n;
        let delta = mean - self.mean;
        self.mean += delta * n as f64 / total as f64;
        self.m2 += m2 + delta * delta * (self.count as f64) * (n as f64) / total as f64;
        self.count = total;
    }
}

/// Folds a `fixed_size_list` column into one [`ColumnStats`] per element (`stats[k]` takes
/// element `k` of every row): per-feature statistics, as scikit-learn's `StandardScaler`.
/// Null rows and null elements are left out, NaN and ±inf counted in the element's `skipped`;
/// the first of them is returned with its row. Written as one loop over rows (two passes:
/// the batch's means, then squared deviations from them, merged by Chan et al.) — Arrow has
/// no strided per-element aggregate.
pub(crate) fn update_elements(
    stats: &mut [ColumnStats],
    array: &ArrayRef,
) -> Result<Option<NonFiniteValue>, ArrowError> {
    let width = stats.len();
    let list = array.as_fixed_size_list();
    if list.value_length() as usize != width || width == 0 {
        return Err(ArrowError::InvalidArgumentError(format!(
            "{} elements per row, statistics for {width}",
            list.value_length()
        )));
    }
    let values = list
        .values()
        .slice(list.offset() * width, list.len() * width);
    let x = cast(&values, &DataType::Float64)?;
    let xf = x.as_primitive::<Float64Type>();
    let v = xf.values();
    let keep = |r: usize, i: usize| list.is_valid(r) && xf.is_valid(i);
    let mut count = vec![0u64; width];
    let mut sum = vec![0.0f64; width];
    let mut first = None;
    for r in 0..list.len() {
        for k in 0..width {
            let i = r * width + k;
            if !keep(r, i) {
                continue;
            }
            if v[i].is_finite() {
                count[k] += 1;
                sum[k] += v[i];
            } else {
                stats[k].skipped += 1;
                first.get_or_insert(NonFiniteValue {
                    row: r,
                    value: v[i],
                });
            }
        }
    }
    let mean: Vec<f64> = (0..width)
        .map(|k| sum[k] / count[k].max(1) as f64)
        .collect();
    let mut m2 = vec![0.0f64; width];
    for r in 0..list.len() {
        for k in 0..width {
            let i = r * width + k;
            if keep(r, i) && v[i].is_finite() {
                let d = v[i] - mean[k];
                m2[k] += d * d;
            }
        }
    }
    for (k, st) in stats.iter_mut().enumerate() {
        st.merge(count[k], mean[k], m2[k]);
    }
    Ok(first)
}

/// The row of `array` holding value `leaf` of [`leaf_values`]`(array)`.
fn row_of_leaf(array: &ArrayRef, leaf: usize) -> usize {
    match array.data_type() {
        DataType::List(_) => list_row_of_leaf(array.as_list::<i32>(), leaf),
        DataType::LargeList(_) => list_row_of_leaf(array.as_list::<i64>(), leaf),
        DataType::FixedSizeList(_, n) => {
            let l = array.as_fixed_size_list();
            let n = (*n as usize).max(1);
            let values = l.values().slice(l.offset() * n, l.len() * n);
            row_of_leaf(&values, leaf) / n
        }
        _ => leaf,
    }
}

fn list_row_of_leaf<O: OffsetSizeTrait>(l: &GenericListArray<O>, leaf: usize) -> usize {
    let offsets = l.value_offsets();
    let (start, end) = (offsets[0].as_usize(), offsets[l.len()].as_usize());
    let at = start + row_of_leaf(&l.values().slice(start, end - start), leaf);
    // The last row starting at or before `at` (rows before it may be empty).
    offsets
        .partition_point(|&o| o.as_usize() <= at)
        .saturating_sub(1)
}

/// The visible leaf values of a (possibly nested) list array, or the array itself.
fn leaf_values(array: &ArrayRef) -> ArrayRef {
    match array.data_type() {
        DataType::List(_) => {
            let l = array.as_list::<i32>();
            let (start, end) = (
                l.value_offsets()[0] as usize,
                l.value_offsets()[l.len()] as usize,
            );
            leaf_values(&l.values().slice(start, end - start))
        }
        DataType::LargeList(_) => {
            let l = array.as_list::<i64>();
            let (start, end) = (
                l.value_offsets()[0] as usize,
                l.value_offsets()[l.len()] as usize,
            );
            leaf_values(&l.values().slice(start, end - start))
        }
        DataType::FixedSizeList(_, n) => {
            let l = array.as_fixed_size_list();
            leaf_values(
                &l.values()
                    .slice(l.offset() * *n as usize, l.len() * *n as usize),
            )
        }
        _ => array.clone(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use arrow::array::{FixedSizeListArray, Float32Array};
    use arrow::datatypes::Field;

    /// NaN and ±inf are left out and counted, the first one found with its row (of a sliced
    /// fixed-size list here); the mean merges across updates.
    #[test]
    fn column_stats_leave_non_finite_values_out_and_find_their_row() {
        let item = Arc::new(Field::new("item", DataType::Float32, true));
        let values = Float32Array::from(vec![1.0, 2.0, 3.0, f32::NAN, 5.0, f32::INFINITY]);
        let list: ArrayRef =
            Arc::new(FixedSizeListArray::try_new(item, 2, Arc::new(values), None).unwrap());
        let mut st = ColumnStats::empty();
        // Rows 1 and 2: [3, NaN], [5, inf]; the NaN is in row 0 of the slice.
        let first = st.update(&list.slice(1, 2)).unwrap().unwrap();
        assert_eq!(first.row, 0);
        assert!(first.value.is_nan());
        assert_eq!((st.count, st.skipped, st.mean), (2, 2, 4.0));
        assert_eq!(st.update(&list.slice(0, 1)).unwrap(), None);
        assert_eq!((st.count, st.skipped, st.mean), (4, 2, 2.75));
        // (1-2.75)² + (2-2.75)² + (3-2.75)² + (5-2.75)² = 8.75
        assert!((st.m2 - 8.75).abs() < 1e-12, "{}", st.m2);
    }
}
