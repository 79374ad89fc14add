//! Against the real servers (scripts/services.sh): Kafka (also over TLS and with SASL logins), S3, Azure Blob (Azurite), GCS (fake-gcs-server), HTTP(S), the sinks' safety rules, the metrics endpoint and the shuffle's spilling.
//!
//! One test binary for several files (each file its own module, as it was its own binary
//! before): every integration-test binary links all of Sluice and libtorch's wrappers, ~100 MB
//! each, and thirty of them filled CI's disk. Timing-sensitive files keep binaries of their
//! own (`shuffle_memory`, `bench`).

mod common;

#[path = "azure.rs"]
mod azure;
#[path = "gcs.rs"]
mod gcs;
#[path = "http.rs"]
mod http;
#[path = "kafka.rs"]
mod kafka;
#[path = "kafka_connect_errors.rs"]
mod kafka_connect_errors;
#[path = "kafka_crash.rs"]
mod kafka_crash;
#[path = "kafka_dead_letters.rs"]
mod kafka_dead_letters;
#[path = "kafka_fleet.rs"]
mod kafka_fleet;
#[path = "kafka_security.rs"]
mod kafka_security;
#[path = "kafka_shuffle.rs"]
mod kafka_shuffle;
#[path = "observe.rs"]
mod observe;
#[path = "s3.rs"]
mod s3;
#[path = "s3_sink_safety.rs"]
mod s3_sink_safety;
#[path = "shuffle.rs"]
mod shuffle;
#[path = "sink_safety.rs"]
mod sink_safety;
