//! `sluice bench images|tabular`: a standard workload end to end, in the same run as the raw
//! Parquet decode of the same files (the ceiling) and, when a Python with the packages is
//! found, a vectorised numpy loader (numpy, pyarrow) and the idiomatic PyTorch `DataLoader`
//! (torch) on identical data and work.
//!
//! Each variant runs in a child process (this binary, `sluice bench-child`, or the Python
//! script) so that its peak RSS is its own; the best of `--repeat` runs counts.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::time::Instant;

use arrow::array::{
    FixedSizeBinaryArray, FixedSizeListArray, Float32Array, Int64Array, RecordBatch,
};
use arrow::datatypes::{DataType, Field};
use futures::StreamExt;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, Encoding};
use parquet::file::properties::WriterProperties;
use serde::{Deserialize, Serialize};
use sluice::observe::Observed;
use sluice::pipeline::Pipeline;
use sluice::report::{Bottleneck, Report};

/// The standard workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Workload {
    /// 200k × 32×32×3 uint8 images: shuffle 10k, random crop (pad 4), flip, normalize,
    /// batches of 256 float32 [3, 32, 32].
    Images,
    /// 2M × 128 float32: shuffle 100k, standardize, Gaussian noise, batches of 1024.
    Tabular,
}

impl Workload {
    fn default_rows(self) -> usize {
        match self {
            Workload::Images => 200_000,
            Workload::Tabular => 2_000_000,
        }
    }
    fn row_bytes(self) -> usize {
        match self {
            Workload::Images => 3072,
            Workload::Tabular => 512,
        }
    }
    fn batch(self) -> usize {
        match self {
            Workload::Images => 256,
            Workload::Tabular => 1024,
        }
    }
    fn buffer_rows(self) -> usize {
        match self {
            Workload::Images => 10_000,
            Workload::Tabular => 100_000,
        }
    }
    fn name(self) -> &'static str {
        match self {
            Workload::Images => "images",
            Workload::Tabular => "tabular",
        }
    }
}

const FILES: usize = 20;
const GROUPS: usize = 10;

/// Writes `rows` rows (split into 20 files × 10 row groups, uncompressed PLAIN: random
/// pixels and floats do not compress) with a deterministic generator.
fn generate(dir: &Path, workload: Workload, rows: usize) -> std::io::Result<()> {
    let per_group = rows.div_ceil(FILES * GROUPS);
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let props = WriterProperties::builder()
        .set_compression(Compression::UNCOMPRESSED)
        .set_dictionary_enabled(false)
        .set_encoding(Encoding::PLAIN)
        .build();
    let mut id = 0usize;
    for f in 0..FILES {
        let file = std::fs::File::create(dir.join(format!("train-{f:03}.parquet")))?;
        let mut writer: Option<ArrowWriter<std::fs::File>> = None;
        let mut file = Some(file);
        for _ in 0..GROUPS {
            let n = per_group.min(rows - id.min(rows));
            if n == 0 {
                break;
            }
            let features: arrow::array::ArrayRef = match workload {
                Workload::Images => {
                    let mut bytes = vec![0u8; n * 3072];
                    for chunk in bytes.chunks_mut(8) {
                        let b = next().to_le_bytes();
                        chunk.copy_from_slice(&b[..chunk.len()]);
                    }
                    Arc::new(
                        FixedSizeBinaryArray::try_from_iter(bytes.chunks(3072))
                            .map_err(std::io::Error::other)?,
                    )
                }
                Workload::Tabular => {
                    let values = Float32Array::from_iter_values(
                        (0..n * 128).map(|_| (next() >> 40) as f32 / (1u64 << 24) as f32),
                    );
                    Arc::new(
                        FixedSizeListArray::try_new(
                            Arc::new(Field::new("item", DataType::Float32, false)),
                            128,
                            Arc::new(values),
                            None,
                        )
                        .map_err(std::io::Error::other)?,
                    )
                }
            };
            let labels = Int64Array::from_iter_values((id..id + n).map(|i| (i % 10) as i64));
            id += n;
            let name = match workload {
                Workload::Images => "image",
                Workload::Tabular => "x",
            };
            let rb =
                RecordBatch::try_from_iter([(name, features), ("label", Arc::new(labels) as _)])
                    .map_err(std::io::Error::other)?;
            let w = match &mut writer {
                Some(w) => w,
                None => writer.insert(
                    ArrowWriter::try_new(
                        file.take().ok_or_else(|| std::io::Error::other("file"))?,
                        rb.schema(),
                        Some(props.clone()),
                    )
                    .map_err(std::io::Error::other)?,
                ),
            };
            w.write(&rb).map_err(std::io::Error::other)?;
            w.flush().map_err(std::io::Error::other)?;
        }
        if let Some(w) = writer {
            w.close().map_err(std::io::Error::other)?;
        }
    }
    Ok(())
}

