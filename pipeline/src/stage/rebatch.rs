//! The `batch` stage: fixed-size output batches from whatever sizes arrive.
//!
//! A batch never spans epochs: the last rows of an epoch form a short batch (or, with
//! `drop_last`, are dropped and counted), like a PyTorch `DataLoader` iterated once per epoch.
//! Every rank's share of an epoch has the same number of rows, so every rank gets the same
//! number of batches in every epoch.

use std::collections::VecDeque;

use arrow::compute::concat_batches;
use arrow::datatypes::SchemaRef;
use serde::{Deserialize, Serialize};

use super::{Build, BuiltStage, StageKind};
use crate::batch::{Batch, Lineage};
use crate::error::{Error, Result};

/// `type: batch`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct BatchConfig {
    /// Rows per output batch.
    pub size: usize,
    /// Drop the short final batch instead of emitting it (the dropped rows are counted in the
    /// run summary). Default: false.
    #[serde(default)]
    pub drop_last: bool,
}

/// Accumulates rows and cuts batches of exactly `size` rows (zero-copy slices, one concat per
/// output batch when it spans several inputs).
#[derive(Debug)]
pub(crate) struct Rebatcher {
    /// What errors name: the stage, or the source for the cut of a rank's share.
    stage: String,
    size: usize,
    drop_last: bool,
    schema: SchemaRef,
    pending: VecDeque<Batch>,
    rows: usize,
    /// Epoch of the pending rows.
    epoch: Option<u64>,
}

impl Rebatcher {
    pub(crate) fn new(
        stage: impl std::fmt::Display,
        size: usize,
        drop_last: bool,
        schema: SchemaRef,
    ) -> Self {
        Rebatcher {
            stage: stage.to_string(),
            size,
            drop_last,
            schema,
            pending: VecDeque::new(),
            rows: 0,
            epoch: None,
        }
    }

    /// Adds a batch; returns the batches now complete (full ones, and the short last batch of
    /// an epoch that ended) and how many rows `drop_last` dropped at an epoch's end.
    pub(crate) fn push(&mut self, batch: Batch) -> Result<(Vec<Batch>, usize)> {
        let mut out = Vec::new();
        let mut dropped = 0;
        for (epoch, part) in by_epoch(batch) {
            if self.rows > 0 && self.epoch != epoch {
                let (tail, d) = self.finish()?;
                out.extend(tail);
                dropped += d;
            }
            self.epoch = epoch;
            let mut part = part;
            if self.rows > 0 {
                // Top up the rows waiting to a whole batch from the front of `part`.
                let need = self.size - self.rows;
                if part.num_rows() < need {
                    self.rows += part.num_rows();
                    self.pending.push_back(part);
                    continue;
                }
                let rest = part.slice(need, part.num_rows() - need);
                self.rows += need;
                self.pending.push_back(part.slice(0, need));
                out.push(self.take_all()?);
                part = rest;
            }
            // Whole batches straight from `part` (its lineage walked once), the short rest
            // left waiting.
            for piece in part.split(self.size) {
                if piece.num_rows() == self.size {
                    out.push(piece);
                } else if piece.num_rows() > 0 {
                    self.rows = piece.num_rows();
                    self.pending.push_back(piece);
                }
            }
        }
        Ok((out, dropped))
    }

    /// At end of input: the short tail (unless `drop_last`), and how many rows were dropped.
    pub(crate) fn finish(&mut self) -> Result<(Option<Batch>, usize)> {
        if self.rows == 0 {
            return Ok((None, 0));
        }
        if self.drop_last {
            let dropped = self.rows;
            self.pending.clear();
            self.rows = 0;
            return Ok((None, dropped));
        }
        Ok((Some(self.take_all()?), 0))
    }

    /// All the rows waiting, as one batch (`push` keeps fewer than `size` waiting, or tops
    /// them up to exactly `size` before calling this).
    fn take_all(&mut self) -> Result<Batch> {
        let mut pieces: Vec<Batch> = self.pending.drain(..).collect();
        let rows: usize = pieces.iter().map(Batch::num_rows).sum();
        if rows != self.rows {
            return Err(Error::Internal(format!(
                "{}: row accounting is off",
                self.stage
            )));
        }
        self.rows = 0;
        if pieces.len() == 1 {
            return pieces
                .pop()
                .ok_or_else(|| Error::Internal("empty batch".into()));
        }
        let data = concat_batches(&self.schema, pieces.iter().map(|b| &b.data)).map_err(|e| {
            Error::Arrow {
                context: self.stage.clone(),
                source: e,
            }
        })?;
        let mut lineage =
            Lineage::with_capacity(pieces.iter().map(|p| p.lineage.spans().len()).sum());
        for p in &pieces {
            lineage.extend(&p.lineage);
        }
        Ok(Batch::new(data, lineage).with_position_of(&pieces[0]))
    }
}

