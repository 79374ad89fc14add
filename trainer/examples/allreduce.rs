//! All-reduce bus bandwidth of the collective backends for 1, 16 and 100 MB f32 buffers.
//!
//! ```sh
//! cargo run --release -p sluice-trainer --example allreduce             # local, 2 ranks
//! cargo build --release -p sluice-trainer --features mpi --example allreduce
//! mpirun -np 2 target/release/examples/allreduce                         # mpi, 2 ranks
//! ```
//!
//! Bus bandwidth = bytes × 2(n−1)/n ÷ time (NCCL's convention: comparable across rank
//! counts; for 2 ranks it equals the buffer size over the time).
#![allow(clippy::print_stdout, clippy::unwrap_used)]

use std::time::Instant;

use sluice_pipeline::collective::{Collective, LocalCollective};

const SIZES_MB: [usize; 3] = [1, 16, 100];

fn measure(c: &dyn Collective) -> Vec<(usize, f64, f64)> {
    let mut out = Vec::new();
    for mb in SIZES_MB {
        let n = mb * 1_000_000 / 4;
        let mut buf = vec![1.0f32; n];
        c.all_reduce_f32(&mut buf).unwrap(); // warm-up (page faults, connections)
        let iters = (200 / mb).clamp(3, 50);
        c.barrier().unwrap();
        let t = Instant::now();
        for _ in 0..iters {
            c.all_reduce_f32(&mut buf).unwrap();
        }
        let secs = t.elapsed().as_secs_f64() / iters as f64;
        let w = c.world_size() as f64;
        let bus = (mb as f64 * 1e6) * 2.0 * (w - 1.0) / w / secs / 1e9;
        out.push((mb, secs * 1e3, bus));
    }
    out
}

fn print(backend: &str, world: usize, rows: &[(usize, f64, f64)]) {
    println!("backend {backend}, {world} ranks");
    println!("  {:>8}  {:>10}  {:>12}", "size", "time", "bus bw");
    for (mb, ms, bus) in rows {
        println!("  {:>5} MB  {:>7.2} ms  {:>7.2} GB/s", mb, ms, bus);
    }
}

fn main() {
    #[cfg(feature = "mpi")]
    if std::env::var_os("OMPI_COMM_WORLD_SIZE").is_some() {
        let universe = mpi::initialize().unwrap();
        let c = sluice_trainer::MpiCollective::new(universe.world());
        let rows = measure(&c);
        if c.rank() == 0 {
            print("mpi", c.world_size(), &rows);
        }
        return;
    }
    let group = LocalCollective::group(2);
    let rows = std::thread::scope(|s| {
        let hs: Vec<_> = group
            .into_iter()
            .map(|c| s.spawn(move || measure(&c)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).next().unwrap()
    });
    print("local", 2, &rows);
}
