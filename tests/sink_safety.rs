//! Sinks never harm what they do not own: a sink over its own source's inputs is refused
//! before anything is read, nothing but a regular file is ever replaced, and one run at a time
//! writes a given output. Every data-loss case checks the inputs byte for byte afterwards.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::collections::BTreeMap;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;

const LIMIT: Duration = Duration::from_secs(120);

fn digits() -> PathBuf {
    repo().join("data/digits/train.parquet")
}

/// Every file under `dir` with its bytes.
fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    files_under(dir)
        .into_iter()
        .map(|f| {
            let bytes = std::fs::read(dir.join(&f)).unwrap();
            (f, bytes)
        })
        .collect()
}

/// Runs `sluice run p.yaml` in `dir`, expects exit 1 and returns stderr.
fn refused(dir: &Path, yaml: &str) -> String {
    std::fs::write(dir.join("p.yaml"), yaml).unwrap();
    let out = run_in_for(dir, &["run", "p.yaml", "--no-report"], LIMIT);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}

/// Two copies of the digits as part files in `dir/b`.
fn parts_dir(dir: &Path) -> PathBuf {
    let b = dir.join("b");
    std::fs::create_dir(&b).unwrap();
    for n in 0..2 {
        std::fs::copy(digits(), b.join(format!("part-{n:05}.parquet"))).unwrap();
    }
    b
}

#[test]
fn a_parts_directory_holding_the_inputs_is_refused_before_anything_is_deleted() {
    let t = tempfile::tempdir().unwrap();
    let b = parts_dir(t.path());
    let before = snapshot(&b);
    let err = refused(
        t.path(),
        "source: {type: parquet, path: b}\nsink: {type: parquet, path: b, max_rows_per_file: 500, overwrite: true}\n",
    );
    assert!(
        err.contains("`path` entry `b` matches the sink's part files in file:///"),
        "{err}"
    );
    assert_eq!(snapshot(&b), before, "inputs changed");
}

#[test]
fn a_source_that_is_the_sink_file_is_refused() {
    let t = tempfile::tempdir().unwrap();
    std::fs::copy(digits(), t.path().join("d.parquet")).unwrap();
    let before = std::fs::read(t.path().join("d.parquet")).unwrap();
    let err = refused(
        t.path(),
        "source: {type: parquet, path: d.parquet}\nstages: [{type: filter, predicate: label = 1}]\nsink: {type: parquet, path: d.parquet, overwrite: true}\n",
    );
    assert!(
        err.contains("matches the sink's output file file:///"),
        "{err}"
    );
    assert_eq!(std::fs::read(t.path().join("d.parquet")).unwrap(), before);
    assert_eq!(files_under(t.path()), ["d.parquet", "p.yaml"]);
}

#[test]
fn a_glob_that_would_match_the_output_is_refused_even_before_it_exists() {
    let t = tempfile::tempdir().unwrap();
    std::fs::create_dir(t.path().join("data")).unwrap();
    std::fs::copy(digits(), t.path().join("data/a.parquet")).unwrap();
    let err = refused(
        t.path(),
        "source: {type: parquet, path: 'data/*.parquet'}\nsink: {type: parquet, path: data/out.parquet}\n",
    );
    assert!(
        err.contains("`path` entry `data/*.parquet` matches the sink's output file"),
        "{err}"
    );
    assert_eq!(files_under(&t.path().join("data")), ["a.parquet"]);
}

#[test]
fn an_input_reached_through_a_symlink_is_still_the_output() {
    let t = tempfile::tempdir().unwrap();
    std::fs::create_dir(t.path().join("out")).unwrap();
    std::fs::copy(digits(), t.path().join("out/x.parquet")).unwrap();
    std::os::unix::fs::symlink(t.path().join("out/x.parquet"), t.path().join("in.parquet"))
        .unwrap();
    let before = std::fs::read(t.path().join("out/x.parquet")).unwrap();
    let err = refused(
        t.path(),
        "source: {type: parquet, path: in.parquet}\nsink: {type: parquet, path: out/x.parquet, overwrite: true}\n",
    );
    assert!(err.contains("which is the sink's output file"), "{err}");
    assert_eq!(
        std::fs::read(t.path().join("out/x.parquet")).unwrap(),
        before
    );
}

