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

mod rescale;
mod stamp;

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Instant;

use arrow::datatypes::SchemaRef;
use futures::future::BoxFuture;
use futures::{FutureExt, Stream, StreamExt};
use tokio::task::JoinSet;

use crate::batch::{Batch, Mark};
use crate::collective::Collective;
use crate::config::{
    ConfigDocument, ConfigErrors, Located, PipelineConfig, SourceConfig, StageConfig,
};
use crate::error::{Error, Result, StageRef};
use crate::runtime::channel::{self, Receiver, Sender, channel};
pub use crate::runtime::metrics;
pub use crate::runtime::{CpuPool, PipelineMetrics, SourceMetrics, StageMetrics};
use crate::source::Source;
use crate::source::kafka::KafkaSource;
use crate::source::parquet::ParquetSource;
use crate::stage::{self, BuiltStage, ColumnStats, ComputedStats, Transform};
use crate::state::{Acknowledger, PlanSource, SourceState};

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
        }
    }

    fn rank_and_world(&self) -> (usize, usize) {
        match &self.collective {
            Some(c) => (c.rank(), c.world_size()),
            None => self.config.runtime.rank_and_world(),
        }
    }

    /// Under several ranks, a stage that removes rows before the last stage that cuts
    /// batches (`batch`, `shuffle`): each rank's batch count then depends on its data (its
    /// index, and what to tell the user).
    fn unequal_counts_warning(&self) -> Option<(usize, String)> {
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
    fn check_stage_order(&self, running: bool) -> Result<()> {
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
                        if k.assignment == crate::config::Assignment::Group {
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

    /// The configuration.
    pub fn config(&self) -> &PipelineConfig {
        &self.config
    }

    async fn open_source(
        &self,
        metrics: Arc<PipelineMetrics>,
        acker: Arc<Acknowledger>,
    ) -> Result<Source> {
        let at = &self.config.source.location;
        if self.collective.is_none()
            && let Err(message) = self.config.runtime.checked_rank_and_world()
        {
            // A rank past the last one would get no rows (or another rank's), and "ok".
            return Err(Error::Source {
                at: at.to_string(),
                message,
            });
        }
        match &self.config.source.value {
            SourceConfig::Parquet(p) => Ok(Source::Parquet(Box::new(
                ParquetSource::open(p, &self.base_dir, at).await?,
            ))),
            SourceConfig::Kafka(k) => Ok(Source::Kafka(Box::new(
                KafkaSource::open(
                    k,
                    &self.base_dir,
                    at,
                    self.rank_and_world(),
                    self.resume.as_ref(),
                    acker,
                    metrics,
                )
                .await?,
            ))),
        }
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

    /// Checks the order of the stages, opens the source (lists files, reads footers) and checks
    /// every stage against the schema it will receive, without reading data.
    pub async fn plan(&self) -> Result<Plan> {
        self.check_stage_order(false)?;
        let source = self
            .open_source(Arc::default(), Arc::new(Acknowledger::new(None)))
            .await?;
        if let Source::Parquet(p) = &source {
            p.open_all().await?;
        }
        let mut schema = source.schema().clone();
        let mut stages = Vec::new();
        let mut problems = Vec::new();
        let mut unchecked_from = None;
        let ctx = self.build_context();
        for (i, s) in self.config.stages.iter().enumerate() {
            let sref = self.stage_ref(i);
            let placeholder = placeholder_stats(&s.value);
            match stage::build(&sref, &s.value, &schema, placeholder, &ctx) {
                Ok((_, out)) => {
                    if problems.is_empty() {
                        stages.push((sref, out.clone()));
                    }
                    schema = out;
                }
                Err(e) => {
                    problems.push(e);
                    if !s.value.keeps_columns() {
                        unchecked_from = self
                            .config
                            .stages
                            .get(i + 1)
                            .map(|next| format!("stages[{}] ({})", i + 1, next.value.kind()));
                        break;
                    }
                }
            }
        }
        let summary = match &source {
            Source::Parquet(p) => {
                let mut text = format!(
                    "{} file(s), {} rows",
                    p.num_files().unwrap_or(0),
                    p.total_rows().unwrap_or(0)
                );
                for m in p.mix_shares().unwrap_or_default() {
                    text += &format!(
                        "; mix: `{}` {} of its {} rows each epoch",
                        m.path, m.per_epoch, m.rows
                    );
                }
                text
            }
            Source::Kafka(k) => k.describe(),
        };
        Ok(Plan {
            summary,
            files: source.num_files().unwrap_or(0),
            rows: source.total_rows().unwrap_or(0),
            source_schema: source.schema().clone(),
            stages,
            problems,
            unchecked_from,
        })
    }

    /// Opens the source, builds every stage and computes the statistics `standardize` stages
    /// need (one pass over the data for each such stage).
    pub async fn prepare(&self) -> Result<PreparedPipeline> {
        let acker = Arc::new(Acknowledger::new(self.resume.as_ref()));
        let mut prepared = self
            .prepare_with(Arc::new(PipelineMetrics::default()), acker)
            .await?;
        prepared.prelude = self.prelude();
        Ok(prepared)
    }

    async fn prepare_with(
        &self,
        metrics: Arc<PipelineMetrics>,
        acker: Arc<Acknowledger>,
    ) -> Result<PreparedPipeline> {
        self.check_stage_order(true)?;
        let pool = CpuPool::new(self.config.runtime.threads)?;
        metrics
            .pool_threads
            .store(pool.threads() as u64, Ordering::Relaxed);
        let mut source = self.open_source(metrics.clone(), acker.clone()).await?;
        let resume_mark = self.resume.as_ref().and_then(|s| s.parquet);
        let shuffle = self.config.stages.iter().find_map(|s| match &s.value {
            StageConfig::Shuffle(c) => Some(c.clone()),
            _ => None,
        });
        let in_window = resume_mark.is_some_and(|m| m.shuffle.is_some())
            || self
                .resume
                .as_ref()
                .is_some_and(|s| s.kafka_shuffle.as_ref().is_some_and(|k| k.rows > 0));
        if in_window && shuffle.is_none() {
            return Err(Error::Resume(
                "the checkpoint was taken inside a shuffle stage, but this config has none; resume with the config that wrote it".into(),
            ));
        }
        if let Source::Parquet(p) = &mut source {
            let (rank, world) = self.rank_and_world();
            let order = shuffle.as_ref().filter(|s| s.row_groups).map(|s| s.seed);
            p.configure(order, rank, world, resume_mark);
            if !p.in_listing_order() {
                // The plan (permutation, shares, mix) needs every footer: read them now.
                p.open_all().await?;
            }
            let files = p.clone();
            let plan = Arc::new(PlanSource::new(self.order_settings(), move |mark| {
                files.data_stamp(mark)
            }));
            if let Some(then) = self.resume.as_ref().and_then(|s| s.plan.as_ref()) {
                let mut now = plan.stamp(resume_mark.as_ref());
                if let Some(d) = then.data.as_ref().filter(|d| d.prefix) {
                    // Stamped up to the position: stamp as many files now.
                    now.data = Some(p.prefix_stamp(d.files).await?);
                }
                // At the start of an epoch no setting moves the position: only the files
                // must be the same (`SourceState::next_epoch`, resuming on other ranks).
                let (then, now) = self.comparable(then, now);
                let changed = match resume_mark.is_some_and(|m| m.is_epoch_start()) {
                    true => then.data_differences(&now),
                    false => then.differences(&now),
                };
                if !changed.is_empty() {
                    return Err(Error::Resume(format!(
                        "the state was taken over other files or settings, so its position would point at other rows (rows lost or repeated). What changed: {}. Resume with the files and settings that wrote it, or start over without it",
                        changed.join("; ")
                    )));
                }
            } else if resume_mark.is_some() {
                tracing::warn!(
                    "the resumed state does not record the files and settings it was taken under (written by an older Sluice): they cannot be checked"
                );
            }
            acker.set_plan(plan);
        } else if shuffle.is_some() {
            // A Kafka stream's positions are offsets, valid under any settings; but a window
            // being emitted is permuted by the shuffle's settings.
            let plan = Arc::new(PlanSource::new(self.order_settings(), |_| None));
            if let Some(then) = self.resume.as_ref().and_then(|s| s.plan.as_ref()) {
                let (then, now) = self.comparable(then, plan.stamp(None));
                let changed = then.differences(&now);
                if !changed.is_empty() {
                    return Err(Error::Resume(format!(
                        "the state was taken under other settings, so the shuffle window it was taken in would come out in another order (rows lost or repeated). What changed: {}. Resume with the settings that wrote it, or start over without it",
                        changed.join("; ")
                    )));
                }
            }
            acker.set_plan(plan);
        }
        let mut schema = source.schema().clone();
        let mut slots: Vec<StageSlot> = Vec::new();
        let stage_metrics: Vec<Arc<StageMetrics>> = (0..self.config.stages.len())
            .map(|i| {
                let stage = &self.config.stages[i].value;
                // Every row such a stage removes goes to its dead-letter files first.
                let dead_letters =
                    matches!(stage, StageConfig::Image(c) if c.dead_letter.is_some());
                Arc::new(
                    StageMetrics::new(self.stage_ref(i).to_string(), stage.removed_as())
                        .with_dead_letters(dead_letters),
                )
            })
            .collect();
        let mut frozen = Vec::with_capacity(self.config.stages.len());
        let ctx = self.build_context();
        for (i, s) in self.config.stages.iter().enumerate() {
            let sref = self.stage_ref(i);
            let mut stats = placeholder_stats(&s.value);
            if stats.is_some() {
                // Validate against the schema first, then pay for the pass over the data.
                stage::build(&sref, &s.value, &schema, stats.clone(), &ctx)?;
                let Source::Parquet(parquet) = &source else {
                    return Err(Error::Stage {
                        stage: sref,
                        message: "a Kafka stream has no end to compute statistics over; give `mean` and `std`".into(),
                    });
                };
                let computed = compute_stats(
                    parquet,
                    &slots,
                    &sref,
                    &s.value,
                    &pool,
                    &self.config,
                    schema.clone(),
                )
                .await?;
                for (name, st) in &computed {
                    let note = stats_note(name, st);
                    if st.skipped > 0 || st.count == 0 {
                        tracing::warn!("{sref}: {note}");
                    }
                    stage_metrics[i].note(note);
                }
                frozen.extend(computed.iter().map(|(name, st)| Located {
                    value: StageConfig::Standardize(crate::config::StandardizeConfig {
                        columns: vec![name.clone()],
                        mean: Some(st.mean),
                        std: Some(st.std()),
                        non_finite: None,
                    }),
                    location: s.location.clone(),
                }));
                stats = Some(computed);
            } else {
                frozen.push(s.clone());
            }
            let (built, out) = stage::build(&sref, &s.value, &schema, stats, &ctx)?;
            slots.push(StageSlot {
                stage: sref,
                built,
                input: schema.clone(),
            });
            schema = out;
        }
        let mut notes = link_groups(&mut slots);
        notes.extend(fuse_gathers(
            &self.config.stages,
            &mut slots,
            &schema,
            &ctx,
        )?);
        for (i, note) in notes {
            stage_metrics[i].note(note);
        }
        if shuffle.as_ref().is_some_and(|s| s.across_ranks) && self.rank_and_world().1 == 1 {
            let i = self.shuffle_index();
            let warning = "`across_ranks` has no other rank to exchange rows with (world_size 1): this shuffle stays within the one rank";
            tracing::warn!("{}: {warning}", self.stage_ref(i));
            stage_metrics[i].note(format!("warning: {warning}"));
        }
        if let (Some(sh), Some(rows)) = (&shuffle, source.total_rows()) {
            let per_epoch = rows / self.config.source.value.epochs();
            if (sh.buffer_rows as u64) * 100 < per_epoch {
                let i = self.shuffle_index();
                let warning = format!(
                    "the shuffle window ({} rows) is under 1% of an epoch ({per_epoch} rows): rows move at most one window from where the (permuted) row groups put them; raise `buffer_rows` (spilling keeps memory at `max_memory`)",
                    sh.buffer_rows
                );
                tracing::warn!("{}: {warning}", self.stage_ref(i));
                stage_metrics[i].note(format!("warning: {warning}"));
            }
        }
        if source.split_batch_rows().is_some()
            && let Some((i, warning)) = self.unequal_counts_warning()
        {
            tracing::warn!("{}: {warning}", self.stage_ref(i));
            stage_metrics[i].note(format!("warning: {warning}"));
        }
        metrics.set_stages(stage_metrics);
        if let Some(rows) = source.total_rows() {
            metrics.source.rows_expected.store(rows, Ordering::Relaxed);
        }
        let kafka_resume = matches!(source, Source::Kafka(_));
        Ok(PreparedPipeline {
            source,
            slots,
            schema,
            pool,
            metrics,
            queue_bytes: self.config.runtime.queue_bytes.as_u64(),
            parallelism: self.config.runtime.parallelism,
            acker,
            collective: self.collective.clone(),
            resume: resume_mark,
            kafka_resume: kafka_resume.then(|| self.resume.clone()).flatten(),
            frozen,
            prelude: None,
        })
    }

    /// The pipeline as a stream of batches. Preparation (listing, footers, statistics) happens
    /// on first poll; any error arrives as the stream's first item. Must be polled inside a
    /// tokio runtime.
    pub fn stream(self) -> BatchStream {
        let metrics = Arc::new(PipelineMetrics::default());
        let acker = Arc::new(Acknowledger::new(self.resume.as_ref()));
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

fn placeholder_stats(config: &StageConfig) -> Option<ComputedStats> {
    match config {
        StageConfig::Standardize(c) if c.mean.is_none() && c.std.is_none() => Some(
            c.columns
                .iter()
                .map(|n| (n.clone(), ColumnStats::given(0.0, 1.0)))
                .collect(),
        ),
        _ => None,
    }
}

/// One pass over the source (one epoch) through the stages built so far, accumulating the
/// mean and variance of the columns of a `standardize` stage. NaN and ±inf values stop the
/// pass naming their row, or are left out and counted (`non_finite`); statistics that cannot
/// be computed (no finite value, an overflow) are an error rather than a NaN mean.
async fn compute_stats(
    source: &ParquetSource,
    slots: &[StageSlot],
    sref: &StageRef,
    config: &StageConfig,
    pool: &CpuPool,
    runtime: &PipelineConfig,
    schema: SchemaRef,
) -> Result<ComputedStats> {
    let StageConfig::Standardize(c) = config else {
        return Err(Error::Internal(
            "statistics requested for a non-standardize stage".into(),
        ));
    };
    let prefix: Vec<StageSlot> = slots
        .iter()
        .map(|s| StageSlot {
            stage: s.stage.clone(),
            built: s.built.clone_stage(),
            input: s.input.clone(),
        })
        .collect();
    let prepared = PreparedPipeline {
        source: Source::Parquet(Box::new(source.single_epoch())),
        slots: prefix,
        schema: schema.clone(),
        pool: pool.clone(),
        metrics: Arc::new(PipelineMetrics::default()),
        queue_bytes: runtime.runtime.queue_bytes.as_u64(),
        parallelism: runtime.runtime.parallelism,
        acker: Arc::new(Acknowledger::new(None)),
        collective: None,
        resume: None,
        kafka_resume: None,
        frozen: Vec::new(),
        prelude: None,
    };
    let mut indices = Vec::new();
    for name in &c.columns {
        let i = schema
            .index_of(name)
            .map_err(|_| Error::Internal(format!("column {name} vanished")))?;
        indices.push((name.clone(), i));
    }
    let mut stats: ComputedStats = c
        .columns
        .iter()
        .map(|n| (n.clone(), ColumnStats::empty()))
        .collect();
    let skip = c.non_finite.unwrap_or_default() == crate::config::NonFinite::Skip;
    let mut stream = prepared.stream();
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        let idx = indices.clone();
        let mut st = std::mem::take(&mut stats);
        let sref = sref.clone();
        stats = pool
            .run(move || -> Result<ComputedStats> {
                for ((name, i), (_, s)) in idx.iter().zip(st.iter_mut()) {
                    let first = s.update(batch.data.column(*i)).map_err(|e| Error::Arrow {
                        context: "computing standardize statistics".into(),
                        source: e,
                    })?;
                    let Some(bad) = first else { continue };
                    let row = batch.lineage.describe_row(bad.row as u64);
                    if !skip {
                        return Err(Error::Data {
                            stage: sref,
                            message: format!(
                                "column `{name}` holds {} (not a finite number): its mean and std would not be numbers, and neither would any value this stage writes; set `non_finite: skip` to leave NaN and ±inf values out of the statistics (the run summary counts them), or remove those rows before this stage",
                                bad.value
                            ),
                            rows: row,
                        });
                    }
                    if s.first_skipped.is_none() {
                        s.first_skipped = Some(row);
                    }
                }
                Ok(st)
            })
            .await??;
    }
    for (name, st) in &stats {
        check_stats(sref, name, st)?;
    }
    Ok(stats)
}

/// Refuses statistics that would corrupt every value: none computed although values were
/// seen (all NaN or ±inf), or a mean or variance beyond float64 (values near its limits).
fn check_stats(sref: &StageRef, name: &str, st: &ColumnStats) -> Result<()> {
    let message = if st.count == 0 && st.skipped > 0 {
        format!(
            "every one of the {} non-null values of column `{name}` is NaN or ±inf: there is no mean or std to compute; give `mean` and `std`, or remove those rows first",
            st.skipped
        )
    } else if !(st.mean.is_finite() && st.m2.is_finite()) {
        format!(
            "the mean or variance of column `{name}` overflows float64 (values near ±1.8e308): give `mean` and `std`, or scale the column first"
        )
    } else {
        return Ok(());
    };
    Err(Error::Stage {
        stage: sref.clone(),
        message,
    })
}

/// The run summary's line about one column's computed statistics (`check_stats` has refused
/// the ones that are not numbers).
fn stats_note(name: &str, st: &ColumnStats) -> String {
    if st.count == 0 {
        // No row reached the stage (an empty source, a filter that keeps none) or only nulls:
        // mean 0 and std 1 leave whatever comes later as it is.
        return format!(
            "warning: no values of `{name}` to compute statistics over: mean 0, std 1 (values pass unchanged)"
        );
    }
    let mut note = format!("computed over {} values of `{name}`", st.count);
    if st.skipped > 0 {
        note += &format!(
            ", {} NaN/±inf value(s) left out (`non_finite: skip`; the first at {})",
            st.skipped,
            st.first_skipped.as_deref().unwrap_or("an unknown row")
        );
    }
    note + &format!(": mean {:.6}, std {:.6}", st.mean, st.std())
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

    fn start(self) -> Running {
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
        let mut tasks = JoinSet::new();
        let new_queue = |name: String| {
            let stats = Arc::new(channel::QueueStats::default());
            metrics.add_queue(name, stats.clone());
            channel(queue_bytes, stats)
        };
        let (tx, mut rx) = new_queue("source".into());
        tasks.spawn(source.run(tx, pool.clone(), metrics.clone(), parallelism));
        let stage_metrics = metrics.stages();
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
                let (tx, next) = new_queue("resume".into());
                tasks.spawn(skip_task(rx, tx, skip, metrics.clone()));
                rx = next;
            }
            if let Some(size) = rank_batches.filter(|_| i == 0) {
                let name = "source (this rank's rows cut into `batch_rows` batches)";
                let input = slots.first().map_or(schema.clone(), |s| s.input.clone());
                let rebatcher = stage::rebatch::Rebatcher::new(name, size, false, input);
                let (tx, next) = new_queue("rank batches".into());
                tasks.spawn(rebatch_task(rx, tx, rebatcher, pool.clone(), None));
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
                    let mut chain = Vec::new();
                    while let Some(StageSlot {
                        built: BuiltStage::Map(t),
                        ..
                    }) = slots.get(i)
                    {
                        chain.push((t.clone(), stage_metrics.get(i).cloned()));
                        i += 1;
                    }
                    let (tx, next) = new_queue(format!("{}", slots[i - 1].stage));
                    let chain = Chain {
                        stages: chain,
                        count_removed: past_stateful,
                        // The stream's end: what the consumer counts.
                        keep_empty: keep_empty && i == slots.len(),
                    };
                    tasks.spawn(map_task(rx, tx, Arc::new(chain), pool.clone(), parallelism));
                    rx = next;
                }
                BuiltStage::Rebatch { size, drop_last } => {
                    let rebatcher = stage::rebatch::Rebatcher::new(
                        slots[i].stage.clone(),
                        *size,
                        *drop_last,
                        slots[i].input.clone(),
                    );
                    let (tx, next) = new_queue(format!("{}", slots[i].stage));
                    tasks.spawn(rebatch_task(
                        rx,
                        tx,
                        rebatcher,
                        pool.clone(),
                        stage_metrics.get(i).cloned(),
                    ));
                    rx = next;
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
                    let (tx, next) = new_queue(format!("{}", slots[i].stage));
                    tasks.spawn(shuffle_task(
                        rx,
                        tx,
                        shuffler,
                        pool.clone(),
                        stage_metrics.get(i).cloned(),
                        spec.across_ranks,
                    ));
                    rx = next;
                    i += 1;
                }
            }
        }
        Running {
            rx,
            tasks,
            draining: false,
            done: false,
            metrics,
        }
    }
}

/// Gives each shuffle with `group_by_length` the size of the `batch` stage after it (the
/// stage order was checked: there is one). Returns a note for each.
fn link_groups(slots: &mut [StageSlot]) -> Vec<(usize, String)> {
    let mut notes = Vec::new();
    for i in 0..slots.len() {
        let batch = slots[i + 1..].iter().find_map(|s| match &s.built {
            BuiltStage::Rebatch { size, .. } => Some((*size, s.stage.clone())),
            _ => None,
        });
        if let (BuiltStage::Shuffle(spec), Some((size, at))) = (&mut slots[i].built, batch)
            && let Some(g) = &mut spec.group
        {
            g.batch_size = size;
            notes.push((
                i,
                format!(
                    "groups rows by the length of `{}` for {at}: windows cut into groups of {} batches of {size}",
                    g.name, g.batches
                ),
            ));
        }
    }
    notes
}

/// Lets a shuffle hand a byte column to the `image` stage that consumes it as views into its
/// window instead of copying every row: when the stages after a shuffle are `batch` stages
/// and then an `image` stage that replaces that column, the shuffle emits it as `BinaryView`
/// (see [`stage::shuffle`]) and the stages in between are rebuilt for that schema. The image
/// stage reads each row's bytes once, to convert them; nothing after it sees the difference
/// (its output schema is checked to be unchanged), and the values are identical.
/// `output` is the schema after the last stage. Returns a note for each shuffle it changed.
fn fuse_gathers(
    configs: &[Located<StageConfig>],
    slots: &mut [StageSlot],
    output: &SchemaRef,
    ctx: &stage::BuildContext,
) -> Result<Vec<(usize, String)>> {
    use arrow::datatypes::DataType;
    let mut notes = Vec::new();
    for i in 0..slots.len() {
        let BuiltStage::Shuffle(spec) = &slots[i].built else {
            continue;
        };
        let mut k = i + 1;
        while matches!(
            slots.get(k).map(|s| &s.built),
            Some(BuiltStage::Rebatch { .. })
        ) {
            k += 1;
        }
        let (Some(StageConfig::Image(c)), Some(consumer)) =
            (configs.get(k).map(|s| &s.value), slots.get(k))
        else {
            continue;
        };
        if c.output.as_ref().is_some_and(|o| o != &c.column) {
            continue;
        }
        let input = &slots[i].input;
        let Ok(col) = input.index_of(&c.column) else {
            continue;
        };
        if !matches!(
            input.field(col).data_type(),
            DataType::Binary | DataType::LargeBinary | DataType::FixedSizeBinary(_)
        ) {
            continue;
        }
        let physical: SchemaRef = Arc::new(stage::shuffle::view_schema(input, &[col]));
        let logical_out = slots.get(k + 1).map_or(output, |s| &s.input);
        let (image, out) = stage::build(&consumer.stage, &configs[k].value, &physical, None, ctx)?;
        if &out != logical_out {
            continue;
        }
        let mut spec = spec.clone();
        spec.views = vec![col];
        slots[i].built = BuiltStage::Shuffle(spec);
        for s in &mut slots[i + 1..=k] {
            s.input = physical.clone();
        }
        slots[k].built = image;
        notes.push((
            i,
            format!(
                "hands `{}` to {} as views into its window (the bytes are not copied)",
                c.column, slots[k].stage
            ),
        ));
    }
    Ok(notes)
}

impl BuiltStage {
    fn clone_stage(&self) -> BuiltStage {
        match self {
            BuiltStage::Map(t) => BuiltStage::Map(t.clone()),
            BuiltStage::Rebatch { size, drop_last } => BuiltStage::Rebatch {
                size: *size,
                drop_last: *drop_last,
            },
            BuiltStage::Shuffle(s) => BuiltStage::Shuffle(s.clone()),
        }
    }
}

/// A map stage and its counters.
type MapStage = (Arc<dyn Transform>, Option<Arc<StageMetrics>>);

/// Map stages run one after the other on each batch.
struct Chain {
    stages: Vec<MapStage>,
    /// The chain comes after the last stage that cuts or reorders rows: rows a stage removes
    /// are added to [`Batch::dropped`].
    count_removed: bool,
    /// Deliver batches left with no rows (every rank was promised the same number).
    keep_empty: bool,
}

fn apply_chain(chain: &Chain, mut batch: Batch) -> Result<Batch> {
    for (t, m) in chain.stages.iter() {
        let rows_in = batch.num_rows() as u64;
        let dropped = batch.dropped;
        let start = Instant::now();
        batch = t.apply(batch)?;
        batch.dropped = match chain.count_removed {
            true => dropped + rows_in.saturating_sub(batch.num_rows() as u64),
            false => 0,
        };
        if let Some(m) = m {
            let rows_out = batch.num_rows() as u64;
            m.rows_in.fetch_add(rows_in, Ordering::Relaxed);
            m.rows_out.fetch_add(rows_out, Ordering::Relaxed);
            m.rows_removed
                .fetch_add(rows_in.saturating_sub(rows_out), Ordering::Relaxed);
            m.batches_out.fetch_add(1, Ordering::Relaxed);
            m.busy_ns
                .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
    }
    Ok(batch)
}

async fn map_task(
    mut rx: Receiver,
    tx: Sender,
    chain: Arc<Chain>,
    pool: CpuPool,
    parallelism: usize,
) {
    let keep_empty = chain.keep_empty;
    let input = futures::stream::poll_fn(move |cx| rx.poll_recv(cx));
    let mut out = input
        .map(|item| {
            let chain = chain.clone();
            let pool = pool.clone();
            async move {
                let batch = item?;
                pool.run(move || apply_chain(&chain, batch)).await?
            }
        })
        .buffered(parallelism);
    while let Some(result) = out.next().await {
        match result {
            Ok(b) if b.num_rows() == 0 && !keep_empty => continue,
            Ok(b) => {
                if !tx.send(Ok(b)).await {
                    return;
                }
            }
            Err(e) => {
                tx.send(Err(e)).await;
                return;
            }
        }
    }
}

async fn rebatch_task(
    mut rx: Receiver,
    tx: Sender,
    rebatcher: stage::rebatch::Rebatcher,
    pool: CpuPool,
    metrics: Option<Arc<StageMetrics>>,
) {
    let mut rebatcher = Some(rebatcher);
    // Rows `drop_last` dropped at the ends of epochs.
    let mut dropped = 0u64;
    let removed = |dropped: &mut u64, d: usize| {
        *dropped += d as u64;
        if let Some(m) = &metrics {
            m.rows_removed.fetch_add(d as u64, Ordering::Relaxed);
        }
    };
    let count = |out: &[Batch]| {
        if let Some(m) = &metrics {
            m.batches_out.fetch_add(out.len() as u64, Ordering::Relaxed);
            m.rows_out.fetch_add(
                out.iter().map(|b| b.num_rows() as u64).sum(),
                Ordering::Relaxed,
            );
        }
    };
    loop {
        let item = rx.recv().await;
        let Some(mut rb) = rebatcher.take() else {
            return;
        };
        let result = match item {
            Some(Ok(batch)) => {
                if let Some(m) = &metrics {
                    m.rows_in
                        .fetch_add(batch.num_rows() as u64, Ordering::Relaxed);
                }
                pool.run(move || {
                    let r = rb.push(batch);
                    (rb, r)
                })
                .await
                .map(|(rb, r)| {
                    rebatcher = Some(rb);
                    r
                })
                .and_then(|r| r)
                .map(|(out, d)| {
                    removed(&mut dropped, d);
                    out
                })
            }
            Some(Err(e)) => Err(e),
            None => {
                let finished = rb.finish().map(|(tail, d)| {
                    removed(&mut dropped, d);
                    if let Some(m) = &metrics
                        && dropped > 0
                    {
                        m.note(format!(
                            "drop_last: dropped {dropped} rows in all (each epoch's last rows, fewer than one batch)"
                        ));
                    }
                    tail.into_iter().collect::<Vec<_>>()
                });
                if let Ok(out) = &finished {
                    count(out);
                }
                tx.send_all(finished).await;
                return;
            }
        };
        if let Ok(out) = &result {
            count(out);
        }
        if !tx.send_all(result).await {
            return;
        }
    }
}

/// Passes over the first `skip` rows (a restored run's rows already delivered), counted as
/// `source.rows_replayed`.
async fn skip_task(mut rx: Receiver, tx: Sender, mut skip: u64, metrics: Arc<PipelineMetrics>) {
    let replayed = |n: u64| metrics.source.rows_replayed.fetch_add(n, Ordering::Relaxed);
    while let Some(item) = rx.recv().await {
        let item = match item {
            Ok(b) if skip >= b.num_rows() as u64 => {
                skip -= b.num_rows() as u64;
                replayed(b.num_rows() as u64);
                continue;
            }
            Ok(b) if skip > 0 => {
                let k = skip as usize;
                skip = 0;
                replayed(k as u64);
                Ok(b.slice(k, b.num_rows() - k))
            }
            other => other,
        };
        let failed = item.is_err();
        if !tx.send(item).await || failed {
            return;
        }
    }
}

async fn shuffle_task(
    mut rx: Receiver,
    tx: Sender,
    shuffler: stage::shuffle::Shuffler,
    pool: CpuPool,
    metrics: Option<Arc<StageMetrics>>,
    blocking: bool,
) {
    // Each step runs off the async workers: on the CPU pool, or, when it may wait for other
    // ranks (a collective exchange), on a blocking thread.
    async fn step<T: Send + 'static>(
        pool: &CpuPool,
        blocking: bool,
        sh: stage::shuffle::Shuffler,
        f: impl FnOnce(&mut stage::shuffle::Shuffler) -> Result<T> + Send + 'static,
    ) -> Result<(stage::shuffle::Shuffler, T)> {
        let work = move || {
            let mut sh = sh;
            let r = f(&mut sh);
            r.map(|v| (sh, v))
        };
        if blocking {
            tokio::task::spawn_blocking(work)
                .await
                .map_err(|e| Error::Internal(format!("shuffle task failed: {e}")))?
        } else {
            pool.run(work).await?
        }
    }
    let mut sh = Some(shuffler);
    let mut finished = false;
    loop {
        // Emit everything available before taking more input.
        loop {
            let Some(s) = sh.take() else { return };
            match step(&pool, blocking, s, |s| s.next_output()).await {
                Ok((s, Some(b))) => {
                    if let Some(m) = &metrics {
                        m.rows_out.fetch_add(b.num_rows() as u64, Ordering::Relaxed);
                        m.batches_out.fetch_add(1, Ordering::Relaxed);
                        m.rows_replayed.store(s.stats.replayed, Ordering::Relaxed);
                    }
                    sh = Some(s);
                    if !tx.send(Ok(b)).await {
                        return;
                    }
                }
                Ok((s, None)) => {
                    sh = Some(s);
                    break;
                }
                Err(e) => {
                    tx.send(Err(e)).await;
                    return;
                }
            }
        }
        if finished {
            if let (Some(m), Some(s)) = (&metrics, &sh) {
                m.rows_replayed.store(s.stats.replayed, Ordering::Relaxed);
                if s.stats.runs > 0 {
                    m.note(format!(
                        "spilled {} run(s), {} of zstd Arrow IPC, over {} window(s)",
                        s.stats.runs,
                        bytesize::ByteSize::b(s.stats.bytes_written),
                        s.stats.windows
                    ));
                }
            }
            return;
        }
        let Some(s) = sh.take() else { return };
        let result = match rx.recv().await {
            Some(Ok(b)) => {
                if let Some(m) = &metrics {
                    m.rows_in.fetch_add(b.num_rows() as u64, Ordering::Relaxed);
                }
                step(&pool, false, s, move |s| s.push(b)).await
            }
            Some(Err(e)) => Err(e),
            None => {
                finished = true;
                step(&pool, blocking, s, |s| s.finish()).await
            }
        };
        match result {
            Ok((s, ())) => sh = Some(s),
            Err(e) => {
                tx.send(Err(e)).await;
                return;
            }
        }
    }
}

struct Running {
    rx: Receiver,
    tasks: JoinSet<()>,
    draining: bool,
    done: bool,
    metrics: Arc<PipelineMetrics>,
}

impl Running {
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Batch>>> {
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
