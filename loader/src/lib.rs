//! # sluice-loader
//!
//! The tensor loader: Arrow batches → named tch tensors on the training device, prepared
//! `prefetch` batches ahead while the training step runs.
//!
//! ```yaml
//! loader:
//!   device: auto            # cuda if present, else cpu; or cpu, cuda, cuda:1
//!   prefetch: 2
//!   tensors:
//!     x: {column: image, dtype: f32, shape: [3, 32, 32]}
//!     y: {column: label, dtype: i64}
//!     tokens: {column: tokens, dtype: i64, pad: 0}    # variable length: padded + tokens_mask
//! ```
//!
//! **Copies.** On the CPU device, a column whose values need no conversion (a number or a
//! fixed-size list of numbers of the requested dtype, no nulls) becomes a tensor over the
//! Arrow buffer itself — no copy. tch 0.26's `Tensor::from_blob` takes no deleter (a tensor
//! made with it could outlive the buffer through a safe `shallow_clone()`), so a small C++
//! shim (`blob.cpp`, compiled against libtorch's headers) calls `at::from_blob` with a
//! deleter that owns a clone of the Arrow buffer: the memory lives exactly as long as any
//! tensor sharing it (`blob.rs` explains the soundness argument). Everything else — casts,
//! booleans, padded lists, masked nulls — is copied once into memory libtorch owns. On CUDA
//! the host tensor is pinned and copied to the device with `non_blocking`, on the loader's
//! thread, so the host goes on preparing the next batch while the transfer runs. The pinned
//! staging memory comes from libtorch's caching host allocator — a pool of page-locked
//! blocks allocated once and reused after the copy that used a block has completed (an
//! event, not a device sync). The copies (and `augment_on: device` image ops) run on a side
//! stream from CUDA's pool, so they overlap on the device with the training step queued on
//! the consumer's stream; the consumer's stream waits for them by an event when it receives
//! the batch ([`copy_stream`], through the C++ shim: tch exposes no streams or events).
//!
//! **Stalls.** The stream measures how long the consumer waited for each batch (from asking
//! to receiving): [`LoaderStats`].

mod blob;
mod convert;
mod copy_stream;
mod device_image;

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use serde::Deserialize;
use sluice_pipeline::{Batch, BatchStream, CpuPool, Lineage, SourceState};
use tch::{Device, Kind, Tensor};

pub use convert::{ConvertError, batch_to_tensors};

/// The `loader:` section.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LoaderConfig {
    /// `auto` (CUDA device 0 if present, else CPU), `cpu`, `cuda` or `cuda:N`. Default: auto.
    #[serde(default = "default_device")]
    pub device: String,
    /// Batches converted and moved to the device ahead of the consumer. Default: 2.
    #[serde(default = "default_prefetch")]
    pub prefetch: usize,
    /// Tensor name → where it comes from.
    pub tensors: BTreeMap<String, TensorSpec>,
}

