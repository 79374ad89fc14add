//! `sluice train`: a pipeline file with `loader:` and `trainer:` sections, trained by
//! `workers` data-parallel ranks (threads of this process with the `local` backend, or one
//! process per rank under `mpirun` with `mpi`).
//!
//! Each rank runs its own copy of the pipeline as one rank of the data side (Parquet row
//! groups are split so every rank gets the same number of batches; a `shuffle` with
//! `across_ranks` exchanges rows) and its own model replica. Two collectives connect the
//! ranks: one for the pipeline's row exchange and one for the step handshake, gradients,
//! evaluation and checkpoints, so the two never interleave.

mod async_steps;
mod checkpoint;
mod eval;
mod loss;
mod resume;
mod server;
mod setup;
mod steps;
#[cfg(test)]
mod tests;

use std::fs::File;
use std::io::BufWriter;
use std::sync::Arc;
use std::time::Instant;

use sluice_loader::{TensorBatch, TensorStream, parse_device};
use sluice_pipeline::checkpoint::CheckpointFile;
use sluice_pipeline::collective::{Collective, CollectiveError, LocalCollective};
use sluice_pipeline::config::Located;
use sluice_pipeline::stages::StageConfig;
use sluice_pipeline::{Acknowledger, PipelineMetrics, SourceState};
use tch::nn::{Module, VarStore};
use tokio::runtime::Handle;

use crate::TrainError;
use crate::checkpoint::EpochProgress;
use crate::config::{Backend, SyncConfig};
pub use crate::job::{EvalReport, Progress, ProgressFn, TrainJob, TrainOptions, TrainReport};
use crate::metrics::ReduceCost;
use crate::metrics::TrainingMetrics;
use crate::trainer::Trainer;
pub use eval::eval_stages;

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
            let rank = move |rank, grads, data| match worker(
                job, rank, grads, data, options, handle, None,
            )? {
                Some(report) => Ok(report),
                None => Err(TrainError::Internal("no report".into())),
            };
            return crate::mpi_backend::with_world(Box::new(rank));
        }
    };
    let grads = LocalCollective::group(world);
    let data = LocalCollective::group(world);
    // `sync: async`: the parameter server runs on this thread, each rank linked to it.
    let (mut links, server) = match job.trainer.sync {
        SyncConfig::Async {
            staleness,
            on_failure,
        } => {
            let (to_server, rx) = std::sync::mpsc::channel();
            let (to, from): (Vec<_>, Vec<_>) =
                (0..world).map(|_| std::sync::mpsc::channel()).unzip();
            let links = from
                .into_iter()
                .map(|from_server| {
                    Some(server::Link {
                        to_server: to_server.clone(),
                        from_server,
                    })
                })
                .collect();
            let location = resume::checkpoint_location(job)?;
            (links, Some((rx, to, location, (staleness, on_failure))))
        }
        _ => ((0..world).map(|_| None).collect::<Vec<_>>(), None),
    };
    let (results, served) = std::thread::scope(|s| {
        let handles: Vec<_> = grads
            .into_iter()
            .zip(data)
            .enumerate()
            .map(|(rank, (g, d))| {
                let g: Arc<dyn Collective> = Arc::new(g);
                let d: Arc<dyn Collective> = Arc::new(d);
                let link = links[rank].take();
                std::thread::Builder::new()
                    .name(format!("sluice-rank{rank}"))
                    .spawn_scoped(s, move || {
                        rank_thread(job, rank, (g, d), options, handle, link)
                    })
            })
            .collect();
        let served = server.map(|(rx, to, location, staleness)| {
            server::serve(job, options, handle, location, rx, to, staleness)
        });
        let results: Vec<Result<Option<TrainReport>, TrainError>> = handles
            .into_iter()
            .map(|h| match h {
                Ok(h) => h.join().unwrap_or_else(|p| {
                    Err(TrainError::Internal(format!(
                        "a training thread panicked: {}",
                        sluice_pipeline::runtime::panic_message(p.as_ref())
                    )))
                }),
                Err(e) => Err(TrainError::Internal(format!(
                    "cannot start a training thread: {e}"
                ))),
            })
            .collect();
        (results, served)
    });
    match served {
        Some(served) => served.and_then(|s| server_report(job, s, results)),
        None => gather_results(results),
    }
}

/// Rank 0's report under `sync: async`, with the server's notes. Under `on_failure:
/// continue` the ranks that failed (their errors are the server's notes) do not fail the run.
fn server_report(
    job: &TrainJob,
    s: server::ServerReport,
    results: Vec<Result<Option<TrainReport>, TrainError>>,
) -> Result<TrainReport, TrainError> {
    let results = results
        .into_iter()
        .enumerate()
        .filter(|(rank, _)| !s.failed.iter().any(|(f, _)| f == rank))
        .map(|(_, r)| r)
        .collect();
    let mut r = gather_results(results)?;
    let bound = match job.trainer.sync {
        SyncConfig::Async { staleness, .. } => staleness,
        _ => 0,
    };
    if s.updates > 0 {
        r.notes.push(format!(
            "parameter server: {} updates, staleness at most {} (bound {bound})",
            s.updates, s.max_staleness
        ));
    }
    r.notes.extend(s.failed.iter().map(|(rank, e)| {
        format!(
            "rank {rank} failed and the others went on (on_failure: continue): {e}; the rest of its data is untrained and the checkpoint is not complete: fix the cause and --resume to train it"
        )
    }));
    Ok(r)
}

