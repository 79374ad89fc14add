//! Reading one unit: what it holds in memory, fetching its projected column chunks and
//! decoding them on the CPU pool into batches.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, RowSelection};
use parquet::arrow::async_reader::ParquetRecordBatchStreamBuilder;

use super::ParquetFile;
use super::columns::Slot;
use super::lists::{Rows, UnitDecoder, has_lists, span_selection};
use super::partitions::partition_column;
use super::unit::Unit;
use crate::batch::{Batch, Lineage, Mark, Name, Origin};
use crate::error::{Error, ReadError, Result};
use crate::runtime::CpuPool;
use crate::runtime::metrics::PipelineMetrics;
use crate::source::reader::{Chunks, FetchedChunks, LocalChunks, ObjectReader};

/// Decoded rows handed over at a time (at least one batch): what a unit in flight holds
/// besides its fetched column chunks, twice (one chunk queued, one being decoded).
pub(super) const DECODE_CHUNK_BYTES: usize = 8 << 20;

impl Unit {
    /// Memory reading this unit from row `first` takes, from the footer: its projected
    /// column chunks as fetched (compressed; from a local file only the pages being decoded,
    /// counted as one decode chunk's worth) plus its rows decoded, of which at most two chunks
    /// are held at a time.
    pub(super) fn estimated_bytes(&self, first: u64) -> u64 {
        let rows = self
            .file
            .metadata
            .metadata()
            .row_group(self.rg)
            .num_rows()
            .max(1) as u64;
        let taken = self.len.saturating_sub(first);
        // Decoded rows are handed over a chunk at a time: at most two chunks are held.
        let decoded = (self.decoded_bytes() as u128 * taken as u128 / rows as u128) as u64;
        let fetched = if self.file.object.location.url.starts_with("file:") {
            self.fetched_bytes().min(DECODE_CHUNK_BYTES as u64)
        } else {
            self.fetched_bytes()
        };
        fetched + decoded.min(2 * DECODE_CHUNK_BYTES as u64)
    }

    /// The projected columns of the whole row group decoded: the uncompressed size, or the
    /// values' Arrow width when larger.
    pub(super) fn decoded_bytes(&self) -> u64 {
        let meta = self.file.metadata.metadata().row_group(self.rg);
        let mut decoded = 0u64;
        for (i, c) in meta.columns().iter().enumerate() {
            if self.file.mask.leaf_included(i) {
                use parquet::basic::Type;
                // Dictionary-encoded pages are smaller than the values they decode to: at
                // least as many bytes as the values take in Arrow.
                let width = match c.column_type() {
                    Type::BOOLEAN => 0,
                    Type::INT32 | Type::FLOAT => 4,
                    Type::INT64 | Type::DOUBLE => 8,
                    Type::INT96 => 12,
                    Type::FIXED_LEN_BYTE_ARRAY => c.column_descr().type_length().max(0) as u64,
                    Type::BYTE_ARRAY => 4, // an offset per value, besides the bytes
                };
                let values = c.num_values().max(0) as u64 * width;
                decoded += values.max(c.uncompressed_size().max(0) as u64);
            }
        }
        decoded
    }

    /// Bytes fetched to read this unit: its row group's projected column chunks, compressed.
    pub(super) fn fetched_bytes(&self) -> u64 {
        let meta = self.file.metadata.metadata().row_group(self.rg);
        meta.columns()
            .iter()
            .enumerate()
            .filter(|(i, _)| self.file.mask.leaf_included(*i))
            .map(|(_, c)| c.compressed_size().max(0) as u64)
            .sum()
    }
}

/// How every unit of a source is read: the same for all of them.
#[derive(Debug, Clone, Copy)]
pub(super) struct ReadOptions {
    pub(super) batch_rows: usize,
    /// Map local files (`memory_map`) rather than read them with `pread`.
    pub(super) memory_map: bool,
    /// Fixed-size list values in huge pages: a window shuffle gathers them next.
    pub(super) huge_lists: bool,
}

/// How one unit (or a global shuffle's block, `gather.rs`) is read: where it sits in the plan
/// and what to read it with.
pub(super) struct UnitRead {
    pub(super) index: u64,
    /// The first row of the unit to read (rows before it were delivered before a resume).
    pub(super) first: u64,
    pub(super) epoch: u64,
    pub(super) options: ReadOptions,
    pub(super) pool: CpuPool,
    pub(super) schema: SchemaRef,
    pub(super) metrics: Arc<PipelineMetrics>,
}

