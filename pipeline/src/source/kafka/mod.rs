//! The Kafka source: records from Kafka topics as Arrow batches with exact lineage
//! (topic, partition, offset).
//!
//! ```text
//! consumer thread (librdkafka poll) ──chunks (≤2 in flight)──▶ decode on the CPU pool
//!   (`parallelism` chunks at a time, order kept) ──▶ bad records → dead letter (durable first)
//!                                                 └─▶ good rows → the pipeline's first queue
//! ```
//! Positions are not committed here: the consumer of the stream reports what it has durably
//! taken through [`crate::state::Acknowledger`], which stores offsets with the group (`group`)
//! or hands them to the checkpoint (`static`).
//!
//! `open` connects and finds the partitions, start and end offsets and schema; `group` takes
//! the partitions and stores acknowledged positions; `poller` is the consumer thread (`queues`
//! its per-partition queues); `deliver` decodes and sends on; `client` is the librdkafka
//! consumer.

mod client;
pub(crate) mod dead_letter;
pub(crate) mod decode;
mod deliver;
mod group;
mod open;
mod poller;
mod queues;
mod settings;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use rdkafka::Offset;

use self::client::SourceConsumer;
use self::open::{OpenArgs, open_blocking};
pub use self::settings::{
    Assignment, KafkaFormat, KafkaSourceConfig, OutageBudget, SchemaSpec, StartPosition, Until,
};
use crate::error::{Error, Result};
use crate::runtime::CpuPool;
use crate::runtime::channel::Sender;
use crate::runtime::metrics::PipelineMetrics;
use crate::state::{Acknowledger, KafkaPositions, Position, SourceState};

/// A Kafka source, connected and with its partitions and schema known.
pub(crate) struct KafkaSource {
    config: KafkaSourceConfig,
    at: String,
    base_dir: PathBuf,
    schema: SchemaRef,
    topics: Arc<[Arc<str>]>,
    consumer: Arc<SourceConsumer>,
    /// Static assignment: partitions and where each starts.
    assigned: Vec<(u16, i32, Offset, u64)>,
    /// `until: end`: the end offset of each partition at the start of the run.
    ends: HashMap<(u16, i32), i64>,
    /// This rank (static assignment: which partitions are this source's).
    rank: usize,
    /// Positions restored from a checkpoint.
    resume_positions: Option<KafkaPositions>,
    /// Resuming inside a shuffle window: the rows it held, read again first (partition,
    /// from, to).
    replay: Vec<Replay>,
    acker: Arc<Acknowledger>,
    metrics: Arc<PipelineMetrics>,
}

impl std::fmt::Debug for KafkaSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSource")
            .field("topics", &self.topics)
            .field("assigned", &self.assigned.len())
            .finish_non_exhaustive()
    }
}

/// One partition's rows of a shuffle window to read again: from `from` up to `to`.
#[derive(Debug, Clone, Copy)]
struct Replay {
    topic: u16,
    partition: i32,
    from: Position,
    to: Position,
}

impl KafkaSource {
    /// Connects, checks the topics, splits partitions (static: among `world` ranks, this
    /// being `rank`) and finds start and end offsets. Every broker call is bounded by
    /// `connect_timeout`.
    pub(crate) async fn open(
        config: &KafkaSourceConfig,
        base_dir: &Path,
        at: &str,
        (rank, world): (usize, usize),
        resume: Option<&SourceState>,
        acker: Arc<Acknowledger>,
        metrics: Arc<PipelineMetrics>,
    ) -> Result<Self> {
        let source_err = |message: String| Error::Source {
            at: at.to_string(),
            message,
        };
        if config.format == KafkaFormat::Json && config.schema.is_none() {
            return Err(source_err(
                "`format: json` needs `schema:` (column → type), e.g. `schema: {id: int64, x: \"float32[4]\"}`".into(),
            ));
        }
        if config.format == KafkaFormat::Raw && config.schema.is_some() {
            return Err(source_err(
                "`format: raw` has a fixed schema (key, value, timestamp, headers); remove `schema`".into(),
            ));
        }
        if config.assignment == Assignment::Group
            && matches!(config.start, StartPosition::Timestamp(_))
        {
            return Err(source_err(
                "`start: {timestamp: …}` needs `assignment: static` (a consumer group starts from its committed offsets, else earliest/latest)".into(),
            ));
        }
        if config.assignment == Assignment::Group && config.group_id.is_none() {
            return Err(source_err("`assignment: group` needs `group_id`".into()));
        }
        if config.batch_rows == 0 {
            return Err(source_err("`batch_rows` must be at least 1".into()));
        }
        let args = OpenArgs {
            config: config.clone(),
            at: at.to_string(),
            rank,
            world,
            resume: resume.and_then(|s| s.kafka.clone()),
            window: resume.and_then(|s| s.kafka_shuffle.clone()),
            metrics: metrics.clone(),
        };
        let mut source = tokio::task::spawn_blocking(move || open_blocking(args))
            .await
            .map_err(|e| Error::Internal(format!("Kafka open task failed: {e}")))??;
        source.base_dir = base_dir.to_path_buf();
        source.acker = acker;
        Ok(source)
    }

    pub(crate) fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// E.g. `kafka: 4 partition(s) of events (static, rank 0 of 1)`.
    pub(crate) fn describe(&self) -> String {
        let topics = self
            .topics
            .iter()
            .map(|t| &**t)
            .collect::<Vec<_>>()
            .join(", ");
        match self.config.assignment {
            Assignment::Static => format!(
                "kafka: {} partition(s) of {topics} assigned to this rank",
                self.assigned.len()
            ),
            Assignment::Group => format!(
                "kafka: topic(s) {topics}, partitions assigned by consumer group `{}`",
                self.config.group_id.as_deref().unwrap_or_default()
            ),
        }
    }

    /// Consumes until the `until` bound (or forever), sending decoded batches to `tx`.
    pub(crate) async fn run(self, tx: Sender, pool: CpuPool, parallelism: usize) {
        if let Err(e) = self.run_inner(&tx, pool, parallelism.max(1)).await {
            tx.send(Err(e)).await;
        }
    }
}

/// An [`Error::Kafka`] of the brokers `brokers`.
fn kafka_err(brokers: &str, message: String) -> Error {
    Error::Kafka {
        brokers: brokers.to_string(),
        message,
    }
}
