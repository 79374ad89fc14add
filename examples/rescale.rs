//! Continuing an epoch on another number of ranks, as after losing (or adding) a node.
//!
//! ```sh
//! cargo run --example rescale -- configs/digits-augmented.yaml
//! ```
//!
//! Two ranks (tasks of this process, joined by a `LocalCollective`; in a real job, processes
//! or machines) each take 4 batches of the pipeline, then stop: their `snapshot()`s are what
//! a checkpoint stores. The run goes on with three ranks: `Pipeline::rescale` deals the
//! batches the two still owed of the interrupted epoch out to the three — each made exactly as
//! its old rank would have made it (same rows, shuffle, augmentation) — and every rank then
//! continues with the next epoch under the three-way split. No row of the interrupted epoch is
//! lost or repeated, and every rank delivers the same number of batches.
#![allow(clippy::print_stdout)]

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::AsArray;
use arrow::datatypes::Int64Type;
use futures::StreamExt;
use sluice::pipeline::collective::{Collective, LocalCollective};
use sluice::pipeline::{Batch, Pipeline, PipelineMetrics, SourceState};

/// Runs one pipeline per rank of a `world`-rank group, from `states` if given, taking at most
/// `limit` batches each; returns every rank's batches and its state after them.
async fn ranks(
    path: &str,
    world: usize,
    states: Option<Vec<SourceState>>,
    limit: Option<usize>,
) -> Result<Vec<(Vec<Batch>, SourceState, u64)>, Box<dyn std::error::Error>> {
    let mut tasks = Vec::new();
    for (rank, collective) in LocalCollective::group(world).into_iter().enumerate() {
        let mut pipeline =
            Pipeline::from_path(path)?.with_collective(Arc::new(collective) as Arc<dyn Collective>);
        if let Some(s) = &states {
            pipeline = pipeline.resume_from(s[rank].clone());
        }
        tasks.push(tokio::spawn(async move {
            let mut stream = pipeline.stream();
            let mut out = Vec::new();
            while limit.is_none_or(|l| out.len() < l) {
                match stream.next().await {
                    Some(b) => out.push(b?),
                    None => break,
                }
            }
            // The stream's own count of the rows it delivered (old ranks' share included).
            let counted = PipelineMetrics::get(&stream.metrics().rows_out);
            Ok::<_, sluice::pipeline::Error>((out, stream.snapshot(), counted))
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await??);
    }
    Ok(out)
}

/// How often each `id` of epoch `epoch` was delivered in `batches`.
fn count_ids(batches: &[Batch], epoch: u64, seen: &mut BTreeMap<i64, usize>) {
    for b in batches {
        if b.lineage.spans().first().map(|s| s.epoch) != Some(epoch) {
            continue;
        }
        let ids = b
            .data
            .column_by_name("id")
            .map(|c| c.as_primitive::<Int64Type>());
        for id in ids.into_iter().flat_map(|a| a.values().iter().copied()) {
            *seen.entry(id).or_default() += 1;
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).unwrap_or_else(|| {
        format!(
            "{}/configs/digits-augmented.yaml",
            env!("CARGO_MANIFEST_DIR")
        )
    });

    // Two ranks take 4 batches each, then stop (a node is lost): keep their states.
    let before = ranks(&path, 2, None, Some(4)).await?;
    let states: Vec<SourceState> = before.iter().map(|(_, s, _)| s.clone()).collect();
    println!("2 ranks delivered 4 batches each, then stopped");

    // Three ranks continue. `done`: the batches each old rank delivered in the interrupted
    // epoch (a trainer counts its steps; 4 here, all in epoch 0).
    let dealt = Pipeline::from_path(&path)?.rescale(&states, Some(4), 3)?;
    let owed: u64 = dealt
        .iter()
        .filter_map(|s| s.rescaled.as_ref())
        .flat_map(|r| r.runs.iter().map(|x| x.end - x.first))
        .sum();
    let share = dealt[0].rescaled.as_ref().map_or(0, |r| r.batches);
    println!(
        "rescaled to 3 ranks: the {owed} batches the 2 still owed of epoch 0 are dealt out, {share} per rank"
    );
    let after = ranks(&path, 3, Some(dealt), None).await?;
    let counts: Vec<usize> = after.iter().map(|(b, _, _)| b.len()).collect();
    println!("batches per rank after the rescale: {counts:?}");
    let rows: u64 = after
        .iter()
        .flat_map(|(b, _, _)| b.iter().map(|b| b.num_rows() as u64))
        .sum();
    let counted: u64 = after.iter().map(|(_, _, c)| c).sum();
    println!("rows delivered {rows}, counted by the streams' metrics {counted}");

    // Every row of epoch 0 (of the 2-rank split: the 1436 rows it dealt) exactly once.
    let mut seen = BTreeMap::new();
    for (batches, _, _) in before.iter().chain(&after) {
        count_ids(batches, 0, &mut seen);
    }
    let once = seen.values().all(|n| *n == 1);
    println!(
        "epoch 0: {} distinct rows delivered, each exactly once: {once}",
        seen.len()
    );
    // And epoch 1 under the 3-way split: every row once too.
    let mut next = BTreeMap::new();
    for (batches, _, _) in &after {
        count_ids(batches, 1, &mut next);
    }
    println!(
        "epoch 1: {} distinct rows delivered, each exactly once: {}",
        next.len(),
        next.values().all(|n| *n == 1)
    );
    Ok(())
}
