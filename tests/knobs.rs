//! Absurd settings and odd config files at the command line: refused before any work, at
//! their `file:line:column`, with the allowed range and why; messages cut to a readable size.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::*;

fn digits() -> String {
    repo()
        .join("data/digits/train.parquet")
        .display()
        .to_string()
}

/// Runs `sluice <args> p.yaml` in `dir` (bounded in time: a hang is a failure), returning
/// the exit code and stderr.
fn sluice_in(dir: &Path, args: &[&str]) -> (Option<i32>, String) {
    let out = sluice()
        .current_dir(dir)
        .args(args)
        .timeout(Duration::from_secs(120))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    (out.status.code(), stderr)
}

/// `threads: 100000` used to start ~9,000 threads and ignore SIGTERM; `threads: 4294967296`
/// passed `validate` and then aborted. Both are refused by `validate` (also `--no-data`) and
/// by `run`, before anything is opened or written.
#[test]
fn absurd_thread_counts_are_refused_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    for threads in ["100000", "4294967296"] {
        std::fs::write(
            dir.path().join("p.yaml"),
            format!(
                "source: {{type: parquet, path: '{}'}}\nsink: {{type: parquet, path: out/x.parquet}}\nruntime:\n  threads: {threads}\n",
                digits()
            ),
        )
        .unwrap();
        for args in [
            &["validate", "--no-data", "p.yaml"][..],
            &["validate", "p.yaml"],
            &["run", "p.yaml", "--no-report"],
        ] {
            let (code, stderr) = sluice_in(dir.path(), args);
            assert_eq!(code, Some(1), "{args:?}: {stderr}");
            assert!(
                stderr.contains(&format!(
                    "p.yaml:4:12: runtime: `threads: {threads}` is out of range: allowed 0–1,024 (0: one thread per core); each is an operating-system thread"
                )),
                "{args:?}: {stderr}"
            );
        }
        assert!(!dir.path().join("out").exists(), "the run wrote output");
    }
}

/// `threads: 0` means one thread per core (as leaving it out does), documented.
#[test]
fn zero_threads_mean_one_per_core() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("p.yaml"),
        format!(
            "source: {{type: parquet, path: '{}'}}\nsink: {{type: null}}\nruntime: {{threads: 0}}\n",
            digits()
        ),
    )
    .unwrap();
    let (code, stderr) = sluice_in(dir.path(), &["run", "p.yaml", "--no-report"]);
    assert_eq!(code, Some(0), "{stderr}");
}

/// Sizes in other sections too: a batch of four billion rows, a queue of a terabyte.
#[test]
fn every_size_setting_has_a_range() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("p.yaml"),
        format!(
            "source: {{type: parquet, path: '{}', prefetch: 0}}\nstages:\n  - {{type: shuffle, buffer_rows: 4294967296}}\n  - {{type: batch, size: 4294967296}}\nsink: {{type: parquet, path: out/x.parquet, max_rows_per_file: 0}}\nruntime: {{queue_bytes: 1 TiB}}\n",
            digits()
        ),
    )
    .unwrap();
    let (code, stderr) = sluice_in(dir.path(), &["validate", "--no-data", "p.yaml"]);
    assert_eq!(code, Some(1), "{stderr}");
    for want in [
        "source (parquet): `prefetch: 0` is out of range: allowed 1–1,024",
        "p.yaml:3:34: stages[0] (shuffle): `buffer_rows: 4294967296` is out of range: allowed 1–268,435,456",
        "p.yaml:4:25: stages[1] (batch): `size: 4294967296` is out of range: allowed 1–16,777,216",
        "sink (parquet): `max_rows_per_file: 0` is out of range: allowed at least 1",
        "p.yaml:6:24: runtime: `queue_bytes: 1 TiB` is out of range: allowed 1 KiB–64 GiB",
        "p.yaml: 5 problems found",
    ] {
        assert!(stderr.contains(want), "{want}\n{stderr}");
    }
}

/// `validate` reads `trainer:` and `loader:` as `sluice train` does: a wrong type is placed
/// at its `file:line:column`, and what `train` checks before it starts is checked too.
#[cfg(feature = "torch")]
#[test]
fn validate_checks_the_trainer_and_loader_sections() {
    let dir = tempfile::tempdir().unwrap();
    let job = |loader: &str, trainer: &str| {
        std::fs::write(
            dir.path().join("p.yaml"),
            format!(
                "source: {{type: parquet, path: '{}'}}\nstages:\n  - {{type: cast, columns: {{pixels: float32}}}}\n  - {{type: batch, size: 8}}\nloader:\n  tensors:\n    x: {{column: pixels, dtype: f32}}\n    y: {{column: label, dtype: i64}}\n{loader}trainer:\n  model: {{type: logreg, outputs: 10}}\n  optimizer: {{type: sgd, lr: 0.1}}\n{trainer}",
                digits()
            ),
        )
        .unwrap();
        sluice_in(dir.path(), &["validate", "--no-data", "p.yaml"])
    };
    let (code, stderr) = job("", "");
    assert_eq!(code, Some(0), "{stderr}");
    let (code, stderr) = job("", "  epochs: \"a string\"\n");
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "p.yaml:12:11: trainer: `epochs`: expected a non-negative integer, found `\"a string\"`"
        ),
        "{stderr}"
    );
    let (code, stderr) = job("  prefetch: 0\n", "  allreduce: {workers: 100000}\n");
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("p.yaml:9:13: loader: `prefetch: 0` is out of range"),
        "{stderr}"
    );
    assert!(
        stderr.contains("trainer: `allreduce.workers: 100000` is out of range: allowed 1–256"),
        "{stderr}"
    );
    let (code, stderr) = job("", "  input: z\n");
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("trainer: tensor `z` is not in `loader.tensors`"),
        "{stderr}"
    );
}

