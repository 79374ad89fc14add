//! Model versions for serving (`trainer.export`): each checkpoint is also published as a
//! folder a serving system or another tool reads without Sluice:
//!
//! ```text
//! <path>/step-000000000120/model.safetensors   the parameters (f32, names as in the model)
//! <path>/step-000000000120/manifest.json       step, rows, last evaluation, source positions
//! <path>/LATEST                                {"version": "step-000000000120", "step": 120}
//! ```
//!
//! Written in that order, each object in one atomic put, so a reader that follows `LATEST`
//! always finds a whole version. The weights load with `safetensors.torch.load_file`.

use std::collections::HashMap;

use serde::Serialize;
use sluice_pipeline::SourceState;
use tch::Tensor;

use crate::TrainError;
use crate::metrics::EvalReport;
use crate::sync::host_f32;

/// The pointer object's name under `path`.
pub const LATEST: &str = "LATEST";
/// The weights' object name in a version.
pub const WEIGHTS: &str = "model.safetensors";
/// The manifest's object name in a version.
pub const MANIFEST: &str = "manifest.json";

/// A version's folder name: zero-padded, so names sort as steps do.
pub fn version_name(step: u64) -> String {
    format!("step-{step:012}")
}

/// What a model version says about itself (`manifest.json`).
#[derive(Debug, Clone, Serialize)]
pub struct Manifest {
    /// `sluice-model-version/1`.
    pub format: &'static str,
    /// Optimizer steps the weights have had.
    pub step: u64,
    /// Rows trained on, all ranks, all runs.
    pub rows_trained: u64,
    /// Whether the run had finished.
    pub complete: bool,
    /// The weights' object, relative to the version.
    pub weights: &'static str,
    /// The last evaluation before it, if any.
    pub eval: Option<EvalReport>,
    /// Per rank, where its source stood (Parquet positions, Kafka partition offsets): the data
    /// the weights have seen.
    pub pipeline: Vec<SourceState>,
    /// Milliseconds since the Unix epoch when it was written.
    pub written_unix_ms: u128,
    /// The Sluice that wrote it.
    pub sluice_version: &'static str,
}

/// The parameters as a safetensors file (f32, little-endian), with the step in its metadata.
pub fn weights(params: &[(String, Tensor)], step: u64) -> Result<Vec<u8>, TrainError> {
    let mut host: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::with_capacity(params.len());
    let mut buf = Vec::new();
    for (name, t) in params {
        host_f32(t, &mut buf);
        let shape = t.size().iter().map(|&d| d.max(0) as usize).collect();
        let bytes = buf.iter().flat_map(|x| x.to_le_bytes()).collect();
        host.push((name.clone(), shape, bytes));
    }
    let bad =
        |e: safetensors::SafeTensorError| TrainError::Checkpoint(format!("safetensors: {e:?}"));
    let views = host
        .iter()
        .map(|(name, shape, bytes)| {
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), bytes)
                .map(|v| (name.as_str(), v))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(bad)?;
    let meta = HashMap::from([
        ("format".to_string(), "pt".to_string()),
        ("step".to_string(), step.to_string()),
    ]);
    safetensors::tensor::serialize(views, &Some(meta)).map_err(bad)
}

/// Next to a checkpoint (`<path>.safetensors`): its model parameters (`model.*` of
/// `tensors`, without the prefix) as safetensors, for tools that read no Sluice checkpoint.
/// Written after the checkpoint itself; its metadata names the step.
pub fn write_beside(
    file: &sluice_pipeline::checkpoint::CheckpointFile,
    handle: &tokio::runtime::Handle,
    tensors: &[(String, Tensor)],
    step: u64,
) -> Result<(), TrainError> {
    let model: Vec<(String, Tensor)> = tensors
        .iter()
        .filter_map(|(n, t)| {
            n.strip_prefix("model.")
                .map(|n| (n.to_string(), t.shallow_clone()))
        })
        .collect();
    let loc = file.location();
    let beside = sluice_pipeline::storage::ObjectLocation {
        store: loc.store.clone(),
        path: object_store::path::Path::from(format!("{}.safetensors", loc.path)),
        url: format!("{}.safetensors", loc.url).into(),
    };
    let bytes = weights(&model, step)?;
    handle
        .block_on(sluice_pipeline::checkpoint::CheckpointFile::new(beside).write(bytes))
        .map_err(TrainError::from)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn weights_read_back_as_safetensors_with_their_shapes_and_values() {
        let a = Tensor::from_slice(&[1.0f32, -2.0, 3.5, 0.25, 5.0, 6.0]).view([2, 3]);
        let b = Tensor::from_slice(&[0.5f32]);
        let bytes = weights(&[("l.weight".into(), a), ("l.bias".into(), b)], 7).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let w = st.tensor("l.weight").unwrap();
        assert_eq!(w.shape(), &[2, 3]);
        assert_eq!(w.dtype(), safetensors::Dtype::F32);
        let values: Vec<f32> = w
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert_eq!(values, vec![1.0, -2.0, 3.5, 0.25, 5.0, 6.0]);
        assert_eq!(st.tensor("l.bias").unwrap().shape(), &[1]);
        let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
        assert_eq!(meta.metadata().as_ref().unwrap()["step"], "7");
        assert_eq!(version_name(120), "step-000000000120");
    }
}
