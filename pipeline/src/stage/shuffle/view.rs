//! Byte columns emitted as `BinaryView` arrays over the window's buffers, without copying.

use std::sync::Arc;

use arrow::array::builder::make_view;
use arrow::array::{Array, ArrayRef, AsArray, BinaryViewArray, FixedSizeListArray, RecordBatch};
use arrow::buffer::{Buffer, NullBuffer};
use arrow::datatypes::{DataType, Schema};

/// `schema` with each of `columns` typed `BinaryView`: the schema of what [`views`] returns,
/// and what the plan gives the stages after a shuffle that emits views.
pub(crate) fn view_schema(schema: &Schema, columns: &[usize]) -> Schema {
    let mut fields = crate::stage::owned_fields(schema);
    for &i in columns {
        fields[i] = fields[i].clone().with_data_type(DataType::BinaryView);
    }
    Schema::new_with_metadata(fields, schema.metadata().clone())
}

/// `rb` with each of `columns` (binary, large binary, fixed-size binary, or a fixed-size list
/// of float32/float64 whose items are never null — `stage::gathered`) as a `BinaryView` array
/// over the same value buffer: one 16-byte view per row, no bytes copied (a binary buffer of
/// 4 GiB or more is copied: views address at most 4 GiB).
pub(crate) fn views(rb: &RecordBatch, columns: &[usize]) -> arrow::error::Result<RecordBatch> {
    if columns.is_empty() {
        return Ok(rb.clone());
    }
    let mut arrays = rb.columns().to_vec();
    for &i in columns {
        let a = &arrays[i];
        let viewed: ArrayRef = match a.data_type() {
            DataType::BinaryView => continue,
            DataType::Binary => Arc::new(BinaryViewArray::from(a.as_binary::<i32>())),
            DataType::LargeBinary => Arc::new(BinaryViewArray::from(a.as_binary::<i64>())),
            DataType::FixedSizeBinary(_) => {
                let a = a.as_fixed_size_binary();
                let size = a.value_size();
                // (`values` starts at the array's first row.)
                let rows = FixedRows::new(a.values(), 0, size, a.len(), a.nulls());
                Arc::new(rows.views(u32::MAX as usize - 1))
            }
            DataType::FixedSizeList(..) if crate::stage::viewable_list(a.data_type()) => {
                Arc::new(list_views(a.as_fixed_size_list()))
            }
            other => {
                return Err(arrow::error::ArrowError::InvalidArgumentError(format!(
                    "column {i} is {other}, not bytes"
                )));
            }
        };
        arrays[i] = viewed;
    }
    RecordBatch::try_new(Arc::new(view_schema(&rb.schema(), columns)), arrays)
}

/// A fixed-size list of fixed-width items with no null items, as views of each row's bytes in
/// its values buffer (a null row is a null view).
fn list_views(list: &FixedSizeListArray) -> BinaryViewArray {
    list_rows(list).views(u32::MAX as usize - 1)
}

/// The rows of a fixed-size list of fixed-width items, as bytes of its values buffer.
fn list_rows(list: &FixedSizeListArray) -> FixedRows<'_> {
    let values = list.values().to_data();
    let item = values.data_type().primitive_width().unwrap_or(1);
    let size = list.value_length().max(0) as usize * item;
    let buffer = values.buffers().first().cloned().unwrap_or_default();
    let base = values.offset() * item;
    FixedRows::new(&buffer, base, size, list.len(), list.nulls())
}

/// Rows of `size` bytes each, back to back in `buffer` from byte `base`.
struct FixedRows<'a> {
    buffer: Buffer,
    base: usize,
    size: usize,
    len: usize,
    nulls: Option<&'a NullBuffer>,
}

impl<'a> FixedRows<'a> {
    fn new(
        buffer: &Buffer,
        base: usize,
        size: usize,
        len: usize,
        nulls: Option<&'a NullBuffer>,
    ) -> Self {
        FixedRows {
            buffer: buffer.clone(),
            base,
            size,
            len,
            nulls,
        }
    }

