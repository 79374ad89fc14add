//! Bad records from the Kafka source against the real broker (Tansu, from
//! `scripts/services.sh`): dead letters to a file or a topic, the error budget, a run without
//! a dead-letter sink, and a partition replayed after a rebalance.
#![allow(clippy::unwrap_used)]

use crate::common;
use crate::kafka::{ids, json_source, run_in, runtime};

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use arrow::array::RecordBatch;
use common::kafka::{self, JSON_SCHEMA, json_record};
use common::{assert_ok, read_parquet};
use futures::StreamExt;
use sluice::pipeline::Pipeline;

#[test]
fn malformed_json_goes_to_the_dead_letter_file_with_offsets() {
    let rt = runtime();
    // 2 partitions; in partition 1, offsets 3, 10, 11 and 40 are bad in different ways.
    let topic = rt.block_on(kafka::create_topic("dlq-json", 2));
    let mut records: Vec<(i32, Vec<u8>)> = Vec::new();
    let mut good = Vec::new();
    let mut bad_offsets = BTreeSet::new();
    for offset in 0..50i64 {
        for partition in 0..2i32 {
            let id = offset * 2 + partition as i64;
            let value = match (partition, offset) {
                (1, 3) => b"{\"id\": 7, \"label\": 1, \"x\": [1, 2".to_vec(),
                (1, 10) => b"not json at all".to_vec(),
                (1, 11) => br#"{"id": "seven", "label": 1, "x": [1, 2, 3, 4]}"#.to_vec(),
                (1, 40) => br#"{"id": 1, "label": 1, "x": [1, 2, 3]}"#.to_vec(),
                _ => {
                    good.push(id);
                    json_record(id)
                }
            };
            if partition == 1 && [3, 10, 11, 40].contains(&offset) {
                bad_offsets.insert(offset);
            }
            records.push((partition, value));
        }
    }
    rt.block_on(kafka::produce(&topic, records));
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        "{}sink:\n  type: parquet\n  path: out.parquet\n",
        json_source(&topic, "  dead_letter: {type: file, path: dlq}\n")
    );
    std::fs::write(dir.path().join("job.yaml"), &yaml).unwrap();
    let out = run_in(
        dir.path(),
        &["run", "job.yaml", "--summary-json", "summary.json"],
    );
    assert_ok(&out);
    let mut got = ids(&read_parquet(&dir.path().join("out.parquet")));
    got.sort_unstable();
    good.sort_unstable();
    assert_eq!(got, good, "every good record delivered");
    let mut lines = Vec::new();
    for f in std::fs::read_dir(dir.path().join("dlq")).unwrap() {
        let text = std::fs::read_to_string(f.unwrap().path()).unwrap();
        lines.extend(
            text.lines()
                .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()),
        );
    }
    assert_eq!(lines.len(), 4, "{lines:?}");
    let offsets: BTreeSet<i64> = lines
        .iter()
        .map(|l| l["offset"].as_i64().unwrap())
        .collect();
    assert_eq!(offsets, bad_offsets);
    for l in &lines {
        assert_eq!(l["topic"], topic.as_str());
        assert_eq!(l["partition"], 1);
        assert!(!l["error"].as_str().unwrap().is_empty());
        assert!(l["value_base64"].is_string());
    }
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["records_bad"], 4);
    assert_eq!(summary["records_dead_lettered"], 4);
    assert_eq!(summary["rows_written"], 96);
}

