//! Continuing an epoch interrupted on `W` ranks on another number of ranks, exactly.
//!
//! Every old rank owed the same number of batches of the interrupted epoch (ranks get equal
//! batch counts, and checkpoints are taken at the same step everywhere). Those batches are
//! dealt out to the new ranks in contiguous runs ([`Rescaled::deal`]); a new rank makes each
//! run by running its old rank's pipeline (that rank of `W`, resumed from its state) and
//! taking the run's batches — the very batches the old rank would have delivered, rows,
//! order and augmentation alike. Ranks whose share is a batch shorter end with an empty
//! batch, so every rank takes the same number of steps; then every rank continues at the
//! start of the next epoch under the new split. A state taken meanwhile records the runs
//! and how many batches were delivered, so it resumes exactly — on the same number of ranks,
//! or dealt out again to yet another number.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use futures::{Stream, StreamExt};

use super::{BatchStream, Pipeline, PipelineMetrics};
use crate::batch::{Batch, Lineage, Mark};
use crate::error::{Error, Result};
use crate::source::{ShardPolicy, SourceConfig};
use crate::stage::StageConfig;
use crate::state::{BatchRun, Draws, PlanStamp, Rescaled, SourceState};

impl Pipeline {
    /// For a Parquet pipeline interrupted on `old.len()` ranks (`old`: every rank's state,
    /// taken at the same step): the states for `world` ranks that continue it exactly —
    /// first the batches the old ranks still owed in the interrupted epoch, dealt out evenly
    /// (each delivered once, as its old rank would have made it), then the next epochs under
    /// the new split. `done`: the batches each old rank had delivered in that epoch (a
    /// trainer counts its steps); with a `shuffle` the states tell it (and a `done` given is
    /// checked against them), and states that are themselves rescaled do not need it.
    ///
    /// Fails, saying why, when the rest of the epoch cannot be counted ahead: a Kafka source,
    /// a `shuffle` with `across_ranks`, no `batch` stage, a stage removing rows before the
    /// last `batch`, several ranks under a shard policy other than `redistribute`, or files
    /// not stamped whole. [`SourceState::next_epoch`] continues such a run at the next epoch.
    pub fn rescale(
        &self,
        old: &[SourceState],
        done: Option<u64>,
        world: usize,
    ) -> std::result::Result<Vec<SourceState>, String> {
        if world == 0 || old.is_empty() {
            return Err("no ranks".into());
        }
        Draws::of(old)?;
        let rescaled: Vec<&Rescaled> = old.iter().filter_map(|s| s.rescaled.as_deref()).collect();
        if !rescaled.is_empty() {
            // Interrupted while delivering the rest of an epoch: deal out what is left of it.
            if rescaled.len() != old.len() {
                return Err("the ranks' states are from different phases of a resumed epoch (taken at different steps)".into());
            }
            let first = rescaled[0];
            let remaining: Vec<BatchRun> = rescaled.iter().flat_map(|r| r.remaining()).collect();
            let plan = old[0].plan.clone();
            return Ok(deal(
                first.from.clone(),
                &remaining,
                world,
                first.then,
                plan,
            ));
        }
        let next = SourceState::next_epoch(old)?;
        let Some(epoch) = next.interrupted else {
            return Ok(vec![next.state; world]);
        };
        let marks: Vec<Mark> = old.iter().filter_map(|s| s.parquet).collect();
        if marks.len() == old.len() && marks.iter().all(|m| *m == Mark::start_of(epoch)) {
            // Every rank is at the start of the epoch: it means the same rows on any ranks.
            let state = SourceState {
                parquet: Some(Mark::start_of(epoch)),
                ..next.state
            };
            return Ok(vec![state; world]);
        }
        if marks.len() != old.len() || marks.iter().any(|m| m.epoch != epoch) {
            return Err(
                "the ranks' states are in different epochs (taken at different steps)".into(),
            );
        }
        let n = self.batches_per_epoch(old)?;
        let done = match (done, self.delivered_in_epoch(&marks, n)?) {
            (Some(d), Some(m)) if d != m => {
                return Err(format!(
                    "{d} batches of epoch {epoch} were said to be delivered by each rank, but the states are {m} batches into it"
                ));
            }
            (Some(d), _) | (None, Some(d)) => d,
            (None, None) => {
                return Err("the batches each rank delivered in the epoch are not known (only a window `shuffle`'s states tell them; without one, or with `mode: global`, give them)".into());
            }
        };
        let owed = n.checked_sub(done).ok_or(
            "more batches were delivered than the epoch has: the states do not match this config",
        )?;
        let runs: Vec<BatchRun> = (0..old.len())
            .map(|rank| BatchRun {
                rank,
                first: 0,
                end: owed,
            })
            .collect();
        let then = Mark::start_of(epoch + 1);
        Ok(deal(old.to_vec(), &runs, world, then, next.state.plan))
    }

