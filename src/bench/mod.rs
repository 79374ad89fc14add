//! `sluice bench images|tabular`: a standard workload end to end, in the same run as the raw
//! Parquet decode of the same files (the ceiling) and, when a Python with the packages is
//! found, the same Sluice pipeline consumed from Python as torch tensors (the `sluice`
//! package), a vectorised numpy loader (numpy, pyarrow) and the idiomatic PyTorch
//! `DataLoader` (torch) on identical data and work.
//!
//! Each variant runs in a child process (this binary, `sluice bench-child`, or the Python
//! script) so that its peak RSS and CPU time are its own; the best of `--repeat` runs counts,
//! the runs going in rounds (every variant once per round) so a drift in the machine's speed
//! reaches every variant alike, and each run is also divided by the raw run of its own round
//! (the paired ratios under the table, [`rounds`]).

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use serde::Serialize;
use sluice::report::Bottleneck;

mod ceiling;
mod child;
mod rounds;
mod workload;

use child::Measured;
pub(crate) use child::child;
pub(crate) use workload::Workload;
use workload::{Layout, generate, yaml};

/// Options of `sluice bench`.
#[derive(Debug, clap::Args)]
pub(crate) struct BenchArgs {
    /// The workload.
    #[arg(value_enum)]
    workload: Workload,
    /// Rows to generate [default: 200000 images, 2000000 tabular].
    #[arg(long)]
    rows: Option<usize>,
    /// How the generated files are laid out: `compressed` (zstd, a few large row groups, as
    /// pyarrow or Spark write datasets) or `uncompressed` (PLAIN, no compression: the decode
    /// is a memory copy).
    #[arg(long, value_enum, default_value_t = Layout::Compressed)]
    layout: Layout,
    /// Runs per variant, in rounds (every variant once per round); the best counts in the
    /// table, and with 2 or more each run is also divided by the raw run of its own round
    /// (the median and range of these paired ratios are printed under the table).
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Sluice's CPU threads (`runtime.threads`).
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Python for the peers: numpy + pyarrow for the numpy peer, torch too for the DataLoader
    /// [default: $SLUICE_BENCH_PYTHON, else python3]. A peer whose packages are missing is
    /// skipped with the reason; `none` skips both.
    #[arg(long)]
    python: Option<String>,
    /// Also write the results as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Leave out a variant (`raw`, `source`, `sluice`, `global`, `python`, `uint8`, `float16`,
    /// `floor`, `dataloader`, `numpy`); may be given more than once. Its row says it was skipped.
    #[arg(long = "skip", value_name = "VARIANT")]
    skip: Vec<String>,
    /// Keep the generated dataset in DIR (reused when it already holds this workload's
    /// files for the same row count) instead of a temporary directory.
    #[arg(long)]
    data: Option<PathBuf>,
}

/// One row of the table.
#[derive(Debug, Serialize)]
struct Row {
    variant: &'static str,
    description: &'static str,
    measured: Option<Measured>,
    /// Why it did not run.
    skipped: Option<String>,
    samples_per_second: Option<f64>,
    mb_per_second: Option<f64>,
    /// CPU time (user + system, all its threads and worker processes) per 1,000 samples.
    cpu_seconds_per_1k: Option<f64>,
    /// Samples per CPU-second (user + system): what the work costs, whatever the threads.
    samples_per_cpu_second: Option<f64>,
    /// Throughput relative to the raw decode.
    vs_raw: Option<f64>,
    /// Samples per CPU-second relative to the raw decode's.
    vs_raw_per_cpu: Option<f64>,
    /// Each run against the raw run of its own round (`--repeat` ≥ 2).
    paired: Option<rounds::Paired>,
}

#[derive(Debug, Serialize)]
struct Results {
    workload: Workload,
    layout: Layout,
    rows: usize,
    threads: usize,
    cores: usize,
    variants: Vec<Row>,
    /// Sluice ÷ DataLoader throughput.
    sluice_vs_dataloader: Option<f64>,
    /// Sluice from Python ÷ Sluice in Rust throughput.
    python_vs_sluice: Option<f64>,
    /// Sluice from Python ÷ DataLoader throughput.
    python_vs_dataloader: Option<f64>,
    /// How the `sluice` package's native module was compiled (`debug`: its row says nothing).
    python_package_build: Option<String>,
    bottleneck: Option<Bottleneck>,
}

