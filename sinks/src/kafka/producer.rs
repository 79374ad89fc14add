//! The Kafka sink's producer: publishes batches to a Kafka topic: one Arrow IPC stream (zstd buffers) per
//! message, or one JSON object per row.
//!
//! Delivery is confirmed before offsets advance: the job calls [`Sink::flush`] before it
//! acknowledges source positions, and `flush` waits for every message sent so far. Messages in
//! flight are bounded in bytes. A Kafka sink cannot take back what it delivered, so `abort`
//! only stops; delivery is at-least-once across crashes.

use std::collections::VecDeque;
use std::time::Duration;

use arrow::ipc::CompressionType;
use arrow::ipc::writer::{IpcWriteOptions, StreamWriter};
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer};
use sluice_pipeline::config::KafkaConnection;
use sluice_pipeline::kafka_log::KafkaLog;
use sluice_pipeline::{Batch, CpuPool};

use super::{KafkaSinkConfig, KafkaSinkFormat};
use crate::{Error, Result, Sink, SinkContext, SinkReport};

pub(crate) struct KafkaSink {
    producer: FutureProducer<KafkaLog>,
    topic: String,
    format: KafkaSinkFormat,
    ipc_compression: Option<CompressionType>,
    key_column: Option<usize>,
    max_message_bytes: usize,
    pool: CpuPool,
    in_flight: VecDeque<(DeliveryFuture, usize)>,
    in_flight_bytes: usize,
    max_in_flight_bytes: usize,
    report: SinkReport,
    messages: u64,
}

fn sink_err(topic: &str, message: String) -> Error {
    Error::Kafka {
        topic: topic.to_string(),
        message,
    }
}

impl KafkaSink {
    pub(crate) async fn new(c: &KafkaSinkConfig, cx: &SinkContext) -> Result<Self> {
        let (ipc_compression, compression) = compressions(c)?;
        let producer = connect(c, compression).await?;
        let key_column = key_column(c, cx)?;
        Ok(KafkaSink {
            producer,
            topic: c.topic.clone(),
            format: c.format,
            ipc_compression,
            key_column,
            max_message_bytes: c.max_message_bytes,
            pool: cx.pool.clone(),
            in_flight: VecDeque::new(),
            in_flight_bytes: 0,
            max_in_flight_bytes: 64 << 20,
            report: SinkReport {
                location: Some(format!("kafka topic {}", c.topic)),
                ..Default::default()
            },
            messages: 0,
        })
    }

    async fn wait_oldest(&mut self) -> Result<()> {
        if let Some((fut, bytes)) = self.in_flight.pop_front() {
            self.in_flight_bytes -= bytes;
            match fut.await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err((e, _))) => Err(sink_err(&self.topic, format!("delivery failed: {e}"))),
                Err(_) => Err(sink_err(
                    &self.topic,
                    "delivery was cancelled (producer closed)".into(),
                )),
            }
        } else {
            Ok(())
        }
    }

    async fn send(&mut self, key: Option<Vec<u8>>, payload: Vec<u8>) -> Result<()> {
        let bytes = payload.len() + key.as_ref().map_or(0, Vec::len);
        while self.in_flight_bytes + bytes > self.max_in_flight_bytes && !self.in_flight.is_empty()
        {
            self.wait_oldest().await?;
        }
        loop {
            let mut rec: FutureRecord<'_, [u8], [u8]> =
                FutureRecord::to(&self.topic).payload(payload.as_slice());
            if let Some(k) = &key {
                rec = rec.key(k.as_slice());
            }
            match self.producer.send_result(rec) {
                Ok(fut) => {
                    self.in_flight.push_back((fut, bytes));
                    self.in_flight_bytes += bytes;
                    self.report.bytes += bytes as u64;
                    self.messages += 1;
                    return Ok(());
                }
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                    if self.in_flight.is_empty() {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    } else {
                        self.wait_oldest().await?;
                    }
                }
                Err((e, _)) => {
                    return Err(sink_err(&self.topic, format!("cannot send: {e}")));
                }
            }
        }
    }
}

