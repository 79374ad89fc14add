//! Peak RSS, measured by the kernel: a shuffle window ten times larger than its memory cap
//! spills to disk and stays within the cap plus a stated overhead over the same job without
//! the shuffle; the Parquet source's row groups in flight stay within `prefetch_bytes`.
//!
//! This is its own test binary on purpose, and its tests take turns (`ONE_AT_A_TIME`): tests
//! that start `sluice` processes of their own change each other's thread timing on a 2-core
//! machine, and with it how much freed memory the allocator's per-thread heaps hold at the
//! peak. (Measured on the development machine: alone, the no-shuffle job peaks
//! at 184–188 MiB over five runs; beside tests/shuffle.rs's kill-and-resume test, 191–227 MiB.)
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;

use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray, FixedSizeBinaryArray, Int64Array, RecordBatch};
use arrow::datatypes::Int64Type;
use common::*;

/// Runs `cmd` to completion and returns its output with *its own* peak RSS in bytes (Linux
/// reports KiB): the kernel's figure for this one child (`wait4`), not one the program reports
/// about itself — and not `RUSAGE_CHILDREN`, which would count every child this test binary
/// ever reaped.
#[allow(unsafe_code)]
fn run_with_peak_rss(mut cmd: std::process::Command, dir: &Path) -> (std::process::Output, u64) {
    use std::os::unix::process::ExitStatusExt;
    let (out_path, err_path) = (dir.join("child.stdout"), dir.join("child.stderr"));
    let child = cmd
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .unwrap();
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: reaps our own child (std never waits on it: `child` is only dropped, which
    // neither waits nor kills); `status` and `usage` are ours to fill.
    let rc = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(rc, pid, "wait4: {}", std::io::Error::last_os_error());
    drop(child);
    let output = std::process::Output {
        status: std::process::ExitStatus::from_raw(status),
        stdout: std::fs::read(&out_path).unwrap(),
        stderr: std::fs::read(&err_path).unwrap(),
    };
    (output, usage.ru_maxrss as u64 * 1024)
}

const MIB: u64 = 1024 * 1024;

static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs `sluice run job.yaml` in `dir` three times with `yaml`; returns the last output and
/// the three peaks.
fn peaks(dir: &Path, yaml: &str) -> (std::process::Output, Vec<u64>) {
    std::fs::write(dir.join("job.yaml"), yaml).unwrap();
    let mut peaks = Vec::new();
    let mut last = None;
    for _ in 0..3 {
        let _ = std::fs::remove_file(dir.join("out.parquet"));
        let mut cmd = std::process::Command::new(assert_cmd::cargo::cargo_bin!("sluice"));
        cmd.args(["run", "job.yaml", "--no-report"])
            .current_dir(dir)
            .env_remove("RUST_LOG")
            // mimalloc returns freed pages at once, so RSS tracks live memory rather than
            // the allocator's reuse cache (which depends on timing).
            .env("MIMALLOC_PURGE_DELAY", "0");
        let (out, rss) = run_with_peak_rss(cmd, dir);
        assert_ok(&out);
        peaks.push(rss);
        last = Some(out);
    }
    (last.unwrap(), peaks)
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
    let (base, rss) = (
        *baseline.iter().min().unwrap(),
        *shuffled.iter().min().unwrap(),
    );
    let extra = rss.saturating_sub(base);
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

/// Row groups that decode to ~40 MiB, four of them: with `prefetch: 4` and a budget that fits
/// them all, all four are read ahead at once; with a 32 MiB budget they are read one at a
/// time, and the process holds about one row group beyond its footprint.
#[test]
fn large_row_groups_are_read_ahead_within_prefetch_bytes() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let rows = 160_000usize;
    // One small file written here (1,000 rows of 1 KiB); the large one is written by a
    // `sluice` process repeating it 160 times, so this process stays small: a child's peak
    // RSS as the kernel reports it starts at its parent's RSS.
    let mut x = 0x5eed_u64;
    let bytes: Vec<u8> = (0..1_000 * 1024 / 8)
        .flat_map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            x.to_le_bytes()
        })
        .collect();
    let rb = RecordBatch::try_from_iter([
        (
            "id",
            Arc::new(Int64Array::from_iter_values(0..1_000)) as ArrayRef,
        ),
        (
            "blob",
            Arc::new(FixedSizeBinaryArray::try_from_iter(bytes.chunks(1024)).unwrap()) as ArrayRef,
        ),
    ])
    .unwrap();
    write_parquet(&dir.path().join("small.parquet"), &[rb], 1_000);
    std::fs::write(
        dir.path().join("expand.yaml"),
        "source: {type: parquet, path: small.parquet, epochs: 160}\n\
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
    let least = |v: &[u64]| *v.iter().min().unwrap();
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
    // One row group is ~40 MiB fetched and ~40 MiB decoded.
    let (base, bounded, ahead) = (least(&base), least(&bounded), least(&ahead));
    assert!(
        bounded.saturating_sub(base) < 130 * MIB,
        "one row group at a time added {} MiB",
        (bounded - base) / MIB
    );
    assert!(
        ahead.saturating_sub(bounded) > 80 * MIB,
        "reading all four ahead should take far more memory than one: {} vs {} MiB",
        ahead / MIB,
        bounded / MIB
    );
}
