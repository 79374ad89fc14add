//! Property tests of the shuffle, sharding and exact resume on random small Parquet datasets:
//! (a) one epoch emits every row exactly once, (b) output is identical for 1, 2 and 4
//! threads, (c) N batches = k batches, snapshot, restore in a fresh pipeline, N − k batches
//! (a, b and c also with `across_ranks`), (d) every rank gets the same number of batches.
//! The pipeline they run has every stage kind (`select` in the hand-over tests).
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use arrow::array::{
    AsArray, FixedSizeBinaryArray, Float32Array, Int64Array, ListArray, RecordBatch,
};
use arrow::datatypes::{Float32Type, Int32Type, Int64Type};
use common::{ids, rt, same};
use futures::StreamExt;
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;
use proptest::prelude::*;
use sluice_pipeline::collective::{Collective, LocalCollective};
use sluice_pipeline::{Batch, Pipeline, PipelineMetrics, SourceState};

/// Writes `files` Parquet files; file i has the row groups `groups[i]` (row counts). Ids run
/// 0.. across files in listing order.
fn write_dataset(dir: &Path, groups: &[Vec<usize>]) -> u64 {
    let mut id = 0i64;
    for (f, sizes) in groups.iter().enumerate() {
        let path = dir.join(format!("part-{f:03}.parquet"));
        let file = std::fs::File::create(path).unwrap();
        let props = WriterProperties::builder().build();
        let mut writer: Option<ArrowWriter<std::fs::File>> = None;
        let mut file = Some(file);
        for &n in sizes {
            let ids: Vec<i64> = (id..id + n as i64).collect();
            let xs: Vec<f32> = ids.iter().map(|v| *v as f32 * 0.5).collect();
            id += n as i64;
            // A 2×2×3 image and a token sequence per row, derived from the id.
            let imgs = FixedSizeBinaryArray::try_from_iter(ids.iter().map(|v| {
                (0..12)
                    .map(|k| (*v as u8).wrapping_mul(7).wrapping_add(k))
                    .collect::<Vec<u8>>()
            }))
            .unwrap();
            // A 4×4×3 image: long enough (48 bytes) to live outside a view, in its buffer.
            let big = FixedSizeBinaryArray::try_from_iter(ids.iter().map(|v| {
                (0..48)
                    .map(|k| (*v as u8).wrapping_mul(13).wrapping_add(k * 5))
                    .collect::<Vec<u8>>()
            }))
            .unwrap();
            let toks = ListArray::from_iter_primitive::<Int32Type, _, _>(ids.iter().map(|v| {
                Some(
                    (0..(v % 5 + 1) as i32)
                        .map(|t| Some(t + 1))
                        .collect::<Vec<_>>(),
                )
            }));
            let rb = RecordBatch::try_from_iter([
                ("id", Arc::new(Int64Array::from(ids)) as _),
                ("x", Arc::new(Float32Array::from(xs)) as _),
                ("img", Arc::new(imgs) as _),
                ("big", Arc::new(big) as _),
                ("tok", Arc::new(toks) as _),
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
    batch_rows: usize,
    buffer_rows: usize,
    max_memory: usize,
    batch: usize,
    epochs: u64,
    seed: u64,
    filter: bool,
    /// A filter after the last `batch` too (batches then stand for rows they no longer hold).
    trim: bool,
    /// `group_by_length` over the token column, this many batches per group (`buffer_rows`
    /// is then a multiple of `batch`).
    group: Option<usize>,
}

fn cases() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec(prop::collection::vec(1usize..60, 1..4), 1..4),
        1usize..40,
        1usize..150,
        prop_oneof![Just(1usize << 30), 200usize..3000],
        1usize..50,
        1u64..3,
        any::<u64>(),
        any::<bool>(),
        any::<bool>(),
        prop::option::of(1usize..4),
    )
        .prop_map(
            |(
                groups,
                batch_rows,
                buffer_rows,
                max_memory,
                batch,
                epochs,
                seed,
                filter,
                trim,
                group,
            )| {
                Case {
                    groups,
                    batch_rows,
                    buffer_rows: match group {
                        Some(_) => buffer_rows.div_ceil(batch) * batch,
                        None => buffer_rows,
                    },
                    max_memory,
                    batch,
                    epochs,
                    seed,
                    filter,
                    trim,
                    group,
                }
            },
        )
}

fn yaml(dir: &Path, c: &Case, threads: usize, extra_runtime: &str, across: bool) -> String {
    let filter = if c.filter {
        "- {type: filter, predicate: 'id % 5 <> 1'}\n"
    } else {
        ""
    };
    let trim = if c.trim {
        "- {type: filter, predicate: 'id % 7 <> 3'}\n"
    } else {
        ""
    };
    let group = c
        .group
        .map(|g| format!(", group_by_length: {{column: tok, batches: {g}}}"))
        .unwrap_or_default();
    format!(
        "source: {{type: parquet, path: '{}/*.parquet', batch_rows: {}, prefetch: 2, epochs: {}}}\n\
         stages:\n\
         {filter}\
         - {{type: gaussian_noise, columns: [x], std: 1.0, seed: 9}}\n\
         - {{type: image, column: img, output: pix, shape: [2, 2, 3], seed: 5, ops: [{{random_crop: {{size: [5, 5], padding: 1, padding_mode: reflect, pad_if_needed: true}}}}, {{horizontal_flip: {{}}}}, {{color_jitter: {{brightness: 0.3, contrast: 0.3, saturation: 0.3, hue: 0.1}}}}, {{random_grayscale: {{p: 0.3}}}}, {{normalize: {{mean: [0.5, 0.5, 0.5], std: [0.2, 0.2, 0.2]}}}}]}}\n\
         - {{type: shuffle, buffer_rows: {}, max_memory: {}, seed: {}, batch_rows: 7, across_ranks: {across}{group}}}\n\
         - {{type: feature_dropout, columns: [x], p: 0.3, seed: 2}}\n\
         - {{type: clip, columns: [x], min: -200.0, max: 200.0}}\n\
         - {{type: standardize, columns: [x]}}\n\
         - {{type: fill_null, columns: {{x: 0.0}}}}\n\
         - {{type: cast, columns: {{id: int64}}}}\n\
         - {{type: one_hot, column: id, num_classes: 1000, output: id_hot, smoothing: 0.1}}\n\
         - {{type: mask_tokens, column: tok, p: 0.3, mask_token: 0, mask_replace_prob: 0.8, random_replace_prob: 0.1, vocab_size: 50, special_tokens: [1], labels_column: tok_labels, seed: 4}}\n\
         - {{type: rename, columns: {{tok_labels: labels}}}}\n\
         - {{type: image, column: img, output: img2, shape: [2, 2, 3], ops: [{{random_resized_crop: {{size: [3, 3]}}}}, {{vertical_flip: {{p: 0.5}}}}, {{random_erasing: {{p: 0.5, scale: [0.1, 0.5], value: random}}}}]}}\n\
         - {{type: batch, size: {}}}\n\
         {trim}\
         - {{type: mixup, columns: [x, pix], alpha: 0.4, seed: 6, cutmix: {{column: pix, shape: [3, 5, 5], p: 0.5}}}}\n\
         runtime: {{threads: {threads}, parallelism: {threads}, queue_bytes: 4 KiB{extra_runtime}}}\n",
        dir.display(),
        c.batch_rows,
        c.epochs,
        c.buffer_rows,
        c.max_memory,
        c.seed,
        c.batch
    )
}

fn kept(id: i64, c: &Case) -> bool {
    (!c.filter || id % 5 != 1) && (!c.trim || id % 7 != 3)
}

async fn run(p: Pipeline, limit: Option<usize>) -> (Vec<Batch>, SourceState) {
    run_synced(p, limit, None).await
}

/// Like a data-parallel trainer: ranks stop together (a rank that drops its stream while
/// another still needs an exchange would abandon the collective).
async fn run_synced(
    p: Pipeline,
    limit: Option<usize>,
    barrier: Option<Arc<tokio::sync::Barrier>>,
) -> (Vec<Batch>, SourceState) {
    let mut s = p.stream();
    let out = common::take(&mut s, limit).await;
    if let Some(b) = barrier {
        b.wait().await;
    }
    (out, s.snapshot())
}

/// What an interrupted run and its resume deliver: `yaml`'s first `k` batches, a snapshot
/// (through JSON), then the rest from a fresh pipeline restored from it.
async fn interrupted_at(yaml: &str, k: usize) -> Vec<Batch> {
    let (mut head, state) = run(Pipeline::from_yaml(yaml).unwrap(), Some(k)).await;
    let state: SourceState = serde_json::from_str(&serde_json::to_string(&state).unwrap()).unwrap();
    let (tail, _) = run(Pipeline::from_yaml(yaml).unwrap().resume_from(state), None).await;
    head.extend(tail);
    head
}

/// Whether `policy` gives every one of `world` ranks nothing of the dataset `groups` (its
/// row groups, each of at least one row): an error, not a run that reads nothing.
fn no_share(groups: &[Vec<usize>], world: usize, policy: &str) -> bool {
    let rows: usize = groups.iter().flatten().sum();
    let row_groups: usize = groups.iter().map(Vec::len).sum();
    match policy {
        "drop_last" => row_groups < world,
        "redistribute" => rows < world,
        _ => false,
    }
}

/// Every batch of `p` and its counters, or the first error.
async fn run_counted(p: Pipeline) -> Result<(Vec<Batch>, Arc<PipelineMetrics>), String> {
    let mut s = p.stream();
    let metrics = s.metrics();
    let mut out = Vec::new();
    while let Some(b) = s.next().await {
        out.push(b.map_err(|e| e.to_string())?);
    }
    Ok((out, metrics))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// (a), (b) and (c) for one rank.
    #[test]
    fn shuffle_is_exact_deterministic_and_resumable(c in cases(), cut in 0usize..40) {
        let dir = tempfile::tempdir().unwrap();
        let total = write_dataset(dir.path(), &c.groups);
        let rt = rt();
        let reference = rt.block_on(run(Pipeline::from_yaml(&yaml(dir.path(), &c, 1, "", false)).unwrap(), None)).0;
        // (a) every kept row exactly once per epoch; x still pairs with its id (noise aside).
        let mut per_epoch: BTreeMap<u64, Vec<i64>> = BTreeMap::new();
        for b in &reference {
            let id = b.data.column_by_name("id").unwrap().as_primitive::<Int64Type>();
            for (i, span) in (0..b.num_rows()).zip(b.lineage.spans().iter().flat_map(|s| std::iter::repeat_n(s.epoch, s.len as usize))) {
                per_epoch.entry(span).or_default().push(id.value(i));
            }
        }
        let expected: Vec<i64> = (0..total as i64).filter(|i| kept(*i, &c)).collect();
        prop_assert_eq!(per_epoch.len() as u64, if expected.is_empty() { 0 } else { c.epochs });
        for (_, mut got) in per_epoch {
            got.sort_unstable();
            prop_assert_eq!(&got, &expected);
        }
        // (b) thread count does not matter.
        for threads in [2, 4] {
            let other = rt.block_on(run(Pipeline::from_yaml(&yaml(dir.path(), &c, threads, "", false)).unwrap(), None)).0;
            same(&reference, &other)?;
        }
        // (c) k batches, snapshot (through JSON), restore in a fresh pipeline, the rest.
        let k = cut.min(reference.len());
        let joined = rt.block_on(interrupted_at(&yaml(dir.path(), &c, 2, "", false), k));
        // Batches may be cut differently only where the `batch` stage restarted: compare rows.
        prop_assert_eq!(ids(&joined), ids(&reference));
        let xs = |bs: &[Batch]| -> Vec<u32> { bs.iter().flat_map(|b| b.data.column_by_name("x").unwrap().as_primitive::<Float32Type>().values().iter().map(|v| v.to_bits()).collect::<Vec<_>>()).collect() };
        prop_assert_eq!(xs(&joined), xs(&reference));
        // Resuming right after a full batch reproduces the batches themselves.
        same(&joined[..], &reference[..])?;
    }

    /// (d) equal batch counts on every rank in every epoch, for every policy; `redistribute`
    /// leaves out fewer than `world_size` rows per epoch and duplicates none within one. What
    /// a policy leaves out or repeats is counted (`shard_left_out`, `shard_repeated`); one
    /// that would give every rank nothing is an error.
    #[test]
    fn ranks_get_equal_batch_counts(c in cases(), world in 2usize..4, policy in prop_oneof![Just("redistribute"), Just("drop_last"), Just("pad")]) {
        let dir = tempfile::tempdir().unwrap();
        let total = write_dataset(dir.path(), &c.groups);
        // (A filter before the batch makes the counts depend on the data; one after it
        // does not: a batch it empties is delivered empty under several ranks.)
        let c = Case { filter: false, ..c };
        let rt = rt();
        let mut counts = Vec::new();
        let mut all: BTreeMap<u64, Vec<i64>> = BTreeMap::new();
        for rank in 0..world {
            let epochs = format!("epochs: {}}}", c.epochs);
            let y = yaml(dir.path(), &c, 2, &format!(", rank: {rank}, world_size: {world}"), false)
                .replace(&epochs, &format!("epochs: {}, shard: {policy}}}", c.epochs));
            let result = rt.block_on(run_counted(Pipeline::from_yaml(&y).unwrap()));
            if no_share(&c.groups, world, policy) {
                let e = result.err().unwrap_or_default();
                prop_assert!(e.contains(&format!("shard `{policy}` gives each of the {world} ranks 0 of the epoch's {total} rows")), "{}", e);
                continue;
            }
            let (out, metrics) = result.unwrap();
            // Every rank reads the same share; with the rows left out (or repeated) that is
            // the whole epoch.
            let read = metrics.source.rows.load(Ordering::Relaxed);
            let left_out = metrics.source.shard_left_out.load(Ordering::Relaxed);
            let repeated = metrics.source.shard_repeated.load(Ordering::Relaxed);
            prop_assert_eq!(world as u64 * read + left_out - repeated, total * c.epochs);
            prop_assert!(left_out == 0 || repeated == 0);
            if policy == "redistribute" {
                prop_assert_eq!(left_out, (total % world as u64) * c.epochs);
            }
            // Batches per epoch (a batch never holds two), and the ids of each epoch.
            let mut per_epoch: BTreeMap<u64, usize> = BTreeMap::new();
            for b in &out {
                let epoch = b.mark.unwrap().epoch;
                prop_assert!(b.lineage.spans().iter().all(|s| s.epoch == epoch));
                *per_epoch.entry(epoch).or_default() += 1;
                all.entry(epoch).or_default().extend(ids(std::slice::from_ref(b)));
            }
            counts.push(per_epoch);
        }
        prop_assert!(counts.iter().all(|n| *n == counts[0]), "{:?}", counts);
        if policy == "redistribute" {
            // (With fewer rows than ranks, every row is left out: no epoch has a batch.)
            prop_assert!(all.keys().all(|e| *e < c.epochs), "{:?}", all.keys());
            for epoch in 0..c.epochs {
                let mut got = all.remove(&epoch).unwrap_or_default();
                let n = got.len();
                got.sort_unstable();
                got.dedup();
                prop_assert_eq!(got.len(), n);
                let kept_total = (0..total as i64).filter(|i| kept(*i, &c)).count();
                prop_assert!(kept_total - n < world);
            }
        }
    }

    /// (d) without a stage that cuts batches: the source's batches would end where row groups
    /// end, which falls differently on each rank, so each rank's rows are cut into batches of
    /// `batch_rows` across them. Equal counts in every epoch, every batch but an epoch's last
    /// full (counting the rows a filter removed), and (c) an exact resume.
    #[test]
    fn ranks_get_equal_batch_counts_without_a_batch_stage(c in cases(), world in 2usize..4, policy in prop_oneof![Just("redistribute"), Just("drop_last"), Just("pad")], cut in 0usize..30) {
        prop_assume!(!no_share(&c.groups, world, policy));
        let dir = tempfile::tempdir().unwrap();
        write_dataset(dir.path(), &c.groups);
        let filter = if c.filter { "- {type: filter, predicate: 'id % 5 <> 1'}\n" } else { "" };
        let y = |rank: usize| format!(
            "source: {{type: parquet, path: '{}/*.parquet', batch_rows: {}, prefetch: 2, epochs: {}, shard: {policy}}}\n\
             stages:\n\
             {filter}\
             - {{type: gaussian_noise, columns: [x], std: 1.0, seed: 9}}\n\
             runtime: {{threads: 2, queue_bytes: 4 KiB, rank: {rank}, world_size: {world}}}\n",
            dir.path().display(), c.batch_rows, c.epochs);
        let rt = rt();
        let mut counts = Vec::new();
        let mut last = Vec::new();
        for rank in 0..world {
            last = rt.block_on(run(Pipeline::from_yaml(&y(rank)).unwrap(), None)).0;
            let mut per_epoch: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
            for b in &last {
                per_epoch.entry(b.mark.unwrap().epoch).or_default().push(b.num_rows() as u64 + b.dropped);
            }
            for sizes in per_epoch.values() {
                let (tail, full) = sizes.split_last().unwrap();
                prop_assert!(full.iter().all(|n| *n == c.batch_rows as u64), "{:?}", sizes);
                prop_assert!(*tail > 0 && *tail <= c.batch_rows as u64, "{:?}", sizes);
            }
            counts.push(per_epoch.into_iter().map(|(e, s)| (e, s.len())).collect::<Vec<_>>());
        }
        prop_assert!(counts.iter().all(|n| *n == counts[0]), "{:?}", counts);
        // (c) on the last rank: k batches, snapshot, restore, the rest.
        let joined = rt.block_on(interrupted_at(&y(world - 1), cut.min(last.len())));
        same(&joined, &last)?;
    }

    /// (a), (b) and (c) with `across_ranks` on the local collective: 2 ranks as tasks of one
    /// process, k batches each, snapshot, fresh pipelines restored, the rest. Windows held
    /// in memory and windows spilled (a `max_memory` of a few rows: spilled runs sent in
    /// rounds, received rows spilled again) alike.
    #[test]
    fn across_ranks_is_exact_deterministic_and_resumable(c in cases(), cut in 0usize..20) {
        prop_assume!(!no_share(&c.groups, 2, "redistribute"));
        let dir = tempfile::tempdir().unwrap();
        let total = write_dataset(dir.path(), &c.groups);
        let c = Case { filter: false, ..c };
        let rt = rt();
        let y = yaml(dir.path(), &c, 1, "", true);
        let all = |y: &str, limit: Option<usize>, states: Option<Vec<SourceState>>| {
            let group = LocalCollective::group(2);
            let y = y.to_string();
            rt.block_on(async move {
                let mut tasks = Vec::new();
                let barrier = Arc::new(tokio::sync::Barrier::new(2));
                for (r, col) in group.into_iter().enumerate() {
                    let mut p = Pipeline::from_yaml(&y).unwrap().with_collective(Arc::new(col) as Arc<dyn Collective>);
                    if let Some(s) = &states {
                        p = p.resume_from(s[r].clone());
                    }
                    tasks.push(tokio::spawn(run_synced(p, limit, Some(barrier.clone()))));
                }
                let mut out = Vec::new();
                for t in tasks {
                    out.push(t.await.unwrap());
                }
                out
            })
        };
        let both = |limit, states| all(&y, limit, states);
        let reference = both(None, None);
        // Every kept row at most once per epoch; at most one row per epoch left out (the
        // even split between 2 ranks).
        let mut per_epoch: BTreeMap<u64, Vec<i64>> = BTreeMap::new();
        for (batches, _) in &reference {
            for b in batches {
                let id = b.data.column_by_name("id").unwrap().as_primitive::<Int64Type>();
                let epochs = b.lineage.spans().iter().flat_map(|s| std::iter::repeat_n(s.epoch, s.len as usize));
                for (i, e) in epochs.enumerate() {
                    per_epoch.entry(e).or_default().push(id.value(i));
                }
            }
        }
        let kept_rows = (0..total as i64).filter(|i| kept(*i, &c)).count();
        for (_, mut got) in per_epoch {
            let n = got.len();
            got.sort_unstable();
            got.dedup();
            prop_assert_eq!(got.len(), n);
            prop_assert!(n <= kept_rows && kept_rows - n <= 1, "{} of {}", n, kept_rows);
        }
        // (b) thread count does not matter.
        let other = all(&yaml(dir.path(), &c, 2, "", true), None, None);
        for r in 0..2 {
            same(&reference[r].0, &other[r].0)?;
        }
        let k = cut.min(reference[0].0.len()).min(reference[1].0.len());
        let heads = both(Some(k), None);
        let states: Vec<SourceState> = heads.iter().map(|(_, s)| s.clone()).collect();
        let tails = both(None, Some(states));
        for r in 0..2 {
            let mut joined = heads[r].0.clone();
            joined.extend(tails[r].0.clone());
            prop_assert_eq!(ids(&joined), ids(&reference[r].0));
        }
    }
}

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

/// Stage orders that would make a resume inexact are refused before any data moves, saying
/// why and what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stage_orders_that_would_break_resume_are_refused_with_the_reason() {
    let source = format!(
        "source: {{type: parquet, path: '{}/../data/digits/train.parquet'}}\n",
        env!("CARGO_MANIFEST_DIR")
    );
    let refused = |rest: &str| {
        let yaml = format!("{source}{rest}");
        async move {
            Pipeline::from_yaml(&yaml)
                .unwrap()
                .prepare()
                .await
                .unwrap_err()
                .to_string()
        }
    };
    let e = refused(
        "stages:\n- {type: batch, size: 8}\n- {type: filter, predicate: 'id > 3'}\n- {type: batch, size: 16}\n",
    )
    .await;
    assert!(e.contains("stages[1] (filter)"), "{e}");
    assert!(
        e.contains("a filter removes rows after stages[0] (batch)")
            && e.contains("and before stages[2] (batch)"),
        "{e}"
    );
    assert!(
        e.contains("could not be replayed on resume and ranks could get unequal batch counts"),
        "{e}"
    );
    assert!(
        e.contains("move this stage before stages[0] (batch)"),
        "{e}"
    );
    let e = refused(
        "stages:\n- {type: shuffle}\n- {type: image, column: pixels, shape: [8, 8, 1], on_error: skip}\n- {type: batch, size: 8}\n",
    )
    .await;
    assert!(
        e.contains("stages[1] (image)")
            && e.contains("`on_error: skip` removes rows after stages[0] (shuffle)")
            && e.contains("and before stages[2] (batch)"),
        "{e}"
    );
    let e = refused("stages:\n- {type: mixup, columns: [x], alpha: 0.2}\n").await;
    assert!(e.contains("stages[0] (mixup)"), "{e}");
    assert!(e.contains("put a `batch` stage before it"), "{e}");
    let e = refused(
        "stages:\n- {type: batch, size: 8}\n- {type: mixup, columns: [x], alpha: 0.2}\n- {type: batch, size: 16}\n",
    )
    .await;
    assert!(
        e.contains("stages[2] (batch)") && e.contains("cuts batches again"),
        "{e}"
    );
    assert!(e.contains("move mixup after the last `batch`"), "{e}");
    let e = refused("stages:\n- {type: batch, size: 8}\n- {type: shuffle}\n").await;
    assert!(e.contains("shuffle after stages[0] (batch)"), "{e}");
    assert!(e.contains("shuffle rows first, then batch them"), "{e}");
    let e = refused(
        "stages:\n- {type: filter, predicate: 'id > 3'}\n- {type: shuffle, across_ranks: true}\nruntime: {rank: 0, world_size: 2}\n",
    )
    .await;
    assert!(e.contains("`across_ranks` needs every rank's windows to hold the same number of rows, but stages[0] (filter)"), "{e}");
    let e = refused(
        "stages:\n- {type: shuffle, across_ranks: true}\nruntime: {rank: 0, world_size: 2}\n",
    )
    .await;
    assert!(
        e.contains("`across_ranks` needs a collective between the ranks"),
        "{e}"
    );
    // `group_by_length` needs the batch stage it groups for, with windows it divides.
    let e = refused("stages:\n- {type: shuffle, group_by_length: {column: pixels}}\n").await;
    assert!(
        e.contains("stages[0] (shuffle)")
            && e.contains("`group_by_length` makes batches of rows of similar length for the `batch` stage after the shuffle, and there is none"),
        "{e}"
    );
    let e = refused(
        "stages:\n- {type: shuffle, buffer_rows: 1000, group_by_length: {column: pixels}}\n- {type: batch, size: 64}\n",
    )
    .await;
    assert!(
        e.contains(
            "`group_by_length` needs `buffer_rows` (1000) to be a multiple of the batch size (64)"
        ) && e.contains("use 960 or 1024"),
        "{e}"
    );
    let e = refused(
        "stages:\n- {type: shuffle, buffer_rows: 1024, group_by_length: {column: label}}\n- {type: batch, size: 64}\n",
    )
    .await;
    assert!(
        e.contains(
            "compares the lengths of `label`, a Int64 column: give a list, string or binary column"
        ),
        "{e}"
    );
    let e = refused(
        "stages:\n- {type: shuffle, buffer_rows: 1024, group_by_length: {column: pixel}}\n- {type: batch, size: 64}\n",
    )
    .await;
    assert!(
        e.contains("column `pixel` does not exist") && e.contains("did you mean `pixels`?"),
        "{e}"
    );
}

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

/// A state's position means rows of one plan: the files, and the settings that decide which
/// rows come in which order. Resuming it under another plan is refused, saying what changed;
/// settings that move no row may change, and so may where the files live.
#[test]
fn resume_checks_the_files_and_settings_the_state_was_taken_under() {
    let dir = tempfile::tempdir().unwrap();
    let groups = vec![vec![30, 20], vec![25, 5], vec![40]];
    let total = write_dataset(dir.path(), &groups);
    let c = Case {
        groups,
        batch_rows: 8,
        buffer_rows: 32,
        max_memory: 1 << 30,
        batch: 10,
        epochs: 2,
        seed: 3,
        filter: true,
        trim: false,
        group: None,
    };
    let rt = rt();
    let base = yaml(dir.path(), &c, 2, "", false);
    let reference = ids(&rt
        .block_on(run(Pipeline::from_yaml(&base).unwrap(), None))
        .0);
    let (head, state) = rt.block_on(run(Pipeline::from_yaml(&base).unwrap(), Some(5)));
    let plan = state.plan.clone().unwrap();
    let data = plan.data.clone().unwrap();
    assert_eq!((data.files, data.rows), (3, total));
    assert_eq!(plan.order["rank"], "0 of 1");
    let state: SourceState = serde_json::from_str(&serde_json::to_string(&state).unwrap()).unwrap();
    let resumed = |y: &str| {
        let mut joined = ids(&head);
        let tail = rt.block_on(run(
            Pipeline::from_yaml(y).unwrap().resume_from(state.clone()),
            None,
        ));
        joined.extend(ids(&tail.0));
        joined
    };
    // Allowed: other threads and batch size; the same files in another directory.
    let other = yaml(
        dir.path(),
        &Case {
            batch: 7,
            ..c.clone()
        },
        1,
        "",
        false,
    );
    assert_eq!(resumed(&other), reference);
    let copy = tempfile::tempdir().unwrap();
    for f in std::fs::read_dir(dir.path()).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, copy.path().join(f.file_name().unwrap())).unwrap();
    }
    assert_eq!(resumed(&yaml(copy.path(), &c, 2, "", false)), reference);

    let refused = |y: &str| -> String {
        rt.block_on(async {
            let mut s = Pipeline::from_yaml(y)
                .unwrap()
                .resume_from(state.clone())
                .stream();
            let e = s.next().await.unwrap().unwrap_err().to_string();
            assert!(e.starts_with("cannot resume: "), "{e}");
            e
        })
    };
    let e = refused(&yaml(
        dir.path(),
        &Case {
            seed: 4,
            ..c.clone()
        },
        2,
        "",
        false,
    ));
    assert!(
        e.contains("What changed: stages[3] (shuffle): seed 3 then, seed 4 now. "),
        "{e}"
    );
    let e = refused(&yaml(
        dir.path(),
        &Case {
            buffer_rows: 33,
            ..c.clone()
        },
        2,
        "",
        false,
    ));
    assert!(
        e.contains("stages[3] (shuffle): buffer_rows 32 then, buffer_rows 33 now"),
        "{e}"
    );
    let e = refused(&yaml(
        dir.path(),
        &Case {
            max_memory: 3000,
            ..c.clone()
        },
        2,
        "",
        false,
    ));
    assert!(
        e.contains("stages[3] (shuffle): max_memory 1.0 GiB then, max_memory 2.9 KiB now"),
        "{e}"
    );
    let e = refused(&yaml(
        dir.path(),
        &Case {
            filter: false,
            ..c.clone()
        },
        2,
        "",
        false,
    ));
    assert!(e.contains("stages[0] (filter): there then, not now"), "{e}");
    // Grouping by length reorders the window: the batch size then decides the order too.
    let e = refused(&yaml(
        dir.path(),
        &Case {
            group: Some(2),
            batch: 8,
            ..c.clone()
        },
        2,
        "",
        false,
    ));
    assert!(
        e.contains("seed 3 then, buffer_rows 32, max_memory 1.0 GiB, seed 3, group_by_length `tok` in 2 batches of 8 now"),
        "{e}"
    );
    let e = refused(&yaml(dir.path(), &c, 2, ", rank: 1, world_size: 2", false));
    assert!(e.contains("rank: 0 of 1 then, 1 of 2 now"), "{e}");
    // A file added, then one rewritten with as many rows in other row groups.
    write_dataset(copy.path(), &[vec![1], vec![1], vec![1], vec![9]]);
    let added = copy.path().join("part-003.parquet");
    std::fs::copy(&added, dir.path().join("part-003.parquet")).unwrap();
    let e = refused(&base);
    assert!(
        e.contains(&format!(
            "the files: 3 file(s) with {total} rows then, 4 file(s) with {} rows now",
            total + 9
        )),
        "{e}"
    );
    std::fs::remove_file(dir.path().join("part-003.parquet")).unwrap();
    write_dataset(copy.path(), &[vec![1], vec![1], vec![20, 20]]);
    std::fs::copy(
        copy.path().join("part-002.parquet"),
        dir.path().join("part-002.parquet"),
    )
    .unwrap();
    let e = refused(&base);
    assert!(
        e.contains(&format!(
            "the files: as many (3, {total} rows) but with other paths or row groups"
        )),
        "{e}"
    );
}

