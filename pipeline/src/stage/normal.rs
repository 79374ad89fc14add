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
//! once, of which ChaCha8 itself is 1.0–1.2 ns per 32-bit word. Draws versions 2 and 3
//! ([`noise_row_f32_at`]) take the words by position instead, computed for the whole row at
//! once: version 2 from SplitMix64 (~0.1 ns per word with AVX-512's 64-bit multiplies, ~1.3 ns
//! on the AVX2-only bench host), version 3 from five AES rounds of a counter (~0.3 ns with
//! AES-NI, `super::ars`); in the tabular bench the noise's share of the CPU fell from ~19 % to
//! ~10 % with version 2 on AVX-512. The tables are constants
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
    if fast_row(words, row, std, rejected) > 0 {
        redraw_rejected(rng, words, row, std, rejected);
    }
}

/// The counter-based generators a row's words come from by position: SplitMix64 (draws
/// version 2) and ARS (version 3, `super::ars`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Counter {
    SplitMix64,
    Ars,
}

/// [`noise_row_f32`] with the words of a counter-based generator, the row's stream starting
/// at `stream`, computed for the whole row at once. SplitMix64: value `2j` takes the low half,
/// value `2j + 1` the high half of the stream's output `j`, `splitmix64(stream + j·γ)`
/// (vectorised; 64-bit multiplies on AVX-512). ARS: value `4j + k` takes word `k` of block `j`
/// (AES-NI where the CPU has it). The values the fast path rejects draw, in order, from the
/// stream's outputs after the row's.
pub(crate) fn noise_row_f32_at(
    counter: Counter,
    stream: u64,
    row: &mut [f32],
    std: f32,
    scratch: &mut Vec<u8>,
) {
    let n = row.len();
    // The row's words as whole outputs: 8-byte SplitMix64 outputs, 16-byte ARS blocks.
    let size = match counter {
        Counter::SplitMix64 => 8,
        Counter::Ars => 16,
    };
    let outputs = n.div_ceil(size / 4);
    if scratch.len() < size * outputs + n {
        scratch.resize(size * outputs + n, 0);
    }
    let (words, rest) = scratch.split_at_mut(size * outputs);
    let rejected = &mut rest[..n];
    match counter {
        Counter::SplitMix64 => splitmix_fill(stream, words),
        Counter::Ars => super::ars::fill(stream, 0, words.as_chunks_mut::<16>().0),
    }
    if fast_row(&words[..4 * n], row, std, rejected) == 0 {
        return;
    }
    let after = outputs as u64;
    match counter {
        Counter::SplitMix64 => {
            let mut rng = SplitMix64(stream.wrapping_add(after.wrapping_mul(GAMMA)));
            redraw_rejected(&mut rng, words, row, std, rejected);
        }
        Counter::Ars => {
            let mut rng = super::ars::ArsStream::at(stream, after);
            redraw_rejected(&mut rng, words, row, std, rejected);
        }
    }
}

