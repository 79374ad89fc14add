//! `sluice train`: the quickstart reaches its accuracy with two workers, a SIGKILLed run
//! resumes to bitwise the same parameters, and bad trainer configs are explained.
#![cfg(feature = "torch")]
#![allow(clippy::unwrap_used)]

use crate::common;

use std::time::Duration;

use common::*;

#[test]
fn quickstart_trains_to_95_percent_with_two_workers() {
    let out = tempfile::tempdir().unwrap();
    let summary = out.path().join("train.json");
    let output = run_in_for(
        out.path(),
        &[
            "train",
            repo().join("configs/quickstart.yaml").to_str().unwrap(),
            "--summary-json",
            summary.to_str().unwrap(),
        ],
        Duration::from_secs(300),
    );
    assert_ok(&output);
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&summary).unwrap()).unwrap();
    assert_eq!(r["world_size"], 2);
    // 1437 rows: each rank gets 718 per epoch (one row per epoch cannot be split evenly),
    // 20 epochs, batches of 64 per rank; each epoch ends with a short batch (718 = 11 × 64
    // + 14): 12 steps per epoch.
    assert_eq!(r["rows_trained"], 718 * 2 * 20);
    assert_eq!(r["steps"], 20 * 718u64.div_ceil(64));
    assert_eq!(r["rows_untrained"], 0);
    // Every rank's stall, and the slowest one's (what the all-reduce waits for).
    let per_rank: Vec<f64> = r["data_stall_per_rank"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(per_rank.len(), 2);
    assert!(
        per_rank.iter().all(|s| (0.0..=1.0).contains(s)),
        "{per_rank:?}"
    );
    assert_eq!(
        r["data_stall_max"].as_f64().unwrap(),
        per_rank.iter().copied().fold(0.0, f64::max)
    );
    assert_eq!(
        r["data_stall_fraction"].as_f64().unwrap(),
        per_rank[0],
        "rank 0's"
    );
    // Rank 0's loader readiness: a share of its batches after the first.
    let ready = r["data_readiness"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&ready), "{ready}");
    // The loader's own threads took some CPU, a share of the host's (not the training's).
    let loader = r["loader_cpu_seconds"].as_f64().unwrap();
    let share = r["loader_host_cpu_share"].as_f64().unwrap();
    assert!(
        loader > 0.0 && share > 0.0 && share <= 1.0,
        "{loader} s, {share}"
    );
    let eval = r["evals"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(eval["rows"], 360, "the whole test split, each row once");
    let acc = eval["accuracy"].as_f64().unwrap();
    assert!(acc >= 0.95, "test accuracy {acc}");
    // The process's own peak (VmHWM): libtorch, two workers' models, the pipelines.
    let rss = r["peak_rss_bytes"].as_u64().unwrap();
    assert!((50 << 20..4 << 30).contains(&rss), "peak RSS {rss} bytes");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("eval     accuracy")
            && stdout.contains("data     ready ")
            && stdout.contains("% of batches, stall")
            && stdout.contains("data     per rank: ")
            && stdout.contains("CPU-s on its own threads: "),
        "{stdout}"
    );
}

