//! Standard normal samples as `f32` from one 32-bit draw each on the fast path (98.5 % of
//! samples): the ziggurat method of Marsaglia and Tsang (2000) with 256 layers and 23-bit
//! magnitudes (8 bits pick the layer, 1 the sign), the layout of numpy's float32 sampler.
//!
//! `rand_distr`'s `StandardNormal` draws 64 bits and samples an `f64` even for an `f32`
//! column. [`noise_row_f32`], which `gaussian_noise` runs on every float32 row, goes further:
//! it takes the row's words from the generator in one fill and runs the fast path over the
//! whole row at once (AVX2 gathers from the tables when the CPU has them); only the values it
//! rejects go through the sampler one by one. Measured (the stage on a 4096 × 128 batch, one
//! thread, ChaCha8 from `chacha20`): 3.0 ns per value one sample at a time, 2.6 ns a row at
//! once, of which ChaCha8 itself is 1.0–1.2 ns per 32-bit word. The tables are constants
//! (`ziggurat_tables.rs`, written by `scripts/ziggurat_tables.py`); only the wedge and tail
//! tests (1.5 % of samples) call `exp`/`ln`, in `f64`, as `rand_distr` does — so values depend
//! on nothing but the seed and the row, except that a libm rounding `exp`/`ln` differently
//! could move one of those rare samples.

use rand::Rng;

use super::ziggurat_tables::{F, K, R, W};

/// `row[i] += std · zᵢ` for one row, in place, the `zᵢ` independent standard normal samples
/// drawn from `rng`, positioned at the start of the row's stream. Value `i` takes word `i` on
/// the fast path; the values the fast path rejects (1.5 %) then draw, in order, from the
/// words after the row's. Bit-identical with and without AVX2 (the same IEEE operations,
/// never fused).
pub(crate) fn noise_row_f32<G: Rng + ?Sized>(
    rng: &mut G,
    row: &mut [f32],
    std: f32,
    scratch: &mut Vec<u8>,
) {
    let n = row.len();
    // Grown once, never cleared: the fill overwrites the words and the fast path every flag
    // (zeroing 5 bytes per value for every row: ~0.5 % of the tabular bench's CPU).
    if scratch.len() < 5 * n {
        scratch.resize(5 * n, 0);
    }
    let (words, rejected) = scratch[..5 * n].split_at_mut(4 * n);
    rng.fill_bytes(words);
    if fast_row(words, row, std, rejected) == 0 {
        return;
    }
    // 32 flags at a time (an OR without early exit, vectorised): a row of 128 has two
    // rejected values on average.
    for (c, flags) in rejected.chunks(32).enumerate() {
        if flags.iter().fold(0, |a, f| a | f) == 0 {
            continue;
        }
        for (j, _) in flags.iter().enumerate().filter(|(_, f)| **f != 0) {
            let i = 32 * c + j;
            let r = word(&words[4 * i..]);
            let layer = (r & 0xff) as usize;
            let z = match edge(rng, layer, (r >> 9) as f32 * W[layer]) {
                Some(x) => signed(x, r),
                None => standard_normal_f32(rng),
            };
            // The fast path left the rejected value as it was.
            row[i] += std * z;
        }
    }
}

/// A little-endian word of the generator's output.
#[inline(always)]
pub(crate) fn word(bytes: &[u8]) -> u32 {
    u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
}

/// `x` with the sign bit 8 of the word `r` gives it.
#[inline(always)]
fn signed(x: f32, r: u32) -> f32 {
    // Moved to the float's sign bit without a branch: one would be mispredicted every other
    // sample.
    f32::from_bits(x.to_bits() ^ ((r & 0x100) << 23))
}

/// The fast path over a row, in place (rejected values are left as they were, for the
/// caller, who finds them flagged in `rejected`); returns how many it rejected.
fn fast_row(words: &[u8], row: &mut [f32], std: f32, rejected: &mut [u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        #[allow(unsafe_code)]
        // SAFETY: the CPU has AVX2 (checked just above).
        return unsafe { fast_row_avx2(words, row, std, rejected) };
    }
    fast_row_body(words, row, std, rejected)
}

