//! `sluice inspect`: what is in a set of Parquet files.

use std::path::Path;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use futures::TryStreamExt;
use parquet::arrow::arrow_reader::ArrowReaderOptions;
use parquet::arrow::async_reader::ParquetRecordBatchStreamBuilder;

use crate::error::{Error, Result};
use crate::source::reader::ObjectReader;
use crate::storage::list_objects;

/// One row group.
#[derive(Debug, Clone)]
pub struct RowGroupInfo {
    /// Rows.
    pub rows: u64,
    /// Compressed bytes of its column chunks.
    pub compressed_bytes: u64,
    /// Uncompressed bytes.
    pub uncompressed_bytes: u64,
}

/// One Parquet file.
#[derive(Debug, Clone)]
pub struct ParquetFileInfo {
    /// Its URL.
    pub url: String,
    /// Size in bytes.
    pub size: u64,
    /// Rows.
    pub rows: u64,
    /// Arrow schema.
    pub schema: SchemaRef,
    /// Row groups.
    pub row_groups: Vec<RowGroupInfo>,
    /// Writer that produced it.
    pub created_by: Option<String>,
    /// The first rows (up to the number asked for).
    pub head: Vec<RecordBatch>,
    /// `key=value` directories of its path: the columns `partitioning: hive` adds (a null
    /// value for Hive's default partition); empty when there are none or they clash.
    pub partitions: Vec<(String, Option<String>)>,
}

/// Lists the files named by `specs` (on the command line: relative paths are resolved
/// against `base_dir`, the current directory) and reads their footers and first `head_rows`
/// rows. Errors are worded for `sluice inspect`: no config file, no suggestion to run it.
pub async fn inspect_parquet(
    specs: &[String],
    base_dir: &Path,
    head_rows: usize,
) -> Result<Vec<ParquetFileInfo>> {
    inspect_files(specs, base_dir, head_rows)
        .await
        .map_err(Error::in_inspect)
}

async fn inspect_files(
    specs: &[String],
    base_dir: &Path,
    head_rows: usize,
) -> Result<Vec<ParquetFileInfo>> {
    let mut out = Vec::new();
    for object in list_objects(specs, base_dir).await? {
        let url = object.location.url.to_string();
        let mut reader = ObjectReader::new(&object.location, object.size);
        let meta = reader.metadata(ArrowReaderOptions::new()).await?;
        let pm = meta.metadata().clone();
        let row_groups = pm
            .row_groups()
            .iter()
            .map(|rg| RowGroupInfo {
                rows: rg.num_rows() as u64,
                compressed_bytes: rg.compressed_size() as u64,
                uncompressed_bytes: rg.total_byte_size() as u64,
            })
            .collect();
        let head = if head_rows > 0 && pm.file_metadata().num_rows() > 0 {
            ParquetRecordBatchStreamBuilder::new_with_metadata(reader, meta.clone())
                .with_limit(head_rows)
                .with_batch_size(head_rows)
                .build()
                .map_err(|e| Error::parquet(&url, None, e))?
                .try_collect()
                .await
                .map_err(|e| Error::parquet(&url, Some(0), e))?
        } else {
            Vec::new()
        };
        out.push(ParquetFileInfo {
            size: object.size,
            rows: pm.file_metadata().num_rows() as u64,
            schema: meta.schema().clone(),
            row_groups,
            created_by: pm.file_metadata().created_by().map(str::to_string),
            head,
            partitions: crate::source::parquet::hive_partitions(&object.location)
                .unwrap_or_default(),
            url,
        });
    }
    Ok(out)
}
