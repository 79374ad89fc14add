//! Resuming a run: where its checkpoint is, reading it on rank 0 and handing it to every rank,
//! continuing one written by another number of ranks (`--elastic`) or a finished one asked
//! for more epochs, the trainer restored from it, and the length of the resumed run.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use sluice_pipeline::checkpoint::CheckpointFile;
use sluice_pipeline::collective::Collective;
use sluice_pipeline::sources::SourceConfig;
use sluice_pipeline::storage::resolve;
use sluice_pipeline::{Pipeline, PipelineConfig, SourceState};
use tch::Tensor;
use tokio::runtime::Handle;

use crate::TrainError;
use crate::checkpoint::{CheckpointMeta, decode};
use crate::config::TrainerConfig;
use crate::job::{TrainJob, TrainOptions, TrainReport};
use crate::metrics::TrainingMetrics;
use crate::trainer::Trainer;

/// A checkpoint read back: its metadata and its tensors by name.
pub(super) type Resumed = (CheckpointMeta, BTreeMap<String, Tensor>);

/// Where the run's checkpoint is kept (a local path's folder is created), or `None` when
/// `trainer` has no `checkpoint:`.
pub(super) fn checkpoint_location(job: &TrainJob) -> Result<Option<CheckpointFile>, TrainError> {
    let tc = &job.trainer;
    Ok(match &tc.checkpoint {
        Some(c) => {
            if !c.path.contains("://") {
                let p = job.base_dir.join(&c.path);
                if let Some(dir) = p.parent() {
                    std::fs::create_dir_all(dir).map_err(|e| {
                        TrainError::Checkpoint(format!("cannot create {}: {e}", dir.display()))
                    })?;
                }
            }
            Some(CheckpointFile::new(resolve(
                &c.path,
                &job.base_dir,
                &c.storage,
            )?))
        }
        None => None,
    })
}

/// The checkpoint at `location`, on every rank: rank 0 reads it and broadcasts it (on
/// `grads`), every rank decodes it. One written by another number of ranks is turned into
/// one for this run with `--elastic` (the second value says what happened), else refused.
/// `(None, None)` without a checkpoint.
pub(super) fn read_checkpoint(
    job: &TrainJob,
    rank: usize,
    grads: &dyn Collective,
    options: &TrainOptions,
    handle: &Handle,
    location: &Option<CheckpointFile>,
    config: &PipelineConfig,
) -> Result<(Option<Resumed>, Option<String>), TrainError> {
    let world = grads.world_size();
    let mut resumed: Option<Resumed> = None;
    // Set when the checkpoint came from another number of ranks (`--elastic`): what happened.
    let mut elastic: Option<String> = None;
    if let Some(loc) = location {
        let mut bytes = Vec::new();
        if rank == 0 {
            bytes = fetch_checkpoint(loc, options, handle)?;
        }
        grads.broadcast(&mut bytes, 0)?;
        if !bytes.is_empty() {
            let (mut meta, tensors) = decode(&bytes)
                .map_err(|e| TrainError::Checkpoint(format!("{}: {e}", loc.url())))?;
            if meta.world_size != world && !meta.complete {
                if !options.elastic {
                    return Err(TrainError::Checkpoint(format!(
                        "{} was written by {} ranks, this run has {world}: resume with the same number of workers (a position inside an epoch means rows only under the split it was taken in), or pass --elastic to continue on {world} (the rest of the interrupted epoch is dealt out to the {world} ranks, or, where it cannot be counted ahead, passed over and reported)",
                        loc.url(),
                        meta.world_size
                    )));
                }
                let template = Pipeline::from_config(config.clone(), job.base_dir.clone());
                let note = elastic_resume(&mut meta, world, &template, &loc.url())?;
                if rank == 0 {
                    tracing::warn!("{note}");
                }
                elastic = Some(note);
            }
            resumed = Some((meta, tensors));
        }
    }
    Ok((resumed, elastic))
}

/// Rank 0's read of the checkpoint: its bytes, or none where there is none yet (a warning
/// with `--resume`). One from an earlier run is an error without `--resume`.
fn fetch_checkpoint(
    file: &CheckpointFile,
    options: &TrainOptions,
    handle: &Handle,
) -> Result<Vec<u8>, TrainError> {
    let read = file.read_at_start(options.resume, "training from the beginning");
    let bytes = handle.block_on(read)?;
    Ok(bytes.map(|b| b.to_vec()).unwrap_or_default())
}

