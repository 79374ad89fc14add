//! Sink configs (`sink:` section, `type:` selects the kind).

use serde::Deserialize;
use serde::de::{self, Deserializer};
use sluice_pipeline::config::{Component, HumanDuration, OneOrMany, Properties};
use sluice_pipeline::storage::StorageConfig;

/// Where the pipeline's batches go.
#[derive(Debug, Clone, PartialEq)]
pub enum SinkConfig {
    /// `type: parquet`.
    Parquet(ParquetSinkConfig),
    /// `type: arrow_ipc`.
    ArrowIpc(ArrowIpcSinkConfig),
    /// `type: null`.
    Null(NullSinkConfig),
    /// `type: kafka`.
    Kafka(KafkaSinkConfig),
}

impl SinkConfig {
    /// The `type` name.
    pub fn kind(&self) -> &'static str {
        match self {
            SinkConfig::Parquet(_) => "parquet",
            SinkConfig::ArrowIpc(_) => "arrow_ipc",
            SinkConfig::Null(_) => "null",
            SinkConfig::Kafka(_) => "kafka",
        }
    }

    /// Whether [`crate::Sink::flush`] can make output durable while the run goes on (so a
    /// checkpoint can cover it).
    pub fn flushes_while_running(&self) -> bool {
        match self {
            SinkConfig::Parquet(p) => p.max_rows_per_file.is_some(),
            SinkConfig::ArrowIpc(_) => false,
            SinkConfig::Null(_) | SinkConfig::Kafka(_) => true,
        }
    }
}

impl Component for SinkConfig {
    const WHAT: &'static str = "sink";
    const KINDS: &'static [&'static str] = &["parquet", "arrow_ipc", "null", "kafka"];
    fn deserialize_kind<'de, D: Deserializer<'de>>(kind: &str, d: D) -> Result<Self, D::Error> {
        match kind {
            "parquet" => ParquetSinkConfig::deserialize(d).map(SinkConfig::Parquet),
            "arrow_ipc" => ArrowIpcSinkConfig::deserialize(d).map(SinkConfig::ArrowIpc),
            "null" => NullSinkConfig::deserialize(d).map(SinkConfig::Null),
            "kafka" => KafkaSinkConfig::deserialize(d).map(SinkConfig::Kafka),
            other => Err(de::Error::unknown_variant(other, Self::KINDS)),
        }
    }
}

/// Parquet column compression.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ParquetCompression {
    /// zstd (level from `zstd_level`).
    #[default]
    Zstd,
    /// Snappy.
    Snappy,
    /// LZ4 (raw).
    Lz4,
    /// No compression.
    None,
}

/// `type: parquet` — one Parquet file, written atomically: the data goes to a temporary object
/// and appears under `path` only when complete. A failed or interrupted run leaves nothing
/// under `path`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParquetSinkConfig {
    /// Output file: path or URL (`file://`, `s3://`, `gs://`, `az://`; relative paths resolve
    /// against the config file's directory).
    pub path: String,
    /// Rows per row group. Default: 65536.
    #[serde(default = "default_row_group_size")]
    pub row_group_size: usize,
    /// `zstd` (default), `snappy`, `lz4` or `none`.
    #[serde(default)]
    pub compression: ParquetCompression,
    /// zstd level, 1–22. Default: 3.
    #[serde(default = "default_zstd_level")]
    pub zstd_level: i32,
    /// Replace an existing file (part-file mode: remove the directory's `part-*.parquet`
    /// first). Default: true.
    #[serde(default = "default_true")]
    pub overwrite: bool,
    /// Write numbered part files `part-00000.parquet`, … under `path` (a directory), each
    /// closed and made visible at the first batch boundary at or past this many rows (and at
    /// every checkpoint). Needed for checkpoints and unbounded sources: output is durable
    /// while the run goes on. Default: one file.
    #[serde(default)]
    pub max_rows_per_file: Option<u64>,
    /// How to reach the object store (options, retry budget), as for sources.
    #[serde(default)]
    pub storage: StorageConfig,
}

/// Arrow IPC buffer compression.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum IpcCompression {
    /// zstd.
    #[default]
    Zstd,
    /// LZ4 frame.
    Lz4,
    /// No compression.
    None,
}

/// `type: arrow_ipc` — one Arrow IPC *file* (random-access format, readable by
/// `pyarrow.ipc.open_file`), written atomically like the Parquet sink.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArrowIpcSinkConfig {
    /// Output file: path or URL (`file://`, `s3://`, `gs://`, `az://`; relative paths resolve
    /// against the config file's directory).
    pub path: String,
    /// `zstd` (default), `lz4` or `none`.
    #[serde(default)]
    pub compression: IpcCompression,
    /// Replace an existing file. Default: true.
    #[serde(default = "default_true")]
    pub overwrite: bool,
    /// How to reach the object store (options, retry budget), as for sources.
    #[serde(default)]
    pub storage: StorageConfig,
}

/// `type: null` — discards batches, counting rows and bytes (for benchmarks).
#[derive(Debug, Clone, PartialEq, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct NullSinkConfig {}

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
    #[serde(default = "default_true")]
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
fn default_row_group_size() -> usize {
    65536
}
fn default_zstd_level() -> i32 {
    3
}
fn default_true() -> bool {
    true
}
