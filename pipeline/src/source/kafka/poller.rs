//! The consumer thread: polls librdkafka and cuts the records into chunks for the decoder,
//! `static` partitions read in turn, until the `until` bound.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;
use rdkafka::consumer::base_consumer::PartitionQueue;
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::mpsc;

use super::client::{SourceConsumer, SourceContext, create_consumer, is_fatal, recorded_error};
use super::decode::{RawChunk, RecordMeta};
use super::queues::Wake;
use super::{Assignment, KafkaFormat, OutageBudget, StartPosition, Until};
use super::{KafkaSource, Replay, kafka_err};
use crate::error::Result;
use crate::runtime::metrics::PipelineMetrics;

/// The consumer thread: polls librdkafka and cuts the records into chunks.
pub(super) struct Poller {
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
    /// How long the brokers may stay unreachable (`outage_budget`).
    outage_budget: OutageBudget,
    /// Whether the current outage was announced.
    outage_said: bool,
}

/// Largest chunk handed to the decoder (records are appended until this or `batch_rows`).
const MAX_CHUNK_BYTES: usize = 8 << 20;

impl KafkaSource {
    /// The consumer thread's state for this run: the partitions' `queues` (`static`), and,
    /// resuming inside a shuffle window, a consumer of its own to read it again with first.
    pub(super) fn poller(
        &self,
        queues: Vec<((u16, i32), PartitionQueue<SourceContext>)>,
        wake: Arc<Wake>,
        brokers: String,
    ) -> Result<Poller> {
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
        Ok(Poller {
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
            brokers,
            metrics: self.metrics.clone(),
            outage_budget: self.config.outage_budget(),
            outage_said: false,
        })
    }
}

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

    /// Reads (after the rows of a shuffle window to read again, if any) until the `until`
    /// bound, a fatal error or the stream being dropped, sending chunks to `tx`.
    pub(super) fn run(mut self, tx: mpsc::Sender<Result<RawChunk>>) {
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
            caught_up: HashSet::new(),
            warned_backlog: false,
            partitions: Vec::new(),
            deadline,
        };
        let queues = std::mem::take(&mut self.queues);
        st.partitions = queues.iter().map(|(k, _)| *k).collect();
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
            if !self.within_outage_budget(&mut st, &tx) {
                return;
            }
            self.wake.arm();
            let Ok(mut taken) = self.poll_consumer(&mut st, &consumer, &queues, &tx) else {
                return;
            };
            // `static`: the partitions in turn, a few records each, starting one further every
            // turn, so that a backlog (which librdkafka fetches a partition at a time, in
            // blocks of up to 1 MiB) reaches the stream interleaved and a shuffle window mixes
            // every partition. A turn waits until every partition not at its end has a
            // message, so that one fetched earlier does not run ahead of the rest: for a
            // partition that has not yet caught up with its backlog (no end-of-partition event
            // since the start), as long as it takes — the order of a backlog then does not
            // depend on timing (bounded by `BACKLOG_WAIT`, said in a warning); for one that
            // has, at most `batch_timeout` (new records: as Kafka Streams' `max.task.idle.ms`).
            if self.fill_heads(&mut st, &mut heads, &queues, &tx).is_err() {
                return;
            }
            let due = self.turn_due(&mut st, &queues, &heads, &mut waiting);
            if due && !queues.is_empty() {
                let Ok(n) = self.take_turn(&mut st, &queues, &mut heads, turn, per_turn, &tx)
                else {
                    return;
                };
                taken += n;
                turn = turn.wrapping_add(1);
            }
            if taken == 0 && !queues.is_empty() {
                // Until a queue receives messages; while a turn is held back, at most until
                // it is due (once due, an empty partition no longer shortens the wait).
                // (Past `batch_timeout`, a turn held back for a backlog waits on the queues.)
                let limit = match waiting {
                    Some(since) if !due && since.elapsed() < self.batch_timeout => self
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

    /// Polls the consumer's own queue: with no partition queues (`group`), one event, waiting
    /// up to [`POLL_INTERVAL`] for it; with them, every event there now. Returns how many it
    /// took; `Err` when the run must stop.
    fn poll_consumer(
        &mut self,
        st: &mut Reading,
        consumer: &SourceConsumer,
        queues: &[((u16, i32), PartitionQueue<SourceContext>)],
        tx: &mpsc::Sender<Result<RawChunk>>,
    ) -> std::result::Result<usize, ()> {
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
            if !self.event(st, event, tx) || !self.flush_if_due(st, tx) {
                return Err(());
            }
            if queues.is_empty() {
                break;
            }
        }
        Ok(taken)
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
            Err(KafkaError::PartitionEOF(p)) => {
                // From the consumer's own queue the event names no topic: partition `p` of
                // every topic counts as caught up (a partition's own queue says which,
                // `queue_event`).
                let keys = st.partitions.iter().filter(|k| k.1 == p).copied();
                st.caught_up.extend(keys.collect::<Vec<_>>());
                self.reached_end(st, p)
            }
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
        // A message is proof the brokers are there.
        self.consumer.context().end_outage();
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
        // `until: {records: N}` counts rows: an Arrow IPC message holds many, and the last
        // one taken may be cut (its rows past N are read by a resumed run).
        let (take_rows, counted) = match st.left {
            Some(left) if self.format == KafkaFormat::ArrowIpc => {
                match m.payload().and_then(super::decode::ipc_rows) {
                    Some(rows) if rows.saturating_sub(skip_rows) > left => {
                        (Some(skip_rows + left), left)
                    }
                    Some(rows) => (None, rows.saturating_sub(skip_rows)),
                    None => (None, 1),
                }
            }
            _ => (None, 1),
        };
        self.append(&mut st.chunk, m, t, skip_rows, take_rows);
        *st.rows.entry(key).or_default() += 1;
        if let Some(n) = st.left.as_mut() {
            *n = n.saturating_sub(counted);
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
}

mod turns;

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
    /// `static`: the partitions that reached their end at least once (an end-of-partition
    /// event): past their backlog, what arrives now is new.
    caught_up: HashSet<(u16, i32)>,
    /// Whether the `BACKLOG_WAIT` warning was given.
    warned_backlog: bool,
    /// `static`: the partitions read.
    partitions: Vec<(u16, i32)>,
    /// `until: {duration}`: when the run ends.
    deadline: Option<Instant>,
}

/// `static`: how long a turn waits at most for a partition that has not yet caught up with its
/// backlog (a leader that is down, a partition that stalls).
const BACKLOG_WAIT: Duration = Duration::from_secs(30);

/// How long the consumer thread waits for something to arrive.
const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// Records taken from one partition before the next partition's turn (`static`).
const RECORDS_PER_TURN: usize = 256;
