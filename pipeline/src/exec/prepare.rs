//! Preparing a run: opening the source, checking a resumed state against today's files and
//! settings, and building every stage (with the statistics `standardize` computes).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use arrow::datatypes::SchemaRef;

use super::stats::{compute_stats, frozen_values, placeholder_stats, stats_note};
use super::{Pipeline, PreparedPipeline, StageSlot, passes};
use crate::batch::Mark;
use crate::config::Located;
use crate::error::{Error, Result};
use crate::runtime::{CpuPool, PipelineMetrics, StageMetrics};
use crate::source::Source;
use crate::source::SourceConfig;
use crate::source::kafka::KafkaSource;
use crate::source::parquet::{GlobalShuffle, ParquetSource};
use crate::stage::{self, ColumnStats, ShuffleConfig, ShuffleMode, StageConfig};
use crate::state::{Acknowledger, PlanSource};

impl Pipeline {
    /// Opens the source, builds every stage and computes the statistics `standardize` stages
    /// need (one pass over the data for each such stage).
    pub async fn prepare(&self) -> Result<PreparedPipeline> {
        let acker = Arc::new(self.acknowledger());
        let mut prepared = self
            .prepare_with(Arc::new(PipelineMetrics::default()), acker)
            .await?;
        prepared.prelude = self.prelude();
        Ok(prepared)
    }