/// The Python the peers run with, and why a peer cannot run there (`None`: it can).
#[derive(Debug)]
struct Peers {
    python: String,
    numpy: Option<String>,
    dataloader: Option<String>,
    /// The `sluice` Python package (and torch) for the "Sluice from Python" variant.
    sluice: Option<String>,
    /// How that package's native module was compiled (`debug`, `release`), when it says.
    sluice_build: Option<String>,
}

impl Peers {
    fn find(args: &BenchArgs) -> Self {
        let python = match args.python.as_deref() {
            Some(p) => p.to_string(),
            None => std::env::var("SLUICE_BENCH_PYTHON").unwrap_or_else(|_| "python3".into()),
        };
        if python == "none" {
            let why = Some("--python none".to_string());
            return Self {
                python,
                numpy: why.clone(),
                dataloader: why.clone(),
                sluice: why,
                sluice_build: None,
            };
        }
        let imports = |modules: &str| {
            Command::new(&python)
                .args(["-c", &format!("import {modules}")])
                .output()
                .map(|o| o.status.success())
                .unwrap_or(false)
        };
        let numpy = (!imports("numpy, pyarrow")).then(|| {
            format!("{python} cannot import numpy and pyarrow (scripts/python-peers.sh installs them; pass --python)")
        });
        let dataloader = if numpy.is_some() {
            numpy.clone()
        } else {
            (!imports("torch")).then(|| {
                format!("{python} cannot import torch (scripts/python-peers.sh --with-torch installs it, ~2.7 GB; pass --python)")
            })
        };
        let sluice = if dataloader.is_some() {
            dataloader.clone()
        } else {
            (!imports("sluice")).then(|| {
                format!("{python} cannot import sluice (scripts/python.sh --build installs the package into target/services/venv-python; pass --python)")
            })
        };
        let sluice_build = sluice
            .is_none()
            .then(|| {
                let out = Command::new(&python)
                    .args([
                        "-c",
                        "import sluice._sluice as s; print(s.__build_profile__)",
                    ])
                    .output()
                    .ok()?;
                let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
                (out.status.success() && !text.is_empty()).then_some(text)
            })
            .flatten();
        Self {
            python,
            numpy,
            dataloader,
            sluice,
            sluice_build,
        }
    }

    /// Why `variant` (a Python peer) cannot run, if it cannot.
    fn missing(&self, variant: &str) -> Option<&String> {
        match variant {
            "numpy" => self.numpy.as_ref(),
            "dataloader" => self.dataloader.as_ref(),
            "python" => self.sluice.as_ref(),
            _ => None,
        }
    }
}

fn run_child(mut cmd: Command) -> Result<Measured, String> {
    let out = cmd.output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().unwrap_or_default();
    serde_json::from_str(line).map_err(|e| format!("{e}: {line}"))
}

/// The variants, in table order, each with what it does.
fn variants(w: Workload) -> [(&'static str, &'static str); 10] {
    let desc = match w {
        Workload::Images => "shuffle 10k + crop/flip/normalize + batch 256 → tensors",
        Workload::Tabular => "shuffle 100k + standardize + noise + batch 1024 → tensors",
    };
    [
        (
            "raw",
            "arrow-rs's Parquet reader alone, row groups across the threads (the ceiling)",
        ),
        ("source", "Sluice's Parquet source alone, no stages"),
        ("sluice", desc),
        (
            "global",
            "the same with `shuffle: {mode: global}` (no window; blocks of 256 MiB read by random access)",
        ),
        (
            "python",
            "the same, from Python: batches → torch tensors (DLPack)",
        ),
        (
            "uint8",
            "the same to uint8 tensors, normalize left to the device (DALI's split)",
        ),
        (
            "float16",
            "the same to float16 tensors, normalized here (half float32's bytes)",
        ),
        (
            "floor",
            "decode + one float32 write per value, nothing else",
        ),
        (
            "dataloader",
            "PyTorch DataLoader, num_workers=2, per-sample",
        ),
        ("numpy", "numpy, vectorised per batch, 1 process"),
    ]
}

