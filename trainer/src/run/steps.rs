//! The training loop of one rank: the next batch (or a stop while waiting for it), the step,
//! its counts and step line, the checkpoints and evaluations due after it, and the end of the
//! run (last evaluation, final checkpoint).

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde::Serialize;
use sluice_loader::TensorBatch;
use sluice_pipeline::checkpoint::Pending;
use sluice_pipeline::collective::Collective;
use tch::Reduction;

use super::checkpoint::checkpoint_step;
use super::loss::loss_of;
use super::{Ctx, Run};
use crate::TrainError;
use crate::checkpoint::EpochProgress;
use crate::job::Progress;
use crate::trainer::StepReport;

/// How often a rank waiting for data looks at the stop flag.
const STOP_POLL: Duration = Duration::from_millis(50);

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

/// Trains until `trainer.steps` is reached, the data ends, another rank runs out of data or
/// a stop is agreed (then `run.interrupted` is set). Returns the loop's time.
pub(super) fn train_loop(
    ctx: &mut Ctx<'_>,
    run: &mut Run<'_>,
) -> Result<std::time::Duration, TrainError> {
    let started = std::time::Instant::now();
    let job = ctx.job;
    let tc = &job.trainer;
    loop {
        if tc.steps.is_some_and(|s| run.trainer.steps() >= s) {
            break;
        }
        if run.options.stop.load(Ordering::Relaxed) {
            run.trainer.request_stop();
        }
        let Some(batch) = next_batch(ctx, run)? else {
            break;
        };
        let Some((rep, step_time, group)) = take_step(ctx, run, batch)? else {
            break;
        };
        count_step(ctx, run, &group, &rep, step_time);
        after_step(ctx, run, &rep)?;
        if rep.stop_requested {
            run.interrupted = true;
            break;
        }
    }
    Ok(started.elapsed())
}

/// The next batch, or `None` when this rank takes no more steps: its data ended, or a stop
/// came while it waited for data (an idle topic, a broker away). Either way it first joins
/// the step the other ranks are in, so that they stop too, and when a stop was agreed every
/// rank checkpoints (see [`stopped_between_steps`]).
fn next_batch(ctx: &mut Ctx<'_>, run: &mut Run<'_>) -> Result<Option<TensorBatch>, TrainError> {
    if let Some(b) = run.first.take() {
        return Ok(Some(b));
    }
    match fetch(ctx, run)? {
        Fetched::Batch(b) => return Ok(Some(*b)),
        Fetched::End => {}
        Fetched::Stopped => run.trainer.request_stop(),
    }
    if run.trainer.finish()? {
        stopped_between_steps(ctx, run)?;
    }
    Ok(None)
}

/// What waiting for the stream's next batch gave.
pub(super) enum Fetched {
    Batch(Box<TensorBatch>),
    /// The data ended (remembered: the stream is not read again).
    End,
    /// A stop came while waiting.
    Stopped,
}

pub(super) fn fetch(ctx: &mut Ctx<'_>, run: &mut Run<'_>) -> Result<Fetched, TrainError> {
    if run.exhausted {
        return Ok(Fetched::End);
    }
    match ctx
        .handle
        .block_on(next_or_stop(&mut run.stream, &run.options.stop))
    {
        Some(Some(batch)) => Ok(Fetched::Batch(Box::new(batch?))),
        Some(None) => {
            run.exhausted = true;
            Ok(Fetched::End)
        }
        None => Ok(Fetched::Stopped),
    }
}

/// Some rank was asked to stop while it waited for data, and every rank learnt it in the
/// same handshake instead of a step. The state after the last step is whole, so each rank
/// checkpoints it now rather than at a next step that may never come; a batch a rank holds
/// is not trained, and the checkpoint's position is before it, so a resume reads it again.
fn stopped_between_steps(ctx: &mut Ctx<'_>, run: &mut Run<'_>) -> Result<(), TrainError> {
    // Without a checkpoint nothing is written nor acknowledged: a `group` source's offsets
    // are committed only at the end of a complete run (as a stop at a step does).
    if run.location.is_some() {
        checkpoint_and_log(ctx, run)?;
    }
    run.interrupted = true;
    Ok(())
}

/// The batches one optimizer step trained on (more than one with `trainer.accumulate`).
pub(super) struct Group {
    /// The last of them: the position after it is the step's.
    last: TensorBatch,
    /// How many.
    batches: u64,
    /// This rank's rows in them.
    rows: u64,
    /// Time this rank waited for them.
    waited: Duration,
}

