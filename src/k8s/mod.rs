//! `sluice k8s job.yaml --ranks N --image IMG`: the Kubernetes manifests that run
//! `sluice train` on N ranks, one pod each, under MPI — printed, for `kubectl apply -f -`.
//!
//! - a `ConfigMap` holding the job file as given (mounted at `/etc/sluice/job.yaml`);
//! - `--kind trainjob` (default): a Kubeflow Trainer v2 `TrainingRuntime` of the job's own and
//!   the `TrainJob` that runs it (`trainer.kubeflow.org/v1alpha1`); `--kind mpijob`: the MPI
//!   Operator's `MPIJob` (`kubeflow.org/v2beta1`). See [`manifests`] for why the TrainJob
//!   brings its runtime.
//!
//! The launcher runs `mpirun -np N sluice train /etc/sluice/job.yaml --backend mpi --resume
//! --elastic`: rank and world size come from MPI, a fresh job starts from the beginning, and a
//! rescheduled one continues from its checkpoint — also on another number of ranks — which is
//! why the checkpoint must be on object storage (a pod's disk goes with the pod). The images
//! follow the MPI Operator's conventions (user `mpiuser`, uid 1000, an SSH server on port 2222
//! with `/home/mpiuser/.sshd_config`), as the Dockerfile's `train` stage builds them.
//! `tests/k8s.rs` pins the output as golden files and validates it against the operators' CRD
//! schemas kept in `deploy/crds/`.

mod manifests;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Where the job file is mounted in the pods.
const JOB_DIR: &str = "/etc/sluice";

/// Environment variables the launcher passes on to every rank (`mpirun -x`): ranks started
/// over SSH do not inherit the pod's environment. libtorch's and the log's settings, then the
/// object stores' (their values from `--secret`); the job file's `${NAME}`s and
/// `--forward-env` add more.
const FORWARDED: &[&str] = &[
    "LD_LIBRARY_PATH",
    "OMP_NUM_THREADS",
    "RUST_LOG",
    "SSL_CERT_FILE",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_ALLOW_HTTP",
    "GOOGLE_SERVICE_ACCOUNT",
    "GOOGLE_SERVICE_ACCOUNT_KEY",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "AZURE_STORAGE_ACCOUNT_NAME",
    "AZURE_STORAGE_ACCOUNT_KEY",
    "AZURE_STORAGE_SAS_KEY",
    "AZURE_STORAGE_ENDPOINT",
    "AZURE_ALLOW_HTTP",
];

/// Which operator runs the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    /// Kubeflow Trainer v2: a `TrainingRuntime` of the job's own and its `TrainJob`.
    Trainjob,
    /// The MPI Operator: `MPIJob` (kubeflow.org/v2beta1).
    Mpijob,
}

/// `sluice k8s`'s arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct K8sArgs {
    /// The training job (a `sluice train` file), shipped as written in a ConfigMap; `--set`
    /// overrides are checked here and passed on to `sluice train`.
    pub config: PathBuf,
    /// Ranks: pods, one `sluice train` process each (1–4096).
    #[arg(long)]
    pub ranks: u32,
    /// The container image (the Dockerfile's default `train` target).
    #[arg(long)]
    pub image: String,
    /// GPUs per rank (`nvidia.com/gpu`); needs an image with a CUDA libtorch.
    #[arg(long, default_value_t = 0)]
    pub gpus_per_rank: u32,
    /// The image has a CUDA libtorch although its name does not say `cuda`.
    #[arg(long)]
    pub gpu_image: bool,
    /// `trainjob` (Kubeflow Trainer v2) or `mpijob` (the MPI Operator).
    #[arg(long, value_enum, default_value = "trainjob")]
    pub kind: Kind,
    /// The job's name (default: the config file's name): lowercase letters, digits and `-`.
    #[arg(long)]
    pub name: Option<String>,
    /// The namespace (default: kubectl's current one).
    #[arg(long)]
    pub namespace: Option<String>,
    /// CPU per rank, requested and the limit (`4`, `3500m`).
    #[arg(long, default_value = "2")]
    pub cpu: String,
    /// Memory per rank, requested and the limit (`8Gi`).
    #[arg(long, default_value = "4Gi")]
    pub memory: String,
    /// A Secret whose keys become environment variables of the pods (storage credentials:
    /// `AWS_ACCESS_KEY_ID`, …, and the job file's `${NAME}`s); never read here.
    #[arg(long)]
    pub secret: Option<String>,
    /// More environment variables for `mpirun -x` (comma-separated names).
    #[arg(long, value_delimiter = ',')]
    pub forward_env: Vec<String>,
}

