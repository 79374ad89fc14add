//! Property tests of the global shuffle (`shuffle: {mode: global}`) on random small Parquet
//! datasets with tiny pages (so blocks fetch some pages of a row group and skip others):
//! (a) every row exactly once per epoch, (b) identical output for 1 and 3 threads, (c) k
//! batches, snapshot, a fresh pipeline restored from it, the rest — equal to the run never
//! stopped, (d) equal batch counts on every rank, disjoint shares, the left-out rows counted.
//! Then what it refuses, and that a block reads only the pages holding its rows.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use arrow::array::{Float32Array, Int64Array, RecordBatch};
use common::{ids, rt, run, same};
use futures::StreamExt;
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;
use proptest::prelude::*;
use sluice_pipeline::{Batch, Pipeline, PipelineMetrics, SourceState};

/// Writes one Parquet file per entry of `groups` (row counts of its row groups), with pages
/// of at most `page_rows` rows. Ids run 0.. across files in listing order.
fn write_dataset(dir: &Path, groups: &[Vec<usize>], page_rows: usize) -> u64 {
    write_with(dir, groups, page_rows, true)
}

/// Writer settings for pages of at most `page_rows` rows, dictionary encoding tried or not.
fn page_props(page_rows: usize, dictionary: bool) -> WriterProperties {
    WriterProperties::builder()
        .set_dictionary_enabled(dictionary)
        .set_write_batch_size(page_rows)
        .set_data_page_row_count_limit(page_rows)
        .build()
}

/// [`write_dataset`], with dictionary encoding tried or not.
fn write_with(dir: &Path, groups: &[Vec<usize>], page_rows: usize, dictionary: bool) -> u64 {
    let props = page_props(page_rows, dictionary);
    let mut id = 0i64;
    for (f, sizes) in groups.iter().enumerate() {
        let file = std::fs::File::create(dir.join(format!("part-{f:03}.parquet"))).unwrap();
        let mut writer: Option<ArrowWriter<std::fs::File>> = None;
        let mut file = Some(file);
        for &n in sizes {
            let ids: Vec<i64> = (id..id + n as i64).collect();
            let xs: Vec<f32> = ids.iter().map(|v| *v as f32 * 0.5).collect();
            id += n as i64;
            let rb = RecordBatch::try_from_iter([
                ("id", Arc::new(Int64Array::from(ids)) as _),
                ("x", Arc::new(Float32Array::from(xs)) as _),
            ])
            .unwrap();
            let w = writer.get_or_insert_with(|| {
                ArrowWriter::try_new(file.take().unwrap(), rb.schema(), Some(props.clone()))
                    .unwrap()
            });
            w.write(&rb).unwrap();
            w.flush().unwrap(); // one row group per write
        }
        writer.unwrap().close().unwrap();
    }
    id as u64
}

#[derive(Debug, Clone)]
struct Case {
    groups: Vec<Vec<usize>>,
    page_rows: usize,
    batch_rows: usize,
    max_memory: usize,
    batch: usize,
    epochs: u64,
    seed: u64,
}

fn cases() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec(prop::collection::vec(1usize..80, 1..4), 1..4),
        1usize..20,
        1usize..40,
        50usize..3000,
        1usize..30,
        1u64..3,
        any::<u64>(),
    )
        .prop_map(
            |(groups, page_rows, batch_rows, max_memory, batch, epochs, seed)| Case {
                groups,
                page_rows,
                batch_rows,
                max_memory,
                batch,
                epochs,
                seed,
            },
        )
}

fn yaml(dir: &Path, c: &Case, threads: usize, ranks: Option<(usize, usize)>) -> String {
    let ranks = ranks.map_or(String::new(), |(r, w)| {
        format!(", rank: {r}, world_size: {w}")
    });
    format!(
        "source: {{type: parquet, path: '{}/*.parquet', batch_rows: {}, prefetch: 2, epochs: {}}}\n\
         stages:\n\
         - {{type: gaussian_noise, columns: [x], std: 1.0, seed: 9}}\n\
         - {{type: shuffle, mode: global, max_memory: {}, seed: {}, batch_rows: 7}}\n\
         - {{type: batch, size: {}}}\n\
         runtime: {{threads: {threads}, queue_bytes: 4 KiB{ranks}}}\n",
        dir.display(),
        c.batch_rows,
        c.epochs,
        c.max_memory,
        c.seed,
        c.batch
    )
}

