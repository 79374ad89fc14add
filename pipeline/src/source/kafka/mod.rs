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

pub(crate) mod dead_letter;
pub(crate) mod decode;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use arrow::datatypes::SchemaRef;
use futures::StreamExt;
use rdkafka::consumer::base_consumer::PartitionQueue;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::statistics::Statistics;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tokio::sync::mpsc;

use self::dead_letter::{DeadLetter, describe, spend};
use self::decode::{ChunkDecoder, RawChunk, RecordMeta, ipc_schema, raw_schema};
use crate::batch::Name;
use crate::config::{Assignment, KafkaFormat, KafkaSourceConfig, StartPosition, Until};
use crate::error::{Error, Result};
use crate::runtime::CpuPool;
use crate::runtime::channel::Sender;
use crate::runtime::metrics::PipelineMetrics;
use crate::state::{
    Acknowledger, ErrorCounts, KafkaPositions, KafkaShuffleState, OffsetStore, Position,
    SourceState,
};

/// librdkafka callbacks: errors are kept for messages, statistics feed per-partition lag.
struct SourceContext {
    last_error: Mutex<Option<String>>,
    /// Logs librdkafka's errors, each repeated one once in a while.
    log: crate::kafka_log::KafkaLog,
    metrics: Arc<PipelineMetrics>,
}

impl ClientContext for SourceContext {
    fn stats(&self, statistics: Statistics) {
        for (topic, t) in &statistics.topics {
            for (p, s) in &t.partitions {
                if *p < 0 || s.consumer_lag < 0 {
                    continue;
                }
                self.metrics.source.with_partition(topic, *p, |m| {
                    m.lag = s.consumer_lag;
                });
            }
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if matches!(error, KafkaError::PartitionEOF(_)) {
            return; // expected with `until: end`, handled by the poller
        }
        self.log.error(&error, reason);
        // "All brokers down" follows the error that says why; keep the cause.
        let generic = matches!(
            error.rdkafka_error_code(),
            Some(RDKafkaErrorCode::AllBrokersDown)
        );
        if let Ok(mut e) = self.last_error.lock()
            && (!generic || e.is_none())
        {
            *e = Some(format!("{reason} ({error})"));
        }
    }
}

impl ConsumerContext for SourceContext {}

type SourceConsumer = BaseConsumer<SourceContext>;

/// The last error librdkafka reported, for messages. Only for a consumer that is not
/// reading: error callbacks are served by polling, so this polls once to let pending ones
/// through.
fn last_error(c: &SourceConsumer) -> String {
    let _ = c.poll(Duration::from_millis(100));
    recorded_error(c)
}

fn recorded_error(c: &SourceConsumer) -> String {
    c.context()
        .last_error
        .lock()
        .ok()
        .and_then(|e| e.clone())
        .map(|e| format!("; last broker error: {e}"))
        .unwrap_or_default()
}

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

struct OpenArgs {
    config: KafkaSourceConfig,
    at: String,
    rank: usize,
    world: usize,
    resume: Option<KafkaPositions>,
    window: Option<KafkaShuffleState>,
    metrics: Arc<PipelineMetrics>,
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

