//! Images after the shuffle: an `image` stage right after `shuffle` and `batch` gets the
//! bytes handed over as views, with the same batches as when they are copied (in memory,
//! spilled, across ranks, resumed); a bad image among them fails the run naming its row, or,
//! with `on_error: skip`, is left out (counted and dead-lettered) with resume still exact.

use std::path::Path;
use std::sync::Arc;

use arrow::array::{Int64Array, RecordBatch};
use futures::StreamExt;
use parquet::arrow::ArrowWriter;
use proptest::prelude::*;
use sluice_pipeline::Pipeline;
use sluice_pipeline::collective::{Collective, LocalCollective};

use super::{Case, cases, interrupted_at, no_share, run, run_synced, write_dataset};
use crate::common::{ids, rt, same};

/// A shuffle followed by `batch` and an `image` stage that replaces its column hands the bytes
/// over as views (no copy); putting any other stage in between turns that off. Both must
/// give the same batches, in memory, spilled and across ranks. (The no-op `select` goes before
/// the shuffle or between it and `batch`: the image stage keeps its index, part of its key.)
fn handover_yaml(dir: &Path, c: &Case, across: bool, copy: bool) -> String {
    let select = "- {type: select, columns: [id, x, img, big, tok]}\n";
    format!(
        "source: {{type: parquet, path: '{}/*.parquet', batch_rows: {}, prefetch: 2, epochs: {}}}\n\
         stages:\n\
         {}\
         - {{type: shuffle, buffer_rows: {}, max_memory: {}, seed: {}, batch_rows: 7, across_ranks: {across}}}\n\
         {}\
         - {{type: batch, size: {}}}\n\
         - {{type: image, column: big, shape: [4, 4, 3], seed: 5, ops: [{{random_crop: {{size: [4, 4], padding: 2, fill: [10, 20, 30]}}}}, {{horizontal_flip: {{}}}}, {{normalize: {{mean: [0.5, 0.5, 0.5], std: [0.2, 0.2, 0.2]}}}}]}}\n\
         runtime: {{threads: 2, queue_bytes: 4 KiB}}\n",
        dir.display(),
        c.batch_rows,
        c.epochs,
        if copy { "" } else { select },
        c.buffer_rows,
        c.max_memory,
        c.seed,
        if copy { select } else { "" },
        c.batch
    )
}

/// The notes the shuffle stage left when its pipeline was prepared.
async fn shuffle_notes(yaml: &str) -> Vec<String> {
    let prepared = Pipeline::from_yaml(yaml).unwrap().prepare().await.unwrap();
    let stages = prepared.metrics().stages();
    let shuffle = stages
        .iter()
        .find(|s| s.name.contains("(shuffle)"))
        .unwrap();
    shuffle.notes.lock().unwrap().clone()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    #[test]
    fn images_handed_over_as_views_equal_the_copied_ones(c in cases(), cut in 0usize..30) {
        let dir = tempfile::tempdir().unwrap();
        write_dataset(dir.path(), &c.groups);
        let rt = rt();
        let fused = handover_yaml(dir.path(), &c, false, false);
        let copied = handover_yaml(dir.path(), &c, false, true);
        let views = |y: &str| rt.block_on(shuffle_notes(y)).iter().any(|n| n.contains("as views"));
        prop_assert!(views(&fused));
        prop_assert!(!views(&copied));
        let a = rt.block_on(run(Pipeline::from_yaml(&fused).unwrap(), None)).0;
        let b = rt.block_on(run(Pipeline::from_yaml(&copied).unwrap(), None)).0;
        same(&a, &b)?;
        // Resuming the view path continues exactly too.
        let k = cut.min(a.len());
        let (head, state) = rt.block_on(run(Pipeline::from_yaml(&fused).unwrap(), Some(k)));
        let (tail, _) = rt.block_on(run(Pipeline::from_yaml(&fused).unwrap().resume_from(state), None));
        let mut joined = head;
        joined.extend(tail);
        same(&joined, &a)?;
    }

    #[test]
    fn images_handed_over_across_ranks_equal_the_copied_ones(c in cases()) {
        prop_assume!(!no_share(&c.groups, 2, "redistribute"));
        let dir = tempfile::tempdir().unwrap();
        write_dataset(dir.path(), &c.groups);
        let rt = rt();
        let both = |y: String| {
            let group = LocalCollective::group(2);
            rt.block_on(async move {
                let barrier = Arc::new(tokio::sync::Barrier::new(2));
                let tasks: Vec<_> = group
                    .into_iter()
                    .map(|col| {
                        let p = Pipeline::from_yaml(&y).unwrap().with_collective(Arc::new(col) as Arc<dyn Collective>);
                        tokio::spawn(run_synced(p, None, Some(barrier.clone())))
                    })
                    .collect();
                let mut out = Vec::new();
                for t in tasks {
                    out.push(t.await.unwrap().0);
                }
                out
            })
        };
        let a = both(handover_yaml(dir.path(), &c, true, false));
        let b = both(handover_yaml(dir.path(), &c, true, true));
        for (x, y) in a.iter().zip(&b) {
            same(x, y)?;
        }
    }
}

