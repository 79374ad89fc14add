//! `sluice sweep job.yaml --space sweep.yaml --trials 16 --parallel 2`: hyperparameter search
//! over a training job. Each trial is a `sluice train` process of the job with the trial's
//! settings as `--set` overrides, in a folder of its own (`<dir>/trial-0003/`: its step log,
//! summary, output, and its checkpoint, TensorBoard and export folders when the job has them).
//! The sweep follows each trial's step log for its evaluations; with `scheduler: asha` a
//! trial below the best of its rung is stopped ([`asha`]). Everything the sweep knows is kept
//! in `<dir>/sweep.json`, rewritten atomically after each change, so a sweep killed and
//! started again with the same command goes on: finished trials are kept, a trial that was
//! running starts over. At the end: a table of the trials and the best one's settings (also
//! in `<dir>/best.yaml`).

mod asha;
mod run;
mod space;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde::{Deserialize, Serialize};

use space::{Scheduler, Space};

/// `sluice sweep`'s arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct SweepArgs {
    /// The training job: a `sluice train` file with `trainer.eval` (the metric comes from it).
    pub config: PathBuf,
    /// The search space: `metric`, `parameters`, `seed`, `scheduler` (see docs/sweep.md).
    #[arg(long)]
    pub space: PathBuf,
    /// Trials to run (1–10,000).
    #[arg(long, default_value_t = 8)]
    pub trials: u64,
    /// Trials running at once (1–64); each is a `sluice train` with its own workers.
    #[arg(long, default_value_t = 1)]
    pub parallel: usize,
    /// `asha` or `none`, in place of the space file's `scheduler` (`asha` then takes its
    /// defaults: min_steps 10, reduction 3, unless the file sets them).
    #[arg(long)]
    pub scheduler: Option<String>,
    /// Where the trials and the sweep's state go. Default: `sluice-sweep/<config name>/`.
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

/// Where a sweep stands (`sweep.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct State {
    /// `sluice-sweep/1`.
    format: String,
    /// The job's path, as given.
    config: PathBuf,
    /// The space file's text: a restart with another space is refused.
    space: String,
    trials: Vec<Trial>,
}

/// One trial.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Trial {
    id: u64,
    /// `(path, YAML value)` overrides.
    params: Vec<(String, String)>,
    status: Status,
    /// `(step, metric)` of each evaluation seen.
    evals: Vec<(u64, f64)>,
    /// Steps it took.
    steps: u64,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Status {
    Pending,
    Running,
    /// Ran to its end.
    Done,
    /// Stopped early by the scheduler.
    Stopped,
    Failed,
}

impl Trial {
    /// Its last evaluation's metric.
    fn metric(&self) -> Option<f64> {
        self.evals.last().map(|(_, m)| *m)
    }
}

