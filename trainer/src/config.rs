//! The `trainer:` section.
//!
//! ```yaml
//! trainer:
//!   model: {type: mlp, hidden: [128], classes: 10}
//!   loss: cross_entropy
//!   optimizer: {type: sgd, lr: 0.1, momentum: 0.9, weight_decay: 1e-4}
//!   schedule: {warmup_steps: 20, decay: cosine}
//!   epochs: 10
//!   eval: {path: ../data/digits/test.parquet, every_steps: 50}
//!   allreduce: {backend: local, workers: 2, bucket_mb: 25, compression: none}
//!   sync: allreduce               # or {type: local_sgd, every: 8}
//!   accumulate: 1
//!   checkpoint: {path: ../out/train.ckpt, every_steps: 100}
//! ```

use serde::Deserialize;

/// The `trainer:` section.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TrainerConfig {
    /// The network, from the built-in zoo.
    pub model: ModelConfig,
    /// Loss function. Default: cross_entropy.
    #[serde(default)]
    pub loss: Loss,
    /// Optimizer.
    pub optimizer: OptimizerConfig,
    /// Learning-rate schedule. Default: constant.
    #[serde(default)]
    pub schedule: ScheduleConfig,
    /// Passes over the training source (overrides the source's `epochs`).
    #[serde(default)]
    pub epochs: Option<u64>,
    /// Stop after this many optimizer steps (also the length of a decaying schedule).
    #[serde(default)]
    pub steps: Option<u64>,
    /// Names of the input and target tensors in `loader.tensors`. Default: x, y.
    #[serde(default = "default_input")]
    pub input: String,
    /// See `input`.
    #[serde(default = "default_target")]
    pub target: String,
    /// Evaluation on held-out data.
    #[serde(default)]
    pub eval: Option<EvalConfig>,
    /// Gradient averaging between workers.
    #[serde(default)]
    pub allreduce: AllReduceConfig,
    /// `allreduce` (every step) or `local_sgd` (parameters averaged every `every` steps).
    /// Default: allreduce.
    #[serde(default, deserialize_with = "name_or_tagged")]
    pub sync: SyncConfig,
    /// Micro-batches per optimizer step: gradients of this many consecutive batches are
    /// summed (weighted by rows) before one all-reduce and one update — a step on
    /// `accumulate × batch_size` rows per rank in the memory of one batch. Default: 1.
    #[serde(default = "default_accumulate")]
    pub accumulate: u64,
    /// Checkpoints for `--resume`.
    #[serde(default)]
    pub checkpoint: Option<TrainCheckpointConfig>,
    /// Write TensorBoard event files to this folder (relative to the config file): rank 0's
    /// scalars in it, every other rank's own in `rank<N>/`. Default: none.
    #[serde(default)]
    pub tensorboard: Option<String>,
    /// Publish each checkpoint also as a model version (safetensors weights and a JSON
    /// manifest) for serving. Default: none.
    #[serde(default)]
    pub export: Option<ExportConfig>,
    /// Seed of the model's initial weights. Default: 0.
    #[serde(default)]
    pub seed: u64,
    /// Write one JSON line per step (and per evaluation) to this file (relative to the config
    /// file). Default: none.
    #[serde(default)]
    pub log: Option<String>,
    /// Compare a checksum of the parameters across ranks every this many steps (they must be
    /// bitwise equal; a mismatch stops the run). 0 = never. Default: 100.
    #[serde(default = "default_check_every")]
    pub check_every_steps: u64,
}

fn default_input() -> String {
    "x".into()
}
fn default_target() -> String {
    "y".into()
}
fn default_accumulate() -> u64 {
    1
}
fn default_check_every() -> u64 {
    100
}

