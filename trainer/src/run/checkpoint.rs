//! Writing a checkpoint: every rank's pipeline position gathered, rank 0 writes them with the
//! model and optimizer state, every rank learns whether it is durable, and then acknowledges
//! (the protocol `sluice run` shares: `sluice_pipeline::checkpoint`).

use sluice_pipeline::SourceState;
use sluice_pipeline::checkpoint::{CheckpointFile, Pending};

use super::{Ctx, Run};
use crate::TrainError;
use sluice_pipeline::storage::resolve;

use crate::checkpoint::{CheckpointMeta, decode, encode};
use crate::export::{LATEST, MANIFEST, Manifest, WEIGHTS, version_name, weights};
use crate::trainer::Trainer;

impl Ctx<'_> {
    /// Gathers every rank's pipeline state; rank 0 writes the checkpoint and tells every rank
    /// whether it is durable, so that all return `Ok` only once it is (and may then commit
    /// the Kafka offsets it covers) and all fail together if it could not be written.
    pub(super) fn checkpoint(
        &mut self,
        trainer: &mut Trainer,
        location: &Option<CheckpointFile>,
        state: &SourceState,
        rows_trained: u64,
        complete: bool,
    ) -> Result<(), TrainError> {
        let Some(loc) = location else { return Ok(()) };
        let mine = serde_json::to_vec(state).map_err(|e| TrainError::Internal(e.to_string()))?;
        let all = trainer.collective().all_gather(mine)?;
        // The model version to publish (`trainer.export`): under local SGD the mean of the
        // replicas, which every rank takes part in computing.
        let export = match &self.job.trainer.export {
            Some(_) => {
                let step = trainer.steps();
                Some(trainer.with_averaged(|t| weights(t.params(), step))?)
            }
            None => None,
        };
        // Each rank's own state (error-feedback residuals, local-SGD replicas), when any.
        let own = if trainer.has_rank_state() {
            let mine = encode(
                &crate::checkpoint::CheckpointMeta::empty(),
                &trainer.rank_state_tensors(),
            )?;
            trainer.collective().all_gather(mine)?
        } else {
            Vec::new()
        };
        let written = if self.rank == 0 {
            self.write_checkpoint(trainer, loc, (&all, &own), rows_trained, complete)
                .and_then(|meta| match export {
                    Some(w) => self.publish(&meta, w),
                    None => Ok(()),
                })
        } else {
            Ok(())
        };
        // The outcome, from rank 0: empty = durable, else the error.
        let mut outcome = match &written {
            Ok(()) => Vec::new(),
            Err(e) => e.to_string().into_bytes(),
        };
        trainer.collective().broadcast(&mut outcome, 0)?;
        written?;
        if outcome.is_empty() {
            Ok(())
        } else {
            Err(TrainError::Checkpoint(format!(
                "rank 0 could not write the checkpoint: {}",
                String::from_utf8_lossy(&outcome)
            )))
        }
    }

    /// Rank 0's part: the checkpoint of every rank's position (`states`, as gathered), the
    /// trainer's step and tensors, written to `loc` in one put.
    fn write_checkpoint(
        &self,
        trainer: &Trainer,
        file: &CheckpointFile,
        (states, own): (&[Vec<u8>], &[Vec<u8>]),
        rows_trained: u64,
        complete: bool,
    ) -> Result<CheckpointMeta, TrainError> {
        let pipeline = states
            .iter()
            .map(|b| serde_json::from_slice::<SourceState>(b))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| TrainError::Internal(format!("a rank sent a bad pipeline state: {e}")))?;
        let meta = CheckpointMeta {
            version: 1,
            step: trainer.steps(),
            world_size: self.world,
            pipeline,
            rows_trained,
            complete,
            epoch: self.epoch,
            sync: (!own.is_empty()).then(|| trainer.sync_description()),
        };
        let mut tensors = trainer.state_tensors();
        for (rank, bytes) in own.iter().enumerate() {
            let (_, theirs) = decode(bytes)
                .map_err(|e| TrainError::Internal(format!("rank {rank}'s own state: {e}")))?;
            tensors.extend(
                theirs
                    .into_iter()
                    .map(|(n, t)| (format!("rank{rank}.{n}"), t)),
            );
        }
        let bytes = encode(&meta, &tensors)?;
        self.handle
            .block_on(file.write(bytes))
            .map_err(TrainError::from)?;
        crate::export::write_beside(file, self.handle, &tensors, meta.step)?;
        tracing::info!(step = meta.step, url = %file.url(), "checkpoint written");
        Ok(meta)
    }

    /// Rank 0's `trainer.export`: the checkpoint `meta` also published as a model version —
    /// weights, manifest, then `LATEST` pointed at it (see [`crate::export`]).
    fn publish(&self, meta: &CheckpointMeta, weights: Vec<u8>) -> Result<(), TrainError> {
        let Some(ex) = &self.job.trainer.export else {
            return Ok(());
        };
        let version = version_name(meta.step);
        let put = |name: &str, bytes: Vec<u8>| -> Result<(), TrainError> {
            let spec = format!("{}/{name}", ex.path.trim_end_matches('/'));
            let file = CheckpointFile::new(resolve(&spec, &self.job.base_dir, &ex.storage)?);
            self.handle
                .block_on(file.write(bytes))
                .map_err(TrainError::from)
        };
        let manifest = Manifest {
            format: "sluice-model-version/1",
            step: meta.step,
            rows_trained: meta.rows_trained,
            complete: meta.complete,
            weights: WEIGHTS,
            eval: self.last_eval.clone(),
            pipeline: meta.pipeline.clone(),
            written_unix_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis()),
            sluice_version: env!("CARGO_PKG_VERSION"),
        };
        put(&format!("{version}/{WEIGHTS}"), weights)?;
        put(&format!("{version}/{MANIFEST}"), to_json(&manifest)?)?;
        let latest = serde_json::json!({"version": version, "step": meta.step});
        put(LATEST, to_json(&latest)?)?;
        tracing::info!(step = meta.step, version, "model version published");
        Ok(())
    }
}

/// Checkpoints the position after the last step (not complete) and, once it is durable, lets
/// the Kafka offsets it covers be committed.
pub(super) fn checkpoint_step(ctx: &mut Ctx<'_>, run: &mut Run<'_>) -> Result<(), TrainError> {
    let pending = Pending::at(&run.acker, run.last_state.clone());
    ctx.checkpoint(
        &mut run.trainer,
        &run.location,
        pending.state(),
        run.rows_trained,
        false,
    )?;
    pending.acknowledge(false);
    Ok(())
}

/// Pretty JSON and a final newline, for a file people read too.
fn to_json(v: &impl serde::Serialize) -> Result<Vec<u8>, TrainError> {
    let mut out = serde_json::to_vec_pretty(v).map_err(|e| TrainError::Internal(e.to_string()))?;
    out.push(b'\n');
    Ok(out)
}
