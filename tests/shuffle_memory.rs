//! A shuffle window ten times larger than its memory cap spills to disk, and the process's
//! peak RSS — measured by the kernel — stays within the cap plus a stated overhead over the
//! same job without the shuffle.
//!
//! This is its own test binary on purpose: the tests of one binary run concurrently, and
//! sibling tests that start `sluice` processes of their own change this one's thread timing
//! on a 2-core machine, and with it how much freed memory the allocator's per-thread heaps
//! hold at the peak. (Measured on the development machine: alone, the no-shuffle job peaks
//! at 184–188 MiB over five runs; beside tests/shuffle.rs's kill-and-resume test, 191–227 MiB.)
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;

use arrow::array::AsArray;
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
    let run = |yaml: String| {
        std::fs::write(dir.path().join("job.yaml"), yaml).unwrap();
        let mut peaks = Vec::new();
        let mut last = None;
        for _ in 0..3 {
            let _ = std::fs::remove_file(dir.path().join("out.parquet"));
            let mut cmd = std::process::Command::new(assert_cmd::cargo::cargo_bin!("sluice"));
            cmd.args(["run", "job.yaml", "--no-report"])
                .current_dir(dir.path())
                .env_remove("RUST_LOG")
                // mimalloc returns freed pages at once, so RSS tracks live memory rather
                // than the allocator's reuse cache (which depends on timing).
                .env("MIMALLOC_PURGE_DELAY", "0");
            let (out, rss) = run_with_peak_rss(cmd, dir.path());
            assert_ok(&out);
            peaks.push(rss);
            last = Some(out);
        }
        (last.unwrap(), peaks)
    };
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
    let mib = |v: &[u64]| {
        v.iter()
            .map(|b| format!("{:.1}", *b as f64 / MIB as f64))
            .collect::<Vec<_>>()
            .join(", ")
    };
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
