//! The data unit: an Arrow [`RecordBatch`] plus the lineage of every row.

use std::fmt;

use arrow::array::{Array, AsArray, BooleanArray, RecordBatch};
use serde::{Deserialize, Serialize};

use crate::state::position::KafkaMark;

/// An interned string (an object URL, a topic): copied as a pointer, without a reference
/// count, and compared by address. Lineage clones an origin for every span, and after a
/// shuffle every row is a span of its own: with `Arc<str>` each clone and drop was an atomic
/// update of a counter that all CPU threads shared (measured on the tabular bench, 2M rows:
/// ~5 % of the CPU time in `Lineage::slice`, `Lineage::push` and `Batch` drops, nearly all
/// of it on the `lock` instructions). Each distinct string is kept for the life of the
/// process: one per object and topic read.
pub type Name = internment::Intern<str>;

/// Where a run of rows came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Origin {
    /// Rows of one row group of an object (Parquet file); `row` positions count from the
    /// start of the object, not of the row group.
    Object {
        /// The object's URL (`file:///…`, `s3://…`).
        url: Name,
        /// Row group index within the object.
        row_group: u32,
    },
    /// Records of one Kafka partition, one row per message; positions are offsets.
    Kafka {
        /// Topic.
        topic: Name,
        /// Partition.
        partition: i32,
    },
    /// Rows of one Kafka message that holds many (an Arrow IPC message); positions are row
    /// indices within the message.
    KafkaMessage {
        /// Topic.
        topic: Name,
        /// Partition.
        partition: i32,
        /// The message's offset.
        offset: i64,
        /// Rows the message holds.
        rows: u64,
    },
}

impl Origin {
    /// What positions of this origin count: `row` or `offset`.
    pub fn unit(&self) -> &'static str {
        match self {
            Origin::Kafka { .. } => "offset",
            Origin::Object { .. } | Origin::KafkaMessage { .. } => "row",
        }
    }
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Object { url, row_group } => write!(f, "{url} row group {row_group}"),
            Origin::Kafka { topic, partition } => write!(f, "kafka {topic}/{partition}"),
            Origin::KafkaMessage {
                topic,
                partition,
                offset,
                ..
            } => write!(f, "kafka {topic}/{partition} offset {offset}"),
        }
    }
}

/// A contiguous run of rows from one origin, in one epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LineageSpan {
    /// Where the rows came from.
    pub origin: Origin,
    /// Position of the first row (row index within the object for [`Origin::Object`]).
    pub first: u64,
    /// Number of consecutive rows.
    pub len: u64,
    /// Epoch the rows were read in (0-based).
    pub epoch: u64,
}

impl LineageSpan {
    fn follows(&self, prev: &LineageSpan) -> bool {
        self.origin == prev.origin
            && self.epoch == prev.epoch
            && prev.first + prev.len == self.first
    }
}

/// The lineage of a batch: its rows are, in order, the concatenation of these spans.
///
/// Kept as run-length ranges, not per-row records: a batch read from a file has one span, a
/// re-batched one a few, a filtered one one per surviving run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lineage {
    spans: Vec<LineageSpan>,
}

impl Lineage {
    /// Lineage of `len` consecutive rows from one origin.
    pub fn new(origin: Origin, first: u64, len: u64, epoch: u64) -> Self {
        let mut l = Lineage::default();
        l.push(LineageSpan {
            origin,
            first,
            len,
            epoch,
        });
        l
    }

    /// The spans, in row order.
    pub fn spans(&self) -> &[LineageSpan] {
        &self.spans
    }

    /// Total rows covered.
    pub fn num_rows(&self) -> u64 {
        self.spans.iter().map(|s| s.len).sum()
    }

    /// An empty lineage with room for `spans` spans.
    pub fn with_capacity(spans: usize) -> Self {
        Lineage {
            spans: Vec::with_capacity(spans),
        }
    }

    /// Appends a span, merging it into the last one when it continues it.
    pub fn push(&mut self, span: LineageSpan) {
        if span.len == 0 {
            return;
        }
        if let Some(last) = self.spans.last_mut()
            && span.follows(last)
        {
            last.len += span.len;
            return;
        }
        self.spans.push(span);
    }

    /// Appends all spans of `other`.
    pub fn extend(&mut self, other: &Lineage) {
        for s in &other.spans {
            self.push(*s);
        }
    }

    /// Lineage of rows `offset..offset+len` of this batch.
    pub fn slice(&self, offset: u64, len: u64) -> Lineage {
        self.cut(offset, &[len]).pop().unwrap_or_default()
    }

