//! A job: one YAML file holding a pipeline and its sink, run to completion.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde::Serialize;
use sluice_pipeline::config::{ConfigDocument, Located};
use sluice_pipeline::{ConfigErrors, Pipeline, PipelineConfig, PipelineMetrics, PreparedPipeline};
use sluice_sinks::{SinkConfig, SinkContext, SinkReport};

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
}

/// A job file: pipeline sections plus `sink:`.
#[derive(Debug, Clone)]
pub struct Job {
    /// The pipeline.
    pub pipeline: PipelineConfig,
    /// Where batches go; `None` means the `null` sink.
    pub sink: Option<Located<SinkConfig>>,
    /// Directory relative paths resolve against.
    pub base_dir: PathBuf,
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
        match pipeline {
            Some(pipeline) if errors.is_empty() => Ok(Job {
                pipeline,
                sink,
                base_dir: doc.base_dir().to_path_buf(),
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
        let prepared = self.pipeline().prepare().await?;
        let sink_config = self
            .sink
            .as_ref()
            .map(|s| s.value.clone())
            .unwrap_or(SinkConfig::Null(Default::default()));
        Ok(PreparedJob {
            prepared,
            sink_config,
            base_dir: self.base_dir.clone(),
        })
    }
}

/// A job ready to run.
#[derive(Debug)]
pub struct PreparedJob {
    prepared: PreparedPipeline,
    sink_config: SinkConfig,
    base_dir: PathBuf,
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
    /// Rows removed on purpose (filter, drop_last).
    pub rows_removed: u64,
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
}

impl PreparedJob {
    /// Live counters, for progress display.
    pub fn metrics(&self) -> Arc<PipelineMetrics> {
        self.prepared.metrics()
    }

    /// Rows the source will read, when known before the run (large listings complete while
    /// reading).
    pub fn source_rows(&self) -> Option<u64> {
        self.prepared.source_rows()
    }

    /// Runs to completion, or until `interrupt` resolves (then the sink is aborted and
    /// [`JobError::Interrupted`] returned). On any error the sink's partial output is removed.
    pub async fn run(self, interrupt: impl Future<Output = ()>) -> Result<RunReport, JobError> {
        let started = Instant::now();
        let metrics = self.prepared.metrics();
        let cx = SinkContext {
            schema: self.prepared.schema().clone(),
            base_dir: self.base_dir.clone(),
            pool: self.prepared.pool().clone(),
        };
        let kind = self.sink_config.kind();
        let mut sink = self.sink_config.build(&cx).await?;
        let acker = self.prepared.acknowledger();
        let mut stream = self.prepared.stream();
        tokio::pin!(interrupt);
        let mut last_commit = Instant::now();
        loop {
            tokio::select! {
                biased;
                _ = &mut interrupt => {
                    drop(stream);
                    sink.abort().await;
                    return Err(JobError::Interrupted);
                }
                item = stream.next() => match item {
                    Some(Ok(batch)) => {
                        if let Err(e) = sink.write(&batch).await {
                            drop(stream);
                            sink.abort().await;
                            return Err(e.into());
                        }
                        acker.observe(&batch.lineage);
                        if last_commit.elapsed() >= COMMIT_INTERVAL {
                            last_commit = Instant::now();
                            match sink.flush().await {
                                Ok(true) => {
                                    acker.commit(false);
                                }
                                Ok(false) => {}
                                Err(e) => {
                                    drop(stream);
                                    sink.abort().await;
                                    return Err(e.into());
                                }
                            }
                        }
                    }
                    Some(Err(e)) => {
                        drop(stream);
                        sink.abort().await;
                        return Err(e.into());
                    }
                    None => break,
                }
            }
        }
        let report = sink.finish().await?;
        acker.commit(true);
        Ok(build_report(&metrics, report, kind, started.elapsed()))
    }
}

/// How often positions are acknowledged (sink flushed, offsets stored) while running.
const COMMIT_INTERVAL: Duration = Duration::from_secs(1);

fn build_report(m: &PipelineMetrics, sink: SinkReport, kind: &str, elapsed: Duration) -> RunReport {
    let g = PipelineMetrics::get;
    let secs = elapsed.as_secs_f64().max(1e-9);
    let stages = m
        .stages()
        .iter()
        .map(|s| StageReport {
            name: s.name.clone(),
            rows_in: g(&s.rows_in),
            rows_out: g(&s.rows_out),
            rows_removed: g(&s.rows_removed),
            busy_seconds: g(&s.busy_ns) as f64 / 1e9,
            notes: s.notes.lock().map(|n| n.clone()).unwrap_or_default(),
        })
        .collect();
    RunReport {
        elapsed_seconds: secs,
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
        records_bad: g(&m.source.records_bad),
        records_dead_lettered: g(&m.source.records_dead_lettered),
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
    }
}
