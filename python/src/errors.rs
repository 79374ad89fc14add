//! Sluice's errors as Python exceptions, with the CLI's messages: `ConfigError` (a config
//! file's problems, each `file:line:column: message`), `ResumeError` (a state that does not
//! fit the pipeline, naming what changed) and `DataError` (reading or transforming the data:
//! the object, row group, offset or row lineage). All derive from `SluiceError`.

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use sluice_pipeline::Error;

create_exception!(
    _sluice,
    SluiceError,
    PyException,
    "Any error of a Sluice pipeline."
);
create_exception!(
    _sluice,
    ConfigError,
    SluiceError,
    "The pipeline config has problems; the message lists each as `file:line:column: message`."
);
create_exception!(
    _sluice,
    ResumeError,
    SluiceError,
    "A saved state does not fit this pipeline (other files or order-deciding settings); the message names what changed."
);
create_exception!(
    _sluice,
    DataError,
    SluiceError,
    "Reading or transforming the data failed; the message says where (object, row group, partition and offset, row lineage)."
);

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("SluiceError", py.get_type::<SluiceError>())?;
    m.add("ConfigError", py.get_type::<ConfigError>())?;
    m.add("ResumeError", py.get_type::<ResumeError>())?;
    m.add("DataError", py.get_type::<DataError>())?;
    Ok(())
}

/// The exception for a pipeline error, its message the CLI's.
pub(crate) fn to_py(e: Error) -> PyErr {
    let message = e.to_string();
    match e {
        Error::Config(_) | Error::ConfigFile { .. } => ConfigError::new_err(message),
        Error::Resume(_) => ResumeError::new_err(message),
        _ => DataError::new_err(message),
    }
}
