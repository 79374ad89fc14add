//! Kafka brokers that cannot be used, against the real broker (Tansu, from
//! `scripts/services.sh`): unreachable brokers, a topic that does not exist and a failed login
//! stop the source or the sink fast, saying why.
#![allow(clippy::unwrap_used)]

use crate::common;
use crate::kafka::run_in;

use std::time::{Duration, Instant};

use common::kafka::{self, JSON_SCHEMA};
use common::{repo, wait_for};

/// A Kafka sink whose brokers are down stops within `connect_timeout`, naming them, and logs
/// librdkafka's repeated errors once each (they were 120-odd lines in 3 s).
#[test]
fn a_sink_with_unreachable_brokers_fails_fast_and_quietly() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("down.yaml"),
        format!(
            "source: {{type: parquet, path: '{}/data/digits/train.parquet'}}\nsink: {{type: kafka, brokers: '127.0.0.1:9', topic: t, format: json, connect_timeout: 3s}}\n",
            repo().display()
        ),
    )
    .unwrap();
    let out = run_in(dir.path(), &["run", "down.yaml"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot reach the brokers 127.0.0.1:9 within 3.0s"),
        "{err}"
    );
    assert!(err.matches("1/1 brokers are down").count() <= 1, "{err}");
    assert!(err.lines().count() < 20, "{err}");
}

#[test]
fn unreachable_broker_and_unknown_topic_fail_fast_and_clearly() {
    let dir = tempfile::tempdir().unwrap();
    // Port 9 on loopback (discard) is closed here.
    std::fs::write(
        dir.path().join("down.yaml"),
        format!(
            "source:\n  type: kafka\n  brokers: 127.0.0.1:9\n  topic: t\n  format: json\n  schema: {JSON_SCHEMA}\n  connect_timeout: 3s\n"
        ),
    )
    .unwrap();
    let started = Instant::now();
    let out = run_in(dir.path(), &["run", "down.yaml"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("127.0.0.1:9"), "{err}");
    assert!(err.contains("cannot reach the brokers within 3s"), "{err}");
    // librdkafka repeats its errors (hundreds of "all brokers down"): each is logged once.
    assert!(err.matches("1/1 brokers are down").count() <= 1, "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );

    std::fs::write(
        dir.path().join("missing.yaml"),
        format!(
            "source:\n  type: kafka\n  brokers: {}\n  topic: no-such-topic-here\n  format: json\n  schema: {JSON_SCHEMA}\n",
            kafka::brokers()
        ),
    )
    .unwrap();
    let out = run_in(dir.path(), &["run", "missing.yaml"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("topic `no-such-topic-here` does not exist"),
        "{err}"
    );

    // A Kafka sink to a topic that does not exist is refused before anything runs.
    std::fs::write(
        dir.path().join("sink.yaml"),
        format!(
            "source: {{type: parquet, path: {}}}\nsink:\n  type: kafka\n  brokers: {}\n  topic: no-such-sink-topic\n  format: json\n",
            common::repo().join("data/digits/test.parquet").display(),
            kafka::brokers()
        ),
    )
    .unwrap();
    let out = run_in(dir.path(), &["run", "sink.yaml"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no-such-sink-topic"), "{err}");
    assert!(err.contains("does not exist"), "{err}");
}

#[test]
fn authentication_failure_is_reported_within_the_timeout_without_the_secret() {
    let dir = tempfile::tempdir().unwrap();
    let port = kafka::free_port();
    let url = format!("tcp://127.0.0.1:{port}");
    let mut broker = std::process::Command::new(kafka::tansu())
        .args([
            "broker",
            "--listener-url",
            &url,
            "--advertised-listener-url",
            &url,
            "--storage-engine",
            "memory://tansu/",
            "--authentication",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_for("the broker to listen", Duration::from_secs(30), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).ok()
    });
    std::fs::write(
        dir.path().join("job.yaml"),
        format!(
            "source:\n  type: kafka\n  brokers: 127.0.0.1:{port}\n  topic: t\n  format: raw\n  connect_timeout: 3s\n  properties:\n    security.protocol: SASL_PLAINTEXT\n    sasl.mechanism: SCRAM-SHA-256\n    sasl.username: alice\n    sasl.password: not-the-password-8d1f\n"
        ),
    )
    .unwrap();
    let started = Instant::now();
    let out = run_in(dir.path(), &["run", "job.yaml"]);
    broker.kill().unwrap();
    broker.wait().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(started.elapsed() < Duration::from_secs(30));
    let err = String::from_utf8_lossy(&out.stderr);
    let last = err.lines().last().unwrap_or_default();
    assert!(last.contains("cannot reach the brokers within 3s"), "{err}");
    assert!(last.contains("SASL authentication error"), "{last}");
    assert!(
        !err.contains("not-the-password-8d1f"),
        "the secret leaked: {err}"
    );
    let out = String::from_utf8_lossy(&out.stdout);
    assert!(!out.contains("not-the-password-8d1f"));
}