    /// Lineages of consecutive pieces of `size` rows (the last one shorter).
    pub fn split(&self, size: u64) -> Vec<Lineage> {
        let n = self.num_rows();
        let size = size.max(1);
        let lens: Vec<u64> = (0..n.div_ceil(size))
            .map(|i| size.min(n - i * size))
            .collect();
        self.cut(0, &lens)
    }

    /// Lineages of consecutive runs of rows: `lens[0]` rows from `offset`, then `lens[1]`
    /// rows, and so on; one pass over the spans, each copied once (a span a boundary cuts, into
    /// both pieces). Spans wholly inside a piece are copied as they are, without `push`'s
    /// merge test: no span of a lineage continues the one before it (`push` merged those), and
    /// trimming the first span's start or the last one's end keeps that so. After a shuffle
    /// every row is a span of its own; slicing batches off one at a time, each time copying
    /// the rest, was quadratic (shuffle batches of 65,536 rows cut into batches of 256: 1.7×
    /// the CPU of batches of 4,096).
    fn cut(&self, offset: u64, lens: &[u64]) -> Vec<Lineage> {
        let spans = &self.spans;
        let (mut i, mut at) = (0usize, offset);
        while i < spans.len() && at >= spans[i].len {
            at -= spans[i].len;
            i += 1;
        }
        let mut out = Vec::with_capacity(lens.len());
        for &len in lens {
            let most = (spans.len() - i).min(usize::try_from(len).unwrap_or(usize::MAX));
            let mut piece = Lineage::with_capacity(most);
            let mut want = len;
            while want > 0 && i < spans.len() {
                let s = &spans[i];
                if at == 0 && s.len <= want {
                    // A run of whole spans.
                    let mut j = i;
                    while j < spans.len() && spans[j].len <= want {
                        want -= spans[j].len;
                        j += 1;
                    }
                    piece.spans.extend_from_slice(&spans[i..j]);
                    i = j;
                    continue;
                }
                let take = (s.len - at).min(want);
                piece.spans.push(LineageSpan {
                    first: s.first + at,
                    len: take,
                    ..*s
                });
                want -= take;
                at += take;
                if at == s.len {
                    (i, at) = (i + 1, 0);
                }
            }
            out.push(piece);
        }
        out
    }

    /// Lineage of the rows kept by `mask` (nulls count as not kept, as in Arrow's `filter`).
    pub fn filter(&self, mask: &BooleanArray) -> Lineage {
        let values = match mask.nulls() {
            Some(nulls) => &(mask.values() & nulls.inner()),
            None => mask.values(),
        };
        // The runs kept and the gaps before them, cut in one pass (a slice per run scanned
        // the spans from the start each time: quadratic for a filter after a shuffle).
        let mut lens = Vec::new();
        let mut at = 0;
        for (start, end) in values.set_slices() {
            lens.extend([(start - at) as u64, (end - start) as u64]);
            at = end;
        }
        let mut out = Lineage::default();
        for kept in self.cut(0, &lens).iter().skip(1).step_by(2) {
            out.extend(kept);
        }
        out
    }

    /// Describes row `index` of the batch, e.g. `file:///d/a.parquet row group 0, row 17 (epoch 0)`.
    pub fn describe_row(&self, index: u64) -> String {
        let one = self.slice(index, 1);
        match one.spans.first() {
            Some(s) => format!(
                "{}, {} {} (epoch {})",
                s.origin,
                s.origin.unit(),
                s.first,
                s.epoch
            ),
            None => format!("row {index} of the batch (no lineage)"),
        }
    }
}

impl fmt::Display for Lineage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, s) in self.spans.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(
                f,
                "{}, {}s {}..{} (epoch {})",
                s.origin,
                s.origin.unit(),
                s.first,
                s.first + s.len,
                s.epoch
            )?;
        }
        Ok(())
    }
}

/// A point in a Parquet pipeline's row stream from which a run can be continued exactly: the
/// source restarts at `(epoch, unit, row)` (a batch boundary of the source), `skip` rows of
/// the stream (counted after any `filter`) are passed over, and, past a `shuffle` stage,
/// `shuffle` says which window was being emitted and how much of it.
///
/// Every batch of a Parquet pipeline carries the mark of its first row; the mark after a batch
/// is [`Mark::advance`]d by its row count. That is what `SourceState` (module `state`) stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mark {
    /// Epoch (0-based).
    pub epoch: u64,
    /// Index of the unit (a row group, or part of one) in this rank's plan for the epoch.
    pub unit: u64,
    /// Row within the unit where the source restarts.
    pub row: u64,
    /// Rows of the stream from that restart point to this position (before a shuffle: to the
    /// start of the shuffle window).
    #[serde(default)]
    pub skip: u64,
    /// Set past a `shuffle` stage: the window being emitted and the rows of it already out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shuffle: Option<ShuffleMark>,
}

