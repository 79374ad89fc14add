//! Counters the pipeline keeps while it runs: read by progress bars, run summaries and (later)
//! the metrics exporter. Updated once per batch, never per row.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use super::channel::QueueStats;

/// Counters of the source.
#[derive(Debug, Default)]
pub struct SourceMetrics {
    /// Files (objects) the source will read.
    pub files: AtomicU64,
    /// Row groups decoded.
    pub row_groups: AtomicU64,
    /// Rows decoded.
    pub rows: AtomicU64,
    /// Rows the source will produce in total (all epochs), when known.
    pub rows_expected: AtomicU64,
    /// Compressed bytes of the row groups decoded (column chunk sizes from the footers).
    pub bytes_read: AtomicU64,
    /// Bytes of Arrow memory produced.
    pub bytes_decoded: AtomicU64,
    /// Rows of the epochs read so far that the `shard` policy gives to no rank
    /// (`drop_last`: the largest shares cut to the smallest; `redistribute`: the remainder
    /// of a division by the world size). The same on every rank.
    pub shard_left_out: AtomicU64,
    /// Rows of the epochs read so far that `shard: pad` gives a second time (a shorter
    /// rank's own rows repeated up to the largest share), counted over all ranks.
    pub shard_repeated: AtomicU64,
    /// Rows a resumed run read again and passed over before its first stage that reorders
    /// rows: delivered before the checkpoint (the restart point is the start of a row group
    /// or of the shuffle window being emitted), not delivered again.
    pub rows_replayed: AtomicU64,
    /// Records that could not be decoded (Kafka).
    pub records_bad: AtomicU64,
    /// Of those, records written to the dead-letter sink. (Rows a stage dead-letters are
    /// its own: [`StageMetrics::rows_dead_lettered`]; the run's total is
    /// [`PipelineMetrics::records_dead_lettered`].)
    pub records_dead_lettered: AtomicU64,
    /// Nanoseconds of CPU-pool time the source's tasks took (Parquet decode, Kafka message
    /// decode), summed over the pool's threads: its share of the pool next to the stages'.
    pub busy_ns: Arc<AtomicU64>,
    /// Per Kafka partition (`topic/partition`): records, bad records, consumer lag.
    pub partitions: Mutex<std::collections::BTreeMap<String, PartitionMetrics>>,
    /// With `mix`: what each `path` entry gives an epoch (set when the plan is first made).
    pub mix: Mutex<Vec<MixShare>>,
}

/// One dataset of a `mix`: its rows, and how many of them each epoch takes.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MixShare {
    /// The `path` entry, as written.
    pub path: String,
    /// Rows of its files.
    pub rows: u64,
    /// Rows of it in every epoch (all ranks).
    pub per_epoch: u64,
}

/// Counters of one Kafka partition.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PartitionMetrics {
    /// Records consumed.
    pub records: u64,
    /// Records that could not be decoded.
    pub bad: u64,
    /// Messages between the consumer's position and the end of the partition, from
    /// librdkafka's statistics (each second); -1 when not known yet.
    pub lag: i64,
}

impl SourceMetrics {
    #[cfg_attr(not(feature = "kafka"), allow(dead_code))] // used by the Kafka source
    pub(crate) fn with_partition(
        &self,
        topic: &str,
        partition: i32,
        f: impl FnOnce(&mut PartitionMetrics),
    ) {
        if let Ok(mut m) = self.partitions.lock() {
            f(m.entry(format!("{topic}/{partition}"))
                .or_insert(PartitionMetrics {
                    lag: -1,
                    ..Default::default()
                }));
        }
    }

    /// What the `shard` policy did to the epochs read so far, in words, when it left rows
    /// out or repeated some (`None`: every row went to exactly one rank).
    pub fn shard_note(&self) -> Option<String> {
        let left_out = self.shard_left_out.load(Ordering::Relaxed);
        let repeated = self.shard_repeated.load(Ordering::Relaxed);
        match (left_out, repeated) {
            (0, 0) => None,
            (n, 0) => Some(format!(
                "{n} row(s) left out by `shard` so that every rank gets the same number (no rank read them; counted over all epochs read)"
            )),
            (_, n) => Some(format!(
                "{n} row(s) read twice by `shard: pad` so that every rank gets the same number (counted over all ranks and epochs read)"
            )),
        }
    }

    /// What a `mix` takes from each dataset every epoch, in words (`None` without one).
    pub fn mix_note(&self) -> Option<String> {
        let shares = self.mix.lock().ok()?.clone();
        let epoch: u64 = shares.iter().map(|s| s.per_epoch).sum();
        let parts: Vec<String> = shares
            .iter()
            .map(|s| {
                format!(
                    "`{}` {} of {} rows ({:.1} % of the epoch)",
                    s.path,
                    s.per_epoch,
                    s.rows,
                    100.0 * s.per_epoch as f64 / epoch.max(1) as f64
                )
            })
            .collect();
        (!shares.is_empty()).then(|| format!("mix of {epoch} rows per epoch: {}", parts.join(", ")))
    }

    /// A copy of the per-partition counters.
    pub fn partitions(&self) -> std::collections::BTreeMap<String, PartitionMetrics> {
        self.partitions
            .lock()
            .map(|m| m.clone())
            .unwrap_or_default()
    }
}

