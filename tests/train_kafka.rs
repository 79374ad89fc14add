//! `sluice train` reading Kafka (the real broker from `scripts/services.sh`): a SIGKILLed run
//! over a `static` source resumes to bitwise the parameters of an uninterrupted run with
//! every record trained exactly once, and a consumer group's offsets are committed only
//! once a checkpoint covering them is durable.
#![cfg(feature = "torch")]
#![allow(clippy::unwrap_used)]

use crate::common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use common::kafka::{self, committed};
use common::{
    assert_ok, assert_same_parameters, read_train_checkpoint, run_in_for, spawn_sluice, wait_for,
};
use sluice::trainer::checkpoint::CheckpointMeta;

const SCHEMA: &str = r#"{id: int64, label: int64, x: "float32[4]"}"#;

/// A small learnable record: the label is the sign pattern of two features.
fn record(id: i64) -> Vec<u8> {
    let a = (id as f32 * 0.37).sin();
    let b = (id as f32 * 0.11).cos();
    let label = i64::from(a > 0.0) + 2 * i64::from(b > 0.0);
    format!(
        r#"{{"id": {id}, "label": {label}, "x": [{a}, {b}, {}, 1.0]}}"#,
        (id % 7) as f32 / 7.0
    )
    .into_bytes()
}

/// Produces ids `from..to`, id `i` to partition `i % partitions`.
fn produce(topic: &str, from: i64, to: i64, partitions: i64) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let n = rt.block_on(kafka::produce(
        topic,
        (from..to).map(|i| ((i % partitions) as i32, record(i))),
    ));
    assert_eq!(n as i64, to - from);
}

/// A training job over `topic`; `source_extra` lines go into the source section.
fn job(topic: &str, source_extra: &str, workers: usize, every: u64) -> String {
    format!(
        "source:
  type: kafka
  brokers: {brokers}
  topic: {topic}
  format: json
  schema: {SCHEMA}
  batch_rows: 100
{source_extra}stages:
  - {{type: batch, size: 32}}
loader:
  tensors:
    x: {{column: x, dtype: f32}}
    y: {{column: label, dtype: i64}}
trainer:
  model: {{type: mlp, hidden: [16], outputs: 4}}
  optimizer: {{type: sgd, lr: 0.05, momentum: 0.9, weight_decay: 0.0001}}
  allreduce: {{workers: {workers}, bucket_mb: 0.001}}
  checkpoint: {{path: state/train.ckpt, every_steps: {every}}}
  check_every_steps: 10
",
        brokers = kafka::brokers()
    )
}

/// Every rank's Kafka positions in a checkpoint: partition → next offset.
fn positions(meta: &CheckpointMeta, topic: &str) -> BTreeMap<i32, i64> {
    let mut out = BTreeMap::new();
    for state in &meta.pipeline {
        if let Some(k) = &state.kafka {
            for (t, p, pos) in k.iter() {
                assert_eq!(t, topic);
                assert_eq!(pos.skip_rows, 0, "one row per JSON message");
                assert!(
                    out.insert(p, pos.offset).is_none(),
                    "partition {p} on two ranks"
                );
            }
        }
    }
    out
}

