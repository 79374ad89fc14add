//! The search space file of `sluice sweep` (`--space sweep.yaml`):
//!
//! ```yaml
//! metric: {name: accuracy, mode: max}          # from the trials' evaluations
//! parameters:
//!   trainer.optimizer.lr: {type: loguniform, low: 0.001, high: 0.5}
//!   trainer.optimizer.momentum: {type: choice, values: [0.0, 0.9]}
//! seed: 0
//! scheduler: {type: asha, min_steps: 20, reduction: 3}   # or none
//! ```
//!
//! Trial `i`'s values are drawn from a generator seeded by `(seed, i)` alone, so a sweep
//! restarted after a crash draws the same trials, and trial `i` does not depend on how many
//! ran before it.

use std::collections::BTreeMap;

use chacha20::ChaCha8Rng;
use rand::{RngExt, SeedableRng};
use serde::Deserialize;

/// The `--space` file.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Space {
    /// What to optimise.
    pub metric: Metric,
    /// Setting path (as `--set` takes it) → distribution.
    pub parameters: BTreeMap<String, Param>,
    /// Seed of the draws. Default: 0.
    #[serde(default)]
    pub seed: u64,
    /// Early stopping. Default: none (every trial runs to its end).
    #[serde(default)]
    pub scheduler: Scheduler,
}

/// `metric:`: an evaluation field and its direction.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Metric {
    /// `accuracy` or `loss` (of `trainer.eval`).
    pub name: MetricName,
    /// `max` or `min`.
    pub mode: Mode,
}

/// An evaluation's field.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum MetricName {
    /// Held-out accuracy (cross-entropy models).
    Accuracy,
    /// Held-out mean loss.
    Loss,
}

/// Whether larger is better.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Larger is better.
    Max,
    /// Smaller is better.
    Min,
}

impl Metric {
    /// The metric of one evaluation line of a trial's step log (`{"eval": {...}}`).
    pub fn of(&self, eval: &serde_json::Value) -> Option<f64> {
        let key = match self.name {
            MetricName::Accuracy => "accuracy",
            MetricName::Loss => "loss",
        };
        eval.get(key).and_then(serde_json::Value::as_f64)
    }

    /// `value` as a score where larger is better.
    pub fn score(&self, value: f64) -> f64 {
        match self.mode {
            Mode::Max => value,
            Mode::Min => -value,
        }
    }
}

/// One parameter's distribution.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Param {
    /// Uniform in `[low, high]`.
    Uniform { low: f64, high: f64 },
    /// Log-uniform in `[low, high]` (both > 0): learning rates.
    Loguniform { low: f64, high: f64 },
    /// An integer in `[low, high]`, each equally likely.
    Int { low: i64, high: i64 },
    /// One of `values` (any YAML: numbers, strings, lists such as `[64, 64]`).
    Choice { values: Vec<serde_json::Value> },
}

impl Space {
    /// What can be checked before any trial runs.
    pub fn check(&self) -> Result<(), String> {
        if self.parameters.is_empty() {
            return Err("`parameters` is empty: name at least one setting to vary".into());
        }
        let bad_range = |l: f64, h: f64| !l.is_finite() || !h.is_finite() || l > h;
        for (path, p) in &self.parameters {
            let bad = match p {
                Param::Uniform { low, high } if bad_range(*low, *high) => Some("needs low ≤ high"),
                Param::Loguniform { low, high } if bad_range(*low, *high) || *low <= 0.0 => {
                    Some("needs 0 < low ≤ high")
                }
                Param::Int { low, high } if low > high => Some("needs low ≤ high"),
                Param::Choice { values } if values.is_empty() => Some("needs at least one value"),
                _ => None,
            };
            if let Some(why) = bad {
                return Err(format!("parameters.{path}: {why}"));
            }
        }
        if let Scheduler::Asha {
            min_steps,
            reduction,
        } = self.scheduler
            && (min_steps == 0 || reduction < 2)
        {
            return Err("scheduler: asha needs min_steps ≥ 1 and reduction ≥ 2".into());
        }
        Ok(())
    }

    /// Trial `trial`'s values, as `(path, YAML text)` overrides in path order.
    pub fn draw(&self, trial: u64) -> Vec<(String, String)> {
        let mut key = [0u8; 32];
        key[..8].copy_from_slice(&self.seed.to_le_bytes());
        key[8..16].copy_from_slice(&trial.to_le_bytes());
        key[16..24].copy_from_slice(b"sweep-v1");
        let mut rng = ChaCha8Rng::from_seed(key);
        self.parameters
            .iter()
            .map(|(path, p)| {
                let u: f64 = rng.random();
                let text = match p {
                    Param::Uniform { low, high } => format!("{:?}", low + u * (high - low)),
                    Param::Loguniform { low, high } => {
                        format!("{:?}", (low.ln() + u * (high.ln() - low.ln())).exp())
                    }
                    Param::Int { low, high } => {
                        let n = (high - low + 1) as f64;
                        format!("{}", low + ((u * n) as i64).min(high - low))
                    }
                    Param::Choice { values } => {
                        let i = ((u * values.len() as f64) as usize).min(values.len() - 1);
                        values[i].to_string()
                    }
                };
                (path.clone(), text)
            })
            .collect()
    }
}

/// `scheduler:`.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Scheduler {
    /// Every trial runs to its end.
    #[default]
    None,
    /// Asynchronous successive halving (Li et al. 2020; Ray Tune's `ASHAScheduler`): rungs at
    /// `min_steps × reduction^k` steps; a trial that reaches a rung below the best
    /// `1 / reduction` of the trials recorded there is stopped.
    Asha {
        /// The first rung. Default: 10.
        #[serde(default = "default_min_steps")]
        min_steps: u64,
        /// η. Default: 3.
        #[serde(default = "default_reduction")]
        reduction: u64,
    },
}

fn default_min_steps() -> u64 {
    10
}
fn default_reduction() -> u64 {
    3
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn space(yaml: &str) -> Space {
        serde_saphyr::from_str(yaml).unwrap()
    }

    #[test]
    fn draws_are_fixed_by_seed_and_trial_and_stay_in_range() {
        let s = space(
            "metric: {name: accuracy, mode: max}\nparameters:\n  a: {type: loguniform, low: 0.001, high: 0.1}\n  b: {type: int, low: 1, high: 3}\n  c: {type: choice, values: [[64], [128, 128]]}\n",
        );
        s.check().unwrap();
        assert_eq!(s.draw(5), s.draw(5));
        assert_ne!(s.draw(5), s.draw(6));
        let mut ints = std::collections::BTreeSet::new();
        for t in 0..200 {
            let d = s.draw(t);
            let a: f64 = d[0].1.parse().unwrap();
            assert!((0.001..=0.1).contains(&a), "{a}");
            ints.insert(d[1].1.clone());
            assert!(d[2].1 == "[64]" || d[2].1 == "[128,128]", "{}", d[2].1);
        }
        assert_eq!(ints.len(), 3, "every integer drawn: {ints:?}");
    }

    #[test]
    fn impossible_spaces_are_refused_naming_the_parameter() {
        let s = space(
            "metric: {name: loss, mode: min}\nparameters:\n  lr: {type: loguniform, low: 0, high: 1}\n",
        );
        assert!(s.check().unwrap_err().contains("parameters.lr"));
    }
}