/// `yaml`'s first `k` batches, a snapshot (through JSON), then the rest from a fresh
/// pipeline restored from it.
async fn interrupted_at(yaml: &str, k: usize) -> Vec<Batch> {
    let (mut head, state) = run(Pipeline::from_yaml(yaml).unwrap(), Some(k)).await;
    let state: SourceState = serde_json::from_str(&serde_json::to_string(&state).unwrap()).unwrap();
    let (tail, _) = run(Pipeline::from_yaml(yaml).unwrap().resume_from(state), None).await;
    head.extend(tail);
    head
}

async fn run_counted(p: Pipeline) -> (Vec<Batch>, Arc<PipelineMetrics>) {
    let mut s = p.stream();
    let metrics = s.metrics();
    let mut out = Vec::new();
    while let Some(b) = s.next().await {
        out.push(b.unwrap());
    }
    (out, metrics)
}

/// The ids of each epoch, by the epoch of each row's lineage.
fn per_epoch(batches: &[Batch]) -> BTreeMap<u64, Vec<i64>> {
    let mut out: BTreeMap<u64, Vec<i64>> = BTreeMap::new();
    for b in batches {
        let epochs = b
            .lineage
            .spans()
            .iter()
            .flat_map(|s| std::iter::repeat_n(s.epoch, s.len as usize));
        for (e, id) in epochs.zip(ids(std::slice::from_ref(b))) {
            out.entry(e).or_default().push(id);
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 20, ..ProptestConfig::default() })]

    /// (a), (b) and (c) on one rank.
    #[test]
    fn global_shuffle_is_exact_deterministic_and_resumable(c in cases(), cut in 0usize..40) {
        let dir = tempfile::tempdir().unwrap();
        let total = write_dataset(dir.path(), &c.groups, c.page_rows);
        let rt = rt();
        let reference = rt.block_on(run(Pipeline::from_yaml(&yaml(dir.path(), &c, 1, None)).unwrap(), None)).0;
        let epochs = per_epoch(&reference);
        prop_assert_eq!(epochs.len() as u64, c.epochs);
        for got in epochs.values() {
            let mut got = got.clone();
            got.sort_unstable();
            prop_assert_eq!(got, (0..total as i64).collect::<Vec<_>>());
        }
        // Each row's lineage names its own row (ids are row numbers in listing order).
        for b in &reference {
            prop_assert_eq!(b.lineage.num_rows(), b.num_rows() as u64);
        }
        let other = rt.block_on(run(Pipeline::from_yaml(&yaml(dir.path(), &c, 3, None)).unwrap(), None)).0;
        same(&reference, &other)?;
        let k = cut.min(reference.len());
        let joined = rt.block_on(interrupted_at(&yaml(dir.path(), &c, 2, None), k));
        same(&joined, &reference)?;
    }

    /// (d): equal batch counts in every epoch on every rank, shares disjoint, fewer than
    /// `world` rows left out per epoch and counted; and (c) on the last rank.
    #[test]
    fn global_shuffle_gives_ranks_equal_disjoint_shares(c in cases(), world in 2usize..4, cut in 0usize..20) {
        let dir = tempfile::tempdir().unwrap();
        let total = write_dataset(dir.path(), &c.groups, c.page_rows);
        prop_assume!(total >= world as u64);
        let rt = rt();
        let mut counts = Vec::new();
        let mut all: BTreeMap<u64, Vec<i64>> = BTreeMap::new();
        let mut last = Vec::new();
        for rank in 0..world {
            let y = yaml(dir.path(), &c, 2, Some((rank, world)));
            let (out, metrics) = rt.block_on(run_counted(Pipeline::from_yaml(&y).unwrap()));
            let left_out = metrics.source.shard_left_out.load(Ordering::Relaxed);
            prop_assert_eq!(left_out, (total % world as u64) * c.epochs);
            let mut n: BTreeMap<u64, usize> = BTreeMap::new();
            for b in &out {
                *n.entry(b.mark.unwrap().epoch).or_default() += 1;
            }
            counts.push(n);
            for (e, got) in per_epoch(&out) {
                all.entry(e).or_default().extend(got);
            }
            last = out;
        }
        prop_assert!(counts.iter().all(|n| *n == counts[0]), "{:?}", counts);
        for epoch in 0..c.epochs {
            let got = all.remove(&epoch).unwrap_or_default();
            let distinct: BTreeSet<i64> = got.iter().copied().collect();
            prop_assert_eq!(distinct.len(), got.len(), "a row on two ranks");
            prop_assert_eq!(got.len() as u64, total - total % world as u64);
        }
        let y = yaml(dir.path(), &c, 2, Some((world - 1, world)));
        let joined = rt.block_on(interrupted_at(&y, cut.min(last.len())));
        same(&joined, &last)?;
    }
}

