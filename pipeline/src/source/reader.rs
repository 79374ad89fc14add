//! Parquet's `AsyncFileReader` over `object_store`: ranged reads (coalesced by
//! `object_store::get_ranges`, retried with backoff by the store's retry policy) and the
//! footer read with the size known from listing. Errors name the object and byte range.

use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use futures::FutureExt;
use futures::future::BoxFuture;
use object_store::ObjectStore;
use object_store::path::Path as ObjectPath;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use parquet::arrow::async_reader::AsyncFileReader;
use parquet::errors::{ParquetError, Result};
use parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};

use crate::error::{Error, ReadError, ReadKind, hint};
use crate::storage::ObjectLocation;

/// Reads one object for the Parquet decoder.
#[derive(Debug, Clone)]
pub(crate) struct ObjectReader {
    store: Arc<dyn ObjectStore>,
    path: ObjectPath,
    size: u64,
    url: Arc<str>,
    /// The file, for a `file://` object: read directly (see [`read_local`]).
    local: Option<Arc<std::path::Path>>,
}

impl ObjectReader {
    pub(crate) fn new(location: &ObjectLocation, size: u64) -> Self {
        let local = crate::storage::local_file(location).map(Arc::from);
        ObjectReader {
            store: location.store.clone(),
            path: location.path.clone(),
            size,
            url: location.url.clone(),
            local,
        }
    }

    /// `ranges` of the object: from the file directly when it is local, else through the
    /// store.
    async fn read(&self, ranges: Vec<Range<u64>>) -> Result<Vec<Bytes>> {
        match &self.local {
            Some(file) => {
                let file = file.clone();
                let (result, ranges) =
                    tokio::task::spawn_blocking(move || (read_local(&file, &ranges), ranges))
                        .await
                        .map_err(|e| ParquetError::External(Box::new(e)))?;
                result.map_err(|e| self.error(&ranges, ReadKind::Local(e.kind()), e))
            }
            None => self
                .store
                .get_ranges(&self.path, &ranges)
                .await
                .map_err(|e| {
                    let local = self.url.starts_with("file:");
                    let (text, code) = crate::error::one_line(&e.to_string());
                    let kind = ReadKind::of_store(local, &e, code.as_deref());
                    self.error(&ranges, kind, text)
                }),
        }
    }

    /// Reads the footer. A footer that does not decode is told apart by the file's last
    /// bytes: an encrypted file (`PARE`), a file that is not Parquet or was cut short (no
    /// `PAR1`), or a corrupt footer. A footer that decodes but describes encrypted columns
    /// (a plaintext footer) is refused as encrypted too.
    pub(crate) async fn metadata(
        &mut self,
        options: ArrowReaderOptions,
    ) -> crate::error::Result<ArrowReaderMetadata> {
        let loaded = ArrowReaderMetadata::load_async(self, options).await;
        match loaded {
            // Encrypted columns under a plaintext footer: the footer decodes, the pages are
            // ciphertext that would read as corrupt.
            Ok(m) if encrypted_columns(&m) => Err(Error::Encrypted {
                url: self.url.to_string(),
            }),
            Ok(m) => Ok(m),
            Err(e) => Err(self.footer_error(e).await),
        }
    }

    async fn footer_error(&self, e: ParquetError) -> Error {
        let url = self.url.to_string();
        // A read that failed is reported as such, whatever the bytes.
        if matches!(&e, ParquetError::External(inner) if inner.is::<ReadError>()) {
            return Error::parquet(&url, None, e);
        }
        if self.size < 4 {
            return Error::parquet_with(&url, None, hint::NOT_PARQUET, e);
        }
        let tail = self
            .read(std::iter::once(self.size - 4..self.size).collect())
            .await
            .ok()
            .and_then(|mut v| v.pop());
        match tail.as_deref() {
            Some(b"PARE") => Error::Encrypted { url },
            Some(b"PAR1") => Error::parquet(&url, None, e),
            Some(_) => Error::parquet_with(&url, None, hint::NOT_PARQUET, e),
            // The last bytes cannot be read now: say what the reader said.
            None => Error::parquet(&url, None, e),
        }
    }

