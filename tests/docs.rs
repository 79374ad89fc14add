//! The config reference documents every key of every component and section, listed from the
//! code (serde's own field lists), not by hand.
#![allow(clippy::unwrap_used)]

use crate::common;

use serde::de::DeserializeOwned;
use sluice::pipeline::config::{Component, RuntimeConfig, component_fields, struct_fields};
use sluice::pipeline::sources::SourceConfig;
use sluice::pipeline::stages::StageConfig;
use sluice::sinks::SinkConfig;

fn section<'a>(doc: &'a str, heading: &str) -> &'a str {
    let start = doc
        .find(heading)
        .unwrap_or_else(|| panic!("docs/config.md has no `{heading}` section"));
    let rest = &doc[start + heading.len()..];
    let end = rest
        .find("\n## ")
        .into_iter()
        .chain(rest.find("\n### "))
        .min()
        .unwrap_or(rest.len());
    &rest[..end]
}

fn check<T: Component>(doc: &str, top: &str) {
    let start = doc
        .find(top)
        .unwrap_or_else(|| panic!("docs/config.md has no `{top}` section"));
    let rest = &doc[start + top.len()..];
    let doc = &rest[..rest.find("\n## ").unwrap_or(rest.len())];
    for kind in T::KINDS {
        let text = section(doc, &format!("### `type: {kind}`"));
        for field in component_fields::<T>(kind).unwrap() {
            assert!(
                text.contains(&format!("`{field}`")),
                "docs/config.md, `type: {kind}`: key `{field}` is not documented"
            );
        }
    }
}

/// Every field of `T` is named, in backticks, in `text` (a section of the reference).
fn documents<T: DeserializeOwned>(text: &str, section: &str) {
    let fields = struct_fields::<T>()
        .unwrap_or_else(|| panic!("{section}: {} is not a struct", std::any::type_name::<T>()));
    for field in fields {
        assert!(
            text.contains(&format!("`{field}`")),
            "docs/config.md, {section}: key `{field}` is not documented"
        );
    }
}

/// Every field of `T` (a map inside a section's row, e.g. `allreduce`) is named in `text`,
/// in backticks (also with its default, `` `gamma: 0.1` ``) or in an inline map
/// (`{path, every_steps: 100}`).
fn mentions<T: DeserializeOwned>(text: &str, section: &str) {
    for field in struct_fields::<T>().unwrap() {
        let named = [
            format!("`{field}`"),
            format!("{{{field}"),
            format!(" {field},"),
            format!(" {field}}}"),
            format!(" {field}:"),
            format!("`{field}:"),
            format!("({field}"),
        ];
        assert!(
            named.iter().any(|n| text.contains(n.as_str())),
            "docs/config.md, {section}: key `{field}` of {} is not documented",
            std::any::type_name::<T>()
        );
    }
}

#[test]
fn every_section_documents_every_key_of_its_struct() {
    let doc = std::fs::read_to_string(common::repo().join("docs/config.md")).unwrap();
    documents::<RuntimeConfig>(section(&doc, "## `runtime`"), "runtime");
    documents::<sluice::CheckpointConfig>(section(&doc, "## `checkpoint`"), "checkpoint");
    #[cfg(feature = "torch")]
    {
        use sluice::loader::{LoaderConfig, TensorSpec};
        use sluice::trainer::config::{
            AllReduceConfig, EvalConfig, ScheduleConfig, TrainCheckpointConfig, TrainerConfig,
        };
        let loader = section(&doc, "## `loader`");
        documents::<LoaderConfig>(loader, "loader");
        documents::<TensorSpec>(loader, "loader.tensors");
        let trainer = section(&doc, "## `trainer`");
        documents::<TrainerConfig>(trainer, "trainer");
        mentions::<AllReduceConfig>(trainer, "trainer.allreduce");
        mentions::<ScheduleConfig>(trainer, "trainer.schedule");
        mentions::<EvalConfig>(trainer, "trainer.eval");
        mentions::<TrainCheckpointConfig>(trainer, "trainer.checkpoint");
    }
}

/// The probe sees a struct's fields and nothing for a type that is not a struct.
#[test]
fn struct_fields_come_from_the_code() {
    let runtime = struct_fields::<RuntimeConfig>().unwrap();
    assert!(runtime.contains(&"threads") && runtime.contains(&"queue_bytes"));
    assert_eq!(struct_fields::<u64>(), None);
}

#[test]
fn config_reference_covers_every_key() {
    let doc = std::fs::read_to_string(common::repo().join("docs/config.md")).unwrap();
    check::<SourceConfig>(&doc, "## `source`");
    check::<StageConfig>(&doc, "## `stages`");
    check::<SinkConfig>(&doc, "## `sink`");
}
