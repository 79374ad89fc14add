//! Fixed-size list columns (embeddings, feature vectors: `fixed_size_list<float32>[128]`)
//! decoded without arrow-rs's walk over their levels.
//!
//! Why by hand: arrow-rs's `FixedSizeListArrayReader` checks, value by value and with a
//! branch per value, that every list has its size: 13 % of the CPU time of the tabular bench
//! (2M × 128 float32), more than any other part of the decode but zstd. Here such a column
//! is read page by page ([`super::list_column`]: pages of full lists whole, their levels
//! checked run by run, other pages by parquet's own column reader), and its values become
//! the list's child in one copy. The other columns are read by arrow-rs's reader as before,
//! and each batch is put together in the file's column order.
//!
//! Only lists without nulls take this path: at the first batch whose levels are anything
//! else (a null list or value, a list of another size, bytes that do not decode as the
//! pattern), the row group is read from that batch's first row on by arrow-rs's reader
//! alone, which builds nulls and reports errors as it always does.

use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch};
use arrow::datatypes::{DataType, FieldRef, Schema, SchemaRef};
use arrow::error::ArrowError;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder, RowSelection,
    RowSelector,
};
use parquet::file::serialized_reader::SerializedPageReader;

use super::fixed::BinaryColumn;
use super::list_column::ListColumn;
use crate::source::reader::Chunks;

/// The decoder of one row group: arrow-rs's reader, or this module's when the projection has
/// fixed-size list columns.
pub(super) enum UnitDecoder {
    Arrow(ParquetRecordBatchReader),
    Lists(Box<ListDecoder>),
}

impl Iterator for UnitDecoder {
    type Item = Result<RecordBatch, ArrowError>;

    fn next(&mut self) -> Option<Self::Item> {
        match self {
            UnitDecoder::Arrow(d) => d.next(),
            UnitDecoder::Lists(d) => d.next(),
        }
    }
}

/// What a row group's decoder reads: rows `skip..skip + take` of row group `rg`, the
/// projection `mask`, `batch_rows` rows per batch.
#[derive(Clone)]
pub(super) struct Rows {
    pub(super) chunks: Chunks,
    pub(super) metadata: ArrowReaderMetadata,
    pub(super) mask: ProjectionMask,
    pub(super) rg: usize,
    pub(super) skip: usize,
    pub(super) take: usize,
    pub(super) batch_rows: usize,
    /// Fixed-size list values in huge pages (`runtime::huge`): a window shuffle gathers them
    /// at random next.
    pub(super) huge_lists: bool,
}

impl Rows {
    /// arrow-rs's reader of these rows from row `from` (counted from `skip`) on, every
    /// projected column.
    fn arrow(
        &self,
        from: usize,
        mask: ProjectionMask,
    ) -> parquet::errors::Result<ParquetRecordBatchReader> {
        let mut builder = ParquetRecordBatchReaderBuilder::new_with_metadata(
            self.chunks.clone(),
            self.metadata.clone(),
        )
        .with_projection(mask)
        .with_row_groups(vec![self.rg])
        .with_batch_size(self.batch_rows);
        let rows = self.metadata.metadata().row_group(self.rg).num_rows() as usize;
        if let Some(selection) = span_selection(self.skip + from, self.take - from, rows) {
            builder = builder.with_row_selection(selection);
        }
        builder.build()
    }

    /// The decoder of these rows: this module's when a projected column is a fixed-size list
    /// of float or integer values, else arrow-rs's.
    pub(super) fn decoder(self) -> parquet::errors::Result<UnitDecoder> {
        let descr = self.metadata.metadata().file_metadata().schema_descr_ptr();
        let fields = self.metadata.schema().fields().clone();
        let roots = projected_roots(&self.metadata, &self.mask);
        if roots.iter().all(|(_, leaf)| leaf.is_none()) || !whole_roots(&descr, &self.mask) {
            return Ok(UnitDecoder::Arrow(self.arrow(0, self.mask.clone())?));
        }
        let rest: Vec<usize> = roots
            .iter()
            .filter(|r| r.1.is_none())
            .map(|r| r.0)
            .collect();
        let rest = if rest.is_empty() {
            None
        } else {
            Some(self.arrow(0, ProjectionMask::roots(&descr, rest))?)
        };
        let meta = self.metadata.metadata().row_group(self.rg);
        let mut lists = Vec::new();
        let mut order = Vec::new();
        let mut schema = Vec::new();
        for (root, leaf) in &roots {
            let field = fields[*root].clone();
            schema.push(field.clone());
            let Some(leaf) = *leaf else {
                order.push(None);
                continue;
            };
            let pages = SerializedPageReader::new(
                Arc::new(self.chunks.clone()),
                meta.column(leaf),
                meta.num_rows() as usize,
                None,
            )?;
            let column = descr.column(leaf);
            if let DataType::FixedSizeBinary(_) = field.data_type() {
                let local = matches!(self.chunks, Chunks::Local(_));
                let binary = BinaryColumn::new(column, Box::new(pages), local, self.skip);
                order.push(Some(lists.len()));
                lists.push(Column::Binary(binary));
                continue;
            }
            let (item, size) = match field.data_type() {
                DataType::FixedSizeList(item, size) => (item.clone(), *size as usize),
                _ => unreachable!("checked by read_here"),
            };
            let list = ListColumn::new(column, Box::new(pages), item, size, self.skip)
                .in_huge_pages(self.huge_lists);
            order.push(Some(lists.len()));
            lists.push(Column::List(list));
        }
        Ok(UnitDecoder::Lists(Box::new(ListDecoder {
            schema: Arc::new(Schema::new(schema)),
            rest,
            lists,
            order,
            emitted: 0,
            rows: self,
            slow: None,
            pending: std::collections::VecDeque::new(),
        })))
    }
}