    /// A read error that names the object, the byte range and the store's last answer
    /// (after the store's retries were exhausted), or the file system's.
    fn error(
        &self,
        ranges: &[Range<u64>],
        kind: ReadKind,
        e: impl std::fmt::Display,
    ) -> ParquetError {
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
        ParquetError::External(Box::new(ReadError {
            message: format!(
                "reading {span} of {} ({} bytes) failed: {e}",
                self.url, self.size
            ),
            kind,
        }))
    }
}

/// Whether any column chunk is encrypted (Parquet modular encryption, plaintext footer).
fn encrypted_columns(m: &ArrowReaderMetadata) -> bool {
    m.metadata()
        .row_groups()
        .iter()
        .flat_map(|rg| rg.columns())
        .any(|c| c.crypto_metadata().is_some())
}

/// Reads `ranges` of a local file, each into a buffer of its own. `object_store`'s local
/// store zero-fills every buffer before reading into it (a `memset` of everything read: 10 %
/// of the CPU of a raw decode of images from tmpfs); `read_to_end` into reserved capacity
/// does not. A range past the end of the file (it shrank after listing) is an error.
fn read_local(path: &std::path::Path, ranges: &[Range<u64>]) -> std::io::Result<Vec<Bytes>> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = std::fs::File::open(path)?;
    let mut out = Vec::with_capacity(ranges.len());
    for r in ranges {
        let want = r.end.saturating_sub(r.start);
        file.seek(SeekFrom::Start(r.start))?;
        let mut buf = Vec::with_capacity(want as usize);
        (&mut file).take(want).read_to_end(&mut buf)?;
        if buf.len() as u64 != want {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("the file ends after {} of the {want} bytes", buf.len()),
            ));
        }
        out.push(Bytes::from(buf));
    }
    Ok(out)
}

impl AsyncFileReader for ObjectReader {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, Result<Bytes>> {
        async move {
            let mut got = self.read(vec![range]).await?;
            got.pop()
                .ok_or_else(|| ParquetError::General("a read returned nothing".into()))
        }
        .boxed()
    }

    fn get_byte_ranges(&mut self, ranges: Vec<Range<u64>>) -> BoxFuture<'_, Result<Vec<Bytes>>> {
        async move { self.read(ranges).await }.boxed()
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A local object is read from the file directly: every range its own bytes, in the
    /// order asked; a file that shrank after listing is an error naming the object, the
    /// range and what happened, not short data.
    #[tokio::test]
    async fn local_ranges_are_read_exactly_and_a_shrunk_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        let path = dir.path().join("a.bin");
        std::fs::write(&path, &data).unwrap();
        let location = crate::storage::resolve_output(path.to_str().unwrap(), dir.path()).unwrap();
        let mut reader = ObjectReader::new(&location, data.len() as u64);
        assert!(reader.local.is_some(), "{}", location.url);
        let ranges = vec![5000..9999, 0..10, 10..10, 4096..8192];
        let got = reader.get_byte_ranges(ranges.clone()).await.unwrap();
        for (r, b) in ranges.iter().zip(&got) {
            assert_eq!(&b[..], &data[r.start as usize..r.end as usize]);
        }
        assert_eq!(&reader.get_bytes(3..7).await.unwrap()[..], &data[3..7]);

        std::fs::write(&path, &data[..6000]).unwrap();
        let e = reader.get_bytes(5000..9999).await.unwrap_err().to_string();
        assert!(
            e.contains("bytes 5000..9999")
                && e.contains(&*location.url)
                && e.contains("the file ends after 1000 of the 4999 bytes"),
            "{e}"
        );
    }
}
