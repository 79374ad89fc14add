//! The `sluice` command line: inspect, validate, usage errors, interruption.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use predicates::str::contains;

#[test]
fn inspect_shows_schema_rows_row_groups_and_first_rows() {
    sluice()
        .args(["inspect", "-n", "2"])
        .arg(repo().join("data/digits/train.parquet"))
        .assert()
        .success()
        .stdout(contains("1437 rows, 3 row group(s)"))
        .stdout(contains("    label: Int64"))
        .stdout(contains("pixels: FixedSizeList(64 x UInt8"))
        .stdout(contains("    2: 413 rows"))
        .stdout(contains("[0] id=1, label=1, pixels=[0, 0, 0, 12, 13, 5"))
        .stdout(contains("[1] id=2, label=2"))
        .stdout(contains("[2]").not());
}

#[test]
fn inspect_accepts_globs() {
    let glob = repo().join("data/digits/*.parquet").display().to_string();
    sluice()
        .args(["inspect", "-n", "0", &glob])
        .assert()
        .success()
        .stdout(contains("test.parquet"))
        .stdout(contains("train.parquet"));
}

#[test]
fn validate_prints_the_schema_through_every_stage() {
    sluice()
        .arg("validate")
        .arg(repo().join("configs/quickstart.yaml"))
        .assert()
        .success()
        .stdout(contains("ok — 1 file(s), 1437 rows"))
        .stdout(contains("stages[0] (cast) at "))
        .stdout(contains("pixels: FixedSizeList(64 x Float32"))
        .stdout(contains(
            "on another number of ranks (`--resume --elastic`, `Pipeline::rescale`): an interrupted epoch is finished exactly",
        ));
    // A cross-rank shuffle cannot be continued exactly on other ranks: validate says so.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("p.yaml"),
        format!(
            "source: {{type: parquet, path: '{}/data/digits/train.parquet'}}\nstages:\n  - {{type: shuffle, across_ranks: true}}\n  - {{type: batch, size: 8}}\n",
            repo().display()
        ),
    )
    .unwrap();
    sluice()
        .arg("validate")
        .arg(dir.path().join("p.yaml"))
        .assert()
        .success()
        .stdout(contains(
            "a run continues at the next epoch, the rest of the interrupted one untrained: with `across_ranks`, an old rank's batches depend on all the old ranks exchanging rows",
        ));
}

/// What a `shard` policy leaves out or repeats is in the run summary, as words and as
/// numbers. The digits' row groups (512, 512, 413) dealt to 2 ranks: 925 and 512 rows, so
/// `drop_last` leaves out 413 rows and `pad` reads 413 twice.
#[test]
fn the_summary_counts_what_the_shard_policy_leaves_out_or_repeats() {
    let dir = tempfile::tempdir().unwrap();
    for (policy, rows, left_out, repeated, said) in [
        ("drop_last", 512, 413, 0, "413 row(s) left out by `shard`"),
        ("pad", 925, 0, 413, "413 row(s) read twice by `shard: pad`"),
    ] {
        let yaml = format!(
            "source: {{type: parquet, path: '{}/data/digits/train.parquet', shard: {policy}}}\nruntime: {{rank: 1, world_size: 2}}\nsink: {{type: null}}\n",
            repo().display()
        );
        std::fs::write(dir.path().join("p.yaml"), yaml).unwrap();
        let summary = dir.path().join("s.json");
        sluice()
            .arg("run")
            .arg(dir.path().join("p.yaml"))
            .arg("--summary-json")
            .arg(&summary)
            .assert()
            .success()
            .stdout(contains(format!("  shard    {said}")))
            .stdout(contains("  ready    "))
            .stdout(contains(
                "% of batches were waiting when the sink asked (per queue: ",
            ));
        let r: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
        // Readiness: the sink's, and every queue's, each a share.
        let share = |v: &serde_json::Value| v.as_f64().is_some_and(|x| (0.0..=1.0).contains(&x));
        assert!(share(&r["consumer_readiness"]), "{r}");
        let queues = r["queue_readiness"].as_array().unwrap();
        assert!(
            !queues.is_empty() && queues.iter().all(|q| share(&q["ready"])),
            "{r}"
        );
        // The process's CPU, and its share of the host's cores over the process's life: a
        // share (a short run's used to exceed 1: its setup's CPU over the run's wall time).
        assert!(r["cpu_seconds"].as_f64().is_some_and(|c| c > 0.0), "{r}");
        assert!(
            share(&r["host_cpu_share"]) && r["host_cpu_share"].as_f64() > Some(0.0),
            "{r}"
        );
        assert_eq!(
            (&r["rows_read"], &r["shard_left_out"], &r["shard_repeated"]),
            (&rows.into(), &left_out.into(), &repeated.into()),
            "{policy}: {r}"
        );
    }
}