/// The selection of rows `skip..skip + take` of a row group of `rows`; `None` for all of them.
pub(super) fn span_selection(skip: usize, take: usize, rows: usize) -> Option<RowSelection> {
    (skip > 0 || take < rows).then(|| {
        let mut selection = Vec::new();
        if skip > 0 {
            selection.push(RowSelector::skip(skip));
        }
        selection.push(RowSelector::select(take));
        RowSelection::from(selection)
    })
}

/// Each projected root column, in file order, with its one leaf when it is a fixed-size list
/// of values this module reads.
fn projected_roots(
    metadata: &ArrowReaderMetadata,
    mask: &ProjectionMask,
) -> Vec<(usize, Option<usize>)> {
    let descr = metadata.metadata().file_metadata().schema_descr_ptr();
    let fields = metadata.schema().fields();
    let mut roots: Vec<(usize, Option<usize>)> = Vec::new();
    for leaf in (0..descr.num_columns()).filter(|&l| mask.leaf_included(l)) {
        let root = descr.get_column_root_idx(leaf);
        if let Some(last) = roots.last_mut()
            && last.0 == root
        {
            last.1 = None; // more than one leaf: not a list of values
            continue;
        }
        let column = descr.column(leaf);
        let here = (fields.get(root)).is_some_and(|f| read_here(f, &column));
        roots.push((root, here.then_some(leaf)));
    }
    roots
}

/// Whether `mask` takes every leaf of each root it takes any of (a mask of roots, as the
/// source builds): the other columns are read by a mask of their roots, in the fields
/// arrow-rs gives whole roots. A struct read in part goes to arrow-rs's reader alone.
fn whole_roots(descr: &parquet::schema::types::SchemaDescriptor, mask: &ProjectionMask) -> bool {
    let mut taken = vec![None::<bool>; descr.root_schema().get_fields().len()];
    for leaf in 0..descr.num_columns() {
        let root = &mut taken[descr.get_column_root_idx(leaf)];
        let included = mask.leaf_included(leaf);
        if root.is_some_and(|all| all != included) {
            return false;
        }
        *root = Some(included);
    }
    true
}

/// Whether `mask` projects a fixed-size list column this module reads.
pub(super) fn has_lists(metadata: &ArrowReaderMetadata, mask: &ProjectionMask) -> bool {
    projected_roots(metadata, mask)
        .iter()
        .any(|(_, leaf)| leaf.is_some())
}

/// Whether root `field`, stored as `column`, is read here: a fixed-size list of values
/// (`list_of`) one level deep, or a fixed-size binary column at the top level
/// ([`super::fixed`]).
fn read_here(field: &FieldRef, column: &parquet::schema::types::ColumnDescriptor) -> bool {
    match field.data_type() {
        DataType::FixedSizeBinary(size) => {
            *size > 0
                && column.physical_type() == parquet::basic::Type::FIXED_LEN_BYTE_ARRAY
                && column.type_length() == *size
                && column.max_rep_level() == 0
        }
        _ => list_of(field, column.physical_type()).is_some() && column.max_rep_level() == 1,
    }
}

/// The list's item type when `field` is a fixed-size list of values this module reads
/// (stored as `physical`), else `None`.
fn list_of(field: &FieldRef, physical: parquet::basic::Type) -> Option<DataType> {
    use parquet::basic::Type;
    let DataType::FixedSizeList(item, size) = field.data_type() else {
        return None;
    };
    let item = item.data_type();
    let stored = matches!(
        (item, physical),
        (DataType::Float32, Type::FLOAT)
            | (DataType::Float64, Type::DOUBLE)
            | (
                DataType::Int32
                    | DataType::Int16
                    | DataType::Int8
                    | DataType::UInt32
                    | DataType::UInt16
                    | DataType::UInt8,
                Type::INT32
            )
            | (DataType::Int64, Type::INT64)
    );
    (stored && *size > 0).then(|| item.clone())
}

