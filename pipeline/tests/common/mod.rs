//! Helpers shared by the pipeline's integration tests.
#![allow(dead_code, clippy::unwrap_used)]

use arrow::array::AsArray;
use arrow::datatypes::Int64Type;
use futures::StreamExt;
use proptest::prelude::*;
use sluice_pipeline::{Batch, BatchStream, Pipeline, SourceState};

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

/// `p`'s batches (the first `limit` of them, if given) and the snapshot just past them.
pub async fn run(p: Pipeline, limit: Option<usize>) -> (Vec<Batch>, SourceState) {
    let mut s = p.stream();
    let out = take(&mut s, limit).await;
    (out, s.snapshot())
}

/// The stream's next batches: all of them, or the first `limit`.
pub async fn take(s: &mut BatchStream, limit: Option<usize>) -> Vec<Batch> {
    let mut out = Vec::new();
    while limit.is_none_or(|l| out.len() < l) {
        match s.next().await {
            Some(b) => out.push(b.unwrap()),
            None => break,
        }
    }
    out
}

/// The same batches: data and lineage, in order.
pub fn same(a: &[Batch], b: &[Batch]) -> Result<(), TestCaseError> {
    prop_assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        prop_assert_eq!(&x.data, &y.data);
        prop_assert_eq!(&x.lineage, &y.lineage);
    }
    Ok(())
}
