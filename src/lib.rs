//! # sluice
//!
//! Streaming data pipelines that keep model trainers fed. This facade crate re-exports the
//! pieces and runs whole jobs (pipeline + sink) as the `sluice` binary does:
//!
//! - [`pipeline`] (`sluice-pipeline`): config model, sources, Arrow stages, the `Stream` API;
//! - [`sinks`] (`sluice-sinks`): Parquet, Arrow IPC, Kafka and null sinks;
//! - `loader` (`sluice-loader`, feature `torch`): the tensor loader, a batch stream turned
//!   into prefetched tch tensors on the training device;
//! - [`Job`]: a pipeline file with its `sink:`, prepared and run to completion;
//! - `trainer` (`sluice-trainer`, feature `torch`): data-parallel training (`sluice train`);
//! - [`observe`]: the Prometheus endpoint and the counters' time series;
//! - [`report`]: the run report (`report.json`, `report.html` with plots).

mod job;
pub mod observe;
pub mod report;

pub use job::{
    CheckpointConfig, Job, JobError, PartitionReport, PreparedJob, RunReport, StageReport,
    mapped_rss_bytes, mib, peak_rss_bytes, rss_bytes,
};
#[cfg(feature = "torch")]
pub use sluice_loader as loader;
pub use sluice_pipeline as pipeline;
pub use sluice_pipeline::runtime::{loader_cpu_seconds, process_cpu_seconds};
pub use sluice_sinks as sinks;
#[cfg(feature = "torch")]
pub use sluice_trainer as trainer;

/// The README's Rust examples compile (`cargo test --doc`).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
