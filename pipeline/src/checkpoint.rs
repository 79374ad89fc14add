//! The checkpoint protocol `sluice run` and `sluice train` share, in three steps whose order is
//! the guarantee:
//!
//! 1. **durable:** the output up to a position is made durable (a sink's flush; a training
//!    step's parameters are what the checkpoint itself holds);
//! 2. **recorded:** a checkpoint naming that position is written in one atomic put
//!    ([`CheckpointFile::write`]: the local store writes a temporary file and renames it, an
//!    object store makes an object visible whole);
//! 3. **acknowledged:** only then is the position acknowledged ([`Pending::acknowledge`]), which
//!    lets a Kafka source commit the offsets it covers.
//!
//! A crash between any two steps replays from the previous checkpoint and loses nothing: rows
//! made durable but not recorded are written again under the same names (part files are
//! numbered from the checkpoint), and offsets are never committed past a checkpoint.
//! [`Pending`] carries the one position snapshot from step 1 to step 3, so the position
//! acknowledged is always the one recorded. What a checkpoint holds is each command's own
//! (`sluice run`: JSON of positions and part numbering; `sluice train`: tensors too).

use bytes::Bytes;
use object_store::{ObjectStoreExt, PutPayload};

use crate::state::{Acknowledger, SourceState};
use crate::storage::ObjectLocation;

/// Why a checkpoint could not be read or written: `message` says what happened to the file
/// at `url` and what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("checkpoint {url}: {message}")]
pub struct CheckpointFileError {
    /// The checkpoint's URL.
    pub url: String,
    /// What went wrong, and what to do.
    pub message: String,
}

/// Where a run's checkpoint lives.
#[derive(Debug, Clone)]
pub struct CheckpointFile {
    location: ObjectLocation,
}

impl CheckpointFile {
    /// The checkpoint at `location`.
    pub fn new(location: ObjectLocation) -> CheckpointFile {
        CheckpointFile { location }
    }

    /// Its URL, for messages.
    pub fn url(&self) -> String {
        self.location.url.to_string()
    }

    fn error(&self, message: String) -> CheckpointFileError {
        CheckpointFileError {
            url: self.url(),
            message,
        }
    }

    /// What an earlier run recorded, at the start of a run: `None` when there is nothing yet
    /// (said in a warning with `resume`: `--resume: no checkpoint at … yet: {fresh}`). A
    /// checkpoint without `resume` is refused: a second run must not silently overwrite
    /// the first one's record, nor silently start over.
    pub async fn read_at_start(
        &self,
        resume: bool,
        fresh: &str,
    ) -> Result<Option<Bytes>, CheckpointFileError> {
        let loc = &self.location;
        match loc.store.get(&loc.path).await {
            Ok(got) => {
                if !resume {
                    return Err(self.error(
                        "exists from an earlier run: pass --resume to continue from it, or delete it to start over".into(),
                    ));
                }
                let bytes = got
                    .bytes()
                    .await
                    .map_err(|e| self.error(format!("cannot read it: {e}")))?;
                Ok(Some(bytes))
            }
            Err(object_store::Error::NotFound { .. }) => {
                if resume {
                    tracing::warn!("--resume: no checkpoint at {} yet: {fresh}", loc.url);
                }
                Ok(None)
            }
            Err(e) => Err(self.error(format!("cannot read it: {e}"))),
        }
    }

    /// Step 2: writes `bytes` in one atomic put.
    pub async fn write(&self, bytes: Vec<u8>) -> Result<(), CheckpointFileError> {
        let loc = &self.location;
        loc.store
            .put(&loc.path, PutPayload::from(bytes))
            .await
            .map_err(|e| self.error(format!("cannot write it: {e}")))?;
        Ok(())
    }

    /// Where it is.
    pub fn location(&self) -> &ObjectLocation {
        &self.location
    }
}

/// A position between step 1 (its output is durable) and step 3 (it is acknowledged).
#[must_use = "a position that is never acknowledged never lets its Kafka offsets be committed"]
#[derive(Debug)]
pub struct Pending<'a> {
    acker: &'a Acknowledger,
    state: SourceState,
}

impl<'a> Pending<'a> {
    /// Step 1 done for everything `acker` has observed: its position now.
    pub fn observed(acker: &'a Acknowledger) -> Pending<'a> {
        Pending {
            state: acker.state(),
            acker,
        }
    }

    /// Step 1 done up to `state` (a position the caller tracked itself).
    pub fn at(acker: &'a Acknowledger, state: SourceState) -> Pending<'a> {
        Pending { acker, state }
    }

    /// The position, for the checkpoint to record.
    pub fn state(&self) -> &SourceState {
        &self.state
    }

    /// Step 3, once the checkpoint recording [`Pending::state`] is written (or when the run
    /// keeps none): lets the source commit what it covers; `final_commit` commits
    /// synchronously (the end of a run).
    pub fn acknowledge(self, final_commit: bool) {
        self.acker.store(&self.state, final_commit);
    }
}
