//! Fixed-size binary columns (images stored as bytes: `fixed_size_binary[3072]`) handed over
//! without copying their values.
//!
//! Why by hand: arrow-rs's reader copies every value out of the decompressed page into the
//! batch's buffer — on the images bench (200k × 3,072 bytes) 6 % of the CPU time of the whole
//! `uint8` pipeline, and as much again in page faults on the fresh 3 MiB buffers. Parquet's
//! own column reader hands each value over as a slice of the page it was decoded from (a
//! dictionary-encoded value: of the dictionary page). Consecutive values of a page lie end to
//! end, so a batch's rows are a few runs of contiguous bytes — one run per page the batch
//! touches — and each run becomes an array over those bytes, kept alive by the slices
//! themselves. A batch is then handed over as one batch per run ([`super::lists`] cuts the
//! other columns to match). Rows that are not in a few long runs (a dictionary with repeated
//! values) are copied into one buffer, as arrow-rs would.
//!
//! Only columns without nulls take this path, as for lists: at the first batch with a null
//! the row group is read from that batch's first row on by arrow-rs's reader alone.

use std::sync::Arc;

use arrow::array::{ArrayRef, FixedSizeBinaryArray};
use arrow::buffer::Buffer;
use parquet::column::reader::ColumnReaderImpl;
use parquet::data_type::{FixedLenByteArray, FixedLenByteArrayType};

/// A batch read as more runs than this is copied into one buffer instead: each run is a batch
/// of its own downstream, so many short runs would be many small batches.
const MAX_RUNS: usize = 8;

/// One fixed-size binary column read here, with its level buffer (reused batch to batch).
pub(super) struct BinaryColumn {
    reader: ColumnReaderImpl<FixedLenByteArrayType>,
    size: usize,
    max_def: i16,
    def: Vec<i16>,
    /// Rows to pass over before the first read (see `lists::ListColumn::skip`).
    skip: usize,
}

impl BinaryColumn {
    pub(super) fn new(
        reader: ColumnReaderImpl<FixedLenByteArrayType>,
        size: usize,
        max_def: i16,
        skip: usize,
    ) -> Self {
        BinaryColumn {
            reader,
            size,
            max_def,
            def: Vec::new(),
            skip,
        }
    }

    /// The next `rows` values as arrays of consecutive rows, in order; `None` when they are not
    /// `rows` present values of the column's size.
    pub(super) fn read(&mut self, rows: usize) -> parquet::errors::Result<Option<Vec<ArrayRef>>> {
        let skip = std::mem::take(&mut self.skip);
        if skip > 0 && self.reader.skip_records(skip)? != skip {
            return Err(parquet::errors::ParquetError::General(format!(
                "could not skip {skip} rows"
            )));
        }
        self.def.clear();
        let mut values: Vec<FixedLenByteArray> = Vec::with_capacity(rows);
        let def = (self.max_def > 0).then_some(&mut self.def);
        let (records, read, _) = self.reader.read_records(rows, def, None, &mut values)?;
        let present = self
            .def
            .iter()
            .fold(true, |ok, &d| ok & (d == self.max_def));
        if records != rows || read != rows || !present {
            return Ok(None);
        }
        let size = self.size;
        let start = |v: &FixedLenByteArray| v.data().as_ptr() as usize;
        if values.iter().any(|v| v.data().len() != size) {
            return Ok(None);
        }
        // Where each run of values lying end to end starts.
        let mut runs = vec![0];
        for (i, w) in values.windows(2).enumerate() {
            if start(&w[1]) != start(&w[0]).wrapping_add(size) {
                runs.push(i + 1);
            }
        }
        if runs.len() > MAX_RUNS {
            let mut bytes = Vec::with_capacity(rows * size);
            values
                .iter()
                .for_each(|v| bytes.extend_from_slice(v.data()));
            return Ok(Some(vec![array(size, Buffer::from_vec(bytes))?]));
        }
        runs.push(values.len());
        let owner = Arc::new(values);
        let mut arrays = Vec::with_capacity(runs.len() - 1);
        for run in runs.windows(2) {
            let first = &owner[run[0]];
            let len = (run[1] - run[0]) * size;
            let Some(ptr) = std::ptr::NonNull::new(first.data().as_ptr().cast_mut()) else {
                return Ok(None);
            };
            #[allow(unsafe_code)]
            // SAFETY: the run's values were checked above to lie end to end, each `size`
            // bytes: the `len` bytes from `ptr` are exactly the union of their slices. Every
            // slice is a `Bytes` held by `owner` — which the buffer keeps alive — and `Bytes`
            // never changes or frees what it points at while held, so the bytes stay valid
            // and unchanged as long as the buffer lives.
            let buffer = unsafe { Buffer::from_custom_allocation(ptr, len, owner.clone()) };
            arrays.push(array(size, buffer)?);
        }
        Ok(Some(arrays))
    }
}

fn array(size: usize, values: Buffer) -> parquet::errors::Result<ArrayRef> {
    let array = FixedSizeBinaryArray::try_new(size as i32, values, None)
        .map_err(|e| parquet::errors::ParquetError::General(e.to_string()))?;
    Ok(Arc::new(array))
}
