//! The files of a source: listed, opened (footer read, columns projected) lazily in order and
//! kept, with a stamp of each prefix of them.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::ArrowReaderOptions;

use super::ParquetFile;
use super::columns::project;
use super::partitions::{hive_partitions, typed_partitions};
use super::{ParquetSourceConfig, Partitioning};
use crate::error::{Error, Result};
use crate::source::reader::ObjectReader;
use crate::state::{DataStamp, FNV_BASIS, fnv1a};
use crate::storage::{ListedObject, ObjectStream, stream_objects};
use crate::types::DataTypeName;

/// Files of a source, opened (footer read, schema checked) lazily in listing order and kept
/// for later epochs and passes, so reading starts before a large listing ends.
pub(super) struct Files {
    /// The listing still to be opened; held while opening the next file.
    pub(super) state: tokio::sync::Mutex<FilesState>,
    /// What has been opened so far, readable without waiting on the listing.
    pub(super) seen: std::sync::Mutex<Seen>,
}

/// The files opened so far, in order, and a running stamp of each prefix of them.
#[derive(Default)]
pub(super) struct Seen {
    pub(super) files: Vec<Arc<ParquetFile>>,
    /// The listing ended without error: `files` is every file.
    pub(super) complete: bool,
    /// `prefix[i]`: files `0..=i` stamped (extended lazily).
    pub(super) prefix: Vec<PrefixStamp>,
}

#[derive(Debug, Clone, Copy)]
pub(super) struct PrefixStamp {
    hash: u64,
    rows: u64,
    /// Row groups in files `0..=i`.
    pub(super) units: u64,
}

impl Seen {
    /// Stamps every prefix of the files seen so far. Paths count from the first file's
    /// directory (the part of each path after what it shares with that directory), so a copy
    /// of the dataset elsewhere stamps the same.
    pub(super) fn stamp_prefixes(&mut self) {
        let Some(first) = self.files.first() else {
            return;
        };
        let first = &*first.object.location.url;
        let base = &first[..first.rfind('/').map_or(0, |i| i + 1)];
        while self.prefix.len() < self.files.len() {
            let f = &self.files[self.prefix.len()];
            let url = &*f.object.location.url;
            let common = base
                .bytes()
                .zip(url.bytes())
                .take_while(|(a, b)| a == b)
                .count();
            let cut = url[..common].rfind('/').map_or(0, |i| i + 1);
            let mut p = self.prefix.last().copied().unwrap_or(PrefixStamp {
                hash: FNV_BASIS,
                rows: 0,
                units: 0,
            });
            p.hash = fnv1a(&url.as_bytes()[cut..], p.hash);
            for rg in f.metadata.metadata().row_groups() {
                p.hash = fnv1a(&rg.num_rows().to_le_bytes(), p.hash);
                p.rows += rg.num_rows() as u64;
                p.units += 1;
            }
            p.hash = fnv1a(b"/", p.hash);
            self.prefix.push(p);
        }
    }

    /// The stamp of the first `n` files (`n` ≥ 1, at most those seen).
    pub(super) fn stamp(&mut self, n: usize, prefix: bool) -> Option<DataStamp> {
        self.stamp_prefixes();
        let p = self.prefix.get(n.checked_sub(1)?)?;
        Some(DataStamp {
            entries: Vec::new(),
            files: n as u64,
            rows: p.rows,
            hash: format!("{:016x}", p.hash),
            prefix,
        })
    }
}

pub(super) struct FilesState {
    pub(super) pending: Option<futures::stream::BoxStream<'static, Result<Arc<ParquetFile>>>>,
    pub(super) failed: bool,
}

impl std::fmt::Debug for Files {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Files")
    }
}

impl Files {
    pub(super) fn seen(&self) -> Result<std::sync::MutexGuard<'_, Seen>> {
        self.seen
            .lock()
            .map_err(|_| Error::Internal("the source's file list is poisoned".into()))
    }

    /// File `i` in order, opening more as needed; `None` past the last one.
    pub(super) async fn get(&self, i: usize) -> Result<Option<Arc<ParquetFile>>> {
        let mut st = self.state.lock().await;
        loop {
            if let Some(f) = self.seen()?.files.get(i) {
                return Ok(Some(f.clone()));
            }
            let Some(pending) = st.pending.as_mut() else {
                if st.failed {
                    return Err(Error::Internal("listing the source failed earlier".into()));
                }
                return Ok(None);
            };
            match pending.next().await {
                Some(Ok(f)) => self.seen()?.files.push(f),
                Some(Err(e)) => {
                    st.pending = None;
                    st.failed = true;
                    return Err(e);
                }
                None => {
                    st.pending = None;
                    self.seen()?.complete = true;
                }
            }
        }
    }

    /// Opens every file (for planning and validation).
    pub(super) async fn all(&self) -> Result<Vec<Arc<ParquetFile>>> {
        let mut i = 0;
        while self.get(i).await?.is_some() {
            i += 1;
        }
        Ok(self.seen()?.files.clone())
    }

    /// (files, rows per epoch) once every file is open.
    pub(super) fn totals(&self) -> Option<(usize, u64)> {
        let seen = self.seen.lock().ok()?;
        if !seen.complete {
            return None;
        }
        let rows = seen
            .files
            .iter()
            .map(|f| f.metadata.metadata().file_metadata().num_rows() as u64)
            .sum();
        Some((seen.files.len(), rows))
    }
}

