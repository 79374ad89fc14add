//! Checkpoints written by an older Sluice resume exactly. The fixtures under
//! `tests/fixtures/upgrade/` were written by Sluice 0.1.0 at commit 8f7c57f, before the resume
//! stamp changed its form (see the README there): a shuffled, augmented Parquet `sluice run`
//! killed mid-epoch, and a two-worker `sluice train` killed mid-run. Each is resumed by
//! today's binary and must end exactly where an uninterrupted run of today's binary ends.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;

fn fixture(name: &str) -> PathBuf {
    repo().join("tests/fixtures/upgrade").join(name)
}

/// Copies the fixture `name` into a fresh directory, with `edit` applied to its job.yaml.
fn copy_fixture(name: &str, with_state: bool, edit: impl Fn(&str) -> String) -> tempfile::TempDir {
    fn copy_dir(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(from).unwrap() {
            let e = e.unwrap();
            let target = to.join(e.file_name());
            if e.file_type().unwrap().is_dir() {
                copy_dir(&e.path(), &target);
            } else {
                std::fs::copy(e.path(), target).unwrap();
            }
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let from = fixture(name);
    copy_dir(&from.join("data"), &dir.path().join("data"));
    if with_state {
        copy_dir(&from.join("state"), &dir.path().join("state"));
        if from.join("out").exists() {
            copy_dir(&from.join("out"), &dir.path().join("out"));
        }
    }
    let job = std::fs::read_to_string(from.join("job.yaml")).unwrap();
    std::fs::write(dir.path().join("job.yaml"), edit(&job)).unwrap();
    dir
}

#[test]
fn a_shuffled_augmented_run_checkpoint_from_0_1_0_resumes_exactly() {
    let two_epochs = |job: &str| job.replace("epochs: 1000", "epochs: 2");
    let reference = copy_fixture("run-shuffled", false, two_epochs);
    assert_ok(&run_in_for(
        reference.path(),
        &["run", "job.yaml", "--no-report"],
        Duration::from_secs(300),
    ));
    let want = parts_in_order(&reference.path().join("out"));
    // 6,000 rows an epoch, those with id % 7 = 3 filtered out.
    let kept = (0..6000).filter(|i| i % 7 != 3).count();
    assert_eq!(want.len(), 2 * kept);

    let resumed = copy_fixture("run-shuffled", true, two_epochs);
    let out = run_in_for(
        resumed.path(),
        &["run", "job.yaml", "--resume", "--no-report"],
        Duration::from_secs(300),
    );
    assert_ok(&out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("2800 rows written before this run"),
        "{stdout}"
    );
    let got = parts_in_order(&resumed.path().join("out"));
    assert_eq!(got.len(), want.len());
    assert!(
        got == want,
        "the run resumed from 0.1.0's checkpoint differs from an uninterrupted run"
    );
}

#[cfg(feature = "torch")]
#[test]
fn a_two_worker_training_checkpoint_from_0_1_0_resumes_to_the_same_parameters() {
    let three_epochs = |job: &str| job.replace("epochs: 1000", "epochs: 3");
    let reference = copy_fixture("train", false, three_epochs);
    assert_ok(&run_in_for(
        reference.path(),
        &["train", "job.yaml", "--no-report"],
        Duration::from_secs(300),
    ));
    let (want_meta, want) =
        read_train_checkpoint(&reference.path().join("state/train.ckpt")).unwrap();

    let resumed = copy_fixture("train", true, three_epochs);
    let (before, _) = read_train_checkpoint(&resumed.path().join("state/train.ckpt")).unwrap();
    assert_eq!((before.step, before.rows_trained), (40, 2524));
    let out = run_in_for(
        resumed.path(),
        &["train", "job.yaml", "--resume", "--no-report"],
        Duration::from_secs(300),
    );
    assert_ok(&out);
    let (got_meta, got) = read_train_checkpoint(&resumed.path().join("state/train.ckpt")).unwrap();
    assert_eq!(
        (got_meta.step, got_meta.rows_trained),
        (want_meta.step, want_meta.rows_trained)
    );
    // Three epochs of 1,437 rows, but for the last uneven batches (a rank that runs out
    // first ends the run for both).
    assert!(want_meta.rows_trained > 4_300, "{}", want_meta.rows_trained);
    assert_same_parameters(&got, &want, "an uninterrupted run");
}

/// A state written by today's Sluice keeps each stamped stage's effective settings as JSON. A
/// later Sluice that adds a defaulted field to a stage reads such a state without that field:
/// simulated here by removing `seed` (at its default, 0) from the stamp, the state resumes
/// exactly. A stamped value that differs is refused, naming the field.
#[test]
fn a_state_without_a_field_added_later_resumes_and_a_changed_field_is_named() {
    let job = |epochs: u64| {
        format!(
            "source: {{type: parquet, path: data/*.parquet, columns: [id, x], batch_rows: 100, epochs: {epochs}}}\n\
             stages:\n\
             - {{type: gaussian_noise, columns: [x], std: 0.5}}\n\
             - {{type: shuffle, buffer_rows: 1000, seed: 9, batch_rows: 128}}\n\
             - {{type: batch, size: 50}}\n\
             checkpoint: {{path: state/cp.json, interval: 1h, every_batches: 4}}\n\
             sink: {{type: parquet, path: out, max_rows_per_file: 500}}\n"
        )
    };
    let reference = copy_fixture("run-shuffled", false, |_| job(4));
    assert_ok(&run_in_for(
        reference.path(),
        &["run", "job.yaml", "--no-report"],
        Duration::from_secs(300),
    ));
    let want = parts_in_order(&reference.path().join("out"));
    assert_eq!(want.len(), 24_000);

    // A run of today's binary, killed once its checkpoint covers some rows.
    let dir = copy_fixture("run-shuffled", false, |_| job(1000));
    let mut child = spawn_sluice(dir.path(), &["run", "job.yaml", "--no-report"]);
    let cp = dir.path().join("state/cp.json");
    let read_cp =
        || -> Option<serde_json::Value> { serde_json::from_slice(&std::fs::read(&cp).ok()?).ok() };
    wait_for("a checkpoint", Duration::from_secs(120), || {
        read_cp().filter(|c| c["rows_written"].as_u64() > Some(1_000))
    });
    child.kill().unwrap();
    child.wait().unwrap();
    let state = read_cp().unwrap();
    let key = "stages[0] (gaussian_noise)";
    let plan = &state["source"]["plan"];
    assert_eq!(plan["form"], 2, "{state}");
    let stamped: serde_json::Value =
        serde_json::from_str(plan["order"][key].as_str().unwrap()).unwrap();
    assert_eq!(
        stamped,
        serde_json::json!({"columns": ["x"], "std": 0.5, "seed": 0})
    );
    let with_stamp = |settings: serde_json::Value| {
        let mut s = state.clone();
        s["source"]["plan"]["order"][key] = settings.to_string().into();
        std::fs::write(&cp, serde_json::to_vec_pretty(&s).unwrap()).unwrap();
    };
    let covered = state["rows_written"].as_u64().unwrap();
    assert!(
        covered < 24_000,
        "killed after 4 epochs ({covered} rows): the machine was too fast for this test's window"
    );
    std::fs::write(dir.path().join("job.yaml"), job(4)).unwrap();

    // Another `std` then: refused, naming it, and nothing is written.
    with_stamp(serde_json::json!({"columns": ["x"], "std": 0.25}));
    let out = run_in_for(
        dir.path(),
        &["run", "job.yaml", "--resume", "--no-report"],
        Duration::from_secs(300),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("stages[0] (gaussian_noise): std 0.25 then, std 0.5 now"),
        "{stderr}"
    );

    // Without `seed` (as a Sluice before the field would have written it): resumes exactly.
    with_stamp(serde_json::json!({"columns": ["x"], "std": 0.5}));
    let out = run_in_for(
        dir.path(),
        &["run", "job.yaml", "--resume", "--no-report"],
        Duration::from_secs(300),
    );
    assert_ok(&out);
    let got = parts_in_order(&dir.path().join("out"));
    assert_eq!(got.len(), want.len());
    assert!(
        got == want,
        "the resumed run differs from an uninterrupted run"
    );
}