/// The compression of the IPC buffers (`arrow_ipc`) and librdkafka's `compression.type`
/// (`json`): each format compresses at one level only.
fn compressions(c: &KafkaSinkConfig) -> Result<(Option<CompressionType>, &'static str)> {
    use super::KafkaCompression as K;
    // arrow_ipc compresses the IPC buffers (readers decompress column by column) and sends
    // the messages as they are; compressing twice only costs CPU. json compresses at the
    // Kafka level.
    let ipc_compression = match (c.format, c.compression) {
        (KafkaSinkFormat::Json, _) | (_, K::None) => None,
        (KafkaSinkFormat::ArrowIpc, K::Zstd) => Some(CompressionType::ZSTD),
        (KafkaSinkFormat::ArrowIpc, K::Lz4) => Some(CompressionType::LZ4_FRAME),
        (KafkaSinkFormat::ArrowIpc, other) => {
            return Err(sink_err(
                &c.topic,
                format!(
                    "`format: arrow_ipc` compresses with `zstd`, `lz4` or `none`, not `{other:?}`"
                ),
            ));
        }
    };
    let compression = match (c.format, c.compression) {
        (KafkaSinkFormat::ArrowIpc, _) | (_, K::None) => "none",
        (_, K::Zstd) => "zstd",
        (_, K::Lz4) => "lz4",
        (_, K::Snappy) => "snappy",
        (_, K::Gzip) => "gzip",
    };
    Ok((ipc_compression, compression))
}

/// The producer, once the brokers answered within `connect_timeout` and the topic exists.
async fn connect(c: &KafkaSinkConfig, compression: &str) -> Result<FutureProducer<KafkaLog>> {
    let connection = KafkaConnection {
        brokers: c.brokers.clone(),
        properties: c.properties.clone(),
    };
    let cfg = connection.client_config(&[
        ("compression.type", compression.to_string()),
        (
            "enable.idempotence",
            if c.idempotent { "true" } else { "false" }.to_string(),
        ),
        ("linger.ms", "5".to_string()),
        // Messages may carry a whole batch; leave room for headers.
        (
            "message.max.bytes",
            (c.max_message_bytes + 64 * 1024).to_string(),
        ),
        ("message.timeout.ms", "120000".to_string()),
    ]);
    let log = KafkaLog::default();
    let last_error = log.last_error_handle();
    let producer: FutureProducer<KafkaLog> = cfg.create_with_context(log).map_err(|e| {
        sink_err(
            &c.topic,
            format!("invalid producer configuration: {e}. Check `properties`"),
        )
    })?;
    let timeout = c.connect_timeout.0;
    let topic = c.topic.clone();
    let p = producer.clone();
    let md = tokio::task::spawn_blocking(move || p.client().fetch_metadata(None, timeout))
        .await
        .map_err(|e| Error::Internal(format!("metadata task failed: {e}")))?
        .map_err(|e| {
            sink_err(
                &topic,
                format!(
                    "cannot reach the brokers {} within {} ({e}{}). Check `brokers`, that the cluster is up and reachable from here, and (SASL/TLS) the `properties`",
                    c.brokers.0.join(","),
                    humantime_secs(timeout),
                    last_error
                        .get()
                        .map(|e| format!("; last broker error: {e}"))
                        .unwrap_or_default()
                ),
            )
        })?;
    match md.topics().iter().find(|t| t.name() == c.topic) {
        None => {
            return Err(sink_err(
                &c.topic,
                "the topic does not exist; create it first (Sluice does not create topics)".into(),
            ));
        }
        Some(t) if t.error().is_some() => {
            return Err(sink_err(
                &c.topic,
                format!("{:?}", t.error().map(RDKafkaErrorCode::from)),
            ));
        }
        Some(_) => {}
    }
    Ok(producer)
}