#[test]
fn static_source_killed_and_resumed_trains_every_record_once_to_the_same_parameters() {
    const N: i64 = 20_000;
    let topic = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(kafka::create_topic("train-static", 2));
    produce(&topic, 0, 6_000, 2);
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("state/train.ckpt");
    // Run 1 reads without end (each rank one partition, static assignment) and checkpoints
    // every 7 steps; more records arrive while it trains, each block once it caught up.
    std::fs::write(dir.path().join("job.yaml"), job(&topic, "", 2, 7)).unwrap();
    let mut run1 = spawn_sluice(dir.path(), &["train", "job.yaml"]);
    let killed = Arc::new(AtomicBool::new(false));
    let produced = Arc::new(AtomicI64::new(6_000));
    let producer = {
        let (topic, ckpt, killed) = (topic.clone(), ckpt.clone(), killed.clone());
        let produced = produced.clone();
        std::thread::spawn(move || {
            for from in (6_000..N).step_by(2_000) {
                let caught_up = (from - 3_000) as u64;
                wait_for("run 1 to catch up", Duration::from_secs(120), || {
                    if killed.load(Ordering::SeqCst) {
                        return Some(());
                    }
                    read_train_checkpoint(&ckpt)
                        .filter(|(m, _)| m.rows_trained >= caught_up)
                        .map(|_| ())
                });
                if killed.load(Ordering::SeqCst) {
                    return;
                }
                produce(&topic, from, from + 2_000, 2);
                produced.store(from + 2_000, Ordering::SeqCst);
            }
        })
    };
    // Killed (no chance to checkpoint) while records are still arriving.
    wait_for(
        "a checkpoint past 8000 rows",
        Duration::from_secs(120),
        || read_train_checkpoint(&ckpt).filter(|(m, _)| m.rows_trained >= 8_000),
    );
    assert!(run1.try_wait().unwrap().is_none(), "run 1 ended by itself");
    run1.kill().unwrap();
    run1.wait().unwrap();
    killed.store(true, Ordering::SeqCst);
    producer.join().unwrap();
    let (at_kill, _) = read_train_checkpoint(&ckpt).unwrap();
    assert!(!at_kill.complete && at_kill.step % 7 == 0);
    assert!(
        at_kill.rows_trained < N as u64,
        "killed with {} of {N} rows trained",
        at_kill.rows_trained
    );
    let have = produced.load(Ordering::SeqCst);
    assert!(
        have < N,
        "records were still arriving when run 1 was killed"
    );
    produce(&topic, have, N, 2);

    // Run 2: up to the end of the topic, from run 1's checkpoint.
    std::fs::write(
        dir.path().join("job.yaml"),
        job(&topic, "  until: end\n", 2, 7),
    )
    .unwrap();
    assert_ok(&run_in_for(
        dir.path(),
        &["train", "job.yaml", "--resume"],
        Duration::from_secs(300),
    ));
    let (meta, params) = read_train_checkpoint(&ckpt).unwrap();
    assert!(meta.complete);
    // Counted: every record once (N rows, each partition read to its end, no rank trained
    // a partition of another), in batches of 32 per rank: 10 000 rows each.
    assert_eq!(meta.rows_trained, N as u64, "rows trained over both runs");
    assert_eq!(meta.step, (N as u64 / 2).div_ceil(32));
    assert_eq!(
        positions(&meta, &topic),
        BTreeMap::from([(0, N / 2), (1, N / 2)])
    );

    // The reference: one uninterrupted run over the whole topic.
    let reference = tempfile::tempdir().unwrap();
    std::fs::write(
        reference.path().join("job.yaml"),
        job(&topic, "  until: end\n", 2, 7),
    )
    .unwrap();
    assert_ok(&run_in_for(
        reference.path(),
        &["train", "job.yaml"],
        Duration::from_secs(300),
    ));
    let (ref_meta, ref_params) =
        read_train_checkpoint(&reference.path().join("state/train.ckpt")).unwrap();
    assert_eq!(ref_meta.step, meta.step);
    assert_eq!(ref_meta.rows_trained, meta.rows_trained);
    assert_eq!(ref_meta.pipeline, meta.pipeline);
    assert_same_parameters(
        &params,
        &ref_params,
        &format!("the uninterrupted run (killed at step {})", at_kill.step),
    );
    eprintln!(
        "kafka static: killed at step {} ({} rows); resumed to step {} with {} rows, bitwise equal",
        at_kill.step, at_kill.rows_trained, meta.step, meta.rows_trained
    );
}

