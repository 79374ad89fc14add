//! Helpers shared by the integration tests.
#![allow(dead_code, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{FixedSizeBinaryArray, Float32Array, Int64Array, RecordBatch};
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::file::properties::WriterProperties;

/// The repository root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `sluice` built by cargo for this test run, with a clean environment for output paths.
pub fn sluice() -> assert_cmd::Command {
    let mut c = assert_cmd::cargo::cargo_bin_cmd!("sluice");
    c.env_remove("SLUICE_OUT_DIR").env_remove("RUST_LOG");
    c
}

/// Reads every batch of a Parquet file.
pub fn read_parquet(path: &Path) -> Vec<RecordBatch> {
    read_parquet_from(std::fs::File::open(path).unwrap())
}

/// Reads every batch of Parquet data (a file, or an object's bytes).
pub fn read_parquet_from<R: parquet::file::reader::ChunkReader + 'static>(
    data: R,
) -> Vec<RecordBatch> {
    ParquetRecordBatchReaderBuilder::try_new(data)
        .unwrap()
        .build()
        .unwrap()
        .map(|b| b.unwrap())
        .collect()
}

/// Checks one round of two runs raced into one output, given each run's exit code and
/// stderr: each finished (0) or was refused by the other's claim (1, saying so), and at least
/// one finished. Returns how many were refused.
pub fn race_outcome(round: usize, runs: [(Option<i32>, String); 2]) -> usize {
    let mut refusals = 0;
    let finished = runs.iter().any(|(code, _)| *code == Some(0));
    for (code, err) in runs {
        match code {
            Some(0) => {}
            Some(1) => {
                assert!(err.contains("another run is writing this output"), "{err}");
                refusals += 1;
            }
            other => panic!("round {round}: exit {other:?}: {err}"),
        }
    }
    assert!(finished, "round {round}: neither finished");
    refusals
}

/// Asserts an output raced into by two runs of `epochs` epochs over the 1,437 digits is
/// wholly one of them: every id, each seen as often as one run reads it, never a mix.
pub fn assert_one_run(
    round: usize,
    ids: &std::collections::BTreeMap<i64, usize>,
    epochs: [usize; 2],
) {
    assert_eq!(ids.len(), 1437, "round {round}");
    let seen: std::collections::BTreeSet<usize> = ids.values().copied().collect();
    assert!(
        seen.len() == 1 && epochs.iter().any(|e| seen.contains(e)),
        "round {round}: the output mixes both runs' parts (ids seen {seen:?} times)"
    );
}

/// Writes batches to a Parquet file with `rows_per_group` rows per row group.
pub fn write_parquet(path: &Path, batches: &[RecordBatch], rows_per_group: usize) {
    let f = std::fs::File::create(path).unwrap();
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(rows_per_group))
        .build();
    let mut w = ArrowWriter::try_new(f, batches[0].schema(), Some(props)).unwrap();
    for b in batches {
        w.write(b).unwrap();
    }
    w.close().unwrap();
}

/// Every entry (recursively) under `dir`, as relative paths.
pub fn files_under(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p.strip_prefix(dir).unwrap().display().to_string());
            }
        }
    }
    out.sort();
    out
}

/// An order-sensitive FNV-1a checksum over the given Int64 columns.
pub fn checksum_i64(batches: &[RecordBatch], columns: &[&str]) -> u64 {
    use arrow::array::AsArray;
    use arrow::datatypes::Int64Type;
    let mut h: u64 = 0xcbf29ce484222325;
    for b in batches {
        let cols: Vec<_> = columns
            .iter()
            .map(|c| {
                b.column_by_name(c)
                    .unwrap()
                    .as_primitive::<Int64Type>()
                    .clone()
            })
            .collect();
        for r in 0..b.num_rows() {
            for c in &cols {
                for byte in c.value(r).to_le_bytes() {
                    h ^= byte as u64;
                    h = h.wrapping_mul(0x100000001b3);
                }
            }
        }
    }
    h
}

