//! The data side's resumable state: how far each source has been *durably* consumed.
//!
//! A consumer of the stream (the `sluice` job, or a user's training loop) reports every batch
//! it has handed off with [`Acknowledger::observe`], and calls [`Acknowledger::commit`] once
//! those rows are durable (the sink flushed, the checkpoint written). `commit` returns the
//! [`SourceState`] to store in a checkpoint and, for Kafka consumer groups, stores the offsets
//! with the group. Positions are derived from lineage, so they are exact per partition.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};

use serde::{Deserialize, Serialize};

use crate::batch::{Batch, Lineage, Mark, Origin};

mod draws;
mod errors;
pub mod position;
mod stamp;
#[cfg(test)]
mod tests;

pub use draws::Draws;
pub use errors::ErrorCounts;
use errors::{ErrorLedger, Run};
pub use position::{KafkaMark, KafkaPositions, KafkaShuffleState, KafkaWindow, Position};
pub use stamp::{DataStamp, ORDER_FORM, PlanStamp};
pub(crate) use stamp::{FNV_BASIS, fnv1a, setting_hash};

/// A Kafka lineage span as positions: topic, partition, its first row and just past its last
/// row (`None` for other origins).
pub(crate) fn kafka_span(s: &crate::batch::LineageSpan) -> Option<(&str, i32, Position, Position)> {
    let at = |offset: i64, skip_rows: u64| Position { offset, skip_rows };
    match &s.origin {
        Origin::Kafka { topic, partition } => Some((
            topic,
            *partition,
            at(s.first as i64, 0),
            at((s.first + s.len) as i64, 0),
        )),
        Origin::KafkaMessage {
            topic,
            partition,
            offset,
            rows,
        } => {
            let done = s.first + s.len;
            let past = match done >= *rows {
                true => at(offset + 1, 0),
                false => at(*offset, done),
            };
            Some((topic, *partition, at(*offset, s.first), past))
        }
        Origin::Object { .. } => None,
    }
}

impl KafkaPositions {
    /// Advances positions past every Kafka row of `lineage`.
    pub fn observe(&mut self, lineage: &Lineage) {
        for s in lineage.spans() {
            let Some((topic, partition, _, pos)) = kafka_span(s) else {
                continue;
            };
            // The topic's map exists after its first span: no key allocated per span.
            let partitions = match self.0.get_mut(topic) {
                Some(ps) => ps,
                None => self.0.entry(topic.to_string()).or_default(),
            };
            let slot = partitions.entry(partition).or_insert(pos);
            if pos > *slot {
                *slot = pos;
            }
        }
    }
}

/// Where [`SourceState::next_epoch`] continues a Parquet pipeline whose ranks were
/// interrupted, on any number of ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NextEpoch {
    /// The state to give every new rank.
    pub state: SourceState,
    /// The epoch the interrupted ranks were in, whose remaining rows are not read (`None`:
    /// no rank had delivered anything, so nothing is passed over).
    pub interrupted: Option<u64>,
}

impl SourceState {
    /// For a Parquet pipeline interrupted on some number of ranks (`states`, one per rank):
    /// a state at the start of the epoch after the latest one any rank was in. A position at
    /// the start of an epoch means the same rows under any plan (no rank had read any of
    /// it), so it resumes on any number of ranks, with any shard policy or shuffle — at the
    /// cost of the interrupted epoch's remaining rows, which the caller must report. (A
    /// position inside an epoch means rows only under the plan it was taken in.)
    pub fn next_epoch(states: &[SourceState]) -> Result<NextEpoch, String> {
        if states
            .iter()
            .any(|s| s.kafka.is_some() || s.kafka_shuffle.is_some())
        {
            return Err(
                "a Kafka stream's positions are per partition; resume it on as many ranks as wrote them".into(),
            );
        }
        let draws = Draws::of(states)?;
        let interrupted = states
            .iter()
            .filter_map(|s| s.parquet)
            .map(|m| m.epoch)
            .max();
        // The files are the same ones: keep their stamp, leave the settings (they may change).
        let plan = states
            .iter()
            .find_map(|s| s.plan.clone())
            .map(|p| PlanStamp {
                data: p.data.filter(|d| !d.prefix),
                order: BTreeMap::new(),
                form: ORDER_FORM,
            });
        Ok(NextEpoch {
            state: SourceState {
                parquet: Some(Mark::start_of(interrupted.map_or(0, |e| e + 1))),
                plan,
                draws,
                ..SourceState::default()
            },
            interrupted,
        })
    }
}

impl Rescaled {
    /// The draws of the run the epoch was interrupted in (kept by the run that continues it).
    pub fn draws(&self) -> Draws {
        self.from.first().map_or_else(Draws::default, |s| s.draws)
    }
}

