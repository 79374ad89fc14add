//! [`Trainer`]: one rank's half of data-parallel training for any tch model — the same
//! all-reduce, optimizer, schedule and checkpoint state whether the model comes from the zoo
//! or from the user's own code.
//!
//! ```no_run
//! # use std::sync::Arc;
//! # use sluice_trainer::{Trainer, TrainerOptions};
//! # use sluice_pipeline::collective::SingleRank;
//! # fn demo(batches: Vec<(tch::Tensor, tch::Tensor)>) -> Result<(), sluice_trainer::TrainError> {
//! let vs = tch::nn::VarStore::new(tch::Device::Cpu);
//! let model = tch::nn::linear(vs.root() / "l", 64, 10, Default::default());
//! let mut trainer = Trainer::new(&vs, TrainerOptions::sgd(0.1), Arc::new(SingleRank))?;
//! for (x, y) in batches {
//!     let rows = x.size()[0] as usize;
//!     let stepped = if rows == 0 {
//!         // Under several ranks, a batch a late `filter` emptied still comes: join the step.
//!         trainer.step_empty()?
//!     } else {
//!         let loss = tch::nn::Module::forward(&model, &x).cross_entropy_for_logits(&y);
//!         trainer.step(&loss, rows)?
//!     };
//!     if stepped.is_none() {
//!         break; // another rank ran out of data: everyone stops at the same step
//!     }
//! }
//! # Ok(()) }
//! ```

mod replicas;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_pipeline::collective::Collective;
use tch::Tensor;
use tch::nn::VarStore;

use crate::TrainError;
use crate::config::{Compression, OptimizerConfig, ScheduleConfig, SyncConfig};
use crate::optim::{Optimizer, learning_rate};
use crate::sync::{GradSync, ReduceCost, checksum};

/// How a [`Trainer`] updates the model.
#[derive(Debug, Clone)]
pub struct TrainerOptions {
    /// Optimizer and peak learning rate.
    pub optimizer: OptimizerConfig,
    /// Warmup and decay.
    pub schedule: ScheduleConfig,
    /// Steps of the whole run (needed by `cosine` decay).
    pub total_steps: Option<u64>,
    /// Gradient bucket size in bytes.
    pub bucket_bytes: usize,
    /// Gradient compression on the wire.
    pub compression: Compression,
    /// Synchronous all-reduce every step, or local SGD with periodic parameter averaging.
    pub sync: SyncConfig,
}

impl TrainerOptions {
    /// Plain SGD at a constant rate, 25 MB buckets, no compression.
    pub fn sgd(lr: f64) -> Self {
        TrainerOptions {
            optimizer: OptimizerConfig::Sgd {
                lr,
                momentum: 0.0,
                weight_decay: 0.0,
                nesterov: false,
            },
            schedule: ScheduleConfig::default(),
            total_steps: None,
            bucket_bytes: 25 << 20,
            compression: Compression::None,
            sync: SyncConfig::Allreduce,
        }
    }
}

/// What one step did.
#[derive(Debug, Clone, PartialEq)]
pub struct StepReport {
    /// Steps completed, this one included.
    pub step: u64,
    /// Mean loss over all ranks' rows of this step.
    pub loss: f64,
    /// Rows of this step, all ranks.
    pub rows: u64,
    /// The learning rate applied.
    pub lr: f64,
    /// Time in the gradient all-reduce (or, under local SGD, the parameter averaging).
    pub allreduce: Duration,
    /// Bytes this rank sent, the time compressing, and what f32 gradients would have cost.
    pub exchange: ReduceCost,
    /// Whether some rank asked to stop (SIGTERM/SIGINT): checkpoint now and exit.
    pub stop_requested: bool,
}

/// One rank's trainer; see the module docs.
#[derive(Debug)]
pub struct Trainer {
    params: Vec<(String, Tensor)>,
    opt: Optimizer,
    sync: GradSync,
    collective: Arc<dyn Collective>,
    options: TrainerOptions,
    step: u64,
    stop: bool,
    /// Whether the last handshake carried some rank's stop request.
    stop_agreed: bool,
    /// Total time in collectives (handshakes and all-reduce).
    pub collective_time: Duration,
    /// Micro-batches backpropagated since the last step ([`Trainer::backward`]).
    pending: Option<Pending>,
}

