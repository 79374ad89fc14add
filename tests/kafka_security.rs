//! Kafka security against the real broker. TLS: scripts/services.sh makes a test CA and a
//! broker certificate with openssl and starts a Tansu broker behind a TLS-terminating proxy
//! that it advertises (Tansu 0.6 takes `--cert` but serves no TLS; a proxy ending TLS in front
//! of the brokers is also a common deployment). SASL: another Tansu broker behind
//! scripts/sasl_proxy.py, which runs the broker's side of PLAIN and SCRAM (PyPI's `scramp`;
//! Tansu 0.6 keeps no SCRAM users). librdkafka's TLS and SASL clients are the real ones, in
//! the source and the sink.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::time::{Duration, Instant};

use common::*;

/// The TLS brokers and the CA that signed their certificate.
fn tls() -> (String, String) {
    let brokers = std::env::var("SLUICE_TEST_KAFKA_TLS_BROKERS").unwrap_or_else(|_| {
        panic!(
            "SLUICE_TEST_KAFKA_TLS_BROKERS is not set: the Kafka TLS tests need the TLS broker. Run \
             the suite with scripts/test.sh, or `eval \"$(scripts/services.sh start)\"` first"
        )
    });
    (brokers, std::env::var("SLUICE_TEST_TLS_CA").unwrap())
}

/// A CA that signed nothing the servers present.
fn other_ca() -> String {
    std::env::var("SLUICE_TEST_TLS_OTHER_CA").unwrap()
}

/// The SASL brokers and the user they accept.
fn sasl() -> (String, String, String) {
    let env = |v: &str| {
        std::env::var(v).unwrap_or_else(|_| {
            panic!("{v} is not set: the SASL tests need the SASL broker; use scripts/test.sh")
        })
    };
    (
        env("SLUICE_TEST_KAFKA_SASL_BROKERS"),
        env("SLUICE_TEST_KAFKA_SASL_USER"),
        env("SLUICE_TEST_KAFKA_SASL_PASSWORD"),
    )
}

/// librdkafka settings trusting `ca`.
fn over_tls(ca: &str) -> Vec<(&'static str, String)> {
    vec![
        ("security.protocol", "SSL".into()),
        ("ssl.ca.location", ca.into()),
    ]
}

/// librdkafka settings logging in with `mechanism`.
fn with_sasl(mechanism: &str, user: &str, password: &str) -> Vec<(&'static str, String)> {
    vec![
        ("security.protocol", "SASL_PLAINTEXT".into()),
        ("sasl.mechanism", mechanism.into()),
        ("sasl.username", user.into()),
        ("sasl.password", password.into()),
    ]
}

/// The `properties:` of a Kafka source or sink with `settings` (indented for either).
fn properties(settings: &[(&str, String)]) -> String {
    let mut out = "  properties:\n".to_string();
    for (k, v) in settings {
        out.push_str(&format!("    {k}: {v}\n"));
    }
    out
}

fn run(dir: &std::path::Path, yaml: &str) -> (std::process::Output, Duration) {
    std::fs::write(dir.join("job.yaml"), yaml).unwrap();
    let started = Instant::now();
    let out = run_in_for(dir, &["run", "job.yaml"], Duration::from_secs(120));
    (out, started.elapsed())
}

/// The digits test set's ids, sorted.
fn test_ids() -> Vec<i64> {
    let mut ids = int64_values(
        &read_parquet(&repo().join("data/digits/test.parquet")),
        "id",
    );
    ids.sort_unstable();
    ids
}

