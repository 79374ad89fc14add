//! Fixed-size binary columns (images stored as bytes: `fixed_size_binary[3072]`) handed over
//! without copying their values.
//!
//! Why by hand: arrow-rs's reader copies every value out of the decompressed page into the
//! batch's buffer — on the images bench (200k × 3,072 bytes) 6 % of the CPU time of the whole
//! `uint8` pipeline, and as much again in page faults on the fresh 3 MiB buffers. Parquet's
//! own column reader hands each value over as a slice of the page it was decoded from (a
//! dictionary-encoded value: of the dictionary page). Consecutive values of a page lie end to
//! end, so a batch's rows are a few runs of contiguous bytes — one run per page the batch
//! touches — and each run that lies within one page becomes an array over a slice of that
//! page ([`KeptPages`] keeps the pages the reader was given). A batch is then handed over as
//! one batch per run ([`super::lists`] cuts the other columns to match). Rows that are not in
//! long runs (a dictionary of repeated values, encodings that decode each value into a buffer
//! of its own) are copied into one buffer, as arrow-rs would. Only a local file's pages are
//! handed over: an object store's uncompressed pages are slices of the whole column chunks
//! fetched, which a batch would keep alive.
//!
//! Only columns without nulls take this path, as for lists: at the first batch with a null
//! the row group is read from that batch's first row on by arrow-rs's reader alone.

use std::sync::{Arc, Mutex};

use arrow::array::{ArrayRef, FixedSizeBinaryArray};
use arrow::buffer::Buffer;
use bytes::Bytes;
use parquet::column::page::{Page, PageMetadata, PageReader};
use parquet::column::reader::ColumnReaderImpl;
use parquet::data_type::{FixedLenByteArray, FixedLenByteArrayType};

/// A batch whose runs are shorter than this on average is copied into one buffer instead:
/// each run is a batch of its own downstream, so short runs would be many small batches.
const MIN_RUN_ROWS: usize = 16;

/// Pages kept, each with whether it is the dictionary page.
type Kept = Arc<Mutex<Vec<(bool, Bytes)>>>;

/// The pages a column reader reads (dictionary page included), each kept — shared with the
/// [`BinaryColumn`] reading them — so that a run of values sliced from a page can be handed
/// over as a slice of the page itself.
pub(super) struct KeptPages {
    inner: Box<dyn PageReader>,
    kept: Kept,
}

impl KeptPages {
    pub(super) fn new(inner: Box<dyn PageReader>) -> Self {
        KeptPages {
            inner,
            kept: Arc::default(),
        }
    }

    fn keep(&self, page: &Option<Page>) {
        if let Some(page) = page
            && let Ok(mut kept) = self.kept.lock()
        {
            let dictionary = matches!(page, Page::DictionaryPage { .. });
            kept.push((dictionary, page.buffer().clone()));
        }
    }
}

impl Iterator for KeptPages {
    type Item = parquet::errors::Result<Page>;

    fn next(&mut self) -> Option<Self::Item> {
        self.get_next_page().transpose()
    }
}

impl PageReader for KeptPages {
    fn get_next_page(&mut self) -> parquet::errors::Result<Option<Page>> {
        let page = self.inner.get_next_page()?;
        self.keep(&page);
        Ok(page)
    }

    fn peek_next_page(&mut self) -> parquet::errors::Result<Option<PageMetadata>> {
        self.inner.peek_next_page()
    }

    fn skip_next_page(&mut self) -> parquet::errors::Result<()> {
        self.inner.skip_next_page()
    }

    fn supports_deferred_dictionary(&self) -> bool {
        self.inner.supports_deferred_dictionary()
    }

    fn take_deferred_dictionary(&mut self) -> parquet::errors::Result<Option<Page>> {
        let page = self.inner.take_deferred_dictionary()?;
        self.keep(&page);
        Ok(page)
    }

    fn at_record_boundary(&mut self) -> parquet::errors::Result<bool> {
        self.inner.at_record_boundary()
    }
}

/// One fixed-size binary column read here, with its level buffer (reused batch to batch).
pub(super) struct BinaryColumn {
    reader: ColumnReaderImpl<FixedLenByteArrayType>,
    /// The pages its reader was given (see [`KeptPages`]); `None`: every batch is copied.
    pages: Option<Kept>,
    size: usize,
    max_def: i16,
    def: Vec<i16>,
    /// Rows to pass over before the first read (see `lists::ListColumn::skip`).
    skip: usize,
}

