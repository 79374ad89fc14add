//! The tasks a run is made of: fused map stages, re-batching, passing over a restored run's
//! delivered rows, and the shuffle window; each reads one queue and writes the next.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use futures::StreamExt;

use crate::batch::Batch;
use crate::error::{Error, Result};
use crate::runtime::channel::{Receiver, Sender};
use crate::runtime::{CpuPool, PipelineMetrics, StageMetrics};
use crate::stage::{self, Transform};

/// A map stage and its counters.
type MapStage = (Arc<dyn Transform>, Option<Arc<StageMetrics>>);

/// Map stages run one after the other on each batch.
pub(super) struct Chain {
    pub(super) stages: Vec<MapStage>,
    /// The chain comes after the last stage that cuts or reorders rows: rows a stage removes
    /// are added to [`Batch::dropped`].
    pub(super) count_removed: bool,
    /// Deliver batches left with no rows (every rank was promised the same number).
    pub(super) keep_empty: bool,
}

fn apply_chain(chain: &Chain, mut batch: Batch) -> Result<Batch> {
    for (t, m) in chain.stages.iter() {
        let rows_in = batch.num_rows() as u64;
        let dropped = batch.dropped;
        let start = Instant::now();
        batch = t.apply(batch)?;
        batch.dropped = match chain.count_removed {
            true => dropped + rows_in.saturating_sub(batch.num_rows() as u64),
            false => 0,
        };
        if let Some(m) = m {
            let rows_out = batch.num_rows() as u64;
            m.rows_in.fetch_add(rows_in, Ordering::Relaxed);
            m.rows_out.fetch_add(rows_out, Ordering::Relaxed);
            m.rows_removed
                .fetch_add(rows_in.saturating_sub(rows_out), Ordering::Relaxed);
            m.batches_out.fetch_add(1, Ordering::Relaxed);
            m.busy_ns
                .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
    }
    Ok(batch)
}

pub(super) async fn map_task(
    mut rx: Receiver,
    tx: Sender,
    chain: Arc<Chain>,
    pool: CpuPool,
    parallelism: usize,
) {
    let keep_empty = chain.keep_empty;
    let input = futures::stream::poll_fn(move |cx| rx.poll_recv(cx));
    let mut out = input
        .map(|item| {
            let chain = chain.clone();
            let pool = pool.clone();
            async move {
                let batch = item?;
                pool.run(move || apply_chain(&chain, batch)).await?
            }
        })
        .buffered(parallelism);
    while let Some(result) = out.next().await {
        match result {
            Ok(b) if b.num_rows() == 0 && !keep_empty => continue,
            Ok(b) => {
                if !tx.send(Ok(b)).await {
                    return;
                }
            }
            Err(e) => {
                tx.send(Err(e)).await;
                return;
            }
        }
    }
}

pub(super) async fn rebatch_task(
    mut rx: Receiver,
    tx: Sender,
    rebatcher: stage::rebatch::Rebatcher,
    pool: CpuPool,
    metrics: Option<Arc<StageMetrics>>,
) {
    let mut rebatcher = Some(rebatcher);
    // Rows `drop_last` dropped at the ends of epochs.
    let mut dropped = 0u64;
    let removed = |dropped: &mut u64, d: usize| {
        *dropped += d as u64;
        if let Some(m) = &metrics {
            m.rows_removed.fetch_add(d as u64, Ordering::Relaxed);
        }
    };
    let count = |out: &[Batch]| {
        if let Some(m) = &metrics {
            m.batches_out.fetch_add(out.len() as u64, Ordering::Relaxed);
            m.rows_out.fetch_add(
                out.iter().map(|b| b.num_rows() as u64).sum(),
                Ordering::Relaxed,
            );
        }
    };
    loop {
        let item = rx.recv().await;
        let Some(mut rb) = rebatcher.take() else {
            return;
        };
        let result = match item {
            Some(Ok(batch)) => {
                if let Some(m) = &metrics {
                    m.rows_in
                        .fetch_add(batch.num_rows() as u64, Ordering::Relaxed);
                }
                pool.run(move || {
                    let r = rb.push(batch);
                    (rb, r)
                })
                .await
                .map(|(rb, r)| {
                    rebatcher = Some(rb);
                    r
                })
                .and_then(|r| r)
                .map(|(out, d)| {
                    removed(&mut dropped, d);
                    out
                })
            }
            Some(Err(e)) => Err(e),
            None => {
                let finished = rb.finish().map(|(tail, d)| {
                    removed(&mut dropped, d);
                    if let Some(m) = &metrics
                        && dropped > 0
                    {
                        m.note(format!(
                            "drop_last: dropped {dropped} rows in all (each epoch's last rows, fewer than one batch)"
                        ));
                    }
                    tail.into_iter().collect::<Vec<_>>()
                });
                if let Ok(out) = &finished {
                    count(out);
                }
                tx.send_all(finished).await;
                return;
            }
        };
        if let Ok(out) = &result {
            count(out);
        }
        if !tx.send_all(result).await {
            return;
        }
    }
}

/// Passes over the first `skip` rows (a restored run's rows already delivered), counted as
/// `source.rows_replayed`.
pub(super) async fn skip_task(
    mut rx: Receiver,
    tx: Sender,
    mut skip: u64,
    metrics: Arc<PipelineMetrics>,
) {
    let replayed = |n: u64| metrics.source.rows_replayed.fetch_add(n, Ordering::Relaxed);
    while let Some(item) = rx.recv().await {
        let item = match item {
            Ok(b) if skip >= b.num_rows() as u64 => {
                skip -= b.num_rows() as u64;
                replayed(b.num_rows() as u64);
                continue;
            }
            Ok(b) if skip > 0 => {
                let k = skip as usize;
                skip = 0;
                replayed(k as u64);
                Ok(b.slice(k, b.num_rows() - k))
            }
            other => other,
        };
        let failed = item.is_err();
        if !tx.send(item).await || failed {
            return;
        }
    }
}

pub(super) async fn shuffle_task(
    mut rx: Receiver,
    tx: Sender,
    shuffler: stage::shuffle::Shuffler,
    pool: CpuPool,
    metrics: Option<Arc<StageMetrics>>,
    blocking: bool,
) {
    // Each step runs off the async workers: on the CPU pool, or, when it may wait for other
    // ranks (a collective exchange), on a blocking thread.
    async fn step<T: Send + 'static>(
        pool: &CpuPool,
        blocking: bool,
        sh: stage::shuffle::Shuffler,
        f: impl FnOnce(&mut stage::shuffle::Shuffler) -> Result<T> + Send + 'static,
    ) -> Result<(stage::shuffle::Shuffler, T)> {
        let work = move || {
            let mut sh = sh;
            let r = f(&mut sh);
            r.map(|v| (sh, v))
        };
        if blocking {
            tokio::task::spawn_blocking(work)
                .await
                .map_err(|e| Error::Internal(format!("shuffle task failed: {e}")))?
        } else {
            pool.run(work).await?
        }
    }
    let mut sh = Some(shuffler);
    let mut finished = false;
    loop {
        // Emit everything available before taking more input.
        loop {
            let Some(s) = sh.take() else { return };
            match step(&pool, blocking, s, |s| s.next_output()).await {
                Ok((s, Some(b))) => {
                    if let Some(m) = &metrics {
                        m.rows_out.fetch_add(b.num_rows() as u64, Ordering::Relaxed);
                        m.batches_out.fetch_add(1, Ordering::Relaxed);
                        m.rows_replayed.store(s.stats.replayed, Ordering::Relaxed);
                    }
                    sh = Some(s);
                    if !tx.send(Ok(b)).await {
                        return;
                    }
                }
                Ok((s, None)) => {
                    sh = Some(s);
                    break;
                }
                Err(e) => {
                    tx.send(Err(e)).await;
                    return;
                }
            }
        }
        if finished {
            if let (Some(m), Some(s)) = (&metrics, &sh) {
                m.rows_replayed.store(s.stats.replayed, Ordering::Relaxed);
                if s.stats.runs > 0 {
                    m.note(format!(
                        "spilled {} run(s), {} of zstd Arrow IPC, over {} window(s)",
                        s.stats.runs,
                        bytesize::ByteSize::b(s.stats.bytes_written),
                        s.stats.windows
                    ));
                }
            }
            return;
        }
        let Some(s) = sh.take() else { return };
        let result = match rx.recv().await {
            Some(Ok(b)) => {
                if let Some(m) = &metrics {
                    m.rows_in.fetch_add(b.num_rows() as u64, Ordering::Relaxed);
                }
                step(&pool, false, s, move |s| s.push(b)).await
            }
            Some(Err(e)) => Err(e),
            None => {
                finished = true;
                step(&pool, blocking, s, |s| s.finish()).await
            }
        };
        match result {
            Ok((s, ())) => sh = Some(s),
            Err(e) => {
                tx.send(Err(e)).await;
                return;
            }
        }
    }
}
