//! `group_by_length`: a window's output regrouped into batches of rows of similar length.

use arrow::array::{Array, AsArray, RecordBatch, UInt32Array};
use arrow::compute::take_record_batch;
use arrow::datatypes::{DataType, Schema};
use rand::seq::SliceRandom;

use crate::error::{Error, Result, StageRef};

use super::settings::GroupByLength;
use super::{Emitter, Origins, RowOrigin, Shuffler, arrow_err, err};

/// A built `group_by_length` (see [`GroupByLength`]).
#[derive(Debug, Clone)]
pub(crate) struct GroupSpec {
    /// The column whose lengths are compared, and its name (for errors).
    pub(crate) column: usize,
    pub(crate) name: String,
    pub(crate) batches: usize,
    /// The size of the `batch` stage after the shuffle (set when the plan is linked: 0
    /// until then).
    pub(crate) batch_size: usize,
}

/// Checks a `group_by_length` against the shuffle's input.
pub(crate) fn group_spec(stage: &StageRef, g: &GroupByLength, input: &Schema) -> Result<GroupSpec> {
    if g.batches == 0 {
        return Err(err(stage, "`group_by_length.batches` must be at least 1"));
    }
    let column = super::super::column_index(stage, input, &g.column)?;
    let dt = input.field(column).data_type();
    if !has_length(dt) {
        return Err(err(
            stage,
            format!(
                "`group_by_length` compares the lengths of `{}`, a {dt} column: give a list, string or binary column (one whose rows differ in length)",
                g.column
            ),
        ));
    }
    Ok(GroupSpec {
        column,
        name: g.column.clone(),
        batches: g.batches,
        batch_size: 0,
    })
}

/// Whether rows of `dt` have a length `group_by_length` can compare.
fn has_length(dt: &DataType) -> bool {
    matches!(
        dt,
        DataType::List(_)
            | DataType::LargeList(_)
            | DataType::Utf8
            | DataType::LargeUtf8
            | DataType::Binary
            | DataType::LargeBinary
            | DataType::Utf8View
            | DataType::BinaryView
    )
}

/// Every row's length in `a` (list items or bytes; a null row has length 0).
fn lengths(a: &dyn Array) -> Option<Vec<u64>> {
    fn diffs<O: arrow::array::OffsetSizeTrait>(o: &[O]) -> Vec<u64> {
        o.windows(2)
            .map(|w| (w[1] - w[0]).as_usize() as u64)
            .collect()
    }
    let mut out = match a.data_type() {
        DataType::List(_) => diffs(a.as_list::<i32>().offsets()),
        DataType::LargeList(_) => diffs(a.as_list::<i64>().offsets()),
        DataType::Utf8 => diffs(a.as_string::<i32>().offsets()),
        DataType::LargeUtf8 => diffs(a.as_string::<i64>().offsets()),
        DataType::Binary => diffs(a.as_binary::<i32>().offsets()),
        DataType::LargeBinary => diffs(a.as_binary::<i64>().offsets()),
        DataType::Utf8View => a
            .as_string_view()
            .views()
            .iter()
            .map(|v| u64::from(*v as u32))
            .collect(),
        DataType::BinaryView => a
            .as_binary_view()
            .views()
            .iter()
            .map(|v| u64::from(*v as u32))
            .collect(),
        _ => return None,
    };
    if let Some(nulls) = a.logical_nulls() {
        for (len, valid) in out.iter_mut().zip(nulls.iter()) {
            if !valid {
                *len = 0;
            }
        }
    }
    Some(out)
}

/// A window's output regrouped by length: groups of `batches × batch_size` rows of the
/// shuffled order, each sorted by length (longest first; a stable sort, so ties keep the
/// shuffled order), cut into batches whose order is then permuted — the short batch of the
/// window's last group (if any) last, so batch boundaries stay where the `batch` stage cuts.
/// Everything is a function of (seed, epoch, window, rank, group index): a resumed run
/// regroups the same way and passes over whole groups without reading them twice.
pub(super) struct Grouped {
    pub(super) inner: Emitter,
    spec: GroupSpec,
    seed: u64,
    epoch: u64,
    /// The window and the rank, as the generator's key takes them.
    key: u64,
    /// The current group, its rows' origins, their order and how many have been emitted.
    chunk: Option<(RecordBatch, Vec<RowOrigin>)>,
    order: Vec<u32>,
    pos: usize,
    /// Groups taken so far in this window.
    groups: u64,
}

