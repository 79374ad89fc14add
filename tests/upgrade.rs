//! Checkpoints written by an older Sluice resume exactly. The fixtures under
//! `tests/fixtures/upgrade/` were written by Sluice 0.1.0 at commit 8f7c57f, before the resume
//! stamp changed its form (see the README there): a shuffled, augmented Parquet `sluice run`
//! killed mid-epoch, a two-worker `sluice train` killed mid-run, and a shuffled Kafka `static`
//! stream killed inside a shuffle window. Each is resumed by today's binary and must end
//! exactly where an uninterrupted run of today's binary ends, drawing its augmentations as
//! 0.1.0 did (`runtime.draws: 1`; the resumed runs keep that version from the state, which
//! does not name one) — for Kafka: every record once, the open window finished first.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;

fn fixture(name: &str) -> PathBuf {
    repo().join("tests/fixtures/upgrade").join(name)
}

/// Copies the directory `from` to `to`, recursively.
fn copy_data(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_data(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), target).unwrap();
        }
    }
}

/// Copies the fixture `name` into a fresh directory, with `edit` applied to its job.yaml.
fn copy_fixture(name: &str, with_state: bool, edit: impl Fn(&str) -> String) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let from = fixture(name);
    if from.join("data").exists() {
        copy_data(&from.join("data"), &dir.path().join("data"));
    }
    if with_state {
        copy_data(&from.join("state"), &dir.path().join("state"));
        if from.join("out").exists() {
            copy_data(&from.join("out"), &dir.path().join("out"));
        }
    }
    let job = std::fs::read_to_string(from.join("job.yaml")).unwrap();
    std::fs::write(dir.path().join("job.yaml"), edit(&job)).unwrap();
    dir
}

/// `job` drawing its augmentations as Sluice 0.1.0 did (`runtime.draws: 1`, ChaCha8): the
/// uninterrupted reference runs. The resumed copies do not say so — a state without a draws
/// version must keep drawing that way by itself.
fn drawn_as_0_1_0(job: &str) -> String {
    drawn_with(1, job)
}

/// `job` with `runtime.draws: version`.
fn drawn_with(version: u32, job: &str) -> String {
    match job.contains("runtime: {") {
        true => job.replace("runtime: {", &format!("runtime: {{draws: {version}, ")),
        false => format!("{job}\nruntime: {{draws: {version}}}\n"),
    }
}

/// The part files, in order, of an uninterrupted `sluice run` of the fixture `name` (without
/// its state), with `edit` applied to its job.yaml.
fn uninterrupted_parts(name: &str, edit: impl Fn(&str) -> String) -> Vec<(i64, u32)> {
    let reference = copy_fixture(name, false, edit);
    assert_ok(&run_in_for(
        reference.path(),
        &["run", "job.yaml", "--no-report"],
        Duration::from_secs(300),
    ));
    parts_in_order(&reference.path().join("out"))
}

/// `sluice run job.yaml --resume` in `dir`, which must succeed saying that `before` rows were
/// written before it; the part files it leaves, in order.
fn resume_run(dir: &Path, before: u64) -> Vec<(i64, u32)> {
    let out = run_in_for(
        dir,
        &["run", "job.yaml", "--resume", "--no-report"],
        Duration::from_secs(300),
    );
    assert_ok(&out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!("{before} rows written before this run")),
        "{stdout}"
    );
    parts_in_order(&dir.join("out"))
}

#[test]
fn a_shuffled_augmented_run_checkpoint_from_0_1_0_resumes_exactly() {
    let two_epochs = |job: &str| job.replace("epochs: 1000", "epochs: 2");
    let want = uninterrupted_parts("run-shuffled", |j| drawn_as_0_1_0(&two_epochs(j)));
    // 6,000 rows an epoch, those with id % 7 = 3 filtered out.
    let kept = (0..6000).filter(|i| i % 7 != 3).count();
    assert_eq!(want.len(), 2 * kept);

    let resumed = copy_fixture("run-shuffled", true, two_epochs);
    let got = resume_run(resumed.path(), 2800);
    assert_eq!(got.len(), want.len());
    assert!(
        got == want,
        "the run resumed from 0.1.0's checkpoint differs from an uninterrupted run"
    );
}

/// A checkpoint of draws version 2 (`run-shuffled-draws2/`: the same job, written at
/// `b30a9b4`, killed inside a shuffle window of epoch 1) resumes exactly: its parts, written
/// before the kill with `gaussian_noise` on SplitMix64, and the resumed run's equal an
/// uninterrupted run of today's binary drawing with version 2 (`runtime.draws: 2`; the
/// resumed copy does not say so: its state does). Fails if version 2's draws ever change.
#[test]
fn a_draws_version_2_checkpoint_resumes_exactly() {
    let two_epochs = |job: &str| job.replace("epochs: 1000", "epochs: 2");
    let want = uninterrupted_parts("run-shuffled", |j| drawn_with(2, &two_epochs(j)));

    let resumed = copy_fixture("run-shuffled-draws2", true, two_epochs);
    copy_data(
        &fixture("run-shuffled").join("data"),
        &resumed.path().join("data"),
    );
    let state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(resumed.path().join("state/cp.json")).unwrap())
            .unwrap();
    assert_eq!(state["source"]["draws"], 2, "{state}");
    let got = resume_run(resumed.path(), 8793);
    assert_eq!(got.len(), want.len());
    assert!(
        got == want,
        "the run resumed from a draws-2 checkpoint differs from an uninterrupted run"
    );
}

