//! Dead-letter sinks: where records that cannot be decoded go, with their origin and the
//! reason, and the error budget that decides when bad records stop the run.
//!
//! A batch of bad records is durable (object written, or every message acknowledged by the
//! broker) before the source hands on the good rows decoded with them, so a bad record is never
//! lost even if the run is killed right after.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use object_store::{ObjectStoreExt, PutPayload};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};

use super::decode::BadRecord;
use crate::config::{DeadLetterConfig, ErrorBudget, KafkaSourceConfig};
use crate::error::{Error, Result};
use crate::state::ErrorCounts;
use crate::storage::resolve;

/// An open dead-letter sink.
pub(crate) enum DeadLetter {
    File {
        dir: String,
        base_dir: std::path::PathBuf,
        storage: crate::storage::StorageConfig,
        run_id: String,
        seq: u64,
    },
    Kafka {
        producer: FutureProducer,
        topic: String,
    },
}

impl std::fmt::Debug for DeadLetter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeadLetter::File { dir, .. } => write!(f, "DeadLetter::File({dir})"),
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
                // Fail early on a location that cannot be written.
                resolve(
                    &format!("{}/probe", f.path.trim_end_matches('/')),
                    base_dir,
                    &f.storage,
                )?;
                Ok(DeadLetter::File {
                    dir: f.path.trim_end_matches('/').to_string(),
                    base_dir: base_dir.to_path_buf(),
                    storage: f.storage.clone(),
                    run_id: run_id(rank),
                    seq: 0,
                })
            }
            DeadLetterConfig::Kafka(k) => {
                let mut conn = source.connection();
                if let Some(b) = &k.brokers {
                    conn.brokers = b.clone();
                }
                for (key, v) in &k.properties.0 {
                    conn.properties.0.insert(key.clone(), v.clone());
                }
                let producer: FutureProducer = conn
                    .client_config(&[("message.timeout.ms", "30000".to_string())])
                    .create()
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
            DeadLetter::File {
                dir,
                base_dir,
                storage,
                run_id,
                seq,
            } => {
                let b64 = base64::engine::general_purpose::STANDARD;
                let mut body = Vec::new();
                for r in records {
                    let line = serde_json::json!({
                        "topic": &*r.topic,
                        "partition": r.partition,
                        "offset": r.offset,
                        "timestamp": r.timestamp,
                        "key_base64": r.key.as_ref().map(|k| b64.encode(k)),
                        "value_base64": r.value.as_ref().map(|v| b64.encode(v)),
                        "error": r.error,
                    });
                    body.extend_from_slice(line.to_string().as_bytes());
                    body.push(b'\n');
                }
                let name = format!("{dir}/dead-letter-{run_id}-{:06}.jsonl", *seq);
                *seq += 1;
                let loc = resolve(&name, base_dir, storage)?;
                loc.store
                    .put(&loc.path, PutPayload::from(body))
                    .await
                    .map_err(|e| Error::Storage {
                        url: loc.url.to_string(),
                        operation: "writing dead-letter records",
                        source: e,
                    })?;
                Ok(())
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

/// Names the objects of one file sink apart from every other sink's: the start time, the rank
/// (ranks of one job on different hosts), the process, and a count of the sinks this process
/// opened (ranks that run as threads of one process start within the same millisecond).
fn run_id(rank: usize) -> String {
    static OPENED: AtomicU64 = AtomicU64::new(0);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    format!(
        "{}-rank{rank}-{}-{}",
        now.as_millis(),
        std::process::id(),
        OPENED.fetch_add(1, Ordering::Relaxed)
    )
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sinks_opened_together_name_their_objects_apart() {
        let ids: Vec<String> = [0, 0, 1, 1].into_iter().map(run_id).collect();
        let distinct: std::collections::BTreeSet<&String> = ids.iter().collect();
        assert_eq!(distinct.len(), ids.len(), "{ids:?}");
        assert!(ids[2].contains("-rank1-"), "{}", ids[2]);
    }
}