/// Position inside a shuffle stage's output (see [`Mark`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShuffleMark {
    /// Window index within the epoch.
    pub window: u64,
    /// Rows of the window's (permuted) output before this position.
    pub emitted: u64,
}

impl Mark {
    /// The first row of `epoch`.
    pub fn start_of(epoch: u64) -> Mark {
        Mark {
            epoch,
            unit: 0,
            row: 0,
            skip: 0,
            shuffle: None,
        }
    }

    /// Whether this is the first row of its epoch (a position that no plan moves).
    pub fn is_epoch_start(&self) -> bool {
        *self == Mark::start_of(self.epoch)
    }

    /// The mark `rows` rows further along the stream.
    pub fn advance(mut self, rows: u64) -> Mark {
        match &mut self.shuffle {
            Some(s) => s.emitted += rows,
            None => self.skip += rows,
        }
        self
    }
}

/// An Arrow record batch and the origin of each of its rows.
#[derive(Debug, Clone)]
pub struct Batch {
    /// The rows.
    pub data: RecordBatch,
    /// Where each row came from; `lineage.num_rows() == data.num_rows()`.
    pub lineage: Lineage,
    /// Resumable position of the first row (Parquet sources; `None` for Kafka, whose
    /// positions come from lineage).
    pub mark: Option<Mark>,
    /// Past a shuffle of a Kafka stream: the window and position of the first row.
    pub kafka_mark: Option<KafkaMark>,
    /// Rows a stage after the last `shuffle`/`batch` removed from this batch (a `filter`, an
    /// `image` stage skipping bad rows): the batch stands for `num_rows() + dropped` rows of
    /// the stream its marks count, so the position past it is past those rows too (read
    /// again on resume, they are removed again).
    pub dropped: u64,
}

impl Batch {
    /// Pairs data with its lineage.
    pub fn new(data: RecordBatch, lineage: Lineage) -> Self {
        debug_assert_eq!(lineage.num_rows(), data.num_rows() as u64);
        Batch {
            data,
            lineage,
            mark: None,
            kafka_mark: None,
            dropped: 0,
        }
    }

    /// The same rows with new column data (a map stage's output): lineage and mark are kept.
    pub fn with_data(self, data: RecordBatch) -> Self {
        debug_assert_eq!(self.lineage.num_rows(), data.num_rows() as u64);
        Batch { data, ..self }
    }

    /// Sets the mark of the first row.
    pub fn with_mark(mut self, mark: Option<Mark>) -> Self {
        self.mark = mark;
        self
    }

    /// Takes the position of `other`'s first row (both marks): for a batch made from
    /// `other`'s rows, in order. (`dropped` is the map chain's to set: see `apply_chain`.)
    pub fn with_position_of(mut self, other: &Batch) -> Self {
        self.mark = other.mark;
        self.kafka_mark = other.kafka_mark.clone();
        self
    }

    /// Rows of the stream this batch stands for: its own and those removed from it.
    pub fn stream_rows(&self) -> u64 {
        self.num_rows() as u64 + self.dropped
    }

    /// The mark just past this batch's last row (and the removed rows after it).
    pub fn end_mark(&self) -> Option<Mark> {
        self.mark.map(|m| m.advance(self.stream_rows()))
    }

    /// Number of rows.
    pub fn num_rows(&self) -> usize {
        self.data.num_rows()
    }

    /// Bytes of Arrow memory this batch's rows occupy (what queue budgets count). For a
    /// zero-copy slice this is the slice's share, not the whole shared buffer; for a view
    /// array (a shuffle's window handed on without copying) the views plus the bytes they
    /// point at, not every buffer they point into (the window is the shuffle's memory).
    pub fn memory_size(&self) -> usize {
        data_bytes(&self.data)
    }

    /// Zero-copy slice of rows `offset..offset+len`.
    pub fn slice(&self, offset: usize, len: usize) -> Batch {
        self.piece(offset, len, self.lineage.slice(offset as u64, len as u64))
    }

