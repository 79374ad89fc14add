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
use crate::source::mapped::{MappedFile, NotMapped, short};
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
    pub(crate) async fn read(&self, ranges: Vec<Range<u64>>) -> Result<Vec<Bytes>> {
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
        ParquetError::External(Box::new(self.read_error(ranges, kind, e)))
    }

    /// The [`ReadError`] of [`ObjectReader::error`], as it is.
    fn read_error(
        &self,
        ranges: &[Range<u64>],
        kind: ReadKind,
        e: impl std::fmt::Display,
    ) -> ReadError {
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
        ReadError {
            message: format!(
                "reading {span} of {} ({} bytes) failed: {e}",
                self.url, self.size
            ),
            kind,
        }
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

/// A local file as the synchronous decoder reads it: page by page, as it decodes, so a row
/// group in flight holds the page being decoded rather than all its compressed column chunks
/// (the tabular bench's row groups are 28 MB each, and 2–4 are in flight). Written by hand
/// over parquet's own `ChunkReader for File`, which makes the same reads, because its errors
/// name neither the file nor the byte range, and a read that fails must be told apart from
/// bytes that do not decode: the first failure is kept for [`LocalChunks::failed`].
#[derive(Debug, Clone)]
pub(crate) struct LocalChunks {
    /// Read at offsets (`pread`), never through the file's position: shared without a lock.
    file: Arc<std::fs::File>,
    /// The file mapped (`memory_map`): pages are handed to the decoder without a copy. Page
    /// headers are still read with `pread` (8 KiB at a time: small next to the pages).
    map: Option<MappedFile>,
    /// The object, for the messages of failed reads.
    reader: ObjectReader,
    failed: Arc<std::sync::OnceLock<ReadError>>,
}

impl LocalChunks {
    /// Opens the file of `reader`, or `None` when its object is not local. Every range in
    /// `ranges` must lie within the file as it is now (a file that shrank after listing is a
    /// read error, as when the ranges are fetched whole). `memory_map`: map the file and hand
    /// its pages out as slices of the mapping (see [`MappedFile`]).
    pub(crate) fn open(
        reader: &ObjectReader,
        ranges: &[Range<u64>],
        memory_map: bool,
    ) -> Option<Result<Self>> {
        let path = reader.local.as_ref()?;
        let chunks = |file: std::fs::File, len| {
            let file = Arc::new(file);
            LocalChunks {
                map: memory_map.then(|| MappedFile::map(&file, len)).flatten(),
                file,
                reader: reader.clone(),
                failed: Arc::default(),
            }
        };
        let opened = std::fs::File::open(&**path).and_then(|f| Ok((f.metadata()?.len(), f)));
        Some(match opened {
            Err(e) => Err(reader.error(ranges, ReadKind::Local(e.kind()), e)),
            Ok((now, file)) => match ranges.iter().find(|r| r.end > now) {
                Some(r) => {
                    let e = short(now.saturating_sub(r.start), r.end - r.start);
                    let kind = ReadKind::Local(std::io::ErrorKind::UnexpectedEof);
                    Err(reader.error(std::slice::from_ref(r), kind, e))
                }
                None => Ok(chunks(file, now)),
            },
        })
    }

    /// The first read that failed, if one did: a decode error after it is that read's.
    pub(crate) fn failed(&self) -> Option<ReadError> {
        self.failed.get().cloned()
    }

    /// Keeps `e` as the unit's failure (the first one) and returns it as the decoder's error.
    fn fail(&self, range: Range<u64>, e: &std::io::Error) -> ParquetError {
        let kind = ReadKind::Local(e.kind());
        let error = self
            .reader
            .read_error(std::slice::from_ref(&range), kind, e);
        let _ = self.failed.set(error.clone());
        ParquetError::External(Box::new(error))
    }
}

impl parquet::file::reader::Length for LocalChunks {
    fn len(&self) -> u64 {
        self.reader.size
    }
}

impl parquet::file::reader::ChunkReader for LocalChunks {
    type T = std::io::BufReader<LocalRead>;

    /// A page header's bytes (the decoder reads it through this, then the page with
    /// `get_bytes`), read at their offset, whatever other reads do meanwhile.
    fn get_read(&self, start: u64) -> Result<Self::T> {
        Ok(std::io::BufReader::new(LocalRead {
            chunks: self.clone(),
            at: start,
        }))
    }

    fn get_bytes(&self, start: u64, length: usize) -> Result<Bytes> {
        let range = start..start + length as u64;
        if let Some(map) = &self.map {
            match map.bytes(range.clone()) {
                Ok(bytes) => return Ok(bytes),
                Err(NotMapped::Failed(e)) => return Err(self.fail(range, &e)),
                Err(NotMapped::ReadInstead) => {}
            }
        }
        let read = read_range(&self.file, &range);
        read.map(Bytes::from).map_err(|e| self.fail(range, &e))
    }
}

/// Reads a local file from an offset of its own (`pread`), keeping a failure as the unit's.
#[derive(Debug)]
pub(crate) struct LocalRead {
    chunks: LocalChunks,
    at: u64,
}

impl std::io::Read for LocalRead {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use std::os::unix::fs::FileExt;
        let read = self.chunks.file.read_at(buf, self.at);
        let n = read.inspect_err(|e| {
            // An interrupted read is retried by the reader above; it is no failure.
            if e.kind() != std::io::ErrorKind::Interrupted {
                let _ = self.chunks.fail(self.at..self.at + buf.len() as u64, e);
            }
        })?;
        self.at += n as u64;
        Ok(n)
    }
}

