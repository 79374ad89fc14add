//! The epoch plan: this rank's units of an epoch, in order (listing order, permuted, or a
//! `mix`), and its share of them across ranks.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures::{FutureExt, StreamExt};

use super::global::GlobalPlan;
use super::unit::{Unit, row_groups, rows_before, take_rows};
use super::{ParquetSource, ShardPolicy, Work};
use crate::error::{Error, Result};
use crate::runtime::metrics::PipelineMetrics;

impl ParquetSource {
    /// What this rank reads of `epoch`, in order: a global shuffle's blocks, or row groups.
    pub(super) fn epoch_work(
        self: Arc<Self>,
        epoch: u64,
        metrics: Arc<PipelineMetrics>,
    ) -> futures::stream::BoxStream<'static, Result<Work>> {
        let Some(global) = self.global else {
            return self
                .epoch_units(epoch, metrics)
                .map(|u| u.map(Work::Rows))
                .boxed();
        };
        async move {
            let plan = self.global_plan().await?;
            let first = self.resume.map_or(0, |m| m.epoch);
            let share = plan.rows / self.world as u64;
            if self.world > 1 && share == 0 && plan.rows > 0 {
                return Err(Error::Source {
                    at: self.at.to_string(),
                    message: format!(
                        "a global shuffle gives each of the {} ranks an equal share of the epoch's {} rows, which is 0: use fewer ranks or more rows",
                        self.world, plan.rows
                    ),
                });
            }
            let src = &metrics.source;
            src.shard_left_out
                .fetch_add(plan.rows - share * self.world as u64, Ordering::Relaxed);
            if epoch == first {
                src.files.fetch_add(self.files.all().await?.len() as u64, Ordering::Relaxed);
                let before = self
                    .resume
                    .filter(|m| m.epoch == epoch)
                    .map_or(0, |m| m.unit * plan.block_rows + m.row);
                src.rows_expected.store(
                    (share * self.config.epochs.saturating_sub(first)).saturating_sub(before),
                    Ordering::Relaxed,
                );
            }
            Ok(plan.blocks(global.seed, epoch, self.rank, self.world))
        }
        .into_stream()
        .flat_map(|r| match r {
            Ok(blocks) => futures::stream::iter(blocks.into_iter().map(Work::Block).map(Ok).collect::<Vec<_>>()),
            Err(e) => futures::stream::iter(vec![Err(e)]),
        })
        .boxed()
    }

    /// Rows per block of a global shuffle (`None` without one): part of every position.
    pub(crate) async fn global_block_rows(&self) -> Result<Option<u64>> {
        match self.global {
            Some(_) => Ok(Some(self.global_plan().await?.block_rows)),
            None => Ok(None),
        }
    }

    /// The global shuffle's plan over every file (planned once, shared by clones).
    async fn global_plan(&self) -> Result<Arc<GlobalPlan>> {
        if let Some(plan) = self.global_plan.get() {
            return Ok(plan.clone());
        }
        let files = self.files.all().await?;
        let settings = self
            .global
            .ok_or_else(|| Error::Internal("a global plan without a global shuffle".into()))?;
        let plan = Arc::new(GlobalPlan::new(&files, settings));
        Ok(self.global_plan.get_or_init(|| plan).clone())
    }

    /// This rank's units for `epoch`: every row group in listing order, permuted when
    /// `order` is set, then split between ranks by the shard policy. Without either, files
    /// are opened as reading reaches them (reading starts before a long listing ends).
    pub(super) fn epoch_units(
        self: Arc<Self>,
        epoch: u64,
        metrics: Arc<PipelineMetrics>,
    ) -> futures::stream::BoxStream<'static, Result<Unit>> {
        // The first epoch this run reads counts the files and the rows to come (a resumed
        // run: from its restart point on).
        let first = self.resume.map_or(0, |m| m.epoch);
        let restart = self.resume.filter(|m| m.epoch == epoch);
        if self.in_listing_order() {
            let files = self.files.clone();
            let epochs = self.config.epochs;
            return futures::stream::unfold(Some(0usize), move |index| {
                let (files, metrics) = (files.clone(), metrics.clone());
                async move {
                    let i = index?;
                    match files.get(i).await {
                        Ok(Some(f)) => {
                            if epoch == first {
                                metrics.source.files.fetch_add(1, Ordering::Relaxed);
                            }
                            Some((Ok(row_groups(&f)), Some(i + 1)))
                        }
                        Ok(None) => {
                            if epoch == first
                                && let Some((_, rows)) = files.totals()
                            {
                                let before = match restart {
                                    Some(m) => files.all().await.map_or(0, |fs| {
                                        rows_before(fs.iter().flat_map(row_groups), &m)
                                    }),
                                    None => 0,
                                };
                                metrics.source.rows_expected.store(
                                    (rows * epochs.saturating_sub(first)).saturating_sub(before),
                                    Ordering::Relaxed,
                                );
                            }
                            None
                        }
                        Err(e) => Some((Err(e), None)),
                    }
                }
            })
            .flat_map(|r| match r {
                Ok(units) => futures::stream::iter(units.into_iter().map(Ok).collect::<Vec<_>>()),
                Err(e) => futures::stream::iter(vec![Err(e)]),
            })
            .boxed();
        }
        async move {
            let files = self.files.all().await?;
            if epoch == first {
                metrics
                    .source
                    .files
                    .fetch_add(files.len() as u64, Ordering::Relaxed);
            }
            let mut all: Vec<Unit> = match self.mixed()? {
                None => files.iter().flat_map(row_groups).collect(),
                Some(mixed) => {
                    if epoch == first
                        && let Ok(mut shares) = metrics.source.mix.lock()
                    {
                        shares.clone_from(&mixed.shares);
                    }
                    mixed.epoch(epoch)
                }
            };
            if let Some(seed) = self.order {
                use rand::seq::SliceRandom;
                all.shuffle(&mut crate::stage::seeded_rng(seed, 0x726f_7767, epoch, 0));
            }
            let total: u64 = all.iter().map(|u| u.len).sum();
            let units = shard(all, self.rank, self.world, self.config.shard);
            let share: u64 = units.iter().map(|u| u.len).sum();
            if self.world > 1 {
                // Every rank takes the same share: what the policy leaves out or repeats is
                // known from the footers, and said, never silent.
                let dealt = share * self.world as u64;
                if share == 0 && total > 0 {
                    return Err(Error::Source {
                        at: self.at.to_string(),
                        message: format!(
                            "shard `{}` gives each of the {} ranks 0 of the epoch's {total} rows (a rank without a row group of its own cuts every rank to nothing): use `shard: redistribute` (equal contiguous ranges, at most world_size − 1 rows left out), fewer ranks, or files with more row groups",
                            self.config.shard.name(),
                            self.world
                        ),
                    });
                }
                metrics
                    .source
                    .shard_left_out
                    .fetch_add(total.saturating_sub(dealt), Ordering::Relaxed);
                metrics
                    .source
                    .shard_repeated
                    .fetch_add(dealt.saturating_sub(total), Ordering::Relaxed);
            }
            if epoch == first {
                let before = restart.map_or(0, |m| rows_before(units.iter().cloned(), &m));
                metrics.source.rows_expected.store(
                    (share * self.config.epochs.saturating_sub(first)).saturating_sub(before),
                    Ordering::Relaxed,
                );
            }
            Ok(units)
        }
        .into_stream()
        .flat_map(|r: Result<Vec<Unit>>| match r {
            Ok(units) => futures::stream::iter(units.into_iter().map(Ok).collect::<Vec<_>>()),
            Err(e) => futures::stream::iter(vec![Err(e)]),
        })
        .boxed()
    }
}

