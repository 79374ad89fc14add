//! A job: one YAML file holding a pipeline and its sink, run to completion.

mod checkpoint;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde::Serialize;
use sluice_pipeline::config::{ConfigDocument, Located};
use sluice_pipeline::sources::SourceConfig;
use sluice_pipeline::{
    Acknowledger, ConfigErrors, Pipeline, PipelineConfig, PipelineMetrics, PreparedPipeline,
    SourceState,
};
use sluice_sinks::{Sink, SinkConfig, SinkContext, SinkReport};

pub use checkpoint::{Checkpoint, CheckpointConfig};
use checkpoint::{CheckpointWriter, commit};
use sluice_pipeline::checkpoint::Pending;

/// Why a job failed.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// Config, source or stage error.
    #[error(transparent)]
    Pipeline(#[from] sluice_pipeline::Error),
    /// Sink error.
    #[error(transparent)]
    Sink(#[from] sluice_sinks::Error),
    /// Ctrl-C / SIGTERM: the run stopped cleanly and left no partial output.
    #[error("interrupted; no partial output was left behind")]
    Interrupted,
    /// Ctrl-C / SIGTERM with a checkpoint: completed output and the checkpoint stay.
    #[error(
        "interrupted; checkpoint {0} covers the output written so far: run again with --resume to continue"
    )]
    InterruptedAtCheckpoint(String),
    /// Reading or writing the checkpoint failed, or it does not fit this job.
    #[error("checkpoint {url}: {message}")]
    Checkpoint { url: String, message: String },
    /// `--resume` for a config without `checkpoint:`.
    #[error(
        "--resume: this config has no `checkpoint:` section, so no run of it recorded where it got to; add one (see docs/config.md#checkpoint) or run without --resume"
    )]
    NothingToResume,
}

/// A job file: pipeline sections plus `sink:`.
#[derive(Debug, Clone)]
pub struct Job {
    /// The pipeline.
    pub pipeline: PipelineConfig,
    /// Where batches go; `None` means the `null` sink.
    pub sink: Option<Located<SinkConfig>>,
    /// Checkpointing, when configured.
    pub checkpoint: Option<CheckpointConfig>,
    /// Directory relative paths resolve against.
    pub base_dir: PathBuf,
    /// The tensor loader (`loader:`), for training and custom loops.
    #[cfg(feature = "torch")]
    pub loader: Option<sluice_loader::LoaderConfig>,
}

impl Job {
    /// Loads a job file, reporting every config problem at once.
    pub fn from_path(path: impl AsRef<Path>) -> Result<Self, JobError> {
        let doc = ConfigDocument::from_path(path)?;
        Self::from_document(&doc)
    }

    /// Reads a job from a loaded document.
    pub fn from_document(doc: &ConfigDocument) -> Result<Self, JobError> {
        let mut errors = Vec::new();
        let pipeline = PipelineConfig::from_document(doc, &mut errors);
        let sink = doc.component::<SinkConfig>("sink", &mut errors);
        let checkpoint = doc.value::<CheckpointConfig>("checkpoint", &mut errors);
        #[cfg(feature = "torch")]
        let loader = doc.value::<sluice_loader::LoaderConfig>("loader", &mut errors);
        match pipeline {
            Some(pipeline) if errors.is_empty() => Ok(Job {
                pipeline,
                sink,
                checkpoint,
                base_dir: doc.base_dir().to_path_buf(),
                #[cfg(feature = "torch")]
                loader,
            }),
            _ => Err(sluice_pipeline::Error::Config(ConfigErrors::sorted(errors)).into()),
        }
    }

    /// The pipeline part.
    pub fn pipeline(&self) -> Pipeline {
        Pipeline::from_config(self.pipeline.clone(), self.base_dir.clone())
    }

    /// Opens the source, builds stages (computing statistics where needed) and starts the sink.
    pub async fn prepare(&self) -> Result<PreparedJob, JobError> {
        self.prepare_resuming(false).await
    }

