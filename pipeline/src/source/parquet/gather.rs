//! Reading one block of a global shuffle (see `global.rs`): the rows its positions name,
//! fetched row group by row group (only the pages holding them), decoded on the CPU pool,
//! and gathered into the permuted order with Arrow's `interleave`.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use arrow::array::{BooleanArray, BooleanBufferBuilder, RecordBatch};
use arrow::error::ArrowError;
use futures::{StreamExt, TryStreamExt};
use parquet::arrow::arrow_reader::{RowSelection, RowSelector};

use super::ParquetFile;
use super::global::Block;
use super::read::{
    DECODE_CHUNK_BYTES, ReadOptions, UnitRead, decode_failure, fetch, open_span, source_batch,
};
use crate::batch::{Batch, Lineage, LineageSpan, Mark, Name, Origin};
use crate::error::{Error, Result};

/// A block's rows sorted for reading: per row group touched, its rows in file order; and for
/// each position in delivery order, where its row lands among the decoded ones.
struct ReadOrder {
    /// (unit, ascending rows within it) per row group touched.
    touched: Vec<(u32, Vec<u64>)>,
    /// (touched index, index among its rows) per delivered position.
    slots: Vec<(usize, usize)>,
}

fn read_order(rows: &[(u32, u64)]) -> ReadOrder {
    let mut order: Vec<u32> = (0..rows.len() as u32).collect();
    order.sort_unstable_by_key(|&i| rows[i as usize]);
    let mut touched: Vec<(u32, Vec<u64>)> = Vec::new();
    let mut slots = vec![(0, 0); rows.len()];
    for i in order {
        let (unit, row) = rows[i as usize];
        if touched.last().is_none_or(|(u, _)| *u != unit) {
            touched.push((unit, Vec::new()));
        }
        let j = touched.len() - 1;
        let list = &mut touched[j].1;
        slots[i as usize] = (j, list.len());
        list.push(row);
    }
    ReadOrder { touched, slots }
}

/// The selection of `rows` (ascending, distinct) of a row group.
fn selection(rows: &[u64]) -> RowSelection {
    let mut sel = Vec::new();
    let mut next = 0u64;
    let mut i = 0;
    while i < rows.len() {
        let mut run = 1;
        while i + run < rows.len() && rows[i + run] == rows[i] + run as u64 {
            run += 1;
        }
        if rows[i] > next {
            sel.push(RowSelector::skip((rows[i] - next) as usize));
        }
        sel.push(RowSelector::select(run));
        next = rows[i] + run as u64;
        i += run;
    }
    RowSelection::from(sel)
}

/// Bytes of row group `rg` read for `rows` (ascending, not empty): the pages holding them,
/// and the pages from the first of them to the last, each from the offset index (every
/// projected column chunk whole without one).
fn pages_bytes(file: &ParquetFile, rg: usize, rows: &[u64]) -> PagesBytes {
    let meta = file.metadata.metadata();
    let index = meta.page_index_for_row_group(rg);
    let chunks = meta.row_group(rg).columns();
    let (first, last) = (rows[0], rows[rows.len() - 1]);
    let mut bytes = PagesBytes::default();
    for (c, chunk) in chunks.iter().enumerate() {
        if !file.mask.leaf_included(c) {
            continue;
        }
        let Some(pages) = index.offset_index(c).map(|o| o.page_locations()) else {
            bytes.touched += chunk.compressed_size().max(0) as u64;
            bytes.spanned += chunk.compressed_size().max(0) as u64;
            continue;
        };
        // The dictionary page, before the first data page, is fetched with any of them.
        let (start, _) = chunk.byte_range();
        let dictionary = pages
            .first()
            .map_or(0, |p| (p.offset.max(0) as u64).saturating_sub(start));
        bytes.touched += dictionary;
        bytes.spanned += dictionary;
        let mut k = 0;
        for (p, page) in pages.iter().enumerate() {
            let begin = page.first_row_index.max(0) as u64;
            let end = pages
                .get(p + 1)
                .map_or(u64::MAX, |n| n.first_row_index.max(0) as u64);
            let size = page.compressed_page_size.max(0) as u64;
            if begin <= last && first < end {
                bytes.spanned += size;
            }
            while k < rows.len() && rows[k] < begin {
                k += 1;
            }
            if k < rows.len() && rows[k] < end {
                bytes.touched += size;
            }
        }
    }
    bytes
}

