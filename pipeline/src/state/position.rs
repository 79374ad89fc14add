//! Positions in a stream, as plain data: where each Kafka partition resumes and where a
//! Kafka-fed shuffle stands. Batches carry these marks (see `batch`), and the resumable
//! state (the parent module) stores them; this module imports neither.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

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

    /// Sets the position of one partition.
    pub fn set(&mut self, topic: &str, partition: i32, position: Position) {
        self.0
            .entry(topic.to_string())
            .or_default()
            .insert(partition, position);
    }
}
/// A shuffle window over a Kafka stream: the rows it holds, as positions. Its rows of each
/// partition are consecutive there (a window takes the stream's rows in arrival order, and
/// each partition arrives in offset order), so they are the rows from `starts` up to
/// `ends`; reading those again rebuilds the window exactly, whatever order the partitions
/// arrive in (the window is permuted from its rows sorted by partition and position).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KafkaWindow {
    /// Index of the window since the stream began (it keys the window's permutation).
    pub window: u64,
    /// Rows it holds.
    pub rows: u64,
    /// Position of its first row in each partition it has rows of.
    pub starts: KafkaPositions,
    /// Just past every row taken into this window and the ones before it, per partition:
    /// where the source continues after rebuilding the window.
    pub ends: KafkaPositions,
}

/// Position in the output of a Kafka-fed shuffle: a window and how many of its (permuted)
/// rows come before. Cheap to clone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaMark {
    /// The window being emitted.
    pub window: Arc<KafkaWindow>,
    /// Rows of it before this position.
    pub emitted: u64,
}

/// The state of a Kafka-fed shuffle (see [`SourceState::kafka_shuffle`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KafkaShuffleState {
    /// Index of the window being emitted.
    pub window: u64,
    /// Rows it holds (0: none is being emitted; the next one is `window`).
    pub rows: u64,
    /// Rows of it already delivered.
    pub emitted: u64,
    /// Position of its first row in each partition it has rows of; its rows there end at
    /// [`SourceState::kafka`].
    #[serde(default)]
    pub starts: KafkaPositions,
}

impl KafkaMark {
    /// The state at this position.
    pub(crate) fn state(&self) -> KafkaShuffleState {
        if self.emitted >= self.window.rows {
            return KafkaShuffleState {
                window: self.window.window + 1,
                rows: 0,
                emitted: 0,
                starts: KafkaPositions::default(),
            };
        }
        KafkaShuffleState {
            window: self.window.window,
            rows: self.window.rows,
            emitted: self.emitted,
            starts: self.window.starts.clone(),
        }
    }
}
