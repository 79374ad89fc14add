//! Training checkpoints: one object holding the model, the optimizer state, the step and
//! every rank's pipeline state, written atomically (object stores replace an object whole;
//! the local file system writes a temporary file and renames it).
//!
//! Layout: the 8 bytes `SLUICECK`, a little-endian u64 header length, a JSON header
//! ([`Header`]: metadata and, per tensor, name, shape and byte range), then the tensors' f32
//! values, little-endian. Plain enough to read without libtorch.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sluice_pipeline::SourceState;
use tch::Tensor;

use crate::TrainError;
use crate::sync::host_f32;

const MAGIC: &[u8; 8] = b"SLUICECK";

/// What a checkpoint says besides its tensors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointMeta {
    /// Format version (1).
    pub version: u32,
    /// Optimizer steps completed.
    pub step: u64,
    /// Ranks of the run that wrote it.
    pub world_size: usize,
    /// Per rank (index = rank): the pipeline state just past the last batch trained on.
    pub pipeline: Vec<SourceState>,
    /// Rows trained on, all ranks, all runs up to this checkpoint.
    pub rows_trained: u64,
    /// Whether the run had finished (its data or `steps` exhausted).
    pub complete: bool,
    /// The epoch of the last step and the rows trained in it (all ranks): what an elastic
    /// resume, which passes over the rest of that epoch, reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<EpochProgress>,
    /// How the replicas were kept together (`trainer.sync`, `trainer.allreduce.compression`),
    /// when each rank had state of its own; then its tensors are `rank<N>.<name>`. Absent in
    /// checkpoints of older versions and of plain synchronous runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync: Option<String>,
}

impl CheckpointMeta {
    /// Metadata of no run: for a bundle of tensors sent between ranks (only they are read).
    pub fn empty() -> CheckpointMeta {
        CheckpointMeta {
            version: 1,
            step: 0,
            world_size: 0,
            pipeline: Vec::new(),
            rows_trained: 0,
            complete: false,
            epoch: None,
            sync: None,
        }
    }
}

/// Rows trained so far in one epoch, all ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochProgress {
    /// The epoch (0-based).
    pub epoch: u64,
    /// Rows trained in it.
    pub rows: u64,
    /// Steps taken in it (each rank one batch): what the batches the ranks still owe of it
    /// are counted from when it is continued on another number of ranks. Absent in
    /// checkpoints of older versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<u64>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Header {
    meta: CheckpointMeta,
    tensors: Vec<Entry>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Entry {
    name: String,
    shape: Vec<i64>,
    /// Byte offset in the data section.
    offset: usize,
}

/// Encodes `tensors` (any float kind; stored as f32) with `meta`.
pub fn encode(meta: &CheckpointMeta, tensors: &[(String, Tensor)]) -> Result<Vec<u8>, TrainError> {
    let mut entries = Vec::with_capacity(tensors.len());
    let mut data: Vec<u8> = Vec::new();
    let mut buf: Vec<f32> = Vec::new();
    for (name, t) in tensors {
        host_f32(t, &mut buf);
        let n = buf.len();
        entries.push(Entry {
            name: name.clone(),
            shape: t.size(),
            offset: data.len(),
        });
        data.reserve(n * 4);
        for x in &buf {
            data.extend_from_slice(&x.to_le_bytes());
        }
    }
    let header = serde_json::to_vec(&Header {
        meta: meta.clone(),
        tensors: entries,
    })
    .map_err(|e| TrainError::Checkpoint(e.to_string()))?;
    let mut out = Vec::with_capacity(16 + header.len() + data.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(header.len() as u64).to_le_bytes());
    out.extend_from_slice(&header);
    out.extend_from_slice(&data);
    Ok(out)
}

/// Decodes what [`encode`] wrote (tensors on the CPU).
pub fn decode(bytes: &[u8]) -> Result<(CheckpointMeta, BTreeMap<String, Tensor>), TrainError> {
    let bad =
        |what: &str| TrainError::Checkpoint(format!("not a Sluice training checkpoint: {what}"));
    if bytes.len() < 16 || &bytes[..8] != MAGIC {
        return Err(bad("missing the SLUICECK signature"));
    }
    let mut len = [0u8; 8];
    len.copy_from_slice(&bytes[8..16]);
    let hlen = u64::from_le_bytes(len) as usize;
    let body = bytes
        .get(16..16usize.saturating_add(hlen))
        .ok_or_else(|| bad("truncated header"))?;
    let header: Header = serde_json::from_slice(body).map_err(|e| bad(&format!("header: {e}")))?;
    let data = &bytes[16 + hlen..];
    let mut tensors = BTreeMap::new();
    for e in header.tensors {
        let n: i64 = e.shape.iter().product();
        let end = e.offset + n.max(0) as usize * 4;
        let raw = data
            .get(e.offset..end)
            .ok_or_else(|| bad(&format!("tensor `{}` is truncated", e.name)))?;
        let values: Vec<f32> = raw
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        tensors.insert(e.name, Tensor::from_slice(&values).view(e.shape.as_slice()));
    }
    Ok((header.meta, tensors))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    #[test]
    fn round_trip_is_bitwise() {
        let a = Tensor::randn([3, 4], (Kind::Float, Device::Cpu));
        let b = Tensor::from_slice(&[f32::MIN_POSITIVE, -0.0, 1e30]);
        let meta = CheckpointMeta {
            version: 1,
            step: 7,
            world_size: 2,
            pipeline: vec![SourceState::default(), SourceState::default()],
            rows_trained: 99,
            complete: false,
            epoch: Some(EpochProgress {
                epoch: 1,
                rows: 40,
                steps: Some(4),
            }),
            sync: Some("local".into()),
        };
        let bytes = encode(
            &meta,
            &[
                ("a".into(), a.shallow_clone()),
                ("b".into(), b.shallow_clone()),
            ],
        )
        .expect("encode");
        let (m, t) = decode(&bytes).expect("decode");
        assert_eq!(m, meta);
        assert!(t["a"].equal(&a));
        assert!(t["b"].equal(&b));
        assert!(decode(&bytes[..bytes.len() - 1]).is_err());
        assert!(decode(b"PARQUET1........").is_err());
    }
}
