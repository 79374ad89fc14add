//! Gathering a permuted window's rows: arrow's `interleave` for every column, except the view
//! columns ([`super::ShuffleSpec::views`]), whose 16-byte views are gathered here.
//!
//! Written by hand because `interleave` reads each row's view at a random place in the
//! window's view arrays (1.6 MB for the tabular bench's 100k rows) without asking for it
//! ahead: 2.9 % of that bench's samples, 94 % of them on that one read (perf, 2026-12-02).
//! Here the view eight rows ahead is prefetched while this one is copied, so the misses
//! overlap.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BinaryViewArray, RecordBatch, RecordBatchOptions};
use arrow::buffer::{Buffer, ScalarBuffer};
use arrow::compute::interleave;
use arrow::datatypes::DataType;
use arrow::error::ArrowError;

use crate::stage::pixels::prefetch;

/// The rows `idx` (`(piece, row)`) of `pieces`, which share one schema.
pub(super) fn gather(
    pieces: &[RecordBatch],
    idx: &[(usize, usize)],
) -> Result<RecordBatch, ArrowError> {
    let Some(first) = pieces.first() else {
        return Err(ArrowError::InvalidArgumentError(
            "a gather from no batches".into(),
        ));
    };
    let schema = first.schema();
    let columns = (0..schema.fields().len())
        .map(|c| {
            let arrays: Vec<&dyn Array> = pieces.iter().map(|p| p.column(c).as_ref()).collect();
            match views_of(&arrays) {
                Some(views) => Ok(Arc::new(gather_views(&views, idx)?) as ArrayRef),
                None => interleave(&arrays, idx),
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    let options = RecordBatchOptions::new().with_row_count(Some(idx.len()));
    RecordBatch::try_new_with_options(schema, columns, &options)
}

/// The arrays as view arrays when every one is one without nulls (the view columns a shuffle
/// makes: `stage::gathered` takes lists whose rows are never null); else `None`.
fn views_of<'a>(arrays: &[&'a dyn Array]) -> Option<Vec<&'a BinaryViewArray>> {
    arrays
        .iter()
        .map(|a| match a.data_type() {
            DataType::BinaryView if a.null_count() == 0 => Some(a.as_binary_view()),
            _ => None,
        })
        .collect()
}

/// The views `idx` of `arrays`, their buffer indices renumbered into one list holding each
/// distinct buffer once (pieces cut from one page share its buffer). Every buffer of the
/// pieces is listed, used by these rows or not: a batch drawn at random from a window uses
/// nearly all of them, and the queues count a view column by its rows' bytes, not its buffers.
fn gather_views(
    arrays: &[&BinaryViewArray],
    idx: &[(usize, usize)],
) -> Result<BinaryViewArray, ArrowError> {
    let mut buffers: Vec<Buffer> = Vec::new();
    // Each distinct buffer's place in `buffers`, by what `Buffer::ptr_eq` compares (start and
    // length): a lookup per buffer, where a search of the list would grow with its square.
    let mut seen: HashMap<(*const u8, usize), u32> = HashMap::new();
    let renumber: Vec<Vec<u32>> = arrays
        .iter()
        .map(|a| {
            a.data_buffers()
                .iter()
                .map(|b| match seen.entry((b.as_ptr(), b.len())) {
                    Entry::Occupied(at) => Ok(*at.get()),
                    Entry::Vacant(slot) => {
                        let at = u32::try_from(buffers.len()).map_err(|_| {
                            ArrowError::InvalidArgumentError("over 2³² view buffers".into())
                        })?;
                        buffers.push(b.clone());
                        Ok(*slot.insert(at))
                    }
                })
                .collect()
        })
        .collect::<Result<_, ArrowError>>()?;
    const AHEAD: usize = 8;
    let mut views: Vec<u128> = Vec::with_capacity(idx.len());
    for (i, &(p, r)) in idx.iter().enumerate() {
        if let Some(&(q, s)) = idx.get(i + AHEAD)
            && let Some(ahead) =
                (arrays.get(q)).and_then(|a| a.views().inner().as_slice().get(s * 16..s * 16 + 16))
        {
            prefetch(ahead);
        }
        let (array, map) = (arrays[p], &renumber[p]);
        let view = *array.views().get(r).ok_or_else(|| {
            ArrowError::InvalidArgumentError(format!("row {r} of a piece of {}", array.len()))
        })?;
        // Up to 12 bytes sit in the view itself; a longer value's view names its buffer in
        // bits 64..96.
        let view = if view as u32 <= 12 {
            view
        } else {
            let buffer = (view >> 64) as u32 as usize;
            let to = u128::from(map[buffer]);
            (view & !(u128::from(u32::MAX) << 64)) | (to << 64)
        };
        views.push(view);
    }
    let views = ScalarBuffer::from(views);
    // SAFETY: every view is one of a valid array's views, its value in the same buffer at the
    // same offset, which `buffers` holds at the index written into it; there are no nulls.
    // (`try_new` would read every value's prefix again: the cache miss this avoids.)
    #[allow(unsafe_code)]
    Ok(unsafe { BinaryViewArray::new_unchecked(views, buffers.into(), None) })
}

