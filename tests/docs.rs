//! The config reference documents every key of every component.
#![allow(clippy::unwrap_used)]

mod common;

use sluice::pipeline::config::{Component, SourceConfig, StageConfig, component_fields};
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

#[test]
fn config_reference_covers_every_key() {
    let doc = std::fs::read_to_string(common::repo().join("docs/config.md")).unwrap();
    check::<SourceConfig>(&doc, "## `source`");
    check::<StageConfig>(&doc, "## `stages`");
    check::<SinkConfig>(&doc, "## `sink`");
    let runtime = section(&doc, "## `runtime`");
    for key in [
        "threads",
        "parallelism",
        "queue_bytes",
        "rank",
        "world_size",
    ] {
        assert!(
            runtime.contains(&format!("`{key}`")),
            "runtime key `{key}` undocumented"
        );
    }
    let checkpoint = section(&doc, "## `checkpoint`");
    for key in ["path", "interval", "storage"] {
        assert!(
            checkpoint.contains(&format!("`{key}`")),
            "checkpoint key `{key}` undocumented"
        );
    }
}
