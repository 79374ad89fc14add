//! File sinks: what is written reads back identical; abort and failures leave nothing behind.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use arrow::array::{FixedSizeListArray, Float32Array, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field};
use sluice_pipeline::{Batch, CpuPool, Lineage, Origin};
use sluice_sinks::{
    ArrowIpcSinkConfig, IpcCompression, ParquetCompression, ParquetSinkConfig, SinkConfig,
    SinkContext,
};

fn batch(start: i64, n: i64) -> Batch {
    let field = Arc::new(Field::new_list_field(DataType::Float32, false));
    let values = Float32Array::from_iter_values((0..n * 3).map(|v| (start * 3 + v) as f32 * 0.5));
    let data = RecordBatch::try_from_iter([
        (
            "id",
            Arc::new(Int64Array::from_iter_values(start..start + n)) as _,
        ),
        (
            "name",
            Arc::new(StringArray::from_iter(
                (start..start + n).map(|i| (i % 3 != 0).then(|| format!("row{i}"))),
            )) as _,
        ),
        (
            "v",
            Arc::new(FixedSizeListArray::try_new(field, 3, Arc::new(values), None).unwrap()) as _,
        ),
    ])
    .unwrap();
    let origin = Origin::Object {
        url: sluice_pipeline::Name::from("file:///test"),
        row_group: 0,
    };
    Batch::new(data, Lineage::new(origin, start as u64, n as u64, 0))
}

fn context(dir: &std::path::Path) -> SinkContext {
    SinkContext {
        schema: batch(0, 1).data.schema(),
        base_dir: dir.to_path_buf(),
        pool: CpuPool::new(Some(2)).unwrap(),
        resume: None,
    }
}

/// The files in `dir`, but for the lock a sink holds there while it writes (`.sluice.lock`).
fn entries(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| n != ".sluice.lock")
        .collect();
    v.sort();
    v
}

fn parquet(path: &str, overwrite: bool) -> SinkConfig {
    SinkConfig::Parquet(ParquetSinkConfig {
        path: path.into(),
        row_group_size: 100,
        compression: ParquetCompression::Zstd,
        zstd_level: 3,
        overwrite,
        max_rows_per_file: None,
        storage: Default::default(),
    })
}

#[tokio::test]
async fn parquet_and_ipc_read_back_identical() {
    let dir = tempfile::tempdir().unwrap();
    let cx = context(dir.path());
    let input: Vec<Batch> = (0..5).map(|i| batch(i * 70, 70)).collect();
    let ipc = SinkConfig::ArrowIpc(ArrowIpcSinkConfig {
        path: "nested/dir/out.arrow".into(),
        compression: IpcCompression::Zstd,
        overwrite: true,
        storage: Default::default(),
    });
    for config in [parquet("out.parquet", true), ipc] {
        let mut sink = config.build(&cx).await.unwrap();
        for b in &input {
            sink.write(b).await.unwrap();
        }
        let report = sink.finish().await.unwrap();
        assert_eq!(report.rows, 350);
        assert_eq!(report.batches, 5);
        assert!(report.bytes > 0);
    }
    let expected =
        arrow::compute::concat_batches(&cx.schema, input.iter().map(|b| &b.data)).unwrap();

    let f = std::fs::File::open(dir.path().join("out.parquet")).unwrap();
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(f).unwrap();
    assert_eq!(
        reader.metadata().num_row_groups(),
        4,
        "row_group_size 100 over 350 rows"
    );
    let got: Vec<RecordBatch> = reader.build().unwrap().map(|b| b.unwrap()).collect();
    assert_eq!(
        arrow::compute::concat_batches(&cx.schema, &got).unwrap(),
        expected
    );

    let f = std::fs::File::open(dir.path().join("nested/dir/out.arrow")).unwrap();
    let got: Vec<RecordBatch> = arrow::ipc::reader::FileReader::try_new(f, None)
        .unwrap()
        .map(|b| b.unwrap())
        .collect();
    assert_eq!(
        arrow::compute::concat_batches(&cx.schema, &got).unwrap(),
        expected
    );
}