#[test]
fn a_manifest_naming_a_part_file_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let b = parts_dir(t.path());
    let before = snapshot(&b);
    std::fs::write(
        t.path().join("m.json"),
        r#"{"files": [{"path": "b/part-00001.parquet"}]}"#,
    )
    .unwrap();
    let err = refused(
        t.path(),
        "source: {type: parquet, manifest: m.json}\nsink: {type: parquet, path: b, max_rows_per_file: 500, overwrite: true}\n",
    );
    assert!(err.contains("inside the sink's parts directory"), "{err}");
    assert_eq!(snapshot(&b), before);
}

#[test]
fn only_regular_files_are_replaced() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    let source = format!(
        "source: {{type: parquet, path: '{}'}}\n",
        digits().display()
    );
    // A FIFO: replacing it would break whatever reads it.
    let fifo = dir.join("fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let err = refused(
        dir,
        &format!("{source}sink: {{type: parquet, path: fifo, overwrite: true}}\n"),
    );
    assert!(
        err.contains("is a FIFO (named pipe), not a regular file"),
        "{err}"
    );
    assert!(err.contains("`sink: {type: null}`"), "{err}");
    assert!(
        std::fs::symlink_metadata(&fifo)
            .unwrap()
            .file_type()
            .is_fifo()
    );
    // A symlink: the rename would replace the link, not write through it.
    std::fs::write(dir.join("target.parquet"), b"keep me").unwrap();
    std::os::unix::fs::symlink(dir.join("target.parquet"), dir.join("link.parquet")).unwrap();
    let err = refused(
        dir,
        &format!("{source}sink: {{type: arrow_ipc, path: link.parquet, overwrite: true}}\n"),
    );
    assert!(
        err.contains("is a symbolic link, not a regular file"),
        "{err}"
    );
    assert!(
        std::fs::symlink_metadata(dir.join("link.parquet"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(
        std::fs::read(dir.join("target.parquet")).unwrap(),
        b"keep me"
    );
    // A directory, for a one-file sink: nothing staged is left in or beside it.
    std::fs::create_dir(dir.join("outdir")).unwrap();
    let err = refused(
        dir,
        &format!("{source}sink: {{type: parquet, path: outdir, overwrite: true}}\n"),
    );
    assert!(err.contains("is a directory, not a regular file"), "{err}");
    assert!(err.contains("max_rows_per_file"), "{err}");
    assert_eq!(files_under(&dir.join("outdir")), Vec::<String>::new());
    // A file where part files should go.
    std::fs::write(dir.join("plain"), b"x").unwrap();
    let err = refused(
        dir,
        &format!(
            "{source}sink: {{type: parquet, path: plain, max_rows_per_file: 100, overwrite: true}}\n"
        ),
    );
    assert!(err.contains("writes a directory of part files"), "{err}");
    assert_eq!(std::fs::read(dir.join("plain")).unwrap(), b"x");
    let mut left: Vec<_> = files_under(dir);
    left.retain(|f| f.contains('#') || f.contains("sluice.lock"));
    assert_eq!(left, Vec::<String>::new(), "staging or lock files left");
}

#[test]
fn a_character_device_is_never_replaced() {
    // Checked through the guard itself: a test must not be able to replace /dev/null.
    let dev = sluice_pipeline::storage::resolve_output("/dev/null", Path::new("/")).unwrap();
    let err = sluice_sinks::guard::check_replaceable(&dev)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("is a character device, not a regular file"),
        "{err}"
    );
}

fn job(epochs: u64) -> String {
    format!(
        "source: {{type: parquet, path: '{}', columns: [id], epochs: {epochs}}}\nstages: [{{type: batch, size: 100}}]\nsink: {{type: parquet, path: out, max_rows_per_file: 1000, overwrite: true}}\n",
        digits().display()
    )
}

/// (rows, every id seen exactly `epochs` times) of the parts in `dir/out`.
fn output_ids(dir: &Path) -> BTreeMap<i64, usize> {
    let mut ids = BTreeMap::new();
    for f in files_under(&dir.join("out")) {
        assert!(
            f.starts_with("part-") && f.ends_with(".parquet") && !f.contains('#'),
            "unexpected file {f} in the output"
        );
        for id in int64_values(&read_parquet(&dir.join("out").join(&f)), "id") {
            *ids.entry(id).or_insert(0) += 1;
        }
    }
    ids
}

/// Two different runs (6 and 5 epochs) into one parts directory: the output is always wholly
/// one of them, never parts of both.
#[test]
fn two_runs_started_together_never_mix_their_parts() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    std::fs::write(dir.join("a.yaml"), job(6)).unwrap();
    std::fs::write(dir.join("b.yaml"), job(5)).unwrap();
    let mut refusals = 0;
    for round in 0..20 {
        let mut a = spawn_sluice(dir, &["run", "a.yaml", "--no-report", "-q"]);
        let b = run_in_for(dir, &["run", "b.yaml", "--no-report", "-q"], LIMIT);
        let a = a.wait().unwrap();
        let a_err = std::fs::read_to_string(dir.join("stderr.log")).unwrap();
        let b_err = String::from_utf8_lossy(&b.stderr).to_string();
        refusals += race_outcome(round, [(a.code(), a_err), (b.status.code(), b_err)]);
        assert_one_run(round, &output_ids(dir), [6, 5]);
    }
    // Which run wins is timing; that a loser is told so is checked whenever one lost.
    eprintln!("{refusals} of 20 rounds had a run refused by the lock");
}