    /// As [`Job::prepare`]; with `resume`, continues from the checkpoint if there is one.
    /// Without it, an existing checkpoint is an error (so a finished or crashed run is never
    /// silently redone or continued).
    pub async fn prepare_resuming(&self, resume: bool) -> Result<PreparedJob, JobError> {
        let sink_config = self
            .sink
            .as_ref()
            .map(|s| s.value.clone())
            .unwrap_or(SinkConfig::Null(Default::default()));
        let mut pipeline = self.pipeline();
        let mut checkpoint = None;
        let mut sink_resume = None;
        let mut resumed = None;
        if resume && self.checkpoint.is_none() {
            return Err(JobError::NothingToResume);
        }
        // Before anything is read, listed by the source or deleted by the sink.
        sluice_sinks::guard::check_overlap(
            &sink_config,
            &self.pipeline.source.value,
            &self.base_dir,
        )
        .await?;
        if let Some(c) = &self.checkpoint {
            let opened = self.open_checkpoint(c, &sink_config, resume).await?;
            if let Some(source) = opened.resume_from {
                pipeline = pipeline.resume_from(source);
            }
            sink_resume = opened.sink_resume;
            resumed = opened.resumed;
            checkpoint = Some(opened.writer);
        }
        // A finished run with nothing more to do opens nothing: no footers, no statistics
        // pass for a `standardize` stage.
        if resumed.as_ref().is_some_and(|r| r.already_complete) {
            return Ok(PreparedJob {
                prepared: None,
                metrics: Arc::default(),
                sink_config,
                base_dir: self.base_dir.clone(),
                checkpoint,
                sink_resume,
                resumed,
            });
        }
        let prepared = match pipeline.prepare().await {
            Err(sluice_pipeline::Error::Resume(message)) if checkpoint.is_some() => {
                let url = checkpoint
                    .as_ref()
                    .map(|c| c.file.url())
                    .unwrap_or_default();
                return Err(JobError::Checkpoint {
                    url,
                    message: format!(
                        "cannot resume from it: {message}: to start over, delete this checkpoint and the output written so far"
                    ),
                });
            }
            r => r?,
        };
        Ok(PreparedJob {
            metrics: prepared.metrics(),
            prepared: Some(prepared),
            sink_config,
            base_dir: self.base_dir.clone(),
            checkpoint,
            sink_resume,
            resumed,
        })
    }

    /// Whether a finished run that stopped at `state` left nothing for this config to do:
    /// a Parquet source whose last epoch was its config's last (a config asking for more
    /// epochs goes on with them, from where an uninterrupted longer run would be). A Kafka
    /// stream always goes on: its next records are new.
    fn nothing_after(&self, state: &SourceState) -> bool {
        match &self.pipeline.source.value {
            // The epochs it went through: up to the mark's, or the one before when the mark
            // is the start of the next.
            SourceConfig::Parquet(_) => state.parquet.is_none_or(|m| {
                let through = if m.is_epoch_start() {
                    m.epoch
                } else {
                    m.epoch + 1
                };
                through >= self.pipeline.source.value.epochs()
            }),
            SourceConfig::Kafka(_) => false,
        }
    }
}

/// A run that continued from a checkpoint.
#[derive(Debug, Clone, Serialize)]
pub struct Resumed {
    /// The checkpoint's URL.
    pub checkpoint: String,
    /// Rows the runs before this one wrote.
    pub rows_before: u64,
    /// Rows read again to rebuild the position (the rest of a row group, a shuffle window):
    /// delivered before the checkpoint and not delivered again.
    pub rows_reread: u64,
    /// The checkpoint recorded a finished run and the config asks for nothing more: nothing
    /// was read or written.
    pub already_complete: bool,
}

/// A job ready to run.
#[derive(Debug)]
pub struct PreparedJob {
    /// `None` when the checkpoint records a finished run with nothing more to do.
    prepared: Option<PreparedPipeline>,
    metrics: Arc<PipelineMetrics>,
    sink_config: SinkConfig,
    base_dir: PathBuf,
    checkpoint: Option<CheckpointWriter>,
    sink_resume: Option<serde_json::Value>,
    resumed: Option<Resumed>,
}

