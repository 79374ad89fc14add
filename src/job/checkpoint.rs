//! The checkpoint: its `checkpoint:` config, the file a run records how far it got in, and
//! reading that file back when a run starts (`--resume`).

use std::time::Duration;

use serde::Deserialize;
use sluice_pipeline::checkpoint::{CheckpointFile, CheckpointFileError, Pending};
use sluice_pipeline::config::HumanDuration;
use sluice_pipeline::storage::{StorageConfig, resolve};
use sluice_pipeline::{Acknowledger, SourceState};
use sluice_sinks::{Sink, SinkConfig};

use super::{Job, JobError, Resumed};

/// `checkpoint:` — where and how often a run records how far it got, so that `sluice run
/// --resume` continues exactly there (static Kafka sources: every record exactly once in the
/// union of the outputs).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointConfig {
    /// The checkpoint file: path or URL, written atomically (relative paths resolve against
    /// the config file's directory).
    pub path: String,
    /// How often the sink is flushed and the checkpoint written. Default: 5s.
    #[serde(default = "default_checkpoint_interval")]
    pub interval: HumanDuration,
    /// Also checkpoint after every this many batches written (in addition to `interval`).
    #[serde(default)]
    pub every_batches: Option<u64>,
    /// Object-store options for `path`.
    #[serde(default)]
    pub storage: StorageConfig,
}

fn default_checkpoint_interval() -> HumanDuration {
    HumanDuration(Duration::from_secs(5))
}

/// What a checkpoint file holds.
#[derive(Debug, Clone, PartialEq, serde::Serialize, Deserialize)]
pub struct Checkpoint {
    /// Format version (1).
    pub version: u32,
    /// Source positions covered by durable output.
    pub source: SourceState,
    /// Sink state (part-file numbering).
    #[serde(default)]
    pub sink: Option<serde_json::Value>,
    /// Rows the sink had written, in all runs up to this checkpoint.
    pub rows_written: u64,
    /// Whether the run that wrote it finished (a bounded source reached its end).
    pub complete: bool,
}

pub(super) struct CheckpointWriter {
    pub(super) file: CheckpointFile,
    pub(super) interval: Duration,
    pub(super) every_batches: Option<u64>,
    pub(super) rows_before: u64,
}

impl CheckpointWriter {
    pub(super) async fn write(&self, cp: &Checkpoint) -> Result<(), JobError> {
        let body = serde_json::to_vec_pretty(cp).map_err(|e| JobError::Checkpoint {
            url: self.file.url(),
            message: e.to_string(),
        })?;
        Ok(self.file.write(body).await?)
    }
}

impl std::fmt::Debug for CheckpointWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CheckpointWriter({})", self.file.url())
    }
}

/// What [`Job::open_checkpoint`] found: the writer for this run and, when an earlier run
/// left a checkpoint to continue from, where the source and the sink go on.
pub(super) struct OpenedCheckpoint {
    /// Writes this run's checkpoints.
    pub(super) writer: CheckpointWriter,
    /// Set when the run continues from a checkpoint.
    pub(super) resumed: Option<Resumed>,
    /// The source position to resume from (`None`: from the beginning, or nothing to do).
    pub(super) resume_from: Option<SourceState>,
    /// The sink's recorded state, to resume it.
    pub(super) sink_resume: Option<serde_json::Value>,
}

impl Job {
    /// Checks that a checkpoint can cover the sink's output, reads what an earlier run
    /// recorded there (an error without `resume`) and makes the writer for this run.
    pub(super) async fn open_checkpoint(
        &self,
        c: &CheckpointConfig,
        sink_config: &SinkConfig,
        resume: bool,
    ) -> Result<OpenedCheckpoint, JobError> {
        let mut resume_from = None;
        let mut sink_resume = None;
        let mut resumed = None;
        if !sink_config.flushes_while_running() {
            let at = self
                .sink
                .as_ref()
                .map(|s| s.location.clone())
                .unwrap_or_default();
            return Err(JobError::Checkpoint {
                url: c.path.clone(),
                message: format!(
                    "the `{}` sink (at {at}) makes its output visible only at the end, so no checkpoint could cover it; use `max_rows_per_file` (parquet part files), or a `kafka` or `null` sink",
                    sink_config.kind()
                ),
            });
        }
        let location = resolve(&c.path, &self.base_dir, &c.storage)?;
        sluice_sinks::guard::check_replaceable(&location)?;
        let url = location.url.to_string();
        let file = CheckpointFile::new(location);
        let mut rows_before = 0;
        if let Some(bytes) = file
            .read_at_start(resume, "starting from the beginning")
            .await?
        {
            let cp: Checkpoint =
                serde_json::from_slice(&bytes).map_err(|e| JobError::Checkpoint {
                    url: url.clone(),
                    message: format!("is not a Sluice checkpoint ({e}); delete it to start over"),
                })?;
            let already_complete = cp.complete && self.nothing_after(&cp.source);
            resumed = Some(Resumed {
                checkpoint: url.clone(),
                rows_before: cp.rows_written,
                rows_reread: 0,
                already_complete,
            });
            rows_before = cp.rows_written;
            if already_complete {
                tracing::info!(%url, rows = cp.rows_written, "the checkpoint records a finished run");
            } else {
                tracing::info!(%url, rows = cp.rows_written, "resuming from checkpoint");
                resume_from = Some(cp.source.clone());
                sink_resume = cp.sink.clone();
            }
        }
        Ok(OpenedCheckpoint {
            writer: CheckpointWriter {
                file,
                interval: c.interval.0,
                every_batches: c.every_batches,
                rows_before,
            },
            resumed,
            resume_from,
            sink_resume,
        })
    }
}

/// The checkpoint protocol (`sluice_pipeline::checkpoint`): makes what was written durable,
/// records it in the checkpoint, then lets source offsets advance (in that order: a Kafka
/// offset is stored only once a checkpoint covers it).
pub(super) async fn commit(
    sink: &mut dyn Sink,
    acker: &Acknowledger,
    checkpoint: Option<&CheckpointWriter>,
    rows: u64,
    final_commit: bool,
) -> Result<(), JobError> {
    if !sink.flush().await? {
        return Ok(());
    }
    let pending = Pending::observed(acker);
    if let Some(cp) = checkpoint {
        cp.write(&Checkpoint {
            version: 1,
            source: pending.state().clone(),
            sink: sink.state(),
            rows_written: cp.rows_before + rows,
            complete: false,
        })
        .await?;
    }
    pending.acknowledge(final_commit);
    Ok(())
}

impl From<CheckpointFileError> for JobError {
    fn from(e: CheckpointFileError) -> JobError {
        JobError::Checkpoint {
            url: e.url,
            message: e.message,
        }
    }
}