/// What reading some rows of a row group fetches: only the pages holding them (`touched`),
/// or every page from the first row to the last (`spanned`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct PagesBytes {
    touched: u64,
    spanned: u64,
}

impl PagesBytes {
    /// Whether to decode the whole span and keep the rows asked for, rather than have
    /// arrow-rs's reader skip from one to the next: when skipping pages would save less than
    /// a quarter of the bytes. arrow-rs's reader takes a run of selected rows at a time;
    /// with a block's rows scattered one by one that was 43 % of the tabular global
    /// shuffle's CPU in `memmove` (2026-12-02: 11.9 s for an epoch the window shuffle reads
    /// in 1.4 s), where decoding the span with the window's own reader and filtering it
    /// costs one extra copy of the rows kept.
    fn dense(self) -> bool {
        4 * self.touched >= 3 * self.spanned
    }
}

/// The rows `rows` (ascending, relative to the row group) of the batches `decoder` yields,
/// which start at row `first` (`rows[0]`) and run past the last of them.
fn pick(
    decoder: impl Iterator<Item = std::result::Result<RecordBatch, ArrowError>>,
    rows: &[u64],
    first: u64,
) -> std::result::Result<Vec<RecordBatch>, ArrowError> {
    let mut kept = Vec::new();
    let (mut at, mut k) = (first, 0);
    for rb in decoder {
        let rb = rb?;
        let n = rb.num_rows();
        let end = at + n as u64;
        let mut mask = BooleanBufferBuilder::new(n);
        mask.append_n(n, false);
        let from = k;
        while k < rows.len() && rows[k] < end {
            mask.set_bit((rows[k] - at) as usize, true);
            k += 1;
        }
        at = end;
        if k > from {
            let mask = BooleanArray::new(mask.finish(), None);
            kept.push(arrow::compute::filter_record_batch(&rb, &mask)?);
        }
        if k == rows.len() {
            break;
        }
    }
    Ok(kept)
}

impl UnitRead {
    /// Reads a global shuffle's block from its row `self.first` on and hands them to `out` in delivery order,
    /// in batches of `batch_rows`, a chunk of batches at a time. Returns early (`Ok`) when
    /// `out` is gone.
    pub(super) async fn run_block(
        &self,
        block: &Block,
        out: &tokio::sync::mpsc::Sender<Result<Vec<Batch>>>,
    ) -> Result<()> {
        let (b, from) = (block.clone(), self.first);
        let (rows, order) = self
            .pool
            .run(move || {
                let rows = b.rows(from);
                let order = read_order(&rows);
                (rows, order)
            })
            .await?;
        let plan = &block.plan;
        let origins: Vec<(Origin, u64)> = order
            .touched
            .iter()
            .map(|(u, _)| {
                let unit = plan.unit(*u);
                let origin = Origin::Object {
                    url: Name::from(&*unit.file.object.location.url),
                    row_group: unit.rg as u32,
                };
                (origin, unit.file.row_group_starts[unit.rg])
            })
            .collect();
        let touched = order.touched.len() as u64;
        // Each touched row group: its selected rows fetched and decoded, a few at once.
        let mut fetched = 0u64;
        let mut reads = Vec::with_capacity(order.touched.len());
        for (u, rows) in order.touched {
            let unit = plan.unit(u);
            let bytes = pages_bytes(&unit.file, unit.rg, &rows);
            let dense = bytes.dense();
            fetched += if dense { bytes.spanned } else { bytes.touched };
            reads.push(self.read_rows(unit.file.clone(), unit.rg, rows, dense));
        }
        let threads = self.pool.threads().max(1);
        let decoded: Vec<RecordBatch> = futures::stream::iter(reads)
            .buffered(2 * threads)
            .try_collect()
            .await?;
        let m = &self.metrics.source;
        m.row_groups.fetch_add(touched, Ordering::Relaxed);
        m.bytes_read.fetch_add(fetched, Ordering::Relaxed);
        self.emit(rows, order.slots, decoded, origins, out).await
    }