/// Without the `torch` feature `trainer:` cannot be read: `validate` says so and goes on.
#[cfg(not(feature = "torch"))]
#[test]
fn validate_says_it_could_not_check_the_trainer_section() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("p.yaml"),
        format!(
            "source: {{type: parquet, path: '{}'}}\ntrainer:\n  epochs: \"a string\"\n",
            digits()
        ),
    )
    .unwrap();
    let (code, stderr) = sluice_in(dir.path(), &["validate", "--no-data", "p.yaml"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("were not checked"), "{stderr}");
}

/// A file saved with CR-only (old Mac) line endings ran with `${SLUICE_OUT_DIR:-…}` left as
/// it was, and wrote to a directory of that name. LF, CRLF and CR now run alike.
#[test]
fn cr_crlf_and_lf_files_interpolate_alike() {
    let lf = format!(
        "# a comment first: with CR endings it once swallowed the file\nsource: {{type: parquet, path: '{}'}}\nsink: {{type: parquet, path: '${{SLUICE_OUT_DIR:-literal}}/x.parquet'}}\n",
        digits()
    );
    for (name, text) in [
        ("lf", lf.clone()),
        ("crlf", lf.replace('\n', "\r\n")),
        ("cr", lf.replace('\n', "\r")),
    ] {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("p.yaml"), text).unwrap();
        let out = dir.path().join("out");
        std::fs::create_dir(&out).unwrap();
        let run = sluice()
            .current_dir(dir.path())
            .env("SLUICE_OUT_DIR", &out)
            .args(["run", "p.yaml", "--no-report"])
            .timeout(Duration::from_secs(120))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert_eq!(run.status.code(), Some(0), "{name}: {stderr}");
        assert!(
            out.join("x.parquet").is_file(),
            "{name}: no output in $SLUICE_OUT_DIR"
        );
        assert!(
            !dir.path().join("literal").exists(),
            "{name}: not interpolated"
        );
        let files = files_under(dir.path());
        assert!(!files.iter().any(|f| f.contains('$')), "{name}: {files:?}");
    }
}