impl LoaderConfig {
    /// Checks the loader against the schema the pipeline produces (device, columns, types,
    /// shapes) without data; returns one line per tensor (`x: pixels → f32 [batch, 1, 8, 8]`).
    pub fn check(&self, schema: &arrow::datatypes::Schema) -> Result<Vec<String>, ConvertError> {
        use arrow::datatypes::DataType;
        parse_device(&self.device)?;
        if self.tensors.is_empty() {
            return Err(ConvertError::Config("`tensors` is empty".into()));
        }
        let mut lines = Vec::new();
        for (name, spec) in &self.tensors {
            let fail = |message: String| ConvertError::Column {
                tensor: name.clone(),
                column: spec.column.clone(),
                message,
            };
            let field = schema.field_with_name(&spec.column).map_err(|_| {
                fail(format!(
                    "no such column after the last stage; there are: {}{}",
                    column_names(schema),
                    sluice_pipeline::config::did_you_mean(
                        &spec.column,
                        schema.fields().iter().map(|f| f.name().as_str())
                    )
                ))
            })?;
            if let Some(image) = sluice_pipeline::stages::DeviceImage::of(field) {
                lines.push(check_device_image(name, spec, image, schema).map_err(fail)?);
                continue;
            }
            // The types `batch_to_tensors` converts, so validation and runs agree.
            let numeric = |t: &DataType| convert::kind_of(t).is_some();
            let (per_row, elem) = match field.data_type() {
                t if numeric(t) => (Some(1i64), t.clone()),
                DataType::FixedSizeList(f, k) if numeric(f.data_type()) => {
                    (Some(*k as i64), f.data_type().clone())
                }
                DataType::List(f) | DataType::LargeList(f) if numeric(f.data_type()) => {
                    (None, f.data_type().clone())
                }
                other => {
                    let hint = match other {
                        DataType::Binary
                        | DataType::LargeBinary
                        | DataType::BinaryView
                        | DataType::FixedSizeBinary(_) => {
                            " (bytes: decode them first, e.g. images with an `image` stage: `{type: image, column: …, shape: [h, w, c]}`, which yields float32)"
                        }
                        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => {
                            " (text: turn it into numbers first, e.g. a class index with `cast` or `one_hot`)"
                        }
                        _ => "",
                    };
                    return Err(fail(format!(
                        "a {other} column cannot become a tensor{hint}; numbers, fixed-size lists and lists of numbers can"
                    )));
                }
            };
            if let (Some(shape), Some(n)) = (&spec.shape, per_row) {
                let want: i64 = shape.iter().product();
                if want != n || shape.iter().any(|d| *d <= 0) {
                    return Err(fail(format!(
                        "shape {shape:?} holds {want} values but each row has {n}"
                    )));
                }
            }
            let dims = match (&spec.shape, per_row) {
                (Some(s), _) => format!("{s:?}").replace('[', "[batch, "),
                (None, Some(1)) => "[batch]".into(),
                (None, Some(n)) => format!("[batch, {n}]"),
                (None, None) => format!("[batch, longest] + {name}_mask"),
            };
            let dtype = spec
                .dtype
                .map(|d| format!("{d:?}").to_lowercase())
                .unwrap_or_else(|| elem.to_string());
            lines.push(format!("{name}: {} → {dtype} {dims}", spec.column));
        }
        Ok(lines)
    }

    /// The per-row shape of tensor `name` for batches of `schema` (without the batch
    /// dimension), when it does not depend on the data: `None` for variable-length lists and
    /// unknown names.
    pub fn row_shape(&self, name: &str, schema: &arrow::datatypes::Schema) -> Option<Vec<i64>> {
        use arrow::datatypes::DataType;
        let spec = self.tensors.get(name)?;
        if let Some(shape) = &spec.shape {
            return Some(shape.clone());
        }
        let field = schema.field_with_name(&spec.column).ok()?;
        if let Some(Ok(image)) = sluice_pipeline::stages::DeviceImage::of(field) {
            let [oh, ow] = image.out;
            return Some(vec![image.shape[2] as i64, oh as i64, ow as i64]);
        }
        match field.data_type() {
            t if convert::kind_of(t).is_some() => Some(Vec::new()),
            DataType::FixedSizeList(_, k) => Some(vec![i64::from(*k)]),
            _ => None,
        }
    }

    /// Reads a `loader:` section's body from YAML text (unknown keys are errors).
    pub fn from_yaml(text: &str) -> Result<Self, ConvertError> {
        serde_saphyr::from_str(text).map_err(|e| ConvertError::Config(e.to_string()))
    }
}