    /// Rows `rows` (ascending, not empty) of row group `rg` of `file`, decoded as one batch
    /// of the source's schema: `dense`, the span from the first to the last decoded as a
    /// window shuffle reads a row group and the rows filtered out of it (see
    /// [`PagesBytes::dense`]); else only those rows, by arrow-rs's reader.
    async fn read_rows(
        &self,
        file: Arc<ParquetFile>,
        rg: usize,
        rows: Vec<u64>,
        dense: bool,
    ) -> Result<RecordBatch> {
        let url = &file.object.location.url;
        let want = rows.len();
        let (decoded, local) = if dense {
            let first = rows[0];
            let span = (first as usize, (rows[want - 1] - first) as usize + 1);
            // The span's rows are dropped as soon as they are filtered: not worth huge pages.
            let options = ReadOptions {
                huge_lists: false,
                ..self.options
            };
            let (decoder, local) = open_span(&file, rg, span, options, &self.pool).await?;
            let picked = self.pool.run(move || pick(decoder, &rows, first)).await?;
            (picked, local)
        } else {
            let decoder = fetch(&file, rg, Some(selection(&rows)), want, &self.pool).await?;
            let decoded = self
                .pool
                .run(move || decoder.collect::<std::result::Result<Vec<_>, _>>())
                .await?;
            (decoded, None)
        };
        let batches = match decoded {
            Ok(b) => b,
            Err(e) => return Err(decode_failure(&file, rg, local.as_ref(), e, &self.pool).await),
        };
        // One batch of `want` rows (the decoder's batch size); concatenated should it differ.
        let rb = match batches.as_slice() {
            [one] => one.clone(),
            [] => RecordBatch::new_empty(self.schema.clone()),
            [first, ..] => {
                arrow::compute::concat_batches(&first.schema(), &batches).map_err(|e| {
                    Error::Arrow {
                        context: format!("{url}: row group {rg}"),
                        source: e,
                    }
                })?
            }
        };
        if rb.num_rows() != want {
            return Err(Error::parquet(
                url,
                Some(rg),
                parquet::errors::ParquetError::General(format!(
                    "decoded {} of the {want} selected rows",
                    rb.num_rows()
                )),
            ));
        }
        source_batch(&file, rg, &rb, &self.schema)
    }

