//! The Kafka source and sink against the real broker (Tansu, from `scripts/services.sh`):
//! reading a topic (JSON, Arrow IPC, raw records; to its end, the partitions interleaved) and
//! publishing to one. The helpers the other `kafka_*` files share are here.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::{Float32Type, Int64Type};
use common::kafka::{self, JSON_SCHEMA, json_record};
use common::{assert_ok, read_parquet};
use futures::StreamExt;
use sluice::pipeline::{Origin, Pipeline};

/// Runs `sluice` in `dir` (bounded: a hang fails the test after 2 minutes).
pub(crate) fn run_in(dir: &std::path::Path, args: &[&str]) -> std::process::Output {
    common::run_in_for(dir, args, Duration::from_secs(120))
}

pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

pub(crate) fn ids(batches: &[RecordBatch]) -> Vec<i64> {
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

pub(crate) fn json_source(topic: &str, extra: &str) -> String {
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
pub(crate) fn json_topic(
    rt: &tokio::runtime::Runtime,
    name: &str,
    n: i64,
    partitions: i32,
) -> String {
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