impl Group {
    fn of(b: TensorBatch) -> Group {
        Group {
            batches: 1,
            rows: b.rows as u64,
            waited: b.waited,
            last: b,
        }
    }

    fn add(&mut self, b: TensorBatch) {
        self.batches += 1;
        self.rows += b.rows as u64;
        self.waited += b.waited;
        self.last = b;
    }
}

/// The epoch a batch's rows come from (`None` for a stream).
fn epoch_of(b: &TensorBatch) -> Option<u64> {
    b.lineage.spans().first().map(|s| s.epoch)
}

/// Takes the step on `batch` (and, with `trainer.accumulate: N`, the next N−1 batches of the
/// same epoch: a group ends with its epoch or the data, never spans two) together with the
/// other ranks: its report, the time the step took after the forward passes, and the
/// batches; `None` when this rank takes no more steps: another rank's data ended (the
/// group's rows are counted as untrained), or a stop was agreed (every rank has
/// checkpointed the position before the group, so a resume reads it again).
fn take_step(
    ctx: &mut Ctx<'_>,
    run: &mut Run<'_>,
    batch: TensorBatch,
) -> Result<Option<(StepReport, Duration, Group)>, TrainError> {
    let (job, rank) = (ctx.job, ctx.rank);
    let tc = &job.trainer;
    let accumulate = tc.accumulate.max(1);
    let mut group = Group::of(batch);
    let (step_started, stepped) = if accumulate == 1 {
        let batch = &group.last;
        if batch.rows == 0 {
            // Every row of this batch was removed after the last `batch` stage: no forward
            // pass (the mean loss of no rows is NaN), but the step is taken with the others.
            (Instant::now(), run.trainer.step_empty()?)
        } else {
            let loss = forward_loss(ctx, batch)?;
            (Instant::now(), run.trainer.step(&loss, batch.rows)?)
        }
    } else {
        micro_backward(ctx, run, &group.last)?;
        let epoch = epoch_of(&group.last);
        while group.batches < accumulate {
            match fetch(ctx, run)? {
                Fetched::Batch(b) if epoch_of(&b) == epoch => {
                    micro_backward(ctx, run, &b)?;
                    group.add(*b);
                }
                Fetched::Batch(b) => {
                    run.first = Some(*b);
                    break;
                }
                Fetched::End => break,
                Fetched::Stopped => {
                    run.trainer.request_stop();
                    if run.trainer.finish()? {
                        stopped_between_steps(ctx, run)?;
                    }
                    return Ok(None);
                }
            }
        }
        (Instant::now(), run.trainer.step_accumulated()?)
    };
    let Some(rep) = stepped else {
        if run.trainer.stop_agreed() {
            stopped_between_steps(ctx, run)?;
            return Ok(None);
        }
        run.rows_untrained += group.rows;
        tracing::warn!(
            rank,
            "another rank ran out of data: stopping at step {} with {} batch(es) of {} rows untrained",
            run.trainer.steps(),
            group.batches,
            group.rows
        );
        return Ok(None);
    };
    let step_time = step_started.elapsed();
    Ok(Some((rep, step_time, group)))
}

/// One micro-batch's forward and backward pass, accumulated in the trainer.
fn micro_backward(ctx: &Ctx<'_>, run: &mut Run<'_>, b: &TensorBatch) -> Result<(), TrainError> {
    if b.rows > 0 {
        let loss = forward_loss(ctx, b)?;
        run.trainer.backward(&loss, b.rows)
    } else {
        run.trainer.backward(&tch::Tensor::from(0.0f32), 0)
    }
}

/// The model's mean loss on `batch`.
pub(super) fn forward_loss(ctx: &Ctx<'_>, batch: &TensorBatch) -> Result<tch::Tensor, TrainError> {
    let tc = &ctx.job.trainer;
    let (x, y) = match (batch.get(&tc.input), batch.get(&tc.target)) {
        (Some(x), Some(y)) => (x, y),
        _ => {
            return Err(TrainError::Internal(
                "the loader did not produce the input/target tensors".into(),
            ));
        }
    };
    let out = ctx.model.forward(x);
    loss_of(tc.loss, &out, y, &tc.target, Reduction::Mean)
}