    /// The batches each rank delivered in its epoch, told by its position in the shuffle's
    /// output when there is a shuffle (its windows before the current one are full, so the
    /// rows out are `window × buffer_rows + emitted`; each batch but an epoch's last holds the
    /// last `batch` stage's size): `None` without one; an error when the ranks are at
    /// different batches (states of different steps).
    fn delivered_in_epoch(
        &self,
        marks: &[Mark],
        per_epoch: u64,
    ) -> std::result::Result<Option<u64>, String> {
        let buffer = self.config.stages.iter().find_map(|s| match &s.value {
            StageConfig::Shuffle(c) => Some(c.buffer_rows as u64),
            _ => None,
        });
        let (Some(buffer), Some(size)) = (buffer, self.last_batch_size()) else {
            return Ok(None);
        };
        let done: Option<Vec<u64>> = marks
            .iter()
            .map(|m| {
                m.shuffle.map(|w| {
                    (w.window * buffer + w.emitted)
                        .div_ceil(size)
                        .min(per_epoch)
                })
            })
            .collect();
        let Some(done) = done else { return Ok(None) };
        match done.first() {
            Some(first) if done.iter().all(|d| d == first) => Ok(Some(*first)),
            Some(_) => Err(format!(
                "the ranks' states are at different batches of the epoch ({done:?}): taken at different steps"
            )),
            None => Ok(None),
        }
    }

    /// Whether an epoch this config interrupted on `world` ranks can be continued exactly on
    /// another number ([`Pipeline::rescale`]), judging by the config alone; else why not.
    pub fn rescalable(&self, world: usize) -> std::result::Result<(), String> {
        self.last_counted_batch(world).map(|_| ())
    }

    /// [`Pipeline::rescalable`]'s checks; the index of the last `batch` stage when they hold.
    fn last_counted_batch(&self, world: usize) -> std::result::Result<usize, String> {
        let SourceConfig::Parquet(p) = &self.config.source.value else {
            return Err("a Kafka stream has no epochs to count".into());
        };
        let stages = &self.config.stages;
        if stages
            .iter()
            .any(|s| matches!(&s.value, StageConfig::Shuffle(c) if c.across_ranks))
        {
            return Err("with `across_ranks`, an old rank's batches depend on all the old ranks exchanging rows".into());
        }
        let last_batch = stages
            .iter()
            .rposition(|s| matches!(s.value, StageConfig::Batch(_)))
            .ok_or("without a `batch` stage, the batch count is not known ahead")?;
        if let Some(s) = stages[..last_batch].iter().find(|s| s.value.removes_rows()) {
            return Err(format!(
                "a `{}` before the last `batch` makes the batch count depend on the data",
                s.value.kind()
            ));
        }
        if world == 1
            && let Some(s) = stages[last_batch..].iter().find(|s| s.value.removes_rows())
        {
            return Err(format!(
                "on one rank, a batch that a `{}` after the last `batch` empties is left out, so the batch count depends on the data",
                s.value.kind()
            ));
        }
        if world > 1 && p.shard != ShardPolicy::Redistribute {
            return Err("counting the ranks' shares ahead needs `shard: redistribute`".into());
        }
        Ok(last_batch)
    }

