//! `sluice run` with a shuffled, augmented (noise, dropout, mixup) Parquet pipeline: exact
//! resume in a fresh process after SIGKILL, and the warning for a tiny window. (The spilling
//! window's memory is measured alone, in tests/shuffle_memory.rs.)
#![allow(clippy::unwrap_used)]

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::*;

fn run_in(dir: &Path, args: &[&str]) -> std::process::Output {
    run_in_for(dir, args, Duration::from_secs(300))
}

fn job(epochs: u64, out: &str) -> String {
    format!(
        "source: {{type: parquet, path: data/*.parquet, columns: [id, x], batch_rows: 300, epochs: {epochs}}}\n\
         stages:\n\
         - {{type: gaussian_noise, columns: [x], std: 1.0, seed: 5}}\n\
         - {{type: shuffle, buffer_rows: 5000, seed: 9, batch_rows: 256}}\n\
         - {{type: feature_dropout, columns: [x], p: 0.2, seed: 6}}\n\
         - {{type: batch, size: 100}}\n\
         - {{type: mixup, columns: [x], alpha: 0.4, seed: 7}}\n\
         checkpoint: {{path: state/cp.json, interval: 1h, every_batches: 1}}\n\
         sink: {{type: parquet, path: {out}, max_rows_per_file: 2000}}\n\
         runtime: {{threads: 2}}\n"
    )
}

#[test]
fn shuffled_run_killed_and_resumed_in_a_fresh_process_continues_exactly() {
    let dir = tempfile::tempdir().unwrap();
    dataset(&dir.path().join("data"), 4, 10_000, 8);
    // The uninterrupted reference: 4 epochs (its first 3 are what a 3-epoch run writes).
    let reference_dir = tempfile::tempdir().unwrap();
    dataset(&reference_dir.path().join("data"), 4, 10_000, 8);
    std::fs::write(reference_dir.path().join("job.yaml"), job(4, "out")).unwrap();
    assert_ok(&run_in(reference_dir.path(), &["run", "job.yaml"]));
    let four = parts_in_order(&reference_dir.path().join("out"));
    assert_eq!(four.len(), 160_000);
    let reference = &four[..120_000];

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

    // A resume under another shuffle seed would continue at other rows: refused, saying
    // what changed, and the checkpoint is left as it was.
    std::fs::write(
        dir.path().join("job.yaml"),
        job(3, "out").replace("seed: 9", "seed: 10"),
    )
    .unwrap();
    let out = run_in(dir.path(), &["run", "job.yaml", "--resume"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("state/cp.json: cannot resume from it: ")
            && stderr.contains("stages[1] (shuffle): seed 9 then, seed 10 now"),
        "{stderr}"
    );
    assert_eq!(read_cp().unwrap(), at_kill);

    // Run 2: a fresh process, 3 epochs (an epoch count may change), resumed. It commits
    // only at its end, into one part file (checkpoint and part settings may change too):
    // that part is still open when the run ends, so the finished run's checkpoint must
    // number the next part past it.
    let once = job(3, "out")
        .replace("every_batches: 1}", "every_batches: 1000000}")
        .replace("max_rows_per_file: 2000", "max_rows_per_file: 1000000000");
    std::fs::write(dir.path().join("job.yaml"), &once).unwrap();
    let out = run_in(
        dir.path(),
        &["run", "job.yaml", "--resume", "--summary-json", "s.json"],
    );
    assert_ok(&out);
    let resumed = parts_in_order(&dir.path().join("out"));
    eprintln!(
        "killed with {covered} rows checkpointed; resumed to {}",
        resumed.len()
    );
    assert_eq!(resumed.len(), reference.len());
    assert!(
        resumed == reference,
        "the resumed run's rows (order, noise, dropout, mixup) differ from the uninterrupted run"
    );
    // Its summary adds up: every row read is either written now or was delivered before the
    // checkpoint and read again to rebuild the position (the rest of the shuffle window).
    let s: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("s.json")).unwrap()).unwrap();
    let n = |v: &serde_json::Value| v.as_u64().unwrap();
    let r = &s["resumed"];
    assert_eq!(n(&r["rows_before"]), covered, "{s}");
    assert_eq!(n(&r["rows_before"]) + n(&s["rows_written"]), 120_000, "{s}");
    assert_eq!(
        n(&s["rows_read"]),
        n(&r["rows_reread"]) + n(&s["rows_written"]),
        "{s}"
    );
    let shuffle = &s["stages"][1];
    assert_eq!(
        n(&shuffle["rows_in"]),
        n(&shuffle["rows_out"]) + n(&shuffle["rows_replayed"]),
        "{s}"
    );
    // Its steps on the CPU pool are its busy time, weighed against the other stages'.
    assert!(shuffle["busy_seconds"].as_f64().unwrap() > 0.0, "{s}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!(
            "resumed  from file://{}: {covered} rows written before this run, 120000 in all",
            dir.path().join("state/cp.json").display()
        )),
        "{stdout}"
    );

    // Run 3: resuming the finished run has nothing to do, and leaves the output alone.
    let out = run_in(dir.path(), &["run", "job.yaml", "--resume"]);
    assert_ok(&out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(": already complete")
            && stdout.contains("records a finished run: 120000 rows written"),
        "{stdout}"
    );
    assert!(parts_in_order(&dir.path().join("out")) == reference);

    // Run 4: with `epochs: 4` the finished run goes on, and its 4th epoch is the one an
    // uninterrupted 4-epoch run writes (the part after the last one is numbered past it).
    std::fs::write(dir.path().join("job.yaml"), job(4, "out")).unwrap();
    assert_ok(&run_in(dir.path(), &["run", "job.yaml", "--resume"]));
    let longer = parts_in_order(&dir.path().join("out"));
    assert_eq!(longer.len(), four.len());
    assert!(
        longer == four,
        "the 4th epoch after a finished 3-epoch run differs from an uninterrupted 4-epoch run's"
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
