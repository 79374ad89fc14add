//! The `sluice` command line: `run`, `validate`, `inspect`.
//!
//! Exit codes: 0 success; 1 the job or config failed (message on stderr); 2 bad command-line
//! usage (an unusable flag value: `--summary-json` or `--report` where nothing can be
//! written, or an unusable `SLUICE_STOP_GRACE`; checked before any work); 130 interrupted
//! (Ctrl-C/SIGTERM: a clean stop with no partial output left, or, after a second signal or
//! the grace period, an immediate one: see `signals.rs`). A closed standard output (`sluice inspect … | head`) is not an error: what would
//! have been printed is dropped and the exit code is the command's own (`inspect` stops at
//! once, 0).

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use futures::FutureExt;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use sluice::observe::{Observed, Sampler, serve_metrics};
use sluice::pipeline::PipelineMetrics;
use sluice::report::Report;
use sluice::{Job, JobError, RunReport};
use tracing_subscriber::EnvFilter;

/// mimalloc keeps freed pages for reuse: batches of the same size are allocated over and
/// over, and with the system allocator each large one is fresh memory from the kernel (page
/// faults on every write). Measured on the CIFAR-style bench: raw decode 0.8 → 3.4 M
/// images/s, full pipeline 0.30 → 0.43–0.50 M images/s, peak RSS 385 → 273 MiB.
///
/// Built with `no_thp`: mimalloc does not ask for transparent huge pages. With them, a freshly
/// touched 2 MiB region is faulted in and zeroed whole; on the CIFAR bench that was 0.45–0.53 s
/// of kernel time in 5 of 8 runs (0.2 s without), 381–617 k images/s instead of 520–654 k, and
/// peak RSS 287–322 MiB instead of 262–275 MiB. (Where the system's THP mode is `always`,
/// `MIMALLOC_ALLOW_THP=0` turns it off for the process.)
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[macro_use]
mod output;
mod events;
mod inspect;
#[cfg(feature = "torch")]
mod k8s;
mod openmp;
mod overrides;
mod signals;
#[cfg(feature = "torch")]
mod sweep;

use inspect::{inspect, validate};
use output::{check_output_flags, print_error, write_report};
use signals::interrupt_signal;

