//! The preprocessing-fleet → Kafka → trainer flow: what a `kafka` sink publishes, a `kafka`
//! source reads with a declared schema, and `until: {records: N}` counts rows, whatever a
//! message holds. Against the real broker (Tansu, from `scripts/services.sh`).
#![allow(clippy::unwrap_used)]

use crate::common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use arrow::array::{AsArray, FixedSizeListArray, Float32Array, Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Float32Type, Schema};
use common::kafka::{self, JSON_SCHEMA, json_record};
use common::{
    assert_ok, int64_values, read_parquet, repo, run_in_for, spawn_sluice, write_parquet,
};

/// Writes `yaml` to `dir/name` and runs `sluice run` on it, bounded by `limit` (a hang fails
/// the test).
fn run_config(dir: &Path, name: &str, yaml: String, limit: Duration) -> std::process::Output {
    std::fs::write(dir.join(name), yaml).unwrap();
    run_in_for(dir, &["run", name], limit)
}

fn topic(prefix: &str, partitions: i32) -> String {
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(kafka::create_topic(prefix, partitions))
}

/// A list column with non-null items — what an `image` stage produces — published by a
/// `kafka` sink is read by a source declaring `x: "float32[4]"` (nullable items: a non-null
/// column fits a nullable declaration; every message used to be refused as "Arrow schema
/// differs"). A declaration that does not fit is still refused.
#[test]
fn a_declared_schema_reads_what_the_sink_wrote_with_non_null_lists() {
    let topic = topic("fleet-nonnull", 1);
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    let n = 1000i64;
    let item = Arc::new(Field::new("item", DataType::Float32, false));
    let values = Float32Array::from_iter_values((0..n * 4).map(|v| v as f32 / 8.0));
    let x = FixedSizeListArray::try_new(item.clone(), 4, Arc::new(values), None).unwrap();
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("x", DataType::FixedSizeList(item, 4), false),
    ]));
    let data = RecordBatch::try_new(
        schema,
        vec![Arc::new(Int64Array::from_iter_values(0..n)), Arc::new(x)],
    )
    .unwrap();
    write_parquet(&dir.join("in.parquet"), &[data], 300);
    assert_ok(&run_config(
        dir,
        "publish.yaml",
        format!(
            "source: {{type: parquet, path: in.parquet}}\nstages: [{{type: batch, size: 100}}]\nsink: {{type: kafka, brokers: '{}', topic: {topic}, format: arrow_ipc}}\n",
            kafka::brokers()
        ),
        Duration::from_secs(120),
    ));
    let read = |name: &str, x_type: &str| {
        run_config(
            dir,
            name,
            format!(
                "source: {{type: kafka, brokers: '{}', topic: {topic}, format: arrow_ipc, schema: {{id: int64, x: \"{x_type}\"}}, until: end}}\nsink: {{type: parquet, path: {name}.parquet}}\n",
                kafka::brokers()
            ),
            Duration::from_secs(120),
        )
    };
    assert_ok(&read("fits.yaml", "float32[4]"));
    let back = read_parquet(&dir.join("fits.yaml.parquet"));
    assert_eq!(int64_values(&back, "id"), (0..n).collect::<Vec<_>>());
    let xs: Vec<f32> = back
        .iter()
        .flat_map(|b| {
            let l = b.column_by_name("x").unwrap().as_fixed_size_list();
            l.values().as_primitive::<Float32Type>().values().to_vec()
        })
        .collect();
    assert_eq!(xs, (0..n * 4).map(|v| v as f32 / 8.0).collect::<Vec<_>>());

    let out = read("wrong.yaml", "float64[4]");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("Arrow schema differs from the source's: message has {id: int64 (non-null), x: float32[4] (non-null, items non-null)}, the source declares {id: int64, x: float64[4]}"),
        "{err}"
    );
}

