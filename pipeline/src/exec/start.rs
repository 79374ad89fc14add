//! Starting a prepared run: a task per stage group, connected by byte-bounded queues, and
//! the run's end, which the stream reads (`Running`).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use tokio::task::JoinSet;

use super::tasks::{Chain, map_task, rebatch_task, shuffle_task, skip_task};
use super::{PreparedPipeline, StageSlot};
use crate::batch::Batch;
use crate::error::{Error, Result};
use crate::runtime::channel::{self, Receiver, Sender, channel};
use crate::runtime::{CpuPool, PipelineMetrics, StageMetrics};
use crate::source::Source;
use crate::stage::{self, BuiltStage};

impl PreparedPipeline {
    /// Starts every task of the run; the stream reads the last queue (`Running`).
    pub(super) fn start(self) -> Running {
        let PreparedPipeline {
            source,
            slots,
            schema,
            pool,
            metrics,
            queue_bytes,
            parallelism,
            acker: _,
            collective,
            resume,
            kafka_resume,
            frozen: _,
            prelude: _,
        } = self;
        let kafka = matches!(source, Source::Kafka(_));
        // Every rank was promised the same number of batches (a Parquet source split over
        // several ranks): a batch whose rows were all removed after the last stage that cuts
        // rows is delivered empty, not left out, so that ranks stay in step.
        let split = source.split_batch_rows();
        let keep_empty = split.is_some();
        let stateful = slots
            .iter()
            .position(|s| !matches!(s.built, BuiltStage::Map(_)));
        // With no stage that cuts rows (`batch`, `shuffle`), the source's batches end where
        // its row groups end, which falls differently on each rank: the rank's rows are cut
        // into batches of `source.batch_rows` right after the source, across row groups.
        let rank_batches = split.filter(|_| stateful.is_none());
        let parallelism = parallelism.unwrap_or(pool.threads()).max(1);
        let mut w = Wiring {
            tasks: JoinSet::new(),
            metrics,
            queue_bytes,
            pool,
            parallelism,
        };
        let (tx, mut rx) = w.new_queue("source".into());
        // The source's decode counts as its share of the pool (next to the stages').
        let source_pool = w.pool.counting(w.metrics.source.busy_ns.clone());
        w.tasks
            .spawn(source.run(tx, source_pool, w.metrics.clone(), parallelism));
        let stage_metrics = w.metrics.stages();
        // A restored run passes over the rows it already delivered just before the first
        // stage that cuts or reorders rows (or at the end). The cut of a rank's share into
        // equal batches (`rank_batches`) is such a stage, before every configured one.
        let first_stateful = match rank_batches {
            Some(_) => 0,
            None => stateful.unwrap_or(slots.len()),
        };
        let skip = resume.map(|m| m.skip).unwrap_or(0);
        let mut i = 0;
        while i <= slots.len() {
            if i == first_stateful && skip > 0 {
                let (tx, next) = w.new_queue("resume".into());
                w.tasks.spawn(skip_task(rx, tx, skip, w.metrics.clone()));
                rx = next;
            }
            if let Some(size) = rank_batches.filter(|_| i == 0) {
                let name = "source (this rank's rows cut into `batch_rows` batches)";
                let input = slots.first().map_or(schema.clone(), |s| s.input.clone());
                let rebatcher = stage::rebatch::Rebatcher::new(name, size, false, input);
                let (tx, next) = w.new_queue("rank batches".into());
                w.tasks
                    .spawn(rebatch_task(rx, tx, rebatcher, w.pool.clone(), None));
                rx = next;
            }
            if i == slots.len() {
                break;
            }
            match &slots[i].built {
                BuiltStage::Map(_) => {
                    // Past the stages that cut or reorder rows, the rows a stage removes are
                    // counted in each batch's position (before them, the skip task counts
                    // what is left).
                    let past_stateful = i > first_stateful || rank_batches.is_some();
                    (rx, i) =
                        w.spawn_chain(&slots, i, rx, &stage_metrics, past_stateful, keep_empty);
                }
                BuiltStage::Rebatch { size, drop_last } => {
                    rx = w.spawn_rebatch(&slots[i], *size, *drop_last, rx, stage_metrics.get(i));
                    i += 1;
                }
                BuiltStage::Shuffle(spec) => {
                    let mut shuffler = stage::shuffle::Shuffler::new(
                        slots[i].stage.clone(),
                        spec.clone(),
                        collective.clone(),
                        resume.filter(|m| m.shuffle.is_some()),
                    );
                    if kafka {
                        shuffler = shuffler.over_kafka(kafka_resume.as_ref());
                    }
                    rx = w.spawn_shuffle(
                        &slots[i],
                        shuffler,
                        spec.across_ranks,
                        rx,
                        stage_metrics.get(i),
                    );
                    i += 1;
                }
            }
        }
        let Wiring { tasks, metrics, .. } = w;
        Running {
            rx,
            tasks,
            draining: false,
            done: false,
            metrics,
        }
    }
}

