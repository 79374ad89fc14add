//! `shuffle: {mode: global}`: the epoch's rows in the order of a seeded bijection over their
//! positions (Grain's index shuffle), read by random access in blocks.
//!
//! Position `p` of an epoch (`0..rows`) is row `σ(p)` of the epoch's rows in listing order,
//! where `σ` is a keyed pseudo-random permutation ([`Bijection`]): no buffer decides the
//! order, so every row can land anywhere in the epoch. Rank `r` of `w` takes positions
//! `r·q..(r+1)·q` with `q = rows / w` (equal shares; the `rows mod w` positions past the last
//! share are left out, a different few rows each epoch, and counted). A rank's positions are
//! cut into [`Block`]s of as many rows as `max_memory` holds decoded; a block is read by
//! fetching, from each row group it touches, only the pages holding its rows (the offset
//! index, when the files have one) and decoding the selected rows, then gathering them into
//! the permuted order (`gather.rs`). A checkpoint is (epoch, block, rows of it delivered):
//! indices alone, no buffered rows to rebuild.
//!
//! What random access costs: a block touches up to every page of the epoch, so one epoch
//! decodes about `rows_per_page × pages_touched` rows per block — with blocks larger than
//! the number of pages, roughly (data size / `max_memory`) passes over the data. Windows
//! (`mode: window`) read each row once; see `docs/config.md` for when to prefer which.

use std::sync::Arc;

use rand::Rng;

use super::ParquetFile;
use super::unit::{Unit, row_groups};

/// Stream domain of the bijection's round keys ([`crate::stage::seeded_rng`]).
const GLOBAL_DOMAIN: u64 = 0x676c_6f62; // "glob"

/// Feistel rounds. Four rounds of a good round function already give a pseudo-random
/// permutation (Luby–Rackoff); eight cost ~10 ns per position and leave no visible structure
/// on small domains, where few bits per half weaken each round.
const ROUNDS: usize = 8;

/// Bytes a block holds per row besides its values: where the row is and where it goes (the
/// row and its slot, 16 bytes each, the sort order and the row-group lists) and its share of
/// the lineage being emitted.
const ROW_OVERHEAD: u64 = 64;

/// A keyed pseudo-random permutation of `0..n`: a balanced Feistel network on the smallest
/// even number of bits that holds `n - 1`, restricted to `0..n` by cycle-walking (applied
/// again until the value falls inside; it does, since the cycle through a value inside
/// returns to it, and the domain is under `4n`, so ~4 rounds of walking at most on average).
///
/// Written here rather than taken from a crate: which row a checkpoint's position points at
/// is this function's output, so it is part of the checkpoint format and must never change
/// with a dependency's update; a test pins its values.
#[derive(Debug, Clone)]
pub(crate) struct Bijection {
    n: u64,
    half: u32,
    keys: [u64; ROUNDS],
}

impl Bijection {
    /// The permutation of `0..n` for `seed` and `epoch`.
    pub(crate) fn new(n: u64, seed: u64, epoch: u64) -> Self {
        let bits = (u64::BITS - n.saturating_sub(1).leading_zeros()).max(2);
        let half = bits.div_ceil(2);
        let mut rng = crate::stage::seeded_rng(seed, GLOBAL_DOMAIN, epoch, 0);
        let keys = std::array::from_fn(|_| rng.next_u64());
        Bijection { n, half, keys }
    }

    fn feistel(&self, x: u64) -> u64 {
        let mask = (1u64 << self.half) - 1;
        let (mut l, mut r) = (x >> self.half, x & mask);
        for k in self.keys {
            let t = l ^ (crate::stage::splitmix64(r ^ k) & mask);
            l = r;
            r = t;
        }
        (l << self.half) | r
    }

    /// The row at position `p` (`p < n`).
    pub(crate) fn get(&self, p: u64) -> u64 {
        // Positions come from the plan, which has none past the epoch's rows (a value
        // outside would walk forever).
        assert!(p < self.n, "position {p} of a permutation of {}", self.n);
        let mut x = self.feistel(p);
        while x >= self.n {
            x = self.feistel(x);
        }
        x
    }
}

/// The settings a global shuffle gives the source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GlobalShuffle {
    pub(crate) seed: u64,
    /// Decoded bytes of the rows one block holds.
    pub(crate) max_memory: u64,
}

/// Every row group of every file, in listing order, with where each starts in the epoch.
#[derive(Debug)]
pub(crate) struct GlobalPlan {
    units: Vec<Unit>,
    /// First row of each unit in the epoch's listing order.
    starts: Vec<u64>,
    pub(super) rows: u64,
    /// Rows per block: as many as `max_memory` holds decoded (at least one).
    pub(super) block_rows: u64,
}

impl GlobalPlan {
    pub(super) fn new(files: &[Arc<ParquetFile>], settings: GlobalShuffle) -> Self {
        let units: Vec<Unit> = files.iter().flat_map(row_groups).collect();
        let mut starts = Vec::with_capacity(units.len());
        let (mut rows, mut bytes) = (0u64, 0u64);
        for u in &units {
            starts.push(rows);
            rows += u.len;
            bytes += u.decoded_bytes();
        }
        let row_bytes = bytes.div_ceil(rows.max(1)) + ROW_OVERHEAD;
        GlobalPlan {
            units,
            starts,
            rows,
            block_rows: (settings.max_memory / row_bytes).clamp(1, u32::MAX as u64),
        }
    }

