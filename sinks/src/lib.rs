//! # sluice-sinks
//!
//! Where Sluice batches go: Parquet files (zstd, atomic), Arrow IPC files (zstd, atomic), the
//! `null` sink (counts, for benchmarks) and Kafka topics (Arrow IPC or JSON messages; cargo
//! feature `kafka`). The tensor loader, which turns a batch stream into prefetched tch
//! tensors, is the `sluice-loader` crate: this one never links libtorch.
//!
//! A sink is built from its [`SinkConfig`] once the pipeline's output schema is known, takes
//! batches through [`Sink::write`], and either [`Sink::finish`]es (output becomes visible under
//! its final name) or [`Sink::abort`]s (nothing is left behind).
//!
//! Each sink kind is one module holding its settings, its build step and its writer
//! (`parquet_sink`, `ipc`, `null`, `kafka/`); [`SinkConfig`], here, registers them.

mod file;
pub mod guard;
mod ipc;
mod kafka;
mod lease;
mod null;
mod parquet_sink;

use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use serde::Deserialize;
use serde::de::{self, Deserializer};
use sluice_pipeline::config::Component;
use sluice_pipeline::{Batch, CpuPool};

pub use ipc::{ArrowIpcSinkConfig, IpcCompression};
pub use kafka::{KafkaCompression, KafkaSinkConfig, KafkaSinkFormat};
pub use null::NullSinkConfig;
pub use parquet_sink::{ParquetCompression, ParquetSinkConfig};

/// Where the pipeline's batches go.
#[derive(Debug, Clone, PartialEq)]
pub enum SinkConfig {
    /// `type: parquet`.
    Parquet(ParquetSinkConfig),
    /// `type: arrow_ipc`.
    ArrowIpc(ArrowIpcSinkConfig),
    /// `type: null`.
    Null(NullSinkConfig),
    /// `type: kafka`.
    Kafka(KafkaSinkConfig),
}

impl SinkConfig {
    /// The `type` name.
    pub fn kind(&self) -> &'static str {
        match self {
            SinkConfig::Parquet(_) => "parquet",
            SinkConfig::ArrowIpc(_) => "arrow_ipc",
            SinkConfig::Null(_) => "null",
            SinkConfig::Kafka(_) => "kafka",
        }
    }

    /// Whether [`crate::Sink::flush`] can make output durable while the run goes on (so a
    /// checkpoint can cover it).
    pub fn flushes_while_running(&self) -> bool {
        match self {
            SinkConfig::Parquet(p) => p.max_rows_per_file.is_some(),
            SinkConfig::ArrowIpc(_) => false,
            SinkConfig::Null(_) | SinkConfig::Kafka(_) => true,
        }
    }
}

impl Component for SinkConfig {
    const WHAT: &'static str = "sink";
    const KINDS: &'static [&'static str] = &["parquet", "arrow_ipc", "null", "kafka"];
    fn deserialize_kind<'de, D: Deserializer<'de>>(kind: &str, d: D) -> Result<Self, D::Error> {
        match kind {
            "parquet" => ParquetSinkConfig::deserialize(d).map(SinkConfig::Parquet),
            "arrow_ipc" => ArrowIpcSinkConfig::deserialize(d).map(SinkConfig::ArrowIpc),
            "null" => NullSinkConfig::deserialize(d).map(SinkConfig::Null),
            "kafka" => KafkaSinkConfig::deserialize(d).map(SinkConfig::Kafka),
            other => Err(de::Error::unknown_variant(other, Self::KINDS)),
        }
    }
}

/// Errors of the sinks crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The output location is invalid or already taken.
    #[error("sink: {0}")]
    Location(#[from] sluice_pipeline::Error),
    /// The output exists and `overwrite: false`.
    #[error(
        "sink: {url} already exists and `overwrite` is false; remove it or set `overwrite: true`"
    )]
    Exists { url: String },
    /// The sink would write where its source reads.
    #[error("sink: {0}")]
    Overlap(String),
    /// Something other than a regular file sits at the sink's path.
    #[error("sink: {url} is {what}, not a regular file: {hint}")]
    NotAFile {
        url: String,
        what: &'static str,
        hint: &'static str,
    },
    /// The output is claimed by another run, or the claim could not be made.
    #[error("sink: {url}: {message}")]
    Lock { url: String, message: String },
    /// Writing to storage failed.
    #[error("sink: writing {url} failed: {source}")]
    Storage {
        url: String,
        #[source]
        source: object_store::Error,
    },
    /// Encoding failed.
    #[error("sink: encoding {url} failed: {message}")]
    Encode { url: String, message: String },
    /// Kafka refused or failed (unreachable, unknown topic, delivery failed).
    #[error("sink: kafka topic `{topic}`: {message}")]
    Kafka { topic: String, message: String },
    /// A bug.
    #[error("sink: internal error (a bug in Sluice, please report it): {0}")]
    Internal(String),
}

/// Result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What a sink did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SinkReport {
    /// Rows written.
    pub rows: u64,
    /// Batches written.
    pub batches: u64,
    /// Bytes written to storage (encoded size), or Arrow bytes for the null sink.
    pub bytes: u64,
    /// Where the output is, if anywhere.
    pub location: Option<String>,
}

/// A destination for batches.
#[async_trait]
pub trait Sink: Send {
    /// Writes one batch.
    async fn write(&mut self, batch: &Batch) -> Result<()>;
    /// Makes everything written so far durable, if this sink can before `finish`: returns
    /// `true` when it did (source positions may then advance past those rows), `false` when
    /// rows become durable only at `finish` (single-file sinks).
    async fn flush(&mut self) -> Result<bool> {
        Ok(false)
    }
    /// What a checkpoint must hold to resume this sink after the last `flush` (part-file
    /// numbering); `None` when there is nothing to remember.
    fn state(&self) -> Option<serde_json::Value> {
        None
    }
    /// Completes the output and makes it visible.
    async fn finish(self: Box<Self>) -> Result<SinkReport>;
    /// Discards everything written; no partial output remains.
    async fn abort(self: Box<Self>);
}

/// Everything a sink needs to start.
#[derive(Debug, Clone)]
pub struct SinkContext {
    /// Schema of the batches it will receive.
    pub schema: SchemaRef,
    /// Directory relative output paths resolve against (the config file's).
    pub base_dir: std::path::PathBuf,
    /// The CPU pool encoding runs on.
    pub pool: CpuPool,
    /// Sink state from the checkpoint being resumed ([`Sink::state`]), if any.
    pub resume: Option<serde_json::Value>,
}

impl SinkConfig {
    /// Builds the sink.
    pub async fn build(&self, cx: &SinkContext) -> Result<Box<dyn Sink>> {
        match self {
            SinkConfig::Parquet(c) => Ok(Box::new(parquet_sink::ParquetSink::new(c, cx).await?)),
            SinkConfig::ArrowIpc(c) => Ok(Box::new(ipc::IpcSink::new(c, cx).await?)),
            SinkConfig::Null(_) => Ok(Box::new(null::NullSink::default())),
            #[cfg(feature = "kafka")]
            SinkConfig::Kafka(c) => Ok(Box::new(kafka::KafkaSink::new(c, cx).await?)),
            #[cfg(not(feature = "kafka"))]
            SinkConfig::Kafka(c) => Err(Error::Kafka {
                topic: c.topic.clone(),
                message: sluice_pipeline::feature_off("a `kafka` sink", "kafka"),
            }),
        }
    }
}

fn default_true() -> bool {
    true
}
