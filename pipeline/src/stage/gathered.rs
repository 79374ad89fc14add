//! Per-value stages reading a shuffle's rows where the window holds them.
//!
//! A shuffle's gather copies every row it emits (`interleave`); `gaussian_noise` or
//! `feature_dropout` (with a fused `standardize`, see [`fused`](super::fused)) then reads and
//! writes each value again, a whole batch later — on the tabular bench, 4096 rows × 512
//! bytes, more than the L2 cache. When the plan pass `exec::passes::fuse_gathers` finds such
//! a stage after a shuffle (only `batch` stages or a deferred `standardize` in between), the
//! shuffle hands the fixed-size list column over as `BinaryView` rows pointing into its window
//! (16 bytes per row, nothing copied; [`shuffle::views`](super::shuffle)), and the stage
//! copies each row out of the window into its output and does its work on it there, while
//! the row is in the L1 cache. The values are bit for bit the same: the same row gets the
//! same work, only read from elsewhere.
//!
//! Only lists whose items cannot be null ([`viewable_list`]): a view holds a row's bytes,
//! not its items' validity. (A null row stays null; its values, undefined, are zeros.)

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, BinaryViewArray, FixedSizeListArray, PrimitiveArray};
use arrow::datatypes::{DataType, FieldRef};

use super::augment::{Float, Noise, row_work};
use super::fused::RowAffine;
use super::kernels::StandardizeColumn;

/// Whether a shuffle may hand a column of type `t` to a per-value stage as views: a
/// fixed-size list of float32 or float64 whose items are never null.
pub(crate) fn viewable_list(t: &DataType) -> bool {
    matches!(t, DataType::FixedSizeList(item, n)
        if *n > 0
            && !item.is_nullable()
            && matches!(item.data_type(), DataType::Float32 | DataType::Float64))
}