/// `loader.check`'s line for tensor `name` over an `augment_on: device` image column.
fn check_device_image(
    name: &str,
    spec: &TensorSpec,
    image: Result<sluice_pipeline::stages::DeviceImage, String>,
    schema: &arrow::datatypes::Schema,
) -> Result<String, String> {
    use sluice_pipeline::stages::ImageDtype;
    let image = image?;
    if schema.field_with_name(&image.index).is_err() {
        return Err(format!(
            "the image stage's `augment_on: device` adds `{}` (each row's crop and flips), which no longer reaches the loader: keep it through the later stages",
            image.index
        ));
    }
    if spec.pad != 0.0 || spec.nulls != NullPolicy::Error {
        return Err("`pad` and `nulls` do not apply to images".into());
    }
    let [oh, ow] = image.out;
    let dims = [image.shape[2] as i64, oh as i64, ow as i64];
    if let Some(shape) = &spec.shape
        && (shape.iter().product::<i64>() != dims.iter().product::<i64>()
            || shape.iter().any(|d| *d <= 0))
    {
        return Err(format!(
            "shape {shape:?} does not hold the image's {dims:?} (channels, height, width)"
        ));
    }
    let dtype = match (spec.dtype, image.dtype) {
        (Some(d), _) => format!("{d:?}").to_lowercase(),
        (None, ImageDtype::Float32) => "f32".into(),
        (None, ImageDtype::Uint8) => "u8".into(),
        (None, ImageDtype::Float16) => "f16".into(),
    };
    let dims = format!("{:?}", spec.shape.as_deref().unwrap_or(&dims)).replace('[', "[batch, ");
    Ok(format!(
        "{name}: {} → {dtype} {dims} (crop, flips and normalize on the device)",
        spec.column
    ))
}

fn default_device() -> String {
    "auto".into()
}
fn default_prefetch() -> usize {
    2
}

/// One tensor of a batch.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TensorSpec {
    /// Source column: a number, a fixed-size list of numbers (`[batch, n]`, reshaped by
    /// `shape`) or a variable-length list (padded to the batch's longest, with a
    /// `<name>_mask` bool tensor).
    pub column: String,
    /// Element type; default: the column's.
    #[serde(default)]
    pub dtype: Option<DType>,
    /// Shape of one row (`[3, 32, 32]`); default: `[n]` for lists, scalar otherwise.
    #[serde(default)]
    pub shape: Option<Vec<i64>>,
    /// Padding value for variable-length lists. Default: 0.
    #[serde(default)]
    pub pad: f64,
    /// Null rows: `error` (default: the run stops naming the row) or `mask` (zeros plus a
    /// `<name>_valid` bool tensor).
    #[serde(default)]
    pub nulls: NullPolicy,
}

/// Tensor element types.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// float32
    F32,
    /// float64
    F64,
    /// float16
    F16,
    /// bfloat16
    Bf16,
    /// int64
    I64,
    /// int32
    I32,
    /// int16
    I16,
    /// int8
    I8,
    /// uint8
    U8,
    /// bool
    Bool,
}

impl DType {
    /// The tch kind.
    pub fn kind(self) -> Kind {
        match self {
            DType::F32 => Kind::Float,
            DType::F64 => Kind::Double,
            DType::F16 => Kind::Half,
            DType::Bf16 => Kind::BFloat16,
            DType::I64 => Kind::Int64,
            DType::I32 => Kind::Int,
            DType::I16 => Kind::Int16,
            DType::I8 => Kind::Int8,
            DType::U8 => Kind::Uint8,
            DType::Bool => Kind::Bool,
        }
    }
}

/// What to do with null rows.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum NullPolicy {
    /// Stop, naming the row.
    #[default]
    Error,
    /// Zeros and a `<name>_valid` mask.
    Mask,
}