/// Each epoch has its own permutation, and no position keeps its row more than chance would.
#[test]
fn each_epoch_is_permuted_anew() {
    let dir = tempfile::tempdir().unwrap();
    let total = write_dataset(dir.path(), &[vec![500, 500], vec![1000]], 100);
    let c = Case {
        groups: Vec::new(),
        page_rows: 100,
        batch_rows: 64,
        max_memory: 4096,
        batch: 100,
        epochs: 2,
        seed: 3,
    };
    let out = rt()
        .block_on(run(
            Pipeline::from_yaml(&yaml(dir.path(), &c, 2, None)).unwrap(),
            None,
        ))
        .0;
    let epochs = per_epoch(&out);
    let (a, b) = (&epochs[&0], &epochs[&1]);
    assert_eq!(a.len() as u64, total);
    let fixed = a.iter().zip(b).filter(|(x, y)| x == y).count();
    let in_place = a
        .iter()
        .enumerate()
        .filter(|(i, v)| *i as i64 == **v)
        .count();
    // A uniform permutation keeps ~1 of 2000 rows in place (Poisson(1)).
    assert!(
        fixed < 8 && in_place < 8,
        "{fixed} rows at the same position in both epochs, {in_place} in place"
    );
}

/// A block fetches only the pages holding its rows: reading blocks of 20 rows of one row
/// group of 200,000 rows in pages of 100 costs at most 20 pages per column and block, not
/// the row group.
#[test]
fn a_block_fetches_only_the_pages_it_needs() {
    let dir = tempfile::tempdir().unwrap();
    // Without dictionaries: a dictionary page is fetched with any page of its column chunk.
    write_with(dir.path(), &[vec![200_000]], 100, false);
    let size = std::fs::metadata(dir.path().join("part-000.parquet"))
        .unwrap()
        .len();
    // Two columns of 12 bytes a row: 240 bytes hold 20 rows; one epoch read as 10,000 blocks,
    // one at a time.
    let y = format!(
        "source: {{type: parquet, path: '{}/*.parquet', prefetch: 1}}\n\
         stages:\n\
         - {{type: shuffle, mode: global, max_memory: 240, seed: 1, batch_rows: 5}}\n\
         runtime: {{threads: 2, queue_bytes: 1 KiB}}\n",
        dir.path().display()
    );
    let rt = rt();
    let (first, metrics) = rt.block_on(async {
        let mut s = Pipeline::from_yaml(&y).unwrap().stream();
        let metrics = s.metrics();
        let first = s.next().await.unwrap().unwrap();
        (first, metrics)
    });
    assert_eq!(first.num_rows(), 5);
    let read = metrics.source.bytes_read.load(Ordering::Relaxed);
    let rows = metrics.source.rows.load(Ordering::Relaxed);
    // The few blocks read ahead by now, each at most 40 pages of ~1 KB.
    assert!(rows < 1000, "{rows} rows read before the first batch");
    assert!(
        read > 0 && read * 10 < size,
        "{read} bytes read of a {size}-byte file for {rows} rows"
    );
}

