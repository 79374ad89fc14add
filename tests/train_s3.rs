//! `sluice train` checkpointing to the real S3 server (moto, from `scripts/services.sh`):
//! SIGTERM makes every rank checkpoint at the next step and exit 130; `--resume` reads the
//! checkpoint back from S3 and ends with bitwise the parameters of an uninterrupted run.
#![cfg(feature = "torch")]
#![allow(clippy::unwrap_used)]

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::s3;
use common::*;
use object_store::ObjectStoreExt;
use object_store::path::Path as ObjectPath;

fn job(bucket: &str, key: &str, steps: u64) -> String {
    format!(
        "source: {{type: parquet, path: '{data}/train.parquet', columns: [label, pixels], batch_rows: 100}}
stages:
  - {{type: cast, columns: {{pixels: float32}}}}
  - {{type: standardize, columns: [pixels]}}
  - {{type: shuffle, buffer_rows: 300, seed: 9}}
  - {{type: batch, size: 32}}
runtime: {{threads: 1}}
loader:
  tensors:
    x: {{column: pixels, dtype: f32}}
    y: {{column: label, dtype: i64}}
trainer:
  model: {{type: mlp, hidden: [32], outputs: 10}}
  optimizer: {{type: adamw, lr: 0.002, weight_decay: 0.01}}
  epochs: 100000
  steps: {steps}
  allreduce: {{workers: 2}}
  checkpoint: {{path: 's3://{bucket}/{key}', every_steps: 25}}
",
        data = repo().join("data/digits").display()
    )
}

/// The checkpoint object, if it exists (an object that exists must decode: S3 puts are
/// atomic).
fn read(bucket: &str, key: &str) -> Option<TrainCheckpoint> {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let bytes = rt.block_on(async {
        let got = s3::store(bucket).get(&ObjectPath::from(key)).await.ok()?;
        got.bytes().await.ok()
    })?;
    Some(decode_train_checkpoint(&bytes).expect("the checkpoint object decodes"))
}

fn train(dir: &Path, endpoint: &str, args: &[&str]) -> std::process::Command {
    let mut cmd = std::process::Command::new(assert_cmd::cargo::cargo_bin!("sluice"));
    cmd.arg("train")
        .args(args)
        .current_dir(dir)
        .env_remove("RUST_LOG")
        .envs(s3::env(endpoint));
    cmd
}

#[test]
fn sigterm_checkpoints_to_s3_and_resume_reads_it_back_bitwise() {
    const STEPS: u64 = 300;
    let endpoint = s3::endpoint();
    let bucket = s3::bucket("train");
    let dir = tempfile::tempdir().unwrap();

    // The uninterrupted reference.
    std::fs::write(
        dir.path().join("ref.yaml"),
        job(&bucket, "ref/train.ckpt", STEPS),
    )
    .unwrap();
    let out = train(dir.path(), &endpoint, &["ref.yaml"])
        .output()
        .unwrap();
    assert_ok(&out);
    let (ref_meta, ref_params) = read(&bucket, "ref/train.ckpt").unwrap();
    assert!(ref_meta.complete && ref_meta.step == STEPS);

    // Run 1 would train for a million steps; SIGTERM once it has checkpointed twice.
    std::fs::write(
        dir.path().join("run.yaml"),
        job(&bucket, "run/train.ckpt", 1_000_000),
    )
    .unwrap();
    let child = train(dir.path(), &endpoint, &["run.yaml"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for("a checkpoint at step 50", Duration::from_secs(120), || {
        read(&bucket, "run/train.ckpt").filter(|(m, _)| m.step >= 50)
    });
    let status = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(130),
        "interrupted: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (at_stop, _) = read(&bucket, "run/train.ckpt").unwrap();
    assert!(!at_stop.complete);
    assert!(
        at_stop.step >= 50 && at_stop.step < STEPS,
        "stopped at step {}: the machine was too fast for this test's window",
        at_stop.step
    );

    // Run 2: the reference's length, resumed from S3.
    std::fs::write(
        dir.path().join("run.yaml"),
        job(&bucket, "run/train.ckpt", STEPS),
    )
    .unwrap();
    let out = train(dir.path(), &endpoint, &["run.yaml", "--resume"])
        .output()
        .unwrap();
    assert_ok(&out);
    let (meta, params) = read(&bucket, "run/train.ckpt").unwrap();
    assert!(meta.complete);
    assert_eq!(meta.step, STEPS);
    assert_eq!(meta.rows_trained, ref_meta.rows_trained);
    assert_eq!(meta.pipeline, ref_meta.pipeline);
    assert_same_parameters(
        &params,
        &ref_params,
        &format!("the uninterrupted run (stopped at step {})", at_stop.step),
    );
    eprintln!(
        "s3: SIGTERM → checkpoint at step {} (every 25 otherwise), resumed to {STEPS}, bitwise equal",
        at_stop.step
    );
}
