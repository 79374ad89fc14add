//! The Kafka source and sink against the real broker (Tansu, from `scripts/services.sh`).
#![allow(clippy::unwrap_used)]

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::{Float32Type, Int64Type};
use common::kafka::{self, JSON_SCHEMA, committed, json_record};
use common::{assert_ok, read_parquet, repo, spawn_sluice, wait_for};
use futures::StreamExt;
use sluice::pipeline::{Origin, Pipeline};

/// Runs `sluice` in `dir` (bounded: a hang fails the test after 2 minutes).
fn run_in(dir: &std::path::Path, args: &[&str]) -> std::process::Output {
    common::run_in_for(dir, args, Duration::from_secs(120))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn ids(batches: &[RecordBatch]) -> Vec<i64> {
    batches
        .iter()
        .flat_map(|b| {
            b.column_by_name("id")
                .unwrap()
                .as_primitive::<Int64Type>()
                .values()
                .to_vec()
        })
        .collect()
}

/// Sum over rows of `id * (x[0] + 3 x[1] + 7 x[2] + 11 x[3] + 13 label)`: changes when any
/// value moves to another row.
fn checksum(batches: &[RecordBatch]) -> f64 {
    let mut sum = 0.0f64;
    for b in batches {
        let id = b.column_by_name("id").unwrap().as_primitive::<Int64Type>();
        let label = b
            .column_by_name("label")
            .unwrap()
            .as_primitive::<Int64Type>();
        let x = b.column_by_name("x").unwrap().as_fixed_size_list();
        for r in 0..b.num_rows() {
            let row = x.value(r);
            let xv = row.as_primitive::<Float32Type>();
            let w = [1.0, 3.0, 7.0, 11.0];
            let xs: f64 = (0..4).map(|j| w[j] * xv.value(j) as f64).sum();
            sum += id.value(r) as f64 * (xs + 13.0 * label.value(r) as f64);
        }
    }
    sum
}

fn expected_checksum(n: i64) -> f64 {
    let mut sum = 0.0;
    for id in 0..n {
        let x = [id as f32 * 0.5, -(id as f32), (id % 7) as f32, 1.0];
        let w = [1.0, 3.0, 7.0, 11.0];
        let xs: f64 = (0..4).map(|j| w[j] * x[j] as f64).sum();
        sum += id as f64 * (xs + 13.0 * (id % 10) as f64);
    }
    sum
}

fn json_source(topic: &str, extra: &str) -> String {
    format!(
        "source:\n  type: kafka\n  brokers: {}\n  topic: {topic}\n  format: json\n  schema: {JSON_SCHEMA}\n  until: end\n{extra}",
        kafka::brokers()
    )
}

/// Produces ids `0..n` round-robin over `partitions`: id `i` lands in partition `i % p` at
/// offset `i / p`.
async fn produce_json(topic: &str, n: i64, partitions: i64) {
    let produced = kafka::produce(
        topic,
        (0..n).map(|i| ((i % partitions) as i32, json_record(i))),
    )
    .await;
    assert_eq!(produced as i64, n);
}

/// A new topic of `partitions` partitions holding ids `0..n` ([`produce_json`]).
fn json_topic(rt: &tokio::runtime::Runtime, name: &str, n: i64, partitions: i32) -> String {
    rt.block_on(async {
        let t = kafka::create_topic(name, partitions).await;
        produce_json(&t, n, i64::from(partitions)).await;
        t
    })
}

#[test]
fn json_topic_to_parquet_exactly_once_with_lineage() {
    let rt = runtime();
    let n = 100_000i64;
    let topic = json_topic(&rt, "json100k", n, 4);
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        "{}sink:\n  type: parquet\n  path: out.parquet\n",
        json_source(&topic, "")
    );
    std::fs::write(dir.path().join("job.yaml"), &yaml).unwrap();
    let started = Instant::now();
    let out = run_in(
        dir.path(),
        &["run", "job.yaml", "--summary-json", "summary.json"],
    );
    assert_ok(&out);
    eprintln!("sluice run: {n} records in {:?}", started.elapsed());
    let batches = read_parquet(&dir.path().join("out.parquet"));
    let mut got = ids(&batches);
    assert_eq!(got.len() as i64, n, "every record exactly once");
    got.sort_unstable();
    assert_eq!(got, (0..n).collect::<Vec<_>>());
    assert_eq!(checksum(&batches), expected_checksum(n));
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["rows_read"], n);
    assert_eq!(summary["records_bad"], 0);
    let parts = summary["partitions"].as_object().unwrap();
    assert_eq!(parts.len(), 4);
    for p in 0..4 {
        assert_eq!(parts[&format!("{topic}/{p}")]["records"], n / 4);
    }

    // The same topic through the Rust stream: every row's lineage names the partition and
    // offset it was produced at (id i ↦ partition i % 4, offset i / 4), order kept per partition.
    let pipeline = Pipeline::from_yaml(&json_source(&topic, "")).unwrap();
    let seen = rt.block_on(async {
        let mut stream = pipeline.stream();
        let mut seen = 0i64;
        let mut last: BTreeMap<i32, i64> = BTreeMap::new();
        while let Some(b) = stream.next().await {
            let b = b.unwrap();
            let id = b.data.column(0).as_primitive::<Int64Type>();
            let mut row = 0usize;
            for span in b.lineage.spans() {
                let Origin::Kafka {
                    topic: t,
                    partition,
                } = &span.origin
                else {
                    panic!("unexpected origin {:?}", span.origin);
                };
                assert_eq!(&**t, topic.as_str());
                for k in 0..span.len {
                    let offset = (span.first + k) as i64;
                    assert_eq!(id.value(row), offset * 4 + *partition as i64);
                    let prev = last.insert(*partition, offset);
                    assert!(
                        prev.is_none_or(|p| p + 1 == offset),
                        "order within a partition"
                    );
                    row += 1;
                }
            }
            assert_eq!(row, b.num_rows());
            seen += b.num_rows() as i64;
        }
        seen
    });
    assert_eq!(seen, n);
}