/// [`fast_row`] compiled for AVX2 (the table lookups become gathers).
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[target_feature(enable = "avx2")]
unsafe fn fast_row_avx2(words: &[u8], row: &mut [f32], std: f32, rejected: &mut [u8]) -> u32 {
    fast_row_body(words, row, std, rejected)
}

#[inline(always)]
fn fast_row_body(words: &[u8], row: &mut [f32], std: f32, rejected: &mut [u8]) -> u32 {
    let mut count = 0;
    for ((w, v), bad) in words.chunks_exact(4).zip(row).zip(rejected) {
        let r = word(w);
        let layer = (r & 0xff) as usize;
        let m = r >> 9;
        let reject = m >= K[layer];
        let noisy = *v + std * signed(m as f32 * W[layer], r);
        // A select, not a branch: the loop stays vectorised.
        *v = if reject { *v } else { noisy };
        *bad = u8::from(reject);
        count += u32::from(reject);
    }
    count
}

/// One sample of N(0, 1).
#[inline]
pub(crate) fn standard_normal_f32<G: Rng + ?Sized>(rng: &mut G) -> f32 {
    loop {
        let r = rng.next_u32();
        let layer = (r & 0xff) as usize;
        let m = r >> 9;
        let x = m as f32 * W[layer];
        let x = if m < K[layer] {
            Some(x)
        } else {
            edge(rng, layer, x)
        };
        if let Some(x) = x {
            return signed(x, r);
        }
    }
}

/// A uniform draw in `[0, 1)` with 24 bits.
fn unit<G: Rng + ?Sized>(rng: &mut G) -> f64 {
    f64::from(rng.next_u32() >> 8) * (1.0 / 16_777_216.0)
}

