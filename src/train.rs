//! `sluice train`.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use sluice::observe::{Observed, Sampler};
use sluice::report::{Curves, Report};
use sluice::trainer::config::Backend;
use sluice::trainer::{LoaderCpu, Progress, TrainJob, TrainOptions, TrainReport, TrainingMetrics};

use crate::{
    Observe, ProgressMode, SAMPLE_EVERY, check_output_flags, interrupt_signal, print_error,
    start_observing, write_report,
};

pub(crate) async fn train(
    (config, overrides): (&Path, &[(String, String)]),
    progress: ProgressMode,
    (summary_json, metric_json): (Option<&Path>, bool),
    (resume, elastic): (bool, bool),
    (workers, backend): (Option<usize>, Option<String>),
    observe: &Observe,
    quiet: bool,
) -> ExitCode {
    if let Err(code) = check_output_flags(summary_json, observe) {
        return code;
    }
    let interrupt = interrupt_signal();
    let mut job = match crate::overrides::config_document(config, overrides)
        .map_err(sluice::trainer::TrainError::from)
        .and_then(|doc| TrainJob::from_document(&doc))
    {
        Ok(j) => j,
        Err(e) => {
            print_error(&e);
            return ExitCode::FAILURE;
        }
    };
    if let Some(dir) = &observe.tensorboard {
        // Relative to where the command runs, as every other flag's path.
        let dir = std::env::current_dir().map_or(dir.clone(), |cwd| cwd.join(dir));
        job.trainer.tensorboard = Some(dir.display().to_string());
    }
    if let Err(code) = apply_overrides(&mut job, workers, backend) {
        return code;
    }
    // SIGTERM/SIGINT: every rank checkpoints at the next step and stops.
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let watcher = tokio::spawn(async move {
        interrupt.await;
        tracing::warn!("interrupted: checkpointing at the next step, then stopping");
        flag.store(true, Ordering::Relaxed);
    });
    let bar = progress_bar(progress);
    let training = Arc::new(TrainingMetrics::default());
    let observed = Arc::new(Observed::training(training.clone()));
    // Under mpirun each rank is a process of its own: rank r serves on port + r.
    let process_rank = match job.trainer.allreduce.backend {
        Backend::Mpi => ["OMPI_COMM_WORLD_RANK", "PMI_RANK"]
            .iter()
            .find_map(|v| std::env::var(v).ok()?.parse().ok())
            .unwrap_or(0),
        Backend::Local => 0,
    };
    let mut background = match start_observing(observe, &observed, process_rank).await {
        Ok(t) => t,
        Err(code) => return code,
    };
    let (sampler, sampling) = Sampler::start(observed.clone(), SAMPLE_EVERY);
    background.push(sampling);
    let options = TrainOptions {
        resume,
        elastic,
        stop,
        metrics: Some(training.clone()),
        progress: bar.clone().map(progress_callback),
    };
    let result = run_training(job, options).await;
    watcher.abort();
    for t in background {
        t.abort();
    }
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    let mut report = match result {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            print_error(&e);
            return ExitCode::FAILURE;
        }
        Err(e) => {
            eprintln!("error: the training thread failed: {e}");
            return ExitCode::FAILURE;
        }
    };
    report.loader = LoaderCpu::measure(report.seconds);
    if report.rank != 0 {
        // Under mpirun every rank runs this; rank 0 speaks for the job.
        return if report.interrupted {
            ExitCode::from(crate::signals::INTERRUPTED)
        } else {
            ExitCode::SUCCESS
        };
    }
    if !quiet {
        print_summary(config, &report);
    }
    if let Some(dir) = observe.report_dir(config, "train") {
        write_train_report(&dir, config, &observed, &sampler, &training, &report);
    }
    if let Some(path) = summary_json
        && let Err(code) = write_summary_json(path, &report)
    {
        return code;
    }
    if metric_json {
        print_metric_line(&report);
    }
    if report.interrupted {
        eprintln!(
            "interrupted at step {}; {} covers it: run again with --resume to continue",
            report.steps,
            report
                .checkpoint
                .as_deref()
                .unwrap_or("(no checkpoint configured)")
        );
        return ExitCode::from(crate::signals::INTERRUPTED);
    }
    ExitCode::SUCCESS
}

