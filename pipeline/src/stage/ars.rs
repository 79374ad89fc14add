//! Draws version 3's words: a counter-based generator of five AES rounds, after ARS ("AES
//! Random Stream", Salmon, Moraes, Dror and Shaw, *Parallel random numbers: as easy as 1, 2,
//! 3*, SC 2011; ARS-5 passes TestU01's BigCrush). Block `j` of the stream starting at `stream`
//! is the counter `(j, stream)` (two little-endian 64-bit halves) XOR the first round key,
//! then five AES encryption rounds (`AESENC`: SubBytes, ShiftRows, MixColumns, AddRoundKey) with
//! ARS's Weyl key schedule — each round key the previous one plus (0x9E3779B97F4A7C15,
//! 0xBB67AE8584CAA73B), lane by lane. ARS's last round leaves out MixColumns; here every round
//! is a full one, one function for both the hardware and the portable path.
//!
//! Why: on CPUs without AVX-512 (no 64-bit vector multiply) SplitMix64 (version 2) was ~1.3 ns
//! per 32-bit word on the bench host (an AMD EPYC of the first Zen generation), a third of
//! `gaussian_noise`'s time; AES-NI makes the same words in ~0.3 ns, eight blocks in flight.
//! Without AES-NI (or off x86-64) the rounds come from the `aes` crate's portable
//! `hazmat::cipher_round`, which gives the same bytes (tested), several times slower.

use aes::Block;
use aes::hazmat::cipher_round;

/// Rounds after the first key's XOR.
const ROUNDS: usize = 5;

/// The round keys: a fixed first key (digits of π; the stream already carries the seed, stage,
/// column and row) and ARS's Weyl increments.
const KEYS: [[u8; 16]; ROUNDS + 1] = {
    let (mut lo, mut hi) = (0x243f_6a88_85a3_08d3_u64, 0x1319_8a2e_0370_7344_u64);
    let mut keys = [[0u8; 16]; ROUNDS + 1];
    let mut r = 0;
    while r <= ROUNDS {
        let (l, h) = (lo.to_le_bytes(), hi.to_le_bytes());
        let mut i = 0;
        while i < 8 {
            keys[r][i] = l[i];
            keys[r][8 + i] = h[i];
            i += 1;
        }
        lo = lo.wrapping_add(0x9e37_79b9_7f4a_7c15);
        hi = hi.wrapping_add(0xbb67_ae85_84ca_a73b);
        r += 1;
    }
    keys
};

/// Block `j` of the stream at `stream`, by the portable AES round.
fn block(stream: u64, j: u64) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&j.to_le_bytes());
    b[8..].copy_from_slice(&stream.to_le_bytes());
    for (x, k) in b.iter_mut().zip(&KEYS[0]) {
        *x ^= k;
    }
    let mut block = Block::from(b);
    for k in &KEYS[1..] {
        cipher_round(&mut block, &Block::from(*k));
    }
    block.into()
}

/// Blocks `first, first + 1, …` of the stream at `stream` into `out`, one per 16 bytes.
pub(crate) fn fill(stream: u64, first: u64, out: &mut [[u8; 16]]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("aes") {
        #[allow(unsafe_code)]
        // SAFETY: the CPU has AES-NI (checked just above).
        return unsafe { fill_aesni(stream, first, out) };
    }
    fill_portable(stream, first, out);
}

fn fill_portable(stream: u64, first: u64, out: &mut [[u8; 16]]) {
    // Counters wrap past `u64::MAX`, as the AES-NI path's do (an open range `first..` would
    // panic there in a debug build).
    for (k, o) in out.iter_mut().enumerate() {
        *o = block(stream, first.wrapping_add(k as u64));
    }
}

/// [`fill`] with AES-NI: eight blocks at a time, so that each round's eight `AESENC`s overlap
/// (one takes 4 cycles; two start per cycle).
///
/// # Safety
/// The CPU must support AES-NI.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[target_feature(enable = "aes")]
unsafe fn fill_aesni(stream: u64, first: u64, out: &mut [[u8; 16]]) {
    use std::arch::x86_64::{__m128i, _mm_aesenc_si128, _mm_set_epi64x, _mm_xor_si128};
    let half = |k: &[u8; 16], at: usize| {
        i64::from_le_bytes([
            k[at],
            k[at + 1],
            k[at + 2],
            k[at + 3],
            k[at + 4],
            k[at + 5],
            k[at + 6],
            k[at + 7],
        ])
    };
    let keys: [__m128i; ROUNDS + 1] = KEYS.map(|k| _mm_set_epi64x(half(&k, 8), half(&k, 0)));
    let rounds = |v: &mut [__m128i]| {
        for k in &keys[1..] {
            for x in v.iter_mut() {
                *x = _mm_aesenc_si128(*x, *k);
            }
        }
    };
    let counter = |j: u64| _mm_xor_si128(_mm_set_epi64x(stream as i64, j as i64), keys[0]);
    let store = |o: &mut [u8; 16], x: __m128i| {
        // SAFETY: both are 16 bytes, and every bit pattern is a valid `[u8; 16]`.
        *o = unsafe { std::mem::transmute::<__m128i, [u8; 16]>(x) };
    };
    let mut j = first;
    let mut chunks = out.chunks_exact_mut(8);
    for chunk in &mut chunks {
        let mut v: [__m128i; 8] = std::array::from_fn(|b| counter(j.wrapping_add(b as u64)));
        rounds(&mut v);
        for (o, x) in chunk.iter_mut().zip(v) {
            store(o, x);
        }
        j = j.wrapping_add(8);
    }
    for o in chunks.into_remainder() {
        let mut v = [counter(j)];
        rounds(&mut v);
        store(o, v[0]);
        j = j.wrapping_add(1);
    }
}

