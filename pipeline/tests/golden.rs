//! Pins the exact output of a seeded pipeline (shuffle + image augmentation + noise and
//! dropout on a scalar and a vector column + mixup of the scalar) and
//! measures shuffle quality for the default shuffle settings.
//!
//! The golden file `tests/golden/first_batches.json` holds the first batches (ids and every
//! output value). Any change to the random streams, the shuffle or the kernels changes it:
//! that is a breaking change for users who rely on reproducible data order. Regenerate it
//! deliberately with `SLUICE_BLESS=1 cargo test -p sluice-pipeline --test golden`.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::sync::Arc;

use arrow::array::{
    Array, AsArray, FixedSizeBinaryArray, FixedSizeListArray, Float32Array, Int64Array, RecordBatch,
};
use arrow::datatypes::{DataType, Field, Float32Type, Int64Type};
use futures::StreamExt;
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;
use sluice_pipeline::{Batch, Pipeline};

/// `files` files of `groups` row groups of `rows` rows: id, x = id / 10, v = 32 values
/// (id + k / 32), a 4×4×3 image.
fn write(dir: &Path, files: usize, groups: usize, rows: usize, image: bool) {
    let mut id = 0i64;
    for f in 0..files {
        let file = std::fs::File::create(dir.join(format!("part-{f}.parquet"))).unwrap();
        let mut w: Option<ArrowWriter<std::fs::File>> = None;
        let mut file = Some(file);
        for _ in 0..groups {
            let ids: Vec<i64> = (id..id + rows as i64).collect();
            id += rows as i64;
            let mut cols: Vec<(&str, arrow::array::ArrayRef)> =
                vec![
                    ("id", Arc::new(Int64Array::from(ids.clone()))),
                    (
                        "x",
                        Arc::new(Float32Array::from_iter_values(
                            ids.iter().map(|v| *v as f32 / 10.0),
                        )),
                    ),
                    (
                        "v",
                        Arc::new(
                            FixedSizeListArray::try_new(
                                Arc::new(Field::new_list_field(DataType::Float32, false)),
                                32,
                                Arc::new(Float32Array::from_iter_values(ids.iter().flat_map(
                                    |v| (0..32).map(move |k| *v as f32 + k as f32 / 32.0),
                                ))),
                                None,
                            )
                            .unwrap(),
                        ),
                    ),
                ];
            if image {
                let imgs = FixedSizeBinaryArray::try_from_iter(ids.iter().map(|v| {
                    (0..48u8)
                        .map(|k| (*v as u8).wrapping_mul(31).wrapping_add(k * 5))
                        .collect::<Vec<u8>>()
                }))
                .unwrap();
                cols.push(("img", Arc::new(imgs)));
            }
            let rb = RecordBatch::try_from_iter(cols).unwrap();
            let writer = w.get_or_insert_with(|| {
                ArrowWriter::try_new(
                    file.take().unwrap(),
                    rb.schema(),
                    Some(WriterProperties::builder().build()),
                )
                .unwrap()
            });
            writer.write(&rb).unwrap();
            writer.flush().unwrap();
        }
        w.unwrap().close().unwrap();
    }
}

async fn collect(yaml: &str, limit: usize) -> Vec<Batch> {
    let mut s = Pipeline::from_yaml(yaml).unwrap().stream();
    let mut out = Vec::new();
    while out.len() < limit {
        match s.next().await {
            Some(b) => out.push(b.unwrap()),
            None => break,
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_batches_match_the_golden_file() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), 3, 4, 50, true);
    for threads in [2, 1, 4] {
        check_golden(dir.path(), threads).await;
    }
}