impl BinaryColumn {
    /// Reads `pages` (`hand_over`: runs of values as slices of their pages, else copied).
    pub(super) fn new(
        descr: parquet::schema::types::ColumnDescPtr,
        pages: Box<dyn PageReader>,
        hand_over: bool,
        skip: usize,
    ) -> Self {
        let (size, max_def) = (descr.type_length().max(1) as usize, descr.max_def_level());
        let (pages, kept): (Box<dyn PageReader>, _) = if hand_over {
            let kept = KeptPages::new(pages);
            let shared = kept.kept.clone();
            (Box::new(kept), Some(shared))
        } else {
            (pages, None)
        };
        BinaryColumn {
            reader: ColumnReaderImpl::new(descr, pages),
            pages: kept,
            size,
            max_def,
            def: Vec::new(),
            skip,
        }
    }

    /// The next `rows` values as arrays of consecutive rows, in order; `None` when they are not
    /// `rows` present values of the column's size.
    pub(super) fn read(&mut self, rows: usize) -> parquet::errors::Result<Option<Vec<ArrayRef>>> {
        let skip = std::mem::take(&mut self.skip);
        if skip > 0 && self.reader.skip_records(skip)? != skip {
            return Err(parquet::errors::ParquetError::General(format!(
                "could not skip {skip} rows"
            )));
        }
        self.def.clear();
        let mut values: Vec<FixedLenByteArray> = Vec::with_capacity(rows);
        let def = (self.max_def > 0).then_some(&mut self.def);
        let (records, read, _) = self.reader.read_records(rows, def, None, &mut values)?;
        let present = self
            .def
            .iter()
            .fold(true, |ok, &d| ok & (d == self.max_def));
        let size = self.size;
        if records != rows
            || read != rows
            || !present
            || values.iter().any(|v| v.data().len() != size)
        {
            return Ok(None);
        }
        let arrays = match self.runs(&values) {
            Some(arrays) => arrays,
            None => {
                let mut bytes = Vec::with_capacity(rows * size);
                values
                    .iter()
                    .for_each(|v| bytes.extend_from_slice(v.data()));
                vec![array(size, Buffer::from_vec(bytes))?]
            }
        };
        if let Some(pages) = &self.pages
            && let Ok(mut kept) = pages.lock()
        {
            // What the next read can still take values from: the dictionary and the last
            // data page.
            let last = kept.iter().rposition(|(dictionary, _)| !dictionary);
            let mut i = 0;
            kept.retain(|(dictionary, _)| {
                i += 1;
                *dictionary || Some(i - 1) == last
            });
        }
        Ok(Some(arrays))
    }

    /// `values` as arrays over slices of the pages they lie in, a run of values end to end in
    /// one page each; `None` when they are not in long runs within kept pages.
    fn runs(&self, values: &[FixedLenByteArray]) -> Option<Vec<ArrayRef>> {
        let kept = self.pages.as_ref()?.lock().ok()?;
        let size = self.size;
        let start = |v: &FixedLenByteArray| v.data().as_ptr() as usize;
        let mut cuts = vec![0];
        for (i, w) in values.windows(2).enumerate() {
            if start(&w[1]) != start(&w[0]).wrapping_add(size) {
                cuts.push(i + 1);
            }
        }
        if cuts.len() > 1 && values.len() < cuts.len() * MIN_RUN_ROWS {
            return None;
        }
        cuts.push(values.len());
        cuts.windows(2)
            .map(|run| {
                let (from, len) = (start(&values[run[0]]), (run[1] - run[0]) * size);
                // The kept page holding the whole run, and where the run starts in it.
                let (page, at) = kept.iter().find_map(|(_, page)| {
                    let at = from.checked_sub(page.as_ptr() as usize)?;
                    (at + len <= page.len()).then_some((page, at))
                })?;
                array(size, Buffer::from(page.slice(at..at + len))).ok()
            })
            .collect()
    }
}

fn array(size: usize, values: Buffer) -> parquet::errors::Result<ArrayRef> {
    let array = FixedSizeBinaryArray::try_new(size as i32, values, None)
        .map_err(|e| parquet::errors::ParquetError::General(e.to_string()))?;
    Ok(Arc::new(array))
}