    /// What [`Pipeline::prepare`] and a stream's first poll do, counting into `metrics` and
    /// reporting positions through `acker`.
    pub(super) async fn prepare_with(
        &self,
        metrics: Arc<PipelineMetrics>,
        acker: Arc<Acknowledger>,
    ) -> Result<PreparedPipeline> {
        self.check_stage_order(true)?;
        self.check_draws()?;
        let pool =
            CpuPool::new(self.config.runtime.threads)?.counting_all(metrics.pool_busy_ns.clone());
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
        self.stamp_plan(&mut source, resume_mark, &shuffle, &acker)
            .await?;
        if let Source::Parquet(p) = &mut source {
            let first = self.config.stages.first().map(|s| &s.value);
            let window = match first {
                Some(StageConfig::Shuffle(c)) => c.gathers_in_memory(p.schema()),
                _ => false,
            };
            p.gathered_next(window && self.global_shuffle().is_none());
        }
        let stage_metrics = self.stage_metrics();
        let ctx = self.build_context();
        let (mut slots, schema, frozen) = self
            .build_stages(&source, &pool, &stage_metrics, &ctx)
            .await?;
        let notes = passes::run(&self.config.stages, &mut slots, &schema, &ctx)?;
        for (i, note) in notes {
            stage_metrics[i].note(note);
        }
        self.warn_about_settings(&shuffle, &source, &stage_metrics);
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

    /// The global shuffle of the stages, if one is `mode: global`.
    fn global_shuffle(&self) -> Option<GlobalShuffle> {
        self.config.stages.iter().find_map(|s| match &s.value {
            StageConfig::Shuffle(c) if c.mode == ShuffleMode::Global => Some(GlobalShuffle {
                seed: c.seed,
                max_memory: c.max_memory.as_u64(),
            }),
            _ => None,
        })
    }

    /// Opens the configured source, as this rank's share of it.
    pub(super) async fn open_source(
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
                ParquetSource::open(p, &self.base_dir, at, self.global_shuffle().is_some()).await?,
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

    /// Gives a Parquet source its order, and the acknowledger the plan a state records
    /// ([`crate::PlanStamp`]); refuses a resumed state taken over other files or settings (a
    /// Kafka stream: other settings of its shuffle).
    async fn stamp_plan(
        &self,
        source: &mut Source,
        resume_mark: Option<Mark>,
        shuffle: &Option<ShuffleConfig>,
        acker: &Acknowledger,
    ) -> Result<()> {
        if let Source::Parquet(p) = source {
            let (rank, world) = self.rank_and_world();
            let global = self.global_shuffle();
            let order = shuffle
                .as_ref()
                .filter(|s| s.row_groups && global.is_none())
                .map(|s| s.seed);
            p.configure(order, global, rank, world, resume_mark);
            if !p.in_listing_order() {
                // The plan (permutation, shares, mix) needs every footer: read them now.
                p.open_all().await?;
            }
            let mut order = self.order_settings();
            if let Some(rows) = p.global_block_rows().await? {
                // A position is (block, row): the block size (from `max_memory` and the
                // files' decoded row size) must be the same to resume at the same rows.
                order.insert(
                    "global shuffle block".to_string(),
                    format!("{rows} rows (max_memory over the decoded row size)"),
                );
            }
            let files = p.clone();
            let plan = Arc::new(PlanSource::new(order, move |mark| files.data_stamp(mark)));
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
        Ok(())
    }

    /// Each stage's counters, named after it.
    fn stage_metrics(&self) -> Vec<Arc<StageMetrics>> {
        (0..self.config.stages.len())
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
            .collect()
    }

    /// Builds every stage against the schema it receives, computing first the statistics of
    /// each `standardize` not given its mean and std (a pass over the data each). Returns the
    /// stages, the schema after the last, and the stage configs with those statistics written
    /// in.
    async fn build_stages(
        &self,
        source: &Source,
        pool: &CpuPool,
        stage_metrics: &[Arc<StageMetrics>],
        ctx: &stage::BuildContext,
    ) -> Result<(Vec<StageSlot>, SchemaRef, Vec<Located<StageConfig>>)> {
        let mut schema = source.schema().clone();
        let mut slots: Vec<StageSlot> = Vec::new();
        let mut frozen = Vec::with_capacity(self.config.stages.len());
        for (i, s) in self.config.stages.iter().enumerate() {
            let sref = self.stage_ref(i);
            let mut stats = placeholder_stats(&s.value);
            if stats.is_some() {
                // Validate against the schema first, then pay for the pass over the data.
                stage::build(&sref, &s.value, &schema, stats.clone(), ctx)?;
                let Source::Parquet(parquet) = source else {
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
                    pool,
                    &self.config,
                    schema.clone(),
                )
                .await?;
                for (name, st) in &computed {
                    let note = stats_note(name, st);
                    if st.iter().any(|s| s.skipped > 0 || s.count == 0) {
                        tracing::warn!("{sref}: {note}");
                    }
                    stage_metrics[i].note(note);
                }
                frozen.extend(computed.iter().map(|(name, each)| Located {
                    value: StageConfig::Standardize(crate::stage::StandardizeConfig {
                        columns: vec![name.clone()],
                        mean: Some(frozen_values(each, |s| s.mean)),
                        std: Some(frozen_values(each, ColumnStats::std)),
                        non_finite: None,
                        per_element: false,
                    }),
                    location: s.location.clone(),
                }));
                stats = Some(computed);
            } else {
                frozen.push(s.clone());
            }
            let (built, out) = stage::build(&sref, &s.value, &schema, stats, ctx)?;
            slots.push(StageSlot {
                stage: sref,
                built,
                input: schema.clone(),
            });
            schema = out;
        }
        Ok((slots, schema, frozen))
    }

    /// Warns, in the log and in the stage's notes, of settings that work but likely not as
    /// meant: a cross-rank shuffle with no other rank, a shuffle window under 1% of an epoch,
    /// and a stage that makes the ranks' batch counts depend on their data.
    fn warn_about_settings(
        &self,
        shuffle: &Option<ShuffleConfig>,
        source: &Source,
        stage_metrics: &[Arc<StageMetrics>],
    ) {
        if shuffle.as_ref().is_some_and(|s| s.across_ranks) && self.rank_and_world().1 == 1 {
            let i = self.shuffle_index();
            let warning = "`across_ranks` has no other rank to exchange rows with (world_size 1): this shuffle stays within the one rank";
            tracing::warn!("{}: {warning}", self.stage_ref(i));
            stage_metrics[i].note(format!("warning: {warning}"));
        }
        let window = shuffle.as_ref().filter(|s| s.mode == ShuffleMode::Window);
        if let (Some(sh), Some(rows)) = (window, source.total_rows()) {
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
    }
}