/// This rank's share of an epoch's units (see [`super::ShardPolicy`]).
pub(crate) fn shard(all: Vec<Unit>, rank: usize, world: usize, policy: ShardPolicy) -> Vec<Unit> {
    if world <= 1 {
        return all;
    }
    let total: u64 = all.iter().map(|u| u.len).sum();
    let mut out = Vec::new();
    match policy {
        ShardPolicy::Redistribute => {
            let q = total / world as u64;
            take_rows(&all, q * rank as u64, q, &mut out);
        }
        ShardPolicy::DropLast | ShardPolicy::Pad => {
            let mut counts = vec![0u64; world];
            for (i, u) in all.iter().enumerate() {
                counts[i % world] += u.len;
            }
            let own: Vec<Unit> = all
                .iter()
                .enumerate()
                .filter(|(i, _)| i % world == rank)
                .map(|(_, u)| u.clone())
                .collect();
            let mine = counts[rank];
            if policy == ShardPolicy::DropLast {
                let min = counts.iter().copied().min().unwrap_or(0);
                take_rows(&own, 0, min, &mut out);
            } else {
                let max = counts.iter().copied().max().unwrap_or(0);
                out = own.clone();
                // Repeat this rank's rows (or, if it has none, the epoch's) up to the largest share.
                let pool = if mine > 0 { own } else { all };
                let pool_rows: u64 = pool.iter().map(|u| u.len).sum();
                let mut missing = max - mine;
                while missing > 0 && pool_rows > 0 {
                    let n = missing.min(pool_rows);
                    take_rows(&pool, 0, n, &mut out);
                    missing -= n;
                }
            }
        }
    }
    out
}
