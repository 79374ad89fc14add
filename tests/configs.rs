//! Every file in `configs/` is validated and run.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::*;

#[test]
fn every_config_validates_and_runs() {
    // The Kafka examples (digits-to-kafka publishes, kafka-to-parquet reads back) share a
    // fresh topic on the test broker.
    let topic = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(kafka::create_topic("configs-digits", 2));
    let brokers = kafka::brokers();
    let mut seen = 0;
    let mut entries: Vec<_> = std::fs::read_dir(repo().join("configs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    entries.sort();
    for config in entries {
        let out = tempfile::tempdir().unwrap();
        sluice()
            .env("SLUICE_KAFKA_BROKERS", &brokers)
            .env("SLUICE_KAFKA_TOPIC", &topic)
            .env("SLUICE_OUT_DIR", out.path())
            .arg("validate")
            .arg(&config)
            .assert()
            .success()
            .stdout(predicates::str::contains(": ok"));
        let summary = out.path().join("summary.json");
        sluice()
            .arg("run")
            .arg(&config)
            .arg("--summary-json")
            .arg(&summary)
            .env("SLUICE_OUT_DIR", out.path())
            .env("SLUICE_KAFKA_BROKERS", &brokers)
            .env("SLUICE_KAFKA_TOPIC", &topic)
            .assert()
            .success();
        let report: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
        assert!(
            report["rows_written"].as_u64().unwrap() > 0,
            "{}: wrote nothing",
            config.display()
        );
        // What was read is written, or was removed on purpose and counted.
        let removed: u64 = report["stages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["rows_removed"].as_u64().unwrap())
            .sum();
        assert_eq!(
            report["rows_read"].as_u64().unwrap(),
            report["rows_written"].as_u64().unwrap() + removed,
            "{}: rows unaccounted for",
            config.display()
        );
        seen += 1;
    }
    assert!(seen >= 3, "expected the example configs, found {seen}");
}
