//! One fixed-size list column of a row group, read page by page.
//!
//! A page of full lists stored `PLAIN` (every value present, every list its size) is read
//! whole: its levels are checked run by run ([`super::levels`]) and each batch's values are
//! copied straight out of the decompressed page into the batch's buffer. Any other page
//! (dictionary encoded, other encodings, levels that are not full lists) is handed to
//! parquet's own column reader, one page at a time ([`Queue`]), and its levels are decoded and
//! checked as a whole ([`levels_are_lists`]).
//!
//! Why not parquet's column reader for every page: it zero-fills the values' buffer before it
//! copies the values into it, and decodes every level into an `i16` — on the tabular bench
//! (2M lists of 128 float32) ~9 % of the whole pipeline's CPU time.
//!
//! Why a copy per batch rather than batches over slices of the page: a batch then holds
//! exactly its own rows. Slices kept each ~1 MiB page alive as long as any of its batches
//! (a shuffle's window keeps rows for a while): the tabular bench peaked 30–50 MiB higher for
//! the same CPU time (measured: 4.35–4.44 CPU-s and 361–383 MiB sliced, 4.37–4.45 CPU-s and
//! 334–360 MiB copied).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use arrow::array::{ArrayData, ArrayRef, FixedSizeListArray, make_array};
use arrow::buffer::{Buffer, MutableBuffer};
use arrow::datatypes::{DataType, FieldRef};
use parquet::basic::Encoding;
use parquet::column::page::{Page, PageMetadata, PageReader};
use parquet::column::reader::{ColumnReader, ColumnReaderImpl, get_column_reader};
use parquet::data_type::DataType as ParquetType;
use parquet::errors::{ParquetError, Result};
use parquet::schema::types::ColumnDescPtr;

use super::levels;
use crate::runtime::huge::HugeBuffers;

/// One fixed-size list column read here.
pub(super) struct ListColumn {
    /// The column chunk's pages.
    pages: Box<dyn PageReader>,
    /// Pages for `values`, parquet's column reader: those not read whole.
    queue: Queue,
    values: Values,
    item: FieldRef,
    size: usize,
    max_def: i16,
    /// Bytes per stored value: 4 or 8.
    width: usize,
    /// Values decoded and not yet handed over (whole lists; a page's, or parquet's reader's).
    ready: VecDeque<Buffer>,
    /// Level buffers of the pages parquet's reader decodes, reused.
    def: Vec<i16>,
    rep: Vec<i16>,
    /// Rows to pass over before the first read.
    skip: usize,
    /// Where each batch's values are copied to when a shuffle gathers them next (else the
    /// allocator's memory, which a stage after the source can rewrite in place).
    huge: Option<HugeBuffers>,
    /// Data pages read whole / decoded by parquet's reader (for tests).
    pub(super) whole_pages: usize,
    pub(super) decoded_pages: usize,
}

/// What reading one more page gave.
enum Step {
    /// Its lists are in `ready`.
    Read,
    /// The column chunk has no more pages.
    End,
    /// Its levels are not full lists of the column's size (nulls, another size, a list cut
    /// by the page's end): arrow-rs's reader takes over.
    NotLists,
}

impl ListColumn {
    /// Reads `pages` of the column `descr`, a fixed-size list of `size` items `item`, from
    /// row `skip` on.
    pub(super) fn new(
        descr: ColumnDescPtr,
        pages: Box<dyn PageReader>,
        item: FieldRef,
        size: usize,
        skip: usize,
    ) -> Self {
        let queue = Queue::default();
        let max_def = descr.max_def_level();
        let values = Values::of(get_column_reader(descr, Box::new(queue.clone())));
        let width = match values {
            Values::F32(_) | Values::I32(_) => 4,
            Values::F64(_) | Values::I64(_) => 8,
        };
        ListColumn {
            pages,
            queue,
            values,
            item,
            size,
            max_def,
            width,
            ready: VecDeque::new(),
            def: Vec::new(),
            rep: Vec::new(),
            skip,
            whole_pages: 0,
            decoded_pages: 0,
            huge: None,
        }
    }

    /// Its batches' values in huge pages ([`HugeBuffers`]) when `huge`.
    pub(super) fn in_huge_pages(mut self, huge: bool) -> Self {
        self.huge = huge.then(HugeBuffers::default);
        self
    }