    async fn run_inner(self, tx: &Sender, pool: CpuPool, parallelism: usize) -> Result<()> {
        let brokers = self.config.brokers.0.join(",");
        let mut dead_letter = match &self.config.dead_letter {
            Some(d) => Some(DeadLetter::open(
                d,
                &self.config,
                &self.base_dir,
                self.rank,
            )?),
            None => None,
        };
        let wake = Arc::new(Wake::default());
        let mut queues = Vec::new();
        match self.config.assignment {
            Assignment::Static => {
                let mut tpl = TopicPartitionList::new();
                for (t, p, offset, _) in &self.assigned {
                    tpl.add_partition_offset(&self.topics[*t as usize], *p, *offset)
                        .map_err(|e| kafka_err(&brokers, format!("cannot assign: {e}")))?;
                }
                self.consumer
                    .assign(&tpl)
                    .map_err(|e| kafka_err(&brokers, format!("cannot assign partitions: {e}")))?;
                queues = split_queues(
                    &self.consumer,
                    &self.topics,
                    self.assigned.iter().map(|a| (a.0, a.1)),
                    &wake,
                );
                if self.config.group_id.is_some() {
                    self.acker.set_store(Arc::new(GroupStore {
                        consumer: self.consumer.clone(),
                        mode: StoreMode::CommitForMonitoring,
                    }));
                }
            }
            Assignment::Group => {
                let names: Vec<&str> = self.topics.iter().map(|t| &**t).collect();
                self.consumer
                    .subscribe(&names)
                    .map_err(|e| kafka_err(&brokers, format!("cannot subscribe: {e}")))?;
                self.acker.set_store(Arc::new(GroupStore {
                    consumer: self.consumer.clone(),
                    mode: StoreMode::StoreForAutoCommit,
                }));
            }
        }

        let decoder = ChunkDecoder {
            format: self.config.format,
            schema: self.schema.clone(),
            topics: self.topics.iter().map(|t| Name::from(&**t)).collect(),
        };
        let (chunk_tx, mut chunk_rx) = mpsc::channel::<Result<RawChunk>>(2);
        let replay = match self.replay.is_empty() {
            true => None,
            false => {
                // A consumer of its own, that reports reaching a partition's end.
                let mut c = self.config.clone();
                c.group_id = None;
                c.until = Some(Until::End);
                let consumer = create_consumer(&c, Arc::new(PipelineMetrics::default()))?;
                Some((consumer, self.replay.clone()))
            }
        };
        let poller = Poller {
            replay,
            consumer: self.consumer.clone(),
            topics: self.topics.clone(),
            format: self.config.format,
            batch_rows: self.config.batch_rows,
            batch_timeout: self.config.batch_timeout.0,
            until: self.config.until.clone(),
            ends: self.ends.clone(),
            skip: self
                .assigned
                .iter()
                .filter(|a| a.3 > 0)
                .filter_map(|(t, p, o, s)| match o {
                    Offset::Offset(o) => Some(((*t, *p), (*o, *s))),
                    _ => None,
                })
                .collect(),
            from_timestamp: match self.config.start {
                StartPosition::Timestamp(ts) => Some((
                    ts,
                    self.assigned
                        .iter()
                        .filter(|(t, p, _, _)| {
                            self.resume_positions
                                .as_ref()
                                .and_then(|r| r.get(&self.topics[*t as usize], *p))
                                .is_none()
                        })
                        .map(|(t, p, _, _)| (*t, *p))
                        .collect(),
                )),
                _ => None,
            },
            group: self.config.assignment == Assignment::Group,
            queues,
            wake,
            brokers: brokers.clone(),
            metrics: self.metrics.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("sluice-kafka".into())
            .spawn(move || poller.run(chunk_tx))
            .map_err(|e| Error::Internal(format!("cannot start the Kafka thread: {e}")))?;

        let input = futures::stream::poll_fn(move |cx| chunk_rx.poll_recv(cx));
        let mut decoded = input
            .map(|item| {
                let decoder = decoder.clone();
                let pool = pool.clone();
                async move {
                    let chunk = item?;
                    // Where its records are, for the error budget's ledger (the records
                    // themselves go to the decoder).
                    let at: Vec<(u16, i32, i64)> = chunk
                        .records
                        .iter()
                        .map(|r| (r.topic, r.partition, r.offset))
                        .collect();
                    let d = pool.run(move || decoder.decode(chunk)).await?;
                    Ok::<_, Error>((at, d))
                }
            })
            .buffered(parallelism);
        // A resumed run goes on spending the budget of the run it continues: the counts of
        // the records below its positions come with the state, and those records, when read
        // again (a shuffle window rebuilt), are not counted twice.
        let restored = self.acker.restored_errors();
        let resume_at: HashMap<(u16, i32), i64> = self
            .resume_positions
            .iter()
            .flat_map(|done| done.iter())
            .filter_map(|(topic, p, pos)| {
                let t = self.topics.iter().position(|x| &**x == topic)?;
                Some(((t as u16, p), pos.offset))
            })
            .collect();
        let mut spent = restored;
        // Per partition, the offset past the last record this run has handled (its bad
        // records dead-lettered and counted). A consumer group that gives a partition back
        // after a rebalance replays it from the committed offset: the replayed good rows go on
        // again (at-least-once), but the bad records are in the dead-letter sink already and
        // counted; they are not written or counted a second time.
        let mut handled: HashMap<(u16, i32), i64> = HashMap::new();
        let topic_index = |topic: &str| self.topics.iter().position(|t| &**t == topic);
        let m = &self.metrics.source;
        let mut result = Ok(());
        while let Some(d) = decoded.next().await {
            let (at, mut d) = match d {
                Ok(d) => d,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            };
            // A bad record below a restored position is in the dead-letter sink already: a
            // chunk's bad records are durable before its good rows go on, and a position is
            // past a good row that came after them. Read again (to rebuild a shuffle window,
            // or replayed by a consumer group), it is not written or counted a second time.
            if let Some(done) = &self.resume_positions {
                d.bad.retain(|b| {
                    done.get(&b.topic, b.partition)
                        .is_none_or(|p| b.offset >= p.offset)
                });
            }
            let replayed = |t: u16, p: i32, o: i64| handled.get(&(t, p)).is_some_and(|h| o < *h);
            d.bad.retain(|b| {
                topic_index(&b.topic).is_none_or(|t| !replayed(t as u16, b.partition, b.offset))
            });
            if !d.bad.is_empty() {
                m.records_bad
                    .fetch_add(d.bad.len() as u64, Ordering::Relaxed);
                for b in &d.bad {
                    m.with_partition(&b.topic, b.partition, |p| p.bad += 1);
                }
                match dead_letter.as_mut() {
                    None => {
                        result = Err(Error::BadRecords {
                            message: format!(
                                "{} (source at {}). Nothing after it was delivered. To divert such records and keep going, add `dead_letter: {{type: file, path: …}}` (or `{{type: kafka, topic: …}}`) to the source",
                                describe(&d.bad[0]),
                                self.at
                            ),
                        });
                        break;
                    }
                    Some(dl) => {
                        if let Err(e) = dl.write(&d.bad).await {
                            result = Err(e);
                            break;
                        }
                        m.records_dead_lettered
                            .fetch_add(d.bad.len() as u64, Ordering::Relaxed);
                    }
                }
            }
            // The records past the restored positions: counted, and handed to the ledger
            // that splits the counts at the positions a checkpoint records.
            let bad_at: HashSet<(&str, i32, i64)> = d
                .bad
                .iter()
                .map(|b| (&*b.topic, b.partition, b.offset))
                .collect();
            let records = self.acker.consumed(
                at.iter()
                    .filter(|(t, p, o)| resume_at.get(&(*t, *p)).is_none_or(|done| o >= done))
                    .filter(|(t, p, o)| !replayed(*t, *p, *o))
                    .map(|&(t, p, o)| {
                        let topic = &self.topics[t as usize];
                        let bad = !bad_at.is_empty() && bad_at.contains(&(&**topic, p, o));
                        (topic, p, o, bad)
                    }),
            );
            if let Err(why) = spend(
                &mut spent,
                records,
                d.bad.len() as u64,
                &self.config.error_budget,
            ) {
                let before = if restored == ErrorCounts::default() {
                    String::new()
                } else {
                    format!(
                        "; counted from the first run: {} of the {} records before this resumed run were bad",
                        restored.bad, restored.records
                    )
                };
                result = Err(Error::BadRecords {
                    message: format!(
                        "error budget exceeded: {why}{before} (source at {}; last: {}). The bad records are in the dead-letter sink; the rows before them were delivered",
                        self.at,
                        d.bad.last().map(describe).unwrap_or_default()
                    ),
                });
                break;
            }
            for &(t, p, o) in &at {
                let h = handled.entry((t, p)).or_insert(o + 1);
                *h = (*h).max(o + 1);
            }
            let mut stopped = false;
            for b in d.batches {
                let rows = b.num_rows() as u64;
                m.rows.fetch_add(rows, Ordering::Relaxed);
                m.bytes_decoded
                    .fetch_add(b.memory_size() as u64, Ordering::Relaxed);
                if !tx.send(Ok(b)).await {
                    stopped = true;
                    break;
                }
            }
            if stopped {
                break;
            }
        }
        drop(decoded);
        // The poller notices the closed channel within one poll interval.
        let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        result
    }
}

fn kafka_err(brokers: &str, message: String) -> Error {
    Error::Kafka {
        brokers: brokers.to_string(),
        message,
    }
}

fn open_blocking(args: OpenArgs) -> Result<KafkaSource> {
    let OpenArgs {
        config,
        at,
        rank,
        world,
        resume,
        window,
        metrics,
    } = args;
    let brokers = config.brokers.0.join(",");
    let timeout = config.connect_timeout.0;
    let consumer = Arc::new(create_consumer(&config, metrics.clone())?);

    let md = consumer.fetch_metadata(None, timeout).map_err(|e| {
        kafka_err(
            &brokers,
            format!(
                "cannot reach the brokers within {} ({e}{}). Check `brokers`, that the cluster is up and reachable from here, and (SASL/TLS) the `properties`",
                humantime::format_duration(timeout),
                last_error(&consumer)
            ),
        )
    })?;
    let mut topics: Vec<Arc<str>> = Vec::new();
    let mut partitions: Vec<(u16, i32)> = Vec::new();
    for (ti, name) in config.topic.0.iter().enumerate() {
        let Some(t) = md.topics().iter().find(|t| t.name() == name) else {
            let mut known: Vec<&str> = md.topics().iter().map(|t| t.name()).collect();
            known.sort();
            return Err(kafka_err(
                &brokers,
                format!(
                    "topic `{name}` does not exist (topics there: {}). Create it, or fix `topic` (source at {at})",
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                ),
            ));
        };
        if let Some(e) = t.error() {
            return Err(kafka_err(
                &brokers,
                format!(
                    "topic `{name}`: {:?} (source at {at})",
                    RDKafkaErrorCode::from(e)
                ),
            ));
        }
        if t.partitions().is_empty() {
            return Err(kafka_err(
                &brokers,
                format!("topic `{name}` has no partitions (source at {at})"),
            ));
        }
        topics.push(Arc::from(name.as_str()));
        let mut ps: Vec<i32> = t.partitions().iter().map(|p| p.id()).collect();
        ps.sort_unstable();
        partitions.extend(ps.into_iter().map(|p| (ti as u16, p)));
    }
    let mine: Vec<(u16, i32)> = match config.assignment {
        Assignment::Static => partitions
            .iter()
            .enumerate()
            .filter(|(i, _)| i % world == rank)
            .map(|(_, p)| *p)
            .collect(),
        Assignment::Group => partitions.clone(),
    };
    if mine.is_empty() {
        tracing::warn!(
            "rank {rank} of {world} has no partition of {} ({} partitions in all); it will read nothing",
            config.topic.0.join(", "),
            partitions.len()
        );
    }

    // `until: end`: each partition's end offset now. A lower bound only: brokers (Tansu) may
    // report it short by the last batch, so the end is found by reaching it (partition EOF).
    let mut ends = HashMap::new();
    if config.until == Some(Until::End) {
        for &(t, p) in &mine {
            let (_, high) = consumer
                .fetch_watermarks(&topics[t as usize], p, timeout)
                .map_err(|e| {
                    kafka_err(
                        &brokers,
                        format!(
                            "cannot read the end offset of {}/{p} within {}: {e}{}",
                            topics[t as usize],
                            humantime::format_duration(timeout),
                            last_error(&consumer)
                        ),
                    )
                })?;
            ends.insert((t, p), high);
        }
    }

    let mut assigned = Vec::new();
    if config.assignment == Assignment::Static {
        let ts_offsets = match config.start {
            StartPosition::Timestamp(ms) => {
                let mut tpl = TopicPartitionList::new();
                for &(t, p) in &mine {
                    tpl.add_partition_offset(&topics[t as usize], p, Offset::Offset(ms))
                        .map_err(|e| kafka_err(&brokers, e.to_string()))?;
                }
                Some(consumer.offsets_for_times(tpl, timeout).map_err(|e| {
                    kafka_err(
                        &brokers,
                        format!("cannot look up offsets for the start timestamp: {e}"),
                    )
                })?)
            }
            _ => None,
        };
        for &(t, p) in &mine {
            let topic = &topics[t as usize];
            let (offset, skip) = match resume.as_ref().and_then(|r| r.get(topic, p)) {
                Some(Position { offset, skip_rows }) => (Offset::Offset(offset), skip_rows),
                None => match (&config.start, &ts_offsets) {
                    (StartPosition::Earliest, _) => (Offset::Beginning, 0),
                    (StartPosition::Latest, _) => (Offset::End, 0),
                    (StartPosition::Timestamp(_), Some(tpl)) => {
                        match tpl.find_partition(topic, p).map(|e| e.offset()) {
                            Some(Offset::Offset(o)) => (Offset::Offset(o), 0),
                            _ => (Offset::End, 0),
                        }
                    }
                    (StartPosition::Timestamp(_), None) => (Offset::End, 0),
                },
            };
            assigned.push((t, p, offset, skip));
        }
    }
    for &(t, p) in &mine {
        metrics
            .source
            .with_partition(&topics[t as usize], p, |_| {});
    }
    let mut replay = Vec::new();
    if let Some(w) = window.filter(|w| w.rows > 0) {
        for (topic, p, from) in w.starts.iter() {
            let Some(t) = topics.iter().position(|x| &**x == topic) else {
                continue;
            };
            let to = resume
                .as_ref()
                .and_then(|r| r.get(topic, p))
                .unwrap_or(from);
            if mine.contains(&(t as u16, p)) && from < to {
                replay.push(Replay {
                    topic: t as u16,
                    partition: p,
                    from,
                    to,
                });
            }
        }
    }

    let topics: Arc<[Arc<str>]> = Arc::from(topics);
    let schema: SchemaRef = match (config.format, &config.schema) {
        (KafkaFormat::Raw, _) => Arc::new(raw_schema()),
        (_, Some(spec)) => Arc::new(spec.to_arrow()),
        (KafkaFormat::ArrowIpc, None) => peek_ipc_schema(&config, &at, &topics, &assigned, &mine)?,
        (KafkaFormat::Json, None) => {
            return Err(Error::Internal(
                "json without schema passed validation".into(),
            ));
        }
    };
    Ok(KafkaSource {
        config,
        at,
        base_dir: PathBuf::new(),
        schema,
        topics,
        consumer,
        assigned,
        ends,
        rank,
        resume_positions: resume,
        replay,
        acker: Arc::new(Acknowledger::default()),
        metrics,
    })
}

/// What librdkafka may prefetch into one queue, in KiB (its own default is 64 MiB). With
/// `static` every partition has a queue of its own, each bounded on its own. (Sharing 16 MiB
/// between 4 partition queues, with a second consumer created once the partitions are known,
/// was measured: 0.67–0.93 M rows/s instead of 0.96–1.2 M, JSON and Arrow IPC.)
const PREFETCH_KIB: usize = 16 << 10;

fn create_consumer(
    config: &KafkaSourceConfig,
    metrics: Arc<PipelineMetrics>,
) -> Result<SourceConsumer> {
    let conn = config.connection();
    let mut defaults = vec![
        ("queued.max.messages.kbytes", PREFETCH_KIB.to_string()),
        ("statistics.interval.ms", "1000".to_string()),
        (
            "auto.offset.reset",
            match config.start {
                StartPosition::Latest => "latest",
                _ => "earliest",
            }
            .to_string(),
        ),
        // librdkafka wants a group id even to assign partitions by hand; static readers
        // without one never commit, so a private id leaves no state on the broker.
        (
            "group.id",
            config
                .group_id
                .clone()
                .unwrap_or_else(|| format!("sluice-static-{}", std::process::id())),
        ),
    ];
    if config.until == Some(Until::End) {
        defaults.push(("enable.partition.eof", "true".to_string()));
    }
    let mut c = conn.client_config(&defaults);
    // Not overridable: offsets advance only when the consumer of the stream says so.
    c.set("enable.auto.offset.store", "false");
    match config.assignment {
        Assignment::Group => c.set("enable.auto.commit", "true"),
        Assignment::Static => c.set("enable.auto.commit", "false"),
    };
    c.create_with_context(SourceContext {
        last_error: Mutex::new(None),
        log: Default::default(),
        metrics,
    })
    .map_err(|e| {
        kafka_err(
            &conn.brokers.0.join(","),
            format!("invalid consumer configuration: {e}. Check `properties`"),
        )
    })
}

/// Reads the schema of the first decodable message of the partitions this rank reads.
fn peek_ipc_schema(
    config: &KafkaSourceConfig,
    at: &str,
    topics: &[Arc<str>],
    assigned: &[(u16, i32, Offset, u64)],
    mine: &[(u16, i32)],
) -> Result<SchemaRef> {
    let brokers = config.brokers.0.join(",");
    let mut peek_cfg = config.clone();
    peek_cfg.group_id = None;
    peek_cfg.until = None;
    let consumer = create_consumer(&peek_cfg, Arc::new(PipelineMetrics::default()))?;
    let mut tpl = TopicPartitionList::new();
    for &(t, p) in mine {
        let offset = assigned
            .iter()
            .find(|a| a.0 == t && a.1 == p)
            .map(|a| a.2)
            .unwrap_or(Offset::Beginning);
        tpl.add_partition_offset(&topics[t as usize], p, offset)
            .map_err(|e| kafka_err(&brokers, e.to_string()))?;
    }
    consumer
        .assign(&tpl)
        .map_err(|e| kafka_err(&brokers, format!("cannot assign partitions: {e}")))?;
    let deadline = Instant::now() + config.connect_timeout.0;
    let mut last = String::new();
    while Instant::now() < deadline {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100))
            && let Some(v) = m.payload()
        {
            match ipc_schema(v) {
                Ok(s) => return Ok(s),
                Err(e) => {
                    last = format!(
                        "; {}/{} offset {}: {e}",
                        m.topic(),
                        m.partition(),
                        m.offset()
                    )
                }
            }
        }
    }
    Err(Error::Source {
        at: at.to_string(),
        message: format!(
            "`format: arrow_ipc` without `schema:`: no readable message arrived within {} to take the schema from{last}. Declare `schema:` in the source",
            humantime::format_duration(config.connect_timeout.0)
        ),
    })
}

