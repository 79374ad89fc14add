//! The `image` stage: decode (raw HWC `uint8`, PNG, JPEG), seeded augmentation, and output
//! as a CHW `fixed_size_list` of `float32` (or, by `dtype`, `uint8` pixels or `float16`).
//!
//! Per row, every random draw comes from ChaCha8 keyed by (seed, stage, column) on the stream
//! of the row's identity (lineage + epoch; see [`super::augment::row_ids`]), in op order:
//! `random_crop` draws top then left (`center_crop` and `resize` draw nothing);
//! `random_resized_crop` draws up to 10 (area, log-ratio, top, left) attempts like
//! torchvision, falling back to the whole image centre-cropped to the ratio range; a flip
//! draws one number; `color_jitter`, like torchvision's `ColorJitter`, first draws the order of
//! its adjustments (a uniform permutation of brightness, contrast, saturation, hue; drawn
//! only when two or more are enabled), then the brightness, contrast, saturation and hue
//! factors (in that order, each only when enabled), and applies them in the drawn order;
//! `random_grayscale`
//! (after `color_jitter`) draws one number; `random_erasing` (always the last op) draws one
//! number against `p`, then up to 10 (area, log-ratio) attempts and the box's top and left,
//! like torchvision, and is applied to the finished output.
//!
//! Geometry is applied while sampling from the decoded pixels into a per-row float scratch
//! buffer (reused across rows), colour ops work on that buffer, and the final pass writes
//! normalized CHW values straight into the output array.

use std::sync::Arc;

use arrow::array::{
    ArrayRef, BooleanArray, FixedSizeListArray, Float16Array, Float32Array, RecordBatch, UInt8Array,
};
use arrow::compute::filter_record_batch;
use arrow::datatypes::{Field, SchemaRef};
use chacha20::ChaCha8Rng;
use rand::SeedableRng;

use super::Transform;
use super::augment::row_ids;
use crate::batch::Batch;
use crate::dead_letter::DeadLetterFiles;
use crate::error::{Error, Result, StageRef};
use crate::runtime::recycle::{F32Pool, Pool};

mod build;
mod colour;
mod dead_letters;
mod decode;
mod device;
mod draw;
mod erase;
mod geometry;
mod settings;
#[cfg(test)]
mod tests;

#[cfg(test)]
use build::build;
pub use device::{DEVICE_IMAGE_KEY, DeviceImage};
pub use settings::{
    AugmentOn, EraseValue, ImageConfig, ImageDtype, ImageFormat, ImageOp, OnError, PadFill,
    PaddingMode,
};

use colour::NO_COLOUR;
use decode::raw_bytes;
use geometry::Resampler;

/// A built `image` stage.
#[derive(Debug)]
pub(crate) struct ImageStage {
    stage: StageRef,
    input: usize,
    output: usize,
    /// Replace the input column (else append).
    replace: bool,
    format: ImageFormat,
    dtype: ImageDtype,
    /// `augment_on: device`: decode and draw only (`device.rs`).
    deferred: bool,
    shape: [usize; 3],
    out_hw: [usize; 2],
    ops: Vec<ImageOp>,
    key: [u8; 32],
    on_error: OnError,
    schema: SchemaRef,
    /// Per channel: `v * scale + bias` maps a 0–255 value to its normalized output.
    scale: Vec<f32>,
    bias: Vec<f32>,
    /// Per channel: what `random_crop`'s constant padding holds (0–255), and normalized.
    fill: Vec<f32>,
    pad_value: Vec<f32>,
    /// Output buffers, recycled once the batch (and any tensor made from it) is dropped.
    buffers: Arc<F32Pool>,
    /// `dtype: uint8`'s output buffers, recycled the same way.
    pixel_buffers: Arc<Pool<u8>>,
    /// `dtype: float16`'s.
    half_buffers: Arc<Pool<half::f16>>,
    /// Where skipped rows also go.
    dead_letter: Option<ImageDeadLetter>,
}

/// An image stage's dead-letter directory, written from the CPU pool (blocking on the
/// runtime the pipeline was prepared in).
#[derive(Debug)]
struct ImageDeadLetter {
    files: std::sync::Mutex<DeadLetterFiles>,
    runtime: tokio::runtime::Handle,
}

