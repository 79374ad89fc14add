//! A local file mapped into memory (`memory_map`, the Parquet source's default): the decoder
//! gets each page as a slice of the mapping, so the kernel's copy of the file into a buffer of
//! ours (`pread`) is not made. Measured 2026-12-01 (bench children, 2 threads): that copy was
//! 8 % of the CPU of decoding the compressed images and 5 % of the tabular workload's.
//!
//! Every range is checked against the file before it is handed out: its page tables are
//! filled in one call (`MADV_POPULATE_READ`, Linux 5.14), which fails — instead of the read
//! raising `SIGBUS` — when the file shrank since it was mapped. Where that call is not
//! available the caller reads with `pread` instead. A file cut shorter *while* a page of it is
//! being decoded (after the check) still ends the process with `SIGBUS`, as with every
//! memory-mapped reader (Arrow's, Polars'); `memory_map: false` reads with `pread` and turns
//! that into an error too.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use memmap2::{Advice, Mmap, UncheckedAdvice};

/// Set when the kernel turned down `MADV_POPULATE_READ`: no file is mapped after that.
static UNCHECKED: AtomicBool = AtomicBool::new(false);

/// A local file mapped read-only, whole.
#[derive(Debug, Clone)]
pub(crate) struct MappedFile {
    map: Arc<Mmap>,
    /// The file, to say how long it is now when a range is no longer in it.
    file: Arc<std::fs::File>,
}

/// Why a range could not be handed out as a slice of the mapping.
#[derive(Debug)]
pub(crate) enum NotMapped {
    /// Read it with `pread` instead: the kernel cannot check ranges in advance (no
    /// `MADV_POPULATE_READ`; then no file is mapped again), or the check failed for another
    /// reason than the range being gone (a pending signal, memory pressure), which `pread`
    /// reports if it fails too.
    ReadInstead,
    /// The range is not (or no longer) in the file.
    Failed(std::io::Error),
}

impl MappedFile {
    /// Maps `file` (`len` bytes long, its length when opened), or `None` when it cannot be
    /// mapped (an empty file, a file system without mappings): read it with `pread`.
    pub(crate) fn map(file: &Arc<std::fs::File>, len: u64) -> Option<Self> {
        if UNCHECKED.load(Ordering::Relaxed) {
            return None;
        }
        let len = usize::try_from(len).ok().filter(|&l| l > 0)?;
        #[allow(unsafe_code)]
        // SAFETY: the mapping is read-only and private. Its bytes are only read through
        // slices checked by `bytes` below; a file changed on disk while mapped changes what
        // those slices read (the same as reading it again with `pread`), and a file cut
        // shorter is caught by `bytes` before its pages are handed out.
        let map = unsafe { memmap2::MmapOptions::new().len(len).map(&**file) }.ok()?;
        Some(MappedFile {
            map: Arc::new(map),
            file: file.clone(),
        })
    }

    /// The bytes of `range`, checked to be in the file now. Once they (and every slice of
    /// them) are dropped, the pages wholly inside `range` are unmapped (`MADV_DONTNEED`), so
    /// a unit's mapping keeps in memory only the pages being decoded, as reading them with
    /// `pread` does.
    pub(crate) fn bytes(&self, range: Range<u64>) -> Result<Bytes, NotMapped> {
        let want = range.end.saturating_sub(range.start);
        if range.end > self.map.len() as u64 || range.start > range.end {
            let got = (self.map.len() as u64).saturating_sub(range.start);
            return Err(NotMapped::Failed(short(got, want)));
        }
        // (Both ends are within the mapping, so they fit in `usize`.)
        let (start, end) = (range.start as usize, range.end as usize);
        if end > start {
            match self
                .map
                .advise_range(Advice::PopulateRead, start, end - start)
            {
                Ok(()) => {}
                // The file was cut shorter since it was mapped.
                Err(e) if e.raw_os_error() == Some(libc::EFAULT) => {
                    let now = self.file.metadata().map_or(0, |m| m.len());
                    let got = now.saturating_sub(range.start);
                    return Err(NotMapped::Failed(short(got, want)));
                }
                Err(e) => {
                    if e.raw_os_error() == Some(libc::EINVAL) {
                        UNCHECKED.store(true, Ordering::Relaxed);
                    }
                    return Err(NotMapped::ReadInstead);
                }
            }
        }
        Ok(Bytes::from_owner(Slice {
            map: self.map.clone(),
            start,
            end,
        }))
    }
}

/// What a read of `want` bytes that found only `got` says.
pub(crate) fn short(got: u64, want: u64) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::UnexpectedEof,
        format!("the file ends after {got} of the {want} bytes"),
    )
}

/// Bytes `start..end` of a mapping, kept mapped while they are held.
struct Slice {
    map: Arc<Mmap>,
    start: usize,
    end: usize,
}

impl AsRef<[u8]> for Slice {
    fn as_ref(&self) -> &[u8] {
        &self.map[self.start..self.end]
    }
}

impl Drop for Slice {
    fn drop(&mut self) {
        // Whole pages only: a page shared with a neighbouring range stays mapped.
        let page = page_size();
        let (from, to) = (self.start.div_ceil(page) * page, self.end / page * page);
        if to > from {
            #[allow(unsafe_code)]
            // SAFETY: nothing borrows these bytes any more (this slice was the last holder of
            // them; other slices hold only their own ranges and the pages they share with
            // this one are left alone). The mapping is private and read-only: a page unmapped
            // here reads the file again if anything touches it later.
            let _ = unsafe {
                self.map
                    .unchecked_advise_range(UncheckedAdvice::DontNeed, from, to - from)
            };
        }
    }
}

/// The system's page size.
fn page_size() -> usize {
    static PAGE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *PAGE.get_or_init(|| {
        #[allow(unsafe_code)]
        // SAFETY: sysconf(3) reads a constant of the system.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        usize::try_from(page)
            .ok()
            .filter(|&p| p > 0)
            .unwrap_or(4096)
    })
}
