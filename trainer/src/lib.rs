//! # sluice-trainer
//!
//! Data-parallel training on Sluice pipelines with tch (libtorch): every rank holds a model
//! replica, gradients are flattened into buckets and averaged with all-reduce through a
//! [`Collective`](sluice_pipeline::collective::Collective), optimizer steps are identical
//! everywhere, and checkpoints hold the model, the optimizer, the step and every rank's
//! pipeline position so that `--resume` continues exactly.
//!
//! - [`run::train`] runs a YAML job (`sluice train`): the model zoo ([`model`]), optimizers
//!   and schedules ([`optim`]), evaluation, checkpoints, a JSON-lines step log.
//! - [`Trainer`] is the same machinery for any user model in a hand-written loop.
//!
//! Backends: `local` (ranks are threads of one process) and `mpi` (cargo feature `mpi`,
//! one process per rank under `mpirun`). A NCCL backend for GPUs fits behind the same trait:
//! it would add device-buffer reductions; [`sync::GradSync`] is where buckets would stay on
//! the device.

pub mod checkpoint;
pub mod config;
pub mod export;
pub mod job;
pub mod metrics;
pub mod model;
mod mpi_backend;
pub mod optim;
pub mod run;
pub mod sync;
mod trainer;

pub use config::TrainerConfig;
pub use job::{EvalReport, LoaderCpu, Progress, TrainJob, TrainOptions, TrainReport, WireReport};
pub use metrics::TrainingMetrics;
pub use run::train;
pub use trainer::{StepReport, Trainer, TrainerOptions};

#[cfg(feature = "mpi")]
pub use mpi_backend::MpiCollective;

/// Why training failed.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// The pipeline (config, source, stage) failed.
    #[error(transparent)]
    Pipeline(#[from] sluice_pipeline::Error),
    /// Converting batches to tensors failed.
    #[error(transparent)]
    Loader(#[from] sluice_loader::ConvertError),
    /// A collective operation failed (another rank failed, or the backend did).
    #[error(transparent)]
    Collective(#[from] sluice_pipeline::collective::CollectiveError),
    /// The trainer's configuration is unusable.
    #[error("{0}")]
    Config(String),
    /// Reading or writing a checkpoint failed, or it does not fit this job.
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    /// libtorch reported an error.
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
    /// Replicas hold different parameters (a bug, or non-deterministic ops).
    #[error("the model replicas diverged at step {step}: parameter checksums {detail}")]
    Diverged { step: u64, detail: String },
    /// A bug.
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<sluice_pipeline::checkpoint::CheckpointFileError> for TrainError {
    fn from(e: sluice_pipeline::checkpoint::CheckpointFileError) -> TrainError {
        TrainError::Checkpoint(format!("{}: {}", e.url, e.message))
    }
}