/// A stage order that `sluice run` refuses (it would break exact resume) is a problem for
/// `validate` too, with the same message.
#[test]
fn validate_reports_a_stage_order_that_run_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        "source: {{type: parquet, path: '{}/data/digits/train.parquet'}}\nstages:\n  - {{type: batch, size: 64}}\n  - {{type: filter, predicate: 'label > 3'}}\n  - {{type: batch, size: 32}}\nsink: {{type: null}}\n",
        repo().display()
    );
    std::fs::write(dir.path().join("p.yaml"), yaml).unwrap();
    for command in ["validate", "run"] {
        sluice()
            .current_dir(dir.path())
            .args([command, "p.yaml"])
            .assert()
            .code(1)
            .stderr(contains("stages[1] (filter) at p.yaml:4:5"))
            .stderr(contains("a filter removes rows after stages[0] (batch)"));
    }
}

/// `--resume` with nothing to resume from: no `checkpoint:` section is an error; a checkpoint
/// that does not exist yet starts from the beginning, saying so.
#[test]
fn resume_without_a_checkpoint_says_what_happens() {
    let dir = tempfile::tempdir().unwrap();
    let source = format!(
        "source: {{type: parquet, path: '{}/data/digits/train.parquet'}}\n",
        repo().display()
    );
    std::fs::write(
        dir.path().join("none.yaml"),
        format!("{source}sink: {{type: null}}\n"),
    )
    .unwrap();
    sluice()
        .current_dir(dir.path())
        .args(["run", "none.yaml", "--resume"])
        .assert()
        .code(1)
        .stderr(contains(
            "--resume: this config has no `checkpoint:` section",
        ));
    std::fs::write(
        dir.path().join("cp.yaml"),
        format!("{source}checkpoint: {{path: state/cp.json}}\nsink: {{type: null}}\n"),
    )
    .unwrap();
    sluice()
        .current_dir(dir.path())
        .args(["run", "cp.yaml", "--resume", "--no-report"])
        .assert()
        .success()
        .stdout(contains("1437 rows read"))
        .stderr(contains("--resume: no checkpoint at file://"))
        .stderr(contains("state/cp.json yet: starting from the beginning"));
}

