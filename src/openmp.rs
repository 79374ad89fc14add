//! libtorch's OpenMP threads must sleep when they have nothing to do: by default they spin in
//! their barriers for a while, and next to Sluice's own CPU pool (or any other busy process)
//! on a small machine that turns a 6-second MNIST run into minutes (measured: 668 rows/s
//! instead of 28,590 with one worker on 2 cores and a busy neighbour).
//!
//! OpenMP reads `OMP_WAIT_POLICY` once, when the runtime library is loaded — libgomp with
//! libtorch, before `main` runs — so setting it from inside the process is too late. When the
//! user has not chosen a policy, `sluice train` therefore starts itself again once, with
//! `OMP_WAIT_POLICY=PASSIVE` in its environment (the same process: `exec`); the other
//! commands run no libtorch threads and are not restarted.
//! Hand-written because no crate controls a loaded OpenMP runtime.

/// The variable OpenMP reads.
#[cfg(feature = "torch")]
pub const WAIT_POLICY: &str = "OMP_WAIT_POLICY";

/// Re-executes this program with `OMP_WAIT_POLICY=PASSIVE` unless the variable is set (by the
/// user, or by this very function before the `exec`). Returns only when no re-exec happened:
/// the variable was set already, or `exec` failed (then the run goes on as it is, said at
/// debug level).
#[cfg(feature = "torch")]
pub fn passive_or_reexec() {
    use std::os::unix::process::CommandExt;
    if std::env::var_os(WAIT_POLICY).is_some() {
        return;
    }
    let Ok(exe) = std::env::current_exe() else {
        return;
    };
    let err = std::process::Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env(WAIT_POLICY, "PASSIVE")
        .exec();
    tracing::debug!("could not restart with {WAIT_POLICY}=PASSIVE: {err}");
}

/// What the run summary says of libtorch's threads: how many, and whether they sleep.
#[cfg(feature = "torch")]
pub fn describe(threads: usize) -> String {
    let policy = std::env::var(WAIT_POLICY).unwrap_or_default();
    let waits = match policy.to_ascii_uppercase().as_str() {
        "PASSIVE" => "sleep when idle (OMP_WAIT_POLICY=PASSIVE)".to_string(),
        "" => "spin when idle (OMP_WAIT_POLICY unset)".to_string(),
        other => format!("follow your OMP_WAIT_POLICY={other}"),
    };
    format!("libtorch: {threads} intra-op thread(s) per rank; its OpenMP threads {waits}")
}