/// Runs the training loop on a thread of its own, named `sluice-train` rather than one of
/// the async runtime's blocking threads (named `sluice-io`, the loader's): the loader's CPU
/// share counts the threads by name. `Err` when the thread could not start or panicked.
async fn run_training(
    job: TrainJob,
    options: TrainOptions,
) -> Result<Result<TrainReport, sluice::trainer::TrainError>, String> {
    let handle = tokio::runtime::Handle::current();
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("sluice-train".into())
        .spawn(move || {
            let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                sluice::trainer::train(&job, &options, &handle)
            }));
            let _ = tx.send(out.map_err(|p| sluice::pipeline::runtime::panic_message(p.as_ref())));
        })
        .map_err(|e| format!("cannot start it: {e}"))?;
    match rx.await {
        Ok(Ok(r)) => Ok(r),
        Ok(Err(panic)) => Err(format!("it panicked: {panic}")),
        Err(_) => Err("it ended without a result".into()),
    }
}

/// Applies `--backend` and `--workers` to the job (checking it again after `--workers`);
/// the exit code when a value is wrong.
fn apply_overrides(
    job: &mut TrainJob,
    workers: Option<usize>,
    backend: Option<String>,
) -> Result<(), ExitCode> {
    if let Some(b) = backend {
        job.trainer.allreduce.backend = match b.as_str() {
            "local" => Backend::Local,
            "mpi" => Backend::Mpi,
            other => {
                eprintln!("error: --backend {other}: use local or mpi");
                return Err(ExitCode::from(2));
            }
        };
    }
    if let Some(w) = workers {
        job.trainer.allreduce.workers = w;
        if let Err(e) = job.check() {
            print_error(&e);
            return Err(ExitCode::FAILURE);
        }
    }
    Ok(())
}

/// The progress bar: with `--progress auto` when stderr is a terminal.
fn progress_bar(progress: ProgressMode) -> Option<ProgressBar> {
    (matches!(progress, ProgressMode::Auto) && std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .then(|| {
            let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            let style = ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:40} step {human_pos}/{human_len}  {per_sec}  {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar());
            bar.set_style(style);
            bar
        })
}

/// Shows the trainer's progress on `bar`: the step, the loss and the last eval's accuracy.
fn progress_callback(bar: ProgressBar) -> sluice::trainer::run::ProgressFn {
    Arc::new(move |p: &Progress| {
        if let Some(t) = p.total_steps {
            bar.set_length(t);
        }
        bar.set_position(p.step);
        let acc = p
            .accuracy
            .map(|a| format!("  eval acc {:.2}%", 100.0 * a))
            .unwrap_or_default();
        bar.set_message(format!("loss {:.4}{acc}", p.loss));
    }) as sluice::trainer::run::ProgressFn
}

/// Writes the run report into `dir`, with the loss and eval curves.
fn write_train_report(
    dir: &Path,
    config: &Path,
    observed: &Observed,
    sampler: &Sampler,
    training: &TrainingMetrics,
    report: &TrainReport,
) {
    sampler.sample(observed);
    let (samples, names) = sampler.series();
    let (steps, evals) = training.history();
    let curves = Curves {
        loss: steps.iter().map(|p| (p.step as f64, p.loss)).collect(),
        eval_accuracy: evals
            .iter()
            .filter_map(|e| Some((e.step as f64, e.accuracy?)))
            .collect(),
        eval_loss: evals.iter().map(|e| (e.step as f64, e.loss)).collect(),
        // The slowest rank's: the all-reduce waits for it.
        data_stall_fraction: (!report.already_complete).then_some(report.data_stall_max),
    };
    let r = Report::build(
        "train",
        config,
        observed,
        &samples,
        &names,
        Some(curves),
        serde_json::to_value(report).unwrap_or_default(),
    );
    write_report(dir, &r);
}

/// Writes `--summary-json`: the training report plus this process's peak RSS.
/// `--metric-json`: the run's final metric as one JSON line on stdout (for a tuner).
fn print_metric_line(report: &TrainReport) {
    let eval = report.evals.last();
    let line = serde_json::json!({
        "step": report.steps,
        "loss": report.last_loss,
        "eval_loss": eval.map(|e| e.loss),
        "eval_accuracy": eval.and_then(|e| e.accuracy),
        "rows_trained": report.rows_trained,
        "interrupted": report.interrupted,
    });
    out!("{line}");
}

