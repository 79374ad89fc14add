//! Rescaling: ranks interrupted mid-epoch continue on another number of ranks — every batch
//! the old ranks still owed delivered once, then the next epochs as on the new ranks, and the
//! shares left dealt out again.

use std::path::Path;

use proptest::prelude::*;
use sluice_pipeline::{Batch, Pipeline, SourceState};

use super::{Case, cases, no_share, run, write_dataset, yaml};
use crate::common::{rt, same};

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
