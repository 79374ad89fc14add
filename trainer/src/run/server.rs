//! `trainer.sync: {type: async, staleness: S}`: a parameter server with bounded staleness.
//!
//! The server runs on the thread that started the ranks (the `local` backend) and holds the
//! model and the optimizer. Each rank computes a gradient on the parameters it last received
//! (version `v`), pushes it, and waits only for its own reply; the server applies what has
//! been pushed as one update — the pushes weighted by their rows, as the synchronous step
//! weighs ranks — and answers each pusher with the new parameters.
//!
//! **Bound.** An update is applied only when no rank still computing on version `v_m` would
//! then be more than `S` versions behind (`t + 1 − v_m ≤ S`); otherwise the pushes wait for
//! the slow rank, whose push then joins them. So every applied gradient is at most `S`
//! versions stale (recorded per update in the step log, `staleness`), and with `S = 0` every
//! update holds every rank's gradient: synchronous all-reduce, bitwise.
//!
//! **Checkpoints and resume.** The server writes the checkpoint: its parameters and optimizer,
//! and for each rank the pipeline position just past the last batch whose gradient was
//! applied. A resumed run therefore applies every record's gradient exactly once over both
//! runs; the parameters differ from an uninterrupted run's when `S > 0` (which updates group
//! which pushes depends on timing), and are bitwise the same with `S = 0`.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::time::Duration;

use sluice_pipeline::SourceState;
use sluice_pipeline::checkpoint::CheckpointFile;
use tch::{Kind, Tensor};
use tokio::runtime::Handle;

use crate::TrainError;
use crate::checkpoint::{CheckpointMeta, encode};
use crate::config::OnFailure;
use crate::job::{TrainJob, TrainOptions};
use crate::optim::{Optimizer, learning_rate};

/// What a rank tells the server.
#[derive(Debug)]
// Each message is moved once through a channel: its size does not matter.
#[allow(clippy::large_enum_variant)]
pub(crate) enum ToServer {
    /// Rank 0, once: the model and optimizer it was built (or resumed) with.
    Init {
        tensors: Vec<(String, Tensor)>,
        step: u64,
        rows_trained: u64,
        total_steps: Option<u64>,
    },
    /// Ready for parameters; its pipeline starts at `state`.
    Hello { rank: usize, state: SourceState },
    /// A gradient (one tensor per parameter, in order) computed on `version`.
    Push {
        rank: usize,
        version: u64,
        rows: u64,
        loss_sum: f64,
        grads: Vec<Tensor>,
        state: SourceState,
    },
    /// Its data ended.
    Done { rank: usize },
    /// It failed (the run stops).
    Failed { rank: usize, error: String },
}

/// What the server answers.
#[derive(Debug)]
pub(crate) enum FromServer {
    /// Parameters of `version`, in order.
    Params { version: u64, values: Vec<Tensor> },
    /// The run is over for this rank: a stop, or another rank failed.
    Stop,
    /// Every rank's data ended: the final parameters.
    Final {
        version: u64,
        values: Vec<Tensor>,
        rows_trained: u64,
    },
}

/// A rank's end of the server's channels.
#[derive(Debug)]
pub(crate) struct Link {
    pub(crate) to_server: Sender<ToServer>,
    pub(crate) from_server: Receiver<FromServer>,
}

/// What the server did.
#[derive(Debug, Clone, Default)]
pub(super) struct ServerReport {
    pub updates: u64,
    pub max_staleness: u64,
    pub interrupted: bool,
    /// Ranks that failed under `on_failure: continue`, with their errors.
    pub failed: Vec<(usize, String)>,
}

#[derive(Debug)]
enum Rank {
    Waiting,
    Computing(u64),
    Pending(Box<Push>),
    Done,
    /// Failed under `on_failure: continue`: left out from then on.
    Failed,
}

#[derive(Debug)]
struct Push {
    version: u64,
    rows: u64,
    loss_sum: f64,
    grads: Vec<Tensor>,
    state: SourceState,
}

/// How often a waiting server looks at the stop flag.
const POLL: Duration = Duration::from_millis(50);

/// The server's state.
struct Server<'a> {
    job: &'a TrainJob,
    options: &'a TrainOptions,
    handle: &'a Handle,
    location: Option<CheckpointFile>,
    to: Vec<Sender<FromServer>>,
    params: Vec<(String, Tensor)>,
    opt: Optimizer,
    version: u64,
    rows_trained: u64,
    states: Vec<SourceState>,
    total_steps: Option<u64>,
    ranks: Vec<Rank>,
    staleness: u64,
    on_failure: OnFailure,
    log: Option<std::fs::File>,
    report: ServerReport,
}