/// Per-stage numbers of a finished run.
#[derive(Debug, Clone, Serialize)]
pub struct StageReport {
    /// `stages[i] (kind) at file:line:col`.
    pub name: String,
    /// Rows in.
    pub rows_in: u64,
    /// Rows out.
    pub rows_out: u64,
    /// Rows removed by the pipeline's rules (filter, drop_last, bad images skipped).
    pub rows_removed: u64,
    /// Rows in that a resumed run had delivered before its checkpoint (a shuffle rebuilding
    /// the window it was emitting): taken in, not emitted again.
    pub rows_replayed: u64,
    /// What those rows were: `filtered out`, `dropped by drop_last`, `bad images skipped
    /// (on_error: skip)`.
    pub removed_as: &'static str,
    /// CPU seconds spent.
    pub busy_seconds: f64,
    /// Notes (computed statistics, dropped tails).
    pub notes: Vec<String>,
}

/// One Kafka partition's numbers.
#[derive(Debug, Clone, Serialize)]
pub struct PartitionReport {
    /// Records consumed.
    pub records: u64,
    /// Records that could not be decoded.
    pub bad: u64,
    /// Consumer lag at the last statistics report (-1: unknown).
    pub lag: i64,
    /// Records per second over the run.
    pub records_per_second: f64,
}

/// What a finished run did.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    /// Wall-clock seconds.
    pub elapsed_seconds: f64,
    /// Files read.
    pub files: u64,
    /// Row groups decoded.
    pub row_groups: u64,
    /// Rows read from the source.
    pub rows_read: u64,
    /// Compressed bytes of the column chunks read.
    pub bytes_read: u64,
    /// Arrow bytes decoded by the source.
    pub bytes_decoded: u64,
    /// Each stage.
    pub stages: Vec<StageReport>,
    /// Rows written by the sink.
    pub rows_written: u64,
    /// Batches written by the sink.
    pub batches_written: u64,
    /// Bytes written by the sink.
    pub bytes_written: u64,
    /// Sink type.
    pub sink: String,
    /// Output location.
    pub output: Option<String>,
    /// Rows the `shard` policy gave to no rank, and rows `shard: pad` gave twice (all ranks,
    /// every epoch read).
    pub shard_left_out: u64,
    /// See `shard_left_out`.
    pub shard_repeated: u64,
    /// The two in words, when either is not zero.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<String>,
    /// With `mix`: each dataset's rows and the rows of it every epoch takes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mix: Vec<sluice_pipeline::exec::metrics::MixShare>,
    /// Records that could not be decoded (Kafka).
    pub records_bad: u64,
    /// Of those, records written to the dead-letter sink.
    pub records_dead_lettered: u64,
    /// Per Kafka partition (`topic/partition`).
    pub partitions: std::collections::BTreeMap<String, PartitionReport>,
    /// Rows read per second.
    pub rows_per_second: f64,
    /// Decoded MB (10^6 bytes) per second.
    pub mb_per_second: f64,
    /// The process's peak resident memory so far, in bytes (Linux: `VmHWM`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_rss_bytes: Option<u64>,
    /// CPU seconds (user + system, every thread) the process used: the pipeline and the sink.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_seconds: Option<f64>,
    /// `cpu_seconds` over the process's wall time × the host's cores: the share of the host's CPU
    /// the data loading took (SPDL keeps a loader at ≤ 0.4 so a trainer's kernel launches are
    /// not starved).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_cpu_share: Option<f64>,
    /// Share of the CPU pool's time (threads × the run's wall time) its threads ran tasks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_busy_fraction: Option<f64>,
    /// Share of the batches the sink found already waiting when it asked for the next one
    /// (the last queue's readiness; ≥ 0.99: the pipeline is ahead of the sink).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consumer_readiness: Option<f64>,
    /// Each queue's readiness, in pipeline order: where the chain first runs dry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub queue_readiness: Vec<QueueReadiness>,
    /// Set when the run continued from a checkpoint (`--resume`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed: Option<Resumed>,
}