#[test]
fn a_run_in_progress_keeps_its_output_from_a_second_run() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    // Long enough to still be running when the second run starts; killed at the end.
    std::fs::write(dir.join("p.yaml"), job(100_000)).unwrap();
    for round in 0..5 {
        let mut a = spawn_sluice(dir, &["run", "p.yaml", "--no-report", "-q"]);
        let lock = dir.join("out/.sluice.lock");
        wait_for("the first run's parts", LIMIT, || {
            (files_under(&dir.join("out"))
                .iter()
                .any(|f| f.ends_with(".parquet")))
            .then_some(())
        });
        let before: Vec<_> = files_under(&dir.join("out"));
        assert!(lock.exists());
        let b = run_in_for(dir, &["run", "p.yaml", "--no-report"], LIMIT);
        assert!(a.try_wait().unwrap().is_none(), "the first run ended early");
        let err = String::from_utf8_lossy(&b.stderr);
        assert_eq!(b.status.code(), Some(1), "round {round}: {err}");
        assert!(
            err.contains("another run is writing this output (pid "),
            "{err}"
        );
        let after = files_under(&dir.join("out"));
        for f in before
            .iter()
            .filter(|f| f.starts_with("part-") && !f.contains('#'))
        {
            assert!(
                after.contains(f),
                "round {round}: {f} deleted by the refused run"
            );
        }
        // Killed: the kernel drops the lock with the process.
        a.kill().unwrap();
        a.wait().unwrap();
        std::fs::write(dir.join("short.yaml"), job(1)).unwrap();
        let again = run_in_for(dir, &["run", "short.yaml", "--no-report"], LIMIT);
        assert_ok(&again);
        assert_eq!(output_ids(dir).len(), 1437, "round {round}");
        std::fs::remove_dir_all(dir.join("out")).unwrap();
    }
}

#[test]
fn staging_files_of_a_killed_run_are_removed_by_the_next() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    std::fs::create_dir(dir.join("out")).unwrap();
    // What the local store leaves when a run dies mid-write: `<target>#<n>`.
    for name in ["part-00007.parquet#3", "part-00000.parquet#12"] {
        std::fs::write(dir.join("out").join(name), vec![0u8; 1000]).unwrap();
    }
    std::fs::write(dir.join("out/notes#1"), b"not ours").unwrap();
    std::fs::write(dir.join("one.parquet#4"), vec![0u8; 500]).unwrap();
    std::fs::write(dir.join("p.yaml"), job(1)).unwrap();
    let out = run_in_for(dir, &["run", "p.yaml", "--no-report"], LIMIT);
    assert_ok(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("removed 2 staging file(s) (2000 bytes)"),
        "{err}"
    );
    let left = files_under(&dir.join("out"));
    assert!(left.contains(&"notes#1".to_string()), "{left:?}");
    assert!(
        !left
            .iter()
            .any(|f| f.starts_with("part-") && f.contains('#')),
        "{left:?}"
    );
    assert!(
        !left.contains(&".sluice.lock".to_string()),
        "lock file left: {left:?}"
    );
    // One file: its own staging files only.
    let one = job(1).replace("path: out, max_rows_per_file: 1000", "path: one.parquet");
    std::fs::write(dir.join("p.yaml"), one).unwrap();
    let out = run_in_for(dir, &["run", "p.yaml", "--no-report"], LIMIT);
    assert_ok(&out);
    assert!(String::from_utf8_lossy(&out.stderr).contains("removed 1 staging file(s) (500 bytes)"));
    assert!(!dir.join("one.parquet#4").exists());
    assert!(!dir.join(".one.parquet.sluice.lock").exists());
    assert_eq!(rows(&read_parquet(&dir.join("one.parquet"))), 1437);
}