async fn check_golden(dir: &Path, threads: usize) {
    let yaml = format!(
        "source: {{type: parquet, path: '{}/*.parquet', batch_rows: 16}}\n\
         stages:\n\
         - {{type: gaussian_noise, columns: [x, v], std: 0.5, seed: 11}}\n\
         - {{type: shuffle, buffer_rows: 100, seed: 42, batch_rows: 32}}\n\
         - type: image\n\
         \x20 column: img\n\
         \x20 shape: [4, 4, 3]\n\
         \x20 seed: 3\n\
         \x20 ops:\n\
         \x20   - random_crop: {{size: [4, 4], padding: 1}}\n\
         \x20   - horizontal_flip: {{}}\n\
         \x20   - color_jitter: {{brightness: 0.2, contrast: 0.2, saturation: 0.2}}\n\
         \x20   - normalize: {{mean: [0.5, 0.4, 0.3], std: [0.2, 0.25, 0.3]}}\n\
         - {{type: batch, size: 8}}\n\
         - {{type: feature_dropout, columns: [v], p: 0.2, seed: 5}}\n\
         - {{type: mixup, columns: [x], alpha: 0.4, seed: 9}}\n\
         runtime: {{threads: {threads}}}\n",
        dir.display()
    );
    let batches = collect(&yaml, 3).await;
    let json: Vec<serde_json::Value> = batches
        .iter()
        .map(|b| {
            let ids = b
                .data
                .column_by_name("id")
                .unwrap()
                .as_primitive::<Int64Type>();
            let x = b
                .data
                .column_by_name("x")
                .unwrap()
                .as_primitive::<Float32Type>();
            let img = b.data.column_by_name("img").unwrap().as_fixed_size_list();
            let v = b.data.column_by_name("v").unwrap().as_fixed_size_list();
            serde_json::json!({
                "id": ids.values().to_vec(),
                "x": x.values().iter().map(|v| format!("{:08x}", v.to_bits())).collect::<Vec<_>>(),
                "img": (0..img.len())
                    .flat_map(|r| img.value(r).as_primitive::<Float32Type>().values().to_vec())
                    .map(|v| format!("{:08x}", v.to_bits()))
                    .collect::<String>(),
                "v": (0..v.len())
                    .flat_map(|r| v.value(r).as_primitive::<Float32Type>().values().to_vec())
                    .map(|v| format!("{:08x}", v.to_bits()))
                    .collect::<String>(),
            })
        })
        .collect();
    let text = serde_json::to_string_pretty(&json).unwrap() + "\n";
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/first_batches.json");
    if std::env::var_os("SLUICE_BLESS").is_some() && threads == 2 {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &text).unwrap();
    }
    let golden = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; create it with SLUICE_BLESS=1 cargo test -p sluice-pipeline --test golden",
            path.display()
        )
    });
    assert!(
        golden == text,
        "the first batches changed for the same seed with {threads} thread(s) (golden file {}); if intended, re-bless it",
        path.display()
    );
}

/// Spearman correlation between input order and output order, mean displacement (fraction
/// of the epoch) and the share of neighbouring output rows that come from the same row group.
fn quality(ids: &[i64], rows_per_group: i64) -> (f64, f64, f64) {
    let n = ids.len() as f64;
    // Ids are 0..n, so an id is its input rank.
    let (mut d2, mut disp) = (0f64, 0f64);
    for (pos, id) in ids.iter().enumerate() {
        let d = pos as f64 - *id as f64;
        d2 += d * d;
        disp += d.abs();
    }
    let rho = 1.0 - 6.0 * d2 / (n * (n * n - 1.0));
    let same_group = ids
        .windows(2)
        .filter(|w| w[0] / rows_per_group == w[1] / rows_per_group)
        .count() as f64
        / (n - 1.0);
    (rho, disp / n / n, same_group)
}

