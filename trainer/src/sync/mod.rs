//! Gradient averaging between data-parallel ranks: gradients are flattened into buckets of
//! about `bucket_mb`, each bucket is summed over the ranks through the [`Collective`] and
//! written back — as f32, or compressed (`trainer.allreduce.compression`): f16 or bf16 on the
//! wire ([`wire`]), the top-k values of each bucket with error feedback, or PowerSGD's
//! low-rank factors ([`powersgd`]).
//!
//! Every rank's gradient is weighted by its share of the step's rows before the sum, so the
//! result is the gradient of the mean loss over all rows of the step — equal to what one
//! worker would compute on the concatenated batch, also when the last batches of an epoch
//! differ in size.

mod powersgd;
mod wire;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use half::f16;
use sluice_pipeline::collective::Collective;
use tch::{Device, Kind, Tensor};

use crate::TrainError;
use crate::config::Compression;

pub use crate::metrics::ReduceCost;

/// Bucketed gradient all-reduce for a fixed list of parameters.
#[derive(Debug)]
pub struct GradSync {
    collective: Arc<dyn Collective>,
    /// Parameter indices per bucket, every parameter.
    buckets: Vec<Vec<usize>>,
    /// Under PowerSGD: the buckets of the parameters that stay dense.
    dense_buckets: Vec<Vec<usize>>,
    compression: Compression,
    low_rank: Vec<powersgd::LowRank>,
    /// Top-k error feedback: per bucket, what was not sent yet.
    residuals: Vec<Vec<f32>>,
    scratch: Vec<f32>,
    summed: Vec<f32>,
    half: Vec<f16>,
    order: Vec<u32>,
}

/// Groups parameter indices (in order) into buckets of at most `cap` values (a larger
/// parameter gets a bucket of its own).
fn bucket(indices: impl Iterator<Item = usize>, sizes: &[usize], cap: usize) -> Vec<Vec<usize>> {
    let mut buckets: Vec<Vec<usize>> = Vec::new();
    let mut filled = 0usize;
    for i in indices {
        let n = sizes[i];
        if buckets.is_empty() || (filled + n > cap && filled > 0) {
            buckets.push(Vec::new());
            filled = 0;
        }
        if let Some(b) = buckets.last_mut() {
            b.push(i);
        }
        filled += n;
    }
    buckets
}

impl GradSync {
    /// Buckets `params` (in order) into groups of at most `bucket_bytes` of f32 gradients (a
    /// larger parameter gets a bucket of its own).
    pub fn new(
        collective: Arc<dyn Collective>,
        params: &[(String, Tensor)],
        bucket_bytes: usize,
        compression: Compression,
    ) -> Self {
        let cap = (bucket_bytes / 4).max(1);
        let sizes: Vec<usize> = params.iter().map(|(_, p)| p.numel()).collect();
        let buckets = bucket(0..params.len(), &sizes, cap);
        let low_rank = match compression {
            Compression::Powersgd { rank, .. } => {
                let shapes: Vec<Vec<i64>> = params.iter().map(|(_, p)| p.size()).collect();
                powersgd::plan(&shapes, rank)
            }
            _ => Vec::new(),
        };
        let dense_buckets = bucket(
            (0..params.len()).filter(|i| !low_rank.iter().any(|l| l.param == *i)),
            &sizes,
            cap,
        );
        GradSync {
            collective,
            buckets,
            dense_buckets,
            compression,
            low_rank,
            residuals: Vec::new(),
            scratch: Vec::new(),
            summed: Vec::new(),
            half: Vec::new(),
            order: Vec::new(),
        }
    }

    /// Number of buckets.
    pub fn buckets(&self) -> usize {
        self.buckets.len()
    }

