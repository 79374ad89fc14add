//! What a training run is given and what it reports: the job (pipeline, loader, trainer
//! sections), how to run it (resume, stop flag, callbacks), and the report. Plain data every
//! other module of the trainer reads; it imports none of them but the config.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use serde::Serialize;
use sluice_loader::LoaderConfig;
use sluice_pipeline::config::ConfigDocument;
use sluice_pipeline::stages::StageConfig;
use sluice_pipeline::{ConfigErrors, PipelineConfig};

use crate::TrainError;
use crate::config::TrainerConfig;
pub use crate::metrics::EvalReport;
use crate::metrics::{ReduceCost, TrainingMetrics};

/// A training job: the pipeline plus `loader:` and `trainer:`.
#[derive(Debug, Clone)]
pub struct TrainJob {
    /// The training data.
    pub pipeline: PipelineConfig,
    /// Batches → tensors.
    pub loader: LoaderConfig,
    /// The model and how to train it.
    pub trainer: TrainerConfig,
    /// Directory relative paths resolve against.
    pub base_dir: PathBuf,
}

impl TrainJob {
    /// Loads a job file, reporting every config problem at once (file:line:column).
    pub fn from_path(path: impl AsRef<Path>) -> Result<Self, TrainError> {
        let doc = ConfigDocument::from_path(path)?;
        Self::from_document(&doc)
    }

    /// Reads a job from a loaded document.
    pub fn from_document(doc: &ConfigDocument) -> Result<Self, TrainError> {
        let mut errors = Vec::new();
        let pipeline = PipelineConfig::from_document(doc, &mut errors);
        let loader = doc.value::<LoaderConfig>("loader", &mut errors);
        let trainer = doc.value::<TrainerConfig>("trainer", &mut errors);
        if !errors.is_empty() {
            return Err(sluice_pipeline::Error::Config(ConfigErrors::sorted(errors)).into());
        }
        let (Some(pipeline), Some(loader), Some(trainer)) = (pipeline, loader, trainer) else {
            let present = doc.sections(&["source", "loader", "trainer"], &mut Vec::new());
            let absent = |s: &&str| !present.iter().any(|p| p == s);
            let named = ["source", "loader", "trainer"];
            // A section present but empty reads as absent too: then all three are named.
            let missing: Vec<&str> = named
                .into_iter()
                .filter(|s| absent(s) || named.iter().all(|n| !absent(n)))
                .map(|s| match s {
                    "source" => "`source:` (where rows come from)",
                    "loader" => "`loader:` (which columns become which tensors)",
                    _ => "`trainer:` (model, optimizer)",
                })
                .collect();
            return Err(TrainError::Config(format!(
                "{}: `sluice train` needs {} section{}; see docs/config.md",
                doc.origin(),
                missing.join(" and "),
                if missing.len() == 1 { "" } else { "s" }
            )));
        };
        let job = TrainJob {
            pipeline,
            loader,
            trainer,
            base_dir: doc.base_dir().to_path_buf(),
        };
        job.check()?;
        Ok(job)
    }