#[test]
fn truncated_ipc_goes_to_a_dead_letter_topic_and_the_budget_stops_the_run() {
    let rt = runtime();
    let (topic, dlq) = rt.block_on(async {
        (
            kafka::create_topic("dlq-ipc", 1).await,
            kafka::create_topic("dlq-ipc-dead", 1).await,
        )
    });
    // 30 IPC messages of 10 rows; every third one truncated.
    let schema = std::sync::Arc::new(arrow::datatypes::Schema::new(vec![
        arrow::datatypes::Field::new("id", arrow::datatypes::DataType::Int64, true),
    ]));
    let mut records = Vec::new();
    let mut good = Vec::new();
    for m in 0..30i64 {
        let data = RecordBatch::try_new(
            schema.clone(),
            vec![std::sync::Arc::new(
                arrow::array::Int64Array::from_iter_values(m * 10..m * 10 + 10),
            )],
        )
        .unwrap();
        let mut buf = Vec::new();
        {
            let mut w = arrow::ipc::writer::StreamWriter::try_new(&mut buf, &schema).unwrap();
            w.write(&data).unwrap();
            w.finish().unwrap();
        }
        if m % 3 == 2 {
            buf.truncate(buf.len() - 40);
        } else {
            good.extend(m * 10..m * 10 + 10);
        }
        records.push((0, buf));
    }
    rt.block_on(kafka::produce(&topic, records));
    let dir = tempfile::tempdir().unwrap();
    let job = |budget: &str| {
        format!(
            "source:\n  type: kafka\n  brokers: {b}\n  topic: {topic}\n  format: arrow_ipc\n  schema: {{id: int64}}\n  until: end\n  dead_letter: {{type: kafka, topic: {dlq}}}\n{budget}sink:\n  type: parquet\n  path: out.parquet\n",
            b = kafka::brokers()
        )
    };
    std::fs::write(dir.path().join("job.yaml"), job("")).unwrap();
    let out = run_in(dir.path(), &["run", "job.yaml"]);
    assert_ok(&out);
    let mut got = ids(&read_parquet(&dir.path().join("out.parquet")));
    got.sort_unstable();
    assert_eq!(got, good);
    let dead = kafka::read_topic(&kafka::brokers(), &dlq, 10, Duration::from_secs(20));
    let offsets: Vec<i64> = dead
        .iter()
        .map(|r| {
            let h = r
                .headers
                .iter()
                .find(|(k, _)| k == "sluice.offset")
                .unwrap();
            String::from_utf8(h.1.clone()).unwrap().parse().unwrap()
        })
        .collect();
    assert_eq!(
        offsets,
        (0..30).filter(|m| m % 3 == 2).collect::<Vec<i64>>()
    );
    assert!(dead.iter().all(|r| {
        r.headers
            .iter()
            .any(|(k, v)| k == "sluice.error" && !v.is_empty())
    }));

    // A budget of 3 bad records: the 4th stops the run, with the reason; no output file.
    std::fs::write(
        dir.path().join("budget.yaml"),
        job("  error_budget: {max_records: 3}\n").replace("out.parquet", "budget.parquet"),
    )
    .unwrap();
    let out = run_in(dir.path(), &["run", "budget.yaml"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("error budget exceeded"), "{err}");
    assert!(
        err.contains("more than `error_budget.max_records` (3)"),
        "{err}"
    );
    assert!(!dir.path().join("budget.parquet").exists());
}

#[test]
fn without_a_dead_letter_sink_the_first_bad_record_stops_the_run() {
    let rt = runtime();
    let topic = rt.block_on(async {
        let t = kafka::create_topic("nodlq", 1).await;
        kafka::produce(
            &t,
            vec![
                (0, json_record(0)),
                (0, json_record(1)),
                (0, b"{oops".to_vec()),
            ],
        )
        .await;
        t
    });
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("job.yaml"),
        format!(
            "{}sink:\n  type: parquet\n  path: out.parquet\n",
            json_source(&topic, "")
        ),
    )
    .unwrap();
    let out = run_in(dir.path(), &["run", "job.yaml"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("kafka {topic}/0 offset 2")), "{err}");
    assert!(err.contains("add `dead_letter:"), "{err}");
    assert!(!dir.path().join("out.parquet").exists());
}

/// Counts the ids `stream` delivers into `seen` until `done` holds (within 90 s, else fails
/// saying what it waited for).
async fn read_until(
    stream: &mut sluice::pipeline::BatchStream,
    seen: &mut BTreeMap<i64, usize>,
    what: &str,
    done: impl Fn(&BTreeMap<i64, usize>) -> bool,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    while !done(seen) {
        let b = tokio::time::timeout_at(deadline, stream.next())
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
            .unwrap()
            .unwrap();
        for id in ids(std::slice::from_ref(&b.data)) {
            *seen.entry(id).or_default() += 1;
        }
    }
}

