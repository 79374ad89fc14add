//! The shuffle of a Kafka stream: windows in a canonical order, and rebuilding the window a
//! resumed run was emitting.

use std::sync::Arc;

use crate::batch::{Batch, Origin};
use crate::error::{Error, Result};
use crate::state::{KafkaPositions, KafkaWindow, Position, SourceState, kafka_span};

use super::{Origins, RowOrigin, Shuffler, err};

/// What a shuffle of a Kafka stream tracks instead of [`Mark`]s (see [`KafkaWindow`]).
#[derive(Debug, Default)]
pub(super) struct KafkaFeed {
    /// Position of the current window's first row in each partition it has rows of.
    pub(super) starts: KafkaPositions,
    /// Just past every row taken in.
    pub(super) taken: KafkaPositions,
    /// Resuming: the window that was being emitted, until its rows have been read again.
    pub(super) rebuild: Option<Arc<KafkaWindow>>,
}

impl Shuffler {
    /// Makes this a shuffle of a Kafka stream, resuming from `resume` (its window is rebuilt
    /// from the rows the source reads again first).
    pub(crate) fn over_kafka(mut self, resume: Option<&SourceState>) -> Self {
        let mut feed = KafkaFeed::default();
        self.epoch = Some(0);
        if let Some(state) = resume {
            let ends = state.kafka.clone().unwrap_or_default();
            if let Some(k) = &state.kafka_shuffle {
                self.window = k.window;
                self.resume_skip = k.emitted;
                if k.rows > 0 {
                    feed.rebuild = Some(Arc::new(KafkaWindow {
                        window: k.window,
                        rows: k.rows,
                        starts: k.starts.clone(),
                        ends: ends.clone(),
                    }));
                }
            }
            feed.taken = ends;
        }
        self.kafka = Some(feed);
        self
    }

    /// [`Shuffler::absorb`] for a Kafka stream: windows of `buffer_rows` rows in arrival
    /// order, held in memory; resuming, first the window being emitted at the checkpoint,
    /// exactly the rows it held.
    pub(super) fn absorb_kafka(&mut self, mut batch: Batch) -> Result<()> {
        let Some(feed) = self.kafka.as_mut() else {
            return Err(Error::Internal("not a Kafka shuffle".into()));
        };
        let n = batch.num_rows();
        if let Some(w) = &feed.rebuild {
            let want = w.rows as usize - self.rows;
            let outside = batch.lineage.spans().iter().find(|s| {
                let Some((t, p, first, past)) = kafka_span(s) else {
                    return true;
                };
                match (w.starts.get(t, p), w.ends.get(t, p)) {
                    (Some(a), Some(b)) => first < a || past > b,
                    _ => true,
                }
            });
            if n > want || outside.is_some() {
                let next = outside
                    .map(|s| format!("{}, {} {}", s.origin, s.origin.unit(), s.first))
                    .unwrap_or_else(|| format!("{} rows more", n - want));
                return Err(err(
                    &self.stage,
                    rebuild_failed(w, self.rows, &format!("were read again before {next}")),
                ));
            }
        } else {
            let room = self.spec.buffer_rows - self.rows;
            if room < n {
                self.carry = Some(batch.slice(room, n - room));
                batch = batch.slice(0, room);
            }
        }
        for s in batch.lineage.spans() {
            if let Some((t, p, first, _)) = kafka_span(s)
                && feed.starts.get(t, p).is_none()
            {
                feed.starts.set(t, p, first);
            }
        }
        feed.taken.observe(&batch.lineage);
        let take = batch.num_rows();
        self.rows += take;
        self.held_rows += take;
        self.bytes += batch.memory_size();
        self.pieces.push(batch);
        if self.bytes > self.spec.max_memory {
            return Err(err(
                &self.stage,
                format!(
                    "a window of {} rows needs more than `max_memory` ({} bytes); a shuffle of a Kafka stream keeps its window in memory (the rows' arrival order, which would decide its spills, cannot be replayed): raise `max_memory` or lower `buffer_rows`",
                    self.spec.buffer_rows, self.spec.max_memory
                ),
            ));
        }
        let full = match &feed.rebuild {
            Some(w) => self.rows as u64 == w.rows,
            None => self.rows == self.spec.buffer_rows,
        };
        if full {
            self.flush()?;
        }
        Ok(())
    }
}

/// Every `(piece, row)` of a window of Kafka rows (`lineage` per piece), sorted by topic,
/// partition and position: an order that does not depend on how the partitions' rows
/// interleaved on arrival.
pub(super) fn canonical(lineage: &[Vec<RowOrigin>], origins: &Origins) -> Vec<(usize, usize)> {
    let key = |r: &RowOrigin| match &origins.list[r.origin as usize] {
        Origin::Kafka { topic, partition } => (*topic, *partition, r.first as i64, 0),
        Origin::KafkaMessage {
            topic,
            partition,
            offset,
            ..
        } => (*topic, *partition, *offset, r.first),
        Origin::Object { url, row_group } => (*url, *row_group as i32, r.first as i64, 0),
    };
    let mut keyed: Vec<_> = lineage
        .iter()
        .enumerate()
        .flat_map(|(p, rows)| rows.iter().enumerate().map(move |(r, o)| ((p, r), o)))
        .map(|(at, o)| (key(o), at))
        .collect();
    keyed.sort_unstable_by_key(|a| a.0);
    keyed.into_iter().map(|(_, at)| at).collect()
}

/// Why a resumed Kafka window could not be rebuilt: only `got` of its rows `how`.
pub(super) fn rebuild_failed(w: &KafkaWindow, got: usize, how: &str) -> String {
    format!(
        "cannot rebuild the shuffle window the state was taken in: it held {} rows ({}), but only {got} of them {how}. Were messages deleted (retention) or the topic recreated since? Resume from an earlier checkpoint, or start over without this one",
        w.rows,
        describe_window(w)
    )
}

/// The partitions and positions a Kafka window holds, e.g. `events/0 from offset 10 to offset 20`.
fn describe_window(w: &KafkaWindow) -> String {
    let parts: Vec<String> = w
        .starts
        .iter()
        .map(|(t, p, a)| {
            let b = w.ends.get(t, p).unwrap_or(a);
            format!("{t}/{p} from {} to {}", show(a), show(b))
        })
        .collect();
    parts.join(", ")
}

fn show(p: Position) -> String {
    match p.skip_rows {
        0 => format!("offset {}", p.offset),
        r => format!("offset {} row {r}", p.offset),
    }
}