/// The bytes a row group's decoder reads: a local file read as it is decoded, or the
/// projected column chunks fetched whole from an object store.
#[derive(Debug, Clone)]
pub(crate) enum Chunks {
    Local(LocalChunks),
    Fetched(FetchedChunks),
}

/// Column chunks fetched from an object store, each at its offset in the object.
#[derive(Debug, Clone)]
pub(crate) struct FetchedChunks {
    parts: Arc<Vec<(u64, Bytes)>>,
    size: u64,
}

impl FetchedChunks {
    /// Fetches `ranges` of the object of `reader` (coalesced and retried as every read).
    pub(crate) async fn fetch(reader: &ObjectReader, ranges: Vec<Range<u64>>) -> Result<Self> {
        let starts: Vec<u64> = ranges.iter().map(|r| r.start).collect();
        let got = reader.read(ranges).await?;
        Ok(FetchedChunks {
            parts: Arc::new(starts.into_iter().zip(got).collect()),
            size: reader.size,
        })
    }

    /// Bytes from `start` (`len` of them, or to the end of their part), from the part that
    /// holds them all.
    fn slice(&self, start: u64, len: Option<usize>) -> Result<Bytes> {
        let held = self.parts.iter().find_map(|(at, bytes)| {
            let from = usize::try_from(start.checked_sub(*at)?).ok()?;
            let (to, inside) = match len {
                Some(len) => (from.checked_add(len)?, from <= bytes.len()),
                // A reader from `start` on: at least one byte there.
                None => (bytes.len(), from < bytes.len()),
            };
            (inside && to <= bytes.len()).then(|| bytes.slice(from..to))
        });
        held.ok_or_else(|| {
            let end = len.map_or(String::new(), |l| (start + l as u64).to_string());
            ParquetError::General(format!(
                "bytes {start}..{end} are outside the column chunks the footer names"
            ))
        })
    }
}

impl parquet::file::reader::Length for Chunks {
    fn len(&self) -> u64 {
        match self {
            Chunks::Local(c) => c.reader.size,
            Chunks::Fetched(f) => f.size,
        }
    }
}

impl parquet::file::reader::ChunkReader for Chunks {
    type T = ChunkRead;

    fn get_read(&self, start: u64) -> Result<ChunkRead> {
        use bytes::Buf;
        match self {
            Chunks::Local(c) => c.get_read(start).map(ChunkRead::Local),
            Chunks::Fetched(f) => Ok(ChunkRead::Fetched(f.slice(start, None)?.reader())),
        }
    }

    fn get_bytes(&self, start: u64, length: usize) -> Result<Bytes> {
        match self {
            Chunks::Local(c) => c.get_bytes(start, length),
            Chunks::Fetched(f) => f.slice(start, Some(length)),
        }
    }
}

/// A page header's bytes, from either kind of [`Chunks`].
pub(crate) enum ChunkRead {
    Local(std::io::BufReader<LocalRead>),
    Fetched(bytes::buf::Reader<Bytes>),
}

impl std::io::Read for ChunkRead {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            ChunkRead::Local(r) => r.read(buf),
            ChunkRead::Fetched(r) => r.read(buf),
        }
    }
}

/// Reads `ranges` of a local file, each into a buffer of its own. `object_store`'s local
/// store zero-fills every buffer before reading into it (a `memset` of everything read: 10 %
/// of the CPU of a raw decode of images from tmpfs); [`read_range`] reads into reserved
/// capacity. A range past the end of the file (it shrank after listing) is an error.
fn read_local(path: &std::path::Path, ranges: &[Range<u64>]) -> std::io::Result<Vec<Bytes>> {
    let file = std::fs::File::open(path)?;
    ranges
        .iter()
        .map(|r| read_range(&file, r).map(Bytes::from))
        .collect()
}

