//! Collective communication between the ranks of a data-parallel job: what the cross-rank
//! shuffle exchanges rows with and what the trainer averages gradients with.
//!
//! The trait is blocking, like MPI and NCCL's host API: callers on async code wrap a call in
//! `spawn_blocking`. Every rank must call the same operations in the same order (the usual
//! collective contract); a rank that leaves the group (its handle dropped, or its thread
//! panicking) makes the other ranks' pending and later calls fail with
//! [`CollectiveError::Abandoned`] instead of hanging.
//!
//! Backends: [`local`] (ranks as threads of one process, shared memory — the embedded
//! default); `mpi` (OpenMPI, many machines) comes with the trainer; a NCCL backend for GPUs can
//! implement the same trait (device buffers would need their own methods; the byte/f32/f16
//! signatures here are the host-side contract).

pub mod local;

use half::f16;

pub use local::LocalCollective;

/// Why a collective operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CollectiveError {
    /// Another rank left the group (dropped its handle or panicked) before completing the
    /// operation.
    #[error("collective: rank {rank} left the group during `{op}`; the job cannot continue")]
    Abandoned { rank: usize, op: &'static str },
    /// The ranks disagreed about an operation (different operations, lengths or roots).
    #[error("collective: ranks disagree in `{op}`: {detail}")]
    Mismatch { op: &'static str, detail: String },
    /// The backend failed.
    #[error("collective backend: {0}")]
    Backend(String),
}

/// Result alias of collective operations.
pub type CollectiveResult<T> = Result<T, CollectiveError>;

/// Collective operations among `world_size` ranks. All methods block until every rank has
/// made the same call.
pub trait Collective: Send + Sync + std::fmt::Debug {
    /// This rank, `0..world_size`.
    fn rank(&self) -> usize;

    /// Number of ranks.
    fn world_size(&self) -> usize;

    /// Element-wise sum over all ranks, in place; every rank ends with the same bits (the sum
    /// is taken in rank order). Lengths must agree.
    fn all_reduce_f32(&self, buf: &mut [f32]) -> CollectiveResult<()>;

    /// As [`Collective::all_reduce_f32`] for half precision (gradient compression); the sum is
    /// accumulated in f32 and rounded once.
    fn all_reduce_f16(&self, buf: &mut [f16]) -> CollectiveResult<()>;

    /// Personalised all-to-all: `send[r]` goes to rank `r`; returns what every rank sent to
    /// this one, indexed by source rank. `send.len()` must equal `world_size`.
    fn all_to_all_v(&self, send: Vec<Vec<u8>>) -> CollectiveResult<Vec<Vec<u8>>>;

    /// Every rank's `data`, indexed by rank.
    fn all_gather(&self, data: Vec<u8>) -> CollectiveResult<Vec<Vec<u8>>>;

    /// Replaces `buf` on every rank with `root`'s.
    fn broadcast(&self, buf: &mut Vec<u8>, root: usize) -> CollectiveResult<()>;

    /// Returns once every rank has called it.
    fn barrier(&self) -> CollectiveResult<()>;

    /// The minimum of `value` over all ranks (e.g. the number of batches every rank can
    /// produce, so that all ranks run the same number of steps).
    fn all_min_u64(&self, value: u64) -> CollectiveResult<u64> {
        let all = self.all_gather(value.to_le_bytes().to_vec())?;
        all.iter()
            .map(|b| {
                <[u8; 8]>::try_from(b.as_slice())
                    .map(u64::from_le_bytes)
                    .map_err(|_| CollectiveError::Mismatch {
                        op: "all_min_u64",
                        detail: format!("a rank sent {} bytes", b.len()),
                    })
            })
            .try_fold(u64::MAX, |m, v| v.map(|v| m.min(v)))
    }
}

/// The trivial group of one rank: every operation returns at once.
#[derive(Debug, Default, Clone, Copy)]
pub struct SingleRank;

impl Collective for SingleRank {
    fn rank(&self) -> usize {
        0
    }
    fn world_size(&self) -> usize {
        1
    }
    fn all_reduce_f32(&self, _buf: &mut [f32]) -> CollectiveResult<()> {
        Ok(())
    }
    fn all_reduce_f16(&self, _buf: &mut [f16]) -> CollectiveResult<()> {
        Ok(())
    }
    fn all_to_all_v(&self, send: Vec<Vec<u8>>) -> CollectiveResult<Vec<Vec<u8>>> {
        if send.len() != 1 {
            return Err(CollectiveError::Mismatch {
                op: "all_to_all_v",
                detail: format!("{} destinations for a world of 1", send.len()),
            });
        }
        Ok(send)
    }
    fn all_gather(&self, data: Vec<u8>) -> CollectiveResult<Vec<Vec<u8>>> {
        Ok(vec![data])
    }
    fn broadcast(&self, _buf: &mut Vec<u8>, root: usize) -> CollectiveResult<()> {
        if root != 0 {
            return Err(CollectiveError::Mismatch {
                op: "broadcast",
                detail: format!("root {root} in a world of 1"),
            });
        }
        Ok(())
    }
    fn barrier(&self) -> CollectiveResult<()> {
        Ok(())
    }
}