/// Resuming into an output directory that lost part files the checkpoint covers warns,
/// naming how many: the output holds every row only with them.
#[test]
fn resuming_into_an_output_missing_covered_parts_warns() {
    let dir = tempfile::tempdir().unwrap();
    let job = |epochs: u32| {
        format!(
            "source: {{type: parquet, path: '{}/data/digits/train.parquet', epochs: {epochs}}}\n\
             checkpoint: {{path: cp.json}}\n\
             sink: {{type: parquet, path: out, max_rows_per_file: 500}}\n",
            repo().display()
        )
    };
    std::fs::write(dir.path().join("job.yaml"), job(1)).unwrap();
    sluice()
        .current_dir(dir.path())
        .args(["run", "job.yaml", "--no-report"])
        .assert()
        .success();
    let parts = files_under(&dir.path().join("out")).len();
    assert!(parts >= 3, "{parts} part files");
    std::fs::remove_file(dir.path().join("out/part-00001.parquet")).unwrap();
    std::fs::write(dir.path().join("job.yaml"), job(2)).unwrap();
    sluice()
        .current_dir(dir.path())
        .args(["run", "job.yaml", "--resume", "--no-report"])
        .assert()
        .success()
        .stdout(contains("1437 rows written before this run, 2874 in all"))
        .stderr(contains(format!(
            "the checkpoint covers part files 0..{parts}, but 1 of them are not there"
        )));
    // The second epoch went to new parts; the first one's other parts stayed.
    let left = files_under(&dir.path().join("out"));
    let has = |n: usize| {
        left.iter()
            .any(|f| f.ends_with(&format!("part-{n:05}.parquet")))
    };
    assert!(has(0) && has(parts - 1) && has(parts), "{left:?}");
}

/// `partitioning: hive` on local disk: `key=value` directories become columns (a value
/// pyarrow wrote URI-encoded, `en%20US`, read from the file so named, and decoded). Without
/// it, asking for such a column says how to get it; a file whose keys differ, or a key that
/// is also a column of the file, is refused naming it.
#[test]
fn hive_partition_directories_become_columns() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    for (path, id, _, _) in HIVE_LAYOUT {
        let p = data.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, one_row_parquet(id)).unwrap();
    }
    let run = |source: &str| {
        std::fs::write(
            dir.path().join("job.yaml"),
            format!("source: {{type: parquet, path: 'data/**/*.parquet'{source}}}\nsink: {{type: parquet, path: out.parquet, overwrite: true}}\n"),
        )
        .unwrap();
        sluice()
            .current_dir(dir.path())
            .args(["run", "job.yaml", "--no-report"])
            .assert()
    };
    run(", partitioning: hive").success();
    assert_hive_columns(&read_parquet(&dir.path().join("out.parquet")));
    // `inspect` shows the directories each file would add.
    sluice()
        .current_dir(dir.path())
        .args(["inspect", "-n", "0", "data/**/*.parquet"])
        .assert()
        .success()
        .stdout(contains(
            "  partition directories (columns with `partitioning: hive`): year=2023, lang=en US\n",
        ))
        .stdout(contains(
            "  partition directories (columns with `partitioning: hive`): year=2024, lang=null\n",
        ));
    // `columns` places them, and reads only the file columns it names.
    run(", partitioning: hive, columns: [lang, id]").success();
    let out = read_parquet(&dir.path().join("out.parquet"));
    let names: Vec<String> = out[0]
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    assert_eq!(names, ["lang", "id"]);
    run(", columns: [id, lang]")
        .code(1)
        .stderr(contains(
            "column `lang` does not exist; available columns: id",
        ))
        .stderr(contains(
            "the path has a `lang=…` directory: set `partitioning: hive` to read it as a column",
        ));
    // Typed: `year` an int32 column, so a numeric filter works on it.
    run(", partitioning: hive, partition_types: {year: int32}}\nstages:\n  - {type: filter, predicate: 'year >= 2024'").success();
    let out = read_parquet(&dir.path().join("out.parquet"));
    assert_eq!(
        out[0].schema().field_with_name("year").unwrap().data_type(),
        &arrow::datatypes::DataType::Int32
    );
    assert_eq!(int64_values(&out, "id"), [2]);
    let year: Vec<i32> = out
        .iter()
        .flat_map(|b| {
            use arrow::array::AsArray;
            b.column_by_name("year")
                .unwrap()
                .as_primitive::<arrow::datatypes::Int32Type>()
                .values()
                .to_vec()
        })
        .collect();
    assert_eq!(year, [2024]);
    run(", partitioning: hive, partition_types: {lang: int32}")
        .code(1)
        .stderr(contains("year=2023/lang=en%20US/f.parquet"))
        .stderr(contains(
            "the partition directory `lang=en US` is not a `int32` value (`partition_types`)",
        ));
    run(", partitioning: hive, partition_types: {yaer: int32}")
        .code(1)
        .stderr(contains(
            "`partition_types` names `yaer`, which is not a `key=…` directory of the path; the path has [year, lang]",
        ))
        .stderr(contains("did you mean `year`?"));
    run(", partition_types: {year: int32}")
        .code(1)
        .stderr(contains("set `partitioning: hive` too"));
    // A file with other keys.
    let odd = data.join("year=2025/f.parquet");
    std::fs::create_dir_all(odd.parent().unwrap()).unwrap();
    std::fs::write(&odd, one_row_parquet(3)).unwrap();
    run(", partitioning: hive")
        .code(1)
        .stderr(contains("year=2025/f.parquet: schema differs from"))
        .stderr(contains(
            "partition directories [year=…] where the first file has [year=…, lang=…]",
        ));
    std::fs::remove_file(&odd).unwrap();
    // A key that is a column of the file too.
    let clash = data.join("year=2023/lang=en/id=7/f.parquet");
    std::fs::create_dir_all(clash.parent().unwrap()).unwrap();
    std::fs::write(&clash, one_row_parquet(7)).unwrap();
    run(", partitioning: hive").code(1).stderr(contains(
        "column `id` is both in the file and a partition directory (`id=…`) of its path",
    ));
}

