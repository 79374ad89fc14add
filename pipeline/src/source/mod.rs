//! Sources: where batches come from.

#[cfg(feature = "kafka")]
pub(crate) mod kafka;
#[cfg(not(feature = "kafka"))]
#[path = "kafka_off.rs"]
pub(crate) mod kafka;
mod manifest;
pub mod parquet;
pub(crate) mod reader;

use arrow::datatypes::SchemaRef;

use crate::runtime::CpuPool;
use crate::runtime::channel::Sender;
use crate::runtime::metrics::PipelineMetrics;
use std::sync::Arc;

/// The objects a Parquet source would read — its `path` listing or its `manifest` — without
/// opening any of them: for checks that must come before any data is read (a sink refusing
/// to write over its own inputs).
pub async fn input_objects(
    config: &crate::config::ParquetSourceConfig,
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
