//! Helpers shared by the pipeline's integration tests.
#![allow(dead_code, clippy::unwrap_used)]

use arrow::array::AsArray;
use arrow::datatypes::Int64Type;
use sluice_pipeline::Batch;

/// The `id` column of every batch, in order.
pub fn ids(batches: &[Batch]) -> Vec<i64> {
    batches
        .iter()
        .flat_map(|b| {
            b.data
                .column_by_name("id")
                .unwrap()
                .as_primitive::<Int64Type>()
                .values()
                .to_vec()
        })
        .collect()
}

/// A two-worker runtime for a test's pipelines.
pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}
