//! A queue between stages bounded in bytes of Arrow memory.
//!
//! The sender reserves the batch's size from a semaphore before enqueueing; the permit travels
//! with the batch and is released when the receiver takes it. A batch larger than the whole
//! capacity still passes, alone (it reserves the full capacity), so nothing can deadlock.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

use crate::batch::Batch;
use crate::error::Result;

/// Budget granularity: permits are KiB so a queue can hold up to 4 TiB.
const UNIT: usize = 1024;

/// Counters of one queue (two monotonic counters each, as Vector does: depth = pushed − popped).
#[derive(Debug, Default)]
pub struct QueueStats {
    /// Batches enqueued.
    pub pushed: AtomicU64,
    /// Batches dequeued.
    pub popped: AtomicU64,
    /// Bytes enqueued.
    pub bytes_pushed: AtomicU64,
    /// Bytes dequeued.
    pub bytes_popped: AtomicU64,
    /// Nanoseconds the producer waited for room: the consumer side is slower.
    pub send_blocked_ns: AtomicU64,
    /// Nanoseconds the consumer waited for a batch: the producer side is slower.
    pub recv_waited_ns: AtomicU64,
    /// Batches the consumer found already waiting when it asked for the next one (SPDL's
    /// readiness: `ready / popped`; ≥ 99% means the producer side is ahead).
    pub ready: AtomicU64,
}

impl QueueStats {
    /// Share of the batches taken that were already waiting when asked for; `None` before
    /// the first.
    pub fn readiness(&self) -> Option<f64> {
        let popped = self.popped.load(Ordering::Relaxed);
        (popped > 0).then(|| self.ready.load(Ordering::Relaxed) as f64 / popped as f64)
    }

    /// Bytes in the queue now.
    pub fn bytes_queued(&self) -> u64 {
        let pushed = self.bytes_pushed.load(Ordering::Relaxed);
        pushed.saturating_sub(self.bytes_popped.load(Ordering::Relaxed))
    }
}

fn add_elapsed(counter: &AtomicU64, since: Instant) {
    let ns = u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX);
    counter.fetch_add(ns, Ordering::Relaxed);
}

struct Item {
    batch: Result<Batch>,
    bytes: u64,
    _permit: OwnedSemaphorePermit,
}

/// Sending half.
pub(crate) struct Sender {
    tx: mpsc::UnboundedSender<Item>,
    budget: Arc<Semaphore>,
    capacity_units: u32,
    stats: Arc<QueueStats>,
}

/// Receiving half.
pub(crate) struct Receiver {
    rx: mpsc::UnboundedReceiver<Item>,
    stats: Arc<QueueStats>,
    /// When `poll_recv` first found the queue empty (for `recv_waited_ns`).
    waiting_since: Option<Instant>,
}

/// A queue holding at most `capacity_bytes` of batches (plus one oversized batch).
pub(crate) fn channel(capacity_bytes: u64, stats: Arc<QueueStats>) -> (Sender, Receiver) {
    let capacity_units = (capacity_bytes as usize)
        .div_ceil(UNIT)
        .clamp(1, u32::MAX as usize) as u32;
    let (tx, rx) = mpsc::unbounded_channel();
    (
        Sender {
            tx,
            budget: Arc::new(Semaphore::new(capacity_units as usize)),
            capacity_units,
            stats: stats.clone(),
        },
        Receiver {
            rx,
            stats,
            waiting_since: None,
        },
    )
}

impl Sender {
    /// Enqueues `batches` in order, or passes the error on. Returns `false` when the sender
    /// should stop: the receiver is gone, or it was given an error.
    pub(crate) async fn send_all(&self, batches: Result<Vec<Batch>>) -> bool {
        match batches {
            Ok(batches) => {
                for b in batches {
                    if !self.send(Ok(b)).await {
                        return false;
                    }
                }
                true
            }
            Err(e) => {
                self.send(Err(e)).await;
                false
            }
        }
    }

    /// Waits for room, then enqueues. Returns `false` when the receiver is gone.
    pub(crate) async fn send(&self, batch: Result<Batch>) -> bool {
        let bytes = batch.as_ref().map(|b| b.memory_size()).unwrap_or(0);
        let units = bytes.div_ceil(UNIT).clamp(1, self.capacity_units as usize) as u32;
        let permit = match self.budget.clone().try_acquire_many_owned(units) {
            Ok(p) => p,
            Err(tokio::sync::TryAcquireError::Closed) => return false,
            Err(tokio::sync::TryAcquireError::NoPermits) => {
                let blocked = Instant::now();
                let Ok(p) = self.budget.clone().acquire_many_owned(units).await else {
                    return false;
                };
                add_elapsed(&self.stats.send_blocked_ns, blocked);
                p
            }
        };
        self.stats.pushed.fetch_add(1, Ordering::Relaxed);
        self.stats
            .bytes_pushed
            .fetch_add(bytes as u64, Ordering::Relaxed);
        self.tx
            .send(Item {
                batch,
                bytes: bytes as u64,
                _permit: permit,
            })
            .is_ok()
    }
}

