//! The examples in `examples/` run and do what their docs say.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::PathBuf;

/// The example's binary. `cargo test` builds examples into `target/<profile>/examples`; when
/// only this test target was built (`cargo test --test example`), build the example first.
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().unwrap().parent().unwrap();
    let path = profile_dir.join("examples").join(name);
    if !path.exists() {
        let mut build = std::process::Command::new(env!("CARGO"));
        build
            .args(["build", "--example", name])
            .current_dir(common::repo());
        if profile_dir.ends_with("release") {
            build.arg("--release");
        }
        assert!(
            build.status().unwrap().success(),
            "cannot build example {name}"
        );
    }
    path
}

#[test]
fn stream_example_reads_the_quickstart_pipeline() {
    let out = std::process::Command::new(example("stream"))
        .arg(common::repo().join("configs/quickstart.yaml"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
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
}