    /// The next `rows` lists, or `None` when their pages are not `rows` lists of exactly
    /// `size` present values.
    pub(super) fn read(&mut self, rows: usize) -> Result<Option<ArrayRef>> {
        let list_bytes = self.size * self.width;
        let skip = std::mem::take(&mut self.skip);
        let mut ready_rows = self.ready.iter().map(Buffer::len).sum::<usize>() / list_bytes;
        while ready_rows < skip + rows {
            match self.next_page()? {
                Step::Read => {
                    let added = self.ready.back().map_or(0, Buffer::len) / list_bytes;
                    ready_rows += added;
                }
                Step::End if ready_rows < skip => {
                    return Err(ParquetError::General(format!(
                        "could not skip {skip} rows: the column chunk has {ready_rows}"
                    )));
                }
                Step::End | Step::NotLists => return Ok(None),
            }
        }
        self.pass_over(skip * list_bytes);
        let values = self.take(rows * list_bytes);
        let n = rows * self.size;
        let data = ArrayData::builder(self.values.stored())
            .len(n)
            .add_buffer(values)
            .build()
            .map_err(|e| ParquetError::General(e.to_string()))?;
        let values = narrowed(make_array(data), self.item.data_type());
        let list = FixedSizeListArray::try_new(self.item.clone(), self.size as i32, values, None)
            .map_err(|e| ParquetError::General(e.to_string()))?;
        Ok(Some(Arc::new(list)))
    }

    /// Drops the first `bytes` of `ready` (which holds them).
    fn pass_over(&mut self, mut bytes: usize) {
        while bytes > 0
            && let Some(front) = self.ready.front_mut()
        {
            let n = front.len().min(bytes);
            *front = front.slice(n);
            bytes -= n;
            if front.is_empty() {
                self.ready.pop_front();
            }
        }
    }

    /// The first `bytes` of `ready` (which holds them), removed from it, copied into one
    /// buffer of their own: in huge pages when a shuffle gathers these rows at random next
    /// (`runtime::huge`; a batch larger than a region is allocated as usual), else from the
    /// allocator, which lets the stage after the source rewrite it in place (`stage::owned`:
    /// a buffer of huge pages is not the allocator's to grow, so it would be copied).
    fn take(&mut self, bytes: usize) -> Buffer {
        let mut parts = self.ready.iter().map(Buffer::as_slice);
        if let Some(buffer) = (self.huge.as_mut()).and_then(|h| h.copy(bytes, &mut parts)) {
            self.pass_over(bytes);
            return buffer;
        }
        let mut out = MutableBuffer::with_capacity(bytes);
        while out.len() < bytes {
            let Some(front) = self.ready.front_mut() else {
                break; // not reached: `read` made sure `ready` holds them
            };
            let n = front.len().min(bytes - out.len());
            out.extend_from_slice(&front[..n]);
            *front = front.slice(n);
            if front.is_empty() {
                self.ready.pop_front();
            }
        }
        out.into()
    }

    /// Reads the next data page into `ready` (dictionary pages go to parquet's reader).
    fn next_page(&mut self) -> Result<Step> {
        loop {
            let Some(page) = self.pages.get_next_page()? else {
                return Ok(Step::End);
            };
            if page.is_dictionary_page() {
                self.queue.push(page);
                continue;
            }
            if page.num_values() == 0 {
                continue;
            }
            if let Some(values) = self.whole(&page) {
                self.whole_pages += 1;
                self.ready.push_back(values);
                return Ok(Step::Read);
            }
            self.decoded_pages += 1;
            return self.decode(page);
        }
    }

