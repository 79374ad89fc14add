//! Byte columns emitted as `BinaryView` arrays over the window's buffers, without copying.

use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray, RecordBatch};
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

/// `rb` with each of `columns` (binary, large binary or fixed-size binary) as a `BinaryView`
/// array over the same value buffer: one 16-byte view per row, no bytes copied (a buffer of
/// 4 GiB or more is copied: views address at most 4 GiB).
pub(crate) fn views(rb: &RecordBatch, columns: &[usize]) -> arrow::error::Result<RecordBatch> {
    use arrow::array::{Array, BinaryViewArray, BinaryViewBuilder};
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
