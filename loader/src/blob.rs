//! Zero-copy tensors over Arrow buffers, kept alive by the tensor itself.
//!
//! **Why this is sound.** `sluice_tensor_of_blob` (`blob.cpp`) builds the tensor with
//! `at::from_blob` *and a deleter*. The deleter owns a clone of the Arrow [`Buffer`] (an `Arc`
//! of immutable memory) and drops it when libtorch frees the tensor's storage — after the
//! last tensor, view or `shallow_clone` sharing it is gone, on whatever thread that happens
//! (`Buffer` is `Send + Sync`). So the memory stays valid for every tensor that can read it,
//! and it is never written through the tensor by Sluice: Arrow buffers are immutable, and the
//! loader hands out tensors for reading (an in-place op by the user writes memory no other
//! Arrow array of Sluice reads afterwards, since the batch was handed over).

#![allow(unsafe_code)]

use std::ffi::c_void;

use arrow::buffer::Buffer;
use tch::{Kind, Tensor};

unsafe extern "C" {
    fn sluice_tensor_of_blob(
        data: *mut c_void,
        dims: *const i64,
        ndims: usize,
        scalar_type: i32,
        ctx: *mut c_void,
        drop: extern "C" fn(*mut c_void),
    ) -> *mut torch_sys::C_tensor;
}

extern "C" fn drop_buffer(ctx: *mut c_void) {
    // SAFETY: `ctx` is the `Box<Buffer>` leaked in `tensor_over`, handed to exactly one
    // deleter, which libtorch calls exactly once.
    drop(unsafe { Box::from_raw(ctx.cast::<Buffer>()) });
}

/// c10's ScalarType numbering for the kinds Sluice hands out zero-copy.
fn scalar_type(kind: Kind) -> Option<i32> {
    Some(match kind {
        Kind::Uint8 => 0,
        Kind::Int8 => 1,
        Kind::Int16 => 2,
        Kind::Int => 3,
        Kind::Int64 => 4,
        Kind::Half => 5,
        Kind::Float => 6,
        Kind::Double => 7,
        _ => return None,
    })
}

/// A CPU tensor of `kind` and `shape` over `len_bytes` bytes of `buffer` starting at
/// `offset` bytes, sharing the memory. `None` when the kind has no zero-copy mapping or the
/// range is outside the buffer or misaligned.
pub(crate) fn tensor_over(
    buffer: &Buffer,
    offset: usize,
    len_bytes: usize,
    kind: Kind,
    shape: &[i64],
) -> Option<Tensor> {
    let st = scalar_type(kind)?;
    let elem = kind.elt_size_in_bytes();
    let count: i64 = shape.iter().product();
    if offset.checked_add(len_bytes)? > buffer.len()
        || count as usize * elem != len_bytes
        || !(buffer.as_ptr() as usize + offset).is_multiple_of(elem)
    {
        return None;
    }
    let data = buffer.as_ptr().wrapping_add(offset) as *mut c_void;
    let ctx = Box::into_raw(Box::new(buffer.clone())).cast::<c_void>();
    // SAFETY: `data..data+len_bytes` lies inside `buffer` (checked above), which the deleter
    // keeps alive for the storage's lifetime; the shape matches the byte length and the
    // pointer is aligned for the element type; on failure the shim calls the deleter itself.
    let raw =
        unsafe { sluice_tensor_of_blob(data, shape.as_ptr(), shape.len(), st, ctx, drop_buffer) };
    if raw.is_null() {
        return None;
    }
    // SAFETY: `raw` is a fresh heap `at::Tensor*` from the shim, owned by the returned Tensor.
    Some(unsafe { Tensor::from_ptr(raw) })
}
