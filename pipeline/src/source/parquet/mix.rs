//! `mix`: several `path` entries read in set proportions, each epoch a planned share of each,
//! the entries interleaved evenly through the epoch.

use std::sync::Arc;

use super::ParquetSourceConfig;
use super::unit::{Unit, row_groups, take_rows};
use super::{ParquetFile, ParquetSource};
use crate::error::{Error, Result};

/// Domain of the `mix` permutations' generator.
const MIX_DOMAIN: u64 = 0x6d69_7865;

/// A `mix` planned over every file (see [`ParquetSource::plan_mix`]).
#[derive(Debug)]
pub(super) struct Mixed {
    /// Each entry's row groups, permuted by the mix's seed (the cycle its epochs read).
    units: Vec<Vec<Unit>>,
    /// Each entry's rows.
    pub(super) rows: Vec<u64>,
    /// Each entry's rows per epoch.
    pub(super) counts: Vec<u64>,
    pub(super) shares: Vec<crate::runtime::metrics::MixShare>,
}

impl Mixed {
    /// The units of `epoch`: entry `i` gives the next `counts[i]` rows of its cycle (from
    /// row `epoch · counts[i] mod rows[i]`, wrapping around), and the entries' units are
    /// interleaved in proportion — each placed by where its middle row falls in its entry's
    /// share — so that reading in plan order mixes the datasets evenly all through the epoch.
    pub(super) fn epoch(&self, epoch: u64) -> Vec<Unit> {
        // (entry, rows of the entry's share before the unit, unit)
        let mut placed: Vec<(usize, u64, Unit)> = Vec::new();
        for (i, units) in self.units.iter().enumerate() {
            let (rows, want) = (self.rows[i], self.counts[i]);
            if want == 0 || rows == 0 {
                continue;
            }
            let from = (u128::from(epoch) * u128::from(want) % u128::from(rows)) as u64;
            let head = (rows - from).min(want);
            let mut picked = Vec::new();
            take_rows(units, from, head, &mut picked);
            take_rows(units, 0, want - head, &mut picked);
            let mut before = 0;
            for u in picked {
                let len = u.len;
                placed.push((i, before, u));
                before += len;
            }
        }
        // By (2·before + len) / (2·count): the unit's middle as a fraction of its share,
        // compared exactly; ties in entry order.
        let key = |&(i, before, ref u): &(usize, u64, Unit)| {
            (
                u128::from(2 * before + u.len),
                u128::from(2 * self.counts[i]),
                i,
            )
        };
        placed.sort_by(|a, b| {
            let ((na, da, ia), (nb, db, ib)) = (key(a), key(b));
            (na * db).cmp(&(nb * da)).then(ia.cmp(&ib))
        });
        placed.into_iter().map(|(_, _, u)| u).collect()
    }
}

impl ParquetSource {
    /// With `mix`, once every file is open: the plan, made on the first call and kept (an
    /// error when the weights ask for more rows of an entry than it has).
    pub(super) fn mixed(&self) -> Result<Option<&Mixed>> {
        if self.config.mix.is_none() {
            return Ok(None);
        }
        if let Some(m) = self.mix_plan.get() {
            return Ok(Some(m));
        }
        let files = {
            let seen = self.files.seen()?;
            if !seen.complete {
                return Err(Error::Internal(
                    "a `mix` planned before every file was open".into(),
                ));
            }
            seen.files.clone()
        };
        let planned = self.plan_mix(&files)?;
        Ok(planned.map(|m| self.mix_plan.get_or_init(|| m)))
    }

    /// With `mix`: every `path` entry's row groups in its seeded order, and the rows of it
    /// every epoch takes, with what that is in words (an error when the weights ask for
    /// more rows of an entry than it has).
    fn plan_mix(&self, files: &[Arc<ParquetFile>]) -> Result<Option<Mixed>> {
        let Some(mix) = &self.config.mix else {
            return Ok(None);
        };
        let paths = self.config.path.as_ref().map_or(&[][..], |p| &p.0[..]);
        let mut units: Vec<Vec<Unit>> = vec![Vec::new(); paths.len()];
        for f in files {
            if let Some(u) = units.get_mut(f.object.entry) {
                u.extend(row_groups(f));
            }
        }
        let rows: Vec<u64> = units
            .iter()
            .map(|u| u.iter().map(|u| u.len).sum())
            .collect();
        let counts =
            mix_counts(&rows, &mix.weights, mix.rows_per_epoch, paths).map_err(|message| {
                Error::Source {
                    at: self.at.to_string(),
                    message,
                }
            })?;
        for (i, u) in units.iter_mut().enumerate() {
            use rand::seq::SliceRandom;
            u.shuffle(&mut crate::stage::seeded_rng(
                mix.seed, MIX_DOMAIN, 0, i as u64,
            ));
        }
        let shares = paths
            .iter()
            .zip(&rows)
            .zip(&counts)
            .map(
                |((path, &rows), &per_epoch)| crate::runtime::metrics::MixShare {
                    path: path.clone(),
                    rows,
                    per_epoch,
                },
            )
            .collect();
        Ok(Some(Mixed {
            units,
            rows,
            counts,
            shares,
        }))
    }
}