/// The rare cases: the tail beyond `R` (layer 0) or the wedge of a layer; `None` rejects.
#[cold]
fn edge<G: Rng + ?Sized>(rng: &mut G, layer: usize, x: f32) -> Option<f32> {
    if layer == 0 {
        // Marsaglia (1964): the tail of the normal beyond R.
        loop {
            let a = -(1.0 - unit(rng)).ln() / R;
            let b = -(1.0 - unit(rng)).ln();
            if b + b > a * a {
                return Some((R + a) as f32);
            }
        }
    }
    let x = f64::from(x);
    let y = F[layer] + unit(rng) * (F[layer - 1] - F[layer]);
    (y < (-0.5 * x * x).exp()).then_some(x as f32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chacha20::ChaCha8Rng;
    use rand::SeedableRng;

    /// Φ(x), the standard normal CDF.
    fn phi(x: f64) -> f64 {
        0.5 * erfc(-x / std::f64::consts::SQRT_2)
    }

    /// erfc by the Maclaurin series of erf below 2.5 and its continued fraction above; relative
    /// error < 1e-13 over the range the tests use.
    fn erfc(x: f64) -> f64 {
        if x < 0.0 {
            return 2.0 - erfc(-x);
        }
        if x < 2.5 {
            // erf(x) = 2/√π Σ (-1)^n x^(2n+1) / (n! (2n+1))
            let (mut term, mut sum, mut n) = (x, x, 0.0f64);
            while term.abs() > 1e-17 * sum.abs() {
                n += 1.0;
                term *= -x * x / n;
                sum += term / (2.0 * n + 1.0);
            }
            return 1.0 - 2.0 / std::f64::consts::PI.sqrt() * sum;
        }
        // erfc(x) = e^{-x²}/√π · 1/(x + 1/2/(x + 1/(x + 3/2/(x + …))))
        let mut f = x;
        for k in (1..60).rev() {
            f = x + (k as f64 / 2.0) / f;
        }
        (-x * x).exp() / std::f64::consts::PI.sqrt() / f
    }

    /// Mean, variance, a Kolmogorov–Smirnov test and the tail's share of 1M samples.
    fn assert_standard_normal(mut xs: Vec<f64>) {
        let n = xs.len();
        assert_eq!(n, 1_000_000);
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n as f64;
        assert!(mean.abs() < 0.005, "mean {mean}");
        assert!((var - 1.0).abs() < 0.005, "variance {var}");
        // Kolmogorov–Smirnov: 1.63/√n is the 1 % critical value.
        xs.sort_by(f64::total_cmp);
        let d = xs
            .iter()
            .enumerate()
            .map(|(i, x)| {
                let c = phi(*x);
                (c - i as f64 / n as f64)
                    .abs()
                    .max((c - (i + 1) as f64 / n as f64).abs())
            })
            .fold(0.0, f64::max);
        assert!(d < 1.63 / (n as f64).sqrt(), "KS distance {d}");
        // The tail beyond R (sampled on the slow path) has its share: 2 (1 − Φ(R)) ≈ 2.58e-4.
        let tail = xs.iter().filter(|x| x.abs() > R).count() as f64 / n as f64;
        let want = 2.0 * (1.0 - phi(R));
        assert!(
            (tail - want).abs() < 5.0 * (want / n as f64).sqrt(),
            "tail share {tail}, want {want}"
        );
        // No sample is infinite or NaN (the tail takes a logarithm).
        assert!(xs.iter().all(|x| x.is_finite()));
    }

    #[test]
    fn samples_follow_the_standard_normal() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        assert_standard_normal(
            (0..1_000_000)
                .map(|_| f64::from(standard_normal_f32(&mut rng)))
                .collect(),
        );
    }

    #[test]
    fn rows_follow_the_standard_normal() {
        let mut rng = ChaCha8Rng::seed_from_u64(8);
        let (mut out, mut words) = (vec![0.0f32; 125], Vec::new());
        let mut xs = Vec::with_capacity(1_000_000);
        for row in 0..8000 {
            rng.set_stream(row);
            out.fill(0.0);
            noise_row_f32(&mut rng, &mut out, 1.0, &mut words);
            xs.extend(out.iter().map(|x| f64::from(*x)));
        }
        assert_standard_normal(xs);
    }

    #[test]
    fn value_i_of_a_row_takes_word_i_unless_rejected() {
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        let row: Vec<f32> = (0..1000).map(|i| i as f32 / 7.0).collect();
        let (mut out, mut words) = (row.clone(), Vec::new());
        noise_row_f32(&mut rng, &mut out, 0.25, &mut words);
        let mut fresh = ChaCha8Rng::seed_from_u64(9);
        let (mut rejected, mut after) = (0, ChaCha8Rng::seed_from_u64(9));
        after.set_word_pos(1000);
        for (i, v) in row.iter().enumerate() {
            let r = fresh.next_u32();
            let (layer, m) = ((r & 0xff) as usize, r >> 9);
            if m < K[layer] {
                assert_eq!(
                    out[i],
                    v + 0.25 * signed(m as f32 * W[layer], r),
                    "value {i}"
                );
            } else {
                rejected += 1;
            }
        }
        // 1.5 % are rejected; their samples come from the words after the row's.
        assert!((5..40).contains(&rejected), "{rejected} rejected");
        assert!(rng.get_word_pos() > after.get_word_pos());
        // The vectorised fast path and the portable one agree bit for bit.
        let mut portable = row.clone();
        let mut vectorised = row.clone();
        let (words, flags) = words.split_at(4000);
        let (mut flags_p, mut flags_v) = (vec![0u8; 1000], vec![0u8; 1000]);
        let a = fast_row_body(words, &mut portable, 0.25, &mut flags_p);
        let b = fast_row(words, &mut vectorised, 0.25, &mut flags_v);
        assert_eq!(a, rejected);
        assert_eq!(a, b);
        assert_eq!(flags_p, flags_v);
        assert_eq!(flags_p, flags);
        assert!(
            portable
                .iter()
                .zip(&vectorised)
                .all(|(x, y)| x.to_bits() == y.to_bits())
        );
    }

    #[test]
    fn the_tables_are_consistent() {
        // Layer 0 (base strip and tail) accepts below R; the top layer always tests its wedge.
        assert_eq!(K[1], 0);
        assert!((f64::from(K[0]) * f64::from(W[0]) - R).abs() < 1e-6);
        assert!((f64::from(W[255]) * 8_388_608.0 - R).abs() < 1e-6);
        assert_eq!(F[0], 1.0);
        assert!(F.windows(2).all(|f| f[0] > f[1]));
        assert!(K[2..].iter().all(|&k| k < 1 << 23));
    }
}
