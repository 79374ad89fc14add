//! Sources: where batches come from.

pub mod parquet;
pub(crate) mod reader;