/// A rank's thread: its worker, and under `sync: async` a failure (or panic) told to the
/// parameter server, so that it stops the others instead of waiting for this rank.
fn rank_thread(
    job: &TrainJob,
    rank: usize,
    (grads, data): (Arc<dyn Collective>, Arc<dyn Collective>),
    options: &TrainOptions,
    handle: &Handle,
    link: Option<server::Link>,
) -> Result<Option<TrainReport>, TrainError> {
    let tell = link.as_ref().map(|l| l.to_server.clone());
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        worker(job, rank, grads, data, options, handle, link)
    }))
    .unwrap_or_else(|p| {
        Err(TrainError::Internal(format!(
            "a training thread panicked: {}",
            sluice_pipeline::runtime::panic_message(p.as_ref())
        )))
    });
    if let (Err(e), Some(tell)) = (&result, tell) {
        let _ = tell.send(server::ToServer::Failed {
            rank,
            error: e.to_string(),
        });
    }
    result
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

/// One rank's training loop and its report (counts over all ranks; data stall and
/// collective time of this rank).
pub(crate) fn worker(
    job: &TrainJob,
    rank: usize,
    grads: Arc<dyn Collective>,
    data: Arc<dyn Collective>,
    options: &TrainOptions,
    handle: &Handle,
    link: Option<server::Link>,
) -> Result<Option<TrainReport>, TrainError> {
    let _enter = handle.enter();
    let started = Instant::now();
    let tc = &job.trainer;
    let world = grads.world_size();
    let device = threads_and_device(job, world)?;

    // The checkpoint: rank 0 reads it and hands it to everyone.
    let location = resume::checkpoint_location(job)?;
    // The data's config: `trainer.epochs` overrides the source's.
    let config = setup::data_config(job);
    let (mut resumed, elastic) = resume::read_checkpoint(
        job,
        rank,
        grads.as_ref(),
        options,
        handle,
        &location,
        &config,
    )?;
    let epochs = config.source.value.epochs();
    resume::continue_finished(&mut resumed, &config, epochs, tc, rank);
    let checkpoint_url = location.as_ref().map(CheckpointFile::url);
    if let Some((meta, _)) = resumed.as_ref().filter(|(m, _)| m.complete) {
        let url = checkpoint_url;
        return Ok(Some(resume::already_complete(
            meta,
            (rank, world),
            started,
            url,
        )));
    }

    // The data.
    let last_state = resume::position(&resumed, rank, &config);
    let input = setup::open_data(job, rank, config, data, &resumed, options, handle)?;
    let live_steps = input.live.as_ref().filter(|_| rank == 0); // step counters are rank 0's

    // The model: rank 0's initial weights, broadcast.
    let vs = VarStore::new(device);
    let model = setup::build_model(&vs, tc, &input.shape)?;
    let total_steps = setup::total_steps(job, input.source_rows, epochs, &resumed, grads.as_ref())?;
    let mut trainer = setup::new_trainer(&vs, tc, total_steps, grads.clone())?;
    resume::restore(&mut trainer, &resumed, live_steps, rank)?;
    let start_step = trainer.steps();

    let mut ctx = Ctx {
        job,
        rank,
        world,
        handle,
        frozen: &input.frozen,
        model: model.as_ref(),
        device,
        epoch: resumed.as_ref().and_then(|(m, _)| m.epoch),
        last_eval: None,
    };
    let mut run = Run {
        options,
        trainer,
        stream: input.stream,
        first: input.first,
        location,
        acker: input.acker,
        log: setup::open_log(job, rank, resumed.is_some())?,
        tensorboard: setup::open_tensorboard(job, rank)?,
        live_steps,
        total_steps,
        last_state,
        rows_trained: resumed.as_ref().map_or(0, |(m, _)| m.rows_trained),
        rows_this_run: 0,
        rows_untrained: 0,
        last_loss: None,
        evals: Vec::new(),
        interrupted: false,
        exhausted: false,
        exchange: ReduceCost::default(),
        last_checkpoint: Instant::now(),
    };
    let (loop_time, untrained) = run_loop(&mut ctx, &mut run, link.as_ref(), grads.as_ref())?;
    drop(run.stream);
    let stats = &input.stats;
    let stalls = gather_stalls(job, grads.as_ref(), stats.stall_fraction())?;
    Ok(Some(TrainReport {
        rank,
        world_size: world,
        steps: run.trainer.steps(),
        steps_this_run: run.trainer.steps() - start_step,
        rows_trained: run.rows_trained,
        rows_this_run: run.rows_this_run,
        rows_untrained: untrained,
        last_loss: run.last_loss,
        evals: run.evals,
        seconds: started.elapsed().as_secs_f64(),
        loader: None,
        rows_per_second: run.rows_this_run as f64 / loop_time.as_secs_f64().max(1e-9),
        data_stall_fraction: stats.stall_fraction(),
        data_readiness: stats.readiness(),
        data_stall_max: stalls.iter().copied().fold(0.0, f64::max),
        data_stall_per_rank: stalls,
        data_wait_seconds: stats.waited().as_secs_f64(),
        allreduce_seconds: run.trainer.collective_time.as_secs_f64(),
        wire: (&run.exchange).into(),
        checkpoint: checkpoint_url,
        interrupted: run.interrupted,
        already_complete: false,
        notes: pipeline_notes(&input.metrics),
        elastic,
        total_steps,
    }))
}

