//! parquet → standardize → batch → null sink, end to end through the same `Job` the binary
//! runs. The dataset (200k rows × 32 float32 features + a label, 8 row groups, zstd) is
//! generated once into a temporary directory.
//!
//! `cargo bench --bench pipeline` (add `-- --quick` for a short run).
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use arrow::array::{FixedSizeListArray, Float32Array, Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use sluice::Job;
use sluice::pipeline::ConfigDocument;

const ROWS: usize = 200_000;
const FEATURES: i32 = 32;

fn write_dataset(dir: &std::path::Path) {
    let props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(3).unwrap()))
        .set_max_row_group_row_count(Some(ROWS / 8))
        .build();
    let field = Arc::new(Field::new_list_field(DataType::Float32, false));
    let file = std::fs::File::create(dir.join("tabular.parquet")).unwrap();
    let mut writer = None;
    let chunk = 25_000;
    for start in (0..ROWS).step_by(chunk) {
        // Deterministic pseudo-random values (xorshift), no RNG dependency needed.
        let mut x: u64 = 0x9e3779b97f4a7c15 ^ start as u64;
        let values: Vec<f32> = (0..chunk * FEATURES as usize)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x % 10_000) as f32 / 100.0
            })
            .collect();
        let features = FixedSizeListArray::try_new(
            field.clone(),
            FEATURES,
            Arc::new(Float32Array::from(values)),
            None,
        )
        .unwrap();
        let batch = RecordBatch::try_from_iter([
            (
                "label",
                Arc::new(Int64Array::from_iter_values(
                    (start..start + chunk).map(|i| (i % 10) as i64),
                )) as _,
            ),
            ("features", Arc::new(features) as _),
        ])
        .unwrap();
        let w = writer.get_or_insert_with(|| {
            ArrowWriter::try_new(
                file.try_clone().unwrap(),
                batch.schema(),
                Some(props.clone()),
            )
            .unwrap()
        });
        w.write(&batch).unwrap();
    }
    writer.unwrap().close().unwrap();
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    write_dataset(dir.path());
    let yaml = "source: {type: parquet, path: tabular.parquet}\n\
                stages:\n\
                - {type: standardize, columns: [features], mean: 50.0, std: 28.9}\n\
                - {type: batch, size: 1024}\n\
                sink: {type: 'null'}\n";
    let doc = ConfigDocument::from_str(yaml, "bench.yaml", dir.path()).unwrap();
    let job = Job::from_document(&doc).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();

    let mut group = c.benchmark_group("parquet_standardize_batch_null");
    group.sample_size(10);
    group.throughput(Throughput::Elements(ROWS as u64));
    group.bench_function("200k_rows_x32_f32", |b| {
        b.iter(|| {
            rt.block_on(async {
                let prepared = job.prepare().await.unwrap();
                let report = prepared.run(std::future::pending()).await.unwrap();
                assert_eq!(report.rows_written, ROWS as u64);
            })
        })
    });
    // The ceiling: the parquet crate decoding the same file on one thread, no pipeline.
    let path = dir.path().join("tabular.parquet");
    group.bench_function("raw_parquet_decode_1_thread", |b| {
        b.iter(|| {
            let f = std::fs::File::open(&path).unwrap();
            let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(f)
                .unwrap()
                .with_batch_size(8192)
                .build()
                .unwrap();
            let rows: usize = reader.map(|b| b.unwrap().num_rows()).sum();
            assert_eq!(rows, ROWS);
        })
    });
    group.finish();
    s3_vs_local(c, dir.path(), &rt);
}

/// The same read from local disk and from the S3 server on loopback (moto, started by
/// `scripts/services.sh start`; skipped with a note when SLUICE_TEST_S3_ENDPOINT is unset).
fn s3_vs_local(c: &mut Criterion, dir: &std::path::Path, rt: &tokio::runtime::Runtime) {
    use object_store::ObjectStoreExt;
    use std::io::{Read, Write};
    let Ok(endpoint) = std::env::var("SLUICE_TEST_S3_ENDPOINT") else {
        eprintln!(
            "s3_vs_local: SLUICE_TEST_S3_ENDPOINT unset; run `eval \"$(scripts/services.sh start)\"` to compare with S3"
        );
        return;
    };
    let bucket = format!("bench-{}", std::process::id());
    let addr = endpoint.trim_start_matches("http://").to_string();
    let mut conn = std::net::TcpStream::connect(&addr).unwrap();
    write!(
        conn,
        "PUT /{bucket} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    conn.read_to_string(&mut answer).unwrap();
    let store = object_store::aws::AmazonS3Builder::new()
        .with_endpoint(&endpoint)
        .with_allow_http(true)
        .with_bucket_name(&bucket)
        .with_region("us-east-1")
        .with_access_key_id("bench")
        .with_secret_access_key("bench")
        .build()
        .unwrap();
    let bytes = std::fs::read(dir.join("tabular.parquet")).unwrap();
    rt.block_on(store.put(
        &object_store::path::Path::from("tabular.parquet"),
        bytes.into(),
    ))
    .unwrap();
    let storage = format!(
        "storage: {{options: {{endpoint: '{endpoint}', allow_http: true, region: us-east-1, access_key_id: bench, secret_access_key: bench}}}}"
    );
    let mut group = c.benchmark_group("read_local_vs_s3");
    group.sample_size(10);
    group.throughput(Throughput::Elements(ROWS as u64));
    for (name, path) in [
        ("local", "tabular.parquet".to_string()),
        ("s3_loopback", format!("s3://{bucket}/tabular.parquet")),
    ] {
        let yaml = format!(
            "source: {{type: parquet, path: '{path}', {storage}}}\nsink: {{type: 'null'}}\n"
        );
        let doc = ConfigDocument::from_str(&yaml, "bench.yaml", dir).unwrap();
        let job = Job::from_document(&doc).unwrap();
        group.bench_function(name, |b| {
            b.iter(|| {
                rt.block_on(async {
                    let report = job
                        .prepare()
                        .await
                        .unwrap()
                        .run(std::future::pending())
                        .await
                        .unwrap();
                    assert_eq!(report.rows_written, ROWS as u64);
                })
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