/// Fixed-size list and fixed-size binary columns (feature vectors, images) keep their rows'
/// values through both ways a block reads a row group: most of its rows in pages of many
/// rows (the whole span decoded by the lists reader and filtered) and a few rows of pages
/// of few rows (only their pages, by arrow-rs's reader). Every row exactly once per epoch.
#[test]
fn list_and_binary_rows_keep_their_values_in_both_ways_of_reading() {
    use arrow::array::{Array, FixedSizeBinaryArray, FixedSizeListArray};
    use arrow::datatypes::{DataType, Field};
    // (rows per page, max_memory): ~a third of each row group per block; 5 rows per block.
    for (page_rows, max_memory) in [(500, "24 KiB"), (2, "500")] {
        let dir = tempfile::tempdir().unwrap();
        let props = page_props(page_rows, false);
        let mut id = 0i64;
        for f in 0..2 {
            let path = dir.path().join(format!("part-{f:03}.parquet"));
            let mut w: Option<ArrowWriter<std::fs::File>> = None;
            for n in [300i64, 250] {
                let ids: Vec<i64> = (id..id + n).collect();
                id += n;
                let values: Vec<f32> = (ids.iter())
                    .flat_map(|&i| (0..4).map(move |k| i as f32 + k as f32 / 8.0))
                    .collect();
                let item = Arc::new(Field::new_list_field(DataType::Float32, false));
                let v = FixedSizeListArray::try_new(
                    item,
                    4,
                    Arc::new(Float32Array::from(values)),
                    None,
                )
                .unwrap();
                let bytes = ids.iter().map(|&i| (i as u32).to_le_bytes()[..3].to_vec());
                let b = FixedSizeBinaryArray::try_from_iter(bytes).unwrap();
                let rb = RecordBatch::try_from_iter([
                    ("id", Arc::new(Int64Array::from(ids)) as _),
                    ("v", Arc::new(v) as _),
                    ("b", Arc::new(b) as _),
                ])
                .unwrap();
                let w = w.get_or_insert_with(|| {
                    let file = std::fs::File::create(&path).unwrap();
                    ArrowWriter::try_new(file, rb.schema(), Some(props.clone())).unwrap()
                });
                w.write(&rb).unwrap();
                w.flush().unwrap();
            }
            w.unwrap().close().unwrap();
        }
        let y = format!(
            "source: {{type: parquet, path: '{}/*.parquet', batch_rows: 64, epochs: 2}}\n\
             stages:\n\
             - {{type: shuffle, mode: global, max_memory: {max_memory}, seed: 4, batch_rows: 50}}\n\
             runtime: {{threads: 2, queue_bytes: 64 KiB}}\n",
            dir.path().display()
        );
        let (out, _) = rt().block_on(run(Pipeline::from_yaml(&y).unwrap(), None));
        let mut seen = Vec::new();
        for batch in &out {
            let rb = &batch.data;
            let ids = rb.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
            let v = rb
                .column(1)
                .as_any()
                .downcast_ref::<FixedSizeListArray>()
                .unwrap();
            let b = rb
                .column(2)
                .as_any()
                .downcast_ref::<FixedSizeBinaryArray>()
                .unwrap();
            for r in 0..rb.num_rows() {
                let i = ids.value(r);
                let want: Vec<f32> = (0..4).map(|k| i as f32 + k as f32 / 8.0).collect();
                let got = v.value(r);
                let got = got.as_any().downcast_ref::<Float32Array>().unwrap();
                assert_eq!(
                    got.values().to_vec(),
                    want,
                    "row {i} (pages of {page_rows})"
                );
                assert_eq!(b.value(r), &(i as u32).to_le_bytes()[..3], "row {i}");
                seen.push(i);
            }
        }
        seen.sort_unstable();
        let want: Vec<i64> = (0..id).flat_map(|i| [i, i]).collect();
        assert_eq!(seen, want, "pages of {page_rows}: each row once per epoch");
    }
}

