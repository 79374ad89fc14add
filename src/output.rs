//! Standard output that never panics, and the flags that name files a command will write
//! (`--summary-json`, `--report`), checked before any work.

use std::path::Path;
use std::process::ExitCode;

use sluice::report::Report;

use crate::Observe;

/// Prints one line to standard output, like `println!`, but never panics: see
/// [`write_line`].
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::output::write_line(format_args!($($arg)*))
    };
}

/// What became of standard output: [`STDOUT_OPEN`], [`STDOUT_CLOSED`] (the reader went
/// away) or [`STDOUT_FAILED`] (another write error, reported).
static STDOUT: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(STDOUT_OPEN);
const STDOUT_OPEN: u8 = 0;
const STDOUT_CLOSED: u8 = 1;
const STDOUT_FAILED: u8 = 2;

/// Writes one line to standard output. Once the reader has gone away (`sluice inspect … |
/// head -2`: a broken pipe), this and later lines are dropped quietly ([`stdout_closed`]
/// says so) and the command ends as it would have; `println!` would panic. Any other write
/// error (a full disk behind `>`) is reported once, later lines are dropped, and the command
/// exits with 1 ([`main`]).
pub(crate) fn write_line(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    use std::sync::atomic::Ordering;
    if STDOUT.load(Ordering::Relaxed) != STDOUT_OPEN {
        return;
    }
    let mut stdout = std::io::stdout().lock();
    let written = stdout
        .write_fmt(args)
        .and_then(|()| stdout.write_all(b"\n"));
    match written {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
            STDOUT.store(STDOUT_CLOSED, Ordering::Relaxed);
        }
        Err(e) => {
            STDOUT.store(STDOUT_FAILED, Ordering::Relaxed);
            eprintln!("error: cannot write to standard output: {e}");
        }
    }
}

/// Whether standard output can no longer be written: nothing printed from now on is read.
pub(crate) fn stdout_closed() -> bool {
    STDOUT.load(std::sync::atomic::Ordering::Relaxed) != STDOUT_OPEN
}

/// Whether writing standard output failed (other than a closed pipe): the command exits 1.
pub(crate) fn stdout_failed() -> bool {
    STDOUT.load(std::sync::atomic::Ordering::Relaxed) == STDOUT_FAILED
}

pub(crate) fn print_error(e: &dyn std::fmt::Display) {
    for line in e.to_string().lines() {
        eprintln!("error: {line}");
    }
}

pub(crate) fn check_output_flags(
    summary_json: Option<&Path>,
    observe: &Observe,
) -> Result<(), ExitCode> {
    let mut problems = Vec::new();
    if let Some(path) = summary_json
        && let Err(why) = writable_file(path)
    {
        problems.push(format!("--summary-json {}: {why}", path.display()));
    }
    if let Some(dir) = &observe.report
        && let Err(why) = writable_dir(dir)
    {
        problems.push(format!("--report {}: {why}", dir.display()));
    }
    if problems.is_empty() {
        return Ok(());
    }
    for p in problems {
        eprintln!("error: {p}");
    }
    Err(ExitCode::from(2))
}

/// Whether a file can be written at `path`: not a directory, in a directory that exists and
/// lets this user create it. Tried by opening it for appending (an existing file is left as
/// it is; one created for the test is removed again).
pub(crate) fn writable_file(path: &Path) -> Result<(), String> {
    if path.is_dir() {
        return Err("is a directory; give the path of a file".into());
    }
    let existed = path.symlink_metadata().is_ok();
    match std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
    {
        Ok(_) => {
            if !existed {
                let _ = std::fs::remove_file(path);
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let parent = path
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            Err(format!(
                "cannot be written: the directory {} does not exist",
                parent.display()
            ))
        }
        Err(e) => Err(format!("cannot be written: {e}")),
    }
}

/// Whether files can be written in the directory `dir` (created if missing, as the report
/// would create it).
pub(crate) fn writable_dir(dir: &Path) -> Result<(), String> {
    if dir.exists() && !dir.is_dir() {
        return Err("is not a directory".into());
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create the directory: {e}"))?;
    let probe = dir.join(format!(".sluice-write-test-{}", std::process::id()));
    std::fs::File::create(&probe).map_err(|e| format!("cannot write in the directory: {e}"))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// Writes the run report; a failure is reported, not fatal (the run itself succeeded).
pub(crate) fn write_report(dir: &Path, report: &Report) {
    match report.write(dir) {
        Ok(()) => tracing::info!("run report in {}", dir.display()),
        Err(e) => eprintln!(
            "warning: cannot write the run report to {}: {e}",
            dir.display()
        ),
    }
}