/// Counters of one stage.
#[derive(Debug)]
pub struct StageMetrics {
    /// `stages[i] (kind)`.
    pub name: String,
    /// Rows received.
    pub rows_in: AtomicU64,
    /// Rows emitted.
    pub rows_out: AtomicU64,
    /// Batches emitted.
    pub batches_out: AtomicU64,
    /// Nanoseconds of CPU work spent in this stage.
    pub busy_ns: AtomicU64,
    /// Rows removed by the pipeline's rules (filter predicate false, `drop_last` tail, a bad
    /// image under `on_error: skip`), counted, never lost.
    pub rows_removed: AtomicU64,
    /// Rows in that a resumed run had delivered before its checkpoint (a `shuffle`
    /// rebuilding the window it was emitting): taken in, not emitted again.
    pub rows_replayed: AtomicU64,
    /// How those rows are named in the summary (`filtered out`, …): each stage kind's
    /// `removed_as`.
    pub removed_as: &'static str,
    /// Human-readable notes produced while running (computed statistics, …).
    pub notes: Mutex<Vec<String>>,
    /// Every row this stage removes is written to its dead-letter files first (an `image`
    /// stage with `on_error: skip` and `dead_letter`).
    pub dead_letters: bool,
}

impl StageMetrics {
    pub(crate) fn new(name: String, removed_as: &'static str) -> Self {
        StageMetrics {
            name,
            removed_as,
            rows_in: AtomicU64::new(0),
            rows_out: AtomicU64::new(0),
            batches_out: AtomicU64::new(0),
            busy_ns: AtomicU64::new(0),
            rows_removed: AtomicU64::new(0),
            rows_replayed: AtomicU64::new(0),
            notes: Mutex::new(Vec::new()),
            dead_letters: false,
        }
    }

    /// Marks a stage whose removed rows all go to dead-letter files.
    pub(crate) fn with_dead_letters(mut self, dead_letters: bool) -> Self {
        self.dead_letters = dead_letters;
        self
    }

    /// Rows this stage wrote to its dead-letter files.
    pub fn rows_dead_lettered(&self) -> u64 {
        match self.dead_letters {
            true => self.rows_removed.load(Ordering::Relaxed),
            false => 0,
        }
    }

    pub(crate) fn note(&self, text: String) {
        if let Ok(mut n) = self.notes.lock() {
            n.push(text);
        }
    }
}

/// Everything counted for one pipeline run.
#[derive(Debug, Default)]
pub struct PipelineMetrics {
    /// The source.
    pub source: SourceMetrics,
    stages: Mutex<Vec<Arc<StageMetrics>>>,
    queues: Mutex<Vec<(String, Arc<QueueStats>)>>,
    /// Rows delivered to the consumer of the stream.
    pub rows_out: AtomicU64,
    /// Batches delivered to the consumer of the stream.
    pub batches_out: AtomicU64,
    /// Arrow bytes delivered to the consumer of the stream.
    pub bytes_out: AtomicU64,
    /// Threads of the CPU pool the stages (and tensor conversion, sink encoding) run on.
    pub pool_threads: AtomicU64,
    /// Nanoseconds the pool's threads spent running tasks (the source's, the stages', the
    /// shuffle's steps, tensor conversion, sink encoding), summed over the threads.
    pub pool_busy_ns: Arc<AtomicU64>,
}

impl PipelineMetrics {
    pub(crate) fn set_stages(&self, stages: Vec<Arc<StageMetrics>>) {
        if let Ok(mut s) = self.stages.lock() {
            *s = stages;
        }
    }

    pub(crate) fn add_queue(&self, name: String, q: Arc<QueueStats>) {
        if let Ok(mut s) = self.queues.lock() {
            s.push((name, q));
        }
    }

    /// Per-stage counters, in pipeline order.
    pub fn stages(&self) -> Vec<Arc<StageMetrics>> {
        self.stages.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Readiness of the stream's consumer: the share of batches that were already waiting
    /// in the last queue when the consumer (sink, trainer, your loop) asked for them.
    pub fn consumer_readiness(&self) -> Option<f64> {
        self.queues().last().and_then(|(_, q)| q.readiness())
    }

    /// Queues (name of the consumer side, counters), in pipeline order.
    pub fn queues(&self) -> Vec<(String, Arc<QueueStats>)> {
        self.queues.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Records and rows written to dead-letter files or topics in this run: the source's
    /// undecodable records and the rows stages removed into their dead letters (`image`
    /// with `on_error: skip`). What `records_dead_lettered` of a run summary says.
    pub fn records_dead_lettered(&self) -> u64 {
        let stages: u64 = self.stages().iter().map(|s| s.rows_dead_lettered()).sum();
        Self::get(&self.source.records_dead_lettered) + stages
    }

    /// Share of the CPU pool's time its threads spent running tasks, over `seconds` of wall
    /// time (`None` before the pool started): near 1, every element waits for CPU.
    pub fn pool_busy_fraction(&self, seconds: f64) -> Option<f64> {
        let threads = Self::get(&self.pool_threads) as f64;
        (threads > 0.0 && seconds > 0.0)
            .then(|| Self::get(&self.pool_busy_ns) as f64 / 1e9 / (threads * seconds))
    }

    /// Convenience: load a counter.
    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
}
