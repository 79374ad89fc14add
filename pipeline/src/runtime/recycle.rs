//! Recycled output buffers for stages that write large fixed-width columns (the `image`
//! stage's `float32` pixels: 12 KiB per 32×32×3 image, 3 MiB per batch of 256; its `uint8`
//! ones, a quarter of that).
//!
//! A buffer taken from a [`Pool`] becomes an Arrow [`Buffer`] whose owner hands the
//! allocation back to the pool when the last reference goes — after the batch was sliced,
//! queued, turned into a zero-copy tensor and dropped by the trainer. The next batch then
//! writes into memory that is already mapped and cache-warm instead of fresh pages: measured
//! on the CIFAR-style bench, freshly mapped memory costs the kernel ~1 s per GB to fault in
//! and zero (huge-page `clear_page`), several times the cost of writing the pixels.
//!
//! The pool is bounded: it keeps at most `retain_bytes` of free buffers (the rest are
//! freed), so it never holds more than the pipeline's queues already did at their peak.

use std::sync::{Arc, Mutex, Weak};

use arrow::buffer::{Buffer, ScalarBuffer};
use arrow::datatypes::{ArrowNativeType, ToByteSlice};

/// A bounded free list of vectors of `T`.
#[derive(Debug)]
pub(crate) struct Pool<T> {
    free: Mutex<Vec<Vec<T>>>,
    retain_bytes: usize,
}

/// The `image` stage's `float32` output buffers.
pub(crate) type F32Pool = Pool<f32>;

impl<T: ArrowNativeType> Pool<T> {
    /// A pool keeping at most `retain_bytes` of free buffers.
    pub(crate) fn new(retain_bytes: usize) -> Arc<Self> {
        Arc::new(Pool {
            free: Mutex::new(Vec::new()),
            retain_bytes,
        })
    }

    /// A vector of exactly `len` initialised values (their contents are unspecified: the
    /// caller overwrites every element). Reuses the smallest free buffer that fits; an empty
    /// one takes none (a stage asks for empty buffers of the output types it does not make).
    pub(crate) fn take(&self, len: usize) -> Vec<T> {
        if len == 0 {
            return Vec::new();
        }
        let reused = {
            let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
            let best = free
                .iter()
                .enumerate()
                .filter(|(_, v)| v.capacity() >= len)
                .min_by_key(|(_, v)| v.capacity())
                .map(|(i, _)| i);
            best.map(|i| free.swap_remove(i))
        };
        match reused {
            Some(mut v) => {
                // Within the capacity every element was written before: only the tail
                // beyond the current length (if any) needs initialising.
                v.resize(len, T::default());
                v
            }
            None => vec![T::default(); len],
        }
    }

    /// Wraps `values` as an Arrow buffer that returns its allocation to this pool when the
    /// last reference (array, slice or tensor) is dropped.
    pub(crate) fn into_buffer(self: &Arc<Self>, values: Vec<T>) -> ScalarBuffer<T> {
        let len = values.len();
        let owner = Recycle {
            values,
            pool: Arc::downgrade(self),
        };
        // `Bytes::from_owner` keeps `owner` (and so the vector's allocation, which moving
        // the vector does not move) alive until the last buffer or slice is dropped.
        let buffer = Buffer::from(bytes::Bytes::from_owner(owner));
        ScalarBuffer::new(buffer, 0, len)
    }

    fn put(&self, values: Vec<T>) {
        let size = std::mem::size_of::<T>();
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        let held: usize = free.iter().map(|v| v.capacity() * size).sum();
        if values.capacity() > 0 && held + values.capacity() * size <= self.retain_bytes {
            free.push(values);
        }
    }

    /// Bytes held in free buffers.
    #[cfg(test)]
    fn held_bytes(&self) -> usize {
        let free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        free.iter()
            .map(|v| v.capacity() * std::mem::size_of::<T>())
            .sum()
    }
}

/// The owner of a pooled allocation inside an Arrow buffer.
struct Recycle<T: ArrowNativeType> {
    values: Vec<T>,
    pool: Weak<Pool<T>>,
}

impl<T: ArrowNativeType> AsRef<[u8]> for Recycle<T> {
    fn as_ref(&self) -> &[u8] {
        self.values.to_byte_slice()
    }
}

impl<T: ArrowNativeType> Drop for Recycle<T> {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.upgrade() {
            pool.put(std::mem::take(&mut self.values));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::Float32Array;

    #[test]
    fn buffers_come_back_after_every_slice_is_dropped_and_are_reused() {
        let pool = F32Pool::new(1 << 20);
        let mut v = pool.take(1000);
        v.iter_mut().enumerate().for_each(|(i, x)| *x = i as f32);
        let addr = v.as_ptr() as usize;
        let array = Float32Array::new(pool.into_buffer(v), None);
        let slice = array.slice(10, 5);
        drop(array);
        assert_eq!(pool.held_bytes(), 0, "a slice still refers to the buffer");
        assert_eq!(slice.value(0), 10.0);
        drop(slice);
        assert_eq!(pool.held_bytes(), 4000);
        // Reused for a request that fits (smaller), at the same address.
        let again = pool.take(800);
        assert_eq!(again.len(), 800);
        assert_eq!(again.as_ptr() as usize, addr);
        assert_eq!(pool.held_bytes(), 0);
        // Too large for the free buffer: a fresh one.
        let other = pool.take(2000);
        assert_ne!(other.as_ptr() as usize, addr);
        // An empty request leaves the free buffers alone, and an empty buffer is not kept.
        drop(Float32Array::new(pool.into_buffer(again), None));
        assert_eq!(pool.held_bytes(), 4000);
        let empty = pool.take(0);
        assert_eq!((empty.len(), pool.held_bytes()), (0, 4000));
        drop(Float32Array::new(pool.into_buffer(empty), None));
        assert_eq!(pool.held_bytes(), 4000);
        assert_eq!(pool.free.lock().unwrap().len(), 1);
    }

    #[test]
    fn the_pool_keeps_at_most_its_cap() {
        let pool = F32Pool::new(6000);
        let a = Float32Array::new(pool.into_buffer(pool.take(1000)), None);
        let b = Float32Array::new(pool.into_buffer(pool.take(1000)), None);
        drop(a);
        drop(b);
        assert_eq!(
            pool.held_bytes(),
            4000,
            "the second 4000 bytes exceed the 6000 cap"
        );
        // A buffer outliving its pool is simply freed.
        let c = Float32Array::new(pool.into_buffer(pool.take(10)), None);
        drop(pool);
        drop(c);
    }
}
