//! Running a pipeline: a task per stage group, connected by byte-bounded queues, CPU work on
//! the bounded pool, and the public [`BatchStream`] at the end.
//!
//! ```text
//! source task ──q──▶ map task (stages 0..k fused, `parallelism` batches in flight, ordered)
//!             ──q──▶ [skip task, when resuming] ──q──▶ shuffle task (window buffer)
//!             ──q──▶ batch task (re-batching) ──q──▶ … ──q──▶ BatchStream (consumer)
//! ```
//! Every task is owned by the stream: dropping the stream cancels the run. A restored run
//! (`Pipeline::resume_from`) passes over already-delivered rows in the skip task, placed just
//! before the first stage that cuts or reorders rows.
//!
//! Checking without data is in `plan` (the rules on the order of stages in `order`); preparing
//! a run in `prepare` (statistics in `stats`, the rewrites of the built stages in `passes`);
//! starting it in `start`, and its tasks in `tasks`.

mod order;
mod passes;
mod plan;
mod prepare;
mod rescale;
mod stamp;
mod start;
mod stats;
mod tasks;

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use arrow::datatypes::SchemaRef;
use futures::future::BoxFuture;
use futures::{FutureExt, Stream, StreamExt};

use self::start::Running;
use crate::batch::{Batch, Mark};
use crate::collective::Collective;
use crate::config::{ConfigDocument, ConfigErrors, Located};
use crate::error::{Error, Result, StageRef};
use crate::pipeline_config::PipelineConfig;
pub use crate::runtime::metrics;
pub use crate::runtime::{CpuPool, PipelineMetrics, SourceMetrics, StageMetrics};
use crate::source::Source;
use crate::stage::{self, BuiltStage, StageConfig};
use crate::state::{Acknowledger, Draws, SourceState};

/// A pipeline description, ready to be checked or run.
///
/// ```no_run
/// # async fn demo() -> sluice_pipeline::Result<()> {
/// use futures::StreamExt;
/// let mut batches = sluice_pipeline::Pipeline::from_path("configs/quickstart.yaml")?.stream();
/// while let Some(batch) = batches.next().await {
///     let batch = batch?;
///     println!("{} rows from {}", batch.num_rows(), batch.lineage);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Pipeline {
    config: PipelineConfig,
    base_dir: PathBuf,
    resume: Option<SourceState>,
    collective: Option<Arc<dyn Collective>>,
    /// From a rescaled state ([`Pipeline::rescale`]): the share of an interrupted epoch
    /// delivered before `resume` (which is then the start of the next epoch), and the files'
    /// stamp of that state.
    prelude: Option<(crate::state::Rescaled, Option<crate::state::PlanStamp>)>,
}

/// What a pipeline will do, found without reading data: files, and the schema after each
/// stage.
#[derive(Debug)]
pub struct Plan {
    /// What the source reads, in words (`3 file(s), 1437 rows`, `kafka: 4 partition(s) of
    /// events`).
    pub summary: String,
    /// Number of files the source will read.
    pub files: usize,
    /// Rows the source will produce (all epochs).
    pub rows: u64,
    /// Schema produced by the source.
    pub source_schema: SchemaRef,
    /// Each stage and the schema it produces, up to the first one that could not be built.
    pub stages: Vec<(StageRef, SchemaRef)>,
    /// The stages that could not be built, each with why. Checking goes on past one that
    /// keeps its input's columns (a `filter`, `clip`, …: the next stage sees the same
    /// schema either way) and stops at any other (its output is unknown).
    pub problems: Vec<Error>,
    /// Stages left unchecked after a problem, if any: `stages[i] (kind)` of the first.
    pub unchecked_from: Option<String>,
}

struct StageSlot {
    stage: StageRef,
    built: BuiltStage,
    /// Schema the stage receives.
    input: SchemaRef,
}

impl Pipeline {
    /// Loads a pipeline from a YAML file; relative paths in it resolve against its directory.
    pub fn from_path(path: impl AsRef<Path>) -> Result<Self> {
        Self::from_document(&ConfigDocument::from_path(path)?)
    }

    /// Loads a pipeline from YAML text; relative paths resolve against the current directory.
    pub fn from_yaml(text: &str) -> Result<Self> {
        Self::from_document(&ConfigDocument::from_str(text, "<yaml>", ".")?)
    }

