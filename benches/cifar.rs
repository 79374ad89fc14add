//! The CIFAR-style workload against the raw Parquet decode of the same files, in one run.
//!
//! 200,000 rows of 32×32×3 `uint8` images (plus an int64 label) are generated into Parquet
//! (20 files × 10 row groups of 1,000 rows, uncompressed: image bytes do not compress), then:
//!
//! - `raw decode`: the source alone (row groups fetched and decoded, every batch counted);
//! - `cifar`: shuffle (window 10,000 rows, row groups permuted) → `image` (random crop with
//!   padding 4, horizontal flip, per-channel normalize) → batches of 256 rows of float32
//!   `[3, 32, 32]`.
//!
//! Each variant runs in a child process (this binary re-executed) so its peak RSS (VmHWM) is
//! its own. `cargo bench --bench cifar` runs the full size; under `cargo test` a small one.
#![allow(clippy::unwrap_used, clippy::print_stdout)]

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use arrow::array::{FixedSizeBinaryArray, Int64Array, RecordBatch};
use futures::StreamExt;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, Encoding};
use parquet::file::properties::WriterProperties;
use sluice_pipeline::Pipeline;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const FILES: usize = 20;
const GROUPS: usize = 10;

fn generate(dir: &Path, rows: usize) {
    let per_group = rows / FILES / GROUPS;
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut id = 0i64;
    for f in 0..FILES {
        let props = WriterProperties::builder()
            .set_compression(Compression::UNCOMPRESSED)
            .set_dictionary_enabled(false)
            .set_encoding(Encoding::PLAIN)
            .build();
        let file = std::fs::File::create(dir.join(format!("train-{f:03}.parquet"))).unwrap();
        let mut w: Option<ArrowWriter<std::fs::File>> = None;
        let mut file = Some(file);
        for _ in 0..GROUPS {
            let mut bytes = vec![0u8; per_group * 3072];
            for chunk in bytes.chunks_mut(8) {
                // xorshift: cheap, incompressible-looking pixels
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let b = state.to_le_bytes();
                chunk.copy_from_slice(&b[..chunk.len()]);
            }
            let images = FixedSizeBinaryArray::try_from_iter(bytes.chunks(3072)).unwrap();
            let labels = Int64Array::from_iter_values((id..id + per_group as i64).map(|i| i % 10));
            id += per_group as i64;
            let rb = RecordBatch::try_from_iter([
                ("image", Arc::new(images) as _),
                ("label", Arc::new(labels) as _),
            ])
            .unwrap();
            let writer = w.get_or_insert_with(|| {
                ArrowWriter::try_new(file.take().unwrap(), rb.schema(), Some(props.clone()))
                    .unwrap()
            });
            writer.write(&rb).unwrap();
            writer.flush().unwrap();
        }
        w.unwrap().close().unwrap();
    }
}

fn yaml(dir: &Path, variant: &str) -> String {
    let source = format!(
        "source: {{type: parquet, path: '{}/*.parquet', batch_rows: 1024, prefetch: 4}}\n",
        dir.display()
    );
    let shuffle = "- {type: shuffle, buffer_rows: 10000, seed: 1, batch_rows: 1024}\n";
    let augment = "- type: image\n\
              \x20 column: image\n\
              \x20 shape: [32, 32, 3]\n\
              \x20 seed: 2\n\
              \x20 ops:\n\
              \x20   - random_crop: {size: [32, 32], padding: 4}\n\
              \x20   - horizontal_flip: {p: 0.5}\n\
              \x20   - normalize: {mean: [0.4914, 0.4822, 0.4465], std: [0.2470, 0.2435, 0.2616]}\n";
    let batch = "- {type: batch, size: 256}\n";
    let stages = match variant {
        "raw" => String::new(),
        "shuffle" => format!("stages:\n{shuffle}"),
        "augment" => format!("stages:\n{augment}{batch}"),
        _ => format!("stages:\n{shuffle}{augment}{batch}"),
    };
    format!("{source}{stages}runtime: {{threads: 2, queue_bytes: 32 MiB}}\n")
}

fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
        .unwrap_or(f64::NAN)
}

/// Runs one variant in this process; prints `rows seconds rss_mib`.
fn child(dir: &Path, variant: &str) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let pipeline = Pipeline::from_yaml(&yaml(dir, variant)).unwrap();
        let prepared = pipeline.prepare().await.unwrap();
        let start = Instant::now();
        let mut s = prepared.stream();
        let mut rows = 0usize;
        let mut checksum = 0u64;
        while let Some(b) = s.next().await {
            let b = b.unwrap();
            rows += b.num_rows();
            checksum = checksum.wrapping_add(b.data.num_columns() as u64);
        }
        let secs = start.elapsed().as_secs_f64();
        println!("{rows} {secs} {} {checksum}", peak_rss_mib());
    });
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--child") {
        child(Path::new(&args[i + 1]), &args[i + 2]);
        return;
    }
    let full = args.iter().any(|a| a == "--bench");
    let rows = if full { 200_000 } else { 4_000 };
    let dir = tempfile::tempdir().unwrap();
    generate(dir.path(), rows);
    let exe = std::env::current_exe().unwrap();
    println!("cifar-style workload, {rows} rows of 32×32×3 uint8, 2 threads, best of 3");
    println!(
        "{:<44} {:>12} {:>10} {:>12}",
        "variant", "images/s", "MB/s in", "peak RSS"
    );
    let mut rates = Vec::new();
    for (variant, name) in [
        ("raw", "raw Parquet decode (ceiling)"),
        ("cifar", "shuffle 10k + crop/flip/normalize + batch 256"),
        ("shuffle", "  of which: shuffle 10k alone"),
        ("augment", "  of which: crop/flip/normalize + batch alone"),
    ] {
        let mut best = f64::INFINITY;
        let mut rss = 0f64;
        for _ in 0..3 {
            let out = Command::new(&exe)
                .args(["--child", &dir.path().display().to_string(), variant])
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let text = String::from_utf8_lossy(&out.stdout);
            let line = text.lines().last().unwrap_or_default().to_string();
            let f: Vec<f64> = line.split(' ').filter_map(|v| v.parse().ok()).collect();
            assert_eq!(f[0] as usize, rows, "{variant}: every row once ({line})");
            best = best.min(f[1]);
            rss = rss.max(f[2]);
        }
        let rate = rows as f64 / best;
        rates.push(rate);
        println!(
            "{name:<44} {rate:>12.0} {:>10.1} {:>9.1} MiB",
            rate * 3072.0 / 1e6,
            rss
        );
    }
    println!(
        "ratio to raw decode: {:.2} (goal ≥ 0.75)",
        rates[1] / rates[0]
    );
}
