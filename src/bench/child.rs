//! `sluice bench-child`: one Sluice variant measured in its own process (its peak RSS and CPU
//! time are its own), printed as one JSON line for the parent.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use serde::{Deserialize, Serialize};
use sluice::observe::Observed;
use sluice::pipeline::Pipeline;
use sluice::report::{Bottleneck, Report};

use super::ceiling;
use super::workload::{Workload, yaml};

/// What one variant measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Measured {
    pub(super) rows: usize,
    pub(super) seconds: f64,
    pub(super) peak_rss_mib: f64,
    /// RSS before the variant read a byte: the binary with its libraries (for Sluice,
    /// libtorch's ~120 MiB, mapped and initialised before `main`), or the Python interpreter
    /// with numpy, pyarrow and torch imported. The peak less this is what the loading took.
    #[serde(default)]
    pub(super) start_rss_mib: Option<f64>,
    /// Of the peak, libtorch's libraries (`libtorch*`, `libc10*`, torch's `lib` folder): their
    /// pages mapped in at the end of the run (a Rust variant; 0 in a build without `torch`).
    #[serde(default)]
    pub(super) libtorch_rss_mib: Option<f64>,
    /// User + system CPU seconds of the process, all its threads (Python peers: also their
    /// finished worker processes).
    #[serde(default)]
    pub(super) cpu_seconds: Option<f64>,
    #[serde(default)]
    pub(super) bottleneck: Option<Bottleneck>,
}

/// This process's CPU time (user + system, all its threads) from getrusage(2), in
/// microseconds: `/proc`'s 10 ms ticks read 0 for a small variant's decode (the smoke test's
/// raw images variant did, and its per-CPU-second figure was then infinite).
#[allow(unsafe_code)]
fn cpu_seconds() -> Option<f64> {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::uninit();
    // SAFETY: getrusage(2) fills the struct it is given and returns 0, or fails and returns
    // -1 leaving it unread.
    let usage = unsafe {
        if libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) != 0 {
            return None;
        }
        usage.assume_init()
    };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    Some(seconds(usage.ru_utime) + seconds(usage.ru_stime))
}

fn peak_rss_mib() -> f64 {
    sluice::peak_rss_bytes().map_or(f64::NAN, sluice::mib)
}

fn rss_mib() -> Option<f64> {
    sluice::rss_bytes().map(sluice::mib)
}

fn libtorch_rss_mib() -> Option<f64> {
    sluice::mapped_rss_bytes(|path| {
        let name = path.rsplit('/').next().unwrap_or(path);
        name.starts_with("libtorch") || name.starts_with("libc10") || path.contains("/torch/lib/")
    })
    .map(sluice::mib)
}