/// `until: {records: N}` counts rows: an `arrow_ipc` topic whose messages carry 250 rows each
/// is read to exactly N rows — the last message cut where N falls — and the run ends (it
/// used to count messages, and a reader asked for every row of the topic waited forever).
#[test]
fn until_records_counts_the_rows_of_arrow_ipc_messages() {
    let topic = topic("until-ipc", 1);
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    let digits = repo().join("data/digits/train.parquet");
    // 1,437 rows as 6 messages: 5 of 250 rows and one of 187.
    assert_ok(&run_config(
        dir,
        "publish.yaml",
        format!(
            "source: {{type: parquet, path: '{}', columns: [id]}}\nstages: [{{type: batch, size: 250}}]\nsink: {{type: kafka, brokers: '{}', topic: {topic}, format: arrow_ipc}}\n",
            digits.display(),
            kafka::brokers()
        ),
        Duration::from_secs(120),
    ));
    let expected = int64_values(&read_parquet(&digits), "id");

    for n in [1000usize, 1100, 1437] {
        let name = format!("read-{n}.yaml");
        // Bounded: counting messages, 1,437 "records" never come and the run hangs.
        let out = run_config(
            dir,
            &name,
            format!(
                "source: {{type: kafka, brokers: '{}', topic: {topic}, format: arrow_ipc, schema: {{id: int64}}, until: {{records: {n}}}}}\nsink: {{type: parquet, path: out-{n}.parquet}}\n",
                kafka::brokers()
            ),
            Duration::from_secs(60),
        );
        assert_ok(&out);
        let got = int64_values(&read_parquet(&dir.join(format!("out-{n}.parquet"))), "id");
        assert_eq!(got.len(), n, "until {{records: {n}}}");
        assert_eq!(
            got,
            expected[..n],
            "one partition: the first {n} rows in order"
        );
    }
}

/// A `static` reader over a backlog of large records (~2 KB, which librdkafka fetches a
/// partition at a time) with the default `batch_timeout` interleaves the partitions exactly:
/// 256 records of each in turn, so every stretch of 4,096 rows holds 1,024 of each partition,
/// and two runs read the same order. (It used to wait at most `batch_timeout` for a partition
/// whose fetch was slow, and read 12,288 rows of one partition before any other.)
#[test]
fn a_backlog_of_large_records_is_interleaved_the_same_way_every_run() {
    let n = 16_384i64;
    let pad = "p".repeat(1900);
    let topic = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let t = kafka::create_topic("fleet-backlog", 4).await;
        let records = (0..n).map(|i| {
            let mut r = json_record(i);
            r.truncate(r.len() - 1);
            r.extend_from_slice(format!(r#", "pad": "{pad}"}}"#).as_bytes());
            ((i % 4) as i32, r)
        });
        assert_eq!(kafka::produce(&t, records).await as i64, n);
        t
    });
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    let read = |run: usize| {
        let name = format!("run-{run}.yaml");
        assert_ok(&run_config(
            dir,
            &name,
            format!(
                "source: {{type: kafka, brokers: '{}', topic: {topic}, format: json, schema: {JSON_SCHEMA}, until: end}}\nsink: {{type: parquet, path: out-{run}.parquet}}\n",
                kafka::brokers()
            ),
            Duration::from_secs(120),
        ));
        int64_values(&read_parquet(&dir.join(format!("out-{run}.parquet"))), "id")
    };
    let first = read(0);
    let mut sorted = first.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..n).collect::<Vec<_>>(), "every record once");
    // Id `i` is partition `i % 4`, offset `i / 4`.
    for (k, stretch) in first.chunks(4096).enumerate() {
        let mut per = [0usize; 4];
        for &id in stretch {
            per[(id % 4) as usize] += 1;
        }
        assert_eq!(per, [1024; 4], "rows {}..{}", 4096 * k, 4096 * (k + 1));
    }
    let second = read(1);
    let differ = first.iter().zip(&second).position(|(a, b)| a != b);
    assert_eq!(
        differ, None,
        "a second run read another order from row {differ:?} on"
    );
}

