//! The bounded CPU pool: decode and transform work runs here, never on tokio's workers.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use crate::config::limits::{MAX_THREADS, THREADS};
use crate::config::{ConfigError, ConfigErrors};
use crate::error::{Error, Result};

/// A fixed-size rayon pool with an async `run`.
#[derive(Clone, Debug)]
pub struct CpuPool {
    pool: Arc<rayon::ThreadPool>,
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