/// `sluice bench-child`: runs one Sluice variant in this process and prints a JSON line.
pub(crate) async fn child(
    data: &Path,
    workload: Workload,
    variant: &str,
    threads: usize,
) -> ExitCode {
    // Before the pipeline exists: what the process holds for itself (the binary, libtorch).
    let start_rss_mib = rss_mib();
    let result = async {
        if variant == "raw" {
            let start = Instant::now();
            let cpu_start = cpu_seconds();
            let data = data.to_path_buf();
            let rows =
                tokio::task::spawn_blocking(move || ceiling::decode(&data, workload, threads))
                    .await??;
            return Ok(Measured {
                rows,
                seconds: start.elapsed().as_secs_f64(),
                peak_rss_mib: peak_rss_mib(),
                start_rss_mib,
                libtorch_rss_mib: libtorch_rss_mib(),
                cpu_seconds: cpu_seconds().zip(cpu_start).map(|(end, start)| end - start),
                bottleneck: None,
            });
        }
        let pipeline = Pipeline::from_yaml(&yaml(data, workload, variant, threads))?;
        let prepared = pipeline.prepare().await?;
        let observed = Arc::new(Observed::default());
        observed.add_pipeline(0, prepared.metrics());
        let start = Instant::now();
        let cpu_start = cpu_seconds();
        let rows = consume(prepared, workload, variant).await?;
        let seconds = start.elapsed().as_secs_f64();
        let cpu = cpu_seconds().zip(cpu_start).map(|(end, start)| end - start);
        let report = Report::build(
            "bench",
            Path::new(workload.name()),
            &observed,
            &[],
            &[],
            None,
            serde_json::Value::Null,
        );
        Ok::<_, anyhow::Error>(Measured {
            rows,
            seconds,
            peak_rss_mib: peak_rss_mib(),
            start_rss_mib,
            libtorch_rss_mib: libtorch_rss_mib(),
            cpu_seconds: cpu,
            bottleneck: Some(report.bottleneck),
        })
    }
    .await;
    match result {
        Ok(m) => {
            out!("{}", serde_json::to_string(&m).unwrap_or_default());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Drains the stream: the full variant into tensors (with `torch`), like a training loop.
async fn consume(
    prepared: sluice::pipeline::PreparedPipeline,
    workload: Workload,
    variant: &str,
) -> anyhow::Result<usize> {
    let mut rows = 0usize;
    if variant == "floor" {
        let pool = prepared.pool().clone();
        let mut s = prepared.stream();
        let mut buffers = [Vec::new(), Vec::new()];
        while let Some(b) = s.next().await {
            let b = b?;
            rows += b.num_rows();
            buffers = floor(&pool, &b.data, workload, buffers).await?;
        }
        return Ok(rows);
    }
    #[cfg(feature = "torch")]
    if variant != "source" {
        let loader: sluice::loader::LoaderConfig = serde_json::from_value(match workload {
            Workload::Images => serde_json::json!({"device": "cpu", "tensors": {
                "x": {"column": "image", "dtype": match variant { "uint8" => "u8", "float16" => "f16", _ => "f32" }, "shape": [3, 32, 32]},
                "y": {"column": "label", "dtype": "i64"}}}),
            Workload::Tabular => serde_json::json!({"device": "cpu", "tensors": {
                "x": {"column": "x", "dtype": "f32"},
                "y": {"column": "label", "dtype": "i64"}}}),
        })?;
        let pool = prepared.pool().clone();
        let mut s = sluice::loader::TensorStream::new(prepared.stream(), pool, &loader)?;
        while let Some(b) = s.next().await {
            rows += b?.rows;
        }
        return Ok(rows);
    }
    // The source alone: every value read once, as the ceiling reads it.
    let _ = variant;
    let mut s = prepared.stream();
    let mut sum = 0f64;
    while let Some(b) = s.next().await {
        let b = b?;
        rows += b.num_rows();
        sum += ceiling::touch(&b.data, workload);
    }
    std::hint::black_box(sum);
    Ok(rows)
}

/// The floor variant's work on one decoded batch: what any loader handing out float32 must at
/// least do — one `v · scale + bias` write per value (images: the `image` stage's kernel, HWC
/// `u8` to CHW `f32`; tabular: the features), into reused buffers, the rows split between two
/// tasks on the pool. No shuffle, no crop or flip, no noise, no tensors.
async fn floor(
    pool: &sluice::pipeline::CpuPool,
    data: &arrow::array::RecordBatch,
    workload: Workload,
    [mut a, mut b]: [Vec<f32>; 2],
) -> anyhow::Result<[Vec<f32>; 2]> {
    use arrow::array::{Array, AsArray};
    let n = data.num_rows();
    let half = n / 2;
    let convert = |mut out: Vec<f32>,
                   from: usize,
                   to: usize|
     -> Box<dyn FnOnce() -> Vec<f32> + Send> {
        match workload {
            Workload::Images => {
                let col = data
                    .column_by_name("image")
                    .map(|c| c.as_fixed_size_binary().clone());
                Box::new(move || {
                    let Some(col) = col else { return out };
                    out.resize((to - from) * 3072, 0.0);
                    let scale = [
                        1.0 / (255.0 * 0.2470),
                        1.0 / (255.0 * 0.2435),
                        1.0 / (255.0 * 0.2616),
                    ];
                    let bias = [-0.4914 / 0.2470, -0.4822 / 0.2435, -0.4465 / 0.2616];
                    for (i, dst) in (from..to).zip(out.chunks_exact_mut(3072)) {
                        sluice::pipeline::bench_rgb_to_chw(col.value(i), 32, 32, scale, bias, dst);
                    }
                    out
                })
            }
            Workload::Tabular => {
                let col = data
                    .column_by_name("x")
                    .map(|c| c.as_fixed_size_list().clone());
                Box::new(move || {
                    let Some(col) = col else { return out };
                    let values = col.values().as_primitive::<arrow::datatypes::Float32Type>();
                    let width = col.value_length() as usize;
                    let start = (col.offset() + from) * width;
                    let v = &values.values()[start..start + (to - from) * width];
                    out.resize(v.len(), 0.0);
                    for (o, x) in out.iter_mut().zip(v) {
                        *o = x * (1.0 / 0.29) + (-0.5 / 0.29);
                    }
                    out
                })
            }
        }
    };
    let (first, second) = (
        convert(std::mem::take(&mut a), 0, half),
        convert(std::mem::take(&mut b), half, n),
    );
    let (a, b) = futures::join!(pool.run(first), pool.run(second));
    Ok([a?, b?])
}
