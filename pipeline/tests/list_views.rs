//! A shuffle followed by `standardize` and a per-value stage (`gaussian_noise`,
//! `feature_dropout`) on a fixed-size list hands the list over as views into its window
//! (`stage::gathered`): the stage reads each row where the window holds it, instead of the
//! shuffle copying it first. Property tests on random small Parquet datasets: the batches
//! equal those of the copying pipeline (a `select` between shuffle and `standardize` keeps
//! them apart), in memory and spilled, float32 and float64, with null rows; a run resumed
//! mid-epoch continues exactly; and lists whose items may be null are never handed over.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::sync::Arc;

use arrow::array::{
    ArrayRef, FixedSizeListArray, Float32Array, Float64Array, Int64Array, RecordBatch,
};
use arrow::buffer::NullBuffer;
use arrow::datatypes::{DataType, Field};
use common::{rt, run, same};
use parquet::arrow::ArrowWriter;
use proptest::prelude::*;
use sluice_pipeline::{Pipeline, SourceState};

const WIDTH: i32 = 6;

/// Writes one Parquet file per entry of `groups` (its row groups' row counts): an `id`
/// column and fixed-size lists `x` and `y` of `WIDTH` floats (float64 when `f64s`; items
/// nullable when `nullable_items`, though none is null; `y` is `x` negated), every seventh
/// row of `x` null.
fn write_dataset(dir: &Path, groups: &[Vec<usize>], f64s: bool, nullable_items: bool) {
    let t = if f64s {
        DataType::Float64
    } else {
        DataType::Float32
    };
    let item = Arc::new(Field::new("item", t, nullable_items));
    let mut id = 0i64;
    for (f, sizes) in groups.iter().enumerate() {
        let file = std::fs::File::create(dir.join(format!("part-{f:03}.parquet"))).unwrap();
        let mut writer: Option<ArrowWriter<std::fs::File>> = None;
        let mut file = Some(file);
        for &n in sizes {
            let ids: Vec<i64> = (id..id + n as i64).collect();
            id += n as i64;
            let values = ids
                .iter()
                .flat_map(|v| (0..WIDTH).map(move |k| (*v as f64 * 0.731 + f64::from(k)).sin()));
            let values: ArrayRef = if f64s {
                Arc::new(Float64Array::from_iter_values(values))
            } else {
                Arc::new(Float32Array::from_iter_values(values.map(|v| v as f32)))
            };
            let nulls = NullBuffer::from(ids.iter().map(|v| v % 7 != 3).collect::<Vec<_>>());
            let negated = arrow::compute::kernels::numeric::neg(&values).unwrap();
            let x = FixedSizeListArray::try_new(item.clone(), WIDTH, values, Some(nulls)).unwrap();
            let y = FixedSizeListArray::try_new(item.clone(), WIDTH, negated, None).unwrap();
            let rb = RecordBatch::try_from_iter_with_nullable([
                ("id", Arc::new(Int64Array::from(ids)) as ArrayRef, false),
                ("x", Arc::new(x) as ArrayRef, true),
                ("y", Arc::new(y) as ArrayRef, false),
            ])
            .unwrap();
            let w = writer.get_or_insert_with(|| {
                ArrowWriter::try_new(file.take().unwrap(), rb.schema(), None).unwrap()
            });
            w.write(&rb).unwrap();
            w.flush().unwrap();
        }
        writer.unwrap().close().unwrap();
    }
}

#[derive(Debug, Clone)]
struct Case {
    groups: Vec<Vec<usize>>,
    batch_rows: usize,
    buffer_rows: usize,
    /// Small enough to spill the window (the rows are then read back and viewed again).
    spill: bool,
    f64s: bool,
    noise: &'static str,
    batch: usize,
    seed: u64,
}

fn cases() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec(prop::collection::vec(1usize..40, 1..4), 1..4),
        1usize..30,
        1usize..90,
        any::<bool>(),
        any::<bool>(),
        prop::sample::select(vec![
            "{type: gaussian_noise, columns: [x, y], std: 0.5, seed: 3}",
            "{type: feature_dropout, columns: [y, x], p: 0.25, scale: true, seed: 4}",
        ]),
        1usize..20,
        any::<u64>(),
    )
        .prop_map(
            |(groups, batch_rows, buffer_rows, spill, f64s, noise, batch, seed)| Case {
                groups,
                batch_rows,
                buffer_rows,
                spill,
                f64s,
                noise,
                batch,
                seed,
            },
        )
}