impl Transform for ImageStage {
    fn apply(&self, batch: Batch) -> Result<Batch> {
        if self.deferred {
            return self.apply_deferred(batch);
        }
        let col = batch.data.column(self.input);
        let n = batch.num_rows();
        let ch = self.shape[2];
        let [oh, ow] = self.out_hw;
        let width = ch * oh * ow;
        let ids = row_ids(&batch.lineage);
        // Every element is overwritten below (bad rows with zeros). `uint8`: the pixels, and
        // a float row for the ops that are computed in floats (resize, colour), then rounded;
        // `float16`: each image in the float row, then rounded to its output.
        let dtype = self.dtype;
        let (uint8, float32) = (dtype == ImageDtype::Uint8, dtype == ImageDtype::Float32);
        let size = |d: ImageDtype| if dtype == d { n * width } else { 0 };
        let mut out = self.buffers.take(size(ImageDtype::Float32));
        let mut pixels = self.pixel_buffers.take(size(ImageDtype::Uint8));
        let mut halves = self.half_buffers.take(size(ImageDtype::Float16));
        let mut float_row = vec![0.0f32; if float32 { 0 } else { width }];
        let mut scratch = vec![0.0f32; oh * ow * ch];
        let mut resampler = Resampler::default();
        let mut owned = Vec::new();
        let mut rng = ChaCha8Rng::from_seed(self.key);
        let mut bad: Vec<(usize, String)> = Vec::new();
        let bytes_of = |r: usize| raw_bytes(col, r);
        // Source rows are scattered over a shuffle window and rarely cached: ask for the
        // bytes of the image two ahead while converting this one (measured on the images
        // bench, 1M rows: 2.9–3.1 CPU-s with distance 2, 3.1–3.3 with 1, 3.4–4.0 without).
        const AHEAD: usize = 2;
        for b in (0..AHEAD.min(n)).filter_map(bytes_of) {
            super::pixels::prefetch(b);
        }
        for (r, id) in ids.iter().enumerate() {
            let dst = match float32 {
                true => &mut out[r * width..(r + 1) * width],
                false => &mut float_row[..],
            };
            let bytes = bytes_of(r);
            if let Some(b) = (r + AHEAD < n).then(|| bytes_of(r + AHEAD)).flatten() {
                super::pixels::prefetch(b);
            }
            let decoded = match bytes {
                None => Err("the image is null".to_string()),
                Some(b) => self.decode(b, &mut owned),
            };
            let (src, h, w) = match decoded {
                Ok(d) => d,
                Err(e) => {
                    bad.push((r, e));
                    dst.fill(0.0);
                    // (Only the output of this `dtype` has rows; the others are empty.)
                    if let Some(p) = pixels.get_mut(r * width..(r + 1) * width) {
                        p.fill(0);
                    }
                    if let Some(p) = halves.get_mut(r * width..(r + 1) * width) {
                        p.fill(half::f16::ZERO);
                    }
                    continue;
                }
            };
            rng.set_stream(*id);
            let (g, c) = self.draw(&mut rng, h, w);
            let erase = self.draw_erase(&mut rng, [oh, ow]);
            let fast = g.exact && c == NO_COLOUR;
            let one_pass = fast && (g.pad == PaddingMode::Constant || g.inside(h, w));
            if one_pass && uint8 {
                self.crop_pixels(src, h, w, &g, &mut pixels[r * width..(r + 1) * width]);
                continue;
            }
            if one_pass && dtype == ImageDtype::Float16 && ch == 3 && erase.is_none() {
                let dst = &mut halves[r * width..(r + 1) * width];
                self.crop_f16(src, h, w, &g, dst, &mut float_row);
                continue;
            }
            if one_pass {
                self.crop_normalize(src, h, w, &g, dst, float32);
            } else {
                self.sample(src, h, w, &g, &mut scratch, &mut resampler);
                self.colour(&mut scratch, &c);
                // HWC (0–255) → normalized CHW.
                for k in 0..ch {
                    let (s, b) = (self.scale[k], self.bias[k]);
                    let plane = &mut dst[k * oh * ow..(k + 1) * oh * ow];
                    for (i, v) in plane.iter_mut().enumerate() {
                        *v = scratch[i * ch + k] * s + b;
                    }
                }
            }
            if let Some(e) = erase {
                e.apply(dst, [oh, ow], &mut rng);
            }
            if uint8 {
                // Scale 1 and bias 0: pixel values, rounded (a resize or colour op leaves
                // fractions).
                let row = &mut pixels[r * width..(r + 1) * width];
                for (p, v) in row.iter_mut().zip(&float_row) {
                    *p = v.round() as u8;
                }
            } else if dtype == ImageDtype::Float16 {
                super::pixels::to_f16(&float_row, &mut halves[r * width..(r + 1) * width]);
            }
        }
        let values: ArrayRef = match self.dtype {
            ImageDtype::Float32 => Arc::new(Float32Array::new(self.buffers.into_buffer(out), None)),
            ImageDtype::Uint8 => Arc::new(UInt8Array::new(
                self.pixel_buffers.into_buffer(pixels),
                None,
            )),
            ImageDtype::Float16 => Arc::new(Float16Array::new(
                self.half_buffers.into_buffer(halves),
                None,
            )),
        };
        let list = self.list(values, width)?;
        self.finish(batch, list, None, &bad)
    }
}

