//! Ctrl-C and SIGTERM. The first asks the command to stop cleanly (a run flushes, checkpoints
//! and removes its partial output; a training run checkpoints); a second, or a clean stop that
//! takes longer than the grace period, ends the process at once, so a stop never hangs on a
//! stalled sink, an idle Kafka topic or a peer rank that never answers.
//!
//! Ending at once loses nothing that was promised: part files and checkpoints are written
//! under temporary names (object-store uploads are completed) only when whole, so what is left
//! is the last complete checkpoint, which `--resume` continues from, and staged files that
//! never became visible (on local disk the next run into the same output removes them).

use std::sync::OnceLock;
use std::time::Duration;

/// How long a clean stop may take after the first signal. Long enough to flush a part file
/// and write a checkpoint to an object store; shorter than Kubernetes' default 30 s between
/// SIGTERM and SIGKILL, so the message below is still printed there.
const DEFAULT_GRACE: Duration = Duration::from_secs(25);

/// The longest grace `SLUICE_STOP_GRACE` may ask for.
const MAX_GRACE: Duration = Duration::from_secs(3600);

/// The exit code of an interrupted command (128 + SIGINT, as shells report Ctrl-C).
pub(crate) const INTERRUPTED: u8 = 130;

static GRACE: OnceLock<Duration> = OnceLock::new();

/// Reads `SLUICE_STOP_GRACE` (a duration such as `10s`; `0s` ends the process on the first
/// signal); unset means 25 s. An unusable value is an error naming it, before any work.
pub(crate) fn configure_from_env() -> Result<(), String> {
    let grace = match std::env::var("SLUICE_STOP_GRACE") {
        Err(std::env::VarError::NotPresent) => DEFAULT_GRACE,
        Err(std::env::VarError::NotUnicode(v)) => {
            return Err(format!(
                "SLUICE_STOP_GRACE={v:?} is not text; give a duration such as 10s"
            ));
        }
        Ok(text) => match humantime::parse_duration(text.trim()) {
            Ok(d) if d <= MAX_GRACE => d,
            Ok(_) => {
                return Err(format!(
                    "SLUICE_STOP_GRACE={text} is out of range: allowed 0s–1h (the time a stop may take after Ctrl-C or SIGTERM)"
                ));
            }
            Err(e) => {
                return Err(format!(
                    "SLUICE_STOP_GRACE={text}: {e}; give a duration such as 10s"
                ));
            }
        },
    };
    let _ = GRACE.set(grace);
    Ok(())
}

fn grace() -> Duration {
    *GRACE.get_or_init(|| DEFAULT_GRACE)
}

/// Resolves on the first Ctrl-C or SIGTERM. The signal handlers are installed before this
/// returns, so a signal that arrives while the job is still starting is not lost. After the
/// first signal, a second one or the grace period ([`configure_from_env`]) ends the process
/// with [`INTERRUPTED`].
pub(crate) fn interrupt_signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    let (tx, mut rx) = tokio::sync::watch::channel(false);
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        ) {
            (Ok(mut int), Ok(mut term)) => {
                tokio::spawn(async move {
                    tokio::select! {
                        _ = int.recv() => {}
                        _ = term.recv() => {}
                    }
                    let _ = tx.send(true);
                    let grace = grace();
                    tracing::warn!(
                        "stopping cleanly; a second Ctrl-C or SIGTERM, or {} without a clean stop, ends the process at once",
                        humantime::format_duration(grace)
                    );
                    let why = tokio::select! {
                        _ = int.recv() => "a second interrupt".to_string(),
                        _ = term.recv() => "a second interrupt".to_string(),
                        _ = tokio::time::sleep(grace) => format!(
                            "no clean stop within {} (SLUICE_STOP_GRACE)",
                            humantime::format_duration(grace)
                        ),
                    };
                    exit_now(&why);
                });
            }
            _ => {
                tracing::warn!("cannot install signal handlers; Ctrl-C will kill the process");
                std::mem::forget(tx);
            }
        }
    }
    #[cfg(not(unix))]
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        let _ = tx.send(true);
        let grace = grace();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => exit_now("a second interrupt"),
            _ = tokio::time::sleep(grace) => exit_now("no clean stop within the grace period"),
        }
    });
    async move {
        let _ = rx.wait_for(|fired| *fired).await;
    }
}

/// Ends the process now, saying what is left and what to do.
fn exit_now(why: &str) -> ! {
    eprintln!(
        "error: {why}: exiting without a clean stop. Complete part files and the last checkpoint are intact (run again with --resume to continue from the checkpoint); files still being written never became visible (staged under temporary names; on local disk the next run into the same output removes them)"
    );
    std::process::exit(i32::from(INTERRUPTED));
}
