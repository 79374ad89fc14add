//! `sluice sweep` on the digits: ASHA stops weak trials early (fewer steps in all than every
//! trial run to its end) and reports the best; a sweep SIGKILLed mid-way and started again
//! does not run its finished trials again.
#![cfg(feature = "torch")]
#![allow(clippy::unwrap_used)]

use crate::common;

use std::time::Duration;

use common::*;

/// A digits job (one worker) of `epochs` epochs: 23 steps each (1,437 rows, batches of 64).
fn job(dir: &std::path::Path, epochs: u64) {
    let d = repo().join("data/digits");
    std::fs::write(
        dir.join("job.yaml"),
        format!(
            "source: {{type: parquet, path: '{d}/train.parquet', columns: [label, pixels], batch_rows: 100}}
stages:
  - {{type: cast, columns: {{pixels: float32}}}}
  - {{type: standardize, columns: [pixels]}}
  - {{type: shuffle, buffer_rows: 300, seed: 5}}
  - {{type: batch, size: 64}}
runtime: {{threads: 1}}
loader:
  tensors:
    x: {{column: pixels, dtype: f32}}
    y: {{column: label, dtype: i64}}
trainer:
  model: {{type: mlp, hidden: [32], outputs: 10}}
  optimizer: {{type: sgd, lr: 0.05}}
  epochs: {epochs}
  eval: {{path: '{d}/test.parquet'}}
  allreduce: {{workers: 1}}
",
            d = d.display()
        ),
    )
    .unwrap();
}

fn state(dir: &std::path::Path) -> Option<serde_json::Value> {
    serde_json::from_slice(&std::fs::read(dir.join("out/sweep.json")).ok()?).ok()
}