impl Receiver {
    /// Next batch, or `None` when the sender finished.
    pub(crate) async fn recv(&mut self) -> Option<Result<Batch>> {
        let item = match self.rx.try_recv() {
            Ok(item) => {
                self.stats.ready.fetch_add(1, Ordering::Relaxed);
                item
            }
            Err(mpsc::error::TryRecvError::Disconnected) => return None,
            Err(mpsc::error::TryRecvError::Empty) => {
                let waited = Instant::now();
                let item = self.rx.recv().await;
                add_elapsed(&self.stats.recv_waited_ns, waited);
                item?
            }
        };
        Some(self.popped(item))
    }

    /// The next batch if one is queued now, without waiting; `None` when none is (or the
    /// sender finished: `recv` tells which).
    pub(crate) fn try_recv(&mut self) -> Option<Result<Batch>> {
        let item = self.rx.try_recv().ok()?;
        self.stats.ready.fetch_add(1, Ordering::Relaxed);
        Some(self.popped(item))
    }

    /// `item`'s batch, counted as taken out of the queue.
    fn popped(&self, item: Item) -> Result<Batch> {
        self.stats.popped.fetch_add(1, Ordering::Relaxed);
        self.stats
            .bytes_popped
            .fetch_add(item.bytes, Ordering::Relaxed);
        item.batch
    }

    pub(crate) fn poll_recv(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Batch>>> {
        let polled = self.rx.poll_recv(cx);
        // Ready at the first poll for this batch: it was waiting.
        if matches!(polled, std::task::Poll::Ready(Some(_))) && self.waiting_since.is_none() {
            self.stats.ready.fetch_add(1, Ordering::Relaxed);
        }
        match (&polled, self.waiting_since) {
            (std::task::Poll::Pending, None) => self.waiting_since = Some(Instant::now()),
            (std::task::Poll::Ready(_), Some(since)) => {
                add_elapsed(&self.stats.recv_waited_ns, since);
                self.waiting_since = None;
            }
            _ => {}
        }
        polled.map(|o| o.map(|item| self.popped(item)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::{Lineage, Name, Origin};
    use arrow::array::{Int64Array, RecordBatch};
    use futures::FutureExt;

    fn batch(rows: i64) -> Batch {
        let data = RecordBatch::try_from_iter([(
            "x",
            Arc::new(Int64Array::from_iter_values(0..rows)) as _,
        )])
        .unwrap();
        let origin = Origin::Object {
            url: Name::from("file:///t"),
            row_group: 0,
        };
        Batch::new(data, Lineage::new(origin, 0, rows as u64, 0))
    }

    /// A batch already queued when asked for counts as ready; one the consumer had to wait
    /// for (a first poll that found the queue empty) does not.
    #[tokio::test]
    async fn readiness_counts_the_batches_that_were_already_waiting() {
        let stats = Arc::new(QueueStats::default());
        let (tx, mut rx) = channel(1 << 20, stats.clone());
        assert_eq!(stats.readiness(), None);
        assert!(tx.send(Ok(batch(8))).await);
        assert!(rx.recv().await.is_some()); // waiting: ready
        let waker = futures::task::noop_waker();
        let mut cx = std::task::Context::from_waker(&waker);
        assert!(rx.poll_recv(&mut cx).is_pending()); // asked, empty
        assert!(tx.send(Ok(batch(8))).await);
        assert!(rx.poll_recv(&mut cx).is_ready()); // came after the ask: not ready
        assert!(tx.send(Ok(batch(8))).await);
        assert!(rx.poll_recv(&mut cx).is_ready()); // waiting: ready
        assert_eq!(stats.ready.load(Ordering::Relaxed), 2);
        assert_eq!(stats.readiness(), Some(2.0 / 3.0));
    }

    #[tokio::test]
    async fn blocks_when_full_and_admits_oversized_batches() {
        let stats = Arc::new(QueueStats::default());
        let (tx, mut rx) = channel(16 * 1024, stats.clone());
        // 4096 rows of i64 = 32 KiB > capacity: admitted alone.
        assert!(tx.send(Ok(batch(4096))).await);
        // The next one must wait until the first is taken.
        assert!(
            tx.send(Ok(batch(8))).now_or_never().is_none(),
            "queue over budget must block the sender"
        );
        assert_eq!(rx.recv().await.unwrap().unwrap().num_rows(), 4096);
        assert!(tx.send(Ok(batch(8))).await);
        assert_eq!(rx.recv().await.unwrap().unwrap().num_rows(), 8);
        assert_eq!(stats.pushed.load(Ordering::Relaxed), 2);
        assert_eq!(stats.popped.load(Ordering::Relaxed), 2);
    }
}
