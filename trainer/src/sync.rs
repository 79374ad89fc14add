//! Gradient averaging between data-parallel ranks: gradients are flattened into buckets of
//! about `bucket_mb`, each bucket is all-reduced through the [`Collective`] (f32, or f16 on
//! the wire with `compression: fp16`) and written back.
//!
//! Every rank's gradient is weighted by its share of the step's rows before the sum, so the
//! result is the gradient of the mean loss over all rows of the step — equal to what one
//! worker would compute on the concatenated batch, also when the last batches of an epoch
//! differ in size.

use std::sync::Arc;
use std::time::{Duration, Instant};

use half::f16;
use sluice_pipeline::collective::Collective;
use tch::{Device, Kind, Tensor};

use crate::TrainError;
use crate::config::Compression;

/// Bucketed gradient all-reduce for a fixed list of parameters.
#[derive(Debug)]
pub struct GradSync {
    collective: Arc<dyn Collective>,
    /// Parameter indices per bucket.
    buckets: Vec<Vec<usize>>,
    compression: Compression,
    scratch: Vec<f32>,
    half: Vec<f16>,
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
        let mut buckets: Vec<Vec<usize>> = Vec::new();
        let mut filled = 0usize;
        for (i, (_, p)) in params.iter().enumerate() {
            let n = p.numel();
            if buckets.is_empty() || (filled + n > cap && filled > 0) {
                buckets.push(Vec::new());
                filled = 0;
            }
            if let Some(b) = buckets.last_mut() {
                b.push(i);
            }
            filled += n;
        }
        GradSync {
            collective,
            buckets,
            compression,
            scratch: Vec::new(),
            half: Vec::new(),
        }
    }

    /// Number of buckets.
    pub fn buckets(&self) -> usize {
        self.buckets.len()
    }

    /// Replaces every parameter's gradient by `Σ_ranks weight_r · grad_r`. A parameter
    /// without a gradient is an error (after the exchange, so no rank is left waiting). Returns the time spent in the
    /// collective.
    pub fn reduce(
        &mut self,
        params: &[(String, Tensor)],
        weight: f64,
    ) -> Result<Duration, TrainError> {
        let mut in_collective = Duration::ZERO;
        for bucket in &self.buckets {
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
            let started = Instant::now();
            match self.compression {
                Compression::None => self.collective.all_reduce_f32(&mut self.scratch)?,
                Compression::Fp16 => {
                    self.half.clear();
                    self.half
                        .extend(self.scratch.iter().map(|&x| f16::from_f32(x)));
                    self.collective.all_reduce_f16(&mut self.half)?;
                    for (d, s) in self.scratch.iter_mut().zip(&self.half) {
                        *d = s.to_f32();
                    }
                }
            }
            in_collective += started.elapsed();
            let mut off = 0;
            for &i in bucket {
                let p = &params[i].1;
                let n = p.numel();
                let summed = Tensor::from_slice(&self.scratch[off..off + n])
                    .view(p.size().as_slice())
                    .to_device(p.device());
                let mut g = p.grad();
                if !g.defined() {
                    return Err(TrainError::Config(format!(
                        "parameter `{}` got no gradient in this step: every parameter must take part in every step of data-parallel training",
                        params[i].0
                    )));
                }
                tch::no_grad(|| g.copy_(&summed));
                off += n;
            }
        }
        Ok(in_collective)
    }
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