/// `trainer.model`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ModelConfig {
    /// Logistic (softmax) regression: one linear layer over the flattened input.
    Logreg {
        /// Outputs (classes for cross-entropy, targets for MSE).
        outputs: i64,
    },
    /// Fully connected layers with ReLU.
    Mlp {
        /// Hidden layer widths. Default: [128].
        #[serde(default = "default_hidden")]
        hidden: Vec<i64>,
        /// Outputs.
        outputs: i64,
    },
    /// A small ResNet-style convolutional net for `[channels, height, width]` inputs
    /// (e.g. 32×32 images): a stem, residual blocks with group norm, global average pooling.
    Cnn {
        /// Channels of the stem; doubled at each downsampling stage. Default: 32.
        #[serde(default = "default_width")]
        width: i64,
        /// Downsampling stages (each: stride-2 conv + a residual block). Default: 2.
        #[serde(default = "default_stages")]
        stages: usize,
        /// Outputs.
        outputs: i64,
    },
}

fn default_hidden() -> Vec<i64> {
    vec![128]
}
fn default_width() -> i64 {
    32
}
fn default_stages() -> usize {
    2
}

/// `trainer.loss`.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Loss {
    /// Softmax cross-entropy over integer class targets (accuracy is reported).
    #[default]
    CrossEntropy,
    /// Mean squared error against float targets.
    Mse,
}

/// `trainer.optimizer`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum OptimizerConfig {
    /// Stochastic gradient descent (PyTorch's semantics: `v = μ·v + g + λ·p; p -= lr·v`).
    Sgd {
        /// Peak learning rate.
        lr: f64,
        /// Momentum μ. Default: 0.
        #[serde(default)]
        momentum: f64,
        /// L2 weight decay λ (added to the gradient). Default: 0.
        #[serde(default)]
        weight_decay: f64,
        /// Nesterov momentum. Default: false.
        #[serde(default)]
        nesterov: bool,
    },
    /// Adam with decoupled weight decay (Loshchilov & Hutter).
    Adamw {
        /// Peak learning rate.
        lr: f64,
        /// β₁. Default: 0.9.
        #[serde(default = "default_beta1")]
        beta1: f64,
        /// β₂. Default: 0.999.
        #[serde(default = "default_beta2")]
        beta2: f64,
        /// ε. Default: 1e-8.
        #[serde(default = "default_eps")]
        eps: f64,
        /// Decoupled weight decay. Default: 0.01.
        #[serde(default = "default_wd")]
        weight_decay: f64,
    },
}

fn default_beta1() -> f64 {
    0.9
}
fn default_beta2() -> f64 {
    0.999
}
fn default_eps() -> f64 {
    1e-8
}
fn default_wd() -> f64 {
    0.01
}

impl OptimizerConfig {
    /// The peak learning rate.
    pub fn lr(&self) -> f64 {
        match self {
            OptimizerConfig::Sgd { lr, .. } | OptimizerConfig::Adamw { lr, .. } => *lr,
        }
    }
}

/// `trainer.schedule`: linear warmup from 0, then a decay.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ScheduleConfig {
    /// Steps of linear warmup. Default: 0.
    #[serde(default)]
    pub warmup_steps: u64,
    /// What follows warmup. Default: constant.
    #[serde(default)]
    pub decay: Decay,
    /// `step` decay: multiply by `gamma` every `step_size` steps.
    #[serde(default)]
    pub step_size: Option<u64>,
    /// `step` decay factor. Default: 0.1.
    #[serde(default)]
    pub gamma: Option<f64>,
    /// `cosine` decay ends at this learning rate. Default: 0.
    #[serde(default)]
    pub min_lr: f64,
}

/// Decay after warmup.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Decay {
    /// Keep the peak rate.
    #[default]
    Constant,
    /// Half-cosine from the peak to `min_lr` at the last step.
    Cosine,
    /// Multiply by `gamma` every `step_size` steps.
    Step,
}

