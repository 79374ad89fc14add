//! `type: parquet`: row groups of one or more Parquet files, fetched asynchronously through
//! `object_store` and decoded on the CPU pool, several row groups (across files) in flight.
//!
//! The unit of work is one row group of one file in one epoch: its column chunks are fetched
//! (`next_row_group`, async I/O, only the projected columns), then decoded into Arrow batches
//! on the CPU pool. Units are processed with bounded look-ahead (`prefetch`) and emitted in
//! order: file (sorted by URL), row group, row.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, Schema, SchemaRef};
use std::collections::BTreeMap;

use crate::types::DataTypeName;
use futures::{FutureExt, StreamExt};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReader, RowSelection, RowSelector,
};
use parquet::arrow::async_reader::ParquetRecordBatchStreamBuilder;

use super::reader::ObjectReader;
use crate::error::ReadError;

use crate::batch::{Batch, Lineage, Mark, Name, Origin};
use crate::config::{ParquetSourceConfig, Partitioning, ShardPolicy};
use crate::error::{Error, Result};
use crate::runtime::CpuPool;
use crate::runtime::channel::Sender;
use crate::runtime::metrics::PipelineMetrics;
use crate::state::{DataStamp, FNV_BASIS, fnv1a};
use crate::storage::{ListedObject, ObjectStream, stream_objects};

/// One opened file: its location and decoded footer.
#[derive(Debug)]
pub(crate) struct ParquetFile {
    object: ListedObject,
    metadata: ArrowReaderMetadata,
    /// Root column indices to read, in file order.
    mask: ProjectionMask,
    /// Where each output column comes from: a decoded root or a partition value.
    slots: Vec<Slot>,
    /// The file's `key=value` directories (`partitioning: hive`), in path order.
    partitions: Vec<(String, Option<String>)>,
    /// Each partition value as a one-row array of its column's type (null for Hive's null).
    partition_values: Vec<arrow::array::ArrayRef>,
    /// First row of each row group within the file.
    row_group_starts: Vec<u64>,
    /// Projected schema.
    schema: SchemaRef,
}

/// Files of a source, opened (footer read, schema checked) lazily in listing order and kept
/// for later epochs and passes, so reading starts before a large listing ends.
struct Files {
    /// The listing still to be opened; held while opening the next file.
    state: tokio::sync::Mutex<FilesState>,
    /// What has been opened so far, readable without waiting on the listing.
    seen: std::sync::Mutex<Seen>,
}

/// The files opened so far, in order, and a running stamp of each prefix of them.
#[derive(Default)]
struct Seen {
    files: Vec<Arc<ParquetFile>>,
    /// The listing ended without error: `files` is every file.
    complete: bool,
    /// `prefix[i]`: files `0..=i` stamped (extended lazily).
    prefix: Vec<PrefixStamp>,
}

#[derive(Debug, Clone, Copy)]
struct PrefixStamp {
    hash: u64,
    rows: u64,
    /// Row groups in files `0..=i`.
    units: u64,
}