    /// The batch cut into consecutive zero-copy slices of `size` rows (the last one shorter),
    /// its lineage walked once ([`Lineage::split`]); a batch of at most `size` rows is itself.
    pub fn split(self, size: usize) -> Vec<Batch> {
        let size = size.max(1);
        if self.num_rows() <= size {
            return vec![self];
        }
        let n = self.num_rows();
        let lineages = self.lineage.split(size as u64);
        lineages
            .into_iter()
            .enumerate()
            .map(|(i, lineage)| self.piece(i * size, size.min(n - i * size), lineage))
            .collect()
    }

    /// Rows `offset..offset+len` with their lineage.
    fn piece(&self, offset: usize, len: usize, lineage: Lineage) -> Batch {
        // Rows are removed only after the last stage that cuts batches (checked when the
        // pipeline is built), so a batch with removed rows is never cut.
        debug_assert_eq!(self.dropped, 0, "a batch with removed rows cut");
        Batch {
            dropped: 0,
            data: self.data.slice(offset, len),
            lineage,
            mark: self.mark.map(|m| m.advance(offset as u64)),
            kafka_mark: self.kafka_mark.as_ref().map(|k| KafkaMark {
                window: k.window.clone(),
                emitted: k.emitted + offset as u64,
            }),
        }
    }
}

/// 16 bytes per view, the bytes of values too long to sit in their view, the null bitmap.
fn view_bytes(views: &[u128], nulls: Option<&arrow::buffer::NullBuffer>) -> usize {
    let outside: usize = views
        .iter()
        .map(|v| *v as u32 as usize)
        .filter(|len| *len > 12)
        .sum();
    views.len() * 16 + outside + nulls.map_or(0, |_| views.len().div_ceil(8))
}