fn statuses(s: &serde_json::Value) -> Vec<String> {
    s["trials"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["status"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn asha_stops_weak_trials_early_and_reports_the_best() {
    let dir = tempfile::tempdir().unwrap();
    job(dir.path(), 8); // 8 × 23 = 184 steps a trial
    std::fs::write(
        dir.path().join("space.yaml"),
        "metric: {name: accuracy, mode: max}
parameters:
  trainer.optimizer.lr: {type: loguniform, low: 0.0001, high: 0.5}
seed: 1
scheduler: {type: asha, min_steps: 6, reduction: 2}
",
    )
    .unwrap();
    let out = run_in_for(
        dir.path(),
        &[
            "sweep",
            "job.yaml",
            "--space",
            "space.yaml",
            "--trials",
            "8",
            "--parallel",
            "2",
            "--dir",
            "out",
        ],
        Duration::from_secs(600),
    );
    assert_ok(&out);
    let s = state(dir.path()).unwrap();
    let st = statuses(&s);
    assert_eq!(st.len(), 8);
    assert!(
        st.iter().any(|x| x == "stopped"),
        "ASHA stopped none: {st:?}"
    );
    assert!(st.iter().all(|x| x == "stopped" || x == "done"), "{st:?}");
    let total: u64 = s["trials"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["steps"].as_u64().unwrap())
        .sum();
    assert!(
        total < 8 * 184,
        "{total} steps: no fewer than 8 full trials"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("best: trial"), "{stdout}");
    let best = std::fs::read_to_string(dir.path().join("out/best.yaml")).unwrap();
    assert!(best.starts_with("trainer.optimizer.lr: "), "{best}");
    // The best trial's accuracy is the table's highest among finished trials.
    let best_acc = s["trials"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["status"] == "done")
        .map(|t| {
            t["evals"].as_array().unwrap().last().unwrap()[1]
                .as_f64()
                .unwrap()
        })
        .fold(0.0, f64::max);
    assert!(best_acc > 0.8, "the best learning rate trains: {best_acc}");
    assert!(stdout.contains(&format!("{best_acc:.4}")), "{stdout}");
}

#[test]
fn a_sigkilled_sweep_goes_on_without_rerunning_finished_trials() {
    let dir = tempfile::tempdir().unwrap();
    job(dir.path(), 6);
    std::fs::write(
        dir.path().join("space.yaml"),
        "metric: {name: loss, mode: min}
parameters:
  trainer.optimizer.lr: {type: uniform, low: 0.01, high: 0.2}
",
    )
    .unwrap();
    let args = [
        "sweep",
        "job.yaml",
        "--space",
        "space.yaml",
        "--trials",
        "5",
        "--dir",
        "out",
    ];
    let mut child = spawn_sluice(dir.path(), &args);
    let finished = wait_for("two finished trials", Duration::from_secs(300), || {
        state(dir.path()).filter(|s| statuses(s).iter().filter(|x| *x == "done").count() >= 2)
    });
    child.kill().unwrap(); // SIGKILL: the sweep cannot save anything more
    child.wait().unwrap();
    let at_kill = state(dir.path()).unwrap();
    assert!(
        statuses(&at_kill).iter().any(|x| x != "done"),
        "the sweep had finished when it was killed: the machine was too fast for this test's window"
    );
    let done: Vec<usize> = statuses(&finished)
        .iter()
        .enumerate()
        .filter(|(_, x)| *x == "done")
        .map(|(i, _)| i)
        .collect();
    let stamp = |i: usize| {
        let log = dir.path().join(format!("out/trial-{i:04}/steps.jsonl"));
        std::fs::metadata(log).unwrap().modified().unwrap()
    };
    let before: Vec<_> = done.iter().map(|&i| stamp(i)).collect();
    let out = run_in_for(dir.path(), &args, Duration::from_secs(600));
    assert_ok(&out);
    let s = state(dir.path()).unwrap();
    assert_eq!(statuses(&s), vec!["done"; 5]);
    let after: Vec<_> = done.iter().map(|&i| stamp(i)).collect();
    assert_eq!(
        before, after,
        "trials {done:?} finished before the kill were not run again"
    );
    for (i, t) in s["trials"].as_array().unwrap().iter().enumerate() {
        assert_eq!(t["id"], i as u64);
        assert_eq!(t["steps"], 6 * 23, "trial {i} ran to its end once");
    }
}

/// examples/optuna.sh, the documented recipe, against real Optuna (its ask/tell CLI and a
/// SQLite study): every trial's accuracy is told back, and Optuna's best is the best told.
#[test]
fn the_optuna_recipe_drives_sluice_train_through_ask_and_tell() {
    let python = common::venv_python();
    let bin = std::path::Path::new(&python)
        .parent()
        .unwrap()
        .to_path_buf();
    let dir = tempfile::tempdir().unwrap();
    job(dir.path(), 2);
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = std::process::Command::new("bash")
        .arg(repo().join("examples/optuna.sh"))
        .args(["job.yaml", "3", "sqlite:///study.db"])
        .env("PATH", path)
        .env("SLUICE", assert_cmd::cargo::cargo_bin!("sluice"))
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout.matches(" -> accuracy ").count(), 3, "{stdout}");
    let best: serde_json::Value =
        serde_json::from_str(stdout.lines().skip(3).collect::<String>().trim()).unwrap();
    // Optuna's first trials are random draws: the best is the best told, whatever it is.
    let told: Vec<f64> = stdout
        .lines()
        .filter_map(|l| l.split(" -> accuracy ").nth(1))
        .map(|a| a.trim().parse().unwrap())
        .collect();
    let most = told.iter().copied().fold(f64::MIN, f64::max);
    // (SQLite may give the last bit of a double back changed.)
    let value = best["value"].as_f64().unwrap();
    assert!((value - most).abs() < 1e-12, "{best} vs {most}");
    assert_eq!(best["state"], "COMPLETE");
    assert!(best["params"]["lr"].as_f64().is_some(), "{best}");
    assert!(most > 0.1, "an accuracy, not a placeholder: {told:?}");
}