/// What the manifests are made of, checked.
struct Plan<'a> {
    args: &'a K8sArgs,
    name: String,
    /// The job file as written.
    text: String,
    /// `mpirun -x` names, each once, in order.
    forwarded: Vec<String>,
    overrides: &'a [(String, String)],
}

/// Prints the manifests, or says why it cannot.
pub fn k8s(args: &K8sArgs, overrides: &[(String, String)]) -> ExitCode {
    match plan(args, overrides) {
        Ok((plan, warnings)) => {
            for w in warnings {
                eprintln!("warning: {w}");
            }
            match manifests::render(&plan) {
                Ok(yaml) => {
                    crate::output::write_line(format_args!("{}", yaml.trim_end_matches('\n')));
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The checked request and the job's warnings.
fn plan<'a>(
    args: &'a K8sArgs,
    overrides: &'a [(String, String)],
) -> Result<(Plan<'a>, Vec<String>), String> {
    check_request(args)?;
    let name = job_name(args)?;
    let text = std::fs::read_to_string(&args.config)
        .map_err(|e| format!("{}: {e}", args.config.display()))?;
    let mut warnings = check_job(&args.config, overrides)?;
    let referenced = referenced_variables(&text);
    if !referenced.is_empty() && args.secret.is_none() {
        warnings.push(format!(
            "the job file uses ${{{}}}: the pods have them only from --secret (a Secret holding them)",
            referenced.join("}, ${")
        ));
    }
    warnings.extend(literal_secrets(&text));
    let mut seen = BTreeSet::new();
    let forwarded = FORWARDED
        .iter()
        .map(|v| v.to_string())
        .chain(referenced)
        .chain(args.forward_env.iter().cloned())
        .filter(|v| seen.insert(v.clone()))
        .collect();
    let plan = Plan {
        args,
        name,
        text,
        forwarded,
        overrides,
    };
    Ok((plan, warnings))
}

/// Refuses what no cluster can run.
fn check_request(args: &K8sArgs) -> Result<(), String> {
    if !(1..=4096).contains(&args.ranks) {
        return Err(format!(
            "--ranks {}: a job runs on 1 to 4096 ranks (one pod each)",
            args.ranks
        ));
    }
    let image = args.image.trim();
    if image.is_empty() || image.contains(char::is_whitespace) {
        return Err(format!(
            "--image `{}`: name an image, e.g. ghcr.io/you/sluice:0.1.0 (built from the Dockerfile)",
            args.image
        ));
    }
    if args.gpus_per_rank > 0 && !args.gpu_image && !image.to_ascii_lowercase().contains("cuda") {
        return Err(format!(
            "--gpus-per-rank {}: the image {image} does not look like one with a CUDA libtorch (its name does not say `cuda`; the Dockerfile builds CPU images). Use a CUDA image, pass --gpu-image if this one is, or drop --gpus-per-rank",
            args.gpus_per_rank
        ));
    }
    for (flag, value) in [("--cpu", &args.cpu), ("--memory", &args.memory)] {
        if !is_quantity(value) {
            return Err(format!(
                "{flag} `{value}` is not a Kubernetes quantity (e.g. `2`, `500m`, `8Gi`)"
            ));
        }
    }
    for (flag, value) in [("--namespace", &args.namespace), ("--secret", &args.secret)] {
        if let Some(v) = value.as_deref().filter(|v| !is_dns_label(v, 63)) {
            return Err(format!(
                "{flag} `{v}` is not a Kubernetes name: lowercase letters, digits and `-`, at most 63"
            ));
        }
    }
    for v in &args.forward_env {
        if !is_variable_name(v) {
            return Err(format!(
                "--forward-env `{v}`: environment variable names are letters, digits and `_`, not starting with a digit"
            ));
        }
    }
    Ok(())
}

fn is_variable_name(v: &str) -> bool {
    v.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && v.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A DNS label: lowercase letters, digits and `-`, starting with a letter, not ending in `-`.
fn is_dns_label(s: &str, max: usize) -> bool {
    (1..=max).contains(&s.len())
        && s.starts_with(|c: char| c.is_ascii_lowercase())
        && !s.ends_with('-')
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

/// A Kubernetes resource quantity: a decimal number and an optional suffix.
fn is_quantity(s: &str) -> bool {
    let digits = s.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let suffix = &s[digits.len()..];
    let number = !digits.is_empty()
        && digits.chars().all(|c| c.is_ascii_digit() || c == '.')
        && digits.parse::<f64>().is_ok_and(|v| v > 0.0);
    number
        && [
            "", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei",
        ]
        .contains(&suffix)
}

/// The job's name: `--name` or the config file's, checked as a DNS label short enough for the
/// pods' suffixes (`-launcher-0-0`, `-node-0-12`, …).
fn job_name(args: &K8sArgs) -> Result<String, String> {
    let given = args.name.is_some();
    let name = args.name.clone().unwrap_or_else(|| {
        let stem = args
            .config
            .file_stem()
            .map(|s| s.to_string_lossy().to_ascii_lowercase())
            .unwrap_or_default();
        stem.chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect::<String>()
            .trim_matches('-')
            .to_string()
    });
    if is_dns_label(&name, 40) {
        return Ok(name);
    }
    Err(format!(
        "{} `{name}` cannot name the job: 1–40 lowercase letters, digits and `-`, starting with a letter{}",
        if given {
            "--name"
        } else {
            "the config file's name"
        },
        if given { "" } else { "; pass --name" }
    ))
}

/// Whether `p` is on an object store a rank can write to (not local disk, not HTTP).
fn on_object_storage(p: &str) -> bool {
    p.contains("://") && !p.starts_with("file:") && !p.starts_with("http")
}

/// Loads the job as `sluice train` would and checks that it can run in pods: its checkpoint on
/// object storage. Warnings for local paths: data must be in the image or a volume, and what
/// the job writes there is lost with the pod (`/etc/sluice` is read-only).
fn check_job(config: &Path, overrides: &[(String, String)]) -> Result<Vec<String>, String> {
    use sluice::pipeline::sources::SourceConfig;
    let job = crate::overrides::config_document(config, overrides)
        .map_err(sluice::trainer::TrainError::from)
        .and_then(|doc| sluice::trainer::TrainJob::from_document(&doc))
        .map_err(|e| e.to_string())?;
    match &job.trainer.checkpoint {
        None => {
            return Err(
                "`trainer` has no `checkpoint`: a job on Kubernetes needs one on object storage (`checkpoint: {path: s3://bucket/run/train.ckpt, every_steps: 200}`), or a rescheduled pod starts over".into(),
            );
        }
        Some(c) if !on_object_storage(&c.path) => {
            return Err(format!(
                "trainer.checkpoint.path `{}` is not on object storage: a pod's disk goes with the pod (and HTTP takes no writes), so a rescheduled job could not resume. Put it on s3://, gs:// or az://",
                c.path
            ));
        }
        Some(_) => {}
    }
    let relative = |p: &str| {
        if Path::new(p).is_absolute() {
            String::new()
        } else {
            format!(" (relative paths resolve against {JOB_DIR}, where the job file is mounted)")
        }
    };
    let mut warnings = Vec::new();
    if let SourceConfig::Parquet(p) = &job.pipeline.source.value {
        let paths = p.path.iter().flat_map(|p| p.0.iter()).chain(&p.manifest);
        for path in paths.filter(|p| !p.contains("://") || p.starts_with("file:")) {
            warnings.push(format!(
                "source path `{path}` is on local disk: in the pods it must exist in the image or a mounted volume{}",
                relative(path)
            ));
        }
    }
    let outputs = [
        (
            "trainer.export.path",
            job.trainer.export.as_ref().map(|e| &e.path),
        ),
        ("trainer.tensorboard", job.trainer.tensorboard.as_ref()),
    ];
    for (key, path) in outputs {
        if let Some(p) = path.filter(|p| !on_object_storage(p)) {
            warnings.push(format!(
                "{key} `{p}` is not on object storage: what the pods write there goes with them{}",
                relative(p)
            ));
        }
    }
    Ok(warnings)
}

/// The `${NAME}`s of the job file, each once, in order: the ranks need them in their
/// environment.
fn referenced_variables(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    for (at, _) in text.match_indices("${") {
        let rest = &text[at + 2..];
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        let name = &rest[..end];
        if is_variable_name(name) && !names.iter().any(|n| n == name) {
            names.push(name.to_string());
        }
    }
    names
}

/// Warnings for settings that look like secrets written into the file (a ConfigMap shows them
/// to anyone who may read ConfigMaps): values of keys naming a password, secret, token or key.
fn literal_secrets(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let key = key.trim().trim_start_matches("- ").to_ascii_lowercase();
        let value = value.trim();
        let secret_key = ["password", "secret", "token", "jaas"]
            .iter()
            .any(|w| key.contains(w))
            || key.ends_with("_key")
            || key.ends_with(".key");
        let literal = !value.is_empty() && !value.starts_with("${") && !value.starts_with('#');
        if secret_key && literal && !key.starts_with('#') {
            out.push(format!(
                "line {} sets `{key}` in the file: the ConfigMap shows it to anyone who can read ConfigMaps; write `${{NAME}}` there and put NAME in the --secret",
                n + 1
            ));
        }
    }
    out
}