    /// The rows as views, over blocks of at most `limit` bytes: a larger buffer is added as
    /// several blocks over it, each starting at a row (nothing copied); a null row is a null
    /// view.
    ///
    /// The views are made here rather than with `BinaryViewBuilder`, which took 3.4 % of the
    /// tabular bench's CPU (2026-12-01): a view holds its row's first four bytes, and a whole
    /// window's rows are viewed at once, long after they were decoded, so reading those bytes
    /// missed the cache once per row. The first line of the row 16 ahead is asked for while
    /// this one is viewed.
    fn views(&self, limit: usize) -> BinaryViewArray {
        const AHEAD: usize = 16;
        let bytes = self.buffer.as_slice();
        let row = |r: usize| {
            let at = self.base + r * self.size;
            bytes.get(at..at + self.size)
        };
        let mut views: Vec<u128> = Vec::with_capacity(self.len);
        let mut blocks: Vec<Buffer> = Vec::new();
        let mut block: Option<usize> = None;
        for r in 0..self.len {
            if let Some(ahead) = row(r + AHEAD) {
                crate::stage::pixels::prefetch(&ahead[..ahead.len().min(1)]);
            }
            let (at, Some(data)) = (self.base + r * self.size, row(r)) else {
                views.push(0);
                continue;
            };
            if self.nulls.is_some_and(|n| n.is_null(r)) {
                views.push(0);
                continue;
            }
            let start = match block {
                Some(start) if at + self.size - start <= limit => start,
                _ => {
                    // The first block starts at the first row, null or not (a whole buffer is
                    // one block); the others at the row that did not fit.
                    let from = match block {
                        None if at + self.size - self.base <= limit => self.base,
                        _ => at,
                    };
                    let len = bytes.len().saturating_sub(from).min(limit);
                    blocks.push(self.buffer.slice_with_length(from, len));
                    block = Some(from);
                    from
                }
            };
            let id = (blocks.len() - 1) as u32;
            views.push(make_view(data, id, (at - start) as u32));
        }
        #[allow(unsafe_code)]
        // SAFETY: `try_new` would accept these parts: every view of a valid row was made by
        // `make_view` from the row's bytes, which lie in block `id` at the offset it names
        // (a block starts at a row of the buffer and reaches at least to the end of every row
        // viewed in it, and is shorter than 4 GiB); null rows (and rows past the buffer,
        // which a valid array does not have) are zero views, marked null or empty.
        unsafe {
            BinaryViewArray::new_unchecked(views.into(), blocks.into(), self.nulls.cloned())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::Float32Array;
    use arrow::buffer::NullBuffer;
    use arrow::datatypes::Field;

    /// Rows split over blocks of a small limit (as a buffer of 4 GiB or more is) keep their
    /// bytes, and a sliced list's rows are the slice's.
    #[test]
    fn rows_over_several_blocks_keep_their_bytes() {
        let item = Arc::new(Field::new("item", DataType::Float32, false));
        let values = Float32Array::from_iter_values((0..40).map(|v| v as f32));
        let nulls = NullBuffer::from(vec![
            true, true, false, true, true, true, true, true, true, true,
        ]);
        let list = FixedSizeListArray::try_new(item, 4, Arc::new(values), Some(nulls)).unwrap();
        let list = list.slice(1, 8);
        for limit in [16, 40, 1 << 20] {
            let v = list_rows(&list).views(limit);
            assert_eq!(v.len(), 8);
            assert!(v.is_null(1));
            for r in (0..8).filter(|&r| r != 1) {
                let want: Vec<u8> = (0..4)
                    .flat_map(|k| (((r + 1) * 4 + k) as f32).to_le_bytes())
                    .collect();
                assert_eq!(v.value(r), want.as_slice(), "limit {limit} row {r}");
            }
            let blocks = v.data_buffers().len();
            assert!(
                if limit == 16 { blocks == 7 } else { blocks < 7 },
                "{limit}: {blocks}"
            );
        }
    }
}