    /// The unit holding row `g` of the epoch, and the row within it.
    pub(super) fn locate(&self, g: u64) -> (u32, u64) {
        let i = self.starts.partition_point(|s| *s <= g) - 1;
        (i as u32, g - self.starts[i])
    }

    pub(super) fn unit(&self, i: u32) -> &Unit {
        &self.units[i as usize]
    }

    /// This rank's blocks of `epoch`.
    pub(super) fn blocks(
        self: &Arc<Self>,
        seed: u64,
        epoch: u64,
        rank: usize,
        world: usize,
    ) -> Vec<Block> {
        let share = self.rows / world as u64;
        let perm = Arc::new(Bijection::new(self.rows, seed, epoch));
        let start = share * rank as u64;
        (0..share.div_ceil(self.block_rows))
            .map(|b| {
                let first = start + b * self.block_rows;
                Block {
                    plan: self.clone(),
                    perm: perm.clone(),
                    first,
                    len: self.block_rows.min(start + share - first),
                }
            })
            .collect()
    }
}

/// Positions `first..first+len` of an epoch's permutation: the unit of reading of a global
/// shuffle.
#[derive(Debug, Clone)]
pub(crate) struct Block {
    pub(super) plan: Arc<GlobalPlan>,
    pub(super) perm: Arc<Bijection>,
    pub(super) first: u64,
    pub(super) len: u64,
}

impl Block {
    /// The rows of positions `first + from ..` in delivery order: (unit, row within it).
    pub(super) fn rows(&self, from: u64) -> Vec<(u32, u64)> {
        (self.first + from..self.first + self.len)
            .map(|p| self.plan.locate(self.perm.get(p)))
            .collect()
    }

    /// Memory reading this block from row `from` takes: its rows decoded, plus the pages of
    /// the row groups being read at once (`concurrent`, each at most its compressed chunks).
    pub(super) fn estimated_bytes(&self, from: u64, concurrent: usize) -> u64 {
        let units = &self.plan.units;
        let rows = self.len.saturating_sub(from);
        let decoded: u64 = units.iter().map(Unit::decoded_bytes).sum();
        let decoded = (decoded as u128 * rows as u128 / self.plan.rows.max(1) as u128) as u64
            + rows * ROW_OVERHEAD;
        let mut fetched: Vec<u64> = units.iter().map(Unit::fetched_bytes).collect();
        fetched.sort_unstable_by(|a, b| b.cmp(a));
        decoded + fetched.iter().take(concurrent).sum::<u64>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bijection_is_a_permutation_for_every_size() {
        for n in (1..300).chain([1023, 1024, 1025, 4097, 65_536, 100_003]) {
            let perm = Bijection::new(n, 7, 1);
            let mut seen = vec![false; n as usize];
            for p in 0..n {
                let g = perm.get(p) as usize;
                assert!(!seen[g], "n {n}: {g} twice");
                seen[g] = true;
            }
        }
    }

    /// The values are part of the checkpoint format (a position names a row through them):
    /// a change here would resume older checkpoints at other rows.
    #[test]
    fn the_bijection_is_pinned() {
        let perm = Bijection::new(1000, 0, 0);
        let got: Vec<u64> = (0..8).map(|p| perm.get(p)).collect();
        assert_eq!(
            got, PINNED,
            "the permutation changed: checkpoints would resume elsewhere"
        );
        let other = Bijection::new(1000, 0, 1);
        assert_ne!((0..8).map(|p| other.get(p)).collect::<Vec<_>>(), got);
    }
    const PINNED: [u64; 8] = [28, 548, 761, 349, 883, 606, 65, 805];

    /// No visible order: positions and rows are uncorrelated (Spearman's ρ near 0), the mean
    /// displacement is a third of the epoch, and consecutive positions land far apart.
    #[test]
    fn the_bijection_looks_uniform() {
        let n = 50_000u64;
        for seed in [0, 1, 99] {
            let perm = Bijection::new(n, seed, 3);
            let rows: Vec<f64> = (0..n).map(|p| perm.get(p) as f64).collect();
            let mean = (n - 1) as f64 / 2.0;
            let cov: f64 = rows
                .iter()
                .enumerate()
                .map(|(p, g)| (p as f64 - mean) * (g - mean))
                .sum();
            let var: f64 = (0..n).map(|p| (p as f64 - mean).powi(2)).sum();
            let rho = cov / var;
            assert!(rho.abs() < 0.02, "seed {seed}: rho {rho}");
            let disp: f64 = rows
                .iter()
                .enumerate()
                .map(|(p, g)| (p as f64 - g).abs())
                .sum::<f64>()
                / (n as f64 * n as f64);
            assert!((disp - 1.0 / 3.0).abs() < 0.01, "seed {seed}: {disp}");
            let near = rows
                .windows(2)
                .filter(|w| (w[0] - w[1]).abs() < 100.0)
                .count();
            // Uniform: P(|a − b| < 100) ≈ 200 / n = 0.4 %.
            assert!(
                (near as f64) < 0.01 * n as f64,
                "seed {seed}: {near} close pairs"
            );
        }
    }
}
