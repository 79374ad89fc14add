//! Sources: where batches come from. Each kind is one folder holding its settings, its
//! opening (schema checks) and its read loop: `parquet/`, `kafka/` (without the `kafka` cargo
//! feature, `kafka/off.rs` stands in for the client: the settings are still read, then the
//! source is refused naming the feature). [`SourceConfig`] is the `source:` section.

#[cfg(feature = "kafka")]
pub(crate) mod kafka;
#[cfg(not(feature = "kafka"))]
#[path = "kafka/off.rs"]
pub(crate) mod kafka;
mod manifest;
mod mapped;
pub mod parquet;
pub(crate) mod reader;

use arrow::datatypes::SchemaRef;
use serde::Deserialize;
use serde::de::{self, Deserializer};

pub use kafka::{
    Assignment, KafkaFormat, KafkaSourceConfig, OutageBudget, SchemaSpec, StartPosition, Until,
};
pub use parquet::{Mix, ParquetSourceConfig, Partitioning, ShardPolicy};

use crate::runtime::CpuPool;
use crate::runtime::channel::Sender;
use crate::runtime::metrics::PipelineMetrics;
use std::sync::Arc;

/// The objects a Parquet source would read — its `path` listing or its `manifest` — without
/// opening any of them: for checks that must come before any data is read (a sink refusing
/// to write over its own inputs).
pub async fn input_objects(
    config: &ParquetSourceConfig,
    base_dir: &std::path::Path,
) -> crate::error::Result<Vec<crate::storage::ListedObject>> {
    use futures::TryStreamExt;
    match (&config.path, &config.manifest) {
        (_, Some(manifest)) => Ok(manifest::read(manifest, base_dir, &config.storage).await?.0),
        (Some(paths), None) => {
            crate::storage::stream_objects(
                paths.0.clone(),
                base_dir.to_path_buf(),
                config.storage.clone(),
            )
            .try_collect()
            .await
        }
        (None, None) => Ok(Vec::new()),
    }
}

/// Where rows come from (`type:` selects the kind).
#[derive(Debug, Clone, PartialEq)]
pub enum SourceConfig {
    /// Parquet files (`type: parquet`).
    Parquet(ParquetSourceConfig),
    /// Kafka topics (`type: kafka`).
    Kafka(KafkaSourceConfig),
}

impl SourceConfig {
    /// The `type` name.
    pub fn kind(&self) -> &'static str {
        match self {
            SourceConfig::Parquet(_) => "parquet",
            SourceConfig::Kafka(_) => "kafka",
        }
    }

    /// Passes over the data: a Parquet source's `epochs` (at least 1); a Kafka stream is one.
    pub fn epochs(&self) -> u64 {
        match self {
            SourceConfig::Parquet(p) => p.epochs.max(1),
            SourceConfig::Kafka(_) => 1,
        }
    }
}

impl crate::config::Component for SourceConfig {
    const WHAT: &'static str = "source";
    const KINDS: &'static [&'static str] = &["parquet", "kafka"];
    fn deserialize_kind<'de, D: Deserializer<'de>>(kind: &str, d: D) -> Result<Self, D::Error> {
        match kind {
            "parquet" => ParquetSourceConfig::deserialize(d).map(SourceConfig::Parquet),
            "kafka" => KafkaSourceConfig::deserialize(d).map(SourceConfig::Kafka),
            other => Err(de::Error::unknown_variant(other, Self::KINDS)),
        }
    }
}

/// An open source of either kind.
#[derive(Debug)]
pub(crate) enum Source {
    Parquet(Box<parquet::ParquetSource>),
    Kafka(Box<kafka::KafkaSource>),
}

impl Source {
    pub(crate) fn schema(&self) -> &SchemaRef {
        match self {
            Source::Parquet(p) => p.schema(),
            Source::Kafka(k) => k.schema(),
        }
    }

    pub(crate) fn num_files(&self) -> Option<usize> {
        match self {
            Source::Parquet(p) => p.num_files(),
            Source::Kafka(_) => None,
        }
    }

    /// A Parquet source split over several ranks, every rank promised the same number of
    /// batches: the size of the batches it reads.
    pub(crate) fn split_batch_rows(&self) -> Option<usize> {
        match self {
            Source::Parquet(p) => p.split_batch_rows(),
            Source::Kafka(_) => None,
        }
    }

    pub(crate) fn total_rows(&self) -> Option<u64> {
        match self {
            Source::Parquet(p) => p.total_rows(),
            Source::Kafka(_) => None,
        }
    }

    pub(crate) async fn run(
        self,
        tx: Sender,
        pool: CpuPool,
        metrics: Arc<PipelineMetrics>,
        parallelism: usize,
    ) {
        match self {
            Source::Parquet(p) => (*p).run(tx, pool, metrics).await,
            Source::Kafka(k) => k.run(tx, pool, parallelism).await,
        }
    }
}