    /// Reads the pipeline sections of a document, reporting every problem at once.
    pub fn from_document(doc: &ConfigDocument) -> Result<Self> {
        let mut errors = Vec::new();
        let config = PipelineConfig::from_document(doc, &mut errors);
        match config {
            Some(config) if errors.is_empty() => Ok(Pipeline {
                config,
                base_dir: doc.base_dir().to_path_buf(),
                resume: None,
                collective: None,
                prelude: None,
            }),
            _ => Err(Error::Config(ConfigErrors::sorted(errors))),
        }
    }

    /// A pipeline from an already-built config.
    pub fn from_config(config: PipelineConfig, base_dir: impl Into<PathBuf>) -> Self {
        Pipeline {
            config,
            base_dir: base_dir.into(),
            resume: None,
            collective: None,
            prelude: None,
        }
    }

    /// Continues from a checkpointed state (see [`Acknowledger::commit`], or
    /// [`BatchStream::snapshot`]): a `static` Kafka source starts each partition exactly where
    /// the state says; a Parquet pipeline continues at the exact row, shuffle window included.
    /// A Parquet state records the files and the order-deciding settings it was taken under
    /// ([`crate::PlanStamp`]); if they changed, preparing fails with [`Error::Resume`] naming
    /// what changed, rather than continuing at other rows.
    ///
    /// A state made by [`Pipeline::rescale`] first delivers its share of the interrupted
    /// epoch, then continues at the start of the next one.
    pub fn resume_from(mut self, mut state: SourceState) -> Self {
        match state.rescaled.take() {
            Some(share) => {
                self.resume = Some(rescale::after(&state.plan, &share));
                self.prelude = Some((*share, state.plan));
            }
            None => {
                self.resume = Some(state);
                self.prelude = None;
            }
        }
        self
    }

    /// This pipeline's share of a rescaled epoch, if it has one.
    fn prelude(&self) -> Option<rescale::Prelude> {
        let template = Pipeline {
            config: self.config.clone(),
            base_dir: self.base_dir.clone(),
            resume: None,
            collective: None,
            prelude: None,
        };
        self.prelude
            .clone()
            .map(|(share, plan)| rescale::Prelude::new(template, share, plan))
    }

    /// Runs this pipeline as one rank of `collective`: rank and world size come from it (not
    /// from `runtime`), and a `shuffle` with `across_ranks` exchanges rows through it.
    pub fn with_collective(mut self, collective: Arc<dyn Collective>) -> Self {
        self.collective = Some(collective);
        self
    }

    /// What building the stages needs.
    fn build_context(&self) -> stage::BuildContext {
        stage::BuildContext {
            base_dir: self.base_dir.clone(),
            rank: self.rank_and_world().0,
            draws: self.draws(),
        }
    }

    /// How this run draws `gaussian_noise`: as the resumed state was drawn, else as
    /// `runtime.draws` says, else today's way ([`Draws`]).
    fn draws(&self) -> Draws {
        match &self.resume {
            Some(s) => s.draws,
            None => self.config.runtime.draws.unwrap_or_default(),
        }
    }

    /// The acknowledger of a run: from the resumed state, recording this run's draws.
    fn acknowledger(&self) -> Acknowledger {
        Acknowledger::new(self.resume.as_ref()).drawing(self.draws())
    }

    /// Refuses a resumed state drawn otherwise than `runtime.draws` asks.
    fn check_draws(&self) -> Result<()> {
        match (&self.resume, self.config.runtime.draws) {
            (Some(s), Some(asked)) if s.draws != asked => Err(Error::Resume(format!(
                "the state was written by a run whose augmentations drew with version {} and `runtime.draws` asks for {}: a resumed run keeps its draws, so its values continue exactly. Remove `runtime.draws` (or set it to {}), or start over without the state",
                u32::from(s.draws),
                u32::from(asked),
                u32::from(s.draws)
            ))),
            _ => Ok(()),
        }
    }