/// One queue's readiness (see [`RunReport::queue_readiness`]).
#[derive(Debug, Clone, Serialize)]
pub struct QueueReadiness {
    /// The element that fills it (`source`, a stage).
    pub queue: String,
    /// Batches the element after it found already waiting, over the batches it took.
    pub ready: f64,
}

/// This process's peak resident memory in bytes, as the kernel counts it for its address
/// space (`VmHWM` in `/proc/self/status`; `None` where there is none). Unlike a parent's
/// `wait4` figure, it does not start at the RSS of the process that spawned it.
pub fn peak_rss_bytes() -> Option<u64> {
    status_bytes("VmHWM:")
}

/// This process's resident memory now, in bytes (`VmRSS` in `/proc/self/status`).
pub fn rss_bytes() -> Option<u64> {
    status_bytes("VmRSS:")
}

/// Resident bytes of this process's mappings of the files whose path `of` accepts: the `Rss`
/// lines of `/proc/self/smaps` summed (`None` where there is none). For a library, its code
/// and data pages mapped in, shared with other processes or not.
pub fn mapped_rss_bytes(of: impl Fn(&str) -> bool) -> Option<u64> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let mut counted = false;
    let mut kib = 0u64;
    for line in smaps.lines() {
        let mut words = line.split_whitespace();
        let first = words.next().unwrap_or_default();
        if first == "Rss:" {
            if counted {
                kib += words
                    .next()
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        } else if !first.ends_with(':') {
            // A mapping's header: `start-end perms offset dev inode [path]` (a path may hold
            // spaces; an anonymous mapping has none).
            let path = words.skip(4).collect::<Vec<_>>().join(" ");
            counted = !path.is_empty() && of(&path);
        }
    }
    Some(kib * 1024)
}

/// A size field of `/proc/self/status` (given in kB), in bytes.
fn status_bytes(field: &str) -> Option<u64> {
    std::fs::read_to_string("/proc/self/status")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kib| kib * 1024)
}

/// Bytes in MiB, for reports.
pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

impl PreparedJob {
    /// Live counters, for progress display.
    pub fn metrics(&self) -> Arc<PipelineMetrics> {
        self.metrics.clone()
    }

    /// Rows the source will read, when known before the run (large listings complete while
    /// reading; a resumed run's, from its restart point, once its first epoch is planned:
    /// `source.rows_expected`).
    pub fn source_rows(&self) -> Option<u64> {
        match (&self.resumed, &self.prepared) {
            (None, Some(p)) => p.source_rows(),
            _ => None,
        }
    }