fn write_summary_json(path: &Path, report: &TrainReport) -> Result<(), ExitCode> {
    let mut value = serde_json::to_value(report).unwrap_or_default();
    if let (Some(map), Some(rss)) = (value.as_object_mut(), sluice::peak_rss_bytes()) {
        map.insert("peak_rss_bytes".into(), rss.into());
    }
    let text = serde_json::to_string_pretty(&value).unwrap_or_default();
    if let Err(e) = std::fs::write(path, text) {
        eprintln!("error: cannot write {}: {e}", path.display());
        return Err(ExitCode::FAILURE);
    }
    Ok(())
}

fn print_summary(config: &Path, r: &TrainReport) {
    if r.already_complete {
        out!(
            "sluice train {}: already complete at step {} ({} rows trained); delete the checkpoint to train again",
            config.display(),
            r.steps,
            r.rows_trained
        );
        return;
    }
    out!(
        "sluice train {}: {}",
        config.display(),
        if r.interrupted { "interrupted" } else { "ok" }
    );
    out!(
        "  steps    {} ({} this run) on {} worker(s), {} rows this run, {:.0} rows/s",
        r.steps,
        r.steps_this_run,
        r.world_size,
        r.rows_this_run,
        r.rows_per_second
    );
    if let Some(l) = r.last_loss {
        out!("  loss     {l:.4} (last step)");
    }
    if let Some(e) = r.evals.last() {
        match e.accuracy {
            Some(a) => out!(
                "  eval     accuracy {:.2}%, loss {:.4} over {} rows at step {}",
                100.0 * a,
                e.loss,
                e.rows,
                e.step
            ),
            None => out!(
                "  eval     loss {:.4} over {} rows at step {}",
                e.loss,
                e.rows,
                e.step
            ),
        }
    }
    let ready = r
        .data_readiness
        .map(|x| format!("ready {:.1}% of batches, ", 100.0 * x))
        .unwrap_or_default();
    out!(
        "  data     {ready}stall {:.2}% of the loop's time ({:.2} s waiting), all-reduce {:.2} s",
        100.0 * r.data_stall_fraction,
        r.data_wait_seconds,
        r.allreduce_seconds
    );
    if r.world_size > 1 && r.wire.wire_bytes != r.wire.dense_bytes {
        out!(
            "  wire     {:.2} MB sent by rank 0 ({:.1}% of plain f32 gradients), {:.2} s compressing",
            r.wire.wire_bytes as f64 / 1e6,
            100.0 * r.wire.wire_bytes as f64 / (r.wire.dense_bytes as f64).max(1.0),
            r.wire.compression_seconds
        );
    }
    if let Some(l) = &r.loader {
        out!(
            "  loader   {:.2} CPU-s on its own threads: {:.0}% of the host's {} core(s) over the run",
            l.loader_cpu_seconds,
            100.0 * l.loader_host_cpu_share,
            std::thread::available_parallelism().map_or(1, |n| n.get())
        );
    }
    if r.data_stall_per_rank.len() > 1 {
        let (slowest, max) = r
            .data_stall_per_rank
            .iter()
            .copied()
            .enumerate()
            .fold((0, 0.0), |a, (k, s)| if s > a.1 { (k, s) } else { a });
        out!(
            "  data     per rank: {} (the all-reduce waits for the slowest: rank {slowest}, {:.2}%)",
            r.data_stall_per_rank
                .iter()
                .map(|s| format!("{:.2}%", 100.0 * s))
                .collect::<Vec<_>>()
                .join(" · "),
            100.0 * max
        );
    }
    out!(
        "  threads  {}",
        crate::openmp::describe(tch::get_num_threads().max(1) as usize)
    );
    for n in &r.notes {
        out!("  pipeline {n}");
    }
    if let Some(e) = &r.elastic {
        out!("  warning  {e}");
    }
    if r.rows_untrained > 0 {
        out!(
            "  warning  {} rows were held by ranks when another ran out of data and were not trained",
            r.rows_untrained
        );
    }
    if let Some(c) = &r.checkpoint {
        out!("  checkpoint {c}");
    }
    out!(
        "  time     {:.1} s{}",
        r.seconds,
        sluice::peak_rss_bytes()
            .map(|b| format!(", peak RSS {:.0} MiB (this process)", sluice::mib(b)))
            .unwrap_or_default()
    );
}
