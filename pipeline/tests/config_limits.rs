//! Loading a config: every size setting bounded (with the range and why, at its
//! `file:line:column`), loading linear in the file's size, line endings that all read alike,
//! and messages that stay short and speak the config's language.
#![allow(clippy::unwrap_used)]

use sluice_pipeline::stages::StageConfig;
use sluice_pipeline::{ConfigDocument, ConfigError, ConfigErrors, CpuPool, Error, PipelineConfig};

fn load(text: &str) -> Result<PipelineConfig, Vec<ConfigError>> {
    let doc = ConfigDocument::from_str(text, "p.yaml", ".").map_err(|e| match e {
        Error::Config(c) => c.0,
        other => panic!("{other}"),
    })?;
    let mut errors = Vec::new();
    let config = PipelineConfig::from_document(&doc, &mut errors);
    if errors.is_empty() {
        Ok(config.expect("a config"))
    } else {
        Err(ConfigErrors::sorted(errors).0)
    }
}

fn all(errors: &[ConfigError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

const SOURCE: &str = "source: {type: parquet, path: a.parquet}\n";

#[test]
fn every_size_setting_out_of_range_is_refused_with_its_range_and_why() {
    let errors = load(
        "source: {type: parquet, path: a.parquet, prefetch_bytes: 100 TiB, batch_rows: 0}\n\
         stages:\n  \
         - {type: image, column: img, shape: [100000, 2, 3], ops: [{random_crop: {size: [8, 99999], padding: 100000}}, {horizontal_flip: {}}]}\n\
         sink: {type: parquet, path: o.parquet, row_group_size: 4294967296}\n\
         runtime: {threads: 4294967296, queue_bytes: 10, parallelism: 0}\n\
         loader: {prefetch: 0}\n\
         trainer: {allreduce: {workers: 100000}, eval: {every_steps: 0}}\n",
    )
    .unwrap_err();
    let all = all(&errors);
    for want in [
        "p.yaml:1:58: source (parquet): `prefetch_bytes: 100 TiB` is out of range: allowed 1 KiB–64 GiB; memory the row groups read ahead may take",
        "p.yaml:1:79: source (parquet): `batch_rows: 0` is out of range: allowed 1–16,777,216",
        "p.yaml:3:40: stages[0] (image): `shape[0]: 100000` is out of range: allowed 1–16,384",
        "p.yaml:3:86: stages[0] (image): `ops[0].random_crop.size[1]: 99999` is out of range: allowed 1–16,384",
        "p.yaml:3:103: stages[0] (image): `ops[0].random_crop.padding: 100000` is out of range: allowed at most 16,384",
        "p.yaml:4:56: sink (parquet): `row_group_size: 4294967296` is out of range: allowed 1–16,777,216",
        "p.yaml:5:20: runtime: `threads: 4294967296` is out of range: allowed 0–1,024 (0: one thread per core); each is an operating-system thread",
        "runtime: `queue_bytes: 10` is out of range: allowed 1 KiB–64 GiB",
        "runtime: `parallelism: 0` is out of range: allowed 1–4,096",
        "p.yaml:6:20: loader: `prefetch: 0` is out of range: allowed 1–1,024",
        "trainer: `allreduce.workers: 100000` is out of range: allowed 1–256",
        "trainer: `eval.every_steps: 0` is out of range: allowed at least 1",
    ] {
        assert!(all.contains(want), "missing: {want}\n{all}");
    }
    assert_eq!(errors.len(), 12, "{all}");
}

#[test]
fn threads_zero_means_one_per_core_and_settings_in_range_pass() {
    let config = load(&format!(
        "{SOURCE}stages:\n  - {{type: shuffle, buffer_rows: 100000, max_memory: 200}}\n  - {{type: batch, size: 64}}\nruntime: {{threads: 0, queue_bytes: 4 KiB, world_size: 0}}\n"
    ))
    .unwrap();
    assert_eq!(config.runtime.threads, Some(0));
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    assert_eq!(CpuPool::new(Some(0)).unwrap().threads(), cores.min(1024));
    assert_eq!(CpuPool::new(None).unwrap().threads(), cores.min(1024));
}

/// A pipeline built in code is held to the same bound when its pool starts: the error names
/// the setting and its range, not "internal error".
#[test]
fn a_pool_beyond_the_limit_names_the_setting() {
    let err = CpuPool::new(Some(100_000)).unwrap_err().to_string();
    assert!(
        err.starts_with(
            "runtime.threads: 100000 is out of range: allowed 0–1,024 (0: one thread per core);"
        ),
        "{err}"
    );
    assert!(!err.contains("internal error"), "{err}");
}

#[test]
fn the_number_of_stages_is_bounded() {
    let mut yaml = format!("{SOURCE}stages:\n");
    for _ in 0..10_001 {
        yaml.push_str("  - {type: batch, size: 1}\n");
    }
    let errors = load(&yaml).unwrap_err();
    assert_eq!(
        all(&errors),
        "p.yaml:3:3: `stages` has 10001 entries: allowed at most 10,000; every stage is built and checked before any data moves, and a stateful one runs as a task with a queue of its own"
    );
}

/// 5,000 stages took 184 s when every stage was read by a pass over the whole file. Now a
/// list is read in two passes, and each section from its own lines: this would time out if
/// loading were quadratic again.
#[test]
fn five_thousand_stages_load_in_linear_time() {
    let mut yaml = format!("{SOURCE}stages:\n");
    for i in 0..5000 {
        yaml.push_str(&format!("  - type: batch\n    size: {}\n", i + 1));
    }
    let started = std::time::Instant::now();
    let config = load(&yaml).unwrap();
    eprintln!("5000 stages loaded in {:?}", started.elapsed());
    assert_eq!(config.stages.len(), 5000);
    assert_eq!(config.stages[4999].location, "p.yaml:10001:5");
    assert!(matches!(&config.stages[4999].value, StageConfig::Batch(b) if b.size == 5000));
}

/// A broken stage costs one more pass, and after 50 of them the rest of the list is not read:
/// still linear, and the message says what was not checked.
#[test]
fn a_list_of_broken_stages_is_reported_without_reading_it_thousands_of_times() {
    let mut yaml = format!("{SOURCE}stages:\n");
    for _ in 0..5000 {
        yaml.push_str("  - {type: batch, size: many}\n");
    }
    let errors = load(&yaml).unwrap_err();
    assert_eq!(errors.len(), 51, "{}", all(&errors[..3]));
    assert_eq!(
        errors[0].to_string(),
        "p.yaml:3:25: stages[0] (batch): `size`: expected a non-negative integer, found `many`"
    );
    assert_eq!(
        errors[50].to_string(),
        "p.yaml:53:5: stages[50] and the entries after it were not checked: 50 entries of `stages` before it have problems; fix those and check again"
    );
}

#[test]
fn problems_in_several_stages_are_all_reported() {
    let errors = load(&format!(
        "{SOURCE}stages:\n  - {{type: batch, size: x}}\n  - {{type: batch, size: 2}}\n  - {{type: cast, columns: 3}}\n  - {{type: nope}}\n  - {{type: batch, size: 0, extra: 1}}\n"
    ))
    .unwrap_err();
    let all = all(&errors);
    assert_eq!(errors.len(), 5, "{all}");
    assert!(
        all.contains(
            "p.yaml:3:25: stages[0] (batch): `size`: expected a non-negative integer, found `x`"
        ),
        "{all}"
    );
    assert!(
        all.contains("p.yaml:5:5") || all.contains("p.yaml:5:27"),
        "{all}"
    );
    assert!(
        all.contains("p.yaml:6:12: stages[3]: unknown stage type `nope`"),
        "{all}"
    );
    assert!(
        all.contains("p.yaml:7:25: stages[4] (batch): `size: 0` is out of range"),
        "{all}"
    );
    assert!(
        all.contains("p.yaml:7:28: stages[4] (batch): unknown field `extra`"),
        "{all}"
    );
}

/// Anchors and aliases, a flow-style document and document markers read as before (a
/// section is read from its own lines only where nothing refers across sections).
#[test]
fn anchors_flow_style_and_markers_still_read() {
    let config = load(
        "source: &s {type: parquet, path: a.parquet}\nstages:\n  - &b {type: batch, size: 3}\n  - *b\nruntime: {threads: 1}\n",
    )
    .unwrap();
    assert_eq!(config.stages.len(), 2);
    let config =
        load("{source: {type: parquet, path: a.parquet}, stages: [{type: batch, size: 3}]}")
            .unwrap();
    assert_eq!(config.stages[0].location, "p.yaml:1:53");
    let config = load(
        "# a pipeline\n---\nsource:\n  type: parquet\n  path: 'data/*.parquet'\n\n# between\nstages:\n- type: batch\n  size: 3\n...\n",
    )
    .unwrap();
    assert_eq!(config.stages[0].location, "p.yaml:9:3");
    let errors = load("- a\n- b\n").unwrap_err();
    assert_eq!(
        all(&errors),
        "p.yaml:1:1: a pipeline file is a mapping of sections (`source:`, `stages:`, `sink:`, …); this document is not one"
    );
}

/// CR-only line endings once made the first comment swallow the file, so `${VAR}` was not
/// replaced; LF, CRLF and CR now read alike, positions included.
#[test]
fn lf_crlf_and_cr_line_endings_read_alike() {
    let lf = "# out of ${NOT_A_VARIABLE_HERE}\nsource:\n  type: parquet\n  path: ${SLUICE_TEST_SURELY_UNSET:-data}/a.parquet\nstages:\n  - {type: batch, size: 2}\nruntime: {threads: 5000}\n";
    let mut shown = Vec::new();
    for text in [
        lf.to_string(),
        lf.replace('\n', "\r\n"),
        lf.replace('\n', "\r"),
    ] {
        shown.push(all(&load(&text).unwrap_err()));
        let config = load(&text.replace("threads: 5000", "threads: 2")).unwrap();
        let sluice_pipeline::sources::SourceConfig::Parquet(p) = &config.source.value else {
            panic!("not parquet")
        };
        assert_eq!(
            p.path.as_ref().unwrap().0,
            vec!["data/a.parquet"],
            "{text:?}"
        );
        assert_eq!(config.stages[0].location, "p.yaml:6:5", "{text:?}");
    }
    assert!(
        shown[0].starts_with("p.yaml:7:20: runtime: `threads: 5000` is out of range"),
        "{}",
        shown[0]
    );
    assert_eq!(shown[0], shown[1]);
    assert_eq!(shown[0], shown[2]);
    for text in [
        "a: 1\nb: ${SLUICE_TEST_SURELY_UNSET}\n",
        "a: 1\r\nb: ${SLUICE_TEST_SURELY_UNSET}\r\n",
        "a: 1\rb: ${SLUICE_TEST_SURELY_UNSET}\r",
    ] {
        let errors = load(text).unwrap_err();
        assert_eq!((errors[0].line, errors[0].column), (2, 4), "{text:?}");
    }
}

#[test]
fn several_documents_are_refused_in_the_configs_terms() {
    let errors = load(&format!("{SOURCE}---\n{SOURCE}")).unwrap_err();
    assert_eq!(
        all(&errors),
        "p.yaml:3:1: this file holds several YAML documents (`---`); a pipeline file holds one: keep one, or put each in a file of its own"
    );
}

#[test]
fn a_file_that_is_not_utf8_is_refused_at_the_byte() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.yaml");
    std::fs::write(
        &path,
        b"source:\r\n  type: parquet\r\n  path: caf\xE9.parquet\r\n",
    )
    .unwrap();
    let err = ConfigDocument::from_path(&path).unwrap_err().to_string();
    assert!(
        err.ends_with(
            "p.yaml:3:12: byte offset 37 (0xE9) is not UTF-8; a pipeline file must be UTF-8 text: save it as UTF-8, or remove the byte"
        ),
        "{err}"
    );
}

/// A 50 MB value is shown cut to 80 bytes with a count of the rest; 100,000 unknown keys
/// are all counted, the first 50 shown.
#[test]
fn huge_values_and_long_lists_of_problems_are_cut_with_a_count() {
    let big = "x".repeat(50 << 20);
    let errors = load(&format!("{SOURCE}stages:\n  - {{type: {big}}}\n")).unwrap_err();
    let shown = all(&errors);
    assert!(
        shown.starts_with(&format!(
            "p.yaml:3:12: stages[0]: unknown stage type `{}… (52428720 more bytes)`, expected one of: select, rename,",
            "x".repeat(80)
        )),
        "{}",
        &shown[..shown.len().min(500)]
    );
    assert!(shown.len() < 1000, "{} bytes", shown.len());
    let mut yaml = String::from("source:\n  type: parquet\n  path: a.parquet\n");
    for i in 0..100_000 {
        yaml.push_str(&format!("  k{i}: 1\n"));
    }
    let errors = load(&yaml).unwrap_err();
    assert_eq!(errors.len(), 100_000);
    let shown = ConfigErrors(errors).to_string();
    assert_eq!(shown.lines().count(), 51, "{}", &shown[..300]);
    assert!(shown.ends_with("\n… and 99950 more problems"), "{shown}");
    assert!(
        shown.starts_with("p.yaml:4:3: source (parquet): unknown field `k0`"),
        "{shown}"
    );
}
