//! The model zoo: logistic regression, an MLP and a small ResNet-style CNN.
//!
//! No batch norm: its running statistics are state outside the gradients and would drift
//! apart between data-parallel ranks; the CNN uses group norm, whose parameters are ordinary
//! weights. No dropout either, so a step is a pure function of (parameters, batch) and resume
//! is bitwise exact.

use tch::Tensor;
use tch::nn::{self, Module};

use crate::TrainError;
use crate::config::ModelConfig;

/// A network of the zoo, boxed.
pub type BoxModel = Box<dyn Module>;

/// Builds `config` under `path` for rows of shape `input` (without the batch dimension).
pub fn build(
    path: &nn::Path<'_>,
    config: &ModelConfig,
    input: &[i64],
) -> Result<BoxModel, TrainError> {
    let flat: i64 = input.iter().product::<i64>().max(1);
    match config {
        ModelConfig::Logreg { outputs } => {
            let l = nn::linear(path / "linear", flat, *outputs, Default::default());
            Ok(Box::new(nn::seq().add_fn(|x| x.flatten(1, -1)).add(l)))
        }
        ModelConfig::Mlp { hidden, outputs } => {
            let mut seq = nn::seq().add_fn(|x| x.flatten(1, -1));
            let mut width = flat;
            for (i, h) in hidden.iter().enumerate() {
                seq = seq
                    .add(nn::linear(
                        path / format!("l{i}"),
                        width,
                        *h,
                        Default::default(),
                    ))
                    .add_fn(|x| x.relu());
                width = *h;
            }
            Ok(Box::new(seq.add(nn::linear(
                path / "out",
                width,
                *outputs,
                Default::default(),
            ))))
        }
        ModelConfig::Cnn {
            width,
            stages,
            outputs,
        } => {
            let shape: Vec<i64> = match input.len() {
                3 => input.to_vec(),
                2 => vec![1, input[0], input[1]],
                _ => {
                    return Err(TrainError::Config(format!(
                        "model `cnn` needs image rows of shape [channels, height, width] (or [height, width]); the input tensor's rows are {input:?}: give the loader tensor a `shape:`"
                    )));
                }
            };
            Ok(Box::new(cnn(path, &shape, *width, *stages, *outputs)))
        }
    }
}

fn gn(path: nn::Path<'_>, channels: i64) -> nn::GroupNorm {
    let groups = [8, 4, 2, 1]
        .into_iter()
        .find(|g| channels % g == 0)
        .unwrap_or(1);
    nn::group_norm(path, groups, channels, Default::default())
}

fn conv(path: nn::Path<'_>, i: i64, o: i64, stride: i64) -> nn::Conv2D {
    let c = nn::ConvConfig {
        stride,
        padding: 1,
        bias: false,
        ..Default::default()
    };
    nn::conv2d(path, i, o, 3, c)
}

/// `relu(x + gn(conv(relu(gn(conv(x))))))`.
fn residual(path: nn::Path<'_>, ch: i64) -> impl Module + use<> {
    let c1 = conv(&path / "c1", ch, ch, 1);
    let n1 = gn(&path / "n1", ch);
    let c2 = conv(&path / "c2", ch, ch, 1);
    let n2 = gn(&path / "n2", ch);
    nn::func(move |x| {
        let y = x.apply(&c1).apply(&n1).relu().apply(&c2).apply(&n2);
        (x + y).relu()
    })
}

fn cnn(
    path: &nn::Path<'_>,
    shape: &[i64],
    width: i64,
    stages: usize,
    outputs: i64,
) -> nn::Sequential {
    let (c, h, w) = (shape[0], shape[1], shape[2]);
    let mut seq = nn::seq()
        .add_fn(move |x| x.view([-1, c, h, w]))
        .add(conv(path / "stem", c, width, 1))
        .add(gn(path / "stem_norm", width))
        .add_fn(|x| x.relu())
        .add(residual(path / "block0", width));
    let mut ch = width;
    for s in 0..stages {
        let out = ch * 2;
        seq = seq
            .add(conv(path / format!("down{s}"), ch, out, 2))
            .add(gn(path / format!("down{s}_norm"), out))
            .add_fn(|x| x.relu())
            .add(residual(path / format!("block{}", s + 1), out));
        ch = out;
    }
    seq.add_fn(|x| x.adaptive_avg_pool2d([1, 1]).flatten(1, -1))
        .add(nn::linear(path / "head", ch, outputs, Default::default()))
}

/// Per-row shape of `t` (its shape without the batch dimension).
pub fn row_shape(t: &Tensor) -> Vec<i64> {
    t.size().into_iter().skip(1).collect()
}
