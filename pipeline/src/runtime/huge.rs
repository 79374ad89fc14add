//! Memory in transparent huge pages for decoded values that are later read at random: a
//! shuffle window's rows, gathered one by one in permuted order.
//!
//! With 4 KiB pages every row gathered from a window of tens of megabytes is a TLB miss (on a
//! VM, a nested page walk). Measured 2026-12-01 on the tabular bench (512-byte rows, 51 MB
//! windows, Intel Xeon VM): with the whole heap in huge pages the run took 2.10–2.22 CPU-s
//! against 2.35–2.44, but the images bench took 4 % more CPU and 35–50 MiB more memory, so
//! the allocator keeps 4 KiB pages and only these buffers ask for huge ones.
//!
//! Buffers are carved in order out of regions of [`REGION`] bytes mapped anonymously and
//! advised `MADV_HUGEPAGE`. A region lives while any buffer carved from it does; a region no
//! buffer uses goes back to a bounded free list (already faulted in: no page is zeroed again)
//! or is unmapped. Written by hand because the global allocator (mimalloc, built `no_thp`)
//! cannot be asked for huge pages for some allocations only.

use std::ptr::NonNull;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arrow::buffer::Buffer;
use memmap2::{Advice, MmapMut};

/// Bytes per region: four huge pages.
pub(crate) const REGION: usize = 8 << 20;
/// Free regions kept for reuse (128 MiB; the rest are unmapped). A shuffle window's regions
/// are freed together when its last batch is dropped, and the next window's are taken as the
/// source decodes: with 4 kept, most were mapped afresh and their huge pages zeroed again
/// (`clear_page`, 3.3 % of the tabular bench's CPU; 2.35–2.41 CPU-s), with 16 none
/// (2.19–2.27 CPU-s).
const KEEP: usize = 16;
/// A free region unused this long is unmapped at the next take or release, as mimalloc
/// returns freed memory after its purge delay: a pipeline that stops reading lists does not
/// keep 128 MiB for good once it goes on doing anything else.
const IDLE: Duration = Duration::from_secs(1);

/// Regions no buffer uses any more, kept mapped for the next ones, with when each was freed.
static FREE: Mutex<Vec<(MmapMut, Instant)>> = Mutex::new(Vec::new());

/// Hands out buffers in huge pages; one per column reader.
#[derive(Debug, Default)]
pub(crate) struct HugeBuffers {
    /// The region being carved, and how much of it is used.
    current: Option<(Arc<Region>, usize)>,
}

impl HugeBuffers {
    /// `bytes` copied into one buffer, from `parts` in order (they hold at least `bytes`);
    /// `None` when `bytes` is more than a region or no region can be mapped: the caller
    /// allocates as usual.
    pub(crate) fn copy(
        &mut self,
        bytes: usize,
        parts: &mut dyn Iterator<Item = &[u8]>,
    ) -> Option<Buffer> {
        if bytes == 0 || bytes > REGION {
            return None;
        }
        // Buffers start on a 64-byte boundary, as Arrow's own do.
        let fits = (self.current.as_ref())
            .is_some_and(|(_, used)| used.div_ceil(64) * 64 + bytes <= REGION);
        if !fits {
            self.current = Some((Arc::new(Region::take()?), 0));
        }
        let (region, used) = self.current.as_mut()?;
        let start = used.div_ceil(64) * 64;
        let base = region.ptr();
        let mut at = 0;
        for part in parts {
            let n = part.len().min(bytes - at);
            #[allow(unsafe_code)]
            // SAFETY: `start + at + n <= start + bytes <= REGION`: inside the region, in the
            // part of it no buffer has been given yet (`used` only grows), so nothing else
            // reads or writes these bytes; `part` is other memory.
            unsafe {
                std::ptr::copy_nonoverlapping(part.as_ptr(), base.as_ptr().add(start + at), n)
            };
            at += n;
            if at == bytes {
                break;
            }
        }
        if at < bytes {
            return None;
        }
        *used = start + bytes;
        #[allow(unsafe_code)]
        // SAFETY: the `bytes` bytes from `start` were all written above and are never written
        // again (the next buffer starts past them); the region they lie in is kept mapped by
        // the `Arc` the buffer owns until its last clone is dropped.
        let buffer = unsafe {
            let ptr = NonNull::new_unchecked(base.as_ptr().add(start));
            Buffer::from_custom_allocation(ptr, bytes, region.clone())
        };
        Some(buffer)
    }
}

