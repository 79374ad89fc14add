//! `type: parquet`: row groups of one or more Parquet files, fetched asynchronously through
//! `object_store` and decoded on the CPU pool, several row groups (across files) in flight.
//!
//! The unit of work is one row group of one file in one epoch: its column chunks are fetched
//! (`next_row_group`, async I/O, only the projected columns), then decoded into Arrow batches
//! on the CPU pool. Units are processed with bounded look-ahead (`prefetch`) and emitted in
//! order: file (sorted by URL), row group, row.

mod columns;
mod files;
mod fixed;
mod gather;
mod global;
mod levels;
mod list_column;
mod lists;
mod mix;
mod partitions;
mod plan;
mod read;
mod settings;
mod unit;

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use futures::StreamExt;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::ArrowReaderMetadata;

use self::columns::{Slot, schema_difference};
use self::files::{Files, FilesState, Seen, list_objects, open_file};
use self::global::{Block, GlobalPlan};
use self::mix::{Mixed, check_mix};
use self::read::{ReadOptions, UnitRead};
use self::unit::Unit;
use crate::batch::Mark;
use crate::error::{Error, Result};
use crate::runtime::CpuPool;
use crate::runtime::channel::Sender;
use crate::runtime::metrics::PipelineMetrics;
use crate::state::{DataStamp, FNV_BASIS};
use crate::storage::ListedObject;

pub(crate) use self::global::GlobalShuffle;
pub(crate) use self::mix::mix_counts;
pub(crate) use self::partitions::hive_partitions;
pub use self::settings::{Mix, ParquetSourceConfig, Partitioning, ShardPolicy};

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

/// A Parquet source: the first file open (its schema is the source's), the rest opened as
/// reading proceeds.
#[derive(Debug, Clone)]
pub(crate) struct ParquetSource {
    files: Arc<Files>,
    schema: SchemaRef,
    config: ParquetSourceConfig,
    /// Seed of the per-epoch row-group permutation (set by a `shuffle` stage).
    order: Option<u64>,
    /// A global shuffle (`shuffle: {mode: global}`): the epoch read in a seeded permutation
    /// of its rows, by random access.
    global: Option<GlobalShuffle>,
    rank: usize,
    world: usize,
    resume: Option<Mark>,
    /// Where the source is in the config (`file:line:col`), for errors.
    at: Arc<str>,
    /// Fixed-size list values in huge pages (`runtime::huge`): set when a window shuffle is
    /// the first stage, which gathers them at random.
    huge_lists: bool,
    /// The `mix` planned over every file, once they are all open (shared by clones).
    mix_plan: Arc<std::sync::OnceLock<Mixed>>,
    /// A global shuffle's plan over every file, once they are all open (shared by clones).
    global_plan: Arc<std::sync::OnceLock<Arc<GlobalPlan>>>,
}

/// What the source reads next: rows of one row group, or a global shuffle's block.
enum Work {
    Rows(Unit),
    Block(Block),
}

impl Work {
    fn len(&self) -> u64 {
        match self {
            Work::Rows(u) => u.len,
            Work::Block(b) => b.len,
        }
    }
}

impl ParquetSource {
    /// Starts listing, opens the first file (whose schema every other file must share) and
    /// leaves the rest to be opened as reading proceeds. With `page_index`, each footer's
    /// offset index is read too (a global shuffle fetches only the pages it needs).
    pub(crate) async fn open(
        config: &ParquetSourceConfig,
        base_dir: &std::path::Path,
        location: &str,
        page_index: bool,
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
        let (objects, expected_rows) = list_objects(config, base_dir, location).await?;
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
                let options = (columns, partitioning, types, page_index);
                async move { open_file(o?, options, expected_rows, at).await }
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
            global: None,
            huge_lists: false,
            rank: 0,
            world: 1,
            resume: None,
            at: location.into(),
            mix_plan: Arc::default(),
            global_plan: Arc::default(),
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
        self.order.is_none()
            && self.global.is_none()
            && self.world == 1
            && self.config.mix.is_none()
    }

    /// The same source limited to one epoch (for statistics passes).
    pub(crate) fn single_epoch(&self) -> Self {
        let mut s = self.clone();
        s.config.epochs = 1;
        s.configure(None, None, 0, 1, None);
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
            (w, _) if self.global.is_some() => rows / w as u64,
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
                    .epoch_work(epoch, m.clone())
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
                                first.filter(|f| *f < u.len()).map(|f| Ok((epoch, i, u, f)))
                            }
                        };
                        futures::future::ready(item)
                    })
            })
            .flatten();
        let options = ReadOptions {
            batch_rows: this.config.batch_rows,
            memory_map: this.config.memory_map,
            huge_lists: this.huge_lists,
        };
        let schema = this.schema.clone();
        let threads = pool.threads();
        // The memory budget of the row groups in flight, in KiB: each unit takes its estimate
        // (capped at the whole budget, so a huge row group still goes, alone) before it is
        // started, in plan order, and gives it back once its batches are queued.
        let budget_kib = (this.config.prefetch_bytes.as_u64() / 1024).clamp(1, u32::MAX as u64);
        let budget = Arc::new(tokio::sync::Semaphore::new(budget_kib as usize));
        let reading = units
            .then(move |unit| {
                let budget = budget.clone();
                async move {
                    let unit = unit?;
                    let bytes = match &unit.2 {
                        Work::Rows(u) => u.estimated_bytes(unit.3),
                        Work::Block(b) => b.estimated_bytes(unit.3, 2 * threads),
                    };
                    let want = (bytes / 1024).clamp(1, budget_kib);
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
                            options,
                            pool,
                            schema,
                            metrics,
                        };
                        let done = match unit {
                            Work::Rows(unit) => read.run(&unit, &tx).await,
                            Work::Block(block) => read.run_block(&block, &tx).await,
                        };
                        if let Err(e) = done {
                            let _ = tx.send(Err(e)).await;
                        }
                    });
                    (rx, permit)
                });
                futures::future::ready(read)
            });
        let mut reading = in_flight(reading, this.config.prefetch);
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

    /// Whether the first stage gathers the source's rows at random (a window shuffle held in
    /// memory, `ShuffleConfig::gathers_in_memory`): their fixed-size list values then go to
    /// huge pages.
    pub(crate) fn gathered_next(&mut self, yes: bool) {
        self.huge_lists = yes;
    }

    /// Sets the read order and share: row groups permuted per epoch with `order` (a seed), or
    /// every row with `global`; this rank's share of `world`, and where to resume.
    pub(crate) fn configure(
        &mut self,
        order: Option<u64>,
        global: Option<GlobalShuffle>,
        rank: usize,
        world: usize,
        resume: Option<Mark>,
    ) {
        self.order = order;
        self.global = global;
        self.rank = rank;
        self.world = world.max(1);
        self.resume = resume;
    }
}

/// `units` (each item starts its unit's task when it is taken from `units`) with `prefetch`
/// of them started in all, the one being handed over among them. `buffered` refills its queue
/// only when polled, and the source does not poll it while it drains a unit, so a queue of
/// `prefetch` leaves `prefetch - 1` started ahead of the one being drained. (It was a queue
/// of `prefetch - 1`, which left `prefetch: 2` decoding one row group at a time.)
fn in_flight<'a, T: Send + 'a>(
    units: impl futures::Stream<Item = futures::future::Ready<T>> + Send + 'a,
    prefetch: usize,
) -> futures::stream::BoxStream<'a, T> {
    units.buffered(prefetch.max(1)).boxed()
}

#[cfg(test)]
mod tests;