/// A run whose stages remove every row ends ok (the rows are counted) but warns that the
/// sink got nothing, naming the stage.
#[test]
fn a_run_whose_stages_remove_every_row_warns() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("job.yaml"),
        format!(
            "source: {{type: parquet, path: '{}/data/digits/train.parquet'}}\nstages:\n  - {{type: batch, size: 5000, drop_last: true}}\n",
            repo().display()
        ),
    )
    .unwrap();
    sluice()
        .current_dir(dir.path())
        .args(["run", "job.yaml", "--no-report"])
        .assert()
        .success()
        .stdout(contains("1437 dropped by drop_last"))
        .stderr(contains(
            "no row reached the sink: the 1437 rows read were removed, 1437 of them dropped by drop_last by stages[0] (batch)",
        ));
}

/// `across_ranks` on one rank does nothing: the run says so instead of implying an exchange.
#[test]
fn a_cross_rank_shuffle_on_one_rank_is_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("job.yaml"),
        format!(
            "source: {{type: parquet, path: '{}/data/digits/train.parquet'}}\nstages:\n  - {{type: shuffle, buffer_rows: 1437, across_ranks: true}}\n",
            repo().display()
        ),
    )
    .unwrap();
    sluice()
        .current_dir(dir.path())
        .args(["run", "job.yaml", "--no-report"])
        .env_remove("WORLD_SIZE")
        .env_remove("SLUICE_WORLD_SIZE")
        .assert()
        .success()
        .stderr(contains(
            "stages[0] (shuffle) at job.yaml:3:5: `across_ranks` has no other rank to exchange rows with (world_size 1)",
        ));
}

#[test]
fn usage_errors_exit_2() {
    sluice().arg("frobnicate").assert().code(2);
    sluice().arg("run").assert().code(2);
    sluice()
        .arg("--help")
        .assert()
        .success()
        .stdout(contains("validate"));
}

