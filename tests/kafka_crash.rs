//! Kafka runs and brokers killed midway, against the real broker (Tansu, from
//! `scripts/services.sh`): a run resumed from its checkpoint (static assignment, also through a
//! shuffle) writes every record exactly once, a consumer group restarted delivers at least
//! once, and a broker restarted mid-run loses nothing.
#![allow(clippy::unwrap_used)]

use crate::common;
use crate::kafka::{ids, json_topic, run_in, runtime};

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::kafka::{self, JSON_SCHEMA, committed, json_record};
use common::{assert_ok, read_parquet, spawn_sluice, wait_for};

fn read_checkpoint(path: &std::path::Path) -> Option<serde_json::Value> {
    std::fs::read(path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
}

/// Ids in every `part-*.parquet` under `dir` (the staging files of an upload killed midway
/// are not parts).
fn part_ids(dir: &std::path::Path) -> Vec<i64> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        if name.starts_with("part-") && name.ends_with(".parquet") {
            out.extend(ids(&read_parquet(&p)));
        }
    }
    out
}

fn sigkill(child: &mut std::process::Child) {
    assert!(
        child.try_wait().unwrap().is_none(),
        "the run ended before it could be killed"
    );
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
}

#[test]
fn static_mode_killed_and_resumed_from_checkpoint_delivers_every_record_exactly_once() {
    let rt = runtime();
    let topic = json_topic(&rt, "crash-static", 30_000, 4);
    let dir = tempfile::tempdir().unwrap();
    let job = |until: &str| {
        format!(
            "source:\n  type: kafka\n  brokers: {}\n  topic: {topic}\n  format: json\n  schema: {JSON_SCHEMA}\n  batch_rows: 500\n{until}checkpoint:\n  path: state/checkpoint.json\n  interval: 300ms\nsink:\n  type: parquet\n  path: out\n  max_rows_per_file: 1500\n",
            kafka::brokers()
        )
    };
    // Run 1 is unbounded: it is still running whatever the timing when it is killed.
    std::fs::write(dir.path().join("job.yaml"), job("")).unwrap();
    let cp = dir.path().join("state/checkpoint.json");
    let mut run1 = spawn_sluice(dir.path(), &["run", "job.yaml"]);
    wait_for("a first checkpoint", Duration::from_secs(60), || {
        read_checkpoint(&cp).filter(|c| c["rows_written"].as_u64() > Some(0))
    });
    // More records arrive while it runs, in steps that each wait for the run to catch up
    // (a condition, not a timer); it is killed while they are still arriving.
    let killed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let producer = {
        let topic = topic.clone();
        let cp = cp.clone();
        let killed = killed.clone();
        std::thread::spawn(move || {
            let rt = runtime();
            for step in 0..30i64 {
                let from = 30_000 + step * 1000;
                rt.block_on(kafka::produce(
                    &topic,
                    (from..from + 1000).map(|i| ((i % 4) as i32, json_record(i))),
                ));
                let target = (from - 5000) as u64;
                wait_for("the run to catch up", Duration::from_secs(60), || {
                    if killed.load(std::sync::atomic::Ordering::SeqCst) {
                        return Some(());
                    }
                    read_checkpoint(&cp)
                        .filter(|c| c["rows_written"].as_u64() >= Some(target))
                        .map(|_| ())
                });
            }
        })
    };
    // Kill it in the window where a part file exists that the last checkpoint does not cover
    // yet: the resumed run must replace that part, not keep it twice.
    wait_for(
        "a part file written after the last checkpoint",
        Duration::from_secs(60),
        || {
            let c = read_checkpoint(&cp)?;
            let covered = c["rows_written"].as_u64()?;
            let on_disk = part_ids(&dir.path().join("out")).len() as u64;
            (covered > 36_000 && on_disk > covered).then_some(())
        },
    );
    sigkill(&mut run1);
    killed.store(true, std::sync::atomic::Ordering::SeqCst);
    let at_kill = read_checkpoint(&cp).unwrap();
    assert_eq!(at_kill["complete"], false);
    let written_at_kill = part_ids(&dir.path().join("out")).len();
    producer.join().unwrap();
    assert!(
        at_kill["rows_written"].as_u64() < Some(60_000),
        "killed before all records had arrived"
    );

    // Run 2 resumes (bounded now) and finishes.
    std::fs::write(dir.path().join("job.yaml"), job("  until: end\n")).unwrap();
    let out = run_in(dir.path(), &["run", "job.yaml"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "an existing checkpoint needs --resume"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("pass --resume"));
    let out = run_in(dir.path(), &["run", "job.yaml", "--resume"]);
    assert_ok(&out);
    let mut all = part_ids(&dir.path().join("out"));
    eprintln!(
        "killed with {written_at_kill} rows in part files ({} covered by the checkpoint); after resume {}",
        at_kill["rows_written"],
        all.len()
    );
    all.sort_unstable();
    assert_eq!(all.len(), 60_000, "no record twice, none missing");
    assert_eq!(all, (0..60_000).collect::<Vec<_>>());
    let done = read_checkpoint(&cp).unwrap();
    assert_eq!(done["complete"], true);
    assert_eq!(done["rows_written"], 60_000);
}

#[test]
fn group_mode_killed_and_restarted_delivers_at_least_once_with_duplicates_only_past_the_commit() {
    let rt = runtime();
    let n = 40_000i64;
    let topic = json_topic(&rt, "crash-group", 20_000, 4);
    let group = kafka::unique("sluice-group");
    let dir = tempfile::tempdir().unwrap();
    let job = |until: &str, out: &str| {
        format!(
            "source:\n  type: kafka\n  brokers: {}\n  topic: {topic}\n  format: json\n  schema: {JSON_SCHEMA}\n  batch_rows: 500\n  assignment: group\n  group_id: {group}\n  properties: {{session.timeout.ms: 6000, auto.commit.interval.ms: 100}}\n{until}sink:\n  type: parquet\n  path: {out}\n  max_rows_per_file: 1500\n",
            kafka::brokers()
        )
    };
    std::fs::write(dir.path().join("run1.yaml"), job("", "out1")).unwrap();
    let mut run1 = spawn_sluice(dir.path(), &["run", "run1.yaml"]);
    let out1 = dir.path().join("out1");
    let on_disk = || {
        std::fs::read_dir(&out1)
            .map(|_| part_ids(&out1).len())
            .unwrap_or(0)
    };
    // The group has committed part of what run 1 wrote; records are still arriving.
    wait_for("a first commit", Duration::from_secs(60), || {
        let c: i64 = committed(&topic, &group, 4).values().sum();
        (c > 0).then_some(())
    });
    rt.block_on(kafka::produce(
        &topic,
        (20_000..30_000i64).map(|i| ((i % 4) as i32, json_record(i))),
    ));
    wait_for("run 1 to take new records", Duration::from_secs(60), || {
        (on_disk() > 21_000).then_some(())
    });
    sigkill(&mut run1);
    let at_kill = committed(&topic, &group, 4);
    let first = part_ids(&out1);
    rt.block_on(kafka::produce(
        &topic,
        (30_000..n).map(|i| ((i % 4) as i32, json_record(i))),
    ));

    std::fs::write(dir.path().join("run2.yaml"), job("  until: end\n", "out2")).unwrap();
    let out = run_in(dir.path(), &["run", "run2.yaml"]);
    assert_ok(&out);
    let second = part_ids(&dir.path().join("out2"));
    let mut all: Vec<i64> = first.iter().chain(second.iter()).copied().collect();
    all.sort_unstable();
    let unique: BTreeSet<i64> = all.iter().copied().collect();
    assert_eq!(
        unique,
        (0..n).collect::<BTreeSet<_>>(),
        "every record at least once"
    );
    let first_set: BTreeSet<i64> = first.iter().copied().collect();
    let duplicates: Vec<i64> = second
        .iter()
        .copied()
        .filter(|id| first_set.contains(id))
        .collect();
    // A duplicate is a record run 1 wrote but the group had not committed: its offset is at or
    // past the committed offset of its partition.
    for id in &duplicates {
        let (partition, offset) = ((id % 4) as i32, id / 4);
        assert!(
            offset >= at_kill[&partition],
            "id {id} (partition {partition} offset {offset}) was committed at {} yet delivered again",
            at_kill[&partition]
        );
    }
    let committed_rows: i64 = at_kill.values().sum();
    assert!(duplicates.len() as i64 <= first.len() as i64 - committed_rows);
    eprintln!(
        "group crash: run 1 wrote {}, group had committed {committed_rows}; {} duplicates after restart",
        first.len(),
        duplicates.len()
    );
}

#[test]
fn broker_killed_and_restarted_mid_run_loses_nothing() {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let mut broker = kafka::DurableBroker::start(common::s3::bucket("tansu"), dir.path());
    let brokers = broker.brokers();
    let topic = rt.block_on(async {
        let t = kafka::create_topic_on(&brokers, "restart", 2).await;
        kafka::produce_on(
            &brokers,
            &t,
            (0..5_000i64).map(|i| ((i % 2) as i32, json_record(i))),
        )
        .await;
        t
    });
    // The run stops after exactly 10,000 records: half produced before the broker dies, half
    // after it is back.
    std::fs::write(
        dir.path().join("job.yaml"),
        format!(
            "source:\n  type: kafka\n  brokers: {brokers}\n  topic: {topic}\n  format: json\n  schema: {JSON_SCHEMA}\n  batch_rows: 250\n  until: {{records: 10000}}\nsink:\n  type: parquet\n  path: out\n  max_rows_per_file: 1000\n"
        ),
    )
    .unwrap();
    let mut run = spawn_sluice(dir.path(), &["run", "job.yaml"]);
    let out = dir.path().join("out");
    wait_for(
        "the run to write its first part",
        Duration::from_secs(60),
        || {
            std::fs::read_dir(&out)
                .ok()
                .filter(|_| !part_ids(&out).is_empty())
        },
    );
    broker.kill();
    // The run says the brokers are gone (and how long it will wait) before they come back…
    let stderr = dir.path().join("stderr.log");
    wait_for(
        "the outage to be announced",
        Duration::from_secs(60),
        || {
            std::fs::read_to_string(&stderr)
                .ok()
                .filter(|log| log.contains("no broker reachable ("))
        },
    );
    broker.restart();
    rt.block_on(kafka::produce_on(
        &brokers,
        &topic,
        (5_000..10_000i64).map(|i| ((i % 2) as i32, json_record(i))),
    ));
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(s) = run.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the run did not finish after the broker came back"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let log = std::fs::read_to_string(dir.path().join("stderr.log")).unwrap();
    assert!(status.success(), "{log}");
    // …and that they are back.
    assert!(log.contains("brokers reachable again after"), "{log}");
    let mut ids = part_ids(&out);
    ids.sort_unstable();
    assert_eq!(ids, (0..10_000).collect::<Vec<_>>());
}

/// Sends `signal` (`STOP`, `CONT`) to a child process.
fn signal(child: &std::process::Child, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

#[test]
fn a_shuffled_kafka_job_killed_inside_a_window_and_resumed_writes_every_record_exactly_once() {
    let rt = runtime();
    let n = 60_000i64;
    let topic = json_topic(&rt, "crash-shuffle", n, 4);
    let dir = tempfile::tempdir().unwrap();
    let job = |until: &str| {
        format!(
            "source:\n  type: kafka\n  brokers: {}\n  topic: {topic}\n  format: json\n  schema: {JSON_SCHEMA}\n  batch_rows: 500\n{until}stages:\n  - {{type: shuffle, buffer_rows: 3000, seed: 3, batch_rows: 500}}\ncheckpoint:\n  path: state/checkpoint.json\n  interval: 1h\n  every_batches: 1\nsink:\n  type: parquet\n  path: out\n  max_rows_per_file: 1000\n",
            kafka::brokers()
        )
    };
    // Run 1 is unbounded (it would hold its last, partial window, waiting for more records).
    // It is stopped (SIGSTOP) when its checkpoint is inside a window, the checkpoint read
    // again while it cannot move, and killed there.
    std::fs::write(dir.path().join("job.yaml"), job("")).unwrap();
    let cp = dir.path().join("state/checkpoint.json");
    let mut run1 = spawn_sluice(dir.path(), &["run", "job.yaml"]);
    let inside = |c: &serde_json::Value| c["source"]["kafka_shuffle"]["rows"].as_u64() > Some(0);
    let at_kill = wait_for(
        "a checkpoint inside a window",
        Duration::from_secs(60),
        || {
            read_checkpoint(&cp).filter(inside)?;
            signal(&run1, "STOP");
            match read_checkpoint(&cp).filter(inside) {
                Some(c) => Some(c),
                None => {
                    signal(&run1, "CONT");
                    None
                }
            }
        },
    );
    sigkill(&mut run1);
    assert!(
        at_kill["rows_written"].as_u64() < Some(n as u64 - 3000),
        "killed before the end: {at_kill}"
    );
    std::fs::write(dir.path().join("job.yaml"), job("  until: end\n")).unwrap();
    let out = run_in(dir.path(), &["run", "job.yaml", "--resume"]);
    assert_ok(&out);
    let mut all = part_ids(&dir.path().join("out"));
    eprintln!(
        "killed at {}; after resume {} rows",
        at_kill["source"]["kafka_shuffle"],
        all.len()
    );
    assert_eq!(all.len() as i64, n, "no record twice, none missing");
    all.sort_unstable();
    assert_eq!(all, (0..n).collect::<Vec<_>>());
}
