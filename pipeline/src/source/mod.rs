//! Sources: where batches come from.

mod manifest;
pub mod parquet;
pub(crate) mod reader;