/// What [`Trainer::backward`] accumulated: rows and the loss summed over them.
#[derive(Debug, Clone, Copy, Default)]
struct Pending {
    rows: u64,
    loss_sum: f64,
}

/// Per step, every rank says whether it has a batch, how many rows, whether it was asked to
/// stop, and its mean loss.
const HANDSHAKE_BYTES: usize = 8 + 8 + 8 + 8;

impl Trainer {
    /// A trainer for the trainable variables of `vs`; rank 0's initial values are broadcast
    /// so that every replica starts identical.
    pub fn new(
        vs: &VarStore,
        options: TrainerOptions,
        collective: Arc<dyn Collective>,
    ) -> Result<Self, TrainError> {
        let mut params: Vec<(String, Tensor)> = vs
            .variables()
            .into_iter()
            .filter(|(_, t)| t.requires_grad())
            .collect();
        params.sort_by(|a, b| a.0.cmp(&b.0));
        let trainer = Trainer {
            opt: Optimizer::new(
                options.optimizer.clone(),
                params
                    .iter()
                    .map(|(n, t)| (n.clone(), t.shallow_clone()))
                    .collect(),
            ),
            sync: GradSync::new(
                collective.clone(),
                &params,
                options.bucket_bytes,
                options.compression,
            ),
            params,
            collective,
            options,
            step: 0,
            stop: false,
            stop_agreed: false,
            collective_time: Duration::ZERO,
            pending: None,
        };
        trainer.broadcast_params()?;
        Ok(trainer)
    }

    fn broadcast_params(&self) -> Result<(), TrainError> {
        if self.collective.world_size() == 1 {
            return Ok(());
        }
        let mut bytes = if self.collective.rank() == 0 {
            crate::checkpoint::encode(&crate::checkpoint::CheckpointMeta::empty(), &self.params)?
        } else {
            Vec::new()
        };
        self.collective.broadcast(&mut bytes, 0)?;
        let (_, tensors) = crate::checkpoint::decode(&bytes)?;
        self.load_params(&tensors)
    }

