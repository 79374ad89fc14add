//! Tests of reading whole pipeline configs: sections, stage settings, image ops and the
//! errors reported for a wrong file.

use bytesize::ByteSize;

use super::PipelineConfig;
use crate::config::*;
use crate::source::*;
use crate::stage::*;

fn load(text: &str) -> Result<PipelineConfig, Vec<ConfigError>> {
    let doc = ConfigDocument::from_str(text, "p.yaml", ".").map_err(|e| match e {
        crate::Error::Config(c) => c.0,
        other => panic!("{other}"),
    })?;
    let mut errors = Vec::new();
    let cfg = PipelineConfig::from_document(&doc, &mut errors);
    if errors.is_empty() {
        Ok(cfg.expect("config"))
    } else {
        Err(errors)
    }
}

#[test]
fn parses_a_full_pipeline() {
    let cfg = load(
        "source:\n  type: parquet\n  path: [a.parquet, 'b/*.parquet']\n  columns: [x, y]\nstages:\n  - {type: cast, columns: {x: float32}}\n  - type: filter\n    predicate: y < 5\n  - {type: batch, size: 32, drop_last: true}\nruntime:\n  threads: 2\n  queue_bytes: 1 MiB\nsink: {type: null}\n",
    )
    .unwrap();
    let SourceConfig::Parquet(p) = &cfg.source.value else {
        panic!("not parquet")
    };
    assert_eq!(p.path.as_ref().unwrap().0, vec!["a.parquet", "b/*.parquet"]);
    assert_eq!(p.batch_rows, 8192);
    assert_eq!(cfg.stages.len(), 3);
    assert_eq!(cfg.stages[1].location, "p.yaml:7:5");
    assert_eq!(cfg.runtime.queue_bytes, ByteSize::mib(1));
    assert_eq!(
        cfg.stages[2].value,
        StageConfig::Batch(BatchConfig {
            size: 32,
            drop_last: true
        })
    );
}

#[test]
fn reports_every_problem_with_positions() {
    let errs = load(
        "source:\n  type: parquet\n  path: a.parquet\n  colums: [x]\nstages:\n  - type: cast\n    columns: {x: float33}\n  - type: batch\n    size: many\n  - type: shufle\n  - {type: clip}\n  - {columns: [x]}\nextra: 1\n",
    )
    .unwrap_err();
    let text: Vec<String> = errs.iter().map(ToString::to_string).collect();
    let all = text.join("\n");
    assert_eq!(errs.len(), 7, "{all}");
    assert!(all.contains("p.yaml:13:1: unknown top-level key `extra`, expected one of: source, stages, runtime, sink"), "{all}");
    assert!(
        all.contains("p.yaml:4:3: source (parquet): unknown field `colums`, expected one of"),
        "{all}"
    );
    assert!(
        all.contains("p.yaml:7:18: stages[0] (cast): unknown type `float33`"),
        "{all}"
    );
    assert!(all.contains("p.yaml:9:11: stages[1] (batch)"), "{all}");
    assert!(
        all.contains(
            "p.yaml:10:11: stages[2]: unknown stage type `shufle`, expected one of: select,"
        ),
        "{all}"
    );
    // The likely intended name, when one is close; none for a name like none of them.
    assert!(
        all.contains("expected one of path, manifest, storage, columns, batch_rows, prefetch, prefetch_bytes, memory_map, epochs, shard, partitioning, partition_types, mix; did you mean `columns`?"),
        "{all}"
    );
    assert!(
        all.contains("mask_tokens, mixup; did you mean `shuffle`?"),
        "{all}"
    );
    assert!(
        !all.contains("`extra`, expected one of: source, stages, runtime, sink; did you mean"),
        "{all}"
    );
    assert!(
        all.contains("stages[3] (clip): missing field `columns`"),
        "{all}"
    );
    assert!(all.contains("stages[4]: missing field `type`"), "{all}");
}

