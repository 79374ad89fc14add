//! Ctrl-C/SIGTERM under `sluice train` never hangs (the real broker from
//! `scripts/services.sh`): one rank waiting on an idle topic checkpoints what it trained at
//! once and exits 130; where a clean stop cannot come (two ranks, each waiting for data the
//! other's all-reduce needs), the grace period or a second signal ends the process, saying
//! so, and the last checkpoint stays whole.
#![cfg(feature = "torch")]
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::process::Child;
use std::time::Duration;

use common::kafka;
use common::{read_train_checkpoint, spawn_sluice_with, wait_for};

/// 640 small learnable records, ids `0..640`, spread over two partitions.
fn topic(prefix: &str) -> String {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let topic = rt.block_on(kafka::create_topic(prefix, 2));
    let records = (0..640i64).map(|i| {
        let x = (i as f32 * 0.37).sin();
        (
            (i % 2) as i32,
            format!(r#"{{"label": {}, "x": [{x}, 1.0]}}"#, i64::from(x > 0.0)).into_bytes(),
        )
    });
    assert_eq!(rt.block_on(kafka::produce(&topic, records)), 640);
    topic
}

/// Starts `sluice train` over `topic` with `workers` ranks (batches of 32, a checkpoint every
/// 7 steps, a step log) in `dir`, with `env` set.
fn start(dir: &Path, topic: &str, workers: usize, env: &[(&str, &str)]) -> Child {
    std::fs::write(
        dir.join("job.yaml"),
        format!(
            "source:
  type: kafka
  brokers: {brokers}
  topic: {topic}
  format: json
  schema: {{label: int64, x: \"float32[2]\"}}
  batch_rows: 64
stages:
  - {{type: batch, size: 32}}
loader:
  tensors:
    x: {{column: x, dtype: f32}}
    y: {{column: label, dtype: i64}}
trainer:
  model: {{type: logreg, outputs: 2}}
  optimizer: {{type: sgd, lr: 0.1}}
  allreduce: {{workers: {workers}}}
  checkpoint: {{path: state/train.ckpt, every_steps: 7}}
  log: train.log
",
            brokers = kafka::brokers()
        ),
    )
    .unwrap();
    spawn_sluice_with(dir, &["train", "job.yaml", "--no-report"], env)
}

/// Waits until the step log has step `step`: every record is trained and the ranks wait.
fn wait_for_step(dir: &Path, step: u64) {
    let needle = format!("\"step\":{step},");
    wait_for(
        &format!("step {step} in the step log"),
        Duration::from_secs(120),
        || {
            std::fs::read_to_string(dir.join("train.log"))
                .ok()
                .filter(|log| log.contains(&needle))
                .map(|_| ())
        },
    );
}

fn signal(child: &Child, name: &str) {
    let ok = std::process::Command::new("kill")
        .args([&format!("-{name}"), &child.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -{name}");
}

/// Waits for the process to end (a hang fails the test), returning its exit code and stderr.
fn exit_of(child: &mut Child, dir: &Path) -> (Option<i32>, String) {
    let status = wait_for("sluice to exit", Duration::from_secs(90), || {
        child.try_wait().unwrap()
    });
    let stderr = std::fs::read_to_string(dir.join("stderr.log")).unwrap();
    assert!(!stderr.contains("panicked"), "{stderr}");
    (status.code(), stderr)
}

#[test]
fn one_rank_waiting_on_an_idle_topic_checkpoints_at_once_on_sigterm() {
    let topic = topic("stop-idle");
    let dir = tempfile::tempdir().unwrap();
    // The grace period is long: the stop must be a clean one, not the grace period's.
    let mut child = start(dir.path(), &topic, 1, &[("SLUICE_STOP_GRACE", "10m")]);
    // 640 rows in batches of 32: step 20 is the last one; its periodic checkpoint was step 14.
    wait_for_step(dir.path(), 20);
    signal(&child, "TERM");
    let (code, stderr) = exit_of(&mut child, dir.path());
    assert_eq!(code, Some(130), "{stderr}");
    assert!(stderr.contains("interrupted at step 20;"), "{stderr}");
    let (meta, _) = read_train_checkpoint(&dir.path().join("state/train.ckpt")).unwrap();
    assert_eq!(meta.step, 20, "{stderr}");
    assert_eq!(meta.rows_trained, 640, "{stderr}");
}

#[test]
fn ranks_that_cannot_stop_cleanly_are_ended_by_the_grace_period_or_a_second_signal() {
    for (grace, signals, says) in [
        (
            "1s",
            &["TERM"][..],
            "error: no clean stop within 1s (SLUICE_STOP_GRACE): exiting",
        ),
        (
            "10m",
            &["TERM", "INT"][..],
            "error: a second interrupt: exiting",
        ),
    ] {
        let topic = topic("stop-stuck");
        let dir = tempfile::tempdir().unwrap();
        let mut child = start(dir.path(), &topic, 2, &[("SLUICE_STOP_GRACE", grace)]);
        // 320 rows a rank in batches of 32: both ranks took step 10 and wait for more.
        wait_for_step(dir.path(), 10);
        for s in signals {
            signal(&child, s);
        }
        let (code, stderr) = exit_of(&mut child, dir.path());
        assert_eq!(code, Some(130), "{grace}: {stderr}");
        assert!(stderr.contains(says), "{grace}: {stderr}");
        assert!(
            stderr.contains("the last checkpoint are intact"),
            "{grace}: {stderr}"
        );
        // The checkpoint of step 7 is whole and still says step 7.
        let (meta, _) = read_train_checkpoint(&dir.path().join("state/train.ckpt")).unwrap();
        assert_eq!(
            (meta.step, meta.rows_trained),
            (7, 448),
            "{grace}: {stderr}"
        );
    }
}
