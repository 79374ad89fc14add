//! Peak RSS, measured by the kernel: a shuffle window ten times larger than its memory cap
//! spills to disk and stays within the cap plus a stated overhead over the same job without
//! the shuffle; the Parquet source's row groups in flight stay within `prefetch_bytes`, and a
//! local one never holds its whole column chunks; a JSON Kafka backlog stays within the Kafka
//! source's byte bounds.
//!
//! This is its own test binary on purpose, and its tests take turns (`ONE_AT_A_TIME`): tests
//! that start `sluice` processes of their own change each other's thread timing on a 2-core
//! machine, and with it how much freed memory the allocator's per-thread heaps hold at the
//! peak. Peaks are each child's own `VmHWM` (see [`peaks`]). (Measured on the development
//! machine: the no-shuffle job peaks at 147–149 MiB; the shuffle adds 20–22 MiB.)
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;

use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray, FixedSizeListArray, Float32Array, Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Int64Type};
#[cfg(feature = "kafka")]
use common::kafka;
use common::*;

const MIB: u64 = 1024 * 1024;

static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs `sluice <command> job.yaml --summary-json summary.json` in `dir` three times with
/// `yaml`; returns the last output and summary, and the three peaks. A peak is the child's
/// own `VmHWM` (the kernel's high-water mark of its address space, from the summary):
/// `wait4`'s `ru_maxrss` of a spawned program starts at the RSS of the process that spawned
/// it, this test binary's ~160 MiB with libtorch loaded, which hid everything below it.
fn peaks_of(
    dir: &Path,
    yaml: &str,
    command: &[&str],
) -> (std::process::Output, serde_json::Value, Vec<u64>) {
    std::fs::write(dir.join("job.yaml"), yaml).unwrap();
    let mut peaks = Vec::new();
    let mut last = None;
    for _ in 0..3 {
        let _ = std::fs::remove_file(dir.join("out.parquet"));
        let out = std::process::Command::new(assert_cmd::cargo::cargo_bin!("sluice"))
            .args(command)
            .args(["job.yaml", "--summary-json", "summary.json"])
            .current_dir(dir)
            .env_remove("RUST_LOG")
            // mimalloc returns freed pages at once, so RSS tracks live memory rather than
            // the allocator's reuse cache (which depends on timing).
            .env("MIMALLOC_PURGE_DELAY", "0")
            .output()
            .unwrap();
        assert_ok(&out);
        let summary: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("summary.json")).unwrap()).unwrap();
        peaks.push(summary["peak_rss_bytes"].as_u64().unwrap());
        last = Some((out, summary));
    }
    let (out, summary) = last.unwrap();
    (out, summary, peaks)
}

/// [`peaks_of`] `sluice run --no-report`.
fn peaks(dir: &Path, yaml: &str) -> (std::process::Output, Vec<u64>) {
    let (out, _, peaks) = peaks_of(dir, yaml, &["run", "--no-report"]);
    (out, peaks)
}

/// A batch of `ids` as `name` (int64) and `x`: 256 float32 per row from `value(id, k)`.
fn rows_of_256_floats(
    name: &str,
    ids: std::ops::Range<i64>,
    int: impl Fn(i64) -> i64,
    value: impl Fn(i64, i64) -> f32,
) -> RecordBatch {
    let values = Float32Array::from_iter_values(
        ids.clone()
            .flat_map(|i| (0..256).map(move |k| (i, k)))
            .map(|(i, k)| value(i, k)),
    );
    let x = FixedSizeListArray::try_new(
        Arc::new(Field::new("item", DataType::Float32, false)),
        256,
        Arc::new(values),
        None,
    )
    .unwrap();
    RecordBatch::try_from_iter([
        (
            name,
            Arc::new(Int64Array::from_iter_values(ids.map(int))) as ArrayRef,
        ),
        ("x", Arc::new(x) as ArrayRef),
    ])
    .unwrap()
}

/// The least of a job's peaks (the runs without timing noise on top).
fn least(v: &[u64]) -> u64 {
    *v.iter().min().unwrap()
}

fn mib(v: &[u64]) -> String {
    v.iter()
        .map(|b| format!("{:.1}", *b as f64 / MIB as f64))
        .collect::<Vec<_>>()
        .join(", ")
}