/// The training loop and the end of the run: synchronous steps, or under `sync: async` the
/// parameter server's rank loop. Returns the loop's time and the rows left untrained.
fn run_loop(
    ctx: &mut Ctx<'_>,
    run: &mut Run<'_>,
    link: Option<&server::Link>,
    grads: &dyn Collective,
) -> Result<(std::time::Duration, u64), TrainError> {
    match link {
        Some(link) => {
            let started = Instant::now();
            async_steps::async_loop(ctx, run, link)?;
            Ok((started.elapsed(), 0))
        }
        None => {
            let loop_time = steps::train_loop(ctx, run)?;
            Ok((loop_time, steps::finish(ctx, run, grads)?))
        }
    }
}

/// Every rank's data-stall fraction, by rank (every rank calls this at the same point);
/// under `sync: async` only this rank's (a failed rank cannot join a collective).
fn gather_stalls(
    job: &TrainJob,
    grads: &dyn Collective,
    mine: f64,
) -> Result<Vec<f64>, TrainError> {
    if matches!(job.trainer.sync, SyncConfig::Async { .. }) {
        return Ok(vec![mine]);
    }
    let all = grads.all_gather(mine.to_le_bytes().to_vec())?;
    Ok(all
        .iter()
        .map(|b| {
            b.get(..8)
                .and_then(|b| b.try_into().ok())
                .map_or(0.0, f64::from_le_bytes)
        })
        .collect())
}

/// Sets this rank's intra-op threads (the cores shared out between ranks: OpenMP's setting
/// is per thread) and returns the loader's device.
fn threads_and_device(job: &TrainJob, world: usize) -> Result<tch::Device, TrainError> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    tch::set_num_threads(((cores / world).max(1)) as i32);
    Ok(parse_device(&job.loader.device)?)
}

/// The pipeline's notes for the report: the source's (shards, mix), then each stage's.
fn pipeline_notes(metrics: &PipelineMetrics) -> Vec<String> {
    [metrics.source.shard_note(), metrics.source.mix_note()]
        .into_iter()
        .flatten()
        .map(|n| format!("source: {n}"))
        .chain(metrics.stages().iter().flat_map(|s| {
            let notes = s.notes.lock().map(|n| n.clone()).unwrap_or_default();
            notes.into_iter().map(|n| format!("{}: {n}", s.name))
        }))
        .collect()
}

/// What a rank's checkpoints and evaluations work with: the job, the rank among the others,
/// the stages and the model.
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
    /// The last evaluation (into a published model version's manifest).
    last_eval: Option<EvalReport>,
}

/// One rank's training state: what the loop works with, and what it counts for the report.
struct Run<'a> {
    options: &'a TrainOptions,
    trainer: Trainer,
    /// The batches as tensors on the device.
    stream: TensorStream,
    /// A batch read ahead to learn the input's row shape, trained on first.
    first: Option<TensorBatch>,
    /// Where checkpoints go, if anywhere.
    location: Option<CheckpointFile>,
    /// Kafka offsets are stored with the consumer group only once a checkpoint covering
    /// them is durable (or, without checkpoints, at the end of a complete run).
    acker: Arc<Acknowledger>,
    /// Rank 0's step log.
    log: Option<BufWriter<File>>,
    /// This rank's TensorBoard event file.
    tensorboard: Option<sluice_pipeline::runtime::tensorboard::EventWriter>,
    /// The live counters, on rank 0 (step counters are rank 0's).
    live_steps: Option<&'a Arc<TrainingMetrics>>,
    /// The run's length in steps, where known.
    total_steps: Option<u64>,
    /// The pipeline position after the last step (into the checkpoint).
    last_state: SourceState,
    rows_trained: u64,
    rows_this_run: u64,
    rows_untrained: u64,
    last_loss: Option<f64>,
    evals: Vec<EvalReport>,
    /// Whether a stop ended the run (no final evaluation or complete checkpoint then).
    interrupted: bool,
    /// Whether the stream has ended (it is not polled again).
    exhausted: bool,
    /// What this run's exchanges cost, summed.
    exchange: ReduceCost,
    /// When the last checkpoint was written (or the run started): `checkpoint.every`.
    last_checkpoint: Instant,
}
