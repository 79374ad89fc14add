//! The `batch` stage: fixed-size output batches from whatever sizes arrive.

use std::collections::VecDeque;

use arrow::compute::concat_batches;
use arrow::datatypes::SchemaRef;

use crate::batch::{Batch, Lineage};
use crate::error::{Error, Result, StageRef};

/// Accumulates rows and cuts batches of exactly `size` rows (zero-copy slices, one concat per
/// output batch when it spans several inputs).
#[derive(Debug)]
pub(crate) struct Rebatcher {
    stage: StageRef,
    size: usize,
    drop_last: bool,
    schema: SchemaRef,
    pending: VecDeque<Batch>,
    rows: usize,
}

impl Rebatcher {
    pub(crate) fn new(stage: StageRef, size: usize, drop_last: bool, schema: SchemaRef) -> Self {
        Rebatcher {
            stage,
            size,
            drop_last,
            schema,
            pending: VecDeque::new(),
            rows: 0,
        }
    }

    /// Adds a batch; returns the full batches now available.
    pub(crate) fn push(&mut self, batch: Batch) -> Result<Vec<Batch>> {
        if batch.num_rows() > 0 {
            self.rows += batch.num_rows();
            self.pending.push_back(batch);
        }
        let mut out = Vec::new();
        while self.rows >= self.size {
            out.push(self.take(self.size)?);
        }
        Ok(out)
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
        let n = self.rows;
        Ok((Some(self.take(n)?), 0))
    }

    fn take(&mut self, n: usize) -> Result<Batch> {
        let mut pieces = Vec::new();
        let mut need = n;
        while need > 0 {
            let Some(front) = self.pending.pop_front() else {
                return Err(Error::Internal(format!(
                    "{}: row accounting is off",
                    self.stage
                )));
            };
            if front.num_rows() <= need {
                need -= front.num_rows();
                pieces.push(front);
            } else {
                pieces.push(front.slice(0, need));
                self.pending
                    .push_front(front.slice(need, front.num_rows() - need));
                need = 0;
            }
        }
        self.rows -= n;
        if pieces.len() == 1 {
            return pieces
                .pop()
                .ok_or_else(|| Error::Internal("empty batch".into()));
        }
        let data = concat_batches(&self.schema, pieces.iter().map(|b| &b.data)).map_err(|e| {
            Error::Arrow {
                context: self.stage.to_string(),
                source: e,
            }
        })?;
        let mut lineage = Lineage::default();
        for p in &pieces {
            lineage.extend(&p.lineage);
        }
        Ok(Batch::new(data, lineage).with_mark(pieces[0].mark))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::Origin;
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
            url: Arc::from("file:///t"),
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
            out.extend(r.push(input(s, n)).unwrap());
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

    #[test]
    fn drop_last_reports_dropped_rows() {
        let schema = input(0, 1).data.schema();
        let mut r = Rebatcher::new(stage(), 4, true, schema);
        assert_eq!(r.push(input(0, 6)).unwrap().len(), 1);
        let (tail, dropped) = r.finish().unwrap();
        assert!(tail.is_none());
        assert_eq!(dropped, 2);
    }
}
