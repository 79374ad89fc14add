//! `augment_on: device`: the stage decodes and draws here, the tensor loader applies.
//!
//! Per row the stage draws the crop and the flips exactly as `augment_on: host` does (same
//! key, same stream, same op order) and turns them into the source row and column every output
//! pixel reads — through the same [`Geometry`](super::geometry::Geometry) mapping, padding
//! modes included, `-1` where the constant fill goes. It hands out the decoded HWC `uint8`
//! pixels and those indices; [`DeviceImage`], in the output field's metadata, tells the loader
//! what to do with them: one gather (crop, flips, padding), the fill, the conversion to
//! float32 and the per-channel `v * scale + bias` of `normalize` — the arithmetic of the host
//! path, so both give the same bits.

use std::sync::Arc;

use arrow::array::{Int32Array, UInt8Array};
use arrow::datatypes::Field;
use chacha20::ChaCha8Rng;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};

use super::ImageStage;
use super::decode::raw_bytes;
use super::settings::ImageDtype;
use crate::batch::Batch;
use crate::error::Result;
use crate::stage::augment::row_ids;

/// The output field's metadata key under which [`DeviceImage`] is stored (JSON).
pub const DEVICE_IMAGE_KEY: &str = "sluice.image.device";

/// What the tensor loader does with an `image` column of `augment_on: device`: stored as JSON
/// in the column's field metadata ([`DEVICE_IMAGE_KEY`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceImage {
    /// The column's values: decoded images, `[height, width, channels]` `uint8`, interleaved.
    pub shape: [usize; 3],
    /// Output `[height, width]` (the crop's size, else the image's).
    pub out: [usize; 2],
    /// Output element type: `float32` (converted and normalized), `float16` (the same,
    /// rounded) or `uint8` (pixels).
    pub dtype: ImageDtype,
    /// Per channel: `v * scale + bias` of a 0–255 value (float32 and float16 only).
    pub scale: Vec<f32>,
    /// See `scale`.
    pub bias: Vec<f32>,
    /// Per channel: what constant padding holds, 0–255 (`uint8`: rounded).
    pub fill: Vec<f32>,
    /// The column of `fixed_size_list<int32>[out[0] + out[1]]`: per row, the source row of
    /// each output row, then the source column of each output column; `-1`: the fill.
    pub index: String,
}

impl DeviceImage {
    /// The spec a field carries, if any (`Err`: metadata that is not a spec of this Sluice).
    pub fn of(field: &Field) -> Option<std::result::Result<DeviceImage, String>> {
        let text = field.metadata().get(DEVICE_IMAGE_KEY)?;
        Some(serde_json::from_str(text).map_err(|e| {
            format!(
                "column `{}`: its `{DEVICE_IMAGE_KEY}` metadata is not an image spec this Sluice reads ({e})",
                field.name()
            )
        }))
    }

    /// The metadata entry of this spec.
    pub(super) fn metadata(&self) -> std::collections::HashMap<String, String> {
        // Plain data: serializing cannot fail.
        let text = serde_json::to_string(self).unwrap_or_default();
        [(DEVICE_IMAGE_KEY.to_string(), text)].into()
    }
}

impl ImageStage {
    /// `augment_on: device`: decoded pixels and each row's source indices (bad rows: zeros
    /// and `-1`s, then handled by `on_error` like the host path's).
    pub(super) fn apply_deferred(&self, batch: Batch) -> Result<Batch> {
        let col = batch.data.column(self.input);
        let n = batch.num_rows();
        let [h, w, ch] = self.shape;
        let [oh, ow] = self.out_hw;
        let ids = row_ids(&batch.lineage);
        let mut pixels = vec![0u8; n * h * w * ch];
        let mut index = vec![-1i32; n * (oh + ow)];
        let mut owned = Vec::new();
        let mut rng = ChaCha8Rng::from_seed(self.key);
        let mut bad: Vec<(usize, String)> = Vec::new();
        let rows = pixels
            .chunks_exact_mut(h * w * ch)
            .zip(index.chunks_exact_mut(oh + ow));
        for ((r, id), (dst, idx)) in ids.iter().enumerate().zip(rows) {
            let decoded = match raw_bytes(col, r) {
                None => Err("the image is null".to_string()),
                Some(b) => self.decode(b, &mut owned),
            };
            let src = match decoded {
                Ok((src, sh, sw)) if (sh, sw) == (h, w) => src,
                Ok((_, sh, sw)) => {
                    bad.push((
                        r,
                        format!(
                            "the image is {sw}×{sh} (width×height); with `augment_on: device` every image must decode to the stage's {w}×{h}"
                        ),
                    ));
                    continue;
                }
                Err(e) => {
                    bad.push((r, e));
                    continue;
                }
            };
            dst.copy_from_slice(src);
            rng.set_stream(*id);
            let (g, _) = self.draw(&mut rng, h, w);
            let (top, left) = (g.top as i64, g.left as i64);
            let source = |i: Option<usize>| i.map_or(-1, |i| i as i32);
            for (y, v) in idx[..oh].iter_mut().enumerate() {
                let yy = if g.flip_v { oh - 1 - y } else { y };
                *v = source(g.source(top + yy as i64, h, 0));
            }
            for (x, v) in idx[oh..].iter_mut().enumerate() {
                let xx = if g.flip_h { ow - 1 - x } else { x };
                *v = source(g.source(left + xx as i64, w, 1));
            }
        }
        let image = self.list(Arc::new(UInt8Array::from(pixels)), h * w * ch)?;
        let index = self.list(Arc::new(Int32Array::from(index)), oh + ow)?;
        self.finish(batch, image, Some(index), &bad)
    }
}