#[test]
fn group_offsets_are_committed_only_once_the_checkpoint_covering_them_is_durable() {
    // 3010 rows, one worker, batches of 32, a checkpoint every 5 steps: run 1 (no end) trains
    // 94 batches and checkpoints at step 90, the rest never gets covered.
    const N: i64 = 3_010;
    let topic = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(kafka::create_topic("train-group", 2));
    produce(&topic, 0, N, 2);
    let group = kafka::unique("sluice-train");
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("state/train.ckpt");
    let source = |until: &str| {
        format!(
            "  assignment: group\n  group_id: {group}\n  properties: {{session.timeout.ms: 6000, auto.commit.interval.ms: 50}}\n{until}"
        )
    };
    std::fs::write(dir.path().join("job.yaml"), job(&topic, &source(""), 1, 5)).unwrap();
    let mut run1 = spawn_sluice(dir.path(), &["train", "job.yaml"]);
    // Sampled while run 1 trains: committed first, then the checkpoint (whose positions only
    // grow), so a commit ahead of its checkpoint would show.
    let mut samples = 0;
    let at_90 = wait_for(
        "the group to commit the step-90 checkpoint",
        Duration::from_secs(120),
        || {
            let c = committed(&topic, &group, 2);
            let (meta, _) = read_train_checkpoint(&ckpt)?;
            let k = positions(&meta, &topic);
            for (p, off) in &c {
                let covered = k.get(p).copied().unwrap_or(0);
                assert!(
                    *off <= covered,
                    "partition {p}: committed {off} but the checkpoint (step {}) covers {covered}",
                    meta.step
                );
            }
            samples += 1;
            (meta.step == 90 && c == k).then_some(k)
        },
    );
    assert_eq!(at_90.values().sum::<i64>(), 90 * 32);
    run1.kill().unwrap();
    run1.wait().unwrap();
    assert_eq!(
        committed(&topic, &group, 2),
        at_90,
        "nothing past the checkpoint"
    );

    // Run 2 resumes to the end and commits everything.
    std::fs::write(
        dir.path().join("job.yaml"),
        job(&topic, &source("  until: end\n"), 1, 5),
    )
    .unwrap();
    assert_ok(&run_in_for(
        dir.path(),
        &["train", "job.yaml", "--resume"],
        Duration::from_secs(300),
    ));
    let (meta, _) = read_train_checkpoint(&ckpt).unwrap();
    assert!(meta.complete);
    assert_eq!(meta.rows_trained, N as u64, "every record once");
    let end = BTreeMap::from([(0, N / 2), (1, N / 2)]);
    assert_eq!(positions(&meta, &topic), end);
    assert_eq!(committed(&topic, &group, 2), end);
    eprintln!("kafka group: {samples} samples, commits never ahead of the checkpoint");
}

/// Continuous training's serving side: a Kafka run checkpointing on the clock (`every`; 1ns
/// makes it every step, so the count is exact) publishes a model version per checkpoint; each
/// manifest names the offsets its weights have seen (summing to its rows: one row per
/// message), `LATEST` names the last, and Python's `safetensors` loads its weights.
#[test]
fn a_stream_run_publishes_a_model_version_per_checkpoint_naming_its_offsets() {
    let topic = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(kafka::create_topic("train-versions", 2));
    produce(&topic, 0, 2_000, 2);
    let dir = tempfile::tempdir().unwrap();
    let yaml = job(&topic, "  until: end\n", 2, 1_000).replace(
        "every_steps: 1000}",
        "every_steps: 1000, every: 1ns}\n  export: {path: models}",
    );
    std::fs::write(dir.path().join("job.yaml"), yaml).unwrap();
    assert_ok(&run_in_for(
        dir.path(),
        &["train", "job.yaml"],
        Duration::from_secs(300),
    ));
    let (meta, params) = read_train_checkpoint(&dir.path().join("state/train.ckpt")).unwrap();
    assert!(meta.complete);
    let steps = (1_000u64).div_ceil(32); // 1,000 records a rank, batches of 32
    assert_eq!(meta.step, steps);
    let models = dir.path().join("models");
    let versions = common::model_versions(&models);
    assert_eq!(
        versions.len() as u64,
        steps,
        "one version per step's checkpoint"
    );
    let mut last_rows = 0;
    for v in &versions {
        let m: serde_json::Value =
            serde_json::from_slice(&std::fs::read(models.join(v).join("manifest.json")).unwrap())
                .unwrap();
        let rows = m["rows_trained"].as_u64().unwrap();
        let offsets: i64 = m["pipeline"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|rank| {
                // topic → partition → {offset, skip_rows}
                let topics = rank["kafka"].as_object().cloned().unwrap_or_default();
                topics.into_iter().flat_map(|(_, parts)| {
                    parts.as_object().cloned().unwrap_or_default().into_iter()
                })
            })
            .map(|(_, p)| p["offset"].as_i64().unwrap())
            .sum();
        assert_eq!(
            offsets as u64, rows,
            "{v}: its offsets are the rows it has seen"
        );
        assert!(rows > last_rows, "{v}: versions move forward");
        last_rows = rows;
    }
    assert_eq!(last_rows, 2_000);
    let latest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(models.join("LATEST")).unwrap()).unwrap();
    assert_eq!(latest["version"], versions.last().unwrap().as_str());
    // Every version loads in Python, with the model's parameter names.
    let script = "import sys\nfrom safetensors.torch import load_file\n\
                  for f in sys.argv[1:]:\n\
                  \x20   print(' '.join(sorted(load_file(f).keys())))\n";
    let out = std::process::Command::new(common::venv_python())
        .args(["-c", script])
        .args(
            versions
                .iter()
                .map(|v| models.join(v).join("model.safetensors")),
        )
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let names: Vec<String> = params
        .iter()
        .filter_map(|(n, _)| n.strip_prefix("model.").map(str::to_string))
        .collect();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.lines().count(), versions.len());
    assert!(stdout.lines().all(|l| l == names.join(" ")), "{stdout}");
}