/// The pipeline of a variant (`raw`: the source alone).
fn yaml(dir: &Path, workload: Workload, variant: &str, threads: usize) -> String {
    // Row groups read ahead. Images: 2 — Sluice as fast as with 4 (0.221–0.241 s for 200k
    // either way) at 25 MiB less peak RSS (225–262 MiB vs 260–285), and the raw decode faster
    // (0.065 s vs 0.082: less in flight stays in cache), so the ceiling it is compared with
    // is the higher one. Tabular: 4 — with 2 both slow down (Sluice 1.75 M rows/s vs 2.0,
    // raw 4.1 vs 5.9–6.5).
    let prefetch = match workload {
        Workload::Images => 2,
        Workload::Tabular => 4,
    };
    let source = format!(
        "source: {{type: parquet, path: '{}/*.parquet', batch_rows: 1024, prefetch: {prefetch}}}\n",
        dir.display()
    );
    let stages = match (workload, variant) {
        (_, "raw" | "floor") => String::new(),
        // `batch` before `image`: the rows are cut into batches of 256 while they are still
        // 3 KiB of uint8 each, and every float32 batch is written once, already final (after
        // `image` a batch that straddles two shuffle outputs would be concatenated: 12 KiB
        // per row copied again).
        (Workload::Images, _) => "stages:\n\
            - {type: shuffle, buffer_rows: 10000, seed: 1, batch_rows: 1024}\n\
            - {type: batch, size: 256}\n\
            - type: image\n  column: image\n  shape: [32, 32, 3]\n  seed: 2\n  ops:\n\
            \x20   - random_crop: {size: [32, 32], padding: 4}\n\
            \x20   - horizontal_flip: {p: 0.5}\n\
            \x20   - normalize: {mean: [0.4914, 0.4822, 0.4465], std: [0.2470, 0.2435, 0.2616]}\n"
            .to_string(),
        (Workload::Tabular, _) => "stages:\n\
            - {type: shuffle, buffer_rows: 100000, seed: 1, batch_rows: 4096}\n\
            - {type: standardize, columns: [x], mean: 0.5, std: 0.29}\n\
            - {type: gaussian_noise, columns: [x], std: 0.1, seed: 3}\n\
            - {type: batch, size: 1024}\n"
            .to_string(),
    };
    // 4 MiB queues: as fast as 8 or 32 MiB here (measured: images 685-705 k/s with 4 MiB,
    // 550-652 k/s with 8; tabular 1.33 M/s with both) and less peak RSS (images 289-291 MiB
    // vs 316-322, tabular 322 vs 384).
    format!("{source}{stages}runtime: {{threads: {threads}, queue_bytes: 4 MiB}}\n")
}

/// What one variant measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Measured {
    rows: usize,
    seconds: f64,
    peak_rss_mib: f64,
    #[serde(default)]
    bottleneck: Option<Bottleneck>,
}

fn peak_rss_mib() -> f64 {
    sluice::peak_rss_bytes().map_or(f64::NAN, sluice::mib)
}