    /// The values of a data page of full lists stored `PLAIN`, its levels checked run by run;
    /// `None` for any other page.
    fn whole(&self, page: &Page) -> Option<Buffer> {
        let (buf, n, rep, def, at) = match page {
            Page::DataPage {
                buf,
                num_values,
                encoding: Encoding::PLAIN,
                def_level_encoding,
                rep_level_encoding: Encoding::RLE,
                ..
            } => {
                // Each level run is prefixed by its length in bytes, 4 little-endian.
                let mut at = 0;
                let mut prefixed = || {
                    let len = u32::from_le_bytes(buf.get(at..at + 4)?.try_into().ok()?) as usize;
                    let levels = buf.get(at + 4..at + 4 + len)?;
                    at += 4 + len;
                    Some(levels)
                };
                let rep = prefixed()?;
                let def = match (self.max_def, def_level_encoding) {
                    (0, _) => &[][..],
                    (_, Encoding::RLE) => prefixed()?,
                    _ => return None,
                };
                (buf, *num_values as usize, rep, def, at)
            }
            Page::DataPageV2 {
                buf,
                num_values,
                encoding: Encoding::PLAIN,
                num_nulls: 0,
                def_levels_byte_len,
                rep_levels_byte_len,
                ..
            } => {
                let (r, d) = (*rep_levels_byte_len as usize, *def_levels_byte_len as usize);
                (
                    buf,
                    *num_values as usize,
                    buf.get(..r)?,
                    buf.get(r..r + d)?,
                    r + d,
                )
            }
            _ => return None,
        };
        let whole = buf.len().checked_sub(at)? == n * self.width
            && levels::lists_of(rep, self.size, n)
            && (self.max_def == 0 || levels::all_max(def, self.max_def, n));
        if !whole {
            return None;
        }
        Some(Buffer::from(buf.slice(at..)))
    }

    /// Decodes `page` with parquet's column reader: its values into `ready` when its levels
    /// are full lists.
    fn decode(&mut self, page: Page) -> Result<Step> {
        let n = page.num_values() as usize;
        self.queue.push(page);
        let (def, rep) = (&mut self.def, &mut self.rep);
        let values = match &mut self.values {
            Values::F32(r) => read_values(r, n, def, rep)?,
            Values::F64(r) => read_values(r, n, def, rep)?,
            Values::I32(r) => read_values(r, n, def, rep)?,
            Values::I64(r) => read_values(r, n, def, rep)?,
        };
        // Whatever the reader left of the page (it reads it all: its records are at most its
        // values) must not reach the next page's read.
        self.queue.clear();
        match values {
            Some(values) if levels_are_lists(def, rep, self.max_def, self.size) => {
                self.ready.push_back(values);
                Ok(Step::Read)
            }
            _ => Ok(Step::NotLists),
        }
    }
}

/// Pages handed to parquet's column reader one at a time: it reads the page it is given,
/// then finds no more, and treats the page's end as a record's end (the levels are checked
/// after: a list cut by the page's end is not a full list).
#[derive(Clone, Default)]
struct Queue(Arc<Mutex<VecDeque<Page>>>);

impl Queue {
    fn push(&self, page: Page) {
        if let Ok(mut q) = self.0.lock() {
            q.push_back(page);
        }
    }

    fn clear(&self) {
        if let Ok(mut q) = self.0.lock() {
            q.retain(Page::is_dictionary_page);
        }
    }
}

impl Iterator for Queue {
    type Item = Result<Page>;

    fn next(&mut self) -> Option<Self::Item> {
        self.get_next_page().transpose()
    }
}

impl PageReader for Queue {
    fn get_next_page(&mut self) -> Result<Option<Page>> {
        Ok(self.0.lock().ok().and_then(|mut q| q.pop_front()))
    }

    fn peek_next_page(&mut self) -> Result<Option<PageMetadata>> {
        Ok(self.0.lock().ok().and_then(|q| {
            q.front().map(|p| PageMetadata {
                num_rows: None,
                num_levels: Some(p.num_values() as usize),
                is_dict: p.is_dictionary_page(),
            })
        }))
    }

    fn skip_next_page(&mut self) -> Result<()> {
        self.get_next_page().map(drop)
    }

    fn at_record_boundary(&mut self) -> Result<bool> {
        Ok(true)
    }
}

/// Parquet's column reader of a list's values, by their type.
enum Values {
    F32(ColumnReaderImpl<parquet::data_type::FloatType>),
    F64(ColumnReaderImpl<parquet::data_type::DoubleType>),
    I32(ColumnReaderImpl<parquet::data_type::Int32Type>),
    I64(ColumnReaderImpl<parquet::data_type::Int64Type>),
}