/// The `id` of every row, in output order, of a pipeline reading only `id` from the files in
/// `dir` through `stages` (YAML list items; empty: no stages).
async fn ids_through(dir: &Path, stages: &str) -> Vec<i64> {
    let stages = match stages {
        "" => String::new(),
        s => format!("stages:\n{s}"),
    };
    let yaml = format!(
        "source: {{type: parquet, path: '{}/*.parquet', columns: [id]}}\n{stages}runtime: {{threads: 2}}\n",
        dir.display()
    );
    collect(&yaml, usize::MAX)
        .await
        .iter()
        .flat_map(|b| {
            b.data
                .column(0)
                .as_primitive::<Int64Type>()
                .values()
                .to_vec()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_shuffle_mixes_well() {
    let dir = tempfile::tempdir().unwrap();
    // 128k rows in 64 row groups of 2,000 (two files).
    write(dir.path(), 2, 32, 2000, false);
    let plain = ids_through(dir.path(), "").await;
    let (rho0, disp0, same0) = quality(&plain, 2000);
    assert!(
        rho0 > 0.999 && disp0 < 1e-9 && same0 > 0.99,
        "the statistic detects no shuffle"
    );
    // Defaults: buffer_rows 16384, row groups permuted.
    let shuffled = ids_through(dir.path(), "  - {type: shuffle, seed: 1}\n").await;
    let mut sorted = shuffled.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, plain, "every row exactly once");
    let (rho, disp, same) = quality(&shuffled, 2000);
    eprintln!(
        "default shuffle: spearman {rho:.4}, mean displacement {disp:.4} of the epoch, same-row-group neighbours {same:.4}"
    );
    // Thresholds: a uniform shuffle has rho ~ 0 (±0.003 here), displacement 1/3 and
    // same-group neighbours 1/64; the default must be close.
    assert!(rho.abs() < 0.2, "rank correlation {rho}");
    assert!(disp > 0.25, "mean displacement {disp}");
    assert!(same < 0.2, "same-row-group neighbours {same}");
}

/// Distinct row groups among each run of 1,000 consecutive output rows, averaged: how many
/// sources a batch mixes (a uniform shuffle of 64 row groups: ~64; windows of 8 row groups:
/// at most ~9).
fn groups_per_thousand(ids: &[i64], rows_per_group: i64) -> f64 {
    let runs: Vec<usize> = ids
        .chunks_exact(1000)
        .map(|c| {
            c.iter()
                .map(|id| id / rows_per_group)
                .collect::<std::collections::BTreeSet<_>>()
                .len()
        })
        .collect();
    runs.iter().sum::<usize>() as f64 / runs.len() as f64
}

/// The global shuffle against the default window shuffle at the same memory (16,384 rows of
/// 8 bytes: 128 KiB) and a perfect permutation (Fisher–Yates over the whole epoch): the
/// numbers docs/config.md quotes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn global_shuffle_mixes_like_a_perfect_permutation() {
    use rand::SeedableRng;
    use rand::seq::SliceRandom;
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), 2, 32, 2000, false);
    let window = ids_through(dir.path(), "  - {type: shuffle, seed: 1}\n").await;
    let global = ids_through(
        dir.path(),
        "  - {type: shuffle, mode: global, seed: 1, max_memory: 128 KiB}\n",
    )
    .await;
    let mut sorted = global.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        (0..128_000).collect::<Vec<i64>>(),
        "every row exactly once"
    );
    let mut perfect: Vec<i64> = (0..128_000).collect();
    perfect.shuffle(&mut rand::rngs::StdRng::seed_from_u64(1));
    let mut stats = Vec::new();
    for (name, order) in [
        ("window", &window),
        ("global", &global),
        ("perfect", &perfect),
    ] {
        let (rho, disp, same) = quality(order, 2000);
        let mixed = groups_per_thousand(order, 2000);
        eprintln!(
            "{name}: spearman {rho:.4}, mean displacement {disp:.4}, same-row-group neighbours {same:.4}, row groups per 1000 rows {mixed:.1}"
        );
        stats.push((rho, disp, same, mixed));
    }
    let (w, g, p) = (stats[0], stats[1], stats[2]);
    // The global shuffle is as good as the perfect one, within sampling noise.
    assert!(g.0.abs() < 0.01, "rank correlation {}", g.0);
    assert!((g.1 - p.1).abs() < 0.005, "displacement {} vs {}", g.1, p.1);
    assert!(
        (g.2 - p.2).abs() < 0.005,
        "same-group neighbours {} vs {}",
        g.2,
        p.2
    );
    assert!(
        (g.3 - p.3).abs() < 1.0,
        "row groups per 1000 rows {} vs {}",
        g.3,
        p.3
    );
    // The window shuffle mixes far fewer sources per batch at the same memory.
    assert!(w.3 < p.3 / 3.0, "window: {} row groups per 1000 rows", w.3);
}