/// What a source lists: the objects of its `path` entries, or those of its `manifest` with
/// the rows the manifest gives each (none for `path`).
pub(super) async fn list_objects(
    config: &ParquetSourceConfig,
    base_dir: &std::path::Path,
    location: &str,
) -> Result<(ObjectStream, Vec<(String, u64)>)> {
    let listed: (ObjectStream, Vec<(String, u64)>) = match (&config.path, &config.manifest) {
        (Some(paths), None) => (
            stream_objects(
                paths.0.clone(),
                base_dir.to_path_buf(),
                config.storage.clone(),
            ),
            Vec::new(),
        ),
        (None, Some(manifest)) => {
            let (objects, rows) =
                crate::source::manifest::read(manifest, base_dir, &config.storage).await?;
            (
                futures::stream::iter(objects.into_iter().map(Ok)).boxed(),
                rows,
            )
        }
        _ => {
            return Err(Error::Source {
                at: location.to_string(),
                message: "give exactly one of `path` (files, globs, prefixes) and `manifest`"
                    .into(),
            });
        }
    };
    Ok(listed)
}

/// How files are opened: the columns to read, the partition columns of their paths, and
/// whether the offset index is read with the footer.
pub(super) type OpenOptions = (
    Option<Vec<String>>,
    Partitioning,
    Arc<BTreeMap<String, DataTypeName>>,
    bool,
);

pub(super) async fn open_file(
    object: ListedObject,
    (columns, partitioning, types, page_index): OpenOptions,
    expected_rows: Arc<Vec<(String, u64)>>,
    location: Arc<str>,
) -> Result<Arc<ParquetFile>> {
    let mut reader = ObjectReader::new(&object.location, object.size);
    let mut options = ArrowReaderOptions::new();
    if page_index {
        use parquet::file::metadata::PageIndexPolicy;
        options = options.with_offset_index_policy(PageIndexPolicy::Optional);
    }
    let metadata = reader.metadata(options).await?;
    let rows = metadata.metadata().file_metadata().num_rows() as u64;
    if let Some((_, want)) = expected_rows
        .iter()
        .find(|(u, _)| **u == *object.location.url)
        && *want != rows
    {
        return Err(Error::Source {
            at: location.to_string(),
            message: format!(
                "{}: the manifest says {want} rows but the file has {rows}; the manifest is stale",
                object.location.url
            ),
        });
    }
    let file_schema = metadata.schema().clone();
    let source_error = |message: String| Error::Source {
        at: location.to_string(),
        message: format!("{}: {message}", object.location.url),
    };
    let partitions = match partitioning {
        Partitioning::Hive => hive_partitions(&object.location).map_err(source_error)?,
        Partitioning::None => Vec::new(),
    };
    let partition_values = typed_partitions(&partitions, &types).map_err(&source_error)?;
    let (root_indices, slots, projected) =
        project(&file_schema, columns.as_deref(), &partitions, &types)
        .map_err(|mut message| {
            // A column missing from the file that the path names as a partition.
            if partitioning == Partitioning::None
                && let Ok(keys) = hive_partitions(&object.location)
                && let Some(name) = columns.iter().flatten().find(|c| {
                    file_schema.index_of(c).is_err() && keys.iter().any(|(k, _)| k == *c)
                })
            {
                message.push_str(&format!(
                    "; the path has a `{name}=…` directory: set `partitioning: hive` to read it as a column"
                ));
            }
            source_error(message)
        })?;
    let parquet_meta = metadata.metadata();
    let mask = ProjectionMask::roots(parquet_meta.file_metadata().schema_descr(), root_indices);
    let mut row_group_starts = Vec::with_capacity(parquet_meta.num_row_groups());
    let mut next = 0u64;
    for rg in parquet_meta.row_groups() {
        row_group_starts.push(next);
        next += rg.num_rows() as u64;
    }
    Ok(Arc::new(ParquetFile {
        object,
        metadata,
        mask,
        slots,
        partitions,
        partition_values,
        row_group_starts,
        schema: projected,
    }))
}
