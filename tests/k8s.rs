//! `sluice k8s`: the manifests for deploy/k8s/digits.yaml pinned as golden files
//! (`tests/golden/k8s/`), validated against the operators' published CRD schemas kept in
//! `deploy/crds/` (tests/k8s_schema.py, strictly: an unknown field fails), and the requests no
//! cluster can run refused with a message that says what to change.
//!
//! After changing the output on purpose, re-bless the files and review the diff:
//!
//! ```text
//! SLUICE_BLESS=1 cargo test --test cli_suite k8s
//! git diff tests/golden/k8s
//! ```
#![cfg(feature = "torch")]
#![allow(clippy::unwrap_used)]

use crate::common;

use std::path::{Path, PathBuf};

use common::*;

/// Each golden file and the arguments that make it (after `k8s deploy/k8s/digits.yaml`).
const CASES: &[(&str, &[&str])] = &[
    (
        "trainjob.yaml",
        &[
            "--ranks",
            "4",
            "--image",
            "ghcr.io/sluice-dev/sluice:0.1.0",
            "--secret",
            "s3-credentials",
            "--namespace",
            "ml",
        ],
    ),
    (
        "mpijob.yaml",
        &[
            "--kind",
            "mpijob",
            "--ranks",
            "3",
            "--image",
            "ghcr.io/sluice-dev/sluice:0.1.0-cuda",
            "--gpus-per-rank",
            "1",
            "--cpu",
            "8",
            "--memory",
            "32Gi",
            "--secret",
            "s3-credentials",
            "--name",
            "digits-gpu",
            "--set",
            "trainer.epochs=5",
        ],
    ),
];

fn k8s(args: &[&str]) -> std::process::Output {
    sluice()
        .arg("k8s")
        .arg(repo().join("deploy/k8s/digits.yaml"))
        .args(args)
        .current_dir(repo())
        .output()
        .unwrap()
}

fn golden(file: &str) -> PathBuf {
    repo().join("tests/golden/k8s").join(file)
}

/// Runs tests/k8s_schema.py on `manifests` with both CRDs: its exit status and output.
fn validate(manifests: &Path) -> (bool, String) {
    let crds = repo().join("deploy/crds");
    let out = std::process::Command::new(venv_python())
        .arg(repo().join("tests/k8s_schema.py"))
        .arg(manifests)
        .arg(crds.join("trainer.kubeflow.org_trainjobs.yaml"))
        .arg(crds.join("trainer.kubeflow.org_trainingruntimes.yaml"))
        .arg(crds.join("kubeflow.org_mpijobs.yaml"))
        .output()
        .unwrap();
    let text = output_text(&out);
    (out.status.success(), text)
}

#[test]
fn manifests_equal_the_golden_files() {
    let bless = std::env::var_os("SLUICE_BLESS").is_some();
    for (file, args) in CASES {
        let out = k8s(args);
        assert_ok(&out);
        let got = String::from_utf8(out.stdout).unwrap();
        if bless {
            std::fs::create_dir_all(golden("")).unwrap();
            std::fs::write(golden(file), &got).unwrap();
            continue;
        }
        let want = std::fs::read_to_string(golden(file)).unwrap_or_default();
        assert!(
            got == want,
            "`sluice k8s … {}` differs from tests/golden/k8s/{file} (re-bless with SLUICE_BLESS=1 if on purpose):\n{got}",
            args.join(" ")
        );
    }
}

/// Both kinds pass the CRDs' schemas (strictly: TrainingRuntime, TrainJob, MPIJob); the same manifest with a misspelt field
/// does not, so the check can fail.
#[test]
fn manifests_pass_the_operators_crd_schemas() {
    let dir = tempfile::tempdir().unwrap();
    for (file, args) in CASES {
        let out = k8s(args);
        assert_ok(&out);
        let path = dir.path().join(file);
        std::fs::write(&path, &out.stdout).unwrap();
        let (ok, text) = validate(&path);
        assert!(ok, "{file}: {text}");
        // ConfigMap + TrainingRuntime + TrainJob, or ConfigMap + MPIJob.
        let documents = if file.starts_with("trainjob") { 3 } else { 2 };
        assert!(
            text.contains(&format!("{documents} document(s) checked, 0 error(s)")),
            "{text}"
        );

        let yaml = String::from_utf8(out.stdout).unwrap();
        let broken = yaml.replacen("  image: ", "  imagee: ", 1);
        assert_ne!(broken, yaml);
        std::fs::write(&path, broken).unwrap();
        let (ok, text) = validate(&path);
        assert!(!ok, "{file}: a misspelt field passed: {text}");
        assert!(text.contains("imagee"), "{text}");
    }
}