    /// Batches each of `old.len()` ranks delivers per epoch, from the files' rows, the shard
    /// policy and the `batch` stages; or why that is not known ahead.
    fn batches_per_epoch(&self, old: &[SourceState]) -> std::result::Result<u64, String> {
        let last_batch = self.last_counted_batch(old.len())?;
        let stages = &self.config.stages;
        let w = old.len() as u64;
        let data = old
            .iter()
            .find_map(|s| s.plan.as_ref()?.data.as_ref())
            .filter(|d| !d.prefix)
            .ok_or("the states do not record the rows of every file (written by an older Sluice, or by one rank reading in listing order)")?;
        let rows = match &self.config.source.value {
            SourceConfig::Parquet(p) if let Some(mix) = &p.mix => {
                let paths = p.path.as_ref().map_or(&[][..], |p| &p.0[..]);
                if data.entries.len() != paths.len() {
                    return Err(
                        "the states do not record the rows of each dataset of the `mix`".into(),
                    );
                }
                crate::source::parquet::mix_counts(
                    &data.entries,
                    &mix.weights,
                    mix.rows_per_epoch,
                    paths,
                )?
                .iter()
                .sum()
            }
            _ => data.rows,
        };
        let mut rows = rows / w;
        let mut batches = 0;
        for s in &stages[..=last_batch] {
            if let StageConfig::Batch(b) = &s.value {
                let size = b.size.max(1) as u64;
                batches = if b.drop_last {
                    rows / size
                } else {
                    rows.div_ceil(size)
                };
                if b.drop_last {
                    rows = rows / size * size;
                }
            }
        }
        Ok(batches)
    }

    /// A pipeline making old rank `rank`'s batches from its `skip`-th on: this config as
    /// that rank of `from.len()`, resumed from its state moved `skip` batches further. (Every
    /// batch of an epoch but its last holds the last `batch` stage's size in rows of the
    /// stream — rows a later stage removed included — so the position past `skip` more is
    /// that many rows further, and the rows passed over are neither augmented nor cut.)
    fn old_rank(&self, from: &[SourceState], rank: usize, skip: u64) -> Pipeline {
        let mut config = self.config.clone();
        config.runtime.rank = Some(rank);
        config.runtime.world_size = Some(from.len());
        let size = self.last_batch_size();
        let mut resume = from.get(rank).cloned();
        if let (Some(state), Some(size)) = (resume.as_mut(), size) {
            state.parquet = state.parquet.map(|m| m.advance(skip * size));
        }
        Pipeline {
            config,
            base_dir: self.base_dir.clone(),
            resume,
            collective: None,
            prelude: None,
        }
    }
}

fn deal(
    from: Vec<SourceState>,
    runs: &[BatchRun],
    world: usize,
    then: Mark,
    plan: Option<PlanStamp>,
) -> Vec<SourceState> {
    Rescaled::deal(from, runs, world, then)
        .into_iter()
        .map(|r| rescaled_state(&plan, r))
        .collect()
}

/// The state of a rank with `share` of a rescaled epoch left, the files stamped by `plan`.
fn rescaled_state(plan: &Option<PlanStamp>, share: Rescaled) -> SourceState {
    SourceState {
        plan: plan.clone(),
        draws: share.draws(),
        rescaled: Some(Box::new(share)),
        ..SourceState::default()
    }
}

/// The state a rescaled run continues from once its share of the epoch is delivered.
pub(super) fn after(plan: &Option<PlanStamp>, share: &Rescaled) -> SourceState {
    SourceState {
        parquet: Some(share.then),
        plan: plan.clone(),
        draws: share.draws(),
        ..SourceState::default()
    }
}

/// A rank's share of the interrupted epoch, delivered before its own stream.
#[derive(Debug)]
pub(super) struct Prelude {
    /// The pipeline (this rank's) the old ranks' pipelines are made from.
    template: Pipeline,
    /// What is left to deliver (`delivered` counts up), and the files' stamp of its state.
    share: Rescaled,
    plan: Option<PlanStamp>,
    /// The old rank's stream being read: the rank and the batches it has yielded.
    current: Option<(usize, u64, Box<BatchStream>)>,
    /// For the empty batches that even out the shares.
    schema: Option<SchemaRef>,
    /// The stream's counters: what the old ranks' pipelines read and delivered is added in.
    metrics: Option<Arc<PipelineMetrics>>,
}

impl Prelude {
    /// `template` delivering `share`, from a state whose files are stamped by `plan`.
    pub(super) fn new(template: Pipeline, share: Rescaled, plan: Option<PlanStamp>) -> Self {
        Prelude {
            template,
            share,
            plan,
            current: None,
            schema: None,
            metrics: None,
        }
    }