/// Counts step `rep`, taken on `batch` (rows, loss, the position after it, the epoch's
/// progress), and records it: rank 0's live counters and step line.
fn count_step(
    ctx: &mut Ctx<'_>,
    run: &mut Run<'_>,
    group: &Group,
    rep: &StepReport,
    step_time: Duration,
) {
    let batch = &group.last;
    run.rows_trained += rep.rows;
    run.rows_this_run += rep.rows;
    run.exchange.wire_bytes += rep.exchange.wire_bytes;
    run.exchange.dense_bytes += rep.exchange.dense_bytes;
    run.exchange.compress += rep.exchange.compress;
    if rep.rows > 0 {
        run.last_loss = Some(rep.loss);
    }
    run.last_state = batch.state.clone();
    if let Some(e) = run.last_state.parquet.map(|m| m.epoch) {
        match &mut ctx.epoch {
            Some(p) if p.epoch == e => {
                p.rows += rep.rows;
                p.steps = p.steps.map(|s| s + group.batches);
            }
            _ => {
                ctx.epoch = Some(EpochProgress {
                    epoch: e,
                    rows: rep.rows,
                    steps: Some(group.batches),
                })
            }
        }
    }
    if let Some(m) = run.live_steps {
        m.record_step(
            rep.step,
            rep.rows,
            rep.loss,
            rep.lr,
            group.waited,
            step_time,
            &rep.exchange,
        );
    }
    if let Some(tb) = &mut run.tensorboard {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let x = &rep.exchange;
        let mut values = vec![
            ("data/wait_ms", ms(group.waited)),
            ("step/ms", ms(step_time)),
            ("allreduce/ms", ms(rep.allreduce)),
            ("allreduce/wire_bytes", x.wire_bytes as f64),
            (
                "allreduce/compression_ratio",
                x.wire_bytes as f64 / x.dense_bytes.max(1) as f64,
            ),
        ];
        if ctx.rank == 0 {
            let busy = (group.waited + step_time).as_secs_f64().max(1e-9);
            values.extend([
                ("train/loss", if rep.rows > 0 { rep.loss } else { f64::NAN }),
                ("train/learning_rate", rep.lr),
                ("train/rows", rep.rows as f64),
                ("train/rows_per_second", rep.rows as f64 / busy),
            ]);
        }
        if let Err(e) = tb.scalars(rep.step, &values) {
            tracing::warn!("tensorboard {}: {e}", tb.path().display());
        }
    }
    if let Some(log) = &mut run.log {
        write_line(
            log,
            &StepLine {
                step: rep.step,
                loss: rep.loss,
                lr: rep.lr,
                rows: rep.rows,
                wait_ms: group.waited.as_secs_f64() * 1e3,
                step_ms: step_time.as_secs_f64() * 1e3,
                allreduce_ms: rep.allreduce.as_secs_f64() * 1e3,
                wire_bytes: rep.exchange.wire_bytes,
                epoch: batch.lineage.spans().first().map(|s| s.epoch),
            },
        );
    }
}

/// What is due after step `rep`: the replica check, a checkpoint (every `every_steps`, or at
/// a stop) with its log line, an evaluation, and rank 0's progress callback.
fn after_step(ctx: &mut Ctx<'_>, run: &mut Run<'_>, rep: &StepReport) -> Result<(), TrainError> {
    let job = ctx.job;
    let tc = &job.trainer;
    if tc.check_every_steps > 0
        && rep.step.is_multiple_of(tc.check_every_steps)
        && run.trainer.replicas_in_sync()
    {
        run.trainer.check_replicas()?;
    }
    let every = tc.checkpoint.as_ref().map(|c| c.every_steps);
    if every.is_some_and(|e| rep.step.is_multiple_of(e))
        || (rep.stop_requested && run.location.is_some())
        || checkpoint_due_by_time(ctx, run)?
    {
        checkpoint_and_log(ctx, run)?;
        run.last_checkpoint = Instant::now();
    }
    if let Some(ev) = &tc.eval
        && ev.every_steps.is_some_and(|e| rep.step.is_multiple_of(e))
    {
        evaluate_and_record(ctx, run)?;
    }
    if let (Some(p), 0) = (&run.options.progress, ctx.rank) {
        p(&Progress {
            step: rep.step,
            total_steps: run.total_steps,
            loss: rep.loss,
            accuracy: run.evals.last().and_then(|e| e.accuracy),
        });
    }
    Ok(())
}

