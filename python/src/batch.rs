//! One batch in Python: its rows as Arrow data, exported through the Arrow PyCapsule
//! interface (`__arrow_c_array__`), so `pyarrow.record_batch(batch)` takes the buffers Rust
//! filled without copying them; and its lineage.
//!
//! Written by hand rather than with a crate: `pyo3-arrow` follows an older arrow (59) than
//! Sluice's (60), and arrow's own `pyarrow` feature would compile pyo3 into the arrow of every
//! workspace member through cargo's feature unification. The export is the C data interface's
//! own structs, moved into capsules that free them if no consumer takes them.

use arrow::array::{Array, StructArray};
use arrow::ffi::{FFI_ArrowArray, FFI_ArrowSchema};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict, PyList};
use sluice_pipeline::{Batch, Origin};

/// A batch of rows and where each came from.
#[pyclass(name = "Batch", module = "sluice._sluice", frozen)]
pub(crate) struct PyBatch {
    pub(crate) batch: Batch,
}

#[pymethods]
impl PyBatch {
    /// Rows in the batch.
    #[getter]
    fn num_rows(&self) -> usize {
        self.batch.num_rows()
    }

    fn __len__(&self) -> usize {
        self.batch.num_rows()
    }

    /// Column names, in order.
    #[getter]
    fn column_names(&self) -> Vec<String> {
        self.batch
            .data
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect()
    }

    /// The Arrow PyCapsule interface: the batch as a struct array and its schema, zero-copy.
    /// `requested_schema` is ignored, as the interface allows: the batch has one layout.
    #[pyo3(signature = (requested_schema=None))]
    fn __arrow_c_array__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyAny>>,
    ) -> PyResult<(Bound<'py, PyCapsule>, Bound<'py, PyCapsule>)> {
        let _ = requested_schema;
        let array = StructArray::from(self.batch.data.clone());
        let schema = FFI_ArrowSchema::try_from(array.data_type())
            .map_err(|e| PyValueError::new_err(format!("cannot export the schema: {e}")))?;
        let data = FFI_ArrowArray::new(&array.to_data());
        let schema = PyCapsule::new_with_value(py, schema, c"arrow_schema")?;
        let data = PyCapsule::new_with_value(py, data, c"arrow_array")?;
        Ok((schema, data))
    }

    /// Where the rows came from, in order: a list of runs `{"origin", "first", "len",
    /// "epoch"}` — `origin` names the object and row group or the Kafka topic and partition,
    /// `first` is the first row (objects) or offset (Kafka) of the run.
    fn lineage<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let out = PyList::empty(py);
        for span in self.batch.lineage.spans() {
            let d = PyDict::new(py);
            d.set_item("origin", span.origin.to_string())?;
            match span.origin {
                Origin::Object { url, row_group } => {
                    d.set_item("url", url.as_ref())?;
                    d.set_item("row_group", row_group)?;
                }
                Origin::Kafka { topic, partition } => {
                    d.set_item("topic", topic.as_ref())?;
                    d.set_item("partition", partition)?;
                }
                Origin::KafkaMessage {
                    topic,
                    partition,
                    offset,
                    ..
                } => {
                    d.set_item("topic", topic.as_ref())?;
                    d.set_item("partition", partition)?;
                    d.set_item("offset", offset)?;
                }
            }
            d.set_item("first", span.first)?;
            d.set_item("len", span.len)?;
            d.set_item("epoch", span.epoch)?;
            out.append(d)?;
        }
        Ok(out)
    }

    /// Where each column's values live in memory (for fixed-size lists: their innermost
    /// values), by column name: what the zero-copy tests compare numpy's and pyarrow's
    /// addresses with. Not part of the API.
    fn _value_addresses(&self) -> Vec<(String, usize)> {
        let schema = self.batch.data.schema();
        schema
            .fields()
            .iter()
            .zip(self.batch.data.columns())
            .map(|(f, c)| {
                let mut data = c.to_data();
                while let Some(child) = data.child_data().first().cloned() {
                    data = child;
                }
                let at = data.buffers().first().map_or(0, |b| b.as_ptr() as usize);
                (f.name().clone(), at)
            })
            .collect()
    }

    fn __repr__(&self) -> String {
        format!(
            "sluice.Batch({} rows: {})",
            self.batch.num_rows(),
            self.column_names().join(", ")
        )
    }
}
