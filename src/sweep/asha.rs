//! Asynchronous successive halving (Li et al., "A System for Massively Parallel
//! Hyperparameter Tuning", 2020), as Ray Tune's `ASHAScheduler` applies it: rungs at
//! `min_steps × η^k` steps; a trial reaching a rung is stopped when its score is below the
//! `(1 − 1/η)` quantile of the scores recorded at that rung so far (itself included), so
//! roughly the best `1/η` go on — decided at once, without waiting for a full bracket.

use std::collections::BTreeMap;

/// The rungs and what was recorded at them: milestone → (trial → score, larger is better).
#[derive(Debug, Clone, Default)]
pub struct Asha {
    min_steps: u64,
    reduction: u64,
    rungs: BTreeMap<u64, BTreeMap<u64, f64>>,
}

impl Asha {
    /// Rungs at `min_steps × reduction^k`.
    pub fn new(min_steps: u64, reduction: u64) -> Asha {
        Asha {
            min_steps: min_steps.max(1),
            reduction: reduction.max(2),
            rungs: BTreeMap::new(),
        }
    }

    /// Whether `step` is a rung.
    pub fn is_rung(&self, step: u64) -> bool {
        if step < self.min_steps || !step.is_multiple_of(self.min_steps) {
            return false;
        }
        let mut k = step / self.min_steps;
        while k.is_multiple_of(self.reduction) {
            k /= self.reduction;
        }
        k == 1
    }

    /// Records `trial`'s `score` at `step` (ignored off the rungs; a trial's first record at a
    /// rung counts) and says whether it goes on.
    pub fn goes_on(&mut self, trial: u64, step: u64, score: f64) -> bool {
        if !self.is_rung(step) {
            return true;
        }
        let rung = self.rungs.entry(step).or_default();
        let score = *rung.entry(trial).or_insert(score);
        let mut recorded: Vec<f64> = rung.values().copied().filter(|v| !v.is_nan()).collect();
        if score.is_nan() {
            return false;
        }
        recorded.sort_by(f64::total_cmp);
        score >= quantile(&recorded, 1.0 - 1.0 / self.reduction as f64)
    }
}

/// The `q` quantile of sorted `v` with linear interpolation (numpy's default).
fn quantile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NEG_INFINITY;
    }
    let at = q * (v.len() - 1) as f64;
    let (lo, hi) = (at.floor() as usize, at.ceil() as usize);
    v[lo] + (v[hi] - v[lo]) * (at - lo as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rungs_are_min_steps_times_powers_of_the_reduction() {
        let a = Asha::new(10, 3);
        let rungs: Vec<u64> = (1..=300).filter(|&s| a.is_rung(s)).collect();
        assert_eq!(rungs, vec![10, 30, 90, 270]);
    }

    /// The first trial at a rung goes on; later ones go on only among the best third.
    #[test]
    fn trials_below_the_top_fraction_of_a_rung_stop() {
        let mut a = Asha::new(10, 3);
        assert!(a.goes_on(0, 10, 0.5));
        assert!(!a.goes_on(1, 10, 0.4), "below 0.5 and 2/3 of the way to it");
        assert!(a.goes_on(2, 10, 0.9));
        assert!(!a.goes_on(3, 10, 0.45));
        assert!(a.goes_on(3, 15, 0.0), "not a rung");
        assert!(a.goes_on(2, 30, 0.95), "alone at the next rung");
        // A trial's first record counts: reporting again does not change it.
        assert!(!a.goes_on(1, 10, 1.0));
    }
}