/// The digits test set's rows published by the Kafka sink (keyed by `id`) to a new topic and
/// read back by the Kafka source, both clients with `settings`: the ids read back, sorted, and
/// both runs' output.
fn round_trip(brokers: &str, settings: &[(&str, String)]) -> (Vec<i64>, [std::process::Output; 2]) {
    let client: Vec<(&str, &str)> = settings.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let topic = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(kafka::create_topic_with(brokers, "secure", 2, &client));
    let dir = tempfile::tempdir().unwrap();
    let props = properties(settings);
    let (sink, _) = run(
        dir.path(),
        &format!(
            "source: {{type: parquet, path: '{}', columns: [id, label]}}\nsink:\n  type: kafka\n  brokers: {brokers}\n  topic: {topic}\n  format: json\n  key: id\n{props}",
            repo().join("data/digits/test.parquet").display()
        ),
    );
    assert_ok(&sink);
    let (source, _) = run(
        dir.path(),
        &format!(
            "source:\n  type: kafka\n  brokers: {brokers}\n  topic: {topic}\n  format: json\n  schema: {{id: int64, label: int64}}\n  until: end\n{props}sink: {{type: parquet, path: back.parquet}}\n"
        ),
    );
    assert_ok(&source);
    let mut got = int64_values(&read_parquet(&dir.path().join("back.parquet")), "id");
    got.sort_unstable();
    (got, [sink, source])
}

/// A Kafka source and a Kafka sink with `settings` the brokers refuse: each exits 1 within 30 s
/// (its `connect_timeout` is 3 s); their stderr and stdout.
fn refused(brokers: &str, settings: &[(&str, String)]) -> Vec<(String, String)> {
    let props = properties(settings);
    let dir = tempfile::tempdir().unwrap();
    let jobs = [
        format!(
            "source:\n  type: kafka\n  brokers: {brokers}\n  topic: t\n  format: raw\n  connect_timeout: 3s\n{props}"
        ),
        format!(
            "source: {{type: parquet, path: '{}'}}\nsink:\n  type: kafka\n  brokers: {brokers}\n  topic: t\n  format: json\n  connect_timeout: 3s\n{props}",
            repo().join("data/digits/test.parquet").display()
        ),
    ];
    jobs.iter()
        .map(|yaml| {
            let (out, took) = run(dir.path(), yaml);
            assert_eq!(out.status.code(), Some(1), "{yaml}");
            assert!(took < Duration::from_secs(30), "{took:?}");
            (
                String::from_utf8_lossy(&out.stderr).into_owned(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
            )
        })
        .collect()
}

/// The digits test set's 360 rows published over TLS by the Kafka sink and read back over TLS
/// by the Kafka source: every id once.
#[test]
fn a_topic_published_and_read_back_over_tls_holds_every_row() {
    let (brokers, ca) = tls();
    let (got, _) = round_trip(&brokers, &over_tls(&ca));
    assert_eq!(got.len(), 360);
    assert_eq!(got, test_ids());
}

/// A client that trusts another CA refuses the broker's certificate: the source and the sink
/// each stop with one line naming the certificate check and the setting to fix, within their
/// `connect_timeout`.
#[test]
fn a_broker_certificate_from_an_untrusted_ca_is_one_clear_error() {
    let (brokers, _) = tls();
    for (err, _) in refused(&brokers, &over_tls(&other_ca())) {
        let last = err.lines().last().unwrap_or_default();
        assert!(last.contains("within 3"), "{err}");
        assert!(last.contains("certificate verify failed"), "{last}");
        assert!(last.contains("ssl.ca.location"), "{last}");
    }
}

/// Each mechanism the build supports logs in: the digits test rows published by the Kafka
/// sink and read back by the Kafka source, every id once; the password never printed.
#[test]
fn plain_and_scram_logins_succeed_in_the_source_and_the_sink() {
    let (brokers, user, password) = sasl();
    let want = test_ids();
    for mechanism in ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] {
        let (got, runs) = round_trip(&brokers, &with_sasl(mechanism, &user, &password));
        for o in &runs {
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
            assert!(
                !text.contains(&password),
                "{mechanism}: the password leaked: {text}"
            );
        }
        assert_eq!(got, want, "{mechanism}");
    }
}

/// A wrong password is one line naming the failed login, within `connect_timeout`, in the
/// source and the sink, and the password is not printed.
#[test]
fn a_wrong_password_is_one_clear_error_in_the_source_and_the_sink() {
    let (brokers, user, _) = sasl();
    let wrong = "not-the-password-51ab";
    for (err, out) in refused(&brokers, &with_sasl("SCRAM-SHA-512", &user, wrong)) {
        let last = err.lines().last().unwrap_or_default();
        assert!(last.contains("SASL authentication error"), "{last}");
        assert!(!err.contains(wrong), "the password leaked: {err}");
        assert!(!out.contains(wrong));
    }
}