/// libtorch's OpenMP threads sleep when idle unless the user chose otherwise: `sluice train`
/// restarts itself with `OMP_WAIT_POLICY=PASSIVE` (OpenMP reads it only when loaded) and the
/// summary says so; a policy the user set is kept and reported.
#[test]
fn libtorch_threads_sleep_when_idle_unless_the_user_chose_a_policy() {
    let t = tempfile::tempdir().unwrap();
    std::fs::write(
        t.path().join("job.yaml"),
        job(3).replace("state/train.ckpt", "a.ckpt"),
    )
    .unwrap();
    let summary = |policy: Option<&str>| {
        let mut cmd = sluice();
        cmd.args(["train", "job.yaml"]).current_dir(t.path());
        cmd.env_remove("OMP_WAIT_POLICY");
        if let Some(p) = policy {
            cmd.env("OMP_WAIT_POLICY", p);
        }
        let _ = std::fs::remove_file(t.path().join("a.ckpt"));
        let out = cmd.timeout(Duration::from_secs(120)).output().unwrap();
        assert_ok(&out);
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let chosen = summary(None);
    assert!(
        chosen.contains("its OpenMP threads sleep when idle (OMP_WAIT_POLICY=PASSIVE)"),
        "{chosen}"
    );
    let kept = summary(Some("active"));
    assert!(
        kept.contains("its OpenMP threads follow your OMP_WAIT_POLICY=ACTIVE"),
        "{kept}"
    );
}

/// A cosine schedule on one worker, without computed statistics (nothing opened every file
/// before the run): the run's length is counted from the Parquet footers, as the docs say
/// (it was refused: "this source does not tell the run's length ahead").
#[test]
fn a_cosine_schedule_on_one_worker_counts_the_runs_length() {
    let t = tempfile::tempdir().unwrap();
    let data = repo().join("data/digits");
    std::fs::write(
        t.path().join("job.yaml"),
        format!(
            "source: {{type: parquet, path: '{}/train.parquet', columns: [label, pixels]}}
stages: [{{type: cast, columns: {{pixels: float32}}}}, {{type: batch, size: 32}}]
loader:
  tensors:
    x: {{column: pixels, dtype: f32}}
    y: {{column: label, dtype: i64}}
trainer:
  model: {{type: mlp, hidden: [16], outputs: 10}}
  optimizer: {{type: sgd, lr: 0.01}}
  schedule: {{decay: cosine}}
  epochs: 2
  allreduce: {{workers: 1}}
",
            data.display()
        ),
    )
    .unwrap();
    let out = run_in_for(
        t.path(),
        &["train", "job.yaml", "--summary-json", "s.json"],
        Duration::from_secs(120),
    );
    assert_ok(&out);
    let r: serde_json::Value =
        serde_json::from_slice(&std::fs::read(t.path().join("s.json")).unwrap()).unwrap();
    // 1437 rows an epoch in batches of 32: 45 steps, twice.
    assert_eq!(r["total_steps"], 90);
    assert_eq!(r["steps"], 90);
}

/// Digits with a cross-rank shuffle, SGD with momentum and weight decay, 2 workers, a
/// checkpoint every 10 steps; `steps` ends the run.
fn job(steps: u64) -> String {
    job_for(100_000, steps)
}

/// [`job`] over `epochs` epochs.
pub(crate) fn job_for(epochs: u64, steps: u64) -> String {
    let data = repo().join("data/digits");
    format!(
        "source: {{type: parquet, path: '{}/train.parquet', columns: [label, pixels], batch_rows: 100}}
stages:
  - {{type: cast, columns: {{pixels: float32}}}}
  - {{type: standardize, columns: [pixels]}}
  - {{type: shuffle, buffer_rows: 300, seed: 5, across_ranks: true}}
  - {{type: batch, size: 32}}
runtime: {{threads: 1}}
loader:
  tensors:
    x: {{column: pixels, dtype: f32}}
    y: {{column: label, dtype: i64}}
trainer:
  model: {{type: mlp, hidden: [32], outputs: 10}}
  optimizer: {{type: sgd, lr: 0.05, momentum: 0.9, weight_decay: 0.001}}
  epochs: {epochs}
  steps: {steps}
  allreduce: {{workers: 2, bucket_mb: 0.001}}
  checkpoint: {{path: state/train.ckpt, every_steps: 10}}
  check_every_steps: 10
",
        data.display()
    )
}

#[test]
fn sigkilled_training_resumes_to_bitwise_the_same_parameters() {
    const STEPS: u64 = 400;
    // The uninterrupted reference.
    let reference = tempfile::tempdir().unwrap();
    std::fs::write(reference.path().join("job.yaml"), job(STEPS)).unwrap();
    assert_ok(&run_in_for(
        reference.path(),
        &["train", "job.yaml"],
        Duration::from_secs(300),
    ));
    let (ref_meta, ref_params) =
        read_train_checkpoint(&reference.path().join("state/train.ckpt")).unwrap();
    assert_eq!(ref_meta.step, STEPS);
    assert!(ref_meta.complete);

    // Run 1 would go on for a million steps: it is surely running when killed, right after
    // its first checkpoints.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("job.yaml"), job(1_000_000)).unwrap();
    let ckpt = dir.path().join("state/train.ckpt");
    let (at_kill, _) = train_killed_past(dir.path(), 20);
    assert!(!at_kill.complete);
    assert!(
        at_kill.step < STEPS && at_kill.step % 10 == 0,
        "killed at step {}: the machine was too fast for this test's window",
        at_kill.step
    );
    assert!(
        at_kill
            .pipeline
            .iter()
            .all(|s| s.parquet.is_some_and(|m| m.shuffle.is_some()))
    );

    // Run 2: the reference's config, resumed from run 1's checkpoint.
    std::fs::write(dir.path().join("job.yaml"), job(STEPS)).unwrap();
    let out = run_in_for(
        dir.path(),
        &["train", "job.yaml", "--resume"],
        Duration::from_secs(300),
    );
    assert_ok(&out);
    let (meta, params) = read_train_checkpoint(&ckpt).unwrap();
    assert_eq!(meta.step, STEPS);
    assert_eq!(
        meta.rows_trained, ref_meta.rows_trained,
        "every row trained exactly as often"
    );
    assert_eq!(
        meta.pipeline, ref_meta.pipeline,
        "the data streams end at the same positions"
    );
    assert_same_parameters(
        &params,
        &ref_params,
        &format!("the uninterrupted run (resumed at step {})", at_kill.step),
    );

    // Without --resume, an existing checkpoint is an error, not silently overwritten.
    let again = run_in_for(dir.path(), &["train", "job.yaml"], Duration::from_secs(60));
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("--resume"));
}

