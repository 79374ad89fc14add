//! The examples in `examples/` run and do what their docs say.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::path::PathBuf;

/// The example's binary, built by cargo with this test binary's own features and profile.
///
/// `cargo test` builds the examples but leaves them under hashed names
/// (`target/<profile>/examples/<name>-<hash>`); `cargo build --example` links the plain
/// name. Built with the same features as this test (not the package's defaults), that build
/// finds every unit `cargo test` compiled fresh and only links: with other features it
/// compiled arrow, parquet and every member once more (minutes of CI).
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().unwrap().parent().unwrap();
    let features: Vec<&str> = [
        ("default", cfg!(feature = "default")),
        ("torch", cfg!(feature = "torch")),
        ("mpi", cfg!(feature = "mpi")),
        ("kafka", cfg!(feature = "kafka")),
        ("s3", cfg!(feature = "s3")),
        ("gcs", cfg!(feature = "gcs")),
        ("azure", cfg!(feature = "azure")),
        ("http", cfg!(feature = "http")),
        ("image", cfg!(feature = "image")),
    ]
    .into_iter()
    .filter_map(|(feature, on)| on.then_some(feature))
    .collect();
    let mut build = std::process::Command::new(env!("CARGO"));
    // What cargo set for this test process (CARGO_PKG_NAME, CARGO_MANIFEST_DIR, OUT_DIR...)
    // is not passed on: cargo compares a build script's watched variables with its own
    // environment, and ring's watches these, so with them set it ran again and parquet and
    // every member above it were compiled once more.
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        let set_by_cargo = ["CARGO_PKG_", "CARGO_MANIFEST_", "CARGO_BIN_", "CARGO_CFG_"]
            .iter()
            .any(|prefix| key.starts_with(prefix))
            || [
                "CARGO_CRATE_NAME",
                "CARGO_PRIMARY_PACKAGE",
                "CARGO_TARGET_TMPDIR",
                "OUT_DIR",
            ]
            .contains(&key.as_ref());
        if set_by_cargo {
            build.env_remove(key.as_ref());
        }
    }
    build
        .args(["build", "--example", name, "--no-default-features"])
        .args(["--features", &features.join(",")])
        .current_dir(common::repo());
    if profile_dir.ends_with("release") {
        build.arg("--release");
    }
    assert!(
        build.status().unwrap().success(),
        "cannot build example {name}"
    );
    profile_dir.join("examples").join(name)
}

/// Runs example `name` on `config` (under `configs/`); its stdout, once it succeeded.
fn run_example(name: &str, config: &str) -> String {
    let out = std::process::Command::new(example(name))
        .arg(common::repo().join("configs").join(config))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn stream_example(config: &str) -> String {
    run_example("stream", config)
}

/// Two ranks stopped after 4 batches continue on three: every row of the interrupted epoch
/// (of the two-way split) once, every row of the next once, equal batch counts.
#[test]
fn rescale_example_continues_an_epoch_on_three_ranks_without_losing_a_row() {
    let stdout = run_example("rescale", "digits-augmented.yaml");
    for line in [
        "2 ranks delivered 4 batches each, then stopped",
        // 718 rows per old rank: 12 batches of up to 64, 4 delivered, 8 owed by each.
        "the 16 batches the 2 still owed of epoch 0 are dealt out, 6 per rank",
        "batches per rank after the rescale: [14, 14, 14]",
        // 1436 − 2 × 4 × 64 rows left of epoch 0, then all 1437 of epoch 1; the streams'
        // counters include the share the old ranks' pipelines made.
        "rows delivered 2361, counted by the streams' metrics 2361",
        "epoch 0: 1436 distinct rows delivered, each exactly once: true",
        "epoch 1: 1437 distinct rows delivered, each exactly once: true",
    ] {
        assert!(stdout.contains(line), "{line}\n{stdout}");
    }
}

#[test]
fn stream_example_reads_the_quickstart_pipeline() {
    let stdout = stream_example("quickstart.yaml");
    assert!(
        stdout.contains("23 batches, 1437 rows (1437 read from the source)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("first batch: 64 rows from file:///"),
        "{stdout}"
    );
    assert!(
        stdout.contains("train.parquet row group 0, rows 0..64 (epoch 0)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("resumed after 5 batches: the next batch is 64 rows from file:///")
            && stdout.contains("rows 320..384 (epoch 0); same as uninterrupted: true"),
        "{stdout}"
    );
}

/// The example's resume, on a shuffled, augmented pipeline with mixup: the batch after the
/// snapshot is the uninterrupted run's, bit for bit.
#[test]
fn stream_example_resumes_a_shuffled_augmented_pipeline_exactly() {
    let stdout = stream_example("digits-augmented.yaml");
    assert!(stdout.contains("46 batches, 2874 rows"), "{stdout}");
    assert!(
        stdout.contains(
            "resumed after 5 batches: the next batch is 64 rows from 64 places (shuffled)"
        ) && stdout.contains("same as uninterrupted: true"),
        "{stdout}"
    );
}

/// The hand-written tch training loop on the tensor stream learns: the loss falls epoch by
/// epoch and the test accuracy is far above chance.
#[cfg(feature = "torch")]
#[test]
fn custom_trainer_example_trains_and_the_loss_falls() {
    let out = std::process::Command::new(example("custom_trainer"))
        .env("OMP_NUM_THREADS", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let losses: Vec<f64> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("epoch "))
        .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(losses.len(), 5, "{stdout}");
    assert!(
        losses.windows(2).all(|w| w[1] < w[0]),
        "loss must fall every epoch: {losses:?}"
    );
    assert!(losses[4] < losses[0] * 0.3, "{losses:?}");
    let accuracy: f64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("test accuracy "))
        .and_then(|l| l.split(' ').next())
        .unwrap()
        .parse()
        .unwrap();
    assert!(accuracy > 0.85, "test accuracy {accuracy}");
}
