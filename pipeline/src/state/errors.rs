//! What a Kafka source counted: records consumed and how many could not be decoded, and
//! the ledger that keeps those counts in step with the positions a checkpoint records.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::position::KafkaPositions;

/// Records a Kafka source consumed, and how many of them could not be decoded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorCounts {
    /// Records (messages) consumed, good and bad.
    pub records: u64,
    /// Records that could not be decoded (dead-lettered).
    pub bad: u64,
}

/// Consecutive offsets `first..first + len` of one partition, all decoded or all bad.
#[derive(Debug, Clone, Copy)]
pub(super) struct Run {
    pub(super) first: i64,
    pub(super) len: u64,
    pub(super) bad: bool,
}

impl Run {
    /// How many of its records lie below offset `end`.
    pub(super) fn below(&self, end: i64) -> u64 {
        ((end - self.first).max(0) as u64).min(self.len)
    }
}

impl ErrorCounts {
    /// Adds `n` records, all bad or all decoded.
    fn add(&mut self, n: u64, bad: bool) {
        self.records += n;
        if bad {
            self.bad += n;
        }
    }
}

/// The error budget's counts of a Kafka source, to be split at the positions of a state:
/// `base` counts the records under every position any acknowledger sharing the ledger has
/// taken a state at (and what a restored state carried), `pending` the records counted
/// since, per partition, as runs of consecutive offsets (a partition's records arrive in
/// offset order; a gap, from compaction or transaction markers, starts a new run, so the
/// split at a position is exact). Runs below every sharer's last state are folded into
/// `base`, so `pending` holds about the records in flight.
#[derive(Debug, Default)]
pub(super) struct ErrorLedger {
    pub(super) base: ErrorCounts,
    /// Set once a Kafka source counted anything or a state carried counts.
    pub(super) used: bool,
    pub(super) pending: BTreeMap<(Arc<str>, i32), VecDeque<Run>>,
    /// Per sharer, the positions of its last state (`None`: it has taken none).
    pub(super) seen: Vec<Option<KafkaPositions>>,
}

impl ErrorLedger {
    /// Adds `run` of `topic`/`partition` (after every earlier offset of the partition).
    #[cfg_attr(not(feature = "kafka"), allow(dead_code))] // used by the Kafka source
    pub(super) fn consumed(&mut self, topic: &Arc<str>, partition: i32, run: Run) {
        self.used = true;
        let runs = self.pending.entry((topic.clone(), partition)).or_default();
        match runs.back_mut() {
            Some(r) if r.bad == run.bad && r.first + r.len as i64 == run.first => {
                r.len += run.len;
            }
            _ => runs.push_back(run),
        }
    }

    /// The counts below `positions`, for sharer `who`.
    pub(super) fn count(&mut self, who: usize, positions: &KafkaPositions) -> ErrorCounts {
        let mut c = self.base;
        for ((topic, partition), runs) in &self.pending {
            let Some(end) = positions.get(topic, *partition).map(|p| p.offset) else {
                continue;
            };
            // Every run (not up to the first past `end`): runs are not assumed sorted.
            for r in runs {
                c.add(r.below(end), r.bad);
            }
        }
        if let Some(slot) = self.seen.get_mut(who) {
            *slot = Some(positions.clone());
        }
        self.fold();
        c
    }

    /// Folds the runs below every sharer's last state into `base`.
    pub(super) fn fold(&mut self) {
        let seen: Vec<&KafkaPositions> = self.seen.iter().flatten().collect();
        if seen.is_empty() {
            return;
        }
        for ((topic, partition), runs) in &mut self.pending {
            let Some(end) = seen
                .iter()
                .map(|s| s.get(topic, *partition).map_or(i64::MIN, |p| p.offset))
                .min()
            else {
                continue;
            };
            while let Some(r) = runs.front_mut() {
                let n = r.below(end);
                if n == 0 {
                    break;
                }
                self.base.add(n, r.bad);
                r.first += n as i64;
                r.len -= n;
                if r.len > 0 {
                    break;
                }
                runs.pop_front();
            }
        }
    }
}
