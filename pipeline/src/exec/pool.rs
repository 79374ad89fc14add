//! The bounded CPU pool: decode and transform work runs here, never on tokio's workers.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use crate::error::{Error, Result};

/// A fixed-size rayon pool with an async `run`.
#[derive(Clone, Debug)]
pub struct CpuPool {
    pool: Arc<rayon::ThreadPool>,
}

impl CpuPool {
    /// A pool of `threads` threads (`None`: one per core).
    pub fn new(threads: Option<usize>) -> Result<Self> {
        let threads = threads.unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(2)
        });
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads.max(1))
            .thread_name(|i| format!("sluice-cpu-{i}"))
            .build()
            .map_err(|e| Error::Internal(format!("cannot start CPU pool: {e}")))?;
        Ok(CpuPool {
            pool: Arc::new(pool),
        })
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
        self.pool.spawn(move || {
            let out = std::panic::catch_unwind(AssertUnwindSafe(f));
            let _ = tx.send(out);
        });
        match rx.await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(panic)) => {
                let msg = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into());
                Err(Error::Internal(format!("CPU task panicked: {msg}")))
            }
            Err(_) => Err(Error::Internal("CPU pool dropped a task".into())),
        }
    }
}