#[test]
fn several_documents_and_bytes_that_are_not_utf8_are_refused_in_plain_words() {
    let dir = tempfile::tempdir().unwrap();
    let source = format!("source: {{type: parquet, path: '{}'}}\n", digits());
    std::fs::write(dir.path().join("p.yaml"), format!("{source}---\n{source}")).unwrap();
    let (code, stderr) = sluice_in(dir.path(), &["validate", "--no-data", "p.yaml"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "p.yaml:3:1: this file holds several YAML documents (`---`); a pipeline file holds one"
        ),
        "{stderr}"
    );
    assert!(!stderr.contains("from_str"), "{stderr}");
    let mut bytes = source.into_bytes();
    bytes.extend_from_slice(b"stages:\n  - {type: filter, predicate: 'x > \xFF'}\n");
    std::fs::write(dir.path().join("p.yaml"), bytes).unwrap();
    let (code, stderr) = sluice_in(dir.path(), &["validate", "--no-data", "p.yaml"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("p.yaml:3:36: byte offset "), "{stderr}");
    assert!(
        stderr.contains("(0xFF) is not UTF-8; a pipeline file must be UTF-8 text"),
        "{stderr}"
    );
}

/// A 50 MB value was echoed whole to stderr, and 100,000 unknown keys gave 18 MB of errors.
#[test]
fn huge_values_and_long_lists_of_problems_are_cut_with_a_count() {
    let dir = tempfile::tempdir().unwrap();
    let big = "7".repeat(50 << 20);
    std::fs::write(
        dir.path().join("p.yaml"),
        format!(
            "source: {{type: parquet, path: '{}'}}\nruntime: {{threads: {big}}}\n",
            digits()
        ),
    )
    .unwrap();
    let (code, stderr) = sluice_in(dir.path(), &["validate", "--no-data", "p.yaml"]);
    assert_eq!(code, Some(1), "{}", &stderr[..stderr.len().min(2000)]);
    assert!(stderr.len() < 2000, "{} bytes of errors", stderr.len());
    assert!(stderr.contains("more bytes)"), "{stderr}");
    let mut yaml = format!("source: {{type: parquet, path: '{}'}}\n", digits());
    for i in 0..100_000 {
        yaml.push_str(&format!("key{i}: 1\n"));
    }
    std::fs::write(dir.path().join("p.yaml"), yaml).unwrap();
    let (code, stderr) = sluice_in(dir.path(), &["validate", "--no-data", "p.yaml"]);
    assert_eq!(code, Some(1), "{}", &stderr[..stderr.len().min(2000)]);
    assert!(stderr.len() < 20_000, "{} bytes of errors", stderr.len());
    assert!(stderr.contains("… and 99950 more problems"), "{stderr}");
    assert!(stderr.contains("p.yaml: 100000 problems found"), "{stderr}");
}

/// Loading was quadratic in the number of stages (5,000: 184 s); this would time out if it
/// were again.
#[test]
fn five_thousand_stages_validate() {
    let dir = tempfile::tempdir().unwrap();
    let mut yaml = format!("source: {{type: parquet, path: '{}'}}\nstages:\n", digits());
    for _ in 0..5000 {
        yaml.push_str("  - type: filter\n    predicate: 'label >= 0'\n");
    }
    std::fs::write(dir.path().join("p.yaml"), yaml).unwrap();
    let (code, stderr) = sluice_in(dir.path(), &["validate", "--no-data", "p.yaml"]);
    assert_eq!(code, Some(0), "{stderr}");
}

/// Settings that come from outside the YAML are bounded too: `--workers` past the trainer's
/// limit, a world size from the environment that is not a number or out of range, and an
/// unusable `SLUICE_STOP_GRACE`, each refused before any work with what to change.
#[test]
fn flags_and_environment_are_bounded_like_the_yaml() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("p.yaml"),
        format!(
            "source: {{type: parquet, path: '{}'}}\nsink: {{type: parquet, path: out/x.parquet}}\n",
            digits()
        ),
    )
    .unwrap();
    let run = |env: &[(&str, &str)]| {
        let mut cmd = sluice();
        cmd.current_dir(dir.path())
            .args(["run", "p.yaml", "--no-report"])
            .timeout(Duration::from_secs(120));
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    for (env, code, says) in [
        (
            ("SLUICE_WORLD_SIZE", "four"),
            1,
            "the environment variable SLUICE_WORLD_SIZE=\"four\" is not a whole number",
        ),
        (
            ("SLUICE_WORLD_SIZE", "100000"),
            1,
            "world size 100000 is out of range: allowed 1–65536",
        ),
        (
            ("SLUICE_WORLD_SIZE", "0"),
            1,
            "rank 0 is not below world_size 0",
        ),
        (
            ("SLUICE_RANK", "-1"),
            1,
            "the environment variable SLUICE_RANK=\"-1\" is not a whole number",
        ),
        (("SLUICE_STOP_GRACE", "soon"), 2, "SLUICE_STOP_GRACE=soon: "),
        (
            ("SLUICE_STOP_GRACE", "2h"),
            2,
            "SLUICE_STOP_GRACE=2h is out of range: allowed 0s–1h",
        ),
    ] {
        // A typo in the first variable is not passed over for the next one.
        let (got, stderr) = run(&[env, ("WORLD_SIZE", "2")]);
        assert_eq!(got, Some(code), "{env:?}: {stderr}");
        assert!(stderr.contains(says), "{env:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(
            !dir.path().join("out").exists(),
            "{env:?}: the run wrote output"
        );
    }
    let (got, stderr) = run(&[("SLUICE_STOP_GRACE", "3s")]);
    assert_eq!(got, Some(0), "{stderr}");
}

/// `--workers` is checked against the same limit as `trainer.allreduce.workers`.
#[cfg(feature = "torch")]
#[test]
fn workers_flag_is_bounded() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("p.yaml"),
        format!(
            "source: {{type: parquet, path: '{}'}}\nstages:\n  - {{type: cast, columns: {{pixels: float32}}}}\n  - {{type: batch, size: 8}}\nloader:\n  tensors:\n    x: {{column: pixels, dtype: f32}}\n    y: {{column: label, dtype: i64}}\ntrainer:\n  model: {{type: logreg, outputs: 10}}\n  optimizer: {{type: sgd, lr: 0.1}}\n",
            digits()
        ),
    )
    .unwrap();
    for workers in ["100000", "0"] {
        let (code, stderr) = sluice_in(
            dir.path(),
            &["train", "p.yaml", "--workers", workers, "--no-report"],
        );
        assert_eq!(code, Some(1), "{stderr}");
        assert!(
            stderr.contains(&format!(
                "trainer.allreduce.workers (or --workers): {workers} is out of range: allowed 1–256"
            )),
            "{stderr}"
        );
    }
}
