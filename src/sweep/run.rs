//! Running the trials: at most `--parallel` `sluice train` processes at once, each followed
//! through its step log (the sweep looks at every running trial every [`POLL`]: it waits on
//! several processes and files at once, which std offers no single wait for).

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::asha::Asha;
use super::space::{Scheduler, Space};
use super::{State, Status, SweepArgs, save};

/// How often running trials are looked at.
const POLL: Duration = Duration::from_millis(100);

/// A running trial.
#[derive(Debug)]
struct Live {
    index: usize,
    child: Child,
    log: PathBuf,
    /// Bytes of the log already read.
    read: u64,
    /// Whether the scheduler stopped it.
    stopped: bool,
}

/// Runs every pending trial of `state`, saving it after each change.
pub(super) fn run(
    args: &SweepArgs,
    space: &Space,
    dir: &Path,
    state: &mut State,
) -> Result<(), String> {
    let job = Job::read(&args.config)?;
    let mut asha = match space.scheduler {
        Scheduler::Asha {
            min_steps,
            reduction,
        } => Some(Asha::new(min_steps, reduction)),
        Scheduler::None => None,
    };
    // What finished trials recorded at the rungs still counts.
    if let Some(a) = &mut asha {
        for t in state
            .trials
            .iter()
            .filter(|t| t.status != super::Status::Pending)
        {
            for &(step, m) in &t.evals {
                a.goes_on(t.id, step, space.metric.score(m));
            }
        }
    }
    save(dir, state)?;
    let mut live: Vec<Live> = Vec::new();
    loop {
        while live.len() < args.parallel {
            let Some(index) = state
                .trials
                .iter()
                .position(|t| t.status == Status::Pending)
            else {
                break;
            };
            live.push(start(&job, space, dir, state, index)?);
            save(dir, state)?;
        }
        if live.is_empty() {
            return Ok(());
        }
        let mut changed = false;
        let mut k = 0;
        while k < live.len() {
            changed |= follow(&mut live[k], state, space, asha.as_mut())?;
            match live[k].child.try_wait() {
                Ok(Some(status)) => {
                    let l = live.swap_remove(k);
                    follow_to_end(l, status.success(), state, space, dir)?;
                    changed = true;
                }
                Ok(None) => k += 1,
                Err(e) => return Err(format!("waiting for a trial: {e}")),
            }
        }
        if changed {
            save(dir, state)?;
        }
        std::thread::sleep(POLL);
    }
}

/// What the sweep needs to know of the job.
#[derive(Debug)]
struct Job {
    config: PathBuf,
    checkpoint: bool,
    tensorboard: bool,
    export: bool,
}

impl Job {
    fn read(config: &Path) -> Result<Job, String> {
        let doc = crate::overrides::config_document(config, &[]).map_err(|e| e.to_string())?;
        let job = sluice::trainer::TrainJob::from_document(&doc).map_err(|e| e.to_string())?;
        if job.trainer.eval.is_none() {
            return Err(format!(
                "{}: the job has no `trainer.eval`: a sweep compares trials by their evaluation; add `eval: {{path: held-out.parquet}}`",
                config.display()
            ));
        }
        let config =
            std::fs::canonicalize(config).map_err(|e| format!("{}: {e}", config.display()))?;
        Ok(Job {
            config,
            checkpoint: job.trainer.checkpoint.is_some(),
            tensorboard: job.trainer.tensorboard.is_some(),
            export: job.trainer.export.is_some(),
        })
    }
}