#[cfg(test)]
mod tests {
    use arrow::array::{Int64Array, StringArray};
    use arrow::compute::interleave_record_batch;

    use super::*;

    /// Pieces with a view column (short values inside the view, long ones in buffers, two
    /// pieces sharing one buffer), a label and a string column.
    fn pieces() -> Vec<RecordBatch> {
        let long = |i: usize| format!("value {i:04} long enough to leave its view").into_bytes();
        let shared = BinaryViewArray::from_iter_values((0..40).map(|i| {
            if i % 5 == 0 {
                vec![i as u8; 3]
            } else {
                long(i)
            }
        }));
        let other = BinaryViewArray::from_iter_values((100..130).map(long));
        let piece = |views: BinaryViewArray, first: i64| {
            let n = views.len();
            RecordBatch::try_from_iter([
                ("x", Arc::new(views) as ArrayRef),
                (
                    "y",
                    Arc::new(Int64Array::from_iter_values(first..first + n as i64)) as _,
                ),
                (
                    "s",
                    Arc::new(StringArray::from_iter_values(
                        (0..n).map(|i| format!("{first}-{i}")),
                    )) as _,
                ),
            ])
            .unwrap()
        };
        vec![
            piece(shared.slice(0, 25), 0),
            piece(other, 1000),
            piece(shared.slice(25, 15), 25),
        ]
    }

    #[test]
    fn the_rows_are_those_interleave_gives_with_each_buffer_listed_once() {
        let pieces = pieces();
        let idx: Vec<(usize, usize)> = (0..70)
            .map(|k| match k % 3 {
                0 => (0, (k * 7) % 25),
                1 => (1, (k * 11) % 30),
                _ => (2, (k * 5) % 15),
            })
            .collect();
        let refs: Vec<&RecordBatch> = pieces.iter().collect();
        let want = interleave_record_batch(&refs, &idx).unwrap();
        let got = gather(&pieces, &idx).unwrap();
        assert_eq!(got.schema(), want.schema());
        let bytes = |b: &RecordBatch| {
            (b.column(0).as_binary_view().iter())
                .map(|v| v.unwrap().to_vec())
                .collect::<Vec<_>>()
        };
        assert_eq!(bytes(&got), bytes(&want));
        assert_eq!(got.column(1).as_ref(), want.column(1).as_ref());
        assert_eq!(got.column(2).as_ref(), want.column(2).as_ref());
        // The shared buffer and the other piece's: two, not three.
        assert_eq!(got.column(0).as_binary_view().data_buffers().len(), 2);
        got.column(0).to_data().validate_full().unwrap();
    }

    #[test]
    fn a_view_column_with_nulls_is_left_to_interleave_and_a_bad_row_is_an_error() {
        let with_null = BinaryViewArray::from(vec![Some(b"a".as_slice()), None]);
        let rb = RecordBatch::try_from_iter([("x", Arc::new(with_null) as ArrayRef)]).unwrap();
        let got = gather(std::slice::from_ref(&rb), &[(0, 1), (0, 0)]).unwrap();
        assert!(got.column(0).is_null(0) && got.column(0).is_valid(1));
        let pieces = pieces();
        assert!(gather(&pieces, &[(1, 30)]).is_err(), "row 30 of 30");
        assert!(gather(&[], &[]).is_err());
    }
}