/// The index of the `key` column in the pipeline's output (`format: json` only).
fn key_column(c: &KafkaSinkConfig, cx: &SinkContext) -> Result<Option<usize>> {
    Ok(match &c.key {
        None => None,
        Some(k) => {
            if c.format != KafkaSinkFormat::Json {
                return Err(sink_err(
                    &c.topic,
                    "`key` applies to `format: json` (one message per row) only".into(),
                ));
            }
            Some(cx.schema.index_of(k).map_err(|_| {
                sink_err(
                    &c.topic,
                    format!(
                        "key column `{k}` is not in the pipeline's output ({})",
                        cx.schema
                            .fields()
                            .iter()
                            .map(|f| f.name().as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                )
            })?)
        }
    })
}

fn humantime_secs(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

/// Encodes a batch as Arrow IPC streams, each at most about `max_bytes` (split by rows).
fn encode_ipc(
    data: &RecordBatch,
    max_bytes: usize,
    compression: Option<CompressionType>,
) -> std::result::Result<Vec<Vec<u8>>, String> {
    let rows = data.num_rows();
    let size = data.get_array_memory_size().max(1);
    let pieces = size.div_ceil(max_bytes.max(1)).max(1);
    let per = rows.div_ceil(pieces).max(1);
    let options = IpcWriteOptions::default()
        .try_with_compression(compression)
        .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    let mut start = 0;
    while start < rows {
        let len = per.min(rows - start);
        let part = data.slice(start, len);
        let mut buf = Vec::new();
        {
            let mut w =
                StreamWriter::try_new_with_options(&mut buf, &part.schema(), options.clone())
                    .map_err(|e| e.to_string())?;
            w.write(&part).map_err(|e| e.to_string())?;
            w.finish().map_err(|e| e.to_string())?;
        }
        out.push(buf);
        start += len;
    }
    Ok(out)
}

/// A message to send: key (optional) and payload.
type Message = (Option<Vec<u8>>, Vec<u8>);

/// Encodes each row as one JSON object (and its key, when a key column is set).
fn encode_json(
    data: &RecordBatch,
    key_column: Option<usize>,
) -> std::result::Result<Vec<Message>, String> {
    let mut buf = Vec::new();
    {
        let mut w = arrow::json::LineDelimitedWriter::new(&mut buf);
        w.write(data).map_err(|e| e.to_string())?;
        w.finish().map_err(|e| e.to_string())?;
    }
    let keys: Option<Vec<Option<String>>> = match key_column {
        None => None,
        Some(i) => {
            let col = data.column(i);
            let formatter = arrow::util::display::ArrayFormatter::try_new(
                col.as_ref(),
                &arrow::util::display::FormatOptions::default(),
            )
            .map_err(|e| e.to_string())?;
            Some(
                (0..data.num_rows())
                    .map(|r| {
                        if col.is_null(r) {
                            None
                        } else {
                            Some(formatter.value(r).to_string())
                        }
                    })
                    .collect(),
            )
        }
    };
    let lines: Vec<&[u8]> = buf
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .collect();
    if lines.len() != data.num_rows() {
        return Err(format!(
            "JSON encoding produced {} lines for {} rows",
            lines.len(),
            data.num_rows()
        ));
    }
    Ok(lines
        .into_iter()
        .enumerate()
        .map(|(i, l)| {
            (
                keys.as_ref()
                    .and_then(|k| k[i].as_ref().map(|s| s.as_bytes().to_vec())),
                l.to_vec(),
            )
        })
        .collect())
}

use arrow::array::Array;

#[async_trait]
impl Sink for KafkaSink {
    async fn write(&mut self, batch: &Batch) -> Result<()> {
        let data = batch.data.clone();
        let max = self.max_message_bytes;
        let key = self.key_column;
        let format = self.format;
        let compression = self.ipc_compression;
        let topic = self.topic.clone();
        let encoded = self
            .pool
            .run(move || match format {
                KafkaSinkFormat::ArrowIpc => encode_ipc(&data, max, compression)
                    .map(|v| v.into_iter().map(|p| (None, p)).collect()),
                KafkaSinkFormat::Json => encode_json(&data, key),
            })
            .await
            .map_err(|e| Error::Internal(e.to_string()))?
            .map_err(|message| Error::Encode {
                url: format!("kafka topic {topic}"),
                message,
            })?;
        for (k, payload) in encoded {
            self.send(k, payload).await?;
        }
        self.report.rows += batch.num_rows() as u64;
        self.report.batches += 1;
        Ok(())
    }

    async fn flush(&mut self) -> Result<bool> {
        while !self.in_flight.is_empty() {
            self.wait_oldest().await?;
        }
        Ok(true)
    }

    async fn finish(mut self: Box<Self>) -> Result<SinkReport> {
        self.flush().await?;
        tracing::debug!(messages = self.messages, "kafka sink finished");
        Ok(self.report.clone())
    }

    async fn abort(self: Box<Self>) {
        // Nothing to take back: delivered messages stay (at-least-once). Give queued ones a
        // moment so the producer closes cleanly (flush blocks: off the async threads).
        let producer = self.producer.clone();
        let _ = tokio::task::spawn_blocking(move || producer.flush(Duration::from_secs(5))).await;
    }
}