/// Whether `checkpoint.every` has passed since the last checkpoint, by rank 0's clock (one
/// byte broadcast per step, only with `every` set), so that every rank checkpoints together.
fn checkpoint_due_by_time(ctx: &Ctx<'_>, run: &mut Run<'_>) -> Result<bool, TrainError> {
    let Some(every) = ctx.job.trainer.checkpoint.as_ref().and_then(|c| c.every) else {
        return Ok(false);
    };
    let mut due = vec![u8::from(
        ctx.rank == 0 && run.last_checkpoint.elapsed() >= every.0,
    )];
    run.trainer.collective().broadcast(&mut due, 0)?;
    Ok(due.first() == Some(&1))
}

/// Checkpoints the position after the last step and, when there is a checkpoint, says so
/// in the step log.
fn checkpoint_and_log(ctx: &mut Ctx<'_>, run: &mut Run<'_>) -> Result<(), TrainError> {
    checkpoint_step(ctx, run)?;
    if let (Some(log), Some(_)) = (&mut run.log, &run.location) {
        write_line(
            log,
            &serde_json::json!({"checkpoint": run.trainer.steps(), "rows_trained": run.rows_trained}),
        );
    }
    Ok(())
}

/// Evaluates the model now and records the result: rank 0's live counters and log line, and
/// the report's list.
pub(super) fn evaluate_and_record(ctx: &mut Ctx<'_>, run: &mut Run<'_>) -> Result<(), TrainError> {
    // Under local SGD between averagings, the mean of the replicas is evaluated.
    let r = run.trainer.with_averaged(|t| ctx.evaluate(t))?;
    ctx.last_eval = Some(r.clone());
    if let Some(m) = run.live_steps {
        m.record_eval(&r);
    }
    if let Some(log) = &mut run.log {
        write_line(log, &serde_json::json!({"eval": &r}));
    }
    if let (Some(tb), 0) = (&mut run.tensorboard, ctx.rank) {
        let values = [
            ("eval/loss", r.loss),
            ("eval/accuracy", r.accuracy.unwrap_or(f64::NAN)),
        ];
        if let Err(e) = tb.scalars(r.step, &values) {
            tracing::warn!("tensorboard {}: {e}", tb.path().display());
        }
    }
    run.evals.push(r);
    Ok(())
}

/// The end of the run on every rank: unless it was stopped, the last evaluation (unless the
/// last step had one), the final checkpoint, marked complete, and the final commit of the
/// offsets; then the replica check and the log flushed. Returns the rows left untrained,
/// summed over all ranks.
pub(super) fn finish(
    ctx: &mut Ctx<'_>,
    run: &mut Run<'_>,
    grads: &dyn Collective,
) -> Result<u64, TrainError> {
    let job = ctx.job;
    let tc = &job.trainer;
    if !run.interrupted {
        // Local SGD: the run ends with one model.
        run.trainer.synchronize()?;
        if tc.eval.is_some()
            && run
                .evals
                .last()
                .is_none_or(|e| e.step != run.trainer.steps())
        {
            evaluate_and_record(ctx, run)?;
        }
        let pending = Pending::at(&run.acker, run.last_state.clone());
        if run.location.is_some() {
            ctx.checkpoint(
                &mut run.trainer,
                &run.location,
                pending.state(),
                run.rows_trained,
                true,
            )?;
            if let Some(log) = &mut run.log {
                write_line(
                    log,
                    &serde_json::json!({"checkpoint": run.trainer.steps(), "rows_trained": run.rows_trained, "complete": true}),
                );
            }
        }
        pending.acknowledge(true);
    }
    if tc.check_every_steps > 0 && run.trainer.replicas_in_sync() {
        run.trainer.check_replicas()?;
    }
    if let Some(log) = &mut run.log {
        let _ = log.flush();
    }
    let untrained = {
        let all = grads.all_gather(run.rows_untrained.to_le_bytes().to_vec())?;
        all.iter()
            .filter_map(|b| <[u8; 8]>::try_from(b.as_slice()).ok())
            .map(u64::from_le_bytes)
            .sum::<u64>()
    };
    Ok(untrained)
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
    /// Gradient bytes this rank sent (rank 0's).
    wire_bytes: u64,
    epoch: Option<u64>,
}

/// Appends one line to the step log, flushed: a reader following the log (`tail -f`, a
/// dashboard) sees each step when it is taken (one write per step, next to a training step).
fn write_line(w: &mut impl Write, v: &impl Serialize) {
    if let Ok(s) = serde_json::to_string(v) {
        let _ = writeln!(w, "{s}").and_then(|()| w.flush());
    }
}