#[test]
fn kafka_to_kafka_arrow_ipc_round_trip_equals_input() {
    let rt = runtime();
    let n = 20_000i64;
    let (input, middle) = rt.block_on(async {
        let a = kafka::create_topic("rt-in", 3).await;
        let b = kafka::create_topic("rt-mid", 2).await;
        produce_json(&a, n, 3).await;
        (a, b)
    });
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        "{}stages:\n  - {{type: batch, size: 3000}}\nsink:\n  type: kafka\n  brokers: {}\n  topic: {middle}\n  format: arrow_ipc\n",
        json_source(&input, ""),
        kafka::brokers()
    );
    std::fs::write(dir.path().join("publish.yaml"), &yaml).unwrap();
    let out = run_in(dir.path(), &["run", "publish.yaml"]);
    assert_ok(&out);
    // Second leg: arrow_ipc with no declared schema (taken from the first message).
    let yaml = format!(
        "source:\n  type: kafka\n  brokers: {}\n  topic: {middle}\n  format: arrow_ipc\n  until: end\nsink:\n  type: parquet\n  path: back.parquet\n",
        kafka::brokers()
    );
    std::fs::write(dir.path().join("back.yaml"), &yaml).unwrap();
    let out = run_in(dir.path(), &["run", "back.yaml"]);
    assert_ok(&out);
    let batches = read_parquet(&dir.path().join("back.parquet"));
    let mut got = ids(&batches);
    assert_eq!(got.len() as i64, n);
    got.sort_unstable();
    assert_eq!(got, (0..n).collect::<Vec<_>>());
    assert_eq!(checksum(&batches), expected_checksum(n));
}

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

/// A Kafka sink whose brokers are down stops within `connect_timeout`, naming them, and logs
/// librdkafka's repeated errors once each (they were 120-odd lines in 3 s).
#[test]
fn a_sink_with_unreachable_brokers_fails_fast_and_quietly() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("down.yaml"),
        format!(
            "source: {{type: parquet, path: '{}/data/digits/train.parquet'}}\nsink: {{type: kafka, brokers: '127.0.0.1:9', topic: t, format: json, connect_timeout: 3s}}\n",
            repo().display()
        ),
    )
    .unwrap();
    let out = run_in(dir.path(), &["run", "down.yaml"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot reach the brokers 127.0.0.1:9 within 3.0s"),
        "{err}"
    );
    assert!(err.matches("1/1 brokers are down").count() <= 1, "{err}");
    assert!(err.lines().count() < 20, "{err}");
}