impl Seen {
    /// Stamps every prefix of the files seen so far. Paths count from the first file's
    /// directory (the part of each path after what it shares with that directory), so a copy
    /// of the dataset elsewhere stamps the same.
    fn stamp_prefixes(&mut self) {
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
    fn stamp(&mut self, n: usize, prefix: bool) -> Option<DataStamp> {
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

struct FilesState {
    pending: Option<futures::stream::BoxStream<'static, Result<Arc<ParquetFile>>>>,
    failed: bool,
}

impl std::fmt::Debug for Files {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Files")
    }
}

impl Files {
    fn seen(&self) -> Result<std::sync::MutexGuard<'_, Seen>> {
        self.seen
            .lock()
            .map_err(|_| Error::Internal("the source's file list is poisoned".into()))
    }

    /// File `i` in order, opening more as needed; `None` past the last one.
    async fn get(&self, i: usize) -> Result<Option<Arc<ParquetFile>>> {
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
    async fn all(&self) -> Result<Vec<Arc<ParquetFile>>> {
        let mut i = 0;
        while self.get(i).await?.is_some() {
            i += 1;
        }
        Ok(self.seen()?.files.clone())
    }

    /// (files, rows per epoch) once every file is open.
    fn totals(&self) -> Option<(usize, u64)> {
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

/// A Parquet source: the first file open (its schema is the source's), the rest opened as
/// reading proceeds.
#[derive(Debug, Clone)]
pub(crate) struct ParquetSource {
    files: Arc<Files>,
    schema: SchemaRef,
    config: ParquetSourceConfig,
    /// Seed of the per-epoch row-group permutation (set by a `shuffle` stage).
    order: Option<u64>,
    rank: usize,
    world: usize,
    resume: Option<Mark>,
    /// Where the source is in the config (`file:line:col`), for errors.
    at: Arc<str>,
    /// The `mix` planned over every file, once they are all open (shared by clones).
    mix_plan: Arc<std::sync::OnceLock<Mixed>>,
}

async fn open_file(
    object: ListedObject,
    columns: Option<Vec<String>>,
    partitioning: Partitioning,
    types: Arc<BTreeMap<String, DataTypeName>>,
    expected_rows: Arc<Vec<(String, u64)>>,
    location: Arc<str>,
) -> Result<Arc<ParquetFile>> {
    let mut reader = ObjectReader::new(&object.location, object.size);
    let metadata = reader.metadata(ArrowReaderOptions::new()).await?;
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

/// The `key=value` directories of an object's path, in order (values percent-decoded, as
/// pyarrow and Hive write them URI-encoded; `__HIVE_DEFAULT_PARTITION__`, Hive's null, as
/// `None`).
pub(crate) fn hive_partitions(
    location: &crate::storage::ObjectLocation,
) -> std::result::Result<Vec<(String, Option<String>)>, String> {
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8_lossy()
            .into_owned()
    };
    // The names as stored: the local store keeps a file name's `%` as it is in the path,
    // the others encode it (`%25`) there.
    let names: Vec<String> = match crate::storage::local_file(location) {
        Some(file) => file
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect(),
        None => location.path.parts().map(|p| decode(p.as_ref())).collect(),
    };
    let mut out: Vec<(String, Option<String>)> = Vec::new();
    for name in names.iter().take(names.len().saturating_sub(1)) {
        let Some((key, value)) = name.split_once('=') else {
            continue;
        };
        let key = decode(key);
        if key.is_empty() {
            continue;
        }
        if out.iter().any(|(k, _)| *k == key) {
            return Err(format!(
                "the partition key `{key}` appears twice in the path"
            ));
        }
        let value = decode(value);
        out.push((
            key,
            (value != "__HIVE_DEFAULT_PARTITION__").then_some(value),
        ));
    }
    Ok(out)
}

impl ParquetSource {
    /// Starts listing, opens the first file (whose schema every other file must share) and
    /// leaves the rest to be opened as reading proceeds.
    pub(crate) async fn open(
        config: &ParquetSourceConfig,
        base_dir: &std::path::Path,
        location: &str,
    ) -> Result<Self> {
        if config.batch_rows == 0 || config.prefetch == 0 || config.epochs == 0 {
            return Err(Error::Source {
                at: location.to_string(),
                message: "`batch_rows`, `prefetch` and `epochs` must be at least 1".into(),
            });
        }
        if let Some(mix) = &config.mix {
            check_mix(mix, config).map_err(|message| Error::Source {
                at: location.to_string(),
                message,
            })?;
        }
        let (objects, expected_rows): (ObjectStream, Vec<(String, u64)>) =
            match (&config.path, &config.manifest) {
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
                        super::manifest::read(manifest, base_dir, &config.storage).await?;
                    (
                        futures::stream::iter(objects.into_iter().map(Ok)).boxed(),
                        rows,
                    )
                }
                _ => {
                    return Err(Error::Source {
                        at: location.to_string(),
                        message:
                            "give exactly one of `path` (files, globs, prefixes) and `manifest`"
                                .into(),
                    });
                }
            };
        let expected_rows = Arc::new(expected_rows);
        let at: Arc<str> = Arc::from(location);
        let columns = config.columns.clone();
        let partitioning = config.partitioning;
        if partitioning == Partitioning::None && !config.partition_types.is_empty() {
            return Err(Error::Source {
                at: location.to_string(),
                message: "`partition_types` types the columns `partitioning: hive` reads from the paths: set `partitioning: hive` too".into(),
            });
        }
        let types = Arc::new(config.partition_types.clone());
        // Footers are small: open up to 16 files ahead, in order.
        let mut opened = objects
            .map(move |o| {
                let (columns, expected_rows, at, types) = (
                    columns.clone(),
                    expected_rows.clone(),
                    at.clone(),
                    types.clone(),
                );
                async move { open_file(o?, columns, partitioning, types, expected_rows, at).await }
            })
            .buffered(16)
            .boxed();
        let first = match opened.next().await {
            Some(f) => f?,
            None => return Err(Error::Internal("listing returned no files".into())),
        };
        let schema = first.schema.clone();
        let (first_url, expected) = (first.object.location.url.clone(), schema.clone());
        let keys = |f: &ParquetFile| -> Vec<String> {
            f.partitions.iter().map(|(k, _)| format!("{k}=…")).collect()
        };
        let first_keys = keys(&first);
        let checked = opened
            .map(move |f| {
                let f = f?;
                let detail = match keys(&f) {
                    k if k != first_keys => Some(format!(
                        "partition directories [{}] where the first file has [{}] (`partitioning: hive` needs the same keys in every path)",
                        k.join(", "),
                        first_keys.join(", ")
                    )),
                    _ => schema_difference(&expected, &f.schema),
                };
                if let Some(detail) = detail {
                    return Err(Error::SchemaMismatch {
                        url: f.object.location.url.to_string(),
                        first_url: first_url.to_string(),
                        detail,
                    });
                }
                Ok(f)
            })
            .boxed();
        Ok(ParquetSource {
            files: Arc::new(Files {
                seen: std::sync::Mutex::new(Seen {
                    files: vec![first],
                    ..Seen::default()
                }),
                state: tokio::sync::Mutex::new(FilesState {
                    pending: Some(checked),
                    failed: false,
                }),
            }),
            schema,
            config: config.clone(),
            order: None,
            rank: 0,
            world: 1,
            resume: None,
            at: location.into(),
            mix_plan: Arc::default(),
        })
    }

    /// Opens every remaining file, checking all footers and schemas (for `sluice validate`).
    pub(crate) async fn open_all(&self) -> Result<()> {
        self.files.all().await?;
        self.mixed().map(|_| ())
    }

    /// With `mix`, once every file is open: what each dataset gives an epoch.
    pub(crate) fn mix_shares(&self) -> Option<Vec<crate::runtime::metrics::MixShare>> {
        Some(self.mixed().ok()??.shares.clone())
    }

    /// Rows are read in listing order, file after file, as they are listed: no row-group
    /// permutation, one rank, no `mix` (each of which needs every footer first).
    pub(crate) fn in_listing_order(&self) -> bool {
        self.order.is_none() && self.world == 1 && self.config.mix.is_none()
    }

    /// With `mix`, once every file is open: the plan, made on the first call and kept (an
    /// error when the weights ask for more rows of an entry than it has).
    fn mixed(&self) -> Result<Option<&Mixed>> {
        if self.config.mix.is_none() {
            return Ok(None);
        }
        if let Some(m) = self.mix_plan.get() {
            return Ok(Some(m));
        }
        let files = {
            let seen = self.files.seen()?;
            if !seen.complete {
                return Err(Error::Internal(
                    "a `mix` planned before every file was open".into(),
                ));
            }
            seen.files.clone()
        };
        let planned = self.plan_mix(&files)?;
        Ok(planned.map(|m| self.mix_plan.get_or_init(|| m)))
    }

    /// With `mix`: every `path` entry's row groups in its seeded order, and the rows of it
    /// every epoch takes, with what that is in words (an error when the weights ask for
    /// more rows of an entry than it has).
    fn plan_mix(&self, files: &[Arc<ParquetFile>]) -> Result<Option<Mixed>> {
        let Some(mix) = &self.config.mix else {
            return Ok(None);
        };
        let paths = self.config.path.as_ref().map_or(&[][..], |p| &p.0[..]);
        let mut units: Vec<Vec<Unit>> = vec![Vec::new(); paths.len()];
        for f in files {
            if let Some(u) = units.get_mut(f.object.entry) {
                u.extend(row_groups(f));
            }
        }
        let rows: Vec<u64> = units
            .iter()
            .map(|u| u.iter().map(|u| u.len).sum())
            .collect();
        let counts =
            mix_counts(&rows, &mix.weights, mix.rows_per_epoch, paths).map_err(|message| {
                Error::Source {
                    at: self.at.to_string(),
                    message,
                }
            })?;
        for (i, u) in units.iter_mut().enumerate() {
            use rand::seq::SliceRandom;
            u.shuffle(&mut crate::stage::seeded_rng(
                mix.seed, MIX_DOMAIN, 0, i as u64,
            ));
        }
        let shares = paths
            .iter()
            .zip(&rows)
            .zip(&counts)
            .map(
                |((path, &rows), &per_epoch)| crate::runtime::metrics::MixShare {
                    path: path.clone(),
                    rows,
                    per_epoch,
                },
            )
            .collect();
        Ok(Some(Mixed {
            units,
            rows,
            counts,
            shares,
        }))
    }

    /// The same source limited to one epoch (for statistics passes).
    pub(crate) fn single_epoch(&self) -> Self {
        let mut s = self.clone();
        s.config.epochs = 1;
        s.configure(None, 0, 1, None);
        s
    }

    /// Schema of the batches produced.
    pub(crate) fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// Split over several ranks (each promised the same number of rows, hence batches): the
    /// size of the batches this source reads.
    pub(crate) fn split_batch_rows(&self) -> Option<usize> {
        (self.world > 1).then_some(self.config.batch_rows)
    }

    /// Number of files, once all are open.
    pub(crate) fn num_files(&self) -> Option<usize> {
        self.files.totals().map(|(n, _)| n)
    }

    /// The files a position (`mark`) is relative to (see [`DataStamp`]). Reading in listing
    /// order (no row-group permutation, one rank), a position depends only on the files up to
    /// the one it is in: those are stamped, as a prefix, and files after it may come or go.
    /// Otherwise the plan depends on every file: stamped once every footer has been read.
    pub(crate) fn data_stamp(&self, mark: Option<&Mark>) -> Option<DataStamp> {
        let mut seen = self.files.seen.lock().ok()?;
        if self.in_listing_order() {
            let unit = mark?.unit;
            seen.stamp_prefixes();
            let n = seen.prefix.partition_point(|p| p.units <= unit) + 1;
            let n = n.min(seen.prefix.len());
            return seen.stamp(n, true);
        }
        if !seen.complete {
            return None;
        }
        let n = seen.files.len();
        let mut stamp = seen.stamp(n, false)?;
        if self.config.mix.is_some() {
            // Each dataset's rows: what counting a mixed epoch ahead needs.
            drop(seen);
            stamp.entries = self.mixed().ok()??.rows.clone();
        }
        Some(stamp)
    }

    /// The stamp of the first `n` files, opening them as needed (fewer when there are fewer).
    pub(crate) async fn prefix_stamp(&self, n: u64) -> Result<DataStamp> {
        let mut have = 0usize;
        while (have as u64) < n && self.files.get(have).await?.is_some() {
            have += 1;
        }
        let mut seen = self.files.seen()?;
        Ok(seen.stamp(have, true).unwrap_or(DataStamp {
            entries: Vec::new(),
            files: 0,
            rows: 0,
            hash: format!("{FNV_BASIS:016x}"),
            prefix: true,
        }))
    }

    /// Rows this rank produces over all epochs, once all files are open (for several ranks,
    /// only known ahead under `redistribute`).
    pub(crate) fn total_rows(&self) -> Option<u64> {
        let (_, mut rows) = self.files.totals()?;
        if self.config.mix.is_some() {
            rows = self.mixed().ok()??.counts.iter().sum();
        }
        let per_epoch = match (self.world, self.config.shard) {
            (1, _) => rows,
            (w, ShardPolicy::Redistribute) => rows / w as u64,
            _ => return None,
        };
        Some(per_epoch * self.config.epochs)
    }

    /// Reads this rank's units of every epoch in order into `tx`, from `self.resume` if set.
    /// Stops at the first error (sent downstream) or when the receiver is gone.
    pub(crate) async fn run(self, tx: Sender, pool: CpuPool, metrics: Arc<PipelineMetrics>) {
        let epochs = self.config.epochs;
        let start = self.resume.unwrap_or(Mark::start_of(0));
        let this = Arc::new(self);
        let (src, m) = (this.clone(), metrics.clone());
        // (epoch, unit index, unit, first row) in order: one epoch's plan at a time.
        let units = futures::stream::iter(start.epoch..epochs)
            .map(move |epoch| {
                src.clone()
                    .epoch_units(epoch, m.clone())
                    .enumerate()
                    .filter_map(move |(i, u)| {
                        let i = i as u64;
                        let item = match u {
                            Err(e) => Some(Err(e)),
                            Ok(u) => {
                                let first = if epoch == start.epoch && i <= start.unit {
                                    (i == start.unit).then_some(start.row)
                                } else {
                                    Some(0)
                                };
                                first.filter(|f| *f < u.len).map(|f| Ok((epoch, i, u, f)))
                            }
                        };
                        futures::future::ready(item)
                    })
            })
            .flatten();
        let batch_rows = this.config.batch_rows;
        let schema = this.schema.clone();
        // The memory budget of the row groups in flight, in KiB: each unit takes its estimate
        // (capped at the whole budget, so a huge row group still goes, alone) before it is
        // started, in plan order, and gives it back once its batches are queued.
        let budget_kib = (this.config.prefetch_bytes.as_u64() / 1024).clamp(1, u32::MAX as u64);
        let budget = Arc::new(tokio::sync::Semaphore::new(budget_kib as usize));
        let mut reading = units
            .then(move |unit| {
                let budget = budget.clone();
                async move {
                    let unit = unit?;
                    let want = (unit.2.estimated_bytes(unit.3) / 1024).clamp(1, budget_kib);
                    let permit = budget
                        .acquire_many_owned(want as u32)
                        .await
                        .map_err(|e| Error::Internal(format!("prefetch budget: {e}")))?;
                    Ok::<_, Error>((unit, permit))
                }
            })
            .map(|unit| {
                // Each unit is fetched and decoded by a task of its own, up to `prefetch` at
                // once, its batches handed over in chunks as they are decoded.
                let read = unit.map(|((epoch, index, unit, first), permit)| {
                    let (tx, rx) = tokio::sync::mpsc::channel(1);
                    let (pool, schema, metrics) = (pool.clone(), schema.clone(), metrics.clone());
                    tokio::spawn(async move {
                        let read = UnitRead {
                            index,
                            first,
                            epoch,
                            batch_rows,
                            pool,
                            schema,
                            metrics,
                        };
                        if let Err(e) = read.run(&unit, &tx).await {
                            let _ = tx.send(Err(e)).await;
                        }
                    });
                    (rx, permit)
                });
                futures::future::ready(read)
            })
            // The unit being handed over counts: `prefetch` in all.
            .buffered(this.config.prefetch.saturating_sub(1).max(1))
            .boxed();
        while let Some(result) = reading.next().await {
            let (mut chunks, permit) = match result {
                Ok(r) => r,
                Err(e) => {
                    tx.send(Err(e)).await;
                    return;
                }
            };
            while let Some(chunk) = chunks.recv().await {
                if !tx.send_all(chunk).await {
                    return;
                }
            }
            drop(permit);
        }
    }

    /// This rank's units for `epoch`: every row group in listing order, permuted when
    /// `order` is set, then split between ranks by the shard policy. Without either, files
    /// are opened as reading reaches them (reading starts before a long listing ends).
    fn epoch_units(
        self: Arc<Self>,
        epoch: u64,
        metrics: Arc<PipelineMetrics>,
    ) -> futures::stream::BoxStream<'static, Result<Unit>> {
        // The first epoch this run reads counts the files and the rows to come (a resumed
        // run: from its restart point on).
        let first = self.resume.map_or(0, |m| m.epoch);
        let restart = self.resume.filter(|m| m.epoch == epoch);
        if self.in_listing_order() {
            let files = self.files.clone();
            let epochs = self.config.epochs;
            return futures::stream::unfold(Some(0usize), move |index| {
                let (files, metrics) = (files.clone(), metrics.clone());
                async move {
                    let i = index?;
                    match files.get(i).await {
                        Ok(Some(f)) => {
                            if epoch == first {
                                metrics.source.files.fetch_add(1, Ordering::Relaxed);
                            }
                            Some((Ok(row_groups(&f)), Some(i + 1)))
                        }
                        Ok(None) => {
                            if epoch == first
                                && let Some((_, rows)) = files.totals()
                            {
                                let before = match restart {
                                    Some(m) => files.all().await.map_or(0, |fs| {
                                        rows_before(fs.iter().flat_map(row_groups), &m)
                                    }),
                                    None => 0,
                                };
                                metrics.source.rows_expected.store(
                                    (rows * epochs.saturating_sub(first)).saturating_sub(before),
                                    Ordering::Relaxed,
                                );
                            }
                            None
                        }
                        Err(e) => Some((Err(e), None)),
                    }
                }
            })
            .flat_map(|r| match r {
                Ok(units) => futures::stream::iter(units.into_iter().map(Ok).collect::<Vec<_>>()),
                Err(e) => futures::stream::iter(vec![Err(e)]),
            })
            .boxed();
        }
        async move {
            let files = self.files.all().await?;
            if epoch == first {
                metrics
                    .source
                    .files
                    .fetch_add(files.len() as u64, Ordering::Relaxed);
            }
            let mut all: Vec<Unit> = match self.mixed()? {
                None => files.iter().flat_map(row_groups).collect(),
                Some(mixed) => {
                    if epoch == first
                        && let Ok(mut shares) = metrics.source.mix.lock()
                    {
                        shares.clone_from(&mixed.shares);
                    }
                    mixed.epoch(epoch)
                }
            };
            if let Some(seed) = self.order {
                use rand::seq::SliceRandom;
                all.shuffle(&mut crate::stage::seeded_rng(seed, 0x726f_7767, epoch, 0));
            }
            let total: u64 = all.iter().map(|u| u.len).sum();
            let units = shard(all, self.rank, self.world, self.config.shard);
            let share: u64 = units.iter().map(|u| u.len).sum();
            if self.world > 1 {
                // Every rank takes the same share: what the policy leaves out or repeats is
                // known from the footers, and said, never silent.
                let dealt = share * self.world as u64;
                if share == 0 && total > 0 {
                    return Err(Error::Source {
                        at: self.at.to_string(),
                        message: format!(
                            "shard `{}` gives each of the {} ranks 0 of the epoch's {total} rows (a rank without a row group of its own cuts every rank to nothing): use `shard: redistribute` (equal contiguous ranges, at most world_size − 1 rows left out), fewer ranks, or files with more row groups",
                            self.config.shard.name(),
                            self.world
                        ),
                    });
                }
                metrics
                    .source
                    .shard_left_out
                    .fetch_add(total.saturating_sub(dealt), Ordering::Relaxed);
                metrics
                    .source
                    .shard_repeated
                    .fetch_add(dealt.saturating_sub(total), Ordering::Relaxed);
            }
            if epoch == first {
                let before = restart.map_or(0, |m| rows_before(units.iter().cloned(), &m));
                metrics.source.rows_expected.store(
                    (share * self.config.epochs.saturating_sub(first)).saturating_sub(before),
                    Ordering::Relaxed,
                );
            }
            Ok(units)
        }
        .into_stream()
        .flat_map(|r: Result<Vec<Unit>>| match r {
            Ok(units) => futures::stream::iter(units.into_iter().map(Ok).collect::<Vec<_>>()),
            Err(e) => futures::stream::iter(vec![Err(e)]),
        })
        .boxed()
    }

    /// Sets the read order and share: row groups permuted per epoch with `order` (a seed),
    /// this rank's share of `world`, and where to resume.
    pub(crate) fn configure(
        &mut self,
        order: Option<u64>,
        rank: usize,
        world: usize,
        resume: Option<Mark>,
    ) {
        self.order = order;
        self.rank = rank;
        self.world = world.max(1);
        self.resume = resume;
    }
}

/// Rows of an epoch's plan (`units`) before the restart point of `m` (which is in it).
fn rows_before(units: impl Iterator<Item = Unit>, m: &Mark) -> u64 {
    units.take(m.unit as usize).map(|u| u.len).sum::<u64>() + m.row
}

/// Every row group of a file, whole.
fn row_groups(f: &Arc<ParquetFile>) -> Vec<Unit> {
    let meta = f.metadata.metadata();
    (0..meta.num_row_groups())
        .map(|rg| Unit {
            file: f.clone(),
            rg,
            start: 0,
            len: meta.row_group(rg).num_rows() as u64,
        })
        .collect()
}

/// Rows `start..start+len` of one row group: the unit of reading.
#[derive(Debug, Clone)]
pub(crate) struct Unit {
    file: Arc<ParquetFile>,
    rg: usize,
    start: u64,
    len: u64,
}

impl Unit {
    /// Memory reading this unit from row `first` takes, from the footer: its projected
    /// column chunks as fetched (compressed) plus its rows decoded (the uncompressed size, or
    /// the values' Arrow width when larger), of which at most two chunks are held at a time.
    fn estimated_bytes(&self, first: u64) -> u64 {
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
        let rows = (meta.num_rows().max(1)) as u64;
        let taken = self.len.saturating_sub(first);
        // Decoded rows are handed over a chunk at a time: at most two chunks are held.
        let decoded = (decoded as u128 * taken as u128 / rows as u128) as u64;
        self.fetched_bytes() + decoded.min(2 * DECODE_CHUNK_BYTES as u64)
    }

    /// Bytes fetched to read this unit: its row group's projected column chunks, compressed.
    fn fetched_bytes(&self) -> u64 {
        let meta = self.file.metadata.metadata().row_group(self.rg);
        meta.columns()
            .iter()
            .enumerate()
            .filter(|(i, _)| self.file.mask.leaf_included(*i))
            .map(|(_, c)| c.compressed_size().max(0) as u64)
            .sum()
    }

    fn cut(&self, offset: u64, len: u64) -> Unit {
        Unit {
            file: self.file.clone(),
            rg: self.rg,
            start: self.start + offset,
            len,
        }
    }
}

/// Rows `from..from+want` of the sequence `units`, as units.
fn take_rows(units: &[Unit], mut from: u64, mut want: u64, out: &mut Vec<Unit>) {
    for u in units {
        if want == 0 {
            break;
        }
        if from >= u.len {
            from -= u.len;
            continue;
        }
        let n = (u.len - from).min(want);
        out.push(u.cut(from, n));
        want -= n;
        from = 0;
    }
}

/// Domain of the `mix` permutations' generator.
const MIX_DOMAIN: u64 = 0x6d69_7865;

/// A `mix` planned over every file (see [`ParquetSource::plan_mix`]).
#[derive(Debug)]
struct Mixed {
    /// Each entry's row groups, permuted by the mix's seed (the cycle its epochs read).
    units: Vec<Vec<Unit>>,
    /// Each entry's rows.
    rows: Vec<u64>,
    /// Each entry's rows per epoch.
    counts: Vec<u64>,
    shares: Vec<crate::runtime::metrics::MixShare>,
}

impl Mixed {
    /// The units of `epoch`: entry `i` gives the next `counts[i]` rows of its cycle (from
    /// row `epoch · counts[i] mod rows[i]`, wrapping around), and the entries' units are
    /// interleaved in proportion — each placed by where its middle row falls in its entry's
    /// share — so that reading in plan order mixes the datasets evenly all through the epoch.
    fn epoch(&self, epoch: u64) -> Vec<Unit> {
        // (entry, rows of the entry's share before the unit, unit)
        let mut placed: Vec<(usize, u64, Unit)> = Vec::new();
        for (i, units) in self.units.iter().enumerate() {
            let (rows, want) = (self.rows[i], self.counts[i]);
            if want == 0 || rows == 0 {
                continue;
            }
            let from = (u128::from(epoch) * u128::from(want) % u128::from(rows)) as u64;
            let head = (rows - from).min(want);
            let mut picked = Vec::new();
            take_rows(units, from, head, &mut picked);
            take_rows(units, 0, want - head, &mut picked);
            let mut before = 0;
            for u in picked {
                let len = u.len;
                placed.push((i, before, u));
                before += len;
            }
        }
        // By (2·before + len) / (2·count): the unit's middle as a fraction of its share,
        // compared exactly; ties in entry order.
        let key = |&(i, before, ref u): &(usize, u64, Unit)| {
            (
                u128::from(2 * before + u.len),
                u128::from(2 * self.counts[i]),
                i,
            )
        };
        placed.sort_by(|a, b| {
            let ((na, da, ia), (nb, db, ib)) = (key(a), key(b));
            (na * db).cmp(&(nb * da)).then(ia.cmp(&ib))
        });
        placed.into_iter().map(|(_, _, u)| u).collect()
    }
}

/// A `mix` that cannot work whatever the files hold: refused when the source opens.
fn check_mix(
    mix: &crate::config::Mix,
    config: &ParquetSourceConfig,
) -> std::result::Result<(), String> {
    let Some(paths) = &config.path else {
        return Err(
            "`mix` weighs the entries of a `path` list: list the datasets under `path` (one entry each), not in a `manifest`".into(),
        );
    };
    if mix.weights.len() != paths.0.len() {
        return Err(format!(
            "`mix.weights` has {} weight(s) for the {} `path` entries: give one per entry, in the same order",
            mix.weights.len(),
            paths.0.len()
        ));
    }
    if let Some((i, w)) = mix
        .weights
        .iter()
        .enumerate()
        .find(|(_, w)| !(w.is_finite() && **w > 0.0))
    {
        return Err(format!(
            "`mix.weights[{i}]` is {w}: weights must be positive numbers (leave an entry out of `path` to take none of it)"
        ));
    }
    if mix.rows_per_epoch == Some(0) {
        return Err("`mix.rows_per_epoch` must be at least 1".into());
    }
    Ok(())
}

/// `total` rows split in proportion to `weights`: each gets the floor of its quota, and the
/// rows left go to the largest remainders (ties to the earlier entry), so the parts sum to
/// `total` exactly.
fn apportion(total: u64, weights: &[f64]) -> Vec<u64> {
    let sum: f64 = weights.iter().sum();
    let quotas: Vec<f64> = weights.iter().map(|w| total as f64 * w / sum).collect();
    let mut parts: Vec<u64> = quotas.iter().map(|q| q.floor() as u64).collect();
    // Fewer than one row per entry is left (more only through rounding: bounded anyway).
    let left = total
        .saturating_sub(parts.iter().sum())
        .min(parts.len() as u64);
    let mut order: Vec<usize> = (0..parts.len()).collect();
    order.sort_by(|&a, &b| {
        let (ra, rb) = (quotas[a] - quotas[a].floor(), quotas[b] - quotas[b].floor());
        rb.total_cmp(&ra).then(a.cmp(&b))
    });
    for &i in order.iter().cycle().take(left as usize) {
        parts[i] += 1;
    }
    parts
}

/// Rows of each entry (`rows`) an epoch of a `mix` takes: `rows_per_epoch` (or, without it,
/// the most that repeats no row) apportioned by `weights`.
pub(crate) fn mix_counts(
    rows: &[u64],
    weights: &[f64],
    rows_per_epoch: Option<u64>,
    paths: &[String],
) -> std::result::Result<Vec<u64>, String> {
    if let Some(i) = rows.iter().position(|&r| r == 0) {
        return Err(format!(
            "`mix`: `path` entry {i} (`{}`) has no rows (an empty file, or only files an earlier entry lists too — a file named by two entries belongs to the first)",
            paths.get(i).map_or("", |p| p.as_str())
        ));
    }
    // Relative to the largest weight: no sum of huge weights overflows.
    let largest = weights.iter().copied().fold(f64::MIN_POSITIVE, f64::max);
    let weights: Vec<f64> = weights.iter().map(|w| w / largest).collect();
    let weights = &weights[..];
    let sum: f64 = weights.iter().sum();
    // The most rows an epoch can take without repeating one: the entry with the fewest rows
    // per unit of weight (`limit`) read whole.
    let per_weight = |i: usize| rows[i] as f64 * sum / weights[i];
    let limit = (0..rows.len())
        .min_by(|&a, &b| per_weight(a).total_cmp(&per_weight(b)))
        .unwrap_or(0);
    let fits = |parts: &[u64]| parts.iter().zip(rows).all(|(p, r)| p <= r);
    // Floating-point rounding may put one row too many on a whole entry: step down.
    let mut cap = per_weight(limit).floor() as u64;
    let mut capped = apportion(cap, weights);
    for _ in 0..64 {
        if fits(&capped) || cap == 0 {
            break;
        }
        cap -= 1;
        capped = apportion(cap, weights);
    }
    let Some(want) = rows_per_epoch else {
        return Ok(capped);
    };
    let parts = apportion(want, weights);
    if want > cap || !fits(&parts) {
        return Err(format!(
            "`mix.rows_per_epoch: {want}` would take {} rows of `path` entry {limit} (`{}`), which has {}: an epoch never repeats a row, so these weights allow at most {cap} rows per epoch; lower `rows_per_epoch` or that entry's weight",
            want as f64 * weights[limit] / sum,
            paths.get(limit).map_or("", |p| p.as_str()),
            rows[limit]
        ));
    }
    Ok(parts)
}

/// This rank's share of an epoch's units (see [`crate::config::ShardPolicy`]).
pub(crate) fn shard(all: Vec<Unit>, rank: usize, world: usize, policy: ShardPolicy) -> Vec<Unit> {
    if world <= 1 {
        return all;
    }
    let total: u64 = all.iter().map(|u| u.len).sum();
    let mut out = Vec::new();
    match policy {
        ShardPolicy::Redistribute => {
            let q = total / world as u64;
            take_rows(&all, q * rank as u64, q, &mut out);
        }
        ShardPolicy::DropLast | ShardPolicy::Pad => {
            let mut counts = vec![0u64; world];
            for (i, u) in all.iter().enumerate() {
                counts[i % world] += u.len;
            }
            let own: Vec<Unit> = all
                .iter()
                .enumerate()
                .filter(|(i, _)| i % world == rank)
                .map(|(_, u)| u.clone())
                .collect();
            let mine = counts[rank];
            if policy == ShardPolicy::DropLast {
                let min = counts.iter().copied().min().unwrap_or(0);
                take_rows(&own, 0, min, &mut out);
            } else {
                let max = counts.iter().copied().max().unwrap_or(0);
                out = own.clone();
                // Repeat this rank's rows (or, if it has none, the epoch's) up to the largest share.
                let pool = if mine > 0 { own } else { all };
                let pool_rows: u64 = pool.iter().map(|u| u.len).sum();
                let mut missing = max - mine;
                while missing > 0 && pool_rows > 0 {
                    let n = missing.min(pool_rows);
                    take_rows(&pool, 0, n, &mut out);
                    missing -= n;
                }
            }
        }
    }
    out
}

/// Decoded rows handed over at a time (at least one batch): what a unit in flight holds
/// besides its fetched column chunks, twice (one chunk queued, one being decoded).
const DECODE_CHUNK_BYTES: usize = 8 << 20;

/// How one unit is read: where it sits in the plan and what to read it with.
struct UnitRead {
    index: u64,
    first: u64,
    epoch: u64,
    batch_rows: usize,
    pool: CpuPool,
    schema: SchemaRef,
    metrics: Arc<PipelineMetrics>,
}

impl UnitRead {
    /// Fetches the projected column chunks of the unit's `take` rows from `skip` on, and
    /// returns their decoder.
    async fn fetch(&self, unit: &Unit, skip: u64, take: u64) -> Result<ParquetRecordBatchReader> {
        let (file, rg) = (&unit.file, unit.rg);
        let url = &file.object.location.url;
        let rg_rows = file.metadata.metadata().row_group(rg).num_rows() as u64;
        let reader = ObjectReader::new(&file.object.location, file.object.size);
        let mut builder =
            ParquetRecordBatchStreamBuilder::new_with_metadata(reader, file.metadata.clone())
                .with_projection(file.mask.clone())
                .with_row_groups(vec![rg])
                .with_batch_size(self.batch_rows);
        if skip > 0 || take < rg_rows {
            let mut sel = Vec::new();
            if skip > 0 {
                sel.push(RowSelector::skip(skip as usize));
            }
            sel.push(RowSelector::select(take as usize));
            builder = builder.with_row_selection(RowSelection::from(sel));
        }
        let mut stream = builder
            .build()
            .map_err(|e| Error::parquet(url, Some(rg), e))?;
        match stream.next_row_group().await {
            Ok(Some(decoder)) => Ok(decoder),
            Ok(None) => Err(Error::Internal(format!("{url}: row group {rg} missing"))),
            Err(e) if is_read_error(&e) => Err(Error::parquet(url, Some(rg), e)),
            Err(e) => {
                let column = failing_column(file, rg, &self.pool).await;
                Err(Error::parquet(url, Some(rg), e).in_column(column))
            }
        }
    }

    /// Fetches the unit's projected column chunks, then decodes them on the CPU pool a chunk
    /// of batches at a time into `out`, in order. Returns early (`Ok`) when `out` is gone.
    async fn run(
        &self,
        unit: &Unit,
        out: &tokio::sync::mpsc::Sender<Result<Vec<Batch>>>,
    ) -> Result<()> {
        let file = &unit.file;
        let rg = unit.rg;
        let url = &file.object.location.url;
        let skip = unit.start + self.first;
        let take = unit.len - self.first;
        let mut decoder = self.fetch(unit, skip, take).await?;
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
                Err(e) => {
                    let column = failing_column(file, rg, &self.pool).await;
                    return Err(Error::parquet(url, Some(rg), decode_error(e)).in_column(column));
                }
            };
            if decoded.is_empty() {
                break;
            }
            let mut chunk = Vec::with_capacity(decoded.len());
            for rb in decoded {
                let arrow_err = |e| Error::Arrow {
                    context: format!("{url}: row group {rg}"),
                    source: e,
                };
                let columns = file
                    .slots
                    .iter()
                    .map(|slot| match *slot {
                        Slot::File(i) => Ok(rb.column(i).clone()),
                        Slot::Partition(k) => {
                            partition_column(&file.partition_values[k], rb.num_rows())
                        }
                    })
                    .collect::<std::result::Result<Vec<_>, _>>()
                    .map_err(arrow_err)?;
                let rb = RecordBatch::try_new(self.schema.clone(), columns).map_err(arrow_err)?;
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
fn decode_error(e: arrow::error::ArrowError) -> parquet::errors::ParquetError {
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
async fn failing_column(file: &ParquetFile, rg: usize, pool: &CpuPool) -> Option<String> {
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

/// Where an output column of a file comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// A decoded root column (its position among the roots read, which are in file order).
    File(usize),
    /// A partition value (index into [`ParquetFile::partitions`]).
    Partition(usize),
}

/// Every row of a file's partition column: `value` repeated, or nulls.
fn partition_column(
    value: &arrow::array::ArrayRef,
    rows: usize,
) -> std::result::Result<arrow::array::ArrayRef, arrow::error::ArrowError> {
    use arrow::array::Array;
    if value.is_null(0) {
        return Ok(arrow::array::new_null_array(value.data_type(), rows));
    }
    if let Some(s) = value.as_any().downcast_ref::<arrow::array::StringArray>() {
        return Ok(Arc::new(arrow::array::StringArray::from_iter_values(
            std::iter::repeat_n(s.value(0), rows),
        )));
    }
    let zeros = arrow::array::UInt32Array::from(vec![0u32; rows]);
    arrow::compute::take(value.as_ref(), &zeros, None)
}

/// Each partition value as a one-row array of its column's type (`types`, else `utf8`); a
/// key in `types` that the path does not have, or a value not of its type, is an error.
fn typed_partitions(
    partitions: &[(String, Option<String>)],
    types: &BTreeMap<String, DataTypeName>,
) -> std::result::Result<Vec<arrow::array::ArrayRef>, String> {
    if let Some(key) = types
        .keys()
        .find(|k| !partitions.iter().any(|(p, _)| p == *k))
    {
        let keys: Vec<&str> = partitions.iter().map(|(k, _)| k.as_str()).collect();
        return Err(format!(
            "`partition_types` names `{key}`, which is not a `key=…` directory of the path; the path has [{}]{}",
            keys.join(", "),
            crate::config::did_you_mean(key, keys.iter().copied())
        ));
    }
    partitions
        .iter()
        .map(|(key, value)| {
            let text: arrow::array::ArrayRef =
                Arc::new(arrow::array::StringArray::from(vec![value.as_deref()]));
            let Some(name) = types.get(key) else {
                return Ok(text);
            };
            let options = arrow::compute::CastOptions {
                safe: false,
                ..Default::default()
            };
            arrow::compute::cast_with_options(&text, name.data_type(), &options).map_err(|e| {
                format!(
                    "the partition directory `{key}={}` is not a `{name}` value (`partition_types`): {e}",
                    value.as_deref().unwrap_or_default()
                )
            })
        })
        .collect()
}

/// Computes the root columns to read (file order), where each output column comes from (in
/// the requested order; default: the file's columns, then the partition keys), and the
/// output schema (partition columns are nullable, of their `partition_types` or `utf8`), without the file's schema
/// metadata, so files written by different tools compare equal.
fn project(
    file_schema: &Schema,
    columns: Option<&[String]>,
    partitions: &[(String, Option<String>)],
    types: &BTreeMap<String, DataTypeName>,
) -> Result<(Vec<usize>, Vec<Slot>, SchemaRef), String> {
    if let Some((key, _)) = partitions
        .iter()
        .find(|(k, _)| file_schema.index_of(k).is_ok())
    {
        return Err(format!(
            "column `{key}` is both in the file and a partition directory (`{key}=…`) of its path; rename one, or read without `partitioning: hive`"
        ));
    }
    let all: Vec<String>;
    let names: &[String] = match columns {
        Some(c) => c,
        None => {
            all = file_schema
                .fields()
                .iter()
                .map(|f| f.name().clone())
                .chain(partitions.iter().map(|(k, _)| k.clone()))
                .collect();
            &all
        }
    };
    enum Wanted {
        File(usize),
        Partition(usize),
    }
    let mut wanted = Vec::with_capacity(names.len());
    for (j, name) in names.iter().enumerate() {
        if names[..j].contains(name) {
            return Err(format!("column `{name}` is listed twice in `columns`"));
        }
        if let Ok(i) = file_schema.index_of(name) {
            wanted.push(Wanted::File(i));
        } else if let Some(k) = partitions.iter().position(|(key, _)| key == name) {
            wanted.push(Wanted::Partition(k));
        } else {
            let mut available = crate::stage::column_names(file_schema);
            available.extend(partitions.iter().map(|(k, _)| k.as_str()));
            return Err(crate::stage::no_such_column(name, &available, ""));
        }
    }
    let mut roots: Vec<usize> = wanted
        .iter()
        .filter_map(|w| match w {
            Wanted::File(i) => Some(*i),
            Wanted::Partition(_) => None,
        })
        .collect();
    roots.sort_unstable();
    // Decoded batches hold the roots in file order; position of each wanted root there:
    let slots = wanted
        .iter()
        .map(|w| match w {
            Wanted::File(i) => Slot::File(roots.iter().position(|r| r == i).unwrap_or(0)),
            Wanted::Partition(k) => Slot::Partition(*k),
        })
        .collect();
    let fields: Vec<arrow::datatypes::FieldRef> = wanted
        .iter()
        .map(|w| match w {
            Wanted::File(i) => Arc::new(file_schema.field(*i).clone()),
            Wanted::Partition(k) => Arc::new(arrow::datatypes::Field::new(
                &partitions[*k].0,
                types
                    .get(&partitions[*k].0)
                    .map_or(DataType::Utf8, |t| t.data_type().clone()),
                true,
            )),
        })
        .collect();
    Ok((roots, slots, Arc::new(Schema::new(fields))))
}

fn schema_difference(a: &Schema, b: &Schema) -> Option<String> {
    if a.fields().len() != b.fields().len() {
        return Some(format!(
            "{} columns instead of {}",
            b.fields().len(),
            a.fields().len()
        ));
    }
    for (fa, fb) in a.fields().iter().zip(b.fields()) {
        if fa.name() != fb.name() {
            return Some(format!(
                "column `{}` where `{}` was expected",
                fb.name(),
                fa.name()
            ));
        }
        if !fa.data_type().equals_datatype(fb.data_type()) {
            return Some(format!(
                "column `{}` is {} instead of {}",
                fa.name(),
                fb.data_type(),
                fa.data_type()
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_are_apportioned_by_the_largest_remainders() {
        // Quotas 3.33…, 3.33…, 3.33…: the one row left goes to the first.
        assert_eq!(apportion(10, &[1.0, 1.0, 1.0]), [4, 3, 3]);
        // 7.5 and 2.5: both remainders equal, the earlier entry first.
        assert_eq!(apportion(10, &[3.0, 1.0]), [8, 2]);
        // 0.6, 2.4: the larger remainder wins.
        assert_eq!(apportion(3, &[1.0, 4.0]), [1, 2]);
        assert_eq!(apportion(0, &[1.0, 2.0]), [0, 0]);
    }

    #[test]
    fn an_epoch_takes_the_most_rows_that_repeat_none() {
        let paths = ["a".to_string(), "b".to_string()];
        // b (300 rows, weight 1) limits: 3 × 300 of a, all of b.
        assert_eq!(
            mix_counts(&[3000, 300], &[3.0, 1.0], None, &paths),
            Ok(vec![900, 300])
        );
        // a limits when its weight is large: all of a, a tenth of that from b.
        assert_eq!(
            mix_counts(&[100, 300], &[10.0, 1.0], None, &paths),
            Ok(vec![100, 10])
        );
        assert_eq!(
            mix_counts(&[3000, 300], &[3.0, 1.0], Some(40), &paths),
            Ok(vec![30, 10])
        );
        let e = mix_counts(&[3000, 300], &[3.0, 1.0], Some(1201), &paths).unwrap_err();
        assert!(
            e.contains("would take 300.25 rows of `path` entry 1 (`b`), which has 300"),
            "{e}"
        );
        assert!(e.contains("allow at most 1200 rows"), "{e}");
        // Weights as large or as small as floats go: the same shares as 3 : 1.
        assert_eq!(
            mix_counts(&[3000, 300], &[3e307, 1e307], None, &paths),
            Ok(vec![900, 300])
        );
        assert_eq!(
            mix_counts(&[3000, 300], &[3e-300, 1e-300], None, &paths),
            Ok(vec![900, 300])
        );
        // A weight too small to matter next to the other: none of that entry.
        assert_eq!(
            mix_counts(&[3000, 300], &[1.0, 1e-300], None, &paths),
            Ok(vec![3000, 0])
        );
        let e = mix_counts(&[3000, 0], &[3.0, 1.0], None, &paths).unwrap_err();
        assert!(e.contains("entry 1 (`b`) has no rows"), "{e}");
    }
}