    /// Replaces every parameter's gradient by `Σ_ranks weight_r · grad_r` (compressed as
    /// configured; `step` is the optimizer step about to be taken, for PowerSGD's
    /// `start_step`). A parameter without a gradient is an error (after the exchange, so no
    /// rank is left waiting).
    pub fn reduce(
        &mut self,
        params: &[(String, Tensor)],
        weight: f64,
        step: u64,
    ) -> Result<ReduceCost, TrainError> {
        let mut cost = ReduceCost {
            dense_bytes: params.iter().map(|(_, p)| p.numel() as u64 * 4).sum(),
            ..ReduceCost::default()
        };
        let low_rank = match self.compression {
            Compression::Powersgd {
                start_step,
                error_feedback,
                ..
            } if step >= start_step && !self.low_rank.is_empty() => Some(error_feedback),
            _ => None,
        };
        let buckets = match low_rank {
            Some(_) => std::mem::take(&mut self.dense_buckets),
            None => std::mem::take(&mut self.buckets),
        };
        let result = buckets
            .iter()
            .enumerate()
            .try_for_each(|(b, bucket)| self.reduce_bucket(params, b, bucket, weight, &mut cost));
        match low_rank {
            Some(_) => self.dense_buckets = buckets,
            None => self.buckets = buckets,
        }
        result?;
        if let Some(error_feedback) = low_rank {
            let t = Instant::now();
            let mut in_collective = Duration::ZERO;
            cost.wire_bytes += powersgd::reduce(
                self.collective.as_ref(),
                params,
                &mut self.low_rank,
                (weight, error_feedback),
                &mut self.scratch,
                &mut in_collective,
            )?;
            cost.collective += in_collective;
            cost.compress += t.elapsed().saturating_sub(in_collective);
        }
        Ok(cost)
    }

    /// Sums one bucket over the ranks and writes it back into the gradients.
    fn reduce_bucket(
        &mut self,
        params: &[(String, Tensor)],
        b: usize,
        bucket: &[usize],
        weight: f64,
        cost: &mut ReduceCost,
    ) -> Result<(), TrainError> {
        let t = Instant::now();
        let total: usize = bucket.iter().map(|&i| params[i].1.numel()).sum();
        self.scratch.clear();
        self.scratch.resize(total, 0.0);
        let mut off = 0;
        for &i in bucket {
            let p = &params[i].1;
            let n = p.numel();
            let g = p.grad();
            if g.defined() {
                let g = (g.to_device(Device::Cpu).to_kind(Kind::Float) * weight).contiguous();
                g.copy_data(&mut self.scratch[off..off + n], n);
            }
            off += n;
        }
        let c = self.collective.as_ref();
        let started = Instant::now();
        let mut converted = started - t;
        let sent = match self.compression {
            Compression::None | Compression::Powersgd { .. } => {
                wire::dense_f32(c, &mut self.scratch)?
            }
            Compression::Fp16 => wire::dense_f16(c, &mut self.scratch, &mut self.half)?,
            Compression::Bf16 => wire::dense_bf16(c, &mut self.scratch)?,
            Compression::Topk {
                ratio,
                error_feedback,
            } => {
                if self.residuals.len() <= b {
                    self.residuals.resize_with(b + 1, Vec::new);
                }
                let residual = &mut self.residuals[b];
                if residual.len() == total {
                    for (s, r) in self.scratch.iter_mut().zip(residual.iter()) {
                        *s += r;
                    }
                }
                let k = ((total as f64 * ratio).ceil() as usize).max(1);
                self.summed.clear();
                self.summed.resize(total, 0.0);
                let sent = wire::top_k(c, &mut self.scratch, k, &mut self.summed, &mut self.order)?;
                if error_feedback {
                    residual.clone_from(&self.scratch);
                } else {
                    residual.clear();
                }
                std::mem::swap(&mut self.scratch, &mut self.summed);
                sent
            }
        };
        cost.collective += started.elapsed();
        cost.wire_bytes += sent;
        let back = Instant::now();
        let mut off = 0;
        for &i in bucket {
            let p = &params[i].1;
            let n = p.numel();
            let summed = Tensor::from_slice(&self.scratch[off..off + n])
                .view(p.size().as_slice())
                .to_device(p.device());
            let mut g = p.grad();
            if !g.defined() {
                return Err(no_gradient(&params[i].0));
            }
            tch::no_grad(|| g.copy_(&summed));
            off += n;
        }
        converted += back.elapsed();
        if !matches!(self.compression, Compression::None) {
            cost.compress += converted;
        }
        Ok(())
    }

