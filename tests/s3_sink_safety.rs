//! The sink-safety rules on a real S3 server (moto, started by `scripts/services.sh`): a sink
//! over its own inputs is refused before anything is touched, and one run at a time writes a
//! parts directory — claimed by a lease object written with conditional puts, which a killed
//! run leaves to lapse and the next run takes over.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime};

use common::s3;
use common::*;
use futures::TryStreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

const LIMIT: Duration = Duration::from_secs(120);

/// Runs `f` to completion from synchronous code inside the test's runtime.
fn block<F: std::future::Future>(f: F) -> F::Output {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(f))
}

/// Every object under `prefix` in `bucket` with its bytes.
async fn snapshot(bucket: &str, prefix: &str) -> BTreeMap<String, Vec<u8>> {
    let store = s3::store(bucket);
    let metas: Vec<_> = store
        .list(Some(&ObjectPath::from(prefix)))
        .try_collect()
        .await
        .unwrap();
    let mut out = BTreeMap::new();
    for m in metas {
        let bytes = store.get(&m.location).await.unwrap().bytes().await;
        out.insert(m.location.to_string(), bytes.unwrap().to_vec());
    }
    out
}

fn sluice_s3(dir: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(assert_cmd::cargo::cargo_bin!("sluice"));
    cmd.args(args)
        .current_dir(dir)
        .env_remove("RUST_LOG")
        .envs(s3::env(&s3::endpoint()));
    cmd
}