/// [`Batch::memory_size`] of a bare record batch.
pub(crate) fn data_bytes(data: &RecordBatch) -> usize {
    data.columns()
        .iter()
        .map(|c| {
            if let Some(v) = c.as_binary_view_opt() {
                return view_bytes(v.views(), v.nulls());
            }
            if let Some(v) = c.as_string_view_opt() {
                return view_bytes(v.views(), v.nulls());
            }
            c.to_data()
                .get_slice_memory_size()
                .unwrap_or_else(|_| c.get_array_memory_size())
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn origin(rg: u32) -> Origin {
        Origin::Object {
            url: Name::from("file:///x.parquet"),
            row_group: rg,
        }
    }

    #[test]
    fn memory_size_counts_only_the_slice() {
        use arrow::array::Int64Array;
        let data = RecordBatch::try_from_iter([(
            "x",
            Arc::new(Int64Array::from_iter_values(0..1000)) as _,
        )])
        .unwrap();
        let b = Batch::new(data, Lineage::new(origin(0), 0, 1000, 0));
        assert_eq!(b.memory_size(), 8000);
        assert_eq!(b.slice(10, 100).memory_size(), 800);
    }

    #[test]
    fn memory_size_of_views_counts_the_bytes_they_point_at() {
        use arrow::array::BinaryViewArray;
        // 1000 values of 100 bytes in one buffer, and 10 short ones stored in their views.
        let long: Vec<Vec<u8>> = (0..1000).map(|i| vec![i as u8; 100]).collect();
        let arr = BinaryViewArray::from_iter_values(long.iter().map(|v| v.as_slice()));
        let short = BinaryViewArray::from_iter_values((0..10u8).map(|i| vec![i; 12]));
        let data = RecordBatch::try_from_iter([("x", Arc::new(arr) as _)]).unwrap();
        let b = Batch::new(data, Lineage::new(origin(0), 0, 1000, 0));
        assert_eq!(b.memory_size(), 1000 * (16 + 100));
        // A slice still points into the whole buffer; it counts only its own values.
        assert_eq!(b.slice(0, 10).memory_size(), 10 * (16 + 100));
        let data = RecordBatch::try_from_iter([("x", Arc::new(short) as _)]).unwrap();
        let b = Batch::new(data, Lineage::new(origin(0), 0, 10, 0));
        assert_eq!(b.memory_size(), 10 * 16);
    }

    #[test]
    fn push_merges_contiguous_spans() {
        let mut l = Lineage::new(origin(0), 0, 10, 0);
        l.push(LineageSpan {
            origin: origin(0),
            first: 10,
            len: 5,
            epoch: 0,
        });
        l.push(LineageSpan {
            origin: origin(1),
            first: 15,
            len: 5,
            epoch: 0,
        });
        assert_eq!(l.spans().len(), 2);
        assert_eq!(l.num_rows(), 20);
    }

    #[test]
    fn slice_crosses_spans() {
        let mut l = Lineage::new(origin(0), 0, 10, 0);
        l.push(LineageSpan {
            origin: origin(1),
            first: 10,
            len: 10,
            epoch: 0,
        });
        let s = l.slice(8, 4);
        assert_eq!(s.num_rows(), 4);
        assert_eq!(s.spans()[0].first, 8);
        assert_eq!(s.spans()[1].first, 10);
        assert_eq!(s.spans()[1].len, 2);
    }

    /// The slice as `push` builds it, span by span (what `cut` must equal).
    fn pushed_slice(l: &Lineage, offset: u64, len: u64) -> Lineage {
        let mut out = Lineage::default();
        let (mut skip, mut want) = (offset, len);
        for s in l.spans() {
            if want == 0 {
                break;
            }
            if skip >= s.len {
                skip -= s.len;
                continue;
            }
            let take = (s.len - skip).min(want);
            out.push(LineageSpan {
                first: s.first + skip,
                len: take,
                ..*s
            });
            (want, skip) = (want - take, 0);
        }
        out
    }

    #[test]
    fn split_and_slice_equal_slicing_span_by_span() {
        // Runs of rows and rows of their own (a shuffle's output), from two row groups.
        let mut l = Lineage::default();
        let mut first = 0;
        for (k, len) in [3u64, 1, 1, 4, 1, 2, 1, 1, 1, 5, 1, 2]
            .into_iter()
            .enumerate()
        {
            l.push(LineageSpan {
                origin: origin(k as u32 % 2),
                first,
                len,
                epoch: 0,
            });
            first += len + 1;
        }
        let n = l.num_rows();
        assert_eq!(n, 23);
        for offset in 0..=n {
            for len in 0..=n - offset {
                assert_eq!(l.slice(offset, len), pushed_slice(&l, offset, len));
            }
        }
        for size in 1..=n + 1 {
            let pieces = l.split(size);
            assert_eq!(pieces.len() as u64, n.div_ceil(size));
            for (i, p) in pieces.iter().enumerate() {
                let offset = i as u64 * size;
                assert_eq!(*p, pushed_slice(&l, offset, size.min(n - offset)), "{size}");
            }
        }
    }

    #[test]
    fn filter_of_rows_of_their_own_equals_slicing_each_run() {
        let mut l = Lineage::default();
        for r in 0..40u64 {
            l.push(LineageSpan {
                origin: origin(0),
                first: 1000 - r,
                len: 1,
                epoch: 0,
            });
        }
        let keep: Vec<Option<bool>> = (0..40)
            .map(|i| match i % 7 {
                0 => None,
                1 | 4 => Some(false),
                _ => Some(true),
            })
            .collect();
        let mut want = Lineage::default();
        for (i, k) in keep.iter().enumerate() {
            if *k == Some(true) {
                want.extend(&pushed_slice(&l, i as u64, 1));
            }
        }
        assert_eq!(l.filter(&BooleanArray::from(keep)), want);
    }

    #[test]
    fn a_split_batch_keeps_its_rows_and_marks() {
        use arrow::array::Int64Array;
        let data =
            RecordBatch::try_from_iter([("x", Arc::new(Int64Array::from_iter_values(0..10)) as _)])
                .unwrap();
        let b = Batch::new(data, Lineage::new(origin(0), 100, 10, 0))
            .with_mark(Some(Mark::start_of(0)));
        let pieces = b.clone().split(4);
        assert_eq!(pieces.len(), 3);
        for (i, p) in pieces.iter().enumerate() {
            let want = b.slice(4 * i, p.num_rows());
            assert_eq!(p.data, want.data);
            assert_eq!(p.lineage, want.lineage);
            assert_eq!(p.mark, want.mark);
        }
        assert_eq!(
            pieces.iter().map(Batch::num_rows).collect::<Vec<_>>(),
            [4, 4, 2]
        );
        assert_eq!(b.clone().split(10).len(), 1);
    }

    #[test]
    fn filter_keeps_runs_and_treats_null_as_false() {
        let l = Lineage::new(origin(0), 100, 6, 2);
        let mask = BooleanArray::from(vec![
            Some(true),
            Some(true),
            None,
            Some(false),
            Some(true),
            Some(true),
        ]);
        let f = l.filter(&mask);
        assert_eq!(f.num_rows(), 4);
        assert_eq!(f.spans().len(), 2);
        assert_eq!((f.spans()[0].first, f.spans()[0].len), (100, 2));
        assert_eq!((f.spans()[1].first, f.spans()[1].len), (104, 2));
        assert_eq!(
            f.describe_row(2),
            "file:///x.parquet row group 0, row 104 (epoch 2)"
        );
    }
}
