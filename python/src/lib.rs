//! `sluice._sluice`: the pipeline as a Python iterator. A thin layer: the pipeline runs in
//! Rust on its own threads (a tokio runtime and the CPU pool), the interpreter lock released
//! while a batch is awaited; each batch crosses into Python through the Arrow C data
//! interface without copying (`batch.rs`). The Python package (`python/sluice/`) builds the
//! user-facing API — numpy arrays, torch tensors, the torch loader — on top of this.

mod batch;
mod errors;
mod pipeline;

use pyo3::prelude::*;

/// The `sluice` binary's allocator, for the same reason (see `src/main.rs`): batches of one
/// size are allocated over and over, and the system allocator hands each large one back to
/// the kernel, so every batch is page-faulted in again. It serves only this library's own
/// allocations (Arrow buffers handed to Python are freed here too, by their release
/// callback). Measured on the CIFAR-style bench from Python, iterating only: 456 k images/s
/// and 3.2 CPU-ms per 1k images with glibc's malloc, 554 k and 2.8 with its mmap threshold
/// raised (what mimalloc's reuse gives without a tuned environment).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[pymodule]
fn _sluice(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<pipeline::PyPipeline>()?;
    m.add_class::<batch::PyBatch>()?;
    errors::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // "debug" or "release": `sluice bench` says when its Python row ran a debug build (the
    // test suite's wheel), whose rates say nothing about Sluice's.
    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    m.add("__build_profile__", profile)?;
    Ok(())
}