/// The values of Int64 column `column` across batches.
pub fn int64_values(batches: &[RecordBatch], column: &str) -> Vec<i64> {
    use arrow::array::AsArray;
    use arrow::datatypes::Int64Type;
    batches
        .iter()
        .flat_map(|b| {
            b.column_by_name(column)
                .unwrap()
                .as_primitive::<Int64Type>()
                .values()
                .to_vec()
        })
        .collect()
}

/// The values of Utf8 column `column` across batches (`None` for nulls).
pub fn utf8_values(batches: &[RecordBatch], column: &str) -> Vec<Option<String>> {
    use arrow::array::AsArray;
    batches
        .iter()
        .flat_map(|b| {
            b.column_by_name(column)
                .unwrap()
                .as_string::<i32>()
                .iter()
                .map(|v| v.map(str::to_string))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// A Hive-partitioned layout of one-row files (`id`): (relative path, id, year, lang).
pub const HIVE_LAYOUT: [(&str, i64, &str, Option<&str>); 3] = [
    // pyarrow writes partition values URI-encoded: the `%20` is in the name.
    ("year=2023/lang=en%20US/f.parquet", 1, "2023", Some("en US")),
    ("year=2023/lang=en/f.parquet", 0, "2023", Some("en")),
    // Hive's null.
    (
        "year=2024/lang=__HIVE_DEFAULT_PARTITION__/f.parquet",
        2,
        "2024",
        None,
    ),
];

/// Checks a run's output of [`HIVE_LAYOUT`] read with `partitioning: hive`: every file's
/// row, in key order, with its directories as columns after the file's.
pub fn assert_hive_columns(out: &[RecordBatch]) {
    let schema = out[0].schema();
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    assert_eq!(names, ["id", "year", "lang"]);
    assert_eq!(
        int64_values(out, "id"),
        HIVE_LAYOUT.iter().map(|f| f.1).collect::<Vec<_>>()
    );
    assert_eq!(
        utf8_values(out, "year"),
        HIVE_LAYOUT
            .iter()
            .map(|f| Some(f.2.to_string()))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        utf8_values(out, "lang"),
        HIVE_LAYOUT
            .iter()
            .map(|f| f.3.map(str::to_string))
            .collect::<Vec<_>>()
    );
}

/// The bytes of a one-row Parquet file holding `id`.
pub fn one_row_parquet(id: i64) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("one.parquet");
    let b = RecordBatch::try_from_iter([("id", arc(arrow::array::Int64Array::from(vec![id])))])
        .unwrap();
    write_parquet(&p, &[b], 10);
    std::fs::read(&p).unwrap()
}

/// Total rows.
pub fn rows(batches: &[RecordBatch]) -> usize {
    batches.iter().map(RecordBatch::num_rows).sum()
}

pub mod kafka;
pub mod s3;

pub fn arc<T: arrow::array::Array + 'static>(a: T) -> arrow::array::ArrayRef {
    Arc::new(a)
}

/// Runs `sluice` with `args` in `dir`, bounded: a hang fails the test after `timeout`.
pub fn run_in_for(dir: &Path, args: &[&str], timeout: std::time::Duration) -> std::process::Output {
    sluice()
        .args(args)
        .current_dir(dir)
        .timeout(timeout)
        .output()
        .unwrap()
}

/// A finished command's stdout followed by its stderr, as text.
pub fn output_text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Asserts a `sluice` run succeeded, showing its stdout and stderr otherwise.
pub fn assert_ok(out: &std::process::Output) {
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Polls `check` until it returns `Some`, failing after `timeout`. Waits on a condition, not
/// on time: the interval only bounds how often the condition is evaluated.
pub fn wait_for<T>(
    what: &str,
    timeout: std::time::Duration,
    mut check: impl FnMut() -> Option<T>,
) -> T {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// (id, x bits) of every row (columns `id` int64, `x` float32) of the part files under `dir`, in part order.
pub fn parts_in_order(dir: &Path) -> Vec<(i64, u32)> {
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy().to_string();
            n.starts_with("part-") && n.ends_with(".parquet")
        })
        .collect();
    names.sort();
    use arrow::array::AsArray;
    let mut out = Vec::new();
    for p in names {
        for b in read_parquet(&p) {
            let id = b
                .column_by_name("id")
                .unwrap()
                .as_primitive::<arrow::datatypes::Int64Type>();
            let x = b
                .column_by_name("x")
                .unwrap()
                .as_primitive::<arrow::datatypes::Float32Type>();
            out.extend(
                id.values()
                    .iter()
                    .zip(x.values())
                    .map(|(i, v)| (*i, v.to_bits())),
            );
        }
    }
    out
}

/// `sluice run` in `dir` of the digits pipeline the object-store tests share: a Parquet source
/// on `paths` (with `storage`, a flow map, unless empty), `pixels` cast to float32, into
/// `out.parquet`: the exit code and all output (stdout, then stderr).
pub fn run_cast_job(dir: &Path, paths: &[String], storage: &str) -> (i32, String) {
    let list: Vec<String> = paths.iter().map(|s| format!("'{s}'")).collect();
    let storage = if storage.is_empty() {
        String::new()
    } else {
        format!(", storage: {storage}")
    };
    std::fs::write(
        dir.join("p.yaml"),
        format!(
            "source: {{type: parquet, path: [{}]{storage}}}\nstages:\n- {{type: cast, columns: {{pixels: float32}}}}\nsink: {{type: parquet, path: out.parquet}}\n",
            list.join(", ")
        ),
    )
    .unwrap();
    let out = sluice()
        .arg("run")
        .arg("p.yaml")
        .current_dir(dir)
        .output()
        .unwrap();
    let text = output_text(&out);
    (out.status.code().unwrap_or(-1), text)
}

/// Starts `sluice ARGS` in `dir` (stdout discarded, stderr to `dir/stderr.log`), to be killed
/// or signalled by the test.
pub fn spawn_sluice(dir: &Path, args: &[&str]) -> std::process::Child {
    spawn_sluice_with(dir, args, &[])
}

/// [`spawn_sluice`] with environment variables `env` set.
pub fn spawn_sluice_with(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> std::process::Child {
    std::process::Command::new(assert_cmd::cargo::cargo_bin!("sluice"))
        .args(args)
        .current_dir(dir)
        .env_remove("RUST_LOG")
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.join("stderr.log")).unwrap())
        .spawn()
        .unwrap()
}