/// Fetches the projected column chunks of row group `rg` of `file` (with `selection`, only
/// the pages holding the selected rows, where the file has an offset index) and returns their
/// decoder, `batch_rows` rows per batch.
pub(super) async fn fetch(
    file: &ParquetFile,
    rg: usize,
    selection: Option<RowSelection>,
    batch_rows: usize,
    pool: &CpuPool,
) -> Result<ParquetRecordBatchReader> {
    let url = &file.object.location.url;
    let reader = ObjectReader::new(&file.object.location, file.object.size);
    let mut builder =
        ParquetRecordBatchStreamBuilder::new_with_metadata(reader, file.metadata.clone())
            .with_projection(file.mask.clone())
            .with_row_groups(vec![rg])
            .with_batch_size(batch_rows);
    if let Some(selection) = selection {
        builder = builder.with_row_selection(selection);
    }
    let mut stream = builder
        .build()
        .map_err(|e| Error::parquet(url, Some(rg), e))?;
    match stream.next_row_group().await {
        Ok(Some(decoder)) => Ok(decoder),
        Ok(None) => Err(Error::Internal(format!("{url}: row group {rg} missing"))),
        Err(e) if is_read_error(&e) => Err(Error::parquet(url, Some(rg), e)),
        Err(e) => {
            let column = failing_column(file, rg, pool).await;
            Err(Error::parquet(url, Some(rg), e).in_column(column))
        }
    }
}

/// The decoder of rows `skip..skip + take` of row group `rg` of `file`, with the local file
/// it reads, if any: a local file is read as it is decoded; other stores' chunks are fetched
/// first (whole when the projection has fixed-size lists, else only the span's pages).
pub(super) async fn open_span(
    file: &ParquetFile,
    rg: usize,
    span: (usize, usize),
    options: ReadOptions,
    pool: &CpuPool,
) -> Result<(UnitDecoder, Option<LocalChunks>)> {
    if let Some(opened) = open_local(file, rg, span, options) {
        return opened.map(|(decoder, chunks)| (decoder, Some(chunks)));
    }
    if let Some(decoder) = fetch_lists(file, rg, span, options).await {
        return Ok((decoder?, None));
    }
    let rg_rows = file.metadata.metadata().row_group(rg).num_rows() as usize;
    let selection = span_selection(span.0, span.1, rg_rows);
    let fetched = fetch(file, rg, selection, options.batch_rows, pool).await?;
    Ok((UnitDecoder::Arrow(fetched), None))
}

/// The error of a decoder of row group `rg` of `file` that failed with `e`: the local read
/// that failed under it, else the decode error with the column it came from.
pub(super) async fn decode_failure(
    file: &ParquetFile,
    rg: usize,
    local: Option<&LocalChunks>,
    e: arrow::error::ArrowError,
    pool: &CpuPool,
) -> Error {
    let url = &file.object.location.url;
    if let Some(read) = local.and_then(LocalChunks::failed) {
        let e = parquet::errors::ParquetError::External(Box::new(read));
        return Error::parquet(url, Some(rg), e);
    }
    let column = failing_column(file, rg, pool).await;
    Error::parquet(url, Some(rg), decode_error(e)).in_column(column)
}

/// The decoder of rows `skip..skip + take` of row group `rg` of a local `file`, which reads
/// its pages as it decodes them (mapped with `memory_map`; see [`LocalChunks`]; fixed-size
/// list columns see
/// [`super::lists`]), with the file it reads; `None` for other stores, read whole with
/// [`fetch`].
fn open_local(
    file: &ParquetFile,
    rg: usize,
    span: (usize, usize),
    options: ReadOptions,
) -> Option<Result<(UnitDecoder, LocalChunks)>> {
    let url = &file.object.location.url;
    let reader = ObjectReader::new(&file.object.location, file.object.size);
    let opened = LocalChunks::open(&reader, &chunk_ranges(file, rg), options.memory_map)?;
    let decoder = |chunks: LocalChunks| {
        let chunks_read = Chunks::Local(chunks.clone());
        let rows = rows_of(file, rg, chunks_read, span, options);
        Ok((rows.decoder()?, chunks))
    };
    Some(
        opened
            .and_then(decoder)
            .map_err(|e| Error::parquet(url, Some(rg), e)),
    )
}

