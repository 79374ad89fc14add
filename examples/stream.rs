//! Consuming a Sluice pipeline as a Rust `Stream` in your own code.
//!
//! ```sh
//! cargo run --example stream -- configs/quickstart.yaml
//! ```
//!
//! Each item is a `Batch`: an Arrow `RecordBatch` plus the lineage of its rows (file, row
//! group, row range, epoch). The `sink:` section of the file is ignored here: you are the sink.
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
    Ok(())
}