/// Serves the ranks until every one's data ended, a stop, or a failure.
pub(super) fn serve(
    job: &TrainJob,
    options: &TrainOptions,
    handle: &Handle,
    location: Option<CheckpointFile>,
    rx: Receiver<ToServer>,
    to: Vec<Sender<FromServer>>,
    (staleness, on_failure): (u64, OnFailure),
) -> Result<ServerReport, TrainError> {
    let world = to.len();
    let mut early: Vec<ToServer> = Vec::new();
    // Rank 0's model first; other messages wait for it.
    let init = loop {
        match rx.recv() {
            Ok(ToServer::Init {
                tensors,
                step,
                rows_trained,
                total_steps,
            }) => break (tensors, step, rows_trained, total_steps),
            Ok(ToServer::Failed { rank, error }) if rank == 0 || on_failure == OnFailure::Stop => {
                return Err(failed(rank, &error));
            }
            Ok(other) => early.push(other),
            // Every rank returned before training (a resumed run that had already finished).
            Err(_) => return Ok(ServerReport::default()),
        }
    };
    let (tensors, step, rows_trained, total_steps) = init;
    // Until a rank says hello: the start, drawing as the job asks (a checkpoint may be taken
    // before a slow rank's first push).
    let states = vec![super::resume::fresh_state(&job.pipeline); world];
    let (model, optim): (Vec<_>, Vec<_>) = tensors
        .into_iter()
        .partition(|(n, _)| n.starts_with("model."));
    let params: Vec<(String, Tensor)> = model
        .into_iter()
        .map(|(n, t)| {
            (
                n["model.".len()..].to_string(),
                t.to_kind(Kind::Float).copy(),
            )
        })
        .collect();
    let mut opt = Optimizer::new(
        job.trainer.optimizer.clone(),
        params
            .iter()
            .map(|(n, t)| (n.clone(), t.shallow_clone()))
            .collect(),
    );
    let optim: BTreeMap<String, Tensor> = optim
        .into_iter()
        .filter_map(|(n, t)| n.strip_prefix("optim.").map(|n| (n.to_string(), t)))
        .collect();
    opt.restore(&optim, step)?;
    let log = match (&job.trainer.log, step) {
        (Some(path), s) => Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(s > 0)
                .write(true)
                .truncate(s == 0)
                .open(job.base_dir.join(path))
                .map_err(|e| TrainError::Config(format!("trainer.log: {e}")))?,
        ),
        (None, _) => None,
    };
    let mut server = Server {
        job,
        options,
        handle,
        location,
        to,
        params,
        opt,
        version: step,
        rows_trained,
        states,
        total_steps,
        ranks: (0..world).map(|_| Rank::Waiting).collect(),
        staleness,
        on_failure,
        log,
        report: ServerReport::default(),
    };
    for m in early {
        server.receive(m)?;
    }
    server.run(&rx)
}

