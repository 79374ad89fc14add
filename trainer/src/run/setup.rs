//! Setting up one rank: the data's config, its pipeline and tensor stream, the model, the
//! run's length, the trainer and the step log.

use std::fs::File;
use std::io::BufWriter;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use sluice_loader::{LoaderStats, TensorBatch, TensorStream};
use sluice_pipeline::collective::Collective;
use sluice_pipeline::config::Located;
use sluice_pipeline::sources::SourceConfig;
use sluice_pipeline::stages::StageConfig;
use sluice_pipeline::{Acknowledger, Pipeline, PipelineConfig, PipelineMetrics};
use tch::nn::VarStore;
use tokio::runtime::Handle;

use super::resume::{Resumed, resumed_length};
use crate::TrainError;
use crate::config::{Decay, TrainerConfig};
use crate::job::{TrainJob, TrainOptions};
use crate::metrics::TrainingMetrics;
use crate::model::{BoxModel, build, row_shape};
use crate::trainer::{Trainer, TrainerOptions};
use sluice_pipeline::runtime::tensorboard::EventWriter;

/// Models are created one at a time: libtorch's default generator is process-wide, and
/// `manual_seed` + initialisation must not interleave between ranks.
static INIT: Mutex<()> = Mutex::new(());

/// The data's config: `trainer.epochs` overrides the source's.
pub(super) fn data_config(job: &TrainJob) -> PipelineConfig {
    let tc = &job.trainer;
    let mut config = job.pipeline.clone();
    if let (SourceConfig::Parquet(p), Some(e)) = (&mut config.source.value, tc.epochs) {
        p.epochs = e;
    }
    config
}

/// A rank's data side, ready to train on.
pub(super) struct Input {
    /// The batches as tensors on the device.
    pub(super) stream: TensorStream,
    /// The stream's consumer-side counters (data stall and wait, into the report).
    pub(super) stats: Arc<LoaderStats>,
    /// The stages as the pipeline runs them (evaluation keeps the deterministic ones).
    pub(super) frozen: Vec<Located<StageConfig>>,
    /// The rows of the whole plan, where the source can count them ahead.
    pub(super) source_rows: Option<u64>,
    /// Stores Kafka offsets with the consumer group once a checkpoint covers them.
    pub(super) acker: Arc<Acknowledger>,
    /// The pipeline's counters (its notes go into the report).
    pub(super) metrics: Arc<PipelineMetrics>,
    /// The run's live counters, if it has them.
    pub(super) live: Option<Arc<TrainingMetrics>>,
    /// A batch read ahead to learn the input's row shape, trained on first.
    pub(super) first: Option<TensorBatch>,
    /// The shape of one row of the input tensor.
    pub(super) shape: Vec<i64>,
}

/// Prepares this rank's pipeline (at the checkpoint's position for it when resuming) on the
/// `data` collective and starts its tensor stream; reads a first batch where the loader
/// cannot tell the input's row shape from the schema.
pub(super) fn open_data(
    job: &TrainJob,
    rank: usize,
    config: PipelineConfig,
    data: Arc<dyn Collective>,
    resumed: &Option<Resumed>,
    options: &TrainOptions,
    handle: &Handle,
) -> Result<Input, TrainError> {
    let tc = &job.trainer;
    let fresh = super::resume::fresh_state(&config);
    let mut pipeline = Pipeline::from_config(config, job.base_dir.clone()).with_collective(data);
    if let Some((meta, _)) = resumed {
        pipeline = pipeline.resume_from(meta.pipeline.get(rank).cloned().unwrap_or(fresh));
    }
    let prepared = handle.block_on(pipeline.prepare())?;
    let schema = prepared.schema().clone();
    let frozen = prepared.frozen_stages();
    // Cosine decay needs the run's length: count the rows now if the listing is lazy.
    let source_rows = match tc.schedule.decay {
        Decay::Cosine => handle.block_on(prepared.count_source_rows())?,
        _ => prepared.source_rows(),
    };
    let pool = prepared.pool().clone();
    // Kafka offsets are stored with the consumer group only once a checkpoint covering
    // them is durable (or, without checkpoints, at the end of a complete run).
    let acker = prepared.acknowledger();
    let metrics = prepared.metrics();
    let live = options.metrics.clone();
    if let Some(m) = &live {
        m.add_pipeline(rank, prepared.metrics());
    }
    let mut stream = TensorStream::new(prepared.stream(), pool, &job.loader)?;
    let stats = stream.stats();

    let mut first = None;
    let shape = match job.loader.row_shape(&tc.input, &schema) {
        Some(s) => s,
        None => {
            first = handle.block_on(stream.next()).transpose()?;
            first
                .as_ref()
                .and_then(|b| b.get(&tc.input))
                .map(row_shape)
                .unwrap_or_default()
        }
    };
    Ok(Input {
        stream,
        stats,
        frozen,
        source_rows,
        acker,
        metrics,
        live,
        first,
        shape,
    })
}

