//! The rules on the order of stages that exact resume and equal batch counts need, and the
//! warning when several ranks could get unequal batch counts.

use super::Pipeline;
use crate::error::{Error, Result, StageRef};
use crate::source::ShardPolicy;
use crate::source::SourceConfig;
use crate::stage::{ShuffleConfig, ShuffleMode, StageConfig};

impl Pipeline {
    /// Under several ranks, a stage that removes rows before the last stage that cuts
    /// batches (`batch`, `shuffle`): each rank's batch count then depends on its data (its
    /// index, and what to tell the user).
    pub(super) fn unequal_counts_warning(&self) -> Option<(usize, String)> {
        let stages = &self.config.stages;
        let last_batch = stages
            .iter()
            .rposition(|s| matches!(s.value, StageConfig::Batch(_) | StageConfig::Shuffle(_)))?;
        let i = stages[..last_batch]
            .iter()
            .position(|s| s.value.removes_rows())?;
        Some((
            i,
            format!(
                "it removes rows before {} on each of {} ranks, so each rank's batch count depends on its data and the ranks may get unequal counts: `sluice train` stops every rank at the shortest (the rows left are reported untrained), a loop of your own must do the same. Move it after {} to keep the counts equal (a batch that loses rows is then delivered short, or empty)",
                self.stage_ref(last_batch),
                self.rank_and_world().1,
                self.stage_ref(last_batch),
            ),
        ))
    }