impl ImageStage {
    /// `values` as a fixed-size list column of `k` values per row.
    fn list(&self, values: ArrayRef, k: usize) -> Result<ArrayRef> {
        let field = Field::new_list_field(values.data_type().clone(), false);
        let list =
            FixedSizeListArray::try_new(Arc::new(field), k as i32, values, None).map_err(|e| {
                Error::Arrow {
                    context: self.stage.to_string(),
                    source: e,
                }
            })?;
        Ok(Arc::new(list))
    }

    /// `batch` with the stage's `output` column (replacing the input column or appended) and
    /// `extra` appended, as the stage's output: the run stops at the first of the `bad` rows
    /// (row, error) with `on_error: fail`, else they are skipped.
    fn finish(
        &self,
        batch: Batch,
        output: ArrayRef,
        extra: Option<ArrayRef>,
        bad: &[(usize, String)],
    ) -> Result<Batch> {
        let mut columns: Vec<ArrayRef> = batch.data.columns().to_vec();
        if self.replace {
            columns[self.output] = output;
        } else {
            columns.push(output);
        }
        columns.extend(extra);
        if let Some((r, e)) = bad.first()
            && self.on_error == OnError::Fail
        {
            return Err(Error::Data {
                stage: self.stage.clone(),
                message: format!(
                    "bad image in column `{}`: {e}{}; fix the data or set `on_error: skip`",
                    self.schema.field(self.output).name(),
                    if bad.len() > 1 {
                        format!(" (and {} more in this batch)", bad.len() - 1)
                    } else {
                        String::new()
                    }
                ),
                rows: batch.lineage.describe_row(*r as u64),
            });
        }
        let data =
            RecordBatch::try_new(self.schema.clone(), columns).map_err(|e| Error::Arrow {
                context: self.stage.to_string(),
                source: e,
            })?;
        if bad.is_empty() {
            return Ok(batch.with_data(data));
        }
        let n = batch.num_rows();
        self.skip_bad(&batch, &data, bad, n)
    }
}

impl ImageStage {
    /// `on_error: skip`: drops the rows `bad` (row, error) from `data` (the `n` converted rows
    /// of `batch`), naming each in the log, and stores them first when there is a dead letter.
    fn skip_bad(
        &self,
        batch: &Batch,
        data: &RecordBatch,
        bad: &[(usize, String)],
        n: usize,
    ) -> Result<Batch> {
        // on_error: skip — every dropped row is named in the log and counted (rows removed),
        // and with a dead letter stored, with its bytes, before the batch goes on.
        if let Some(dl) = &self.dead_letter {
            self.dead_letters(dl, batch, bad)?;
        }
        let mut keep = vec![true; n];
        for (r, e) in bad {
            keep[*r] = false;
            tracing::warn!(
                "{}: skipped a bad image ({e}) at {}",
                self.stage,
                batch.lineage.describe_row(*r as u64)
            );
        }
        let mask = BooleanArray::from(keep);
        let lineage = batch.lineage.filter(&mask);
        let kept = filter_record_batch(data, &mask).map_err(|e| Error::Arrow {
            context: self.stage.to_string(),
            source: e,
        })?;
        Ok(Batch::new(kept, lineage).with_position_of(batch))
    }
}