impl Values {
    fn of(reader: ColumnReader) -> Values {
        match reader {
            ColumnReader::FloatColumnReader(r) => Values::F32(r),
            ColumnReader::DoubleColumnReader(r) => Values::F64(r),
            ColumnReader::Int32ColumnReader(r) => Values::I32(r),
            ColumnReader::Int64ColumnReader(r) => Values::I64(r),
            _ => unreachable!("physical type checked by list_of"),
        }
    }

    /// The Arrow type of the values as stored.
    fn stored(&self) -> DataType {
        match self {
            Values::F32(_) => DataType::Float32,
            Values::F64(_) => DataType::Float64,
            Values::I32(_) => DataType::Int32,
            Values::I64(_) => DataType::Int64,
        }
    }
}

/// Values stored as INT32 as the list's narrower integers, converted as arrow-rs's reader
/// converts them (`as`: the bits kept; `uint32` reinterpreted); other values as they are.
fn narrowed(values: ArrayRef, item: &DataType) -> ArrayRef {
    use arrow::array::AsArray;
    use arrow::datatypes::{Int8Type, Int16Type, Int32Type, UInt8Type, UInt16Type};
    let Some(ints) = values.as_primitive_opt::<Int32Type>() else {
        return values;
    };
    match item {
        DataType::Int8 => Arc::new(ints.unary::<_, Int8Type>(|v| v as i8)),
        DataType::Int16 => Arc::new(ints.unary::<_, Int16Type>(|v| v as i16)),
        DataType::UInt8 => Arc::new(ints.unary::<_, UInt8Type>(|v| v as u8)),
        DataType::UInt16 => Arc::new(ints.unary::<_, UInt16Type>(|v| v as u16)),
        DataType::UInt32 => Arc::new(arrow::array::UInt32Array::new(
            ints.values().inner().clone().into(),
            None,
        )),
        _ => values,
    }
}

/// Reads the one page queued for `reader` (of `n` levels): its values, every level in `def`
/// and `rep`; `None` when not every level has a value.
fn read_values<T>(
    reader: &mut ColumnReaderImpl<T>,
    n: usize,
    def: &mut Vec<i16>,
    rep: &mut Vec<i16>,
) -> Result<Option<Buffer>>
where
    T: ParquetType,
    T::T: arrow::datatypes::ArrowNativeType,
{
    def.clear();
    rep.clear();
    let mut values: Vec<T::T> = Vec::with_capacity(n);
    let (_, read, levels) = reader.read_records(n, Some(def), Some(rep), &mut values)?;
    if read != n || levels != n {
        return Ok(None);
    }
    Ok(Some(Buffer::from_vec(values)))
}

/// Whether levels `def` and `rep` are lists of exactly `size` present values each: every
/// definition level the column's maximum, every repetition level 0 at a list's first value
/// and 1 elsewhere. One pass over `size`-value chunks, which compiles to vector compares.
pub(super) fn levels_are_lists(def: &[i16], rep: &[i16], max_def: i16, size: usize) -> bool {
    def.len() == rep.len()
        && def.len().is_multiple_of(size)
        && def.iter().fold(true, |ok, &d| ok & (d == max_def))
        && rep.chunks_exact(size).fold(true, |ok, list| {
            ok & (list[0] == 0) & list[1..].iter().fold(true, |ok, &r| ok & (r == 1))
        })
}

#[cfg(test)]
mod tests {
    use arrow::array::{Array, AsArray};
    use arrow::datatypes::{Field, Float32Type};
    use bytes::Bytes;
    use parquet::schema::parser::parse_message_type;
    use parquet::schema::types::SchemaDescriptor;

    use super::*;

    /// A column `x`, lists of 4 required float32, read from `pages` (a queue stands in for a
    /// column chunk's page reader).
    fn column(pages: Vec<Page>, skip: usize) -> ListColumn {
        let schema = "message m { required group x (LIST) { repeated group list { \
                      required float item; } } }";
        let descr = SchemaDescriptor::new(Arc::new(parse_message_type(schema).unwrap()));
        let queue = Queue::default();
        pages.into_iter().for_each(|p| queue.push(p));
        let item = Arc::new(Field::new("item", DataType::Float32, false));
        ListColumn::new(descr.column(0), Box::new(queue), item, 4, skip)
    }