/// A finished run goes on when the config now asks for more epochs of a Parquet source
/// (and `steps`, if set, for more steps): training more epochs after the first ones, as
/// when raising a `max_epochs`. The checkpoint's position is the end of its last epoch,
/// so the next epoch starts exactly where an uninterrupted longer run's would.
pub(super) fn continue_finished(
    resumed: &mut Option<Resumed>,
    config: &PipelineConfig,
    epochs: u64,
    tc: &TrainerConfig,
    rank: usize,
) {
    if let Some((meta, _)) = resumed
        && meta.complete
        && matches!(config.source.value, SourceConfig::Parquet(_))
        && let Some(last) = meta.epoch
        && epochs > last.epoch + 1
        && tc.steps.is_none_or(|s| s > meta.step)
    {
        if rank == 0 {
            tracing::info!(
                "the checkpoint finished epoch {} of its run; continuing with epochs {}..{epochs} (the config's `epochs` is now {epochs})",
                last.epoch + 1,
                last.epoch + 2
            );
        }
        meta.complete = false;
    }
}

/// The report of a run whose checkpoint says it is complete: nothing is left to train.
pub(super) fn already_complete(
    meta: &CheckpointMeta,
    (rank, world): (usize, usize),
    started: Instant,
    checkpoint_url: Option<String>,
) -> TrainReport {
    TrainReport {
        rank,
        world_size: world,
        steps: meta.step,
        steps_this_run: 0,
        rows_trained: meta.rows_trained,
        rows_this_run: 0,
        rows_untrained: 0,
        last_loss: None,
        evals: Vec::new(),
        seconds: started.elapsed().as_secs_f64(),
        rows_per_second: 0.0,
        data_stall_fraction: 0.0,
        data_readiness: None,
        loader: None,
        data_stall_per_rank: Vec::new(),
        data_stall_max: 0.0,
        data_wait_seconds: 0.0,
        allreduce_seconds: 0.0,
        wire: Default::default(),
        checkpoint: checkpoint_url,
        interrupted: false,
        already_complete: true,
        notes: Vec::new(),
        elastic: None,
        total_steps: None,
    }
}

/// Loads the checkpoint's model and optimizer state into `trainer` when resuming, and counts
/// the run as resumed in rank 0's live counters.
pub(super) fn restore(
    trainer: &mut Trainer,
    resumed: &Option<Resumed>,
    live_steps: Option<&Arc<TrainingMetrics>>,
    rank: usize,
) -> Result<(), TrainError> {
    if let Some((meta, tensors)) = resumed {
        trainer.restore(tensors, meta.step)?;
        restore_rank_state(trainer, meta, tensors, rank);
        if let Some(m) = live_steps {
            m.resumed(meta.step, meta.rows_trained);
        }
        tracing::info!(rank, step = meta.step, "resumed from the checkpoint");
    }
    Ok(())
}

/// This rank's own state (error-feedback residuals, its local-SGD replica), from the
/// checkpoint's `rank<N>.` tensors when it was written by as many ranks. Otherwise — another
/// number of ranks (`--elastic`), another `sync`/`compression`, or none kept — every rank goes
/// on from the shared state (rank 0's replica; residuals from zero), which is said in the log.
fn restore_rank_state(
    trainer: &mut Trainer,
    meta: &CheckpointMeta,
    tensors: &BTreeMap<String, Tensor>,
    rank: usize,
) {
    let prefix = format!("rank{rank}.");
    let mine: BTreeMap<String, Tensor> = tensors
        .iter()
        .filter_map(|(k, v)| {
            k.strip_prefix(&prefix)
                .map(|n| (n.to_string(), v.shallow_clone()))
        })
        .collect();
    let same_world = meta.world_size == trainer.world_size();
    let same_sync = meta.sync.as_deref() == Some(trainer.sync_description().as_str());
    if !mine.is_empty() && same_world && same_sync {
        if let Err(e) = trainer.restore_rank(&mine) {
            tracing::warn!(
                rank,
                "the checkpoint's per-rank state does not fit: {e}; going on from the shared state"
            );
        }
    } else if trainer.has_rank_state() && meta.step > 0 && rank == 0 {
        tracing::warn!(
            "the checkpoint holds no per-rank state for this run ({}; it was written with {} by {} ranks): every rank goes on from rank 0's replica, error-feedback residuals from zero",
            trainer.sync_description(),
            meta.sync.as_deref().unwrap_or("synchronous all-reduce"),
            meta.world_size
        );
    }
}