/// What cannot run is refused before anything is printed, saying what to change.
#[test]
fn impossible_requests_are_refused_clearly() {
    let image = ["--image", "ghcr.io/sluice-dev/sluice:0.1.0"];
    let cases: &[(Vec<&str>, &str)] = &[
        (
            [&["--ranks", "0"][..], &image].concat(),
            "--ranks 0: a job runs on 1 to 4096 ranks",
        ),
        (
            [&["--ranks", "2", "--gpus-per-rank", "1"][..], &image].concat(),
            "--gpus-per-rank 1: the image ghcr.io/sluice-dev/sluice:0.1.0 does not look like one with a CUDA libtorch",
        ),
        (
            [&["--ranks", "2", "--name", "Digits_1"][..], &image].concat(),
            "--name `Digits_1` cannot name the job",
        ),
        (
            [&["--ranks", "2", "--memory", "lots"][..], &image].concat(),
            "--memory `lots` is not a Kubernetes quantity",
        ),
        (
            [
                &[
                    "--ranks",
                    "2",
                    "--set",
                    "trainer.checkpoint.path=state/train.ckpt",
                ][..],
                &image,
            ]
            .concat(),
            "trainer.checkpoint.path `state/train.ckpt` is not on object storage",
        ),
        (
            [
                &[
                    "--ranks",
                    "2",
                    "--set",
                    "trainer.checkpoint.path=https://example.com/c.ckpt",
                ][..],
                &image,
            ]
            .concat(),
            "trainer.checkpoint.path `https://example.com/c.ckpt` is not on object storage",
        ),
    ];
    for (args, says) in cases {
        let out = k8s(args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}: printed manifests");
    }
    // A job without a checkpoint could not resume once a pod is rescheduled.
    let out = sluice()
        .args(["k8s", "configs/quickstart.yaml", "--ranks", "2"])
        .args(image)
        .current_dir(repo())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("`trainer` has no `checkpoint`"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Data on local disk is allowed (an image or a volume may hold it) with a warning saying
/// where a relative path points in the pods.
#[test]
fn local_data_paths_are_warned_about() {
    let out = k8s(&[
        "--ranks",
        "2",
        "--image",
        "ghcr.io/sluice-dev/sluice:0.1.0",
        "--set",
        "source.path=data/train.parquet",
    ]);
    assert_ok(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("warning: source path `data/train.parquet` is on local disk")
            && err.contains("relative paths resolve against /etc/sluice"),
        "{err}"
    );
    // The override reaches the ranks' command line.
    let yaml = String::from_utf8_lossy(&out.stdout);
    assert!(yaml.contains("- source.path=data/train.parquet"), "{yaml}");
}

/// The job file's `${NAME}`s reach the ranks (`mpirun -x`), each variable once however often
/// it is named; a secret written into the file is warned about (the ConfigMap would show it),
/// as are the `${NAME}`s when no `--secret` would give them to the pods.
#[test]
fn variables_reach_the_ranks_once_and_literal_secrets_are_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    let job = std::fs::read_to_string(repo().join("deploy/k8s/digits.yaml"))
        .unwrap()
        .replace(
            "  columns: [label, pixels]\n",
            "  columns: [label, pixels]\n  storage:\n    options:\n      access_key_id: ${MY_KEY_ID}\n      secret_access_key: literal-secret-value\n",
        );
    assert!(job.contains("${MY_KEY_ID}"));
    std::fs::write(dir.path().join("job.yaml"), job).unwrap();
    let out = sluice()
        .arg("k8s")
        .arg(dir.path().join("job.yaml"))
        .args(["--ranks", "2", "--image", "ghcr.io/sluice-dev/sluice:0.1.0"])
        .args(["--forward-env", "AWS_REGION,MY_KEY_ID,EXTRA_VAR"])
        .env("MY_KEY_ID", "for-the-check-only")
        .output()
        .unwrap();
    assert_ok(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("sets `secret_access_key` in the file") && err.contains("${MY_KEY_ID}"),
        "{err}"
    );
    let yaml = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = yaml.lines().map(str::trim).collect();
    for v in ["AWS_REGION", "MY_KEY_ID", "EXTRA_VAR"] {
        let forwarded = lines
            .windows(2)
            .filter(|w| w[0] == "- -x" && w[1] == format!("- {v}"))
            .count();
        assert_eq!(forwarded, 1, "`-x {v}` once: {yaml}");
    }
    assert!(
        !yaml.contains("for-the-check-only"),
        "a value leaked: {yaml}"
    );
}