/// Stores or commits positions with the consumer group.
#[derive(Debug, Clone, Copy)]
enum StoreMode {
    /// `group`: store; librdkafka's auto-commit sends them (and on revoke / close).
    StoreForAutoCommit,
    /// `static` with a `group_id`: commit asynchronously, for lag monitoring only.
    CommitForMonitoring,
}

struct GroupStore {
    consumer: Arc<SourceConsumer>,
    mode: StoreMode,
}

impl std::fmt::Debug for GroupStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GroupStore({:?})", self.mode)
    }
}

impl OffsetStore for GroupStore {
    fn store(&self, positions: &KafkaPositions, final_commit: bool) {
        let mut tpl = TopicPartitionList::new();
        for (topic, partition, pos) in positions.iter() {
            // A partly delivered message is read again: at-least-once for its rows.
            let _ = tpl.add_partition_offset(topic, partition, Offset::Offset(pos.offset));
        }
        if tpl.count() == 0 {
            return;
        }
        match self.mode {
            StoreMode::StoreForAutoCommit => {
                // Partitions revoked since are skipped by librdkafka: their new owner re-reads
                // (at-least-once).
                let assigned = self.consumer.assignment().unwrap_or_default();
                let mut mine = TopicPartitionList::new();
                for e in tpl.elements() {
                    if assigned.find_partition(e.topic(), e.partition()).is_some() {
                        let _ = mine.add_partition_offset(e.topic(), e.partition(), e.offset());
                    }
                }
                if mine.count() > 0
                    && let Err(e) = self.consumer.store_offsets(&mine)
                {
                    tracing::debug!("storing offsets: {e}");
                }
                if final_commit && let Err(e) = self.consumer.commit(&mine, CommitMode::Sync) {
                    tracing::warn!("committing final offsets: {e}");
                }
            }
            StoreMode::CommitForMonitoring => {
                let mode = if final_commit {
                    CommitMode::Sync
                } else {
                    CommitMode::Async
                };
                if let Err(e) = self.consumer.commit(&tpl, mode) {
                    tracing::debug!("committing offsets for monitoring: {e}");
                }
            }
        }
    }
}

