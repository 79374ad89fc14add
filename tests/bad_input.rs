//! Bad input gets a clear message, exit code 1, no panic and no partial output.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::path::{Path, PathBuf};

use arrow::array::{Int64Array, RecordBatch, StringArray};
use common::*;

struct Case {
    dir: tempfile::TempDir,
}

impl Case {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("out")).unwrap();
        Case { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn yaml(&self, text: &str) -> PathBuf {
        let p = self.path("p.yaml");
        std::fs::write(&p, text).unwrap();
        p
    }

    /// Runs `sluice <cmd> p.yaml`, expects exit 1 and returns stderr.
    fn fails(&self, cmd: &str, config: &Path) -> String {
        let out = sluice().arg(cmd).arg(config).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        stderr
    }

    fn assert_no_output(&self) {
        assert_eq!(
            files_under(&self.path("out")),
            Vec::<String>::new(),
            "partial output left behind"
        );
    }
}

fn digits() -> String {
    repo()
        .join("data/digits/train.parquet")
        .display()
        .to_string()
}

#[test]
fn unknown_key_names_position_and_allowed_keys() {
    let c = Case::new();
    let p = c.yaml(&format!(
        "source:\n  type: parquet\n  path: {}\nstages:\n  - type: batch\n    size: 8\n    dorp_last: true\nsink: {{type: parquet, path: out/x.parquet}}\n",
        digits()
    ));
    for cmd in ["validate", "run"] {
        let err = c.fails(cmd, &p);
        assert!(
            err.contains("p.yaml:7:5: stages[0] (batch): unknown field `dorp_last`, expected one of size, drop_last"),
            "{err}"
        );
    }
    c.assert_no_output();
}

#[test]
fn every_problem_is_reported_at_once() {
    let c = Case::new();
    let p = c.yaml("source:\n  type: parquet\n  path: 3\n  colums: [a]\nstages:\n  - {type: batch, size: many}\n  - {type: explode}\nsink: {type: parquet}\nextra: true\n");
    let err = c.fails("validate", &p);
    assert!(
        err.contains("p.yaml:9:1: unknown top-level key `extra`"),
        "{err}"
    );
    assert!(
        err.contains("p.yaml:4:3: source (parquet): unknown field `colums`"),
        "{err}"
    );
    assert!(
        err.contains(
            "p.yaml:6:25: stages[0] (batch): `size`: expected a non-negative integer, found `many`"
        ),
        "{err}"
    );
    assert!(
        err.contains(
            "stages[1]: unknown stage type `explode`, expected one of: select, rename, cast"
        ),
        "{err}"
    );
    assert!(
        err.contains("sink (parquet): missing field `path`"),
        "{err}"
    );
    assert!(
        err.contains("p.yaml:3:3: source (parquet): invalid type: integer `3`, expected a path"),
        "{err}"
    );
    assert!(err.contains("6 problems found"), "{err}");
}

/// Stages that cannot be built (columns or settings that do not fit the data) are reported
/// together too: checking goes on past a stage that keeps its input's columns, and stops,
/// saying so, at one whose output is then unknown.
#[test]
fn every_stage_problem_is_reported_at_once_as_far_as_the_schema_is_known() {
    let c = Case::new();
    let stages = "stages:\n  - {type: clip, columns: [lable], max: 3}\n  - {type: filter, predicate: \"idd > 3\"}\n  - {type: cast, columns: {pixel: float32}}\n  - {type: select, columns: [nope]}\n";
    let p = c.yaml(&format!(
        "source: {{type: parquet, path: '{}'}}\n{stages}",
        digits()
    ));
    let err = c.fails("validate", &p);
    assert!(
        err.contains("p.yaml:3:5: column `lable` does not exist")
            && err.contains("p.yaml:4:5: predicate `idd > 3`: column `idd` does not exist")
            && err.contains("p.yaml:5:5: column `pixel` does not exist"),
        "{err}"
    );
    assert!(
        err.contains("note: stages[3] (select) and the stages after it were not checked"),
        "{err}"
    );
    assert!(!err.contains("`nope`"), "{err}");
    assert!(err.contains("3 problems found"), "{err}");
}

#[test]
fn wrong_type_is_reported_with_position() {
    let c = Case::new();
    let p = c.yaml(&format!(
        "source:\n  type: parquet\n  path: {}\n  batch_rows: lots\n",
        digits()
    ));
    let err = c.fails("validate", &p);
    assert!(
        err.contains("p.yaml:4:15: source (parquet): `batch_rows`: expected a non-negative integer, found `lots`"),
        "{err}"
    );
}