    /// Runs to completion, or until `interrupt` resolves (then the sink is aborted and
    /// [`JobError::Interrupted`] returned). On any error the sink's partial output is removed.
    /// With a checkpoint, the sink is flushed and the checkpoint written every interval and on
    /// interrupt; completed part files stay.
    pub async fn run(self, interrupt: impl Future<Output = ()>) -> Result<RunReport, JobError> {
        let started = Instant::now();
        let metrics = self.metrics.clone();
        let Some(prepared) = self.prepared else {
            // Already complete: nothing to read, and the output stays as the run left it.
            let mut report = build_report(
                &metrics,
                SinkReport::default(),
                self.sink_config.kind(),
                started.elapsed(),
            );
            report.resumed = self.resumed;
            return Ok(report);
        };
        let cx = SinkContext {
            schema: prepared.schema().clone(),
            base_dir: self.base_dir.clone(),
            pool: prepared.pool().clone(),
            resume: self.sink_resume.clone(),
        };
        let kind = self.sink_config.kind();
        let mut sink = self.sink_config.build(&cx).await?;
        let acker = prepared.acknowledger();
        let checkpoint = self.checkpoint;
        let mut stream = prepared.stream();
        tokio::pin!(interrupt);
        let every = checkpoint
            .as_ref()
            .map(|c| c.interval)
            .unwrap_or(COMMIT_INTERVAL);
        let mut next_commit = tokio::time::Instant::now() + every;
        let mut rows = 0u64;
        let mut uncommitted = false;
        let every_batches = checkpoint
            .as_ref()
            .and_then(|c| c.every_batches)
            .filter(|n| *n > 0);
        let mut batches_since = 0u64;
        loop {
            let step = tokio::select! {
                biased;
                _ = &mut interrupt => Step::Interrupted,
                // Also when no batch comes: an idle stream still gets its last rows committed.
                _ = tokio::time::sleep_until(next_commit) => Step::Commit,
                item = stream.next() => match item {
                    Some(Ok(batch)) => match write_rows(&mut *sink, &batch).await {
                        Ok(()) => {
                            rows += batch.num_rows() as u64;
                            acker.observe_batch(&batch);
                            uncommitted = true;
                            batches_since += 1;
                            if every_batches.is_some_and(|n| batches_since >= n) {
                                Step::Commit
                            } else {
                                Step::Wrote
                            }
                        }
                        Err(e) => Step::Failed(e.into()),
                    },
                    Some(Err(e)) => Step::Failed(e.into()),
                    None => Step::End,
                }
            };
            match step {
                Step::Wrote => {}
                Step::Commit => {
                    next_commit = tokio::time::Instant::now() + every;
                    batches_since = 0;
                    if uncommitted {
                        uncommitted = false;
                        if let Err(e) =
                            commit(&mut *sink, &acker, checkpoint.as_ref(), rows, false).await
                        {
                            drop(stream);
                            sink.abort().await;
                            return Err(e);
                        }
                    }
                }
                Step::End => break,
                Step::Interrupted => {
                    drop(stream);
                    return Err(stop_interrupted(sink, &acker, checkpoint.as_ref(), rows).await);
                }
                Step::Failed(e) => {
                    drop(stream);
                    sink.abort().await;
                    return Err(e);
                }
            }
        }
        let report = finish_sink(sink, &acker, checkpoint.as_ref(), rows).await?;
        let mut report = build_report(&metrics, report, kind, started.elapsed());
        report.resumed = self.resumed.map(|r| Resumed {
            rows_reread: PipelineMetrics::get(&metrics.source.rows_replayed)
                + report.stages.iter().map(|s| s.rows_replayed).sum::<u64>(),
            ..r
        });
        warn_if_all_removed(&report);
        Ok(report)
    }
}

enum Step {
    Wrote,
    Commit,
    End,
    Interrupted,
    Failed(JobError),
}

/// Writes `batch` unless it is empty (under several ranks an emptied batch still comes, to
/// keep the ranks in step: nothing to write, but its position counts).
async fn write_rows(
    sink: &mut dyn Sink,
    batch: &sluice_pipeline::Batch,
) -> sluice_sinks::Result<()> {
    match batch.num_rows() {
        0 => Ok(()),
        _ => sink.write(batch).await,
    }
}

/// On interrupt: with a checkpoint, keeps what is complete (flushes it and records it in the
/// checkpoint); aborts the sink either way, and returns the error the run ends with.
async fn stop_interrupted(
    mut sink: Box<dyn Sink>,
    acker: &Acknowledger,
    checkpoint: Option<&CheckpointWriter>,
    rows: u64,
) -> JobError {
    if let Some(cp) = checkpoint {
        // Keep what is complete: flush, record it, then stop.
        let saved = commit(&mut *sink, acker, Some(cp), rows, false).await;
        sink.abort().await;
        if let Err(e) = saved {
            return e;
        }
        return JobError::InterruptedAtCheckpoint(cp.file.url());
    }
    sink.abort().await;
    JobError::Interrupted
}

/// After the stream's end: flushes and finishes the sink, writes the final (complete)
/// checkpoint and lets the source positions advance; returns the sink's report.
async fn finish_sink(
    mut sink: Box<dyn Sink>,
    acker: &Acknowledger,
    checkpoint: Option<&CheckpointWriter>,
    rows: u64,
) -> Result<SinkReport, JobError> {
    // The state after the last part is complete: a finished run's checkpoint must
    // number the next part past it (a run resumed with more epochs writes from there).
    if let Err(e) = sink.flush().await {
        sink.abort().await;
        return Err(e.into());
    }
    let state = sink.state();
    let report = sink.finish().await?;
    let pending = Pending::observed(acker);
    if let Some(cp) = checkpoint {
        cp.write(&Checkpoint {
            version: 1,
            source: pending.state().clone(),
            sink: state,
            rows_written: cp.rows_before + rows,
            complete: true,
        })
        .await?;
    }
    pending.acknowledge(true);
    Ok(report)
}