/// One image op read from its YAML (`- <op>` in an image stage's `ops`, on line 7 of the
/// document), or every error, joined.
fn image_op(op: &str) -> Result<ImageOp, String> {
    let doc = format!(
        "source: {{type: parquet, path: a.parquet}}\nstages:\n  - type: image\n    column: img\n    shape: [32, 32, 3]\n    ops:\n      - {op}\n"
    );
    match load(&doc) {
        Ok(cfg) => match &cfg.stages[0].value {
            StageConfig::Image(img) => Ok(img.ops[0].clone()),
            other => panic!("not an image stage: {other:?}"),
        },
        Err(errs) => Err(errs
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n")),
    }
}

#[test]
fn padding_mode_is_read_and_a_wrong_one_is_placed() {
    let crop = |mode: &str| {
        image_op(&format!(
            "random_crop: {{size: [32, 32], padding: 4, padding_mode: {mode}}}"
        ))
    };
    assert_eq!(
        crop("reflect").unwrap(),
        ImageOp::RandomCrop {
            size: [32, 32],
            padding: 4,
            padding_mode: PaddingMode::Reflect,
            pad_if_needed: false,
            fill: PadFill::default(),
        }
    );
    let all = crop("mirror").unwrap_err();
    assert!(all.contains("p.yaml:7:"), "{all}");
    assert!(all.contains("unknown variant `mirror`"), "{all}");
    assert!(
        all.contains("constant") && all.contains("symmetric"),
        "{all}"
    );
}

#[test]
fn crop_fill_is_a_number_or_a_list_and_pad_if_needed_a_bool() {
    let crop = |rest: &str| image_op(&format!("random_crop: {{size: [8, 8]{rest}}}"));
    let read = |rest: &str| match crop(rest).unwrap() {
        ImageOp::RandomCrop {
            pad_if_needed,
            fill,
            ..
        } => (pad_if_needed, fill.0),
        other => panic!("not a crop: {other:?}"),
    };
    assert_eq!(read(""), (false, vec![0.0]));
    assert_eq!(read(", fill: 128"), (false, vec![128.0]));
    assert_eq!(
        read(", pad_if_needed: true, fill: [124, 116.5, 104]"),
        (true, vec![124.0, 116.5, 104.0])
    );
    let e = crop(", fill: grey").unwrap_err();
    assert!(e.contains("p.yaml:7:"), "{e}");
    assert!(
        e.contains("a pixel value (0–255) or a list of them, one per channel"),
        "{e}"
    );
    let e = crop(", pad_if_needed: sometimes").unwrap_err();
    assert!(e.contains("p.yaml:7:"), "{e}");
}

#[test]
fn erase_value_is_a_number_a_list_or_random() {
    let erase = |value: &str| image_op(&format!("random_erasing: {{p: 0.5, value: {value}}}"));
    let value = |text: &str| match erase(text).unwrap() {
        ImageOp::RandomErasing { value, .. } => value,
        other => panic!("not erasing: {other:?}"),
    };
    assert_eq!(value("-1"), EraseValue::Values(vec![-1.0]));
    assert_eq!(value("0.5"), EraseValue::Values(vec![0.5]));
    assert_eq!(
        value("[0.1, 0.2, 0.3]"),
        EraseValue::Values(vec![0.1, 0.2, 0.3])
    );
    assert_eq!(value("random"), EraseValue::Random);
    let all = erase("noise").unwrap_err();
    assert!(all.contains("p.yaml:7:"), "{all}");
    assert!(
        all.contains("a number, a list of numbers (one per channel), or `random`"),
        "{all}"
    );
}

/// A document that is not valid YAML is reported once, where it breaks, not once per
/// section read from it; a key given twice says so in the config's terms.
#[test]
fn yaml_errors_are_reported_once() {
    for (text, want) in [
        (
            "source: {type: parquet, path: a.parquet}\nsource: {type: parquet, path: b.parquet}\n",
            "p.yaml:2:1: `source` is given twice in the same mapping: keep one",
        ),
        (
            "source: {type: parquet, path: a.parquet}\nstages:\n  - {type: batch, size: 10, size: 20}\n",
            "p.yaml:3:29: `size` is given twice in the same mapping: keep one",
        ),
        (
            "source: {type: parquet, path: a.parquet\nstages: []\n",
            "p.yaml:2:7: while parsing a flow mapping, did not find expected ',' or '}'",
        ),
    ] {
        let err = ConfigDocument::from_str(text, "p.yaml", ".").unwrap_err();
        let crate::Error::Config(errs) = err else {
            panic!("{err}")
        };
        let all: Vec<String> = errs.0.iter().map(ToString::to_string).collect();
        assert_eq!(all, vec![want.to_string()]);
    }
}

#[test]
fn missing_source_is_reported() {
    let errs = load("stages: []\n").unwrap_err();
    assert!(
        errs[0]
            .message
            .contains("missing required section `source`"),
        "{}",
        errs[0]
    );
}