/// Damaged pages read by a global shuffle's blocks of few rows (only the pages holding them,
/// by arrow-rs's reader) stop the run with an error naming the file and the row group, not a
/// panic; the batches before it are whole.
#[test]
fn a_damaged_page_read_by_its_rows_alone_is_an_error_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    write_with(dir.path(), &[vec![4000]], 2, false);
    let path = dir.path().join("part-000.parquet");
    let mut bytes = std::fs::read(&path).unwrap();
    // 512 bytes zeroed in the middle of the data: a few dozen page headers among them.
    let mid = bytes.len() / 3;
    bytes[mid..mid + 512].fill(0);
    std::fs::write(&path, &bytes).unwrap();
    // ~20 rows a block: each touches ~20 of the row group's 2,000 pages per column.
    let y = format!(
        "source: {{type: parquet, path: '{}/*.parquet'}}\n\
         stages:\n\
         - {{type: shuffle, mode: global, max_memory: 2 KiB, seed: 5, batch_rows: 8}}\n\
         runtime: {{threads: 2, queue_bytes: 4 KiB}}\n",
        dir.path().display()
    );
    let (delivered, error) = rt().block_on(async {
        let mut s = Pipeline::from_yaml(&y).unwrap().stream();
        let mut delivered = 0;
        while let Some(b) = s.next().await {
            match b {
                Ok(b) => delivered += b.num_rows(),
                Err(e) => return (delivered, Some(e.to_string())),
            }
        }
        (delivered, None)
    });
    let error = error.unwrap_or_else(|| panic!("{delivered} rows read without an error"));
    assert!(
        error.contains("part-000.parquet") && error.contains("row group 0"),
        "{error}"
    );
    assert!(delivered < 4000 && delivered % 8 == 0, "{delivered} rows");
}

/// What a global shuffle cannot do is refused with the reason, before reading anything.
#[test]
fn settings_a_global_shuffle_cannot_honour_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    write_dataset(dir.path(), &[vec![10]], 5);
    let path = format!("{}/*.parquet", dir.path().display());
    let cases = [
        (
            format!("source: {{type: parquet, path: '{path}', shard: drop_last}}\nstages:\n- {{type: shuffle, mode: global}}\n"),
            "`shard: drop_last` on the source has nothing to decide",
        ),
        (
            format!("source: {{type: parquet, path: '{path}'}}\nstages:\n- {{type: shuffle, mode: global, across_ranks: true}}\n"),
            "remove `across_ranks`",
        ),
        (
            format!("source: {{type: parquet, path: '{path}'}}\nstages:\n- {{type: shuffle, mode: global}}\n- {{type: shuffle}}\n"),
            "shuffles it again and adds nothing but memory",
        ),
        (
            "source: {type: kafka, brokers: '127.0.0.1:1', topic: t, format: arrow_ipc, assignment: static}\nstages:\n- {type: shuffle, mode: global}\n".to_string(),
            "a Kafka stream has neither positions to jump to nor an end",
        ),
        (
            format!("source: {{type: parquet, path: '{path}'}}\nstages:\n- {{type: shuffle, mode: global, group_by_length: {{column: id}}}}\n- {{type: batch, size: 2}}\n"),
            "`mode: global` has none",
        ),
    ];
    let rt = rt();
    for (y, want) in cases {
        let e = rt.block_on(async {
            let mut s = Pipeline::from_yaml(&y).unwrap().stream();
            s.next().await.unwrap().unwrap_err().to_string()
        });
        assert!(e.contains(want), "{y}\n→ {e}");
    }
}

/// A checkpoint of a window shuffle does not resume under a global one (its position would
/// name other rows): refused, naming the setting.
#[test]
fn a_window_checkpoint_is_refused_by_a_global_shuffle() {
    let dir = tempfile::tempdir().unwrap();
    write_dataset(dir.path(), &[vec![300, 300]], 50);
    let y = |mode: &str| {
        format!(
            "source: {{type: parquet, path: '{}/*.parquet'}}\nstages:\n- {{type: shuffle, mode: {mode}, buffer_rows: 100, seed: 1, batch_rows: 10}}\nruntime: {{threads: 2}}\n",
            dir.path().display()
        )
    };
    let rt = rt();
    let (_, state) = rt.block_on(run(Pipeline::from_yaml(&y("window")).unwrap(), Some(5)));
    let e = rt.block_on(async {
        let mut s = Pipeline::from_yaml(&y("global"))
            .unwrap()
            .resume_from(state)
            .stream();
        s.next().await.unwrap().unwrap_err().to_string()
    });
    assert!(e.contains("mode global"), "{e}");
}

