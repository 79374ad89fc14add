//! Dead-letter sinks: where records that cannot be decoded go, with their origin and the
//! reason, and the error budget that decides when bad records stop the run.
//!
//! A batch of bad records is durable (object written, or every message acknowledged by the
//! broker) before the source hands on the good rows decoded with them, so a bad record is never
//! lost even if the run is killed right after.

use std::path::Path;
use std::time::Duration;

use base64::Engine;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};

use super::KafkaSourceConfig;
use super::decode::BadRecord;
use crate::config::{DeadLetterConfig, ErrorBudget};
use crate::dead_letter::DeadLetterFiles;
use crate::error::{Error, Result};
use crate::state::ErrorCounts;

/// An open dead-letter sink.
pub(crate) enum DeadLetter {
    File(DeadLetterFiles),
    Kafka {
        producer: FutureProducer<crate::kafka_log::KafkaLog>,
        topic: String,
    },
}

impl std::fmt::Debug for DeadLetter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeadLetter::File(files) => write!(f, "DeadLetter::{files:?}"),
            DeadLetter::Kafka { topic, .. } => write!(f, "DeadLetter::Kafka({topic})"),
        }
    }
}

impl DeadLetter {
    /// Opens the sink of `config` for the source of `rank`.
    pub fn open(
        config: &DeadLetterConfig,
        source: &KafkaSourceConfig,
        base_dir: &Path,
        rank: usize,
    ) -> Result<Self> {
        match config {
            DeadLetterConfig::File(f) => {
                Ok(DeadLetter::File(DeadLetterFiles::open(f, base_dir, rank)?))
            }
            DeadLetterConfig::Kafka(k) => {
                let mut conn = source.connection();
                if let Some(b) = &k.brokers {
                    conn.brokers = b.clone();
                }
                for (key, v) in &k.properties.0 {
                    conn.properties.0.insert(key.clone(), v.clone());
                }
                let producer: FutureProducer<crate::kafka_log::KafkaLog> = conn
                    .client_config(&[("message.timeout.ms", "30000".to_string())])
                    .create_with_context(Default::default())
                    .map_err(|e| Error::Kafka {
                        brokers: conn.brokers.0.join(","),
                        message: format!("cannot create the dead-letter producer: {e}"),
                    })?;
                Ok(DeadLetter::Kafka {
                    producer,
                    topic: k.topic.clone(),
                })
            }
        }
    }

    /// Writes `records` durably.
    pub async fn write(&mut self, records: &[BadRecord]) -> Result<()> {
        if records.is_empty() {
            return Ok(());
        }
        match self {
            DeadLetter::File(files) => {
                let b64 = base64::engine::general_purpose::STANDARD;
                let lines: Vec<serde_json::Value> = records
                    .iter()
                    .map(|r| {
                        serde_json::json!({
                            "topic": &*r.topic,
                            "partition": r.partition,
                            "offset": r.offset,
                            "timestamp": r.timestamp,
                            "key_base64": r.key.as_ref().map(|k| b64.encode(k)),
                            "value_base64": r.value.as_ref().map(|v| b64.encode(v)),
                            "error": r.error,
                        })
                    })
                    .collect();
                files.write(&lines).await
            }
            DeadLetter::Kafka { producer, topic } => {
                let mut pending = Vec::with_capacity(records.len());
                for r in records {
                    let offset = r.offset.to_string();
                    let partition = r.partition.to_string();
                    let headers = OwnedHeaders::new()
                        .insert(Header {
                            key: "sluice.error",
                            value: Some(r.error.as_bytes()),
                        })
                        .insert(Header {
                            key: "sluice.topic",
                            value: Some(r.topic.as_bytes()),
                        })
                        .insert(Header {
                            key: "sluice.partition",
                            value: Some(partition.as_bytes()),
                        })
                        .insert(Header {
                            key: "sluice.offset",
                            value: Some(offset.as_bytes()),
                        });
                    let mut rec: FutureRecord<'_, [u8], [u8]> =
                        FutureRecord::to(topic).headers(headers);
                    if let Some(k) = &r.key {
                        rec = rec.key(k.as_slice());
                    }
                    if let Some(v) = &r.value {
                        rec = rec.payload(v.as_slice());
                    }
                    if let Some(ts) = r.timestamp {
                        rec = rec.timestamp(ts);
                    }
                    pending.push(producer.send(rec, Duration::from_secs(30)));
                }
                for p in pending {
                    p.await.map_err(|(e, _)| Error::Kafka {
                        brokers: String::new(),
                        message: format!(
                            "dead-letter topic `{topic}`: delivery failed: {e}. The bad records of this batch were not stored, so the run stops"
                        ),
                    })?;
                }
                Ok(())
            }
        }
    }
}

/// Adds a chunk's counts to what the budget has spent; `Err` with the reason once the
/// budget is exceeded.
pub(crate) fn spend(
    spent: &mut ErrorCounts,
    records: u64,
    bad: u64,
    limits: &ErrorBudget,
) -> Result<(), String> {
    spent.records += records;
    spent.bad += bad;
    if let Some(max) = limits.max_records
        && spent.bad > max
    {
        return Err(format!(
            "{} records could not be decoded, more than `error_budget.max_records` ({max})",
            spent.bad
        ));
    }
    if let Some(ratio) = limits.max_ratio
        && spent.records >= 100
        && spent.bad as f64 > ratio * spent.records as f64
    {
        return Err(format!(
            "{} of {} records ({:.2}%) could not be decoded, more than `error_budget.max_ratio` ({ratio})",
            spent.bad,
            spent.records,
            100.0 * spent.bad as f64 / spent.records as f64
        ));
    }
    Ok(())
}

/// A shareable description of a bad record for error messages.
pub(crate) fn describe(r: &BadRecord) -> String {
    format!(
        "kafka {}/{} offset {}: {}",
        r.topic, r.partition, r.offset, r.error
    )
}