/// The consumer thread: polls librdkafka and cuts the records into chunks.
struct Poller {
    /// Resuming inside a shuffle window: a consumer to read its rows again with, first.
    replay: Option<(SourceConsumer, Vec<Replay>)>,
    consumer: Arc<SourceConsumer>,
    topics: Arc<[Arc<str>]>,
    format: KafkaFormat,
    batch_rows: usize,
    batch_timeout: Duration,
    until: Option<Until>,
    ends: HashMap<(u16, i32), i64>,
    /// `arrow_ipc` resume: rows to skip of the message at this offset.
    skip: HashMap<(u16, i32), (i64, u64)>,
    /// `start: {timestamp}`: partitions that start there and the timestamp. Records before the
    /// first one at or after it are skipped, so a broker that answers the offset lookup
    /// loosely (Tansu returns the first offset) still starts at the right record.
    from_timestamp: Option<(i64, HashSet<(u16, i32)>)>,
    group: bool,
    /// `static`: each partition's own queue, read in turn (empty with `group`).
    queues: Vec<((u16, i32), PartitionQueue<SourceContext>)>,
    /// Woken when one of `queues` receives messages.
    wake: Arc<Wake>,
    brokers: String,
    metrics: Arc<PipelineMetrics>,
}

/// Largest chunk handed to the decoder (records are appended until this or `batch_rows`).
const MAX_CHUNK_BYTES: usize = 8 << 20;

