//! Ctrl-C/SIGTERM under `sluice train` never hangs (the real broker and S3 server from
//! `scripts/services.sh`): ranks waiting for data on an idle topic — one alone, or one while
//! the others wait for it in the all-reduce — checkpoint what they trained at once and exit
//! 130; where a clean stop cannot come (a checkpoint write the store never answers), the
//! grace period or a second signal ends the process, saying so, and the last checkpoint stays
//! whole.
#![cfg(feature = "torch")]
#![allow(clippy::unwrap_used)]

use crate::common;

use std::path::Path;
use std::process::Child;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{kafka, s3};
use common::{read_train_checkpoint, spawn_sluice_with, wait_for};
use object_store::ObjectStoreExt;
use object_store::path::Path as ObjectPath;

/// 640 small learnable records, ids `0..640`: the first `first` in partition 0, the rest in
/// partition 1.
fn topic(prefix: &str, first: i64) -> String {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let topic = rt.block_on(kafka::create_topic(prefix, 2));
    let records = (0..640i64).map(|i| {
        let x = (i as f32 * 0.37).sin();
        (
            i32::from(i >= first),
            format!(r#"{{"label": {}, "x": [{x}, 1.0]}}"#, i64::from(x > 0.0)).into_bytes(),
        )
    });
    assert_eq!(rt.block_on(kafka::produce(&topic, records)), 640);
    topic
}

/// Starts `sluice train` over `topic` with `workers` ranks (batches of 32, a checkpoint at
/// `checkpoint` every 7 steps, a step log) in `dir`, with `env` set.
fn start(
    dir: &Path,
    topic: &str,
    workers: usize,
    checkpoint: &str,
    env: &[(&str, String)],
) -> Child {
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
  checkpoint: {{path: '{checkpoint}', every_steps: 7}}
  log: train.log
",
            brokers = kafka::brokers()
        ),
    )
    .unwrap();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    spawn_sluice_with(dir, &["train", "job.yaml", "--no-report"], &env)
}

/// Waits until the step log has `line`'s start (`"step":20,`, `"checkpoint":7,`).
fn wait_for_line(dir: &Path, line: &str) {
    let needle = format!("{line},");
    wait_for(
        &format!("{line} in the step log"),
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

fn grace(text: &str) -> Vec<(&'static str, String)> {
    vec![("SLUICE_STOP_GRACE", text.to_string())]
}

#[test]
fn one_rank_waiting_on_an_idle_topic_checkpoints_at_once_on_sigterm() {
    let topic = topic("stop-idle", 320);
    let dir = tempfile::tempdir().unwrap();
    // The grace period is long: the stop must be a clean one, not the grace period's.
    let ckpt = "state/train.ckpt";
    let mut child = start(dir.path(), &topic, 1, ckpt, &grace("10m"));
    // 640 rows in batches of 32: step 20 is the last one; its periodic checkpoint was step 14.
    wait_for_line(dir.path(), "\"step\":20");
    signal(&child, "TERM");
    let (code, stderr) = exit_of(&mut child, dir.path());
    assert_eq!(code, Some(130), "{stderr}");
    assert!(stderr.contains("interrupted at step 20;"), "{stderr}");
    let (meta, _) = read_train_checkpoint(&dir.path().join(ckpt)).unwrap();
    assert_eq!(meta.step, 20, "{stderr}");
    assert_eq!(meta.rows_trained, 640, "{stderr}");
}

/// Two ranks, rank 1's partition shorter: after step 8 rank 1 waits for data while rank 0
/// waits for rank 1 in the step's handshake, holding its ninth batch. On SIGTERM rank 1 tells
/// rank 0 instead of taking a step, and both checkpoint step 8 at once: the positions are
/// those after step 8 (rank 0's ninth batch untrained and left for the resume).
#[test]
fn ranks_waiting_for_one_rank_s_data_checkpoint_at_once_on_sigterm() {
    for (name, first) in [("one waits", 384), ("both wait", 320)] {
        let topic = topic("stop-waiting", first);
        let dir = tempfile::tempdir().unwrap();
        let ckpt = "state/train.ckpt";
        let mut child = start(dir.path(), &topic, 2, ckpt, &grace("10m"));
        // The shorter partition has 256 (or 320) rows: 8 (or 10) steps of 32 rows a rank.
        let last = (640 - first) / 32;
        wait_for_line(dir.path(), &format!("\"step\":{last}"));
        signal(&child, "TERM");
        let (code, stderr) = exit_of(&mut child, dir.path());
        assert_eq!(code, Some(130), "{name}: {stderr}");
        assert!(
            stderr.contains(&format!("interrupted at step {last};")),
            "{name}: {stderr}"
        );
        assert!(!stderr.contains("ran out of data"), "{name}: {stderr}");
        let (meta, _) = read_train_checkpoint(&dir.path().join(ckpt)).unwrap();
        assert_eq!(
            (meta.step, meta.rows_trained),
            (last as u64, last as u64 * 64),
            "{name}: {stderr}"
        );
        // Rank r read partition r; each resumes just past the rows of its `last` batches.
        for (rank, state) in meta.pipeline.iter().enumerate() {
            let at = state
                .kafka
                .as_ref()
                .and_then(|k| k.get(&topic, rank as i32));
            assert_eq!(
                at.map(|p| (p.offset, p.skip_rows)),
                Some((last * 32, 0)),
                "{name}: rank {rank}: {stderr}"
            );
        }
    }
}

/// A stop that cannot come cleanly — a checkpoint write the S3 server never answers (a proxy
/// holds it) — is ended by the grace period, or at once by a second signal, saying so; the
/// checkpoint of step 7 is still whole.
#[test]
fn a_stop_that_cannot_come_is_ended_by_the_grace_period_or_a_second_signal() {
    for (grace_period, signals, says) in [
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
        let topic = topic("stop-stuck", 320);
        let dir = tempfile::tempdir().unwrap();
        let proxy = s3::Proxy::start();
        let bucket = s3::bucket("stop-stuck");
        let mut env = s3::env(&proxy.endpoint);
        env.extend(grace(grace_period));
        let ckpt = format!("s3://{bucket}/train.ckpt");
        // The checkpoint of step 7 is written; the one of step 14 is held by the proxy.
        *proxy.faults.stall_writes_after.lock().unwrap() = Some(1);
        let mut child = start(dir.path(), &topic, 1, &ckpt, &env);
        wait_for(
            "the checkpoint write of step 14",
            Duration::from_secs(120),
            || (proxy.faults.stalled.load(Ordering::SeqCst) > 0).then_some(()),
        );
        for s in signals {
            signal(&child, s);
        }
        let (code, stderr) = exit_of(&mut child, dir.path());
        assert_eq!(code, Some(130), "{grace_period}: {stderr}");
        assert!(stderr.contains(says), "{grace_period}: {stderr}");
        assert!(
            stderr.contains("the last checkpoint are intact"),
            "{grace_period}: {stderr}"
        );
        let rt = tokio::runtime::Runtime::new().unwrap();
        let bytes = rt.block_on(async {
            let got = s3::store(&bucket)
                .get(&ObjectPath::from("train.ckpt"))
                .await;
            got.unwrap().bytes().await.unwrap()
        });
        let (meta, _) = common::decode_train_checkpoint(&bytes).unwrap();
        assert_eq!(
            (meta.step, meta.rows_trained),
            (7, 224),
            "{grace_period}: {stderr}"
        );
    }
}