/// A resumable position of the pipeline's source.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceState {
    /// Kafka partitions (static assignment resumes from here). Past a `shuffle`: just past
    /// every row taken into the window being emitted and the ones before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kafka: Option<KafkaPositions>,
    /// Past a `shuffle` of a Kafka stream: the window being emitted (rebuilt on resume by
    /// reading its rows again, from its `starts` up to `kafka`) and the rows of it already
    /// delivered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kafka_shuffle: Option<KafkaShuffleState>,
    /// Where a Parquet pipeline continues: epoch, unit, row, rows to skip and, past a
    /// shuffle, the window position. Shuffle windows and augmentation draws are pure
    /// functions of the seed and row identity, so this is all that is needed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parquet: Option<Mark>,
    /// What `parquet` is relative to: the files and the order-deciding settings. Resuming a
    /// pipeline whose plan differs is refused (see [`PlanStamp`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<PlanStamp>,
    /// Kafka: the records below `kafka` and how many of them could not be decoded — what the
    /// source's `error_budget` has spent, carried into a resumed run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kafka_errors: Option<ErrorCounts>,
    /// Resumed on another number of ranks mid-epoch: the batches of the interrupted epoch
    /// this rank delivers first (see [`Rescaled`]); `parquet` is unset meanwhile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rescaled: Option<Box<Rescaled>>,
    /// How the run that wrote this state drew its augmentations; a resumed run keeps it.
    #[serde(default = "Draws::first")]
    pub draws: Draws,
}

/// The rest of an epoch interrupted on some number of ranks, continued on another number
/// (made by `Pipeline::rescale`): the batches every old rank still owed in that epoch,
/// dealt out in contiguous runs — so each is delivered exactly once, exactly as its old rank
/// would have made it (same rows, order, augmentation) — then every new rank continues at
/// the start of the next epoch under the new split.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rescaled {
    /// The old ranks' states (index = old rank), which the runs count from.
    pub from: Vec<SourceState>,
    /// The runs of old ranks' batches this rank delivers, in order.
    pub runs: Vec<BatchRun>,
    /// Batches every new rank delivers before the next epoch: a rank whose runs hold fewer
    /// ends with empty batches (no rows), so all take the same number of steps.
    pub batches: u64,
    /// Of those, already delivered.
    pub delivered: u64,
    /// Where this rank continues afterwards: the start of the next epoch.
    pub then: Mark,
}

/// Batches `first..end` of what old rank `rank` delivers after its state in
/// [`Rescaled::from`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchRun {
    pub rank: usize,
    pub first: u64,
    pub end: u64,
}

impl Rescaled {
    /// The runs not yet delivered.
    pub(crate) fn remaining(&self) -> Vec<BatchRun> {
        let mut skip = self.delivered;
        let mut out = Vec::new();
        for r in &self.runs {
            let n = r.end - r.first;
            if skip >= n {
                skip -= n;
                continue;
            }
            out.push(BatchRun {
                first: r.first + skip,
                ..*r
            });
            skip = 0;
        }
        out
    }

    /// Deals `runs` (in order) to `world` ranks: contiguous shares, as equal as they can be
    /// (the first ones a batch longer when they do not divide evenly).
    pub(crate) fn deal(
        from: Vec<SourceState>,
        runs: &[BatchRun],
        world: usize,
        then: Mark,
    ) -> Vec<Rescaled> {
        let total: u64 = runs.iter().map(|r| r.end - r.first).sum();
        let w = world as u64;
        let mut left: Vec<BatchRun> = runs.iter().rev().copied().collect();
        (0..w)
            .map(|j| {
                let mut want = total / w + u64::from(j < total % w);
                let mut mine = Vec::new();
                while want > 0 {
                    let Some(r) = left.last_mut() else { break };
                    let take = want.min(r.end - r.first);
                    mine.push(BatchRun {
                        end: r.first + take,
                        ..*r
                    });
                    r.first += take;
                    want -= take;
                    if r.first == r.end {
                        left.pop();
                    }
                }
                Rescaled {
                    from: from.clone(),
                    runs: mine,
                    batches: total.div_ceil(w),
                    delivered: 0,
                    then,
                }
            })
            .collect()
    }
}

/// Where an [`Acknowledger`] gets the plan its states are relative to: the settings, known
/// when the pipeline is prepared, and the files, known once every footer is read (looked up
/// until then, then kept).
pub(crate) struct PlanSource {
    order: BTreeMap<String, String>,
    data: OnceLock<DataStamp>,
    probe: Box<DataProbe>,
}

/// Stamps the files a position is relative to, if they are known yet.
type DataProbe = dyn Fn(Option<&Mark>) -> Option<DataStamp> + Send + Sync;

impl std::fmt::Debug for PlanSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlanSource")
            .field("order", &self.order)
            .field("data", &self.data.get())
            .finish_non_exhaustive()
    }
}

