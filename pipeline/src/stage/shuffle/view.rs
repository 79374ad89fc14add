//! Byte columns emitted as `BinaryView` arrays over the window's buffers, without copying.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BinaryViewArray, BinaryViewBuilder, FixedSizeListArray, RecordBatch,
};
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
                if a.values().len() >= u32::MAX as usize {
                    arrow::compute::cast(a, &DataType::BinaryView)?
                } else {
                    let mut b = BinaryViewBuilder::with_capacity(a.len());
                    let block = b.append_block(a.values().clone());
                    for r in 0..a.len() {
                        if a.is_null(r) {
                            b.append_null();
                        } else {
                            b.try_append_view(block, (r * size) as u32, size as u32)?;
                        }
                    }
                    Arc::new(b.finish())
                }
            }
            DataType::FixedSizeList(..) if crate::stage::viewable_list(a.data_type()) => {
                Arc::new(list_views(a.as_fixed_size_list())?)
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
fn list_views(list: &FixedSizeListArray) -> arrow::error::Result<BinaryViewArray> {
    // `append_block` takes blocks shorter than 4 GiB (and views address 4 GiB).
    list_views_in_blocks(list, u32::MAX as usize - 1)
}

/// [`list_views`] with blocks of at most `limit` bytes: a larger buffer is added as several
/// blocks over it, each starting at a row (nothing copied).
fn list_views_in_blocks(
    list: &FixedSizeListArray,
    limit: usize,
) -> arrow::error::Result<BinaryViewArray> {
    let values = list.values().to_data();
    let item = values.data_type().primitive_width().unwrap_or(1);
    let size = list.value_length().max(0) as usize * item;
    let buffer = values.buffers().first().cloned().unwrap_or_default();
    let base = values.offset() * item;
    let mut b = BinaryViewBuilder::with_capacity(list.len());
    let mut block: Option<(u32, usize)> = None;
    for r in 0..list.len() {
        if list.is_null(r) {
            b.append_null();
            continue;
        }
        let at = base + r * size;
        let (id, start) = match block {
            Some((id, start)) if at + size - start <= limit => (id, start),
            _ => {
                let len = buffer.len().saturating_sub(at).min(limit);
                let id = b.append_block(buffer.slice_with_length(at, len));
                block = Some((id, at));
                (id, at)
            }
        };
        b.try_append_view(id, (at - start) as u32, size as u32)?;
    }
    Ok(b.finish())
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
            let v = list_views_in_blocks(&list, limit).unwrap();
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
