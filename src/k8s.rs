//! `sluice k8s job.yaml --ranks N --image IMG`: the Kubernetes manifests that run
//! `sluice train` on N ranks, one pod each, under MPI — printed, for `kubectl apply -f -`.
//!
//! - a `ConfigMap` holding the job file as given (mounted at `/etc/sluice/job.yaml`);
//! - a Kubeflow Trainer v2 `TrainJob` (`trainer.kubeflow.org/v1alpha1`) on a runtime with an
//!   MPI policy (`--runtime`, default `deepspeed-distributed`, the one Kubeflow Trainer ships;
//!   `--kind trainjob`, the default), or the MPI Operator's `MPIJob` (`kubeflow.org/v2beta1`,
//!   `--kind mpijob`).
//!
//! The launcher runs `mpirun -np N sluice train /etc/sluice/job.yaml --backend mpi --resume
//! --elastic`: rank and world size come from MPI, a fresh job starts from the beginning, and a
//! rescheduled one continues from its checkpoint — also on another number of ranks — which is
//! why the checkpoint must be on object storage (a pod's disk goes with the pod). The images
//! follow the MPI Operator's conventions (user `mpiuser`, uid 1000, an SSH server on port 2222
//! with `/home/mpiuser/.sshd_config`), as the Dockerfile's `train` stage builds them.
//! `tests/k8s.rs` pins the output as golden files and validates it against the operators' CRD
//! schemas kept in `deploy/crds/`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde_json::{Value, json};

/// Where the job file is mounted in the pods.
const JOB_DIR: &str = "/etc/sluice";

/// Environment variables the launcher passes on to every rank (`mpirun -x`): ranks started
/// over SSH do not inherit the pod's environment. libtorch's and the log's settings, then the
/// object stores' credentials (from `--secret`); `--forward-env` adds more.
const FORWARDED: &[&str] = &[
    "LD_LIBRARY_PATH",
    "OMP_NUM_THREADS",
    "RUST_LOG",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_ENDPOINT_URL",
    "GOOGLE_SERVICE_ACCOUNT",
    "GOOGLE_SERVICE_ACCOUNT_KEY",
    "AZURE_STORAGE_ACCOUNT_NAME",
    "AZURE_STORAGE_ACCOUNT_KEY",
    "AZURE_STORAGE_SAS_KEY",
];

/// Which operator runs the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    /// Kubeflow Trainer v2: `TrainJob` on a ClusterTrainingRuntime with an MPI policy.
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
    /// The TrainJob's ClusterTrainingRuntime: one with an MPI policy whose replicated jobs are
    /// `launcher` and `node` (`kubectl get clustertrainingruntimes`).
    #[arg(long, default_value = "deepspeed-distributed")]
    pub runtime: String,
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
    /// `AWS_ACCESS_KEY_ID`, …); never read here.
    #[arg(long)]
    pub secret: Option<String>,
    /// More environment variables for `mpirun -x` (comma-separated names).
    #[arg(long, value_delimiter = ',')]
    pub forward_env: Vec<String>,
}

