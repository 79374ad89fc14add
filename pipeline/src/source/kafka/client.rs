//! The librdkafka consumer: its configuration, its callbacks (errors kept for messages,
//! statistics feeding per-partition lag), and which of its errors are fatal.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::statistics::Statistics;

use super::kafka_err;
use super::{Assignment, KafkaSourceConfig, StartPosition, Until};
use crate::error::Result;
use crate::runtime::metrics::PipelineMetrics;

/// librdkafka callbacks: errors are kept for messages, statistics feed per-partition lag and
/// tell when lost brokers are back.
pub(super) struct SourceContext {
    /// Since when no broker has been reachable (transport errors), and why; cleared by the
    /// first statistics that show a broker up again.
    outage: Mutex<Option<(Instant, String)>>,
    /// Whether `outage` is set: checked for every message without taking the lock.
    in_outage: std::sync::atomic::AtomicBool,
    /// Partitions (topic, partition) whose statistics showed everything up to the end
    /// delivered (or nothing there): caught up with their backlog, as an end-of-partition
    /// event says too (which librdkafka sometimes reports without its partition).
    caught_up: Mutex<std::collections::HashSet<(String, i32)>>,
    /// Logs librdkafka's errors, each repeated one once in a while.
    log: crate::kafka_log::KafkaLog,
    metrics: Arc<PipelineMetrics>,
}

impl SourceContext {
    /// Whether partition `p` of `topic` was seen caught up with its backlog.
    pub(super) fn caught_up(&self, topic: &str, p: i32) -> bool {
        self.caught_up
            .lock()
            .is_ok_and(|c| c.contains(&(topic.to_string(), p)))
    }

    /// Ends an outage, if one is on: a broker is up (statistics) or a message arrived.
    pub(super) fn end_outage(&self) {
        use std::sync::atomic::Ordering;
        if !self.in_outage.load(Ordering::Relaxed) {
            return;
        }
        if let Ok(mut o) = self.outage.lock()
            && let Some((since, _)) = o.take()
        {
            self.in_outage.store(false, Ordering::Relaxed);
            tracing::warn!(
                "kafka: brokers reachable again after {}; reading goes on",
                humantime::format_duration(Duration::from_secs(since.elapsed().as_secs()))
            );
        }
    }

    /// How long the brokers have been unreachable, and the last error, if they are.
    pub(super) fn outage(&self) -> Option<(Duration, String)> {
        let o = self.outage.lock().ok()?;
        o.as_ref()
            .map(|(since, why)| (since.elapsed(), why.clone()))
    }
}

impl ClientContext for SourceContext {
    fn stats(&self, statistics: Statistics) {
        // A broker up again ends an outage (an idle topic sends no message to say so).
        let up = |b: &rdkafka::statistics::Broker| {
            b.state == "UP" && b.source != "internal" && b.source != "logical"
        };
        if statistics.brokers.values().any(up) {
            self.end_outage();
        }
        for (topic, t) in &statistics.topics {
            for (p, s) in &t.partitions {
                let delivered = s.hi_offset >= 0
                    && (s.app_offset >= s.hi_offset
                        || (s.app_offset < 0 && s.lo_offset >= 0 && s.lo_offset == s.hi_offset));
                if *p >= 0
                    && delivered
                    && let Ok(mut c) = self.caught_up.lock()
                {
                    c.insert((topic.clone(), *p));
                }
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
        // Expected with `until: end` and `static` (ends are on), handled by the poller.
        if matches!(error, KafkaError::PartitionEOF(_))
            || error.rdkafka_error_code() == Some(RDKafkaErrorCode::PartitionEOF)
        {
            return;
        }
        self.log.error(&error, reason);
        if matches!(
            error.rdkafka_error_code(),
            Some(RDKafkaErrorCode::AllBrokersDown | RDKafkaErrorCode::BrokerTransportFailure)
        ) && let Ok(mut o) = self.outage.lock()
        {
            match o.as_mut() {
                Some((_, why)) => *why = format!("{reason} ({error})"),
                None => *o = Some((Instant::now(), format!("{reason} ({error})"))),
            }
            self.in_outage
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

impl ConsumerContext for SourceContext {}

pub(super) type SourceConsumer = BaseConsumer<SourceContext>;

/// The last error librdkafka reported, for messages. Only for a consumer that is not
/// reading: error callbacks are served by polling, so this polls once to let pending ones
/// through.
pub(super) fn last_error(c: &SourceConsumer) -> String {
    let _ = c.poll(Duration::from_millis(100));
    recorded_error(c)
}

pub(super) fn recorded_error(c: &SourceConsumer) -> String {
    c.context()
        .log
        .last_error()
        .map(|e| format!("; last broker error: {e}"))
        .unwrap_or_default()
}

/// What librdkafka may prefetch into one queue, in KiB (its own default is 64 MiB). With
/// `static` every partition has a queue of its own, each bounded on its own. (Sharing 16 MiB
/// between 4 partition queues, with a second consumer created once the partitions are known,
/// was measured: 0.67–0.93 M rows/s instead of 0.96–1.2 M, JSON and Arrow IPC.)
const PREFETCH_KIB: usize = 16 << 10;

pub(super) fn create_consumer(
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
    // `until: end` stops at the ends; `static` also needs them to tell a partition with a
    // backlog still to arrive from one that is caught up (see `Poller::run`).
    if config.until == Some(Until::End) || config.assignment == Assignment::Static {
        defaults.push(("enable.partition.eof", "true".to_string()));
    }
    let mut c = conn.client_config(&defaults);
    // Not overridable: offsets advance only when the consumer of the stream says so; and the
    // ends above are what `until: end` and a `static` reader's turns rely on.
    c.set("enable.auto.offset.store", "false");
    if config.until == Some(Until::End) || config.assignment == Assignment::Static {
        c.set("enable.partition.eof", "true");
    }
    match config.assignment {
        Assignment::Group => c.set("enable.auto.commit", "true"),
        Assignment::Static => c.set("enable.auto.commit", "false"),
    };
    c.create_with_context(SourceContext {
        outage: Mutex::new(None),
        in_outage: Default::default(),
        caught_up: Mutex::new(Default::default()),
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

/// Errors that retrying cannot fix.
pub(super) fn is_fatal(e: &KafkaError) -> bool {
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