/// The stream as a generator, from block `next` on (four 32-bit words per block, in order;
/// a 64-bit draw is two words, the first the low half): for the draws after a row's words.
#[derive(Debug, Clone)]
pub(crate) struct ArsStream {
    stream: u64,
    next: u64,
    block: [u8; 16],
    used: usize,
}

impl ArsStream {
    /// The stream at `stream`, its next word the first of block `block`.
    pub(crate) fn at(stream: u64, block: u64) -> Self {
        ArsStream {
            stream,
            next: block,
            block: [0; 16],
            used: 4,
        }
    }
}

impl rand::TryRng for ArsStream {
    type Error = std::convert::Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Self::Error> {
        if self.used == 4 {
            // Through `fill`: AES-NI where the CPU has it.
            fill(
                self.stream,
                self.next,
                std::slice::from_mut(&mut self.block),
            );
            self.next = self.next.wrapping_add(1);
            self.used = 0;
        }
        let w = super::normal::word(&self.block[4 * self.used..]);
        self.used += 1;
        Ok(w)
    }

    fn try_next_u64(&mut self) -> Result<u64, Self::Error> {
        let lo = self.try_next_u32()?;
        Ok(u64::from(lo) | (u64::from(self.try_next_u32()?) << 32))
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Self::Error> {
        for chunk in dst.chunks_mut(4) {
            let w = self.try_next_u32()?.to_le_bytes();
            chunk.copy_from_slice(&w[..chunk.len()]);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    /// One AES round is `AESENC`: FIPS 197's example (Appendix B), its first round's input and
    /// round key, gives the state after round 1 that the standard lists.
    #[test]
    fn a_round_is_fips_197s_round() {
        let hex = |s: &str| -> [u8; 16] {
            std::array::from_fn(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
        };
        let mut state = Block::from(hex("193de3bea0f4e22b9ac68d2ae9f84808"));
        cipher_round(
            &mut state,
            &Block::from(hex("a0fafe1788542cb123a339392a6c7605")),
        );
        assert_eq!(
            <[u8; 16]>::from(state),
            hex("a49c7ff2689f352b6b5bea43026a5049")
        );
    }

    /// Every compiled variant gives the portable blocks, from any first block and for any
    /// count (whole groups of eight and the rest), and the generator continues them.
    #[test]
    fn every_variant_gives_the_portable_blocks() {
        let stream = 0x0123_4567_89ab_cdef;
        for (first, n) in [(0u64, 0usize), (0, 1), (0, 8), (5, 13), (u64::MAX - 3, 21)] {
            let want: Vec<[u8; 16]> = (0..n as u64)
                .map(|k| block(stream, first.wrapping_add(k)))
                .collect();
            let mut got = vec![[0u8; 16]; n];
            fill(stream, first, &mut got);
            assert_eq!(got, want, "dispatched, first {first}, {n} blocks");
            got.fill([0; 16]);
            fill_portable(stream, first, &mut got);
            assert_eq!(got, want, "portable, first {first}, {n} blocks");
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("aes") {
                got.fill([0; 16]);
                #[allow(unsafe_code)]
                // SAFETY: the CPU has AES-NI (checked just above).
                unsafe {
                    fill_aesni(stream, first, &mut got)
                };
                assert_eq!(got, want, "AES-NI, first {first}, {n} blocks");
            }
            let mut rng = ArsStream::at(stream, first);
            let words: Vec<u32> = (0..4 * n).map(|_| rng.next_u32()).collect();
            let flat: Vec<u32> = want
                .iter()
                .flat_map(|b| b.chunks_exact(4).map(super::super::normal::word))
                .collect();
            assert_eq!(words, flat);
        }
        // Neighbouring blocks and streams differ in about half their bits.
        let a = u128::from_le_bytes(block(1, 0));
        for b in [block(1, 1), block(2, 0)] {
            let d = (a ^ u128::from_le_bytes(b)).count_ones();
            assert!((40..=88).contains(&d), "{d} bits differ");
        }
    }

    /// The words are uniform: each of the 32 bits is set in half of 2²⁰ words, and each byte
    /// value is as frequent as the others (χ² over 255 degrees of freedom).
    #[test]
    fn words_are_uniform() {
        let mut rng = ArsStream::at(7, 0);
        let n = 1 << 20;
        let (mut bits, mut bytes) = ([0u32; 32], [0u32; 256]);
        for _ in 0..n {
            let w = rng.next_u32();
            for (b, c) in bits.iter_mut().enumerate() {
                *c += (w >> b) & 1;
            }
            for b in w.to_le_bytes() {
                bytes[usize::from(b)] += 1;
            }
        }
        // 5 standard deviations of a binomial(2²⁰, ½): 2,560.
        assert!(
            bits.iter().all(|&c| (c as i64 - n / 2).abs() < 2560),
            "{bits:?}"
        );
        let expected = 4.0 * n as f64 / 256.0;
        let chi2: f64 = bytes
            .iter()
            .map(|&c| (f64::from(c) - expected).powi(2) / expected)
            .sum();
        // The 0.1 % and 99.9 % points of χ²(255): 190.7 and 330.5.
        assert!((190.7..330.5).contains(&chi2), "χ² {chi2}");
    }
}