/// A training checkpoint's metadata and its tensors' values, by name.
#[cfg(feature = "torch")]
pub type TrainCheckpoint = (
    sluice::trainer::checkpoint::CheckpointMeta,
    Vec<(String, Vec<f32>)>,
);

/// Decodes a training checkpoint (`None` if it is not one, e.g. not written yet).
#[cfg(feature = "torch")]
pub fn decode_train_checkpoint(bytes: &[u8]) -> Option<TrainCheckpoint> {
    let (meta, tensors) = sluice::trainer::checkpoint::decode(bytes).ok()?;
    let values = tensors
        .into_iter()
        .map(|(n, t)| (n, Vec::<f32>::try_from(&t.flatten(0, -1)).unwrap()))
        .collect();
    Some((meta, values))
}

/// Reads and decodes a training checkpoint file, if it exists.
#[cfg(feature = "torch")]
pub fn read_train_checkpoint(path: &Path) -> Option<TrainCheckpoint> {
    decode_train_checkpoint(&std::fs::read(path).ok()?)
}

/// The model versions `trainer.export` published under `models` (`step-…` folders), in order.
pub fn model_versions(models: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(models)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("step-"))
        .collect();
    v.sort();
    v
}

/// Starts `sluice train job.yaml` in `dir`, waits until its checkpoint (`state/train.ckpt`)
/// has passed step `step`, and SIGKILLs it (no chance to checkpoint on the way out); returns
/// the checkpoint as the kill left it.
#[cfg(feature = "torch")]
pub fn train_killed_past(dir: &Path, step: u64) -> TrainCheckpoint {
    let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin!("sluice"))
        .args(["train", "job.yaml"])
        .current_dir(dir)
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let ckpt = dir.join("state/train.ckpt");
    wait_for(
        &format!("a checkpoint past step {step}"),
        std::time::Duration::from_secs(120),
        || read_train_checkpoint(&ckpt).filter(|(m, _)| m.step >= step),
    );
    assert!(
        child.try_wait().unwrap().is_none(),
        "the run ended before it was killed"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    read_train_checkpoint(&ckpt).unwrap()
}