impl Poller {
    fn topic_index(&self, name: &str) -> Option<u16> {
        self.topics
            .iter()
            .position(|t| &**t == name)
            .map(|i| i as u16)
    }

    /// Records per chunk: `batch_rows`, or 64 messages of many rows each.
    fn max_records(&self) -> usize {
        match self.format {
            KafkaFormat::ArrowIpc => 64,
            _ => self.batch_rows,
        }
    }

    /// Appends message `m` (of topic `t`) to `chunk`.
    fn append(
        &self,
        chunk: &mut RawChunk,
        m: &BorrowedMessage<'_>,
        t: u16,
        skip_rows: u64,
        take_rows: Option<u64>,
    ) {
        let k = m.key().map(|k| {
            let s = chunk.keys.len();
            chunk.keys.extend_from_slice(k);
            s..chunk.keys.len()
        });
        let v = m.payload().map(|v| {
            let s = chunk.values.len();
            chunk.values.extend_from_slice(v);
            s..chunk.values.len()
        });
        let headers = (self.format == KafkaFormat::Raw).then(|| {
            m.headers()
                .map(|hs| {
                    hs.iter()
                        .map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec)))
                        .collect()
                })
                .unwrap_or_default()
        });
        chunk.records.push(RecordMeta {
            topic: t,
            partition: m.partition(),
            offset: m.offset(),
            timestamp: m.timestamp().to_millis(),
            key: k,
            value: v,
            headers,
            skip_rows,
            take_rows,
        });
    }

    /// Resuming inside a shuffle window: reads each partition's rows of it again, from its
    /// first row up to where the main consumer starts, and sends them before anything else.
    /// A range that cannot be read completely (messages deleted since) is cut short; the
    /// shuffle, which knows how many rows the window held, reports it. Returns false when the
    /// run must stop (the stream was dropped, or a fatal error was sent).
    fn replay(
        &self,
        consumer: &SourceConsumer,
        ranges: &[Replay],
        tx: &mpsc::Sender<Result<RawChunk>>,
    ) -> bool {
        let fail = |message: String| {
            let _ = tx.blocking_send(Err(kafka_err(&self.brokers, message)));
            false
        };
        let mut tpl = TopicPartitionList::new();
        let mut open: HashMap<(u16, i32), Replay> = HashMap::new();
        for r in ranges {
            if let Err(e) = tpl.add_partition_offset(
                &self.topics[r.topic as usize],
                r.partition,
                Offset::Offset(r.from.offset),
            ) {
                return fail(format!(
                    "cannot assign partitions to read a shuffle window again: {e}"
                ));
            }
            open.insert((r.topic, r.partition), *r);
        }
        if let Err(e) = consumer.assign(&tpl) {
            return fail(format!(
                "cannot assign partitions to read a shuffle window again: {e}"
            ));
        }
        // Past the last message holding rows of the window.
        let bound = |r: &Replay| r.to.offset + i64::from(r.to.skip_rows > 0);
        let mut chunk = RawChunk::default();
        let mut warned = Instant::now() - Duration::from_secs(60);
        while !open.is_empty() {
            if tx.is_closed() {
                return false;
            }
            match consumer.poll(Duration::from_millis(50)) {
                None => {}
                Some(Ok(m)) => {
                    let Some(t) = self.topic_index(m.topic()) else {
                        continue;
                    };
                    let key = (t, m.partition());
                    let Some(r) = open.get(&key).copied() else {
                        continue;
                    };
                    let offset = m.offset();
                    if offset >= bound(&r) {
                        open.remove(&key);
                        continue;
                    }
                    if offset < r.from.offset {
                        continue;
                    }
                    let skip = if offset == r.from.offset {
                        r.from.skip_rows
                    } else {
                        0
                    };
                    let take =
                        (offset == r.to.offset && r.to.skip_rows > 0).then_some(r.to.skip_rows);
                    self.append(&mut chunk, &m, t, skip, take);
                    if offset + 1 >= bound(&r) {
                        open.remove(&key);
                    }
                }
                Some(Err(KafkaError::PartitionEOF(p))) => {
                    // At the end of partition `p` (of some topic) short of the range: the
                    // rest is not there (any more).
                    let at_end: Vec<(u16, i32)> =
                        open.keys()
                            .filter(|k| k.1 == p)
                            .filter(|k| {
                                let topic = &self.topics[k.0 as usize];
                                let pos = consumer.position().ok().and_then(|tpl| {
                                    tpl.find_partition(topic, p).map(|e| e.offset())
                                });
                                let high = consumer
                                    .fetch_watermarks(topic, p, Duration::from_secs(10))
                                    .map(|w| w.1);
                                match (pos, high) {
                                    (Some(Offset::Offset(o)), Ok(h)) => o >= h,
                                    (_, Ok(h)) => h <= open[*k].from.offset,
                                    _ => false,
                                }
                            })
                            .copied()
                            .collect();
                    for k in at_end {
                        open.remove(&k);
                    }
                }
                Some(Err(e)) => {
                    if is_fatal(&e) {
                        return fail(format!("{e}{}", recorded_error(consumer)));
                    }
                    if warned.elapsed() > Duration::from_secs(10) {
                        tracing::warn!("kafka: {e} (retrying)");
                        warned = Instant::now();
                    }
                }
            }
            // (Rows read again are not counted as records read again.)
            if self.full(&chunk) && !self.send(&mut chunk, &mut HashMap::new(), tx) {
                return false;
            }
        }
        self.send(&mut chunk, &mut HashMap::new(), tx)
    }

    fn run(mut self, tx: mpsc::Sender<Result<RawChunk>>) {
        if let Some((consumer, ranges)) = self.replay.take()
            && !self.replay(&consumer, &ranges, &tx)
        {
            return;
        }
        let started = Instant::now();
        let deadline = match &self.until {
            Some(Until::Duration(d)) => Some(started + *d),
            _ => None,
        };
        let to_end = self.until == Some(Until::End);
        let mut st = Reading {
            done: self.ends.keys().map(|k| (*k, false)).collect(),
            left: match &self.until {
                Some(Until::Records(n)) => Some(*n),
                _ => None,
            },
            chunk: RawChunk::default(),
            chunk_started: Instant::now(),
            rows: HashMap::new(),
            warned: Instant::now() - Duration::from_secs(60),
        };
        let queues = std::mem::take(&mut self.queues);
        let consumer = self.consumer.clone();
        // Messages taken from one partition's queue before the next one's: 256 records, or
        // one message of many rows.
        let per_turn = match self.format {
            KafkaFormat::ArrowIpc => 1,
            _ => RECORDS_PER_TURN,
        };
        // `static`: each partition's next message, polled but not yet taken.
        let mut heads: Vec<Option<BorrowedMessage<'_>>> = queues.iter().map(|_| None).collect();
        // Since when a partition that is not at its end has had nothing to take.
        let mut waiting: Option<Instant> = None;
        let mut turn = 0usize;
        loop {
            if tx.is_closed() {
                return;
            }
            // (A message held in `heads` is past the consumer's position: not done before it
            // is taken.)
            if to_end && self.all_done(&st.done) && heads.iter().all(Option::is_none) {
                break;
            }
            if deadline.is_some_and(|d| Instant::now() >= d) || st.left == Some(0) {
                break;
            }
            self.wake.arm();
            let mut taken = 0usize;
            // The consumer's own queue: errors and callbacks; every message with `group`; with
            // `static`, the messages of a partition fetched before its queue was split off,
            // which precede everything in that queue (drained first, before the queues).
            let wait = if queues.is_empty() {
                POLL_INTERVAL
            } else {
                Duration::ZERO
            };
            while st.left != Some(0) {
                let Some(event) = consumer.poll(wait) else {
                    break;
                };
                taken += 1;
                if !self.event(&mut st, event, &tx) || !self.flush_if_due(&mut st, &tx) {
                    return;
                }
                if queues.is_empty() {
                    break;
                }
            }
            // `static`: the partitions in turn, a few records each, starting one further every
            // turn, so that a backlog (which librdkafka fetches a partition at a time, in
            // blocks of up to 1 MiB) reaches the stream interleaved and a shuffle window mixes
            // every partition. A turn waits (at most `batch_timeout`, as Kafka Streams'
            // `max.task.idle.ms`) until every partition not at its end has a message, so that
            // one fetched earlier does not run ahead of the rest.
            for (head, (_, queue)) in heads.iter_mut().zip(&queues) {
                if head.is_none() {
                    let Ok(next) = self.next_in(&mut st, queue, &tx) else {
                        return;
                    };
                    *head = next;
                }
            }
            let lagging = queues
                .iter()
                .zip(&heads)
                .any(|((key, _), head)| head.is_none() && st.done.get(key) != Some(&true));
            let due = if lagging {
                waiting.get_or_insert_with(Instant::now).elapsed() >= self.batch_timeout
            } else {
                waiting = None;
                true
            };
            if due && !queues.is_empty() {
                for k in 0..queues.len() {
                    let i = (turn + k) % queues.len();
                    for _ in 0..per_turn {
                        if st.left == Some(0) {
                            break;
                        }
                        let m = match heads[i].take() {
                            Some(m) => m,
                            None => match self.next_in(&mut st, &queues[i].1, &tx) {
                                Err(()) => return,
                                Ok(None) => break,
                                Ok(Some(m)) => m,
                            },
                        };
                        taken += 1;
                        self.message(&mut st, &m);
                        drop(m);
                        if !self.flush_if_due(&mut st, &tx) {
                            return;
                        }
                    }
                }
                turn = turn.wrapping_add(1);
            }
            if taken == 0 && !queues.is_empty() {
                // Until a queue receives messages; while a turn is held back, at most until
                // it is due (once due, an empty partition no longer shortens the wait).
                let limit = match waiting {
                    Some(since) if !due => self
                        .batch_timeout
                        .saturating_sub(since.elapsed())
                        .clamp(Duration::from_millis(1), POLL_INTERVAL),
                    _ => POLL_INTERVAL,
                };
                self.wake.wait(limit);
            }
            if !self.flush_if_due(&mut st, &tx) {
                return;
            }
        }
        let _ = self.flush(&mut st, &tx);
    }

    /// Whether every partition reached its end (`until: end`).
    fn all_done(&self, done: &HashMap<(u16, i32), bool>) -> bool {
        if self.group {
            // Only the partitions this member holds now.
            let assigned = self.consumer.assignment().unwrap_or_default();
            assigned.count() > 0
                && assigned.elements().iter().all(|e| {
                    done.iter().any(|((t, p), d)| {
                        *d && *p == e.partition() && &*self.topics[*t as usize] == e.topic()
                    })
                })
        } else {
            done.values().all(|d| *d)
        }
    }

    /// Handles one poll result. Returns false when the run must stop (a fatal error was
    /// sent).
    fn event(
        &mut self,
        st: &mut Reading,
        event: rdkafka::error::KafkaResult<BorrowedMessage<'_>>,
        tx: &mpsc::Sender<Result<RawChunk>>,
    ) -> bool {
        match event {
            Ok(m) => self.message(st, &m),
            Err(KafkaError::PartitionEOF(p)) => self.reached_end(st, p),
            Err(e) => {
                if is_fatal(&e) {
                    let _ = self.flush(st, tx);
                    let _ = tx.blocking_send(Err(kafka_err(
                        &self.brokers,
                        format!("{e}{}", recorded_error(&self.consumer)),
                    )));
                    return false;
                }
                if st.warned.elapsed() > Duration::from_secs(10) {
                    tracing::warn!("kafka: {e} (retrying)");
                    st.warned = Instant::now();
                }
            }
        }
        true
    }

    /// Appends a message to the chunk being cut.
    fn message(&mut self, st: &mut Reading, m: &BorrowedMessage<'_>) {
        let Some(t) = self.topic_index(m.topic()) else {
            return;
        };
        let key = (t, m.partition());
        let offset = m.offset();
        if let Some((ts, waiting)) = self.from_timestamp.as_mut()
            && waiting.contains(&key)
        {
            if m.timestamp().to_millis().is_some_and(|t| t < *ts) {
                return;
            }
            waiting.remove(&key);
        }
        if st.chunk.records.is_empty() {
            st.chunk_started = Instant::now();
        }
        let skip_rows = match self.skip.get(&key) {
            Some(&(o, s)) if o == offset => {
                self.skip.remove(&key);
                s
            }
            _ => 0,
        };
        self.append(&mut st.chunk, m, t, skip_rows, None);
        *st.rows.entry(key).or_default() += 1;
        if let Some(n) = st.left.as_mut() {
            *n -= 1;
        }
    }

    /// Reached the end of partition `p` (of some topic): a partition whose messages all lie
    /// before its end offset is done.
    fn reached_end(&self, st: &mut Reading, p: i32) {
        for (key, d) in st.done.iter_mut() {
            if key.1 == p
                && let Some(end) = self.ends.get(key)
            {
                let pos = self.consumer.position().ok().and_then(|tpl| {
                    tpl.find_partition(&self.topics[key.0 as usize], p)
                        .map(|e| e.offset())
                });
                // No position yet: nothing was consumed, the partition is empty from where
                // this reader started.
                match pos {
                    Some(Offset::Offset(o)) if o < *end => {}
                    _ => *d = true,
                }
            }
        }
    }

    /// Sends the chunk when it is full or has waited `batch_timeout`. Returns false when the
    /// stream was dropped.
    fn flush_if_due(&self, st: &mut Reading, tx: &mpsc::Sender<Result<RawChunk>>) -> bool {
        let old = !st.chunk.records.is_empty() && st.chunk_started.elapsed() >= self.batch_timeout;
        !(self.full(&st.chunk) || old) || self.flush(st, tx)
    }

    /// Whether `chunk` holds as much as one chunk may.
    fn full(&self, chunk: &RawChunk) -> bool {
        chunk.records.len() >= self.max_records() || chunk.bytes() >= MAX_CHUNK_BYTES
    }

    /// [`Poller::send`] of the chunk being cut.
    fn flush(&self, st: &mut Reading, tx: &mpsc::Sender<Result<RawChunk>>) -> bool {
        self.send(&mut st.chunk, &mut st.rows, tx)
    }

    /// Sends `chunk` (if it holds records) and counts what was read (`rows`: records per
    /// partition). Returns false when the stream was dropped.
    fn send(
        &self,
        chunk: &mut RawChunk,
        rows: &mut HashMap<(u16, i32), u64>,
        tx: &mpsc::Sender<Result<RawChunk>>,
    ) -> bool {
        self.metrics
            .source
            .bytes_read
            .fetch_add(chunk.bytes() as u64, Ordering::Relaxed);
        for ((t, p), n) in rows.drain() {
            self.metrics
                .source
                .with_partition(&self.topics[t as usize], p, |m| m.records += n);
        }
        if chunk.records.is_empty() {
            return true;
        }
        tx.blocking_send(Ok(std::mem::take(chunk))).is_ok()
    }

    /// The next message of a partition's queue, handling the events before it (its end,
    /// errors); `None` when there is none now, `Err` when the run must stop.
    fn next_in<'q>(
        &mut self,
        st: &mut Reading,
        queue: &'q PartitionQueue<SourceContext>,
        tx: &mpsc::Sender<Result<RawChunk>>,
    ) -> std::result::Result<Option<BorrowedMessage<'q>>, ()> {
        loop {
            match queue.poll(Duration::ZERO) {
                None => return Ok(None),
                Some(Ok(m)) => return Ok(Some(m)),
                Some(Err(e)) => {
                    if !self.event(st, Err(e), tx) {
                        return Err(());
                    }
                }
            }
        }
    }
}