    fn load_params(&self, tensors: &BTreeMap<String, Tensor>) -> Result<(), TrainError> {
        for (name, p) in &self.params {
            let src = tensors.get(name).ok_or_else(|| {
                TrainError::Checkpoint(format!(
                    "parameter `{name}` is missing: was it written for another model?"
                ))
            })?;
            if src.size() != p.size() {
                return Err(TrainError::Checkpoint(format!(
                    "parameter `{name}` has shape {:?}, the model needs {:?}",
                    src.size(),
                    p.size()
                )));
            }
            let mut p = p.shallow_clone();
            tch::no_grad(|| p.copy_(src));
        }
        Ok(())
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.collective.rank()
    }

    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.collective.world_size()
    }

    /// Steps completed.
    pub fn steps(&self) -> u64 {
        self.step
    }

    /// The parameters, in name order.
    pub fn params(&self) -> &[(String, Tensor)] {
        &self.params
    }

    /// Asks for a stop: the next step tells every rank (then checkpoint and exit).
    pub fn request_stop(&mut self) {
        self.stop = true;
    }

    /// One synchronous data-parallel step on this rank's mean `loss` over `rows` rows:
    /// backward, gradient all-reduce (weighted by rows), optimizer update. Returns `None`
    /// without updating when some rank takes no more steps (it called [`Trainer::finish`]:
    /// its data ended, or it was asked to stop while waiting for data; then
    /// [`Trainer::stop_agreed`] is true): every rank stops at the same step, so unequal data
    /// never hangs the all-reduce.
    pub fn step(&mut self, loss: &Tensor, rows: usize) -> Result<Option<StepReport>, TrainError> {
        self.step_on(Some(loss), rows)
    }

    /// [`Trainer::step`] for a batch that holds no rows (every row of it was removed after
    /// the last `batch`, and the pipeline delivers it so that ranks stay in step): this rank
    /// joins the all-reduce with zero gradients and weight 0. When no rank had rows, the
    /// step is counted (the schedule stays aligned) but the parameters are not updated.
    pub fn step_empty(&mut self) -> Result<Option<StepReport>, TrainError> {
        self.step_on(None, 0)
    }

    /// The step on what [`Trainer::backward`] accumulated since the last step (the same on
    /// every rank: each calls it after its micro-batches); like [`Trainer::step`] otherwise.
    pub fn step_accumulated(&mut self) -> Result<Option<StepReport>, TrainError> {
        if self.pending.is_none() {
            self.pending = Some(Pending::default());
            self.zero_grads();
        }
        self.step_on(None, 0)
    }

    /// Backpropagates one micro-batch without stepping (gradient accumulation, Horovod's
    /// `backward_passes_per_step`): its gradient, weighted by its `rows`, is added to those of
    /// the micro-batches before it; the next [`Trainer::step`] (its own batch the last
    /// micro-batch) exchanges and applies the mean over all of them and all ranks — equal to
    /// one step on their concatenation. No collective: call it the same number of times on
    /// every rank between steps.
    pub fn backward(&mut self, loss: &Tensor, rows: usize) -> Result<(), TrainError> {
        let pending = match self.pending.take() {
            Some(p) => p,
            None => {
                self.zero_grads();
                Pending::default()
            }
        };
        let mut p = pending;
        if rows > 0 {
            (loss * rows as f64).backward();
            p.rows += rows as u64;
            p.loss_sum += loss.double_value(&[]) * rows as f64;
        }
        self.pending = Some(p);
        Ok(())
    }

    fn zero_grads(&self) {
        for (_, p) in &self.params {
            let mut p = p.shallow_clone();
            p.zero_grad();
        }
    }

    /// Makes every gradient defined (zero) on a rank that had no rows to backpropagate (the
    /// mean loss of no rows would be NaN, and NaN × 0 is NaN).
    fn define_zero_grads(&self) {
        let zero = self
            .params
            .iter()
            .map(|(_, p)| p.sum(p.kind()) * 0.0)
            .reduce(|a, b| a + b);
        if let Some(zero) = zero {
            zero.backward();
        }
    }

    fn step_on(
        &mut self,
        loss: Option<&Tensor>,
        rows: usize,
    ) -> Result<Option<StepReport>, TrainError> {
        // `summed`: the gradients are Σ rows·∇mean (accumulated), not ∇mean of one batch.
        let (rows, local_loss, summed) = match self.pending.is_some() {
            true => {
                if let Some(loss) = loss {
                    self.backward(loss, rows)?;
                }
                let p = self.pending.take().unwrap_or_default();
                if p.rows == 0 {
                    self.define_zero_grads();
                }
                let mean = if p.rows > 0 {
                    p.loss_sum / p.rows as f64
                } else {
                    0.0
                };
                (p.rows as usize, mean, true)
            }
            false => {
                self.zero_grads();
                let local_loss = match loss.filter(|_| rows > 0) {
                    Some(loss) => {
                        loss.backward();
                        loss.double_value(&[])
                    }
                    None => {
                        self.define_zero_grads();
                        0.0
                    }
                };
                (rows, local_loss, false)
            }
        };
        let all = self.handshake(true, rows as u64, local_loss)?;
        if all.ranks_with_data < self.world_size() {
            return Ok(None);
        }
        let exchange = if self.local_now() {
            // Local SGD: this rank's own mean gradient, no exchange; the parameters are
            // averaged after the update every `every` steps.
            let weight = match (summed, rows) {
                (_, 0) => 0.0,
                (true, r) => 1.0 / r as f64,
                (false, _) => 1.0,
            };
            if weight != 1.0 {
                self.scale_grads(weight);
            }
            ReduceCost {
                dense_bytes: self.params.iter().map(|(_, p)| p.numel() as u64 * 4).sum(),
                ..ReduceCost::default()
            }
        } else if all.rows == 0 {
            // No rank had rows (every rank knows it from the handshake): nothing to exchange,
            // and compression residuals are kept whole for the next step.
            ReduceCost::default()
        } else {
            let weight = match summed {
                true => 1.0 / all.rows as f64,
                false => rows as f64 / all.rows as f64,
            };
            self.sync.reduce(&self.params, weight, self.step)?
        };
        let mut exchange = exchange;
        let lr = learning_rate(
            &self.options.schedule,
            self.options.optimizer.lr(),
            self.step,
            self.options.total_steps,
        );
        if all.rows > 0 {
            self.opt.step(lr);
        }
        let was_local = self.local_now();
        self.step += 1;
        if was_local && self.replicas_in_sync() {
            let averaged = self.average_params()?;
            exchange.collective += averaged.collective;
            exchange.wire_bytes += averaged.wire_bytes;
        }
        self.collective_time += exchange.collective;
        Ok(Some(StepReport {
            step: self.step,
            loss: all.loss,
            rows: all.rows,
            lr,
            allreduce: exchange.collective,
            exchange,
            stop_requested: all.stop,
        }))
    }

    /// This rank takes no more steps (its data ended, or — after [`Trainer::request_stop`] —
    /// it was asked to stop while waiting for data): joins the step the other ranks are in,
    /// so they stop too. Returns whether some rank asked to stop, as
    /// [`Trainer::stop_agreed`] then says on every rank: the run is then interrupted rather
    /// than ended, and every rank should checkpoint where it stands.
    pub fn finish(&mut self) -> Result<bool, TrainError> {
        self.pending = None;
        self.handshake(false, 0, 0.0).map(|h| h.stop)
    }

    /// Whether the last step some rank joined carried a stop request — what a rank that got
    /// `None` from [`Trainer::step`] asks to tell "a rank was asked to stop while it waited
    /// for data" (checkpoint and exit, the batch in hand left for the resume) from "a rank's
    /// data ended" (the batch in hand is untrained). The same on every rank.
    pub fn stop_agreed(&self) -> bool {
        self.stop_agreed
    }

    fn handshake(&mut self, has: bool, rows: u64, loss: f64) -> Result<Handshake, TrainError> {
        let started = Instant::now();
        let mut msg = Vec::with_capacity(HANDSHAKE_BYTES);
        msg.extend_from_slice(&u64::from(has).to_le_bytes());
        msg.extend_from_slice(&rows.to_le_bytes());
        msg.extend_from_slice(&u64::from(self.stop).to_le_bytes());
        msg.extend_from_slice(&(loss * rows as f64).to_le_bytes());
        let all = self.collective.all_gather(msg)?;
        self.collective_time += started.elapsed();
        let mut h = Handshake::default();
        for m in all {
            let word = |i: usize| -> Result<[u8; 8], TrainError> {
                m.get(i * 8..i * 8 + 8)
                    .and_then(|b| <[u8; 8]>::try_from(b).ok())
                    .ok_or_else(|| {
                        TrainError::Config(
                            "a rank sent a malformed step handshake (mixed Sluice versions?)"
                                .into(),
                        )
                    })
            };
            h.ranks_with_data += (u64::from_le_bytes(word(0)?) == 1) as usize;
            h.rows += u64::from_le_bytes(word(1)?);
            h.stop |= u64::from_le_bytes(word(2)?) == 1;
            h.loss += f64::from_le_bytes(word(3)?);
        }
        if h.rows > 0 {
            h.loss /= h.rows as f64;
        }
        self.stop_agreed = h.stop;
        Ok(h)
    }

    /// Checks that every rank holds bitwise-identical parameters.
    pub fn check_replicas(&mut self) -> Result<(), TrainError> {
        let sum = checksum(&self.params);
        let started = Instant::now();
        let all = self.collective.all_gather(sum.to_le_bytes().to_vec())?;
        self.collective_time += started.elapsed();
        let ranks: Vec<String> = all
            .iter()
            .enumerate()
            .map(|(r, b)| format!("rank {r}: {:02x?}", b))
            .collect();
        if all.iter().any(|b| b != &all[0]) {
            return Err(TrainError::Diverged {
                step: self.step,
                detail: ranks.join(", "),
            });
        }
        Ok(())
    }

    /// Model and optimizer tensors, for a checkpoint.
    pub fn state_tensors(&self) -> Vec<(String, Tensor)> {
        let mut out: Vec<(String, Tensor)> = self
            .params
            .iter()
            .map(|(n, t)| (format!("model.{n}"), t.shallow_clone()))
            .collect();
        out.extend(
            self.opt
                .state_tensors()
                .into_iter()
                .map(|(n, t)| (format!("optim.{n}"), t)),
        );
        out.extend(
            self.sync
                .shared_state(&self.params)
                .into_iter()
                .map(|(n, t)| (format!("sync.{n}"), t)),
        );
        out
    }

    /// Restores what [`Trainer::state_tensors`] saved at step `step`.
    pub fn restore(
        &mut self,
        tensors: &BTreeMap<String, Tensor>,
        step: u64,
    ) -> Result<(), TrainError> {
        let strip = |prefix: &str| -> BTreeMap<String, Tensor> {
            tensors
                .iter()
                .filter_map(|(k, v)| {
                    k.strip_prefix(prefix)
                        .map(|n| (n.to_string(), v.shallow_clone()))
                })
                .collect()
        };
        self.load_params(&strip("model."))?;
        self.opt.restore(&strip("optim."), step)?;
        self.sync.restore(&self.params, &strip("sync."), None);
        self.step = step;
        Ok(())
    }

    /// The collective gradients travel through (checkpoints and evaluation use it too).
    pub fn collective(&self) -> &Arc<dyn Collective> {
        &self.collective
    }
}