/// Turns `meta` (written by `meta.world_size` ranks) into a checkpoint for `world` ranks:
/// the batches the old ranks still owed in the interrupted epoch are dealt out to the new
/// ones ([`Pipeline::rescale`]: each trained once, as the old rank would have made it), then
/// every rank goes on at the next epoch. Where the rest of the epoch cannot be counted
/// ahead, every rank starts at the next epoch and what is passed over is reported. Returns
/// what happened, in words (printed, and `TrainReport::elastic`).
pub(super) fn elastic_resume(
    meta: &mut CheckpointMeta,
    world: usize,
    pipeline: &Pipeline,
    url: &impl std::fmt::Display,
) -> Result<String, TrainError> {
    let head = format!(
        "elastic resume: the checkpoint (step {}) was written by {} ranks, this run has {world}",
        meta.step, meta.world_size
    );
    let next = SourceState::next_epoch(&meta.pipeline)
        .map_err(|e| TrainError::Checkpoint(format!("{url}: --elastic: {e}")))?;
    let done = next
        .interrupted
        .and_then(|e| meta.epoch.filter(|p| p.epoch == e))
        .and_then(|p| p.steps);
    let why_not = match pipeline.rescale(&meta.pipeline, done, world) {
        Ok(states) => {
            let (owed_steps, owed, next_epoch) = match states[0].rescaled.as_deref() {
                Some(r) => (
                    r.batches,
                    states
                        .iter()
                        .filter_map(|s| s.rescaled.as_deref())
                        .flat_map(|r| r.runs.iter().map(|x| x.end - x.first))
                        .sum::<u64>(),
                    r.then.epoch,
                ),
                None => (0, 0, states[0].parquet.map_or(0, |m| m.epoch)),
            };
            let note = match owed {
                0 => format!(
                    "{head}; nothing of the interrupted epoch was left; training continues at the start of epoch {next_epoch}"
                ),
                n => format!(
                    "{head}; the {n} batch(es) the old ranks still owed of epoch {} are dealt out to the {world} ranks ({owed_steps} step(s), each batch trained once, as its old rank would have made it), then training continues at the start of epoch {next_epoch}",
                    next_epoch.saturating_sub(1)
                ),
            };
            meta.pipeline = states;
            meta.epoch = None;
            return Ok(note);
        }
        Err(e) => e,
    };
    let next_epoch = next.state.parquet.map_or(0, |m| m.epoch);
    let passed = match next.interrupted {
        None => "nothing was passed over (no rank had trained on any batch)".to_string(),
        Some(e) => {
            let trained = meta.epoch.filter(|p| p.epoch == e).map(|p| p.rows);
            // The files' stamp `next_epoch` kept (a whole-listing one) counts their rows.
            let total = next
                .state
                .plan
                .as_ref()
                .and_then(|p| p.data.as_ref())
                .map(|d| d.rows);
            let rest = match (trained, total) {
                (Some(t), Some(n)) => format!(
                    "epoch {e}: {t} of its {n} rows had been trained, the other {} are not",
                    n.saturating_sub(t)
                ),
                (Some(t), None) => {
                    format!("epoch {e}: {t} rows had been trained, the rest of it is not")
                }
                _ => format!("the rest of epoch {e} is not trained"),
            };
            format!("{rest} (it cannot be continued exactly: {why_not})")
        }
    };
    meta.pipeline = vec![next.state; world];
    meta.epoch = None;
    Ok(format!(
        "{head}; {passed}; training continues at the start of epoch {next_epoch}"
    ))
}

/// The length in steps of a run resumed from `meta` (its states for this run's ranks, as
/// `elastic_resume` leaves them too), with `batches` per rank per epoch, `epochs` epochs and
/// `acc` batches per step (`trainer.accumulate`, within an epoch): the steps taken, the rest
/// of the current epoch (or of a rescaled one's share), the epochs after it. `None` when the
/// checkpoint does not say where in its epoch it is (older versions). (For a run that never
/// changed its number of ranks this is `epochs × ⌈batches / acc⌉`; after a rescale the
/// earlier epochs had other counts.)
pub(super) fn resumed_length(
    meta: &CheckpointMeta,
    epochs: u64,
    batches: u64,
    acc: u64,
) -> Option<u64> {
    let per_epoch = batches.div_ceil(acc);
    let state = meta.pipeline.first();
    if let Some(r) = state.and_then(|s| s.rescaled.as_deref()) {
        let left = r.batches.saturating_sub(r.delivered).div_ceil(acc);
        return Some(meta.step + left + epochs.saturating_sub(r.then.epoch) * per_epoch);
    }
    if let Some(p) = meta.epoch {
        let done = p.steps?;
        return Some(
            meta.step
                + batches.saturating_sub(done).div_ceil(acc)
                + epochs.saturating_sub(p.epoch + 1) * per_epoch,
        );
    }
    // At the start of an epoch (a run continued at the next epoch on other ranks).
    let at = state?.parquet.filter(|m| m.is_epoch_start())?;
    Some(meta.step + epochs.saturating_sub(at.epoch) * per_epoch)
}

/// This rank's pipeline position in the checkpoint resumed (the start without one, drawing
/// as `runtime.draws` asks: a checkpoint taken before the first step must say so).
pub(super) fn position(
    resumed: &Option<Resumed>,
    rank: usize,
    config: &PipelineConfig,
) -> SourceState {
    resumed
        .as_ref()
        .and_then(|(m, _)| m.pipeline.get(rank).cloned())
        .unwrap_or_else(|| fresh_state(config))
}

/// The position of a run that starts from nothing: the start, drawing as `runtime.draws`
/// asks (else today's way).
pub(super) fn fresh_state(config: &PipelineConfig) -> SourceState {
    SourceState {
        draws: config.runtime.draws.unwrap_or_default(),
        ..SourceState::default()
    }
}
