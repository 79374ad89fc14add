//! `group_by_length`: batches of rows of similar lengths, still every row once, in a shuffled
//! order, with a fraction of the padding of plain shuffled batches.

use std::sync::Arc;

use arrow::array::{Int64Array, ListArray, RecordBatch};
use arrow::datatypes::Int32Type;
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;
use sluice_pipeline::{Batch, Pipeline};

use super::run;
use crate::common::{self, same};

/// `group_by_length`: rows of tokens 1 to 200 long. Every row once; within each group (8
/// batches of 16), the batches hold disjoint ranges of lengths (cut from one sorted order)
/// and leave in a shuffled order; the padding a loader adds (to each batch's longest) is a
/// fraction of what plain shuffled batches need.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grouping_by_length_makes_batches_of_similar_lengths() {
    let dir = tempfile::tempdir().unwrap();
    let ids: Vec<i64> = (0..2000).collect();
    let len = |id: i64| (id * 7919 % 200 + 1) as usize;
    let toks = ListArray::from_iter_primitive::<Int32Type, _, _>(
        ids.iter().map(|&v| Some(vec![Some(v as i32); len(v)])),
    );
    let rb = RecordBatch::try_from_iter([
        ("id", Arc::new(Int64Array::from(ids.clone())) as _),
        ("tok", Arc::new(toks) as _),
    ])
    .unwrap();
    let file = std::fs::File::create(dir.path().join("seqs.parquet")).unwrap();
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(250))
        .build();
    let mut w = ArrowWriter::try_new(file, rb.schema(), Some(props)).unwrap();
    w.write(&rb).unwrap();
    w.close().unwrap();
    let yaml = |group: &str, threads: usize| {
        format!(
            "source: {{type: parquet, path: '{}/*.parquet', batch_rows: 100}}\n\
             stages:\n\
             - {{type: shuffle, buffer_rows: 512, seed: 1, batch_rows: 40{group}}}\n\
             - {{type: batch, size: 16}}\n\
             runtime: {{threads: {threads}}}\n",
            dir.path().display()
        )
    };
    let grouped = yaml(", group_by_length: {column: tok, batches: 8}", 2);
    let batches = run(Pipeline::from_yaml(&grouped).unwrap(), None).await.0;
    let mut got = common::ids(&batches);
    got.sort_unstable();
    assert_eq!(got, ids);
    // Lengths per batch: (shortest, longest, sum).
    let stats = |bs: &[Batch]| -> Vec<(usize, usize, usize)> {
        bs.iter()
            .map(|b| {
                let ls: Vec<usize> = common::ids(std::slice::from_ref(b))
                    .into_iter()
                    .map(len)
                    .collect();
                (
                    *ls.iter().min().unwrap(),
                    *ls.iter().max().unwrap(),
                    ls.iter().sum(),
                )
            })
            .collect()
    };
    let s = stats(&batches);
    // Windows of 512 rows = 4 groups of 8 batches; the last window (464 rows) ends with a
    // group of 5: so consecutive runs of 8 batches are exactly the groups.
    assert_eq!(s.len(), 125);
    let mut descending = 0;
    for group in s.chunks(8) {
        let mut by_longest = group.to_vec();
        by_longest.sort_by_key(|t| std::cmp::Reverse(t.1));
        for pair in by_longest.windows(2) {
            assert!(pair[0].0 >= pair[1].1, "overlapping batches in {group:?}");
        }
        descending += usize::from(by_longest == group);
    }
    assert!(
        descending < 3,
        "{descending} of 16 groups left in sorted order"
    );
    let padding = |s: &[(usize, usize, usize)]| -> usize {
        s.iter().map(|(_, max, sum)| 16 * max - sum).sum()
    };
    let plain = run(Pipeline::from_yaml(&yaml("", 2)).unwrap(), None)
        .await
        .0;
    let (p_grouped, p_plain) = (padding(&s), padding(&stats(&plain)));
    assert!(
        p_grouped * 4 < p_plain,
        "padding {p_grouped} grouped vs {p_plain} plain"
    );
    // One thread or two: the same batches.
    let one = run(
        Pipeline::from_yaml(&yaml(", group_by_length: {column: tok, batches: 8}", 1)).unwrap(),
        None,
    )
    .await
    .0;
    same(&one, &batches).unwrap();
}