/// The pipeline: shuffle, `standardize`, the case's noise, `batch`. `copy` puts a no-op
/// `select` between the shuffle and `standardize` (the rows are then copied by the shuffle);
/// otherwise it goes first, so every stage keeps its index (part of the noise's key).
fn yaml(dir: &Path, c: &Case, copy: bool) -> String {
    let select = "- {type: select, columns: [id, x, y]}\n";
    let memory = if c.spill { "2 KiB" } else { "64 MiB" };
    format!(
        "source: {{type: parquet, path: '{}/*.parquet', batch_rows: {}, epochs: 2}}\n\
         stages:\n\
         {}\
         - {{type: shuffle, buffer_rows: {}, max_memory: {memory}, seed: {}, batch_rows: 7}}\n\
         {}\
         - {{type: standardize, columns: [x], mean: [0.5, -0.25, 0, 0.125, 1, -1], std: 0.5}}\n\
         - {}\n\
         - {{type: batch, size: {}}}\n\
         runtime: {{threads: 2, queue_bytes: 4 KiB}}\n",
        dir.display(),
        c.batch_rows,
        if copy { "" } else { select },
        c.buffer_rows,
        c.seed,
        if copy { select } else { "" },
        c.noise,
        c.batch
    )
}

/// The notes of the shuffle of `yaml` that say it hands columns over as views.
async fn handed_over(yaml: &str) -> Vec<String> {
    let prepared = Pipeline::from_yaml(yaml).unwrap().prepare().await.unwrap();
    let stages = prepared.metrics().stages();
    let shuffle = stages
        .iter()
        .find(|s| s.name.contains("(shuffle)"))
        .unwrap();
    let notes = shuffle.notes.lock().unwrap().clone();
    notes
        .into_iter()
        .filter(|n| n.contains("as views"))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    #[test]
    fn lists_handed_over_as_views_equal_the_copied_ones(c in cases(), cut in 0usize..30) {
        let dir = tempfile::tempdir().unwrap();
        write_dataset(dir.path(), &c.groups, c.f64s, false);
        let rt = rt();
        let fused = yaml(dir.path(), &c, false);
        let copied = yaml(dir.path(), &c, true);
        let notes = rt.block_on(handed_over(&fused));
        prop_assert!(notes.len() == 1 && notes[0].contains("hands `x`, `y` to"), "{:?}", notes);
        prop_assert!(rt.block_on(handed_over(&copied)).is_empty());
        let a = rt.block_on(run(Pipeline::from_yaml(&fused).unwrap(), None)).0;
        let b = rt.block_on(run(Pipeline::from_yaml(&copied).unwrap(), None)).0;
        same(&a, &b)?;
        let rows: usize = a.iter().map(|b| b.data.num_rows()).sum();
        prop_assert_eq!(rows, 2 * c.groups.iter().flatten().sum::<usize>());
        // Resuming the view path continues exactly too.
        let k = cut.min(a.len());
        let (head, state) = rt.block_on(run(Pipeline::from_yaml(&fused).unwrap(), Some(k)));
        let state: SourceState =
            serde_json::from_str(&serde_json::to_string(&state).unwrap()).unwrap();
        let resumed = Pipeline::from_yaml(&fused).unwrap().resume_from(state);
        let (tail, _) = rt.block_on(run(resumed, None));
        let mut joined = head;
        joined.extend(tail);
        same(&joined, &a)?;
    }
}

/// A list whose items may be null is copied by the shuffle as before: a view holds a row's
/// bytes, not which of its items are null.
#[test]
fn lists_with_nullable_items_are_not_handed_over() {
    let dir = tempfile::tempdir().unwrap();
    let c = Case {
        groups: vec![vec![10, 5]],
        batch_rows: 4,
        buffer_rows: 8,
        spill: false,
        f64s: false,
        noise: "{type: gaussian_noise, columns: [x, y], std: 0.5, seed: 3}",
        batch: 3,
        seed: 1,
    };
    write_dataset(dir.path(), &c.groups, c.f64s, true);
    let rt = rt();
    let notes = rt.block_on(handed_over(&yaml(dir.path(), &c, false)));
    assert!(notes.is_empty(), "{notes:?}");
    let a = rt.block_on(run(
        Pipeline::from_yaml(&yaml(dir.path(), &c, false)).unwrap(),
        None,
    ));
    assert_eq!(a.0.iter().map(|b| b.data.num_rows()).sum::<usize>(), 30);
}
