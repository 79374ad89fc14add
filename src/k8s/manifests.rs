//! The objects `sluice k8s` prints, as JSON values written out as YAML.
//!
//! Why a `TrainJob` brings a `TrainingRuntime` of its own: Kubeflow Trainer applies a
//! TrainJob's `trainer.image`, `resourcesPerNode` and `env` only to the replicated job that
//! runs the trainer (the MPI launcher); the nodes keep the runtime's image (the shipped MPI
//! runtime's is DeepSpeed's, without `sluice`) and get no resources, and a runtime patch
//! cannot set an image. A runtime of the job's own names the image, resources, SSH server and
//! mounts of both, so the TrainJob only picks it and says how many nodes.

use serde_json::{Value, json};

use super::{JOB_DIR, Kind, Plan};

/// The documents, each after `---`.
pub(super) fn render(plan: &Plan<'_>) -> Result<String, String> {
    let mut documents = vec![config_map(plan)];
    match plan.args.kind {
        Kind::Trainjob => documents.extend([training_runtime(plan), train_job(plan)]),
        Kind::Mpijob => documents.push(mpi_job(plan)),
    }
    let mut out = String::new();
    for d in &documents {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(d).map_err(|e| format!("writing YAML: {e}"))?);
    }
    Ok(out)
}

/// Labels every object carries.
fn labels(name: &str) -> Value {
    json!({"app.kubernetes.io/name": "sluice", "app.kubernetes.io/instance": name})
}

fn metadata(plan: &Plan<'_>, name: &str) -> Value {
    let mut m = json!({"name": name, "labels": labels(&plan.name)});
    if let Some(ns) = &plan.args.namespace {
        m["namespace"] = json!(ns);
    }
    m
}

fn config_map(plan: &Plan<'_>) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(plan, &format!("{}-job", plan.name)),
        "data": {"job.yaml": plan.text},
    })
}