    pub(super) fn set_metrics(&mut self, metrics: Arc<PipelineMetrics>) {
        self.metrics = Some(metrics);
    }

    /// Adds what the current old rank's pipeline read to the stream's counters, and drops it.
    fn close_current(&mut self) {
        if let (Some((_, _, stream)), Some(into)) = (self.current.take(), &self.metrics) {
            let from = &stream.metrics().source;
            let to = &into.source;
            for (a, b) in [
                (&from.rows, &to.rows),
                (&from.row_groups, &to.row_groups),
                (&from.bytes_read, &to.bytes_read),
                (&from.bytes_decoded, &to.bytes_decoded),
                (&from.rows_replayed, &to.rows_replayed),
            ] {
                b.fetch_add(a.load(Ordering::Relaxed), Ordering::Relaxed);
            }
        }
    }

    /// Counts a batch delivered from the share as the stream's own.
    fn delivered(&mut self, batch: &Batch) {
        self.share.delivered += 1;
        if let Some(m) = &self.metrics {
            m.rows_out
                .fetch_add(batch.num_rows() as u64, Ordering::Relaxed);
            m.batches_out.fetch_add(1, Ordering::Relaxed);
            m.bytes_out
                .fetch_add(batch.memory_size() as u64, Ordering::Relaxed);
        }
        if self.finished() {
            self.close_current();
        }
    }

    /// Whether every batch of the share has been delivered.
    pub(super) fn finished(&self) -> bool {
        self.share.delivered >= self.share.batches
    }

    /// The state just past the last batch delivered.
    pub(super) fn snapshot(&self) -> SourceState {
        rescaled_state(&self.plan, self.share.clone())
    }

    pub(super) fn set_schema(&mut self, schema: SchemaRef) {
        self.schema.get_or_insert(schema);
    }
}

impl Stream for Prelude {
    type Item = Result<Batch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.finished() {
            return Poll::Ready(None);
        }
        // The next batch of a run: old rank `rank`'s `index`-th after its state.
        let Some(BatchRun {
            rank, first: index, ..
        }) = this.share.remaining().first().copied()
        else {
            // Past the runs: an empty batch evens out the shares.
            let Some(schema) = this.schema.clone() else {
                return Poll::Ready(Some(Err(Error::Internal(
                    "no schema for an empty batch".into(),
                ))));
            };
            let batch = Batch::new(RecordBatch::new_empty(schema), Lineage::default());
            this.delivered(&batch);
            return Poll::Ready(Some(Ok(batch)));
        };
        let then = this.share.then;
        loop {
            // The old rank's stream, positioned at or before `index`.
            if !matches!(&this.current, Some((r, at, _)) if *r == rank && *at <= index) {
                this.close_current();
                let stream = this.template.old_rank(&this.share.from, rank, index);
                this.current = Some((rank, index, Box::new(stream.stream())));
            }
            let Some((_, at, stream)) = this.current.as_mut() else {
                return Poll::Ready(None);
            };
            let batch = match stream.poll_next_unpin(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(b))) => b,
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(None) => {
                    return Poll::Ready(Some(Err(Error::Resume(format!(
                        "continuing epoch {} on a new number of ranks: old rank {rank} had {at} batch(es) after its state, but {} were counted for it; the states do not match this config and data",
                        then.epoch.saturating_sub(1),
                        index + 1
                    )))));
                }
            };
            if batch.lineage.spans().iter().any(|s| s.epoch >= then.epoch) {
                return Poll::Ready(Some(Err(Error::Resume(format!(
                    "continuing epoch {} on a new number of ranks: old rank {rank} reached epoch {} after {at} batch(es) past its state, before the {} counted for it; the states do not match this config and data",
                    then.epoch.saturating_sub(1),
                    then.epoch,
                    index + 1
                )))));
            }
            let taken = *at;
            *at += 1;
            if taken < index {
                continue; // another new rank delivers it
            }
            this.schema.get_or_insert_with(|| batch.data.schema());
            this.delivered(&batch);
            return Poll::Ready(Some(Ok(batch)));
        }
    }
}