/// Reads the fixed-size list columns itself and the others with arrow-rs's reader.
pub(super) struct ListDecoder {
    schema: SchemaRef,
    /// arrow-rs's reader of the other columns, if any.
    rest: Option<ParquetRecordBatchReader>,
    lists: Vec<Column>,
    /// Each output column: a list column (its index in `lists`) or the next of `rest`'s.
    order: Vec<Option<usize>>,
    /// Rows handed over.
    emitted: usize,
    rows: Rows,
    /// arrow-rs's reader of every column, once a batch's levels broke the pattern.
    slow: Option<ParquetRecordBatchReader>,
    /// Batches read and not yet handed over: a batch is cut where a binary column's values
    /// change buffers (see [`super::fixed`]).
    pending: std::collections::VecDeque<RecordBatch>,
}

/// A column this module reads.
enum Column {
    List(ListColumn),
    Binary(BinaryColumn),
}

impl Column {
    /// The next `rows` rows as arrays of consecutive rows (a list: one), or `None` when they
    /// are not of the pattern this module reads.
    fn read(&mut self, rows: usize) -> parquet::errors::Result<Option<Vec<ArrayRef>>> {
        match self {
            Column::List(list) => Ok(list.read(rows)?.map(|a| vec![a])),
            Column::Binary(binary) => binary.read(rows),
        }
    }
}

impl ListDecoder {
    fn next(&mut self) -> Option<Result<RecordBatch, ArrowError>> {
        if let Some(batch) = self.pending.pop_front() {
            return Some(Ok(batch));
        }
        if let Some(slow) = &mut self.slow {
            return slow.next();
        }
        let rest = match self.rest.as_mut().map(Iterator::next) {
            Some(None) => return None,
            Some(Some(Err(e))) => return Some(Err(e)),
            Some(Some(Ok(b))) => Some(b),
            None => None,
        };
        let n = match &rest {
            Some(b) => b.num_rows(),
            None => self.rows.batch_rows.min(self.rows.take - self.emitted),
        };
        if n == 0 {
            return None;
        }
        let mut lists = Vec::with_capacity(self.lists.len());
        for list in &mut self.lists {
            match list.read(n) {
                Ok(Some(array)) => lists.push(array),
                // Not the pattern (or not decodable as it): arrow-rs reads from here on.
                Ok(None) | Err(_) => return self.fall_back(),
            }
        }
        let mut rest_columns = rest.iter().flat_map(|b| b.columns().iter().cloned());
        let mut lists = lists.into_iter();
        let columns: Option<Vec<Vec<ArrayRef>>> = (self.order.iter())
            .map(|o| match o {
                Some(_) => lists.next(),
                None => rest_columns.next().map(|c| vec![c]),
            })
            .collect();
        self.emitted += n;
        let Some(columns) = columns else {
            return Some(Err(ArrowError::ComputeError("columns missing".into())));
        };
        let batches: Result<Vec<RecordBatch>, ArrowError> = pieces(&columns, n)
            .into_iter()
            .map(|piece| RecordBatch::try_new(self.schema.clone(), piece))
            .collect();
        match batches {
            Ok(batches) => self.pending.extend(batches),
            Err(e) => return Some(Err(e)),
        }
        self.pending.pop_front().map(Ok)
    }

    /// Reads the rest of the row group with arrow-rs's reader alone, from the first row not
    /// handed over.
    fn fall_back(&mut self) -> Option<Result<RecordBatch, ArrowError>> {
        let slow = self.rows.arrow(self.emitted, self.rows.mask.clone());
        match slow {
            Ok(slow) => {
                self.rest = None;
                self.lists.clear();
                self.slow.insert(slow).next()
            }
            Err(e) => Some(Err(ArrowError::ParquetError(e.to_string()))),
        }
    }
}

/// `n` rows of `columns`, each given as arrays of consecutive rows, cut into batches wherever
/// any column's array ends: each batch's columns are slices of one array each (no copy).
fn pieces(columns: &[Vec<ArrayRef>], n: usize) -> Vec<Vec<ArrayRef>> {
    if columns.iter().all(|c| c.len() == 1) {
        return vec![columns.iter().map(|c| c[0].clone()).collect()];
    }
    let mut cuts: Vec<usize> = columns
        .iter()
        .flat_map(|c| {
            c.iter().scan(0, |end, a| {
                *end += a.len();
                Some(*end)
            })
        })
        .filter(|&end| end < n)
        .collect();
    cuts.push(n);
    cuts.sort_unstable();
    cuts.dedup();
    let mut out = Vec::with_capacity(cuts.len());
    let mut from = 0;
    for to in cuts {
        let piece = columns
            .iter()
            .map(|arrays| {
                // The array holding rows `from..to`, and where it starts.
                let mut start = 0;
                for a in arrays {
                    if from < start + a.len() {
                        return a.slice(from - start, to - from);
                    }
                    start += a.len();
                }
                arrays[arrays.len() - 1].slice(0, 0)
            })
            .collect();
        out.push(piece);
        from = to;
    }
    out
}

#[cfg(test)]
#[path = "lists_tests.rs"]
mod tests;