/// The column names of `schema`, comma-separated (for "no such column" messages).
fn column_names(schema: &arrow::datatypes::Schema) -> String {
    schema
        .fields()
        .iter()
        .map(|f| f.name().as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Resolves `auto`, `cpu`, `cuda`, `cuda:N`.
pub fn parse_device(spec: &str) -> Result<Device, ConvertError> {
    match spec {
        "auto" => Ok(Device::cuda_if_available()),
        "cpu" => Ok(Device::Cpu),
        "cuda" => Ok(Device::Cuda(0)),
        other => other
            .strip_prefix("cuda:")
            .and_then(|n| n.parse().ok())
            .map(Device::Cuda)
            .ok_or_else(|| {
                ConvertError::Config(format!("device `{other}`: use auto, cpu, cuda or cuda:N"))
            }),
    }
}

/// A batch as named tensors, with what is needed to checkpoint after training on it.
#[derive(Debug)]
pub struct TensorBatch {
    /// The tensors, by the names of the `tensors:` map (plus `<name>_mask` / `<name>_valid`).
    pub tensors: BTreeMap<String, Tensor>,
    /// Rows in the batch.
    pub rows: usize,
    /// Where the rows came from.
    pub lineage: Lineage,
    /// The pipeline state just past this batch: store it with the model to resume exactly.
    pub state: SourceState,
    /// How long the consumer waited for this batch.
    pub waited: Duration,
    /// On CUDA, the event after the batch's copies (side stream), until handed over.
    ready: Option<copy_stream::Ready>,
}

impl TensorBatch {
    /// The tensor `name`.
    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.tensors.get(name)
    }
}

/// Consumer-side counters of a tensor stream.
#[derive(Debug, Default)]
pub struct LoaderStats {
    /// Batches delivered.
    pub batches: AtomicU64,
    /// Time the consumer waited for the first batch (ns): start-up, not counted as stall.
    pub startup_ns: AtomicU64,
    /// Total time the consumer waited for the second and later batches (ns).
    pub wait_ns: AtomicU64,
    /// Total time between deliveries after the first (ns): step time plus waits.
    pub span_ns: AtomicU64,
    /// Time spent converting and moving batches to the device (ns, loader side).
    pub convert_ns: AtomicU64,
    /// Batches (after the first) that were ready when the consumer asked for them: the
    /// loader's readiness is `ready / (batches - 1)` (SPDL's headline; ≥ 99%: the loader is
    /// ahead of the training step).
    pub ready: AtomicU64,
}

impl LoaderStats {
    /// Fraction of the consumer's time spent waiting for data (0 = never stalled).
    pub fn stall_fraction(&self) -> f64 {
        let span = self.span_ns.load(Ordering::Relaxed);
        if span == 0 {
            return 0.0;
        }
        self.wait_ns.load(Ordering::Relaxed) as f64 / span as f64
    }

    /// Share of the batches after the first that were already waiting when the consumer
    /// asked (the first is start-up, as for the stall); `None` before the second.
    pub fn readiness(&self) -> Option<f64> {
        let after_first = self.batches.load(Ordering::Relaxed).saturating_sub(1);
        (after_first > 0).then(|| self.ready.load(Ordering::Relaxed) as f64 / after_first as f64)
    }

    /// Total wait.
    pub fn waited(&self) -> Duration {
        Duration::from_nanos(self.wait_ns.load(Ordering::Relaxed))
    }
}

/// Named tensors on the device, `prefetch` batches ahead; a `Stream` of
/// `Result<TensorBatch, ConvertError>`.
pub struct TensorStream {
    rx: tokio::sync::mpsc::Receiver<Result<(TensorBatch, Duration), ConvertError>>,
    stats: Arc<LoaderStats>,
    waiting_since: Option<Instant>,
    last_delivery: Option<Instant>,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for TensorStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TensorStream").finish_non_exhaustive()
    }
}

impl Drop for TensorStream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TensorStream {
    /// Starts converting the pipeline's `batches` (`pool` is its CPU pool) into tensors on
    /// `config.device`; each [`TensorBatch`] carries the pipeline state just past it. Must be
    /// called inside a tokio runtime.
    pub fn new(
        batches: BatchStream,
        pool: CpuPool,
        config: &LoaderConfig,
    ) -> Result<Self, ConvertError> {
        let batches = futures::stream::unfold(batches, |mut s| async move {
            let item = s.next().await?;
            let state = s.snapshot();
            Some((
                (
                    item.map_err(|e| ConvertError::Pipeline(e.to_string())),
                    state,
                ),
                s,
            ))
        });
        Self::from_stream(batches, pool, config)
    }

