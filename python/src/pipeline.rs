//! `Pipeline`: a pipeline config run as a Python iterator of batches, with the state to
//! resume it exactly (`state_dict` / `load_state_dict`, torchdata's `StatefulDataLoader`
//! protocol).
//!
//! The pipeline runs on its own threads — a small tokio runtime for I/O and the pipeline's
//! CPU pool for decoding and stages — and keeps reading ahead (bounded by its queues) while
//! Python works on the last batch. Waiting for a batch releases the interpreter lock, and
//! looks at Python's signals every [`SIGNAL_POLL`] so that Ctrl-C stops the loop with
//! `KeyboardInterrupt`.

use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use sluice_pipeline::config::ConfigDocument;
use sluice_pipeline::{Batch, ConfigErrors, Error, Pipeline, PipelineConfig, SourceState};
use tokio::sync::mpsc;

use crate::batch::PyBatch;
use crate::errors::{ResumeError, to_py};

/// How often a wait for the next batch looks at Python's signals (Ctrl-C).
const SIGNAL_POLL: Duration = Duration::from_millis(100);

/// What `state_dict()` holds besides the state, so that a foreign dict is refused by name.
const STATE_FORMAT: &str = "sluice.pipeline_state";
const STATE_VERSION: u64 = 1;

/// Most batches `prefetch` may hold ready: each is a whole batch in memory.
const MAX_PREFETCH: usize = 64;

/// What the pipeline's task hands to `__next__`.
enum Fetched {
    /// A batch and the state just past it (boxed: one allocation per batch keeps the
    /// channel's slots small).
    Batch(Box<(Batch, SourceState)>),
    Error(Error),
    /// A panic inside Sluice: the position is unknown.
    Panic,
}

/// The running pipeline: a task on the I/O runtime drives the stream `prefetch` batches ahead
/// of Python, each with the state just past it (so `state_dict` is the state after the last
/// batch *returned*, never after one still waiting in the queue).
struct Running {
    rx: mpsc::Receiver<Fetched>,
    task: tokio::task::JoinHandle<()>,
}

/// A pipeline, iterated as batches.
#[pyclass(name = "Pipeline", module = "sluice._sluice")]
pub(crate) struct PyPipeline {
    runtime: Option<tokio::runtime::Runtime>,
    /// Before the first batch: the pipeline, and the state it resumes from.
    pending: Mutex<Option<(Pipeline, Option<SourceState>)>>,
    /// After the first batch. `__next__` holds the lock while it waits (the interpreter lock
    /// released), so `state_dict` from another thread still answers.
    running: Mutex<Option<Running>>,
    /// The state just past the last batch returned; before the first, the one loaded.
    last: Mutex<Option<SourceState>>,
    /// The state before the last batch returned (what `_rewind` goes back to), and the one
    /// past it while rewound (what `_forward` restores).
    before_last: Mutex<Option<SourceState>>,
    rewound: Mutex<Option<Option<SourceState>>>,
    /// The stream ended: iteration is over.
    done: AtomicBool,
    /// The stream failed: every later call raises the same error (a loop that catches it
    /// never sees a short epoch as the end of the data).
    failed: Mutex<Option<PyErr>>,
    /// The process that made the pipeline: its threads do not survive a fork.
    pid: u32,
    /// A panic inside Sluice escaped: the position is unknown, so every later call raises (a
    /// broken pipeline never goes on as if nothing happened).
    panicked: AtomicBool,
    prefetch: usize,
    /// The config's `loader:` section as JSON text (`None`: absent).
    loader: Option<String>,
}

