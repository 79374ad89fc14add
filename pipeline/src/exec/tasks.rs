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

/// Input batches a shuffle takes from its queue at once when they are there, and the most
/// bytes they may hold: the pushes that produce no output are made in one trip to the CPU
/// pool. Each trip waits behind the stages' queued jobs; one per input batch made the shuffle
/// the pace of the tabular bench once the source had got faster.
const GROUPED_PUSHES: usize = 8;
const GROUPED_BYTES: usize = 8 << 20;

pub(super) async fn shuffle_task(
    mut rx: Receiver,
    tx: Sender,
    shuffler: stage::shuffle::Shuffler,
    pool: CpuPool,
    metrics: Option<Arc<StageMetrics>>,
    blocking: bool,
) {
    let emitted = |s: &stage::shuffle::Shuffler, b: &Batch| {
        if let Some(m) = &metrics {
            m.rows_out.fetch_add(b.num_rows() as u64, Ordering::Relaxed);
            m.batches_out.fetch_add(1, Ordering::Relaxed);
            m.rows_replayed.store(s.stats.replayed, Ordering::Relaxed);
        }
    };
    let mut sh = Some(shuffler);
    // Batches received and not yet pushed, and an input error to pass on after them.
    let mut pending = std::collections::VecDeque::new();
    let mut failed = None;
    let mut finished = false;
    // Whether the shuffle may have output: not when a push step's last look found none.
    let mut drain = true;
    loop {
        // Emit everything available before taking more input.
        while drain {
            let Some(s) = sh.take() else { return };
            match step(&pool, blocking, &metrics, s, |s| s.next_output()).await {
                Ok((s, Some(b))) => {
                    emitted(&s, &b);
                    sh = Some(s);
                    if !tx.send(Ok(b)).await {
                        return;
                    }
                }
                Ok((s, None)) => {
                    sh = Some(s);
                    drain = false;
                }
                Err(e) => {
                    tx.send(Err(e)).await;
                    return;
                }
            }
        }
        if finished {
            if let (Some(m), Some(s)) = (&metrics, &sh) {
                shuffle_summary(m, s);
            }
            return;
        }
        if pending.is_empty() {
            if let Some(e) = failed.take() {
                tx.send(Err(e)).await;
                return;
            }
            match receive(&mut rx, &mut pending, metrics.as_deref()).await {
                Ok(Some(e)) => failed = Some(e),
                Ok(None) => {}
                Err(Some(e)) => {
                    tx.send(Err(e)).await;
                    return;
                }
                Err(None) => {
                    finished = true;
                    drain = true;
                    let Some(s) = sh.take() else { return };
                    match step(&pool, blocking, &metrics, s, |s| s.finish()).await {
                        Ok((s, ())) => sh = Some(s),
                        Err(e) => {
                            tx.send(Err(e)).await;
                            return;
                        }
                    }
                    continue;
                }
            }
        }
        // Push until a batch makes output: the same calls, in the same order, as one push
        // and one look for output per trip.
        let Some(s) = sh.take() else { return };
        let mut batches = std::mem::take(&mut pending);
        let pushed = step(&pool, blocking, &metrics, s, move |s| {
            while let Some(b) = batches.pop_front() {
                s.push(b)?;
                if let Some(out) = s.next_output()? {
                    return Ok((Some(out), batches));
                }
            }
            Ok((None, batches))
        })
        .await;
        match pushed {
            Ok((s, (out, rest))) => {
                pending = rest;
                drain = out.is_some();
                if let Some(b) = out {
                    emitted(&s, &b);
                    sh = Some(s);
                    if !tx.send(Ok(b)).await {
                        return;
                    }
                } else {
                    sh = Some(s);
                }
            }
            Err(e) => {
                tx.send(Err(e)).await;
                return;
            }
        }
    }
}

/// Runs one shuffle step off the async workers: on the CPU pool, or, when it may wait for
/// other ranks (a collective exchange), on a blocking thread. A step on the pool counts as the
/// stage's busy time (the report weighs it against the other stages'); a blocking one may be
/// waiting for other ranks, which is not work, and does not.
async fn step<T: Send + 'static>(
    pool: &CpuPool,
    blocking: bool,
    metrics: &Option<Arc<StageMetrics>>,
    sh: stage::shuffle::Shuffler,
    f: impl FnOnce(&mut stage::shuffle::Shuffler) -> Result<T> + Send + 'static,
) -> Result<(stage::shuffle::Shuffler, T)> {
    let busy = metrics.clone().filter(|_| !blocking);
    let work = move || {
        let start = Instant::now();
        let mut sh = sh;
        let r = f(&mut sh);
        if let Some(m) = busy {
            m.busy_ns
                .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
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

/// Waits for the next input batch into `pending`, then takes those already queued behind it
/// (up to [`GROUPED_PUSHES`] and [`GROUPED_BYTES`]). `Ok(Some(e))`: an input error queued
/// behind them, to pass on once they are pushed; `Err(Some(e))`: the input failed at once;
/// `Err(None)`: the input ended.
async fn receive(
    rx: &mut Receiver,
    pending: &mut std::collections::VecDeque<Batch>,
    metrics: Option<&StageMetrics>,
) -> std::result::Result<Option<Error>, Option<Error>> {
    let taken = |b: Batch, pending: &mut std::collections::VecDeque<Batch>| {
        if let Some(m) = metrics {
            m.rows_in.fetch_add(b.num_rows() as u64, Ordering::Relaxed);
        }
        let bytes = b.memory_size();
        pending.push_back(b);
        bytes
    };
    let mut bytes = match rx.recv().await {
        Some(Ok(b)) => taken(b, pending),
        Some(Err(e)) => return Err(Some(e)),
        None => return Err(None),
    };
    while pending.len() < GROUPED_PUSHES && bytes < GROUPED_BYTES {
        match rx.try_recv() {
            Some(Ok(b)) => bytes += taken(b, pending),
            Some(Err(e)) => return Ok(Some(e)),
            None => break,
        }
    }
    Ok(None)
}

/// The shuffle's closing notes: rows replayed, and its spills.
fn shuffle_summary(m: &StageMetrics, s: &stage::shuffle::Shuffler) {
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