/// Runs (or continues) the sweep; prints the table and the best settings.
pub fn sweep(args: &SweepArgs) -> ExitCode {
    match prepare(args).and_then(|(mut state, space, dir)| {
        run::run(args, &space, &dir, &mut state)?;
        Ok((state, space, dir))
    }) {
        Ok((state, space, dir)) => report(args, &state, &space, &dir),
        Err(e) => {
            eprintln!("error: sluice sweep: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Reads the space, checks the arguments, and loads the sweep's state (or starts one).
fn prepare(args: &SweepArgs) -> Result<(State, Space, PathBuf), String> {
    if !(1..=10_000).contains(&args.trials) {
        return Err(format!(
            "--trials {} is out of range: allowed 1–10,000",
            args.trials
        ));
    }
    if !(1..=64).contains(&args.parallel) {
        return Err(format!(
            "--parallel {} is out of range: allowed 1–64",
            args.parallel
        ));
    }
    let text = std::fs::read_to_string(&args.space)
        .map_err(|e| format!("--space {}: {e}", args.space.display()))?;
    let mut space: Space =
        serde_saphyr::from_str(&text).map_err(|e| format!("{}: {e}", args.space.display()))?;
    match args.scheduler.as_deref() {
        None => {}
        Some("none") => space.scheduler = Scheduler::None,
        Some("asha") if matches!(space.scheduler, Scheduler::Asha { .. }) => {}
        Some("asha") => {
            space.scheduler = Scheduler::Asha {
                min_steps: 10,
                reduction: 3,
            }
        }
        Some(other) => return Err(format!("--scheduler {other}: use asha or none")),
    }
    space
        .check()
        .map_err(|e| format!("{}: {e}", args.space.display()))?;
    let dir = args.dir.clone().unwrap_or_else(|| {
        let stem = args
            .config
            .file_stem()
            .map_or("job".into(), |s| s.to_string_lossy());
        PathBuf::from("sluice-sweep").join(stem.as_ref())
    });
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut state = match std::fs::read(dir.join("sweep.json")) {
        Ok(bytes) => {
            let state: State = serde_json::from_slice(&bytes).map_err(|e| {
                format!(
                    "{}: not a sweep's state: {e}",
                    dir.join("sweep.json").display()
                )
            })?;
            if state.space != text || state.config != args.config {
                return Err(format!(
                    "{} holds a sweep of {} with another space: give another --dir, or delete it to start over",
                    dir.display(),
                    state.config.display()
                ));
            }
            state
        }
        Err(_) => State {
            format: "sluice-sweep/1".into(),
            config: args.config.clone(),
            space: text,
            trials: Vec::new(),
        },
    };
    for t in &mut state.trials {
        if t.status == Status::Running {
            // The sweep died with it: it starts over.
            *t = fresh(t.id, &space);
        }
    }
    for id in state.trials.len() as u64..args.trials {
        state.trials.push(fresh(id, &space));
    }
    Ok((state, space, dir))
}

fn fresh(id: u64, space: &Space) -> Trial {
    Trial {
        id,
        params: space.draw(id),
        status: Status::Pending,
        evals: Vec::new(),
        steps: 0,
        error: None,
    }
}

/// Writes `state` to `dir/sweep.json` atomically (a temporary file renamed over it).
fn save(dir: &Path, state: &State) -> Result<(), String> {
    let tmp = dir.join("sweep.json.tmp");
    let bytes = serde_json::to_vec_pretty(state).map_err(|e| e.to_string())?;
    std::fs::write(&tmp, bytes)
        .and_then(|()| std::fs::rename(&tmp, dir.join("sweep.json")))
        .map_err(|e| format!("{}: {e}", dir.join("sweep.json").display()))
}

/// The table, the best trial and its settings; failure when no trial gave a metric.
fn report(args: &SweepArgs, state: &State, space: &Space, dir: &Path) -> ExitCode {
    out!(
        "sluice sweep {}: {} trials",
        args.config.display(),
        state.trials.len()
    );
    out!("  trial  status    steps  metric    settings");
    for t in &state.trials {
        let settings: Vec<String> = t.params.iter().map(|(k, v)| format!("{k}={v}")).collect();
        out!(
            "  {:>5}  {:<8}  {:>5}  {:<8}  {}",
            t.id,
            format!("{:?}", t.status).to_lowercase(),
            t.steps,
            t.metric().map_or("-".into(), |m| format!("{m:.4}")),
            settings.join(" ")
        );
    }
    let total: u64 = state.trials.iter().map(|t| t.steps).sum();
    out!("  steps in all: {total}");
    let best = state
        .trials
        .iter()
        .filter(|t| t.status == Status::Done)
        .filter_map(|t| t.metric().map(|m| (t, m)))
        .max_by(|a, b| space.metric.score(a.1).total_cmp(&space.metric.score(b.1)));
    let Some((best, metric)) = best else {
        eprintln!(
            "error: sluice sweep: no trial finished with an evaluation; see each trial's stderr.log under {}",
            dir.display()
        );
        return ExitCode::FAILURE;
    };
    out!("best: trial {} with {metric:.4}", best.id);
    let yaml: String = best
        .params
        .iter()
        .map(|(k, v)| format!("{k}: {v}\n"))
        .collect();
    let _ = std::fs::write(dir.join("best.yaml"), &yaml);
    out!(
        "# its settings (in {}; each a --set for sluice train):",
        dir.join("best.yaml").display()
    );
    for line in yaml.lines() {
        out!("{line}");
    }
    ExitCode::SUCCESS
}