/// One mapped region, with the pointer its bytes are written through (taken once, from the
/// mapping held mutably); back to [`FREE`] (or unmapped) when dropped.
#[derive(Debug)]
struct Region {
    map: Option<MmapMut>,
    ptr: NonNull<u8>,
}

// SAFETY: `ptr` points into the region's own mapping, which lives as long as the region; the
// bytes behind it are written (by the one reader carving it) only before the buffers over
// them are handed out, and only read after.
#[allow(unsafe_code)]
unsafe impl Send for Region {}
#[allow(unsafe_code)]
unsafe impl Sync for Region {}

impl Region {
    /// A free region, or a new one; `None` when none can be mapped.
    fn take() -> Option<Region> {
        let reused = FREE.lock().ok().and_then(|mut free| {
            purge(&mut free);
            free.pop().map(|(map, _)| map)
        });
        let mut map = match reused {
            Some(map) => map,
            None => {
                let map = MmapMut::map_anon(REGION).ok()?;
                // Advice only: without huge pages the region is ordinary memory.
                let _ = map.advise(Advice::HugePage);
                map
            }
        };
        let ptr = NonNull::new(map.as_mut_ptr())?;
        Some(Region {
            map: Some(map),
            ptr,
        })
    }

    fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if let (Some(map), Ok(mut free)) = (self.map.take(), FREE.lock()) {
            purge(&mut free);
            if free.len() < KEEP {
                free.push((map, Instant::now()));
            }
        }
    }
}

/// Unmaps the free regions unused for [`IDLE`].
fn purge(free: &mut Vec<(MmapMut, Instant)>) {
    free.retain(|(_, freed)| freed.elapsed() < IDLE);
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Buffers hold the bytes copied into them, from several parts; a region is shared by
    /// the buffers carved from it and outlives the reader; a buffer larger than a region is
    /// refused (the caller allocates it as usual).
    #[test]
    fn buffers_hold_their_bytes_and_keep_their_region() {
        let mut huge = HugeBuffers::default();
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let mut held = Vec::new();
        for (k, len) in [1usize, 63, 64, 100_000, 4096, 199_000]
            .into_iter()
            .enumerate()
        {
            let (a, b) = data[..len + 7].split_at(len / 3);
            let buffer = huge.copy(len, &mut [a, b].into_iter()).unwrap();
            assert_eq!(buffer.as_slice(), &data[..len], "buffer {k}");
            assert_eq!(buffer.as_ptr() as usize % 64, 0, "buffer {k}");
            held.push(buffer);
        }
        // Enough buffers to fill more than one region: each stays intact.
        for _ in 0..REGION / 600_000 + 2 {
            held.push(
                huge.copy(600_000, &mut [&data[..], &data[..]].into_iter())
                    .unwrap(),
            );
        }
        drop(huge);
        for b in &held[6..] {
            assert_eq!(&b.as_slice()[..300_000], &data[..]);
            assert_eq!(&b.as_slice()[300_000..600_000], &data[..]);
        }
        assert_eq!(held[3].as_slice(), &data[..100_000]);
        let mut huge = HugeBuffers::default();
        assert!(huge.copy(REGION + 1, &mut std::iter::empty()).is_none());
        // Parts shorter than asked for: refused, not a buffer of stale bytes.
        assert!(huge.copy(10, &mut [&data[..5]].into_iter()).is_none());
    }
}
