//! The `mpi` backend: one process per rank under `mpirun`.

use tokio::runtime::Handle;

use crate::TrainError;
use crate::run::{TrainJob, TrainOptions, TrainReport};

/// Runs this process's rank of an MPI job.
#[cfg(not(feature = "mpi"))]
pub(crate) fn train(
    _job: &TrainJob,
    _options: &TrainOptions,
    _handle: &Handle,
) -> Result<TrainReport, TrainError> {
    Err(TrainError::Config(
        "trainer.allreduce.backend: mpi needs a sluice built with the `mpi` feature (cargo build --features mpi, with OpenMPI installed: scripts/mpi.sh)".into(),
    ))
}