impl PlanSource {
    pub(crate) fn new(
        order: BTreeMap<String, String>,
        probe: impl Fn(Option<&Mark>) -> Option<DataStamp> + Send + Sync + 'static,
    ) -> Self {
        PlanSource {
            order,
            data: OnceLock::new(),
            probe: Box::new(probe),
        }
    }

    /// The plan of position `mark`, as far as it is known now (a stamp of every file is
    /// kept once known; a prefix depends on the position).
    pub(crate) fn stamp(&self, mark: Option<&Mark>) -> PlanStamp {
        let data = match self.data.get() {
            Some(d) => Some(d.clone()),
            None => (self.probe)(mark).map(|d| match d.prefix {
                true => d,
                false => self.data.get_or_init(|| d).clone(),
            }),
        };
        PlanStamp {
            data,
            order: self.order.clone(),
            form: ORDER_FORM,
        }
    }
}

/// The value behind one of the [`Acknowledger`]'s locks. One rule for all of them: a lock
/// poisoned by a thread that panicked while holding it ends this thread too, loudly. Its
/// value may be half-updated, and a position taken from it (or the empty one a default would
/// give) would make the next checkpoint resume at other rows; stopping leaves the last
/// checkpoint as the position to resume from.
fn held<T>(lock: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match lock.lock() {
        Ok(guard) => guard,
        // The panic that poisoned it was reported where it happened; this one says why the
        // run cannot go on.
        #[allow(clippy::panic)]
        Err(_) => panic!(
            "internal error: a thread panicked while it updated the source position; stopping without recording a position (the last checkpoint is the one to resume from). Please report it"
        ),
    }
}

/// Stores offsets with a Kafka consumer group (set by a `group` source once it is open).
pub(crate) trait OffsetStore: Send + Sync + std::fmt::Debug {
    /// Stores (and, at the end of a run, commits synchronously) these positions.
    fn store(&self, positions: &KafkaPositions, final_commit: bool);
}

/// Tracks what the consumer of a stream has handed off and made durable. Cheap to share.
#[derive(Debug)]
pub struct Acknowledger {
    written: Mutex<KafkaPositions>,
    mark: Mutex<Option<Mark>>,
    /// Past a Kafka-fed shuffle: the window position just past the last observed batch.
    window: Mutex<Option<KafkaShuffleState>>,
    store: OnceLock<Arc<dyn OffsetStore>>,
    plan: OnceLock<Arc<PlanSource>>,
    /// The plan of the state this one was restored from, until the pipeline sets its own.
    resumed_plan: Option<PlanStamp>,
    /// The Kafka error budget's counts, shared with the acknowledgers that follow this one
    /// ([`Acknowledger::follower`]), and this one's place among them.
    errors: Arc<Mutex<ErrorLedger>>,
    errors_slot: usize,
    /// The draws of the state this one was restored from (else today's), kept in every state.
    draws: Draws,
}

impl Default for Acknowledger {
    fn default() -> Self {
        Acknowledger::new(None)
    }
}

impl Acknowledger {
    /// Records `draws` in every state (the run's: [`crate::Pipeline`] decides it from the
    /// resumed state or the config).
    pub(crate) fn drawing(mut self, draws: Draws) -> Self {
        self.draws = draws;
        self
    }

    /// Starts from a restored state (or nothing).
    pub fn new(resume: Option<&SourceState>) -> Self {
        Acknowledger {
            written: Mutex::new(resume.and_then(|s| s.kafka.clone()).unwrap_or_default()),
            mark: Mutex::new(resume.and_then(|s| s.parquet)),
            window: Mutex::new(resume.and_then(|s| s.kafka_shuffle.clone())),
            store: OnceLock::new(),
            plan: OnceLock::new(),
            resumed_plan: resume.and_then(|s| s.plan.clone()),
            draws: resume.map_or_else(Draws::default, |s| s.draws),
            errors: Arc::new(Mutex::new(ErrorLedger {
                base: resume.and_then(|s| s.kafka_errors).unwrap_or_default(),
                used: resume.is_some_and(|s| s.kafka_errors.is_some()),
                pending: BTreeMap::new(),
                seen: vec![None],
            })),
            errors_slot: 0,
        }
    }

    /// Another acknowledger of the same stream, starting from `resume` (another consumer's
    /// view: what the stream yielded, say, where this one tracks what a sink made durable).
    /// It shares the error budget's counts the source reports here.
    pub(crate) fn follower(&self, resume: Option<&SourceState>) -> Acknowledger {
        let mut a = Acknowledger::new(resume).drawing(self.draws);
        a.errors = self.errors.clone();
        a.errors_slot = {
            let mut l = held(&self.errors);
            l.seen.push(None);
            l.seen.len() - 1
        };
        a
    }