/// Why `variant` is not run by choice: `--skip`, or a variant of the other workload.
fn left_out(args: &BenchArgs, variant: &str) -> Option<&'static str> {
    if args.skip.iter().any(|v| v == variant) {
        Some("--skip")
    } else if matches!(variant, "uint8" | "float16") && args.workload == Workload::Tabular {
        Some("images only")
    } else {
        None
    }
}

/// Where a bench's child processes and files are.
struct Children<'a> {
    peers: &'a Peers,
    script: &'a Path,
    exe: &'a Path,
    data: &'a Path,
    config: &'a Path,
}

impl Children<'_> {
    /// The command that runs `variant` once: `peers.py` for the Python ones, `sluice
    /// bench-child` for the rest.
    fn command(&self, args: &BenchArgs, variant: &str) -> Command {
        let w = args.workload;
        if matches!(variant, "dataloader" | "numpy" | "python") {
            let mut c = Command::new(&self.peers.python);
            c.arg(self.script)
                .args(["--data", &self.data.display().to_string()])
                .args(["--workload", w.name(), "--variant", variant])
                .args(["--batch", &w.batch().to_string()])
                .args(["--buffer-rows", &w.buffer_rows().to_string()])
                .args(["--config", &self.config.display().to_string()]);
            c
        } else {
            let mut c = Command::new(self.exe);
            c.arg("bench-child").arg(self.data).args([
                w.name(),
                variant,
                &args.threads.to_string(),
            ]);
            c
        }
    }
}

/// Runs each variant `--repeat` times and makes the table's rows, each from the variant's
/// fastest run (a peer that cannot run, a failed run or a wrong row count skips it). The runs
/// go in rounds — every variant once per round, in table order — so that a drift in the
/// machine's speed over the minutes a bench takes (a VM's neighbours, its host's clock)
/// reaches every variant alike, not only the ones measured last.
fn measure_variants(args: &BenchArgs, rows: usize, children: &Children<'_>) -> Vec<Row> {
    let w = args.workload;
    let list = variants(w);
    // `runs[i][r]`: variant `i`'s run in round `r`.
    let mut runs: Vec<Vec<Option<Measured>>> = vec![Vec::new(); list.len()];
    let mut skipped: Vec<Option<String>> = list
        .iter()
        .map(|(v, _)| {
            (left_out(args, v).map(str::to_string)).or_else(|| children.peers.missing(v).cloned())
        })
        .collect();
    for _ in 0..args.repeat.max(1) {
        for (i, (variant, _)) in list.iter().enumerate() {
            let run = match skipped[i] {
                Some(_) => None,
                None => match run_child(children.command(args, variant)) {
                    Ok(m) if m.rows != rows => {
                        skipped[i] = Some(format!("delivered {} rows, not {rows}", m.rows));
                        None
                    }
                    Ok(m) => Some(m),
                    Err(e) => {
                        skipped[i] = Some(format!("failed: {e}"));
                        None
                    }
                },
            };
            runs[i].push(run);
        }
    }
    let raw = runs.first().cloned().unwrap_or_default();
    list.into_iter()
        .zip(runs.into_iter().zip(skipped))
        .map(|((variant, description), (runs, skipped))| {
            let paired = (runs.len() > 1 && skipped.is_none())
                .then(|| rounds::paired(&raw, &runs))
                .flatten();
            let best = (runs.into_iter().flatten())
                .min_by(|a, b| a.seconds.total_cmp(&b.seconds))
                .filter(|_| skipped.is_none());
            let rate = best.as_ref().map(|m| m.rows as f64 / m.seconds.max(1e-9));
            let cpu = best
                .as_ref()
                .and_then(|m| Some(m.cpu_seconds? * 1000.0 / m.rows.max(1) as f64));
            Row {
                variant,
                description,
                measured: best,
                skipped,
                samples_per_second: rate,
                mb_per_second: rate.map(|r| r * w.row_bytes() as f64 / 1e6),
                cpu_seconds_per_1k: cpu,
                samples_per_cpu_second: cpu.filter(|c| *c > 0.0).map(|c| 1000.0 / c),
                vs_raw: None,
                vs_raw_per_cpu: None,
                paired,
            }
        })
        .collect()
}

