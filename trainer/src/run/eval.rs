//! Evaluation: the held-out data through the model, shared out over the ranks, and the
//! training stages it runs (the deterministic ones).

use futures::StreamExt;
use sluice_loader::TensorStream;
use sluice_pipeline::Pipeline;
use sluice_pipeline::config::{Located, OneOrMany};
use sluice_pipeline::sources::SourceConfig;
use sluice_pipeline::stages::{ImageOp, StageConfig};
use tch::{Kind, Reduction};

use super::Ctx;
use super::loss::{loss_of, soft_labels};
use crate::TrainError;
use crate::config::Loss;
use crate::job::EvalReport;
use crate::trainer::Trainer;

impl Ctx<'_> {
    /// Runs the held-out data through the model; ranks share the batches (batch `i` goes to
    /// rank `i mod world`) and sum their counts, so every row counts exactly once (under
    /// `sync: async`, rank 0 alone).
    pub(super) fn evaluate(&mut self, trainer: &mut Trainer) -> Result<EvalReport, TrainError> {
        let job = self.job;
        // Under `sync: async` rank 0 evaluates alone, at the end: a rank that failed under
        // `on_failure: continue` cannot join a collective.
        let alone = matches!(job.trainer.sync, crate::config::SyncConfig::Async { .. });
        let Some(ev) = &job.trainer.eval else {
            return Err(TrainError::Internal("no eval section".into()));
        };
        let mut config = job.pipeline.clone();
        match &mut config.source.value {
            SourceConfig::Parquet(p) => {
                p.path = Some(OneOrMany(ev.path.0.clone()));
                p.manifest = None;
                p.epochs = 1;
                // Every held-out row once: the training data's `mix` weighs other files.
                p.mix = None;
            }
            // A stream (a preprocessing fleet's topic): the held-out files hold rows as its
            // messages do, read by a plain Parquet source.
            source @ SourceConfig::Kafka(_) => {
                let p = serde_json::from_value(serde_json::json!({ "path": ev.path.0 }))
                    .map_err(|e| TrainError::Internal(format!("eval source: {e}")))?;
                *source = SourceConfig::Parquet(p);
            }
        }
        config.stages = eval_stages(self.frozen);
        config.runtime.rank = Some(0);
        config.runtime.world_size = Some(1);
        config.runtime.threads = Some(1);
        let prepared = self
            .handle
            .block_on(Pipeline::from_config(config, job.base_dir.clone()).prepare())?;
        let pool = prepared.pool().clone();
        let mut stream = TensorStream::new(prepared.stream(), pool, &job.loader)?;
        let (mut loss_sum, mut correct, mut rows) = (0.0f64, 0u64, 0u64);
        let mut i = 0usize;
        while let Some(batch) = self.handle.block_on(stream.next()).transpose()? {
            let mine = alone || i % self.world == self.rank;
            i += 1;
            if !mine {
                continue;
            }
            let (Some(x), Some(y)) = (
                batch.get(&job.trainer.input),
                batch.get(&job.trainer.target),
            ) else {
                continue;
            };
            let (l, c) = tch::no_grad(|| -> Result<(f64, u64), TrainError> {
                let out = self.model.forward(&x.to_device(self.device));
                let t = &job.trainer.target;
                let l = loss_of(job.trainer.loss, &out, y, t, Reduction::Sum)?.double_value(&[]);
                if job.trainer.loss != Loss::CrossEntropy {
                    return Ok((l, 0));
                }
                let class = match soft_labels(&out, y) {
                    true => y.argmax(-1, false),
                    false => y.to_kind(Kind::Int64),
                };
                let c = out
                    .argmax(-1, false)
                    .eq_tensor(&class)
                    .sum(Kind::Int64)
                    .int64_value(&[]);
                Ok((l, c as u64))
            })?;
            loss_sum += l;
            correct += c;
            rows += batch.rows as u64;
        }
        let mut msg = Vec::with_capacity(24);
        msg.extend_from_slice(&loss_sum.to_le_bytes());
        msg.extend_from_slice(&correct.to_le_bytes());
        msg.extend_from_slice(&rows.to_le_bytes());
        let all = match alone {
            true => vec![msg],
            false => trainer.collective().all_gather(msg)?,
        };
        let (mut l, mut c, mut n) = (0.0, 0u64, 0u64);
        for m in all {
            let w = |k: usize| {
                m.get(k * 8..k * 8 + 8)
                    .and_then(|b| <[u8; 8]>::try_from(b).ok())
                    .unwrap_or([0; 8])
            };
            l += f64::from_le_bytes(w(0));
            c += u64::from_le_bytes(w(1));
            n += u64::from_le_bytes(w(2));
        }
        let n_f = n.max(1) as f64;
        let per_output = match job.trainer.loss {
            Loss::Mse => match &job.trainer.model {
                crate::config::ModelConfig::Logreg { outputs }
                | crate::config::ModelConfig::Mlp { outputs, .. }
                | crate::config::ModelConfig::Cnn { outputs, .. } => *outputs as f64,
            },
            Loss::CrossEntropy => 1.0,
        };
        Ok(EvalReport {
            step: trainer.steps(),
            loss: l / n_f / per_output,
            accuracy: (job.trainer.loss == Loss::CrossEntropy).then(|| c as f64 / n_f),
            rows: n,
        })
    }
}

/// The training stages minus the random ones (see [`crate::config::EvalConfig`]).
pub fn eval_stages(frozen: &[Located<StageConfig>]) -> Vec<Located<StageConfig>> {
    frozen
        .iter()
        .filter(|s| {
            !matches!(
                s.value,
                StageConfig::Shuffle(_)
                    | StageConfig::GaussianNoise(_)
                    | StageConfig::FeatureDropout(_)
                    | StageConfig::MaskTokens(_)
                    | StageConfig::Mixup(_)
            )
        })
        .map(|s| {
            let mut s = s.clone();
            if let StageConfig::Image(img) = &mut s.value {
                let [h, w, _] = img.shape;
                // The deterministic counterparts, as torchvision evaluates: a random crop to
                // another size becomes the centre crop, a random resized crop the resize of
                // the whole image; the random flips, jitter, grayscale and erasing go.
                img.ops = std::mem::take(&mut img.ops)
                    .into_iter()
                    .filter_map(|op| match op {
                        ImageOp::HorizontalFlip { .. }
                        | ImageOp::VerticalFlip { .. }
                        | ImageOp::ColorJitter { .. }
                        | ImageOp::RandomGrayscale { .. }
                        | ImageOp::RandomErasing { .. } => None,
                        ImageOp::RandomCrop { size, .. } if size == [h, w] => None,
                        ImageOp::RandomCrop { size, .. } => Some(ImageOp::CenterCrop { size }),
                        ImageOp::RandomResizedCrop { size, .. } => Some(ImageOp::Resize { size }),
                        op => Some(op),
                    })
                    .collect();
            }
            s
        })
        .collect()
}