/// The disaggregated flow end to end: `sluice train` on a topic is started **before** the
/// preprocessing job that fills it (a declared schema, so nothing waits for a first message),
/// then `sluice run` publishes the digits through cast + standardize; the trainer trains
/// every row exactly once (`until: {records}` in rows) and evaluates on a held-out Parquet
/// split preprocessed the same way (evaluation with a Kafka training source used to be
/// refused).
#[cfg(feature = "torch")]
#[test]
fn a_trainer_started_before_its_preprocessing_fleet_trains_every_row_once_and_evaluates() {
    let topic = topic("fleet-train", 2);
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    let data = repo().join("data/digits");
    let stages = "stages:\n  - {type: cast, columns: {pixels: float32}}\n  - {type: standardize, columns: [pixels], mean: 4.9, std: 6.0}\n";
    // The held-out split, preprocessed like the stream.
    assert_ok(&run_config(
        dir,
        "test.yaml",
        format!(
            "source: {{type: parquet, path: '{}/test.parquet', columns: [label, pixels]}}\n{stages}sink: {{type: parquet, path: test.parquet}}\n",
            data.display()
        ),
        Duration::from_secs(120),
    ));
    std::fs::write(
        dir.join("train.yaml"),
        format!(
            "source: {{type: kafka, brokers: '{}', topic: {topic}, format: arrow_ipc, schema: {{label: int64, pixels: \"float32[64]\"}}, until: {{records: 1437}}}}
stages: [{{type: batch, size: 32}}]
loader:
  tensors:
    x: {{column: pixels, dtype: f32}}
    y: {{column: label, dtype: i64}}
trainer:
  model: {{type: mlp, hidden: [64], outputs: 10}}
  optimizer: {{type: sgd, lr: 0.05, momentum: 0.9}}
  eval: {{path: test.parquet}}
  allreduce: {{workers: 1}}
",
            kafka::brokers()
        ),
    )
    .unwrap();
    let mut trainer = spawn_sluice(
        dir,
        &["train", "train.yaml", "--summary-json", "train.json"],
    );
    assert_ok(&run_config(
        dir,
        "publish.yaml",
        format!(
            "source: {{type: parquet, path: '{}/train.parquet', columns: [label, pixels]}}\n{stages}  - {{type: batch, size: 100}}\nsink: {{type: kafka, brokers: '{}', topic: {topic}, format: arrow_ipc}}\n",
            data.display(),
            kafka::brokers()
        ),
        Duration::from_secs(120),
    ));
    let status = common::wait_for("the trainer", Duration::from_secs(180), || {
        trainer.try_wait().unwrap()
    });
    let log = std::fs::read_to_string(dir.join("stderr.log")).unwrap();
    assert!(status.success(), "{log}");
    assert!(!log.contains("going on without waiting"), "{log}");
    eprintln!("{log}");
    let r: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("train.json")).unwrap()).unwrap();
    assert_eq!(r["rows_trained"], 1437, "every published row once");
    assert_eq!(r["steps"], 1437u64.div_ceil(32));
    let eval = r["evals"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(eval["rows"], 360, "the whole held-out split");
    let acc = eval["accuracy"].as_f64().unwrap();
    assert!(acc >= 0.8, "held-out accuracy {acc}");
}

/// A broker that dies and stays dead: the run says it is waiting and for how long
/// (`outage_budget`), then stops with an error naming the budget instead of waiting forever;
/// the parts written before stay whole.
#[test]
fn brokers_gone_past_the_outage_budget_stop_the_run_with_a_clear_error() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    let mut broker = kafka::DurableBroker::start(common::s3::bucket("tansu-outage"), dir);
    let brokers = broker.brokers();
    let topic = rt.block_on(async {
        let t = kafka::create_topic_on(&brokers, "outage", 1).await;
        kafka::produce_on(&brokers, &t, (0..2_000i64).map(|i| (0, json_record(i)))).await;
        t
    });
    std::fs::write(
        dir.join("job.yaml"),
        format!(
            "source: {{type: kafka, brokers: '{brokers}', topic: {topic}, format: json, schema: {JSON_SCHEMA}, batch_rows: 250, until: {{records: 5000}}, outage_budget: 3s}}\nsink: {{type: parquet, path: out, max_rows_per_file: 1000}}\n"
        ),
    )
    .unwrap();
    let mut run = spawn_sluice(dir, &["run", "job.yaml"]);
    common::wait_for("the run's first parts", Duration::from_secs(60), || {
        (common::files_under(&dir.join("out")).len() >= 2).then_some(())
    });
    broker.kill();
    let status = common::wait_for("the run to give up", Duration::from_secs(90), || {
        run.try_wait().unwrap()
    });
    let log = std::fs::read_to_string(dir.join("stderr.log")).unwrap();
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(!log.contains("going on without waiting"), "{log}");
    assert!(
        log.contains("no broker reachable (")
            && log.contains("waiting for up to 3s (`outage_budget`)"),
        "{log}"
    );
    assert!(log.contains("(`outage_budget`): "), "{log}");
    assert!(log.contains("or raise `outage_budget`"), "{log}");
    let ids: Vec<i64> = common::files_under(&dir.join("out"))
        .iter()
        .filter(|f| f.ends_with(".parquet"))
        .flat_map(|f| int64_values(&read_parquet(&dir.join("out").join(f)), "id"))
        .collect();
    assert!(
        ids.len() >= 1000 && ids.len().is_multiple_of(1000),
        "{} rows in whole parts",
        ids.len()
    );
}