    /// Checks the order of stages for exact resume: no filter (or `image` skipping bad rows)
    /// between two stages that cut or reorder rows (`batch`/`shuffle`),
    /// `shuffle` before `batch`, `mixup` after the last `batch`, and a shuffle of a Kafka
    /// stream only with static assignment and within the rank. `running`: also that a
    /// cross-rank shuffle has its collective (known only when the pipeline runs: `sluice
    /// train` gives it one).
    pub(super) fn check_stage_order(&self, running: bool) -> Result<()> {
        let mut stateful: Option<StageRef> = None;
        let mut dropping: Option<StageRef> = None;
        for (i, s) in self.config.stages.iter().enumerate() {
            let sref = self.stage_ref(i);
            let drops = s.value.removes_rows();
            if drops && dropping.is_none() {
                dropping = Some(sref.clone());
            }
            let fail = |message: String| {
                Err(Error::Stage {
                    stage: sref.clone(),
                    message,
                })
            };
            // The next stage that cuts or reorders rows, if any.
            let cuts_later = self.config.stages[i + 1..]
                .iter()
                .position(|s| matches!(s.value, StageConfig::Batch(_) | StageConfig::Shuffle(_)))
                .map(|k| self.stage_ref(i + 1 + k));
            // Rows removed between two such stages would shift every position the second
            // one records (and the ranks' batch counts); after the last one, each batch
            // counts the rows removed from it (`Batch::dropped`).
            if let (true, Some(first), Some(later)) = (drops, &stateful, &cuts_later) {
                let what = match &s.value {
                    StageConfig::Filter(_) => "a filter",
                    _ => "`on_error: skip`",
                };
                return fail(format!(
                    "{what} removes rows after {first} and before {later}, which cuts the stream again: its positions could not be replayed on resume and ranks could get unequal batch counts; move this stage before {first} or after {later}"
                ));
            }
            match &s.value {
                StageConfig::Shuffle(c) => {
                    if c.mode == ShuffleMode::Global {
                        self.check_global_shuffle(c, i).or_else(fail)?;
                    }
                    if c.across_ranks
                        && let Some(d) = &dropping
                    {
                        return fail(format!(
                            "`across_ranks` needs every rank's windows to hold the same number of rows, but {d} drops rows before it; move it after the shuffle (before `batch`), or shuffle per rank"
                        ));
                    }
                    if let Some(prev) = &stateful {
                        return fail(format!(
                            "shuffle after {prev}: shuffle rows first, then batch them"
                        ));
                    }
                    if c.group_by_length.is_some() {
                        match self.batch_after(i) {
                            None => return fail("`group_by_length` makes batches of rows of similar length for the `batch` stage after the shuffle, and there is none: add one (`- {type: batch, size: N}`)".into()),
                            Some(size) if size > 0 && c.buffer_rows % size != 0 => {
                                let below = c.buffer_rows / size * size;
                                let choices = if below == 0 {
                                    format!("{size}")
                                } else {
                                    format!("{below} or {}", below + size)
                                };
                                return fail(format!(
                                    "`group_by_length` needs `buffer_rows` ({}) to be a multiple of the batch size ({size}), so that every window ends where a batch ends (otherwise every later batch would straddle two of its groups): use {choices}",
                                    c.buffer_rows
                                ));
                            }
                            Some(_) => {}
                        }
                    }
                    if let SourceConfig::Kafka(k) = &self.config.source.value {
                        if c.across_ranks {
                            return fail("`across_ranks` needs a Parquet source (ranks exchange equal windows of an epoch; a Kafka stream has neither): shuffle each rank's partitions locally".into());
                        }
                        if k.assignment == crate::source::Assignment::Group {
                            return fail("a shuffle of a Kafka stream needs `assignment: static` on the source: a resumed run rebuilds the window being emitted by reading its partitions again, and a consumer group may have moved them to another member".into());
                        }
                    }
                    if running
                        && c.across_ranks
                        && self.collective.is_none()
                        && self.rank_and_world().1 > 1
                    {
                        return fail("`across_ranks` needs a collective between the ranks: run it under `sluice train` or give the pipeline one (`Pipeline::with_collective`)".into());
                    }
                    stateful = Some(sref);
                }
                StageConfig::Batch(_) if stateful.is_none() => stateful = Some(sref),
                StageConfig::Mixup(_) => {
                    let batch_after = self.config.stages[i + 1..]
                        .iter()
                        .position(|s| matches!(s.value, StageConfig::Batch(_)));
                    let batch_before = self.config.stages[..i]
                        .iter()
                        .any(|s| matches!(s.value, StageConfig::Batch(_)));
                    if let Some(k) = batch_after {
                        return fail(format!(
                            "mixup pairs the rows of the batches it receives, and {} cuts batches again after it: a resumed run could pair other rows; move mixup after the last `batch`",
                            self.stage_ref(i + 1 + k)
                        ));
                    }
                    if !batch_before {
                        return fail(
                            "mixup pairs the rows of a batch: put a `batch` stage before it".into(),
                        );
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }
}

impl Pipeline {
    /// What a global shuffle (`mode: global`, stage `i`) needs: a Parquet source without
    /// `mix`, rows dealt as positions (no other `shard`), and no other shuffle. Returns the
    /// reason it cannot run.
    fn check_global_shuffle(&self, c: &ShuffleConfig, i: usize) -> std::result::Result<(), String> {
        let source = match &self.config.source.value {
            SourceConfig::Kafka(_) => {
                return Err("`mode: global` reads rows by their position in the epoch, and a Kafka stream has neither positions to jump to nor an end: use `mode: window` (the default)".into());
            }
            SourceConfig::Parquet(p) => p,
        };
        if source.mix.is_some() {
            return Err("`mode: global` permutes the rows of the files, and `mix` draws each epoch's rows from several datasets: use `mode: window` with `mix`".into());
        }
        if source.shard != ShardPolicy::Redistribute {
            return Err(format!(
                "`mode: global` deals the permuted epoch to ranks in equal contiguous ranges of positions (at most world_size − 1 rows left out, a different few each epoch), so `shard: {}` on the source has nothing to decide: remove it",
                source.shard.name()
            ));
        }
        if c.across_ranks {
            return Err("`mode: global` already permutes the whole epoch across every rank's share: remove `across_ranks`".into());
        }
        if c.group_by_length.is_some() {
            return Err("`group_by_length` sorts the rows of a window, and `mode: global` has none: use `mode: window` to group by length".into());
        }
        let other = self
            .config
            .stages
            .iter()
            .enumerate()
            .find(|(k, s)| *k != i && matches!(s.value, StageConfig::Shuffle(_)));
        if let Some((k, _)) = other {
            return Err(format!(
                "`mode: global` permutes the whole epoch; {} shuffles it again and adds nothing but memory: remove one of them",
                self.stage_ref(k)
            ));
        }
        Ok(())
    }
}