/// Each row's rates as ratios to the first row's, the raw decode's (the ceiling).
fn against_raw(table: &mut [Row]) {
    let Some(first) = table.first() else { return };
    let (raw, raw_cpu) = (first.samples_per_second, first.samples_per_cpu_second);
    let over = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    };
    for r in table {
        r.vs_raw = over(r.samples_per_second, raw);
        r.vs_raw_per_cpu = over(r.samples_per_cpu_second, raw_cpu);
    }
}

/// Prints the results table: a header, then each variant's numbers or why it was skipped.
fn print_table(table: &[Row]) {
    out!(
        "{:<11} {:<58} {:>11} {:>9} {:>11} {:>10} {:>10} {:>7} {:>8}",
        "variant",
        "work",
        "samples/s",
        "MB/s",
        "per CPU-s",
        "peak RSS",
        "at start",
        "vs raw",
        "per CPU"
    );
    for r in table {
        match (&r.measured, &r.skipped) {
            (Some(m), _) => out!(
                "{:<11} {:<58} {:>11.0} {:>9.1} {:>11.0} {:>6.0} MiB {:>6.0} MiB {:>6.2}× {:>7.2}×",
                r.variant,
                r.description,
                r.samples_per_second.unwrap_or(0.0),
                r.mb_per_second.unwrap_or(0.0),
                r.samples_per_cpu_second.unwrap_or(f64::NAN),
                m.peak_rss_mib,
                m.start_rss_mib.unwrap_or(f64::NAN),
                r.vs_raw.unwrap_or(f64::NAN),
                r.vs_raw_per_cpu.unwrap_or(f64::NAN)
            ),
            (None, why) => out!(
                "{:<11} {:<58} skipped: {}",
                r.variant,
                r.description,
                why.as_deref().unwrap_or("?")
            ),
        }
    }
}

/// Under the table, each variant's ratios paired round by round with the raw decode's (see
/// [`rounds`]), when the bench ran more than one round.
fn print_paired(table: &[Row]) {
    let rows: Vec<(&Row, &rounds::Paired)> = (table.iter().skip(1))
        .filter_map(|r| Some((r, r.paired.as_ref()?)))
        .collect();
    let Some((_, first)) = rows.first() else {
        return;
    };
    out!(
        "vs raw, each run against the raw run of its round (median, lowest–highest of {} rounds):",
        first.rounds
    );
    for (r, p) in rows {
        let cpu = p
            .per_cpu_median
            .map_or(String::new(), |c| format!(", per CPU-s {c:.2}×"));
        out!(
            "  {:<11} {:.2}× ({:.2}–{:.2}){cpu}",
            r.variant,
            p.median,
            p.min,
            p.max
        );
    }
}

/// Under the table, for the `sluice` row: libtorch's share of its peak RSS and the bottleneck
/// (returned for the JSON results).
fn print_sluice_footer(table: &[Row]) -> Option<Bottleneck> {
    let sluice = (table.iter().find(|r| r.variant == "sluice")).and_then(|r| r.measured.as_ref());
    if let Some(m) = sluice
        && let Some(lib) = m.libtorch_rss_mib.filter(|t| *t > 0.0)
    {
        out!(
            "libtorch's libraries: {lib:.0} MiB of the `sluice` row's peak RSS, {:.0} MiB without them (their pages mapped in, /proc/self/smaps)",
            m.peak_rss_mib - lib
        );
    }
    let bottleneck = sluice.and_then(|m| m.bottleneck.clone());
    if let Some(b) = &bottleneck {
        out!("bottleneck: {} — {}", b.element, b.evidence);
        out!("  knob: {}", b.suggestion);
    }
    bottleneck
}