#[test]
fn unreachable_broker_and_unknown_topic_fail_fast_and_clearly() {
    let dir = tempfile::tempdir().unwrap();
    // Port 9 on loopback (discard) is closed here.
    std::fs::write(
        dir.path().join("down.yaml"),
        format!(
            "source:\n  type: kafka\n  brokers: 127.0.0.1:9\n  topic: t\n  format: json\n  schema: {JSON_SCHEMA}\n  connect_timeout: 3s\n"
        ),
    )
    .unwrap();
    let started = Instant::now();
    let out = run_in(dir.path(), &["run", "down.yaml"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("127.0.0.1:9"), "{err}");
    assert!(err.contains("cannot reach the brokers within 3s"), "{err}");
    // librdkafka repeats its errors (hundreds of "all brokers down"): each is logged once.
    assert!(err.matches("1/1 brokers are down").count() <= 1, "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );

    std::fs::write(
        dir.path().join("missing.yaml"),
        format!(
            "source:\n  type: kafka\n  brokers: {}\n  topic: no-such-topic-here\n  format: json\n  schema: {JSON_SCHEMA}\n",
            kafka::brokers()
        ),
    )
    .unwrap();
    let out = run_in(dir.path(), &["run", "missing.yaml"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("topic `no-such-topic-here` does not exist"),
        "{err}"
    );

    // A Kafka sink to a topic that does not exist is refused before anything runs.
    std::fs::write(
        dir.path().join("sink.yaml"),
        format!(
            "source: {{type: parquet, path: {}}}\nsink:\n  type: kafka\n  brokers: {}\n  topic: no-such-sink-topic\n  format: json\n",
            common::repo().join("data/digits/test.parquet").display(),
            kafka::brokers()
        ),
    )
    .unwrap();
    let out = run_in(dir.path(), &["run", "sink.yaml"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no-such-sink-topic"), "{err}");
    assert!(err.contains("does not exist"), "{err}");
}

#[test]
fn until_end_finishes_with_empty_partitions_and_group_assignment() {
    let rt = runtime();
    let topic = rt.block_on(async {
        let t = kafka::create_topic("sparse", 3).await;
        kafka::produce(&t, (0..10).map(|i| (0, json_record(i)))).await;
        t
    });
    for extra in [
        "".to_string(),
        format!(
            "  assignment: group\n  group_id: {}\n  properties: {{session.timeout.ms: 6000}}\n",
            kafka::unique("g")
        ),
    ] {
        let pipeline = Pipeline::from_yaml(&json_source(&topic, &extra)).unwrap();
        let rows = rt.block_on(async {
            let mut s = pipeline.stream();
            let mut rows = 0;
            while let Some(b) = s.next().await {
                rows += b.unwrap().num_rows();
            }
            rows
        });
        assert_eq!(rows, 10, "{extra}");
    }
}

/// With a backlog, librdkafka fetches each partition in blocks of up to 1 MiB (here ~17k of
/// these records): read in fetch order, the stream would be one partition after another, and
/// a shuffle window would hold a single partition (measured before: of the first 2000 records,
/// two of the four partitions had none). A `static` reader takes the partitions in turn, 256
/// records each, so every stretch of the stream mixes all of them; each partition still
/// arrives in offset order, and every record once.
#[test]
fn a_backlog_reaches_the_stream_with_the_partitions_interleaved() {
    let rt = runtime();
    let n = 40_000i64;
    let topic = json_topic(&rt, "backlog", n, 4);
    // A turn waits up to `batch_timeout` for a partition that has nothing yet; long here, so
    // that a slow fetch on a loaded machine cannot let the others run ahead.
    let source = json_source(&topic, "  batch_rows: 250\n  batch_timeout: 5s\n");
    let pipeline = Pipeline::from_yaml(&source).unwrap();
    let all = rt.block_on(async {
        let mut s = pipeline.stream();
        let mut all = Vec::new();
        while let Some(b) = s.next().await {
            all.extend(ids(&[b.unwrap().data]));
        }
        all
    });
    let mut sorted = all.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..n).collect::<Vec<_>>(), "every record once");
    // Id `i` is partition `i % 4`, offset `i / 4`: each partition ascends.
    let mut last = [-1i64; 4];
    for &id in &all {
        let p = (id % 4) as usize;
        assert!(id > last[p], "partition {p}: {id} after {}", last[p]);
        last[p] = id;
    }
    // Every stretch of 4096 records (four turns of 256 records per partition) holds every
    // partition, about equally.
    for (k, stretch) in all.chunks(4096).enumerate() {
        let mut per = [0usize; 4];
        for &id in stretch {
            per[(id % 4) as usize] += 1;
        }
        assert!(
            per.iter().all(|&c| c >= 700),
            "records {}..{}: {per:?} per partition",
            4096 * k,
            4096 * (k + 1)
        );
    }
}

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

#[test]
fn authentication_failure_is_reported_within_the_timeout_without_the_secret() {
    let dir = tempfile::tempdir().unwrap();
    let port = kafka::free_port();
    let url = format!("tcp://127.0.0.1:{port}");
    let mut broker = std::process::Command::new(kafka::tansu())
        .args([
            "broker",
            "--listener-url",
            &url,
            "--advertised-listener-url",
            &url,
            "--storage-engine",
            "memory://tansu/",
            "--authentication",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_for("the broker to listen", Duration::from_secs(30), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).ok()
    });
    std::fs::write(
        dir.path().join("job.yaml"),
        format!(
            "source:\n  type: kafka\n  brokers: 127.0.0.1:{port}\n  topic: t\n  format: raw\n  connect_timeout: 3s\n  properties:\n    security.protocol: SASL_PLAINTEXT\n    sasl.mechanism: SCRAM-SHA-256\n    sasl.username: alice\n    sasl.password: not-the-password-8d1f\n"
        ),
    )
    .unwrap();
    let started = Instant::now();
    let out = run_in(dir.path(), &["run", "job.yaml"]);
    broker.kill().unwrap();
    broker.wait().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(started.elapsed() < Duration::from_secs(30));
    let err = String::from_utf8_lossy(&out.stderr);
    let last = err.lines().last().unwrap_or_default();
    assert!(last.contains("cannot reach the brokers within 3s"), "{err}");
    assert!(last.contains("SASL authentication error"), "{last}");
    assert!(
        !err.contains("not-the-password-8d1f"),
        "the secret leaked: {err}"
    );
    let out = String::from_utf8_lossy(&out.stdout);
    assert!(!out.contains("not-the-password-8d1f"));
}

#[test]
fn raw_format_keeps_keys_headers_and_timestamps_and_starts_at_a_timestamp() {
    use arrow::array::Array;
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::FutureRecord;
    let rt = runtime();
    let topic = rt.block_on(kafka::create_topic("raw", 1));
    // Ten records with timestamps 1_000_000 + i*1000 ms; odd ones carry a header, even ones a key.
    rt.block_on(async {
        let p = kafka::producer(&kafka::brokers());
        for i in 0..10i64 {
            let value = format!("value-{i}");
            let key = format!("key-{i}");
            let mut rec: FutureRecord<'_, str, str> = FutureRecord::to(&topic)
                .payload(value.as_str())
                .timestamp(1_000_000 + i * 1000);
            if i % 2 == 0 {
                rec = rec.key(key.as_str());
            } else {
                rec = rec.headers(OwnedHeaders::new().insert(Header {
                    key: "trace",
                    value: Some(key.as_bytes()),
                }));
            }
            p.send(rec, Duration::from_secs(10)).await.unwrap();
        }
    });
    let yaml = |start: &str| {
        format!(
            "source:\n  type: kafka\n  brokers: {}\n  topic: {topic}\n  format: raw\n  until: end\n{start}",
            kafka::brokers()
        )
    };
    let read = |yaml: String| {
        rt.block_on(async {
            let mut s = Pipeline::from_yaml(&yaml).unwrap().stream();
            let mut out = Vec::new();
            while let Some(b) = s.next().await {
                out.push(b.unwrap().data);
            }
            out
        })
    };
    let all = read(yaml(""));
    let b = arrow::compute::concat_batches(&all[0].schema(), &all).unwrap();
    assert_eq!(b.num_rows(), 10);
    let schema = b.schema();
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    assert_eq!(names, ["key", "value", "timestamp", "headers"]);
    let key = b.column(0).as_binary::<i32>();
    let value = b.column(1).as_binary::<i32>();
    let ts = b
        .column(2)
        .as_primitive::<arrow::datatypes::TimestampMillisecondType>();
    let headers = b.column(3).as_list::<i32>();
    for i in 0..10usize {
        assert_eq!(value.value(i), format!("value-{i}").as_bytes());
        assert_eq!(ts.value(i), 1_000_000 + i as i64 * 1000);
        if i % 2 == 0 {
            assert_eq!(key.value(i), format!("key-{i}").as_bytes());
            assert_eq!(headers.value(i).len(), 0);
        } else {
            assert!(key.is_null(i));
            let h = headers.value(i);
            let h = h.as_struct();
            assert_eq!(h.len(), 1);
            assert_eq!(h.column(0).as_string::<i32>().value(0), "trace");
            assert_eq!(
                h.column(1).as_binary::<i32>().value(0),
                format!("key-{i}").as_bytes()
            );
        }
    }
    // From a timestamp: the first record at or after it.
    let late = read(yaml("  start: {timestamp: 1006500}\n"));
    let rows: usize = late.iter().map(RecordBatch::num_rows).sum();
    assert_eq!(rows, 3, "records 7, 8, 9");
    let first = late[0].column(1).as_binary::<i32>().value(0).to_vec();
    assert_eq!(first, b"value-7");
}

#[test]
fn json_sink_publishes_one_keyed_message_per_row_and_duration_bounds_a_run() {
    let rt = runtime();
    let topic = rt.block_on(kafka::create_topic("json-sink", 2));
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("job.yaml"),
        format!(
            "source: {{type: parquet, path: {}, columns: [id, label]}}\nsink:\n  type: kafka\n  brokers: {}\n  topic: {topic}\n  format: json\n  key: id\n",
            common::repo().join("data/digits/test.parquet").display(),
            kafka::brokers()
        ),
    )
    .unwrap();
    let out = run_in(dir.path(), &["run", "job.yaml"]);
    assert_ok(&out);
    let got = kafka::read_topic(&kafka::brokers(), &topic, 360, Duration::from_secs(30));
    let mut ids = BTreeSet::new();
    for r in &got {
        let v: serde_json::Value = serde_json::from_slice(r.value.as_ref().unwrap()).unwrap();
        let id = v["id"].as_i64().unwrap();
        assert_eq!(r.key.as_deref(), Some(id.to_string().as_bytes()));
        assert!(v["label"].is_i64());
        ids.insert(id);
    }
    assert_eq!(ids.len(), 360);

    // An unbounded source with `until: {duration}` ends on time with what it read.
    let started = Instant::now();
    let yaml = format!(
        "source:\n  type: kafka\n  brokers: {}\n  topic: {topic}\n  format: json\n  schema: {{id: int64, label: int64}}\n  until: {{duration: 2s}}\n",
        kafka::brokers()
    );
    let rows = rt.block_on(async {
        let mut s = Pipeline::from_yaml(&yaml).unwrap().stream();
        let mut rows = 0;
        while let Some(b) = s.next().await {
            rows += b.unwrap().num_rows();
        }
        rows
    });
    assert_eq!(rows, 360);
    assert!(started.elapsed() >= Duration::from_secs(2));
    assert!(started.elapsed() < Duration::from_secs(30));
}

/// Reads a pipeline to the end: each batch's ids and the state just past it.
fn ids_and_states(
    rt: &tokio::runtime::Runtime,
    pipeline: Pipeline,
) -> Vec<(Vec<i64>, sluice::pipeline::SourceState)> {
    per_batch(rt, pipeline, |_| ())
        .into_iter()
        .map(|(ids, (), state)| (ids, state))
        .collect()
}

/// Every batch of `pipeline`: its ids (column 0), `f` of it, and the state after it.
fn per_batch<T>(
    rt: &tokio::runtime::Runtime,
    pipeline: Pipeline,
    f: impl Fn(&sluice::pipeline::Batch) -> T,
) -> Vec<(Vec<i64>, T, sluice::pipeline::SourceState)> {
    rt.block_on(async {
        let mut s = pipeline.stream();
        let mut out = Vec::new();
        while let Some(b) = s.next().await {
            let b = b.unwrap();
            let ids = b
                .data
                .column(0)
                .as_primitive::<Int64Type>()
                .values()
                .to_vec();
            out.push((ids, f(&b), s.snapshot()));
        }
        out
    })
}

/// A shuffled Kafka stream, interrupted after `k` batches and resumed from the state (through
/// JSON, as a checkpoint stores it): every id exactly once, and the rest of the window being
/// emitted comes out exactly as the uninterrupted run emitted it, although the partitions'
/// rows arrive interleaved differently the second time.
fn resume_a_shuffled_stream(
    rt: &tokio::runtime::Runtime,
    source: &str,
    n: i64,
    locate: &dyn Fn(i64) -> (i64, i64),
    partitions: usize,
    k: usize,
) {
    let yaml = format!(
        "{source}stages:\n  - {{type: shuffle, buffer_rows: 1000, seed: 7, batch_rows: 100}}\n"
    );
    let full = ids_and_states(rt, Pipeline::from_yaml(&yaml).unwrap());
    let all: Vec<i64> = full.iter().flat_map(|(ids, _)| ids.clone()).collect();
    let mut sorted = all.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..n).collect::<Vec<_>>(), "every row exactly once");
    // Shuffled: about half of the neighbours ascend (the input ascends within partitions).
    let ascending = all.windows(2).filter(|w| w[0] < w[1]).count() as f64 / (n - 1) as f64;
    assert!(
        (0.4..0.6).contains(&ascending),
        "{ascending} of neighbours ascend"
    );
    // Windows take rows as they arrive, the partitions in turn: the first output window holds,
    // of every partition, its first rows (`locate`: id → partition, row position in it).
    let mut firsts: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
    for &id in &all[..1000] {
        let (partition, position) = locate(id);
        firsts.entry(partition).or_default().push(position);
    }
    assert_eq!(
        firsts.len(),
        partitions,
        "the first window mixes every partition"
    );
    for positions in firsts.values_mut() {
        positions.sort_unstable();
        assert_eq!(*positions, (0..positions.len() as i64).collect::<Vec<_>>());
    }

    let state = full[k - 1].1.clone();
    let window = state.kafka_shuffle.clone().unwrap();
    let delivered: usize = full[..k].iter().map(|(ids, _)| ids.len()).sum();
    assert!(
        window.rows == 1000 && window.emitted > 0 && window.emitted < 1000,
        "the state is taken inside a window: {window:?}"
    );
    let state: sluice::pipeline::SourceState =
        serde_json::from_str(&serde_json::to_string(&state).unwrap()).unwrap();
    let rest = ids_and_states(
        rt,
        Pipeline::from_yaml(&yaml)
            .unwrap()
            .resume_from(state.clone()),
    );
    let rest: Vec<i64> = rest.into_iter().flat_map(|(ids, _)| ids).collect();
    let left = (window.rows - window.emitted) as usize;
    assert_eq!(
        rest[..left],
        all[delivered..delivered + left],
        "the window's remaining rows, in the same order"
    );
    let mut joined: Vec<i64> = all[..delivered].iter().chain(&rest).copied().collect();
    assert_eq!(joined.len() as i64, n, "no row twice, none missing");
    joined.sort_unstable();
    assert_eq!(joined, (0..n).collect::<Vec<_>>());

    // Another seed would emit the window in another order: refused, saying so.
    let other = yaml.replace("seed: 7", "seed: 8");
    let err = rt
        .block_on(async {
            let mut s = Pipeline::from_yaml(&other)
                .unwrap()
                .resume_from(state)
                .stream();
            s.next().await.unwrap()
        })
        .unwrap_err()
        .to_string();
    assert!(err.contains("seed 7 then, seed 8 now"), "{err}");
}

