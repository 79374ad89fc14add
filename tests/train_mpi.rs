//! `mpirun -np 2 sluice train` with the `mpi` backend: the quickstart config reaches the
//! same accuracy as with local workers, and the ranks' parameters stay identical (checked
//! by the trainer every 100 steps and at the end; a mismatch fails the run).
#![cfg(feature = "mpi")]
#![allow(clippy::unwrap_used)]

use crate::common;

use common::*;

/// `mpirun -np 2 sluice train <args> --backend mpi` in `dir` (as root too, oversubscribed on a
/// small machine).
fn mpirun_train(dir: &std::path::Path, args: &[&str]) -> std::process::Output {
    mpirun(2, dir, args).output().unwrap()
}

/// The command `mpirun -np <ranks> sluice train <args> --backend mpi` in `dir`.
fn mpirun(ranks: usize, dir: &std::path::Path, args: &[&str]) -> std::process::Command {
    let mut c = std::process::Command::new("mpirun");
    c.args(["-np", &ranks.to_string()])
        .arg(assert_cmd::cargo::cargo_bin!("sluice"))
        .arg("train")
        .args(args)
        .args(["--backend", "mpi"])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_rmaps_base_oversubscribe", "1")
        .env_remove("RUST_LOG")
        .current_dir(dir);
    c
}

/// `yaml` trained on 2 thread workers and under `mpirun -np 2`: each run's final checkpoint
/// (`state/train.ckpt`), threads first.
fn threads_and_mpirun(yaml: &str) -> (TrainCheckpoint, TrainCheckpoint) {
    let threads = tempfile::tempdir().unwrap();
    std::fs::write(threads.path().join("job.yaml"), yaml).unwrap();
    assert_ok(&run_in_for(
        threads.path(),
        &["train", "job.yaml"],
        std::time::Duration::from_secs(300),
    ));
    let mpi = tempfile::tempdir().unwrap();
    std::fs::write(mpi.path().join("job.yaml"), yaml).unwrap();
    assert_ok(&mpirun_train(mpi.path(), &["job.yaml"]));
    (
        read_train_checkpoint(&threads.path().join("state/train.ckpt")).unwrap(),
        read_train_checkpoint(&mpi.path().join("state/train.ckpt")).unwrap(),
    )
}

#[test]
fn mpirun_two_ranks_train_the_quickstart() {
    let out = tempfile::tempdir().unwrap();
    let summary = out.path().join("train.json");
    let config = repo().join("configs/quickstart.yaml");
    let summary_arg = summary.display().to_string();
    let config_arg = config.display().to_string();
    assert_ok(&mpirun_train(
        out.path(),
        &[&config_arg, "--summary-json", &summary_arg],
    ));
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&summary).unwrap()).unwrap();
    assert_eq!(r["rank"], 0);
    assert_eq!(r["world_size"], 2);
    assert_eq!(r["rows_trained"], 718 * 2 * 20);
    let eval = r["evals"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(eval["rows"], 360);
    let acc = eval["accuracy"].as_f64().unwrap();
    assert!(acc >= 0.95, "test accuracy {acc}");
}

/// Top-k with error feedback, PowerSGD and local SGD under `mpirun -np 2` end with the
/// parameters the thread backend gives for the same job (two ranks: the same data, and sums
/// of two values are the same in either order), so the compression hooks and the parameter
/// averaging run over MPI as they do over threads.
#[test]
fn mpirun_compression_and_local_sgd_match_the_thread_backend() {
    let modes = [
        "  allreduce: {workers: 2, compression: {type: topk, ratio: 0.05}}\n",
        "  allreduce: {workers: 2, compression: {type: powersgd, rank: 2, start_step: 5}}\n",
        "  allreduce: {workers: 2, compression: bf16}\n  accumulate: 2\n",
        "  allreduce: {workers: 2}\n  sync: {type: local_sgd, every: 4}\n",
    ];
    for extra in modes {
        let yaml = format!(
            "{}  checkpoint: {{path: state/train.ckpt, every_steps: 1000}}\n",
            crate::train_sync::job(32, 2, 1_000_000, extra)
        );
        let ((want_meta, want), (got_meta, got)) = threads_and_mpirun(&yaml);
        assert!(
            got_meta.complete && got_meta.step == want_meta.step,
            "{extra}"
        );
        assert_eq!(got_meta.rows_trained, want_meta.rows_trained, "{extra}");
        assert_same_parameters(&got, &want, &format!("the thread backend ({extra})"));
    }
}

/// The cross-rank shuffle (`across_ranks: true`: rows exchanged between the ranks each
/// window, through the data collective) and fp16 gradients under `mpirun -np 2` end with
/// bitwise the parameters and positions of the same job on the thread backend.
#[test]
fn mpirun_cross_rank_shuffle_and_fp16_match_the_thread_backend() {
    // tests/train.rs's job: digits, `shuffle` with `across_ranks`, 2 workers, checkpoints.
    let yaml = crate::train::job_for(2, 1_000_000).replace(
        "allreduce: {workers: 2, bucket_mb: 0.001}",
        "allreduce: {workers: 2, bucket_mb: 0.001, compression: fp16}",
    );
    assert!(yaml.contains("across_ranks: true") && yaml.contains("compression: fp16"));
    let ((want_meta, want), (got_meta, got)) = threads_and_mpirun(&yaml);
    assert!(got_meta.complete);
    assert_eq!(got_meta.step, want_meta.step);
    assert_eq!(got_meta.rows_trained, want_meta.rows_trained);
    assert_eq!(
        got_meta.pipeline, want_meta.pipeline,
        "the same shuffled positions"
    );
    assert_same_parameters(&got, &want, "the thread backend (cross-rank shuffle, fp16)");
}

