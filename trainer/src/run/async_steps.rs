//! A rank's loop under `sync: async`: compute a gradient on the parameters it holds, push
//! it to the parameter server ([`super::server`]), take the parameters it answers with —
//! never waiting for the other ranks, only (within the staleness bound) for the server.

use super::server::{FromServer, Link, ToServer};
use super::steps::{Fetched, evaluate_and_record, fetch, forward_loss};
use super::{Ctx, Run};
use crate::TrainError;

/// Trains until this rank's data ends (then the final parameters, once every rank's ended),
/// or the server stops it (a stop, or another rank failed: `run.interrupted`).
pub(super) fn async_loop(
    ctx: &mut Ctx<'_>,
    run: &mut Run<'_>,
    link: &Link,
) -> Result<(), TrainError> {
    let rank = ctx.rank;
    let send = |m: ToServer| {
        link.to_server
            .send(m)
            .map_err(|_| TrainError::Internal("the parameter server is gone".into()))
    };
    let recv = || {
        link.from_server
            .recv()
            .map_err(|_| TrainError::Internal("the parameter server is gone".into()))
    };
    // The server writes the step log; rank 0 (which created it) adds its evaluations at the end.
    run.log = None;
    if rank == 0 {
        send(ToServer::Init {
            tensors: run
                .trainer
                .state_tensors()
                .into_iter()
                .map(|(n, t)| (n, t.detach().copy()))
                .collect(),
            step: run.trainer.steps(),
            rows_trained: run.rows_trained,
            total_steps: run.total_steps,
        })?;
    }
    // Where this rank starts: what the server's checkpoints hold for it until an update of
    // its is applied.
    send(ToServer::Hello {
        rank,
        state: run.last_state.clone(),
    })?;
    let mut version = match recv()? {
        FromServer::Params { version, values } => {
            run.trainer.set_params(&values, version);
            version
        }
        _ => {
            run.interrupted = true;
            return Ok(());
        }
    };
    loop {
        // The batch read ahead to learn the input's shape comes first.
        let fetched = match run.first.take() {
            Some(b) => Fetched::Batch(Box::new(b)),
            None => fetch(ctx, run)?,
        };
        let batch = match fetched {
            Fetched::Batch(b) => *b,
            Fetched::End => break,
            Fetched::Stopped => {
                // The server sees the same stop and checkpoints what it applied.
                run.interrupted = true;
                return Ok(());
            }
        };
        let (grads, loss_sum) = if batch.rows > 0 {
            let loss = forward_loss(ctx, &batch)?;
            let sum = loss.double_value(&[]) * batch.rows as f64;
            (run.trainer.gradients(Some(&loss)), sum)
        } else {
            (run.trainer.gradients(None), 0.0)
        };
        send(ToServer::Push {
            rank,
            version,
            rows: batch.rows as u64,
            loss_sum,
            grads,
            state: batch.state.clone(),
        })?;
        match recv()? {
            FromServer::Params { version: v, values } => {
                run.trainer.set_params(&values, v);
                version = v;
                run.rows_this_run += batch.rows as u64;
                run.last_state = batch.state;
            }
            FromServer::Stop | FromServer::Final { .. } => {
                run.interrupted = true;
                return Ok(());
            }
        }
    }
    send(ToServer::Done { rank })?;
    match recv()? {
        FromServer::Final {
            version,
            values,
            rows_trained,
        } => {
            run.trainer.set_params(&values, version);
            run.rows_this_run = rows_trained.saturating_sub(run.rows_trained);
            run.rows_trained = rows_trained;
            run.log = super::setup::open_log(ctx.job, rank, true)?;
            // Rank 0 evaluates alone (see `Ctx::evaluate`).
            if rank == 0 && ctx.job.trainer.eval.is_some() {
                evaluate_and_record(ctx, run)?;
            }
            Ok(())
        }
        _ => {
            run.interrupted = true;
            Ok(())
        }
    }
}