#[pymethods]
impl PyPipeline {
    /// `config`: a path to a pipeline YAML file (relative paths in it resolve against its
    /// directory) or the YAML text itself (relative paths resolve against the current
    /// directory). `overrides`: `(path, YAML value)` pairs set on top of it
    /// (`("stages[0].seed", "3")`). `rank`/`world_size` override `runtime.rank`/`world_size`
    /// (and the environment: `RANK`, `WORLD_SIZE`, …). `prefetch`: batches made ready ahead of
    /// Python (bounded; the pipeline's own queues read ahead too); default: the config's
    /// `loader.prefetch`, else 2.
    #[new]
    #[pyo3(signature = (config, *, overrides=Vec::new(), rank=None, world_size=None, prefetch=None))]
    fn new(
        config: &str,
        overrides: Vec<(String, String)>,
        rank: Option<usize>,
        world_size: Option<usize>,
        prefetch: Option<usize>,
    ) -> PyResult<Self> {
        let doc = load_document(config)
            .and_then(|d| d.with_overrides(&overrides))
            .map_err(to_py)?;
        let mut errors = Vec::new();
        let parsed = PipelineConfig::from_document(&doc, &mut errors);
        let loader = doc.value::<serde_json::Value>("loader", &mut errors);
        let mut parsed = match parsed {
            Some(p) if errors.is_empty() => p,
            _ => return Err(to_py(Error::Config(ConfigErrors::sorted(errors)))),
        };
        let loader = loader.filter(|v| !v.is_null());
        let section_prefetch = match loader.as_ref().and_then(|l| l.get("prefetch")) {
            None => None,
            Some(p) => Some(p.as_u64().ok_or_else(|| {
                crate::errors::ConfigError::new_err(format!(
                    "{}: loader.prefetch is {p}; give a whole number of batches, 1–{MAX_PREFETCH}",
                    doc.origin()
                ))
            })? as usize),
        };
        let prefetch = prefetch.or(section_prefetch).unwrap_or(2);
        if !(1..=MAX_PREFETCH).contains(&prefetch) {
            return Err(PyValueError::new_err(format!(
                "prefetch={prefetch}: give 1–{MAX_PREFETCH} batches to keep ready (each is a whole batch in memory; 2–4 keep a GPU fed)"
            )));
        }
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
            pending: Mutex::new(Some((Pipeline::from_config(parsed, doc.base_dir()), None))),
            running: Mutex::new(None),
            last: Mutex::new(None),
            before_last: Mutex::new(None),
            rewound: Mutex::new(None),
            done: AtomicBool::new(false),
            failed: Mutex::new(None),
            pid: std::process::id(),
            panicked: AtomicBool::new(false),
            prefetch,
            loader: loader.map(|v| v.to_string()),
        })
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// The next batch; `StopIteration` at the end of the data.
    fn __next__(&self, py: Python<'_>) -> PyResult<Option<PyBatch>> {
        if self.panicked.load(Ordering::SeqCst) {
            return Err(poisoned());
        }
        if std::process::id() != self.pid {
            return Err(PyRuntimeError::new_err(
                "this Pipeline was made in another process (this one is a fork of it): its threads did not come along; make the Pipeline in the process that iterates it (e.g. in a DataLoader worker, not before the workers start)",
            ));
        }
        if let Some(e) = self.failed.lock().map_err(|_| poisoned())?.as_ref() {
            return Err(e.clone_ref(py));
        }
        let Some(runtime) = self.runtime.as_ref() else {
            return Ok(None);
        };
        let mut running = match self.running.try_lock() {
            Ok(r) => r,
            Err(std::sync::TryLockError::WouldBlock) => {
                return Err(PyRuntimeError::new_err(
                    "another thread is taking a batch from this pipeline: iterate a pipeline from one thread",
                ));
            }
            Err(std::sync::TryLockError::Poisoned(_)) => return Err(poisoned()),
        };
        if self.done.load(Ordering::SeqCst) {
            return Ok(None);
        }
        if running.is_none() {
            let pending = self.pending.lock().map_err(|_| poisoned())?.take();
            let Some((pipeline, resume)) = pending else {
                return Ok(None);
            };
            *running = Some(self.start(runtime, pipeline, resume));
        }
        let Some(run) = running.as_mut() else {
            return Ok(None);
        };
        loop {
            let waited = std::panic::catch_unwind(AssertUnwindSafe(|| {
                py.detach(|| {
                    runtime.block_on(async {
                        tokio::select! {
                            next = run.rx.recv() => Some(next),
                            () = tokio::time::sleep(SIGNAL_POLL) => None,
                        }
                    })
                })
            }));
            let next = match waited {
                Ok(n) => n,
                Err(_) => Some(Some(Fetched::Panic)),
            };
            match next {
                Some(Some(Fetched::Batch(fetched))) => {
                    let (batch, state) = *fetched;
                    let before = self.last.lock().map_err(|_| poisoned())?.replace(state);
                    *self.before_last.lock().map_err(|_| poisoned())? = before;
                    *self.rewound.lock().map_err(|_| poisoned())? = None;
                    return Ok(Some(PyBatch { batch }));
                }
                Some(Some(Fetched::Error(e))) => {
                    let e = to_py(e);
                    *self.failed.lock().map_err(|_| poisoned())? = Some(e.clone_ref(py));
                    return Err(e);
                }
                Some(Some(Fetched::Panic)) => {
                    self.panicked.store(true, Ordering::SeqCst);
                    return Err(poisoned());
                }
                Some(None) => {
                    // The task ended without a word: the end of the data, unless it was
                    // cut short (a panic outside the stream, the runtime going away).
                    let ended = py.detach(|| runtime.block_on(&mut run.task));
                    if ended.is_err() {
                        self.panicked.store(true, Ordering::SeqCst);
                        return Err(poisoned());
                    }
                    self.done.store(true, Ordering::SeqCst);
                    return Ok(None);
                }
                // Still waiting: Ctrl-C raises KeyboardInterrupt here, the stream kept as
                // it is (iterating again goes on where it stopped).
                None => py.check_signals()?,
            }
        }
    }

    /// Takes back the last batch returned: `state_dict` is the state before it until
    /// `_forward`. For a caller that failed to hand the batch on (a conversion or a copy to
    /// the GPU raised) and will try it again.
    fn _rewind(&self) -> PyResult<()> {
        let mut rewound = self.rewound.lock().map_err(|_| poisoned())?;
        if rewound.is_none() {
            let mut last = self.last.lock().map_err(|_| poisoned())?;
            let before = self.before_last.lock().map_err(|_| poisoned())?.clone();
            *rewound = Some(std::mem::replace(&mut *last, before));
        }
        Ok(())
    }

    /// The batch taken back by `_rewind` was handed on after all.
    fn _forward(&self) -> PyResult<()> {
        if let Some(after) = self.rewound.lock().map_err(|_| poisoned())?.take() {
            *self.last.lock().map_err(|_| poisoned())? = after;
        }
        Ok(())
    }

    /// The config's `loader:` section (tensors, device, prefetch) as JSON text, or `None`.
    #[getter]
    fn loader_section(&self) -> Option<String> {
        self.loader.clone()
    }

    /// The state just past the last batch returned (before the first: the state loaded, or
    /// the start) — a JSON-serialisable dict. A new `Pipeline` of the same config given it
    /// by `load_state_dict` continues with exactly the next batch.
    fn state_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        if self.panicked.load(Ordering::SeqCst) {
            return Err(poisoned());
        }
        let state = self.last.lock().map_err(|_| poisoned())?.clone();
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
    fn load_state_dict(&self, py: Python<'_>, state: &Bound<'_, PyAny>) -> PyResult<()> {
        let mut pending = self.pending.lock().map_err(|_| poisoned())?;
        let Some((_, resume)) = pending.as_mut() else {
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
        *self.last.lock().map_err(|_| poisoned())? = resume.clone();
        Ok(())
    }
}

