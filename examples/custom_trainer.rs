//! A hand-written training loop on Sluice's tensor stream: an MLP on the bundled digits.
//!
//! ```sh
//! scripts/libtorch.sh   # once: CPU libtorch for tch
//! LIBTORCH=$(scripts/libtorch.sh) cargo run --example custom_trainer
//! ```
//!
//! The pipeline (shuffled, standardized digits, 5 epochs) becomes named tensors — `x`
//! `[batch, 64]` float32 and `y` `[batch]` int64 — prefetched by the loader while the step
//! runs. Each `TensorBatch` carries the pipeline state just past it (what a checkpoint stores)
//! and how long the loop waited for it. Prints the mean loss per epoch, the data-stall
//! fraction and the accuracy on the test split.
#![allow(clippy::print_stdout)]

use futures::StreamExt;
use sluice::loader::{LoaderConfig, TensorStream};
use sluice::pipeline::Pipeline;
use tch::nn::{self, Module, OptimizerConfig};
use tch::{Device, Kind, Tensor};

const EPOCHS: u64 = 5;

fn pipeline(split: &str, epochs: u64, shuffle: bool) -> String {
    let data = format!("{}/data/digits/{split}.parquet", env!("CARGO_MANIFEST_DIR"));
    let shuffle = if shuffle {
        "  - {type: shuffle, buffer_rows: 1024, seed: 1}\n"
    } else {
        ""
    };
    format!(
        "source: {{type: parquet, path: '{data}', columns: [label, pixels], epochs: {epochs}}}\n\
         stages:\n\
         \x20 - {{type: cast, columns: {{pixels: float32}}}}\n\
         \x20 - {{type: standardize, columns: [pixels], mean: 4.88, std: 6.02}}\n\
         {shuffle}\
         \x20 - {{type: batch, size: 64}}\n\
         runtime: {{threads: 2}}\n"
    )
}

const LOADER: &str = "device: auto\nprefetch: 2\ntensors:\n  x: {column: pixels, dtype: f32}\n  y: {column: label, dtype: i64}\n";

async fn tensors(yaml: &str) -> Result<TensorStream, Box<dyn std::error::Error>> {
    let prepared = Pipeline::from_yaml(yaml)?.prepare().await?;
    let pool = prepared.pool().clone();
    let loader = LoaderConfig::from_yaml(LOADER)?;
    Ok(TensorStream::new(prepared.stream(), pool, &loader)?)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tch::manual_seed(0);
    tch::set_num_threads(1);
    let device = Device::cuda_if_available();
    let vs = nn::VarStore::new(device);
    let root = vs.root();
    let model = nn::seq()
        .add(nn::linear(&root / "l1", 64, 128, Default::default()))
        .add_fn(|x| x.relu())
        .add(nn::linear(&root / "l2", 128, 10, Default::default()));
    let mut opt = nn::Adam::default().build(&vs, 1e-3)?;

    let mut stream = tensors(&pipeline("train", EPOCHS, true)).await?;
    let stats = stream.stats();
    let (mut epoch, mut sum, mut n) = (0u64, 0.0, 0usize);
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        let e = batch
            .lineage
            .spans()
            .first()
            .map(|s| s.epoch)
            .unwrap_or(epoch);
        if e != epoch && n > 0 {
            println!("epoch {epoch} loss {:.4}", sum / n as f64);
            (sum, n) = (0.0, 0);
            epoch = e;
        }
        let (x, y) = (&batch.tensors["x"], &batch.tensors["y"]);
        let loss = model.forward(x).cross_entropy_for_logits(y);
        opt.backward_step(&loss);
        sum += loss.double_value(&[]);
        n += 1;
    }
    println!("epoch {epoch} loss {:.4}", sum / n.max(1) as f64);
    println!(
        "data stall {:.2}% of the loop's time",
        100.0 * stats.stall_fraction()
    );

    let mut test = tensors(&pipeline("test", 1, false)).await?;
    let (mut correct, mut total) = (0i64, 0i64);
    while let Some(batch) = test.next().await {
        let batch = batch?;
        let logits = tch::no_grad(|| model.forward(&batch.tensors["x"]));
        let hits = logits
            .argmax(-1, false)
            .eq_tensor(&batch.tensors["y"])
            .to_kind(Kind::Int64)
            .sum(Kind::Int64);
        correct += hits.int64_value(&[]);
        total += batch.rows as i64;
    }
    let _ = Tensor::zeros([1], (Kind::Float, device));
    println!(
        "test accuracy {:.4} ({correct}/{total})",
        correct as f64 / total as f64
    );
    Ok(())
}