/// `trainer.eval`: held-out files read like the training source and run through the
/// training stages minus the random ones (`shuffle`, `gaussian_noise`, `feature_dropout`,
/// `mask_tokens`, `mixup`, image flips and colour jitter, and a `random_crop` that keeps the size), with
/// computed `standardize` statistics taken from the training data.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EvalConfig {
    /// Path(s) or URL(s) of the held-out Parquet files, in place of the training source's
    /// `path` (relative paths resolve against the config file).
    pub path: sluice_pipeline::config::OneOrMany,
    /// Evaluate every this many steps (and always at the end). Default: only at the end.
    #[serde(default)]
    pub every_steps: Option<u64>,
}

/// `trainer.allreduce`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AllReduceConfig {
    /// `local`: workers are threads of this process; `mpi`: one process per rank under
    /// `mpirun` (cargo feature `mpi`). Default: local.
    #[serde(default)]
    pub backend: Backend,
    /// Workers of the `local` backend. Default: 1.
    #[serde(default = "default_workers")]
    pub workers: usize,
    /// Gradient bucket size in MB (gradients are flattened into buckets of about this size
    /// and reduced bucket by bucket). Default: 25.
    #[serde(default = "default_bucket_mb")]
    pub bucket_mb: f64,
    /// Gradient compression: `none`, `fp16`, `bf16`, `topk`, `powersgd` (see
    /// [`Compression`]). Default: none.
    #[serde(default, deserialize_with = "name_or_tagged")]
    pub compression: Compression,
}

fn default_workers() -> usize {
    1
}
fn default_bucket_mb() -> f64 {
    25.0
}

impl Default for AllReduceConfig {
    fn default() -> Self {
        AllReduceConfig {
            backend: Backend::Local,
            workers: 1,
            bucket_mb: 25.0,
            compression: Compression::None,
        }
    }
}

/// Collective backend.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    /// Threads of one process.
    #[default]
    Local,
    /// OpenMPI.
    Mpi,
}

/// Gradient compression (`trainer.allreduce.compression`): a name (`none`, `fp16`, `bf16`,
/// `topk`, `powersgd`, the last two with their defaults) or a map with `type:`.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Compression {
    /// f32.
    #[default]
    None,
    /// f16 on the wire (sums accumulate in f32, rounded once).
    Fp16,
    /// bfloat16 on the wire: f32's range, 8 bits of mantissa (sums accumulate in f32).
    Bf16,
    /// Each rank sends only the `ratio` largest-magnitude values of each bucket, as
    /// (u32 index, f32 value) pairs; what it did not send is added to its next step's gradient
    /// (error feedback) unless `error_feedback: false`.
    Topk {
        /// Share of each bucket's values sent (0 < ratio ≤ 1). Default: 0.01.
        #[serde(default = "default_topk_ratio")]
        ratio: f64,
        /// Keep what was not sent for the next step. Default: true.
        #[serde(default = "default_true")]
        error_feedback: bool,
    },
    /// PowerSGD (Vogels et al., PyTorch's `powerSGD_hook`): each gradient matrix `M`
    /// (`[rows, rest]`) travels as two rank-`rank` factors `P = M·Q` and `Q = Mᵀ·P̂`, `Q` warm-started
    /// from the previous step; vectors and matrices too small to gain go dense. Plain f32
    /// all-reduce before step `start_step`.
    Powersgd {
        /// Rank of the approximation. Default: 2.
        #[serde(default = "default_powersgd_rank")]
        rank: usize,
        /// Steps of plain all-reduce first (PyTorch: `start_powerSGD_iter`). Default: 10.
        #[serde(default = "default_powersgd_start")]
        start_step: u64,
        /// Keep the approximation's error for the next step. Default: true.
        #[serde(default = "default_true")]
        error_feedback: bool,
    },
}

fn default_topk_ratio() -> f64 {
    0.01
}
fn default_powersgd_rank() -> usize {
    2
}
fn default_powersgd_start() -> u64 {
    10
}
fn default_true() -> bool {
    true
}