    /// Checks what can be checked without data.
    pub fn check(&self) -> Result<(), TrainError> {
        let t = &self.trainer;
        for name in [&t.input, &t.target] {
            if !self.loader.tensors.contains_key(name) {
                return Err(TrainError::Config(format!(
                    "trainer: tensor `{name}` is not in `loader.tensors` (it has: {}); set `trainer.input`/`trainer.target` or add it",
                    self.loader
                        .tensors
                        .keys()
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
        }
        // Also when `--workers` set it, past the YAML's own checks.
        if let Some(l) = sluice_pipeline::config::limits::lookup("trainer", "allreduce.workers")
            && !l.allows(t.allreduce.workers as u64)
        {
            return Err(TrainError::Config(format!(
                "trainer.allreduce.workers (or --workers): {} is out of range: allowed {}; {}",
                t.allreduce.workers,
                l.range(),
                l.why
            )));
        }
        if t.allreduce.bucket_mb <= 0.0 || !t.allreduce.bucket_mb.is_finite() {
            return Err(TrainError::Config(
                "trainer.allreduce.bucket_mb must be a positive number".into(),
            ));
        }
        if let crate::config::Compression::Topk { ratio, .. } = t.allreduce.compression
            && !(ratio > 0.0 && ratio <= 1.0)
        {
            return Err(TrainError::Config(format!(
                "trainer.allreduce.compression.ratio: {ratio} is out of range: the share of each bucket's values sent, 0 < ratio ≤ 1 (e.g. 0.01)"
            )));
        }
        if t.optimizer.lr() <= 0.0 || !t.optimizer.lr().is_finite() {
            return Err(TrainError::Config(
                "trainer.optimizer.lr must be a positive number".into(),
            ));
        }
        if matches!(t.sync, crate::config::SyncConfig::Async { .. }) {
            check_async(t)?;
        }
        if t.export.is_some() && t.checkpoint.is_none() {
            return Err(TrainError::Config(
                "trainer.export publishes each checkpoint as a model version: add `trainer.checkpoint: {path: …, every_steps: N}`".into(),
            ));
        }
        if t.checkpoint.as_ref().is_some_and(|c| c.every_steps == 0) {
            return Err(TrainError::Config(
                "trainer.checkpoint.every_steps must be at least 1".into(),
            ));
        }
        if !self
            .pipeline
            .stages
            .iter()
            .any(|s| matches!(s.value, StageConfig::Batch(_)))
        {
            return Err(TrainError::Config(
                "the pipeline has no `batch` stage: add `- {type: batch, size: N}` so the trainer gets mini-batches".into(),
            ));
        }
        Ok(())
    }

    pub(crate) fn batch_size(&self) -> Option<(usize, bool)> {
        self.pipeline
            .stages
            .iter()
            .rev()
            .find_map(|s| match &s.value {
                StageConfig::Batch(b) => Some((b.size, b.drop_last)),
                _ => None,
            })
    }
}

/// Progress of rank 0, for a progress bar.
#[derive(Debug, Clone, Serialize)]
pub struct Progress {
    /// The step just done.
    pub step: u64,
    /// Steps planned, when known.
    pub total_steps: Option<u64>,
    /// Mean loss of the step.
    pub loss: f64,
    /// Latest evaluation accuracy.
    pub accuracy: Option<f64>,
}

/// Callback for [`Progress`].
pub type ProgressFn = Arc<dyn Fn(&Progress) + Send + Sync>;

/// How to run a [`TrainJob`].
#[derive(Clone, Default)]
pub struct TrainOptions {
    /// Continue from the checkpoint if it exists (without it, an existing checkpoint is an
    /// error).
    pub resume: bool,
    /// Resuming a checkpoint written by another number of ranks: continue at the start of
    /// the next epoch (the rest of the interrupted one is passed over, and reported) instead
    /// of refusing. Parquet sources only.
    pub elastic: bool,
    /// Set (e.g. by a SIGTERM handler) to checkpoint at the next step and stop.
    pub stop: Arc<AtomicBool>,
    /// Called by rank 0 after each step.
    pub progress: Option<ProgressFn>,
    /// Live counters (for a metrics endpoint and the run report).
    pub metrics: Option<Arc<TrainingMetrics>>,
}

impl std::fmt::Debug for TrainOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrainOptions")
            .field("resume", &self.resume)
            .field("elastic", &self.elastic)
            .finish_non_exhaustive()
    }
}

/// What a training run did (rank 0's view; counts are over all ranks).
#[derive(Debug, Clone, Serialize)]
pub struct TrainReport {
    /// The rank that wrote this report (the summary is rank 0's).
    pub rank: usize,
    /// Ranks.
    pub world_size: usize,
    /// Optimizer steps completed in total (including runs before a resume).
    pub steps: u64,
    /// Steps done by this run.
    pub steps_this_run: u64,
    /// Rows trained on, all ranks, all runs.
    pub rows_trained: u64,
    /// Rows trained on by this run.
    pub rows_this_run: u64,
    /// Rows some rank held when another ran out of data (not trained; with Parquet sources
    /// every rank gets equal shares, so this is 0).
    pub rows_untrained: u64,
    /// Loss of the last step.
    pub last_loss: Option<f64>,
    /// Every evaluation, in order.
    pub evals: Vec<EvalReport>,
    /// Seconds of this run.
    pub seconds: f64,
    /// The loader's CPU (rank 0 of a process, filled in by the caller once every local rank
    /// has finished: the loader threads are the process's).
    #[serde(flatten)]
    pub loader: Option<LoaderCpu>,
    /// Rows per second (all ranks) in this run.
    pub rows_per_second: f64,
    /// Fraction of the training loop's time spent waiting for data (rank 0).
    pub data_stall_fraction: f64,
    /// Share of rank 0's batches (after the first) that were already waiting when the loop
    /// asked for them (SPDL's readiness; ≥ 0.99: the loader is ahead). `None` with fewer than
    /// two batches.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_readiness: Option<f64>,
    /// The same fraction for every rank, by rank: the all-reduce waits for the slowest, so a
    /// rank starved of data shows here while rank 0's figure looks fine.
    pub data_stall_per_rank: Vec<f64>,
    /// The largest of `data_stall_per_rank`: what the report's bottleneck analysis uses.
    pub data_stall_max: f64,
    /// Seconds waiting for data (rank 0; start-up excluded).
    pub data_wait_seconds: f64,
    /// Seconds in collectives (handshakes + gradient all-reduce, rank 0).
    pub allreduce_seconds: f64,
    /// What rank 0's gradient exchanges sent in this run.
    #[serde(flatten)]
    pub wire: WireReport,
    /// Where the checkpoint went, if any.
    pub checkpoint: Option<String>,
    /// Whether a stop was requested (SIGTERM/SIGINT): the checkpoint covers what was done.
    pub interrupted: bool,
    /// Whether the run had already finished (resumed from a complete checkpoint).
    pub already_complete: bool,
    /// What this rank's pipeline stages noted, as `stage: note` (e.g. a shuffle's spills).
    pub notes: Vec<String>,
    /// Set when this run resumed a checkpoint of another number of ranks (`--elastic`):
    /// what was passed over and where training continued.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub elastic: Option<String>,
    /// The run's length in steps (all runs), as the schedule counts it: `trainer.steps`, or
    /// what the data gives, whichever is less; unknown for a stream without epochs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total_steps: Option<u64>,
}

/// What a rank's gradient exchanges sent in a run.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct WireReport {
    /// Gradient (or, under local SGD, parameter) bytes sent, compressed as configured.
    pub wire_bytes: u64,
    /// What the same steps would have sent as plain f32 gradients.
    pub dense_bytes: u64,
    /// Seconds compressing and decompressing (outside the collectives).
    pub compression_seconds: f64,
}

impl From<&ReduceCost> for WireReport {
    fn from(c: &ReduceCost) -> WireReport {
        WireReport {
            wire_bytes: c.wire_bytes,
            dense_bytes: c.dense_bytes,
            compression_seconds: c.compress.as_secs_f64(),
        }
    }
}

/// The CPU the loader took in a process that also trains.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct LoaderCpu {
    /// CPU seconds of this process's loader threads (the pipelines' CPU pools and async
    /// runtime, not the training loop or libtorch's threads) up to the end of the run.
    pub loader_cpu_seconds: f64,
    /// `loader_cpu_seconds` over the run's wall time × the host's cores: the loader's share
    /// of the host's CPU (SPDL keeps it ≤ 40 % so the trainer's kernel launches are not
    /// starved).
    pub loader_host_cpu_share: f64,
}