/// Prints the manifests, or says why it cannot.
pub fn k8s(args: &K8sArgs, overrides: &[(String, String)]) -> ExitCode {
    match manifests(args, overrides) {
        Ok((yaml, warnings)) => {
            for w in warnings {
                eprintln!("warning: {w}");
            }
            crate::output::write_line(format_args!("{}", yaml.trim_end_matches('\n')));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The manifests as one multi-document YAML text, and warnings about the job.
pub fn manifests(
    args: &K8sArgs,
    overrides: &[(String, String)],
) -> Result<(String, Vec<String>), String> {
    check_request(args)?;
    let name = job_name(args)?;
    let text = std::fs::read_to_string(&args.config)
        .map_err(|e| format!("{}: {e}", args.config.display()))?;
    let warnings = check_job(&args.config, overrides)?;
    let documents = [
        config_map(args, &name, &text),
        match args.kind {
            Kind::Trainjob => train_job(args, &name, overrides),
            Kind::Mpijob => mpi_job(args, &name, overrides),
        },
    ];
    let mut out = String::new();
    for d in &documents {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(d).map_err(|e| format!("writing YAML: {e}"))?);
    }
    Ok((out, warnings))
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
    for v in &args.forward_env {
        if v.is_empty() || !v.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(format!(
                "--forward-env `{v}`: environment variable names are letters, digits and `_`"
            ));
        }
    }
    Ok(())
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
/// pods' suffixes (`-launcher`, `-node-0-12`, …).
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
    let ok = (1..=40).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && !name.ends_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if ok {
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

/// Loads the job as `sluice train` would and checks that it can run in pods: its checkpoint on
/// object storage. Warnings for data on local disk (it must be in the image or a volume).
fn check_job(config: &Path, overrides: &[(String, String)]) -> Result<Vec<String>, String> {
    use sluice::pipeline::sources::SourceConfig;
    let job = crate::overrides::config_document(config, overrides)
        .map_err(sluice::trainer::TrainError::from)
        .and_then(|doc| sluice::trainer::TrainJob::from_document(&doc))
        .map_err(|e| e.to_string())?;
    let remote = |p: &str| p.contains("://") && !p.starts_with("file:");
    match &job.trainer.checkpoint {
        None => {
            return Err(
                "`trainer` has no `checkpoint`: a job on Kubernetes needs one on object storage (`checkpoint: {path: s3://bucket/run/train.ckpt, every_steps: 200}`), or a rescheduled pod starts over".into(),
            );
        }
        Some(c) if !remote(&c.path) => {
            return Err(format!(
                "trainer.checkpoint.path `{}` is on local disk: a pod's disk goes with the pod, so a rescheduled job could not resume. Put it on object storage (s3://…, gs://…, az://…)",
                c.path
            ));
        }
        Some(_) => {}
    }
    let mut warnings = Vec::new();
    if let SourceConfig::Parquet(p) = &job.pipeline.source.value {
        let paths = p.path.iter().flat_map(|p| p.0.iter()).chain(&p.manifest);
        for path in paths.filter(|p| !remote(p)) {
            warnings.push(format!(
                "source path `{path}` is on local disk: in the pods it must exist in the image or a mounted volume{}",
                if Path::new(path).is_absolute() {
                    String::new()
                } else {
                    format!(" (relative paths resolve against {JOB_DIR}, where the job file is mounted)")
                }
            ));
        }
    }
    Ok(warnings)
}

/// Labels every object carries.
fn labels(name: &str) -> Value {
    json!({"app.kubernetes.io/name": "sluice", "app.kubernetes.io/instance": name})
}

fn metadata(args: &K8sArgs, name: &str) -> Value {
    let mut m = json!({"name": name, "labels": labels(name)});
    if let Some(ns) = &args.namespace {
        m["namespace"] = json!(ns);
    }
    m
}

fn config_map(args: &K8sArgs, name: &str, text: &str) -> Value {
    let mut meta = metadata(args, name);
    meta["name"] = json!(format!("{name}-job"));
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta,
        "data": {"job.yaml": text},
    })
}

/// The launcher's command: `mpirun` starting `sluice train` on every rank.
fn launch_command(args: &K8sArgs, overrides: &[(String, String)]) -> Vec<String> {
    let mut c: Vec<String> = ["mpirun", "-np"].map(String::from).to_vec();
    c.push(args.ranks.to_string());
    // One rank per pod; binding would pin it to the first cores of its pod's node.
    c.extend(["--bind-to", "none", "--map-by", "slot"].map(String::from));
    for v in FORWARDED
        .iter()
        .map(|v| v.to_string())
        .chain(args.forward_env.clone())
    {
        c.push("-x".into());
        c.push(v);
    }
    c.extend(
        [
            "sluice",
            "train",
            &format!("{JOB_DIR}/job.yaml"),
            "--backend",
            "mpi",
            "--resume",
            "--elastic",
            "--progress",
            "never",
        ]
        .map(String::from),
    );
    for (k, v) in overrides {
        c.push("--set".into());
        c.push(format!("{k}={v}"));
    }
    c
}

/// CPU, memory and GPUs per rank, requested and limited alike (a guaranteed pod).
fn resources(args: &K8sArgs) -> Value {
    let mut r = json!({"cpu": args.cpu, "memory": args.memory});
    if args.gpus_per_rank > 0 {
        r["nvidia.com/gpu"] = json!(args.gpus_per_rank.to_string());
    }
    r
}

/// The pods' environment from `--secret`.
fn env_from(args: &K8sArgs) -> Value {
    match &args.secret {
        Some(s) => json!([{"secretRef": {"name": s}}]),
        None => json!([]),
    }
}

fn job_volume(name: &str) -> (Value, Value) {
    (
        json!({"name": "sluice-job", "configMap": {"name": format!("{name}-job")}}),
        json!({"name": "sluice-job", "mountPath": JOB_DIR, "readOnly": true}),
    )
}

/// `TrainJob` on a Kubeflow Trainer runtime with an MPI policy (`--runtime`; the one Kubeflow
/// Trainer ships is `deepspeed-distributed`: OpenMPI, SSH on port 2222, replicated jobs
/// `launcher` and `node` whose containers are named `node`): the trainer's image and command
/// are the launcher's (`mpirun`), `numNodes` the ranks; the job file is mounted in every pod
/// through `runtimePatches`.
fn train_job(args: &K8sArgs, name: &str, overrides: &[(String, String)]) -> Value {
    let (volume, mount) = job_volume(name);
    let patch = |job: &str| {
        json!({
            "name": job,
            "template": {"spec": {"template": {"spec": {
                "volumes": [volume],
                "containers": [{"name": "node", "volumeMounts": [mount]}],
            }}}},
        })
    };
    // The trainer takes `env`, not `envFrom`: each forwarded name is read from the Secret
    // when it holds that key (`optional`).
    let mut env = vec![json!({"name": "OMP_NUM_THREADS", "value": "1"})];
    if let Some(secret) = &args.secret {
        let names = FORWARDED[3..].iter().map(|v| v.to_string());
        for v in names.chain(args.forward_env.clone()) {
            env.push(json!({"name": v, "valueFrom": {"secretKeyRef": {"name": secret, "key": v, "optional": true}}}));
        }
    }
    let trainer = json!({
        "image": args.image,
        "command": launch_command(args, overrides),
        "numNodes": args.ranks,
        "numProcPerNode": 1,
        "resourcesPerNode": {"requests": resources(args), "limits": resources(args)},
        "env": env,
    });
    json!({
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": metadata(args, name),
        "spec": {
            "runtimeRef": {"name": args.runtime},
            "trainer": trainer,
            "runtimePatches": [{
                "manager": "sluice.dev/k8s",
                "trainingRuntimeSpec": {"template": {"spec": {
                    "replicatedJobs": [patch("launcher"), patch("node")],
                }}},
            }],
        },
    })
}

/// `MPIJob` (MPI Operator v2): a launcher pod running `mpirun` and one worker pod per rank
/// running the SSH server `mpirun` starts the ranks through.
fn mpi_job(args: &K8sArgs, name: &str, overrides: &[(String, String)]) -> Value {
    let (volume, mount) = job_volume(name);
    let container = |role: &str, command: Vec<String>, resources: Value| {
        json!({
            "name": role,
            "image": args.image,
            "command": command,
            "env": [{"name": "OMP_NUM_THREADS", "value": "1"}],
            "envFrom": env_from(args),
            "resources": resources,
            "volumeMounts": [mount],
            "securityContext": {"runAsUser": 1000},
        })
    };
    let pod = |c: Value| json!({"metadata": {"labels": labels(name)}, "spec": {"containers": [c], "volumes": [volume]}});
    let launcher = container(
        "launcher",
        launch_command(args, overrides),
        json!({"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}}),
    );
    let sshd = ["/usr/sbin/sshd", "-De", "-f", "/home/mpiuser/.sshd_config"]
        .map(String::from)
        .to_vec();
    let worker = container(
        "worker",
        sshd,
        json!({"requests": resources(args), "limits": resources(args)}),
    );
    json!({
        "apiVersion": "kubeflow.org/v2beta1",
        "kind": "MPIJob",
        "metadata": metadata(args, name),
        "spec": {
            "slotsPerWorker": 1,
            "mpiImplementation": "OpenMPI",
            "sshAuthMountPath": "/home/mpiuser/.ssh",
            "runPolicy": {"cleanPodPolicy": "Running", "backoffLimit": 3},
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "restartPolicy": "OnFailure", "template": pod(launcher)},
                "Worker": {"replicas": args.ranks, "restartPolicy": "OnFailure", "template": pod(worker)},
            },
        },
    })
}