/// The model for rows of `shape`, initialised from `trainer.seed` (one rank at a time).
pub(super) fn build_model(
    vs: &VarStore,
    tc: &TrainerConfig,
    shape: &[i64],
) -> Result<BoxModel, TrainError> {
    let _one_at_a_time = INIT.lock().unwrap_or_else(|p| p.into_inner());
    tch::manual_seed(tc.seed as i64);
    build(&vs.root(), &tc.model, shape)
}

/// The run's length in steps, the same on every rank (they agree on the smallest, on
/// `grads`): `trainer.steps`, capped by the steps the data makes where it can be counted
/// ahead. Cosine decay needs it.
pub(super) fn total_steps(
    job: &TrainJob,
    source_rows: Option<u64>,
    epochs: u64,
    resumed: &Option<Resumed>,
    grads: &dyn Collective,
) -> Result<Option<u64>, TrainError> {
    let tc = &job.trainer;
    // Steps in the run: from `steps`, else from the rows each rank will see.
    let planned = match (job.batch_size(), source_rows) {
        // `source_rows` counts the whole plan (all epochs, each the same number of rows, also
        // when resuming); a batch never spans epochs, so each epoch ends with its own short
        // (or, with drop_last, dropped) batch.
        (Some((size, drop_last)), Some(rows)) if size > 0 => {
            let (size, per_epoch) = (size as u64, rows / epochs);
            let batches = if drop_last {
                per_epoch / size
            } else {
                per_epoch.div_ceil(size)
            };
            // With `accumulate`, a step takes that many batches of one epoch (the epoch's last
            // step takes what is left).
            let acc = tc.accumulate.max(1);
            let steps = batches.div_ceil(acc);
            Some(match resumed {
                Some((meta, _)) => {
                    resumed_length(meta, epochs, batches, acc).unwrap_or(epochs * steps)
                }
                None => epochs * steps,
            })
        }
        _ => None,
    };
    let planned = match planned {
        Some(p) => Some(grads.all_min_u64(p)?),
        None => {
            // Everyone must agree on "unknown" too.
            let m = grads.all_min_u64(u64::MAX)?;
            (m != u64::MAX).then_some(m)
        }
    };
    let total_steps = match (tc.steps, planned) {
        (Some(s), Some(p)) => Some(s.min(p)),
        (Some(s), None) => Some(s),
        (None, p) => p,
    };
    if tc.schedule.decay == Decay::Cosine && total_steps.is_none() {
        return Err(TrainError::Config(
            "trainer.schedule.decay: cosine needs the run's length, which this source does not tell ahead: set trainer.steps".into(),
        ));
    }
    Ok(total_steps)
}

/// The trainer of the model's variables in `vs` (rank 0's initial weights are broadcast to
/// every rank).
pub(super) fn new_trainer(
    vs: &VarStore,
    tc: &TrainerConfig,
    total_steps: Option<u64>,
    grads: Arc<dyn Collective>,
) -> Result<Trainer, TrainError> {
    Trainer::new(
        vs,
        TrainerOptions {
            optimizer: tc.optimizer.clone(),
            schedule: tc.schedule.clone(),
            total_steps,
            bucket_bytes: (tc.allreduce.bucket_mb * 1e6) as usize,
            compression: tc.allreduce.compression,
            sync: tc.sync,
        },
        grads,
    )
}

/// Rank 0's JSON-lines step log (`trainer.log`), appended to when resuming, else started
/// afresh; `None` on the other ranks and without one.
pub(super) fn open_log(
    job: &TrainJob,
    rank: usize,
    resuming: bool,
) -> Result<Option<BufWriter<File>>, TrainError> {
    let tc = &job.trainer;
    Ok(match (&tc.log, rank) {
        (Some(path), 0) => {
            let path = job.base_dir.join(path);
            if let Some(dir) = path.parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(resuming)
                .write(true)
                .truncate(!resuming)
                .open(&path)
                .map_err(|e| TrainError::Config(format!("trainer.log {}: {e}", path.display())))?;
            Some(BufWriter::new(file))
        }
        _ => None,
    })
}

/// The rank's TensorBoard event file (`trainer.tensorboard`): rank 0's in the folder, every
/// other rank's in `rank<N>/` under it (a run of its own in TensorBoard's list).
pub(super) fn open_tensorboard(
    job: &TrainJob,
    rank: usize,
) -> Result<Option<EventWriter>, TrainError> {
    let Some(dir) = &job.trainer.tensorboard else {
        return Ok(None);
    };
    let mut dir = job.base_dir.join(dir);
    if rank > 0 {
        dir = dir.join(format!("rank{rank}"));
    }
    EventWriter::create(&dir)
        .map(Some)
        .map_err(|e| TrainError::Config(format!("trainer.tensorboard {}: {e}", dir.display())))
}