    fn rank_and_world(&self) -> (usize, usize) {
        match &self.collective {
            Some(c) => (c.rank(), c.world_size()),
            None => self.config.runtime.rank_and_world(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &PipelineConfig {
        &self.config
    }

    /// The index of the (first) `shuffle` stage, 0 without one.
    fn shuffle_index(&self) -> usize {
        self.config
            .stages
            .iter()
            .position(|s| matches!(s.value, StageConfig::Shuffle(_)))
            .unwrap_or(0)
    }

    /// The size of the first `batch` stage after stage `i` (what a shuffle's
    /// `group_by_length` groups for).
    fn batch_after(&self, i: usize) -> Option<usize> {
        self.config.stages[i + 1..]
            .iter()
            .find_map(|s| match &s.value {
                StageConfig::Batch(b) => Some(b.size),
                _ => None,
            })
    }

    /// The size of the last `batch` stage: rows per batch the stream delivers.
    fn last_batch_size(&self) -> Option<u64> {
        self.config
            .stages
            .iter()
            .rev()
            .find_map(|s| match &s.value {
                StageConfig::Batch(b) => Some(b.size.max(1) as u64),
                _ => None,
            })
    }

    fn stage_ref(&self, index: usize) -> StageRef {
        let s = &self.config.stages[index];
        StageRef {
            index,
            kind: s.value.kind(),
            location: Some(s.location.clone()),
        }
    }

    /// The pipeline as a stream of batches. Preparation (listing, footers, statistics) happens
    /// on first poll; any error arrives as the stream's first item. Must be polled inside a
    /// tokio runtime.
    pub fn stream(self) -> BatchStream {
        let metrics = Arc::new(PipelineMetrics::default());
        let acker = Arc::new(self.acknowledger());
        let (m, a) = (metrics.clone(), acker.clone());
        let delivered = acker.follower(self.resume.as_ref());
        let mut prelude = self.prelude();
        if let Some(p) = &mut prelude {
            p.set_metrics(metrics.clone());
        }
        BatchStream {
            state: State::Preparing(async move { self.prepare_with(m, a).await }.boxed()),
            metrics,
            acker,
            delivered,
            prelude,
        }
    }
}

/// A pipeline whose source is open and whose stages are built: [`PreparedPipeline::stream`]
/// starts it.
#[derive(Debug)]
pub struct PreparedPipeline {
    source: Source,
    slots: Vec<StageSlot>,
    schema: SchemaRef,
    pool: CpuPool,
    metrics: Arc<PipelineMetrics>,
    queue_bytes: u64,
    parallelism: Option<usize>,
    acker: Arc<Acknowledger>,
    collective: Option<Arc<dyn Collective>>,
    /// Where a restored Parquet run continues (rows to skip, shuffle window).
    resume: Option<Mark>,
    /// The state a Kafka pipeline resumes from (its shuffle rebuilds its window from it).
    kafka_resume: Option<SourceState>,
    /// The stage configs with every computed statistic written in (see
    /// [`PreparedPipeline::frozen_stages`]).
    frozen: Vec<Located<StageConfig>>,
    /// A rescaled run's share of the interrupted epoch, delivered first.
    prelude: Option<rescale::Prelude>,
}

impl std::fmt::Debug for StageSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.stage)
    }
}

impl PreparedPipeline {
    /// Schema of the batches the stream yields.
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// Counters of this run.
    pub fn metrics(&self) -> Arc<PipelineMetrics> {
        self.metrics.clone()
    }

    /// The CPU pool this pipeline runs on (sinks encode on it too).
    pub fn pool(&self) -> &CpuPool {
        &self.pool
    }

    /// Rows the source will produce over all epochs, when already known (files are opened
    /// as reading proceeds, so a large listing may not be complete before the run starts).
    pub fn source_rows(&self) -> Option<u64> {
        self.source.total_rows()
    }

    /// [`PreparedPipeline::source_rows`], reading every remaining Parquet footer first if the
    /// listing is not complete yet (a one-rank run opens files as it reads them): for a
    /// schedule that needs the run's length. `None` for a stream.
    pub async fn count_source_rows(&self) -> Result<Option<u64>> {
        if let Source::Parquet(p) = &self.source
            && self.source.total_rows().is_none()
        {
            p.open_all().await?;
        }
        Ok(self.source.total_rows())
    }

    /// Reports what the consumer has durably taken; see [`Acknowledger`].
    pub fn acknowledger(&self) -> Arc<Acknowledger> {
        self.acker.clone()
    }

    /// The stages as configured, except that each `standardize` whose mean and std were
    /// computed over the source is replaced by one `standardize` per column with the computed
    /// values written in: the same preprocessing, applicable to other data (an evaluation
    /// split, serving) without another pass and without drifting from what training saw.
    pub fn frozen_stages(&self) -> Vec<Located<StageConfig>> {
        self.frozen.clone()
    }