/// `train --help` says what `--elastic` does today: the rest of the interrupted epoch is dealt
/// out to the new workers (it used to say that rest was skipped).
#[cfg(feature = "torch")]
#[test]
fn train_help_describes_elastic_resume_as_it_behaves() {
    let out = sluice().args(["train", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        help.contains("the batches the old workers still owed of the interrupted epoch are dealt out to the new ones, each trained once"),
        "{help}"
    );
    assert!(!help.contains("is not trained"), "{help}");
}

use predicates::prelude::PredicateBooleanExt;

#[cfg(unix)]
#[test]
fn interrupt_stops_cleanly_without_partial_output() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let config = dir.path().join("p.yaml");
    // Long enough that it is still running when interrupted (≈2.9M rows).
    std::fs::write(
        &config,
        format!(
            "source: {{type: parquet, path: '{}', epochs: 2000}}\nstages:\n- {{type: cast, columns: {{pixels: float32}}}}\nsink: {{type: parquet, path: out/big.parquet, compression: none}}\n",
            repo().join("data/digits/train.parquet").display()
        ),
    )
    .unwrap();
    let bin = assert_cmd::cargo::cargo_bin!("sluice");
    let mut child = std::process::Command::new(bin)
        .arg("run")
        .arg(&config)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait (bounded) until output has started: the upload's staging file exists.
    let deadline = Instant::now() + Duration::from_secs(60);
    while files_under(&out).is_empty() {
        assert!(Instant::now() < deadline, "the run never started writing");
        assert!(
            child.try_wait().unwrap().is_none(),
            "the run ended before it could be interrupted"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let status = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("interrupted"), "{stderr}");
    assert_eq!(
        files_under(&out),
        Vec::<String>::new(),
        "partial output left behind"
    );
}

/// `group_by_length` end to end: `sluice run` notes the grouping, writes every row once, and
/// the batches it writes (an Arrow IPC file keeps them) need a fraction of the padding of
/// plainly shuffled ones; a window that is no multiple of the batch size is refused with the
/// stage's place in the file.
#[test]
fn a_shuffle_grouping_by_length_writes_batches_of_similar_lengths() {
    use arrow::array::{AsArray, Int64Array, ListArray, RecordBatch};
    use arrow::datatypes::Int32Type;
    let dir = tempfile::tempdir().unwrap();
    let ids: Vec<i64> = (0..3000).collect();
    let len = |id: i64| (id * 7919 % 300 + 1) as usize;
    let toks = ListArray::from_iter_primitive::<Int32Type, _, _>(
        ids.iter().map(|&v| Some(vec![Some(v as i32); len(v)])),
    );
    let rb = RecordBatch::try_from_iter([
        ("id", arc(Int64Array::from(ids.clone()))),
        ("input_ids", arc(toks)),
    ])
    .unwrap();
    write_parquet(&dir.path().join("seqs.parquet"), &[rb], 500);
    let run = |group: &str, buffer: usize| {
        std::fs::write(
            dir.path().join("job.yaml"),
            format!(
                "source: {{type: parquet, path: seqs.parquet}}\nstages:\n  - type: shuffle\n    buffer_rows: {buffer}\n    seed: 7\n{group}  - {{type: batch, size: 32}}\nsink: {{type: arrow_ipc, path: out.arrow}}\n"
            ),
        )
        .unwrap();
        sluice()
            .current_dir(dir.path())
            .args(["run", "job.yaml", "--no-report"])
            .assert()
    };
    // Padding to each batch's longest row, and the ids, of what the run wrote.
    let written = || {
        let f = std::fs::File::open(dir.path().join("out.arrow")).unwrap();
        let mut ids = Vec::new();
        let mut padding = 0;
        for b in arrow::ipc::reader::FileReader::try_new(f, None).unwrap() {
            let b = b.unwrap();
            ids.extend(int64_values(std::slice::from_ref(&b), "id"));
            let offsets = b
                .column_by_name("input_ids")
                .unwrap()
                .as_list::<i32>()
                .offsets()
                .clone();
            let lens: Vec<i32> = offsets.windows(2).map(|w| w[1] - w[0]).collect();
            let longest = *lens.iter().max().unwrap();
            padding += lens.iter().map(|l| longest - l).sum::<i32>();
        }
        ids.sort_unstable();
        (ids, padding)
    };
    let grouping = "    group_by_length: {column: input_ids, batches: 8}\n";
    run(grouping, 1024).success().stdout(contains(
        "groups rows by the length of `input_ids` for stages[1] (batch) at job.yaml:7:5: windows cut into groups of 8 batches of 32",
    ));
    let (got, grouped) = written();
    assert_eq!(got, ids);
    run("", 1024).success();
    let (got, plain) = written();
    assert_eq!(got, ids);
    assert!(
        grouped * 4 < plain,
        "padding {grouped} grouped, {plain} plain"
    );
    run(grouping, 1000)
        .code(1)
        .stderr(contains("stages[0] (shuffle) at job.yaml:3:5"))
        .stderr(contains(
            "`group_by_length` needs `buffer_rows` (1000) to be a multiple of the batch size (32)",
        ))
        .stderr(contains("use 992 or 1024"));
}

/// `mix`: two datasets 3 : 1, every epoch all of the smaller one and a new third of the
/// larger; `validate` and the run's summary say what each gives, and a share the weights
/// cannot give without repeating rows is refused before anything is read.
#[test]
fn a_mix_of_two_datasets_takes_each_its_share_every_epoch() {
    use arrow::array::{Int64Array, RecordBatch};
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, ids: std::ops::Range<i64>| {
        std::fs::create_dir_all(dir.path().join(name)).unwrap();
        let rb =
            RecordBatch::try_from_iter([("id", arc(Int64Array::from_iter_values(ids)))]).unwrap();
        write_parquet(&dir.path().join(name).join("part-0.parquet"), &[rb], 100);
    };
    write("web", 0..3000);
    write("books", 10_000..10_300);
    let job = |extra: &str| {
        std::fs::write(
            dir.path().join("job.yaml"),
            format!(
                "source:\n  type: parquet\n  path: [web, books]\n  epochs: 3\n  mix: {{weights: [3, 1], seed: 1{extra}}}\nstages:\n  - {{type: shuffle, buffer_rows: 256, seed: 2}}\n  - {{type: batch, size: 100}}\nsink: {{type: arrow_ipc, path: out.arrow}}\n"
            ),
        )
        .unwrap();
    };
    job("");
    sluice()
        .current_dir(dir.path())
        .args(["validate", "job.yaml"])
        .assert()
        .success()
        .stdout(contains("mix: `web` 900 of its 3000 rows each epoch"))
        .stdout(contains("mix: `books` 300 of its 300 rows each epoch"));
    sluice()
        .current_dir(dir.path())
        .args(["run", "job.yaml", "--summary-json", "s.json"])
        .assert()
        .success()
        .stdout(contains("  mix      web: 900 of its 3000 rows each epoch"));
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("s.json")).unwrap()).unwrap();
    assert_eq!(
        r["mix"],
        serde_json::json!([
            {"path": "web", "rows": 3000, "per_epoch": 900},
            {"path": "books", "rows": 300, "per_epoch": 300}
        ]),
        "{r}"
    );
    let f = std::fs::File::open(dir.path().join("out.arrow")).unwrap();
    let batches: Vec<RecordBatch> = arrow::ipc::reader::FileReader::try_new(f, None)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let ids = int64_values(&batches, "id");
    assert_eq!(ids.len(), 3 * 1200);
    // Three epochs: every book three times, 2700 distinct web rows (nothing repeated yet).
    let web: std::collections::BTreeSet<i64> =
        ids.iter().copied().filter(|i| *i < 10_000).collect();
    assert_eq!(web.len(), 2700);
    assert_eq!(ids.iter().filter(|i| **i >= 10_000).count(), 900);
    job(", rows_per_epoch: 2000");
    sluice()
        .current_dir(dir.path())
        .args(["run", "job.yaml"])
        .assert()
        .code(1)
        .stderr(contains("source at job.yaml:2:3"))
        .stderr(contains(
            "`mix.rows_per_epoch: 2000` would take 500 rows of `path` entry 1 (`books`), which has 300",
        ))
        .stderr(contains("allow at most 1200 rows per epoch"));
}
