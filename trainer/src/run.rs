//! `sluice train`: a pipeline file with `loader:` and `trainer:` sections, trained by
//! `workers` data-parallel ranks (threads of this process with the `local` backend, or one
//! process per rank under `mpirun` with `mpi`).
//!
//! Each rank runs its own copy of the pipeline as one rank of the data side (Parquet row
//! groups are split so every rank gets the same number of batches; a `shuffle` with
//! `across_ranks` exchanges rows) and its own model replica. Two collectives connect the
//! ranks: one for the pipeline's row exchange and one for the step handshake, gradients,
//! evaluation and checkpoints, so the two never interleave.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures::StreamExt;
use object_store::{ObjectStoreExt, PutPayload};
use serde::Serialize;
use sluice_pipeline::collective::{Collective, CollectiveError, LocalCollective};
use sluice_pipeline::config::{ImageOp, Located, OneOrMany, SourceConfig, StageConfig};
use sluice_pipeline::storage::resolve;
use sluice_pipeline::{Pipeline, SourceState};
use sluice_sinks::tensor::{TensorStream, parse_device};
use tch::nn::{Module, VarStore};
use tch::{Kind, Reduction, Tensor};
use tokio::runtime::Handle;

use crate::TrainError;
use crate::checkpoint::{CheckpointMeta, EpochProgress, decode, encode};
use crate::config::{Backend, Decay, Loss};
pub use crate::job::{EvalReport, Progress, ProgressFn, TrainJob, TrainOptions, TrainReport};
use crate::model::{build, row_shape};
use crate::trainer::{Trainer, TrainerOptions};

/// Models are created one at a time: libtorch's default generator is process-wide, and
/// `manual_seed` + initialisation must not interleave between ranks.
static INIT: Mutex<()> = Mutex::new(());