    /// Gathers the decoded rows into delivery order and sends them, counting the rows and
    /// bytes handed over.
    async fn emit(
        &self,
        rows: Vec<(u32, u64)>,
        slots: Vec<(usize, usize)>,
        decoded: Vec<RecordBatch>,
        origins: Vec<(Origin, u64)>,
        out: &tokio::sync::mpsc::Sender<Result<Vec<Batch>>>,
    ) -> Result<()> {
        let shared = Arc::new((rows, slots, decoded, origins));
        let n = shared.0.len();
        let mut at = 0usize;
        while at < n {
            let (s, batch_rows, epoch) = (shared.clone(), self.options.batch_rows, self.epoch);
            let (index, first) = (self.index, self.first);
            let (chunk, size) = self
                .pool
                .run(move || -> Result<(Vec<Batch>, u64)> {
                    let (rows, slots, decoded, origins) = &*s;
                    let refs: Vec<&RecordBatch> = decoded.iter().collect();
                    let (mut chunk, mut size, mut i) = (Vec::new(), 0usize, at);
                    while i < rows.len() && size < DECODE_CHUNK_BYTES {
                        let end = (i + batch_rows).min(rows.len());
                        let rb = arrow::compute::interleave_record_batch(&refs, &slots[i..end])
                            .map_err(|e| Error::Arrow {
                                context: "gathering a global shuffle's block".into(),
                                source: e,
                            })?;
                        let mut lineage = Lineage::default();
                        for (k, (_, row)) in rows[i..end].iter().enumerate() {
                            let (origin, start) = origins[slots[i + k].0];
                            lineage.push(LineageSpan {
                                origin,
                                first: start + row,
                                len: 1,
                                epoch,
                            });
                        }
                        size += crate::batch::data_bytes(&rb);
                        let mark = Mark {
                            epoch,
                            unit: index,
                            row: first + i as u64,
                            skip: 0,
                            shuffle: None,
                        };
                        chunk.push(Batch::new(rb, lineage).with_mark(Some(mark)));
                        i = end;
                    }
                    Ok((chunk, size as u64))
                })
                .await??;
            let sent = chunk.iter().map(|b| b.num_rows()).sum::<usize>();
            if out.send(Ok(chunk)).await.is_err() {
                break;
            }
            at += sent;
            let m = &self.metrics.source;
            m.rows.fetch_add(sent as u64, Ordering::Relaxed);
            m.bytes_decoded.fetch_add(size, Ordering::Relaxed);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_read_in_file_order_and_land_where_they_were_asked_for() {
        let rows = vec![(2, 5), (0, 9), (2, 1), (0, 3), (1, 0)];
        let o = read_order(&rows);
        assert_eq!(
            o.touched,
            vec![(0, vec![3, 9]), (1, vec![0]), (2, vec![1, 5])]
        );
        assert_eq!(o.slots, vec![(2, 1), (0, 1), (2, 0), (0, 0), (1, 0)]);
    }

    /// `pick` keeps exactly the rows asked for, from batches that split the span anywhere,
    /// and stops at the last; a decode error is passed on.
    #[test]
    fn the_rows_asked_for_are_picked_out_of_the_span() {
        use arrow::array::{Array, Int64Array};
        let batch = |from: i64, n: i64| {
            let ids = Int64Array::from((from..from + n).collect::<Vec<_>>());
            RecordBatch::try_from_iter([("id", Arc::new(ids) as _)]).unwrap()
        };
        let rows = [10u64, 11, 14, 20, 29, 30];
        // The span starts at row 10; batches of 7, then 3, then 20 (past the last row).
        let decoded = [batch(10, 7), batch(17, 3), batch(20, 20)].map(Ok);
        let picked = pick(decoded.into_iter(), &rows, 10).unwrap();
        let ids: Vec<i64> = (picked.iter())
            .flat_map(|rb| {
                let ids = rb.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
                ids.values().to_vec()
            })
            .collect();
        assert_eq!(ids, vec![10, 11, 14, 20, 29, 30]);
        // The batch of 3 holds none of them: no empty batch is kept.
        assert_eq!(picked.len(), 2);
        let failing = [
            Ok(batch(10, 7)),
            Err(ArrowError::ComputeError("bad page".into())),
        ];
        assert!(pick(failing.into_iter(), &rows, 10).is_err());
        // Stops at the last row: what follows is not decoded.
        let after = [
            Ok(batch(10, 25)),
            Err(ArrowError::ComputeError("unread".into())),
        ];
        assert_eq!(pick(after.into_iter(), &[12], 10).unwrap()[0].num_rows(), 1);
    }

    /// The span is decoded whole when skipping pages would save less than a quarter.
    #[test]
    fn a_span_is_decoded_whole_when_most_of_its_pages_are_touched() {
        let dense = |touched, spanned| PagesBytes { touched, spanned }.dense();
        assert!(dense(100, 100));
        assert!(dense(75, 100));
        assert!(!dense(74, 100));
        assert!(!dense(1, 100));
    }

    #[test]
    fn a_selection_takes_exactly_the_rows() {
        let sel = selection(&[0, 1, 2, 7, 9, 10]);
        let want: Vec<RowSelector> = vec![
            RowSelector::select(3),
            RowSelector::skip(4),
            RowSelector::select(1),
            RowSelector::skip(1),
            RowSelector::select(2),
        ];
        assert_eq!(sel, RowSelection::from(want));
        assert_eq!(
            selection(&[4]),
            RowSelection::from(vec![RowSelector::skip(4), RowSelector::select(1)])
        );
    }
}
