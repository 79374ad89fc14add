//! The shuffle's properties on random small Parquet datasets, through a pipeline with every
//! stage kind: (a) one epoch emits every row exactly once, (b) output is identical for 1, 2
//! and 4 threads, (c) k batches, snapshot, restore in a fresh pipeline, the rest — equal to the
//! run never stopped (a, b and c also with `across_ranks`), (d) every rank gets the same number
//! of batches, under every shard policy, with a `batch` stage or without.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use arrow::array::AsArray;
use arrow::datatypes::{Float32Type, Int64Type};
use futures::StreamExt;
use proptest::prelude::*;
use sluice_pipeline::collective::{Collective, LocalCollective};
use sluice_pipeline::{Batch, Pipeline, PipelineMetrics, SourceState};

use super::{Case, cases, interrupted_at, no_share, run, run_synced, write_dataset, yaml};
use crate::common::{ids, rt, same};

fn kept(id: i64, c: &Case) -> bool {
    (!c.filter || id % 5 != 1) && (!c.trim || id % 7 != 3)
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