impl Server<'_> {
    fn run(&mut self, rx: &Receiver<ToServer>) -> Result<ServerReport, TrainError> {
        loop {
            if self.options.stop.load(Ordering::Relaxed) {
                self.checkpoint(false)?;
                self.stop_all();
                self.report.interrupted = true;
                return Ok(self.report.clone());
            }
            if self
                .ranks
                .iter()
                .all(|r| matches!(r, Rank::Done | Rank::Failed))
            {
                // A failed rank's data is not all trained: `--resume` goes on with it.
                self.checkpoint(self.report.failed.is_empty())?;
                for to in &self.to {
                    let _ = to.send(FromServer::Final {
                        version: self.version,
                        values: self.values(),
                        rows_trained: self.rows_trained,
                    });
                }
                return Ok(self.report.clone());
            }
            match rx.recv_timeout(POLL) {
                Ok(m) => self.receive(m)?,
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(TrainError::Internal(
                        "the ranks left the parameter server".into(),
                    ));
                }
            }
            self.try_apply()?;
        }
    }

    fn receive(&mut self, m: ToServer) -> Result<(), TrainError> {
        match m {
            ToServer::Hello { rank, state } => {
                self.states[rank] = state;
                self.ranks[rank] = Rank::Computing(self.version);
                let _ = self.to[rank].send(FromServer::Params {
                    version: self.version,
                    values: self.values(),
                });
            }
            ToServer::Push {
                rank,
                version,
                rows,
                loss_sum,
                grads,
                state,
            } => {
                self.ranks[rank] = Rank::Pending(Box::new(Push {
                    version,
                    rows,
                    loss_sum,
                    grads,
                    state,
                }));
            }
            ToServer::Done { rank } => self.ranks[rank] = Rank::Done,
            // Rank 0 reports and evaluates: its failure always stops the run.
            ToServer::Failed { rank, error }
                if rank > 0 && self.on_failure == OnFailure::Continue =>
            {
                tracing::error!(rank, "rank {rank} failed; the others go on: {error}");
                self.ranks[rank] = Rank::Failed;
                self.report.failed.push((rank, error));
            }
            ToServer::Failed { rank, error } => {
                // What was applied is kept: a resume goes on from it.
                let _ = self.checkpoint(false);
                self.stop_all();
                return Err(failed(rank, &error));
            }
            ToServer::Init { .. } => {
                return Err(TrainError::Internal("a second Init".into()));
            }
        }
        Ok(())
    }

    fn values(&self) -> Vec<Tensor> {
        self.params.iter().map(|(_, p)| p.copy()).collect()
    }

    fn stop_all(&self) {
        for to in &self.to {
            let _ = to.send(FromServer::Stop);
        }
    }

    /// Applies every pending push as one update, unless a rank still computing would fall
    /// more than `staleness` versions behind.
    fn try_apply(&mut self) -> Result<(), TrainError> {
        let t = self.version;
        let pending: Vec<usize> = (0..self.ranks.len())
            .filter(|&r| matches!(self.ranks[r], Rank::Pending(_)))
            .collect();
        // A rank not yet started will compute on this version: it counts as computing.
        let blocked = self.ranks.iter().any(|r| match r {
            Rank::Waiting => 1 > self.staleness,
            Rank::Computing(v) => t + 1 - v > self.staleness,
            _ => false,
        });
        if pending.is_empty() || blocked {
            return Ok(());
        }
        let mut pushes: Vec<(usize, Push)> = Vec::with_capacity(pending.len());
        for r in pending {
            if let Rank::Pending(p) = std::mem::replace(&mut self.ranks[r], Rank::Computing(t + 1))
            {
                pushes.push((r, *p));
            }
        }
        let rows: u64 = pushes.iter().map(|(_, p)| p.rows).sum();
        let lr = learning_rate(
            &self.job.trainer.schedule,
            self.job.trainer.optimizer.lr(),
            t,
            self.total_steps,
        );
        if rows > 0 {
            // Σ (rows_r / rows) · grad_r in rank order, f32: what the synchronous step sums.
            let grads: Vec<Tensor> = (0..self.params.len())
                .map(|i| {
                    let mut acc = self.params[i].1.zeros_like();
                    for (_, p) in &pushes {
                        acc += &p.grads[i] * (p.rows as f64 / rows as f64);
                    }
                    acc
                })
                .collect();
            self.opt.step_with(lr, &grads);
        }
        self.version += 1;
        self.rows_trained += rows;
        let staleness: Vec<u64> = pushes.iter().map(|(_, p)| t - p.version).collect();
        self.report.updates += 1;
        self.report.max_staleness = self
            .report
            .max_staleness
            .max(staleness.iter().copied().max().unwrap_or(0));
        let loss = pushes.iter().map(|(_, p)| p.loss_sum).sum::<f64>() / rows.max(1) as f64;
        let ranks: Vec<usize> = pushes.iter().map(|(r, _)| *r).collect();
        for (r, p) in pushes {
            self.states[r] = p.state;
            let _ = self.to[r].send(FromServer::Params {
                version: self.version,
                values: self.values(),
            });
        }
        if let Some(log) = &mut self.log {
            let line = serde_json::json!({
                "step": self.version, "loss": loss, "lr": lr, "rows": rows,
                "ranks": ranks, "staleness": staleness,
            });
            let _ = writeln!(log, "{line}").and_then(|()| log.flush());
        }
        let every = self.job.trainer.checkpoint.as_ref().map(|c| c.every_steps);
        if every.is_some_and(|e| self.version.is_multiple_of(e)) {
            self.checkpoint(false)?;
        }
        Ok(())
    }

    /// Writes the checkpoint: the server's model and optimizer, every rank's position past
    /// its last applied batch.
    fn checkpoint(&self, complete: bool) -> Result<(), TrainError> {
        let Some(file) = &self.location else {
            return Ok(());
        };
        let meta = CheckpointMeta {
            version: 1,
            step: self.version,
            world_size: self.ranks.len(),
            pipeline: self.states.clone(),
            rows_trained: self.rows_trained,
            complete,
            epoch: None,
            sync: Some(format!("async, staleness {}", self.staleness)),
        };
        let mut tensors: Vec<(String, Tensor)> = self
            .params
            .iter()
            .map(|(n, t)| (format!("model.{n}"), t.shallow_clone()))
            .collect();
        tensors.extend(
            self.opt
                .state_tensors()
                .into_iter()
                .map(|(n, t)| (format!("optim.{n}"), t)),
        );
        let bytes = encode(&meta, &tensors)?;
        self.handle
            .block_on(file.write(bytes))
            .map_err(TrainError::from)?;
        crate::export::write_beside(file, self.handle, &tensors, meta.step)?;
        tracing::info!(step = meta.step, url = %file.url(), "checkpoint written (parameter server)");
        Ok(())
    }
}

fn failed(rank: usize, error: &str) -> TrainError {
    TrainError::Config(format!(
        "rank {rank} failed: {error}; the parameter server stopped every rank (the checkpoint, if any, holds every update applied: --resume goes on from it)"
    ))
}