/// A `mix` that cannot work whatever the files hold: refused when the source opens.
pub(super) fn check_mix(
    mix: &super::Mix,
    config: &ParquetSourceConfig,
) -> std::result::Result<(), String> {
    let Some(paths) = &config.path else {
        return Err(
            "`mix` weighs the entries of a `path` list: list the datasets under `path` (one entry each), not in a `manifest`".into(),
        );
    };
    if mix.weights.len() != paths.0.len() {
        return Err(format!(
            "`mix.weights` has {} weight(s) for the {} `path` entries: give one per entry, in the same order",
            mix.weights.len(),
            paths.0.len()
        ));
    }
    if let Some((i, w)) = mix
        .weights
        .iter()
        .enumerate()
        .find(|(_, w)| !(w.is_finite() && **w > 0.0))
    {
        return Err(format!(
            "`mix.weights[{i}]` is {w}: weights must be positive numbers (leave an entry out of `path` to take none of it)"
        ));
    }
    if mix.rows_per_epoch == Some(0) {
        return Err("`mix.rows_per_epoch` must be at least 1".into());
    }
    Ok(())
}

/// `total` rows split in proportion to `weights`: each gets the floor of its quota, and the
/// rows left go to the largest remainders (ties to the earlier entry), so the parts sum to
/// `total` exactly.
pub(super) fn apportion(total: u64, weights: &[f64]) -> Vec<u64> {
    let sum: f64 = weights.iter().sum();
    let quotas: Vec<f64> = weights.iter().map(|w| total as f64 * w / sum).collect();
    let mut parts: Vec<u64> = quotas.iter().map(|q| q.floor() as u64).collect();
    // Fewer than one row per entry is left (more only through rounding: bounded anyway).
    let left = total
        .saturating_sub(parts.iter().sum())
        .min(parts.len() as u64);
    let mut order: Vec<usize> = (0..parts.len()).collect();
    order.sort_by(|&a, &b| {
        let (ra, rb) = (quotas[a] - quotas[a].floor(), quotas[b] - quotas[b].floor());
        rb.total_cmp(&ra).then(a.cmp(&b))
    });
    for &i in order.iter().cycle().take(left as usize) {
        parts[i] += 1;
    }
    parts
}

/// Rows of each entry (`rows`) an epoch of a `mix` takes: `rows_per_epoch` (or, without it,
/// the most that repeats no row) apportioned by `weights`.
pub(crate) fn mix_counts(
    rows: &[u64],
    weights: &[f64],
    rows_per_epoch: Option<u64>,
    paths: &[String],
) -> std::result::Result<Vec<u64>, String> {
    if let Some(i) = rows.iter().position(|&r| r == 0) {
        return Err(format!(
            "`mix`: `path` entry {i} (`{}`) has no rows (an empty file, or only files an earlier entry lists too — a file named by two entries belongs to the first)",
            paths.get(i).map_or("", |p| p.as_str())
        ));
    }
    // Relative to the largest weight: no sum of huge weights overflows.
    let largest = weights.iter().copied().fold(f64::MIN_POSITIVE, f64::max);
    let weights: Vec<f64> = weights.iter().map(|w| w / largest).collect();
    let weights = &weights[..];
    let sum: f64 = weights.iter().sum();
    // The most rows an epoch can take without repeating one: the entry with the fewest rows
    // per unit of weight (`limit`) read whole.
    let per_weight = |i: usize| rows[i] as f64 * sum / weights[i];
    let limit = (0..rows.len())
        .min_by(|&a, &b| per_weight(a).total_cmp(&per_weight(b)))
        .unwrap_or(0);
    let fits = |parts: &[u64]| parts.iter().zip(rows).all(|(p, r)| p <= r);
    // Floating-point rounding may put one row too many on a whole entry: step down.
    let mut cap = per_weight(limit).floor() as u64;
    let mut capped = apportion(cap, weights);
    for _ in 0..64 {
        if fits(&capped) || cap == 0 {
            break;
        }
        cap -= 1;
        capped = apportion(cap, weights);
    }
    let Some(want) = rows_per_epoch else {
        return Ok(capped);
    };
    let parts = apportion(want, weights);
    if want > cap || !fits(&parts) {
        return Err(format!(
            "`mix.rows_per_epoch: {want}` would take {} rows of `path` entry {limit} (`{}`), which has {}: an epoch never repeats a row, so these weights allow at most {cap} rows per epoch; lower `rows_per_epoch` or that entry's weight",
            want as f64 * weights[limit] / sum,
            paths.get(limit).map_or("", |p| p.as_str()),
            rows[limit]
        ));
    }
    Ok(parts)
}
