//! Parquet's `AsyncFileReader` over `object_store`: ranged reads (coalesced by
//! `object_store::get_ranges`, retried with backoff by the store's retry policy) and the
//! footer read with the size known from listing. Errors name the object and byte range.

use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use futures::FutureExt;
use futures::future::BoxFuture;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};
use parquet::arrow::arrow_reader::ArrowReaderOptions;
use parquet::arrow::async_reader::AsyncFileReader;
use parquet::errors::{ParquetError, Result};
use parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};

use crate::storage::ObjectLocation;

/// Reads one object for the Parquet decoder.
#[derive(Debug, Clone)]
pub(crate) struct ObjectReader {
    store: Arc<dyn ObjectStore>,
    path: ObjectPath,
    size: u64,
    url: Arc<str>,
}

impl ObjectReader {
    pub(crate) fn new(location: &ObjectLocation, size: u64) -> Self {
        ObjectReader {
            store: location.store.clone(),
            path: location.path.clone(),
            size,
            url: location.url.clone(),
        }
    }

    /// A read error that names the object, the byte range and the store's last answer
    /// (after the store's retries were exhausted).
    fn error(&self, ranges: &[Range<u64>], e: object_store::Error) -> ParquetError {
        let span = match (ranges.first(), ranges.last()) {
            (Some(a), Some(_)) if ranges.len() == 1 => format!("bytes {}..{}", a.start, a.end),
            (Some(a), Some(b)) => format!(
                "{} ranges within bytes {}..{}",
                ranges.len(),
                a.start,
                b.end
            ),
            _ => "no bytes".to_string(),
        };
        ParquetError::External(Box::new(ReadError(format!(
            "reading {span} of {} ({} bytes) failed: {e}",
            self.url, self.size
        ))))
    }
}

/// A read that failed in the object store (as opposed to bytes that do not decode).
#[derive(Debug)]
pub(crate) struct ReadError(String);

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ReadError {}

impl AsyncFileReader for ObjectReader {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, Result<Bytes>> {
        async move {
            self.store
                .get_range(&self.path, range.clone())
                .await
                .map_err(|e| self.error(std::slice::from_ref(&range), e))
        }
        .boxed()
    }

    fn get_byte_ranges(&mut self, ranges: Vec<Range<u64>>) -> BoxFuture<'_, Result<Vec<Bytes>>> {
        async move {
            self.store
                .get_ranges(&self.path, &ranges)
                .await
                .map_err(|e| self.error(&ranges, e))
        }
        .boxed()
    }

    fn get_metadata<'a>(
        &'a mut self,
        options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, Result<Arc<ParquetMetaData>>> {
        async move {
            let size = self.size;
            let metadata = ParquetMetaDataReader::new()
                .with_arrow_reader_options(options)
                .load_and_finish(self, size)
                .await?;
            Ok(Arc::new(metadata))
        }
        .boxed()
    }
}