    /// Starts the run. Must be called inside a tokio runtime.
    pub fn stream(mut self) -> BatchStream {
        let metrics = self.metrics.clone();
        let acker = self.acker.clone();
        let delivered = acker.follower(Some(&acker.peek_state()));
        let mut prelude = self.prelude.take();
        if let Some(p) = &mut prelude {
            p.set_schema(self.schema.clone());
            p.set_metrics(metrics.clone());
        }
        let state = match prelude {
            Some(_) => State::Ready(Box::new(self)),
            None => State::Running(self.start()),
        };
        BatchStream {
            state,
            metrics,
            acker,
            delivered,
            prelude,
        }
    }
}

enum State {
    Preparing(BoxFuture<'static, Result<PreparedPipeline>>),
    /// Prepared, not started: a rescaled run's share of the interrupted epoch comes first,
    /// and starting now would hold a second pipeline's queues and window meanwhile.
    Ready(Box<PreparedPipeline>),
    Running(Running),
    Done,
}

/// The pipeline's output: a `Stream` of [`Batch`]es (`Result<Batch>` items). The first error
/// ends the stream. Dropping it cancels the run.
pub struct BatchStream {
    state: State,
    metrics: Arc<PipelineMetrics>,
    acker: Arc<Acknowledger>,
    /// Positions just past every batch this stream has yielded.
    delivered: Acknowledger,
    /// A rescaled run's share of the interrupted epoch, delivered before the stream's own.
    prelude: Option<rescale::Prelude>,
}

impl std::fmt::Debug for BatchStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchStream").finish_non_exhaustive()
    }
}

impl BatchStream {
    /// Live counters of this run (rows, bytes, per stage, queues).
    pub fn metrics(&self) -> Arc<PipelineMetrics> {
        self.metrics.clone()
    }

    /// Where to report batches the consumer has durably taken, so that Kafka offsets (and
    /// checkpoints) advance only past them. See [`Acknowledger`].
    pub fn acknowledger(&self) -> Arc<Acknowledger> {
        self.acker.clone()
    }

    /// The state just past the last batch this stream yielded: small, serialisable (serde),
    /// and enough for [`Pipeline::resume_from`] to continue with exactly the next batch —
    /// shuffle window, augmentation draws and rank share included. (A sink that buffers
    /// should checkpoint through [`BatchStream::acknowledger`] instead, after it flushed.)
    pub fn snapshot(&self) -> SourceState {
        match &self.prelude {
            Some(p) => p.snapshot(),
            None => self.delivered.state(),
        }
    }
}

impl Stream for BatchStream {
    type Item = Result<Batch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            // A rescaled run's share of the interrupted epoch comes first (once prepared).
            if matches!(self.state, State::Ready(_) | State::Running(_))
                && let Some(p) = self.prelude.as_mut()
            {
                if p.finished() {
                    self.prelude = None;
                    continue;
                }
                let item = p.poll_next_unpin(cx);
                if let Poll::Ready(Some(Err(_))) = &item {
                    self.state = State::Done;
                }
                return item;
            }
            match &mut self.state {
                State::Preparing(fut) => match fut.poll_unpin(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Ok(prepared)) => {
                        if let Some(plan) = prepared.acker.plan() {
                            self.delivered.set_plan(plan);
                        }
                        if let Some(p) = &mut self.prelude {
                            p.set_schema(prepared.schema.clone());
                        }
                        self.state = match self.prelude {
                            Some(_) => State::Ready(Box::new(prepared)),
                            None => State::Running(prepared.start()),
                        };
                    }
                    Poll::Ready(Err(e)) => {
                        self.state = State::Done;
                        return Poll::Ready(Some(Err(e)));
                    }
                },
                State::Running(r) => {
                    let item = r.poll_next(cx);
                    if let Poll::Ready(Some(Ok(b))) = &item {
                        self.delivered.observe_batch(b);
                    }
                    return item;
                }
                State::Ready(_) => {
                    if let State::Ready(prepared) = std::mem::replace(&mut self.state, State::Done)
                    {
                        self.state = State::Running(prepared.start());
                    }
                }
                State::Done => return Poll::Ready(None),
            }
        }
    }
}