/// `batch` cut where its rows' epoch changes (in practice a batch holds one epoch: sources
/// and shuffle windows never mix them), with each part's epoch; no empty parts.
fn by_epoch(batch: Batch) -> Vec<(Option<u64>, Batch)> {
    let spans = batch.lineage.spans();
    let mut parts = Vec::new();
    let (mut start, mut at, mut epoch) = (0usize, 0usize, spans.first().map(|s| s.epoch));
    for s in spans {
        if Some(s.epoch) != epoch {
            parts.push((epoch, batch.slice(start, at - start)));
            start = at;
            epoch = Some(s.epoch);
        }
        at += s.len as usize;
    }
    let rest = batch.num_rows() - start;
    parts.push((
        epoch,
        if start == 0 {
            batch
        } else {
            batch.slice(start, rest)
        },
    ));
    parts.retain(|(_, b)| b.num_rows() > 0);
    parts
}

/// `batch`: checks `size`; the stage is the rebatcher, the schema passes through.
impl StageKind for BatchConfig {
    fn keeps_columns(&self) -> bool {
        true
    }

    fn removed_as(&self) -> &'static str {
        "dropped by drop_last"
    }

    fn build(&self, b: &Build<'_>) -> Result<(BuiltStage, SchemaRef)> {
        if self.size == 0 {
            return Err(b.err("`size` must be at least 1".into()));
        }
        Ok((
            BuiltStage::Rebatch {
                size: self.size,
                drop_last: self.drop_last,
            },
            b.input.clone(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::{Name, Origin};
    use crate::error::StageRef;
    use arrow::array::{Array, AsArray, Int64Array, RecordBatch};
    use arrow::datatypes::Int64Type;
    use std::sync::Arc;

    fn input(start: i64, n: i64) -> Batch {
        let data = RecordBatch::try_from_iter([(
            "x",
            Arc::new(Int64Array::from_iter_values(start..start + n)) as _,
        )])
        .unwrap();
        let origin = Origin::Object {
            url: Name::from("file:///t"),
            row_group: 0,
        };
        Batch::new(data, Lineage::new(origin, start as u64, n as u64, 0))
    }

    fn stage() -> StageRef {
        StageRef {
            index: 0,
            kind: "batch",
            location: None,
        }
    }

    #[test]
    fn cuts_exact_sizes_keeps_order_and_lineage() {
        let schema = input(0, 1).data.schema();
        let mut r = Rebatcher::new(stage(), 4, false, schema);
        let mut out = Vec::new();
        for (s, n) in [(0, 3), (3, 3), (6, 5)] {
            out.extend(r.push(input(s, n)).unwrap().0);
        }
        let (tail, dropped) = r.finish().unwrap();
        out.extend(tail);
        assert_eq!(dropped, 0);
        let sizes: Vec<usize> = out.iter().map(Batch::num_rows).collect();
        assert_eq!(sizes, vec![4, 4, 3]);
        let all: Vec<i64> = out
            .iter()
            .flat_map(|b| {
                b.data
                    .column(0)
                    .as_primitive::<Int64Type>()
                    .values()
                    .to_vec()
            })
            .collect();
        assert_eq!(all, (0..11).collect::<Vec<_>>());
        for b in &out {
            assert_eq!(b.lineage.num_rows() as usize, b.num_rows());
            assert_eq!(
                b.lineage.spans().len(),
                1,
                "contiguous rows merge into one span"
            );
            let first = b.data.column(0).as_primitive::<Int64Type>().value(0);
            assert_eq!(b.lineage.spans()[0].first, first as u64);
        }
        assert!(out[0].data.column(0).len() == 4);
    }

    /// Rows of their own (a shuffle's output): each row one span, positions descending.
    fn shuffled(rows: std::ops::Range<i64>) -> Batch {
        let origin = input(0, 1).lineage.spans()[0].origin;
        let mut lineage = Lineage::default();
        for r in rows.clone() {
            lineage.push(crate::batch::LineageSpan {
                origin,
                first: 1000 - r as u64,
                len: 1,
                epoch: 0,
            });
        }
        let data = input(rows.start, rows.end - rows.start).data;
        Batch::new(data, lineage)
    }

    #[test]
    fn large_inputs_are_cut_in_one_pass_with_their_lineage() {
        let schema = input(0, 1).data.schema();
        let mut r = Rebatcher::new(stage(), 3, false, schema);
        let mut out = Vec::new();
        // 2 rows waiting, then 11 rows: one batch topped up, three whole, 1 row left.
        for b in [shuffled(0..2), shuffled(2..13), shuffled(13..14)] {
            out.extend(r.push(b).unwrap().0);
        }
        out.extend(r.finish().unwrap().0);
        let sizes: Vec<usize> = out.iter().map(Batch::num_rows).collect();
        assert_eq!(sizes, vec![3, 3, 3, 3, 2]);
        let mut row = 0i64;
        for b in &out {
            let values = b.data.column(0).as_primitive::<Int64Type>();
            let spans = b.lineage.spans();
            assert_eq!(spans.len(), b.num_rows(), "a row's span each");
            for (v, s) in values.values().iter().zip(spans) {
                assert_eq!(*v, row);
                assert_eq!((s.first, s.len), (1000 - row as u64, 1));
                row += 1;
            }
        }
        assert_eq!(row, 14);
    }

    #[test]
    fn drop_last_reports_dropped_rows() {
        let schema = input(0, 1).data.schema();
        let mut r = Rebatcher::new(stage(), 4, true, schema);
        assert_eq!(r.push(input(0, 6)).unwrap().0.len(), 1);
        let (tail, dropped) = r.finish().unwrap();
        assert!(tail.is_none());
        assert_eq!(dropped, 2);
    }

    /// `n` rows from `start` read in `epoch`.
    fn in_epoch(start: i64, n: i64, epoch: u64) -> Batch {
        let b = input(start, n);
        let origin = b.lineage.spans()[0].origin;
        Batch::new(b.data, Lineage::new(origin, start as u64, n as u64, epoch))
    }

    fn epochs_of(b: &Batch) -> Vec<u64> {
        b.lineage.spans().iter().map(|s| s.epoch).collect()
    }

    #[test]
    fn an_epoch_ends_with_a_short_batch_and_never_shares_one() {
        let schema = input(0, 1).data.schema();
        let mut r = Rebatcher::new(stage(), 4, false, schema.clone());
        let mut out = Vec::new();
        // Epoch 0: 6 rows, epoch 1: 5 rows, arriving in pieces that straddle nothing.
        for b in [in_epoch(0, 3, 0), in_epoch(3, 3, 0), in_epoch(0, 5, 1)] {
            let (batches, dropped) = r.push(b).unwrap();
            assert_eq!(dropped, 0);
            out.extend(batches);
        }
        out.extend(r.finish().unwrap().0);
        let sizes: Vec<usize> = out.iter().map(Batch::num_rows).collect();
        assert_eq!(sizes, vec![4, 2, 4, 1]);
        let epochs: Vec<Vec<u64>> = out.iter().map(epochs_of).collect();
        assert_eq!(epochs, vec![vec![0], vec![0], vec![1], vec![1]]);

        // drop_last drops each epoch's tail and says how many rows.
        let mut r = Rebatcher::new(stage(), 4, true, schema.clone());
        let (a, d0) = r.push(in_epoch(0, 6, 0)).unwrap();
        let (b, d1) = r.push(in_epoch(0, 5, 1)).unwrap();
        let (tail, d2) = r.finish().unwrap();
        assert_eq!((a.len(), b.len(), tail.is_none()), (1, 1, true));
        assert_eq!((d0, d1, d2), (0, 2, 1));

        // One input batch holding two epochs is cut between them.
        let two = Batch::new(
            arrow::compute::concat_batches(
                &schema,
                [&in_epoch(0, 3, 0).data, &in_epoch(0, 3, 1).data],
            )
            .unwrap(),
            {
                let mut l = in_epoch(0, 3, 0).lineage;
                l.extend(&in_epoch(0, 3, 1).lineage);
                l
            },
        );
        let mut r = Rebatcher::new(stage(), 4, false, schema);
        let (out, _) = r.push(two).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!((out[0].num_rows(), epochs_of(&out[0])), (3, vec![0]));
        let tail = r.finish().unwrap().0.unwrap();
        assert_eq!((tail.num_rows(), epochs_of(&tail)), (3, vec![1]));
    }
}