#[test]
fn a_window_ten_times_its_memory_cap_spills_and_stays_within_the_cap() {
    let dir = tempfile::tempdir().unwrap();
    // 160,000 rows × ~1 KiB = ~160 MiB of Arrow data; the window holds all of them, its
    // memory cap is 16 MiB.
    dataset(&dir.path().join("data"), 8, 20_000, 1024);
    let cap_mib = 16;
    let job = |stage: &str| {
        format!(
            "source: {{type: parquet, path: data/*.parquet, batch_rows: 1000, prefetch: 2}}\n\
             stages:\n\
             {stage}\
             - {{type: select, columns: [id]}}\n\
             sink: {{type: parquet, path: out.parquet}}\n\
             runtime: {{threads: 2, queue_bytes: 2 MiB}}\n"
        )
    };
    // Each job runs three times; the least peak of each is compared. A shuffle that held
    // its window in memory would add ~150 MiB to every run, so taking the least removes
    // timing noise, not the failure this test is for.
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let run = |yaml: String| peaks(dir.path(), &yaml);
    // The same job without a shuffle first: the process's own footprint (binary and
    // libtorch mapped, allocator, queues, Parquet reader and writer).
    let (_, baseline) = run(job(""));
    let (out, shuffled) = run(job(&format!(
        "- {{type: shuffle, buffer_rows: 160000, max_memory: {cap_mib} MiB, seed: 3, batch_rows: 1000}}\n"
    )));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("spilled"),
        "the window must have spilled:\n{stdout}"
    );
    let mut ids: Vec<i64> = read_parquet(&dir.path().join("out.parquet"))
        .iter()
        .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
        .collect();
    let first: Vec<i64> = ids.iter().take(1000).copied().collect();
    assert!(
        first.iter().any(|i| *i >= 80_000) && first.iter().any(|i| *i < 80_000),
        "the first output rows come from all over the window"
    );
    ids.sort_unstable();
    assert_eq!(
        ids,
        (0..160_000).collect::<Vec<_>>(),
        "every row exactly once"
    );
    // The shuffle's own memory: its cap plus 32 MiB (merge chunks — about half the cap —,
    // output batches in flight, allocator slack).
    let extra = least(&shuffled).saturating_sub(least(&baseline));
    eprintln!(
        "peak RSS (MiB) with the shuffle: {}; without: {}; the shuffle added {:.1} MiB (least \
         of each) with a {cap_mib} MiB cap over ~160 MiB of rows",
        mib(&shuffled),
        mib(&baseline),
        extra as f64 / MIB as f64
    );
    assert!(
        extra < (cap_mib + 32) * MIB,
        "the shuffle added {} MiB of RSS; its cap is {cap_mib} MiB (peaks with: {}; without: {})",
        extra / MIB,
        mib(&shuffled),
        mib(&baseline)
    );
}