#[test]
fn a_shuffled_kafka_stream_resumes_inside_a_window_exactly() {
    let rt = runtime();
    let n = 6000i64;
    let topic = json_topic(&rt, "shuffle-json", n, 4);
    // (A long `batch_timeout`: the partitions' turns wait for each other that long.)
    let source = json_source(&topic, "  batch_rows: 250\n  batch_timeout: 5s\n");
    resume_a_shuffled_stream(&rt, &source, n, &|id| (id % 4, id / 4), 4, 25);
}

#[test]
fn a_shuffled_stream_of_many_row_messages_resumes_where_a_window_splits_a_message() {
    use arrow::array::Int64Array;
    let rt = runtime();
    // 700 messages of 7 rows over 3 partitions: windows of 1000 rows end inside messages.
    let n = 4900i64;
    let schema = std::sync::Arc::new(arrow::datatypes::Schema::new(vec![
        arrow::datatypes::Field::new("id", arrow::datatypes::DataType::Int64, false),
    ]));
    let messages: Vec<(i32, Vec<u8>)> = (0..n / 7)
        .map(|m| {
            let rb = RecordBatch::try_new(
                schema.clone(),
                vec![std::sync::Arc::new(Int64Array::from_iter_values(
                    m * 7..m * 7 + 7,
                ))],
            )
            .unwrap();
            let mut buf = Vec::new();
            let mut w = arrow::ipc::writer::StreamWriter::try_new(&mut buf, &schema).unwrap();
            w.write(&rb).unwrap();
            w.finish().unwrap();
            drop(w);
            ((m % 3) as i32, buf)
        })
        .collect();
    let topic = rt.block_on(async {
        let t = kafka::create_topic("shuffle-ipc", 3).await;
        assert_eq!(kafka::produce(&t, messages).await as i64, n / 7);
        t
    });
    let source = format!(
        "source:\n  type: kafka\n  brokers: {}\n  topic: {topic}\n  format: arrow_ipc\n  schema: {{id: int64}}\n  until: end\n  batch_timeout: 5s\n",
        kafka::brokers()
    );
    // After 2700 rows: inside the third window, which starts and ends inside messages.
    let locate = |id: i64| ((id / 7) % 3, id / 21 * 7 + id % 7);
    resume_a_shuffled_stream(&rt, &source, n, &locate, 3, 27);
}