#[test]
fn missing_required_field() {
    let c = Case::new();
    let p = c.yaml(&format!(
        "source:\n  type: parquet\n  path: {}\nstages:\n  - type: one_hot\n    column: label\n",
        digits()
    ));
    let err = c.fails("validate", &p);
    assert!(
        err.contains("stages[0] (one_hot): missing field `num_classes`"),
        "{err}"
    );
    assert!(err.contains("p.yaml:"), "{err}");
}

#[test]
fn zero_epochs_or_rows_per_batch_are_refused() {
    let c = Case::new();
    for (key, said) in [
        (
            "epochs",
            "p.yaml:2:3: `batch_rows`, `prefetch` and `epochs` must be at least 1",
        ),
        (
            "batch_rows",
            "p.yaml:4:15: source (parquet): `batch_rows: 0` is out of range: allowed 1–16,777,216",
        ),
        (
            "prefetch",
            "p.yaml:4:13: source (parquet): `prefetch: 0` is out of range: allowed 1–1,024",
        ),
    ] {
        let p = c.yaml(&format!(
            "source:\n  type: parquet\n  path: {}\n  {key}: 0\nsink: {{type: parquet, path: out/x.parquet}}\n",
            digits()
        ));
        let err = c.fails("run", &p);
        assert!(err.contains(said), "{key}: {err}");
        c.assert_no_output();
    }
}

#[test]
fn a_rank_outside_the_world_is_refused() {
    let c = Case::new();
    for (runtime, said) in [
        (
            "{rank: 2, world_size: 2}",
            "rank 2 is not below world_size 2",
        ),
        ("{world_size: 0}", "rank 0 is not below world_size 0"),
    ] {
        let p = c.yaml(&format!(
            "source:\n  type: parquet\n  path: {}\nruntime: {runtime}\nsink: {{type: parquet, path: out/x.parquet}}\n",
            digits()
        ));
        for cmd in ["validate", "run"] {
            let err = c.fails(cmd, &p);
            assert!(
                err.contains("p.yaml:2:3") && err.contains(said),
                "{cmd}: {err}"
            );
        }
        c.assert_no_output();
    }
}

#[test]
fn unset_environment_variable() {
    let c = Case::new();
    let p = c.yaml("source:\n  type: parquet\n  path: ${SLUICE_TEST_SURELY_UNSET}/x.parquet\n");
    let err = c.fails("run", &p);
    assert!(
        err.contains("p.yaml:3:9: environment variable `SLUICE_TEST_SURELY_UNSET` is not set"),
        "{err}"
    );
}

#[test]
fn missing_file() {
    let c = Case::new();
    let p = c.yaml("source:\n  type: parquet\n  path: nowhere/*.parquet\nsink: {type: parquet, path: out/x.parquet}\n");
    let err = c.fails("run", &p);
    assert!(err.contains("no files match `nowhere/*.parquet`"), "{err}");
    c.assert_no_output();
    let err = c.fails("run", &c.path("absent.yaml"));
    assert!(err.contains("cannot read config file"), "{err}");
}

