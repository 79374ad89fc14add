//! The data side's resumable state: how far each source has been *durably* consumed.
//!
//! A consumer of the stream (the `sluice` job, or a user's training loop) reports every batch
//! it has handed off with [`Acknowledger::observe`], and calls [`Acknowledger::commit`] once
//! those rows are durable (the sink flushed, the checkpoint written). `commit` returns the
//! [`SourceState`] to store in a checkpoint and, for Kafka consumer groups, stores the offsets
//! with the group. Positions are derived from lineage, so they are exact per partition.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};

use serde::{Deserialize, Serialize};

use crate::batch::{Batch, Lineage, Mark, Origin};

/// Where to resume one Kafka partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Position {
    /// The next message to read.
    pub offset: i64,
    /// Rows of that message already delivered (messages holding many rows: `arrow_ipc`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub skip_rows: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// Positions of Kafka partitions: topic → partition → position.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KafkaPositions(pub BTreeMap<String, BTreeMap<i32, Position>>);

impl KafkaPositions {
    /// Advances positions past every Kafka row of `lineage`.
    pub fn observe(&mut self, lineage: &Lineage) {
        for s in lineage.spans() {
            let (topic, partition, pos) = match &s.origin {
                Origin::Kafka { topic, partition } => (
                    topic,
                    *partition,
                    Position {
                        offset: (s.first + s.len) as i64,
                        skip_rows: 0,
                    },
                ),
                Origin::KafkaMessage {
                    topic,
                    partition,
                    offset,
                    rows,
                } => {
                    let done = s.first + s.len;
                    let pos = if done >= *rows {
                        Position {
                            offset: offset + 1,
                            skip_rows: 0,
                        }
                    } else {
                        Position {
                            offset: *offset,
                            skip_rows: done,
                        }
                    };
                    (topic, *partition, pos)
                }
                Origin::Object { .. } => continue,
            };
            let slot = self
                .0
                .entry(topic.to_string())
                .or_default()
                .entry(partition)
                .or_insert(pos);
            if pos > *slot {
                *slot = pos;
            }
        }
    }

    /// The position of one partition, if any row of it was observed (or restored).
    pub fn get(&self, topic: &str, partition: i32) -> Option<Position> {
        self.0.get(topic).and_then(|p| p.get(&partition)).copied()
    }

    /// Every `(topic, partition, position)`.
    pub fn iter(&self) -> impl Iterator<Item = (&str, i32, Position)> {
        self.0
            .iter()
            .flat_map(|(t, ps)| ps.iter().map(move |(p, pos)| (t.as_str(), *p, *pos)))
    }
}

/// A resumable position of the pipeline's source.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceState {
    /// Kafka partitions (static assignment resumes from here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kafka: Option<KafkaPositions>,
    /// Where a Parquet pipeline continues: epoch, unit, row, rows to skip and, past a
    /// shuffle, the window position. Shuffle windows and augmentation draws are pure
    /// functions of the seed and row identity, so this is all that is needed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parquet: Option<Mark>,
}

/// Stores offsets with a Kafka consumer group (set by a `group` source once it is open).
pub(crate) trait OffsetStore: Send + Sync + std::fmt::Debug {
    /// Stores (and, at the end of a run, commits synchronously) these positions.
    fn store(&self, positions: &KafkaPositions, final_commit: bool);
}

/// Tracks what the consumer of a stream has handed off and made durable. Cheap to share.
#[derive(Debug, Default)]
pub struct Acknowledger {
    written: Mutex<KafkaPositions>,
    mark: Mutex<Option<Mark>>,
    store: OnceLock<Arc<dyn OffsetStore>>,
}

impl Acknowledger {
    /// Starts from a restored state (or nothing).
    pub fn new(resume: Option<&SourceState>) -> Self {
        Acknowledger {
            written: Mutex::new(resume.and_then(|s| s.kafka.clone()).unwrap_or_default()),
            mark: Mutex::new(resume.and_then(|s| s.parquet)),
            store: OnceLock::new(),
        }
    }

    pub(crate) fn set_store(&self, store: Arc<dyn OffsetStore>) {
        let _ = self.store.set(store);
    }

    /// Records that the rows of `lineage` have been handed off (written to the sink).
    pub fn observe(&self, lineage: &Lineage) {
        if let Ok(mut w) = self.written.lock() {
            w.observe(lineage);
        }
    }

    /// Records that `batch` has been handed off: its Kafka rows (by lineage) and, for a
    /// Parquet pipeline, the position just past it. Batches must be observed in stream order.
    pub fn observe_batch(&self, batch: &Batch) {
        self.observe(&batch.lineage);
        if let Some(end) = batch.end_mark()
            && let Ok(mut m) = self.mark.lock()
        {
            *m = Some(end);
        }
    }

    /// The positions just past everything observed so far: what a checkpoint records once
    /// those rows are durable.
    pub fn state(&self) -> SourceState {
        let positions = self.written.lock().map(|w| w.clone()).unwrap_or_default();
        SourceState {
            kafka: (!positions.0.is_empty()).then_some(positions),
            parquet: self.mark.lock().ok().and_then(|m| *m),
        }
    }

    /// Declares `state` durable (its rows written, its checkpoint stored): stores the offsets
    /// with the consumer group, if any. `final_commit` commits synchronously (end of run).
    pub fn store(&self, state: &SourceState, final_commit: bool) {
        if let (Some(store), Some(k)) = (self.store.get(), &state.kafka) {
            store.store(k, final_commit);
        }
    }

    /// [`Acknowledger::state`] then [`Acknowledger::store`]: everything observed is durable.
    pub fn commit(&self, final_commit: bool) -> SourceState {
        let state = self.state();
        self.store(&state, final_commit);
        state
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::LineageSpan;

    #[test]
    fn positions_follow_lineage_and_partial_messages() {
        let t: Arc<str> = Arc::from("t");
        let mut l = Lineage::new(
            Origin::Kafka {
                topic: t.clone(),
                partition: 0,
            },
            10,
            5,
            0,
        );
        l.push(LineageSpan {
            origin: Origin::KafkaMessage {
                topic: t.clone(),
                partition: 1,
                offset: 7,
                rows: 100,
            },
            first: 0,
            len: 40,
            epoch: 0,
        });
        let mut p = KafkaPositions::default();
        p.observe(&l);
        assert_eq!(
            p.get("t", 0),
            Some(Position {
                offset: 15,
                skip_rows: 0
            })
        );
        assert_eq!(
            p.get("t", 1),
            Some(Position {
                offset: 7,
                skip_rows: 40
            })
        );
        let rest = Lineage::new(
            Origin::KafkaMessage {
                topic: t,
                partition: 1,
                offset: 7,
                rows: 100,
            },
            40,
            60,
            0,
        );
        p.observe(&rest);
        assert_eq!(
            p.get("t", 1),
            Some(Position {
                offset: 8,
                skip_rows: 0
            })
        );
        let json = serde_json::to_string(&SourceState {
            kafka: Some(p.clone()),
            parquet: None,
        })
        .unwrap();
        let back: SourceState = serde_json::from_str(&json).unwrap();
        assert_eq!(back.kafka, Some(p));
    }
}