/// `sluice bench`.
pub(crate) fn bench(args: &BenchArgs) -> ExitCode {
    let w = args.workload;
    let rows = args.rows.unwrap_or(w.default_rows());
    let dir = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: cannot create a temporary directory: {e}");
            return ExitCode::FAILURE;
        }
    };
    let data = args.data.clone().unwrap_or_else(|| dir.path().join("data"));
    let stamp = data.join(".sluice-bench");
    let (files, groups, per_group) = args.layout.shape(w, rows);
    let wanted = format!(
        "{} {rows} {} {files}x{groups}x{per_group} {}",
        w.name(),
        args.layout.name(),
        workload::IMAGES
    );
    let generated = if std::fs::read_to_string(&stamp).is_ok_and(|s| s == wanted) {
        Ok(())
    } else {
        std::fs::create_dir_all(&data)
            .and_then(|()| generate(&data, w, rows, args.layout))
            .and_then(|()| std::fs::write(&stamp, &wanted))
    };
    if let Err(e) = generated {
        eprintln!("error: generating the dataset in {}: {e}", data.display());
        return ExitCode::FAILURE;
    }
    let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("sluice"));
    let peers = Peers::find(args);
    let script = dir.path().join("peers.py");
    // The "Sluice from Python" variant runs the `sluice` variant's own pipeline.
    let config = dir.path().join("sluice.yaml");
    let written = std::fs::write(&script, include_str!("../../benches/python/peers.py"))
        .and_then(|()| std::fs::write(&config, yaml(&data, w, "sluice", args.threads)));
    if let Err(e) = written {
        eprintln!(
            "error: cannot write the bench's files in {}: {e}",
            dir.path().display()
        );
        return ExitCode::FAILURE;
    }
    out!(
        "sluice bench {}: {rows} rows ({:.0} MB, {}), {} Sluice threads, {} cores, best of {}",
        w.name(),
        (rows * w.row_bytes()) as f64 / 1e6,
        args.layout.name(),
        args.threads,
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        args.repeat.max(1)
    );
    let children = Children {
        peers: &peers,
        script: &script,
        exe: &exe,
        data: &data,
        config: &config,
    };
    let mut table = measure_variants(args, rows, &children);
    against_raw(&mut table);
    print_table(&table);
    print_paired(&table);
    let ratio = |a: &str, b: &str| {
        let rate = |v: &str| table.iter().find(|r| r.variant == v)?.samples_per_second;
        match (rate(a), rate(b)) {
            (Some(a), Some(b)) if b > 0.0 => Some(a / b),
            _ => None,
        }
    };
    let sluice_vs_dl = ratio("sluice", "dataloader");
    let python_vs_sluice = ratio("python", "sluice");
    let python_vs_dl = ratio("python", "dataloader");
    if let Some(x) = sluice_vs_dl {
        out!("sluice vs PyTorch DataLoader: {x:.1}×");
    }
    if let Some(x) = python_vs_sluice {
        let build = match peers.sluice_build.as_deref() {
            Some("debug") => {
                " (a debug build of the sluice package: not comparable; `SLUICE_WHEEL_PROFILE=release scripts/python.sh --build` installs a release one)"
            }
            _ => "",
        };
        out!("Sluice from Python vs Sluice in Rust: {x:.2}×{build}");
    }
    if let Some(x) = python_vs_dl {
        out!("Sluice from Python vs PyTorch DataLoader: {x:.1}×");
    }
    let bottleneck = print_sluice_footer(&table);
    let results = Results {
        workload: w,
        layout: args.layout,
        rows,
        threads: args.threads,
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        variants: table,
        sluice_vs_dataloader: sluice_vs_dl,
        python_vs_sluice,
        python_vs_dataloader: python_vs_dl,
        python_package_build: peers.sluice_build.clone(),
        bottleneck,
    };
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&results).unwrap_or_default();
        if let Err(e) = std::fs::write(path, text) {
            eprintln!("error: cannot write {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    exit_code(&results.variants, &peers, args)
}

/// A peer may be missing (no Python with torch) and a variant left out; a variant that ran
/// and failed is an error.
fn exit_code(variants: &[Row], peers: &Peers, args: &BenchArgs) -> ExitCode {
    let failed = variants.iter().any(|r| {
        r.measured.is_none()
            && peers.missing(r.variant).is_none()
            && left_out(args, r.variant).is_none()
    });
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
