//! `sluice train` and libtorch: training, resume, stops, Kafka and S3 inputs, MPI, parity with libtorch's kernels.
//!
//! One test binary for several files (each file its own module, as it was its own binary
//! before): every integration-test binary links all of Sluice and libtorch's wrappers, ~100 MB
//! each, and thirty of them filled CI's disk. Timing-sensitive files keep binaries of their
//! own (`shuffle_memory`, `bench`).

mod common;

#[path = "sweep.rs"]
mod sweep;
#[path = "torch_parity.rs"]
mod torch_parity;
#[path = "train.rs"]
mod train;
#[path = "train_inputs.rs"]
mod train_inputs;
#[path = "train_kafka.rs"]
mod train_kafka;
#[path = "train_mpi.rs"]
mod train_mpi;
#[path = "train_s3.rs"]
mod train_s3;
#[path = "train_stop.rs"]
mod train_stop;
#[path = "train_sync.rs"]
mod train_sync;