/// Reading in listing order (no shuffle, one rank), a position depends only on the files up
/// to the one it is in: a file added after it is read on resume, one added before it (or a
/// file before it rewritten) is refused.
#[test]
fn resume_in_listing_order_checks_the_files_up_to_the_position() {
    let dir = tempfile::tempdir().unwrap();
    let total = write_dataset(dir.path(), &[vec![30, 20], vec![25, 5], vec![40]]);
    let yaml = format!(
        "source: {{type: parquet, path: '{}/*.parquet', batch_rows: 7}}\n\
         stages:\n- {{type: batch, size: 10}}\nruntime: {{threads: 2}}\n",
        dir.path().display()
    );
    let rt = rt();
    // 6 batches: 60 rows, inside the second file (rows 50..80).
    let (head, state) = rt.block_on(run(Pipeline::from_yaml(&yaml).unwrap(), Some(6)));
    let data = state.plan.as_ref().unwrap().data.clone().unwrap();
    assert_eq!((data.files, data.rows, data.prefix), (2, 80, true));
    let resume = |state: &SourceState| {
        rt.block_on(async {
            let mut s = Pipeline::from_yaml(&yaml)
                .unwrap()
                .resume_from(state.clone())
                .stream();
            let mut out = Vec::new();
            while let Some(b) = s.next().await {
                out.push(b.map_err(|e| e.to_string())?);
            }
            Ok::<_, String>(out)
        })
    };
    // A file after the position: read on resume, after the rest.
    let extra = tempfile::tempdir().unwrap();
    write_dataset(extra.path(), &[vec![1], vec![1], vec![1], vec![4]]);
    std::fs::copy(
        extra.path().join("part-003.parquet"),
        dir.path().join("part-003.parquet"),
    )
    .unwrap();
    let tail = resume(&state).unwrap();
    let mut joined = ids(&head);
    joined.extend(ids(&tail));
    let mut expected: Vec<i64> = (0..total as i64).collect();
    expected.extend(3..7); // part-003's ids, as written alone
    assert_eq!(joined, expected);
    // A file before the position: refused.
    std::fs::copy(
        extra.path().join("part-003.parquet"),
        dir.path().join("part-000a.parquet"),
    )
    .unwrap();
    let e = resume(&state).unwrap_err();
    assert!(
        e.contains(
            "the files up to the position: 2 file(s) with 80 rows then, 2 file(s) with 54 rows now"
        ),
        "{e}"
    );
    std::fs::remove_file(dir.path().join("part-000a.parquet")).unwrap();
    // The first file rewritten with other row groups: refused.
    write_dataset(extra.path(), &[vec![25, 25]]);
    std::fs::copy(
        extra.path().join("part-000.parquet"),
        dir.path().join("part-000.parquet"),
    )
    .unwrap();
    let e = resume(&state).unwrap_err();
    assert!(
        e.contains(
            "the files up to the position: as many (2, 80 rows) but with other paths or row groups"
        ),
        "{e}"
    );
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

/// Under several ranks, a filter before the last stage that cuts batches — a `shuffle`, when
/// there is no `batch` — makes each rank's count depend on its data: the filter is warned
/// about. After the shuffle it is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filter_before_the_shuffle_under_several_ranks_is_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    write_dataset(dir.path(), &[vec![20, 20]]);
    let filter = "- {type: filter, predicate: 'id % 5 <> 1'}\n";
    let shuffle = "- {type: shuffle, buffer_rows: 10, seed: 3, batch_rows: 4}\n";
    let notes = |stages: String| {
        let yaml = format!(
            "source: {{type: parquet, path: '{}/*.parquet'}}\nstages:\n{stages}runtime: {{rank: 0, world_size: 2}}\n",
            dir.path().display()
        );
        async move {
            let prepared = Pipeline::from_yaml(&yaml).unwrap().prepare().await.unwrap();
            let stages = prepared.metrics().stages();
            let filter = stages.iter().find(|s| s.name.contains("(filter)")).unwrap();
            filter.notes.lock().unwrap().clone()
        }
    };
    let before = notes(format!("{filter}{shuffle}")).await;
    assert!(
        before
            .iter()
            .any(|n| n.contains("the ranks may get unequal counts")),
        "{before:?}"
    );
    let after = notes(format!("{shuffle}{filter}")).await;
    assert!(after.is_empty(), "{after:?}");
}

