//! Emitting a permuted window a batch at a time: from memory, by merging its spilled runs,
//! or regrouped by length.

use arrow::array::RecordBatch;
use arrow::compute::interleave_record_batch;
use chacha20::ChaCha8Rng;
use rand::RngExt;

use crate::error::{Result, StageRef};

use super::spill::Run;
use super::{Emitter, Origins, RowOrigin, arrow_err};

impl Emitter {
    /// Whether its rows were read back from spill files (copied: the view columns must be
    /// wrapped again).
    pub(super) fn read_back(&self) -> bool {
        match self {
            Emitter::Memory { .. } => false,
            Emitter::Spilled { .. } => true,
            Emitter::Grouped(g) => g.inner.read_back(),
        }
    }

    /// Up to `want` rows: data and per-row origins; `None` when the window is exhausted.
    pub(super) fn next(
        &mut self,
        stage: &StageRef,
        want: usize,
        origins: &Origins,
    ) -> Result<Option<(RecordBatch, Vec<RowOrigin>)>> {
        match self {
            Emitter::Grouped(g) => g.next(stage, want, origins),
            Emitter::Memory {
                pieces,
                lineage,
                order,
                pos,
            } => {
                if *pos >= order.len() {
                    return Ok(None);
                }
                let end = (*pos + want).min(order.len());
                let idx = &order[*pos..end];
                *pos = end;
                let rb = super::gather::gather(pieces, idx).map_err(|e| arrow_err(stage, e))?;
                let rows = idx.iter().map(|(p, r)| lineage[*p][*r]).collect();
                Ok(Some((rb, rows)))
            }
            Emitter::Spilled { runs, left, rng } => {
                if *left == 0 {
                    return Ok(None);
                }
                let n = (want as u64).min(*left) as usize;
                let mut srcs: Vec<RecordBatch> = Vec::new();
                let mut src_of: Vec<Option<usize>> = vec![None; runs.len()];
                let mut idx = Vec::with_capacity(n);
                let mut rows = Vec::with_capacity(n);
                for _ in 0..n {
                    let k = pick_run(runs, *left, rng);
                    let run = &mut runs[k];
                    let reload = run
                        .chunk
                        .as_ref()
                        .is_none_or(|c| run.chunk_pos >= c.num_rows());
                    if reload || src_of[k].is_none() {
                        srcs.push(run.current(stage)?.clone());
                        src_of[k] = Some(srcs.len() - 1);
                    }
                    idx.push((src_of[k].unwrap_or(0), run.chunk_pos));
                    rows.push(run.lineage[run.next_row]);
                    run.chunk_pos += 1;
                    run.next_row += 1;
                    run.rows -= 1;
                    *left -= 1;
                }
                let refs: Vec<&RecordBatch> = srcs.iter().collect();
                let rb = interleave_record_batch(&refs, &idx).map_err(|e| arrow_err(stage, e))?;
                Ok(Some((rb, rows)))
            }
        }
    }

    /// Passes over up to `n` rows; returns how many were passed over.
    pub(super) fn skip(&mut self, stage: &StageRef, n: usize, origins: &Origins) -> Result<usize> {
        match self {
            Emitter::Grouped(g) => g.skip(stage, n, origins),
            Emitter::Memory { order, pos, .. } => {
                let k = n.min(order.len() - *pos);
                *pos += k;
                Ok(k)
            }
            Emitter::Spilled { runs, left, rng } => {
                let k = (n as u64).min(*left) as usize;
                for _ in 0..k {
                    let i = pick_run(runs, *left, rng);
                    let run = &mut runs[i];
                    run.current(stage)?;
                    run.chunk_pos += 1;
                    run.next_row += 1;
                    run.rows -= 1;
                    *left -= 1;
                }
                Ok(k)
            }
        }
    }
}

/// A run, with probability proportional to its remaining rows.
fn pick_run(runs: &[Run], left: u64, rng: &mut ChaCha8Rng) -> usize {
    let mut x = rng.random_range(0..left);
    for (i, r) in runs.iter().enumerate() {
        if x < r.rows {
            return i;
        }
        x -= r.rows;
    }
    runs.len() - 1
}
