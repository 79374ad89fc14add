//! Runtime plumbing shared by sources, stages and the executor: the bounded CPU pool, the
//! byte-bounded channels between tasks, buffer recycling, buffers in huge pages for rows read
//! at random (`huge`) and the metrics every component
//! reports into (and `tensorboard`, the event files `sluice run` and `sluice train` write them to). It knows nothing about what flows through it, so sources and stages import it
//! downward instead of reaching up into the executor.

pub(crate) mod channel;
mod cpu;
pub(crate) mod huge;
pub mod metrics;
mod pool;
pub(crate) mod recycle;
pub mod tensorboard;

pub use self::cpu::{loader_cpu_seconds, process_cpu_seconds, process_wall_seconds};
pub use self::metrics::{PipelineMetrics, SourceMetrics, StageMetrics};
pub use self::pool::{CpuPool, panic_message};
