//! Optimizers and learning-rate schedules, written over tch tensors so that their whole
//! state (momentum, Adam moments, step count) is ours to checkpoint and restore bit for bit
//! (tch's optimizers keep theirs inside libtorch, out of reach of a checkpoint).

use std::collections::BTreeMap;

use tch::Tensor;

use crate::TrainError;
use crate::config::{Decay, OptimizerConfig, ScheduleConfig};

/// An optimizer over a fixed, name-ordered list of parameters.
#[derive(Debug)]
pub struct Optimizer {
    config: OptimizerConfig,
    params: Vec<(String, Tensor)>,
    /// Per parameter: `[momentum]` (SGD) or `[m, v]` (AdamW).
    state: Vec<Vec<Tensor>>,
    /// Updates applied so far.
    steps: u64,
}

impl Optimizer {
    /// An optimizer for `params` (trainable tensors, in a fixed order on every rank).
    pub fn new(config: OptimizerConfig, params: Vec<(String, Tensor)>) -> Self {
        let slots = match config {
            OptimizerConfig::Sgd { momentum, .. } if momentum != 0.0 => 1,
            OptimizerConfig::Sgd { .. } => 0,
            OptimizerConfig::Adamw { .. } => 2,
        };
        let state = params
            .iter()
            .map(|(_, p)| (0..slots).map(|_| p.zeros_like()).collect())
            .collect();
        Optimizer {
            config,
            params,
            state,
            steps: 0,
        }
    }

    /// Applies one update with learning rate `lr`, from the parameters' `.grad()`.
    pub fn step(&mut self, lr: f64) {
        self.step_by(lr, |p| p.grad());
    }

    /// Applies one update with learning rate `lr` from `grads` (one per parameter, in order):
    /// a parameter server's update from gradients that did not come from its own backward.
    pub fn step_with(&mut self, lr: f64, grads: &[Tensor]) {
        let mut next = grads.iter();
        self.step_by(lr, |_| {
            next.next().map(Tensor::shallow_clone).unwrap_or_default()
        });
    }

    fn step_by(&mut self, lr: f64, mut grad_of: impl FnMut(&Tensor) -> Tensor) {
        let first = self.steps == 0;
        self.steps += 1;
        let t = self.steps as i32;
        tch::no_grad(|| {
            for ((_, p), st) in self.params.iter().zip(self.state.iter_mut()) {
                let g = grad_of(p);
                if !g.defined() {
                    continue;
                }
                let mut p = p.shallow_clone();
                match self.config {
                    OptimizerConfig::Sgd {
                        momentum,
                        weight_decay,
                        nesterov,
                        ..
                    } => {
                        let mut g = if weight_decay != 0.0 {
                            &g + &p * weight_decay
                        } else {
                            g
                        };
                        if momentum != 0.0 {
                            let buf = &mut st[0];
                            if first {
                                buf.copy_(&g);
                            } else {
                                let _ = buf.g_mul_scalar_(momentum);
                                let _ = buf.g_add_(&g);
                            }
                            g = if nesterov {
                                &g + &*buf * momentum
                            } else {
                                buf.shallow_clone()
                            };
                        }
                        let _ = p.g_sub_(&(g * lr));
                    }
                    OptimizerConfig::Adamw {
                        beta1,
                        beta2,
                        eps,
                        weight_decay,
                        ..
                    } => {
                        if weight_decay != 0.0 {
                            let _ = p.g_mul_scalar_(1.0 - lr * weight_decay);
                        }
                        let (m, v) = st.split_at_mut(1);
                        let (m, v) = (&mut m[0], &mut v[0]);
                        let _ = m.g_mul_scalar_(beta1);
                        let _ = m.g_add_(&(&g * (1.0 - beta1)));
                        let _ = v.g_mul_scalar_(beta2);
                        let _ = v.g_add_(&(&g * &g * (1.0 - beta2)));
                        let bc1 = 1.0 - beta1.powi(t);
                        let bc2 = 1.0 - beta2.powi(t);
                        let denom = (&*v / bc2).sqrt() + eps;
                        let _ = p.g_sub_(&(&*m / denom * (lr / bc1)));
                    }
                }
            }
        });
    }