#[test]
fn not_parquet_and_truncated_parquet() {
    let c = Case::new();
    std::fs::write(c.path("fake.parquet"), "id,label\n1,2\n").unwrap();
    let p = c.yaml("source:\n  type: parquet\n  path: fake.parquet\nsink: {type: parquet, path: out/x.parquet}\n");
    let err = c.fails("run", &p);
    assert!(err.contains("fake.parquet: cannot decode Parquet"), "{err}");
    assert!(err.contains("not Parquet or is truncated"), "{err}");
    c.assert_no_output();

    let bytes = std::fs::read(repo().join("data/digits/train.parquet")).unwrap();
    std::fs::write(c.path("fake.parquet"), &bytes[..bytes.len() / 2]).unwrap();
    let err = c.fails("run", &p);
    assert!(err.contains("fake.parquet: cannot decode Parquet"), "{err}");
    c.assert_no_output();

    let out = sluice()
        .arg("inspect")
        .arg(c.path("fake.parquet"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot decode Parquet"));
}

#[test]
fn corrupt_row_group_names_file_and_row_group() {
    let c = Case::new();
    let mut bytes = std::fs::read(repo().join("data/digits/train.parquet")).unwrap();
    // Damage the middle of the data pages (the footer stays intact).
    for b in &mut bytes[20000..20400] {
        *b ^= 0x5a;
    }
    std::fs::write(c.path("bad.parquet"), &bytes).unwrap();
    let p = c.yaml("source:\n  type: parquet\n  path: bad.parquet\nsink: {type: parquet, path: out/x.parquet}\n");
    let err = c.fails("run", &p);
    assert!(err.contains("bad.parquet (row group "), "{err}");
    c.assert_no_output();
}

#[test]
fn column_that_does_not_exist() {
    let c = Case::new();
    let p = c.yaml(&format!(
        "source:\n  type: parquet\n  path: {}\n  columns: [id, labels]\n",
        digits()
    ));
    let err = c.fails("validate", &p);
    assert!(
        err.contains(
            "column `labels` does not exist; available columns: id, label, pixels; did you mean `label`?"
        ),
        "{err}"
    );

    let p = c.yaml(&format!(
        "source:\n  type: parquet\n  path: {}\nstages:\n  - type: rename\n    columns: {{label: y}}\n  - type: clip\n    columns: [label]\n    max: 3\nsink: {{type: parquet, path: out/x.parquet}}\n",
        digits()
    ));
    let err = c.fails("run", &p);
    assert!(err.contains("stages[1] (clip) at "), "{err}");
    assert!(
        err.contains("p.yaml:7:5: column `label` does not exist; available columns: id, y, pixels"),
        "{err}"
    );
    // Nothing close to `label` is there: no suggestion.
    assert!(!err.contains("did you mean"), "{err}");
    c.assert_no_output();
}

#[test]
fn failing_cast_names_column_value_and_row_and_leaves_no_output() {
    let c = Case::new();
    // Three row groups; the bad value is in the last one, after output has started.
    let batch = |ids: std::ops::Range<i64>, bad: Option<i64>| {
        let s: Vec<String> = ids
            .clone()
            .map(|i| {
                if Some(i) == bad {
                    "12x".to_string()
                } else {
                    i.to_string()
                }
            })
            .collect();
        RecordBatch::try_from_iter([
            ("id", arc(Int64Array::from_iter_values(ids))),
            ("n", arc(StringArray::from(s))),
        ])
        .unwrap()
    };
    write_parquet(
        &c.path("s.parquet"),
        &[
            batch(0..100, None),
            batch(100..200, None),
            batch(200..300, Some(250)),
        ],
        100,
    );
    let p = c.yaml("source:\n  type: parquet\n  path: s.parquet\n  batch_rows: 50\nstages:\n  - type: cast\n    columns: {n: int64}\nsink: {type: parquet, path: out/x.parquet, row_group_size: 10}\nruntime: {threads: 1}\n");
    let err = c.fails("run", &p);
    assert!(err.contains("stages[0] (cast) at "), "{err}");
    assert!(err.contains("cannot cast column `n` to Int64"), "{err}");
    assert!(err.contains("12x"), "the bad value is shown: {err}");
    assert!(
        err.contains("s.parquet row group 2, row 250 (epoch 0)"),
        "{err}"
    );
    c.assert_no_output();
}

#[test]
fn bad_class_index_in_one_hot() {
    let c = Case::new();
    let p = c.yaml(&format!(
        "source:\n  type: parquet\n  path: {}\nstages:\n  - {{type: one_hot, column: label, num_classes: 5}}\nsink: {{type: null}}\n",
        digits()
    ));
    let err = c.fails("run", &p);
    assert!(err.contains("class index in column `label` is"), "{err}");
    assert!(err.contains("outside 0..5"), "{err}");
    assert!(err.contains("train.parquet row group 0, row "), "{err}");
}

/// Images: a wrong byte length and an undecodable PNG stop the run naming file, row group and
/// row (no output left); with `on_error: skip` the good rows flow and the bad ones are
/// counted as removed and logged with their lineage.
#[test]
fn bad_images_stop_the_run_or_are_skipped_and_counted() {
    use arrow::array::BinaryArray;
    let c = Case::new();
    let good_png = tiny_png();
    let batch = |ids: std::ops::Range<i64>, bad: &[i64]| {
        let imgs: Vec<Vec<u8>> = ids
            .clone()
            .map(|i| {
                if bad.contains(&i) {
                    b"\x89PNG\r\n\x1a\nnot really".to_vec()
                } else {
                    good_png.clone()
                }
            })
            .collect();
        RecordBatch::try_from_iter([
            ("id", arc(Int64Array::from_iter_values(ids))),
            (
                "img",
                arc(BinaryArray::from_iter_values(
                    imgs.iter().map(|v| v.as_slice()),
                )),
            ),
        ])
        .unwrap()
    };
    write_parquet(
        &c.path("imgs.parquet"),
        &[batch(0..100, &[]), batch(100..200, &[130, 170])],
        100,
    );
    let job = |on_error: &str| {
        format!(
            "source: {{type: parquet, path: imgs.parquet, batch_rows: 50}}\nstages:\n  - {{type: image, column: img, format: png, shape: [2, 2, 3], on_error: {on_error}}}\nsink: {{type: parquet, path: out/x.parquet}}\nruntime: {{threads: 1}}\n"
        )
    };
    let err = c.fails("run", &c.yaml(&job("fail")));
    assert!(err.contains("stages[0] (image) at "), "{err}");
    assert!(err.contains("cannot decode the Png image"), "{err}");
    assert!(
        err.contains("imgs.parquet row group 1, row 130 (epoch 0)"),
        "{err}"
    );
    assert!(err.contains("on_error: skip"), "{err}");
    c.assert_no_output();

    let out = sluice()
        .arg("run")
        .arg(c.yaml(&job("skip")))
        .arg("--summary-json")
        .arg(c.path("summary.json"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("row 130 (epoch 0)") && stderr.contains("row 170 (epoch 0)"),
        "each skipped row is logged: {stderr}"
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(c.path("summary.json")).unwrap()).unwrap();
    assert_eq!(report["rows_written"], 198);
    assert_eq!(report["stages"][0]["rows_removed"], 2);
    assert_eq!(
        report["stages"][0]["removed_as"],
        "bad images skipped (on_error: skip)"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("2 bad images skipped (on_error: skip)"),
        "the summary says the skipped rows were bad: {stdout}"
    );

    // A raw image of the wrong length.
    let raw = RecordBatch::try_from_iter([
        ("id", arc(Int64Array::from_iter_values(0..3))),
        (
            "img",
            arc(BinaryArray::from_iter_values([
                &[1u8; 12][..],
                &[1u8; 12][..],
                &[1u8; 13][..],
            ])),
        ),
    ])
    .unwrap();
    write_parquet(&c.path("raw.parquet"), &[raw], 10);
    let err = c.fails(
        "run",
        &c.yaml("source: {type: parquet, path: raw.parquet}\nstages:\n  - {type: image, column: img, shape: [2, 2, 3]}\nsink: {type: parquet, path: out/x.parquet}\n"),
    );
    assert!(
        err.contains("13 bytes, but shape [2, 2, 3] needs 12"),
        "{err}"
    );
    assert!(
        err.contains("raw.parquet row group 0, row 2 (epoch 0)"),
        "{err}"
    );
}

/// The `loader:` section is checked by `sluice validate`: unknown keys with their position,
/// and columns/shapes against the schema the stages produce.
#[cfg(feature = "torch")]
#[test]
fn loader_section_errors_name_the_key_or_the_column() {
    let c = Case::new();
    let digits = digits();
    let p = c.yaml(&format!(
        "source: {{type: parquet, path: '{digits}'}}\nloader:\n  devise: cpu\n  tensors: {{x: {{column: pixels}}}}\n"
    ));
    let err = c.fails("validate", &p);
    assert!(err.contains("p.yaml:3:3"), "{err}");
    assert!(err.contains("unknown field `devise`"), "{err}");
    let p = c.yaml(&format!(
        "source: {{type: parquet, path: '{digits}'}}\nloader:\n  tensors:\n    x: {{column: pixel}}\n"
    ));
    let err = c.fails("validate", &p);
    assert!(
        err.contains("tensor `x` from column `pixel`: no such column"),
        "{err}"
    );
    assert!(err.contains("; did you mean `pixels`?"), "{err}");
    let p = c.yaml(&format!(
        "source: {{type: parquet, path: '{digits}'}}\nloader:\n  tensors:\n    x: {{column: pixels, shape: [3, 8, 8]}}\n"
    ));
    let err = c.fails("validate", &p);
    assert!(
        err.contains("shape [3, 8, 8] holds 192 values but each row has 64"),
        "{err}"
    );
    // Bytes and text say what would turn them into numbers.
    let rb = RecordBatch::try_from_iter([
        (
            "img",
            arc(arrow::array::BinaryArray::from_iter_values([b"ab"])),
        ),
        ("name", arc(StringArray::from(vec!["a"]))),
    ])
    .unwrap();
    write_parquet(&c.path("b.parquet"), &[rb], 10);
    for (column, hint) in [("img", "an `image` stage"), ("name", "`cast` or `one_hot`")] {
        let p = c.yaml(&format!(
            "source: {{type: parquet, path: b.parquet}}\nloader:\n  tensors:\n    x: {{column: {column}}}\n"
        ));
        let err = c.fails("validate", &p);
        assert!(
            err.contains(&format!("tensor `x` from column `{column}`: a "))
                && err.contains("cannot become a tensor")
                && err.contains(hint),
            "{err}"
        );
    }
}
