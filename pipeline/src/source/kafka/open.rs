//! Opening a Kafka source: the brokers' metadata, the partitions this rank reads, where each
//! starts and ends, and the schema.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::datatypes::SchemaRef;
use rdkafka::consumer::Consumer;
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

use super::client::{SourceConsumer, create_consumer, last_error};
use super::decode::{ipc_schema, raw_schema};
use super::{Assignment, KafkaFormat, KafkaSourceConfig, StartPosition, Until};
use super::{KafkaSource, Replay, kafka_err};
use crate::error::{Error, Result};
use crate::runtime::metrics::PipelineMetrics;
use crate::state::{Acknowledger, KafkaPositions, KafkaShuffleState, Position};

/// What [`open_blocking`] needs, moved onto the blocking thread.
pub(super) struct OpenArgs {
    pub(super) config: KafkaSourceConfig,
    pub(super) at: String,
    pub(super) rank: usize,
    pub(super) world: usize,
    pub(super) resume: Option<KafkaPositions>,
    pub(super) window: Option<KafkaShuffleState>,
    pub(super) metrics: Arc<PipelineMetrics>,
}

/// Connects and finds everything a [`KafkaSource`] needs to know before it runs (blocking:
/// every broker call is bounded by `connect_timeout`).
pub(super) fn open_blocking(args: OpenArgs) -> Result<KafkaSource> {
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

    let (topics, partitions) = find_partitions(&consumer, &config, &at, &brokers, timeout)?;
    let mine = my_partitions(&config, &partitions, rank, world);

    // `until: end`: each partition's end offset now. A lower bound only: brokers (Tansu) may
    // report it short by the last batch, so the end is found by reaching it (partition EOF).
    let ends = end_offsets(&consumer, &config, &topics, &mine, &brokers, timeout)?;

    let assigned = start_offsets(
        &consumer,
        &config,
        &topics,
        &mine,
        resume.as_ref(),
        &brokers,
        timeout,
    )?;
    for &(t, p) in &mine {
        metrics
            .source
            .with_partition(&topics[t as usize], p, |_| {});
    }
    let replay = replay_ranges(window, resume.as_ref(), &topics, &mine);

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

/// The configured topics' names, in order, and every (topic index, partition) of them.
type TopicPartitions = (Vec<Arc<str>>, Vec<(u16, i32)>);

/// Fetches the brokers' metadata and checks the configured topics: their names, in order,
/// and every partition of each (topic index, partition), sorted within a topic.
fn find_partitions(
    consumer: &SourceConsumer,
    config: &KafkaSourceConfig,
    at: &str,
    brokers: &str,
    timeout: Duration,
) -> Result<TopicPartitions> {
    let md = consumer.fetch_metadata(None, timeout).map_err(|e| {
        kafka_err(
            brokers,
            format!(
                "cannot reach the brokers within {} ({e}{}). Check `brokers`, that the cluster is up and reachable from here, and (SASL/TLS) the `properties`",
                humantime::format_duration(timeout),
                last_error(consumer)
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
                brokers,
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
                brokers,
                format!(
                    "topic `{name}`: {:?} (source at {at})",
                    RDKafkaErrorCode::from(e)
                ),
            ));
        }
        if t.partitions().is_empty() {
            return Err(kafka_err(
                brokers,
                format!("topic `{name}` has no partitions (source at {at})"),
            ));
        }
        topics.push(Arc::from(name.as_str()));
        let mut ps: Vec<i32> = t.partitions().iter().map(|p| p.id()).collect();
        ps.sort_unstable();
        partitions.extend(ps.into_iter().map(|p| (ti as u16, p)));
    }
    Ok((topics, partitions))
}

/// The partitions this rank reads: `static`, every `world`-th one from `rank`; `group`, all
/// of them (the group hands them out). Warns when there are none.
fn my_partitions(
    config: &KafkaSourceConfig,
    partitions: &[(u16, i32)],
    rank: usize,
    world: usize,
) -> Vec<(u16, i32)> {
    let mine: Vec<(u16, i32)> = match config.assignment {
        Assignment::Static => partitions
            .iter()
            .enumerate()
            .filter(|(i, _)| i % world == rank)
            .map(|(_, p)| *p)
            .collect(),
        Assignment::Group => partitions.to_vec(),
    };
    if mine.is_empty() {
        tracing::warn!(
            "rank {rank} of {world} has no partition of {} ({} partitions in all); it will read nothing",
            config.topic.0.join(", "),
            partitions.len()
        );
    }
    mine
}

/// `until: end`: the high watermark of each of `mine` (empty for any other `until`).
fn end_offsets(
    consumer: &SourceConsumer,
    config: &KafkaSourceConfig,
    topics: &[Arc<str>],
    mine: &[(u16, i32)],
    brokers: &str,
    timeout: Duration,
) -> Result<HashMap<(u16, i32), i64>> {
    let mut ends = HashMap::new();
    if config.until == Some(Until::End) {
        for &(t, p) in mine {
            let (_, high) = consumer
                .fetch_watermarks(&topics[t as usize], p, timeout)
                .map_err(|e| {
                    kafka_err(
                        brokers,
                        format!(
                            "cannot read the end offset of {}/{p} within {}: {e}{}",
                            topics[t as usize],
                            humantime::format_duration(timeout),
                            last_error(consumer)
                        ),
                    )
                })?;
            ends.insert((t, p), high);
        }
    }
    Ok(ends)
}

/// `static`: where each of `mine` starts (and the rows to skip of its first message): the
/// restored position, else `start` (empty with `group`, which starts from the group's
/// committed offsets).
fn start_offsets(
    consumer: &SourceConsumer,
    config: &KafkaSourceConfig,
    topics: &[Arc<str>],
    mine: &[(u16, i32)],
    resume: Option<&KafkaPositions>,
    brokers: &str,
    timeout: Duration,
) -> Result<Vec<(u16, i32, Offset, u64)>> {
    let mut assigned = Vec::new();
    if config.assignment == Assignment::Static {
        let ts_offsets = match config.start {
            StartPosition::Timestamp(ms) => {
                let mut tpl = TopicPartitionList::new();
                for &(t, p) in mine {
                    tpl.add_partition_offset(&topics[t as usize], p, Offset::Offset(ms))
                        .map_err(|e| kafka_err(brokers, e.to_string()))?;
                }
                Some(consumer.offsets_for_times(tpl, timeout).map_err(|e| {
                    kafka_err(
                        brokers,
                        format!("cannot look up offsets for the start timestamp: {e}"),
                    )
                })?)
            }
            _ => None,
        };
        for &(t, p) in mine {
            let topic = &topics[t as usize];
            let (offset, skip) = match resume.and_then(|r| r.get(topic, p)) {
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
    Ok(assigned)
}

/// Resuming inside a shuffle window (`window`, when it held rows): the rows of each of
/// `mine` to read again, from the window's start up to the restored position.
fn replay_ranges(
    window: Option<KafkaShuffleState>,
    resume: Option<&KafkaPositions>,
    topics: &[Arc<str>],
    mine: &[(u16, i32)],
) -> Vec<Replay> {
    let mut replay = Vec::new();
    if let Some(w) = window.filter(|w| w.rows > 0) {
        for (topic, p, from) in w.starts.iter() {
            let Some(t) = topics.iter().position(|x| &**x == topic) else {
                continue;
            };
            let to = resume.and_then(|r| r.get(topic, p)).unwrap_or(from);
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
    replay
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