/// A finished run trained more epochs: raising `epochs` and resuming its complete
/// checkpoint continues with the next epoch, to bitwise the parameters of a run that had the
/// larger `epochs` from the start. Resuming again with nothing more to do says so.
#[test]
fn a_finished_run_resumed_with_more_epochs_trains_exactly_the_longer_run() {
    let reference = tempfile::tempdir().unwrap();
    std::fs::write(reference.path().join("job.yaml"), job_for(2, 100_000)).unwrap();
    let (longer, _) = train_summary(reference.path(), &["job.yaml"]);
    let (ref_meta, ref_params) =
        read_train_checkpoint(&reference.path().join("state/train.ckpt")).unwrap();

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("job.yaml"), job_for(1, 100_000)).unwrap();
    let (first, _) = train_summary(dir.path(), &["job.yaml"]);
    assert!(first["steps"].as_u64().unwrap() * 2 == longer["steps"].as_u64().unwrap());
    std::fs::write(dir.path().join("job.yaml"), job_for(2, 100_000)).unwrap();
    let (more, _) = train_summary(dir.path(), &["job.yaml", "--resume"]);
    assert_eq!(more["steps"], longer["steps"], "{more}");
    assert_eq!(more["steps_this_run"], first["steps"], "{more}");
    let (meta, params) = read_train_checkpoint(&dir.path().join("state/train.ckpt")).unwrap();
    assert!(meta.complete);
    assert_eq!(meta.rows_trained, ref_meta.rows_trained);
    assert_eq!(meta.pipeline, ref_meta.pipeline);
    assert_same_parameters(&params, &ref_params, "the run with 2 epochs from the start");
    let (_, out) = train_summary(dir.path(), &["job.yaml", "--resume"]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("already complete"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// A checkpoint of 2 workers, SIGKILLed mid-epoch, resumed on 1 and on 3 workers with
/// `--elastic`. Without a cross-rank shuffle the rest of the interrupted epoch is dealt out to
/// the new workers — its every row trained, in as many steps as its batches need spread over
/// them — then two more epochs; with `across_ranks` (an old rank's batches depend on the
/// exchange between all of them) training continues at the start of the next epoch and the
/// summary says how much of the interrupted epoch had been trained and why. Without
/// `--elastic` another worker count is refused, naming the way out.
#[test]
fn a_checkpoint_resumes_on_other_worker_counts_with_elastic_finishing_the_epoch() {
    elastic_case(false);
}

#[test]
fn a_checkpoint_with_a_cross_rank_shuffle_resumes_on_other_worker_counts_at_the_next_epoch() {
    elastic_case(true);
}

fn elastic_case(across: bool) {
    let shuffle = |yaml: String| {
        if across {
            yaml
        } else {
            yaml.replace("across_ranks: true", "across_ranks: false")
        }
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("job.yaml"), shuffle(job(1_000_000))).unwrap();
    let mut child = spawn_sluice(dir.path(), &["train", "job.yaml"]);
    let ckpt = dir.path().join("state/train.ckpt");
    wait_for(
        "a checkpoint past step 20",
        Duration::from_secs(120),
        || read_train_checkpoint(&ckpt).filter(|(m, _)| m.step >= 20),
    );
    child.kill().unwrap();
    child.wait().unwrap();
    let (at_kill, _) = read_train_checkpoint(&ckpt).unwrap();
    assert!(!at_kill.complete && at_kill.world_size == 2);
    let epoch = at_kill
        .pipeline
        .iter()
        .filter_map(|s| s.parquet.map(|m| m.epoch))
        .max()
        .unwrap();
    let progress = at_kill.epoch.unwrap();
    // 718 rows per worker and epoch: 22 steps of 2 × 32 rows, then one of 2 × 14.
    assert_eq!(progress.epoch, epoch);
    let into = at_kill.step - 23 * epoch;
    assert_eq!(progress.steps, Some(into));
    assert_eq!(
        progress.rows,
        into.min(22) * 64 + into.saturating_sub(22) * 28
    );
    let bytes = std::fs::read(&ckpt).unwrap();

    // Two more epochs after the interrupted one: 1437 rows each, whatever the workers.
    for (workers, steps_per_epoch) in [(1u64, 1437u64.div_ceil(32)), (3, 479u64.div_ceil(32))] {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("state")).unwrap();
        std::fs::write(d.path().join("state/train.ckpt"), &bytes).unwrap();
        std::fs::write(
            d.path().join("job.yaml"),
            shuffle(job_for(epoch + 3, 1_000_000)),
        )
        .unwrap();
        let w = workers.to_string();
        let refused = run_in_for(
            d.path(),
            &["train", "job.yaml", "--resume", "--workers", &w],
            Duration::from_secs(60),
        );
        assert!(!refused.status.success());
        let err = String::from_utf8_lossy(&refused.stderr);
        assert!(
            err.contains("written by 2 ranks") && err.contains("--elastic"),
            "{err}"
        );

        let (r, out) = train_summary(
            d.path(),
            &["job.yaml", "--resume", "--elastic", "--workers", &w],
        );
        assert_eq!(r["world_size"], workers, "{r}");
        assert_eq!(r["rows_untrained"], 0, "{r}");
        // The length the schedule counted is the length the run had.
        assert_eq!(r["total_steps"], r["steps"], "{r}");
        let note = r["elastic"].as_str().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        if across {
            assert_eq!(r["steps_this_run"], 2 * steps_per_epoch, "{r}");
            assert_eq!(r["steps"], at_kill.step + 2 * steps_per_epoch, "{r}");
            assert_eq!(r["rows_this_run"], 2 * 1437, "{r}");
            let passed = format!(
                "epoch {epoch}: {} of its 1437 rows had been trained, the other {} are not (it cannot be continued exactly: with `across_ranks`, an old rank's batches depend on all the old ranks exchanging rows)",
                progress.rows,
                1437 - progress.rows
            );
            assert!(note.contains(&passed), "{note}");
            assert!(stdout.contains(&passed), "{stdout}");
        } else {
            // The 2 old workers owed 23 − `into` batches each: dealt out, a step per batch
            // per new worker (the last step of a shorter share takes an empty batch).
            let owed = 2 * (23 - into);
            let owed_steps = owed.div_ceil(workers);
            assert_eq!(r["steps_this_run"], owed_steps + 2 * steps_per_epoch, "{r}");
            assert_eq!(
                r["steps"],
                at_kill.step + owed_steps + 2 * steps_per_epoch,
                "{r}"
            );
            // The old split's epoch: 2 × 718 rows (one left out by `redistribute`).
            assert_eq!(
                r["rows_this_run"],
                2 * 718 - progress.rows + 2 * 1437,
                "{r}"
            );
            let dealt = format!(
                "the {owed} batch(es) the old ranks still owed of epoch {epoch} are dealt out to the {workers} ranks ({owed_steps} step(s)"
            );
            assert!(note.contains(&dealt), "{note}");
            assert!(stdout.contains(&dealt), "{stdout}");
        }
        assert!(
            note.contains(&format!("continues at the start of epoch {}", epoch + 1)),
            "{note}"
        );
        let (done, _) = read_train_checkpoint(&d.path().join("state/train.ckpt")).unwrap();
        assert!(done.complete);
        assert_eq!(
            (done.world_size, done.pipeline.len()),
            (workers as usize, workers as usize)
        );
    }
}

#[test]
fn trainer_config_errors_say_where_and_what() {
    let dir = tempfile::tempdir().unwrap();
    let quick = std::fs::read_to_string(repo().join("configs/quickstart.yaml")).unwrap();
    let base = quick.replace("../data/", &format!("{}/data/", repo().display()));

    // An unknown key inside `trainer.optimizer`: file:line:column and the key.
    let bad = base.replace("momentum: 0.9,", "momentun: 0.9,");
    std::fs::write(dir.path().join("bad.yaml"), &bad).unwrap();
    let out = run_in_for(dir.path(), &["train", "bad.yaml"], Duration::from_secs(60));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let line = bad.lines().position(|l| l.contains("momentun")).unwrap() + 1;
    assert!(
        err.contains(&format!("bad.yaml:{line}:")) && err.contains("momentun"),
        "{err}"
    );

    // --resume, but the trainer has no checkpoint to resume from.
    std::fs::write(dir.path().join("quick.yaml"), &base).unwrap();
    let out = run_in_for(
        dir.path(),
        &["train", "quick.yaml", "--resume"],
        Duration::from_secs(60),
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("`trainer` has no `checkpoint:`"), "{err}");

    // No trainer section at all.
    let none = &base[..base.find("\nloader:").unwrap()];
    std::fs::write(dir.path().join("none.yaml"), none).unwrap();
    let out = run_in_for(dir.path(), &["train", "none.yaml"], Duration::from_secs(60));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("`loader:`") && err.contains("`trainer:`"),
        "{err}"
    );

    // The target tensor is not produced by the loader.
    let wrong = base.replace("outputs: 10}", "outputs: 10}\n  target: label");
    std::fs::write(dir.path().join("wrong.yaml"), wrong).unwrap();
    let out = run_in_for(
        dir.path(),
        &["train", "wrong.yaml"],
        Duration::from_secs(60),
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("tensor `label`") && err.contains("x, y"),
        "{err}"
    );
}

/// Runs `sluice train` with `args` and `--summary-json s.json` in `dir` (5 minutes at most),
/// checks that it succeeded, and returns its summary and its output.
pub(crate) fn train_summary(
    dir: &std::path::Path,
    args: &[&str],
) -> (serde_json::Value, std::process::Output) {
    let args: Vec<&str> = std::iter::once("train")
        .chain(args.iter().copied())
        .chain(["--summary-json", "s.json"])
        .collect();
    let output = run_in_for(dir, &args, Duration::from_secs(300));
    assert_ok(&output);
    let r = serde_json::from_slice(&std::fs::read(dir.join("s.json")).unwrap()).unwrap();
    (r, output)
}