/// Asserts two checkpoints' parameters are the same, name for name and bit for bit;
/// `reference` says what `got` is compared with, in the message.
#[cfg(feature = "torch")]
pub fn assert_same_parameters(
    got: &[(String, Vec<f32>)],
    want: &[(String, Vec<f32>)],
    reference: &str,
) {
    assert_eq!(got.len(), want.len());
    for ((n, a), (m, b)) in got.iter().zip(want) {
        assert_eq!(n, m);
        let same = a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same, "`{n}` differs from {reference}");
    }
}

/// Asserts two checkpoints' parameters are the same names with values within `tolerance`
/// (absolute, plus relative to the larger magnitude); the message gives the largest gap.
#[cfg(feature = "torch")]
pub fn assert_close_parameters(
    got: &[(String, Vec<f32>)],
    want: &[(String, Vec<f32>)],
    tolerance: f32,
    reference: &str,
) {
    assert_eq!(got.len(), want.len());
    for ((n, a), (m, b)) in got.iter().zip(want) {
        assert_eq!((n, a.len()), (m, b.len()));
        let worst = a
            .iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs() / (1.0 + x.abs().max(y.abs())))
            .fold(0.0f32, f32::max);
        assert!(
            worst <= tolerance,
            "`{n}` differs from {reference} by up to {worst:e} (allowed: {tolerance:e})"
        );
    }
}

/// `files` files of `rows` rows each (row groups of 1,000): id, x = id, and `blob_bytes`
/// bytes per row.
pub fn dataset(dir: &Path, files: usize, rows: usize, blob_bytes: usize) {
    std::fs::create_dir_all(dir).unwrap();
    for f in 0..files {
        let start = (f * rows) as i64;
        let ids: Vec<i64> = (start..start + rows as i64).collect();
        let blob = FixedSizeBinaryArray::try_from_iter(
            ids.iter().map(|i| vec![(*i % 251) as u8; blob_bytes]),
        )
        .unwrap();
        let rb = RecordBatch::try_from_iter([
            ("id", arc(Int64Array::from(ids.clone()))),
            (
                "x",
                arc(Float32Array::from_iter_values(
                    ids.iter().map(|i| *i as f32),
                )),
            ),
            ("blob", arc(blob)),
        ])
        .unwrap();
        write_parquet(&dir.join(format!("part-{f}.parquet")), &[rb], 1000);
    }
}

/// SplitMix64: a tiny seedable generator for tests that derive their cases from a seed (config
/// mutants, corrupt-file positions), so a failure replays from the seed alone.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        assert!(n > 0, "below(0)");
        (self.next_u64() % n as u64) as usize
    }
}

/// A valid 2×2 RGB PNG (every pixel grey 7), for image-stage tests.
pub fn tiny_png() -> Vec<u8> {
    use image::ImageEncoder;
    let mut png = Vec::new();
    image::codecs::png::PngEncoder::new(&mut png)
        .write_image(&[7u8; 2 * 2 * 3], 2, 2, image::ExtendedColorType::Rgb8)
        .unwrap();
    png
}

/// The Python of the package's venv (numpy, torch, safetensors, tensorboard), as
/// scripts/test.sh exports it.
pub fn venv_python() -> String {
    std::env::var("SLUICE_BENCH_PYTHON").unwrap_or_else(|_| {
        panic!(
            "SLUICE_BENCH_PYTHON is not set: this test reads Sluice's output with Python packages \
             (safetensors, tensorboard). Run the suite with scripts/test.sh, or set it to \
             target/services/venv-python/bin/python after scripts/python.sh --build"
        )
    })
}