    /// A v1 page of eight float32 values `first..first + 8`, its repetition levels one
    /// bit-packed group (`rep`, least significant bit first), its definition levels all 1;
    /// the values start `pad` bytes further into the page's buffer than the levels end.
    fn page(rep: u8, first: f32, pad: usize) -> Page {
        let mut buf = vec![0u8; pad];
        buf.extend(2u32.to_le_bytes());
        buf.extend([0x03, rep]);
        buf.extend(2u32.to_le_bytes());
        buf.extend([0x10, 0x01]);
        buf.extend((0..8).flat_map(|i| (first + i as f32).to_le_bytes()));
        Page::DataPage {
            buf: Bytes::from(buf).slice(pad..),
            num_values: 8,
            encoding: Encoding::PLAIN,
            def_level_encoding: Encoding::RLE,
            rep_level_encoding: Encoding::RLE,
            statistics: None,
        }
    }

    fn values(list: &ArrayRef) -> Vec<f32> {
        let values = list
            .as_fixed_size_list()
            .values()
            .as_primitive::<Float32Type>()
            .clone();
        values.values().to_vec()
    }

    /// Two lists of four per page: 0 then three 1s, twice.
    const LISTS: u8 = 0b1110_1110;

    #[test]
    fn pages_of_full_lists_are_read_whole_into_batches_of_their_own() {
        // Values aligned in the page or not: batches of their own, aligned.
        for pad in [0, 1] {
            let p = page(LISTS, 0.0, pad);
            let at = p.buffer().as_ptr() as usize..p.buffer().as_ptr() as usize + 44;
            let mut c = column(vec![p, page(LISTS, 8.0, pad)], 0);
            let a = c.read(1).unwrap().unwrap();
            assert_eq!(values(&a), [0.0, 1.0, 2.0, 3.0]);
            let child = a.as_fixed_size_list().values().to_data().buffers()[0].clone();
            assert!(
                !at.contains(&(child.as_ptr() as usize)),
                "a copy, not the page"
            );
            assert_eq!(child.len(), 16, "the batch's values only");
            // A batch across two pages.
            let a = c.read(2).unwrap().unwrap();
            assert_eq!(values(&a), [4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0]);
            assert_eq!(a.len(), 2);
            assert_eq!((c.whole_pages, c.decoded_pages), (2, 0));
            assert_eq!(
                values(&c.read(1).unwrap().unwrap()),
                [12.0, 13.0, 14.0, 15.0]
            );
            assert!(c.read(1).unwrap().is_none(), "no more rows");
        }
    }

    #[test]
    fn skipped_rows_are_passed_over_across_pages() {
        let mut c = column(vec![page(LISTS, 0.0, 0), page(LISTS, 8.0, 0)], 3);
        assert_eq!(
            values(&c.read(1).unwrap().unwrap()),
            [12.0, 13.0, 14.0, 15.0]
        );
        let mut c = column(vec![page(LISTS, 0.0, 0)], 3);
        let e = c.read(1).unwrap_err().to_string();
        assert!(e.contains("could not skip 3 rows"), "{e}");
    }

    /// A page that starts inside a list, or holds lists of another size, is not read whole,
    /// and parquet's reader finds it is not full lists either: arrow-rs's reader takes over.
    #[test]
    fn pages_that_are_not_full_lists_are_refused() {
        for rep in [0b1111_0111u8, 0b1110_1111, 0b1111_1110, 0b1010_1010] {
            let mut c = column(vec![page(rep, 0.0, 0)], 0);
            assert!(c.read(2).unwrap().is_none(), "{rep:08b}");
            assert_eq!((c.whole_pages, c.decoded_pages), (0, 1));
        }
        // A page whose values are one short of its levels.
        let Page::DataPage { buf, .. } = page(LISTS, 0.0, 0) else {
            unreachable!()
        };
        let short = Page::DataPage {
            buf: buf.slice(..buf.len() - 4),
            num_values: 8,
            encoding: Encoding::PLAIN,
            def_level_encoding: Encoding::RLE,
            rep_level_encoding: Encoding::RLE,
            statistics: None,
        };
        let mut c = column(vec![short], 0);
        assert!(!matches!(c.read(2), Ok(Some(_))));
        assert_eq!(c.whole_pages, 0);
    }
}