    /// Like [`TensorStream::new`] for any stream of batches with their states.
    pub fn from_stream(
        batches: impl Stream<Item = (Result<Batch, ConvertError>, SourceState)> + Send + 'static,
        pool: CpuPool,
        config: &LoaderConfig,
    ) -> Result<Self, ConvertError> {
        let device = parse_device(&config.device)?;
        if config.tensors.is_empty() {
            return Err(ConvertError::Config("`tensors` is empty".into()));
        }
        // `prefetch` batches wait ready in the channel, one more is being prepared.
        let (tx, rx) = tokio::sync::mpsc::channel(config.prefetch.max(1));
        let stats = Arc::new(LoaderStats::default());
        let specs = Arc::new(config.tensors.clone());
        let st = stats.clone();
        let task = tokio::spawn(async move {
            let mut batches = std::pin::pin!(batches);
            while let Some((item, state)) = batches.next().await {
                let batch = match item {
                    Ok(b) => b,
                    Err(e) => {
                        let _ = tx.send(Err(e)).await;
                        return;
                    }
                };
                let specs = specs.clone();
                // Tensors over the batch's own memory cost nothing to make: made here, they
                // do not wait behind the stages' work queued on the pool (on the tabular
                // bench that wait left the 2 cores ~7 % idle).
                let inline = convert::shares_memory(&batch, &specs, device);
                let make = move || -> Result<(TensorBatch, Duration), ConvertError> {
                    let started = Instant::now();
                    let scope = copy_stream::CopyScope::begin(device);
                    let tensors = batch_to_tensors(&batch, &specs, device)?;
                    let tb = TensorBatch {
                        tensors,
                        rows: batch.num_rows(),
                        lineage: batch.lineage,
                        state,
                        waited: Duration::ZERO,
                        ready: scope.and_then(copy_stream::CopyScope::end),
                    };
                    Ok((tb, started.elapsed()))
                };
                let converted = if inline {
                    // As the pool would: a panic is an error, not a lost task.
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(make)).unwrap_or_else(
                        |panic| {
                            Err(ConvertError::Pipeline(format!(
                                "CPU task panicked: {}",
                                sluice_pipeline::runtime::panic_message(panic.as_ref())
                            )))
                        },
                    )
                } else {
                    (pool.run(make).await)
                        .map_err(|e| ConvertError::Pipeline(e.to_string()))
                        .and_then(|r| r)
                };
                if let Ok((_, took)) = &converted {
                    st.convert_ns
                        .fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
                }
                let failed = converted.is_err();
                if tx.send(converted).await.is_err() || failed {
                    return;
                }
            }
        });
        Ok(TensorStream {
            rx,
            stats,
            waiting_since: None,
            last_delivery: None,
            task,
        })
    }

    /// Live counters (batches, waits, stall fraction).
    pub fn stats(&self) -> Arc<LoaderStats> {
        self.stats.clone()
    }
}

impl Stream for TensorStream {
    type Item = Result<TensorBatch, ConvertError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let now = Instant::now();
        // A batch returned by the first poll since the last delivery was waiting: ready.
        let first_poll = self.waiting_since.is_none();
        let asked = *self.waiting_since.get_or_insert(now);
        match self.rx.poll_recv(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Ready(Some(item)) => {
                let arrived = Instant::now();
                let waited = arrived - asked;
                self.waiting_since = None;
                let stats = self.stats.clone();
                stats.batches.fetch_add(1, Ordering::Relaxed);
                match self.last_delivery {
                    // The first batch's wait is start-up (opening files, filling the
                    // pipeline), not a stall of the running loop.
                    None => stats
                        .startup_ns
                        .fetch_add(waited.as_nanos() as u64, Ordering::Relaxed),
                    Some(prev) => {
                        if first_poll {
                            stats.ready.fetch_add(1, Ordering::Relaxed);
                        }
                        stats
                            .wait_ns
                            .fetch_add(waited.as_nanos() as u64, Ordering::Relaxed);
                        stats
                            .span_ns
                            .fetch_add((arrived - prev).as_nanos() as u64, Ordering::Relaxed)
                    }
                };
                self.last_delivery = Some(arrived);
                Poll::Ready(Some(item.and_then(|(mut b, _)| {
                    b.waited = waited;
                    let handed = b
                        .ready
                        .take()
                        .is_none_or(|r| r.hand_over(b.tensors.values()));
                    if !handed {
                        return Err(ConvertError::Pipeline(
                            "CUDA: could not order the batch's copies before the consumer's stream"
                                .into(),
                        ));
                    }
                    Ok(b)
                })))
            }
        }
    }
}
