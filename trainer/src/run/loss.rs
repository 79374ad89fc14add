//! The loss of the model's output against the target tensor, for training and evaluation.

use tch::{Kind, Reduction, Tensor};

use crate::TrainError;
use crate::config::Loss;

/// Whether `y` holds class probabilities for the logits `out` (a float row per output: one-hot,
/// smoothed or mixup-blended labels) rather than class indices.
pub(super) fn soft_labels(out: &Tensor, y: &Tensor) -> bool {
    y.is_floating_point() && y.dim() == 2 && y.size() == out.size()
}

/// The loss of the model's output `out` against the target `y`, or, when they do not fit
/// together, an error naming both shapes and what the loss expects.
pub(super) fn loss_of(
    loss: Loss,
    out: &Tensor,
    y: &Tensor,
    target: &str,
    reduction: Reduction,
) -> Result<Tensor, TrainError> {
    let computed = match loss {
        Loss::CrossEntropy if soft_labels(out, y) => {
            let k = out.kind();
            let per_row = -(y.to_kind(k) * out.log_softmax(-1, k)).sum_dim_intlist(-1, false, k);
            Ok(match reduction {
                Reduction::Sum => per_row.sum(k),
                _ => per_row.mean(k),
            })
        }
        Loss::CrossEntropy => y
            .f_to_kind(Kind::Int64)
            .and_then(|y| out.f_cross_entropy_loss::<Tensor>(&y, None, reduction, -100, 0.0)),
        Loss::Mse => y
            .f_to_kind(out.kind())
            .and_then(|y| y.f_view_as(out))
            .and_then(|y| out.f_mse_loss(&y, reduction)),
    };
    computed.map_err(|e| {
        let first = e.to_string();
        let first = first.lines().next().unwrap_or_default().to_string();
        let expects = match loss {
            Loss::CrossEntropy => format!(
                "`cross_entropy` takes class indices (an integer tensor of shape [{}]) or class probabilities (a float tensor shaped like the output: load a one-hot or mixup column with `dtype: f32`)",
                out.size().first().copied().unwrap_or(0)
            ),
            Loss::Mse => "`mse` takes a float tensor with as many values per row as the output".into(),
        };
        TrainError::Config(format!(
            "the target tensor `{target}` ({:?} {:?}) does not fit the model's output ({:?}): {expects}. libtorch: {first}",
            y.kind(),
            y.size(),
            out.size()
        ))
    })
}
