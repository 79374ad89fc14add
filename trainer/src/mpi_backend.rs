//! The `mpi` backend: one process per rank under `mpirun` (cargo feature `mpi`, OpenMPI
//! through the `mpi` crate).
//!
//! Two duplicates of `MPI_COMM_WORLD` carry the pipeline's row exchange and the trainer's
//! traffic, so they never interleave; both may be used from different threads at once, so MPI
//! is initialised with `MPI_THREAD_MULTIPLE` (and the run refuses to start without it).
//! Unlike the local backend, a failed rank cannot make the others' pending calls return: a
//! rank that fails prints its error and calls `MPI_Abort`, which ends the whole job.

#[cfg(feature = "mpi")]
pub use imp::MpiCollective;

#[cfg(feature = "mpi")]
pub(crate) use imp::with_world;

/// What a rank of an `mpirun` job runs, given its rank and its two collectives (the
/// trainer's and the pipeline's).
pub(crate) type RankFn<'a, T> = Box<
    dyn FnOnce(
            usize,
            std::sync::Arc<dyn sluice_pipeline::collective::Collective>,
            std::sync::Arc<dyn sluice_pipeline::collective::Collective>,
        ) -> Result<T, crate::TrainError>
        + 'a,
>;

#[cfg(not(feature = "mpi"))]
pub(crate) fn with_world<T>(_rank: RankFn<'_, T>) -> Result<T, crate::TrainError> {
    Err(crate::TrainError::Config(
        "trainer.allreduce.backend: mpi needs a sluice built with the `mpi` feature (cargo build --release --features mpi, with OpenMPI installed: scripts/mpi.sh)".into(),
    ))
}

#[cfg(feature = "mpi")]
mod imp {
    use std::sync::Arc;

    use half::f16;
    use mpi::Threading;
    use mpi::collective::SystemOperation;
    use mpi::datatype::{Partition, PartitionMut};
    use mpi::topology::SimpleCommunicator;
    use mpi::traits::*;
    use sluice_pipeline::collective::{Collective, CollectiveError, CollectiveResult};

    use super::RankFn;
    use crate::TrainError;

    /// MPI counts are 32-bit: larger transfers go in pieces of this many elements.
    const CHUNK: usize = 1 << 28;

    /// One rank's handle on an MPI communicator.
    pub struct MpiCollective {
        comm: SimpleCommunicator,
        rank: usize,
        world: usize,
    }

    // SAFETY: an MPI communicator is a process-wide handle, not tied to the thread that made
    // it. `train` initialises MPI with MPI_THREAD_MULTIPLE (and refuses to run otherwise), under
    // which MPI permits calls on it from any thread, concurrently. Each operation below is one
    // collective call sequence on `comm`; callers issue a communicator's collectives in the same
    // order on every rank (the `Collective` contract), one at a time per communicator.
    #[allow(unsafe_code)]
    unsafe impl Send for MpiCollective {}
    // SAFETY: as above.
    #[allow(unsafe_code)]
    unsafe impl Sync for MpiCollective {}

