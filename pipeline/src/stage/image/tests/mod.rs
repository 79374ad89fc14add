//! Tests of the `image` stage: building it from its config, decoding, every op against
//! torchvision's arithmetic, and bad rows. This module holds the helpers the topic files
//! share: batches of raw images, building the stage, and reading its output.

use super::*;
use crate::batch::{Lineage, Name, Origin};
use arrow::array::{AsArray, FixedSizeBinaryArray};
use arrow::datatypes::Float32Type;

mod colour_ops;
mod crop;
mod decoding;
mod flip_resize;
mod output;
mod random_erasing;

pub(super) fn stage_ref() -> StageRef {
    StageRef {
        index: 0,
        kind: "image",
        location: None,
    }
}

/// A batch of `rows` raw images; `pixel(row, y, x, c)` gives the bytes.
pub(super) fn batch(
    shape: [usize; 3],
    rows: usize,
    pixel: impl Fn(usize, usize, usize, usize) -> u8,
) -> Batch {
    let [h, w, ch] = shape;
    let values: Vec<Vec<u8>> = (0..rows)
        .map(|r| {
            let mut v = Vec::with_capacity(h * w * ch);
            for y in 0..h {
                for x in 0..w {
                    for c in 0..ch {
                        v.push(pixel(r, y, x, c));
                    }
                }
            }
            v
        })
        .collect();
    let arr = FixedSizeBinaryArray::try_from_iter(values.into_iter()).unwrap();
    let data = RecordBatch::try_from_iter([("img", Arc::new(arr) as ArrayRef)]).unwrap();
    let origin = Origin::Object {
        url: Name::from("file:///imgs.parquet"),
        row_group: 0,
    };
    Batch::new(data, Lineage::new(origin, 0, rows as u64, 0))
}

pub(super) fn build_stage(
    shape: [usize; 3],
    input: &Batch,
    ops: Vec<ImageOp>,
    on_error: OnError,
    format: ImageFormat,
) -> ImageStage {
    try_build(config(shape, ops, on_error, format), input)
        .unwrap()
        .0
}

/// The stage `c` builds over `input`'s schema.
pub(super) fn try_build(c: ImageConfig, input: &Batch) -> Result<(ImageStage, SchemaRef)> {
    build(
        &stage_ref(),
        &c,
        &input.data.schema(),
        &crate::stage::BuildContext::default(),
    )
}

pub(super) fn config(
    shape: [usize; 3],
    ops: Vec<ImageOp>,
    on_error: OnError,
    format: ImageFormat,
) -> ImageConfig {
    ImageConfig {
        column: "img".into(),
        output: None,
        format,
        shape,
        ops,
        seed: 7,
        dtype: ImageDtype::Float32,
        augment_on: AugmentOn::Host,
        on_error,
        dead_letter: None,
    }
}

/// Why a raw-image stage with these ops is refused.
pub(super) fn refusal(shape: [usize; 3], input: &Batch, ops: Vec<ImageOp>) -> String {
    try_build(config(shape, ops, OnError::Fail, ImageFormat::Raw), input)
        .unwrap_err()
        .to_string()
}

/// Output row `r` as a CHW vector.
pub(super) fn row(b: &Batch, r: usize) -> Vec<f32> {
    let l = b.data.column(0).as_fixed_size_list();
    l.value(r).as_primitive::<Float32Type>().values().to_vec()
}

/// Identity scaling: normalize with mean 0, std 1/255 outputs the raw 0–255 values.
pub(super) fn identity(ch: usize) -> ImageOp {
    ImageOp::Normalize {
        mean: vec![0.0; ch],
        std: vec![1.0 / 255.0; ch],
    }
}