/// Four row groups of ~40 MiB (fetched, and as much decoded): with `prefetch: 4` and a budget
/// that fits them all, all four are read ahead at once; with a 32 MiB budget they are read
/// one at a time. A local row group in flight holds the pages being decoded and the decoded
/// chunks (decoding hands rows over 8 MiB at a time), never the whole row group, fetched or
/// decoded.
#[test]
fn large_row_groups_are_read_ahead_within_prefetch_bytes() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let rows = 160_000usize;
    // One small file written here (1,000 rows of 256 float32), repeated 160 times by a
    // `sluice` process with noise added, so that no value repeats and the large file's
    // pages are plain, as large as the rows.
    let rb = rows_of_256_floats("id", 0..1_000, |i| i, |i, k| (i * 256 + k) as f32);
    write_parquet(&dir.path().join("small.parquet"), &[rb], 1_000);
    std::fs::write(
        dir.path().join("expand.yaml"),
        "source: {type: parquet, path: small.parquet, epochs: 160}\n\
         stages:\n- {type: gaussian_noise, columns: [x], std: 1.0, seed: 1}\n\
         sink: {type: parquet, path: data.parquet, row_group_size: 40000, compression: none}\n",
    )
    .unwrap();
    assert_ok(&run_in_for(
        dir.path(),
        &["run", "expand.yaml", "--no-report"],
        std::time::Duration::from_secs(120),
    ));
    let job = |file: &str, budget: &str| {
        format!(
            "source: {{type: parquet, path: {file}, batch_rows: 1000, prefetch: 4, prefetch_bytes: {budget}}}\n\
             stages:\n\
             - {{type: select, columns: [id]}}\n\
             sink: {{type: parquet, path: out.parquet}}\n\
             runtime: {{threads: 2, queue_bytes: 2 MiB}}\n"
        )
    };
    // The process's own footprint: the same job over one small row group.
    let (_, base) = peaks(dir.path(), &job("small.parquet", "32 MiB"));
    let (out, bounded) = peaks(dir.path(), &job("data.parquet", "32 MiB"));
    let (_, ahead) = peaks(dir.path(), &job("data.parquet", "1 GiB"));
    assert_eq!(
        read_parquet(&dir.path().join("out.parquet"))
            .iter()
            .map(|b| b.num_rows())
            .sum::<usize>(),
        rows,
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    eprintln!(
        "peak RSS (MiB): footprint {}; 40 MiB row groups within 32 MiB: {}; within 1 GiB: {}",
        mib(&base),
        mib(&bounded),
        mib(&ahead)
    );
    // One row group: its pages as they are decoded, at most 16 MiB decoded at a time —
    // less than the 40 MiB of the row group. (Measured: 16 MiB one at a time; four ahead
    // 60 MiB more. When local row groups were fetched whole: ~53 and ~175 more.)
    let (base, bounded, ahead) = (least(&base), least(&bounded), least(&ahead));
    assert!(
        bounded.saturating_sub(base) < 36 * MIB,
        "one row group at a time added {} MiB",
        (bounded - base) / MIB
    );
    assert!(
        ahead.saturating_sub(bounded) > 30 * MIB,
        "reading all four ahead should take far more memory than one: {} vs {} MiB",
        ahead / MIB,
        bounded / MIB
    );
}

/// `across_ranks` with windows ten times the memory cap, under `sluice train` (2 workers:
/// ranks as threads of one process, exchanging rows through the local collective): each
/// rank's window spills, goes out in rounds of a quarter of the cap, and what it receives
/// spills again; every row is trained exactly once and the two shuffles together stay
/// within twice their cap plus a stated overhead over the same job without them.
#[cfg(feature = "torch")]
#[test]
fn across_ranks_windows_ten_times_their_memory_cap_spill_and_stay_within_it() {
    let dir = tempfile::tempdir().unwrap();
    // 160,000 rows of 256 float32 (1 KiB) and a label: each rank's window holds its whole
    // share, ~80 MiB of Arrow data, with a 16 MiB cap.
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    for f in 0..8i64 {
        let rb = rows_of_256_floats(
            "label",
            f * 20_000..(f + 1) * 20_000,
            |i| i % 10,
            |i, k| ((i * 31 + k) % 97) as f32 / 97.0,
        );
        write_parquet(&data.join(format!("part-{f}.parquet")), &[rb], 1000);
    }
    let cap_mib = 16;
    let job = |stage: &str| {
        format!(
            "source: {{type: parquet, path: data/*.parquet, batch_rows: 1000, prefetch: 2}}\n\
             stages:\n\
             {stage}\
             - {{type: batch, size: 1000}}\n\
             runtime: {{threads: 2, queue_bytes: 2 MiB}}\n\
             loader:\n  tensors:\n    x: {{column: x, dtype: f32}}\n    y: {{column: label, dtype: i64}}\n\
             trainer:\n  model: {{type: mlp, hidden: [8], outputs: 10}}\n\
             \x20 optimizer: {{type: sgd, lr: 0.01}}\n  epochs: 1\n  allreduce: {{workers: 2}}\n"
        )
    };
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let train = |yaml: String| peaks_of(dir.path(), &yaml, &["train"]);
    let (_, _, baseline) = train(job(""));
    let (out, summary, shuffled) = train(job(&format!(
        "- {{type: shuffle, buffer_rows: 80000, max_memory: {cap_mib} MiB, seed: 3, across_ranks: true}}\n"
    )));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("spilled"),
        "the windows must have spilled:\n{stdout}"
    );
    // 80,000 rows a rank: every row trained, none left over.
    assert_eq!(summary["rows_trained"], 160_000, "{summary}");
    assert_eq!(summary["rows_untrained"], 0, "{summary}");
    let extra = least(&shuffled).saturating_sub(least(&baseline));
    eprintln!(
        "peak RSS (MiB) with two across-ranks shuffles: {}; without: {}; they added {:.1} MiB \
         (least of each) with a {cap_mib} MiB cap each over ~80 MiB of rows each",
        mib(&shuffled),
        mib(&baseline),
        extra as f64 / MIB as f64
    );
    assert!(
        extra < 2 * (cap_mib + 32) * MIB,
        "the shuffles added {} MiB of RSS; their cap is {cap_mib} MiB each (peaks with: {}; without: {})",
        extra / MIB,
        mib(&shuffled),
        mib(&baseline)
    );
}