/// The launcher's command: `mpirun` starting `sluice train` on every rank.
fn launch_command(plan: &Plan<'_>) -> Vec<String> {
    let mut c: Vec<String> = ["mpirun", "-np"].map(String::from).to_vec();
    c.push(plan.args.ranks.to_string());
    // One rank per pod; binding would pin it to the first cores of its pod's node.
    c.extend(["--bind-to", "none", "--map-by", "slot"].map(String::from));
    for v in &plan.forwarded {
        c.push("-x".into());
        c.push(v.clone());
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
    for (k, v) in plan.overrides {
        c.push("--set".into());
        c.push(format!("{k}={v}"));
    }
    c
}

/// The workers' command: the SSH server `mpirun` starts the ranks through.
fn sshd() -> Vec<String> {
    ["/usr/sbin/sshd", "-De", "-f", "/home/mpiuser/.sshd_config"]
        .map(String::from)
        .to_vec()
}

/// CPU, memory and GPUs per rank, requested and limited alike (a guaranteed pod).
fn rank_resources(plan: &Plan<'_>) -> Value {
    let mut r = json!({"cpu": plan.args.cpu, "memory": plan.args.memory});
    if plan.args.gpus_per_rank > 0 {
        r["nvidia.com/gpu"] = json!(plan.args.gpus_per_rank.to_string());
    }
    json!({"requests": r, "limits": r})
}

/// The launcher's: it only runs `mpirun`.
fn launcher_resources() -> Value {
    json!({"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}})
}

/// A container of `role` running `command` with the image, the job file mounted and the
/// `--secret` as its environment.
fn container(plan: &Plan<'_>, role: &str, command: Vec<String>, resources: Value) -> Value {
    let mut c = json!({
        "name": role,
        "image": plan.args.image,
        "command": command,
        "env": [{"name": "OMP_NUM_THREADS", "value": "1"}],
        "resources": resources,
        "volumeMounts": [{"name": "sluice-job", "mountPath": JOB_DIR, "readOnly": true}],
        "securityContext": {"runAsUser": 1000, "runAsGroup": 1000},
    });
    if let Some(s) = &plan.args.secret {
        c["envFrom"] = json!([{"secretRef": {"name": s}}]);
    }
    c
}

/// A pod template: one container and the job file's volume.
fn pod(plan: &Plan<'_>, container: Value) -> Value {
    json!({
        "metadata": {"labels": labels(&plan.name)},
        "spec": {
            // The SSH keys the operator mounts are readable by the image's `mpiuser`.
            "securityContext": {"fsGroup": 1000},
            "containers": [container],
            "volumes": [{"name": "sluice-job", "configMap": {"name": format!("{}-job", plan.name)}}],
        },
    })
}

/// Kubeflow Trainer's `TrainingRuntime` for this job (see the module's comment): an MPI
/// policy (OpenMPI, SSH keys at `/home/mpiuser/.ssh`, the launcher not a node) and a JobSet of
/// a `launcher` (the trainer step: `mpirun`) that starts once the `node`s (SSH servers, one
/// rank each) are ready.
fn training_runtime(plan: &Plan<'_>) -> Value {
    let launcher = container(plan, "node", launch_command(plan), launcher_resources());
    let mut node = container(plan, "node", sshd(), rank_resources(plan));
    node["ports"] = json!([{"containerPort": 2222, "protocol": "TCP"}]);
    node["readinessProbe"] =
        json!({"tcpSocket": {"port": 2222}, "initialDelaySeconds": 2, "periodSeconds": 2});
    let step = json!({"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"});
    json!({
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainingRuntime",
        "metadata": metadata(plan, &plan.name),
        "spec": {
            "mlPolicy": {
                "numNodes": plan.args.ranks,
                "mpi": {
                    "numProcPerNode": 1,
                    "mpiImplementation": "OpenMPI",
                    "sshAuthMountPath": "/home/mpiuser/.ssh",
                    "runLauncherAsNode": false,
                },
            },
            "template": {"spec": {
                "network": {"publishNotReadyAddresses": true},
                "successPolicy": {"operator": "All", "targetReplicatedJobs": ["launcher"]},
                "replicatedJobs": [
                    {
                        "name": "launcher",
                        "dependsOn": [{"name": "node", "status": "Ready"}],
                        "template": {
                            "metadata": {"labels": step},
                            "spec": {"template": pod(plan, launcher)},
                        },
                    },
                    {
                        "name": "node",
                        "template": {"spec": {"template": pod(plan, node)}},
                    },
                ],
            }},
        },
    })
}

/// The `TrainJob` that runs the runtime above on `--ranks` nodes.
fn train_job(plan: &Plan<'_>) -> Value {
    json!({
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": metadata(plan, &plan.name),
        "spec": {
            "runtimeRef": {
                "apiGroup": "trainer.kubeflow.org",
                "kind": "TrainingRuntime",
                "name": plan.name,
            },
            "trainer": {"numNodes": plan.args.ranks},
        },
    })
}

/// `MPIJob` (MPI Operator v2): a launcher pod running `mpirun` and one worker pod per rank
/// running the SSH server.
fn mpi_job(plan: &Plan<'_>) -> Value {
    let launcher = container(plan, "launcher", launch_command(plan), launcher_resources());
    let worker = container(plan, "worker", sshd(), rank_resources(plan));
    json!({
        "apiVersion": "kubeflow.org/v2beta1",
        "kind": "MPIJob",
        "metadata": metadata(plan, &plan.name),
        "spec": {
            "slotsPerWorker": 1,
            "mpiImplementation": "OpenMPI",
            "sshAuthMountPath": "/home/mpiuser/.ssh",
            "runPolicy": {"cleanPodPolicy": "Running", "backoffLimit": 3},
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "restartPolicy": "OnFailure", "template": pod(plan, launcher)},
                "Worker": {"replicas": plan.args.ranks, "restartPolicy": "OnFailure", "template": pod(plan, worker)},
            },
        },
    })
}
