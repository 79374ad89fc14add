//! Kafka consume rate: a bare rdkafka consumer (poll, touch the payload, nothing else) against
//! Sluice's kafka source turning the same topic into Arrow batches, for `json` and
//! `arrow_ipc` topics, in one run against the same broker.
//!
//! Needs a Kafka-protocol broker: `eval "$(scripts/services.sh start)"` starts one (Tansu) and
//! sets `SLUICE_TEST_KAFKA_BROKERS`. Then `cargo bench --bench kafka`. Under `cargo test`
//! (CI) it runs once at a small size as a smoke test.
//!
//! Each variant reads the whole topic from the beginning `REPEATS` times; the best time
//! counts. Sluice runs with `until: {records: N}` in rows (an `arrow_ipc` message counts as its
//! rows), the bare consumer stops at the messages that hold them.
#![allow(clippy::unwrap_used, clippy::print_stdout)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{FixedSizeListArray, Float32Array, Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::ipc::CompressionType;
use arrow::ipc::writer::{IpcWriteOptions, StreamWriter};
use futures::StreamExt;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use sluice::pipeline::Pipeline;

const REPEATS: usize = 3;
const PARTITIONS: i32 = 4;
const FEATURES: usize = 16;
/// Rows per Arrow IPC message.
const IPC_ROWS: usize = 2048;

fn brokers() -> String {
    std::env::var("SLUICE_TEST_KAFKA_BROKERS").unwrap_or_else(|_| {
        eprintln!(
            "benches/kafka.rs needs a broker: run `eval \"$(scripts/services.sh start)\"` first"
        );
        std::process::exit(2)
    })
}

async fn create_topic(brokers: &str, name: &str) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .unwrap();
    let t = NewTopic::new(name, PARTITIONS, TopicReplication::Fixed(1));
    for r in admin
        .create_topics([&t], &AdminOptions::new())
        .await
        .unwrap()
    {
        r.unwrap();
    }
}

async fn produce(brokers: &str, topic: &str, messages: Vec<Vec<u8>>) {
    let p: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("linger.ms", "20")
        .set("batch.size", "1000000")
        .create()
        .unwrap();
    let mut pending = std::collections::VecDeque::new();
    for (i, m) in messages.iter().enumerate() {
        let mut rec: FutureRecord<'_, (), [u8]> = FutureRecord::to(topic)
            .partition(i as i32 % PARTITIONS)
            .payload(m);
        loop {
            match p.send_result(rec) {
                Ok(f) => {
                    pending.push_back(f);
                    break;
                }
                Err((_, back)) => {
                    rec = back;
                    if let Some(f) = pending.pop_front() {
                        f.await.unwrap().unwrap();
                    }
                }
            }
        }
    }
    for f in pending {
        f.await.unwrap().unwrap();
    }
}

fn json_messages(rows: usize) -> Vec<Vec<u8>> {
    (0..rows)
        .map(|i| {
            let xs: Vec<String> = (0..FEATURES)
                .map(|j| format!("{:.3}", ((i * 31 + j * 7) % 1000) as f32 / 10.0))
                .collect();
            format!(
                r#"{{"id": {i}, "label": {}, "x": [{}]}}"#,
                i % 10,
                xs.join(", ")
            )
            .into_bytes()
        })
        .collect()
}

fn ipc_messages(rows: usize) -> Vec<Vec<u8>> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, true),
        Field::new("label", DataType::Int64, true),
        Field::new(
            "x",
            DataType::FixedSizeList(
                Arc::new(Field::new("item", DataType::Float32, true)),
                FEATURES as i32,
            ),
            true,
        ),
    ]));
    let options = IpcWriteOptions::default()
        .try_with_compression(Some(CompressionType::ZSTD))
        .unwrap();
    (0..rows)
        .step_by(IPC_ROWS)
        .map(|start| {
            let n = IPC_ROWS.min(rows - start);
            // Pseudo-random features (xorshift): realistic, barely compressible payloads.
            let mut r: u64 = 0x9e3779b97f4a7c15 ^ start as u64;
            let values: Vec<f32> = (0..n * FEATURES)
                .map(|_| {
                    r ^= r << 13;
                    r ^= r >> 7;
                    r ^= r << 17;
                    (r % 100_000) as f32 / 1000.0
                })
                .collect();
            let x = FixedSizeListArray::try_new(
                Arc::new(Field::new("item", DataType::Float32, true)),
                FEATURES as i32,
                Arc::new(Float32Array::from(values)),
                None,
            )
            .unwrap();
            let batch = RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(Int64Array::from_iter_values(
                        start as i64..(start + n) as i64,
                    )),
                    Arc::new(Int64Array::from_iter_values(
                        (start..start + n).map(|i| (i % 10) as i64),
                    )),
                    Arc::new(x),
                ],
            )
            .unwrap();
            let mut buf = Vec::new();
            let mut w =
                StreamWriter::try_new_with_options(&mut buf, &schema, options.clone()).unwrap();
            w.write(&batch).unwrap();
            w.finish().unwrap();
            drop(w);
            buf
        })
        .collect()
}