/// Runs `sluice run <config>` against the server; (exit code, stderr).
fn run(dir: &Path, config: &str) -> (Option<i32>, String) {
    let out = sluice_s3(dir, &["run", config, "--no-report", "-q"])
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

/// Starts `sluice run <config>` (stderr to `dir/<config>.log`).
fn spawn(dir: &Path, config: &str) -> Child {
    let log = std::fs::File::create(dir.join(format!("{config}.log"))).unwrap();
    sluice_s3(dir, &["run", config, "--no-report", "-q"])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap()
}

/// A job reading the digits' `id` for `epochs` epochs into parts under `s3://bucket/out`.
fn job(dir: &Path, name: &str, bucket: &str, epochs: u64) {
    let digits = repo().join("data/digits/train.parquet");
    std::fs::write(
        dir.join(name),
        format!(
            "source: {{type: parquet, path: '{}', columns: [id], epochs: {epochs}}}\nstages: [{{type: batch, size: 100}}]\nsink: {{type: parquet, path: 's3://{bucket}/out', max_rows_per_file: 1000, overwrite: true}}\n",
            digits.display()
        ),
    )
    .unwrap();
}

/// How often each id appears in the part files under `s3://bucket/out`; fails on anything
/// but complete part files and the lock.
async fn output_ids(bucket: &str) -> BTreeMap<i64, usize> {
    let store = s3::store(bucket);
    let metas: Vec<_> = store
        .list(Some(&ObjectPath::from("out")))
        .try_collect()
        .await
        .unwrap();
    let mut ids = BTreeMap::new();
    for m in metas {
        let file = m.location.filename().unwrap_or_default();
        assert!(
            file.starts_with("part-") && file.ends_with(".parquet"),
            "unexpected object {} in the output",
            m.location
        );
        let bytes = store.get(&m.location).await.unwrap().bytes().await.unwrap();
        for id in int64_values(&read_parquet_from(bytes), "id") {
            *ids.entry(id).or_insert(0) += 1;
        }
    }
    ids
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sink_over_its_own_s3_inputs_is_refused_before_anything_is_touched() {
    let bucket = s3::bucket("overlap");
    let store = s3::store(&bucket);
    for i in 0..2 {
        let p = ObjectPath::from(format!("b/part-{i:05}.parquet"));
        store
            .put(&p, PutPayload::from(one_row_parquet(i)))
            .await
            .unwrap();
    }
    let before = snapshot(&bucket, "b").await;
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    for (source, sink, says) in [
        (
            format!("s3://{bucket}/b/*.parquet"),
            format!(
                "{{type: parquet, path: 's3://{bucket}/b', max_rows_per_file: 500, overwrite: true}}"
            ),
            format!("matches the sink's part files in s3://{bucket}/b/"),
        ),
        (
            format!("s3://{bucket}/b/part-00000.parquet"),
            format!(
                "{{type: parquet, path: 's3://{bucket}/b/part-00000.parquet', overwrite: true}}"
            ),
            format!("matches the sink's output file s3://{bucket}/b/part-00000.parquet"),
        ),
    ] {
        std::fs::write(
            dir.join("p.yaml"),
            format!("source: {{type: parquet, path: '{source}'}}\nsink: {sink}\n"),
        )
        .unwrap();
        let (code, err) = run(dir, "p.yaml");
        assert_eq!(code, Some(1), "{err}");
        assert!(err.contains(&says), "{err}");
        assert_eq!(snapshot(&bucket, "b").await, before, "inputs changed");
    }
}

/// Two different runs (3 and 2 epochs) into one parts directory: the output is always
/// wholly one of them, never parts of both.
#[tokio::test(flavor = "multi_thread")]
async fn two_runs_started_together_never_mix_their_s3_parts() {
    let bucket = s3::bucket("race");
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    job(dir, "a.yaml", &bucket, 3);
    job(dir, "b.yaml", &bucket, 2);
    let mut refusals = 0;
    for round in 0..20 {
        let mut a = spawn(dir, "a.yaml");
        let (b_code, b_err) = run(dir, "b.yaml");
        let a_code = a.wait().unwrap().code();
        let a_err = std::fs::read_to_string(dir.join("a.yaml.log")).unwrap();
        refusals += race_outcome(round, [(a_code, a_err), (b_code, b_err)]);
        assert_one_run(round, &output_ids(&bucket).await, [3, 2]);
    }
    // Which run wins is timing; that a loser is told so is checked whenever one lost.
    eprintln!("{refusals} of 20 rounds had a run refused by the lease");
}

/// A run in progress keeps its output from a second run; once it is killed its lease lapses
/// (30 s: this test waits for that on purpose) and the next run takes the output over.
#[tokio::test(flavor = "multi_thread")]
async fn a_killed_runs_lease_blocks_the_output_until_it_lapses() {
    let bucket = s3::bucket("lease");
    let store = s3::store(&bucket);
    let lock = ObjectPath::from("out/.sluice.lock");
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    job(dir, "long.yaml", &bucket, 100_000);
    job(dir, "short.yaml", &bucket, 1);
    let mut a = spawn(dir, "long.yaml");
    wait_for("the first run's first part", LIMIT, || {
        let first = ObjectPath::from("out/part-00000.parquet");
        block(store.head(&first)).ok()
    });
    let holder: serde_json::Value =
        serde_json::from_slice(&store.get(&lock).await.unwrap().bytes().await.unwrap()).unwrap();
    assert_eq!(holder["pid"], a.id());
    assert_eq!(holder["lease_ms"], 30_000);

    let (code, err) = run(dir, "short.yaml");
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "another run is writing this output (pid {} on ",
            a.id()
        )),
        "{err}"
    );
    assert!(
        store
            .head(&ObjectPath::from("out/part-00000.parquet"))
            .await
            .is_ok(),
        "the refused run deleted a part"
    );

    // Killed: nothing removes the lease, which must now lapse before anyone writes here.
    a.kill().unwrap();
    a.wait().unwrap();
    let (code, err) = run(dir, "short.yaml");
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("if that run is gone, its claim lapses in"),
        "{err}"
    );
    wait_for("the killed run's lease to lapse", LIMIT, || {
        let meta = block(store.head(&lock)).unwrap();
        let written: SystemTime = meta.last_modified.into();
        (written.elapsed().unwrap_or_default() > Duration::from_millis(30_500)).then_some(())
    });
    let out = sluice_s3(dir, &["run", "short.yaml", "--no-report"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("took over the claim from an earlier run (pid "),
        "{err}"
    );
    let ids = output_ids(&bucket).await;
    assert_eq!(ids.len(), 1437);
    assert!(ids.values().all(|&n| n == 1), "rows duplicated or missing");
}