/// A run's tasks as they are started, and what each new queue and task is given.
struct Wiring {
    tasks: JoinSet<()>,
    /// The run's counters: each new queue's are added to them.
    metrics: Arc<PipelineMetrics>,
    queue_bytes: u64,
    pool: CpuPool,
    /// Batches a map task has in flight.
    parallelism: usize,
}

impl Wiring {
    /// A new queue of the run, its counters shown under `name`.
    fn new_queue(&self, name: String) -> (Sender, Receiver) {
        let stats = Arc::new(channel::QueueStats::default());
        self.metrics.add_queue(name, stats.clone());
        channel(self.queue_bytes, stats)
    }

    /// Starts one map task for the map stages from `i` on, fused (applied one after the
    /// other on each batch), reading `rx`. Returns the queue after it and the index past
    /// those stages.
    fn spawn_chain(
        &mut self,
        slots: &[StageSlot],
        mut i: usize,
        rx: Receiver,
        stage_metrics: &[Arc<StageMetrics>],
        past_stateful: bool,
        keep_empty: bool,
    ) -> (Receiver, usize) {
        let mut chain = Vec::new();
        while let Some(StageSlot {
            built: BuiltStage::Map(t),
            ..
        }) = slots.get(i)
        {
            chain.push((t.clone(), stage_metrics.get(i).cloned()));
            i += 1;
        }
        let (tx, next) = self.new_queue(format!("{}", slots[i - 1].stage));
        let chain = Chain {
            stages: chain,
            count_removed: past_stateful,
            // The stream's end: what the consumer counts.
            keep_empty: keep_empty && i == slots.len(),
        };
        self.tasks.spawn(map_task(
            rx,
            tx,
            Arc::new(chain),
            self.pool.clone(),
            self.parallelism,
        ));
        (next, i)
    }

    /// Starts the re-batching task of `slot`, reading `rx`; returns the queue after it.
    fn spawn_rebatch(
        &mut self,
        slot: &StageSlot,
        size: usize,
        drop_last: bool,
        rx: Receiver,
        metrics: Option<&Arc<StageMetrics>>,
    ) -> Receiver {
        let rebatcher =
            stage::rebatch::Rebatcher::new(slot.stage.clone(), size, drop_last, slot.input.clone());
        let (tx, next) = self.new_queue(format!("{}", slot.stage));
        self.tasks.spawn(rebatch_task(
            rx,
            tx,
            rebatcher,
            self.pool.clone(),
            metrics.cloned(),
        ));
        next
    }

    /// Starts the task of `slot`'s shuffle, reading `rx` (on blocking threads where it
    /// exchanges rows `across_ranks`); returns the queue after it.
    fn spawn_shuffle(
        &mut self,
        slot: &StageSlot,
        shuffler: stage::shuffle::Shuffler,
        across_ranks: bool,
        rx: Receiver,
        metrics: Option<&Arc<StageMetrics>>,
    ) -> Receiver {
        let (tx, next) = self.new_queue(format!("{}", slot.stage));
        self.tasks.spawn(shuffle_task(
            rx,
            tx,
            shuffler,
            self.pool.clone(),
            metrics.cloned(),
            across_ranks,
        ));
        next
    }
}

/// A started run: the last queue, and every task, each checked to have ended normally.
pub(super) struct Running {
    rx: Receiver,
    tasks: JoinSet<()>,
    draining: bool,
    done: bool,
    metrics: Arc<PipelineMetrics>,
}

impl Running {
    /// The next batch of the last queue; at its end, the first task that failed, if any.
    pub(super) fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Batch>>> {
        if self.done {
            return Poll::Ready(None);
        }
        if !self.draining {
            match self.rx.poll_recv(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(b))) => {
                    self.metrics
                        .rows_out
                        .fetch_add(b.num_rows() as u64, Ordering::Relaxed);
                    self.metrics.batches_out.fetch_add(1, Ordering::Relaxed);
                    self.metrics
                        .bytes_out
                        .fetch_add(b.memory_size() as u64, Ordering::Relaxed);
                    return Poll::Ready(Some(Ok(b)));
                }
                Poll::Ready(Some(Err(e))) => {
                    self.done = true;
                    self.tasks.abort_all();
                    return Poll::Ready(Some(Err(e)));
                }
                Poll::Ready(None) => self.draining = true,
            }
        }
        // The last queue closed: make sure every task ended normally, so a crashed task can
        // never look like the end of the data.
        loop {
            match self.tasks.poll_join_next(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(()))) => continue,
                Poll::Ready(Some(Err(e))) => {
                    self.done = true;
                    self.tasks.abort_all();
                    return Poll::Ready(Some(Err(Error::Internal(format!(
                        "pipeline task failed: {e}"
                    )))));
                }
                Poll::Ready(None) => {
                    self.done = true;
                    return Poll::Ready(None);
                }
            }
        }
    }
}