impl Compression {
    /// Whether each rank keeps state of its own across steps (error-feedback residuals), which
    /// a checkpoint must hold per rank.
    pub fn has_rank_state(&self) -> bool {
        matches!(
            self,
            Compression::Topk {
                error_feedback: true,
                ..
            } | Compression::Powersgd {
                error_feedback: true,
                ..
            }
        )
    }
}

/// `trainer.sync`: how replicas stay together. A name (`allreduce`, `local_sgd`) or a map
/// with `type:`.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum SyncConfig {
    /// Every step all-reduces the gradients (synchronous data parallelism).
    #[default]
    Allreduce,
    /// Post-local SGD: after `start_step` synchronous steps, each rank steps on its own
    /// gradients and the parameters are averaged every `every` steps (optimizer state stays
    /// per rank, as in PyTorch's `PostLocalSGDOptimizer`).
    LocalSgd {
        /// Average the parameters every this many steps. Default: 8.
        #[serde(default = "default_local_every")]
        every: u64,
        /// Synchronous steps first. Default: 0.
        #[serde(default)]
        start_step: u64,
    },
    /// A parameter server with bounded staleness (the `local` backend): each rank pushes its
    /// gradient and takes the parameters the server answers with, without waiting for the
    /// others; an update is held back only while it would leave a rank still computing more
    /// than `staleness` versions behind. `staleness: 0` is synchronous all-reduce.
    Async {
        /// The most versions a gradient's parameters may be behind when it is applied.
        /// Default: 2.
        #[serde(default = "default_staleness")]
        staleness: u64,
        /// A rank that fails: `stop` every rank (the default), or `continue` with the others
        /// (the failed rank's remaining data is left untrained, said in the summary, and the
        /// checkpoint is not marked complete, so `--resume` trains it).
        #[serde(default)]
        on_failure: OnFailure,
    },
}

/// What a parameter server does when a rank fails.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum OnFailure {
    /// Stop every rank; the run fails naming the rank.
    #[default]
    Stop,
    /// Go on with the other ranks.
    Continue,
}

fn default_staleness() -> u64 {
    2
}

fn default_local_every() -> u64 {
    8
}

/// Deserializes a `type:`-tagged enum from its map or from its bare name (`fp16` for
/// `{type: fp16}`), so that the common case stays one word in YAML.
pub(crate) fn name_or_tagged<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct V<T>(std::marker::PhantomData<T>);
    impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for V<T> {
        type Value = T;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a name or a map with `type:`")
        }
        fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<T, E> {
            T::deserialize(serde::de::value::MapDeserializer::new(std::iter::once((
                "type", s,
            ))))
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
            T::deserialize(serde::de::value::MapAccessDeserializer::new(map))
        }
    }
    d.deserialize_any(V(std::marker::PhantomData))
}

/// `trainer.export`: each checkpoint also published under `path` (a folder or object-store
/// prefix) as `step-<N>/model.safetensors` and `step-<N>/manifest.json`, then `LATEST`
/// pointed at it (the trainer's `export` module writes them).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ExportConfig {
    /// Folder (relative to the config file) or URL prefix of the versions.
    pub path: String,
    /// Object-store options for `path`.
    #[serde(default)]
    pub storage: sluice_pipeline::storage::StorageConfig,
}

/// `trainer.checkpoint`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TrainCheckpointConfig {
    /// Path or object-store URL of the checkpoint (one object, replaced atomically).
    pub path: String,
    /// Write one every this many steps (and on SIGTERM/SIGINT and at the end). Default: 100.
    #[serde(default = "default_every")]
    pub every_steps: u64,
    /// Also write one when this long has passed since the last (`10m`, `30s`): continuous
    /// training on a stream checkpoints (and publishes model versions) on the clock, whatever
    /// the step rate. Rank 0's clock decides, for every rank. Default: steps only.
    #[serde(default)]
    pub every: Option<sluice_pipeline::config::HumanDuration>,
    /// Object-store options for `path`.
    #[serde(default)]
    pub storage: sluice_pipeline::storage::StorageConfig,
}

fn default_every() -> u64 {
    100
}
