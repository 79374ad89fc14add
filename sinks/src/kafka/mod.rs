//! `type: kafka`: the Kafka sink's settings, read and checked in every build, and its producer
//! (`producer.rs`, cargo feature `kafka`; without it the sink is refused naming the feature).

#[cfg(feature = "kafka")]
mod producer;

use serde::Deserialize;
use sluice_pipeline::config::{HumanDuration, OneOrMany, Properties};

#[cfg(feature = "kafka")]
pub(crate) use producer::KafkaSink;

/// How a Kafka sink encodes batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KafkaSinkFormat {
    /// One Arrow IPC stream (zstd-compressed buffers) per message, holding a batch (split by
    /// rows to stay under `max_message_bytes`).
    ArrowIpc,
    /// One JSON object per row.
    Json,
}

/// Producer compression (`compression.type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum KafkaCompression {
    /// zstd.
    #[default]
    Zstd,
    /// LZ4.
    Lz4,
    /// Snappy.
    Snappy,
    /// gzip.
    Gzip,
    /// None.
    None,
}

/// `type: kafka` — publishes to a Kafka topic (which must exist). Delivery of everything
/// written is confirmed before source offsets are acknowledged; at-least-once across crashes.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSinkConfig {
    /// Bootstrap brokers: `host:port` or a list.
    pub brokers: OneOrMany,
    /// Topic to publish to.
    pub topic: String,
    /// `arrow_ipc` (a batch per message) or `json` (a row per message).
    pub format: KafkaSinkFormat,
    /// `json` only: column whose value becomes the message key (partitioning by key).
    #[serde(default)]
    pub key: Option<String>,
    /// `zstd` (default), `lz4`, `snappy`, `gzip`, `none`. `arrow_ipc`: compresses the IPC
    /// buffers (`zstd`, `lz4`, `none`), messages go uncompressed; `json`: producer compression.
    #[serde(default)]
    pub compression: KafkaCompression,
    /// Idempotent producer (no duplicates from producer retries). Default: true.
    #[serde(default = "crate::default_true")]
    pub idempotent: bool,
    /// Upper bound of one message's uncompressed size; larger batches are split by rows.
    /// Default: 1000000 (Kafka's default `message.max.bytes`).
    #[serde(default = "default_max_message_bytes")]
    pub max_message_bytes: usize,
    /// Give up connecting after this long. Default: 10s.
    #[serde(default = "default_connect_timeout")]
    pub connect_timeout: HumanDuration,
    /// Any librdkafka producer property (SASL/TLS, `linger.ms`, `acks`, …). Secret values are
    /// never printed.
    #[serde(default)]
    pub properties: Properties,
}

fn default_max_message_bytes() -> usize {
    1_000_000
}
fn default_connect_timeout() -> HumanDuration {
    HumanDuration(std::time::Duration::from_secs(10))
}