/// A position is (block, row of it), and the block size comes from `max_memory` over the
/// files' decoded row size: the same rows written with other pages (another row size) would
/// put the position elsewhere, so the resume is refused, naming the block size.
#[test]
fn a_checkpoint_over_files_of_another_row_size_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    write_with(dir.path(), &[vec![3000]], 1000, false);
    let y = format!(
        "source: {{type: parquet, path: '{}/*.parquet'}}\nstages:\n- {{type: shuffle, mode: global, max_memory: 8 KiB, seed: 1, batch_rows: 10}}\nruntime: {{threads: 2}}\n",
        dir.path().display()
    );
    let rt = rt();
    let (_, state) = rt.block_on(run(Pipeline::from_yaml(&y).unwrap(), Some(3)));
    // The same rows in pages of 2 rows: every page header adds to the row size. Written
    // aside and renamed over the old file, as a file being read must be replaced: reads the
    // stopped pipeline still had in flight map the old file, and cutting it short under them
    // (writing it in place) ends the process with SIGBUS, as with any mapped reader.
    let aside = tempfile::tempdir().unwrap();
    write_with(aside.path(), &[vec![3000]], 2, false);
    let name = "part-000.parquet";
    std::fs::rename(aside.path().join(name), dir.path().join(name)).unwrap();
    let e = rt.block_on(async {
        let mut s = Pipeline::from_yaml(&y).unwrap().resume_from(state).stream();
        s.next().await.unwrap().unwrap_err().to_string()
    });
    assert!(e.contains("global shuffle block"), "{e}");
}

/// `--elastic`: 2 ranks interrupted 3 batches into epoch 0 continue on 3. The batches the
/// old ranks still owed are each delivered once, as the old ranks would have made them
/// (the new ranks replay the old ranks' block reads), then every new rank continues as a
/// run on 3 ranks would from epoch 1.
#[test]
fn a_rescaled_global_shuffle_delivers_every_owed_batch_once_then_continues() {
    let dir = tempfile::tempdir().unwrap();
    write_dataset(dir.path(), &[vec![40, 33], vec![25], vec![50, 17]], 5);
    let c = Case {
        groups: Vec::new(),
        page_rows: 5,
        batch_rows: 9,
        max_memory: 900,
        batch: 6,
        epochs: 2,
        seed: 41,
    };
    let rt = rt();
    let rank = |r: usize, w: usize, state: Option<SourceState>, limit: Option<usize>| {
        let mut p = Pipeline::from_yaml(&yaml(dir.path(), &c, 2, Some((r, w)))).unwrap();
        if let Some(s) = state {
            let s = serde_json::to_string(&s).unwrap();
            p = p.resume_from(serde_json::from_str(&s).unwrap());
        }
        rt.block_on(run(p, limit))
    };
    let (old, new, k) = (2, 3, 3);
    let reference: Vec<Vec<Batch>> = (0..old).map(|r| rank(r, old, None, None).0).collect();
    let n = reference[0].len() / 2;
    assert!(n > k, "{n} batches per epoch");
    let states: Vec<SourceState> = (0..old).map(|r| rank(r, old, None, Some(k)).1).collect();
    let template = Pipeline::from_yaml(&yaml(dir.path(), &c, 1, None)).unwrap();
    // The states are block + row positions: the batch count is not in them, and is given
    // (as `sluice train --elastic` gives its steps).
    let e = template.rescale(&states, None, new).unwrap_err();
    assert!(e.contains("with `mode: global`, give them"), "{e}");
    let dealt = template.rescale(&states, Some(k as u64), new).unwrap();
    let outs: Vec<Vec<Batch>> = (0..new)
        .map(|j| rank(j, new, Some(dealt[j].clone()), None).0)
        .collect();
    let share = |s: &SourceState| {
        let r = s.rescaled.as_ref().unwrap();
        let real: u64 = r.runs.iter().map(|x| x.end - x.first).sum();
        (r.batches as usize, real as usize)
    };
    let (p, _) = share(&dealt[0]);
    let owed: Vec<Batch> = reference.iter().flat_map(|r| r[k..n].to_vec()).collect();
    let mut delivered = Vec::new();
    for (j, o) in outs.iter().enumerate() {
        let (batches, real) = share(&dealt[j]);
        assert_eq!(batches, p);
        delivered.extend(o[..real].iter().cloned());
        assert!(o[real..p].iter().all(|b| b.num_rows() == 0));
    }
    same(&delivered, &owed).unwrap();
    for (j, o) in outs.iter().enumerate() {
        let plain = rank(j, new, None, None).0;
        let per_epoch = plain.len() / 2;
        same(&o[p..], &plain[per_epoch..]).unwrap();
    }
}
