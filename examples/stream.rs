//! Consuming a Sluice pipeline as a Rust `Stream` in your own code.
//!
//! ```sh
//! cargo run --example stream -- configs/quickstart.yaml
//! ```
//!
//! Each item is a `Batch`: an Arrow `RecordBatch` plus the lineage of its rows (file, row
//! group, row range, epoch). The `sink:` section of the file is ignored here: you are the sink.
//!
//! Then it shows an exact resume: a second stream stops after 5 batches and takes its
//! `snapshot()` (what your checkpoint stores, as JSON); a third, a fresh pipeline given that
//! state with `resume_from`, continues with exactly the 6th batch — the same rows, in the
//! same order, with the same augmentation, shuffle windows included.
#![allow(clippy::print_stdout)]

use futures::StreamExt;
use sluice::pipeline::{Pipeline, PipelineMetrics};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| format!("{}/configs/quickstart.yaml", env!("CARGO_MANIFEST_DIR")));

    let mut batches = Pipeline::from_path(&path)?.stream();
    let metrics = batches.metrics();

    let (mut rows, mut count) = (0usize, 0usize);
    while let Some(batch) = batches.next().await {
        let batch = batch?; // a bad file or value ends the stream with a precise error
        if count == 0 {
            println!(
                "schema: {:?}",
                batch
                    .data
                    .schema()
                    .fields()
                    .iter()
                    .map(|f| f.name())
                    .collect::<Vec<_>>()
            );
            println!(
                "first batch: {} rows from {}",
                batch.num_rows(),
                batch.lineage
            );
        }
        rows += batch.num_rows();
        count += 1;
    }
    println!(
        "{count} batches, {rows} rows ({} read from the source)",
        PipelineMetrics::get(&metrics.source.rows)
    );

    // Exact resume: stop after 5 batches and keep the state just past the 5th...
    let mut first = Pipeline::from_path(&path)?.stream();
    let mut expected = None;
    let mut state = None;
    for n in 1..=6 {
        let Some(batch) = first.next().await else {
            break;
        };
        let batch = batch?;
        if n == 5 {
            state = Some(serde_json::to_string(&first.snapshot())?);
        }
        if n == 6 {
            expected = Some(batch);
        }
    }
    drop(first);
    if let (Some(state), Some(expected)) = (state, expected) {
        // ...then, in a fresh pipeline (another process, after a crash), continue from it.
        let state = serde_json::from_str(&state)?;
        let mut resumed = Pipeline::from_path(&path)?.resume_from(state).stream();
        if let Some(next) = resumed.next().await {
            let next = next?;
            let from = match next.lineage.spans().len() {
                1 | 2 => next.lineage.to_string(),
                n => format!("{n} places (shuffled)"),
            };
            println!(
                "resumed after 5 batches: the next batch is {} rows from {from}; same as uninterrupted: {}",
                next.num_rows(),
                next.data == expected.data && next.lineage == expected.lineage
            );
        }
    }
    Ok(())
}
