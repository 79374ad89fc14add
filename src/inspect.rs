//! `sluice validate` and `sluice inspect`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use sluice::pipeline::{ConfigDocument, Error as PipelineError, Plan};
use sluice::{Job, JobError};

use crate::output::{print_error, stdout_closed};

/// The job, with the `trainer:` section (read by `sluice train` alone) checked as well:
/// its problems join the others, each at its `file:line:column`.
fn load(doc: &ConfigDocument) -> Result<Job, Box<JobError>> {
    #[cfg_attr(not(feature = "torch"), allow(unused_mut))]
    let mut trainer_errors: Vec<sluice::pipeline::ConfigError> = Vec::new();
    #[cfg(feature = "torch")]
    let _ = doc.value::<sluice::trainer::TrainerConfig>("trainer", &mut trainer_errors);
    let refused = |errors: Vec<sluice::pipeline::ConfigError>| {
        Box::new(JobError::from(PipelineError::Config(
            sluice::pipeline::ConfigErrors::sorted(errors),
        )))
    };
    match Job::from_document(doc) {
        Ok(job) if trainer_errors.is_empty() => Ok(job),
        Ok(_) => Err(refused(trainer_errors)),
        Err(JobError::Pipeline(PipelineError::Config(c))) => {
            let mut all = c.0;
            all.extend(trainer_errors);
            Err(refused(all))
        }
        Err(e) => Err(Box::new(e)),
    }
}