/// A 2-partition topic: ids 0..2,000, then a malformed record at partition 1's offset 1,000,
/// then ids 2,000..2,400 (partition 0 gets 1,200 good records, partition 1 1,200 around it).
fn topic_with_a_bad_record(name: &str) -> String {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let topic = rt.block_on(kafka::create_topic(name, 2));
    produce(&topic, 0, 2_000, 2);
    let bad = std::iter::once((1, b"{not json".to_vec()));
    rt.block_on(kafka::produce(&topic, bad));
    produce(&topic, 2_000, 2_400, 2);
    topic
}

/// Under `sync: async` a rank that fails mid-run (here: a malformed record on its partition,
/// with no dead-letter destination) stops every rank: the run fails naming the rank and the
/// record, and the server's checkpoint keeps every update it had applied.
#[test]
fn an_async_rank_that_fails_stops_every_rank_naming_it() {
    let topic = topic_with_a_bad_record("train-async-fail");
    let dir = tempfile::tempdir().unwrap();
    let yaml = job(&topic, "  until: end\n", 2, 5).replace(
        "  check_every_steps: 10\n",
        "  sync: {type: async, staleness: 2}\n",
    );
    std::fs::write(dir.path().join("job.yaml"), yaml).unwrap();
    let out = run_in_for(dir.path(), &["train", "job.yaml"], Duration::from_secs(300));
    assert!(
        !out.status.success(),
        "a malformed record must stop the run"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("rank 1 failed"), "{stderr}");
    assert!(
        stderr.contains(&format!("{topic}/1 offset 1000")),
        "{stderr}"
    );
    let (meta, _) = read_train_checkpoint(&dir.path().join("state/train.ckpt")).unwrap();
    assert!(!meta.complete);
    assert!(
        meta.rows_trained > 0 && meta.rows_trained < 2_400,
        "{}",
        meta.rows_trained
    );
}

/// The same failure under `on_failure: continue`: the other rank trains its partition to the
/// end, the run succeeds and names the failed rank, and the checkpoint is not complete — a
/// `--resume` with a dead-letter destination trains the failed rank's remaining records.
#[test]
fn an_async_rank_that_fails_under_continue_leaves_its_rest_for_the_resume() {
    let topic = topic_with_a_bad_record("train-async-continue");
    let dir = tempfile::tempdir().unwrap();
    let yaml = |source_extra: &str| {
        job(&topic, source_extra, 2, 5).replace(
            "  check_every_steps: 10\n",
            "  sync: {type: async, staleness: 2, on_failure: continue}\n",
        )
    };
    std::fs::write(dir.path().join("job.yaml"), yaml("  until: end\n")).unwrap();
    let out = run_in_for(
        dir.path(),
        &["train", "job.yaml", "--summary-json", "s.json"],
        Duration::from_secs(300),
    );
    assert_ok(&out);
    let r: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("s.json")).unwrap()).unwrap();
    let notes = r["notes"].to_string();
    assert!(
        notes.contains("rank 1 failed and the others went on"),
        "{notes}"
    );
    let ckpt = dir.path().join("state/train.ckpt");
    let (meta, _) = read_train_checkpoint(&ckpt).unwrap();
    assert!(!meta.complete, "a failed rank's data is not all trained");
    let pos = positions(&meta, &topic);
    assert_eq!(pos[&0], 1_200, "rank 0 read its partition to the end");
    assert!(
        pos[&1] <= 1_000,
        "rank 1 stopped at the bad record: {pos:?}"
    );
    // Resumed with the bad record diverted: rank 1's rest is trained, every good record once.
    std::fs::write(
        dir.path().join("job.yaml"),
        yaml("  until: end\n  dead_letter: {type: file, path: dead}\n"),
    )
    .unwrap();
    assert_ok(&run_in_for(
        dir.path(),
        &["train", "job.yaml", "--resume"],
        Duration::from_secs(300),
    ));
    let (meta, _) = read_train_checkpoint(&ckpt).unwrap();
    assert!(meta.complete);
    assert_eq!(
        meta.rows_trained, 2_400,
        "every good record once over both runs"
    );
}