/// `bad.parquet` in `dir`: rows 0..60, `id` and `img` (binary, 4×4×3 bytes of the id), the
/// rows `bad` one byte short.
fn write_images(dir: &Path, bad: &[i64]) {
    use arrow::array::BinaryArray;
    let rows: Vec<i64> = (0..60).collect();
    let img = BinaryArray::from_iter_values(rows.iter().map(|i| {
        let n = if bad.contains(i) { 47 } else { 48 };
        vec![*i as u8; n]
    }));
    let rb = RecordBatch::try_from_iter([
        ("id", Arc::new(Int64Array::from(rows)) as _),
        ("img", Arc::new(img) as _),
    ])
    .unwrap();
    let file = std::fs::File::create(dir.join("bad.parquet")).unwrap();
    let mut w = ArrowWriter::try_new(file, rb.schema(), None).unwrap();
    w.write(&rb).unwrap();
    w.close().unwrap();
}

/// A bad image in a column the shuffle hands over as views (binary, one row a byte short)
/// fails the run naming its file and row, as without views.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_image_handed_over_as_views_is_reported_with_its_row() {
    let dir = tempfile::tempdir().unwrap();
    write_images(dir.path(), &[37]);
    let yaml = format!(
        "source: {{type: parquet, path: '{}/*.parquet', batch_rows: 16}}\n\
         stages:\n\
         - {{type: shuffle, buffer_rows: 50, seed: 3, batch_rows: 8}}\n\
         - {{type: batch, size: 8}}\n\
         - {{type: image, column: img, shape: [4, 4, 3], on_error: fail, ops: [{{horizontal_flip: {{}}}}]}}\n",
        dir.path().display()
    );
    assert!(
        shuffle_notes(&yaml)
            .await
            .iter()
            .any(|n| n.contains("as views"))
    );
    let mut s = Pipeline::from_yaml(&yaml).unwrap().stream();
    let mut error = None;
    while let Some(b) = s.next().await {
        if let Err(e) = b {
            error = Some(e.to_string());
            break;
        }
    }
    let e = error.expect("the bad image must fail the run");
    assert!(e.contains("47 bytes"), "{e}");
    assert!(e.contains("bad.parquet") && e.contains("row 37"), "{e}");
}

