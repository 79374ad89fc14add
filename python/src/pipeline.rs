//! `Pipeline`: a pipeline config run as a Python iterator of batches, with the state to
//! resume it exactly (`state_dict` / `load_state_dict`, torchdata's `StatefulDataLoader`
//! protocol).
//!
//! The pipeline runs on its own threads — a small tokio runtime for I/O and the pipeline's
//! CPU pool for decoding and stages — and keeps reading ahead (bounded by its queues) while
//! Python works on the last batch. Waiting for a batch releases the interpreter lock, and
//! looks at Python's signals every [`SIGNAL_POLL`] so that Ctrl-C stops the loop with
//! `KeyboardInterrupt`.

use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use futures::StreamExt;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use sluice_pipeline::config::ConfigDocument;
use sluice_pipeline::{BatchStream, ConfigErrors, Error, Pipeline, PipelineConfig, SourceState};

use crate::batch::PyBatch;
use crate::errors::{ResumeError, to_py};

/// How often a wait for the next batch looks at Python's signals (Ctrl-C).
const SIGNAL_POLL: Duration = Duration::from_millis(100);

/// What `state_dict()` holds besides the state, so that a foreign dict is refused by name.
const STATE_FORMAT: &str = "sluice.pipeline_state";
const STATE_VERSION: u64 = 1;

/// A pipeline, iterated as batches.
#[pyclass(name = "Pipeline", module = "sluice._sluice")]
pub(crate) struct PyPipeline {
    runtime: Option<tokio::runtime::Runtime>,
    /// Before the first batch: the pipeline, and the state it resumes from.
    pending: Option<(Pipeline, Option<SourceState>)>,
    /// Behind a lock only to make the object shareable between Python threads (pyo3 asks
    /// it of every class); the methods that use it take `&mut self` anyway.
    stream: Mutex<Option<BatchStream>>,
    /// The stream ended (or failed): iteration is over.
    done: bool,
    /// A panic inside Sluice escaped a wait: the position is unknown, so every later call
    /// raises (a broken pipeline never goes on as if nothing happened).
    panicked: bool,
}

