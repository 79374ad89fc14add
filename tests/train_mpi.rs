//! `mpirun -np 2 sluice train` with the `mpi` backend: the quickstart config reaches the
//! same accuracy as with local workers, and the ranks' parameters stay identical (checked
//! by the trainer every 100 steps and at the end; a mismatch fails the run).
#![cfg(feature = "mpi")]
#![allow(clippy::unwrap_used)]

use crate::common;

use common::*;

#[test]
fn mpirun_two_ranks_train_the_quickstart() {
    let out = tempfile::tempdir().unwrap();
    let summary = out.path().join("train.json");
    let output = std::process::Command::new("mpirun")
        .args(["-np", "2"])
        .arg(assert_cmd::cargo::cargo_bin!("sluice"))
        .arg("train")
        .arg(repo().join("configs/quickstart.yaml"))
        .args(["--backend", "mpi", "--summary-json"])
        .arg(&summary)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_rmaps_base_oversubscribe", "1")
        .current_dir(out.path())
        .output()
        .unwrap();
    assert_ok(&output);
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&summary).unwrap()).unwrap();
    assert_eq!(r["rank"], 0);
    assert_eq!(r["world_size"], 2);
    assert_eq!(r["rows_trained"], 718 * 2 * 20);
    let eval = r["evals"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(eval["rows"], 360);
    let acc = eval["accuracy"].as_f64().unwrap();
    assert!(acc >= 0.95, "test accuracy {acc}");
}
