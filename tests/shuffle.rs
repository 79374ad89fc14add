//! `sluice run` with a shuffled, augmented Parquet pipeline: exact resume in a fresh process
//! after SIGKILL, and a shuffle window far larger than its memory cap (spilling) with peak
//! RSS measured by the kernel.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use arrow::array::{AsArray, FixedSizeBinaryArray, Float32Array, Int64Array, RecordBatch};
use arrow::datatypes::{Float32Type, Int64Type};
use common::*;

fn run_in(dir: &Path, args: &[&str]) -> std::process::Output {
    run_in_for(dir, args, Duration::from_secs(300))
}

/// `files` files of `rows` rows each (row groups of 1,000): id, x = id, and `blob_bytes`
/// bytes per row.
fn dataset(dir: &Path, files: usize, rows: usize, blob_bytes: usize) {
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

/// (id, x bits) of every row of the part files under `dir`, in part order.
fn parts_in_order(dir: &Path) -> Vec<(i64, u32)> {
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy().to_string();
            n.starts_with("part-") && n.ends_with(".parquet")
        })
        .collect();
    names.sort();
    let mut out = Vec::new();
    for p in names {
        for b in read_parquet(&p) {
            let id = b.column_by_name("id").unwrap().as_primitive::<Int64Type>();
            let x = b.column_by_name("x").unwrap().as_primitive::<Float32Type>();
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

fn job(epochs: u64, out: &str) -> String {
    format!(
        "source: {{type: parquet, path: data/*.parquet, columns: [id, x], batch_rows: 300, epochs: {epochs}}}\n\
         stages:\n\
         - {{type: gaussian_noise, columns: [x], std: 1.0, seed: 5}}\n\
         - {{type: shuffle, buffer_rows: 5000, seed: 9, batch_rows: 256}}\n\
         - {{type: feature_dropout, columns: [x], p: 0.2, seed: 6}}\n\
         - {{type: batch, size: 100}}\n\
         checkpoint: {{path: state/cp.json, interval: 1h, every_batches: 1}}\n\
         sink: {{type: parquet, path: {out}, max_rows_per_file: 2000}}\n\
         runtime: {{threads: 2}}\n"
    )
}

#[test]
fn shuffled_run_killed_and_resumed_in_a_fresh_process_continues_exactly() {
    let dir = tempfile::tempdir().unwrap();
    dataset(&dir.path().join("data"), 4, 10_000, 8);
    // The uninterrupted reference: 3 epochs.
    let reference_dir = tempfile::tempdir().unwrap();
    dataset(&reference_dir.path().join("data"), 4, 10_000, 8);
    std::fs::write(reference_dir.path().join("job.yaml"), job(3, "out")).unwrap();
    assert_ok(&run_in(reference_dir.path(), &["run", "job.yaml"]));
    let reference = parts_in_order(&reference_dir.path().join("out"));
    assert_eq!(reference.len(), 120_000);

    // Run 1 is long (1000 epochs): it is surely running when killed, once its checkpoint
    // covers some rows and a part file exists past it.
    std::fs::write(dir.path().join("job.yaml"), job(1000, "out")).unwrap();
    let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin!("sluice"))
        .args(["run", "job.yaml"])
        .current_dir(dir.path())
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let cp = dir.path().join("state/cp.json");
    let read_cp =
        || -> Option<serde_json::Value> { serde_json::from_slice(&std::fs::read(&cp).ok()?).ok() };
    wait_for(
        "a checkpoint inside the first epochs",
        Duration::from_secs(120),
        || read_cp().filter(|c| c["rows_written"].as_u64() > Some(8_000)),
    );
    assert!(child.try_wait().unwrap().is_none(), "run 1 ended early");
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let at_kill = read_cp().unwrap();
    let covered = at_kill["rows_written"].as_u64().unwrap();
    assert!(
        covered < 120_000,
        "killed after 3 epochs ({covered} rows): the machine was too fast for this test's window"
    );
    assert!(
        at_kill["source"]["parquet"]["shuffle"].is_object(),
        "{at_kill}"
    );

    // Run 2: a fresh process, 3 epochs, resumed.
    std::fs::write(dir.path().join("job.yaml"), job(3, "out")).unwrap();
    assert_ok(&run_in(dir.path(), &["run", "job.yaml", "--resume"]));
    let resumed = parts_in_order(&dir.path().join("out"));
    eprintln!(
        "killed with {covered} rows checkpointed; resumed to {}",
        resumed.len()
    );
    assert_eq!(resumed.len(), reference.len());
    assert!(
        resumed == reference,
        "the resumed run's rows (order, noise, dropout) differ from the uninterrupted run"
    );
}

/// Runs `cmd` to completion and returns its output with *its own* peak RSS in bytes (Linux
/// reports KiB): the kernel's figure for this one child (`wait4`), not one the program reports
/// about itself — and not `RUSAGE_CHILDREN`, which would also count the children that other
/// tests of this binary run at the same time.
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
    let run = |yaml: String| {
        std::fs::write(dir.path().join("job.yaml"), yaml).unwrap();
        let _ = std::fs::remove_file(dir.path().join("out.parquet"));
        let mut cmd = std::process::Command::new(assert_cmd::cargo::cargo_bin!("sluice"));
        cmd.args(["run", "job.yaml"])
            .current_dir(dir.path())
            .env_remove("RUST_LOG")
            // mimalloc returns freed pages at once, so RSS tracks live memory rather than
            // the allocator's reuse cache (which depends on timing).
            .env("MIMALLOC_PURGE_DELAY", "0");
        run_with_peak_rss(cmd, dir.path())
    };
    // The same job without a shuffle first: the process's own footprint (binary, allocator,
    // queues, Parquet reader and writer).
    let (out, baseline) = run(job(""));
    assert_ok(&out);
    let (out, rss) = run(job(&format!(
        "- {{type: shuffle, buffer_rows: 160000, max_memory: {cap_mib} MiB, seed: 3, batch_rows: 1000}}\n"
    )));
    assert_ok(&out);
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
    let extra = rss.saturating_sub(baseline);
    eprintln!(
        "peak RSS {:.1} MiB, {:.1} MiB without the shuffle: the shuffle added {:.1} MiB with a {cap_mib} MiB cap over ~160 MiB of rows",
        rss as f64 / 1048576.0,
        baseline as f64 / 1048576.0,
        extra as f64 / 1048576.0
    );
    assert!(
        extra < (cap_mib + 32) * 1024 * 1024,
        "the shuffle added {} MiB of RSS; its cap is {cap_mib} MiB",
        extra / 1048576
    );
}

#[test]
fn run_warns_when_the_shuffle_window_is_tiny() {
    let dir = tempfile::tempdir().unwrap();
    let digits = repo().join("data/digits/train.parquet");
    let run = |buffer_rows: usize| {
        std::fs::write(
            dir.path().join("job.yaml"),
            format!(
                "source: {{type: parquet, path: '{}'}}\nstages:\n- {{type: shuffle, buffer_rows: {buffer_rows}}}\nsink: {{type: null}}\n",
                digits.display()
            ),
        )
        .unwrap();
        let out = run_in(dir.path(), &["run", "job.yaml"]);
        assert_ok(&out);
        out
    };
    let out = run(10);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("the shuffle window (10 rows) is under 1% of an epoch (1437 rows)"),
        "{stderr}"
    );
    // A window of 10% of the epoch draws no warning.
    let out = run(150);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("under 1%"));
}