/// A running `mpirun`, sent SIGTERM (which it passes to the ranks: they stop at their next
/// step) and waited for when dropped, so a failed test leaves no training behind.
struct StopOnDrop(std::process::Child);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &self.0.id().to_string()])
                .status();
            let _ = self.0.wait();
        }
    }
}

/// A checkpoint written by `mpirun -np 2`, stopped mid-run with SIGTERM to `mpirun` (which
/// passes it to the ranks: they checkpoint at the next step and leave), resumed with
/// `--resume --elastic` under `mpirun -np 3` and on 3 thread workers from the same bytes: both
/// train the same rows in the same steps and end at the same positions, with the same
/// parameters up to the order MPI sums three ranks' gradients in (f32; 2 ranks would be
/// bitwise, see above). Without a cross-rank shuffle the old ranks' owed batches are dealt out
/// to the 3; with `across_ranks` the rest of the epoch is passed over and named.
#[test]
fn mpirun_elastic_resume_from_two_ranks_to_three_matches_the_thread_backend() {
    use std::time::Duration;
    for across in [false, true] {
        let yaml = |epochs: u64| {
            let y = crate::train::job_for(epochs, 1_000_000);
            if across {
                y
            } else {
                y.replace("across_ranks: true", "across_ranks: false")
            }
        };
        let first = tempfile::tempdir().unwrap();
        std::fs::write(first.path().join("job.yaml"), yaml(1_000)).unwrap();
        let mut two = StopOnDrop(
            mpirun(2, first.path(), &["job.yaml"])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap(),
        );
        let ckpt = first.path().join("state/train.ckpt");
        wait_for(
            "a checkpoint of mpirun -np 2 past step 20",
            Duration::from_secs(120),
            || read_train_checkpoint(&ckpt).filter(|(m, _)| m.step >= 20),
        );
        let term = std::process::Command::new("kill")
            .args(["-TERM", &two.0.id().to_string()])
            .status()
            .unwrap();
        assert!(term.success());
        wait_for("mpirun to stop", Duration::from_secs(60), || {
            two.0.try_wait().unwrap()
        });
        let (at_stop, _) = read_train_checkpoint(&ckpt).unwrap();
        assert!(!at_stop.complete && at_stop.world_size == 2, "{at_stop:?}");
        let epoch = at_stop.epoch.unwrap().epoch;
        let bytes = std::fs::read(&ckpt).unwrap();
        let resume = || {
            let d = tempfile::tempdir().unwrap();
            std::fs::create_dir_all(d.path().join("state")).unwrap();
            std::fs::write(d.path().join("state/train.ckpt"), &bytes).unwrap();
            std::fs::write(d.path().join("job.yaml"), yaml(epoch + 2)).unwrap();
            d
        };
        let threads = resume();
        assert_ok(&run_in_for(
            threads.path(),
            &[
                "train",
                "job.yaml",
                "--resume",
                "--elastic",
                "--workers",
                "3",
            ],
            Duration::from_secs(300),
        ));
        let mpi = resume();
        let out = mpirun(3, mpi.path(), &["job.yaml", "--resume", "--elastic"])
            .output()
            .unwrap();
        assert_ok(&out);
        // Rank 0's summary names what became of the interrupted epoch. Where the stop lands
        // is up to the signal's timing (ranks often take it at an epoch's end, between
        // epochs): the note for either case.
        let stdout = String::from_utf8_lossy(&out.stdout);
        // An epoch is 23 steps on 2 ranks (718 rows each: 22 batches of 32, one of 14).
        let mut notes = if at_stop.step % 23 == 0 {
            vec!["nothing of the interrupted epoch was left".to_string()]
        } else if across {
            vec![format!("epoch {epoch}: ")]
        } else {
            vec![format!(
                "still owed of epoch {epoch} are dealt out to the 3 ranks"
            )]
        };
        if at_stop.step % 23 == 0 && across {
            // Stopped at an epoch's last step, before the ranks had read into the next one:
            // the states are at that epoch's end, which `across_ranks` cannot rescale, so the
            // epoch is named as interrupted — with only the row the uneven split leaves out of
            // every epoch (1,437 rows on 2 ranks: one rank's last batch is one row longer, and
            // the first rank to run out ends the epoch for both) untrained. Seen once, in a
            // local run of the suite.
            notes.push(format!(
                "epoch {epoch}: 1436 of its 1437 rows had been trained, the other 1 are not"
            ));
        }
        assert!(
            notes.iter().any(|n| stdout.contains(n)),
            "{notes:?}\n{stdout}"
        );
        let (want_meta, want) =
            read_train_checkpoint(&threads.path().join("state/train.ckpt")).unwrap();
        let (got_meta, got) = read_train_checkpoint(&mpi.path().join("state/train.ckpt")).unwrap();
        assert!(
            got_meta.complete && got_meta.world_size == 3,
            "{got_meta:?}"
        );
        assert_eq!(
            (got_meta.step, got_meta.rows_trained),
            (want_meta.step, want_meta.rows_trained),
            "across_ranks: {across}"
        );
        assert!(got_meta.step > at_stop.step);
        assert_eq!(got_meta.pipeline, want_meta.pipeline, "the same positions");
        assert_close_parameters(
            &got,
            &want,
            1e-5,
            &format!("3 thread workers (across_ranks: {across})"),
        );
    }
}