#[derive(Debug, Parser)]
#[command(
    name = "sluice",
    version,
    about = "Streaming data pipelines that keep model trainers fed"
)]
struct Cli {
    /// More log output (-v info, -vv debug, -vvv trace). RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    /// Only errors.
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    quiet: bool,
    /// Change a setting of the config file without editing it (`run`, `train`, `validate`):
    /// `--set trainer.optimizer.lr=0.03`, `--set 'stages[0].seed=3'`; the value is YAML.
    /// Repeatable; checked like the file's own settings.
    #[arg(long = "set", value_name = "PATH=VALUE", global = true, value_parser = overrides::parse_override)]
    set: Vec<(String, String)>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum ProgressMode {
    /// A bar when stderr is a terminal.
    Auto,
    /// Never.
    Never,
}

/// Observability options of `run` and `train`.
#[derive(Debug, Clone, clap::Args)]
struct Observe {
    /// Serve Prometheus/OpenMetrics metrics at http://ADDR/metrics while running (e.g.
    /// `127.0.0.1:9898`; under mpirun rank r uses port + r). See docs/metrics.md.
    #[arg(long, value_name = "ADDR")]
    metrics_addr: Option<std::net::SocketAddr>,
    /// Where the run report goes (report.json, report.html, plots).
    /// [default: sluice-report/<config name>-<run|train>]
    #[arg(long, value_name = "DIR")]
    report: Option<PathBuf>,
    /// Write no run report.
    #[arg(long, conflicts_with = "report")]
    no_report: bool,
    /// Write TensorBoard event files to DIR: `run`, the pipeline's rows/s each second;
    /// `train`, as `trainer.tensorboard: DIR`.
    #[arg(long, value_name = "DIR")]
    tensorboard: Option<PathBuf>,
}

impl Observe {
    /// The report directory of `command` (`run`, `train`), unless reports are off.
    fn report_dir(&self, config: &Path, command: &str) -> Option<PathBuf> {
        if self.no_report {
            return None;
        }
        Some(self.report.clone().unwrap_or_else(|| {
            let stem = config
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "sluice".into());
            Path::new("sluice-report").join(format!("{stem}-{command}"))
        }))
    }
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a pipeline file to its sink and print a summary.
    Run {
        /// The pipeline YAML file.
        config: PathBuf,
        /// Progress bar on stderr.
        #[arg(long, value_enum, default_value = "auto")]
        progress: ProgressMode,
        /// Also write the run summary as JSON to this file.
        #[arg(long)]
        summary_json: Option<PathBuf>,
        /// Continue from the `checkpoint:` file if it exists (start fresh if not). Without
        /// it, an existing checkpoint is an error.
        #[arg(long)]
        resume: bool,
        #[command(flatten)]
        observe: Observe,
    },
    /// Train the `trainer:` model on the pipeline's batches (`loader:` says which columns
    /// become which tensors) with data-parallel workers, and print a summary.
    #[cfg(feature = "torch")]
    Train {
        /// The pipeline YAML file, with `loader:` and `trainer:` sections.
        config: PathBuf,
        /// Progress bar on stderr.
        #[arg(long, value_enum, default_value = "auto")]
        progress: ProgressMode,
        /// Also write the summary as JSON to this file.
        #[arg(long)]
        summary_json: Option<PathBuf>,
        /// End with one JSON line on stdout — `{"step", "loss", "eval_loss", "eval_accuracy",
        /// "rows_trained", "interrupted"}` — for a tuner to read (with `-q`, the only line).
        #[arg(long)]
        metric_json: bool,
        /// Continue from `trainer.checkpoint` if it exists (start fresh if not). Without it,
        /// an existing checkpoint is an error.
        #[arg(long)]
        resume: bool,
        /// With --resume, a checkpoint written by another number of workers (a node lost,
        /// or added) continues on this run's workers: the batches the old workers still owed
        /// of the interrupted epoch are dealt out to the new ones, each trained once; where
        /// they cannot be counted ahead (e.g. a shuffle across ranks), the rest of that epoch
        /// is passed over and the summary says how many rows and why. Without it such a
        /// checkpoint is refused. Parquet sources only.
        #[arg(long, requires = "resume")]
        elastic: bool,
        /// Override `trainer.allreduce.workers` (local backend).
        #[arg(long)]
        workers: Option<usize>,
        /// Override `trainer.allreduce.backend`: `mpi` under `mpirun -np N` (needs a build
        /// with `--features mpi`).
        #[arg(long)]
        backend: Option<String>,
        #[command(flatten)]
        observe: Observe,
    },
    /// Train (this build leaves out the `torch` feature, so it refuses, naming the feature).
    #[cfg(not(feature = "torch"))]
    Train {
        /// Whatever was given: the refusal comes first.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Hyperparameter search over a training job: trials as `sluice train` processes with
    /// `--set` overrides drawn from a space file, weak ones stopped early (`asha`), resumable.
    #[cfg(feature = "torch")]
    Sweep(sweep::SweepArgs),
    /// Sweep (this build leaves out the `torch` feature, so it refuses, naming the feature).
    #[cfg(not(feature = "torch"))]
    Sweep {
        /// Whatever was given: the refusal comes first.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Print the Kubernetes manifests that run a training job on N ranks under MPI (Kubeflow
    /// Trainer's TrainJob, or the MPI Operator's MPIJob), for `kubectl apply -f -`.
    #[cfg(feature = "torch")]
    K8s(k8s::K8sArgs),
    /// K8s (this build leaves out the `torch` feature, so it refuses, naming the feature).
    #[cfg(not(feature = "torch"))]
    K8s {
        /// Whatever was given: the refusal comes first.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Benchmark a standard workload (`images` or `tabular`) against the raw Parquet decode
    /// and, with a Python that has them, numpy and the PyTorch DataLoader on the same data.
    Bench(bench::BenchArgs),
    /// One variant of `sluice bench` (run by it in a child process).
    #[command(hide = true)]
    BenchChild {
        data: PathBuf,
        #[arg(value_enum)]
        workload: bench::Workload,
        variant: String,
        threads: usize,
    },
    /// Check pipeline files: every config problem with file:line:column, then (unless
    /// --no-data) the source's files and the schema through every stage.
    Validate {
        /// Pipeline YAML files.
        #[arg(required = true)]
        configs: Vec<PathBuf>,
        /// Only check the YAML; do not open the source.
        #[arg(long)]
        no_data: bool,
    },
    /// Show schema, row count, row groups and first rows of Parquet files (paths or globs).
    Inspect {
        /// Paths, directories or globs.
        #[arg(required = true)]
        paths: Vec<String>,
        /// Rows to print per file.
        #[arg(long, short = 'n', default_value_t = 5)]
        rows: usize,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let level = match (cli.quiet, cli.verbose) {
        (true, _) => "error",
        (_, 0) => "warn",
        (_, 1) => "info",
        (_, 2) => "debug",
        _ => "trace",
    };
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| {
            // The TLS verifier logs each refused certificate as an error, once per retry;
            // the store's error that ends the run names it (see `certificate_error`).
            EnvFilter::new(format!("{level},rustls_platform_verifier=off"))
        }))
        .with_writer(std::io::stderr)
        // Colour codes only for a terminal: a log file or a CI log gets plain text.
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    // Before any thread or work: training may restart the process with OpenMP's threads set
    // to sleep (only `train` runs libtorch's threads; a restart reloads libtorch, ~0.2 s).
    #[cfg(feature = "torch")]
    if matches!(cli.command, Command::Train { .. }) {
        openmp::passive_or_reexec();
    }
    if let Err(e) = signals::configure_from_env() {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("sluice-io")
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let overrides = cli.set;
    let code = runtime.block_on(async move {
        match cli.command {
            Command::Run {
                config,
                progress,
                summary_json,
                resume,
                observe,
            } => {
                run(
                    (&config, &overrides),
                    progress,
                    summary_json.as_deref(),
                    resume,
                    &observe,
                    cli.quiet,
                )
                .await
            }
            #[cfg(feature = "torch")]
            Command::Train {
                config,
                progress,
                summary_json,
                metric_json,
                resume,
                elastic,
                workers,
                backend,
                observe,
            } => {
                train::train(
                    (&config, &overrides),
                    progress,
                    (summary_json.as_deref(), metric_json),
                    (resume, elastic),
                    (workers, backend),
                    &observe,
                    cli.quiet,
                )
                .await
            }
            // On this (the main) thread: its trials die with the thread that started them.
            #[cfg(feature = "torch")]
            Command::Sweep(args) => sweep::sweep(&args),
            #[cfg(feature = "torch")]
            Command::K8s(args) => k8s::k8s(&args, &overrides),
            #[cfg(not(feature = "torch"))]
            Command::Train { .. } | Command::Sweep { .. } | Command::K8s { .. } => {
                let what = "`sluice train`, `sweep` and `k8s` (libtorch)";
                eprintln!("error: {}", sluice::pipeline::feature_off(what, "torch"));
                ExitCode::FAILURE
            }
            Command::Bench(args) => tokio::task::spawn_blocking(move || bench::bench(&args))
                .await
                .unwrap_or(ExitCode::FAILURE),
            Command::BenchChild {
                data,
                workload,
                variant,
                threads,
            } => bench::child(&data, workload, &variant, threads).await,
            Command::Validate { configs, no_data } => validate(&configs, &overrides, no_data).await,
            Command::Inspect { paths, rows } => inspect(&paths, rows).await,
        }
    });
    // Do not wait for background I/O of an aborted run.
    runtime.shutdown_timeout(Duration::from_secs(1));
    if output::stdout_failed() {
        return ExitCode::FAILURE;
    }
    code
}

mod bench;
#[cfg(feature = "torch")]
mod train;

/// Interval of the report's throughput samples (doubles on long runs; the series is bounded).
const SAMPLE_EVERY: Duration = Duration::from_millis(200);

/// Starts the metrics endpoint (when asked) and the sampler for the report. `rank` offsets
/// the port (one endpoint per process under mpirun).
async fn start_observing(
    observe: &Observe,
    observed: &Arc<Observed>,
    rank: usize,
) -> Result<Vec<tokio::task::JoinHandle<()>>, ExitCode> {
    let mut tasks = Vec::new();
    if let Some(mut addr) = observe.metrics_addr {
        if addr.port() != 0 {
            addr.set_port(addr.port().saturating_add(rank as u16));
        }
        match serve_metrics(addr, observed.clone()).await {
            Ok((bound, task)) => {
                tracing::info!("metrics at http://{bound}/metrics");
                tasks.push(task);
            }
            Err(e) => {
                eprintln!(
                    "error: --metrics-addr {addr}: cannot listen there: {e} (choose a free port, or 127.0.0.1:0 for any)"
                );
                return Err(ExitCode::from(2));
            }
        }
    }
    Ok(tasks)
}

/// Checks, before any work, that what `--summary-json` and `--report` name can be written,
/// so that a run is not done only to fail at the end. A flag that cannot be honoured is a
/// usage error: exit code 2. (The default report directory is not checked: a report that
/// cannot be written there is a warning.)
async fn run(
    (config, overrides): (&Path, &[(String, String)]),
    progress: ProgressMode,
    summary_json: Option<&Path>,
    resume: bool,
    observe: &Observe,
    quiet: bool,
) -> ExitCode {
    if let Err(code) = check_output_flags(summary_json, observe) {
        return code;
    }
    let interrupt = interrupt_signal().shared();
    let loaded = match overrides::config_document(config, overrides) {
        Ok(doc) => Job::from_document(&doc),
        Err(e) => Err(JobError::from(e)),
    };
    let job = match loaded {
        Ok(j) => j,
        Err(e) => {
            print_error(&e);
            return ExitCode::FAILURE;
        }
    };
    let prepared = tokio::select! {
        p = job.prepare_resuming(resume) => p,
        _ = interrupt.clone() => Err(JobError::Interrupted),
    };
    let prepared = match prepared {
        Ok(p) => p,
        Err(e) => return fail(&e),
    };
    let observed = Arc::new(Observed::default());
    observed.add_pipeline(0, prepared.metrics());
    let mut background = match start_observing(observe, &observed, 0).await {
        Ok(t) => t,
        Err(code) => return code,
    };
    let (sampler, sampling) = Sampler::start(observed.clone(), SAMPLE_EVERY);
    background.push(sampling);
    let events = match observe
        .tensorboard
        .as_deref()
        .map(events::PipelineEvents::create)
    {
        Some(Ok(e)) => Some(Arc::new(std::sync::Mutex::new(e))),
        Some(Err(e)) => {
            eprintln!("error: --tensorboard: {e}");
            return ExitCode::from(2);
        }
        None => None,
    };
    background.extend(events.clone().map(|e| events::spawn(e, observed.clone())));
    let bar = progress_bar(progress, prepared.source_rows());
    let ticker = bar.clone().map(|bar| {
        let metrics = prepared.metrics();
        tokio::spawn(async move { tick(bar, metrics).await })
    });
    let result = prepared.run(interrupt).await;
    if let Some(t) = ticker {
        t.abort();
    }
    for t in background {
        t.abort();
    }
    if let Some(e) = &events
        && let Ok(mut e) = e.lock()
        && let Err(err) = e.write(&observed)
    {
        tracing::warn!("--tensorboard: {err}");
    }
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    if let Some(dir) = observe.report_dir(config, "run") {
        sampler.sample(&observed);
        let (samples, names) = sampler.series();
        let summary = match &result {
            Ok(report) => serde_json::to_value(report).unwrap_or_default(),
            Err(e) => serde_json::json!({ "error": e.to_string() }),
        };
        let r = Report::build("run", config, &observed, &samples, &names, None, summary);
        write_report(&dir, &r);
    }
    match result {
        Ok(report) => {
            if !quiet {
                print_summary(config, &report);
            }
            if let Some(path) = summary_json {
                let text = serde_json::to_string_pretty(&report).unwrap_or_default();
                if let Err(e) = std::fs::write(path, text) {
                    eprintln!("error: cannot write {}: {e}", path.display());
                    return ExitCode::FAILURE;
                }
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e),
    }
}

fn fail(e: &JobError) -> ExitCode {
    print_error(e);
    if matches!(
        e,
        JobError::Interrupted | JobError::InterruptedAtCheckpoint(_)
    ) {
        ExitCode::from(signals::INTERRUPTED)
    } else {
        ExitCode::FAILURE
    }
}

fn progress_bar(mode: ProgressMode, total: Option<u64>) -> Option<ProgressBar> {
    if matches!(mode, ProgressMode::Never) || !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = ProgressBar::with_draw_target(total, ProgressDrawTarget::stderr());
    let style = ProgressStyle::with_template(
        "{spinner} [{elapsed_precise}] {bar:40} {human_pos}/{human_len} rows  {per_sec}  {msg}",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    Some(bar)
}

async fn tick(bar: ProgressBar, metrics: std::sync::Arc<PipelineMetrics>) {
    let mut every = tokio::time::interval(Duration::from_millis(100));
    loop {
        every.tick().await;
        bar.set_position(PipelineMetrics::get(&metrics.source.rows));
        let expected = PipelineMetrics::get(&metrics.source.rows_expected);
        if expected > 0 && bar.length() != Some(expected) {
            bar.set_length(expected);
        }
        let mb = PipelineMetrics::get(&metrics.source.bytes_decoded) as f64 / 1e6;
        let secs = bar.elapsed().as_secs_f64().max(1e-3);
        bar.set_message(format!("{:.1} MB/s", mb / secs));
    }
}

fn print_summary(config: &Path, r: &RunReport) {
    if let Some(done) = r.resumed.as_ref().filter(|d| d.already_complete) {
        out!("sluice run {}: already complete", config.display());
        out!(
            "  checkpoint {} records a finished run: {} rows written; nothing was read or written now",
            done.checkpoint,
            done.rows_before
        );
        out!(
            "  to go on, raise the source's `epochs` and resume again (the added epochs come out as an uninterrupted longer run's would); to start over, delete the checkpoint and the output"
        );
        return;
    }
    out!("sluice run {}: ok", config.display());
    if let Some(res) = &r.resumed {
        let reread = match res.rows_reread {
            0 => String::new(),
            n => format!(
                "; {n} rows read again to rebuild the position (delivered before, not written again)"
            ),
        };
        out!(
            "  resumed  from {}: {} rows written before this run, {} in all{reread}",
            res.checkpoint,
            res.rows_before,
            res.rows_before + r.rows_written
        );
    }
    print_source(r);
    if r.records_dead_lettered > 0 {
        // Undecodable records of the source and rows stages removed into their dead letters.
        out!(
            "  dead     {} record(s) dead-lettered",
            r.records_dead_lettered
        );
    }
    if let Some(n) = &r.shard {
        out!("  shard    {n}");
    }
    for m in &r.mix {
        out!(
            "  mix      {}: {} of its {} rows each epoch",
            m.path,
            m.per_epoch,
            m.rows
        );
    }
    print_stages(r);
    out!(
        "  sink     {}: {} rows in {} batches, {:.2} MB{}",
        r.sink,
        r.rows_written,
        r.batches_written,
        r.bytes_written as f64 / 1e6,
        r.output
            .as_ref()
            .map(|o| format!(" -> {o}"))
            .unwrap_or_default()
    );
    if let Some(ready) = r.consumer_readiness {
        out!(
            "  ready    {:.1}% of batches were waiting when the sink asked (per queue: {})",
            100.0 * ready,
            r.queue_readiness
                .iter()
                .map(|q| format!(
                    "{} {:.1}%",
                    sluice::observe::short_name(&q.queue),
                    100.0 * q.ready
                ))
                .collect::<Vec<_>>()
                .join(" · ")
        );
    }
    out!(
        "  elapsed  {:.3} s: {:.0} rows/s, {:.1} MB/s (decoded Arrow bytes){}",
        r.elapsed_seconds,
        r.rows_per_second,
        r.mb_per_second,
        r.peak_rss_bytes
            .map(|b| format!("; peak RSS {:.0} MiB", sluice::mib(b)))
            .unwrap_or_default()
    );
    if let (Some(cpu), Some(share)) = (r.cpu_seconds, r.host_cpu_share) {
        out!(
            "  cpu      {cpu:.2} CPU-s (user + system): {:.0}% of the host's {} core(s) over the process's life{}",
            100.0 * share,
            std::thread::available_parallelism().map_or(1, |n| n.get()),
            r.pool_busy_fraction
                .map(|f| format!("; the CPU pool was {:.0}% busy", 100.0 * f))
                .unwrap_or_default()
        );
    }
}

/// The summary's source lines: what was read and, for Kafka, each partition's numbers.
fn print_source(r: &RunReport) {
    if r.partitions.is_empty() {
        out!(
            "  source   {} file(s), {} row group(s), {} rows read ({:.2} MB compressed, {:.2} MB decoded)",
            r.files,
            r.row_groups,
            r.rows_read,
            r.bytes_read as f64 / 1e6,
            r.bytes_decoded as f64 / 1e6
        );
    } else {
        out!(
            "  source   kafka: {} rows read ({:.2} MB of messages, {:.2} MB decoded)",
            r.rows_read,
            r.bytes_read as f64 / 1e6,
            r.bytes_decoded as f64 / 1e6
        );
    }
    if !r.partitions.is_empty() {
        out!(
            "  kafka    {} partition(s); {} record(s) could not be decoded",
            r.partitions.len(),
            r.records_bad
        );
        for (name, p) in &r.partitions {
            let lag = if p.lag >= 0 {
                p.lag.to_string()
            } else {
                "unknown".into()
            };
            out!(
                "      {name}: {} records ({:.0}/s), {} bad, lag {lag}",
                p.records,
                p.records_per_second,
                p.bad
            );
        }
    }
}

/// The summary's stage lines: rows in and out, what was removed or replayed, and notes.
fn print_stages(r: &RunReport) {
    for s in &r.stages {
        let mut removed = if s.rows_removed > 0 {
            format!(", {} {}", s.rows_removed, s.removed_as)
        } else {
            String::new()
        };
        if s.rows_replayed > 0 {
            removed += &format!(
                ", {} delivered before the checkpoint (the window rebuilt)",
                s.rows_replayed
            );
        }
        out!(
            "  {}: {} rows in, {} out{removed}",
            s.name,
            s.rows_in,
            s.rows_out
        );
        for n in &s.notes {
            out!("      {n}");
        }
    }
}