/// A state of 0.1.0 (drawn with ChaCha8) resumed under `runtime.draws: 2` is refused, naming
/// both versions, before anything is written.
#[test]
fn a_0_1_0_checkpoint_resumed_with_other_draws_is_refused() {
    let resumed = copy_fixture("run-shuffled", true, |j| {
        j.replace("runtime: {", "runtime: {draws: 2, ")
    });
    let parts = std::fs::read_dir(resumed.path().join("out"))
        .unwrap()
        .count();
    let out = run_in_for(
        resumed.path(),
        &["run", "job.yaml", "--resume", "--no-report"],
        Duration::from_secs(120),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("drew with version 1 and `runtime.draws` asks for 2"),
        "{stderr}"
    );
    let now = std::fs::read_dir(resumed.path().join("out"))
        .unwrap()
        .count();
    assert_eq!(now, parts, "a refused resume wrote parts");
}

#[cfg(feature = "torch")]
#[test]
fn a_two_worker_training_checkpoint_from_0_1_0_resumes_to_the_same_parameters() {
    let three_epochs = |job: &str| job.replace("epochs: 1000", "epochs: 3");
    let reference = copy_fixture("train", false, |j| drawn_as_0_1_0(&three_epochs(j)));
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
    // The same rows and steps (above), and the same parameters up to float rounding: the
    // fixture's first 40 steps ran on the CPU that wrote it, and libtorch's CPU kernels (MKL's
    // sgemm among them) pick their code paths by CPU, so another CPU rounds some sums
    // differently (seen: an AMD EPYC without AVX-512 ends within 5e-8, relative, of its own
    // uninterrupted run). A batch trained twice, skipped or reordered moves them far more.
    assert_close_parameters(&got, &want, 1e-6, "an uninterrupted run");
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
    let want = uninterrupted_parts("run-shuffled", |_| job(4));
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

/// The topic of the `kafka-static` fixture: ids `0..8000` round-robin over 4 partitions (id
/// `i` in partition `i % 4` at offset `i / 4`), each `{"id": i, "x": sin(0.37·i)}`.
#[cfg(feature = "kafka")]
fn kafka_fixture_topic() {
    let records = (0..8000i64)
        .map(|i| {
            let x = (0.37 * i as f64).sin() as f32;
            (
                (i % 4) as i32,
                format!(r#"{{"id": {i}, "x": {x}}}"#).into_bytes(),
            )
        })
        .collect();
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(common::kafka::fixed_topic(
            &common::kafka::brokers(),
            "sluice-upgrade-static-0-1-0",
            4,
            records,
        ));
}

/// A Kafka `static` checkpoint of 0.1.0 — a shuffled, augmented stream killed inside a
/// shuffle window — resumes exactly: the window is finished with exactly the rows it had not
/// emitted, then the stream goes on; every record is written once, with the noise an
/// uninterrupted run of today's binary gives it (drawing as 0.1.0 did). (0.1.0 took the partitions' turns by timing,
/// so the order of later windows is today's, not comparable with 0.1.0's.)
#[cfg(feature = "kafka")]
#[test]
fn a_kafka_static_checkpoint_from_0_1_0_resumes_exactly() {
    use std::collections::{BTreeMap, BTreeSet};
    kafka_fixture_topic();
    let same = |job: &str| job.to_string();
    let reference_rows = uninterrupted_parts("kafka-static", drawn_as_0_1_0);
    assert_eq!(reference_rows.len(), 8000);
    let want: BTreeMap<i64, u32> = reference_rows.into_iter().collect();
    assert_eq!(want.len(), 8000, "the uninterrupted run wrote an id twice");

    let resumed = copy_fixture("kafka-static", true, same);
    let before = parts_in_order(&resumed.path().join("out"));
    let state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(resumed.path().join("state/cp.json")).unwrap())
            .unwrap();
    assert_eq!(state["rows_written"], 3250, "{state}");
    assert_eq!(before.len(), 3250);
    let got = resume_run(resumed.path(), 3250);
    assert_eq!(
        &got[..before.len()],
        &before[..],
        "0.1.0's parts were changed"
    );

    // Every record once, with its own noise.
    let ids: Vec<i64> = got.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids.iter().copied().collect::<BTreeSet<_>>().len(), 8000);
    assert_eq!(ids.len(), 8000);
    for (id, x) in &got {
        assert_eq!(
            want[id], *x,
            "id {id}: other noise than an uninterrupted run's"
        );
    }

    // The open window (records `starts..offset` of each partition, id = offset · 4 +
    // partition) is finished first: its 750 rows not yet emitted, and no other.
    let window = &state["source"]["kafka_shuffle"];
    assert_eq!(
        (window["rows"].as_u64(), window["emitted"].as_u64()),
        (Some(2000), Some(1250))
    );
    let topic = "sluice-upgrade-static-0-1-0";
    let mut in_window = BTreeSet::new();
    for p in 0..4i64 {
        let key = p.to_string();
        let from = window["starts"][topic][&key]["offset"].as_i64().unwrap();
        let to = state["source"]["kafka"][topic][&key]["offset"]
            .as_i64()
            .unwrap();
        in_window.extend((from..to).map(|o| o * 4 + p));
    }
    let emitted: BTreeSet<i64> = before[2000..].iter().map(|(id, _)| *id).collect();
    let finished: BTreeSet<i64> = got[3250..4000].iter().map(|(id, _)| *id).collect();
    assert_eq!(in_window.len(), 2000);
    assert!(
        emitted.is_subset(&in_window),
        "0.1.0's emitted rows lie outside its open window (fixture)"
    );
    assert_eq!(
        finished,
        in_window
            .difference(&emitted)
            .copied()
            .collect::<BTreeSet<_>>(),
        "the resumed run did not finish 0.1.0's open shuffle window first"
    );
}