#[derive(Debug, Default)]
struct Handshake {
    ranks_with_data: usize,
    rows: u64,
    stop: bool,
    loss: f64,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use sluice_pipeline::collective::{LocalCollective, SingleRank};
    use tch::nn::{Module, VarStore};
    use tch::{Device, Tensor};

    use super::*;

    /// A fixed linear model, its parameters and a trainer on `collective`.
    fn linear(collective: Arc<dyn Collective>) -> (VarStore, tch::nn::Linear, Trainer) {
        let vs = VarStore::new(Device::Cpu);
        let model = tch::nn::linear(vs.root() / "l", 3, 2, Default::default());
        tch::no_grad(|| {
            let w = Tensor::from_slice(&[0.1f32, -0.2, 0.3, 0.4, 0.5, -0.6]).view([2, 3]);
            model.ws.shallow_clone().copy_(&w);
            let _ = model.bs.as_ref().unwrap().shallow_clone().fill_(0.05);
        });
        let options = TrainerOptions::sgd(0.5);
        let trainer = Trainer::new(&vs, options, collective).unwrap();
        (vs, model, trainer)
    }

    fn values(t: &Trainer) -> Vec<f32> {
        t.params()
            .iter()
            .flat_map(|(_, p)| Vec::<f32>::try_from(p.flatten(0, -1)).unwrap())
            .collect()
    }