/// A consumer group hands a partition back after a rebalance from its committed offset (none
/// here: nothing was acknowledged), so the consumer reads it again within the same run. The
/// replayed good rows are delivered again (at-least-once), but the replayed bad records were
/// dead-lettered and counted the first time: they are not written to the dead-letter sink or
/// counted against the error budget again.
#[test]
fn a_partition_replayed_after_a_rebalance_is_not_dead_lettered_twice() {
    let rt = runtime();
    // 2 partitions of 60 offsets; offsets 5, 30 and 47 of each are malformed.
    let bad_offsets = [5i64, 30, 47];
    let topic = rt.block_on(kafka::create_topic("replay", 2));
    let mut records = Vec::new();
    let mut good: BTreeSet<i64> = BTreeSet::new();
    for offset in 0..60i64 {
        for partition in 0..2i32 {
            let id = offset * 2 + i64::from(partition);
            if bad_offsets.contains(&offset) {
                records.push((partition, b"{\"id\": 1, \"label\"".to_vec()));
            } else {
                good.insert(id);
                records.push((partition, json_record(id)));
            }
        }
    }
    rt.block_on(kafka::produce(&topic, records));
    let group = kafka::unique("replay");
    let dir = tempfile::tempdir().unwrap();
    let consumer = |dlq: &str| {
        let yaml = format!(
            "source:\n  type: kafka\n  brokers: {}\n  topic: {topic}\n  format: json\n  schema: {JSON_SCHEMA}\n  batch_rows: 10\n  assignment: group\n  group_id: {group}\n  properties: {{session.timeout.ms: 6000, heartbeat.interval.ms: 500}}\n  dead_letter: {{type: file, path: '{}'}}\n",
            kafka::brokers(),
            dir.path().join(dlq).display()
        );
        Pipeline::from_yaml(&yaml).unwrap().stream()
    };
    let (a_bad, a_dead_lettered) = rt.block_on(async {
        let mut a = consumer("dlq-a");
        // A alone: every partition, every good row once.
        let mut seen: BTreeMap<i64, usize> = BTreeMap::new();
        read_until(
            &mut a,
            &mut seen,
            "consumer A to read the whole topic",
            |seen| seen.len() == good.len(),
        )
        .await;
        // B joins the group: the partitions are dealt again and A reads the one it keeps
        // from the start. B is polled alongside, so that it takes part in the rebalance.
        let mut b_stream = consumer("dlq-b");
        let b_task = tokio::spawn(async move {
            while let Some(b) = b_stream.next().await {
                b.unwrap();
            }
        });
        let per_partition = good.len() / 2;
        let replayed_partition = |seen: &BTreeMap<i64, usize>| {
            (0..2).any(|p| {
                seen.iter()
                    .filter(|(id, n)| *id % 2 == p && **n >= 2)
                    .count()
                    == per_partition
            })
        };
        read_until(
            &mut a,
            &mut seen,
            "consumer A to read its partition again after the rebalance",
            replayed_partition,
        )
        .await;
        b_task.abort();
        let m = a.metrics();
        let counts = (
            m.source
                .records_bad
                .load(std::sync::atomic::Ordering::Relaxed),
            m.source
                .records_dead_lettered
                .load(std::sync::atomic::Ordering::Relaxed),
        );
        drop(a);
        counts
    });
    // Every bad record of both partitions once in A's dead letters, counted once.
    let mut lines: Vec<(i64, i64)> = Vec::new();
    for f in std::fs::read_dir(dir.path().join("dlq-a")).unwrap() {
        let text = std::fs::read_to_string(f.unwrap().path()).unwrap();
        for l in text.lines() {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            lines.push((
                v["partition"].as_i64().unwrap(),
                v["offset"].as_i64().unwrap(),
            ));
        }
    }
    lines.sort_unstable();
    let expected: Vec<(i64, i64)> = (0..2)
        .flat_map(|p| bad_offsets.iter().map(move |o| (p, *o)))
        .collect();
    assert_eq!(lines, expected);
    assert_eq!((a_bad, a_dead_lettered), (6, 6));
}