/// The values the fast path rejected (flagged in `rejected`), each from its own word's layer
/// and sign and then from `rng`'s next words, in order.
fn redraw_rejected<G: Rng + ?Sized>(
    rng: &mut G,
    words: &[u8],
    row: &mut [f32],
    std: f32,
    rejected: &[u8],
) {
    // Eight flags at a time, as one word: a row of 128 has two rejected values on average, so
    // most words are 0 (a byte-by-byte scan was 4 % of the tabular bench's CPU, mostly
    // mispredicted branches). A flag is 0 or 1, so each set bit is one rejected value.
    for (c, flags) in rejected.chunks(8).enumerate() {
        let mut set = match <[u8; 8]>::try_from(flags) {
            Ok(bytes) => u64::from_le_bytes(bytes),
            // The row's last, shorter chunk (a copy of unknown length is a `memcpy` call: ~1 %
            // of the CPU when every chunk took it).
            Err(_) => {
                let mut bytes = [0u8; 8];
                bytes[..flags.len()].copy_from_slice(flags);
                u64::from_le_bytes(bytes)
            }
        };
        while set != 0 {
            let i = 8 * c + (set.trailing_zeros() / 8) as usize;
            set &= set - 1;
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

/// SplitMix64's increment γ, 2⁶⁴ over the golden ratio.
const GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

/// The output of SplitMix64 (Steele, Lea and Flood, 2014; Vigna's reference code) at state
/// `x`: the state advanced by γ, then mixed. Its outputs pass BigCrush; it is also how every
/// row identity and key here is hashed.
#[inline(always)]
pub(crate) fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(GAMMA);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// SplitMix64 as a generator, for the rare draws after a row's words. Written here (not
/// `rand_xoshiro`'s): the fast path computes the same outputs by position, and both must agree
/// bit for bit — [`splitmix_fill`] is tested against this.
#[derive(Debug, Clone)]
pub(crate) struct SplitMix64(pub u64);

impl rand::TryRng for SplitMix64 {
    type Error = std::convert::Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Self::Error> {
        Ok(self.try_next_u64()? as u32)
    }

    fn try_next_u64(&mut self) -> Result<u64, Self::Error> {
        let out = splitmix64(self.0);
        self.0 = self.0.wrapping_add(GAMMA);
        Ok(out)
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Self::Error> {
        for chunk in dst.chunks_mut(8) {
            let w = self.try_next_u64()?.to_le_bytes();
            chunk.copy_from_slice(&w[..chunk.len()]);
        }
        Ok(())
    }
}

/// Output `j` of the stream starting at `stream`, for every `j`, little-endian into `words`
/// (8 bytes each).
fn splitmix_fill(stream: u64, words: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512dq")
        {
            #[allow(unsafe_code)]
            // SAFETY: the CPU has AVX-512 F and DQ (checked just above).
            return unsafe { splitmix_fill_avx512(stream, words) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            #[allow(unsafe_code)]
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { splitmix_fill_avx2(stream, words) };
        }
    }
    splitmix_fill_body(stream, words)
}

/// [`splitmix_fill`] compiled for AVX-512 (eight 64-bit multiplies at once).
///
/// # Safety
/// The CPU must support AVX-512 F and DQ.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[target_feature(enable = "avx512f,avx512dq")]
unsafe fn splitmix_fill_avx512(stream: u64, words: &mut [u8]) {
    splitmix_fill_body(stream, words)
}

/// [`splitmix_fill`] compiled for AVX2.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[target_feature(enable = "avx2")]
unsafe fn splitmix_fill_avx2(stream: u64, words: &mut [u8]) {
    splitmix_fill_body(stream, words)
}

#[inline(always)]
fn splitmix_fill_body(stream: u64, words: &mut [u8]) {
    // As arrays, not `chunks_exact_mut(8)`: a slice of 8 bytes read as one is an interleaved
    // access to the vectoriser, which then leaves the last block to a narrower loop.
    for (j, w) in words.as_chunks_mut::<8>().0.iter_mut().enumerate() {
        let x = stream.wrapping_add((j as u64).wrapping_mul(GAMMA));
        *w = splitmix64(x).to_le_bytes();
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
    {
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
        {
            #[allow(unsafe_code)]
            // SAFETY: the CPU has AVX-512 F and BW (checked just above).
            return unsafe { fast_row_avx512(words, row, std, rejected) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            #[allow(unsafe_code)]
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { fast_row_avx2(words, row, std, rejected) };
        }
    }
    fast_row_body(words, row, std, rejected)
}

/// [`fast_row`] compiled for AVX-512 (sixteen lanes, gathers and masks).
///
/// # Safety
/// The CPU must support AVX-512 F and BW.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn fast_row_avx512(words: &[u8], row: &mut [f32], std: f32, rejected: &mut [u8]) -> u32 {
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

/// `K[i]` (high half) and `W[i]`'s bits (low half) in one entry: one table lookup per value
/// instead of two (with AVX2 the compiler loads them one by one; on the bench host, a
/// first-generation Zen, 0.8–0.9 ns per value against 1.0 with two tables).
static KW: [u64; 256] = {
    let mut kw = [0u64; 256];
    let mut i = 0;
    while i < 256 {
        kw[i] = ((K[i] as u64) << 32) | W[i].to_bits() as u64;
        i += 1;
    }
    kw
};

#[inline(always)]
fn fast_row_body(words: &[u8], row: &mut [f32], std: f32, rejected: &mut [u8]) -> u32 {
    let mut count = 0;
    // The words as `[u8; 4]` arrays, each one 32-bit load: read as `chunks_exact(4)` they were
    // an interleaved access to the vectoriser, which then left the last 64 values of every
    // row to an 8-lane loop — half of a 128-value row, and most of this function's time.
    for ((w, v), bad) in words.as_chunks::<4>().0.iter().zip(row).zip(rejected) {
        let r = u32::from_le_bytes(*w);
        let kw = KW[(r & 0xff) as usize];
        let m = r >> 9;
        let reject = m >= (kw >> 32) as u32;
        let d = std * signed(m as f32 * f32::from_bits(kw as u32), r);
        // A select, not a branch: the loop stays vectorised. A rejected value gets `-0.0`,
        // which leaves the float as it is (`x + -0.0` is `x` bit for bit, `-0.0` included; a
        // signalling NaN comes out quiet, as the redraw's own addition makes it anyway), so
        // the store is unconditional. Written as "keep `*v`", the select became a masked
        // store (`vmaskmovps`), slow on the bench host: 1.5 against 0.8–0.9 ns per value.
        *v += if reject { -0.0 } else { d };
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

    /// Checks that every value the fast path accepts — value `i` by word `words[i]` — is
    /// `row[i] + std · z` in `out`; returns the flags of the values it rejects (1, else 0).
    fn rejected_by_the_fast_path(row: &[f32], out: &[f32], words: &[u32], std: f32) -> Vec<u8> {
        row.iter()
            .zip(out)
            .zip(words)
            .enumerate()
            .map(|(i, ((v, o), &r))| {
                let (layer, m) = ((r & 0xff) as usize, r >> 9);
                if m >= K[layer] {
                    return 1;
                }
                assert_eq!(*o, v + std * signed(m as f32 * W[layer], r), "value {i}");
                0
            })
            .collect()
    }

    #[test]
    fn value_i_of_a_row_takes_word_i_unless_rejected() {
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        let row: Vec<f32> = (0..1000).map(|i| i as f32 / 7.0).collect();
        let (mut out, mut words) = (row.clone(), Vec::new());
        noise_row_f32(&mut rng, &mut out, 0.25, &mut words);
        let mut fresh = ChaCha8Rng::seed_from_u64(9);
        let mut after = ChaCha8Rng::seed_from_u64(9);
        after.set_word_pos(1000);
        let fresh_words: Vec<u32> = (0..1000).map(|_| fresh.next_u32()).collect();
        let rejected = rejected_by_the_fast_path(&row, &out, &fresh_words, 0.25)
            .iter()
            .map(|f| u32::from(*f))
            .sum::<u32>();
        // 1.5 % are rejected; their samples come from the words after the row's.
        assert!((5..40).contains(&rejected), "{rejected} rejected");
        assert!(rng.get_word_pos() > after.get_word_pos());
        // The vectorised fast path and the portable one agree bit for bit.
        let mut portable = row.clone();
        let (words, flags) = words.split_at(4000);
        let (mut flags_p, mut flags_v) = (vec![0u8; 1000], vec![0u8; 1000]);
        let a = fast_row_body(words, &mut portable, 0.25, &mut flags_p);
        assert_eq!(a, rejected);
        assert_eq!(flags_p, flags);
        // Each compiled variant the CPU can run, and the one dispatched to.
        type Variant = unsafe fn(&[u8], &mut [f32], f32, &mut [u8]) -> u32;
        let mut variants: Vec<(&str, Variant)> = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2") {
                variants.push(("avx2", fast_row_avx2));
            }
            if std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
            {
                variants.push(("avx512", fast_row_avx512));
            }
        }
        variants.push(("dispatched", fast_row));
        for (name, variant) in variants {
            let mut vectorised = row.clone();
            flags_v.fill(9);
            #[allow(unsafe_code)]
            // SAFETY: only the variants the CPU supports were listed.
            let b = unsafe { variant(words, &mut vectorised, 0.25, &mut flags_v) };
            assert_eq!(a, b, "{name}");
            assert_eq!(flags_p, flags_v, "{name}");
            assert!(
                portable
                    .iter()
                    .zip(&vectorised)
                    .all(|(x, y)| x.to_bits() == y.to_bits()),
                "{name}"
            );
        }
    }

    #[test]
    fn counter_rows_follow_the_standard_normal() {
        for counter in [Counter::SplitMix64, Counter::Ars] {
            let (mut out, mut scratch) = (vec![0.0f32; 125], Vec::new());
            let mut xs = Vec::with_capacity(1_000_000);
            for row in 0..8000u64 {
                out.fill(0.0);
                noise_row_f32_at(
                    counter,
                    splitmix64(0x5eed ^ row),
                    &mut out,
                    1.0,
                    &mut scratch,
                );
                xs.extend(out.iter().map(|x| f64::from(*x)));
            }
            assert_standard_normal(xs);
        }
    }

    /// Rows whose identities are neighbours (consecutive rows of a file) draw independent
    /// noise: the correlation of value `i` of row `r` with value `i` of row `r + 1`, and of
    /// value `i` with value `i + 1` of the same row, is within 4 standard errors of 0.
    #[test]
    fn counter_rows_and_values_are_uncorrelated() {
        let width = 64;
        for counter in [Counter::SplitMix64, Counter::Ars] {
            let rows: Vec<Vec<f32>> = (0..20_000u64)
                .map(|r| {
                    let mut out = vec![0.0f32; width];
                    let stream = splitmix64(0x1234 ^ r);
                    noise_row_f32_at(counter, stream, &mut out, 1.0, &mut Vec::new());
                    out
                })
                .collect();
            let corr = |pairs: &[(f32, f32)]| {
                let n = pairs.len() as f64;
                let s: f64 = pairs
                    .iter()
                    .map(|(a, b)| f64::from(*a) * f64::from(*b))
                    .sum();
                (s / n, 4.0 / n.sqrt())
            };
            let across: Vec<(f32, f32)> = rows
                .windows(2)
                .flat_map(|w| w[0].iter().copied().zip(w[1].iter().copied()))
                .collect();
            let within: Vec<(f32, f32)> = rows
                .iter()
                .flat_map(|r| r.windows(2).map(|w| (w[0], w[1])))
                .collect();
            for (what, pairs) in [("across rows", across), ("within a row", within)] {
                let (c, bound) = corr(&pairs);
                assert!(
                    c.abs() < bound,
                    "{counter:?} {what}: correlation {c}, bound {bound}"
                );
            }
        }
    }

    /// Value `4j + k` of a row takes word `k` of the ARS stream's block `j`, and the values the
    /// fast path rejects draw from the blocks after the row's.
    #[test]
    fn ars_value_i_takes_word_i() {
        use super::super::ars::{ArsStream, fill};
        use rand::Rng;
        let stream = 0xfeed_f00d_u64;
        let n: usize = 1001;
        let mut blocks = vec![[0u8; 16]; n.div_ceil(4)];
        fill(stream, 0, &mut blocks);
        let bytes = blocks.concat();
        let mut seq = ArsStream::at(stream, 0);
        let want: Vec<u32> = (0..4 * blocks.len()).map(|_| seq.next_u32()).collect();
        assert_eq!(bytes.chunks_exact(4).map(word).collect::<Vec<_>>(), want);

        let after = ArsStream::at(stream, blocks.len() as u64);
        assert_row_takes_its_words_then_redraws(Counter::Ars, stream, n, &bytes, &want, after);
    }

    /// A row of `n` values noised by `counter`'s stream at `stream` takes value `i` from
    /// `want[i]` (`bytes`, the same words as bytes) on the fast path, and its rejected values
    /// (a plausible share of them) redraw from `after`: the generator positioned after the
    /// row's words.
    fn assert_row_takes_its_words_then_redraws<G: Rng>(
        counter: Counter,
        stream: u64,
        n: usize,
        bytes: &[u8],
        want: &[u32],
        mut after: G,
    ) {
        let row: Vec<f32> = (0..n).map(|i| i as f32 / 7.0).collect();
        let (mut out, mut scratch) = (row.clone(), Vec::new());
        noise_row_f32_at(counter, stream, &mut out, 0.25, &mut scratch);
        let flags = rejected_by_the_fast_path(&row, &out, want, 0.25);
        let rejected = flags.iter().filter(|f| **f == 1).count();
        assert!(
            (5..40).contains(&rejected),
            "{counter:?}: {rejected} rejected"
        );
        let mut redrawn = row.clone();
        for (i, f) in flags.iter().enumerate() {
            if *f == 0 {
                redrawn[i] = out[i];
            }
        }
        redraw_rejected(&mut after, bytes, &mut redrawn, 0.25, &flags);
        assert!(
            redrawn
                .iter()
                .zip(&out)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{counter:?}"
        );
    }

    /// Value `2j` of a row takes the low half and `2j + 1` the high half of the stream's output
    /// `j` (every compiled variant of the fill agrees with the generator), and the values the
    /// fast path rejects draw from the outputs after the row's.
    #[test]
    fn splitmix_value_i_takes_half_of_output_i_over_2() {
        use rand::Rng;
        let stream = 0xdead_beef_u64;
        let n: usize = 1001;
        let mut seq = SplitMix64(stream);
        let want: Vec<u32> = (0..n.div_ceil(2))
            .flat_map(|_| {
                let u = seq.next_u64();
                [u as u32, (u >> 32) as u32]
            })
            .collect();
        let mut bytes = vec![0u8; 8 * n.div_ceil(2)];
        splitmix_fill_body(stream, &mut bytes);
        let got: Vec<u32> = bytes.chunks_exact(4).map(word).collect();
        assert_eq!(got, want);
        let mut dispatched = vec![0u8; bytes.len()];
        splitmix_fill(stream, &mut dispatched);
        assert_eq!(dispatched, bytes);
        #[cfg(target_arch = "x86_64")]
        #[allow(unsafe_code)]
        {
            // Each compiled variant the CPU can run, not only the one dispatched to.
            if std::arch::is_x86_feature_detected!("avx2") {
                dispatched.fill(0);
                // SAFETY: the CPU has AVX2 (checked just above).
                unsafe { splitmix_fill_avx2(stream, &mut dispatched) };
                assert_eq!(dispatched, bytes);
            }
            if std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512dq")
            {
                dispatched.fill(0);
                // SAFETY: the CPU has AVX-512 F and DQ (checked just above).
                unsafe { splitmix_fill_avx512(stream, &mut dispatched) };
                assert_eq!(dispatched, bytes);
            }
        }
        // The known first output of SplitMix64 from state 0 (Vigna's splitmix64.c).
        assert_eq!(SplitMix64(0).next_u64(), 0xe220_a839_7b1d_cdaf);

        // The generator positioned after the row's words.
        let mut after = SplitMix64(stream);
        for _ in 0..n.div_ceil(2) {
            after.next_u64();
        }
        assert_row_takes_its_words_then_redraws(
            Counter::SplitMix64,
            stream,
            n,
            &bytes,
            &want,
            after,
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