/// A backlog of ~2 KB JSON records (40,000 of them, ~92 MB over 4 partitions) read with a
/// prefetch budget of 4 MiB per partition: the Kafka source adds at most its byte bounds —
/// the prefetch (4 × 4 MiB), the raw chunks cut for the decoder (at most 8 MiB each: two
/// queued and one being cut; each of the two decoding threads holds one and the JSON
/// decoder's tape of about as many bytes) — plus 48 MiB (librdkafka's fetch buffers and
/// bookkeeping, the decoded batches, allocator slack) over the same rows read from Parquet.
/// (Before the chunks were bounded in bytes, such a backlog peaked at 0.8–0.9 GB. Measured on
/// the development machine: +102 to +105 MiB, within a bound of 120.)
#[cfg(feature = "kafka")]
#[test]
fn a_json_kafka_backlog_stays_within_its_byte_bounds() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let n = 40_000i64;
    let value = |i: i64, k: i64| ((i * 256 + k) % 1000) as f32 * 0.001 + 0.123_456;
    let rb = rows_of_256_floats("id", 0..n, |i| i, value);
    write_parquet(&dir.path().join("rows.parquet"), &[rb], 5_000);
    let topic = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let t = kafka::create_topic("memory-json", 4).await;
        let records = (0..n).map(|i| {
            let x: Vec<String> = (0..256).map(|k| format!("{:.6}", value(i, k))).collect();
            let json = format!(r#"{{"id": {i}, "x": [{}]}}"#, x.join(", "));
            ((i % 4) as i32, json.into_bytes())
        });
        assert_eq!(kafka::produce(&t, records).await, n as usize);
        t
    });
    let tail = "stages:\n- {type: select, columns: [id]}\n\
                sink: {type: parquet, path: out.parquet}\n\
                runtime: {threads: 2, queue_bytes: 2 MiB}\n";
    let (_, baseline) = peaks(
        dir.path(),
        &format!("source: {{type: parquet, path: rows.parquet, batch_rows: 4000}}\n{tail}"),
    );
    let prefetch_kib: u64 = 4096;
    let (out, kafka_peaks) = peaks(
        dir.path(),
        &format!(
            "source:\n  type: kafka\n  brokers: {}\n  topic: {topic}\n  format: json\n  \
             schema: {{id: int64, x: \"float32[256]\"}}\n  until: end\n  batch_timeout: 5s\n  \
             properties: {{queued.max.messages.kbytes: {prefetch_kib}, fetch.queue.backoff.ms: 10}}\n{tail}",
            kafka::brokers()
        ),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut ids: Vec<i64> = read_parquet(&dir.path().join("out.parquet"))
        .iter()
        .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
        .collect();
    ids.sort_unstable();
    assert_eq!(
        ids,
        (0..n).collect::<Vec<_>>(),
        "every record once:\n{stdout}"
    );
    let prefetch = 4 * prefetch_kib * 1024;
    let chunks = (2 + 1 + 2 * 2) * 8 * MIB;
    let bound = prefetch + chunks + 48 * MIB;
    let extra = least(&kafka_peaks).saturating_sub(least(&baseline));
    eprintln!(
        "peak RSS (MiB) reading ~92 MB of 2 KB JSON records from Kafka: {}; the same rows from \
         Parquet: {}; Kafka added {:.1} MiB (bound {} MiB)",
        mib(&kafka_peaks),
        mib(&baseline),
        extra as f64 / MIB as f64,
        bound / MIB
    );
    assert!(
        extra < bound,
        "the Kafka source added {} MiB of RSS; its byte bounds allow {} MiB (peaks: {}; from Parquet: {})",
        extra / MIB,
        bound / MIB,
        mib(&kafka_peaks),
        mib(&baseline)
    );
}