/// Bare consumer: every message polled and its payload touched; returns (messages, bytes).
fn raw_consume(brokers: &str, topic: &str, messages: usize) -> (usize, usize) {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", "sluice-bench-raw")
        .set("enable.auto.commit", "false")
        // The prefetch bound Sluice's source uses, so both read under the same settings.
        .set("queued.max.messages.kbytes", "16384")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .unwrap();
    }
    c.assign(&tpl).unwrap();
    let (mut n, mut bytes) = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(300);
    while n < messages {
        assert!(Instant::now() < deadline, "raw consumer stalled at {n}");
        if let Some(m) = c.poll(Duration::from_millis(100)) {
            let m = m.unwrap();
            bytes += m.payload().map_or(0, |p| p.len());
            n += 1;
        }
    }
    (n, bytes)
}

/// Sluice: the topic as Arrow batches (shuffled in windows of 100k rows with `shuffle`);
/// returns rows.
async fn sluice_consume(
    brokers: &str,
    topic: &str,
    format: &str,
    rows: usize,
    shuffle: bool,
) -> usize {
    let schema = if format == "json" {
        format!("  schema: {{id: int64, label: int64, x: \"float32[{FEATURES}]\"}}\n")
    } else {
        String::new()
    };
    let stages = match shuffle {
        true => "stages:\n  - {type: shuffle, buffer_rows: 100000, seed: 1}\n",
        false => "",
    };
    let yaml = format!(
        "source:\n  type: kafka\n  brokers: {brokers}\n  topic: {topic}\n  format: {format}\n{schema}  until: {{records: {rows}}}\n{stages}"
    );
    let mut s = Pipeline::from_yaml(&yaml).unwrap().stream();
    let mut rows = 0;
    while let Some(b) = s.next().await {
        rows += b.unwrap().num_rows();
    }
    rows
}

fn best<F: FnMut() -> usize>(mut f: F) -> (Duration, usize) {
    let mut best = Duration::MAX;
    let mut out = 0;
    for _ in 0..REPEATS {
        let t = Instant::now();
        out = f();
        best = best.min(t.elapsed());
    }
    (best, out)
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let rows = if full { 1_000_000 } else { 8_000 };
    let brokers = brokers();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let stamp = std::process::id();
    let json_topic = format!("bench-json-{stamp}");
    let ipc_topic = format!("bench-ipc-{stamp}");
    let json = json_messages(rows);
    let ipc = ipc_messages(rows);
    let (json_n, ipc_n) = (json.len(), ipc.len());
    let json_bytes: usize = json.iter().map(Vec::len).sum();
    let ipc_bytes: usize = ipc.iter().map(Vec::len).sum();
    rt.block_on(async {
        create_topic(&brokers, &json_topic).await;
        create_topic(&brokers, &ipc_topic).await;
        produce(&brokers, &json_topic, json).await;
        produce(&brokers, &ipc_topic, ipc).await;
    });
    println!(
        "kafka consume, {rows} rows ({FEATURES} float32 features + id + label), {PARTITIONS} partitions, best of {REPEATS}"
    );
    println!(
        "{:<34} {:>12} {:>12} {:>10} {:>8}",
        "variant", "rows/s", "messages/s", "MB/s", "ratio"
    );
    for (name, topic, n, bytes, format) in [
        ("json", &json_topic, json_n, json_bytes, "json"),
        (
            "arrow_ipc (2048 rows/message)",
            &ipc_topic,
            ipc_n,
            ipc_bytes,
            "arrow_ipc",
        ),
    ] {
        let (raw_t, (got, _)) = {
            let mut r = (0, 0);
            let (t, _) = best(|| {
                r = raw_consume(&brokers, topic, n);
                r.0
            });
            (t, r)
        };
        assert_eq!(got, n);
        let (sl_t, got_rows) =
            best(|| rt.block_on(sluice_consume(&brokers, topic, format, rows, false)));
        assert_eq!(got_rows, rows, "sluice read every row");
        let (sh_t, got_rows) =
            best(|| rt.block_on(sluice_consume(&brokers, topic, format, rows, true)));
        assert_eq!(got_rows, rows, "sluice read every row, shuffled");
        let line = |label: &str, t: Duration, ratio: f64| {
            let s = t.as_secs_f64();
            println!(
                "{:<34} {:>12.0} {:>12.0} {:>10.1} {:>7.2}x",
                label,
                rows as f64 / s,
                n as f64 / s,
                bytes as f64 / 1e6 / s,
                ratio
            );
        };
        line(&format!("{name}: raw rdkafka consume"), raw_t, 1.0);
        line(
            &format!("{name}: sluice -> Arrow batches"),
            sl_t,
            raw_t.as_secs_f64() / sl_t.as_secs_f64(),
        );
        line(
            &format!("{name}: sluice + shuffle 100k"),
            sh_t,
            raw_t.as_secs_f64() / sh_t.as_secs_f64(),
        );
    }
}