    impl std::fmt::Debug for MpiCollective {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "MpiCollective(rank {} of {})", self.rank, self.world)
        }
    }

    impl MpiCollective {
        /// Wraps a communicator (a duplicate of the world, usually).
        pub fn new(comm: SimpleCommunicator) -> Self {
            let rank = comm.rank() as usize;
            let world = comm.size() as usize;
            MpiCollective { comm, rank, world }
        }

        fn count(n: usize, op: &'static str) -> CollectiveResult<i32> {
            i32::try_from(n).map_err(|_| CollectiveError::Backend(format!(
                "{op}: {n} bytes to one rank exceed MPI's 32-bit counts; use smaller shuffle windows"
            )))
        }
    }

    impl Collective for MpiCollective {
        fn rank(&self) -> usize {
            self.rank
        }
        fn world_size(&self) -> usize {
            self.world
        }

        fn all_reduce_f32(&self, buf: &mut [f32]) -> CollectiveResult<()> {
            // rsmpi has no in-place all-reduce: a send copy per chunk.
            for chunk in buf.chunks_mut(CHUNK) {
                let send = chunk.to_vec();
                self.comm
                    .all_reduce_into(&send[..], chunk, SystemOperation::sum());
            }
            Ok(())
        }

        fn all_reduce_f16(&self, buf: &mut [f16]) -> CollectiveResult<()> {
            // MPI has no half type: gather every rank's halves and sum them in rank order in
            // f32, rounding once — bitwise what the local backend computes, on every rank.
            let w = self.world;
            for chunk in buf.chunks_mut(CHUNK / w.max(1)) {
                let send: Vec<u16> = chunk.iter().map(|x| x.to_bits()).collect();
                let mut recv = vec![0u16; send.len() * w];
                self.comm.all_gather_into(&send[..], &mut recv[..]);
                for (i, out) in chunk.iter_mut().enumerate() {
                    let mut acc = 0.0f32;
                    for r in 0..w {
                        acc += f16::from_bits(recv[r * send.len() + i]).to_f32();
                    }
                    *out = f16::from_f32(acc);
                }
            }
            Ok(())
        }

        fn all_to_all_v(&self, send: Vec<Vec<u8>>) -> CollectiveResult<Vec<Vec<u8>>> {
            if send.len() != self.world {
                return Err(CollectiveError::Mismatch {
                    op: "all_to_all_v",
                    detail: format!("{} buffers for {} ranks", send.len(), self.world),
                });
            }
            let counts: Vec<i32> = send
                .iter()
                .map(|b| Self::count(b.len(), "all_to_all_v"))
                .collect::<Result<_, _>>()?;
            let mut recv_counts = vec![0i32; self.world];
            self.comm.all_to_all_into(&counts[..], &mut recv_counts[..]);
            let displs = |c: &[i32]| -> CollectiveResult<Vec<i32>> {
                let mut d = Vec::with_capacity(c.len());
                let mut at = 0usize;
                for &n in c {
                    d.push(Self::count(at, "all_to_all_v")?);
                    at += n as usize;
                }
                Ok(d)
            };
            let flat: Vec<u8> = send.concat();
            let sdispl = displs(&counts)?;
            let rdispl = displs(&recv_counts)?;
            let total: usize = recv_counts.iter().map(|&n| n as usize).sum();
            let mut out = vec![0u8; total];
            {
                let sp = Partition::new(&flat[..], &counts[..], &sdispl[..]);
                let mut rp = PartitionMut::new(&mut out[..], &recv_counts[..], &rdispl[..]);
                self.comm.all_to_all_varcount_into(&sp, &mut rp);
            }
            Ok(split(&out, &recv_counts))
        }

        fn all_gather(&self, data: Vec<u8>) -> CollectiveResult<Vec<Vec<u8>>> {
            let mine = Self::count(data.len(), "all_gather")?;
            let mut counts = vec![0i32; self.world];
            self.comm.all_gather_into(&mine, &mut counts[..]);
            let mut displs = Vec::with_capacity(self.world);
            let mut at = 0usize;
            for &n in &counts {
                displs.push(Self::count(at, "all_gather")?);
                at += n as usize;
            }
            let mut out = vec![0u8; at];
            {
                let mut rp = PartitionMut::new(&mut out[..], &counts[..], &displs[..]);
                self.comm.all_gather_varcount_into(&data[..], &mut rp);
            }
            Ok(split(&out, &counts))
        }

        fn broadcast(&self, buf: &mut Vec<u8>, root: usize) -> CollectiveResult<()> {
            let root_proc = self.comm.process_at_rank(root as i32);
            let mut len = buf.len() as u64;
            root_proc.broadcast_into(&mut len);
            buf.resize(len as usize, 0);
            for chunk in buf.chunks_mut(CHUNK) {
                root_proc.broadcast_into(chunk);
            }
            Ok(())
        }

        fn barrier(&self) -> CollectiveResult<()> {
            self.comm.barrier();
            Ok(())
        }
    }

    fn split(flat: &[u8], counts: &[i32]) -> Vec<Vec<u8>> {
        let mut out = Vec::with_capacity(counts.len());
        let mut at = 0usize;
        for &n in counts {
            out.push(flat[at..at + n as usize].to_vec());
            at += n as usize;
        }
        out
    }

    /// Runs `rank` as this process's rank of an `mpirun` job, on two duplicates of the
    /// world; MPI is finalised when it returns. A failed rank cannot make the others' pending
    /// calls return, so an error is printed and the whole job aborted.
    pub(crate) fn with_world<T>(rank: RankFn<'_, T>) -> Result<T, TrainError> {
        let (universe, threading) = mpi::initialize_with_threading(Threading::Multiple)
            .ok_or_else(|| {
                TrainError::Config("MPI was already initialised in this process".into())
            })?;
        if threading != Threading::Multiple {
            return Err(TrainError::Config(format!(
                "this MPI provides thread level {threading:?}; Sluice needs MPI_THREAD_MULTIPLE (OpenMPI ≥ 4 provides it)"
            )));
        }
        let world = universe.world();
        let grads = MpiCollective::new(world.duplicate());
        let data = MpiCollective::new(world.duplicate());
        let me = grads.rank;
        match rank(me, Arc::new(grads), Arc::new(data)) {
            Ok(v) => Ok(v),
            Err(e) => {
                // The other ranks may be blocked in a collective that can never complete.
                eprintln!("error: rank {me}: {e}");
                world.abort(1)
            }
        }
    }
}