/// Starts trial `index` in its folder (emptied first): `sluice train` with its settings.
fn start(
    job: &Job,
    space: &Space,
    dir: &Path,
    state: &mut State,
    index: usize,
) -> Result<Live, String> {
    let trial = &mut state.trials[index];
    let folder = std::fs::canonicalize(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .join(format!("trial-{:04}", trial.id));
    let _ = std::fs::remove_dir_all(&folder);
    std::fs::create_dir_all(&folder).map_err(|e| format!("{}: {e}", folder.display()))?;
    let log = folder.join("steps.jsonl");
    let mut sets: Vec<(String, String)> = trial.params.clone();
    let at = |name: &str| folder.join(name).display().to_string();
    sets.push(("trainer.log".into(), at("steps.jsonl")));
    if job.checkpoint {
        sets.push(("trainer.checkpoint.path".into(), at("train.ckpt")));
    }
    if job.tensorboard {
        sets.push(("trainer.tensorboard".into(), at("tensorboard")));
    }
    if job.export {
        sets.push(("trainer.export.path".into(), at("models")));
    }
    if let Scheduler::Asha { min_steps, .. } = space.scheduler {
        // Evaluations at every rung (rungs are multiples of the first).
        sets.push(("trainer.eval.every_steps".into(), min_steps.to_string()));
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the sluice binary: {e}"))?;
    let mut cmd = Command::new(exe);
    cmd.arg("-q")
        .arg("train")
        .arg(&job.config)
        .args(["--progress", "never", "--no-report", "--summary-json"])
        .arg(folder.join("summary.json"));
    for (path, value) in &sets {
        cmd.arg("--set").arg(format!("{path}={value}"));
    }
    let file = |name: &str| {
        std::fs::File::create(folder.join(name)).map_err(|e| format!("{}: {e}", folder.display()))
    };
    cmd.stdout(file("stdout.log")?)
        .stderr(file("stderr.log")?)
        .stdin(Stdio::null());
    die_with_parent(&mut cmd);
    let child = cmd
        .spawn()
        .map_err(|e| format!("cannot start trial {}: {e}", trial.id))?;
    trial.status = Status::Running;
    Ok(Live {
        index,
        child,
        log,
        read: 0,
        stopped: false,
    })
}

/// A trial must not outlive a sweep that is killed (it would write into a folder the
/// restarted sweep reuses): the kernel sends it SIGKILL when the sweep's thread exits.
#[allow(unsafe_code)]
fn die_with_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs in the forked child before exec and calls only prctl(2) and
    // getppid(2), which are async-signal-safe; it touches no memory of the parent.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The sweep died between fork and prctl: no signal will come, so do not start.
            if libc::getppid() != parent {
                return Err(std::io::Error::other("the sweep exited"));
            }
            Ok(())
        });
    }
}

/// Reads the trial's new complete log lines: its steps and evaluations; the scheduler may
/// stop it. Returns whether anything changed.
fn follow(
    l: &mut Live,
    state: &mut State,
    space: &Space,
    mut asha: Option<&mut Asha>,
) -> Result<bool, String> {
    let Ok(mut f) = std::fs::File::open(&l.log) else {
        return Ok(false); // not written yet
    };
    let mut text = String::new();
    f.seek(SeekFrom::Start(l.read))
        .and_then(|_| f.read_to_string(&mut text))
        .map_err(|e| format!("{}: {e}", l.log.display()))?;
    let Some(end) = text.rfind('\n') else {
        return Ok(false);
    };
    l.read += end as u64 + 1;
    let trial = &mut state.trials[l.index];
    for line in text[..end].lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if let Some(step) = v.get("step").and_then(serde_json::Value::as_u64) {
            trial.steps = trial.steps.max(step);
        }
        let Some(eval) = v.get("eval") else { continue };
        let (Some(step), Some(m)) = (
            eval.get("step").and_then(serde_json::Value::as_u64),
            space.metric.of(eval),
        ) else {
            continue;
        };
        trial.evals.push((step, m));
        if let Some(a) = asha.as_deref_mut()
            && !l.stopped
            && !a.goes_on(trial.id, step, space.metric.score(m))
        {
            l.stopped = true;
            let _ = l.child.kill();
        }
    }
    Ok(end > 0)
}

/// The trial ended: the rest of its log, and how it ended.
fn follow_to_end(
    mut l: Live,
    success: bool,
    state: &mut State,
    space: &Space,
    dir: &Path,
) -> Result<(), String> {
    follow(&mut l, state, space, None)?;
    let trial = &mut state.trials[l.index];
    trial.status = match (l.stopped, success) {
        (true, _) => Status::Stopped,
        (false, true) => Status::Done,
        (false, false) => {
            let stderr = dir
                .join(format!("trial-{:04}", trial.id))
                .join("stderr.log");
            let text = std::fs::read_to_string(&stderr).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(5).collect();
            trial.error = Some(tail.into_iter().rev().collect::<Vec<_>>().join("\n"));
            Status::Failed
        }
    };
    Ok(())
}