/// Warns when rows were read but none reached the sink because a stage removed them.
fn warn_if_all_removed(report: &RunReport) {
    let reread = report.resumed.as_ref().map_or(0, |r| r.rows_reread);
    if report.rows_written == 0
        && report.rows_read > reread
        && let Some(s) = report.stages.iter().max_by_key(|s| s.rows_removed)
        && s.rows_removed > 0
    {
        // Counted, so not lost; but an empty output is rarely what was meant.
        tracing::warn!(
            "no row reached the sink: the {} rows read were removed, {} of them {} by {}",
            report.rows_read - reread,
            s.rows_removed,
            s.removed_as,
            s.name
        );
    }
}

/// How often positions are acknowledged (sink flushed, offsets stored) while running.
const COMMIT_INTERVAL: Duration = Duration::from_secs(1);

fn build_report(m: &PipelineMetrics, sink: SinkReport, kind: &str, elapsed: Duration) -> RunReport {
    let g = PipelineMetrics::get;
    let secs = elapsed.as_secs_f64().max(1e-9);
    let cpu = sluice_pipeline::runtime::process_cpu_seconds();
    let stages = m
        .stages()
        .iter()
        .map(|s| StageReport {
            name: s.name.clone(),
            rows_in: g(&s.rows_in),
            rows_out: g(&s.rows_out),
            rows_removed: g(&s.rows_removed),
            rows_replayed: g(&s.rows_replayed),
            removed_as: s.removed_as,
            busy_seconds: g(&s.busy_ns) as f64 / 1e9,
            notes: s.notes.lock().map(|n| n.clone()).unwrap_or_default(),
        })
        .collect();
    RunReport {
        elapsed_seconds: secs,
        peak_rss_bytes: peak_rss_bytes(),
        files: g(&m.source.files),
        row_groups: g(&m.source.row_groups),
        rows_read: g(&m.source.rows),
        bytes_read: g(&m.source.bytes_read),
        bytes_decoded: g(&m.source.bytes_decoded),
        stages,
        rows_written: sink.rows,
        batches_written: sink.batches,
        bytes_written: sink.bytes,
        sink: kind.to_string(),
        output: sink.location,
        shard_left_out: g(&m.source.shard_left_out),
        shard_repeated: g(&m.source.shard_repeated),
        shard: m.source.shard_note(),
        mix: m.source.mix.lock().map(|m| m.clone()).unwrap_or_default(),
        records_bad: g(&m.source.records_bad),
        records_dead_lettered: m.records_dead_lettered(),
        partitions: m
            .source
            .partitions()
            .into_iter()
            .map(|(k, p)| {
                (
                    k,
                    PartitionReport {
                        records: p.records,
                        bad: p.bad,
                        lag: p.lag,
                        records_per_second: p.records as f64 / secs,
                    },
                )
            })
            .collect(),
        rows_per_second: g(&m.source.rows) as f64 / secs,
        mb_per_second: g(&m.source.bytes_decoded) as f64 / 1e6 / secs,
        cpu_seconds: cpu,
        pool_busy_fraction: m.pool_busy_fraction(secs),
        // Over the process's life, as its CPU time counts: over the run's wall time alone, the
        // setup before it (libtorch's loading, a `standardize` pass) made short runs read
        // "1514% of the host's 2 cores".
        host_cpu_share: cpu
            .zip(sluice_pipeline::runtime::process_wall_seconds())
            .map(|(cpu, wall)| {
                let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
                cpu / (wall.max(secs) * cores as f64)
            }),
        consumer_readiness: m.consumer_readiness(),
        queue_readiness: m
            .queues()
            .iter()
            .filter_map(|(name, q)| {
                q.readiness().map(|ready| QueueReadiness {
                    queue: name.clone(),
                    ready,
                })
            })
            .collect(),
        resumed: None,
    }
}