    /// The error budget's counts a resumed run starts from (zero without a state).
    #[cfg_attr(not(feature = "kafka"), allow(dead_code))] // used by the Kafka source
    pub(crate) fn restored_errors(&self) -> ErrorCounts {
        held(&self.errors).base
    }

    /// Records that a Kafka source counted these records (`(topic, partition, offset,
    /// bad)`, each partition's in offset order) against its error budget; returns how many.
    #[cfg_attr(not(feature = "kafka"), allow(dead_code))] // used by the Kafka source
    pub(crate) fn consumed<'a>(
        &self,
        records: impl Iterator<Item = (&'a Arc<str>, i32, i64, bool)>,
    ) -> u64 {
        let mut l = held(&self.errors);
        let mut n = 0;
        // Consecutive records of a partition go in as one run (one lookup per run).
        let mut open: Option<(&Arc<str>, i32, Run)> = None;
        for (topic, partition, offset, bad) in records {
            n += 1;
            if let Some((t, p, r)) = &mut open
                && Arc::ptr_eq(t, topic)
                && *p == partition
                && r.bad == bad
                && r.first + r.len as i64 == offset
            {
                r.len += 1;
                continue;
            }
            if let Some((t, p, r)) = open.take() {
                l.consumed(t, p, r);
            }
            let run = Run {
                first: offset,
                len: 1,
                bad,
            };
            open = Some((topic, partition, run));
        }
        if let Some((t, p, r)) = open {
            l.consumed(t, p, r);
        }
        n
    }

    /// Sets what the states this acknowledger returns are relative to (once).
    pub(crate) fn set_plan(&self, plan: Arc<PlanSource>) {
        let _ = self.plan.set(plan);
    }

    pub(crate) fn plan(&self) -> Option<Arc<PlanSource>> {
        self.plan.get().cloned()
    }

    #[cfg_attr(not(feature = "kafka"), allow(dead_code))] // used by the Kafka source
    pub(crate) fn set_store(&self, store: Arc<dyn OffsetStore>) {
        let _ = self.store.set(store);
    }

    /// Records that the rows of `lineage` have been handed off (written to the sink).
    pub fn observe(&self, lineage: &Lineage) {
        held(&self.written).observe(lineage);
    }

    /// Records that `batch` has been handed off: its Kafka rows (by lineage) and, for a
    /// Parquet pipeline, the position just past it. Batches must be observed in stream order.
    pub fn observe_batch(&self, batch: &Batch) {
        if let Some(k) = &batch.kafka_mark {
            // Past a shuffle the rows come permuted: the positions are the window's.
            let end = KafkaMark {
                window: k.window.clone(),
                emitted: k.emitted + batch.stream_rows(),
            };
            *held(&self.written) = k.window.ends.clone();
            *held(&self.window) = Some(end.state());
            return;
        }
        self.observe(&batch.lineage);
        if let Some(end) = batch.end_mark() {
            *held(&self.mark) = Some(end);
        }
    }

    /// The positions just past everything observed so far: what a checkpoint records once
    /// those rows are durable.
    pub fn state(&self) -> SourceState {
        self.state_as(self.errors_slot)
    }

    /// [`Acknowledger::state`] without taking part in when the error counts are folded: the
    /// state a follower starts from.
    pub(crate) fn peek_state(&self) -> SourceState {
        self.state_as(usize::MAX)
    }

    fn state_as(&self, slot: usize) -> SourceState {
        let positions = held(&self.written).clone();
        let parquet = *held(&self.mark);
        let kafka_errors = {
            let mut l = held(&self.errors);
            l.used.then(|| l.count(slot, &positions))
        };
        SourceState {
            kafka_errors,
            kafka: (!positions.0.is_empty()).then_some(positions),
            kafka_shuffle: held(&self.window).clone(),
            parquet,
            plan: match self.plan.get() {
                Some(p) => Some(p.stamp(parquet.as_ref())),
                None => self.resumed_plan.clone(),
            },
            rescaled: None,
            draws: self.draws,
        }
    }

    /// Declares `state` durable (its rows written, its checkpoint stored): stores the offsets
    /// with the consumer group, if any. `final_commit` commits synchronously (end of run).
    pub fn store(&self, state: &SourceState, final_commit: bool) {
        if let (Some(store), Some(k)) = (self.store.get(), &state.kafka) {
            // Rows of a shuffle window still being emitted are not consumed yet.
            let mut k = k.clone();
            for (t, p, start) in state.kafka_shuffle.iter().flat_map(|s| s.starts.iter()) {
                k.set(t, p, start);
            }
            store.store(&k, final_commit);
        }
    }

    /// [`Acknowledger::state`] then [`Acknowledger::store`]: everything observed is durable.
    pub fn commit(&self, final_commit: bool) -> SourceState {
        let state = self.state();
        self.store(&state, final_commit);
        state
    }
}
