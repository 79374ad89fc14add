//! `standardize` done inside the next stage's pass over each row.
//!
//! `standardize` followed by `gaussian_noise` or `feature_dropout` on its columns reads and
//! writes every value twice, a whole batch apart (on the tabular bench, 4096 rows × 512 bytes:
//! more than the L2 cache). Fused by the plan pass `exec::passes::fuse_standardize`, the
//! second stage standardizes each row just before its own work on it, while the row is in the
//! L1 cache, and the `standardize` stage passes its batches on untouched ([`Deferred`]). The
//! values are bit for bit those of the two stages one after the other: [`RowAffine`] is what
//! `standardize` itself runs, the same IEEE operations on the same values in the same order.

use std::ops::{Div, Sub};

use super::Transform;
use crate::batch::Batch;
use crate::error::Result;

/// `v = (v − mean[k]) / std[k]` for element `k` of each row (one mean and std: every value),
/// the statistics converted to the values' type once.
#[derive(Debug, Clone)]
pub(crate) struct RowAffine<N> {
    mean: Vec<N>,
    std: Vec<N>,
}

impl<N: Copy + Sub<Output = N> + Div<Output = N>> RowAffine<N> {
    /// From a `standardize` column's statistics: one value, or one per list element (a single
    /// mean with per-element stds is repeated, and the other way round).
    pub(crate) fn new(mean: &[f64], std: &[f64], of: fn(f64) -> N) -> Self {
        let width = mean.len().max(std.len()).max(1);
        let pick = |v: &[f64], k: usize| of(if v.len() == 1 { v[0] } else { v[k] });
        RowAffine {
            mean: (0..width).map(|k| pick(mean, k)).collect(),
            std: (0..width).map(|k| pick(std, k)).collect(),
        }
    }

    /// Standardizes `values`: whole rows of the statistics' width (the leaf values of a
    /// fixed-size list start at element 0 of a row), or any values with one mean and std.
    /// The per-element loop runs over rows against two slices of the same width, which the
    /// compiler vectorises: as wide as the CPU allows (a subtract and a divide are exactly
    /// rounded at any width, so the values do not depend on it). Built for the baseline
    /// target alone it ran four values at a time with one `divps` each, ~3 % of the tabular
    /// bench's CPU on an AVX-512 host (2026-12-02).
    pub(crate) fn apply(&self, values: &mut [N]) {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: the CPU has AVX-512F, checked just above.
                #[allow(unsafe_code)]
                return unsafe { self.apply_avx512(values) };
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU has AVX2, checked just above.
                #[allow(unsafe_code)]
                return unsafe { self.apply_avx2(values) };
            }
        }
        self.apply_here(values)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    #[allow(unsafe_code)]
    unsafe fn apply_avx512(&self, values: &mut [N]) {
        self.apply_here(values)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    #[allow(unsafe_code)]
    unsafe fn apply_avx2(&self, values: &mut [N]) {
        self.apply_here(values)
    }

    /// The loops, compiled into each caller for its target features.
    #[inline(always)]
    fn apply_here(&self, values: &mut [N]) {
        if let ([m], [s]) = (self.mean.as_slice(), self.std.as_slice()) {
            let (m, s) = (*m, *s);
            values.iter_mut().for_each(|v| *v = (*v - m) / s);
            return;
        }
        for row in values.chunks_mut(self.mean.len()) {
            for ((v, &m), &s) in row.iter_mut().zip(&self.mean).zip(&self.std) {
                *v = (*v - m) / s;
            }
        }
    }
}

/// A `standardize` stage whose work the next stage does, row by row: batches pass through.
#[derive(Debug)]
pub(crate) struct Deferred;

impl Transform for Deferred {
    fn apply(&self, batch: Batch) -> Result<Batch> {
        Ok(batch)
    }

    fn passes_through(&self) -> bool {
        true
    }
}

#[cfg(test)]
#[path = "fused_tests.rs"]
mod tests;