impl PyPipeline {
    /// Starts the task that drives the stream `prefetch` batches ahead.
    fn start(
        &self,
        runtime: &tokio::runtime::Runtime,
        pipeline: Pipeline,
        resume: Option<SourceState>,
    ) -> Running {
        let pipeline = match resume {
            Some(state) => pipeline.resume_from(state),
            None => pipeline,
        };
        let (tx, rx) = mpsc::channel(self.prefetch);
        let task = runtime.spawn(async move {
            let mut stream = pipeline.stream();
            loop {
                let next = AssertUnwindSafe(stream.next()).catch_unwind().await;
                let item = match next {
                    Ok(None) => return,
                    Ok(Some(Ok(batch))) => Fetched::Batch(Box::new((batch, stream.snapshot()))),
                    Ok(Some(Err(e))) => Fetched::Error(e),
                    Err(_) => Fetched::Panic,
                };
                let last = !matches!(item, Fetched::Batch(..));
                if tx.send(item).await.is_err() || last {
                    return;
                }
            }
        });
        Running { rx, task }
    }
}

impl Drop for PyPipeline {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            // The stream's tasks end with it; the threads are not waited for, so dropping a
            // pipeline never blocks the interpreter.
            {
                let _in_runtime = runtime.enter();
                if let Ok(running) = self.running.get_mut()
                    && let Some(run) = running.take()
                {
                    run.task.abort();
                }
                if let Ok(pending) = self.pending.get_mut() {
                    *pending = None;
                }
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
