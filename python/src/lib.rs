//! `sluice._sluice`: the pipeline as a Python iterator. A thin layer: the pipeline runs in
//! Rust on its own threads (a tokio runtime and the CPU pool), the interpreter lock released
//! while a batch is awaited; each batch crosses into Python through the Arrow C data
//! interface without copying (`batch.rs`). The Python package (`python/sluice/`) builds the
//! user-facing API — numpy arrays, torch tensors, the torch loader — on top of this.

mod batch;
mod errors;
mod pipeline;

use pyo3::prelude::*;

#[pymodule]
fn _sluice(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<pipeline::PyPipeline>()?;
    m.add_class::<batch::PyBatch>()?;
    errors::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