/// `noise` (after `pre`) over rows given as views of their little-endian bytes, written as a
/// fixed-size list of `(item, size)`: each row copied once, into the output, and worked on
/// there. `ids` holds each row's identity ([`super::augment::row_ids`]).
pub(super) fn augment_views<T: Float>(
    rows: &BinaryViewArray,
    (item, size): (&FieldRef, i32),
    ids: &[u64],
    key: [u8; 32],
    noise: Noise,
    pre: Option<&StandardizeColumn>,
) -> Result<ArrayRef, String>
where
    T::Native: std::ops::Sub<Output = T::Native> + std::ops::Div<Output = T::Native>,
{
    let width = size.max(0) as usize;
    let bytes = width * std::mem::size_of::<T::Native>();
    if ids.len() != rows.len() {
        return Err(format!(
            "{} row identities for {} rows",
            ids.len(),
            rows.len()
        ));
    }
    let pre = pre.map(|c| RowAffine::new(&c.mean, &c.std, T::of));
    let mut work = row_work::<T>(key, noise, pre.as_ref());
    // Written row by row, never zeroed first (a fresh buffer filled by `extend`).
    let mut out: Vec<T::Native> = Vec::with_capacity(rows.len() * width);
    // Rows are scattered over the window and rarely cached: the bytes of the row two ahead
    // are asked for while this one is worked on (as the image stage does).
    const AHEAD: usize = 2;
    let ahead = |r: usize| {
        if r < rows.len() && rows.is_valid(r) {
            super::pixels::prefetch(rows.value(r));
        }
    };
    (0..AHEAD).for_each(ahead);
    for (r, id) in ids.iter().enumerate() {
        ahead(r + AHEAD);
        let start = out.len();
        if rows.is_null(r) {
            out.resize(start + width, T::Native::default());
            continue;
        }
        let row = rows.value(r);
        if row.len() != bytes {
            return Err(format!(
                "row {r} holds {} bytes, not the {bytes} of a list of {width} {}",
                row.len(),
                item.data_type()
            ));
        }
        T::extend_from_le(&mut out, row);
        work(&mut out[start..], *id);
    }
    let values = PrimitiveArray::<T>::new(out.into(), None);
    FixedSizeListArray::try_new(item.clone(), size, Arc::new(values), rows.nulls().cloned())
        .map(|a| Arc::new(a) as ArrayRef)
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use arrow::array::{AsArray, Float32Array, Float64Array, RecordBatch};
    use arrow::buffer::NullBuffer;
    use arrow::datatypes::{Field, Schema};

    use super::*;
    use crate::batch::{Batch, Lineage, Name, Origin};
    use crate::error::StageRef;
    use crate::stage::Transform;
    use crate::stage::augment::{Augment, column_key};
    use crate::state::Draws;

    /// Rows of `width` values (row 3 null), as a batch of one fixed-size list column, its
    /// values a slice of a larger buffer (as a decoder's batch may be).
    fn batch(f64s: bool, width: i32) -> Batch {
        let n = 9usize;
        let w = width as usize;
        let t = if f64s {
            DataType::Float64
        } else {
            DataType::Float32
        };
        let item = Arc::new(Field::new("item", t, false));
        let all = (0..(n + 2) * w).map(|v| (v as f64 * 0.37).sin() * 10.0);
        let values: ArrayRef = if f64s {
            Arc::new(Float64Array::from_iter_values(all))
        } else {
            Arc::new(Float32Array::from_iter_values(all.map(|v| v as f32)))
        };
        let values = values.slice(2 * w, n * w);
        let nulls = NullBuffer::from((0..n).map(|r| r != 3).collect::<Vec<_>>());
        let x = FixedSizeListArray::try_new(item.clone(), width, values, Some(nulls)).unwrap();
        let schema = Arc::new(Schema::new(vec![Field::new(
            "x",
            DataType::FixedSizeList(item, width),
            true,
        )]));
        let data = RecordBatch::try_new(schema, vec![Arc::new(x)]).unwrap();
        let origin = Origin::Object {
            url: Name::from("file:///d.parquet"),
            row_group: 0,
        };
        Batch::new(data, Lineage::new(origin, 5, n as u64, 1))
    }

    fn stage(noise: Noise, schema: arrow::datatypes::SchemaRef, pre: bool) -> Augment {
        let width = match schema.field(0).data_type() {
            DataType::FixedSizeList(_, n) => *n as usize,
            _ => unreachable!(),
        };
        Augment {
            stage: StageRef {
                index: 2,
                kind: "gaussian_noise",
                location: None,
            },
            noise,
            columns: vec![(0, column_key(7, 2, "x"))],
            schema: schema.clone(),
            pre: vec![pre.then(|| StandardizeColumn {
                index: 0,
                to: schema.field(0).data_type().clone(),
                mean: (0..width).map(|k| k as f64 - 1.5).collect(),
                std: vec![0.75],
            })],
        }
    }

    /// The stage on the shuffle's views of a batch gives bit for bit what it gives on the
    /// batch itself, for every noise, with and without a fused `standardize`; a null row
    /// stays null.
    #[test]
    fn views_give_the_values_of_the_list_itself() {
        let noises = [
            Noise::Gaussian {
                std: 0.5,
                draws: Draws::ChaCha8,
            },
            Noise::Gaussian {
                std: 0.5,
                draws: Draws::SplitMix64,
            },
            Noise::Gaussian {
                std: 0.5,
                draws: Draws::Ars,
            },
            Noise::Dropout { p: 0.3, scale: 1.5 },
        ];
        for (f64s, width, noise, pre) in [false, true]
            .into_iter()
            .flat_map(|f| [1, 5, 128].map(move |w| (f, w)))
            .flat_map(|(f, w)| noises.map(move |n| (f, w, n)))
            .flat_map(|(f, w, n)| [false, true].map(move |p| (f, w, n, p)))
        {
            let b = batch(f64s, width);
            let s = stage(noise, b.data.schema(), pre);
            assert!(s.takes_views(0));
            let viewed = crate::stage::shuffle::views(&b.data, &[0]).unwrap();
            assert_eq!(viewed.column(0).data_type(), &DataType::BinaryView);
            let direct = s.apply(b.clone()).unwrap();
            let via = s.apply(b.with_data(viewed)).unwrap();
            assert_eq!(via.data.schema(), direct.data.schema());
            let (a, v) = (
                direct.data.column(0).as_fixed_size_list(),
                via.data.column(0).as_fixed_size_list(),
            );
            assert!(v.is_null(3) && a.is_null(3));
            for r in (0..a.len()).filter(|&r| r != 3) {
                let bits = |l: &FixedSizeListArray| -> Vec<u64> {
                    let row = l.value(r);
                    if f64s {
                        row.as_primitive::<arrow::datatypes::Float64Type>()
                            .values()
                            .iter()
                            .map(|x| x.to_bits())
                            .collect()
                    } else {
                        row.as_primitive::<arrow::datatypes::Float32Type>()
                            .values()
                            .iter()
                            .map(|x| u64::from(x.to_bits()))
                            .collect()
                    }
                };
                assert_eq!(bits(a), bits(v), "{f64s} {width} {noise:?} {pre} row {r}");
            }
        }
    }

    /// Lists whose items may be null are not handed over (a view has no item validity), nor
    /// are lists of other types.
    #[test]
    fn only_lists_of_never_null_floats_are_viewable() {
        let list = |t: DataType, nullable: bool| {
            DataType::FixedSizeList(Arc::new(Field::new("item", t, nullable)), 4)
        };
        assert!(viewable_list(&list(DataType::Float32, false)));
        assert!(viewable_list(&list(DataType::Float64, false)));
        assert!(!viewable_list(&list(DataType::Float32, true)));
        assert!(!viewable_list(&list(DataType::Int32, false)));
        assert!(!viewable_list(&DataType::Float32));
    }

    /// A row of the wrong length (a bug upstream) is an error naming the row, not a panic.
    #[test]
    fn a_row_of_the_wrong_length_is_an_error() {
        let mut rows = arrow::array::BinaryViewBuilder::new();
        rows.append_value([0u8; 16]);
        rows.append_value([0u8; 12]);
        let rows = rows.finish();
        let item = Arc::new(Field::new("item", DataType::Float32, false));
        let noise = Noise::Dropout { p: 0.1, scale: 1.0 };
        let err = augment_views::<arrow::datatypes::Float32Type>(
            &rows,
            (&item, 4),
            &[1, 2],
            [0; 32],
            noise,
            None,
        )
        .unwrap_err();
        assert!(err.contains("row 1 holds 12 bytes, not the 16"), "{err}");
    }
}