/// What [`Poller::run`] tracks while it reads.
struct Reading {
    /// `until: end`: whether each partition reached its end.
    done: HashMap<(u16, i32), bool>,
    /// `until: {records}`: how many are still to be read.
    left: Option<u64>,
    chunk: RawChunk,
    chunk_started: Instant,
    /// Records appended to the chunk, per partition (counted when it is sent).
    rows: HashMap<(u16, i32), u64>,
    warned: Instant,
}

/// How long the consumer thread waits for something to arrive.
const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// Records taken from one partition before the next partition's turn (`static`).
const RECORDS_PER_TURN: usize = 256;

/// Wakes the consumer thread when a partition queue receives messages (librdkafka calls
/// back from its own thread when a queue goes from empty to non-empty).
#[derive(Debug, Default)]
struct Wake {
    ready: Mutex<bool>,
    cv: std::sync::Condvar,
}

impl Wake {
    /// Forgets earlier wake-ups: called before the queues are polled, so that a message
    /// arriving after a queue was found empty still wakes [`Wake::wait`].
    fn arm(&self) {
        *self.ready.lock().unwrap_or_else(|p| p.into_inner()) = false;
    }

    fn notify(&self) {
        *self.ready.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.cv.notify_one();
    }

    /// Waits for a wake-up since the last [`Wake::arm`], at most `timeout`.
    fn wait(&self, timeout: Duration) {
        let ready = self.ready.lock().unwrap_or_else(|p| p.into_inner());
        let _ = self
            .cv
            .wait_timeout_while(ready, timeout, |ready| !*ready)
            .map_err(|p| p.into_inner());
    }
}

