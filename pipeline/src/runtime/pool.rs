//! The bounded CPU pool: decode and transform work runs here, never on tokio's workers.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::config::limits::{MAX_THREADS, THREADS};
use crate::config::{ConfigError, ConfigErrors};
use crate::error::{Error, Result};

/// A fixed-size rayon pool with an async `run`. It counts the time its tasks take: in all
/// (`busy`: with the threads and the wall time, how saturated the pool was) and, for a clone
/// made by [`CpuPool::counting`], also that clone's own share (the source's decode).
#[derive(Clone, Debug)]
pub struct CpuPool {
    pool: Arc<rayon::ThreadPool>,
    busy: Arc<AtomicU64>,
    share: Option<Arc<AtomicU64>>,
}

impl CpuPool {
    /// A pool of `threads` threads (`None` or `Some(0)`: one per core), at most
    /// [`MAX_THREADS`]. More is refused, and so is a pool the system will not start, naming
    /// `runtime.threads` and its range.
    pub fn new(threads: Option<usize>) -> Result<Self> {
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2);
        let max = usize::try_from(MAX_THREADS).unwrap_or(usize::MAX);
        let threads = match threads {
            None | Some(0) => cores.min(max),
            Some(n) if n > max => {
                return Err(threads_error(format!(
                    "{n} is out of range: allowed {}; {}",
                    THREADS.range(),
                    THREADS.why
                )));
            }
            Some(n) => n,
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("sluice-cpu-{i}"))
            // The loader's CPU time outlives its threads (`sluice train`'s loader share).
            .exit_handler(|_| super::cpu::retire_current_thread())
            .build()
            .map_err(|e| {
                threads_error(format!(
                    "the system would not start a CPU pool of {threads} threads ({e}); lower `runtime.threads` (allowed: {}), or raise the system's limit on threads (`ulimit -u`, the container's pids limit)",
                    THREADS.range()
                ))
            })?;
        Ok(CpuPool {
            pool: Arc::new(pool),
            busy: Arc::default(),
            share: None,
        })
    }

    /// This pool counting the time of all its tasks into `busy` (nanoseconds; the pipeline's
    /// [`PipelineMetrics::pool_busy_ns`](super::PipelineMetrics::pool_busy_ns)).
    pub fn counting_all(mut self, busy: Arc<AtomicU64>) -> Self {
        self.busy = busy;
        self
    }

    /// A handle on the same pool that also counts the time of the tasks run through it
    /// into `share` (nanoseconds): what one element of the pipeline keeps the pool busy.
    pub fn counting(&self, share: Arc<AtomicU64>) -> Self {
        CpuPool {
            share: Some(share),
            ..self.clone()
        }
    }

    /// Nanoseconds the pool's threads spent running tasks so far (wall time inside the
    /// tasks, summed over the threads).
    pub fn busy_ns(&self) -> u64 {
        self.busy.load(Ordering::Relaxed)
    }

    /// Number of threads.
    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// Runs `f` on the pool and awaits its result. A panic in `f` becomes
    /// [`Error::Internal`] instead of taking the process down.
    pub async fn run<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (busy, share) = (self.busy.clone(), self.share.clone());
        self.pool.spawn(move || {
            let start = Instant::now();
            let out = std::panic::catch_unwind(AssertUnwindSafe(f));
            let ns = start.elapsed().as_nanos() as u64;
            busy.fetch_add(ns, Ordering::Relaxed);
            if let Some(share) = share {
                share.fetch_add(ns, Ordering::Relaxed);
            }
            let _ = tx.send(out);
        });
        match rx.await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(panic)) => Err(Error::Internal(format!(
                "CPU task panicked: {}",
                panic_message(panic.as_ref())
            ))),
            Err(_) => Err(Error::Internal("CPU pool dropped a task".into())),
        }
    }
}

/// What a panicking thread or task left as its message.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

/// A problem with `runtime.threads` found when the pool starts (a config built in code, or
/// what the machine allows).
fn threads_error(message: String) -> Error {
    Error::Config(ConfigErrors(vec![ConfigError::unlocated(
        "runtime.threads",
        message,
    )]))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use std::time::Duration;

    /// Spins (not sleeps: a sleeping thread is busy to the pool too, but spinning is what a
    /// decode does) for at least `d`.
    fn work(d: Duration) {
        let start = Instant::now();
        while start.elapsed() < d {
            std::hint::spin_loop();
        }
    }

    /// Every task's time goes to the pool's total; a `counting` handle's tasks also to its
    /// share, and no other task's do.
    #[tokio::test]
    async fn tasks_count_into_the_total_and_their_handles_share() {
        let total = Arc::new(AtomicU64::new(0));
        let pool = CpuPool::new(Some(2)).unwrap().counting_all(total.clone());
        let share = Arc::new(AtomicU64::new(0));
        let source = pool.counting(share.clone());
        let ms = Duration::from_millis(20);
        let (a, b) = tokio::join!(pool.run(move || work(ms)), source.run(move || work(ms)));
        a.unwrap();
        b.unwrap();
        let (total, share) = (total.load(Ordering::Relaxed), share.load(Ordering::Relaxed));
        assert_eq!(pool.busy_ns(), total);
        assert_eq!(
            source.busy_ns(),
            total,
            "the handles share the pool's total"
        );
        assert!(share >= 20_000_000, "{share} ns");
        assert!(total >= share + 20_000_000, "{total} ns, of it {share}");
        // A panicking task is timed too, and its error comes back.
        let e = source.run(|| panic!("boom")).await.unwrap_err();
        assert!(e.to_string().contains("boom"), "{e}");
        assert!(source.busy_ns() > total);
    }
}