    /// An empty batch on one rank (its very first step: no gradient defined yet) leaves the
    /// step to the other rank's rows alone, as if they were all the data; when every rank's
    /// batch is empty the step is counted and nothing moves.
    #[test]
    fn an_empty_batch_joins_the_step_with_weight_zero() {
        let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0, -1.0, 0.5, 2.0]).view([2, 3]);
        let y = Tensor::from_slice(&[1i64, 0]);
        let loss = |m: &tch::nn::Linear| m.forward(&x).cross_entropy_for_logits(&y);
        // The reference: one rank holding rank 1's rows.
        let (_vs, model, mut alone) = linear(Arc::new(SingleRank));
        alone.step(&loss(&model), 2).unwrap().unwrap();
        let expected = values(&alone);

        let handles: Vec<_> = LocalCollective::group(2)
            .into_iter()
            .enumerate()
            .map(|(rank, c)| {
                let (x, y) = (x.copy(), y.copy());
                std::thread::spawn(move || {
                    let (_vs, model, mut t) = linear(Arc::new(c));
                    let start = values(&t);
                    let rep = match rank {
                        0 => t.step_empty().unwrap().unwrap(),
                        _ => {
                            let l = model.forward(&x).cross_entropy_for_logits(&y);
                            t.step(&l, 2).unwrap().unwrap()
                        }
                    };
                    assert_eq!(rep.rows, 2);
                    let after_one = values(&t);
                    // Both ranks empty: counted, not applied.
                    let rep = t.step_empty().unwrap().unwrap();
                    assert_eq!((rep.rows, rep.step), (0, 2));
                    assert_eq!(values(&t), after_one);
                    (start, after_one)
                })
            })
            .collect();
        for h in handles {
            let (start, after) = h.join().unwrap();
            assert_ne!(start, after);
            assert!(after.iter().all(|v| v.is_finite()));
            for (a, e) in after.iter().zip(&expected) {
                assert!((a - e).abs() < 1e-6, "{after:?} vs {expected:?}");
            }
        }
    }
}