#[tokio::test]
async fn abort_leaves_nothing_and_keeps_an_existing_file() {
    let dir = tempfile::tempdir().unwrap();
    let cx = context(dir.path());
    std::fs::write(dir.path().join("out.parquet"), b"previous").unwrap();
    let mut sink = parquet("out.parquet", true).build(&cx).await.unwrap();
    for i in 0..20 {
        sink.write(&batch(i * 1000, 1000)).await.unwrap();
    }
    sink.abort().await;
    assert_eq!(entries(dir.path()), vec!["out.parquet"]);
    assert_eq!(
        std::fs::read(dir.path().join("out.parquet")).unwrap(),
        b"previous",
        "old file untouched"
    );
}

#[tokio::test]
async fn overwrite_false_refuses_an_existing_file() {
    let dir = tempfile::tempdir().unwrap();
    let cx = context(dir.path());
    std::fs::write(dir.path().join("out.parquet"), b"previous").unwrap();
    let err = parquet("out.parquet", false)
        .build(&cx)
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("out.parquet already exists and `overwrite` is false"),
        "{err}"
    );
}

#[tokio::test]
async fn part_files_rotate_flush_and_resume_replaces_parts_after_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = parquet("out", true);
    if let SinkConfig::Parquet(p) = &mut config {
        p.max_rows_per_file = Some(100);
    }
    // Run 1: 3 batches of 60 rows → part 0 (120 rows, closed at the boundary past 100),
    // then a flush closes part 1 (60 rows). State after the flush: next part 2.
    let mut sink = config.build(&context(dir.path())).await.unwrap();
    for i in 0..3 {
        sink.write(&batch(i * 60, 60)).await.unwrap();
    }
    assert!(
        sink.flush().await.unwrap(),
        "part files are durable at a flush"
    );
    let state = sink.state().unwrap();
    assert_eq!(state["next_part"], 2);
    // Written after the "checkpoint", then the process dies (no finish, no abort; part 2
    // was completed by the write, so nothing is in flight). Dropped rather than forgotten:
    // a dead process holds no lock on its output, and this one must take it again.
    sink.write(&batch(180, 120)).await.unwrap();
    drop(sink);
    assert_eq!(
        entries(&dir.path().join("out")),
        vec![
            "part-00000.parquet",
            "part-00001.parquet",
            "part-00002.parquet"
        ]
    );

    // Run 2 resumes from the state: part 2 is removed and written again.
    let mut cx = context(dir.path());
    cx.resume = Some(state);
    let mut sink = config.build(&cx).await.unwrap();
    assert_eq!(
        entries(&dir.path().join("out")),
        vec!["part-00000.parquet", "part-00001.parquet"]
    );
    sink.write(&batch(180, 50)).await.unwrap();
    let report = sink.finish().await.unwrap();
    assert_eq!(report.rows, 50);
    let mut ids = Vec::new();
    for name in entries(&dir.path().join("out")) {
        let f = std::fs::File::open(dir.path().join("out").join(name)).unwrap();
        for b in parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(f)
            .unwrap()
            .build()
            .unwrap()
        {
            let b = b.unwrap();
            ids.extend(
                b.column(0)
                    .as_any()
                    .downcast_ref::<Int64Array>()
                    .unwrap()
                    .values()
                    .iter()
                    .copied(),
            );
        }
    }
    assert_eq!(ids, (0..230).collect::<Vec<i64>>());

    // A fresh run (no resume) with overwrite: false refuses the existing parts.
    let mut keep = parquet("out", false);
    if let SinkConfig::Parquet(p) = &mut keep {
        p.max_rows_per_file = Some(100);
    }
    assert!(keep.build(&context(dir.path())).await.is_err());
}