pub(crate) async fn validate(
    configs: &[PathBuf],
    overrides: &[(String, String)],
    no_data: bool,
) -> ExitCode {
    let mut failed = false;
    for path in configs {
        let loaded = crate::overrides::config_document(path, overrides)
            .map_err(|e| Box::new(JobError::from(e)))
            .and_then(|doc| load(&doc).map(|job| (doc, job)));
        let (doc, job) = match loaded {
            Ok(loaded) => loaded,
            Err(e) => {
                print_error(&e);
                let n = match &*e {
                    JobError::Pipeline(PipelineError::Config(c)) => c.0.len(),
                    _ => 1,
                };
                eprintln!(
                    "{}: {n} {} found",
                    path.display(),
                    if n == 1 { "problem" } else { "problems" }
                );
                failed = true;
                continue;
            }
        };
        let sections = doc.sections(
            sluice::pipeline::config::TOP_LEVEL_SECTIONS,
            &mut Vec::new(),
        );
        #[cfg(feature = "torch")]
        if sections.iter().any(|s| s == "trainer") {
            // What `sluice train` checks before it starts: a `loader:`, the tensors the
            // trainer names, a `batch` stage, …
            if let Err(e) = sluice::trainer::TrainJob::from_document(&doc) {
                print_error(&e);
                eprintln!("{}: 1 problem found", path.display());
                failed = true;
                continue;
            }
        }
        #[cfg(not(feature = "torch"))]
        if sections.iter().any(|s| s == "trainer" || s == "loader") {
            eprintln!(
                "note: {}: `loader:` and `trainer:` were not checked: this sluice was built without the `torch` feature",
                path.display()
            );
        }
        if no_data {
            out!("{}: ok (YAML only)", path.display());
            continue;
        }
        if check_data(path, &job).await {
            failed = true;
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Plans the job against its data: prints each problem, or the schemas the plan found (and,
/// with `torch`, the loader's check); `true` when there was a problem.
async fn check_data(path: &Path, job: &Job) -> bool {
    let mut failed = false;
    match job.pipeline().plan().await {
        Ok(plan) if !plan.problems.is_empty() => {
            for e in &plan.problems {
                print_error(e);
            }
            if let Some(first) = &plan.unchecked_from {
                eprintln!(
                    "note: {first} and the stages after it were not checked: the stage before them could not be built, so their input is unknown"
                );
            }
            let n = plan.problems.len();
            eprintln!(
                "{}: {n} {} found",
                path.display(),
                if n == 1 { "problem" } else { "problems" }
            );
            failed = true;
        }
        Ok(plan) => {
            print_plan(path, job, &plan);
            #[cfg(feature = "torch")]
            if let Some(loader) = &job.loader {
                let schema = plan
                    .stages
                    .last()
                    .map(|(_, s)| s.clone())
                    .unwrap_or_else(|| plan.source_schema.clone());
                match loader.check(&schema) {
                    Ok(lines) => {
                        for l in lines {
                            out!("  loader: {l}");
                        }
                    }
                    Err(e) => {
                        eprintln!("error: {e}");
                        eprintln!("{}: 1 problem found", path.display());
                        failed = true;
                    }
                }
            }
        }
        Err(e) => {
            print_error(&e);
            eprintln!("{}: 1 problem found", path.display());
            failed = true;
        }
    }
    failed
}

/// Prints a plan without problems: the schema after the source and after each stage, the
/// sink, and whether a Parquet run could continue on another number of ranks.
fn print_plan(path: &Path, job: &Job, plan: &Plan) {
    out!("{}: ok — {}", path.display(), plan.summary);
    out!("  source: {}", schema_line(&plan.source_schema));
    for (stage, schema) in &plan.stages {
        out!("  {stage}: {}", schema_line(schema));
    }
    if let Some(sink) = &job.sink {
        out!("  sink: {} at {}", sink.value.kind(), sink.location);
    }
    if matches!(
        job.pipeline.source.value,
        sluice::pipeline::sources::SourceConfig::Parquet(_)
    ) {
        // Judged for several ranks, the case a lost node leaves.
        let world = job.pipeline.runtime.rank_and_world().1.max(2);
        match job.pipeline().rescalable(world) {
            Ok(()) => out!(
                "  on another number of ranks (`--resume --elastic`, `Pipeline::rescale`): an interrupted epoch is finished exactly"
            ),
            Err(why) => out!(
                "  on another number of ranks (`--resume --elastic`, `Pipeline::rescale`): a run continues at the next epoch, the rest of the interrupted one untrained: {why}"
            ),
        }
    }
}

pub(crate) fn schema_line(schema: &arrow::datatypes::Schema) -> String {
    schema
        .fields()
        .iter()
        .map(|f| format!("{}: {}", f.name(), f.data_type()))
        .collect::<Vec<_>>()
        .join(", ")
}

pub(crate) async fn inspect(paths: &[String], rows: usize) -> ExitCode {
    let cwd = PathBuf::from(".");
    match sluice::pipeline::inspect::inspect_parquet(paths, &cwd, rows).await {
        Ok(files) => {
            for f in files {
                // `inspect … | head`: the reader has seen enough.
                if stdout_closed() {
                    break;
                }
                out!("{}", f.url);
                out!(
                    "  {} rows, {} row group(s), {} bytes{}",
                    f.rows,
                    f.row_groups.len(),
                    f.size,
                    f.created_by
                        .map(|c| format!(", written by {c}"))
                        .unwrap_or_default()
                );
                out!("  schema:");
                for field in f.schema.fields() {
                    out!(
                        "    {}: {}{}",
                        field.name(),
                        field.data_type(),
                        if field.is_nullable() {
                            ""
                        } else {
                            " (not null)"
                        }
                    );
                }
                if !f.partitions.is_empty() {
                    let values: Vec<String> = f
                        .partitions
                        .iter()
                        .map(|(k, v)| format!("{k}={}", v.as_deref().unwrap_or("null")))
                        .collect();
                    out!(
                        "  partition directories (columns with `partitioning: hive`): {}",
                        values.join(", ")
                    );
                }
                out!("  row groups:");
                for (i, rg) in f.row_groups.iter().enumerate() {
                    if stdout_closed() {
                        break;
                    }
                    out!(
                        "    {i}: {} rows, {} bytes compressed, {} uncompressed",
                        rg.rows,
                        rg.compressed_bytes,
                        rg.uncompressed_bytes
                    );
                }
                if !f.head.is_empty() {
                    out!("  first rows:");
                    print_rows(&f.head);
                }
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            print_error(&e);
            ExitCode::FAILURE
        }
    }
}

/// One line per row, long values (lists) shortened so the output stays readable.
pub(crate) fn print_rows(batches: &[arrow::array::RecordBatch]) {
    use arrow::util::display::{ArrayFormatter, FormatOptions};
    const MAX: usize = 72;
    let opts = FormatOptions::default().with_null("null");
    let mut row_no = 0;
    for b in batches {
        let formatters: Vec<_> = b
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &opts))
            .collect();
        for r in 0..b.num_rows() {
            let cells: Vec<String> = b
                .schema()
                .fields()
                .iter()
                .zip(&formatters)
                .map(|(field, fmt)| {
                    let v = match fmt {
                        Ok(f) => f.value(r).to_string(),
                        Err(_) => "?".into(),
                    };
                    let v = if v.chars().count() > MAX {
                        format!("{}…", v.chars().take(MAX).collect::<String>())
                    } else {
                        v
                    };
                    format!("{}={v}", field.name())
                })
                .collect();
            out!("    [{row_no}] {}", cells.join(", "));
            row_no += 1;
        }
    }
}