    /// Updates applied so far.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// The state tensors by name (`<param>.momentum`, `<param>.m`, `<param>.v`).
    pub fn state_tensors(&self) -> Vec<(String, Tensor)> {
        let names: &[&str] = match self.config {
            OptimizerConfig::Sgd { .. } => &["momentum"],
            OptimizerConfig::Adamw { .. } => &["m", "v"],
        };
        let mut out = Vec::new();
        for ((name, _), st) in self.params.iter().zip(&self.state) {
            for (k, t) in st.iter().enumerate() {
                out.push((format!("{name}.{}", names[k]), t.shallow_clone()));
            }
        }
        out
    }

    /// Restores what [`Optimizer::state_tensors`] and [`Optimizer::steps`] returned.
    pub fn restore(
        &mut self,
        tensors: &BTreeMap<String, Tensor>,
        steps: u64,
    ) -> Result<(), TrainError> {
        for (name, t) in self.state_tensors() {
            let src = tensors.get(&name).ok_or_else(|| {
                TrainError::Checkpoint(format!(
                    "optimizer state `{name}` is missing: was it written with another optimizer?"
                ))
            })?;
            if src.size() != t.size() {
                return Err(TrainError::Checkpoint(format!(
                    "optimizer state `{name}` has shape {:?}, the model needs {:?}",
                    src.size(),
                    t.size()
                )));
            }
            let mut t = t;
            tch::no_grad(|| t.copy_(src));
        }
        self.steps = steps;
        Ok(())
    }
}

/// The learning rate at (0-based) `step` of `total` steps, for peak rate `peak`.
pub fn learning_rate(s: &ScheduleConfig, peak: f64, step: u64, total: Option<u64>) -> f64 {
    if step < s.warmup_steps {
        return peak * (step + 1) as f64 / s.warmup_steps as f64;
    }
    let after = step - s.warmup_steps;
    match s.decay {
        Decay::Constant => peak,
        Decay::Step => {
            let size = s.step_size.unwrap_or(u64::MAX).max(1);
            peak * s.gamma.unwrap_or(0.1).powi((after / size) as i32)
        }
        Decay::Cosine => {
            let span = total
                .unwrap_or(step + 1)
                .saturating_sub(s.warmup_steps)
                .max(1);
            let progress = (after as f64 / span as f64).min(1.0);
            s.min_lr + (peak - s.min_lr) * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmup_then_cosine_reaches_min() {
        let s = ScheduleConfig {
            warmup_steps: 10,
            decay: Decay::Cosine,
            min_lr: 0.01,
            ..Default::default()
        };
        assert!((learning_rate(&s, 1.0, 0, Some(110)) - 0.1).abs() < 1e-12);
        assert!((learning_rate(&s, 1.0, 9, Some(110)) - 1.0).abs() < 1e-12);
        assert!((learning_rate(&s, 1.0, 10, Some(110)) - 1.0).abs() < 1e-12);
        assert!((learning_rate(&s, 1.0, 60, Some(110)) - 0.505).abs() < 1e-12);
        assert!((learning_rate(&s, 1.0, 110, Some(110)) - 0.01).abs() < 1e-12);
    }

    #[test]
    fn step_decay() {
        let s = ScheduleConfig {
            decay: Decay::Step,
            step_size: Some(5),
            gamma: Some(0.5),
            ..Default::default()
        };
        assert_eq!(learning_rate(&s, 1.0, 4, None), 1.0);
        assert_eq!(learning_rate(&s, 1.0, 5, None), 0.5);
        assert_eq!(learning_rate(&s, 1.0, 10, None), 0.25);
    }

    #[test]
    fn sgd_momentum_matches_hand_computation() {
        let p = Tensor::from_slice(&[1.0f32, 2.0]).set_requires_grad(true);
        let mut opt = Optimizer::new(
            OptimizerConfig::Sgd {
                lr: 0.1,
                momentum: 0.9,
                weight_decay: 0.0,
                nesterov: false,
            },
            vec![("p".into(), p.shallow_clone())],
        );
        // loss = sum(p^2) / 2 → grad = p
        for _ in 0..2 {
            let mut pp = p.shallow_clone();
            pp.zero_grad();
            (&p * &p)
                .sum(tch::Kind::Float)
                .g_mul_scalar_(0.5)
                .backward();
            opt.step(0.1);
        }
        // step 1: v = g = [1,2]; p = [0.9, 1.8]
        // step 2: g = [0.9,1.8]; v = 0.9*[1,2] + g = [1.8, 3.6]; p = [0.72, 1.44]
        let got: Vec<f32> = Vec::try_from(&p.detach()).unwrap_or_default();
        assert!(
            (got[0] - 0.72).abs() < 1e-6 && (got[1] - 1.44).abs() < 1e-6,
            "{got:?}"
        );
    }
}