/// The decoder of rows `skip..skip + take` of row group `rg` of `file` in an object store,
/// its projected column chunks fetched whole, when the projection has fixed-size list columns
/// (see [`super::lists`]); `None` when it has none, read with [`fetch`].
async fn fetch_lists(
    file: &ParquetFile,
    rg: usize,
    span: (usize, usize),
    options: ReadOptions,
) -> Option<Result<UnitDecoder>> {
    if !has_lists(&file.metadata, &file.mask) {
        return None;
    }
    let url = &file.object.location.url;
    let reader = ObjectReader::new(&file.object.location, file.object.size);
    let ranges = chunk_ranges(file, rg);
    let decoder = (FetchedChunks::fetch(&reader, ranges).await).and_then(|fetched| {
        let chunks = Chunks::Fetched(fetched);
        rows_of(file, rg, chunks, span, options).decoder()
    });
    Some(decoder.map_err(|e| Error::parquet(url, Some(rg), e)))
}

/// What the decoder of rows `skip..skip + take` of row group `rg` of `file` reads, from
/// `chunks`.
fn rows_of(
    file: &ParquetFile,
    rg: usize,
    chunks: Chunks,
    (skip, take): (usize, usize),
    options: ReadOptions,
) -> Rows {
    Rows {
        chunks,
        metadata: file.metadata.clone(),
        mask: file.mask.clone(),
        rg,
        skip,
        take,
        batch_rows: options.batch_rows,
        huge_lists: options.huge_lists,
    }
}

/// The byte ranges of the projected column chunks of row group `rg` of `file`.
fn chunk_ranges(file: &ParquetFile, rg: usize) -> Vec<std::ops::Range<u64>> {
    let columns = file.metadata.metadata().row_group(rg).columns();
    (columns.iter().enumerate())
        .filter(|(i, _)| file.mask.leaf_included(*i))
        .map(|(_, c)| {
            let (start, len) = c.byte_range();
            start..start + len
        })
        .collect()
}

/// A decoded batch of `file` as a batch of the source's `schema`: its columns in output
/// order, partition values (`partitioning: hive`) filled in.
pub(super) fn source_batch(
    file: &ParquetFile,
    rg: usize,
    rb: &RecordBatch,
    schema: &SchemaRef,
) -> Result<RecordBatch> {
    let arrow_err = |e| Error::Arrow {
        context: format!("{}: row group {rg}", file.object.location.url),
        source: e,
    };
    let columns = file
        .slots
        .iter()
        .map(|slot| match *slot {
            Slot::File(i) => Ok(rb.column(i).clone()),
            Slot::Partition(k) => partition_column(&file.partition_values[k], rb.num_rows()),
        })
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(arrow_err)?;
    RecordBatch::try_new(schema.clone(), columns).map_err(arrow_err)
}