#[pymethods]
impl PyPipeline {
    /// `config`: a path to a pipeline YAML file (relative paths in it resolve against its
    /// directory) or the YAML text itself (relative paths resolve against the current
    /// directory). `rank`/`world_size` override `runtime.rank`/`world_size` (and the
    /// environment: `RANK`, `WORLD_SIZE`, …).
    #[new]
    #[pyo3(signature = (config, *, rank=None, world_size=None))]
    fn new(config: &str, rank: Option<usize>, world_size: Option<usize>) -> PyResult<Self> {
        let doc = load_document(config).map_err(to_py)?;
        let mut errors = Vec::new();
        let parsed = PipelineConfig::from_document(&doc, &mut errors);
        let mut parsed = match parsed {
            Some(p) if errors.is_empty() => p,
            _ => return Err(to_py(Error::Config(ConfigErrors::sorted(errors)))),
        };
        if rank.is_some() {
            parsed.runtime.rank = rank;
        }
        if world_size.is_some() {
            parsed.runtime.world_size = world_size;
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("sluice-io")
            .enable_all()
            .build()
            .map_err(|e| PyRuntimeError::new_err(format!("cannot start the I/O threads: {e}")))?;
        Ok(PyPipeline {
            runtime: Some(runtime),
            pending: Some((Pipeline::from_config(parsed, doc.base_dir()), None)),
            stream: Mutex::new(None),
            done: false,
            panicked: false,
        })
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// The next batch; `StopIteration` at the end of the data. It holds the pipeline while it
    /// waits: another Python thread calling it meanwhile (even `state_dict`) gets pyo3's
    /// "already borrowed" error.
    fn __next__(&mut self, py: Python<'_>) -> PyResult<Option<PyBatch>> {
        if self.panicked {
            return Err(poisoned());
        }
        if self.done {
            return Ok(None);
        }
        let Some(runtime) = self.runtime.as_ref() else {
            return Ok(None);
        };
        let stream = self.stream.get_mut().map_err(|_| poisoned())?;
        if stream.is_none()
            && let Some((pipeline, resume)) = self.pending.take()
        {
            let pipeline = match resume {
                Some(state) => pipeline.resume_from(state),
                None => pipeline,
            };
            let _in_runtime = runtime.enter();
            *stream = Some(pipeline.stream());
        }
        let Some(stream) = stream.as_mut() else {
            return Ok(None);
        };
        loop {
            let waited = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                py.detach(|| {
                    runtime.block_on(async {
                        tokio::select! {
                            next = stream.next() => Some(next),
                            () = tokio::time::sleep(SIGNAL_POLL) => None,
                        }
                    })
                })
            }));
            let Ok(next) = waited else {
                self.panicked = true;
                return Err(poisoned());
            };
            match next {
                Some(Some(Ok(batch))) => return Ok(Some(PyBatch { batch })),
                Some(Some(Err(e))) => {
                    self.done = true;
                    return Err(to_py(e));
                }
                Some(None) => {
                    self.done = true;
                    return Ok(None);
                }
                // Still waiting: Ctrl-C raises KeyboardInterrupt here, the stream kept as
                // it is (iterating again goes on where it stopped).
                None => py.check_signals()?,
            }
        }
    }

    /// The state just past the last batch returned (before the first: the state loaded, or
    /// the start) — a JSON-serialisable dict. A new `Pipeline` of the same config given it
    /// by `load_state_dict` continues with exactly the next batch.
    fn state_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        if self.panicked {
            return Err(poisoned());
        }
        let stream = self.stream.lock().map_err(|_| poisoned())?;
        let state = match (stream.as_ref(), &self.pending) {
            (Some(stream), _) => Some(stream.snapshot()),
            (None, Some((_, resume))) => resume.clone(),
            (None, None) => None,
        };
        let state = match state {
            Some(s) => serde_json::to_string(&s)
                .map_err(|e| PyRuntimeError::new_err(format!("cannot encode the state: {e}")))?,
            None => "null".to_string(),
        };
        let json = py.import("json")?;
        let out = PyDict::new(py);
        out.set_item("format", STATE_FORMAT)?;
        out.set_item("version", STATE_VERSION)?;
        out.set_item("state", json.call_method1("loads", (state,))?)?;
        Ok(out.into_any())
    }

    /// Resumes from a `state_dict()` (of this or another process): iteration then continues
    /// with exactly the batch after it. Only before the first batch. A state taken under
    /// other files or order-deciding settings is refused when iteration starts
    /// (`ResumeError`, naming what changed).
    fn load_state_dict(&mut self, py: Python<'_>, state: &Bound<'_, PyAny>) -> PyResult<()> {
        let Some((_, resume)) = self.pending.as_mut() else {
            return Err(PyRuntimeError::new_err(
                "load_state_dict() must come before the first batch: make a new Pipeline to resume",
            ));
        };
        let text: String = py
            .import("json")?
            .call_method1("dumps", (state,))?
            .extract()?;
        let value: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| ResumeError::new_err(format!("not a Sluice state: {e}")))?;
        if value.get("format").and_then(|f| f.as_str()) != Some(STATE_FORMAT) {
            return Err(ResumeError::new_err(format!(
                "not a Sluice pipeline state (no \"format\": \"{STATE_FORMAT}\"): pass what Pipeline.state_dict() returned"
            )));
        }
        let version = value.get("version").and_then(|v| v.as_u64());
        if version != Some(STATE_VERSION) {
            return Err(ResumeError::new_err(format!(
                "a state of version {version:?}, this Sluice reads version {STATE_VERSION}"
            )));
        }
        *resume = match value.get("state") {
            None | Some(serde_json::Value::Null) => None,
            Some(s) => Some(
                serde_json::from_value(s.clone())
                    .map_err(|e| ResumeError::new_err(format!("a damaged Sluice state: {e}")))?,
            ),
        };
        Ok(())
    }
}

impl Drop for PyPipeline {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            // The stream's tasks end with it; the threads are not waited for, so dropping a
            // pipeline never blocks the interpreter.
            {
                let _in_runtime = runtime.enter();
                if let Ok(stream) = self.stream.get_mut() {
                    *stream = None;
                }
                self.pending = None;
            }
            runtime.shutdown_background();
        }
    }
}

/// A panic inside Sluice (or a lock it poisoned): the stream's position is unknown, so
/// nothing goes on from it (the house rule: fail loudly, never as "no position").
fn poisoned() -> PyErr {
    PyRuntimeError::new_err(
        "the pipeline failed inside Sluice earlier (a panic); its position is unknown: make a new Pipeline and resume from the last state_dict()",
    )
}

/// A config file's path, or YAML text: text has a line break or a `key: value`; anything
/// else is a path.
fn load_document(config: &str) -> Result<ConfigDocument, Error> {
    let looks_like_text =
        config.contains('\n') || (config.contains(": ") && !Path::new(config).exists());
    if looks_like_text {
        ConfigDocument::from_str(config, "<yaml>", ".")
    } else {
        ConfigDocument::from_path(config)
    }
}