/// Trains `job` to the end (or to a requested stop). Blocking: call it from a plain thread
/// or `spawn_blocking`; `handle` runs the pipelines' async work.
pub fn train(
    job: &TrainJob,
    options: &TrainOptions,
    handle: &Handle,
) -> Result<TrainReport, TrainError> {
    if options.resume && job.trainer.checkpoint.is_none() {
        return Err(TrainError::Config(
            "--resume: `trainer` has no `checkpoint:`, so no run of it recorded where it got to; add `checkpoint: {path: …, every_steps: N}` or train without --resume".into(),
        ));
    }
    let world = match job.trainer.allreduce.backend {
        Backend::Local => job.trainer.allreduce.workers,
        Backend::Mpi => {
            let rank =
                move |rank, grads, data| match worker(job, rank, grads, data, options, handle)? {
                    Some(report) => Ok(report),
                    None => Err(TrainError::Internal("no report".into())),
                };
            return crate::mpi_backend::with_world(Box::new(rank));
        }
    };
    let grads = LocalCollective::group(world);
    let data = LocalCollective::group(world);
    let results: Vec<Result<Option<TrainReport>, TrainError>> = std::thread::scope(|s| {
        let handles: Vec<_> = grads
            .into_iter()
            .zip(data)
            .enumerate()
            .map(|(rank, (g, d))| {
                let g: Arc<dyn Collective> = Arc::new(g);
                let d: Arc<dyn Collective> = Arc::new(d);
                std::thread::Builder::new()
                    .name(format!("sluice-rank{rank}"))
                    .spawn_scoped(s, move || worker(job, rank, g, d, options, handle))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| match h {
                Ok(h) => h.join().unwrap_or_else(|p| {
                    Err(TrainError::Internal(format!(
                        "a training thread panicked: {}",
                        panic_message(&p)
                    )))
                }),
                Err(e) => Err(TrainError::Internal(format!(
                    "cannot start a training thread: {e}"
                ))),
            })
            .collect()
    });
    gather_results(results)
}

/// The root cause among the ranks' results (a rank that failed makes the others fail with
/// "left the group"; report the first, not those), else rank 0's report.
pub(crate) fn gather_results(
    results: Vec<Result<Option<TrainReport>, TrainError>>,
) -> Result<TrainReport, TrainError> {
    let mut report = None;
    let mut abandoned = None;
    let mut root = None;
    for r in results {
        match r {
            Ok(Some(rep)) if rep.rank == 0 => report = Some(rep),
            Ok(Some(_)) => {}
            Ok(None) => {}
            Err(TrainError::Collective(e @ CollectiveError::Abandoned { .. })) => {
                abandoned.get_or_insert(TrainError::Collective(e));
            }
            Err(e) => {
                root.get_or_insert(e);
            }
        }
    }
    if let Some(e) = root.or(abandoned) {
        return Err(e);
    }
    report.ok_or_else(|| TrainError::Internal("rank 0 returned no report".into()))
}

fn panic_message(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

/// Turns `meta` (written by `meta.world_size` ranks) into a checkpoint for `world` ranks:
/// the batches the old ranks still owed in the interrupted epoch are dealt out to the new
/// ones ([`Pipeline::rescale`]: each trained once, as the old rank would have made it), then
/// every rank goes on at the next epoch. Where the rest of the epoch cannot be counted
/// ahead, every rank starts at the next epoch and what is passed over is reported. Returns
/// what happened, in words (printed, and `TrainReport::elastic`).
fn elastic_resume(
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
/// `elastic_resume` leaves them too), with `steps` per epoch and `epochs` epochs: the steps
/// taken, the rest of the current epoch (or of a rescaled one's share), the epochs after it.
/// `None` when the checkpoint does not say where in its epoch it is (older versions). (For a
/// run that never changed its number of ranks this is `epochs × steps`; after a rescale the
/// earlier epochs had other counts.)
fn resumed_length(meta: &CheckpointMeta, epochs: u64, steps: u64) -> Option<u64> {
    let state = meta.pipeline.first();
    if let Some(r) = state.and_then(|s| s.rescaled.as_deref()) {
        let left = r.batches.saturating_sub(r.delivered);
        return Some(meta.step + left + epochs.saturating_sub(r.then.epoch) * steps);
    }
    if let Some(p) = meta.epoch {
        let done = p.steps?;
        return Some(
            meta.step + steps.saturating_sub(done) + epochs.saturating_sub(p.epoch + 1) * steps,
        );
    }
    // At the start of an epoch (a run continued at the next epoch on other ranks).
    let at = state?.parquet.filter(|m| m.is_epoch_start())?;
    Some(meta.step + epochs.saturating_sub(at.epoch) * steps)
}

/// How often a rank waiting alone for data looks at the stop flag.
const STOP_POLL: std::time::Duration = std::time::Duration::from_millis(50);

/// The stream's next item, or `None` once `stop` is set while it is still awaited.
async fn next_or_stop<S: futures::Stream + Unpin>(
    stream: &mut S,
    stop: &AtomicBool,
) -> Option<Option<S::Item>> {
    // A flag set from a signal handler has no waker: look at it every STOP_POLL.
    let stopped = async {
        while !stop.load(Ordering::Relaxed) {
            tokio::time::sleep(STOP_POLL).await;
        }
    };
    tokio::select! {
        biased;
        next = stream.next() => Some(next),
        () = stopped => None,
    }
}

/// One rank's training loop and its report (counts over all ranks; data stall and
/// collective time of this rank).
pub(crate) fn worker(
    job: &TrainJob,
    rank: usize,
    grads: Arc<dyn Collective>,
    data: Arc<dyn Collective>,
    options: &TrainOptions,
    handle: &Handle,
) -> Result<Option<TrainReport>, TrainError> {
    let _enter = handle.enter();
    let started = Instant::now();
    let tc = &job.trainer;
    let world = grads.world_size();
    // Intra-op threads per rank: the cores shared out (OpenMP's setting is per thread).
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    tch::set_num_threads(((cores / world).max(1)) as i32);
    let device = parse_device(&job.loader.device)?;

    // The checkpoint: rank 0 reads it and hands it to everyone.
    let location = match &tc.checkpoint {
        Some(c) => {
            if !c.path.contains("://") {
                let p = job.base_dir.join(&c.path);
                if let Some(dir) = p.parent() {
                    std::fs::create_dir_all(dir).map_err(|e| {
                        TrainError::Checkpoint(format!("cannot create {}: {e}", dir.display()))
                    })?;
                }
            }
            Some(resolve(&c.path, &job.base_dir, &c.storage)?)
        }
        None => None,
    };
    let mut resumed: Option<(CheckpointMeta, BTreeMap<String, Tensor>)> = None;
    // The data's config: `trainer.epochs` overrides the source's.
    let mut config = job.pipeline.clone();
    if let (SourceConfig::Parquet(p), Some(e)) = (&mut config.source.value, tc.epochs) {
        p.epochs = e;
    }
    // Set when the checkpoint came from another number of ranks (`--elastic`): what happened.
    let mut elastic: Option<String> = None;
    if let Some(loc) = &location {
        let mut bytes = Vec::new();
        if rank == 0 {
            match handle.block_on(async { loc.store.get(&loc.path).await }) {
                Ok(got) => {
                    if !options.resume {
                        return Err(TrainError::Checkpoint(format!(
                            "{} exists from an earlier run: pass --resume to continue from it, or delete it to start over",
                            loc.url
                        )));
                    }
                    bytes = handle
                        .block_on(got.bytes())
                        .map_err(|e| {
                            TrainError::Checkpoint(format!("{}: cannot read it: {e}", loc.url))
                        })?
                        .to_vec();
                }
                Err(object_store::Error::NotFound { .. }) => {
                    if options.resume {
                        tracing::warn!(
                            "--resume: no checkpoint at {} yet: training from the beginning",
                            loc.url
                        );
                    }
                }
                Err(e) => {
                    return Err(TrainError::Checkpoint(format!(
                        "{}: cannot read it: {e}",
                        loc.url
                    )));
                }
            }
        }
        grads.broadcast(&mut bytes, 0)?;
        if !bytes.is_empty() {
            let (mut meta, tensors) =
                decode(&bytes).map_err(|e| TrainError::Checkpoint(format!("{}: {e}", loc.url)))?;
            if meta.world_size != world && !meta.complete {
                if !options.elastic {
                    return Err(TrainError::Checkpoint(format!(
                        "{} was written by {} ranks, this run has {world}: resume with the same number of workers (a position inside an epoch means rows only under the split it was taken in), or pass --elastic to continue on {world} (the rest of the interrupted epoch is dealt out to the {world} ranks, or, where it cannot be counted ahead, passed over and reported)",
                        loc.url, meta.world_size
                    )));
                }
                let template = Pipeline::from_config(config.clone(), job.base_dir.clone());
                let note = elastic_resume(&mut meta, world, &template, &loc.url)?;
                if rank == 0 {
                    tracing::warn!("{note}");
                }
                elastic = Some(note);
            }
            resumed = Some((meta, tensors));
        }
    }
    let epochs = config.source.value.epochs();
    // A finished run goes on when the config now asks for more epochs of a Parquet source
    // (and `steps`, if set, for more steps): training more epochs after the first ones, as
    // when raising a `max_epochs`. The checkpoint's position is the end of its last epoch,
    // so the next epoch starts exactly where an uninterrupted longer run's would.
    if let Some((meta, _)) = &mut resumed
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
    let checkpoint_url = location.as_ref().map(|l| l.url.to_string());
    if let Some((meta, _)) = &resumed
        && meta.complete
    {
        return Ok(Some(TrainReport {
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
            data_wait_seconds: 0.0,
            allreduce_seconds: 0.0,
            checkpoint: checkpoint_url.clone(),
            interrupted: false,
            already_complete: true,
            notes: Vec::new(),
            elastic: None,
            total_steps: None,
        }));
    }

    // The data.
    let mut pipeline = Pipeline::from_config(config, job.base_dir.clone()).with_collective(data);
    if let Some((meta, _)) = &resumed {
        pipeline = pipeline.resume_from(meta.pipeline.get(rank).cloned().unwrap_or_default());
    }
    let prepared = handle.block_on(pipeline.prepare())?;
    let schema = prepared.schema().clone();
    let frozen = prepared.frozen_stages();
    let source_rows = prepared.source_rows();
    let pool = prepared.pool().clone();
    // Kafka offsets are stored with the consumer group only once a checkpoint covering
    // them is durable (or, without checkpoints, at the end of a complete run).
    let acker = prepared.acknowledger();
    let metrics = prepared.metrics();
    let live = options.metrics.clone();
    if let Some(m) = &live {
        m.add_pipeline(rank, prepared.metrics());
    }
    // Step counters are rank 0's.
    let live_steps = live.as_ref().filter(|_| rank == 0);
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

    // The model: rank 0's initial weights, broadcast.
    let vs = VarStore::new(device);
    let model = {
        let _one_at_a_time = INIT.lock().unwrap_or_else(|p| p.into_inner());
        tch::manual_seed(tc.seed as i64);
        build(&vs.root(), &tc.model, &shape)?
    };

    // Steps in the run: from `steps`, else from the rows each rank will see.
    let planned = match (job.batch_size(), source_rows) {
        // `source_rows` counts the whole plan (all epochs, each the same number of rows, also
        // when resuming); a batch never spans epochs, so each epoch ends with its own short
        // (or, with drop_last, dropped) batch.
        (Some((size, drop_last)), Some(rows)) if size > 0 => {
            let (size, per_epoch) = (size as u64, rows / epochs);
            let steps = if drop_last {
                per_epoch / size
            } else {
                per_epoch.div_ceil(size)
            };
            Some(match &resumed {
                Some((meta, _)) => resumed_length(meta, epochs, steps).unwrap_or(epochs * steps),
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
    let mut trainer = Trainer::new(
        &vs,
        TrainerOptions {
            optimizer: tc.optimizer.clone(),
            schedule: tc.schedule.clone(),
            total_steps,
            bucket_bytes: (tc.allreduce.bucket_mb * 1e6) as usize,
            compression: tc.allreduce.compression,
        },
        grads.clone(),
    )?;
    let mut rows_trained = 0;
    if let Some((meta, tensors)) = &resumed {
        trainer.restore(tensors, meta.step)?;
        rows_trained = meta.rows_trained;
        if let Some(m) = live_steps {
            m.resumed(meta.step, meta.rows_trained);
        }
        tracing::info!(rank, step = meta.step, "resumed from the checkpoint");
    }
    let start_step = trainer.steps();

    let mut log = match (&tc.log, rank) {
        (Some(path), 0) => {
            let path = job.base_dir.join(path);
            if let Some(dir) = path.parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(resumed.is_some())
                .write(true)
                .truncate(resumed.is_none())
                .open(&path)
                .map_err(|e| TrainError::Config(format!("trainer.log {}: {e}", path.display())))?;
            Some(std::io::BufWriter::new(file))
        }
        _ => None,
    };

    let mut ctx = Ctx {
        job,
        rank,
        world,
        handle,
        frozen: &frozen,
        model: model.as_ref(),
        device,
        epoch: resumed.as_ref().and_then(|(m, _)| m.epoch),
    };
    let mut last_state: SourceState = resumed
        .as_ref()
        .and_then(|(m, _)| m.pipeline.get(rank).cloned())
        .unwrap_or_default();
    let mut evals = Vec::new();
    let mut rows_untrained = 0u64;
    let mut rows_this_run = 0u64;
    let mut last_loss = None;
    let mut interrupted = false;
    let loop_started = Instant::now();
    loop {
        if tc.steps.is_some_and(|s| trainer.steps() >= s) {
            break;
        }
        if options.stop.load(Ordering::Relaxed) {
            trainer.request_stop();
        }
        let next = match first.take() {
            Some(b) => Some(b),
            None if world == 1 => match handle.block_on(next_or_stop(&mut stream, &options.stop)) {
                Some(next) => next.transpose()?,
                None => {
                    // Asked to stop while waiting for data (an idle topic): the state after
                    // the last step is whole, so checkpoint it now rather than at a next step
                    // that may never come.
                    ctx.checkpoint(&mut trainer, &location, &last_state, rows_trained, false)?;
                    acker.store(&last_state, false);
                    interrupted = true;
                    break;
                }
            },
            // With several ranks the others wait for this one in the all-reduce, so it waits
            // too; a stop is agreed at the next step (the command's grace period bounds it).
            None => handle.block_on(stream.next()).transpose()?,
        };
        let Some(batch) = next else {
            trainer.finish()?;
            break;
        };
        let (x, y) = match (batch.get(&tc.input), batch.get(&tc.target)) {
            (Some(x), Some(y)) => (x, y),
            _ => {
                return Err(TrainError::Internal(
                    "the loader did not produce the input/target tensors".into(),
                ));
            }
        };
        let (step_started, stepped) = if batch.rows == 0 {
            // Every row of this batch was removed after the last `batch` stage: no forward
            // pass (the mean loss of no rows is NaN), but the step is taken with the others.
            (Instant::now(), trainer.step_empty()?)
        } else {
            let out = model.forward(x);
            let loss = loss_of(tc.loss, &out, y, &tc.target, Reduction::Mean)?;
            (Instant::now(), trainer.step(&loss, batch.rows)?)
        };
        let Some(rep) = stepped else {
            rows_untrained += batch.rows as u64;
            tracing::warn!(
                rank,
                "another rank ran out of data: stopping at step {} with a batch of {} rows untrained",
                trainer.steps(),
                batch.rows
            );
            break;
        };
        let step_time = step_started.elapsed();
        rows_trained += rep.rows;
        rows_this_run += rep.rows;
        if rep.rows > 0 {
            last_loss = Some(rep.loss);
        }
        last_state = batch.state.clone();
        if let Some(e) = last_state.parquet.map(|m| m.epoch) {
            match &mut ctx.epoch {
                Some(p) if p.epoch == e => {
                    p.rows += rep.rows;
                    p.steps = p.steps.map(|s| s + 1);
                }
                _ => {
                    ctx.epoch = Some(EpochProgress {
                        epoch: e,
                        rows: rep.rows,
                        steps: Some(1),
                    })
                }
            }
        }
        if let Some(m) = live_steps {
            m.record_step(
                rep.step,
                rep.rows,
                rep.loss,
                rep.lr,
                batch.waited,
                step_time,
                rep.allreduce,
            );
        }
        if let Some(log) = &mut log {
            write_line(
                log,
                &StepLine {
                    step: rep.step,
                    loss: rep.loss,
                    lr: rep.lr,
                    rows: rep.rows,
                    wait_ms: batch.waited.as_secs_f64() * 1e3,
                    step_ms: step_time.as_secs_f64() * 1e3,
                    allreduce_ms: rep.allreduce.as_secs_f64() * 1e3,
                    epoch: batch.lineage.spans().first().map(|s| s.epoch),
                },
            );
        }
        if tc.check_every_steps > 0 && rep.step % tc.check_every_steps == 0 {
            trainer.check_replicas()?;
        }
        let every = tc.checkpoint.as_ref().map(|c| c.every_steps);
        if every.is_some_and(|e| rep.step % e == 0) || (rep.stop_requested && location.is_some()) {
            ctx.checkpoint(&mut trainer, &location, &last_state, rows_trained, false)?;
            acker.store(&last_state, false);
            if let Some(log) = &mut log {
                write_line(
                    log,
                    &serde_json::json!({"checkpoint": rep.step, "rows_trained": rows_trained}),
                );
            }
        }
        if let Some(ev) = &tc.eval
            && ev.every_steps.is_some_and(|e| rep.step % e == 0)
        {
            let r = ctx.evaluate(&mut trainer)?;
            if let Some(m) = live_steps {
                m.record_eval(&r);
            }
            if let Some(log) = &mut log {
                write_line(log, &serde_json::json!({"eval": &r}));
            }
            evals.push(r);
        }
        if let (Some(p), 0) = (&options.progress, rank) {
            p(&Progress {
                step: rep.step,
                total_steps,
                loss: rep.loss,
                accuracy: evals.last().and_then(|e| e.accuracy),
            });
        }
        if rep.stop_requested {
            interrupted = true;
            break;
        }
    }
    let loop_time = loop_started.elapsed();
    if !interrupted {
        if tc.eval.is_some() && evals.last().is_none_or(|e| e.step != trainer.steps()) {
            let r = ctx.evaluate(&mut trainer)?;
            if let Some(m) = live_steps {
                m.record_eval(&r);
            }
            if let Some(log) = &mut log {
                write_line(log, &serde_json::json!({"eval": &r}));
            }
            evals.push(r);
        }
        if location.is_some() {
            ctx.checkpoint(&mut trainer, &location, &last_state, rows_trained, true)?;
            if let Some(log) = &mut log {
                write_line(
                    log,
                    &serde_json::json!({"checkpoint": trainer.steps(), "rows_trained": rows_trained, "complete": true}),
                );
            }
        }
        acker.store(&last_state, true);
    }
    if tc.check_every_steps > 0 {
        trainer.check_replicas()?;
    }
    if let Some(log) = &mut log {
        let _ = log.flush();
    }
    let untrained = {
        let all = grads.all_gather(rows_untrained.to_le_bytes().to_vec())?;
        all.iter()
            .filter_map(|b| <[u8; 8]>::try_from(b.as_slice()).ok())
            .map(u64::from_le_bytes)
            .sum::<u64>()
    };
    drop(stream);
    let notes = [metrics.source.shard_note(), metrics.source.mix_note()]
        .into_iter()
        .flatten()
        .map(|n| format!("source: {n}"))
        .chain(metrics.stages().iter().flat_map(|s| {
            let notes = s.notes.lock().map(|n| n.clone()).unwrap_or_default();
            notes.into_iter().map(|n| format!("{}: {n}", s.name))
        }))
        .collect();
    Ok(Some(TrainReport {
        rank,
        world_size: world,
        steps: trainer.steps(),
        steps_this_run: trainer.steps() - start_step,
        rows_trained,
        rows_this_run,
        rows_untrained: untrained,
        last_loss,
        evals,
        seconds: started.elapsed().as_secs_f64(),
        rows_per_second: rows_this_run as f64 / loop_time.as_secs_f64().max(1e-9),
        data_stall_fraction: stats.stall_fraction(),
        data_wait_seconds: stats.waited().as_secs_f64(),
        allreduce_seconds: trainer.collective_time.as_secs_f64(),
        checkpoint: checkpoint_url,
        interrupted,
        already_complete: false,
        notes,
        elastic,
        total_steps,
    }))
}

#[derive(Serialize)]
struct StepLine {
    step: u64,
    loss: f64,
    lr: f64,
    rows: u64,
    wait_ms: f64,
    step_ms: f64,
    allreduce_ms: f64,
    epoch: Option<u64>,
}

/// Appends one line to the step log, flushed: a reader following the log (`tail -f`, a
/// dashboard) sees each step when it is taken (one write per step, next to a training step).
fn write_line(w: &mut impl Write, v: &impl Serialize) {
    if let Ok(s) = serde_json::to_string(v) {
        let _ = writeln!(w, "{s}").and_then(|()| w.flush());
    }
}

struct Ctx<'a> {
    job: &'a TrainJob,
    rank: usize,
    world: usize,
    handle: &'a Handle,
    frozen: &'a [Located<StageConfig>],
    model: &'a dyn Module,
    device: tch::Device,
    /// The epoch of the last step and the rows trained in it (into the checkpoint).
    epoch: Option<EpochProgress>,
}

impl Ctx<'_> {
    /// Gathers every rank's pipeline state; rank 0 writes the checkpoint and tells every rank
    /// whether it is durable, so that all return `Ok` only once it is (and may then commit
    /// the Kafka offsets it covers) and all fail together if it could not be written.
    fn checkpoint(
        &mut self,
        trainer: &mut Trainer,
        location: &Option<sluice_pipeline::storage::ObjectLocation>,
        state: &SourceState,
        rows_trained: u64,
        complete: bool,
    ) -> Result<(), TrainError> {
        let Some(loc) = location else { return Ok(()) };
        let mine = serde_json::to_vec(state).map_err(|e| TrainError::Internal(e.to_string()))?;
        let all = trainer.collective().all_gather(mine)?;
        let written = if self.rank == 0 {
            self.write_checkpoint(trainer, loc, &all, rows_trained, complete)
        } else {
            Ok(())
        };
        // The outcome, from rank 0: empty = durable, else the error.
        let mut outcome = match &written {
            Ok(()) => Vec::new(),
            Err(e) => e.to_string().into_bytes(),
        };
        trainer.collective().broadcast(&mut outcome, 0)?;
        written?;
        if outcome.is_empty() {
            Ok(())
        } else {
            Err(TrainError::Checkpoint(format!(
                "rank 0 could not write the checkpoint: {}",
                String::from_utf8_lossy(&outcome)
            )))
        }
    }

    fn write_checkpoint(
        &self,
        trainer: &Trainer,
        loc: &sluice_pipeline::storage::ObjectLocation,
        states: &[Vec<u8>],
        rows_trained: u64,
        complete: bool,
    ) -> Result<(), TrainError> {
        let pipeline = states
            .iter()
            .map(|b| serde_json::from_slice::<SourceState>(b))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| TrainError::Internal(format!("a rank sent a bad pipeline state: {e}")))?;
        let meta = CheckpointMeta {
            version: 1,
            step: trainer.steps(),
            world_size: self.world,
            pipeline,
            rows_trained,
            complete,
            epoch: self.epoch,
        };
        let bytes = encode(&meta, &trainer.state_tensors())?;
        self.handle
            .block_on(loc.store.put(&loc.path, PutPayload::from(bytes)))
            .map_err(|e| TrainError::Checkpoint(format!("{}: cannot write it: {e}", loc.url)))?;
        tracing::info!(step = meta.step, url = %loc.url, "checkpoint written");
        Ok(())
    }

    /// Runs the held-out data through the model; ranks share the batches (batch `i` goes to
    /// rank `i mod world`) and sum their counts, so every row counts exactly once.
    fn evaluate(&mut self, trainer: &mut Trainer) -> Result<EvalReport, TrainError> {
        let job = self.job;
        let Some(ev) = &job.trainer.eval else {
            return Err(TrainError::Internal("no eval section".into()));
        };
        let mut config = job.pipeline.clone();
        if let SourceConfig::Parquet(p) = &mut config.source.value {
            p.path = Some(OneOrMany(ev.path.0.clone()));
            p.manifest = None;
            p.epochs = 1;
            // Every held-out row once: the training data's `mix` weighs other files.
            p.mix = None;
        }
        config.stages = eval_stages(self.frozen);
        config.runtime.rank = Some(0);
        config.runtime.world_size = Some(1);
        config.runtime.threads = Some(1);
        let prepared = self
            .handle
            .block_on(Pipeline::from_config(config, job.base_dir.clone()).prepare())?;
        let pool = prepared.pool().clone();
        let mut stream = TensorStream::new(prepared.stream(), pool, &job.loader)?;
        let (mut loss_sum, mut correct, mut rows) = (0.0f64, 0u64, 0u64);
        let mut i = 0usize;
        while let Some(batch) = self.handle.block_on(stream.next()).transpose()? {
            let mine = i % self.world == self.rank;
            i += 1;
            if !mine {
                continue;
            }
            let (Some(x), Some(y)) = (
                batch.get(&job.trainer.input),
                batch.get(&job.trainer.target),
            ) else {
                continue;
            };
            let (l, c) = tch::no_grad(|| -> Result<(f64, u64), TrainError> {
                let out = self.model.forward(&x.to_device(self.device));
                let t = &job.trainer.target;
                let l = loss_of(job.trainer.loss, &out, y, t, Reduction::Sum)?.double_value(&[]);
                if job.trainer.loss != Loss::CrossEntropy {
                    return Ok((l, 0));
                }
                let class = match soft_labels(&out, y) {
                    true => y.argmax(-1, false),
                    false => y.to_kind(Kind::Int64),
                };
                let c = out
                    .argmax(-1, false)
                    .eq_tensor(&class)
                    .sum(Kind::Int64)
                    .int64_value(&[]);
                Ok((l, c as u64))
            })?;
            loss_sum += l;
            correct += c;
            rows += batch.rows as u64;
        }
        let mut msg = Vec::with_capacity(24);
        msg.extend_from_slice(&loss_sum.to_le_bytes());
        msg.extend_from_slice(&correct.to_le_bytes());
        msg.extend_from_slice(&rows.to_le_bytes());
        let all = trainer.collective().all_gather(msg)?;
        let (mut l, mut c, mut n) = (0.0, 0u64, 0u64);
        for m in all {
            let w = |k: usize| {
                m.get(k * 8..k * 8 + 8)
                    .and_then(|b| <[u8; 8]>::try_from(b).ok())
                    .unwrap_or([0; 8])
            };
            l += f64::from_le_bytes(w(0));
            c += u64::from_le_bytes(w(1));
            n += u64::from_le_bytes(w(2));
        }
        let n_f = n.max(1) as f64;
        let per_output = match job.trainer.loss {
            Loss::Mse => match &job.trainer.model {
                crate::config::ModelConfig::Logreg { outputs }
                | crate::config::ModelConfig::Mlp { outputs, .. }
                | crate::config::ModelConfig::Cnn { outputs, .. } => *outputs as f64,
            },
            Loss::CrossEntropy => 1.0,
        };
        Ok(EvalReport {
            step: trainer.steps(),
            loss: l / n_f / per_output,
            accuracy: (job.trainer.loss == Loss::CrossEntropy).then(|| c as f64 / n_f),
            rows: n,
        })
    }
}

/// Whether `y` holds class probabilities for the logits `out` (a float row per output: one-hot,
/// smoothed or mixup-blended labels) rather than class indices.
fn soft_labels(out: &Tensor, y: &Tensor) -> bool {
    y.is_floating_point() && y.dim() == 2 && y.size() == out.size()
}

/// The loss of the model's output `out` against the target `y`, or, when they do not fit
/// together, an error naming both shapes and what the loss expects.
fn loss_of(
    loss: Loss,
    out: &Tensor,
    y: &Tensor,
    target: &str,
    reduction: Reduction,
) -> Result<Tensor, TrainError> {
    let computed = match loss {
        Loss::CrossEntropy if soft_labels(out, y) => {
            let k = out.kind();
            let per_row = -(y.to_kind(k) * out.log_softmax(-1, k)).sum_dim_intlist(-1, false, k);
            Ok(match reduction {
                Reduction::Sum => per_row.sum(k),
                _ => per_row.mean(k),
            })
        }
        Loss::CrossEntropy => y
            .f_to_kind(Kind::Int64)
            .and_then(|y| out.f_cross_entropy_loss::<Tensor>(&y, None, reduction, -100, 0.0)),
        Loss::Mse => y
            .f_to_kind(out.kind())
            .and_then(|y| y.f_view_as(out))
            .and_then(|y| out.f_mse_loss(&y, reduction)),
    };
    computed.map_err(|e| {
        let first = e.to_string();
        let first = first.lines().next().unwrap_or_default().to_string();
        let expects = match loss {
            Loss::CrossEntropy => format!(
                "`cross_entropy` takes class indices (an integer tensor of shape [{}]) or class probabilities (a float tensor shaped like the output: load a one-hot or mixup column with `dtype: f32`)",
                out.size().first().copied().unwrap_or(0)
            ),
            Loss::Mse => "`mse` takes a float tensor with as many values per row as the output".into(),
        };
        TrainError::Config(format!(
            "the target tensor `{target}` ({:?} {:?}) does not fit the model's output ({:?}): {expects}. libtorch: {first}",
            y.kind(),
            y.size(),
            out.size()
        ))
    })
}

/// The training stages minus the random ones (see [`crate::config::EvalConfig`]).
pub fn eval_stages(frozen: &[Located<StageConfig>]) -> Vec<Located<StageConfig>> {
    frozen
        .iter()
        .filter(|s| {
            !matches!(
                s.value,
                StageConfig::Shuffle(_)
                    | StageConfig::GaussianNoise(_)
                    | StageConfig::FeatureDropout(_)
                    | StageConfig::MaskTokens(_)
                    | StageConfig::Mixup(_)
            )
        })
        .map(|s| {
            let mut s = s.clone();
            if let StageConfig::Image(img) = &mut s.value {
                let [h, w, _] = img.shape;
                // The deterministic counterparts, as torchvision evaluates: a random crop to
                // another size becomes the centre crop, a random resized crop the resize of
                // the whole image; the random flips, jitter, grayscale and erasing go.
                img.ops = std::mem::take(&mut img.ops)
                    .into_iter()
                    .filter_map(|op| match op {
                        ImageOp::HorizontalFlip { .. }
                        | ImageOp::VerticalFlip { .. }
                        | ImageOp::ColorJitter { .. }
                        | ImageOp::RandomGrayscale { .. }
                        | ImageOp::RandomErasing { .. } => None,
                        ImageOp::RandomCrop { size, .. } if size == [h, w] => None,
                        ImageOp::RandomCrop { size, .. } => Some(ImageOp::CenterCrop { size }),
                        ImageOp::RandomResizedCrop { size, .. } => Some(ImageOp::Resize { size }),
                        op => Some(op),
                    })
                    .collect();
            }
            s
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_pipeline::batch::Mark;
    use sluice_pipeline::{BatchRun, Rescaled};

    /// A run's length after a resume: 10 steps per epoch, 3 epochs.
    #[test]
    fn a_resumed_run_counts_its_length_from_where_it_is() {
        let meta =
            |step, epoch: Option<EpochProgress>, pipeline: Vec<SourceState>| CheckpointMeta {
                version: 1,
                step,
                world_size: 1,
                pipeline,
                rows_trained: 0,
                complete: false,
                epoch,
            };
        let progress = |epoch, steps| {
            Some(EpochProgress {
                epoch,
                rows: 0,
                steps,
            })
        };
        // Never rescaled: epochs × steps, wherever it stopped.
        let plain = meta(14, progress(1, Some(4)), vec![SourceState::default()]);
        assert_eq!(resumed_length(&plain, 3, 10), Some(30));
        // Rescaled earlier (25 steps into epoch 1, its old split had other counts): the rest
        // of epoch 1 and all of epoch 2.
        let later = meta(25, progress(1, Some(4)), vec![SourceState::default()]);
        assert_eq!(resumed_length(&later, 3, 10), Some(25 + 6 + 10));
        // Stopped within a rescaled share: 3 of its 7 batches left, then epochs 1 and 2.
        let share = SourceState {
            rescaled: Some(Box::new(Rescaled {
                from: Vec::new(),
                runs: vec![BatchRun {
                    rank: 0,
                    first: 0,
                    end: 7,
                }],
                batches: 7,
                delivered: 4,
                then: Mark::start_of(1),
            })),
            ..SourceState::default()
        };
        let within = meta(18, None, vec![share]);
        assert_eq!(resumed_length(&within, 3, 10), Some(18 + 3 + 20));
        // Continued at the start of epoch 2 on other ranks (`--elastic` without a rescale):
        // that epoch's steps.
        let next = SourceState {
            parquet: Some(Mark::start_of(2)),
            ..SourceState::default()
        };
        let at_start = meta(17, None, vec![next]);
        assert_eq!(resumed_length(&at_start, 3, 10), Some(17 + 10));
        // An older checkpoint without the steps of its epoch.
        let old = meta(14, progress(1, None), vec![SourceState::default()]);
        assert_eq!(resumed_length(&old, 3, 10), None);
    }

    #[test]
    fn evaluation_leaves_out_the_random_stages_and_keeps_the_rest() {
        let p = Pipeline::from_yaml(
            "source: {type: parquet, path: d.parquet}
stages:
  - {type: cast, columns: {x: float32}}
  - {type: gaussian_noise, columns: [x], std: 0.1}
  - type: image
    column: img
    shape: [8, 8, 3]
    ops:
      - random_crop: {size: [8, 8], padding: 1}
      - horizontal_flip: {}
      - color_jitter: {brightness: 0.2, hue: 0.1}
      - random_grayscale: {p: 0.2}
      - normalize: {mean: [0.5, 0.5, 0.5], std: [0.2, 0.2, 0.2]}
      - random_erasing: {p: 0.5}
  - {type: one_hot, column: y, num_classes: 3, smoothing: 0.1}
  - {type: shuffle}
  - {type: feature_dropout, columns: [x], p: 0.1}
  - {type: mask_tokens, column: t, p: 0.1, mask_token: 0}
  - {type: batch, size: 4}
  - {type: mixup, columns: [x, y], alpha: 0.2}
",
        )
        .unwrap();
        let kept: Vec<&str> = eval_stages(&p.config().stages)
            .iter()
            .map(|s| s.value.kind())
            .collect();
        assert_eq!(kept, ["cast", "image", "one_hot", "batch"]);
        let eval = eval_stages(&p.config().stages);
        let StageConfig::Image(img) = &eval[1].value else {
            panic!("{:?}", eval[1].value)
        };
        // Only the deterministic ops stay: a crop to the image's own size is left out too.
        assert!(
            matches!(img.ops[..], [ImageOp::Normalize { .. }]),
            "{:?}",
            img.ops
        );
        // Crops to another size become their centre / whole-image counterparts.
        for (train, eval) in [
            (
                "random_crop: {size: [6, 6], padding: 2}",
                ImageOp::CenterCrop { size: [6, 6] },
            ),
            (
                "random_resized_crop: {size: [4, 5]}",
                ImageOp::Resize { size: [4, 5] },
            ),
        ] {
            let p = Pipeline::from_yaml(&format!(
                "source: {{type: parquet, path: d.parquet}}
stages:
  - {{type: image, column: img, shape: [8, 8, 3], ops: [{{{train}}}, {{horizontal_flip: {{}}}}]}}
"
            ))
            .unwrap();
            let StageConfig::Image(img) = &eval_stages(&p.config().stages)[0].value else {
                panic!()
            };
            assert_eq!(img.ops, [eval], "{train}");
        }
    }
}