/// `sluice bench-child`: runs one Sluice variant in this process and prints a JSON line.
pub(crate) async fn child(
    data: &Path,
    workload: Workload,
    variant: &str,
    threads: usize,
) -> ExitCode {
    let result = async {
        let pipeline = Pipeline::from_yaml(&yaml(data, workload, variant, threads))?;
        let prepared = pipeline.prepare().await?;
        let observed = Arc::new(Observed::default());
        observed.add_pipeline(0, prepared.metrics());
        let start = Instant::now();
        let rows = consume(prepared, workload, variant).await?;
        let seconds = start.elapsed().as_secs_f64();
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
    if variant != "raw" {
        let loader: sluice::loader::LoaderConfig = serde_json::from_value(match workload {
            Workload::Images => serde_json::json!({"device": "cpu", "tensors": {
                "x": {"column": "image", "dtype": "f32", "shape": [3, 32, 32]},
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
    let _ = (workload, variant);
    let mut s = prepared.stream();
    while let Some(b) = s.next().await {
        rows += b?.num_rows();
    }
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

/// Options of `sluice bench`.
#[derive(Debug, clap::Args)]
pub(crate) struct BenchArgs {
    /// The workload.
    #[arg(value_enum)]
    workload: Workload,
    /// Rows to generate [default: 200000 images, 2000000 tabular].
    #[arg(long)]
    rows: Option<usize>,
    /// Runs per variant; the best counts.
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Sluice's CPU threads (`runtime.threads`).
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Python for the peers: numpy + pyarrow for the numpy peer, torch too for the DataLoader
    /// [default: $SLUICE_BENCH_PYTHON, else python3]. A peer whose packages are missing is
    /// skipped with the reason; `none` skips both.
    #[arg(long)]
    python: Option<String>,
    /// Also write the results as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Keep the generated dataset in DIR (reused when it already holds this workload's
    /// files for the same row count) instead of a temporary directory.
    #[arg(long)]
    data: Option<PathBuf>,
}

/// One row of the table.
#[derive(Debug, Serialize)]
struct Row {
    variant: &'static str,
    description: &'static str,
    measured: Option<Measured>,
    /// Why it did not run.
    skipped: Option<String>,
    samples_per_second: Option<f64>,
    mb_per_second: Option<f64>,
    /// Throughput relative to the raw decode.
    vs_raw: Option<f64>,
}

#[derive(Debug, Serialize)]
struct Results {
    workload: Workload,
    rows: usize,
    threads: usize,
    cores: usize,
    variants: Vec<Row>,
    /// Sluice ÷ DataLoader throughput.
    sluice_vs_dataloader: Option<f64>,
    bottleneck: Option<Bottleneck>,
}

/// The Python the peers run with, and why a peer cannot run there (`None`: it can).
#[derive(Debug)]
struct Peers {
    python: String,
    numpy: Option<String>,
    dataloader: Option<String>,
}

impl Peers {
    fn find(args: &BenchArgs) -> Self {
        let python = match args.python.as_deref() {
            Some(p) => p.to_string(),
            None => std::env::var("SLUICE_BENCH_PYTHON").unwrap_or_else(|_| "python3".into()),
        };
        if python == "none" {
            let why = Some("--python none".to_string());
            return Self {
                python,
                numpy: why.clone(),
                dataloader: why,
            };
        }
        let imports = |modules: &str| {
            Command::new(&python)
                .args(["-c", &format!("import {modules}")])
                .output()
                .map(|o| o.status.success())
                .unwrap_or(false)
        };
        let numpy = (!imports("numpy, pyarrow")).then(|| {
            format!("{python} cannot import numpy and pyarrow (scripts/python-peers.sh installs them; pass --python)")
        });
        let dataloader = if numpy.is_some() {
            numpy.clone()
        } else {
            (!imports("torch")).then(|| {
                format!("{python} cannot import torch (scripts/python-peers.sh --with-torch installs it, ~2.7 GB; pass --python)")
            })
        };
        Self {
            python,
            numpy,
            dataloader,
        }
    }

    /// Why `variant` (a Python peer) cannot run, if it cannot.
    fn missing(&self, variant: &str) -> Option<&String> {
        match variant {
            "numpy" => self.numpy.as_ref(),
            "dataloader" => self.dataloader.as_ref(),
            _ => None,
        }
    }
}

fn run_child(mut cmd: Command) -> Result<Measured, String> {
    let out = cmd.output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().unwrap_or_default();
    serde_json::from_str(line).map_err(|e| format!("{e}: {line}"))
}

/// The variants, in table order, each with what it does.
fn variants(w: Workload) -> [(&'static str, &'static str); 5] {
    let desc = match w {
        Workload::Images => "shuffle 10k + crop/flip/normalize + batch 256 → tensors",
        Workload::Tabular => "shuffle 100k + standardize + noise + batch 1024 → tensors",
    };
    [
        ("raw", "raw Parquet decode (the ceiling)"),
        ("sluice", desc),
        (
            "floor",
            "decode + one float32 write per value, nothing else",
        ),
        (
            "dataloader",
            "PyTorch DataLoader, num_workers=2, per-sample",
        ),
        ("numpy", "numpy, vectorised per batch, 1 process"),
    ]
}

/// Runs each variant `--repeat` times (a peer that cannot run, a failed run or a wrong row
/// count skips it) and makes the table's rows, each from the variant's fastest run.
fn measure_variants(
    args: &BenchArgs,
    rows: usize,
    peers: &Peers,
    script: &Path,
    exe: &Path,
    data: &Path,
) -> Vec<Row> {
    let w = args.workload;
    let mut table = Vec::new();
    for (variant, description) in variants(w) {
        let python_variant = matches!(variant, "dataloader" | "numpy");
        let mut best: Option<Measured> = None;
        let mut skipped = None;
        if let Some(why) = peers.missing(variant) {
            skipped = Some(why.clone());
        }
        for _ in 0..args.repeat.max(1) {
            if skipped.is_some() {
                break;
            }
            let cmd = if python_variant {
                let mut c = Command::new(&peers.python);
                c.arg(script)
                    .args(["--data", &data.display().to_string()])
                    .args(["--workload", w.name(), "--variant", variant])
                    .args(["--batch", &w.batch().to_string()])
                    .args(["--buffer-rows", &w.buffer_rows().to_string()]);
                c
            } else {
                let mut c = Command::new(exe);
                c.arg("bench-child")
                    .arg(data)
                    .args([w.name(), variant, &args.threads.to_string()]);
                c
            };
            match run_child(cmd) {
                Ok(m) if m.rows != rows => {
                    skipped = Some(format!("delivered {} rows, not {rows}", m.rows));
                }
                Ok(m) => {
                    if best.as_ref().is_none_or(|b| m.seconds < b.seconds) {
                        best = Some(m);
                    }
                }
                Err(e) => skipped = Some(format!("failed: {e}")),
            }
        }
        if skipped.is_some() {
            best = None;
        }
        let rate = best.as_ref().map(|m| m.rows as f64 / m.seconds.max(1e-9));
        table.push(Row {
            variant,
            description,
            measured: best,
            skipped,
            samples_per_second: rate,
            mb_per_second: rate.map(|r| r * w.row_bytes() as f64 / 1e6),
            vs_raw: None,
        });
    }
    table
}

/// Prints the results table: a header, then each variant's numbers or why it was skipped.
fn print_table(table: &[Row]) {
    out!(
        "{:<11} {:<58} {:>11} {:>9} {:>10} {:>7}",
        "variant",
        "work",
        "samples/s",
        "MB/s",
        "peak RSS",
        "vs raw"
    );
    for r in table {
        match (&r.measured, &r.skipped) {
            (Some(m), _) => out!(
                "{:<11} {:<58} {:>11.0} {:>9.1} {:>6.0} MiB {:>6.2}×",
                r.variant,
                r.description,
                r.samples_per_second.unwrap_or(0.0),
                r.mb_per_second.unwrap_or(0.0),
                m.peak_rss_mib,
                r.vs_raw.unwrap_or(f64::NAN)
            ),
            (None, why) => out!(
                "{:<11} {:<58} skipped: {}",
                r.variant,
                r.description,
                why.as_deref().unwrap_or("?")
            ),
        }
    }
}

/// `sluice bench`.
pub(crate) fn bench(args: &BenchArgs) -> ExitCode {
    let w = args.workload;
    let rows = args.rows.unwrap_or(w.default_rows());
    let dir = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: cannot create a temporary directory: {e}");
            return ExitCode::FAILURE;
        }
    };
    let data = args.data.clone().unwrap_or_else(|| dir.path().join("data"));
    let stamp = data.join(".sluice-bench");
    let wanted = format!("{} {rows}", w.name());
    let generated = if std::fs::read_to_string(&stamp).is_ok_and(|s| s == wanted) {
        Ok(())
    } else {
        std::fs::create_dir_all(&data)
            .and_then(|()| generate(&data, w, rows))
            .and_then(|()| std::fs::write(&stamp, &wanted))
    };
    if let Err(e) = generated {
        eprintln!("error: generating the dataset in {}: {e}", data.display());
        return ExitCode::FAILURE;
    }
    let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("sluice"));
    let peers = Peers::find(args);
    let script = dir.path().join("peers.py");
    if std::fs::write(&script, include_str!("../benches/python/peers.py")).is_err() {
        eprintln!("error: cannot write {}", script.display());
        return ExitCode::FAILURE;
    }
    out!(
        "sluice bench {}: {rows} rows ({:.0} MB), {} Sluice threads, {} cores, best of {}",
        w.name(),
        (rows * w.row_bytes()) as f64 / 1e6,
        args.threads,
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        args.repeat.max(1)
    );
    let mut table = measure_variants(args, rows, &peers, &script, &exe, &data);
    let raw = table[0].samples_per_second;
    for r in &mut table {
        r.vs_raw = match (r.samples_per_second, raw) {
            (Some(a), Some(b)) if b > 0.0 => Some(a / b),
            _ => None,
        };
    }
    print_table(&table);
    let sluice_vs_dl = match (table[1].samples_per_second, table[3].samples_per_second) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    };
    if let Some(x) = sluice_vs_dl {
        out!("sluice vs PyTorch DataLoader: {x:.1}×");
    }
    let bottleneck = table[1]
        .measured
        .as_ref()
        .and_then(|m| m.bottleneck.clone());
    if let Some(b) = &bottleneck {
        out!("bottleneck: {} — {}", b.element, b.evidence);
        out!("  knob: {}", b.suggestion);
    }
    let results = Results {
        workload: w,
        rows,
        threads: args.threads,
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        variants: table,
        sluice_vs_dataloader: sluice_vs_dl,
        bottleneck,
    };
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&results).unwrap_or_default();
        if let Err(e) = std::fs::write(path, text) {
            eprintln!("error: cannot write {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    // A peer may be missing (no Python with torch); a variant that ran and failed is an error.
    let failed = results
        .variants
        .iter()
        .any(|r| r.measured.is_none() && peers.missing(r.variant).is_none());
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
