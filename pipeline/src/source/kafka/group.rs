//! How the source takes its partitions (assigned by hand, or by subscribing with a consumer
//! group) and stores the positions the consumer of the stream acknowledges with the group.

use std::sync::Arc;

use rdkafka::consumer::base_consumer::PartitionQueue;
use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::{Offset, TopicPartitionList};

use super::Assignment;
use super::client::{SourceConsumer, SourceContext};
use super::queues::{Wake, split_queues};
use super::{KafkaSource, kafka_err};
use crate::error::Result;
use crate::state::{KafkaPositions, OffsetStore};

/// Each assigned partition's queue, keyed by (topic index, partition).
pub(super) type PartitionQueues = Vec<((u16, i32), PartitionQueue<SourceContext>)>;

impl KafkaSource {
    /// Assigns this rank's partitions, each split off into a queue of its own (`static`), or
    /// subscribes to the topics (`group`), and hands the acknowledger where positions go.
    pub(super) fn take_partitions(
        &self,
        brokers: &str,
        wake: &Arc<Wake>,
    ) -> Result<PartitionQueues> {
        let mut queues = Vec::new();
        match self.config.assignment {
            Assignment::Static => {
                let mut tpl = TopicPartitionList::new();
                for (t, p, offset, _) in &self.assigned {
                    tpl.add_partition_offset(&self.topics[*t as usize], *p, *offset)
                        .map_err(|e| kafka_err(brokers, format!("cannot assign: {e}")))?;
                }
                // Split off before `assign`: once assigned, librdkafka starts fetching at
                // once, and whatever it fetched before a partition's queue was split off
                // would be on the consumer's queue, read ahead of every turn (a whole
                // partition's backlog could come first, and the order would depend on
                // timing). librdkafka creates the partition for the queue, and its fetch
                // start keeps a queue's forwarding that the application set.
                queues = split_queues(
                    &self.consumer,
                    &self.topics,
                    self.assigned.iter().map(|a| (a.0, a.1)),
                    wake,
                );
                self.consumer
                    .assign(&tpl)
                    .map_err(|e| kafka_err(brokers, format!("cannot assign partitions: {e}")))?;
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
                    .map_err(|e| kafka_err(brokers, format!("cannot subscribe: {e}")))?;
                self.acker.set_store(Arc::new(GroupStore {
                    consumer: self.consumer.clone(),
                    mode: StoreMode::StoreForAutoCommit,
                }));
            }
        }
        Ok(queues)
    }
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