/// Runs rank `rank` of `world` of `c` to the end (or `limit` batches), from `state`.
fn run_rank(
    rt: &tokio::runtime::Runtime,
    dir: &Path,
    c: &Case,
    rank: usize,
    world: usize,
    state: Option<SourceState>,
    limit: Option<usize>,
) -> (Vec<Batch>, SourceState) {
    let y = yaml(
        dir,
        c,
        2,
        &format!(", rank: {rank}, world_size: {world}"),
        false,
    );
    let mut p = Pipeline::from_yaml(&y).unwrap();
    if let Some(s) = state {
        let s: SourceState = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        p = p.resume_from(s);
    }
    rt.block_on(run(p, limit))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    /// Rescaling: `old` ranks interrupted after `cut` batches continue on `new` ranks. The
    /// batches the old ranks still owed in the interrupted epoch are each delivered once,
    /// exactly as the old ranks would have made them, spread evenly (equal counts, a short
    /// share padded with empty batches); then every new rank continues as an uninterrupted
    /// run on `new` ranks would from the next epoch. A new rank interrupted within its share
    /// resumes exactly, and the shares left can be dealt out again to yet another number.
    #[test]
    fn a_rescaled_epoch_delivers_every_owed_batch_once_then_continues(c in cases(), old in 1usize..4, new in 1usize..4, again in 1usize..4, cut in 0usize..30, mid in 0usize..8) {
        prop_assume!(!no_share(&c.groups, old, "redistribute") && !no_share(&c.groups, new, "redistribute") && !no_share(&c.groups, again, "redistribute"));
        // Small batches, so that an epoch has several to be interrupted between.
        let batch = 1 + c.batch % 8;
        let buffer_rows = match c.group {
            Some(_) => c.buffer_rows.div_ceil(batch) * batch,
            None => c.buffer_rows,
        };
        let c = Case { filter: false, batch, buffer_rows, ..c };
        let dir = tempfile::tempdir().unwrap();
        write_dataset(dir.path(), &c.groups);
        let rt = rt();
        let reference: Vec<Vec<Batch>> = (0..old).map(|r| run_rank(&rt, dir.path(), &c, r, old, None, None).0).collect();
        // Batches per epoch (all epochs have as many; an emptied one has no lineage).
        let n = reference[0].len() / c.epochs as usize;
        prop_assume!(n >= 2);
        // Inside some epoch (or, for `cut` 0, before anything was delivered).
        let k = match cut {
            0 => 0,
            _ => (cut % c.epochs as usize) * n + 1 + cut % (n - 1),
        };
        let states: Vec<SourceState> = (0..old).map(|r| run_rank(&rt, dir.path(), &c, r, old, None, Some(k)).1).collect();
        let epoch = states[0].parquet.map_or(0, |m| m.epoch);
        let done = (k as u64).saturating_sub(epoch * n as u64);
        let template = Pipeline::from_yaml(&yaml(dir.path(), &c, 1, "", false)).unwrap();
        let dealt = match template.rescale(&states, Some(done), new) {
            Ok(d) => d,
            Err(e) => {
                // Only a late filter on one old rank makes the counts unknown.
                prop_assert!(old == 1 && c.trim, "{}", e);
                return Ok(());
            }
        };
        prop_assert_eq!(dealt.len(), new);
        // With a shuffle the states tell how far into the epoch they are: the same deal
        // without the count, and a wrong count refused.
        prop_assert_eq!(&template.rescale(&states, None, new).unwrap(), &dealt);
        if k > 0 {
            let e = template.rescale(&states, Some(done + 1), new).unwrap_err();
            prop_assert!(e.contains("were said to be delivered by each rank, but the states are"), "{}", e);
            if old > 1 {
                // States of different steps are refused, not dealt out.
                let mut skewed = states.clone();
                skewed[1] = run_rank(&rt, dir.path(), &c, 1, old, None, Some(k + 1)).1;
                let e = template.rescale(&skewed, None, new).unwrap_err();
                prop_assert!(e.contains("taken at different steps"), "{}", e);
            }
        }
        let outs: Vec<Vec<Batch>> = (0..new).map(|j| run_rank(&rt, dir.path(), &c, j, new, Some(dealt[j].clone()), None).0).collect();
        if k == 0 {
            // Nothing was delivered: the new ranks simply start over on their own split.
            for (j, o) in outs.iter().enumerate() {
                same(o, &run_rank(&rt, dir.path(), &c, j, new, None, None).0)?;
            }
            return Ok(());
        }
        // Equal batch counts.
        for o in &outs {
            prop_assert_eq!(o.len(), outs[0].len());
        }
        let share = |s: &SourceState| s.rescaled.as_ref().map_or((0, 0), |r| (r.batches as usize, r.runs.iter().map(|x| (x.end - x.first) as usize).sum()));
        let (p, _) = share(&dealt[0]);
        // The owed batches, each once, as the old ranks would have made them.
        let mut owed = Vec::new();
        for r in &reference {
            owed.extend(r[k..(epoch as usize + 1) * n].iter().cloned());
        }
        let mut delivered = Vec::new();
        for (j, o) in outs.iter().enumerate() {
            let (batches, real) = share(&dealt[j]);
            prop_assert_eq!(batches, p);
            delivered.extend(o[..real].iter().cloned());
            prop_assert!(o[real..p].iter().all(|b| b.num_rows() == 0));
        }
        same(&delivered, &owed).map_err(|e| TestCaseError::fail(format!("owed batches (n {n}, k {k}, epoch {epoch}, done {done}, p {p}): {e}")))?;
        // Then the next epochs, as on `new` ranks from the start of the next epoch.
        for (j, o) in outs.iter().enumerate() {
            // Under several ranks every epoch has as many batches (an emptied one is
            // delivered, with no lineage to tell its epoch); on one, an emptied batch is left
            // out, and every batch has its lineage.
            let plain = run_rank(&rt, dir.path(), &c, j, new, None, None).0;
            let later: Vec<Batch> = if new == 1 {
                plain.into_iter().filter(|b| b.lineage.spans().first().is_some_and(|s| s.epoch > epoch)).collect()
            } else {
                let per_epoch = plain.len() / c.epochs as usize;
                plain[(epoch as usize + 1) * per_epoch..].to_vec()
            };
            same(&o[p..], &later).map_err(|e| TestCaseError::fail(format!("next epochs of rank {j}: {e}")))?;
        }
        // Interrupted `mid` batches into the share: the same rank resumes exactly; the states
        // of every new rank deal what is left out again.
        let m = mid.min(p);
        let heads: Vec<(Vec<Batch>, SourceState)> = (0..new).map(|j| run_rank(&rt, dir.path(), &c, j, new, Some(dealt[j].clone()), Some(m))).collect();
        for (j, (head, state)) in heads.iter().enumerate() {
            let mut joined = head.clone();
            joined.extend(run_rank(&rt, dir.path(), &c, j, new, Some(state.clone()), None).0);
            same(&joined, &outs[j]).map_err(|e| TestCaseError::fail(format!("resumed rank {j} after {m}: {e}")))?;
        }
        let mid_states: Vec<SourceState> = heads.into_iter().map(|(_, s)| s).collect();
        let redealt = template.rescale(&mid_states, None, again).unwrap();
        let mut rest = Vec::new();
        for (j, o) in outs.iter().enumerate() {
            let (_, real) = share(&dealt[j]);
            rest.extend(o[m.min(real)..real].iter().cloned());
        }
        let mut delivered = Vec::new();
        let outs2: Vec<Vec<Batch>> = (0..again).map(|j| run_rank(&rt, dir.path(), &c, j, again, Some(redealt[j].clone()), None).0).collect();
        for (j, o) in outs2.iter().enumerate() {
            prop_assert_eq!(o.len(), outs2[0].len());
            let (_, real) = share(&redealt[j]);
            delivered.extend(o[..real].iter().cloned());
        }
        same(&delivered, &rest).map_err(|e| TestCaseError::fail(format!("dealt again: {e}")))?;
    }
}
