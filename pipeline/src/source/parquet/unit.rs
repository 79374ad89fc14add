//! The unit of reading (rows of one row group) and the sequences of them an epoch's plan is
//! made of.

use std::sync::Arc;

use super::ParquetFile;
use crate::batch::Mark;

/// Rows `start..start+len` of one row group: the unit of reading.
#[derive(Debug, Clone)]
pub(crate) struct Unit {
    pub(super) file: Arc<ParquetFile>,
    pub(super) rg: usize,
    pub(super) start: u64,
    pub(super) len: u64,
}

impl Unit {
    fn cut(&self, offset: u64, len: u64) -> Unit {
        Unit {
            file: self.file.clone(),
            rg: self.rg,
            start: self.start + offset,
            len,
        }
    }
}

/// Every row group of a file, whole.
pub(super) fn row_groups(f: &Arc<ParquetFile>) -> Vec<Unit> {
    let meta = f.metadata.metadata();
    (0..meta.num_row_groups())
        .map(|rg| Unit {
            file: f.clone(),
            rg,
            start: 0,
            len: meta.row_group(rg).num_rows() as u64,
        })
        .collect()
}

/// Rows `from..from+want` of the sequence `units`, as units.
pub(super) fn take_rows(units: &[Unit], mut from: u64, mut want: u64, out: &mut Vec<Unit>) {
    for u in units {
        if want == 0 {
            break;
        }
        if from >= u.len {
            from -= u.len;
            continue;
        }
        let n = (u.len - from).min(want);
        out.push(u.cut(from, n));
        want -= n;
        from = 0;
    }
}

/// Rows of an epoch's plan (`units`) before the restart point of `m` (which is in it).
pub(super) fn rows_before(units: impl Iterator<Item = Unit>, m: &Mark) -> u64 {
    units.take(m.unit as usize).map(|u| u.len).sum::<u64>() + m.row
}