/// The generators that order the batches of `group_by_length`'s groups: this plus the
/// group's index, keyed by (seed, epoch, window, rank).
const GROUP_DOMAIN: u64 = 0x6772_6f75_7073_0000;

impl Shuffler {
    /// `emitter`'s output regrouped by length, with `group_by_length`.
    pub(super) fn grouped(&self, inner: Emitter, epoch: u64) -> Emitter {
        match &self.spec.group {
            None => inner,
            Some(spec) => Emitter::Grouped(Box::new(Grouped {
                inner,
                spec: spec.clone(),
                seed: self.spec.seed,
                epoch,
                key: (self.window << 24) ^ (self.rank() << 12),
                chunk: None,
                order: Vec::new(),
                pos: 0,
                groups: 0,
            })),
        }
    }
}

impl Grouped {
    fn group_rows(&self) -> usize {
        self.spec.batches * self.spec.batch_size.max(1)
    }

    /// Takes the next group from the inner emitter and orders it; false when the window is
    /// exhausted.
    fn fill(&mut self, stage: &StageRef, origins: &Origins) -> Result<bool> {
        let Some((data, rows)) = self.inner.next(stage, self.group_rows(), origins)? else {
            return Ok(false);
        };
        let len = lengths(data.column(self.spec.column).as_ref()).ok_or_else(|| {
            Error::Internal(format!(
                "{stage}: `{}` has no lengths to group by",
                self.spec.name
            ))
        })?;
        let mut sorted: Vec<u32> = (0..data.num_rows() as u32).collect();
        sorted.sort_by_key(|&i| std::cmp::Reverse(len[i as usize]));
        let size = self.spec.batch_size.max(1);
        let mut batches: Vec<&[u32]> = sorted.chunks(size).collect();
        let full = sorted.len() / size;
        let mut rng = super::super::seeded_rng(
            self.seed,
            GROUP_DOMAIN.wrapping_add(self.groups),
            self.epoch,
            self.key,
        );
        batches[..full].shuffle(&mut rng);
        self.order = batches.concat();
        self.pos = 0;
        self.chunk = Some((data, rows));
        self.groups += 1;
        Ok(true)
    }

    pub(super) fn next(
        &mut self,
        stage: &StageRef,
        want: usize,
        origins: &Origins,
    ) -> Result<Option<(RecordBatch, Vec<RowOrigin>)>> {
        if self.pos >= self.order.len() && !self.fill(stage, origins)? {
            return Ok(None);
        }
        let Some((data, lineage)) = &self.chunk else {
            return Err(Error::Internal(format!("{stage}: no group")));
        };
        let end = (self.pos + want).min(self.order.len());
        let idx = &self.order[self.pos..end];
        self.pos = end;
        let rb = take_record_batch(data, &UInt32Array::from(idx.to_vec()))
            .map_err(|e| arrow_err(stage, e))?;
        let rows = idx.iter().map(|&i| lineage[i as usize]).collect();
        Ok(Some((rb, rows)))
    }

    /// Passes over up to `n` rows: whole groups without reading or sorting them.
    pub(super) fn skip(&mut self, stage: &StageRef, n: usize, origins: &Origins) -> Result<usize> {
        let mut done = 0;
        while done < n {
            if self.pos < self.order.len() {
                let k = (n - done).min(self.order.len() - self.pos);
                self.pos += k;
                done += k;
                continue;
            }
            let g = self.group_rows();
            if n - done >= g {
                let k = self.inner.skip(stage, g, origins)?;
                self.groups += 1;
                done += k;
                if k < g {
                    break;
                }
                continue;
            }
            if !self.fill(stage, origins)? {
                break;
            }
        }
        Ok(done)
    }
}