impl LoaderCpu {
    /// The loader threads' CPU so far, as a share of `seconds` of the host's cores; `None`
    /// where `/proc` cannot tell.
    pub fn measure(seconds: f64) -> Option<LoaderCpu> {
        let cpu = sluice_pipeline::runtime::loader_cpu_seconds()?;
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Some(LoaderCpu {
            loader_cpu_seconds: cpu,
            loader_host_cpu_share: cpu / (seconds.max(1e-9) * cores as f64),
        })
    }
}

/// What `sync: async` (the parameter server) does not combine with, each refused by name.
fn check_async(t: &crate::config::TrainerConfig) -> Result<(), TrainError> {
    use crate::config::{Backend, Compression, Decay};
    let clash = if t.allreduce.backend == Backend::Mpi {
        Some(
            "`allreduce.backend: mpi` (the server's messages are point to point, built for the `local` backend only)",
        )
    } else if t.allreduce.compression != Compression::None {
        Some("`allreduce.compression` (gradients go to the server whole)")
    } else if t.accumulate > 1 {
        Some("`accumulate` (each batch is a push)")
    } else if t.schedule.decay == Decay::Cosine {
        Some("`schedule.decay: cosine` (the number of updates depends on how pushes group)")
    } else if t.export.is_some() {
        Some("`export` (the server does not publish model versions yet)")
    } else if t.checkpoint.as_ref().is_some_and(|c| c.every.is_some()) {
        Some("`checkpoint.every` (the server checkpoints every `every_steps` updates)")
    } else if t.steps.is_some() {
        Some("`steps` (the run ends with the data: set the source's `epochs` or Kafka `until`)")
    } else if t.eval.as_ref().is_some_and(|e| e.every_steps.is_some()) {
        Some("`eval.every_steps` (evaluation runs at the end)")
    } else {
        None
    };
    match clash {
        Some(what) => Err(TrainError::Config(format!(
            "trainer.sync: async does not combine with {what}: remove one of them"
        ))),
        None => Ok(()),
    }
}