    /// Whether this rank holds state of its own (error-feedback residuals) that a checkpoint
    /// must keep per rank.
    pub fn has_rank_state(&self) -> bool {
        !self.residuals.is_empty() || self.low_rank.iter().any(|l| l.error().is_some())
    }

    /// This rank's own state, for a checkpoint: top-k residuals per bucket, PowerSGD errors
    /// per parameter.
    pub fn rank_state(&self, params: &[(String, Tensor)]) -> Vec<(String, Tensor)> {
        let mut out: Vec<(String, Tensor)> = self
            .residuals
            .iter()
            .enumerate()
            .filter(|(_, r)| !r.is_empty())
            .map(|(b, r)| (format!("residual.{b}"), Tensor::from_slice(r)))
            .collect();
        for l in &self.low_rank {
            if let Some(e) = l.error() {
                out.push((format!("error.{}", params[l.param].0), e.shallow_clone()));
            }
        }
        out
    }

    /// State the same on every rank (PowerSGD's warm-started `Q`s), for a checkpoint.
    pub fn shared_state(&self, params: &[(String, Tensor)]) -> Vec<(String, Tensor)> {
        self.low_rank
            .iter()
            .map(|l| (format!("q.{}", params[l.param].0), l.q().shallow_clone()))
            .collect()
    }

    /// Restores what [`GradSync::shared_state`] and (when this rank's is kept)
    /// [`GradSync::rank_state`] saved, by name without their prefixes.
    pub fn restore(
        &mut self,
        params: &[(String, Tensor)],
        shared: &BTreeMap<String, Tensor>,
        mine: Option<&BTreeMap<String, Tensor>>,
    ) {
        let empty = BTreeMap::new();
        let mine = mine.unwrap_or(&empty);
        for l in &mut self.low_rank {
            let name = &params[l.param].0;
            l.restore(
                shared.get(&format!("q.{name}")),
                mine.get(&format!("error.{name}")),
            );
        }
        self.residuals = (0..self.buckets.len())
            .map(|b| match mine.get(&format!("residual.{b}")) {
                Some(t) => Vec::<f32>::try_from(t.flatten(0, -1)).unwrap_or_default(),
                None => Vec::new(),
            })
            .collect();
        if self.residuals.iter().all(Vec::is_empty) {
            self.residuals.clear();
        }
    }
}

/// The error for a parameter that took no part in a step (after the exchange, so that no rank
/// is left waiting).
pub(crate) fn no_gradient(name: &str) -> TrainError {
    TrainError::Config(format!(
        "parameter `{name}` got no gradient in this step: every parameter must take part in every step of data-parallel training"
    ))
}

/// A checksum of the parameters' bits (FNV-1a over the f32 values, in order): equal on every
/// rank after every step, or the replicas have diverged.
pub fn checksum(params: &[(String, Tensor)]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut buf: Vec<f32> = Vec::new();
    for (_, p) in params {
        host_f32(p, &mut buf);
        for x in &buf {
            for b in x.to_bits().to_le_bytes() {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x100_0000_01b3);
            }
        }
    }
    h
}

/// Replaces `buf`'s contents with `t`'s values as f32, in row-major order, from any device
/// and float kind (one buffer reused across tensors).
pub(crate) fn host_f32(t: &Tensor, buf: &mut Vec<f32>) {
    let t = t
        .detach()
        .to_device(Device::Cpu)
        .to_kind(Kind::Float)
        .contiguous();
    let n = t.numel();
    buf.clear();
    buf.resize(n, 0.0);
    t.copy_data(buf, n);
}