/// After the last `batch`, `on_error: skip` is allowed past a shuffle: the bad image's row is
/// left out (counted, and written to the dead-letter directory with its lineage, error and
/// bytes), every other row arrives once, and a run resumed after any batch — including the
/// one the row was removed from — continues exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_image_is_skipped_after_the_shuffle_and_resume_stays_exact() {
    let dir = tempfile::tempdir().unwrap();
    let bad = [13i64, 37, 38];
    write_images(dir.path(), &bad);
    let yaml = |dlq: &str| {
        format!(
            "source: {{type: parquet, path: '{}/*.parquet', batch_rows: 16, epochs: 2}}\n\
             stages:\n\
             - {{type: shuffle, buffer_rows: 50, seed: 3, batch_rows: 8}}\n\
             - {{type: batch, size: 8}}\n\
             - {{type: image, column: img, shape: [4, 4, 3], on_error: skip, dead_letter: {{type: file, path: '{}'}}, ops: [{{horizontal_flip: {{}}}}]}}\n",
            dir.path().display(),
            dir.path().join(dlq).display()
        )
    };
    let prepared = Pipeline::from_yaml(&yaml("dlq"))
        .unwrap()
        .prepare()
        .await
        .unwrap();
    let metrics = prepared.metrics();
    let mut s = prepared.stream();
    let mut reference = Vec::new();
    while let Some(b) = s.next().await {
        reference.push(b.unwrap());
    }
    let image = metrics
        .stages()
        .into_iter()
        .find(|m| m.name.contains("(image)"))
        .unwrap();
    assert_eq!(
        image
            .rows_removed
            .load(std::sync::atomic::Ordering::Relaxed),
        6,
        "three bad rows, two epochs"
    );
    // Every good row once per epoch; batches keep their cut (8 rows, less where one was
    // removed), so both epochs' batch counts are those of 60 rows.
    let per_epoch = |e: u64| -> Vec<i64> {
        let mut v: Vec<i64> = reference
            .iter()
            .filter(|b| b.lineage.spans()[0].epoch == e)
            .flat_map(|b| ids(std::slice::from_ref(b)))
            .collect();
        v.sort_unstable();
        v
    };
    let good: Vec<i64> = (0..60).filter(|i| !bad.contains(i)).collect();
    assert_eq!(per_epoch(0), good);
    assert_eq!(per_epoch(1), good);
    assert_eq!(reference.len(), 2 * 60usize.div_ceil(8));
    assert!(reference.iter().any(|b| b.num_rows() < 8 && b.dropped > 0));
    // The dead letters: each bad row once per epoch, with where it came from, why, and its
    // bytes.
    let mut letters = Vec::new();
    for f in std::fs::read_dir(dir.path().join("dlq")).unwrap() {
        let text = std::fs::read_to_string(f.unwrap().path()).unwrap();
        letters.extend(
            text.lines()
                .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()),
        );
    }
    let mut got: Vec<(i64, u64)> = letters
        .iter()
        .map(|l| (l["row"].as_i64().unwrap(), l["epoch"].as_u64().unwrap()))
        .collect();
    got.sort_unstable();
    let mut want: Vec<(i64, u64)> = [0, 1]
        .into_iter()
        .flat_map(|e| bad.iter().map(move |r| (*r, e)))
        .collect();
    want.sort_unstable();
    assert_eq!(got, want);
    for l in &letters {
        use base64::Engine;
        let row = l["row"].as_i64().unwrap();
        assert!(l["url"].as_str().unwrap().ends_with("bad.parquet"), "{l}");
        assert_eq!(l["row_group"], 0, "{l}");
        assert!(
            l["stage"]
                .as_str()
                .unwrap()
                .starts_with("stages[2] (image)"),
            "{l}"
        );
        assert!(l["error"].as_str().unwrap().contains("47 bytes"), "{l}");
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(l["value_base64"].as_str().unwrap())
            .unwrap();
        assert_eq!(bytes, vec![row as u8; 47], "{l}");
    }
    // Resume after every batch: head + tail is the reference, batch for batch.
    let yaml = yaml("dlq-resumed");
    for k in 0..reference.len() {
        same(&interrupted_at(&yaml, k).await, &reference).unwrap();
    }
}