/// Splits each assigned partition's messages off the consumer's queue into a queue of its
/// own (after `assign`, before the first poll), wired to wake the consumer thread.
fn split_queues(
    consumer: &Arc<SourceConsumer>,
    topics: &[Arc<str>],
    partitions: impl IntoIterator<Item = (u16, i32)>,
    wake: &Arc<Wake>,
) -> Vec<((u16, i32), PartitionQueue<SourceContext>)> {
    partitions
        .into_iter()
        .filter_map(|(t, p)| {
            // `None` (unknown to librdkafka): its messages stay on the consumer's queue,
            // which is read too.
            let mut queue = consumer.split_partition_queue(&topics[t as usize], p)?;
            let wake = wake.clone();
            queue.set_nonempty_callback(move || wake.notify());
            Some(((t, p), queue))
        })
        .collect()
}

/// Errors that retrying cannot fix.
fn is_fatal(e: &KafkaError) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        e.rdkafka_error_code(),
        Some(
            C::UnknownTopicOrPartition
                | C::UnknownTopic
                | C::TopicAuthorizationFailed
                | C::GroupAuthorizationFailed
                | C::ClusterAuthorizationFailed
                | C::SaslAuthenticationFailed
                | C::Authentication
                | C::Fatal
                | C::InvalidGroupId
        )
    )
}
