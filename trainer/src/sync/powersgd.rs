//! PowerSGD (Vogels, Karimireddy & Jaggi 2019; PyTorch's `powerSGD_hook`): a gradient matrix
//! `M` (`[rows, rest]`, the parameter's first dimension by the others) travels as two thin
//! factors. Per step, for every compressed matrix at once:
//!
//! 1. `M ← weight·grad + error` (error feedback),
//! 2. `P = M·Q`, all-reduced (the sum of every rank's `P` is `(Σ M)·Q`), orthonormalised,
//! 3. `Q = Mᵀ·P̂`, all-reduced, kept for the next step (warm start),
//! 4. the gradient becomes `P̂·Qᵀ` (the rank-`r` projection of the sum of the ranks'
//!    gradients) and `error = M − P̂·Qᵀ / world` (what this rank's share lost).
//!
//! Every rank computes the same `P̂` and `Q` (sums in rank order, the same libtorch ops), so
//! replicas stay bitwise equal. Written here rather than taken from a crate: no Rust crate
//! implements it over an arbitrary collective.

use tch::{Device, Kind, Tensor};

use super::host_f32;
use crate::TrainError;
use sluice_pipeline::collective::Collective;

/// One compressed parameter: its matrix shape, the warm-started `Q` (the same on every
/// rank) and this rank's error.
#[derive(Debug)]
pub(super) struct LowRank {
    /// Index in the parameter list.
    pub param: usize,
    rows: i64,
    cols: i64,
    q: Tensor,
    error: Option<Tensor>,
}

/// Which parameters go low-rank at rank `r`: matrices whose two factors are smaller than
/// the matrix (PyTorch's rule), each with a fixed pseudo-random initial `Q` (the same on
/// every rank without touching libtorch's global generator).
pub(super) fn plan(shapes: &[Vec<i64>], r: usize) -> Vec<LowRank> {
    let r = r as i64;
    shapes
        .iter()
        .enumerate()
        .filter_map(|(i, shape)| {
            if shape.len() < 2 {
                return None;
            }
            let rows = shape[0];
            let cols: i64 = shape[1..].iter().product();
            ((rows + cols) * r < rows * cols).then(|| LowRank {
                param: i,
                rows,
                cols,
                q: initial_q(i as u64, cols, r),
                error: None,
            })
        })
        .collect()
}

/// Uniform values in [-1, 1) from SplitMix64 seeded by the parameter's index.
fn initial_q(seed: u64, cols: i64, r: i64) -> Tensor {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5EED;
    let values: Vec<f32> = (0..cols * r)
        .map(|_| {
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            ((z >> 40) as f32 / (1u64 << 23) as f32) - 1.0
        })
        .collect();
    Tensor::from_slice(&values).view([cols, r])
}

/// Gram–Schmidt on the columns of `p` (`[rows, r]`), in place order, with PyTorch's epsilon
/// so that a zero column stays finite.
fn orthonormalise(p: &Tensor) -> Tensor {
    let r = p.size()[1];
    let mut cols: Vec<Tensor> = Vec::with_capacity(r as usize);
    for j in 0..r {
        let mut c = p.select(1, j).copy();
        for prev in &cols {
            let dot = (&c * prev).sum(Kind::Float);
            c = &c - prev * dot;
        }
        let norm = c.norm() + 1e-8;
        cols.push(c / norm);
    }
    Tensor::stack(&cols, 1)
}

/// Replaces the gradients of the `low` parameters by their PowerSGD approximation of
/// `Σ_ranks weight·grad`, updating `Q` and the errors. Returns the bytes this rank sent.
pub(super) fn reduce(
    c: &dyn Collective,
    params: &[(String, Tensor)],
    low: &mut [LowRank],
    (weight, error_feedback): (f64, bool),
    scratch: &mut Vec<f32>,
    in_collective: &mut std::time::Duration,
) -> Result<u64, TrainError> {
    let world = c.world_size() as f64;
    let mut ms = Vec::with_capacity(low.len());
    for l in low.iter() {
        let g = params[l.param].1.grad();
        if !g.defined() {
            return Err(super::no_gradient(&params[l.param].0));
        }
        let mut m =
            (g.to_device(Device::Cpu).to_kind(Kind::Float) * weight).reshape([l.rows, l.cols]);
        if let Some(e) = &l.error {
            m = &m + e;
        }
        ms.push(m);
    }
    let ps: Vec<Tensor> = ms
        .iter()
        .zip(low.iter())
        .map(|(m, l)| m.matmul(&l.q))
        .collect();
    let mut sent = all_reduce_tensors(c, &ps, scratch, in_collective)?;
    let ps: Vec<Tensor> = unpack(scratch, low.iter().map(|l| l.rows), low)
        .iter()
        .map(orthonormalise)
        .collect();
    let qs: Vec<Tensor> = ms.iter().zip(&ps).map(|(m, p)| m.tr().matmul(p)).collect();
    sent += all_reduce_tensors(c, &qs, scratch, in_collective)?;
    let qs = unpack(scratch, low.iter().map(|l| l.cols), low);
    for ((l, m), (p, q)) in low.iter_mut().zip(ms).zip(ps.iter().zip(qs)) {
        let approx = p.matmul(&q.tr());
        l.error = error_feedback.then(|| &m - &approx / world);
        l.q = q;
        let mut g = params[l.param].1.grad();
        let shaped = approx.view(g.size().as_slice()).to_device(g.device());
        tch::no_grad(|| g.copy_(&shaped));
    }
    Ok(sent)
}

/// All-reduces the concatenation of `ts` in f32 through `scratch`. Returns the bytes sent.
fn all_reduce_tensors(
    c: &dyn Collective,
    ts: &[Tensor],
    scratch: &mut Vec<f32>,
    in_collective: &mut std::time::Duration,
) -> Result<u64, TrainError> {
    scratch.clear();
    let mut buf = Vec::new();
    for t in ts {
        host_f32(t, &mut buf);
        scratch.extend_from_slice(&buf);
    }
    let started = std::time::Instant::now();
    c.all_reduce_f32(scratch)?;
    *in_collective += started.elapsed();
    Ok(scratch.len() as u64 * 4)
}

/// Splits `flat` back into `[first, r]` matrices, one per compressed parameter.
fn unpack(flat: &[f32], firsts: impl Iterator<Item = i64>, low: &[LowRank]) -> Vec<Tensor> {
    let mut at = 0usize;
    firsts
        .zip(low)
        .map(|(n, l)| {
            let r = l.q.size()[1];
            let len = (n * r) as usize;
            let t = Tensor::from_slice(&flat[at..at + len]).view([n, r]);
            at += len;
            t
        })
        .collect()
}

impl LowRank {
    /// This rank's state for a checkpoint: the error (when there is one).
    pub(super) fn error(&self) -> Option<&Tensor> {
        self.error.as_ref()
    }

    /// The warm-started `Q` (the same on every rank).
    pub(super) fn q(&self) -> &Tensor {
        &self.q
    }

    /// Restores what a checkpoint held.
    pub(super) fn restore(&mut self, q: Option<&Tensor>, error: Option<&Tensor>) {
        if let Some(q) = q.filter(|q| q.size() == self.q.size()) {
            self.q = q.copy();
        }
        self.error = error
            .filter(|e| e.size() == [self.rows, self.cols])
            .map(Tensor::copy);
    }
}
