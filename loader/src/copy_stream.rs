//! Host→device copies on a side stream, handed to the consumer's stream by an event.
//!
//! On CUDA the loader converts each batch on a pool thread. Inside [`CopyScope`] that thread's
//! current stream is the device's side stream — one per device for the process, taken once
//! from CUDA's pool (non-blocking: it does not synchronise with the legacy default stream;
//! one stream, so the caching allocator reuses the batches' freed blocks at once) — so the pinned, `non_blocking` copies of batch N+1 run on the device
//! while the training step of batch N runs on the consumer's stream. The scope ends with an
//! event recorded after the copies ([`Ready`]); when the consumer receives the batch,
//! [`Ready::hand_over`] makes the consumer's current stream wait for that event (on the device —
//! the host does not block) and marks each tensor as used on the consumer's stream, so the
//! caching allocator does not reuse its memory before the consumer's kernels are done.
//! Without this the copies were queued on the default stream, ordered after the step.
//!
//! The C++ side (`blob.cpp`) uses c10's device-generic stream API, which libc10 carries in
//! CPU builds too: this compiles and links everywhere, and nothing here runs off CUDA.

#![allow(unsafe_code)]

use std::ffi::c_void;

use tch::{Device, Tensor};

unsafe extern "C" {
    fn sluice_cuda_copy_begin(index: i32) -> *mut c_void;
    fn sluice_cuda_copy_end(scope: *mut c_void) -> *mut c_void;
    fn sluice_cuda_ready(
        event: *mut c_void,
        tensors: *const *const torch_sys::C_tensor,
        n: usize,
    ) -> i32;
    fn sluice_cuda_event_free(event: *mut c_void);
}

/// The calling thread's copies go to a side stream until [`CopyScope::end`].
pub(crate) struct CopyScope(*mut c_void);

impl CopyScope {
    /// A scope on `device`'s side stream; `None` off CUDA (copies then need no hand-over).
    pub(crate) fn begin(device: Device) -> Option<Self> {
        let Device::Cuda(index) = device else {
            return None;
        };
        // SAFETY: plain call; null when CUDA's backend is not loaded or the pool fails.
        let raw = unsafe { sluice_cuda_copy_begin(index as i32) };
        (!raw.is_null()).then_some(CopyScope(raw))
    }

    /// Records the event after the copies queued so far and restores the thread's stream.
    /// Must run on the thread that called [`CopyScope::begin`] (the scope is not `Send`).
    pub(crate) fn end(self) -> Option<Ready> {
        let raw = self.0;
        std::mem::forget(self);
        // SAFETY: `raw` is a live scope from `sluice_cuda_copy_begin`, ended exactly once.
        let event = unsafe { sluice_cuda_copy_end(raw) };
        (!event.is_null()).then_some(Ready(event))
    }
}

impl Drop for CopyScope {
    /// A scope left by an error still restores the thread's stream.
    fn drop(&mut self) {
        // SAFETY: as in `end`; `end` forgets `self`, so this runs only for scopes not ended.
        let event = unsafe { sluice_cuda_copy_end(self.0) };
        if !event.is_null() {
            // SAFETY: a fresh event nobody else holds.
            unsafe { sluice_cuda_event_free(event) }
        }
    }
}

/// The event after a batch's copies; the batch's tensors are not to be used on another
/// stream before [`Ready::hand_over`].
#[derive(Debug)]
pub(crate) struct Ready(*mut c_void);

// SAFETY: a c10::Event may be waited on and destroyed from any thread; it is owned by one
// `Ready` at a time.
unsafe impl Send for Ready {}

impl Ready {
    /// On the consumer's thread: its current stream waits for the copies, and the tensors'
    /// memory is recorded as in use on it.
    pub(crate) fn hand_over<'a>(self, tensors: impl Iterator<Item = &'a Tensor>) -> bool {
        let ptrs: Vec<*const torch_sys::C_tensor> = tensors.map(Tensor::as_ptr).collect();
        let raw = self.0;
        std::mem::forget(self);
        // SAFETY: `raw` is a live event, consumed (freed) by this call; the pointers are
        // `at::Tensor*` of tensors borrowed for the call.
        unsafe { sluice_cuda_ready(raw, ptrs.as_ptr(), ptrs.len()) == 0 }
    }
}

impl Drop for Ready {
    fn drop(&mut self) {
        // SAFETY: a live event not handed over (`hand_over` forgets `self`).
        unsafe { sluice_cuda_event_free(self.0) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_side_stream_off_cuda() {
        assert!(CopyScope::begin(Device::Cpu).is_none());
    }
}
