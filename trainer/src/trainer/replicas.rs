//! Replicas that are allowed to differ: local SGD (each rank steps alone, parameters averaged
//! every `every` steps) and state each rank keeps for itself (error-feedback residuals, and
//! under local SGD its own parameters and optimizer state), which a checkpoint holds per rank.

use std::collections::BTreeMap;
use std::time::Instant;

use tch::Tensor;

use super::Trainer;
use crate::TrainError;
use crate::config::SyncConfig;
use crate::sync::{ReduceCost, host_f32};

impl Trainer {
    /// Whether the step about to be taken is a local one (local SGD past its `start_step`).
    pub(super) fn local_now(&self) -> bool {
        match self.options.sync {
            SyncConfig::LocalSgd { start_step, .. } => self.step >= start_step,
            SyncConfig::Allreduce | SyncConfig::Async { .. } => false,
        }
    }

    /// Whether every rank holds the same parameters now: always under synchronous
    /// all-reduce; under local SGD only before `start_step` and right after an averaging.
    pub fn replicas_in_sync(&self) -> bool {
        match self.options.sync {
            SyncConfig::LocalSgd { every, start_step } => {
                self.step <= start_step || (self.step - start_step).is_multiple_of(every.max(1))
            }
            SyncConfig::Allreduce | SyncConfig::Async { .. } => true,
        }
    }

    /// How the replicas are kept together, in words, for a checkpoint holding per-rank state.
    pub fn sync_description(&self) -> String {
        format!(
            "sync {:?}, compression {:?}",
            self.options.sync, self.options.compression
        )
    }

    /// Whether each rank holds state a checkpoint must keep per rank.
    pub fn has_rank_state(&self) -> bool {
        matches!(self.options.sync, SyncConfig::LocalSgd { .. })
            || self.options.compression.has_rank_state()
    }

    pub(super) fn scale_grads(&self, weight: f64) {
        for (_, p) in &self.params {
            let mut g = p.grad();
            if g.defined() {
                let _ = tch::no_grad(|| g.g_mul_scalar_(weight));
            }
        }
    }

    /// Replaces every rank's parameters by their mean over the ranks (f32 sums in rank order,
    /// so the result is bitwise the same everywhere).
    pub(super) fn average_params(&mut self) -> Result<ReduceCost, TrainError> {
        let mut flat: Vec<f32> = Vec::new();
        let mut buf = Vec::new();
        for (_, p) in &self.params {
            host_f32(p, &mut buf);
            flat.extend_from_slice(&buf);
        }
        let started = Instant::now();
        self.collective.all_reduce_f32(&mut flat)?;
        let collective = started.elapsed();
        let inv = 1.0 / self.world_size() as f32;
        let mut off = 0;
        for (_, p) in &self.params {
            let n = p.numel();
            for x in &mut flat[off..off + n] {
                *x *= inv;
            }
            let mean = Tensor::from_slice(&flat[off..off + n])
                .view(p.size().as_slice())
                .to_device(p.device())
                .to_kind(p.kind());
            let mut p = p.shallow_clone();
            tch::no_grad(|| p.copy_(&mean));
            off += n;
        }
        Ok(ReduceCost {
            collective,
            wire_bytes: flat.len() as u64 * 4,
            ..ReduceCost::default()
        })
    }

    /// Under local SGD between averagings: averages the parameters now (the end of a run, so
    /// that its model is one model). A no-op when the replicas agree.
    pub fn synchronize(&mut self) -> Result<(), TrainError> {
        if !self.replicas_in_sync() {
            let cost = self.average_params()?;
            self.collective_time += cost.collective;
        }
        Ok(())
    }

    /// Runs `f` with every rank holding the mean of the replicas (evaluation between local-SGD
    /// averagings), then puts each rank's own parameters back.
    pub fn with_averaged<R>(
        &mut self,
        f: impl FnOnce(&mut Trainer) -> Result<R, TrainError>,
    ) -> Result<R, TrainError> {
        if self.replicas_in_sync() {
            return f(self);
        }
        let own: Vec<Tensor> = self.params.iter().map(|(_, p)| p.detach().copy()).collect();
        let cost = self.average_params()?;
        self.collective_time += cost.collective;
        let out = f(self);
        for ((_, p), o) in self.params.iter().zip(&own) {
            let mut p = p.shallow_clone();
            tch::no_grad(|| p.copy_(o));
        }
        out
    }

    /// This rank's own state for a checkpoint (empty when the ranks agree on everything):
    /// `sync.*` (residuals, errors), and under local SGD `model.*` and `optim.*`.
    pub fn rank_state_tensors(&self) -> Vec<(String, Tensor)> {
        let mut out: Vec<(String, Tensor)> = self
            .sync
            .rank_state(&self.params)
            .into_iter()
            .map(|(n, t)| (format!("sync.{n}"), t))
            .collect();
        if matches!(self.options.sync, SyncConfig::LocalSgd { .. }) {
            out.extend(
                self.state_tensors()
                    .into_iter()
                    .filter(|(n, _)| !n.starts_with("sync.")),
            );
        }
        out
    }

    /// Restores this rank's own state (what [`Trainer::rank_state_tensors`] saved, by name),
    /// after [`Trainer::restore`] restored the shared one.
    pub fn restore_rank(&mut self, mine: &BTreeMap<String, Tensor>) -> Result<(), TrainError> {
        let strip = |prefix: &str| -> BTreeMap<String, Tensor> {
            mine.iter()
                .filter_map(|(k, v)| {
                    k.strip_prefix(prefix)
                        .map(|n| (n.to_string(), v.shallow_clone()))
                })
                .collect()
        };
        if matches!(self.options.sync, SyncConfig::LocalSgd { .. })
            && mine.keys().any(|k| k.starts_with("model."))
        {
            self.restore(mine, self.step)?;
        }
        let shared = BTreeMap::new();
        self.sync
            .restore(&self.params, &shared, Some(&strip("sync.")));
        Ok(())
    }

    /// This rank's gradient of `loss` (mean over `rows > 0` rows; `None`: no rows, zeros), one
    /// f32 CPU tensor per parameter, in order — what a rank pushes to a parameter server.
    pub fn gradients(&mut self, loss: Option<&Tensor>) -> Vec<Tensor> {
        self.zero_grads();
        if let Some(loss) = loss {
            loss.backward();
        }
        self.params
            .iter()
            .map(|(_, p)| {
                let g = p.grad();
                if g.defined() {
                    g.to_device(tch::Device::Cpu)
                        .to_kind(tch::Kind::Float)
                        .copy()
                } else {
                    Tensor::zeros(p.size(), (tch::Kind::Float, tch::Device::Cpu))
                }
            })
            .collect()
    }

    /// Takes a parameter server's parameters (`values` in order) as of `version` updates.
    pub fn set_params(&mut self, values: &[Tensor], version: u64) {
        for ((_, p), v) in self.params.iter().zip(values) {
            let mut p = p.shallow_clone();
            let v = v.to_device(p.device()).to_kind(p.kind());
            tch::no_grad(|| p.copy_(&v));
        }
        self.step = version;
    }
}