/// Offsets of the records in one dead-letter directory, sorted (a record written twice shows
/// twice).
fn dead_lettered(dir: &std::path::Path) -> Vec<i64> {
    let mut offsets = Vec::new();
    for f in std::fs::read_dir(dir).into_iter().flatten() {
        let text = std::fs::read_to_string(f.unwrap().path()).unwrap();
        for l in text.lines() {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            assert_eq!(v["partition"], 1, "{v}");
            offsets.push(v["offset"].as_i64().unwrap());
        }
    }
    offsets.sort_unstable();
    offsets
}

#[test]
fn a_resumed_shuffle_window_does_not_dead_letter_its_bad_records_again() {
    let rt = runtime();
    // Ids 0..4000 over 4 partitions; partition 1 also holds a bad message after every 10th
    // of its good ones.
    let topic = rt.block_on(kafka::create_topic("dlq-shuffle", 4));
    let mut records: Vec<(i32, Vec<u8>)> = Vec::new();
    let mut next = [0i64; 4];
    let mut bad = Vec::new();
    for id in 0..4000i64 {
        let p = (id % 4) as usize;
        records.push((p as i32, json_record(id)));
        next[p] += 1;
        if id % 40 == 1 {
            records.push((1, format!("not json {id}").into_bytes()));
            bad.push(next[1]);
            next[1] += 1;
        }
    }
    assert_eq!(rt.block_on(kafka::produce(&topic, records)), 4100);
    let dir = tempfile::tempdir().unwrap();
    let yaml_with = |dlq: &str, budget: &str| {
        let source = json_source(
            &topic,
            &format!(
                "  batch_rows: 250\n  batch_timeout: 5s\n  dead_letter: {{type: file, path: '{}'}}\n{budget}",
                dir.path().join(dlq).display()
            ),
        );
        format!(
            "{source}stages:\n  - {{type: shuffle, buffer_rows: 1000, seed: 7, batch_rows: 100}}\n"
        )
    };
    let yaml = |dlq: &str| yaml_with(dlq, "");
    let full = ids_and_states(&rt, Pipeline::from_yaml(&yaml("full")).unwrap());
    assert_eq!(dead_lettered(&dir.path().join("full")), bad, "each once");
    // Every state carries the error budget's counts below its positions: the topic's offsets
    // are dense, so the records below are the positions' sum, and the bad ones are known.
    for (_, s) in &full {
        let k = s.kafka.as_ref().unwrap();
        let below: i64 = (0..4)
            .filter_map(|p| k.get(&topic, p))
            .map(|p| p.offset)
            .sum();
        let p1 = k.get(&topic, 1).map_or(0, |p| p.offset);
        let expected = sluice::pipeline::ErrorCounts {
            records: below as u64,
            bad: bad.iter().filter(|&&o| o < p1).count() as u64,
        };
        assert_eq!(s.kafka_errors, Some(expected));
    }
    assert_eq!(
        full.last().unwrap().1.kafka_errors,
        Some(sluice::pipeline::ErrorCounts {
            records: 4100,
            bad: 100
        })
    );

    // A state inside a window whose rows of partition 1 are read again on resume (from the
    // window's start to the position) and hold bad records.
    let position = |s: &sluice::pipeline::SourceState| {
        s.kafka.as_ref().unwrap().get(&topic, 1).unwrap().offset
    };
    let (k, state) = full
        .iter()
        .enumerate()
        .map(|(i, (_, s))| (i + 1, s.clone()))
        .find(|(_, s)| {
            let Some(w) = &s.kafka_shuffle else {
                return false;
            };
            let Some(start) = w.starts.get(&topic, 1) else {
                return false;
            };
            w.rows > 0 && w.emitted > 0 && bad.iter().any(|&o| start.offset <= o && o < position(s))
        })
        .expect("a state inside a window holding bad records");
    let rest = ids_and_states(
        &rt,
        Pipeline::from_yaml(&yaml("resumed"))
            .unwrap()
            .resume_from(state.clone()),
    );
    let mut ids: Vec<i64> = full[..k]
        .iter()
        .chain(&rest)
        .flat_map(|(ids, _)| ids.clone())
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..4000).collect::<Vec<_>>(), "every good row once");
    let after: Vec<i64> = bad
        .iter()
        .copied()
        .filter(|&o| o >= position(&state))
        .collect();
    assert!(after.len() < bad.len());
    assert_eq!(
        dead_lettered(&dir.path().join("resumed")),
        after,
        "the resumed run writes the bad records past its position, once each"
    );
    // The resumed run goes on from the counts of the run it continues: it ends where the
    // uninterrupted one did, and its error budget is the whole run's — 100 bad records
    // pass `max_records: 100` and stop `max_records: 99`, with the earlier ones named.
    assert_eq!(
        rest.last().unwrap().1.kafka_errors,
        full.last().unwrap().1.kafka_errors
    );
    let resumed_with = |max: u64| {
        let yaml = yaml_with(
            &format!("budget-{max}"),
            &format!("  error_budget: {{max_records: {max}}}\n"),
        );
        let pipeline = Pipeline::from_yaml(&yaml)
            .unwrap()
            .resume_from(state.clone());
        rt.block_on(async {
            let mut s = pipeline.stream();
            while let Some(b) = s.next().await {
                if let Err(e) = b {
                    return Err(e.to_string());
                }
            }
            Ok(())
        })
    };
    resumed_with(100).unwrap();
    let e = resumed_with(99).unwrap_err();
    let before = state.kafka_errors.unwrap();
    assert!(
        e.contains("100 records could not be decoded, more than `error_budget.max_records` (99)")
            && e.contains(&format!(
                "{} of the {} records before this resumed run were bad",
                before.bad, before.records
            )),
        "{e}"
    );
}

