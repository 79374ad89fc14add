//! The wire form of a part of a window sent to another rank: its rows plus their lineage as
//! extra columns, in one zstd Arrow IPC stream.

use std::sync::Arc;

use arrow::array::{
    ArrayRef, AsArray, RecordBatch, StringArray, StringDictionaryBuilder, UInt32Array, UInt64Array,
};
use arrow::datatypes::{DataType, Field, Int32Type, Schema};
use arrow::ipc::CompressionType;
use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::{IpcWriteOptions, StreamWriter};

use crate::batch::{Name, Origin};
use crate::error::{Result, StageRef};

use super::{Origins, RowOrigin, arrow_err, err};

const LINEAGE_COLUMNS: [&str; 4] = [
    "__sluice_url",
    "__sluice_row_group",
    "__sluice_row",
    "__sluice_epoch",
];

/// A part of a window for another rank: the rows plus their lineage as four extra columns,
/// as one zstd Arrow IPC stream.
pub(super) fn encode_part(
    stage: &StageRef,
    rb: &RecordBatch,
    rows: &[RowOrigin],
    origins: &Origins,
) -> Result<Vec<u8>> {
    let mut urls = StringDictionaryBuilder::<Int32Type>::new();
    let mut rgs = Vec::with_capacity(rows.len());
    for r in rows {
        match &origins.list[r.origin as usize] {
            Origin::Object { url, row_group } => {
                urls.append_value(&**url);
                rgs.push(*row_group);
            }
            other => {
                return Err(err(
                    stage,
                    format!("rows from {other} cannot be exchanged (Parquet only)"),
                ));
            }
        }
    }
    let mut fields: Vec<Field> = rb
        .schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    let mut columns: Vec<ArrayRef> = rb.columns().to_vec();
    let extra: [(DataType, ArrayRef); 4] = [
        (
            DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
            Arc::new(urls.finish()),
        ),
        (DataType::UInt32, Arc::new(UInt32Array::from(rgs))),
        (
            DataType::UInt64,
            Arc::new(UInt64Array::from_iter_values(rows.iter().map(|r| r.first))),
        ),
        (
            DataType::UInt64,
            Arc::new(UInt64Array::from_iter_values(rows.iter().map(|r| r.epoch))),
        ),
    ];
    for (name, (t, a)) in LINEAGE_COLUMNS.iter().zip(extra) {
        fields.push(Field::new(*name, t, false));
        columns.push(a);
    }
    let full = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
        .map_err(|e| arrow_err(stage, e))?;
    let options = IpcWriteOptions::default()
        .try_with_compression(Some(CompressionType::ZSTD))
        .map_err(|e| arrow_err(stage, e))?;
    let mut out = Vec::new();
    let mut w = StreamWriter::try_new_with_options(&mut out, &full.schema(), options)
        .map_err(|e| arrow_err(stage, e))?;
    w.write(&full).map_err(|e| arrow_err(stage, e))?;
    w.finish().map_err(|e| arrow_err(stage, e))?;
    drop(w);
    Ok(out)
}

pub(super) fn decode_part(
    stage: &StageRef,
    bytes: &[u8],
    origins: &mut Origins,
) -> Result<(RecordBatch, Vec<RowOrigin>)> {
    let reader = StreamReader::try_new(std::io::Cursor::new(bytes), None)
        .map_err(|e| arrow_err(stage, e))?;
    let mut batches = Vec::new();
    for b in reader {
        batches.push(b.map_err(|e| arrow_err(stage, e))?);
    }
    let full = match batches.len() {
        1 => batches.pop().expect("one batch"),
        _ => return Err(err(stage, "a received part is not exactly one batch")),
    };
    let n = full.num_columns() - LINEAGE_COLUMNS.len();
    let urls = full.column(n).as_dictionary::<Int32Type>();
    let url_values: &StringArray = urls.values().as_string::<i32>();
    let rgs = full
        .column(n + 1)
        .as_primitive::<arrow::datatypes::UInt32Type>();
    let firsts = full
        .column(n + 2)
        .as_primitive::<arrow::datatypes::UInt64Type>();
    let epochs = full
        .column(n + 3)
        .as_primitive::<arrow::datatypes::UInt64Type>();
    let mut rows = Vec::with_capacity(full.num_rows());
    for i in 0..full.num_rows() {
        let key = urls.keys().value(i) as usize;
        let origin = origins.id(&Origin::Object {
            url: Name::from(url_values.value(key)),
            row_group: rgs.value(i),
        });
        rows.push(RowOrigin {
            origin,
            first: firsts.value(i),
            epoch: epochs.value(i),
        });
    }
    let data = full
        .project(&(0..n).collect::<Vec<_>>())
        .map_err(|e| arrow_err(stage, e))?;
    Ok((data, rows))
}