/// Bytes `r` of `file`, read with `pread(2)` straight into reserved capacity; a range past the
/// end of the file is an `UnexpectedEof` error.
///
/// By hand rather than `take(n).read_to_end`, which does not zero-fill either but starts at
/// 8 KiB and doubles each call (eight calls for a 1 MiB page, into a buffer that is no longer
/// in the cache when the decoder reads it): here one call reads a whole page (std has no
/// stable positional read into uninitialised memory).
fn read_range(file: &std::fs::File, r: &Range<u64>) -> std::io::Result<Vec<u8>> {
    use std::os::fd::AsRawFd;
    let too_far = || {
        std::io::Error::other(format!(
            "byte range {r:?} is beyond what this system can read"
        ))
    };
    let want = usize::try_from(r.end.saturating_sub(r.start)).map_err(|_| too_far())?;
    let mut buf: Vec<u8> = Vec::with_capacity(want);
    while buf.len() < want {
        let at = libc::off_t::try_from(r.start + buf.len() as u64).map_err(|_| too_far())?;
        let left = want - buf.len();
        let spare = &mut buf.spare_capacity_mut()[..left];
        #[allow(unsafe_code)]
        // SAFETY: `pread` writes at most `spare.len()` bytes at `spare`'s start, inside the
        // vector's allocation, and returns how many it wrote (or -1).
        let n =
            unsafe { libc::pread(file.as_raw_fd(), spare.as_mut_ptr().cast(), spare.len(), at) };
        match n {
            0 => break,
            n if n < 0 => {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
            #[allow(unsafe_code)]
            // SAFETY: the `n` bytes after the initialised ones were just written by `pread`.
            n => unsafe { buf.set_len(buf.len() + n as usize) },
        }
    }
    if buf.len() != want {
        return Err(short(buf.len() as u64, want as u64));
    }
    Ok(buf)
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

    /// The decoder's reads of a local file: headers and pages at any offset, each reader
    /// with a position of its own; ranges past the end refused when the file is opened; a
    /// read that fails later names the object and range and is kept as the unit's failure.
    #[test]
    fn local_chunks_read_what_the_decoder_asks_and_keep_the_first_failure() {
        for memory_map in [false, true] {
            local_chunks_read(memory_map);
        }
    }

    fn local_chunks_read(memory_map: bool) {
        use parquet::file::reader::ChunkReader;
        use std::io::Read;
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        let path = dir.path().join("a.parquet");
        std::fs::write(&path, &data).unwrap();
        let location = crate::storage::resolve_output(path.to_str().unwrap(), dir.path()).unwrap();
        let reader = ObjectReader::new(&location, data.len() as u64);

        let past = LocalChunks::open(&reader, &[0..10, 9000..10_001], memory_map).unwrap();
        let e = past.unwrap_err().to_string();
        assert!(
            e.contains("bytes 9000..10001")
                && e.contains(&*location.url)
                && e.contains("the file ends after 1000 of the 1001 bytes"),
            "{e}"
        );

        let chunks = LocalChunks::open(&reader, &[0..10, 10..10_000], memory_map)
            .unwrap()
            .unwrap();
        assert_eq!(chunks.map.is_some(), memory_map);
        let (mut a, mut b) = (
            chunks.get_read(100).unwrap(),
            chunks.get_read(7000).unwrap(),
        );
        let (mut x, mut y) = ([0u8; 16], [0u8; 16]);
        a.read_exact(&mut x).unwrap();
        b.read_exact(&mut y).unwrap();
        a.read_exact(&mut x).unwrap();
        assert_eq!((&x[..], &y[..]), (&data[116..132], &data[7000..7016]));
        assert_eq!(
            &chunks.get_bytes(4096, 5000).unwrap()[..],
            &data[4096..9096]
        );
        assert!(chunks.failed().is_none());

        std::fs::write(&path, &data[..6000]).unwrap();
        let e = chunks.get_bytes(5000, 4999).unwrap_err().to_string();
        assert!(
            e.contains("bytes 5000..9999") && e.contains(&*location.url),
            "{e}"
        );
        let failed = chunks.failed().unwrap();
        assert_eq!(
            failed.kind(),
            ReadKind::Local(std::io::ErrorKind::UnexpectedEof)
        );
        assert!(
            failed
                .message
                .contains("the file ends after 1000 of the 4999 bytes"),
            "{}",
            failed.message
        );
    }
}