#[test]
fn a_shuffle_of_a_kafka_stream_needs_static_assignment_and_no_exchange() {
    let rt = runtime();
    for (extra, stage, expected) in [
        (
            "  assignment: group\n  group_id: g\n",
            "",
            "needs `assignment: static`",
        ),
        (
            "",
            ", across_ranks: true",
            "`across_ranks` needs a Parquet source",
        ),
    ] {
        let yaml = format!(
            "{}stages:\n  - {{type: shuffle, buffer_rows: 10{stage}}}\n",
            json_source("t", extra)
        );
        let err = rt
            .block_on(Pipeline::from_yaml(&yaml).unwrap().prepare())
            .unwrap_err()
            .to_string();
        assert!(err.contains(expected), "{err}");
    }
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

/// `group_by_length` over a shuffled Kafka stream of token lists, against the broker: every
/// record once, far less padding than the same shuffle without it, and a run interrupted
/// inside a window resumes with exactly the batches the uninterrupted run delivered next.
#[test]
fn grouping_a_kafka_stream_by_length_pads_less_and_resumes_exactly() {
    use arrow::datatypes::Int32Type;
    let rt = runtime();
    let n = 4000i64;
    let len = |id: i64| (id * 7919 % 100 + 1) as usize;
    let topic = rt.block_on(async {
        let t = kafka::create_topic("group-length", 4).await;
        let records = (0..n).map(|i| {
            let toks: Vec<String> = (0..len(i)).map(|t| t.to_string()).collect();
            (
                (i % 4) as i32,
                format!(r#"{{"id": {i}, "toks": [{}]}}"#, toks.join(",")).into_bytes(),
            )
        });
        assert_eq!(kafka::produce(&t, records).await as i64, n);
        t
    });
    let yaml = |group: &str| {
        format!(
            "source:\n  type: kafka\n  brokers: {}\n  topic: {topic}\n  format: json\n  schema: {{id: int64, toks: \"list<int32>\"}}\n  until: end\n  batch_rows: 250\n  batch_timeout: 5s\nstages:\n  - type: shuffle\n    buffer_rows: 1024\n    seed: 7\n{group}  - {{type: batch, size: 32}}\n",
            kafka::brokers()
        )
    };
    // Each batch's ids and padding to its longest row, with the state after it.
    let batches = |p: Pipeline| {
        per_batch(&rt, p, |b| {
            let lens: Vec<usize> = b
                .data
                .column(1)
                .as_list::<i32>()
                .iter()
                .map(|l| l.unwrap().as_primitive::<Int32Type>().len())
                .collect();
            let longest = lens.iter().copied().max().unwrap_or(0);
            lens.iter().map(|l| longest - l).sum::<usize>()
        })
    };
    let grouping = "    group_by_length: {column: toks, batches: 8}\n";
    let grouped = batches(Pipeline::from_yaml(&yaml(grouping)).unwrap());
    let plain = batches(Pipeline::from_yaml(&yaml("")).unwrap());
    for run in [&grouped, &plain] {
        let mut ids: Vec<i64> = run.iter().flat_map(|(ids, _, _)| ids.clone()).collect();
        ids.sort_unstable();
        assert_eq!(ids, (0..n).collect::<Vec<_>>(), "every record once");
    }
    let padding = |run: &[(Vec<i64>, usize, sluice::pipeline::SourceState)]| {
        run.iter().map(|(_, p, _)| p).sum::<usize>()
    };
    assert!(
        padding(&grouped) * 4 < padding(&plain),
        "padding {} grouped, {} plain",
        padding(&grouped),
        padding(&plain)
    );
    // Interrupted inside the second window (32 batches of 32 a window), resumed.
    let k = 45;
    let state = grouped[k - 1].2.clone();
    let window = state.kafka_shuffle.clone().unwrap();
    assert!(
        window.emitted > 0 && window.emitted < window.rows,
        "{window:?}"
    );
    let state: sluice::pipeline::SourceState =
        serde_json::from_str(&serde_json::to_string(&state).unwrap()).unwrap();
    let rest = batches(
        Pipeline::from_yaml(&yaml(grouping))
            .unwrap()
            .resume_from(state),
    );
    let rest: Vec<Vec<i64>> = rest.into_iter().map(|(ids, _, _)| ids).collect();
    let expected: Vec<Vec<i64>> = grouped[k..].iter().map(|(ids, _, _)| ids.clone()).collect();
    assert_eq!(rest, expected, "the batches after the state");
}
