//! Taking input rows into the current window, and starting the output of a full one: the
//! window permuted in memory, or its spilled runs merged.

use std::sync::Arc;

use arrow::array::RecordBatch;
use rand::seq::SliceRandom;

use crate::batch::{Batch, Mark};
use crate::error::{Error, Result};
use crate::state::KafkaWindow;

use super::kafka::{canonical, rebuild_failed};
use super::{Emitter, RowOrigin, Shuffler, WindowMark, arrow_err, err, shuffled, views};

impl Shuffler {
    /// Takes rows of `batch` until the window is full or the epoch changes; the rest waits
    /// in `carry`.
    pub(super) fn absorb(&mut self, mut batch: Batch) -> Result<()> {
        if self.kafka.is_some() {
            return self.absorb_kafka(batch);
        }
        let Some(mark) = batch.mark else {
            return Err(Error::Internal(format!(
                "{}: a batch without a position reached the shuffle",
                self.stage
            )));
        };
        if self.epoch.is_some_and(|e| e != mark.epoch) {
            // Finish the epoch (its last window and exchanges) before the new one starts.
            self.carry = Some(batch);
            self.end_epoch()?;
            self.next_epoch = Some(mark.epoch);
            return Ok(());
        }
        self.epoch = Some(mark.epoch);
        let room = self.spec.buffer_rows - self.rows;
        let take = room.min(batch.num_rows());
        if take < batch.num_rows() {
            self.carry = Some(batch.slice(take, batch.num_rows() - take));
            batch = batch.slice(0, take);
        }
        if self.rows == 0 {
            self.start = batch.mark;
        }
        self.last_end = batch.end_mark();
        self.rows += take;
        self.held_rows += take;
        self.bytes += batch.memory_size();
        self.pieces.push(batch);
        if self.bytes > self.spec.max_memory && self.rows < self.spec.buffer_rows {
            self.spill()?;
        }
        if self.rows == self.spec.buffer_rows {
            self.flush()?;
        }
        Ok(())
    }

    /// The epoch (or input) ended: emit the partial window, then settle exchanges.
    pub(super) fn end_epoch(&mut self) -> Result<()> {
        if let Some(w) = self.kafka.as_ref().and_then(|k| k.rebuild.as_ref()) {
            return Err(err(
                &self.stage,
                rebuild_failed(w, self.rows, "arrived before the input ended"),
            ));
        }
        if self.rows > 0 {
            self.flush()?;
        }
        if self.exchanging() {
            self.draining = true;
        }
        Ok(())
    }

    pub(super) fn window_rows(&mut self) -> (Vec<RecordBatch>, Vec<Vec<RowOrigin>>) {
        let pieces = std::mem::take(&mut self.pieces);
        self.held_rows = 0;
        self.bytes = 0;
        let mut lineage = Vec::with_capacity(pieces.len());
        let mut data = Vec::with_capacity(pieces.len());
        for p in pieces {
            let mut rows = Vec::with_capacity(p.num_rows());
            self.origins.rows_of(&p.lineage, &mut rows);
            lineage.push(rows);
            data.push(p.data);
        }
        (data, lineage)
    }

    /// `pieces` with the [`ShuffleSpec::views`] columns as views over the same buffers.
    pub(super) fn viewed(&self, pieces: Vec<RecordBatch>) -> Result<Vec<RecordBatch>> {
        if self.spec.views.is_empty() {
            return Ok(pieces);
        }
        pieces
            .iter()
            .map(|p| views(p, &self.spec.views).map_err(|e| arrow_err(&self.stage, e)))
            .collect()
    }

    /// Where the output of the current window restarts: its first input row, or (a rank
    /// with no rows of its own in an exchange round) just past the last row taken in.
    pub(super) fn window_mark(&self, own_rows: bool) -> Mark {
        if own_rows { self.start } else { None }
            .or(self.last_end)
            .unwrap_or(Mark::start_of(self.epoch.unwrap_or(0)))
    }

    /// Permutes the current window and starts emitting it.
    pub(super) fn flush(&mut self) -> Result<()> {
        self.rows = 0;
        if self.exchanging() {
            self.exchange_round(true)?;
            return Ok(());
        }
        let epoch = self.epoch.unwrap_or(0);
        let start = match self.kafka.as_mut() {
            None => WindowMark::Parquet(self.window_mark(true)),
            Some(feed) => {
                let starts = std::mem::take(&mut feed.starts);
                WindowMark::Kafka(match feed.rebuild.take() {
                    Some(w) => w,
                    None => Arc::new(KafkaWindow {
                        window: self.window,
                        rows: self.held_rows as u64,
                        starts,
                        ends: feed.taken.clone(),
                    }),
                })
            }
        };
        let emitter = if self.runs.is_empty() {
            let (pieces, lineage) = self.window_rows();
            let pieces = self.viewed(pieces)?;
            let mut rng = self.rng(epoch, self.window, 0);
            let order = match self.kafka {
                // Arrival order across partitions is timing: permute the rows sorted by
                // partition and position, which a rebuilt window has too.
                Some(_) => {
                    let mut order = canonical(&lineage, &self.origins);
                    order.shuffle(&mut rng);
                    order
                }
                None => shuffled(&pieces, &mut rng),
            };
            Emitter::Memory {
                pieces,
                lineage,
                order,
                pos: 0,
            }
        } else {
            if self.held_rows > 0 {
                self.spill()?;
            }
            let runs = std::mem::take(&mut self.runs);
            let left = runs.iter().map(|r| r.rows).sum();
            Emitter::Spilled {
                runs,
                left,
                rng: Box::new(self.rng(epoch, self.window, 1)),
            }
        };
        let mut emitter = self.grouped(emitter, epoch);
        let skipped = self.begin_output(&mut emitter)?;
        self.out = Some((emitter, start, skipped));
        Ok(())
    }

    /// Passes over the rows a resumed run already delivered (a mark may count past the end
    /// of its window: the rest is passed over in the next ones). Returns the rows skipped.
    pub(super) fn begin_output(&mut self, emitter: &mut Emitter) -> Result<u64> {
        let mut skipped = 0u64;
        while self.resume_skip > 0 {
            let n = self.resume_skip.min(65536) as usize;
            let k = emitter.skip(&self.stage, n, &self.origins)?;
            skipped += k as u64;
            self.resume_skip -= k as u64;
            if k < n {
                break;
            }
        }
        self.stats.replayed += skipped;
        Ok(skipped)
    }
}