impl UnitRead {
    /// Fetches the unit's projected column chunks, then decodes them on the CPU pool a chunk
    /// of batches at a time into `out`, in order. Returns early (`Ok`) when `out` is gone.
    pub(super) async fn run(
        &self,
        unit: &Unit,
        out: &tokio::sync::mpsc::Sender<Result<Vec<Batch>>>,
    ) -> Result<()> {
        let file = &unit.file;
        let rg = unit.rg;
        let url = &file.object.location.url;
        let skip = unit.start + self.first;
        let take = unit.len - self.first;
        let span = (skip as usize, take as usize);
        let (mut decoder, local) = open_span(file, rg, span, self.options, &self.pool).await?;
        let origin = Origin::Object {
            url: Name::from(&**url),
            row_group: rg as u32,
        };
        let mut first_in_file = file.row_group_starts[rg] + skip;
        let mut row = self.first;
        let (mut bytes, mut rows) = (0u64, 0u64);
        loop {
            let (back, decoded) = self
                .pool
                .run(move || {
                    let mut chunk = Vec::new();
                    let mut size = 0;
                    while size < DECODE_CHUNK_BYTES {
                        match decoder.next() {
                            Some(Ok(rb)) => {
                                size += rb.get_array_memory_size();
                                chunk.push(rb);
                            }
                            Some(Err(e)) => return (decoder, Err(e)),
                            None => break,
                        }
                    }
                    (decoder, Ok(chunk))
                })
                .await?;
            decoder = back;
            let decoded = match decoded {
                Ok(d) => d,
                Err(e) => return Err(decode_failure(file, rg, local.as_ref(), e, &self.pool).await),
            };
            if decoded.is_empty() {
                break;
            }
            let mut chunk = Vec::with_capacity(decoded.len());
            for rb in decoded {
                let rb = source_batch(file, rg, &rb, &self.schema)?;
                let n = rb.num_rows() as u64;
                // The values' size: `get_array_memory_size` counts capacity, and the decoder
                // reserves a whole batch's, so 100,000 one-row row groups counted 16 GB for
                // 10 MB of values.
                bytes += crate::batch::data_bytes(&rb) as u64;
                rows += n;
                let mark = Mark {
                    epoch: self.epoch,
                    unit: self.index,
                    row,
                    skip: 0,
                    shuffle: None,
                };
                chunk.push(
                    Batch::new(rb, Lineage::new(origin, first_in_file, n, self.epoch))
                        .with_mark(Some(mark)),
                );
                first_in_file += n;
                row += n;
            }
            if out.send(Ok(chunk)).await.is_err() {
                return Ok(());
            }
        }
        if rows != take {
            return Err(Error::parquet(
                url,
                Some(rg),
                parquet::errors::ParquetError::General(format!(
                    "decoded {rows} rows where the footer promises {take}"
                )),
            ));
        }
        let m = &self.metrics.source;
        m.row_groups.fetch_add(1, Ordering::Relaxed);
        m.rows.fetch_add(rows, Ordering::Relaxed);
        m.bytes_decoded.fetch_add(bytes, Ordering::Relaxed);
        m.bytes_read
            .fetch_add(unit.fetched_bytes(), Ordering::Relaxed);
        Ok(())
    }
}

/// Whether a reader's error is a failed read (as opposed to bytes that do not decode).
fn is_read_error(e: &parquet::errors::ParquetError) -> bool {
    matches!(e, parquet::errors::ParquetError::External(inner) if inner.is::<ReadError>())
}

/// A decode error of the synchronous reader as the Parquet error it carries (without the
/// wrapping's "Parquet argument error" prefix).
pub(super) fn decode_error(e: arrow::error::ArrowError) -> parquet::errors::ParquetError {
    use parquet::errors::ParquetError;
    match e {
        arrow::error::ArrowError::ParquetError(text) => ParquetError::General(
            text.strip_prefix("Parquet error: ")
                .unwrap_or(text.as_str())
                .to_string(),
        ),
        other => ParquetError::ArrowError(other.to_string()),
    }
}

/// The first projected column of row group `rg` of `file` that does not decode on its own:
/// where a decode error of the row group came from (a page whose checksum does not match, a
/// corrupt page), by its path in the file's schema. Only run after such an error; `None`
/// when every column decodes alone.
pub(super) async fn failing_column(
    file: &ParquetFile,
    rg: usize,
    pool: &CpuPool,
) -> Option<String> {
    let descr = file.metadata.metadata().file_metadata().schema_descr_ptr();
    for leaf in (0..descr.num_columns()).filter(|&l| file.mask.leaf_included(l)) {
        let reader = ObjectReader::new(&file.object.location, file.object.size);
        let built =
            ParquetRecordBatchStreamBuilder::new_with_metadata(reader, file.metadata.clone())
                .with_projection(ProjectionMask::leaves(&descr, [leaf]))
                .with_row_groups(vec![rg])
                .build();
        let Ok(mut stream) = built else {
            continue;
        };
        let decoder = match stream.next_row_group().await {
            Ok(Some(d)) => d,
            Ok(None) => continue,
            // A read that fails says nothing about this column's bytes.
            Err(e) if is_read_error(&e) => continue,
            Err(_) => return Some(descr.column(leaf).path().string()),
        };
        let failed = pool
            .run(move || {
                let mut decoder = decoder;
                decoder.any(|b| b.is_err())
            })
            .await
            .unwrap_or(false);
        if failed {
            return Some(descr.column(leaf).path().string());
        }
    }
    None
}
